"""The ``simulate`` entry point, for every policy: check the call, derive the
random streams, run the policy's kernel, wrap the one result type.

The request model: requests arrive by an arrival process; each has a prompt
and an output length and a predicted output length (a :class:`Workload`);
a policy forms batches; a batch service model times them.  The multi-bin
paper's model is the case ``service=dist``: output lengths drawn from
``dist`` under the max-of-members model ``MaxModel(base=0, per_token=1)``,
so a request's service time is its length; it runs on the multi-bin kernel.
The batch-forming policies (static, dynamic, multi-bin dynamic) run on the
event kernel.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as _st

from . import stats
from ._kernels import common as _common
from ._kernels import controller as _c
from ._kernels import dynamic as _d
from ._kernels import laps as _l
from ._kernels import multibin as _k
from ._running import available_memory, check_clock, check_memory, format_bytes, interruptible, stop_flag
from ._seeding import (STREAM_ARRIVALS, STREAM_PREDICTION, STREAM_PRESAMPLE, STREAM_PROMPT, STREAM_SERVICE,
                       as_seed_sequence,
                       entropy_str, stream)
from ._validation import check_flag, check_servers, resolve_n
from .arrivals import Gamma, OnOff, PiecewisePoisson, Poisson, Replay, Saturated, TraceTiledWarning
from .lengths import RVS, as_service
from .policies import (LAPS, Cluster, DynamicBatching, MultiBin, MultiBinDynamic, MultiBinEngine, Programs, Sessions,
                       StaticBatching, token_kind)
from .predictors import BinConfusion, LogNormalError, Oracle, Predictions
from .results import SimulationResult, Table, UnstableWarning
from .service_models import CalibratedModel, DecodeModel, LinearModel, MaxModel, PrefillModel
from .workload import Workload

__all__ = ["simulate", "check_simulation", "plan", "BATCH_MEANS_GROUPS", "TIME_SERIES_ROWS"]

#: Number of contiguous groups (by arrival index) for the batch-means
#: confidence interval of the mean latency.
BATCH_MEANS_GROUPS = 32
#: Rows of the token-level policies' downsampled time series.
TIME_SERIES_ROWS = 512
#: The time-series columns besides ``time`` and ``queue``.
TS_COLUMNS = ("b_target", "b_low", "b_high", "tau_avg", "bin", "batch_size")


def simulate(policy, arrivals, service=None, n=None, servers=1, seed=None, keep_requests=False, *,
             workload=None, service_model=None, keep_batches=False, progress=False) -> SimulationResult:
    """Simulate a batching policy on one stream of requests.

    Requests arrive by ``arrivals``.  Their lengths come from ``workload``
    (prompt, output and predicted output lengths, tokens), or, as shorthand
    for the multi-bin paper's model, from ``service``: output lengths whose
    value is the service time, under ``MaxModel(base=0, per_token=1)``.  The
    policy forms batches, and ``service_model`` gives a batch's service time.

    - :class:`MultiBin` is Section 3 and Algorithm 1 of the multi-bin paper:
      an oracle assigns each request to the bin holding its true service time
      (``base + per_token * output length`` under :class:`MaxModel`); each
      bin forms batches of exactly ``batch_size`` requests in arrival order
      (or fewer after ``max_wait``); a batch is ready when its last request
      arrives and joins one central FIFO ordered by ready time; ``servers``
      identical servers take batches from that FIFO; a batch occupies a
      server for the maximum of its members' service times.  Requests still
      waiting in a partial batch when the arrivals end never complete: they
      are counted in ``excluded_partial`` and excluded from every metric.
      MultiBin takes ``service=`` or ``workload=`` with a :class:`MaxModel`.
    - :class:`StaticBatching`, :class:`DynamicBatching` and
      :class:`MultiBinDynamic` form a batch whenever a server is free and
      requests wait (the dynamic-batching specification's Algorithms 1-7);
      they take ``workload=`` and any service model (default
      :class:`DecodeModel`).

    Every argument is checked before anything runs, and a run whose memory
    cannot fit is refused, saying how much it would need.  Ctrl-C stops a
    long run within about a second (``KeyboardInterrupt``).  A run whose
    backlog grows through it has no steady state: ``res.unstable`` is then
    True, ``res.unstable_reason`` says why, and an :class:`UnstableWarning`
    is issued.

    Parameters
    ----------
    policy : MultiBin, StaticBatching, DynamicBatching or MultiBinDynamic
        The batching policy.
    arrivals : Poisson, Gamma, OnOff, PiecewisePoisson, Saturated or Replay
        The arrival process (rates in requests/s), for every policy; see
        :mod:`mbbatch.arrivals`.  A Replay of fewer times than ``n`` is
        repeated end to end, with a :class:`TraceTiledWarning`.
    service : scipy.stats frozen distribution or array_like, optional
        MultiBin: the paper's model, shorthand for output lengths drawn from
        ``service`` that are service times (``MaxModel(base=0,
        per_token=1)``, lengths not rounded): each request's service time, s.  Distributions drawn
        inside the kernel: uniform, expon, lognorm, gamma, weibull_min; an
        array replays the given values in order.
    n : int, optional
        Number of requests, in [1, 2**53].  Defaults to the length of the
        replayed arrays when one is given (replayed arrays must then have the
        same length); required otherwise.
    servers : int or math.inf
        Number of identical servers, >= 1; ``math.inf`` (MultiBin only)
        serves every batch the moment it is ready (Assumption 5.1).
    seed : None, int or numpy.random.SeedSequence
        Seeds the arrival, length and predictor streams through
        SeedSequence.  The same seed gives bit-identical results, and every
        policy sees the same arrivals and output lengths for one seed
        (common random numbers).  None draws fresh entropy, recorded in the
        result's ``config``.
    keep_requests : bool
        Also return per-request records (``res.requests``); memory O(n).
        Without it the kernels stream in memory independent of n.
    workload : Workload, optional
        The requests' lengths; give it or ``service``, not both.
    service_model : MaxModel, LinearModel, DecodeModel or CalibratedModel, optional
        The batch service model (with ``workload``).  Default
        :class:`DecodeModel` for the token-level policies; MultiBin takes
        MaxModel only (the max of its members' service times).
    keep_batches : bool
        Token-level policies: also return per-batch records
        (``res.batches``).
    progress : bool
        Show a progress bar of the requests arrived on stderr, once the run
        has taken a second (tqdm; shorter runs show nothing).

    Returns
    -------
    SimulationResult
        The one result type: the metrics of :data:`mbbatch.metrics.METRICS`
        that apply to the policy, as attributes.
    """
    progress = check_flag("progress", progress)
    plan = _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches)
    return plan.run(as_seed_sequence(seed), progress=progress)


def check_simulation(policy, arrivals, service=None, n=None, servers=1, keep_requests=False, *,
                     workload=None, service_model=None, keep_batches=False, progress=False) -> int:
    """Check a :func:`simulate` call without running it: raise the error the
    call would raise before simulating (bad arguments, memory that cannot
    fit); return the bytes of memory it would allocate."""
    check_flag("progress", progress)
    return _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                 keep_batches).memory


def plan(policy, arrivals, service=None, n=None, servers=1, keep_requests=False, *, workload=None,
         service_model=None, keep_batches=False):
    """A checked :func:`simulate` call, to run for many seeds:
    ``plan(...).run(seed_sequence)`` equals ``simulate(..., seed=seed_sequence)``
    without checking the arguments again (a sweep's replications)."""
    return _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches)


# --- checking a call -------------------------------------------------------------------------


def _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches):
    if not isinstance(policy, (MultiBin, StaticBatching, DynamicBatching, LAPS, Cluster)):
        raise TypeError("policy must be MultiBin, StaticBatching, DynamicBatching, MultiBinDynamic, LAPS or "
                        f"Cluster; got {type(policy).__name__}")
    for name, flag in (("keep_requests", keep_requests), ("keep_batches", keep_batches)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {flag!r}")
    if service is not None:
        if workload is not None or service_model is not None:
            raise TypeError("give service=... (the paper's model) or workload=... with service_model=..., "
                            "not both")
    elif workload is None:
        raise TypeError("service or workload must be given: service=<scipy.stats frozen distribution or "
                        "array> (service times), or workload=Workload(prompt=..., output=...)")
    elif not isinstance(workload, Workload):
        raise TypeError(f"workload must be a Workload; got {type(workload).__name__}")
    if isinstance(policy, LAPS):
        return _plan_laps(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                          keep_batches)
    if service_model is not None and not isinstance(service_model, (MaxModel, LinearModel, DecodeModel,
                                                                    CalibratedModel)):
        raise TypeError("service_model must be MaxModel, LinearModel, DecodeModel or CalibratedModel; "
                        f"got {type(service_model).__name__}")
    if isinstance(policy, MultiBin):
        return _plan_multibin(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                              keep_batches)
    if isinstance(policy, Cluster):
        return _plan_cluster(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                             keep_batches)
    return _plan_tokens(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                        keep_batches)


#: the arrival processes every policy takes
ARRIVALS = (Poisson, Gamma, OnOff, PiecewisePoisson, Saturated, Replay)


def _check_arrivals(arrivals) -> None:
    if not isinstance(arrivals, ARRIVALS):
        raise TypeError("arrivals must be " + ", ".join(a.__name__ for a in ARRIVALS[:-1]) + " or Replay; "
                        f"got {type(arrivals).__name__}")


def _replayed(arrivals, named_specs) -> list:
    out = [("arrivals.times", arrivals.times.size)] if isinstance(arrivals, Replay) else []
    return out + [(name, sp.values.size) for name, sp in named_specs if sp.kind == _common.SVC_REPLAY]


def _resolve_n(n, arrivals, named_specs, predictor=None) -> int:
    """``n`` checked, defaulting to the length of the replayed arrays (which
    must have one length).  A larger ``n`` repeats them end to end, with a
    :class:`TraceTiledWarning`."""
    replayed = _replayed(arrivals, named_specs)
    if isinstance(predictor, Predictions):
        if not replayed and n is not None and n > predictor.values.size:
            raise ValueError(f"predictor.values has {predictor.values.size} values; the n = {n} requests need "
                             "one each")
        replayed.append(("predictor.values", predictor.values.size))
    n = resolve_n(n, replayed, tile=True)
    if replayed and n > replayed[0][1]:
        size = replayed[0][1]
        if isinstance(arrivals, Replay):
            arrivals.last_time(n)                    # (refuses times that cannot be tiled)
        shift = (" (arrival times shifted by the trace's span plus one mean gap each time)"
                 if isinstance(arrivals, Replay) else "")
        warnings.warn(f"n = {n} exceeds the {size} replayed values of {', '.join(nm for nm, _ in replayed)}: "
                      f"they are repeated {-(-n // size)} times end to end{shift}", TraceTiledWarning, stacklevel=5)
    return n


def _rvs_memory(named_specs, n: int) -> dict:
    """check_memory's parts for the distributions drawn in Python before a run."""
    return {name: (8 * n, f"the {n} draws of {name}, made before the run ({spec.description['service']} "
                          "is not drawn in the kernels)")
            for name, spec in named_specs if spec.kind == RVS}


#: typical service times (s) whose latencies the latency histogram resolves.
#: Its buckets cover 2**-30 .. 2**50 s (HIST_MIN_EXP, HIST_MAX_EXP); a run's
#: latencies reach from a small share of its typical service time (its short
#: requests) to many times it (a queue under load), so that time must sit 10
#: octaves above the bottom and 20 below the top: about 1 us to 34 years.
SCALE_RANGE = (2.0 ** (_common.HIST_MIN_EXP + 10), 2.0 ** (_common.HIST_MAX_EXP - 20))


def _check_times(arrivals, n, scale: float, name: str) -> None:
    """Refuse a run whose typical service time ``scale`` (s, set by the
    parameter ``name``) lies outside :data:`SCALE_RANGE` (its latency
    quantiles would be read off the histogram's end buckets, wrong by orders
    of magnitude), or whose clock would be too coarse for its service times."""
    lo, hi = SCALE_RANGE
    if math.isfinite(scale) and scale > 0 and not lo <= scale <= hi:
        raise ValueError(f"{name}: service times of about {scale:.3g} s lie outside [{lo:.3g}, {hi:.3g}] s, the "
                         "range whose latencies the latency histogram resolves (its buckets cover 2**-30 to "
                         "2**50 s); express the times in other units")
    if isinstance(arrivals, Replay):
        check_clock(max(abs(float(arrivals.times[0])), abs(arrivals.last_time(n))), scale, "arrivals.times")
    elif isinstance(arrivals, (Poisson, Gamma, OnOff)):
        check_clock(n / arrivals.rate, scale, f"a mean rate of {arrivals.rate:g} requests/s and n = {n} arrivals")
    elif isinstance(arrivals, PiecewisePoisson):
        check_clock(arrivals.ends[-1] + n / min(arrivals.rates) if arrivals.ends else n / arrivals.rates[0],
                    scale, f"rates down to {min(arrivals.rates):g} requests/s and n = {n} arrivals")


def _arrival_fields(arrivals, n: int) -> tuple:
    """The kernels' (arrival kind, rate, replayed times, params, ends) of
    ``arrivals`` (see :func:`~mbbatch._kernels.common.draw_arrivals`)."""
    none, one, never = np.empty(0), np.ones(1), np.full(1, np.inf)
    if isinstance(arrivals, Poisson):
        return _common.ARR_POISSON, arrivals.rate, none, one, never
    if isinstance(arrivals, Gamma):
        return _common.ARR_GAMMA, arrivals.rate, none, np.array([arrivals.shape, arrivals.scale]), never
    if isinstance(arrivals, OnOff):
        return (_common.ARR_ONOFF, arrivals.rate, none,
                np.array([arrivals.rate_on, arrivals.rate_off, arrivals.mean_on, arrivals.mean_off]), never)
    if isinstance(arrivals, PiecewisePoisson):
        return (_common.ARR_PIECEWISE, arrivals.rates[0], none, np.array(arrivals.rates),
                np.array([*arrivals.ends, np.inf]))
    if isinstance(arrivals, Saturated):
        return _common.ARR_SATURATED, 0.0, none, one, never
    # (a run longer than the times repeats them in the kernel, each copy shifted by the period)
    period = arrivals._tiling(n)[1] if n > arrivals.times.size else 0.0
    return _common.ARR_REPLAY, 0.0, arrivals.times, np.array([period]), never


def _model_config(model) -> dict:
    return {"service_model": type(model).__name__, **{f"model_{k}": v for k, v in vars(model).items()}}


def _quantiles(hist, latency) -> np.ndarray:
    """Latency quantiles: exact from the per-request latencies when kept,
    else read from the kernel's histogram.  Both are the inverted CDF (the
    smallest latency with a share q of the requests at or below it), so the
    two differ by at most the histogram's half bucket."""
    if latency is not None:
        return np.quantile(latency[~np.isnan(latency)], stats.QUANTILES, method="inverted_cdf")
    return stats.hist_quantiles(hist, stats.QUANTILES, _common.HIST_BASE, _common.HIST_SHIFT)


def _finish(res: SimulationResult, warn: bool, stacklevel: int) -> SimulationResult:
    if warn and res.unstable:
        warnings.warn(f"no steady state: {res.unstable_reason}", UnstableWarning, stacklevel=stacklevel)
    return res


# --- the multi-bin kernel --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _MultiBinPlan:
    """A checked MultiBin run, ready to allocate and simulate."""

    policy: MultiBin
    arrivals: object
    spec: object            # the output lengths (service times under the shorthand)
    workload: Workload | None
    model: MaxModel
    edges: np.ndarray
    n: int
    servers: float
    keep: bool
    memory: int
    predictor: object

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss``; ``warn``: issue an :class:`UnstableWarning`
        for a run with no steady state (else only ``res.unstable`` says it);
        ``progress``: a progress bar on stderr (see :func:`simulate`)."""
        return _run_multibin(self, ss, warn, progress)

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and inputs (read-only: every run of
        the plan shares them)."""
        return _pack_multibin(self)

    @functools.cached_property
    def description(self) -> dict:
        """The run's configuration, but for its seed."""
        side = ({**self.workload.describe(), **_model_config(self.model)} if self.workload is not None
                else self.spec.description)
        return {**self.policy.describe(), **self.arrivals.describe(), **side,
                "n": self.n, "servers": "inf" if self.servers == math.inf else int(self.servers)}


def _plan_multibin(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                   keep_batches) -> _MultiBinPlan:
    if keep_batches:
        raise TypeError("keep_batches is for the token-level policies; MultiBin's batches are the bins' "
                        "(see res.batches_per_bin)")
    _check_arrivals(arrivals)
    if workload is not None:
        model = service_model if service_model is not None else MaxModel()
        if not isinstance(model, MaxModel):
            raise TypeError("MultiBin takes service_model=MaxModel(base, per_token) (a batch takes its "
                            f"longest member's time); got {type(model).__name__}")
        if workload.predictor_sigma != 0 and not isinstance(policy.predictor, Oracle):
            raise ValueError("MultiBin takes one predictor: workload.predictor_sigma (a LogNormalError) or "
                             f"MultiBin(predictor=...), not both; got predictor_sigma = "
                             f"{workload.predictor_sigma:g} and {policy.predictor}")
        spec = workload._output
        named = [("workload.prompt", workload._prompt), ("workload.output", spec)]
    else:
        model = MaxModel(base=0.0, per_token=1.0)
        spec = as_service(service)
        named = [("service", spec)]
    predictor = policy.predictor
    if workload is not None and workload.predictor_sigma != 0:
        predictor = LogNormalError(workload.predictor_sigma)
    n = _resolve_n(n, arrivals, named, predictor)
    servers = check_servers(servers)
    k, B = policy.bins, policy.batch_size
    S = min(B, n)
    parts = {
        "bins": (16 * k * S + 48 * k + 8 * (k + 1), "the bins' partial batches"),
        "servers": (0 if servers == math.inf else 8 * min(servers, n), "the servers' free times"),
        "batch_size": (16 * S, "one batch's latencies"),
        "n": (8 * _common.HIST_SIZE, "the latency histogram"),
    }
    if keep_requests:
        parts["keep_requests"] = (40 * n, "the per-request arrays (keep_requests)")
    parts.update(_rvs_memory(named, n))
    memory = check_memory(parts)
    _check_times(arrivals, n, model.base + model.per_token * spec.mean,
                 "service" if workload is None else "workload.output")

    integer = workload is not None and workload.integer_lengths
    if policy.edges is None:
        edges = spec.equal_mass_edges(k)
        if workload is not None:      # the lengths' edges, as service times
            edges = _service_times(model, integer, edges)
    else:
        edges = np.array(policy.edges, dtype=np.float64)
        lo, hi = _service_times(model, integer, np.array(spec.support, dtype=np.float64))
        if edges[0] > lo or edges[-1] < hi:
            raise ValueError(
                f"edges must cover the support of service [{lo:g}, {hi:g}]: "
                f"edges[0] <= {lo:g} and edges[-1] >= {hi:g}; got [{edges[0]:g}, {edges[-1]:g}]")
    return _MultiBinPlan(policy, arrivals, spec, workload, model, edges, n, servers, bool(keep_requests), memory,
                         predictor)


def _service_times(model: MaxModel, integer: bool, lengths: np.ndarray) -> np.ndarray:
    """Output lengths as the multi-bin kernel makes them service times:
    ``base + per_token * length``, the length first rounded up to whole
    tokens (at least 1) when ``integer``.  Monotone, so equal-mass edges of
    the lengths stay edges of the service times."""
    if integer:
        lengths = np.maximum(np.ceil(lengths), 1.0)
    return model.base + model.per_token * lengths


def _pack_multibin(plan: _MultiBinPlan) -> tuple:
    """The multi-bin kernel's configuration and inputs for ``plan``: ``(config, inputs)``."""
    akind, rate, times, aparams, aends = _arrival_fields(plan.arrivals, plan.n)
    integer = int(plan.workload is not None and plan.workload.integer_lengths)
    config = _k.CONFIG.pack(
        n=plan.n, arrival_kind=akind, rate=rate, service_kind=plan.spec.kernel_kind,
        batch_size=plan.policy.batch_size,
        # more servers than requests are never all busy: the kernel needs at most n (0: infinitely many)
        servers=0 if plan.servers == math.inf else int(min(plan.servers, plan.n)), max_wait=plan.policy.max_wait,
        keep=plan.keep, integer=integer, base=plan.model.base, per_token=plan.model.per_token,
        predictor=plan.predictor.code, predictor_param=plan.predictor.param)
    inputs = _k.INPUTS.pack(arrival_times=times, arrival_params=aparams, arrival_ends=aends,
                            service_params=plan.spec.params, service_values=plan.spec.values,
                            edges=plan.edges,
                            predictions=plan.predictor.values
                            if isinstance(plan.predictor, Predictions) else np.empty(0))
    return config, inputs


def _drawn(inputs, arrays, field: str, spec, gen, n: int):
    """``inputs`` with ``field`` holding the ``n`` draws of ``spec`` when it
    is a distribution drawn in Python (see :mod:`mbbatch.lengths`)."""
    if spec.kind != RVS:
        return inputs
    return arrays.pack(**{**inputs._asdict(), field: spec.draw(gen, n)})


def _run_multibin(plan: _MultiBinPlan, ss: np.random.SeedSequence, warn: bool, progress: bool) -> SimulationResult:
    config, inputs = plan.kernel_args
    arrival = stream(ss, STREAM_ARRIVALS)
    # (the prediction stream only where the predictor draws: a generator costs ~20 us)
    draws = isinstance(plan.predictor, (LogNormalError, BinConfusion))
    streams = _k.MultiBinStreams(arrival, stream(ss, STREAM_SERVICE),
                                 stream(ss, STREAM_PREDICTION) if draws else arrival)
    inputs = _drawn(inputs, _k.INPUTS, "service_values", plan.spec, streams.service, plan.n)
    args = (config, inputs, streams)
    stop = stop_flag()
    t0 = time.perf_counter()
    out, req = interruptible(lambda: _k.run(*args, stop, groups=BATCH_MEANS_GROUPS), stop,
                             plan.n if progress else None)
    kernel_seconds = time.perf_counter() - t0
    n, servers = plan.n, plan.servers
    st = _k.STATS.unpack((out.ints, out.floats))
    completed, n_batches = st["completed"], st["batches"]
    nan = math.nan
    if completed > 0:
        span = float(st["last_completion"] - st["first_arrival"])
        busy = float(st["busy"])
        throughput = completed / span if span > 0 else math.inf
        mean_latency = float(st["sum_latency"]) / completed
        mean_batch_service = busy / n_batches
        var = (float(st["busy_sq"]) - n_batches * mean_batch_service ** 2) / (n_batches - 1) \
            if n_batches > 1 else nan
        std_batch_service = math.sqrt(max(var, 0.0)) if n_batches > 1 else nan
        mean_fill = float(st["sum_fill_wait"]) / completed
        mean_queue = float(st["sum_queue_wait"]) / completed
        busy_servers = busy / span if span > 0 else nan
        util = busy_servers / servers if servers != math.inf else nan
        batch_mean = completed / n_batches
    else:
        span = throughput = mean_latency = mean_batch_service = std_batch_service = nan
        mean_fill = mean_queue = busy_servers = util = batch_mean = nan
    with np.errstate(invalid="ignore", divide="ignore"):
        g_lat = np.where(out.group_count > 0, out.group_latency / out.group_count, nan)
        g_wait = np.where(out.group_batches > 0, out.group_batch_wait / out.group_batches, nan)
    ci = stats.batch_means_ci(g_lat, mean_latency)
    requests = None
    if req is not None:
        requests = Table({**req, "latency": req["completion"] - req["arrival"]})
    q = _quantiles(out.hist, requests.latency if requests is not None and completed > 0 else None)
    if isinstance(plan.arrivals, Saturated):
        unstable, reason = False, "not assessed: every request arrives at time 0 (saturated)"
    elif isinstance(plan.arrivals, PiecewisePoisson):
        unstable, reason = False, "not assessed: a load step has no single steady state"
    else:
        unstable, reason = stats.backlog_verdict(g_wait, mean_batch_service)
    metrics = {
        "throughput": throughput, "mean_latency": mean_latency,
        "mean_latency_ci_low": ci[0], "mean_latency_ci_high": ci[1],
        "latency_p50": float(q[0]), "latency_p95": float(q[1]), "latency_p99": float(q[2]),
        "utilization": util, "mean_busy_servers": busy_servers,
        "mean_batch_service": mean_batch_service, "std_batch_service": std_batch_service,
        "mean_fill_wait": mean_fill, "mean_queue_wait": mean_queue,
        "batch_size_mean": batch_mean, "span": span, "completed": completed,
        "excluded_partial": st["excluded"], "n_batches": n_batches,
    }
    config = {**plan.description, "seed_entropy": entropy_str(ss)}
    res = SimulationResult(
        kind="multibin", config=config, n=n, servers=servers, edges=plan.edges, metrics=metrics,
        arrays={"batches_per_bin": out.batches_per_bin, "group_mean_latency": g_lat,
                "group_mean_batch_wait": g_wait, "latency_histogram": out.hist,
                **_per_bin(out.bin_completed, out.bin_latency, span)},
        requests=requests, unstable=unstable, unstable_reason=reason,
        latency_quantiles="exact" if requests is not None else "histogram, relative error <= 2**-11",
        kernel_seconds=kernel_seconds)
    return _finish(res, warn, stacklevel=5)


# --- the event kernel (token-level policies) -----------------------------------------------


@dataclass(frozen=True, eq=False)
class _TokenPlan:
    """A checked token-level run, ready to allocate and simulate."""

    policy: object
    arrivals: object
    workload: Workload
    model: object
    n: int
    servers: int
    keep_requests: bool
    keep_batches: bool
    memory: int
    predictor: object
    cluster: object = None
    #: the output lengths' distribution, for ``bin_edges="optimal"``: the workload's, or (LAPS's
    #: decode stage, whose workload replays lengths drawn from it) the one they were drawn from
    output_law: object = None

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss``; ``warn``: issue an :class:`UnstableWarning`
        for a run with no steady state (else only ``res.unstable`` says it);
        ``progress``: a progress bar on stderr (see :func:`simulate`)."""
        return _run_tokens(self, ss, warn, progress)

    @functools.cached_property
    def optimal_edges(self) -> tuple:
        """The edges of ``bin_edges="optimal"`` (computed once per plan)."""
        return _optimal_edges(self.policy, self.output_law)

    @functools.cached_property
    def engine_edges(self) -> tuple:
        """A MultiBin engine's bins (computed once per plan)."""
        return _engine_edges(self.policy, self.workload)

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and inputs (read-only: every run of
        the plan shares them)."""
        return _pack_tokens(self)


def _model_scale(model, workload) -> float:
    """Service time of a batch of one mean request, s: the clock's yardstick."""
    p, o = workload._prompt.mean, workload._output.mean
    if isinstance(model, MaxModel):
        return model.base + model.per_token * o
    if isinstance(model, LinearModel):
        return model.base + model.alpha * (p + o)
    if isinstance(model, CalibratedModel):
        return model.alpha + model.beta * (p + o)
    return model.prefill_per_token * p + model.beta * o


def _plan_tokens(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                 keep_batches, output_law=None) -> _TokenPlan:
    if service is not None:
        raise TypeError(f"{type(policy).__name__} takes workload=Workload(prompt=..., output=...) (and a "
                        "service_model), not service=: it forms batches by prompt and output lengths")
    if service_model is None:
        service_model = DecodeModel()
    _check_arrivals(arrivals)
    predictor = policy.predictor if isinstance(policy, (MultiBinDynamic, MultiBinEngine)) else Oracle()
    if not isinstance(predictor, Oracle) and workload.predictor_sigma != 0:
        name = "MultiBin" if isinstance(policy, MultiBinEngine) else "MultiBinDynamic"
        raise ValueError(f"{name} takes one predictor: workload.predictor_sigma (a LogNormalError) or "
                         f"{name}(predictor=...), not both; got predictor_sigma = "
                         f"{workload.predictor_sigma:g} and {predictor}")
    if workload.predictor_sigma != 0:
        predictor = LogNormalError(workload.predictor_sigma)
    output_law = workload._output.dist if output_law is None else output_law
    if isinstance(policy, MultiBinDynamic) and policy.bin_edges == "optimal" and output_law is None:
        raise ValueError("bin_edges=\"optimal\" needs the output lengths as a distribution (eq. (2) on it); "
                         f"got {workload._output.description['service']} values: use \"presample\" or \"warmup\"")
    n = _resolve_n(n, arrivals, [("workload.prompt", workload._prompt), ("workload.output", workload._output)],
                   predictor)
    servers = check_servers(servers)
    if servers == math.inf:
        raise ValueError("servers must be finite for the token-level policies; got inf")
    static = isinstance(policy, StaticBatching)
    K = policy.bins if isinstance(policy, (MultiBinDynamic, MultiBinEngine)) else 1
    b_max = policy.batch_size if static else policy.controller.b_max
    warm = policy.warmup if isinstance(policy, MultiBinDynamic) else 1
    c = min(servers, n)
    queue = _d.SLOT_BYTES * _d.QUEUE_START
    parts = {
        "bins": (K * (queue + 8 * (TIME_SERIES_ROWS + _c.CONTROLLER.size + _c.BATCH_STATS.size + 4)),
                 "the bins' queues"),
        "servers": (80 * c, "the servers' batches"),
        "warmup": (8 * min(warm, n), "the warm-up window"),
        ("batch_size" if static else "b_max"): (8 * (min(b_max, n) + 1), "the batch-size histogram"),
        "n": (8 * _common.HIST_SIZE, "the latency histogram"),
    }
    if isinstance(arrivals, Saturated):
        # every request is queued at time 0: the ring buffers grow to hold n (a power of two, at
        # least the start), the last doubling's old buffers beside the new (grow_bytes).  n sizes
        # that growth (the part to make smaller), so it is counted under n
        grown = _d.grow_bytes((1 << max(int(n - 1).bit_length(), _d.QUEUE_START.bit_length() - 1)) // 2)
        parts["n"] = (parts["n"][0] + K * (grown - queue),
                      "the queues of the n requests waiting at time 0 (saturated arrivals) and the latency "
                      "histogram")
    if keep_requests:
        parts["keep_requests"] = (72 * n, "the per-request arrays (keep_requests)")
    if keep_batches:
        parts["keep_batches"] = (64 * n, "the per-batch arrays (keep_batches)")
    parts.update(_rvs_memory([("workload.prompt", workload._prompt), ("workload.output", workload._output)], n))
    memory = check_memory(parts)
    _check_times(arrivals, n, _model_scale(service_model, workload), "workload")
    return _TokenPlan(policy, arrivals, workload, service_model, n, int(servers), bool(keep_requests),
                      bool(keep_batches), memory, predictor, output_law=output_law)


def _pack_tokens(plan: _TokenPlan) -> tuple:
    """The event kernel's configuration and inputs for ``plan``: ``(config, inputs)``."""
    policy, arrivals, workload, model, n = plan.policy, plan.arrivals, plan.workload, plan.model, plan.n
    static = isinstance(policy, StaticBatching)
    multibin = isinstance(policy, MultiBinDynamic)
    engine = isinstance(policy, MultiBinEngine)      # (a cluster's MultiBin engines: static, in bins)
    sla, mem = (policy.sla if static else policy.controller), policy.memory
    b_max = policy.batch_size if static else sla.b_max
    akind, rate, times, aparams, aends = _arrival_fields(arrivals, n)
    prompt_kind, output_kind = workload._prompt.kernel_kind, workload._output.kernel_kind
    cl, E = plan.cluster, 1
    if cl is not None:
        E = cl.engines
        if isinstance(cl.programs, Programs):
            # (each run draws its calls: replayed in the kernel)
            akind, rate, times, aparams = _common.ARR_REPLAY, 0.0, np.empty(0), np.zeros(1)
            prompt_kind = output_kind = _common.SVC_REPLAY
    if isinstance(model, MaxModel):
        model_fields = dict(model=_d.MODEL_MAX, base=model.base, per_token=model.per_token)
    elif isinstance(model, LinearModel):
        model_fields = dict(model=_d.MODEL_LINEAR, base=model.base, alpha=model.alpha, beta=model.beta)
    elif isinstance(model, CalibratedModel):
        code = {"calibrated": _d.MODEL_CALIBRATED, "uncalibrated": _d.MODEL_CALIBRATED_UNCALIBRATED,
                "legacy": _d.MODEL_CALIBRATED_LEGACY}[model.feedback]
        model_fields = dict(model=code, base=model.alpha, tbt_beta=model.beta, tbt_gamma=model.gamma)
    else:
        model_fields = dict(model=_d.MODEL_DECODE, prefill_per_token=model.prefill_per_token, tbt_beta=model.beta,
                            tbt_gamma=model.gamma)
    config = _d.TokenConfig(
        run=_d.RUN.pack(n=n, arrival_kind=akind, rate=rate, prompt_kind=prompt_kind,
                        output_kind=output_kind, integer=workload.integer_lengths,
                        predictor_sigma=plan.predictor.sigma if isinstance(plan.predictor, LogNormalError) else 0.0,
                        predictor=plan.predictor.code, predictor_p=plan.predictor.param
                        if isinstance(plan.predictor, BinConfusion) else 1.0, keep_requests=plan.keep_requests,
                        keep_batches=plan.keep_batches),
        policy=_d.POLICY.pack(
            policy=(_d.POL_MULTIBIN if engine else _d.POL_STATIC if static else _d.POL_MB_DYNAMIC if multibin
                    else _d.POL_DYNAMIC),
            bins=policy.bins if multibin or engine else 1, pin=b_max if static else (policy.pin or 0),
            max_candidates=b_max if static else (policy.max_candidates or sla.b_max),
            selection=(_d.SEL_LONGEST_QUEUE if multibin and policy.selection == "longest_queue"
                       else _d.SEL_ROUND_ROBIN),
            # (edges set before the run: no warm-up)
            warmup=(policy.warmup if policy.bin_edges == "warmup" else 0) if multibin else 1,
            memory_on=mem.enabled and not static,
            # more servers than requests are never all busy: the kernel needs at most n (per engine)
            servers=E * min(plan.servers, n)),
        sla=_c.SLA.pack(variant=_c.CTL_VARIANT_SPEC if sla.variant == "spec" else _c.CTL_VARIANT_MULTIPLICATIVE,
                        d_sla=sla.d_sla, eps_d=sla.eps_d, b_min=sla.b_min, b_max=b_max, alpha=sla.alpha,
                        delta=sla.delta, ema=_c.DEFAULT_EMA),
        memory=_c.MEMORY.pack(variant=_c.MEM_VARIANT_CLT if mem.variant == "clt" else _c.MEM_VARIANT_L0,
                              eta=mem.eta, b_min=sla.b_min, b_max=b_max, z=float(_st.norm.ppf(1.0 - mem.eps_m)),
                              default_tokens=_c.DEFAULT_TOKENS),
        model=_d.MODEL.zeros(**model_fields))
    limits = multibin and policy.bin_b_max is not None
    inputs = _d.INPUTS.pack(
        arrival_times=times, arrival_params=aparams, arrival_ends=aends,
        prompt_params=workload._prompt.params, prompt_values=workload._prompt.values,
        output_params=workload._output.params, output_values=workload._output.values,
        bin_b_max=policy.bin_b_max if limits else np.zeros(policy.bins if multibin or engine else 1),
        predictions=plan.predictor.values if isinstance(plan.predictor, Predictions) else np.empty(0))
    return config, inputs


# --- a cluster of engines behind a router --------------------------------------------------

_ROUTERS = {"round_robin": _d.ROUTE_ROUND_ROBIN, "least_used": _d.ROUTE_LEAST_USED, "autellix": _d.ROUTE_AUTELLIX}


def _plan_cluster(cluster, arrivals, service, n, servers, keep_requests, workload, service_model,
                  keep_batches) -> _TokenPlan:
    if isinstance(cluster.programs, Programs) and not isinstance(arrivals, (Poisson, Saturated)):
        raise TypeError(f"a Cluster with programs starts them as a Poisson process at the arrival rate / calls: "
                        f"arrivals must be Poisson(rate) (or Saturated); got {type(arrivals).__name__}")
    engine = MultiBinEngine.of(cluster.policy) if isinstance(cluster.policy, MultiBin) else cluster.policy
    plan = _plan_tokens(engine, arrivals, service, n, servers, keep_requests, workload, service_model,
                        keep_batches)
    if isinstance(cluster.programs, Sessions):
        _check_sessions(cluster.programs, plan.workload)
    if isinstance(cluster.programs, Programs) and cluster.programs.closed and isinstance(plan.predictor,
                                                                                        LogNormalError):
        raise ValueError("closed-loop programs take the oracle, bin confusion or given predictions; got "
                         f"{plan.predictor} (each call's prediction is made as it arrives, which a log-normal "
                         "error's draws in arrival order cannot follow)")
    E, n = cluster.engines, plan.n
    K = engine.bins if isinstance(engine, (MultiBinDynamic, MultiBinEngine)) else 1
    per_bin = _d.SLOT_BYTES * _d.QUEUE_START + 8 * (_c.CONTROLLER.size + _c.BATCH_STATS.size)
    parts = {"engines": ((E - 1) * (K * per_bin + 80 * min(plan.servers, n)), "the other engines' queues and servers")}
    if cluster.programs is not None:
        parts["programs"] = (8 * 14 * n, "the programs' calls, drawn before the run")
    return replace(plan, cluster=cluster, memory=plan.memory + check_memory(parts))


def _check_sessions(sessions: Sessions, workload: Workload) -> None:
    """A trace's sessions need the trace's own lengths, in its order."""
    for name, spec in (("prompt", workload._prompt), ("output", workload._output)):
        if spec.kind != _common.SVC_REPLAY or spec.values.size != sessions.ids.size:
            raise ValueError(f"programs=Sessions(...) needs the workload's {name} lengths replayed from the same "
                             f"trace, one per session id ({sessions.ids.size}): Workload.from_trace(trace); got "
                             f"{spec.description}")


def _program_count(programs, n: int) -> int:
    """The size of the program table for the first ``n`` requests."""
    if programs is None:
        return 0
    if isinstance(programs, Sessions):
        return -(-n // programs.ids.size) * programs.count
    return -(-n // programs.calls)


def _pack_cluster(cluster, n: int) -> tuple:
    """The kernel's cluster configuration and engine events."""
    programs = cluster.programs
    closed = isinstance(programs, Programs) and programs.closed
    config = _d.CLUSTER.pack(engines=cluster.engines, router=_ROUTERS[cluster.router], threshold=cluster.threshold,
                             programs=_program_count(programs, n),
                             kv_reuse=bool(cluster.kv_reuse and programs is not None),
                             calls=programs.calls if closed else 0)
    ev = cluster.events
    events = dict(event_time=np.array([e.time for e in ev], float),
                  event_engine=np.array([e.engine for e in ev], np.int64),
                  event_add=np.array([e.action == "add" for e in ev], np.int8))
    return config, events


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view, as the kernel's inputs are (one kernel type)."""
    a = a.view()
    a.flags.writeable = False
    return a


def _lengths(spec, gen: np.random.Generator, m: int, integer: bool, in_order: bool = True) -> np.ndarray:
    """``m`` lengths of ``spec`` drawn before a run: a family the kernels
    draw, by their drawer (the first ``m`` draws of ``gen``, the values a
    run on that stream gives its first ``m`` requests); another
    distribution, by its ``rvs``; replayed values in order (repeated end to
    end; resampled unless ``in_order``) or resampled ones; whole tokens (at
    least 1) when ``integer``."""
    if spec.dist is not None and spec.kind != RVS:
        x = np.empty(m)
        _common.draw_lengths(_common.length_drawer(spec.kind), _readonly(spec.params), _readonly(spec.values), gen,
                             x, integer)
        return x
    if spec.dist is not None:
        x = np.asarray(spec.dist.rvs(size=m, random_state=gen), dtype=float)
    elif in_order and spec.kind == _common.SVC_REPLAY:
        x = np.resize(spec.values, m).astype(float)
    else:
        x = np.asarray(gen.choice(spec.values, size=m), dtype=float)
    if integer:
        # (in place: x is a new array)
        np.maximum(np.ceil(x, out=x), 1.0, out=x)
    return x


def _exponentials(gen: np.random.Generator, scale: float, m: int) -> np.ndarray:
    """``gen.exponential(scale, m)``, bit for bit, by the kernels' drawer
    (numba's draws: faster)."""
    x = np.empty(m)
    _common.draw_lengths(_common.length_drawer(_common.SVC_EXPON), _readonly(np.array([0.0, scale])),
                         _readonly(np.empty(0)), gen, x, False)
    return x


def _program_draws(cluster, arrivals, workload, n: int, streams) -> tuple:
    """The draws of a cluster's ``P = ceil(n / calls)`` programs: ``(start,
    gap, new, out)``, the programs' starts (a Poisson process at ``rate /
    calls`` on the arrival stream; all 0 when saturated), then, by call id
    (call c of program p: p calls + c), the calls' gaps (think times,
    exponential, next on the arrival stream; 0 when saturated; a first
    call's is not used), new tokens (prompt stream) and outputs (output
    stream)."""
    C, think = cluster.programs.calls, cluster.programs.think_time
    P = -(-n // C)
    if isinstance(arrivals, Saturated):
        start, gap = np.zeros(P), np.zeros(P * C)
    else:
        start = _exponentials(streams.arrival, C / arrivals.rate, P)
        np.cumsum(start, out=start)
        gap = _exponentials(streams.arrival, think, P * C) if think > 0 else np.zeros(P * C)
    integer = bool(workload.integer_lengths)
    return (start, gap, _lengths(workload._prompt, streams.prompt, P * C, integer),
            _lengths(workload._output, streams.output, P * C, integer))


#: calls a chunk of :func:`~mbbatch._kernels.dynamic.order_calls` reads at
#: least (its programs' calls), and the most calls its scratch may hold with
#: those carried (about 140 bytes each: 37 MB); beyond that (programs far
#: longer than the spacing of their starts), the calls are sorted all at once
ORDER_CHUNK = 4096
ORDER_CAP = 1 << 18


def _order_chunks(start, gap, C: int, chunk: int | None = None):
    """``(chunk, cap, top)`` for :func:`~mbbatch._kernels.dynamic.order_calls`:
    programs a chunk (``chunk``, by default :data:`ORDER_CHUNK` calls'
    worth, or more), calls its scratch holds (a chunk's and those carried
    into it) and a time at least every call's (the last start plus the
    longest span), or None when the scratch passes :data:`ORDER_CAP`.  At a
    chunk's first start s, only programs that started after s - span (the
    longest program span) have calls still to come (the window widened by
    1e-9 of the last start, far more than the times' rounding).  A chunk is
    at least as long as the programs it may carry, so that a call is
    carried about once at most."""
    span = _d.program_span(gap, C)
    width = span + 1e-9 * abs(float(start[-1]))
    chunk = max(1, ORDER_CHUNK // C) if chunk is None else chunk
    while True:
        ends = np.arange(chunk, start.size, chunk)
        carried = int(np.max(ends - np.searchsorted(start, start[ends] - width), initial=0))
        if carried <= chunk:
            break
        chunk = max(carried, 2 * chunk)     # (at least doubled: a few rounds at most)
    cap = (chunk + carried + 1) * C
    return (chunk, cap, start[-1] + span) if cap <= ORDER_CAP else None


def _program_calls(cluster, arrivals, workload, n: int, streams) -> tuple:
    """The first ``n`` calls of open-loop programs (:func:`_program_draws`),
    in arrival order: the kernel's inputs (their times: call c of a program
    at its start plus its gaps 1 .. c; prompts: the program's context so
    far plus the call's new tokens; outputs) and the programs' arrays (each
    call's program, new tokens and 1 on its program's last call).  The
    calls arrive by time, then id (a stable sort: chunk by chunk, or all at
    once when programs are far longer than the spacing of their starts);
    saturated, all at time 0, every program's first call first, then their
    second calls, and so on."""
    C = cluster.programs.calls
    start, gap, new, out = _program_draws(cluster, arrivals, workload, n, streams)
    N = new.size
    # (in place: the times overwrite the gaps, the calls' arrays their draws,
    # and `order` holds each call's program)
    saturated = isinstance(arrivals, Saturated)
    times, ctx = gap, np.empty(N)
    order = np.arange(N).reshape(-1, C).T.ravel() if saturated else np.empty(N, np.int64)
    session_end = np.empty(n, np.int8)
    chunks = None if saturated else _order_chunks(start, gap, C)
    if chunks is not None:
        chunk, cap, top = chunks
        # (a program's last call kept is tracked only when calls are left out)
        last = np.empty(start.size if n < N else 0, np.int64)
        written = _d.order_calls(start, gap, new, out, C, chunk, top, ctx, order, session_end, last,
                                 np.empty((3, cap, 4)), np.empty((3, cap), np.int64), np.empty(cap),
                                 np.empty(cap, np.int64), np.empty(cap // 2 + 2, np.int64))
        if written != N:
            raise RuntimeError(f"mbbatch: the programs' calls overflowed their chunks ({written} of {N} ordered); "
                               "please report this")
    else:
        hi = _d.call_times(start, gap, new, out, C, times, ctx)
        if not saturated and not _d.sort_calls(times, order, np.empty(N // 2 + 2, np.int64), times[0], hi):
            # (about 2 calls a bucket)
            order = np.argsort(times, kind="stable")
        _d.permute_calls(order, times, ctx, new, out, C, np.empty(start.size, np.int64), session_end)
    calls = {"arrival_times": times[:n], "prompt_values": ctx[:n], "output_values": out[:n]}
    programs = {"program": order[:n], "new_tokens": new[:n], "session_end": session_end}
    return calls, programs


def _closed_loop_calls(cluster, arrivals, workload, n: int, streams) -> tuple:
    """The programs of a closed loop (:func:`_program_draws`), for the
    kernel to issue each call when the one before it completes: no calls in
    the kernel's inputs, and the programs' arrays (each request's program,
    new tokens, last-call flag and call id, filled by the kernel as the
    calls arrive; -1 for a request that never arrives), the starts, gaps,
    new tokens and outputs by call id and the heap holding the first
    program's first call."""
    start, gap, new, out = _program_draws(cluster, arrivals, workload, n, streams)
    heap_t = np.empty(start.size + 1)
    heap_id = np.empty(start.size + 1, np.int64)
    heap_t[0], heap_id[0] = start[0], 0
    return ({}, {"program": np.full(n, -1, np.int64), "new_tokens": np.full(n, np.nan),
                 "session_end": np.zeros(n, np.int8), "call": np.full(n, -1, np.int64), "start": start,
                 "gap": gap, "new": new, "out": out, "heap_t": heap_t, "heap_id": heap_id})


def _session_calls(sessions: Sessions, workload: Workload, n: int) -> dict:
    """The first ``n`` calls of a trace's sessions, in request order: the
    kernel's prompt and output lengths (the trace's, repeated end to end;
    with ``context="added"`` each prompt is its session's context plus the
    trace's prompt) and the programs' arrays (each call's program, new
    tokens and last-call flag), as :func:`_program_calls` gives them."""
    integer = bool(workload.integer_lengths)
    prompt = _lengths(workload._prompt, None, n, integer)
    out = _lengths(workload._output, None, n, integer)
    size = sessions.ids.size
    pid = np.resize(sessions.ids, n)
    if n > size:
        # copy c of the trace: sessions of their own
        pid += np.repeat(np.arange(-(-n // size), dtype=np.int64) * sessions.count, size)[:n]
    order = np.argsort(pid, kind="stable")     # the calls of each program together, in request order
    p = pid[order]
    first = np.ones(n, bool)
    first[1:] = p[1:] != p[:-1]
    last = np.ones(n, bool)
    last[:-1] = first[1:]
    ps, os_ = prompt[order], out[order]
    if sessions.context == "included":
        # the context a call finds: its program's previous call's prompt and output
        before = np.zeros(n)
        before[1:] = (ps + os_)[:-1]
        extends = ~first & (ps >= before)
        new_s = np.where(extends, ps - before, ps)
        full_s = ps
    else:
        # each prompt is the call's new tokens; its prompt adds every earlier call's prompt and output
        turn = np.cumsum(ps + os_)
        start = np.zeros(n)
        start[1:] = turn[:-1]
        base = np.maximum.accumulate(np.where(first, start, 0.0))
        new_s = ps
        full_s = turn - os_ - base
    new = np.empty(n)
    new[order] = new_s
    full = np.empty(n)
    full[order] = full_s
    end = np.zeros(n, np.int8)
    end[order[last]] = 1
    return ({"prompt_values": full, "output_values": out},
            {"program": pid, "new_tokens": new, "session_end": end})


def _cluster_metrics(out, st: dict, cluster, hist_ttft_latency) -> dict:
    """A cluster's routing metrics (:mod:`mbbatch.metrics`, kind ``cluster``)."""
    nan = math.nan
    routes = st["routes"]
    q = _quantiles(out.hist_ttft, hist_ttft_latency)
    return {
        "ttft_p50": float(q[0]), "ttft_p95": float(q[1]), "ttft_p99": float(q[2]),
        "large_share": st["large"] / routes if routes else nan,
        "locality_hit_rate": st["kv_hits"] / st["followups"] if st["followups"] else nan,
        "kv_recomputed_tokens": st["kv_recomputed"] / routes if routes else nan,
        "load_imbalance": st["sum_active_max"] / st["sum_active_mean"] if st["sum_active_mean"] > 0 else nan,
        "rerouted": st["rerouted"],
    }


def _convergence_time(t, b_target, st) -> float:
    """Seconds from the first arrival until the sampled b_target settles
    (:func:`~mbbatch.stats.settling_time` over the whole run); NaN when it
    settles only in the run's last part, or nothing was sampled."""
    if t.size == 0 or not st["completed"]:
        return math.nan
    t0, t1 = float(st["first_arrival"]), float(t[-1])
    dt, _, late = stats.settling_time(t, b_target, t0, t1)
    return math.nan if late else dt


def _per_bin(completed: np.ndarray, latency: np.ndarray, span: float) -> dict:
    """Per-bin throughput (requests/s over the run's span) and mean latency (s)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"bin_throughput": completed / span if span > 0 else np.full(completed.size, np.nan),
                "bin_mean_latency": np.where(completed > 0, latency / completed, np.nan),
                "bin_completed": completed}


def _presample(plan, gen: np.random.Generator) -> np.ndarray:
    """``warmup`` predicted output lengths drawn from the workload before the
    run (seed 001, section 7): lengths from the output distribution (or
    resampled from its values), then the predictor's error, whole tokens."""
    m = plan.policy.warmup
    x = _lengths(plan.workload._output, gen, m, integer=False, in_order=False)
    pred = plan.predictor
    if isinstance(pred, LogNormalError):
        x = x * np.exp(pred.sigma * gen.standard_normal(m))
    elif isinstance(pred, Predictions):
        x = gen.choice(pred.values, size=m)
    if plan.workload.integer_lengths:
        x = np.maximum(np.ceil(x), 1.0)
    return x


def _preset_edges(plan, ss):
    """Multi-bin dynamic batching's edges set before the run, ``(lo, hi)``,
    or None (Algorithm 6 at the end of the warm-up)."""
    policy = plan.policy
    if isinstance(policy, MultiBinEngine):
        return plan.engine_edges
    if not isinstance(policy, MultiBinDynamic) or policy.bin_edges == "warmup":
        return None
    if policy.bin_edges == "presample":
        return _c.equal_mass_edges(_presample(plan, stream(ss, STREAM_PRESAMPLE)), policy.bins)
    return plan.optimal_edges


def _engine_edges(policy: MultiBinEngine, workload) -> tuple:
    """A MultiBin engine's bins, ``(lo, hi)`` in output tokens: its edges, or
    equal mass on the workload's output lengths.  Bin i holds ``edges[i] <=
    x < edges[i+1]``, as MultiBin's, and a prediction below ``edges[0]``
    bin 0 (the kernel's fallback, the last bin, is never reached)."""
    e = policy.edges if policy.edges is not None else workload._output.equal_mass_edges(policy.bins)
    lo, hi = np.asarray(e[:-1], dtype=float).copy(), np.asarray(e[1:], dtype=float).copy()
    lo[0], hi[-1] = -np.inf, np.inf
    return lo, hi


def _optimal_edges(policy, law) -> tuple:
    """theory.optimal_boundaries on the output-length distribution ``law``
    at B = b_max, floored and tiled like Algorithm 6's edges."""
    from . import theory

    K = policy.bins
    if K == 1:
        return np.zeros(1), np.full(1, _c.EDGE_MAX)
    e = np.floor(np.asarray(theory.optimal_boundaries(law, policy.controller.b_max, K),
                            dtype=float))
    hi = e[1:].copy()
    hi[-1] = _c.EDGE_MAX
    lo = e[:-1].copy()
    lo[0] = 0.0
    return lo, hi


def _run_tokens(plan: _TokenPlan, ss, warn: bool, progress: bool) -> SimulationResult:
    policy, arrivals, workload, service_model = plan.policy, plan.arrivals, plan.workload, plan.model
    n, servers, cluster = plan.n, plan.servers, plan.cluster
    kind = token_kind(policy)
    # (a cluster's engines each have `servers`)
    total_servers = servers * (cluster.engines if cluster is not None else 1)
    ctl_cfg = policy.sla if isinstance(policy, StaticBatching) else policy.controller
    mem = policy.memory
    K = policy.bins if kind in ("multibin_dynamic", "multibin") else 1
    config, inputs = plan.kernel_args
    streams = _d.TokenStreams(*(stream(ss, s) for s in (STREAM_ARRIVALS, STREAM_SERVICE, STREAM_PROMPT,
                                                          STREAM_PREDICTION)))
    cl_args = None
    if cluster is not None:
        cl_config, events = _pack_cluster(cluster, n)
        programs = _d.NO_PROGRAMS
        if cluster.programs is not None:
            if isinstance(cluster.programs, Sessions):
                calls, programs = _session_calls(cluster.programs, workload, n)
            elif cluster.programs.closed:
                calls, programs = _closed_loop_calls(cluster, arrivals, workload, n, streams)
            else:
                calls, programs = _program_calls(cluster, arrivals, workload, n, streams)
            inputs = inputs._replace(**{k: _readonly(v) for k, v in calls.items()})
        cl_args = (cl_config, programs, events)
    if cluster is None or cluster.programs is None:
        inputs = _drawn(inputs, _d.INPUTS, "output_values", workload._output, streams.output, n)
        inputs = _drawn(inputs, _d.INPUTS, "prompt_values", workload._prompt, streams.prompt, n)
    args = (config, inputs, streams)
    stop = stop_flag()
    t0 = time.perf_counter()
    # bin confusion: each request's uniform from a key drawn on the prediction stream
    key = int(streams.prediction.integers(0, 2 ** 63)) if isinstance(plan.predictor, BinConfusion) else 0
    edges = _preset_edges(plan, ss)
    try:
        out, req, bat = interruptible(lambda: _d.run(*args, stop, groups=BATCH_MEANS_GROUPS,
                                                     ts_rows=TIME_SERIES_ROWS, key=key, edges=edges,
                                                     cluster=cl_args, available=available_memory), stop,
                                      n if progress else None)
    except _d.QueueOverflow as exc:
        # an open-arrival run's backlog is not known before it runs: a run that outgrows the memory
        # stops here, rather than at the operating system's out-of-memory kill
        raise MemoryError(f"n: this run's backlog outgrew the memory: {exc.waiting:,} requests were waiting "
                          f"when doubling its queues needed {format_bytes(exc.needed)}, more than the "
                          f"{format_bytes(exc.limit)} available; the policy does not keep up with the "
                          f"arrivals (no steady state): make n smaller, or the arrival rate lower") from None
    kernel_seconds = time.perf_counter() - t0
    st = _d.STATS.unpack((out.ints, out.floats))

    completed = st["completed"]
    nb = st["batches"]
    nan = math.nan
    span = st["last_completion"] - st["first_arrival"] if completed else nan
    tokens_out = st["tokens_out"]
    with np.errstate(invalid="ignore", divide="ignore"):
        g_lat = np.where(out.group_count > 0, out.group_latency / out.group_count, nan)
    mean_lat = st["sum_latency"] / completed if completed else nan
    ci = stats.batch_means_ci(g_lat, mean_lat)
    requests = None
    if plan.keep_requests:
        cols = {k: v for k, v in req.items() if k != "engine" or cluster is not None}
        if cluster is not None and cluster.programs is not None:
            cols.update(program=programs["program"], new_tokens=programs["new_tokens"])
        requests = Table({**cols, "latency": req["completion"] - req["arrival"]})
    q = _quantiles(out.hist, requests.latency if requests is not None and completed else None)
    mean_b = st["sum_b"] / nb if nb else nan
    var_b = st["sum_b2"] / nb - mean_b ** 2 if nb else nan
    positive_span = bool(completed) and span > 0
    metrics = {
        "throughput": completed / span if positive_span else nan,
        "token_throughput": tokens_out / span if positive_span else nan,
        "mean_latency": mean_lat,
        "mean_latency_ci_low": ci[0],
        "mean_latency_ci_high": ci[1],
        "latency_p50": float(q[0]), "latency_p95": float(q[1]), "latency_p99": float(q[2]),
        "mean_ttft": st["sum_ttft"] / completed if completed else nan,
        "mean_tbt": st["sum_tbt_tokens"] / tokens_out if tokens_out > 0 else nan,
        "sla_violation_tokens": st["sla_tokens"] / tokens_out if tokens_out > 0 else nan,
        "sla_violation_requests": st["sla_requests"] / completed if completed else nan,
        "sla_violation_share": st["sla_requests_dsla"] / completed if completed else nan,
        "utilization": st["busy"] / (total_servers * span) if positive_span else nan,
        "mean_busy_servers": st["busy"] / span if positive_span else nan,
        "mean_batch_service": st["busy"] / nb if nb else nan,
        "memory_peak": st["peak_tokens"] / mem.eta,
        "memory_mean": st["token_seconds"] / (total_servers * span * mem.eta) if positive_span else nan,
        "batch_size_mean": mean_b,
        "batch_size_std": math.sqrt(max(var_b, 0.0)) if nb else nan,
        "span": span,
        "completed": completed,
        "n_batches": nb,
        "mem_exceed_batches": st["mem_exceed"],
        "rejected": st["rejected"],
    }
    if cluster is not None:
        metrics.update(_cluster_metrics(out, st, cluster, requests.ttft if requests is not None and completed
                                        else None))
    elif kind == "multibin_dynamic":
        metrics["warmup_time"] = st["warmup_time"]
    if kind != "static" and cluster is None:
        # infeasible: a controller still above D_SLA + eps_D with its interval
        # shrunk to B_min (the midpoint may sit higher: alpha, N_decode)
        C = _c.C
        sla_limit = ctl_cfg.d_sla + ctl_cfg.eps_d
        metrics["sla_infeasible"] = any(
            out.ctl[b, C.updates] >= _c.SLA_WARMUP_UPDATES and out.ctl[b, C.tau_avg] > sla_limit and out.ctl[b, C.b_low] <= ctl_cfg.b_min
            for b in range(K))
    rows = st["ts_rows"]
    ts = {col: out.ts[:rows, getattr(_d.TS, col)].copy() for col in ("time", *TS_COLUMNS)}
    ts["queue"] = out.ts[:rows, _d.TS_QUEUE:].copy()
    if kind != "static" and cluster is None:
        metrics["convergence_time"] = _convergence_time(ts["time"], ts["b_target"], st)
    config = {**(policy if cluster is None else cluster).describe(), **arrivals.describe(), **workload.describe(),
              **_model_config(service_model), "n": n, "servers": int(servers), "seed_entropy": entropy_str(ss)}
    batches = Table({k: v[:nb] for k, v in bat.items()}) if plan.keep_batches else None
    if isinstance(arrivals, (Poisson, Gamma, OnOff)):
        unstable, reason = stats.queue_verdict(ts["time"], ts["queue"], mean_b, 0.0, n / arrivals.rate)
    elif isinstance(arrivals, Replay):
        unstable, reason = stats.queue_verdict(ts["time"], ts["queue"], mean_b, float(arrivals.times[0]),
                                               arrivals.last_time(n))
    elif isinstance(arrivals, Saturated):
        unstable, reason = False, "not assessed: every request arrives at time 0 (saturated)"
    else:
        unstable, reason = False, "not assessed: a load step has no single steady state"
    # Algorithm 6's edges tile [lo[0], hi[K-1]): K + 1 of them, as MultiBin's
    edges = np.append(out.edges_lo, out.edges_hi[-1])
    arrays = {"batch_size_hist": out.size_hist, "group_mean_latency": g_lat, "latency_histogram": out.hist,
              **_per_bin(out.bin_completed, out.bin_latency, span)}
    if cluster is not None:
        kind = "cluster"
        with np.errstate(invalid="ignore", divide="ignore"):
            arrays.update(engine_completed=out.engine_completed,
                          engine_utilization=out.engine_busy / (servers * span) if positive_span
                          else np.full(cluster.engines, nan))
    res = SimulationResult(
        kind=kind, config=config, n=n, servers=total_servers, edges=edges, metrics=metrics, arrays=arrays,
        requests=requests, batches=batches, time_series=ts, unstable=unstable, unstable_reason=reason,
        latency_quantiles="exact" if requests is not None else "histogram, relative error <= 2**-11",
        kernel_seconds=kernel_seconds)
    return _finish(res, warn, stacklevel=5)


# --- LAPS: prefill instances behind the LAPS router --------------------------------------------------


@dataclass(frozen=True, eq=False)
class _LapsPlan:
    """A checked LAPS run, ready to allocate and simulate."""

    policy: LAPS
    arrivals: object
    workload: Workload
    model: PrefillModel
    n: int
    keep_requests: bool
    memory: int
    decode_model: object = None

    keep_batches = False

    @property
    def servers(self) -> int:
        """The instances (what serves batches side by side)."""
        return self.policy.instances

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss`` (``warn`` as the other plans: LAPS
        runs are not assessed for a steady state; ``progress`` as theirs)."""
        return _run_laps(self, ss, progress)

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and inputs."""
        pol, arrivals, workload, n = self.policy, self.arrivals, self.workload, self.n
        akind, rate, times, aparams, aends = _arrival_fields(arrivals, n)
        config = _l.CONFIG.pack(
            n=n, arrival_kind=akind, prompt_kind=workload._prompt.kernel_kind, integer=workload.integer_lengths,
            instances=pol.instances, threshold=pol.threshold, max_batch=pol.max_batch, dual=pol.dual_queue,
            dynamic=pol.routed, long0=pol.long_instances if pol.routed else 0,
            # (the decode stage starts each request at its first token)
            keep=self.keep_requests or pol.decode is not None, rate=rate,
            window=pol.window, max_batch_tokens=pol.max_batch_tokens, interval=pol.interval, ratio=pol.ratio,
            a=self.model.a, b=self.model.b)
        inputs = _l.INPUTS.pack(arrival_times=times, arrival_params=aparams, arrival_ends=aends,
                                prompt_params=workload._prompt.params, prompt_values=workload._prompt.values)
        return config, inputs

    @functools.cached_property
    def description(self) -> dict:
        decode = {} if self.decode_model is None else {
            f"decode_{k}": v for k, v in _model_config(self.decode_model).items()}
        return {**self.policy.describe(), **self.arrivals.describe(), **self.workload.describe(),
                **_model_config(self.model), **decode, "n": self.n}


def _plan_laps(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
               keep_batches) -> _LapsPlan:
    if service is not None:
        raise TypeError("LAPS takes workload=Workload(prompt=..., output=...) (prompt lengths decide its routing "
                        "and its prefill time), not service=")
    if keep_batches:
        raise TypeError("keep_batches is for the token-level policies; LAPS keeps per-request records "
                        "(keep_requests=True)")
    if not (servers == 1 or servers is None):
        raise ValueError(f"servers does not apply to LAPS: its instances are LAPS(instances=...); got servers = "
                         f"{servers!r}")
    model = PrefillModel() if service_model is None else service_model
    if not isinstance(model, PrefillModel):
        raise TypeError(f"LAPS takes service_model=PrefillModel(a, b) (a prefill batch takes a + b x its prompt "
                        f"tokens); got {type(model).__name__}")
    _check_arrivals(arrivals)
    n = _resolve_n(n, arrivals, [("workload.prompt", workload._prompt)])
    E = policy.instances
    parts = {
        "n": (25 * n, "the requests' arrival times, prompts, queue links and classes"),
        "instances": (8 * (7 * E + E * policy.max_batch), "the instances' queues and batches"),
        "batch_size": (3 * 8 * _common.HIST_SIZE, "the time-to-first-token histograms"),
    }
    if keep_requests or policy.decode is not None:
        parts["keep_requests"] = (48 * n, "the per-request arrays (keep_requests, or the decode stage)")
    decode_model = None
    if policy.decode is not None:
        decode_model = policy.decode_model if policy.decode_model is not None else DecodeModel(prefill_per_token=0.0)
        # the decode stage, checked now (its arrivals are the first tokens, known after the prefill)
        parts["decode"] = (_plan_tokens(policy.decode, Poisson(1.0), None, n, policy.decode_servers, True, workload,
                                        decode_model, False).memory, "the decode stage")
    parts.update(_rvs_memory([("workload.prompt", workload._prompt)], n))
    memory = check_memory(parts)
    _check_times(arrivals, n, model.a + model.b * workload._prompt.mean, "workload.prompt")
    return _LapsPlan(policy=policy, arrivals=arrivals, workload=workload, model=model, n=n,
                     keep_requests=bool(keep_requests), memory=memory, decode_model=decode_model)


def _run_decode(plan: _LapsPlan, req: dict, ss: np.random.SeedSequence):
    """The decode stage after LAPS's prefill: each request joins the decode
    policy at its first token (in that order, ties in arrival order), its
    prompt the one prefilled, its output from the workload's output
    lengths (replayed in order, or drawn in Python on the output stream).
    Returns the decode run's result and each request's completion (its last
    token) and output length, in arrival order."""
    pol, wl, n = plan.policy, plan.workload, plan.n
    first = req["first_token"]
    order = np.argsort(first, kind="stable")
    out = _lengths(wl._output, stream(ss, STREAM_SERVICE), n, bool(wl.integer_lengths))
    stage = Workload(prompt=req["prompt"][order], output=out[order], integer_lengths=wl.integer_lengths,
                     predictor_sigma=wl.predictor_sigma)
    res = _plan_tokens(pol.decode, Replay(first[order]), None, n, pol.decode_servers, True, stage,
                       plan.decode_model, False, output_law=wl._output.dist).run(ss, warn=False)
    completion = np.empty(n)
    completion[order] = res.requests.completion
    return res, completion, out


def _laps_groups(pol, E: int, start: float, move_time: np.ndarray, move_group: np.ndarray) -> dict:
    """The instances of LAPS's short and long groups over time, a step
    function: at the first arrival, then after each move of the router's
    dynamic allocation (from its log of moves)."""
    to_short = np.where(move_group == _l.SHORT, 1, -1).astype(np.int64)
    short = (E - pol.long_instances) + np.concatenate(([0], np.cumsum(to_short)))
    return {"time": np.concatenate(([start], move_time)), "short_instances": short, "long_instances": E - short}


def _run_laps(plan: _LapsPlan, ss: np.random.SeedSequence, progress: bool) -> SimulationResult:
    config, inputs = plan.kernel_args
    # the arrival and prompt streams of the token-level policies: the same seed, the same requests
    streams = _l.LapsStreams(stream(ss, STREAM_ARRIVALS), stream(ss, STREAM_PROMPT))
    inputs = _drawn(inputs, _l.INPUTS, "prompt_values", plan.workload._prompt, streams.prompt, plan.n)
    stop = stop_flag()
    t0 = time.perf_counter()
    out, req, _ = interruptible(lambda: _l.run(config, inputs, streams, stop), stop, plan.n if progress else None)
    kernel_seconds = time.perf_counter() - t0
    st = _l.STATS.unpack((out.ints, out.floats))
    pol, E = plan.policy, plan.policy.instances
    completed, nb, short = st["completed"], st["batches"], st["short"]
    nan = math.nan
    span = st["last_completion"] - st["first_arrival"] if completed else nan
    positive = bool(completed) and span > 0
    hist = out.hist_short + out.hist_long
    q_all, q_s, q_l = (_quantiles(h, None) for h in (hist, out.hist_short, out.hist_long))
    long_ = completed - short
    metrics = {
        "throughput": completed / span if positive else nan,
        "mean_latency": st["sum_ttft"] / completed if completed else nan,
        "latency_p50": float(q_all[0]), "latency_p95": float(q_all[1]), "latency_p99": float(q_all[2]),
        "mean_ttft": st["sum_ttft"] / completed if completed else nan,
        **{f"ttft_short_{q}": float(v) for q, v in zip(("p50", "p95", "p99"), q_s)},
        **{f"ttft_long_{q}": float(v) for q, v in zip(("p50", "p95", "p99"), q_l)},
        "mean_ttft_short": st["sum_ttft_short"] / short if short else nan,
        "mean_ttft_long": st["sum_ttft_long"] / long_ if long_ else nan,
        "short_share": short / completed if completed else nan,
        "group_moves": st["moves"],
        "mean_short_instances": (st["short_instance_time"] / span if pol.routed else float(E)) if positive else nan,
        "utilization": st["busy"] / (E * span) if positive else nan,
        "mean_busy_servers": st["busy"] / span if positive else nan,
        "mean_batch_service": st["busy"] / nb if nb else nan,
        "batch_size_mean": st["sum_batch"] / nb if nb else nan,
        "span": span, "completed": completed, "n_batches": nb,
    }
    k = min(st["moves"], out.move_time.size)
    quantiles = "histogram, relative error <= 2**-11"
    arrays = {}
    # (a prefill instance's latency is the time to first token: completion is the first token)
    completion = None if req is None else req["first_token"]
    output = None
    if pol.decode is not None and completed:
        # the decode stage: latency end to end, to the last token
        decode, completion, output = _run_decode(plan, req, ss)
        kernel_seconds += decode.kernel_seconds
        e2e = completion - req["arrival"]
        span = float(completion.max()) - st["first_arrival"]
        q = _quantiles(None, e2e)
        metrics.update(throughput=completed / span if span > 0 else nan, mean_latency=float(e2e.mean()),
                       latency_p50=float(q[0]), latency_p95=float(q[1]), latency_p99=float(q[2]), span=span)
        arrays["decode"] = decode
        quantiles = "latency exact (end to end); time to first token from histograms, relative error <= 2**-11"
    requests = None
    if plan.keep_requests:
        cols = dict(req) if output is None else {**req, "output": output}
        requests = Table({**cols, "completion": completion, "latency": completion - req["arrival"],
                          "ttft": req["first_token"] - req["arrival"]})
    config = {**plan.description, "seed_entropy": entropy_str(ss)}
    ts = _laps_groups(pol, E, st["first_arrival"] if completed else 0.0, out.move_time[:k], out.move_group[:k]) \
        if pol.routed and k == st["moves"] else None
    return SimulationResult(
        kind="laps", config=config, n=plan.n, servers=E, edges=np.array([-np.inf, pol.threshold, np.inf]),
        metrics=metrics,
        arrays={**arrays, "latency_histogram": hist, "ttft_short_histogram": out.hist_short,
                "ttft_long_histogram": out.hist_long,
                "group_moves_log": Table({"time": out.move_time[:k].copy(), "instance": out.move_instance[:k].copy(),
                                          "to_group": np.where(out.move_group[:k] == _l.SHORT, "short", "long")})},
        requests=requests, time_series=ts,
        unstable=False, unstable_reason="not assessed: LAPS runs have no backlog check yet",
        latency_quantiles=quantiles, kernel_seconds=kernel_seconds)
