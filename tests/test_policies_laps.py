"""LAPS (mbbatch.policies.laps): its settings and its decode stage."""

import pytest

import mbbatch as mb

CELL = {"instances": 4, "laps_threshold": 256, "window": 5e-3, "max_batch": 8, "max_batch_tokens": 16384.0,
        "dual_queue": True, "dynamic": True, "interval": 5.0, "ratio": 2.0, "long_instances": None,
        "decode": "none", "decode_servers": 2, "decode_batch_size": None, "decode_bins": 4, "decode_d_sla": 7.5e-3,
        "decode_b_max": 64, "decode_eta": None, "decode_model_beta": 5.74e-3, "decode_model_gamma": 0.316}


def _build(kind, params):
    from mbbatch import registry

    return registry.build(kind, params)


def test_the_decode_stage_is_a_decode_stage_policy():
    with pytest.raises(TypeError, match="decode must be ContinuousBatching or DynamicBatching or MultiBinDynamic or "
                                        "StaticBatching"):
        mb.LAPS(decode=mb.MultiBin(bins=2, batch_size=4))
    with pytest.raises(TypeError, match="decode_model is the decode stage's service model"):
        mb.LAPS(decode_model=mb.DecodeModel())
    assert mb.LAPS(decode=mb.StaticBatching(4)).describe()["decode_policy"] == "static"


def test_a_cells_laps_and_its_decode_stage():
    assert _build("laps", CELL).decode is None
    # (a memory-aware stage without decode_eta: the parameter table's eta, as the API's Memory())
    assert _build("laps", {**CELL, "decode": "dynamic"}).decode.memory.eta == mb.Memory().eta
    with pytest.raises(ValueError, match='decode = "static" needs decode_batch_size'):
        _build("laps", {**CELL, "decode": "static"})
    laps = _build("laps", {**CELL, "decode": "multibin_dynamic", "decode_eta": 1000.0, "decode_bins": 3})
    assert isinstance(laps.decode, mb.MultiBinDynamic) and laps.decode.bins == 3
    assert laps.decode.memory.eta == 1000.0 and laps.decode_model.prefill_per_token == 0.0
    # a continuous-batching decode stage: decode_b_max running sequences, decode_eta KV tokens (else inf)
    laps = _build("laps", {**CELL, "decode": "continuous", "decode_eta": 50_000.0})
    assert isinstance(laps.decode, mb.ContinuousBatching) and isinstance(laps.decode_model, mb.IterationModel)
    assert (laps.decode.max_num_seqs, laps.decode.kv_tokens) == (64, 50_000.0)
    assert _build("laps", {**CELL, "decode": "continuous"}).decode.kv_tokens == float("inf")
