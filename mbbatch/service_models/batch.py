"""The batch models: :class:`MaxModel`, :class:`LinearModel`,
:class:`DecodeModel`, :class:`CalibratedModel` and :class:`PrefillModel`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._kernels import dynamic as _d
from .._validation import check_fields
from ..params import default
from .aggregates import _check_values, _h, _scalar_or_array
from .fitting import _Fitted

#: the kernel's code of CalibratedModel's feedback rules
_FEEDBACK_CODES = {"calibrated": _d.MODEL_CALIBRATED, "uncalibrated": _d.MODEL_CALIBRATED_UNCALIBRATED,
                   "legacy": _d.MODEL_CALIBRATED_LEGACY}
#: ComputeDecodeTBT's value when the latency model is not calibrated, s/token
#: (Pang et al.'s ComputeDecodeTBT: a default of 5.74 ms), as the kernel feeds it.
UNCALIBRATED_TBT = _d.UNCALIBRATED_TBT


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
    #: its fields by their sweep-spec keys
    spec_keys: ClassVar[dict] = {"base": "base", "per_token": "per_token"}
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
    spec_keys: ClassVar[dict] = {"base": "base", "linear_alpha": "alpha", "linear_beta": "beta"}
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
    spec_keys: ClassVar[dict] = {"decode_beta": "beta", "gamma": "gamma", "prefill_per_token": "prefill_per_token"}
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
    spec_keys: ClassVar[dict] = {"calibrated_alpha": "alpha", "calibrated_beta": "beta", "gamma": "gamma",
                                 "feedback": "feedback"}
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
                     context_steps=None, expert_reads=None, prefill_squares=None):
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
    spec_keys: ClassVar[dict] = {"prefill_a": "a", "prefill_b": "b"}
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
