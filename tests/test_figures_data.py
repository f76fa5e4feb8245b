"""mbbatch.figures.data: where datasets live, and reading values from them."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr

from mbbatch import figures
from mbbatch.figures import data

from .figure_datasets import MARKS, results  # noqa: F401  (fixture)

pytestmark = MARKS


def test_missing_dataset_names_the_command(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(results, tmp_path / "out", only="fig4")
    msg = str(info.value)
    assert "fig4.zarr" in msg
    assert f"mbbatch sweep sweeps/fig4.toml --out {results / 'fig4.zarr'}" in msg   # (into the folder given)
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(results, tmp_path / "out", only="fig1b")
    assert f"mbbatch example fig1b --out {results / 'fig1b.nc'}" in str(info.value)
    assert figures.dataset_command("fig4") == "mbbatch sweep sweeps/fig4.toml --out results/fig4.zarr"


@pytest.mark.parametrize("name", [n for n, (_, datasets) in figures.FIGURES.items() if datasets])
def test_missing_datasets_name_their_commands(tmp_path, name):
    empty = tmp_path / "results"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(empty, tmp_path / "out", only=name)
    msg = str(info.value)
    for d in figures.FIGURES[name][1]:
        assert str(figures.dataset_path(empty, d)) in msg
        assert figures.dataset_command(d, empty) in msg
    assert not (tmp_path / "out").exists()


def test_one_missing_dataset_of_several(results, tmp_path):
    partial = tmp_path / "results"
    shutil.copytree(results / "fig3.zarr", partial / "fig3.zarr")
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(partial, tmp_path / "out", only=["fig3", "fig4"])
    msg = str(info.value)
    assert f"mbbatch sweep sweeps/fig4.toml --out {partial / 'fig4.zarr'}" in msg
    assert "sweeps/fig3.toml" not in msg
    assert not (tmp_path / "out").exists()


def test_cells_not_done_are_left_out(results, tmp_path):
    ds = xr.open_zarr(results / "fig3.zarr", chunks=None).load()
    ds["done"][:] = False
    sub = tmp_path / "partial"
    sub.mkdir()
    ds.to_zarr(sub / "fig3.zarr", mode="w")
    assert np.isnan(data.line(ds, "sim_throughput_mean", "rate", bins=1)).all()
    assert not data.line(ds, "unstable", "rate", bins=1).any()
    # closed forms are not simulated: they stay
    assert np.isfinite(data.line(ds, "theory_throughput", "rate", bins=1)).all()
    with pytest.warns(figures.IncompleteDataset, match=f"has {ds['done'].size} of {ds['done'].size} grid points"):
        figures.make_figures(sub, tmp_path / "out", only="fig3")


def _grid():
    """A hand-made sweep over (bins, rate) with one rep axis and one undone cell."""
    rates = np.array([1.0, 2.0, 4.0])
    sim = np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    reps = np.stack([sim, sim + 1.0], axis=-1)
    return xr.Dataset(
        {"sim_mean_latency_mean": (("bins", "rate"), sim),
         "sim_mean_latency": (("bins", "rate", "rep"), reps),
         "theory_latency": (("bins", "rate"), 3.0 + np.array([[1.0], [2.0]]) * 6.0 / rates),
         "done": (("bins", "rate"), np.array([[True, True, False], [True, True, True]]))},
        coords={"bins": [1, 2], "rate": rates, "rep": [0, 1]})


def test_line_and_per_rep_select_one_series():
    ds = _grid()
    np.testing.assert_array_equal(data.line(ds, "sim_mean_latency_mean", "rate", bins=2), [10, 20, 30])
    np.testing.assert_array_equal(data.line(ds, "sim_mean_latency_mean", "rate", bins=1), [1, 2, np.nan])
    np.testing.assert_array_equal(data.per_rep(ds, "sim_mean_latency", "rate", bins=1),
                                  [[1, 2], [2, 3], [np.nan, np.nan]])
    assert data.line(ds, "sim_mean_latency_mean", None, bins=2, rate=4.0) == 30.0
    assert data.constant(ds, "theory_latency", bins=2, rate=2.0) == 9.0


def test_line_refuses_to_pick_one_of_several_values():
    with pytest.raises(ValueError, match="sim_mean_latency_mean: expected one value along 'bins', found 2"):
        data.line(_grid(), "sim_mean_latency_mean", "rate")


def test_closed_form_curve_is_drawn_only_where_it_reproduces_the_store():
    ds = _grid()
    x, y = data.closed_form_curve(ds, "theory_latency", lambda r: 3.0 + 12.0 / r, bins=2)
    assert x.size == 600 and (x[0], x[-1]) == (1.0, 4.0)
    np.testing.assert_allclose(y, 3.0 + 12.0 / x)
    # a closed form the store does not hold: the stored points, as they are
    x, y = data.closed_form_curve(ds, "theory_latency", lambda r: 3.0 + 6.0 / r, bins=2)
    np.testing.assert_array_equal(x, [1.0, 2.0, 4.0])
    np.testing.assert_array_equal(y, [15.0, 9.0, 6.0])
