"""Tests of mbbatch.theory: the closed forms of the multi-bin batching paper
(Sections 4-5, Appendices A-B), the exact quadrature, the numerical optimiser
and the paper's errata (see theory/NOTES.md).

Everything here is deterministic (no sampling), so every comparison is exact
up to a stated floating-point or quadrature tolerance.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

from mbbatch.theory import (
    batch_service_time,
    capacity,
    exponential_boundaries,
    exponential_service_bound,
    exponential_throughput_bound,
    harmonic_number,
    latency,
    min_bins,
    optimal_boundaries,
    service_time,
    throughput,
    uniform_boundaries,
)

# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------

Bs = st.integers(1, 512)
Bs2 = st.integers(2, 512)
ks = st.integers(1, 64)
l_mins = st.floats(0.0, 100.0, allow_nan=False, allow_infinity=False)
widths = st.floats(1e-3, 1000.0, exclude_min=True, allow_nan=False, allow_infinity=False)
lams = st.floats(1e-3, 1e3, exclude_min=True, exclude_max=True)
mus = st.floats(1e-2, 1e2)
fracs = st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)

cheap = settings(deadline=None)
quadrature = settings(deadline=None, max_examples=12)


# --------------------------------------------------------------------------
# independent reference implementations used by the tests
# --------------------------------------------------------------------------

def eq10_corrected(edges, B):
    """Eq. (10) with the corrected bin maximum 1/(B+1) l_{i-1} + B/(B+1) l_i."""
    e = np.asarray(edges, dtype=float)
    D = e[-1] - e[0]
    lo, hi = e[:-1], e[1:]
    return float(np.sum((hi - lo) / D * (lo + B * hi) / (B + 1)))


def eq10_as_printed(edges, B):
    """Eq. (10) as printed: B/(B+1) l_{i-1} + 1/(B+1) l_i (the expected minimum)."""
    e = np.asarray(edges, dtype=float)
    D = e[-1] - e[0]
    lo, hi = e[:-1], e[1:]
    return float(np.sum((hi - lo) / D * (B * lo + hi) / (B + 1)))


def L_sequence(B, K):
    """L_1..L_K of eq. (29) in plain floating point (L_1 = H_B)."""
    L = [math.fsum(1.0 / j for j in range(1, B + 1))]
    for _ in range(K - 1):
        L.append(1.0 + math.log(L[-1]))
    return L  # L[m-1] = L_m


def eq60_corrected_denominator(B, k):
    """Denominator of eq. (60) with log(L_{k-j}) in the inner sums."""
    L = L_sequence(B, max(k, 1))
    Lm = lambda m: L[m - 1]  # noqa: E731
    H = L[0]
    total = 0.0
    for i in range(1, k):
        prod = math.prod(Lm(k - j) for j in range(1, i + 1))
        total += (Lm(k - i) - 1.0) / prod * sum(math.log(Lm(k - j)) for j in range(1, i + 1))
    prod = math.prod(Lm(k - j) for j in range(1, k))
    total += (sum(math.log(Lm(k - j)) for j in range(1, k)) + H) / prod
    return total


def lemma_a1_bound_at(edges, B, mu):
    """Eq. (27)/(31) evaluated at arbitrary edges 0 = l_0 < ... < l_k = inf."""
    e = np.asarray(edges, dtype=float)
    H = math.fsum(1.0 / j for j in range(1, B + 1))
    q = np.exp(-mu * e)  # q_k = 0
    pr = q[:-1] - q[1:]
    k = e.size - 1
    return float(np.sum(pr[:k - 1] * e[1:k]) + pr[k - 1] * (e[k - 1] + H / mu))


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
# Lemma 4.1 and the exact quadrature
# --------------------------------------------------------------------------

@quadrature
@given(B=Bs, l_min=l_mins, width=widths, k=ks)
def test_batch_service_time_reproduces_eq20(B, l_min, width, k):
    l_max = l_min + width
    dist = stats.uniform(l_min, l_max - l_min)
    exact = batch_service_time(dist, uniform_boundaries(l_min, l_max, k), B)
    assert exact == pytest.approx(service_time(B, l_min, l_max, k), rel=1e-8)


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


# --------------------------------------------------------------------------
# Appendix A.4: exponential service times
# --------------------------------------------------------------------------

@quadrature
@given(B=Bs, mu=mus, k=st.integers(1, 24))
def test_exponential_bound_is_an_upper_bound(B, mu, k):
    dist = stats.expon(scale=1 / mu)
    edges = exponential_boundaries(B, mu, k)
    exact = batch_service_time(dist, edges, B)
    bound = exponential_service_bound(B, mu, k)
    assert bound >= exact * (1 - 1e-9)
    if k == 1:
        H = harmonic_number(B)
        assert bound == pytest.approx(H / mu, rel=1e-14)
        assert exact == pytest.approx(H / mu, rel=1e-9)
    if B == 1:  # memoryless: binning cannot help, bound = exact = 1/mu
        assert bound == pytest.approx(1 / mu, rel=1e-14)
        assert exact == pytest.approx(1 / mu, rel=1e-9)


@cheap
@given(B=Bs, mu=mus, k=ks)
def test_corollary_A11_closed_form(B, mu, k):
    """The bound at Lemma A.1's edges = corrected eq. (60) = L_k / mu."""
    bound = exponential_service_bound(B, mu, k)
    assert bound == pytest.approx(B / exponential_throughput_bound(B, mu, k), rel=1e-12)
    assert bound == pytest.approx(eq60_corrected_denominator(B, k) / mu, rel=1e-12)
    assert bound == pytest.approx(L_sequence(B, k)[-1] / mu, rel=1e-12)
    assert bound == pytest.approx(lemma_a1_bound_at(exponential_boundaries(B, mu, k), B, mu),
                                  rel=1e-12)


@cheap
@given(B=Bs2, mu=mus, k=st.integers(2, 12),
       shifts=st.lists(st.floats(-0.3, 0.3), min_size=11, max_size=11))
def test_lemma_A1_edges_minimise_the_bound(B, mu, k, shifts):
    edges = exponential_boundaries(B, mu, k)
    assert edges[0] == 0 and edges[-1] == np.inf and np.all(np.diff(edges) > 0)
    pert = edges.copy()
    gaps = np.diff(edges[:-1])
    pert[1:-1] += np.asarray(shifts[:k - 1]) * np.minimum(gaps, np.append(gaps[1:], gaps[-1]))
    assume(np.all(np.diff(pert) > 0) and pert[1] > 0)
    assert lemma_a1_bound_at(pert, B, mu) >= lemma_a1_bound_at(edges, B, mu) * (1 - 1e-13)


def test_exponential_boundaries_B1_and_L():
    e = exponential_boundaries(1, 2.0, 4)
    assert e.tolist() == [0.0, 0.0, 0.0, 0.0, np.inf]
    # eq. (59) by hand for k = 3
    L = L_sequence(200, 2)
    e3 = exponential_boundaries(200, 0.1, 3)
    np.testing.assert_allclose(e3[1:3], [math.log(L[1]) / 0.1,
                                         (math.log(L[1]) + math.log(L[0])) / 0.1], rtol=1e-14)
    # mu array: edge axis last
    em = exponential_boundaries(200, np.array([0.1, 1.0]), 3)
    assert em.shape == (2, 4)
    np.testing.assert_allclose(em[0, :3], 10 * em[1, :3], rtol=1e-14)


def test_harmonic_number():
    assert harmonic_number(1) == 1.0
    assert harmonic_number(4) == pytest.approx(25 / 12, rel=1e-16)
    exact = sum(Fraction(1, j) for j in range(1, 301))
    assert harmonic_number(300) == pytest.approx(float(exact), rel=1e-16)
    big = harmonic_number(np.array([4096, 4097]))
    assert big[1] - big[0] == pytest.approx(1 / 4097, rel=1e-9)
    assert float(harmonic_number(10**6)) == pytest.approx(
        math.log(10**6) + np.euler_gamma + 1 / (2 * 10**6) - 1 / (12 * 10**12), rel=1e-14)


def test_erratum_eq38_hessian_symmetric():
    """Erratum 3: the Hessian of eq. (34) has (i, i+1) entry -1/q_{i+1}
    (eq. 37), not -1/q_i as printed in eq. (38); its determinant is eq. (48)
    and its leading minors follow eq. (41), all positive."""
    HB = float(harmonic_number(16))
    q = np.array([1.0, 0.6, 0.35, 0.2, 0.09])  # q_0 = 1, then q_1..q_4, k = 5
    n = q.size - 1

    def f(qq):
        full = np.concatenate([[1.0], qq])
        return float(np.sum((full[1:] - full[:-1]) * np.log(full[1:]))
                     + full[-1] * (HB - np.log(full[-1])))

    x0 = q[1:]
    h = 1e-4
    Hfd = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            ei, ej = np.eye(n)[i] * h, np.eye(n)[j] * h
            Hfd[i, j] = (f(x0 + ei + ej) - f(x0 + ei - ej) - f(x0 - ei + ej)
                         + f(x0 - ei - ej)) / (4 * h * h)
    H = np.zeros((n, n))
    for i in range(1, n + 1):
        H[i - 1, i - 1] = (q[i] + q[i - 1]) / q[i] ** 2 if i < n else q[i - 1] / q[i] ** 2
        if i < n:
            H[i - 1, i] = H[i, i - 1] = -1 / q[i + 1]
    np.testing.assert_allclose(Hfd, H, rtol=1e-5, atol=1e-5)
    printed_12 = -1 / q[1]
    assert abs(Hfd[0, 1] - printed_12) > 0.1
    # eq. (41): f_n = 1/(q_1..q_{n-1} q_n^2) + f_{n-1}/q_n, n <= k-2; eq. (48)
    fprev, minors = 1.0, []
    for m in range(1, n):
        fm = 1 / (np.prod(q[1:m]) * q[m] ** 2) + fprev / q[m]
        minors.append(fm)
        fprev = fm
    for m, fm in enumerate(minors, start=1):
        assert np.linalg.det(H[:m, :m]) == pytest.approx(fm, rel=1e-10)
    assert np.linalg.det(H) == pytest.approx(1 / (np.prod(q[1:n]) * q[n] ** 2), rel=1e-10)


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
# broadcasting
# --------------------------------------------------------------------------

def test_broadcasting_matches_scalars():
    B = np.array([1, 2, 128, 512])
    k = np.array([[1], [3], [64]])
    lam = np.array([0.5, 2.0, 10.0, 1e3])
    l_min = np.array([0.0, 1.0, 5.0, 99.0])
    l_max = l_min + np.array([1e-3, 19.0, 1.0, 900.0])
    eps = np.array([1e-6, 0.5, 1.0, 0.01])
    cases = [
        (service_time, (B, l_min, l_max, k)),
        (throughput, (B, l_min, l_max, k)),
        (capacity, (B, l_min, l_max)),
        (min_bins, (B, l_min, l_max, eps)),
        (latency, (B, l_min, l_max, k, lam)),
        (exponential_service_bound, (B, lam, k)),
        (exponential_throughput_bound, (B, lam, k)),
        (harmonic_number, (B,)),
    ]
    for fn, args in cases:
        out = fn(*args)
        shape = np.broadcast_shapes(*(np.shape(a) for a in args))
        assert out.shape == shape, fn.__name__
        bargs = np.broadcast_arrays(*args)
        for idx in np.ndindex(shape):
            scal = [a[idx].item() for a in bargs]
            assert out[idx] == fn(*scal), (fn.__name__, idx)
    assert min_bins(B, l_min, l_max, eps).dtype == np.int64
    # edges: edge axis last
    e = uniform_boundaries(l_min, l_max, 5)
    assert e.shape == (4, 6)
    for i in range(4):
        assert e[i].tolist() == uniform_boundaries(l_min[i], l_max[i], 5).tolist()
    mu = np.array([0.1, 1.0, 3.0])
    e = exponential_boundaries(64, mu, 4)
    for i in range(3):
        assert e[i].tolist() == exponential_boundaries(64, float(mu[i]), 4).tolist()
    # batch_service_time over an array of B
    dist = stats.uniform(1, 19)
    edges = uniform_boundaries(1.0, 20.0, 3)
    bs = np.array([[1, 2], [8, 64]])
    out = batch_service_time(dist, edges, bs)
    assert out.shape == (2, 2)
    for idx in np.ndindex(2, 2):
        assert out[idx] == batch_service_time(dist, edges, int(bs[idx]))
    # scalar in, Python scalar out
    assert type(service_time(2, 1.0, 2.0, 3)) is float
    assert type(min_bins(2, 1.0, 2.0, 0.1)) is int


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------

GOOD = dict(B=4, l_min=1.0, l_max=20.0, k=3, eps=0.5, lam=2.0, mu=0.1)
REAL_FUNCS = {
    service_time: ("B", "l_min", "l_max", "k"),
    throughput: ("B", "l_min", "l_max", "k"),
    capacity: ("B", "l_min", "l_max"),
    min_bins: ("B", "l_min", "l_max", "eps"),
    latency: ("B", "l_min", "l_max", "k", "lam"),
    uniform_boundaries: ("l_min", "l_max", "k"),
    exponential_boundaries: ("B", "mu", "k"),
    exponential_service_bound: ("B", "mu", "k"),
    exponential_throughput_bound: ("B", "mu", "k"),
    harmonic_number: ("B",),
}
CASES = [(fn, p) for fn, ps in REAL_FUNCS.items() for p in ps]


def _call(fn, **override):
    args = [override.get(p, GOOD[p]) for p in REAL_FUNCS[fn]]
    return fn(*args)


@pytest.mark.parametrize("fn,param", CASES, ids=[f"{f.__name__}-{p}" for f, p in CASES])
def test_bad_values_raise_naming_the_parameter(fn, param):
    if param in ("B", "k"):
        for bad in (-1, 0, np.int64(-3)):
            with pytest.raises(ValueError, match=param):
                _call(fn, **{param: bad})
        # counts: NaN and inf are out of the domain; any finite float (4.0,
        # 2.5) or bool is the wrong kind
        for bad in (math.nan, math.inf, -math.inf, np.float64(math.nan)):
            with pytest.raises(ValueError, match=param):
                _call(fn, **{param: bad})
        for bad in (4.0, 2.5, True, np.float64(3.0)):
            with pytest.raises(TypeError, match=param):
                _call(fn, **{param: bad})
    else:
        for bad in (-1.0, math.nan, math.inf, -math.inf, np.array([1.0, math.nan])):
            with pytest.raises(ValueError, match=param):
                _call(fn, **{param: bad})
        with pytest.raises(TypeError, match=param):
            _call(fn, **{param: True})


@pytest.mark.parametrize("fn", [f for f in REAL_FUNCS if "l_max" in REAL_FUNCS[f]],
                         ids=lambda f: f.__name__)
def test_l_max_not_above_l_min(fn):
    for lo, hi in ((5.0, 5.0), (5.0, 4.0), (np.array([1.0, 5.0]), np.array([2.0, 5.0]))):
        with pytest.raises(ValueError, match="l_max must be greater than l_min"):
            _call(fn, l_min=lo, l_max=hi)


def test_count_arrays_validated():
    with pytest.raises(ValueError, match="B"):
        service_time(np.array([2, 0]), 1.0, 2.0, 1)
    with pytest.raises(TypeError, match="k"):
        service_time(2, 1.0, 2.0, np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="k"):
        uniform_boundaries(1.0, 2.0, np.array([2, 3]))
    with pytest.raises(TypeError, match="B"):
        exponential_boundaries(np.array([2, 3]), 1.0, 2)


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
