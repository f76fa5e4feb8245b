"""A plain-Python LAPS prefill pool, written from the rules of
"LAPS: Length-Aware Prefill Scheduling" (2026, arXiv:2601.11589) as
mbbatch.LAPS's docstring states them, independently of the kernel
(mbbatch._kernels.laps), with instances leaving and joining the pool
(mbbatch.Disaggregated's ``prefill_events`` on a LAPS pool).

A request of at most ``threshold`` prompt tokens is short, a longer one
long.  The router sends a request to the instance in the pool with the
fewest outstanding requests (ties to the lowest id): of its group with
dynamic allocation (and two instances at least), of all the instances
without, or of all those in the pool when none of its group is.  With
dynamic allocation, on an arrival at least ``interval`` s after the last
check, it first moves one instance (of the group giving it, in the pool,
the fewest outstanding, ties to the highest id) toward the group whose
pending requests exceed ``ratio`` times the other's, if the giving group
keeps one in the pool.  Each instance runs one batch at a time, taken
from its queue's head while it holds fewer than ``max_batch`` and its
prompts fit ``max_batch_tokens`` (the first always joins): with the dual
queue the short queue's once its oldest request has waited ``window``
(``max_batch`` queued, or window 0: at once), else the long queue's;
without it, one FIFO.  A batch takes ``a + b x its prompt tokens``.  An
instance leaving runs its batch to its end and hands the requests in its
queues (the short queue's first, each in its order) back to the router,
each routed again as it arrives, keeping its arrival (its window runs
from it); one joining takes requests again, in the group it was in.  At
equal times: batch ends, then the pool's events, then arrivals, then
windows; an event's hand-back lets every idle instance in the pool start
a batch.
"""

from __future__ import annotations

import math

import numpy as np

SHORT, LONG = 0, 1


def simulate(arrival, prompt, *, instances, threshold, window, max_batch, max_batch_tokens, dual_queue, dynamic,
             interval, ratio, long_instances, a, b, events=()) -> dict:
    """Each request's instance, batch start and first token (in arrival
    order), and the requests handed back; ``events``: ``(time, instance,
    add)`` in time order."""
    n, E = len(arrival), instances
    dynamic = dynamic and E >= 2
    group = [LONG if dynamic and e >= E - long_instances else SHORT for e in range(E)]
    present = [True] * E
    outstanding = [0] * E
    queues = [[[], []] for _ in range(E)]
    deadline = [math.inf] * E
    t_done = [math.inf] * E
    batch = [[] for _ in range(E)]
    cat = [SHORT if prompt[r] <= threshold else LONG for r in range(n)]
    pending = [0, 0]
    last_check = -math.inf
    inst, start, first = np.full(n, -1), np.full(n, math.nan), np.full(n, math.nan)
    handed = 0

    def least(c):
        pool = [e for e in range(E) if present[e] and (not dynamic or group[e] == c)]
        pool = pool or [e for e in range(E) if present[e]]
        return min(pool, key=lambda e: (outstanding[e], e))

    def enqueue(r, e, since):
        q = queues[e][cat[r] if dual_queue else SHORT]
        if not q and (cat[r] == SHORT or not dual_queue):
            deadline[e] = since + window
        q.append(r)
        outstanding[e] += 1
        inst[r] = e

    def dispatch(e, now):
        short, long_ = queues[e]
        if dual_queue:
            if short and (window <= 0 or len(short) >= max_batch or now >= deadline[e]):
                q = short
            elif long_:
                q = long_
            else:
                return
        elif short:
            q = short
        else:
            return
        taken, tokens = [], 0.0
        while q and len(taken) < max_batch:
            if taken and tokens + prompt[q[0]] > max_batch_tokens:
                break
            tokens += prompt[q[0]]
            taken.append(q.pop(0))
        if q and q is short:
            deadline[e] = arrival[q[0]] + window
        batch[e] = taken
        t_done[e] = now + (a + b * tokens)
        start[taken] = now

    i, ev = 0, 0
    while True:
        t_arr = arrival[i] if i < n else math.inf
        t_e = events[ev][0] if ev < len(events) else math.inf
        busy = [e for e in range(E) if t_done[e] < math.inf]
        e_c = min(busy, key=lambda e: (t_done[e], e)) if busy else -1
        t_c = t_done[e_c] if busy else math.inf
        waiting = [e for e in range(E) if dual_queue and window > 0 and t_done[e] == math.inf and queues[e][SHORT]]
        e_w = min(waiting, key=lambda e: (deadline[e], e)) if waiting else -1
        t_w = deadline[e_w] if waiting else math.inf
        if e_c < 0 and i >= n and e_w < 0:
            break
        if e_c >= 0 and t_c <= t_arr and t_c <= t_w and t_c <= t_e:
            now, touched = t_c, [e_c]
            for r in batch[e_c]:
                first[r] = now
                pending[cat[r]] -= 1
                outstanding[e_c] -= 1
            batch[e_c], t_done[e_c] = [], math.inf
        elif t_e <= t_arr and t_e <= t_w and t_e < math.inf:
            now, e, add = events[ev]
            ev += 1
            present[e] = bool(add)
            touched = [e]
            if not add:
                back = queues[e][SHORT] + queues[e][LONG]
                queues[e] = [[], []]
                for r in back:
                    outstanding[e] -= 1
                    enqueue(r, least(cat[r]), arrival[r])
                handed += len(back)
                if back:
                    touched = [x for x in range(E) if present[x]]
        elif i < n and t_arr <= t_w:
            now, r = t_arr, i
            i += 1
            c = cat[r]
            if dynamic and now - last_check >= interval:
                last_check = now
                inside = [sum(1 for e in range(E) if present[e] and group[e] == g) for g in (SHORT, LONG)]
                src = LONG if pending[SHORT] > ratio * pending[LONG] and inside[LONG] > 1 else (
                    SHORT if pending[LONG] > ratio * pending[SHORT] and inside[SHORT] > 1 else -1)
                if src >= 0:
                    mv = max((e for e in range(E) if present[e] and group[e] == src),
                             key=lambda e: (-outstanding[e], e))
                    group[mv] = 1 - src
            pending[c] += 1
            e = least(c)
            enqueue(r, e, now)
            touched = [e]
        else:
            now, touched = t_w, [e_w]
        for e in touched:
            if t_done[e] == math.inf:
                dispatch(e, now)
    return {"instance": inst, "start": start, "first_token": first, "handed": handed}
