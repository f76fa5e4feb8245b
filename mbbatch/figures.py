"""The paper's figures, drawn from stored sweep datasets.

Figure scripts read datasets written by ``mbbatch sweep`` (``results/<name>.zarr``)
and by ``mbbatch example fig1b`` (``results/fig1b.nc``).  They never simulate;
they may evaluate the closed forms of :mod:`mbbatch.theory`.

>>> from mbbatch.figures import FIGURES, make_figures
>>> list(FIGURES)                                       # doctest: +NORMALIZE_WHITESPACE
['fig1b', 'fig3', 'fig4', 'fig8', 'throughput_vs_k', 'min_bins_vs_eps', 'servers',
 'mb_only', 'dynamic_vs_static', 'controller_step', 'mb_dynamic', 'max_wait']
>>> make_figures("results", "figures", only="fig3")     # doctest: +SKIP
[PosixPath('figures/fig3.png'), PosixPath('figures/fig3.pdf')]

Conventions in every figure: simulation as markers with 95% confidence
intervals (t-intervals of the mean over replications); closed forms as lines
in the same colour; unstable cells (``unstable == True``) as hollow markers.
Cells whose ``done`` flag is false are left out.  The token-level policies
(static, dynamic, multi-bin dynamic) have no closed forms: thin lines join
their simulated points, and a cell whose throughput is below ``_OVERLOAD``
(0.95) times its arrival rate is hollow too, since their ``unstable`` flag
misses overloads whose queue drains after the arrivals end.

Output is byte-for-byte reproducible: figures are built on
:class:`matplotlib.figure.Figure` (no pyplot state) under a fixed style, and
the PDF/PNG metadata that would carry a date or a version is dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr
import matplotlib
import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import (FixedFormatter, FixedLocator, FormatStrFormatter, LogLocator, NullFormatter,
                               NullLocator, ScalarFormatter)

from . import theory

__all__ = ["FIGURES", "make_figures", "dataset_path", "dataset_command"]

# ---------------------------------------------------------------- style & I/O

#: Fixed resolution of the PNG files (dots per inch).
DPI = 150

_RC = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 7.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.3,
    "lines.markersize": 5,
    "errorbar.capsize": 2,
    "legend.framealpha": 0.9,
    "pdf.fonttype": 3,
    "svg.hashsalt": "mbbatch",
    "svg.fonttype": "path",
}

_PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
_PNG_METADATA = {"Software": None}

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]

#: Datasets stored as NetCDF files (``<name>.nc``) rather than zarr stores.
_NETCDF = {"fig1b"}


def dataset_path(results_dir, dataset: str) -> Path:
    """File a dataset is read from: ``<results_dir>/<dataset>.zarr`` (or ``.nc``)."""
    ext = ".nc" if dataset in _NETCDF else ".zarr"
    return Path(results_dir) / f"{dataset}{ext}"


def dataset_command(dataset: str) -> str:
    """The command that writes a dataset into ``results/``."""
    if dataset in _NETCDF:
        return f"mbbatch example {dataset} --out results/{dataset}.nc"
    return f"mbbatch sweep sweeps/{dataset}.toml --out results/{dataset}.zarr"


def _open(results_dir, dataset: str) -> xr.Dataset:
    path = dataset_path(results_dir, dataset)
    if dataset in _NETCDF:
        with xr.open_dataset(path) as ds:
            return ds.load()
    with xr.open_zarr(path, chunks=None) as ds:
        return ds.load()


def _new_figure(width=6.4, height=4.4, ncols=1):
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


# ---------------------------------------------------------------- data helpers

def _line(ds: xr.Dataset, var: str, x: str, **sel) -> np.ndarray:
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
        done = np.asarray(_line(ds, "done", x, **sel), dtype=bool)
        if values.dtype == bool:
            values = values & done
        else:
            values = np.where(done, values.astype(float), np.nan)
    elif values.dtype != bool:
        values = values.astype(float)
    return values


def _first_finite(values, default=np.nan) -> float:
    values = np.atleast_1d(np.asarray(values, dtype=float))
    finite = values[np.isfinite(values)]
    return float(finite[0]) if finite.size else default


def _const(ds, var, **sel) -> float:
    """A closed form that is constant along the remaining axes (e.g. over rate)."""
    da = ds[var]
    if sel:
        da = da.sel(**{k: v for k, v in sel.items() if k in da.dims})
    return _first_finite(np.asarray(da.values, dtype=float).ravel())


def _unit(ds, var, default):
    return ds[var].attrs.get("units", default) if var in ds else default


def _service_label(ds) -> str:
    a = ds.attrs
    if a.get("service") == "expon":
        return f"Exp($\\mu$ = {float(a['mu']):g}/s) service"
    if a.get("service") == "uniform":
        return f"U({float(a['l_min']):g}, {float(a['l_max']):g}) s service"
    return f"{a.get('service', '?')} service"


def _servers_label(s) -> str:
    s = float(s)
    if np.isinf(s):
        return "$\\infty$ servers"
    return "1 server" if s == 1 else f"{s:g} servers"


def _setting(ds, *, servers=True) -> str:
    a = ds.attrs
    parts = [_service_label(ds), f"B = {int(a['batch_size'])}"]
    if servers and "servers" in a:
        parts.append(_servers_label(a["servers"]))
    if "n" in a:
        parts.append(f"n = {int(a['n']):,}")
    if "reps" in a:
        parts.append(f"{int(a['reps'])} reps")
    return ", ".join(parts)


def _curve(ds, var, closed_form, **sel):
    """A closed form of ``rate`` as a smooth curve, if it reproduces ``ds[var]``.

    ``closed_form(rates)`` must equal the stored ``var`` at the grid's rates
    (where that is finite); then it is drawn on a fine rate grid.  Otherwise
    the stored values are drawn through the grid points as they are.
    """
    rates = np.asarray(ds["rate"].values, dtype=float)
    stored = _line(ds, var, "rate", **sel)
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


# ---------------------------------------------------------------- drawing helpers

def _sim(ax, x, mean, lo, hi, unstable, color, marker, *, clip_top=None, zorder=3):
    """Markers with 95% CI bars; unstable cells hollow; values above ``clip_top``
    drawn hollow on the top edge (without bars)."""
    x = np.asarray(x, dtype=float)
    mean = np.asarray(mean, dtype=float)
    lo = np.asarray(lo, dtype=float)
    hi = np.asarray(hi, dtype=float)
    unstable = np.asarray(unstable, dtype=bool)
    ok = np.isfinite(mean) & np.isfinite(x)
    err = np.vstack([np.nan_to_num(np.clip(mean - lo, 0, None)),
                     np.nan_to_num(np.clip(hi - mean, 0, None))])
    clipped = np.zeros_like(ok)
    if clip_top is not None:
        clipped = ok & (mean > clip_top)
    for sel, face in ((ok & ~unstable & ~clipped, color), (ok & unstable & ~clipped, "none")):
        if not sel.any():
            continue
        ax.errorbar(x[sel], mean[sel], yerr=err[:, sel], fmt=marker, ls="none", color=color,
                    mfc=face, mec=color, ecolor=color, elinewidth=0.9, zorder=zorder)
    if clipped.any():
        ax.plot(x[clipped], np.full(clipped.sum(), clip_top), ls="none", marker=marker,
                mfc="none", mec=color, clip_on=False, zorder=zorder)


def _series_handles(labels, colors, markers):
    return [Line2D([], [], color=c, marker=m, ls="-", label=l)
            for l, c, m in zip(labels, colors, markers)]


def _style_handles(*entries):
    """Legend entries for line/marker styles, drawn in grey."""
    out = []
    for kind, label in entries:
        if kind == "sim":
            out.append(Line2D([], [], color="0.3", marker="o", ls="none", label=label))
        elif kind == "hollow":
            out.append(Line2D([], [], color="0.3", marker="o", mfc="none", ls="none", label=label))
        else:
            out.append(Line2D([], [], color="0.3", ls=kind, label=label))
    return out


def _two_legends(ax, series, styles, *, loc1="upper left", loc2="lower right", outside=False):
    """Series (colour) legend and style legend; ``outside`` puts both right of the axes."""
    if outside:
        first = ax.legend(handles=series, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        ax.add_artist(first)
        ax.legend(handles=styles, loc="lower left", bbox_to_anchor=(1.02, 0.0))
        return
    first = ax.legend(handles=series, loc=loc1)
    ax.add_artist(first)
    ax.legend(handles=styles, loc=loc2)


def _log_ylim(ax, stable_values, curve_values):
    vals = np.concatenate([np.ravel(np.asarray(v, dtype=float)) for v in stable_values + curve_values]
                          or [np.array([1.0])])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if vals.size == 0:
        vals = np.array([1.0, 10.0])
    bottom, top = vals.min() / 1.4, vals.max() * 2.0
    ax.set_ylim(bottom, top)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    return top


_UNSTABLE_LABEL = "hollow: unstable cell"
_UNSTABLE_CLIPPED = "hollow: unstable cell (on the top edge if off scale)"


# ---------------------------------------------------------------- figures

def fig1b(data) -> Figure:
    """Paper Figure 1b: Gantt chart of four requests, one bin vs two bins."""
    ds = data["fig1b"]
    cases = [str(c) for c in ds["case"].values]
    B = int(ds.attrs.get("batch_size", 2))
    service = np.asarray(ds["service"].values, dtype=float)
    bins_all = np.asarray(ds["bin"].values)
    bin_ids = sorted({int(b) for b in np.ravel(bins_all)})
    bin_color = {b: _COLORS[i % len(_COLORS)] for i, b in enumerate(bin_ids)}
    nice = {"one_bin": "one bin\n(standard batching)", "two_bins": "two bins\n(multi-bin batching)"}

    fig, (ax,) = _new_figure(6.4, 3.5)
    height = 0.8
    lane = height / B
    ends = []
    for r, case in enumerate(cases):
        y0 = len(cases) - 1 - r - height / 2
        batch = np.asarray(ds["batch"].sel(case=case).values)
        start = np.asarray(ds["start"].sel(case=case).values, dtype=float)
        completion = np.asarray(ds["completion"].sel(case=case).values, dtype=float)
        binv = np.asarray(ds["bin"].sel(case=case).values)
        for b in sorted({int(v) for v in batch}):
            members = np.flatnonzero(batch == b)
            t0, t1 = float(start[members[0]]), float(completion[members[0]])
            ax.add_patch(Rectangle((t0, y0), t1 - t0, height, facecolor="white",
                                   edgecolor="0.55", hatch="////", lw=0, zorder=1))
            for j, i in enumerate(members):
                yl = y0 + height - (j + 1) * lane
                ax.add_patch(Rectangle((t0, yl), service[i], lane, facecolor=bin_color[int(binv[i])],
                                       edgecolor="white", lw=0.8, zorder=2))
                ax.text(t0 + 0.12, yl + lane / 2, f"R{i + 1}: {service[i]:g} s", va="center",
                        ha="left", fontsize=8, zorder=4)
            ax.add_patch(Rectangle((t0, y0), t1 - t0, height, facecolor="none",
                                   edgecolor="black", lw=1.1, zorder=3))
            ax.text((t0 + t1) / 2, y0 + height + 0.03, f"batch {b + 1}: {t1 - t0:g} s",
                    ha="center", va="bottom", fontsize=7.5, color="0.25")
        makespan = float(ds.attrs.get(f"makespan_{case}", np.nanmax(completion)))
        ends.append(makespan)
        ax.text(makespan + 0.25, y0 + height / 2, f"total {makespan:g} s", va="center",
                ha="left", fontsize=9, fontweight="bold")
    ax.set_xlim(0, max(ends) + 2.4)
    ax.set_ylim(-0.6, len(cases) - 0.35)
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([nice.get(c, c.replace("_", " ")) for c in reversed(cases)])
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("time (s)")
    ax.set_title(f"Paper Figure 1b: four requests ({', '.join(f'{s:g}' for s in service)} s), "
                 f"batch size B = {B}, one server")
    handles = [Patch(facecolor=bin_color[b], label=f"bin {b + 1}") for b in bin_ids]
    handles.append(Patch(facecolor="white", edgecolor="0.55", hatch="////",
                         label="idle slot: request done, batch still running"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(handles))
    return fig


def _throughput_panel(ax, ds, *, bound: bool):
    ks = [int(k) for k in ds["bins"].values]
    rates = np.asarray(ds["rate"].values, dtype=float)
    colors, markers = _COLORS[: len(ks)], _MARKERS[: len(ks)]
    for k, c, m in zip(ks, colors, markers):
        level = _const(ds, "theory_service_rate", bins=k)
        ax.axhline(level, color=c, ls="--", lw=0.9, alpha=0.9, zorder=1)
        ax.plot(*_curve(ds, "theory_throughput", lambda x: np.minimum(x, level), bins=k),
                color=c, lw=1.2, zorder=2)
        if bound and "theory_throughput_bound" in ds:
            lb = _const(ds, "theory_throughput_bound", bins=k)
            if np.isfinite(lb):
                ax.axhline(lb, color=c, ls=":", lw=1.2, zorder=1)
        _sim(ax, rates, _line(ds, "sim_throughput_mean", "rate", bins=k),
             _line(ds, "sim_throughput_ci_low", "rate", bins=k),
             _line(ds, "sim_throughput_ci_high", "rate", bins=k),
             _line(ds, "unstable", "rate", bins=k), c, m)
    ax.set_xlabel(f"arrival rate $\\lambda$ ({_unit(ds, 'rate', 'requests/s')})")
    ax.set_ylabel(f"throughput ({_unit(ds, 'sim_throughput_mean', 'requests/s')})")
    series = _series_handles([f"k = {k}" for k in ks], colors, markers)
    return series


def fig3(data) -> Figure:
    """Paper Figure 3: throughput vs arrival rate for k = 1..5 bins."""
    ds = data["fig3"]
    fig, (ax,) = _new_figure()
    series = _throughput_panel(ax, ds, bound=False)
    cmax = _const(ds, "capacity")
    ax.axhline(cmax, color="black", ls="-.", lw=1.1, zorder=1)
    rates = np.asarray(ds["rate"].values, dtype=float)
    ax.text(float(np.nanmax(rates)), cmax * 1.01, f"$c_{{max}}$ = {cmax:.2f}", va="bottom",
            ha="right", fontsize=8)
    ax.set_ylim(0, cmax * 1.12)
    styles = _style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_LABEL + " (drain rate)"),
        ("-", "theory: min($\\lambda$, Theorem 4.2)"),
        ("--", "Theorem 4.2: saturated B / E[$t_{service}$]"),
        ("-.", "$c_{max}$ = B / E[$l$] (Remark 4.2)"),
    )
    _two_legends(ax, series, styles, loc1="center left", loc2="lower right")
    ax.set_title("Paper Figure 3: throughput vs arrival rate, multi-bin batching\n" + _setting(ds))
    return fig


def _latency_panel(ax, ds, *, series_dim="bins", label=lambda v: f"k = {int(v)}"):
    """Mean latency vs rate, one series per value of ``series_dim``.

    Returns the legend handles and, per series, the Lemma 5.1 curve ``(x, y)``
    (drawn here only for ``series_dim == "bins"``).
    """
    values = list(ds[series_dim].values)
    rates = np.asarray(ds["rate"].values, dtype=float)
    B = int(ds.attrs["batch_size"])
    colors, markers = _COLORS[: len(values)], _MARKERS[: len(values)]
    curves, stable, sims = [], [], []
    for v, c, m in zip(values, colors, markers):
        sel = {series_dim: v}
        k = int(v) if series_dim == "bins" else int(ds.attrs["bins"])
        ets = _const(ds, "theory_mean_batch_service", **sel)
        curves.append(_curve(ds, "theory_latency", lambda x: ets + (B - 1) * k / (2 * x), **sel))
        mean = _line(ds, "sim_mean_latency_mean", "rate", **sel)
        lo = _line(ds, "sim_mean_latency_ci_low", "rate", **sel)
        hi = _line(ds, "sim_mean_latency_ci_high", "rate", **sel)
        unst = _line(ds, "unstable", "rate", **sel)
        stable.append(np.concatenate([hi[~unst], mean[~unst], lo[~unst]]))
        sims.append((mean, lo, hi, unst, c, m))
    ax.set_yscale("log")
    top = _log_ylim(ax, stable, [y for _, y in curves])
    if series_dim == "bins":
        for (x, y), c in zip(curves, colors):
            ax.plot(x, y, color=c, lw=1.2, zorder=2)
    for mean, lo, hi, unst, c, m in sims:
        _sim(ax, rates, mean, lo, hi, unst, c, m, clip_top=top / 1.15)
    ax.set_xlabel(f"arrival rate $\\lambda$ ({_unit(ds, 'rate', 'requests/s')})")
    ax.set_ylabel(f"mean latency ({_unit(ds, 'sim_mean_latency_mean', 's')})")
    return _series_handles([label(v) for v in values], colors, markers), curves


def fig4(data) -> Figure:
    """Paper Figure 4: mean latency vs arrival rate for k = 1, 2, 3 bins."""
    ds = data["fig4"]
    fig, (ax,) = _new_figure(8.4, 4.4)
    series, _ = _latency_panel(ax, ds)
    _capacity_marks(ax, ds, "bins")
    styles = _style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_CLIPPED),
        ("-", "Lemma 5.1 ($\\infty$ servers; lower bound here)"),
        (":", "saturated throughput of each k"),
    )
    _two_legends(ax, series, styles, outside=True)
    ax.set_title("Paper Figure 4: mean latency vs arrival rate, multi-bin batching\n" + _setting(ds))
    return fig


def _capacity_marks(ax, ds, series_dim):
    """Dotted vertical line at each series' saturated throughput (where on the x-range)."""
    rates = np.asarray(ds["rate"].values, dtype=float)
    for i, v in enumerate(ds[series_dim].values):
        level = _const(ds, "theory_service_rate", **{series_dim: v})
        if np.isfinite(level) and np.nanmin(rates) <= level <= np.nanmax(rates):
            ax.axvline(level, color=_COLORS[i % len(_COLORS)], ls=":", lw=1.0, zorder=1)


def fig8(data) -> Figure:
    """Paper Figure 8: exponential service, (a) throughput and (b) latency vs rate."""
    ds = data["fig8"]
    fig, (ax_a, ax_b) = _new_figure(13.0, 4.8, ncols=2)
    series = _throughput_panel(ax_a, ds, bound=True)
    levels = [_const(ds, "theory_service_rate", bins=k) for k in ds["bins"].values]
    ax_a.set_ylim(0, np.nanmax(levels) * 1.12)
    _two_legends(ax_a, series, _style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_LABEL + " (drain rate)"),
        ("-", "theory: min($\\lambda$, exact saturated level)"),
        ("--", "exact saturated B / E[$t_{service}$] (eq. 2)"),
        (":", "Corollary A.1.1 lower bound B$\\mu$ / $L_k$"),
    ), loc1="center left", loc2="upper left")
    ax_a.set_title("(a) throughput vs arrival rate")
    series_b, _ = _latency_panel(ax_b, ds)
    _capacity_marks(ax_b, ds, "bins")
    _two_legends(ax_b, series_b, _style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_CLIPPED),
        ("-", "Lemma 5.1 generalised ($\\infty$ servers)"),
        (":", "saturated throughput of each k"),
    ), outside=True)
    ax_b.set_title("(b) mean latency vs arrival rate")
    fig.suptitle("Paper Figure 8: exponential service, Lemma A.1 bin edges\n" + _setting(ds),
                 fontsize=9.5)
    return fig


def _log2_k_axis(ax, kmax):
    ax.set_xscale("log", base=2)
    ticks = [2 ** i for i in range(int(np.floor(np.log2(max(kmax, 1)))) + 1)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def _theorem_4_2_vs_k(ds):
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


def throughput_vs_k(data) -> Figure:
    """Theorem 4.2 throughput vs number of bins, approaching c_max (Remark 4.2)."""
    ds = data["thm43"]
    B, l_min, l_max, servers, ks_sim, kmax, kd, thr = _theorem_4_2_vs_k(ds)
    cmax = servers * float(theory.capacity(B, l_min, l_max))
    fig, (ax,) = _new_figure()
    c = _COLORS[0]
    ax.plot(kd, thr, color=c, lw=1.1, marker=".", ms=3, zorder=2)
    ax.axhline(cmax, color="black", ls="--", lw=1.1, zorder=1)
    ax.text(1.05, cmax * 1.005, f"$c_{{max}}$ = {cmax:.2f} (k $\\to \\infty$)", va="bottom",
            fontsize=8)
    _sim(ax, ks_sim, _line(ds, "sim_throughput_mean", "bins"),
         _line(ds, "sim_throughput_ci_low", "bins"), _line(ds, "sim_throughput_ci_high", "bins"),
         _line(ds, "unstable", "bins"), c, "o")
    if kmax >= 5:
        t5 = float(thr[4])
        ax.annotate(f"k = 5: {t5:.2f} = {100 * t5 / cmax:.0f}% of $c_{{max}}$",
                    xy=(5, t5), xytext=(8, t5 - 0.12 * cmax), fontsize=8,
                    arrowprops=dict(arrowstyle="->", color="0.3", lw=0.8))
    _log2_k_axis(ax, kmax)
    ax.set_xlim(0.9, kmax * 1.1)
    ax.set_ylim(min(float(thr[0]), np.nanmin(_line(ds, "sim_throughput_mean", "bins"),
                                                 initial=np.inf)) * 0.9, cmax * 1.06)
    ax.set_xlabel("number of bins k")
    ax.set_ylabel(f"saturated throughput ({_unit(ds, 'sim_throughput_mean', 'requests/s')})")
    ax.legend(handles=_style_handles(
        ("sim", "simulation (saturated): mean $\\pm$ 95% CI"),
        ("-", "Theorem 4.2: B / (m + a/k)"),
        ("--", "$c_{max}$ = B / m (Remark 4.2)"),
    ), loc="lower right")
    ax.set_title("Theorem 4.2: saturated throughput vs number of bins (beyond the paper)\n"
                 + _setting(ds))
    return fig


def min_bins_vs_eps(data) -> Figure:
    """Theorem 4.3: bins needed to come within eps of c_max, with simulated gaps."""
    ds = data["thm43"]
    a = ds.attrs
    B, l_min, l_max = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    servers = float(a.get("servers", 1.0))
    cmax = float(theory.capacity(B, l_min, l_max))
    mean = _line(ds, "sim_throughput_mean", "bins") / servers
    lo = _line(ds, "sim_throughput_ci_low", "bins") / servers
    hi = _line(ds, "sim_throughput_ci_high", "bins") / servers
    ks = np.asarray(ds["bins"].values, dtype=float)
    eps_sim, eps_lo, eps_hi = cmax - mean, cmax - hi, cmax - lo

    finite = eps_sim[np.isfinite(eps_sim) & (eps_sim > 0)]
    x_lo = min(0.05, finite.min() / 1.5) if finite.size else 0.05
    x_hi = max(6.0, finite.max() * 1.5) if finite.size else 6.0
    k_all = np.arange(1, 100_000)
    gaps = cmax - theory.throughput(B, l_min, l_max, k_all)
    breaks = gaps[(gaps > x_lo) & (gaps < x_hi)]
    eps = np.unique(np.concatenate([np.geomspace(x_lo, x_hi, 800), breaks, breaks * (1 - 1e-9)]))
    kstar = np.asarray(theory.min_bins(B, l_min, l_max, eps), dtype=float)

    fig, (ax,) = _new_figure()
    c = _COLORS[0]
    ytop = max(float(kstar.max()), float(np.nanmax(ks))) * 1.6
    ax.fill_between(eps, kstar, ytop, step="post", color=c, alpha=0.08, lw=0, zorder=0)
    ax.step(eps, kstar, where="post", color=c, lw=1.3, zorder=2)
    pos = np.isfinite(eps_sim) & (eps_sim > 0)
    unst = _line(ds, "unstable", "bins")
    xerr = np.vstack([np.nan_to_num(np.clip(eps_sim - eps_lo, 0, None)),
                      np.nan_to_num(np.clip(eps_hi - eps_sim, 0, None))])
    for sel, face in ((pos & ~unst, _COLORS[1]), (pos & unst, "none")):
        if sel.any():
            ax.errorbar(eps_sim[sel], ks[sel], xerr=xerr[:, sel], fmt="o", ls="none",
                        color=_COLORS[1], mfc=face, mec=_COLORS[1], elinewidth=0.9, zorder=3)
    neg = ~pos & np.isfinite(eps_sim)
    if neg.any():  # simulated throughput at or above c_max: no gap to plot on a log axis
        ax.plot(np.full(neg.sum(), x_lo), ks[neg], ls="none", marker="<", mfc="none",
                mec=_COLORS[1], clip_on=False, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(0.8, ytop)
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("$\\varepsilon$: gap to $c_{max}$ (requests/s per server)")
    ax.set_ylabel("number of bins k")
    ax.legend(handles=[
        Line2D([], [], color=c, label="Theorem 4.3: k*($\\varepsilon$), smallest k with "
                                      "throughput $\\geq c_{max} - \\varepsilon$"),
        Patch(facecolor=c, alpha=0.15, label="k $\\geq$ k*($\\varepsilon$): reaches "
                                             "$c_{max} - \\varepsilon$"),
        Line2D([], [], color=_COLORS[1], marker="o", ls="-",
               label="simulated k at its gap $c_{max}$ $-$ throughput ($\\pm$ 95% CI)"),
    ], loc="upper right")
    ax.set_title(f"Theorem 4.3: bins needed to reach $c_{{max}} - \\varepsilon$ "
                 f"($c_{{max}}$ = {cmax:.2f}; beyond the paper)\n" + _setting(ds))
    return fig


def servers(data) -> Figure:
    """Beyond the paper: latency vs rate for 1, 2, 8 and infinitely many servers."""
    ds = data["servers"]
    k = int(ds.attrs["bins"])
    fig, (ax,) = _new_figure(8.4, 4.4)
    series, curves = _latency_panel(ax, ds, series_dim="servers",
                                    label=lambda v: _servers_label(v))
    # Lemma 5.1 does not depend on the number of servers: one black curve.
    ax.plot(*curves[0], color="black", lw=1.2, zorder=2)
    _capacity_marks(ax, ds, "servers")
    styles = _style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_CLIPPED),
        ("-", "Lemma 5.1 (exact for $\\infty$ servers)"),
        (":", "saturated throughput with c servers"),
    )
    _two_legends(ax, series, styles, outside=True)
    setting = _setting(ds, servers=False)
    ax.set_title(f"Beyond the paper: shared FIFO with c servers, k = {k} bins\n{setting}")
    return fig


# ---------------------------------------------------------------- dynamic batching experiments

#: A token-policy cell whose mean throughput is below this fraction of the
#: arrival rate is drawn hollow too (overloaded), whatever its ``unstable`` flag.
_OVERLOAD = 0.95

_UNSTABLE_TOKEN_LABEL = ("hollow: unstable cell, or overloaded "
                         f"(throughput < {_OVERLOAD:g} $\\lambda$)")

# one colour and marker per policy, the same in every experiment figure
_POLICY_STYLE = {
    "dynamic": (_COLORS[0], "o"),
    "static8": (_COLORS[1], "s"),
    "static32": (_COLORS[2], "^"),
    "static128": (_COLORS[3], "D"),
    "mb_dynamic": (_COLORS[4], "P"),
}


def _reps(ds, var, x, **sel) -> np.ndarray:
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
        done = np.asarray(_line(ds, "done", x, **sel), dtype=bool)
        values = np.where(done[:, None], values, np.nan)
    return values


def _rep_ci(ds, var, x, mean=None, **sel):
    """Mean and 95% t-interval over reps of the per-rep ``ds[var]`` along ``x``.

    ``mean`` names a stored mean to use instead of recomputing it.
    """
    import scipy.stats

    vals = _reps(ds, var, x, **sel)
    count = np.sum(np.isfinite(vals), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.nanmean(np.where(count[:, None] > 0, vals, 0.0), axis=1)
        m = np.where(count > 0, m, np.nan)
        sd = np.array([np.nanstd(v, ddof=1) if c > 1 else np.nan for v, c in zip(vals, count)])
        level = float(ds.attrs.get("confidence_level", 0.95))
        t = np.array([scipy.stats.t.ppf(0.5 + level / 2, c - 1) if c > 1 else np.nan for c in count])
        half = t * sd / np.sqrt(np.maximum(count, 1))
    if mean is not None:
        m = _line(ds, mean, x, **sel)
    return m, m - half, m + half


def _overloaded(ds, **sel) -> np.ndarray:
    """Cells (along ``rate``) whose throughput falls short of the arrival rate."""
    rates = np.asarray(ds["rate"].values, dtype=float)
    thr = _line(ds, "sim_throughput_mean", "rate", **sel)
    with np.errstate(invalid="ignore"):
        return np.isfinite(thr) & (thr < _OVERLOAD * rates)


def _token_setting(ds, wrap=False) -> str:
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


def _token_series(ds, **sel) -> dict:
    """Throughput, p95 latency and SLA violation share along ``rate`` for one policy."""
    rates = np.asarray(ds["rate"].values, dtype=float)
    unst = _line(ds, "unstable", "rate", **sel) | _overloaded(ds, **sel)
    return {
        "rate": rates,
        "throughput": (_line(ds, "sim_throughput_mean", "rate", **sel),
                       _line(ds, "sim_throughput_ci_low", "rate", **sel),
                       _line(ds, "sim_throughput_ci_high", "rate", **sel)),
        "p95": _rep_ci(ds, "sim_latency_p95", "rate", mean="sim_latency_p95_mean", **sel),
        "sla": tuple(100.0 * v for v in _rep_ci(ds, "sim_sla_violation_tokens", "rate",
                                                 mean="sim_sla_violation_tokens_mean", **sel)),
        "unstable": unst,
    }


def _joined(ax, x, mean, lo, hi, unstable, color, marker):
    """Simulated points joined by a thin line (there is no closed form to draw)."""
    x = np.asarray(x, dtype=float)
    mean = np.asarray(mean, dtype=float)
    ok = np.isfinite(x) & np.isfinite(mean)
    ax.plot(x[ok], mean[ok], color=color, lw=0.8, alpha=0.55, zorder=2)
    _sim(ax, x, mean, lo, hi, unstable, color, marker)


def _token_panels(fig, axes, series, title):
    """Experiments (ii) and (iv): throughput, p95 latency, SLA violations vs rate.

    ``series`` is a list of (label, style key, :func:`_token_series` dict).
    """
    ax_t, ax_p, ax_s = axes
    rates = np.concatenate([s["rate"] for _, _, s in series])
    hi_r = float(np.nanmax(rates))
    ax_t.plot([0, hi_r * 1.05], [0, hi_r * 1.05], color="0.4", ls=":", lw=1.0, zorder=1)
    p95_vals = []
    for label, key, s in series:
        c, m = _POLICY_STYLE[key]
        _joined(ax_t, s["rate"], *s["throughput"], s["unstable"], c, m)
        _joined(ax_p, s["rate"], *s["p95"], s["unstable"], c, m)
        _joined(ax_s, s["rate"], *s["sla"], s["unstable"], c, m)
        p95_vals.append(np.concatenate(s["p95"]))
    unit_r = "requests/s"
    for ax in axes:
        ax.set_xlabel(f"arrival rate $\\lambda$ ({unit_r})")
        ax.set_xlim(0, hi_r * 1.05)
    ax_t.set_ylim(0, hi_r * 1.05)
    ax_t.set_ylabel(f"throughput ({unit_r})")
    ax_t.set_title("(a) throughput")
    ax_p.set_yscale("log")
    _log_ylim(ax_p, p95_vals, [])
    ax_p.set_ylabel("p95 latency (s)")
    ax_p.set_title("(b) 95th percentile latency")
    ax_s.set_ylim(-3, 103)
    ax_s.set_ylabel("SLA-violating output tokens (%)")
    ax_s.set_title("(c) tokens in batches with $\\tau > D_{SLA} + \\varepsilon_D$")
    handles = _series_handles([label for label, _, _ in series],
                              [_POLICY_STYLE[k][0] for _, k, _ in series],
                              [_POLICY_STYLE[k][1] for _, k, _ in series])
    handles += _style_handles(("sim", "simulation: mean $\\pm$ 95% CI (thin lines join points)"),
                              ("hollow", _UNSTABLE_TOKEN_LABEL),
                              (":", "throughput = $\\lambda$ (panel a)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4)
    fig.suptitle(title, fontsize=9.5)


def _static_series(ds, sizes):
    out = []
    for B in sizes:
        if B in [int(b) for b in ds["batch_size"].values]:
            out.append((f"static batching, B = {B}", f"static{B}", _token_series(ds, batch_size=B)))
    return out


def mb_only(data) -> Figure:
    """Experiment (i): saturated multi-bin throughput vs number of bins, with Theorem 4.2."""
    ds = data["mb_only"]
    B, l_min, l_max, servers, ks, kmax, kd, thr = _theorem_4_2_vs_k(ds)
    cmax = _const(ds, "capacity")
    stored = _line(ds, "theory_service_rate", "bins")
    mean = _line(ds, "sim_throughput_mean", "bins")
    fig, (ax,) = _new_figure(7.2, 4.6)
    c = _COLORS[0]
    ax.plot(kd, thr, color=c, lw=1.1, marker=".", ms=3, zorder=2)
    ax.plot(ks, stored, ls="none", marker="_", ms=14, mew=1.4, color="black", zorder=2.5)
    ax.axhline(cmax, color="black", ls="--", lw=1.1, zorder=1)
    ax.text(1.05, cmax * 1.005, f"$c_{{max}}$ = B / E[$l$] = {cmax:.3f} (k $\\to \\infty$)",
            va="bottom", fontsize=8)
    _sim(ax, ks, mean, _line(ds, "sim_throughput_ci_low", "bins"),
         _line(ds, "sim_throughput_ci_high", "bins"), _line(ds, "unstable", "bins"), c, "o")
    for k, m, th in zip(ks, mean, stored):
        if np.isfinite(m):
            ax.annotate(f"{m:.3f}\n({100 * m / cmax:.0f}% of $c_{{max}}$,\n"
                        f"{100 * (m / th - 1):+.2f}% vs Thm 4.2)",
                        xy=(k, m), xytext=(9, -5), textcoords="offset points", ha="left",
                        va="top", fontsize=7, color="0.25")
    _log2_k_axis(ax, kmax)
    ax.set_xlim(0.8, kmax * 1.15)
    bottom = min(float(thr[0]), np.nanmin(mean, initial=np.inf))
    ax.set_ylim(bottom * 0.75, cmax * 1.07)
    ax.set_xlabel("number of bins K")
    ax.set_ylabel(f"saturated throughput ({_unit(ds, 'sim_throughput_mean', 'requests/s')})")
    ax.legend(handles=_style_handles(
        ("sim", "simulation (saturated): mean $\\pm$ 95% CI"),
        ("-", "Theorem 4.2: B / E[$t_{service}$] at every integer k"),
        ("--", "$c_{max}$ = B / E[$l$] (Remark 4.2)"),
    ) + [Line2D([], [], ls="none", marker="_", ms=12, mew=1.6, color="black",
                label="stored theory_service_rate at the simulated K")], loc="lower right")
    ax.set_title("Experiment (i) multi_bin_only: saturated throughput vs number of bins K\n"
                 + _setting(ds))
    return fig


def dynamic_vs_static(data) -> Figure:
    """Experiment (ii): dynamic batching against static batching B = 8, 32, 128 vs load."""
    dyn, stat = data["dyn_only"], data["static_b"]
    series = [("dynamic batching ($b_{target}$ = min($b_{mem}$, $b_{SLA}$))", "dynamic",
               _token_series(dyn))]
    series += _static_series(stat, [int(b) for b in stat["batch_size"].values])
    fig, axes = _new_figure(14.5, 5.0, ncols=3)
    _token_panels(fig, axes, series,
                  "Experiment (ii) dynamic_only: dynamic vs static batching across loads\n"
                  + _token_setting(dyn))
    return fig


def mb_dynamic(data) -> Figure:
    """Experiment (iv): multi-bin dynamic batching against dynamic and static batching."""
    mbd, dyn, stat = data["mb_dynamic"], data["dyn_only"], data["static_b"]
    k = int(mbd.attrs.get("bins", 0))
    series = [(f"multi-bin dynamic, K = {k} bins", "mb_dynamic", _token_series(mbd)),
              ("dynamic batching (one queue)", "dynamic", _token_series(dyn))]
    series += _static_series(stat, [32, 8])
    fig, axes = _new_figure(14.5, 5.0, ncols=3)
    _token_panels(fig, axes, series,
                  f"Experiment (iv) multi_bin_dynamic: K = {k} bins by predicted output length, "
                  "dynamic batching in each, across loads\n" + _token_setting(mbd))
    return fig


def _phases(ds):
    a = ds.attrs
    t = np.asarray(ds["time"].values, dtype=float)
    t_up, t_down = float(a["t_up"]), float(a["t_down"])
    return t, [(t_up, t_down), (t_down, float(np.nanmax(t)))]


def _settling(t, y, t0, t1, tol=0.1, tail=0.2):
    """Time after ``t0`` from which ``y`` stays within ``tol`` of its median over the
    last ``tail`` of the phase [t0, t1]; also that median, and whether the series
    settles only inside that last part (still drifting)."""
    in_phase = (t >= t0) & (t <= t1) & np.isfinite(y)
    tt, yy = t[in_phase], y[in_phase]
    if tt.size == 0:
        return np.nan, np.nan, False
    ref_start = t1 - tail * (t1 - t0)
    ref = float(np.median(yy[tt >= ref_start]))
    inside = np.abs(yy - ref) <= tol * abs(ref)
    outside = np.flatnonzero(~inside)
    first = 0 if outside.size == 0 else int(outside[-1]) + 1
    if first >= tt.size:
        return np.nan, ref, True
    return float(tt[first] - t0), ref, bool(tt[first] >= ref_start)


def settling_times(ds, tol=0.1, tail=0.2) -> dict:
    """Convergence of b_target (mean over reps) after each load step of ``controller_step``.

    For each controller and step (``"up"`` at ``t_up``, ``"down"`` at
    ``t_down``): ``(seconds after the step, reference b_target, late)``.  The
    time is the first sample from which the mean b_target stays within
    ``tol`` (relative) of its median over the last ``tail`` of the phase;
    ``late`` is true when that happens only inside that last part.  The
    resolution is the spacing of the ``time`` grid.
    """
    t, phases = _phases(ds)
    out = {}
    for ctl in ds["controller"].values:
        y = _nan_stat(np.mean, _ts(ds, "ts_b_target", ctl))
        out[str(ctl)] = {step: _settling(t, y, t0, t1, tol, tail)
                         for step, (t0, t1) in zip(("up", "down"), phases)}
    return out


def _ts(ds, var, ctl) -> np.ndarray:
    """(reps, time) array of a time series for one controller; NaN where not done."""
    da = ds[var].sel(controller=ctl)
    for d in [d for d in da.dims if d not in ("rep", "time")]:
        da = da.isel({d: 0})
    values = np.asarray(da.transpose("rep", "time").values, dtype=float)
    if "done" in ds and not bool(np.asarray(ds["done"].sel(controller=ctl).values).all()):
        values = np.full_like(values, np.nan)
    return values


def _nan_stat(f, x):
    x = np.asarray(x, dtype=float)
    ok = np.isfinite(x).any(axis=0)
    out = np.full(x.shape[1], np.nan)
    if ok.any():
        out[ok] = f(x[:, ok], axis=0)
    return out


def controller_step(data) -> Figure:
    """Experiment (iii): b_target and tau_avg through a load step, per controller variant."""
    ds = data["controller_step"]
    a = ds.attrs
    t, phases = _phases(ds)
    t_up, t_down = phases[0]
    d_sla, eps = float(a["d_sla"]), float(a.get("eps_d", 0.0))
    r_lo, r_hi = float(a["rate"]), float(a["rate_high"])
    ctls = [str(c) for c in ds["controller"].values]
    settle = settling_times(ds)
    nice = {"spec": "specification (additive)", "multiplicative": "multiplicative"}

    fig = Figure(figsize=(9.6, 7.4), dpi=100, layout="constrained")
    ax_b, ax_t = fig.subplots(2, 1, sharex=True)
    for ax in (ax_b, ax_t):
        ax.axvspan(t_up, t_down, color="0.5", alpha=0.12, lw=0, zorder=0)
    series = []
    for i, ctl in enumerate(ctls):
        c = _COLORS[i % len(_COLORS)]
        bt = _ts(ds, "ts_b_target", ctl)
        ax_b.fill_between(t, _nan_stat(np.min, bt), _nan_stat(np.max, bt), step="post",
                          color=c, alpha=0.18, lw=0, zorder=1)
        ax_b.plot(t, _nan_stat(np.mean, bt), color=c, lw=1.4, drawstyle="steps-post", zorder=3)
        ax_b.plot(t, _nan_stat(np.mean, _ts(ds, "ts_b_high", ctl)), color=c, lw=0.9, ls="--",
                  drawstyle="steps-post", zorder=2)
        ax_b.plot(t, _nan_stat(np.mean, _ts(ds, "ts_b_low", ctl)), color=c, lw=0.9, ls=":",
                  drawstyle="steps-post", zorder=2)
        tau = 1e3 * _ts(ds, "ts_tau_avg", ctl)
        ax_t.fill_between(t, _nan_stat(np.min, tau), _nan_stat(np.max, tau), step="post",
                          color=c, alpha=0.18, lw=0, zorder=1)
        ax_t.plot(t, _nan_stat(np.mean, tau), color=c, lw=1.3, drawstyle="steps-post", zorder=3)
        parts = []
        for step, t0 in (("up", t_up), ("down", t_down)):
            dt, ref, late = settle[ctl][step]
            if np.isfinite(dt):
                ax_b.axvline(t0 + dt, color=c, ls="-.", lw=1.0, zorder=2)
                parts.append(f"{dt:.0f} s after the step {step} ($b_{{target}}$ {ref:.0f}"
                             + (", only in the last 20%: still drifting)" if late else ")"))
            else:
                parts.append(f"not within {t_down - t0 if step == 'up' else t[-1] - t0:.0f} s "
                             f"after the step {step}")
        series.append(Line2D([], [], color=c, lw=1.4,
                             label=f"{nice.get(ctl, ctl)} controller, settled: " + "; ".join(parts)))
    if len(ctls) > 1:
        first = [_ts(ds, "ts_b_target", c) for c in ctls]
        same = np.all([np.isclose(f, first[0], equal_nan=True).all(axis=0) for f in first[1:]], axis=0)
        differ = np.flatnonzero(~same)
        t_same = float(t[differ[0]]) if differ.size else float(t[-1])
        if t_same > float(t[0]):
            ax_b.text(t_same / 2, 180, f"variants identical until t = {t_same:g} s\n"
                      "(same requests; last colour on top)", ha="center", va="top", fontsize=7.5,
                      color="0.3")
    ax_b.set_yscale("log", base=2)
    ax_b.yaxis.set_major_locator(FixedLocator([1, 2, 4, 8, 16, 32, 64, 128, 256]))
    ax_b.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax_b.yaxis.set_minor_locator(NullLocator())
    ax_b.set_ylim(float(a.get("b_min", 1)) * 0.8, float(a.get("b_max", 256)) * 1.6)
    ax_b.set_ylabel("batch size (requests)")
    ax_b.set_title("(a) $b_{target}$: mean over reps (band: min to max over reps), "
                   "with $b_{low}$ and $b_{high}$ (means over reps)")
    ax_b.legend(handles=[
        Line2D([], [], color="0.3", ls="--", lw=0.9, label="$b_{high}$"),
        Line2D([], [], color="0.3", ls=":", lw=0.9, label="$b_{low}$"),
        Line2D([], [], color="0.3", ls="-.", lw=1.0,
               label="settled: mean $b_{target}$ stays within $\\pm$10%\nof its median over "
                     "the phase's last 20%"),
        Patch(facecolor="0.5", alpha=0.25, label=f"high load $\\lambda$ = {r_hi:g} requests/s "
                                                 f"(else {r_lo:g})"),
    ], loc="lower right", fontsize=7)
    fig.legend(handles=series, loc="outside lower center", ncol=1)
    d_ms, e_ms = 1e3 * d_sla, 1e3 * eps
    ax_t.axhspan(d_ms - e_ms, d_ms + e_ms, color="black", alpha=0.25, lw=0, zorder=1)
    ax_t.axhline(d_ms, color="black", lw=0.8, zorder=2)
    ax_t.text(float(t[-1]), d_ms + e_ms, f"$D_{{SLA}} \\pm \\varepsilon_D$ = {d_ms:g} $\\pm$ {e_ms:g} ms",
              ha="right", va="bottom", fontsize=8)
    ax_t.set_ylabel("$\\tau_{avg}$, EMA of decode time (ms/token)")
    ax_t.set_xlabel(f"time ({_unit(ds, 'time', 's')})")
    ax_t.set_xlim(float(t[0]), float(t[-1]))
    ax_t.set_title("(b) $\\tau_{avg}$: mean over reps (band: min to max over reps)")
    fig.suptitle(f"Experiment (iii) controller_step: dynamic batching through a load step "
                 f"$\\lambda$ = {r_lo:g} $\\to$ {r_hi:g} $\\to$ {r_lo:g} requests/s "
                 f"at t = {t_up:g} s and {t_down:g} s\n" + _token_setting(ds, wrap=True),
                 fontsize=9.5)
    return fig


def _max_wait_label(w) -> str:
    w = float(w)
    return "max_wait = $\\infty$ (classic multi-bin)" if np.isinf(w) else f"max_wait = {w:g} s"


def _max_wait_colors(waits):
    cmap = matplotlib.colormaps["viridis"]
    finite = [w for w in waits if np.isfinite(w)]
    pos = {w: (0.0 if len(finite) < 2 else 0.9 * i / (len(finite) - 1)) for i, w in enumerate(finite)}
    return [cmap(pos[w]) if np.isfinite(w) else "black" for w in waits]


def _sim_xy(ax, x, xlo, xhi, y, ylo, yhi, unstable, color, marker):
    """Markers with 95% CIs in both x and y; unstable cells hollow."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    xerr = np.vstack([np.nan_to_num(np.clip(x - xlo, 0, None)), np.nan_to_num(np.clip(xhi - x, 0, None))])
    yerr = np.vstack([np.nan_to_num(np.clip(y - ylo, 0, None)), np.nan_to_num(np.clip(yhi - y, 0, None))])
    ax.plot(x[ok], y[ok], color=color, lw=0.8, alpha=0.55, zorder=2)
    unstable = np.asarray(unstable, dtype=bool)
    for sel, face in ((ok & ~unstable, color), (ok & unstable, "none")):
        if sel.any():
            ax.errorbar(x[sel], y[sel], xerr=xerr[:, sel], yerr=yerr[:, sel], fmt=marker, ls="none",
                        color=color, mfc=face, mec=color, ecolor=color, elinewidth=0.9, zorder=3)


def max_wait(data) -> Figure:
    """Experiment (v): latency-throughput trade-off of releasing partial batches after max_wait."""
    ds = data["max_wait"]
    waits = [float(w) for w in ds["max_wait"].values]
    rates = np.asarray(ds["rate"].values, dtype=float)
    colors = _max_wait_colors(waits)
    markers = [_MARKERS[i % len(_MARKERS)] for i in range(len(waits))]
    B, k = int(ds.attrs["batch_size"]), int(ds.attrs["bins"])
    fig, (ax_a, ax_b) = _new_figure(13.0, 6.6, ncols=2)

    lat_all = []
    for i, (w, c, m) in enumerate(zip(waits, colors, markers)):
        sel = dict(max_wait=ds["max_wait"].values[i])
        unst = _line(ds, "unstable", "rate", **sel) | _overloaded(ds, **sel)
        lat = [_line(ds, f"sim_mean_latency_{s}", "rate", **sel) for s in ("mean", "ci_low", "ci_high")]
        thr = [_line(ds, f"sim_throughput_{s}", "rate", **sel) for s in ("mean", "ci_low", "ci_high")]
        _sim_xy(ax_a, *thr, *lat, unst, c, m)
        lat_all.append(np.concatenate(lat))
    # Lemma 5.1 and Theorem 4.2 for the classic policy (max_wait = inf), where stored
    inf_idx = [i for i, w in enumerate(waits) if np.isinf(w)]
    closed = []
    if inf_idx:
        sel = dict(max_wait=ds["max_wait"].values[inf_idx[0]])
        ets = _const(ds, "theory_mean_batch_service", **sel)
        if np.isfinite(ets):
            x, y = _curve(ds, "theory_latency", lambda r: ets + (B - 1) * k / (2 * r), **sel)
            ax_a.plot(x, y, color="black", lw=1.2, ls="-", zorder=1)
            closed.append(y)
        level = _const(ds, "theory_service_rate", **sel)
        if np.isfinite(level):
            ax_a.axvline(level, color="black", ls="--", lw=1.0, zorder=1)
    ax_a.set_xscale("log")
    ax_a.xaxis.set_major_locator(FixedLocator([0.1, 0.2, 0.5, 1, 2, 5, 10]))
    ax_a.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax_a.xaxis.set_minor_formatter(NullFormatter())
    ax_a.set_yscale("log")
    _log_ylim(ax_a, lat_all, closed)
    ax_a.set_xlabel(f"throughput ({_unit(ds, 'sim_throughput_mean', 'requests/s')}; "
                    f"one point per arrival rate {', '.join(f'{r:g}' for r in rates)})")
    ax_a.set_ylabel(f"mean latency ({_unit(ds, 'sim_mean_latency_mean', 's')})")
    ax_a.set_title("(a) mean latency vs throughput, one curve per max_wait over the arrival rates")
    series = _series_handles([_max_wait_label(w) for w in waits], colors, markers)
    ax_a.legend(handles=series + _style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI (both axes)"),
        ("hollow", _UNSTABLE_TOKEN_LABEL),
        ("-", "Lemma 5.1, max_wait = $\\infty$ ($\\infty$ servers; lower bound)"),
        ("--", f"Theorem 4.2 saturated throughput, k = {k}"),
    ), loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7)

    # (b) latency vs max_wait, one series per rate; infinity at a place of its own
    finite = [w for w in waits if np.isfinite(w)]
    inf_x = (max(finite) * 2.5) if finite else 1.0
    xw = np.array([inf_x if np.isinf(w) else w for w in waits])
    cmap = matplotlib.colormaps["plasma"]
    rcolors = [cmap(0.85 * i / max(len(rates) - 1, 1)) for i in range(len(rates))]
    for j, (r, c) in enumerate(zip(rates, rcolors)):
        m = _MARKERS[j % len(_MARKERS)]
        mean = _line(ds, "sim_mean_latency_mean", "max_wait", rate=r)
        lo = _line(ds, "sim_mean_latency_ci_low", "max_wait", rate=r)
        hi = _line(ds, "sim_mean_latency_ci_high", "max_wait", rate=r)
        thr = _line(ds, "sim_throughput_mean", "max_wait", rate=r)
        with np.errstate(invalid="ignore"):
            unst = _line(ds, "unstable", "max_wait", rate=r) | (np.isfinite(thr) & (thr < _OVERLOAD * r))
        fin = np.isfinite(np.array(waits))
        ax_b.plot(xw[fin], mean[fin], color=c, lw=0.8, alpha=0.55, zorder=2)
        if (~fin).any() and fin.any():  # dotted across the gap to "no timeout"
            last = int(np.flatnonzero(fin)[-1])
            ax_b.plot([xw[last], inf_x], [mean[last], float(mean[~fin][0])], color=c, lw=0.8,
                      ls=":", alpha=0.55, zorder=2)
        _sim(ax_b, xw, mean, lo, hi, unst, c, m)
    ax_b.set_xscale("log")
    ticks = finite + ([inf_x] if len(finite) < len(waits) else [])
    ax_b.xaxis.set_major_locator(FixedLocator(ticks))
    ax_b.xaxis.set_major_formatter(FixedFormatter(
        [f"{w:g}" for w in finite] + (["$\\infty$"] if len(ticks) > len(finite) else [])))
    ax_b.xaxis.set_minor_locator(NullLocator())
    if finite:
        ax_b.set_xlim(min(finite) / 1.3, inf_x * 1.3)
    ax_b.set_yscale("log")
    _log_ylim(ax_b, lat_all, [])
    ax_b.set_xlabel(f"max_wait ({_unit(ds, 'max_wait', 's')}; $\\infty$: no timeout)")
    ax_b.set_ylabel(f"mean latency ({_unit(ds, 'sim_mean_latency_mean', 's')})")
    ax_b.set_title("(b) mean latency vs max_wait, one curve per arrival rate")
    ax_b.legend(handles=_series_handles([f"$\\lambda$ = {r:g} {_unit(ds, 'rate', 'requests/s')}"
                                         for r in rates], rcolors,
                                        [_MARKERS[j % len(_MARKERS)] for j in range(len(rates))]),
                loc="lower left", fontsize=7)
    fig.suptitle("Experiment (v) max_wait: partial multi-bin batches leave once their oldest "
                 f"request waited max_wait, k = {k} bins\n" + _setting(ds), fontsize=9.5)
    return fig


#: name -> (drawing function, datasets it reads), in drawing order.
FIGURES: "OrderedDict[str, tuple[Callable, list[str]]]" = OrderedDict([
    ("fig1b", (fig1b, ["fig1b"])),
    ("fig3", (fig3, ["fig3"])),
    ("fig4", (fig4, ["fig4"])),
    ("fig8", (fig8, ["fig8"])),
    ("throughput_vs_k", (throughput_vs_k, ["thm43"])),
    ("min_bins_vs_eps", (min_bins_vs_eps, ["thm43"])),
    ("servers", (servers, ["servers"])),
    ("mb_only", (mb_only, ["mb_only"])),
    ("dynamic_vs_static", (dynamic_vs_static, ["dyn_only", "static_b"])),
    ("controller_step", (controller_step, ["controller_step"])),
    ("mb_dynamic", (mb_dynamic, ["mb_dynamic", "dyn_only", "static_b"])),
    ("max_wait", (max_wait, ["max_wait"])),
])


def make_figures(results_dir, out_dir, only=None) -> list[Path]:
    """Draw figures from the datasets in ``results_dir`` into ``out_dir``.

    Each figure ``name`` is saved as ``out_dir/<name>.png`` (``DPI`` dots per
    inch) and ``out_dir/<name>.pdf``, with no date or version metadata, so
    the same data give byte-identical files.

    Parameters
    ----------
    results_dir : path
        Folder holding ``<dataset>.zarr`` stores (and ``fig1b.nc``).
    out_dir : path
        Folder for the figures; created if absent.
    only : str or iterable of str, optional
        Draw only these figures (names of :data:`FIGURES`).

    Returns
    -------
    list of Path
        The files written, PNG then PDF for each figure, in :data:`FIGURES` order.

    Raises
    ------
    ValueError
        An unknown figure name.
    FileNotFoundError
        A dataset a selected figure reads is missing; the message names the
        file and the command that makes it.  Checked before anything is drawn.
    """
    if only is None:
        names = list(FIGURES)
    else:
        wanted = [only] if isinstance(only, str) else list(only)
        unknown = [n for n in wanted if n not in FIGURES]
        if unknown:
            raise ValueError(f"unknown figure {', '.join(map(repr, unknown))}; "
                             f"choose from: {', '.join(FIGURES)}")
        names = [n for n in FIGURES if n in wanted]

    needed = list(OrderedDict.fromkeys(d for n in names for d in FIGURES[n][1]))
    missing = [d for d in needed if not dataset_path(results_dir, d).exists()]
    if missing:
        lines = [f"  {dataset_path(results_dir, d)}: make it with `{dataset_command(d)}`"
                 for d in missing]
        raise FileNotFoundError("missing dataset(s) for the figures:\n" + "\n".join(lines))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache: dict[str, xr.Dataset] = {}
    written: list[Path] = []
    with matplotlib.style.context("default"), matplotlib.rc_context(_RC):
        for name in names:
            func, datasets = FIGURES[name]
            data = {}
            for d in datasets:
                if d not in cache:
                    cache[d] = _open(results_dir, d)
                data[d] = cache[d]
            fig = func(data)
            png, pdf = out_dir / f"{name}.png", out_dir / f"{name}.pdf"
            fig.savefig(png, dpi=DPI, metadata=_PNG_METADATA)
            fig.savefig(pdf, metadata=_PDF_METADATA)
            written += [png, pdf]
    return written
