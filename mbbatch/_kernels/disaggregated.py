"""Closed-loop programs on a disaggregated deployment: the prefill pool and
the decode pool run as two stages of resumable continuous engines in one
loop, a call's answer feeding its program's next call back to the router
(Patel et al., 2024, Splitwise, arXiv:2311.18677; Zhong et al., 2024,
DistServe, arXiv:2401.09670; the agents' closed loop of Luo et al., 2025,
Autellix, arXiv:2502.13965).

The stages are :mod:`.continuous_cluster`'s engines, each pool's arrays
stacked along a leading axis of engines:

- the **prefill pool**, behind the router (:func:`.continuous_cluster._route`),
  serves each call to its first token (its engines' requests are one
  output token long);
- a call of more than one output token is then **ready** for the decode
  pool at its first token; the ready calls join the **decode pool** in the
  order they become ready (ties in arrival order), dealt to its engines in
  turn; its engine admits it when its blocks allow, then pulls its
  prompt's KV cache, ``link[k]`` s (:mod:`.continuous`'s ``pull``), and
  generates its other ``output - 1`` tokens;
- its prefill engine holds its KV blocks from its first token until that
  pull lands (:mod:`.continuous`'s ``release``, inf: until told): each
  pull a decode engine starts is logged (``ws.pull_log``), and the stage
  frees the blocks at its landing (its ``_released`` step:
  :func:`.continuous_cluster.released`; LAPS's instances hold none);
- a call's client has its answer ``request_overhead`` after its last token
  (the decode engine's; a one-token call's, the prefill engine's), and its
  program's next call arrives its think time later.

The loop runs every engine of both pools one iteration at a time, the
iteration starting first going first, and hands a ready call to its decode
engine before any iteration starting at or after its instant: every event
(an arrival, a call ready, an iteration's start) is taken in time order,
so a completion puts its next call in the arrival heap before any later
iteration starts.  A cluster's closed loop is this driver without a decode
pool (:data:`cluster_closed_loop_kernel`, :func:`run_cluster_closed`).
Run open-loop, the two stages in one loop give what the
pools run one after the other give where the blocks held never keep a
prompt waiting (the decode pool then only reads the prefill pool's first
tokens): the planner (:mod:`mbbatch.planners.disaggregated`) runs them so
where it can tell, and in this loop otherwise.

One driver runs every prefill stage (:func:`closed_loop_kernel`): a
stage is a namedtuple of its arrays and nine steps of its own (set up,
its next event, its step, its engine event, an arrival, its statistics, a
pull landing:
the ``_*_engines`` steps of the continuous pool, :data:`EnginesPrefill`),
which the driver calls by name; :data:`laps_closed_loop_kernel` is the
driver compiled again with LAPS's steps (:func:`.common.variant`), its
stage LAPS's prefill instances (:data:`LapsPrefill`): the steps of
:mod:`.laps`'s kernel route each call as it arrives and run the
instances' batches, each batch's end an event in time order with the
decode pool's iterations.

Engine events come in time order with the rest, once every iteration
starting before them has run: a prefill engine's as a cluster's
(:func:`.continuous_cluster._engine_event`), a decode engine's by
:func:`_decode_event`, its requests not admitted dealt again
(:func:`_rehand`), each keeping its place among those the pool took.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import ARRIVED, STOP, blocks, event_arrays, helper, kernel, stage_step, step, variant
from .continuous import DONE, ES, STALLED, STOPPED, C
from .continuous_cluster import (ROUTED, _active, _advance, _advance_called, _arrive_call, _Cluster, _earliest,
                                 _engine_event, _hand_back, _idle, _published_all, _set_up, fresh_record, moved,
                                 pop_call, released, starts, woken)
from .driver import stop_asked
from . import laps as _l
from . import routing as _r
from .programs import _heap_pop, _heap_push

__all__ = ["EXCEEDS", "FITS", "TIGHT", "closed_loop_kernel", "cluster_closed_loop_kernel", "holds_fit",
           "laps_closed_loop_kernel", "run_closed", "run_cluster_closed", "run_closed_laps"]


@step
def _first_token(j, f, call, first, ready, link, d_output, delay, gap, K, heap_t, heap_id, hsize, r_t, r_id, rsize):
    """Request j's first token at ``f``: a call of more tokens ready for the
    decode pool then (its KV cache pulled later, ``link``), into the ready
    heap; a one-token call answered ``delay`` after it, its program's next
    call into the arrival heap, its think time after its client has the
    answer (:func:`_answered`'s rule).  Returns both heaps' sizes."""
    kc = call[j]
    first[j] = f
    if d_output[kc] > 0.0:
        ready[j] = f
        rsize = _heap_push(r_t, r_id, rsize, ready[j], j)
    elif (kc + 1) % K != 0:
        hsize = _heap_push(heap_t, heap_id, hsize, f + delay + gap[kc + 1], kc + 1)
    return hsize, rsize


@step
def _first_tokens(log, logged, reqs, call, first, ready, link, d_output, delay, gap, K, heap_t, heap_id, hsize,
                  r_t, r_id, rsize):
    """A prefill engine's completions since its log was emptied (``log``,
    ``logged`` of them; ``reqs``: each of its requests' number in arrival
    order), each its first token (:func:`_first_token`).  Returns both
    heaps' sizes."""
    for q in range(logged):
        hsize, rsize = _first_token(reqs[np.int64(log[0, q])], log[1, q], call, first, ready, link, d_output, delay,
                                    gap, K, heap_t, heap_id, hsize, r_t, r_id, rsize)
    return hsize, rsize


#: the decode pool of a closed loop, its engines' arrays (each stacked along
#: a leading axis of engines: :class:`.continuous_cluster._Cluster`'s
#: ``config`` ... ``counts``), how it deals (``route``: 0 in turn, 1 to the
#: engine least used, its engines' loads in ``eng``), each engine's
#: requests (``reqs``: their numbers in arrival order), each request's
#: engine and number there in the order the pool takes them (``placed``)
#: and its place in that order (``taken``, kept where its engines may
#: leave), its engine ``events``, and by call id the calls' outputs
#: (``output - 1``) and predictions there
DecodePool = namedtuple("DecodePool", ("config", "control", "inputs", "out", "requests", "ws", "feeds", "counts",
                                       "route", "eng", "reqs", "placed", "taken", "events", "output",
                                       "prediction"))


@step
def _answers(log, logged, e, d_reqs, call, delay, gap, K, heap_t, heap_id, hsize):
    """Decode engine e's completions since its log was emptied (its k-th
    request ``d_reqs[e, k]``): each call answered, its program's next call
    into the arrival heap.  Returns its size."""
    for q in range(logged):
        kc = call[d_reqs[e, np.int64(log[0, q])]]
        if (kc + 1) % K != 0:
            hsize = _heap_push(heap_t, heap_id, hsize, log[1, q] + delay + gap[kc + 1], kc + 1)
    return hsize


@step
def _deal(t, dec, d_rr):
    """The decode engine a request ready at ``t`` goes to: in turn from
    ``d_rr`` among the engines in the pool (``dec.route`` 0; the m-th
    request to engine ``m % D`` while none has left), or (1) the engine
    least used at t, by the cluster's rule (:func:`.routing.scan_engines`,
    on the engines' active requests then, written into ``dec.eng``: those
    dealt to it, less those it handed back and those it completed).
    Returns the engine and the pointer after it."""
    D = dec.counts.shape[0]
    if dec.route == 0:
        e = d_rr
        while dec.eng[_r.EN.registered, e] == 0:
            e = e + 1 if e + 1 < D else 0
        return e, (e + 1 if e + 1 < D else 0)
    _active(dec.ws.state_i, dec.ws.state_f, dec.counts, t, dec.eng)
    return _r.scan_engines(dec.eng)[0], d_rr


@step
def _hand(j, t, m, n, groups, dec, d_rr, prompt, call, handed, link):
    """Request j, ready at ``t``, the ``m``-th the decode pool takes: to
    its engine (:func:`_deal`), bringing its prompt's KV cache (pulled in
    ``link`` s of its call id, once admitted), its
    batch-means group its group among the ``n`` arrivals; recorded as the
    engine's next request (``dec.reqs``), by ``m`` its engine and number
    there (``dec.placed``), and, where decode engines may leave (the
    pool's ``ws.origin`` not empty), its ``m`` (``dec.taken``) and first
    arrival at the pool.  Returns the dealing pointer."""
    e, d_rr = _deal(t, dec, d_rr)
    d_ws, d_feeds = dec.ws, dec.feeds
    k = dec.counts[e]
    kc = call[j]
    d_ws.arrival[e, k] = t
    d_ws.group[e, k] = (j * groups) // n
    fresh_record(dec.requests, e, k)
    d_feeds.prompt[e, k] = prompt[kc]
    d_feeds.output[e, k] = dec.output[kc]
    d_feeds.prediction[e, k] = dec.prediction[kc]
    d_feeds.cached[e, k] = prompt[kc]
    d_feeds.pull[e, k] = link[kc]
    woken(d_ws, e)
    dec.counts[e] = k + 1
    handed[m] = j
    dec.reqs[e, k] = j
    dec.placed[0, m] = e
    dec.placed[1, m] = k
    if d_ws.origin.shape[1] > 0:
        d_ws.origin[e, k] = t
        dec.taken[j] = m
    return d_rr


@step
def _take_ready(dec, rheap, rsize, m, n, groups, d_rr, prompt, call, handed, link):
    """The first call of the ready heap ``rheap`` joins the decode pool
    (:func:`_hand`).  Returns the heap's size, the calls the pool took and
    the dealing pointer."""
    r, jr, rsize = _heap_pop(rheap[0], rheap[1], rsize)
    d_rr = _hand(jr, r, m, n, groups, dec, d_rr, prompt, call, handed, link)
    return rsize, m + 1, d_rr


@step
def _decode_iteration(d, sd, dec, streams, estop, call, gap, K, heap_t, heap_id, hsize):
    """Decode engine d's iteration starting at ``sd``, run; each call it
    completes answered (:func:`_answers`, its client ``request_overhead``
    after it).  Returns the code and the arrival heap's size."""
    si = dec.ws.state_i
    si[d, ES.logged] = 0
    if _advance(d, dec.counts[d], np.nextafter(sd, np.inf), dec.config, dec.control, dec.inputs, dec.out,
                dec.requests, dec.ws, streams, estop) == STALLED:
        return STALLED, hsize
    delay = dec.config[1][0, C.request_overhead]
    return DONE, _answers(dec.ws.done_log[d], si[d, ES.logged], d, dec.reqs, call, delay, gap, K, heap_t, heap_id,
                          hsize)


@step
def _decode_turn(d, sd, td, dev, dec, d_rr, streams, estop, call, gap, K, heap_t, heap_id, hsize):
    """The decode pool's turn in a closed loop: engine d's iteration starting
    at ``sd`` (:func:`_decode_iteration`; ``d`` -1: none before the next
    instant), else its engine event ``dev`` at ``td``, once every iteration
    starting before it has run (:func:`_decode_event`).  Returns the code,
    the arrival heap's size, the dealing pointer, the next event and the
    engine that ran (its pulls started logged: ``ws.pull_log``)."""
    if d >= 0:
        code, hsize = _decode_iteration(d, sd, dec, streams, estop, call, gap, K, heap_t, heap_id, hsize)
        return code, hsize, d_rr, dev, d
    code, d_rr = _decode_event(dev, td, dec, d_rr, streams, estop)
    return code, hsize, d_rr, dev + 1, dec.events[1][dev]


@step
def _rehand(d, k1, t, dec, d_rr):
    """Decode engine d's k1-th request, handed back at ``t`` (its engine
    leaving), dealt again (:func:`_deal`) to join its new engine at t,
    keeping its inputs, group, first arrival at the pool and place ``m``
    among the requests the pool took.  Returns the dealing pointer."""
    j = dec.reqs[d, k1]
    e, d_rr = _deal(t, dec, d_rr)
    k = dec.counts[e]
    moved(d, k1, e, k, t, dec.feeds.cached[d, k1], dec.ws, dec.feeds, dec.requests)
    dec.ws.origin[e, k] = dec.ws.origin[d, k1]
    dec.counts[e] = k + 1
    dec.reqs[e, k] = j
    m = dec.taken[j]
    dec.placed[0, m] = e
    dec.placed[1, m] = k
    return d_rr


@step
def _decode_event(ev, t, dec, d_rr, streams, estop):
    """Decode engine event ``ev`` at ``t``, every decode iteration starting
    before t run: an engine joining is dealt requests again; one leaving is
    no longer, and hands back the requests it had not admitted
    (:func:`.continuous_cluster._hand_back`), each dealt again at t
    (:func:`_rehand`).  Returns the code and the dealing pointer."""
    e = dec.events[1][ev]
    d_ws = dec.ws
    if dec.events[2][ev] != 0:
        dec.eng[_r.EN.registered, e] = 1
        return DONE, d_rr
    dec.eng[_r.EN.registered, e] = 0
    h = d_ws.state_i[e, ES.handed]
    if not _idle(d_ws.state_i[e], dec.counts[e]):
        d_ws.state_i[e, ES.logged] = 0
        if _advance_called(e, dec.counts[e], t, dec.config, dec.control, dec.inputs, dec.out, dec.requests, d_ws,
                           streams, estop) == STALLED:
            return STALLED, d_rr
        _hand_back(e, t, dec.config, dec.inputs, d_ws)
    for q in range(h, d_ws.state_i[e, ES.handed]):
        d_rr = _rehand(e, d_ws.handed[e, q], t, dec, d_rr)
    return DONE, d_rr


#: a continuous prefill pool as a closed loop's first stage: its engines
#: (:func:`.continuous_cluster.cluster_kernel`'s ``config`` ... ``counts``),
#: by call id its engines' ``output`` and ``prediction`` (one token) and
#: prefix ``chain`` and ``shared`` tokens, the router's arrays (``rt`` ...
#: ``routed``), ``reqs`` each engine's requests' numbers in arrival order
#: and ``ids`` (``reqs`` where a request routed again is numbered, or empty
#: without engine ``events``); by call id the instant each call's engine
#: frees its KV blocks (``release``: inf, until its pull lands, for a call
#: the decode pool takes, -inf for one of one token; empty: at its first
#: token)
EnginesPrefill = namedtuple("EnginesPrefill", ("config", "control", "inputs", "out", "requests", "ws", "feeds",
                                               "counts", "output", "prediction", "chain", "shared", "rt", "ca", "eng",
                                               "table", "match", "where", "local", "reqs", "ids", "events", "routed",
                                               "release"))

#: LAPS's prefill instances as a closed loop's first stage
#: (:func:`.laps.laps_kernel`'s ``config``, ``out``, ``requests``, ``ws``,
#: its ``n`` the calls routed) and their ``events``
LapsPrefill = namedtuple("LapsPrefill", ("config", "out", "requests", "ws", "events"))


# A stage's steps, each stage's own, each a ``stage_step`` (the driver,
# :func:`closed_loop_kernel`, calls them by these names;
# :data:`laps_closed_loop_kernel` is the driver with LAPS's):
#   _set_up_stage(pre, n, first, streams, estop) -> carry: the stage ready, its
#       loop-carried state (scalars) before the first arrival at ``first``;
#   _event_time(pre, carry): its next engine event's instant (inf: none);
#   _next(pre, carry, cap, t, td, te) -> (instant, which): its next step
#       before ``cap`` (inf: none), given the next arrival ``t``, decode
#       event ``td`` and its own event ``te``;
#   _ready_first(r, instant): whether a call ready at ``r`` joins the decode
#       pool before the stage's step at ``instant``;
#   _step(pre, carry, instant, which, ...) -> (code, carry, hsize, rsize):
#       the step, each call it serves to its first token handed on
#       (:func:`_first_token`);
#   _event(pre, carry, te, arrived, streams, estop) -> (code, carry): its
#       engine event at ``te``;
#   _arrive(pre, carry, j, n, loop, hsize, groups, prompt, arrived) ->
#       (carry, hsize): the next call, request j, routed into the stage;
#   _finish(pre, carry, n): its statistics written;
#   _released(pre, j, landing): request j's KV cache read by its decode
#       engine, the pull landing at ``landing``.

@step
def _event_at(events, ev):
    """The instant of engine event ``ev`` of ``events`` (inf: none left)."""
    return events[0][ev] if ev < events[0].shape[0] else np.inf


@stage_step
def _set_up_engines(pre, n, first, streams, estop):
    _set_up(pre.counts.shape[0], pre.config, pre.control, pre.inputs, pre.out, pre.requests, pre.ws, streams, estop)
    # (the router's round-robin pointer, the next engine event)
    return np.int64(0), np.int64(0)


@stage_step
def _event_time_engines(pre, carry):
    return _event_at(pre.events, carry[1])


@stage_step
def _next_engines(pre, carry, cap, t, td, te):
    """The prefill engine whose iteration starts first before ``cap``."""
    ws = pre.ws
    e = _earliest(ws.state_i, ws.state_f, pre.counts, cap)
    return (starts(ws.state_f, e) if e >= 0 else np.inf), e


@stage_step
def _ready_first_engines(r, sp):
    # (a call ready joins the decode pool before any iteration starting at or after it)
    return r <= sp


@stage_step
def _step_engines(pre, carry, sp, e, call, first, ready, link, d_output, gap, K, heap_t, heap_id, hsize, rheap,
                  rsize, streams, estop):
    """Prefill engine e's iteration starting at ``sp``, each call it
    completes at its first token (:func:`_first_tokens`)."""
    si = pre.ws.state_i
    si[e, ES.logged] = 0
    if _advance(e, pre.counts[e], np.nextafter(sp, np.inf), pre.config, pre.control, pre.inputs, pre.out,
                pre.requests, pre.ws, streams, estop) == STALLED:
        return STALLED, carry, hsize, rsize
    delay = pre.config[1][0, C.request_overhead]
    hsize, rsize = _first_tokens(pre.ws.done_log[e], si[e, ES.logged], pre.reqs[e], call, first, ready, link,
                                 d_output, delay, gap, K, heap_t, heap_id, hsize, rheap[0], rheap[1], rsize)
    return DONE, carry, hsize, rsize


@stage_step
def _event_engines(pre, carry, te, arrived, streams, estop):
    """A prefill engine leaves or joins (:func:`.continuous_cluster._engine_event`)."""
    rr_route, ev = carry
    _, program, new_tokens, session_end, _ = arrived
    code, rr_route = _engine_event(ev, pre.events, pre.config, pre.control, pre.inputs, pre.out, pre.requests, pre.ws,
                                   streams, estop, pre.rt, pre.eng, pre.table, rr_route, pre.feeds, pre.counts,
                                   pre.where, pre.local, pre.ids, pre.ids[:, :0], program, new_tokens, session_end,
                                   pre.routed)
    return code, (rr_route, ev + 1)


@stage_step
def _arrive_engines(pre, carry, j, n, loop, hsize, groups, prompt, arrived):
    """The next call routed to a prefill engine (:func:`.continuous_cluster._arrive_call`)."""
    rr_route, ev = carry
    e, rr_route, hsize = _arrive_call(j, n, loop, hsize, rr_route, groups, pre.rt, pre.ca, pre.eng, pre.table,
                                      pre.feeds, pre.ws, pre.requests, prompt, pre.output, pre.prediction,
                                      pre.release, pre.chain, pre.shared, pre.match, pre.counts, pre.where, pre.local,
                                      pre.ids, pre.routed, pre.config[0][0, C.block_size], arrived)
    pre.reqs[e, pre.local[j]] = j
    return (rr_route, ev), hsize


@stage_step
def _finish_engines(pre, carry, n):
    """The engines' statistics written (their hot resumes leave them out)."""
    _published_all(pre.config, pre.out, pre.ws)


@stage_step
def _released_engines(pre, j, landing):
    """Request j's prefill engine frees its KV blocks as the pull lands,
    where it holds them (:func:`.continuous_cluster.released`)."""
    if pre.release.shape[0] > 0:
        released(pre.where[j], pre.local[j], landing, pre.config[0][0, C.block_size], pre.feeds, pre.ws)


@stage_step
def _set_up_laps(pre, n, first, streams, estop):
    config, ws = pre.config, pre.ws
    ttft_slo = config[1][_l.C.ttft_slo]
    G = pre.out.group_ttft.shape[1]
    s = _l.settings(config) + (ttft_slo, ttft_slo < np.inf, G)
    _l._set_up(config[0][_l.C.instances], s[3], config[0][_l.C.long0], ws)
    # (the settings; the router; the requests pending short and long; completed, batches, short, first tokens
    # within the objective; busy time, the sums of the times to first token (all, short, long) and of the batch
    # sizes; the last batch end; the next instance event)
    return (s, _l._router_state(n, G, first), 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, -np.inf, 0)


@stage_step
def _event_time_laps(pre, carry):
    return _event_at(pre.events, carry[14])


@stage_step
def _next_laps(pre, carry, cap, t, td, te):
    """LAPS's next event, its own order: a batch end at or before the
    arrival or an instance's event (before a decode event), a window
    before them."""
    ws = pre.ws
    t_c, e_c, t_w, e_w = _l._next_events(ws.t_done, ws.qn, ws.deadline, carry[0][6])
    lt = np.inf
    if e_c >= 0 and t_c <= t_w:
        if t_c <= t and t_c < td and t_c <= te:
            lt = t_c
    elif e_w >= 0 and t_w < cap:
        lt = t_w
    return lt, (e_c, t_c, e_w)


@stage_step
def _ready_first_laps(r, lt):
    # (a batch ending at or before a ready call's instant goes first: its calls may be ready then too)
    return r < lt


@stage_step
def _step_laps(pre, carry, lt, which, call, first, ready, link, d_output, gap, K, heap_t, heap_id, hsize, rheap,
               rsize, streams, estop):
    """An instance's batch end at ``lt`` (each of its calls at its first
    token, :func:`_first_token`: LAPS's instances add no time outside
    them), or its window's; then its next batch if one is due."""
    e_c, t_c, e_w = which
    s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev = carry
    threshold, max_batch, dual, dynamic, keep, window, windowed, max_batch_tokens, interval, ratio, a, b, ttft_slo, \
        counted, G = s
    ws, r_f = pre.ws, pre.requests[1]
    if e_c >= 0 and lt == t_c:
        e = e_c
        completed += ws.batch_n[e]
        sum_ttft, sum_s, sum_l, pending_s, pending_l, good = _l._end_batch(
            e, lt, ws, pre.out, r_f, keep, counted, ttft_slo, sum_ttft, sum_s, sum_l, pending_s, pending_l, good)
        last = lt
        for k in range(ws.batch_n[e]):
            hsize, rsize = _first_token(ws.batch[e, k], lt, call, first, ready, link, d_output, 0.0, gap, K, heap_t,
                                        heap_id, hsize, rheap[0], rheap[1], rsize)
    else:
        e = e_w
    if ws.t_done[e] == np.inf:
        n_batches, busy, sum_batch = _l._start_batch(e, lt, dual, window, max_batch, max_batch_tokens, a, b, ws, r_f,
                                                     keep, n_batches, busy, sum_batch)
    return DONE, (s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l,
                  sum_batch, last, ev), hsize, rsize


@stage_step
def _event_laps(pre, carry, te, arrived, streams, estop):
    """An instance leaves or joins: its queue handed back to the router,
    each request routed again (:func:`.laps._engine_event`)."""
    s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev = carry
    threshold, max_batch, dual, dynamic, keep, window, windowed, max_batch_tokens, interval, ratio, a, b, ttft_slo, \
        counted, G = s
    ws, (r_i, r_f) = pre.ws, pre.requests
    router, back = _l._engine_event(pre.events[1][ev], pre.events[2][ev] != 0, te, dual, window, dynamic, ws, r_i,
                                    keep, router)
    if back:
        n_batches, busy, sum_batch = _l._start_idle(te, dual, window, max_batch, max_batch_tokens, a, b, ws, r_f, keep,
                                                    n_batches, busy, sum_batch)
    return DONE, (s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l,
                  sum_batch, last, ev + 1)


@stage_step
def _arrive_laps(pre, carry, j, n, loop, hsize, groups, prompt, arrived):
    """The next call, routed by LAPS's router into an instance's queue
    (:func:`.laps._arrive`); the instance starts a batch if idle and one
    is due."""
    s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev = carry
    threshold, max_batch, dual, dynamic, keep, window, windowed, max_batch_tokens, interval, ratio, a, b, ttft_slo, \
        counted, G = s
    ws, (r_i, r_f) = pre.ws, pre.requests
    tj, kc, hsize = pop_call(j, loop, hsize, arrived)
    ws.arrival[j] = tj
    ws.prompt[j] = prompt[kc]
    e, router, pending_s, pending_l, n_short = _l._arrive(j, tj, n, G, threshold, dual, window, dynamic, interval,
                                                           ratio, ws, pre.out, keep, r_i, r_f, router, pending_s,
                                                           pending_l, n_short, True)
    if ws.t_done[e] == np.inf:
        n_batches, busy, sum_batch = _l._start_batch(e, tj, dual, window, max_batch, max_batch_tokens, a, b, ws, r_f,
                                                     keep, n_batches, busy, sum_batch)
    return (s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l,
            sum_batch, last, ev), hsize


@stage_step
def _released_laps(pre, j, landing):
    # (LAPS's instances model no KV blocks)
    pass


@stage_step
def _finish_laps(pre, carry, n):
    s, router, pending_s, pending_l, completed, n_batches, n_short, good, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev = carry
    ws = pre.ws
    _l._finish(pre.out, router, s[3], ws.n_group[_l.SHORT], last, ws.arrival[0] if n > 0 else np.nan,
               (completed, n_batches, n_short, good), (busy, sum_ttft, sum_s, sum_l, sum_batch))


#: whether the driver has a decode pool (its variant without one, a cluster's closed loop:
#: :data:`cluster_closed_loop_kernel`, pays nothing for it)
DECODE = True

# (the driver's steps: the continuous prefill pool's; laps_closed_loop_kernel rebinds them)
_set_up_stage, _event_time, _next, _ready_first, _step, _event, _arrive, _finish, _released = (
    _set_up_engines, _event_time_engines, _next_engines, _ready_first_engines, _step_engines, _event_engines,
    _arrive_engines, _finish_engines, _released_engines)


@kernel
def closed_loop_kernel(pre, dec, loop, rheap, link, prompt, arrived, first, ready, handed, groups, streams, stop,
                       estop):
    """Serve ``arrived[0].size`` calls of closed-loop programs through the
    prefill stage ``pre`` (:data:`EnginesPrefill`: continuous engines behind
    the router; :data:`laps_closed_loop_kernel` runs this driver on a
    :data:`LapsPrefill`) and the decode pool (``dec``, a :data:`DecodePool`:
    its engines, each logging its completions), as the module says: every
    event in time order, the stage's next step (its own rule: the
    ``_next`` step of its kind), a ready call (before the stage's step at
    its instant, or after: ``_ready_first``), the decode pool's iterations
    and engine events, the stage's engine events, then the next arrival.
    ``loop``: the programs' starts, think times and new tokens by call id
    and the arrival heap (:func:`.continuous_cluster.pop_call`'s);
    ``rheap`` the heap of the calls waiting for the decode pool (their
    instants and numbers in arrival order: ties in arrival order); by call
    id each call's KV transfer time ``link`` and its prompt.  Written, per
    request in arrival order: ``arrived``, its arrival time, program, new
    tokens, last-call flag and call id; its ``first`` token, the instant it
    is ``ready`` for the decode pool; ``handed`` the requests in the order
    the decode pool takes them (``dec.reqs``, ``dec.placed``).  Returns
    :data:`.continuous.DONE`, ``STOPPED`` or ``STALLED``."""
    n = arrived[0].shape[0]
    call = arrived[4]
    start, gap, new_c, heap_t, heap_id = loop
    K = gap.shape[0] // start.shape[0]
    carry = _set_up_stage(pre, n, start[0], streams, estop)
    if DECODE:
        _set_up(dec.counts.shape[0], dec.config, dec.control, dec.inputs, dec.out, dec.requests, dec.ws, streams,
                estop)
    heap_t[0] = start[0]
    heap_id[0] = 0
    hsize, rsize, m = 1, 0, 0
    dev = 0
    d_rr = 0
    for j in range(n + 1):
        if j < n and stop_asked(j, stop):
            return STOPPED
        # every event before the next call's arrival (after the last: every event), in time order
        while True:
            t = heap_t[0] if hsize > 0 and j < n else np.inf
            te = _event_time(pre, carry)
            td = _event_at(dec.events, dev) if DECODE else np.inf
            cap = min(t, te, td)
            sp, which = _next(pre, carry, cap, t, td, te)
            d = _earliest(dec.ws.state_i, dec.ws.state_f, dec.counts, cap) if DECODE else -1
            sd = starts(dec.ws.state_f, d) if d >= 0 else cap
            r = rheap[0][0] if DECODE and rsize > 0 else np.inf
            if DECODE and r < cap and r <= sd and _ready_first(r, sp):
                rsize, m, d_rr = _take_ready(dec, rheap, rsize, m, n, groups, d_rr, prompt, call, handed, link)
            elif sp <= sd and sp < np.inf:
                code, carry, hsize, rsize = _step(pre, carry, sp, which, call, first, ready, link, dec.output, gap, K,
                                                  heap_t, heap_id, hsize, rheap, rsize, streams, estop)
                if code != DONE:
                    return code
            elif DECODE and (d >= 0 or (td <= t and td <= te and td < np.inf)):
                code, hsize, d_rr, dev, ran = _decode_turn(d, sd, td, dev, dec, d_rr, streams, estop, call, gap, K,
                                                           heap_t, heap_id, hsize)
                if code != DONE:
                    return code
                # (the pulls the engine started: each request's prefill engine frees its KV blocks as the pull
                # lands, the stage's _released; the log emptied. Called here, not in a step of its own, so that
                # laps_closed_loop_kernel's stage is the one called)
                d_si, d_log = dec.ws.state_i, dec.ws.pull_log[ran]
                for q in range(d_si[ran, ES.pulled]):
                    _released(pre, dec.reqs[ran, np.int64(d_log[0, q])], d_log[1, q])
                d_si[ran, ES.pulled] = 0
            elif te <= t and te < np.inf:
                # a prefill engine leaves or joins once every iteration starting before the instant has run
                code, carry = _event(pre, carry, te, arrived, streams, estop)
                if code != DONE:
                    return code
            else:
                break
            if j == n and stop[STOP] != 0:
                return STOPPED
        if j == n:
            break
        if hsize == 0:
            # (nothing runs, no call waits to arrive or to be decoded: every program ended before n calls)
            return STALLED
        carry, hsize = _arrive(pre, carry, j, n, loop, hsize, groups, prompt, arrived)
    _finish(pre, carry, n)
    if DECODE:
        _published_all(dec.config, dec.out, dec.ws)
    stop[ARRIVED] = n
    return DONE


#: :func:`closed_loop_kernel` with LAPS's prefill instances as the prefill
#: stage (a :data:`LapsPrefill`; arXiv:2601.11589): a call arriving is routed
#: by LAPS's router into an instance's queue (:func:`.laps._arrive`), each
#: instance runs prefill batches (:func:`.laps._start_batch`), and at a
#: batch's end each of its calls has its first token (a one-token call
#: answered at once: LAPS's instances add no time outside them).  The
#: instances' events (batch ends, short windows expiring) come in time
#: order with the decode pool's iterations, as LAPS alone takes them among
#: its arrivals (at equal times a batch end, then an arrival, then a
#: window); a batch ending at or before a ready call's instant goes first.
#: The instances' engine events (:func:`.laps._engine_event`; at equal
#: times after a batch end, before an arrival or a window) come in time
#: order with the rest, after the decode pool's at their instant.
laps_closed_loop_kernel = variant(kernel, closed_loop_kernel, "laps_closed_loop_kernel", _set_up_stage=_set_up_laps,
                                  _event_time=_event_time_laps, _next=_next_laps, _ready_first=_ready_first_laps,
                                  _step=_step_laps, _event=_event_laps, _arrive=_arrive_laps,
                                  _finish=_finish_laps, _released=_released_laps)


@step
def _answered(log, logged, reqs, call, delay, gap, K, heap_t, heap_id, hsize):
    """A cluster engine's completions since its log was emptied (``log``,
    ``logged`` of them; ``reqs``: each of its requests' number in arrival
    order), each its call's answer: its program's next call into the
    arrival heap (:func:`_first_token`'s rule, no decode tokens).  Returns
    the heap's size."""
    for q in range(logged):
        k = call[reqs[np.int64(log[0, q])]] + 1
        if k % K != 0:
            hsize = _heap_push(heap_t, heap_id, hsize, log[1, q] + delay + gap[k], k)
    return hsize


@stage_step
def _step_cluster(pre, carry, sp, e, call, first, ready, link, d_output, gap, K, heap_t, heap_id, hsize, rheap,
                  rsize, streams, estop):
    """A cluster engine's iteration starting at ``sp``, each call it
    completes answered (:func:`_answered`)."""
    si = pre.ws.state_i
    si[e, ES.logged] = 0
    if _advance(e, pre.counts[e], np.nextafter(sp, np.inf), pre.config, pre.control, pre.inputs, pre.out,
                pre.requests, pre.ws, streams, estop) == STALLED:
        return STALLED, carry, hsize, rsize
    hsize = _answered(pre.ws.done_log[e], si[e, ES.logged], pre.reqs[e], call, pre.config[1][0, C.request_overhead],
                      gap, K, heap_t, heap_id, hsize)
    return DONE, carry, hsize, rsize


#: :func:`closed_loop_kernel` without a decode pool: a cluster's closed loop, its engines serving each call
#: whole, one iteration at a time in time order, a completion putting its program's next call in the arrival
#: heap before any later iteration starts
cluster_closed_loop_kernel = variant(kernel, closed_loop_kernel, "cluster_closed_loop_kernel", DECODE=False,
                                     _step=_step_cluster)


@helper
def _in_order(admitted, engine, last):
    """Whether each engine's requests were admitted in arrival order
    (``last``: each engine's latest admission so far, -inf)."""
    for r in range(admitted.shape[0]):
        e = engine[r]
        if admitted[r] < last[e]:
            return False
        last[e] = admitted[r]
    return True


#: :func:`holds_fit`'s answers: the blocks held fit with room for any request; they fit, but not with room
#: for every request; they exceed the blocks
FITS, TIGHT, EXCEEDS = 0, 1, 2


@helper
def _fits(order, admitted, first, release, prompt, engine, bs, limit, most, taken, heap_t, heap_b, size):
    """:func:`holds_fit`'s sweep over the requests in ``order`` (empty:
    arrival order), each engine's in the order they were admitted: a
    request takes its blocks as it is admitted, after those freed by then
    (each engine's heap of the blocks taken: ``heap_t`` when they are
    freed, ``heap_b`` how many, ``size`` its size; ``taken`` each
    engine's blocks taken, zeros).  :data:`EXCEEDS` as soon as an engine
    takes more than its blocks, ``most``; else :data:`TIGHT` where one took more
    than ``limit``, else :data:`FITS`."""
    answer = FITS
    for k in range(admitted.shape[0]):
        r = order[k] if order.shape[0] > 0 else k
        e = engine[r]
        a = admitted[r]
        while size[e] > 0 and heap_t[e, 0] <= a:
            _, b, size[e] = _heap_pop(heap_t[e], heap_b[e], size[e])
            taken[e] -= b
        b = blocks(np.int64(prompt[r]) + 1, bs, -1)
        taken[e] += b
        if taken[e] > most:
            return EXCEEDS
        if taken[e] > limit:
            answer = TIGHT
        end = release[r] if release[r] > first[r] else first[r]
        size[e] = _heap_push(heap_t[e], heap_b[e], size[e], end, b)
    return answer


def holds_fit(admitted, first, release, prompt, engine, engines: int, block_size: int, kv_blocks: int) -> int:
    """How the blocks of requests each holding its prompt's and first
    token's (``prompt``: ``(prompt + 1) / block_size`` rounded up) on its
    ``engine`` from its admission until its ``release`` (at its ``first``
    token where that is later) fit each of ``engines`` engines of
    ``kv_blocks`` KV blocks: :data:`FITS` where, at every admission, the
    blocks taken and the most a request takes fit together, :data:`EXCEEDS`
    where the blocks taken at some admission are more than ``kv_blocks``, else
    :data:`TIGHT`."""
    bs, most = int(block_size), int(kv_blocks)
    limit = most - (int(np.max(prompt)) + bs) // bs if prompt.size else most
    admitted = np.ascontiguousarray(admitted, float)
    engine = np.ascontiguousarray(engine, np.int64)
    order = (np.empty(0, np.int64) if _in_order(admitted, engine, np.full(engines, -np.inf))
             else np.argsort(admitted, kind="stable"))
    # (every request takes a block at least: an engine taking at most `kv_blocks` holds at most as many)
    return int(_fits(order, admitted, np.ascontiguousarray(first, float), np.ascontiguousarray(release, float),
                     np.ascontiguousarray(prompt, float), engine, bs, limit, most, np.zeros(engines, np.int64),
                     np.empty((engines, most + 1)), np.empty((engines, most + 1), np.int64),
                     np.zeros(engines, np.int64)))


def run_closed(config, d_config, calls, edges, d_edges, router, engines: int, d_engines: int, streams, stop, *,
               control=None, d_control=None, groups: int = 1, ts_rows: int = 2, prefixes=None,
               cache_routing=None, d_router: str = "round_robin", events=None, d_events=None,
               driver=None) -> tuple:
    """Simulate closed-loop programs on ``engines`` prefill engines of the
    continuous run ``config`` (one output token a call: its first) behind
    ``router`` and ``d_engines`` decode engines of ``d_config`` (``n``:
    the calls routed, ``config``'s).  ``calls``: a dict of the programs'
    ``start`` and by call id their think times ``gap``, ``new`` tokens,
    ``prompt``, the pools' ``output`` and ``prediction`` (the prefill's:
    one token) and ``d_output`` and ``d_prediction`` (the decode pool's:
    ``output - 1``, 0 for a one-token call), and the KV transfer time
    ``link``; ``prefixes`` (by call id) and ``cache_routing`` as
    :func:`run_cluster_closed`'s; ``d_router`` the decode
    pool's (``"round_robin"``: dealt in turn; ``"least_used"``); ``events``
    the prefill pool's engine events and ``d_events`` the decode pool's (as
    :func:`.continuous_cluster.run`'s; None: none).  Returns
    ``(prefill, decode, routed, code, got)``: the prefill pool's engines'
    ``(outputs, records, code)`` with each request's engine and number
    there; the decode pool's engines' runs (those given a request: the
    first ones, either way; its requests in the order it took them,
    request ``m`` number ``got["d_placed"][1, m]`` of engine
    ``got["d_placed"][0, m]``: ``m // d_engines`` of ``m % d_engines``
    dealt in turn); the routing
    statistics; the code; and per request in arrival order its
    ``arrival_times``, ``program``, ``new_tokens``, ``session_end``,
    ``call``, ``first_token`` and ``ready`` (NaN for a one-token call), and
    ``handed``, the requests in the order the decode pool took them.
    ``driver``: the kernel (None: :func:`closed_loop_kernel`)."""
    from .routing import TABLE
    from . import continuous as _k

    n = int(config[0][_k.C.n])
    start = np.ascontiguousarray(calls["start"], float)
    P = start.size
    output = np.ascontiguousarray(calls["output"], float)
    d_output = np.ascontiguousarray(calls["d_output"], float)
    log = 2 * (int(config[0][_k.C.max_num_seqs]) + 1)
    release = np.ascontiguousarray(calls.get("release", np.empty(0)), float)
    pre = _Cluster(config, output, edges, engines, stop, control, groups, ts_rows, 0, None, None, prefixes,
                   log=log, events=events, holds=release.size > 0)
    dec = _Cluster(d_config, d_output, d_edges, d_engines, stop, d_control, groups, ts_rows, 0, None, None, None,
                   log=2 * (int(d_config[0][_k.C.max_num_seqs]) + 1), events=d_events, pulls=True)
    got = _got(n)
    loop = (start, np.ascontiguousarray(calls["gap"], float), np.ascontiguousarray(calls["new"], float),
            np.empty(P + 1), np.empty(P + 1, np.int64))
    table = np.full((TABLE.size, max(P, 1)), -1, np.int64)
    stage = EnginesPrefill(pre.config, pre.control, pre.inputs, pre.out, pre.requests, pre.ws, pre.feeds, pre.counts,
                         output, np.ascontiguousarray(calls["prediction"], float), pre.chain, pre.shared, router,
                         cache_routing or _r.NO_CACHE_ROUTING, pre.eng, table, np.zeros(engines, np.int64), pre.where,
                         pre.local, pre.ids if pre.ids.shape[1] else np.empty((engines, pre.room), np.int64), pre.ids,
                         pre.events, pre.routed, release)
    code = (driver or closed_loop_kernel)(stage, _decode_pool(dec, d_engines, n, got, calls, d_router), loop,
                              (np.empty(n), np.empty(n, np.int64)), np.ascontiguousarray(calls["link"], float),
                              np.ascontiguousarray(calls["prompt"], float), _arrived(got), got["first_token"],
                              got["ready"], got["handed"], groups, streams, stop, np.zeros_like(stop))
    runs, where, local = pre.runs(code)
    return (runs, where, local), _decode_runs(dec, got, code, d_engines), ROUTED.unpack(pre.routed), code, got


def run_cluster_closed(config, calls, edges, router, engines: int, streams, stop, *, control=None, groups: int = 1,
                       ts_rows: int = 2, prefixes=None, cache_routing=None, events=None) -> tuple:
    """Closed-loop programs on a cluster of ``engines`` continuous engines
    of the run ``config`` behind ``router``: the closed-loop driver
    (:data:`cluster_closed_loop_kernel`) with the cluster's engines as its
    stage and no decode pool, each call's answer its engine's completion.
    ``calls``: a dict of the programs' ``start`` (P programs) and, by call
    id (``P C`` calls), their think times ``gap``, ``new`` tokens,
    ``prompt`` (the program's context and the new tokens), ``output`` and
    ``prediction``; ``prefixes`` (as :func:`.continuous_cluster.run`'s) by
    call id too; ``cache_routing`` and ``events`` as
    :func:`.continuous_cluster.run`'s.  Returns
    :func:`.continuous_cluster.run`'s tuple and the ``n`` requests'
    ``arrival_times``, ``program``, ``new_tokens``, ``session_end`` and
    ``call`` ids (a dict), in the order they arrived (-1 and NaN for
    requests that did not)."""
    from . import continuous as _k

    # (the decode pool's engines: none, of a run of one request: its arrays of that room)
    none = _k.CONFIG.pack(**{**_k.CONFIG.unpack(config), "n": 1})
    zero = np.zeros(np.asarray(calls["output"]).size)
    (runs, where, local), _, routed, code, got = run_closed(
        config, none, {**calls, "d_output": zero, "d_prediction": zero, "link": zero}, edges, np.asarray(edges),
        router, engines, 0, streams, stop, control=control, groups=groups, ts_rows=ts_rows, prefixes=prefixes,
        cache_routing=cache_routing, events=events, driver=cluster_closed_loop_kernel)
    return runs, where, local, routed, code, {k: got[k] for k in ("arrival_times", "program", "new_tokens",
                                                                  "session_end", "call")}


def run_closed_laps(config, d_config, calls, d_edges, d_engines: int, streams, stop, *, d_control=None,
                    groups: int = 1, ts_rows: int = 2, d_router: str = "round_robin", events=None,
                    d_events=None) -> tuple:
    """:func:`run_closed` with LAPS's prefill instances as the prefill pool
    (``config``: :data:`.laps.CONFIG` packed, its ``n`` the calls routed;
    :func:`laps_closed_loop_kernel`); ``calls`` as :func:`run_closed`'s
    (no ``output`` or ``prediction`` for the prefill pool, whose instances
    only prefill); ``events`` the instances' (:func:`.laps.run`'s).
    Returns ``(prefill, decode, code, got)``: LAPS's
    ``(outputs, requests)`` (:func:`.laps.run`'s), the decode pool's runs,
    the code and ``got`` (:func:`run_closed`'s)."""
    from . import continuous as _k

    cfg = _l.CONFIG.unpack(config)
    n = cfg["n"]
    if not 1 <= groups <= _l.MAX_GROUPS:
        raise ValueError(f"groups must be an integer in [1, {_l.MAX_GROUPS}]; got {groups!r}")
    out, requests, ws = _l.allocate(cfg, n, groups)
    start = np.ascontiguousarray(calls["start"], float)
    d_output = np.ascontiguousarray(calls["d_output"], float)
    dec = _Cluster(d_config, d_output, d_edges, d_engines, stop, d_control, groups, ts_rows, 0, None, None, None,
                   log=2 * (int(d_config[0][_k.C.max_num_seqs]) + 1), events=d_events, pulls=True)
    got = _got(n)
    loop = (start, np.ascontiguousarray(calls["gap"], float), np.ascontiguousarray(calls["new"], float),
            np.empty(start.size + 1), np.empty(start.size + 1, np.int64))
    code = laps_closed_loop_kernel(LapsPrefill(config, out, requests, ws, event_arrays(events)),
                                   _decode_pool(dec, d_engines, n, got, calls, d_router), loop,
                                   (np.empty(n), np.empty(n, np.int64)), np.ascontiguousarray(calls["link"], float),
                                   np.ascontiguousarray(calls["prompt"], float), _arrived(got), got["first_token"],
                                   got["ready"], got["handed"], groups, streams, stop, np.zeros_like(stop))
    d_runs = _decode_runs(dec, got, code, d_engines)
    return (out, _l.REQUESTS.rows(requests) if cfg["keep"] else None), d_runs, code, got


def _decode_pool(dec, d_engines: int, n: int, got: dict, calls: dict, d_router: str) -> DecodePool:
    """The :data:`DecodePool` of a closed loop's decode engines ``dec`` (a
    :class:`.continuous_cluster._Cluster`; ``got``: :func:`_got`'s arrays,
    its ``d_placed`` the pool's ``placed``), dealing by ``d_router``."""
    handing = dec.ids.shape[1] > 0
    return DecodePool(dec.config, dec.control, dec.inputs, dec.out, dec.requests, dec.ws, dec.feeds, dec.counts,
                      {"round_robin": 0, "least_used": 1}[d_router], dec.eng,
                      dec.ids if handing else np.empty((d_engines, dec.room), np.int64), got["d_placed"],
                      np.empty(n if handing else 0, np.int64), dec.events,
                      np.ascontiguousarray(calls["d_output"], float),
                      np.ascontiguousarray(calls["d_prediction"], float))


def _arrived(got: dict) -> tuple:
    """The arrays a closed loop writes as each call arrives (``got``'s):
    its arrival time, program, new tokens, last-call flag and call id."""
    return tuple(got[k] for k in ("arrival_times", "program", "new_tokens", "session_end", "call"))


def _got(n: int) -> dict:
    """The arrays a closed loop writes, one slot per request (in arrival
    order; ``handed`` and ``d_placed`` in the order the decode pool takes
    them), unset."""
    return dict(arrival_times=np.full(n, np.nan), program=np.full(n, -1, np.int64), new_tokens=np.full(n, np.nan),
                session_end=np.zeros(n, np.int8), call=np.full(n, -1, np.int64), first_token=np.full(n, np.nan),
                ready=np.full(n, np.nan), handed=np.full(n, -1, np.int64), d_placed=np.full((2, n), -1, np.int64))


def _decode_runs(dec, got: dict, code: int, d_engines: int) -> list:
    """The decode pool's engines' runs after a closed loop (those given a
    request: the first ones, either way), ``got``'s ``handed`` and
    ``d_placed`` cut to the requests it took; where its engines handed
    requests back, each request's engine and number there as the pool
    placed it at the end (for the records to leave out those handed back),
    and ``got["d_rerouted"]``."""
    taken = int(np.count_nonzero(got["handed"] >= 0))
    got["handed"] = got["handed"][:taken]
    got["d_placed"] = got["d_placed"][:, :taken]
    if dec.ids.shape[1]:
        h = got["handed"]
        dec.where[h], dec.local[h] = got["d_placed"]
        d_runs, _, _ = dec.runs(code)
        got["d_placed"] = np.stack([dec.where[h], dec.local[h]])
        got["d_rerouted"] = int(dec.ws.state_i[:, ES.handed].sum())
        return d_runs
    d_runs, _, _ = dec.runs(code)
    return d_runs[:int((dec.counts > 0).sum())]
