"""mbbatch.figures.paper: the multi-bin paper's figures and its theorems' studies."""

from __future__ import annotations

import pytest
import xarray as xr
from matplotlib.colors import to_rgba

from mbbatch import figures
from mbbatch.figures import paper
from mbbatch.figures.data import servers_label

from .figure_datasets import MARKS, drawn, results  # noqa: F401  (fixtures)

pytestmark = MARKS


@pytest.mark.parametrize("name", paper.__all__)
def test_paper_figure_alone_matches_the_full_run(results, drawn, tmp_path, name):
    """Drawn alone, a figure has the bytes it has among all others: no state leaks."""
    out, _ = drawn
    files = figures.make_figures(results, tmp_path, only=name, formats="png")
    assert [f.name for f in files] == [f"{name}.png"]
    for f in files:
        assert f.read_bytes() == (out / f.name).read_bytes(), f.name


def test_servers_figure_draws_one_lemma_curve_for_every_server_count(results):
    """Lemma 5.1 does not depend on the number of servers: one black curve."""
    ds = xr.open_zarr(results / "servers.zarr", chunks=None).load()
    (ax,) = paper.servers({"servers": ds}).axes
    black = [ln for ln in ax.lines if to_rgba(ln.get_color()) == to_rgba("black")
             and ln.get_linestyle() == "-" and len(ln.get_xdata()) > 100]
    assert len(black) == 1


def test_servers_markers_that_coincide_stay_visible(results):
    """Regression (servers, issue 34): 2, 8 and infinitely many servers have
    the same latency at light load, and their markers sat on top of each
    other.  Each series is drawn smaller than, and over, the one before it,
    so every one shows inside the other; the legend's swatches have the same
    sizes."""
    ds = xr.open_zarr(results / "servers.zarr", chunks=None).load()
    (ax,) = paper.servers({"servers": ds}).axes
    markers = [(c.lines[0], c.lines[0].get_zorder()) for c in ax.containers]
    points = [(x, y, ln.get_markersize(), z, ln.get_color()) for ln, z in markers
              for x, y in zip(ln.get_xdata(), ln.get_ydata())]
    coinciding = 0
    for i, (x, y, size, z, color) in enumerate(points):
        for x2, y2, size2, z2, color2 in points[i + 1:]:
            if color2 != color and x2 == x and abs(y2 / y - 1) < 0.05:
                coinciding += 1
                assert size != size2
                assert (size2 < size) == (z2 > z)    # the smaller one on top
    assert coinciding >= ds.sizes["servers"] - 1
    sizes = {to_rgba(ln.get_color()): ln.get_markersize() for ln, _ in markers}
    names = {servers_label(v) for v in ds["servers"].values}
    entries = [h for leg in [*ax.artists, ax.get_legend()] for h in leg.legend_handles if h.get_label() in names]
    assert len(entries) == ds.sizes["servers"]
    assert all(h.get_markersize() == sizes[to_rgba(h.get_color())] for h in entries)
