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

Pure numba on arrays and scalars; the Python side is
:mod:`mbbatch.simulation` (``run`` allocates and calls).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import (ARR_POISSON, ARRIVED, HIST_SIZE, STOP, STOP_SIZE, SVC_UNIFORM, check_stop, draw_arrivals,
                     draw_block, drawers, hist_bucket, kernel, round_lengths, step)
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
#: arrival + window), the router's groups and outstanding counts, and the
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


@step
def _least_outstanding(group, outstanding, want, everyone):
    """The instance of group ``want`` (of all when ``everyone``) with the
    fewest outstanding requests, ties to the lowest id."""
    best = -1
    for e in range(group.shape[0]):
        if not everyone and group[e] != want:
            continue
        if best < 0 or outstanding[e] < outstanding[best]:
            best = e
    return best


@step
def _take(group, outstanding, src):
    """The instance that leaves group ``src``: fewest outstanding, ties to the highest id."""
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


@kernel
def laps_kernel(config, inputs, streams, out, requests, ws, stop):
    """Simulate the run ``config``; statistics and records are written in
    place.  Returns 0, or 1 once ``stop[STOP]`` was set (checked every
    65,536 events, when ``stop[ARRIVED]`` gets the requests arrived so far)."""
    ci, cf = config
    n = ci[C.n]
    E = ci[C.instances]
    threshold = ci[C.threshold]
    max_batch = ci[C.max_batch]
    dual = ci[C.dual] != 0
    dynamic = ci[C.dynamic] != 0 and E >= 2
    keep = ci[C.keep] != 0
    window = cf[C.window]
    windowed = dual and window > 0.0
    max_batch_tokens = cf[C.max_batch_tokens]
    interval = cf[C.interval]
    ratio = cf[C.ratio]
    a = cf[C.a]
    b = cf[C.b]
    rate = cf[C.rate]
    inv_rate = 1.0 / rate if rate > 0.0 else 0.0
    ttft_slo = cf[C.ttft_slo]
    # (goodput's count only where the objective is set: it costs nothing otherwise)
    counted = ttft_slo < np.inf

    arrival = ws.arrival
    prompt = ws.prompt
    nxt = ws.nxt
    cat = ws.cat
    qh = ws.qh
    qt = ws.qt
    qn = ws.qn
    batch = ws.batch
    batch_n = ws.batch_n
    t_done = ws.t_done
    deadline = ws.deadline
    group = ws.group
    outstanding = ws.outstanding
    hist_s = out.hist_short
    hist_l = out.hist_long
    g_ttft = out.group_ttft
    g_count = out.group_count
    G = g_ttft.shape[1]
    r_i = requests[0]
    r_f = requests[1]

    # the requests: arrival times and prompt lengths, one stream each
    draw_arrivals(ws.draws[0], 0.0, inv_rate, inputs.arrival_times, np.int64(0), n, streams.arrival, arrival,
                  inputs.arrival_params, inputs.arrival_ends, np.int64(0), -1.0)
    draw_block(ws.draws[1], inputs.prompt_params, inputs.prompt_values, np.int64(0), n, streams.prompt, prompt)
    round_lengths(prompt, n, ci[C.integer] != 0)

    # the router: groups (highest ids long), pending per category
    n_group = ws.n_group
    n_group[0] = 0
    n_group[1] = 0
    for e in range(E):
        group[e] = LONG if (dynamic and e >= E - ci[C.long0]) else SHORT
        n_group[group[e]] += 1
        outstanding[e] = 0
        t_done[e] = np.inf
        qh[e, 0] = -1
        qh[e, 1] = -1
        qt[e, 0] = -1
        qt[e, 1] = -1
        qn[e, 0] = 0
        qn[e, 1] = 0
    pending_s = 0
    pending_l = 0
    last_check = -np.inf
    moves = 0
    # the group of arrivals of the next request and the first request of the next group
    g_arr = np.int64(0)
    g_next = (n + G - 1) // G
    # (the time-average of the short group's size)
    short_time = 0.0
    t_prev = arrival[0] if n > 0 else 0.0

    completed = 0
    good = 0
    n_batches = 0
    n_short = 0
    busy = 0.0
    sum_ttft = 0.0
    sum_s = 0.0
    sum_l = 0.0
    sum_batch = 0.0
    last = -np.inf
    i = 0
    events = 0
    code = 0
    while True:
        events += 1
        if (events & 65535) == 0:
            if stop[STOP] != 0:
                code = 1
                break
            stop[ARRIVED] = i
        t_arr = arrival[i] if i < n else np.inf
        # the first batch end, and the first short window to expire on an idle instance
        t_c = np.inf
        e_c = -1
        t_w = np.inf
        e_w = -1
        for e in range(E):
            td = t_done[e]
            if td < t_c:
                t_c = td
                e_c = e
            elif windowed and td == np.inf and qn[e, SHORT] > 0 and deadline[e] < t_w:
                t_w = deadline[e]
                e_w = e
        if e_c < 0 and i >= n and e_w < 0:
            break
        if e_c >= 0 and t_c <= t_arr and t_c <= t_w:
            now = t_c
            e = e_c
            for k in range(batch_n[e]):
                r = batch[e, k]
                ttft = now - arrival[r]
                sum_ttft += ttft
                cg = cat[r]
                cr = cg & 1
                g = cg >> 1
                g_ttft[cr, g] += ttft
                g_count[cr, g] += 1
                h = hist_bucket(ttft)
                if cr == SHORT:
                    sum_s += ttft
                    hist_s[h] += 1
                    pending_s -= 1
                else:
                    sum_l += ttft
                    hist_l[h] += 1
                    pending_l -= 1
                outstanding[e] -= 1
                if counted and ttft <= ttft_slo:
                    good += 1
                if keep:
                    r_f[RQ.first_token, r] = now
            completed += batch_n[e]
            last = now
            t_done[e] = np.inf
        elif i < n and t_arr <= t_w:
            now = t_arr
            r = i
            i += 1
            c = SHORT if prompt[r] <= threshold else LONG
            # its group of arrivals, r * G // n, by the groups' first requests (one division a group)
            while r >= g_next:
                g_arr += 1
                g_next = ((g_arr + 1) * n + G - 1) // G
            cat[r] = c | (g_arr << 1)
            if c == SHORT:
                n_short += 1
            # the router: rebalance if due, then the least-outstanding instance of the group
            if dynamic and now - last_check >= interval:
                short_time += n_group[SHORT] * (now - t_prev)
                t_prev = now
                last_check = now
                src = -1
                if pending_s > ratio * pending_l and n_group[LONG] > 1:
                    src = LONG
                elif pending_l > ratio * pending_s and n_group[SHORT] > 1:
                    src = SHORT
                if src >= 0:
                    mv = _take(group, outstanding, src)
                    group[mv] = 1 - src
                    n_group[src] -= 1
                    n_group[1 - src] += 1
                    if moves < out.move_time.shape[0]:
                        out.move_time[moves] = now
                        out.move_instance[moves] = mv
                        out.move_group[moves] = 1 - src
                    moves += 1
            e = _least_outstanding(group, outstanding, c, not dynamic)
            if c == SHORT:
                pending_s += 1
            else:
                pending_l += 1
            outstanding[e] += 1
            # the instance's queue: its category's with the dual queue, else the one FIFO
            qi = c if dual else SHORT
            nxt[r] = -1
            if qt[e, qi] >= 0:
                nxt[qt[e, qi]] = r
            else:
                qh[e, qi] = r
                if qi == SHORT:
                    deadline[e] = now + window
            qt[e, qi] = r
            qn[e, qi] += 1
            if keep:
                r_i[RQ.instance, r] = e
                r_i[RQ.category, r] = c
                r_f[RQ.arrival, r] = now
                r_f[RQ.prompt, r] = prompt[r]
        else:
            now = t_w
            e = e_w
        # the instance the event touched starts a batch if one is due
        if t_done[e] == np.inf:
            service = _dispatch(e, now, dual, window, max_batch, max_batch_tokens, a, b, arrival, prompt, nxt,
                                qh, qt, qn, batch, batch_n, t_done, deadline)
            if service >= 0.0:
                n_batches += 1
                busy += service
                sum_batch += batch_n[e]
                if keep:
                    for k in range(batch_n[e]):
                        r_f[RQ.start, batch[e, k]] = now
    if dynamic and last > t_prev:
        short_time += n_group[SHORT] * (last - t_prev)
    st_i, st_f = out.ints, out.floats
    st_i[S.completed] = completed
    st_i[S.batches] = n_batches
    st_i[S.short] = n_short
    st_i[S.moves] = moves
    st_i[S.good] = good
    st_f[S.first_arrival] = arrival[0] if n > 0 else np.nan
    st_f[S.last_completion] = last
    st_f[S.busy] = busy
    st_f[S.sum_ttft] = sum_ttft
    st_f[S.sum_ttft_short] = sum_s
    st_f[S.sum_ttft_long] = sum_l
    st_f[S.sum_batch] = sum_batch
    st_f[S.short_instance_time] = short_time
    return code


#: the most groups of arrivals the backlog check can ask for (a request's category and group share an int8)
MAX_GROUPS = 64


def run(config, inputs: LapsInputs, streams: LapsStreams, stop: np.ndarray, groups: int = 1):
    """Simulate ``config`` (:data:`CONFIG` ``.pack(...)``) on ``inputs``,
    with ``groups`` contiguous groups of arrivals for the backlog check:
    returns ``(outputs, requests, code)``, the statistics as
    ``STATS.unpack((outputs.ints, outputs.floats))``, the per-request
    records as ``{field: row}`` (or None without ``keep``), and the
    kernel's code (1: stopped by ``stop[STOP]``; ``stop[ARRIVED]`` gets the
    requests arrived so far every 65,536 events)."""
    check_stop(stop)
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"groups must be an integer in [1, {MAX_GROUPS}]; got {groups!r}")
    cfg = CONFIG.unpack(config)
    n, E, B = cfg["n"], cfg["instances"], cfg["max_batch"]
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
    code = laps_kernel(config, inputs, streams, out, requests, ws, stop)
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
