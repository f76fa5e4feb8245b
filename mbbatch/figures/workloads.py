"""The realistic-workload experiments: how good a length predictor must be
(``predictor_gain``), and bursty arrivals against Poisson (``bursty``).

Each takes ``{dataset name: Dataset}`` and returns a
:class:`matplotlib.figure.Figure`; conventions as in
:mod:`mbbatch.figures`.  The paper's Figures 6 and 7 on a real trace's
lengths are in :mod:`.paper` (``fig6``, ``fig7``).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .. import theory
from .analysis import replication_ci
from .data import line, per_rep, setting, sim_series, unit, variants
from .style import COLORS, MARKERS, log_ylim, new_figure, series_handles, sim_points, style_handles, two_legends

__all__ = ["predictor_gain", "bursty", "trace_replay"]


def _gain_panel(ax, ds, x: str):
    """Saturated throughput of each k over that of k = 1, per replication
    (cells differing only in k or the predictor see the same requests, so
    the ratio is paired), mean and 95% t-interval; the oracle's Theorem 4.2
    gain as a dotted level."""
    xs = np.asarray(ds[x].values, dtype=float)
    one = per_rep(ds, "sim_throughput", x, bins=1)
    ks = [int(k) for k in ds["bins"].values if int(k) > 1]
    a = ds.attrs
    B, lo_, hi_ = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    for k, c, m in zip(ks, COLORS[1:], MARKERS[1:]):
        gain = per_rep(ds, "sim_throughput", x, bins=k) / one
        mean, half = replication_ci(gain)
        sim_points(ax, xs, mean, mean - half, mean + half, np.zeros(xs.size, bool), c, m)
        ax.plot(xs, mean, color=c, lw=0.8, zorder=2)
        oracle = theory.service_time(B, lo_, hi_, 1) / theory.service_time(B, lo_, hi_, k)
        ax.axhline(oracle, color=c, ls=":", lw=1.0, zorder=1)
    ax.axhline(1.0, color="0.4", lw=0.8, zorder=1)
    ax.set_ylabel("saturated throughput / that of k = 1")
    return series_handles([f"k = {k}" for k in ks], COLORS[1:], MARKERS[1:])


def predictor_gain(data) -> Figure:
    """Multi-bin batching's gain over k = 1 against the predictor's error:
    log-normal error sigma (left) and bin accuracy p (right)."""
    fig, (ax1, ax2) = new_figure(11.0, 4.4, ncols=2)
    series = _gain_panel(ax1, data["predictor_error"], "predictor_sigma")
    ax1.set_xlabel("log-normal error $\\sigma$: predicted = true $\\times e^{\\sigma Z}$")
    ax1.set_title("log-normal length error")
    _gain_panel(ax2, data["bin_confusion"], "predictor_p")
    ax2.invert_xaxis()
    ax2.set_xlabel("bin accuracy p: the true bin with probability p, else a neighbour")
    ax2.set_title("bin confusion")
    styles = style_handles(("sim", "simulation: mean $\\pm$ 95% CI (paired with k = 1)"),
                           (":", "oracle: Theorem 4.2's gain"))
    two_legends(ax1, series, styles, loc1="upper right", loc2="lower left")
    fig.suptitle("How good must a length predictor be? Saturated multi-bin batching\n"
                 + setting(data["predictor_error"]), fontsize=10)
    return fig


def bursty(data) -> Figure:
    """Mean latency against the mean arrival rate under gamma renewal
    arrivals of CV 1 (Poisson in law), 2 and 4, and ON/OFF bursts at the
    same mean rates, for k = 1 and 4."""
    ds = data["bursty"]
    onoff = data.get("bursty_onoff")
    onoff_sims = []
    fig, (ax,) = new_figure(8.4, 4.8)
    rates = np.asarray(ds["rate"].values, dtype=float)
    cvs = [float(v) for v in ds["cv"].values]
    ks = [int(k) for k in ds["bins"].values]
    stable, sims = [], []
    for k, m, ls in zip(ks, MARKERS, ("-", "--")):
        for cv, c in zip(cvs, COLORS):
            sel = dict(bins=k, cv=cv)
            mean, lo, hi, unst = sim_series(ds, "sim_mean_latency", "rate", **sel)
            stable.append(np.concatenate([hi[~unst], mean[~unst], lo[~unst]]))
            sims.append((mean, lo, hi, unst, c, m))
            ax.plot(rates[~unst], mean[~unst], color=c, ls=ls, lw=0.9, zorder=2)
        cap = float(line(ds, "theory_service_rate", "rate", bins=k, cv=cvs[0])[0])
        ax.axvline(cap, color="0.35", ls=ls, lw=0.8, zorder=1)
        if onoff is not None:
            # ON/OFF at the same mean rates: rate_on * mean_on / (mean_on + mean_off)
            a = onoff.attrs
            share = float(a["mean_on"]) / (float(a["mean_on"]) + float(a["mean_off"]))
            x = np.asarray(onoff["rate_on"].values, dtype=float) * share
            c = COLORS[len(cvs)]
            mean, lo, hi, unst = sim_series(onoff, "sim_mean_latency", "rate_on", bins=k)
            keep = x <= rates.max() * 1.0001
            x, mean, lo, hi, unst = x[keep], mean[keep], lo[keep], hi[keep], unst[keep]
            stable.append(np.concatenate([hi[~unst], mean[~unst], lo[~unst]]))
            onoff_sims.append((x, mean, lo, hi, unst, c, m))
            ax.plot(x[~unst], mean[~unst], color=c, ls=ls, lw=0.9, zorder=2)
    ax.set_yscale("log")
    top = log_ylim(ax, stable, [])
    for mean, lo, hi, unst, c, m in sims:
        sim_points(ax, rates, mean, lo, hi, unst, c, m, clip_top=top / 1.15)
    for x, mean, lo, hi, unst, c, m in onoff_sims:
        sim_points(ax, x, mean, lo, hi, unst, c, m, clip_top=top / 1.15)
    ax.set_xlabel(f"mean arrival rate $\\lambda$ ({unit(ds, 'rate')})")
    ax.set_ylabel(f"mean latency ({unit(ds, 'sim_mean_latency_mean')})")
    labels = [f"gamma, CV {cv:g}" + (" (Poisson in law)" if cv == 1 else "") for cv in cvs]
    if onoff is not None:
        a = onoff.attrs
        labels.append(f"ON/OFF: {float(a['mean_on']):g} s at rate_on, {float(a['mean_off']):g} s at "
                      f"{float(a['rate_off']):g}")
    series = series_handles(labels, COLORS[: len(labels)], ["o"] * len(labels))
    styles = style_handles(*[(ls, f"k = {k} (marker {m}); grey: its saturated throughput")
                             for k, m, ls in zip(ks, MARKERS, ("-", "--"))], ("hollow", "unstable cell"))
    two_legends(ax, series, styles, loc1="upper left", loc2="lower right")
    ax.set_title("Bursty arrivals at the same mean rate: gamma renewal gaps of CV 1, 2, 4 and ON/OFF bursts\n"
                 + setting(ds))
    return fig


def trace_replay(data) -> Figure:
    """The Azure conversation trace replayed at several speeds through every
    policy: throughput and p95 latency against the replay's speed-up."""
    ds = data["trace_replay"]
    fig, (ax1, ax2) = new_figure(11.0, 4.6, ncols=2)
    scales = np.asarray(ds["scale"].values, dtype=float)
    names = [name for name, _ in variants(ds)]
    stable = []
    for name, c, m in zip(names, COLORS, MARKERS):
        unst = line(ds, "unstable", "scale", policy=name)
        thr = line(ds, "sim_throughput_mean", "scale", policy=name)
        ax1.plot(scales, thr, color=c, lw=0.8, zorder=2)
        sim_points(ax1, scales, thr, thr, thr, unst, c, m)
        p95 = per_rep(ds, "sim_latency_p95", "scale", policy=name).mean(axis=1)
        ax2.plot(scales[~unst], p95[~unst], color=c, lw=0.8, zorder=2)
        stable.append(p95[~unst])
        sim_points(ax2, scales, p95, p95, p95, unst, c, m)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(scales, [f"{s:g}x" for s in scales])
        ax.set_xlabel("replay speed-up (the trace's arrival times divided by it)")
    ax1.set_ylabel(f"throughput ({unit(ds, 'sim_throughput_mean')})")
    ax2.set_yscale("log")
    ax2.set_ylabel(f"95th percentile latency ({unit(ds, 'sim_latency_p95')})")
    rate = (float(ds.attrs["trace_requests"]) - 1) / float(ds.attrs["trace_span_s"])   # the trace's mean rate
    ax1.plot(scales, rate * scales, color="0.4", ls=":", lw=1.0, zorder=1)
    series = series_handles(names, COLORS[: len(names)], MARKERS[: len(names)])
    styles = style_handles(("sim", "simulation"), ("hollow", "unstable: the backlog grows"),
                           (":", "the replay's arrival rate"))
    two_legends(ax1, series, styles, loc1="upper left", loc2="lower right")
    a = ds.attrs
    fig.suptitle(f"The Azure conversation trace replayed through every policy ({a['trace_file']}, "
                 f"{int(a['trace_requests']):,} requests, {int(a['servers'])} servers, "
                 f"{1e3 * float(a['per_token']):g} ms per output token)", fontsize=10)
    return fig

