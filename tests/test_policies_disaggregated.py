"""mb.Disaggregated and mb.KVTransfer: their settings checked by name, the
link's transfer time, the bytes a token of a model's KV cache."""

from __future__ import annotations

import pytest

import mbbatch as mb


def test_kv_transfer_of_a_model():
    """Bytes a token: keys and values, every layer, every KV head."""
    assert mb.KVTransfer.of_model(32, 8, 128).bytes_per_token == 131072.0 == mb.KVTransfer().bytes_per_token
    assert mb.KVTransfer(bandwidth=1e9, latency=0.5).seconds(1000) == pytest.approx(0.5 + 1000 * 131072 / 1e9)
    with pytest.raises(ValueError, match="layers"):
        mb.KVTransfer.of_model(0, 8, 128)
    with pytest.raises(ValueError, match="bandwidth"):
        mb.KVTransfer(bandwidth=0.0)


@pytest.mark.parametrize("bad, match", [
    (dict(prefill=mb.StaticBatching(4)), "prefill"),
    (dict(decode_engines=0), "decode_engines"),
    (dict(router="autellix"), "router"),
    (dict(kv_transfer=1.0), "kv_transfer"),
    (dict(decode=mb.ContinuousBatching(prefix_caching=True)), r"decode\.prefix_caching"),
    (dict(prefill=mb.LAPS(instances=2, decode=mb.ContinuousBatching())), r"prefill\.decode"),
    (dict(prefill=mb.LAPS(instances=2), prefill_engines=3), r"prefill_engines: .*LAPS\(instances=2\)"),
    (dict(prefill=mb.LAPS(instances=2), router="round_robin"), "router: a LAPS prefill pool"),
    (dict(programs=3), "programs"),
])
def test_bad_settings_are_refused_by_name(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        mb.Disaggregated(**bad)


def test_a_laps_prefill_pools_engines_are_its_instances():
    """A LAPS prefill pool: its instances are the pool's engines (given
    again, the same), its router LAPS's, its settings in the description."""
    for given in ({}, {"prefill_engines": 3}):
        pol = mb.Disaggregated(prefill=mb.LAPS(instances=3, threshold=128), decode_engines=2, **given)
        assert pol.prefill_engines == 3 and pol.engines == 5 and pol.laps
        d = pol.describe()
        assert d["router"] == "laps" and d["prefill_policy"] == "laps" and d["prefill_threshold"] == 128
    assert not mb.Disaggregated().laps
