"""The iteration model: an engine iteration's time, its cost declared once
(:mod:`mbbatch._kernels.cost`), and a batch's time as the iterations that
serve it."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from .._kernels import cost as _cost
from .._kernels import dynamic as _d
from .._validation import check_fields
from ..params import default
from .aggregates import _check_experts, _check_values, _scalar_or_array, extra_experts
from .batch import PrefillModel
from .fitting import _Fitted

#: the kernels' mixture-of-experts fields of a model without the term (per expert 0, so no experts read)
DENSE_FIELDS = MappingProxyType(dict(expert_span=0.0, expert_miss=1.0))
#: the iteration cost's terms, declared once (:data:`mbbatch._kernels.cost.TERMS`)
COST_TERMS = _cost.TERMS
#: the kernels' iteration-cost fields of a model with none (:mod:`mbbatch._kernels.cost`)
NO_COST = MappingProxyType(dict.fromkeys(_cost.FIELDS, 0.0))


@dataclass(frozen=True)
class IterationModel(_Fitted):
    """The time of one engine iteration, linear in what it does, and a batch's
    time as the iterations that serve it.

    An iteration takes::

        step + prefill_per_token * (prompt tokens it prefills)
             + per_sequence * (sequences it decodes)
             + per_context_token * (context tokens those sequences attend over)
             + per_expert * extra_experts(E, k, tokens it processes)
             + prefill_attention * (its prompts' part of their squares, P^2)

    (the cost's terms, declared once in :mod:`mbbatch._kernels.cost`; a
    prompt chunk from token a to a + c adds (a + c)^2 - a^2, a whole prompt
    of P tokens P^2, the quadratic prefill term of DistServe's and Vidur's
    models: Zhong et al., 2024, arXiv:2401.09670; Agrawal et al., 2024,
    arXiv:2405.05465)

    ``step`` is what every iteration pays (reading the weights, launching the
    kernels), the prefill term the prompts' compute, ``per_sequence`` the
    per-sequence work of a decode step (sampling, the new token's layers),
    and ``per_context_token`` the attention over the KV cache, which grows
    with batch size x context (Kwon et al., 2023, "Efficient memory
    management for large language model serving with PagedAttention",
    arXiv:2309.06180; Agrawal et al., 2024, "Vidur: a large-scale simulation
    framework for LLM inference", arXiv:2405.05465, model an iteration so).
    A batch run to completion pays ``setup`` once (scheduling, tokenizing,
    admission), then its prefill iteration, which gives every member its
    first token, then one decode iteration per further token:
    ``D = max(max_output - 1, 0)`` of them::

        prefill = setup + step + prefill_per_token * sum(prompt) + per_expert * x(sum(prompt))
        decode  = step * D + per_sequence * S + per_context_token * K + per_expert * R
        service = prefill + decode

    where, with ``finished="leave"`` (finished members leave the batch, as
    the engines measured in :mod:`mbbatch.profiles` do), ``S`` is the
    members' decode steps ``sum(d_i)``, ``d_i = max(output_i - 1, 0)``, and
    ``K`` the context they attend over, ``sum(prompt_i d_i + d_i (d_i + 1)
    / 2)`` (a member's context at its j-th decode step is ``prompt_i + j``
    tokens: :class:`BatchAggregates`' ``sequence_steps`` and
    ``context_steps``) and ``R`` the experts its decode iterations read,
    ``sum_j x(b_j)`` over them, ``b_j`` the members still decoding
    (``expert_reads``); with ``finished="stay"`` (a padded engine: every
    member steps until the longest is done) ``S = b D``, ``K = sum(prompt)
    D + b D (D + 1) / 2`` and ``R = D x(b)``.

    The expert term is a mixture of experts' (``experts`` E > 0, each token
    routed to ``experts_per_token`` k of them, e.g. Mixtral's 8 and 2): ``x =``
    :func:`extra_experts`, the experts an iteration's tokens read beyond its
    first token's k, which grows with the batch and saturates at ``E - k``;
    ``per_expert`` is the time to read one expert's weights.  A dense model
    (``E = 0``, the default) has none.  Fitted to the Mixtral-8x7B
    measurements it takes 1.6 ms on four A100s and 2.4 ms on one MI300X
    (an expert's 5.6 G parameters, 11 GB in 16 bits, over their memory
    bandwidth take 1.4 ms and 2.1 ms), and it brings those profiles' held-out
    errors from 11-20 % to 0.4-6 % where their engines read the experts a
    batch routes to (vLLM); engines that read every expert at every
    iteration fit it at about 0 (llama.cpp).  The time to first token is ``prefill``; the
    decode time between tokens (Algorithm 7's feedback, and the time per
    output token the SLA bounds) is the batch's mean decode iteration,
    ``decode / D`` (with ``D = 0``, the iteration it would take: ``step +
    per_sequence b + per_context_token (sum(prompt) + b)``).

    The measurements fitted (LLM-Inference-Bench: Chitty-Venkata et al.,
    2024, arXiv:2411.00136) time whole batches of one prompt and output
    length, equal to each other, so ``setup`` and ``step``, and the prefill
    and decode context, are told apart only by how they scale; ``setup``
    is there because those batches' times have a part that neither length
    nor size moves (without it, the median over the 227 profiles of their
    leave-one-out relative errors is 5.4 % instead of 5.2 %).

    The defaults are the fit of the profile ``H100/vLLM/Meta-Llama-3-8B/tp1``
    (:func:`mbbatch.profiles.get`), rounded to 3 significant digits.

    Parameters
    ----------
    setup : float
        Fixed time per batch, s, >= 0.
    step : float
        Fixed time per iteration, s, >= 0.
    prefill_per_token : float
        Time per prompt token prefilled, s/token, >= 0.
    per_sequence : float
        Time per sequence decoded in an iteration, s, >= 0.
    per_context_token : float
        Time per context token a decoded sequence attends over, s/token, >= 0.
    per_expert : float
        Time per expert read beyond an iteration's first token's, s/expert,
        >= 0 (0 unless ``experts`` > 0).
    finished : {"leave", "stay"}
        Whether a finished member leaves the batch's decode iterations.
    experts : int
        Experts per layer of a mixture-of-experts model, >= 0; 0: dense.
    experts_per_token : int
        Experts each token is routed to, in [1, experts].
    profile : str or None
        The hardware profile it was fitted to (:mod:`mbbatch.profiles`), or
        None; recorded with the runs it times.
    prefill_attention : float
        Time per unit of the prompts' squares prefilled, s/token^2, >= 0;
        default 0 (a fit holds it at 0 unless measured prefills vary the
        prompt's length: :attr:`FitResult.unfitted`).

    A decode iteration must take time: one of ``step``, ``per_sequence`` and
    ``per_context_token`` is positive.

    Examples
    --------
    >>> m = IterationModel(setup=0.0, step=0.01, prefill_per_token=1e-4, per_sequence=1e-3,
    ...                    per_context_token=1e-6)
    >>> round(m.service_time(size=2, prompt=100, output=3), 9)   # 0.03 + 0.02 + 2 * 2e-3 + 1e-6 * 2 * (200 + 3)
    0.054406
    """

    setup: float = default("IterationModel.setup")
    step: float = default("IterationModel.step")
    prefill_per_token: float = default("IterationModel.prefill_per_token")
    per_sequence: float = default("IterationModel.per_sequence")
    per_context_token: float = default("IterationModel.per_context_token")
    per_expert: float = default("IterationModel.per_expert")
    finished: str = default("IterationModel.finished")
    experts: int = default("IterationModel.experts")
    experts_per_token: int = default("IterationModel.experts_per_token")
    profile: str | None = None
    prefill_attention: float = default("IterationModel.prefill_attention")
    code = 6
    _service_columns = ("size", "max_output", "sum_prompt", "sequence_steps", "context_steps", "expert_reads",
                        "prefill_squares")
    _reads = _service_columns
    _params = _cost.NAMES
    _param_keys: ClassVar[dict] = {k: f"IterationModel.{k}" for k in _params}
    #: its fields by their sweep-spec keys (the cost's terms' own, :data:`mbbatch._kernels.cost.TERMS`)
    spec_keys: ClassVar[dict] = {**{t.spec: t.name for t in _cost.TERMS}, "finished": "finished", "experts": "experts",
                                 "experts_per_token": "experts_per_token"}
    _grows_with: ClassVar[dict] = {}
    _fit_hint = ("the batches must differ in size, prompt and output so that each term's scaling is seen: at "
                 "least three sizes and three lengths")
    #: its first token at the end of its prefill iteration; its decode steps as the batch's mean
    _phase_columns: ClassVar[dict] = {"prefill": ("sum_prompt", "prefill_squares"),
                                      "per_token": ("size", "max_output", "sum_prompt", "sequence_steps",
                                                    "context_steps", "expert_reads")}

    def __post_init__(self):
        check_fields(self, {**self._param_keys, "finished": "IterationModel.finished",
                            "experts": "IterationModel.experts",
                            "experts_per_token": "IterationModel.experts_per_token"})
        if self.experts and self.experts_per_token > self.experts:
            raise ValueError(f"IterationModel: experts_per_token must be in [1, experts = {self.experts}]; got "
                             f"{self.experts_per_token}")
        if self.per_expert > 0.0 and not self.experts:
            raise ValueError(f"IterationModel: per_expert = {self.per_expert!r} times a mixture of experts; give its "
                             "experts (> 0 experts per layer, e.g. 8 for Mixtral) or per_expert = 0")
        if self.profile is not None and not isinstance(self.profile, str):
            raise TypeError(f"profile must be a profile's name (str) or None; got {type(self.profile).__name__}")
        if self.step == 0.0 and self.per_sequence == 0.0 and self.per_context_token == 0.0:
            raise ValueError("IterationModel: a decode iteration must take time: one of step, per_sequence and "
                             "per_context_token must be > 0; got all three 0")

    def kernel_fields(self) -> dict:
        """The event kernel's fields of the model (``_kernels.dynamic.MODEL``)."""
        return dict(model=_d.MODEL_ITERATION, padded=int(self.finished == "stay"), **self.cost_fields(),
                    **self.expert_fields())

    def coefficients(self) -> np.ndarray:
        """The iteration cost's coefficients, in the order of its terms
        (:data:`mbbatch._kernels.cost.TERMS`, the order the kernels read)."""
        return np.array([getattr(self, name) for name in _cost.NAMES])

    def cost_fields(self) -> dict:
        """The kernels' fields of the iteration cost (``cost_<term>``)."""
        return dict(zip(_cost.FIELDS, (float(c) for c in self.coefficients())))

    def expert_fields(self) -> dict:
        """The kernels' fields of the mixture-of-experts term besides its
        coefficient: :func:`extra_experts`' ``E - k`` and ``1 - k/E``
        (``expert_span``, ``expert_miss``; 0 and 1 for a dense model, whose
        term is 0)."""
        if not self.experts or self.per_expert == 0.0:
            return dict(DENSE_FIELDS)
        return dict(expert_span=float(self.experts - self.experts_per_token),
                    expert_miss=1.0 - self.experts_per_token / self.experts)

    def _experts(self) -> tuple:
        return (self.experts, self.experts_per_token)

    def _attention(self) -> bool:
        return self.prefill_attention > 0.0

    @classmethod
    def _fixed_experts(cls, owner: str, fixed: dict) -> tuple:
        return _check_experts(owner, (fixed.get("experts", default("IterationModel.experts")),
                                      fixed.get("experts_per_token", default("IterationModel.experts_per_token"))))

    @classmethod
    def _unfitted(cls, kinds) -> dict:
        # the prefill's attention (P^2) is told from its linear part (P) and from the decode context's
        # attention only by prefills of varied prompt lengths timed alone
        lengths = np.unique(np.concatenate([np.round(sub["prefill_squares"] / np.maximum(sub["sum_prompt"], 1.0), 6)
                                            for t, sub in kinds if t == "prefill"] or [np.empty(0)]))
        if lengths.size >= 3:
            return {}
        return {"prefill_attention": "no measured prefill (a prefill column) varies the prompt's length over at "
                                     "least 3 values, so the prefill's attention, growing as P^2, is not told from "
                                     "its P and from the decode context's attention"}

    @classmethod
    def _fitted_params(cls, fixed: dict) -> tuple:
        # a dense model (no experts) has no expert term to fit
        return (cls._params if fixed.get("experts", default("IterationModel.experts"))
                else tuple(p for p in cls._params if p != "per_expert"))

    def one_request(self, prompt: float, output: float) -> float:
        """Service time of a batch of one request of these lengths, s."""
        return float(self.service_time(size=1, prompt=prompt, output=output))

    def decode_step(self, size=1, context=0.0):
        """The time of one decode iteration of ``size`` sequences of
        ``context`` tokens each (prompt plus those generated), s:
        ``step + per_sequence size + per_context_token size context +
        per_expert extra_experts(size)`` (vectorized)."""
        b = _check_values("size", size)
        c = _check_values("prompt", context, "context")
        return _scalar_or_array(_cost.cost_py(self.coefficients(), 0.0, 1.0, 0.0, b, b * c,
                                              extra_experts(*self._experts(), b), 0.0))

    def prefill_model(self) -> "PrefillModel":
        """The prefill batches of this engine as a :class:`PrefillModel`:
        ``a = setup + step``, ``b = prefill_per_token`` (LAPS's prefill
        instances; exact, a prefill batch being one prefill iteration), and
        for a mixture of experts ``per_expert (E - k)`` added to ``a``: a
        prefill batch's tokens read every expert, within ``(1 - k/E)^(T -
        1)`` of them for ``T`` tokens (under 1 % from 17 tokens at Mixtral's
        2 of 8)."""
        if self.prefill_attention > 0.0:
            raise ValueError(f"prefill_attention = {self.prefill_attention:g}: a PrefillModel's batch time is linear "
                             "in its prompt tokens; give LAPS a PrefillModel, or an IterationModel with "
                             "prefill_attention = 0")
        if self.prefill_per_token == 0.0:
            why = (f" (profile {self.profile}'s fit holds it at 0: its batches' prompts and outputs have one "
                   "length, which cannot tell prefill from decode apart)" if self.profile else "")
            raise ValueError(f"prefill_per_token must be > 0 for a prefill batch's time; got 0{why}; give LAPS "
                             "a PrefillModel, or an IterationModel with a measured prefill_per_token")
        return PrefillModel(a=self.setup + self.step + self.per_expert * self.expert_fields()["expert_span"],
                            b=self.prefill_per_token)

    def _times(self, size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads, prefill_squares,
               **_):
        # the kernel's order of operations (_kernels.common.iteration_times)
        e = self._experts()
        d, s, k, r = self._columns(self.finished, e, size, max_output, sum_prompt, sequence_steps, context_steps,
                                   expert_reads)
        c = self.coefficients()
        prefill = _cost.cost_py(c, 1.0, 1.0, sum_prompt, 0.0, 0.0, extra_experts(*e, sum_prompt), prefill_squares)
        decode = _cost.cost_py(c, 0.0, d, 0.0, s, k, r, 0.0)
        service = prefill + decode
        one = _cost.cost_py(c, 0.0, 1.0, 0.0, size, sum_prompt + size, extra_experts(*e, size), 0.0)
        tbt = np.where(d > 0.0, decode / np.where(d > 0.0, d, 1.0), one)
        return service, tbt, tbt, prefill

    def _service(self, size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads, prefill_squares,
                 **_):
        return self._times(size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads,
                           prefill_squares)[0]

    @staticmethod
    def _columns(finished, experts, size, max_output, sum_prompt, sequence_steps, context_steps, expert_reads):
        """Its decode steps ``D``, sequence steps ``S``, context steps ``K``
        and experts read ``R`` under ``finished`` (the class docstring's
        formulas; ``experts``: ``(E, k)``)."""
        d = np.maximum(max_output - 1.0, 0.0)
        if finished == "stay":
            return (d, size * d, sum_prompt * d + size * d * (d + 1.0) / 2.0,
                    d * extra_experts(*experts, size))
        return d, sequence_steps, context_steps, expert_reads

    @classmethod
    def _design_for(cls, fixed, phase, cols):
        finished = fixed.get("finished", default("IterationModel.finished"))
        experts = cls._fixed_experts("IterationModel.fit", fixed)
        # (one column per term of the cost, :data:`mbbatch._kernels.cost.TERMS`: the features of the prefill
        # iteration, of the mean decode iteration, or of the whole batch, their sum)
        sp = cols["sum_prompt"]
        one = np.ones_like(sp)
        zero = np.zeros_like(one)
        prefill = dict(batches=one, iterations=one, prefill_tokens=sp, sequences=zero, context_tokens=zero,
                       experts_read=extra_experts(*experts, sp), prefill_squares=cols.get("prefill_squares", zero))
        if phase == "prefill":
            return _cost.design(prefill)
        d, s, k, r = cls._columns(finished, experts, **{c: cols[c] for c in cls._service_columns
                                                        if c != "prefill_squares"})
        decode = dict(batches=zero, iterations=d, prefill_tokens=zero, sequences=s, context_tokens=k, experts_read=r,
                      prefill_squares=zero)
        if phase == "per_token":
            return _cost.design({f: v / d for f, v in decode.items()})
        return _cost.design({f: prefill[f] + decode[f] for f in prefill})

    @classmethod
    def _jacobian_for(cls, fixed, phase, params, cols):
        return cls._design_for(fixed, phase, cols)

    @staticmethod
    def _from_coef(c):
        return dict(zip(_cost.NAMES, (float(x) for x in c)))
