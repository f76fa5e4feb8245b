"""mb.ContinuousBatching: its settings checked at the boundary, described,
and built from a sweep's parameters."""

import math

import pytest

import mbbatch as mb
from mbbatch import registry


def test_defaults_are_vllms_and_it_describes_itself():
    p = mb.ContinuousBatching()
    assert (p.max_num_seqs, p.max_batched_tokens, p.chunked_prefill, p.block_size, p.admission) == (
        256, 2048, True, 16, "fcfs")
    assert math.isinf(p.kv_tokens) and isinstance(p.predictor, mb.Oracle)
    assert p.describe() == {"policy": "continuous", "max_num_seqs": 256, "max_batched_tokens": 2048,
                            "chunked_prefill": True, "kv_tokens": "inf", "block_size": 16, "admission": "fcfs"}
    d = mb.ContinuousBatching(admission="multibin", bins=3, edges=(50, 200), kv_tokens=1e5,
                              predictor=mb.LogNormalError(0.5)).describe()
    assert d["bins"] == 3 and d["edges"] == [50.0, 200.0] and d["kv_tokens"] == 1e5 and d["predictor_sigma"] == 0.5
    assert registry.kind_of(p) is mb.ContinuousBatching and registry.POLICIES["continuous"] is mb.ContinuousBatching


@pytest.mark.parametrize("kw, exc, match", [
    (dict(max_num_seqs=0), ValueError, "max_num_seqs"),
    (dict(max_num_seqs=2.0), TypeError, "max_num_seqs"),
    (dict(max_batched_tokens=100, max_num_seqs=256), ValueError, "max_batched_tokens = 100 must be >= max_num_seqs"),
    (dict(kv_tokens=0.0), ValueError, "kv_tokens"),
    (dict(kv_tokens=8.0), ValueError, "at least one block"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(admission="lifo"), ValueError, "admission"),
    (dict(chunked_prefill="yes"), TypeError, "chunked_prefill"),
    (dict(edges=(10.0,)), ValueError, "edges are the bins of admission='multibin'"),
    (dict(admission="multibin", bins=3, edges=(10.0,)), ValueError, "bins - 1 = 2"),
    (dict(admission="multibin", bins=3, edges=(20.0, 10.0)), ValueError, "ascending"),
    (dict(predictor=mb.BinConfusion(0.9)), TypeError, "bin confusion"),
])
def test_bad_settings_are_refused_naming_them(kw, exc, match):
    with pytest.raises(exc, match=match):
        mb.ContinuousBatching(**kw)


def test_without_chunked_prefill_the_budget_may_be_below_the_sequences():
    p = mb.ContinuousBatching(max_num_seqs=256, max_batched_tokens=100, chunked_prefill=False)
    assert p.max_batched_tokens == 100


def test_a_sweep_cell_builds_it():
    p = registry.build("continuous", {"max_num_seqs": 8, "max_batched_tokens": 64, "chunked_prefill": False,
                                      "kv_tokens": 4096.0, "block_size": 8, "admission": "spf",
                                      "admission_bins": 4, "predictor_sigma": 0.3})
    assert (p.max_num_seqs, p.max_batched_tokens, p.chunked_prefill, p.kv_tokens, p.block_size, p.admission) == (
        8, 64, False, 4096.0, 8, "spf")
    assert p.predictor == mb.LogNormalError(0.3)


def test_a_sweep_cell_with_sla_control_builds_the_controller_on_the_engines_memory():
    params = {"max_num_seqs": 64, "max_batched_tokens": 2048, "chunked_prefill": True, "kv_tokens": 4096.0,
              "block_size": 16, "admission": "fcfs", "admission_bins": 4, "sla_control": True, "d_sla": 0.02,
              "eps_d": 1e-3, "b_min": 2, "b_max": 128, "controller": "spec", "memory": "clt", "eps_m": 0.1}
    p = registry.build("continuous", params)
    assert p.controller == mb.SLAController(d_sla=0.02, eps_d=1e-3, b_min=2, b_max=128)
    assert (p.algorithm1.eta, p.algorithm1.variant, p.algorithm1.eps_m) == (4096.0, "clt", 0.1)
    assert p.describe()["eta"] == 4096.0 and p.describe()["controller"] == "spec"
    assert registry.build("continuous", {**params, "memory": "off"}).algorithm1 is None
    assert registry.build("continuous", {**params, "kv_tokens": math.inf}).algorithm1 is None
    assert registry.build("continuous", {**params, "sla_control": False}).controller is None
