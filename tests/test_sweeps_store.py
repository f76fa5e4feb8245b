"""The sweep store (mbbatch.store): what --overwrite may delete, one writer
per store, damage detected and repaired bit for bit.  The guarantees are
tested on real `mbbatch` processes where a process is what they are about."""

import json
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

import mbbatch as mb
from mbbatch.sweeps import check_store, run_sweep
from mbbatch.sweeps import store
from mbbatch.sweeps.store import StoreNote, SweepError

from .helpers import ROOT, SLOW, SMALL, assert_identical, cli_run, start_sweep, write

pytestmark = pytest.mark.filterwarnings("ignore::mbbatch.results.UnstableWarning")

TINY = SMALL.replace("n = 4000", "n = 600").replace("reps = 3", "reps = 2")


#: ``mbbatch ARGS`` in this process (the concurrent sweeps below run processes)
cli = cli_run


def tree(path: Path) -> dict:
    """Every file under ``path`` with its bytes (symlinks as their targets)."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(path))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(path))] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A finished store of TINY, and its Dataset, made once."""
    d = tmp_path_factory.mktemp("ref")
    out = d / "ref.zarr"
    ds = run_sweep(write(d, TINY), out, workers=1, progress=False).load()
    return out, ds


def fresh_copy(reference, tmp_path, name="s.zarr"):
    import shutil

    out = tmp_path / name
    shutil.copytree(reference[0], out)
    return out


# --- 1. --overwrite deletes only a sweep store ---------------------------------------

def test_overwrite_refuses_a_directory_of_user_files(tmp_path):
    """The data-loss bug: `--overwrite` erased an unrelated directory.  A real
    process is refused, names the path, and every file survives."""
    user = tmp_path / "thesis"
    (user / "chapters").mkdir(parents=True)
    (user / "notes.txt").write_text("do not lose me")
    (user / "chapters" / "one.tex").write_text("\\chapter{One}")
    before = tree(user)
    r = cli("sweep", write(tmp_path, TINY), "--out", user, "--overwrite", "--workers", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(user) in r.stderr and "not an mbbatch sweep store" in r.stderr
    assert tree(user) == before


def test_overwrite_refuses_the_working_directory(tmp_path):
    """`--out . --overwrite` emptied the working directory."""
    (tmp_path / "data.csv").write_text("1,2,3\n")
    spec = write(tmp_path, TINY)
    before = tree(tmp_path)
    r = cli("sweep", spec.name, "--out", ".", "--overwrite", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "working directory" in r.stderr
    assert tree(tmp_path) == before
    r = cli("sweep", spec.name, "--out", "..", "--overwrite", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 2 and "working directory" in r.stderr, r.stderr


def test_overwrite_refuses_a_file_without_a_traceback(tmp_path):
    """A regular file gave a NotADirectoryError traceback."""
    f = tmp_path / "results.zarr"
    f.write_text("not a store")
    r = cli("sweep", write(tmp_path, TINY), "--out", f, "--overwrite", "--workers", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "is a file" in r.stderr, r.stderr
    assert f.read_text() == "not a store"
    r = cli("sweep", write(tmp_path, TINY), "--out", f, "--workers", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "not an mbbatch sweep store" in r.stderr


def test_overwrite_refuses_a_symlink_out_of_the_tree(tmp_path, reference):
    """A link is never followed to delete: not even when it points at a store."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = fresh_copy(reference, elsewhere)
    before = tree(target)
    link = tmp_path / "link.zarr"
    link.symlink_to(target)
    with pytest.raises(SweepError, match="symbolic link"):
        run_sweep(write(tmp_path, TINY), link, workers=1, progress=False, overwrite=True)
    assert link.is_symlink() and tree(target) == before


def test_overwrite_refuses_a_store_holding_foreign_files(tmp_path, reference):
    out = fresh_copy(reference, tmp_path)
    (out / "my_notes.txt").write_text("mine")
    (out / "sim_throughput" / "c" / "keep.me").write_text("mine too")
    with pytest.raises(SweepError, match="files a sweep did not write") as err:
        run_sweep(write(tmp_path, TINY), out, workers=1, progress=False, overwrite=True)
    assert "my_notes.txt" in str(err.value)
    assert (out / "my_notes.txt").read_text() == "mine"


def test_overwrite_replaces_a_store_and_leaves_nothing_behind(tmp_path, reference):
    out = fresh_copy(reference, tmp_path)
    changed = write(tmp_path, TINY.replace("seed = 7", "seed = 8"), "changed.toml")
    with pytest.raises(SweepError, match="seed: 7 -> 8"):
        run_sweep(changed, out, workers=1, progress=False)
    ds = run_sweep(changed, out, workers=1, progress=False, overwrite=True).load()
    assert int(ds.attrs["seed"]) == 8 and bool(ds["done"].all())
    # the same spec again with overwrite starts over, and ends identical
    again = run_sweep(changed, out, workers=1, progress=False, overwrite=True).load()
    assert_identical(ds, again)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changed.toml", "s.zarr"]


def test_an_unrelated_creating_folder_survives(tmp_path):
    """An unrelated `NAME.zarr.creating` folder was silently removed: the
    sweep's temporary names are its own (process id and a random part)."""
    mine = tmp_path / "s.zarr.creating"
    mine.mkdir()
    (mine / "precious.txt").write_text("x")
    run_sweep(write(tmp_path, TINY), tmp_path / "s.zarr", workers=1, progress=False)
    assert (mine / "precious.txt").read_text() == "x"


def test_stale_temporaries_of_a_dead_sweep_are_removed_and_nothing_else(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    ours = tmp_path / f".s.zarr.creating-{dead}-abc123"
    ours.mkdir()
    theirs = tmp_path / f".s.zarr.creating-{dead}-keepme"
    theirs.mkdir()
    (theirs / "data.txt").write_text("not a store")
    run_sweep(write(tmp_path, TINY), tmp_path / "s.zarr", workers=1, progress=False)
    assert not ours.exists()
    assert (theirs / "data.txt").read_text() == "not a store"


# --- 2. one writer per store -------------------------------------------------------------

@pytest.mark.heavy
def test_second_sweep_on_a_locked_store_exits_at_once_naming_the_holder(tmp_path):
    """Two sweeps on one store raced (tracebacks, a store left with 4 of 28
    variables).  The second now stops at once, naming the store and the
    first one's process id; after a kill -9 of the first, the next run takes
    the lock over with a note and ends bit-identical to an uninterrupted run."""
    spec = write(tmp_path, SLOW.replace("n = 4000000", "n = 30000000"))
    out = tmp_path / "locked.zarr"
    first = start_sweep(spec, out, workers=1, points=1)
    try:
        t0 = time.monotonic()
        r = cli("sweep", spec, "--out", out, "--workers", "1", "--quiet")
        assert time.monotonic() - t0 < 30
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert str(out) in r.stderr and f"process {first.pid}" in r.stderr
        assert first.poll() is None                          # the first one goes on
        r = cli("sweep", spec, "--out", out, "--workers", "1", "--overwrite")
        assert r.returncode == 2 and f"process {first.pid}" in r.stderr, r.stderr
        r = cli("check", out)
        assert f"being written now by process {first.pid}" in r.stdout, r.stdout
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # (the rest of the run on a smaller grid: the point is the lock, not the size)
    small = write(tmp_path, SLOW, "small.toml")
    with pytest.warns(StoreNote, match=f"took over the lock of process {first.pid}"):
        with pytest.raises(SweepError, match="spec differs"):
            run_sweep(small, out, workers=1, progress=False)
    assert not (tmp_path / ".locked.zarr.lock").exists()     # released on a clean exit
    r = cli("sweep", small, "--out", out, "--workers", "1", "--quiet", "--overwrite")
    assert r.returncode == 0 and "took over" not in r.stderr, r.stderr


@pytest.mark.heavy
def test_two_sweeps_started_together_leave_one_intact_store(tmp_path):
    spec = write(tmp_path, SMALL.replace("n = 4000", "n = 40000"))
    for trial in range(3):
        out = tmp_path / f"race{trial}.zarr"
        procs = [subprocess.Popen([sys.executable, "-m", "mbbatch.cli", "sweep", str(spec), "--out", str(out),
                                   "--workers", "1", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(2)]
        results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
        for _, err, code in results:
            assert "Traceback" not in err, err
            assert code == 0 or (code == 2 and "being written by another sweep" in err), err
        assert any(code == 0 for *_, code in results)
        r = cli("check", out)
        assert r.returncode == 0 and "intact" in r.stdout, r.stdout


def test_lock_file_that_is_not_ours_is_refused(tmp_path):
    (tmp_path / ".s.zarr.lock").write_text("someone's file\n")
    with pytest.raises(SweepError, match="not an mbbatch lock file"):
        run_sweep(write(tmp_path, TINY), tmp_path / "s.zarr", workers=1, progress=False)
    assert (tmp_path / ".s.zarr.lock").read_text() == "someone's file\n"


# --- 3. damage is detected, not used -------------------------------------------------

def _chunk(out, var, idx):
    return out / var / "c" / Path(*map(str, idx))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-3]),
    "zeroed": lambda p: p.write_bytes(bytes(len(p.read_bytes()))),
    "random": lambda p: p.write_bytes(np.random.default_rng(0).bytes(len(p.read_bytes()))),
    "flipped": lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 0x01]) + p.read_bytes()[1:]),
    "deleted": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_chunk_is_found_and_recomputed_bit_for_bit(tmp_path, reference, how):
    """A truncated, zeroed or random chunk passed as done; a flipped byte
    changed a value silently; a deleted chunk read as NaN.  Each is now found
    by `check` and by the resume, which recomputes the chunk's points (with a
    note naming store, variable and points) and ends equal to an
    uninterrupted run.  (TINY's 6 points share one chunk per variable.)"""
    out = fresh_copy(reference, tmp_path)
    DAMAGE[how](_chunk(out, "sim_throughput", (0, 0, 0)))
    report = check_store(out)
    assert not report.ok and "damaged: 6" in report.text and "bins=3, rate=2.0 (sim_throughput)" in report.text
    with pytest.warns(StoreNote, match=r"s\.zarr: 6 grid points .* bins=1, rate=0\.2 \(sim_throughput\)"):
        again = run_sweep(write(tmp_path, TINY), out, workers=1, progress=False).load()
    assert_identical(reference[1], again)
    assert check_store(out).ok


def test_a_truncated_done_chunk_is_recomputed_not_an_error(tmp_path, reference):
    """A truncated `done` chunk stopped the sweep with an error naming no file."""
    out = fresh_copy(reference, tmp_path)
    DAMAGE["truncated"](_chunk(out, "done", (0, 0)))
    with pytest.warns(StoreNote, match=r"bins=1, rate=0\.5 \(done\)"):
        again = run_sweep(write(tmp_path, TINY), out, workers=1, progress=False).load()
    assert_identical(reference[1], again)


def test_damage_costs_only_the_points_of_its_chunk(tmp_path, monkeypatch):
    """With two points per chunk, damage in one chunk recomputes its two
    points only, named with their variables, in a real `mbbatch sweep`
    process (which finds the chunking in the store, not in its defaults)."""
    monkeypatch.setattr(store, "POINTS_PER_CHUNK", 2)
    spec = write(tmp_path, TINY)
    ref = run_sweep(spec, tmp_path / "ref.zarr", workers=1, progress=False).load()
    out = tmp_path / "s.zarr"
    run_sweep(spec, out, workers=1, progress=False)
    assert store.stored_grid_chunks(out) == (1, 2)              # bins x rate = 2 x 3: blocks of 2 rates
    DAMAGE["random"](_chunk(out, "theory_latency", (0, 0)))      # bins=1, rates 0.2 and 0.5
    DAMAGE["deleted"](_chunk(out, "sim_latency_p99", (1, 1, 0)))  # bins=3, rate 2.0
    DAMAGE["flipped"](_chunk(out, "completed", (1, 1, 0)))
    report = check_store(out)
    assert "damaged: 3" in report.text, report.text
    assert "bins=1, rate=0.2 (theory_latency); bins=1, rate=0.5 (theory_latency)" in report.text
    assert "bins=3, rate=2.0 (completed, sim_latency_p99)" in report.text
    r = cli("check", out)
    assert r.returncode == 1 and "DAMAGED" in r.stdout
    # the resume, as a real `mbbatch sweep` process: a note names store, points and variables
    r = cli("sweep", spec, "--out", out, "--workers", "1", "--quiet")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    note = [ln for ln in r.stderr.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and str(out) in note[0] and "3 grid points failed verification" in note[0], r.stderr
    assert_identical(ref, xr.open_zarr(out).load())
    r = cli("check", out)
    assert r.returncode == 0 and "intact" in r.stdout, r.stdout


def test_check_reports_missing_points_of_an_interrupted_store(tmp_path, reference):
    out = fresh_copy(reference, tmp_path)
    xr.Dataset({"done": (("bins", "rate"), np.zeros((1, 1), bool))}).to_zarr(
        out, region={"bins": slice(0, 1), "rate": slice(2, 3)}, write_empty_chunks=True)
    report = check_store(out)
    assert report.ok and "missing: 1 (bins=1, rate=2.0)" in report.text, report.text


def test_damaged_metadata_is_named_and_overwrite_rebuilds(tmp_path, reference):
    """A store that cannot be opened: the error names the file; `--overwrite`
    (which recognises the store by its `done` array's mark) rebuilds it."""
    out = fresh_copy(reference, tmp_path)
    (out / "sim_throughput" / "zarr.json").write_text("{ not json")
    with pytest.raises(SweepError, match=r"sim_throughput/zarr\.json cannot be read"):
        run_sweep(write(tmp_path, TINY), out, workers=1, progress=False)
    (out / "zarr.json").write_bytes(b"\x00" * 10)
    with pytest.raises(SweepError, match=r"zarr\.json cannot be read"):
        run_sweep(write(tmp_path, TINY), out, workers=1, progress=False)
    assert not check_store(out).ok
    rebuilt = run_sweep(write(tmp_path, TINY), out, workers=1, progress=False, overwrite=True).load()
    assert_identical(reference[1], rebuilt)


def test_a_store_without_checksums_needs_overwrite(tmp_path, reference):
    """Stores made before checksums cannot be verified: refused until rebuilt."""
    out = fresh_copy(reference, tmp_path)
    meta = json.loads((out / "zarr.json").read_text())
    del meta["attributes"][store.MARK]
    (out / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(SweepError, match="older mbbatch"):
        run_sweep(write(tmp_path, TINY), out, workers=1, progress=False)
    rebuilt = run_sweep(write(tmp_path, TINY), out, workers=1, progress=False, overwrite=True).load()
    assert_identical(reference[1], rebuilt)


GAMMA = TINY.replace('arrivals = "poisson"', 'arrivals = "gamma"').replace("[grid]", "cv = 2.0\n\n[grid]")


def test_a_gamma_store_of_older_gaps_is_read_not_resumed(tmp_path):
    """Gamma gaps at an integer cv**2 are now drawn another way (a product
    of uniforms, not exp): a store recording no sampler or another one
    still opens when complete, but its missing points are not computed by
    the new draws beside its old ones: the error names the store and the
    way out, and nothing stored changes.  A store of today's draws resumes
    as before."""
    out = tmp_path / "g.zarr"
    ds = run_sweep(write(tmp_path, GAMMA), out, workers=1, progress=False).load()
    assert ds.attrs["gamma_gaps"] == mb.Gamma.SAMPLER
    assert "gamma_gaps" not in run_sweep(write(tmp_path, TINY), tmp_path / "p.zarr", workers=1,
                                         progress=False).attrs
    meta = json.loads((out / "zarr.json").read_text())
    del meta["attributes"]["gamma_gaps"]
    (out / "zarr.json").write_text(json.dumps(meta))
    complete = run_sweep(write(tmp_path, GAMMA), out, workers=1, progress=False).load()
    for v in ds.data_vars:
        np.testing.assert_array_equal(ds[v].values, complete[v].values, err_msg=v)
    xr.Dataset({"done": (("bins", "rate"), np.zeros((1, 1), bool))}).to_zarr(
        out, region={"bins": slice(0, 1), "rate": slice(2, 3)}, write_empty_chunks=True)
    before = tree(out)
    with pytest.raises(SweepError, match=r"g\.zarr holds gamma arrivals drawn by an older mbbatch.*the 1 point "
                                         r"still to compute.*--overwrite"):
        run_sweep(write(tmp_path, GAMMA), out, workers=1, progress=False)
    assert tree(out) == before
    report = check_store(out)
    assert report.ok and "can be read, not resumed" in report.text and "--overwrite" in report.text, report.text
    meta = json.loads((out / "zarr.json").read_text())
    meta["attributes"]["gamma_gaps"] = mb.Gamma.SAMPLER
    (out / "zarr.json").write_text(json.dumps(meta))
    assert_identical(ds, run_sweep(write(tmp_path, GAMMA), out, workers=1, progress=False).load())


def test_every_chunk_carries_a_checksum_and_exists(reference):
    out = reference[0]
    for meta in out.glob("*/zarr.json"):
        codecs = [c["name"] for c in json.loads(meta.read_text())["codecs"]]
        assert codecs[-1] == "crc32c", (meta, codecs)
    # fill values are written too (every unstable flag here is False, the
    # fill value): a missing chunk is damage, never a NaN
    assert [p.name for p in (out / "unstable" / "c").rglob("*") if p.is_file()] == ["0"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_store(out).ok


def test_a_link_to_a_store_resumes_and_shares_its_lock(tmp_path, reference):
    out = fresh_copy(reference, tmp_path)
    link = tmp_path / "link.zarr"
    link.symlink_to(out)
    with store.StoreLock(out):
        with pytest.raises(SweepError, match="being written by another sweep"):
            run_sweep(write(tmp_path, TINY), link, workers=1, progress=False)
    ds = run_sweep(write(tmp_path, TINY), link, workers=1, progress=False).load()
    assert_identical(reference[1], ds)


# --- NetCDF exports: written whole, replacing only mbbatch's own ----------------------------

def test_a_netcdf_export_replaces_only_a_file_mbbatch_wrote(tmp_path):
    """--netcdf is checked before the sweep runs: a folder, a path under a
    file, or an existing file mbbatch did not write (left as it was) is
    refused and no store is made; a missing folder is made, and a second
    export replaces the first, whole, with no temporary left beside it."""
    spec = write(tmp_path, TINY)
    foreign = tmp_path / "notes.nc"
    foreign.write_text("my notes\n")
    (tmp_path / "folder").mkdir()
    for target, needle in ((foreign, "exists and is not a NetCDF file mbbatch wrote"),
                           (tmp_path / "folder", "is a folder"),
                           (foreign / "x.nc", "is a file, not a folder")):
        with pytest.raises(SweepError, match=needle):
            run_sweep(spec, tmp_path / "a.zarr", workers=1, progress=False, netcdf=target)
        assert not (tmp_path / "a.zarr").exists() and foreign.read_text() == "my notes\n"
    # an xarray NetCDF file of someone else's is not replaced either
    xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"description": "mine"}).to_netcdf(tmp_path / "mine.nc")
    with pytest.raises(SweepError, match="not a NetCDF file mbbatch wrote"):
        run_sweep(spec, tmp_path / "a.zarr", workers=1, progress=False, netcdf=tmp_path / "mine.nc")
    nc = tmp_path / "new" / "deeper" / "s.nc"
    ds = run_sweep(spec, tmp_path / "a.zarr", workers=1, progress=False, netcdf=nc).load()
    first = nc.read_bytes()
    run_sweep(spec, tmp_path / "a.zarr", workers=1, progress=False, netcdf=nc)
    assert nc.read_bytes() == first and os.listdir(nc.parent) == ["s.nc"]
    with xr.open_dataset(nc) as back:
        assert_identical(ds, back.load())


def test_an_example_export_replaces_only_its_own_file(tmp_path):
    """`mbbatch example --out` refuses a file it did not write, and rewrites
    its own (an export of the same example, the same description and
    variables, or any export that carries mbbatch's version)."""
    foreign = tmp_path / "fig1b.nc"
    foreign.write_text("keep me\n")
    r = cli("example", "fig1b", "--out-dir", str(tmp_path))
    assert r.returncode == 2 and "--out-dir" in r.stderr and "not a NetCDF file mbbatch wrote" in r.stderr
    assert foreign.read_text() == "keep me\n"
    foreign.unlink()
    for _ in range(2):
        r = cli("example", "fig1b", "--out-dir", str(tmp_path))
        assert r.returncode == 0, r.stderr
    from mbbatch.examples import figure_1b

    with xr.open_dataset(foreign) as back:
        assert back.attrs["description"] == figure_1b().attrs["description"]


def test_a_netcdf_export_holds_boolean_settings(tmp_path):
    """NetCDF has no boolean attribute: a spec's boolean setting (LAPS's
    dynamic = false here, fixed for the sweep) is exported as 0 or 1, where
    it failed after the whole sweep had run; boolean variables and a
    boolean grid axis read back as booleans, every value as stored."""
    spec = write(tmp_path, """
name = "flags"
arrivals = "poisson"
policy = "laps"
reps = 1
seed = 3

[params]
prompt_median = 256.0
prompt_sigma = 0.8
output_median = 64.0
output_sigma = 0.8
instances = 2
n = 400
dynamic = false

[grid]
dual_queue = [true, false]
rate = [0.5, 2.0]
""")
    nc = tmp_path / "flags.nc"
    ds = run_sweep(spec, tmp_path / "flags.zarr", workers=1, progress=False, netcdf=nc).load()
    assert ds.attrs["dynamic"] is False
    with xr.open_dataset(nc) as back:
        assert back.attrs["dynamic"] == 0 and back["dual_queue"].dtype == bool and back["done"].dtype == bool
        for v in ds.variables:
            np.testing.assert_array_equal(ds[v].values, back[v].values, err_msg=v)


def test_a_store_of_a_spec_without_a_name_checks_intact(tmp_path):
    """A spec file may leave out ``name`` (it is then the file's stem), and its store resumes; but
    `mbbatch check` parsed the stored spec text alone and called the intact store damaged ("missing
    field 'name'").  The stored name completes it."""
    text = "\n".join(line for line in TINY.splitlines() if not line.startswith("name ="))
    assert "name =" not in text
    out = tmp_path / "s.zarr"
    run_sweep(write(tmp_path, text, name="nameless.toml"), out, workers=1, progress=False)
    report = check_store(out)
    assert report.ok and "sweep 'nameless'" in report.text and "intact" in report.text, report.text
