"""mbbatch.figures.paper: the multi-bin paper's figures and its theorems' studies."""

from __future__ import annotations

import pytest
import xarray as xr
from matplotlib.colors import to_rgba

from mbbatch import figures
from mbbatch.figures import paper

from .figure_datasets import MARKS, drawn, results  # noqa: F401  (fixtures)

pytestmark = MARKS


@pytest.mark.parametrize("name", paper.__all__)
def test_paper_figure_alone_matches_the_full_run(results, drawn, tmp_path, name):
    """Drawn alone, a figure has the bytes it has among all others: no state leaks."""
    out, _ = drawn
    files = figures.make_figures(results, tmp_path, only=name)
    assert [f.name for f in files] == [f"{name}.png", f"{name}.pdf"]
    for f in files:
        assert f.read_bytes() == (out / f.name).read_bytes(), f.name


def test_servers_figure_draws_one_lemma_curve_for_every_server_count(results):
    """Lemma 5.1 does not depend on the number of servers: one black curve."""
    ds = xr.open_zarr(results / "servers.zarr", chunks=None).load()
    (ax,) = paper.servers({"servers": ds}).axes
    black = [ln for ln in ax.lines if to_rgba(ln.get_color()) == to_rgba("black")
             and ln.get_linestyle() == "-" and len(ln.get_xdata()) > 100]
    assert len(black) == 1
