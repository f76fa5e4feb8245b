"""Order statistics of a large array in about one pass (a run's exact
latency quantiles, :func:`mbbatch.stats.exact_quantiles`).

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

__all__ = ["bracketed"]


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
