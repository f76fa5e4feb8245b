"""What every planner shares: checking a call's arrivals, lengths and clock,
drawing lengths before a run, latency quantiles, and the metrics of a run
assembled from the metric table (:func:`assemble`)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from .. import stats
from .._kernels import common as _common
from .._kernels.select import stable_order
from .._running import check_clock
from .._seeding import STREAM_ARRIVALS, STREAM_PROMPT, STREAM_SERVICE, stream
from .._validation import resolve_n as _resolve
from ..arrivals import Arrivals, Replay, TraceTiledWarning
from ..lengths import RVS
from ..metrics import applicable
from ..predictors import Predictions
from ..results import SimulationResult, UnstableWarning

__all__ = ["BATCH_MEANS_GROUPS", "engines_backlog", "TIME_SERIES_ROWS", "SCALE_RANGE",
           "RunTotals", "assemble", "check_arrivals",
           "check_batch_model",
           "resolve_n", "rvs_memory", "check_times", "model_config", "quantiles", "finish", "drawn", "lengths",
           "exponentials", "drawn_lengths", "readonly", "per_bin", "steady_state", "settled", "HISTOGRAM_QUANTILES",
           "HISTOGRAM_ERROR", "decode_stage_requests", "decode_stage_checked", "stage_goodput"]

#: Number of contiguous groups (by arrival index) for the batch-means
#: confidence interval of the mean latency.
BATCH_MEANS_GROUPS = 32
#: Rows of the token-level policies' downsampled time series.
TIME_SERIES_ROWS = 512
#: the relative error of a quantile read off the kernels' latency histograms
HISTOGRAM_ERROR = "relative error <= 2**-11"
#: how exact such quantiles are
HISTOGRAM_QUANTILES = f"histogram, {HISTOGRAM_ERROR}"


def check_batch_model(service_model) -> None:
    """Refuse a service model that does not time the batches of a batching
    policy (MaxModel, LinearModel, DecodeModel, CalibratedModel or IterationModel)."""
    from ..policies.base import TOKEN_MODELS
    from ..service_models import SERVICE_MODELS

    models = tuple(dict.fromkeys(SERVICE_MODELS[m] for m in TOKEN_MODELS))   # (a profile is an IterationModel)
    if service_model is not None and not isinstance(service_model, models):
        names = [m.__name__ for m in sorted(models, key=lambda m: m.code)]
        raise TypeError(f"service_model must be {', '.join(names[:-1])} or {names[-1]}; "
                        f"got {type(service_model).__name__}")


def check_arrivals(arrivals) -> None:
    """Refuse anything but an arrival process of :mod:`mbbatch.arrivals`."""
    if not isinstance(arrivals, Arrivals):
        from ..registry import ARRIVALS

        names = [cls.__name__ for cls in ARRIVALS.values()]
        raise TypeError("arrivals must be " + ", ".join(names[:-1]) + f" or {names[-1]}; "
                        f"got {type(arrivals).__name__}")


def _replayed(arrivals, named_specs) -> list:
    out = [("arrivals.times", arrivals.times.size)] if isinstance(arrivals, Replay) else []
    return out + [(name, sp.values.size) for name, sp in named_specs if sp.kind == _common.SVC_REPLAY]


def resolve_n(n, arrivals, named_specs, predictor=None) -> int:
    """``n`` checked, defaulting to the length of the replayed arrays (which
    must have one length).  A larger ``n`` repeats them end to end, with a
    :class:`TraceTiledWarning`."""
    replayed = _replayed(arrivals, named_specs)
    if isinstance(predictor, Predictions):
        if not replayed and n is not None and n > predictor.values.size:
            raise ValueError(f"predictor.values has {predictor.values.size} values; the n = {n} requests need "
                             "one each")
        replayed.append(("predictor.values", predictor.values.size))
    n = _resolve(n, replayed, tile=True)
    if replayed and n > replayed[0][1]:
        size = replayed[0][1]
        if isinstance(arrivals, Replay):
            arrivals.last_time(n)                    # (refuses times that cannot be tiled)
        shift = (" (arrival times shifted by the trace's span plus one mean gap each time)"
                 if isinstance(arrivals, Replay) else "")
        warnings.warn(f"n = {n} exceeds the {size} replayed values of {', '.join(nm for nm, _ in replayed)}: "
                      f"they are repeated {-(-n // size)} times end to end{shift}", TraceTiledWarning, stacklevel=6)
    return n


def rvs_memory(named_specs, n: int) -> dict:
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


def check_times(arrivals, n, scale: float, name: str) -> None:
    """Refuse a run whose typical service time ``scale`` (s, set by the
    parameter ``name``) lies outside :data:`SCALE_RANGE` (its latency
    quantiles would be read off the histogram's end buckets, wrong by orders
    of magnitude), or whose clock would be too coarse for its service times."""
    lo, hi = SCALE_RANGE
    if math.isfinite(scale) and scale > 0 and not lo <= scale <= hi:
        raise ValueError(f"{name}: service times of about {scale:.3g} s lie outside [{lo:.3g}, {hi:.3g}] s, the "
                         "range whose latencies the latency histogram resolves (its buckets cover 2**-30 to "
                         "2**50 s); express the times in other units")
    clock = arrivals.clock(n)
    if clock is not None:
        check_clock(clock[0], scale, clock[1])


def times_name(model) -> str:
    """What :func:`check_times` blames for a run's service times out of range:
    ``service_model`` where a request of one prompt and one output token
    already takes a time out of range, ``workload`` (its lengths) where not."""
    lo, hi = SCALE_RANGE
    one = float(model.one_request(1.0, 1.0))
    return "service_model" if math.isfinite(one) and one > 0 and not lo <= one <= hi else "workload"


def model_config(model) -> dict:
    """A service model's entries of a run's configuration."""
    return {"service_model": type(model).__name__, **{f"model_{k}": v for k, v in vars(model).items()}}


def quantiles(hist, latency) -> np.ndarray:
    """Latency quantiles: exact from the per-request latencies when kept,
    else read from the kernel's histogram.  Both are the inverted CDF (the
    smallest latency with a share q of the requests at or below it), so the
    two differ by at most the histogram's half bucket."""
    if latency is not None:
        return stats.exact_quantiles(latency, stats.QUANTILES)
    return stats.hist_quantiles(hist, stats.QUANTILES, _common.HIST_BASE, _common.HIST_SHIFT)


def steady_state(arrivals, n: int, verdict) -> tuple:
    """``(unstable, reason)`` of a run: ``verdict(start, end)`` over the
    arrivals' span where the arrival process has a steady state, else not
    assessed (saturated arrivals, a load step), saying why."""
    if arrivals.unassessed:
        return False, f"not assessed: {arrivals.unassessed}"
    return verdict(*arrivals.span(n))


def engines_backlog(times, queue, engine_queue, unit: float, start: float, end: float) -> tuple:
    """``(growing, reason)`` of a run of several engines: the requests
    waiting on all of them (``queue``: columns summed), then on each engine
    alone (``engine_queue``: one column each; None for one engine).  One
    engine whose queue grows is an overload of the run, though the others'
    steady queues can hide it in the sum (a router that sends one engine more
    than it carries)."""
    growing, reason = stats.queue_verdict(times, queue, unit, start, end)
    if growing or engine_queue is None or engine_queue.shape[1] < 2:
        return growing, reason
    for e in range(engine_queue.shape[1]):
        grows, why = stats.queue_verdict(times, engine_queue[:, e:e + 1], unit, start, end)
        if grows:
            return True, f"engine {e}: {why}"
    return growing, reason


def finish(res: SimulationResult, warn: bool, stacklevel: int) -> SimulationResult:
    """``res``, with an :class:`UnstableWarning` when ``warn`` and it has no steady state."""
    if warn and res.unstable:
        warnings.warn(f"no steady state: {res.unstable_reason}", UnstableWarning, stacklevel=stacklevel)
    return res


class RunTotals(NamedTuple):
    """What every run counts, from which the metrics of the tag ``run``
    (and ``batch_means``) follow by one formula each (:func:`assemble`).

    ``completed`` requests, their ``span`` (last completion - first arrival,
    s), summed latency (s), ``busy`` server-time (s) on ``servers`` servers
    (inf: infinitely many), ``batches`` served holding ``members`` requests
    in all, the latency quantiles at :data:`mbbatch.stats.QUANTILES` (s),
    and the batch-means groups' mean latencies (s; None: no interval).
    """

    completed: int
    span: float
    sum_latency: float
    busy: float
    servers: float
    batches: int
    members: float
    latency_quantiles: np.ndarray
    group_latency: np.ndarray | None = None


def assemble(kind: str, totals: RunTotals, extra: dict) -> dict:
    """The metrics of a ``kind`` run, in the table's order: the run's own
    from ``totals`` (each by its one formula), the batch-means interval where
    ``kind`` reports it, and the family's ``extra`` values for the rest.  A
    metric missing or unexpected is an error (the planner's bug)."""
    c, span, busy, nb = totals.completed, totals.span, totals.busy, totals.batches
    nan = math.nan
    positive = bool(c) and span > 0
    q = totals.latency_quantiles
    values = {
        # (every request completed at its arrival instant: infinitely fast)
        "throughput": (c / span if span > 0 else math.inf) if c else nan,
        "mean_latency": totals.sum_latency / c if c else nan,
        "latency_p50": float(q[0]), "latency_p95": float(q[1]), "latency_p99": float(q[2]),
        "utilization": busy / (totals.servers * span) if positive and totals.servers != math.inf else nan,
        "mean_busy_servers": busy / span if positive else nan,
        "mean_batch_service": busy / nb if nb else nan,
        "mean_batch_size": totals.members / nb if nb else nan,
        "span": span if c else nan,
        "completed": c,
        "n_batches": nb,
    }
    if totals.group_latency is not None:
        values["mean_latency_ci_low"], values["mean_latency_ci_high"] = stats.batch_means_ci(
            totals.group_latency, values["mean_latency"])
    values.update(extra)
    names = [m for m in applicable(kind) if m != "unstable"]
    missing = [m for m in names if m not in values]
    unexpected = sorted(set(extra) - set(names))
    if missing or unexpected:
        raise RuntimeError(f"mbbatch: the metrics of a {kind} run: missing {missing}, unexpected {unexpected}; "
                           "please report this")
    return {m: values[m] for m in names}


def drawn(inputs, arrays, field: str, spec, gen, n: int):
    """``inputs`` with ``field`` holding the ``n`` draws of ``spec`` when it
    is a distribution drawn in Python (see :mod:`mbbatch.lengths`)."""
    if spec.kind != RVS:
        return inputs
    return arrays.pack(**{**inputs._asdict(), field: spec.draw(gen, n)})


def drawn_lengths(inputs, arrays, workload, streams, n: int):
    """The event kernel's ``inputs`` with the output and the prompt lengths
    drawn in Python where the workload's distributions need it (the output
    stream first, then the prompt stream: :func:`drawn`)."""
    inputs = drawn(inputs, arrays, "output_values", workload._output, streams.output, n)
    return drawn(inputs, arrays, "prompt_values", workload._prompt, streams.prompt, n)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view, as the kernel's inputs are (one kernel type)."""
    a = a.view()
    a.flags.writeable = False
    return a


def call_streams(ss: np.random.SeedSequence) -> SimpleNamespace:
    """The streams a cluster's programs' calls are drawn from, fresh from
    the seed ``ss``: its ``arrival``, ``prompt`` and ``output`` streams
    (:meth:`.cluster.ContinuousPart.calls`, which keeps its last draw by
    their states)."""
    return SimpleNamespace(arrival=stream(ss, STREAM_ARRIVALS), prompt=stream(ss, STREAM_PROMPT),
                           output=stream(ss, STREAM_SERVICE))


def lengths(spec, gen: np.random.Generator, m: int, integer: bool, in_order: bool = True,
            empty=np.empty) -> np.ndarray:
    """``m`` lengths of ``spec`` drawn before a run: a family the kernels
    draw, by their drawer (the first ``m`` draws of ``gen``, the values a
    run on that stream gives its first ``m`` requests); another
    distribution, by its ``rvs``; replayed values in order (repeated end to
    end; resampled unless ``in_order``) or resampled ones; whole tokens (at
    least 1) when ``integer``; ``empty`` makes the array a family the
    kernels draw is drawn into (an :class:`~mbbatch._kernels.arena.Lease`'s
    ``empty``: default, a fresh one)."""
    if _drawn_by_kernel(spec):
        x = empty(m)
        _common.draw_lengths(_common.length_drawer(spec.kind), readonly(spec.params), readonly(spec.values), gen,
                             x, integer)
        return x
    if spec.dist is not None:
        x = np.asarray(spec.dist.rvs(size=m, random_state=gen), dtype=float)
    elif in_order and spec.kind == _common.SVC_REPLAY:
        # (np.resize makes a new array: converted in place of a second copy)
        x = np.resize(spec.values, m).astype(float, copy=False)
    else:
        x = np.asarray(gen.choice(spec.values, size=m), dtype=float)
    if integer:
        # (in place: x is a new array)
        np.maximum(np.ceil(x, out=x), 1.0, out=x)
    return x


def _drawn_by_kernel(spec) -> bool:
    """Whether the lengths of ``spec`` are a family the kernels draw (by
    their drawer), not a distribution's ``rvs`` or given values."""
    return spec.dist is not None and spec.kind != RVS


def mixture_lengths(klass: np.ndarray, counts: np.ndarray, specs: list, gens: list, outs: tuple) -> None:
    """Each class's lengths of two streams (class c's ``counts[c]``, of
    ``specs[c]``, drawn from ``gens[c]``: the values :func:`lengths` gives,
    whole tokens) into ``outs`` at its requests' places in ``klass`` (as
    floats).  Where the kernels draw every class's families, in one pass,
    a block of each class's at a time (:func:`.draw_mixture`); otherwise
    each class's drawn whole, then placed."""
    if all(_drawn_by_kernel(spec) for pair in specs for spec in pair):
        C = len(specs)
        fns, params, values = ([np.array([_common.length_drawer(pair[k].kind) for pair in specs], np.int64)
                                for k in (0, 1)],
                               [tuple(readonly(pair[k].params) for pair in specs) for k in (0, 1)],
                               [tuple(readonly(np.asarray(pair[k].values, float)) for pair in specs) for k in (0, 1)])
        _common.draw_mixture(klass, counts, fns[0], params[0], values[0], tuple(g[0] for g in gens), fns[1],
                             params[1], values[1], tuple(g[1] for g in gens), True,
                             np.empty((C, _common.BLOCK)), np.empty((C, _common.BLOCK)), np.zeros((3, C), np.int64),
                             *outs)
        return
    for c, (pair, pair_gens) in enumerate(zip(specs, gens)):
        _common.scatter_class(klass, float(c), *(lengths(spec, g, int(counts[c]), True)
                                                 for spec, g in zip(pair, pair_gens)), *outs)


def exponentials(gen: np.random.Generator, scale: float, m: int, empty=np.empty) -> np.ndarray:
    """``gen.exponential(scale, m)``, bit for bit, by the kernels' drawer
    (numba's draws: faster), into an array ``empty`` makes (as
    :func:`lengths`'s)."""
    x = empty(m)
    _common.draw_lengths(_common.length_drawer(_common.SVC_EXPON), readonly(np.array([0.0, scale])),
                         readonly(np.empty(0)), gen, x, False)
    return x


def per_bin(completed: np.ndarray, latency: np.ndarray, span: float) -> dict:
    """Per-bin throughput (requests/s over the run's span) and mean latency (s)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"bin_throughput": completed / span if span > 0 else np.full(completed.size, np.nan),
                "bin_mean_latency": np.where(completed > 0, latency / completed, np.nan),
                "bin_completed": completed}


def settled(t, b_target, st) -> float:
    """Seconds from the first arrival until the sampled ``b_target`` (a
    controller's batch size, or cap on running sequences) settles
    (:func:`~mbbatch.stats.settling_time` over the whole run); NaN when it
    settles only in the run's last part, or nothing was sampled."""
    if t.size == 0 or not st["completed"]:
        return math.nan
    t0, t1 = float(st["first_arrival"]), float(t[-1])
    dt, _, late = stats.settling_time(t, b_target, t0, t1)
    return math.nan if late else dt


#: the moves a request :func:`decode_stage_requests` makes on average before it sorts instead
STABLE_MOVES = 16


def decode_stage_requests(first: np.ndarray, output: np.ndarray) -> np.ndarray:
    """The requests a decode stage serves (LAPS's, a disaggregated
    deployment's decode pool), in the order they join it at ``first`` (their
    first token, or the end of its KV transfer): those of more than one
    output token (the prefill generates a request's first token, as in
    disaggregated serving: Zhong et al., 2024, DistServe, arXiv:2401.09670;
    the decode stage generates the other ``output - 1``, its first decode
    iteration reading the first token), by ``first``, ties in arrival
    order.  Nearly sorted (a first token follows its arrival by its
    prefill), they are put in order by insertion
    (:func:`mbbatch._kernels.select.stable_order`), else, past a few moves
    a request, by numpy's stable sort: the same order either way."""
    first, output = np.ascontiguousarray(first, float), np.ascontiguousarray(output, float)
    order = np.empty(first.size, np.int64)
    m = stable_order(first, output, 1.0, order, STABLE_MOVES * first.size + 1024)
    if m >= 0:
        return order[:m]
    many = np.flatnonzero(output > 1.0)
    return many[np.argsort(first[many], kind="stable")]


def decode_stage_checked(workload, ss, n: int) -> tuple:
    """The requests a decode stage's check reads (:meth:`check_requests` of
    LAPS's plans), before any stage runs: the prompts and outputs the run
    draws (the prompt and service streams), each output less the prefill's
    first token, a one-token request checked as one of two tokens so that
    the places stay those of arrival order; ``(prompts, outputs)``."""
    integer = bool(workload.integer_lengths)
    out = lengths(workload._output, stream(ss, STREAM_SERVICE), n, integer)
    return lengths(workload._prompt, stream(ss, STREAM_PROMPT), n, integer), np.maximum(out - 1.0, 1.0)


def stage_goodput(workload, req: dict, completion: np.ndarray, output: np.ndarray) -> float:
    """The share of the requests (every one completed) that met both the
    workload's objectives end to end: the time to first token (the
    prefill's) within ``ttft_slo``, and the time per output token,
    ``(completion - first token) / (output - 1)`` (none for one token, as
    the continuous engine's), within ``tpot_slo`` (DistServe's goodput, Zhong
    et al., 2024, arXiv:2401.09670: the wait for the decode stage counts)."""
    first = req["first_token"]
    ok = first - req["arrival"] <= workload.ttft_slo
    if math.isfinite(workload.tpot_slo):
        many = output > 1.0
        ok[many] &= (completion[many] - first[many]) / (output[many] - 1.0) <= workload.tpot_slo
    return np.count_nonzero(ok) / ok.size
