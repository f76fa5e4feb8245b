"""Per-request values: service times (the paper's model) and prompt and
output lengths (tokens).  Each comes from

- a frozen continuous scipy.stats distribution: the families of
  :data:`SUPPORTED_DISTRIBUTIONS` are drawn by the kernels' drawers (inside
  the kernels, or before a run that needs them up front, as open-loop
  programs' calls do: the values a run on that stream draws); any other is
  drawn before the run from its own ``rvs``, in blocks of :data:`RVS_BLOCK`,
  on the run's generator of that stream (so results are reproducible bit for
  bit, at 8 bytes of memory per request);
- :class:`Empirical`: uniform resampling, with replacement, from observed
  values (a trace's column);
- an array: the values replayed in order (a trace).

:func:`as_service` validates any of them into the form the kernels take."""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from ._kernels import common as _k
from ._validation import DOMAINS, MAX_DURATION, check_real_array, real_array_ends  # noqa: F401

__all__ = ["ServiceSpec", "Empirical", "as_service", "SUPPORTED_DISTRIBUTIONS", "RVS", "RVS_BLOCK"]

#: the kind of a distribution drawn in Python (not a kernel code: its draws
#: reach the kernel as replayed values)
RVS = -1
#: values per ``rvs`` call when a distribution is drawn in Python
RVS_BLOCK = 1 << 16

# scipy name -> (kernel code, shape parameter names)
SUPPORTED_DISTRIBUTIONS = {
    "uniform": (_k.SVC_UNIFORM, ()),
    "expon": (_k.SVC_EXPON, ()),
    "lognorm": (_k.SVC_LOGNORM, ("s",)),
    "gamma": (_k.SVC_GAMMA, ("a",)),
    "weibull_min": (_k.SVC_WEIBULL_MIN, ("c",)),
}


@dataclass(frozen=True, eq=False)
class ServiceSpec:
    """A validated service-time source, in the form the kernel takes."""

    kind: int
    params: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)
    support: tuple
    description: dict
    dist: object = field(default=None, repr=False)

    @property
    def kernel_kind(self) -> int:
        """The kernel's code: distributions drawn in Python arrive as replayed values."""
        return _k.SVC_REPLAY if self.kind == RVS else self.kind

    def draw(self, gen: np.random.Generator, n: int) -> np.ndarray:
        """The ``n`` values of a distribution drawn in Python: ``rvs`` of
        :data:`RVS_BLOCK` values at a time on ``gen`` (the last block cut
        to what is left)."""
        out = np.empty(n)
        for i in range(0, n, RVS_BLOCK):
            m = min(RVS_BLOCK, n - i)
            out[i:i + m] = self.dist.rvs(size=m, random_state=gen)
        return out

    @property
    def mean(self) -> float:
        """The mean service time (or length), in its units."""
        if self.dist is not None:
            return float(self.dist.mean())
        return float(np.mean(self.values))

    def equal_mass_edges(self, k: int, explicit: str = "MultiBin(edges=...)") -> np.ndarray:
        """k+1 edges splitting the service distribution into equal-mass bins.

        With one bin the two edges may coincide (service times all equal): the
        kernel puts every request in bin 0 when there is one bin.  Where
        values with a mass of their own (atoms: a discrete law, replayed or
        resampled values) make two edges coincide, the ``ValueError`` tells
        the user to pass edges explicitly, as ``explicit`` (the caller's
        own argument, e.g. ``"ContinuousBatching(edges=...)"``).
        """
        q = np.linspace(0.0, 1.0, k + 1)
        if self.dist is not None:
            e = np.asarray(self.dist.ppf(q), dtype=np.float64)
            e[0], e[-1] = self.support
        else:
            e = np.quantile(self.values, q)
        if np.any(np.diff(e) < 0) or (k > 1 and np.any(np.diff(e) == 0)):
            raise ValueError(
                f"equal-mass edges for bins={k} are not strictly increasing ({e.tolist()}): "
                f"the values have atoms (values of positive probability); pass {explicit} explicitly")
        return e


@dataclass(frozen=True, eq=False)
class Empirical:
    """Values resampled uniformly, with replacement, from ``values`` (a trace's
    column, say): each request draws one, independently.  To replay the
    values in order instead, pass the array itself.

    Parameters
    ----------
    values : array_like of float
        At least one non-negative finite value (service times in s, or token
        lengths).
    """

    values: np.ndarray = field(repr=False)

    def __post_init__(self):
        v = check_real_array("values", self.values, DOMAINS["service"])
        v.flags.writeable = False
        object.__setattr__(self, "values", v)

    def __repr__(self) -> str:
        return f"Empirical({self.values.size} values, mean {float(self.values.mean()):.6g})"


#: A distribution is refused unless ``dist.isf(TAIL_PROBABILITY)`` is finite and
#: at most :data:`MAX_DURATION` (which keeps sums over many requests finite).
#: The kernels draw from 53- or 64-bit uniforms, so no draw lies further out.
TAIL_PROBABILITY = 2.0 ** -64


def _real_parameter(name: str, what: str, v) -> float:
    # scipy keeps a frozen distribution's arguments as given: an array makes
    # a vector of distributions, a string fails later
    if (isinstance(v, (bool, np.bool_)) or np.ndim(v) != 0
            or np.asarray(v).dtype.kind not in "iuf"):
        raise TypeError(f"{name} {what} must be a real number; got {v!r} ({type(v).__name__})")
    return float(v)


#: frozen distributions already checked, and their kernel form: the checks
#: call scipy (a mean, a quantile, the support), about half a millisecond,
#: which a sweep would pay for every replication of every cell
_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def as_service(service, name: str = "service") -> ServiceSpec:
    """Validate ``service``: a frozen scipy.stats continuous distribution with
    non-negative support, or a 1-D array of non-negative finite service times.

    Values, and a distribution's draws, must stay below
    :data:`~mbbatch._validation.MAX_DURATION` (1e290) so that sums over
    requests stay finite: a distribution is refused when its mean is not
    finite, or when ``dist.isf(2**-64)`` (a draw exceeded with probability
    2**-64) is not finite or exceeds it.  ``name`` is the parameter named in
    error messages (``prompt`` and ``output`` for a :class:`~mbbatch.Workload`).
    """
    if isinstance(service, stats.distributions.rv_frozen):
        known = _CHECKED.get(service)
        if known is not None:
            return known
        if not isinstance(service.dist, stats.rv_continuous):
            raise TypeError(f"{name} must be a continuous distribution; got {service.dist.name}")
        dname = service.dist.name
        if dname in SUPPORTED_DISTRIBUTIONS:
            kind, shape_names = SUPPORTED_DISTRIBUTIONS[dname]
        else:
            kind, shape_names = RVS, tuple((service.dist.shapes or "").replace(" ", "").split(",")) \
                if service.dist.shapes else ()
        try:
            shapes, loc, scale = service.dist._parse_args(*service.args, **service.kwds)
        except TypeError as exc:
            raise TypeError(f"{name} has invalid arguments: {exc}") from None
        loc = _real_parameter(name, "loc", loc)
        scale = _real_parameter(name, "scale", scale)
        shapes = tuple(_real_parameter(name, f"shape parameter {nm}", v) for nm, v in zip(shape_names, shapes))
        if not np.isfinite(loc) or not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"{name} has invalid parameters: loc={loc!r}, scale={scale!r}")
        for nm, v in zip(shape_names, shapes):
            if kind != RVS and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} shape parameter {nm} must be in (0, inf); got {v!r}")
        if kind == RVS and not bool(service.dist._argcheck(*shapes)):
            raise ValueError(f"{name} has invalid shape parameters for {dname}: "
                             + ", ".join(f"{nm}={v!r}" for nm, v in zip(shape_names, shapes)))
        lo, hi = (float(x) for x in service.support())
        if np.isnan(lo):
            raise ValueError(f"{name} has invalid parameters: loc={loc!r}, scale={scale!r}")
        if lo < 0:
            raise ValueError(
                f"{name} support must lie in [0, inf): service times are durations; "
                f"got a {dname} distribution with support [{lo:g}, {hi:g}]")
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean = float(service.mean())
            tail = float(service.isf(TAIL_PROBABILITY))
        if not math.isfinite(mean):
            raise ValueError(f"{name} must have a finite mean; got {dname} with mean {mean!r}")
        if not (math.isfinite(tail) and tail <= MAX_DURATION):
            raise ValueError(
                f"{name} draws must stay in [0, {MAX_DURATION:g}] (sums over requests must stay "
                f"finite); got {dname} with isf(2**-64) = {tail!r}")
        params = np.array([loc, scale, *shapes], dtype=np.float64)
        desc = {"service": dname, **{f"service_{nm}": float(v) for nm, v in zip(shape_names, shapes)},
                "service_loc": float(loc), "service_scale": float(scale)}
        spec = ServiceSpec(kind, params, np.empty(0), (lo, hi), desc, dist=service)
        _CHECKED[service] = spec
        return spec
    if isinstance(service, Empirical):
        return ServiceSpec(_k.SVC_EMPIRICAL, np.zeros(2), service.values,
                           (float(service.values.min()), float(service.values.max())),
                           {"service": "empirical", "n_values": int(service.values.size)})
    if isinstance(service, stats.rv_continuous):
        raise TypeError(f"{name} must be a frozen distribution, e.g. scipy.stats.uniform(1, 19); "
                        f"got the unfrozen {service.name!r}")
    if isinstance(service, stats.rv_discrete):
        raise TypeError(f"{name} must be a frozen continuous distribution or an array of service "
                        f"times; got the discrete {service.name!r}")
    v, low, high = real_array_ends(name, service, DOMAINS["service"])
    v.flags.writeable = False
    return ServiceSpec(_k.SVC_REPLAY, np.zeros(2), v, (low, high),
                       {"service": "replay", "n_values": int(v.size)})
