"""mbbatch.figures.plotting (mbbatch.figures.plot) and `mbbatch plot`: any store drawn from its data."""

import io
import re
import shutil

import numpy as np
import pytest
import xarray as xr
from matplotlib.backends.backend_agg import FigureCanvasAgg

from mbbatch import cli, stats
from mbbatch.figures.plotting import plot, plottable
from mbbatch.figures.style import DPI, PNG_METADATA, house_style
from mbbatch.sweeps import SweepError, open_store

from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = [*MARKS, pytest.mark.filterwarnings("ignore::mbbatch.results.UnstableWarning")]

#: Two continuous-batching variants (a text axis, ``policy``) at two rates, two replications: a real
#: store holds every kind of variable (real metrics with their stored intervals; counts and flags per
#: replication: completed, n_batches, preemptions, backlog_growing, sla_infeasible)
TWO_POLICIES = """
name = "two"
arrivals = "poisson"
service_model = "iteration"
reps = 2
seed = 1

[params]
n = 300

[policies.c4]
kind = "continuous"
max_num_seqs = 4

[policies.c16]
kind = "continuous"
max_num_seqs = 16

[grid]
policy = ["c4", "c16"]
rate = [0.5, 1.0]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """TWO_POLICIES run into a store, once, as `mbbatch sweep` writes it: its path."""
    from mbbatch.sweeps import run_sweep

    d = tmp_path_factory.mktemp("two")
    (d / "two.toml").write_text(TWO_POLICIES)
    run_sweep(d / "two.toml", d / "two.zarr", workers=1, progress=False)
    return d / "two.zarr"


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


def test_the_command_writes_the_image_and_names_a_bad_flag(store, tmp_path, capsys):
    """`mbbatch plot` on a real store: the image written and its path printed; a flag naming
    nothing in the store is named with the values it allows, on one line, before anything is drawn."""
    out = tmp_path / "latency.png"
    assert cli.main(["plot", str(store), "--x", "rate", "--y", "sim_mean_latency", "--sel", "policy=c16",
                     "--logy", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG") and capsys.readouterr().out.strip() == str(out)
    base = ["plot", str(store), "--out", str(tmp_path / "never.png")]
    for flags, needle in [
            (["--x", "rate", "--y", "completed", "--sel", "policy=c8"],
             "--sel: policy has no value 'c8'; its values: ['c4', 'c16']"),
            (["--x", "rate", "--y", "completed", "--sel", "rate=0.5"], "--sel: 'rate' is not an axis left to fix"),
            (["--x", "rate", "--y", "completed", "--sel", "bins=2"],
             "--sel: 'bins=2' must be AXIS=VALUE with AXIS one of ['policy', 'rate']"),
            (["--x", "bins", "--y", "completed"], "--x must be an axis of the store, one of ['policy', 'rate']"),
            (["--x", "rate", "--y", "done", "--hue", "policy"], "--y must be a variable of the store that can be "
                                                                "drawn, one of ['backlog_growing', 'completed'"),
            (["--x", "rate", "--y", "sim_throughput_mean", "--hue", "policy"],
             "('sim_throughput' is drawn at its mean with its interval)"),
            (["--x", "rate", "--y", "completed", "--col", "time"], "--col must be an axis of the store"),
            (["--x", "rate", "--y", "completed"], "more than one value along ['policy']: make them hue or col, or "
                                                  "fix them with sel (mbbatch plot --sel policy=c4)")]:
        assert cli.main(base + flags) == 2, flags
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, (flags, err)
    assert not (tmp_path / "never.png").exists()


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


def _png(fig) -> bytes:
    """The figure's PNG, as `mbbatch plot` saves it."""
    buf = io.BytesIO()
    with house_style():
        fig.savefig(buf, format="png", dpi=DPI, metadata=PNG_METADATA)
    return buf.getvalue()


def _as_saved(fig):
    """The window extents of the figure, its legend and its title, rendered as saved (Agg, the PNG's DPI)."""
    fig.set_dpi(DPI)
    with house_style():
        FigureCanvasAgg(fig).draw()
    (legend,), (title,) = fig.legends, fig.texts
    return fig.bbox, legend.get_window_extent(), title.get_window_extent()


@pytest.mark.parametrize("kind", ["T", "U", "S", "O"])
def test_a_text_axis_is_drawn_as_categories_whatever_its_dtype(store, kind):
    """Bug: `mbbatch plot STORE --x policy` failed with "could not convert string to float" on any
    store read back from disk (2,016 of 2,800 calls on a continuous store): a text coordinate,
    written as variable-length strings, reads back under numpy 2 as StringDType (kind 'T'), which
    the test for a categorical axis (kinds 'O', 'U', 'S', 'b') missed, so the axis went to floats.
    Here the store is reopened from disk (kind 'T'), and its policy axis recast to fixed-width text
    ('U'), bytes ('S') and objects ('O'): each is drawn as categories, in the store's order, and
    selected by its text."""
    ds = xr.open_zarr(store, chunks=None)
    if kind == "T":
        assert ds["policy"].dtype.kind == "T"          # the input that triggered the bug
    else:
        ds = ds.assign_coords(policy=np.array([str(v) for v in ds["policy"].values],
                                              dtype={"U": "U3", "S": "S3", "O": object}[kind]))
        assert ds["policy"].dtype.kind == kind
    fig = plot(ds, x="policy", y="sim_throughput", hue="rate")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["c4", "c16"]
    mean = ds["sim_throughput_mean"].values                                # (policy, rate)
    assert set(_markers(ax)) == {(float(i), float(mean[i, j])) for i in range(2) for j in range(2)}
    assert ax.get_xlim() == (-0.5, 1.5)
    fig = plot(ds, x="rate", y="sim_throughput", sel={"policy": "c16"})
    assert sorted(y for _, y in _markers(fig.axes[0])) == pytest.approx(sorted(mean[1]))
    hue = plot(ds, x="rate", y="sim_throughput", hue="policy")
    assert [t.get_text() for t in hue.legends[0].get_texts()][:2] == ["policy = c4", "policy = c16"]


def test_every_offered_y_is_drawn_counts_and_flags_at_their_mean_over_reps(store):
    """Bug: `--y preemptions` (and completed, n_batches, backlog_growing, sla_infeasible, all offered
    by plottable()) failed with "expected one value along 'rep'": a sweep stores a mean and an
    interval over the replications for its real metrics only (sim_X_mean, sim_X_ci_low,
    sim_X_ci_high), and a count or flag has none, so its per-replication values reached the
    drawing.  Every offered y is drawn; a count or flag at its mean over the replications (a
    flag's: the share where it holds) with the t-interval a sweep gives a real metric
    (mbbatch.stats.t_interval at the store's confidence level)."""
    ds = xr.open_zarr(store, chunks=None).load()
    offered = plottable(ds)
    counts = ["backlog_growing", "completed", "n_batches", "preemptions", "sla_infeasible"]
    assert set(counts) <= set(offered)
    level = ds.attrs["confidence_level"]
    for y in offered:
        (ax,) = plot(ds, x="rate", y=y, hue="policy").axes
        assert ax.get_ylabel(), y
        if y not in counts:
            continue
        assert ds[y].dtype.kind in "ib" and f"{y}_mean" not in ds
        want = {}
        for p in ds["policy"].values:
            for r in ds["rate"].values:
                m, lo, hi = stats.t_interval(ds[y].sel(policy=p, rate=r).values.astype(float), level)
                want[(float(r), m)] = (lo, hi)
        got = _markers(ax)
        assert set(got) == set(want), y
        for key, (lo, hi) in want.items():
            assert got[key][:2] == pytest.approx((lo, hi)), (y, key)
    assert "share of replications" in plot(ds, x="rate", y="backlog_growing", hue="policy").axes[0].get_ylabel()


def test_the_saved_legend_and_title_lie_inside_the_figure(store):
    """Bug: every saved plot cut off both ends of its legend: the legend below the panels took up to
    four columns whatever their width, and constrained layout makes room for it below the panels,
    never beside them, so a legend wider than the 6-inch figure (two series and two style entries,
    'simulation: mean and its interval' among them, here) ran past both edges.  Rendered as saved
    (Agg, the PNG's DPI), legend and title lie inside the figure: with short series names (fewer
    columns) and with names too long for one column at 6 inches (a wider figure).  Drawn twice,
    the PNG's bytes are the same."""
    ds = xr.open_zarr(store, chunks=None).load()
    fig = plot(ds, x="rate", y="sim_mean_latency", hue="policy")
    assert fig.get_figwidth() == 6.0
    box, legend, title = _as_saved(fig)
    assert box.x0 <= legend.x0 and legend.x1 <= box.x1 and box.y0 <= legend.y0, (legend, box)
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1, (title, box)
    long = ds.assign_coords(policy=[f"continuous batching, at most {n} running sequences, its KV cache unbounded, "
                                    f"iteration-level admission" for n in (4, 16)])
    fig = plot(long, x="rate", y="sim_mean_latency", hue="policy")
    assert fig.get_figwidth() > 6.0
    box, legend, title = _as_saved(fig)
    assert box.x0 <= legend.x0 and legend.x1 <= box.x1 and box.y0 <= legend.y0, (legend, box)
    assert box.x0 <= title.x0 and title.x1 <= box.x1, (title, box)
    one = plot(ds, x="policy", y="completed", hue="rate")
    assert _png(one) == _png(plot(ds, x="policy", y="completed", hue="rate"))


@pytest.mark.parametrize("how", ["deleted", "flipped"])
def test_a_damaged_store_is_named_not_drawn(store, tmp_path, capsys, how):
    """Bug: a store with a deleted chunk was drawn without those points (zarr reads a missing chunk
    as its fill value: NaN, and `done` False), and one with a flipped byte stopped with zarr's raw
    checksum error, naming no store.  The store is verified as it is opened (mbbatch.sweeps.open_store,
    which `mbbatch plot` opens it with), as `mbbatch check` does: the
    error names the store and points to `mbbatch check STORE`, in Python and on the command line
    (one line, exit status 2, no image).  (The store's 4 points share one chunk per variable.)"""
    out = tmp_path / "damaged.zarr"
    shutil.copytree(store, out)
    chunk = out / "sim_throughput" / "c" / "0" / "0" / "0"
    if how == "deleted":
        chunk.unlink()
    else:
        data = chunk.read_bytes()
        chunk.write_bytes(bytes([data[0] ^ 0x01]) + data[1:])
    with pytest.raises(SweepError, match=rf"{re.escape(str(out))} is damaged, so it is not drawn: 4 grid points "
                                         rf"failed verification \(missing or corrupt chunks of sim_throughput\); "
                                         rf"`mbbatch check {re.escape(str(out))}` names"):
        plot(open_store(out), x="rate", y="sim_throughput", hue="policy")
    image = tmp_path / "never.png"
    assert cli.main(["plot", str(out), "--x", "rate", "--y", "completed", "--hue", "policy",
                     "--out", str(image)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{out} is damaged, so it is not drawn" in err, err
    assert f"`mbbatch check {out}`" in err
    assert not image.exists()


def test_the_layout_a_store_records_is_the_one_its_spec_makes(store):
    """`mbbatch plot` verifies a store on the layout its own metadata records (store.stored_layout),
    not the one its spec makes (what `mbbatch check` parses, which fails on a store whose spec the
    running mbbatch cannot read): on a store it can, the two agree, variable for variable."""
    from mbbatch.sweeps import parse_spec, store as stores
    from mbbatch.sweeps.run import _layout

    spec = parse_spec(stores.stored_attrs(store)["spec"], source="two.toml")
    names, coords = _layout(spec)
    shape, stored_names, stored_coords = stores.stored_layout(store)
    assert shape == spec.shape and sorted(stored_names) == sorted(n for n in names if n != "done")
    assert set(stored_coords) == set(coords)
    for name, values in coords.items():
        np.testing.assert_array_equal(np.asarray(stored_coords[name]).astype(np.asarray(values).dtype), values)
