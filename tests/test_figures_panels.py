"""The panels several figures share (mbbatch.figures.panels), each drawn on
its own axes from the synthetic stores."""

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
from matplotlib.legend import Legend

from mbbatch import theory
from mbbatch.figures import panels
from mbbatch.figures.data import line

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS


def _load(results, name):  # noqa: F811
    return xr.open_zarr(results / f"{name}.zarr", chunks=None).load()


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def _curves(ax):
    """The closed-form curves drawn on the fine rate grid (solid, many points)."""
    return [ln for ln in ax.lines if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 50]


def _levels(ax, style):
    return [ln.get_ydata()[0] for ln in ax.lines if ln.get_linestyle() == style and len(ln.get_xdata()) == 2]


def _markers(ax, hollow):
    """(x, y) of the error-bar markers, filled or hollow."""
    return sorted((x, y) for c in ax.containers for x, y in zip(c.lines[0].get_xdata(), c.lines[0].get_ydata())
                  if (c.lines[0].get_markerfacecolor() == "none") == hollow)


# --- throughput_panel ----------------------------------------------------------

def test_throughput_panel_draws_theorem_4_2_level_and_min_rate_curve_per_k(results, ax):  # noqa: F811
    ds = _load(results, "fig3")
    series = panels.throughput_panel(ax, ds, bound=False)
    ks = [int(k) for k in ds["bins"].values]
    assert [h.get_label() for h in series] == [f"k = {k}" for k in ks]
    # the saturated level of each k is Theorem 4.2's service rate (B = 128, U[1, 20])
    want = [128 / theory.service_time(128, 1.0, 20.0, k) for k in ks]
    np.testing.assert_allclose(_levels(ax, "--"), want, rtol=1e-12)
    # below it the throughput is the arrival rate: the curve is min(rate, level)
    curves = _curves(ax)
    assert len(curves) == len(ks)
    for curve, level in zip(curves, want):
        x, y = np.asarray(curve.get_xdata()), np.asarray(curve.get_ydata())
        np.testing.assert_allclose(y, np.minimum(x, level))
    assert not _levels(ax, ":")   # no bound asked for
    assert "(requests/s)" in ax.get_xlabel() and "(requests/s)" in ax.get_ylabel()


def test_throughput_panel_draws_every_simulated_cell_at_its_mean(results, ax):  # noqa: F811
    ds = _load(results, "fig3")
    panels.throughput_panel(ax, ds, bound=False)
    unstable = ds["unstable"].values
    drawn = _markers(ax, hollow=False) + _markers(ax, hollow=True)
    want = [(r, m) for k in ds["bins"].values for r, m in
            zip(ds["rate"].values, ds["sim_throughput_mean"].sel(bins=k).values)]
    np.testing.assert_allclose(sorted(drawn), sorted(want))
    # unstable cells are the hollow ones
    assert len(_markers(ax, hollow=True)) == int(unstable.sum())


def test_throughput_panel_bound_adds_corollary_a_1_1_where_the_store_has_it(results, ax):  # noqa: F811
    ds = _load(results, "fig8")   # exponential service, Lemma A.1's edges: B = 200, mu = 0.1
    panels.throughput_panel(ax, ds, bound=True)
    want = [theory.exponential_throughput_bound(200, 0.1, int(k)) for k in ds["bins"].values]
    np.testing.assert_allclose(_levels(ax, ":"), want, rtol=1e-12)


def test_throughput_panel_bound_skips_stores_without_one(results, ax):  # noqa: F811
    ds = _load(results, "fig3")   # uniform service: no such bound (NaN in the store)
    assert not np.isfinite(ds["theory_throughput_bound"].values).any()
    panels.throughput_panel(ax, ds, bound=True)
    assert not _levels(ax, ":")


# --- latency_panel -------------------------------------------------------------

def test_latency_panel_lemma_5_1_curves_pass_through_the_stored_closed_form(results, ax):  # noqa: F811
    ds = _load(results, "fig3")
    series, curves = panels.latency_panel(ax, ds)
    ks = [int(k) for k in ds["bins"].values]
    assert [h.get_label() for h in series] == [f"k = {k}" for k in ks]
    assert ax.get_yscale() == "log"
    assert len(_curves(ax)) == len(ks)
    for k, (x, y) in zip(ks, curves):
        stored = line(ds, "theory_latency", "rate", bins=k)
        rates = ds["rate"].values
        ok = np.isfinite(stored)
        # the fine grid spans the rates: its ends are grid rates, where the curve is the store's value
        assert x[0] == rates.min() and x[-1] == rates.max()
        for end, r in ((0, rates.min()), (-1, rates.max())):
            if ok[rates == r].all():
                assert y[end] == pytest.approx(stored[rates == r][0], rel=1e-9)


def test_latency_panel_over_servers_returns_curves_but_draws_none(results, ax):  # noqa: F811
    ds = _load(results, "servers")
    series, curves = panels.latency_panel(ax, ds, series_dim="servers", label=lambda v: f"c = {v:g}")
    assert [h.get_label() for h in series] == [f"c = {v:g}" for v in ds["servers"].values]
    assert len(curves) == ds.sizes["servers"]
    assert not _curves(ax)


def test_latency_panel_clips_points_above_the_stable_range_to_the_top(results, ax):  # noqa: F811
    ds = _load(results, "fig3")
    panels.latency_panel(ax, ds)
    top = ax.get_ylim()[1]
    bars = {c.lines[0] for c in ax.containers}
    clipped = [ln for ln in ax.lines if ln not in bars and ln.get_linestyle() == "None"]
    assert clipped   # the synthetic store's unstable latencies run far above the stable ones
    for ln in clipped:
        assert ln.get_markerfacecolor() == "none"
        np.testing.assert_allclose(ln.get_ydata(), top / 1.15)
    # every drawn marker lies within the axes
    assert all(y <= top for _, y in _markers(ax, hollow=False) + _markers(ax, hollow=True))


# --- capacity_search and capacity_against_bound ----------------------------------

def test_capacity_search_marks_only_finite_unresolved_searches():
    x = [1.0, 2.0, 3.0, 4.0]
    ds = xr.Dataset({"sim_capacity": ("d", [1.0, np.nan, 3.0, 4.0]),
                     "sim_capacity_ci_low": ("d", [0.9, np.nan, 2.9, 3.9]),
                     "sim_capacity_ci_high": ("d", [1.1, np.nan, 3.1, 4.1]),
                     "capacity_resolved": ("d", [True, False, False, True])}, coords={"d": x})
    cap, lo, hi, unresolved = panels.capacity_search(ds, "d")
    np.testing.assert_array_equal(cap, [1.0, np.nan, 3.0, 4.0])
    np.testing.assert_array_equal(lo, [0.9, np.nan, 2.9, 3.9])
    np.testing.assert_array_equal(hi, [1.1, np.nan, 3.1, 4.1])
    # a cell with no search (NaN) is not drawn, so it is not marked unresolved either
    assert unresolved.tolist() == [False, False, True, False]


def test_capacity_against_bound_draws_one_series_per_variant_hollow_where_unresolved(results):  # noqa: F811
    ds = _load(results, "capacity_latency")
    names = [str(p) for p in ds["policy"].values]
    fig, ax = panels.capacity_against_bound(ds, "objective_latency_p95", lambda s: s["kind"], "bound (s)",
                                            "capacity (requests/s)")
    try:
        bounds = ds["objective_latency_p95"].values
        assert ax.get_xscale() == "log"
        np.testing.assert_allclose(ax.get_xticks(), bounds)
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{v:g}" for v in bounds]
        assert ax.get_xlabel() == "bound (s)" and ax.get_ylabel() == "capacity (requests/s)"
        legends = [a for a in ax.get_children() if isinstance(a, Legend)]
        labels = [[t.get_text() for t in lg.get_texts()] for lg in legends]
        assert [json.loads(ds.attrs[f"policy_{n}"])["kind"] for n in names] in labels
        resolved = ds["capacity_resolved"].transpose("policy", "objective_latency_p95").values
        cap = ds["sim_capacity"].transpose("policy", "objective_latency_p95").values
        hollow = _markers(ax, hollow=True)
        want = sorted((b, c) for row_c, row_r in zip(cap, resolved) for b, c, r in zip(bounds, row_c, row_r)
                      if not r)
        np.testing.assert_allclose(hollow, want)
        assert len(_markers(ax, hollow=False)) == int(resolved.sum())
    finally:
        plt.close(fig)
