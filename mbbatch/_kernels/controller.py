"""Dynamic-batching controller kernels: Algorithms 1, 2, 4, 6 and 7 of
Pang, Li and Wang, 2025, arXiv:2503.05248, and two variants: a CLT memory
buffer and a multiplicative SLA step.

The event kernel calls the scalar forms (``b_mem_core``, ``b_sla_core``,
``feedback_core``, ``partition_tiled``, ...).  The array forms (``b_mem``,
``b_sla``, ``feedback``) apply them to the state rows below, one controller
per bin as the rows of a 2-D array; the tests check the algorithms line by
line through them.  Algorithm 6 (:func:`equal_mass_edges`) runs in numpy,
between two calls of the event kernel.

Layouts (:class:`~mbbatch._kernels.layout.Layout`)
-------------------------------------------------
:data:`SLA`         the controller's configuration: ``D_SLA`` and ``eps_D``
                    (s/token), ``B_min``, ``B_max``, the steps ``alpha`` and
                    ``delta``, the EMA weight, and the variant (an int).
:data:`MEMORY`      the memory configuration: the token capacity ``eta``,
                    ``B_min``, ``B_max``, the normal quantile ``z``, the
                    default tokens per request, and the variant (an int).
:data:`CONTROLLER`  one SLA controller's state, a float64 row: the adaptive
                    interval ``[b_low, b_high]``, the EMAs ``tau_avg``
                    (s/token) and ``b_avg`` (requests), the last ``N_decode``
                    and the number of feedback updates.
:data:`BATCH_STATS` batch statistics, a float64 row: EMAs of prompt and
                    output length (tokens), and the running count, mean and
                    M2 of the tokens per request (prompt + output).

State rows hold whole numbers (batch sizes, counts) in float64, so that one
array carries a controller; the functions returning a batch size return an
int64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .common import CACHE
from .layout import Layout

SLA = Layout("SLA controller", ints=("variant",),    # CTL_VARIANT_SPEC or CTL_VARIANT_MULTIPLICATIVE
             floats=("d_sla", "eps_d", "b_min", "b_max", "alpha", "delta", "ema"))
MEMORY = Layout("memory", ints=("variant",),         # MEM_VARIANT_L0 or MEM_VARIANT_CLT
                floats=("eta", "b_min", "b_max",
                        "z",                          # z_{1 - eps_M}, the CLT variant's normal quantile
                        "default_tokens"))            # tokens per request assumed before any statistics
CONTROLLER = Layout("controller state", floats=(
    "b_low", "b_high",
    "tau_avg",    # EMA of the per-token decode time between tokens, s
    "b_avg",      # EMA of the batch size, requests
    "n_decode",   # decode requests in the system at the last feedback
    "updates"))   # feedback updates so far (Algorithm 2's update_count)
BATCH_STATS = Layout("batch statistics", floats=(
    "avg_prompt",    # EMA of the batch-mean prompt length, tokens
    "avg_output",    # EMA of the batch-mean output length, tokens
    "count",         # requests seen
    "mean_tokens",   # running mean of prompt + output, tokens
    "m2_tokens"))    # running sum of squared deviations, tokens^2

A = SLA.index
M = MEMORY.index
C = CONTROLLER.index
T = BATCH_STATS.index

# variants
CTL_VARIANT_SPEC = 0            # Algorithm 2 of Pang et al., 2025, arXiv:2503.05248
CTL_VARIANT_MULTIPLICATIVE = 1  # a multiplicative compute_b_SLA
MEM_VARIANT_L0 = 0              # Algorithm 1: safety buffer L0 = 0.1 eta
MEM_VARIANT_CLT = 1             # a Gaussian buffer z sigma sqrt(b)

# constants of the algorithms (configuration values, not user defaults)
DEFAULT_EMA = 0.2        # Algorithm 7, steps 1 and 3: the EMA weight a
DEFAULT_TOKENS = 500.0   # Algorithm 1, step 2: E[l_in + l_out] before any statistics
L0_FRACTION = 0.1        # Algorithm 1, step 3: rho = 10% of capacity
SLA_WARMUP_UPDATES = 3   # Algorithm 2: the midpoint until this many feedback updates
EDGE_MAX = 10000.0       # Algorithm 6, step 4: upper edge of the last bin
# the multiplicative variant's factors (compute_b_SLA)
MULT_LOW = 0.8           # case 1: b_low = max(b_low, int(0.8 b_avg))
MULT_GROW = 0.2          # case 2: b_high = min(b_high + int(0.2 b_avg), B_max)
MULT_MARGIN = 0.1        # case 3: half-width int(0.1 (b_high - b_low))


@njit(cache=CACHE)
def token_capacity(m_max_gb, m_model_gb, kv_mem_per_token_gb):
    """Algorithm 1, step 1: the KV-cache token capacity eta.

    Parameters
    ----------
    m_max_gb : float
        GPU memory, GB.
    m_model_gb : float
        Memory taken by the model weights, GB.
    kv_mem_per_token_gb : float
        KV-cache memory per token, GB/token.

    Returns
    -------
    float
        ``eta = (m_max_gb - m_model_gb) / kv_mem_per_token_gb``, tokens.
    """
    return (m_max_gb - m_model_gb) / kv_mem_per_token_gb


def controller_init(ctl, B_min, B_max):
    """Reset controllers: ``[b_low, b_high] = [B_min, B_max]``, EMAs and counters 0.

    Parameters
    ----------
    ctl : ndarray of float64, shape (..., CONTROLLER.size)
        Controller states (one row, or one per bin), overwritten.
    B_min, B_max : float
        Batch-size bounds, requests.
    """
    ctl[...] = 0.0
    ctl[..., C.b_low] = B_min
    ctl[..., C.b_high] = B_max


@njit(cache=CACHE)
def _clt_count(mu, sigma, z, eta, cap):
    """Largest integer b in [0, cap] with ``b mu + z sqrt(b) sigma <= eta`` (0 if none).

    With x = sqrt(b) the condition is the quadratic ``mu x^2 + z sigma x - eta <= 0``
    (mu > 0), whose positive root gives b up to rounding; the +-1 steps then make
    the inequality hold exactly in floating point.  Capping at ``cap`` keeps the
    count in int64 range and bounds the upward steps; callers clamp to B_max anyway.
    """
    zs = z * sigma
    disc = zs * zs + 4.0 * mu * eta
    if disc < 0.0:
        return 0.0
    x = (-zs + math.sqrt(disc)) / (2.0 * mu)
    if x <= 0.0:
        b = 0.0
    else:
        b = min(np.floor(x * x), cap)
    while b > 0.0 and b * mu + zs * math.sqrt(b) > eta:
        b -= 1.0
    while b < cap and (b + 1.0) * mu + zs * math.sqrt(b + 1.0) <= eta:
        b += 1.0
    return b


@njit(cache=CACHE)
def b_mem_core(eta, variant, z, default_tokens, B_min, B_max, avg_prompt, avg_output, count, mean_tokens,
               m2_tokens, limit):
    """:func:`b_mem` on scalars: the configuration (:data:`MEMORY`'s fields),
    the statistics (a :data:`BATCH_STATS` row) and the bin's limit (<= 0:
    none)."""
    if variant == MEM_VARIANT_CLT:
        mu = default_tokens
        sigma = 0.0
        if count >= 2.0 and mean_tokens > 0.0:
            mu = mean_tokens
            sigma = math.sqrt(max(m2_tokens, 0.0) / (count - 1.0))
        # the cap B_max + 1: the clamp below decides from there
        b = _clt_count(mu, sigma, z, eta, max(B_max, 0.0) + 1.0)
    else:
        # step 2, with Algorithm 1's default when there are no stats yet
        e_total = avg_prompt + avg_output
        if e_total <= 0.0:
            e_total = default_tokens
        # steps 3-4
        l0 = L0_FRACTION * eta
        b = np.floor((eta - l0) / e_total)
    # step 5 (kept in float64 until the end: a huge quotient must not wrap in int64)
    if limit > 0.0:
        b = min(b, limit)
    # step 6
    b = min(max(b, B_min), B_max)
    return np.int64(b)


@njit(cache=CACHE)
def b_mem(st, memory, bin_idx, bin_b_max):
    """Algorithm 1: the memory-constrained batch size.

    Variant ``MEM_VARIANT_L0`` (Pang et al.'s Algorithm 1) reserves a fixed buffer
    ``L0 = 0.1 eta`` and returns ``floor((eta - L0) / E[l_in + l_out])`` with the
    expectation from the EMAs of ``st`` (500 tokens while both are still 0).

    Variant ``MEM_VARIANT_CLT`` (a CLT buffer) reads the constraint
    ``Pr(S > eta) <= eps_M`` with S ~ Normal(b mu, b sigma^2) (central limit
    theorem over the b requests of a batch): the largest integer b with
    ``b mu + z sqrt(b) sigma <= eta``, where mu and sigma are the running mean
    and sample standard deviation of tokens per request and z = z_{1-eps_M}.
    Until two requests have been seen it uses mu = the default tokens per
    request and sigma = 0.  With sigma = 0 the rule is ``b = floor(eta / mu)``:
    no buffer at all, unlike the L0 rule.

    Both variants then apply the per-bin limit (step 5) and clamp to
    ``[B_min, B_max]`` (step 6).

    Parameters
    ----------
    st : ndarray of float64, shape (BATCH_STATS.size,)
        Batch statistics of the bin (or the global ones).
    memory : (ndarray of int64, ndarray of float64)
        ``MEMORY.pack(...)``; ``eta`` is the token capacity, tokens.
    bin_idx : int
        Bin index, or -1 for the global controller (no per-bin limit).
    bin_b_max : ndarray of float64, shape (K,)
        Per-bin batch limits, requests; an entry <= 0 means no limit.

    Returns
    -------
    int64
        The batch size, requests.
    """
    mi, mf = memory
    limit = bin_b_max[bin_idx] if bin_idx >= 0 else 0.0
    return b_mem_core(mf[M.eta], mi[M.variant], mf[M.z], mf[M.default_tokens], mf[M.b_min], mf[M.b_max],
                      st[T.avg_prompt], st[T.avg_output], st[T.count], st[T.mean_tokens], st[T.m2_tokens], limit)


@njit(cache=CACHE)
def b_sla_core(b_low, b_high, tau, b_avg, n_decode, updates, d_sla, eps, B_min, B_max, alpha, delta,
               multiplicative):
    """:func:`b_sla` on scalars: the controller state (a :data:`CONTROLLER`
    row) and configuration (:data:`SLA`'s fields, ``multiplicative`` a
    bool).  Returns the batch size and the new ``(b_low, b_high)``, for the
    caller to store."""
    if multiplicative:
        if tau > d_sla + eps:
            b_high = min(b_high, np.trunc(b_avg))
            b_low = max(b_low, np.trunc(b_avg * MULT_LOW))
        elif tau < d_sla - eps:
            b_low = max(b_low, np.trunc(b_avg))
            b_high = min(b_high + np.trunc(MULT_GROW * b_avg), B_max)
        else:
            margin = np.trunc(MULT_MARGIN * (b_high - b_low))
            b_low = max(B_min, np.trunc(b_avg) - margin)
            b_high = min(B_max, np.trunc(b_avg) + margin)
    else:
        # warm-up: the EMAs still remember their zero start
        if tau == 0.0 or updates < SLA_WARMUP_UPDATES:
            return np.int64(np.floor((b_low + b_high) / 2.0)), b_low, b_high

        fb = np.floor(b_avg)
        if tau > d_sla + eps:
            # case 1: latency too high, move left; b_high only ever shrinks here
            new_high = max(fb, b_low + alpha)
            new_low = max(b_low - delta, B_min)
            b_high = min(b_high, new_high)
            b_low = new_low
        elif tau < d_sla - eps:
            # case 2: comfortably below the SLA, move right; b_low only ever grows here
            new_low = min(fb, b_high - alpha)
            new_high = min(b_high + delta, B_max)
            b_low = max(b_low, new_low)
            b_high = new_high
        else:
            # case 3: within the band, centre on the average batch size
            half_alpha = np.floor(alpha / 2.0)
            b_high = min(fb + half_alpha, B_max)
            b_low = max(fb - half_alpha, B_min)

    b_low = max(B_min, b_low)
    b_high = min(B_max, b_high)
    if b_low > b_high:
        b_low = b_high

    b = np.floor((b_low + b_high) / 2.0)
    if n_decode > 0.0 and not multiplicative:  # the multiplicative variant has no such rule
        b = max(b, n_decode)
    return np.int64(min(max(b, B_min), B_max)), b_low, b_high


@njit(cache=CACHE)
def b_sla(ctl, sla):
    """Algorithm 2: the SLA-constrained batch size; updates ``[b_low, b_high]`` in place.

    Variant ``CTL_VARIANT_SPEC`` follows Pang et al.'s Algorithm 2 line by line:
    during warm-up (``tau_avg == 0`` or fewer than 3 updates) it returns the
    midpoint and changes nothing; afterwards

    - ``tau_avg > D_SLA + eps_D``: ``b_high = min(b_high, max(floor(b_avg), b_low + alpha))``,
      ``b_low = max(b_low - delta, B_min)``;
    - ``tau_avg < D_SLA - eps_D``: ``b_low = max(b_low, min(floor(b_avg), b_high - alpha))``,
      ``b_high = min(b_high + delta, B_max)``;
    - otherwise the interval is centred on ``floor(b_avg)`` with half-width
      ``floor(alpha / 2)``;

    then the interval is clipped to ``[B_min, B_max]`` (collapsing to
    ``b_high`` if empty), the midpoint is raised to ``N_decode`` when
    ``N_decode > 0`` and the result is clamped to ``[B_min, B_max]``.
    Case 1 never pulls ``b_high`` below ``b_low + alpha`` and case 2 never
    pushes ``b_low`` above ``b_high - alpha``, so from the initial interval
    (with ``B_max - B_min >= alpha`` and no ``N_decode`` floor) persistent
    overload settles at ``B_min + floor(alpha/2)`` and persistent slack at
    ``B_max - ceil(alpha/2)`` (the interval ends at ``[B_max - alpha, B_max]``),
    not at the bounds themselves.

    Variant ``CTL_VARIANT_MULTIPLICATIVE`` is a multiplicative
    ``compute_b_SLA``: no warm-up and no ``N_decode`` rule;
    ``int()`` truncates.  Case 1: ``b_high = min(b_high, int(b_avg))``,
    ``b_low = max(b_low, int(0.8 b_avg))``; case 2: ``b_low = max(b_low, int(b_avg))``,
    ``b_high = min(b_high + int(0.2 b_avg), B_max)``; case 3: with
    ``m = int(0.1 (b_high - b_low))``, ``[b_low, b_high] =
    [max(B_min, int(b_avg) - m), min(B_max, int(b_avg) + m)]``; then the same
    interval fix and midpoint.  The source's midpoint can fall below ``B_min``
    (case 1 with ``int(b_avg) < B_min`` collapses the interval there), which
    would give an empty batch; the returned value is therefore clamped to
    ``[B_min, B_max]`` as in Algorithm 2's last step.  The state is
    left as the source leaves it.

    Parameters
    ----------
    ctl : ndarray of float64, shape (CONTROLLER.size,)
        Controller state; ``b_low`` and ``b_high`` are updated.
    sla : (ndarray of int64, ndarray of float64)
        ``SLA.pack(...)``, the controller configuration.

    Returns
    -------
    int64
        The batch size, requests.
    """
    si, sf = sla
    b, ctl[C.b_low], ctl[C.b_high] = b_sla_core(
        ctl[C.b_low], ctl[C.b_high], ctl[C.tau_avg], ctl[C.b_avg], ctl[C.n_decode], ctl[C.updates],
        sf[A.d_sla], sf[A.eps_d], sf[A.b_min], sf[A.b_max], sf[A.alpha], sf[A.delta],
        si[A.variant] == CTL_VARIANT_MULTIPLICATIVE)
    return b


@njit(cache=CACHE)
def batch_sums(batch_prompt, batch_output, n):
    """The batch aggregates :func:`feedback_core` reads: the sums of the
    first ``n`` prompt and output lengths, the largest output (0 if all are
    below it) and the sum of squared deviations of prompt + output from
    their mean (0 when ``n == 0``)."""
    sum_p = 0.0
    sum_o = 0.0
    max_o = 0.0
    for i in range(n):
        p = batch_prompt[i]
        o = batch_output[i]
        sum_p += p
        sum_o += o
        if o > max_o:
            max_o = o
    m2_b = 0.0
    if n > 0:
        mean_b = (sum_p + sum_o) / float(n)
        for i in range(n):
            d = batch_prompt[i] + batch_output[i] - mean_b
            m2_b += d * d
    return sum_p, sum_o, max_o, m2_b


@njit(cache=CACHE)
def feedback_core(n, sum_p, sum_o, m2_b, max_o, service_time, decode_tbt, ema, avg_prompt, avg_output, count,
                  mean_tokens, m2_tokens, tau_avg, b_avg):
    """:func:`feedback` on scalars, for a batch of ``n >= 1`` requests given by
    its aggregates (:func:`batch_sums`): returns the new statistics
    ``(avg_prompt, avg_output, count, mean_tokens, m2_tokens)`` and controller
    EMAs ``(tau_avg, b_avg)``, for the caller to store with ``N_decode`` and
    the update count."""
    # running mean and M2 of tokens per request: the batch's own mean and M2
    # merged into the running ones (Chan et al.), one division per batch
    nb = float(n)
    mean_b = (sum_p + sum_o) / nb
    tot = count + nb
    delta = mean_b - mean_tokens
    new_mean = mean_tokens + delta * (nb / tot)
    new_m2 = m2_tokens + (m2_b + delta * delta * (count * nb / tot))

    # step 1
    a = ema
    new_prompt = a * (sum_p / n) + (1.0 - a) * avg_prompt
    new_output = a * (sum_o / n) + (1.0 - a) * avg_output
    # step 2
    if decode_tbt > 0.0:
        recent = decode_tbt
    else:
        recent = service_time / max(max_o, 1.0)
    # step 3
    new_tau = a * recent + (1.0 - a) * tau_avg
    new_b_avg = a * n + (1.0 - a) * b_avg
    return new_prompt, new_output, tot, new_mean, new_m2, new_tau, new_b_avg


@njit(cache=CACHE)
def feedback(ctl, st, sla, batch_prompt, batch_output, n, service_time, decode_tbt, n_decode):
    """Algorithm 7: update statistics and controller after a batch completes.

    The statistics' prompt and output EMAs and the controller's ``tau_avg`` and
    ``b_avg`` move by the EMA weight of ``sla`` towards the batch's values;
    ``N_decode`` is stored and the update count incremented.  The per-token
    time is ``decode_tbt`` when positive (the v2 model, decode only) and
    otherwise ``service_time / max(output_len)`` (legacy, includes the time to
    first token).  A batch whose outputs are all empty takes 1 token as the
    divisor, so the kernel never divides by zero.

    Not in Algorithm 7: every member's prompt + output also enters the
    running mean and M2 of tokens per request in ``st`` (the batch's mean
    and M2 merged in, Chan et al.), which only the CLT variant of
    :func:`b_mem` reads.

    Parameters
    ----------
    ctl : ndarray of float64, shape (CONTROLLER.size,)
        Controller state, updated.
    st : ndarray of float64, shape (BATCH_STATS.size,)
        Batch statistics, updated.
    sla : (ndarray of int64, ndarray of float64)
        ``SLA.pack(...)``: the controller configuration (the EMA weight).
    batch_prompt, batch_output : ndarray of float64, shape (>= n,)
        Prompt and output lengths of the batch members, tokens; the first
        ``n`` entries are used.
    n : int
        Batch size, requests; 0 leaves everything unchanged.
    service_time : float
        Batch service time, s.
    decode_tbt : float
        Decode time between tokens, s/token; <= 0 selects the legacy rule.
    n_decode : float
        Decode requests in the system.
    """
    if n == 0:
        return
    sum_p, sum_o, max_o, m2_b = batch_sums(batch_prompt, batch_output, n)
    (st[T.avg_prompt], st[T.avg_output], st[T.count], st[T.mean_tokens], st[T.m2_tokens],
     ctl[C.tau_avg], ctl[C.b_avg]) = feedback_core(
        n, sum_p, sum_o, m2_b, max_o, service_time, decode_tbt, sla[1][A.ema], st[T.avg_prompt],
        st[T.avg_output], st[T.count], st[T.mean_tokens], st[T.m2_tokens], ctl[C.tau_avg], ctl[C.b_avg])
    ctl[C.n_decode] = n_decode
    ctl[C.updates] += 1.0


@njit(cache=CACHE, forceinline=True)
def decode_tbt(beta, gamma, b):
    """ComputeDecodeTBT (v2 model): decode time between tokens at batch size b.

    Parameters
    ----------
    beta : float
        Time between tokens at b = 1, s/token.
    gamma : float
        Batch penalty.
    b : int or float
        Batch size, requests.

    Returns
    -------
    float
        ``beta * (1 + gamma * (b - 1) / max(1, b))``, s/token.
    """
    return beta * (1.0 + gamma * (b - 1.0) / max(1.0, b))


def equal_mass_edges(predicted, K):
    """Algorithm 6: equal-mass bin boundaries from predicted output lengths.

    ``K == 1`` gives ``[0, 10000)``.  Otherwise the K+1 quantiles at
    ``linspace(0, 1, K+1)`` (numpy's default linear interpolation) are floored;
    bin i is ``[floor(q_i), floor(q_{i+1}))`` and the last bin's upper edge is
    10000 (step 4 replaces step 3's infinity).  Tied quantiles give empty bins
    ``[a, a)``, and a last bin starting at or above 10000 is empty too.

    In numpy, not numba: the event kernel returns to Python at the end of
    the warm-up for it (numba's sort alone would cost seconds of compile).

    Parameters
    ----------
    predicted : ndarray of float64, shape (N,), N >= 1
        Predicted output lengths of the warm-up window, tokens.
    K : int
        Number of bins.

    Returns
    -------
    lo, hi : ndarray of float64, shape (K,)
        Lower (inclusive) and upper (exclusive) edges, tokens.
    """
    if K == 1:
        return np.zeros(1), np.full(1, EDGE_MAX)
    q = np.floor(np.quantile(predicted, np.linspace(0.0, 1.0, K + 1)))
    hi = q[1:].copy()
    hi[-1] = EDGE_MAX
    return q[:-1].copy(), hi


@njit(cache=CACHE)
def partition(pred, lo, hi, K):
    """Algorithm 4: the bin of a request with predicted output length ``pred``.

    The first i with ``lo[i] <= pred < hi[i]``, else the fallback ``K - 1``.
    As in the pseudocode, a prediction below the warm-up window's minimum
    (``floor`` of the 0-quantile) or at/above 10000 matches no bin and so falls
    back to the last bin, although it is shorter than every bin's range in the
    first case.

    Parameters
    ----------
    pred : float
        Predicted output length, tokens.
    lo, hi : ndarray of float64, shape (K,)
        Bin edges from :func:`equal_mass_edges`, tokens.
    K : int
        Number of bins.

    Returns
    -------
    int64
        Bin index in ``[0, K)``.
    """
    for i in range(K):
        if lo[i] <= pred < hi[i]:
            return np.int64(i)
    return np.int64(K - 1)


@njit(cache=CACHE, forceinline=True)
def partition_tiled(pred, lo, hi, K):
    """:func:`partition` for edges that tile ``[lo[0], hi[K-1])``, as
    :func:`equal_mass_edges` makes them (``hi[i] == lo[i+1]``, nondecreasing):
    the same bin, without a branch per bin (the kernels' form; a branch that
    depends on a random length is mispredicted about once per request).

    In a tiling the first bin holding ``pred`` is the number of upper edges
    at or below it, which is ``K - 1`` at or above 10000 as well; below
    ``lo[0]`` the fallback ``K - 1`` applies.
    """
    c = np.int64(0)
    for i in range(K - 1):
        c += np.int64(hi[i] <= pred)
    return np.int64(K - 1) if pred < lo[0] else c


def partition_tiled_array(pred, lo, hi):
    """:func:`partition_tiled` of every prediction in an array, in numpy
    (the same comparisons, so the same bins)."""
    K = lo.shape[0]
    c = np.zeros(pred.shape, np.int64)
    for i in range(K - 1):
        c += hi[i] <= pred
    return np.where(pred < lo[0], K - 1, c)


@njit(cache=CACHE, forceinline=True)
def check_memory(total_tokens, eta):
    """Algorithm 3, step 3: whether a batch's tokens fit the capacity.

    Parameters
    ----------
    total_tokens : float
        Sum over the batch of prompt + output lengths, tokens.
    eta : float
        Token capacity, tokens.

    Returns
    -------
    bool
        ``total_tokens <= eta``.
    """
    return total_tokens <= eta


def warmup() -> None:
    """Compile every numba function of this module (or load it from the
    cache) on tiny inputs."""
    ctl = np.zeros(CONTROLLER.size)
    controller_init(ctl, 1.0, 64.0)
    sla = SLA.pack(d_sla=0.05, eps_d=0.005, b_min=1.0, b_max=64.0, alpha=4.0, delta=2.0, ema=DEFAULT_EMA,
                   variant=CTL_VARIANT_SPEC)
    memory = MEMORY.pack(eta=1e5, b_min=1.0, b_max=64.0, variant=MEM_VARIANT_L0, z=1.645,
                         default_tokens=DEFAULT_TOKENS)
    st = np.zeros(BATCH_STATS.size)
    lengths = np.array([10.0, 20.0, 30.0, 40.0])
    lo, hi = equal_mass_edges(lengths, 2)
    token_capacity(80.0, 16.0, 1e-3)
    feedback(ctl, st, sla, lengths, lengths, 4, 1.0, 0.0, 0.0)
    b_sla(ctl, sla)
    b_mem(st, memory, 0, np.zeros(2))
    batch_sums(lengths, lengths, 4)
    decode_tbt(5.74e-3, 0.316, 4.0)
    partition(15.0, lo, hi, 2)
    partition_tiled(15.0, lo, hi, 2)
    check_memory(100.0, 1e5)
