"""The request model's requests: prompt and output lengths and a predicted
output length, in tokens.

A :class:`Workload` holds where the lengths come from (a distribution drawn
in the kernel, or a trace's arrays replayed) and the predictor of the output
length.  The batch service models are in :mod:`mbbatch.service_models`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


from ._validation import check_fields
from .params import default
from .lengths import as_service

__all__ = ["Workload"]


@dataclass(frozen=True, eq=False)
class Workload:
    """Token-level requests.

    Parameters
    ----------
    prompt, output : scipy.stats frozen distribution, Empirical or array_like
        Prompt and output lengths, tokens: any frozen continuous
        distribution (uniform, expon, lognorm, gamma, weibull_min are drawn
        in the kernel, any other before the run from its ``rvs``), an
        :class:`~mbbatch.lengths.Empirical` resampling of observed values, or
        an array replayed in order (a trace; see :meth:`from_trace`).
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

    @classmethod
    def from_trace(cls, trace, *, resample: bool = False, **kw) -> "Workload":
        """The prompt and output lengths of a :class:`~mbbatch.traces.Trace`:
        replayed in the trace's order (pair it with ``Replay(trace)`` for the
        trace's own arrivals), or, with ``resample``, each drawn independently
        from the trace's values (:class:`~mbbatch.lengths.Empirical`, which
        loses the pairing of a request's prompt and output).  Other keywords
        go to the constructor."""
        from .lengths import Empirical
        from .traces import Trace

        if not isinstance(trace, Trace):
            raise TypeError(f"trace must be an mbbatch.traces.Trace (from a loader); got {type(trace).__name__}")
        prompt, output = trace.prompt_tokens.astype(float), trace.output_tokens.astype(float)
        if resample:
            prompt, output = Empirical(prompt), Empirical(output)
        return cls(prompt=prompt, output=output, **kw)

    def describe(self) -> dict:
        d = {f"prompt_{k.removeprefix('service_')}" if k != "service" else "prompt": v
             for k, v in self._prompt.description.items()}
        d.update({f"output_{k.removeprefix('service_')}" if k != "service" else "output": v
                  for k, v in self._output.description.items()})
        d.update(integer_lengths=bool(self.integer_lengths), predictor_sigma=self.predictor_sigma)
        return d

