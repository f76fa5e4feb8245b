"""Shared hypothesis strategies and independent reference implementations
for the tests of mbbatch.theory (not a test module).

The reference implementations are written out from the paper's equations,
independently of mbbatch.theory, so that the tests compare two computation
paths.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

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
