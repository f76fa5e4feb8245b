"""Order statistics of a large array in about one pass (a run's exact
latency quantiles, :func:`mbbatch.stats.exact_quantiles`), and the order of
a nearly sorted one (:func:`stable_order`: a decode stage's requests by
their first tokens, :func:`mbbatch.planners.common.decode_stage_requests`).

Each rank wanted is bracketed by two values read off a sorted sample of
the array; one pass counts the values below each bracket and keeps those
inside it, and the rank is selected among those kept (Floyd and Rivest,
1975, "Expected time bounds for selection", Communications of the ACM
18(3), 165-172).  NaN is left out.  Where a bracket misses its rank (the
sample misled) or keeps more than its room, the caller selects on the
whole array instead: the answer never depends on the sample, only the
time it takes.
"""

from __future__ import annotations

from .common import helper

__all__ = ["bracketed", "stable_order"]


@helper
def bracketed(x, lo, hi, below, kept, size):
    """One pass over ``x``: for each bracket b, the values below ``lo[b]``
    counted into ``below[b]`` and those in ``[lo[b], hi[b]]`` counted into
    ``size[b]`` and copied into ``kept[b]`` in turn (``below`` and ``size``
    start at 0; past ``kept``'s room each overwrites its last slot, and
    the caller, seeing ``size[b]`` beyond the room, selects on the whole).
    NaN is in none.  Returns the values that are not NaN."""
    room = kept.shape[1]
    m = 0
    for i in range(x.shape[0]):
        v = x[i]
        if v != v:
            continue
        m += 1
        for b in range(lo.shape[0]):
            # (without a branch on the value: each value written at the bracket's next slot, kept there only
            # where it is inside; past the room, the last slot)
            s = size[b]
            kept[b, s if s < room else room - 1] = v
            below[b] += v < lo[b]
            size[b] = s + ((v >= lo[b]) & (v <= hi[b]))
    return m


@helper
def stable_order(key, x, floor, out, budget):
    """The indices r with ``x[r] > floor``, in the order of ``key[r]``, ties
    in index order (a stable sort's), into ``out``: each put after the last
    one not above it (insertion, those above it moved one place on), one
    pass where ``key`` is nearly sorted.  Returns how many, or -1 as soon as
    more than ``budget`` moves were made or a key is NaN (the caller sorts
    instead: the answer is the same, only the time differs)."""
    m = 0
    moves = 0
    for r in range(key.shape[0]):
        if not x[r] > floor:
            continue
        v = key[r]
        if v != v:
            return -1
        p = m
        while p > 0 and key[out[p - 1]] > v:
            out[p] = out[p - 1]
            p -= 1
        moves += m - p
        if moves > budget:
            return -1
        out[p] = r
        m += 1
    return m
