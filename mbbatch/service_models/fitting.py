"""Fitting a service model to measured batch times: least squares, held-out
errors, and what a fit reports (:class:`FitResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np

from ..params import MAX_KV_TOKENS, MAX_MEASURED_TIME, PARAMS, Domain
from .aggregates import (
    _AGGREGATES,
    _TARGETS,
    _UNITS,
    DENSE,
    BatchTimes,
    _check_values,
    _scalar_or_array,
    _show,
    _where,
    batch_aggregates,
    uniform_aggregates,
)


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
    unfitted : dict
        The parameters the measurements cannot identify, held at 0 and not
        fitted, each with the reason (e.g. the prefill's attention where
        no measured prefill varies the prompt's length).
    flagged : tuple of int
        ``fit(..., robust=True)``: the measured times that contradict the
        rest, left out of the fit and of its errors (their positions among
        the measured times: the ``service`` column's rows, then
        ``prefill``'s, then ``per_token``'s, each where measured).
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
    unfitted: dict = field(default_factory=dict)
    flagged: tuple = ()

    #: a coefficient whose standard error exceeds this share of its value is not identified
    IDENTIFIED_SE = 0.5

    @property
    def identification(self) -> dict:
        """Whether the measurements identify each parameter: ``"identified"``
        (its standard error at most :attr:`IDENTIFIED_SE` of its value),
        ``"weak"`` (a larger standard error: the data barely tell it from the
        others), ``"at bound"`` (the fit holds it at 0, the unconstrained
        optimum being negative) or ``"not fitted"`` (:attr:`unfitted`: held
        at 0, the measurements cannot move it).  Dense models' expert term is
        left out."""
        out = {}
        for k, v in self.params.items():
            se = self.stderr.get(k, math.nan)
            if k in self.unfitted:
                out[k] = "not fitted"
            elif k in self.at_bound:
                out[k] = "at bound"
            elif k == "per_expert" and v == 0.0 and not math.isfinite(se):
                continue
            elif math.isfinite(se) and v > 0.0 and se <= self.IDENTIFIED_SE * v:
                out[k] = "identified"
            else:
                out[k] = "weak"
        return out

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
        if self.flagged:
            lines.append(f"  {len(self.flagged)} measured time(s) flagged as contradicting the rest and left out: "
                         f"{', '.join(map(str, self.flagged))}")
        ident = self.identification
        for k, v in self.params.items():
            if k not in ident:
                continue
            mark = {"identified": "", "weak": " (weakly identified: standard error above half its value)",
                    "at bound": " (at bound: held at 0)",
                    "not fitted": f" (not fitted, held at 0: {self.unfitted.get(k, '')})"}[ident[k]]
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


def _measurement_columns(owner: str, measurements, names: tuple, optional: tuple = (), gaps: bool = False) -> dict:
    """The columns ``names`` (and those of ``optional`` present) of
    ``measurements``, each validated and as float64, of one length;
    ``gaps``: the ``optional`` ones (measured times) may hold NaN, a time
    that row did not measure."""
    available = _available_columns(owner, measurements)
    missing = [k for k in names if k not in available]
    if missing:
        need = ", ".join(f"{k} ({_UNITS[k]})" for k in names)
        raise ValueError(f"{owner} needs the columns {need}; measurements lack {', '.join(missing)} "
                         f"(its columns: {', '.join(map(str, available)) or 'none'})")
    cols = {}
    for k in (*names, *(k for k in optional if k in available and k not in names)):
        raw = np.asarray(measurements[k])
        if gaps and k in optional and raw.dtype.kind == "f" and np.isnan(raw).any():
            # (a row that did not measure this time: NaN, checked as absent)
            arr = raw.astype(np.float64).copy()
            _check_values(k, np.where(np.isnan(arr), 0.0, arr), f"column {k}")
        else:
            arr = _check_values(k, raw, f"column {k}")
        if arr.ndim != 1:
            raise ValueError(f"{owner}: column {k} must be 1-D; got shape {arr.shape}")
        # (measured times, lengths and aggregates in a sane range: their squares must stay finite)
        dom = (_MEASURED_TIMES if _UNITS[k] in ("s", "s/token") else _MEASURED_COUNTS)
        bad = (~dom.contains(arr) & ~np.isnan(arr)) if k != "size" else np.zeros(arr.shape, bool)  # (sizes: counts)
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


#: robust=True: Huber's threshold, in robust standard deviations of the residuals (95 % efficiency
#: at the normal), and the residual beyond which a measured time is flagged
HUBER_K, FLAG_AT = 1.345, 3.0


def _robust_keep(owner: str, design: np.ndarray, y: np.ndarray, names: tuple, hint: str) -> np.ndarray:
    """The measured times a robust fit keeps: a Huber fit (Huber, 1964;
    ``scipy.optimize.least_squares(loss="huber")``, the coefficients >= 0,
    started from the least-squares fit) whose residuals' robust scale
    (1.4826 x their median absolute deviation) flags those beyond
    :data:`FLAG_AT` of it: a generation that stopped early, a failed run.
    The fit is then refitted on the rest (a trimmed fit)."""
    from scipy.optimize import least_squares

    c0, _ = _least_squares(owner, design, y, names, hint)
    r0 = design @ c0 - y
    scale = 1.4826 * float(np.median(np.abs(r0 - np.median(r0))))
    if not scale > 0.0:
        return np.ones(y.size, bool)
    norms = np.linalg.norm(design, axis=0)
    norms = np.where(norms > 0, norms, 1.0)
    res = least_squares(lambda c: (design / norms) @ c - y, c0 * norms, bounds=(0.0, np.inf), loss="huber",
                        f_scale=HUBER_K * scale)
    r = (design / norms) @ res.x - y
    scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    return np.abs(r) <= FLAG_AT * scale if scale > 0.0 else np.ones(y.size, bool)


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

    def _attention(self) -> bool:
        """Whether the model times the prefill's attention (reads ``prefill_squares``)."""
        return False

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
        if "prefill_squares" in needs and given.get("prefill_squares") is None and not self._attention():
            given = {**given, "prefill_squares": 0.0}   # no prefill attention term: its feature is not read
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
                     context_steps=None, expert_reads=None, prefill_squares=None, *, prompt=None, output=None):
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
        sequence_steps, context_steps, expert_reads, prefill_squares : float or array_like, optional
            The members' decode steps, the context they attend over, the
            experts the batch's iterations read and the sum of the squares of
            the members' prompts (:class:`BatchAggregates`;
            :class:`IterationModel` only, ``expert_reads`` that of a mixture
            of experts, ``prefill_squares`` where ``prefill_attention > 0``).
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
                     sequence_steps=sequence_steps, context_steps=context_steps, expert_reads=expert_reads,
                     prefill_squares=prefill_squares)
        a = self._args("service_time", self._service_columns, given, prompt, output)
        return _scalar_or_array(self._service(**a))

    def times(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None, sequence_steps=None,
              context_steps=None, expert_reads=None, prefill_squares=None, *, prompt=None,
              output=None) -> BatchTimes:
        """The four per-batch numbers the event kernel computes for a batch
        (service, decode TBT, time per output token, time to first token),
        arguments as :meth:`service_time`; the model's ``_reads`` are needed."""
        given = dict(size=size, max_seq_len=max_seq_len, max_output=max_output, sum_prompt=sum_prompt,
                     sequence_steps=sequence_steps, context_steps=context_steps, expert_reads=expert_reads,
                     prefill_squares=prefill_squares)
        a = self._args("times", self._reads, given, prompt, output)
        return BatchTimes(*(_scalar_or_array(x) for x in self._times(**a)))

    def feedback_tbt(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None, sequence_steps=None,
                     context_steps=None, expert_reads=None, prefill_squares=None):
        """What Algorithm 7, step 2 feeds the SLA controller
        after each batch, s/token: the model's decode TBT where it provides
        one, else the legacy ``service / max(max_output, 1)`` (1 token for a
        batch of empty outputs, as the kernel).  Arguments as :meth:`times`."""
        t = self.times(size, max_seq_len, max_output, sum_prompt, sequence_steps, context_steps, expert_reads,
                       prefill_squares)
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
        gaps = len(targets) > 1
        if uniform:
            cols = _measurement_columns(owner, measurements, ("size", "prompt", "output"), targets, gaps)
            agg = uniform_aggregates(cols.pop("size").astype(np.int64), cols.pop("prompt"), cols.pop("output"),
                                     cls._fixed_experts(owner, fixed))
            cols.update({k: agg[k] for k in needs})
        else:
            dense = "expert_reads" in needs and not cls._fixed_experts(owner, fixed)[0]
            # (without the prompts' squares the prefill attention is not fitted: see _unfitted)
            squares = "prefill_squares" in needs and "prefill_squares" not in available
            cols = _measurement_columns(owner, measurements, tuple(k for k in needs if not (
                (dense and k == "expert_reads") or (squares and k == "prefill_squares"))), targets, gaps)
            if dense:       # a dense model reads no experts
                cols["expert_reads"] = np.zeros_like(cols["sum_prompt"])
            if squares:
                cols["prefill_squares"] = np.zeros_like(cols["sum_prompt"])
        agg = {k: cols[k] for k in needs}
        designs, ys, kinds = [], [], []
        if gaps:
            unmeasured = np.all([np.isnan(cols[t]) for t in targets], axis=0)
            if unmeasured.any():
                raise ValueError(f"{owner}: row {int(np.argmax(unmeasured))} measures no time: each row needs one of "
                                 f"{', '.join(targets)} (NaN: a time the row did not measure)")
        for t in targets:
            y = cols[t]
            rows = ~np.isnan(y)
            if t == "per_token":
                # the mean decode step of a batch that decodes (its longest output 2 tokens or more)
                rows &= agg["max_output"] >= 2.0 if "max_output" in agg else rows
            sub = {k: v[rows] for k, v in agg.items()}
            designs.append(cls._design_for(fixed, t, sub))
            ys.append(y[rows])
            kinds.append((t, sub))
        return np.vstack(designs), np.concatenate(ys), kinds

    @classmethod
    def fit(cls, measurements, weights: str = "absolute", holdout: bool = True, robust: bool = False,
            **fixed) -> FitResult:
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
        robust : bool
            Flag the measured times that contradict the rest (a generation
            that stopped early, so its time is far below its batch's; a
            failed run) and fit without them: a Huber fit of the (weighted)
            residuals, the times beyond 3 robust standard deviations of its
            residuals flagged (``FitResult.flagged``), then the least squares
            on the others (a trimmed fit; its errors are theirs).  Default
            False: every time fitted.
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
        # (the terms the rows cannot tell apart are held at 0, each with the reason)
        unfitted = cls._unfitted(kinds)
        active = tuple(k for k in cls._fitted_params(fixed) if k not in unfitted)
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
        flagged = ()
        if not isinstance(robust, (bool, np.bool_)):
            raise TypeError(f"{owner}: robust must be True or False; got {robust!r}")
        if robust:
            keep = _robust_keep(owner, design_fit * w[:, None], y * w, active, cls._fit_hint)
            if not keep.all():
                flagged = tuple(int(i) for i in np.flatnonzero(~keep))
                at, kept = 0, []
                for t, sub in kinds:
                    m = next(iter(sub.values())).size
                    part = keep[at:at + m]
                    kept.append((t, {k: v[part] for k, v in sub.items()}))
                    at += m
                kinds = kept
                design, y, w, design_fit = design[keep], y[keep], w[keep], design_fit[keep]
                n = y.size
                if n < p + 1:
                    raise ValueError(f"{owner}: robust=True leaves {n} measured times for {p} parameters")
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
                         holdout=scheme, holdout_errors=held_rel, unfitted=unfitted, flagged=flagged)

    @classmethod
    def _unfitted(cls, kinds) -> dict:
        """The parameters the rows (``kinds``: each measured phase and its
        aggregates) cannot identify, held at 0 by the fit: ``{name: why}``."""
        return {}

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
