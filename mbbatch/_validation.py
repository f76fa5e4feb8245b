"""Parameter domains, declared once, and the checks they drive.

Every public entry point validates its arguments here before any work runs.
The domain table below is the single source of truth for error messages,
Dataset attrs and the hypothesis strategies in the tests.

Errors follow one rule: ``ValueError`` for a value outside its domain (NaN and
inf included, also where a count belongs), ``TypeError`` for the wrong kind of
value (a finite float such as 4.0, or a bool, where a count belongs).  Every message names the parameter and the value, e.g.
``rate must be in (0, inf); got -1.0``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["Domain", "DOMAINS", "check_real", "check_count", "check_servers"]


@dataclass(frozen=True)
class Domain:
    """An interval domain ``lo < x < hi`` (open) or with closed ends.

    Parameters
    ----------
    lo, hi : float
        Interval ends; ``math.inf`` for unbounded.
    lo_closed, hi_closed : bool
        Whether the ends belong to the domain.
    integer : bool
        Whether the parameter is a count (integers only, bools refused).
    units : str
        Units, for docs and Dataset attrs.
    description : str
        One line, for docs and Dataset attrs.
    """

    lo: float
    hi: float
    lo_closed: bool = False
    hi_closed: bool = False
    integer: bool = False
    units: str = ""
    description: str = ""

    def __str__(self) -> str:
        left = "[" if self.lo_closed else "("
        right = "]" if self.hi_closed else ")"
        return f"{left}{_fmt(self.lo)}, {_fmt(self.hi)}{right}"

    def contains(self, x):
        """Elementwise membership; NaN is never a member."""
        x = np.asarray(x, dtype=float)
        above = x >= self.lo if self.lo_closed else x > self.lo
        below = x <= self.hi if self.hi_closed else x < self.hi
        # inf is only a member where the interval is closed at inf
        return above & below & ~np.isnan(x)


def _fmt(v: float) -> str:
    if v == math.inf:
        return "inf"
    if v == -math.inf:
        return "-inf"
    return f"{v:g}"


INF = math.inf

#: The one table of parameter domains. Names match config fields, Dataset
#: dimensions and CLI flags.
DOMAINS: dict[str, Domain] = {
    "B": Domain(1, INF, lo_closed=True, integer=True, units="requests",
                description="batch size: requests per batch"),
    "batch_size": Domain(1, INF, lo_closed=True, integer=True, units="requests",
                         description="batch size: requests per batch"),
    "k": Domain(1, INF, lo_closed=True, integer=True, units="bins",
                description="number of bins"),
    "bins": Domain(1, INF, lo_closed=True, integer=True, units="bins",
                   description="number of bins"),
    "l_min": Domain(0, INF, lo_closed=True, units="s",
                    description="smallest service time of a request"),
    "l_max": Domain(0, INF, units="s", description="largest service time of a request"),
    "eps": Domain(0, INF, units="requests/s",
                  description="throughput gap to capacity allowed"),
    "lam": Domain(0, INF, units="requests/s", description="Poisson arrival rate"),
    "rate": Domain(0, INF, units="requests/s", description="Poisson arrival rate"),
    "mu": Domain(0, INF, units="1/s", description="exponential service rate"),
    "n": Domain(1, INF, lo_closed=True, integer=True, units="requests",
                description="number of requests to simulate"),
    "servers": Domain(1, INF, lo_closed=True, hi_closed=True, integer=True,
                      units="servers",
                      description="identical servers sharing the central FIFO; math.inf for Assumption 5.1"),
}


def _is_count_like(x) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return False
    return isinstance(x, (numbers.Integral, np.integer))


def check_count(name: str, value, domain: Domain | None = None, *, array: bool = False):
    """Validate a count (scalar or, with ``array=True``, an integer array).

    Returns the value as a Python int (scalar) or an int64 array.
    """
    domain = domain or DOMAINS[name]
    if array:
        arr = np.asarray(value)
        if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == object):
            if np.issubdtype(arr.dtype, np.floating):
                if not np.all(np.isfinite(arr)):
                    raise ValueError(f"{name} must be an integer in {domain}; got "
                                     f"{arr[~np.isfinite(arr)].ravel()[0]!r}")
                raise TypeError(f"{name} must be an integer; got {value!r} ({arr.dtype})")
            raise TypeError(f"{name} must be an integer; got {value!r}")
        if arr.dtype == object:
            if not all(_is_count_like(v) for v in arr.ravel()):
                raise TypeError(f"{name} must be an integer; got {value!r}")
            arr = arr.astype(np.int64)
        bad = ~domain.contains(arr)
        if np.any(bad):
            raise ValueError(f"{name} must be an integer in {domain}; got {arr[bad].ravel()[0]!r}")
        return arr.astype(np.int64)
    if not _is_count_like(value):
        # NaN and inf are out of the domain, whatever their type; any other
        # float, even 4.0, is the wrong kind for a count
        if isinstance(value, (float, np.floating)) and not math.isfinite(value):
            raise ValueError(f"{name} must be an integer in {domain}; got {value!r}")
        raise TypeError(f"{name} must be an integer; got {value!r} ({type(value).__name__})")
    if not bool(domain.contains(int(value))):
        raise ValueError(f"{name} must be an integer in {domain}; got {value!r}")
    return int(value)


def check_real(name: str, value, domain: Domain | None = None):
    """Validate a real scalar or array against its domain; NaN and inf refused
    unless the domain is closed at inf. Returns a float or float64 array."""
    domain = domain or DOMAINS[name]
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, np.ndarray) and value.dtype == bool
    ):
        raise TypeError(f"{name} must be a real number; got {value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number; got {value!r}") from None
    bad = ~domain.contains(arr)
    if np.any(bad):
        first = arr[bad].ravel()[0] if arr.ndim else float(arr)
        raise ValueError(f"{name} must be in {domain}; got {first!r}")
    return float(arr) if arr.ndim == 0 else arr


def check_servers(value) -> float:
    """``servers``: a positive integer, or ``math.inf`` (Assumption 5.1)."""
    if isinstance(value, float) and value == math.inf:
        return math.inf
    if isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        if math.isnan(value) or value < 1:
            raise ValueError(f"servers must be an integer in {DOMAINS['servers']} or math.inf; got {value!r}")
        raise TypeError(f"servers must be an integer or math.inf; got {value!r}")
    return check_count("servers", value)


def resolve_n(n, replayed: list) -> int:
    """``n`` checked, defaulting to the shortest replayed array.

    ``replayed`` lists ``(name, length)`` of the arrays a run replays
    (arrival times, service times, token lengths); ``n`` may not exceed any.
    """
    if n is None:
        if not replayed:
            raise ValueError("n must be given (number of requests, an integer in [1, inf))")
        n = min(size for _, size in replayed)
    n = check_count("n", n)
    for what, size in replayed:
        if n > size:
            raise ValueError(f"n must be at most the {size} values of {what}; got {n}")
    return n
