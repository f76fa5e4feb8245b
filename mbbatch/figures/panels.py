"""Panels shared by several figures: throughput and mean latency against
the arrival rate, one series per number of bins (or servers); searched
capacities against an objective's bound, one series per variant."""

from __future__ import annotations

import numpy as np

from .data import closed_form_curve, constant, line, sim_series, unit, variants
from .style import COLORS, MARKERS, log_ylim, new_figure, series_handles, sim_points, style_handles, two_legends

__all__ = ["throughput_panel", "latency_panel", "capacity_search", "capacity_against_bound"]


def throughput_panel(ax, ds, *, bound: bool):
    """Throughput vs rate per k: simulation, min(rate, saturated level) and that level."""
    ks = [int(k) for k in ds["bins"].values]
    rates = np.asarray(ds["rate"].values, dtype=float)
    colors, markers = COLORS[: len(ks)], MARKERS[: len(ks)]
    for k, c, m in zip(ks, colors, markers):
        level = constant(ds, "theory_service_rate", bins=k)
        ax.axhline(level, color=c, ls="--", lw=0.9, alpha=0.9, zorder=1)
        ax.plot(*closed_form_curve(ds, "theory_throughput", lambda x: np.minimum(x, level), bins=k),
                color=c, lw=1.2, zorder=2)
        if bound and "theory_throughput_bound" in ds:
            lb = constant(ds, "theory_throughput_bound", bins=k)
            if np.isfinite(lb):
                ax.axhline(lb, color=c, ls=":", lw=1.2, zorder=1)
        sim_points(ax, rates, *sim_series(ds, "sim_throughput", "rate", bins=k), c, m)
    ax.set_xlabel(f"arrival rate $\\lambda$ ({unit(ds, 'rate')})")
    ax.set_ylabel(f"throughput ({unit(ds, 'sim_throughput_mean')})")
    series = series_handles([f"k = {k}" for k in ks], colors, markers)
    return series


def latency_panel(ax, ds, *, series_dim="bins", label=lambda v: f"k = {int(v)}", sizes=None):
    """Mean latency vs rate, one series per value of ``series_dim``.

    ``sizes`` (points, one per series) sets the markers' sizes, each series
    drawn over the ones before it: decreasing sizes keep series that
    coincide visible, one inside the other.  Returns the legend handles
    and, per series, the Lemma 5.1 curve ``(x, y)`` (drawn here only for
    ``series_dim == "bins"``).
    """
    values = list(ds[series_dim].values)
    rates = np.asarray(ds["rate"].values, dtype=float)
    B = int(ds.attrs["batch_size"])
    colors, markers = COLORS[: len(values)], MARKERS[: len(values)]
    curves, stable, sims = [], [], []
    for v, c, m in zip(values, colors, markers):
        sel = {series_dim: v}
        k = int(v) if series_dim == "bins" else int(ds.attrs["bins"])
        ets = constant(ds, "theory_mean_batch_service", **sel)
        curves.append(closed_form_curve(ds, "theory_latency", lambda x: ets + (B - 1) * k / (2 * x), **sel))
        mean, lo, hi, unst = sim_series(ds, "sim_mean_latency", "rate", **sel)
        stable.append(np.concatenate([hi[~unst], mean[~unst], lo[~unst]]))
        sims.append((mean, lo, hi, unst, c, m))
    ax.set_yscale("log")
    top = log_ylim(ax, stable, [y for _, y in curves])
    if series_dim == "bins":
        for (x, y), c in zip(curves, colors):
            ax.plot(x, y, color=c, lw=1.2, zorder=2)
    if sizes is None:
        for mean, lo, hi, unst, c, m in sims:
            sim_points(ax, rates, mean, lo, hi, unst, c, m, clip_top=top / 1.15)
    else:
        for i, ((mean, lo, hi, unst, c, m), size) in enumerate(zip(sims, sizes)):
            sim_points(ax, rates, mean, lo, hi, unst, c, m, clip_top=top / 1.15, zorder=3 + i, markersize=size)
    ax.set_xlabel(f"arrival rate $\\lambda$ ({unit(ds, 'rate')})")
    ax.set_ylabel(f"mean latency ({unit(ds, 'sim_mean_latency_mean')})")
    handles = series_handles([label(v) for v in values], colors, markers)
    if sizes is not None:
        for h, size in zip(handles, sizes):
            h.set_markersize(size)
    return handles, curves


def capacity_search(ds, x: str, **sel) -> tuple:
    """A capacity store's searches along axis ``x``: ``(capacity, low,
    high, unresolved)``: the capacity and its interval over the searches (a
    point whose searches' brackets were narrowed by probes undecided at the
    replication cap is unresolved)."""
    cap = line(ds, "sim_capacity", x, **sel)
    lo, hi = line(ds, "sim_capacity_ci_low", x, **sel), line(ds, "sim_capacity_ci_high", x, **sel)
    resolved = line(ds, "capacity_resolved", x, **sel)
    return cap, lo, hi, ~resolved & np.isfinite(cap)


def capacity_against_bound(ds, bound: str, label, xlabel: str, ylabel: str) -> tuple:
    """Each variant's searched capacity against the objective's ``bound``
    axis (log-scaled, ticks at its values), one series per variant labelled
    ``label(settings)``, with the series and the styles' legends.  Returns
    ``(fig, ax)``."""
    found = variants(ds)
    names = [name for name, _ in found]
    labels = [label(settings) for _, settings in found]
    x = np.asarray(ds[bound].values, dtype=float)
    fig, (ax,) = new_figure(7.6, 4.6)
    for name, c, m in zip(names, COLORS, MARKERS):
        cap, lo, hi, unresolved = capacity_search(ds, bound, policy=name)
        sim_points(ax, x, cap, lo, hi, unresolved, c, m)
        ax.plot(x, cap, color=c, lw=0.8, zorder=2)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(x)
    ax.set_xticklabels([f"{v:g}" for v in x])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    series = series_handles(labels, COLORS[: len(names)], MARKERS[: len(names)])
    styles = style_handles(("sim", "find_capacity: mean and interval over its searches"),
                           ("hollow", "bracket narrowed by probes undecided at the cap"))
    two_legends(ax, series, styles, loc1="upper left", loc2="lower right")
    return fig, ax
