"""Exact batch service time for any continuous service-time distribution,
and numerically optimal decision boundaries.

The multi-bin batching paper's eq. (2) writes the expected batch service
time with ``k`` bins as ``sum_i Pr(bin = i) E[max_{j<=B} x_j | bin = i]``.
The paper evaluates it in closed form for uniform service times (eqs.
10, 17-20) and bounds it for exponential ones (Lemma A.1); here it is
evaluated by quadrature for any frozen ``scipy.stats`` continuous
distribution and any edges, and minimised over the edges.

Per bin ``[lo, hi]`` with mass ``p = F(hi) - F(lo)`` and truncated CDF
``F_i``::

    E[max | bin] = lo + int_lo^hi (1 - F_i(x)^B) dx
                 = hi - int_lo^hi F_i(x)^B dx.

``1 - F_i^B`` is evaluated as ``-expm1(B * log1p(-S_i))`` with the truncated
survival ``S_i(x) = (sf(x) - sf(hi)) / p`` (upper half of the distribution)
or ``(cdf(hi) - cdf(x)) / p`` (lower half), which keeps full precision in
both tails.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize, stats

from .._validation import check_count
from .assumptions import outside

__all__ = ["batch_service_time", "empirical_batch_service_time", "optimal_boundaries"]

_EPS = np.finfo(float).eps


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------

def _check_dist(dist):
    """A frozen scipy.stats continuous distribution; returns its support."""
    if isinstance(dist, stats.rv_continuous) or not isinstance(
            getattr(dist, "dist", None), stats.rv_continuous):
        raise TypeError(
            "dist must be a frozen scipy.stats continuous distribution, "
            f"e.g. scipy.stats.expon(scale=10.0); got {dist!r}")
    a, b = (float(v) for v in dist.support())
    if not (a < b) or math.isnan(a) or math.isnan(b):
        raise ValueError(f"dist has an empty or invalid support [{a}, {b}]")
    return a, b


def _name(dist) -> str:
    return f"{dist.dist.name}{tuple(dist.args) if dist.args else ''}"


def _mean(dist) -> float:
    """The service time's mean: inf where it diverges, NaN where it is
    undefined (a Cauchy's)."""
    with np.errstate(all="ignore"):
        return float(dist.mean())


def _support_tol(a, b):
    """Slack for ``edges`` covering a finite support end (rounding of
    ``loc + scale``)."""
    ends = [abs(v) for v in (a, b) if math.isfinite(v)]
    return 16.0 * _EPS * (sum(ends) if ends else 0.0)


def _check_edges(edges, support):
    """1-D, non-decreasing, ``e_0 < e_k``, covering the support; returns the
    edges as float64 with the outer edges moved onto the support ends when
    they lie within rounding of them."""
    a, b = support
    try:
        e = np.array(edges, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"edges must be a 1-D array of real numbers; got {edges!r}") from None
    if e.ndim != 1 or e.size < 2:
        raise ValueError(f"edges must be a 1-D array of at least 2 values; got shape {e.shape}")
    if np.any(np.isnan(e)):
        raise ValueError(f"edges must not contain NaN; got {e.tolist()}")
    with np.errstate(invalid="ignore"):
        decreasing = np.any(np.diff(e) < 0)
    if decreasing or not e[-1] > e[0]:
        raise ValueError(f"edges must be increasing (e_0 < e_1 < ... < e_k; equal "
                         f"neighbours mean an empty bin); got {e.tolist()}")
    tol = _support_tol(a, b)
    if not (e[0] <= a + tol and e[-1] >= b - tol):
        raise ValueError(
            f"edges must cover the support [{a}, {b}] of dist: need "
            f"edges[0] <= {a} and edges[-1] >= {b}; got edges[0]={float(e[0])!r}, "
            f"edges[-1]={float(e[-1])!r}")
    e[0] = min(e[0], a)
    e[-1] = max(e[-1], b)
    return e


def _check_B_array(B):
    return check_count("B", B, array=True)


# --------------------------------------------------------------------------
# per-bin preparation shared by the quad and the vectorised evaluators
# --------------------------------------------------------------------------

def _bins(dist, edges, support):
    """Clip the edges to the support; per bin: lo, hi, mass p, whether the
    upper-tail (sf) form is used, and sf(hi) / cdf(lo) / cdf(hi)."""
    a, b = support
    e = np.clip(edges, a, b)
    sf = np.asarray(dist.sf(e), dtype=float)
    cdf = np.asarray(dist.cdf(e), dtype=float)
    lo, hi = e[:-1], e[1:]
    upper = sf[:-1] <= 0.5
    p = np.where(upper, sf[:-1] - sf[1:], cdf[1:] - cdf[:-1])
    p = np.where(hi > lo, np.maximum(p, 0.0), 0.0)
    return dict(lo=lo, hi=hi, p=p, upper=upper,
                sf_lo=sf[:-1], sf_hi=sf[1:], cdf_lo=cdf[:-1], cdf_hi=cdf[1:])


def _transition(dist, bins, n):
    """Per bin, the point where the truncated survival equals ``1/(n+1)``:
    where ``1 - F_i^n`` falls from ~1 to ~0 (the batch maximum's bulk)."""
    s = bins["p"] / (n + 1.0)
    with np.errstate(all="ignore"):
        x_up = np.asarray(dist.isf(bins["sf_hi"] + s), dtype=float)
        x_dn = np.asarray(dist.ppf(bins["cdf_hi"] - s), dtype=float)
    x = np.where(bins["upper"], x_up, x_dn)
    return np.clip(x, bins["lo"], bins["hi"])


# --------------------------------------------------------------------------
# exact evaluation with scipy.integrate.quad
# --------------------------------------------------------------------------

def _dist_scale(dist):
    """A finite positive length scale of ``dist``: its standard deviation,
    else its interquartile range, else 1."""
    for f in (lambda: dist.std(), lambda: dist.ppf(0.75) - dist.ppf(0.25)):
        with np.errstate(all="ignore"):
            v = float(f())
        if math.isfinite(v) and v > 0:
            return v
    return 1.0


def _bin_max_quad(dist, lo, hi, p, upper, sf_hi, cdf_lo, cdf_hi, n, x_t, dscale):
    """E[max of n draws | bin] by adaptive quadrature (n >= 1, p > 0)."""
    if upper:
        def surv(x):
            return min(max((float(dist.sf(x)) - sf_hi) / p, 0.0), 1.0)
    else:
        def surv(x):
            return min(max((cdf_hi - float(dist.cdf(x))) / p, 0.0), 1.0)

    def one_minus_Fn(x):          # 1 - F_i(x)^n
        s = surv(x)
        return -math.expm1(n * math.log1p(-s)) if s < 1.0 else 1.0

    def Fn(x):                    # F_i(x)^n
        if upper:
            Fi = 1.0 - surv(x)
        else:
            Fi = min(max((float(dist.cdf(x)) - cdf_lo) / p, 0.0), 1.0)
        return Fi ** n

    if math.isfinite(lo) and math.isfinite(hi) and \
            hi - lo <= 1024 * _EPS * max(abs(lo), abs(hi), dscale):
        # a bin a few ulps wide (of its position or of the distribution's
        # scale): quadrature cannot resolve it (x rounds), and any smooth
        # distribution is uniform on it: E[max] = lo + n/(n+1) width
        return lo + (hi - lo) * n / (n + 1.0)
    if math.isfinite(lo):
        c = lo
    elif math.isfinite(hi):
        c = hi
    else:
        c = float(dist.median())
    # length scale of the bin (used by the tail substitution); the absolute
    # tolerance is 1e-12 of the largest of it, the bin's position (the
    # result is c + integrals, and rounding of x near |c| limits what any
    # quadrature can resolve) and the distribution's own scale
    finite = [v for v in (lo, hi, x_t, c) if math.isfinite(v)]
    scale = (max(finite) - min(finite)) if len(finite) > 1 else 0.0
    if not scale > 0:
        scale = dscale
    opts = dict(epsabs=1e-12 * max(scale, abs(c), dscale), epsrel=1e-10, limit=500)

    def tail(f, x0, sign):
        # int over [x0, inf) (sign=+1) or (-inf, x0] (sign=-1) after
        # x = x0 + sign*scale*(e^y - 1): polynomial tails decay
        # exponentially in y, exponential tails doubly exponentially.
        def g(y):
            ey = math.exp(y) if y < 700.0 else math.inf
            x = x0 + sign * scale * (ey - 1.0)
            if not math.isfinite(x):
                return 0.0
            return f(x) * scale * ey
        return integrate.quad(g, 0.0, math.inf, **opts)[0]

    def piece(f, x0, x1):
        if not x1 > x0:
            return 0.0
        inside = x0 < x_t < x1 and math.isfinite(x_t)
        if math.isfinite(x0) and math.isfinite(x1):
            return integrate.quad(f, x0, x1, points=[x_t] if inside else None, **opts)[0]
        if math.isfinite(x0):                       # [x0, inf)
            split = x_t if inside else x0
            head = integrate.quad(f, x0, split, **opts)[0] if split > x0 else 0.0
            return head + tail(f, split, +1.0)
        if math.isfinite(x1):                       # (-inf, x1]
            split = x_t if inside else x1
            head = integrate.quad(f, split, x1, **opts)[0] if x1 > split else 0.0
            return head + tail(f, split, -1.0)
        raise AssertionError("piece with two infinite ends")  # pragma: no cover

    return c + piece(one_minus_Fn, c, hi) - piece(Fn, lo, c)


def _batch_service_time_scalar(dist, edges, support, B):
    bins = _bins(dist, edges, support)
    x_t = _transition(dist, bins, B)
    dscale = _dist_scale(dist)
    total = 0.0
    for i in range(len(bins["p"])):
        p = float(bins["p"][i])
        if not p > 0:
            continue
        m = _bin_max_quad(dist, float(bins["lo"][i]), float(bins["hi"][i]), p,
                          bool(bins["upper"][i]), float(bins["sf_hi"][i]),
                          float(bins["cdf_lo"][i]), float(bins["cdf_hi"][i]),
                          int(B), float(x_t[i]), dscale)
        total += p * m
    return total


def batch_service_time(dist, edges, B):
    r"""Exact expected service time of a batch for any service distribution.

    Eq. (2) of the multi-bin batching paper, evaluated by quadrature::

        E[t_service] = sum_i p_i E[max_{j<=B} x_j | bin = i],
        p_i = F(e_i) - F(e_{i-1}),
        E[max | bin = i] = e_{i-1} + int_{e_{i-1}}^{e_i} (1 - F_i(x)^B) dx,

    with ``F_i`` the distribution truncated to ``[e_{i-1}, e_i]`` (a bin
    holds ``e_{i-1} <= l < e_i``, Algorithm 1).  Each batch is drawn from one
    bin, and in a saturated (or infinite-server) steady state a batch comes
    from bin ``i`` with probability ``p_i``.  For uniform service times and
    the edges of Lemma 4.1 it reproduces eq. (20); for exponential ones it
    is the exact value that Lemma A.1 (eq. 27) bounds from above.

    Integration uses :func:`scipy.integrate.quad` per bin (``epsrel=1e-10``,
    ``epsabs=1e-12`` times the bin's length scale), split at the point where
    the truncated survival is ``1/(B+1)``; infinite outer edges are allowed.
    Bins of zero probability mass contribute 0.

    Parameters
    ----------
    dist : scipy.stats frozen continuous distribution
        Service time of one request, seconds, e.g.
        ``scipy.stats.uniform(l_min, l_max - l_min)`` or
        ``scipy.stats.expon(scale=1/mu)``.
    edges : array_like, shape (k + 1,)
        Decision boundaries ``e_0 <= e_1 <= ... <= e_k``, seconds, with
        ``e_0 < e_k``.  Equal neighbours make an empty bin (this is what
        :func:`mbbatch.theory.exponential_boundaries` returns for ``B = 1``).
        They must cover the support: ``e_0 <= lower end`` and
        ``e_k >= upper end`` (``+-inf`` where the support is unbounded); a
        finite end is accepted within 16 ulp of rounding, as produced by
        ``loc + scale``.
    B : int or array_like of int
        Batch size (requests per batch), ``B >= 1``.

    Returns
    -------
    float or numpy.ndarray
        Expected batch service time, seconds, one per ``B``: ``inf`` where
        ``dist`` has an infinite mean (a batch's longest member has one too),
        NaN with an :class:`~mbbatch.theory.OutsideAssumptions` warning where
        it has none (a Cauchy's).

    Raises
    ------
    TypeError
        ``dist`` not a frozen scipy.stats continuous distribution; ``B`` not
        an integer; ``edges`` not numeric.
    ValueError
        ``edges`` not 1-D, containing NaN, decreasing, or not covering the
        support of ``dist``; ``B < 1``.

    Examples
    --------
    >>> from scipy import stats
    >>> round(batch_service_time(stats.uniform(1, 19), [1, 10.5, 20], 128), 6)
    15.176357
    """
    support = _check_dist(dist)
    e = _check_edges(edges, support)
    B = _check_B_array(B)
    mean = _mean(dist)
    if not mean < math.inf:
        # E[max of B] >= E[one draw]: infinite with the mean; undefined without one
        outside(math.isnan(mean), f"batch_service_time: {_name(dist)} has no mean (eq. 2 needs one)")
        return mean if np.ndim(B) == 0 else np.full(np.shape(B), mean)
    if np.ndim(B) == 0:
        return float(_batch_service_time_scalar(dist, e, support, int(B)))
    out = np.empty(np.shape(B))
    for idx, b in np.ndenumerate(B):
        out[idx] = _batch_service_time_scalar(dist, e, support, int(b))
    return out


def empirical_batch_service_time(values, edges, B):
    r"""Exact expected batch service time when service times are drawn
    uniformly from ``values`` (an empirical distribution, a trace's column).

    Eq. (2) of the multi-bin batching paper for a discrete distribution: bin
    ``i`` holds the values with ``e_i <= v < e_{i+1}`` (the last bin closed
    above), with mass ``p_i``, and the mean of the largest of ``B`` draws
    from it is ``sum_v v (F_i(v)^B - F_i(v^-)^B)``, ``F_i`` the bin's
    conditional CDF over its distinct values::

        E[t_service] = sum_i p_i E[max_{j<=B} x_j | bin = i].

    Parameters
    ----------
    values : array_like of float
        The observed service times (at least one, finite); repeats weigh.
    edges : array_like, shape (k + 1,)
        Non-decreasing decision boundaries covering the values
        (``e_0 <= min``, ``e_k >= max``).
    B : int
        Batch size, ``B >= 1``.

    Examples
    --------
    >>> round(empirical_batch_service_time([1.0, 2.0], [1.0, 2.0], 2), 6)   # max of two fair draws
    1.75
    """
    v = np.sort(np.asarray(values, dtype=float).ravel())
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError("values must hold at least one finite value")
    e = np.asarray(edges, dtype=float)
    if e.ndim != 1 or e.size < 2 or np.any(np.isnan(e)) or np.any(np.diff(e) < 0):
        raise ValueError(f"edges must be a non-decreasing 1-D array of at least 2 values; got {edges!r}")
    if e[0] > v[0] or e[-1] < v[-1]:
        raise ValueError(f"edges must cover the values [{v[0]:g}, {v[-1]:g}]; got [{e[0]:g}, {e[-1]:g}]")
    B = int(check_count("B", B))
    k = e.size - 1
    # bin of each value: e_i <= v < e_{i+1}, the last bin closed above
    b = np.clip(np.searchsorted(e, v, side="right") - 1, 0, k - 1)
    total = 0.0
    for i in range(k):
        x = v[b == i]
        if x.size == 0:
            continue
        u, counts = np.unique(x, return_counts=True)
        cdf = np.cumsum(counts) / x.size
        prev = np.concatenate(([0.0], cdf[:-1]))
        total += (x.size / v.size) * float(np.sum(u * (cdf ** B - prev ** B)))
    return total


# --------------------------------------------------------------------------
# vectorised double-exponential quadrature (used inside the optimiser)
# --------------------------------------------------------------------------

def _de_nodes(h, t_lo, t_hi):
    t = np.arange(math.floor(t_lo / h), math.ceil(t_hi / h) + 1) * h
    return t, np.pi / 2 * np.sinh(t)


def _bin_max_de(dist, bins, orders, h):
    """E[max of n draws | bin] for every bin and every n in ``orders``
    (shape ``(len(orders), k)``), by tanh-sinh quadrature on finite bins and
    exp-sinh on half-infinite ones; all nodes of all bins in one call of
    ``dist.sf`` and ``dist.cdf``.  Assumes every bin has positive mass and
    a finite end (true for k >= 2 bins from probability masses)."""
    lo, hi, p, upper = bins["lo"], bins["hi"], bins["p"], bins["upper"]
    k = lo.size
    n_max = max(orders)
    x_t = _transition(dist, bins, n_max)

    fin = np.isfinite(lo) & np.isfinite(hi)
    right_inf = np.isfinite(lo) & ~np.isfinite(hi)
    left_inf = ~np.isfinite(lo) & np.isfinite(hi)

    t_f, s_f = _de_nodes(h, -3.5, 3.5)
    t_s, s_s = _de_nodes(h, -4.5, 5.0)
    nn = max(t_f.size, t_s.size)
    X = np.zeros((k, nn))
    W = np.zeros((k, nn))

    # finite bins: tanh-sinh
    one_p_u = 2.0 / (1.0 + np.exp(-2.0 * s_f))
    one_m_u = 2.0 / (1.0 + np.exp(2.0 * s_f))
    wf = h * (np.pi / 2) * np.cosh(t_f) / np.cosh(s_f) ** 2
    L = (hi - lo)[fin, None]
    X[fin, :t_f.size] = np.where(t_f <= 0, lo[fin, None] + L * one_p_u / 2,
                                 hi[fin, None] - L * one_m_u / 2)
    W[fin, :t_f.size] = L / 2 * wf

    # half-infinite bins: exp-sinh around the finite end
    with np.errstate(all="ignore"):
        sig = np.where(right_inf, x_t - lo, hi - x_t)
    bad_sig = ~(np.isfinite(sig) & (sig > 0))
    if np.any(bad_sig & (right_inf | left_inf)):
        sig = np.where(bad_sig, _dist_scale(dist), sig)
    es = np.exp(s_s)
    ws = h * (np.pi / 2) * np.cosh(t_s) * es
    with np.errstate(all="ignore"):
        X[right_inf, :t_s.size] = lo[right_inf, None] + sig[right_inf, None] * es
        X[left_inf, :t_s.size] = hi[left_inf, None] - sig[left_inf, None] * es
    W[right_inf | left_inf, :t_s.size] = sig[right_inf | left_inf, None] * ws

    with np.errstate(all="ignore"):
        sfx = np.asarray(dist.sf(X), dtype=float)
        cdfx = np.asarray(dist.cdf(X), dtype=float)
        pc = p[:, None]
        S = np.where(upper[:, None], (sfx - bins["sf_hi"][:, None]) / pc,
                     (bins["cdf_hi"][:, None] - cdfx) / pc)
        S = np.clip(S, 0.0, 1.0)
        Fi = np.where(upper[:, None], 1.0 - S, (cdfx - bins["cdf_lo"][:, None]) / pc)
        Fi = np.clip(Fi, 0.0, 1.0)
        out = np.empty((len(orders), k))
        for r, n in enumerate(orders):
            if n == 0:
                out[r] = np.where(np.isfinite(lo), lo, -np.inf)
                continue
            g_up = -np.expm1(n * np.log1p(-S))          # 1 - F_i^n
            g_dn = np.exp(n * np.log(Fi))                # F_i^n
            g_up = np.where(S >= 1.0, 1.0, g_up)
            val_right = lo + np.sum(W * g_up, axis=1)    # finite lo
            val_left = hi - np.sum(W * g_dn, axis=1)     # -inf lo
            out[r] = np.where(np.isfinite(lo), val_right, val_left)
    return out


# --------------------------------------------------------------------------
# optimal boundaries
# --------------------------------------------------------------------------

def _edges_from_masses(dist, support, masses):
    """Edges with the given bin masses: quantiles of the cumulative masses,
    taken from the nearer tail for precision; outer edges = support ends."""
    c = np.cumsum(masses)[:-1]
    tail = np.cumsum(masses[::-1])[::-1][1:]
    with np.errstate(all="ignore"):
        e_lo = np.asarray(dist.ppf(c), dtype=float)
        e_hi = np.asarray(dist.isf(tail), dtype=float)
    inner = np.where(c <= 0.5, e_lo, e_hi)
    return np.concatenate([[support[0]], inner, [support[1]]])


def _softmax(theta):
    z = np.concatenate([[0.0], theta])
    z = z - z.max()
    w = np.exp(z)
    return w / w.sum()


def optimal_boundaries(dist, B, k, *, start=None):
    r"""Decision boundaries minimising the exact expected batch service time.

    Minimises :func:`batch_service_time` (eq. 2 of the multi-bin batching
    paper) over the ``k - 1`` interior edges, i.e. maximises the saturated
    throughput ``B / E[t_service]`` (eq. 1) for a fixed number of bins.  For
    uniform service times the answer is Lemma 4.1 (eq. 3/16, equal widths);
    for exponential ones it improves on the edges of Lemma A.1 (eq. 59),
    which minimise only an upper bound.

    Notes
    -----
    The edges are parametrised by the bin probability masses
    ``p = softmax(0, theta_1, ..., theta_{k-1})``, edges = quantiles of the
    cumulative masses, outer edges = the support ends.  Per bin the expected
    maxima of ``B`` and ``B - 1`` draws, ``M_i^(B)`` and ``M_i^(B-1)``, are
    computed by double-exponential quadrature (smooth in the edges, so the
    objective is smooth to rounding), which gives the exact gradient with
    respect to the cumulative mass ``c_j`` at edge ``e_j``::

        dE/dc_j = B e_j - (B-1) M_j^(B) + (B-1) M_{j+1}^(B) - B M_{j+1}^(B-1).

    L-BFGS-B on ``theta`` is followed by a few Newton steps (Hessian by
    central differences of the gradient).  Starting point: equal masses, or
    ``start``.

    A local method: the objective is convex in the edges for the uniform
    (Appendix A.1) but need not be for other distributions.  Runtime is well
    under a second for ``k <= 5``, ``B <= 256``.

    Parameters
    ----------
    dist : scipy.stats frozen continuous distribution
        Service time of one request, seconds.
    B : int
        Batch size (requests per batch), ``B >= 1``; scalar.
    k : int
        Number of bins, ``k >= 1``; scalar.
    start : array_like, shape (k,), optional
        Initial bin masses (positive; normalised to sum 1).  Default: equal
        masses ``1/k``.

    Returns
    -------
    numpy.ndarray, shape (k + 1,)
        Edges in seconds, increasing, first and last equal to the support
        ends of ``dist``.  For ``k = 1`` the support ends; for ``B = 1`` the
        objective does not depend on the edges (it is the mean service time)
        and the starting edges are returned.  NaN, with an
        :class:`~mbbatch.theory.OutsideAssumptions` warning, for ``k > 1``
        where ``dist`` has no finite mean (nothing to minimise).

    Raises
    ------
    TypeError
        ``dist`` not a frozen scipy.stats continuous distribution; ``B`` or
        ``k`` not a scalar integer.
    ValueError
        ``B < 1``, ``k < 1``, or ``start`` of the wrong length or not
        positive and finite.

    Examples
    --------
    >>> from scipy import stats
    >>> optimal_boundaries(stats.uniform(0, 3), 64, 3).round(8)
    array([0., 1., 2., 3.])
    """
    support = _check_dist(dist)
    B = check_count("B", B)
    k = check_count("k", k)
    if start is None:
        p0 = np.full(k, 1.0 / k)
    else:
        p0 = np.asarray(start, dtype=float)
        if p0.shape != (k,) or not np.all(np.isfinite(p0)) or np.any(p0 <= 0):
            raise ValueError(f"start must be {k} positive finite bin masses; got {start!r}")
        p0 = p0 / p0.sum()
    if k == 1:
        return np.array(support, dtype=float)
    mean = _mean(dist)
    if not mean < math.inf:
        outside(True, f"optimal_boundaries: {_name(dist)} has " + ("no mean" if math.isnan(mean) else
                      "an infinite mean, so every boundary gives an infinite batch service time") +
                ": no boundary minimises it")
        return np.full(k + 1, math.nan)
    if B == 1:
        return _edges_from_masses(dist, support, p0)

    h = 1.0 / 32 if B <= 1024 else 1.0 / 64
    orders = (B, B - 1)

    def evaluate(theta):
        p = _softmax(theta)
        e = _edges_from_masses(dist, support, p)
        bins = _bins(dist, e, support)
        if not (np.all(np.diff(e) > 0) and np.all(bins["p"] > 0)):
            return None
        M = _bin_max_de(dist, bins, orders, h)
        T = float(np.sum(bins["p"] * M[0]))
        g = B * e[1:-1] - (B - 1) * M[0, :-1] + (B - 1) * M[0, 1:] - B * M[1, 1:]
        cum = np.cumsum(p)[:-1]
        # dT/dz_m = p_m (sum_{j >= m} g_j - sum_j g_j c_j), z = (0, theta)
        rev = np.concatenate([np.cumsum(g[::-1])[::-1], [0.0]])
        dz = p * (rev - np.dot(g, cum))
        return T, dz[1:], e

    theta0 = np.log(p0[1:]) - np.log(p0[0])
    first = evaluate(theta0)
    if first is None:
        raise ValueError(f"start gives empty bins for this distribution: {start!r}")
    scale = abs(first[0]) if first[0] != 0 else 1.0
    big = 1e300

    def fun(theta):
        r = evaluate(theta)
        if r is None:
            return big, np.zeros_like(theta)
        return r[0] / scale, r[1] / scale

    res = optimize.minimize(fun, theta0, jac=True, method="L-BFGS-B",
                            options=dict(maxiter=1000, maxcor=30, ftol=1e-15, gtol=1e-12))
    theta = res.x if res.fun <= first[0] / scale else theta0
    best = evaluate(theta)

    # Newton polish on the gradient
    for _ in range(8):
        g = best[1] / scale
        gn = np.linalg.norm(g)
        if gn < 1e-15:
            break
        d = 1e-5
        H = np.empty((theta.size, theta.size))
        ok = True
        for j in range(theta.size):
            tp, tm = theta.copy(), theta.copy()
            tp[j] += d
            tm[j] -= d
            rp, rm = evaluate(tp), evaluate(tm)
            if rp is None or rm is None:
                ok = False
                break
            H[:, j] = (rp[1] - rm[1]) / (2 * d * scale)
        if not ok:
            break
        H = (H + H.T) / 2
        try:
            step = -np.linalg.solve(H, g)
        except np.linalg.LinAlgError:
            break
        improved = False
        for frac in (1.0, 0.5, 0.25, 0.125):
            cand = evaluate(theta + frac * step)
            if cand is not None and np.linalg.norm(cand[1] / scale) < gn \
                    and cand[0] <= best[0] * (1 + 1e-14):
                theta, best, improved = theta + frac * step, cand, True
                break
        if not improved or np.max(np.abs(step)) < 1e-13:
            break
    return best[2]
