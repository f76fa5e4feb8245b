"""Batch service models (mbbatch.service_models): each model's batch time,
checked on a hand trace of one batch at a time; the numpy references against
the event kernel batch by batch and against plain-Python loops over the
members; the calibrated model's three feedback rules against the
dynamic-batching paper's pseudocode (Pang et al., 2025, arXiv:2503.05248); the least-squares fits on noise-free data
(exact recovery) and noisy data (interval coverage at a stated level)."""

import doctest
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mbbatch as mb
import mbbatch.service_models as sm
from mbbatch.params import PARAMS
from mbbatch.service_models import (
    SERVICE_MODELS,
    UNCALIBRATED_TBT,
    BatchTimes,
    CalibratedModel,
    DecodeModel,
    IterationModel,
    PrefillModel,
    FitResult,
    LinearModel,
    MaxModel,
    batch_aggregates,
)

from .strategies import valid

PROMPT = np.array([10.0, 20.0, 30.0, 40.0])
OUTPUT = np.array([5.0, 50.0, 7.0, 9.0])


def _service(model):
    """Four requests at time 0, one batch of four (static, B = 4)."""
    res = mb.simulate(mb.StaticBatching(4), arrivals=mb.Saturated(), workload=mb.Workload(prompt=PROMPT,
                      output=OUTPUT), service_model=model, keep_batches=True, seed=0)
    assert res.n_batches == 1
    return res.batches.service[0]


def test_max_model_is_the_longest_member():
    assert _service(mb.MaxModel(base=0.5, per_token=0.01)) == 0.5 + 0.01 * 50


def test_linear_model_scales_the_longest_sequence():
    m = mb.LinearModel(base=0.2, alpha=1e-3, beta=0.5)
    assert _service(m) == pytest.approx(0.2 + 1e-3 * (20 + 50) * (1 + 0.5 * 3 / 4))


def test_decode_model_is_prefill_plus_tbt_times_the_longest_output():
    m = mb.DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-4)
    assert _service(m) == pytest.approx(1e-4 * PROMPT.sum() + 5e-3 * (1 + 0.3 * 3 / 4) * 50)


def test_defaults_come_from_the_parameter_table():
    from mbbatch.params import default

    assert mb.MaxModel() == mb.MaxModel(base=default("base"), per_token=default("per_token"))
    assert mb.DecodeModel().beta == default("DecodeModel.beta")
    with pytest.raises(ValueError, match="per_token"):
        mb.MaxModel(per_token=-1.0)


# --- the calibrated model: the paper's formulas --------------------------------------------

def test_calibrated_model_defaults_are_the_papers_calibration():
    """ComputeDecodeTBT's calibrated beta = 5.74 ms and gamma = 0.316 (Pang et al.), through the table."""
    m = CalibratedModel()
    assert (m.alpha, m.beta, m.gamma, m.feedback) == (0.0, 5.74e-3, 0.316, "calibrated")
    for f in ("alpha", "beta", "feedback"):
        assert getattr(m, f) == PARAMS[f"CalibratedModel.{f}"].default
    assert m.gamma == PARAMS["gamma"].default
    assert UNCALIBRATED_TBT == 0.00574        # "RETURN 0.00574  // Default 5.74ms" (line 508)
    assert SERVICE_MODELS["calibrated"] is CalibratedModel


def test_calibrated_model_hand_trace():
    """The hand batch: b = 4, max(prompt + output) = 70, max output = 50."""
    m = CalibratedModel(alpha=0.01, beta=5e-3, gamma=0.3)
    h = 1 + 0.3 * 3 / 4
    t = m.batch_times(PROMPT, OUTPUT)
    assert t.service == pytest.approx(0.01 + 5e-3 * 70 * h, rel=1e-15)
    assert t.decode_tbt == t.tpot == pytest.approx(5e-3 * h, rel=1e-15)
    # the first token when 49 decode steps are left: alpha + tbt (70 - 50 + 1)
    assert t.ttft == pytest.approx(0.01 + 5e-3 * h * 21, rel=1e-15)


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


@pytest.mark.parametrize("feedback", ["calibrated", "uncalibrated", "legacy"])
def test_calibrated_feedback_is_algorithm_7_step_2(feedback):
    rng = np.random.default_rng(7)
    m = CalibratedModel(alpha=0.03, beta=4e-3, gamma=0.5, feedback=feedback)
    for _ in range(50):
        b = int(rng.integers(1, 40))
        p, o = rng.integers(0, 500, b).astype(float), rng.integers(0, 300, b).astype(float)
        service = 0.03 + 4e-3 * (1 + 0.5 * (b - 1) / b) * max(p + o)   # service_time_fn(|batch|, max_seq_len)
        provided = {"calibrated": _compute_decode_tbt(True, 4e-3, 0.5, b),
                    "uncalibrated": _compute_decode_tbt(False, 4e-3, 0.5, b), "legacy": None}[feedback]
        agg = batch_aggregates(p, o)
        assert m.feedback_tbt(**agg._asdict())[0] == pytest.approx(_recent_tbt(provided, service, o), rel=1e-14)
        assert m.batch_times(p, o).service[0] == pytest.approx(service, rel=1e-14)


def test_uncalibrated_feedback_ignores_the_batch_and_the_calibration():
    sizes = np.arange(1, 300)
    for beta, gamma in [(5.74e-3, 0.316), (1e-3, 0.0), (0.2, 5.0)]:
        fb = CalibratedModel(beta=beta, gamma=gamma, feedback="uncalibrated").feedback_tbt(sizes)
        assert np.all(fb == 0.00574)
    # a calibration with no batch penalty at the default beta feeds the same constant
    assert np.all(CalibratedModel(gamma=0.0).feedback_tbt(sizes) == UNCALIBRATED_TBT)
    # the kernel's decode_tbt > 0 selects the provided value; legacy provides none
    assert CalibratedModel(feedback="uncalibrated").times(3, 100, 20).decode_tbt == UNCALIBRATED_TBT
    assert CalibratedModel(feedback="legacy").times(3, 100, 20).decode_tbt == 0.0


def test_feedback_changes_only_what_the_controller_is_fed():
    """One GPU, three beliefs: service, TPOT and TTFT do not depend on ``feedback``."""
    args = dict(size=np.array([1, 2, 7, 64]), max_seq_len=np.array([10.0, 300.0, 2000.0, 50.0]),
                max_output=np.array([0.0, 100.0, 1.0, 50.0]))
    runs = [CalibratedModel(alpha=0.1, beta=2e-3, gamma=0.4, feedback=f).times(**args)
            for f in ("calibrated", "uncalibrated", "legacy")]
    for t in runs[1:]:
        for f in ("service", "tpot", "ttft"):
            assert np.array_equal(getattr(t, f), getattr(runs[0], f))


def test_calibrated_legacy_is_the_linear_model_with_its_names():
    """alpha + beta L h(b) is LinearModel(base=alpha, alpha=beta, beta=gamma): the
    two feed the controller the same legacy rule; only the rounding order differs."""
    rng = np.random.default_rng(3)
    args = dict(size=rng.integers(1, 200, 500), max_output=rng.integers(0, 400, 500).astype(float))
    args["max_seq_len"] = args["max_output"] + rng.integers(0, 4000, 500)
    c = CalibratedModel(alpha=0.02, beta=5.74e-3, gamma=0.316, feedback="legacy")
    lin = LinearModel(base=0.02, alpha=5.74e-3, beta=0.316)
    np.testing.assert_allclose(c.service_time(args["size"], args["max_seq_len"]),
                               lin.service_time(args["size"], args["max_seq_len"]), rtol=1e-14)
    np.testing.assert_allclose(c.feedback_tbt(**args), lin.feedback_tbt(**args), rtol=1e-14)


@given(alpha=valid("CalibratedModel.alpha", hi=10.0), beta=valid("CalibratedModel.beta", hi=1.0),
       gamma=valid("gamma", hi=10.0), b=st.integers(1, 10_000), seq=st.integers(0, 100_000))
def test_calibrated_service_grows_with_the_batch_and_the_longest_sequence(alpha, beta, gamma, b, seq):
    m = CalibratedModel(alpha=alpha, beta=beta, gamma=gamma)
    s = m.service_time(b, seq)
    assert m.service_time(b + 1, seq) >= s and m.service_time(b, seq + 1) >= s >= alpha
    tbt = m.feedback_tbt(b)
    assert beta <= tbt <= beta * (1 + gamma) * (1 + 1e-15)            # 1 <= h(b) < 1 + gamma
    assert s == pytest.approx(alpha + tbt * seq, rel=1e-15)           # the fed TBT is the service's slope


# --- the references against the kernel and against plain loops ------------------------------

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


def test_batch_aggregates_equal_a_loop():
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 20, 100)
    n = int(sizes.sum())
    p, o = rng.integers(0, 1000, n).astype(float), rng.integers(0, 1000, n).astype(float)
    agg = batch_aggregates(p, o, sizes)
    start = 0
    for i, b in enumerate(sizes):
        sl = slice(start, start + b)
        start += b
        assert (agg.size[i], agg.sum_prompt[i], agg.max_output[i], agg.max_seq_len[i]) == (
            b, sum(p[sl]), max(o[sl]), max(p[sl] + o[sl]))


def test_references_broadcast_and_return_floats_for_scalars():
    m = DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-4)
    assert isinstance(m.service_time(4, max_output=50, sum_prompt=100), float)
    grid = m.service_time(np.arange(1, 5)[:, None], max_output=np.array([10.0, 20.0]), sum_prompt=0.0)
    assert grid.shape == (4, 2)
    assert isinstance(m.times(1, max_output=1, sum_prompt=0), BatchTimes)


def test_reference_errors_name_the_argument():
    m = CalibratedModel()
    with pytest.raises(TypeError, match=r"service_time needs size \(requests\), max_seq_len \(tokens\) \(or size, "
                                        r"prompt and output of uniform batches\); max_seq_len not given"):
        m.service_time(4)
    with pytest.raises(TypeError, match=r"times needs .*max_output \(tokens\) \(or .*\); max_output not given"):
        m.times(4, 100)
    with pytest.raises(ValueError, match=r"size must hold integers in \[1, inf\) \(requests\); got size\[1\] = 0"):
        m.service_time([3, 0], 100.0)
    with pytest.raises(TypeError, match=r"size must hold integers .*got floats"):
        m.service_time(4.0, 100.0)
    with pytest.raises(TypeError, match="size must be a real number"):
        m.service_time(True, 100.0)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[0, inf\) \(tokens\); got max_seq_len = -1.0"):
        m.service_time(4, -1.0)
    with pytest.raises(ValueError, match=r"max_seq_len must be finite \(tokens\); got max_seq_len\[0\] = nan"):
        m.service_time(4, [math.nan])
    with pytest.raises(ValueError, match=r"must be at least max_output; got 10.0 < 20.0 \(element 0\)"):
        m.times(4, 10.0, 20.0)
    with pytest.raises(TypeError, match="MaxModel.service_time needs max_output"):
        MaxModel().service_time(4)
    with pytest.raises(ValueError, match=r"sizes must sum to the 4 members .*got sum\(sizes\) = 5"):
        batch_aggregates(PROMPT, OUTPUT, [2, 3])
    with pytest.raises(ValueError, match=r"output must be in \[0, inf\) \(tokens\); got output\[1\] = -2.0"):
        batch_aggregates([1.0, 2.0], [3.0, -2.0])


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
        return d.MODEL.zeros(**model.kernel_fields())[1].tolist()

    assert floats(MaxModel(0.5, 0.01)) == [0.5, 0.01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert floats(LinearModel(0.2, 1e-3, 0.5)) == [0.2, 0, 1e-3, 0.5, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert floats(DecodeModel(5e-3, 0.3, 1e-4)) == [0, 0, 0, 0, 1e-4, 5e-3, 0.3, 0, 0, 0, 0, 0, 0]
    assert floats(CalibratedModel(0.02, 4e-3, 0.2)) == [0.02, 0, 0, 0, 0, 4e-3, 0.2, 0, 0, 0, 0, 0, 0]
    assert floats(IterationModel(0.02, 5e-3, 1e-4, 2e-4, 1e-7)) == [0.02, 0, 0, 0, 1e-4, 0, 0, 5e-3, 2e-4, 1e-7,
                                                                     0, 0, 1]
    assert floats(IterationModel(0.02, 5e-3, 1e-4, 2e-4, 1e-7, 3e-3, experts=8)) == [
        0.02, 0, 0, 0, 1e-4, 0, 0, 5e-3, 2e-4, 1e-7, 3e-3, 6, 0.75]
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
                               experts_per_token=data.draw(st.integers(1, experts)) if experts else 2)
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
    out = np.empty((4, m))
    kf = model.kernel_fields()
    if which.endswith("stay"):
        # the padded decode work, as the kernel's decode_work makes it from the batch's size, prompts and
        # longest output (end to end: tests/test_policies_spf.py's iteration-model cases)
        dmax = np.maximum(max_out - 1.0, 0.0)
        seq, ctx = size * dmax, sum_prompt * dmax + size * dmax * (dmax + 1.0) / 2.0
        reads = dmax * sm.extra_experts(model.experts, model.experts_per_token, size)
    d.batch_times(d.MODEL.zeros(**kf), size, sum_prompt, max_out, max_seq, seq, ctx, reads, out)
    t = model.times(size=size.astype(np.int64), max_seq_len=max_seq, max_output=max_out, sum_prompt=sum_prompt,
                    sequence_steps=seq, context_steps=ctx, expert_reads=reads if "moe" in which else None)
    for k, name in enumerate(BatchTimes._fields):
        assert np.asarray(getattr(t, name), dtype=float).tobytes() == out[k].tobytes(), name


def test_docstring_examples():
    assert doctest.testmod(sm, optionflags=doctest.ELLIPSIS).failed == 0


# --- fitting ---------------------------------------------------------------------------------

TRUE = [MaxModel(base=0.3, per_token=0.02), LinearModel(base=0.1, alpha=1e-3, beta=0.2),
        DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-5),
        CalibratedModel(alpha=0.02, beta=5.74e-3, gamma=0.316)]


def _rows(model, n, rng, noise=0.0):
    """n measured batches of ``model``: aggregates of random members, times with N(0, noise^2) errors."""
    size = rng.integers(1, 64, n)
    max_output = rng.integers(20, 500, n).astype(float)
    cols = dict(size=size, max_output=max_output, max_seq_len=max_output + rng.integers(0, 3000, n),
                sum_prompt=rng.integers(0, 20_000, n).astype(float))
    cols["service"] = model.service_time(**{k: cols[k] for k in model._service_columns}) + rng.normal(0, noise, n)
    return cols


@pytest.mark.parametrize("true", TRUE, ids=lambda m: type(m).__name__)
def test_fit_recovers_noise_free_parameters(true):
    rows = _rows(true, 200, np.random.default_rng(0))
    res = type(true).fit(rows)
    assert isinstance(res, FitResult) and type(res.model) is type(true)
    for k in true._params:
        assert res.params[k] == pytest.approx(getattr(true, k), rel=1e-9)
        assert getattr(res.model, k) == res.params[k]
        assert res.stderr[k] <= 1e-9 * getattr(true, k)
    assert res.n == 200 and res.dof == 200 - len(true._params) and res.at_bound == ()
    assert res.rmse < 1e-12 * np.mean(rows["service"]) and res.r2 == pytest.approx(1.0, abs=1e-12)
    assert res.covariance.shape == (len(true._params),) * 2
    assert type(true).__name__ in str(res)


def test_fit_reads_dataframes_structured_arrays_and_tables():
    pd = pytest.importorskip("pandas")
    true = TRUE[3]
    rows = _rows(true, 50, np.random.default_rng(1))
    want = CalibratedModel.fit(rows).params
    rec = np.rec.fromarrays([rows["size"], rows["max_seq_len"], rows["service"]],
                            names="size,max_seq_len,service")
    for table in (pd.DataFrame(rows), np.asarray(rec), mb.Table(rows)):
        assert CalibratedModel.fit(table).params == want
    assert CalibratedModel.fit(rows, feedback="uncalibrated").model == CalibratedModel(**want, feedback="uncalibrated")


#: repetitions of the coverage experiment
REPS = 1500


@pytest.mark.parametrize("true", TRUE, ids=lambda m: type(m).__name__)
def test_fit_standard_errors_match_the_noise(true):
    """Gaussian noise (sd 0.01 s) on 40 batches, REPS = 1500 times: each
    parameter's 95% t-interval (fit +/- t_0.975,dof * stderr) must cover the
    truth in 1390 to 1456 of the repetitions, the central 99.993% of
    Binomial(1500, 0.95): a correct fit fails with probability 7e-5 per
    parameter, 8e-4 for the 12 of the test.  Standard errors 20% too small
    (coverage 89%) fail surely, 20% too large (98%) with probability 0.99.
    And the mean of rmse^2 n/dof must be sigma^2 within 4 sd of its sampling
    error, sd sigma^2 sqrt(2 / (dof REPS)) (a failure probability of 6e-5)."""
    from scipy import stats

    sigma, n = 0.01, 40
    rng = np.random.default_rng(2024)
    p = len(true._params)
    tq = stats.t.ppf(0.975, n - p)
    covered = dict.fromkeys(true._params, 0)
    s2 = []
    for _ in range(REPS):
        res = type(true).fit(_rows(true, n, rng, sigma), holdout=False)
        for k in true._params:
            covered[k] += abs(res.params[k] - getattr(true, k)) <= tq * res.stderr[k]
        s2.append(res.rmse ** 2 * n / res.dof)
    lo, hi = stats.binom.ppf([5e-5, 1 - 5e-5], REPS, 0.95)
    assert (lo, hi) == (1390, 1456)
    for k, c in covered.items():
        assert lo <= c <= hi, (k, c)
    assert abs(np.mean(s2) / sigma ** 2 - 1) < 4 * math.sqrt(2 / ((n - p) * REPS))


def test_fit_holds_a_negative_coefficient_at_its_bound():
    """No batch penalty in truth, noise: the unconstrained gamma is negative in
    about half the repetitions; the bounded fit holds it at 0 and is then the
    least-squares optimum over the domain (scipy's bounded trust-region fit
    in the model's own parameters finds no smaller sum of squares)."""
    from scipy.optimize import least_squares

    true = CalibratedModel(alpha=0.05, beta=2e-3, gamma=0.0)
    rng = np.random.default_rng(9)
    held = 0
    for _ in range(20):
        rows = _rows(true, 30, rng, 0.05)
        res = CalibratedModel.fit(rows)
        assert res.params["gamma"] >= 0.0
        if res.at_bound:
            held += 1
            assert res.at_bound == ("gamma",) and res.params["gamma"] == 0.0
        x = (rows["size"] - 1) / rows["size"]

        def resid(th, seq=rows["max_seq_len"], x=x, y=rows["service"]):
            return th[0] + th[1] * seq * (1 + th[2] * x) - y

        ref = least_squares(resid, [0.1, 1e-3, 0.1], bounds=([0, 1e-12, 0], np.inf), x_scale=[0.1, 1e-3, 0.1],
                            xtol=1e-15, ftol=1e-15, gtol=1e-15)
        rss = 2 * ref.cost
        assert res.rmse ** 2 * res.n <= rss * (1 + 1e-9)
    assert 3 <= held <= 17


def test_fit_errors_name_the_column_and_the_problem():
    rows = _rows(TRUE[3], 20, np.random.default_rng(4))
    with pytest.raises(ValueError, match=r"CalibratedModel.fit needs the columns size \(requests\), max_seq_len "
                                         r"\(tokens\); measurements lack max_seq_len"):
        CalibratedModel.fit({k: v for k, v in rows.items() if k != "max_seq_len"})
    with pytest.raises(ValueError, match="needs at least 4 measurement rows for 3 parameters .*; got 3"):
        CalibratedModel.fit({k: v[:3] for k, v in rows.items()})
    bad = dict(rows, service=np.where(np.arange(20) == 6, np.nan, rows["service"]))
    with pytest.raises(ValueError, match=r"column service must be finite \(s\); got column service\[6\] = nan"):
        CalibratedModel.fit(bad)
    bad = dict(rows, max_seq_len=-rows["max_seq_len"])
    with pytest.raises(ValueError, match=r"column max_seq_len must be in \[0, inf\) \(tokens\)"):
        CalibratedModel.fit(bad)
    with pytest.raises(TypeError, match="column size must hold integers"):
        CalibratedModel.fit(dict(rows, size=rows["size"].astype(float)))
    with pytest.raises(ValueError, match="one length"):
        CalibratedModel.fit(dict(rows, service=rows["service"][:-1]))
    with pytest.raises(ValueError, match=r"do not determine alpha, beta, gamma .*size too"):
        CalibratedModel.fit(dict(rows, size=np.ones(20, dtype=int)))
    with pytest.raises(ValueError, match="do not determine base, per_token .*two values"):
        MaxModel.fit({"max_output": np.full(5, 3.0), "service": np.arange(5.0)})
    # the best fit on the bound of an open domain: returned, no model
    res = MaxModel.fit({"max_output": np.arange(5.0), "service": 10.0 - np.arange(5.0)})
    assert res.model is None and res.at_bound == ("per_token",) and res.params["per_token"] == 0.0
    assert "per_token at 0, outside the domain" in res.note and "no model" in str(res)
    with pytest.raises(TypeError, match="measurements must be a DataFrame"):
        CalibratedModel.fit([[1, 2, 3]])
    with pytest.raises(TypeError, match="without field names"):
        CalibratedModel.fit(np.zeros((5, 3)))
    with pytest.raises(TypeError, match="gamma is fitted"):
        CalibratedModel.fit(rows, gamma=0.3)
    with pytest.raises(TypeError, match="feedback is not a field; the fields it takes fixed are: none"):
        LinearModel.fit(rows, feedback="legacy")


# --- the iteration model ---------------------------------------------------------------------

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


@pytest.mark.parametrize("columns", [("service",), ("prefill", "per_token"), ("service", "prefill", "per_token")])
@pytest.mark.parametrize("weights", ["absolute", "relative"])
def test_iteration_model_fit_recovers_known_coefficients(columns, weights):
    """Noise-free measurements of a known engine: every coefficient back to
    1e-8 relative, from whole batches, from the phases alone, or from both;
    in and out of sample errors of 0."""
    rows = _uniform_rows(ITER, np.random.default_rng(5))
    rows = {k: v for k, v in rows.items() if k in ("size", "prompt", "output", *columns)}
    res = IterationModel.fit(rows, weights=weights)
    for k in ITER._params:
        assert res.params[k] == pytest.approx(getattr(ITER, k), rel=1e-8), k
    assert type(res.model) is IterationModel and res.at_bound == () and res.weights == weights
    assert res.median_error < 1e-10 and res.max_error < 1e-10 and res.holdout_error < 1e-10
    assert res.holdout == "leave-one-out"


def test_fit_holdout_error_is_leave_one_out():
    """The held-out error is the median over rows of each row's relative error
    under the fit without it (checked by refitting by hand), with noise."""
    rng = np.random.default_rng(8)
    rows = {k: v for k, v in _uniform_rows(ITER, rng, 0.05, relative=True).items()
            if k in ("size", "prompt", "output", "service")}
    res = IterationModel.fit(rows, weights="relative")
    errs = []
    for i in range(rows["size"].size):
        keep = np.arange(rows["size"].size) != i
        fit = IterationModel.fit({k: v[keep] for k, v in rows.items()}, weights="relative")
        pred = fit.model.service_time(size=rows["size"][i], prompt=rows["prompt"][i], output=rows["output"][i])
        errs.append(abs(pred - rows["service"][i]) / rows["service"][i])
    assert res.holdout_error == pytest.approx(np.median(errs), rel=1e-9)
    assert res.median_error < res.holdout_error < 0.1 and res.max_error >= res.median_error
    # without the held-out refits: the same fit, no held-out error
    quick = IterationModel.fit(rows, weights="relative", holdout=False)
    assert quick.holdout == "none" and np.isnan(quick.holdout_error) and np.isnan(quick.holdout_errors).all()
    assert quick.holdout_errors.size == res.holdout_errors.size and "none" not in str(quick)
    for k in ("params", "rmse", "r2", "n", "dof", "at_bound", "median_error", "max_error"):
        assert getattr(quick, k) == getattr(res, k), k
    assert quick.stderr.keys() == res.stderr.keys()     # (NaN where a parameter is not fitted)
    assert np.array_equal(list(quick.stderr.values()), list(res.stderr.values()), equal_nan=True)
    assert quick.model == res.model and np.array_equal(quick.covariance, res.covariance, equal_nan=True)
    with pytest.raises(TypeError, match="IterationModel.fit: holdout must be True or False; got 'no'"):
        IterationModel.fit(rows, holdout="no")


def test_fit_takes_the_phases_only_where_the_model_times_them():
    rows = _uniform_rows(ITER, np.random.default_rng(6))
    with pytest.raises(ValueError, match="LinearModel.fit: measurements have a prefill column, which LinearModel "
                                         "cannot fit"):
        LinearModel.fit({k: rows[k] for k in ("size", "prompt", "output", "prefill")})
    with pytest.raises(ValueError, match="needs at least one measured time: a column service"):
        IterationModel.fit({k: rows[k] for k in ("size", "prompt", "output")})
    with pytest.raises(ValueError, match="weights must be 'absolute' or 'relative'"):
        IterationModel.fit(rows, weights="log")
    # DecodeModel from its phases: its prefill is prefill + TBT(b), its steps TBT(b)
    true = DecodeModel(beta=6e-3, gamma=0.4, prefill_per_token=1e-4)
    t = true.times(size=rows["size"], prompt=rows["prompt"], output=rows["output"])
    res = DecodeModel.fit(dict(size=rows["size"], prompt=rows["prompt"], output=rows["output"], prefill=t.ttft,
                               per_token=t.decode_tbt))
    assert res.params == pytest.approx({"beta": 6e-3, "gamma": 0.4, "prefill_per_token": 1e-4}, rel=1e-9)


def test_a_fit_on_a_bound_is_returned_with_the_bound_named():
    """Times that do not grow with batch size: the best per_sequence and
    per_context_token are 0 (the closed bound of their domain); the fit
    returns the model, naming them."""
    size = np.repeat([1, 8, 64], 6)
    L = np.tile([128.0, 256.0, 512.0, 1024.0, 1536.0, 2048.0], 3)
    service = 0.5 + 0.01 * L - 1e-5 * size * L        # faster with more requests: no physical engine
    res = IterationModel.fit(dict(size=size, prompt=L, output=L, service=service))
    assert set(res.at_bound) >= {"per_context_token"} and all(res.params[k] == 0.0 for k in res.at_bound)
    assert res.model is not None and "at 0, the bound of the domain" in res.note


def test_a_fit_refuses_measured_times_beyond_a_sane_domain_naming_the_row():
    """DecodeModel.fit with a measured time of 1e300 s returned rmse = inf (the residuals' squares
    overflow; a length of 1e300 tokens overflowed the design): measured times stay within
    MAX_MEASURED_TIME (2**30 s, about 34 years: the top of the typical service times a run resolves),
    lengths and aggregates below 2**62 tokens, refused naming the column and the row."""
    from mbbatch.params import MAX_MEASURED_TIME
    from mbbatch.simulation import SCALE_RANGE

    assert MAX_MEASURED_TIME == SCALE_RANGE[1]
    size = np.array([1, 2, 4, 8, 16, 32] * 2)
    rows = dict(size=size, prompt=np.array([128.0, 256.0, 512.0] * 4), output=np.array([64.0] * 6 + [256.0] * 6))
    rows["service"] = 0.01 + 1e-4 * size * rows["output"]
    for model in (mb.DecodeModel, mb.IterationModel):
        assert math.isfinite(model.fit(rows, holdout=False).rmse)
        for col, value, match in (
                ("service", 1e300, r"column service must hold values in \[0, 1073741824\] \(s\); got "
                                   r"column service\[3\] = 1e\+300$"),
                ("service", 2.0 ** 31, r"column service must hold values in \[0, 1073741824\] \(s\); got "
                                       r"column service\[3\] = 2147483648\.0$"),
                ("prompt", 1e300, r"column prompt must hold values in \[0, 2\*\*62\) \(tokens\); got "
                                  r"column prompt\[3\] = 1e\+300$")):
            bad = {**rows, col: rows[col].astype(float).copy()}
            bad[col][3] = value
            with pytest.raises(ValueError, match=rf"^{model.__name__}\.fit: {match}"):
                model.fit(bad, holdout=False)


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
