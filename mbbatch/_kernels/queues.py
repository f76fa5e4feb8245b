"""The event kernel's queues: each engine's bins are FIFO ring buffers of
waiting requests, which grow (double) with the backlog.

A queued request keeps its fields (:data:`FIELDS`: arrival time, prompt,
output and predicted output lengths, the prompt tokens its batch prefills)
in ``q[field, queue, slot]`` and its index in ``qidx[queue, slot]``; queue
``b`` holds ``size[b]`` requests from slot ``head[b]`` on, in a capacity
that is a power of two (``mask = capacity - 1``).
"""

from __future__ import annotations

import numpy as np

from .common import confused_bin, confused_bins, request_uniform, request_uniforms, step
from .controller import partition_tiled, partition_tiled_array
from .layout import Layout

__all__ = ["FIELDS", "Q", "N_FIELDS", "QUEUE_START", "SLOT_BYTES", "doubling_bytes", "grow_bytes", "grow",
           "rebin", "join"]


#: a request's arrival time (s) and prompt, output and predicted output
#: lengths (tokens): the rows of the block of draws ``blk[field, j]`` and of
#: the per-bin FIFOs, ring buffers ``q[field, bin, slot]`` (the request's
#: index in ``qidx[bin, slot]``) of a power-of-two capacity; in a queue also
#: the prompt tokens its batch prefills (KV reuse: fewer) and when it joined
#: the queue, counted in the order of every queue's joins (an arrival's, or a
#: request routed again from a removed engine: a batch forms when its last
#: member joins)
FIELDS = Layout("request fields", floats=("arrival", "prompt", "output", "pred", "prefill", "joined"))
N_FIELDS = FIELDS.size
Q = FIELDS.index


#: the ring buffers' first capacity (a power of two); they double when full
QUEUE_START = 1024


#: bytes of a queued request in the ring buffers: its fields and its index
SLOT_BYTES = 8 * (FIELDS.size + 1)


def doubling_bytes(slots: int) -> int:
    """Bytes that doubling ring buffers of ``slots`` slots in all allocates
    (:func:`grow`): the doubled buffers."""
    return 2 * SLOT_BYTES * slots


def grow_bytes(slots: int) -> int:
    """Bytes held while ring buffers of ``slots`` slots in all double
    (:func:`grow`): the doubled buffers beside the current ones."""
    return SLOT_BYTES * slots + doubling_bytes(slots)


def ring(head, size, cap):
    """Slots of a ring buffer's entries, oldest first."""
    return (head + np.arange(size)) & (cap - 1)


def grow(q, qidx, head, size):
    """Double the ring buffers' capacity, unrolling each bin's ring; returns
    the new ``q`` and ``qidx`` (``head`` is reset in place).  A ring is
    copied as its two contiguous runs (head to the end, then the start), so
    nothing is allocated beside the new buffers (:func:`grow_bytes`)."""
    K, cap = qidx.shape
    new_q = np.empty((q.shape[0], K, 2 * cap))
    new_qidx = np.empty((K, 2 * cap), np.int64)
    for b in range(K):
        h, m = int(head[b]), int(size[b])
        a = min(m, cap - h)             # entries from the head to the end of the ring
        new_q[:, b, :a] = q[:, b, h:h + a]
        new_q[:, b, a:m] = q[:, b, :m - a]
        new_qidx[b, :a] = qidx[b, h:h + a]
        new_qidx[b, a:m] = qidx[b, :m - a]
    head[:] = 0
    return {"q": new_q, "qidx": new_qidx}


def rebin(q, qidx, head, size, lo, hi, p=1.0, key=0):
    """The end of Algorithm 6's warm-up: each engine's bin 0 queue (every
    request so far; its other bins are empty) re-binned by each waiting
    request's own prediction (Algorithm 4), confused with probability 1 -
    ``p``: no future is used.  No bin receives more than the requests bin 0
    held, so none overflows."""
    K = lo.shape[0]
    for base in range(0, qidx.shape[0], K):
        j = ring(head[base], size[base], qidx.shape[1])
        fields, index = q[:, base, j], qidx[base, j]
        bins = partition_tiled_array(fields[Q.pred], lo, hi)
        if p < 1.0:
            bins = confused_bins(bins, request_uniforms(key, index), p, K)
        head[base:base + K] = 0
        for b in range(K):
            mine = bins == b
            size[base + b] = np.count_nonzero(mine)
            q[:, base + b, :size[base + b]] = fields[:, mine]
            qidx[base + b, :size[base + b]] = index[mine]


@step
def join(i, jj, binned, K, base, lo, hi, window, blk, q, qidx, head, size, mask, p, key, prefill):
    """Step 2b, one arrival: request i (column jj of the block) joins the
    FIFO of its bin (Algorithm 4) on the engine whose queues start at
    ``base``, or of bin 0 during the warm-up, whose window keeps its
    prediction; with bin confusion (``p < 1``) the bin moves to a neighbour
    with probability 1 - p; it prefills ``prefill`` tokens.  Returns its
    queue and slot (where a cluster records its join: one engine's runs
    never read it), or ``(-1, 0)``, nothing done, when the ring buffer is
    full."""
    pred = blk[Q.pred, jj]
    if binned:
        b = partition_tiled(pred, lo, hi, K) if K > 1 else 0
        if p < 1.0:
            b = confused_bin(b, request_uniform(key, i), p, K)
    else:
        b = 0
        window[i] = pred
    b += base
    if size[b] > mask:   # size == capacity == mask + 1
        return -1, np.uint64(0)
    # unsigned indices: no negative-index wraparound code
    ub = np.uint64(b)
    slot = np.uint64((head[b] + size[b]) & mask)
    q[Q.arrival, ub, slot] = blk[Q.arrival, jj]
    q[Q.prompt, ub, slot] = blk[Q.prompt, jj]
    q[Q.output, ub, slot] = blk[Q.output, jj]
    q[Q.pred, ub, slot] = pred
    q[Q.prefill, ub, slot] = prefill
    qidx[ub, slot] = i
    size[b] += 1
    return b, slot
