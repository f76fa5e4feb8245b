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
    # (a resumable engine is a stage of the composites: a cluster's engines, LAPS's decode stage)
    if cls.resumable:
        assert cls.engine and cls.decode_stage


def test_adding_a_kind_is_a_conscious_act():
    """The one test that lists the kinds literally, and which of them run as
    a cluster's engines and as LAPS's decode stage, which are resumable
    stages and which run request classes: a tripwire, so that adding a kind
    (or an engine, decode-stage, resumable, classes or prefixes role) is a deliberate
    change here too.  Every other test reads the kinds from the registry."""
    assert registry.KINDS == ("multibin", "static", "dynamic", "multibin_dynamic", "laps", "cluster", "spf",
                              "continuous", "disaggregated")
    assert registry.engine_kinds() == ("multibin", "static", "dynamic", "multibin_dynamic", "spf", "continuous")
    assert registry.decode_kinds() == ("static", "dynamic", "multibin_dynamic", "continuous")
    assert [k for k, cls in registry.POLICIES.items() if cls.resumable] == ["continuous"]
    assert [k for k, cls in registry.POLICIES.items() if cls.classes] == ["continuous"]
    assert [k for k, cls in registry.POLICIES.items() if cls.prefixes] == ["continuous", "disaggregated"]


def test_the_kinds_are_the_registrys_everywhere():
    """The metric table's kinds, the command line's --policy choices and the
    spec's kinds are the registry's."""
    from mbbatch.cli import _parser
    from mbbatch.sweeps.spec import KINDS

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
        k for k, cls in registry.POLICIES.items() if cls.engine}
    assert PARAMS["engine_policy"].choices[0] == PARAMS["engine_policy"].default
    assert PARAMS["decode"].choices == ("none", *(k for k, cls in registry.POLICIES.items() if cls.decode_stage))
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
                                    "kv_reuse": True, "cache_threshold": 0.3, "balance_abs": 64, "balance_rel": 1.5,
                                    "programs": "none", "calls": 4, "think_time": 1.0,
                                    "closed_loop": False, "session_context": "included"})
    assert isinstance(cl.policy, mb.StaticBatching) and cl.policy.batch_size == 6 and cl.engines == 3
    # (a cell's engine_batch_size is never None: the table's default; given None, the engine's check names it)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        registry.build("cluster", {**base, "engine_policy": "multibin", "engine_batch_size": None,
                                   "engine_bins": 4, "engines": 3, "router": "least_used", "route_threshold": 100,
                                   "kv_reuse": True, "cache_threshold": 0.3, "balance_abs": 64, "balance_rel": 1.5,
                                    "programs": "none", "calls": 4, "think_time": 1.0,
                                   "closed_loop": False, "session_context": "included"})


@pytest.mark.parametrize("name", sorted(registry.ARRIVALS))
def test_every_arrival_process_declares_its_spec_name_and_keys(name):
    cls = registry.ARRIVALS[name]
    assert cls.spec == name and set(cls.spec_keys) <= set(SPEC_PARAMS)
    for key in cls.spec_keys:
        assert name in SPEC_PARAMS[key].arrivals


# --- every registered token-level policy, its settings drawn from the parameter table --------

import numpy as np  # noqa: E402
import scipy.stats as st  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

from .strategies import valid  # noqa: E402

#: bounds that keep a drawn run small (a setting not here takes its default)
SMALL = {"batch_size": (1, 16), "b_min": (1, 4), "b_max": (4, 64), "bins": (1, 4), "warmup": (4, 200),
         "max_wait": (0.0, 50.0), "d_sla": (1e-3, 0.05), "eps_d": (0.0, 1e-3), "eta": (2000.0, 1e6),
         "eps_m": (0.01, 0.2), "predictor_sigma": (0.0, 1.0), "predictor_p": (0.5, 1.0), "servers": (1, 3)}
#: the kinds the event kernel runs on one engine
TOKEN_KINDS = [k for k, cls in registry.POLICIES.items() if cls.planner == "tokens"]


@settings(deadline=None)
@given(data=hs.data(), kind=hs.sampled_from(TOKEN_KINDS))
def test_every_token_policy_from_drawn_settings_serves_each_request_once(data, kind):
    """Any registered token-level policy (a new one included), its settings
    drawn from the parameter table's domains and built as a sweep's cell
    builds it: every request is served once or rejected, batches hold at
    most b_max, members of a batch start and complete together, and no more
    batches run at once than there are servers."""
    cls = registry.POLICIES[kind]
    params = {name: (data.draw(valid(SPEC_PARAMS[name].key or name, *SMALL[name]), label=name) if name in SMALL
                     else SPEC_PARAMS[name].default) for name in cls.settings}
    if "b_min" in params and "b_max" in params:
        params["b_min"] = min(params["b_min"], params["b_max"])
    if "warmup" in params:
        params["warmup"] = max(params["warmup"], params.get("bins", 1))
    if params.get("predictor_sigma", 0.0) > 0:
        params["predictor_p"] = 1.0
    policy = registry.build(kind, params)
    assert type(policy) is cls
    n, servers = 400, params["servers"]
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=100), output=st.lognorm(0.8, scale=40))
    res = mb.simulate(policy, mb.Poisson(data.draw(hs.floats(1.0, 200.0), label="rate")), workload=wl, n=n,
                      servers=servers, seed=data.draw(hs.integers(0, 2**32 - 1), label="seed"), keep_requests=True,
                      keep_batches=True)
    r, b = res.requests, res.batches
    served = ~np.isnan(r.completion)
    assert res.completed == served.sum() and res.completed + res.rejected == n
    b_max = policy.event_config().b_max
    assert b.size.max() <= b_max and b.size.sum() == res.completed
    for j in np.unique(r.batch[served]):
        members = r.batch == j
        assert np.unique(r.start[members]).size == 1 and np.unique(r.completion[members]).size == 1
    starts, ends = b.start, b.start + b.service
    events = np.concatenate([np.stack([starts, np.ones_like(starts)]), np.stack([ends, -np.ones_like(ends)])], axis=1)
    order = np.lexsort((events[1], events[0]))                 # (an end before a start at one instant)
    assert np.cumsum(events[1][order]).max() <= servers
