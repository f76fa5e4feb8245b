"""A cluster and its programs (mbbatch.policies.cluster)."""

import pytest

import mbbatch as mb


def test_a_clusters_engines_declare_they_can_be_engines():
    assert mb.Cluster().policy == mb.DynamicBatching() or isinstance(mb.Cluster().policy, mb.DynamicBatching)
    from mbbatch import registry

    engines = sorted(cls.__name__ for cls in registry.POLICIES.values() if cls.engine)
    with pytest.raises(TypeError, match=f"policy must be {' or '.join(engines)} .*; got LAPS"):
        mb.Cluster(mb.LAPS())
    cl = mb.Cluster(mb.MultiBin(bins=2, batch_size=4), engines=3)
    assert cl.engine_kind == "multibin" and cl.kind == "cluster" and cl.describe()["engine_policy"] == "multibin"
    assert mb.Cluster(mb.ContinuousBatching(), engines=2).describe()["engine_policy"] == "continuous"


def test_program_tables_are_sized_by_their_programs():
    assert mb.Programs(calls=4).table_size(10) == 3
    s = mb.Sessions([0, 0, 1, -1])
    assert s.count == 3 and s.table_size(4) == 3 and s.table_size(9) == 9 and not s.closed
