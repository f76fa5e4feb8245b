"""Hypothesis strategies drawn from the parameter table (mbbatch.params):
values in a parameter's domain, of its kind, and values just outside it."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from mbbatch.params import PARAMS

#: the largest finite value drawn where a domain is unbounded (keeps sums finite)
BIG = 1e12


def _real_bounds(d, lo=None, hi=None):
    a = max(d.lo, -BIG) if lo is None else lo
    b = min(d.hi, BIG) if hi is None else hi
    return a, b


def valid(key: str, lo=None, hi=None) -> st.SearchStrategy:
    """Values of parameter ``key`` inside its domain (optionally within
    ``[lo, hi]``, for runs that must stay small)."""
    p = PARAMS[key]
    d = p.domain
    if p.kind in ("real", "reals"):
        a, b = _real_bounds(d, lo, hi)
        one = st.floats(a, b, exclude_min=not d.lo_closed and lo is None, exclude_max=not d.hi_closed and hi is None,
                        allow_nan=False, allow_infinity=False)
        if (d.hi == math.inf and d.hi_closed or getattr(d, "or_inf", False)) and hi is None:
            one = one | st.just(math.inf)
        return one if p.kind == "real" else st.lists(one, min_size=1, max_size=5)
    if p.kind in ("count", "counts", "servers"):
        a = int(math.ceil(d.lo)) if d.lo_closed else int(math.floor(d.lo)) + 1
        b = int(min(d.hi, 2**62)) if hi is None else int(hi)
        a = a if lo is None else int(lo)
        one = st.integers(a, b)
        if p.kind == "servers" and hi is None:
            one = one | st.just(math.inf)
        return one if p.kind != "counts" else st.lists(one, min_size=1, max_size=5)
    if p.kind == "choice":
        return st.sampled_from(p.choices)
    if p.kind == "flag":
        return st.booleans()
    raise AssertionError(p.kind)


def outside(key: str) -> st.SearchStrategy:
    """Numbers of the right kind just outside parameter ``key``'s domain
    (NaN included for reals); empty where the domain is all of them."""
    p = PARAMS[key]
    d = p.domain
    out = []
    if p.kind == "real":
        out.append(st.just(math.nan))
        if d.lo > -math.inf:
            out.append(st.just(d.lo) if not d.lo_closed else st.floats(max(d.lo - 1e6, -BIG), d.lo,
                                                                      exclude_max=True, allow_nan=False))
        if d.hi < math.inf:
            out.append(st.just(d.hi) if not d.hi_closed else st.floats(d.hi, d.hi + 1e6, exclude_min=True))
        elif not d.hi_closed:
            out.append(st.just(math.inf))
    elif p.kind == "count":
        if d.lo > -math.inf:
            low = int(math.ceil(d.lo)) - (0 if not d.lo_closed else 1)
            out.append(st.integers(low - 1000, low))
        if d.hi < 2**63:
            out.append(st.integers(int(d.hi) + 1, int(d.hi) + 1000))
    return st.one_of(out) if out else st.nothing()
