"""Batch service models: how long a batch takes, from its members' lengths.

A batch's service time comes from one of six models, chosen by class:

- :class:`MaxModel`: the multi-bin paper's max of member service times, each
  ``base + per_token * output_len`` (Section 6.1's linear fit); with
  ``base = 0, per_token = 1`` a request's output length is its service time
  in s, which is how the paper's model (``service=dist``) is one case of the
  request model;
- :class:`LinearModel`: ``base + alpha * max_seq_len * (1 + beta (b-1)/b)``
  with ``max_seq_len = max(prompt + output)``;
- :class:`DecodeModel`: ``prefill + TBT(b) * max output_len`` with
  ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` (calibrated beta = 5.74 ms,
  gamma = 0.316) and ``prefill = prefill_per_token * sum(prompt_len)``;
- :class:`CalibratedModel`: Pang et al.'s calibrated
  latency model on its ``service_time_fn(|batch|, max_seq_len)``:
  ``alpha + beta * max_seq_len * h(b)``, ``h(b) = 1 + gamma (b-1)/max(1, b)``,
  with Algorithm 7's feedback ``beta h(b)`` (``feedback="calibrated"``), its
  uncalibrated fallback 5.74 ms (``"uncalibrated"``) or the legacy
  ``service / max output_len`` (``"legacy"``);
- :class:`PrefillModel`: ``a + b * sum(prompt_len)``, a prefill batch that
  decodes nothing (LAPS's prefill instances);
- :class:`IterationModel`: the time of one engine iteration, linear in what
  it does (its prefill tokens, the sequences it decodes and the context
  tokens they attend over), and a batch's time as its prefill iteration then
  one decode iteration per token step: the cost model fitted to measured
  accelerators (:mod:`mbbatch.profiles`).

Every model but :class:`PrefillModel` times the token-level policies; :class:`~mbbatch.MultiBin` on a
workload takes :class:`MaxModel` (the paper's) or :class:`IterationModel`,
whose expected batch time under multi-bin batching is
:func:`mbbatch.theory.iteration_batch_service_time`.

The defaults of :class:`DecodeModel` and :class:`CalibratedModel` (5.74 ms,
0.316) reproduce the dynamic-batching paper's experiments (Pang et al.,
2025, arXiv:2503.05248); they are not measurements of ours.

Each model also states its formulas in numpy, for whole arrays of batches:
``service_time(size, max_seq_len, max_output, sum_prompt)``, what Algorithm 7
feeds the SLA controller (``feedback_tbt``), and all four per-batch numbers
the event kernel computes (``times``: service, decode TBT, time per output
token, time to first token); ``batch_times(prompt, output, sizes)`` starts from
the members' lengths.  These are the references the kernel must equal.
``Model.fit(measurements)`` fits a model's parameters to measured batch
times by least squares, and states its error in and out of sample
(:class:`FitResult`).

Parameters, their domains and defaults are those of the parameter table
(:mod:`mbbatch.params`).

The dynamic-batching paper cited is Pang, Li and Wang, "Optimizing LLM
Inference Throughput via Memory-aware and SLA-constrained Dynamic
Batching", 2025, arXiv:2503.05248 (Algorithms 3 and 7, and its
ComputeDecodeTBT).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import ClassVar, NamedTuple

import numpy as np

from ._kernels import dynamic as _d
from ._validation import check_fields
from .params import MAX_KV_TOKENS, MAX_MEASURED_TIME, PARAMS, Domain, default

__all__ = ["MaxModel", "LinearModel", "DecodeModel", "CalibratedModel", "PrefillModel", "IterationModel",
           "SERVICE_MODELS", "UNCALIBRATED_TBT", "BatchTimes", "BatchAggregates", "batch_aggregates", "FitResult",
           "extra_experts"]

#: the kernel's code of CalibratedModel's feedback rules
_FEEDBACK_CODES = {"calibrated": _d.MODEL_CALIBRATED, "uncalibrated": _d.MODEL_CALIBRATED_UNCALIBRATED,
                   "legacy": _d.MODEL_CALIBRATED_LEGACY}
#: ComputeDecodeTBT's value when the latency model is not calibrated, s/token
#: (Pang et al.'s ComputeDecodeTBT: a default of 5.74 ms), as the kernel feeds it.
UNCALIBRATED_TBT = _d.UNCALIBRATED_TBT

#: ``(experts, experts_per_token)`` of a dense model: the parameter table's defaults (no experts)
DENSE = (default("IterationModel.experts"), default("IterationModel.experts_per_token"))
#: the kernels' mixture-of-experts fields of a model without the term (per expert 0, so no experts read)
DENSE_FIELDS = MappingProxyType(dict(per_expert=0.0, expert_span=0.0, expert_miss=1.0))

# the per-batch aggregates the models read, with their units
_UNITS = {"size": "requests", "max_seq_len": "tokens", "max_output": "tokens", "sum_prompt": "tokens",
          "sequence_steps": "sequence-steps", "context_steps": "token-steps", "expert_reads": "experts",
          "prompt": "tokens",
          "output": "tokens", "service": "s", "prefill": "s", "per_token": "s/token"}
#: the aggregates a model's formulas read, in the order of the methods' arguments
_AGGREGATES = ("size", "max_seq_len", "max_output", "sum_prompt", "sequence_steps", "context_steps", "expert_reads")
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
    """

    size: np.ndarray
    max_seq_len: np.ndarray
    max_output: np.ndarray
    sum_prompt: np.ndarray
    sequence_steps: np.ndarray
    context_steps: np.ndarray
    expert_reads: np.ndarray


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
                           expert_reads=reads)


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
                sequence_steps=b * d, context_steps=b * (p * d + d * (d + 1.0) / 2.0), expert_reads=reads)


def _h(gamma: float, size: np.ndarray) -> np.ndarray:
    """``1 + gamma (b-1)/max(1, b)``, in the kernel's order of operations."""
    return 1.0 + gamma * (size - 1.0) / np.maximum(1.0, size)


# --- fitting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FitResult:
    """A service model fitted to measured batch times by least squares.

    Attributes
    ----------
    model : a service model, or None
        The fitted model; None when the best fit puts a parameter whose
        domain is open at 0 (a time per token) at 0: no model of the class
        has it, and ``at_bound`` and :attr:`note` say which.
    params : dict
        The fitted parameters by field name (units as the model's fields).
    stderr : dict
        Their standard errors, from the Jacobian of the fitted times at the
        fit: the square roots of the diagonal of ``covariance``.  Exact (for
        independent errors of one variance, in the weighted residuals) where
        the time is linear in the parameter; first order for the ratios
        (``LinearModel.beta``, ``DecodeModel.gamma``,
        ``CalibratedModel.gamma``), accurate while their divisor's relative
        error is small.  For parameters in ``at_bound`` they are those of the
        unconstrained fit at that point.
    covariance : ndarray, shape (p, p)
        ``s**2 (J^T W J)^-1`` with ``s**2 = RSS_w / dof``, in the order of ``params``.
    rmse : float
        Root mean square of the residuals ``measured - model``, s (s/token
        on ``per_token`` rows).
    r2 : float
        Coefficient of determination, ``1 - RSS / sum((measured - mean)**2)``
        (unweighted; NaN if every measured time is the same).
    n : int
        Measured times fitted (rows times the columns timed).
    dof : int
        Residual degrees of freedom, ``n - p``.
    at_bound : tuple of str
        Parameters the bounds hold at 0 (the unconstrained least squares
        would make them negative).
    weights : str
        ``"absolute"``: least squares of the residuals; ``"relative"``: of
        the residuals relative to the measured times.
    median_error, max_error : float
        Median and largest relative error ``|model - measured| / measured``
        of the rows fitted (in sample).
    holdout_error : float
        Median relative error of each row predicted by the model fitted
        without it (leave-one-out; 10-fold, rows ``i % 10`` held out in
        turn, above 200 rows); NaN where the held-out fits are undetermined.
    holdout : str
        ``"leave-one-out"``, ``"10-fold"``, or ``"none"`` (``fit(...,
        holdout=False)``: not estimated).
    holdout_errors : ndarray
        Each positive measured time's relative error held out (NaN where its held-out
        fit is undetermined): ``holdout_error`` is their median; two models'
        on the same rows compare row by row (e.g. a Wilcoxon signed-rank
        test, ``scipy.stats.wilcoxon``).
    """

    model: object
    params: dict
    stderr: dict
    covariance: np.ndarray = field(repr=False)
    rmse: float
    r2: float
    n: int
    dof: int
    at_bound: tuple = ()
    weights: str = "absolute"
    median_error: float = math.nan
    max_error: float = math.nan
    holdout_error: float = math.nan
    holdout: str = "leave-one-out"
    holdout_errors: np.ndarray = field(default=None, repr=False)

    @property
    def note(self) -> str:
        """What the bounds did: empty when no parameter is held."""
        if not self.at_bound:
            return ""
        if self.model is None:
            return (f"the best fit holds {', '.join(self.at_bound)} at 0, outside the domain of the model's "
                    "parameters: no model is returned (the measured times do not grow with what it multiplies)")
        return f"the best fit holds {', '.join(self.at_bound)} at 0, the bound of the domain"

    def __str__(self) -> str:
        name = type(self.model).__name__ if self.model is not None else "no model (a parameter at its bound)"
        lines = [f"{name} fitted to {self.n} measured times ({self.weights} least squares): rmse = "
                 f"{self.rmse:.6g} s, R^2 = {self.r2:.6f}, relative error median {self.median_error:.2%}, "
                 f"max {self.max_error:.2%}" + (f", {self.holdout} {self.holdout_error:.2%}"
                                               if self.holdout != "none" else "")]
        for k, v in self.params.items():
            mark = " (at bound)" if k in self.at_bound else ""
            lines.append(f"  {k} = {v:.6g} +/- {self.stderr[k]:.3g}{mark}")
        return "\n".join(lines)


def _available_columns(owner: str, measurements) -> list:
    """The column names of ``measurements`` (a DataFrame, a mapping of arrays,
    a structured array, an xarray Dataset or an :class:`mbbatch.results.Table`)."""
    if isinstance(measurements, np.ndarray):
        if measurements.dtype.names is None:
            raise TypeError(f"{owner}: measurements must be a DataFrame, a dict of arrays or a structured array "
                            f"with named fields; got an ndarray of {measurements.dtype} without field names")
        return list(measurements.dtype.names)
    if isinstance(measurements, (str, bytes)) or not hasattr(measurements, "__getitem__"):
        raise TypeError(f"{owner}: measurements must be a DataFrame, a dict of arrays or a structured array; "
                        f"got {type(measurements).__name__}")
    if hasattr(measurements, "keys"):
        return list(measurements.keys())
    if hasattr(measurements, "columns"):
        return list(measurements.columns)
    raise TypeError(f"{owner}: measurements must be a DataFrame, a dict of arrays or a structured array; "
                    f"got {type(measurements).__name__}")


#: a fit's measured times (s) and token counts, sizes and aggregates
_MEASURED_TIMES = Domain(0.0, MAX_MEASURED_TIME, lo_closed=True, hi_closed=True)
_MEASURED_COUNTS = Domain(0.0, MAX_KV_TOKENS, lo_closed=True)


def _measurement_columns(owner: str, measurements, names: tuple, optional: tuple = ()) -> dict:
    """The columns ``names`` (and those of ``optional`` present) of
    ``measurements``, each validated and as float64, of one length."""
    available = _available_columns(owner, measurements)
    missing = [k for k in names if k not in available]
    if missing:
        need = ", ".join(f"{k} ({_UNITS[k]})" for k in names)
        raise ValueError(f"{owner} needs the columns {need}; measurements lack {', '.join(missing)} "
                         f"(its columns: {', '.join(map(str, available)) or 'none'})")
    cols = {}
    for k in (*names, *(k for k in optional if k in available and k not in names)):
        arr = _check_values(k, np.asarray(measurements[k]), f"column {k}")
        if arr.ndim != 1:
            raise ValueError(f"{owner}: column {k} must be 1-D; got shape {arr.shape}")
        # (measured times, lengths and aggregates in a sane range: their squares must stay finite)
        dom = (_MEASURED_TIMES if _UNITS[k] in ("s", "s/token") else _MEASURED_COUNTS)
        bad = ~dom.contains(arr) if k != "size" else np.zeros(arr.shape, bool)     # (sizes: int64 counts)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{owner}: column {k} must hold values in {dom} ({_UNITS[k]}); got "
                             f"{_where(f'column {k}', arr, i)} = {_show(float(arr[i]))}")
        cols[k] = arr
    lengths = {k: v.size for k, v in cols.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{owner}: the columns must have one length; got "
                         + ", ".join(f"{k}: {m}" for k, m in lengths.items()))
    return cols


def _least_squares(owner: str, design: np.ndarray, y: np.ndarray, names: tuple, hint: str):
    """Non-negative linear least squares ``design @ c ~ y``: the columns
    scaled to unit norm, the unconstrained solution (``numpy.linalg.lstsq``)
    when it is non-negative, else the bounded one (``scipy.optimize.nnls``,
    Lawson and Hanson's active set method, exact for these few columns).
    Returns ``c`` and the indices held at 0."""
    norms = np.sqrt(np.sum(design * design, axis=0))
    scaled = design / np.where(norms > 0, norms, 1.0)
    # (lstsq's rank is numpy.linalg.matrix_rank's, by the same singular values and tolerance)
    c, _, rank, _ = np.linalg.lstsq(scaled, y, rcond=None)
    if np.any(norms == 0.0) or rank < design.shape[1]:
        raise ValueError(f"{owner}: the measurements do not determine {', '.join(names)} (the least-squares "
                         f"problem is rank deficient); {hint}")
    held = ()
    if np.any(c < 0.0):
        from scipy.optimize import nnls

        c, _ = nnls(scaled, y)
        held = tuple(int(i) for i in np.flatnonzero(c == 0.0))
    return c / norms, held


#: rows above which the held-out error is 10-fold rather than leave-one-out
_LOO_ROWS = 200


def _holdout_errors(design: np.ndarray, y: np.ndarray) -> tuple:
    """Relative errors of each row predicted by the fit without it (leave-one-out,
    or 10-fold above :data:`_LOO_ROWS` rows), on the weighted system
    ``design @ c ~ y`` whose rows are already weighted (relative: each row's
    target 1, so the weighted residual is the relative error; absolute: the
    caller divides).  Returns the predictions' weighted residuals and the
    scheme's name; NaN where a held-out fit is undetermined."""
    n = y.size
    folds = n if n <= _LOO_ROWS else 10
    pred = np.full(n, np.nan)
    rows = np.arange(n)
    for f in range(folds):
        out = rows % folds == f
        try:
            c, _ = _least_squares("", design[~out], y[~out], (), "")
        except ValueError:
            continue
        pred[out] = design[out] @ c
    return pred, "leave-one-out" if folds == n else "10-fold"


class _Fitted:
    """The references and :meth:`fit` shared by the models.

    A model class declares ``_service_columns`` (the aggregates its service
    time reads), ``_reads`` (those :meth:`times` reads), ``_params`` (the
    fitted fields), ``_param_keys`` (their parameter-table keys),
    ``_grows_with`` (the column each parameter open at 0 multiplies) and
    ``_fit_hint`` (what the measurements must vary), and implements
    ``_service`` and ``_times`` (the formulas, in the kernel's order of
    operations), ``_design`` (the service time as a design matrix, linear in
    coefficients ``c >= 0``, column i belonging to ``_params[i]``),
    ``_from_coef`` (coefficients to parameters) and ``_jacobian`` (of the
    service time in the parameters).  A model whose times have phases
    declares ``_phase_columns`` and implements ``_phase_design(phase,
    **cols)`` (``"prefill"``: the time to the first token; ``"per_token"``:
    the mean decode step) and ``_phase_jacobian``.
    """

    _service_columns: tuple = ()
    _reads: tuple = ()
    _params: tuple = ()
    _fit_hint: str = ""
    #: the phases a model times (other than the whole batch): {phase: aggregates read}
    _phase_columns: ClassVar[dict] = {}

    def _experts(self) -> tuple:
        """``(E, k)`` of the mixture of experts the model times, ``E = 0``: dense."""
        return DENSE

    @classmethod
    def _fixed_experts(cls, owner: str, fixed: dict) -> tuple:
        """``(E, k)`` of a fit's fixed fields (dense for a model without them)."""
        return DENSE

    @classmethod
    def _fitted_params(cls, fixed: dict) -> tuple:
        """The parameters a fit with the fields ``fixed`` fits (the others 0)."""
        return cls._params

    def _args(self, what: str, needs: tuple, given: dict, prompt=None, output=None) -> dict:
        if prompt is not None or output is not None:
            extra = [k for k, v in given.items() if v is not None and k != "size"]
            if prompt is None or output is None or given["size"] is None or extra:
                raise TypeError(f"{type(self).__name__}.{what}: uniform batches are given by size, prompt and "
                                "output (requests, tokens per request) together, without the aggregates"
                                + (f"; got also {', '.join(extra)}" if extra else ""))
            given = uniform_aggregates(given["size"], prompt, output, self._experts())
        if "expert_reads" in needs and given.get("expert_reads") is None and not self._experts()[0]:
            given = {**given, "expert_reads": 0.0}      # a dense model reads no experts
        missing = [k for k in needs if given.get(k) is None]
        if missing:
            need = ", ".join(f"{k} ({_UNITS[k]})" for k in needs)
            raise TypeError(f"{type(self).__name__}.{what} needs {need} (or size, prompt and output of uniform "
                            f"batches); {', '.join(missing)} not given")
        out = {k: _check_values(k, given[k]) for k in needs}
        if len(out) > 1:
            out = dict(zip(out, np.broadcast_arrays(*out.values())))
        if "max_seq_len" in out and "max_output" in out:
            bad = (out["max_seq_len"] < out["max_output"]).reshape(-1)
            if bad.any():
                i = int(np.argmax(bad))
                seq, top = float(out["max_seq_len"].reshape(-1)[i]), float(out["max_output"].reshape(-1)[i])
                raise ValueError("max_seq_len (the largest prompt + output) must be at least max_output; got "
                                 f"{seq!r} < {top!r} (element {i})")
        return out

    def service_time(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None, sequence_steps=None,
                     context_steps=None, expert_reads=None, *, prompt=None, output=None):
        """Service time of batches, s (Algorithm 3, step 4).

        Parameters
        ----------
        size : int or array_like of int, optional
            Batch sizes ``b``, requests (>= 1).
        max_seq_len : float or array_like, optional
            Largest ``prompt + output`` of a member, tokens (>= 0).
        max_output : float or array_like, optional
            Largest output length of a member, tokens (>= 0).
        sum_prompt : float or array_like, optional
            Summed prompt lengths of the members, tokens (>= 0).
        sequence_steps, context_steps, expert_reads : float or array_like, optional
            The members' decode steps, the context they attend over and the
            experts the batch's iterations read (:class:`BatchAggregates`;
            :class:`IterationModel` only, ``expert_reads`` that of a mixture
            of experts).
        prompt, output : float or array_like, keyword-only, optional
            Uniform batches instead of the aggregates: ``size`` requests of
            ``prompt`` prompt tokens each generating ``output`` tokens.

        Only the aggregates the model's service time reads are needed (the
        class docstring's formula); they broadcast together.

        Returns
        -------
        float or ndarray
            Service times, s.
        """
        given = dict(size=size, max_seq_len=max_seq_len, max_output=max_output, sum_prompt=sum_prompt,
                     sequence_steps=sequence_steps, context_steps=context_steps, expert_reads=expert_reads)
        a = self._args("service_time", self._service_columns, given, prompt, output)
        return _scalar_or_array(self._service(**a))

    def times(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None, sequence_steps=None,
              context_steps=None, expert_reads=None, *, prompt=None, output=None) -> BatchTimes:
        """The four per-batch numbers the event kernel computes for a batch
        (service, decode TBT, time per output token, time to first token),
        arguments as :meth:`service_time`; the model's ``_reads`` are needed."""
        given = dict(size=size, max_seq_len=max_seq_len, max_output=max_output, sum_prompt=sum_prompt,
                     sequence_steps=sequence_steps, context_steps=context_steps, expert_reads=expert_reads)
        a = self._args("times", self._reads, given, prompt, output)
        return BatchTimes(*(_scalar_or_array(x) for x in self._times(**a)))

    def feedback_tbt(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None, sequence_steps=None,
                     context_steps=None, expert_reads=None):
        """What Algorithm 7, step 2 feeds the SLA controller
        after each batch, s/token: the model's decode TBT where it provides
        one, else the legacy ``service / max(max_output, 1)`` (1 token for a
        batch of empty outputs, as the kernel).  Arguments as :meth:`times`."""
        t = self.times(size, max_seq_len, max_output, sum_prompt, sequence_steps, context_steps, expert_reads)
        legacy = t.service / np.maximum(_check_values("max_output", max_output), 1.0)
        return _scalar_or_array(np.where(np.asarray(t.decode_tbt) > 0.0, t.decode_tbt, legacy))

    def batch_times(self, prompt, output, sizes=None) -> BatchTimes:
        """:meth:`times` of consecutive batches given by their members'
        prompt and output lengths (tokens) and sizes (see :func:`batch_aggregates`)."""
        agg = batch_aggregates(prompt, output, sizes, self._experts())
        return self.times(**agg._asdict())

    @classmethod
    def _fit_rows(cls, owner: str, measurements, fixed: dict) -> tuple:
        """The measured times of ``measurements`` as one weighted-free linear
        system: ``(design, y, jacobian_fn, columns)`` with a row per measured
        time (the ``service`` column's, then ``prefill``'s, then ``per_token``'s)."""
        available = _available_columns(owner, measurements)
        targets = [t for t in _TARGETS if t in available]
        if not targets:
            raise ValueError(f"{owner} needs at least one measured time: a column service (s, the whole batch), "
                             f"prefill (s, to the first token) or per_token (s, the mean decode step); "
                             f"measurements have {', '.join(map(str, available)) or 'no columns'}")
        for t in targets:
            if t != "service" and t not in cls._phase_columns:
                phases = " and ".join(cls._phase_columns) if cls._phase_columns else "no phase"
                raise ValueError(f"{owner}: measurements have a {t} column, which {cls.__name__} cannot fit "
                                 f"(it times {phases} of a batch apart); fit IterationModel or DecodeModel, or drop "
                                 "the column")
        needs = set(cls._service_columns) if "service" in targets else set()
        for t in targets:
            if t != "service":
                needs |= set(cls._phase_columns[t])
        needs = tuple(k for k in _AGGREGATES if k in needs)
        uniform = all(k in available for k in ("size", "prompt", "output")) and not all(
            k in available for k in needs)
        if uniform:
            cols = _measurement_columns(owner, measurements, ("size", "prompt", "output"), targets)
            agg = uniform_aggregates(cols.pop("size").astype(np.int64), cols.pop("prompt"), cols.pop("output"),
                                     cls._fixed_experts(owner, fixed))
            cols.update({k: agg[k] for k in needs})
        else:
            dense = "expert_reads" in needs and not cls._fixed_experts(owner, fixed)[0]
            cols = _measurement_columns(owner, measurements, tuple(k for k in needs if not (
                dense and k == "expert_reads")), targets)
            if dense:       # a dense model reads no experts
                cols["expert_reads"] = np.zeros_like(cols["sum_prompt"])
        agg = {k: cols[k] for k in needs}
        designs, ys, kinds = [], [], []
        for t in targets:
            y = cols[t]
            rows = np.ones(y.size, bool)
            if t == "per_token":
                # the mean decode step of a batch that decodes (its longest output 2 tokens or more)
                rows = agg["max_output"] >= 2.0 if "max_output" in agg else rows
            sub = {k: v[rows] for k, v in agg.items()}
            designs.append(cls._design_for(fixed, t, sub))
            ys.append(y[rows])
            kinds.append((t, sub))
        return np.vstack(designs), np.concatenate(ys), kinds

    @classmethod
    def fit(cls, measurements, weights: str = "absolute", holdout: bool = True, **fixed) -> FitResult:
        """Fit the model's parameters to measured batch times.

        The times are linear in coefficients ``c >= 0`` (products such as
        ``beta * gamma`` where the model multiplies parameters), so the fit
        is a non-negative linear least squares (``numpy.linalg.lstsq``,
        ``scipy.optimize.nnls`` where a bound binds): the global least-
        squares optimum over the parameters' closed domains.  Standard errors
        come from the Jacobian of the times in the model's own parameters.

        Parameters
        ----------
        measurements : pandas.DataFrame, dict of array_like, or structured ndarray
            One row per measured batch.  Its batch: ``size`` (requests),
            ``prompt`` and ``output`` (tokens per request, uniform batches, as
            accelerator benchmarks run them), or instead the aggregates the
            model reads (:func:`batch_aggregates`: ``MaxModel``:
            ``max_output``; ``LinearModel``, ``CalibratedModel``: ``size``,
            ``max_seq_len``; ``DecodeModel``: ``size``, ``sum_prompt``,
            ``max_output``; ``PrefillModel``: ``sum_prompt``;
            ``IterationModel``: ``size``, ``sum_prompt``, ``max_output``,
            ``sequence_steps``, ``context_steps``).  Its times, at least one:
            ``service`` (s, the whole batch), ``prefill`` (s, from its start
            to its first token) and ``per_token`` (s, its mean decode step),
            each used where present (the phases where the model times them:
            :class:`IterationModel`, :class:`DecodeModel` and
            :class:`CalibratedModel` both; :class:`PrefillModel` ``prefill``;
            :class:`MaxModel`, :class:`LinearModel` ``per_token``).  Sizes
            are integers >= 1, times in [0, 2**30] s
            (:data:`~mbbatch.params.MAX_MEASURED_TIME`), lengths and the
            other aggregates in [0, 2**62).  At least
            one measured time more than the model has parameters.  Other
            columns are ignored.
        weights : {"absolute", "relative"}
            ``"absolute"``: least squares of the residuals, s; ``"relative"``:
            of the residuals relative to the measured times (for times that
            span orders of magnitude, as batches of 1 to 256 requests of 128
            to 2,048 tokens do); every measured time must then be positive.
        holdout : bool
            Whether to estimate the held-out error (``holdout_error``), which
            refits without each row (leave-one-out, 10-fold above 200 rows):
            most of a fit's time.  ``False`` skips it (``holdout`` is
            ``"none"``, the held-out errors NaN), for fits repeated many
            times (a bootstrap, a Monte Carlo of the fit).
        **fixed
            Fields that are not fitted, passed to the model (``feedback``
            of :class:`CalibratedModel`, ``finished`` of :class:`IterationModel`).

        Returns
        -------
        FitResult
            With the fit's error in sample and held out.  A best fit on the
            bound of a parameter's domain is returned, the parameter named
            in ``at_bound`` (and no model where that domain is open there).

        Raises
        ------
        TypeError
            ``measurements`` is not a table, a column is not numeric, or
            ``size`` holds floats.
        ValueError
            A column is missing, non-finite or out of its domain; a phase the
            model does not time; too few rows; the rows do not determine the
            parameters (e.g. one batch size only).
        """
        owner = f"{cls.__name__}.fit"
        bad = [k for k in fixed if k not in cls._fixed_fields()]
        if bad:
            raise TypeError(f"{owner}: {bad[0]} is {'fitted' if bad[0] in cls._params else 'not a field'}; "
                            f"the fields it takes fixed are: {', '.join(cls._fixed_fields()) or 'none'}")
        if weights not in ("absolute", "relative"):
            raise ValueError(f"{owner}: weights must be 'absolute' or 'relative'; got {weights!r}")
        if not isinstance(holdout, (bool, np.bool_)):
            raise TypeError(f"{owner}: holdout must be True or False; got {holdout!r}")
        design, y, kinds = cls._fit_rows(owner, measurements, fixed)
        active = cls._fitted_params(fixed)
        # the columns of the parameters fitted (a dense IterationModel fits no per_expert), C-ordered
        # as the whole design is (the sums of least squares run in the same order)
        cols = slice(None) if active == cls._params else [cls._params.index(k) for k in active]
        design_fit = np.ascontiguousarray(design[:, cols])
        p = len(active)
        n = y.size
        if n < p + 1:
            raise ValueError(f"{owner} needs at least {p + 1} measurement rows for {p} parameters "
                             f"({', '.join(active)}) and an error estimate; got {n}")
        if weights == "relative":
            if np.any(y <= 0.0):
                i = int(np.argmax(y <= 0.0))
                raise ValueError(f"{owner}: weights='relative' needs measured times > 0; got {float(y[i])!r} "
                                 f"(measured time {i})")
            w = 1.0 / y
        else:
            w = np.ones_like(y)
        fit_coef, held = _least_squares(owner, design_fit * w[:, None], y * w, active, cls._fit_hint)
        coef = np.zeros(len(cls._params))
        coef[cols] = fit_coef
        params = cls._from_coef(coef)
        at_bound = tuple(active[i] for i in held)
        outside = [name for name in cls._params
                   if params[name] == 0.0 and not PARAMS[cls._param_keys[name]].domain.lo_closed]
        at_bound = tuple(dict.fromkeys(at_bound + tuple(outside)))
        model = None if outside else cls(**params, **fixed)
        fitted = design @ coef
        resid = y - fitted
        wr = resid * w
        rss_w = float(wr @ wr)
        dof = n - p
        jac = np.ascontiguousarray(np.vstack([cls._jacobian_for(fixed, t, params, sub)
                                              for t, sub in kinds])[:, cols]) * w[:, None]
        norms = np.sqrt(np.sum(jac * jac, axis=0))
        nz = np.where(norms > 0, norms, 1.0)
        fit_cov = (rss_w / dof) * np.linalg.pinv((jac / nz).T @ (jac / nz)) / np.outer(nz, nz)
        # a parameter the times do not move at the fit (its Jacobian column 0): no standard error
        fit_cov[norms == 0, :] = fit_cov[:, norms == 0] = math.nan
        cov = np.full((len(cls._params), len(cls._params)), math.nan)
        cov[np.ix_(np.arange(len(cls._params))[cols], np.arange(len(cls._params))[cols])] = fit_cov
        tss = float(np.sum((y - y.mean()) ** 2))
        rss = float(resid @ resid)
        pos = y > 0.0
        rel = np.abs(resid[pos]) / y[pos]
        if holdout:
            pred, scheme = _holdout_errors(design_fit * w[:, None], y * w)
            held_rel = np.abs(pred / w - y)[pos] / y[pos]
        else:
            scheme, held_rel = "none", np.full(int(pos.sum()), math.nan)
        return FitResult(model=model, params=params,
                         stderr={k: float(math.sqrt(max(cov[i, i], 0.0))) for i, k in enumerate(cls._params)},
                         covariance=cov, rmse=math.sqrt(rss / n), r2=1.0 - rss / tss if tss > 0 else math.nan,
                         n=int(n), dof=int(dof), at_bound=at_bound, weights=weights,
                         median_error=float(np.median(rel)) if rel.size else math.nan,
                         max_error=float(np.max(rel)) if rel.size else math.nan,
                         holdout_error=float(np.nanmedian(held_rel)) if np.isfinite(held_rel).any() else math.nan,
                         holdout=scheme, holdout_errors=held_rel)

    @classmethod
    def _fixed_fields(cls) -> tuple:
        return tuple(f.name for f in fields(cls) if f.name not in cls._params)

    @classmethod
    def _design_for(cls, fixed: dict, phase: str, cols: dict) -> np.ndarray:
        """The design matrix of measured times of ``phase`` (``"service"``,
        ``"prefill"``, ``"per_token"``) of the rows' aggregates ``cols``."""
        if phase == "service":
            return cls._design(**{k: cols[k] for k in cls._service_columns})
        return cls._phase_design(phase, **cols)

    @classmethod
    def _jacobian_for(cls, fixed: dict, phase: str, params: dict, cols: dict) -> np.ndarray:
        """The Jacobian of those times in the model's parameters at ``params``."""
        if phase == "service":
            return cls._jacobian(params, **{k: cols[k] for k in cls._service_columns})
        return cls._phase_jacobian(phase, params, **cols)


@dataclass(frozen=True)
class MaxModel(_Fitted):
    """Batch service = max over members of ``base + per_token * output_len`` (s).

    That is ``base + per_token * max_output`` (``per_token > 0``); Algorithm 7
    gets no decode TBT from it, so the controller is fed the legacy
    ``service / max(max_output, 1)``, which is also its time per output token
    and its time to first token.

    Parameters
    ----------
    base : float
        Fixed time per request (and so per batch), s, >= 0.
    per_token : float
        Time per output token, s/token, > 0.
    """

    base: float = default("base")
    per_token: float = default("per_token")
    code = 0
    _service_columns = ("max_output",)
    _reads = ("max_output",)
    _params = ("base", "per_token")
    _param_keys: ClassVar[dict] = {"base": "base", "per_token": "per_token"}
    _grows_with: ClassVar[dict] = {"per_token": "max_output"}
    _fit_hint = "max_output must take at least two values"
    _phase_columns: ClassVar[dict] = {"per_token": ("max_output",)}

    def __post_init__(self):
        check_fields(self, {"base": "base", "per_token": "per_token"})

    def kernel_fields(self) -> dict:
        """The event kernel's fields of the model (``_kernels.dynamic.MODEL``)."""
        return dict(model=_d.MODEL_MAX, base=self.base, per_token=self.per_token)

    def one_request(self, prompt: float, output: float) -> float:
        """Service time of a batch of one request of these lengths, s."""
        return self.base + self.per_token * output

    def _service(self, max_output, **_):
        return self.base + self.per_token * max_output

    def _times(self, max_output, **_):
        service = self._service(max_output)
        tpot = service / np.maximum(max_output, 1.0)
        return service, np.zeros_like(service), tpot, tpot

    @staticmethod
    def _design(max_output):
        return np.column_stack([np.ones_like(max_output), max_output])

    @staticmethod
    def _from_coef(c):
        return {"base": float(c[0]), "per_token": float(c[1])}

    @staticmethod
    def _jacobian(params, max_output):
        return np.column_stack([np.ones_like(max_output), max_output])

    @classmethod
    def _phase_design(cls, phase, max_output, **_):
        # its time per output token, service / max(max_output, 1)
        return cls._design(max_output) / np.maximum(max_output, 1.0)[:, None]

    @classmethod
    def _phase_jacobian(cls, phase, params, max_output, **_):
        return cls._jacobian(params, max_output) / np.maximum(max_output, 1.0)[:, None]


@dataclass(frozen=True)
class LinearModel(_Fitted):
    """Batch service = ``base + alpha * max_seq_len * (1 + beta (b-1)/b)`` (s).

    Algorithm 7 gets no decode TBT from it: the controller is fed the legacy
    ``service / max(max_output, 1)``, which is also its time per output token
    and its time to first token.

    Parameters
    ----------
    base : float
        Fixed time per batch, s, >= 0.
    alpha : float
        Time per token of the longest prompt + output, s/token, > 0.
    beta : float
        Relative cost of batching, times ``(b-1)/b``, >= 0.
    """

    base: float = default("base")
    alpha: float = default("LinearModel.alpha")
    beta: float = default("LinearModel.beta")
    code = 1
    _service_columns = ("size", "max_seq_len")
    _reads = ("size", "max_seq_len", "max_output")
    _params = ("base", "alpha", "beta")
    _param_keys: ClassVar[dict] = {"base": "base", "alpha": "LinearModel.alpha", "beta": "LinearModel.beta"}
    _grows_with: ClassVar[dict] = {"alpha": "max_seq_len"}
    _fit_hint = "max_seq_len must vary, and size too, with at least one batch of two or more requests"
    _phase_columns: ClassVar[dict] = {"per_token": ("size", "max_seq_len", "max_output")}

    def __post_init__(self):
        check_fields(self, {"base": "base", "alpha": "LinearModel.alpha", "beta": "LinearModel.beta"})

    def kernel_fields(self) -> dict:
        """The event kernel's fields of the model (``_kernels.dynamic.MODEL``)."""
        return dict(model=_d.MODEL_LINEAR, base=self.base, alpha=self.alpha, beta=self.beta)

    def one_request(self, prompt: float, output: float) -> float:
        """Service time of a batch of one request of these lengths, s."""
        return self.base + self.alpha * (prompt + output)

    def _service(self, size, max_seq_len, **_):
        return self.base + self.alpha * max_seq_len * (1.0 + self.beta * (size - 1.0) / size)

    def _times(self, size, max_seq_len, max_output, **_):
        service = self._service(size, max_seq_len)
        tpot = service / np.maximum(max_output, 1.0)
        return service, np.zeros_like(service), tpot, tpot

    @staticmethod
    def _design(size, max_seq_len):
        x = (size - 1.0) / size
        return np.column_stack([np.ones_like(size), max_seq_len, max_seq_len * x])

    @staticmethod
    def _from_coef(c):
        return {"base": float(c[0]), "alpha": float(c[1]), "beta": float(c[2] / c[1]) if c[1] > 0 else 0.0}

    @staticmethod
    def _jacobian(params, size, max_seq_len):
        x = (size - 1.0) / size
        return np.column_stack([np.ones_like(size), max_seq_len * (1.0 + params["beta"] * x),
                                params["alpha"] * max_seq_len * x])

    @classmethod
    def _phase_design(cls, phase, size, max_seq_len, max_output, **_):
        # its time per output token, service / max(max_output, 1)
        return cls._design(size, max_seq_len) / np.maximum(max_output, 1.0)[:, None]

    @classmethod
    def _phase_jacobian(cls, phase, params, size, max_seq_len, max_output, **_):
        return cls._jacobian(params, size, max_seq_len) / np.maximum(max_output, 1.0)[:, None]


@dataclass(frozen=True)
class DecodeModel(_Fitted):
    """Batch service = ``prefill_per_token * sum(prompt) + TBT(b) * max(output)``,
    ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` s/token.

    The defaults (5.74 ms, 0.316) are the dynamic-batching paper's calibration
    (Pang et al., 2025, arXiv:2503.05248), kept to reproduce its experiments:
    not a measurement of ours, and flatter in ``b`` than measured
    accelerators (:class:`IterationModel`, :mod:`mbbatch.profiles`).

    Algorithm 7 is fed ``TBT(b)`` (the v2 model's decode TBT); it is also the
    time per output token, and the first token comes ``prefill + TBT(b)``
    after the start (at most the service time).

    Parameters
    ----------
    beta : float
        Decode time per token at b = 1, s/token, > 0.
    gamma : float
        Decode-time growth with batch size, >= 0.
    prefill_per_token : float
        Prefill time per prompt token, s/token, >= 0.
    """

    beta: float = default("DecodeModel.beta")
    gamma: float = default("gamma")
    prefill_per_token: float = default("prefill_per_token")
    code = 2
    _service_columns = ("size", "max_output", "sum_prompt")
    _reads = ("size", "max_output", "sum_prompt")
    _params = ("beta", "gamma", "prefill_per_token")
    _param_keys: ClassVar[dict] = {"beta": "DecodeModel.beta", "gamma": "gamma",
                                   "prefill_per_token": "prefill_per_token"}
    _grows_with: ClassVar[dict] = {"beta": "max_output"}
    _fit_hint = ("sum_prompt and max_output must vary independently, and size too, with at least one batch of "
                 "two or more requests")
    #: its first token comes prefill + TBT(b) after the start; its decode steps take TBT(b)
    _phase_columns: ClassVar[dict] = {"prefill": ("size", "sum_prompt"), "per_token": ("size",)}

    def __post_init__(self):
        check_fields(self, {"beta": "DecodeModel.beta", "gamma": "gamma", "prefill_per_token": "prefill_per_token"})

    def kernel_fields(self) -> dict:
        """The event kernel's fields of the model (``_kernels.dynamic.MODEL``)."""
        return dict(model=_d.MODEL_DECODE, prefill_per_token=self.prefill_per_token, tbt_beta=self.beta,
                    tbt_gamma=self.gamma)

    def one_request(self, prompt: float, output: float) -> float:
        """Service time of a batch of one request of these lengths, s."""
        return self.prefill_per_token * prompt + self.beta * output

    def _service(self, size, max_output, sum_prompt, **_):
        tbt = self.beta * _h(self.gamma, size)
        return self.prefill_per_token * sum_prompt + tbt * max_output

    def _times(self, size, max_output, sum_prompt, **_):
        tbt = self.beta * _h(self.gamma, size)
        prefill = self.prefill_per_token * sum_prompt
        service = prefill + tbt * max_output
        return service, tbt, tbt, np.minimum(prefill + tbt, service)

    @staticmethod
    def _design(size, max_output, sum_prompt):
        x = (size - 1.0) / np.maximum(1.0, size)
        return np.column_stack([max_output, max_output * x, sum_prompt])

    @staticmethod
    def _from_coef(c):
        return {"beta": float(c[0]), "gamma": float(c[1] / c[0]) if c[0] > 0 else 0.0,
                "prefill_per_token": float(c[2])}

    @staticmethod
    def _jacobian(params, size, max_output, sum_prompt):
        x = (size - 1.0) / np.maximum(1.0, size)
        return np.column_stack([max_output * (1.0 + params["gamma"] * x), params["beta"] * max_output * x,
                                sum_prompt])

    @staticmethod
    def _phase_design(phase, size, sum_prompt=None, **_):
        x = (size - 1.0) / np.maximum(1.0, size)
        prefill = sum_prompt if phase == "prefill" else np.zeros_like(size)
        return np.column_stack([np.ones_like(size), x, prefill])

    @staticmethod
    def _phase_jacobian(phase, params, size, sum_prompt=None, **_):
        x = (size - 1.0) / np.maximum(1.0, size)
        prefill = sum_prompt if phase == "prefill" else np.zeros_like(size)
        return np.column_stack([1.0 + params["gamma"] * x, params["beta"] * x, prefill])


@dataclass(frozen=True)
class CalibratedModel(_Fitted):
    """Pang et al.'s calibrated latency model as a batch service model.

    Service time (Algorithm 3's ``service_time_fn(|batch|, max_seq_len)``,
    with ComputeDecodeTBT's ``h(b)``)::

        service = alpha + beta * h(b) * max_seq_len,   h(b) = 1 + gamma (b-1)/max(1, b)

    with ``max_seq_len`` the longest prompt + output of the batch (s).  What
    Algorithm 7 feeds the SLA controller (``recent_tbt``)
    depends on ``feedback``:

    ``"calibrated"``
        ``beta h(b)``: ComputeDecodeTBT's calibrated branch
        provides the decode TBT;
    ``"uncalibrated"``
        ``UNCALIBRATED_TBT`` = 5.74 ms whatever the batch: the fallback.
        ComputeDecodeTBT's ELSE branch still *returns* a
        decode TBT, so Algorithm 7 takes its "decode_tbt is PROVIDED"
        branch with the constant, not the legacy one.  Only the controller's
        feedback falls back: the batch's time is still the GPU's
        ``service_time_fn``, an input of Algorithms 3 and 5
        that the paper never derives from the latency model.
        With ``D_SLA - eps_D`` above 5.74 ms the controller so never sees
        the latency grow and widens its interval towards ``B_max``;
    ``"legacy"``
        no decode TBT provided: ``service / max output_len``
        (1 token for a batch of empty outputs), as for :class:`LinearModel`.

    The fallback is a field, not a class: the three differ only in the
    controller's feedback on one service time, so one sweep axis
    (``feedback``) compares them on the same parameters and the same
    batches, and the parameter table keeps one row per parameter.

    The time per output token (what the SLA bounds in the metrics) is the
    GPU's ``beta h(b)`` whatever the feedback; the first token comes when
    the batch has ``max_output - 1`` token steps left:
    ``min(alpha + beta h(b) (max_seq_len - max_output + 1), service)`` after
    its start (the analogue of :class:`DecodeModel`'s ``prefill + TBT``; the
    paper has no TTFT).

    Parameters
    ----------
    alpha : float
        Fixed time per batch, s, >= 0.
    beta : float
        Time per token of the longest prompt + output at b = 1, s/token, > 0:
        the calibrated decode TBT at b = 1 (``latency_model.beta`` = 5.74 ms).
    gamma : float
        Growth of the time per token with batch size, >= 0 (0.316).
    feedback : {"calibrated", "uncalibrated", "legacy"}
        What Algorithm 7 feeds the SLA controller (above).

    Examples
    --------
    >>> m = CalibratedModel(alpha=0.01, beta=5e-3, gamma=0.3)
    >>> round(m.service_time(size=4, max_seq_len=100), 12)    # 0.01 + 5e-3 * 1.225 * 100
    0.6225
    >>> round(m.feedback_tbt(size=4), 12), CalibratedModel(feedback="uncalibrated").feedback_tbt(size=4)
    (0.006125, 0.00574)
    """

    alpha: float = default("CalibratedModel.alpha")
    beta: float = default("CalibratedModel.beta")
    gamma: float = default("gamma")
    feedback: str = default("CalibratedModel.feedback")
    code = 3
    _service_columns = ("size", "max_seq_len")
    _reads = ("size", "max_seq_len", "max_output")
    _params = ("alpha", "beta", "gamma")
    _param_keys: ClassVar[dict] = {"alpha": "CalibratedModel.alpha", "beta": "CalibratedModel.beta",
                                   "gamma": "gamma"}
    _grows_with: ClassVar[dict] = {"beta": "max_seq_len"}
    _fit_hint = "max_seq_len must vary, and size too, with at least one batch of two or more requests"
    #: its first token at alpha + beta h(b) (max_seq_len - max_output + 1); its decode steps beta h(b)
    _phase_columns: ClassVar[dict] = {"prefill": ("size", "max_seq_len", "max_output"), "per_token": ("size",)}

    def __post_init__(self):
        check_fields(self, {"alpha": "CalibratedModel.alpha", "beta": "CalibratedModel.beta", "gamma": "gamma",
                            "feedback": "CalibratedModel.feedback"})

    def kernel_fields(self) -> dict:
        """The event kernel's fields of the model (``_kernels.dynamic.MODEL``):
        ``alpha`` as ``base``, the feedback in the model's code."""
        return dict(model=_FEEDBACK_CODES[self.feedback], base=self.alpha, tbt_beta=self.beta, tbt_gamma=self.gamma)

    def one_request(self, prompt: float, output: float) -> float:
        """Service time of a batch of one request of these lengths, s."""
        return self.alpha + self.beta * (prompt + output)

    def decode_tbt(self, size):
        """ComputeDecodeTBT as this model provides it to
        Algorithm 7, s/token: ``beta h(b)``, 5.74 ms, or 0 (none: legacy)."""
        b = _check_values("size", size)
        if self.feedback == "calibrated":
            return _scalar_or_array(self.beta * _h(self.gamma, b))
        return _scalar_or_array(np.full_like(b, UNCALIBRATED_TBT if self.feedback == "uncalibrated" else 0.0))

    def feedback_tbt(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None, sequence_steps=None,
                     context_steps=None, expert_reads=None):
        """What Algorithm 7, step 2 feeds the SLA controller,
        s/token: ``beta h(b)`` (calibrated: only ``size`` is needed), 5.74 ms
        (uncalibrated: ``size`` gives the shape), or the legacy
        ``service / max(max_output, 1)`` (``size``, ``max_seq_len`` and
        ``max_output`` needed)."""
        if self.feedback != "legacy":
            if size is None:
                raise TypeError("CalibratedModel.feedback_tbt needs size (requests); size not given")
            return self.decode_tbt(size)
        return super().feedback_tbt(size, max_seq_len, max_output, sum_prompt, sequence_steps, context_steps)

    def _service(self, size, max_seq_len, **_):
        return self.alpha + self.beta * _h(self.gamma, size) * max_seq_len

    def _times(self, size, max_seq_len, max_output, **_):
        # the kernel's order: tbt = decode_tbt(beta, gamma, b), then alpha + tbt * max_seq_len
        tbt = self.beta * _h(self.gamma, size)
        service = self.alpha + tbt * max_seq_len
        ttft = np.minimum(self.alpha + tbt * (max_seq_len - max_output + 1.0), service)
        fed = {"calibrated": tbt, "uncalibrated": np.full_like(tbt, UNCALIBRATED_TBT),
               "legacy": np.zeros_like(tbt)}[self.feedback]
        return service, fed, tbt, ttft

    @staticmethod
    def _design(size, max_seq_len):
        x = (size - 1.0) / np.maximum(1.0, size)
        return np.column_stack([np.ones_like(size), max_seq_len, max_seq_len * x])

    @staticmethod
    def _from_coef(c):
        return {"alpha": float(c[0]), "beta": float(c[1]), "gamma": float(c[2] / c[1]) if c[1] > 0 else 0.0}

    @staticmethod
    def _jacobian(params, size, max_seq_len):
        x = (size - 1.0) / np.maximum(1.0, size)
        return np.column_stack([np.ones_like(size), max_seq_len * (1.0 + params["gamma"] * x),
                                params["beta"] * max_seq_len * x])

    @staticmethod
    def _phase_design(phase, size, max_seq_len=None, max_output=None, **_):
        x = (size - 1.0) / np.maximum(1.0, size)
        if phase == "prefill":
            r = max_seq_len - max_output + 1.0
            return np.column_stack([np.ones_like(size), r, r * x])
        return np.column_stack([np.zeros_like(size), np.ones_like(size), x])

    @staticmethod
    def _phase_jacobian(phase, params, size, max_seq_len=None, max_output=None, **_):
        x = (size - 1.0) / np.maximum(1.0, size)
        r = max_seq_len - max_output + 1.0 if phase == "prefill" else np.ones_like(size)
        return np.column_stack([np.ones_like(size) if phase == "prefill" else np.zeros_like(size),
                                r * (1.0 + params["gamma"] * x), params["beta"] * r * x])


@dataclass(frozen=True)
class PrefillModel(_Fitted):
    """A prefill batch's time = ``a + b * sum(prompt)`` (s): LAPS's
    prefill instances (arXiv:2601.11589; :class:`~mbbatch.LAPS`).  Its time to
    first token is the batch's time; it decodes nothing.

    Parameters
    ----------
    a : float
        Fixed time per batch, s, >= 0.
    b : float
        Time per prompt token of the batch, s/token, > 0.
    """

    a: float = default("PrefillModel.a")
    b: float = default("PrefillModel.b")
    _service_columns = ("sum_prompt",)
    _reads = ("sum_prompt",)
    _params = ("a", "b")
    _param_keys: ClassVar[dict] = {"a": "PrefillModel.a", "b": "PrefillModel.b"}
    _grows_with: ClassVar[dict] = {"b": "sum_prompt"}
    _fit_hint = "sum_prompt must take at least two values"
    #: a prefill batch is all prefill: its time is its first token's
    _phase_columns: ClassVar[dict] = {"prefill": ("sum_prompt",)}

    def __post_init__(self):
        check_fields(self, {"a": "PrefillModel.a", "b": "PrefillModel.b"})

    def one_request(self, prompt: float, output: float) -> float:
        """Time of a prefill batch of one request of ``prompt`` tokens, s."""
        return self.a + self.b * prompt

    def prefill_model(self) -> "PrefillModel":
        """Its prefill batches' model: itself (as
        :meth:`IterationModel.prefill_model` gives an engine's)."""
        return self

    def _service(self, sum_prompt, **_):
        return self.a + self.b * sum_prompt

    def _times(self, sum_prompt, **_):
        service = self._service(sum_prompt)
        zero = np.zeros_like(service)
        return service, zero, zero, service

    @staticmethod
    def _design(sum_prompt):
        return np.column_stack([np.ones_like(sum_prompt), sum_prompt])

    @staticmethod
    def _from_coef(c):
        return {"a": float(c[0]), "b": float(c[1])}

    @staticmethod
    def _jacobian(params, sum_prompt):
        return np.column_stack([np.ones_like(sum_prompt), sum_prompt])

    @classmethod
    def _phase_design(cls, phase, sum_prompt, **_):
        return cls._design(sum_prompt)

    @classmethod
    def _phase_jacobian(cls, phase, params, sum_prompt, **_):
        return cls._jacobian(params, sum_prompt)


@dataclass(frozen=True)
class IterationModel(_Fitted):
    """The time of one engine iteration, linear in what it does, and a batch's
    time as the iterations that serve it.

    An iteration takes::

        step + prefill_per_token * (prompt tokens it prefills)
             + per_sequence * (sequences it decodes)
             + per_context_token * (context tokens those sequences attend over)
             + per_expert * extra_experts(E, k, tokens it processes)

    ``step`` is what every iteration pays (reading the weights, launching the
    kernels), the prefill term the prompts' compute, ``per_sequence`` the
    per-sequence work of a decode step (sampling, the new token's layers),
    and ``per_context_token`` the attention over the KV cache, which grows
    with batch size x context (Kwon et al., 2023, "Efficient memory
    management for large language model serving with PagedAttention",
    arXiv:2309.06180; Agrawal et al., 2024, "Vidur: a large-scale simulation
    framework for LLM inference", arXiv:2405.05465, model an iteration so).
    A batch run to completion pays ``setup`` once (scheduling, tokenizing,
    admission), then its prefill iteration, which gives every member its
    first token, then one decode iteration per further token:
    ``D = max(max_output - 1, 0)`` of them::

        prefill = setup + step + prefill_per_token * sum(prompt) + per_expert * x(sum(prompt))
        decode  = step * D + per_sequence * S + per_context_token * K + per_expert * R
        service = prefill + decode

    where, with ``finished="leave"`` (finished members leave the batch, as
    the engines measured in :mod:`mbbatch.profiles` do), ``S`` is the
    members' decode steps ``sum(d_i)``, ``d_i = max(output_i - 1, 0)``, and
    ``K`` the context they attend over, ``sum(prompt_i d_i + d_i (d_i + 1)
    / 2)`` (a member's context at its j-th decode step is ``prompt_i + j``
    tokens: :class:`BatchAggregates`' ``sequence_steps`` and
    ``context_steps``) and ``R`` the experts its decode iterations read,
    ``sum_j x(b_j)`` over them, ``b_j`` the members still decoding
    (``expert_reads``); with ``finished="stay"`` (a padded engine: every
    member steps until the longest is done) ``S = b D``, ``K = sum(prompt)
    D + b D (D + 1) / 2`` and ``R = D x(b)``.

    The expert term is a mixture of experts' (``experts`` E > 0, each token
    routed to ``experts_per_token`` k of them, e.g. Mixtral's 8 and 2): ``x =``
    :func:`extra_experts`, the experts an iteration's tokens read beyond its
    first token's k, which grows with the batch and saturates at ``E - k``;
    ``per_expert`` is the time to read one expert's weights.  A dense model
    (``E = 0``, the default) has none.  Fitted to the Mixtral-8x7B
    measurements it takes 1.6 ms on four A100s and 2.4 ms on one MI300X
    (an expert's 5.6 G parameters, 11 GB in 16 bits, over their memory
    bandwidth take 1.4 ms and 2.1 ms), and it brings those profiles' held-out
    errors from 11-20 % to 0.4-6 % where their engines read the experts a
    batch routes to (vLLM); engines that read every expert at every
    iteration fit it at about 0 (llama.cpp).  The time to first token is ``prefill``; the
    decode time between tokens (Algorithm 7's feedback, and the time per
    output token the SLA bounds) is the batch's mean decode iteration,
    ``decode / D`` (with ``D = 0``, the iteration it would take: ``step +
    per_sequence b + per_context_token (sum(prompt) + b)``).

    The measurements fitted (LLM-Inference-Bench: Chitty-Venkata et al.,
    2024, arXiv:2411.00136) time whole batches of one prompt and output
    length, equal to each other, so ``setup`` and ``step``, and the prefill
    and decode context, are told apart only by how they scale; ``setup``
    is there because those batches' times have a part that neither length
    nor size moves (without it, the median over the 227 profiles of their
    leave-one-out relative errors is 5.4 % instead of 5.2 %).

    The defaults are the fit of the profile ``H100/vLLM/Meta-Llama-3-8B/tp1``
    (:func:`mbbatch.profiles.get`), rounded to 3 significant digits.

    Parameters
    ----------
    setup : float
        Fixed time per batch, s, >= 0.
    step : float
        Fixed time per iteration, s, >= 0.
    prefill_per_token : float
        Time per prompt token prefilled, s/token, >= 0.
    per_sequence : float
        Time per sequence decoded in an iteration, s, >= 0.
    per_context_token : float
        Time per context token a decoded sequence attends over, s/token, >= 0.
    per_expert : float
        Time per expert read beyond an iteration's first token's, s/expert,
        >= 0 (0 unless ``experts`` > 0).
    finished : {"leave", "stay"}
        Whether a finished member leaves the batch's decode iterations.
    experts : int
        Experts per layer of a mixture-of-experts model, >= 0; 0: dense.
    experts_per_token : int
        Experts each token is routed to, in [1, experts].
    profile : str or None
        The hardware profile it was fitted to (:mod:`mbbatch.profiles`), or
        None; recorded with the runs it times.

    A decode iteration must take time: one of ``step``, ``per_sequence`` and
    ``per_context_token`` is positive.

    Examples
    --------
    >>> m = IterationModel(setup=0.0, step=0.01, prefill_per_token=1e-4, per_sequence=1e-3,
    ...                    per_context_token=1e-6)
    >>> round(m.service_time(size=2, prompt=100, output=3), 9)   # 0.03 + 0.02 + 2 * 2e-3 + 1e-6 * 2 * (200 + 3)
    0.054406
    """

    setup: float = default("IterationModel.setup")
    step: float = default("IterationModel.step")
    prefill_per_token: float = default("IterationModel.prefill_per_token")
    per_sequence: float = default("IterationModel.per_sequence")
    per_context_token: float = default("IterationModel.per_context_token")
    per_expert: float = default("IterationModel.per_expert")
    finished: str = default("IterationModel.finished")
    experts: int = default("IterationModel.experts")
    experts_per_token: int = default("IterationModel.experts_per_token")
    profile: str | None = None
    code = 6
    _service_columns = ("size", "max_output", "sum_prompt", "sequence_steps", "context_steps", "expert_reads")
    _reads = _service_columns
    _params = ("setup", "step", "prefill_per_token", "per_sequence", "per_context_token", "per_expert")
    _param_keys: ClassVar[dict] = {k: f"IterationModel.{k}" for k in _params}
    _grows_with: ClassVar[dict] = {}
    _fit_hint = ("the batches must differ in size, prompt and output so that each term's scaling is seen: at "
                 "least three sizes and three lengths")
    #: its first token at the end of its prefill iteration; its decode steps as the batch's mean
    _phase_columns: ClassVar[dict] = {"prefill": ("sum_prompt",),
                                      "per_token": ("size", "max_output", "sum_prompt", "sequence_steps",
                                                    "context_steps", "expert_reads")}

    def __post_init__(self):
        check_fields(self, {**self._param_keys, "finished": "IterationModel.finished",
                            "experts": "IterationModel.experts",
                            "experts_per_token": "IterationModel.experts_per_token"})
        if self.experts and self.experts_per_token > self.experts:
            raise ValueError(f"IterationModel: experts_per_token must be in [1, experts = {self.experts}]; got "
                             f"{self.experts_per_token}")
        if self.per_expert > 0.0 and not self.experts:
            raise ValueError(f"IterationModel: per_expert = {self.per_expert!r} times a mixture of experts; give its "
                             "experts (> 0 experts per layer, e.g. 8 for Mixtral) or per_expert = 0")
        if self.profile is not None and not isinstance(self.profile, str):
            raise TypeError(f"profile must be a profile's name (str) or None; got {type(self.profile).__name__}")
        if self.step == 0.0 and self.per_sequence == 0.0 and self.per_context_token == 0.0:
            raise ValueError("IterationModel: a decode iteration must take time: one of step, per_sequence and "
                             "per_context_token must be > 0; got all three 0")

    def kernel_fields(self) -> dict:
        """The event kernel's fields of the model (``_kernels.dynamic.MODEL``)."""
        return dict(model=_d.MODEL_ITERATION, padded=int(self.finished == "stay"), base=self.setup,
                    iteration=self.step, prefill_per_token=self.prefill_per_token,
                    per_sequence=self.per_sequence, per_context=self.per_context_token,
                    **self.expert_fields())

    def expert_fields(self) -> dict:
        """The kernels' fields of the mixture-of-experts term: ``per_expert``,
        and :func:`extra_experts`' ``E - k`` and ``1 - k/E`` (``expert_span``,
        ``expert_miss``; 0 and 1 for a dense model, whose term is 0)."""
        if not self.experts or self.per_expert == 0.0:
            return dict(DENSE_FIELDS)
        return dict(per_expert=self.per_expert, expert_span=float(self.experts - self.experts_per_token),
                    expert_miss=1.0 - self.experts_per_token / self.experts)

    def _experts(self) -> tuple:
        return (self.experts, self.experts_per_token)

    @classmethod
    def _fixed_experts(cls, owner: str, fixed: dict) -> tuple:
        return _check_experts(owner, (fixed.get("experts", default("IterationModel.experts")),
                                      fixed.get("experts_per_token", default("IterationModel.experts_per_token"))))

    @classmethod
    def _fitted_params(cls, fixed: dict) -> tuple:
        # a dense model (no experts) has no expert term to fit
        return cls._params if fixed.get("experts", default("IterationModel.experts")) else cls._params[:-1]

    def one_request(self, prompt: float, output: float) -> float:
        """Service time of a batch of one request of these lengths, s."""
        return float(self.service_time(size=1, prompt=prompt, output=output))

    def decode_step(self, size=1, context=0.0):
        """The time of one decode iteration of ``size`` sequences of
        ``context`` tokens each (prompt plus those generated), s:
        ``step + per_sequence size + per_context_token size context +
        per_expert extra_experts(size)`` (vectorized)."""
        b = _check_values("size", size)
        c = _check_values("prompt", context, "context")
        return _scalar_or_array(self.step + self.per_sequence * b + self.per_context_token * b * c
                                + self.per_expert * extra_experts(*self._experts(), b))

    def prefill_model(self) -> "PrefillModel":
        """The prefill batches of this engine as a :class:`PrefillModel`:
        ``a = setup + step``, ``b = prefill_per_token`` (LAPS's prefill
        instances; exact, a prefill batch being one prefill iteration), and
        for a mixture of experts ``per_expert (E - k)`` added to ``a``: a
        prefill batch's tokens read every expert, within ``(1 - k/E)^(T -
        1)`` of them for ``T`` tokens (under 1 % from 17 tokens at Mixtral's
        2 of 8)."""
        if self.prefill_per_token == 0.0:
            why = (f" (profile {self.profile}'s fit holds it at 0: its batches' prompts and outputs have one "
                   "length, which cannot tell prefill from decode apart)" if self.profile else "")
            raise ValueError(f"prefill_per_token must be > 0 for a prefill batch's time; got 0{why}; give LAPS "
                             "a PrefillModel, or an IterationModel with a measured prefill_per_token")
        ef = self.expert_fields()
        return PrefillModel(a=self.setup + self.step + ef["per_expert"] * ef["expert_span"], b=self.prefill_per_token)

    def _times(self, size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads, **_):
        # the kernel's order of operations (_kernels.common.iteration_times)
        e = self._experts()
        d, s, k, r = self._columns(self.finished, e, size, max_output, sum_prompt, sequence_steps, context_steps,
                                   expert_reads)
        prefill = (self.setup + self.step + self.prefill_per_token * sum_prompt
                   + self.per_expert * extra_experts(*e, sum_prompt))
        decode = self.step * d + self.per_sequence * s + self.per_context_token * k + self.per_expert * r
        service = prefill + decode
        one = (self.step + self.per_sequence * size + self.per_context_token * (sum_prompt + size)
               + self.per_expert * extra_experts(*e, size))
        tbt = np.where(d > 0.0, decode / np.where(d > 0.0, d, 1.0), one)
        return service, tbt, tbt, prefill

    def _service(self, size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads, **_):
        return self._times(size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads)[0]

    @staticmethod
    def _columns(finished, experts, size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads):
        """Its decode steps ``D``, sequence steps ``S``, context steps ``K``
        and experts read ``R`` under ``finished`` (the class docstring's
        formulas; ``experts``: ``(E, k)``)."""
        d = np.maximum(max_output - 1.0, 0.0)
        if finished == "stay":
            return (d, size * d, sum_prompt * d + size * d * (d + 1.0) / 2.0,
                    d * extra_experts(*experts, size))
        return d, sequence_steps, context_steps, expert_reads

    @classmethod
    def _design_for(cls, fixed, phase, cols):
        finished = fixed.get("finished", default("IterationModel.finished"))
        experts = cls._fixed_experts("IterationModel.fit", fixed)
        one = np.ones_like(cols["sum_prompt"])
        zero = np.zeros_like(one)
        if phase == "prefill":
            return np.column_stack([one, one, cols["sum_prompt"], zero, zero,
                                    extra_experts(*experts, cols["sum_prompt"])])
        d, s, k, r = cls._columns(finished, experts, **{c: cols[c] for c in cls._service_columns})
        if phase == "per_token":
            return np.column_stack([zero, one, zero, s / d, k / d, r / d])
        return np.column_stack([one, 1.0 + d, cols["sum_prompt"], s, k,
                                extra_experts(*experts, cols["sum_prompt"]) + r])

    @classmethod
    def _jacobian_for(cls, fixed, phase, params, cols):
        return cls._design_for(fixed, phase, cols)

    @staticmethod
    def _from_coef(c):
        return dict(zip(IterationModel._params, (float(x) for x in c)))


#: The models by their name in sweep specs (``service_model = ...``).
#: (``"profile"``: an IterationModel fitted to a measured accelerator, :mod:`mbbatch.profiles`, by name)
SERVICE_MODELS = {"prefill": PrefillModel, "max": MaxModel, "linear": LinearModel, "decode": DecodeModel,
                  "calibrated": CalibratedModel, "iteration": IterationModel, "profile": IterationModel}
