"""The realistic-workload figures (mbbatch.figures.workloads)."""

import tomllib
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from mbbatch import theory
from mbbatch.figures import workloads
from mbbatch.figures.style import MARKERS

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def _load(results, name):  # noqa: F811
    return xr.open_zarr(results / f"{name}.zarr", chunks=None).load()


def test_predictor_gain_draws_the_paired_gain_and_the_oracles_level(results):  # noqa: F811
    """Each k > 1 is drawn at the mean over replications of its throughput
    over k = 1's, and the oracle's gain from Theorem 4.2 is a dotted level."""
    data = {n: _load(results, n) for n in ("predictor_error", "bin_confusion")}
    fig = workloads.predictor_gain(data)
    ax = fig.axes[0]
    ds = data["predictor_error"]
    want = (ds["sim_throughput"].sel(bins=4) / ds["sim_throughput"].sel(bins=1)).mean("rep").values
    drawn = [ln.get_ydata() for ln in ax.lines if len(ln.get_ydata()) == want.size and ln.get_linestyle() == "-"]
    assert any(np.allclose(y, want) for y in drawn)
    oracle = theory.service_time(32, 1, 20, 1) / theory.service_time(32, 1, 20, 4)
    levels = [ln.get_ydata()[0] for ln in ax.lines if ln.get_linestyle() == ":"]
    assert oracle == pytest.approx(min(levels, key=lambda v: abs(v - oracle)), rel=1e-12)


def _bursty(results):  # noqa: F811
    ds, onoff = _load(results, "bursty"), _load(results, "bursty_onoff")
    return ds, onoff, workloads.bursty({"bursty": ds, "bursty_onoff": onoff})


def _series_handles(fig):
    """The bursty legend's entries of the arrival processes."""
    (legend,) = fig.legends
    return [h for h in legend.legend_handles if h.get_label().startswith(("gamma", "ON/OFF"))]


def _sim_markers(ax):
    """The simulation markers of an axes: lines drawn with a marker other than an error bar's cap."""
    return [ln for ln in ax.lines if ln.get_marker() not in ("None", "", None, "_", "|")]


def test_bursty_draws_one_panel_per_k_and_one_marker_per_arrival_process(results):  # noqa: F811
    """Regression (bursty, issue 34): the legend said "marker o / marker s" for
    k while every swatch was a circle.  Now k is the panel, and each arrival
    process has its own marker and colour, in the legend as in the panels."""
    ds, onoff, fig = _bursty(results)
    assert len(fig.axes) == ds.sizes["bins"]
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["k = 1 bin", "k = 4 bins"]
    series = _series_handles(fig)
    assert len(series) == ds.sizes["cv"] + 1
    assert [h.get_marker() for h in series] == MARKERS[: len(series)]
    assert any("ON/OFF" in h.get_label() for h in series)
    want = {(h.get_marker(), to_hex(h.get_color())) for h in series}
    for ax in fig.axes:
        assert {(ln.get_marker(), to_hex(ln.get_markeredgecolor())) for ln in _sim_markers(ax)} == want


def test_bursty_unstable_series_stay_distinguishable(results):  # noqa: F811
    """Regression (bursty, issue 34): at k = 1 every process is unstable at the
    highest rates, and the four series' hollow markers fell on one point of
    the top edge.  Each series is now drawn BURSTY_DODGE further right, so
    they stand side by side there, each with its own marker."""
    ds, onoff, fig = _bursty(results)
    ax = fig.axes[0]
    rate = float(ds["rate"].values[-1])                  # unstable for every process at k = 1
    assert ds["unstable"].sel(bins=1, rate=rate).values.all()
    top = [(x, ln.get_marker()) for ln in ax.lines if not ln.get_clip_on() and ln.get_markerfacecolor() == "none"
           for x in ln.get_xdata() if abs(x - rate) < 0.5 * (ds["rate"].values[1] - ds["rate"].values[0])]
    assert len(top) == ds.sizes["cv"] + 1
    xs = sorted(x for x, _ in top)
    np.testing.assert_allclose(np.diff(xs), workloads.BURSTY_DODGE)
    assert len({m for _, m in top}) == len(top)
    # the ON/OFF series is drawn at its mean rate, rate_on x mean_on / (mean_on + mean_off), moved as the others
    (onoff_marker,) = [ln for ln in _sim_markers(ax) if ln.get_marker() == MARKERS[ds.sizes["cv"]]][:1]
    moved = onoff_marker.get_xdata() - ds.sizes["cv"] * workloads.BURSTY_DODGE
    assert np.isin(np.round(moved, 9), np.round(onoff["rate_on"].values / 2, 9)).all()


def test_bursty_unstable_cells_have_no_interval_and_no_bar_leaves_the_axes(results):  # noqa: F811
    """Regression (bursty, issue 34): an unstable cell's interval (the mean of a
    transient) spanned the whole axis.  Only stable cells have bars now, and
    those fit in the axes."""
    ds, onoff, fig = _bursty(results)
    for ax in fig.axes:
        bottom, top = ax.get_ylim()
        for c in ax.containers:
            if not isinstance(c, ErrorbarContainer):
                continue
            assert c.lines[0].get_markerfacecolor() != "none"
            for bars in c.lines[2]:
                ys = np.concatenate([seg[:, 1] for seg in bars.get_segments()])
                assert ys.min() >= bottom and ys.max() <= top


def test_bursty_lines_are_lemma_5_1_only(results):  # noqa: F811
    """Regression (bursty, issue 34): lines joined the simulations, where the
    house convention keeps lines for closed forms.  The one curve of a panel
    is Lemma 5.1 for Poisson arrivals, E[t_service] + (B - 1) k / (2 lambda),
    in the colour of the Poisson series."""
    ds, onoff, fig = _bursty(results)
    B = int(ds.attrs["batch_size"])
    poisson = _series_handles(fig)[0]
    assert "Poisson" in poisson.get_label()
    for ax, k in zip(fig.axes, ds["bins"].values):
        curves = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
        assert len(curves) == 1
        (curve,) = curves
        ets = float(ds["theory_mean_batch_service"].sel(bins=k, cv=1.0).values[0])
        x = curve.get_xdata()
        np.testing.assert_allclose(curve.get_ydata(), ets + (B - 1) * int(k) / (2 * x), rtol=1e-12)
        assert to_hex(curve.get_color()) == to_hex(poisson.get_color())


def test_trace_replay_legend_names_the_policies_not_the_spec_ids(results):  # noqa: F811
    """Regression (trace_replay, issue 34): the legend showed the spec's
    variant names (mb_dynamic4); it now says what each variant is."""
    ds = _load(results, "trace_replay")
    fig = workloads.trace_replay({"trace_replay": ds})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["multi-bin, k = 1, B = 8, max_wait 30 s", "static, B = 8", "dynamic batching"]
    assert not set(labels) & {str(v) for v in ds["policy"].values}


def test_trace_replay_draws_an_interval_only_over_replications(results):  # noqa: F811
    """One replay in the trace's order is deterministic: no bars, and the
    legend says so; with replications, the p95's t-interval over them."""
    ds = _load(results, "trace_replay")
    one = ds.isel(rep=[0]).assign_attrs(reps=1)
    for store, want_bars in ((one, False), (ds, True)):
        fig = workloads.trace_replay({"trace_replay": store})
        ax = fig.axes[1]
        stable = [c for c in ax.containers if c.lines[0].get_markerfacecolor() != "none"]
        spans = [np.ptp(seg[:, 1]) for c in stable for bars in c.lines[2] for seg in bars.get_segments()]
        assert (max(spans) > 0) == want_bars
        styles = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        assert any("no interval" in t for t in styles) == (not want_bars)


def test_trace_replay_spec_description_names_its_grid():
    """Regression (trace_replay, issue 34): the description said 0.5x to 4x
    while the grid went to 8x."""
    raw = tomllib.loads(SWEEPS.joinpath("trace_replay.toml").read_text())
    scales = raw["grid"]["scale"]
    assert f"{min(scales):g}x to {max(scales):g}x" in raw["description"]
