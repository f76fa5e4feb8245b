"""The sweep Dataset's schema: variables, their dimensions, units and text.

One dimension per grid axis (named like the parameter) plus ``rep``; every
dimension has a coordinate.  ``sim_*`` variables are simulated, ``theory_*``
and ``capacity`` are closed forms on the same coordinates.
"""

from __future__ import annotations

import math

import numpy as np

from .spec import PARAMS, SweepSpec

__all__ = ["VARIABLES", "REP_VARS", "POINT_VARS", "AGGREGATES", "template"]

# name -> (per rep?, dtype, fill, units, description)
VARIABLES = {
    "sim_throughput": (True, "f8", "requests/s",
                       "simulated throughput: completed requests / (last completion - first arrival)"),
    "sim_mean_latency": (True, "f8", "s", "simulated mean latency (batch completion - request arrival)"),
    "sim_latency_p50": (True, "f8", "s", "simulated median latency"),
    "sim_latency_p95": (True, "f8", "s", "simulated 95th percentile latency"),
    "sim_latency_p99": (True, "f8", "s", "simulated 99th percentile latency"),
    "sim_utilization": (True, "f8", "1", "busy server-time / (servers x span); NaN for infinitely many servers"),
    "sim_mean_batch_service": (True, "f8", "s", "simulated mean batch service time"),
    "sim_mean_fill_wait": (True, "f8", "s", "simulated mean wait for a request's batch to fill"),
    "sim_mean_queue_wait": (True, "f8", "s", "simulated mean wait of a full batch in the central FIFO"),
    "completed": (True, "i8", "requests", "requests served in full batches"),
    "excluded_partial": (True, "i8", "requests",
                         "requests left in partial batches when arrivals ended (excluded from metrics)"),
    "n_batches": (True, "i8", "batches", "batches served"),
    "backlog_growing": (True, "bool", "1",
                        "the central-FIFO wait grows through the run (last quarter vs second quarter)"),
    "sim_throughput_mean": (False, "f8", "requests/s", "mean of sim_throughput over reps"),
    "sim_throughput_ci_low": (False, "f8", "requests/s", "95% t-interval of sim_throughput_mean, lower end"),
    "sim_throughput_ci_high": (False, "f8", "requests/s", "95% t-interval of sim_throughput_mean, upper end"),
    "sim_mean_latency_mean": (False, "f8", "s", "mean of sim_mean_latency over reps"),
    "sim_mean_latency_ci_low": (False, "f8", "s", "95% t-interval of sim_mean_latency_mean, lower end"),
    "sim_mean_latency_ci_high": (False, "f8", "s", "95% t-interval of sim_mean_latency_mean, upper end"),
    "sim_mean_batch_service_mean": (False, "f8", "s", "mean of sim_mean_batch_service over reps"),
    "theory_mean_batch_service": (False, "f8", "s",
                                  "E[t_service]: Theorem 4.2 eq. (20) for uniform equal-mass bins, "
                                  "exact quadrature (batch_service_time) otherwise"),
    "theory_service_rate": (False, "f8", "requests/s",
                            "saturated throughput servers x B / E[t_service] (Proposition 4.1, Theorem 4.2)"),
    "theory_throughput": (False, "f8", "requests/s",
                          "predicted throughput: min(rate, theory_service_rate); the service rate when saturated"),
    "theory_latency": (False, "f8", "s",
                       "Lemma 5.1 eq. (7): E[t_service] + (B-1) k / (2 rate); exact with infinitely many "
                       "servers, a lower bound otherwise; NaN when saturated"),
    "capacity": (False, "f8", "requests/s",
                 "c_max x servers = servers x B / mean service time of one request (Remark 4.2)"),
    "theory_throughput_bound": (False, "f8", "requests/s",
                                "Corollary A.1.1 (corrected) lower bound servers x B mu / L_k; "
                                "exponential service at Lemma A.1 edges only"),
    "unstable": (False, "bool", "1",
                 "rate >= theory_service_rate, or the backlog grew in some rep: no steady state"),
    "done": (False, "bool", "1", "every rep of this grid point is computed and stored"),
}
#: the token-level policies (static, dynamic, multi-bin dynamic): no closed
#: forms, more metrics
TOKEN_VARIABLES = {
    **{k: VARIABLES[k] for k in ("sim_throughput", "sim_mean_latency", "sim_latency_p50", "sim_latency_p95",
                                 "sim_latency_p99", "completed", "n_batches", "backlog_growing")},
    "sim_utilization": (True, "f8", "1", "GPU utilization: busy server-time / (servers x span)"),
    "sim_token_throughput": (True, "f8", "tokens/s", "generated tokens / (last completion - first arrival)"),
    "sim_mean_ttft": (True, "f8", "s", "mean time to first token"),
    "sim_mean_tbt": (True, "f8", "s/token", "mean decode time per output token (token-weighted)"),
    "sim_sla_violation_tokens": (True, "f8", "1", "share of output tokens decoded slower than D_SLA"),
    "sim_sla_violation_requests": (True, "f8", "1", "share of requests decoded slower than D_SLA"),
    "sim_memory_peak": (True, "f8", "1", "largest batch's tokens / eta"),
    "sim_memory_mean": (True, "f8", "1", "time-average tokens in service / (servers x eta)"),
    "sim_batch_size_mean": (True, "f8", "requests", "mean batch size"),
    "sim_batch_size_std": (True, "f8", "requests", "standard deviation of the batch size"),
    "mem_exceed_batches": (True, "i8", "batches", "batches above eta (0 whenever the memory constraint is on)"),
    "rejected": (True, "i8", "requests", "requests alone above eta, dropped"),
    "sla_infeasible": (True, "bool", "1", "the controller ended above D_SLA + eps_D at its smallest batch"),
    **{k: VARIABLES[k] for k in ("sim_throughput_mean", "sim_throughput_ci_low", "sim_throughput_ci_high",
                                 "sim_mean_latency_mean", "sim_mean_latency_ci_low", "sim_mean_latency_ci_high")},
    "sim_latency_p95_mean": (False, "f8", "s", "mean of sim_latency_p95 over reps"),
    "sim_sla_violation_tokens_mean": (False, "f8", "1", "mean of sim_sla_violation_tokens over reps"),
    "sim_batch_size_mean_mean": (False, "f8", "requests", "mean of sim_batch_size_mean over reps"),
    "unstable": (False, "bool", "1", "the backlog grew in some rep: no steady state"),
    "done": VARIABLES["done"],
}
#: time series of the load-step experiments: (per rep, dtype, units, description)
TIME_SERIES = {
    "ts_b_target": ("requests", "b_target at the last batch start before each time"),
    "ts_b_low": ("requests", "the controller's b_low"),
    "ts_b_high": ("requests", "the controller's b_high"),
    "ts_tau_avg": ("s/token", "the controller's EMA of the decode time per token"),
    "ts_queue": ("requests", "requests waiting, all bins"),
}
TIME_POINTS = 241


def variables(spec: SweepSpec) -> dict:
    """The variables of a sweep's Dataset (without the time series)."""
    return VARIABLES if spec.policy == "multibin" else TOKEN_VARIABLES


def rep_vars(spec: SweepSpec) -> list:
    return [v for v, d in variables(spec).items() if d[0]]


def time_grid(spec: SweepSpec):
    """Times (s) the load-step time series are sampled at, or None."""
    if spec.arrivals != "step":
        return None
    up = max(spec.axes.get("t_up", [spec.params.get("t_up")]))
    down = max(spec.axes.get("t_down", [spec.params.get("t_down")]))
    return np.linspace(0.0, 2.0 * down - up, TIME_POINTS)


REP_VARS = [v for v, spec in VARIABLES.items() if spec[0]]
POINT_VARS = [v for v, spec in VARIABLES.items() if not spec[0]]
#: per-rep variable -> its mean and CI variables
AGGREGATES = {
    "sim_throughput": ("sim_throughput_mean", "sim_throughput_ci_low", "sim_throughput_ci_high"),
    "sim_mean_latency": ("sim_mean_latency_mean", "sim_mean_latency_ci_low", "sim_mean_latency_ci_high"),
    "sim_mean_batch_service": ("sim_mean_batch_service_mean", None, None),
    "sim_latency_p95": ("sim_latency_p95_mean", None, None),
    "sim_sla_violation_tokens": ("sim_sla_violation_tokens_mean", None, None),
    "sim_batch_size_mean": ("sim_batch_size_mean_mean", None, None),
}

_FILL = {"f8": np.nan, "i8": -1, "bool": False}


def coord_values(name: str, values) -> np.ndarray:
    """A grid axis's values as stored in its coordinate."""
    p = PARAMS[name]
    if p.kind == "servers":
        return np.array([float(v) for v in values])
    if p.kind == "count":
        return np.array(values, dtype=np.int64)
    if p.kind == "choice":
        return np.array(values, dtype=object)  # variable-length strings: a zarr v3 data type
    return np.array(values, dtype=np.float64)


def _coord(spec: SweepSpec, name: str, values) -> tuple:
    p = PARAMS[name]
    data = coord_values(name, values)
    attrs = {"units": p.units, "long_name": name.replace("_", " "), "description": p.description}
    if p.kind == "servers":
        attrs["description"] += " (inf: infinitely many)"
    return (name,), data, attrs


def template(spec: SweepSpec, attrs: dict):
    """The Dataset of a sweep before any cell is computed: simulated variables
    at their fill values (NaN, -1, False), nothing done."""
    import xarray as xr

    dims = list(spec.axes)
    shape = spec.shape
    coords = {nm: _coord(spec, nm, vals) for nm, vals in spec.axes.items()}
    coords["rep"] = (("rep",), np.arange(spec.reps), {"units": "1", "long_name": "replication",
                                                       "description": "independent replication index"})
    data = {}
    for name, (per_rep, dtype, units, desc) in variables(spec).items():
        vdims = dims + ["rep"] if per_rep else dims
        vshape = shape + (spec.reps,) if per_rep else shape
        arr = np.full(vshape, _FILL[dtype], dtype=dtype)
        data[name] = (vdims, arr, {"units": units, "long_name": name.replace("_", " "), "description": desc})
    grid = time_grid(spec)
    if grid is not None:
        coords["time"] = (("time",), grid, {"units": "s", "long_name": "time",
                                            "description": "time since the first arrival's clock start"})
        for name, (units, desc) in TIME_SERIES.items():
            data[name] = (dims + ["rep", "time"], np.full(shape + (spec.reps, grid.size), np.nan),
                          {"units": units, "long_name": name.replace("_", " "), "description": desc})
    return xr.Dataset(data, coords=coords, attrs=attrs)


def fixed_param_attrs(spec: SweepSpec) -> dict:
    """Fixed parameter values as Dataset attrs (inf as the string "inf")."""
    return {k: ("inf" if v == math.inf else v) for k, v in spec.params.items()}
