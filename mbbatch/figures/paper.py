"""The multi-bin batching paper's figures, and the studies of its theorems.

One function per figure, named as in :data:`mbbatch.figures.FIGURES` and in
the documentation's gallery (``docs/gallery/paper.md``): the paper's Figures 1b, 3, 4 and 8;
Theorem 4.2's throughput and Theorem 4.3's bins against the number of bins;
and latency with more than one server.  Each takes ``{dataset name:
Dataset}`` and returns a :class:`matplotlib.figure.Figure`.  Closed forms
are lines, simulation markers with 95% confidence intervals, unstable cells
hollow.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from .. import theory
from .panels import latency_panel, throughput_panel
from .data import constant, line, servers_label, setting, sim_series, theorem_4_2_vs_k, unit
from .style import (COLORS, MARKERS, log2_k_axis, log_ylim, new_figure, sim_points,
                    style_handles, two_legends)

__all__ = ["fig1b", "fig3", "fig4", "fig8", "throughput_vs_k", "min_bins_vs_eps", "servers", "fig6", "fig7"]

_UNSTABLE_LABEL = "hollow: unstable cell"
_UNSTABLE_CLIPPED = "hollow: unstable cell (on the top edge if off scale)"

#: servers' marker sizes (points), from the first server count to the last
#: (interpolated for more or fewer counts)
SERVERS_MARKER_SIZES = (10.0, 7.5, 6.0, 2.6)


def fig1b(data) -> Figure:
    """Paper Figure 1b: Gantt chart of four requests, one bin vs two bins."""
    ds = data["fig1b"]
    cases = [str(c) for c in ds["case"].values]
    B = int(ds.attrs.get("batch_size", 2))
    service = np.asarray(ds["service"].values, dtype=float)
    bins_all = np.asarray(ds["bin"].values)
    bin_ids = sorted({int(b) for b in np.ravel(bins_all)})
    bin_color = {b: COLORS[i % len(COLORS)] for i, b in enumerate(bin_ids)}
    nice = {"one_bin": "one bin\n(standard batching)", "two_bins": "two bins\n(multi-bin batching)"}

    fig, (ax,) = new_figure(6.4, 3.5)
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


def fig3(data) -> Figure:
    """Paper Figure 3: throughput vs arrival rate for k = 1..5 bins."""
    ds = data["fig3"]
    fig, (ax,) = new_figure()
    series = throughput_panel(ax, ds, bound=False)
    cmax = constant(ds, "capacity")
    ax.axhline(cmax, color="black", ls="-.", lw=1.1, zorder=1)
    rates = np.asarray(ds["rate"].values, dtype=float)
    ax.text(float(np.nanmax(rates)), cmax * 1.01, f"$c_{{max}}$ = {cmax:.2f}", va="bottom",
            ha="right", fontsize=8)
    ax.set_ylim(0, cmax * 1.12)
    styles = style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_LABEL + " (drain rate)"),
        ("-", "theory: min($\\lambda$, Theorem 4.2)"),
        ("--", "Theorem 4.2: saturated B / E[$t_{service}$]"),
        ("-.", "$c_{max}$ = B / E[$l$] (Remark 4.2)"),
    )
    two_legends(ax, series, styles, loc1="center left", loc2="lower right")
    ax.set_title("Paper Figure 3: throughput vs arrival rate, multi-bin batching\n" + setting(ds))
    return fig


def fig4(data) -> Figure:
    """Paper Figure 4: mean latency vs arrival rate for k = 1, 2, 3 bins."""
    ds = data["fig4"]
    fig, (ax,) = new_figure(8.4, 4.4)
    series, _ = latency_panel(ax, ds)
    _capacity_marks(ax, ds, "bins")
    styles = style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_CLIPPED),
        ("-", "Lemma 5.1 ($\\infty$ servers; lower bound here)"),
        (":", "saturated throughput of each k"),
    )
    two_legends(ax, series, styles, outside=True)
    ax.set_title("Paper Figure 4: mean latency vs arrival rate, multi-bin batching\n" + setting(ds))
    return fig


def _capacity_marks(ax, ds, series_dim):
    """Dotted vertical line at each series' saturated throughput (where on the x-range)."""
    rates = np.asarray(ds["rate"].values, dtype=float)
    for i, v in enumerate(ds[series_dim].values):
        level = constant(ds, "theory_service_rate", **{series_dim: v})
        if np.isfinite(level) and np.nanmin(rates) <= level <= np.nanmax(rates):
            ax.axvline(level, color=COLORS[i % len(COLORS)], ls=":", lw=1.0, zorder=1)


def fig8(data) -> Figure:
    """Paper Figure 8: exponential service, (a) throughput and (b) latency vs rate."""
    ds = data["fig8"]
    fig, (ax_a, ax_b) = new_figure(13.0, 4.8, ncols=2)
    series = throughput_panel(ax_a, ds, bound=True)
    levels = [constant(ds, "theory_service_rate", bins=k) for k in ds["bins"].values]
    ax_a.set_ylim(0, np.nanmax(levels) * 1.12)
    two_legends(ax_a, series, style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_LABEL + " (drain rate)"),
        ("-", "theory: min($\\lambda$, exact saturated level)"),
        ("--", "exact saturated B / E[$t_{service}$] (eq. 2)"),
        (":", "Corollary A.1.1 lower bound B$\\mu$ / $L_k$"),
    ), loc1="center left", loc2="upper left")
    ax_a.set_title("(a) throughput vs arrival rate")
    series_b, _ = latency_panel(ax_b, ds)
    _capacity_marks(ax_b, ds, "bins")
    two_legends(ax_b, series_b, style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_CLIPPED),
        ("-", "Lemma 5.1 generalised ($\\infty$ servers)"),
        (":", "saturated throughput of each k"),
    ), outside=True)
    ax_b.set_title("(b) mean latency vs arrival rate")
    fig.suptitle("Paper Figure 8: exponential service, Lemma A.1 bin edges\n" + setting(ds),
                 fontsize=9.5)
    return fig


def throughput_vs_k(data) -> Figure:
    """Theorem 4.2 throughput vs number of bins, approaching c_max (Remark 4.2)."""
    ds = data["thm43"]
    B, l_min, l_max, servers, ks_sim, kmax, kd, thr = theorem_4_2_vs_k(ds)
    cmax = servers * float(theory.capacity(B, l_min, l_max))
    fig, (ax,) = new_figure()
    c = COLORS[0]
    ax.plot(kd, thr, color=c, lw=1.1, marker=".", ms=3, zorder=2)
    ax.axhline(cmax, color="black", ls="--", lw=1.1, zorder=1)
    ax.text(1.05, cmax * 1.005, f"$c_{{max}}$ = {cmax:.2f} (k $\\to \\infty$)", va="bottom",
            fontsize=8)
    sim_points(ax, ks_sim, line(ds, "sim_throughput_mean", "bins"),
         line(ds, "sim_throughput_ci_low", "bins"), line(ds, "sim_throughput_ci_high", "bins"),
         line(ds, "unstable", "bins"), c, "o")
    if kmax >= 5:
        t5 = float(thr[4])
        ax.annotate(f"k = 5: {t5:.2f} = {100 * t5 / cmax:.0f}% of $c_{{max}}$",
                    xy=(5, t5), xytext=(8, t5 - 0.12 * cmax), fontsize=8,
                    arrowprops=dict(arrowstyle="->", color="0.3", lw=0.8))
    log2_k_axis(ax, kmax)
    ax.set_xlim(0.9, kmax * 1.1)
    ax.set_ylim(min(float(thr[0]), np.nanmin(line(ds, "sim_throughput_mean", "bins"),
                                                 initial=np.inf)) * 0.9, cmax * 1.06)
    ax.set_xlabel("number of bins k")
    ax.set_ylabel(f"saturated throughput ({unit(ds, 'sim_throughput_mean')})")
    ax.legend(handles=style_handles(
        ("sim", "simulation (saturated): mean $\\pm$ 95% CI"),
        ("-", "Theorem 4.2: B / (m + a/k)"),
        ("--", "$c_{max}$ = B / m (Remark 4.2)"),
    ), loc="lower right")
    ax.set_title("Theorem 4.2: saturated throughput vs number of bins (beyond the paper)\n"
                 + setting(ds))
    return fig


def min_bins_vs_eps(data) -> Figure:
    """Theorem 4.3: bins needed to come within eps of c_max, with simulated gaps."""
    ds = data["thm43"]
    a = ds.attrs
    B, l_min, l_max = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    servers = float(a.get("servers", 1.0))
    cmax = float(theory.capacity(B, l_min, l_max))
    mean = line(ds, "sim_throughput_mean", "bins") / servers
    lo = line(ds, "sim_throughput_ci_low", "bins") / servers
    hi = line(ds, "sim_throughput_ci_high", "bins") / servers
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

    fig, (ax,) = new_figure()
    c = COLORS[0]
    ytop = max(float(kstar.max()), float(np.nanmax(ks))) * 1.6
    ax.fill_between(eps, kstar, ytop, step="post", color=c, alpha=0.08, lw=0, zorder=0)
    ax.step(eps, kstar, where="post", color=c, lw=1.3, zorder=2)
    pos = np.isfinite(eps_sim) & (eps_sim > 0)
    unst = line(ds, "unstable", "bins")
    xerr = np.vstack([np.nan_to_num(np.clip(eps_sim - eps_lo, 0, None)),
                      np.nan_to_num(np.clip(eps_hi - eps_sim, 0, None))])
    for sel, face in ((pos & ~unst, COLORS[1]), (pos & unst, "none")):
        if sel.any():
            ax.errorbar(eps_sim[sel], ks[sel], xerr=xerr[:, sel], fmt="o", ls="none",
                        color=COLORS[1], mfc=face, mec=COLORS[1], elinewidth=0.9, zorder=3)
    neg = ~pos & np.isfinite(eps_sim)
    if neg.any():  # simulated throughput at or above c_max: no gap to plot on a log axis
        ax.plot(np.full(neg.sum(), x_lo), ks[neg], ls="none", marker="<", mfc="none",
                mec=COLORS[1], clip_on=False, zorder=3)
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
        Line2D([], [], color=COLORS[1], marker="o", ls="-",
               label="simulated k at its gap $c_{max}$ $-$ throughput ($\\pm$ 95% CI)"),
    ], loc="upper right")
    ax.set_title(f"Theorem 4.3: bins needed to reach $c_{{max}} - \\varepsilon$ "
                 f"($c_{{max}}$ = {cmax:.2f}; beyond the paper)\n" + setting(ds))
    return fig


def servers(data) -> Figure:
    """Beyond the paper: latency vs rate for 1, 2, 8 and infinitely many servers."""
    ds = data["servers"]
    k = int(ds.attrs["bins"])
    fig, (ax,) = new_figure(8.4, 4.4)
    # 1, 2, 8 and infinitely many servers coincide at light load: each drawn
    # smaller than the one before it, so that every one stays visible
    n = ds.sizes["servers"]
    sizes = np.interp(np.linspace(0, len(SERVERS_MARKER_SIZES) - 1, n), range(len(SERVERS_MARKER_SIZES)),
                      SERVERS_MARKER_SIZES)
    series, curves = latency_panel(ax, ds, series_dim="servers", label=lambda v: servers_label(v),
                                   sizes=[float(v) for v in sizes])
    # Lemma 5.1 does not depend on the number of servers: one black curve.
    ax.plot(*curves[0], color="black", lw=1.2, zorder=2)
    _capacity_marks(ax, ds, "servers")
    styles = style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI (nested where they coincide)"),
        ("hollow", _UNSTABLE_CLIPPED),
        ("-", "Lemma 5.1 (exact for $\\infty$ servers)"),
        (":", "saturated throughput with c servers"),
    )
    two_legends(ax, series, styles, outside=True)
    conditions = setting(ds, servers=False)
    ax.set_title(f"Beyond the paper: shared FIFO with c servers, k = {k} bins\n{conditions}")
    return fig


# --- the paper's Figures 6 and 7 on a real trace's lengths ---------------------------------


def fig6(data) -> Figure:
    """Paper Figure 6 on real lengths: throughput and mean latency vs arrival
    rate for k = 1, 2, 4 (B = 8, 8 servers), the Azure conversation trace's
    output lengths under the linear token-to-time model."""
    ds = data["fig6"]
    fig, (ax1, ax2) = new_figure(11.0, 4.4, ncols=2)
    series = throughput_panel(ax1, ds, bound=False)
    ax1.set_title("throughput")
    _latency_real(ax2, ds)
    ax2.set_title("mean latency")
    styles = style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI"),
        ("hollow", _UNSTABLE_LABEL),
        ("-", "theory: min($\\lambda$, eq. (2) on the empirical lengths)"),
        ("--", "saturated: 8 B / E[$t_{service}$], eq. (2)"),
    )
    two_legends(ax1, series, styles, loc1="upper left", loc2="lower right")
    fig.suptitle("Paper Figure 6 on real output lengths: multi-bin batching\n" + setting(ds), fontsize=10)
    return fig


def _latency_real(ax, ds):
    """Mean latency vs rate per k (no closed form: Lemma 5.1 assumes
    infinitely many servers)."""
    ks = [int(k) for k in ds["bins"].values]
    rates = np.asarray(ds["rate"].values, dtype=float)
    stable, sims = [], []
    for k, c, m in zip(ks, COLORS, MARKERS):
        mean, lo, hi, unst = sim_series(ds, "sim_mean_latency", "rate", bins=k)
        stable.append(np.concatenate([hi[~unst], mean[~unst], lo[~unst]]))
        sims.append((mean, lo, hi, unst, c, m))
        ax.plot(rates[~unst], mean[~unst], color=c, lw=0.8, zorder=2)
    ax.set_yscale("log")
    top = log_ylim(ax, stable, [])
    for mean, lo, hi, unst, c, m in sims:
        sim_points(ax, rates, mean, lo, hi, unst, c, m, clip_top=top / 1.15)
    ax.set_xlabel(f"arrival rate $\\lambda$ ({unit(ds, 'rate')})")
    ax.set_ylabel(f"mean latency ({unit(ds, 'sim_mean_latency_mean')})")


def fig7(data) -> Figure:
    """Paper Figure 7 counterpart: saturated throughput vs k up to 32 (B = 8,
    one server) on the trace's output lengths, beside the exact eq. (2) on
    their empirical distribution."""
    ds = data["fig7"]
    fig, (ax,) = new_figure(8.4, 4.6)
    c = COLORS[0]
    ks = np.asarray(ds["bins"].values, dtype=float)
    ax.plot(ks, line(ds, "theory_throughput", "bins"), color=c, lw=1.1, marker=".", ms=3, zorder=2)
    sim_points(ax, ks, *sim_series(ds, "sim_throughput", "bins"), c, "o")
    base = float(line(ds, "theory_throughput", "bins")[0])
    top = float(line(ds, "theory_throughput", "bins")[-1])
    ax.annotate(f"k = {int(ks[-1])}: +{100 * (top / base - 1):.0f}% over k = 1", xy=(ks[-1], top),
                xytext=(ks[-1] / 8, top * 0.93), fontsize=8,
                arrowprops=dict(arrowstyle="->", color="0.3", lw=0.8))
    log2_k_axis(ax, int(ks[-1]))
    ax.set_xlim(0.9, ks[-1] * 1.1)
    ax.set_xlabel("number of bins k")
    ax.set_ylabel(f"saturated throughput ({unit(ds, 'sim_throughput_mean')})")
    ax.legend(handles=style_handles(
        ("sim", "simulation (saturated): mean $\\pm$ 95% CI"),
        ("-", "eq. (2) on the empirical lengths: B / E[$t_{service}$]"),
    ), loc="lower right")
    ax.set_title("Paper Figure 7 on real output lengths: saturated throughput vs number of bins\n"
                 + setting(ds))
    return fig

