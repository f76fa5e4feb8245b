"""Per-request arrays kept between the runs of one process.

A continuous engine's run at n = 10^7 holds several hundred MB of arrays
for its own duration only: its requests' lengths, their arrival times, an
admission order's records.  Freed, that memory goes back to the operating
system, and the next run pays again for fresh pages: the system maps and
zeroes each one as it is first written (more where it must compact its
memory for large pages, and far more on a virtual machine whose host takes
back the guest's free memory).  At n = 10^7 that was 0.03 s to 2 s of
system time a run, varying from run to run, beside about 2 s of work.

A :class:`Lease` takes its arrays from those earlier runs gave back (a
view of the first ``n`` elements of the smallest large enough, of those
last used in the same role where one is: an array one run wrote only the
start of, a queue's heap, another run would otherwise fault in whole as
its requests' lengths; one of another role only where it is at most twice
the size), makes new ones where none is free, and gives them
all back as it closes, unless the block raised (a traceback may still hold
them).  So a run leases only what no result keeps; its arrays come to it
as the last run left them, and the kernels write every element they lease
before they read it (as with ``np.empty``).

An array a run writes only part of (a cluster's engines' rows, each with
room for every request, written as far as the requests routed to it
reach) is counted by the bytes written (:meth:`Lease.charge`): the pages
never written take no memory.  At most :data:`LIMIT` bytes are kept, the
ones given back last (set by
``MBBATCH_KEPT_MB`` in the environment, read at import: megabytes, ``0``
keeps none); :func:`release_memory` lets them all go
(``mbbatch.release_memory``).  Arrays below :data:`LEAST` elements are made
fresh each time.  Leases of several threads take distinct arrays.
"""

from __future__ import annotations

import os
import threading

import numpy as np

#: the fewest elements of a kept array (smaller ones cost little to make)
LEAST = 1 << 16


def _limit(text: str) -> int:
    """The bytes ``MBBATCH_KEPT_MB`` (megabytes, a number >= 0) allows."""
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0.0 or mb == float("inf"):
        raise ValueError(f"MBBATCH_KEPT_MB = {text!r}: the megabytes of per-request arrays kept between runs, a "
                         f"finite number >= 0 (0 keeps none; default 2048)")
    return int(mb * (1 << 20))


#: the most bytes kept between runs
LIMIT = _limit(os.environ.get("MBBATCH_KEPT_MB", "2048"))

_lock = threading.Lock()
#: the arrays kept, oldest first, each as ``(role, array, bytes)``: the
#: bytes it is counted as holding (:meth:`Lease.charge`)
_kept: list = []


class Lease:
    """Arrays for one run: ``with Lease() as lease: x = lease.empty(n)``;
    ``Lease(keep=False)`` makes every array fresh and keeps none (a run
    whose result holds its arrays)."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self._held: list = []

    def empty(self, n: int, dtype=np.float64, role: str = "", shape=None) -> np.ndarray:
        """A 1-d array of ``n`` elements of ``dtype`` (or of ``shape``, ``n``
        elements in all, C-ordered), unset (``np.empty``'s contract: the
        caller writes each element before it reads it); its ``role`` names
        what it holds."""
        dtype = np.dtype(dtype)
        if not self.keep or n < LEAST:
            return np.empty(n if shape is None else shape, dtype)
        with _lock:
            # (one of another role only where it is at most twice the size: a small run's arrays do not take a
            # large one's, leaving that role to map fresh memory next time)
            fits = [j for j, (r, a, _) in enumerate(_kept)
                    if a.dtype == dtype and a.size >= n and (r == role or a.size <= 2 * n)]
            taken = (_kept.pop(min(fits, key=lambda j: (_kept[j][0] != role, _kept[j][1].size)))
                     if fits else None)
        base, prior = (np.empty(n, dtype), None) if taken is None else (taken[1], taken)
        out = base[:n] if shape is None else base[:n].reshape(shape)
        held = [role, base, 0, out, prior]
        self._held.append(held)
        _charged(held, out.nbytes)
        return out

    def charge(self, array: np.ndarray, nbytes: int) -> None:
        """Count ``array`` (one this lease gave) as holding the ``nbytes``
        its run wrote, where that wrote only part of it (pages never
        written take no memory), beside what earlier runs wrote of it.  An
        array not kept (small, or the lease keeps none) is left alone."""
        for held in self._held:
            if held[3] is array:
                _charged(held, nbytes)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind, value, tb) -> None:
        held, self._held = self._held, []
        if kind is None and self.keep:
            give([(role, base) for role, base, _, _, _ in held], [b for _, _, b, _, _ in held])


def _charged(held: list, written: int) -> None:
    """A leased array's bytes counted as kept (``held``: its role, base,
    count, view and the kept entry it came from, None: new): those
    ``written`` now and, where it was kept before, those counted then (in
    the same role, the same pages written again: the more of the two; in
    another, both, at most its size)."""
    role, base, _, _, prior = held
    written = int(written)
    if prior is None:
        held[2] = written
    elif prior[0] == role:
        held[2] = max(prior[2], written)
    else:
        held[2] = min(base.nbytes, prior[2] + written)


def give(arrays: list, charges=None) -> None:
    """Keep ``arrays`` (``(role, array)`` pairs) for later leases, each
    counted as holding its ``charges`` bytes (None: its size), dropping
    the oldest kept beyond :data:`LIMIT` bytes."""
    charges = [a.nbytes for _, a in arrays] if charges is None else charges
    with _lock:
        _kept.extend((role, a, b) for (role, a), b in zip(arrays, charges))
        total = sum(b for _, _, b in _kept)
        while _kept and total > LIMIT:
            total -= _kept.pop(0)[2]


def release_memory() -> int:
    """Let go of the per-request arrays mbbatch keeps between the runs of
    this process (a continuous engine's requests and workspace, which the
    next run reuses rather than have fresh memory mapped: see the
    performance guide); returns the bytes they held.  At most
    ``MBBATCH_KEPT_MB`` megabytes (environment, read at import; default
    2,048; ``0``: none) are ever kept."""
    with _lock:
        freed = sum(b for _, _, b in _kept)
        _kept.clear()
    return freed


def kept() -> int:
    """The bytes kept now (as :meth:`Lease.charge` counts them)."""
    with _lock:
        return sum(b for _, _, b in _kept)
