"""The iteration model (mbbatch.service_models.iteration): a batch's time is its iterations', each
the cost declared once (mbbatch._kernels.cost); leave and stay; a mixture of experts' reads; its checks."""

from dataclasses import replace

import numpy as np
import pytest

import mbbatch.service_models as sm
from mbbatch.service_models import (
    IterationModel,
)


PROMPT = np.array([10.0, 20.0, 30.0, 40.0])
OUTPUT = np.array([5.0, 50.0, 7.0, 9.0])


def _iterations(model, prompt, output):
    """A batch run iteration by iteration, from IterationModel's definition:
    its set-up, a prefill iteration giving every member its first token,
    then decode iterations while a member has tokens to go (finished members
    leave, or with ``finished="stay"`` step on until the longest is done),
    each ``step + per_sequence * sequences + per_context_token * their
    context`` (a member's context at its j-th decode step: prompt + j).
    Returns (service, time to first token, mean decode iteration).  A
    mixture of experts' iteration of T tokens (prompt tokens, or sequences
    decoded) reads, beyond its first token's k experts, each of the other
    E - k with probability 1 - (1 - k/E)^(T - 1)."""
    def experts(tokens):
        e, k = model.experts, model.experts_per_token
        return 0.0 if not e or tokens < 1 else sum(1 - (1 - k / e) ** (tokens - 1) for _ in range(e - k))

    t = model.setup + model.step + model.prefill_per_token * sum(prompt) + model.per_expert * experts(sum(prompt))
    ttft = t
    togo = [max(o - 1, 0) for o in output]
    steps = max(togo)
    for j in range(1, steps + 1):
        active = [i for i in range(len(prompt)) if model.finished == "stay" or togo[i] >= j]
        t += model.step + model.per_sequence * len(active) + model.per_context_token * sum(
            prompt[i] + j for i in active) + model.per_expert * experts(len(active))
    return t, ttft, (t - ttft) / steps if steps else None


ITER = IterationModel(setup=0.02, step=6e-3, prefill_per_token=8e-5, per_sequence=1e-4, per_context_token=6e-8)
#: a mixture of experts (Mixtral's 8 experts, 2 a token)
MOE = IterationModel(setup=0.02, step=6e-3, prefill_per_token=8e-5, per_sequence=1e-4, per_context_token=6e-8,
                     per_expert=1.5e-3, experts=8, experts_per_token=2)


@pytest.mark.parametrize("experts", [0, 8])
@pytest.mark.parametrize("finished", ["leave", "stay"])
def test_iteration_model_is_its_iterations(finished, experts):
    """The closed form equals the batch run iteration by iteration (random
    mixed batches, whole-token lengths, outputs of 0 and 1 token included;
    dense and a mixture of experts)."""
    model = replace(MOE if experts else ITER, finished=finished)
    rng = np.random.default_rng(3)
    for _ in range(40):
        b = int(rng.integers(1, 12))
        prompt = rng.integers(0, 400, b).tolist()
        output = rng.integers(0, 60, b).tolist()
        service, ttft, tbt = _iterations(model, prompt, output)
        t = model.batch_times(prompt, output)
        assert t.service[0] == pytest.approx(service, rel=1e-12)
        assert t.ttft[0] == pytest.approx(ttft, rel=1e-12)
        if tbt is not None:
            assert t.decode_tbt[0] == pytest.approx(tbt, rel=1e-12) and t.tpot[0] == t.decode_tbt[0]
    # uniform batches: the same by the aggregates of size, prompt and output
    assert model.service_time(size=[1, 16, 64], prompt=512, output=512) == pytest.approx(
        [_iterations(model, [512] * b, [512] * b)[0] for b in (1, 16, 64)], rel=1e-12)


def test_iteration_model_leave_and_stay_differ_only_in_mixed_batches():
    stay = IterationModel(**{k: getattr(ITER, k) for k in ITER._params}, finished="stay")
    assert stay.service_time(size=8, prompt=100, output=50) == ITER.service_time(size=8, prompt=100, output=50)
    mixed = ITER.batch_times([100, 100], [10, 50]).service[0]
    assert stay.batch_times([100, 100], [10, 50]).service[0] > mixed


def test_a_mixture_of_experts_reads_more_experts_as_its_batch_grows():
    """The expert term (Fedus et al.'s balanced routing): a batch of one
    decodes reading its token's k experts only, a larger batch pays for the
    others, up to all E - k of them; a dense model pays nothing; a fit of
    noise-free measurements recovers per_expert with the other terms."""
    x = sm.extra_experts(8, 2, np.array([0, 1, 2, 3, 64, 10**6]))
    np.testing.assert_allclose(x, [0, 0, 1.5, 6 * (1 - 0.75 ** 2), 6 * (1 - 0.75 ** 63), 6], rtol=1e-15)
    assert (sm.extra_experts(0, 2, [1, 10, 100]) == 0).all()
    one = MOE.service_time(size=1, prompt=100, output=50)
    assert one == pytest.approx(ITER.service_time(size=1, prompt=100, output=50)
                                + MOE.per_expert * sm.extra_experts(8, 2, 100.0), rel=1e-14)
    d = 49.0
    assert MOE.service_time(size=16, prompt=100, output=50) - ITER.service_time(size=16, prompt=100, output=50) == \
        pytest.approx(MOE.per_expert * (sm.extra_experts(8, 2, 1600.0) + d * sm.extra_experts(8, 2, 16.0)), rel=1e-12)
    assert MOE.decode_step(size=4) == pytest.approx(ITER.decode_step(size=4) + 1.5e-3 * 6 * (1 - 0.75 ** 3))
    # uniform and mixed batches agree on a uniform batch, and a batch_aggregates without experts reads none
    assert MOE.batch_times([100] * 8, [50] * 8).service[0] == pytest.approx(
        MOE.service_time(size=8, prompt=100, output=50), rel=1e-12)
    assert sm.batch_aggregates([100, 20], [50, 3]).expert_reads.tolist() == [0.0]
    # fitted: the coefficients back from noise-free batches, experts given; a dense fit has no expert term
    rows = _uniform_rows(MOE, np.random.default_rng(5))
    rows = {k: rows[k] for k in ("size", "prompt", "output", "service")}
    res = IterationModel.fit(rows, weights="relative", experts=8, experts_per_token=2)
    for k in MOE._params:
        assert res.params[k] == pytest.approx(getattr(MOE, k), rel=1e-7), k
    assert res.model.experts == 8 and res.holdout_error < 1e-9
    dense = IterationModel.fit(rows, weights="relative")
    assert dense.params["per_expert"] == 0.0 and np.isnan(dense.stderr["per_expert"])
    assert dense.dof == res.dof + 1 and dense.holdout_error > 1e-3
    # its prefill batches as LAPS's PrefillModel: the experts at their saturation
    assert MOE.prefill_model().service_time(sum_prompt=300.0) == pytest.approx(
        MOE.times(size=3, prompt=100, output=1).ttft, rel=1e-12)


def test_iteration_model_checks_its_fields_and_arguments():
    with pytest.raises(ValueError, match=r"^per_sequence must be in \[0, 1e\+290\); got -1.0$"):
        IterationModel(per_sequence=-1.0)
    with pytest.raises(ValueError, match="a decode iteration must take time: one of step, per_sequence and "
                                         "per_context_token must be > 0"):
        IterationModel(step=0.0, per_sequence=0.0, per_context_token=0.0)
    with pytest.raises(ValueError, match="finished"):
        IterationModel(finished="drop")
    with pytest.raises(ValueError, match=r"per_expert = 0.001 times a mixture of experts; give its experts"):
        IterationModel(per_expert=1e-3)
    with pytest.raises(ValueError, match=r"experts_per_token must be in \[1, experts = 8\]; got 9"):
        IterationModel(experts=8, experts_per_token=9)
    with pytest.raises(ValueError, match=r"^experts must be"):
        IterationModel(experts=-1)
    with pytest.raises(ValueError, match=r"batch_aggregates: experts must be \(E, k\)"):
        sm.batch_aggregates([1.0], [2.0], experts=(8, 0))
    with pytest.raises(TypeError, match="expert_reads .* not given"):
        MOE.times(size=2, max_output=4.0, sum_prompt=10.0, sequence_steps=6.0, context_steps=40.0)
    with pytest.raises(TypeError, match="uniform batches are given by size, prompt and output .* together"):
        ITER.service_time(size=4, prompt=100)
    with pytest.raises(TypeError, match="got also max_output"):
        ITER.service_time(size=4, prompt=100, output=10, max_output=10)
    with pytest.raises(ValueError, match=r"output must be in \[0, inf\) \(tokens\)"):
        ITER.service_time(size=4, prompt=100, output=-1)
    # its prefill batches as LAPS's PrefillModel
    with pytest.raises(ValueError, match="prefill_per_token must be > 0 for a prefill batch's time; got 0"):
        IterationModel(prefill_per_token=0.0).prefill_model()
    pm = ITER.prefill_model()
    assert pm.service_time(sum_prompt=300.0) == ITER.times(size=3, prompt=100, output=1).ttft


def _uniform_rows(model, rng, noise=0.0, relative=False):
    """Measured uniform batches as accelerator benchmarks run them: sizes
    1-256, prompt and output lengths 128-2048 (not always equal), times with
    Gaussian errors (absolute, s, or relative)."""
    size = np.repeat([1, 16, 32, 64, 128, 256], 10)
    prompt = rng.choice([128.0, 256.0, 512.0, 1024.0, 2048.0], size.size)
    output = rng.choice([128.0, 256.0, 512.0, 1024.0, 2048.0], size.size)
    t = model.times(size=size, prompt=prompt, output=output)
    e = rng.normal(0.0, noise, size.size)
    scale = (lambda x: x * (1 + e)) if relative else (lambda x: x + e)
    return dict(size=size, prompt=prompt, output=output, service=scale(t.service), prefill=t.ttft,
                per_token=t.decode_tbt)


def test_the_prefill_attention_is_fitted_only_where_prefills_vary_the_prompt():
    """LLM-Inference-Bench-like rows (prompt = output, whole batches) cannot
    tell P^2 at prefill from the decode context: the term is held at 0 and
    named, with its reason; prefill times of several prompt lengths fit it
    (noise-free: exactly)."""
    true = IterationModel(setup=0.0, step=6e-3, prefill_per_token=8e-5, per_sequence=1e-4, per_context_token=6e-8,
                          prefill_attention=4e-9)
    size, length = np.meshgrid([1, 4, 16, 64], [128, 512, 1024, 2048])
    size, length = size.ravel(), length.ravel()
    rows = dict(size=size, prompt=length, output=length,
                service=true.service_time(size=size, prompt=length, output=length))
    fit = IterationModel.fit(rows)
    assert fit.params["prefill_attention"] == 0.0 and fit.identification["prefill_attention"] == "not fitted"
    assert "prefill_attention" in fit.unfitted and "not fitted" in str(fit)
    prefill = true.times(size=size, prompt=length, output=length).ttft
    fit = IterationModel.fit({**rows, "prefill": prefill})
    assert fit.unfitted == {}
    assert fit.params["prefill_attention"] == pytest.approx(4e-9, rel=1e-6)
    assert fit.identification["prefill_attention"] == "identified"


def test_theory_reads_the_prompts_second_moment_for_the_prefill_attention():
    from mbbatch.theory import iteration_batch_service_time

    m = IterationModel(setup=0.0, step=1.0, prefill_per_token=0.0, per_sequence=0.0, per_context_token=0.0,
                       prefill_attention=1e-3)
    # 1 + E[max d] + 1e-3 * B E[P^2] = 1 + 1.5 + 1e-3 * 2 * 400
    assert iteration_batch_service_time(m, [1.0, 3.0], 2, prompt_mean=20.0, prompt_square_mean=400.0) == \
        pytest.approx(3.3, rel=1e-12)
    with pytest.raises(ValueError, match="prompt_square_mean"):
        iteration_batch_service_time(m, [1.0, 3.0], 2, prompt_mean=20.0)
    with pytest.raises(ValueError, match="prefill_attention"):
        m.prefill_model()
