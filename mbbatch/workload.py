"""Token-level requests and the batch service models of the dynamic policies.

A request has a prompt length, an output length and a predicted output
length, in tokens.  A batch's service time comes from one of three models,
chosen by class:

- :class:`MaxModel`: the multi-bin paper's max of member service times, each
  ``base + per_token * output_len`` (Section 6.1's linear fit);
- :class:`LinearModel`: ``base + alpha * max_seq_len * (1 + beta (b-1)/b)``
  with ``max_seq_len = max(prompt + output)`` (design notes, Section 5.1);
- :class:`DecodeModel`: ``prefill + TBT(b) * max output_len`` with
  ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` (calibrated beta = 5.74 ms,
  gamma = 0.316) and ``prefill = prefill_per_token * sum(prompt_len)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._validation import check_fields
from .params import default
from .service import as_service

__all__ = ["Workload", "MaxModel", "LinearModel", "DecodeModel", "Memory", "SLAController"]


@dataclass(frozen=True, eq=False)
class Workload:
    """Token-level requests.

    Parameters
    ----------
    prompt, output : scipy.stats frozen distribution or array_like
        Prompt and output lengths, tokens (uniform, expon, lognorm, gamma,
        weibull_min are drawn in the kernel; an array replays a trace).
        Values, and a distribution's draws, must lie in [0, 1e290]; see
        :func:`~mbbatch.service.as_service`.
    integer_lengths : bool
        Round draws up to whole tokens (at least 1).  Default True.
    predictor_sigma : float
        Log-normal error of the output-length predictor:
        ``predicted = output * exp(sigma Z)``.  0 (default) is the oracle.
    """

    prompt: object
    output: object
    integer_lengths: bool = default("integer_lengths")
    predictor_sigma: float = default("predictor_sigma")
    _prompt: object = field(init=False, repr=False)
    _output: object = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_prompt", as_service(self.prompt, "prompt"))
        object.__setattr__(self, "_output", as_service(self.output, "output"))
        check_fields(self, {"integer_lengths": "integer_lengths", "predictor_sigma": "predictor_sigma"})

    def describe(self) -> dict:
        d = {f"prompt_{k.removeprefix('service_')}" if k != "service" else "prompt": v
             for k, v in self._prompt.description.items()}
        d.update({f"output_{k.removeprefix('service_')}" if k != "service" else "output": v
                  for k, v in self._output.description.items()})
        d.update(integer_lengths=bool(self.integer_lengths), predictor_sigma=self.predictor_sigma)
        return d


@dataclass(frozen=True)
class MaxModel:
    """Batch service = max over members of ``base + per_token * output_len`` (s)."""

    base: float = default("base")
    per_token: float = default("per_token")
    code = 0

    def __post_init__(self):
        check_fields(self, {"base": "base", "per_token": "per_token"})

    def vector(self):
        return np.array([self.base, self.per_token, 0, 0, 0, 0, 0], dtype=np.float64)


@dataclass(frozen=True)
class LinearModel:
    """Batch service = ``base + alpha * max_seq_len * (1 + beta (b-1)/b)`` (s)."""

    base: float = default("base")
    alpha: float = default("LinearModel.alpha")
    beta: float = default("LinearModel.beta")
    code = 1

    def __post_init__(self):
        check_fields(self, {"base": "base", "alpha": "LinearModel.alpha", "beta": "LinearModel.beta"})

    def vector(self):
        return np.array([self.base, 0, self.alpha, self.beta, 0, 0, 0], dtype=np.float64)


@dataclass(frozen=True)
class DecodeModel:
    """Batch service = ``prefill_per_token * sum(prompt) + TBT(b) * max(output)``,
    ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` s/token (calibrated defaults)."""

    beta: float = default("DecodeModel.beta")
    gamma: float = default("gamma")
    prefill_per_token: float = default("prefill_per_token")
    code = 2

    def __post_init__(self):
        check_fields(self, {"beta": "DecodeModel.beta", "gamma": "gamma", "prefill_per_token": "prefill_per_token"})

    def vector(self):
        return np.array([0, 0, 0, 0, self.prefill_per_token, self.beta, self.gamma], dtype=np.float64)


@dataclass(frozen=True)
class Memory:
    """GPU memory for the KV cache (Algorithm 1).

    Token capacity ``eta = (m_max_gb - m_model_gb) / kv_mem_per_token_gb``.
    ``variant="l0"`` keeps the specification's buffer ``L0 = 0.1 eta``;
    ``variant="clt"`` the largest b with ``b mu + z_{1-eps_m} sigma sqrt(b) <= eta``
    from the running mean and deviation of tokens per request.  ``enabled=False``
    turns the constraint off (batches above eta are then counted, not prevented).
    Defaults: an 80 GB GPU, 8 GB of weights, 0.4 MB of KV cache per token
    (about Phi-3.5-mini in fp16): eta = 180,000 tokens.
    """

    m_max_gb: float = default("m_max_gb")
    m_model_gb: float = default("m_model_gb")
    kv_mem_per_token_gb: float = default("kv_mem_per_token_gb")
    variant: str = default("Memory.variant")
    eps_m: float = default("eps_m")
    enabled: bool = default("enabled")

    def __post_init__(self):
        check_fields(self, {"m_max_gb": "m_max_gb", "m_model_gb": "m_model_gb",
                            "kv_mem_per_token_gb": "kv_mem_per_token_gb"})
        if self.m_model_gb >= self.m_max_gb:
            raise ValueError(f"m_model_gb must be less than m_max_gb; got {self.m_model_gb} >= {self.m_max_gb}")
        if not math.isfinite(self.eta):
            raise ValueError("m_max_gb, m_model_gb and kv_mem_per_token_gb must give a finite token capacity "
                             "eta = (m_max_gb - m_model_gb) / kv_mem_per_token_gb; got "
                             f"({self.m_max_gb!r} - {self.m_model_gb!r}) / {self.kv_mem_per_token_gb!r}")
        check_fields(self, {"variant": "Memory.variant", "eps_m": "eps_m", "enabled": "enabled"})

    @property
    def eta(self) -> float:
        """Token capacity, tokens."""
        return (self.m_max_gb - self.m_model_gb) / self.kv_mem_per_token_gb


@dataclass(frozen=True)
class SLAController:
    """The SLA controller of Algorithm 2 and its feedback (Algorithm 7).

    Parameters
    ----------
    d_sla : float
        Target decode time per token D_SLA, s/token.
    eps_d : float
        Tolerance band around D_SLA, s/token.
    b_min, b_max : int
        Batch size bounds B_min <= B_max, requests.
    alpha, delta : int
        Expansion and correction steps (specification: 4 and 2).
    variant : {"spec", "multiplicative"}
        "spec": the specification's pseudocode (default); "multiplicative":
        the design notes' compute_b_SLA (0.8 / 0.2 / 0.1 factors).
    """

    d_sla: float = default("d_sla")
    eps_d: float = default("eps_d")
    b_min: int = default("b_min")
    b_max: int = default("b_max")
    alpha: int = default("SLAController.alpha")
    delta: int = default("delta")
    variant: str = default("controller")

    def __post_init__(self):
        check_fields(self, {"d_sla": "d_sla", "eps_d": "eps_d", "b_min": "b_min", "b_max": "b_max"})
        if self.b_min > self.b_max:
            raise ValueError(f"b_min must be at most b_max; got b_min={self.b_min}, b_max={self.b_max}")
        check_fields(self, {"alpha": "SLAController.alpha", "delta": "delta", "variant": "controller"})
