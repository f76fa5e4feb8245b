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

from .aggregates import DENSE, BatchAggregates, BatchTimes, batch_aggregates, extra_experts, uniform_aggregates
from .batch import UNCALIBRATED_TBT, CalibratedModel, DecodeModel, LinearModel, MaxModel, PrefillModel
from .fitting import FitResult
from .iteration import COST_TERMS, DENSE_FIELDS, NO_COST, IterationModel

__all__ = ["MaxModel", "LinearModel", "DecodeModel", "CalibratedModel", "PrefillModel", "IterationModel",
           "SERVICE_MODELS", "UNCALIBRATED_TBT", "BatchTimes", "BatchAggregates", "batch_aggregates", "FitResult",
           "extra_experts", "uniform_aggregates", "DENSE", "DENSE_FIELDS", "NO_COST", "COST_TERMS"]

#: The models by their name in sweep specs (``service_model = ...``).
#: (``"profile"``: an IterationModel fitted to a measured accelerator, :mod:`mbbatch.profiles`, by name)
SERVICE_MODELS = {"prefill": PrefillModel, "max": MaxModel, "linear": LinearModel, "decode": DecodeModel,
                  "calibrated": CalibratedModel, "iteration": IterationModel, "profile": IterationModel}
