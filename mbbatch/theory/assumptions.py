"""Where the closed forms hold, and what they say outside it.

Every function of :mod:`mbbatch.theory` checks its arguments' domains
(``ValueError``/``TypeError`` naming the argument) and, where an argument in
its domain lies outside the assumptions a formula needs (a queue past
saturation, a service time without a mean, an engine whose iteration cost is
not the one a bound assumes), returns NaN there, not a number that looks
valid, and issues an :class:`OutsideAssumptions` warning saying which and
why.  Turn it into an error with ``warnings.simplefilter("error",
mbbatch.theory.OutsideAssumptions)``; silence it with ``"ignore"`` (a sweep
store does: its cells hold NaN, as its schema says).
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["OutsideAssumptions", "outside"]


class OutsideAssumptions(UserWarning):
    """A closed form was asked for where its assumptions do not hold: the
    value returned there is NaN."""


def outside(where, message: str, stacklevel: int = 3) -> None:
    """Warn :class:`OutsideAssumptions` with ``message`` if any of ``where`` (a
    bool or an array of them) is true, counting them for an array."""
    w = np.asarray(where, dtype=bool)
    if not w.any():
        return
    count = f" ({int(w.sum())} of {w.size} values)" if w.size > 1 else ""
    warnings.warn(f"{message}{count}: NaN returned", OutsideAssumptions, stacklevel=stacklevel)
