"""Shortest-predicted-first batching in the event kernel: the batch a free
server takes is the ``B`` waiting requests with the smallest predicted
output lengths (ties in arrival order); a request that has waited
``max_wait`` s or more goes first (oldest first), so no request starves.

A queue stays in arrival order.  :func:`spf_batch` moves the batch's members
to its head, in arrival order, the others behind them in theirs, so that the
event kernel serves the head as every rule's batch.  It chooses in
``O(m log B)`` for a queue of ``m`` (a max-heap of the ``B`` smallest keys,
whose greatest then marks the members: keys differ, by index) and moves in
one pass, in the rule's scratch: the heap, then the members' fields and
indices (:func:`scratch_size`).  It is compiled apart, the first time a
process runs the rule, and called by address (:func:`order_address`): the
event loop compiles none of it, so that every other rule's runs (and
:func:`mbbatch.warmup`) compile as quickly as before it existed.
"""

from __future__ import annotations

import numpy as np
from numba import types

from .common import APART, by_address, compiled_apart, step
from .queues import N_FIELDS, Q

__all__ = ["FORM_SPF", "ORDER_SIG", "call_order", "order_address", "scratch_size", "spf_batch"]

#: the rule's code (:mod:`.formation`)
FORM_SPF = 4


def scratch_size(batch_size: int) -> int:
    """Floats of scratch :func:`spf_batch` needs for batches of ``batch_size``
    (a heap of members, then their fields and indices)."""
    return (N_FIELDS + 2) * batch_size


@step
def _sift(heap, size, j, pred, idx):
    """Restore the max-heap of offsets ``heap[:size]`` by key (``pred`` of
    the offset, then ``idx``: the greatest at the root) below position j."""
    while True:
        c = 2 * j + 1
        if c >= size:
            return
        a = int(heap[c])
        if c + 1 < size:
            d = int(heap[c + 1])
            if pred[a] < pred[d] or (pred[a] == pred[d] and idx[a] < idx[d]):
                c += 1
                a = d
        t = int(heap[j])
        if not (pred[t] < pred[a] or (pred[t] == pred[a] and idx[t] < idx[a])):
            return
        heap[j] = a
        heap[c] = t
        j = c


@step
def _member(pred, idx, sl, kp, ki):
    """Whether the request at slot ``sl`` is a member: its key at or below
    the greatest chosen key ``(kp, ki)``."""
    return pred[sl] < kp or (pred[sl] == kp and idx[sl] <= ki)


@step
def _keep(q, qidx, ub, sl, sc, k):
    """The request at slot ``sl`` of queue ``ub`` into the scratch's k-th
    record."""
    for f in range(N_FIELDS):
        sc[k * (N_FIELDS + 1) + f] = q[f, ub, sl]
    sc[k * (N_FIELDS + 1) + N_FIELDS] = qidx[ub, sl]


@step
def _put(q, qidx, ub, sl, sc, k):
    """The scratch's k-th record into slot ``sl`` of queue ``ub``."""
    for f in range(N_FIELDS):
        q[f, ub, sl] = sc[k * (N_FIELDS + 1) + f]
    qidx[ub, sl] = np.int64(sc[k * (N_FIELDS + 1) + N_FIELDS])


@step
def _move(q, qidx, ub, to, frm):
    """The request at slot ``frm`` of queue ``ub`` to slot ``to``."""
    for f in range(N_FIELDS):
        q[f, ub, to] = q[f, ub, frm]
    qidx[ub, to] = qidx[ub, frm]


@step
def spf_batch(q, qidx, b, h, m, nb, now, max_wait, sc):
    """Put the ``nb`` requests of queue b (``m`` of them, from slot ``h``)
    that make its batch at ``now`` at the head of the queue: first those that
    have waited ``max_wait`` s or more (the queue's oldest, at its head
    already), then, of the others, the ``nb`` minus as many with the
    smallest predictions (ties in arrival order), in the scratch ``sc``.  The
    members keep their arrival order among themselves, and so do the
    requests left behind them.  Returns the queue's head slot after it: the
    members are gathered the cheaper way, the others before the last member
    moving back (the head stays) or those after the first member moving
    forward (the head moves back by the members chosen by key, where the
    ring has room): the same queue either way, at a cost of the requests
    moved, not of the queue (a backlog's newest requests, where the short
    ones wait, are gathered without moving the rest)."""
    mask = q.shape[2] - 1
    ub = np.uint64(b)
    # the requests that have waited too long: the oldest, at the head
    o = 0
    while o < nb and now - q[Q.arrival, ub, np.uint64((h + o) & mask)] >= max_wait:
        o += 1
    need = nb - o
    if need == 0 or nb == m:
        return h
    # the candidates' keys, by slot (offset j of the queue is at slot (h + j) & mask)
    pred = q[Q.pred, b]
    idx = qidx[b]
    # the need smallest keys: a max-heap of slots (their greatest key at the root)
    heap = sc[:need]
    for j in range(need):
        heap[j] = (h + o + j) & mask
    for j in range(need // 2 - 1, -1, -1):
        _sift(heap, need, j, pred, idx)
    # (the root's key in locals: a candidate above it, the common case, is one comparison)
    t = int(heap[0])
    tp = pred[t]
    ti = idx[t]
    # (the ring's slots in at most two runs)
    s0 = (h + o + need) & mask
    rest = m - o - need
    run = min(rest, mask + 1 - s0)
    for s1, s2 in ((s0, s0 + run), (0, rest - run)):
        for sl in range(s1, s2):
            p = pred[sl]
            if p < tp or (p == tp and idx[sl] < ti):
                heap[0] = sl
                _sift(heap, need, np.int64(0), pred, idx)
                t = int(heap[0])
                tp = pred[t]
                ti = idx[t]
    # the greatest chosen key: the members are the candidates at or below it (keys differ: by index)
    kp = tp
    ki = ti
    # the first and the last member
    first = o
    while not _member(pred, idx, np.uint64((h + first) & mask), kp, ki):
        first += 1
    last = m - 1
    while not _member(pred, idx, np.uint64((h + last) & mask), kp, ki):
        last -= 1
    if m - first + o < last - o + 1 and m + need <= mask + 1:
        # the others after the first member move forward, the members (arrival order) into the scratch
        kept = np.int64(0)
        for r in range(first, m):
            sr = np.uint64((h + r) & mask)
            if _member(pred, idx, sr, kp, ki):
                _keep(q, qidx, ub, sr, sc, kept)
                kept += 1
            else:
                _move(q, qidx, ub, np.uint64((h + r - kept) & mask), sr)
        # the overdue requests `need` slots back, in their order, then the members behind them
        for r in range(o):
            _move(q, qidx, ub, np.uint64((h + r - need) & mask), np.uint64((h + r) & mask))
        for t in range(need):
            _put(q, qidx, ub, np.uint64((h + o - need + t) & mask), sc, t)
        return (h - need) & mask
    # the others before the last member move back in their order, the members are kept (last first)
    w = last
    kept = np.int64(0)
    for r in range(last, o - 1, -1):
        sr = np.uint64((h + r) & mask)
        if _member(pred, idx, sr, kp, ki):
            _keep(q, qidx, ub, sr, sc, kept)
            kept += 1
            continue
        if w != r:
            _move(q, qidx, ub, np.uint64((h + w) & mask), sr)
        w -= 1
    # the members in front of them, in arrival order
    for t in range(need):
        _put(q, qidx, ub, np.uint64((h + o + t) & mask), sc, need - 1 - t)
    return h


#: a rule's step that orders a queue so that its batch is at the head, as
#: :func:`spf_batch`: (q, qidx, b, h, m, nb, now, max_wait, scratch) -> the
#: queue's head after it
ORDER_SIG = types.int64(types.Array(types.float64, 3, "C"), types.Array(types.int64, 2, "C"), types.int64,
                        types.int64, types.int64, types.int64, types.float64, types.float64,
                        types.Array(types.float64, 1, "C"))
#: ``call_order(address, args)``: the ordering step at ``address``
call_order = by_address(ORDER_SIG, "call_order")


def _order_spf():
    def order_spf(q, qidx, b, h, m, nb, now, max_wait, sc):
        return spf_batch(q, qidx, b, h, m, nb, now, max_wait, sc)
    return order_spf


APART[("order", FORM_SPF)] = _order_spf


def order_address() -> int:
    """The address of :func:`spf_batch`, compiled apart (the first time a
    process asks)."""
    return compiled_apart(("order", FORM_SPF), APART[("order", FORM_SPF)], ORDER_SIG).address
