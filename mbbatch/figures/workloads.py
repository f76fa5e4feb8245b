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
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

from .. import theory
from .analysis import OVERLOAD, replication_ci
from .data import constant, line, per_rep, setting, sim_series, unit, variants
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


#: bursty's series drawn this far apart along x (requests/s), so that markers
#: at the same rate (the arrival processes agree at light load, and every
#: unstable cell sits on the top edge) stay visible side by side; the Poisson
#: series, which Lemma 5.1 describes, stays at its rate
BURSTY_DODGE = 0.03


def _bursty_series(data) -> list:
    """bursty's series: ``(label, x, get)`` per arrival process, ``get(k)``
    giving ``(mean, ci_low, ci_high, unstable)`` of the mean latency along
    ``x``, the mean arrival rate."""
    ds = data["bursty"]
    onoff = data.get("bursty_onoff")
    rates = np.asarray(ds["rate"].values, dtype=float)
    out = [(f"gamma gaps, CV {cv:g}" + (" (Poisson)" if cv == 1 else ""), rates,
            lambda k, cv=cv: sim_series(ds, "sim_mean_latency", "rate", bins=k, cv=cv))
           for cv in (float(v) for v in ds["cv"].values)]
    if onoff is not None:
        # ON/OFF at the same mean rates: rate_on * mean_on / (mean_on + mean_off)
        a = onoff.attrs
        share = float(a["mean_on"]) / (float(a["mean_on"]) + float(a["mean_off"]))
        x = np.asarray(onoff["rate_on"].values, dtype=float) * share
        keep = x <= rates.max() * 1.0001
        out.append((f"ON/OFF: {float(a['mean_on']):g} s at rate_on, {float(a['mean_off']):g} s at "
                    f"{float(a['rate_off']):g}", x[keep],
                    lambda k: tuple(v[keep] for v in sim_series(onoff, "sim_mean_latency", "rate_on", bins=k))))
    return out


def bursty(data) -> Figure:
    """Mean latency against the mean arrival rate under gamma renewal
    arrivals of CV 1 (Poisson in law), 2 and 4, and ON/OFF bursts at the
    same mean rates: one panel per k (1 and 4), one marker and colour per
    arrival process, Lemma 5.1 for the Poisson case."""
    ds = data["bursty"]
    ks = [int(k) for k in ds["bins"].values]
    B = int(ds.attrs["batch_size"])
    rates = np.asarray(ds["rate"].values, dtype=float)
    found = _bursty_series(data)
    colors, markers = COLORS[: len(found)], MARKERS[: len(found)]
    cvs = [float(v) for v in ds["cv"].values]
    cv1 = 1.0 in cvs
    offsets = (np.arange(len(found)) - (cvs.index(1.0) if cv1 else 0)) * BURSTY_DODGE
    xd = np.linspace(rates.min(), rates.max() + offsets.max(), 400)
    sims, stable, curves = {}, [], {}
    for k in ks:
        sims[k] = [get(k) for _, _, get in found]
        for mean, lo, hi, unst in sims[k]:
            stable.append(np.concatenate([hi[~unst], mean[~unst], lo[~unst]]))
        if cv1:
            # Lemma 5.1 for Poisson arrivals: E[t_service] + (B - 1) k / (2 lambda)
            ets = constant(ds, "theory_mean_batch_service", bins=k, cv=1.0)
            curves[k] = ets + (B - 1) * k / (2 * xd)
    fig, axes = new_figure(11.6, 5.0, ncols=len(ks))
    for ax, k in zip(axes, ks):
        ax.set_yscale("log")
        top = log_ylim(ax, stable, list(curves.values()))        # the same scale in every panel
        if k in curves:
            ax.plot(xd, curves[k], color=colors[0], lw=1.1, zorder=2)
        cap = constant(ds, "theory_service_rate", bins=k)
        ax.axvline(cap, color="0.35", ls=":", lw=1.1, zorder=1)
        for (_, x, _), (mean, lo, hi, unst), c, m, dx in zip(found, sims[k], colors, markers, offsets):
            sim_points(ax, x + dx, mean, lo, hi, unst, c, m, clip_top=top / 1.15, unstable_bars=False)
        ax.set_xlim(rates.min() - 0.1, rates.max() + offsets.max() + 0.1)
        ax.set_xlabel(f"mean arrival rate $\\lambda$ ({unit(ds, 'rate')})")
        ax.set_ylabel(f"mean latency ({unit(ds, 'sim_mean_latency_mean')})")
        ax.set_title(f"k = {k} bin{'s' if k > 1 else ''}: saturated at {cap:.2f} {unit(ds, 'rate')}")
    handles = [Line2D([], [], color=c, marker=m, ls="none", label=label)
               for (label, _, _), c, m in zip(found, colors, markers)]
    moved = ", ".join(f"{dx:+g}" for dx in offsets)
    handles += style_handles(("sim", f"simulation: mean $\\pm$ 95% CI (drawn {moved} along x, in this order)"),
                             ("hollow", "unstable: no steady state, no interval (on the top edge if off scale)"))
    if curves:
        handles.append(Line2D([], [], color=colors[0], lw=1.1,
                              label="Lemma 5.1, Poisson: $\\infty$ servers (one server: a lower bound)"))
    handles.append(Line2D([], [], color="0.35", ls=":", lw=1.1,
                          label="saturated throughput (Theorem 4.2): the same for every arrival process"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3)
    fig.suptitle("What do bursts cost? Mean latency under gamma renewal arrivals (gaps of CV 1, 2, 4) and ON/OFF "
                 "bursts at the same mean rate\n" + setting(ds), fontsize=10)
    return fig


def _replay_label(settings: dict, attrs: dict) -> str:
    """A legend label of a trace_replay variant, from its settings (or the
    store's attrs, for a setting the spec gives every variant)."""
    def get(key, fallback=None):
        value = settings.get(key, attrs.get(key, fallback))
        return None if value is None else float(value)

    kind = settings["kind"]
    bins, size = get("bins"), get("batch_size")
    if kind == "multibin":
        wait = get("max_wait", np.inf)
        return ("multi-bin" + (f", k = {bins:g}" if bins is not None else "")
                + (f", B = {size:g}" if size is not None else "")
                + (f", max_wait {wait:g} s" if np.isfinite(wait) else ""))
    if kind == "static":
        return "static" + (f", B = {size:g}" if size is not None else "")
    if kind == "multibin_dynamic":
        return "multi-bin dynamic" + (f", K = {bins:g}" if bins is not None else "")
    if kind == "dynamic":
        return "dynamic batching"
    return kind


def trace_replay(data) -> Figure:
    """The Azure conversation trace replayed at several speeds through every
    policy: throughput and p95 latency against the replay's speed-up."""
    ds = data["trace_replay"]
    fig, (ax1, ax2) = new_figure(11.0, 4.9, ncols=2)
    scales = np.asarray(ds["scale"].values, dtype=float)
    found = variants(ds)
    names = [name for name, _ in found]
    # a replay in the trace's order is deterministic: with one replication
    # there is no interval to draw (a spec resampling the lengths has them)
    reps = int(ds.sizes.get("rep", 1))
    rate = (float(ds.attrs["trace_requests"]) - 1) / float(ds.attrs["trace_span_s"])   # the trace's mean rate
    for name, c, m in zip(names, COLORS, MARKERS):
        thr = line(ds, "sim_throughput_mean", "scale", policy=name)
        with np.errstate(invalid="ignore"):
            # (a replay ends, and a backlog drains after it: a throughput short of the rate is an overload too)
            unst = line(ds, "unstable", "scale", policy=name) | (np.isfinite(thr) & (thr < OVERLOAD * rate * scales))
        thr_lo, thr_hi = thr, thr
        if reps > 1 and "sim_throughput_ci_low" in ds:
            thr_lo = line(ds, "sim_throughput_ci_low", "scale", policy=name)
            thr_hi = line(ds, "sim_throughput_ci_high", "scale", policy=name)
        ax1.plot(scales, thr, color=c, lw=0.8, zorder=2)
        sim_points(ax1, scales, thr, thr_lo, thr_hi, unst, c, m)
        p95, half = replication_ci(per_rep(ds, "sim_latency_p95", "scale", policy=name))
        half = np.nan_to_num(half) if reps > 1 else np.zeros_like(p95)
        ax2.plot(scales[~unst], p95[~unst], color=c, lw=0.8, zorder=2)
        sim_points(ax2, scales, p95, p95 - half, p95 + half, unst, c, m)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(scales, [f"{s:g}x" for s in scales])
        ax.set_xlabel("replay speed-up (the trace's arrival times divided by it)")
    ax1.set_ylabel(f"throughput ({unit(ds, 'sim_throughput_mean')})")
    ax2.set_yscale("log")
    ax2.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax2.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax2.yaxis.set_minor_formatter(NullFormatter())
    ax2.set_ylabel(f"95th percentile latency ({unit(ds, 'sim_latency_p95')})")
    ax1.plot(scales, rate * scales, color="0.4", ls=":", lw=1.0, zorder=1)
    series = series_handles([_replay_label(settings, ds.attrs) for _, settings in found], COLORS[: len(names)],
                            MARKERS[: len(names)])
    sim = ("simulation: one replay in the trace's order (deterministic: no interval)" if reps == 1
           else f"simulation: mean $\\pm$ 95% CI over {reps} replays")
    styles = style_handles(("sim", sim), ("hollow", f"unstable: the backlog grows, or throughput below {OVERLOAD:g} "
                                                    "$\\times$ the replay's rate"),
                           (":", "the replay's arrival rate"))
    ax1.legend(handles=series, loc="upper left")
    fig.legend(handles=styles, loc="outside lower center", ncol=3)
    a = ds.attrs
    fig.suptitle(f"The Azure conversation trace replayed through every policy ({a['trace_file']}, "
                 f"{int(a['trace_requests']):,} requests, {int(a['servers'])} servers, "
                 f"{1e3 * float(a['per_token']):g} ms per output token)", fontsize=10)
    return fig
