"""Tests of mbbatch.theory.exponential: the bound of Lemma A.1 and Corollary
A.1.1 for exponential service times (Appendix A.4 of the multi-bin batching
paper: exponential_boundaries, exponential_service_bound,
exponential_throughput_bound, harmonic_number) and the paper's errata 2
(Appendix A.4), 3 and 4 (see theory/NOTES.md).

test_exponential_bound_is_an_upper_bound uses the exact quadrature
(mbbatch.theory.batch_service_time) as the oracle for the bound, so it lives
here.

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

from mbbatch.theory import (
    batch_service_time,
    exponential_boundaries,
    exponential_service_bound,
    exponential_throughput_bound,
    harmonic_number,
)

from .theory_helpers import (
    Bs,
    Bs2,
    L_sequence,
    cheap,
    eq60_corrected_denominator,
    ks,
    lemma_a1_bound_at,
    mus,
    quadrature,
)


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
