"""The one result type of :func:`mbbatch.simulate`, for every policy.

:class:`SimulationResult` carries the metrics of the metric table
(:data:`mbbatch.metrics.METRICS`) that apply to the run's policy, as
attributes of the same names whatever the policy; a metric that does not
apply is absent (``AttributeError`` saying so), not NaN.  Per-request and
per-batch records are :class:`Table` objects, the controllers' downsampled
state an ``xarray.Dataset``.  ``to_dataset()`` names each metric as a sweep
store does.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from . import stats
from .metrics import METRICS, RENAMED, applicable

__all__ = ["SimulationResult", "Table", "UnstableWarning"]


class UnstableWarning(UserWarning):
    """A run (or some cells of a sweep) has no steady state: its backlog
    grows, so its averages describe a transient, not the policy's long-run
    behaviour."""


class Table:
    """Columns of one length: per-request or per-batch records.

    A column reads as an attribute (``t.arrival``) or an item
    (``t["arrival"]``); ``t.columns`` names them; ``len(t)`` is the number of
    rows; ``to_pandas()`` gives a DataFrame (pandas is installed with
    xarray).
    """

    __slots__ = ("_columns",)

    def __init__(self, columns: dict):
        cols = {name: np.asarray(v) for name, v in columns.items()}
        sizes = {v.shape[0] for v in cols.values()}
        if len(sizes) > 1:
            raise ValueError(f"a Table's columns must have one length; got {sorted(sizes)}")
        object.__setattr__(self, "_columns", cols)

    def __getattr__(self, name):
        try:
            cols = object.__getattribute__(self, "_columns")
        except AttributeError:      # (unpickling, before __setstate__)
            raise AttributeError(name) from None
        if name in cols:
            return cols[name]
        raise AttributeError(f"no column {name!r}; the columns are {', '.join(cols)}")

    def __getitem__(self, name):
        if name not in self._columns:
            raise KeyError(f"no column {name!r}; the columns are {', '.join(self._columns)}")
        return self._columns[name]

    def __setattr__(self, name, value):
        raise AttributeError("a Table is read-only")

    def __getstate__(self):
        return self._columns

    def __setstate__(self, state):
        object.__setattr__(self, "_columns", state)

    def __contains__(self, name) -> bool:
        return name in self._columns

    def __len__(self) -> int:
        return next(iter(self._columns.values())).shape[0] if self._columns else 0

    def __iter__(self):
        return iter(self._columns)

    def __repr__(self) -> str:
        return f"Table({len(self)} rows; columns: {', '.join(self._columns)})"

    @property
    def columns(self) -> tuple:
        """The column names, in order."""
        return tuple(self._columns)

    def keys(self):
        return self._columns.keys()

    def to_pandas(self):
        """The table as a ``pandas.DataFrame`` (one column per column)."""
        import pandas as pd

        return pd.DataFrame(self._columns)


class SimulationResult:
    """Metrics and records of one simulation run, for every policy.

    Attributes
    ----------
    kind : str
        The policy kind: ``multibin``, ``static``, ``dynamic`` or
        ``multibin_dynamic``.
    <metric> : float or int
        Every metric of :data:`mbbatch.metrics.METRICS` that applies to
        ``kind`` (``res.throughput``, ``res.mean_latency``,
        ``res.latency_p95``, ``res.utilization``, ...; units in the table).
        Reading one that does not apply raises ``AttributeError``.
    mean_latency_ci : tuple of float
        95% batch-means confidence interval of the mean latency (the run cut
        into contiguous groups by arrival index); :meth:`interval` at any
        level, and says which metrics have no within-run interval.
    config : dict
        The run's configuration: policy, arrivals, workload, n, servers and
        the seed's entropy (everything needed to repeat it).
    n : int
        Requests simulated.
    servers : int or math.inf
    edges : ndarray, shape (bins + 1,)
        The bins' edges: bin i holds ``edges[i] <= x < edges[i + 1]``, where
        x is a request's service time (s) for MultiBin and its predicted
        output length (tokens) for the token-level policies (Algorithm 6's
        edges, set after the warm-up; ``[0, 10000]`` with one bin).
    batches_per_bin : ndarray of int (MultiBin)
        Batches served from each bin.
    batch_size_hist : ndarray of int (token-level policies)
        ``batch_size_hist[b]`` counts batches of size b (continuous batching:
        iterations processing b sequences).
    group_mean_latency : ndarray
        Mean latency of each batch-means group.
    group_mean_batch_wait : ndarray (MultiBin)
        Mean central-FIFO wait of each group's batches; growth means backlog.
    latency_histogram : ndarray of int
        The log-linear latency histogram the quantiles are read from.
    requests : Table or None
        Per-request records (``keep_requests=True``), by arrival order; a
        ``latency`` column is completion - arrival (NaN for requests that
        never completed).
    batches : Table or None
        Per-batch records (``keep_batches=True``, token-level policies).
    time_series : xarray.Dataset or None
        Token-level policies: the controllers' state at sampled batch starts
        (dimension ``time``): ``b_target``, ``b_low``, ``b_high``,
        ``tau_avg``, ``batch_bin`` (the batch's bin), ``batch_size`` and
        ``queue`` (requests waiting, also along ``bin``).  LAPS with dynamic
        allocation: the instances of its short and long groups
        (``short_instances``, ``long_instances``), from the first arrival
        and after each move.  None for MultiBin, which has no controller,
        and for LAPS without dynamic allocation.
    kernel_seconds : float
        Wall time the kernel ran, s (the rest of ``simulate`` is checking,
        packing and these statistics).
    classes : dict or None
        A :meth:`Workload.mixture <mbbatch.Workload.mixture>`'s run: per
        class name, its ``share``, requests ``completed``, ``mean_latency``
        and ``latency_p99`` (s), ``mean_ttft`` and ``ttft_p99`` (s, the time
        to first token), its ``ttft_slo`` and ``ttft_attainment``, the share
        of its requests whose first token came within it.  None otherwise.
    unstable : bool
        The backlog grew through the run: no steady state, the averages
        describe a transient.  ``unstable_reason`` says why, or why the run
        was not assessed.
    """

    def __init__(self, *, kind: str, config: dict, n: int, servers, edges: np.ndarray, metrics: dict,
                 arrays: dict, requests: Table | None = None, batches: Table | None = None,
                 time_series: dict | None = None, unstable: bool = False, unstable_reason: str = "",
                 latency_quantiles: str = "histogram", kernel_seconds: float = math.nan,
                 classes: dict | None = None):
        expected = set(applicable(kind)) - {"unstable"}
        if set(metrics) != expected:
            raise ValueError(f"metrics of a {kind} run: missing {sorted(expected - set(metrics))}, "
                             f"unexpected {sorted(set(metrics) - expected)}")
        self.kind = kind
        self.config = config
        self.n = n
        self.servers = servers
        self.edges = edges
        self._metrics = metrics
        self._arrays = arrays
        self.requests = requests
        self.batches = batches
        self._time_series = time_series
        self._time_series_ds = None
        self.unstable = bool(unstable)
        self.unstable_reason = unstable_reason
        self._latency_quantiles = latency_quantiles
        self.kernel_seconds = kernel_seconds
        self.classes = classes

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        d = self.__dict__
        if name in d.get("_metrics", ()):
            return d["_metrics"][name]
        if name in d.get("_arrays", ()):
            return d["_arrays"][name]
        if name in RENAMED:
            warnings.warn(f"SimulationResult.{name} is now {RENAMED[name]}", DeprecationWarning, stacklevel=2)
            return getattr(self, RENAMED[name])
        if name in METRICS:
            raise AttributeError(f"{name} does not apply to {d.get('kind')} policies "
                                 f"(see mbbatch.metrics.METRICS[{name!r}].kinds)")
        raise AttributeError(f"SimulationResult has no attribute {name!r}")

    def __dir__(self):
        return sorted({*super().__dir__(), *self._metrics, *self._arrays})

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._metrics[k]:.6g}" for k in ("throughput", "mean_latency", "utilization")
                          if k in self._metrics)
        return f"SimulationResult({self.config.get('policy', self.kind)}, n={self.n}, {shown})"

    def summary(self) -> str:
        """One line: the policy, requests, throughput, mean latency with its
        batch-means interval, p99 latency, and whether the run has a steady
        state."""
        m = self._metrics
        ci = m.get("mean_latency_ci_low", math.nan), m.get("mean_latency_ci_high", math.nan)
        interval = (f" [{ci[0]:.4g}, {ci[1]:.4g}] ({100 * stats.CONFIDENCE:g}% batch means)"
                    if all(math.isfinite(v) for v in ci) else "")
        state = f"; no steady state: {self.unstable_reason}" if self.unstable else ""
        return (f"{self.config.get('policy', self.kind)}: {self.n:,} requests, throughput {m['throughput']:.4g} "
                f"requests/s, mean latency {m['mean_latency']:.4g} s{interval}, p99 {m['latency_p99']:.4g} s{state}")

    def _repr_html_(self) -> str:
        """A notebook's view: the summary, then every metric with its units."""
        import html

        rows = []
        for name, value in self._metrics.items():
            units = METRICS[name].units if name in METRICS else ""
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            rows.append(f"<tr><td><code>{name}</code></td><td style='text-align:right'>{shown}</td>"
                        f"<td>{html.escape(units)}</td></tr>")
        return (f"<p><b>SimulationResult</b>: {html.escape(self.summary())}</p>"
                "<table><tr><th>metric</th><th>value</th><th>units</th></tr>" + "".join(rows) + "</table>")

    @property
    def mean_latency_ci(self) -> tuple:
        return (self._metrics["mean_latency_ci_low"], self._metrics["mean_latency_ci_high"])

    def interval(self, name: str, confidence: float = stats.CONFIDENCE) -> tuple:
        """The run's own confidence interval of metric ``name``, ``(low, high)``.

        One run gives an interval where a within-run method exists: the mean
        latency's batch means (the run cut into contiguous groups of arrivals,
        :attr:`group_mean_latency`; Law, *Simulation Modeling and Analysis*,
        2015, section 9.5.3), at ``confidence`` in (0, 1).  Every other metric
        (quantiles, shares, rates, counts) has none here, and asking raises a
        ``ValueError`` saying so: replicate the run instead (a sweep's ``reps``,
        ``mbbatch simulate --reps``), which gives every metric its t-interval.
        """
        if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) \
                or not 0 < float(confidence) < 1:
            raise ValueError(f"confidence must be a number in (0, 1); got {confidence!r}")
        if name not in self._metrics and name not in METRICS:
            raise ValueError(f"{name!r} is not a metric (see mbbatch.metrics.METRICS)")
        if name not in self._metrics:
            raise ValueError(f"{name} does not apply to {self.kind} policies")
        groups = self._arrays.get("group_mean_latency")
        if name == "mean_latency" and groups is not None:
            return stats.batch_means_ci(groups, self._metrics["mean_latency"], float(confidence))
        why = ("a LAPS run keeps no batch-means groups" if name == "mean_latency"
               else f"mbbatch has no within-run interval for {name}")
        raise ValueError(f"{why}: replicate the run (a sweep's reps, or mbbatch simulate --reps 2 or more) for "
                         "a t-interval over independent replications")

    @property
    def time_series(self):
        if self._time_series is None:
            return None
        if self._time_series_ds is None:
            import xarray as xr

            ts = self._time_series
            # (the batch's bin is ``batch_bin``: ``bin`` is the queue's dimension)
            data = {("batch_bin" if col == "bin" else col): ("time", v, {"units": _TS_UNITS.get(col, "requests")})
                    for col, v in ts.items() if col not in ("time", "queue")}
            coords = {"time": ("time", ts["time"], {"units": "s", "long_name": _TS_TIME.get(self.kind,
                                                                                           "batch start time")})}
            if "queue" in ts:
                data["queue"] = (("time", "bin"), ts["queue"], {"units": "requests",
                                                                "description": "requests waiting per bin"})
                coords["bin"] = np.arange(ts["queue"].shape[1])
            self._time_series_ds = xr.Dataset(data, coords=coords)
        return self._time_series_ds

    def time_series_columns(self) -> dict | None:
        """The time series as its columns, plain arrays (``time``, ``queue``
        (batch starts x bins), ``bin`` (the batch's bin), ...), without
        building :attr:`time_series`; None where it does not apply."""
        return None if self._time_series is None else dict(self._time_series)

    def metrics(self) -> dict:
        """The metrics that apply to this run's policy, by name (table order)."""
        return dict(self._metrics)

    def to_dataframe(self):
        """The metrics as a pandas DataFrame, one row each: ``value``,
        ``units`` and ``description``, indexed by name (table order).  (The
        Dataset of :meth:`to_dataset` holds arrays along several dimensions
        with ``arrays=True`` as well, whose own ``to_dataframe()`` is their
        product; the per-request and per-batch records are :attr:`requests`
        and :attr:`batches`.)"""
        import pandas as pd

        rows = {name: {"value": value, "units": METRICS[name].units, "description": METRICS[name].description}
                for name, value in self._metrics.items()}
        rows["unstable"] = {"value": self.unstable, "units": METRICS["unstable"].units,
                            "description": METRICS["unstable"].description}
        return pd.DataFrame.from_dict(rows, orient="index")

    def to_dataset(self, arrays: bool = False):
        """The run as an ``xarray.Dataset``: every metric that applies, named
        as a sweep store names it (``sim_throughput``, ``completed``,
        ``backlog_growing``, ...) along ``rep`` (one replication, as a sweep
        store's cell holds several), with units, descriptions and provenance
        attrs; its ``to_dataframe()`` is one row.

        With ``arrays``, also the run's arrays along their own dimensions:
        the bin edges and per-bin arrays, the batch-means groups, and for the
        token-level policies the time series (``ts_*`` along ``time``); for
        LAPS its TTFT histograms and its router's moves instead of groups.
        (A Dataset's ``to_dataframe()`` is the product of its dimensions:
        hundreds of rows with them.  The per-request and per-batch records
        are :attr:`requests` and :attr:`batches`.)"""
        import xarray as xr

        data = {}
        for name, m in applicable(self.kind).items():
            value = self.unstable if name == "unstable" else self._metrics[name]
            data[m.var] = xr.Variable(("rep",), [value], {"units": m.units, "long_name": name.replace("_", " "),
                                                          "description": m.description})
        coords = {"rep": [0]}
        if not arrays:
            return self._dataset(data, coords)
        unit = "s" if self.kind == "multibin" else "tokens"
        data["bin_edges"] = xr.Variable(("bin_edge",), self.edges, {
            "units": unit, "long_name": "bin edges", "description": "bin i holds edges[i] <= x < edges[i+1]"})
        coords["bin_edge"] = np.arange(self.edges.size)
        if self.kind == "laps":
            # (no batch-means groups yet: the TTFT histograms and the router's moves)
            for name in ("ttft_short_histogram", "ttft_long_histogram"):
                data[name] = xr.Variable(("ttft_bucket",), self._arrays[name], {
                    "units": "requests", "long_name": name.replace("_", " "),
                    "description": "requests per bucket of the kernels' log-linear TTFT histogram"})
            log = self.group_moves_log
            coords["move"] = np.arange(len(log))
            for col in log.columns:
                data[f"move_{col}"] = xr.Variable(("move",), log[col], {
                    "units": "s" if col == "time" else "", "long_name": f"group move {col}",
                    "description": "the LAPS router's moves of instances between its groups"})
            return self._dataset(data, coords)
        coords["group"] = np.arange(self.group_mean_latency.size)
        data["group_mean_latency"] = xr.Variable(("group",), self.group_mean_latency, {
            "units": "s", "long_name": "batch-means group latency",
            "description": "mean latency of the requests of each contiguous block of arrivals"})
        if "batch_size_hist" not in self._arrays and self.kind != "multibin":
            # (a composite of engines, a disaggregated deployment's pools: their arrays are their own results')
            return self._dataset(data, coords)
        if self.kind == "multibin":
            coords["bin"] = np.arange(self.batches_per_bin.size)
            data["batches_per_bin"] = xr.Variable(("bin",), self.batches_per_bin, {
                "units": "batches", "long_name": "batches per bin", "description": "batches served from each bin"})
            data["group_mean_batch_wait"] = xr.Variable(("group",), self.group_mean_batch_wait, {
                "units": "s", "long_name": "batch-means group queue wait",
                "description": "mean central-FIFO wait of the batches closed in each block; growth means backlog"})
        else:
            coords["batch_size"] = np.arange(self.batch_size_hist.size)
            data["batch_size_hist"] = xr.Variable(("batch_size",), self.batch_size_hist, {
                "units": "batches", "long_name": "batch size histogram", "description": "batches of each size"})
            ts = self.time_series
            coords["time"] = ts["time"].variable
            coords["bin"] = np.arange(self.edges.size - 1)
            for col, var in ts.data_vars.items():
                data[f"ts_{col}"] = xr.Variable(var.dims, var.values, {
                    **var.attrs, "long_name": col.replace("_", " "),
                    "description": var.attrs.get("description", f"{col} at sampled batch starts")})
        return self._dataset(data, coords)

    def _dataset(self, data: dict, coords: dict):
        import xarray as xr

        from .provenance import versions

        attrs = {key: (v if isinstance(v, (int, float, str)) else str(v)) for key, v in self.config.items()}
        attrs.update(versions())
        attrs["kind"] = self.kind
        attrs["latency_quantiles"] = self._latency_quantiles
        attrs["confidence_level"] = stats.CONFIDENCE
        attrs["unstable"] = int(self.unstable)
        attrs["unstable_reason"] = self.unstable_reason
        return xr.Dataset(data, coords=coords, attrs=attrs)


_TS_UNITS = {"tau_avg": "s/token", "bin": "1", "short_instances": "instances", "long_instances": "instances",
             "running": "sequences", "kv_blocks": "blocks"}
#: what a time series' time is, where not a batch start
_TS_TIME = {"laps": "first arrival, then each move between the groups",
            "continuous": "sampled iteration start time"}
