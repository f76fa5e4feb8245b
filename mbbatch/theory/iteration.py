"""Multi-bin batching on a measured engine: the expected batch service time
when a batch is timed by an :class:`~mbbatch.IterationModel`.

The multi-bin batching paper's eq. (2) (Guldogan, Kunde, Lee and Pedarsani,
2024, arXiv:2412.04504) averages a batch's time over its bin,
``E[t_service] = sum_i Pr(bin = i) E[t(batch) | bin = i]``, with a batch
taking its longest member's time.  Under the iteration model (an engine's
prefill iteration, then one decode iteration per further token of its
longest member; :class:`~mbbatch.IterationModel`) a batch of ``B`` members of
bin ``i``, output lengths ``o_j`` (``d_j = max(o_j - 1, 0)`` decode steps,
``D = max_j d_j``) and prompts ``p_j`` drawn independently of them, takes::

    setup + step (1 + D) + prefill_per_token sum(p_j)
          + per_sequence S + per_context_token K + prefill_attention sum(p_j^2)

with ``S = sum(d_j)`` and ``K = sum(p_j d_j + d_j (d_j + 1) / 2)`` when
finished members leave, ``S = B D`` and ``K = D sum(p_j) + B D (D + 1) / 2``
when they stay (padded).  Its expectation needs, per bin, the mean of the
largest of ``B`` draws (as eq. (2)) and the conditional means of ``d`` and
``d (d + 1) / 2``: exact for a discrete distribution of output lengths, as a
simulation's whole-token lengths are (:func:`integer_lengths`).
"""

from __future__ import annotations

import numpy as np

from .._kernels.cost import cost_py
from .._validation import check_count

__all__ = ["iteration_batch_service_time", "integer_lengths"]


def integer_lengths(dist, tail: float = 1e-12) -> tuple:
    """The lengths a simulation draws from ``dist`` (a frozen
    ``scipy.stats`` distribution) in whole tokens, ``max(ceil(x), 1)``, as
    ``(values, weights)``: the lengths 1, 2, ... up to the ``1 - tail``
    quantile and their probabilities (the mass beyond it, ``tail``, left
    out and the rest renormalised)."""
    if not 0.0 < tail < 1e-3:
        raise ValueError(f"tail must be in (0, 1e-3); got {tail!r}")
    top = float(dist.ppf(1.0 - tail))
    if not np.isfinite(top) or top > 1e8:
        raise ValueError(f"the distribution's 1 - tail quantile, {top:g} tokens, is too long to enumerate")
    values = np.arange(1.0, max(np.ceil(top), 1.0) + 1.0)
    cdf = dist.cdf(values)
    weights = np.diff(np.concatenate(([0.0], cdf)))
    weights = np.clip(weights, 0.0, None)
    return values, weights / weights.sum()


def iteration_batch_service_time(model, outputs, B, edges=None, *, prompt_mean, weights=None,
                                 prompt_square_mean=None):
    r"""Expected batch service time of multi-bin batching under an iteration
    model: eq. (2) with a batch timed by ``model`` (see the module).

    Parameters
    ----------
    model : IterationModel
        Its ``setup``, ``step``, ``prefill_per_token``, ``per_sequence``,
        ``per_context_token``, ``finished`` and a mixture of experts'
        ``per_expert``, ``experts`` and ``experts_per_token`` are read.
    outputs : array_like of float
        Output lengths (tokens >= 0), the support of a discrete
        distribution (repeats weigh), e.g. :func:`integer_lengths` or a
        trace's column.
    B : int
        Batch size, ``B >= 1``.
    edges : array_like, shape (k + 1,), optional
        Bin edges in tokens covering the lengths; bin ``i`` holds
        ``e_i <= o < e_{i+1}``, the last closed above (requests binned by
        their true length: an oracle).  Default: one bin.
    prompt_mean : float
        The prompts' mean length (tokens), drawn independently of the outputs.
    weights : array_like of float, optional
        Probabilities of ``outputs`` (default: equal).
    prompt_square_mean : float, optional
        ``E[P^2]``, tokens^2, needed where ``model.prefill_attention > 0``
        (a batch's prefill adds ``prefill_attention sum(p_j^2)``).

    Examples
    --------
    >>> from mbbatch import IterationModel
    >>> m = IterationModel(setup=0.0, step=1.0, prefill_per_token=0.0, per_sequence=0.0, per_context_token=0.0)
    >>> iteration_batch_service_time(m, [1.0, 3.0], 2, prompt_mean=0.0)    # 1 + E[max d] = 1 + 2 * 3/4
    2.5
    """
    v = np.asarray(outputs, dtype=float).ravel()
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("outputs must hold at least one finite length >= 0")
    w = np.full(v.size, 1.0 / v.size) if weights is None else np.asarray(weights, dtype=float).ravel()
    if w.shape != v.shape or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError("weights must be one finite probability >= 0 per output length, not all 0")
    w = w / w.sum()
    B = int(check_count("B", B))
    if not np.isfinite(prompt_mean) or prompt_mean < 0:
        raise ValueError(f"prompt_mean must be a finite length >= 0; got {prompt_mean!r}")
    squares = 0.0
    if model.prefill_attention > 0.0:
        if prompt_square_mean is None:
            raise ValueError("prompt_square_mean (E[P^2], tokens^2) is needed: the model's prefill_attention = "
                             f"{model.prefill_attention:g} times the prompts' squares")
        if not np.isfinite(prompt_square_mean) or prompt_square_mean < prompt_mean ** 2:
            raise ValueError(f"prompt_square_mean must be finite and at least prompt_mean^2 = {prompt_mean ** 2:g}; "
                             f"got {prompt_square_mean!r}")
        squares = B * float(prompt_square_mean)
    e = np.array([v.min(), v.max()]) if edges is None else np.asarray(edges, dtype=float)
    if e.ndim != 1 or e.size < 2 or np.any(np.isnan(e)) or np.any(np.diff(e) < 0):
        raise ValueError(f"edges must be a non-decreasing 1-D array of at least 2 values; got {edges!r}")
    if e[0] > v.min() or e[-1] < v.max():
        raise ValueError(f"edges must cover the lengths [{v.min():g}, {v.max():g}]; got [{e[0]:g}, {e[-1]:g}]")
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    k = e.size - 1
    b = np.clip(np.searchsorted(e, v, side="right") - 1, 0, k - 1)
    stay = model.finished == "stay"
    total = 0.0
    for i in range(k):
        mine = b == i
        p_i = float(w[mine].sum())
        if p_i == 0.0:
            continue
        x, q = v[mine], w[mine] / p_i
        d = np.maximum(x - 1.0, 0.0)
        cdf = np.cumsum(q)
        cdf[-1] = 1.0
        top = np.diff(np.concatenate(([0.0], cdf ** B)))       # Pr(max = x_j): the lengths sorted
        e_dmax = float(top @ d)
        if stay:
            seq = B * e_dmax
            ctx = B * prompt_mean * e_dmax + B * float(top @ (d * (d + 1.0) / 2.0))
        else:
            seq = B * float(q @ d)
            ctx = B * (prompt_mean * float(q @ d) + float(q @ (d * (d + 1.0) / 2.0)))
        # (the batch's features: one batch, its prefill iteration and E[max d] decode iterations)
        reads = (_expert_reads(model, B, prompt_mean, d, q, e_dmax, stay) if model.per_expert > 0.0 and model.experts
                 else 0.0)
        t = float(cost_py(model.coefficients(), 1.0, 1.0 + e_dmax, B * prompt_mean, seq, ctx, reads, squares))
        total += p_i * t
    return total


def _expert_reads(model, B, prompt_mean, d, q, e_dmax, stay) -> float:
    """The expected experts a batch of B reads beyond each iteration's first
    token's (:func:`mbbatch.service_models.extra_experts` x): its prefill
    iteration's over ``B prompt_mean`` tokens, then its decode iterations'.
    Finished members leaving, the members still decoding after t steps are
    Binomial(B, S) with ``S = Pr(d > t)``, and for ``b`` of them ``E[x(b)] =
    (E - k) (Pr(b >= 1) - (E[m^b] - Pr(b = 0)) / m)``, ``m = 1 - k/E``,
    ``E[m^b] = (1 - S (1 - m))^B``; S is constant between consecutive decode
    lengths ``d`` (sorted, probabilities ``q``).  Padded, every decode
    iteration has all B.  (The prefill's tokens taken at the prompts' mean:
    exact for prompts of one length, and within ``m^(T - 1)`` of it for T
    tokens, which saturates fast: 1 % at 17 tokens for Mixtral's 2 of 8.)"""
    from ..service_models import extra_experts

    e, k = model.experts, model.experts_per_token
    reads = float(extra_experts(e, k, B * prompt_mean))
    if stay:
        return reads + e_dmax * float(extra_experts(e, k, float(B)))
    miss = 1.0 - k / e
    if miss == 0.0:         # every token reads every expert: none beyond the first's
        return reads
    # S on (d_(l-1), d_l]: Pr(d >= d_l), the lengths sorted
    surv = np.concatenate(([1.0], 1.0 - np.cumsum(q)[:-1])).clip(0.0, 1.0)
    width = np.diff(np.concatenate(([0.0], d)))
    none = (1.0 - surv) ** B
    per_step = (e - k) * ((1.0 - none) - ((1.0 - surv * (1.0 - miss)) ** B - none) / miss)
    return reads + float(width @ per_step)
