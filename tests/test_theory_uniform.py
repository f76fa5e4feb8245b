"""Tests of mbbatch.theory.uniform: the closed forms for uniform service
times (Sections 4-5 of the multi-bin batching paper: service_time, throughput,
capacity, min_bins, latency, uniform_boundaries) and the paper's errata 1, 2
(Appendix A.1), 5 and 6 (see theory/NOTES.md).

Some tests here use the exact quadrature (mbbatch.theory.batch_service_time)
as the oracle for a uniform result: they live here because the uniform result
is what they check.  The converse, the quadrature checked against eq. (20)
(test_batch_service_time_reproduces_eq20), is in test_theory_general.py.

The functions tested are deterministic (no Monte Carlo sampling; hypothesis
only draws their arguments), so every comparison is exact up to a stated
floating-point or quadrature tolerance.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from mbbatch import theory
from mbbatch.theory import (
    batch_service_time,
    capacity,
    latency,
    min_bins,
    service_time,
    throughput,
    uniform_boundaries,
)

from .theory_helpers import (
    Bs,
    Bs2,
    cheap,
    eq10_as_printed,
    eq10_corrected,
    fracs,
    ks,
    l_mins,
    lams,
    quadrature,
    widths,
)


# --------------------------------------------------------------------------
# Section 4: throughput, capacity, min_bins (uniform service times)
# --------------------------------------------------------------------------

@cheap
@given(B=Bs, l_min=l_mins, width=widths)
def test_throughput_increases_with_k_and_stays_below_capacity(B, l_min, width):
    l_max = l_min + width
    k = np.arange(1, 65)
    t = throughput(B, l_min, l_max, k)
    c = capacity(B, l_min, l_max)
    if B > 1:
        assert np.all(np.diff(t) > 0)
        assert np.all(t < c)
    else:  # a batch of one: the number of bins does not matter
        assert np.all(t == t[0])
        assert np.all(t <= c)
        assert t[0] == pytest.approx(c, rel=1e-15)


@cheap
@given(l_min=l_mins, width=widths, k=ks)
def test_B1_service_time_does_not_depend_on_k(l_min, width, k):
    l_max = l_min + width
    assert service_time(1, l_min, l_max, k) == service_time(1, l_min, l_max, 1)
    assert service_time(1, l_min, l_max, k) == pytest.approx((l_min + l_max) / 2, rel=1e-15)


@cheap
@given(B=Bs, l_min=l_mins, width=widths, u=fracs)
def test_min_bins_is_minimal(B, l_min, width, u):
    l_max = l_min + width
    c = capacity(B, l_min, l_max)
    eps = u * c
    assume(0.0 < eps < c)
    k = min_bins(B, l_min, l_max, eps)
    assert isinstance(k, int) and k >= 1
    assert throughput(B, l_min, l_max, k) >= c - eps
    assert k == 1 or throughput(B, l_min, l_max, k - 1) < c - eps
    # Theorem 4.3, eq. (6): the closed form with max(1, .), up to rounding
    m = (l_max + l_min) / 2
    a = (B - 1) * (l_max - l_min) / (2 * (B + 1))
    raw = (c - eps) * a / (eps * m)
    if raw < 1e6:
        closed = max(1, math.ceil(raw))
        assert abs(k - closed) <= 1


def test_min_bins_edge_cases():
    c = capacity(128, 1.0, 20.0)
    assert min_bins(128, 1.0, 20.0, c) == 1          # eps >= c_max: erratum 6
    assert min_bins(128, 1.0, 20.0, 10 * c) == 1
    assert min_bins(1, 1.0, 20.0, 1e-9) == 1         # B = 1: binning never helps
    # extreme eps: exact consistency with throughput by bisection
    for eps in (1e-300, 1e-12, 1e-9):
        k = min_bins(128, 1.0, 20.0, eps)
        assert throughput(128, 1.0, 20.0, k) >= c - eps
        assert throughput(128, 1.0, 20.0, k - 1) < c - eps
    ks_ = min_bins(128, 1.0, 20.0, np.array([1.0, 0.5, 0.1]))
    assert ks_.dtype == np.int64 and ks_.tolist() == [10, 21, 108]


def test_golden_values():
    s = service_time(128, 1, 20, 4)
    assert throughput(128, 1, 20, 4) == 128 / s
    assert round(throughput(128, 1, 20, 4), 3) == 9.97
    assert capacity(128, 1, 20) == 128 / 10.5
    # erratum 5: the paper prints c_max ~ 12.3 for this example
    assert round(capacity(128, 1, 20), 2) == 12.19
    # eq. (20) written out
    assert s == pytest.approx(10.5 + (128 / 129 * 20 + 1 / 129 - 10.5) / 4, rel=1e-15)
    # standard batching (Remark 4.1): k = 1 is E[max of B uniforms]
    assert service_time(128, 1, 20, 1) == pytest.approx(1 + 128 / 129 * 19, rel=1e-15)


@pytest.mark.parametrize("B", [1, 2, 3, 7, 128])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 9])
def test_eq17_to_eq20_exact_rational(B, k):
    """Eqs. (17)-(20) in exact rational arithmetic: equal-mass bins, corrected
    bin maximum, Lemma 4.1 edges -> m + (B-1) D / (2 (B+1) k)."""
    l_min, l_max = Fraction(3, 2), Fraction(41, 3)
    D = l_max - l_min
    edges = [l_min + Fraction(i, k) * D for i in range(k + 1)]
    e17 = sum(Fraction(1, k) * (Fraction(B, B + 1) * edges[i] + Fraction(1, B + 1) * edges[i - 1])
              for i in range(1, k + 1))
    m = (l_max + l_min) / 2
    e19 = (Fraction(1, k) * Fraction(B, B + 1) * Fraction(k + 1, 2) * D
           + Fraction(1, k) * Fraction(1, B + 1) * Fraction(k - 1, 2) * D + l_min)
    e20 = m + Fraction(1, k) * (Fraction(B, B + 1) * l_max + Fraction(1, B + 1) * l_min - m)
    simplified = m + Fraction(B - 1, 2 * (B + 1)) * D / k
    assert e17 == e19 == e20 == simplified
    assert service_time(B, float(l_min), float(l_max), k) == pytest.approx(float(e20), rel=1e-15)


# --------------------------------------------------------------------------
# Lemma 4.1, erratum 1 (eq. 8) and the Hessian (14), against the quadrature
# --------------------------------------------------------------------------

@quadrature
@given(B=Bs, l_min=l_mins, width=widths,
       cuts=st.lists(fracs, min_size=1, max_size=6, unique=True))
def test_erratum_eq8_corrected_form_is_exact(B, l_min, width, cuts):
    """Eq. (10) with the corrected bin maximum equals the quadrature for any
    edges; the printed form (expected minimum) does not, unless B = 1."""
    l_max = l_min + width
    inner = l_min + np.sort(cuts) * width
    edges = np.concatenate([[l_min], inner, [l_max]])
    assume(np.all(np.diff(edges) > 0))
    exact = batch_service_time(stats.uniform(l_min, width), edges, B)
    assert eq10_corrected(edges, B) == pytest.approx(exact, rel=1e-8)
    if B > 1:
        assert eq10_as_printed(edges, B) < exact


@quadrature
@given(B=Bs2, l_min=l_mins, width=widths, k=st.integers(2, 8),
       shifts=st.lists(st.floats(-0.49, 0.49), min_size=7, max_size=7))
def test_uniform_boundaries_beat_perturbations(B, l_min, width, k, shifts):
    l_max = l_min + width
    dist = stats.uniform(l_min, width)
    best = uniform_boundaries(l_min, l_max, k)
    pert = best.copy()
    pert[1:-1] += np.asarray(shifts[:k - 1]) * (width / k)
    assume(np.all(np.diff(pert) > 0))
    f_best = batch_service_time(dist, best, B)
    f_pert = batch_service_time(dist, pert, B)
    assert f_pert >= f_best * (1 - 1e-12)
    # the same through the corrected closed form eq. (10)-(11)
    assert eq10_corrected(pert, B) >= eq10_corrected(best, B) * (1 - 1e-14)


def test_uniform_boundaries_shape_and_ends():
    e = uniform_boundaries(np.array([0.1, 2.0]), np.array([0.3, 5.0]), 3)
    assert e.shape == (2, 4)
    assert e[0, 0] == 0.1 and e[0, -1] == 0.3 and e[1, 0] == 2.0 and e[1, -1] == 5.0
    np.testing.assert_allclose(e[1], [2.0, 3.0, 4.0, 5.0], rtol=1e-15)
    assert uniform_boundaries(1.0, 3.0, 1).tolist() == [1.0, 3.0]


def test_eq14_hessian_is_positive_definite():
    """Erratum 2: Sylvester needs every leading minor of eq. (14), which is
    (j+1) c^j > 0; the Hessian agrees with finite differences of the corrected
    eq. (11), and vanishes for B = 1."""
    l_min, l_max = 1.0, 20.0
    for B in (1, 2, 128):
        for k in (2, 3, 6):
            c = (B - 1) / ((B + 1) * (l_max - l_min))
            n = k - 1
            H = c * (2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1))
            x0 = uniform_boundaries(l_min, l_max, k)[1:-1]

            def f(x):
                return eq10_corrected(np.concatenate([[l_min], x, [l_max]]), B)

            h = 1e-3
            Hfd = np.empty((n, n))
            for i in range(n):
                for j in range(n):
                    ei, ej = np.eye(n)[i] * h, np.eye(n)[j] * h
                    Hfd[i, j] = (f(x0 + ei + ej) - f(x0 + ei - ej) - f(x0 - ei + ej)
                                 + f(x0 - ei - ej)) / (4 * h * h)
            np.testing.assert_allclose(Hfd, H, atol=1e-7)
            minors = [np.linalg.det(H[:j, :j]) for j in range(1, n + 1)]
            expected = [(j + 1) * c ** j for j in range(1, n + 1)]
            np.testing.assert_allclose(minors, expected, rtol=1e-9, atol=0)
            assert np.linalg.det(H) == pytest.approx(k * c ** (k - 1), rel=1e-9, abs=0)
            if B == 1:
                assert np.all(H == 0)


# --------------------------------------------------------------------------
# Section 5: latency
# --------------------------------------------------------------------------

@cheap
@given(B=Bs, l_min=l_mins, width=widths, k=ks, lam=lams, factor=st.floats(1.01, 100.0))
def test_latency_lemma_5_1(B, l_min, width, k, lam, factor):
    l_max = l_min + width
    lat = latency(B, l_min, l_max, k, lam)
    assert lat == pytest.approx(service_time(B, l_min, l_max, k) + (B - 1) * k / (2 * lam),
                                rel=1e-14)
    faster = latency(B, l_min, l_max, k, lam * factor)
    if B > 1:
        assert faster < lat
    else:
        assert faster == lat


def test_eq63_batch_wait():
    """Eq. (63): (1/B) sum_j (B - j) k / lam = (B - 1) k / (2 lam)."""
    for B in (1, 2, 5, 128):
        for k in (1, 3):
            lam = 7.0
            direct = sum((B - j) * k / lam for j in range(1, B + 1)) / B
            assert direct == pytest.approx((B - 1) * k / (2 * lam), rel=1e-14, abs=1e-15)
            assert latency(B, 1.0, 20.0, k, lam) - service_time(B, 1.0, 20.0, k) == \
                pytest.approx(direct, rel=1e-12, abs=1e-12)


def test_latency_is_nan_past_the_saturation_of_finitely_many_servers():
    """Lemma 5.1 holds with infinitely many servers (the default: a finite
    number past any load); with servers = c it is NaN at and past Theorem
    4.2's c B / E[t_service,k] (6.45 requests/s at B = 128, k = 1 on U(1, 20):
    it gave 27.79 s at 8), unchanged below."""
    B, lo, hi = 128, 1.0, 20.0
    cap = B / service_time(B, lo, hi, 1)
    assert 6.44 < cap < 6.46
    assert latency(B, lo, hi, 1, 8.0) == pytest.approx(27.790213, rel=1e-6)
    with pytest.warns(theory.OutsideAssumptions, match="no steady state"):
        assert math.isnan(latency(B, lo, hi, 1, 8.0, servers=1))
    with pytest.warns(theory.OutsideAssumptions):
        assert math.isnan(latency(B, lo, hi, 1, cap, servers=1))
    below = np.nextafter(cap, 0.0)
    assert latency(B, lo, hi, 1, below, servers=1) == latency(B, lo, hi, 1, below)
    assert latency(B, lo, hi, 1, 8.0, servers=2) == latency(B, lo, hi, 1, 8.0)
    with pytest.warns(theory.OutsideAssumptions, match=r"\(1 of 3 values\)"):
        got = latency(B, lo, hi, np.array([1, 2, 4]), 8.0, servers=1)
    assert math.isnan(got[0]) and np.all(np.isfinite(got[1:]))
    with pytest.raises(ValueError, match="servers"):
        latency(B, lo, hi, 1, 8.0, servers=0)
