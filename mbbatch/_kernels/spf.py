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
indices (:func:`scratch_size`).  It is called, not inlined, from the event
loop: the other rules' loop stays as small (and as quick to compile) as it
was.
"""

from __future__ import annotations

import numpy as np

from .common import step, subroutine
from .queues import N_FIELDS, Q

__all__ = ["FORM_SPF", "scratch_size", "spf_batch"]

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


@subroutine
def spf_batch(q, qidx, b, h, m, nb, now, max_wait, sc):
    """Put the ``nb`` requests of queue b (``m`` of them, from slot ``h``)
    that make its batch at ``now`` at the head of the queue: first those that
    have waited ``max_wait`` s or more (the queue's oldest, at its head
    already), then, of the others, the ``nb`` minus as many with the
    smallest predictions (ties in arrival order), in the scratch ``sc``.  The
    members keep their arrival order among themselves, and so do the
    requests left behind them."""
    mask = q.shape[2] - 1
    ub = np.uint64(b)
    # the requests that have waited too long: the oldest, at the head
    o = 0
    while o < nb and now - q[Q.arrival, ub, np.uint64((h + o) & mask)] >= max_wait:
        o += 1
    need = nb - o
    if need == 0 or nb == m:
        return
    # the candidates' keys, by slot (offset j of the queue is at slot (h + j) & mask)
    pred = q[Q.pred, b]
    idx = qidx[b]
    # the need smallest keys: a max-heap of slots (their greatest key at the root)
    heap = sc[:need]
    for j in range(need):
        heap[j] = (h + o + j) & mask
    for j in range(need // 2 - 1, -1, -1):
        _sift(heap, need, j, pred, idx)
    for j in range(o + need, m):
        sl = (h + j) & mask
        t = int(heap[0])
        if pred[sl] < pred[t] or (pred[sl] == pred[t] and idx[sl] < idx[t]):
            heap[0] = sl
            _sift(heap, need, 0, pred, idx)
    # the greatest chosen key: the members are the candidates at or below it (keys differ: by index)
    top = int(heap[0])
    kp = pred[top]
    ki = idx[top]
    # from the back: the others move back in their order, the members are kept (last first)
    w = m - 1
    kept = 0
    for r in range(m - 1, o - 1, -1):
        sr = np.uint64((h + r) & mask)
        if pred[sr] < kp or (pred[sr] == kp and idx[sr] <= ki):
            for f in range(N_FIELDS):
                sc[kept * (N_FIELDS + 1) + f] = q[f, ub, sr]
            sc[kept * (N_FIELDS + 1) + N_FIELDS] = qidx[ub, sr]
            kept += 1
            continue
        if w != r:
            sw = np.uint64((h + w) & mask)
            for f in range(N_FIELDS):
                q[f, ub, sw] = q[f, ub, sr]
            qidx[ub, sw] = qidx[ub, sr]
        w -= 1
    # the members in front of them, in arrival order
    for t in range(need):
        sl = np.uint64((h + o + t) & mask)
        k = (need - 1 - t) * (N_FIELDS + 1)
        for f in range(N_FIELDS):
            q[f, ub, sl] = sc[k + f]
        qidx[ub, sl] = np.int64(sc[k + N_FIELDS])
