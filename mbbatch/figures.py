"""The paper's figures, drawn from stored sweep datasets.

Figure scripts read datasets written by ``mbbatch sweep`` (``results/<name>.zarr``)
and by ``mbbatch example fig1b`` (``results/fig1b.nc``).  They never simulate;
they may evaluate the closed forms of :mod:`mbbatch.theory`.

>>> from mbbatch.figures import FIGURES, make_figures
>>> list(FIGURES)                                       # doctest: +NORMALIZE_WHITESPACE
['fig1b', 'fig3', 'fig4', 'fig8', 'throughput_vs_k', 'min_bins_vs_eps', 'servers']
>>> make_figures("results", "figures", only="fig3")     # doctest: +SKIP
[PosixPath('figures/fig3.png'), PosixPath('figures/fig3.pdf')]

Conventions in every figure: simulation as markers with 95% confidence
intervals (t-intervals of the mean over replications); closed forms as lines
in the same colour; unstable cells (``unstable == True``) as hollow markers.
Cells whose ``done`` flag is false are left out.

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
from matplotlib.ticker import (FixedLocator, FormatStrFormatter, LogLocator, NullFormatter,
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


def throughput_vs_k(data) -> Figure:
    """Theorem 4.2 throughput vs number of bins, approaching c_max (Remark 4.2)."""
    ds = data["thm43"]
    a = ds.attrs
    B, l_min, l_max = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    servers = float(a.get("servers", 1.0))
    ks_sim = np.asarray(ds["bins"].values, dtype=float)
    kmax = int(max(64, np.nanmax(ks_sim)))
    kd = np.arange(1, kmax + 1)
    thr = servers * theory.throughput(B, l_min, l_max, kd)
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


#: name -> (drawing function, datasets it reads), in drawing order.
FIGURES: "OrderedDict[str, tuple[Callable, list[str]]]" = OrderedDict([
    ("fig1b", (fig1b, ["fig1b"])),
    ("fig3", (fig3, ["fig3"])),
    ("fig4", (fig4, ["fig4"])),
    ("fig8", (fig8, ["fig8"])),
    ("throughput_vs_k", (throughput_vs_k, ["thm43"])),
    ("min_bins_vs_eps", (min_bins_vs_eps, ["thm43"])),
    ("servers", (servers, ["servers"])),
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
