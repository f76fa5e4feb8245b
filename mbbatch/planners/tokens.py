"""The planner of the event kernel (:mod:`mbbatch._kernels.dynamic`): the
token-level policies, each forming its batches by the rule it declares
(:meth:`~mbbatch.policies.base.Policy.event_config`), whenever a server is
free and requests wait.  A cluster (:mod:`.cluster`) runs the same plan with
its engines, router and programs."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from .._kernels import common as _common
from .._kernels import controller as _c
from .._kernels import dynamic as _d
from .._kernels import queues as _q
from .._kernels.arena import Lease
from .._running import available_memory, check_memory, format_bytes, interruptible, stop_flag
from .._seeding import (STREAM_ARRIVALS, STREAM_PREDICTION, STREAM_PRESAMPLE, STREAM_PROMPT, STREAM_SERVICE,
                        entropy_str, stream)
from .._validation import check_servers
from ..predictors import LogNormalError, Oracle
from ..results import SimulationResult, Table
from ..service_models import DecodeModel
from .common import (BATCH_MEANS_GROUPS, HISTOGRAM_QUANTILES, TIME_SERIES_ROWS, RunTotals, assemble, check_arrivals,
                     check_batch_model, check_times, drawn_lengths, engines_backlog, finish, lengths, model_config,
                     per_bin, quantiles, resolve_n, rvs_memory, settled, steady_state, times_name)

__all__ = ["Plan", "check", "TS_COLUMNS"]

#: The time-series columns besides ``time`` and ``queue``.
TS_COLUMNS = ("b_target", "b_low", "b_high", "tau_avg", "bin", "batch_size")


@dataclass(frozen=True, eq=False)
class Plan:
    """A checked token-level run, ready to allocate and simulate.

    ``policy`` is the token-level policy (a cluster's engines' form),
    ``event`` its :class:`~mbbatch.policies.base.EventPolicy`; ``cluster``
    the cluster's part of the plan (:class:`.cluster.Part`), None for one
    engine; ``output_law`` the output lengths' distribution (for
    ``bin_edges="optimal"``): the workload's, or, for LAPS's decode stage
    (whose workload replays lengths drawn from it), the one they were drawn
    from."""

    policy: object
    event: object
    arrivals: object
    workload: object
    model: object
    n: int
    servers: int
    keep_requests: bool
    keep_batches: bool
    memory: int
    predictor: object
    cluster: object = None
    output_law: object = None

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss``; ``warn``: issue an :class:`UnstableWarning`
        for a run with no steady state (else only ``res.unstable`` says it);
        ``progress``: a progress bar on stderr (see :func:`mbbatch.simulate`)."""
        return _run(self, ss, warn, progress)

    @property
    def kind(self) -> str:
        """The kind of the run's results: the cluster's, or the policy's."""
        return self.cluster.policy.kind if self.cluster is not None else self.policy.kind

    @functools.cached_property
    def optimal_edges(self) -> tuple:
        """The edges of ``bin_edges="optimal"`` (computed once per plan)."""
        return _optimal_edges(self.event.bins, self.event.b_max, self.output_law)

    @functools.cached_property
    def given_edges(self) -> tuple:
        """Bins given in tokens, or equal mass on the output lengths (computed once per plan)."""
        return _given_edges(self.event, self.workload)

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and inputs (read-only: every run of
        the plan shares them)."""
        return _pack(self)


def check(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches,
          output_law=None) -> Plan:
    """The checked :class:`Plan` of a ``simulate`` call of a token-level policy."""
    check_batch_model(service_model)
    if service is not None:
        raise TypeError(f"{policy.title} takes workload=Workload(prompt=..., output=...) (and a "
                        "service_model), not service=: it forms batches by prompt and output lengths")
    if service_model is None:
        service_model = DecodeModel()
    check_arrivals(arrivals)
    ev = policy.event_config()
    predictor = ev.predictor
    if not isinstance(predictor, Oracle) and workload.predictor_sigma != 0:
        name = policy.title
        raise ValueError(f"{name} takes one predictor: workload.predictor_sigma (a LogNormalError) or "
                         f"{name}(predictor=...), not both; got predictor_sigma = "
                         f"{workload.predictor_sigma:g} and {predictor}")
    if workload.predictor_sigma != 0:
        predictor = LogNormalError(workload.predictor_sigma)
    output_law = workload._output.dist if output_law is None else output_law
    if ev.preset == "optimal" and output_law is None:
        raise ValueError("bin_edges=\"optimal\" needs the output lengths as a distribution (eq. (2) on it); "
                         f"got {workload._output.description['service']} values: use \"presample\" or \"warmup\"")
    n = resolve_n(n, arrivals, [("workload.prompt", workload._prompt), ("workload.output", workload._output)],
                  predictor)
    servers = check_servers(servers)
    if servers == math.inf:
        raise ValueError("servers must be finite for the token-level policies; got inf")
    K, b_max = ev.bins, ev.b_max
    c = min(servers, n)
    queue = _q.SLOT_BYTES * _q.QUEUE_START
    parts = {
        "bins": (K * (queue + 8 * (TIME_SERIES_ROWS + _c.CONTROLLER.size + _c.BATCH_STATS.size + 4)),
                 "the bins' queues"),
        "servers": (80 * c, "the servers' batches"),
        "warmup": (8 * min(max(ev.warmup, 1), n), "the warm-up window"),
        ("b_max" if ev.controlled else "batch_size"): (8 * (min(b_max, n) + 1), "the batch-size histogram"),
        "n": (3 * 8 * _common.HIST_SIZE, "the latency, time-to-first-token and time-between-tokens histograms"),
    }
    if arrivals.clock(n) is None:
        # every request is queued at time 0: the ring buffers grow to hold n (a power of two, at
        # least the start), the last doubling's old buffers beside the new (grow_bytes).  n sizes
        # that growth (the part to make smaller), so it is counted under n
        grown = _q.grow_bytes((1 << max(int(n - 1).bit_length(), _q.QUEUE_START.bit_length() - 1)) // 2)
        parts["n"] = (parts["n"][0] + K * (grown - queue),
                      "the queues of the n requests waiting at time 0 (saturated arrivals) and the latency, "
                      "time-to-first-token and time-between-tokens histograms")
    if ev.scratch:
        key = "b_max" if ev.controlled else "batch_size"
        parts[key] = (parts[key][0] + 8 * _scratch(ev, n), "the batch-size histogram and the scratch its rule "
                      "chooses a batch in")
    if keep_requests:
        parts["keep_requests"] = (72 * n, "the per-request arrays (keep_requests)")
    if keep_batches:
        parts["keep_batches"] = (64 * n, "the per-batch arrays (keep_batches)")
    parts.update(rvs_memory([("workload.prompt", workload._prompt), ("workload.output", workload._output)], n))
    memory = check_memory(parts)
    check_times(arrivals, n, service_model.one_request(workload._prompt.mean, workload._output.mean),
                times_name(service_model))
    return Plan(policy, ev, arrivals, workload, service_model, n, int(servers), bool(keep_requests),
                bool(keep_batches), memory, predictor, output_law=output_law)


def _pack(plan: Plan) -> tuple:
    """The event kernel's configuration and inputs for ``plan``: ``(config, inputs)``."""
    ev, arrivals, workload, n = plan.event, plan.arrivals, plan.workload, plan.n
    sla, mem = ev.sla, ev.memory
    akind, rate, times, aparams, aends = arrivals.kernel_fields(n)
    prompt_kind, output_kind = workload._prompt.kernel_kind, workload._output.kernel_kind
    E = 1
    if plan.cluster is not None:
        E = plan.cluster.policy.engines
        if plan.cluster.draws_calls:
            # (each run draws its calls: replayed in the kernel)
            akind, rate, times, aparams = _common.ARR_REPLAY, 0.0, np.empty(0), np.zeros(1)
            prompt_kind = output_kind = _common.SVC_REPLAY
    config = _d.TokenConfig(
        run=_d.RUN.pack(n=n, arrival_kind=akind, rate=rate, prompt_kind=prompt_kind,
                        output_kind=output_kind, integer=workload.integer_lengths,
                        **plan.predictor.event_fields(), keep_requests=plan.keep_requests,
                        keep_batches=plan.keep_batches, ttft_slo=workload.ttft_slo, tpot_slo=workload.tpot_slo),
        policy=_d.POLICY.pack(
            policy=ev.formation, bins=ev.bins, pin=ev.pin, max_candidates=ev.max_candidates,
            selection=ev.selection, warmup=ev.warmup, memory_on=ev.memory_on,
            # more servers than requests are never all busy: the kernel needs at most n (per engine)
            servers=E * min(plan.servers, n), scratch=_scratch(ev, n), max_wait=ev.max_wait),
        sla=_c.SLA.pack(variant=_c.CTL_VARIANT_SPEC if sla.variant == "spec" else _c.CTL_VARIANT_MULTIPLICATIVE,
                        d_sla=sla.d_sla, eps_d=sla.eps_d, b_min=sla.b_min, b_max=ev.b_max, alpha=sla.alpha,
                        delta=sla.delta, ema=_c.DEFAULT_EMA),
        memory=_c.MEMORY.pack(variant=_c.MEM_VARIANT_CLT if mem.variant == "clt" else _c.MEM_VARIANT_L0,
                              eta=mem.eta, b_min=sla.b_min, b_max=ev.b_max, z=float(_st.norm.ppf(1.0 - mem.eps_m)),
                              default_tokens=_c.DEFAULT_TOKENS),
        model=_d.MODEL.zeros(**plan.model.kernel_fields()))
    inputs = _d.INPUTS.pack(
        arrival_times=times, arrival_params=aparams, arrival_ends=aends,
        prompt_params=workload._prompt.params, prompt_values=workload._prompt.values,
        output_params=workload._output.params, output_values=workload._output.values,
        bin_b_max=ev.bin_b_max if ev.bin_b_max is not None else np.zeros(ev.bins),
        predictions=plan.predictor.given)
    return config, inputs


def _scratch(ev, n: int) -> int:
    """The floats of scratch the rule asks for (for a batch of ``b_max``), for
    a batch of at most n requests."""
    return ev.scratch * min(ev.b_max, n) // ev.b_max if ev.scratch else 0


def _presample(plan: Plan, gen: np.random.Generator) -> np.ndarray:
    """``warmup`` predicted output lengths drawn from the workload before the
    run (Pang et al.'s pre-sample, arXiv:2503.05248): lengths from the
    output distribution (or resampled from its values), then the predictor's
    error, whole tokens."""
    m = plan.policy.warmup
    x = lengths(plan.workload._output, gen, m, integer=False, in_order=False)
    pred = plan.predictor
    if pred.code == _common.PRED_LOGNORMAL:
        x = x * np.exp(pred.sigma * gen.standard_normal(m))
    elif pred.code == _common.PRED_REPLAY:
        x = gen.choice(pred.values, size=m)
    if plan.workload.integer_lengths:
        x = np.maximum(np.ceil(x), 1.0)
    return x


def _preset_edges(plan: Plan, ss):
    """The bins set before the run, ``(lo, hi)``, or None (none, or Algorithm
    6 at the end of the warm-up)."""
    preset = plan.event.preset
    if preset == "edges":
        return plan.given_edges
    if preset == "presample":
        return _c.equal_mass_edges(_presample(plan, stream(ss, STREAM_PRESAMPLE)), plan.event.bins)
    if preset == "optimal":
        return plan.optimal_edges
    return None


def _given_edges(ev, workload) -> tuple:
    """Bins given in tokens (``ev.edges``), or equal mass on the workload's
    output lengths, as ``(lo, hi)``.  Bin i holds ``edges[i] <= x <
    edges[i+1]``, as MultiBin's, and a prediction below ``edges[0]`` bin 0
    (the kernel's fallback, the last bin, is never reached)."""
    e = ev.edges if ev.edges is not None else workload._output.equal_mass_edges(ev.bins)
    lo, hi = np.asarray(e[:-1], dtype=float).copy(), np.asarray(e[1:], dtype=float).copy()
    lo[0], hi[-1] = -np.inf, np.inf
    return lo, hi


def _optimal_edges(K: int, b_max: int, law) -> tuple:
    """theory.optimal_boundaries on the output-length distribution ``law``
    at B = b_max, floored and tiled like Algorithm 6's edges."""
    from .. import theory

    if K == 1:
        return np.zeros(1), np.full(1, _c.EDGE_MAX)
    e = np.floor(np.asarray(theory.optimal_boundaries(law, b_max, K), dtype=float))
    hi = e[1:].copy()
    hi[-1] = _c.EDGE_MAX
    lo = e[:-1].copy()
    lo[0] = 0.0
    return lo, hi


def _run(plan: Plan, ss, warn: bool, progress: bool) -> SimulationResult:
    ev, arrivals, workload, n = plan.event, plan.arrivals, plan.workload, plan.n
    cluster = plan.cluster
    config, inputs = plan.kernel_args
    streams = _d.TokenStreams(*(stream(ss, s) for s in (STREAM_ARRIVALS, STREAM_SERVICE, STREAM_PROMPT,
                                                          STREAM_PREDICTION)))
    cl_args = programs = None
    # (a cluster's programs' calls leased for the run: kept for the next unless the result holds them)
    with Lease(keep=not plan.keep_requests) as lease:
        if cluster is not None:
            inputs, cl_args, programs = cluster.prepare(plan, inputs, streams, lease)
        else:
            inputs = drawn_lengths(inputs, _d.INPUTS, workload, streams, n)
        args = (config, inputs, streams)
        stop = stop_flag()
        t0 = time.perf_counter()
        # bin confusion: each request's uniform from a key drawn on the prediction stream
        key = int(streams.prediction.integers(0, 2 ** 63)) if plan.predictor.code == _common.PRED_CONFUSION else 0
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
    requests = None
    if plan.keep_requests:
        cols = {k: v for k, v in req.items() if k != "engine" or cluster is not None}
        if programs is not None:
            cols.update(program=programs["program"], new_tokens=programs["new_tokens"])
        requests = Table({**cols, "latency": req["completion"] - req["arrival"]})
    q = quantiles(out.hist, requests.latency if requests is not None and completed else None)
    q_ttft = quantiles(out.hist_ttft, requests.ttft if requests is not None and completed else None)
    q_tbt = quantiles(out.hist_tbt, None)
    mean_b = st["sum_b"] / nb if nb else nan
    var_b = st["sum_b2"] / nb - mean_b ** 2 if nb else nan
    positive_span = bool(completed) and span > 0
    # (a cluster's engines each have `servers`)
    total_servers = plan.servers * (cluster.policy.engines if cluster is not None else 1)
    mem, sla = ev.memory, ev.sla
    extra = {
        "token_throughput": tokens_out / span if positive_span else nan,
        "mean_tbt": st["sum_tbt_tokens"] / tokens_out if tokens_out > 0 else nan,
        "mean_ttft": st["sum_ttft"] / completed if completed else nan,
        # (the requests within both their objectives: NaN where the workload sets neither)
        "goodput": st["good"] / completed if completed and plan.workload.has_objectives else nan,
        **{f"ttft_{k}": float(v) for k, v in zip(("p50", "p95", "p99"), q_ttft)},
        **{f"tbt_{k}": float(v) for k, v in zip(("p50", "p95", "p99"), q_tbt)},
        "sla_violation_tokens": st["sla_tokens"] / tokens_out if tokens_out > 0 else nan,
        "sla_violation_requests": st["sla_requests"] / completed if completed else nan,
        "sla_violation_share": st["sla_requests_dsla"] / completed if completed else nan,
        "memory_peak": st["peak_tokens"] / mem.eta,
        "mean_memory": st["token_seconds"] / (total_servers * span * mem.eta) if positive_span else nan,
        "std_batch_size": math.sqrt(max(var_b, 0.0)) if nb else nan,
        "mem_exceed_batches": st["mem_exceed"],
        "rejected": st["rejected"],
    }
    rows = st["ts_rows"]
    ts = {col: out.ts[:rows, getattr(_d.TS, col)].copy() for col in ("time", *TS_COLUMNS)}
    ts["queue"] = out.ts[:rows, _d.TS_QUEUE:_d.TS_QUEUE + ev.bins].copy()
    # (a cluster's queues by engine, for its backlog check: not a column of the time series)
    engine_queue = out.ts[:rows, _d.TS_QUEUE + ev.bins:] if cluster is not None else None
    if cluster is not None:
        extra.update(cluster.metrics(st))
    else:
        if "warmup" in plan.policy.reports:
            extra["warmup_time"] = st["warmup_time"]
        if ev.controlled:
            # infeasible: a controller still above D_SLA + eps_D with its interval
            # shrunk to B_min (the midpoint may sit higher: alpha, N_decode)
            C = _c.C
            sla_limit = sla.d_sla + sla.eps_d
            extra["sla_infeasible"] = any(
                out.ctl[b, C.updates] >= _c.SLA_WARMUP_UPDATES and out.ctl[b, C.tau_avg] > sla_limit
                and out.ctl[b, C.b_low] <= sla.b_min for b in range(ev.bins))
            extra["convergence_time"] = settled(ts["time"], ts["b_target"], st)
    metrics = assemble(plan.kind, RunTotals(
        completed=completed, span=span, sum_latency=st["sum_latency"], busy=st["busy"], servers=total_servers,
        batches=nb, members=st["sum_b"], latency_quantiles=q, group_latency=g_lat), extra)
    config = {**(plan.policy if cluster is None else cluster.policy).describe(), **arrivals.describe(),
              **workload.describe(), **model_config(plan.model), "n": n, "servers": int(plan.servers),
              "seed_entropy": entropy_str(ss)}
    batches = Table({k: v[:nb] for k, v in bat.items()}) if plan.keep_batches else None
    unstable, reason = steady_state(arrivals, n, lambda start, end: engines_backlog(
        ts["time"], ts["queue"], engine_queue, mean_b, start, end))
    # Algorithm 6's edges tile [lo[0], hi[K-1]): K + 1 of them, as MultiBin's
    edges = np.append(out.edges_lo, out.edges_hi[-1])
    arrays = {"batch_size_hist": out.size_hist, "group_mean_latency": g_lat, "latency_histogram": out.hist,
              **per_bin(out.bin_completed, out.bin_latency, span)}
    if cluster is not None:
        arrays.update(cluster.arrays(out, plan.servers, span, positive_span))
    res = SimulationResult(
        kind=plan.kind, config=config, n=n, servers=total_servers, edges=edges, metrics=metrics, arrays=arrays,
        requests=requests, batches=batches, time_series=ts, unstable=unstable, unstable_reason=reason,
        latency_quantiles="exact" if requests is not None else HISTOGRAM_QUANTILES,
        kernel_seconds=kernel_seconds)
    return finish(res, warn, stacklevel=5)
