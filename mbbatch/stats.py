"""Output statistics, in one place: confidence intervals (batch means within
a run, t-intervals across replications), quantiles read from the kernels'
latency histogram, the steady-state check, and the paired differences of
policies run on the same replications (:func:`paired_differences`).

Every interval here is two-sided at :data:`CONFIDENCE` (95%) unless a
``level`` is given, with Student-t quantiles on ``n - 1`` degrees of freedom.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as _st

from ._kernels import common as _kernel_common
from ._kernels import select as _select

__all__ = ["CONFIDENCE", "QUANTILES", "batch_means_ci", "t_interval", "hist_quantiles", "hist_bucket_bounds",
           "exact_quantiles", "backlog_verdict", "groups_verdict", "queue_verdict", "VERDICTS", "paired_interval",
           "verdicts", "difference_vars", "paired_differences"]

#: Confidence level of every interval mbbatch reports.
CONFIDENCE = 0.95
#: The latency quantiles every result reports (p50, p95, p99).
QUANTILES = (0.5, 0.95, 0.99)


@functools.lru_cache(maxsize=256)
def t_quantile(level: float, dof: int) -> float:
    """The two-sided Student-t quantile of ``level`` on ``dof`` degrees of freedom."""
    return float(_st.t.ppf(0.5 + level / 2, dof))


def _half_width(x: np.ndarray, level: float) -> float:
    return t_quantile(level, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)


def batch_means_ci(group_means: np.ndarray, mean: float, level: float = CONFIDENCE) -> tuple:
    """Batch-means confidence interval of a run's mean.

    ``group_means`` are the means of contiguous groups of the run (NaN for
    an empty group, left out); ``mean`` the run's overall mean, the interval's
    centre.  ``(nan, nan)`` with fewer than two groups."""
    g = group_means[~np.isnan(group_means)]
    if g.size < 2 or math.isnan(mean):
        return (math.nan, math.nan)
    half = _half_width(g, level)
    return (float(mean - half), float(mean + half))


def t_interval(x: np.ndarray, level: float = CONFIDENCE) -> tuple:
    """``(mean, low, high)`` of independent replications ``x``: the t-interval
    of their mean.  Non-finite values are left out; NaN ends with fewer than
    two values, a NaN mean with none."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = _half_width(x, level)
    return m, float(m - half), float(m + half)


#: a paired difference's verdict against its baseline (``verdict_<metric>``, :func:`paired_differences`)
VERDICTS = {-1: "worse", 0: "undecided", 1: "better"}


def paired_interval(xp: np.ndarray, xb: np.ndarray, level: float, centre=None) -> tuple:
    """``(diff, low, high, ratio, low, high)`` of paired samples ``xp``, ``xb``
    (arrays, the samples along the last axis; the pairs where both are
    finite): the paired t-interval of the mean difference, and the delta
    method's of the ratio of the means (NaN where fewer than two pairs are
    finite, or the baseline's mean is 0); ``centre``: the ``(diff, ratio)``
    the intervals are centred on, where the samples are a run's batch
    means."""
    xp, xb = np.asarray(xp, float), np.asarray(xb, float)
    ok = np.isfinite(xp) & np.isfinite(xb)
    k = ok.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.where(ok, xp, 0.0).sum(axis=-1) / k
        mb = np.where(ok, xb, 0.0).sum(axis=-1) / k
        if centre is None:
            diff, ratio = mp - mb, np.where(mb != 0, mp / mb, np.nan)
        else:
            diff, ratio = (np.asarray(c, float) for c in centre)
        t = _st.t.ppf(0.5 + level / 2, np.where(k >= 2, k - 1, np.nan))

        def half(e):
            em = np.where(ok, e, 0.0).sum(axis=-1, keepdims=True) / k[..., None]
            return t * np.sqrt(np.where(ok, (e - em) ** 2, 0.0).sum(axis=-1) / (k - 1)) / np.sqrt(k)

        dh = half(xp - xb)
        rh = half(xp - ratio[..., None] * xb) / np.abs(mb)
    return diff, diff - dh, diff + dh, ratio, ratio - rh, ratio + rh


def metric_spec(m: str):
    """The metric table's row of ``m``, or for a per-class metric
    ``class_<metric>`` (a sweep's ``sim_class_<metric>``, along
    ``request_class``) its row of :data:`mbbatch.metrics.PER_CLASS`."""
    from .metrics import METRICS, PER_CLASS

    return PER_CLASS[m[len("class_"):]] if m.startswith("class_") and m not in METRICS else METRICS[m]


def verdicts(metric: str, low, high) -> np.ndarray:
    """+1 better, -1 worse, 0 undecided (or no direction, or no interval),
    elementwise, by the metric's direction."""
    better = metric_spec(metric).better
    low, high = np.asarray(low, float), np.asarray(high, float)
    out = np.zeros(np.shape(low), np.int8)
    if better:
        sign = 1 if better == "higher" else -1
        out[low > 0] = sign
        out[high < 0] = -sign
    return out


def difference_vars(m: str, rows: tuple, dims: tuple) -> dict:
    """The Dataset variables of metric ``m``'s differences ``rows`` (as
    :func:`paired_interval` returns them, on ``dims``)."""
    units = metric_spec(m).units
    out = {}
    for j, what in enumerate(("diff", "ratio")):
        for k, suffix in enumerate(("", "_ci_low", "_ci_high")):
            out[f"{what}_{m}{suffix}"] = (dims, np.asarray(rows[3 * j + k], float),
                                          {"units": units if what == "diff" else "1"})
    out[f"verdict_{m}"] = (dims, verdicts(m, rows[1], rows[2]),
                           {"units": "1", "description": "1 better, -1 worse, 0 undecided against the baseline"})
    return out


def paired_differences(ds, baseline: str, level: float = CONFIDENCE, metrics=None):
    """Each policy's difference and ratio to ``baseline`` in ``ds`` (an
    :class:`xarray.Dataset`; returns another), a Dataset with a ``policy`` axis whose metrics ``sim_<metric>`` were run
    on paired replications along ``rep`` (:func:`mbbatch.compare`'s, or a sweep's:
    a sweep's cells that differ only in their policy see the same requests):
    ``diff_<metric>``, ``ratio_<metric>``, their ``_ci_low`` and ``_ci_high``
    at ``level``, and ``verdict_<metric>``, on every axis but ``rep``.
    ``metrics``: those to compare (default: every real one ``ds`` keeps per
    replication; a per-class one as ``class_<metric>``, its differences
    along ``request_class`` too)."""
    import xarray as xr

    if "policy" not in ds.dims or "rep" not in ds.dims:
        raise ValueError(f"paired_differences needs a Dataset with policy and rep axes; got axes {tuple(ds.dims)}")
    names = [str(p) for p in ds["policy"].values]
    if baseline not in names:
        raise ValueError(f"baseline must be one of the policies ({', '.join(map(repr, names))}); got {baseline!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    from .metrics import METRICS

    if metrics is None:
        metrics = [m for m, spec in METRICS.items() if spec.var == f"sim_{m}" and spec.var in ds
                   and "rep" in ds[spec.var].dims and spec.dtype == "f8"]
    out = {}
    for m in metrics:
        x = ds[f"sim_{m}"]
        dims = tuple(d for d in x.dims if d != "rep")
        xp = x.transpose(*dims, "rep").values
        xb = x.sel(policy=baseline).broadcast_like(x).transpose(*dims, "rep").values
        out.update(difference_vars(m, paired_interval(xp, xb, level), dims))
    coords = {d: ds[d] for d in ds.dims if d != "rep" and d in ds.coords}
    return xr.Dataset(out, coords=coords, attrs={"baseline": baseline, "level": level})


def hist_bucket_bounds(h: np.ndarray, base: int, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper values of the kernels' log-linear histogram buckets
    ``h`` (bucket = the float's exponent and top mantissa bits: ``base`` and
    ``shift`` are the kernel's histogram constants)."""
    lo_bits = (np.asarray(h, np.int64) + base) << shift
    hi_bits = (np.asarray(h, np.int64) + 1 + base) << shift
    return lo_bits.view(np.float64), hi_bits.view(np.float64)


def hist_quantiles(hist: np.ndarray, qs, base: int, shift: int) -> np.ndarray:
    """Quantiles ``qs`` (ascending) of the values counted in ``hist``: the
    "inverted CDF" rank ``max(1, ceil(q * total))``, read at the midpoint of
    the first bucket whose cumulative count reaches it (relative error at
    most half a bucket's width).  The end buckets also hold every value
    beyond the histogram's range: a quantile in the first (values under
    about 1 ns, zero included) is 0, in the last (2**50 s or more) inf.

    A histogram of real weights (the time between tokens', weighted by
    fractional gaps) is read the same way: the first bucket whose cumulative
    weight reaches ``q x total``, which for whole counts is the rank's.
    NaN where nothing is counted."""
    qs = np.asarray(qs, dtype=np.float64)
    if hist.dtype.kind == "f":
        cum = np.cumsum(hist)
        if not cum[-1] > 0:
            return np.full(len(qs), math.nan)
        h = np.minimum(np.searchsorted(cum, qs * cum[-1], side="left"), len(hist) - 1)
    else:
        h = np.empty(len(qs), np.int64)
        if _kernel_common.hist_ranks(hist, qs, h) == 0:
            return np.full(len(qs), math.nan)
    lo, hi = hist_bucket_bounds(h, base, shift)
    return np.where(h == 0, 0.0, np.where(h == len(hist) - 1, math.inf, 0.5 * (lo + hi)))


#: the fewest values :func:`exact_quantiles` brackets (below, it selects on all of them), and its sample's size
SELECT_LEAST, SELECT_SAMPLE = 1 << 16, 1 << 14


def exact_quantiles(x: np.ndarray, qs) -> np.ndarray:
    """Quantiles ``qs`` of the values of ``x`` that are not NaN, exactly as
    ``np.quantile(..., method="inverted_cdf")`` gives them (the value of
    rank ``ceil(q m)``, 1-based, of the ``m`` values: Hyndman and Fan,
    1996, definition 1), in about one pass where ``x`` is large
    (:mod:`mbbatch._kernels.select`: each rank bracketed by a sorted
    sample's values, the values inside kept and selected among, on the
    whole when a bracket misses); ``x`` is not changed."""
    qs = np.asarray(qs, dtype=np.float64)
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.size >= SELECT_LEAST and qs.size:
        got = _bracketed_quantiles(x, qs)
        if got is not None:
            return got
    return np.quantile(x[~np.isnan(x)], qs, method="inverted_cdf", overwrite_input=True)


def _bracketed_quantiles(x: np.ndarray, qs: np.ndarray):
    """:func:`exact_quantiles` by brackets, or None where one misses its
    rank (or keeps more than its room) or no value is a number."""
    sample = x[::max(1, x.size // SELECT_SAMPLE)]
    sample = np.sort(sample[~np.isnan(sample)])
    s = sample.size
    if s == 0:
        return None
    # (each bracket the sample's values some standard deviations of a sample quantile's rank either side of it)
    half = (8.0 * np.sqrt(qs * (1.0 - qs) * s) + 16.0).astype(np.int64)
    at = np.floor(qs * s).astype(np.int64)
    lo = np.where(at - half >= 0, sample[np.clip(at - half, 0, s - 1)], -np.inf)
    hi = np.where(at + half < s, sample[np.clip(at + half, 0, s - 1)], np.inf)
    below = np.zeros(qs.size, np.int64)
    size = np.zeros(qs.size, np.int64)
    kept = np.empty((qs.size, max(x.size // 8, 1024)))
    m = _select.bracketed(x, lo, hi, below, kept, size)
    if m == 0:
        return None
    # (numpy's rank for the inverted CDF: index m q - 1, taken up where it is not whole, 0 at least)
    index = m * qs - 1.0
    previous = np.floor(index)
    ranks = np.maximum(np.where(index - previous == 0, previous, previous + 1), 0).astype(np.int64)
    out = np.empty(qs.size)
    for b, k in enumerate(ranks):
        j = k - below[b]
        if not (0 <= j < size[b] <= kept.shape[1]):
            return None
        out[b] = np.partition(kept[b, :size[b]], j)[j]
    return out


# --- the steady-state check ------------------------------------------------------------
#
# One rule for every policy: a quantity that measures the backlog (the wait of
# a batch in the central FIFO, or the requests queued) is compared between the
# second and the last quarter of the arrivals.  It grows if the last exceeds the
# second by more than half of it and by more than two typical units (a batch
# service time, or a batch of requests).  An overloaded queue that starts empty
# grows linearly (last/second quarter about 7/3); a stable one stays level up to
# noise of the order of that unit.

#: growth beyond this fraction of the second quarter's value ...
GROWTH_RELATIVE = 0.5
#: ... and beyond this many typical units counts as a growing backlog
GROWTH_UNITS = 2.0


def _growth(second: float, last: float, unit: float) -> bool:
    return bool(last - second > max(GROWTH_RELATIVE * second, GROWTH_UNITS * unit))


def _quarters(groups):
    """The mean of the finite group values in the second and in the last
    quarter of the groups, or None (fewer than 4 groups, or a quarter with
    none)."""
    g = np.asarray(groups, dtype=float)
    if g.size < 4:
        return None
    q = g.size // 4
    a, b = g[q:2 * q], g[3 * q:]
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size == 0 or b.size == 0:
        return None
    return float(a.mean()), float(b.mean())


def _quarters_verdict(groups, unit: float, too_few: str, waited: str) -> tuple[bool, str]:
    """``(growing, reason)`` from per-group values: the last quarter's mean
    against the second's (:func:`_growth`, in units of ``unit``);
    ``waited`` says it, with ``{last}`` and ``{second}`` in it."""
    quarters = _quarters(groups) if np.isfinite(unit) else None
    if quarters is None:
        return False, f"not assessed: {too_few}"
    second, last = quarters
    if _growth(second, last, unit):
        return True, (f"the backlog grows: {waited.format(last=last, second=second)}; the averages describe a "
                      "transient, not a steady state")
    return False, "no growing backlog"


def backlog_verdict(group_wait, mean_batch_service) -> tuple[bool, str]:
    """Multi-bin runs: ``(growing, reason)`` from the mean central-FIFO wait of
    the batches closed in each contiguous group of arrivals (``group_wait``,
    s) against the mean batch service time (s)."""
    return _quarters_verdict(group_wait, mean_batch_service, "too few batches",
                             "batches of the last quarter of arrivals waited {last:.4g} s in the central FIFO, "
                             "against {second:.4g} s in the second quarter")


def groups_verdict(group_means, unit: float, what: str) -> tuple[bool, str]:
    """LAPS runs: ``(growing, reason)`` of one category's requests from their
    mean time to first token in each contiguous group of arrivals
    (``group_means``, s; NaN for a group with none), against ``unit`` (s, the
    mean prefill batch time).  A queue that grows makes each later arrival
    wait longer, so an overloaded instance group's TTFT rises through the
    run; ``what`` names the requests in the reason."""
    return _quarters_verdict(group_means, unit, f"too few {what} requests",
                             f"{what} requests of the last quarter of arrivals waited {{last:.4g}} s for their "
                             "first token, against {second:.4g} s in the second quarter")


def queue_verdict(times, queue, mean_batch: float, start: float, end: float) -> tuple[bool, str]:
    """Event-kernel runs: ``(growing, reason)`` from the downsampled queue
    lengths (``queue``: one row per sampled batch start ``times``, one column
    per bin) while arrivals last, from ``start`` to ``end`` s (after the last
    arrival any queue drains), against the mean batch size."""
    if not (np.isfinite(mean_batch) and np.isfinite(end)):
        return False, "not assessed: no batches"
    q = np.asarray(queue).sum(axis=1)
    bounds = start + (end - start) * np.array([0.25, 0.5, 0.75, 1.0])
    second = q[(times >= bounds[0]) & (times < bounds[1])]
    last = q[(times >= bounds[2]) & (times <= bounds[3])]
    if second.size == 0 or last.size == 0:
        return False, "not assessed: too few batches"
    a, b = float(second.mean()), float(last.mean())
    if _growth(a, b, mean_batch):
        return True, (f"the backlog grows: {b:.4g} requests waited on average in the last quarter of "
                      f"the arrivals, against {a:.4g} in the second quarter; the averages describe a "
                      "transient, not a steady state")
    return False, "no growing backlog"


# --- convergence -----------------------------------------------------------------------

#: a controlled series has converged once it stays within this relative band ...
SETTLE_TOLERANCE = 0.1
#: ... of its median over this last share of the phase
SETTLE_TAIL = 0.2


def settling_time(t, y, t0, t1, tol=SETTLE_TOLERANCE, tail=SETTLE_TAIL):
    """Time after ``t0`` from which ``y`` stays within ``tol`` of its median over the
    last ``tail`` of the phase [t0, t1]; also that median, and whether the series
    settles only inside that last part (still drifting)."""
    in_phase = (t >= t0) & (t <= t1) & np.isfinite(y)
    tt, yy = t[in_phase], y[in_phase]
    if tt.size == 0:
        return np.nan, np.nan, False
    ref_start = t1 - tail * (t1 - t0)
    ref = float(np.median(yy[tt >= ref_start]))
    inside = np.abs(yy - ref) <= tol * abs(ref)
    outside = np.flatnonzero(~inside)
    first = 0 if outside.size == 0 else int(outside[-1]) + 1
    if first >= tt.size:
        return np.nan, ref, True
    return float(tt[first] - t0), ref, bool(tt[first] >= ref_start)
