"""The multi-engine figures (mbbatch.figures.cluster)."""

import numpy as np
import xarray as xr

from mbbatch.figures import cluster
from mbbatch.figures.analysis import replication_ci

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS


def test_laps_modes_draws_each_mode_per_mix_and_category(results):  # noqa: F811
    ds = xr.open_zarr(results / "laps.zarr", chunks=None).load()
    fig = cluster.laps_modes({"laps": ds})
    axes = fig.axes
    assert len(axes) == 2 * ds.sizes["prompt_median"]
    ax = axes[0]                                  # short requests, the first mix
    joined = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len(joined) == ds.sizes["policy"]
    first = ds["sim_ttft_short_p99"].sel(policy=ds["policy"].values[0], prompt_median=ds["prompt_median"].values[0])
    want, _ = replication_ci(first.transpose("rate", "rep").values)
    np.testing.assert_allclose(joined[0].get_ydata(), want)
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "one FIFO queue" in labels and "dual queue + window + dynamic allocation" in labels
    assert "% short" in ax.get_title()
