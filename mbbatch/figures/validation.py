"""Predicted against measured serving runs (:mod:`mbbatch.validation`).

- ``validation``: each measured run's mean time to first token, time per
  output token and end-to-end latency against the prediction held out: on
  its shipped profile calibrated without the run's deployment (circles),
  beside the profile alone's (no overheads, its own prefill rate; hollow),
  or fitted from its own group's runs without it (squares; one run
  measured request by request: its later half, by its earlier half); the
  diagonal and a band of +-10 %.

It draws a Dataset (:meth:`mbbatch.validation.Report.to_dataset`: dims
``run`` and ``metric``; ``measured``, ``predicted``, ``profile_alone``), not
a sweep store: ``mbbatch validate --figure PATH`` draws it.
"""

from __future__ import annotations

import numpy as np

from matplotlib.ticker import NullFormatter

from .style import COLORS, new_figure

__all__ = ["validation"]

#: the panels: metric -> its label
PANELS = {"ttft_mean": "mean time to first token (s)", "tpot_mean": "mean time per output token (s)",
          "e2e_mean": "mean end-to-end latency (s)"}


def validation(ds):
    """The predicted-against-measured figure of a validation Dataset."""
    fig, axes = new_figure(width=11.0, height=3.9, ncols=len(PANELS))
    method = (np.asarray(ds["method"]).astype(str) if "method" in ds
              else np.full(ds.sizes["run"], "profile"))
    for ax, (metric, label) in zip(np.atleast_1d(axes), PANELS.items()):
        sub = ds.sel(metric=metric)
        m, p, u = (np.asarray(sub[v], dtype=float) for v in ("measured", "predicted", "profile_alone"))
        seen = np.isfinite(m) & np.isfinite(p)
        both = np.concatenate([m[seen], p[seen], u[np.isfinite(u)]])
        lo, hi = 0.7 * both.min(), 1.4 * both.max()
        grid = np.geomspace(lo, hi, 50)
        ax.fill_between(grid, grid * 0.9, grid * 1.1, color="0.9", lw=0, label="+-10 %")
        ax.plot(grid, grid, color="0.5", lw=0.8)
        ax.scatter(m, u, marker="o", facecolors="none", edgecolors=COLORS[1], s=22, label="profile alone")
        own = seen & (method == "profile")
        ax.scatter(m[own], p[own], marker="o", color=COLORS[0], s=18, label="profile calibrated, held out")
        fitted = seen & (method == "from_serving")
        if fitted.any():
            ax.scatter(m[fitted], p[fitted], marker="s", color=COLORS[2], s=14,
                       label="fitted from own runs, held out")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set(xlabel=f"measured {label}", ylabel="predicted")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        med = float(np.median(np.abs(p[seen] / m[seen] - 1.0)))
        ax.set_title(f"median |error| {med:.1%} held out ({int(seen.sum())} runs)", fontsize="small")
    np.atleast_1d(axes)[0].legend(loc="upper left", fontsize="x-small")
    fig.suptitle(f"{ds.attrs.get('runs', '')} measured vLLM runs, each predicted held out", fontsize="medium")
    return fig
