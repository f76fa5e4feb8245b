"""Predicted against measured: the continuous engine replaying real serving
runs, request by request, on the shipped profiles.

A measured run (:class:`ServingRun`) is a real server's benchmark: every
request's arrival time and prompt and output lengths, the engine's settings,
and what was measured (mean time to first token, mean time per output token,
mean end-to-end latency; quantiles where the source records requests one by
one).  :func:`predict` replays it on :class:`~mbbatch.ContinuousBatching`
with the run's settings (``max_num_seqs``, ``max_batched_tokens``, chunked
prefill, 16-token blocks) timed by the profile of its hardware, framework,
model and tensor parallelism (:mod:`mbbatch.profiles`), and returns the same
metrics.

A profile measures the forward pass of one batch at a time, not what a
server pays around it, and LLM-Inference-Bench's batches (prompt = output)
leave its prefill rate unidentified (``prefill_per_token`` held at 0 for
many profiles).  :func:`calibrate` fits what the profile cannot give, by
least squares on the relative errors of the replayed runs' mean time to
first token and time per output token (``scipy.optimize.least_squares``):
the engine's ``iteration_overhead`` and ``request_overhead``
(:class:`~mbbatch.ContinuousBatching`) and the profile's
``prefill_per_token``.  :func:`run` reports every run predicted by a
calibration that did not see it: the runs of one deployment (the replicas
of a data-parallel layout replay one trace together) are left out together,
the others calibrate, and the left-out runs are predicted (leave one
deployment out).  Runs without a shipped profile are fitted from their own
group's runs (:func:`mbbatch.serving.fit`, as a user fits their own
engine: :func:`mbbatch.profiles.from_serving`) and predicted as that fit
holds them out.  The errors it reports are those held-out errors;
``mbbatch validate`` prints them and the median per metric.

The measured runs are not shipped with mbbatch: they are read from the
``serving`` folder of the data directory (``$MBBATCH_DATA``, the argument
``data``), as the public sources' CSVs (see the folder's README for each
column's meaning and the sources' traps).  Used here:

- APEX's vLLM 0.6.0 runs (Lin, Kwon, Pineda and Nina Paravecino, 2024,
  "APEX: an extensible and dynamism-aware simulator for automated parallel
  execution in LLM serving", arXiv:2411.17651; MIT): Llama-3.1-70B in bf16
  and Mistral-Large-2407 in fp8 on H100-SXM GPUs, Poisson arrivals at 0.125
  to 0.5 requests/s of chat (lmsys), creation and summarization traces, one
  server or several data-parallel replicas; means only, per run.  Those of
  Llama at tensor parallelism 4 have a shipped profile
  (``H100/vLLM/Meta-Llama-3-70B/tp4``: Llama-3 and Llama-3.1 70B share
  their architecture); the others (tp 2 and 8, Mistral-Large) are fitted
  from their own group's runs, leaving one deployment out.
- LLMServingSim's vLLM 0.19 runs (Cho et al., 2026, "LLMServingSim 2.0",
  ISPASS; MIT): RTX 4090 and RTX PRO 6000 GPUs, 300 ShareGPT requests at
  10 requests/s (overloaded by design), every request's times recorded;
  no shipped profile: each fitted from the earlier half of its requests and
  judged on the later half.  The mixture-of-experts run's two
  data-parallel engines are replayed as two replicas taking the requests in
  turn (the engine of each request is not recorded).

Not modelled (each a reason a prediction may miss): the server's KV
capacity where the source does not record it (APEX's runs never fill it;
LLMServingSim's RTX 4090 run records it and is replayed with it),
the CUDA-graph batch sizes' steps in a decode iteration's time, sampling
with a temperature, preemption's swap, prefix caching (off in APEX's runs),
network time (the metrics are the server's own), vLLM 0.19's prefix cache
(on in LLMServingSim's runs: at most 7.9 % of their prompt tokens could
have hit it) and its data-parallel load balancer (round robin here).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .serving import METRICS, ServingRun, replay, summarize

__all__ = ["ServingRun", "ServingDataNotFound", "serving_runs", "predict", "calibrate", "Calibration", "run",
           "Report", "METRICS", "METHODS", "TERMS", "DATA_ENV"]

#: the environment variable naming the data directory (its ``serving`` folder holds the runs)
DATA_ENV = "MBBATCH_DATA"
#: what :func:`calibrate` may fit: the engine's overheads and the profile's prefill rate
TERMS = ("iteration_overhead", "request_overhead", "prefill_per_token", "prefill_attention")
#: how a run is predicted: a shipped profile calibrated, or a fit from its group's own serving runs
METHODS = {"profile": "a shipped profile, calibrated (leave one deployment out)",
           "from_serving": "fitted from the group's own serving runs (mbbatch.serving.fit)"}
#: the profiles of the measured runs' hardware, framework, model and tensor parallelism
_PROFILES = {("H100-SXM-80GB", "meta-llama/Llama-3.1-70B-Instruct", 4): "H100/vLLM/Meta-Llama-3-70B/tp4",
             ("H100-SXM-80GB", "meta-llama/Meta-Llama-3.1-70B", 4): "H100/vLLM/Meta-Llama-3-70B/tp4"}


class ServingDataNotFound(FileNotFoundError):
    """The measured serving runs are not where they were looked for."""


def _folder(data) -> Path:
    base = data if data not in (None, "") else (os.environ.get(DATA_ENV) or None)
    if base is None:
        raise ServingDataNotFound(f"the measured serving runs are read from the data directory's serving/ folder: "
                                  f"give data=... (mbbatch validate --data DIR) or set {DATA_ENV}")
    base = Path(base)
    folder = base / "serving" if (base / "serving").is_dir() else base
    if not (folder / "apex_plus_vllm_runs.csv").is_file():
        raise ServingDataNotFound(f"{folder} holds no measured serving runs (apex_plus_vllm_runs.csv and the "
                                  "others of the serving data's README)")
    return folder


def _read(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def serving_runs(data=None) -> list:
    """The measured serving runs of the data directory (``data``, else
    ``$MBBATCH_DATA``): APEX's vLLM 0.6 runs (each server's, the
    single-server deployments included) and LLMServingSim's vLLM 0.19 runs,
    in the sources' order.  Runs whose result file is empty are left out."""
    folder = _folder(data)
    requests = {}
    for r in _read(folder / "apex_plus_vllm_requests.csv"):
        requests.setdefault(r["run_id"], []).append((float(r["arrival_s"]), float(r["prompt_tokens"]),
                                                     float(r["output_tokens"])))
    runs = []
    for r in _read(folder / "apex_plus_vllm_runs.csv"):
        if not r["status"].startswith("ok") or not (r["scope"] == "instance" or r["dp"] == "1"):
            continue
        a = np.array(sorted(requests[r["run_id"]], key=lambda x: x[0]))
        tp = int(r["tp"])
        name = r["run_id"]
        runs.append(ServingRun(
            name=name, deployment=name.rsplit("_", 1)[0] if r["scope"] == "instance" and r["dp"] != "1" else name,
            source="APEX (arXiv:2411.17651)", engine=f"vLLM {r['vllm_version']}", hardware=r["gpu"],
            model=r["model"], tp=tp, profile=_PROFILES.get((r["gpu"], r["model"], tp)) if r["quantization"] == ""
            else None,
            settings=dict(max_num_seqs=int(r["max_num_seqs"]), max_batched_tokens=int(r["max_num_batched_tokens"]),
                          chunked_prefill=r["chunked_prefill"] == "true", block_size=16),
            arrival=a[:, 0] - a[0, 0], prompt=a[:, 1], output=a[:, 2],
            measured={"ttft_mean": float(r["ttft_mean_s"]), "tpot_mean": float(r["itl_mean_s"]),
                      "e2e_mean": float(r["e2e_mean_s"])},
            # (the Llama-3.1-70B base and Instruct checkpoints time alike; fp8 weights and caches do not)
            group=f"vLLM {r['vllm_version']}|{r['gpu']}|{r['model'].split('/')[0]}-"
                  f"{r['weight_dtype']}-{r['quantization'] or 'none'}-kv-{r['kv_cache_dtype']}|tp{tp}"))
    rows = {}
    for r in _read(folder / "llmservingsim_vllm_requests.csv"):
        rows.setdefault(r["run_id"], []).append(r)
    for r in _read(folder / "llmservingsim_vllm_runs.csv"):
        req = rows[r["run_id"]]
        col = {k: np.array([float(x[k]) for x in req]) for k in ("arrival_s", "prompt_tokens", "output_tokens",
                                                                  "ttft_s", "latency_s")}
        settings = dict(max_num_seqs=int(r["max_num_seqs"]), max_batched_tokens=int(r["max_num_batched_tokens"]),
                        chunked_prefill=True, block_size=int(r["block_size_tokens"] or 16))
        if r["kv_cache_tokens"]:
            # (the KV capacity vLLM reported; the runs without it were far from filling 96 GB)
            settings["kv_tokens"] = float(r["kv_cache_tokens"])
        dp = int(r["dp"] or 1)
        runs.append(ServingRun.from_requests(
            r["run_id"], col["arrival_s"], col["prompt_tokens"], col["output_tokens"], col["ttft_s"],
            col["latency_s"], settings=settings, source="LLMServingSim (ISPASS 2026)",
            engine=f"vLLM {r['vllm_version']}", hardware=r["hardware"], model=r["model"], tp=int(r["tp"] or 1),
            dp=dp))
    return runs


def _model(run: ServingRun, params: dict):
    from . import profiles

    model = profiles.get(run.profile)
    return replace(model, **{k: params[k] for k in ("prefill_per_token", "prefill_attention") if k in params})


def predict(run: ServingRun, params: dict | None = None) -> dict:
    """The metrics (:data:`METRICS`) of ``run`` replayed on its profile and
    settings, with ``params`` (any of :data:`TERMS`; default 0 overheads,
    the profile's own prefill rate): each request at its measured arrival
    with its measured lengths."""
    if run.profile is None:
        raise ValueError(f"run {run.name} has no shipped profile ({run.hardware}, {run.model}, tp {run.tp}): it "
                         "cannot be predicted")
    params = dict(params or {})
    bad = sorted(set(params) - set(TERMS))
    if bad:
        raise ValueError(f"params: {', '.join(bad)} not among the terms calibrated ({', '.join(TERMS)})")
    for k, v in params.items():
        if not (math.isfinite(v) and v >= 0.0):
            raise ValueError(f"params: {k} must be finite and >= 0; got {v!r}")
    ttft, lat = replay(run, _model(run, params), request_overhead=params.get("request_overhead", 0.0),
                       iteration_overhead=params.get("iteration_overhead", 0.0))
    return summarize(run.arrival, run.output, ttft, lat)


#: the metrics a calibration fits (the end-to-end latency follows from them)
_FITTED = ("ttft_mean", "tpot_mean")
#: the terms' scales (s, s, s/token): the solver's steps are relative to them
_SCALES = {"iteration_overhead": 1e-3, "request_overhead": 1e-2, "prefill_per_token": 1e-5,
           "prefill_attention": 1e-9}
#: the solver's starts, in units of the scales
_STARTS = (0.3, 3.0)


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` fitted: ``params`` (the terms' values), on
    ``runs`` (their names), with the fit's relative ``errors`` in sample (per
    run and metric) and the solver's ``cost``."""

    params: dict
    runs: tuple
    errors: dict = field(repr=False)
    cost: float = math.nan


def calibrate(runs, terms=TERMS, *, start: dict | None = None) -> Calibration:
    """Fit ``terms`` (of :data:`TERMS`) to ``runs`` (:class:`ServingRun`,
    each with a profile): least squares of the relative errors of their
    replayed mean time to first token and time per output token, each term
    >= 0 (``scipy.optimize.least_squares``, trust-region reflective).  The
    runs are replayed at each step: a calibration on a dozen runs of a few
    hundred requests takes seconds.  ``start``: the terms' values to start
    from (e.g. an earlier calibration's), else the best of two starts an
    order of magnitude apart."""
    from scipy.optimize import least_squares

    runs = list(runs)
    terms = tuple(terms)
    if not runs:
        raise ValueError("calibrate needs at least one measured run with a profile")
    bad = [t for t in terms if t not in TERMS]
    if bad or not terms or len(set(terms)) != len(terms):
        raise ValueError(f"terms must be distinct names among {', '.join(TERMS)}; got {terms!r}")
    if 2 * len(runs) <= len(terms):
        raise ValueError(f"calibrate fits {len(terms)} terms to 2 measured means a run: it needs more than "
                         f"{len(terms) // 2} runs; got {len(runs)}")
    missing = [r.name for r in runs if r.profile is None]
    if missing:
        raise ValueError(f"runs without a shipped profile cannot be calibrated on: {', '.join(missing)}")
    scale = np.array([_SCALES[t] for t in terms])

    def residuals(x):
        params = dict(zip(terms, np.maximum(x, 0.0) * scale))
        out = []
        for r in runs:
            p = predict(r, params)
            out.extend(p[m] / r.measured[m] - 1.0 for m in _FITTED)
        return np.array(out)

    # (a replayed run's times move in steps as its iterations regroup: finite differences of 5 %, and the best
    # of several starts, one per order of magnitude of each term)
    starts = ([np.array([start[t] for t in terms]) / scale] if start is not None
              else [np.full(len(terms), x) for x in _STARTS])
    fit = None
    for x0 in starts:
        f = least_squares(residuals, np.maximum(x0, 1e-6), bounds=(0.0, np.inf), diff_step=0.05, max_nfev=100)
        if fit is None or f.cost < fit.cost:
            fit = f
    params = {t: float(v) for t, v in zip(terms, fit.x * scale)}
    errors = {r.name: {m: e for m, e in zip(_FITTED, fit.fun[2 * i:2 * i + 2])} for i, r in enumerate(runs)}
    return Calibration(params=params, runs=tuple(r.name for r in runs), errors=errors, cost=float(fit.cost))


@dataclass(frozen=True)
class Report:
    """:func:`run`'s result: one row per run and metric.

    Attributes
    ----------
    rows : list of dict
        ``run``, ``deployment``, ``profile``, ``method`` (``"profile"``: the
        shipped profile, calibrated; ``"from_serving"``: fitted from the
        group's own runs), ``metric``, ``measured``,
        ``predicted`` (held out), ``error`` (relative, predicted / measured -
        1), ``profile_alone`` (the profile alone's prediction: no overheads,
        its own prefill rate) and ``uncalibrated`` (its relative error: what
        the calibration buys).
    calibrations : dict
        Each deployment's held-out calibration (fitted without it).
    calibration : Calibration or None
        The calibration on every run with a profile (what a user takes for
        a new run); None without such runs.
    skipped : list of str
        The runs not predicted, each with the reason.
    fits : dict
        The fits from serving runs (:class:`~mbbatch.serving.ServingFit`)
        of the runs without a profile, by group.
    """

    rows: list
    calibrations: dict
    calibration: Calibration | None
    skipped: list
    fits: dict = field(default_factory=dict)

    @property
    def metrics(self) -> list:
        """The metrics the rows compare (of :data:`METRICS`, those measured)."""
        return [m for m in METRICS if any(r["metric"] == m for r in self.rows)]

    def median_error(self, metric: str | None = None, *, method: str | None = None,
                     uncalibrated: bool = False) -> float:
        """Median |relative error| over the runs, of ``metric`` (None: every
        metric together), of the rows of ``method`` (``"profile"``,
        ``"from_serving"``; None: every row); ``uncalibrated``: the profile
        alone's (the ``"profile"`` rows')."""
        if method not in (None, *METHODS):
            raise ValueError(f"method must be None or one of {', '.join(map(repr, METHODS))}; got {method!r}")
        key = "uncalibrated" if uncalibrated else "error"
        e = [abs(r[key]) for r in self.rows if (metric is None or r["metric"] == metric)
             and (method is None or r["method"] == method) and math.isfinite(r[key])]
        return float(np.median(e)) if e else math.nan

    def to_dataset(self):
        """The rows as an xarray Dataset (dims ``run``, ``metric``):
        ``measured``, ``predicted`` (held out), ``profile_alone``, in s
        (NaN where a run did not measure a metric, or has no profile), and
        ``method`` by run; the median errors and the calibration on every
        run in its attributes."""
        import xarray as xr

        names = list(dict.fromkeys(r["run"] for r in self.rows))
        metrics = self.metrics
        at = {(r["run"], r["metric"]): r for r in self.rows}
        data = {v: (("run", "metric"), np.array([[at[n, m][v] if (n, m) in at else np.nan for m in metrics]
                                                  for n in names]),
                    {"units": "tokens/s, the throughput; s, the rest"})
                for v in ("measured", "predicted", "profile_alone")}
        method = {r["run"]: r["method"] for r in self.rows}
        data["method"] = (("run",), np.array([method[n] for n in names]))
        profiles = sorted({r["profile"] for r in self.rows if r["method"] == "profile"})
        attrs = {"runs": len(names), "profiles": ", ".join(profiles),
                 "holdout": "leave one deployment out (one run measured request by request: its later half)",
                 **{f"median_error_{m}": self.median_error(m) for m in metrics},
                 "median_error": self.median_error(),
                 **{f"median_error_{k}": self.median_error(method=k) for k in METHODS},
                 "median_error_uncalibrated": self.median_error(uncalibrated=True)}
        if self.calibration is not None:
            attrs.update({f"calibrated_{k}": v for k, v in self.calibration.params.items()})
        return xr.Dataset(data, coords={"run": names, "metric": metrics}, attrs=attrs)

    def table(self):
        """The rows as a :class:`~mbbatch.Table` (columns as :attr:`rows`' keys)."""
        from .results import Table

        keys = ("run", "deployment", "profile", "method", "metric", "measured", "predicted", "error",
                "profile_alone", "uncalibrated")
        return Table({k: np.array([r[k] for r in self.rows]) for k in keys})

    def __str__(self) -> str:
        lines = [f"{'run':40} {'method':12} {'metric':10} {'measured':>10} {'predicted':>10} {'error':>8} "
                 f"{'profile alone':>14}"]
        for r in self.rows:
            alone = f"{r['uncalibrated']:+14.1%}" if math.isfinite(r["uncalibrated"]) else f"{'-':>14}"
            lines.append(f"{r['run']:40} {r['method']:12} {r['metric']:10} {r['measured']:10.4g} "
                         f"{r['predicted']:10.4g} {r['error']:+8.1%} {alone}")
        lines.append("")
        for k in METHODS:
            if any(r["method"] == k for r in self.rows):
                got = [m for m in self.metrics if any(r["metric"] == m and r["method"] == k for r in self.rows)]
                lines.append(f"median |error| held out, {METHODS[k]}: " + ", ".join(
                    f"{m} {self.median_error(m, method=k):.1%}" for m in got)
                    + f"; all {self.median_error(method=k):.1%}")
        if self.calibration is not None:
            lines.append(f"the profile alone: all {self.median_error(uncalibrated=True):.1%}")
            lines.append("calibrated on every run with a profile: " + ", ".join(
                f"{k} = {v:.4g}" for k, v in self.calibration.params.items()))
        for g, fit in self.fits.items():
            lines.append(f"fitted from {len(fit.runs)} run(s) of {g} ({fit.holdout}): " + ", ".join(
                f"{k} = {v:.4g} ({fit.identification[k]})" for k, v in fit.params.items()))
        lines.append(f"median |error| held out, every row: {self.median_error():.1%}")
        lines.extend(f"not predicted: {s}" for s in self.skipped)
        return "\n".join(lines)


#: where a fit of runs without a profile starts (a start, not a prior): APEX's H100 runs from the 70B
#: profile, the others from the defaults
_FIT_START = {"H100-SXM-80GB": "H100/vLLM/Meta-Llama-3-70B/tp4"}


def run(data=None, *, runs=None, terms=TERMS, fitted: bool = True, progress=None) -> Report:
    """Every measured run predicted held out, beside its measurement.

    Runs with a shipped profile: predicted on it by a calibration of
    ``terms`` fitted on the other deployments' runs (leave one deployment
    out), beside the profile alone's prediction (method ``"profile"``).
    Runs without (``fitted``): each group of them (one engine, hardware,
    model, parallelism and weights) fitted from its own serving runs,
    :func:`mbbatch.serving.fit` (:func:`mbbatch.profiles.from_serving`),
    each run predicted held out as that fit gives (method
    ``"from_serving"``); a group it cannot fit is skipped, saying why.

    ``runs``: the runs (default :func:`serving_runs` of ``data``);
    ``progress``: a callable given a line as each fit starts (the command
    line prints them)."""
    from . import profiles, serving

    say = progress or (lambda line: None)
    runs = serving_runs(data) if runs is None else list(runs)
    usable = [r for r in runs if r.profile is not None]
    skipped = []
    deployments = list(dict.fromkeys(r.deployment for r in usable))
    rows, held, everything, fits = [], {}, None, {}
    if len(deployments) >= 2:
        everything = calibrate(usable, terms)
        for d in deployments:
            say(f"calibrating without {d} ...")
            # (started from the calibration on every run: a start, not what it converges to)
            cal = calibrate([r for r in usable if r.deployment != d], terms, start=everything.params)
            held[d] = cal
            for r in (r for r in usable if r.deployment == d):
                pred, alone = predict(r, cal.params), predict(r)
                for m in (m for m in METRICS if m in r.measured):
                    rows.append(dict(run=r.name, deployment=d, profile=r.profile, method="profile", metric=m,
                                     measured=r.measured[m], predicted=pred[m], error=pred[m] / r.measured[m] - 1.0,
                                     profile_alone=alone[m], uncalibrated=alone[m] / r.measured[m] - 1.0))
    else:
        skipped.extend(f"{r.name}: a calibration leaves one deployment out, and the runs with a profile form "
                       f"{len(deployments)}" for r in usable)
    groups = {}
    for r in runs:
        if r.profile is None:
            groups.setdefault(r.group, []).append(r)
    for g, members in groups.items():
        why = None if fitted else "no shipped profile (fitted=False)"
        if why is None:
            say(f"fitting {g} from its {len(members)} run(s) ...")
            try:
                start = _FIT_START.get(members[0].hardware)
                fit = serving.fit(members, base=None if start is None else profiles.get(start), progress=say)
            except ValueError as exc:
                why = f"no shipped profile, and a fit from its own runs is not possible: {exc}"
            else:
                if not fit.heldout:
                    why = f"no shipped profile, and its fit from its own runs has no held-out test ({fit.holdout})"
        if why is not None:
            skipped.extend(f"{r.name} ({r.engine}, {r.hardware}, {r.model}, tp {r.tp}): {why}" for r in members)
            continue
        fits[g] = fit
        for r in members:
            for m, (x, p) in fit.heldout_values[r.name].items():
                rows.append(dict(run=r.name, deployment=r.deployment, profile=fit.model.profile,
                                 method="from_serving", metric=m, measured=x, predicted=p, error=p / x - 1.0,
                                 profile_alone=math.nan, uncalibrated=math.nan))
    if not rows:
        raise ValueError("no measured run could be predicted held out: " + "; ".join(skipped[:3]))
    return Report(rows=rows, calibrations=held, calibration=everything, skipped=skipped, fits=fits)
