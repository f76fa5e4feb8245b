"""Batching policies (mbbatch.policies): one module per policy; the package
gathers them, each a policy of the registry with a description that names
its kind."""

import mbbatch as mb
from mbbatch import policies, registry


def test_every_registered_policy_is_in_a_module_of_its_own_and_exported():
    """A newcomer finds a policy by its name: mbbatch.policies.<module>, and mb.<Class>."""
    for kind, cls in registry.POLICIES.items():
        assert cls.__module__.startswith(policies.__name__ + ".") and getattr(mb, cls.__name__) is cls


def test_descriptions_name_the_policy_kind():
    assert mb.MultiBin(bins=2, batch_size=4).describe()["policy"] == "multibin"
    assert mb.StaticBatching(8).describe() == {"policy": "static", "batch_size": 8, "d_sla": 7.4e-3,
                                               "eps_d": 5e-5, "eta": 180000.0}
    assert mb.DynamicBatching().describe()["policy"] == "dynamic"
    d = mb.MultiBinDynamic(bins=3, warmup=50).describe()
    assert (d["policy"], d["bins"], d["warmup"]) == ("multibin_dynamic", 3, 50)
    assert mb.LAPS().describe()["policy"] == "laps" and mb.Cluster().describe()["policy"] == "cluster"
