"""Static batching (mbbatch.policies.static)."""

import scipy.stats as st

import mbbatch as mb
from mbbatch._kernels.formation import FORM_STATIC

WL = mb.Workload(prompt=st.uniform(10, 100), output=st.uniform(5, 50))


def test_static_batching_never_exceeds_its_batch_size():
    res = mb.simulate(mb.StaticBatching(6), arrivals=mb.Poisson(5.0), workload=WL, n=3000, seed=1,
                      keep_batches=True)
    assert res.batches.size.max() <= 6 and res.batch_size_hist[7:].sum() == 0


def test_it_runs_as_its_formation_rule_says():
    ev = mb.StaticBatching(6).event_config()
    assert (ev.formation, ev.bins, ev.b_max, ev.pin, ev.max_candidates, ev.memory_on) == (FORM_STATIC, 1, 6, 6, 6,
                                                                                          False)


def test_a_cells_static_batching():
    pol = mb.StaticBatching.from_spec({"batch_size": 4, "d_sla": 0.01, "eps_d": 1e-4, "eta": 500.0}, None)
    assert pol.batch_size == 4 and pol.sla.d_sla == 0.01 and pol.memory.eta == 500.0 and not pol.memory.enabled
    assert mb.StaticBatching.from_spec({"batch_size": 4, "d_sla": 0.01, "eps_d": 1e-4, "eta": None},
                                       None).memory.eta == mb.Memory().eta
