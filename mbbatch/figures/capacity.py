"""The capacity-search experiments: the largest arrival rate a policy
sustains against the number of bins (``capacity_vs_k``), against a p95
latency target (``capacity_latency``) and against the length predictor's
error (``capacity_predictor``).

Each takes ``{dataset name: Dataset}`` and returns a
:class:`matplotlib.figure.Figure`.  A search's result is drawn as a marker
at the midpoint of its final bracket with the bracket as its bar (the
capacity's interval, see :mod:`mbbatch.capacity`); a search whose bracket
was narrowed by probes undecided at the replication cap is hollow.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .. import theory
from .data import line, setting, token_setting
from .panels import capacity_against_bound, capacity_search
from .style import COLORS, MARKERS, new_figure, series_handles, sim_points, style_handles, two_legends

__all__ = ["capacity_vs_k", "capacity_latency", "capacity_predictor"]


def _search_note(ds) -> str:
    a = ds.attrs
    return (f"searched to {100 * float(a['capacity_rel_tol']):g} %; each probe's verdict at "
            f"{100 * float(a['capacity_confidence']):g} %, at most {int(a['capacity_max_reps'])} replications")


def capacity_vs_k(data) -> Figure:
    """The stability capacity of the paper's model against k: searched
    (mb.find_capacity) beside Theorem 4.2's B / E[t_service] and c_max."""
    ds = data["capacity_k"]
    a = ds.attrs
    B, l_min, l_max = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    servers = float(a.get("servers", 1))
    ks = np.asarray(ds["bins"].values, dtype=int)
    fig, (ax,) = new_figure(7.2, 4.4)
    grid = np.arange(1, ks.max() + 1)
    thm = servers * B / np.array([theory.service_time(B, l_min, l_max, int(k)) for k in grid])
    ax.plot(grid, thm, color=COLORS[0], lw=1.2, zorder=2)
    c_max = float(line(ds, "capacity", "bins")[0])
    ax.axhline(c_max, color="0.35", ls="--", lw=1.0, zorder=1)
    cap, lo, hi, unresolved = capacity_search(ds, "bins")
    sim_points(ax, ks, cap, lo, hi, unresolved, COLORS[0], MARKERS[0])
    ax.set_xlabel("bins k")
    ax.set_ylabel("capacity: largest stable arrival rate (requests/s)")
    styles = style_handles(("sim", "find_capacity: mean and interval over its searches"),
                           ("hollow", "bracket narrowed by probes undecided at the cap"),
                           ("-", "Theorem 4.2: servers $\\times$ B / E[$t_{service}$]"),
                           ("--", "$c_{max}$ = servers $\\times$ B / E[service] (Remark 4.2)"))
    ax.legend(handles=styles, loc="lower right", fontsize=8)
    fig.suptitle("Stability capacity vs the number of bins: search against Theorem 4.2\n"
                 f"{setting(ds)}\n{_search_note(ds)}", fontsize=9)
    return fig


def _policy_label(settings: dict) -> str:
    kind = settings["kind"]
    if kind == "static":
        return f"static, B = {int(settings['batch_size'])}"
    if kind == "multibin_dynamic":
        return f"multi-bin dynamic, K = {int(settings['bins'])}"
    return "dynamic"


def capacity_latency(data) -> Figure:
    """The largest arrival rate each policy serves with its p95 latency
    within a target, against the target (stability required as well)."""
    ds = data["capacity_latency"]
    fig, _ = capacity_against_bound(ds, "objective_latency_p95", _policy_label, "p95 latency target (s)",
                                    "capacity within the target (requests/s)")
    fig.suptitle("Which policy serves most load within a p95 latency target?\n"
                 f"{token_setting(ds, wrap=True)}\n{_search_note(ds)}", fontsize=8)
    return fig


def capacity_predictor(data) -> Figure:
    """The stability capacity against the length predictor's log-normal
    error, for each k, with the oracle's Theorem 4.2 level dotted."""
    ds = data["capacity_predictor"]
    a = ds.attrs
    B, l_min, l_max = int(a["batch_size"]), float(a["l_min"]), float(a["l_max"])
    servers = float(a.get("servers", 1))
    x = np.asarray(ds["predictor_sigma"].values, dtype=float)
    ks = [int(k) for k in ds["bins"].values]
    fig, (ax,) = new_figure(7.6, 4.6)
    for k, c, m in zip(ks, COLORS, MARKERS):
        cap, lo, hi, unresolved = capacity_search(ds, "predictor_sigma", bins=k)
        sim_points(ax, x, cap, lo, hi, unresolved, c, m)
        ax.plot(x, cap, color=c, lw=0.8, zorder=2)
        ax.axhline(servers * B / theory.service_time(B, l_min, l_max, k), color=c, ls=":", lw=1.0, zorder=1)
    ax.set_xlabel("log-normal error $\\sigma$ of the length predictor: predicted = true $\\times e^{\\sigma Z}$")
    ax.set_ylabel("capacity: largest stable arrival rate (requests/s)")
    series = series_handles([f"k = {k}" for k in ks], COLORS[: len(ks)], MARKERS[: len(ks)])
    styles = style_handles(("sim", "find_capacity: mean and interval over its searches"),
                           ("hollow", "bracket narrowed by probes undecided at the cap"),
                           (":", "oracle: Theorem 4.2"))
    two_legends(ax, series, styles, loc1="upper right", loc2="center right")
    fig.suptitle("How much capacity does a length predictor's error cost?\n"
                 f"{setting(ds)}\n{_search_note(ds)}", fontsize=9)
    return fig
