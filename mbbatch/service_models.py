"""Batch service models: how long a batch takes, from its members' lengths.

A batch's service time comes from one of three models, chosen by class:

- :class:`MaxModel`: the multi-bin paper's max of member service times, each
  ``base + per_token * output_len`` (Section 6.1's linear fit); with
  ``base = 0, per_token = 1`` a request's output length is its service time
  in s, which is how the paper's model (``service=dist``) is one case of the
  request model;
- :class:`LinearModel`: ``base + alpha * max_seq_len * (1 + beta (b-1)/b)``
  with ``max_seq_len = max(prompt + output)`` (design notes, Section 5.1);
- :class:`DecodeModel`: ``prefill + TBT(b) * max output_len`` with
  ``TBT(b) = beta (1 + gamma (b-1)/max(1, b))`` (calibrated beta = 5.74 ms,
  gamma = 0.316) and ``prefill = prefill_per_token * sum(prompt_len)``.

Parameters, their domains and defaults are those of the parameter table
(:mod:`mbbatch.params`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import check_fields
from .params import default

__all__ = ["MaxModel", "LinearModel", "DecodeModel", "SERVICE_MODELS"]


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


#: The models by their name in sweep specs (``service_model = ...``).
SERVICE_MODELS = {"max": MaxModel, "linear": LinearModel, "decode": DecodeModel}
