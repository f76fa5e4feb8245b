"""The sweep Dataset (mbbatch.sweeps.schema): dimensions, coordinates,
units and descriptions, simulation beside the closed forms."""

import pytest

from mbbatch.results import UnstableWarning
from mbbatch.sweeps import run_sweep

from .helpers import SMALL, write


def test_dataset_schema(tmp_path):
    with pytest.warns(UnstableWarning):
        ds = run_sweep(write(tmp_path, SMALL), tmp_path / "s.zarr", workers=1, progress=False)
    assert dict(ds.sizes) == {"bins": 2, "rate": 3, "rep": 3}
    for dim in ds.dims:
        assert dim in ds.coords
        assert ds[dim].attrs["units"] and ds[dim].attrs["description"]
    for v in ds.data_vars:
        assert ds[v].attrs["units"] and ds[v].attrs["description"] and ds[v].attrs["long_name"], v
    assert ds["sim_throughput"].dims == ("bins", "rate", "rep")
    assert ds["theory_throughput"].dims == ("bins", "rate")
    assert ds["sim_mean_latency_ci_low"].dims == ("bins", "rate")
    for key in ("spec", "spec_hash", "mbbatch_version", "numba_version", "numpy_version",
                "git_commit", "seed_scheme", "seed", "batch_size", "n"):
        assert key in ds.attrs, key
    assert bool(ds["done"].all())
    # simulation beside theory: the stable low-load cells agree (throughput = rate)
    stable = ~ds["unstable"]
    rel = abs(ds["sim_throughput_mean"] - ds["theory_throughput"]) / ds["theory_throughput"]
    assert float(rel.where(stable).max()) < 0.1
    # the mean lies in its CI, the CI is ordered
    assert bool((ds["sim_mean_latency_ci_low"] <= ds["sim_mean_latency_mean"]).all())
    assert bool((ds["sim_mean_latency_mean"] <= ds["sim_mean_latency_ci_high"]).all())
