"""A cluster of continuous-batching engines behind a router.

The requests arrive in time order (drawn before the run: their arrival
times, whole-token prompts and outputs, predicted outputs and, for the
calls of programs, their program, new tokens and last-call flag).  At each
arrival every engine is advanced (:func:`.continuous.continuous_kernel`,
resumed from the scalars it keeps) until an iteration would start at or
after that instant, so the router sees every completion up to it; then the
router (:func:`.routing.route_call`: round robin, least used, Autellix's
Algorithm 2, with a program table) picks the engine and the request joins
that engine's requests, joining its queue at the engine's next iteration
boundary, as one engine's arrivals do.  After the last arrival every engine
runs to its end.

Closed-loop programs make their arrivals as the engines run: a call
arrives after the one before it completes, so the engines run one
iteration at a time, the one whose iteration starts first next, each
logging its completions (``ws.done_log``), and a completion puts its
program's next call in a heap before any later iteration starts: a
deployment's closed-loop driver without its decode pool
(:func:`.disaggregated.run_cluster_closed`), its stage these engines, the
steps here its calls' arrivals (:func:`pop_call`, :func:`_arrive_call`).

Prefix caching (the engines' ``chain`` given: :mod:`.continuous`'s): each
engine caches the prefixes of the requests routed to it, in its own
blocks; the cache-aware router (:func:`.routing.cache_aware`) reads each
engine's cache of the request's chain as it stands at the arrival (after
every iteration that started before it: an iteration running across the
arrival has cached its blocks, as an engine reports a block when it is
scheduled to be filled).

KV reuse (Autellix: Luo et al., 2025, arXiv:2502.13965): a call routed to
the engine that holds its program's context (the engine of the program's
previous call) brings the KV cache of that context, ``prompt - new``
tokens: the engine takes the blocks of its whole prompt but prefills its
new tokens only (:mod:`.continuous`'s ``cached``).  The engine keeps a
program's context between its calls outside its block pool (a prefix cache
that is never evicted); preempted, a call loses its cache and prefills its
whole prompt and generated tokens again.

Engine events (:func:`_engine_event`): at an event's instant, before an
arrival at the same instant, every engine is advanced to it; an engine
joining is the router's again; one leaving is out of the router's choice,
and is advanced once more, to its first iteration boundary at or after the
instant, where it hands back the requests it has not admitted
(:func:`_hand_back`, in its admission order's order), and keeps running
those it admitted.  Each is routed again at the instant
(:func:`_reroute`), keeping its first arrival (``ws.origin``, which its
latency and time to first token count from) and joining its new engine at
the instant (``ws.arrival``).  An engine's requests keep their numbers
there (``ids``), those handed back left out of its records at the end.

An engine's arrays have room for every request it may be routed (the
run's ``n``), but those the kernel reads only after writing them start
unset (:data:`.continuous.UNSET`), so the memory a run touches is about
its requests' once, not once per engine (the per-request records, with
``keep``, excepted); an engine numbers its requests in the order they
reach it.  Each request's batch-means group is its group among the
cluster's arrivals.

The cluster's open loop is :mod:`.driver`'s, compiled with the engines'
steps (:data:`cluster_kernel`, its stage a :data:`ClusterStage`), pure
numba on arrays and scalars; :func:`run` sets the
engines up, and the Python side is :mod:`mbbatch.planners.continuous`.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import types
from numba.extending import overload

from .common import ARRIVED, STOP, blocks, event_arrays, helper, load_tuple, stage_step, step, variant
from .continuous import (C_COST, DONE, ES, N_COST, STALLED, C, continuous_kernel, prefix_blocks, published,
                         uses_full)
from .driver import open_loop_driver
from .layout import Layout
from . import admission
from . import continuous as _k
from . import routing as _r
from .programs import _heap_pop, _heap_push
from .routing import EN, ROUTE_CACHE_AWARE, TB, cache_aware, context, route, route_call, routed_call

__all__ = ["ROUTED", "ClusterStage", "Feed", "rows", "cluster_kernel", "run"]

#: the router's statistics: routing decisions, requests above the threshold,
#: requests the program table routed, calls with an earlier context, calls
#: served on the engine that held it, requests routed again (handed back by
#: an engine leaving); context tokens prefilled again (a call
#: away from its context), and over the decisions the most active requests of
#: an engine and their mean over the engines
ROUTED = Layout("continuous cluster routing", ints=("routes", "large", "table_hits", "followups", "kv_hits",
                                                   "rerouted"),
                floats=("kv_recomputed", "sum_active_max", "sum_active_mean"))
R = ROUTED.index

#: the engines' outputs that are counts a run adds to (its latency histograms), one row for all of a
#: cluster's engines (:func:`rows`): each engine adds its counts to it, their sum (the run's, as the engines'
#: rows added up gave it: :func:`_merged_counts`).  A row per engine spread the buckets a prefill pool's
#: requests land in over four times the cache, each request's two counts missing it
SHARED = ("hist", "hist_ttft", "hist_tbt")

#: an engine's inputs as the cluster writes them (the engine reads them
#: through read-only views): each request's prompt, output, predicted output,
#: the prompt tokens whose KV cache it brings and the seconds it takes to
#: pull it (a decode pool's), the instant it frees its blocks if it completes
#: before (a prefill pool's: :mod:`.continuous`'s ``release``), its class
#: and, with prefix caching, its chain and the tokens it shares with it
Feed = namedtuple("Feed", ("prompt", "output", "prediction", "cached", "pull", "release", "klass", "chain",
                           "shared"),
                  module=__name__)


def rows(stacked, e):
    """Engine ``e``'s row of ``stacked``, a tuple or namedtuple of arrays,
    each with a leading axis of engines: the same tuple of each array's row
    (views), the row of a field the engines share (:data:`SHARED`: a
    leading axis of one) the only one.  In numba, generated for each tuple
    type: the engines' arrays are rows of the cluster's (every engine of a
    cluster has arrays of the same shapes), so the driver holds a handful
    of arrays, not a list of engines, and hands an engine to the kernel at
    no cost."""
    return _like(stacked, [a[0 if f in SHARED else e] for f, a in zip(_names(stacked), stacked)])


def _names(t) -> tuple:
    """The field names of a tuple of arrays (a plain tuple's: none)."""
    return getattr(t, "_fields", ()) or ("",) * len(t)


def _like(t, items):
    """A tuple of ``items`` of the type of ``t`` (a namedtuple's or a plain one)."""
    return type(t)(*items) if hasattr(t, "_fields") else tuple(items)


# (not inline="always": numba's inlining of it dropped a write to the tuple's arrays made just before)
@overload(rows)
def _rows(stacked, e):
    k = len(stacked)
    names = stacked.instance_class._fields if isinstance(stacked, types.BaseNamedTuple) else ("",) * k
    args = ", ".join(f"stacked[{j}][{0 if names[j] in SHARED else 'e'}]" for j in range(k))
    if isinstance(stacked, types.BaseNamedTuple):
        ns = {"cls": stacked.instance_class}
        src = f"def impl(stacked, e):\n    return cls({args})\n"
    else:
        ns = {}
        src = f"def impl(stacked, e):\n    return ({args},)\n"
    exec(src, ns)
    return ns["impl"]


@step
def _completed_by(si, sf, t):
    """The requests an engine (its scalars ``si``, ``sf``) completed by time
    ``t``: it may have run one iteration past t (it started before t),
    whose completions come after."""
    return si[ES.completed_before] if sf[ES.now] > t else si[ES.completed]


@step
def _idle(si, count):
    """Whether an engine has nothing to do: every one of the ``count``
    requests routed to it joined, none waits or runs."""
    return si[ES.i] >= count and si[ES.running] == 0 and si[ES.waiting] == 0 and si[ES.nstack] == 0


#: the engine a driver resumes where it resumes engines most (at each arrival, or each iteration): the full
#: kernel, inlined there whatever numba's disk cache holds.  A call of :func:`.continuous.continuous_kernel`
#: copies its arguments, every array of the engine's, about 11 KB of stack: 170 ns a resume against 64 inlined,
#: and LLVM inlines that kernel only where it compiled it in the same process (one loaded from the cache is
#: called).  Inlined at the drivers' hot call site alone: their other resumes (setting up, running out, engine
#: events) call it.  It leaves out writing the run's statistics as it returns (25 ns a resume, a tenth of a
#: prefill pool's time): each driver writes every engine's once its run ends (:func:`_published_all`)
_inlined_engine = variant(step, continuous_kernel, "inlined_engine", PUBLISH=False)


@step
def _advance(e, count, until, config, control, inputs, out, requests, ws, streams, estop):
    """Engine e (``count`` requests routed to it so far) advanced until an
    iteration would start at or after ``until``: the engine inlined
    (:data:`_inlined_engine`), for a driver's hot loop."""
    ci, cf = config
    ci[e, C.n] = count
    cf[e, C.until] = until
    return _inlined_engine(rows(config, e), control, rows(inputs, e), streams, rows(out, e), rows(requests, e),
                           rows(ws, e), estop)


#: :func:`_advance`, the engine called (:func:`.continuous.continuous_kernel`): a driver's rare resumes
_advance_called = variant(step, _advance, "_advance_called", _inlined_engine=continuous_kernel)

#: :data:`_inlined_engine` without the full kernel's features (:data:`.continuous.lean_kernel`'s: FULL off),
#: and :func:`_advance` resuming it: a cluster's hot resumes where its engines need none of them
#: (:func:`lean_engines`).  Its code is smaller, and a resume, which loads and stores the engine's scalars
#: around it, about a sixth cheaper in a prefill pool's kernel
_inlined_lean_engine = variant(step, continuous_kernel, "inlined_lean_engine", FULL=False, PULLS=False,
                               PUBLISH=False)
_advance_lean = variant(step, _advance, "_advance_lean", _inlined_engine=_inlined_lean_engine)


@step
def _published_all(config, out, ws):
    """Every engine's statistics written from its scalars
    (:func:`.continuous.published`), as a driver's run ends: its hot
    resumes (:func:`_advance`) leave them out."""
    for e in range(config[0].shape[0]):
        published(rows(config, e), rows(out, e), rows(ws, e))


@step
def _matches(match, c, s, p, bs, pc):
    """Each engine's cached blocks of a request's prefix (``match[e]``):
    chain ``c`` (-1: none) of which it shares ``s`` tokens of its ``p``-token
    prompt (:func:`.continuous.prefix_blocks`, as an engine looks it up),
    ``pc[e, c]`` the blocks engine e caches."""
    k = prefix_blocks(s, p, bs) if c >= 0 else 0
    for e in range(match.shape[0]):
        match[e] = min(pc[e, c], k) if k > 0 else 0


@step
def fresh_record(requests, e, k):
    """Engine e's record of its k-th request started as
    :func:`.continuous.start` starts an engine's (no preemptions, no times:
    NaN), where the engines keep records (``requests``: theirs, stacked):
    a cluster's engines' records start unset, each row started as a request
    reaches its engine, so that a run touches its requests' rows once, not
    every engine's room for every request."""
    r_i, r_f = requests
    if r_f.shape[2] > 0:
        for f in range(r_i.shape[1]):
            r_i[e, f, k] = 0
        for f in range(r_f.shape[1]):
            r_f[e, f, k] = np.nan


@step
def _route(j, x, t, pid, new, last, n, groups, rt, ca, eng, table, rr_route, feeds, ws, requests, prompt, output,
           prediction, klass, brought, pull, release, chain, shared, match, counts, where, local, ids, routed, bs):
    """Request j (of ``n``), arriving at ``t`` with the prompt, output,
    prediction, class, KV cache brought (``brought``: its tokens, a decode
    pool's requests' whole prompts; empty: none, the engine holds what its
    program's context left), the seconds its pull takes (``pull``; empty:
    none), the instant it frees its blocks (``release``; empty: at its
    completion) and prefix of entry ``x`` of their arrays, a call of
    program ``pid`` with ``new`` tokens of its own (``last``: its program's
    last call), routed (the engines' active requests in ``eng`` as they
    stand at t) and fed to its engine (its record, ``requests``, started);
    the routing counted into ``routed``; where engines may leave, its number
    j kept by its engine's (``ids``; else empty) and its first arrival.
    Returns its engine and the round-robin pointer."""
    ri, rf = routed
    p = prompt[x]
    if p > rt.threshold:
        ri[R.large] += 1
    if rt.router == ROUTE_CACHE_AWARE:
        if chain.shape[0] > 0:
            _matches(match, np.int64(chain[x]), np.int64(shared[x]), np.int64(p), bs, ws.pc)
        e, most, total, count = cache_aware(eng, match, p, bs, ca)
        e, prefill, rr_route, hit, followup, held, most, mean = routed_call(rt, eng, table, e, p, pid, new, last,
                                                                            rr_route, False, most, total, count)
    else:
        e, prefill, rr_route, hit, followup, held, most, mean = route_call(rt, eng, table, p, pid, new, last,
                                                                           rr_route)
    ri[R.routes] += 1
    rf[R.sum_active_max] += most
    rf[R.sum_active_mean] += mean
    if hit:
        ri[R.table_hits] += 1
    if rt.programs:
        rf[R.kv_recomputed] += prefill - new
        if followup:
            ri[R.followups] += 1
        if held:
            ri[R.kv_hits] += 1
    k = counts[e]
    ws.arrival[e, k] = t
    ws.group[e, k] = (j * groups) // n
    fresh_record(requests, e, k)
    feeds.prompt[e, k] = p
    feeds.output[e, k] = output[x]
    feeds.prediction[e, k] = prediction[x]
    feeds.cached[e, k] = brought[x] if brought.shape[0] > 0 else p - prefill
    if pull.shape[0] > 0:
        feeds.pull[e, k] = pull[x]
    if release.shape[0] > 0:
        feeds.release[e, k] = release[x]
    if klass.shape[0] > 0:
        feeds.klass[e, k] = klass[x]
    if chain.shape[0] > 0:
        feeds.chain[e, k] = chain[x]
        feeds.shared[e, k] = shared[x]
    _placed(j, e, k, t, ws, counts, where, local, ids)
    return e, rr_route


@step
def _placed(j, e, k, origin, ws, counts, where, local, ids):
    """Request j is engine e's k-th; where engines may leave (``ids`` not
    empty), its number and its first arrival (``origin``) kept there."""
    where[j] = e
    local[j] = k
    counts[e] = k + 1
    if ids.shape[1] > 0:
        ids[e, k] = j
        ws.origin[e, k] = origin


@step
def _active(si, sf, counts, t, eng):
    """Each engine's active requests at ``t`` (the router's count): those
    routed to it, less those it handed back and those it completed by t."""
    for e in range(counts.shape[0]):
        eng[EN.active, e] = counts[e] - si[e, ES.handed] - _completed_by(si[e], sf[e], t)


@step
def _reroute(e1, k1, t, rt, eng, table, rr_route, feeds, ws, requests, counts, where, local, ids, calls, program,
             new_tokens, session_end, routed):
    """Engine e1's k1-th request, handed back at ``t``, routed again (the
    router's rule, not counted as a routing decision; a large call of
    programs to its program table's engine, as :func:`.routing.remove_engine`
    routes a run-to-completion engine's queued requests) to join its new
    engine at t: its inputs, batch-means group, first arrival and (closed
    loop: ``calls`` not empty) call id go along; with programs its KV
    reuse is its new engine's (whether that one holds its context), the
    context tokens prefilled again and the calls served where their
    context is counted by the difference.  Returns the round-robin
    pointer."""
    ri, rf = routed
    j = ids[e1, k1]
    p = feeds.prompt[e1, k1]
    pid, new, last = j, 0.0, False
    if rt.programs:
        pid, new, last = program[j], new_tokens[j], session_end[j] != 0
    e, rr_route, _, _, _, _ = route(rt.router, rt.threshold, p, pid, rt.programs, eng, rr_route, table)
    cached = feeds.cached[e1, k1]
    if rt.programs:
        was = p - cached
        prefill, _, hit = context(rt.kv, pid, e, p, new, table)
        rf[R.kv_recomputed] += prefill - was
        ri[R.kv_hits] += (1 if hit else 0) - (1 if was < p else 0)
        cached = p - prefill
        if last:
            table[TB.engine, pid] = -1
    eng[EN.active, e] += 1
    ri[R.rerouted] += 1
    k = counts[e]
    moved(e1, k1, e, k, t, cached, ws, feeds, requests)
    if calls.shape[1] > 0:
        calls[e, k] = calls[e1, k1]
    _placed(j, e, k, ws.origin[e1, k1], ws, counts, where, local, ids)
    return rr_route


@step
def moved(e1, k1, e, k, t, cached, ws, feeds, requests):
    """Engine e1's k1-th request, handed back, made engine e's k-th, joining
    it at ``t`` with ``cached`` prompt tokens' KV cache brought: its inputs
    (``feeds``, its pull and release too) and batch-means group go along, its record
    starts afresh; engine e wakes for it (:func:`woken`).  (Its first
    arrival, ``ws.origin``, is its caller's to keep.)"""
    ws.arrival[e, k] = t
    woken(ws, e)
    ws.group[e, k] = ws.group[e1, k1]
    fresh_record(requests, e, k)
    feeds.prompt[e, k] = feeds.prompt[e1, k1]
    feeds.output[e, k] = feeds.output[e1, k1]
    feeds.prediction[e, k] = feeds.prediction[e1, k1]
    feeds.cached[e, k] = cached
    if feeds.pull.shape[1] > 0:
        feeds.pull[e, k] = feeds.pull[e1, k1]
    if feeds.release.shape[1] > 0:
        feeds.release[e, k] = feeds.release[e1, k1]
    if feeds.klass.shape[1] > 0:
        feeds.klass[e, k] = feeds.klass[e1, k1]
    if feeds.chain.shape[1] > 0:
        feeds.chain[e, k] = feeds.chain[e1, k1]
        feeds.shared[e, k] = feeds.shared[e1, k1]


@step
def _hand_back(e, t, config, inputs, ws):
    """Engine e, leaving its cluster at the instant ``t`` and paused at its
    first iteration boundary at or after t with every request routed to it
    joined, hands back its waiting requests (not the preempted ones: those
    were admitted, and it keeps them): they leave its admission order one
    by one, as its head gives them (:func:`.admission.leave`), into
    ``ws.handed[e]`` after those it handed back before (``ES.handed`` in
    all), for the router to route again from t.  The time they count in
    the engine stops at t: the engine's time past it, ``late`` each, comes
    off its system-time integral, and off its waiting-time one for those
    that waited through its last iteration (not those that joined at this
    boundary, arrived after that iteration started)."""
    ci, cf = config[0][e], config[1][e]
    si, sf = ws.state_i[e], ws.state_f[e]
    wse, inp = rows(ws, e), rows(inputs, e)
    par = _k.order_parameters(ci, cf, load_tuple(cf[C_COST:C_COST + N_COST], N_COST), True)
    adm = ci[C.admission]
    q = (si[ES.qh], si[ES.ssize], si[ES.rr])
    waiting = si[ES.waiting]
    late = sf[ES.now] - t
    started = sf[ES.now] - sf[ES.last_iteration]
    h = si[ES.handed]
    fresh = 0
    for _ in range(waiting):
        r, b = admission.head(adm, True, q, par, wse, inp, si[ES.rounds])
        q = admission.leave(adm, True, q, r, b, par, wse, inp)
        ws.handed[e, h] = r
        h += 1
        if wse.arrival[r] > started:
            fresh += 1
    si[ES.handed] = h
    si[ES.qh], si[ES.ssize], si[ES.rr] = q
    si[ES.waiting] = 0
    sf[ES.system_time] -= late * waiting
    sf[ES.waiting_time] -= late * (waiting - fresh)


@step
def _engine_event(ev, events, config, control, inputs, out, requests, ws, streams, estop, rt, eng, table, rr_route,
                  feeds, counts, where, local, ids, calls, program, new_tokens, session_end, routed):
    """Engine event ``ev`` (``events``: their times, engines and 1 add / 0
    remove), at t: every engine advanced to t (as for an arrival); an
    engine joining is the router's again; one leaving is no longer, the
    program table forgets it (the programs it was assigned and the
    contexts it held), and it hands back its waiting requests (those it
    had not admitted: it finishes those it admitted, the preempted too),
    each routed again at t (:func:`_reroute`), in the order its admission
    order gives them.  Returns the code (``STALLED``, else ``DONE``) and
    the round-robin pointer."""
    times, engines, adds = events
    t = times[ev]
    e = engines[ev]
    si, sf = ws.state_i, ws.state_f
    for x in range(counts.shape[0]):
        if sf[x, ES.now] < t and not _idle(si[x], counts[x]):
            if _advance_called(x, counts[x], t, config, control, inputs, out, requests, ws, streams,
                               estop) == STALLED:
                return STALLED, rr_route
    if adds[ev] != 0:
        eng[EN.registered, e] = 1
        return DONE, rr_route
    eng[EN.registered, e] = 0
    if rt.programs:
        for pp in range(table.shape[1]):
            if table[TB.engine, pp] == e:
                table[TB.engine, pp] = -1
            if table[TB.holder, pp] == e:
                table[TB.holder, pp] = -1
    h = si[e, ES.handed]
    if not _idle(si[e], counts[e]):
        # (resumed, it joins what was routed to it and pauses at its boundary at or after t)
        if _advance_called(e, counts[e], t, config, control, inputs, out, requests, ws, streams,
                           estop) == STALLED:
            return STALLED, rr_route
        _hand_back(e, t, config, inputs, ws)
    _active(si, sf, counts, t, eng)
    for q in range(h, si[e, ES.handed]):
        rr_route = _reroute(e, ws.handed[e, q], t, rt, eng, table, rr_route, feeds, ws, requests, counts, where,
                            local, ids, calls, program, new_tokens, session_end, routed)
    return DONE, rr_route


@step
def _events_until(t, ev, events, config, control, inputs, out, requests, ws, streams, estop, rt, eng, table,
                  rr_route, feeds, counts, where, local, ids, calls, program, new_tokens, session_end, routed):
    """The engine events from ``ev`` on at or before ``t`` (an event before
    an arrival at its instant), in time order.  Returns the code, the next
    event and the round-robin pointer."""
    while ev < events[0].shape[0] and events[0][ev] <= t:
        code, rr_route = _engine_event(ev, events, config, control, inputs, out, requests, ws, streams, estop, rt,
                                       eng, table, rr_route, feeds, counts, where, local, ids, calls, program,
                                       new_tokens, session_end, routed)
        if code != DONE:
            return code, ev, rr_route
        ev += 1
    return DONE, ev, rr_route


@step
def _set_up(E, config, control, inputs, out, requests, ws, streams, estop):
    """Each engine's first call: it sets the engine up, no request yet."""
    for e in range(E):
        # (a count typed as the others', not the literal 0, or numba compiles the whole engine a second time)
        _advance_called(e, np.int64(0), -np.inf, config, control, inputs, out, requests, ws, streams, estop)


@step
def _run_out(n, counts, config, control, inputs, out, requests, ws, streams, stop, estop):
    """The ``n`` arrivals are over: each engine runs to its end, Ctrl-C
    passed on.  Returns the cluster's code."""
    si = ws.state_i
    for e in range(counts.shape[0]):
        estop[STOP] = stop[STOP]
        if not _idle(si[e], counts[e]):
            code = _advance_called(e, counts[e], np.inf, config, control, inputs, out, requests, ws, streams, estop)
            if code != DONE:
                return code
    _published_all(config, out, ws)
    stop[ARRIVED] = n
    return DONE


#: a cluster's engines as the open-loop driver's stage (:mod:`.driver`):
#: the engines' ``config``, ``inputs``, ``out``, ``requests`` and ``ws``,
#: the continuous kernel's, each array with a leading axis of engines
#: (``control``: one, shared), ``feeds`` their inputs' writable arrays; the
#: requests (``times`` ... ``session_end``: :func:`run`'s), ``groups``
#: batch-means groups of arrivals; ``rt`` the router
#: (:class:`.routing.Router`), ``ca`` the cache-aware router's settings
#: (:class:`.routing.CacheRouting`), ``eng`` the engines' counts
#: (:data:`.routing.ENGINES`, every engine registered), ``table`` the
#: program table (-1: none); per engine its requests (``counts``) and the
#: blocks of the arriving request's prefix it caches (``match``); per
#: request its engine (``where``) and its number there (``local``); each
#: engine's requests' numbers (``ids``; empty without events), the engine
#: ``events`` (their times, engines and 1 add / 0 remove, in time order;
#: empty: none), and the routing statistics (``routed``: :data:`ROUTED`)
ClusterStage = namedtuple("ClusterStage", ("config", "control", "inputs", "out", "requests", "ws", "feeds", "times",
                                           "prompt", "output", "prediction", "klass", "brought", "pull", "release",
                                           "chain", "shared", "program", "new_tokens", "session_end", "groups", "rt",
                                           "ca", "eng", "table", "counts", "match", "where", "local", "ids",
                                           "events", "routed"))


@stage_step
def _set_up_open_engines(st, streams, estop):
    """Each engine set up, no request yet; the router's round-robin pointer
    and the next engine event."""
    _set_up(st.counts.shape[0], st.config, st.control, st.inputs, st.out, st.requests, st.ws, streams, estop)
    return np.int64(0), np.int64(0)


@stage_step
def _arrival_engines(st, carry, j):
    return st.times[j]


@stage_step
def _until_engines(st, carry, t, stop, streams, estop):
    """The engine events at or before ``t`` (:func:`_events_until`), then
    each engine advanced until an iteration would start at or after ``t``
    (an engine idle, or paused at or after t, has nothing to do before t),
    its active requests at t counted for the router."""
    rr_route, ev = carry
    events = st.events
    if ev < events[0].shape[0] and events[0][ev] <= t:
        code, ev, rr_route = _events_until(t, ev, events, st.config, st.control, st.inputs, st.out, st.requests,
                                           st.ws, streams, estop, st.rt, st.eng, st.table, rr_route, st.feeds,
                                           st.counts, st.where, st.local, st.ids, st.ids[:, :0], st.program,
                                           st.new_tokens, st.session_end, st.routed)
        if code != DONE:
            return code, (rr_route, ev)
    si, sf = st.ws.state_i, st.ws.state_f
    counts = st.counts
    for e in range(counts.shape[0]):
        if sf[e, ES.now] < t and not _idle(si[e], counts[e]):
            if _advance(e, counts[e], t, st.config, st.control, st.inputs, st.out, st.requests, st.ws, streams,
                        estop) == STALLED:
                return STALLED, (rr_route, ev)
        st.eng[EN.active, e] = counts[e] - si[e, ES.handed] - _completed_by(si[e], sf[e], t)
    return DONE, (rr_route, ev)


@stage_step
def _arrive_open_engines(st, carry, j, t):
    """Request j, arriving at ``t``, routed to an engine (:func:`_route`):
    with programs, as its program's call."""
    rr_route, ev = carry
    pid, new, last = j, 0.0, False
    if st.rt.programs:
        pid, new, last = st.program[j], st.new_tokens[j], st.session_end[j] != 0
    e, rr_route = _route(j, j, t, pid, new, last, st.times.shape[0], st.groups, st.rt, st.ca, st.eng, st.table,
                         rr_route, st.feeds, st.ws, st.requests, st.prompt, st.output, st.prediction, st.klass,
                         st.brought, st.pull, st.release, st.chain, st.shared, st.match, st.counts, st.where,
                         st.local, st.ids, st.routed, st.config[0][0, C.block_size])
    return rr_route, ev


@stage_step
def _run_out_engines(st, carry, n, stop, streams, estop):
    """The engine events left, then each engine run to its end (:func:`_run_out`)."""
    rr_route, ev = carry
    code, ev, rr_route = _events_until(np.inf, ev, st.events, st.config, st.control, st.inputs, st.out, st.requests,
                                       st.ws, streams, estop, st.rt, st.eng, st.table, rr_route, st.feeds, st.counts,
                                       st.where, st.local, st.ids, st.ids[:, :0], st.program, st.new_tokens,
                                       st.session_end, st.routed)
    if code != DONE:
        return code
    return _run_out(n, st.counts, st.config, st.control, st.inputs, st.out, st.requests, st.ws, streams, stop, estop)


#: the cluster: the open-loop driver (:mod:`.driver`) compiled with its engines' steps; a request arriving at t
#: is routed once every engine has run each iteration starting before t, and the engine events at or before t
#: have come
cluster_kernel = open_loop_driver("cluster_kernel", __name__, _set_up_open=_set_up_open_engines,
                                  _arrival=_arrival_engines, _until=_until_engines,
                                  _arrive_open=_arrive_open_engines, _run_out=_run_out_engines)

#: :data:`cluster_kernel` resuming its engines as :data:`.continuous.lean_kernel` between arrivals
#: (:func:`lean_engines`; setting up and running out call the full kernel, which on a run without its
#: features computes what the lean one does, bit for bit)
cluster_kernel_lean = open_loop_driver(
    "cluster_kernel_lean", __name__, _set_up_open=_set_up_open_engines, _arrival=_arrival_engines,
    _until=variant(stage_step, _until_engines, "_until_lean_engines", _advance=_advance_lean),
    _arrive_open=_arrive_open_engines, _run_out=_run_out_engines)


def lean_engines(config, inputs, events) -> bool:
    """Whether a cluster's engines (``config``, ``inputs``: one engine's,
    unstacked) need none of :func:`.continuous.continuous_kernel`'s
    features (:func:`.continuous.uses_full`) and meet no engine ``events``
    (an engine handing requests back reads the full kernel's last
    iteration and first arrivals): :data:`cluster_kernel_lean` runs them."""
    return events[0].size == 0 and not uses_full(config, inputs)


@step
def released(e, k, landing, bs, feeds, ws):
    """Engine e's k-th request, completed holding its KV blocks until told
    (its ``release`` inf: :mod:`.continuous`'s), frees them at
    ``landing`` (:func:`.continuous.release_at`): the blocks of its prompt
    and output."""
    b = blocks(np.int64(feeds.prompt[e, k]) + np.int64(feeds.output[e, k]), bs, _k._shift(bs))
    _k.release_at(landing, b, ws.state_i[e], ws.state_f[e], ws.rel_t[e], ws.rel_b[e])


@step
def woken(ws, e):
    """Engine e given a request: it no longer sleeps until its next pull
    lands (:func:`_earliest`)."""
    ws.state_f[e, ES.wake] = -np.inf


@step
def starts(sf, e):
    """When engine e's next iteration may start: its ``now``, or, paused
    waiting for a pull to land with nothing else to run, its ``wake``."""
    at = sf[e, ES.now]
    return sf[e, ES.wake] if sf[e, ES.wake] > at else at


@step
def _earliest(si, sf, counts, t):
    """The engine (-1: none) whose next iteration starts first
    (:func:`starts`), before ``t`` (ties: the lower id), of those with
    something to do."""
    best = -1
    bt = t
    for e in range(counts.shape[0]):
        at = starts(sf, e)
        if at < bt and not _idle(si[e], counts[e]):
            best = e
            bt = at
    return best


@step
def pop_call(j, loop, hsize, got):
    """A closed loop's next call to arrive, the first of ``loop``'s heap
    (:func:`closed_loop_kernel`'s), as request j: a program's first call
    puts the next program's in the heap; its arrival, program, new tokens,
    last-call flag and call id written into ``got`` (those arrays).
    Returns its arrival, its call id and the heap's size."""
    start, gap, new_c, heap_t, heap_id = loop
    P = start.shape[0]
    K = gap.shape[0] // P
    t, kc, hsize = _heap_pop(heap_t, heap_id, hsize)
    if kc % K == 0 and kc // K + 1 < P:
        # a program starts: the next program's first call waits to arrive
        hsize = _heap_push(heap_t, heap_id, hsize, start[kc // K + 1], kc + K)
    times, program, new_tokens, session_end, call = got
    times[j] = t
    program[j] = kc // K
    new_tokens[j] = new_c[kc]
    session_end[j] = 1 if kc % K == K - 1 else 0
    call[j] = kc
    return t, kc, hsize


@step
def _arrive_call(j, n, loop, hsize, rr_route, groups, rt, ca, eng, table, feeds, ws, requests, prompt, output,
                 prediction, release, chain, shared, match, counts, where, local, ids, routed, bs, got):
    """A closed loop's next call to arrive (:func:`pop_call`) routed as
    request j of ``n``, the engines' active requests as they stand at its
    arrival (``release``: by call id, the instant its engine frees its KV
    blocks, :mod:`.continuous`'s; empty: at its completion).  Returns its
    engine, the round-robin pointer and the heap's size."""
    t, kc, hsize = pop_call(j, loop, hsize, got)
    _active(ws.state_i, ws.state_f, counts, t, eng)
    K = loop[1].shape[0] // loop[0].shape[0]
    # (no classes, no KV cache brought and none pulled: an empty row for each)
    e, rr_route = _route(j, kc, t, kc // K, loop[2][kc], kc % K == K - 1, n, groups, rt, ca, eng, table, rr_route,
                         feeds, ws, requests, prompt, output, prediction, feeds.klass[0], feeds.klass[0],
                         feeds.klass[0], release, chain, shared, match, counts, where, local, ids, routed, bs)
    return e, rr_route, hsize


@helper
def gathered(where, local, rows, out):
    """One field of the engines' records in the cluster's order: request
    j's value, number ``local[j]`` of engine ``where[j]``, from that
    engine's row of ``rows`` (engine, number: :func:`stacked_rows`), into
    ``out[j]``.  One pass in request order, reading each engine's row in
    its own order."""
    for j in range(out.shape[0]):
        out[j] = rows[where[j], local[j]]


def stacked_rows(rows: list) -> np.ndarray:
    """The engines' rows of one field (1-D arrays, in engine order) as one
    2-D array (engine, number), as :func:`gathered` reads them: a
    read-only view where they are rows of one array at an even spacing (a
    cluster's records, :class:`_Cluster`), else a copy, the shorter rows
    padded with zeros.  (A tuple of arrays indexed by an engine known only
    at run time compiles to a branch on it at every request; one array is
    read at its stride: three fields of 10^7 requests on four engines
    gathered in 0.24 s that way, 0.09 s this.)"""
    first = rows[0]
    longest = max(r.shape[0] for r in rows)
    base = first.base
    if (first.ndim == 1 and base is not None and base.flags.c_contiguous
            and all(r.base is base and r.dtype == first.dtype and r.strides == first.strides for r in rows)):
        starts = [r.__array_interface__["data"][0] for r in rows]
        step = starts[1] - starts[0] if len(rows) > 1 else 0
        low = base.__array_interface__["data"][0]
        end = starts[-1] + max(longest - 1, 0) * first.strides[0] + first.itemsize
        if (step >= 0 and all(s == starts[0] + e * step for e, s in enumerate(starts)) and starts[0] >= low
                and end <= low + base.nbytes):
            return np.lib.stride_tricks.as_strided(first, (len(rows), longest), (step, first.strides[0]),
                                                   writeable=False)
    out = np.zeros((len(rows), longest), first.dtype)
    for e, r in enumerate(rows):
        out[e, :r.shape[0]] = r
    return out


def _stacked(one, engines: int, unset=(), empty=None, leased=(), shared=()):
    """The tuple (or namedtuple) of arrays ``one`` for ``engines`` engines:
    each array with a leading axis of engines, every row a copy of it but
    for the fields ``unset`` (left as ``np.empty`` leaves them: their pages
    are touched only as the kernel writes them; those of them ``leased``
    made by ``empty(shape, dtype, name)``) and ``shared`` (one row, the
    engines' :func:`rows` read it)."""
    fields = getattr(one, "_fields", ())
    out = []
    for j, a in enumerate(one):
        name = fields[j] if fields else None
        if name in shared:
            s = a.copy()[None]
        else:
            if name in unset and name in leased:
                s = empty((engines, *a.shape), a.dtype, "ws." + name)
            else:
                s = np.empty((engines, *a.shape), a.dtype)
            if name not in unset:
                s[...] = a
        out.append(s)
    return _like(one, out)


def _merged_counts(out, e: int):
    """Engine e's outputs as a run's of its own, its share of the counts
    the engines share (:data:`SHARED`) their sum for engine 0 and zeros
    for the others: what each engine's add up to."""
    if e == 0:
        return out
    return out._replace(**{f: np.zeros_like(getattr(out, f)) for f in SHARED})


def run(config, times, prompt, output, prediction, edges, router, engines: int, streams, stop, **kw) -> tuple:
    """:func:`prepare`'s run, at once."""
    return prepare(config, times, prompt, output, prediction, edges, router, engines, streams, stop, **kw)()


def prepare(config, times, prompt, output, prediction, edges, router, engines: int, streams, stop, *,
            control=None, programs=None, groups: int = 1, ts_rows: int = 2, klass=None, class_slo=None,
            class_tpot=None, prefixes=None, cache_routing=None, brought=None, pull=None, release=None,
            events=None, lease=None):
    """The run with its arrays made, its kernel not called yet: a function
    of no arguments that calls it (so that a caller makes the arrays in its
    own thread and may run the kernel on another).  The run simulates
    ``engines`` engines of the continuous run ``config``
    (:data:`.continuous.CONFIG` ``.pack(...)``, its ``n`` the requests)
    behind ``router`` (:class:`.routing.Router`) on the requests' arrival
    ``times``, lengths and predictions (``edges``: the multi-bin admission's
    inner edges), ``programs`` the calls' ``(program, new_tokens,
    session_end)`` and the program table's size (None: every request its
    own program); ``klass`` each request's class and ``class_slo`` and
    ``class_tpot`` each class's objectives on the time to first token and
    per output token (None: no classes, no objectives); ``prefixes`` the
    engines' prefix caching, a dict of each request's ``chain`` and
    ``shared`` tokens and each chain's ``grows`` (None: none);
    ``cache_routing`` the cache-aware router's settings
    (:class:`.routing.CacheRouting`; None with another router); ``brought``
    the prompt tokens whose KV cache each request brings (a decode pool's:
    its whole prompt; None: none, a program's context aside); ``pull`` the
    seconds each takes to pull it (None: none; :mod:`.continuous`); ``release``
    the instant each frees its blocks if it completes before (None: at its
    completion; :mod:`.continuous`); ``events``
    the engine events, ``(time, engine, add)`` arrays in time order (None:
    none; :func:`_engine_event`); ``lease``: the :class:`.arena.Lease` the
    engines' per-request arrays come from (None: fresh ones; see
    :class:`_Cluster`).
    It returns each engine's ``(outputs, records, code)`` (as
    :func:`.continuous.run`'s, its requests in the order they reached it),
    each request's engine and number there, the routing statistics
    (``ROUTED.unpack``) and the code."""
    from .routing import TABLE

    klass = np.empty(0) if klass is None else np.ascontiguousarray(klass, float)
    brought = np.empty(0) if brought is None else np.ascontiguousarray(brought, float)
    pull = np.empty(0) if pull is None else np.ascontiguousarray(pull, float)
    release = np.empty(0) if release is None else np.ascontiguousarray(release, float)
    c = _Cluster(config, output, edges, engines, stop, control, groups, ts_rows, klass.size, class_slo, class_tpot,
                 prefixes, events=events, pulls=pull.size > 0, holds=release.size > 0, lease=lease)
    if programs is None:
        program = new_tokens = np.empty(0)
        session_end = np.empty(0, np.int8)
        size = 1
    else:
        (program, new_tokens, session_end), size = programs
    table = np.full((TABLE.size, max(size, 1)), -1, np.int64)
    times = np.ascontiguousarray(times, float)
    stage = ClusterStage(c.config, c.control, c.inputs, c.out, c.requests, c.ws, c.feeds, times,
                         np.ascontiguousarray(prompt, float), np.ascontiguousarray(output, float),
                         np.ascontiguousarray(prediction, float), klass, brought, pull, release, c.chain, c.shared,
                         np.ascontiguousarray(program, np.int64), np.ascontiguousarray(new_tokens, float),
                         np.ascontiguousarray(session_end, np.int8), np.int64(groups), router,
                         cache_routing or _r.NO_CACHE_ROUTING, c.eng, table, c.counts, np.zeros(engines, np.int64),
                         c.where, c.local, c.ids, c.events, c.routed)
    estop = np.zeros_like(stop)
    driver = cluster_kernel_lean if lean_engines(rows(c.config, 0), rows(c.inputs, 0), c.events) else cluster_kernel

    def go() -> tuple:
        code = driver(stage, times.shape[0], streams, stop, estop)
        return c.runs(code) + (ROUTED.unpack(c.routed), code)

    return go


class _Cluster:
    """The engines of a cluster run, set up for its kernel: each engine as
    :func:`.continuous.start` makes it (every array stacked along a leading
    axis of engines), their feeds, the routing counts and each request's
    engine and number there (``n`` requests: ``config``'s).  ``output`` the
    outputs the engines may be given, ``classes`` the requests' classes
    given (0: none), ``log`` each engine's completions' log, ``events`` the
    engine events (:func:`run`'s; None: none): with them the engines may
    hand requests back, and each keeps its requests' numbers (``ids``);
    ``pulls``: the engines' requests pull their KV caches (a decode pool's);
    ``holds``: they hold their blocks past completion (a prefill pool's);
    ``lease``: the :class:`.arena.Lease` the engines' per-request arrays
    (their feeds, records and unset workspace) come from (None: fresh
    ones).  Each engine's row of them has room for every request but is
    written only as far as its requests reach, so a run on fresh arrays
    maps fresh pages wherever the allocator put them (a result the caller
    holds moves them); leased, the next run writes the pages this one did.
    Each is counted as holding the bytes its rows' requests take
    (:meth:`.arena.Lease.charge`, at :meth:`runs`).  The records leased are
    the caller's to copy out before the lease closes."""

    def __init__(self, config, output, edges, engines, stop, control, groups, ts_rows, classes, class_slo,
                 class_tpot, prefixes, log: int = 0, events=None, pulls: bool = False, holds: bool = False,
                 lease=None):
        from .common import ARR_REPLAY, check_stop

        check_stop(stop)
        self.events = event_arrays(events)
        handing = self.events[0].size > 0
        cfg = _k.CONFIG.unpack(config)
        if handing and not admission.HANDS_BACK[cfg["admission"]]:
            name = list(admission.ORDERS)[cfg["admission"]]
            raise ValueError(f"events: an engine leaving hands its waiting requests back, which admission "
                             f"{name!r} cannot (it holds requests it preempted among them); the orders that can: "
                             f"{', '.join(o for o, ok in zip(admission.ORDERS, admission.HANDS_BACK) if ok)}")
        n = cfg["n"]
        # (each engine's room: its requests' numbers; a request handed back and routed again takes a new one, on
        # the same engine too once it joins again: at most n more for each engine leaving)
        self.room = room = n * (1 + int(np.count_nonzero(self.events[2] == 0)))
        self.keep = cfg["keep"]
        replay = {**cfg, "arrival_kind": ARR_REPLAY, "rate": 0.0}
        config = _k.CONFIG.pack(**replay)
        class_slo = np.full(1, np.inf) if class_slo is None else np.asarray(class_slo, float)
        class_tpot = np.full(class_slo.size, np.inf) if class_tpot is None else np.asarray(class_tpot, float)
        self.chain = np.ascontiguousarray(prefixes["chain"], float) if prefixes else np.empty(0)
        self.shared = np.ascontiguousarray(prefixes["shared"], float) if prefixes else np.empty(0)
        grows = np.asarray(prefixes["grows"], float) if prefixes else np.empty(0)
        given = {"klass": room if classes else 0, "chain": int(self.chain.size > 0) * room,
                 "shared": int(self.shared.size > 0) * room, "pull": room if pulls else 0,
                 "release": room if holds else 0}
        self.lease, self._leased = lease, []
        # (unset: _route writes an engine's k-th row as its k-th request reaches it, before the engine reads it; a
        # row's pages are touched only as it is written)
        self.feeds = Feed(*(self._empty((engines, given.get(f, room)), np.float64, "feed." + f) for f in Feed._fields))
        # (the template engine keeps no records: the engines' start unset, each row started as its request is
        # routed, fresh_record)
        one = _k.start(_k.CONFIG.pack(**{**replay, "keep": 0, "n": room}),
                       _k.INPUTS.pack(arrival_times=np.zeros(1), arrival_params=np.zeros(1),
                                      arrival_ends=np.full(1, np.inf),
                                      **{f: np.empty(given.get(f, room)) for f in Feed._fields},
                                      edges=edges, class_slo=class_slo, class_tpot=class_tpot, grows=grows),
                       control=control, groups=groups, ts_rows=ts_rows, grouped=True,
                       longest=int(np.max(output)) if output.size else 1, log=log, handing=handing)
        # (every engine starts as this one; its inputs are read-only views of the feeds)
        self.inputs = _k.INPUTS.type(*(_readonly(getattr(self.feeds, f) if f in Feed._fields
                                                 else _stacked((a,), engines)[0])
                                       for f, a in zip(one.inputs._fields, one.inputs)))
        self.config, self.out = _stacked(config, engines), _stacked(one.out, engines, shared=SHARED)
        m = room if self.keep else 0
        # (unset: fresh_record starts each row as its request is routed)
        self.requests = (self._empty((engines, len(_k.REQUESTS.ints), m), np.int64, "records.ints"),
                         self._empty((engines, len(_k.REQUESTS.floats), m), np.float64, "records.floats"))
        self.control = one.control
        # (the per-request arrays leased: each engine's row of them written as far as its requests reach)
        self.ws = _stacked(one.ws, engines, _k.UNSET + ("done_log",), self._empty, _k.UNSET)
        self.eng = np.zeros((_r.ENGINES.size, engines), np.int64)
        self.eng[_r.ENGINES.index.registered] = 1
        self.counts = np.zeros(engines, np.int64)
        self.where = np.empty(n, np.int64)
        self.local = np.empty(n, np.int64)
        self.routed = ROUTED.zeros()
        self.ids = np.empty((engines, room if handing else 0), np.int64)

    def _empty(self, shape: tuple, dtype, role: str) -> np.ndarray:
        """An unset array of ``shape`` (a leading axis of engines), from the
        lease where there is one."""
        if self.lease is None:
            return np.empty(shape, dtype)
        a = self.lease.empty(int(np.prod(shape)), dtype, "cluster." + role, shape=shape)
        self._leased.append(a)
        return a

    def runs(self, code) -> tuple:
        """Each engine's ``(outputs, records, code)``, each request's engine
        and number there.  An engine that handed requests back kept their
        numbers: its requests are renumbered, those it handed back left out
        (a request's number is its place among its engine's records)."""
        for a in self._leased:
            # (each engine's row written about as far as its share of the room, a page more in each of its
            # fields: the bytes charged)
            row, fields, room = a[0].nbytes, int(np.prod(a.shape[1:-1])), max(self.room, 1)
            self.lease.charge(a, sum(min(row, -(-row * int(c) // room) + 4096 * fields) for c in self.counts))
        runs = []
        for e, c in enumerate(self.counts):
            live = None
            if self.ids.shape[1] > 0:
                j = self.ids[e, :c]
                live = (self.where[j] == e) & (self.local[j] == np.arange(c))
                self.local[j[live]] = np.arange(np.count_nonzero(live))
            rec = None
            if self.keep:
                rec = {k: v[:c] if live is None else v[:c][live]
                       for k, v in _k.REQUESTS.rows(rows(self.requests, e)).items()}
            runs.append((_merged_counts(rows(self.out, e), e), rec, code))
        return runs, self.where, self.local


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v
