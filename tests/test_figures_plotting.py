"""mbbatch.figures.plotting (mbbatch.figures.plot) and `mbbatch plot`: any store drawn from its data."""

import numpy as np
import pytest
import xarray as xr

from mbbatch import cli
from mbbatch.figures.plotting import plot, plottable

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS


def _load(results, name):  # noqa: F811
    return xr.open_zarr(results / f"{name}.zarr", chunks=None).load()


def _markers(ax):
    """{(x, y): (low, high, hollow)} of every marker drawn with error bars."""
    out = {}
    for c in ax.containers:
        line, _, (bars,) = c.lines[0], c.lines[1], c.lines[2]
        segs = bars.get_segments()
        for (x, y), seg in zip(zip(line.get_xdata(), line.get_ydata()), segs):
            out[(float(x), float(y))] = (float(seg[0][1]), float(seg[1][1]), line.get_markerfacecolor() == "none")
    return out


def test_a_multibin_store_is_drawn_at_its_means_intervals_and_closed_form(results):  # noqa: F811
    ds = _load(results, "fig3")
    fig = plot(ds, x="rate", y="sim_mean_latency", hue="bins")
    (ax,) = fig.axes
    got = _markers(ax)
    want = {}
    for k in ds["bins"].values:
        c = ds.sel(bins=k)
        for r, m, lo, hi, u in zip(ds["rate"].values, c["sim_mean_latency_mean"].values,
                                   c["sim_mean_latency_ci_low"].values, c["sim_mean_latency_ci_high"].values,
                                   c["unstable"].values):
            if np.isfinite(m):
                want[(float(r), float(m))] = (float(lo), float(hi), bool(u))
    assert set(got) == set(want)
    for key, (lo, hi, hollow) in want.items():
        assert got[key][2] == hollow and got[key][:2] == pytest.approx((lo, hi)), key
    curves = [ln for ln in ax.lines if ln.get_linestyle() == "-" and ln.get_marker() in ("None", "", None)]
    theory = sorted(float(v) for v in ds["theory_latency"].values.ravel() if np.isfinite(v))
    drawn = sorted(float(v) for ln in curves for v in ln.get_ydata() if np.isfinite(v))
    assert drawn == pytest.approx(theory)


@pytest.mark.parametrize("name, kw", [
    ("capacity_latency", dict(x="objective_latency_p95", y="sim_capacity", hue="policy", logx=True)),
    ("laps", dict(x="rate", y="sim_ttft_short_p99", hue="policy", col="prompt_median", logy=True)),
    ("token_policies", dict(x="rate", y="sim_throughput", hue="policy")),
    ("autellix", dict(x="route_threshold", y="sim_ttft_p99", hue="policy", col="calls")),
])
def test_a_store_of_each_kind_is_drawn_from_its_data(results, name, kw):  # noqa: F811
    ds = _load(results, name)
    fig = plot(ds, **kw)
    y = kw["y"]
    mean = ds[f"{y}_mean"] if f"{y}_mean" in ds else ds[y]
    finite = sorted(float(v) for v in mean.values.ravel() if np.isfinite(v))
    drawn = sorted(float(y_) for ax in fig.axes for c in ax.containers for y_ in c.lines[0].get_ydata())
    assert drawn == pytest.approx(finite)
    assert len(fig.axes) == (ds.sizes[kw["col"]] if "col" in kw else 1)
    assert y in plottable(ds)


def test_bad_requests_name_what_to_give(results):  # noqa: F811
    ds = _load(results, "laps")
    with pytest.raises(ValueError, match=r"more than one value along \['prompt_median'\].*--sel prompt_median="):
        plot(ds, x="rate", y="sim_ttft_short_p99", hue="policy")
    with pytest.raises(ValueError, match="x must be an axis of the store"):
        plot(ds, x="bins", y="sim_ttft_short_p99")
    with pytest.raises(ValueError, match="y must be a variable of the store"):
        plot(ds, x="rate", y="sim_speed", hue="policy", col="prompt_median")
    with pytest.raises(ValueError, match="different axes"):
        plot(ds, x="rate", y="sim_ttft_short_p99", hue="rate", col="prompt_median")


def test_the_command_writes_the_image_and_names_a_bad_flag(results, tmp_path, capsys):  # noqa: F811
    store = results / "laps.zarr"
    out = tmp_path / "short.png"
    assert cli.main(["plot", str(store), "--x", "rate", "--y", "sim_ttft_short_p99", "--hue", "policy",
                     "--sel", "prompt_median=256", "--logy", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG") and capsys.readouterr().out.strip() == str(out)
    assert cli.main(["plot", str(store), "--x", "rate", "--y", "sim_ttft_short_p99", "--hue", "policy",
                     "--sel", "prompt_median=7"]) == 2
    assert "--sel: prompt_median has no value '7'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", __import__("mbbatch").registry.KINDS)
def test_a_real_store_of_every_policy_kind_is_drawn_from_its_data(tmp_path, kind):
    """A small sweep of each kind, every setting but the rate at the parameter table's defaults, run
    into a store and drawn: the markers are the store's means, the bars its intervals."""
    from mbbatch.sweeps import run_sweep

    spec = tmp_path / f"{kind}.toml"
    spec.write_text(f'policy = "{kind}"\nreps = 2\n[params]\nn = 2000\n[grid]\nrate = [0.5, 1.0]\n')
    ds = run_sweep(spec, tmp_path / f"{kind}.zarr", workers=1, progress=False).load()
    fig = plot(ds, x="rate", y="sim_throughput")
    (ax,) = fig.axes
    marks = _markers(ax)
    want = {(float(r), float(ds.sim_throughput_mean.sel(rate=r))): (float(ds.sim_throughput_ci_low.sel(rate=r)),
                                                                    float(ds.sim_throughput_ci_high.sel(rate=r)))
            for r in ds.rate.values}
    assert len(marks) == len(want)
    for (x, y), (lo, hi, _) in marks.items():
        w = min(want, key=lambda k: abs(k[0] - x))
        assert (x, y, lo, hi) == pytest.approx((*w, *want[w]))
    assert "requests/s" in ax.get_ylabel()
