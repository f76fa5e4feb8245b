"""Algorithm 6 in numpy (``controller.equal_mass_edges``, which the event
kernel's driver runs at the end of the warm-up) against the numba
implementation the kernel ran until it returned to Python for it: bit for
bit, on many random windows, ties included.  And the numpy form of Algorithm
4 that re-bins the warm-up queue (``controller.partition_tiled_array``)
against the kernel's own ``partition_tiled``."""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as hs
from numba import njit

from mbbatch._kernels import controller as c

EDGE_MAX = 10000.0


@njit
def _quantile_sorted(s, q):
    # numpy's default 'linear' method operation for operation
    n = s.shape[0]
    v = (n - 1) * q
    if v >= n - 1:
        return s[n - 1]
    if v < 0.0:
        return s[0]
    prev = math.floor(v)
    i = np.int64(prev)
    a = s[i]
    b = s[i + 1]
    t = v - prev
    diff = b - a
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


@njit
def numba_edges(predicted, K, out_lo, out_hi):
    """The kernel's Algorithm 6 as it was (mbbatch 0.1.0), the reference."""
    if K == 1:
        out_lo[0] = 0.0
        out_hi[0] = EDGE_MAX
        return
    s = np.sort(predicted)
    step = 1.0 / K
    prev_q = np.floor(_quantile_sorted(s, 0.0))
    for i in range(K):
        qn = 1.0 if i + 1 == K else (i + 1) * step
        next_q = np.floor(_quantile_sorted(s, qn))
        out_lo[i] = prev_q
        out_hi[i] = next_q
        prev_q = next_q
    out_hi[K - 1] = EDGE_MAX


def reference_edges(x, K):
    lo, hi = np.full(K, np.nan), np.full(K, np.nan)
    numba_edges(np.asarray(x, np.float64), K, lo, hi)
    return lo, hi


def windows(seed, count):
    """Warm-up windows of predicted lengths like the kernel sees: whole
    tokens (many ties), continuous log-normal ones, a few distinct values,
    constants, single requests, and values around the 10000 cap."""
    rng = np.random.default_rng(seed)
    for j in range(count):
        size = int(rng.integers(1, 400))
        kind = j % 6
        if kind == 0:
            x = np.maximum(np.ceil(rng.lognormal(4.5, 1.0, size)), 1.0)
        elif kind == 1:
            x = rng.lognormal(4.5, 1.0, size)
        elif kind == 2:
            x = rng.choice(rng.integers(1, 50, 4).astype(float), size)
        elif kind == 3:
            x = np.full(size, float(rng.integers(1, 100)))
        elif kind == 4:
            x = rng.uniform(9990.0, 10010.0, size)
        else:
            x = rng.exponential(100.0, size) * rng.choice([1e-3, 1.0, 1e3])
        yield x, int(rng.integers(1, 21))


def test_numpy_edges_equal_the_kernels_on_many_windows():
    for x, K in windows(seed=6, count=3000):
        lo, hi = c.equal_mass_edges(x, K)
        ref_lo, ref_hi = reference_edges(x, K)
        np.testing.assert_array_equal(lo, ref_lo)
        np.testing.assert_array_equal(hi, ref_hi)


lengths = hs.lists(hs.one_of(hs.floats(0.0, 2e4, allow_subnormal=False), hs.integers(0, 60).map(float)),
                   min_size=1, max_size=80)


@given(x=lengths, K=hs.integers(1, 24))
def test_numpy_edges_equal_the_kernels(x, K):
    lo, hi = c.equal_mass_edges(np.array(x), K)
    ref_lo, ref_hi = reference_edges(x, K)
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)


@njit
def kernel_bins(pred, lo, hi, K):
    out = np.empty(pred.shape[0], np.int64)
    for j in range(pred.shape[0]):
        out[j] = c.partition_tiled(pred[j], lo, hi, K)
    return out


def test_rebinning_in_numpy_equals_the_kernels_partition():
    rng = np.random.default_rng(7)
    for x, K in windows(seed=8, count=500):
        lo, hi = c.equal_mass_edges(x, K)
        # the window itself, the edges exactly, their neighbours, and beyond both ends
        pred = np.concatenate([x, lo, hi, np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf),
                               rng.uniform(-1.0, 2e4, 50)])
        np.testing.assert_array_equal(c.partition_tiled_array(pred, lo, hi), kernel_bins(pred, lo, hi, K))
