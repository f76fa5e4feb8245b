"""The dynamic-batching experiments (i)-(v), one figure each.

``mb_only`` (i), ``dynamic_vs_static`` (ii), ``controller_step`` (iii),
``mb_dynamic`` (iv) and ``max_wait`` (v), named as in
:data:`mbbatch.figures.FIGURES` and in the documentation's gallery
(``docs/gallery/experiments.md``).
Each takes ``{dataset name: Dataset}`` and returns a
:class:`matplotlib.figure.Figure`.  The token-level policies (static,
dynamic, multi-bin dynamic) have no closed forms: thin lines join their
simulated points, and a cell is hollow when it is unstable or overloaded
(:func:`~mbbatch.figures.analysis.overloaded`), since their ``unstable``
flag misses overloads whose queue drains after the arrivals end.
"""

from __future__ import annotations

import numpy as np
import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedFormatter, FixedLocator, FormatStrFormatter, NullFormatter, NullLocator

from .analysis import OVERLOAD, over_reps, overloaded, phases, replication_ci, settling_times
from .data import (closed_form_curve, constant, controller_series, line, per_rep, setting, theorem_4_2_vs_k,
                   token_setting, unit, variants)
from .panels import latency_panel, throughput_panel
from .style import (COLORS, MARKERS, log2_k_axis, log_ylim, new_figure, series_handles, sim_points,
                    style_handles, two_legends)

__all__ = ["mb_only", "mb_only_load", "dynamic_vs_static", "controller_step", "mb_dynamic", "max_wait"]

_UNSTABLE_TOKEN_LABEL = ("hollow: unstable cell, or overloaded "
                         f"(throughput < {OVERLOAD:g} $\\lambda$)")

# one colour and marker per policy, the same in every experiment figure
_POLICY_STYLE = {
    "dynamic": (COLORS[0], "o"),
    "static8": (COLORS[1], "s"),
    "static32": (COLORS[2], "^"),
    "static128": (COLORS[3], "D"),
    "mb_dynamic": (COLORS[4], "P"),
}


def _stored_mean_ci(ds, var, **sel):
    """The stored mean of ``var`` along ``rate`` and its t-interval over the reps.

    A sweep stores only the mean of these variables, so the interval's
    half-width is computed here from the per-rep values.
    """
    _, half = replication_ci(per_rep(ds, var, "rate", **sel),
                             level=float(ds.attrs.get("confidence_level", 0.95)))
    mean = line(ds, f"{var}_mean", "rate", **sel)
    return mean, mean - half, mean + half


def _token_series(ds, **sel) -> dict:
    """Throughput, p95 latency and SLA violation share along ``rate`` for one policy."""
    rates = np.asarray(ds["rate"].values, dtype=float)
    unst = line(ds, "unstable", "rate", **sel) | overloaded(ds, **sel)
    return {
        "rate": rates,
        "throughput": (line(ds, "sim_throughput_mean", "rate", **sel),
                       line(ds, "sim_throughput_ci_low", "rate", **sel),
                       line(ds, "sim_throughput_ci_high", "rate", **sel)),
        "p95": _stored_mean_ci(ds, "sim_latency_p95", **sel),
        "sla": tuple(100.0 * v for v in _stored_mean_ci(ds, "sim_sla_violation_tokens", **sel)),
        "unstable": unst,
    }


def _joined(ax, x, mean, lo, hi, unstable, color, marker):
    """Simulated points joined by a thin line (there is no closed form to draw)."""
    x = np.asarray(x, dtype=float)
    mean = np.asarray(mean, dtype=float)
    ok = np.isfinite(x) & np.isfinite(mean)
    ax.plot(x[ok], mean[ok], color=color, lw=0.8, alpha=0.55, zorder=2)
    sim_points(ax, x, mean, lo, hi, unstable, color, marker)


def _rate_series(ax_t, others, series, hi_r) -> list:
    """Throughput against the arrival rate on ``ax_t`` beside the diagonal
    (what a stable system carries, up to ``hi_r``), and on each axes of
    ``others`` (``(axes, variable)`` pairs of the series) its variable, each
    series joined in its policy's style.  ``series``: (label, style key,
    :func:`_token_series` dict).  Returns the p95 latencies drawn."""
    ax_t.plot([0, hi_r * 1.05], [0, hi_r * 1.05], color="0.4", ls=":", lw=1.0, zorder=1)
    p95_vals = []
    for _, key, s in series:
        c, m = _POLICY_STYLE[key]
        _joined(ax_t, s["rate"], *s["throughput"], s["unstable"], c, m)
        for ax, var in others:
            _joined(ax, s["rate"], *s[var], s["unstable"], c, m)
        p95_vals.append(np.concatenate(s["p95"]))
    return p95_vals


def _token_panels(fig, axes, series, title):
    """Experiments (ii) and (iv): throughput, p95 latency, SLA violations vs rate.

    ``series`` is a list of (label, style key, :func:`_token_series` dict).
    """
    ax_t, ax_p, ax_s = axes
    rates = np.concatenate([s["rate"] for _, _, s in series])
    hi_r = float(np.nanmax(rates))
    p95_vals = _rate_series(ax_t, ((ax_p, "p95"), (ax_s, "sla")), series, hi_r)
    unit_r = "requests/s"
    for ax in axes:
        ax.set_xlabel(f"arrival rate $\\lambda$ ({unit_r})")
        ax.set_xlim(0, hi_r * 1.05)
    ax_t.set_ylim(0, hi_r * 1.05)
    ax_t.set_ylabel(f"throughput ({unit_r})")
    ax_t.set_title("(a) throughput")
    ax_p.set_yscale("log")
    log_ylim(ax_p, p95_vals, [])
    ax_p.set_ylabel("p95 latency (s)")
    ax_p.set_title("(b) 95th percentile latency")
    ax_s.set_ylim(-3, 103)
    ax_s.set_ylabel("SLA-violating output tokens (%)")
    ax_s.set_title("(c) tokens in batches with $\\tau > D_{SLA} + \\varepsilon_D$")
    handles = series_handles([label for label, _, _ in series],
                              [_POLICY_STYLE[k][0] for _, k, _ in series],
                              [_POLICY_STYLE[k][1] for _, k, _ in series])
    handles += style_handles(("sim", "simulation: mean $\\pm$ 95% CI (thin lines join points)"),
                              ("hollow", _UNSTABLE_TOKEN_LABEL),
                              (":", "throughput = $\\lambda$ (panel a)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4)
    fig.suptitle(title, fontsize=9.5)


def _static_series(ds, sizes):
    """The static-batching variants of batch size in ``sizes``, in that order."""
    by_size = {int(v["batch_size"]): name for name, v in variants(ds, "static")}
    return [(f"static batching, B = {B}", f"static{B}", _token_series(ds, policy=by_size[B]))
            for B in sizes if B in by_size]


def _variant(ds, kind):
    """The name and settings of the store's one variant of ``kind``."""
    (found,) = variants(ds, kind)
    return found


def mb_only(data) -> Figure:
    """Experiment (i): saturated multi-bin throughput vs number of bins, with Theorem 4.2."""
    ds = data["mb_only"]
    B, l_min, l_max, servers, ks, kmax, kd, thr = theorem_4_2_vs_k(ds)
    cmax = constant(ds, "capacity")
    stored = line(ds, "theory_service_rate", "bins")
    mean = line(ds, "sim_throughput_mean", "bins")
    fig, (ax,) = new_figure(7.2, 4.6)
    c = COLORS[0]
    ax.plot(kd, thr, color=c, lw=1.1, marker=".", ms=3, zorder=2)
    ax.plot(ks, stored, ls="none", marker="_", ms=14, mew=1.4, color="black", zorder=2.5)
    ax.axhline(cmax, color="black", ls="--", lw=1.1, zorder=1)
    ax.text(1.05, cmax * 1.005, f"$c_{{max}}$ = B / E[$l$] = {cmax:.3f} (k $\\to \\infty$)",
            va="bottom", fontsize=8)
    sim_points(ax, ks, mean, line(ds, "sim_throughput_ci_low", "bins"),
         line(ds, "sim_throughput_ci_high", "bins"), line(ds, "unstable", "bins"), c, "o")
    for k, m, th in zip(ks, mean, stored):
        if np.isfinite(m):
            ax.annotate(f"{m:.3f}\n({100 * m / cmax:.0f}% of $c_{{max}}$,\n"
                        f"{100 * (m / th - 1):+.2f}% vs Thm 4.2)",
                        xy=(k, m), xytext=(9, -5), textcoords="offset points", ha="left",
                        va="top", fontsize=7, color="0.25")
    log2_k_axis(ax, kmax)
    ax.set_xlim(0.8, kmax * 1.15)
    bottom = min(float(thr[0]), np.nanmin(mean, initial=np.inf))
    ax.set_ylim(bottom * 0.75, cmax * 1.07)
    ax.set_xlabel("number of bins K")
    ax.set_ylabel(f"saturated throughput ({unit(ds, 'sim_throughput_mean')})")
    ax.legend(handles=style_handles(
        ("sim", "simulation (saturated): mean $\\pm$ 95% CI"),
        ("-", "Theorem 4.2: B / E[$t_{service}$] at every integer k"),
        ("--", "$c_{max}$ = B / E[$l$] (Remark 4.2)"),
    ) + [Line2D([], [], ls="none", marker="_", ms=12, mew=1.6, color="black",
                label="stored theory_service_rate at the simulated K")], loc="lower right")
    ax.set_title("Experiment (i) multi_bin_only: saturated throughput vs number of bins K\n"
                 + setting(ds))
    return fig


def dynamic_vs_static(data) -> Figure:
    """Experiment (ii): dynamic batching against static batching B = 8, 32, 128 vs load."""
    ds = data["token_policies"]
    dyn, _ = _variant(ds, "dynamic")
    series = [("dynamic batching ($b_{target}$ = min($b_{mem}$, $b_{SLA}$))", "dynamic",
               _token_series(ds, policy=dyn))]
    series += _static_series(ds, sorted(int(v["batch_size"]) for _, v in variants(ds, "static")))
    fig, axes = new_figure(14.5, 5.0, ncols=3)
    _token_panels(fig, axes, series,
                  "Experiment (ii) dynamic_only: dynamic vs static batching across loads\n"
                  + token_setting(ds))
    return fig


def mb_dynamic(data) -> Figure:
    """Experiment (iv): multi-bin dynamic batching against dynamic and static batching."""
    ds = data["token_policies"]
    mbd, settings = _variant(ds, "multibin_dynamic")
    dyn, _ = _variant(ds, "dynamic")
    k = int(settings["bins"])
    series = [(f"multi-bin dynamic, K = {k} bins", "mb_dynamic", _token_series(ds, policy=mbd)),
              ("dynamic batching (one queue)", "dynamic", _token_series(ds, policy=dyn))]
    series += _static_series(ds, [32, 8])
    fig, axes = new_figure(14.5, 5.0, ncols=3)
    _token_panels(fig, axes, series,
                  f"Experiment (iv) multi_bin_dynamic: K = {k} bins by predicted output length, "
                  "dynamic batching in each, across loads\n" + token_setting(ds))
    return fig


def controller_step(data) -> Figure:
    """Experiment (iii): b_target and tau_avg through a load step, per controller variant."""
    ds = data["controller_step"]
    a = ds.attrs
    t, steps = phases(ds)
    t_up, t_down = steps[0]
    d_sla, eps = float(a["d_sla"]), float(a.get("eps_d", 0.0))
    r_lo, r_hi = float(a["rate"]), float(a["rate_high"])
    ctls = [str(c) for c in ds["controller"].values]
    settle = settling_times(ds)
    nice = {"spec": "Pang et al. (additive)", "multiplicative": "multiplicative"}

    fig = Figure(figsize=(9.6, 7.4), dpi=100, layout="constrained")
    ax_b, ax_t = fig.subplots(2, 1, sharex=True)
    for ax in (ax_b, ax_t):
        ax.axvspan(t_up, t_down, color="0.5", alpha=0.12, lw=0, zorder=0)
    series = []
    for i, ctl in enumerate(ctls):
        c = COLORS[i % len(COLORS)]
        bt = controller_series(ds, "ts_b_target", ctl)
        ax_b.fill_between(t, over_reps(np.min, bt), over_reps(np.max, bt), step="post",
                          color=c, alpha=0.18, lw=0, zorder=1)
        ax_b.plot(t, over_reps(np.mean, bt), color=c, lw=1.4, drawstyle="steps-post", zorder=3)
        ax_b.plot(t, over_reps(np.mean, controller_series(ds, "ts_b_high", ctl)), color=c, lw=0.9, ls="--",
                  drawstyle="steps-post", zorder=2)
        ax_b.plot(t, over_reps(np.mean, controller_series(ds, "ts_b_low", ctl)), color=c, lw=0.9, ls=":",
                  drawstyle="steps-post", zorder=2)
        tau = 1e3 * controller_series(ds, "ts_tau_avg", ctl)
        ax_t.fill_between(t, over_reps(np.min, tau), over_reps(np.max, tau), step="post",
                          color=c, alpha=0.18, lw=0, zorder=1)
        ax_t.plot(t, over_reps(np.mean, tau), color=c, lw=1.3, drawstyle="steps-post", zorder=3)
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
        first = [controller_series(ds, "ts_b_target", c) for c in ctls]
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
    ax_t.set_xlabel(f"time ({unit(ds, 'time')})")
    ax_t.set_xlim(float(t[0]), float(t[-1]))
    ax_t.set_title("(b) $\\tau_{avg}$: mean over reps (band: min to max over reps)")
    fig.suptitle(f"Experiment (iii) controller_step: dynamic batching through a load step "
                 f"$\\lambda$ = {r_lo:g} $\\to$ {r_hi:g} $\\to$ {r_lo:g} requests/s "
                 f"at t = {t_up:g} s and {t_down:g} s\n" + token_setting(ds, wrap=True),
                 fontsize=9.5)
    return fig


def _max_wait_label(w) -> str:
    w = float(w)
    return "max_wait = $\\infty$ (classic multi-bin)" if np.isinf(w) else f"max_wait = {w:g} s"


#: max_wait's colours for the classic policy (max_wait = inf) and for the
#: closed forms drawn for it (Lemma 5.1, Theorem 4.2): apart from the
#: viridis of the finite timeouts, and from each other
MAX_WAIT_INF_COLOR = COLORS[3]
MAX_WAIT_THEORY_COLOR = "black"


def _max_wait_colors(waits):
    cmap = matplotlib.colormaps["viridis"]
    finite = [w for w in waits if np.isfinite(w)]
    pos = {w: (0.0 if len(finite) < 2 else 0.9 * i / (len(finite) - 1)) for i, w in enumerate(finite)}
    return [cmap(pos[w]) if np.isfinite(w) else MAX_WAIT_INF_COLOR for w in waits]


def _sim_xy(ax, x, xlo, xhi, y, ylo, yhi, unstable, color, marker, clip_top):
    """Markers with 95% CIs in both x and y, joined by a thin line; unstable
    cells hollow; values above ``clip_top`` hollow on the top edge, without
    bars or line."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    clipped = ok & (y > clip_top)
    ok &= ~clipped
    xerr = np.vstack([np.nan_to_num(np.clip(x - xlo, 0, None)), np.nan_to_num(np.clip(xhi - x, 0, None))])
    yerr = np.vstack([np.nan_to_num(np.clip(y - ylo, 0, None)), np.nan_to_num(np.clip(yhi - y, 0, None))])
    if ok.sum() > 1:
        ax.plot(x[ok], y[ok], color=color, lw=0.8, alpha=0.55, zorder=2)
    unstable = np.asarray(unstable, dtype=bool)
    for sel, face in ((ok & ~unstable, color), (ok & unstable, "none")):
        if sel.any():
            ax.errorbar(x[sel], y[sel], xerr=xerr[:, sel], yerr=yerr[:, sel], fmt=marker, ls="none",
                        color=color, mfc=face, mec=color, ecolor=color, elinewidth=0.9, zorder=3)
    if clipped.any():
        ax.plot(x[clipped], np.full(clipped.sum(), clip_top), ls="none", marker=marker, color=color, mfc="none",
                mec=color, clip_on=False, zorder=3)


def max_wait(data) -> Figure:
    """Experiment (v): latency-throughput trade-off of releasing partial batches after max_wait."""
    ds = data["max_wait"]
    waits = [float(w) for w in ds["max_wait"].values]
    rates = np.asarray(ds["rate"].values, dtype=float)
    colors = _max_wait_colors(waits)
    markers = [MARKERS[i % len(MARKERS)] for i in range(len(waits))]
    B, k = int(ds.attrs["batch_size"]), int(ds.attrs["bins"])
    fig, (ax_a, ax_b) = new_figure(13.0, 6.6, ncols=2)

    lat_all, cells = [], []
    for i, (w, c, m) in enumerate(zip(waits, colors, markers)):
        sel = dict(max_wait=ds["max_wait"].values[i])
        unst = line(ds, "unstable", "rate", **sel) | overloaded(ds, **sel)
        lat = [line(ds, f"sim_mean_latency_{s}", "rate", **sel) for s in ("mean", "ci_low", "ci_high")]
        thr = [line(ds, f"sim_throughput_{s}", "rate", **sel) for s in ("mean", "ci_low", "ci_high")]
        cells.append((thr, lat, unst, c, m))
        lat_all.append(np.concatenate(lat))
    # Lemma 5.1 and Theorem 4.2 for the classic policy (max_wait = inf), where stored
    inf_idx = [i for i, w in enumerate(waits) if np.isinf(w)]
    closed, lemma, level = [], None, np.nan
    if inf_idx:
        sel = dict(max_wait=ds["max_wait"].values[inf_idx[0]])
        ets = constant(ds, "theory_mean_batch_service", **sel)
        if np.isfinite(ets):
            lemma = closed_form_curve(ds, "theory_latency", lambda r: ets + (B - 1) * k / (2 * r), **sel)
            closed.append(lemma[1])
        level = constant(ds, "theory_service_rate", **sel)
    ax_a.set_xscale("log")
    ax_a.xaxis.set_major_locator(FixedLocator([0.1, 0.2, 0.5, 1, 2, 5, 10]))
    ax_a.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax_a.xaxis.set_minor_formatter(NullFormatter())
    ax_a.set_yscale("log")
    # the scale of the stable cells (unstable ones grow with n): those above it on the top edge
    stable = [np.concatenate([v[~unst] for v in lat]) for _, lat, unst, _, _ in cells]
    top_a = log_ylim(ax_a, stable, closed)
    for thr, lat, unst, c, m in cells:
        _sim_xy(ax_a, *thr, *lat, unst, c, m, clip_top=top_a / 1.15)
    if lemma is not None:
        ax_a.plot(*lemma, color=MAX_WAIT_THEORY_COLOR, lw=1.6, ls="-", zorder=1)
        at = int(np.argmin(np.abs(lemma[0] - 8.5)))
        ax_a.annotate("Lemma 5.1, max_wait = $\\infty$", (lemma[0][at], lemma[1][at]), xytext=(-2, -6),
                      textcoords="offset points", ha="right", va="top", fontsize=7.5, color=MAX_WAIT_THEORY_COLOR)
    if np.isfinite(level):
        ax_a.axvline(level, color=MAX_WAIT_THEORY_COLOR, ls="--", lw=1.0, zorder=1)
        ax_a.annotate(f"Theorem 4.2: {level:.2f}", (level, 0.66), xycoords=("data", "axes fraction"),
                      xytext=(-3, 0), textcoords="offset points", rotation=90, ha="right", va="bottom",
                      fontsize=7.5, color=MAX_WAIT_THEORY_COLOR)
    off = [w for w, (_, lat, unst, _, _) in zip(waits, cells) if np.all(lat[0][np.isfinite(lat[0])] > top_a / 1.15)]
    if off:
        hidden = np.concatenate([cells[waits.index(w)][1][0] for w in off])
        ax_a.text(0.02, 0.93, f"on the top edge, off scale: max_wait {', '.join(f'{w:g}' for w in off)} s, "
                  f"unstable at every rate ({np.nanmin(hidden):,.0f} to {np.nanmax(hidden):,.0f} s; see (b))",
                  transform=ax_a.transAxes, ha="left", va="top", fontsize=7, color="0.25")
    ax_a.set_xlabel(f"throughput ({unit(ds, 'sim_throughput_mean')}; "
                    f"one point per arrival rate {', '.join(f'{r:g}' for r in rates)})")
    ax_a.set_ylabel(f"mean latency ({unit(ds, 'sim_mean_latency_mean')})")
    ax_a.set_title("(a) mean latency vs throughput, one curve per max_wait over the arrival rates")
    series = series_handles([_max_wait_label(w) for w in waits], colors, markers)
    ax_a.legend(handles=series + style_handles(
        ("sim", "simulation: mean $\\pm$ 95% CI (both axes)"),
        ("hollow", _UNSTABLE_TOKEN_LABEL + "; on the top edge if off scale"),
    ) + [Line2D([], [], color=MAX_WAIT_THEORY_COLOR, lw=1.6,
                label="Lemma 5.1 for max_wait = $\\infty$ ($\\infty$ servers; with one, a lower bound)"),
         Line2D([], [], color=MAX_WAIT_THEORY_COLOR, ls="--", lw=1.0,
                label=f"Theorem 4.2 saturated throughput, max_wait = $\\infty$, k = {k}")],
        loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7)

    # (b) latency vs max_wait, one series per rate; infinity at a place of its own
    finite = [w for w in waits if np.isfinite(w)]
    inf_x = (max(finite) * 2.5) if finite else 1.0
    xw = np.array([inf_x if np.isinf(w) else w for w in waits])
    cmap = matplotlib.colormaps["plasma"]
    rcolors = [cmap(0.85 * i / max(len(rates) - 1, 1)) for i in range(len(rates))]
    for j, (r, c) in enumerate(zip(rates, rcolors)):
        m = MARKERS[j % len(MARKERS)]
        mean = line(ds, "sim_mean_latency_mean", "max_wait", rate=r)
        lo = line(ds, "sim_mean_latency_ci_low", "max_wait", rate=r)
        hi = line(ds, "sim_mean_latency_ci_high", "max_wait", rate=r)
        thr = line(ds, "sim_throughput_mean", "max_wait", rate=r)
        with np.errstate(invalid="ignore"):
            unst = line(ds, "unstable", "max_wait", rate=r) | (np.isfinite(thr) & (thr < OVERLOAD * r))
        fin = np.isfinite(np.array(waits))
        ax_b.plot(xw[fin], mean[fin], color=c, lw=0.8, alpha=0.55, zorder=2)
        if (~fin).any() and fin.any():  # dotted across the gap to "no timeout"
            last = int(np.flatnonzero(fin)[-1])
            ax_b.plot([xw[last], inf_x], [mean[last], float(mean[~fin][0])], color=c, lw=0.8,
                      ls=":", alpha=0.55, zorder=2)
        sim_points(ax_b, xw, mean, lo, hi, unst, c, m)
    ax_b.set_xscale("log")
    ticks = finite + ([inf_x] if len(finite) < len(waits) else [])
    ax_b.xaxis.set_major_locator(FixedLocator(ticks))
    ax_b.xaxis.set_major_formatter(FixedFormatter(
        [f"{w:g}" for w in finite] + (["$\\infty$"] if len(ticks) > len(finite) else [])))
    ax_b.xaxis.set_minor_locator(NullLocator())
    if finite:
        ax_b.set_xlim(min(finite) / 1.3, inf_x * 1.3)
    ax_b.set_yscale("log")
    log_ylim(ax_b, lat_all, [])
    ax_b.set_xlabel(f"max_wait ({unit(ds, 'max_wait')}; $\\infty$: no timeout)")
    ax_b.set_ylabel(f"mean latency ({unit(ds, 'sim_mean_latency_mean')})")
    ax_b.set_title("(b) mean latency vs max_wait, one curve per arrival rate")
    ax_b.legend(handles=series_handles([f"$\\lambda$ = {r:g} {unit(ds, 'rate')}"
                                         for r in rates], rcolors,
                                        [MARKERS[j % len(MARKERS)] for j in range(len(rates))]),
                loc="lower left", fontsize=7)
    fig.suptitle("Experiment (v) max_wait: partial multi-bin batches leave once their oldest "
                 f"request waited max_wait, k = {k} bins\n" + setting(ds), fontsize=9.5)
    return fig


def mb_only_load(data) -> Figure:
    """Experiment (i) as Pang et al. (2025, arXiv:2503.05248) word it: Poisson arrivals,
    K = 1, 2, 4, 8, fixed B; throughput (with min(lambda, Theorem 4.2)) and
    mean latency (with Lemma 5.1, a lower bound for one server) vs rate."""
    ds = data["mb_only_load"]
    fig, (ax1, ax2) = new_figure(11.0, 4.6, ncols=2)
    series = throughput_panel(ax1, ds, bound=False)
    ax1.set_title("throughput")
    latency_panel(ax2, ds, label=lambda v: f"K = {int(v)}")
    ax2.set_title("mean latency")
    styles = style_handles(("sim", "simulation: mean $\\pm$ 95% CI"), ("hollow", "hollow: unstable cell"),
                           ("-", "left: min($\\lambda$, Theorem 4.2); right: Lemma 5.1 (lower bound)"),
                           ("--", "Theorem 4.2: saturated B / E[$t_{service}$]"))
    two_legends(ax1, series, styles, loc1="upper left", loc2="lower right")
    fig.suptitle("Experiment (i), multi_bin_only under Poisson load\n" + setting(ds), fontsize=10)
    return fig

