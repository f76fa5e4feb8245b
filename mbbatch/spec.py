"""Sweep specs: one TOML file per experiment, validated before anything runs.

A spec names the policy, the workload, the grid and the replications::

    name = "fig3"
    description = "Throughput vs arrival rate, k = 1..5"
    policy = "multibin"
    arrivals = "poisson"        # or "saturated"
    service = "uniform"         # or "expon"
    reps = 10
    seed = 20241121

    [params]                    # fixed parameter values
    batch_size = 128
    l_min = 1.0
    l_max = 20.0
    n = 128000
    servers = 1                 # an integer, or "inf"

    [grid]                      # one axis per parameter: a list of values
    bins = [1, 2, 3, 4, 5]
    rate = [1.0, 2.0, 4.0, 8.0]

Every parameter of the chosen policy, arrivals and service appears exactly
once, in ``[params]`` or in ``[grid]``.  An unknown key, an empty or
duplicated axis value, a missing field or a bad value raises
:class:`SpecError` naming the key and the file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ._validation import DOMAINS, Domain

__all__ = ["SpecError", "SweepSpec", "Param", "PARAMS", "load_spec", "parse_spec"]


class SpecError(ValueError):
    """A sweep spec is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class Param:
    """A sweep parameter: its kind, domain and the setting it belongs to."""

    name: str
    kind: str            # "count", "real", "servers", "choice"
    units: str
    description: str
    when: tuple          # (setting, value) pairs any of which makes it apply
    required: bool = True
    default: object = None
    choices: tuple = ()
    domain: object = None   # a Domain for "real" parameters outside DOMAINS

    def applies(self, spec_top: dict) -> bool:
        return any(spec_top.get(k) == v for k, v in self.when)

    def check(self, value, where: str):
        """Validate one value; return it normalized (int, float or str)."""
        if self.kind == "count":
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{where}: {self.name} must be an integer; got {value!r}")
            if value < 1:
                raise SpecError(f"{where}: {self.name} must be an integer in [1, inf); got {value!r}")
            return int(value)
        if self.kind == "servers":
            if value == "inf":
                return math.inf
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{where}: servers must be an integer in [1, inf) or \"inf\"; got {value!r}")
            return int(value)
        if self.kind == "choice":
            if value not in self.choices:
                raise SpecError(f"{where}: {self.name} must be one of {list(self.choices)}; got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{where}: {self.name} must be a real number; got {value!r}")
        value = float(value)
        dom = self.domain or DOMAINS[self.name]
        if not bool(dom.contains(value)):
            raise SpecError(f"{where}: {self.name} must be in {dom}; got {value!r}")
        return value


_D = DOMAINS
_MB = (("policy", "multibin"),)
_TOK = (("policy", "static"), ("policy", "dynamic"), ("policy", "multibin_dynamic"))
_DYN = (("policy", "dynamic"), ("policy", "multibin_dynamic"))
_ALL = _MB + _TOK
_POS = Domain(0, math.inf)
_NONNEG = Domain(0, math.inf, lo_closed=True)
_NONNEG_INF = Domain(0, math.inf, lo_closed=True, hi_closed=True)
_UNIT = Domain(0, 1)
#: Every parameter a sweep can set or sweep over, by name.  The names are the
#: Dataset dimensions and the keys of [params] and [grid].
PARAMS: dict[str, Param] = {p.name: p for p in [
    Param("bins", "count", "bins", _D["bins"].description, _MB + (("policy", "multibin_dynamic"),)),
    Param("batch_size", "count", "requests", _D["batch_size"].description,
          _MB + (("policy", "static"),)),
    Param("edges", "choice", "", "bin edges: equal probability mass, or Lemma A.1's (exponential only)",
          _MB, required=False, default="equal_mass", choices=("equal_mass", "lemma_a1")),
    Param("max_wait", "real", "s", "a bin's partial batch leaves once its oldest request waited this long",
          _MB, required=False, default=math.inf, domain=_NONNEG_INF),
    Param("rate", "real", "requests/s", _D["rate"].description,
          (("arrivals", "poisson"), ("arrivals", "step"))),
    Param("rate_high", "real", "requests/s", "arrival rate between t_up and t_down (load step)",
          (("arrivals", "step"),), domain=_POS),
    Param("t_up", "real", "s", "time the load steps up", (("arrivals", "step"),), domain=_POS),
    Param("t_down", "real", "s", "time the load steps back down", (("arrivals", "step"),), domain=_POS),
    Param("l_min", "real", "s", _D["l_min"].description, (("service", "uniform"),)),
    Param("l_max", "real", "s", _D["l_max"].description, (("service", "uniform"),)),
    Param("mu", "real", "1/s", _D["mu"].description, (("service", "expon"),)),
    Param("prompt_median", "real", "tokens", "median prompt length (log-normal)", _TOK, domain=_POS),
    Param("prompt_sigma", "real", "1", "log-normal shape of the prompt length", _TOK, domain=_POS),
    Param("output_median", "real", "tokens", "median output length (log-normal)", _TOK, domain=_POS),
    Param("output_sigma", "real", "1", "log-normal shape of the output length", _TOK, domain=_POS),
    Param("d_sla", "real", "s/token", "SLA target D_SLA on the decode time per token", _TOK, domain=_POS),
    Param("eps_d", "real", "s/token", "tolerance band eps_D around D_SLA", _TOK, required=False,
          default=5e-5, domain=_NONNEG),
    Param("b_min", "count", "requests", "smallest batch size B_min", _DYN, required=False, default=1),
    Param("b_max", "count", "requests", "largest batch size B_max", _DYN),
    Param("controller", "choice", "", "SLA controller: the specification's pseudocode or the "
          "multiplicative variant", _DYN, required=False, default="spec",
          choices=("spec", "multiplicative")),
    Param("memory", "choice", "", "b_mem rule: L0 = 0.1 eta, a CLT buffer, or no memory constraint",
          _DYN, required=False, default="l0", choices=("l0", "clt", "off")),
    Param("eta", "real", "tokens", "KV-cache token capacity eta", _TOK, domain=_POS),
    Param("eps_m", "real", "1", "risk eps_M of the CLT memory buffer", _DYN, required=False,
          default=0.05, domain=_UNIT),
    Param("selection", "choice", "", "bin selection of Algorithm 5", (("policy", "multibin_dynamic"),),
          required=False, default="round_robin", choices=("round_robin", "longest_queue")),
    Param("warmup", "count", "requests", "requests whose predictions set Algorithm 6's edges",
          (("policy", "multibin_dynamic"),), required=False, default=1000),
    Param("n", "count", "requests", _D["n"].description, _ALL),
    Param("servers", "servers", "servers", _D["servers"].description, _ALL, required=False, default=1),
]}

#: Parameters that shape the workload (the requests), as opposed to the
#: policy serving them.  Only these enter a cell's seed, so cells that differ
#: only in policy see the same requests: common random numbers.
WORKLOAD_PARAMS = ("rate", "rate_high", "t_up", "t_down", "l_min", "l_max", "mu", "prompt_median",
                   "prompt_sigma", "output_median", "output_sigma", "n")

_TOP = {
    "name": "a short identifier, also the Dataset's name",
    "description": "one line saying what the sweep shows",
    "policy": "the batching policy: multibin, static, dynamic or multibin_dynamic",
    "arrivals": "the arrival process: poisson, saturated or step (a load step)",
    "service": "multibin: the service-time distribution, uniform or expon",
    "service_model": "token policies: the batch service model, decode (default), linear or max",
    "reps": "replications per grid point, an integer >= 1",
    "seed": "root seed, a non-negative integer",
    "params": "table of fixed parameter values",
    "grid": "table of axes: parameter = [values]",
}
_CHOICES = {"policy": ("multibin", "static", "dynamic", "multibin_dynamic"),
            "arrivals": ("poisson", "saturated", "step")}
TOKEN_POLICIES = ("static", "dynamic", "multibin_dynamic")


@dataclass(frozen=True, eq=False)
class SweepSpec:
    """A validated sweep spec.

    ``axes`` maps each grid axis, in file order, to its values; ``params``
    holds the fixed values (defaults filled in).  ``text`` is the file's text,
    ``canonical`` the parsed spec in a canonical JSON form whose SHA-256 is
    ``hash`` (comments and layout do not change it).
    """

    name: str
    description: str
    policy: str
    arrivals: str
    service: str
    reps: int
    seed: int
    params: dict
    axes: dict
    source: str = ""
    text: str = field(default="", repr=False)

    @property
    def canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    def to_dict(self) -> dict:
        enc = lambda v: "inf" if v == math.inf else v  # noqa: E731
        return {"name": self.name, "description": self.description, "policy": self.policy,
                "arrivals": self.arrivals, "service": self.service, "reps": self.reps,
                "seed": self.seed, "params": {k: enc(v) for k, v in self.params.items()},
                "grid": {k: [enc(v) for v in vs] for k, vs in self.axes.items()}}

    @property
    def shape(self) -> tuple:
        return tuple(len(v) for v in self.axes.values())

    def points(self):
        """Yield (index tuple, full parameter dict) for every grid point, in C order."""
        names = list(self.axes)
        for idx in itertools.product(*(range(len(v)) for v in self.axes.values())):
            p = dict(self.params)
            p.update({nm: self.axes[nm][i] for nm, i in zip(names, idx)})
            yield idx, p

    @property
    def n_points(self) -> int:
        return math.prod(self.shape)

    def differences(self, other: "SweepSpec") -> list[str]:
        """Human-readable list of what differs from ``other`` (for resume errors)."""
        a, b = self.to_dict(), other.to_dict()
        out = []
        for key in sorted(set(a) | set(b)):
            if isinstance(a.get(key), dict) or isinstance(b.get(key), dict):
                da, db = a.get(key) or {}, b.get(key) or {}
                for sub in sorted(set(da) | set(db)):
                    if da.get(sub) != db.get(sub):
                        out.append(f"{key}.{sub}: {db.get(sub)!r} -> {da.get(sub)!r}")
            elif a.get(key) != b.get(key):
                out.append(f"{key}: {b.get(key)!r} -> {a.get(key)!r}")
        return out


def load_spec(path) -> SweepSpec:
    """Read and validate a spec file."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not a UTF-8 text file (byte {data[exc.start]:#04x} at offset "
                        f"{exc.start}); a spec is a TOML file") from None
    return parse_spec(text, source=str(path))


def parse_spec(text: str, source: str = "<spec>") -> SweepSpec:
    """Validate a spec given as TOML text; ``source`` names it in errors."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML: {exc}") from None

    for key in raw:
        if key not in _TOP:
            raise SpecError(f"{source}: unknown key {key!r}; allowed: {sorted(_TOP)}")
    for key in ("name", "policy", "arrivals", "reps", "seed"):
        if key not in raw:
            raise SpecError(f"{source}: missing field {key!r} ({_TOP[key]})")
    if raw["policy"] == "multibin":
        if "service" not in raw:
            raise SpecError(f"{source}: missing field 'service' ({_TOP['service']})")
        if raw["service"] not in ("uniform", "expon"):
            raise SpecError(f"{source}: service must be one of ['uniform', 'expon']; got {raw['service']!r}")
        if "service_model" in raw:
            raise SpecError(f"{source}: unknown key 'service_model' for policy multibin (use service)")
    elif raw.get("policy") in TOKEN_POLICIES:
        if "service" in raw:
            raise SpecError(f"{source}: unknown key 'service' for policy {raw['policy']!r} "
                            "(token policies take service_model and the prompt_/output_ parameters)")
        raw.setdefault("service_model", "decode")
        if raw["service_model"] not in ("decode", "linear", "max"):
            raise SpecError(f"{source}: service_model must be one of ['decode', 'linear', 'max']; "
                            f"got {raw['service_model']!r}")
        if raw.get("arrivals") == "saturated" and raw["policy"] != "multibin":
            pass
    name = raw["name"]
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise SpecError(f"{source}: name must be a non-empty identifier (letters, digits, _ or -); got {name!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise SpecError(f"{source}: description must be a string; got {description!r}")
    for key, choices in _CHOICES.items():
        if raw[key] not in choices:
            raise SpecError(f"{source}: {key} must be one of {list(choices)}; got {raw[key]!r}")
    reps = raw["reps"]
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise SpecError(f"{source}: reps must be an integer in [1, inf); got {reps!r}")
    seed = raw["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(f"{source}: seed must be a non-negative integer; got {seed!r}")

    fixed = raw.get("params", {})
    grid = raw.get("grid", {})
    for table, tname in ((fixed, "params"), (grid, "grid")):
        if not isinstance(table, dict):
            raise SpecError(f"{source}: {tname} must be a table")
    applicable = {nm: p for nm, p in PARAMS.items() if p.applies(raw)}
    for table, tname in ((fixed, "params"), (grid, "grid")):
        for key in table:
            if key not in applicable:
                why = (f"it does not apply to policy={raw['policy']!r}, arrivals={raw['arrivals']!r}, "
                       f"service={raw.get('service', raw.get('service_model'))!r}"
                       if key in PARAMS else "no such parameter")
                raise SpecError(f"{source}: unknown key {tname}.{key} ({why}); allowed: {sorted(applicable)}")
    for key in fixed:
        if key in grid:
            raise SpecError(f"{source}: {key} is both in [params] and in [grid]; give it once")

    params = {}
    for nm, p in applicable.items():
        if nm in grid:
            continue
        if nm in fixed:
            params[nm] = p.check(fixed[nm], f"{source}: params")
        elif p.required:
            raise SpecError(f"{source}: missing field params.{nm} or grid.{nm} ({p.description})")
        else:
            params[nm] = p.check(p.default, f"{source}: params")
    axes = {}
    for nm, values in grid.items():
        where = f"{source}: grid.{nm}"
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: an axis must be a non-empty list of values; got {values!r}")
        checked = [applicable[nm].check(v, where) for v in values]
        seen = set()
        for v in checked:
            if v in seen:
                raise SpecError(f"{where}: duplicated value {v!r}")
            seen.add(v)
        axes[nm] = checked

    spec = SweepSpec(name=name, description=description, policy=raw["policy"],
                     arrivals=raw["arrivals"], service=raw.get("service", raw.get("service_model")),
                     reps=reps, seed=seed,
                     params=params, axes=axes, source=source, text=text)
    _check_joint(spec, source)
    return spec


def _check_joint(spec: SweepSpec, source: str) -> None:
    """Constraints across parameters, checked over the whole grid."""
    edges = spec.axes.get("edges", [spec.params.get("edges")])
    if "lemma_a1" in edges and spec.policy == "multibin" and spec.service != "expon":
        raise SpecError(f"{source}: edges = \"lemma_a1\" needs service = \"expon\"")
    if spec.arrivals == "step":
        up = spec.axes.get("t_up", [spec.params.get("t_up")])
        down = spec.axes.get("t_down", [spec.params.get("t_down")])
        if max(up) >= min(down):
            raise SpecError(f"{source}: t_down must be after t_up at every grid point")
        if spec.policy == "multibin":
            raise SpecError(f"{source}: arrivals = \"step\" is for the token policies")
    if spec.policy in ("dynamic", "multibin_dynamic"):
        lo = spec.axes.get("b_min", [spec.params.get("b_min")])
        hi = spec.axes.get("b_max", [spec.params.get("b_max")])
        if max(lo) > min(hi):
            raise SpecError(f"{source}: b_min must be at most b_max at every grid point")
    if spec.policy == "multibin" and spec.service == "uniform":
        lo = spec.axes.get("l_min", [spec.params.get("l_min")])
        hi = spec.axes.get("l_max", [spec.params.get("l_max")])
        if max(lo) >= min(hi):
            raise SpecError(f"{source}: l_max must be greater than l_min at every grid point; "
                            f"got l_min up to {max(lo)} and l_max down to {min(hi)}")
