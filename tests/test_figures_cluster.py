"""The multi-engine figures (mbbatch.figures.cluster)."""

import numpy as np
import xarray as xr

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
    assert len(axes) == ds.sizes["prompt_median"]
    ax = axes[0]
    means = [ln for ln in ax.lines if ln.get_drawstyle() == "steps-post"]
    assert len(means) == ds.sizes["policy"]
    first = ds["ts_short_instances"].sel(policy=ds["policy"].values[0], prompt_median=ds["prompt_median"].values[0])
    want = first.transpose("rep", "time").values
    ok = np.isfinite(want).any(axis=0)
    np.testing.assert_allclose(means[0].get_ydata()[ok], want[:, ok].mean(axis=0))
    assert np.isnan(means[0].get_ydata()[~ok]).all()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith("at most one move per 5 s") and "p99 TTFT short" in labels[0]
    assert "per 1 s" in labels[1]
    assert "short group" in ax.get_ylabel() and "% short" in ax.get_title()


def test_autellix_routers_draws_each_router_per_calls_and_metric(results):  # noqa: F811
    ds = xr.open_zarr(results / "autellix.zarr", chunks=None).load()
    fig = cluster.autellix_routers({"autellix": ds})
    axes = fig.axes
    assert len(axes) == 4 * ds.sizes["calls"]
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


def test_engine_event_shades_the_engines_absence(results):  # noqa: F811
    ds = xr.open_dataset(results / "engine_event.nc").load()
    fig = cluster.engine_event({"engine_event": ds})
    ax = fig.axes[0]
    assert len(ax.lines) == ds.sizes["router"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), ds["mean_latency"].sel(router="least_used").values)
    span = [p for p in ax.patches]
    assert span, "the engine's absence is shaded"
    assert "re-routed" in fig.legends[0].get_texts()[0].get_text()
