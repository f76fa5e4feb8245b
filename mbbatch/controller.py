"""The configuration of the dynamic policies' controllers: the GPU memory
that bounds a batch (Algorithm 1) and the SLA controller (Algorithms 2 and 7).

Parameters, their domains and defaults are those of the parameter table
(:mod:`mbbatch.params`); the controllers themselves run in the kernels
(:mod:`mbbatch._kernels.controller`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from ._validation import check_fields
from .params import default

__all__ = ["Memory", "SLAController", "D_SLA_LIKELY_MAX"]

#: The largest D_SLA (s/token) taken as meant: a decode time per token above
#: it, a second or more, is almost surely milliseconds given for seconds
#: (``--d-sla 20`` for 20 ms, 0.02 s/token), warned about.  Measured decode
#: times per token are a few to a few hundred milliseconds.
D_SLA_LIKELY_MAX = 1.0


@dataclass(frozen=True)
class Memory:
    """GPU memory for the KV cache (Algorithm 1).

    Token capacity ``eta = (m_max_gb - m_model_gb) / kv_mem_per_token_gb``.
    ``variant="l0"`` keeps Algorithm 1's buffer ``L0 = 0.1 eta`` (Pang et al., 2025,
    arXiv:2503.05248);
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
        Target decode time per token D_SLA, s/token (7.4e-3 for 7.4 ms;
        above :data:`D_SLA_LIKELY_MAX`, 1 s/token, a ``UserWarning`` says
        it is probably milliseconds).
    eps_d : float
        Tolerance band around D_SLA, s/token.
    b_min, b_max : int
        Batch size bounds B_min <= B_max, requests.
    alpha, delta : int
        Expansion and correction steps (Pang et al.'s: 4 and 2).
    variant : {"spec", "multiplicative"}
        "spec": Algorithm 2 as Pang et al. write it (default); "multiplicative":
        a multiplicative ``compute_b_SLA`` (0.8 / 0.2 / 0.1 factors).
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
        if self.d_sla > D_SLA_LIKELY_MAX:
            warnings.warn(f"d_sla is in s/token; got {self.d_sla:g} s/token, above {D_SLA_LIKELY_MAX:g} s per "
                          f"token: almost surely milliseconds (for {self.d_sla:g} ms, d_sla = "
                          f"{self.d_sla / 1000:g})", UserWarning, stacklevel=3)
        if self.b_min > self.b_max:
            raise ValueError(f"b_min must be at most b_max; got b_min={self.b_min}, b_max={self.b_max}")
        check_fields(self, {"alpha": "SLAController.alpha", "delta": "delta", "variant": "controller"})
