"""Run a sweep into a Zarr store that survives interruption.

The store is created whole before any cell runs: every variable at its fill
value, closed forms computed, chunked one grid point per chunk (all reps of a
point in one chunk).  As each grid point finishes, its chunks are written,
then its ``done`` flag.  Zarr writes every chunk atomically (a temporary file
renamed into place), so a run killed at any moment leaves each point either
done or not done, never half-recorded: starting again computes exactly the
points not done.  Cell values depend only on the spec and the cell's
parameters, so an interrupted and resumed sweep ends bit-identical to an
uninterrupted one, whatever the executor or the number of workers.

The store itself (checksums, verification on resume, the one-writer lock,
what ``overwrite`` may delete) is :mod:`mbbatch.store`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import store
from .cells import SEED_SCHEME, check_points, point_theory, run_point
from .results import UnstableWarning
from .schema import (AGGREGATES, TIME_SERIES, coord_values, fixed_param_attrs, rep_vars, template, time_grid,
                     variables)
from .spec import SpecError, SweepSpec, load_spec, parse_spec
from .store import StoreNote, SweepError

__all__ = ["run_sweep", "check_store", "StoreReport", "SweepError", "UnstableWarning", "StoreNote"]


def _git_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=here, capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _attrs(spec: SweepSpec) -> dict:
    from .provenance import versions

    return {
        "name": spec.name,
        "description": spec.description,
        "policy": spec.policy,
        "arrivals": spec.arrivals,
        "service": spec.service,
        "reps": spec.reps,
        "seed": str(spec.seed),
        "spec": spec.text,
        "spec_canonical": spec.canonical,
        "spec_hash": spec.hash,
        "seed_scheme": SEED_SCHEME,
        "axes": list(spec.axes),
        "git_commit": _git_commit(),
        "confidence_level": 0.95,
        **fixed_param_attrs(spec),
        **versions(),
    }


def _t_interval(x: np.ndarray, level: float = 0.95):
    from scipy import stats

    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return m, float(m - half), float(m + half)


def _encoding(spec: SweepSpec, ds) -> dict:
    """One chunk per grid point (all reps, and all times, of a point in one)."""
    per_rep = rep_vars(spec)
    encoding = {}
    for var in ds.data_vars:
        if var in TIME_SERIES:
            chunks = tuple(1 for _ in spec.axes) + (spec.reps, ds.sizes["time"])
        else:
            chunks = tuple(1 for _ in spec.axes) + ((spec.reps,) if var in per_rep else ())
        encoding[var] = {"chunks": chunks}
    return encoding


def _template(spec: SweepSpec):
    """The store's Dataset before any cell runs: closed forms filled in."""
    ds = template(spec, _attrs(spec))
    for idx, params in spec.points():
        for var, value in point_theory(spec.arrivals, spec.service, params, spec.policy).items():
            ds[var].values[idx] = value
    return ds


def _layout(spec: SweepSpec) -> tuple[list, dict]:
    """The store's data variables and its coordinates with their values."""
    names = list(variables(spec))
    grid = time_grid(spec)
    if grid is not None:
        names += list(TIME_SERIES)
    coords = {nm: coord_values(nm, vals) for nm, vals in spec.axes.items()}
    coords["rep"] = np.arange(spec.reps)
    if grid is not None:
        coords["time"] = grid
    return names, coords


def _open_existing(spec: SweepSpec, out: Path) -> np.ndarray:
    """Check an existing store against the spec and verify it; return which
    grid points are done and intact.  Damaged points are reported (a
    :class:`StoreNote`) and left to recompute; damaged coordinates are
    rewritten from the spec."""
    stored = store.stored_attrs(out)
    if stored is None or "spec_hash" not in stored:
        raise SweepError(f"out: {out} is damaged: its metadata {out / 'zarr.json'} cannot be read; "
                         "pass --overwrite to rebuild it (its results are then lost)")
    if stored["spec_hash"] != spec.hash:
        try:
            old = parse_spec(stored["spec"], source="stored spec")
            what = "; ".join(spec.differences(old)) or "formatting of the spec"
        except (SpecError, KeyError, TypeError):
            what = "the stored spec is unreadable"
        raise SweepError(f"{spec.source}: the spec differs from the one {out} was made with "
                         f"({what}); pass --overwrite to discard the stored results")
    if stored.get(store.MARK) != store.STORE_FORMAT:
        raise SweepError(f"out: {out} was made by an older mbbatch, without chunk checksums, so its "
                         "damage cannot be detected; pass --overwrite to rebuild it")
    names, coords = _layout(spec)
    state = store.verify(out, spec.shape, names, coords)
    if state.coords:
        store.repair_coords(out, coords, state.coords)
        warnings.warn(f"{out}: rewrote the damaged coordinates {', '.join(state.coords)} from the spec",
                      StoreNote, stacklevel=3)
    if state.damaged:
        warnings.warn(f"{out}: {len(state.damaged)} grid points failed verification (a chunk missing, "
                      "not decoding or failing its checksum) and will be recomputed: "
                      f"{_describe_damage(spec, state.damaged)}", StoreNote, stacklevel=3)
    return state.done


def _point_label(spec: SweepSpec, idx: tuple) -> str:
    return ", ".join(f"{nm}={spec.axes[nm][i]}" for nm, i in zip(spec.axes, idx)) or "the single point"


def _describe_damage(spec: SweepSpec, damaged: dict, most: int = 8) -> str:
    items = sorted(damaged.items())
    shown = [f"{_point_label(spec, idx)} ({', '.join(sorted(set(vs)))})" for idx, vs in items[:most]]
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return "; ".join(shown) + more


def _point_data(spec: SweepSpec, params: dict, sim: dict) -> dict:
    """Everything stored for one grid point, shaped for its region: the
    per-rep values, their means and intervals, the closed forms and the
    unstable flag."""
    dims = list(spec.axes)
    lead = (1,) * len(dims)
    data = {}
    for var in rep_vars(spec):
        data[var] = (dims + ["rep"], np.asarray(sim[var]).reshape(lead + (spec.reps,)))
    for var in TIME_SERIES:
        if var in sim:
            data[var] = (dims + ["rep", "time"], np.asarray(sim[var]).reshape(lead + sim[var].shape))
    known = variables(spec)
    for src, (mean_v, lo_v, hi_v) in AGGREGATES.items():
        if mean_v not in known:
            continue
        m, lo, hi = _t_interval(np.asarray(sim[src], dtype=float))
        data[mean_v] = (dims, np.full(lead, m))
        if lo_v:
            data[lo_v] = (dims, np.full(lead, lo))
            data[hi_v] = (dims, np.full(lead, hi))
    theory = point_theory(spec.arrivals, spec.service, params, spec.policy)
    for var, value in theory.items():
        if var != "unstable":
            data[var] = (dims, np.full(lead, value))
    unstable = bool(theory["unstable"]) or bool(np.any(sim["backlog_growing"]))
    data["unstable"] = (dims, np.full(lead, unstable))
    return data


def _point_task(policy, arrivals, service, params, seed, reps, grid):
    return run_point(policy, arrivals, service, params, seed, reps, grid)


def _warm_worker():
    from ._kernels import warmup

    warmup()


def _start_pool_worker(sweep_pid):
    # Ctrl-C reaches the whole job: the sweep reports it, and a worker just
    # ends, without a traceback of its own (its finished points are stored)
    signal.signal(signal.SIGINT, _end_worker)
    _exit_with(sweep_pid)
    _warm_worker()


def _end_worker(signum, frame):
    os._exit(128 + signum)


def _exit_with(sweep_pid, every=0.5):
    """End this pool worker once the sweep process that started it is gone.

    A killed sweep (kill -9, a batch scheduler's time limit) cannot shut its
    pool down, and the workers, which hold both ends of the pool's queues,
    would wait on them forever.  A daemon thread notices the new parent
    within ``every`` seconds of the current cell's end (the kernels hold the
    GIL) and exits the process; the sweep resumes from its store."""
    def watch():
        while os.getppid() == sweep_pid:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="mbbatch-exit-with-sweep", daemon=True).start()


class _Progress:
    """tqdm on a terminal; plain lines, about every 10%, elsewhere."""

    def __init__(self, total_cells: int, requests_per_cell: int, name: str, enabled: bool):
        self.total = total_cells
        self.per_cell = requests_per_cell
        self.done = 0
        self.start = time.perf_counter()
        self.enabled = enabled and total_cells > 0
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.next_line = 0.1
        if self.enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total_cells, unit="cell", desc=name, file=sys.stderr)
        elif self.enabled:
            print(f"{name}: {total_cells} cells to compute", file=sys.stderr, flush=True)

    def update(self, cells: int) -> None:
        if not self.enabled:
            return
        self.done += cells
        elapsed = time.perf_counter() - self.start
        rate = self.done * self.per_cell / elapsed if elapsed > 0 else 0.0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rate / 1e6:.1f} M requests/s", refresh=False)
            self.bar.update(cells)
        elif self.done / self.total >= self.next_line or self.done == self.total:
            eta = elapsed / self.done * (self.total - self.done)
            print(f"  {self.done}/{self.total} cells, {elapsed:.1f} s, ETA {eta:.1f} s, "
                  f"{rate / 1e6:.1f} M requests/s", file=sys.stderr, flush=True)
            while self.next_line <= self.done / self.total:
                self.next_line += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _executor_results(tasks, scheduler, workers):
    """Yield (idx, sim) as tasks finish, on the chosen executor."""
    if scheduler is not None:
        from distributed import Client, LocalCluster, as_completed as dask_completed

        cluster = None
        if scheduler == "local":
            cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                                   processes=True, host="127.0.0.1", dashboard_address=None)
            client = Client(cluster)
        else:
            client = Client(scheduler)
        try:
            futures = {client.submit(_point_task, *args, pure=False): idx for idx, args in tasks}
            for fut in dask_completed(futures):
                yield futures[fut], fut.result()
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
        return
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(tasks) <= 1:
        for idx, args in tasks:
            yield idx, _point_task(*args)
        return
    import multiprocessing as mp

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                               initializer=_start_pool_worker, initargs=(os.getpid(),))
    try:
        # the workers start while submitting: with Ctrl-C ignored from birth,
        # until their initializer makes it end them quietly
        with _sigint(signal.SIG_IGN):
            futures = {pool.submit(_point_task, *args): idx for idx, args in tasks}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    except BaseException:
        # interrupted (or a failed point): drop the queued points, not wait for them
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def run_sweep(spec, out, *, scheduler=None, workers=None, overwrite=False, netcdf=None,
              progress=True):
    """Run (or resume) a sweep and return its Dataset.

    Parameters
    ----------
    spec : str, path or SweepSpec
        The spec file (validated before anything runs) or a parsed spec.
    out : str or path
        The Zarr store.  Created if absent; resumed if it holds this spec
        (every point marked done is verified first; damaged ones are
        recomputed, with a :class:`StoreNote` naming them); an error naming
        what changed if it holds another spec, unless ``overwrite``.  The
        sweep holds an exclusive lock on it throughout: a second sweep on the
        same store stops at once with a :class:`SweepError`.
    scheduler : None, "local" or str
        None runs in-process on ``workers`` processes; ``"local"`` starts a
        dask LocalCluster on loopback; any other string is the address of an
        existing dask.distributed scheduler.
    workers : int, optional
        Processes (or LocalCluster workers); default: all cores.
    overwrite : bool
        Discard the existing store at ``out`` and start over.  Only a sweep
        store (and nothing but one) is ever deleted: anything else at ``out``
        is refused with an error, and nothing is touched.
    netcdf : str or path, optional
        Also export the finished Dataset to this NetCDF file.
    progress : bool
        Show progress (a bar on a terminal, plain lines otherwise).
    """
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an integer in [1, inf); got {workers!r}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool; got {overwrite!r}")
    check_points(spec)   # every grid point's objects and memory, before the store exists
    out = Path(out)
    if out.exists() or out.is_symlink():
        if overwrite:
            store.discardable(out)
        elif not store.is_sweep_store(out.resolve()):   # (a link to a store may be resumed through)
            raise SweepError(f"out: {out} exists and is not an mbbatch sweep store; choose another path")
    folder = out.absolute().parent
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"out: {out.parent} is a file, not a folder to put the store in")
    folder.mkdir(parents=True, exist_ok=True)
    with store.StoreLock(out):
        return _run_locked(spec, out, scheduler, workers, overwrite, netcdf, progress)


def _run_locked(spec, out, scheduler, workers, overwrite, netcdf, progress):
    exists = out.exists() or out.is_symlink()
    if exists and not overwrite:
        done = _open_existing(spec, out)
    else:
        ds = _template(spec)
        store.create(ds, _encoding(spec, ds), out, replace=exists)
        done = np.zeros(spec.shape, dtype=bool)
    pending = [(idx, params) for idx, params in spec.points() if not done[idx]]
    grid = time_grid(spec)
    tasks = [(idx, (spec.policy, spec.arrivals, spec.service, params, spec.seed, spec.reps, grid))
             for idx, params in pending]
    params_at = dict(pending)
    if tasks:
        _warm_worker()  # compile once here, so that workers load the cached kernels
    n_per_cell = int(spec.axes.get("n", [spec.params.get("n")])[0] if "n" in spec.axes else spec.params["n"])
    bar = _Progress(len(tasks) * spec.reps, n_per_cell, spec.name, progress)
    try:
        for idx, sim in _executor_results(tasks, scheduler, workers):
            data = _point_data(spec, params_at[idx], sim)
            with _whole():
                store.write_point(out, list(spec.axes), idx, data)
            bar.update(spec.reps)
    finally:
        bar.close()
    if tasks or exists:
        with _whole():
            store.consolidate(out)
    ds = store.open_dataset(out)
    if not bool(ds["done"].all()):
        raise SweepError(f"out: {out} still has points not done after the run")
    _warn_unstable(spec, ds)
    if netcdf is not None:
        ds.load().to_netcdf(netcdf)
    return ds


@contextlib.contextmanager
def _sigint(handler):
    """Ctrl-C (SIGINT) handled by ``handler`` during the block.  Only the main
    thread sets signal handlers and receives signals: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _whole():
    """Hold a Ctrl-C that comes during the block until its end: a grid point
    (or the metadata) is written whole, and the store is never left in the
    middle of an operation."""
    caught = []
    with _sigint(lambda signum, frame: caught.append(signum)):
        yield
    if caught:
        signal.raise_signal(signal.SIGINT)


def _warn_unstable(spec: SweepSpec, ds) -> None:
    unstable = ds["unstable"].values
    if unstable.any():
        idx = np.argwhere(unstable)
        names = list(spec.axes)
        shown = [", ".join(f"{nm}={ds[nm].values[i]}" for nm, i in zip(names, row)) for row in idx[:8]]
        more = f" and {len(idx) - 8} more" if len(idx) > 8 else ""
        warnings.warn(
            f"{spec.name}: {len(idx)} of {unstable.size} grid points have no steady state "
            f"(rate at or above the service rate, or a growing backlog): {'; '.join(shown)}{more}. "
            "Their averages describe a transient; figures draw them hollow.",
            UnstableWarning, stacklevel=3)


@dataclass(frozen=True)
class StoreReport:
    """What ``mbbatch check`` prints (``text``) and whether the store is intact (``ok``)."""

    text: str
    ok: bool


def check_store(path) -> StoreReport:
    """Verify a sweep store without changing it: its done, missing (not yet
    computed) and damaged grid points.  ``ok`` is False when anything is
    damaged or cannot be verified; missing points are not damage (resume the
    sweep to compute them)."""
    out = Path(path)
    if not out.exists():
        raise SweepError(f"store: {out} does not exist")
    if not store.is_sweep_store(out):
        raise SweepError(f"store: {out} is not an mbbatch sweep store (no sweep metadata in it)")
    attrs = store.stored_attrs(out)
    if attrs is None:
        return StoreReport(f"{out}: damaged: its metadata {out / 'zarr.json'} cannot be read; rebuild it "
                           "with `mbbatch sweep SPEC --out STORE --overwrite`", ok=False)
    try:
        spec = parse_spec(attrs["spec"], source=f"{out} (its stored spec)")
    except (SpecError, KeyError, TypeError) as exc:
        return StoreReport(f"{out}: damaged: its stored spec cannot be read ({exc})", ok=False)
    lines = [f"{out}: sweep {spec.name!r} ({spec.policy}), {spec.n_points} grid points x {spec.reps} reps"]
    holder = store.lock_holder(out)
    if holder:
        lines.append(f"  being written now by process {holder.get('pid', '?')} on {holder.get('host', '?')} "
                     f"(since {holder.get('since', '?')}): points may still be added")
    if attrs.get(store.MARK) != store.STORE_FORMAT:
        lines.append("  cannot be verified: made by an older mbbatch, without chunk checksums; rebuild it "
                     "with `mbbatch sweep SPEC --out STORE --overwrite`")
        return StoreReport("\n".join(lines), ok=False)
    names, coords = _layout(spec)
    try:
        state = store.verify(out, spec.shape, names, coords)
    except SweepError as exc:
        lines.append(f"  damaged: {str(exc).removeprefix('out: ')}")
        return StoreReport("\n".join(lines), ok=False)
    missing = [idx for idx in np.ndindex(*spec.shape) if not state.done[idx] and idx not in state.damaged]
    lines.append(f"  done:    {int(state.done.sum())}")
    shown = "; ".join(_point_label(spec, idx) for idx in missing[:8]) + (
        f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    lines.append(f"  missing: {len(missing)}" + (f" ({shown})" if missing else ""))
    lines.append(f"  damaged: {len(state.damaged)}" + (
        f" ({_describe_damage(spec, state.damaged)})" if state.damaged else ""))
    if state.coords:
        lines.append(f"  damaged coordinates: {', '.join(state.coords)}")
    ok = not state.damaged and not state.coords
    if ok:
        lines.append("intact" + ("" if not missing else "; resume the sweep to compute the missing points"))
    else:
        lines.append("DAMAGED: run the same `mbbatch sweep` command again; it recomputes the damaged points")
    return StoreReport("\n".join(lines), ok=ok)
