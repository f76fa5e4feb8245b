"""An engine iteration's cost, declared once.

An iteration's time is a dot product: the coefficients of
:data:`TERMS` (``IterationModel``'s fields, in this order) times what the
iteration does, its features.  :func:`cost` is that product, compiled as a
kernel step and called by every kernel that times an iteration (the
continuous engine per iteration, the event and multi-bin kernels per batch
through :func:`iteration_times`); the numpy path
(``service_models.IterationModel``) calls the same function on arrays
(:func:`cost_py`), the fit's design matrix has one column per term in this
order, and the parameter table, the sweep specs and the CLI read the
names, units and defaults from here.

The features are additive over iterations, so a batch's time is the same
product with its iterations' features summed (a batch run to completion:
one ``batches``, its prefill iteration and its decode iterations).

Adding a term: a :class:`Term` here (name, spec key, feature, unit, default,
meaning), its argument in :func:`cost`, the feature where the kernels and
the numpy aggregates know it, and its fit column in
``IterationModel``'s design.  A term whose coefficient is 0 adds exactly 0,
so earlier numbers stay bit for bit.

Pure numba and numpy: nothing here imports the rest of mbbatch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .common import extra_experts, step

__all__ = ["Term", "TERMS", "NAMES", "FIELDS", "FEATURES", "N", "PER_EXPERT", "PREFILL_ATTENTION", "cost", "cost_py",
           "prefill_square", "design", "iteration_times"]


class Term(NamedTuple):
    """One term of the iteration cost."""

    #: the coefficient's name (an ``IterationModel`` field)
    name: str
    #: its key in sweep specs
    spec: str
    #: the feature it multiplies, and that feature's unit
    feature: str
    #: the coefficient's unit
    unit: str
    #: its default: the fit of the profile H100/vLLM/Meta-Llama-3-8B/tp1, to 3 significant digits
    default: float
    #: what the coefficient is
    doc: str


#: The terms, in the order of :func:`cost`'s arguments and of the coefficient vector.
TERMS = (
    Term("setup", "iteration_setup", "batches", "s", 0.0,
         "fixed time per batch run to completion (scheduling, admission), paid at its prefill iteration"),
    Term("step", "iteration_step", "iterations", "s", 7.76e-3,
         "fixed time per engine iteration (the weights read, the kernels launched)"),
    Term("prefill_per_token", "iteration_prefill", "prefill_tokens", "s/token", 2.55e-5,
         "time per prompt token prefilled (iteration model)"),
    Term("per_sequence", "iteration_per_sequence", "sequences", "s", 4.81e-5,
         "time per sequence decoded in an iteration"),
    Term("per_context_token", "iteration_per_context", "context_tokens", "s/token", 5.82e-8,
         "time per context (KV) token a decoded sequence attends over, per iteration"),
    Term("per_expert", "iteration_per_expert", "experts_read", "s/expert", 0.0,
         "time per expert's weights read in an iteration beyond the first token's (mixture of experts)"),
    Term("prefill_attention", "iteration_prefill_attention", "prefill_squares", "s/token^2", 0.0,
         "time per unit of the prefill's attention, the sum over the prompts prefilled of P^2 (a chunk from "
         "token a to a + c adds (a + c)^2 - a^2)"),
)
#: the coefficients' names
NAMES = tuple(t.name for t in TERMS)
#: their fields in the kernels' configuration vectors (``Layout`` floats), contiguous and in this order
FIELDS = tuple(f"cost_{t.name}" for t in TERMS)
#: the features they multiply, in the same order
FEATURES = tuple(t.feature for t in TERMS)
#: the number of terms
N = len(TERMS)
#: the expert coefficient's place in the vector (a kernel skips the experts' reads where it is 0)
PER_EXPERT = NAMES.index("per_expert")
#: the prefill attention's (a kernel skips the squares where it is 0)
PREFILL_ATTENTION = NAMES.index("prefill_attention")


@step
def cost(c, batches, iterations, prefill_tokens, sequences, context_tokens, experts_read, prefill_squares):
    """The time of what the features count (s): ``c`` the coefficients in
    :data:`TERMS`' order, the rest the features (floats; arrays in numpy
    through :func:`cost_py`).  Summed left to right, term by term."""
    return (c[0] * batches + c[1] * iterations + c[2] * prefill_tokens + c[3] * sequences
            + c[4] * context_tokens + c[5] * experts_read + c[6] * prefill_squares)


#: :func:`cost` as plain Python, for numpy arrays (the same expression, so the same numbers)
cost_py = cost.py_func


@step
def prefill_square(a, c):
    """The prefill attention's feature (``prefill_squares``) of prefilling
    tokens ``a`` to ``a + c`` of a prompt: ``(a + c)^2 - a^2``, as ``c (2a +
    c)`` (a whole prompt of P tokens, ``a = 0``: ``P^2``; in chunks, the
    chunks' parts add up to it).  Every kernel and the numpy aggregates
    compute the feature with it (numpy through ``prefill_square.py_func``)."""
    return c * (2.0 * a + c)


@step
def iteration_times(c, span, miss, nb, sum_prefill, sq_prefill, max_out, seq_steps, ctx_steps, sum_context, reads):
    """A batch's times under the iteration model, ``c`` its coefficients
    (:data:`TERMS`' order): its prefill iteration (every member's first
    token; ``sum_prefill`` tokens prefilled, ``sq_prefill`` the sum of
    their prompts' :data:`TERMS` ``prefill_squares``) then one iteration per decode
    step, ``seq_steps`` and ``ctx_steps`` its decode work
    (:func:`~.common.member_work` summed, or :func:`~.common.padded_work`),
    ``sum_context`` its members' whole prompts; a mixture of experts'
    reads (``span``, ``miss``: :func:`~.common.extra_experts`; ``reads``:
    its decode iterations').  Returns ``(service, tbt, prefill)``: the
    batch's time (s), its decode time per step (s; with no decode step, one
    step's over its members' contexts) and its prefill iteration's (s, the
    time to first token after its start)."""
    bf = float(nb)
    d = max(max_out - 1.0, 0.0)
    # (the experts' reads only for a mixture of experts: a dense model's term is 0 x reads, exactly 0, and its
    # reads a power per batch)
    moe = c[PER_EXPERT] > 0.0
    prefill = cost(c, 1.0, 1.0, sum_prefill, 0.0, 0.0, extra_experts(span, miss, sum_prefill) if moe else 0.0,
                   sq_prefill)
    decode = cost(c, 0.0, d, 0.0, seq_steps, ctx_steps, reads, 0.0)
    service = prefill + decode
    if d > 0.0:
        tbt = decode / d
    else:
        tbt = cost(c, 0.0, 1.0, 0.0, bf, sum_context + bf, extra_experts(span, miss, bf) if moe else 0.0, 0.0)
    return service, tbt, prefill


def design(features: dict):
    """A design matrix, one column per term in :data:`TERMS`' order, from
    ``features`` (each feature's values by name, numpy arrays of one length):
    the fit's view of :func:`cost`, whose coefficient vector times it gives
    the times."""
    missing = [f for f in FEATURES if f not in features]
    if missing or len(features) != len(FEATURES):
        raise ValueError(f"design: the features are {FEATURES}; got {tuple(features)}")
    return np.column_stack([features[f] for f in FEATURES])
