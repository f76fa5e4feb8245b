"""Closed forms for uniform service times (Sections 4 and 5 of the
multi-bin batching paper).

Under Assumption 3.2 every request's service time is ``U(l_min, l_max)``
(seconds).  With ``k`` equal-mass bins (Lemma 4.1) the expected service time
of a batch of ``B`` requests is (Theorem 4.2, eq. 20)::

    E[t_service,k] = m + a / k,   m = (l_max + l_min) / 2,
                                  a = (B - 1) / (2 (B + 1)) * (l_max - l_min),

where ``a`` is the printed bracket ``B/(B+1) l_max + 1/(B+1) l_min - m``
simplified.  Everything else here follows from it: the saturated throughput
``B / E[t_service,k]`` (eqs. 4, 21), the capacity ``B / m`` (eq. 5), the
smallest ``k`` reaching ``c_max - eps`` (eqs. 6, 26) and the infinite-server
latency (eq. 7).

All functions validate every argument before computing, broadcast over numpy
arrays, and return Python scalars (``float``, or ``int`` for
:func:`min_bins`) when every argument is a scalar.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import check_count, check_real, check_scalar_real
from ..params import Domain
from .assumptions import outside

__all__ = [
    "service_time",
    "throughput",
    "capacity",
    "min_bins",
    "latency",
    "uniform_boundaries",
]

#: Upper end of the search range of :func:`min_bins`.  At ``k = 2**62`` the
#: term ``a / k`` is below half an ulp of ``m`` (``a <= m`` always), so the
#: floating-point throughput equals the floating-point capacity and every
#: target ``c_max - eps`` (``eps > 0``) is met.
_K_SEARCH_MAX = np.int64(2**62)


# --------------------------------------------------------------------------
# helpers shared by the theory modules
# --------------------------------------------------------------------------

def _broadcast_check(**arrays) -> tuple:
    """Broadcast shape of the validated arguments; ``ValueError`` naming them
    when they do not broadcast."""
    try:
        return np.broadcast_shapes(*(np.shape(v) for v in arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{n}{np.shape(v)}" for n, v in arrays.items())
        raise ValueError(f"arguments do not broadcast together: {shapes}") from None


def _check_interval(l_min, l_max):
    """Validate ``l_min`` and ``l_max`` and that ``l_max > l_min`` elementwise."""
    l_min = check_real("l_min", l_min)
    l_max = check_real("l_max", l_max)
    _broadcast_check(l_min=l_min, l_max=l_max)
    bad = ~(np.asarray(l_max) > np.asarray(l_min))
    if np.any(bad):
        lmax_b, lmin_b = np.broadcast_arrays(np.asarray(l_max, dtype=float),
                                             np.asarray(l_min, dtype=float))
        i = np.flatnonzero(np.broadcast_to(bad, lmax_b.shape))[0]
        raise ValueError(
            "l_max must be greater than l_min; got "
            f"l_max={float(lmax_b.ravel()[i])!r}, l_min={float(lmin_b.ravel()[i])!r}")
    return l_min, l_max


def _scalar_or_array(x, *inputs):
    """``float`` when every input is a scalar, else a float64 array."""
    if all(np.ndim(v) == 0 for v in inputs):
        return float(np.asarray(x))
    return np.asarray(x, dtype=float)


def _m_a(B, l_min, l_max):
    """``m = (l_max + l_min)/2`` and ``a = (B-1)/(2(B+1)) * (l_max - l_min)``.

    The single place these are computed, so that :func:`service_time`,
    :func:`throughput` and :func:`min_bins` agree to the last bit.
    """
    Bf = np.asarray(B, dtype=float)
    l_min = np.asarray(l_min, dtype=float)
    l_max = np.asarray(l_max, dtype=float)
    m = (l_max + l_min) / 2.0
    a = (Bf - 1.0) / (2.0 * (Bf + 1.0)) * (l_max - l_min)
    return Bf, m, a


def _service(m, a, k):
    # m + a / k: monotone non-increasing in k in floating point as well
    # (correctly rounded division and addition are monotone), which
    # min_bins relies on.
    return m + a / np.asarray(k, dtype=float)


# --------------------------------------------------------------------------
# public closed forms
# --------------------------------------------------------------------------

def service_time(B, l_min, l_max, k):
    r"""Expected service time of a batch with ``k`` equal-mass bins.

    Theorem 4.2, eq. (20) of the multi-bin batching paper (Assumption 3.2,
    decision boundaries of Lemma 4.1)::

        E[t_service,k] = m + (1/k) * (B/(B+1) l_max + 1/(B+1) l_min - m)
                       = m + (B - 1) (l_max - l_min) / (2 (B + 1) k),

    with ``m = (l_max + l_min) / 2``.

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    l_min : float or array_like
        Smallest service time of a request, seconds, ``l_min >= 0``.
    l_max : float or array_like
        Largest service time of a request, seconds, ``l_max > l_min``.
    k : int or array_like of int
        Number of bins, ``k >= 1``.

    Returns
    -------
    float or numpy.ndarray
        Expected service time of one batch, seconds, broadcast over the
        arguments.

    Raises
    ------
    TypeError
        ``B`` or ``k`` not an integer (floats such as ``4.0`` and bools
        included).
    ValueError
        A value outside its domain (NaN and inf included), or
        ``l_max <= l_min``.

    Notes
    -----
    For ``B = 1`` the result is ``m`` for every ``k``: a batch of one request
    takes the request's own time, and binning does not matter.

    Examples
    --------
    >>> round(service_time(128, 1.0, 20.0, 4), 6)
    12.838178
    """
    B = check_count("B", B, array=True)
    k = check_count("k", k, array=True)
    l_min, l_max = _check_interval(l_min, l_max)
    _broadcast_check(B=B, l_min=l_min, l_max=l_max, k=k)
    _, m, a = _m_a(B, l_min, l_max)
    return _scalar_or_array(_service(m, a, k), B, l_min, l_max, k)


def throughput(B, l_min, l_max, k):
    r"""Saturated throughput of multi-bin batching with ``k`` equal-mass bins.

    Proposition 4.1 with Theorem 4.2, eqs. (4) and (21) of the multi-bin
    batching paper: ``Throughput_k = B / E[t_service,k]`` with
    ``E[t_service,k]`` from :func:`service_time` (eq. 20).  This is the
    long-run rate of a server that always has a full batch waiting
    (saturated system); below saturation the throughput is the arrival rate.

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    l_min : float or array_like
        Smallest service time, seconds, ``l_min >= 0``.
    l_max : float or array_like
        Largest service time, seconds, ``l_max > l_min``.
    k : int or array_like of int
        Number of bins, ``k >= 1``.

    Returns
    -------
    float or numpy.ndarray
        Throughput, requests per second.  Strictly increasing in ``k`` when
        ``B > 1``, independent of ``k`` when ``B = 1``, always below (for
        ``B = 1``: equal to) :func:`capacity`.

    Raises
    ------
    TypeError, ValueError
        As :func:`service_time`.

    Examples
    --------
    >>> round(throughput(128, 1.0, 20.0, 4), 3)
    9.97
    """
    B = check_count("B", B, array=True)
    k = check_count("k", k, array=True)
    l_min, l_max = _check_interval(l_min, l_max)
    _broadcast_check(B=B, l_min=l_min, l_max=l_max, k=k)
    Bf, m, a = _m_a(B, l_min, l_max)
    return _scalar_or_array(Bf / _service(m, a, k), B, l_min, l_max, k)


def capacity(B, l_min, l_max):
    r"""Maximum capacity ``c_max``: the throughput as ``k -> inf``.

    Remark 4.2, eq. (5) of the multi-bin batching paper:
    ``c_max = B / ((l_max + l_min) / 2)``, i.e. ``B`` times the service rate
    of a single request.

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    l_min : float or array_like
        Smallest service time, seconds, ``l_min >= 0``.
    l_max : float or array_like
        Largest service time, seconds, ``l_max > l_min``.

    Returns
    -------
    float or numpy.ndarray
        Capacity, requests per second.

    Raises
    ------
    TypeError, ValueError
        As :func:`service_time`.

    Examples
    --------
    >>> round(capacity(128, 1.0, 20.0), 4)   # the paper prints "~ 12.3"
    12.1905
    """
    B = check_count("B", B, array=True)
    l_min, l_max = _check_interval(l_min, l_max)
    _broadcast_check(B=B, l_min=l_min, l_max=l_max)
    Bf, m, _ = _m_a(B, l_min, l_max)
    return _scalar_or_array(Bf / m, B, l_min, l_max)


def min_bins(B, l_min, l_max, eps):
    r"""Smallest number of bins whose throughput reaches ``c_max - eps``.

    Theorem 4.3, eqs. (6) and (26) of the multi-bin batching paper::

        k* = max(1, ceil((c_max - eps) a / (eps m))),
        a  = (B - 1)(l_max - l_min) / (2 (B + 1)),   m = (l_max + l_min) / 2.

    The ``max(1, .)`` covers ``eps >= c_max`` (and ``B = 1``), where the
    printed bound is ``<= 0`` and one bin already suffices.  The closed form
    is then corrected so that the result is exactly consistent with
    :func:`throughput` in floating point: ``throughput(k*) >= c_max - eps``
    and, when ``k* > 1``, ``throughput(k* - 1) < c_max - eps`` (both sides
    evaluated as :func:`throughput` and :func:`capacity` evaluate them).  A
    one-step correction suffices for moderate ``k*``; for extreme ``eps``
    (``k*`` beyond about ``1e7``, where rounding of ``c_max - eps`` moves the
    threshold by more than one bin) a vectorised bisection over
    ``[1, 2**62]`` is used, which is exact because the floating-point
    throughput is monotone in ``k``.

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    l_min : float or array_like
        Smallest service time, seconds, ``l_min >= 0``.
    l_max : float or array_like
        Largest service time, seconds, ``l_max > l_min``.
    eps : float or array_like
        Allowed throughput gap to capacity, requests per second, ``eps > 0``.

    Returns
    -------
    int or numpy.ndarray of int64
        ``k*``, bins; a Python ``int`` when every argument is a scalar.

    Raises
    ------
    TypeError, ValueError
        As :func:`service_time` (``eps`` must be in ``(0, inf)``).

    Examples
    --------
    >>> min_bins(128, 1.0, 20.0, 1.0)
    10
    """
    B = check_count("B", B, array=True)
    l_min, l_max = _check_interval(l_min, l_max)
    eps = check_real("eps", eps)
    shape = _broadcast_check(B=B, l_min=l_min, l_max=l_max, eps=eps)

    Bf, m, a = _m_a(B, l_min, l_max)
    c = Bf / m
    # work on flat 1-D copies; reshape at the end
    target = np.broadcast_to(c - np.asarray(eps, dtype=float), shape).ravel()
    Bf, m, a = (np.broadcast_to(v, shape).ravel() for v in (Bf, m, a))
    eps_b = np.broadcast_to(np.asarray(eps, dtype=float), shape).ravel()

    def reaches(kk, sel=slice(None)):
        return Bf[sel] / _service(m[sel], a[sel], kk) >= target[sel]

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        raw = np.ceil(target * a / (eps_b * m))
    raw = np.where(np.isfinite(raw), raw, float(_K_SEARCH_MAX))
    k0 = np.clip(raw, 1.0, float(_K_SEARCH_MAX)).astype(np.int64)
    k0 = np.minimum(k0, _K_SEARCH_MAX)

    # one-step correction
    up = ~reaches(k0)
    down = (k0 > 1) & reaches(np.maximum(k0 - 1, 1))
    k = np.where(up, k0 + 1, np.where(down, k0 - 1, k0))

    # anything still inconsistent (extreme eps): exact bisection on the
    # monotone floating-point predicate, lo never reaches, hi always does
    bad = np.flatnonzero(~(reaches(k) & ((k == 1) | ~reaches(np.maximum(k - 1, 1)))))
    if bad.size:
        lo = np.zeros(bad.size, dtype=np.int64)
        hi = np.full(bad.size, _K_SEARCH_MAX, dtype=np.int64)
        while np.any(hi - lo > 1):
            mid = lo + (hi - lo) // 2
            ok = reaches(np.maximum(mid, 1), bad)
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid)
        k[bad] = hi
    k = k.reshape(shape)

    if all(np.ndim(v) == 0 for v in (B, l_min, l_max, eps)):
        return int(k)
    return np.asarray(k, dtype=np.int64)


def latency(B, l_min, l_max, k, lam, *, servers=math.inf):
    r"""Expected request latency with ``k`` equal-mass bins, infinite servers.

    Lemma 5.1, eq. (7) of the multi-bin batching paper (Assumptions 3.2 and
    5.1, Poisson arrivals at rate ``lam``, proof in Appendix B.1, eqs. 61-63)::

        E[t_latency] = E[t_service,k] + (B - 1) k / (2 lam).

    The second term is the mean time a request waits for its batch to fill:
    each bin receives a Poisson stream of rate ``lam / k``.

    Parameters
    ----------
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.
    l_min : float or array_like
        Smallest service time, seconds, ``l_min >= 0``.
    l_max : float or array_like
        Largest service time, seconds, ``l_max > l_min``.
    k : int or array_like of int
        Number of bins, ``k >= 1``.
    lam : float or array_like
        Poisson arrival rate, requests per second, ``lam > 0``.
    servers : float, optional
        The servers the latency is wanted for (default: infinitely many, the
        lemma's own setting).  With finitely many, NaN where ``lam`` is at or
        above their saturated throughput ``servers B / E[t_service,k]``
        (Theorem 4.2): no steady state, so no expected latency, where the
        formula would still give a finite number.

    Returns
    -------
    float or numpy.ndarray
        Expected latency, seconds.  Exact under infinite servers in steady
        state; a lower bound for a finite number of servers (Remark 5.1);
        NaN past saturation of finitely many ``servers``, with an
        :class:`~mbbatch.theory.OutsideAssumptions` warning.

    Raises
    ------
    TypeError, ValueError
        As :func:`service_time` (``lam`` must be in ``(0, inf)``).

    Examples
    --------
    >>> round(latency(128, 1.0, 20.0, 2, 10.0), 6)
    27.876357
    >>> latency(128, 1.0, 20.0, 1, 8.0, servers=1)   # one server carries 6.45 requests/s at k = 1
    nan
    """
    servers = check_scalar_real("servers", servers, Domain(0.0, math.inf, hi_closed=True))
    B = check_count("B", B, array=True)
    k = check_count("k", k, array=True)
    l_min, l_max = _check_interval(l_min, l_max)
    lam = check_real("lam", lam)
    _broadcast_check(B=B, l_min=l_min, l_max=l_max, k=k, lam=lam)
    Bf, m, a = _m_a(B, l_min, l_max)
    kf = np.asarray(k, dtype=float)
    es = _service(m, a, k)
    lam_f = np.asarray(lam, dtype=float)
    out = es + (Bf - 1.0) * kf / (2.0 * lam_f)
    if servers != math.inf:
        saturated = ~(lam_f < servers * Bf / es)
        outside(saturated, f"latency: lam at or above the saturated throughput servers B / E[t_service,k] of "
                           f"servers = {servers:g} (Theorem 4.2): no steady state, so no expected latency")
        out = np.where(saturated, np.nan, out)
    return _scalar_or_array(out, B, l_min, l_max, k, lam)


def uniform_boundaries(l_min, l_max, k):
    r"""Optimal decision boundaries for uniform service times.

    Lemma 4.1, eqs. (3) and (16) of the multi-bin batching paper: the
    ``k + 1`` edges ``l_i = l_min + i (l_max - l_min) / k``, ``i = 0..k``;
    every bin has probability mass ``1/k``.  They minimise the expected
    batch service time for ``B > 1`` (for ``B = 1`` every choice is optimal).

    Parameters
    ----------
    l_min : float or array_like
        Smallest service time, seconds, ``l_min >= 0``.
    l_max : float or array_like
        Largest service time, seconds, ``l_max > l_min``.
    k : int
        Number of bins, ``k >= 1``.  Must be a scalar (an array raises
        ``TypeError``) because it sets the length of the edge axis.

    Returns
    -------
    numpy.ndarray
        Edges in seconds, shape ``broadcast(l_min, l_max).shape + (k + 1,)``
        (the edge axis last); the first edge is exactly ``l_min`` and the last
        exactly ``l_max``.

    Raises
    ------
    TypeError
        ``k`` not a scalar integer.
    ValueError
        A value outside its domain, or ``l_max <= l_min``.

    Examples
    --------
    >>> uniform_boundaries(1.0, 3.0, 4)
    array([1. , 1.5, 2. , 2.5, 3. ])
    """
    k = check_count("k", k)
    l_min, l_max = _check_interval(l_min, l_max)
    lo = np.asarray(l_min, dtype=float)[..., None]
    hi = np.asarray(l_max, dtype=float)[..., None]
    frac = np.arange(k + 1, dtype=float) / k
    edges = lo + (hi - lo) * frac
    edges[..., 0] = lo[..., 0]
    edges[..., -1] = hi[..., 0]
    return edges
