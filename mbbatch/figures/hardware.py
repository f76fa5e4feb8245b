"""Measured hardware: the service models fitted to real accelerators' batches.

- ``hardware_fit``: measured against fitted batch times for four profiles (two
  GPUs, two model sizes), and the held-out errors of each model family over
  every shipped profile.  It reads no sweep: its data are the measurements
  shipped with mbbatch (:mod:`mbbatch.profiles`); it fits models, it does not
  simulate.
- ``hardware_moe``: Mixtral-8x7B (a mixture of experts) fitted with and
  without the expert term; from the same measurements.
- ``hardware_policies``, ``hardware_trace``: the dynamic-batching
  experiments on two measured GPUs.
- ``hardware_multibin``: multi-bin batching's throughput against its bins on
  two measured GPUs, simulated beside eq. (2) under the profile's model.
"""

from __future__ import annotations

import functools

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .. import profiles
from ..service_models import CalibratedModel, DecodeModel, IterationModel, LinearModel
from .data import line, sim_series, variants
from .style import COLORS, MARKERS, log2_k_axis, sim_points, style_handles

__all__ = ["hardware_fit", "hardware_moe", "hardware_policies", "hardware_trace", "hardware_multibin"]

#: the four profiles drawn: two GPUs (H100, A100), two model sizes (8B, 70B)
FIT_PROFILES = ("H100/vLLM/Meta-Llama-3-8B/tp1", "A100/vLLM/Meta-Llama-3-8B/tp1",
                "H100/vLLM/Meta-Llama-3-70B/tp4", "A100/vLLM/Llama-2-70b-hf/tp4")
#: the model families compared, each fitted as its class's fit fits it by default
FAMILIES = (("IterationModel (relative)", IterationModel, "relative"),
            ("DecodeModel", DecodeModel, "absolute"),
            ("DecodeModel (relative)", DecodeModel, "relative"),
            ("LinearModel", LinearModel, "absolute"),
            ("CalibratedModel", CalibratedModel, "absolute"))


def _rows(name: str) -> dict:
    t = profiles.measurements(name)
    keep = ~t.excluded
    return {k: t[k][keep] for k in ("size", "prompt", "output", "service")}


@functools.cache
def _holdout_errors() -> dict:
    """Each family's held-out (leave-one-out) median relative error, per
    shipped profile: ``{family: array over profiles.names()}``."""
    out = {}
    for label, cls, weights in FAMILIES:
        errs = []
        for name in profiles.names():
            errs.append(profiles.fit(name).holdout_error if cls is IterationModel
                        else cls.fit(_rows(name), weights=weights).holdout_error)
        out[label] = np.array(errs)
    return out


def hardware_fit(data) -> Figure:
    """Measured against fitted batch times (four profiles), and the held-out
    errors of each service model family across the shipped profiles."""
    fig = Figure(figsize=(14.5, 7.6), dpi=100, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 0.9])
    axes = top.subplots(1, 4)
    for ax, name in zip(axes, FIT_PROFILES):
        t = profiles.measurements(name)
        res = profiles.fit(name)
        model = res.model
        dec = DecodeModel.fit(_rows(name))
        sizes = sorted(set(t.size.tolist()))
        for i, b in enumerate(sizes):
            at = (t.size == b) & ~t.excluded
            ax.scatter(t.service[at], model.service_time(size=t.size[at], prompt=t.prompt[at], output=t.output[at]),
                       s=22, color=COLORS[i % len(COLORS)], marker=MARKERS[0], label=f"b = {b}", zorder=3)
            if dec.model is not None:
                ax.scatter(t.service[at], dec.model.service_time(size=t.size[at], prompt=t.prompt[at],
                                                                 output=t.output[at]),
                           s=14, facecolors="none", edgecolors=COLORS[i % len(COLORS)], marker=MARKERS[1],
                           lw=0.8, zorder=2)
        lo, hi = float(t.service[~t.excluded].min()) / 1.5, float(t.service[~t.excluded].max()) * 1.5
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8, ls="--", zorder=1)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured batch time (s)")
        ax.set_title(f"{name}\nIterationModel: held out {res.holdout_error:.1%} (R$^2$ {res.r2:.3f})\n"
                     f"DecodeModel (hollow): held out {dec.holdout_error:.1%}", fontsize=8.5)
    axes[0].set_ylabel("fitted batch time (s)")
    axes[0].legend(fontsize=7.5, loc="upper left", title="filled: IterationModel", title_fontsize=7.5)
    top.suptitle("LLM-Inference-Bench (Chitty-Venkata et al., 2024): batches of b requests of L prompt tokens "
                 "generating L tokens, L = 128-2,048, run to completion", fontsize=10)

    ax = bottom.subplots(1, 1)
    errs = _holdout_errors()
    labels = list(errs)
    ax.boxplot([100 * errs[k][np.isfinite(errs[k])] for k in labels], orientation="horizontal", whis=(5, 95),
               showfliers=False, widths=0.55)
    for i, k in enumerate(labels):
        e = 100 * errs[k][np.isfinite(errs[k])]
        ax.text(float(np.percentile(e, 95)) * 1.12, i + 1, f"median {np.median(e):.1f} %", va="center",
                fontsize=8.5)
    ax.set_yticks(range(1, len(labels) + 1), labels)
    ax.set_xscale("log")
    ax.set_xlabel("held-out relative error of a profile (median over its rows, leave-one-out), % "
                  "(boxes: quartiles; whiskers: 5th-95th percentile over the profiles)")
    ax.set_title(f"Each model family fitted to each of the {len(profiles.names())} profiles", fontsize=10)
    return fig


#: the mixture-of-experts profiles drawn: Mixtral-8x7B on vLLM, two GPUs
MOE_PROFILES = ("A100/vLLM/Mixtral-8x7B-v0.1/tp4", "MI300X/vLLM/Mixtral-8x7B-v0.1/tp1")


@functools.cache
def _dense_fit(name: str):
    """Profile ``name``'s rows fitted as a dense model (no expert term)."""
    return IterationModel.fit(_rows(name), weights="relative")


def hardware_moe(data) -> Figure:
    """A mixture of experts on measured hardware: Mixtral-8x7B's batch times
    fitted with and without the expert term (two profiles), and every
    Mixtral profile's held-out error both ways."""
    fig = Figure(figsize=(14.5, 4.8), dpi=100, layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[1.0, 1.0, 1.25])
    for ax, name in zip(axes, MOE_PROFILES):
        t = profiles.measurements(name)
        res, dense = profiles.fit(name), _dense_fit(name)
        for i, b in enumerate(sorted(set(t.size.tolist()))):
            at = (t.size == b) & ~t.excluded
            kw = dict(size=t.size[at], prompt=t.prompt[at], output=t.output[at])
            ax.scatter(t.service[at], res.model.service_time(**kw), s=22, color=COLORS[i % len(COLORS)],
                       marker=MARKERS[0], label=f"b = {b}", zorder=3)
            ax.scatter(t.service[at], dense.model.service_time(**kw), s=14, facecolors="none",
                       edgecolors=COLORS[i % len(COLORS)], marker=MARKERS[1], lw=0.8, zorder=2)
        lo, hi = float(t.service[~t.excluded].min()) / 1.5, float(t.service[~t.excluded].max()) * 1.5
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8, ls="--", zorder=1)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured batch time (s)")
        ax.set_title(f"{name}\nwith the expert term: held out {res.holdout_error:.1%} (per expert "
                     f"{1e3 * res.params['per_expert']:.2f} ms)\ndense (hollow): held out {dense.holdout_error:.1%}",
                     fontsize=8.5)
    axes[0].set_ylabel("fitted batch time (s)")
    for ax in axes[:2]:
        ax.legend(fontsize=7.5, loc="upper left", title="filled: with the expert term", title_fontsize=7.5)

    ax = axes[2]
    # (a profile's name holds its model without the organisation: no fit needed to pick them)
    mixtures = {m.split("/")[-1] for m in profiles.MIXTURES}
    names = [n for n in profiles.names() if n.split("/")[2] in mixtures]
    y = np.arange(len(names))
    dense = np.array([100 * _dense_fit(n).holdout_error for n in names])
    moe = np.array([100 * profiles.fit(n).holdout_error for n in names])
    ax.hlines(y, np.minimum(dense, moe), np.maximum(dense, moe), color="0.75", lw=1.5, zorder=1)
    ax.scatter(dense, y, s=22, facecolors="none", edgecolors=COLORS[0], label="dense", zorder=2)
    ax.scatter(moe, y, s=22, color=COLORS[1], label="with the expert term", zorder=3)
    ax.set_yticks(y, [n.replace("/Mixtral-8x7B-v0.1", "") for n in names], fontsize=7.5)
    ax.set_xscale("log")
    ax.set_xlabel("held-out relative error (median over the rows, leave-one-out), %")
    ax.set_title(f"Every Mixtral-8x7B profile ({len(names)}): engines that read the experts\na batch routes "
                 "to (vLLM) gain; those that read them all (llama.cpp)\nfit the term at 0", fontsize=8.5)
    ax.legend(fontsize=7.5, loc="lower right")
    fig.suptitle("A mixture of experts (Mixtral-8x7B: 8 experts, 2 a token): a decode iteration reads more "
                 "experts the more sequences it steps (IterationModel's per_expert)", fontsize=10)
    return fig



# --- the dynamic-batching experiments on measured hardware ---------------------------------

#: the policies compared, by their style in experiments' figures: (label, style key, variant prefix)
_POLICIES = (("static batching, B = 8", "static8", "static8"), ("static batching, B = 32", "static32", "static32"),
             ("dynamic batching", "dynamic", "dynamic"), ("multi-bin dynamic, K = 4", "mb_dynamic", "mb4"))
#: the profiles' variant suffixes
_GPUS = (("_h100", "H100/vLLM/Meta-Llama-3-8B/tp1"), ("_a100", "A100/vLLM/Meta-Llama-3-8B/tp1"))


def _carried(series: dict) -> float:
    """The largest arrival rate of the grid a policy carries: stable there and
    at every lower rate (neither a growing backlog nor a throughput below
    :data:`~mbbatch.figures.analysis.OVERLOAD` times the rate); 0 if none."""
    best = 0.0
    for r, bad in zip(series["rate"], series["unstable"]):
        if bad:
            break
        best = float(r)
    return best


def _columns(default, profiled, default_note: str) -> list:
    """(title, [(label, style key, series)]) of the default model's store and each profile's."""
    from .experiments import _token_series

    cols = [(f"the default DecodeModel, Pang et al.'s calibration ({default_note})",
             [(label, key, _token_series(default, policy=prefix)) for label, key, prefix in _POLICIES])]
    for suffix, name in _GPUS:
        d_sla = dict(variants(profiled))[f"dynamic{suffix}"]["d_sla"]
        cols.append((f"profile {name}\n(IterationModel fitted to measurements; D$_{{SLA}}$ = {1e3 * d_sla:.1f} ms)",
                     [(label, key, _token_series(profiled, policy=prefix + suffix))
                      for label, key, prefix in _POLICIES]))
    return cols


def _policy_grid(cols: list, title: str) -> Figure:
    from .experiments import _POLICY_STYLE, _rate_series
    from .style import log_ylim, series_handles

    fig = Figure(figsize=(14.5, 8.2), dpi=100, layout="constrained")
    axes = fig.subplots(2, len(cols), sharey="row")
    p95_vals = []
    hi_r = max(float(np.nanmax(s["rate"])) for _, series in cols for _, _, s in series)
    for j, (head, series) in enumerate(cols):
        ax_t, ax_p = axes[0, j], axes[1, j]
        p95_vals += _rate_series(ax_t, ((ax_p, "p95"),), series, hi_r)
        lines = [f"{label}: {_carried(s):g}" for label, _, s in series]
        ax_t.text(0.03, 0.97, "largest rate carried (requests/s):\n" + "\n".join(lines), transform=ax_t.transAxes,
                  va="top", ha="left", fontsize=7.5, color="0.2")
        ax_t.set_title(head, fontsize=9)
        for ax in (ax_t, ax_p):
            ax.set_xlim(0, hi_r * 1.05)
            ax.set_xlabel("arrival rate $\\lambda$ (requests/s)")
        ax_t.set_ylim(0, hi_r * 1.05)
        ax_p.set_yscale("log")
    log_ylim(axes[1, 0], p95_vals, [])
    axes[0, 0].set_ylabel("throughput (requests/s)")
    axes[1, 0].set_ylabel("p95 latency (s)")
    labels = [label for label, _, _ in cols[0][1]]
    keys = [key for _, key, _ in cols[0][1]]
    fig.legend(handles=series_handles(labels, [_POLICY_STYLE[k][0] for k in keys],
                                      [_POLICY_STYLE[k][1] for k in keys]),
               loc="outside lower center", ncols=len(labels), fontsize=8.5)
    fig.suptitle(title + "\nmarkers: mean over 3 replications with 95% t-intervals; hollow: no steady state "
                 "(backlog growing, or throughput below 0.95 x the rate)", fontsize=10)
    return fig


def hardware_policies(data) -> Figure:
    """Static, dynamic and multi-bin dynamic batching vs load under Pang et al.'s
    DecodeModel and under two measured GPUs (log-normal lengths)."""
    return _policy_grid(_columns(data["token_policies"], data["hardware_policies"], "token_policies"),
                        "The dynamic-batching experiments (ii) and (iv) on measured hardware: log-normal prompts "
                        "and outputs (medians 256 and 128 tokens)")


def hardware_trace(data) -> Figure:
    """The same on the Azure conversation trace's lengths."""
    return _policy_grid(_columns(data["hardware_trace_default"], data["hardware_trace"], "7.4 ms"),
                        "The dynamic-batching experiments on measured hardware: the Azure conversation trace's "
                        "prompt and output lengths (medians 1,020 and 129 tokens), Poisson arrivals")


#: the engines' two ways with a finished member: (store value, label)
_FINISHED = (("leave", "finished members leave (vLLM)"), ("stay", "finished members stay (padded)"))


def hardware_multibin(data) -> Figure:
    """Multi-bin batching, saturated, against its number of bins on two
    measured GPUs: simulated throughput (markers, 95% t-intervals over the
    replications) beside eq. (2) under the profile's model (lines,
    ``theory_service_rate``)."""
    ds = data["hardware_multibin"]
    profiles_ = [str(p) for p in ds["profile"].values]
    k = np.asarray(ds["bins"].values, dtype=float)
    fig = Figure(figsize=(11.5, 4.8), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(profiles_), sharey=True)
    tops = []
    for ax, name in zip(np.atleast_1d(axes), profiles_):
        notes = []
        for i, (finished, label) in enumerate(_FINISHED):
            c, m = COLORS[i], MARKERS[i]
            thm = line(ds, "theory_service_rate", "bins", profile=name, finished=finished)
            ax.plot(k, thm, color=c, lw=1.2, zorder=2)
            mean, lo, hi, unstable = sim_series(ds, "sim_throughput", "bins", profile=name, finished=finished)
            sim_points(ax, k, mean, lo, hi, unstable, c, m)
            notes.append(f"{finished}: {mean[0]:.2f} -> {mean[-1]:.2f} requests/s (x{mean[-1] / mean[0]:.2f})")
        cap = line(ds, "capacity", "bins", profile=name, finished="leave")
        ax.axhline(float(cap[0]), color="0.35", ls="--", lw=1.0, zorder=1)
        log2_k_axis(ax, int(k.max()))
        ax.set_xlabel("bins k (by output length)")
        ax.set_title(f"profile {name}", fontsize=9.5)
        ax.text(0.03, 0.97, f"k = {int(k[0])} -> {int(k[-1])}:\n" + "\n".join(notes), transform=ax.transAxes,
                va="top", ha="left", fontsize=8, color="0.2")
        tops.append(float(cap[0]))
    first = np.atleast_1d(axes)[0]
    first.set_ylim(0, 1.3 * max(tops))     # (room above the capacity for the notes)
    first.set_ylabel("throughput, saturated (requests/s)")
    handles = [Line2D([], [], color=COLORS[i], marker=MARKERS[i], label=label)
               for i, (_, label) in enumerate(_FINISHED)]
    handles += style_handles(("sim", "simulated (95% t-interval over replications)"),
                             ("-", "eq. (2) under the profile's IterationModel"),
                             ("--", "k -> inf: every batch of one length (capacity)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8.5)
    fig.suptitle("Multi-bin batching on measured hardware, saturated: batches of B = 32 timed by a measured "
                 "engine's iterations\nlog-normal prompts and outputs (medians 256 and 128 tokens)", fontsize=10)
    return fig
