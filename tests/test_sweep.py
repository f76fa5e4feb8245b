"""Sweeps: spec validation, the Dataset schema, resume after a real kill,
bit-identity across serial, process-pool and dask runs, and the CLI."""

import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from mbbatch.cells import backlog_growing, cell_seed
from mbbatch.spec import SpecError, load_spec, parse_spec
from mbbatch.sweep import StoreNote, SweepError, UnstableWarning, run_sweep

ROOT = Path(__file__).resolve().parents[1]

SMALL = """
name = "small"
description = "a small sweep for the tests"
policy = "multibin"
arrivals = "poisson"
service = "uniform"
reps = 3
seed = 7

[params]
batch_size = 8
l_min = 1.0
l_max = 20.0
n = 4000

[grid]
bins = [1, 3]
rate = [0.2, 0.5, 2.0]
"""

#: deterministic attrs: everything but the volatile git state of a work tree
VOLATILE_ATTRS = {"git_commit"}


def write(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def assert_identical(a: xr.Dataset, b: xr.Dataset):
    """Bit-identical data (NaN equal to NaN) and deterministic attrs."""
    assert set(a.data_vars) == set(b.data_vars)
    for v in a.data_vars:
        np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=v)
    for c in a.coords:
        np.testing.assert_array_equal(a[c].values, b[c].values)
    strip = lambda d: {k: v for k, v in d.items() if k not in VOLATILE_ATTRS}  # noqa: E731
    assert strip(a.attrs) == strip(b.attrs)


# --- spec validation ----------------------------------------------------------

@pytest.mark.parametrize("edit, key", [
    (lambda s: s.replace('reps = 3', 'reps = 3\nrepz = 4'), "repz"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nmu = 0.1'), "params.mu"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = []'), "grid.rate"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = [0.2, 0.5, 0.2]'), "grid.rate"),
    (lambda s: s.replace('batch_size = 8\n', ''), "batch_size"),
    (lambda s: s.replace('seed = 7\n', ''), "seed"),
    (lambda s: s.replace('bins = [1, 3]', 'bins = [1, 0]'), "grid.bins"),
    (lambda s: s.replace('bins = [1, 3]', 'bins = [1, 2.5]'), "grid.bins"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = [0.2, -1.0]'), "grid.rate"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = [0.2, nan]'), "grid.rate"),
    (lambda s: s.replace('l_max = 20.0', 'l_max = 0.5'), "l_max"),
    (lambda s: s.replace('service = "uniform"', 'service = "weibull"'), "service"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nservers = 0'), "servers"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nedges = "lemma_a1"'), "edges"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nbins = 2'), "bins"),
    (lambda s: s.replace('reps = 3', 'reps = 0'), "reps"),
    (lambda s: s + "\n[extra]\nx = 1\n", "extra"),
])
def test_bad_specs_name_key_and_file(tmp_path, edit, key):
    p = write(tmp_path, edit(SMALL), "bad.toml")
    with pytest.raises(SpecError) as err:
        load_spec(p)
    assert key in str(err.value) and "bad.toml" in str(err.value)
    # and nothing runs: no store appears
    out = tmp_path / "out.zarr"
    with pytest.raises(SpecError):
        run_sweep(p, out, workers=1, progress=False)
    assert not out.exists()


def test_spec_files_of_the_project_are_valid():
    for p in sorted((ROOT / "sweeps").glob("*.toml")):
        spec = load_spec(p)
        assert spec.name == p.stem


def test_spec_hash_ignores_layout_and_comments():
    a = parse_spec(SMALL)
    b = parse_spec("# a comment\n" + SMALL.replace("reps = 3", "reps   =   3"))
    assert a.hash == b.hash
    assert parse_spec(SMALL.replace("reps = 3", "reps = 4")).hash != a.hash


# --- seeds ----------------------------------------------------------------------

def test_cell_seed_depends_on_workload_only():
    base = {"bins": 1, "batch_size": 8, "rate": 2.0, "l_min": 1.0, "l_max": 20.0, "n": 100, "servers": 1}
    s = cell_seed(7, base, 0)
    assert cell_seed(7, {**base, "bins": 4, "servers": math.inf}, 0).spawn_key == s.spawn_key
    assert cell_seed(7, {**base, "rate": 3.0}, 0).spawn_key != s.spawn_key
    assert cell_seed(7, base, 1).spawn_key != s.spawn_key
    assert cell_seed(8, base, 0).entropy != s.entropy


@pytest.mark.filterwarnings("ignore::mbbatch.sweep.UnstableWarning")
def test_adding_grid_values_never_changes_a_cell(tmp_path):
    small = run_sweep(write(tmp_path, SMALL), tmp_path / "a.zarr", workers=1, progress=False)
    bigger_text = SMALL.replace("rate = [0.2, 0.5, 2.0]", "rate = [0.1, 0.2, 0.5, 2.0]").replace(
        "bins = [1, 3]", "bins = [1, 2, 3]")
    big = run_sweep(write(tmp_path, bigger_text, "b.toml"), tmp_path / "b.zarr", workers=1, progress=False)
    sub = big.sel(rate=small.rate, bins=small.bins)
    for v in ("sim_throughput", "sim_mean_latency", "sim_latency_p99", "completed"):
        np.testing.assert_array_equal(sub[v].values, small[v].values)


# --- the Dataset ----------------------------------------------------------------

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


def test_unstable_cells_are_flagged(tmp_path):
    with pytest.warns(UnstableWarning, match="no steady state"):
        ds = run_sweep(write(tmp_path, SMALL), tmp_path / "s.zarr", workers=1, progress=False)
    # B = 8, U(1, 20): k = 1 serves 8 / E[max of 8] = 0.44 requests/s
    over = ds["rate"] >= ds["theory_service_rate"]
    assert bool((ds["unstable"] | ~over).all())
    assert bool(ds["unstable"].sel(bins=1, rate=2.0))
    assert not bool(ds["unstable"].sel(bins=3, rate=0.2))


def test_backlog_heuristic():
    S = 10.0
    level = np.full(32, 50.0) + np.sin(np.arange(32)) * 5
    growing = np.linspace(0, 5000, 32)
    assert not backlog_growing(level, S)
    assert backlog_growing(growing, S)
    assert not backlog_growing(np.full(32, np.nan), S)


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
    import mbbatch.sweep as sweep

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
    # (writing done = False, the fill value, without write_empty_chunks deletes
    # the chunk: the point is then reported as damaged, and recomputed)
    with pytest.warns(UnstableWarning), pytest.warns(StoreNote, match=r"bins=3, rate=0\.2 \(done\)"):
        again = run_sweep(p, out, workers=1, progress=False)
    assert_identical(ref, again)


SLOW = SMALL.replace("n = 4000", "n = 400000").replace("bins = [1, 3]", "bins = [1, 2, 3, 4]").replace(
    "rate = [0.2, 0.5, 2.0]", "rate = [0.5, 1.0, 1.5, 2.0, 3.0]")


def n_done(out) -> int:
    """Grid points a (possibly running) sweep has marked done so far."""
    import zarr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return int(np.sum(zarr.open_array(store=str(out), path="done", mode="r")[...]))
    except Exception:  # noqa: BLE001 - not created yet, or a chunk being replaced
        return 0


def start_sweep(spec_path, out, workers, points, session=False):
    """Start a real `mbbatch sweep` process (in a session of its own, as a
    terminal's foreground job, if ``session``) and return it once ``points``
    grid points are stored (it must still be running then)."""
    cmd = [sys.executable, "-m", "mbbatch.cli", "sweep", str(spec_path), "--out", str(out), "--workers",
           str(workers), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=session)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if n_done(out) >= points or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed: make it slower"
    return proc


@pytest.mark.heavy
def test_resume_after_kill_is_bit_identical(tmp_path):
    """kill -9 a real `mbbatch sweep` process mid-sweep, start it again: it
    computes only the missing points and ends bit-identical to an
    uninterrupted run."""
    p = write(tmp_path, SLOW)
    out = tmp_path / "killed.zarr"
    proc = start_sweep(p, out, workers=1, points=3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ds = xr.open_zarr(out)
    n_before = int(ds["done"].sum())
    assert 3 <= n_before < ds["done"].size

    import mbbatch.sweep as sweep

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


# --- CLI ---------------------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mbbatch.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_help_and_theory():
    r = run_cli("--help")
    assert r.returncode == 0 and "sweep" in r.stdout and "figures" in r.stdout and "theory" in r.stdout
    r = run_cli("theory", "throughput", "--B", "128", "--l-min", "1", "--l-max", "20", "--k", "4")
    assert r.returncode == 0 and float(r.stdout) == pytest.approx(9.970261906558987, rel=1e-12)
    r = run_cli("theory", "throughput", "--B", "128", "--l-min", "1", "--l-max", "20", "--k", "0")
    assert r.returncode == 2 and "k must be" in r.stderr
    r = run_cli("theory", "batch-service-time", "--dist", "expon", "--scale", "10", "--B", "200",
                "--edges", "0", "inf")
    assert r.returncode == 0 and float(r.stdout) == pytest.approx(58.780309481214, rel=1e-12)  # H_200 / 0.1
    r = run_cli("theory", "optimal-boundaries", "--dist", "nosuch", "--B", "4", "--k", "2")
    assert r.returncode == 2 and "dist" in r.stderr


def test_cli_sweep_reports_bad_spec(tmp_path):
    p = write(tmp_path, SMALL.replace("reps = 3", "reps = -1"), "bad.toml")
    r = run_cli("sweep", str(p), "--out", str(tmp_path / "x.zarr"))
    assert r.returncode == 2 and "reps" in r.stderr and "bad.toml" in r.stderr
    assert not (tmp_path / "x.zarr").exists()


def test_cli_sweep_progress_lines_when_not_a_tty(tmp_path):
    p = write(tmp_path, SMALL)
    out = tmp_path / "s.zarr"
    r = run_cli("sweep", str(p), "--out", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "ETA" in r.stderr and "requests/s" in r.stderr and "cells" in r.stderr
    assert "\r" not in r.stderr                       # plain lines, no bar redraws
    assert "no steady state" in r.stderr              # the unstable warning, at the end
    assert "6 grid points done" in r.stdout


TOKEN = """
name = "tok"
policy = "{policy}"
arrivals = "{arrivals}"
service_model = "decode"
reps = 2
seed = 3

[params]
prompt_median = 128.0
prompt_sigma = 0.5
output_median = 64.0
output_sigma = 0.8
d_sla = 0.0074
eta = 20000.0
n = 1500
{extra}

[grid]
{grid}
"""


@pytest.mark.filterwarnings("ignore::mbbatch.sweep.UnstableWarning")
@pytest.mark.parametrize("policy, extra, grid", [
    ("static", "", "batch_size = [4, 16]\nrate = [0.5, 2.0]"),
    ("dynamic", "b_max = 64", "rate = [0.5, 2.0]\nmemory = [\"l0\", \"clt\", \"off\"]"),
    ("multibin_dynamic", "b_max = 64\nwarmup = 200", "bins = [1, 3]\nrate = [0.5, 2.0]"),
])
def test_token_sweeps(tmp_path, policy, extra, grid):
    text = TOKEN.format(policy=policy, arrivals="poisson", extra=extra, grid=grid)
    ds = run_sweep(write(tmp_path, text), tmp_path / "t.zarr", workers=1, progress=False)
    for v in ("sim_throughput", "sim_sla_violation_tokens", "sim_batch_size_mean", "sim_memory_peak",
              "sim_latency_p95_mean", "unstable", "done"):
        assert ds[v].attrs["units"] is not None and ds[v].attrs["description"], v
    assert bool(ds["done"].all())
    assert int(ds["completed"].sum()) == 1500 * ds["completed"].size - int(ds["rejected"].sum())
    assert "theory_throughput" not in ds            # no closed forms for these policies
    if policy == "dynamic":
        assert int(ds["mem_exceed_batches"].sel(memory=["l0", "clt"]).sum()) == 0


def test_load_step_sweep_stores_time_series(tmp_path):
    text = TOKEN.format(policy="dynamic", arrivals="step",
                        extra="b_max = 64\nrate = 0.5\nrate_high = 2.0\nt_up = 500.0\nt_down = 1000.0",
                        grid="controller = [\"spec\", \"multiplicative\"]")
    ds = run_sweep(write(tmp_path, text), tmp_path / "s.zarr", workers=1, progress=False)
    assert ds["ts_b_target"].dims == ("controller", "rep", "time")
    assert float(ds["time"].max()) == pytest.approx(1500.0)
    assert ds["time"].attrs["units"] == "s"
    assert int(np.isfinite(ds["ts_tau_avg"].values).sum()) > 0


def test_token_spec_errors(tmp_path):
    bad = TOKEN.format(policy="dynamic", arrivals="poisson", extra="", grid="rate = [1.0]")
    with pytest.raises(SpecError, match="b_max"):                     # missing field
        load_spec(write(tmp_path, bad, "a.toml"))
    bad = TOKEN.format(policy="static", arrivals="poisson", extra="b_max = 4", grid="batch_size = [4]\nrate = [1.0]")
    with pytest.raises(SpecError, match="params.b_max"):              # not a static parameter
        load_spec(write(tmp_path, bad, "b.toml"))
    bad = TOKEN.format(policy="dynamic", arrivals="step", extra="b_max = 8\nrate = 1.0\nrate_high = 2.0\n"
                       "t_up = 10.0\nt_down = 5.0", grid="controller = [\"spec\"]")
    with pytest.raises(SpecError, match="t_down"):
        load_spec(write(tmp_path, bad, "c.toml"))
