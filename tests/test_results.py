"""The one result type (mbbatch.results): the same metric names for every
policy, absent where a metric does not apply, records as Tables, the time
series as a Dataset, and to_dataset named as the sweep stores are."""

import pickle

import numpy as np
import pytest
import scipy.stats as st
import xarray as xr

import mbbatch as mb
from mbbatch.metrics import KINDS, METRICS, applicable
from mbbatch.registry import POLICIES as REGISTERED

U = st.uniform(1, 19)
WL = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))
POLICIES = {
    "multibin": (mb.MultiBin(bins=2, batch_size=4), {"service": U}),
    "static": (mb.StaticBatching(8), {"workload": WL}),
    "dynamic": (mb.DynamicBatching(), {"workload": WL}),
    "multibin_dynamic": (mb.MultiBinDynamic(bins=2, warmup=100), {"workload": WL}),
    "laps": (mb.LAPS(instances=1), {"workload": WL}),
    "cluster": (mb.Cluster(engines=2, programs=mb.Programs(calls=2)), {"workload": WL}),
    "spf": (mb.ShortestPredictedFirst(8), {"workload": WL}),
    "continuous": (mb.ContinuousBatching(max_num_seqs=16, admission="multibin", bins=2), {"workload": WL}),
    "disaggregated": (mb.Disaggregated(decode_engines=2), {"workload": WL}),
}
#: the policies whose results keep batch records (keep_batches)
BATCHED = ("static", "dynamic", "multibin_dynamic", "cluster", "spf")


def _run(kind, **kw):
    pol, side = POLICIES[kind]
    return mb.simulate(pol, arrivals=mb.Poisson(0.2 if kind == "multibin" else 2.0), n=2000, seed=1,
                       **side, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_every_policy_gives_the_one_result_type_with_its_metrics(kind):
    res = _run(kind)
    assert type(res) is mb.SimulationResult and res.kind == kind
    assert list(res.metrics()) == [m for m in applicable(kind) if m != "unstable"]
    for name in METRICS:
        if kind in METRICS[name].kinds:
            assert getattr(res, name) is not None
        else:
            with pytest.raises(AttributeError, match=f"{name} does not apply to {kind}"):
                getattr(res, name)
    if "batch_means" in REGISTERED[kind].reports:          # (the run's batch-means interval: not yet for LAPS)
        assert res.mean_latency_ci == (res.mean_latency_ci_low, res.mean_latency_ci_high)
        assert res.mean_latency_ci[0] <= res.mean_latency <= res.mean_latency_ci[1]
    assert res.edges.ndim == 1 and np.all(np.diff(res.edges) >= 0)
    assert res.edges.size == (2 if kind in ("dynamic", "static", "cluster", "spf", "disaggregated") else 3)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        res.nonsense


@pytest.mark.parametrize("kind", KINDS)
def test_to_dataset_names_metrics_as_the_store(kind):
    res = _run(kind)
    ds = res.to_dataset(arrays=True)
    for name, m in applicable(kind).items():
        assert m.var in ds, name
        assert ds[m.var].attrs["units"] == m.units
        if name != "unstable":
            assert ds[m.var].item() == pytest.approx(getattr(res, name), nan_ok=True)
    absent = {m.var for name, m in METRICS.items() if kind not in m.kinds}
    assert not absent & set(ds.data_vars)
    assert ds.attrs["kind"] == kind and ds.attrs["confidence_level"] == 0.95
    assert ds["bin_edges"].size == res.edges.size


def test_utilization_is_one_name():
    """Both kernels' busy share is res.utilization, stored as sim_utilization."""
    for kind in KINDS:
        res = _run(kind)
        assert 0 < res.utilization <= 1 + 1e-12
        # (one server; a cluster's two engines have one each, a disaggregated deployment's three engines too)
        assert res.mean_busy_servers == pytest.approx(res.utilization * {"cluster": 2, "disaggregated": 3}.get(kind, 1))
        assert "sim_utilization" in res.to_dataset()


@pytest.mark.parametrize("kind", KINDS)
def test_requests_and_batches_are_tables(kind):
    res = _run(kind, keep_requests=True, **({"keep_batches": True} if kind in BATCHED else {}))
    r = res.requests
    assert isinstance(r, mb.Table) and len(r) == 2000
    assert r.arrival is r["arrival"] and "latency" in r.columns
    np.testing.assert_array_equal(r.latency, r.completion - r.arrival)
    df = r.to_pandas()
    assert list(df.columns) == list(r.columns) and len(df) == 2000
    with pytest.raises(AttributeError, match="no column 'nope'"):
        r.nope
    with pytest.raises(KeyError):
        r["nope"]
    with pytest.raises(AttributeError, match="read-only"):
        r.arrival = 0
    assert pickle.loads(pickle.dumps(r)).columns == r.columns
    if kind in BATCHED:
        assert isinstance(res.batches, mb.Table) and len(res.batches) == res.n_batches
    else:
        # (a continuous engine keeps no batches; its time series samples its iterations)
        assert res.batches is None and (res.time_series is None) == (kind != "continuous")


@pytest.mark.parametrize("kind", ["static", "dynamic", "multibin_dynamic"])
def test_time_series_is_a_dataset(kind):
    res = _run(kind)
    ts = res.time_series
    assert isinstance(ts, xr.Dataset)
    assert set(ts.data_vars) == {"b_target", "b_low", "b_high", "tau_avg", "batch_bin", "batch_size", "queue"}
    assert ts["queue"].dims == ("time", "bin") and ts.sizes["bin"] == res.edges.size - 1
    assert np.all(np.diff(ts["time"].values) >= 0)
    assert ts["tau_avg"].attrs["units"] == "s/token"
    ds = res.to_dataset(arrays=True)
    np.testing.assert_array_equal(ds["ts_tau_avg"].values, ts["tau_avg"].values)


def test_mean_batch_size_of_multibin_is_b_without_max_wait():
    res = _run("multibin")
    assert res.mean_batch_size == 4.0 and res.completed == 4 * res.n_batches


def test_a_run_gives_its_own_interval_where_a_method_exists_and_says_where_none_does():
    """Batch means for the mean latency, at any level; every other metric asks for replications."""
    from mbbatch import stats

    res = mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(0.3), st.uniform(1, 19), n=20_000, seed=3)
    assert res.interval("mean_latency") == res.mean_latency_ci
    lo, hi = res.interval("mean_latency", 0.5)
    assert res.mean_latency_ci[0] < lo < res.mean_latency < hi < res.mean_latency_ci[1]
    assert (lo, hi) == stats.batch_means_ci(res.group_mean_latency, res.mean_latency, 0.5)
    for name in ("throughput", "latency_p99"):
        with pytest.raises(ValueError, match=f"no within-run interval for {name}: replicate the run"):
            res.interval(name)
    with pytest.raises(ValueError, match="mean_ttft does not apply to multibin"):
        res.interval("mean_ttft")
    with pytest.raises(ValueError, match="'speed' is not a metric"):
        res.interval("speed")
    for bad in (0, 1, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match=r"confidence must be a number in \(0, 1\)"):
            res.interval("mean_latency", bad)


def test_renamed_metrics_answer_to_their_old_names_with_a_warning():
    from mbbatch.metrics import RENAMED

    res = mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(0.3), st.uniform(1, 19), n=2_000, seed=3)
    with pytest.warns(DeprecationWarning, match="batch_size_mean is now mean_batch_size"):
        assert res.batch_size_mean == res.mean_batch_size
    assert all(new in mb.metrics.METRICS and old not in mb.metrics.METRICS for old, new in RENAMED.items())


def test_summary_and_notebook_display():
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8), mb.Poisson(0.3), st.uniform(1, 19), n=20_000, seed=1)
    lo, hi = res.mean_latency_ci
    line = res.summary()
    assert line.startswith("multibin: 20,000 requests, throughput ") and f"[{lo:.4g}, {hi:.4g}]" in line
    html = res._repr_html_()
    assert html.count("<tr>") == len(res.metrics()) + 1 and "<code>latency_p99</code>" in html
    with pytest.warns(mb.results.UnstableWarning):
        hot = mb.simulate(mb.MultiBin(bins=2, batch_size=8), mb.Poisson(2.0), st.uniform(1, 19), n=20_000, seed=1)
    assert "no steady state: the backlog grows" in hot.summary()


def test_to_dataframe_is_one_row_a_metric():
    """res.to_dataset(arrays=True).to_dataframe() is the product of the run's arrays' dimensions
    (hundreds of rows); res.to_dataset().to_dataframe() is one row, a column a metric; and
    res.to_dataframe() is the metrics, one row each, with their units."""
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8), mb.Poisson(0.3), st.uniform(1, 19), n=4_000, seed=1)
    df = res.to_dataframe()
    assert list(df.index) == [*res.metrics(), "unstable"]
    assert df.loc["throughput", "value"] == res.throughput and df.loc["throughput", "units"] == "requests/s"
    assert len(res.to_dataset(arrays=True).to_dataframe()) > len(df)
    wide = res.to_dataset().to_dataframe()
    assert len(wide) == 1 and wide["sim_throughput"].iloc[0] == res.throughput
    assert set(wide.columns) == {m.var for m in applicable(res.kind).values()}
