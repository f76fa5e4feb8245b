"""A single run says when it has no steady state (res.unstable, a reason and
an UnstableWarning), by the same check the sweeps use."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch.results import UnstableWarning, backlog_growing, queue_growing

from .conftest import SHARED_DATA

U = st.uniform(1, 19)
WL = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))


def test_overloaded_multibin_run_is_unstable_with_a_reason():
    # B = 4, U(1, 20): one server serves 4 / E[max of 4] = 0.24 requests/s < 1
    with pytest.warns(UnstableWarning, match="backlog grows"):
        res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Poisson(1.0), service=U, n=20000, seed=1)
    assert res.unstable and "central FIFO" in res.unstable_reason
    ds = res.to_dataset()
    assert ds.attrs["unstable"] == 1 and "backlog grows" in ds.attrs["unstable_reason"]


def test_stable_run_is_not_unstable(recwarn):
    res = mb.simulate(mb.MultiBin(bins=4, batch_size=32), arrivals=mb.Poisson(2.0), service=U, n=50000, seed=1)
    assert not res.unstable and res.unstable_reason == "no growing backlog"
    assert not [w for w in recwarn if issubclass(w.category, UnstableWarning)]


def test_saturated_runs_are_not_assessed():
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Saturated(), service=U, n=2000, seed=1)
    assert not res.unstable and "not assessed" in res.unstable_reason
    res = mb.simulate(mb.StaticBatching(8), arrivals=mb.Saturated(), workload=WL, n=2000, seed=1)
    assert not res.unstable and "not assessed" in res.unstable_reason


def test_overloaded_token_run_is_unstable():
    with pytest.warns(UnstableWarning, match="requests waited"):
        res = mb.simulate(mb.StaticBatching(2), arrivals=mb.Poisson(50.0), workload=WL, n=20000, seed=2)
    assert res.unstable and res.to_dataset().attrs["unstable"] == 1
    res = mb.simulate(mb.StaticBatching(32), arrivals=mb.Poisson(2.0), workload=WL, n=20000, seed=2)
    assert not res.unstable


def test_one_bin_b4_on_a_replayed_trace_warns():
    """One bin, B = 4, one server on a trace returned a mean latency of
    hundreds of seconds with no warning: the trace's arrival rate is above
    what the server can serve, and the backlog grows through the replay."""
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(1 / 5.5, 20000))       # 5.5 requests/s, like the Azure trace
    service = 1.0 + rng.integers(1, 500, 20000) / 100.0
    with pytest.warns(UnstableWarning):
        res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Replay(times), service=service)
    assert res.unstable


@pytest.mark.skipif(not (SHARED_DATA / "AzureLLMInferenceTrace_conv.csv").is_file(),
                    reason="the Azure LLM inference trace is not beside the checkout "
                    "(shared/data/AzureLLMInferenceTrace_conv.csv); see README, Real traces")
def test_one_bin_b4_on_the_azure_trace_warns():
    tr = mb.traces.load_azure_trace(SHARED_DATA / "AzureLLMInferenceTrace_conv.csv")
    with pytest.warns(UnstableWarning):
        res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Replay(tr.arrival),
                          service=1.0 + tr.output_tokens / 100.0)
    assert res.unstable
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=8), arrivals=mb.Replay(tr.arrival),
                      service=1.0 + tr.output_tokens / 100.0, servers=4)
    assert not res.unstable


def test_the_sweeps_and_single_runs_share_the_check():
    """The sweep's backlog_growing and a single run's flag are one function."""
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Poisson(1.0), service=U, n=20000, seed=1)
    assert res.unstable == backlog_growing(res.group_mean_batch_wait, res.mean_batch_service)
    t = np.linspace(0, 100, 400)
    level = np.full((400, 1), 5.0)
    assert queue_growing(t, level, 4.0, 0.0, 100.0) == (False, "no growing backlog")
    growing = np.linspace(0, 1000, 400)[:, None]
    assert queue_growing(t, growing, 4.0, 0.0, 100.0)[0]
    # the window is that of the arrivals: [start, end]
    assert not queue_growing(t + 1000, growing, 4.0, 0.0, 100.0)[0]
