"""The LAPS kernel: prefill instances behind the LAPS router ("LAPS: Length-Aware
Prefill Scheduling", 2026, arXiv:2601.11589).

Requests arrive (:func:`~.common.draw_arrivals`), each with a prompt length
(:func:`~.common.draw_block`).  The router classifies a request as short (at
most ``threshold`` prompt tokens) or long; with dynamic allocation it first
rebalances the groups if due (at most once per ``interval``: one instance
moves toward the group whose pending requests exceed ``ratio`` times the
other's, each group keeping one instance), then sends the request to the
instance of its group with the fewest outstanding requests (ties to the
lowest id); without it, to the least-outstanding instance of all.

Each instance runs prefill batches one at a time.  With the dual queue,
short requests wait in their own queue and go first: a short batch starts
when the oldest short request has waited ``window`` or ``max_batch`` short
requests are queued (window 0: at once); otherwise, also during a short
window, the long queue's head runs.  Without it, one FIFO queue.  A batch
takes requests from its queue's head while it holds fewer than
``max_batch`` and their prompts fit ``max_batch_tokens`` (the first always
joins).  It takes ``a + b x (its prompt tokens)`` seconds; at its end its
requests have their first token and leave the router's pending counts.

At equal times: batch ends first, then arrivals, then window expiries.

With an objective on the time to first token (``ttft_slo`` finite), the
requests whose first token came within it are counted (goodput without a
decode stage, which has no time per output token; Zhong et al., 2024,
DistServe, arXiv:2401.09670); without one the count is skipped.

The loop is :mod:`.driver`'s open loop compiled with the instances' steps
(:data:`laps_kernel`, its stage a :data:`LapsStage`: before each arrival
every batch end, instance event and window due before it,
:func:`_until_laps`; then the arrival, :func:`_arrive_open_laps`), each of
short named steps (an arrival :func:`_arrive`, a batch's end
:func:`_end_batch`, a batch's start :func:`_start_batch`), which a closed
loop's driver takes in its own time order with a decode pool's iterations
(:func:`.disaggregated.laps_closed_loop_kernel`).

Pure numba on arrays and scalars; the Python side is
:mod:`mbbatch.planners.laps` (``run`` allocates and calls).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import (ARR_POISSON, HIST_SIZE, STOP, STOP_SIZE, SVC_UNIFORM, check_stop, draw_arrivals,
                     draw_block, drawers, event_arrays, hist_bucket, round_lengths, stage_step, step,
                     variant)
from .driver import DONE, STOPPED, open_loop_driver
from .layout import Arrays, Layout

#: the run's scalars: ``dual`` 1 for the dual queue (else one FIFO),
#: ``dynamic`` 1 for the router's dynamic allocation, ``long0`` the
#: instances of the long group at first (the highest ids), ``ttft_slo`` the
#: requests' objective on the time to first token (s; inf: none, nothing counted)
CONFIG = Layout("LAPS run", ints=("n", "arrival_kind", "prompt_kind", "integer", "instances", "threshold",
                                  "max_batch", "dual", "dynamic", "long0", "keep"),
                floats=("rate", "window", "max_batch_tokens", "interval", "ratio", "a", "b", "ttft_slo"))
#: read-only inputs: replayed arrival times, the arrival process's
#: parameters and change times, the prompt distribution's parameters or
#: replayed values
INPUTS = Arrays("LapsInputs", __name__, readonly=True, arrival_times=np.float64, arrival_params=np.float64,
                arrival_ends=np.float64, prompt_params=np.float64, prompt_values=np.float64)
LapsInputs = INPUTS.type
#: the random streams: arrival gaps and prompt lengths
LapsStreams = namedtuple("LapsStreams", ("arrival", "prompt"))
#: the statistics (``good``: the requests whose first token came within ``ttft_slo``; 0 without it)
STATS = Layout("LAPS statistics", ints=("completed", "batches", "short", "moves", "good"),
               floats=("first_arrival", "last_completion", "busy", "sum_ttft", "sum_ttft_short",
                       "sum_ttft_long", "sum_batch", "short_instance_time"))
#: the outputs: TTFT histograms of the short and the long requests, the
#: moves (time, instance, new group: 0 short, 1 long) in order, and the TTFT
#: summed and counted per category (rows) and contiguous group of arrivals
#: (columns: request r in group r * G // n), the backlog check's input
OUTPUTS = Arrays("LapsOutputs", __name__, ints=np.int64, floats=np.float64, hist_short=np.int64, hist_long=np.int64,
                 move_time=np.float64, move_instance=np.int64, move_group=np.int64,
                 group_ttft=(np.float64, 2), group_count=(np.int64, 2))
LapsOutputs = OUTPUTS.type
#: per-request records (``keep``): instance, category (0 short, 1 long),
#: arrival, prompt tokens, batch start and first token
REQUESTS = Layout("LAPS requests", ints=("instance", "category"),
                  floats=("arrival", "prompt", "start", "first_token"))

#: the kernel's scratch arrays: the requests (arrival, prompt, queue link,
#: category c and group of arrivals g as ``c + 2 g``, so at most
#: :data:`MAX_GROUPS` groups), each instance's two queues (head, tail, length), its batch,
#: its end time and its short window's deadline (the oldest short request's
#: arrival + window), the router's groups (:data:`OUT` more while an instance
#: is out of the pool; the instances in the pool by group) and outstanding counts, and the
#: addresses of the arrival and prompt drawers (:func:`~.common.drawers`)
WORKSPACE = Arrays("LapsWorkspace", __name__, arrival=np.float64, prompt=np.float64, nxt=np.int64, cat=np.int8,
                   qh=(np.int64, 2), qt=(np.int64, 2), qn=(np.int64, 2), batch=(np.int64, 2), batch_n=np.int64,
                   t_done=np.float64, deadline=np.float64, group=np.int64, n_group=np.int64, outstanding=np.int64,
                   draws=np.int64)
LapsWorkspace = WORKSPACE.type

C = CONFIG.index
S = STATS.index
RQ = REQUESTS.index
#: moves recorded at most (the count goes on beyond)
MOVES_MAX = 1 << 16

#: the router's groups
SHORT, LONG = 0, 1
#: added to an instance's group while it is out of the pool (its group kept for its return)
OUT = 2
#: whether the kernel takes the instances' events (:data:`laps_events_kernel`, its variant that does: a run
#: without events pays nothing for them)
EVENTS = False


@step
def _least_outstanding(group, outstanding, want, everyone, events):
    """The instance in the pool (its ``group`` below :data:`OUT`) of group
    ``want`` (of all when ``everyone``, or when none of the group is in)
    with the fewest outstanding requests, ties to the lowest id
    (``events``: whether instances may be out, a constant in a kernel)."""
    best = -1
    for e in range(group.shape[0]):
        if not everyone and group[e] != want:
            continue
        if events and group[e] >= OUT:
            continue
        if best < 0 or outstanding[e] < outstanding[best]:
            best = e
    if events and best < 0:
        for e in range(group.shape[0]):
            if group[e] < OUT and (best < 0 or outstanding[e] < outstanding[best]):
                best = e
    return best


@step
def _take(group, outstanding, src):
    """The instance that leaves group ``src`` (in the pool): fewest
    outstanding, ties to the highest id."""
    best = -1
    for e in range(group.shape[0]):
        if group[e] != src:
            continue
        if best < 0 or outstanding[e] <= outstanding[best]:
            best = e
    return best


@step
def _dispatch(e, now, dual, window, max_batch, max_batch_tokens, a, b, arrival, prompt, nxt, qh, qt, qn,
              batch, batch_n, t_done, deadline):
    """Start a batch on idle instance ``e`` at ``now`` if one is due; returns
    its service time, or -1 when it stays idle."""
    qi = -1
    if dual:
        if qn[e, SHORT] > 0 and (window <= 0.0 or qn[e, SHORT] >= max_batch or now >= deadline[e]):
            qi = SHORT
        elif qn[e, LONG] > 0:
            qi = LONG
    elif qn[e, SHORT] > 0:
        qi = SHORT
    if qi < 0:
        return -1.0
    tokens = 0.0
    k = 0
    r = qh[e, qi]
    while r >= 0 and k < max_batch:
        if k > 0 and tokens + prompt[r] > max_batch_tokens:
            break
        tokens += prompt[r]
        batch[e, k] = r
        k += 1
        r = nxt[r]
    qh[e, qi] = r
    if r < 0:
        qt[e, qi] = -1
    elif qi == SHORT:
        deadline[e] = arrival[r] + window
    qn[e, qi] -= k
    batch_n[e] = k
    service = a + b * tokens
    t_done[e] = now + service
    return service


@step
def _next_events(t_done, qn, deadline, windowed):
    """The first batch end ``(t_c, e_c)``, and the first short window to
    expire on an idle instance ``(t_w, e_w)`` (inf and -1: none)."""
    t_c = np.inf
    e_c = -1
    t_w = np.inf
    e_w = -1
    for e in range(t_done.shape[0]):
        td = t_done[e]
        if td < t_c:
            t_c = td
            e_c = e
        elif windowed and td == np.inf and qn[e, SHORT] > 0 and deadline[e] < t_w:
            t_w = deadline[e]
            e_w = e
    return t_c, e_c, t_w, e_w


@step
def _end_batch(e, now, ws, out, r_f, keep, counted, ttft_slo, sum_ttft, sum_s, sum_l, pending_s, pending_l, good):
    """Instance e's batch ends at ``now``: each of its requests has its first
    token (its time to first token counted by category and group of
    arrivals, within ``ttft_slo`` where ``counted``) and leaves the
    router's pending and outstanding counts; the instance is idle.  Returns
    the running sums and counts."""
    g_ttft = out.group_ttft
    g_count = out.group_count
    for k in range(ws.batch_n[e]):
        r = ws.batch[e, k]
        ttft = now - ws.arrival[r]
        sum_ttft += ttft
        cg = ws.cat[r]
        cr = cg & 1
        g = cg >> 1
        g_ttft[cr, g] += ttft
        g_count[cr, g] += 1
        h = hist_bucket(ttft)
        if cr == SHORT:
            sum_s += ttft
            out.hist_short[h] += 1
            pending_s -= 1
        else:
            sum_l += ttft
            out.hist_long[h] += 1
            pending_l -= 1
        ws.outstanding[e] -= 1
        if counted and ttft <= ttft_slo:
            good += 1
        if keep:
            r_f[RQ.first_token, r] = now
    ws.t_done[e] = np.inf
    return sum_ttft, sum_s, sum_l, pending_s, pending_l, good


@step
def _rebalance(now, ws, out, ratio, pending_s, pending_l, moves):
    """The router's dynamic allocation at ``now``: one instance moves toward
    the group whose pending requests exceed ``ratio`` times the other's,
    each group keeping one (logged in ``out``'s moves).  Returns the
    moves so far."""
    group = ws.group
    n_group = ws.n_group
    src = -1
    if pending_s > ratio * pending_l and n_group[LONG] > 1:
        src = LONG
    elif pending_l > ratio * pending_s and n_group[SHORT] > 1:
        src = SHORT
    if src >= 0:
        mv = _take(group, ws.outstanding, src)
        group[mv] = 1 - src
        n_group[src] -= 1
        n_group[1 - src] += 1
        if moves < out.move_time.shape[0]:
            out.move_time[moves] = now
            out.move_instance[moves] = mv
            out.move_group[moves] = 1 - src
        moves += 1
    return moves


@step
def _enqueue(r, e, c, since, dual, window, ws):
    """Request r of category c into instance e's queue: its category's with
    the dual queue, else the one FIFO (a short queue it starts opens its
    window, ``window`` s after ``since``: its arrival)."""
    qi = c if dual else SHORT
    qt = ws.qt
    ws.nxt[r] = -1
    if qt[e, qi] >= 0:
        ws.nxt[qt[e, qi]] = r
    else:
        ws.qh[e, qi] = r
        if qi == SHORT:
            ws.deadline[e] = since + window
    qt[e, qi] = r
    ws.qn[e, qi] += 1


@step
def _engine_event(e, add, now, dual, window, dynamic, ws, r_i, keep, router):
    """Instance e joins the pool (``add``), or leaves it at ``now``: it
    runs its batch to its end, and the requests in its queues (the short
    one's first, each in its order) are handed back to the router, each
    routed again as it arrives (:func:`_least_outstanding`: an instance in
    its group, or of all if none of its group is in) keeping its arrival
    (its short window runs from it).  The router's groups count the
    instances in the pool (the short group's time-integral closed at
    ``now`` first, with dynamic allocation).  Returns the router's state
    and the requests handed back."""
    g_arr, g_next, short_time, t_prev, last_check, moves = router
    if dynamic:
        short_time += ws.n_group[SHORT] * (now - t_prev)
        t_prev = now
    router = (g_arr, g_next, short_time, t_prev, last_check, moves)
    if add:
        ws.group[e] -= OUT
        ws.n_group[ws.group[e]] += 1
        return router, 0
    ws.n_group[ws.group[e]] -= 1
    ws.group[e] += OUT
    handed = 0
    for qi in range(2):
        r = ws.qh[e, qi]
        ws.qh[e, qi] = -1
        ws.qt[e, qi] = -1
        ws.qn[e, qi] = 0
        while r >= 0:
            nx = ws.nxt[r]
            ws.outstanding[e] -= 1
            _place(r, ws.cat[r] & 1, ws.arrival[r], dynamic, dual, window, ws, keep, r_i, True)
            handed += 1
            r = nx
    return router, handed


@step
def _place(r, c, since, dynamic, dual, window, ws, keep, r_i, events):
    """Request r of category c routed: to the least-outstanding instance in
    the pool of its group (of all without dynamic allocation;
    :func:`_least_outstanding`), into its queue (its short window from
    ``since``: its arrival), its instance recorded.  Returns the instance."""
    e = _least_outstanding(ws.group, ws.outstanding, c, not dynamic, events)
    ws.outstanding[e] += 1
    _enqueue(r, e, c, since, dual, window, ws)
    if keep:
        r_i[RQ.instance, r] = e
    return e


@step
def _start_idle(now, dual, window, max_batch, max_batch_tokens, a, b, ws, r_f, keep, n_batches, busy, sum_batch):
    """Every idle instance in the pool starts a batch at ``now`` if one is
    due (:func:`_start_batch`; after a hand-back).  Returns the batches,
    busy time and batched requests so far."""
    for e in range(ws.t_done.shape[0]):
        if ws.group[e] < OUT and ws.t_done[e] == np.inf:
            n_batches, busy, sum_batch = _start_batch(e, now, dual, window, max_batch, max_batch_tokens, a, b, ws,
                                                      r_f, keep, n_batches, busy, sum_batch)
    return n_batches, busy, sum_batch


@step
def _start_batch(e, now, dual, window, max_batch, max_batch_tokens, a, b, ws, r_f, keep, n_batches, busy,
                 sum_batch):
    """Idle instance e starts a batch at ``now`` if one is due
    (:func:`_dispatch`), its requests' batch start recorded.  Returns the
    batches, busy time and batched requests so far."""
    service = _dispatch(e, now, dual, window, max_batch, max_batch_tokens, a, b, ws.arrival, ws.prompt, ws.nxt,
                        ws.qh, ws.qt, ws.qn, ws.batch, ws.batch_n, ws.t_done, ws.deadline)
    if service >= 0.0:
        n_batches += 1
        busy += service
        sum_batch += ws.batch_n[e]
        if keep:
            for k in range(ws.batch_n[e]):
                r_f[RQ.start, ws.batch[e, k]] = now
    return n_batches, busy, sum_batch


@step
def _set_up(E, dynamic, long0, ws):
    """The router's groups (the highest ``long0`` ids long with dynamic
    allocation, else every instance short) and every instance idle with
    empty queues."""
    n_group = ws.n_group
    n_group[0] = 0
    n_group[1] = 0
    for e in range(E):
        ws.group[e] = LONG if (dynamic and e >= E - long0) else SHORT
        n_group[ws.group[e]] += 1
        ws.outstanding[e] = 0
        ws.t_done[e] = np.inf
        for q in range(2):
            ws.qh[e, q] = -1
            ws.qt[e, q] = -1
            ws.qn[e, q] = 0


@step
def _group_of(r, n, G, g_arr, g_next):
    """Request r's group of arrivals, ``r * G // n``, by the groups' first
    requests (one division a group): returns it and the next group's first."""
    while r >= g_next:
        g_arr += 1
        g_next = ((g_arr + 1) * n + G - 1) // G
    return g_arr, g_next


@step
def settings(config):
    """The run's settings the steps read, from ``config``: the threshold,
    the batch's most requests, the dual queue, dynamic allocation (two
    instances at least), keeping records, the window and whether it
    applies (the dual queue's), the batch's most tokens, the
    rebalancing's interval and ratio, and the prefill time's ``a`` and
    ``b``."""
    ci, cf = config
    dual = ci[C.dual] != 0
    window = cf[C.window]
    return (ci[C.threshold], ci[C.max_batch], dual, ci[C.dynamic] != 0 and ci[C.instances] >= 2, ci[C.keep] != 0,
            window, dual and window > 0.0, cf[C.max_batch_tokens], cf[C.interval], cf[C.ratio], cf[C.a], cf[C.b])


@step
def _router_state(n, G, first):
    """The router's state before the first of ``n`` arrivals (``first`` its
    time; ``G`` groups of arrivals): the group of arrivals of the next
    request and the first request of the next group, the time-integral of
    the short group's size and its last update, the last rebalancing (none)
    and the moves so far."""
    return np.int64(0), (n + G - 1) // G, 0.0, first, -np.inf, np.int64(0)


@step
def _arrive(r, now, n, G, threshold, dual, window, dynamic, interval, ratio, ws, out, keep, r_i, r_f, router,
            pending_s, pending_l, n_short, events):
    """Request r (of ``n``; its prompt ``ws.prompt[r]``) arrives at ``now``:
    short or long by ``threshold``, its group of arrivals, then the router
    rebalances if due (``dynamic``, at most once per ``interval``) and
    sends it to the least-outstanding instance of its group (of all
    without dynamic allocation), into that instance's queue (``events``:
    whether instances may be out of the pool).  Returns its instance, the
    router's state (:func:`_router_state`'s) and the counts."""
    g_arr, g_next, short_time, t_prev, last_check, moves = router
    c = SHORT if ws.prompt[r] <= threshold else LONG
    g_arr, g_next = _group_of(r, n, G, g_arr, g_next)
    ws.cat[r] = c | (g_arr << 1)
    if c == SHORT:
        n_short += 1
    if dynamic and now - last_check >= interval:
        short_time += ws.n_group[SHORT] * (now - t_prev)
        t_prev = now
        last_check = now
        moves = _rebalance(now, ws, out, ratio, pending_s, pending_l, moves)
    if c == SHORT:
        pending_s += 1
    else:
        pending_l += 1
    e = _place(r, c, now, dynamic, dual, window, ws, keep, r_i, events)
    if keep:
        r_i[RQ.category, r] = c
        r_f[RQ.arrival, r] = now
        r_f[RQ.prompt, r] = ws.prompt[r]
    return e, (g_arr, g_next, short_time, t_prev, last_check, moves), pending_s, pending_l, n_short


@step
def _finish(out, router, dynamic, short_group, last, first_arrival, counts, sums):
    """The run's statistics into ``out`` (:data:`STATS`): ``counts`` the
    completed requests, batches, short requests and first tokens within
    the objective, ``sums`` the busy time and the times to first token
    (all, short, long) and batched requests; the short group's
    time-integral closed at the ``last`` completion."""
    _, _, short_time, t_prev, _, moves = router
    if dynamic and last > t_prev:
        short_time += short_group * (last - t_prev)
    st_i, st_f = out.ints, out.floats
    st_i[S.completed], st_i[S.batches], st_i[S.short], st_i[S.good] = counts
    st_i[S.moves] = moves
    st_f[S.first_arrival] = first_arrival
    st_f[S.last_completion] = last
    st_f[S.busy], st_f[S.sum_ttft], st_f[S.sum_ttft_short], st_f[S.sum_ttft_long], st_f[S.sum_batch] = sums
    st_f[S.short_instance_time] = short_time


#: LAPS's instances as the open-loop driver's stage (:mod:`.driver`): the
#: run's ``config`` and ``inputs``, its outputs, records (``requests``) and
#: workspace, and the instances' ``events`` (their times, instances and 1 to
#: join, 0 to leave: :func:`_engine_event`; in time order)
LapsStage = namedtuple("LapsStage", ("config", "inputs", "out", "requests", "ws", "events"))


@stage_step
def _set_up_open_laps(st, streams, estop):
    """The requests drawn (arrival times and prompt lengths, one stream
    each), the instances set up.  Returns the loop's state: the settings;
    the router; the requests pending short and long; completed, first
    tokens within the objective, batches, short requests; busy time, the
    sums of the times to first token (all, short, long) and of the batch
    sizes; the last batch end; the next instance event; the events taken
    (``stop`` is checked every 65,536)."""
    config, inputs, ws = st.config, st.inputs, st.ws
    ci, cf = config
    n = ci[C.n]
    rate = cf[C.rate]
    inv_rate = 1.0 / rate if rate > 0.0 else 0.0
    draw_arrivals(ws.draws[0], 0.0, inv_rate, inputs.arrival_times, np.int64(0), n, streams.arrival, ws.arrival,
                  inputs.arrival_params, inputs.arrival_ends, np.int64(0), -1.0)
    draw_block(ws.draws[1], inputs.prompt_params, inputs.prompt_values, np.int64(0), n, streams.prompt, ws.prompt)
    round_lengths(ws.prompt, n, ci[C.integer] != 0)
    ttft_slo = cf[C.ttft_slo]
    G = st.out.group_ttft.shape[1]
    # (goodput's count only where the objective is set: it costs nothing otherwise)
    s = settings(config) + (ttft_slo, ttft_slo < np.inf, G)
    _set_up(ci[C.instances], s[3], ci[C.long0], ws)
    return (s, _router_state(n, G, ws.arrival[0] if n > 0 else 0.0), 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0,
            -np.inf, 0, 0)


@stage_step
def _arrival_laps(st, carry, j):
    return st.ws.arrival[j]


@stage_step
def _until_laps(st, carry, t, stop, streams, estop):
    """The instances' events before an arrival at ``t`` (inf: every one
    left), in LAPS's order: at equal times a batch end, then an instance's
    event, then the arrival, then a window expiring; the instance an event
    touched starts a batch if one is due.  Run out, the instances' events
    after the last batch are not taken."""
    s, router, pending_s, pending_l, completed, good, n_batches, n_short, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev, steps = carry
    threshold, max_batch, dual, dynamic, keep, window, windowed, max_batch_tokens, interval, ratio, a, b, ttft_slo, \
        counted, G = s
    ws, out, events = st.ws, st.out, st.events
    r_i, r_f = st.requests
    code = DONE
    while True:
        steps += 1
        if (steps & 65535) == 0 and stop[STOP] != 0:
            code = STOPPED
            break
        t_e = np.inf
        if EVENTS and ev < events[0].shape[0]:
            t_e = events[0][ev]
        t_c, e_c, t_w, e_w = _next_events(ws.t_done, ws.qn, ws.deadline, windowed)
        if t == np.inf and e_c < 0 and e_w < 0:
            break
        if e_c >= 0 and t_c <= t and t_c <= t_w and (not EVENTS or t_c <= t_e):
            now = t_c
            e = e_c
            completed += ws.batch_n[e]
            sum_ttft, sum_s, sum_l, pending_s, pending_l, good = _end_batch(
                e, now, ws, out, r_f, keep, counted, ttft_slo, sum_ttft, sum_s, sum_l, pending_s, pending_l, good)
            last = now
        elif EVENTS and t_e <= t and t_e <= t_w and t_e < np.inf:
            now = t_e
            router, handed = _engine_event(events[1][ev], events[2][ev] != 0, now, dual, window, dynamic, ws, r_i,
                                           keep, router)
            e = events[1][ev]
            ev += 1
            if handed:
                n_batches, busy, sum_batch = _start_idle(now, dual, window, max_batch, max_batch_tokens, a, b, ws,
                                                         r_f, keep, n_batches, busy, sum_batch)
        elif t <= t_w and t < np.inf:
            # (the arrival comes next)
            break
        else:
            now = t_w
            e = e_w
        if ws.t_done[e] == np.inf:
            n_batches, busy, sum_batch = _start_batch(e, now, dual, window, max_batch, max_batch_tokens, a, b, ws,
                                                      r_f, keep, n_batches, busy, sum_batch)
    return code, (s, router, pending_s, pending_l, completed, good, n_batches, n_short, busy, sum_ttft, sum_s, sum_l,
                  sum_batch, last, ev, steps)


@stage_step
def _arrive_open_laps(st, carry, j, t):
    """Request j, arriving at ``t``, routed by LAPS's router into an
    instance's queue (:func:`_arrive`); the instance starts a batch if idle
    and one is due."""
    s, router, pending_s, pending_l, completed, good, n_batches, n_short, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev, steps = carry
    threshold, max_batch, dual, dynamic, keep, window, windowed, max_batch_tokens, interval, ratio, a, b, ttft_slo, \
        counted, G = s
    ws = st.ws
    r_i, r_f = st.requests
    e, router, pending_s, pending_l, n_short = _arrive(
        j, t, st.config[0][C.n], G, threshold, dual, window, dynamic, interval, ratio, ws, st.out, keep, r_i, r_f,
        router, pending_s, pending_l, n_short, EVENTS)
    if ws.t_done[e] == np.inf:
        n_batches, busy, sum_batch = _start_batch(e, t, dual, window, max_batch, max_batch_tokens, a, b, ws, r_f, keep,
                                                  n_batches, busy, sum_batch)
    return (s, router, pending_s, pending_l, completed, good, n_batches, n_short, busy, sum_ttft, sum_s, sum_l,
            sum_batch, last, ev, steps)


@stage_step
def _run_out_laps(st, carry, n, stop, streams, estop):
    """Every event left (:func:`_until_laps` to inf), then the statistics
    written (:func:`_finish`)."""
    code, carry = _until_laps(st, carry, np.inf, stop, streams, estop)
    s, router, pending_s, pending_l, completed, good, n_batches, n_short, busy, sum_ttft, sum_s, sum_l, sum_batch, \
        last, ev, steps = carry
    ws = st.ws
    _finish(st.out, router, s[3], ws.n_group[SHORT], last, ws.arrival[0] if n > 0 else np.nan,
            (completed, n_batches, n_short, good), (busy, sum_ttft, sum_s, sum_l, sum_batch))
    return code


#: the instances' steps taking their events
_until_laps_events = variant(stage_step, _until_laps, "_until_laps_events", EVENTS=True)
_arrive_open_laps_events = variant(stage_step, _arrive_open_laps, "_arrive_open_laps_events", EVENTS=True)
_run_out_laps_events = variant(stage_step, _run_out_laps, "_run_out_laps_events", _until_laps=_until_laps_events)

#: LAPS: the open-loop driver (:mod:`.driver`) compiled with its instances'
#: steps; an arrival comes once every batch ending at or before it has ended
#: and every window expiring before it has expired
laps_kernel = open_loop_driver("laps_kernel", __name__, _set_up_open=_set_up_open_laps, _arrival=_arrival_laps,
                               _until=_until_laps, _arrive_open=_arrive_open_laps, _run_out=_run_out_laps)
#: :data:`laps_kernel` taking the instances' events
laps_events_kernel = open_loop_driver("laps_events_kernel", __name__, _set_up_open=_set_up_open_laps,
                                      _arrival=_arrival_laps, _until=_until_laps_events,
                                      _arrive_open=_arrive_open_laps_events, _run_out=_run_out_laps_events)


#: the most groups of arrivals the backlog check can ask for (a request's category and group share an int8)
MAX_GROUPS = 64


def allocate(cfg: dict, n: int, groups: int) -> tuple:
    """The outputs, records (``cfg["keep"]``) and workspace of a run of
    ``n`` requests on the unpacked config ``cfg``."""
    E, B = cfg["instances"], cfg["max_batch"]
    ints, floats = STATS.zeros(last_completion=-np.inf)
    out = OUTPUTS.pack(ints=ints, floats=floats, hist_short=np.zeros(HIST_SIZE, np.int64),
                       hist_long=np.zeros(HIST_SIZE, np.int64),
                       move_time=np.full(MOVES_MAX, np.nan), move_instance=np.full(MOVES_MAX, -1, np.int64),
                       move_group=np.full(MOVES_MAX, -1, np.int64), group_ttft=np.zeros((2, groups)),
                       group_count=np.zeros((2, groups), np.int64))
    requests = REQUESTS.records(n if cfg["keep"] else 0)
    ws = WORKSPACE.pack(arrival=np.empty(n), prompt=np.empty(n), nxt=np.empty(n, np.int64), cat=np.empty(n, np.int8),
                        qh=np.empty((E, 2), np.int64), qt=np.empty((E, 2), np.int64), qn=np.empty((E, 2), np.int64),
                        batch=np.empty((E, B), np.int64), batch_n=np.zeros(E, np.int64), t_done=np.empty(E),
                        deadline=np.full(E, np.inf),
                        group=np.empty(E, np.int64), n_group=np.empty(2, np.int64),
                        outstanding=np.empty(E, np.int64), draws=drawers(cfg["arrival_kind"], cfg["prompt_kind"]))
    return out, requests, ws


def run(config, inputs: LapsInputs, streams: LapsStreams, stop: np.ndarray, groups: int = 1, events=None):
    """Simulate ``config`` (:data:`CONFIG` ``.pack(...)``) on ``inputs``,
    with ``groups`` contiguous groups of arrivals for the backlog check:
    returns ``(outputs, requests, code)``, the statistics as
    ``STATS.unpack((outputs.ints, outputs.floats))``, the per-request
    records as ``{field: row}`` (or None without ``keep``), and the
    kernel's code (1: stopped by ``stop[STOP]``, checked every 1,024
    arrivals, when ``stop[ARRIVED]`` gets the requests arrived so far, and
    every 65,536 of the instances' events).  ``events``: the
    instances leaving and joining (:func:`.continuous_cluster.run`'s; None:
    none)."""
    check_stop(stop)
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"groups must be an integer in [1, {MAX_GROUPS}]; got {groups!r}")
    cfg = CONFIG.unpack(config)
    out, requests, ws = allocate(cfg, cfg["n"], groups)
    events = event_arrays(events)
    stage = LapsStage(config, inputs, out, requests, ws, events)
    code = (laps_events_kernel if events[0].size else laps_kernel)(stage, cfg["n"], streams, stop,
                                                                   np.zeros_like(stop))
    return out, (REQUESTS.rows(requests) if cfg["keep"] else None), code


def warmup() -> None:
    """Compile the kernel (or load it from the cache) on a tiny input."""
    config = CONFIG.pack(n=4, arrival_kind=ARR_POISSON, prompt_kind=SVC_UNIFORM, integer=1, instances=2,
                         threshold=256, max_batch=2, dual=1, dynamic=1, long0=1, keep=1, rate=1.0, window=0.005,
                         max_batch_tokens=1000.0, interval=1.0, ratio=2.0, a=0.01, b=1e-4, ttft_slo=0.1)
    inputs = INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                         prompt_params=np.array([1.0, 500.0]), prompt_values=np.empty(0))
    gen = np.random.default_rng(0)
    run(config, inputs, LapsStreams(gen, gen), np.zeros(STOP_SIZE, np.int64))
