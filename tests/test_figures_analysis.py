"""mbbatch.figures.analysis: overload, replication intervals, settling times."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from mbbatch.figures import analysis

from .figure_datasets import MARKS, SETTLE_DOWN, SETTLE_UP, results  # noqa: F401  (fixture)

pytestmark = MARKS

#: Student t quantiles from a printed table, to four significant figures
T_975_2, T_95_2, T_975_1 = 4.303, 2.920, 12.71


def test_replication_ci_known_answers():
    values = [[1.0, 2.0, 3.0],           # sd 1, 3 reps
              [1.0, 3.0, np.nan],        # a rep missing: sd sqrt(2), 2 reps
              [5.0, np.nan, np.nan],     # one rep: no interval
              [np.nan, np.nan, np.nan]]  # no rep: no mean either
    mean, half = analysis.replication_ci(values)
    np.testing.assert_array_equal(mean, [2.0, 2.0, 5.0, np.nan])
    assert half[0] == pytest.approx(T_975_2 / math.sqrt(3), rel=1e-3)
    assert half[1] == pytest.approx(T_975_1, rel=1e-3)
    assert np.isnan(half[2:]).all()
    _, half90 = analysis.replication_ci(values, level=0.90)
    assert half90[0] == pytest.approx(T_95_2 / math.sqrt(3), rel=1e-3)


def test_overloaded_known_cells():
    ds = xr.Dataset({"sim_throughput_mean": ("rate", [1.0, 1.5, 3.9, np.nan, 4.0]),
                     "done": ("rate", [True, True, True, True, False])},
                    coords={"rate": [1.0, 2.0, 4.0, 6.0, 8.0]})
    # 1.5 < 0.95 * 2 is overloaded; 3.9 >= 0.95 * 4 is not; a missing or undone cell is not
    np.testing.assert_array_equal(analysis.overloaded(ds), [False, True, False, False, False])


def test_over_reps_skips_times_no_rep_reached():
    x = np.array([[np.nan, 1.0, 2.0], [np.nan, 3.0, 6.0]])
    np.testing.assert_array_equal(analysis.over_reps(np.mean, x), [np.nan, 2.0, 4.0])
    np.testing.assert_array_equal(analysis.over_reps(np.max, x), [np.nan, 3.0, 6.0])


def test_settling_times(results):
    ds = xr.open_zarr(results / "controller_step.zarr", chunks=None).load()
    got = analysis.settling_times(ds)
    step = float(ds["time"][1] - ds["time"][0])
    assert set(got) == {"spec", "multiplicative"}
    for ctl, late in (("spec", 1.0), ("multiplicative", 1.5)):
        for key, expected, ref in (("up", SETTLE_UP, 12.0), ("down", SETTLE_DOWN, 70.0)):
            dt, median, in_tail = got[ctl][key]
            # the first grid time at or after the change
            assert dt == pytest.approx(math.ceil(late * expected / step) * step), (ctl, key)
            assert median == pytest.approx(ref, rel=0.05)
            assert not in_tail


def test_settling_edge_cases():
    t = np.arange(0.0, 101.0, 10.0)
    flat = np.full(t.size, 5.0)
    assert analysis.settling_time(t, flat, 0.0, 100.0)[:2] == (0.0, 5.0)
    drifting = np.linspace(10.0, 30.0, t.size)  # still rising at the end
    dt, ref, late = analysis.settling_time(t, drifting, 0.0, 100.0)
    assert late and dt >= 80.0
    last_out = flat.copy()
    last_out[-1] = 9.0  # the last sample leaves the band around the tail's median 5
    dt, ref, late = analysis.settling_time(t, last_out, 0.0, 100.0)
    assert math.isnan(dt) and ref == 5.0
