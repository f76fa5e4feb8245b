"""Any sweep store, drawn in the house style: ``mbbatch plot`` and :func:`plot`.

A simulated metric (``sim_X``) is drawn as markers at its mean over the
replications with its stored t-interval (``sim_X_ci_low``,
``sim_X_ci_high``), hollow where the cell has no steady state
(``unstable``); the closed form a store keeps beside it (``theory_*`` of
the multi-bin paper) as a line in the same colour; a capacity search's
answer with its interval over the searches.  One series per value of
``hue``, one panel per value of ``col``; every other axis of the store must
be fixed by ``sel`` (or have one value).  A count or flag kept per
replication (``completed``, ``preemptions``, ``backlog_growing``) is drawn
the same way: its mean over the replications (a flag's: the share of them
where it holds) with its t-interval, as a sweep stores its real metrics'.
A text or flag axis (``policy``, ``profile``) is drawn as categories, in
the store's order.  Units and labels come from the metric and parameter
tables.  Figure code never simulates.

A Dataset opened from a sweep store (``xr.open_zarr(path)``) is verified
first, every chunk against its checksum, as ``mbbatch check`` does: a
damaged store is named, not drawn.  The axes and the selection are checked
before anything is drawn, and an error names the values allowed.

>>> import xarray as xr
>>> from mbbatch.figures import plot
>>> fig = plot(xr.open_zarr("results/fig3.zarr"), x="rate", y="sim_mean_latency", hue="bins")  # doctest: +SKIP
>>> fig.savefig("latency.png")                                                               # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from .. import metrics, stats
from .data import line, unit
from .style import COLORS, MARKERS, house_style, plain_log_ticks, series_handles, sim_points, style_handles

__all__ = ["plot", "THEORY_OF", "plottable"]

#: the closed form a store keeps beside a simulated metric
THEORY_OF = {"sim_throughput": "theory_throughput", "sim_mean_latency": "theory_latency",
             "sim_mean_batch_service": "theory_mean_batch_service", "sim_capacity": "capacity"}
#: dtype kinds of an axis drawn as categories: text (fixed-width 'U' and 'S', object 'O', numpy 2's
#: variable-width StringDType 'T', which a store's text coordinates read back as) and flags
CATEGORICAL = "USOTb"
#: the legend's columns at most, and the share of the figure's width it may take
LEGEND_COLUMNS, FIT = 4, 0.98


def plottable(ds: xr.Dataset) -> list:
    """The variables :func:`plot` can draw as ``y``: the simulated metrics
    (by their per-replication name), the counts and flags kept per
    replication, a capacity store's answers, the closed forms, on the
    store's grid axes."""
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
    """A variable's or an axis's label: the metric table's, else its words and
    units; a flag kept per replication is drawn as the share of them where it holds."""
    if var in ds.data_vars and "rep" in ds[var].dims and ds[var].dtype == bool:
        return f"{var.replace('_', ' ')} (share of replications)"
    m = metrics.by_var(var)
    if m is not None:
        return m.label
    units = unit(ds, var, "")
    words = var.replace("_", " ")
    return f"{words} ({units})" if units not in ("", "1", None) else words


def _over_reps(ds: xr.Dataset, y: str) -> xr.Dataset:
    """``ds`` with ``y``'s mean over the replications and its t-interval
    (``y_mean``, ``y_ci_low``, ``y_ci_high``) where the store keeps none: a
    count's or a flag's (a flag's mean is the share of the replications where
    it holds).  The same interval, at the store's confidence level, as a
    sweep stores for its real metrics (:func:`mbbatch.stats.t_interval`)."""
    if "rep" not in ds[y].dims or f"{y}_mean" in ds:
        return ds
    level = float(ds.attrs.get("confidence_level", stats.CONFIDENCE))
    mean, low, high = xr.apply_ufunc(lambda x: stats.t_interval(x, level), ds[y].astype(float),
                                     input_core_dims=[["rep"]], output_core_dims=[[], [], []], vectorize=True)
    return ds.assign({f"{y}_mean": mean, f"{y}_ci_low": low, f"{y}_ci_high": high})


def _text(v) -> str:
    """An axis value as text (a bytes value decoded, not ``b'...'``)."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _names(value, v, kind: str) -> bool:
    """Whether ``value`` (a coordinate's value, or text as ``--sel`` gives it)
    names the coordinate value ``v`` of an axis of dtype kind ``kind``."""
    if not isinstance(value, str):
        return bool(v == value)
    text = value.strip()
    if _text(v) == text or kind == "b" and str(v).lower() == text.lower():
        return True
    if kind in "fiu":
        try:
            return float(text) == v
        except ValueError:
            return False
    return False


def _value(ds, axis: str, value):
    """The coordinate value of ``axis`` that ``value`` names, or a ValueError naming its values."""
    values = ds[axis].values
    for v in values:
        if _names(value, v, values.dtype.kind):
            return v
    raise ValueError(f"sel: {axis} has no value {value!r}; its values: {[_text(v) for v in values]}")


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
        if (value is not None or name == "x") and value not in axes:
            raise ValueError(f"{name} must be an axis of the store, one of {axes}; got {value!r}")
    used = [a for a in (x, hue, col) if a is not None]
    if len(set(used)) != len(used):
        raise ValueError(f"x, hue and col must be different axes; got {used}")
    allowed = plottable(ds)
    if y not in allowed:
        base = next((y.removesuffix(s) for s in ("_mean", "_ci_low", "_ci_high")
                     if y.endswith(s) and y.removesuffix(s) in allowed), None)
        hint = f" ({base!r} is drawn at its mean with its interval)" if base is not None else ""
        raise ValueError(f"y must be a variable of the store that can be drawn, one of {allowed}; got {y!r}{hint}")
    sel = dict(sel or {})
    for k in sel:
        if k not in axes or k in used:
            raise ValueError(f"sel: {k!r} is not an axis left to fix (the store's axes: {axes}; x, hue, col: "
                             f"{used})")
        sel[k] = _value(ds, k, sel[k])
    rest = [a for a in axes if a not in used and a not in sel and ds.sizes[a] > 1]
    if rest:
        raise ValueError(f"the store has more than one value along {rest}: make them hue or col, or fix them "
                         f"with sel (mbbatch plot --sel {' '.join(f'{a}={_text(ds[a].values[0])}' for a in rest)})")
    return sel


def plot(ds: xr.Dataset, x: str, y: str, *, hue: str | None = None, col: str | None = None, sel: dict | None = None,
         logx: bool = False, logy: bool = False) -> Figure:
    """Draw ``y`` against grid axis ``x`` of a sweep store ``ds``.

    Parameters
    ----------
    ds : xarray.Dataset
        A store written by ``mbbatch sweep`` or ``mbbatch capacity``, opened
        with :func:`mbbatch.sweeps.open_store` (which verifies every chunk
        against its checksum first, as ``mbbatch check`` does: a chunk that
        is missing would read as cells not computed, silently).
    x : str
        A grid axis (``rate``, ``bins``, ``policy``, ...).
    y : str
        A variable: a simulated metric by its per-replication name
        (``sim_mean_latency``; drawn at its mean with its interval), a
        count or flag kept per replication (``completed``,
        ``backlog_growing``; drawn the same way, a flag as the share of the
        replications), a capacity store's ``sim_capacity`` (with its
        interval over the searches), a closed form (``theory_latency``) or
        any other variable on the grid: one of :func:`plottable`.
    hue, col : str, optional
        Axes drawn as series (colours and markers) and as panels.
    sel : dict, optional
        A value for each other axis with several values: the value, or its
        text (``{"policy": "dynamic", "rate": "0.5"}``).
    logx, logy : bool
        Log-scaled axes (a categorical ``x`` stays linear).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        ``x``, ``y``, ``hue``, ``col`` or ``sel`` not in the store, naming
        the values allowed.
    """
    sel = _check(ds, x, y, hue, col, sel)
    with house_style():
        return _draw(_over_reps(ds.sel(sel) if sel else ds, y), x, y, hue, col, logx, logy)


def _draw(ds, x, y, hue, col, logx, logy) -> Figure:
    panels = list(ds[col].values) if col is not None else [None]
    series = list(ds[hue].values) if hue is not None else [None]
    fig = Figure(figsize=(max(6.0, 4.6 * len(panels)), 4.4), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    xs = ds[x].values
    categorical = xs.dtype.kind in CATEGORICAL
    xv = np.arange(xs.size, dtype=float) if categorical else np.asarray(xs, dtype=float)
    has_ci = f"{y}_ci_low" in ds and f"{y}_ci_high" in ds
    mean_v = f"{y}_mean" if f"{y}_mean" in ds else y
    theory = THEORY_OF.get(y)
    theory = theory if theory in ds else None
    drawn_theory = False
    # (a paired difference to a baseline, or a ratio: the line of no difference)
    reference = 0.0 if y.startswith("diff_") else 1.0 if y.startswith("ratio_") else None
    for ax, panel in zip(axes, panels):
        if reference is not None:
            ax.axhline(reference, color="0.4", lw=0.8, ls="--", zorder=1)
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
            ax.set_xticklabels([_text(v) for v in xs])
            ax.set_xlim(-0.5, xs.size - 0.5)
        if logx and not categorical:
            ax.set_xscale("log")
            _plain(ax.xaxis, ax.get_xlim())
        if logy:
            ax.set_yscale("log")
            _plain(ax.yaxis, ax.get_ylim())
        ax.set_xlabel(_label(ds, x))
        ax.set_ylabel(_label(ds, y))
        if panel is not None:
            ax.set_title(f"{col} = {_text(panel)}")
    handles = series_handles([f"{hue} = {_text(v)}" for v in series], COLORS, MARKERS) if hue is not None else []
    styles = [] if y.startswith("theory_") or y == "capacity" else style_handles(
        ("sim", "simulation: mean and its interval" if has_ci else "simulation"),
        ("hollow", "no steady state" if "unstable" in ds else "unresolved search"))
    if drawn_theory:
        styles += style_handles(("-", f"closed form ({theory})"))
    if handles or styles:
        _legend(fig, handles + styles)
    name = ds.attrs.get("name", "")
    title = fig.suptitle(f"{name}: {_label(ds, y)} against {x}" if name else f"{_label(ds, y)} against {x}",
                         fontsize=10)
    _widen(fig, title.get_window_extent().width)
    return fig


def _legend(fig, handles) -> None:
    """The legend below the panels, in as many columns (up to
    :data:`LEGEND_COLUMNS`) as fit the figure's width; the figure widened to
    it if one column does not fit.  Constrained layout makes room for an
    outside legend below the panels, never beside them: a legend wider than
    the figure was cut off at both ends when saved."""
    for ncol in range(min(LEGEND_COLUMNS, len(handles)), 0, -1):
        legend = fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8)
        width = legend.get_window_extent().width
        if width <= FIT * fig.bbox.width or ncol == 1:
            break
        legend.remove()
    _widen(fig, width)


def _widen(fig, width: float) -> None:
    """Widen ``fig`` so that an artist ``width`` display units wide (centred) fits in it."""
    if width > FIT * fig.bbox.width:
        fig.set_figwidth(width / (FIT * fig.dpi))
