"""The multi-engine figures (mbbatch.figures.cluster)."""

import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import to_hex

from mbbatch.figures import cluster
from mbbatch.figures.analysis import replication_ci

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS


def test_laps_modes_draws_each_mode_per_mix_and_category(results):  # noqa: F811
    ds = xr.open_zarr(results / "laps.zarr", chunks=None).load()
    fig = cluster.laps_modes({"laps": ds})
    axes = fig.axes
    assert len(axes) == 2 * ds.sizes["prompt_median"]
    ax = axes[0]                                  # short requests, the first mix
    joined = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len(joined) == ds.sizes["policy"]
    first = ds["sim_ttft_short_p99"].sel(policy=ds["policy"].values[0], prompt_median=ds["prompt_median"].values[0])
    want, _ = replication_ci(first.transpose("rate", "rep").values)
    np.testing.assert_allclose(joined[0].get_ydata(), want)
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "one FIFO queue" in labels and "dual queue + window + dynamic allocation" in labels
    assert "% short" in ax.get_title()


def test_laps_allocation_draws_each_variants_groups_over_time_per_mix(results):  # noqa: F811
    ds = xr.open_zarr(results / "laps_step.zarr", chunks=None).load()
    fig = cluster.laps_allocation({"laps_step": ds})
    axes = fig.axes
    assert len(axes) == ds.sizes["policy"] * ds.sizes["prompt_median"]
    ax = axes[0]                                  # the first variant, the first mix
    (mean,) = [ln for ln in ax.lines if ln.get_drawstyle() == "steps-post"]
    first = ds["ts_short_instances"].sel(policy=ds["policy"].values[0], prompt_median=ds["prompt_median"].values[0])
    want = first.transpose("rep", "time").values
    ok = np.isfinite(want).any(axis=0)
    np.testing.assert_allclose(mean.get_ydata()[ok], want[:, ok].mean(axis=0))
    assert np.isnan(mean.get_ydata()[~ok]).all()
    # one band a panel: the variants no longer overlap
    assert all(len(a.collections) == 1 for a in axes)
    assert "at most one move per 5 s" in axes[0].get_ylabel() and "short group" in axes[0].get_ylabel()
    ncols = ds.sizes["prompt_median"]
    assert "at most one move per 1 s" in axes[ncols].get_ylabel()
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("p99 TTFT: short") and "moves a run" in t for t in texts)
    assert "% short" in ax.get_title()


def test_laps_allocation_draws_and_numbers_each_phases_time_average(results):  # noqa: F811
    """Regression (laps_allocation, issue 34): the time-average of the short
    group's instances (the user guide quotes it before and during the step) could
    not be read off the figure.  Each phase (before, during, after the high
    load) now has a black segment at the time-average of the mean over
    replications, numbered."""
    ds = xr.open_zarr(results / "laps_step.zarr", chunks=None).load()
    fig = cluster.laps_allocation({"laps_step": ds})
    t = ds["time"].values
    t_up, t_down = float(ds.attrs["t_up"]), float(ds.attrs["t_down"])
    for i, policy in enumerate(ds["policy"].values):
        for j, mix in enumerate(ds["prompt_median"].values):
            ax = fig.axes[i * ds.sizes["prompt_median"] + j]
            short = ds["ts_short_instances"].sel(policy=policy, prompt_median=mix).transpose("rep", "time").values
            ok = np.isfinite(short).any(axis=0)   # (no rep has a value before the first arrival)
            mean = np.full(t.size, np.nan)
            mean[ok] = short[:, ok].mean(axis=0)
            phases = [(t >= t[0]) & (t < t_up), (t >= t_up) & (t < t_down), t >= t_down]
            want = [float(np.nanmean(mean[sel])) for sel in phases]
            segments = [ln for ln in ax.lines if len(ln.get_xdata()) == 2 and to_hex(ln.get_color()) == "#000000"]
            assert [tuple(ln.get_xdata()) for ln in segments] == [(t[0], t_up), (t_up, t_down), (t_down, t[-1])]
            np.testing.assert_allclose([ln.get_ydata()[0] for ln in segments], want, rtol=1e-12)
            numbers = [tx.get_text() for tx in ax.texts if not tx.get_text().startswith("p99")]
            assert numbers == [f"{v:.2f}" for v in want]


def test_autellix_routers_draws_each_router_per_calls_and_metric(results):  # noqa: F811
    ds = xr.open_zarr(results / "autellix.zarr", chunks=None).load()
    fig = cluster.autellix_routers({"autellix": ds})
    axes = fig.axes
    assert len(axes) == 3 * ds.sizes["calls"]
    ax = axes[0]                                  # p99 TTFT, the first number of calls
    joined = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len(joined) == ds.sizes["policy"]
    sel = dict(policy="autellix", calls=ds["calls"].values[0])
    share = ds["sim_large_share"].sel(**sel).mean("rep").values
    want, _ = replication_ci(ds["sim_ttft_p99"].sel(**sel).transpose("route_threshold", "rep").values)
    order = np.argsort(share)
    np.testing.assert_allclose(joined[0].get_xdata(), share[order])
    np.testing.assert_allclose(joined[0].get_ydata(), want[order])
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "Autellix (program-aware)" in labels and "round-robin" in labels
    assert "share of large calls" in ax.get_xlabel()


def test_autellix_routers_states_the_throughput_instead_of_drawing_it(results):  # noqa: F811
    """Regression (autellix_routers, issue 34): a throughput row whose
    intervals (the replications' arrival counts) swamped every difference.
    No panel draws it now; the title gives each replication's throughput
    against least-used's on the same calls."""
    ds = xr.open_zarr(results / "autellix.zarr", chunks=None).load()
    fig = cluster.autellix_routers({"autellix": ds})
    assert not any("throughput" in ax.get_ylabel() for ax in fig.axes)
    thr = ds["sim_throughput"]
    gap = float(np.abs(thr / thr.sel(policy="least_used") - 1).max())
    assert f"within {100 * gap:.1f} % of least-used's in every replication" in fig.get_suptitle()


def test_autellix_routers_log_axes_have_plain_tick_labels(results):  # noqa: F811
    """Regression (autellix_routers, issue 34): a p99 TTFT axis spanning less
    than a decade was labelled 4x10^0; its ticks are plain numbers now."""
    ds = xr.open_zarr(results / "autellix.zarr", chunks=None).load()
    fig = cluster.autellix_routers({"autellix": ds})
    fig.draw_without_rendering()
    logs = [ax for ax in fig.axes if ax.get_yscale() == "log"]
    assert len(logs) == ds.sizes["calls"]
    for ax in logs:
        low, high = ax.get_ylim()
        shown = [t for t in ax.get_yticklabels(which="both") if t.get_text() and low <= t.get_position()[1] <= high]
        assert len(shown) >= 2
        for t in shown:
            assert float(t.get_text()) == pytest.approx(t.get_position()[1])


def test_autellix_loops_draws_each_router_in_each_loop(results):  # noqa: F811
    ds = xr.open_zarr(results / "autellix_loops.zarr", chunks=None).load()
    fig = cluster.autellix_loops({"autellix_loops": ds})
    axes = [ax for ax in fig.axes if ax.get_lines()]
    assert len(axes) == 4
    ax = axes[0]                                  # p99 TTFT
    joined = [ln for ln in ax.lines if ln.get_linestyle() in ("-", "--")]
    assert len(joined) == 2 * ds.sizes["router"]
    assert [ln.get_linestyle() for ln in joined[:2]] == ["-", "--"]
    want, _ = replication_ci(ds["sim_ttft_p99"].sel(router="autellix", closed_loop=True)
                             .transpose("rate", "rep").values)
    np.testing.assert_allclose(joined[1].get_ydata(), want)
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "Autellix (program-aware)" in labels and any(lb.startswith("closed loop") for lb in labels)


def test_capacity_routers_draws_each_router_against_the_bound(results):  # noqa: F811
    ds = xr.open_zarr(results / "capacity_routers.zarr", chunks=None).load()
    fig = cluster.capacity_routers({"capacity_routers": ds})
    ax = fig.axes[0]
    joined = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len(joined) == ds.sizes["policy"]
    np.testing.assert_allclose(joined[0].get_ydata(), ds["sim_capacity"].sel(policy=ds["policy"].values[0]).values)
    assert "p99 TTFT bound" in ax.get_xlabel()


def test_disaggregation_draws_each_split_beside_the_colocated_engines(results):  # noqa: F811
    """One point per split, along p, its capacity the store's; the colocated
    cluster's capacity a dashed line; the best split named."""
    ds = xr.open_zarr(results / "disaggregation.zarr", chunks=None).load()
    fig = cluster.disaggregation({"disaggregation": ds})
    ax = fig.axes[0]
    (joined,) = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    splits = [str(v) for v in ds["policy"].values if str(v) != "colocated"]
    np.testing.assert_array_equal(joined.get_xdata(), np.arange(1, 8))
    np.testing.assert_allclose(joined.get_ydata(), ds["sim_capacity"].sel(policy=splits).values)
    (colocated,) = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert colocated.get_ydata()[0] == float(ds["sim_capacity"].sel(policy="colocated"))
    best = splits[int(ds["sim_capacity"].sel(policy=splits).argmax())]
    assert f"best split {best[1:]}:{8 - int(best[1:])}" in ax.get_title()


def test_engine_event_shades_the_engines_absence(results):  # noqa: F811
    ds = xr.open_dataset(results / "engine_event.nc").load()
    fig = cluster.engine_event({"engine_event": ds})
    ax = fig.axes[0]
    assert len(ax.lines) == ds.sizes["router"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), ds["mean_latency"].sel(router="least_used").values)
    span = [p for p in ax.patches]
    assert span, "the engine's absence is shaded"
    assert "re-routed" in fig.legends[0].get_texts()[0].get_text()
