"""Service-time distributions: a scipy.stats frozen distribution, drawn inside
the kernel, or an explicit array of service times (a trace)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from ._kernels import multibin as _k

__all__ = ["ServiceSpec", "as_service", "SUPPORTED_DISTRIBUTIONS"]

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

    def equal_mass_edges(self, k: int) -> np.ndarray:
        """k+1 edges splitting the service distribution into equal-mass bins."""
        q = np.linspace(0.0, 1.0, k + 1)
        if self.dist is not None:
            e = np.asarray(self.dist.ppf(q), dtype=np.float64)
            e[0], e[-1] = self.support
        else:
            e = np.quantile(self.values, q)
        if np.any(np.diff(e) <= 0):
            raise ValueError(
                f"equal-mass edges for bins={k} are not strictly increasing ({e.tolist()}): "
                "the service times have atoms; pass MultiBin(edges=...) explicitly")
        return e


def as_service(service) -> ServiceSpec:
    """Validate ``service``: a frozen scipy.stats continuous distribution with
    non-negative support, or a 1-D array of non-negative finite service times."""
    if isinstance(service, stats.distributions.rv_frozen):
        if not isinstance(service.dist, stats.rv_continuous):
            raise TypeError(f"service must be a continuous distribution; got {service.dist.name}")
        name = service.dist.name
        if name not in SUPPORTED_DISTRIBUTIONS:
            raise ValueError(
                f"service distribution {name!r} is not drawn by the kernel; supported: "
                f"{sorted(SUPPORTED_DISTRIBUTIONS)}, or pass an array of service times")
        kind, shape_names = SUPPORTED_DISTRIBUTIONS[name]
        shapes, loc, scale = service.dist._parse_args(*service.args, **service.kwds)
        lo, hi = (float(x) for x in service.support())
        if not np.isfinite(loc) or not np.isfinite(scale) or scale <= 0 or np.isnan(lo):
            raise ValueError(f"service has invalid parameters: loc={loc!r}, scale={scale!r}")
        for nm, v in zip(shape_names, shapes):
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"service shape parameter {nm} must be in (0, inf); got {v!r}")
        if lo < 0:
            raise ValueError(
                f"service support must lie in [0, inf): service times are durations; "
                f"got a {name} distribution with support [{lo:g}, {hi:g}]")
        params = np.array([loc, scale, *shapes], dtype=np.float64)
        desc = {"service": name, **{f"service_{nm}": float(v) for nm, v in zip(shape_names, shapes)},
                "service_loc": float(loc), "service_scale": float(scale)}
        return ServiceSpec(kind, params, np.empty(0), (lo, hi), desc, dist=service)
    if isinstance(service, stats.rv_continuous):
        raise TypeError("service must be a frozen distribution, e.g. scipy.stats.uniform(1, 19); "
                        f"got the unfrozen {service.name!r}")
    try:
        v = np.asarray(service, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError("service must be a frozen scipy.stats distribution or an array of "
                        f"service times; got {type(service).__name__}") from None
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"service times must be a non-empty 1-D array; got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("service times must be finite; got NaN or inf")
    if np.any(v < 0):
        raise ValueError(f"service times must lie in [0, inf); got {float(v.min())!r}")
    v = v.copy()
    v.flags.writeable = False
    return ServiceSpec(_k.SVC_REPLAY, np.zeros(2), v, (float(v.min()), float(v.max())),
                       {"service": "replay", "n_values": int(v.size)})
