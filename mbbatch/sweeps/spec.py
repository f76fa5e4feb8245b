"""Sweep specs: one TOML file per experiment, validated before anything runs.

A spec names the workload, the policy (or several policy variants), the grid
and the replications.  One policy::

    name = "fig3"
    description = "Throughput vs arrival rate, k = 1..5"
    policy = "multibin"
    arrivals = "poisson"        # "gamma", "onoff", "saturated", or "step" (a load step)
    service = "uniform"         # the paper's workload: "uniform" or "expon"
    reps = 10
    seed = 20241103

    [params]                    # fixed parameter values
    batch_size = 128
    l_min = 1.0
    l_max = 20.0
    n = 128000
    servers = 1                 # an integer, or "inf"

    [grid]                      # one axis per parameter: a list of values
    bins = [1, 2, 3, 4, 5]
    rate = [1.0, 2.0, 4.0, 8.0]

Several policy variants, as a sweep axis: each ``[policies.NAME]`` table has
a ``kind`` (``multibin``, ``static``, ``dynamic`` or ``multibin_dynamic``) and
its own settings; the ``policy`` axis of ``[grid]`` lists the variants::

    service_model = "decode"    # token-level requests: prompt_ and output_ parameters

    [policies.static8]
    kind = "static"
    batch_size = 8
    [policies.dynamic]
    kind = "dynamic"
    b_max = 256

    [grid]
    policy = ["static8", "dynamic"]
    rate = [0.5, 1.0, 2.0]

Shared values sit in ``[params]``; a variant's table may override them, and
may set its own ``seed``.  Cells that differ only in policy (and not in seed)
see the same requests: common random numbers.

Requests of several classes (clients, tenants: a
:meth:`Workload.mixture <mbbatch.Workload.mixture>`), on continuous batching
engines: one ``[classes.NAME]`` table per class, with its ``share`` (its
weight; the shares are normalised to sum to 1) and any of the keys of
token-level requests, ``prompt_median``, ``prompt_sigma``,
``output_median``, ``output_sigma``, ``ttft_slo`` and ``tpot_slo``, which
default to the cell's own (``[params]``, ``[grid]`` or the table's
default); in a capacity spec, bounds on the class's own metrics,
``objective_<metric>`` for a metric of :data:`mbbatch.capacity.CLASS_METRICS`::

    policy = "continuous"
    service_model = "profile"

    [classes.chat]
    share = 3
    prompt_median = 128.0
    output_median = 64.0
    ttft_slo = 0.3
    [classes.batch]
    share = 1
    prompt_median = 1024.0
    output_median = 512.0

    [grid]
    admission = ["fcfs", "edf", "vtc"]
    rate = [4.0, 6.0]

The Dataset gains a ``request_class`` dimension (the class names) and each
class's metrics on it: ``class_completed`` and ``sim_class_<metric>`` per
replication with their means and intervals (:data:`mbbatch.sweeps.schema.PER_CLASS`).

Every parameter a variant needs appears once, in its table, ``[params]`` or
``[grid]``; a value in ``[params]`` applies to the variants it belongs to.
An unknown key, an empty or duplicated axis value, a missing field or a bad
value raises :class:`SpecError` naming the file and the key.  Names, kinds,
domains, units and defaults come from the parameter table
(:mod:`mbbatch.params`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import sys
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .._validation import check
from ..capacity import CLASS_METRICS, OBJECTIVE_METRICS, SEARCH_DOMAINS, SEARCHES
from ..metrics import METRICS
from ..stats import CONFIDENCE
from ..arrivals import Arrivals
from ..params import PARAMS as TABLE
from ..params import REQUIRED
from ..registry import ARRIVALS as _ARRIVAL_CLASSES
from ..registry import KINDS, POLICIES
from ..service_models import COST_TERMS as _COST_TERMS
from ..service_models import SERVICE_MODELS

__all__ = ["SpecError", "TraceNotFound", "SweepSpec", "SpecParam", "SPEC_PARAMS", "WORKLOAD_PARAMS", "ARRIVALS",
           "CLASS_KEYS", "CLASS_OBJECTIVES", "load_spec", "parse_spec", "spec_from_dict", "trace_filters", "trace_of"]


class SpecError(ValueError):
    """A sweep spec is invalid; the message names the file and the key."""


class TraceNotFound(SpecError):
    """A spec's [workload] trace file is not where the spec looks for it."""


_ALL = frozenset(KINDS)


def _kinds_of(name: str) -> frozenset:
    """The kinds a spec key applies to: those that declare it among their
    settings; every kind for a key no policy declares (the arrivals, the
    workload, the service model, n)."""
    declaring = frozenset(k for k, cls in POLICIES.items() if name in cls.settings)
    return declaring or _ALL


def _arrivals_of(name: str) -> frozenset:
    """The arrival processes a spec key builds (empty: the key is not an
    arrival process's)."""
    return frozenset(a for a, cls in _ARRIVAL_CLASSES.items() if name in cls.spec_keys)


@dataclass(frozen=True)
class SpecParam:
    """A spec key: the table entry it reads (``key``), and when it applies.

    It applies to a cell whose policy kind is in ``kinds``, whose arrival
    process is in ``arrivals`` (if given), whose workload form is in
    ``workload`` (if given) and whose batch service model is in ``models``
    (if given), and only to a capacity spec if ``capacity_only``.  It is
    :attr:`required` (must be given where it applies) exactly when its table
    entry has no default.
    """

    name: str
    kinds: frozenset
    arrivals: frozenset = frozenset()
    workload: frozenset = frozenset()
    key: str = ""
    models: frozenset = frozenset()
    capacity_only: bool = False
    unset: bool = False

    @property
    def table(self):
        return TABLE[self.key or self.name]

    @property
    def required(self) -> bool:
        """No default in the parameter table: a cell it applies to must give it."""
        return self.table.default is REQUIRED

    @property
    def default(self):
        # a key whose absence means something (decode_eta: the decode stage's own default, see
        # LAPS.from_spec): unset, None, unless given
        return None if self.unset and not self.required else self.table.default

    def default_for(self, kind: str):
        """Its default in a cell of policy kind ``kind``: the kind's own
        (:attr:`~mbbatch.policies.base.Policy.spec_defaults`), else :attr:`default`."""
        own = POLICIES[kind].spec_defaults if kind in POLICIES else {}
        return own.get(self.name, self.default)

    def applies(self, kind: str, arrivals: str, workload: str, model: str, capacity: bool) -> bool:
        return (kind in self.kinds and (not self.arrivals or arrivals in self.arrivals)
                and (not self.workload or workload in self.workload)
                and (not self.models or model in self.models) and (capacity or not self.capacity_only))

    def check(self, value, where: str):
        """Validate one value; return it normalized (int, float or str)."""
        if self.table.kind == "servers" and value == "inf":
            return math.inf
        if value is None and self.default is None:
            return None                     # (unset: the default that None stands for)
        try:
            return check(self.key or self.name, value, self.name)
        except (TypeError, ValueError) as exc:
            hint = ' or "inf"' if self.table.kind == "servers" else ""
            raise SpecError(f"{where}: {exc}{hint}") from None


def _sp(name, kinds=None, *, workload=(), key="", models=(), capacity_only=False, unset=False):
    """A spec key; its kinds (unless given) and arrival processes are those
    that declare it (:data:`mbbatch.registry.POLICIES`, :data:`mbbatch.registry.ARRIVALS`)."""
    return SpecParam(name, frozenset(kinds) if kinds is not None else _kinds_of(name), _arrivals_of(name),
                     frozenset(workload), key, frozenset(models), capacity_only, unset)


# token-level requests (log-normal lengths or a trace's) under a batch service model
_REQ = ("tokens", "trace")


#: Every parameter a sweep can set or sweep over, by name.  The names are the
#: Dataset dimensions and the keys of [params], [grid] and [policies.NAME].
SPEC_PARAMS: dict[str, SpecParam] = {p.name: p for p in [
    _sp("bins"),
    _sp("batch_size"),
    _sp("edges"),
    _sp("max_wait"),
    _sp("rate"),
    _sp("scale", key="Replay.scale"),
    _sp("cv"),
    _sp("rate_on"),
    _sp("rate_off"),
    _sp("mean_on"),
    _sp("mean_off"),
    _sp("rate_high"),
    _sp("t_up"),
    _sp("t_down"),
    _sp("l_min", workload=("uniform",)),
    _sp("l_max", workload=("uniform",)),
    _sp("mu", workload=("expon",)),
    # the batch service model's parameters (its own defaults when not given)
    _sp("base", workload=_REQ, models=("max", "linear")),
    _sp("per_token", workload=_REQ, models=("max",)),
    _sp("linear_alpha", workload=_REQ, models=("linear",), key="LinearModel.alpha"),
    _sp("linear_beta", workload=_REQ, models=("linear",), key="LinearModel.beta"),
    _sp("decode_beta", workload=_REQ, models=("decode",), key="DecodeModel.beta"),
    _sp("prefill_per_token", workload=_REQ, models=("decode",)),
    _sp("gamma", workload=_REQ, models=("decode", "calibrated")),
    _sp("calibrated_alpha", workload=_REQ, models=("calibrated",), key="CalibratedModel.alpha"),
    _sp("calibrated_beta", workload=_REQ, models=("calibrated",), key="CalibratedModel.beta"),
    _sp("feedback", workload=_REQ, models=("calibrated",), key="CalibratedModel.feedback"),
    # the iteration cost's coefficients, one key per term (mbbatch._kernels.cost.TERMS); a mixture of
    # experts' per_expert among them (a profile's come with it)
    *(_sp(t.spec, workload=_REQ, models=("iteration",), key=f"IterationModel.{t.name}") for t in _COST_TERMS),
    _sp("experts", workload=_REQ, models=("iteration",), key="IterationModel.experts"),
    _sp("experts_per_token", workload=_REQ, models=("iteration",), key="IterationModel.experts_per_token"),
    _sp("finished", workload=_REQ, models=("iteration", "profile"), key="IterationModel.finished"),
    # a measured accelerator: a grid axis of profile names compares hardware
    _sp("profile", workload=_REQ, models=("profile",)),
    # a trace's filters (the loaders' window and drop_failed): grid axes allowed
    _sp("window_start", workload=("trace",)),
    _sp("window_end", workload=("trace",)),
    _sp("drop_failed", workload=("trace",)),
    _sp("prompt_median", workload=("tokens",)),
    _sp("prompt_sigma", workload=("tokens",)),
    _sp("output_median", workload=("tokens",)),
    _sp("output_sigma", workload=("tokens",)),
    _sp("system_prompts", workload=("tokens",)),
    _sp("system_prompt_length", workload=("tokens",)),
    _sp("system_prompt_share", workload=("tokens",), key="SystemPrompts.share"),
    # the requests' objectives (goodput's): not workload parameters either, the requests are the same
    _sp("ttft_slo", workload=_REQ),
    _sp("tpot_slo", workload=_REQ),
    # the predictor: not a workload parameter (cells that differ only in it see the same requests)
    _sp("predictor_sigma"),
    _sp("predictor_p"),
    # the controller's and the memory's settings: the parameter table's defaults where not given
    _sp("d_sla"),
    _sp("eps_d"),
    _sp("b_min"),
    _sp("b_max"),
    _sp("controller"),
    _sp("memory"),
    _sp("eta"),
    _sp("eps_m"),
    _sp("selection"),
    _sp("bin_edges"),
    _sp("warmup"),
    # continuous batching: the engine's limits, memory and admission order
    _sp("max_num_seqs"),
    _sp("sla_control"),
    _sp("max_batched_tokens"),
    _sp("chunked_prefill"),
    _sp("kv_tokens"),
    _sp("block_size"),
    _sp("admission"),
    _sp("admission_bins", key="ContinuousBatching.bins"),
    _sp("aging"),
    _sp("mlfq_quantum"),
    _sp("mlfq_levels"),
    _sp("iteration_overhead"),
    _sp("request_overhead"),
    _sp("num_scheduler_steps"),
    _sp("prefix_caching"),
    # LAPS: its instances and router, and its prefill model
    _sp("instances", key="LAPS.instances"),
    _sp("laps_threshold", key="LAPS.threshold"),
    _sp("window", key="LAPS.window"),
    _sp("max_batch", key="LAPS.max_batch"),
    _sp("max_batch_tokens", key="LAPS.max_batch_tokens"),
    _sp("dual_queue", key="LAPS.dual_queue"),
    _sp("dynamic", key="LAPS.dynamic"),
    _sp("interval", key="LAPS.interval"),
    _sp("ratio", key="LAPS.ratio"),
    _sp("long_instances", key="LAPS.long_instances"),
    # LAPS's decode stage: its policy and servers, the policy's settings (the
    # token policies' table entries) and its DecodeModel's
    _sp("decode"),
    _sp("decode_servers", key="LAPS.decode_servers"),
    _sp("decode_batch_size", key="batch_size"),
    _sp("decode_bins", key="MultiBinDynamic.bins"),
    _sp("decode_d_sla", key="d_sla"),
    _sp("decode_b_max", key="b_max"),
    _sp("decode_eta", key="eta", unset=True),
    _sp("decode_model_beta", key="DecodeModel.beta"),
    _sp("decode_model_gamma", key="gamma"),
    _sp("prefill_a", workload=_REQ, models=("prefill",), key="PrefillModel.a"),
    _sp("prefill_b", workload=_REQ, models=("prefill",), key="PrefillModel.b"),
    # a cluster of engines behind a router, and its programs (multi-call sessions)
    _sp("engines", key="Cluster.engines"),
    _sp("engine_policy"),
    _sp("engine_batch_size", key="batch_size"),
    _sp("engine_bins", key="MultiBinDynamic.bins"),
    _sp("router", key="Cluster.router"),
    _sp("route_threshold", key="Cluster.threshold"),
    _sp("kv_reuse", key="Cluster.kv_reuse"),
    _sp("cache_threshold", key="Cluster.cache_threshold"),
    _sp("balance_abs", key="Cluster.balance_abs"),
    _sp("balance_rel", key="Cluster.balance_rel"),
    # prefill/decode disaggregation: its pools and the KV transfer's link
    _sp("prefill_engines", key="Disaggregated.prefill_engines"),
    _sp("decode_engines", key="Disaggregated.decode_engines"),
    _sp("prefill_router", key="Disaggregated.router"),
    _sp("decode_router", key="Disaggregated.decode_router"),
    _sp("kv_bandwidth", key="KVTransfer.bandwidth"),
    _sp("kv_latency", key="KVTransfer.latency"),
    _sp("kv_bytes_per_token", key="KVTransfer.bytes_per_token"),
    _sp("programs"),
    _sp("calls", key="Programs.calls"),
    _sp("think_time", key="Programs.think_time"),
    _sp("closed_loop", key="Programs.closed"),
    _sp("session_context", key="Sessions.context"),
    _sp("n"),
    _sp("servers"),
    # a capacity search's objective: upper bounds on metrics of the policies they apply to
    *[_sp(f"objective_{m}", METRICS[m].kinds, capacity_only=True) for m in OBJECTIVE_METRICS],
]}

#: a cluster's settings that only its continuous-batching engines read
_ENGINE_ONLY = ("max_num_seqs", "max_batched_tokens", "chunked_prefill", "kv_tokens", "block_size", "admission",
                "admission_bins", "aging", "mlfq_quantum", "mlfq_levels", "sla_control", "iteration_overhead",
                "request_overhead", "num_scheduler_steps", "prefix_caching")

#: the settings of LAPS's decode stage (its policy named by ``decode``)
_DECODE_SETTINGS = ("decode_servers", "decode_batch_size", "decode_bins", "decode_d_sla", "decode_b_max",
                    "decode_eta", "decode_model_beta", "decode_model_gamma")

#: Parameters that shape the workload (the requests), as opposed to the
#: policy serving them.  Only these enter a cell's seed, so cells that differ
#: only in policy see the same requests: common random numbers.
WORKLOAD_PARAMS = ("rate", "rate_high", "t_up", "t_down", "l_min", "l_max", "mu", "prompt_median",
                   "prompt_sigma", "output_median", "output_sigma", "n", "cv", "rate_on", "rate_off", "mean_on",
                   "mean_off", "scale", "calls", "think_time", "system_prompts", "system_prompt_length",
                   "system_prompt_share")

#: A spec's top-level fields when it does not give them (``mbbatch simulate``'s
#: flags default to them too); ``name`` defaults to the spec file's name, and
#: ``arrivals`` of a spec with a [workload] trace to the trace's own.
TOP_DEFAULTS = {"arrivals": "poisson", "seed": 0, "reps": 5}

_TOP = {
    "name": "a short identifier, also the Dataset's name (default: the spec file's name)",
    "description": "one line saying what the sweep shows",
    "policy": f"the batching policy, one of {list(KINDS)} (or [policies.NAME] tables and a policy axis)",
    "policies": "tables of policy variants: [policies.NAME] with kind = ... and its settings",
    "arrivals": "the arrival process: poisson (default), gamma (rate, cv), onoff (rate_on, rate_off, mean_on, "
                "mean_off), saturated or step (a load step); a [workload] trace's spec replays its arrivals "
                "unless it says otherwise",
    "service": "the paper's workload: the service-time distribution, uniform (the default of a multibin-only "
               "spec without service_model) or expon",
    "service_model": "token-level requests: the batch service model, decode (default), linear, max, calibrated, "
                     "iteration (IterationModel's coefficients) or profile (a measured accelerator, the "
                     "parameter profile); multibin takes max (its default), iteration or profile",
    "reps": "replications per grid point, an integer >= 1 (default 5)",
    "confidence": "the level of the t-intervals over replications, in (0, 1) (default 0.95; a capacity "
                  "search's is [capacity] confidence)",
    "baseline": "a policy variant of the policy axis the others are compared with: the Dataset gains each "
                "one's diff_<metric> and ratio_<metric> with their paired intervals at the spec's confidence, "
                "and verdict_<metric> (mbbatch.stats.paired_differences; `mbbatch compare`)",
    "seed": "root seed, a non-negative integer (default 0)",
    "params": "table of fixed parameter values",
    "workload": "a real trace's requests: [workload] with trace = FILE, format = \"azure\" or \"burstgpt\", "
                "resample = true (lengths drawn from the trace's) or false (replayed in order) and the "
                "BurstGPT loader's model and log_type filters (window_start, window_end and drop_failed "
                "are parameters)",
    "grid": "table of axes: parameter = [values]",
    "capacity": "a capacity search at every grid point instead of fixed rates: [capacity] with rel_tol, "
                "confidence, max_reps, throughput_tol and searches; an objective's bounds are the parameters "
                "objective_<metric>",
    "classes": "requests of several classes (a Workload.mixture) on continuous batching engines: "
               "[classes.NAME] tables with share = ..., the class's prompt_/output_ keys, ttft_slo and "
               "tpot_slo (the cell's where not given) and, in a capacity spec, objective_<metric> bounds on "
               "the class's own metrics",
}

#: a [classes.NAME] table's keys besides ``share`` (the parameter ``class_share``): a class's lengths and
#: objectives, the keys of token-level requests, each the cell's own unless the class gives it
CLASS_KEYS = ("prompt_median", "prompt_sigma", "output_median", "output_sigma", "ttft_slo", "tpot_slo")
#: ... and in a capacity spec, bounds on the class's own metrics (mbbatch.capacity.CLASS_METRICS)
CLASS_OBJECTIVES = tuple(f"objective_{m}" for m in CLASS_METRICS)


def _search_key(key: str, default: float) -> tuple:
    """A [capacity] key of find_capacity's settings: its domain is find_capacity's."""
    domain = SEARCH_DOMAINS[key]
    return default, str(domain), lambda v: bool(domain.contains(v))


#: the [capacity] table: key -> (default, domain text, check)
CAPACITY_KEYS = {
    "rel_tol": _search_key("rel_tol", 0.01),
    "confidence": _search_key("confidence", 0.95),
    "max_reps": (24, "[3, inf), an integer", lambda v: isinstance(v, int) and v >= 3),
    "searches": (SEARCHES, "[1, inf), an integer",
                 lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "throughput_tol": _search_key("throughput_tol", 0.05),
}
#: the arrival processes a spec names
ARRIVALS = tuple(_ARRIVAL_CLASSES)
#: arrival processes a capacity search can set the rate of (those with a mean rate to set)
CAPACITY_ARRIVALS = tuple(a for a, cls in _ARRIVAL_CLASSES.items() if cls.at_rate is not Arrivals.at_rate)
#: where a missing trace file can be downloaded, by format
TRACE_SOURCES = {"azure": "https://github.com/Azure/AzurePublicDataset (data/AzureLLMInferenceTrace_*.csv)",
                 "burstgpt": "https://github.com/HPMLL/BurstGPT (the releases' BurstGPT_*.csv)"}
#: the environment variable naming a folder of traces, searched after the spec's folder
DATA_DIR_ENV = "MBBATCH_DATA"
_TRACE_KEYS = {"trace", "format", "resample", "model", "log_type"}
#: trace filters that are parameters (in [params] or [grid]), not [workload] keys
_TRACE_PARAMS = {"window": "window_start and window_end", "drop_failed": "drop_failed"}
_SERVICES = ("uniform", "expon")
_VARIANT_KEYS = {"kind", "seed"}


@dataclass(frozen=True, eq=False)
class SweepSpec:
    """A validated sweep spec.

    ``policies`` maps each variant's name to its settings (``kind`` and its
    own values); ``axes`` maps each grid axis, in file order, to its values
    (the ``policy`` axis holds variant names); ``params`` holds the shared
    fixed values.  ``workload`` is ``"uniform"``, ``"expon"`` (the paper's
    service times), ``"tokens"`` (log-normal prompt and output lengths) or
    ``"trace"`` (a trace's requests, :attr:`trace`), under
    ``service_model``).  ``text`` is the file's text, ``canonical`` the parsed
    spec in a canonical JSON form whose SHA-256 is ``hash`` (comments and
    layout do not change it).
    """

    name: str
    description: str
    arrivals: str
    workload: str
    service_model: str
    reps: int
    seed: int
    params: dict
    axes: dict
    policies: dict
    source: str = ""
    text: str = field(default="", repr=False)
    single: bool = True
    trace: dict | None = None
    capacity: dict | None = None
    confidence: float = CONFIDENCE
    baseline: str | None = None
    #: the [classes.NAME] tables: each class's share and the keys it gives (None: one kind of request)
    classes: dict | None = None

    @property
    def kinds(self) -> list:
        """The policy kinds the spec runs, in table order."""
        used = {v["kind"] for v in self.policies.values()}
        return [k for k in KINDS if k in used]

    @property
    def policy(self) -> str:
        """The policy kind, when every variant has the same one; else "mixed"."""
        kinds = self.kinds
        return kinds[0] if len(kinds) == 1 else "mixed"

    @property
    def service(self) -> str:
        """The service side as cells take it: the distribution (``uniform``,
        ``expon``) or the token-level service model."""
        return self.service_model if self.workload in ("tokens", "trace") else self.workload

    @property
    def canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    def to_dict(self) -> dict:
        enc = lambda v: "inf" if v == math.inf else v  # noqa: E731
        d = {"name": self.name, "description": self.description, "arrivals": self.arrivals,
             "workload": self.workload, "service_model": self.service_model, "reps": self.reps,
             "seed": self.seed, "params": {k: enc(v) for k, v in self.params.items()},
             "grid": {k: [enc(v) for v in vs] for k, vs in self.axes.items()}}
        d["policies"] = {nm: {k: enc(v) for k, v in s.items()} for nm, s in self.policies.items()}
        if self.trace is not None:
            d["trace"] = {k: v for k, v in self.trace.items() if k != "path"}   # (not this machine's path)
        if self.capacity is not None:
            d["capacity"] = self.capacity
        elif self.confidence != CONFIDENCE:
            d["confidence"] = self.confidence  # (only when given: the hash of a spec without it is unchanged)
        if self.baseline is not None:
            d["baseline"] = self.baseline
        if self.classes is not None:
            d["classes"] = {nm: {k: enc(v) for k, v in c.items()} for nm, c in self.classes.items()}
        return d

    @property
    def shape(self) -> tuple:
        return tuple(len(v) for v in self.axes.values())

    @property
    def n_points(self) -> int:
        return math.prod(self.shape)

    def variant(self, params: dict) -> str:
        """The policy variant of a cell."""
        return params.get("policy", next(iter(self.policies)))

    def seed_of(self, params: dict) -> int:
        """The root seed of a cell: its variant's, else the spec's."""
        return self.policies[self.variant(params)].get("seed", self.seed)

    def points(self):
        """Yield ``(index tuple, full parameter dict)`` for every grid point,
        in C order.  The dict holds the cell's variant name (``policy``), its
        ``kind``, and every parameter that applies to it."""
        names = list(self.axes)
        for idx in itertools.product(*(range(len(v)) for v in self.axes.values())):
            grid = {nm: self.axes[nm][i] for nm, i in zip(names, idx)}
            yield idx, self.cell_params(grid)

    def cell_params(self, grid: dict) -> dict:
        """A cell's parameters from its grid values."""
        name = grid.get("policy", self.params.get("policy", next(iter(self.policies))))
        settings = self.policies[name]
        kind = settings["kind"]
        p = {}
        for nm, sp in SPEC_PARAMS.items():
            if not sp.applies(kind, self.arrivals, self.workload, self.service_model, self.capacity is not None):
                continue
            if self.capacity is not None and nm in SEARCHED:
                continue            # (the search sets it)
            for source in (grid, settings, self.params):
                if nm in source:
                    p[nm] = source[nm]
                    break
            else:
                # (required but not given: a cluster whose engines do not read it, as checked when parsed)
                dflt = sp.default_for(kind)
                p[nm] = None if dflt is REQUIRED else sp.check(dflt, "defaults")
        if not self.single:
            p["policy"] = name
        p["kind"] = kind
        if self.trace is not None:
            p["trace"] = self.trace
        if self.classes is not None:
            # (each class's keys: its own, else the cell's)
            p["classes"] = {nm: {**{k: p[k] for k in CLASS_KEYS}, **c} for nm, c in self.classes.items()}
        return p

    def differences(self, other: "SweepSpec") -> list[str]:
        """Human-readable list of what differs from ``other`` (for resume errors)."""
        def flat(d, prefix=""):
            out = {}
            for k, v in d.items():
                if isinstance(v, dict):
                    out.update(flat(v, f"{prefix}{k}."))
                else:
                    out[f"{prefix}{k}"] = v
            return out

        a, b = flat(self.to_dict()), flat(other.to_dict())
        return [f"{key}: {b.get(key)!r} -> {a.get(key)!r}" for key in sorted(set(a) | set(b))
                if a.get(key) != b.get(key)]


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


def _choice(raw, key, choices, source):
    value = raw[key]
    if not isinstance(value, str) or value not in choices:
        raise SpecError(f"{source}: {key} must be one of {list(choices)}; got {value!r}")
    return value


def _table(raw, key, source) -> dict:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise SpecError(f"{source}: {key} must be a table ([{key}]); got {value!r}")
    return value


def _seed(value, where) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where}: seed must be a non-negative integer; got {value!r}")
    return value


def parse_spec(text: str, source: str = "<spec>", name: str | None = None) -> SweepSpec:
    """Validate a spec given as TOML text; ``source`` names it in errors;
    ``name``, the name of a spec whose text has none (a store's: its file
    named it)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML: {exc}") from None
    if name is not None and isinstance(raw, dict):
        raw.setdefault("name", name)
    return spec_from_dict(raw, source, text)


def spec_from_dict(raw: dict, source: str = "<spec>", text: str = "") -> SweepSpec:
    """Validate a spec given as the dict its TOML parses to (the command
    line's ``mbbatch simulate`` builds one from its flags)."""
    raw = dict(raw)
    for key in raw:
        if key not in _TOP:
            raise SpecError(f"{source}: unknown key {key!r}; allowed: {sorted(_TOP)}")
    capacity = _capacity_table(raw, source)
    if capacity is not None and "reps" in raw:
        raise SpecError(f"{source}: reps does not apply to a capacity search: each probe replicates until "
                        "decided, up to [capacity] max_reps")
    if "arrivals" not in raw and "workload" in raw and capacity is None:
        raw["arrivals"] = "trace"       # (a trace spec replays the trace's arrival times unless it says otherwise)
    for key, value in TOP_DEFAULTS.items():
        raw.setdefault(key, value)
    if "name" not in raw and source.endswith(".toml"):
        raw["name"] = Path(source).stem
    if "name" not in raw:
        raise SpecError(f"{source}: missing field 'name' ({_TOP['name']})")
    if capacity is not None:
        raw["reps"] = 1
    name = raw["name"]
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise SpecError(f"{source}: name must be a non-empty identifier (letters, digits, _ or -); got {name!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise SpecError(f"{source}: description must be a string; got {description!r}")
    arrivals = _choice(raw, "arrivals", ARRIVALS, source)
    if capacity is not None and arrivals not in CAPACITY_ARRIVALS:
        raise SpecError(f"{source}: a capacity search sets the rate of arrivals {list(CAPACITY_ARRIVALS)}; "
                        f"got arrivals = {arrivals!r}")
    reps = raw["reps"]
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise SpecError(f"{source}: reps must be an integer in [1, inf); got {reps!r}")
    seed = _seed(raw["seed"], source)
    confidence = _confidence(raw, capacity, source)
    fixed, grid, tables = (_table(raw, t, source) for t in ("params", "grid", "policies"))

    # --- the policy variants
    if ("policy" in raw) == bool(tables):
        raise SpecError(f"{source}: give either policy = KIND (one policy) or [policies.NAME] tables "
                        "(policy variants), not both or neither")
    if "policy" in raw:
        kind = _choice(raw, "policy", KINDS, source)
        policies, single = {kind: {"kind": kind}}, True
    else:
        policies, single = {}, False
        for vname, settings in tables.items():
            where = f"{source}: policies.{vname}"
            if not vname.replace("_", "").replace("-", "").isalnum():
                raise SpecError(f"{where}: a variant's name must be an identifier (letters, digits, _ or -)")
            if not isinstance(settings, dict):
                raise SpecError(f"{where} must be a table; got {settings!r}")
            if "kind" not in settings:
                raise SpecError(f"{where}: missing field 'kind' (one of {list(KINDS)})")
            policies[vname] = dict(settings)
            policies[vname]["kind"] = _choice(settings, "kind", KINDS, where)
            if "seed" in settings:
                policies[vname]["seed"] = _seed(settings["seed"], where)

    # --- the workload: the paper's service times, token-level requests, or a trace's
    kinds = {v["kind"] for v in policies.values()}
    trace = _trace_table(raw, source)
    if arrivals == "trace" and trace is None:
        raise SpecError(f"{source}: arrivals = \"trace\" replays a trace's arrival times: it needs a [workload] "
                        "table naming the trace")
    if trace is None and "service" in raw and "service_model" in raw:
        raise SpecError(f"{source}: give either service (the paper's workload) or service_model "
                        "(token-level requests), not both")
    if trace is not None:
        if "service" in raw:
            raise SpecError(f"{source}: a [workload] trace gives the requests: service does not apply "
                            "(choose a service_model)")
        workload = "trace"
        model = _choice(raw, "service_model", TABLE["service_model"].choices, source) \
            if "service_model" in raw else "max"
    elif "service" in raw:
        workload = _choice(raw, "service", _SERVICES, source)
        model = "max"
        tokens = [k for k in KINDS if k in kinds and not POLICIES[k].paper]
        if tokens:
            paper = [k for k in KINDS if POLICIES[k].paper]
            raise SpecError(f"{source}: service = {workload!r} is for the paper's model (policy "
                            f"{' or '.join(paper)}); policies {', '.join(tokens)} take service_model and "
                            "prompt_/output_ parameters")
    elif "service_model" not in raw and all(POLICIES[k].paper for k in kinds):
        workload, model = "uniform", "max"     # (the paper's policies alone: the paper's workload)
    else:
        workload = "tokens"
        # the kinds' default model (a paper's policy has none for token-level requests)
        defaults = {POLICIES[k].models[0] for k in kinds if not POLICIES[k].paper}
        model = defaults.pop() if len(defaults) == 1 else "decode"
        if "service_model" in raw:
            model = _choice(raw, "service_model", TABLE["service_model"].choices, source)

    if capacity is not None:
        for nm in SEARCHED:
            where = [t for t, d in (("params", fixed), ("grid", grid)) if nm in d]
            where += [f"policies.{v}" for v, st in policies.items() if nm in st]
            if where:
                raise SpecError(f"{source}: {where[0]}.{nm}: a capacity search sets the arrival rate; remove "
                                f"{nm} (the arrival process keeps its other parameters, its shape)")

    for k in KINDS:
        if k in kinds and model not in POLICIES[k].models:
            paper = (" (or service = \"uniform\" or \"expon\": the paper's workload)"
                     if POLICIES[k].paper and workload == "tokens" else "")
            raise SpecError(f"{source}: policy {k} takes service_model = "
                            f"{' or '.join(f'{chr(34)}{m}{chr(34)}' for m in POLICIES[k].models)}{paper}; got "
                            f"policies {sorted(kinds)} with service_model = {model!r}")

    # --- which keys apply, and to which variants
    def applies_to(nm):
        sp = SPEC_PARAMS.get(nm)
        return [v for v, s in policies.items()
                if sp and sp.applies(s["kind"], arrivals, workload, model, capacity is not None)]

    def unknown(where, key, allowed, shown=None):
        side = {"tokens": f"token-level requests under service_model={model!r}",
                "trace": f"a trace's requests under service_model={model!r}"}.get(workload, f"service={workload!r}")
        why = ("no such parameter" if key not in SPEC_PARAMS else
               f"it does not apply to {', '.join(sorted(kinds))} with arrivals={arrivals!r} and {side}")
        return SpecError(f"{where}: unknown key {shown or key} ({why}); allowed: {sorted(allowed)}")

    # (every unknown key, bad value and missing field is collected, and all are reported at once)
    problems = _Problems(source)
    classes = _classes_table(raw, source, workload, capacity, problems)
    allowed_any = sorted(nm for nm in SPEC_PARAMS if applies_to(nm))
    for key in fixed:
        if key == "policy" and not single:
            continue
        if key not in SPEC_PARAMS or not applies_to(key):
            problems.add(unknown(f"{source}: params", key, allowed_any, f"params.{key}" if key in SPEC_PARAMS else key))
    for key in grid:
        if key == "policy":
            continue
        if key not in SPEC_PARAMS or not applies_to(key):
            problems.add(unknown(f"{source}: grid", key, allowed_any, f"grid.{key}"))
            continue
        if len(applies_to(key)) != len(policies):
            missing = sorted(set(policies) - set(applies_to(key)))
            raise SpecError(f"{source}: grid.{key} does not apply to the variants {missing}; an axis must "
                            "apply to every policy variant (put the value in the variants' tables)")
    for key in fixed:
        if key in grid:
            raise SpecError(f"{source}: {key} is both in [params] and in [grid]; give it once")
    for vname, settings in policies.items():
        for key in settings:
            if key in _VARIANT_KEYS:
                continue
            sp = SPEC_PARAMS.get(key)
            if sp is None or not sp.applies(settings["kind"], arrivals, workload, model, capacity is not None):
                allowed = sorted(nm for nm, p in SPEC_PARAMS.items()
                                 if p.applies(settings["kind"], arrivals, workload, model, capacity is not None))
                problems.add(unknown(f"{source}: policies.{vname}", key, allowed))
                continue
            if key in grid:
                raise SpecError(f"{source}: {key} is both in policies.{vname} and in [grid]; give it once")

    # --- values
    params = {}
    for key, value in fixed.items():
        if key == "policy" or key not in SPEC_PARAMS or not applies_to(key):
            continue
        with problems.collect():
            params[key] = SPEC_PARAMS[key].check(value, f"{source}: params")
    for vname, settings in policies.items():
        for key, value in list(settings.items()):
            if key not in _VARIANT_KEYS and key in SPEC_PARAMS:
                with problems.collect():
                    settings[key] = SPEC_PARAMS[key].check(value, f"{source}: policies.{vname}")
    axes = {}
    for nm, values in grid.items():
        where = f"{source}: grid.{nm}"
        if nm != "policy" and (nm not in SPEC_PARAMS or not applies_to(nm)):
            continue
        if not isinstance(values, list) or not values:
            problems.add(SpecError(f"{where}: an axis must be a non-empty list of values; got {values!r}"))
            continue
        if nm == "policy":
            if single:
                raise SpecError(f"{where}: a policy axis needs [policies.NAME] tables")
            bad = [v for v in values if not isinstance(v, str) or v not in policies]
            if bad:
                raise SpecError(f"{where}: no variant named {bad[0]!r}; the variants: {sorted(policies)}")
            checked = list(values)
        else:
            checked = None
            with problems.collect():
                checked = [SPEC_PARAMS[nm].check(v, where) for v in values]
            if checked is None:
                continue
        if len(set(checked)) != len(checked):
            dup = next(v for v in checked if checked.count(v) > 1)
            raise SpecError(f"{where}: duplicated value {dup!r}")
        axes[nm] = checked
    if not single:
        if "policy" in axes:
            chosen = axes["policy"]
        elif "policy" in fixed:
            if not isinstance(fixed["policy"], str) or fixed["policy"] not in policies:
                raise SpecError(f"{source}: params.policy names no variant; the variants: {sorted(policies)}")
            params["policy"] = chosen = fixed["policy"]
            chosen = [chosen]
        elif len(policies) == 1:
            chosen = list(policies)
        else:
            raise SpecError(f"{source}: several policy variants but no grid.policy axis listing them")
        unused = sorted(set(policies) - set(chosen))
        if unused:
            raise SpecError(f"{source}: the variants {unused} are in no grid.policy axis; remove them or "
                            "add them to the axis")

    # --- a replayed trace's n: its length, unless given
    if (trace is not None and arrivals == "trace" and "n" not in fixed and "n" not in grid
            and not any("n" in st for st in policies.values()) and not problems.found):
        with problems.collect():
            params["n"] = _trace_length(trace, params, grid, source)

    # --- every variant has every parameter it needs (a cluster: those its engines need)
    for vname, settings in policies.items():
        engines = None
        if settings["kind"] == "cluster":
            given = settings.get("engine_policy", params.get("engine_policy", axes.get("engine_policy")))
            engines = ({TABLE["engine_policy"].default} if given is None
                       else set(given) if isinstance(given, list) else {given})
        for nm, sp in SPEC_PARAMS.items():
            if (sp.required
                    and (engines is None or any(sp.applies(k, arrivals, workload, model, capacity is not None)
                                                for k in engines))
                    and sp.applies(settings["kind"], arrivals, workload, model, capacity is not None)
                    and nm not in settings and nm not in fixed and nm not in grid and nm not in params
                    and not (capacity is not None and nm in SEARCHED)):
                where = f"policies.{vname}, " if not single else ""
                problems.add(SpecError(f"{source}: missing field {where}params.{nm} or grid.{nm} "
                                       f"({sp.table.description})"))
    problems.raise_any()

    spec = SweepSpec(name=name, description=description, arrivals=arrivals, workload=workload,
                     service_model=model, reps=reps, seed=seed, params=params, axes=axes, policies=policies,
                     source=source, text=text, single=single, trace=trace, capacity=capacity,
                     confidence=confidence, baseline=_baseline(raw, axes, capacity, source), classes=classes)
    _check_joint(spec, source)
    _check_lengths(spec, source)
    return spec


class _Problems:
    """A spec's problems, collected to be reported together (a spec with
    three bad fields names all three)."""

    def __init__(self, source: str):
        self.source, self.found = source, []

    def add(self, exc: SpecError) -> None:
        self.found.append(str(exc))

    @contextlib.contextmanager
    def collect(self):
        try:
            yield
        except SpecError as exc:
            self.add(exc)

    def raise_any(self) -> None:
        if len(self.found) == 1:
            raise SpecError(self.found[0])
        if self.found:
            lead = f"{self.source}: "
            raise SpecError(f"{self.source}: {len(self.found)} problems:\n"
                            + "\n".join(f"  {m.removeprefix(lead)}" for m in self.found))


def _classes_table(raw: dict, source: str, workload: str, capacity: dict | None,
                   problems: _Problems) -> dict | None:
    """The [classes.NAME] tables: each class's ``share`` and the keys it
    gives (:data:`CLASS_KEYS`, and :data:`CLASS_OBJECTIVES` in a capacity
    spec), checked against the parameter table (None where the spec has
    none).  A bad value is collected in ``problems``."""
    if "classes" not in raw:
        return None
    table = _table(raw, "classes", source)
    where = f"{source}: classes"
    if workload != "tokens":
        side = {"trace": "a trace's requests (its own lengths)"}.get(workload, f"service = {workload!r}")
        raise SpecError(f"{where}: a mixture's classes draw log-normal token lengths (token-level requests under "
                        f"a service_model); they do not apply to {side}")
    if not table or not all(isinstance(c, dict) for c in table.values()):
        raise SpecError(f"{where}: a mixture's classes are tables, [classes.NAME] with share = ... (one a class, "
                        f"at least one); got {table!r}")
    allowed = ["share", *CLASS_KEYS, *(CLASS_OBJECTIVES if capacity is not None else ())]
    out = {}
    for cname, settings in table.items():
        here = f"{where}.{cname}"
        if not cname.replace("_", "").replace("-", "").isalnum():
            raise SpecError(f"{here}: a class's name must be an identifier (letters, digits, _ or -)")
        out[cname] = {}
        for key, value in settings.items():
            if key not in allowed:
                why = ("a capacity search's objective: it applies to a spec with a [capacity] table"
                       if key in CLASS_OBJECTIVES else
                       f"not a metric of a class: its objectives bound {', '.join(CLASS_METRICS)}"
                       if key.startswith("objective_") and key.removeprefix("objective_") in OBJECTIVE_METRICS
                       else "not a key of a class")
                problems.add(SpecError(f"{here}: unknown key {key!r} ({why}); allowed: {allowed}"))
                continue
            with problems.collect():
                if key == "share":
                    try:
                        out[cname][key] = check("class_share", value, "share")
                    except (TypeError, ValueError) as exc:
                        raise SpecError(f"{here}: {exc}") from None
                else:
                    out[cname][key] = SPEC_PARAMS[key].check(value, here)
        if "share" not in settings:
            problems.add(SpecError(f"{here}: missing field 'share' ({TABLE['class_share'].description})"))
    return out


def _baseline(raw: dict, axes: dict, capacity: dict | None, source: str) -> str | None:
    """The spec's ``baseline``: one of two or more policy variants on its
    policy axis, in a sweep at fixed rates (None where not given)."""
    if "baseline" not in raw:
        return None
    value = raw["baseline"]
    variants = list(axes.get("policy", ()))
    if capacity is not None:
        raise SpecError(f"{source}: baseline compares the replications of a sweep at fixed rates; a capacity "
                        "search has none")
    if len(variants) < 2:
        raise SpecError(f"{source}: baseline needs a policy axis of two or more variants to compare (grid "
                        f"policy = [...]); got {variants or 'none'}")
    if not isinstance(value, str) or value not in variants:
        raise SpecError(f"{source}: baseline must be one of the policy axis's variants {variants}; got {value!r}")
    return value


def _confidence(raw: dict, capacity: dict | None, source: str) -> float:
    """The spec's confidence level: ``confidence``, or a capacity search's ``[capacity] confidence``."""
    if capacity is not None:
        if "confidence" in raw:
            raise SpecError(f"{source}: a capacity search's confidence is [capacity] confidence, not a "
                            "top-level key")
        return float(capacity["confidence"])
    value = raw.get("confidence", CONFIDENCE)
    domain = SEARCH_DOMAINS["confidence"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not domain.contains(value):
        raise SpecError(f"{source}: confidence must be a number in {domain}; got {value!r}")
    return float(value)


#: the parameters a capacity search sets: the rate (and a replay's scale)
SEARCHED = ("rate", "scale")


def _capacity_table(raw: dict, source: str) -> dict | None:
    """The [capacity] table, its defaults filled in (the objective's bounds
    are the parameters ``objective_<metric>``)."""
    if "capacity" not in raw:
        return None
    table = _table(raw, "capacity", source)
    where = f"{source}: capacity"
    out = {}
    for key, value in table.items():
        if key == "objective" or key in OBJECTIVE_METRICS:
            raise SpecError(f"{where}: {key}: an objective's bounds are parameters, objective_<metric> in "
                            "[params] (or [grid] axes), e.g. objective_latency_p95 = 30.0")
        if key not in CAPACITY_KEYS:
            raise SpecError(f"{where}: unknown key {key!r}; allowed: {sorted(CAPACITY_KEYS)}")
        _, dom, ok = CAPACITY_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise SpecError(f"{where}: {key} must be in {dom}; got {value!r}")
        out[key] = value
    for key, (default, _, _) in CAPACITY_KEYS.items():
        out.setdefault(key, default)
    return out


def _trace_length(trace: dict, params: dict, grid: dict, source: str) -> int:
    """The requests of a replayed trace after its filters: a trace spec's
    default ``n`` (one trace for every cell: the window and drop_failed not
    axes).  Read as the cells read it (:func:`trace_of`, cached)."""
    axes = [k for k in ("window_start", "window_end", "drop_failed") if k in grid]
    if axes:
        raise SpecError(f"{source}: missing field params.n (the trace's length differs along the axes {axes}: "
                        "give n)")
    cell = {"trace": trace, **{k: params.get(k, SPEC_PARAMS[k].default)
                               for k in ("window_start", "window_end", "drop_failed")}}
    try:
        return int(trace_of(cell).arrival.size)
    except ValueError as exc:       # (e.g. filters that leave no request)
        raise SpecError(f"{source}: {exc}") from None


@functools.lru_cache(maxsize=4)
def _load_trace(path: str, fmt: str, filters_json: str, stamp: tuple):
    """A spec's trace, read once per process (the loaders check every row)
    and again when the file changes (``stamp``: its size and mtime)."""
    from .. import traces

    filters = json.loads(filters_json)
    if "window" in filters:
        filters["window"] = tuple(filters["window"])
    load = traces.load_azure_trace if fmt == "azure" else traces.load_burstgpt
    return load(path, **filters)


def trace_filters(params: dict) -> dict:
    """The loader's filters of a cell's trace: the [workload] table's (model,
    log_type) and the cell's window and drop_failed parameters (a window of
    [0, inf) is none; drop_failed unset is the loader's default)."""
    filters = dict(params["trace"]["filters"])
    if params["drop_failed"] is not None:
        filters["drop_failed"] = params["drop_failed"]
    if (params["window_start"], params["window_end"]) != (0.0, math.inf):
        filters["window"] = [params["window_start"], params["window_end"]]
    return filters


def trace_of(params: dict):
    """The Trace of a cell whose spec has a [workload] table, else None."""
    t = params.get("trace")
    if t is None:
        return None
    st = os.stat(t["path"])
    return _load_trace(t["path"], t["format"], json.dumps(trace_filters(params), sort_keys=True),
                       (st.st_size, st.st_mtime_ns))


def _trace_table(raw: dict, source: str) -> dict | None:
    """The [workload] table: the trace file (found beside the spec, or in the
    folder $MBBATCH_DATA names), its format and the loader's filters."""
    if "workload" not in raw:
        return None
    table = _table(raw, "workload", source)
    where = f"{source}: workload"
    for key in table:
        if key in _TRACE_PARAMS:
            raise SpecError(f"{where}: {key} is a parameter: set {_TRACE_PARAMS[key]} in [params] (or as "
                            "[grid] axes)")
        if key not in _TRACE_KEYS:
            raise SpecError(f"{where}: unknown key {key!r}; allowed: {sorted(_TRACE_KEYS)}")
    if "trace" not in table or not isinstance(table["trace"], str) or not table["trace"]:
        raise SpecError(f"{where}: trace must name the trace file (a path, relative to the spec's folder "
                        f"or to ${DATA_DIR_ENV})")
    fmt = _choice(table, "format", sorted(TRACE_SOURCES), where) if "format" in table else "azure"
    filters = {k: table[k] for k in ("model", "log_type") if k in table}
    resample = table.get("resample", False)
    if not isinstance(resample, bool):
        raise SpecError(f"{where}: resample must be true (each request's lengths drawn from the trace's) or "
                        f"false (replayed in the trace's order); got {resample!r}")
    if fmt == "azure" and ({"model", "log_type"} & set(filters)):
        raise SpecError(f"{where}: model and log_type filter BurstGPT traces, not the Azure format")
    given = Path(table["trace"]).expanduser()
    folders = [] if given.is_absolute() else [Path(source).parent if source != "<spec>" else Path.cwd()]
    if not given.is_absolute() and os.environ.get(DATA_DIR_ENV):
        folders.append(Path(os.environ[DATA_DIR_ENV]).expanduser())
    candidates = [given] if given.is_absolute() else [f / given for f in folders]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        looked = ", ".join(str(c) for c in candidates)
        raise TraceNotFound(f"{where}: no trace file {table['trace']!r} (looked for {looked}); download it "
                            f"from {TRACE_SOURCES[fmt]} and put it there, or set ${DATA_DIR_ENV} to its folder")
    return {"trace": table["trace"], "format": fmt, "resample": resample, "filters": filters,
            "path": str(found.resolve())}


#: a log-normal length law's keys, by side
_LENGTH_KEYS = {"prompt": ("prompt_median", "prompt_sigma"), "output": ("output_median", "output_sigma")}


def _check_lengths(spec: SweepSpec, source: str) -> None:
    """A spec of log-normal token lengths (``prompt_median``,
    ``prompt_sigma``, ``output_median``, ``output_sigma``): at every grid
    point, laws a run can draw from, and requests whose time under the
    point's service model the latency histogram resolves, refused naming
    these keys (or the service model's, when a request of one token is
    already out of range); with [classes.NAME] tables, each class's laws,
    named ``classes.NAME.<key>``.  The planners refuse the same grid points later
    (:func:`mbbatch.sweeps.cells.check_points`), but they name their API's
    arguments (``workload``, ``service_model``), not the spec's keys."""
    if spec.workload != "tokens":
        return
    from scipy.stats import norm

    from ..lengths import TAIL_PROBABILITY

    z = float(norm.isf(TAIL_PROBABILITY))
    log_max = math.log(sys.float_info.max)
    model_keys = [nm for nm, sp in SPEC_PARAMS.items() if spec.service_model in sp.models]
    seen = set()
    for _, params in spec.points():
        # (one law per class where the spec has classes, each named by its table)
        laws = ([(f"classes.{c}.", vals) for c, vals in params["classes"].items()] if "classes" in params
                else [("", params)])
        for prefix, vals in laws:
            _check_law(spec, source, params, prefix, vals, model_keys, seen, z, log_max)


def _check_law(spec, source, params, prefix, vals, model_keys, seen, z, log_max) -> None:
    """:func:`_check_lengths` at one grid point ``params`` of the log-normal
    law of ``vals`` (the point's, or a class's: its keys named with
    ``prefix``)."""
    from ..params import MAX_DURATION
    from ..simulation import SCALE_RANGE

    lo, hi = SCALE_RANGE
    law = {prefix + nm: vals[nm] for keys in _LENGTH_KEYS.values() for nm in keys}
    key = (params["kind"], *law.values(), *(repr(params.get(nm)) for nm in model_keys))
    if key in seen:
        return
    seen.add(key)
    where = ", ".join(f"{nm}={params[nm]!r}" for nm in spec.axes)
    where = f"{source}: at grid point {where}: " if where else f"{source}: "
    means = {}
    for side, (m_key, s_key) in _LENGTH_KEYS.items():
        m_key, s_key = prefix + m_key, prefix + s_key
        m, s = law[m_key], law[s_key]
        named = f"{m_key} = {m!r} and {s_key} = {s!r}"
        if math.log(m) + s * s / 2 >= log_max:
            raise SpecError(f"{where}{named}: the log-normal {side} lengths' mean, {m_key} x exp({s_key}**2 / "
                            f"2), is beyond the float range; lower {s_key} (below "
                            f"{math.sqrt(2 * (log_max - math.log(m))):.3g} at this median)")
        top = math.log(m) + z * s
        if top > math.log(MAX_DURATION):
            shown = f"{math.exp(top):.3g}" if top < log_max else f"10**{top / math.log(10):.0f}"
            raise SpecError(f"{where}{named}: the log-normal {side} lengths reach "
                            f"{shown} tokens ({m_key} x exp({z:.3g} {s_key}), their "
                            f"1 - 2**-64 quantile), beyond the {MAX_DURATION:g} that keeps a run's sums finite; "
                            f"lower {m_key} or {s_key}")
        means[side] = m * math.exp(s * s / 2)
    # (a side is to blame where its lengths at the table's defaults would bring the time in range)
    usual = {side: TABLE[m_key].default * math.exp(TABLE[s_key].default ** 2 / 2)
             for side, (m_key, s_key) in _LENGTH_KEYS.items()}
    try:
        model = service_model(spec.service, params)
        t = {(p, o): float(model.one_request(p, o))
             for p, o in ((means["prompt"], means["output"]), (usual["prompt"], means["output"]),
                          (means["prompt"], usual["output"]), (1.0, 1.0))}
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return          # (check_points names what the service model's own check refuses)
    out = {k: math.isfinite(v) and v > 0 and not lo <= v <= hi for k, v in t.items()}
    if not out[means["prompt"], means["output"]]:
        return
    scale = t[means["prompt"], means["output"]]
    rng = (f"outside [{lo:.3g}, {hi:.3g}] s, the range whose latencies the latency histogram resolves (its "
           f"buckets cover 2**-30 to 2**50 s)")
    if out[1.0, 1.0]:
        given = [f"{nm} = {params[nm]!r}" for nm in model_keys
                 if nm in params and params[nm] != SPEC_PARAMS[nm].default]
        raise SpecError(f"{where}service_model = {spec.service_model!r}"
                        f"{' (' + ', '.join(given) + ')' if given else ''}: a request of one prompt and one "
                        f"output token takes about {t[1.0, 1.0]:.3g} s, {rng}; express its times in other "
                        "units")
    sides = [side for side, k in (("prompt", (usual["prompt"], means["output"])),
                                  ("output", (means["prompt"], usual["output"]))) if not out[k]]
    sides = sides or ["prompt", "output"]
    keys = [prefix + nm for side in sides for nm in _LENGTH_KEYS[side]]
    raise SpecError(f"{where}{', '.join(f'{nm} = {law[nm]!r}' for nm in keys)}: requests of the mean lengths "
                    f"(prompt {means['prompt']:.3g} and output {means['output']:.3g} tokens) take about "
                    f"{scale:.3g} s under service_model = {spec.service_model!r}, {rng}; lower "
                    f"{' or '.join(k for k in keys if k.endswith('_median'))} or "
                    f"{' or '.join(k for k in keys if k.endswith('_sigma'))}")


def service_model(name: str, params: dict):
    """The batch service model ``name`` of a cell with token-level requests,
    from its parameters (each the model's default unless the spec sets it):
    the model's class reads the keys it declares (``spec_keys``); a
    ``profile`` is a measured engine's model by name."""
    if name == "profile":
        from .. import profiles

        return dataclasses.replace(profiles.get(params["profile"]), finished=params["finished"])
    cls = SERVICE_MODELS[name]
    return cls(**{f: params[k] for k, f in cls.spec_keys.items()})


def _values(spec: SweepSpec, key: str) -> list:
    """Every value ``key`` takes anywhere in the spec."""
    out = list(spec.axes.get(key, []))
    out += [spec.params[key]] if key in spec.params else []
    out += [s[key] for s in spec.policies.values() if key in s]
    return out


#: the keys that shape synthetic programs (``programs = "synthetic"``)
_PROGRAM_KEYS = ("calls", "think_time", "closed_loop")


def _check_own_programs(spec: SweepSpec, source: str) -> None:
    """A kind whose programs are off by default (``spec_defaults``: a
    disaggregated deployment's) given the synthetic programs' keys but not
    ``programs`` would ignore them: refused, naming the variant."""
    for vname, settings in spec.policies.items():
        kind = settings["kind"]
        if SPEC_PARAMS["programs"].default_for(kind) == "synthetic":
            continue
        # (its programs: its own, or the grid's or params' (every variant's); the keys: its own, or, where every
        # variant is of its kind, the grid's and params' too (else they may be a cluster's))
        given = ([settings["programs"]] if "programs" in settings else []) + list(spec.axes.get("programs", [])) + (
            [spec.params["programs"]] if "programs" in spec.params else [])
        alone = all(s["kind"] == kind for s in spec.policies.values())
        keys = [k for k in _PROGRAM_KEYS if k in settings or (alone and _values(spec, k))]
        if keys and not given:
            named = "" if spec.single else f" (policies.{vname})"
            raise SpecError(f"{source}: {', '.join(keys)} shape{'s' if len(keys) == 1 else ''} synthetic programs, "
                            f"and a {kind} deployment runs none unless asked{named}: set programs = \"synthetic\"")


def _cluster_values(spec: SweepSpec, key: str) -> list:
    """Every value ``key`` takes for a cluster: in its variants' tables, and
    in the grid and params where every variant is a cluster."""
    kinds = [s["kind"] for s in spec.policies.values()]
    out = [s[key] for s in spec.policies.values() if s["kind"] == "cluster" and key in s]
    if kinds and all(k == "cluster" for k in kinds):
        out += list(spec.axes.get(key, [])) + ([spec.params[key]] if key in spec.params else [])
    return out


#: the kinds whose engines run a mixture's classes: continuous batching, alone or as a cluster's engines
_MIXTURE_KINDS = tuple(k for k in KINDS if POLICIES[k].classes)


def _check_mixture(spec: SweepSpec, source: str) -> None:
    """A spec of [classes.NAME] tables runs continuous batching engines (a
    cluster's: ``engine_policy`` among them and ``programs = "none"``, its
    requests independent)."""
    takes = ", ".join(f'"{k}"' for k in _MIXTURE_KINDS)
    other = [k for k in spec.kinds if k not in (*_MIXTURE_KINDS, "cluster")]
    if other:
        raise SpecError(f"{source}: classes: a mixture's requests run on continuous batching engines (policy "
                        f"{takes}, or a cluster of them); got policies {other}")
    for vname, settings in spec.policies.items():
        if settings["kind"] != "cluster":
            continue
        for key, want, why in (("engine_policy", _MIXTURE_KINDS, "a cluster's mixture runs on continuous batching "
                                                                 "engines"),
                               ("programs", ("none",), "a mixture's requests are independent, not a cluster's "
                                                       "programs")):
            given = settings.get(key, spec.params.get(key, spec.axes.get(key, TABLE[key].default)))
            bad = sorted(set(given if isinstance(given, list) else [given]) - set(want))
            if bad:
                named = "" if spec.single else f" (policies.{vname})"
                raise SpecError(f"{source}: classes: {why}; set {key} = "
                                f"{' or '.join(chr(34) + w + chr(34) for w in want)}{named}, got {bad}")


def _check_joint(spec: SweepSpec, source: str) -> None:
    """Constraints across parameters, checked over the whole grid (the
    objects of every grid point are built and checked as well, before a
    store exists: :func:`mbbatch.sweeps.cells.check_points`)."""
    if "lemma_a1" in _values(spec, "edges") and spec.workload != "expon":
        raise SpecError(f"{source}: edges = \"lemma_a1\" needs service = \"expon\"")
    if "optimal" in _values(spec, "edges") and spec.workload not in ("uniform", "expon"):
        raise SpecError(f"{source}: edges = \"optimal\" needs service = \"uniform\" or \"expon\" (eq. (2) on "
                        "the service distribution)")
    if spec.arrivals == "step":
        up, down = _values(spec, "t_up"), _values(spec, "t_down")
        if up and down and max(up) >= min(down):
            raise SpecError(f"{source}: t_down must be after t_up at every grid point")
    programs = set(_values(spec, "programs"))
    if "sessions" in programs:
        if spec.trace is None or spec.trace["format"] != "burstgpt" or spec.trace["resample"]:
            raise SpecError(f"{source}: programs = \"sessions\" takes the sessions of a BurstGPT trace, its "
                            "requests replayed in order: a [workload] table with format = \"burstgpt\" and "
                            "resample = false")
    if programs and "synthetic" not in programs:
        for key in _PROGRAM_KEYS:
            if _values(spec, key):
                raise SpecError(f"{source}: {key} shapes synthetic programs; programs = "
                                f"{sorted(programs)} has none")
    _check_own_programs(spec, source)
    decode = set(_values(spec, "decode"))
    if not decode - {"none"}:
        for key in _DECODE_SETTINGS:
            if _values(spec, key):
                stages = [f'"{k}"' for k in TABLE["decode"].choices if k != "none"]
                raise SpecError(f"{source}: {key} sets LAPS's decode stage; set decode = "
                                f"{', '.join(stages[:-1])} or {stages[-1]} for one")
    engines = set(_values(spec, "engine_policy")) or {TABLE["engine_policy"].default}
    for key, setting in (("engine_batch_size", "batch_size"), ("engine_bins", "bins"),
                         *((k, k) for k in _ENGINE_ONLY)):
        takes = [k for k in TABLE["engine_policy"].choices if setting in POLICIES[k].settings]
        given = _cluster_values(spec, key) if key in _ENGINE_ONLY else _values(spec, key)
        if given and not engines & set(takes):
            raise SpecError(f"{source}: {key} sets the {setting} of the engines of {', '.join(takes)}; "
                            f"engine_policy = {sorted(engines)} has none")
    if spec.classes is not None:
        _check_mixture(spec, source)
    if _values(spec, "session_context") and "sessions" not in programs:
        raise SpecError(f"{source}: session_context applies to programs = \"sessions\" only")
    lo, hi = _values(spec, "b_min"), _values(spec, "b_max")
    if lo and hi and max(lo) > min(hi):
        raise SpecError(f"{source}: b_min must be at most b_max at every grid point")
    lo, hi = _values(spec, "window_start"), _values(spec, "window_end")
    if lo and hi and max(lo) >= min(hi):
        raise SpecError(f"{source}: window_end must be after window_start at every grid point; got "
                        f"window_start up to {max(lo)} and window_end down to {min(hi)}")
    if spec.workload == "uniform":
        lo, hi = _values(spec, "l_min"), _values(spec, "l_max")
        if lo and hi and max(lo) >= min(hi):
            raise SpecError(f"{source}: l_max must be greater than l_min at every grid point; "
                            f"got l_min up to {max(lo)} and l_max down to {min(hi)}")
