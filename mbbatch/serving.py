"""Serving runs: a real server's benchmark replayed request by request, and
an iteration model fitted to a user's own engine from its runs.

A :class:`ServingRun` is one benchmark run of a server: every request's
arrival time and prompt and output lengths, the engine's settings, and what
was measured, as means (:data:`METRICS`) and, where the benchmark records
requests one by one, every request's time to first token and end-to-end
latency.  :func:`read_vllm_bench` reads the file ``vllm bench serve
--save-result --save-detailed`` writes; :meth:`ServingRun.from_requests`
builds a run from arrays.  :func:`replay` runs its requests, at their
arrivals with their lengths, through :class:`~mbbatch.ContinuousBatching`
with its settings, timed by an :class:`~mbbatch.IterationModel`;
:func:`summarize` computes the metrics of measured and replayed requests
alike, so the two are compared on one definition.

:func:`fit` (also :func:`mbbatch.profiles.from_serving`) fits an iteration
model and a server's per-request overhead to serving runs: least squares on
the log ratio of the replayed runs' metrics to the measured ones
(``scipy.optimize.least_squares``, trust-region reflective, every term >=
0), from two starts: a shipped profile or the defaults, and those scaled
to the runs' measured time per output token (the lower cost kept).  It is how a researcher
on an engine release the shipped profiles did not measure gets a profile:
from one benchmark run, better from several at different loads.  Every fit
reports its **held-out** error: with runs of two or more deployments, each
is predicted by a fit on the others (leave one deployment out); with one,
its requests are split in two by arrival, the fit sees the metrics of the
earlier half (the whole run replayed) and is judged on the later half's,
which met a longer queue: a weaker test than another run, named so in the
result.

The per-iteration overhead outside the forward pass and the iteration's
fixed ``step`` are one term here (they are paid together, every
iteration): a fit's ``step`` includes the engine's overhead.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = ["ServingRun", "METRICS", "FIT_TERMS", "summarize", "replay", "read_vllm_bench", "fit", "ServingFit"]

#: the metrics of a run: name -> what it is (times in s, the throughput in tokens/s)
METRICS = {
    "ttft_mean": "mean time to first token, s (the server's: from its arrival)",
    "ttft_p50": "median time to first token, s",
    "ttft_p90": "90th percentile of the time to first token, s",
    "tpot_mean": "mean time per output token after the first, s (token-weighted: the sum of the requests' "
                 "times between tokens over their tokens after the first)",
    "tpot_p50": "median of the requests' time per output token after the first, s",
    "tpot_p90": "90th percentile of the requests' time per output token after the first, s",
    "e2e_mean": "mean end-to-end latency, s",
    "e2e_p50": "median end-to-end latency, s",
    "e2e_p90": "90th percentile of the end-to-end latency, s",
    "throughput": "output tokens per second, from the first arrival to the last completion, tokens/s",
}
#: the terms :func:`fit` may fit: the iteration model's (``IterationModel`` fields) and the server's
#: per-request overhead (``ContinuousBatching.request_overhead``)
FIT_TERMS = ("step", "per_sequence", "per_context_token", "prefill_per_token", "prefill_attention",
             "request_overhead")
#: the replay's resolution, a log ratio: the residuals' standard deviation is taken as at least this in the
#: standard errors (a replay's metrics move in steps as its iterations regroup, so a fit that looks exact
#: is one of many within this)
_RESOLUTION = 0.01
#: the solver's evaluations in a held-out fit, started from the fit on every run
_HELD_NFEV = 20
#: rounds of scaling the start to the runs' time per output token (:func:`_scaled_start`)
_START_ROUNDS = 3
#: the terms' scales (the solver's steps are relative to them) and where a term at 0 starts from
_SCALES = {"step": 1e-2, "per_sequence": 1e-4, "per_context_token": 1e-7, "prefill_per_token": 1e-4,
           "prefill_attention": 1e-9, "request_overhead": 1e-2}


@dataclass(frozen=True, eq=False)
class ServingRun:
    """One measured serving run: its requests, its engine and what was measured.

    Attributes
    ----------
    name : str
        The run's name (the source's run id).
    deployment : str
        The runs replaying one trace together (a data-parallel layout's
        replicas) share it; a fit leaves them out together.
    source, engine, hardware, model : str
        Where it comes from, the engine's release, the GPUs, the model.
    tp : int
        Tensor parallelism.
    profile : str or None
        The shipped profile that times it, or None.
    settings : dict
        The engine's settings as :class:`~mbbatch.ContinuousBatching` keywords.
    arrival, prompt, output : ndarray
        Each request's arrival (s, from the first, in arrival order), prompt
        and output tokens.
    measured : dict
        The measured metrics (of :data:`METRICS`, those the source gives).
    ttft, latency : ndarray or None
        Each request's measured time to first token and end-to-end latency,
        s, where the source records requests one by one.
    dp : int
        The data-parallel engines the requests are shared among, each a
        replica of ``settings`` taking every ``dp``-th request (round robin).
    group : str
        What a fit pools: runs of one group share hardware, model, tensor
        parallelism, weights and engine release (:func:`fit` refuses to pool
        runs of different groups).
    """

    name: str
    deployment: str
    source: str
    engine: str
    hardware: str
    model: str
    tp: int
    profile: str | None
    settings: dict
    arrival: np.ndarray = field(repr=False)
    prompt: np.ndarray = field(repr=False)
    output: np.ndarray = field(repr=False)
    measured: dict = field(default_factory=dict)
    ttft: np.ndarray | None = field(default=None, repr=False)
    latency: np.ndarray | None = field(default=None, repr=False)
    dp: int = 1
    group: str = ""

    def __post_init__(self):
        n = self.arrival.size
        for what in ("prompt", "output", "ttft", "latency"):
            v = getattr(self, what)
            if v is not None and v.shape != (n,):
                raise ValueError(f"ServingRun {self.name}: {what} has {v.size} values for {n} requests")
        if n == 0 or np.any(np.diff(self.arrival) < 0):
            raise ValueError(f"ServingRun {self.name}: arrival must be a non-empty sequence in time order")
        if np.any(self.prompt < 1) or np.any(self.output < 1):
            raise ValueError(f"ServingRun {self.name}: prompt and output must be >= 1 token per request")
        if not self.group:
            object.__setattr__(self, "group", f"{self.engine}|{self.hardware}|{self.model}|tp{self.tp}")

    @property
    def n(self) -> int:
        return int(self.arrival.size)

    @property
    def per_request(self) -> bool:
        """Whether every request's times were measured (not only the means)."""
        return self.ttft is not None and self.latency is not None

    @classmethod
    def from_requests(cls, name: str, arrival, prompt, output, ttft, latency, *, settings: dict | None = None,
                      deployment: str | None = None, source: str = "", engine: str = "", hardware: str = "",
                      model: str = "", tp: int = 1, dp: int = 1, profile: str | None = None, group: str = ""):
        """A run from per-request arrays (any order: sorted by arrival
        here): arrival times (s, any origin), prompt and output tokens,
        measured time to first token and end-to-end latency (s); its
        :data:`METRICS` computed from them (:func:`summarize`).
        ``settings``: the engine's, as :class:`~mbbatch.ContinuousBatching`
        keywords (default: its defaults)."""
        a = np.asarray(arrival, dtype=float)
        order = np.argsort(a, kind="stable")
        cols = {}
        for what, v in (("prompt", prompt), ("output", output), ("ttft", ttft), ("latency", latency)):
            v = np.asarray(v, dtype=float)
            if v.shape != a.shape:
                raise ValueError(f"from_requests: {what} has {v.size} values for {a.size} arrivals")
            if not np.all(np.isfinite(v)):
                raise ValueError(f"from_requests: {what} must be finite for every request")
            cols[what] = v[order]
        if not np.all(np.isfinite(a)):
            raise ValueError("from_requests: arrival must be finite for every request")
        a = a[order] - a[order][0] if a.size else a
        if np.any(cols["latency"] < cols["ttft"]) or np.any(cols["ttft"] < 0):
            raise ValueError("from_requests: every request needs 0 <= ttft <= latency")
        measured = summarize(a, cols["output"], cols["ttft"], cols["latency"])
        return cls(name=name, deployment=deployment or name, source=source, engine=engine, hardware=hardware,
                   model=model, tp=tp, profile=profile, settings=dict(settings or {}), arrival=a,
                   prompt=cols["prompt"], output=cols["output"], measured=measured, ttft=cols["ttft"],
                   latency=cols["latency"], dp=dp, group=group)


def summarize(arrival, output, ttft, latency, mask=None) -> dict:
    """:data:`METRICS` of requests (arrays in one order: arrival s, output
    tokens, time to first token and latency s), or of those where ``mask``
    (a boolean array) holds: then the throughput is theirs, their output
    tokens over the time from the first of them to arrive to the last to
    complete.  Quantiles interpolate linearly (numpy's default)."""
    arrival = np.asarray(arrival, dtype=float)
    out = np.asarray(output, dtype=float)
    ttft = np.asarray(ttft, dtype=float)
    lat = np.asarray(latency, dtype=float)
    if mask is not None:
        arrival, out, ttft, lat = arrival[mask], out[mask], ttft[mask], lat[mask]
    span = float(np.max(arrival + lat) - np.min(arrival))
    res = {"throughput": float(np.sum(out) / span) if span > 0 else math.nan}
    decode = lat - ttft
    steps = np.maximum(out - 1.0, 0.0)
    several = steps > 0
    tpot = decode[several] / steps[several]
    res.update(ttft_mean=float(np.mean(ttft)), ttft_p50=float(np.quantile(ttft, 0.5)),
               ttft_p90=float(np.quantile(ttft, 0.9)),
               tpot_mean=float(np.sum(decode[several]) / np.sum(steps)) if several.any() else math.nan,
               tpot_p50=float(np.quantile(tpot, 0.5)) if several.any() else math.nan,
               tpot_p90=float(np.quantile(tpot, 0.9)) if several.any() else math.nan,
               e2e_mean=float(np.mean(lat)), e2e_p50=float(np.quantile(lat, 0.5)),
               e2e_p90=float(np.quantile(lat, 0.9)))
    return {m: res[m] for m in METRICS if m in res}


def replay(run: ServingRun, model, *, request_overhead: float = 0.0, iteration_overhead: float = 0.0) -> tuple:
    """``run``'s requests replayed: each at its measured arrival with its
    measured lengths, on :class:`~mbbatch.ContinuousBatching` with the run's
    settings and the overheads, timed by ``model`` (an
    :class:`~mbbatch.IterationModel`); a run of ``dp`` replicas replays each
    replica's share (every ``dp``-th request) on its own engine.  Returns
    ``(ttft, latency)``, each request's, s, in the run's order."""
    from .arrivals import Replay
    from .policies.continuous import ContinuousBatching
    from .simulation import simulate
    from .workload import Workload

    engine = ContinuousBatching(**run.settings, iteration_overhead=iteration_overhead,
                                request_overhead=request_overhead)
    ttft = np.empty(run.n)
    lat = np.empty(run.n)
    for k in range(run.dp):
        share = slice(k, None, run.dp)
        arr = run.arrival[share]
        with warnings.catch_warnings():
            # (a replayed run ends where its requests do: its drain is part of what was measured)
            warnings.simplefilter("ignore")
            res = simulate(engine, Replay(arr - arr[0]), workload=Workload(prompt=run.prompt[share],
                                                                            output=run.output[share]),
                           service_model=model, n=arr.size, keep_requests=True, seed=0)
        ttft[share] = res.requests.ttft
        lat[share] = res.requests.latency
    return ttft, lat


def read_vllm_bench(path, *, settings: dict | None = None, name: str | None = None, hardware: str = "",
                    engine: str = "vLLM", tp: int = 1, dp: int = 1, deployment: str | None = None,
                    group: str = "") -> ServingRun:
    """A run from the JSON file ``vllm bench serve --save-result
    --save-detailed`` writes (vLLM's ``benchmarks/benchmark_serving.py``
    too): its ``start_times`` (when each request was sent), ``input_lens``,
    ``output_lens``, ``ttfts`` and ``itls`` (each request's gaps between
    tokens; its latency is its TTFT plus their sum).  Failed requests (an
    ``errors`` entry, or no output) are left out.  ``settings``: the
    server's engine settings as :class:`~mbbatch.ContinuousBatching`
    keywords (the file does not record them: e.g.
    ``mb.engines.vllm("v1").settings_dict()``); the model is the file's
    ``model_id``."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"read_vllm_bench: cannot read {path} as JSON: {e}") from None
    needed = ("start_times", "input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in needed if k not in doc]
    if missing:
        raise ValueError(f"read_vllm_bench: {path} has no {', '.join(missing)}: run the benchmark with "
                         "--save-result --save-detailed, which records every request")
    n = len(doc["ttfts"])
    errors = doc.get("errors") or [""] * n
    rows = [(float(s), float(p), float(o), float(t), float(t) + float(sum(itl or ())))
            for s, p, o, t, itl, e in zip(doc["start_times"], doc["input_lens"], doc["output_lens"], doc["ttfts"],
                                           doc["itls"], errors if len(errors) == n else [""] * n)
            if not e and o and o > 0 and t is not None]
    if not rows:
        raise ValueError(f"read_vllm_bench: {path} records no successful request")
    a = np.array(rows)
    return ServingRun.from_requests(name or path.stem, a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4],
                                    settings=settings, deployment=deployment, source=str(path.name),
                                    engine=engine, hardware=hardware, model=str(doc.get("model_id", "")), tp=tp,
                                    dp=dp, group=group)


@dataclass(frozen=True)
class ServingFit:
    """What :func:`fit` fitted, and how well it predicts runs it did not see.

    Attributes
    ----------
    model : IterationModel
        The fitted iteration model (its ``profile`` names the runs' group).
    overheads : dict
        The server's overheads, :class:`~mbbatch.ContinuousBatching`
        keywords: ``request_overhead`` as fitted, ``iteration_overhead`` 0
        (in the model's ``step``).
    params : dict
        The fitted terms' values.
    identification : dict
        Each fitted term: ``"identified"``, ``"weak (SE x %)"`` (its
        standard error over half its value), or ``"at bound (0)"``.
    stderr : dict
        Each fitted term's standard error (from the Jacobian at the fit,
        the residuals' variance), in its unit.
    runs : tuple of str
        The runs fitted.
    errors : dict
        Each run's relative errors in sample (predicted / measured - 1), by metric.
    heldout_values : dict
        Each run's held-out ``(measured, predicted)`` by metric (with one
        run, its later half's); :attr:`heldout` their relative errors.
    holdout : str
        How the held-out errors were obtained.
    """

    model: object
    overheads: dict
    params: dict
    identification: dict
    stderr: dict
    runs: tuple
    errors: dict = field(repr=False)
    heldout_values: dict = field(repr=False)
    holdout: str = ""

    @property
    def heldout(self) -> dict:
        """Each run's relative errors held out (predicted / measured - 1), by metric."""
        return {r: {m: p / x - 1.0 for m, (x, p) in e.items()} for r, e in self.heldout_values.items()}

    def median_heldout(self, metric: str | None = None) -> float:
        """Median |relative error| held out, of ``metric`` (None: every metric of every run)."""
        e = [abs(v) for errs in self.heldout.values() for m, v in errs.items()
             if (metric is None or m == metric) and math.isfinite(v)]
        return float(np.median(e)) if e else math.nan

    def engine(self, **settings):
        """A :class:`~mbbatch.ContinuousBatching` with ``settings`` and the fitted overheads."""
        from .policies.continuous import ContinuousBatching

        return ContinuousBatching(**settings, **self.overheads)

    def __str__(self) -> str:
        lines = [f"fitted on {len(self.runs)} run(s) of {self.model.profile}:"]
        for t, v in self.params.items():
            lines.append(f"  {t:18} {v:.4g} +- {self.stderr[t]:.2g}  ({self.identification[t]})")
        lines.append(f"held out ({self.holdout}): median |error| {self.median_heldout():.1%}")
        for r, errs in self.heldout.items():
            lines.append(f"  {r}: " + ", ".join(f"{m} {e:+.1%}" for m, e in errs.items()))
        return "\n".join(lines)


def _check_runs(runs) -> list:
    runs = list(runs) if not isinstance(runs, ServingRun) else [runs]
    if not runs:
        raise ValueError("fit needs at least one serving run")
    bad = [type(r).__name__ for r in runs if not isinstance(r, ServingRun)]
    if bad:
        raise TypeError(f"runs must be ServingRun objects (read_vllm_bench, ServingRun.from_requests, "
                        f"mbbatch.validation.serving_runs); got {bad[0]}")
    groups = sorted({r.group for r in runs})
    if len(groups) > 1:
        raise ValueError(f"runs must be of one engine, hardware, model and parallelism (one profile); got "
                         f"{len(groups)} groups: {', '.join(groups[:3])}")
    return runs


def _base(base):
    from .service_models.iteration import IterationModel

    if base is None:
        return IterationModel()
    if not isinstance(base, IterationModel):
        raise TypeError(f"base must be an IterationModel or None (a profile's name: "
                        f"mbbatch.profiles.from_serving); got {type(base).__name__}")
    return base


def _apply(base, terms, values) -> tuple:
    params = dict(zip(terms, values))
    over = params.pop("request_overhead", 0.0)
    return replace(base, **params), over


class _Residuals:
    """The log ratios of predicted to measured metrics over runs (``masks``:
    per run, the requests whose metrics count, None for the run's own)."""

    def __init__(self, base, terms, runs, masks, targets):
        self.base, self.terms, self.runs, self.masks, self.targets = base, terms, runs, masks, targets

    def predictions(self, values) -> list:
        model, over = _apply(self.base, self.terms, values)
        out = []
        for r, mask in zip(self.runs, self.masks):
            ttft, lat = replay(r, model, request_overhead=over)
            out.append(summarize(r.arrival, r.output, ttft, lat, mask))
        return out

    def __call__(self, values) -> np.ndarray:
        res = []
        for pred, target in zip(self.predictions(values), self.targets):
            res.extend(math.log(max(pred[m], 1e-12) / target[m]) for m in target)
        return np.array(res)


def _targets(run: ServingRun, mask) -> dict:
    got = run.measured if mask is None else summarize(run.arrival, run.output, run.ttft, run.latency, mask)
    return {m: v for m, v in got.items() if math.isfinite(v) and v > 0}


def _scaled_start(base, terms, runs) -> dict:
    """Where a fit starts: ``base``'s values of the engine's ``terms``
    scaled by one factor, so that the replayed runs' mean time per output
    token meets the measured one (the geometric mean of their ratios over
    the runs, :data:`_START_ROUNDS` rounds); ``request_overhead`` at 0.
    The replay's objective is rough (its times move in steps), and a start
    far below the engine's speed can stop where a per-request overhead is
    explained by a prefill rate instead: from one matched in speed, the
    fit recovers the engine that wrote the runs (``tests/test_serving.py``);
    :func:`fit` runs from both and keeps the better."""
    engine = [t for t in terms if t != "request_overhead"]
    replayed = _Residuals(base, engine, runs, [None] * len(runs), None)
    factor = 1.0
    for _ in range(_START_ROUNDS if engine else 0):
        ratios = []
        for r, got in zip(runs, replayed.predictions([getattr(base, t) * factor for t in engine])):
            pred = got["tpot_mean"]
            if r.measured.get("tpot_mean", math.nan) > 0 and pred > 0:
                ratios.append(math.log(r.measured["tpot_mean"] / pred))
        if not ratios:
            break
        factor *= math.exp(sum(ratios) / len(ratios))
    return {t: getattr(base, t) * factor if t != "request_overhead" else 0.0 for t in terms}


def _solve(base, terms, runs, masks, start=None, max_nfev=60):
    from scipy.optimize import least_squares

    targets = [_targets(r, m) for r, m in zip(runs, masks)]
    count = sum(len(t) for t in targets)
    if count <= len(terms):
        raise ValueError(f"fit fits {len(terms)} terms: it needs more measured metrics than that; the runs give "
                         f"{count} ({len(runs)} run(s); a run with every request's times gives {len(METRICS)}, "
                         "one with its means only 3)")
    scale = np.array([_SCALES[t] for t in terms])
    f = _Residuals(base, terms, runs, masks, targets)
    x0 = np.array([start[t] if start is not None else (getattr(base, t) if t != "request_overhead" else 0.0)
                   for t in terms]) / scale
    x0 = np.where(x0 > 1e-3, x0, 1.0)
    # (a replayed run's times move in steps as its iterations regroup: finite differences of 5 %)
    sol = least_squares(lambda x: f(x * scale), x0, bounds=(0.0, np.inf), diff_step=0.05, max_nfev=max_nfev)
    values = sol.x * scale
    # standard errors from the Jacobian at the fit, the residuals' variance (dof: residuals - terms)
    J = sol.jac / scale
    dof = max(sol.fun.size - len(terms), 1)
    s2 = max(float(sol.fun @ sol.fun) / dof, _RESOLUTION ** 2)
    try:
        cov = np.linalg.pinv(J.T @ J) * s2
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    except np.linalg.LinAlgError:  # pragma: no cover
        se = np.full(len(terms), math.inf)
    return values, se, f, sol


def _label(v, se, scale) -> str:
    if v <= 1e-6 * scale:
        return "at bound (0)"
    if not math.isfinite(se) or se > 0.5 * v:
        return f"weak (SE {se / v:.0%})" if math.isfinite(se) else "weak (SE unbounded)"
    return "identified"


def fit(runs, *, base=None, terms=FIT_TERMS, holdout: bool = True, progress=None) -> ServingFit:
    """Fit ``terms`` (of :data:`FIT_TERMS`) to ``runs`` (:class:`ServingRun`
    of one group): least squares on the log ratios of their replayed
    metrics to the measured ones (every metric each run measured), each term
    >= 0, the others at ``base``'s values (an :class:`~mbbatch.IterationModel`,
    or None: the defaults).  The solver runs from two starts, ``base``'s
    values of the terms fitted and those scaled by one factor to the runs'
    measured time per output token (:func:`_scaled_start`; a
    term at 0, as ``request_overhead`` is in both, from its scale,
    ``_SCALES``), and keeps the fit of the lower cost.

    ``holdout``: also the held-out errors (leave one deployment out with
    two or more; else, with one run measured request by request, the later
    half of its requests predicted by a fit on the earlier half's metrics).
    ``progress``: a callable given a line at each fit.  A fit replays every
    run at each of its solver's steps: seconds for a few runs of hundreds
    of requests."""
    runs = _check_runs(runs)
    base = _base(base)
    terms = tuple(terms)
    bad = [t for t in terms if t not in FIT_TERMS]
    if bad or not terms or len(set(terms)) != len(terms):
        raise ValueError(f"terms must be distinct names among {', '.join(FIT_TERMS)}; got {terms!r}")
    say = progress or (lambda line: None)
    say(f"fitting {', '.join(terms)} on {len(runs)} run(s)")
    # (from two starts, the base's values and those scaled to the runs' speed, the lower cost kept: the
    # replay's objective is rough, and either start can stop short of the other's fit)
    fits = [_solve(base, terms, runs, [None] * len(runs), start=s) for s in (None, _scaled_start(base, terms, runs))]
    values, se, f, _ = min(fits, key=lambda fit: fit[3].cost)
    start = dict(zip(terms, values))
    predicted = f.predictions(values)
    errors = {r.name: {m: predicted[i][m] / r.measured[m] - 1.0 for m in r.measured}
              for i, r in enumerate(runs)}
    heldout, how = {}, "not asked for"
    deployments = list(dict.fromkeys(r.deployment for r in runs))
    if holdout and len(deployments) >= 2:
        how = "leave one deployment out"
        jack = []
        try:
            for d in deployments:
                say(f"held out: {d}")
                seen = [r for r in runs if r.deployment != d]
                # (started from the fit on every run, a start, not what it converges to)
                v, *_ = _solve(base, terms, seen, [None] * len(seen), start=start, max_nfev=_HELD_NFEV)
                jack.append(v)
                out = [r for r in runs if r.deployment == d]
                for r, pred in zip(out, _Residuals(base, terms, out, [None] * len(out), None).predictions(v)):
                    heldout[r.name] = {m: (r.measured[m], pred[m]) for m in r.measured}
        except ValueError as exc:
            heldout, how, jack = {}, f"none possible: a fit without one deployment's runs: {exc}", []
        if len(jack) >= 2:
            # (the jackknife's standard errors over the fits without each deployment, where larger: the
            # Jacobian's assume smooth residuals, and a replay's move in steps, so terms that trade off
            # against each other look better fixed than they are)
            j = np.array(jack)
            se = np.maximum(se, np.sqrt((len(j) - 1) / len(j) * np.sum((j - j.mean(axis=0)) ** 2, axis=0)))
    elif holdout and len(runs) == 1 and runs[0].per_request:
        how = "one run: its later half of requests held out"
        r = runs[0]
        seen = np.arange(r.n) < r.n // 2
        say(f"held out: the later half of {r.name}'s requests")
        v, *_ = _solve(base, terms, [r], [seen], start=start, max_nfev=_HELD_NFEV)
        pred = _Residuals(base, terms, [r], [~seen], None).predictions(v)[0]
        heldout[r.name] = {m: (x, pred[m]) for m, x in _targets(r, ~seen).items()}
    elif holdout:
        how = "none possible: one deployment, measured by its means only"
    model, over = _apply(base, terms, values)
    model = replace(model, profile=f"serving:{runs[0].group}")
    scale = {t: _SCALES[t] for t in terms}
    return ServingFit(model=model, overheads=dict(request_overhead=float(over), iteration_overhead=0.0),
                      params={t: float(v) for t, v in zip(terms, values)},
                      identification={t: _label(v, s, scale[t]) for t, v, s in zip(terms, values, se)},
                      stderr={t: float(s) for t, s in zip(terms, se)}, runs=tuple(r.name for r in runs),
                      errors=errors, heldout_values=heldout, holdout=how)
