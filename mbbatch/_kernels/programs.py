"""A cluster's programs (multi-call sessions) in the event kernel: the calls
of open-loop programs put in arrival order before a run (called from
Python), and a closed loop's calls waiting to arrive, in a heap, during it.

Call c of program p has the id ``p C + c`` (``C`` calls a program).  An
open-loop call arrives at its program's start plus its think times; a
closed-loop call ``gap`` s after the one before it completes.
"""

from __future__ import annotations

import math

import numpy as np

from .common import PRED_REPLAY, helper, step
from .queues import Q

__all__ = ["NO_PROGRAMS", "NO_CLOSED_LOOP", "SORT_MOVES", "call_times", "sort_calls", "permute_calls",
           "program_span", "order_calls"]


#: the programs of a cluster run without them
NO_PROGRAMS = dict(program=np.empty(0, np.int64), new_tokens=np.empty(0), session_end=np.empty(0, np.int8))


#: the closed loop's arrays of a run without it
NO_CLOSED_LOOP = dict(call=np.empty(0, np.int64), start=np.empty(0), gap=np.empty(0), new=np.empty(0),
                      out=np.empty(0), heap_t=np.empty(1), heap_id=np.empty(1, np.int64))


@step
def _before(t, k, t2, k2):
    """Whether call (t, k) comes before call (t2, k2): by time, then id."""
    return t < t2 or (t == t2 and k < k2)


@step
def _heap_push(ht, hid, size, t, k):
    """Call k at time t into the binary heap ``(ht, hid)`` of ``size``
    calls; returns the new size."""
    j = size
    while j > 0:
        p = (j - 1) >> 1
        if _before(ht[p], hid[p], t, k):
            break
        ht[j] = ht[p]
        hid[j] = hid[p]
        j = p
    ht[j] = t
    hid[j] = k
    return size + 1


@step
def _heap_pop(ht, hid, size):
    """The first call of the heap, ``(t, k, new size)``."""
    t = ht[0]
    k = hid[0]
    size -= 1
    if size > 0:
        lt = ht[size]
        lk = hid[size]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= size:
                break
            if c + 1 < size and _before(ht[c + 1], hid[c + 1], ht[c], hid[c]):
                c += 1
            if _before(lt, lk, ht[c], hid[c]):
                break
            ht[j] = ht[c]
            hid[j] = hid[c]
            j = c
        ht[j] = lt
        hid[j] = lk
    return t, k, size


@step
def _closed_call(t, k, C, i, new, out, program, new_tokens, session_end, call, predictions, predictor, integer,
                 blk):
    """Step 1 of a closed loop: call k (call c of program p, k = p C + c)
    arriving at t becomes request i, in column 0 of ``blk``: its prompt is
    its program's context (every earlier call's new tokens and output) plus
    its new tokens, its prediction the truth (or the given one, in whole
    tokens when ``integer``)."""
    p = k // C
    row = p * C
    c = k - row
    s = 0.0
    for j in range(c + 1):
        s += new[row + j] + out[row + j]
    o = out[row + c]
    blk[Q.arrival, 0] = t
    blk[Q.prompt, 0] = s - o
    blk[Q.output, 0] = o
    if predictor == PRED_REPLAY:
        v = predictions[i]
        if integer:
            v = math.ceil(v)
            v = v if v >= 1.0 else 1.0
        blk[Q.pred, 0] = v
    else:
        blk[Q.pred, 0] = o
    program[i] = p
    new_tokens[i] = new[row + c]
    session_end[i] = 1 if c == C - 1 else 0
    call[i] = k


@step
def _follow_ups(q, qidx, b, h0, nb, mask, done, C, call, gap, heap_t, heap_id, hsize):
    """A closed loop: each member of the batch (the first nb of queue b, head
    at slot h0) that is not its program's last call has its program's next
    call wait to arrive ``gap`` s after the batch is ``done``."""
    ub = np.uint64(b)
    for j in range(nb):
        k = call[qidx[ub, np.uint64((h0 + j) & mask)]] + 1
        if k % C != 0:
            hsize = _heap_push(heap_t, heap_id, hsize, done + gap[k], k)
    return hsize


#: insertion-sort moves per call beyond which :func:`sort_calls` gives up (a
#: sort of times this far from their buckets' order is left to numpy)
SORT_MOVES = 64


@helper
def call_times(start, gap, new, out, C, times, ctx):
    """Each call's arrival time and prompt, by call id (call c of program p:
    p C + c), as numpy computes them on ``(P, C)`` arrays: ``times = start[:,
    None] + cumsum(gap, axis=1)`` with the first call's gap 0, and ``ctx =
    cumsum(new + out, axis=1) - out`` (the program's context before the call
    plus its new tokens), each sum added in order.  ``times`` may be
    ``gap`` (each gap is read before its time is written).  Returns the
    largest time (a program's last call: gaps are at least 0, and the
    starts ascend, so the least is ``times[0]``)."""
    hi = -np.inf
    for p in range(start.shape[0]):
        row = p * C
        g = 0.0
        s = 0.0
        for c in range(C):
            k = row + c
            if c > 0:
                g += gap[k]
            times[k] = start[p] + g
            s += new[k] + out[k]
            ctx[k] = s - out[k]
        t = times[row + C - 1]
        hi = t if t > hi else hi
    return hi


@step
def _bucket(t, lo, scale, nb):
    """The bucket of time ``t >= lo``: ``(t - lo) * scale`` cut to 0 .. nb - 1,
    the last bucket also when that is not finite (a span too small for the
    scale), so never less than an earlier time's."""
    x = (t - lo) * scale
    return int(x) if x < nb else nb - 1


@helper
def sort_calls(times, order, counts, lo, hi):
    """The call ids in the order of a stable sort of ``times`` into
    ``order``: a bucket sort (``counts.size - 1`` buckets of equal width
    between ``lo`` and ``hi``, the least and the largest time; the bucket is
    monotone in the time, so buckets never need reordering) finished by an
    insertion sort (moves only within a bucket, equal times kept in id
    order).  Returns False, ``order`` unfinished, when the insertion sort
    would take more than :data:`SORT_MOVES` moves per call (times bunched
    in few buckets)."""
    N = times.shape[0]
    nb = counts.shape[0] - 1
    scale = nb / (hi - lo) if hi > lo else 0.0
    counts[:] = 0
    for k in range(N):
        counts[_bucket(times[k], lo, scale, nb) + 1] += 1
    for b in range(nb):
        counts[b + 1] += counts[b]
    for k in range(N):
        b = _bucket(times[k], lo, scale, nb)
        order[counts[b]] = k
        counts[b] += 1
    budget = SORT_MOVES * N
    for j in range(1, N):
        k = order[j]
        t = times[k]
        i = j
        while i > 0 and times[order[i - 1]] > t:
            order[i] = order[i - 1]
            i -= 1
        budget -= j - i
        if budget < 0:
            return False
        order[i] = k
    return True


@helper
def permute_calls(order, times, ctx, new, out, C, last, session_end):
    """Puts the calls in the order ``order`` (every call's id), in place:
    afterwards ``times``, ``ctx``, ``new`` and ``out`` hold at i the values
    of call ``order[i]``, ``order`` holds its program, and ``session_end``
    (the first ``n`` calls, ``n`` its size) 1 on each program's last call
    among the first ``n``.  ``last`` (one per program) is scratch.  The
    permutation is applied cycle by cycle (a visited entry of ``order`` is
    complemented, ``~k < 0``): no array of the calls is copied."""
    N = order.shape[0]
    n = session_end.shape[0]
    last[:] = C - 1
    for j in range(n, N):
        # a call left out: its program's calls before it end the session
        k = order[j]
        p = k // C
        c = k - p * C
        if c - 1 < last[p]:
            last[p] = c - 1
    for i in range(N):
        if order[i] < 0:
            continue
        t0 = times[i]
        c0 = ctx[i]
        n0 = new[i]
        o0 = out[i]
        j = i
        while True:
            k = order[j]
            order[j] = ~k
            if k == i:
                times[j] = t0
                ctx[j] = c0
                new[j] = n0
                out[j] = o0
                break
            times[j] = times[k]
            ctx[j] = ctx[k]
            new[j] = new[k]
            out[j] = out[k]
            j = k
    for i in range(N):
        k = ~order[i]
        p = k // C
        if i < n:
            session_end[i] = 1 if k - p * C == last[p] else 0
        order[i] = p


@helper
def program_span(gap, C):
    """The longest span of a program: its gaps after the first call, summed
    in order (its last call's offset from its start, as :func:`call_times`
    adds them)."""
    span = 0.0
    for p in range(gap.shape[0] // C):
        row = p * C
        g = 0.0
        for c in range(1, C):
            g += gap[row + c]
        span = g if g > span else span
    return span


@helper
def order_calls(start, gap, new, out, C, chunk, top, ctx, prog, session_end, pos_last, f, tag, srt_t, srt_i,
                counts):
    """The open-loop programs' calls in arrival order (by time, then id), as
    :func:`call_times`, :func:`sort_calls` and :func:`permute_calls` give
    them, in one pass over the programs, ``chunk`` programs at a time: the
    calls earlier than the next chunk's first start (no later program has
    any) are sorted in a block that stays in cache (a bucket sort finished
    by an insertion sort) and written out; the later ones are carried to
    the next chunk.  ``top`` is at least every call's time (the last start
    plus the longest program span): the last chunk's buckets reach it.
    The times are written over ``gap``, the new tokens and
    outputs over ``new`` and ``out`` (position i is written once the
    programs holding the first i calls are read), the prompts into ``ctx``,
    each call's program into ``prog`` and, for the first ``n`` (the size of
    ``session_end``), 1 on each program's last call among them.
    ``pos_last`` (one per program; empty when ``n`` is every call: no
    session is cut short), ``f`` ``(3, cap, 4)`` (the calls to
    sort and two lists of carried calls: time, prompt, new tokens, output),
    ``tag`` ``(3, cap)`` (2 program + 1 on its last call), ``srt_t``,
    ``srt_i`` (cap) and ``counts`` are scratch; ``cap`` must hold a chunk's
    calls and those carried (see :func:`program_span`).  Returns the calls
    written, or -1 (nothing consistent written) when a chunk's calls did
    not fit."""
    P = start.shape[0]
    n = session_end.shape[0]
    cut = n < P * C
    cap = f.shape[1]
    nb = counts.shape[0] - 1
    ia = 1          # the carried calls: list ia, then list ib
    ib = 2
    ma = 0
    i = 0
    s_prev = start[0]
    for p0 in range(0, P, chunk):
        p_end = min(p0 + chunk, P)
        # (every call of this chunk and those carried: at least s_prev)
        s_next = start[p_end] if p_end < P else np.inf
        hi = s_next if p_end < P else top
        if ma + (p_end - p0) * C > cap:
            return -1
        lo = s_prev
        scale = nb / (hi - lo) if hi > lo else 0.0
        counts[:] = 0
        me = 0
        mb = 0
        # the calls carried, in id order: now (earlier than s_next) or carried again
        for j in range(ma):
            t = f[ia, j, 0]
            now = t < s_next
            L, h = (0, me) if now else (ib, mb)
            for x in range(4):
                f[L, h, x] = f[ia, j, x]
            tag[L, h] = tag[ia, j]
            if now:
                counts[_bucket(t, lo, scale, nb) + 1] += 1
                me += 1
            else:
                mb += 1
        # the chunk's calls (as call_times computes them), in id order
        for p in range(p0, p_end):
            row = p * C
            g = 0.0
            s = 0.0
            if cut:
                pos_last[p] = -1
            for c in range(C):
                k = row + c
                if c > 0:
                    g += gap[k]
                s += new[k] + out[k]
                t = start[p] + g
                tg = 2 * p + (1 if c == C - 1 else 0)
                if t < s_next:
                    f[0, me, 0] = t
                    f[0, me, 1] = s - out[k]
                    f[0, me, 2] = new[k]
                    f[0, me, 3] = out[k]
                    tag[0, me] = tg
                    counts[_bucket(t, lo, scale, nb) + 1] += 1
                    me += 1
                else:
                    f[ib, mb, 0] = t
                    f[ib, mb, 1] = s - out[k]
                    f[ib, mb, 2] = new[k]
                    f[ib, mb, 3] = out[k]
                    tag[ib, mb] = tg
                    mb += 1
        # their order (stable: equal times keep their id order)
        for b in range(nb):
            counts[b + 1] += counts[b]
        for j in range(me):
            t = f[0, j, 0]
            b = _bucket(t, lo, scale, nb)
            srt_t[counts[b]] = t
            srt_i[counts[b]] = j
            counts[b] += 1
        for j in range(1, me):
            t = srt_t[j]
            e = srt_i[j]
            h = j
            while h > 0 and srt_t[h - 1] > t:
                srt_t[h] = srt_t[h - 1]
                srt_i[h] = srt_i[h - 1]
                h -= 1
            srt_t[h] = t
            srt_i[h] = e
        for j in range(me):
            e = srt_i[j]
            gap[i] = srt_t[j]
            ctx[i] = f[0, e, 1]
            new[i] = f[0, e, 2]
            out[i] = f[0, e, 3]
            tg = tag[0, e]
            p = tg >> 1
            prog[i] = p
            if i < n:
                session_end[i] = tg & 1
                if cut:
                    pos_last[p] = i
            i += 1
        ia, ib = ib, ia
        ma = mb
        s_prev = s_next
    # a program with calls beyond the first n: its last call among them ends its session
    for j in range(n, i):
        p = prog[j]
        if pos_last[p] >= 0:
            session_end[pos_last[p]] = 1
    return i
