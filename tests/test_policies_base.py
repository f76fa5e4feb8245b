"""What a policy declares (mbbatch.policies.base), and the helpers that
build a cell's predictor, memory and controller."""

import math

import pytest

import mbbatch as mb
from mbbatch.policies.base import (Policy, controller_from_spec, declaring, memory_from_spec, memory_kw,
                                   predictor_from_spec)


def test_declaring_lists_the_policies_of_a_capability():
    from mbbatch import registry

    for attr in ("engine", "decode_stage"):
        assert declaring(attr) == sorted(cls.__name__ for cls in registry.POLICIES.values() if getattr(cls, attr))


def test_a_token_policy_is_its_own_engine_form():
    pol = mb.DynamicBatching()
    assert pol.engine_form() is pol and pol.title == "DynamicBatching"
    assert Policy.engine_form(pol) is pol


def test_a_cells_predictor_is_one_of_two_or_the_oracle():
    assert predictor_from_spec({"predictor_sigma": 0.0, "predictor_p": 1.0}) is None
    assert predictor_from_spec({"predictor_sigma": 0.5, "predictor_p": 1.0}) == mb.LogNormalError(0.5)
    assert predictor_from_spec({"predictor_sigma": 0.0, "predictor_p": 0.8}) == mb.BinConfusion(0.8)
    assert predictor_from_spec({}) is None
    with pytest.raises(ValueError, match="predictor_sigma = 0.5 and predictor_p = 0.8: set one predictor"):
        predictor_from_spec({"predictor_sigma": 0.5, "predictor_p": 0.8})


def test_a_cells_memory_and_controller():
    mem = memory_from_spec({"memory": "off", "eps_m": 0.1, "eta": 5000.0})
    assert mem.eta == 5000.0 and not mem.enabled and mem.variant == "l0" and mem.eps_m == 0.1
    assert memory_from_spec({"memory": "clt", "eps_m": 0.05, "eta": 5000.0}).variant == "clt"
    assert mb.Memory(**memory_kw(123.0)).eta == 123.0
    ctl = controller_from_spec({"d_sla": 0.01, "eps_d": 0.0, "b_min": 2, "b_max": 8, "controller": "multiplicative"})
    assert (ctl.d_sla, ctl.b_min, ctl.b_max, ctl.variant) == (0.01, 2, 8, "multiplicative")
    assert math.isfinite(ctl.eps_d)
