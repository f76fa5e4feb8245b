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

from ._validation import DOMAINS, check_choice, check_count, check_flag, check_scalar_real
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
    integer_lengths: bool = True
    predictor_sigma: float = 0.0
    _prompt: object = field(init=False, repr=False)
    _output: object = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_prompt", as_service(self.prompt, "prompt"))
        object.__setattr__(self, "_output", as_service(self.output, "output"))
        object.__setattr__(self, "integer_lengths", check_flag("integer_lengths", self.integer_lengths))
        object.__setattr__(self, "predictor_sigma", check_scalar_real("predictor_sigma", self.predictor_sigma))

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

    base: float = 0.0
    per_token: float = 1.0
    code = 0

    def __post_init__(self):
        object.__setattr__(self, "base", check_scalar_real("base", self.base))
        object.__setattr__(self, "per_token", check_scalar_real("per_token", self.per_token))

    def vector(self):
        return np.array([self.base, self.per_token, 0, 0, 0, 0, 0], dtype=np.float64)


@dataclass(frozen=True)
class LinearModel:
    """Batch service = ``base + alpha * max_seq_len * (1 + beta (b-1)/b)`` (s)."""

    base: float = 0.0
    alpha: float = 1e-3
    beta: float = 0.1
    code = 1

    def __post_init__(self):
        object.__setattr__(self, "base", check_scalar_real("base", self.base))
        object.__setattr__(self, "alpha", check_scalar_real("alpha", self.alpha, DOMAINS["LinearModel.alpha"]))
        object.__setattr__(self, "beta", check_scalar_real("beta", self.beta, DOMAINS["LinearModel.beta"]))

    def vector(self):
        return np.array([self.base, 0, self.alpha, self.beta, 0, 0, 0], dtype=np.float64)


@dataclass(frozen=True)
class DecodeModel:
    """Batch service = ``prefill_per_token * sum(prompt) + TBT(b) * max(output)``,
    ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` s/token (calibrated defaults)."""

    beta: float = 5.74e-3
    gamma: float = 0.316
    prefill_per_token: float = 0.0
    code = 2

    def __post_init__(self):
        object.__setattr__(self, "beta", check_scalar_real("beta", self.beta, DOMAINS["DecodeModel.beta"]))
        object.__setattr__(self, "gamma", check_scalar_real("gamma", self.gamma))
        object.__setattr__(self, "prefill_per_token",
                           check_scalar_real("prefill_per_token", self.prefill_per_token))

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

    m_max_gb: float = 80.0
    m_model_gb: float = 8.0
    kv_mem_per_token_gb: float = 4e-4
    variant: str = "l0"
    eps_m: float = 0.05
    enabled: bool = True

    def __post_init__(self):
        object.__setattr__(self, "m_max_gb", check_scalar_real("m_max_gb", self.m_max_gb))
        object.__setattr__(self, "m_model_gb", check_scalar_real("m_model_gb", self.m_model_gb))
        object.__setattr__(self, "kv_mem_per_token_gb",
                           check_scalar_real("kv_mem_per_token_gb", self.kv_mem_per_token_gb))
        if self.m_model_gb >= self.m_max_gb:
            raise ValueError(f"m_model_gb must be less than m_max_gb; got {self.m_model_gb} >= {self.m_max_gb}")
        if not math.isfinite(self.eta):
            raise ValueError("m_max_gb, m_model_gb and kv_mem_per_token_gb must give a finite token capacity "
                             "eta = (m_max_gb - m_model_gb) / kv_mem_per_token_gb; got "
                             f"({self.m_max_gb!r} - {self.m_model_gb!r}) / {self.kv_mem_per_token_gb!r}")
        object.__setattr__(self, "variant", check_choice("variant", self.variant, ("l0", "clt")))
        object.__setattr__(self, "eps_m", check_scalar_real("eps_m", self.eps_m))
        object.__setattr__(self, "enabled", check_flag("enabled", self.enabled))

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

    d_sla: float = 7.5e-3
    eps_d: float = 5e-5
    b_min: int = 1
    b_max: int = 256
    alpha: int = 4
    delta: int = 2
    variant: str = "spec"

    def __post_init__(self):
        object.__setattr__(self, "d_sla", check_scalar_real("d_sla", self.d_sla))
        object.__setattr__(self, "eps_d", check_scalar_real("eps_d", self.eps_d))
        object.__setattr__(self, "b_min", check_count("b_min", self.b_min))
        object.__setattr__(self, "b_max", check_count("b_max", self.b_max))
        if self.b_min > self.b_max:
            raise ValueError(f"b_min must be at most b_max; got b_min={self.b_min}, b_max={self.b_max}")
        object.__setattr__(self, "alpha", check_count("alpha", self.alpha, DOMAINS["SLAController.alpha"]))
        object.__setattr__(self, "delta", check_count("delta", self.delta))
        object.__setattr__(self, "variant", check_choice("variant", self.variant, ("spec", "multiplicative")))
