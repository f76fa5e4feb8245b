"""Shortest-predicted-first batching in the event kernel: the batch a free
server takes is the ``B`` waiting requests with the smallest predicted
output lengths (ties in arrival order); a request that has waited
``max_wait`` s or more goes first (oldest first), so no request starves.

A queue stays in arrival order.  :func:`spf_batch` moves the batch's members
to its head, in arrival order, the others behind them in theirs, so that the
event kernel serves the head as every rule's batch.  It chooses in
``O(m log B)`` for a queue of ``m`` (a max-heap of the ``B`` smallest keys)
and moves in ``O(m)``, in the rule's scratch: ``B`` offsets, then the
members' fields and indices (:func:`scratch_size`).  It is called, not
inlined, from the event loop: the other rules' loop stays as small (and as
quick to compile) as it was.
"""

from __future__ import annotations

import numpy as np

from .common import step, subroutine
from .queues import N_FIELDS, Q

__all__ = ["FORM_SPF", "scratch_size", "spf_batch"]

#: the rule's code (:mod:`.formation`)
FORM_SPF = 4


def scratch_size(batch_size: int) -> int:
    """Floats of scratch :func:`spf_batch` needs for batches of ``batch_size``:
    an offset, the fields and the index of each member."""
    return (N_FIELDS + 2) * batch_size


@step
def _key_before(q, ub, h, mask, qidx, a, b):
    """Whether the request at offset ``a`` of queue ``ub`` (head slot ``h``)
    comes before the one at ``b``: a smaller prediction, or an equal one and
    an earlier arrival (a lower request index)."""
    sa = np.uint64((h + a) & mask)
    sb = np.uint64((h + b) & mask)
    pa = q[Q.pred, ub, sa]
    pb = q[Q.pred, ub, sb]
    return pa < pb or (pa == pb and qidx[ub, sa] < qidx[ub, sb])


@step
def _sift_down(heap, size, j, q, ub, h, mask, qidx):
    """Restore the max-heap of offsets ``heap[:size]`` (the greatest key at
    the root) below position j."""
    while True:
        c = 2 * j + 1
        if c >= size:
            return
        if c + 1 < size and _key_before(q, ub, h, mask, qidx, int(heap[c]), int(heap[c + 1])):
            c += 1
        if not _key_before(q, ub, h, mask, qidx, int(heap[j]), int(heap[c])):
            return
        heap[j], heap[c] = heap[c], heap[j]
        j = c


@step
def _sift_offsets(heap, size, j):
    """Restore the max-heap of values ``heap[:size]`` below position j."""
    while True:
        c = 2 * j + 1
        if c >= size:
            return
        if c + 1 < size and heap[c] < heap[c + 1]:
            c += 1
        if heap[j] >= heap[c]:
            return
        heap[j], heap[c] = heap[c], heap[j]
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
    # the need smallest keys of offsets o .. m - 1: a max-heap of offsets in the scratch
    heap = sc[:need]
    for j in range(need):
        heap[j] = o + j
    for j in range(need // 2 - 1, -1, -1):
        _sift_down(heap, need, j, q, ub, h, mask, qidx)
    for j in range(o + need, m):
        if _key_before(q, ub, h, mask, qidx, j, int(heap[0])):
            heap[0] = j
            _sift_down(heap, need, 0, q, ub, h, mask, qidx)
    # the chosen offsets in arrival order (a heap sort of the offsets)
    for j in range(need // 2 - 1, -1, -1):
        _sift_offsets(heap, need, j)
    for end in range(need - 1, 0, -1):
        heap[0], heap[end] = heap[end], heap[0]
        _sift_offsets(heap, end, 0)
    # the members' fields and indices kept, the others moved back over them, the members in front
    for t in range(need):
        sl = np.uint64((h + int(heap[t])) & mask)
        for f in range(N_FIELDS):
            sc[need + t * (N_FIELDS + 1) + f] = q[f, ub, sl]
        sc[need + t * (N_FIELDS + 1) + N_FIELDS] = qidx[ub, sl]
    w = m - 1
    t = need - 1
    for r in range(m - 1, o - 1, -1):
        if t >= 0 and r == int(heap[t]):
            t -= 1
            continue
        if w != r:
            sr = np.uint64((h + r) & mask)
            sw = np.uint64((h + w) & mask)
            for f in range(N_FIELDS):
                q[f, ub, sw] = q[f, ub, sr]
            qidx[ub, sw] = qidx[ub, sr]
        w -= 1
    for t in range(need):
        sl = np.uint64((h + o + t) & mask)
        for f in range(N_FIELDS):
            q[f, ub, sl] = sc[need + t * (N_FIELDS + 1) + f]
        qidx[ub, sl] = np.int64(sc[need + t * (N_FIELDS + 1) + N_FIELDS])
