"""Multi-bin batching (mbbatch.policies.multibin): its settings, its edges
from a spec, its batches, and its form as a cluster's engines."""

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch._kernels.formation import FORM_MULTIBIN
from mbbatch.policies.multibin import MultiBinEngine, spec_edges


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


def test_a_specs_edges_rule():
    base = {"batch_size": 16, "bins": 3, "mu": 0.5, "l_min": None, "l_max": None}
    assert spec_edges({**base, "edges": "equal_mass"}) is None
    lemma = spec_edges({**base, "edges": "lemma_a1"})
    assert lemma.shape == (4,) and lemma[0] == 0.0 and np.isinf(lemma[-1])
    opt = spec_edges({**base, "edges": "optimal"})
    assert opt.shape == (4,) and np.all(np.diff(opt) > 0)


def test_its_engine_form_serves_full_batches_only():
    eng = mb.MultiBin(bins=2, batch_size=4, predictor=mb.BinConfusion(0.9)).engine_form()
    assert isinstance(eng, MultiBinEngine) and eng.title == "MultiBin"
    ev = eng.event_config()
    assert (ev.formation, ev.bins, ev.pin, ev.preset) == (FORM_MULTIBIN, 2, 4, "edges")
    assert ev.predictor == mb.BinConfusion(0.9) and not ev.controlled
    with pytest.raises(ValueError, match="release full batches only: max_wait must be inf"):
        mb.MultiBin(bins=2, batch_size=4, max_wait=3.0).engine_form()
    assert math.isinf(mb.MultiBin(bins=2, batch_size=4).max_wait)


WL = mb.Workload(prompt=st.lognorm(0.8, scale=300), output=st.expon(scale=100))


@pytest.mark.parametrize("experts, attention", [(0, 0.0), (8, 0.0), (0, 3e-8)])
@pytest.mark.parametrize("finished", ["leave", "stay"])
@pytest.mark.parametrize("max_wait", [math.inf, 20.0])
def test_under_an_iteration_model_a_batch_takes_the_models_time(finished, max_wait, experts, attention):
    """With infinitely many servers a batch starts when it is ready (its
    last member's arrival, or its bin's deadline) and completes after the
    model's time for its members: IterationModel.batch_times on their prompt
    and output lengths (the event kernel's requests of the same seed: one
    seed, the same requests), to rounding; each request's record is its time
    alone (dense, a mixture of experts, and the prefill's attention)."""
    model = mb.IterationModel(setup=0.01, step=8e-3, prefill_per_token=2e-5, per_sequence=1e-4,
                              per_context_token=6e-8, finished=finished, per_expert=1e-3 if experts else 0.0,
                              experts=experts, prefill_attention=attention)
    kw = dict(arrivals=mb.Poisson(3.0), workload=WL, n=3000, seed=4, keep_requests=True)
    same = mb.simulate(mb.StaticBatching(1), service_model=model, **kw).requests
    r = mb.simulate(mb.MultiBin(bins=3, batch_size=6, max_wait=max_wait), service_model=model, servers=math.inf,
                    **kw).requests
    assert (r.arrival == same.arrival).all()
    np.testing.assert_allclose(r.service, model.service_time(size=1, prompt=same.prompt, output=same.output),
                               rtol=1e-12)
    served = r.batch >= 0
    order = np.argsort(r.batch[served], kind="stable")
    batch = r.batch[served][order]
    starts = np.flatnonzero(np.r_[True, batch[1:] != batch[:-1]])
    sizes = np.diff(np.r_[starts, batch.size])
    want = model.batch_times(same.prompt[served][order], same.output[served][order], sizes).service
    done = r.completion[served][order][starts]
    ready = np.maximum.reduceat(r.arrival[served][order], starts)
    if max_wait == math.inf:
        assert (sizes == 6).all()
    else:
        assert (sizes < 6).any()
        # a partial batch leaves at its oldest member's deadline
        ready = np.where(sizes < 6, np.minimum.reduceat(r.arrival[served][order], starts) + max_wait, ready)
    np.testing.assert_allclose(done - ready, want, rtol=1e-9)


def test_under_an_iteration_model_it_bins_by_output_length():
    """Edges in tokens: a request's bin is set by its output length (an
    oracle), and equal-mass edges split the lengths evenly."""
    r = mb.simulate(mb.MultiBin(bins=2, batch_size=4, edges=[0.0, 50.0, np.inf]), arrivals=mb.Poisson(3.0),
                    workload=WL, service_model=mb.profiles.get(mb.profiles.DEFAULT), n=2000, seed=1,
                    keep_requests=True).requests
    same = mb.simulate(mb.StaticBatching(1), arrivals=mb.Poisson(3.0), workload=WL,
                       service_model=mb.profiles.get(mb.profiles.DEFAULT), n=2000, seed=1,
                       keep_requests=True).requests
    assert (r.bin == (same.output >= 50.0)).all()


def test_multibin_refuses_other_token_models():
    with pytest.raises(TypeError, match="MultiBin takes service_model=MaxModel.* or an IterationModel"):
        mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(1.0), workload=WL, service_model=mb.DecodeModel(),
                    n=100)
