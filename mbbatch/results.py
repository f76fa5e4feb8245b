"""Output statistics of one simulation and their Dataset form."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import stats
from ._kernels import multibin as _k

__all__ = ["SimulationResult", "RequestTable", "METRICS", "QUANTILES", "UnstableWarning", "backlog_growing",
           "queue_growing"]


class UnstableWarning(UserWarning):
    """A run (or some cells of a sweep) has no steady state: its backlog
    grows, so its averages describe a transient, not the policy's long-run
    behaviour."""

QUANTILES = stats.QUANTILES

#: name -> (units, description) for every scalar metric; drives to_dataset().
METRICS = {
    "throughput": ("requests/s", "completed requests / (last completion - first arrival)"),
    "mean_latency": ("s", "mean over completed requests of batch completion - request arrival"),
    "mean_latency_ci_low": ("s", "lower end of the 95% batch-means confidence interval of mean_latency"),
    "mean_latency_ci_high": ("s", "upper end of the 95% batch-means confidence interval of mean_latency"),
    "latency_p50": ("s", "median latency of completed requests"),
    "latency_p95": ("s", "95th percentile latency of completed requests"),
    "latency_p99": ("s", "99th percentile latency of completed requests"),
    "utilization": ("1", "busy server-time / (servers x span); NaN for infinitely many servers"),
    "mean_busy_servers": ("servers", "busy server-time / span: mean number of servers busy"),
    "mean_batch_service": ("s", "mean batch service time (max of the members' service times)"),
    "std_batch_service": ("s", "sample standard deviation of the batch service time"),
    "mean_fill_wait": ("s", "mean time from a request's arrival until its batch is full"),
    "mean_queue_wait": ("s", "mean time a request's full batch waits in the central FIFO"),
    "span": ("s", "last completion - first arrival"),
    "completed": ("requests", "requests served in full batches"),
    "excluded_partial": ("requests", "requests left in partial batches when arrivals ended; excluded"),
    "n_batches": ("batches", "batches served"),
}


@dataclass(frozen=True, eq=False)
class RequestTable:
    """Per-request arrays (``keep_requests=True``), indexed by arrival order.

    ``completion`` is NaN and ``batch`` is -1 for requests excluded in a
    partial batch.  Times in s.
    """

    arrival: np.ndarray
    service: np.ndarray
    bin: np.ndarray
    completion: np.ndarray
    batch: np.ndarray

    @property
    def latency(self) -> np.ndarray:
        """completion - arrival, in s (NaN for excluded requests)."""
        return self.completion - self.arrival


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """Metrics of one simulation run; see :data:`METRICS` for units.

    Latency quantiles come from a log-linear histogram with buckets of relative
    width 2**-10 (read at bucket midpoints: relative error <= 0.05%), unless
    ``keep_requests=True``, where they are exact (numpy's default linear
    interpolation).  The mean latency is always exact.

    ``unstable`` is True when the backlog grew through the run (the sweeps'
    check, :func:`backlog_growing`): there is then no steady state and the
    averages describe a transient.  ``unstable_reason`` says why, or why the
    run was not assessed (saturated arrivals).
    """

    config: dict
    n: int
    servers: float
    edges: np.ndarray
    throughput: float
    mean_latency: float
    mean_latency_ci: tuple
    latency_p50: float
    latency_p95: float
    latency_p99: float
    utilization: float
    mean_busy_servers: float
    mean_batch_service: float
    std_batch_service: float
    mean_fill_wait: float
    mean_queue_wait: float
    span: float
    completed: int
    excluded_partial: int
    n_batches: int
    batches_per_bin: np.ndarray
    group_mean_latency: np.ndarray = field(repr=False)
    group_mean_batch_wait: np.ndarray = field(repr=False)
    latency_histogram: np.ndarray = field(repr=False)
    requests: RequestTable | None = field(default=None, repr=False)
    unstable: bool = False
    unstable_reason: str = ""

    @classmethod
    def from_kernel(cls, *, config, n, servers, edges, stats, istats, batches_per_bin,
                    group_latency, group_count, group_batch_wait, group_batches, hist, requests,
                    assess_stability=True):
        completed = int(istats[_k.I_COMPLETED])
        n_batches = int(istats[_k.I_BATCHES])
        nan = math.nan
        if completed > 0:
            span = float(stats[_k.S_LAST_COMPLETION] - stats[_k.S_FIRST_ARRIVAL])
            busy = float(stats[_k.S_BUSY])
            throughput = completed / span if span > 0 else math.inf
            mean_latency = float(stats[_k.S_SUM_LATENCY]) / completed
            mean_batch_service = busy / n_batches
            var = (float(stats[_k.S_BUSY_SQ]) - n_batches * mean_batch_service ** 2) / (n_batches - 1) \
                if n_batches > 1 else nan
            std_batch_service = math.sqrt(max(var, 0.0)) if n_batches > 1 else nan
            mean_fill = float(stats[_k.S_SUM_FILL_WAIT]) / completed
            mean_queue = float(stats[_k.S_SUM_QUEUE_WAIT]) / completed
            busy_servers = busy / span if span > 0 else nan
            util = busy_servers / servers if servers != math.inf else nan
        else:
            span = throughput = mean_latency = mean_batch_service = std_batch_service = nan
            mean_fill = mean_queue = busy_servers = util = nan
        with np.errstate(invalid="ignore", divide="ignore"):
            g_lat = np.where(group_count > 0, group_latency / group_count, nan)
            g_wait = np.where(group_batches > 0, group_batch_wait / group_batches, nan)
        ci = _batch_means_ci(g_lat, mean_latency)
        if requests is not None and completed > 0:
            lat = requests.latency
            q = np.quantile(lat[~np.isnan(lat)], QUANTILES)
        else:
            q = _hist_quantiles(hist, QUANTILES)
        if assess_stability:
            unstable, reason = _backlog_verdict(g_wait, mean_batch_service)
        else:
            unstable, reason = False, "not assessed: every request arrives at time 0 (saturated)"
        return cls(config=config, n=n, servers=servers, edges=edges, throughput=throughput,
                   mean_latency=mean_latency, mean_latency_ci=ci,
                   latency_p50=float(q[0]), latency_p95=float(q[1]), latency_p99=float(q[2]),
                   utilization=util, mean_busy_servers=busy_servers,
                   mean_batch_service=mean_batch_service, std_batch_service=std_batch_service,
                   mean_fill_wait=mean_fill,
                   mean_queue_wait=mean_queue, span=span, completed=completed,
                   excluded_partial=int(istats[_k.I_EXCLUDED]), n_batches=n_batches,
                   batches_per_bin=batches_per_bin, group_mean_latency=g_lat,
                   group_mean_batch_wait=g_wait, latency_histogram=hist, requests=requests,
                   unstable=unstable, unstable_reason=reason)

    @property
    def mean_latency_ci_low(self) -> float:
        return self.mean_latency_ci[0]

    @property
    def mean_latency_ci_high(self) -> float:
        return self.mean_latency_ci[1]

    def metrics(self) -> dict:
        """The scalar metrics as a dict (names as in :data:`METRICS`)."""
        return {name: getattr(self, name) for name in METRICS}

    def to_dataset(self):
        """The metrics as an ``xarray.Dataset`` with units, descriptions and
        provenance attrs (configuration, seed entropy, versions)."""
        import xarray as xr

        from .provenance import versions

        data = {}
        for name, (units, desc) in METRICS.items():
            data[name] = xr.Variable((), getattr(self, name),
                                     {"units": units, "long_name": name.replace("_", " "),
                                      "description": desc})
        k = self.batches_per_bin.size
        data["batches_per_bin"] = xr.Variable(
            ("bin",), self.batches_per_bin,
            {"units": "batches", "long_name": "batches per bin", "description": "batches served from each bin"})
        data["bin_edges"] = xr.Variable(
            ("bin_edge",), self.edges,
            {"units": "s", "long_name": "bin edges", "description": "bin i holds edges[i] <= service < edges[i+1]"})
        data["group_mean_latency"] = xr.Variable(
            ("group",), self.group_mean_latency,
            {"units": "s", "long_name": "batch-means group latency",
             "description": "mean latency of the batches closed in each contiguous block of arrivals"})
        data["group_mean_batch_wait"] = xr.Variable(
            ("group",), self.group_mean_batch_wait,
            {"units": "s", "long_name": "batch-means group queue wait",
             "description": "mean central-FIFO wait of the batches closed in each block; growth means backlog"})
        coords = {"bin": np.arange(k), "bin_edge": np.arange(k + 1),
                  "group": np.arange(self.group_mean_latency.size)}
        attrs = {key: (str(v) if not isinstance(v, (int, float, str)) else v)
                 for key, v in self.config.items()}
        attrs.update(versions())
        attrs["latency_quantiles"] = "exact" if self.requests is not None else "histogram, relative error <= 2**-11"
        attrs["confidence_level"] = 0.95
        attrs["unstable"] = int(self.unstable)
        attrs["unstable_reason"] = self.unstable_reason
        return xr.Dataset(data, coords=coords, attrs=attrs)


# (kept for the token-level wrapper until it moves onto the one result type)
def _backlog_verdict(group_wait, mean_batch_service) -> tuple[bool, str]:
    return stats.backlog_verdict(group_wait, mean_batch_service)


queue_growing = stats.queue_verdict
backlog_growing = stats.backlog_growing
_batch_means_ci = stats.batch_means_ci


def _hist_quantiles(hist: np.ndarray, qs) -> np.ndarray:
    return stats.hist_quantiles(hist, qs, _k._HIST_BASE, _k._HIST_SHIFT)
