"""The paper's figures, drawn from stored sweep datasets.

Figure scripts read datasets written by ``mbbatch sweep`` (``results/<name>.zarr``)
and by ``mbbatch example NAME`` (``results/fig1b.nc``, ``results/engine_event.nc``).  They never simulate;
they may evaluate the closed forms of :mod:`mbbatch.theory`.

>>> from mbbatch.figures import FIGURES, make_figures
>>> list(FIGURES)                                       # doctest: +NORMALIZE_WHITESPACE
['fig1b', 'fig3', 'fig4', 'fig8', 'throughput_vs_k', 'min_bins_vs_eps', 'servers', 'fig6', 'fig7',
 'mb_only', 'mb_only_load', 'dynamic_vs_static', 'controller_step', 'mb_dynamic', 'max_wait',
 'predictor_gain', 'bursty', 'trace_replay', 'capacity_vs_k', 'capacity_latency',
 'capacity_predictor', 'laps_modes', 'laps_allocation', 'autellix_routers', 'autellix_loops', 'capacity_routers',
 'engine_event', 'hardware_fit', 'hardware_moe', 'hardware_policies', 'hardware_trace', 'hardware_multibin',
 'continuous_vs_binned', 'continuous_memory', 'continuous_controller',
 'continuous_trace', 'policy_gains', 'prefix_caching', 'disaggregation']
>>> make_figures("results", "figures", only="fig3")     # doctest: +SKIP
[PosixPath('figures/fig3.png'), PosixPath('figures/fig3.pdf')]

A figure's name is the name of the function that draws it:

- :mod:`.paper`: the multi-bin paper's figures and its theorems' studies
  (``fig1b`` to ``servers``), and its Figures 6 and 7 on a real trace's
  output lengths (``fig6``, ``fig7``: drawn when the trace's datasets exist,
  skipped with a message otherwise);
- :mod:`.experiments`: the dynamic-batching experiments (i)-(v)
  (``mb_only`` to ``max_wait``);
- :mod:`.workloads`: realistic workloads: the predictor's error
  (``predictor_gain``) and bursty arrivals (``bursty``);
- :mod:`.capacity`: capacity searches against k, a p95 latency target and
  the predictor's error (``capacity_vs_k`` to ``capacity_predictor``);
- :mod:`.cluster`: multi-engine serving: LAPS's modes (``laps_modes``) and
  its dynamic allocation through a load step (``laps_allocation``),
  Autellix's routing (``autellix_routers``, ``capacity_routers``,
  ``engine_event``), open against closed-loop programs
  (``autellix_loops``), and prefill/decode disaggregation's capacity
  against its split (``disaggregation``);
- :mod:`.hardware`: the service models fitted to measured accelerators
  (``hardware_fit``, and ``hardware_moe`` for a mixture of experts: they
  read the measurements shipped with mbbatch, no sweep), the dynamic-batching experiments on two of them
  (``hardware_policies``, ``hardware_trace``) and multi-bin batching on
  them beside its closed form (``hardware_multibin``);
- :mod:`.continuous`: continuous batching against multi-bin batching run
  to completion on them (``continuous_vs_binned``), as its KV cache
  shrinks (``continuous_memory``), and its cap set by the dynamic-batching
  controller (``continuous_controller``), against batching run to
  completion on a real trace's lengths (``continuous_trace``), and its
  admission orders' paired gains over first come first served and their
  capacity under a goodput objective, on one tenant and on two
  (``policy_gains``), and its capacity with and without prefix caching as
  more requests share system prompts, one engine and a cluster behind
  least-used and cache-aware routing (``prefix_caching``);
- :mod:`.plotting`: any store, a metric against an axis (:func:`plot`,
  ``mbbatch plot``);
- :mod:`.data`: where datasets live and reading values from them;
- :mod:`.style`: the shared look and the deterministic savers;
- :mod:`.analysis`: numbers that are not drawing (overload, confidence
  intervals over replications, settling times).

Conventions in every figure: simulation as markers with 95% confidence
intervals (t-intervals of the mean over replications); closed forms as lines
in the same colour; unstable cells (``unstable == True``) as hollow markers.
Cells whose ``done`` flag is false are left out.  The token-level policies
(static, dynamic, multi-bin dynamic) have no closed forms: thin lines join
their simulated points, and a cell whose throughput is below
:data:`~mbbatch.figures.analysis.OVERLOAD` (0.95) times its arrival rate is
hollow too, since their ``unstable`` flag misses overloads whose queue drains
after the arrivals end.

Output is byte-for-byte reproducible: figures are built on
:class:`matplotlib.figure.Figure` (no pyplot state) under a fixed style, and
the PDF/PNG metadata that would carry a date or a version is dropped.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr

from . import capacity, cluster, continuous, experiments, hardware, paper, workloads
from .data import dataset_command, dataset_path, open_dataset
from .plotting import plot
from .style import FORMATS, house_style, save

__all__ = ["FIGURES", "TRACE_FIGURES", "TraceFigureSkipped", "IncompleteDataset",
           "make_figures", "plot", "dataset_path",
           "dataset_command"]


class TraceFigureSkipped(UserWarning):
    """A figure whose dataset needs a trace file that is absent was skipped."""


class IncompleteDataset(UserWarning):
    """A figure was drawn from a sweep store with grid points not done (an
    interrupted sweep): those points are left out of it."""


#: name -> (drawing function, datasets it reads), in drawing order.
FIGURES: "OrderedDict[str, tuple[Callable, list[str]]]" = OrderedDict([
    ("fig1b", (paper.fig1b, ["fig1b"])),
    ("fig3", (paper.fig3, ["fig3"])),
    ("fig4", (paper.fig4, ["fig4"])),
    ("fig8", (paper.fig8, ["fig8"])),
    ("throughput_vs_k", (paper.throughput_vs_k, ["thm43"])),
    ("min_bins_vs_eps", (paper.min_bins_vs_eps, ["thm43"])),
    ("servers", (paper.servers, ["servers"])),
    ("fig6", (paper.fig6, ["fig6"])),
    ("fig7", (paper.fig7, ["fig7"])),
    ("mb_only", (experiments.mb_only, ["mb_only"])),
    ("mb_only_load", (experiments.mb_only_load, ["mb_only_load"])),
    ("dynamic_vs_static", (experiments.dynamic_vs_static, ["token_policies"])),
    ("controller_step", (experiments.controller_step, ["controller_step"])),
    ("mb_dynamic", (experiments.mb_dynamic, ["token_policies"])),
    ("max_wait", (experiments.max_wait, ["max_wait"])),
    ("predictor_gain", (workloads.predictor_gain, ["predictor_error", "bin_confusion"])),
    ("bursty", (workloads.bursty, ["bursty", "bursty_onoff"])),
    ("trace_replay", (workloads.trace_replay, ["trace_replay"])),
    ("capacity_vs_k", (capacity.capacity_vs_k, ["capacity_k"])),
    ("capacity_latency", (capacity.capacity_latency, ["capacity_latency"])),
    ("capacity_predictor", (capacity.capacity_predictor, ["capacity_predictor"])),
    ("laps_modes", (cluster.laps_modes, ["laps"])),
    ("laps_allocation", (cluster.laps_allocation, ["laps_step"])),
    ("autellix_routers", (cluster.autellix_routers, ["autellix"])),
    ("autellix_loops", (cluster.autellix_loops, ["autellix_loops"])),
    ("capacity_routers", (cluster.capacity_routers, ["capacity_routers"])),
    ("engine_event", (cluster.engine_event, ["engine_event"])),
    ("hardware_fit", (hardware.hardware_fit, [])),
    ("hardware_moe", (hardware.hardware_moe, [])),
    ("hardware_policies", (hardware.hardware_policies, ["token_policies", "hardware_policies"])),
    ("hardware_trace", (hardware.hardware_trace, ["hardware_trace_default", "hardware_trace"])),
    ("hardware_multibin", (hardware.hardware_multibin, ["hardware_multibin"])),
    ("continuous_vs_binned", (continuous.continuous_vs_binned, ["hardware_multibin", "continuous_vs_binned"])),
    ("continuous_memory", (continuous.continuous_memory, ["continuous_memory"])),
    ("continuous_controller", (continuous.continuous_controller, ["continuous_controller"])),
    ("continuous_trace", (continuous.continuous_trace, ["continuous_trace_capacity", "continuous_trace"])),
    ("policy_gains", (continuous.policy_gains, ["policy_gains", "policy_gains_capacity", "policy_gains_classes",
                                                 "policy_gains_classes_capacity"])),
    ("prefix_caching", (continuous.prefix_caching, ["prefix_caching", "prefix_routing"])),
    ("disaggregation", (cluster.disaggregation, ["disaggregation"])),
])


#: figures whose datasets replay a trace, with the trace's file name
TRACE_FIGURES = {"fig6": "AzureLLMInferenceTrace_conv.csv", "fig7": "AzureLLMInferenceTrace_conv.csv",
                 "trace_replay": "AzureLLMInferenceTrace_conv.csv", "hardware_trace": "AzureLLMInferenceTrace_conv.csv",
                 "continuous_trace": "AzureLLMInferenceTrace_conv.csv"}


def make_figures(results_dir, out_dir, only=None, workers: int = 1, formats=FORMATS) -> list[Path]:
    """Draw figures from the datasets in ``results_dir`` into ``out_dir``.

    Each figure ``name`` is saved as ``out_dir/<name>.png`` (:data:`.style.DPI` dots
    per inch) and ``out_dir/<name>.pdf``, with no date or version metadata, so
    the same data give byte-identical files.

    Parameters
    ----------
    results_dir : path
        Folder holding ``<dataset>.zarr`` stores (and ``fig1b.nc``).
    out_dir : path
        Folder for the figures; created if absent.
    only : str or iterable of str, optional
        Draw only these figures (names of :data:`FIGURES`).
    workers : int, default 1
        Processes drawing at once (figures are independent; the files are
        the same bytes however many draw them).  ``mbbatch figures`` uses
        every core.
    formats : str or iterable of str, default ("png", "pdf")
        The files to write of each figure (:data:`.style.FORMATS`): ``"png"``
        alone skips the PDFs, whose drawing takes about as long again.

    Returns
    -------
    list of Path
        The files written, PNG then PDF for each figure (those asked for), in
        :data:`FIGURES` order.

    Raises
    ------
    ValueError
        An unknown figure name.
    FileNotFoundError
        A dataset a selected figure reads is missing; the message names the
        file and the command that makes it.  Checked before anything is drawn.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1; got {workers!r}")
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    if not formats or any(f not in FORMATS for f in formats):
        raise ValueError(f"formats must be one or more of {', '.join(FORMATS)}; got {formats!r}")
    if only is None:
        names = list(FIGURES)
    else:
        wanted = [only] if isinstance(only, str) else list(only)
        unknown = [n for n in wanted if n not in FIGURES]
        if unknown:
            raise ValueError(f"unknown figure {', '.join(map(repr, unknown))}; "
                             f"choose from: {', '.join(FIGURES)}")
        names = [n for n in FIGURES if n in wanted]

    if only is None:
        # the figures of a trace not at hand are skipped (their committed files stay)
        absent = [n for n in names if n in TRACE_FIGURES
                  and not all(dataset_path(results_dir, d).exists() for d in FIGURES[n][1])]
        for n in absent:
            warnings.warn(f"figure {n} skipped: its dataset needs the trace {TRACE_FIGURES[n]}, which was not "
                          "found (see the user guide's traces page, docs/guide/traces.md, for where to download it)",
                          TraceFigureSkipped, stacklevel=2)
        names = [n for n in names if n not in absent]
    needed = list(OrderedDict.fromkeys(d for n in names for d in FIGURES[n][1]))
    missing = [d for d in needed if not dataset_path(results_dir, d).exists()]
    if missing:
        lines = [f"  {dataset_path(results_dir, d)}: make it with `{dataset_command(d, results_dir)}`"
                 for d in missing]
        raise FileNotFoundError("missing dataset(s) for the figures:\n" + "\n".join(lines))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = min(workers, len(names))
    if workers <= 1:
        cache: dict[str, xr.Dataset] = {}
        with house_style():
            return [path for name in names for path in _draw(results_dir, out_dir, name, cache, formats)]
    # each figure in a worker process, its warnings brought back; the slowest
    # figures (the multi-engine ones) come last in FIGURES, so start from the end
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor

    # (fork, which skips the workers' imports, only while this process has no
    # other thread: a thread's locks would be copied held)
    start = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
        else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start)) as pool:
        futures = {name: pool.submit(_draw_recording, results_dir, out_dir, name, formats) for name in reversed(names)}
        drawn = {name: future.result() for name, future in futures.items()}
    written: list[Path] = []
    for name in names:
        paths, caught = drawn[name]
        for message, category in caught:
            warnings.warn(message, category, stacklevel=2)
        written += paths
    return written


def _draw(results_dir, out_dir: Path, name: str, cache: dict, formats=FORMATS) -> list[Path]:
    """Draw figure ``name`` into its ``formats``, its datasets opened once into ``cache``."""
    func, datasets = FIGURES[name]
    data = {}
    for d in datasets:
        if d not in cache:
            cache[d] = open_dataset(results_dir, d)
        data[d] = cache[d]
        if "done" in data[d]:
            done = np.asarray(data[d]["done"].values, dtype=bool)
            if not done.all():
                warnings.warn(f"figure {name}: {dataset_path(results_dir, d)} has {done.size - done.sum()} of "
                              f"{done.size} grid points not done (an interrupted sweep), left out of it; resume "
                              f"with `{dataset_command(d, results_dir)}`", IncompleteDataset, stacklevel=2)
    return save(func(data), out_dir, name, formats)


def _draw_recording(results_dir, out_dir: Path, name: str, formats=FORMATS) -> tuple[list[Path], list]:
    """:func:`_draw` in a worker process: the files, and the warnings issued."""
    with warnings.catch_warnings(record=True) as caught, house_style():
        warnings.simplefilter("always")
        paths = _draw(results_dir, out_dir, name, {}, formats)
    return paths, [(str(w.message), w.category) for w in caught]
