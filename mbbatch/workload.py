"""The request model's requests: prompt and output lengths and a predicted
output length, in tokens.

A :class:`Workload` holds where the lengths come from (a distribution drawn
in the kernel, or a trace's arrays replayed) and the predictor of the output
length.  The batch service models are in :mod:`mbbatch.service_models`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._validation import check_fields
from .params import default
from .lengths import as_service

__all__ = ["Workload"]


@dataclass(frozen=True, eq=False)
class Workload:
    """Token-level requests.

    Parameters
    ----------
    prompt, output : scipy.stats frozen distribution or array_like
        Prompt and output lengths, tokens (uniform, expon, lognorm, gamma,
        weibull_min are drawn in the kernel; an array replays a trace).
        Values, and a distribution's draws, must lie in [0, 1e290]; see
        :func:`~mbbatch.lengths.as_service`.
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

