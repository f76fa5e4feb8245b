"""mbbatch.figures.style: fixed look, deterministic files, the simulation markers."""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.container import ErrorbarContainer

from mbbatch import figures
from mbbatch.figures import style

from .figure_datasets import MARKS, drawn, results  # noqa: F401  (fixtures)

pytestmark = MARKS


def test_no_dates_or_versions_in_files(drawn, results, tmp_path):
    """Neither every figure's PNG nor a PDF (two figures') holds a date or matplotlib's version."""
    _, files = drawn
    pdfs = figures.make_figures(results, tmp_path, only=["fig3", "hardware_fit"], formats="pdf")
    assert [f.name for f in pdfs] == ["fig3.pdf", "hardware_fit.pdf"]
    for f in [*files, *pdfs]:
        data = f.read_bytes()
        assert b"CreationDate" not in data and b"Matplotlib" not in data, f.name


def test_the_users_rc_settings_do_not_change_the_files(results, tmp_path):
    plain = figures.make_figures(results, tmp_path / "plain", only="fig3")
    user = {"font.size": 20, "axes.grid": False, "lines.linewidth": 4, "savefig.dpi": 300,
            "savefig.facecolor": "yellow", "axes.prop_cycle": matplotlib.cycler(color=["k"])}
    with matplotlib.rc_context(user):
        files = figures.make_figures(results, tmp_path / "user", only="fig3")
    assert [f.name for f in files] == [f.name for f in plain] == ["fig3.png", "fig3.pdf"]
    for f, g in zip(files, plain):
        assert f.read_bytes() == g.read_bytes(), f.name


def test_sim_points_filled_hollow_and_clipped():
    """Stable cells filled, unstable hollow, off-scale on the top edge, NaN left out."""
    fig, (ax,) = style.new_figure()
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    mean = np.array([1.0, 2.0, 100.0, np.nan, 3.0])
    unstable = [False, True, False, False, True]
    style.sim_points(ax, x, mean, mean - 0.5, mean + 0.25, unstable, "#123456", "s", clip_top=10.0)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2
    (filled, _, (filled_bars,)), (hollow, _, _) = bars
    np.testing.assert_array_equal(filled.get_xdata(), [1.0])
    assert filled.get_markerfacecolor() == "#123456" and filled.get_marker() == "s"
    # asymmetric bars: 0.5 below, 0.25 above the mean
    np.testing.assert_allclose(filled_bars.get_segments()[0][:, 1], [0.5, 1.25])
    np.testing.assert_array_equal(hollow.get_xdata(), [2.0, 5.0])
    assert hollow.get_markerfacecolor() == "none"
    (edge,) = [ln for ln in ax.lines if ln not in (filled, hollow) and ln.get_marker() == "s"]
    np.testing.assert_array_equal(edge.get_xydata(), [[3.0, 10.0]])
    assert edge.get_markerfacecolor() == "none" and not edge.get_clip_on()


def test_sim_points_without_unstable_bars_and_with_a_size():
    """unstable_bars=False: unstable cells hollow, without bars (the stable ones keep theirs);
    markersize: every marker, on the top edge too, of that size."""
    fig, (ax,) = style.new_figure()
    x = [1.0, 2.0, 3.0]
    mean = np.array([1.0, 2.0, 100.0])
    style.sim_points(ax, x, mean, mean - 0.5, mean + 0.5, [False, True, True], "#123456", "o", clip_top=10.0,
                     unstable_bars=False, markersize=8.0)
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    np.testing.assert_array_equal(bars.lines[0].get_xdata(), [1.0])
    hollow = [ln for ln in ax.lines if ln.get_markerfacecolor() == "none"]
    assert sorted((float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in hollow) == [(2.0, 2.0), (3.0, 10.0)]
    assert all(ln.get_markersize() == 8.0 for ln in hollow + [bars.lines[0]])
