"""The planners (mbbatch.planners): one per kernel family behind one
protocol, chosen by the planner each policy declares."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch import registry
from mbbatch.planners import PLANNERS
from mbbatch.simulation import check_simulation, plan

WL = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))
CALLS = {
    "multibin": (mb.MultiBin(bins=2, batch_size=4), {"service": st.uniform(1, 19)}),
    "static": (mb.StaticBatching(8), {"workload": WL}),
    "dynamic": (mb.DynamicBatching(), {"workload": WL}),
    "multibin_dynamic": (mb.MultiBinDynamic(bins=2, warmup=100), {"workload": WL}),
    "laps": (mb.LAPS(instances=2), {"workload": WL}),
    "cluster": (mb.Cluster(engines=2), {"workload": WL}),
    "spf": (mb.ShortestPredictedFirst(8), {"workload": WL}),
    "continuous": (mb.ContinuousBatching(max_num_seqs=16, kv_tokens=4096), {"workload": WL}),
    "disaggregated": (mb.Disaggregated(decode=mb.ContinuousBatching(max_num_seqs=16, kv_tokens=4096),
                                       decode_engines=2), {"workload": WL}),
}


def test_every_kind_has_a_call_here():
    assert set(CALLS) == set(registry.KINDS)


@pytest.mark.parametrize("kind", registry.KINDS)
def test_each_policy_runs_on_the_planner_it_declares(kind):
    """``plan`` returns the declared planner's plan: its memory is what
    ``check_simulation`` reports, its kernel arguments are packed once, and
    its run for a seed is ``simulate``'s for that seed."""
    pol, side = CALLS[kind]
    p = plan(pol, mb.Poisson(0.2 if kind == "multibin" else 2.0), n=1000, **side)
    module = PLANNERS[registry.kind_of(pol).planner]
    assert isinstance(p, module.Plan)
    assert p.memory == check_simulation(pol, mb.Poisson(0.2 if kind == "multibin" else 2.0), n=1000, **side) > 0
    assert p.kernel_args is p.kernel_args
    ss = np.random.SeedSequence(3)
    a = p.run(ss, warn=False)
    b = mb.simulate(pol, mb.Poisson(0.2 if kind == "multibin" else 2.0), n=1000, seed=ss, **side)
    assert a.kind == kind and a.to_dataset(arrays=True).drop_attrs().equals(b.to_dataset(arrays=True).drop_attrs())


def test_a_planner_module_implements_the_protocol():
    for name, module in PLANNERS.items():
        assert callable(module.check) and hasattr(module, "Plan"), name
        assert callable(module.Plan.run)
