"""Exponential service times: Appendix A.4 (Lemma A.1, Corollary A.1.1) of
the multi-bin batching paper.

Under Assumption A.1 each request's service time is ``Exp(mu)`` (rate ``mu``
per second).  Lemma A.1 bounds the expected batch service time by replacing
the batch maximum in every bin but the last by the bin's upper edge (eq. 27)
and minimises that bound over the edges (eqs. 28-29, 59)::

    L_1 = H_B,   L_m = 1 + log(L_{m-1}),
    l_i = (1/mu) sum_{j=1}^{i} log(L_{k-j}),   i = 1..k-1.

Substituting those edges into the bound telescopes (derivation in the
docstring of :func:`exponential_throughput_bound`): the minimised bound is
exactly ``L_k / mu``, so Corollary A.1.1 reads
``Throughput_k >= B mu / L_k``.

Internally the sequence is carried as ``d_m = L_m - 1`` with
``d_1 = H_B - 1`` and ``d_m = log1p(d_{m-1})``, so that ``log(L_m) = d_{m+1}``
keeps full relative precision as ``L_m -> 1``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from .._validation import check_count, check_real
from .uniform import _broadcast_check, _scalar_or_array

__all__ = [
    "exponential_boundaries",
    "exponential_service_bound",
    "exponential_throughput_bound",
    "harmonic_number",
]

_H_TABLE_SIZE = 4096


@functools.cache
def _harmonic_minus_one_table(n: int) -> np.ndarray:
    """``H_B - 1`` for ``B = 0..n`` (index 0 unused), summed exactly
    (``math.fsum`` of the prefix, correctly rounded).  Made on first use
    (a fifth of a second: not at import)."""
    out = np.empty(n + 1)
    out[0] = -1.0
    terms = []
    for b in range(1, n + 1):
        if b >= 2:
            terms.append(1.0 / b)
        out[b] = math.fsum(terms)
    out.flags.writeable = False
    return out


def _harmonic_minus_one(B) -> np.ndarray:
    """``H_B - 1`` for an int64 array ``B >= 1`` (exactly 0 for ``B = 1``)."""
    B = np.asarray(B, dtype=np.int64)
    small = B <= _H_TABLE_SIZE
    out = np.empty(B.shape, dtype=float)
    out[small] = _harmonic_minus_one_table(_H_TABLE_SIZE)[B[small]]
    big = ~small
    if np.any(big):
        Bb = B[big].astype(float)
        out[big] = special.digamma(Bb + 1.0) + np.euler_gamma - 1.0
    return out


def harmonic_number(B):
    r"""The ``B``-th harmonic number ``H_B = sum_{j=1}^{B} 1/j``.

    ``H_B / mu`` is the expected maximum of ``B`` i.i.d. ``Exp(mu)`` draws,
    the service time of a batch without binning under Assumption A.1
    (Lemma A.1 of the multi-bin batching paper, eq. 27 with ``k = 1``).

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.

    Returns
    -------
    float or numpy.ndarray
        ``H_B`` (dimensionless).  Correctly rounded sums for
        ``B <= 4096``, ``digamma(B + 1) + euler_gamma`` beyond.

    Raises
    ------
    TypeError
        ``B`` not an integer.
    ValueError
        ``B < 1``.

    Examples
    --------
    >>> harmonic_number(4)
    2.083333333333333
    """
    B = check_count("B", B, array=True)
    return _scalar_or_array(_harmonic_minus_one(B) + 1.0, B)


def _d_table(B, K: int) -> np.ndarray:
    """``d[..., m] = L_m - 1`` for ``m = 1..K`` (``d[..., 0]`` is NaN)."""
    B = np.asarray(B, dtype=np.int64)
    d = np.full(B.shape + (K + 1,), np.nan)
    d[..., 1] = _harmonic_minus_one(B)
    for mm in range(2, K + 1):
        d[..., mm] = np.log1p(d[..., mm - 1])
    return d


def exponential_boundaries(B, mu, k):
    r"""Decision boundaries of Lemma A.1 for ``Exp(mu)`` service times.

    Eqs. (28)-(29), (59) of the multi-bin batching paper::

        L_1 = H_B,   L_m = 1 + log(L_{m-1})   (m > 1),
        l_i = (1/mu) sum_{j=1}^{i} log(L_{k-j}),   i = 1..k-1,

    with ``l_0 = 0`` and ``l_k = inf``.  These edges minimise the *upper
    bound* (eq. 27) of Lemma A.1, not the exact expected service time; see
    :func:`mbbatch.theory.optimal_boundaries` for the latter.

    Parameters
    ----------
    B : int
        Batch size (requests per batch), ``B >= 1``; scalar.
    mu : float or array_like
        Service rate, 1/s, ``mu > 0``.  May be an array; the edge axis is
        appended last.
    k : int
        Number of bins, ``k >= 1``; scalar.

    Returns
    -------
    numpy.ndarray
        Edges in seconds, shape ``np.shape(mu) + (k + 1,)``: first ``0.0``,
        last ``inf``, strictly increasing for ``B >= 2``.  For ``B = 1``
        (``H_1 = 1``, all ``L_m = 1``) every interior edge is ``0``: the
        bound is ``1/mu`` whatever the edges, binning cannot help, and the
        first ``k - 1`` bins are empty.

    Raises
    ------
    TypeError
        ``B`` or ``k`` not a scalar integer.
    ValueError
        A value outside its domain (NaN and inf included).

    Examples
    --------
    >>> exponential_boundaries(200, 0.1, 2).round(4)
    array([ 0.    , 17.7122,     inf])
    """
    B = check_count("B", B)
    k = check_count("k", k)
    mu = check_real("mu", mu)
    d = _d_table(np.int64(B), k)  # shape (k+1,)
    # log(L_{k-j}) = d_{k-j+1}, j = 1..k-1  ->  d_k, d_{k-1}, ..., d_2
    steps = d[k:1:-1] if k >= 2 else np.empty(0)
    S = np.cumsum(steps)  # mu * l_i, i = 1..k-1
    mu_a = np.asarray(mu, dtype=float)[..., None]
    edges = np.empty(np.shape(mu) + (k + 1,))
    edges[..., 0] = 0.0
    edges[..., 1:k] = S / mu_a
    edges[..., k] = np.inf
    return edges


def exponential_service_bound(B, mu, k):
    r"""Lemma A.1's upper bound on ``E[t_service,k]`` at its optimal edges.

    Eq. (27)/(31) of the multi-bin batching paper evaluated at the edges of
    eqs. (28)-(29) (:func:`exponential_boundaries`)::

        bound = sum_{i=1}^{k-1} Pr(bin = i) l_i
                + Pr(bin = k) (l_{k-1} + H_B / mu),
        Pr(bin = i) = exp(-mu l_{i-1}) - exp(-mu l_i).

    It is computed term by term from the edges; it equals ``L_k / mu``
    (:func:`exponential_throughput_bound` gives ``B`` over it), which the
    tests check.  For ``k = 1`` it is ``H_B / mu``, the exact expected
    maximum of ``B`` exponentials.

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    mu : float or array_like
        Service rate, 1/s, ``mu > 0``.
    k : int or array_like of int
        Number of bins, ``k >= 1``.

    Returns
    -------
    float or numpy.ndarray
        Upper bound on the expected batch service time, seconds (Assumption
        A.1, saturated system), broadcast over the arguments.

    Raises
    ------
    TypeError
        ``B`` or ``k`` not an integer.
    ValueError
        A value outside its domain (NaN and inf included).

    Examples
    --------
    >>> round(exponential_service_bound(200, 0.1, 1), 6)   # H_200 / 0.1
    58.780309
    """
    B = check_count("B", B, array=True)
    mu = check_real("mu", mu)
    k = check_count("k", k, array=True)
    shape = _broadcast_check(B=B, mu=mu, k=k)
    Bb = np.broadcast_to(B, shape).ravel()
    kb = np.broadcast_to(k, shape).ravel()
    total = np.zeros(Bb.size)
    # group by k so that each group is a dense (n_k, k) computation
    for kk in np.unique(kb):
        sel = kb == kk
        d = _d_table(Bb[sel], int(kk))               # (n_sel, kk+1)
        hm1 = d[:, 1]
        if kk == 1:
            total[sel] = hm1 + 1.0
            continue
        steps = d[:, int(kk):1:-1]                    # d_k .. d_2 -> log L_{k-j}
        S = np.cumsum(steps, axis=1)                  # mu l_i, i = 1..k-1
        S_prev = np.concatenate([np.zeros((S.shape[0], 1)), S[:, :-1]], axis=1)
        q_prev = np.exp(-S_prev)                      # q_{i-1}
        pr = q_prev * -np.expm1(-steps)               # q_{i-1} - q_i, accurate
        q_last = np.exp(-S[:, -1])                    # q_{k-1} = Pr(bin = k)
        total[sel] = np.sum(pr * S, axis=1) + q_last * (S[:, -1] + hm1 + 1.0)
    out = total.reshape(shape) / np.broadcast_to(np.asarray(mu, dtype=float), shape)
    return _scalar_or_array(out, B, mu, k)


def exponential_throughput_bound(B, mu, k):
    r"""Corollary A.1.1 (corrected): ``Throughput_k >= B mu / L_k``.

    Eq. (60) of the multi-bin batching paper, with the index of its inner
    sums corrected from ``log(L_{k-1-j})`` to ``log(L_{k-j})`` (as eq. 59
    gives the edges), is::

        Throughput_k >= B mu / T,
        T = sum_{i=1}^{k-1} (L_{k-i} - 1) / prod_{j=1}^{i} L_{k-j}
                * sum_{j=1}^{i} log(L_{k-j})
            + 1 / prod_{j=1}^{k-1} L_{k-j}
                * (sum_{j=1}^{k-1} log(L_{k-j}) + H_B).

    ``T`` telescopes to ``L_k``: with ``q_i = 1 / prod_{j<=i} L_{k-j}`` and
    ``S_i = sum_{j<=i} log(L_{k-j})``, summation by parts gives
    ``T = sum_{i=1}^{k-1} q_{i-1} log(L_{k-i}) + q_{k-1} H_B``; using
    ``log(L_{k-i}) = L_{k-i+1} - 1`` and ``q_{i-1} L_{k-i+1} = q_{i-2}`` the
    sum collapses to ``L_k - q_{k-2}``, and ``q_{k-1} H_B = q_{k-2}``.  Hence
    ``T = L_k`` (``k = 1``: ``T = L_1 = H_B``).

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    mu : float or array_like
        Service rate, 1/s, ``mu > 0``.
    k : int or array_like of int
        Number of bins, ``k >= 1``.

    Returns
    -------
    float or numpy.ndarray
        Lower bound on the saturated throughput with the edges of Lemma A.1,
        requests per second: ``B / exponential_service_bound(B, mu, k)``.
        It increases with ``k`` towards ``B mu`` (``L_k -> 1``).

    Raises
    ------
    TypeError
        ``B`` or ``k`` not an integer.
    ValueError
        A value outside its domain (NaN and inf included).

    Examples
    --------
    >>> round(exponential_throughput_bound(200, 0.1, 1), 6)   # 200 * 0.1 / H_200
    3.4025
    """
    B = check_count("B", B, array=True)
    mu = check_real("mu", mu)
    k = check_count("k", k, array=True)
    shape = _broadcast_check(B=B, mu=mu, k=k)
    Bb = np.broadcast_to(B, shape).ravel()
    kb = np.broadcast_to(k, shape).ravel()
    Lk = np.empty(Bb.size)
    for kk in np.unique(kb):
        sel = kb == kk
        Lk[sel] = _d_table(Bb[sel], int(kk))[:, int(kk)] + 1.0
    out = (np.broadcast_to(B, shape).astype(float)
           * np.broadcast_to(np.asarray(mu, dtype=float), shape)
           / Lk.reshape(shape))
    return _scalar_or_array(out, B, mu, k)
