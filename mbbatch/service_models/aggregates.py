"""The per-batch aggregates the service models read (sizes, lengths, the
iteration model's decode work and experts read), and the checks of their
values."""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from .._kernels import cost as _cost
from ..params import default

#: ``(experts, experts_per_token)`` of a dense model: the parameter table's defaults (no experts)
DENSE = (default("IterationModel.experts"), default("IterationModel.experts_per_token"))

# the per-batch aggregates the models read, with their units
_UNITS = {"size": "requests", "max_seq_len": "tokens", "max_output": "tokens", "sum_prompt": "tokens",
          "sequence_steps": "sequence-steps", "context_steps": "token-steps", "expert_reads": "experts",
          "prefill_squares": "tokens^2",
          "prompt": "tokens",
          "output": "tokens", "service": "s", "prefill": "s", "per_token": "s/token"}
#: the aggregates a model's formulas read, in the order of the methods' arguments
_AGGREGATES = ("size", "max_seq_len", "max_output", "sum_prompt", "sequence_steps", "context_steps", "expert_reads",
               "prefill_squares")
#: what a measured row may time: the whole batch, its prefill (to its first
#: token), or its mean decode step
_TARGETS = ("service", "prefill", "per_token")


class BatchTimes(NamedTuple):
    """A batch's times, as the event kernel computes them (``_batch_service``).

    Each is a float for scalar arguments, else an array of their broadcast shape.

    Attributes
    ----------
    service : float or ndarray
        Service time of the batch, s.
    decode_tbt : float or ndarray
        Decode time between tokens the model provides to Algorithm 7, s/token;
        0 where it provides none (the legacy rule then applies).
    tpot : float or ndarray
        Time per output token, s/token: what the SLA bounds in the metrics.
    ttft : float or ndarray
        Time from the batch's start to its first output token, s.
    """

    service: object
    decode_tbt: object
    tpot: object
    ttft: object


class BatchAggregates(NamedTuple):
    """Per-batch aggregates of the members' lengths (:func:`batch_aggregates`).

    Attributes
    ----------
    size : ndarray of int64
        Members, requests.
    max_seq_len : ndarray of float64
        Largest ``prompt + output`` of a member, tokens (Algorithm 3).
    max_output : ndarray of float64
        Largest output length of a member, tokens.
    sum_prompt : ndarray of float64
        Summed prompt lengths, tokens.
    sequence_steps : ndarray of float64
        Decode steps of the members, sequence-steps: ``sum(max(output - 1,
        0))`` (a member's first token comes with its prefill, then it decodes
        until its last; :class:`IterationModel`).
    context_steps : ndarray of float64
        Context tokens those steps attend over, token-steps: ``sum(prompt d +
        d (d + 1) / 2)`` with ``d = max(output - 1, 0)`` (a member's context
        at its j-th decode step is ``prompt + j`` tokens).
    expert_reads : ndarray of float64
        Experts of a mixture-of-experts model read beyond each decode
        iteration's first token's, summed over the batch's decode iterations
        (finished members leaving), experts: 0 for a dense model
        (:func:`extra_experts`; :func:`batch_aggregates`' ``experts``).
    prefill_squares : ndarray of float64
        Summed squares of the prompts, tokens^2: the prefill attention's
        feature (:class:`IterationModel`'s ``prefill_attention``).
    """

    size: np.ndarray
    max_seq_len: np.ndarray
    max_output: np.ndarray
    sum_prompt: np.ndarray
    sequence_steps: np.ndarray
    context_steps: np.ndarray
    expert_reads: np.ndarray
    prefill_squares: np.ndarray


def _show(v) -> str:
    return repr(float(v)) if isinstance(v, (float, np.floating)) else repr(v)


def _real_values(name: str, value) -> np.ndarray:
    """``value`` (a real number or an array of them) as a float64 array;
    strings, bools, None and arrays of non-numbers are a ``TypeError``."""
    if value is None or isinstance(value, (str, bytes, bool, np.bool_, dict)):
        raise TypeError(f"{name} must be a real number or an array of real numbers; got {value!r}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):     # a ragged list, an object numpy cannot read
        raise TypeError(f"{name} must be a real number or an array of real numbers; "
                        f"got {type(value).__name__}") from None
    if arr.dtype.kind == "O":
        items = arr.reshape(-1).tolist()
        if any(isinstance(x, (bool, np.bool_)) for x in items):
            raise TypeError(f"{name} must hold real numbers; got a bool")
        integers = all(isinstance(x, (numbers.Integral, np.integer)) for x in items)
        try:
            arr = arr.astype(np.int64 if integers else np.float64)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{name} must hold real numbers; got an array of {arr.dtype}") from None
    elif arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold real numbers; got an array of {arr.dtype}")
    return arr


def _where(name: str, arr: np.ndarray, i: int) -> str:
    return f"{name}[{i}]" if arr.ndim else name


def _check_values(name: str, value, what: str | None = None) -> np.ndarray:
    """Validate per-batch values of aggregate ``name`` (any shape): ``size``
    an integer >= 1 (a count: floats are a ``TypeError``), token lengths and
    times finite and >= 0.  Returns a float64 array; ``what`` names the
    values in messages (default ``name``)."""
    what = what or name
    arr = _real_values(what, value)
    flat = arr.reshape(-1)
    if name == "size":
        if arr.dtype.kind == "f":
            bad = ~np.isfinite(flat)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{what} must hold integers in [1, inf) (requests); got "
                                 f"{_where(what, arr, i)} = {_show(flat[i])}")
            raise TypeError(f"{what} must hold integers in [1, inf) (requests); got floats ({arr.dtype})")
        bad = flat < 1
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{what} must hold integers in [1, inf) (requests); got "
                             f"{_where(what, arr, i)} = {int(flat[i])}")
        return arr.astype(np.float64)
    arr = arr.astype(np.float64)
    flat = arr.reshape(-1)
    bad = ~(np.isfinite(flat) & (flat >= 0.0))
    if bad.any():
        i = int(np.argmax(bad))
        kind = "finite" if not np.isfinite(flat[i]) else "in [0, inf)"
        raise ValueError(f"{what} must be {kind} ({_UNITS[name]}); got {_where(what, arr, i)} = {_show(flat[i])}")
    return arr


def _scalar_or_array(x):
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


def extra_experts(experts: int, experts_per_token: int, tokens):
    """Experts of a mixture-of-experts layer an iteration of ``tokens`` tokens
    reads beyond its first token's ``k``: ``(E - k) (1 - (1 - k/E)^(T - 1))``
    for ``T >= 1`` tokens, 0 for none or a dense model (``E = 0``).

    Each token is routed to ``k`` of the layer's ``E`` experts; with the
    routing balanced (Fedus et al., 2022, "Switch Transformers",
    arXiv:2101.03961; Jiang et al., 2024, "Mixtral of experts",
    arXiv:2401.04088, 8 experts, top-2) an expert is missed by one token with
    probability ``1 - k/E``, so ``T`` independent tokens read ``E (1 - (1 -
    k/E)^T)`` experts in expectation: the weights a decode iteration reads
    grow with its batch and saturate once every expert is read.  Vectorized
    over ``tokens``.

    >>> [round(float(x), 3) for x in extra_experts(8, 2, [0, 1, 2, 16, 2048])]
    [0.0, 0.0, 1.5, 5.92, 6.0]
    """
    t = np.asarray(tokens, dtype=np.float64)
    if experts == 0:
        return np.zeros_like(t)
    m = float(experts - experts_per_token)
    q = 1.0 - experts_per_token / experts
    return np.where(t >= 1.0, m * (1.0 - q ** np.maximum(t - 1.0, 0.0)), 0.0)


def _decode_expert_reads(experts, experts_per_token, o, starts, sizes):
    """Per batch, the experts its decode iterations read beyond their first
    tokens' (:func:`extra_experts` x), finished members leaving: with the
    members' decode steps ``d`` sorted, ``d_(i) - d_(i-1)`` iterations decode
    the ``b - i + 1`` members left, so the batch reads ``sum_i d_(i) (x(b - i
    + 1) - x(b - i))``; each member's term by its rank (equal steps in member
    order), summed in member order, as the kernels do."""
    d = np.maximum(o - 1.0, 0.0)
    batch = np.repeat(np.arange(sizes.size), sizes)
    order = np.lexsort((np.arange(d.size), d, batch))
    rank = np.empty(d.size, np.int64)
    rank[order] = np.arange(d.size) - np.repeat(starts, sizes)      # 0, 1, ... within each batch
    left = (np.repeat(sizes, sizes) - rank).astype(np.float64)
    share = d * (extra_experts(experts, experts_per_token, left) - extra_experts(experts, experts_per_token,
                                                                                  left - 1.0))
    # (sequential sums, member by member: the kernels' order)
    return np.array([np.cumsum(share[a:a + b])[-1] for a, b in zip(starts, sizes)], dtype=np.float64)


def batch_aggregates(prompt, output, sizes=None, experts=DENSE) -> BatchAggregates:
    """The aggregates of consecutive batches, from their members' lengths.

    Parameters
    ----------
    prompt, output : array_like of float, shape (n,)
        Prompt and output lengths of the members, tokens (finite, >= 0),
        batch by batch: batch 0's ``sizes[0]`` members first, then batch 1's.
    sizes : array_like of int, shape (m,), optional
        Members of each batch, requests (>= 1, summing to n); default one
        batch of all n.
    experts : (int, int), optional
        ``(E, k)`` of a mixture-of-experts model (:class:`IterationModel`'s
        ``experts`` and ``experts_per_token``) for ``expert_reads``; ``E =
        0``, the default: a dense model, none.

    Returns
    -------
    BatchAggregates
        Per batch: its size, the largest ``prompt + output``, the largest
        output, the summed prompts, its members' decode steps and the
        context they attend over (numpy's summation order: for whole-token
        lengths, exactly the kernel's sequential sums), and the experts its
        decode iterations read (finished members leaving; its prefill
        iteration's follow from the summed prompts).

    Examples
    --------
    >>> agg = batch_aggregates([10, 20, 5], [5, 50, 7], sizes=[2, 1])
    >>> agg.size.tolist(), agg.max_seq_len.tolist(), agg.max_output.tolist(), agg.sum_prompt.tolist()
    ([2, 1], [70.0, 12.0], [50.0, 7.0], [30.0, 5.0])
    """
    p = _check_values("sum_prompt", prompt, "prompt")
    o = _check_values("max_output", output, "output")
    if p.ndim != 1 or o.ndim != 1 or p.size == 0 or p.shape != o.shape:
        raise ValueError(f"prompt and output must be non-empty 1-D sequences of one length; got shapes "
                         f"{p.shape} and {o.shape}")
    n = p.size
    if sizes is None:
        sizes = np.array([n], dtype=np.int64)
    else:
        sizes = _check_values("size", sizes, "sizes").astype(np.int64)
        if sizes.ndim != 1 or sizes.size == 0:
            raise ValueError(f"sizes must be a non-empty 1-D sequence; got shape {sizes.shape}")
        if int(sizes.sum()) != n:
            raise ValueError(f"sizes must sum to the {n} members of prompt and output; got sum(sizes) = "
                             f"{int(sizes.sum())}")
    e, k = _check_experts("batch_aggregates", experts)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    d = np.maximum(o - 1.0, 0.0)
    sum_prompt = np.add.reduceat(p, starts)
    reads = _decode_expert_reads(e, k, o, starts, sizes) if e else np.zeros(sizes.size)
    return BatchAggregates(size=sizes, max_seq_len=np.maximum.reduceat(p + o, starts),
                           max_output=np.maximum.reduceat(o, starts), sum_prompt=sum_prompt,
                           sequence_steps=np.add.reduceat(d, starts),
                           context_steps=np.add.reduceat(p * d + d * (d + 1.0) / 2.0, starts),
                           expert_reads=reads, prefill_squares=np.add.reduceat(_cost.prefill_square.py_func(0.0, p),
                                                                               starts))


def _check_experts(owner: str, experts) -> tuple:
    """``experts``, ``(E, k)``, checked: E >= 0 experts, 1 <= k <= E when E > 0."""
    try:
        e, k = (int(x) for x in experts)
        ok = all(float(x) == int(x) for x in experts)
    except (TypeError, ValueError):
        ok = False
    if not ok or e < 0 or k < 1 or (e and k > e):
        raise ValueError(f"{owner}: experts must be (E, k), E >= 0 experts per layer (0: a dense model) and k "
                         f"in [1, E] experts per token; got {experts!r}")
    return e, k


def uniform_aggregates(size, prompt, output, experts=DENSE) -> dict:
    """The aggregates of uniform batches: ``size`` requests, each of
    ``prompt`` prompt tokens generating ``output`` tokens (what accelerator
    benchmarks measure), broadcast together; as :func:`batch_aggregates`
    computes them for such a batch (for whole tokens, exactly; its expert
    reads to rounding)."""
    b = _check_values("size", size)
    p = _check_values("prompt", prompt)
    o = _check_values("output", output)
    b, p, o = np.broadcast_arrays(b, p, o)
    d = np.maximum(o - 1.0, 0.0)
    e, k = experts
    reads = d * extra_experts(e, k, b) if e else np.zeros(b.shape)
    return dict(size=b.astype(np.int64), max_seq_len=p + o, max_output=o.astype(np.float64), sum_prompt=b * p,
                sequence_steps=b * d, context_steps=b * (p * d + d * (d + 1.0) / 2.0), expert_reads=reads,
                prefill_squares=b * _cost.prefill_square.py_func(0.0, p))


def _h(gamma: float, size: np.ndarray) -> np.ndarray:
    """``1 + gamma (b-1)/max(1, b)``, in the kernel's order of operations."""
    return 1.0 + gamma * (size - 1.0) / np.maximum(1.0, size)


# --- fitting ---------------------------------------------------------------------------
