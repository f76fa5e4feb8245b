"""The multi-engine experiments: LAPS's modes on its prefill instances
(``laps_modes``) and its dynamic allocation through a load step
(``laps_allocation``); Autellix's router against least-used and round-robin
(``autellix_routers``), open against closed-loop programs
(``autellix_loops``), their capacity under a TTFT objective
(``capacity_routers``), an engine leaving and returning mid-run
(``engine_event``), and prefill/decode disaggregation's capacity against
its split (``disaggregation``).

Each takes ``{dataset name: Dataset}`` and returns a
:class:`matplotlib.figure.Figure`; conventions as in :mod:`mbbatch.figures`
(a cell whose throughput falls short of its arrival rate is hollow).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..params import default
from matplotlib.lines import Line2D

from .analysis import over_reps, overloaded, phases, replication_ci
from .data import line, per_rep, time_series, variants
from .panels import capacity_against_bound, capacity_search
from .style import (COLORS, MARKERS, log_ylim, new_figure, plain_log_ticks, series_handles, sim_points,
                     style_handles)

__all__ = ["laps_modes", "laps_allocation", "autellix_routers", "autellix_loops", "capacity_routers", "engine_event",
           "disaggregation"]


def _mode_label(settings: dict) -> str:
    if not settings.get("dual_queue", True):
        return "one FIFO queue"
    if settings.get("window", 0.005) == 0.0:
        return "dual queue"
    return "dual queue + window" + (" + dynamic allocation" if settings.get("dynamic", True) else "")


def laps_modes(data) -> Figure:
    """Short requests' p99 TTFT (top) and long requests' p99 TTFT (bottom)
    against the load, one column per short:long mix, one series per LAPS
    mode."""
    ds = data["laps"]
    found = variants(ds)
    mixes = [float(v) for v in ds["prompt_median"].values]
    rates = np.asarray(ds["rate"].values, dtype=float)
    fig = Figure(figsize=(12.0, 6.6), dpi=100, layout="constrained")
    axes = fig.subplots(2, len(mixes), squeeze=False)
    for j, mix in enumerate(mixes):
        share = float(np.nanmean(ds["sim_short_share"].sel(prompt_median=mix).values))
        for i, (var, what) in enumerate((("sim_ttft_short_p99", "short"), ("sim_ttft_long_p99", "long"))):
            ax = axes[i, j]
            stable = []
            for (name, _), c, m in zip(found, COLORS, MARKERS):
                sel = dict(policy=name, prompt_median=mix)
                mean, half = replication_ci(per_rep(ds, var, "rate", **sel))
                unst = line(ds, "unstable", "rate", **sel) | overloaded(ds, **sel)
                ok = np.isfinite(mean)
                ax.plot(rates[ok], mean[ok], color=c, lw=0.8, alpha=0.55, zorder=2)
                sim_points(ax, rates, mean, mean - half, mean + half, unst, c, m)
                stable.append(np.concatenate([mean[~unst], (mean + half)[~unst]]))
            ax.set_yscale("log")
            log_ylim(ax, stable, [])
            ax.set_xlabel("arrival rate $\\lambda$ (requests/s)")
            ax.set_ylabel(f"p99 TTFT of {what} requests (s)")
            if i == 0:
                ax.set_title(f"prompt median {mix:g} tokens: {100 * share:.0f} % short")
    _variants_legend(fig, [_mode_label(settings) for _, settings in found],
                     "no steady state: an instance group's backlog grows, or throughput below 0.95 $\\times$ "
                     "arrival rate")
    a = ds.attrs
    fig.suptitle(f"LAPS on {int(a['instances'])} prefill instances: short and long requests' p99 time to first "
                 f"token\nprompts log-normal ($\\sigma$ {float(a['prompt_sigma']):g}), short at most "
                 f"{int(a['laps_threshold'])} tokens; a batch takes {1e3 * float(a['prefill_a']):g} ms + "
                 f"{1e3 * float(a['prefill_b']):g} ms per prompt token; n = {int(a['n']):,}, {int(a['reps'])} reps",
                 fontsize=9.5)
    return fig


def _laps_phase_means(ds, short, t) -> list:
    """The time-average of ``short`` (instances of the short group, the mean
    over replications on the time grid ``t``) in each phase of the load step:
    ``[(start, end, mean), ...]`` before, during and after the high load.
    The grid is uniform and the series a step function, so the samples'
    mean is the time-average."""
    _, steps = phases(ds)
    (t_up, t_down), (_, end) = steps
    out = []
    for lo, hi in ((float(t[0]), t_up), (t_up, t_down), (t_down, end)):
        sel = (t >= lo) & ((t < hi) if hi < end else (t <= hi))
        vals = short[sel]
        out.append((lo, hi, float(np.nanmean(vals)) if np.isfinite(vals).any() else np.nan))
    return out


def laps_allocation(data) -> Figure:
    """Instances in LAPS's short group over time through a load step (the
    high-load phase shaded): one column per short:long mix, one row per
    variant; the mean over replications (their range shaded), its
    time-average in each phase of the step (black segments, numbered), and
    the variant's p99 TTFT and instance moves."""
    ds = data["laps_step"]
    a = ds.attrs
    found = variants(ds)
    t, steps = phases(ds)
    t_up, t_down = steps[0]
    E = int(a["instances"])
    mixes = [float(v) for v in ds["prompt_median"].values]
    fig = Figure(figsize=(12.0, 6.4), dpi=100, layout="constrained")
    axes = fig.subplots(len(found), len(mixes), squeeze=False, sharex=True, sharey=True)
    for i, ((name, settings), c) in enumerate(zip(found, COLORS)):
        interval = settings.get("interval", default("LAPS.interval"))
        for j, mix in enumerate(mixes):
            ax = axes[i, j]
            ax.axvspan(t_up, t_down, color="0.5", alpha=0.12, lw=0, zorder=0)
            sel = dict(policy=name, prompt_median=mix)
            short = time_series(ds, "ts_short_instances", **sel)
            ax.fill_between(t, over_reps(np.min, short), over_reps(np.max, short), step="post", color=c,
                            alpha=0.2, lw=0, zorder=1)
            mean = over_reps(np.mean, short)
            ax.plot(t, mean, color=c, lw=1.2, drawstyle="steps-post", zorder=3)
            for lo, hi, v in _laps_phase_means(ds, mean, t):
                if np.isfinite(v):
                    ax.plot([lo, hi], [v, v], color="black", lw=2.2, solid_capstyle="butt", zorder=4)
                    ax.text((lo + hi) / 2, v + 0.12, f"{v:.2f}", ha="center", va="bottom", fontsize=8,
                            fontweight="bold", zorder=5,
                            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
            ttft = [float(np.nanmean(per_rep(ds, v, "prompt_median", policy=name)[j]))
                    for v in ("sim_ttft_short_p99", "sim_ttft_long_p99")]
            moves = float(np.nanmean(per_rep(ds, "group_moves", "prompt_median", policy=name)[j]))
            ax.text(0.98, 0.97, f"p99 TTFT: short {ttft[0]:.3g} s, long {ttft[1]:.3g} s\n"
                    f"{moves:.3g} moves a run", transform=ax.transAxes, ha="right", va="top", fontsize=7.5,
                    bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="0.7", alpha=0.9), zorder=6)
            ax.set_ylim(0.0, E + 0.3)
            ax.set_yticks(range(E + 1))
            if i == len(found) - 1:
                ax.set_xlabel("time (s)")
            if i == 0:
                share = float(np.nanmean(ds["sim_short_share"].sel(prompt_median=mix).values))
                ax.set_title(f"prompt median {mix:g} tokens: {100 * share:.0f} % short", fontsize=9.5)
        axes[i, 0].set_ylabel(f"at most one move per {interval:g} s\ninstances in the short group (of {E})",
                              color=c)
    handles = [Line2D([], [], color="0.3", lw=1.2, label="mean over replications (range shaded)"),
               Line2D([], [], color="black", lw=2.2, label="its time-average in each phase (before, during, "
                                                            "after the high load)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    fig.suptitle(f"LAPS's dynamic allocation through a load step {float(a['rate']):g} $\\to$ "
                 f"{float(a['rate_high']):g} $\\to$ {float(a['rate']):g} requests/s (shaded: the high load, "
                 f"{t_up:g} to {t_down:g} s) on {E} prefill instances, {int(a['reps'])} replications\na group "
                 f"gains an instance when its pending requests exceed {float(a['ratio']):g} $\\times$ the other's; "
                 f"short at most {int(a['laps_threshold'])} prompt tokens", fontsize=9.5)
    return fig


_ROUTER_LABELS = {"autellix": "Autellix (program-aware)", "least_used": "least-used", "round_robin": "round-robin"}


def _router_label(settings: dict) -> str:
    return _ROUTER_LABELS[settings.get("router", default("Cluster.router"))]


def _variants_legend(fig, labels, hollow: str) -> None:
    """Below the panels: one entry per variant, then the simulation's marker
    styles (``hollow``: what a hollow marker means)."""
    handles = series_handles(labels, COLORS[: len(labels)], MARKERS[: len(labels)])
    handles += style_handles(("sim", "simulation: mean $\\pm$ 95% CI over replications"), ("hollow", hollow))
    fig.legend(handles=handles, loc="outside lower center", ncol=3)


def autellix_routers(data) -> Figure:
    """Autellix's router against least-used and round-robin: p99 TTFT,
    context tokens recomputed per call and load imbalance (rows) against the
    share of large calls (the router's threshold swept), one column per
    number of calls per program.  Throughput is not a row: every router
    carries the arrivals (a cell short of them is hollow), and the
    replications' arrival counts, not the routers, make its spread."""
    ds = data["autellix"]
    found = variants(ds)
    calls = [int(v) for v in ds["calls"].values]
    rows = (("sim_ttft_p99", "p99 TTFT (s)", True),
            ("sim_kv_recomputed_tokens", "context tokens recomputed per call", False),
            ("sim_load_imbalance", "load imbalance (max / mean active)", False))
    fig = Figure(figsize=(12.0, 8.6), dpi=100, layout="constrained")
    axes = fig.subplots(len(rows), len(calls), squeeze=False)
    hollow = False
    for j, c in enumerate(calls):
        # (every variant sees the same calls: the large share depends on the threshold only)
        share = np.nanmean(per_rep(ds, "sim_large_share", "route_threshold", policy=found[0][0], calls=c), axis=1)
        order = np.argsort(share)
        for i, (var, label, log) in enumerate(rows):
            ax = axes[i, j]
            for (name, _), col, m in zip(found, COLORS, MARKERS):
                sel = dict(policy=name, calls=c)
                mean, half = replication_ci(per_rep(ds, var, "route_threshold", **sel))
                unst = line(ds, "unstable", "route_threshold", **sel) | overloaded(ds, "route_threshold", **sel)
                hollow |= bool(unst.any())
                ax.plot(share[order], mean[order], color=col, lw=0.8, alpha=0.55, zorder=2)
                sim_points(ax, share, mean, mean - half, mean + half, unst, col, m)
            if log:
                ax.set_yscale("log")
                plain_log_ticks(ax.yaxis)
            ax.set_xlabel("share of large calls (above the threshold)")
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{c} calls per program")
    _variants_legend(fig, [_router_label(settings) for _, settings in found],
                     "unstable, or throughput below 0.95 $\\times$ arrival rate" + ("" if hollow else " (none here)"))
    a = ds.attrs
    carried = ""
    names = [name for name, _ in found]
    if "least_used" in names:
        # each replication's throughput over least-used's on the same calls
        thr = ds["sim_throughput"].where(ds["done"])
        gap = float(np.nanmax(np.abs(thr / thr.sel(policy="least_used") - 1.0).values))
        carried = (f"\nthroughput (not drawn) within {100 * gap:.1f} % of least-used's in every replication: "
                   "every router carries the arrivals")
    fig.suptitle(f"Routing {int(a['n']):,} calls of multi-call programs over {int(a['engines'])} engines (dynamic "
                 f"batching each) at {float(a['rate']):g} calls/s\nnew tokens log-normal (median "
                 f"{float(a['prompt_median']):g}, $\\sigma$ {float(a['prompt_sigma']):g}), a call's prompt its "
                 f"program's context + new tokens; KV reuse on the engine holding the context; "
                 f"{int(a['reps'])} reps" + carried, fontsize=9.5)
    return fig


def autellix_loops(data) -> Figure:
    """Open against closed-loop programs under each router: p99 TTFT,
    throughput, context tokens recomputed per call and the share of calls
    served where their context is (panels) against the call rate; colour
    the router, solid the open loop, dashed the closed loop."""
    ds = data["autellix_loops"]
    rates = np.asarray(ds["rate"].values, dtype=float)
    routers = [str(r) for r in ds["router"].values]
    panels = (("sim_ttft_p99", "p99 TTFT (s)"), ("sim_throughput", "throughput (calls/s)"),
              ("sim_kv_recomputed_tokens", "context tokens recomputed per call"),
              ("sim_locality_hit_rate", "calls served where their context is"))
    fig, axes = new_figure(14.0, 4.6, ncols=len(panels))
    for ax, (var, label) in zip(axes, panels):
        for r, col, m in zip(routers, COLORS, MARKERS):
            for closed, ls in ((False, "-"), (True, "--")):
                sel = dict(router=r, closed_loop=closed)
                mean, half = replication_ci(per_rep(ds, var, "rate", **sel))
                unst = line(ds, "unstable", "rate", **sel) | overloaded(ds, **sel)
                ax.plot(rates, mean, color=col, ls=ls, lw=1.0, alpha=0.7, zorder=2)
                sim_points(ax, rates, mean, mean - half, mean + half, unst, col, m)
        if var == "sim_throughput":
            ax.plot(rates, rates, color="0.6", lw=0.8, ls=":", zorder=1)
        ax.set_xlabel("call rate (calls/s)")
        ax.set_ylabel(label)
    handles = series_handles([_ROUTER_LABELS[r] for r in routers], COLORS[: len(routers)], MARKERS[: len(routers)])
    handles += style_handles(("-", "open loop: a call arrives a think time after the one before it arrived"),
                             ("--", "closed loop: ... after the one before it completed"),
                             ("sim", "simulation: mean $\\pm$ 95% CI over replications"),
                             ("hollow", "unstable, or throughput below 0.95 $\\times$ call rate"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8)
    a = ds.attrs
    fig.suptitle(f"Open against closed-loop programs: {int(a['calls'])}-call programs, {float(a['think_time']):g} s "
                 f"of think time, on {int(a['engines'])} engines (dynamic batching each)\nlarge calls above "
                 f"{int(a['route_threshold'])} prefill tokens; KV reuse on the engine holding the context; "
                 f"n = {int(a['n']):,}, {int(a['reps'])} reps", fontsize=9.5)
    return fig


def capacity_routers(data) -> Figure:
    """The largest call rate each router serves with its p99 TTFT within a
    bound, against the bound (stability required as well)."""
    ds = data["capacity_routers"]
    fig, _ = capacity_against_bound(ds, "objective_ttft_p99", _router_label, "p99 TTFT bound (s)",
                                    "capacity within the bound (calls/s)")
    a = ds.attrs
    fig.suptitle(f"Which router serves most calls within a p99 TTFT bound? {int(a['engines'])} engines, programs "
                 f"of {int(a['calls'])} calls, large above {int(a['route_threshold'])} tokens\nsearched to "
                 f"{100 * float(a['capacity_rel_tol']):g} %, at most {int(a['capacity_max_reps'])} replications a "
                 f"probe; n = {int(a['n']):,}", fontsize=8.5)
    return fig


def engine_event(data) -> Figure:
    """Calls' mean latency (left) and p99 TTFT (right) by arrival time while
    an engine leaves and returns, one series per router."""
    ds = data["engine_event"]
    a = ds.attrs
    t = np.asarray(ds["time"].values, dtype=float)
    fig, axes = new_figure(12.0, 4.4, ncols=2)
    for ax, var, label in ((axes[0], "mean_latency", "mean latency (s)"), (axes[1], "ttft_p99", "p99 TTFT (s)")):
        ax.axvspan(float(a["remove"]), float(a["back"]), color="0.9", zorder=0)
        for k, (router, c, m) in enumerate(zip(ds["router"].values, COLORS, MARKERS)):
            ax.plot(t, ds[var].sel(router=router).values, color=c, marker=m, ms=3.5, lw=1.0, zorder=2,
                    label=f"{_ROUTER_LABELS[str(router)]} "
                          f"({float(ds['rerouted'].sel(router=router)):.0f} calls re-routed)")
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel("arrival time (s)")
        ax.set_ylabel(label)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=8)
    fig.suptitle(f"Engine 0 of {int(a['engines'])} leaves at {float(a['remove']):g} s and returns at "
                 f"{float(a['back']):g} s (shaded): its queue is routed again\n{float(a['rate']):g} calls/s of "
                 f"{int(a['calls'])}-call programs, large above {int(a['threshold'])} tokens; calls grouped by "
                 f"arrival in {float(a['bin']):g} s windows, {int(a['seeds'])} seeds pooled", fontsize=9)
    return fig


def disaggregation(data) -> Figure:
    """Capacity within a goodput objective (markers: the capacity and its 95 %
    interval over the searches, hollow where a search ended unresolved) of
    a fixed number of engines split into p prefill and the rest decode
    engines (``disaggregation``: :class:`~mbbatch.Disaggregated`), against
    p, beside the same engines colocated, each running both phases (a band:
    its capacity's interval)."""
    ds = data["disaggregation"]
    split = variants(ds, "disaggregated")
    p = np.array([s["prefill_engines"] for _, s in split], dtype=float)
    d = np.array([s["decode_engines"] for _, s in split], dtype=float)
    names = [str(v) for v in ds["policy"].values]
    at = [names.index(name) for name, _ in split]
    every = capacity_search(ds, "policy")
    cap, lo, hi, unresolved = (np.asarray(v)[at] for v in every)
    fig, (ax,) = new_figure(7.8, 4.8)
    sim_points(ax, p, cap, lo, hi, unresolved.astype(bool), COLORS[0], MARKERS[0])
    ax.plot(p, cap, color=COLORS[0], lw=0.8, zorder=2)
    for x, y, dd in zip(p, cap, d):
        ax.annotate(f"{x:g}:{dd:g}", (x, y), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    together = [(name, s) for name, s in variants(ds) if s["kind"] != "disaggregated"]
    handles = [Line2D([], [], color=COLORS[0], marker=MARKERS[0], label="disaggregated, p prefill : d decode")]
    if together:
        name, settings = together[0]
        c, cl, ch = (float(np.asarray(v)[names.index(name)]) for v in every[:3])
        ax.axhline(c, color=COLORS[1], lw=1.2, ls="--", zorder=1)
        ax.axhspan(cl, ch, color=COLORS[1], alpha=0.15, lw=0, zorder=0)
        router = settings.get("router", default("Cluster.router")).replace("_", "-")
        handles.append(Line2D([], [], color=COLORS[1], ls="--", label=f"colocated ({int(p[0] + d[0])} engines, "
                                                                      f"both phases, {router})"))
    best = int(np.nanargmax(cap))
    ax.set_xticks(p, [f"{x:g}" for x in p])
    ax.set_xlabel(f"prefill engines p (of {int(p[0] + d[0])}; the rest decode)")
    ax.set_ylabel("capacity (requests/s) within the goodput objective")
    ax.set_ylim(0, 1.15 * float(np.nanmax(hi)))
    a = ds.attrs
    ax.set_title(f"best split {p[best]:g}:{d[best]:g}, {cap[best]:.2f} requests/s; goodput >= "
                 f"{a.get('objective_goodput', float('nan')):g} within TTFT {a.get('ttft_slo', float('nan')):g} s "
                 f"and TPOT {1e3 * a.get('tpot_slo', float('nan')):g} ms", fontsize=9)
    handles += style_handles(("sim", "capacity (95% interval over the searches)"),
                             ("hollow", "a search ended unresolved"))
    ax.legend(handles=handles, loc="lower center", fontsize=8)
    gbs = a.get("kv_bandwidth", default("KVTransfer.bandwidth")) / 1e9
    fig.suptitle("Prefill/decode disaggregation (Splitwise; DistServe): capacity against the split\n"
                 f"profile {a.get('profile', 'default')}\ncontinuous-batching engines of "
                 f"{a.get('max_num_seqs', '')} sequences and {a.get('kv_tokens', float('nan')):,.0f} KV tokens, "
                 f"KV moved at {gbs:g} GB/s", fontsize=10)
    return fig
