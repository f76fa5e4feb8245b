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
