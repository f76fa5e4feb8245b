"""Run a sweep into a Zarr store that survives interruption.

The store is created whole before any cell runs: every variable at its fill
value, closed forms computed.  Grid points are computed on an
:class:`~mbbatch.sweeps.executors.Executor` and written in batches, a few
seconds apart: each batch's data chunks first, then its ``done`` flags.
Zarr writes every chunk atomically (a temporary file renamed into place), so a
run killed at any moment leaves each point either done or not done, never
half-recorded: starting again computes exactly the points not done.  Cell
values depend only on the spec and the cell's parameters, so an interrupted
and resumed sweep ends bit-identical to an uninterrupted one, whatever the
executor or the number of workers.

The store itself (checksums, verification on resume, the one-writer lock,
what ``overwrite`` may delete) is :mod:`mbbatch.sweeps.store`.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import stats
from ..arrivals import Gamma
from ..results import UnstableWarning
from . import store
from .cells import SEED_SCHEME, check_points, point_theory, run_capacity_point, run_point, trace_of
from .executors import Executor, check_spawn_safe, warm_worker, whole
from .schema import (CAPACITY, CAPACITY_THEORY, CLASS_DIM, FILL, aggregates, class_aggregates, class_dims,
                     coord_values, rep_vars, spec_attrs, template, time_grid, time_series, variables)
from .spec import SpecError, SweepSpec, load_spec, parse_spec
from .store import StoreNote, SweepError

__all__ = ["run_sweep", "run_sweeps", "check_store", "verify_store", "open_store", "StoreReport", "Summary",
           "SweepError", "UnstableWarning", "StoreNote"]

#: a batch of finished grid points is written at most this often, s
FLUSH_SECONDS = 2.0


def _attrs(spec: SweepSpec) -> dict:
    from ..provenance import code_hash, git_commit, versions

    return {
        "name": spec.name,
        "description": spec.description,
        "arrivals": spec.arrivals,
        "service": spec.service,
        **({"reps": spec.reps} if spec.capacity is None
           else {f"capacity_{k}": v for k, v in spec.capacity.items()}),
        "seed": str(spec.seed),
        "spec": spec.text,
        "spec_canonical": spec.canonical,
        "spec_hash": spec.hash,
        "seed_scheme": SEED_SCHEME,
        "axes": list(spec.axes),
        "git_commit": git_commit(),
        "code_hash": code_hash(),
        "confidence_level": spec.confidence,
        **({"baseline": spec.baseline} if spec.baseline is not None else {}),
        **spec_attrs(spec),
        **_trace_attrs(spec),
        **_profile_attrs(spec),
        **({"gamma_gaps": Gamma.SAMPLER} if spec.arrivals == "gamma" else {}),
        **versions(),
    }


def _profile_attrs(spec: SweepSpec) -> dict:
    """The hardware profiles a ``service_model = "profile"`` spec times its
    runs with: each one's source, data SHA-256, rows, coefficients and fit
    errors (:func:`mbbatch.profiles.provenance`), as JSON by name."""
    if spec.service_model != "profile" or spec.workload not in ("tokens", "trace"):
        return {}
    from .. import profiles

    used = dict.fromkeys(cell["profile"] for _, cell in spec.points())
    return {"profiles": json.dumps({name: profiles.provenance(name) for name in used}, sort_keys=True)}


def _trace_attrs(spec: SweepSpec) -> dict:
    """The trace of a [workload] spec: its file's name, format, size, SHA-256
    (what a resumed sweep checks the file against) and the filters applied,
    with the requests kept and their span.  When a filter is a grid axis
    (window_start, window_end, drop_failed), ``trace_filters`` names it under
    ``"grid axes"`` and the requests and span, which differ by grid point,
    are left out."""
    if spec.trace is None:
        return {}
    d = trace_of(next(spec.points())[1]).describe()
    out = {"trace_file": d["source"], "trace_format": d["format"], "trace_size": int(d["size"]),
           "trace_sha256": d["sha256"]}
    axes = [k for k in ("window_start", "window_end", "drop_failed") if k in spec.axes]
    if axes:
        fixed = {k: v for k, v in d["filters"].items()
                  if not (k == "window" and {"window_start", "window_end"} & set(axes))
                 and not (k == "drop_failed" and "drop_failed" in axes)}
        return {**out, "trace_filters": json.dumps({**fixed, "grid axes": axes}, sort_keys=True)}
    return {**out, "trace_filters": json.dumps(d["filters"], sort_keys=True),
            "trace_requests": int(d["requests"]), "trace_span_s": float(d["span_s"])}


def _encoding(spec: SweepSpec, ds) -> dict:
    """Chunks: blocks of grid points (:func:`store.grid_chunks`), each holding
    all the reps (and times) of its points."""
    grid = store.grid_chunks(spec.shape)
    per_rep = rep_vars(spec)
    series = time_series(spec.kinds)
    by_class = class_dims(spec)
    encoding = {}
    for var in ds.data_vars:
        if var in series:
            chunks = grid + (spec.reps, ds.sizes["time"])
        else:
            chunks = grid + ((spec.reps,) if var in per_rep else ()) + \
                ((ds.sizes[CLASS_DIM],) if var in by_class else ())
        encoding[var] = {"chunks": chunks}
    return encoding


def _layout(spec: SweepSpec) -> tuple[list, dict]:
    """The store's data variables and its coordinates with their values."""
    names = list(variables(spec))
    grid = time_grid(spec)
    if grid is not None:
        names += list(time_series(spec.kinds))
    coords = {nm: coord_values(nm, vals) for nm, vals in spec.axes.items()}
    if spec.capacity is None:
        coords["rep"] = np.arange(spec.reps)
    if grid is not None:
        coords["time"] = grid
    if class_dims(spec):
        coords[CLASS_DIM] = coord_values(CLASS_DIM, list(spec.classes))
    return names, coords


def _template(spec: SweepSpec, theory: dict):
    """The store's Dataset before any cell runs: closed forms filled in."""
    ds = template(spec, _attrs(spec))
    for idx, values in theory.items():
        for var, value in values.items():
            if var in ds:
                ds[var].values[idx] = value
    return ds


def _older_gamma_gaps(spec: SweepSpec, attrs: dict) -> bool:
    """Whether a store of ``spec`` holds gamma arrivals whose gaps were drawn
    another way than today's (``attrs["gamma_gaps"]``, absent before it was
    recorded): it may be read, not resumed."""
    return spec.arrivals == "gamma" and attrs.get("gamma_gaps") != Gamma.SAMPLER


def _open_existing(spec: SweepSpec, out: Path) -> store.StoreState:
    """Check an existing store against the spec and verify it; return its
    state (which grid points are done and intact, and its values).  Damaged
    points are reported (a :class:`StoreNote`) and left to recompute; damaged
    coordinates are rewritten from the spec."""
    stored = store.stored_attrs(out)
    if stored is None or "spec_hash" not in stored:
        raise SweepError(f"out: {out} is damaged: its metadata {out / 'zarr.json'} cannot be read; "
                         "pass --overwrite to rebuild it (its results are then lost)")
    if stored["spec_hash"] != spec.hash:
        try:
            old = parse_spec(stored["spec"], source="stored spec", name=stored.get("name"))
            what = "; ".join(spec.differences(old)) or "formatting of the spec"
        except (SpecError, KeyError, TypeError):
            what = "the stored spec is unreadable"
        raise SweepError(f"{spec.source}: the spec differs from the one {out} was made with "
                         f"({what}); pass --overwrite to discard the stored results")
    if stored.get(store.MARK) != store.STORE_FORMAT:
        raise SweepError(f"out: {out} was made by an older mbbatch, without chunk checksums, so its "
                         "damage cannot be detected; pass --overwrite to rebuild it")
    now = _trace_attrs(spec)
    if now and stored.get("trace_sha256") != now["trace_sha256"]:
        raise SweepError(f"{spec.source}: the trace {spec.trace['path']} is not the file {out} was made with "
                         f"(SHA-256 {now['trace_sha256'][:12]}... against {str(stored.get('trace_sha256'))[:12]}...); "
                         "pass --overwrite to discard the stored results")
    names, coords = _layout(spec)
    state = store.verify(out, spec.shape, names, coords)
    if _older_gamma_gaps(spec, stored) and not state.done.all():
        todo = int((~state.done).sum())
        raise SweepError(f"out: {out} holds gamma arrivals drawn by an older mbbatch, whose gaps were drawn "
                         f"another way (now: {Gamma.SAMPLER}): the {todo} point{'s' if todo > 1 else ''} still "
                         "to compute would not match the ones it holds; pass --overwrite to recompute them all "
                         "(its results are then lost), or keep it as it is")
    if state.coords:
        store.repair_coords(out, coords, state.coords)
        warnings.warn(f"{out}: rewrote the damaged coordinates {', '.join(state.coords)} from the spec",
                      StoreNote, stacklevel=4)
    if state.damaged:
        warnings.warn(f"{out}: {len(state.damaged)} grid points failed verification (a chunk missing, "
                      "not decoding or failing its checksum) and will be recomputed: "
                      f"{_describe_damage(spec, state.damaged)}", StoreNote, stacklevel=4)
    return state


def _point_label(spec: SweepSpec, idx: tuple) -> str:
    return ", ".join(f"{nm}={spec.axes[nm][i]}" for nm, i in zip(spec.axes, idx)) or "the single point"


def _describe_damage(spec: SweepSpec, damaged: dict, most: int = 8) -> str:
    items = sorted(damaged.items())
    shown = [f"{_point_label(spec, idx)} ({', '.join(sorted(set(vs)))})" for idx, vs in items[:most]]
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return "; ".join(shown) + more


def _point_data(spec: SweepSpec, sim: dict, theory: dict) -> dict:
    """Everything stored for one grid point: the per-rep values, their means
    and intervals, the closed forms and the unstable flag (fill values for
    metrics that do not apply to the point's policy); a capacity search's
    results and closed forms."""
    data = {}
    kinds = variables(spec)
    if spec.capacity is not None:
        data = {var: sim[var] for var in CAPACITY}
        for var in CAPACITY_THEORY:
            if var in kinds:
                data[var] = theory.get(var, math.nan)
        return data
    for var in rep_vars(spec):
        data[var] = sim[var] if var in sim else np.full(spec.reps, FILL[kinds[var][1]], dtype=kinds[var][1])
    for var in time_series(spec.kinds):
        if var in sim:
            data[var] = sim[var]
    for src, (mean_v, lo_v, hi_v) in aggregates(spec).items():
        data[mean_v], data[lo_v], data[hi_v] = stats.t_interval(np.asarray(data[src], dtype=float),
                                                                spec.confidence)
    # (each class's: its column of the reps x classes values)
    for src, (mean_v, lo_v, hi_v) in class_aggregates(spec).items():
        per = [stats.t_interval(col, spec.confidence) for col in np.asarray(data[src], dtype=float).T]
        data[mean_v], data[lo_v], data[hi_v] = (np.array(x, dtype=float) for x in zip(*per))
    for var, value in theory.items():
        if var != "unstable":
            data[var] = value
    for var in kinds:
        if var.startswith(("theory_", "capacity")) and var not in data:
            data[var] = math.nan
    data["unstable"] = bool(theory["unstable"]) or bool(np.any(data["backlog_growing"]))
    return data


def _point_task(arrivals, service, params, seed, reps, grid):
    return run_point(arrivals, service, params, seed, reps, grid)


def _capacity_task(arrivals, service, params, seed, capacity):
    return run_capacity_point(arrivals, service, params, seed, capacity)


@dataclass(frozen=True)
class Summary:
    """What one sweep run did: grid points and requests computed, wall time
    (s), and the kernels' time (s, summed over workers)."""

    name: str
    points: int
    requests: int
    wall: float
    kernel: float
    parallel: int
    #: computed beside other sweeps on one pool (``wall`` is then the time
    #: spent storing this one, and the run's own summary gives the share)
    overlapped: bool = False

    @property
    def kernel_share(self) -> float:
        """Share of the wall time the kernels ran (per process computing)."""
        if self.overlapped:
            return math.nan
        return self.kernel / (self.wall * self.parallel) if self.wall > 0 else math.nan

    def line(self) -> str:
        if self.overlapped:
            return (f"{self.name}: {self.points} grid points, {self.requests:.3g} requests, "
                    f"{self.kernel:.1f} s in the kernels (computed beside the other sweeps)")
        rate = self.requests / self.wall if self.wall > 0 else math.nan
        share = f"{100 * self.kernel_share:.0f}% of it in the kernels" if self.points else "nothing to compute"
        per = f" per process ({self.parallel})" if self.parallel > 1 and self.points else ""
        return (f"{self.name}: {self.points} grid points, {self.requests:.3g} requests in {self.wall:.1f} s, "
                f"{rate / 1e6:.1f} M requests/s, {share}{per}")


class _Progress:
    """tqdm on a terminal; plain lines, about every 10%, elsewhere."""

    def __init__(self, total_cells: int, requests_per_cell: int, name: str, enabled: bool):
        self.total = total_cells
        self.per_cell = requests_per_cell
        self.done = 0
        self.requests = 0
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

    def update(self, cells: int, requests: int | None = None) -> None:
        """``cells`` more done, which simulated ``requests`` (default: the
        requests of a cell each)."""
        if not self.enabled:
            return
        self.done += cells
        self.requests += cells * self.per_cell if requests is None else requests
        elapsed = time.perf_counter() - self.start
        rate = self.requests / elapsed if elapsed > 0 else 0.0
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


def _prepare(spec, out, overwrite, rebuild_stale=False):
    """Validate everything that can be validated before the store is touched."""
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool; got {overwrite!r}")
    check_points(spec)   # every grid point's objects and memory, before the store exists
    out = Path(out)
    if out.exists() or out.is_symlink():
        if overwrite or (rebuild_stale and _stale(spec, out)):
            store.discardable(out)
        elif not store.is_sweep_store(out.resolve()):   # (a link to a store may be resumed through)
            raise SweepError(f"out: {out} exists and is not an mbbatch sweep store; choose another path")
    folder = out.absolute().parent
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"out: {out.parent} is a file, not a folder to put the store in")
    return spec, out


def _stale(spec: SweepSpec, out: Path) -> bool:
    """Whether a store at ``out`` was made from another spec or by other code."""
    from ..provenance import code_hash

    stored = store.stored_attrs(out)
    return (stored is None or stored.get("spec_hash") != spec.hash or stored.get("code_hash") != code_hash()
            or stored.get(store.MARK) != store.STORE_FORMAT)


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
        Also export the finished Dataset to this NetCDF file (checked before
        the sweep runs: an existing file there is replaced only if mbbatch
        wrote it).
    progress : bool
        Show progress (a bar on a terminal, plain lines otherwise) and end
        with a one-line summary.
    """
    _check_workers(workers)
    check_spawn_safe("run_sweep", scheduler, workers)
    spec, out = _prepare(spec, out, overwrite)
    if netcdf is not None:
        store.check_export(netcdf, "netcdf")
    with Executor(scheduler, workers) as ex:
        ds, summary = _sweep(spec, out, ex, overwrite, netcdf, progress)
    if progress:
        print(summary.line(), file=sys.stderr, flush=True)
    return ds


def run_sweeps(specs, out_dir, *, scheduler=None, workers=None, overwrite=False, rebuild_stale=False,
               progress=True) -> list:
    """Run (or resume) several sweeps, each into ``out_dir/NAME.zarr``, on one
    executor (one pool of workers for all); every spec is checked before any
    runs.  ``rebuild_stale`` discards (and recomputes) a store made from
    another spec or by other code.  Returns the ``(Dataset, Summary)`` of
    each sweep."""
    _check_workers(workers)
    check_spawn_safe("run_sweeps", scheduler, workers)
    out_dir = Path(out_dir)
    specs = [s if isinstance(s, SweepSpec) else load_spec(s) for s in specs]
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SpecError(f"the specs name the same sweep twice: {dup}")
    prepared = [_prepare(s, out_dir / f"{s.name}.zarr", overwrite, rebuild_stale) for s in specs]
    results = []
    start = time.perf_counter()
    with Executor(scheduler, workers) as ex, contextlib.ExitStack() as held:
        # on a pool (or dask) every sweep's points are submitted at once: the
        # workers compute while this process writes the stores one by one
        overlapped = ex.submits_ahead and len(prepared) > 1
        runs = []
        for spec, out in prepared:
            discard = overwrite or (rebuild_stale and (out.exists() or out.is_symlink()) and _stale(spec, out))
            out.absolute().parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(store.StoreLock(out))
            runs.append(_Run(spec, out, ex, discard, None, progress, overlapped))
        try:
            if overlapped:
                for run in runs:
                    run.start()
            for run in runs:
                if not overlapped:
                    run.start()
                ds, summary = run.finish()
                if progress:
                    print(summary.line(), file=sys.stderr, flush=True)
                results.append((ds, summary))
        finally:
            for run in runs:
                run.close()
        if overlapped and progress:
            total = Summary(f"{len(runs)} sweeps", sum(s.points for _, s in results),
                            sum(s.requests for _, s in results), time.perf_counter() - start,
                            sum(s.kernel for _, s in results), ex.parallel)
            print(total.line(), file=sys.stderr, flush=True)
    return results


def _check_workers(workers):
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an integer in [1, inf); got {workers!r}")


def _sweep(spec: SweepSpec, out: Path, ex: Executor, overwrite: bool, netcdf, progress):
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    with store.StoreLock(out):
        run = _Run(spec, out, ex, overwrite, netcdf, progress)
        try:
            run.start()
            return run.finish()
        finally:
            run.close()


class _Run:
    """One sweep, its store locked: :meth:`start` submits its pending grid
    points, :meth:`finish` creates (or has verified) the store and stores
    their results as they come.  Several sweeps on one pool of workers are
    all started first, so the workers compute the next sweeps' points while
    this process writes a store (``overlapped``)."""

    def __init__(self, spec, out, ex, overwrite, netcdf, progress, overlapped=False):
        self.spec, self.out, self.ex, self.netcdf, self.progress = spec, out, ex, netcdf, progress
        self.overlapped = overlapped
        self.exists = out.exists() or out.is_symlink()
        self.fresh = overwrite or not self.exists
        self.results = iter(())

    def start(self) -> None:
        spec, out = self.spec, self.out
        self.t0 = time.perf_counter()
        if self.fresh:
            self.done = np.zeros(spec.shape, dtype=bool)
        else:
            state = _open_existing(spec, out)
            self.done, self.values = state.done, state.values
        pending = [(idx, params) for idx, params in spec.points() if not self.done[idx]]
        grid = time_grid(spec)
        if spec.capacity is None:
            self.tasks = [(idx, _point_task, (spec.arrivals, spec.service, params, spec.seed_of(params), spec.reps,
                                              grid)) for idx, params in pending]
        else:
            self.tasks = [(idx, _capacity_task, (spec.arrivals, spec.service, params, spec.seed_of(params),
                                                 spec.capacity)) for idx, params in pending]
        self.n_cell = {idx: params["n"] for idx, params in pending}
        if self.tasks:
            warm_worker()  # compile once here, so that workers load the cached kernels
        # (the points start computing now, while their closed forms and the
        # store are made)
        self.results = self.ex.run(self.tasks)
        try:
            self.theory = {idx: point_theory(spec.arrivals, spec.service, params) for idx, params in spec.points()}
            if self.fresh:
                self.ds = _template(spec, self.theory)
        except BaseException:
            self.close()
            raise

    def finish(self):
        spec, out, done = self.spec, self.out, self.done
        start = self.t0 if not self.overlapped else time.perf_counter()
        bar = _Progress(len(self.tasks) * spec.reps, int(next(iter(self.n_cell.values()), 0)), spec.name,
                        self.progress)
        try:
            # made and opened whole: a Ctrl-C meanwhile waits for it (a zarr operation cut short
            # leaves its event loop's tasks pending, and their warnings)
            with whole():
                if self.fresh:
                    store.create(self.ds, _encoding(spec, self.ds), out, replace=self.exists)
                    self.values = {var: self.ds[var].values.copy() for var in self.ds.data_vars if var != "done"}
                values = self.values
                writer = store.BlockWriter(out, spec.shape, list(values))
        except BaseException:
            self.close()
            bar.close()
            raise
        chunks = writer.chunks
        dirty, last_flush, requests, kernel = set(), time.perf_counter(), 0, 0.0

        def flush():
            nonlocal last_flush
            with whole():
                writer.write(values, dirty, done)
            dirty.clear()
            last_flush = time.perf_counter()

        try:
            for idx, sim in self.results:
                kernel += sim.pop("_kernel_seconds", 0.0)
                for var, value in _point_data(spec, sim, self.theory[idx]).items():
                    values[var][idx] = value
                done[idx] = True
                dirty.add(store.block_of(idx, chunks))
                added = int(sim["capacity_requests"]) if spec.capacity is not None else self.n_cell[idx] * spec.reps
                requests += added
                bar.update(spec.reps, added)
                if time.perf_counter() - last_flush >= FLUSH_SECONDS:
                    flush()
        finally:
            # what finished is kept, also when interrupted
            self.close()
            flush()
            bar.close()
        if not self.fresh:   # (a new store's consolidated metadata is written with it, and stays true)
            with whole():
                store.consolidate(out)
        if not done.all():
            raise SweepError(f"out: {out} still has points not done after the run")
        ds = with_differences(store.open_dataset(out))
        if "unstable" in values:
            _warn_unstable(spec, np.asarray(values["unstable"], dtype=bool))
        if self.netcdf is not None:
            store.write_netcdf(ds.load(), self.netcdf)
        summary = Summary(spec.name, len(self.tasks), requests, time.perf_counter() - start, kernel,
                          self.ex.parallel if len(self.tasks) > 1 else 1, overlapped=self.overlapped)
        return ds, summary

    def close(self) -> None:
        """Stop the points not yet finished."""
        _close(self.results)


def _close(results) -> None:
    """Stop an executor's results iterator (its unfinished tasks)."""
    close = getattr(results, "close", None)
    if close is not None:
        close()


def _warn_unstable(spec: SweepSpec, unstable: np.ndarray) -> None:
    if unstable.any():
        idx = np.argwhere(unstable)
        coords = {nm: coord_values(nm, vals) for nm, vals in spec.axes.items()}
        shown = [", ".join(f"{nm}={coords[nm][i]}" for nm, i in zip(coords, row)) for row in idx[:8]]
        more = f" and {len(idx) - 8} more" if len(idx) > 8 else ""
        warnings.warn(
            f"{spec.name}: {len(idx)} of {unstable.size} grid points have no steady state "
            f"(rate at or above the service rate, or a growing backlog)"
            + (f": {'; '.join(shown)}{more}. " if coords else ". ") +
            "Their averages describe a transient; figures draw them hollow.",
            UnstableWarning, stacklevel=4)


@dataclass(frozen=True)
class StoreReport:
    """What ``mbbatch check`` prints (``text``) and whether the store is intact (``ok``)."""

    text: str
    ok: bool


def verify_store(path) -> Path:
    """``path`` if it is an intact sweep store, else a
    :class:`SweepError` naming it: not a sweep store (and
    why), or failing its verification.

    The verification is ``mbbatch check``'s (:func:`.store.verify`:
    every chunk present and passing its checksum), on the layout the store's
    own metadata records (:func:`.store.stored_layout`), so
    a store made from any spec, by any mbbatch that wrote checksums, can be
    drawn.  Points not yet computed are not damage: a plot leaves them out."""
    path = Path(path)
    if not path.is_dir() or not store.is_sweep_store(path.resolve()):
        why = ("no such file or folder" if not path.exists() and not path.is_symlink() else
               "it is a file, not a folder" if not path.is_dir() else
               "it has no zarr.json (no Zarr store's metadata)" if not (path / "zarr.json").exists() else
               "its zarr.json has no sweep metadata (a sweep's spec_hash and seed_scheme)")
        raise store.SweepError(f"{path} is not an mbbatch sweep store: {why}; `mbbatch sweep SPEC --out STORE` "
                               "writes one")
    check = f"`mbbatch check {path}` says what is wrong"
    if store.stored_attrs(path) is None:
        raise store.SweepError(f"{path} is damaged: its metadata {path / 'zarr.json'} cannot be read; it is not "
                               f"drawn ({check})")
    try:
        state = store.verify(path, *store.stored_layout(path))
    except store.SweepError as exc:     # metadata that cannot be read; a store made before checksums
        raise store.SweepError(f"{str(exc).removeprefix('out: ')}; it is not drawn ({check})") from None
    if state.damaged or state.coords:
        variables = sorted({v for vs in state.damaged.values() for v in vs})
        what = "; ".join(
            ([f"{len(state.damaged)} grid point{'s' if len(state.damaged) != 1 else ''} failed verification "
              f"(missing or corrupt chunks of {', '.join(variables)})"] if state.damaged else []) +
            ([f"damaged coordinates ({', '.join(state.coords)})"] if state.coords else []))
        raise store.SweepError(f"{path} is damaged, so it is not drawn: {what}; `mbbatch check {path}` names what "
                               "is damaged, and the sweep's command, run again, recomputes it")
    return path


def open_store(path):
    """The sweep store at ``path`` as an :class:`xarray.Dataset`, after
    :func:`verify_store` (a folder that is not a store, or a damaged one, is
    named and not opened): what ``mbbatch plot`` draws, and what
    :func:`mbbatch.figures.plot` takes."""
    import xarray as xr

    return with_differences(xr.open_zarr(verify_store(path), chunks=None))


def with_differences(ds):
    """A sweep's Dataset with, where its spec names a ``baseline``, each
    policy's paired differences to it at the spec's confidence
    (:func:`mbbatch.stats.paired_differences`: ``diff_<metric>``,
    ``ratio_<metric>``, their intervals and ``verdict_<metric>``)."""
    baseline = ds.attrs.get("baseline")
    if not baseline:
        return ds
    from ..stats import paired_differences

    return ds.merge(paired_differences(ds, baseline, float(ds.attrs.get("confidence_level", 0.95))))


def check_store(path) -> StoreReport:
    """Verify a sweep store without changing it: its done, missing (not yet
    computed) and damaged grid points.  ``ok`` is False when anything is
    damaged or cannot be verified; missing points are not damage (resume the
    sweep to compute them)."""
    out = Path(path)
    if not out.exists():
        raise SweepError(f"store: {out} does not exist")
    if not store.is_sweep_store(out.resolve()):
        raise SweepError(f"store: {out} is not an mbbatch sweep store (no sweep metadata in it)")
    attrs = store.stored_attrs(out)
    if attrs is None:
        return StoreReport(f"{out}: damaged: its metadata {out / 'zarr.json'} cannot be read; rebuild it "
                           "with `mbbatch sweep SPEC --out STORE --overwrite`", ok=False)
    try:
        # (its name as stored: a spec file without one is named after the file)
        spec = parse_spec(attrs["spec"], source=f"{out} (its stored spec)", name=attrs.get("name"))
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
    older = _older_gamma_gaps(spec, attrs)
    if older:
        lines.append("  its gamma gaps were drawn by an older mbbatch, another way: it can be read, not resumed")
    ok = not state.damaged and not state.coords
    if ok:
        lines.append("intact" + ("" if not missing else "; resume the sweep to compute the missing points"
                                 if not older else "; its missing points can only be computed afresh (--overwrite)"))
    else:
        lines.append("DAMAGED: run the same `mbbatch sweep` command again; it recomputes the damaged points")
    return StoreReport("\n".join(lines), ok=ok)
