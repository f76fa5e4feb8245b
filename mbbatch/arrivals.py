"""Arrival processes: when requests reach the system."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validation import check_fields, check_real_array
from .params import PARAMS

__all__ = ["Poisson", "Saturated", "Replay", "PiecewisePoisson"]


@dataclass(frozen=True)
class Poisson:
    """Poisson arrivals (Assumption 3.1 of the multi-bin paper).

    Parameters
    ----------
    rate : float
        Arrival rate lambda in requests/s, in (0, inf).
    """

    rate: float

    def __post_init__(self):
        check_fields(self, {"rate": "rate"})

    def describe(self) -> dict:
        return {"arrivals": "poisson", "rate": self.rate}


@dataclass(frozen=True)
class Saturated:
    """All ``n`` requests arrive together at time 0: the saturated system whose
    throughput is the service capacity of Theorem 4.2."""

    def describe(self) -> dict:
        return {"arrivals": "saturated"}


@dataclass(frozen=True, eq=False)
class Replay:
    """Arrival times given explicitly, e.g. from a trace.

    Parameters
    ----------
    times : array_like of float
        Non-decreasing, finite arrival times in s, one per request.
    """

    times: np.ndarray = field(repr=False)

    def __post_init__(self):
        t = check_real_array("times", self.times, PARAMS["times"].domain)
        if np.any(np.diff(t) < 0):
            i = int(np.argmax(np.diff(t) < 0))
            raise ValueError(f"times must be non-decreasing; got times[{i + 1}]={t[i + 1]!r} < times[{i}]={t[i]!r}")
        t.flags.writeable = False
        object.__setattr__(self, "times", t)

    def describe(self) -> dict:
        return {"arrivals": "replay", "n_times": int(self.times.size)}


@dataclass(frozen=True, eq=False)
class PiecewisePoisson:
    """Poisson arrivals whose rate steps through ``rates``: ``rates[j]`` holds
    until time ``ends[j]`` (s); the last rate holds for ever.  A load step
    (low, high, low) is ``PiecewisePoisson([1, 5, 1], [600, 1200])``.

    Parameters
    ----------
    rates : sequence of float
        Arrival rates, requests/s, each in (0, inf).
    ends : sequence of float
        Increasing change times, s; one fewer than ``rates``.
    """

    rates: tuple
    ends: tuple = ()

    def __post_init__(self):
        # a single number is one constant rate (one change time) as before
        r = check_real_array("rates", self.rates, PARAMS["rates"].domain, allow_scalar=True)
        e = check_real_array("ends", self.ends, PARAMS["ends"].domain, allow_scalar=True, allow_empty=True)
        if e.size != r.size - 1:
            raise ValueError(f"ends must have len(rates) - 1 = {r.size - 1} values; got {e.size}")
        if np.any(np.diff(e) <= 0):
            raise ValueError(f"ends must be finite, positive and increasing; got {e.tolist()}")
        object.__setattr__(self, "rates", tuple(float(x) for x in r))
        object.__setattr__(self, "ends", tuple(float(x) for x in e))

    def describe(self) -> dict:
        return {"arrivals": "piecewise_poisson", "rates": list(self.rates), "ends": list(self.ends)}
