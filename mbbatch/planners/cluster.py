"""The planner of a cluster of engines behind a router (Autellix: Luo et al.,
2025, arXiv:2502.13965): the event kernel's plan (:mod:`.tokens`) for the
engines' policy, with the cluster's part: its router and engine events, and
its programs' calls (drawn before the run, or, in a closed loop, in the
kernel)."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, replace

import numpy as np

from .._kernels import common as _common
from .._kernels import controller as _c
from .._kernels import dynamic as _d
from .._kernels import programs as _p
from .._kernels import queues as _q
from .._kernels.arena import Lease
from .._kernels.routing import ROUTERS, CacheRouting, Router
from .._running import check_memory
from ..policies.cluster import Programs, Sessions
from ..predictors import Predictions
from . import continuous, tokens
from .common import drawn_lengths, exponentials, lengths, readonly

__all__ = ["Plan", "Part", "ContinuousPart", "check", "ORDER_CHUNK", "ORDER_CAP"]

#: a cluster's plan: the event kernel's, with the cluster's :class:`Part`
Plan = tokens.Plan


@dataclass(frozen=True, eq=False)
class Part:
    """The cluster's part of a token plan (:attr:`.tokens.Plan.cluster`)."""

    policy: object

    @property
    def draws_calls(self) -> bool:
        """Whether each run draws its programs' calls (synthetic programs):
        the kernel replays them."""
        return isinstance(self.policy.programs, Programs)

    def prepare(self, plan, inputs, streams, lease=None) -> tuple:
        """A run's inputs with its programs' calls, the kernel's cluster
        arguments ``(config, programs, events)`` and the programs' arrays
        (None without programs); open-loop programs' calls in arrays of
        ``lease`` (:class:`~mbbatch._kernels.arena.Lease`; None: fresh)."""
        cluster, workload, n = self.policy, plan.workload, plan.n
        programs = cluster.programs
        arrays = _p.NO_PROGRAMS
        if programs is None:
            inputs = drawn_lengths(inputs, _d.INPUTS, workload, streams, n)
        else:
            if isinstance(programs, Sessions):
                calls, arrays = _session_calls(programs, workload, n)
            elif programs.closed:
                calls, arrays = _closed_loop_calls(cluster, plan.arrivals, workload, n, streams)
            else:
                calls, arrays = _program_calls(cluster, plan.arrivals, workload, n, streams, lease)
            inputs = inputs._replace(**{k: readonly(v) for k, v in calls.items()})
        config, events = _pack(cluster, n)
        return inputs, (config, arrays, events), (arrays if programs is not None else None)

    def metrics(self, st: dict) -> dict:
        """The cluster's routing metrics (those of the tag ``router``), and
        those of continuous-batching engines its engines do not have."""
        return {**_router_metrics(st), **_NOT_ITERATIONS}

    def arrays(self, out, servers: int, span: float, positive_span: bool) -> dict:
        """The engines' completed requests and utilization."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"engine_completed": out.engine_completed,
                    "engine_utilization": out.engine_busy / (servers * span) if positive_span
                    else np.full(self.policy.engines, math.nan)}


@dataclass(frozen=True, eq=False)
class ContinuousPart:
    """The cluster's part of a continuous-batching plan
    (:attr:`.continuous.Plan.cluster`): its engines run
    :class:`~mbbatch.ContinuousBatching` behind its router
    (:mod:`mbbatch._kernels.continuous_cluster`)."""

    policy: object
    #: the engines serve each request's first token alone (a disaggregated
    #: deployment's prefill pool): its output is drawn (a program's calls'
    #: contexts grow by it) but each engine runs one output token
    first_token: bool = False
    #: the last programs' calls drawn (:meth:`calls`)
    _drawn: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def caching(self) -> bool:
        """Whether the engines cache prefixes (then a call's context is in
        its engine's cache, not brought along: no KV reuse of the router's)."""
        return bool(self.policy.policy.prefix_caching)

    @property
    def closed(self) -> bool:
        """Whether the programs are a closed loop (each call issued when the
        one before it completes: :func:`.disaggregated.run_cluster_closed`)."""
        programs = self.policy.programs
        return isinstance(programs, Programs) and programs.closed

    @property
    def router(self) -> Router:
        """The kernel's router: its code, threshold, programs and KV reuse."""
        cl = self.policy
        programs = cl.programs is not None
        return Router(ROUTERS[cl.router], cl.threshold, programs, bool(cl.kv_reuse and programs and not self.caching))

    @property
    def cache_routing(self) -> CacheRouting:
        """The cache-aware router's settings (read by that router only)."""
        cl = self.policy
        return CacheRouting(float(cl.cache_threshold), int(cl.balance_abs), float(cl.balance_rel))

    def prefixes(self, plan, prompt, programs, drawn: dict) -> dict | None:
        """The engines' prefix caching (:func:`.continuous_cluster.run`'s
        ``prefixes``; None without): the system prompts' chains ``drawn``
        (:func:`.continuous._requests`), or with programs each program a
        chain that grows (a session's context: each call shares with it its
        prompt but its new tokens), or none shared."""
        if not self.caching:
            return None
        if programs is not None:
            (program, new_tokens, _), size = programs
            return dict(chain=program.astype(float), shared=prompt - new_tokens, grows=np.ones(size))
        return drawn or continuous.no_prefixes(prompt.size)

    def memory(self, n: int) -> dict:
        """The memory the cluster adds to the engines' (``check_memory``'s parts)."""
        cl = self.policy
        parts = {"engines": (8 * 3 * n, "each request's engine and number there")}
        if cl.programs is not None:
            parts["programs"] = (8 * 14 * n, "the programs' calls, drawn before the run")
        if self.caching and cl.programs is not None:
            parts["prefix_caching"] = (cl.engines * 8 * 5 * cl.programs.table_size(n),
                                       "each engine's cache of each program's context")
        if cl.events:
            parts["events"] = (8 * 3 * n, "each request's number and first arrival on its engine, and the "
                                          "requests handed back")
        return parts

    def calls(self, plan, streams) -> tuple:
        """The programs' calls of a run: ``(times, prompt, output,
        programs)``, the calls' arrival times (None: the arrival process's),
        prompts (their programs' contexts and new tokens) and outputs, and
        the kernel's ``programs`` (the calls' program, new tokens and
        last-call flag, and the program table's size); all None without
        programs.  ``streams``: the run's arrival, prompt and output streams.
        A closed loop's (:attr:`closed`) are by call id, every call its
        programs may make (the run's requests are those that arrive first),
        no times, and its ``programs`` a dict of the programs' ``start`` and
        the calls' think times ``gap`` and ``new`` tokens
        (:func:`_program_draws`'s: the event kernel's closed loop draws the
        same)."""
        if self.policy.programs is None:
            return None, None, None, None
        # (a run asks for its calls more than once, its checks first, each time of streams fresh from its seed:
        # the last draw is kept, with its plan by a weak reference (a plan gone is never another's, and no cycle
        # holds the draw) and the streams' states before and after it, in one assignment; a draw asked again
        # returns the same arrays (no caller writes them) and leaves the streams as the draw left them)
        gens = (streams.arrival, streams.prompt, streams.output)
        states = repr([g.bit_generator.state for g in gens])
        last = self._drawn.get("last")
        if last is None or last[0]() is not plan or last[1] != states:
            got = self._draw(plan, streams)
            self._drawn["last"] = (weakref.ref(plan), states, got, [g.bit_generator.state for g in gens])
            return got
        for g, state in zip(gens, last[3]):
            g.bit_generator.state = state
        return last[2]

    def _draw(self, plan, streams) -> tuple:
        """:meth:`calls`, drawn."""
        cluster, workload, n = self.policy, plan.workload, plan.n
        programs = cluster.programs
        if self.closed:
            start, gap, new, out = _program_draws(cluster, plan.arrivals, workload, n, streams)
            return None, _contexts(new, out, programs.drawn(n)), out, dict(start=start, gap=gap, new=new)
        if isinstance(programs, Sessions):
            calls, arrays = _session_calls(programs, workload, n)
        else:
            calls, arrays = _program_calls(cluster, plan.arrivals, workload, n, streams)
        return (calls.get("arrival_times"), calls["prompt_values"], calls["output_values"],
                ((arrays["program"], arrays["new_tokens"], arrays["session_end"]), programs.table_size(n)))

    @property
    def events(self) -> tuple | None:
        """The kernel's engine events (:func:`event_arrays`)."""
        return event_arrays(self.policy.events)

    def metrics(self, routed: dict) -> dict:
        """The router's metrics (the tag ``router``) from the kernel's
        statistics (``ROUTED``); with prefix caching the engines' caches
        hold the programs' contexts, and the router's KV reuse metrics are
        NaN (``prefix_hit_rate`` tells)."""
        got = _router_metrics(routed)
        if self.caching:
            got.update(locality_hit_rate=math.nan, kv_recomputed_tokens=math.nan)
        return got


def event_arrays(events) -> tuple | None:
    """The kernel's engine events of ``events`` (:class:`~mbbatch.EngineEvent`,
    in time order): their ``(time, engine, add)`` arrays (None: none)."""
    if not events:
        return None
    return (np.array([e.time for e in events], float), np.array([e.engine for e in events], np.int64),
            np.array([e.action == "add" for e in events], np.int8))


def _router_metrics(st: dict) -> dict:
    """The router's metrics (the tag ``router``) from its kernel's counts."""
    nan = math.nan
    routes = st["routes"]
    return {
        "large_share": st["large"] / routes if routes else nan,
        "locality_hit_rate": st["kv_hits"] / st["followups"] if st["followups"] else nan,
        "kv_recomputed_tokens": st["kv_recomputed"] / routes if routes else nan,
        "load_imbalance": st["sum_active_max"] / st["sum_active_mean"] if st["sum_active_mean"] > 0 else nan,
        "rerouted": st["rerouted"],
    }


#: a cluster's metrics of continuous-batching engines (the tags
#: ``continuous`` and ``prefix``), on run-to-completion engines: no
#: preemption or eviction (0), no prefix cache (NaN), no running sequences
#: or KV blocks of theirs (their time between tokens is measured: the tag
#: ``tbt_quantiles``, as every token-level policy's)
_NOT_ITERATIONS = {"preemptions": 0, "recomputed_tokens": math.nan, "mean_running": math.nan,
                   "mean_in_system": math.nan, "mean_kv_usage": math.nan, "mean_max_num_seqs": math.nan,
                   "prefix_hit_rate": math.nan, "prefix_saved_tokens": math.nan, "kv_evictions": 0}


def check(cluster, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches, *,
          first_token: bool = False, prefilled: bool = False):
    """The checked plan of a ``simulate`` call of a :class:`~mbbatch.Cluster`:
    a token plan (:mod:`.tokens`) for run-to-completion engines, a
    continuous one (:mod:`.continuous`) for resumable engines
    (:attr:`~mbbatch.policies.base.Policy.resumable`: continuous batching);
    ``first_token``: the continuous engines serve each request's first
    token alone (:attr:`ContinuousPart.first_token`); ``prefilled``: each
    request brings its prompt's KV cache (a disaggregated deployment's
    decode pool behind a router)."""
    if isinstance(cluster.programs, Programs) and arrivals.spec not in ("poisson", "saturated"):
        raise TypeError(f"a Cluster with programs starts them as a Poisson process at the arrival rate / calls: "
                        f"arrivals must be Poisson(rate) (or Saturated); got {type(arrivals).__name__}")
    if cluster.policy.resumable:
        return _check_continuous(cluster, arrivals, service, n, servers, keep_requests, workload, service_model,
                                 keep_batches, first_token, prefilled)
    engine = cluster.policy.engine_form()
    plan = tokens.check(engine, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches)
    if isinstance(cluster.programs, Sessions):
        _check_sessions(cluster.programs, plan.workload)
    if cluster.programs is not None and cluster.programs.closed and plan.predictor.code == _common.PRED_LOGNORMAL:
        raise ValueError("closed-loop programs take the oracle, bin confusion or given predictions; got "
                         f"{plan.predictor} (each call's prediction is made as it arrives, which a log-normal "
                         "error's draws in arrival order cannot follow)")
    E, n = cluster.engines, plan.n
    K = plan.event.bins
    per_bin = _q.SLOT_BYTES * _q.QUEUE_START + 8 * (_c.CONTROLLER.size + _c.BATCH_STATS.size)
    parts = {"engines": ((E - 1) * (K * per_bin + 80 * min(plan.servers, n)), "the other engines' queues and servers")}
    if cluster.programs is not None:
        parts["programs"] = (8 * 14 * n, "the programs' calls, drawn before the run")
    return replace(plan, cluster=Part(cluster), memory=plan.memory + check_memory(parts))


def _check_continuous(cluster, arrivals, service, n, servers, keep_requests, workload, service_model,
                      keep_batches, first_token: bool = False, prefilled: bool = False) -> continuous.Plan:
    """The checked plan of a cluster of :class:`~mbbatch.ContinuousBatching`
    engines: what its kernel does not model yet is refused, named (engine
    events it cannot take: by :class:`~mbbatch.Cluster` itself,
    :func:`~mbbatch.policies.cluster.refuse_events`)."""
    if cluster.programs is not None and cluster.programs.closed and isinstance(cluster.policy.predictor,
                                                                                Predictions):
        raise ValueError("predictor: closed-loop programs on ContinuousBatching engines predict each call as its "
                         "program draws it (Oracle() or LogNormalError(sigma)); Predictions(values) are one per "
                         "request in arrival order, which a closed loop makes only as it runs")
    plan = continuous.check(cluster.policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                            keep_batches, prefilled=prefilled, cluster=ContinuousPart(cluster, first_token))
    if isinstance(cluster.programs, Sessions):
        _check_sessions(cluster.programs, plan.workload)
    return plan


def _check_sessions(sessions: Sessions, workload) -> None:
    """A trace's sessions need the trace's own lengths, in its order."""
    for name, spec in (("prompt", workload._prompt), ("output", workload._output)):
        if spec.kind != _common.SVC_REPLAY or spec.values.size != sessions.ids.size:
            raise ValueError(f"programs=Sessions(...) needs the workload's {name} lengths replayed from the same "
                             f"trace, one per session id ({sessions.ids.size}): Workload.from_trace(trace); got "
                             f"{spec.description}")


def _pack(cluster, n: int) -> tuple:
    """The kernel's cluster configuration and engine events."""
    programs = cluster.programs
    closed = programs is not None and programs.closed
    config = _d.CLUSTER.pack(engines=cluster.engines, router=ROUTERS[cluster.router], threshold=cluster.threshold,
                             programs=programs.table_size(n) if programs is not None else 0,
                             kv_reuse=bool(cluster.kv_reuse and programs is not None),
                             calls=programs.drawn(n) if closed else 0)
    ev = cluster.events
    events = dict(event_time=np.array([e.time for e in ev], float),
                  event_engine=np.array([e.engine for e in ev], np.int64),
                  event_add=np.array([e.action == "add" for e in ev], np.int8))
    return config, events


def _program_draws(cluster, arrivals, workload, n: int, streams, lease=None) -> tuple:
    """The draws of a cluster's ``P = ceil(n / calls)`` programs: ``(start,
    gap, new, out)``, the programs' starts (a Poisson process at ``rate /
    calls`` on the arrival stream; all 0 when saturated), then, by call id
    (call c of program p: p calls + c), the calls' gaps (think times,
    exponential, next on the arrival stream; 0 when saturated; a first
    call's is not used), new tokens (prompt stream) and outputs (output
    stream).  A program of more calls than the run draws its first ``n``
    (:meth:`~mbbatch.Programs.drawn`: calls is then C in the ids).  The
    arrays come from ``lease`` (:class:`~mbbatch._kernels.arena.Lease`;
    None: fresh ones)."""
    programs, think = cluster.programs, cluster.programs.think_time
    P, C = programs.table_size(n), programs.drawn(n)
    lease = lease or Lease(keep=False)
    start, gap = lease.empty(P, role="start"), lease.empty(P * C, role="gap")
    if arrivals.clock(n) is None:           # (saturated: every program at 0)
        start[:] = 0.0
        gap[:] = 0.0
    else:
        exponentials(streams.arrival, programs.calls / arrivals.rate, P, empty=lambda m: start)
        np.cumsum(start, out=start)
        if think > 0:
            exponentials(streams.arrival, think, P * C, empty=lambda m: gap)
        else:
            gap[:] = 0.0
    integer = bool(workload.integer_lengths)
    return (start, gap,
            lengths(workload._prompt, streams.prompt, P * C, integer, empty=lambda m: lease.empty(m, role="new")),
            lengths(workload._output, streams.output, P * C, integer, empty=lambda m: lease.empty(m, role="out")))


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
    span = _p.program_span(gap, C)
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


def _program_calls(cluster, arrivals, workload, n: int, streams, lease=None) -> tuple:
    """The first ``n`` calls of open-loop programs (:func:`_program_draws`),
    in arrival order: the kernel's inputs (their times: call c of a program
    at its start plus its gaps 1 .. c; prompts: the program's context so
    far plus the call's new tokens; outputs) and the programs' arrays (each
    call's program, new tokens and 1 on its program's last call).  The
    calls arrive by time, then id (a stable sort: chunk by chunk, or all at
    once when programs are far longer than the spacing of their starts);
    saturated, all at time 0, every program's first call first, then their
    second calls, and so on.  The calls' arrays come from ``lease``
    (:class:`~mbbatch._kernels.arena.Lease`; None: fresh ones)."""
    C = cluster.programs.drawn(n)
    lease = lease or Lease(keep=False)
    start, gap, new, out = _program_draws(cluster, arrivals, workload, n, streams, lease)
    N = new.size
    # (in place: the times overwrite the gaps, the calls' arrays their draws,
    # and `order` holds each call's program)
    saturated = arrivals.clock(n) is None
    times, ctx = gap, lease.empty(N, role="ctx")
    order = np.arange(N).reshape(-1, C).T.ravel() if saturated else lease.empty(N, np.int64, role="order")
    session_end = lease.empty(n, np.int8, role="session_end")
    chunks = None if saturated else _order_chunks(start, gap, C)
    if chunks is not None:
        chunk, cap, top = chunks
        # (a program's last call kept is tracked only when calls are left out)
        last = np.empty(start.size if n < N else 0, np.int64)
        written = _p.order_calls(start, gap, new, out, C, chunk, top, ctx, order, session_end, last,
                                 np.empty((3, cap, 4)), np.empty((3, cap), np.int64), np.empty(cap),
                                 np.empty(cap, np.int64), np.empty(cap // 2 + 2, np.int64))
        if written != N:
            raise RuntimeError(f"mbbatch: the programs' calls overflowed their chunks ({written} of {N} ordered); "
                               "please report this")
    else:
        hi = _p.call_times(start, gap, new, out, C, times, ctx)
        if not saturated and not _p.sort_calls(times, order, np.empty(N // 2 + 2, np.int64), times[0], hi):
            # (about 2 calls a bucket)
            order = np.argsort(times, kind="stable")
        _p.permute_calls(order, times, ctx, new, out, C, np.empty(start.size, np.int64), session_end)
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


def _contexts(new: np.ndarray, out: np.ndarray, C: int) -> np.ndarray:
    """Each call's prompt by call id (``C`` calls a program): its program's
    context, every earlier call's new tokens and output, and its own new
    tokens."""
    return (np.cumsum((new + out).reshape(-1, C), axis=1) - out.reshape(-1, C)).ravel()


def _session_calls(sessions: Sessions, workload, n: int) -> dict:
    """The first ``n`` calls of a trace's sessions, in request order: the
    kernel's prompt and output lengths (the trace's, repeated end to end;
    with ``context="added"`` each prompt is its session's context plus the
    trace's prompt) and the programs' arrays (each call's program, new
    tokens and last-call flag), as :func:`_program_calls` gives them."""
    integer = bool(workload.integer_lengths)
    prompt = lengths(workload._prompt, None, n, integer)
    out = lengths(workload._output, None, n, integer)
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
