"""Output statistics (mbbatch.stats): intervals, histogram quantiles and the
steady-state checks."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hst
import scipy.stats as st

from mbbatch import stats
from mbbatch._kernels.common import HIST_BASE, HIST_SHIFT, HIST_SIZE, hist_bucket, hist_ranks
from mbbatch.stats import backlog_verdict, queue_verdict


def test_backlog_heuristic():
    S = 10.0
    level = np.full(32, 50.0) + np.sin(np.arange(32)) * 5
    growing = np.linspace(0, 5000, 32)
    assert backlog_verdict(level, S) == (False, "no growing backlog")
    assert backlog_verdict(growing, S)[0]
    assert backlog_verdict(np.full(32, np.nan), S) == (False, "not assessed: too few batches")


def test_queue_verdict_reads_the_arrival_window():
    t = np.linspace(0, 100, 400)
    level = np.full((400, 1), 5.0)
    assert queue_verdict(t, level, 4.0, 0.0, 100.0) == (False, "no growing backlog")
    growing = np.linspace(0, 1000, 400)[:, None]
    assert queue_verdict(t, growing, 4.0, 0.0, 100.0)[0]
    # the window is that of the arrivals: [start, end]
    assert not queue_verdict(t + 1000, growing, 4.0, 0.0, 100.0)[0]


def test_t_interval_is_students():
    x = np.array([1.0, 2.0, 4.0, 7.0])
    mean, lo, hi = stats.t_interval(x)
    half = st.t.ppf(0.975, 3) * x.std(ddof=1) / 2.0
    assert mean == x.mean() and math.isclose(hi - mean, half) and math.isclose(mean - lo, half)


def test_batch_means_ci_covers_at_its_level():
    """95% batch-means intervals of i.i.d. normal group means cover the true
    mean 0 in 95% of 2000 trials; 99.99% binomial acceptance band."""
    rng = np.random.default_rng(0)
    trials = 2000
    cover = sum(lo <= 0.0 <= hi for lo, hi in
                (stats.batch_means_ci(g, g.mean()) for g in rng.normal(size=(trials, 32))))
    band = st.norm.ppf(1 - 0.0001 / 2) * math.sqrt(0.95 * 0.05 / trials)
    assert abs(cover / trials - 0.95) < band


def _inverted_cdf(x, qs):
    return np.quantile(x[~np.isnan(x)], qs, method="inverted_cdf")


@settings(max_examples=60, deadline=None)
@given(n=hst.integers(1, 200_000), kind=hst.sampled_from(["iid", "sorted", "reversed", "ties", "nan", "walk"]),
       seed=hst.integers(0, 2**32 - 1), qs=hst.lists(hst.floats(0.0, 1.0), min_size=1, max_size=4))
def test_exact_quantiles_are_numpys_inverted_cdf(n, kind, seed, qs):
    """Above SELECT_LEAST values by brackets (monkeypatched lower here: the
    property holds at every size), else numpy's own: the same values, bit
    for bit, at any quantiles, NaN left out, the input unchanged."""
    rng = np.random.default_rng(seed)
    x = rng.lognormal(0.0, 1.0, n)
    if kind == "sorted":
        x.sort()
    elif kind == "reversed":
        x = np.sort(x)[::-1].copy()
    elif kind == "ties":
        x = np.round(x, 1)
    elif kind == "nan":
        x[rng.random(n) < 0.3] = np.nan
    elif kind == "walk":
        x = np.cumsum(rng.normal(size=n))
    before = x.copy()
    qs = np.sort(np.asarray(qs))
    if np.isnan(x).all():
        return
    least = stats.SELECT_LEAST
    try:
        stats.SELECT_LEAST = 1
        got = stats.exact_quantiles(x, qs)
    finally:
        stats.SELECT_LEAST = least
    np.testing.assert_array_equal(got, _inverted_cdf(x, qs))
    np.testing.assert_array_equal(x, before)


def test_exact_quantiles_select_on_the_whole_where_the_sample_misleads():
    """A sample of every step-th value, all far above the rest: the brackets
    miss the lower ranks, and the answer is numpy's on the whole array."""
    n = 1 << 20
    x = np.linspace(0.0, 1.0, n)
    x[::n // stats.SELECT_SAMPLE] = 1e9
    qs = np.array(stats.QUANTILES)
    assert stats._bracketed_quantiles(x, qs) is None
    np.testing.assert_array_equal(stats.exact_quantiles(x, qs), _inverted_cdf(x, qs))
    # (and where it does not, the brackets answer: the same values)
    y = np.random.default_rng(3).lognormal(size=n)
    np.testing.assert_array_equal(stats._bracketed_quantiles(y, qs), _inverted_cdf(y, qs))


def test_hist_quantiles_within_the_bucket_width():
    """Quantiles read from the kernels' log-linear histogram are within its
    relative bucket width (2**-10) of the exact ones."""
    x = np.random.default_rng(1).lognormal(0.0, 1.5, 50_000)
    hist = np.zeros(HIST_SIZE, np.int64)
    for v in x:
        hist[hist_bucket(v)] += 1
    got = stats.hist_quantiles(hist, stats.QUANTILES, HIST_BASE, HIST_SHIFT)
    exact = np.quantile(x, stats.QUANTILES)
    np.testing.assert_allclose(got, exact, rtol=2.0 ** -10)


def test_hist_quantiles_beyond_the_histogram_are_0_or_inf():
    """The end buckets hold every latency beyond the histogram's range: a
    quantile read in the first (under about 1 ns, zero included) is 0, in the
    last (2**50 s or more) inf, not those buckets' midpoints (9.3e-10 s and
    1.1e15 s)."""
    hist = np.zeros(HIST_SIZE, np.int64)
    for v in (0.0, 1e-12, 1.0, 2.0, 2.0 ** 50, 1e16, 1e300):
        hist[hist_bucket(v)] += 1
    got = stats.hist_quantiles(hist, [0.1, 0.25, 0.4, 0.55, 0.7, 1.0], HIST_BASE, HIST_SHIFT)
    assert got[0] == got[1] == 0.0
    assert got[2] == 1.0 * (1 + 2.0 ** -11) and got[3] == 2.0 * (1 + 2.0 ** -11)
    assert (got[4:] == np.inf).all()


def test_hist_quantiles_read_the_first_bucket_reaching_each_rank():
    """The kernels' one-pass search (hist_ranks) equals searchsorted on the
    whole cumulative sum, ranks on block boundaries, first and last buckets
    and repeated ranks included."""
    rng = np.random.default_rng(2)
    for hist in (rng.integers(0, 3, HIST_SIZE) * (rng.random(HIST_SIZE) < 0.01),
                 np.eye(1, HIST_SIZE, 0, dtype=np.int64)[0], np.eye(1, HIST_SIZE, HIST_SIZE - 1, dtype=np.int64)[0],
                 np.r_[np.ones(1024, np.int64), np.zeros(HIST_SIZE - 1024, np.int64)]):
        total = int(hist.sum())
        qs = np.unique(np.r_[0.0, 1.0, np.linspace(0.0, 1.0, 97), min(1024 / total, 1.0)])
        qs = np.sort(np.r_[qs, 0.5, 0.5, 1.0])   # (repeated quantiles too)
        ranks = np.maximum(1, np.ceil(qs * total).astype(np.int64))
        got = np.empty(qs.size, np.int64)
        assert hist_ranks(hist, qs, got) == total
        np.testing.assert_array_equal(got, np.searchsorted(np.cumsum(hist), ranks, side="left"))
    empty = np.full(3, 7, np.int64)
    assert hist_ranks(np.zeros(HIST_SIZE, np.int64), np.array([0.5, 0.9, 0.99]), empty) == 0
    assert (empty == -1).all()
    assert np.isnan(stats.hist_quantiles(np.zeros(HIST_SIZE, np.int64), stats.QUANTILES, HIST_BASE,
                                         HIST_SHIFT)).all()


def test_a_histogram_of_real_weights_reads_as_its_counts_do():
    """hist_quantiles on a float histogram (the time between tokens', weighted by each batch's
    gaps): whole weights give the count histogram's quantiles bucket for bucket; fractional ones
    the first bucket whose cumulative weight reaches q x total; nothing counted, NaN."""
    from mbbatch.stats import QUANTILES, hist_bucket_bounds, hist_quantiles

    rng = np.random.default_rng(4)
    counts = np.zeros(HIST_SIZE, np.int64)
    np.add.at(counts, rng.integers(1000, 1400, 500), rng.integers(1, 9, 500))
    args = (QUANTILES, HIST_BASE, HIST_SHIFT)
    np.testing.assert_array_equal(hist_quantiles(counts.astype(float), *args), hist_quantiles(counts, *args))
    w = np.zeros(HIST_SIZE)
    w[[1000, 1100, 1200]] = [0.4, 0.15, 0.45]       # cumulative 0.4, 0.55, 1.0: p50 in 1100, p95 and p99 in 1200
    lo, hi = hist_bucket_bounds(np.array([1100, 1200, 1200]), HIST_BASE, HIST_SHIFT)
    np.testing.assert_array_equal(hist_quantiles(w, (0.5, 0.95, 0.99), HIST_BASE, HIST_SHIFT), 0.5 * (lo + hi))
    assert np.isnan(hist_quantiles(np.zeros(HIST_SIZE), *args)).all()
