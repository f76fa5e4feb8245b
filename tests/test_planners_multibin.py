"""The planner of the multi-bin kernel (mbbatch.planners.multibin): the
paper's model checked, its edges as service times, and its kernel packed."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch.planners import multibin
from mbbatch.simulation import plan


def test_equal_mass_edges_of_lengths_are_service_times():
    """With workload= under MaxModel(base, per_token), the equal-mass edges
    of the output lengths are made service times, whole tokens first."""
    wl = mb.Workload(prompt=st.uniform(1, 9), output=st.uniform(10, 90))
    p = plan(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(1.0), workload=wl, n=100,
             service_model=mb.MaxModel(base=0.5, per_token=0.01))
    assert isinstance(p, multibin.Plan)
    np.testing.assert_allclose(p.edges, 0.5 + 0.01 * np.array([10.0, 55.0, 100.0]))


def test_given_edges_must_cover_the_support():
    with pytest.raises(ValueError, match=r"edges must cover the support of service \[1, 20\]"):
        plan(mb.MultiBin(bins=2, batch_size=4, edges=[2.0, 5.0, 30.0]), mb.Poisson(1.0),
             service=st.uniform(1, 19), n=100)


def test_the_predictor_draws_on_its_own_stream_only_when_it_draws():
    """Requests are the same whatever the predictor; the oracle and
    LogNormalError(0) give the same numbers bit for bit."""
    kw = dict(arrivals=mb.Poisson(0.3), service=st.uniform(1, 19), n=4000, seed=2)
    a = mb.simulate(mb.MultiBin(bins=3, batch_size=8), **kw)
    b = mb.simulate(mb.MultiBin(bins=3, batch_size=8, predictor=mb.LogNormalError(0.0)), **kw)
    assert a.metrics() == b.metrics()
