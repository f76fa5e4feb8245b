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
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from .cells import SEED_SCHEME, point_theory, run_point
from .schema import AGGREGATES, TIME_SERIES, fixed_param_attrs, rep_vars, template, time_grid, variables
from .spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["run_sweep", "SweepError", "UnstableWarning"]


class SweepError(RuntimeError):
    """A sweep cannot run against the given store."""


class UnstableWarning(UserWarning):
    """Some cells of a sweep have no steady state; their averages are transient."""


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


def _create_store(spec: SweepSpec, out: Path) -> None:
    """Write the template store under a temporary name, then move it into place."""
    ds = template(spec, _attrs(spec))
    for idx, params in spec.points():
        th = point_theory(spec.arrivals, spec.service, params, spec.policy)
        for var, value in th.items():
            ds[var].values[idx] = value
    encoding = {}
    per_rep = rep_vars(spec)
    for var in ds.data_vars:
        if var in TIME_SERIES:
            chunks = tuple(1 for _ in spec.axes) + (spec.reps, ds.sizes["time"])
        else:
            chunks = tuple(1 for _ in spec.axes) + ((spec.reps,) if var in per_rep else ())
        encoding[var] = {"chunks": chunks}
    tmp = out.with_name(out.name + ".creating")
    if tmp.exists():
        shutil.rmtree(tmp)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.to_zarr(tmp, mode="w-", encoding=encoding, consolidated=True, zarr_format=3)
    os.replace(tmp, out)


def _open_existing(spec: SweepSpec, out: Path, overwrite: bool):
    """Check an existing store against the spec; return whether to (re)create it."""
    import xarray as xr

    try:
        stored = xr.open_zarr(out, consolidated=True).attrs
    except Exception:  # noqa: BLE001 - any unreadable store
        stored = None
    if stored is None or "spec_hash" not in stored:
        if overwrite:
            return True
        raise SweepError(f"out: {out} exists and is not an mbbatch sweep store; "
                         "choose another path or pass --overwrite")
    if stored["spec_hash"] != spec.hash:
        if overwrite:
            return True
        try:
            old = parse_spec(stored["spec"], source="stored spec")
            what = "; ".join(spec.differences(old)) or "formatting of the spec"
        except SpecError:
            what = "the stored spec is unreadable"
        raise SweepError(f"{spec.source}: the spec differs from the one {out} was made with "
                         f"({what}); pass --overwrite to discard the stored results")
    return False


def _write_point(out: Path, spec: SweepSpec, idx: tuple, sim: dict, unstable_theory: bool) -> None:
    import xarray as xr

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
    unstable = unstable_theory or bool(np.any(sim["backlog_growing"]))
    data["unstable"] = (dims, np.full(lead, unstable))
    region = {d: slice(i, i + 1) for d, i in zip(dims, idx)}
    xr.Dataset(data).to_zarr(out, region={**region, "rep": slice(None)}, consolidated=False)
    # the commit mark, written only once the point's data is in place
    xr.Dataset({"done": (dims, np.ones(lead, dtype=bool))}).to_zarr(
        out, region=region, consolidated=False)


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
        The Zarr store.  Created if absent; resumed if it holds this spec;
        an error naming what changed if it holds another spec, unless
        ``overwrite``.
    scheduler : None, "local" or str
        None runs in-process on ``workers`` processes; ``"local"`` starts a
        dask LocalCluster on loopback; any other string is the address of an
        existing dask.distributed scheduler.
    workers : int, optional
        Processes (or LocalCluster workers); default: all cores.
    overwrite : bool
        Discard a store made with another spec.
    netcdf : str or path, optional
        Also export the finished Dataset to this NetCDF file.
    progress : bool
        Show progress (a bar on a terminal, plain lines otherwise).
    """
    import xarray as xr

    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an integer in [1, inf); got {workers!r}")
    out = Path(out)
    if out.exists():
        if _open_existing(spec, out, overwrite):
            shutil.rmtree(out)
    if not out.exists():
        _create_store(spec, out)

    ds = xr.open_zarr(out, consolidated=True)
    done = ds["done"].values
    unstable_theory = ds["unstable"].values.copy()
    pending = [(idx, params) for idx, params in spec.points() if not done[idx]]
    grid = time_grid(spec)
    tasks = [(idx, (spec.policy, spec.arrivals, spec.service, params, spec.seed, spec.reps, grid))
             for idx, params in pending]
    if tasks:
        _warm_worker()  # compile once here, so that workers load the cached kernels
    n_per_cell = int(spec.axes.get("n", [spec.params.get("n")])[0] if "n" in spec.axes else spec.params["n"])
    bar = _Progress(len(tasks) * spec.reps, n_per_cell, spec.name, progress)
    try:
        for idx, sim in _executor_results(tasks, scheduler, workers):
            with _whole():
                _write_point(out, spec, idx, sim, bool(unstable_theory[idx]))
            bar.update(spec.reps)
    finally:
        bar.close()
    if tasks:
        import zarr

        with _whole(), warnings.catch_warnings():
            # consolidated metadata is a zarr-python extension to format 3; xarray reads it
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            zarr.consolidate_metadata(str(out))
    ds = xr.open_zarr(out, consolidated=True)
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
