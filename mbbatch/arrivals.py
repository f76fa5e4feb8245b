"""Arrival processes: when requests reach the system.

Every process here serves every policy.  The random ones are drawn inside the
kernels, from the run's arrival stream (stream 0 of its seed), so that two
runs with the same seed and process see the same arrival times whatever the
policy:

- :class:`Poisson`: exponential gaps, rate ``rate``;
- :class:`Gamma`: a renewal process with gamma gaps of mean ``1 / rate`` and
  coefficient of variation ``cv`` (``cv = 1`` is Poisson in law; ``cv > 1``
  is bursty, ``cv < 1`` more regular);
- :class:`OnOff`: a two-state Markov-modulated Poisson process: rate
  ``rate_on`` during ON periods and ``rate_off`` (possibly 0) during OFF
  periods, with exponential sojourns of means ``mean_on`` and ``mean_off``
  (BurstGPT-style bursts), started in its stationary state;
- :class:`PiecewisePoisson`: Poisson with a rate that steps at given times;
- :class:`Saturated`: every request at time 0;
- :class:`Replay`: given times (a trace's), sped up or slowed down, windowed,
  and tiled when a run asks for more requests than it holds.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ._kernels import common as _common
from ._kernels.common import GAMMA_GAPS
from ._validation import check_fields, check_real_array
from .params import PARAMS

__all__ = ["Arrivals", "Poisson", "Gamma", "OnOff", "Saturated", "Replay", "PiecewisePoisson", "TraceTiledWarning"]

_NONE, _ONE, _NEVER = np.empty(0), np.ones(1), np.full(1, np.inf)
_NONE.flags.writeable = _ONE.flags.writeable = _NEVER.flags.writeable = False


class TraceTiledWarning(UserWarning):
    """A run asked for more requests than a replayed trace holds: the trace
    is repeated end to end (see :meth:`Replay.times_for`)."""


class Arrivals:
    """What an arrival process declares and gives, for the planners, the
    sweeps and :mod:`mbbatch.registry`.

    Class attributes: ``spec``, its name in sweep specs (``arrivals = ...``);
    ``spec_keys``, the spec parameters it is built from
    (:meth:`from_spec`); ``unassessed``, why runs under it are not checked
    for a steady state ("" where they are: it has one).
    """

    spec: ClassVar[str] = ""
    spec_keys: ClassVar[tuple] = ()
    unassessed: ClassVar[str] = ""

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "Arrivals":
        """The process of a sweep cell's parameters (``trace``: its trace)."""
        raise NotImplementedError

    def kernel_fields(self, n: int) -> tuple:
        """The kernels' ``(arrival kind, rate, replayed times, params, ends)``
        for a run of ``n`` requests (see
        :func:`~mbbatch._kernels.common.draw_arrivals`)."""
        raise NotImplementedError

    def span(self, n: int) -> tuple:
        """``(start, end)``: the span of the first ``n`` arrivals' times, s
        (expected, for a random process), over which a steady state is judged."""
        raise NotImplementedError

    def clock(self, n: int):
        """``(horizon, what)``: the largest time (s) the run's clock reaches
        while arrivals last, and what sets it; None when it stays at 0."""
        start, end = self.span(n)
        return max(abs(start), abs(end)), f"a mean rate of {self.rate:g} requests/s and n = {n} arrivals"

    def at_rate(self, rate: float) -> "Arrivals":
        """The process at mean rate ``rate``, its shape kept."""
        raise TypeError(f"arrivals must be Poisson, Gamma, OnOff or Replay (a process with a mean rate to set); got "
                        f"{type(self).__name__}")


@dataclass(frozen=True)
class Poisson(Arrivals):
    """Poisson arrivals (Assumption 3.1 of the multi-bin paper).

    Parameters
    ----------
    rate : float
        Arrival rate lambda in requests/s, in (0, inf).
    """

    rate: float

    spec: ClassVar[str] = "poisson"
    spec_keys: ClassVar[tuple] = ("rate",)

    def __post_init__(self):
        check_fields(self, {"rate": "rate"})

    def describe(self) -> dict:
        return {"arrivals": "poisson", "rate": self.rate}

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "Poisson":
        return cls(rate=params["rate"])

    def kernel_fields(self, n: int) -> tuple:
        return _common.ARR_POISSON, self.rate, _NONE, _ONE, _NEVER

    def span(self, n: int) -> tuple:
        return 0.0, n / self.rate

    def at_rate(self, rate: float) -> "Poisson":
        return Poisson(rate=rate)


@dataclass(frozen=True)
class Gamma(Arrivals):
    """A renewal process with gamma inter-arrival times.

    Parameters
    ----------
    rate : float
        Mean arrival rate, requests/s, in (0, inf): gaps have mean ``1 / rate``.
    cv : float
        Coefficient of variation of the gaps, in (0, inf): shape ``1 / cv**2``,
        scale ``cv**2 / rate``.  ``cv = 1`` gives exponential gaps (Poisson in
        law, though not the same draws as :class:`Poisson`).

    Notes
    -----
    Gaps are drawn exactly, by Marsaglia and Tsang's method; below shape 1
    (``cv > 1``) as Gamma(a + 1) U^(1/a).  When ``cv**2`` is an integer (2,
    3, 4, ..., to within rounding: ``cv`` = sqrt(2), sqrt(3), 2, 3, ...)
    U^(1/a) is a product of uniforms, and such runs take about 30 % less
    time than at other values of ``cv`` (``SAMPLER`` names the method:
    sweep stores record it).
    """

    rate: float
    cv: float

    #: how the gaps are drawn (recorded by sweep stores of gamma arrivals)
    SAMPLER: ClassVar[str] = GAMMA_GAPS
    spec: ClassVar[str] = "gamma"
    spec_keys: ClassVar[tuple] = ("rate", "cv")

    def __post_init__(self):
        check_fields(self, {"rate": "rate", "cv": "cv"})

    @property
    def shape(self) -> float:
        return 1.0 / (self.cv * self.cv)

    @property
    def scale(self) -> float:
        return self.cv * self.cv / self.rate

    def describe(self) -> dict:
        return {"arrivals": "gamma", "rate": self.rate, "cv": self.cv}

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "Gamma":
        return cls(rate=params["rate"], cv=params["cv"])

    def kernel_fields(self, n: int) -> tuple:
        return _common.ARR_GAMMA, self.rate, _NONE, np.array([self.shape, self.scale]), _NEVER

    def span(self, n: int) -> tuple:
        return 0.0, n / self.rate

    def at_rate(self, rate: float) -> "Gamma":
        return Gamma(rate=rate, cv=self.cv)


@dataclass(frozen=True)
class OnOff(Arrivals):
    """A two-state Markov-modulated Poisson process (ON/OFF bursts).

    Arrivals are Poisson at ``rate_on`` while ON and at ``rate_off`` while
    OFF; the ON and OFF periods are exponential with means ``mean_on`` and
    ``mean_off`` (s).  The process starts in its stationary state: ON with
    probability ``mean_on / (mean_on + mean_off)``.

    Parameters
    ----------
    rate_on : float
        Rate while ON, requests/s, in (0, inf).
    rate_off : float
        Rate while OFF, requests/s, in [0, inf) (0: silent between bursts).
    mean_on, mean_off : float
        Mean sojourns, s, in (0, inf).
    """

    rate_on: float
    rate_off: float
    mean_on: float
    mean_off: float

    spec: ClassVar[str] = "onoff"
    spec_keys: ClassVar[tuple] = ("rate_on", "rate_off", "mean_on", "mean_off")

    def __post_init__(self):
        check_fields(self, {"rate_on": "rate_on", "rate_off": "rate_off", "mean_on": "mean_on",
                            "mean_off": "mean_off"})

    @property
    def rate(self) -> float:
        """The long-run mean arrival rate, requests/s."""
        return (self.rate_on * self.mean_on + self.rate_off * self.mean_off) / (self.mean_on + self.mean_off)

    def interarrival_moments(self) -> tuple[float, float]:
        """Mean and coefficient of variation of the stationary inter-arrival
        time (as seen from an arrival): the process is a MAP with
        ``D0 = Q - L``, ``D1 = L`` (``Q`` the ON/OFF generator, ``L`` the
        diagonal of rates); the gap is phase-type with initial vector
        ``pi L / rate`` and ``E[X^j] = j! alpha (-D0)^-j 1``."""
        a, b = 1.0 / self.mean_on, 1.0 / self.mean_off
        q = np.array([[-a, a], [b, -b]])
        lam = np.diag([self.rate_on, self.rate_off])
        pi = np.array([self.mean_on, self.mean_off]) / (self.mean_on + self.mean_off)
        alpha = pi @ lam / self.rate
        inv = np.linalg.inv(-(q - lam))
        m1 = float(alpha @ inv @ np.ones(2))
        m2 = float(2.0 * alpha @ inv @ inv @ np.ones(2))
        return m1, math.sqrt(m2 / (m1 * m1) - 1.0)

    def describe(self) -> dict:
        return {"arrivals": "onoff", "rate_on": self.rate_on, "rate_off": self.rate_off,
                "mean_on": self.mean_on, "mean_off": self.mean_off}

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "OnOff":
        return cls(rate_on=params["rate_on"], rate_off=params["rate_off"], mean_on=params["mean_on"],
                   mean_off=params["mean_off"])

    def kernel_fields(self, n: int) -> tuple:
        return (_common.ARR_ONOFF, self.rate, _NONE,
                np.array([self.rate_on, self.rate_off, self.mean_on, self.mean_off]), _NEVER)

    def span(self, n: int) -> tuple:
        return 0.0, n / self.rate

    def at_rate(self, rate: float) -> "OnOff":
        """The burst ratio (``rate_off / rate_on``) and the sojourns kept."""
        f = rate / self.rate
        return OnOff(rate_on=self.rate_on * f, rate_off=self.rate_off * f, mean_on=self.mean_on,
                     mean_off=self.mean_off)


@dataclass(frozen=True)
class Saturated(Arrivals):
    """All ``n`` requests arrive together at time 0: the saturated system whose
    throughput is the service capacity of Theorem 4.2."""

    spec: ClassVar[str] = "saturated"
    unassessed: ClassVar[str] = "every request arrives at time 0 (saturated)"

    def describe(self) -> dict:
        return {"arrivals": "saturated"}

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "Saturated":
        return cls()

    def kernel_fields(self, n: int) -> tuple:
        return _common.ARR_SATURATED, 0.0, _NONE, _ONE, _NEVER

    def span(self, n: int) -> tuple:
        return 0.0, 0.0

    def clock(self, n: int):
        return None


@dataclass(frozen=True, eq=False)
class Replay(Arrivals):
    """Arrival times given explicitly: a trace's, or any array.

    Parameters
    ----------
    times : array_like of float, or a Trace
        Non-decreasing, finite arrival times in s, one per request; or a
        :class:`~mbbatch.traces.Trace`, whose arrival times are taken.  To
        replay a part of a trace together with its lengths, filter the trace
        when loading it (the loaders' ``window``).
    scale : float
        Speed-up, in (0, inf): the times are divided by ``scale`` (2 replays
        the trace twice as fast, at twice its rate).  Default 1.
    window : (float, float), optional
        Keep the arrivals with ``start <= t < end`` (s, of the given times,
        before scaling), shifted to start at ``t - start``.

    A run of more requests than the times hold repeats them end to end, each
    copy shifted by the span of the times plus one mean gap (so the tiled
    process keeps the trace's mean rate), with a :class:`TraceTiledWarning`
    saying so (:meth:`times_for`).
    """

    times: np.ndarray = field(repr=False)
    scale: float = PARAMS["Replay.scale"].default
    window: tuple | None = None

    spec: ClassVar[str] = "trace"
    spec_keys: ClassVar[tuple] = ("scale",)

    def __post_init__(self):
        from .traces import Trace

        source = self.times
        if isinstance(source, Trace):
            source = source.arrival
        t = check_real_array("times", source, PARAMS["times"].domain)
        if np.any(np.diff(t) < 0):
            i = int(np.argmax(np.diff(t) < 0))
            raise ValueError(f"times must be non-decreasing; got times[{i + 1}]={t[i + 1]!r} < times[{i}]={t[i]!r}")
        check_fields(self, {"scale": "Replay.scale"})
        if self.window is not None:
            w = check_real_array("window", self.window, PARAMS["window"].domain)
            if w.shape != (2,) or not w[0] < w[1]:
                raise ValueError(f"window must be (start, end) with 0 <= start < end; got {self.window!r}")
            keep = (t >= w[0]) & (t < w[1])
            if not keep.any():
                raise ValueError(f"window {tuple(w.tolist())} holds none of the {t.size} times "
                                 f"(they run from {t[0]:g} to {t[-1]:g} s)")
            t = t[keep] - w[0]
            object.__setattr__(self, "window", (float(w[0]), float(w[1])))
        if self.scale != 1.0:
            t = t / self.scale
        t.flags.writeable = False
        object.__setattr__(self, "times", t)

    def times_for(self, n: int, *, warn: bool = True) -> np.ndarray:
        """The first ``n`` arrival times: the times themselves, or, when ``n``
        exceeds them, the times repeated end to end (copy ``c`` shifted by
        ``c * (span + span / (size - 1))``, the span plus one mean gap), with a
        :class:`TraceTiledWarning` unless ``warn`` is False."""
        t = self.times
        if n <= t.size:
            return t if n == t.size else t[:n]
        copies, period = self._tiling(n)
        if warn:
            warnings.warn(f"n = {n} exceeds the {t.size} replayed arrival times: the trace is repeated "
                          f"{copies} times end to end, every {period:.6g} s", TraceTiledWarning, stacklevel=4)
        out = np.empty(n)
        for c in range(copies):
            lo = c * t.size
            m = min(t.size, n - lo)
            np.add(t[:m], c * period, out=out[lo:lo + m])
        out.flags.writeable = False
        return out

    def _tiling(self, n: int) -> tuple[int, float]:
        """(copies, period) of the times tiled to ``n``; refuses times that
        span no time."""
        t = self.times
        span = float(t[-1] - t[0])
        period = span + span / (t.size - 1) if t.size > 1 and span > 0 else 0.0
        if period == 0.0:
            raise ValueError(f"n = {n} exceeds the {t.size} replayed times, which cannot be tiled: they span "
                             "no time (pass n at most their number)")
        return -(-n // t.size), period

    def last_time(self, n: int) -> float:
        """The ``n``-th arrival time of :meth:`times_for` (``n``), without tiling."""
        t = self.times
        if n <= t.size:
            return float(t[n - 1])
        copies, period = self._tiling(n)
        return float(t[(n - 1) % t.size] + (copies - 1) * period)

    @property
    def rate(self) -> float:
        """The mean arrival rate of the (scaled, windowed) times, requests/s."""
        span = float(self.times[-1] - self.times[0])
        return (self.times.size - 1) / span if span > 0 else math.inf

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "Replay":
        """The cell's trace replayed at its ``scale``."""
        return cls(trace, scale=params["scale"])

    def kernel_fields(self, n: int) -> tuple:
        # (a run longer than the times repeats them in the kernel, each copy shifted by the period)
        period = self._tiling(n)[1] if n > self.times.size else 0.0
        return _common.ARR_REPLAY, 0.0, self.times, np.array([period]), _NEVER

    def span(self, n: int) -> tuple:
        """The first and the ``n``-th arrival time, s."""
        return float(self.times[0]), self.last_time(n)

    def clock(self, n: int):
        return max(abs(float(self.times[0])), abs(self.last_time(n))), "arrivals.times"

    def at_rate(self, rate: float) -> "Replay":
        """The same times, scaled to mean rate ``rate``."""
        return Replay(self.times, scale=rate / self.rate)

    def describe(self) -> dict:
        d = {"arrivals": "replay", "n_times": int(self.times.size)}
        if self.scale != 1.0:
            d["scale"] = self.scale
        if self.window is not None:
            d["window"] = list(self.window)
        return d


@dataclass(frozen=True, eq=False)
class PiecewisePoisson(Arrivals):
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

    spec: ClassVar[str] = "step"
    spec_keys: ClassVar[tuple] = ("rate", "rate_high", "t_up", "t_down")
    unassessed: ClassVar[str] = "a load step has no single steady state"

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

    @classmethod
    def from_spec(cls, params: dict, trace=None) -> "PiecewisePoisson":
        """A load step: ``rate``, ``rate_high`` from ``t_up`` to ``t_down``, ``rate`` again."""
        return cls([params["rate"], params["rate_high"], params["rate"]], [params["t_up"], params["t_down"]])

    def kernel_fields(self, n: int) -> tuple:
        return _common.ARR_PIECEWISE, self.rates[0], _NONE, np.array(self.rates), np.array([*self.ends, np.inf])

    def clock(self, n: int):
        return (self.ends[-1] + n / min(self.rates) if self.ends else n / self.rates[0],
                f"rates down to {min(self.rates):g} requests/s and n = {n} arrivals")
