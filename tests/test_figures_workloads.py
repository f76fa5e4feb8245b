"""The realistic-workload figures (mbbatch.figures.workloads)."""

import numpy as np
import pytest
import xarray as xr

from mbbatch import theory
from mbbatch.figures import workloads

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS


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


def test_bursty_draws_every_cv_and_k(results):  # noqa: F811
    ds, onoff = _load(results, "bursty"), _load(results, "bursty_onoff")
    (ax,) = workloads.bursty({"bursty": ds, "bursty_onoff": onoff}).axes
    joined = [ln for ln in ax.lines if ln.get_linestyle() in ("-", "--") and ln.get_color() != "0.35"]
    assert len(joined) == (ds.sizes["cv"] + 1) * ds.sizes["bins"]
    # the ON/OFF series sits at its mean rate, rate_on x mean_on / (mean_on + mean_off)
    mean_rates = onoff["rate_on"].values / 2
    assert all(np.isin(ln.get_xdata(), np.r_[ds["rate"].values, mean_rates]).all() for ln in joined)
    assert any("ON/OFF" in t.get_text() for t in ax.get_legend().get_texts()) or any(
        "ON/OFF" in t.get_text() for leg in ax.artists for t in getattr(leg, "get_texts", lambda: [])())
