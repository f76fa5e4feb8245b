"""One grid point of a sweep: its seeds, its simulations and its closed forms.

These functions are what workers run (in-process, in a process pool or on a
dask cluster); they take and return plain Python and numpy values only.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings

import numpy as np
import scipy.stats as st

from . import theory
from .arrivals import Poisson, Saturated
from .policies import MultiBin
from .results import UnstableWarning, backlog_growing  # noqa: F401  (backlog_growing: the sweeps' check)
from .simulation import check_simulation, simulate
from .spec import WORKLOAD_PARAMS, SpecError

__all__ = ["SEED_SCHEME", "cell_seed", "run_point", "point_theory", "check_points", "point_objects",
           "SIM_METRICS", "backlog_growing"]

SEED_SCHEME = (
    "SeedSequence(entropy=<spec seed>, spawn_key=(w0, ..., w7, rep)), where w0..w7 are the "
    "eight big-endian 32-bit words of SHA-256 over the canonical JSON of the cell's workload "
    "parameters (" + ", ".join(WORKLOAD_PARAMS) + ", those that apply); stream 0 of it draws "
    "the arrivals and stream 1 the service times (PCG64DXSM).  Policy parameters do not enter "
    "the seed: cells that differ only in policy see the same requests."
)

#: SimulationResult attribute -> Dataset variable, for the per-rep metrics
SIM_METRICS = {
    "throughput": "sim_throughput",
    "mean_latency": "sim_mean_latency",
    "latency_p50": "sim_latency_p50",
    "latency_p95": "sim_latency_p95",
    "latency_p99": "sim_latency_p99",
    "utilization": "sim_utilization",
    "mean_batch_service": "sim_mean_batch_service",
    "mean_fill_wait": "sim_mean_fill_wait",
    "mean_queue_wait": "sim_mean_queue_wait",
    "completed": "completed",
    "excluded_partial": "excluded_partial",
    "n_batches": "n_batches",
}


def _canonical(params: dict) -> str:
    enc = {k: ("inf" if v == math.inf else v) for k, v in params.items() if k in WORKLOAD_PARAMS}
    return json.dumps(enc, sort_keys=True, separators=(",", ":"))


def cell_seed(root_seed: int, params: dict, rep: int) -> np.random.SeedSequence:
    """The SeedSequence of one cell (see :data:`SEED_SCHEME`)."""
    digest = hashlib.sha256(_canonical(params).encode()).digest()
    words = tuple(int.from_bytes(digest[i:i + 4], "big") for i in range(0, 32, 4))
    return np.random.SeedSequence(root_seed, spawn_key=(*words, rep))


def _service_dist(service: str, params: dict):
    if service == "uniform":
        return st.uniform(params["l_min"], params["l_max"] - params["l_min"])
    return st.expon(scale=1.0 / params["mu"])


def _edges(service: str, params: dict):
    k = params["bins"]
    if params.get("edges") == "lemma_a1":
        return theory.exponential_boundaries(params["batch_size"], params["mu"], k)
    return None  # equal mass, computed by simulate


#: TokenSimulationResult metric -> Dataset variable, for the token policies
TOKEN_METRICS = {
    "throughput": "sim_throughput",
    "mean_latency": "sim_mean_latency",
    "latency_p50": "sim_latency_p50",
    "latency_p95": "sim_latency_p95",
    "latency_p99": "sim_latency_p99",
    "gpu_utilization": "sim_utilization",
    "token_throughput": "sim_token_throughput",
    "mean_ttft": "sim_mean_ttft",
    "mean_tbt": "sim_mean_tbt",
    "sla_violation_tokens": "sim_sla_violation_tokens",
    "sla_violation_requests": "sim_sla_violation_requests",
    "memory_peak": "sim_memory_peak",
    "memory_mean": "sim_memory_mean",
    "batch_size_mean": "sim_batch_size_mean",
    "batch_size_std": "sim_batch_size_std",
    "completed": "completed",
    "n_batches": "n_batches",
    "mem_exceed_batches": "mem_exceed_batches",
    "rejected": "rejected",
}
_INT_VARS = ("completed", "excluded_partial", "n_batches", "mem_exceed_batches", "rejected")


def _token_objects(policy: str, arrivals: str, model: str, params: dict):
    from .arrivals import PiecewisePoisson
    from .policies import DynamicBatching, MultiBinDynamic, StaticBatching
    from .workload import DecodeModel, LinearModel, MaxModel, Memory, SLAController, Workload

    if arrivals == "poisson":
        arr = Poisson(rate=params["rate"])
    elif arrivals == "step":
        arr = PiecewisePoisson([params["rate"], params["rate_high"], params["rate"]],
                               [params["t_up"], params["t_down"]])
    else:
        arr = Saturated()
    wl = Workload(prompt=st.lognorm(params["prompt_sigma"], scale=params["prompt_median"]),
                  output=st.lognorm(params["output_sigma"], scale=params["output_median"]))
    svc = {"decode": DecodeModel, "linear": LinearModel, "max": MaxModel}[model]()
    # eta tokens of capacity: 1 GB per token keeps the units plain
    mem_kw = dict(m_max_gb=params["eta"] + 1.0, m_model_gb=1.0, kv_mem_per_token_gb=1.0)
    if policy == "static":
        sla = SLAController(d_sla=params["d_sla"], eps_d=params.get("eps_d", 0.0))
        mem = Memory(enabled=False, **mem_kw)
        return StaticBatching(params["batch_size"], sla=sla, memory=mem), arr, wl, svc, mem
    mem = Memory(variant="l0" if params["memory"] == "off" else params["memory"], eps_m=params["eps_m"],
                 enabled=params["memory"] != "off", **mem_kw)
    ctl = SLAController(d_sla=params["d_sla"], eps_d=params["eps_d"], b_min=params["b_min"],
                        b_max=params["b_max"], variant=params["controller"])
    if policy == "dynamic":
        return DynamicBatching(controller=ctl, memory=mem), arr, wl, svc, mem
    return (MultiBinDynamic(bins=params["bins"], controller=ctl, memory=mem, selection=params["selection"],
                            warmup=params["warmup"]), arr, wl, svc, mem)


def point_objects(policy: str, arrivals: str, service: str, params: dict) -> tuple:
    """The :func:`~mbbatch.simulate` arguments of one grid point: the policy,
    the arrival process and the keyword arguments of the service side."""
    if policy == "multibin":
        pol = MultiBin(bins=params["bins"], batch_size=params["batch_size"],
                       edges=_edges(service, params), max_wait=params.get("max_wait", math.inf))
        arr = Poisson(rate=params["rate"]) if arrivals == "poisson" else Saturated()
        return pol, arr, {"service": _service_dist(service, params)}
    pol, arr, wl, svc, _ = _token_objects(policy, arrivals, service, params)
    return pol, arr, {"workload": wl, "service_model": svc}


def check_points(spec) -> None:
    """Everything a sweep would refuse at any of its grid points, refused now,
    before the store exists: every point's objects are built and its
    simulation checked (without simulating), its closed forms evaluated, and
    the store's template bounded in memory.  Raises :class:`SpecError` naming
    the spec file, the grid point and the parameter."""
    from ._running import check_memory
    from .schema import TIME_POINTS, TIME_SERIES, rep_vars, variables

    per_rep = len(rep_vars(spec)) + (len(TIME_SERIES) * TIME_POINTS if spec.arrivals == "step" else 0)
    per_point = len(variables(spec)) - len(rep_vars(spec))
    try:
        check_memory({"reps": (spec.n_points * (8 * spec.reps * per_rep + 8 * per_point),
                               "the store's values (grid points x reps x variables)")})
    except ValueError as exc:
        raise SpecError(f"{spec.source}: {exc}") from None
    for idx, params in spec.points():
        where = ", ".join(f"{nm}={params[nm]!r}" for nm in spec.axes)
        where = f"at grid point {where}" if where else "at its one grid point"
        try:
            pol, arr, kw = point_objects(spec.policy, spec.arrivals, spec.service, params)
            check_simulation(pol, arr, n=params["n"], servers=params["servers"], **kw)
            point_theory(spec.arrivals, spec.service, params, spec.policy)
        except (ValueError, TypeError, OverflowError, ZeroDivisionError) as exc:
            raise SpecError(f"{spec.source}: {where}: {exc}") from None


def run_point(policy: str, arrivals: str, service: str, params: dict, root_seed: int, reps: int,
              time_grid=None) -> dict:
    """Simulate every rep of one grid point; return per-rep metric arrays."""
    if policy != "multibin":
        return _run_token_point(policy, arrivals, service, params, root_seed, reps, time_grid)
    return _run_multibin_point(arrivals, service, params, root_seed, reps)


def _run_token_point(policy, arrivals, model, params, root_seed, reps, time_grid):
    pol, arr, wl, svc, mem = _token_objects(policy, arrivals, model, params)
    out = {var: np.empty(reps) for var in TOKEN_METRICS.values()}
    out["backlog_growing"] = np.zeros(reps, dtype=bool)
    out["sla_infeasible"] = np.zeros(reps, dtype=bool)
    if time_grid is not None:
        for var in ("ts_b_target", "ts_b_low", "ts_b_high", "ts_tau_avg", "ts_queue"):
            out[var] = np.full((reps, time_grid.size), np.nan)
    for rep in range(reps):
        with warnings.catch_warnings():
            # the sweep reports its unstable cells together, at its end
            warnings.simplefilter("ignore", UnstableWarning)
            res = simulate(pol, arrivals=arr, workload=wl, service_model=svc, n=params["n"],
                           servers=params["servers"], seed=cell_seed(root_seed, params, rep))
        for attr, var in TOKEN_METRICS.items():
            out[var][rep] = getattr(res, attr)
        out["sla_infeasible"][rep] = bool(res.sla_infeasible)
        ts = res.time_series
        if arrivals == "poisson":
            out["backlog_growing"][rep] = res.unstable
        if time_grid is not None and ts["time"].size:
            # the value in force at each grid time: the last sampled batch start before it
            at = np.searchsorted(ts["time"], time_grid, side="right") - 1
            ok = at >= 0
            for var, col in (("ts_b_target", "b_target"), ("ts_b_low", "b_low"), ("ts_b_high", "b_high"),
                             ("ts_tau_avg", "tau_avg")):
                out[var][rep, ok] = ts[col][at[ok]]
            out["ts_queue"][rep, ok] = ts["queue"].sum(axis=1)[at[ok]]
    for var in _INT_VARS:
        if var in out:
            out[var] = out[var].astype(np.int64)
    return out


def _run_multibin_point(arrivals: str, service: str, params: dict, root_seed: int, reps: int) -> dict:
    """Simulate every rep of one multi-bin grid point."""
    policy, arr, kw = point_objects("multibin", arrivals, service, params)
    dist = kw["service"]
    out = {var: np.empty(reps) for var in SIM_METRICS.values()}
    out["backlog_growing"] = np.zeros(reps, dtype=bool)
    for rep in range(reps):
        with warnings.catch_warnings():
            # the sweep reports its unstable cells together, at its end
            warnings.simplefilter("ignore", UnstableWarning)
            res = simulate(policy, arrivals=arr, service=dist, n=params["n"],
                           servers=params["servers"], seed=cell_seed(root_seed, params, rep))
        for attr, var in SIM_METRICS.items():
            out[var][rep] = getattr(res, attr)
        if arrivals == "poisson":
            out["backlog_growing"][rep] = res.unstable
    for var in ("completed", "excluded_partial", "n_batches"):
        out[var] = out[var].astype(np.int64)
    return out


def point_theory(arrivals: str, service: str, params: dict, policy: str = "multibin") -> dict:
    """Closed-form predictions at one grid point (NaN where none applies).

    The multi-bin closed forms assume batches of exactly B: with a finite
    ``max_wait`` they are left NaN, and the token policies have none."""
    if policy != "multibin":
        return {"unstable": False}
    if params.get("max_wait", math.inf) < math.inf:
        nan = math.nan
        return {"theory_mean_batch_service": nan, "theory_service_rate": nan, "capacity": nan,
                "theory_throughput_bound": nan, "theory_throughput": nan, "theory_latency": nan,
                "unstable": False}
    B, k, servers = params["batch_size"], params["bins"], params["servers"]
    dist = _service_dist(service, params)
    if service == "uniform" and params.get("edges", "equal_mass") == "equal_mass":
        es = theory.service_time(B, params["l_min"], params["l_max"], k)        # Theorem 4.2
    else:
        edges = _edges(service, params)
        if edges is None:
            edges = dist.ppf(np.linspace(0.0, 1.0, k + 1))
        es = theory.batch_service_time(dist, edges, B)
    mean_one = float(dist.mean())
    rate_s = servers * B / es if servers != math.inf else math.inf
    out = {
        "theory_mean_batch_service": es,
        "theory_service_rate": rate_s,
        "capacity": servers * B / mean_one if servers != math.inf else math.inf,
        "theory_throughput_bound": math.nan,
        "theory_throughput": rate_s,
        "theory_latency": math.nan,
    }
    if service == "expon" and params.get("edges") == "lemma_a1":
        bound = theory.exponential_throughput_bound(B, params["mu"], k)         # Corollary A.1.1
        out["theory_throughput_bound"] = servers * bound if servers != math.inf else math.inf
    if arrivals == "poisson":
        lam = params["rate"]
        out["theory_throughput"] = min(lam, rate_s)
        # Lemma 5.1, eq. (7), for any edges: a request waits (B-1)/(2 lam p_i)
        # for its bin's batch to fill, and sum_i p_i (B-1)/(2 lam p_i) = k(B-1)/(2 lam)
        out["theory_latency"] = es + (B - 1) * k / (2.0 * lam)
    out["unstable"] = bool(arrivals == "poisson" and params["rate"] >= rate_s)
    return {key: (float(v) if key != "unstable" else v) for key, v in out.items()}
