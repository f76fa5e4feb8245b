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
  pool when its KV cache has moved, ``link[k]`` s after its first token;
  the ready calls join the **decode pool** in the order they become ready
  (ties in arrival order), dealt to its engines in turn, each bringing its
  prompt's KV cache and generating its other ``output - 1`` tokens;
- a call's client has its answer ``request_overhead`` after its last token
  (the decode engine's; a one-token call's, the prefill engine's), and its
  program's next call arrives its think time later.

The loop runs every engine of both pools one iteration at a time, the
iteration starting first going first, and hands a ready call to its decode
engine before any iteration starting at or after its instant: every event
(an arrival, a call ready, an iteration's start) is taken in time order,
so a completion puts its next call in the arrival heap before any later
iteration starts, as :func:`.continuous_cluster.closed_loop_kernel` does
for one pool.  Run open-loop, the two stages in one loop give what the
pools run one after the other give (the decode pool only reads the prefill
pool's first tokens): the feed-forward planner
(:mod:`mbbatch.planners.disaggregated`) keeps running them so.
"""

from __future__ import annotations

import numpy as np

from .common import ARRIVED, STOP, kernel, step
from .continuous import DONE, ES, STALLED, STOPPED, C
from .continuous_cluster import (ROUTED, _advance, _arrive_call, _Cluster, _completed_by, _earliest, _engine_event,
                                 _set_up, _stop_asked, fresh_record)
from . import routing as _r
from .programs import _heap_pop, _heap_push

__all__ = ["closed_loop_kernel", "run_closed"]


@step
def _first_tokens(log, logged, reqs, call, first, ready, link, d_output, delay, gap, K, heap_t, heap_id, hsize,
                  r_t, r_id, rsize):
    """A prefill engine's completions since its log was emptied (``log``,
    ``logged`` of them; ``reqs``: each of its requests' number in arrival
    order): each call's first token into ``first``; a call of more tokens
    ready for the decode pool when its KV cache has moved (``link``),
    into the ready heap; a one-token call answered, its program's next call
    into the arrival heap (:func:`.continuous_cluster._next_calls`'s rule).
    Returns both heaps' sizes."""
    for q in range(logged):
        j = reqs[np.int64(log[0, q])]
        f = log[1, q]
        kc = call[j]
        first[j] = f
        if d_output[kc] > 0.0:
            ready[j] = f + link[kc]
            rsize = _heap_push(r_t, r_id, rsize, ready[j], j)
        elif (kc + 1) % K != 0:
            hsize = _heap_push(heap_t, heap_id, hsize, f + delay + gap[kc + 1], kc + 1)
    return hsize, rsize


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
def _hand(j, t, m, n, groups, d_route, d_eng, d_ws, d_feeds, d_requests, d_counts, prompt, d_output, d_prediction,
          call, handed, d_reqs, d_placed):
    """Request j, ready at ``t``, the ``m``-th the decode pool takes: to
    engine ``m % D`` (in turn; ``d_route`` 1: the engine least used at
    ``t``, by the cluster's rule, :func:`.routing.scan_engines`, on the
    engines' active requests then, written into ``d_eng``), bringing its
    prompt's KV cache, its batch-means group its group among the ``n``
    arrivals; recorded as the
    engine's next request (``d_reqs``) and, by ``m``, its engine and number
    there (``d_placed``)."""
    D = d_counts.shape[0]
    if d_route == 0:
        e = m % D
    else:
        for x in range(D):
            d_eng[_r.EN.active, x] = d_counts[x] - _completed_by(d_ws.state_i[x], d_ws.state_f[x], t)
        e = _r.scan_engines(d_eng)[0]
    k = d_counts[e]
    kc = call[j]
    d_ws.arrival[e, k] = t
    d_ws.group[e, k] = (j * groups) // n
    fresh_record(d_requests, e, k)
    d_feeds.prompt[e, k] = prompt[kc]
    d_feeds.output[e, k] = d_output[kc]
    d_feeds.prediction[e, k] = d_prediction[kc]
    d_feeds.cached[e, k] = prompt[kc]
    d_counts[e] = k + 1
    handed[m] = j
    d_reqs[e, k] = j
    d_placed[0, m] = e
    d_placed[1, m] = k


@kernel
def closed_loop_kernel(config, control, inputs, out, requests, ws, feeds, counts,
                       d_config, d_control, d_inputs, d_out, d_requests, d_ws, d_feeds, d_counts,
                       loop, rheap, link, prompt, output, prediction, chain, shared, d_output, d_prediction,
                       times, program, new_tokens, session_end, call, first, ready, handed, d_route, d_eng, d_reqs,
                       d_placed,
                       groups, rt, ca, eng, table, match, where, local, reqs, ids, events, routed, streams, stop,
                       estop):
    """Route ``times.size`` calls of closed-loop programs to the prefill
    pool (``config`` ... ``counts``: :func:`.continuous_cluster.cluster_kernel`'s
    engines) and serve them through the decode pool (``d_config`` ...
    ``d_counts``, its engines, each logging its completions), as the module
    says.  ``loop``: the programs' starts, think times and new tokens by
    call id and the arrival heap (:func:`.continuous_cluster.closed_loop_kernel`'s);
    ``rheap`` the heap of the calls waiting for the decode pool (their
    instants and numbers in arrival order: ties in arrival order);
    by call id each call's KV transfer time ``link``, its prompt, the
    prefill engines' output and prediction (one token), prefix chain and
    shared tokens, and the decode pool's output (``output - 1``) and
    prediction.  Written, per request in arrival order: its arrival,
    program, new tokens, last-call flag and call id, its first token,
    the instant it is ready for the decode pool; ``handed`` the requests
    in the order the decode pool takes them (its engines' counts in
    ``d_counts``: dealt in turn, or with ``d_route`` 1 to the engine least
    used, its engines' loads in ``d_eng``), ``d_reqs`` each decode engine's requests (in arrival order) and
    ``d_placed`` the engine and number there of each one it takes (in
    that order), ``reqs`` each prefill engine's requests' numbers in
    arrival order.  The prefill pool's engine ``events`` (as
    :func:`.continuous_cluster.cluster_kernel`'s; ``ids``: ``reqs``, where
    a request routed again is numbered, or empty without events) are taken
    in time order with the rest.  Returns :data:`.continuous.DONE`,
    ``STOPPED`` or ``STALLED``."""
    n = times.shape[0]
    E = counts.shape[0]
    D = d_counts.shape[0]
    si, sf = ws.state_i, ws.state_f
    dsi, dsf = d_ws.state_i, d_ws.state_f
    bs = config[0][0, C.block_size]
    delay = config[1][0, C.request_overhead]
    d_delay = d_config[1][0, C.request_overhead]
    start, gap, new_c, heap_t, heap_id = loop
    r_t, r_id = rheap
    P = start.shape[0]
    K = gap.shape[0] // P
    _set_up(E, config, control, inputs, out, requests, ws, streams, estop)
    _set_up(D, d_config, d_control, d_inputs, d_out, d_requests, d_ws, streams, estop)
    heap_t[0] = start[0]
    heap_id[0] = 0
    hsize, rsize, m = 1, 0, 0
    rr_route = 0
    ev = 0
    for j in range(n + 1):
        if j < n and _stop_asked(j, stop):
            return STOPPED
        # every event before the next call's arrival (after the last: every event), in time order
        while True:
            t = heap_t[0] if hsize > 0 and j < n else np.inf
            te = events[0][ev] if ev < events[0].shape[0] else np.inf
            cap = min(t, te)
            e = _earliest(si, sf, counts, cap)
            sp = sf[e, ES.now] if e >= 0 else cap
            d = _earliest(dsi, dsf, d_counts, cap)
            sd = dsf[d, ES.now] if d >= 0 else cap
            r = r_t[0] if rsize > 0 else np.inf
            if r < cap and r <= sp and r <= sd:
                # a call ready joins the decode pool before any iteration starting at or after it
                r, jr, rsize = _heap_pop(r_t, r_id, rsize)
                _hand(jr, r, m, n, groups, d_route, d_eng, d_ws, d_feeds, d_requests, d_counts, prompt, d_output,
                      d_prediction, call, handed, d_reqs, d_placed)
                m += 1
            elif e >= 0 and sp <= sd:
                si[e, ES.logged] = 0
                if _advance(e, counts[e], np.nextafter(sp, np.inf), config, control, inputs, out, requests, ws,
                            streams, estop) == STALLED:
                    return STALLED
                hsize, rsize = _first_tokens(ws.done_log[e], si[e, ES.logged], reqs[e], call, first, ready, link,
                                             d_output, delay, gap, K, heap_t, heap_id, hsize, r_t, r_id, rsize)
            elif d >= 0:
                dsi[d, ES.logged] = 0
                if _advance(d, d_counts[d], np.nextafter(sd, np.inf), d_config, d_control, d_inputs, d_out,
                            d_requests, d_ws, streams, estop) == STALLED:
                    return STALLED
                hsize = _answers(d_ws.done_log[d], dsi[d, ES.logged], d, d_reqs, call, d_delay, gap, K, heap_t,
                                 heap_id, hsize)
            elif te <= t and te < np.inf:
                # a prefill engine leaves or joins once every iteration starting before the instant has run
                code, rr_route = _engine_event(ev, events, config, control, inputs, out, requests, ws, streams,
                                               estop, rt, eng, table, rr_route, feeds, counts, where, local, ids,
                                               ids[:, :0], program, new_tokens, session_end, routed)
                if code != DONE:
                    return code
                ev += 1
            else:
                break
            if j == n and stop[STOP] != 0:
                return STOPPED
        if j == n:
            break
        if hsize == 0:
            # (nothing runs, no call waits to arrive or to be decoded: every program ended before n calls)
            return STALLED
        e, rr_route, hsize = _arrive_call(j, n, loop, hsize, rr_route, groups, rt, ca, eng, table, feeds, ws,
                                          requests, prompt, output, prediction, chain, shared, match, counts, where,
                                          local, ids, routed, bs, (times, program, new_tokens, session_end, call))
        reqs[e, local[j]] = j
    stop[ARRIVED] = n
    return DONE


def run_closed(config, d_config, calls, edges, d_edges, router, engines: int, d_engines: int, streams, stop, *,
               control=None, d_control=None, groups: int = 1, ts_rows: int = 2, prefixes=None,
               cache_routing=None, d_router: str = "round_robin", events=None) -> tuple:
    """Simulate closed-loop programs on ``engines`` prefill engines of the
    continuous run ``config`` (one output token a call: its first) behind
    ``router`` and ``d_engines`` decode engines of ``d_config`` (``n``:
    the calls routed, ``config``'s).  ``calls``: a dict of the programs'
    ``start`` and by call id their think times ``gap``, ``new`` tokens,
    ``prompt``, the pools' ``output`` and ``prediction`` (the prefill's:
    one token) and ``d_output`` and ``d_prediction`` (the decode pool's:
    ``output - 1``, 0 for a one-token call), and the KV transfer time
    ``link``; ``prefixes`` (by call id) and ``cache_routing`` as
    :func:`.continuous_cluster.run_closed`'s; ``d_router`` the decode
    pool's (``"round_robin"``: dealt in turn; ``"least_used"``); ``events``
    the prefill pool's engine events (as
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
    ``handed``, the requests in the order the decode pool took them."""
    from .routing import TABLE
    from . import continuous as _k

    n = int(config[0][_k.C.n])
    start = np.ascontiguousarray(calls["start"], float)
    P = start.size
    output = np.ascontiguousarray(calls["output"], float)
    d_output = np.ascontiguousarray(calls["d_output"], float)
    log = 2 * (int(config[0][_k.C.max_num_seqs]) + 1)
    pre = _Cluster(config, output, edges, engines, stop, control, groups, ts_rows, 0, None, None, prefixes,
                   log=log, events=events)
    dec = _Cluster(d_config, d_output, d_edges, d_engines, stop, d_control, groups, ts_rows, 0, None, None, None,
                   log=2 * (int(d_config[0][_k.C.max_num_seqs]) + 1))
    got = dict(arrival_times=np.full(n, np.nan), program=np.full(n, -1, np.int64), new_tokens=np.full(n, np.nan),
               session_end=np.zeros(n, np.int8), call=np.full(n, -1, np.int64), first_token=np.full(n, np.nan),
               ready=np.full(n, np.nan), handed=np.full(n, -1, np.int64), d_placed=np.full((2, n), -1, np.int64))
    loop = (start, np.ascontiguousarray(calls["gap"], float), np.ascontiguousarray(calls["new"], float),
            np.empty(P + 1), np.empty(P + 1, np.int64))
    table = np.full((TABLE.size, max(P, 1)), -1, np.int64)
    code = closed_loop_kernel(
        pre.config, pre.control, pre.inputs, pre.out, pre.requests, pre.ws, pre.feeds, pre.counts,
        dec.config, dec.control, dec.inputs, dec.out, dec.requests, dec.ws, dec.feeds, dec.counts,
        loop, (np.empty(n), np.empty(n, np.int64)), np.ascontiguousarray(calls["link"], float),
        np.ascontiguousarray(calls["prompt"], float), output,
        np.ascontiguousarray(calls["prediction"], float), pre.chain, pre.shared, d_output,
        np.ascontiguousarray(calls["d_prediction"], float), got["arrival_times"], got["program"], got["new_tokens"],
        got["session_end"], got["call"], got["first_token"], got["ready"], got["handed"],
        {"round_robin": 0, "least_used": 1}[d_router], dec.eng, np.empty((d_engines, n), np.int64), got["d_placed"],
        groups,
        router,
        cache_routing or _r.NO_CACHE_ROUTING, pre.eng, table, np.zeros(engines, np.int64), pre.where, pre.local,
        pre.ids if pre.ids.shape[1] else np.empty((engines, n), np.int64), pre.ids, pre.events, pre.routed, streams,
        stop, np.zeros_like(stop))
    taken = int(dec.counts.sum())
    got["handed"] = got["handed"][:taken]
    got["d_placed"] = got["d_placed"][:, :taken]
    runs, where, local = pre.runs(code)
    d_runs, _, _ = dec.runs(code)
    return (runs, where, local), d_runs[:int((dec.counts > 0).sum())], ROUTED.unpack(pre.routed), code, got
