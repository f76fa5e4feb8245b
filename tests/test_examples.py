"""The worked examples stored for the figures (mbbatch.examples)."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch import examples

# the engine-event runs are short transients by design (an engine leaves mid-run): their backlog
# check warns, which is not what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore::mbbatch.UnstableWarning")

# --- the paper's Figure 1b ----------------------------------------------------

def test_figure_1b_dataset_holds_the_papers_makespans_and_bins():
    ds = examples.figure_1b()
    assert dict(ds.sizes) == {"case": 2, "request": 4}
    assert ds["case"].values.tolist() == ["one_bin", "two_bins"]
    np.testing.assert_array_equal(ds["service"].values, [1.0, 5.0, 2.0, 6.0])
    # one bin: batches (1, 5) and (2, 6), 5 + 6 = 11 s; bins [1, 3) and [3, 6]: (1, 2) and (5, 6), 2 + 6 = 8 s
    assert ds.attrs["makespan_one_bin"] == 11.0 and ds.attrs["makespan_two_bins"] == 8.0
    assert ds.attrs["edges_two_bins"] == [1.0, 3.0, 6.0]
    assert ds["bin"].sel(case="one_bin").values.tolist() == [0, 0, 0, 0]
    assert ds["bin"].sel(case="two_bins").values.tolist() == [0, 1, 0, 1]
    for case in ds["case"].values:
        assert float(ds["completion"].sel(case=case).max()) == ds.attrs[f"makespan_{case}"]
    assert {v: ds[v].attrs["units"] for v in ("start", "completion", "service", "bin")} == \
        {"start": "s", "completion": "s", "service": "s", "bin": "1"}


def test_figure_1b_batches_run_back_to_back_each_as_long_as_its_longest_member():
    ds = examples.figure_1b()
    service = ds["service"].values
    for case in ds["case"].values:
        c = ds.sel(case=case)
        batch, start, done = c["batch"].values, c["start"].values, c["completion"].values
        ends = 0.0
        for b in np.unique(batch):
            members = batch == b
            assert np.ptp(start[members]) == 0 and np.ptp(done[members]) == 0
            assert done[members][0] - start[members][0] == service[members].max()
            # every request is there at time 0 and there is one server: no idle time
            assert start[members][0] == ends
            ends = done[members][0]


# --- the engine-event example ---------------------------------------------------

#: the example on fewer requests and seeds (the same settings otherwise)
SMALL = {"n": 480, "seeds": 2, "remove": 10.0, "back": 20.0, "bin": 5.0}


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(examples, "ENGINE_EVENT", {**examples.ENGINE_EVENT, **SMALL})
    return examples.ENGINE_EVENT


def test_engine_event_windows_are_the_calls_arriving_in_them(small):
    ds = examples.engine_event()
    p = small
    assert ds["router"].values.tolist() == ["autellix", "least_used", "round_robin"]
    edges = np.arange(0.0, p["n"] / p["rate"] + p["bin"], p["bin"])
    np.testing.assert_allclose(ds["time"].values, 0.5 * (edges[:-1] + edges[1:]))
    assert {k: ds.attrs[k] for k in SMALL} == SMALL
    # round-robin's windows, from the runs themselves: each window's mean latency (np.histogram's sums)
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=300.0), output=st.lognorm(0.8, scale=64.0))
    engine = mb.DynamicBatching(controller=mb.SLAController(d_sla=p["d_sla"], b_max=p["b_max"]))
    cluster = mb.Cluster(engine, engines=p["engines"], router="round_robin", threshold=p["threshold"],
                         programs=mb.Programs(calls=p["calls"], think_time=p["think_time"]),
                         events=[mb.EngineEvent(p["remove"], 0, "remove"), mb.EngineEvent(p["back"], 0, "add")])
    runs = [mb.simulate(cluster, mb.Poisson(p["rate"]), workload=wl, n=p["n"], seed=s, keep_requests=True,
                        service_model=mb.DecodeModel(prefill_per_token=p["prefill_per_token"]))
            for s in range(p["seeds"])]
    arrival = np.concatenate([r.requests.arrival for r in runs])
    latency = np.concatenate([r.requests.latency for r in runs])
    total, _ = np.histogram(arrival, edges, weights=latency)
    count, _ = np.histogram(arrival, edges)
    with np.errstate(invalid="ignore"):
        want = total / count
    np.testing.assert_allclose(ds["mean_latency"].sel(router="round_robin").values, want, rtol=1e-12)
    assert ds["rerouted"].sel(router="round_robin") == np.mean([r.rerouted for r in runs])
    assert np.isfinite(ds["ttft_p99"].values[:, count > 0]).all()


def test_engine_event_is_the_same_every_call(small):
    a, b = examples.engine_event(), examples.engine_event()
    assert a.identical(b)


def test_engine_event_reroutes_nothing_when_the_engine_leaves_after_the_run(small, monkeypatch):
    monkeypatch.setattr(examples, "ENGINE_EVENT", {**small, "remove": 1e6, "back": 2e6})
    ds = examples.engine_event()
    assert (ds["rerouted"].values == 0).all()
