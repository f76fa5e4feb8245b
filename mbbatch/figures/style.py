"""The look shared by every figure, and how figures are saved.

Fixed rc parameters, colours and markers; figures built on
:class:`matplotlib.figure.Figure` (no pyplot state); PNG and PDF files saved
without the metadata that would carry a date or a version, so the same data
give byte-identical files.  Also the drawing conventions every figure shares:
simulation as markers with 95% confidence intervals, hollow when unstable,
and the legends that explain them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import matplotlib
import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import (FixedLocator, FormatStrFormatter, LogLocator, NullFormatter, NullLocator,
                               ScalarFormatter)

__all__ = ["DPI", "FORMATS", "RC", "PDF_METADATA", "PNG_METADATA", "COLORS", "MARKERS", "house_style", "new_figure",
           "save", "sim_points", "series_handles", "style_handles", "two_legends", "log_ylim", "plain_log_ticks",
           "log2_k_axis"]

#: Fixed resolution of the PNG files (dots per inch).
DPI = 150
#: The files a figure is saved as, by default every one of them (PNG at :data:`DPI`, PDF)
FORMATS = ("png", "pdf")

RC = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 7.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.3,
    "lines.markersize": 5,
    "errorbar.capsize": 2,
    "legend.framealpha": 0.9,
    "pdf.fonttype": 3,
    "svg.hashsalt": "mbbatch",
    "svg.fonttype": "path",
}

# None drops the entry matplotlib would fill with a date or its version
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
PNG_METADATA = {"Software": None}

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]


@contextlib.contextmanager
def house_style():
    """Matplotlib's defaults overlaid with :data:`RC`, whatever the user's rc file says."""
    with matplotlib.style.context("default"), matplotlib.rc_context(RC):
        yield


def new_figure(width=6.4, height=4.4, ncols=1):
    """A figure of ``width`` x ``height`` inches with one row of ``ncols`` axes."""
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def save(fig, out_dir: Path, name: str, formats=FORMATS) -> list[Path]:
    """Write ``out_dir/<name>.png`` (:data:`DPI`) and ``.pdf`` (``formats``: those
    of :data:`FORMATS` to write, in that order) without dates or versions."""
    options = {"png": {"dpi": DPI, "metadata": PNG_METADATA}, "pdf": {"metadata": PDF_METADATA}}
    paths = []
    for fmt in FORMATS:
        if fmt in formats:
            paths.append(out_dir / f"{name}.{fmt}")
            fig.savefig(paths[-1], **options[fmt])
    return paths


# ---------------------------------------------------------------- simulation markers

def sim_points(ax, x, mean, lo, hi, unstable, color, marker, *, clip_top=None, zorder=3, unstable_bars=True,
               markersize=None):
    """Markers with 95% CI bars; unstable cells hollow; values above ``clip_top``
    drawn hollow on the top edge (without bars).

    ``unstable_bars=False`` leaves the unstable cells' bars out (the mean of a
    transient has no steady state for an interval to describe);
    ``markersize`` (points) overrides the style's size.
    """
    x = np.asarray(x, dtype=float)
    mean = np.asarray(mean, dtype=float)
    lo = np.asarray(lo, dtype=float)
    hi = np.asarray(hi, dtype=float)
    unstable = np.asarray(unstable, dtype=bool)
    ok = np.isfinite(mean) & np.isfinite(x)
    err = np.vstack([np.nan_to_num(np.clip(mean - lo, 0, None)),
                     np.nan_to_num(np.clip(hi - mean, 0, None))])
    clipped = np.zeros_like(ok)
    if clip_top is not None:
        clipped = ok & (mean > clip_top)
    size = {} if markersize is None else {"ms": markersize}
    for sel, face in ((ok & ~unstable & ~clipped, color), (ok & unstable & ~clipped, "none")):
        if not sel.any():
            continue
        if face == "none" and not unstable_bars:
            ax.plot(x[sel], mean[sel], ls="none", marker=marker, color=color, mfc="none", mec=color, zorder=zorder,
                    **size)
            continue
        ax.errorbar(x[sel], mean[sel], yerr=err[:, sel], fmt=marker, ls="none", color=color,
                    mfc=face, mec=color, ecolor=color, elinewidth=0.9, zorder=zorder, **size)
    if clipped.any():
        ax.plot(x[clipped], np.full(clipped.sum(), clip_top), ls="none", marker=marker,
                mfc="none", mec=color, clip_on=False, zorder=zorder, **size)


# ---------------------------------------------------------------- legends and axes

def series_handles(labels, colors, markers):
    """Legend entries for the series, one colour and marker each."""
    return [Line2D([], [], color=c, marker=m, ls="-", label=text)
            for text, c, m in zip(labels, colors, markers)]


def style_handles(*entries):
    """Legend entries for line/marker styles, drawn in grey.

    Each entry is ``(kind, label)``: ``"sim"`` (filled marker), ``"hollow"``
    (hollow marker) or a line style such as ``"--"``.
    """
    out = []
    for kind, label in entries:
        if kind == "sim":
            out.append(Line2D([], [], color="0.3", marker="o", ls="none", label=label))
        elif kind == "hollow":
            out.append(Line2D([], [], color="0.3", marker="o", mfc="none", ls="none", label=label))
        else:
            out.append(Line2D([], [], color="0.3", ls=kind, label=label))
    return out


def two_legends(ax, series, styles, *, loc1="upper left", loc2="lower right", outside=False):
    """Series (colour) legend and style legend; ``outside`` puts both right of the axes."""
    if outside:
        first = ax.legend(handles=series, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        ax.add_artist(first)
        ax.legend(handles=styles, loc="lower left", bbox_to_anchor=(1.02, 0.0))
        return
    first = ax.legend(handles=series, loc=loc1)
    ax.add_artist(first)
    ax.legend(handles=styles, loc=loc2)


def log_ylim(ax, stable_values, curve_values):
    """Fit a log y-axis to the positive finite values given; returns its top."""
    vals = np.concatenate([np.ravel(np.asarray(v, dtype=float)) for v in stable_values + curve_values]
                          or [np.array([1.0])])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if vals.size == 0:
        vals = np.array([1.0, 10.0])
    bottom, top = vals.min() / 1.4, vals.max() * 2.0
    ax.set_ylim(bottom, top)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    return top


def plain_log_ticks(axis, subs=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)):
    """Plain numbers (``4``, not ``4x10^0``) as the ticks of a log ``axis``
    (``ax.yaxis``), at ``subs`` times the powers of ten, so that an axis
    spanning less than a decade still has labelled ticks."""
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_formatter(NullFormatter())


def log2_k_axis(ax, kmax):
    """A log-2 x-axis for the number of bins, ticks at the powers of two up to ``kmax``."""
    ax.set_xscale("log", base=2)
    ticks = [2 ** i for i in range(int(np.floor(np.log2(max(kmax, 1)))) + 1)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
