"""The planner of the event kernel (mbbatch.planners.tokens): a token-level
policy's plan from the rule it declares (``event_config``), its memory, and
its run's backlog guarded against the memory available at each doubling."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch._kernels import formation
from mbbatch.planners import tokens
from mbbatch.simulation import plan

WL = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))


@pytest.mark.parametrize("policy, form, bins", [
    (mb.StaticBatching(8), formation.FORM_STATIC, 1),
    (mb.DynamicBatching(), formation.FORM_DYNAMIC, 1),
    (mb.MultiBinDynamic(bins=3, warmup=50), formation.FORM_MULTIBIN_DYNAMIC, 3),
])
def test_a_plan_packs_the_rule_its_policy_declares(policy, form, bins):
    p = plan(policy, mb.Poisson(1.0), workload=WL, n=1000)
    assert isinstance(p, tokens.Plan) and p.kind == policy.kind and p.event == policy.event_config()
    config, _ = p.kernel_args
    assert config.policy[0][0] == form and config.policy[0][1] == bins
    assert p.kernel_args is p.kernel_args            # (packed once: every run of the plan shares them)


def test_a_plans_runs_are_simulates_runs():
    p = plan(mb.DynamicBatching(), mb.Poisson(2.0), workload=WL, n=2000)
    ss = np.random.SeedSequence(5)
    a, b = p.run(ss), mb.simulate(mb.DynamicBatching(), mb.Poisson(2.0), workload=WL, n=2000, seed=ss)
    assert a.metrics() == b.metrics() or all(x == y or (x != x and y != y) for x, y in
                                             zip(a.metrics().values(), b.metrics().values()))


def test_presampled_and_optimal_edges_are_set_before_the_run():
    """bin_edges = "presample" or "optimal": no warm-up, the bins from the
    first request (Algorithm 6 on a pre-sample, or eq. (2)'s optimum)."""
    for rule in ("presample", "optimal"):
        res = mb.simulate(mb.MultiBinDynamic(bins=3, bin_edges=rule), mb.Poisson(2.0), workload=WL, n=2000, seed=1)
        assert res.warmup_time == 0.0 and np.all(np.diff(res.edges) > 0)


def test_a_backlog_that_outgrows_the_memory_stops_the_run_naming_n(monkeypatch):
    """An overloaded open-arrival run queues a backlog that grows with n,
    which no check before the run can size: when its queues would outgrow
    the memory available, the run stops with a MemoryError naming n (it
    was the operating system's out-of-memory kill: 24 GB at n = 2**31).
    A run whose queues fit is unchanged."""
    import mbbatch.planners.tokens as sim

    wl = mb.Workload(prompt=st.lognorm(0.9, scale=250), output=st.lognorm(0.5, scale=40))
    kw = dict(arrivals=mb.Poisson(50.0), workload=wl, n=200_000, seed=3)
    full = mb.simulate(mb.StaticBatching(batch_size=2), **kw)
    assert full.throughput < 10.0                       # overloaded: the backlog grows with n
    monkeypatch.setattr(sim, "available_memory", lambda: 8 << 20)
    with pytest.raises(MemoryError, match=r"^n: this run's backlog outgrew the memory: [\d,]+ requests were "
                                          r"waiting .* more than the 8.0 MiB available"):
        mb.simulate(mb.StaticBatching(batch_size=2), **kw)
    small = mb.simulate(mb.StaticBatching(batch_size=2), **{**kw, "n": 2000})
    monkeypatch.undo()
    assert small.to_dataset(arrays=True).equals(mb.simulate(mb.StaticBatching(batch_size=2), **{**kw, "n": 2000}).to_dataset(arrays=True))


def test_the_memory_guard_asks_at_each_doubling(monkeypatch):
    """The guard reads the memory available when the queues double, not once
    before the run: memory another process (another worker of a sweep) takes
    while the run goes on counts.  Here the first doublings see 1 TiB and the
    later ones 4 MiB: the run stops (read once, at the start, the 1 TiB let
    it run on to its end, as it would have run on to the out-of-memory kill)."""
    import mbbatch.planners.tokens as sim

    asked = []

    def available():
        asked.append(1)
        return 1 << 40 if len(asked) <= 3 else 4 << 20

    monkeypatch.setattr(sim, "available_memory", available)
    wl = mb.Workload(prompt=st.lognorm(0.9, scale=250), output=st.lognorm(0.5, scale=40))
    with pytest.raises(MemoryError, match=r"^n: this run's backlog outgrew .* more than the 4.0 MiB available"):
        mb.simulate(mb.StaticBatching(batch_size=2), arrivals=mb.Poisson(50.0), workload=wl, n=200_000, seed=3)
    assert len(asked) > 3                     # stopped at a doubling after the memory was taken
