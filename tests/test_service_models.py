"""Batch service models (mbbatch.service_models): each model's batch time,
checked on a hand trace of one batch at a time; the numpy references against
the event kernel batch by batch and against plain-Python loops over the
members; the calibrated model's three feedback rules against the
dynamic-batching paper's pseudocode (Pang et al., 2025, arXiv:2503.05248); the least-squares fits on noise-free data
(exact recovery) and noisy data (interval coverage at a stated level)."""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mbbatch as mb
import mbbatch.service_models as sm
from mbbatch.service_models import (
    SERVICE_MODELS,
    BatchTimes,
    CalibratedModel,
    DecodeModel,
    IterationModel,
    PrefillModel,
    LinearModel,
    MaxModel,
    batch_aggregates,
)


PROMPT = np.array([10.0, 20.0, 30.0, 40.0])
OUTPUT = np.array([5.0, 50.0, 7.0, 9.0])
def _compute_decode_tbt(calibrated, beta, gamma, batch_size):
    """ComputeDecodeTBT, transcribed from Pang et al.'s pseudocode."""
    if calibrated:
        h_b = 1.0 + gamma * (batch_size - 1) / max(1, batch_size)
        return beta * h_b
    return 0.00574


def _recent_tbt(decode_tbt, service_time, outputs):
    """Algorithm 7, step 2 (lines 480-488); ``None`` is "not provided".  The
    kernel's guard: a batch of empty outputs divides by 1 token."""
    if decode_tbt is not None:
        return decode_tbt
    return service_time / max(max(outputs), 1.0)


KERNEL_MODELS = [MaxModel(base=0.05, per_token=0.01), LinearModel(base=0.2, alpha=1e-3, beta=0.5),
                 DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-4)]


def _kernel_run(model):
    """A dynamic-batching run whose backlog gives batches of many sizes (1 to 24)."""
    rng = np.random.default_rng(1)
    n = 600
    prompt, output = rng.integers(0, 300, n).astype(float), rng.integers(0, 200, n).astype(float)
    return mb.simulate(mb.DynamicBatching(controller=mb.SLAController(b_max=24, d_sla=6e-3, eps_d=1e-4)),
                       arrivals=mb.Poisson(rate=30.0), workload=mb.Workload(prompt=prompt, output=output),
                       service_model=model, keep_batches=True, keep_requests=True, seed=0, n=n)


def _check_against_kernel(model, res):
    from mbbatch._kernels.controller import DEFAULT_EMA

    req = res.requests
    order = np.argsort(req.batch, kind="stable")
    agg = batch_aggregates(req.prompt[order], req.output[order], np.bincount(req.batch))
    assert np.array_equal(agg.size, res.batches.size)
    assert len(np.unique(agg.size)) >= 4            # batches of several sizes (the legacy feedback: 4)
    t = model.times(**agg._asdict())
    assert np.array_equal(t.service, res.batches.service)                 # bit for bit
    # a request's TTFT is its wait plus the batch's time to first token
    np.testing.assert_allclose(t.ttft[req.batch], req.ttft - (req.start - req.arrival), rtol=0, atol=1e-12)
    # tau_avg at each batch start: the EMA of what the batches before it fed back
    fed = model.feedback_tbt(**agg._asdict())
    tau, expected = 0.0, []
    for f in fed:
        expected.append(tau)
        tau = DEFAULT_EMA * f + (1.0 - DEFAULT_EMA) * tau
    ts = res.time_series
    assert ts.sizes["time"] == len(fed)                                    # every batch sampled
    assert np.array_equal(ts.tau_avg.values, expected)


@pytest.mark.parametrize("model", KERNEL_MODELS, ids=lambda m: type(m).__name__)
def test_reference_equals_the_kernel_batch_by_batch(model):
    _check_against_kernel(model, _kernel_run(model))


@pytest.mark.parametrize("attention", [0.0, 2e-8])
def test_iteration_reference_equals_the_kernel_batch_by_batch(attention):
    """The iteration model in the event kernel (its prefill's attention on and off)."""
    model = IterationModel(setup=2e-3, step=4e-3, prefill_per_token=2e-5, per_sequence=1e-4, per_context_token=6e-8,
                           prefill_attention=attention)
    _check_against_kernel(model, _kernel_run(model))


@pytest.mark.parametrize("feedback", ["calibrated", "uncalibrated", "legacy"])
def test_calibrated_reference_equals_the_kernel_batch_by_batch(feedback):
    model = CalibratedModel(alpha=0.02, beta=5.74e-3, gamma=0.316, feedback=feedback)
    _check_against_kernel(model, _kernel_run(model))


def _brute_force(model, p, o):
    """One batch's service and fed-back TBT from its members, in plain Python."""
    b = len(p)
    if isinstance(model, MaxModel):
        service = max(model.base + model.per_token * x for x in o)
        return service, service / max(max(o), 1.0)
    if isinstance(model, LinearModel):
        service = model.base + model.alpha * max(x + y for x, y in zip(p, o)) * (1 + model.beta * (b - 1) / b)
        return service, service / max(max(o), 1.0)
    if isinstance(model, DecodeModel):
        tbt = _compute_decode_tbt(True, model.beta, model.gamma, b)
        return model.prefill_per_token * sum(p) + tbt * max(o), tbt
    service = model.alpha + model.beta * max(x + y for x, y in zip(p, o)) * (1 + model.gamma * (b - 1) / b)
    provided = {"calibrated": _compute_decode_tbt(True, model.beta, model.gamma, b),
                "uncalibrated": _compute_decode_tbt(False, model.beta, model.gamma, b), "legacy": None}
    return service, _recent_tbt(provided[model.feedback], service, o)


ALL_MODELS = KERNEL_MODELS + [CalibratedModel(alpha=0.02, beta=3e-3, gamma=0.7, feedback=f)
                              for f in ("calibrated", "uncalibrated", "legacy")]


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: f"{type(m).__name__}-{getattr(m, 'feedback', '')}")
def test_vectorised_reference_equals_a_loop_over_members(model):
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 30, 200)
    sizes[:3] = 1
    n = int(sizes.sum())
    # fractional lengths and empty outputs too
    prompt = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0, 800, n))
    output = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0, 400, n))
    t = model.batch_times(prompt, output, sizes)
    fed = model.feedback_tbt(**batch_aggregates(prompt, output, sizes)._asdict())
    start = 0
    for i, b in enumerate(sizes):
        p, o = prompt[start:start + b], output[start:start + b]
        start += b
        service, tbt = _brute_force(model, p, o)
        assert t.service[i] == pytest.approx(service, rel=1e-13)
        assert fed[i] == pytest.approx(tbt, rel=1e-13)
        assert 0.0 <= t.ttft[i] <= t.service[i]


def test_calibrated_model_errors_name_the_parameter_and_its_domain():
    with pytest.raises(ValueError, match=r"^beta must be in \(0, 1e\+290\); got 0.0$"):
        CalibratedModel(beta=0.0)
    with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1e\+290\); got -1.0$"):
        CalibratedModel(alpha=-1.0)
    with pytest.raises(ValueError, match=r"^gamma must be in \[0, inf\); got nan$"):
        CalibratedModel(gamma=math.nan)
    with pytest.raises(ValueError, match="feedback must be one of 'calibrated', 'uncalibrated', 'legacy'; got 'v2'"):
        CalibratedModel(feedback="v2")
    with pytest.raises(TypeError, match="feedback must be one of"):
        CalibratedModel(feedback=True)


def test_existing_models_keep_their_codes_fields_and_names():
    """Each model gives the event kernel its own fields (``_kernels.dynamic.MODEL``), the others 0."""
    from mbbatch._kernels import dynamic as d

    assert [MaxModel.code, LinearModel.code, DecodeModel.code, CalibratedModel.code, IterationModel.code] == [
        0, 1, 2, 3, 6]

    def floats(model):
        """The model's nonzero floats, by name (every other field 0)."""
        f = {k: v for k, v in d.MODEL.unpack(d.MODEL.zeros(**model.kernel_fields())).items() if k in d.MODEL.floats}
        return {k: v for k, v in f.items() if v != 0}

    assert floats(MaxModel(0.5, 0.01)) == dict(base=0.5, per_token=0.01)
    assert floats(LinearModel(0.2, 1e-3, 0.5)) == dict(base=0.2, alpha=1e-3, beta=0.5)
    assert floats(DecodeModel(5e-3, 0.3, 1e-4)) == dict(prefill_per_token=1e-4, tbt_beta=5e-3, tbt_gamma=0.3)
    assert floats(CalibratedModel(0.02, 4e-3, 0.2)) == dict(base=0.02, tbt_beta=4e-3, tbt_gamma=0.2)
    # (the iteration model's coefficients in the cost's order, mbbatch._kernels.cost.TERMS)
    assert floats(IterationModel(0.02, 5e-3, 1e-4, 2e-4, 1e-7)) == dict(
        cost_setup=0.02, cost_step=5e-3, cost_prefill_per_token=1e-4, cost_per_sequence=2e-4,
        cost_per_context_token=1e-7, expert_miss=1)
    assert floats(IterationModel(0.02, 5e-3, 1e-4, 2e-4, 1e-7, 3e-3, experts=8)) == dict(
        cost_setup=0.02, cost_step=5e-3, cost_prefill_per_token=1e-4, cost_per_sequence=2e-4,
        cost_per_context_token=1e-7, cost_per_expert=3e-3, expert_span=6, expert_miss=0.75)
    assert [d.MODEL.zeros(**IterationModel(finished=f).kernel_fields())[0].tolist()
            for f in ("leave", "stay")] == [[d.MODEL_ITERATION, 0], [d.MODEL_ITERATION, 1]]
    assert [d.MODEL.zeros(**CalibratedModel(feedback=f).kernel_fields())[0][0]
            for f in ("calibrated", "uncalibrated", "legacy")] == [d.MODEL_CALIBRATED, d.MODEL_CALIBRATED_UNCALIBRATED,
                                                                   d.MODEL_CALIBRATED_LEGACY]
    assert SERVICE_MODELS == {"prefill": PrefillModel, "max": MaxModel, "linear": LinearModel,
                              "decode": DecodeModel, "calibrated": CalibratedModel, "iteration": IterationModel,
                              "profile": IterationModel}
    assert set(sm.__all__) >= {"CalibratedModel", "FitResult", "BatchTimes", "batch_aggregates"}


@given(data=st.data(), which=st.sampled_from(["max", "linear", "decode", "calibrated", "uncalibrated", "legacy",
                                             "leave", "stay", "moe leave", "moe stay"]))
def test_the_numpy_formulas_are_the_kernels_over_random_batches(data, which):
    """The formula of each model has one truth: its numpy ``times`` equals,
    bit for bit, what the event kernel's ``_batch_service`` computes
    (``_kernels.dynamic.batch_times``), on random batches and parameters."""
    from mbbatch._kernels import dynamic as d

    real = st.floats(1e-6, 1.0, allow_nan=False)
    if which == "max":
        model = MaxModel(base=data.draw(st.floats(0, 1.0)), per_token=data.draw(real))
    elif which == "linear":
        model = LinearModel(base=data.draw(st.floats(0, 1.0)), alpha=data.draw(real), beta=data.draw(real))
    elif which == "decode":
        model = DecodeModel(beta=data.draw(real), gamma=data.draw(real), prefill_per_token=data.draw(real))
    elif which.endswith(("leave", "stay")):
        experts = data.draw(st.integers(2, 64)) if which.startswith("moe") else 0
        model = IterationModel(setup=data.draw(st.floats(0, 1.0)), step=data.draw(real),
                               prefill_per_token=data.draw(st.floats(0, 1e-3)), per_sequence=data.draw(real),
                               per_context_token=data.draw(st.floats(0, 1e-6)), finished=which.split()[-1],
                               per_expert=data.draw(st.floats(0, 1e-2)) if experts else 0.0, experts=experts,
                               experts_per_token=data.draw(st.integers(1, experts)) if experts else 2,
                               prefill_attention=data.draw(st.sampled_from([0.0, 1e-9, 3e-8])))
    else:
        model = CalibratedModel(alpha=data.draw(st.floats(0, 1.0)), beta=data.draw(real), gamma=data.draw(real),
                                feedback="calibrated" if which == "calibrated" else which)
    m = data.draw(st.integers(1, 20))
    size = np.array(data.draw(st.lists(st.integers(1, 512), min_size=m, max_size=m)), dtype=float)
    max_out = np.array(data.draw(st.lists(st.integers(0, 4096), min_size=m, max_size=m)), dtype=float)
    max_seq = max_out + np.array(data.draw(st.lists(st.integers(0, 8192), min_size=m, max_size=m)), dtype=float)
    sum_prompt = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=m, max_size=m)), dtype=float)
    # the decode work of some members (the iteration model's, finished members leaving)
    seq = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=m, max_size=m)), dtype=float)
    ctx = np.array(data.draw(st.lists(st.integers(0, 10**9), min_size=m, max_size=m)), dtype=float)
    # (and the experts a mixture of experts' decode iterations read)
    reads = np.array(data.draw(st.lists(st.floats(0, 1e6), min_size=m, max_size=m)), dtype=float)
    # (and the prompts' squares, the prefill attention's feature)
    squares = np.array(data.draw(st.lists(st.integers(0, 10**12), min_size=m, max_size=m)), dtype=float)
    out = np.empty((4, m))
    kf = model.kernel_fields()
    if which.endswith("stay"):
        # the padded decode work, as the kernel's decode_work makes it from the batch's size, prompts and
        # longest output (end to end: tests/test_policies_spf.py's iteration-model cases)
        dmax = np.maximum(max_out - 1.0, 0.0)
        seq, ctx = size * dmax, sum_prompt * dmax + size * dmax * (dmax + 1.0) / 2.0
        reads = dmax * sm.extra_experts(model.experts, model.experts_per_token, size)
    d.batch_times(d.MODEL.zeros(**kf), size, sum_prompt, max_out, max_seq, seq, ctx, reads, squares, out)
    attention = isinstance(model, IterationModel) and model.prefill_attention > 0
    t = model.times(size=size.astype(np.int64), max_seq_len=max_seq, max_output=max_out, sum_prompt=sum_prompt,
                    sequence_steps=seq, context_steps=ctx, expert_reads=reads if "moe" in which else None,
                    prefill_squares=squares if attention else None)
    if isinstance(model, IterationModel) and not attention:
        # (a model without the term reads no squares: the kernel's are multiplied by 0)
        again = model.times(size=size.astype(np.int64), max_output=max_out, sum_prompt=sum_prompt, sequence_steps=seq,
                            context_steps=ctx, expert_reads=reads if "moe" in which else None, prefill_squares=squares)
        assert all(np.array_equal(x, y) for x, y in zip(again, t))
    for k, name in enumerate(BatchTimes._fields):
        assert np.asarray(getattr(t, name), dtype=float).tobytes() == out[k].tobytes(), name


def test_docstring_examples():
    assert doctest.testmod(sm, optionflags=doctest.ELLIPSIS).failed == 0


# --- fitting ---------------------------------------------------------------------------------

def test_a_service_models_times_beyond_max_duration_are_refused_naming_them():
    """IterationModel(setup=1e300) was accepted, and a static-batching run then blamed
    workload.output ("service times of about 1e+300 s lie outside ..."): IterationModel's and
    CalibratedModel's times (s, s/token) lie in the parameter table's [0, MAX_DURATION), as a
    service time does."""
    for model, kw, name in ((mb.IterationModel, dict(setup=1e300), "setup"),
                            (mb.IterationModel, dict(per_context_token=1e291), "per_context_token"),
                            (mb.CalibratedModel, dict(alpha=1e300), "alpha")):
        with pytest.raises(ValueError, match=rf"^{name} must be in [\[(]0, 1e\+290\); got "):
            model(**kw)
    assert mb.IterationModel(setup=1e289).setup == 1e289
