"""The registry (mbbatch.registry): every policy declared once, and the
tables that read it (the metric table's kinds, the spec keys per kind, the
parameter table's choices, the command line's --policy) agree with what the
policies declare."""

import pytest

import mbbatch as mb
from mbbatch import registry
from mbbatch.metrics import METRICS, TAGS, applicable
from mbbatch.params import PARAMS
from mbbatch.planners import PLANNERS
from mbbatch.policies.base import Policy
from mbbatch.service_models import SERVICE_MODELS
from mbbatch.sweeps.spec import SPEC_PARAMS


@pytest.mark.parametrize("kind", registry.KINDS)
def test_every_policy_declares_itself_whole(kind):
    cls = registry.POLICIES[kind]
    assert issubclass(cls, Policy) and cls.kind == kind
    assert cls.planner in PLANNERS
    assert cls.reports and cls.reports <= set(TAGS) and "run" in cls.reports
    assert set(cls.settings) <= set(SPEC_PARAMS), set(cls.settings) - set(SPEC_PARAMS)
    assert cls.models and set(cls.models) <= set(SERVICE_MODELS)
    assert cls.from_spec.__func__ is not Policy.from_spec.__func__
    if cls.planner == "tokens":
        assert callable(getattr(cls, "event_config", None))


def test_the_kinds_are_the_registrys_everywhere():
    """The metric table's kinds, the command line's --policy choices and the
    spec's kinds are the registry's."""
    from mbbatch.cli import _parser
    from mbbatch.sweeps.spec import KINDS

    assert registry.KINDS == ("multibin", "static", "dynamic", "multibin_dynamic", "laps", "cluster", "spf")
    assert KINDS == registry.KINDS and mb.metrics.KINDS == registry.KINDS
    sim = next(a for a in _parser()._subparsers._group_actions[0].choices["simulate"]._actions
               if a.dest == "policy")
    assert tuple(sim.choices) == registry.KINDS


def test_a_metric_applies_to_the_kinds_that_report_its_tag():
    for name, m in METRICS.items():
        assert m.kinds == {k for k, cls in registry.POLICIES.items() if m.tag in cls.reports}, name
    for kind in registry.KINDS:
        assert set(applicable(kind)) == {n for n, m in METRICS.items() if kind in m.kinds}


def test_a_spec_key_applies_to_the_kinds_that_declare_it():
    """A policy's settings apply to it and to no kind that does not declare
    them; a key no policy declares (arrivals, workload, n) applies to every kind."""
    declared = {key for cls in registry.POLICIES.values() for key in cls.settings}
    for name, sp in SPEC_PARAMS.items():
        if name in declared:
            assert sp.kinds == {k for k, cls in registry.POLICIES.items() if name in cls.settings}, name
        elif not sp.capacity_only:
            assert sp.kinds == set(registry.KINDS), name


def test_the_parameter_tables_kind_choices_are_the_registrys():
    assert set(PARAMS["engine_policy"].choices) == set(registry.engine_kinds()) == {
        "multibin", "static", "dynamic", "multibin_dynamic", "spf"}
    assert PARAMS["engine_policy"].choices[0] == PARAMS["engine_policy"].default
    assert PARAMS["decode"].choices == ("none", "static", "dynamic", "multibin_dynamic")
    assert PARAMS["Cluster.router"].choices == tuple(registry.ROUTERS)


def test_kind_of_names_the_policies_for_anything_else():
    assert registry.kind_of(mb.StaticBatching(4)) is mb.StaticBatching
    assert registry.kind_of(mb.MultiBinDynamic(bins=2, warmup=10)) is mb.MultiBinDynamic
    with pytest.raises(TypeError, match="policy must be one of MultiBin, StaticBatching, .*; got str"):
        registry.kind_of("static")
    # (a cluster's MultiBin engine form is no policy of its own)
    with pytest.raises(TypeError, match="got MultiBinEngine"):
        registry.kind_of(mb.MultiBin(bins=2, batch_size=4).engine_form())


def test_build_makes_each_kind_from_a_cells_parameters():
    """A cell's policy is its kind's from_spec: nested kinds (a cluster's
    engines, LAPS's decode stage) through the registry too."""
    base = {"d_sla": 7.5e-3, "eps_d": 5e-5, "b_min": 1, "b_max": 64, "controller": "spec", "memory": "l0",
            "eta": 1000.0, "eps_m": 0.05}
    dyn = registry.build("dynamic", base)
    assert isinstance(dyn, mb.DynamicBatching) and dyn.memory.eta == 1000.0 and dyn.controller.b_max == 64
    cl = registry.build("cluster", {**base, "engine_policy": "static", "engine_batch_size": 6, "engine_bins": 4,
                                    "engines": 3, "router": "least_used", "route_threshold": 100,
                                    "kv_reuse": True, "programs": "none", "calls": 4, "think_time": 1.0,
                                    "closed_loop": False, "session_context": "included"})
    assert isinstance(cl.policy, mb.StaticBatching) and cl.policy.batch_size == 6 and cl.engines == 3
    with pytest.raises(ValueError, match='engine_policy = "multibin" needs engine_batch_size'):
        registry.build("cluster", {**base, "engine_policy": "multibin", "engine_batch_size": None,
                                   "engine_bins": 4, "engines": 3, "router": "least_used", "route_threshold": 100,
                                   "kv_reuse": True, "programs": "none", "calls": 4, "think_time": 1.0,
                                   "closed_loop": False, "session_context": "included"})


@pytest.mark.parametrize("name", sorted(registry.ARRIVALS))
def test_every_arrival_process_declares_its_spec_name_and_keys(name):
    cls = registry.ARRIVALS[name]
    assert cls.spec == name and set(cls.spec_keys) <= set(SPEC_PARAMS)
    for key in cls.spec_keys:
        assert name in SPEC_PARAMS[key].arrivals
