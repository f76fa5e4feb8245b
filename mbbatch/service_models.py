"""Batch service models: how long a batch takes, from its members' lengths.

A batch's service time comes from one of four models, chosen by class:

- :class:`MaxModel`: the multi-bin paper's max of member service times, each
  ``base + per_token * output_len`` (Section 6.1's linear fit); with
  ``base = 0, per_token = 1`` a request's output length is its service time
  in s, which is how the paper's model (``service=dist``) is one case of the
  request model;
- :class:`LinearModel`: ``base + alpha * max_seq_len * (1 + beta (b-1)/b)``
  with ``max_seq_len = max(prompt + output)`` (design notes, Section 5.1);
- :class:`DecodeModel`: ``prefill + TBT(b) * max output_len`` with
  ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` (calibrated beta = 5.74 ms,
  gamma = 0.316) and ``prefill = prefill_per_token * sum(prompt_len)``;
- :class:`CalibratedModel`: the dynamic-batching specification's calibrated
  latency model on its ``service_time_fn(|batch|, max_seq_len)``:
  ``alpha + beta * max_seq_len * h(b)``, ``h(b) = 1 + gamma (b-1)/max(1, b)``,
  with Algorithm 7's feedback ``beta h(b)`` (``feedback="calibrated"``), its
  uncalibrated fallback 5.74 ms (``"uncalibrated"``) or the legacy
  ``service / max output_len`` (``"legacy"``).

Each model also states its formulas in numpy, for whole arrays of batches:
``service_time(size, max_seq_len, max_output, sum_prompt)``, what Algorithm 7
feeds the SLA controller (``feedback_tbt``), and all four per-batch numbers
the event kernel computes (``times``: service, decode TBT, time per output
token, time to first token); ``batch_times(prompt, output, sizes)`` starts from
the members' lengths.  These are the references the kernel must equal.
``Model.fit(measurements)`` fits a model's parameters to measured batch
times by least squares (:class:`FitResult`).

Parameters, their domains and defaults are those of the parameter table
(:mod:`mbbatch.params`).

The specification cited is the dynamic-batching specification
(``seeds/000_fae4e6e765565183.txt``, by line: Algorithm 3 lines 212 and
240-242, Algorithm 7 lines 480-488, ComputeDecodeTBT lines 501-510).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import ClassVar, NamedTuple

import numpy as np

from ._kernels import dynamic as _d
from ._validation import check_fields
from .params import PARAMS, default

__all__ = ["MaxModel", "LinearModel", "DecodeModel", "CalibratedModel", "PrefillModel", "SERVICE_MODELS", "UNCALIBRATED_TBT",
           "BatchTimes", "BatchAggregates", "batch_aggregates", "FitResult"]

#: the kernel's code of CalibratedModel's feedback rules
_FEEDBACK_CODES = {"calibrated": _d.MODEL_CALIBRATED, "uncalibrated": _d.MODEL_CALIBRATED_UNCALIBRATED,
                   "legacy": _d.MODEL_CALIBRATED_LEGACY}
#: ComputeDecodeTBT's value when the latency model is not calibrated, s/token
#: (specification, lines 507-508: ``RETURN 0.00574  // Default 5.74ms``), as the kernel feeds it.
UNCALIBRATED_TBT = _d.UNCALIBRATED_TBT

# the per-batch aggregates the models read, with their units
_UNITS = {"size": "requests", "max_seq_len": "tokens", "max_output": "tokens", "sum_prompt": "tokens",
          "service": "s"}


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
        Largest ``prompt + output`` of a member, tokens (Algorithm 3, line 241).
    max_output : ndarray of float64
        Largest output length of a member, tokens.
    sum_prompt : ndarray of float64
        Summed prompt lengths, tokens.
    """

    size: np.ndarray
    max_seq_len: np.ndarray
    max_output: np.ndarray
    sum_prompt: np.ndarray


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


def batch_aggregates(prompt, output, sizes=None) -> BatchAggregates:
    """The aggregates of consecutive batches, from their members' lengths.

    Parameters
    ----------
    prompt, output : array_like of float, shape (n,)
        Prompt and output lengths of the members, tokens (finite, >= 0),
        batch by batch: batch 0's ``sizes[0]`` members first, then batch 1's.
    sizes : array_like of int, shape (m,), optional
        Members of each batch, requests (>= 1, summing to n); default one
        batch of all n.

    Returns
    -------
    BatchAggregates
        Per batch: its size, the largest ``prompt + output``, the largest
        output and the summed prompts (numpy's summation order: for whole-
        token lengths, exactly the kernel's sequential sum).

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
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return BatchAggregates(size=sizes, max_seq_len=np.maximum.reduceat(p + o, starts),
                           max_output=np.maximum.reduceat(o, starts), sum_prompt=np.add.reduceat(p, starts))


def _h(gamma: float, size: np.ndarray) -> np.ndarray:
    """``1 + gamma (b-1)/max(1, b)``, in the kernel's order of operations."""
    return 1.0 + gamma * (size - 1.0) / np.maximum(1.0, size)


# --- fitting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FitResult:
    """A service model fitted to measured batch times by least squares.

    Attributes
    ----------
    model : MaxModel, LinearModel, DecodeModel or CalibratedModel
        The fitted model.
    params : dict
        The fitted parameters by field name (units as the model's fields).
    stderr : dict
        Their standard errors, from the Jacobian of the service time at the
        fit: the square roots of the diagonal of ``covariance``.  Exact (for
        independent errors of one variance) where the service time is linear
        in the parameter; first order for the ratios (``LinearModel.beta``,
        ``DecodeModel.gamma``, ``CalibratedModel.gamma``), accurate while
        their divisor's relative error is small.  For parameters in
        ``at_bound`` they are those of the unconstrained fit at that point.
    covariance : ndarray, shape (p, p)
        ``s**2 (J^T J)^-1`` with ``s**2 = RSS / dof``, in the order of ``params``.
    rmse : float
        Root mean square of the residuals ``service - model``, s.
    r2 : float
        Coefficient of determination, ``1 - RSS / sum((service - mean)**2)``
        (NaN if every measured time is the same).
    n : int
        Measurement rows fitted.
    dof : int
        Residual degrees of freedom, ``n - p``.
    at_bound : tuple of str
        Parameters the bounds hold at 0 (the unconstrained least squares
        would make them negative).
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

    def __str__(self) -> str:
        lines = [f"{type(self.model).__name__} fitted to {self.n} rows: rmse = {self.rmse:.6g} s, "
                 f"R^2 = {self.r2:.6f}"]
        for k, v in self.params.items():
            mark = " (at bound)" if k in self.at_bound else ""
            lines.append(f"  {k} = {v:.6g} +/- {self.stderr[k]:.3g}{mark}")
        return "\n".join(lines)


def _measurement_columns(owner: str, measurements, names: tuple) -> dict:
    """The columns ``names`` of ``measurements`` (a DataFrame, a mapping of
    arrays, a structured array, an xarray Dataset or an :class:`mbbatch.results.Table`),
    each validated and as float64, of one length."""
    if isinstance(measurements, np.ndarray):
        if measurements.dtype.names is None:
            raise TypeError(f"{owner}: measurements must be a DataFrame, a dict of arrays or a structured array "
                            f"with named fields; got an ndarray of {measurements.dtype} without field names")
        available = list(measurements.dtype.names)
    elif isinstance(measurements, (str, bytes)) or not hasattr(measurements, "__getitem__"):
        raise TypeError(f"{owner}: measurements must be a DataFrame, a dict of arrays or a structured array; "
                        f"got {type(measurements).__name__}")
    elif hasattr(measurements, "keys"):
        available = list(measurements.keys())
    elif hasattr(measurements, "columns"):
        available = list(measurements.columns)
    else:
        raise TypeError(f"{owner}: measurements must be a DataFrame, a dict of arrays or a structured array; "
                        f"got {type(measurements).__name__}")
    missing = [k for k in names if k not in available]
    if missing:
        need = ", ".join(f"{k} ({_UNITS[k]})" for k in names)
        raise ValueError(f"{owner} needs the columns {need}; measurements lack {', '.join(missing)} "
                         f"(its columns: {', '.join(map(str, available)) or 'none'})")
    cols = {}
    for k in names:
        arr = _check_values(k, np.asarray(measurements[k]), f"column {k}")
        if arr.ndim != 1:
            raise ValueError(f"{owner}: column {k} must be 1-D; got shape {arr.shape}")
        cols[k] = arr
    lengths = {k: v.size for k, v in cols.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{owner}: the columns must have one length; got "
                         + ", ".join(f"{k}: {m}" for k, m in lengths.items()))
    return cols


def _least_squares(owner: str, design: np.ndarray, y: np.ndarray, names: tuple, hint: str):
    """Non-negative linear least squares ``design @ c ~ y``: the columns
    scaled to unit norm, the unconstrained solution (``numpy.linalg.lstsq``)
    when it is non-negative, else the bounded one (``scipy.optimize.lsq_linear``,
    BVLS, exact for these few columns).  Returns ``c`` and the indices held at 0."""
    norms = np.sqrt(np.sum(design * design, axis=0))
    if np.any(norms == 0.0) or np.linalg.matrix_rank(design / np.where(norms > 0, norms, 1.0)) < design.shape[1]:
        raise ValueError(f"{owner}: the measurements do not determine {', '.join(names)} (the least-squares "
                         f"problem is rank deficient); {hint}")
    scaled = design / norms
    c, *_ = np.linalg.lstsq(scaled, y, rcond=None)
    held = ()
    if np.any(c < 0.0):
        from scipy.optimize import lsq_linear

        res = lsq_linear(scaled, y, bounds=(0.0, np.inf), method="bvls")
        c = np.maximum(res.x, 0.0)
        held = tuple(int(i) for i in np.flatnonzero(c == 0.0))
    return c / norms, held


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
    service time in the parameters).
    """

    _service_columns: tuple = ()
    _reads: tuple = ()
    _params: tuple = ()
    _fit_hint: str = ""

    def _args(self, what: str, needs: tuple, given: dict) -> dict:
        missing = [k for k in needs if given[k] is None]
        if missing:
            need = ", ".join(f"{k} ({_UNITS[k]})" for k in needs)
            raise TypeError(f"{type(self).__name__}.{what} needs {need}; {', '.join(missing)} not given")
        out = {k: _check_values(k, given[k]) for k in needs}
        if len(out) > 1:
            out = dict(zip(out, np.broadcast_arrays(*out.values())))
        if "max_seq_len" in out and "max_output" in out:
            bad = (out["max_seq_len"] < out["max_output"]).reshape(-1)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError("max_seq_len (the largest prompt + output) must be at least max_output; got "
                                 f"{float(out['max_seq_len'].reshape(-1)[i])!r} < {float(out['max_output'].reshape(-1)[i])!r} "
                                 f"(element {i})")
        return out

    def service_time(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None):
        """Service time of batches, s (Algorithm 3, step 4: lines 240-242).

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

        Only those the model's service time reads are needed (the class
        docstring's formula); they broadcast together.

        Returns
        -------
        float or ndarray
            Service times, s.
        """
        a = self._args("service_time", self._service_columns,
                       dict(size=size, max_seq_len=max_seq_len, max_output=max_output, sum_prompt=sum_prompt))
        return _scalar_or_array(self._service(**a))

    def times(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None) -> BatchTimes:
        """The four per-batch numbers the event kernel computes for a batch
        (service, decode TBT, time per output token, time to first token),
        arguments as :meth:`service_time`; the model's ``_reads`` are needed."""
        a = self._args("times", self._reads,
                       dict(size=size, max_seq_len=max_seq_len, max_output=max_output, sum_prompt=sum_prompt))
        return BatchTimes(*(_scalar_or_array(x) for x in self._times(**a)))

    def feedback_tbt(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None):
        """What Algorithm 7, step 2 (lines 480-488) feeds the SLA controller
        after each batch, s/token: the model's decode TBT where it provides
        one, else the legacy ``service / max(max_output, 1)`` (1 token for a
        batch of empty outputs, as the kernel).  Arguments as :meth:`times`."""
        t = self.times(size, max_seq_len, max_output, sum_prompt)
        legacy = t.service / np.maximum(_check_values("max_output", max_output), 1.0)
        return _scalar_or_array(np.where(np.asarray(t.decode_tbt) > 0.0, t.decode_tbt, legacy))

    def batch_times(self, prompt, output, sizes=None) -> BatchTimes:
        """:meth:`times` of consecutive batches given by their members'
        prompt and output lengths (tokens) and sizes (see :func:`batch_aggregates`)."""
        agg = batch_aggregates(prompt, output, sizes)
        return self.times(**agg._asdict())

    @classmethod
    def fit(cls, measurements, **fixed) -> FitResult:
        """Fit the model's parameters to measured batch service times.

        The service time is linear in coefficients ``c >= 0`` (products such
        as ``beta * gamma`` where the model multiplies parameters), so the
        fit is a non-negative linear least squares (``numpy.linalg.lstsq``,
        ``scipy.optimize.lsq_linear`` where a bound binds): the global least-
        squares optimum over the parameters' domains.  Standard errors come
        from the Jacobian of the service time in the model's own parameters.

        Parameters
        ----------
        measurements : pandas.DataFrame, dict of array_like, or structured ndarray
            One row per measured batch, with the columns the model reads
            (others are ignored): ``MaxModel``: ``max_output``, ``service``;
            ``LinearModel`` and ``CalibratedModel``: ``size``,
            ``max_seq_len``, ``service``; ``DecodeModel``: ``size``,
            ``sum_prompt``, ``max_output``, ``service``; ``PrefillModel``:
            ``sum_prompt``, ``service``.  ``size`` in
            requests (integers >= 1), lengths in tokens, ``service`` in s
            (all finite, >= 0).  :func:`batch_aggregates` gives the
            aggregates from members' lengths.  At least one row more than
            the model has parameters.
        **fixed
            Fields that are not fitted, passed to the model (``feedback``
            of :class:`CalibratedModel`).

        Returns
        -------
        FitResult

        Raises
        ------
        TypeError
            ``measurements`` is not a table, a column is not numeric, or
            ``size`` holds floats.
        ValueError
            A column is missing, non-finite or out of its domain; too few
            rows; the rows do not determine the parameters (e.g. one batch
            size only); the best fit puts a parameter whose domain is open
            at 0 (a time per token) at 0.
        """
        owner = f"{cls.__name__}.fit"
        bad = [k for k in fixed if k not in cls._fixed_fields()]
        if bad:
            raise TypeError(f"{owner}: {bad[0]} is {'fitted' if bad[0] in cls._params else 'not a field'}; "
                            f"the fields it takes fixed are: {', '.join(cls._fixed_fields()) or 'none'}")
        cols = _measurement_columns(owner, measurements, (*cls._service_columns, "service"))
        y = cols.pop("service")
        p = len(cls._params)
        n = y.size
        if n < p + 1:
            raise ValueError(f"{owner} needs at least {p + 1} measurement rows for {p} parameters "
                             f"({', '.join(cls._params)}) and an error estimate; got {n}")
        coef, held = _least_squares(owner, cls._design(**cols), y, cls._params, cls._fit_hint)
        params = cls._from_coef(coef)
        for name in cls._params:
            key = cls._param_keys[name]
            dom = PARAMS[key].domain
            if params[name] == 0.0 and not dom.lo_closed:
                raise ValueError(f"{owner}: the best fit has {name} = 0, outside its domain {dom}: the measured "
                                 f"service times do not grow with {cls._grows_with[name]}")
        model = cls(**params, **fixed)
        resid = y - model._service(**cols)
        rss = float(resid @ resid)
        dof = n - p
        jac = cls._jacobian(params, **cols)
        norms = np.sqrt(np.sum(jac * jac, axis=0))
        js = jac / np.where(norms > 0, norms, 1.0)
        cov = (rss / dof) * np.linalg.pinv(js.T @ js) / np.outer(norms, norms)
        tss = float(np.sum((y - y.mean()) ** 2))
        return FitResult(model=model, params=params,
                         stderr={k: float(math.sqrt(max(cov[i, i], 0.0))) for i, k in enumerate(cls._params)},
                         covariance=cov, rmse=math.sqrt(rss / n), r2=1.0 - rss / tss if tss > 0 else math.nan,
                         n=int(n), dof=int(dof), at_bound=tuple(cls._params[i] for i in held))

    @classmethod
    def _fixed_fields(cls) -> tuple:
        return tuple(f.name for f in fields(cls) if f.name not in cls._params)


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


@dataclass(frozen=True)
class DecodeModel(_Fitted):
    """Batch service = ``prefill_per_token * sum(prompt) + TBT(b) * max(output)``,
    ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` s/token (calibrated defaults).

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


@dataclass(frozen=True)
class CalibratedModel(_Fitted):
    """The specification's calibrated latency model as a batch service model.

    Service time (Algorithm 3's ``service_time_fn(|batch|, max_seq_len)``,
    lines 212 and 240-242, with ComputeDecodeTBT's ``h(b)``, line 505)::

        service = alpha + beta * h(b) * max_seq_len,   h(b) = 1 + gamma (b-1)/max(1, b)

    with ``max_seq_len`` the longest prompt + output of the batch (s).  What
    Algorithm 7 feeds the SLA controller (``recent_tbt``, lines 480-488)
    depends on ``feedback``:

    ``"calibrated"``
        ``beta h(b)``: ComputeDecodeTBT's calibrated branch (lines 502-506)
        provides the decode TBT (lines 481-483);
    ``"uncalibrated"``
        ``UNCALIBRATED_TBT`` = 5.74 ms whatever the batch: the fallback.
        ComputeDecodeTBT's ELSE branch (lines 507-508) still *returns* a
        decode TBT, so Algorithm 7 takes its "decode_tbt is PROVIDED"
        branch with the constant, not the legacy one.  Only the controller's
        feedback falls back: the batch's time is still the GPU's
        ``service_time_fn``, an input of Algorithms 3 and 5 (lines 212,
        309) that the specification never derives from the latency model.
        With ``D_SLA - eps_D`` above 5.74 ms the controller so never sees
        the latency grow and widens its interval towards ``B_max``;
    ``"legacy"``
        no decode TBT provided: ``service / max output_len`` (lines 484-487;
        1 token for a batch of empty outputs), as for :class:`LinearModel`.

    The fallback is a field, not a class: the three differ only in the
    controller's feedback on one service time, so one sweep axis
    (``feedback``) compares them on the same parameters and the same
    batches, and the parameter table keeps one row per parameter.

    The time per output token (what the SLA bounds in the metrics) is the
    GPU's ``beta h(b)`` whatever the feedback; the first token comes when
    the batch has ``max_output - 1`` token steps left:
    ``min(alpha + beta h(b) (max_seq_len - max_output + 1), service)`` after
    its start (the analogue of :class:`DecodeModel`'s ``prefill + TBT``; the
    specification has no TTFT).

    Parameters
    ----------
    alpha : float
        Fixed time per batch, s, >= 0.
    beta : float
        Time per token of the longest prompt + output at b = 1, s/token, > 0:
        the calibrated decode TBT at b = 1 (``latency_model.beta`` = 5.74 ms, line 503).
    gamma : float
        Growth of the time per token with batch size, >= 0 (0.316, line 504).
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
        """ComputeDecodeTBT (lines 501-510) as this model provides it to
        Algorithm 7, s/token: ``beta h(b)``, 5.74 ms, or 0 (none: legacy)."""
        b = _check_values("size", size)
        if self.feedback == "calibrated":
            return _scalar_or_array(self.beta * _h(self.gamma, b))
        return _scalar_or_array(np.full_like(b, UNCALIBRATED_TBT if self.feedback == "uncalibrated" else 0.0))

    def feedback_tbt(self, size=None, max_seq_len=None, max_output=None, sum_prompt=None):
        """What Algorithm 7, step 2 (lines 480-488) feeds the SLA controller,
        s/token: ``beta h(b)`` (calibrated: only ``size`` is needed), 5.74 ms
        (uncalibrated: ``size`` gives the shape), or the legacy
        ``service / max(max_output, 1)`` (``size``, ``max_seq_len`` and
        ``max_output`` needed)."""
        if self.feedback != "legacy":
            if size is None:
                raise TypeError("CalibratedModel.feedback_tbt needs size (requests); size not given")
            return self.decode_tbt(size)
        return super().feedback_tbt(size, max_seq_len, max_output, sum_prompt)

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


#: The models by their name in sweep specs (``service_model = ...``).
@dataclass(frozen=True)
class PrefillModel(_Fitted):
    """A prefill batch's time = ``a + b * sum(prompt)`` (s): the LAPS
    specification's prefill instances (:class:`~mbbatch.LAPS`).  Its time to
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

    def __post_init__(self):
        check_fields(self, {"a": "PrefillModel.a", "b": "PrefillModel.b"})

    def one_request(self, prompt: float, output: float) -> float:
        """Time of a prefill batch of one request of ``prompt`` tokens, s."""
        return self.a + self.b * prompt

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


SERVICE_MODELS = {"prefill": PrefillModel, "max": MaxModel, "linear": LinearModel, "decode": DecodeModel, "calibrated": CalibratedModel}
