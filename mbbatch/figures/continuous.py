"""Continuous batching against batching run to completion.

- ``continuous_vs_binned``: on two measured GPUs, the saturated throughput
  of multi-bin batching (batches of 32 run to completion) against its bins,
  as a share of the continuous-batching engine's at the same 32 running
  sequences, and the engine's at 256 (vLLM's default);
- ``continuous_memory``: preemptions, p95 latency and throughput as the
  engine's KV cache shrinks, admitting first come first served, shortest
  predicted output first or by multi-bin;
- ``continuous_controller``: the dynamic-batching controller setting the
  engine's cap on running sequences against fixed caps: the mean and p99
  time between tokens against throughput, p95 latency and the cap against
  load;
- ``continuous_trace``: on the Azure conversation trace's lengths, the
  capacity of multi-bin batching (beside eq. (2)) and of dynamic batching
  against the continuous engine's, and p95 latency against load;
- ``policy_gains``: admission orders (shortest predicted output first,
  plain and with aging, multi-bin and the skip-join feedback queue) against
  first come first served on the same requests, each gain in time to first
  token and p99 latency with its paired interval, at three loads and three
  predictor errors; each order's capacity under a goodput objective (90 %
  of the requests within 0.5 s to the first token and 12 ms per output
  token) against the predictor's error; and, on two tenants of one engine,
  earliest deadline first and fair sharing beside them: each tenant's gain
  or cost against the load;
- ``prefix_caching``: an engine's capacity under a p99 time-to-first-token
  objective with and without prefix caching, against the share of its
  requests that carry a shared system prompt.
"""

from __future__ import annotations

import json

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..stats import paired_differences
from .analysis import replication_ci
from .data import line, per_rep, sim_series, variants
from .panels import capacity_search
from .style import COLORS, MARKERS, log2_k_axis, sim_points, style_handles

__all__ = ["continuous_vs_binned", "continuous_memory", "continuous_controller", "continuous_trace", "policy_gains",
           "prefix_caching"]

#: hardware_multibin's finished-member modes drawn, and their labels
_FINISHED = (("leave", "multi-bin, finished members leave"), ("stay", "multi-bin, finished members padded"))


def continuous_vs_binned(data) -> Figure:
    """Per profile: multi-bin batching's saturated throughput (markers, 95%
    t-intervals over the replications) over the continuous engine's at 32
    running sequences (the share of it each k recovers), with the engine at
    256 sequences as a dashed line."""
    mbs, cont = data["hardware_multibin"], data["continuous_vs_binned"]
    profiles_ = [str(p) for p in cont["profile"].values]
    k = np.asarray(mbs["bins"].values, dtype=float)
    fig = Figure(figsize=(11.5, 4.8), dpi=100, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(profiles_), sharey=True))
    top = 1.0
    for ax, name in zip(axes, profiles_):
        ref = float(line(cont, "sim_throughput_mean", None, profile=name, max_num_seqs=32))
        wide = float(line(cont, "sim_throughput_mean", None, profile=name, max_num_seqs=256))
        notes = [f"continuous, 32 sequences: {ref:.2f} requests/s", f"continuous, 256 sequences: {wide:.2f}"]
        for i, (finished, _) in enumerate(_FINISHED):
            mean, lo, hi, unstable = sim_series(mbs, "sim_throughput", "bins", profile=name, finished=finished)
            sim_points(ax, k, mean / ref, lo / ref, hi / ref, unstable, COLORS[i], MARKERS[i])
            ax.plot(k, mean / ref, color=COLORS[i], lw=0.8, zorder=2)
            notes.append(f"multi-bin ({finished}): {100 * mean[0] / ref:.0f} % at k = {int(k[0])}, "
                         f"{100 * mean[-1] / ref:.0f} % at k = {int(k[-1])}")
        ax.axhline(1.0, color="0.2", lw=1.0, zorder=1)
        ax.axhline(wide / ref, color="0.35", ls="--", lw=1.0, zorder=1)
        top = max(top, wide / ref)
        log2_k_axis(ax, int(k.max()))
        ax.set_xlabel("bins k of multi-bin batching (by output length)")
        ax.set_title(f"profile {name}", fontsize=9.5)
        ax.text(0.03, 0.97, "\n".join(notes), transform=ax.transAxes, va="top", ha="left", fontsize=8,
                color="0.2")
    axes[0].set_ylim(0, 1.45 * top)        # (room above the lines for the notes)
    axes[0].set_ylabel("saturated throughput / continuous batching's at 32 sequences")
    handles = [Line2D([], [], color=COLORS[i], marker=MARKERS[i], label=label)
               for i, (_, label) in enumerate(_FINISHED)]
    handles += style_handles(("sim", "simulated (95% t-interval over replications)"),
                             ("-", "continuous batching, 32 running sequences (1)"),
                             ("--", "continuous batching, 256 running sequences"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8.5)
    fig.suptitle("How much of continuous batching's throughput multi-bin batching recovers: batches of B = 32 "
                 "run to completion against an engine admitting at every iteration,\nboth timed by a measured "
                 "engine's iterations; log-normal prompts and outputs (medians 256 and 128 tokens), saturated",
                 fontsize=10)
    return fig


#: continuous_memory's admission orders, and their labels
_ADMISSIONS = (("fcfs", "first come first served"), ("spf", "shortest predicted output first"),
               ("multibin", "multi-bin (4 bins, round robin)"))


def continuous_memory(data) -> Figure:
    """Against the KV cache's capacity, per admission order: preemptions per
    request (the replications' mean), p95 latency and throughput (markers,
    95% t-intervals; hollow where the backlog grows)."""
    ds = data["continuous_memory"]
    kv = np.asarray(ds["kv_tokens"].values, dtype=float)
    fig = Figure(figsize=(12.5, 4.4), dpi=100, layout="constrained")
    ax_p, ax_l, ax_t = fig.subplots(1, 3)
    for i, (adm, _) in enumerate(_ADMISSIONS):
        c, m = COLORS[i], MARKERS[i]
        pre = np.nanmean(per_rep(ds, "preemptions", "kv_tokens", admission=adm)
                         / per_rep(ds, "completed", "kv_tokens", admission=adm), axis=1)
        unstable = line(ds, "unstable", "kv_tokens", admission=adm).astype(bool)
        sim_points(ax_p, kv, pre, pre, pre, unstable, c, m)
        ax_p.plot(kv, pre, color=c, lw=0.8, zorder=2)
        p95, lo, hi, _ = sim_series(ds, "sim_latency_p95", "kv_tokens", admission=adm)
        sim_points(ax_l, kv, p95, lo, hi, unstable, c, m)
        ax_l.plot(kv, p95, color=c, lw=0.8, zorder=2)
        mean, lo, hi, uns = sim_series(ds, "sim_throughput", "kv_tokens", admission=adm)
        sim_points(ax_t, kv, mean, lo, hi, uns, c, m)
        ax_t.plot(kv, mean, color=c, lw=0.8, zorder=2)
    rate = float(ds.attrs.get("rate", np.nan))
    ax_t.axhline(rate, color="0.35", ls="--", lw=1.0, zorder=1)
    ax_p.set_ylabel("preemptions per request")
    ax_l.set_ylabel("p95 latency (s)")
    ax_l.set_yscale("log")
    ax_t.set_ylabel("throughput (requests/s)")
    ax_t.set_ylim(0, 1.15 * rate)
    for ax in (ax_p, ax_l, ax_t):
        ax.set_xlabel("KV cache (thousands of tokens)")
        ax.set_xticks(kv, [f"{x / 1000:g}" for x in kv])
    handles = [Line2D([], [], color=COLORS[i], marker=MARKERS[i], label=label)
               for i, (_, label) in enumerate(_ADMISSIONS)]
    handles += style_handles(("sim", "simulated (95% t-interval; p95: mean over replications)"),
                             ("hollow", "no steady state (the backlog grows)"), ("--", "arrival rate"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8.5)
    fig.suptitle("Continuous batching as its KV cache shrinks: preemptions (recompute), latency and throughput by "
                 f"admission order\nH100 profile, 256 sequences at most, chunked prefill, Poisson arrivals at "
                 f"{rate:g} requests/s", fontsize=10)
    return fig


def _rep_interval(ds, var, x, **sel) -> tuple:
    """``(mean, low, high)`` along ``x`` of a metric stored per replication:
    the 95 % t-interval of its replications' mean (:func:`.analysis.replication_ci`)."""
    mean, half = replication_ci(per_rep(ds, var, x, **sel))
    return mean, mean - half, mean + half


def continuous_controller(data) -> Figure:
    """Per variant (fixed caps, and the controller at each D_SLA): the mean
    and the p99 time between tokens against the throughput carried (each
    point a load; 95 % t-intervals over the replications; hollow where the
    backlog grows), with the SLA lines; p95 latency and the cap in force
    (the controller's time average) against the offered load.  The
    controller holds the mean; the p99 is the iterations that carry a
    prefill chunk, which a cap on sequences does not bound."""
    ds = data["continuous_controller"]
    settings = dict(variants(ds))
    names = list(settings)
    rate = np.asarray(ds["rate"].values, dtype=float)
    ctl = [p for p in names if settings[p].get("sla_control")]
    fixed = [p for p in names if p not in ctl]
    # fixed caps in blues to greys by their size, the controllers in strong colours
    shades = ["#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b"]
    style = {p: (shades[i % len(shades)], MARKERS[i]) for i, p in enumerate(fixed)}
    style.update({p: (("#d62728", "#ff7f0e", "#2ca02c")[i % 3], "P*Xh"[i % 4]) for i, p in enumerate(ctl)})
    fig = Figure(figsize=(17.0, 4.6), dpi=100, layout="constrained")
    ax_m, ax_t, ax_l, ax_c = fig.subplots(1, 4)
    labels = {}
    for p in names:
        c, m = style[p]
        unstable = line(ds, "unstable", "rate", policy=p).astype(bool)
        thr = line(ds, "sim_throughput_mean", "rate", policy=p)
        for ax, var in ((ax_m, "sim_mean_tbt"), (ax_t, "sim_tbt_p99")):
            mean, lo, hi = (1e3 * v for v in _rep_interval(ds, var, "rate", policy=p))
            sim_points(ax, thr, mean, lo, hi, unstable, c, m)
            ax.plot(thr, mean, color=c, lw=0.8, zorder=2)
        p95 = line(ds, "sim_latency_p95_mean", "rate", policy=p)
        sim_points(ax_l, rate, p95, p95, p95, unstable, c, m)
        ax_l.plot(rate, p95, color=c, lw=0.8, zorder=2)
        cap, cap_lo, cap_hi = _rep_interval(ds, "sim_mean_max_num_seqs", "rate", policy=p)
        sim_points(ax_c, rate, cap, cap_lo, cap_hi, unstable, c, m)
        ax_c.plot(rate, cap, color=c, lw=0.8, zorder=2)
        if p in ctl:
            d = float(settings[p]["d_sla"])
            for ax in (ax_m, ax_t):
                ax.axhline(1e3 * d, color=c, ls="--", lw=1.0, zorder=1)
            labels[p] = f"controller, D_SLA = {1e3 * d:g} ms"
        else:
            labels[p] = f"max_num_seqs = {settings[p]['max_num_seqs']}"
    for ax, what in ((ax_m, "mean"), (ax_t, "p99")):
        ax.set_xlabel("throughput carried (requests/s)")
        ax.set_ylabel(f"{what} time between tokens (ms)")
    ax_l.set_xlabel("offered load (requests/s)")
    ax_l.set_ylabel("p95 latency (s)")
    ax_l.set_yscale("log")
    ax_c.set_xlabel("offered load (requests/s)")
    ax_c.set_ylabel("cap on running sequences (time average)")
    ax_c.set_yscale("log", base=2)
    caps = sorted({int(settings[p]["max_num_seqs"]) for p in fixed})
    ax_c.set_yticks(caps, [str(c) for c in caps])
    ax_c.minorticks_off()
    handles = [Line2D([], [], color=style[p][0], marker=style[p][1], label=labels[p]) for p in names]
    handles += style_handles(("sim", "simulated (95% t-interval over replications)"),
                             ("hollow", "no steady state (the backlog grows)"), ("--", "the controller's D_SLA"))
    fig.legend(handles=handles, loc="outside lower center", ncols=6, fontsize=8.5)
    fig.suptitle("The dynamic-batching controller setting a continuous-batching engine's max_num_seqs (Algorithms 2 "
                 "and 7 at every iteration) against fixed caps\nH100 profile with its measured prefill, chunked "
                 "prefill (2,048 tokens an iteration), Poisson arrivals, log-normal prompts and outputs (medians 256 "
                 "and 128 tokens)", fontsize=10)
    return fig


def continuous_trace(data) -> Figure:
    """Left: the capacity (saturated throughput, 95 % t-intervals) of
    multi-bin batching against its bins beside eq. (2) (the line) and its
    limit of every batch one length (dotted), with the continuous engine at
    256 and 32 sequences and dynamic batching as horizontal lines, each
    labelled with its share of the 256-sequence engine's.  Right: p95
    latency against the offered load, per policy (hollow where the backlog
    grows)."""
    cap, ds = data["continuous_trace_capacity"], data["continuous_trace"]
    settings = dict(variants(cap))
    mbs = [p for p in settings if settings[p]["kind"] == "multibin"]
    k = np.array([int(settings[p]["bins"]) for p in mbs], dtype=float)
    thr = {p: float(line(cap, "sim_throughput_mean", None, policy=p)) for p in settings}
    ref = next(p for p in settings if settings[p]["kind"] == "continuous" and
               settings[p].get("max_num_seqs", 256) == 256)
    fig = Figure(figsize=(12.5, 4.8), dpi=100, layout="constrained")
    ax_c, ax_l = fig.subplots(1, 2)
    mean, lo, hi = (np.array([float(line(cap, v, None, policy=p)) for p in mbs])
                    for v in ("sim_throughput_mean", "sim_throughput_ci_low", "sim_throughput_ci_high"))
    unstable = np.zeros(k.size, bool)
    sim_points(ax_c, k, mean, lo, hi, unstable, COLORS[0], MARKERS[0])
    theory = np.array([float(line(cap, "theory_service_rate", None, policy=p)) for p in mbs])
    ax_c.plot(k, theory, color=COLORS[0], lw=1.2, zorder=2)
    limit = float(line(cap, "capacity", None, policy=mbs[0]))
    ax_c.axhline(limit, color=COLORS[0], ls=":", lw=1.0, zorder=1)
    others = [p for p in settings if p not in mbs]
    lines_ = {}
    for i, p in enumerate(others):
        c = COLORS[(i + 1) % len(COLORS)]
        ls = ("-", "--", "-.", (0, (5, 1, 1, 1)))[i % 4]
        ax_c.axhline(thr[p], color=c, ls=ls, lw=1.2, zorder=1)
        lines_[p] = (c, ls, MARKERS[(i + 1) % len(MARKERS)])
    notes = [f"{_trace_label(p, settings[p])}: {thr[p]:.2f} requests/s ({100 * thr[p] / thr[ref]:.0f} %)"
             for p in others]
    notes += [f"multi-bin, k = {int(x)}: {m:.2f} ({100 * m / thr[ref]:.0f} %)" for x, m in zip(k, mean)]
    notes.append(f"multi-bin's limit (every batch one length): {limit:.2f}")
    ax_c.text(0.98, 0.03, "\n".join(notes), transform=ax_c.transAxes, va="bottom", ha="right", fontsize=8,
              color="0.2")
    log2_k_axis(ax_c, int(k.max()))
    ax_c.set_xlabel("bins k of multi-bin batching (by output length)")
    ax_c.set_ylabel("capacity: saturated throughput (requests/s)")
    ax_c.set_ylim(0, 1.1 * max(thr.values()))
    rate = np.asarray(ds["rate"].values, dtype=float)
    styles = {**{p: (COLORS[0], "-", MARKERS[(i + 4) % len(MARKERS)]) for i, p in enumerate(mbs)}, **lines_}
    shades = np.linspace(0.35, 1.0, len(mbs))
    for p in settings:
        c, ls, m = styles[p]
        alpha = shades[mbs.index(p)] if p in mbs else 1.0
        p95 = line(ds, "sim_latency_p95_mean", "rate", policy=p)
        uns = line(ds, "unstable", "rate", policy=p).astype(bool)
        sim_points(ax_l, rate, p95, p95, p95, uns, c, m)
        ax_l.plot(rate, p95, color=c, ls=ls, lw=0.9, alpha=alpha, zorder=2)
    ax_l.set_yscale("log")
    ax_l.set_xlabel("offered load (requests/s)")
    ax_l.set_ylabel("p95 latency (s)")
    handles = [Line2D([], [], color=COLORS[0], marker=MARKERS[0], label="multi-bin batching, B = 32 (capacity)"),
               Line2D([], [], color=COLORS[0], lw=1.2, label="eq. (2) under the profile")]
    handles += [Line2D([], [], color=styles[p][0], ls=styles[p][1], marker=styles[p][2], label=_trace_label(
        p, settings[p])) for p in settings if p not in mbs]
    handles += [Line2D([], [], color=COLORS[0], marker=styles[p][2], ls="none",
                       label=f"multi-bin, k = {settings[p]['bins']} (latency)") for p in mbs]
    handles += style_handles(("sim", "simulated (capacity: 95% t-interval over replications)"),
                             ("hollow", "no steady state (the backlog grows)"), (":", "multi-bin's limit"))
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8.5)
    fig.suptitle("Continuous batching against batching run to completion on a real workload: the Azure conversation "
                 "trace's lengths (means 1,155 and 211 tokens),\nevery iteration timed by one measured engine "
                 f"({cap.attrs.get('profile', 'A100/vLLM/Meta-Llama-3-8B/tp1')}); Poisson arrivals for the "
                 "latencies", fontsize=10)
    return fig


def _trace_label(name: str, s: dict) -> str:
    """A legend label of a continuous_trace variant."""
    if s["kind"] == "continuous":
        return f"continuous batching, {s.get('max_num_seqs', 256)} sequences"
    if s["kind"] == "dynamic":
        return "dynamic batching (Algorithms 1-3, 7)"
    return name


#: policy_gains's admission orders drawn against its baseline (first come first served), and their labels
_GAINS = (("spf", "shortest predicted output first"),
          ("spf_aging", "shortest predicted output first, aging {aging:g} tokens/s"),
          ("multibin", "multi-bin (4 bins by predicted output, round robin)"),
          ("mlfq", "skip-join multi-level feedback queue (FastServe; no prediction)"))
#: policy_gains's metrics, and their words
_GAIN_METRICS = (("mean_ttft", "mean time to first token"), ("latency_p99", "p99 latency"))


def policy_gains(data) -> Figure:
    """Per predictor error (columns) and metric (rows): each admission
    order's metric over first come first served's against the load (markers:
    the ratio of the means with its paired 95 % interval over the
    replications, :func:`mbbatch.stats.paired_differences`; hollow where
    the backlog grows); the dashed line at 1 is FCFS.  Right: each order's
    capacity under the goodput objective of ``policy_gains_capacity``
    against the predictor's error (its interval over the searches).  Below,
    two tenants of one engine (``policy_gains_classes`` and
    ``policy_gains_classes_capacity``: :func:`_tenants`)."""
    ds = data["policy_gains"]
    baseline = str(ds.attrs.get("baseline", "fcfs"))
    level = float(ds.attrs.get("confidence_level", 0.95))
    diffs = paired_differences(ds, baseline, level, [m for m, _ in _GAIN_METRICS])
    sigmas = np.asarray(ds["predictor_sigma"].values, dtype=float)
    rates = np.asarray(ds["rate"].values, dtype=float)
    fig = Figure(figsize=(16.0, 11.0), dpi=100, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(7.2, 3.8))
    left, right = top.subfigures(1, 2, width_ratios=(3.0, 1.15))
    _tenants(bottom, data["policy_gains_classes"], data["policy_gains_classes_capacity"])
    axes = left.subplots(len(_GAIN_METRICS), sigmas.size, sharex=True, sharey="row", squeeze=False)
    _goodput_capacity(right.subplots(), data["policy_gains_capacity"])
    for i, (metric, words) in enumerate(_GAIN_METRICS):
        for j, sigma in enumerate(sigmas):
            ax = axes[i, j]
            ax.axhline(1.0, color="0.35", ls="--", lw=1.0, zorder=1)
            for k, (name, _) in enumerate(_GAINS):
                sel = dict(policy=name, predictor_sigma=sigma)
                ratio, lo, hi = (line(diffs, f"ratio_{metric}{s}", "rate", **sel) for s in ("", "_ci_low", "_ci_high"))
                unstable = line(ds, "unstable", "rate", **sel).astype(bool)
                c, m = COLORS[k + 1], MARKERS[k + 1]
                sim_points(ax, rates, ratio, lo, hi, unstable, c, m)
                ax.plot(rates, ratio, color=c, lw=0.8, zorder=2)
            if i == 0:
                ax.set_title(f"predictor error sigma = {sigma:g}" + (" (the oracle)" if sigma == 0 else ""),
                             fontsize=9.5)
            if j == 0:
                ax.set_ylabel(f"{words} / FCFS's")
            if i == len(_GAIN_METRICS) - 1:
                ax.set_xlabel("arrival rate (requests/s)")
    handles = [Line2D([], [], color=COLORS[k + 1], marker=MARKERS[k + 1],
                      label=label.format(aging=json.loads(ds.attrs.get(f"policy_{name}", "{}")).get("aging", 0.0)))
               for k, (name, label) in enumerate(_GAINS)]
    handles += style_handles(("sim", f"ratio of the means ({100 * level:g} % paired interval over "
                                     f"{ds.sizes['rep']} replications)"),
                             ("hollow", "no steady state (the backlog grows)"),
                             ("--", "first come first served (the baseline)"))
    left.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8.5)
    top.suptitle("Admission orders of a continuous-batching engine against first come first served, on the same "
                 "requests: the gain and its interval, and the capacity under a goodput objective\nH100 profile "
                 "(Llama-3-8B, vLLM), 16 sequences at most, log-normal prompts and outputs (medians 256 and 128 "
                 "tokens), Poisson arrivals", fontsize=10)
    return fig


#: the two-tenant row's orders (colours and markers by their place in policy_gains' rows), and their labels
_TENANT_ORDERS = (("fcfs", "first come first served", 0), ("spf", "shortest predicted output first", 1),
                  ("mlfq", "skip-join feedback queue", 4),
                  ("edf", "earliest deadline first (the tenant's TTFT objective)", 5),
                  ("vtc", "fair sharing (virtual token counters)", 6))


def _tenants(sub, ds, cap) -> None:
    """policy_gains' bottom row, from ``policy_gains_classes``: on two
    tenants of one engine, against the load, the interactive tenant's p99
    time to first token over FCFS's and its goodput (the share of its
    requests within both its objectives), and the batch tenant's mean
    latency over FCFS's; ratios of the means with their paired interval
    over the replications, goodput with its interval (hollow: no steady
    state).  Last, from ``policy_gains_classes_capacity``, each order's
    capacity under the interactive tenant's goodput objective (its interval
    over the searches; hollow: a bracket narrowed by undecided probes)."""
    baseline = str(ds.attrs.get("baseline", "fcfs"))
    level = float(ds.attrs.get("confidence_level", 0.95))
    diffs = paired_differences(ds, baseline, level, ["class_ttft_p99", "class_mean_latency"])
    rates = np.asarray(ds["rate"].values, dtype=float)
    classes = [str(c) for c in ds["request_class"].values]
    share = json.loads(ds.attrs.get("classes", "{}"))
    # (the tenant of the tightest objective on the first token, and of the loosest)
    by_slo = sorted(classes, key=lambda c: float(share.get(c, {}).get("ttft_slo", np.inf)))
    fast, slow = by_slo[0], by_slo[-1]
    axes = sub.subplots(1, 4, width_ratios=(1.0, 1.0, 1.0, 0.8))
    _tenant_capacity(axes[3], cap)
    panels = (("ratio_class_ttft_p99", fast, f"{fast}: p99 time to first token / FCFS's", True),
              ("sim_class_goodput", fast, f"{fast}: goodput (share within both objectives)", False),
              ("ratio_class_mean_latency", slow, f"{slow}: mean latency / FCFS's", True))
    for ax, (var, cls, words, ratio) in zip(axes[:3], panels):
        src = diffs if ratio else ds
        for name, _, k in _TENANT_ORDERS:
            if ratio and name == baseline:
                continue
            sel = dict(policy=name, request_class=cls)
            if ratio:
                mean, lo, hi = (line(src, f"{var}{s}", "rate", **sel) for s in ("", "_ci_low", "_ci_high"))
            else:
                mean, lo, hi = (line(src, f"{var}{s}", "rate", **sel) for s in ("_mean", "_ci_low", "_ci_high"))
            unstable = line(ds, "unstable", "rate", policy=name).astype(bool)
            sim_points(ax, rates, mean, lo, hi, unstable, COLORS[k], MARKERS[k])
            ax.plot(rates, mean, color=COLORS[k], lw=0.8, zorder=2)
        if ratio:
            ax.axhline(1.0, color="0.35", ls="--", lw=1.0, zorder=1)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(words, fontsize=9.5)
        ax.set_xlabel("arrival rate (requests/s)")
    handles = [Line2D([], [], color=COLORS[k], marker=MARKERS[k], label=label) for _, label, k in _TENANT_ORDERS]
    sub.legend(handles=handles, loc="outside right center", fontsize=8.5)
    sub.suptitle("Two tenants on one engine: " + "; ".join(
        f"{c}, share {share[c]['share']:g}, medians {share[c]['prompt_median']:g} and "
        f"{share[c]['output_median']:g} tokens, first token within {share[c]['ttft_slo']:g} s"
        + (f" and {1e3 * share[c]['tpot_slo']:g} ms per token" if "tpot_slo" in share[c] else "")
        for c in by_slo) + f"\npredictor error sigma {float(ds.attrs.get('predictor_sigma', np.nan)):g}, "
        f"{ds.sizes['rep']} paired replications: who gains and who pays", fontsize=10)


def _tenant_capacity(ax, cap) -> None:
    """policy_gains' bottom right: each order's capacity under the goodput
    objective of one tenant (``policy_gains_classes_capacity``), a point per
    order with its interval over the searches."""
    names = [str(p) for p in cap["policy"].values]
    for x, (name, label, k) in enumerate(o for o in _TENANT_ORDERS if o[0] in names):
        found, lo, hi, unresolved = (np.atleast_1d(v) for v in capacity_search(cap.expand_dims("one"), "one",
                                                                                  policy=name))
        sim_points(ax, [x], found, lo, hi, unresolved, COLORS[k], MARKERS[k])
    shown = [o for o in _TENANT_ORDERS if o[0] in names]
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels([name for name, _, _ in shown])
    ax.set_xlim(-0.6, len(shown) - 0.4)
    tenant, want = next(((c, o) for c, o in json.loads(cap.attrs.get("classes", "{}")).items()
                         if "objective_goodput" in o), ("?", {}))
    ax.set_title(f"capacity: {tenant} goodput >= {want.get('objective_goodput', np.nan):g}", fontsize=9.5)
    ax.set_ylabel("requests/s")


def _goodput_capacity(ax, cap) -> None:
    """policy_gains' right panel: each order's capacity under the goodput
    objective (its searches' mean and interval) against the predictor's
    error, FCFS's included."""
    x = np.asarray(cap["predictor_sigma"].values, dtype=float)
    orders = (("fcfs", "first come first served"), *_GAINS)
    for k, (name, _) in enumerate(orders):
        c, m = COLORS[k], MARKERS[k]
        found, lo, hi, unresolved = capacity_search(cap, "predictor_sigma", policy=name)
        sim_points(ax, x, found, lo, hi, unresolved, c, m)
        ax.plot(x, found, color=c, lw=0.8, zorder=2)
    a = cap.attrs
    ax.set_xlabel("predictor error sigma")
    ax.set_ylabel("capacity under the goodput objective (requests/s)")
    ax.set_title(f"largest rate with goodput >= {float(a.get('objective_goodput', 0.9)):g}: time to first token "
                 f"<= {float(a.get('ttft_slo', np.nan)):g} s\nand per output token <= "
                 f"{1e3 * float(a.get('tpot_slo', np.nan)):g} ms (DistServe's goodput)", fontsize=9)
    searches = int(a.get("capacity_searches", 3))
    ax.legend(handles=[Line2D([], [], color=COLORS[0], marker=MARKERS[0], label="first come first served"),
                       *style_handles(("sim", f"find_capacity: mean, interval over {searches} searches"),
                                      ("hollow", "bracket narrowed by probes undecided at the cap"))],
              loc="lower left", fontsize=8)


#: prefix_caching's two engines, and their labels
_CACHING = ((False, "no prefix caching"), (True, "prefix caching (vLLM's automatic prefix caching)"))
#: prefix_caching's clusters (prefix_routing's policies), and their labels
_ROUTING = (("no_cache", "no prefix caching, least used"), ("least_used", "prefix caching, least used"),
            ("cache_aware", "prefix caching, cache-aware routing (SGLang's)"))


def prefix_caching(data) -> Figure:
    """Capacity under a p99 time-to-first-token objective (markers: the
    capacity and its 95 % interval over the searches, hollow where a search
    ended unresolved) against the share of the requests that carry one of
    the shared system prompts: on the left one engine with and without
    prefix caching (``prefix_caching``); in the middle a cluster of engines
    (``prefix_routing``: more system prompts than one engine's memory
    holds) without prefix caching, with it behind least-used routing, and
    with it behind the cache-aware router; on the right the capacity with
    the cache over without (one engine) and with cache-aware routing over
    least-used (the cluster)."""
    ds, dr = data["prefix_caching"], data["prefix_routing"]
    share = np.asarray(ds["system_prompt_share"].values, dtype=float)
    share_r = np.asarray(dr["system_prompt_share"].values, dtype=float)
    fig = Figure(figsize=(15.5, 4.9), dpi=100, layout="constrained")
    ax, ax_c, ax_r = fig.subplots(1, 3)
    caps = {}
    for i, (on, _) in enumerate(_CACHING):
        cap, lo, hi, unresolved = capacity_search(ds, "system_prompt_share", prefix_caching=on)
        caps[on] = cap
        sim_points(ax, share, cap, lo, hi, unresolved, COLORS[i], MARKERS[i])
        ax.plot(share, cap, color=COLORS[i], lw=0.8, zorder=2)
    routed = {}
    for i, (policy, _) in enumerate(_ROUTING):
        cap, lo, hi, unresolved = capacity_search(dr, "system_prompt_share", policy=policy)
        routed[policy] = cap
        sim_points(ax_c, share_r, cap, lo, hi, unresolved, COLORS[2 + i], MARKERS[2 + i])
        ax_c.plot(share_r, cap, color=COLORS[2 + i], lw=0.8, zorder=2)
    ratios = ((share, caps[True] / caps[False], COLORS[1], MARKERS[1], "one engine: prefix caching / none"),
              (share_r, routed["cache_aware"] / routed["least_used"], COLORS[4], MARKERS[4],
               "cluster: cache-aware / least-used routing"))
    for x, ratio, color, marker, label in ratios:
        ax_r.plot(x, ratio, color=color, marker=marker, lw=0.8, label=label)
        for xi, y in zip(x, ratio):
            ax_r.annotate(f"{y:.2f}x", (xi, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax_r.axhline(1.0, color="0.35", ls="--", lw=1.0, zorder=1)
    ax_r.legend(loc="upper left", fontsize=8)
    for a in (ax, ax_c):
        a.set_ylim(0, None)
        a.set_ylabel("capacity (requests/s) within the p99 TTFT objective")
    ax_r.set_ylabel("capacity ratio")
    ax_r.set_ylim(0, 1.25 * float(np.nanmax(np.concatenate([r[1] for r in ratios]))))
    for a, x in ((ax, share), (ax_c, share_r), (ax_r, share)):
        a.set_xlabel("share of the requests carrying a shared system prompt")
        a.set_xticks(x, [f"{v:g}" for v in x])
    attrs, ra = ds.attrs, dr.attrs
    ax.set_title(f"one engine, {attrs.get('system_prompts', '')} system prompts of "
                 f"{attrs.get('system_prompt_length', float('nan')):g} tokens", fontsize=9.5)
    ax_c.set_title(f"{ra.get('engines', '')} engines, {ra.get('system_prompts', '')} system prompts of "
                   f"{ra.get('system_prompt_length', float('nan')):g} tokens (more than an engine holds)",
                   fontsize=9.5)
    handles = [Line2D([], [], color=COLORS[i], marker=MARKERS[i], label=label)
               for i, (_, label) in enumerate(_CACHING)]
    handles += [Line2D([], [], color=COLORS[2 + i], marker=MARKERS[2 + i], label=label)
                for i, (_, label) in enumerate(_ROUTING)]
    handles += style_handles(("sim", "capacity (95% interval over the searches)"),
                             ("hollow", "a search ended unresolved"))
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8.5)
    fig.suptitle(f"Prefix caching and cache-aware routing: capacity within a p99 time to first token of "
                 f"{attrs.get('objective_ttft_p99', float('nan')):g} s as more requests share system prompts\n"
                 f"H100 profile, continuous-batching engines of {attrs.get('max_num_seqs', '')} sequences and "
                 f"{attrs.get('kv_tokens', float('nan')):,.0f} KV tokens, log-normal prompts and outputs (medians 256 "
                 "and 128 tokens) after the system prompt", fontsize=10)
    return fig
