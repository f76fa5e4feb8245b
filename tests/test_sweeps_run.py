"""Running sweeps (mbbatch.sweeps.run and .executors): resume after a real
kill, bit-identity across serial, process-pool and dask runs, unstable
cells, token-policy sweeps and their time series."""

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.stats as st
import xarray as xr

from mbbatch.results import UnstableWarning
import mbbatch as mb
from mbbatch import stats
from mbbatch.metrics import applicable
from mbbatch.sweeps import StoreNote, SweepError, run_sweep, run_sweeps
from mbbatch.sweeps.cells import point_objects
from mbbatch.sweeps.spec import SpecError, load_spec

from .helpers import SLOW, SMALL, TOKEN, assert_identical, cli_run, start_sweep, write

@pytest.mark.filterwarnings("ignore::mbbatch.results.UnstableWarning")
def test_adding_grid_values_never_changes_a_cell(tmp_path):
    small = run_sweep(write(tmp_path, SMALL), tmp_path / "a.zarr", workers=1, progress=False)
    bigger_text = SMALL.replace("rate = [0.2, 0.5, 2.0]", "rate = [0.1, 0.2, 0.5, 2.0]").replace(
        "bins = [1, 3]", "bins = [1, 2, 3]")
    big = run_sweep(write(tmp_path, bigger_text, "b.toml"), tmp_path / "b.zarr", workers=1, progress=False)
    sub = big.sel(rate=small.rate, bins=small.bins)
    for v in ("sim_throughput", "sim_mean_latency", "sim_latency_p99", "completed"):
        np.testing.assert_array_equal(sub[v].values, small[v].values)


def test_unstable_cells_are_flagged(tmp_path):
    with pytest.warns(UnstableWarning, match="no steady state"):
        ds = run_sweep(write(tmp_path, SMALL), tmp_path / "s.zarr", workers=1, progress=False)
    # B = 8, U(1, 20): k = 1 serves 8 / E[max of 8] = 0.44 requests/s
    over = ds["rate"] >= ds["theory_service_rate"]
    assert bool((ds["unstable"] | ~over).all())
    assert bool(ds["unstable"].sel(bins=1, rate=2.0))
    assert not bool(ds["unstable"].sel(bins=3, rate=0.2))


def test_netcdf_export(tmp_path):
    nc = tmp_path / "s.nc"
    with pytest.warns(UnstableWarning):
        ds = run_sweep(write(tmp_path, SMALL), tmp_path / "s.zarr", workers=1, progress=False, netcdf=nc)
    back = xr.open_dataset(nc)
    np.testing.assert_array_equal(back["sim_throughput"].values, ds["sim_throughput"].values)


# --- storage that loses nothing ---------------------------------------------------

def test_rerun_of_a_finished_sweep_does_no_work(tmp_path, monkeypatch):
    p, out = write(tmp_path, SMALL), tmp_path / "s.zarr"
    with pytest.warns(UnstableWarning):
        first = run_sweep(p, out, workers=1, progress=False).load()
    import mbbatch.sweeps.run as sweep

    def boom(*args, **kwargs):
        raise AssertionError("a finished sweep computed a cell")

    monkeypatch.setattr(sweep, "_point_task", boom)
    with pytest.warns(UnstableWarning):
        again = run_sweep(p, out, workers=1, progress=False)
    assert_identical(first, again)


def test_changed_spec_is_an_error_unless_overwrite(tmp_path):
    p, out = write(tmp_path, SMALL), tmp_path / "s.zarr"
    with pytest.warns(UnstableWarning):
        run_sweep(p, out, workers=1, progress=False)
    changed = write(tmp_path, SMALL.replace("n = 4000", "n = 5000"), "changed.toml")
    with pytest.raises(SweepError, match=r"params\.n: 4000 -> 5000"):
        run_sweep(changed, out, workers=1, progress=False)
    ds = xr.open_zarr(out)
    assert int(ds.attrs["n"]) == 4000 and bool(ds["done"].all())   # nothing stored was lost
    with pytest.warns(UnstableWarning):
        ds = run_sweep(changed, out, workers=1, progress=False, overwrite=True)
    assert int(ds.attrs["n"]) == 5000


def test_half_written_point_is_recomputed(tmp_path):
    """A point whose data chunks were written but not its done flag (a kill
    between the two) is recomputed on resume, and ends as if never lost."""
    p, out = write(tmp_path, SMALL), tmp_path / "s.zarr"
    with pytest.warns(UnstableWarning):
        ref = run_sweep(p, out, workers=1, progress=False).load()
    region = {"bins": slice(1, 2), "rate": slice(0, 1)}
    xr.Dataset({"done": (("bins", "rate"), np.zeros((1, 1), bool))}).to_zarr(out, region=region)
    garbage = np.full((1, 1, 3), -5.0)
    xr.Dataset({"sim_throughput": (("bins", "rate", "rep"), garbage)}).to_zarr(
        out, region={**region, "rep": slice(None)})
    with pytest.warns(UnstableWarning):
        again = run_sweep(p, out, workers=1, progress=False)
    assert_identical(ref, again)


@pytest.mark.heavy
def test_resume_after_kill_is_bit_identical(tmp_path):
    """kill -9 a real `mbbatch sweep` process mid-sweep, start it again: it
    computes only the missing points and ends bit-identical to an
    uninterrupted run.  (Long enough that points are stored in several
    batches, FLUSH_SECONDS apart, before the sweep ends: SLOW alone took 2.3
    s on a fast machine, all its points stored in one batch, at the end.)"""
    p = write(tmp_path, SLOW.replace("n = 4000000", "n = 12000000"))
    out = tmp_path / "killed.zarr"
    proc = start_sweep(p, out, workers=1, points=3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ds = xr.open_zarr(out)
    n_before = int(ds["done"].sum())
    assert 3 <= n_before < ds["done"].size

    import mbbatch.sweeps.run as sweep

    computed = []
    real = sweep._point_task
    try:
        sweep._point_task = lambda *a: computed.append(a) or real(*a)
        with pytest.warns(UnstableWarning), pytest.warns(StoreNote, match=f"lock of process {proc.pid}"):
            resumed = run_sweep(p, out, workers=1, progress=False).load()
    finally:
        sweep._point_task = real
    assert len(computed) == ds["done"].size - n_before
    with pytest.warns(UnstableWarning):
        clean = run_sweep(p, tmp_path / "clean.zarr", workers=1, progress=False).load()
    assert_identical(clean, resumed)


def _children(pid):
    """Live (non-zombie) processes whose parent is ``pid``, from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.heavy
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the pool's workers in /proc")
def test_killed_sweep_leaves_no_workers_behind(tmp_path):
    """kill -9 a sweep running on a 2-process pool: its workers exit as well,
    rather than wait forever on the dead sweep's queues."""
    proc = start_sweep(write(tmp_path, SLOW), tmp_path / "killed.zarr", workers=2, points=1)
    workers = [k for k in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(k) for k in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [k for k in workers if _alive(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert not left, "workers still running a minute after their sweep was killed"


@pytest.mark.heavy
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the pool's workers in /proc")
def test_ctrl_c_stops_a_pool_sweep_cleanly(tmp_path):
    """Ctrl-C (SIGINT to the job's process group) on a 2-process sweep: it
    stops within seconds with exit status 130 and one line on how to resume
    (no traceback), leaves no worker behind and keeps the finished points."""
    out = tmp_path / "int.zarr"
    proc = start_sweep(write(tmp_path, SLOW), out, workers=2, points=1, session=True)
    workers = _children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 30
    while any(_alive(k) for k in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(k) for k in workers)
    assert int(xr.open_zarr(out)["done"].sum()) >= 1


@pytest.mark.heavy
def test_ctrl_c_to_the_sweep_process_alone_stops_its_workers_too(tmp_path):
    """Ctrl-C sent to the sweep's process only (kill -INT PID, not its group): the workers, which did
    not get it, are ended at once instead of finishing their points (a capacity sweep took 9 to 20 s
    to stop): exit 130 within a few seconds, no worker left, the finished points kept."""
    out = tmp_path / "int.zarr"
    proc = start_sweep(write(tmp_path, SLOW), out, workers=2, points=1, session=True)
    workers = _children(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "run the same command again to resume" in err, err
    assert time.monotonic() - t0 < 5.0
    deadline = time.monotonic() + 5
    while any(_alive(k) for k in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(k) for k in workers)
    assert int(xr.open_zarr(out)["done"].sum()) >= 1


@pytest.mark.heavy
def test_serial_parallel_and_dask_are_bit_identical(tmp_path):
    """In-process, a 2-process pool and a real dask LocalCluster on loopback
    with 2 workers give the same Dataset, bit for bit."""
    p = write(tmp_path, SMALL)
    with pytest.warns(UnstableWarning):
        serial = run_sweep(p, tmp_path / "serial.zarr", workers=1, progress=False).load()
        pool = run_sweep(p, tmp_path / "pool.zarr", workers=2, progress=False).load()
        dask = run_sweep(p, tmp_path / "dask.zarr", scheduler="local", workers=2, progress=False).load()
    assert_identical(serial, pool)
    assert_identical(serial, dask)


@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore::mbbatch.results.UnstableWarning")
def test_sweeps_on_one_pool_overlap_and_equal_each_run_alone(tmp_path, capsys):
    """Several specs on a 2-process pool are all submitted at once (the
    workers compute the next sweeps while a store is written): each store
    equals its sweep run alone in-process, bit for bit; a finished store
    among them is resumed (nothing computed); the run ends with one line for
    all of them."""
    small = write(tmp_path, SMALL, "small.toml")
    tok = write(tmp_path, TOKEN.format(policy="static", arrivals="poisson", extra="",
                                       grid="batch_size = [4, 16]\nrate = [0.5, 2.0]"), "tok.toml")
    step = write(tmp_path, TOKEN.format(policy="dynamic", arrivals="step",
                                        extra="b_max = 64\nrate = 0.5\nrate_high = 2.0\nt_up = 500.0\nt_down = 1000.0",
                                        grid="controller = [\"spec\", \"multiplicative\"]").replace(
        'name = "tok"', 'name = "step"'), "step.toml")
    alone = {p.stem: run_sweep(p, tmp_path / "alone" / f"{p.stem}.zarr", workers=1, progress=False).load()
             for p in (small, tok, step)}
    run_sweeps([tok], tmp_path / "pool", workers=1, progress=False)            # finished before
    runs = run_sweeps([small, tok, step], tmp_path / "pool", workers=2, progress=True)
    for (ds, summary), stem in zip(runs, ["small", "tok", "step"]):
        assert_identical(alone[stem], ds.load())
        assert summary.overlapped
    assert [s.points for _, s in runs] == [6, 0, 2]
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("3 sweeps: 8 grid points,") and "in the kernels per process (2)" in err[-1], err[-1]


@pytest.mark.filterwarnings("ignore::mbbatch.results.UnstableWarning")
@pytest.mark.parametrize("policy, extra, grid", [
    ("static", "", "batch_size = [4, 16]\nrate = [0.5, 2.0]"),
    ("dynamic", "b_max = 64", "rate = [0.5, 2.0]\nmemory = [\"l0\", \"clt\", \"off\"]"),
    ("multibin_dynamic", "b_max = 64\nwarmup = 200", "bins = [1, 3]\nrate = [0.5, 2.0]"),
])
def test_token_sweeps(tmp_path, policy, extra, grid):
    text = TOKEN.format(policy=policy, arrivals="poisson", extra=extra, grid=grid)
    ds = run_sweep(write(tmp_path, text), tmp_path / "t.zarr", workers=1, progress=False)
    for v in ("sim_throughput", "sim_sla_violation_tokens", "sim_mean_batch_size", "sim_memory_peak",
              "sim_latency_p95_mean", "unstable", "done"):
        assert ds[v].attrs["units"] is not None and ds[v].attrs["description"], v
    assert bool(ds["done"].all())
    assert int(ds["completed"].sum()) == 1500 * ds["completed"].size - int(ds["rejected"].sum())
    assert "theory_throughput" not in ds            # no closed forms for these policies
    # every real metric stored per replication has its mean and 95% t-interval over them (issue: two did)
    reals = [v for v in ds.data_vars if v.startswith("sim_") and "rep" in ds[v].dims]
    assert set(reals) == {m.var for m in applicable(policy).values() if m.aggregated} and len(reals) > 15
    for v in reals:
        assert {f"{v}_mean", f"{v}_ci_low", f"{v}_ci_high"} <= set(ds.data_vars), v
        x = ds[v].values
        mean, lo, hi = (ds[f"{v}_{s}"].values for s in ("mean", "ci_low", "ci_high"))
        for idx in np.ndindex(mean.shape):
            want = stats.t_interval(x[idx])
            np.testing.assert_array_equal([mean[idx], lo[idx], hi[idx]], want, err_msg=v)
    assert not any(v.endswith("_mean_mean") for v in ds.data_vars)
    if policy == "dynamic":
        assert int(ds["mem_exceed_batches"].sel(memory=["l0", "clt"]).sum()) == 0


@pytest.mark.filterwarnings("ignore::mbbatch.results.UnstableWarning")
def test_a_specs_confidence_sets_every_interval(tmp_path):
    """``confidence = 0.8``: every stored t-interval is the 80% one, and the store says so."""
    text = SMALL.replace("reps = ", "confidence = 0.8\nreps = ")
    ds = run_sweep(write(tmp_path, text), tmp_path / "c.zarr", workers=1, progress=False)
    assert ds.attrs["confidence_level"] == 0.8
    assert ds["sim_latency_p99_ci_low"].attrs["description"].startswith("80% t-interval")
    for v in ("sim_throughput", "sim_latency_p99", "sim_utilization"):
        x = ds[v].values
        for idx in np.ndindex(x.shape[:-1]):
            _, lo, hi = stats.t_interval(x[idx], 0.8)
            assert (float(ds[f"{v}_ci_low"].values[idx]), float(ds[f"{v}_ci_high"].values[idx])) == (lo, hi)


def test_load_step_sweep_stores_time_series(tmp_path):
    text = TOKEN.format(policy="dynamic", arrivals="step",
                        extra="b_max = 64\nrate = 0.5\nrate_high = 2.0\nt_up = 500.0\nt_down = 1000.0",
                        grid="controller = [\"spec\", \"multiplicative\"]")
    ds = run_sweep(write(tmp_path, text), tmp_path / "s.zarr", workers=1, progress=False)
    assert ds["ts_b_target"].dims == ("controller", "rep", "time")
    assert float(ds["time"].max()) == pytest.approx(1500.0)
    assert ds["time"].attrs["units"] == "s"
    assert int(np.isfinite(ds["ts_tau_avg"].values).sum()) > 0


# --- the warning filters ----------------------------------------------------------

def test_a_sweep_leaves_the_warning_filters_as_it_found_them(tmp_path):
    """`warnings.catch_warnings` is not thread-safe: no thread of a sweep but
    the caller's may change the filters (the replications' helper thread, or a
    dask worker's, once could leave UnstableWarning ignored for the rest of
    the process)."""
    p = write(tmp_path, SMALL)
    run_sweep(p, tmp_path / "first.zarr", workers=1, progress=False)   # (libraries' own first-use filters)
    before = list(warnings.filters)
    for i in range(3):
        run_sweep(p, tmp_path / f"{i}.zarr", workers=1, progress=False)
        assert warnings.filters == before


# --- a trace's requests in a sweep ---------------------------------------------------

TRACE_SPEC = """
name = "replay"
description = "a trace replayed at several scales"
policy = "multibin"
arrivals = "trace"
service_model = "max"
reps = {reps}
seed = 11

[workload]
trace = "{trace}"
format = "azure"

[params]
n = {n}
base = 0.5
per_token = 0.02
servers = 4
batch_size = 8

[grid]
bins = [1, 2, 4]
scale = {scales}
"""


def _trace_file(folder, rows=2000, seed=0):
    """A synthetic trace in the Azure layout: seconds, prompt and output lengths."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0, rows))
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{x:.6f},{p},{o}" for x, p, o in zip(t, rng.integers(10, 2000, rows), rng.integers(1, 500, rows))]
    path = folder / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _trace_spec(folder, trace="trace.csv", n=2000, reps=2, scales="[0.5, 1.0, 2.0]"):
    p = folder / "replay.toml"
    p.write_text(TRACE_SPEC.format(trace=trace, n=n, reps=reps, scales=scales))
    return p


def test_a_trace_sweep_replays_it_at_each_scale_and_records_the_file(tmp_path):
    """The [workload] trace's arrivals at each scale, its lengths under the
    max model; throughput follows the replay's rate where the system keeps
    up; the store records the file's name, size and SHA-256."""
    import hashlib

    path = _trace_file(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnstableWarning)
        ds = run_sweep(_trace_spec(tmp_path), tmp_path / "s.zarr", workers=1, progress=False).load()
    thr = ds["sim_throughput_mean"].sel(bins=4)
    rate = mb.traces.load_azure_trace(path).rate
    np.testing.assert_allclose(thr.sel(scale=0.5), 0.5 * rate, rtol=0.05)
    assert ds.attrs["trace_file"] == "trace.csv" and ds.attrs["trace_size"] == path.stat().st_size
    assert ds.attrs["trace_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_trace_is_found_beside_the_spec_or_in_the_data_folder(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    _trace_file(data)
    specs = tmp_path / "specs"
    specs.mkdir()
    p = _trace_spec(specs)
    with pytest.raises(SpecError,
                       match=r"no trace file 'trace.csv'.*github.com/Azure/AzurePublicDataset.*MBBATCH_DATA"):
        load_spec(p)
    monkeypatch.setenv("MBBATCH_DATA", str(data))
    assert load_spec(p).trace["path"] == str((data / "trace.csv").resolve())


def test_a_killed_trace_sweep_resumes_bit_identical_and_refuses_a_changed_file(tmp_path):
    """kill -9 a real trace sweep mid-run (the trace tiled to n): resumed, it
    equals an uninterrupted run; a store made from another file is refused."""
    path = _trace_file(tmp_path)
    p = _trace_spec(tmp_path, n=6_000_000, reps=3, scales="[0.5, 1.0, 1.5, 2.0]")
    out = tmp_path / "killed.zarr"
    proc = start_sweep(p, out, workers=1, points=2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = run_sweep(p, out, workers=1, progress=False).load()
        clean = run_sweep(p, tmp_path / "clean.zarr", workers=1, progress=False).load()
    assert_identical(clean, resumed)
    path.write_text(path.read_text().replace("\n1", "\n2", 1))
    with pytest.raises(SweepError, match="is not the file"):
        run_sweep(p, out, workers=1, progress=False)


FILTER_SPEC = TRACE_SPEC.replace("[grid]\nbins = [1, 2, 4]\nscale = {scales}", """[grid]
bins = [2]
window_end = [600.0, inf]
drop_failed = [false, true]""")


def test_trace_filters_are_grid_axes_and_each_point_replays_its_filtered_trace(tmp_path):
    """window_end and drop_failed as grid axes: each point replays the trace
    its loader call gives (the window, the failed requests dropped or not),
    equal bit for bit to simulating that trace directly with the cell's seed;
    the store says which filters are axes."""
    from mbbatch.sweeps.cells import cell_seed

    path = _trace_file(tmp_path)
    lines = path.read_text().splitlines()
    # every 7th request failed (no output token)
    lines = lines[:1] + [",".join(row.split(",")[:2] + ["0"]) if i % 7 == 0 else row
                         for i, row in enumerate(lines[1:])]
    path.write_text("\n".join(lines) + "\n")
    spec_path = tmp_path / "filters.toml"
    spec_path.write_text(FILTER_SPEC.format(trace="trace.csv", n=1500, reps=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = run_sweep(spec_path, tmp_path / "f.zarr", workers=1, progress=False).load()
    assert ds["drop_failed"].dtype == bool and list(ds["window_end"].values) == [600.0, np.inf]
    assert json.loads(ds.attrs["trace_filters"]) == {"grid axes": ["window_end", "drop_failed"]}
    assert "trace_requests" not in ds.attrs
    spec = load_spec(spec_path)
    sizes = set()
    for idx, params in spec.points():
        window = None if params["window_end"] == np.inf else (0.0, params["window_end"])
        trace = mb.traces.load_azure_trace(path, window=window, drop_failed=params["drop_failed"])
        sizes.add(len(trace))
        for rep in range(spec.reps):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = mb.simulate(mb.MultiBin(bins=2, batch_size=8), arrivals=mb.Replay(trace),
                                  workload=mb.Workload.from_trace(trace),
                                  service_model=mb.MaxModel(base=0.5, per_token=0.02), n=1500, servers=4,
                                  seed=cell_seed(spec.seed, params, rep))
            cell = ds.isel(window_end=idx[1], drop_failed=idx[2], bins=0, rep=rep)
            assert float(cell["sim_throughput"]) == res.throughput
            assert float(cell["sim_mean_latency"]) == res.mean_latency
    assert len(sizes) == 4, sizes


def test_filters_that_leave_no_request_are_a_spec_error(tmp_path):
    """A window past the trace's last request, without n: the spec's default n (the filtered trace's
    length) cannot be read, and the spec is refused naming its file (it once escaped as the loader's
    bare ValueError)."""
    _trace_file(tmp_path)
    text = TRACE_SPEC.format(trace="trace.csv", n=100, reps=1, scales="[1.0]").replace("n = 100\n", "").replace(
        "base = 0.5", "base = 0.5\nwindow_start = 1e9")
    p = tmp_path / "empty.toml"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"empty.toml: .*trace.csv: the filters leave no requests"):
        load_spec(p)


def test_trace_filters_are_refused_in_the_workload_table(tmp_path):
    _trace_file(tmp_path)
    text = TRACE_SPEC.format(trace="trace.csv", n=100, reps=1, scales="[1.0]").replace(
        'format = "azure"', 'format = "azure"\nwindow = [0.0, 100.0]')
    p = tmp_path / "w.toml"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"workload: window is a parameter: set window_start and window_end"):
        load_spec(p)
    p.write_text(FILTER_SPEC.format(trace="trace.csv", n=100, reps=1).replace(
        "window_end = [600.0, inf]", "window_end = [600.0, inf]\nwindow_start = [0.0, 700.0]"))
    with pytest.raises(SpecError, match="window_end must be after window_start at every grid point"):
        load_spec(p)


# --- capacity searches as sweeps ---------------------------------------------------------

CAPACITY_SPEC = """
name = "capk"
description = "capacity vs k"
policy = "multibin"
arrivals = "poisson"
service = "uniform"
seed = 5

[params]
batch_size = 64
l_min = 1.0
l_max = 20.0
n = 30000

[grid]
bins = [1, 3]
servers = [1, 2]

[capacity]
rel_tol = 0.01
searches = 2
"""


def test_a_capacity_sweep_stores_each_points_search_beside_theorem_4_2(tmp_path):
    """`[capacity]`: two searches per grid point, each near servers x B /
    E[t_service] (Theorem 4.2), the first one's bracket holding it; the
    capacity's interval over the searches around their mean; the probes and
    requests are stored; the Dataset has no rep dimension."""
    ds = run_sweep(write(tmp_path, CAPACITY_SPEC), tmp_path / "c.zarr", workers=1, progress=False).load()
    assert "rep" not in ds.dims and set(ds.dims) == {"bins", "servers"}
    thm = ds["theory_service_rate"]
    assert bool(((ds["sim_capacity_bracket_low"] <= thm) & (thm <= ds["sim_capacity_bracket_high"])).all())
    assert float(abs(ds["sim_capacity"] / thm - 1).max()) <= 0.01
    inside = (ds["sim_capacity_ci_low"] < ds["sim_capacity"]) & (ds["sim_capacity"] < ds["sim_capacity_ci_high"])
    assert bool(inside.all())
    assert bool((ds["capacity_probes"] >= 3).all() and (ds["capacity_requests"] > 0).all())
    assert bool(ds["capacity_resolved"].all()) and bool(ds["done"].all())


def test_a_capacity_sweep_resumes_and_is_the_same_serial_or_parallel(tmp_path):
    """Points marked not done are searched again on resume, equal bit for
    bit; two worker processes give the same store as one."""
    import zarr

    p = write(tmp_path, CAPACITY_SPEC)
    ref = run_sweep(p, tmp_path / "a.zarr", workers=1, progress=False).load()
    par = run_sweep(p, tmp_path / "b.zarr", workers=2, progress=False).load()
    assert_identical(ref, par)
    done = zarr.open_array(str(tmp_path / "a.zarr"), path="done", mode="r+")
    flags = done[...]
    flags[0, 1] = flags[1, 0] = False
    done[...] = flags
    resumed = run_sweep(p, tmp_path / "a.zarr", workers=1, progress=False).load()
    assert_identical(ref, resumed)


def test_a_capacity_sweep_replays_a_trace_at_the_rates_it_searches(tmp_path):
    """arrivals = "trace" in a capacity spec: the search scales the trace's
    arrival times (no scale is given) and stores what find_capacity finds
    on the same replay, with the cell's seed."""
    from mbbatch.sweeps.cells import _words, cell_seed, point_objects

    # (700 requests: a probe of 2 bins of 8 on 4 servers takes 640 at least)
    trace = _trace_file(tmp_path, rows=700)
    text = TRACE_SPEC.format(trace="trace.csv", n=700, reps=1, scales="[1.0]")
    text = text.replace("reps = 1\n", "").replace("scale = [1.0]", "").replace("bins = [1, 2, 4]", "bins = [1, 2]")
    p = write(tmp_path, text + "\n[capacity]\nrel_tol = 0.05\nmax_reps = 4\n")
    ds = run_sweep(p, tmp_path / "c.zarr", workers=1, progress=False).load()
    assert bool(ds["done"].all()) and set(ds.dims) == {"bins"}
    spec = load_spec(p)
    times = mb.traces.load_azure_trace(trace).arrival
    for (i,), params in spec.points():
        pol, arr, kw = point_objects(spec.arrivals, spec.service, {**params, "scale": 1.0})
        assert isinstance(arr, mb.Replay) and np.array_equal(arr.times, times)
        ref = mb.find_capacity(pol, arrivals=arr, servers=4, n=700, rel_tol=0.05, max_reps=4,
                               seed=cell_seed(spec.seed, params, 0, _words(params)), **kw)
        assert ds["sim_capacity"].values[i] == ref.rate > 0
        assert ds["capacity_probes"].values[i] == ref.n_probes


def test_the_capacity_command_runs_capacity_specs_only(tmp_path):
    r = cli_run("capacity", write(tmp_path, SMALL), "--out", tmp_path / "s.zarr")
    assert r.returncode != 0 and "no [capacity] table" in r.stderr
    r = cli_run("capacity", write(tmp_path, CAPACITY_SPEC, "c.toml"), "--out", tmp_path / "c.zarr", "--workers", "1",
                "--quiet")
    assert r.returncode == 0 and "capk: 4 grid points done" in r.stdout, r.stderr
    # then each search, one line a grid point, as stored
    ds = xr.open_zarr(tmp_path / "c.zarr").load()
    lines = r.stdout.splitlines()[1:]
    want = [f"  bins={k}, servers={c}: {ds['sim_capacity'].values[i, j]:.4g} requests/s "
            f"[{ds['sim_capacity_ci_low'].values[i, j]:.4g}, {ds['sim_capacity_ci_high'].values[i, j]:.4g}]"
            + ("" if ds["capacity_resolved"].values[i, j] else "  (unresolved: probes undecided at the cap)")
            for i, k in enumerate(ds["bins"].values) for j, c in enumerate(ds["servers"].values)]
    assert lines == want, r.stdout


# --- LAPS as a sweep policy --------------------------------------------------------------

LAPS_SPEC = """
name = "lapsweep"
arrivals = "poisson"
reps = 2
seed = 4

[params]
prompt_median = 200.0
prompt_sigma = 1.0
output_median = 64.0
output_sigma = 0.8
instances = 3
n = 3000

[policies.fifo]
kind = "laps"
dual_queue = false
dynamic = false
[policies.laps]
kind = "laps"

[grid]
policy = ["fifo", "laps"]
rate = [20.0, 60.0]
"""


def test_a_laps_sweep_stores_what_simulate_returns_for_each_cell(tmp_path):
    """policy laps with its prefill model (the default service model of a
    LAPS spec): each cell's stored metrics are those of mb.simulate with the
    cell's seed, bit for bit; the variants see the same requests."""
    from mbbatch.sweeps.cells import cell_seed

    p = write(tmp_path, LAPS_SPEC)
    ds = run_sweep(p, tmp_path / "l.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    assert spec.service_model == "prefill" and "servers" not in ds.attrs
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=200.0), output=st.lognorm(0.8, scale=64.0))
    for idx, params in spec.points():
        pol = mb.LAPS(instances=3, dual_queue=params["dual_queue"], dynamic=params["dynamic"])
        for rep in range(spec.reps):
            res = mb.simulate(pol, arrivals=mb.Poisson(params["rate"]), workload=wl, n=3000,
                              seed=cell_seed(spec.seed, params, rep))
            cell = ds.isel(policy=idx[0], rate=idx[1], rep=rep)
            assert float(cell["sim_ttft_short_p99"]) == res.ttft_short_p99
            assert float(cell["sim_mean_ttft_long"]) == res.mean_ttft_long
            assert int(cell["group_moves"]) == res.group_moves
    share = ds["sim_short_share"]
    np.testing.assert_array_equal(share.sel(policy="fifo").values, share.sel(policy="laps").values)


def test_laps_and_its_prefill_model_go_together(tmp_path):
    with pytest.raises(SpecError, match=r"policy laps takes service_model = \"prefill\""):
        load_spec(write(tmp_path, LAPS_SPEC.replace('arrivals = "poisson"', 'arrivals = "poisson"\n'
                                                    'service_model = "decode"')))
    with pytest.raises(SpecError, match=r"unknown key params.servers"):
        load_spec(write(tmp_path, LAPS_SPEC.replace("instances = 3", "instances = 3\nservers = 2"), "s.toml"))


def test_a_laps_load_step_stores_its_groups_over_time(tmp_path):
    """Through a load step a LAPS store keeps the instances of each group
    over time (and not the token policies' controller series): at each grid
    time, the value in force in mb.simulate's time series with the cell's
    seed (NaN before the first arrival), the two groups summing to the
    instances; NaN throughout for a variant without groups."""
    from mbbatch.sweeps.cells import cell_seed
    from mbbatch.sweeps.schema import time_grid

    text = (LAPS_SPEC.replace('arrivals = "poisson"', 'arrivals = "step"')
            .replace("n = 3000", "n = 3000\nrate_high = 80.0\nt_up = 20.0\nt_down = 40.0")
            .replace("rate = [20.0, 60.0]", "rate = [30.0]"))
    p = write(tmp_path, text)
    ds = run_sweep(p, tmp_path / "l.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    assert ds["ts_short_instances"].dims == ("policy", "rate", "rep", "time")
    assert ds["ts_short_instances"].attrs["units"] == "instances"
    assert "ts_b_target" not in ds
    t = time_grid(spec)
    np.testing.assert_array_equal(ds["time"].values, t)
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=200.0), output=st.lognorm(0.8, scale=64.0))
    moved = 0
    for idx, params in spec.points():
        pol = mb.LAPS(instances=3, dual_queue=params["dual_queue"], dynamic=params["dynamic"])
        arr = mb.PiecewisePoisson(rates=[30.0, 80.0, 30.0], ends=[20.0, 40.0])
        for rep in range(spec.reps):
            res = mb.simulate(pol, arrivals=arr, workload=wl, n=3000, seed=cell_seed(spec.seed, params, rep))
            cell = ds.isel(policy=idx[0], rate=idx[1], rep=rep)
            ts = res.time_series_columns()
            if not pol.routed:          # one queue, or no dynamic allocation: no groups, no series
                assert ts is None and np.isnan(cell["ts_short_instances"].values).all()
                continue
            at = np.searchsorted(ts["time"], t, side="right") - 1
            want = np.where(at >= 0, ts["short_instances"][np.maximum(at, 0)], np.nan)
            np.testing.assert_array_equal(cell["ts_short_instances"].values, want)
            got = cell["ts_short_instances"].values + cell["ts_long_instances"].values
            assert np.all((got == 3) | np.isnan(got)) and np.isnan(got[0]) and not np.isnan(got[-1])
            moved += res.group_moves
    assert moved > 0            # the dynamic variant moved instances: the series is not constant


# --- a trace's sessions as a cluster's programs ---------------------------------------------

#: the memory a cell with eta = 180000 tokens builds (1 GB a token, a 1 GB model)
CELL_MEMORY = dict(m_max_gb=180001.0, m_model_gb=1.0, kv_mem_per_token_gb=1.0)

SESSIONS_SPEC = """
name = "sess"
arrivals = "trace"
service_model = "decode"
reps = 1
seed = 6

[workload]
trace = "burst.csv"
format = "burstgpt"

[params]
d_sla = 0.0075
b_max = 32
eta = 180000.0
prefill_per_token = 0.0001
engines = 3
route_threshold = 400
n = {n}
{extra}

[policies.autellix]
kind = "cluster"
router = "autellix"
[policies.least_used]
kind = "cluster"
router = "least_used"

[grid]
policy = ["autellix", "least_used"]
{grid}
"""


def _burst_sessions(tmp_path, rows=240):
    """A BurstGPT file of ``rows`` calls: 30 sessions whose prompts grow by
    the previous call's prompt and output (a stateless API's calls), every
    fifth call without a session."""
    rng = np.random.default_rng(3)
    lines = ["Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    context = {}
    for i in range(rows):
        sid = "" if i % 5 == 0 else f"s{rng.integers(30)}"
        new, out = int(rng.integers(20, 400)), int(rng.integers(1, 120))
        prompt = context.get(sid, 0) + new if sid else new
        if sid:
            context[sid] = prompt + out
        lines.append(f"{0.05 * i:.2f},{sid},1.0,ChatGPT,{prompt},{out},{prompt + out},Conversation log")
    p = tmp_path / "burst.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("context", ["included", "added"])
def test_a_cluster_sweep_takes_a_traces_sessions_as_its_programs(tmp_path, context):
    """programs = "sessions": each cell is mb.simulate of the cluster with
    Sessions(trace, context) on the replayed trace, bit for bit; n beyond
    the trace tiles it (new sessions per copy)."""
    from mbbatch.sweeps.cells import cell_seed

    path = _burst_sessions(tmp_path)
    extra = 'programs = "sessions"' + ('' if context == "included" else '\nsession_context = "added"')
    p = write(tmp_path, SESSIONS_SPEC.format(n=300, extra=extra, grid="kv_reuse = [true, false]"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # (n beyond the trace: tiled, and said so)
        ds = run_sweep(p, tmp_path / "s.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    trace = mb.traces.load_burstgpt(path)
    recomputed = {}
    for idx, params in spec.points():
        pol = mb.Cluster(mb.DynamicBatching(controller=mb.SLAController(d_sla=0.0075, b_max=32),
                                            memory=mb.Memory(**CELL_MEMORY)),
                         engines=3, router=params["router"], threshold=400, kv_reuse=params["kv_reuse"],
                         programs=mb.Sessions(trace, context=context))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mb.simulate(pol, arrivals=mb.Replay(trace), workload=mb.Workload.from_trace(trace),
                              service_model=mb.DecodeModel(prefill_per_token=0.0001), n=300,
                              seed=cell_seed(spec.seed, params, 0))
        cell = ds.isel(policy=idx[0], kv_reuse=idx[1], rep=0)
        assert float(cell["sim_ttft_p99"]) == res.ttft_p99
        assert float(cell["sim_kv_recomputed_tokens"]) == res.kv_recomputed_tokens
        assert float(cell["sim_locality_hit_rate"]) == res.locality_hit_rate
        recomputed[(params["router"], params["kv_reuse"])] = res.kv_recomputed_tokens
    # the program table pays: Autellix with KV reuse recomputes least
    assert recomputed[("autellix", True)] < recomputed[("least_used", True)]


def test_sessions_in_a_spec_need_a_replayed_burstgpt_trace(tmp_path):
    _burst_sessions(tmp_path)
    text = SESSIONS_SPEC.format(n=100, extra='programs = "sessions"', grid="")
    with pytest.raises(SpecError, match=r'programs = "sessions" takes the sessions of a BurstGPT trace'):
        load_spec(write(tmp_path, text.replace('format = "burstgpt"', 'format = "burstgpt"\nresample = true')))
    with pytest.raises(SpecError, match=r"calls shapes synthetic programs; programs = \['sessions'\] has none"):
        load_spec(write(tmp_path, text.replace("n = 100", "n = 100\ncalls = 3"), "b.toml"))
    with pytest.raises(SpecError, match=r'session_context applies to programs = "sessions" only'):
        load_spec(write(tmp_path, text.replace('programs = "sessions"', 'session_context = "added"'), "c.toml"))


# --- LAPS's decode stage in a spec -----------------------------------------------------------

def test_a_laps_sweep_runs_a_decode_stage_of_each_token_policy(tmp_path):
    """decode = "static" | "dynamic" | "multibin_dynamic" with its decode_*
    settings: each cell equals mb.simulate of LAPS with that decode stage, bit
    for bit (latency end to end, TTFT the prefill's); decode = "none" keeps
    latency at the first token."""
    from mbbatch.sweeps.cells import cell_seed

    text = (LAPS_SPEC.replace("n = 3000", "n = 2000\ndecode_servers = 2\ndecode_eta = 60000.0\n"
                                          "decode_batch_size = 16\ndecode_bins = 2\ndecode_b_max = 64")
            .replace('[policies.fifo]\nkind = "laps"\ndual_queue = false\ndynamic = false\n', "")
            .replace('policy = ["fifo", "laps"]', 'policy = ["laps"]\ndecode = ["none", "static", "dynamic", '
                                                  '"multibin_dynamic"]')
            .replace("rate = [20.0, 60.0]", "rate = [40.0]"))
    p = write(tmp_path, text)
    ds = run_sweep(p, tmp_path / "d.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=200.0), output=st.lognorm(0.8, scale=64.0))
    mem = dict(m_max_gb=60001.0, m_model_gb=1.0, kv_mem_per_token_gb=1.0)
    ctl = mb.SLAController(b_max=64)
    stages = {"none": None, "static": mb.StaticBatching(16, memory=mb.Memory(enabled=False, **mem)),
              "dynamic": mb.DynamicBatching(controller=ctl, memory=mb.Memory(**mem)),
              "multibin_dynamic": mb.MultiBinDynamic(bins=2, controller=ctl, memory=mb.Memory(**mem))}
    for idx, params in spec.points():
        decode = stages[params["decode"]]
        pol = mb.LAPS(instances=3, decode=decode, decode_servers=2)
        for rep in range(spec.reps):
            res = mb.simulate(pol, arrivals=mb.Poisson(40.0), workload=wl, n=2000,
                              seed=cell_seed(spec.seed, params, rep))
            cell = ds.sel(policy="laps", decode=params["decode"], rate=40.0).isel(rep=rep)
            assert float(cell["sim_mean_latency"]) == res.mean_latency
            assert float(cell["sim_latency_p99"]) == res.latency_p99
            assert float(cell["sim_ttft_short_p99"]) == res.ttft_short_p99
            if decode is None:
                assert res.mean_latency == res.mean_ttft
            else:
                assert res.mean_latency > res.mean_ttft and res.decode.kind == params["decode"]
    # the prefill is the same whatever follows it
    ttft = ds["sim_ttft_short_p99"].sel(policy="laps", rate=40.0)
    assert (ttft == ttft.sel(decode="none")).all()


def test_a_laps_decode_stage_is_checked_before_the_sweep(tmp_path):
    with pytest.raises(SpecError, match=r'decode_eta sets LAPS.s decode stage; set decode = "static"'):
        load_spec(write(tmp_path, LAPS_SPEC.replace("n = 3000", "n = 3000\ndecode_eta = 1000.0")))
    # a memory-aware decode stage without decode_eta: the parameter table's eta (the API's Memory())
    spec = load_spec(write(tmp_path, LAPS_SPEC.replace("n = 3000", 'n = 3000\ndecode = "dynamic"'), "b.toml"))
    (_, params), = list(spec.points())[:1]
    pol, _, _ = point_objects(spec.arrivals, spec.service, params)
    assert pol.decode.memory.eta == mb.Memory().eta == 180_000.0
    with pytest.raises(SpecError, match=r"decode must be one of"):
        load_spec(write(tmp_path, LAPS_SPEC.replace("n = 3000", 'n = 3000\ndecode = "fifo"'), "c.toml"))


#: a cluster sweep of two engines (dynamic batching unless engine_policy says
#: otherwise) at 10 calls/s
CLUSTER_SPEC = """
name = "{name}"
policy = "cluster"
arrivals = "poisson"
service_model = "decode"
reps = 1
seed = {seed}

[params]
prompt_median = 300.0
prompt_sigma = 1.0
output_median = 64.0
output_sigma = 0.8
d_sla = 0.0075
b_max = 64
eta = 180000.0
prefill_per_token = 0.0001
engines = 2
rate = 10.0
n = 1500
{extra}

[grid]
{grid}
"""


def test_a_cluster_sweep_takes_closed_loop_programs(tmp_path):
    """closed_loop as an axis: each cell equals mb.simulate of the cluster
    with Programs(closed=...), bit for bit; both loops see the same draws
    (closed_loop does not enter the seed)."""
    from mbbatch.sweeps.cells import cell_seed

    p = write(tmp_path, CLUSTER_SPEC.format(name="loops", seed=8, extra="calls = 3",
                                            grid="closed_loop = [false, true]"))
    ds = run_sweep(p, tmp_path / "c.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=300.0), output=st.lognorm(0.8, scale=64.0))
    seeds = set()
    for idx, params in spec.points():
        pol = mb.Cluster(mb.DynamicBatching(controller=mb.SLAController(d_sla=0.0075, b_max=64),
                                            memory=mb.Memory(**CELL_MEMORY)),
                         engines=2, programs=mb.Programs(calls=3, closed=params["closed_loop"]))
        seed = cell_seed(spec.seed, params, 0)
        seeds.add(seed.spawn_key)
        res = mb.simulate(pol, arrivals=mb.Poisson(10.0), workload=wl,
                          service_model=mb.DecodeModel(prefill_per_token=0.0001), n=1500, seed=seed)
        cell = ds.isel(closed_loop=idx[0], rep=0)
        assert float(cell["sim_ttft_p99"]) == res.ttft_p99 and float(cell["sim_mean_latency"]) == res.mean_latency
    assert len(seeds) == 1
    assert ds["sim_mean_latency"].sel(closed_loop=True).item() != ds["sim_mean_latency"].sel(closed_loop=False).item()


def test_a_cluster_sweep_runs_each_engine_policy(tmp_path):
    """engine_policy as an axis: each cell equals mb.simulate of the cluster
    with that engine batching, bit for bit, every variant on the same
    requests."""
    from mbbatch.sweeps.cells import cell_seed

    p = write(tmp_path, CLUSTER_SPEC.format(
        name="engines", seed=9, extra="engine_batch_size = 8\nengine_bins = 2",
        grid='engine_policy = ["dynamic", "static", "multibin_dynamic", "multibin"]'))
    ds = run_sweep(p, tmp_path / "e.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=300.0), output=st.lognorm(0.8, scale=64.0))
    mem = CELL_MEMORY
    ctl = mb.SLAController(d_sla=0.0075, b_max=64)
    engines = {"dynamic": mb.DynamicBatching(controller=ctl, memory=mb.Memory(**mem)),
               "static": mb.StaticBatching(8, sla=mb.SLAController(d_sla=0.0075), memory=mb.Memory(enabled=False,
                                                                                                   **mem)),
               "multibin_dynamic": mb.MultiBinDynamic(bins=2, controller=ctl, memory=mb.Memory(**mem)),
               "multibin": mb.MultiBin(bins=2, batch_size=8)}
    for idx, params in spec.points():
        pol = mb.Cluster(engines[params["engine_policy"]], engines=2, programs=mb.Programs())
        res = mb.simulate(pol, arrivals=mb.Poisson(10.0), workload=wl,
                          service_model=mb.DecodeModel(prefill_per_token=0.0001), n=1500,
                          seed=cell_seed(spec.seed, params, 0))
        cell = ds.isel(engine_policy=idx[0], rep=0)
        assert float(cell["sim_mean_latency"]) == res.mean_latency and float(cell["sim_ttft_p99"]) == res.ttft_p99
        assert int(cell["completed"]) == res.completed


def test_engine_settings_need_their_engine_policy(tmp_path):
    with pytest.raises(SpecError, match=r"engine_bins sets the bins of the engines of multibin, multibin_dynamic"):
        load_spec(write(tmp_path, CLUSTER_SPEC.format(name="engines", seed=9, extra="engine_bins = 2",
                                                      grid='engine_policy = ["dynamic", "static"]')))
    # (an engine's batch size not given: the parameter table's, as for a policy of its own)
    spec = load_spec(write(tmp_path, CLUSTER_SPEC.format(name="engines", seed=9, extra="",
                                                         grid='engine_policy = ["multibin"]'), "b.toml"))
    (_, cell), = spec.points()
    assert cell["engine_batch_size"] == mb.MultiBin().batch_size == 128


def test_a_cluster_sweep_runs_continuous_batching_engines(tmp_path):
    """engine_policy = "continuous" with its settings (max_num_seqs as an
    axis, kv_tokens) and an iteration model: each cell equals mb.simulate
    of the cluster of ContinuousBatching engines (the spec's default
    synthetic programs), bit for bit; its settings
    without a continuous engine are refused, named."""
    from mbbatch.sweeps.cells import cell_seed

    spec_text = CLUSTER_SPEC.format(name="cont", seed=10, extra='engine_policy = "continuous"\nkv_tokens = 20000.0',
                                    grid='max_num_seqs = [8, 64]\nrouter = ["least_used", "round_robin"]')
    p = write(tmp_path, spec_text.replace('service_model = "decode"', 'service_model = "iteration"')
              .replace("prefill_per_token = 0.0001\n", ""))
    ds = run_sweep(p, tmp_path / "c.zarr", workers=1, progress=False).load()
    spec = load_spec(p)
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=300.0), output=st.lognorm(0.8, scale=64.0))
    means = set()
    for idx, params in spec.points():
        pol = mb.Cluster(mb.ContinuousBatching(max_num_seqs=params["max_num_seqs"], kv_tokens=20000.0), engines=2,
                         router=params["router"], programs=mb.Programs())
        res = mb.simulate(pol, arrivals=mb.Poisson(10.0), workload=wl, service_model=mb.IterationModel(), n=1500,
                          seed=cell_seed(spec.seed, params, 0))
        cell = ds.isel(max_num_seqs=idx[0], router=idx[1], rep=0)
        assert float(cell["sim_mean_latency"]) == res.mean_latency and float(cell["sim_tbt_p99"]) == res.tbt_p99
        assert float(cell["sim_load_imbalance"]) == res.load_imbalance and int(cell["completed"]) == 1500
        means.add(res.mean_latency)
    assert len(means) == 4
    with pytest.raises(SpecError, match=r"max_num_seqs sets the max_num_seqs of the engines of continuous; "
                                        r"engine_policy = \['dynamic'\] has none"):
        load_spec(write(tmp_path, CLUSTER_SPEC.format(name="bad", seed=9, extra="max_num_seqs = 8",
                                                      grid='router = ["least_used"]'), "bad.toml"))


def test_a_cluster_takes_the_tables_defaults_for_what_its_engines_read(tmp_path):
    """Without d_sla, b_max and eta a cluster of dynamic engines takes the parameter table's (they were
    required); one of continuous-batching engines needs none of them."""
    text = CLUSTER_SPEC.format(name="need", seed=1, extra="", grid='router = ["least_used"]')
    for key in ("d_sla = 0.0075\n", "b_max = 64\n", "eta = 180000.0\n", "prefill_per_token = 0.0001\n"):
        text = text.replace(key, "")
    text = text.replace('service_model = "decode"', 'service_model = "iteration"')
    (_, params), = load_spec(write(tmp_path, text, "dyn.toml")).points()
    assert (params["d_sla"], params["b_max"], params["eta"]) == (0.0074, 256, 180_000.0)
    spec = load_spec(write(tmp_path, text.replace("engines = 2", 'engines = 2\nengine_policy = "continuous"'),
                           "cont.toml"))
    (_, params), = spec.points()
    assert params["engine_policy"] == "continuous"
    pol, _, _ = point_objects(spec.arrivals, spec.service, params)
    assert isinstance(pol.policy, mb.ContinuousBatching)


KV_SPEC = """
policy = "continuous"
arrivals = "poisson"
service_model = "profile"
reps = 2

[params]
profile = "H100/vLLM/Meta-Llama-3-8B/tp1"
n = 3000
output_sigma = 1.2
kv_tokens = {kv}

[grid]
rate = [1.0, 2.0]
"""


def test_a_continuous_request_that_could_never_run_is_refused_before_the_store_exists(tmp_path):
    """The continuous engine refuses a drawn request whose prompt and output exceed its KV blocks: a
    sweep draws every cell's requests rep by rep before it writes anything, and names the point and
    the rep (it once wrote the store, then stopped at the first such cell)."""
    spec = write(tmp_path, KV_SPEC.format(kv="2007.0"), "kv.toml")
    with pytest.raises(SpecError, match=r"at grid point rate=1.0: rep 0: kv_tokens = 2007: request \d+ \(prompt "
                                        r"\d+ \+ output \d+ tokens\) can never fit the 2000 tokens"):
        run_sweep(spec, tmp_path / "kv.zarr", workers=1, progress=False)
    assert not (tmp_path / "kv.zarr").exists()
    ds = run_sweep(write(tmp_path, KV_SPEC.format(kv="inf"), "ok.toml"), tmp_path / "ok.zarr", workers=1,
                   progress=False)
    assert (ds.completed.values == 3000).all()


STEP_SPEC = """
policy = "continuous"
arrivals = "step"
service_model = "profile"
reps = 1

[params]
profile = "H100/vLLM/Meta-Llama-3-8B/tp1"
n = 2000
t_up = 20.0
t_down = 60.0
rate = 1.0
rate_high = 6.0
d_sla = 0.02
max_num_seqs = 4

[grid]
sla_control = [false, true]
"""


def test_a_continuous_engines_load_step_stores_its_time_series(tmp_path):
    """A load step on the continuous engine (it once stopped at its first cell: its series are the
    running and waiting sequences and the controller's cap, not the event kernel's): its waiting
    requests are the queue series, the controller's cap is b_target (NaN without a controller), and
    the series the engine does not keep are NaN."""
    ds = run_sweep(write(tmp_path, STEP_SPEC, "step.toml"), tmp_path / "s.zarr", workers=1, progress=False)
    queue = ds.ts_queue.sel(sla_control=False).values
    assert np.nanmax(queue) > 0 and np.isnan(ds.ts_b_low.values).all()
    assert np.isnan(ds.ts_b_target.sel(sla_control=False).values).all()
    cap = ds.ts_b_target.sel(sla_control=True).values
    assert np.isfinite(cap).any() and np.nanmin(cap) >= 1


UNGUARDED = """
from mbbatch.sweeps import run_sweep
ds = run_sweep("small.toml", "s.zarr", workers=2, progress=False)
"""


def test_a_script_without_the_main_guard_is_refused_before_the_store_exists(tmp_path):
    """A script that calls run_sweep(workers=2) at its top level, without `if __name__ ==
    "__main__":`: each spawned worker imports the script again and starts the sweep once more, found
    the store locked by the first ("being written by another sweep") and died, and the first failed
    with BrokenProcessPool.  Now refused in the first process, naming the guard and the line, before
    any worker starts or the store exists (a process, with a timeout: the old code takes minutes)."""
    import subprocess

    from .helpers import ROOT

    write(tmp_path, SMALL, "small.toml")
    (tmp_path / "script.py").write_text(UNGUARDED)
    r = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: workers=2: run_sweep runs the sweep on 2 spawned worker processes"), last
    assert 'line 3 of ' in last and 'if __name__ == "__main__":' in last and "Safe importing of main module" in last
    assert "BrokenProcessPool" not in r.stderr and "another sweep" not in r.stderr
    assert not (tmp_path / "s.zarr").exists()
    # the check alone: a call under the guard (from a function or not) passes; one in a with block does not
    (tmp_path / "check.py").write_text(
        "from mbbatch.sweeps.executors import check_spawn_safe\n"
        "def main():\n    check_spawn_safe('run_sweep', None, 2)\n"
        "if __name__ == '__main__':\n    main()\n    check_spawn_safe('run_sweep', None, 2)\n"
        "    print('guarded')\n"
        "with open(__file__):\n    main()\n")
    r = subprocess.run([sys.executable, "check.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout == "guarded\n" and "the call at line 9 of " in r.stderr.splitlines()[-1], r.stderr
