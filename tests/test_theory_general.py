"""Tests of mbbatch.theory.general: the exact quadrature batch_service_time
(eq. 2 of the multi-bin batching paper, any continuous distribution, any
edges) and the numerical optimiser optimal_boundaries.

The quadrature checks compare them with the closed forms of
mbbatch.theory.uniform and mbbatch.theory.exponential (eq. 20, Lemma 4.1,
Lemma A.1) and pin the table of theory/NOTES.md.

The functions tested are deterministic (no Monte Carlo sampling; hypothesis
only draws their arguments), so every comparison is exact up to a stated
floating-point or quadrature tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from scipy import stats

from mbbatch.theory import (
    batch_service_time,
    exponential_boundaries,
    exponential_service_bound,
    optimal_boundaries,
    service_time,
    uniform_boundaries,
)

from .theory_helpers import Bs, ks, l_mins, quadrature, widths

# --------------------------------------------------------------------------
# batch_service_time against eq. (20)
# --------------------------------------------------------------------------

@quadrature
@given(B=Bs, l_min=l_mins, width=widths, k=ks)
def test_batch_service_time_reproduces_eq20(B, l_min, width, k):
    l_max = l_min + width
    dist = stats.uniform(l_min, l_max - l_min)
    exact = batch_service_time(dist, uniform_boundaries(l_min, l_max, k), B)
    assert exact == pytest.approx(service_time(B, l_min, l_max, k), rel=1e-8)


# --------------------------------------------------------------------------
# optimal_boundaries
# --------------------------------------------------------------------------

@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_optimal_boundaries_reproduce_lemma_4_1(k):
    dist = stats.uniform(1.0, 19.0)
    target = uniform_boundaries(1.0, 20.0, k)
    for B in (2, 128):
        start = np.arange(1, k + 1, dtype=float)     # deliberately unequal masses
        for s in (None, start):
            e = optimal_boundaries(dist, B, k, start=s)
            np.testing.assert_allclose(e, target, rtol=1e-6)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_optimal_boundaries_beat_lemma_A1_for_exponential(k):
    dist = stats.expon(scale=10.0)
    lemma = batch_service_time(dist, exponential_boundaries(200, 0.1, k), 200)
    e = optimal_boundaries(dist, 200, k)
    assert e[0] == 0.0 and e[-1] == np.inf and np.all(np.diff(e) > 0)
    best = batch_service_time(dist, e, 200)
    assert best <= lemma
    assert best <= exponential_service_bound(200, 0.1, k)


def test_optimal_boundaries_small_cases():
    dist = stats.expon(scale=10.0)
    assert optimal_boundaries(dist, 200, 1).tolist() == [0.0, np.inf]
    # B = 1: objective is the mean whatever the edges; equal masses returned
    e = optimal_boundaries(dist, 1, 3)
    np.testing.assert_allclose(e[1:-1], dist.ppf([1 / 3, 2 / 3]), rtol=1e-12)


#: The table of theory/NOTES.md: mu = 0.1, B = 200.
NOTES_TABLE = {
    # k: (exact at Lemma A.1 edges, exact at optimal edges, Lemma A.1 bound)
    1: (58.780309481214, 58.780309481214, 58.780309481214),
    2: (27.515462695788, 27.511619259478, 27.712218330597),
    3: (20.066046972062, 20.064552840258, 20.192883179128),
    4: (16.939169243566, 16.938422405239, 17.027451314697),
    5: (15.256190808838, 15.255751773376, 15.322417319190),
}


@pytest.mark.parametrize("k", sorted(NOTES_TABLE))
def test_notes_table(k):
    dist = stats.expon(scale=10.0)
    lemma, opt, bound = NOTES_TABLE[k]
    assert batch_service_time(dist, exponential_boundaries(200, 0.1, k), 200) == \
        pytest.approx(lemma, rel=1e-11)
    assert batch_service_time(dist, optimal_boundaries(dist, 200, k), 200) == \
        pytest.approx(opt, rel=1e-11)
    assert exponential_service_bound(200, 0.1, k) == pytest.approx(bound, rel=1e-12)


# --------------------------------------------------------------------------
# bad input and edge cases of batch_service_time and optimal_boundaries
# --------------------------------------------------------------------------

def test_batch_service_time_bad_input():
    dist = stats.expon(scale=2.0)
    good = [0.0, 1.0, np.inf]
    for bad_dist in (stats.expon, stats.poisson(3.0), "expon", None):
        with pytest.raises(TypeError, match="dist"):
            batch_service_time(bad_dist, good, 4)
        with pytest.raises(TypeError, match="dist"):
            optimal_boundaries(bad_dist, 4, 2)
    for bad_edges in ([0.0, 2.0, 1.0, np.inf],       # decreasing
                      [0.0, np.nan, np.inf],         # NaN
                      [0.0, 5.0],                    # does not cover (0, inf)
                      [1.0, 2.0, np.inf],            # does not cover the lower end
                      [[0.0, np.inf]],               # not 1-D
                      [0.0],                         # too short
                      [np.inf, np.inf]):             # empty
        with pytest.raises(ValueError, match="edges"):
            batch_service_time(dist, bad_edges, 4)
    with pytest.raises(ValueError, match="edges"):
        batch_service_time(stats.uniform(1, 19), [1.0, 10.0, 19.5], 4)
    for bad_B, err in ((0, ValueError), (-2, ValueError), (4.0, TypeError), (True, TypeError),
                       (math.nan, ValueError), (math.inf, ValueError)):
        with pytest.raises(err, match="B"):
            batch_service_time(dist, good, bad_B)
        with pytest.raises(err, match="B"):
            optimal_boundaries(dist, bad_B, 2)
    for bad_k, err in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="k"):
            optimal_boundaries(dist, 4, bad_k)
    with pytest.raises(ValueError, match="start"):
        optimal_boundaries(dist, 4, 3, start=[1.0, -1.0, 1.0])


def test_batch_service_time_accepts_rounded_support_and_empty_bins():
    # uniform(0.1, 0.2) has support end 0.1 + 0.2 = 0.30000000000000004
    dist = stats.uniform(0.1, 0.2)
    e = uniform_boundaries(0.1, 0.3, 2)
    assert batch_service_time(dist, e, 3) == pytest.approx(service_time(3, 0.1, 0.3, 2), rel=1e-10)
    # equal neighbouring edges: an empty bin contributes nothing
    d = stats.expon(scale=2.0)
    assert batch_service_time(d, [0.0, 1.0, 1.0, np.inf], 5) == pytest.approx(
        batch_service_time(d, [0.0, 1.0, np.inf], 5), rel=1e-14)
    # edges beyond a bounded support
    assert batch_service_time(stats.uniform(1, 19), [0.0, 10.5, 30.0], 128) == pytest.approx(
        service_time(128, 1.0, 20.0, 2), rel=1e-10)


# --- eq. (2) on an empirical distribution --------------------------------------------------

def test_empirical_batch_service_time_is_the_mean_max_of_the_bins_draws():
    """Brute force: every B-tuple of a small sample's values within each bin."""
    import itertools

    from mbbatch.theory import empirical_batch_service_time

    rng = np.random.default_rng(0)
    v = rng.integers(1, 20, 30).astype(float)
    edges, B = [1.0, 7.5, 13.0, 19.0], 3
    bins = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, 2)
    want = sum((bins == i).mean() * np.mean([max(t) for t in itertools.product(v[bins == i], repeat=B)])
               for i in range(3) if (bins == i).any())
    assert empirical_batch_service_time(v, edges, B) == pytest.approx(want, rel=1e-12)
    assert empirical_batch_service_time([1.0, 2.0], [1.0, 2.0], 2) == 1.75
    assert empirical_batch_service_time(v, [v.min(), v.max()], 1) == pytest.approx(v.mean(), rel=1e-12)
    with pytest.raises(ValueError, match="cover"):
        empirical_batch_service_time(v, [2.0, 10.0], 2)
