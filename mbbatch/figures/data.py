"""Reading the stored datasets the figures are drawn from.

Where a dataset lives and which command writes it; lines, per-replication
values and constants selected from a Dataset (cells whose ``done`` flag is
false read as NaN); the closed forms drawn beside them; and the labels made
from a Dataset's attrs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from .. import metrics, params, theory

__all__ = ["NETCDF", "dataset_path", "dataset_command", "open_dataset", "line", "per_rep",
           "controller_series", "constant", "unit", "closed_form_curve", "theorem_4_2_vs_k",
           "servers_label", "setting", "token_setting", "variants", "sim_series"]

#: Datasets stored as NetCDF files (``<name>.nc``), written by ``mbbatch example``,
#: rather than zarr stores written by ``mbbatch sweep``.
NETCDF = {"fig1b", "engine_event"}


# ---------------------------------------------------------------- locating and opening

def dataset_path(results_dir, dataset: str) -> Path:
    """File a dataset is read from: ``<results_dir>/<dataset>.zarr`` (or ``.nc``)."""
    ext = ".nc" if dataset in NETCDF else ".zarr"
    return Path(results_dir) / f"{dataset}{ext}"


def dataset_command(dataset: str, results_dir="results") -> str:
    """The command that writes a dataset into ``results_dir``."""
    path = dataset_path(results_dir, dataset)
    if dataset in NETCDF:
        return f"mbbatch example {dataset} --out {path}"
    return f"mbbatch sweep sweeps/{dataset}.toml --out {path}"


def open_dataset(results_dir, dataset: str) -> xr.Dataset:
    """The dataset, loaded into memory (the file is closed again)."""
    path = dataset_path(results_dir, dataset)
    if dataset in NETCDF:
        with xr.open_dataset(path) as ds:
            return ds.load()
    with xr.open_zarr(path, chunks=None) as ds:
        return ds.load()


# ---------------------------------------------------------------- selecting values

def line(ds: xr.Dataset, var: str, x: str, **sel) -> np.ndarray:
    """``ds[var]`` at ``sel`` as a 1-D float (or bool) array along axis ``x``.

    Singleton dimensions other than ``x`` are dropped; cells not ``done`` are NaN
    (or False).  With ``x=None`` the result is a scalar.
    """
    da = ds[var]
    if sel:
        da = da.sel(**{k: v for k, v in sel.items() if k in da.dims})
    keep = () if x is None else (x,)
    for d in [d for d in da.dims if d not in keep]:
        if da.sizes[d] != 1:
            raise ValueError(f"{var}: expected one value along {d!r}, found {da.sizes[d]}")
        da = da.isel({d: 0})
    if x is not None:
        da = da.transpose(x)
    values = np.asarray(da.values)
    simulated = not (var == "done" or var == "capacity" or var.startswith("theory_"))
    if simulated and "done" in ds:
        done = np.asarray(line(ds, "done", x, **sel), dtype=bool)
        if values.dtype == bool:
            values = values & done
        else:
            values = np.where(done, values.astype(float), np.nan)
    elif values.dtype != bool:
        values = values.astype(float)
    return values


def sim_series(ds: xr.Dataset, var: str, x: str, **sel) -> tuple:
    """``(mean, ci_low, ci_high, unstable)`` of the stored metric ``var``
    (``sim_throughput``, ``sim_mean_latency``, ...) along ``x`` at ``sel``:
    what :func:`~.style.sim_points` draws."""
    return tuple(line(ds, v, x, **sel) for v in (f"{var}_mean", f"{var}_ci_low", f"{var}_ci_high", "unstable"))


def per_rep(ds, var, x, **sel) -> np.ndarray:
    """Per-rep ``ds[var]`` at ``sel`` as a (len(x), reps) float array; cells not done NaN."""
    da = ds[var]
    if sel:
        da = da.sel(**{k: v for k, v in sel.items() if k in da.dims})
    for d in [d for d in da.dims if d not in (x, "rep")]:
        if da.sizes[d] != 1:
            raise ValueError(f"{var}: expected one value along {d!r}, found {da.sizes[d]}")
        da = da.isel({d: 0})
    values = np.asarray(da.transpose(x, "rep").values, dtype=float)
    if "done" in ds:
        done = np.asarray(line(ds, "done", x, **sel), dtype=bool)
        values = np.where(done[:, None], values, np.nan)
    return values


def time_series(ds, var, **sel) -> np.ndarray:
    """(reps, time) array of a load-step time series at the grid point
    ``sel`` (the first value of any other axis); NaN where not done."""
    da = ds[var].sel(**sel)
    rest = {d: 0 for d in da.dims if d not in ("rep", "time")}
    da = da.isel(rest)
    values = np.asarray(da.transpose("rep", "time").values, dtype=float)
    if "done" in ds and not bool(np.asarray(ds["done"].sel(**sel).isel(rest).values).all()):
        values = np.full_like(values, np.nan)
    return values


def controller_series(ds, var, ctl) -> np.ndarray:
    """(reps, time) array of a time series for one controller; NaN where not done."""
    return time_series(ds, var, controller=ctl)


def _first_finite(values, default=np.nan) -> float:
    """The first finite value, or ``default`` if there is none."""
    values = np.atleast_1d(np.asarray(values, dtype=float))
    finite = values[np.isfinite(values)]
    return float(finite[0]) if finite.size else default


def constant(ds, var, **sel) -> float:
    """A closed form that is constant along the remaining axes (e.g. over rate)."""
    da = ds[var]
    if sel:
        da = da.sel(**{k: v for k, v in sel.items() if k in da.dims})
    return _first_finite(np.asarray(da.values, dtype=float).ravel())


def unit(ds, var, default=None):
    """The units of ``ds[var]``: its ``units`` attr, else those the metric or
    parameter table declares for it, else ``default``."""
    if var in ds and "units" in ds[var].attrs:
        return ds[var].attrs["units"]
    m = metrics.by_var(var)
    if m is not None:
        return m.units
    if var in params.PARAMS:
        return params.PARAMS[var].units
    return default


# ---------------------------------------------------------------- closed forms beside the data

def closed_form_curve(ds, var, closed_form, **sel):
    """A closed form of ``rate`` as a smooth curve, if it reproduces ``ds[var]``.

    ``closed_form(rates)`` must equal the stored ``var`` at the grid's rates
    (where that is finite); then it is drawn on a fine rate grid.  Otherwise
    the stored values are drawn through the grid points as they are.
    """
    rates = np.asarray(ds["rate"].values, dtype=float)
    stored = line(ds, var, "rate", **sel)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_grid = np.asarray(closed_form(rates), dtype=float)
    ok = np.isfinite(stored)
    if ok.any() and np.allclose(at_grid[ok], stored[ok], rtol=1e-9, atol=0):
        xd = _rate_grid(rates)
        return xd, np.asarray(closed_form(xd), dtype=float)
    return rates, stored


def _rate_grid(rates) -> np.ndarray:
    rates = np.asarray(rates, dtype=float)
    lo, hi = float(np.nanmin(rates)), float(np.nanmax(rates))
    return np.linspace(lo, hi, 600)


def theorem_4_2_vs_k(ds):
    """A saturated uniform sweep over ``bins``: its parameters, the simulated
    k, and Theorem 4.2's throughput on k = 1..max(64, largest k)."""
    a = ds.attrs
    B, l_min, l_max = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    servers = float(a.get("servers", 1.0))
    ks = np.asarray(ds["bins"].values, dtype=float)
    kmax = int(max(64, np.nanmax(ks)))
    kd = np.arange(1, kmax + 1)
    thr = servers * np.asarray(theory.throughput(B, l_min, l_max, kd), dtype=float)
    return B, l_min, l_max, servers, ks, kmax, kd, thr


# ---------------------------------------------------------------- labels from attrs

def _service_label(ds) -> str:
    """The service distribution, e.g. ``U(1, 20) s service``."""
    a = ds.attrs
    if a.get("service") == "expon":
        return f"Exp($\\mu$ = {float(a['mu']):g}/s) service"
    if a.get("service") == "uniform":
        return f"U({float(a['l_min']):g}, {float(a['l_max']):g}) s service"
    if "trace_file" in a:
        per = 1e3 * float(a.get("per_token", 1.0))
        base = float(a.get("base", 0.0))
        return (f"{a['trace_file']} output lengths, {base:g} s + {per:g} ms/token")
    return f"{a.get('service', '?')} service"


def servers_label(s) -> str:
    """``1 server``, ``8 servers`` or ``$\\infty$ servers``."""
    s = float(s)
    if np.isinf(s):
        return "$\\infty$ servers"
    return "1 server" if s == 1 else f"{s:g} servers"


def setting(ds, *, servers=True) -> str:
    """One line naming a multi-bin sweep's service, B, servers, n and reps."""
    a = ds.attrs
    parts = [_service_label(ds), f"B = {int(a['batch_size'])}"]
    if servers and "servers" in a:
        parts.append(servers_label(a["servers"]))
    if "n" in a:
        parts.append(f"n = {int(a['n']):,}")
    if "reps" in a:
        parts.append(f"{int(a['reps'])} reps")
    return ", ".join(parts)


def token_setting(ds, wrap=False) -> str:
    """A token-policy sweep's service model, lengths, SLA, memory, n and reps."""
    a = ds.attrs
    d, eps = 1e3 * float(a["d_sla"]), 1e3 * float(a.get("eps_d", 0.0))
    parts = [f"{a.get('service', 'decode')} service model",
             f"prompt LogN(median {float(a['prompt_median']):g}, $\\sigma$ {float(a['prompt_sigma']):g})",
             f"output LogN(median {float(a['output_median']):g}, $\\sigma$ {float(a['output_sigma']):g}) "
             "tokens",
             f"$D_{{SLA}}$ = {d:g} ms/token, $\\varepsilon_D$ = {eps:g} ms/token"]
    if "eta" in a:
        parts.append(f"$\\eta$ = {float(a['eta']):,.0f} tokens")
    if "n" in a:
        parts.append(f"n = {int(a['n']):,}")
    if "reps" in a:
        parts.append(f"{int(a['reps'])} reps")
    if wrap:
        return ", ".join(parts[:3]) + "\n" + ", ".join(parts[3:])
    return ", ".join(parts)


def variants(ds: xr.Dataset, kind: str | None = None) -> list:
    """The policy variants of a store with a ``policy`` axis, in axis order:
    ``(name, settings)`` pairs (settings from the attrs ``policy_<name>``),
    only those of ``kind`` if given."""
    import json

    out = []
    for name in [str(v) for v in ds["policy"].values]:
        settings = json.loads(ds.attrs[f"policy_{name}"])
        if kind is None or settings["kind"] == kind:
            out.append((name, settings))
    return out
