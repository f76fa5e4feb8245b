"""Batching policies (mbbatch.policies): their settings, descriptions and
the batches they form in a run."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb

WL = mb.Workload(prompt=st.uniform(10, 100), output=st.uniform(5, 50))


def test_descriptions_name_the_policy_kind():
    assert mb.MultiBin(bins=2, batch_size=4).describe()["policy"] == "multibin"
    assert mb.StaticBatching(8).describe() == {"policy": "static", "batch_size": 8, "d_sla": 7.5e-3,
                                               "eps_d": 5e-5, "eta": 180000.0}
    assert mb.DynamicBatching().describe()["policy"] == "dynamic"
    d = mb.MultiBinDynamic(bins=3, warmup=50).describe()
    assert (d["policy"], d["bins"], d["warmup"]) == ("multibin_dynamic", 3, 50)


def test_multibin_edges_are_checked_and_frozen():
    p = mb.MultiBin(bins=2, batch_size=4, edges=[0.0, 5.0, np.inf])
    assert p.edges.tolist() == [0.0, 5.0, np.inf] and not p.edges.flags.writeable
    with pytest.raises(ValueError, match="strictly increasing"):
        mb.MultiBin(bins=2, batch_size=4, edges=[0.0, 5.0, 5.0])


def test_multibin_forms_full_batches_within_a_bin():
    res = mb.simulate(mb.MultiBin(bins=3, batch_size=4), arrivals=mb.Poisson(0.2), service=st.uniform(1, 9),
                      n=3000, seed=1, keep_requests=True)
    r = res.requests
    served = r.batch >= 0
    for b in np.unique(r.batch[served]):
        members = served & (r.batch == b)
        assert members.sum() == 4 and np.unique(r.bin[members]).size == 1


def test_static_batching_never_exceeds_its_batch_size():
    res = mb.simulate(mb.StaticBatching(6), arrivals=mb.Poisson(5.0), workload=WL, n=3000, seed=1,
                      keep_batches=True)
    assert res.batches.size.max() <= 6 and res.batch_size_hist[7:].sum() == 0


def test_multibin_dynamic_needs_a_warmup_of_at_least_its_bins():
    with pytest.raises(ValueError, match="warmup must be at least bins"):
        mb.MultiBinDynamic(bins=4, warmup=2)
    with pytest.raises(ValueError, match="bin_b_max must have bins = 2 entries"):
        mb.MultiBinDynamic(bins=2, bin_b_max=[4])
