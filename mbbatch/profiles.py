"""Named hardware profiles: :class:`~mbbatch.IterationModel` fitted to measured
batch latencies of real accelerators.

The measurements shipped with mbbatch are LLM-Inference-Bench's (Chitty-Venkata
et al., 2024, "LLM-Inference-Bench: Inference Benchmarking of Large Language
Models on AI Accelerators", SC24 workshops, arXiv:2411.00136; BSD 3-Clause,
its license and citation beside the data in ``mbbatch/data/llm_inference_bench``):
4,772 batches, each of ``size`` requests of ``L`` prompt tokens generating ``L``
tokens, run to completion on one of 9 accelerators, 1 to 8 devices, 6
frameworks and 15 models.  A profile is one group of them (hardware x devices
x framework x model), named ``HARDWARE/FRAMEWORK/MODEL/tpN``, for example
``H100/vLLM/Meta-Llama-3-8B/tp1`` (``MODEL`` without its organisation,
``N`` the devices).  Names are stable: they follow the data's values.

Each profile is fitted on relative error (its times span three orders of
magnitude, :meth:`~mbbatch.IterationModel.fit`) when first asked for; its
held-out error (leave-one-out) is reported (:func:`list`, :func:`fit`).
Over the 227 profiles the median of their held-out errors is 5.4 % (5.2 % fitted on the
batches alone, below; Pang et al.'s
:class:`~mbbatch.DecodeModel` form, refitted to the same rows: 20 %); the largest, 20 %,
are llama.cpp's on MI300X.  Mixtral-8x7B's profiles (:data:`MIXTURES`: a mixture of
experts) fit the time to read an expert's weights, ``per_expert``: a decode
iteration's tokens route to more of the experts as its batch grows, until all
are read, which brings vLLM's Mixtral profiles from 6-20 % to 0.5-6 %.

Rows screened out: a batch that took less than half the time of the same
batch size at a shorter length in its group (twice the tokens cannot take
less time: these are runs that failed, e.g. a 2,048 + 2,048-token request
beyond a 2,048-token model's context, measured at 0.05 s).  33 rows (one
size x length cell each) of 9 of the 256 groups are so excluded; :func:`measurements` gives
every row, with a column ``excluded``.  Groups left with fewer than 8 rows,
or fewer than 3 batch sizes or 3 lengths, are not profiles (their terms are
not told apart).

Because the benchmark's batches have prompts and outputs of one length ``L``,
a batch's prefill and its decode steps grow together: the batches tell the
per-batch and per-iteration times apart, and the attention over the context,
but split ``b L`` between ``prefill_per_token`` and ``per_sequence`` only by
the difference of ``b`` between ``b L`` and ``b (L - 1)`` (alone, the prefill
rate of 14 of the 26 profiles below lands at its bound, 0).  So each profile
whose prefill the benchmark measured (:data:`PREFILL`: 16 prompts of 1,024
tokens generating one token; 26 profiles, :func:`prefill_names`) is fitted
jointly on its batches and that prefill, which identifies its prefill rate;
``fit(name, prefill=False)`` gives the batches-only fit.  The other profiles'
prefill rates rest on the batches alone, and :func:`list` says which
coefficients the data do not identify.  Prompt lengths vary in neither
source's prefill rows, so ``prefill_attention`` is not fitted (0; say so:
:attr:`~mbbatch.service_models.FitResult.identification`).  Your own
measurements of the phases (``prefill``, ``per_token`` columns of
:func:`from_csv`) or serving runs (:func:`from_serving`) fix the split.

Examples
--------
>>> from mbbatch import profiles
>>> m = profiles.get("H100/vLLM/Meta-Llama-3-8B/tp1")
>>> m.profile
'H100/vLLM/Meta-Llama-3-8B/tp1'
>>> round(float(m.service_time(size=16, prompt=512, output=512)), 1)    # measured: 5.04 s
4.9
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import math
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from .params import PARAMS
from .results import Table
from .service_models import DENSE, FitResult, IterationModel

__all__ = ["list", "names", "get", "fit", "prefill_names", "measurements", "provenance", "from_csv", "from_serving",
           "sla_target",
           "SOURCE", "PREFILL", "BATCHES_ONLY_SUFFIX", "DEFAULT", "SLA_HEADROOM"]

#: the shipped measurements' file, in the package's data
_DATA = ("data", "llm_inference_bench", "All_results.csv")
#: where they come from
SOURCE = ("LLM-Inference-Bench (Chitty-Venkata et al., 2024, arXiv:2411.00136), Plots/All_results.csv at "
          "commit 4211f5d4e9bc0145ed541b6d372d5d8223b44235, BSD 3-Clause")
#: the engine release a profile's measurements ran on: the benchmark records no version (its paper's
#: runs are of 2024), so a profile times that year's releases, not today's (mb.validation calibrates
#: a release's overheads on its measured serving runs)
ENGINE_RELEASE = "{framework}, a 2024 release (LLM-Inference-Bench records no version)"
#: LLM-Inference-Bench's prefill measurements (its Fig. 21: a batch of 16 prompts of 1,024 tokens
#: generating one token, timed whole): one prefill row for 26 of the profiles, which identifies their
#: prefill rate (the batches alone, prompt = output, cannot).  The engine may split those 16,384
#: tokens into several iterations (its max_num_batched_tokens, not recorded): the fit takes one
#: prefill iteration, so a split's extra steps (about 8 ms each on an H100) land in the prefill rate
PREFILL = ("LLM-Inference-Bench (Chitty-Venkata et al., 2024, arXiv:2411.00136), Plots/Fig_21/all_results_TTFT.csv "
           "at commit 4211f5d4e9bc0145ed541b6d372d5d8223b44235, BSD 3-Clause")
_PREFILL = ("data", "llm_inference_bench", "Fig_21_all_results_TTFT.csv")
#: what a profile's ``profile`` field adds when it is fitted without its measured prefill
#: (``fit(name, prefill=False)``)
BATCHES_ONLY_SUFFIX = " (batches only)"
#: the profile whose fit gives IterationModel's defaults
DEFAULT = "H100/vLLM/Meta-Llama-3-8B/tp1"
#: the shipped profiles' names, one a line: what the parameter table offers without reading the
#: measurements (the tests hold it equal to :func:`names`)
_INDEX = ("data", "llm_inference_bench", "profiles.txt")
#: groups with fewer rows (after screening) are not profiles
MIN_ROWS = 8
#: a row below this share of the same size's time at a shorter length is a failed run
FAILED_SHARE = 0.5

_HARDWARE = {"Nvidia H100 GPU": "H100", "Nvidia A100 GPU": "A100", "Nvidia GH200 GPU": "GH200",
             "AMD MI300X GPU": "MI300X", "AMD MI250 GPU": "MI250", "Intel PVC GPU": "PVC",
             "Intel Max 1550": "Max1550", "Habana Gaudi2": "Gaudi2", "SambaNova SN40L": "SN40L"}
#: the mixtures of experts among the data's models: (experts per layer, experts per token) (Jiang et
#: al., 2024, "Mixtral of experts", arXiv:2401.04088: 8 experts, each token routed to 2); the
#: other models are dense
MIXTURES = {"mistralai/Mixtral-8x7B-v0.1": (8, 2)}
_COLUMNS = {"Hardware": "hardware", "Num of Hardware": "devices", "Framework": "framework", "Model": "model",
            "Input Output Length": "length", "Batch Size": "size", "Latency": "service"}


def _name(hardware: str, devices: int, framework: str, model: str) -> str:
    return f"{_HARDWARE.get(hardware, hardware.replace(' ', ''))}/{framework}/{model.split('/')[-1]}/tp{devices}"


def _read(data: bytes) -> dict:
    """The CSV's columns by our names, as arrays."""
    import io

    import pandas as pd

    df = pd.read_csv(io.BytesIO(data))
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"the measurements file lacks the columns {', '.join(missing)} (it has "
                         f"{', '.join(map(str, df.columns))})")
    df = df[builtins.list(_COLUMNS)].rename(columns=_COLUMNS)
    return {"hardware": df.hardware.to_numpy(object), "devices": df.devices.to_numpy(np.int64),
            "framework": df.framework.to_numpy(object), "model": df.model.to_numpy(object),
            "length": df.length.to_numpy(np.float64), "size": df["size"].to_numpy(np.int64),
            "service": df.service.to_numpy(np.float64)}


def _screen(length: np.ndarray, size: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Rows that are failed runs (:data:`FAILED_SHARE`): by batch size, a
    length's median time below that share of the largest median at the
    shorter lengths."""
    bad = np.zeros(length.size, bool)
    cells = {}
    for i, key in enumerate(zip(size.tolist(), length.tolist())):
        cells.setdefault(key, []).append(i)
    medians = {key: float(np.median(service[idx])) for key, idx in cells.items()}
    for b in set(size.tolist()):
        longest = -math.inf
        for L in sorted(L for (bb, L) in medians if bb == b):
            if medians[(b, L)] < FAILED_SHARE * longest:
                bad[cells[(b, L)]] = True
            longest = max(longest, medians[(b, L)])
    return bad


@functools.cache
def _shipped() -> tuple:
    """``(groups, digest)``: the shipped groups by name (their rows, screened),
    and the file's SHA-256."""
    raw = resources.files(__package__).joinpath(*_DATA).read_bytes()
    return _groups(_read(raw)), hashlib.sha256(raw).hexdigest()


def _groups(cols: dict) -> dict:
    keys = builtins.list(zip(cols["hardware"], cols["devices"].tolist(), cols["framework"], cols["model"]))
    at = {}
    for i, key in enumerate(keys):
        at.setdefault(key, []).append(i)
    groups = {}
    for key, idx in at.items():
        rows = {k: v[idx] for k, v in cols.items()}
        rows["excluded"] = _screen(rows["length"], rows["size"], rows["service"])
        groups[_name(*key)] = rows
    return groups


def _fittable(g: dict) -> bool:
    """A group is a profile: :data:`MIN_ROWS` rows or more after screening,
    of 3 batch sizes and 3 lengths at least (each term's scaling seen)."""
    keep = ~g["excluded"]
    return (int(keep.sum()) >= MIN_ROWS and np.unique(g["size"][keep]).size >= 3
            and np.unique(g["length"][keep]).size >= 3)


def names() -> builtins.list:
    """The shipped profiles' names, sorted."""
    groups, _ = _shipped()
    return sorted(k for k, g in groups.items() if _fittable(g))


def _group(name: str) -> dict:
    if not isinstance(name, str):
        raise TypeError(f"profile must be a profile's name (str; mbbatch.profiles.names()); got "
                        f"{type(name).__name__}")
    groups, _ = _shipped()
    if name not in groups or not _fittable(groups[name]):
        import difflib

        close = difflib.get_close_matches(str(name), names(), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"profile must be one of the {len(names())} shipped profiles (mbbatch.profiles.names()); "
                         f"got {name!r}{hint}")
    return groups[name]


def _rows_of(g: dict, name: str, prefill: bool = False) -> dict:
    """The rows a profile is fitted to: its screened batches (whole-batch
    times) and, with ``prefill`` where LLM-Inference-Bench measured its
    prefill (:data:`PREFILL`), that row (a prefill time; NaN where a row did
    not measure a time)."""
    keep = ~g["excluded"]
    rows = dict(size=g["size"][keep], prompt=g["length"][keep], output=g["length"][keep],
                service=g["service"][keep])
    pre = _prefills().get(name) if prefill else None
    if pre is None:
        return rows
    size, prompt, seconds = pre
    nan = np.full(rows["size"].size, np.nan)
    return dict(size=np.append(rows["size"], size), prompt=np.append(rows["prompt"], prompt),
                output=np.append(rows["output"], 1.0), service=np.append(rows["service"], np.nan),
                prefill=np.append(nan, seconds))


@functools.cache
def _prefills() -> dict:
    """LLM-Inference-Bench's prefill measurements by profile name: ``(size,
    prompt, seconds)`` (one batch of 16 prompts of 1,024 tokens generating
    one token: its prefill, :data:`PREFILL`)."""
    import io

    import pandas as pd

    raw = resources.files(__package__).joinpath(*_PREFILL).read_bytes()
    df = pd.read_csv(io.BytesIO(raw)).dropna(how="all")
    out = {}
    for _, r in df.iterrows():
        name = _name(r["Hardware"], int(r["Num of Hardware"]), r["Framework"], r["Model"])
        out[name] = (int(r["Batch Size"]), float(r["Input Length"]), float(r["Latency"]))
    return out


def fit(name: str, prefill: bool | None = None) -> FitResult:
    """The fit of profile ``name`` (:meth:`~mbbatch.IterationModel.fit` on
    relative error, its rows after screening; a mixture of experts'
    (:data:`MIXTURES`) with its experts, fitting ``per_expert``):
    coefficients, standard errors, R^2, in-sample and leave-one-out relative
    errors.

    ``prefill``: whether LLM-Inference-Bench's measured prefill of the
    profile (:data:`PREFILL`, 26 profiles; :func:`prefill_names`) is fitted
    jointly with its batches.  ``None`` (the default): where it was
    measured, which identifies the profile's ``prefill_per_token`` (the
    batches alone, prompt = output, leave it at 0 or weakly fitted);
    ``False``: the batches alone (the fitted model's ``profile`` then ends
    in :data:`BATCHES_ONLY_SUFFIX`); ``True``: jointly, and an error where
    no prefill was measured."""
    _group(name)    # (checked before the cache: a list is unhashable, and would say only that)
    if prefill is not None and not isinstance(prefill, bool):
        raise TypeError(f"prefill must be None, True or False; got {prefill!r}")
    if prefill and name not in _prefills():
        raise ValueError(f"prefill=True: LLM-Inference-Bench measured no prefill of {name}; the profiles with one "
                         "are mbbatch.profiles.prefill_names()")
    return _fit(name, name in _prefills() if prefill is None else prefill)


@functools.cache
def _fit(name: str, prefill: bool) -> FitResult:
    g = _group(name)
    experts, per_token = MIXTURES.get(str(g["model"][0]), DENSE)
    res = IterationModel.fit(_rows_of(g, name, prefill), weights="relative", experts=experts,
                             experts_per_token=per_token)
    plain = prefill or name not in _prefills()
    return replace(res, model=replace(res.model, profile=name + ("" if plain else BATCHES_ONLY_SUFFIX)))


def prefill_names() -> builtins.list:
    """The profiles whose prefill LLM-Inference-Bench measured (:func:`fit`
    fits it with their batches unless told ``prefill=False``), sorted."""
    return sorted(n for n in _prefills() if n in set(names()))


def get(name: str, prefill: bool | None = None) -> IterationModel:
    """The :class:`~mbbatch.IterationModel` of profile ``name`` (its ``profile``
    field names it; :func:`provenance` and :func:`fit` tell the rest);
    ``prefill``: whether its measured prefill is fitted (:func:`fit`; by
    default where measured)."""
    return fit(name, prefill).model


def measurements(name: str) -> Table:
    """Profile ``name``'s rows: ``size`` (requests), ``prompt`` and ``output``
    (tokens per request), ``service`` (s), ``excluded`` (a failed run, not fitted)."""
    g = _group(name)
    return Table(dict(size=g["size"], prompt=g["length"], output=g["length"], service=g["service"],
                      excluded=g["excluded"]))


def provenance(name: str) -> dict:
    """Where profile ``name`` comes from and how well it fits: the data's
    source and SHA-256, its group, rows fitted and excluded, coefficients
    and errors.  A store records it beside the runs it timed."""
    g = _group(name)
    res = fit(name)
    _, digest = _shipped()
    return {"profile": name, "source": SOURCE, "data_sha256": digest, "hardware": str(g["hardware"][0]),
            "devices": int(g["devices"][0]), "framework": str(g["framework"][0]), "model": str(g["model"][0]),
            "engine_release": ENGINE_RELEASE.format(framework=str(g["framework"][0])),
            "experts": res.model.experts, "rows": int((~g["excluded"]).sum()),
            "prefill_measured": name in _prefills(),
            "excluded": int(g["excluded"].sum()), **res.params,
            "unidentified": unidentified(res),
            "r2": res.r2, "median_error": res.median_error, "max_error": res.max_error,
            "holdout_error": res.holdout_error}


def unidentified(res: FitResult) -> str:
    """The coefficients of a fit its data do not identify, each with how
    (:attr:`FitResult.identification`: ``weak``, ``at bound``, ``not
    fitted``), comma-separated; empty when every one is identified."""
    return ", ".join(f"{k} ({how})" for k, how in res.identification.items() if how != "identified")


def list() -> Table:  # noqa: A001  (the module's API: mbbatch.profiles.list())
    """Every shipped profile, a row each: ``name``, ``hardware``, ``devices``,
    ``framework``, ``model``, ``engine_release`` (what the measurements ran
    on), ``experts``, ``rows`` fitted, ``excluded``, the coefficients,
    ``unidentified`` (the coefficients the data do not identify, and how:
    :func:`unidentified`), ``r2``, ``median_error``, ``max_error`` and
    ``holdout_error`` (relative).  Fits every profile the first time (a few
    seconds)."""
    rows = [provenance(n) for n in names()]
    keys = [k for k in rows[0] if k not in ("source", "data_sha256", "profile")]
    return Table({"name": np.array([r["profile"] for r in rows], dtype=object),
                  **{k: np.array([r[k] for r in rows], dtype=object if isinstance(rows[0][k], str) else None)
                     for k in keys}})


def from_serving(runs, *, base=None, terms=None, holdout: bool = True, progress=None):
    """A profile of your own engine, fitted to its serving runs: an
    :class:`~mbbatch.IterationModel` and the server's per-request overhead,
    with the fit's held-out error (:func:`mbbatch.serving.fit`, which this
    calls; its docstring gives the method).

    ``runs``: :class:`~mbbatch.serving.ServingRun` objects of one engine,
    hardware, model and parallelism, e.g. ``vllm bench serve
    --save-result --save-detailed`` files read by
    :func:`mbbatch.serving.read_vllm_bench`, several loads if you can.
    ``base``: where the fit starts and what it does not fit (a profile's
    name, an :class:`~mbbatch.IterationModel`, or None: the defaults);
    ``terms``: what it fits (default :data:`mbbatch.serving.FIT_TERMS`).
    Returns a :class:`~mbbatch.serving.ServingFit`: ``.model`` times
    :class:`~mbbatch.ContinuousBatching`, ``.engine(**settings)`` carries
    the overheads, ``.median_heldout()`` is the error to quote."""
    from . import serving

    return serving.fit(runs, base=get(base) if isinstance(base, str) else base,
                       terms=serving.FIT_TERMS if terms is None else terms, holdout=holdout, progress=progress)


def from_csv(path, *, size: str = "size", prompt: str = "prompt", output: str = "output",
             service: str | None = "service", prefill: str | None = None, per_token: str | None = None,
             weights: str = "relative", **fixed) -> FitResult:
    """Fit an :class:`~mbbatch.IterationModel` to a user's own measurements.

    Parameters
    ----------
    path : str or path-like
        A CSV file, one row per measured batch, with a header.
    size, prompt, output : str
        The columns of the batch size (requests) and the prompt and output
        lengths of its requests (tokens each).
    service, prefill, per_token : str or None
        The columns of the measured times (at least one; None: not measured):
        the whole batch (s), its prefill to the first token (s), its mean
        decode step (s).
    weights : {"relative", "absolute"}
        As :meth:`~mbbatch.IterationModel.fit`.
    **fixed
        ``finished`` of the model.

    Returns
    -------
    FitResult

    Raises
    ------
    TypeError
        ``path`` is not a path, or a column's name not a string.
    FileNotFoundError
        No file at ``path``.
    ValueError
        The file is not UTF-8 text, has no rows, lacks a column or names it
        twice; a row has more or fewer fields than the header (a comment
        line, a row cut short); a value is not a number, a size not a whole
        number in [1, 2**63); or :meth:`~mbbatch.IterationModel.fit`'s.
    """
    import csv
    import os

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a path (str or os.PathLike) of a CSV file; got {path!r} "
                        f"({type(path).__name__})")
    wanted = {"size": size, "prompt": prompt, "output": output, "service": service, "prefill": prefill,
              "per_token": per_token}
    for ours, theirs in wanted.items():
        if not isinstance(theirs, str) and not (theirs is None and ours in ("service", "prefill", "per_token")):
            kind = "a column's name (str)" if ours in ("size", "prompt", "output") else "a column's name (str) or None"
            raise TypeError(f"{ours} must be {kind}; got {theirs!r} ({type(theirs).__name__})")
    wanted = {k: v for k, v in wanted.items() if v is not None}
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path: no measurements file at {str(p)!r}")
    where = repr(str(p))
    try:
        # (utf-8-sig: a byte-order mark, as spreadsheets write, is no part of the header)
        with p.open(newline="", encoding="utf-8-sig") as f:
            lines = builtins.list(csv.reader(f))
    except UnicodeDecodeError as exc:
        raise ValueError(f"path: {where} is not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at "
                         f"offset {exc.start}); save it as UTF-8") from None
    # (csv.reader's rows; a blank line is no row, as DictReader skips it)
    numbered = [(i + 1, r) for i, r in enumerate(lines) if r]
    if not numbered:
        raise ValueError(f"path: {where} is empty (no header)")
    for line, r in numbered:
        if r[0].lstrip().startswith("#"):
            raise ValueError(f"path: line {line} of {where} is a comment ({','.join(r)[:60]!r}), which CSV "
                             "does not have: remove it (or keep notes in a column)")
    (_, header), body = numbered[0], numbered[1:]
    if not body:
        raise ValueError(f"path: {where} has no rows")
    for ours, theirs in wanted.items():
        at = [j + 1 for j, h in enumerate(header) if h == theirs]
        if len(at) > 1:
            raise ValueError(f"{ours}: {where} has {len(at)} columns named {theirs!r} (fields "
                             f"{', '.join(map(str, at))} of its header): which one is meant is ambiguous; "
                             "rename the others")
    missing = [v for v in wanted.values() if v not in header]
    if missing:
        raise ValueError(f"path: {where} lacks the columns {', '.join(missing)} (it has {', '.join(header)})")
    for line, r in body:
        if len(r) != len(header):
            raise ValueError(f"path: line {line} of {where} has {len(r)} fields where its header has "
                             f"{len(header)} ({','.join(r)[:60]!r}): every row needs a value in every column")
    cols = {}
    for ours, theirs in wanted.items():
        j = header.index(theirs)
        vals = np.empty(len(body))
        for k, (line, r) in enumerate(body):
            try:
                vals[k] = float(r[j])
            except ValueError:
                raise ValueError(f"{ours}: column {theirs!r} of {where} must hold numbers; line {line} has "
                                 f"{r[j][:40]!r}") from None
        cols[ours] = vals
    s_ = cols["size"]
    bad = ~(np.isfinite(s_) & (s_ == np.round(s_)) & (s_ >= 1) & (s_ < 2.0 ** 63))
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"size: column {size!r} of {where} must hold whole numbers of requests in [1, 2**63); "
                         f"line {body[k][0]} has {body[k][1][header.index(size)][:40]!r}")
    cols["size"] = s_.astype(np.int64)
    return IterationModel.fit(cols, weights=weights, **fixed)


def _index() -> tuple:
    return tuple(resources.files(__package__).joinpath(*_INDEX).read_text().split())


def _offer_choices() -> None:
    """The parameter table's ``profile`` offers the shipped profiles."""
    from . import params as _params

    _params.PARAMS["profile"] = replace(_params.PARAMS["profile"], choices=_index())


_offer_choices()


#: the SLA headroom of the default controller on the default DecodeModel: D_SLA (7.4 ms, the
#: parameter table's default) over the one-sequence decode time (5.74 ms) calibrated for the
#: dynamic-batching paper's GPU (Pang et al., 2025, arXiv:2503.05248)
SLA_HEADROOM = PARAMS["headroom"].default


def sla_target(model: IterationModel, context: float, headroom: float = SLA_HEADROOM) -> float:
    """A decode-time SLA target D_SLA (s/token) for an engine of ``model``:
    ``headroom`` times its one-sequence decode step at ``context`` tokens.

    The default D_SLA of 7.4 ms is a constant of the dynamic-batching
    paper's GPU (whose one-sequence decode step is calibrated at 5.74 ms): on an engine
    whose single sequence already steps in 7.8 ms (an H100 with an 8B
    model, :data:`DEFAULT`) it cannot be met at any batch size, and the
    controller shrinks every batch to ``b_min``.  Keeping that ratio
    (``headroom`` = 7.4 / 5.74 = 1.29) carries its SLA over to measured
    hardware; ``context`` is the workload's typical context (e.g. the median
    prompt plus half the median output).

    Examples
    --------
    >>> m = IterationModel(step=0.01, per_sequence=1e-4, per_context_token=1e-7)
    >>> round(sla_target(m, context=320.0), 6)      # 1.2892 x (0.01 + 1e-4 + 3.2e-5)
    0.013062
    """
    from ._validation import check

    if not isinstance(model, IterationModel):
        raise TypeError(f"model must be an IterationModel; got {type(model).__name__}")
    context = check("context", context)
    headroom = check("headroom", headroom)
    return float(headroom * model.decode_step(1, context))

