"""The multi-engine experiments: LAPS's modes on its prefill instances
(``laps_modes``).

Each takes ``{dataset name: Dataset}`` and returns a
:class:`matplotlib.figure.Figure`; conventions as in :mod:`mbbatch.figures`
(a cell whose throughput falls short of its arrival rate is hollow).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .analysis import overloaded, replication_ci
from .data import line, per_rep, variants
from .style import COLORS, MARKERS, log_ylim, series_handles, sim_points, style_handles

__all__ = ["laps_modes"]


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
    labels = [_mode_label(settings) for _, settings in found]
    handles = series_handles(labels, COLORS[: len(found)], MARKERS[: len(found)])
    handles += style_handles(("sim", "simulation: mean $\\pm$ 95% CI over replications"),
                             ("hollow", "throughput below 0.95 $\\times$ arrival rate (overloaded)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3)
    a = ds.attrs
    fig.suptitle(f"LAPS on {int(a['instances'])} prefill instances: short and long requests' p99 time to first "
                 f"token\nprompts log-normal ($\\sigma$ {float(a['prompt_sigma']):g}), short at most "
                 f"{int(a['laps_threshold'])} tokens; a batch takes {1e3 * float(a['prefill_a']):g} ms + "
                 f"{1e3 * float(a['prefill_b']):g} ms per prompt token; n = {int(a['n']):,}, {int(a['reps'])} reps",
                 fontsize=9.5)
    return fig
