"""Any sweep store, drawn in the house style: ``mbbatch plot`` and :func:`plot`.

A simulated metric (``sim_X``) is drawn as markers at its mean over the
replications with its stored t-interval (``sim_X_ci_low``,
``sim_X_ci_high``), hollow where the cell has no steady state
(``unstable``); the closed form a store keeps beside it (``theory_*`` of
the multi-bin paper) as a line in the same colour; a capacity search's
answer with its interval over the searches.  One series per value of
``hue``, one panel per value of ``col``; every other axis of the store must
be fixed by ``sel`` (or have one value).  Units and labels come from the
metric and parameter tables.  Figure code never simulates.

>>> import xarray as xr
>>> from mbbatch.figures import plot
>>> fig = plot(xr.open_zarr("results/fig3.zarr"), x="rate", y="sim_mean_latency", hue="bins")  # doctest: +SKIP
>>> fig.savefig("latency.png")                                                               # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from .. import metrics
from .data import line, unit
from .style import COLORS, MARKERS, house_style, plain_log_ticks, series_handles, sim_points, style_handles

__all__ = ["plot", "THEORY_OF", "plottable"]

#: the closed form a store keeps beside a simulated metric
THEORY_OF = {"sim_throughput": "theory_throughput", "sim_mean_latency": "theory_latency",
             "sim_mean_batch_service": "theory_mean_batch_service", "sim_capacity": "capacity"}


def plottable(ds: xr.Dataset) -> list:
    """The variables :func:`plot` can draw as ``y``: the simulated metrics
    (by their per-replication name), a capacity store's answers, the closed
    forms, on the store's grid axes."""
    axes = [d for d in ds.dims if d not in ("rep", "time")]
    out = []
    for name, da in ds.data_vars.items():
        if any(name.endswith(s) and name.removesuffix(s) in ds for s in ("_mean", "_ci_low", "_ci_high")):
            continue
        if name in ("done", "unstable") or "time" in da.dims or not set(da.dims) - {"rep"} <= set(axes):
            continue
        if da.dtype.kind in "fiu" or da.dtype == bool:
            out.append(name)
    return sorted(out)


def _label(ds, var: str) -> str:
    """A variable's or an axis's label: the metric table's, else its words and units."""
    m = metrics.by_var(var)
    if m is not None:
        return m.label
    units = unit(ds, var, "")
    words = var.replace("_", " ")
    return f"{words} ({units})" if units not in ("", "1", None) else words


def _plain(axis, limits) -> None:
    """Plain tick labels on a log axis: at 1, 2, 5 times the powers of ten
    over up to two decades, at the powers alone beyond."""
    lo, hi = (v for v in limits)
    wide = lo > 0 and hi / lo > 100.0
    plain_log_ticks(axis, subs=(1.0,) if wide else (1.0, 2.0, 5.0))


def _check(ds, x, y, hue, col, sel) -> dict:
    """The selection of every other axis, or a ValueError naming what is wrong."""
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"ds must be an xarray.Dataset (a sweep store, xr.open_zarr(path)); got {type(ds).__name__}")
    axes = [d for d in ds.dims if d not in ("rep", "time")]
    for name, value in (("x", x), ("hue", hue), ("col", col)):
        if value is not None and value not in axes:
            raise ValueError(f"{name} must be an axis of the store, one of {axes}; got {value!r}")
    used = [a for a in (x, hue, col) if a is not None]
    if len(set(used)) != len(used):
        raise ValueError(f"x, hue and col must be different axes; got {used}")
    if y not in ds:
        raise ValueError(f"y must be a variable of the store, one of {plottable(ds)}; got {y!r}")
    sel = dict(sel or {})
    for k in sel:
        if k not in axes or k in used:
            raise ValueError(f"sel: {k!r} is not an axis left to fix (the store's axes: {axes}; x, hue, col: "
                             f"{used})")
    rest = [a for a in axes if a not in used and a not in sel and ds.sizes[a] > 1]
    if rest:
        raise ValueError(f"the store has more than one value along {rest}: make them hue or col, or fix them "
                         f"with sel (mbbatch plot --sel {' '.join(f'{a}={ds[a].values[0]}' for a in rest)})")
    return sel


def plot(ds: xr.Dataset, x: str, y: str, *, hue: str | None = None, col: str | None = None, sel: dict | None = None,
         logx: bool = False, logy: bool = False) -> Figure:
    """Draw ``y`` against grid axis ``x`` of a sweep store ``ds``.

    Parameters
    ----------
    ds : xarray.Dataset
        A store written by ``mbbatch sweep`` or ``mbbatch capacity``.
    x : str
        A grid axis (``rate``, ``bins``, ``policy``, ...).
    y : str
        A variable: a simulated metric by its per-replication name
        (``sim_mean_latency``; drawn at its mean with its interval), a
        capacity store's ``sim_capacity`` (with its interval over the
        searches), a closed form (``theory_latency``) or any other variable
        on the grid.
    hue, col : str, optional
        Axes drawn as series (colours and markers) and as panels.
    sel : dict, optional
        A value for each other axis with several values.
    logx, logy : bool
        Log-scaled axes.

    Returns
    -------
    matplotlib.figure.Figure
    """
    sel = _check(ds, x, y, hue, col, sel)
    with house_style():
        return _draw(ds.sel(sel) if sel else ds, x, y, hue, col, logx, logy)


def _draw(ds, x, y, hue, col, logx, logy) -> Figure:
    panels = list(ds[col].values) if col is not None else [None]
    series = list(ds[hue].values) if hue is not None else [None]
    fig = Figure(figsize=(max(6.0, 4.6 * len(panels)), 4.4), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    xs = ds[x].values
    categorical = xs.dtype.kind in "OUSb"
    xv = np.arange(xs.size, dtype=float) if categorical else np.asarray(xs, dtype=float)
    has_ci = f"{y}_ci_low" in ds and f"{y}_ci_high" in ds
    mean_v = f"{y}_mean" if f"{y}_mean" in ds else y
    theory = THEORY_OF.get(y)
    theory = theory if theory in ds else None
    drawn_theory = False
    for ax, panel in zip(axes, panels):
        for i, value in enumerate(series):
            point = {k: v for k, v in ((col, panel), (hue, value)) if k is not None}
            c, m = COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]
            mean = line(ds, mean_v, x, **point)
            lo, hi = ((line(ds, f"{y}_ci_low", x, **point), line(ds, f"{y}_ci_high", x, **point)) if has_ci
                      else (mean, mean))
            unstable = (line(ds, "unstable", x, **point) if "unstable" in ds
                        else ~line(ds, "capacity_resolved", x, **point) & np.isfinite(mean)
                        if "capacity_resolved" in ds else np.zeros(mean.shape, bool))
            if y.startswith("theory_") or y == "capacity":
                ax.plot(xv, mean, color=c, lw=1.4, zorder=2)
                continue
            sim_points(ax, xv, mean, lo, hi, unstable, c, m)
            if theory is not None:
                curve = line(ds, theory, x, **point)
                if np.isfinite(curve).any():
                    ax.plot(xv, curve, color=c, lw=1.2, zorder=2)
                    drawn_theory = True
        if categorical:
            ax.set_xticks(xv)
            ax.set_xticklabels([str(v) for v in xs])
        if logx and not categorical:
            ax.set_xscale("log")
            _plain(ax.xaxis, ax.get_xlim())
        if logy:
            ax.set_yscale("log")
            _plain(ax.yaxis, ax.get_ylim())
        ax.set_xlabel(_label(ds, x))
        ax.set_ylabel(_label(ds, y))
        if panel is not None:
            ax.set_title(f"{col} = {panel}")
    handles = series_handles([f"{hue} = {v}" for v in series], COLORS, MARKERS) if hue is not None else []
    styles = [] if y.startswith("theory_") or y == "capacity" else style_handles(
        ("sim", "simulation: mean and its interval" if has_ci else "simulation"),
        ("hollow", "no steady state" if "unstable" in ds else "unresolved search"))
    if drawn_theory:
        styles += style_handles(("-", f"closed form ({theory})"))
    if handles or styles:
        fig.legend(handles=handles + styles, loc="outside lower center", ncol=min(4, len(handles + styles)),
                   fontsize=8)
    name = ds.attrs.get("name", "")
    fig.suptitle(f"{name}: {_label(ds, y)} against {x}" if name else f"{_label(ds, y)} against {x}", fontsize=10)
    return fig
