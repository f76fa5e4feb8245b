"""The capacity-search figures (mbbatch.figures.capacity)."""

import numpy as np
import pytest
import xarray as xr

from mbbatch import theory
from mbbatch.figures import capacity

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS


def _load(results, name):  # noqa: F811
    return xr.open_zarr(results / f"{name}.zarr", chunks=None).load()


def _errorbar_points(ax):
    """(x, y) of every marker drawn with error bars (filled or hollow)."""
    pts = []
    for c in ax.containers:
        line = c.lines[0]
        pts += list(zip(line.get_xdata(), line.get_ydata()))
    return sorted(pts)


def test_capacity_vs_k_draws_each_search_beside_theorem_4_2_and_c_max(results):  # noqa: F811
    ds = _load(results, "capacity_k")
    (ax,) = capacity.capacity_vs_k({"capacity_k": ds}).axes
    pts = _errorbar_points(ax)
    want = sorted(zip(ds["bins"].values.astype(float), ds["sim_capacity"].values))
    np.testing.assert_allclose(pts, want)
    curve = next(ln for ln in ax.lines if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 2)
    k = np.asarray(curve.get_xdata(), dtype=int)
    np.testing.assert_allclose(curve.get_ydata(), [128 / theory.service_time(128, 1.0, 20.0, int(i)) for i in k])
    levels = [ln.get_ydata()[0] for ln in ax.lines if ln.get_linestyle() == "--"]
    assert float(ds["capacity"].values[0]) == pytest.approx(levels[0])
    # unresolved searches are hollow
    hollow = [c for c in ax.containers if c.lines[0].get_markerfacecolor() == "none"]
    assert sum(len(c.lines[0].get_xdata()) for c in hollow) == int((~ds["capacity_resolved"]).sum())


def test_capacity_latency_draws_every_policy_against_the_target(results):  # noqa: F811
    ds = _load(results, "capacity_latency")
    (ax,) = capacity.capacity_latency({"capacity_latency": ds}).axes
    assert ax.get_xscale() == "log"
    joined = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len(joined) == ds.sizes["policy"]
    for ln, name in zip(joined, ds["policy"].values):
        np.testing.assert_allclose(ln.get_ydata(), ds["sim_capacity"].sel(policy=name).values)
    labels = [t.get_text() for t in ax.artists[0].get_texts()] if ax.artists else []
    labels += [t.get_text() for t in ax.get_legend().get_texts()]
    assert "multi-bin dynamic, K = 4" in labels and "static, B = 8" in labels


def test_capacity_predictor_draws_each_k_with_the_oracles_level(results):  # noqa: F811
    ds = _load(results, "capacity_predictor")
    (ax,) = capacity.capacity_predictor({"capacity_predictor": ds}).axes
    levels = sorted(ln.get_ydata()[0] for ln in ax.lines if ln.get_linestyle() == ":")
    want = sorted(128 / theory.service_time(128, 1.0, 20.0, int(k)) for k in ds["bins"].values)
    np.testing.assert_allclose(levels, want)
    joined = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    for ln, k in zip(joined, ds["bins"].values):
        np.testing.assert_allclose(ln.get_ydata(), ds["sim_capacity"].sel(bins=k).values)
