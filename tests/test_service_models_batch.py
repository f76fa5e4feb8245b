"""The batch models (mbbatch.service_models.batch): each model's batch time on a hand trace of one batch
(a static batch of four run end to end), the defaults from the parameter table, and the calibrated
model's three feedback rules against the dynamic-batching paper's pseudocode (Pang et al., 2025,
arXiv:2503.05248)."""


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mbbatch as mb
from mbbatch.params import PARAMS
from mbbatch.service_models import (
    SERVICE_MODELS,
    UNCALIBRATED_TBT,
    CalibratedModel,
    LinearModel,
    batch_aggregates,
)

from .strategies import valid
from .test_service_models import _compute_decode_tbt, _recent_tbt

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
