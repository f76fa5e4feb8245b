"""The controllers' configuration (mbbatch.controller): the memory's token
capacity and the SLA controller's settings (the controllers themselves are
tested in test_kernels_controller.py)."""

import pytest

import mbbatch as mb
from mbbatch.params import default


def test_token_capacity():
    assert mb.Memory().eta == (80.0 - 8.0) / 4e-4
    assert mb.Memory(m_max_gb=10.0, m_model_gb=2.0, kv_mem_per_token_gb=0.5).eta == 16.0
    with pytest.raises(ValueError, match="m_model_gb must be less than m_max_gb"):
        mb.Memory(m_max_gb=8.0, m_model_gb=8.0)


def test_sla_controller_defaults_are_the_tables():
    c = mb.SLAController()
    for field, key in (("d_sla", "d_sla"), ("eps_d", "eps_d"), ("alpha", "SLAController.alpha"),
                       ("variant", "controller")):
        assert getattr(c, field) == default(key)
    with pytest.raises(ValueError, match="b_min"):
        mb.SLAController(b_min=10, b_max=5)
