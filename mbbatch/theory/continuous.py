"""The capacity of a continuous-batching engine whose iterations cost what
they process (Li, Dai and Peng, 2025, "Throughput-optimal scheduling
algorithms for LLM inference and AI agents", arXiv:2504.07347)."""

from __future__ import annotations

import numpy as np

from .assumptions import outside

__all__ = ["continuous_capacity"]


def continuous_capacity(model, max_batched_tokens, prompt_mean, output_mean):
    """The largest arrival rate (requests/s) a work-conserving
    continuous-batching engine carries: stable exactly below it.

    Li, Dai and Peng (2025, arXiv:2504.07347) show that an engine whose
    iteration time depends only on the tokens it processes, ``t(k)``, and
    whose memory does not bind, is stable exactly when ``rate x E[work] <
    b / t(b)`` with ``b`` the iteration's token budget, when every iteration
    under a backlog fills its budget (as chunked prefill does with
    ``max_num_seqs >= b``).  A request's work here is its prompt tokens and
    its ``output - 1`` decode steps: the prefill iteration gives its first
    token (the paper's prompt plus output, counted as mbbatch's engine and
    vLLM count them).

    Parameters
    ----------
    model : IterationModel
        ``per_context_token = 0`` and ``prefill_per_token == per_sequence``
        (one cost per token, prefilled or decoded), so that ``t(k) = step +
        per_sequence k`` (``setup`` is a batch's, which a continuous engine
        never starts).
    max_batched_tokens : int or array
        The budget ``b``, tokens.
    prompt_mean, output_mean : float or array
        ``E[prompt]`` and ``E[output]``, tokens (whole tokens: output >= 1).

    Returns
    -------
    float or ndarray
        ``b / ((step + per_sequence b) (E[prompt] + E[output] - 1))``; NaN,
        with an :class:`~mbbatch.theory.OutsideAssumptions` warning, for a
        ``model`` outside the bound's assumptions (a context-token cost, or
        prefill and decode tokens priced apart).

    Examples
    --------
    >>> import mbbatch as mb
    >>> m = mb.IterationModel(step=0.01, prefill_per_token=1e-4, per_sequence=1e-4, per_context_token=0.0)
    >>> round(float(continuous_capacity(m, 512, prompt_mean=200, output_mean=101)), 4)
    27.8867
    """
    bad = []
    if model.per_context_token != 0.0:
        bad.append(f"per_context_token = {model.per_context_token:g} (must be 0)")
    if model.prefill_attention != 0.0:
        bad.append(f"prefill_attention = {model.prefill_attention:g} (must be 0)")
    if model.prefill_per_token != model.per_sequence:
        bad.append(f"prefill_per_token = {model.prefill_per_token:g} != per_sequence = {model.per_sequence:g}")
    b = np.asarray(max_batched_tokens, dtype=float)
    p = np.asarray(prompt_mean, dtype=float)
    o = np.asarray(output_mean, dtype=float)
    for name, v, lo in (("max_batched_tokens", b, 1.0), ("prompt_mean", p, 0.0), ("output_mean", o, 1.0)):
        if np.any(~np.isfinite(v)) or np.any(v < lo):
            raise ValueError(f"{name} must be finite and >= {lo:g}; got {v}")
    work = p + o - 1.0
    if np.any(work <= 0):
        raise ValueError("prompt_mean + output_mean - 1 must be > 0: a request must take some work")
    out = b / ((model.step + model.per_sequence * b) * work)
    if bad:
        outside(True, "continuous_capacity: the bound holds for an iteration time that depends only on the tokens "
                      "processed (step + c x tokens); model has " + "; ".join(bad))
        out = np.full(out.shape, np.nan)
    return float(out) if out.ndim == 0 else out

