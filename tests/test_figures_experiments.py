"""mbbatch.figures.experiments: the dynamic-batching experiments (i)-(v)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import to_hex

from mbbatch import figures
from mbbatch.figures import experiments

from .figure_datasets import MARKS, drawn, results  # noqa: F401  (fixtures)

pytestmark = MARKS

#: Student t quantiles from a printed table, to four significant figures
T_975_2, T_95_2 = 4.303, 2.920


@pytest.mark.parametrize("name", experiments.__all__)
def test_experiment_figure_alone_matches_the_full_run(results, drawn, tmp_path, name):
    """Drawn alone, a figure has the bytes it has among all others: no state leaks."""
    out, _ = drawn
    files = figures.make_figures(results, tmp_path, only=name, formats="png")
    assert [f.name for f in files] == [f"{name}.png"]
    for f in files:
        assert f.read_bytes() == (out / f.name).read_bytes(), f.name


def _policy(confidence_level=None):
    """One token policy at four rates, three reps each, with known answers:

    rate 1: throughput 1.0, stable;  rate 2: throughput 1.5 < 0.95 * 2, overloaded
    though not flagged;  rate 4: flagged unstable;  rate 8: not done.
    p95 latency reps 1, 2, 3 (sd 1) around stored means 2, 20, 40, 80;
    SLA-violating token shares 0.1, 0.2, 0.3 (sd 0.1), with a stored mean of 0.25:
    unlike a real store's, it differs from the reps' mean, to show which one
    centres the interval.
    """
    rates = [1.0, 2.0, 4.0, 8.0]
    p95_mean = np.array([2.0, 20.0, 40.0, 80.0])
    ds = xr.Dataset(
        {"sim_throughput_mean": ("rate", [1.0, 1.5, 4.0, 8.0]),
         "sim_throughput_ci_low": ("rate", [0.9, 1.4, 3.9, 7.9]),
         "sim_throughput_ci_high": ("rate", [1.1, 1.6, 4.1, 8.1]),
         "sim_latency_p95": (("rate", "rep"), p95_mean[:, None] + [-1.0, 0.0, 1.0]),
         "sim_latency_p95_mean": ("rate", p95_mean),
         "sim_sla_violation_tokens": (("rate", "rep"), np.tile([0.1, 0.2, 0.3], (4, 1))),
         "sim_sla_violation_tokens_mean": ("rate", np.full(4, 0.25)),
         "unstable": ("rate", [False, False, True, False]),
         "done": ("rate", [True, True, True, False])},
        coords={"rate": rates, "rep": [0, 1, 2]})
    if confidence_level is not None:
        ds.attrs["confidence_level"] = confidence_level
    return ds


def test_token_series_on_hand_made_data():
    s = experiments._token_series(_policy())
    np.testing.assert_array_equal(s["rate"], [1.0, 2.0, 4.0, 8.0])
    # hollow: flagged or overloaded; a cell not done is left out, not hollow
    np.testing.assert_array_equal(s["unstable"], [False, True, True, False])
    mean, lo, hi = s["throughput"]
    np.testing.assert_array_equal(mean, [1.0, 1.5, 4.0, np.nan])
    np.testing.assert_array_equal(lo, [0.9, 1.4, 3.9, np.nan])
    np.testing.assert_array_equal(hi, [1.1, 1.6, 4.1, np.nan])
    # the stored mean, with the t-interval of the reps around it
    half = T_975_2 / math.sqrt(3)
    mean, lo, hi = s["p95"]
    np.testing.assert_array_equal(mean, [2.0, 20.0, 40.0, np.nan])
    np.testing.assert_allclose(mean[:3] - lo[:3], half, rtol=1e-3)
    np.testing.assert_allclose(hi[:3] - mean[:3], half, rtol=1e-3)
    assert np.isnan(lo[3]) and np.isnan(hi[3])
    # SLA violations in percent, around the stored mean
    mean, lo, hi = s["sla"]
    np.testing.assert_allclose(mean[:3], 25.0)
    np.testing.assert_allclose(mean[:3] - lo[:3], 10.0 * half, rtol=1e-3)
    np.testing.assert_allclose(hi[:3] - mean[:3], 10.0 * half, rtol=1e-3)
    assert np.isnan(mean[3])


def test_token_series_interval_follows_the_stored_confidence_level():
    _, lo, hi = experiments._token_series(_policy(confidence_level=0.90))["p95"]
    np.testing.assert_allclose((hi - lo)[:3] / 2, T_95_2 / math.sqrt(3), rtol=1e-3)


def _max_wait(results):  # noqa: F811
    ds = xr.open_zarr(results / "max_wait.zarr", chunks=None).load()
    return ds, experiments.max_wait({"max_wait": ds})


def test_max_wait_panel_a_is_scaled_to_the_stable_cells(results):  # noqa: F811
    """Regression (max_wait, issue 34): panel (a)'s y-axis ran to the unstable
    runs' 200,000 s, squashing the stable 50-300 s.  It now fits the stable
    cells and Lemma 5.1; the cells above it are hollow on the top edge."""
    ds, fig = _max_wait(results)
    ax = fig.axes[0]
    unstable = ds["unstable"].values | (ds["sim_throughput_mean"].values < 0.95 * ds["rate"].values[None, :])
    lat = ds["sim_mean_latency_mean"].values
    stable_hi = np.nanmax(ds["sim_mean_latency_ci_high"].values[~unstable])
    lemma = max(ln.get_ydata().max() for ln in ax.lines if len(ln.get_xdata()) > 50)
    bottom, top = ax.get_ylim()
    assert top == pytest.approx(2.0 * max(stable_hi, lemma))
    off = lat > top / 1.15
    assert off.sum() >= ds.sizes["rate"]          # the synthetic short timeouts: every rate off scale
    edge = [y for ln in ax.lines if not ln.get_clip_on() for y in ln.get_ydata()]
    assert len(edge) == off.sum() and np.allclose(edge, top / 1.15)


def test_max_wait_lemma_5_1_and_the_classic_policy_are_told_apart(results):  # noqa: F811
    """Regression (max_wait, issue 34): the max_wait = inf series and Lemma
    5.1's curve were both black.  They have different colours now, each
    named in the legend with its own colour."""
    ds, fig = _max_wait(results)
    ax = fig.axes[0]
    (lemma,) = [ln for ln in ax.lines if len(ln.get_xdata()) > 50]
    inf_markers = [ln for ln in ax.lines if ln.get_marker() == experiments.MARKERS[ds.sizes["max_wait"] - 1]
                   and len(ln.get_xdata()) > 0]
    assert inf_markers
    assert {to_hex(ln.get_color()) for ln in inf_markers} == {to_hex(experiments.MAX_WAIT_INF_COLOR)}
    assert to_hex(lemma.get_color()) != to_hex(experiments.MAX_WAIT_INF_COLOR)
    handles = {h.get_label(): h for h in ax.get_legend().legend_handles}
    (lemma_entry,) = [h for label, h in handles.items() if label.startswith("Lemma 5.1")]
    assert to_hex(lemma_entry.get_color()) == to_hex(lemma.get_color())
    assert to_hex(handles["max_wait = $\\infty$ (classic multi-bin)"].get_color()) == to_hex(
        experiments.MAX_WAIT_INF_COLOR)
    assert any(t.get_text().startswith("Lemma 5.1") for t in ax.texts)
