"""Dynamic-batching controller kernels: Algorithms 1, 2, 4, 6 and 7 of the
algorithm specification, and the Section 2.2-2.3 variants of the design notes.

Every function is a pure numba function of float64 state vectors and scalars,
so a simulation kernel can hold one controller per bin as the rows of a 2-D
array and pass a row.  The vectors are laid out by the integer index
constants below; the public wrappers build them (with the defaults given
here) and validate their values, the kernels trust them.

State vectors
-------------
``ctl``  (``N_CTL``) one SLA controller: the adaptive interval
         ``[b_low, b_high]``, the EMAs ``tau_avg`` (s/token) and ``b_avg``
         (requests), the last ``N_decode`` and the number of feedback updates.
``ccfg`` (``N_CC``) controller configuration: ``D_SLA`` and ``eps_D`` (s/token),
         ``B_min``, ``B_max``, the steps ``alpha`` and ``delta``, the variant
         and the EMA weight.
``st``   (``N_ST``) batch statistics: EMAs of prompt and output length
         (tokens), and the running count, mean and M2 of the tokens per
         request (prompt + output).
``mcfg`` (``N_MC``) memory configuration: the token capacity ``eta``,
         ``B_min``, ``B_max``, the variant, the normal quantile ``z`` and the
         default tokens per request.

Batch sizes are whole numbers held in float64 so that one array type carries
the whole state; the functions returning a batch size return an int64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import CACHE

# --- controller state ctl -----------------------------------------------------
CTL_B_LOW = 0
CTL_B_HIGH = 1
CTL_TAU_AVG = 2    # EMA of the per-token decode time between tokens, s
CTL_B_AVG = 3      # EMA of the batch size, requests
CTL_N_DECODE = 4   # decode requests in the system at the last feedback
CTL_UPDATES = 5    # feedback updates so far (Algorithm 2's update_count)
N_CTL = 6

# --- controller configuration ccfg -------------------------------------------
CC_D_SLA = 0
CC_EPS_D = 1
CC_B_MIN = 2
CC_B_MAX = 3
CC_ALPHA = 4
CC_DELTA = 5
CC_VARIANT = 6     # CTL_VARIANT_SPEC or CTL_VARIANT_MULTIPLICATIVE
CC_EMA = 7
N_CC = 8

# --- batch statistics st ------------------------------------------------------
ST_AVG_PROMPT = 0   # EMA of the batch-mean prompt length, tokens
ST_AVG_OUTPUT = 1   # EMA of the batch-mean output length, tokens
ST_COUNT = 2        # requests seen
ST_MEAN_TOKENS = 3  # running mean of prompt + output, tokens
ST_M2_TOKENS = 4    # running sum of squared deviations, tokens^2
N_ST = 5

# --- memory configuration mcfg ------------------------------------------------
MC_ETA = 0
MC_B_MIN = 1
MC_B_MAX = 2
MC_VARIANT = 3            # MEM_VARIANT_L0 or MEM_VARIANT_CLT
MC_Z = 4                  # z_{1 - eps_M}, the CLT variant's normal quantile
MC_DEFAULT_TOKENS = 5     # tokens per request assumed before any statistics
N_MC = 6

# variants
CTL_VARIANT_SPEC = 0            # Algorithm 2 of the algorithm specification
CTL_VARIANT_MULTIPLICATIVE = 1  # compute_b_SLA of the design notes, Section 2.3
MEM_VARIANT_L0 = 0              # Algorithm 1: safety buffer L0 = 0.1 eta
MEM_VARIANT_CLT = 1             # Section 2.2: Gaussian buffer z sigma sqrt(b)

# defaults of the specification (the wrappers fill ccfg/mcfg with these)
DEFAULT_ALPHA = 4.0
DEFAULT_DELTA = 2.0
DEFAULT_EMA = 0.2
DEFAULT_TOKENS = 500.0
DEFAULT_BETA = 5.74e-3   # s, calibrated decode time between tokens at b = 1
DEFAULT_GAMMA = 0.316    # calibrated batch penalty of the decode step
L0_FRACTION = 0.1        # Algorithm 1, step 3: rho = 10% of capacity
EDGE_MAX = 10000.0       # Algorithm 6, step 4: upper edge of the last bin


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


@njit(cache=CACHE)
def controller_init(ctl, B_min, B_max):
    """Reset a controller: ``[b_low, b_high] = [B_min, B_max]``, EMAs and counters 0.

    Parameters
    ----------
    ctl : ndarray of float64, shape (N_CTL,)
        Controller state, overwritten.
    B_min, B_max : float
        Batch-size bounds, requests.
    """
    ctl[CTL_B_LOW] = B_min
    ctl[CTL_B_HIGH] = B_max
    ctl[CTL_TAU_AVG] = 0.0
    ctl[CTL_B_AVG] = 0.0
    ctl[CTL_N_DECODE] = 0.0
    ctl[CTL_UPDATES] = 0.0


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
    """:func:`b_mem` on scalars: the configuration (``mcfg``'s entries), the
    statistics (``st``'s entries) and the bin's limit (<= 0: none).  The
    kernels' form: a function of scalars only costs no reference counting."""
    if variant == MEM_VARIANT_CLT:
        mu = default_tokens
        sigma = 0.0
        if count >= 2.0 and mean_tokens > 0.0:
            mu = mean_tokens
            sigma = math.sqrt(max(m2_tokens, 0.0) / (count - 1.0))
        b = _clt_count(mu, sigma, z, eta, max(B_max, 0.0) + 1.0)
    else:
        # step 2, with the specification's default when there are no stats yet
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
def b_mem(st, mcfg, bin_idx, bin_b_max):
    """Algorithm 1: the memory-constrained batch size.

    Variant ``MEM_VARIANT_L0`` (the specification) reserves a fixed buffer
    ``L0 = 0.1 eta`` and returns ``floor((eta - L0) / E[l_in + l_out])`` with the
    expectation from the EMAs of ``st`` (500 tokens while both are still 0).

    Variant ``MEM_VARIANT_CLT`` (design notes, Section 2.2) reads the constraint
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
    st : ndarray of float64, shape (N_ST,)
        Batch statistics of the bin (or the global ones).
    mcfg : ndarray of float64, shape (N_MC,)
        Memory configuration; ``mcfg[MC_ETA]`` is the token capacity, tokens.
    bin_idx : int
        Bin index, or -1 for the global controller (no per-bin limit).
    bin_b_max : ndarray of float64, shape (K,)
        Per-bin batch limits, requests; an entry <= 0 means no limit.

    Returns
    -------
    int64
        The batch size, requests.
    """
    limit = bin_b_max[bin_idx] if bin_idx >= 0 else 0.0
    return b_mem_core(mcfg[MC_ETA], mcfg[MC_VARIANT], mcfg[MC_Z], mcfg[MC_DEFAULT_TOKENS], mcfg[MC_B_MIN],
                      mcfg[MC_B_MAX], st[ST_AVG_PROMPT], st[ST_AVG_OUTPUT], st[ST_COUNT], st[ST_MEAN_TOKENS],
                      st[ST_M2_TOKENS], limit)


@njit(cache=CACHE)
def b_sla_core(b_low, b_high, tau, b_avg, n_decode, updates, d_sla, eps, B_min, B_max, alpha, delta,
               multiplicative):
    """:func:`b_sla` on scalars: the controller state (``ctl``'s entries) and
    configuration (``ccfg``'s, ``multiplicative`` a bool).  Returns the batch
    size and the new ``(b_low, b_high)``, for the caller to store.  The
    kernels' form: a function of scalars only costs no reference counting."""
    if multiplicative:
        if tau > d_sla + eps:
            b_high = min(b_high, np.trunc(b_avg))
            b_low = max(b_low, np.trunc(b_avg * 0.8))
        elif tau < d_sla - eps:
            b_low = max(b_low, np.trunc(b_avg))
            b_high = min(b_high + np.trunc(0.2 * b_avg), B_max)
        else:
            margin = np.trunc(0.1 * (b_high - b_low))
            b_low = max(B_min, np.trunc(b_avg) - margin)
            b_high = min(B_max, np.trunc(b_avg) + margin)
    else:
        # warm-up: the EMAs still remember their zero start
        if tau == 0.0 or updates < 3.0:
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
    if n_decode > 0.0 and not multiplicative:  # the design notes' variant has no such rule
        b = max(b, n_decode)
    return np.int64(min(max(b, B_min), B_max)), b_low, b_high


@njit(cache=CACHE)
def b_sla(ctl, ccfg):
    """Algorithm 2: the SLA-constrained batch size; updates ``[b_low, b_high]`` in place.

    Variant ``CTL_VARIANT_SPEC`` follows the specification line by line:
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

    Variant ``CTL_VARIANT_MULTIPLICATIVE`` is ``compute_b_SLA`` of the design
    notes (Section 2.3), as written: no warm-up and no ``N_decode`` rule;
    ``int()`` truncates.  Case 1: ``b_high = min(b_high, int(b_avg))``,
    ``b_low = max(b_low, int(0.8 b_avg))``; case 2: ``b_low = max(b_low, int(b_avg))``,
    ``b_high = min(b_high + int(0.2 b_avg), B_max)``; case 3: with
    ``m = int(0.1 (b_high - b_low))``, ``[b_low, b_high] =
    [max(B_min, int(b_avg) - m), min(B_max, int(b_avg) + m)]``; then the same
    interval fix and midpoint.  The source's midpoint can fall below ``B_min``
    (case 1 with ``int(b_avg) < B_min`` collapses the interval there), which
    would give an empty batch; the returned value is therefore clamped to
    ``[B_min, B_max]`` as in the specification's last step.  The state is
    left as the source leaves it.

    Parameters
    ----------
    ctl : ndarray of float64, shape (N_CTL,)
        Controller state; ``b_low`` and ``b_high`` are updated.
    ccfg : ndarray of float64, shape (N_CC,)
        Controller configuration.

    Returns
    -------
    int64
        The batch size, requests.
    """
    b, ctl[CTL_B_LOW], ctl[CTL_B_HIGH] = b_sla_core(
        ctl[CTL_B_LOW], ctl[CTL_B_HIGH], ctl[CTL_TAU_AVG], ctl[CTL_B_AVG], ctl[CTL_N_DECODE], ctl[CTL_UPDATES],
        ccfg[CC_D_SLA], ccfg[CC_EPS_D], ccfg[CC_B_MIN], ccfg[CC_B_MAX], ccfg[CC_ALPHA], ccfg[CC_DELTA],
        ccfg[CC_VARIANT] == CTL_VARIANT_MULTIPLICATIVE)
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
    the update count.  The kernels' form: a function of scalars only costs no
    reference counting."""
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
def feedback(ctl, st, ccfg, batch_prompt, batch_output, n, service_time, decode_tbt, n_decode):
    """Algorithm 7: update statistics and controller after a batch completes.

    The statistics' prompt and output EMAs and the controller's ``tau_avg`` and
    ``b_avg`` move by weight ``ccfg[CC_EMA]`` towards the batch's values;
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
    ctl : ndarray of float64, shape (N_CTL,)
        Controller state, updated.
    st : ndarray of float64, shape (N_ST,)
        Batch statistics, updated.
    ccfg : ndarray of float64, shape (N_CC,)
        Controller configuration (the EMA weight).
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
    (st[ST_AVG_PROMPT], st[ST_AVG_OUTPUT], st[ST_COUNT], st[ST_MEAN_TOKENS], st[ST_M2_TOKENS],
     ctl[CTL_TAU_AVG], ctl[CTL_B_AVG]) = feedback_core(
        n, sum_p, sum_o, m2_b, max_o, service_time, decode_tbt, ccfg[CC_EMA], st[ST_AVG_PROMPT],
        st[ST_AVG_OUTPUT], st[ST_COUNT], st[ST_MEAN_TOKENS], st[ST_M2_TOKENS], ctl[CTL_TAU_AVG], ctl[CTL_B_AVG])
    ctl[CTL_N_DECODE] = n_decode
    ctl[CTL_UPDATES] += 1.0


@njit(cache=CACHE)
def decode_tbt(beta, gamma, b):
    """ComputeDecodeTBT (v2 model): decode time between tokens at batch size b.

    Parameters
    ----------
    beta : float
        Time between tokens at b = 1, s/token (calibrated: ``DEFAULT_BETA``).
    gamma : float
        Batch penalty (calibrated: ``DEFAULT_GAMMA``).
    b : int or float
        Batch size, requests.

    Returns
    -------
    float
        ``beta * (1 + gamma * (b - 1) / max(1, b))``, s/token.
    """
    return beta * (1.0 + gamma * (b - 1.0) / max(1.0, b))


@njit(cache=CACHE)
def _quantile_sorted(s, q):
    # numpy's default 'linear' method operation for operation, so the edges
    # match np.quantile bit for bit
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


@njit(cache=CACHE)
def equal_mass_edges(predicted, K, out_lo, out_hi):
    """Algorithm 6: equal-mass bin boundaries from predicted output lengths.

    ``K == 1`` gives ``[0, 10000)``.  Otherwise the K+1 quantiles at
    ``linspace(0, 1, K+1)`` (numpy's default linear interpolation) are floored;
    bin i is ``[floor(q_i), floor(q_{i+1}))`` and the last bin's upper edge is
    10000 (step 4 replaces step 3's infinity).  Tied quantiles give empty bins
    ``[a, a)``, and a last bin starting at or above 10000 is empty too.

    Parameters
    ----------
    predicted : ndarray of float64, shape (N,), N >= 1
        Predicted output lengths of the warm-up window, tokens.
    K : int
        Number of bins.
    out_lo, out_hi : ndarray of float64, shape (K,)
        Lower (inclusive) and upper (exclusive) edges, tokens; overwritten.
    """
    if K == 1:
        out_lo[0] = 0.0
        out_hi[0] = EDGE_MAX
        return
    s = np.sort(predicted)
    # np.linspace(0, 1, K+1): j * (1/K), with the endpoint set exactly
    step = 1.0 / K
    prev_q = np.floor(_quantile_sorted(s, 0.0))
    for i in range(K):
        qn = 1.0 if i + 1 == K else (i + 1) * step
        next_q = np.floor(_quantile_sorted(s, qn))
        out_lo[i] = prev_q
        out_hi[i] = next_q
        prev_q = next_q
    out_hi[K - 1] = EDGE_MAX


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


@njit(cache=CACHE)
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


@njit(cache=CACHE)
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
    """Compile every controller kernel (or load it from the cache) on tiny inputs."""
    ctl = np.zeros(N_CTL)
    ccfg = np.array([0.05, 0.005, 1.0, 64.0, DEFAULT_ALPHA, DEFAULT_DELTA, 0.0, DEFAULT_EMA])
    st = np.zeros(N_ST)
    mcfg = np.array([1e5, 1.0, 64.0, 0.0, 1.645, DEFAULT_TOKENS])
    bin_b_max = np.zeros(2)
    lengths = np.array([10.0, 20.0, 30.0, 40.0])
    lo = np.empty(2)
    hi = np.empty(2)
    token_capacity(80.0, 16.0, 1e-3)
    controller_init(ctl, 1.0, 64.0)
    feedback(ctl, st, ccfg, lengths, lengths, 4, 1.0, 0.0, 0.0)
    b_sla(ctl, ccfg)
    b_mem(st, mcfg, 0, bin_b_max)
    decode_tbt(DEFAULT_BETA, DEFAULT_GAMMA, 4)
    decode_tbt(DEFAULT_BETA, DEFAULT_GAMMA, 4.0)
    equal_mass_edges(lengths, 2, lo, hi)
    partition(15.0, lo, hi, 2)
    partition_tiled(15.0, lo, hi, 2)
    check_memory(100.0, 1e5)
