"""Numbers the figures report that are not drawing: overloaded cells, confidence
intervals over replications, and how fast the controller settles after a load step.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from ..stats import settling_time
from .data import controller_series, line

__all__ = ["OVERLOAD", "overloaded", "replication_ci", "phases", "settling_time", "settling_times",
           "over_reps"]

#: A token-policy cell whose mean throughput is below this fraction of the
#: arrival rate is drawn hollow too (overloaded), whatever its ``unstable`` flag.
OVERLOAD = 0.95


def overloaded(ds, x="rate", **sel) -> np.ndarray:
    """Cells (along ``x``) whose throughput falls short of the arrival rate
    (the ``rate`` axis, or the spec's fixed ``rate``)."""
    rates = np.asarray(ds["rate"].values if x == "rate" else float(ds.attrs["rate"]), dtype=float)
    thr = line(ds, "sim_throughput_mean", x, **sel)
    with np.errstate(invalid="ignore"):
        return np.isfinite(thr) & (thr < OVERLOAD * rates)


def replication_ci(values, level=0.95):
    """Mean and t-interval half-width over replications, row by row.

    Parameters
    ----------
    values : array_like, shape (cells, reps)
        One row per cell; NaN marks a replication that is missing.
    level : float
        Confidence level of the two-sided Student t-interval.

    Returns
    -------
    mean, half : ndarray, shape (cells,)
        The mean of each row's finite values (NaN if none) and the interval's
        half-width ``t * sd / sqrt(count)`` (NaN with fewer than two values).
    """
    vals = np.asarray(values, dtype=float)
    count = np.sum(np.isfinite(vals), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.nanmean(np.where(count[:, None] > 0, vals, 0.0), axis=1)
        m = np.where(count > 0, m, np.nan)
        sd = np.array([np.nanstd(v, ddof=1) if c > 1 else np.nan for v, c in zip(vals, count)])
        t = np.array([scipy.stats.t.ppf(0.5 + level / 2, c - 1) if c > 1 else np.nan for c in count])
        half = t * sd / np.sqrt(np.maximum(count, 1))
    return m, half


# ---------------------------------------------------------------- the controller through a load step

def phases(ds):
    """The ``time`` grid of a load-step sweep and its two phases after the steps:
    ``[(t_up, t_down), (t_down, end)]``, in seconds."""
    a = ds.attrs
    t = np.asarray(ds["time"].values, dtype=float)
    t_up, t_down = float(a["t_up"]), float(a["t_down"])
    return t, [(t_up, t_down), (t_down, float(np.nanmax(t)))]


def over_reps(f, x):
    """``f`` over the reps (axis 0) of a (reps, time) array, at the times some rep
    has a value; NaN at the others (where ``f`` would warn of an empty slice)."""
    x = np.asarray(x, dtype=float)
    ok = np.isfinite(x).any(axis=0)
    out = np.full(x.shape[1], np.nan)
    if ok.any():
        out[ok] = f(x[:, ok], axis=0)
    return out


def settling_times(ds, tol=0.1, tail=0.2) -> dict:
    """Convergence of b_target (mean over reps) after each load step of ``controller_step``.

    For each controller and step (``"up"`` at ``t_up``, ``"down"`` at
    ``t_down``): ``(seconds after the step, reference b_target, late)``.  The
    time is the first sample from which the mean b_target stays within
    ``tol`` (relative) of its median over the last ``tail`` of the phase;
    ``late`` is true when that happens only inside that last part.  The
    resolution is the spacing of the ``time`` grid.
    """
    t, steps = phases(ds)
    out = {}
    for ctl in ds["controller"].values:
        y = over_reps(np.mean, controller_series(ds, "ts_b_target", ctl))
        out[str(ctl)] = {step: settling_time(t, y, t0, t1, tol, tail)
                         for step, (t0, t1) in zip(("up", "down"), steps)}
    return out
