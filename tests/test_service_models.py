"""Batch service models (mbbatch.service_models): each model's batch time,
checked on a hand trace of one batch at a time."""

import numpy as np
import pytest

import mbbatch as mb

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
