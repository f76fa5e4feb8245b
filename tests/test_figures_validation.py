"""The predicted-against-measured figure (mbbatch/figures/validation.py),
drawn from a small validation Dataset of known values."""

import numpy as np
import xarray as xr

from mbbatch.figures.style import house_style
from mbbatch.figures.validation import PANELS, validation


def test_it_draws_each_metric_measured_against_predicted():
    runs, metrics = ["a", "b", "c"], list(PANELS)
    measured = np.array([[0.04, 0.02, 1.3], [0.28, 0.021, 3.0], [0.06, 0.026, 29.0]])
    ds = xr.Dataset({"measured": (("run", "metric"), measured), "predicted": (("run", "metric"), measured * 1.05),
                     "profile_alone": (("run", "metric"), measured * 0.5)},
                    coords={"run": runs, "metric": metrics}, attrs={"runs": 3, "profiles": "P"})
    with house_style():
        fig = validation(ds)
    axes = fig.axes
    assert len(axes) == 3
    # each panel: the held-out points (5 % above the diagonal) and its median error in the title
    assert all(ax.get_title() == "median |error| 5.0% held out (3 runs)" for ax in axes)
    pts = axes[0].collections[-1].get_offsets()
    np.testing.assert_allclose(pts[:, 1] / pts[:, 0], 1.05)


def test_runs_fitted_from_their_own_are_drawn_apart_and_without_a_profile_alone():
    runs, metrics = ["a", "b"], list(PANELS)
    measured = np.array([[0.04, 0.02, 1.3], [0.3, 0.03, 9.0]])
    alone = measured * 0.5
    alone[1] = np.nan
    ds = xr.Dataset({"measured": (("run", "metric"), measured), "predicted": (("run", "metric"), measured * 0.9),
                     "profile_alone": (("run", "metric"), alone), "method": (("run",), ["profile", "from_serving"])},
                    coords={"run": runs, "metric": metrics}, attrs={"runs": 2})
    with house_style():
        fig = validation(ds)
    ax = fig.axes[0]
    fitted = ax.collections[-1].get_offsets()
    np.testing.assert_allclose(fitted, [[0.3, 0.27]])
    assert "fitted from own runs, held out" in [t.get_text() for t in ax.get_legend().get_texts()]
