"""Small synthetic datasets of the sweep schema, for the figure tests.

The datasets below have the shape ``mbbatch sweep`` writes (one dimension per
grid axis plus ``rep``, per-rep ``sim_*`` variables, their means and 95%
t-intervals, closed forms on the same coordinates, ``unstable`` and ``done``)
with made-up simulated values around the closed forms.  ``results`` writes
them all into one folder, once per session; ``drawn`` draws every figure
from it, once.  A test module uses them with
``from .figure_datasets import MARKS, drawn, results`` and ``pytestmark = MARKS``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import scipy.stats as st
import xarray as xr

from mbbatch import figures, theory
from mbbatch.sweeps import parse_spec, schema

#: Marks for every figure test module: warnings that writing these stores raises.
MARKS = [pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning"),
         # the controller coordinate is a fixed-length string, as in the real store
         pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3")]

REPS = 3

_UNITS = {
    "sim_throughput": "requests/s", "sim_mean_latency": "s", "sim_latency_p50": "s",
    "sim_latency_p95": "s", "sim_latency_p99": "s", "sim_utilization": "1",
    "sim_mean_batch_service": "s", "completed": "requests", "excluded_partial": "requests",
    "backlog_growing": "1", "theory_mean_batch_service": "s", "theory_service_rate": "requests/s",
    "theory_throughput": "requests/s", "theory_latency": "s", "capacity": "requests/s",
    "theory_throughput_bound": "requests/s", "unstable": "1", "done": "1",
}


def _attrs(name):
    base = name
    for suffix in ("_mean", "_ci_low", "_ci_high"):
        base = base.removesuffix(suffix)
    return {"units": _UNITS.get(base, "1"), "long_name": name.replace("_", " "),
            "description": f"synthetic {name}"}


def _sweep(name, axes, cell, *, attrs, saturated=False, reps=REPS, seed=0):
    """A sweep dataset over ``axes`` (dict name -> values).

    ``cell(**point)`` returns (E[t_service], saturated throughput, capacity,
    Corollary A.1.1 bound or NaN, k, B, servers) for one grid point.
    """
    rng = np.random.default_rng(seed)
    names = list(axes)
    shape = tuple(len(v) for v in axes.values())
    out = {v: np.full(shape, np.nan) for v in
           ("theory_mean_batch_service", "theory_service_rate", "theory_throughput",
            "theory_latency", "capacity", "theory_throughput_bound")}
    unstable = np.zeros(shape, bool)
    thr = np.full(shape + (reps,), np.nan)
    lat = np.full(shape + (reps,), np.nan)
    for idx in np.ndindex(*shape):
        point = {n: axes[n][i] for n, i in zip(names, idx)}
        ets, sr, cap, bound, k, B, servers = cell(**point)
        out["theory_mean_batch_service"][idx] = ets
        out["theory_service_rate"][idx] = sr
        out["capacity"][idx] = cap
        out["theory_throughput_bound"][idx] = bound
        if saturated:
            out["theory_throughput"][idx] = sr
            thr[idx] = sr * (1 + 0.004 * rng.standard_normal(reps))
            lat[idx] = 1e3 * (1 + 0.01 * rng.standard_normal(reps))
            continue
        rate = point["rate"]
        out["theory_throughput"][idx] = min(rate, sr)
        lem = ets + (B - 1) * k / (2 * rate)
        out["theory_latency"][idx] = lem
        rho = rate / sr
        unstable[idx] = rho >= 1
        if rho >= 1:
            thr[idx] = sr * (1 + 0.01 * rng.standard_normal(reps))
            lat[idx] = 5e3 * (1 + 0.05 * rng.standard_normal(reps))
        else:
            extra = 0.0 if math.isinf(servers) else ets * rho ** (2 * servers) / (1 - rho)
            thr[idx] = rate * (1 + 0.01 * rng.standard_normal(reps))
            lat[idx] = (lem + extra) * (1 + 0.02 * rng.standard_normal(reps))

    dims = tuple(names)
    rdims = dims + ("rep",)
    t = st.t.ppf(0.975, reps - 1)
    data = {}
    for var, x in (("sim_throughput", thr), ("sim_mean_latency", lat)):
        m, h = x.mean(-1), t * x.std(-1, ddof=1) / math.sqrt(reps)
        data[var] = (rdims, x)
        data[f"{var}_mean"] = (dims, m)
        data[f"{var}_ci_low"] = (dims, m - h)
        data[f"{var}_ci_high"] = (dims, m + h)
    for q, f in (("p50", 0.9), ("p95", 1.8), ("p99", 2.3)):
        data[f"sim_latency_{q}"] = (rdims, lat * f)
    data["sim_utilization"] = (rdims, np.clip(thr / out["theory_service_rate"][..., None], 0, 1))
    sim_ets = out["theory_mean_batch_service"][..., None] * (1 + 0.003 * rng.standard_normal(thr.shape))
    data["sim_mean_batch_service"] = (rdims, sim_ets)
    data["sim_mean_batch_service_mean"] = (dims, sim_ets.mean(-1))
    data["completed"] = (rdims, np.full(thr.shape, int(attrs["n"]) - 100))
    data["excluded_partial"] = (rdims, np.full(thr.shape, 100))
    data["backlog_growing"] = (rdims, np.broadcast_to(unstable[..., None], thr.shape).copy())
    for var, x in out.items():
        data[var] = (dims, x)
    data["unstable"] = (dims, unstable)
    data["done"] = (dims, np.ones(shape, bool))
    floats = ("rate", "servers", "mu", "max_wait", "cv", "predictor_sigma", "predictor_p")
    coords = {n: np.asarray(v, dtype=float if n in floats else int)
              for n, v in axes.items()}
    coords["rep"] = np.arange(reps)
    ds = xr.Dataset(data, coords=coords)
    for var in ds.data_vars:
        ds[var].attrs.update(_attrs(var))
    for n in names:
        ds[n].attrs.update(units={"rate": "requests/s", "servers": "servers"}.get(n, "1"),
                           long_name=n)
    ds.attrs.update(name=name, spec=f"# synthetic spec for {name}\n", spec_hash="0" * 16,
                    reps=reps, arrivals="saturated" if saturated else "poisson", **attrs)
    return ds


def _uniform_cell(B=128, l_min=1.0, l_max=20.0, bins=None, servers=1.0):
    """Closed forms for uniform service; ``bins``/``servers`` when not an axis."""
    def cell(**point):
        k = int(point.get("bins", bins))
        c = float(point.get("servers", servers))
        ets = float(theory.service_time(B, l_min, l_max, k))
        sr = c * B / ets
        cap = c * float(theory.capacity(B, l_min, l_max))
        return ets, sr, cap, np.nan, k, B, c
    return cell


def _uniform_attrs(**extra):
    return {**dict(batch_size=128, l_min=1.0, l_max=20.0, n=128000, service="uniform", edges="equal_mass"),
            **extra}


def _trace_attrs(**extra):
    return dict(batch_size=8, service="max", trace_file="AzureLLMInferenceTrace_conv.csv", base=0.0,
                per_token=0.00574, edges="equal_mass", **extra)


def _expon_cell(B=200, mu=0.1):
    @functools.lru_cache(maxsize=None)
    def closed_forms(k):
        edges = theory.exponential_boundaries(B, mu, k)
        ets = float(theory.batch_service_time(st.expon(scale=1 / mu), edges, B))
        bound = float(theory.exponential_throughput_bound(B, mu, k))
        return ets, B / ets, B * mu, bound, k, B, 1.0

    def cell(**point):
        return closed_forms(int(point["bins"]))
    return cell


def _fig1b():
    service = np.array([1.0, 5.0, 2.0, 6.0])
    bins = np.array([[0, 0, 0, 0], [0, 1, 0, 1]])
    batch = np.array([[0, 0, 1, 1], [0, 1, 0, 1]])
    start = np.array([[0.0, 0.0, 5.0, 5.0], [0.0, 2.0, 0.0, 2.0]])
    completion = np.array([[5.0, 5.0, 11.0, 11.0], [2.0, 8.0, 2.0, 8.0]])
    ds = xr.Dataset(
        {"service": ("request", service), "bin": (("case", "request"), bins),
         "batch": (("case", "request"), batch), "start": (("case", "request"), start),
         "completion": (("case", "request"), completion)},
        coords={"case": ["one_bin", "two_bins"], "request": np.arange(4)},
        attrs={"batch_size": 2, "makespan_one_bin": 11.0, "makespan_two_bins": 8.0},
    )
    for var in ds.data_vars:
        ds[var].attrs.update(units="s" if var in ("service", "start", "completion") else "1",
                             long_name=var, description=f"synthetic {var}")
    return ds


# ---------------------------------------------------------------- dynamic batching experiments

_TOKEN_ATTRS = dict(prompt_median=256.0, prompt_sigma=0.6, output_median=128.0, output_sigma=1.0,
                    d_sla=0.0074, eps_d=0.00001, eta=40000.0, service="decode",
                    confidence_level=0.95, servers=1)
STEP = dict(rate=1.0, rate_high=3.0, t_up=2000.0, t_down=4000.0)
#: the synthetic controller_step's b_target: 70, down to 12 SETTLE_UP s after the
#: step up, back to 70 SETTLE_DOWN s after the step down (spec controller)
SETTLE_UP, SETTLE_DOWN = 300.0, 1000.0


def _token_sweep(name, axes, cell, *, policies, attrs, reps=REPS, seed=0, arrivals="poisson",
                 time_series=None, service_model="decode"):
    """A sweep dataset of token policies over ``axes``, with the variables the
    sweep schema gives a spec of these ``policies`` (variant name -> settings
    with ``kind``; one variant: no policy axis).

    ``cell(**point)`` returns (capacity in requests/s, SLA violation share) of one
    grid point; ``time_series(point, rep, time)`` the ts_* values (load steps).
    """
    single = len(policies) == 1
    toml = [f'name = "{name}"', f'arrivals = "{arrivals}"', f'service_model = "{service_model}"',
            f"reps = {reps}", "seed = 1"]
    if single:
        toml.append(f'policy = "{next(iter(policies.values()))["kind"]}"')
    toml.append("[params]")
    toml += [f"{k} = {float(v)!r}" for k, v in (("prompt_median", 256.0), ("prompt_sigma", 0.6),
                                                 ("output_median", 128.0), ("output_sigma", 1.0),
                                                 ("d_sla", 0.0074), ("eta", 40000.0))]
    toml += [f"{k} = {v!r}" for k, v in attrs.items() if k in ("n", "b_max", "rate", "rate_high", "t_up",
                                                                 "t_down")]
    if not single:
        for vname, settings in policies.items():
            toml.append(f"[policies.{vname}]")
            toml += [f'{k} = {v!r}' if not isinstance(v, str) else f'{k} = "{v}"' for k, v in settings.items()]
    toml.append("[grid]")
    toml += [f"{k} = {[str(x) if k in ('policy', 'controller') else x for x in v]!r}".replace("'", '"')
             for k, v in axes.items()]
    spec = parse_spec("\n".join(toml) + "\n", source=f"synthetic {name}")
    variables = schema.variables(spec)
    rng = np.random.default_rng(seed)
    names = list(axes)
    shape = tuple(len(v) for v in axes.values())
    rdims = tuple(names) + ("rep",)
    per_rep = {v: np.full(shape + (reps,), np.nan) for v, d in variables.items() if d[0]}
    unstable = np.zeros(shape, bool)
    time = None
    if time_series is not None:
        time = schema.time_grid(spec)
        ts = {v: np.full(shape + (reps, time.size), np.nan) for v in schema.TIME_SERIES}
    for idx in np.ndindex(*shape):
        point = {n: axes[n][i] for n, i in zip(names, idx)}
        cap, sla = cell(**point)
        rate = point.get("rate", attrs.get("rate"))
        rho = rate / cap
        unstable[idx] = 0.97 <= rho < 1.3  # the sweep's flag misses heavier overload
        noise = 1 + 0.01 * rng.standard_normal(reps)
        per_rep["sim_throughput"][idx] = min(rate, cap) * noise
        lat = 3.0 / max(1 - rho, 0.02) if rho < 1 else 500.0 * rho
        per_rep["sim_mean_latency"][idx] = lat * noise
        for q, f in (("p50", 0.8), ("p95", 3.0), ("p99", 4.0)):
            per_rep[f"sim_latency_{q}"][idx] = f * lat * noise
        per_rep["sim_sla_violation_tokens"][idx] = np.clip(sla * noise, 0, 1)
        per_rep["sim_sla_violation_requests"][idx] = np.clip(0.9 * sla * noise, 0, 1)
        per_rep["sim_mean_batch_size"][idx] = 1 + 10 * min(rho, 1) * noise
        per_rep["sim_std_batch_size"][idx] = 0.5 * per_rep["sim_mean_batch_size"][idx]
        per_rep["sim_utilization"][idx] = min(rho, 1.0) * noise / noise.max()
        per_rep["sim_token_throughput"][idx] = 211 * per_rep["sim_throughput"][idx]
        per_rep["sim_mean_ttft"][idx] = per_rep["sim_mean_latency"][idx] * 0.9
        per_rep["sim_mean_tbt"][idx] = 0.0072
        per_rep["sim_memory_peak"][idx] = 0.5 * noise
        per_rep["sim_mean_memory"][idx] = 0.2 * noise
        per_rep["sim_mean_batch_service"][idx] = 2.0 * noise
        if time_series is not None:
            for r in range(reps):
                for v, x in time_series(point, r, time).items():
                    ts[v][idx + (r,)] = x
    data = {}
    for v, (is_rep, dtype, units, desc) in variables.items():
        if not is_rep:
            continue
        x = per_rep[v]
        if dtype == "i8":
            x = np.full(shape + (reps,), {"completed": int(attrs["n"]), "n_batches": 1000}.get(v, 0))
        elif dtype == "bool":
            x = (np.broadcast_to(unstable[..., None], x.shape).copy() if v == "backlog_growing"
                 else np.zeros(x.shape, bool))
        data[v] = (rdims, x)
    t = st.t.ppf(0.975, reps - 1)
    for base, (m, lo, hi) in schema.aggregates(spec).items():
        x = per_rep[base]
        data[m] = (tuple(names), x.mean(-1))
        if lo is not None:
            h = t * x.std(-1, ddof=1) / math.sqrt(reps)
            data[lo] = (tuple(names), x.mean(-1) - h)
            data[hi] = (tuple(names), x.mean(-1) + h)
    data["unstable"] = (tuple(names), unstable)
    data["done"] = (tuple(names), np.ones(shape, bool))
    coords = {}
    for n, v in axes.items():
        coords[n] = np.asarray(v, dtype=str if n in ("controller", "policy") else float if n == "rate" else int)
    coords["rep"] = np.arange(reps)
    if time is not None:
        coords["time"] = time
        for v in schema.TIME_SERIES:
            data[v] = (rdims + ("time",), ts[v])
    ds = xr.Dataset(data, coords=coords)
    for v in ds.data_vars:
        d = variables.get(v) or (None, None) + schema.TIME_SERIES[v]
        ds[v].attrs.update(units=d[2], long_name=v.replace("_", " "), description=f"synthetic {v}")
    ds["rate" if "rate" in ds.coords else names[0]].attrs.update(units="requests/s")
    if time is not None:
        ds["time"].attrs.update(units="s", long_name="time")
    ds.attrs.update({**_TOKEN_ATTRS, **attrs, **schema.spec_attrs(spec)})
    ds.attrs.update(name=name, spec=spec.text, spec_hash="0" * 16, reps=reps, arrivals=arrivals)
    return ds


def _sla_share(rate, knee):
    return 1.0 / (1.0 + math.exp(-3.0 * (rate - knee)))


def _step_series(point, rep, time):
    """b_target etc. through the load step; the multiplicative variant settles later."""
    late = 1.0 if point["controller"] == "spec" else 1.5
    up, down = STEP["t_up"], STEP["t_down"]
    wiggle = 1 + 0.03 * np.sin(time / 50.0 + rep)
    b = np.where(time < up + late * SETTLE_UP, 70.0, 12.0)
    b = np.where(time >= down + late * SETTLE_DOWN, 70.0, b)
    b = np.where(time < up, 70.0, b) * wiggle
    high = (time >= up) & (time < down + late * SETTLE_DOWN)
    out = {"ts_b_target": b,
           "ts_b_low": np.where(high, 10.0, 6.0),
           "ts_b_high": np.where(high, 14.0, 256.0),
           "ts_tau_avg": np.where(high, 0.0074, 0.0062) * (1 + 0.01 * np.cos(time / 30.0 + rep)),
           "ts_queue": np.where(high, 500.0, 0.0)}
    for x in out.values():
        x[0] = np.nan  # before the first batch
    return out


#: synthetic capacity (requests/s) of each token-policy variant
POLICY_CAPS = {"static8": 1.7, "static32": 3.7, "static128": 6.5, "dynamic": 2.1, "mb4": 3.8}


def write_token_results(path):
    rates = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0]
    dsets = {
        "mb_only": _sweep("mb_only", {"bins": [1, 2, 4, 8]}, _uniform_cell(B=32),
                          attrs={**_uniform_attrs(servers=1.0), "batch_size": 32}, saturated=True),
        "token_policies": _token_sweep(
            "token_policies", {"policy": list(POLICY_CAPS), "rate": rates},
            lambda policy, rate: (POLICY_CAPS[policy], 0.0 if policy == "static8" else
                                  _sla_share(rate, {"dynamic": 1.8, "mb4": 3.2}.get(policy, 2.0))),
            policies={"static8": {"kind": "static", "batch_size": 8},
                      "static32": {"kind": "static", "batch_size": 32},
                      "static128": {"kind": "static", "batch_size": 128},
                      "dynamic": {"kind": "dynamic"},
                      "mb4": {"kind": "multibin_dynamic", "bins": 4, "warmup": 1000}},
            attrs=dict(n=20000, b_max=256), seed=1),
        "controller_step": _token_sweep("controller_step", {"controller": ["spec", "multiplicative"]},
                                        lambda controller: (2.1, 0.7), policies={"dynamic": {"kind": "dynamic"}},
                                        arrivals="step", time_series=_step_series, reps=5, seed=4,
                                        attrs=dict(n=10000, b_min=1, b_max=256, **STEP)),
    }
    mw = _sweep("max_wait", {"max_wait": [2.0, 5.0, 10.0, 20.0, 50.0, 100.0, math.inf],
                             "rate": [1.0, 2.0, 4.0, 6.0, 8.0, 9.5]},
                _uniform_cell(bins=4), attrs=_uniform_attrs(bins=4, servers=1.0), seed=5)
    finite = np.isfinite(mw["max_wait"].values)
    for v in ("theory_mean_batch_service", "theory_service_rate", "theory_throughput", "theory_latency",
              "capacity"):  # closed forms only for the classic policy
        mw[v] = mw[v].where(~xr.DataArray(finite, dims="max_wait"))
    short = xr.DataArray(mw["max_wait"].values <= 5.0, dims="max_wait")
    for v in ("sim_throughput", "sim_throughput_mean", "sim_throughput_ci_low", "sim_throughput_ci_high"):
        mw[v] = mw[v].where(~short, mw[v] * 0.1)  # tiny batches: the server saturates early
    for v in ("sim_mean_latency", "sim_mean_latency_mean", "sim_mean_latency_ci_low", "sim_mean_latency_ci_high"):
        mw[v] = mw[v].where(~short, mw[v] * 1000.0)  # and the backlog's latency grows with the run
    mw["unstable"] = mw["unstable"] | short
    dsets["max_wait"] = mw
    dsets.update(_hardware_sweeps(rates))
    for name, ds in dsets.items():
        ds.to_zarr(path / f"{name}.zarr", mode="w")
    return path


#: synthetic capacities (requests/s) of the hardware figures' variants: policy, then by GPU
HARDWARE_CAPS = {"static8": (1.5, 0.8), "static32": (3.3, 1.7), "dynamic": (5.1, 2.7), "mb4": (6.8, 3.9)}


def _hardware_sweeps(rates):
    """The stores of hardware_policies and hardware_trace (the policies on two profiles) and of
    hardware_trace_default (on the default DecodeModel)."""
    kinds = {"static8": {"kind": "static", "batch_size": 8}, "static32": {"kind": "static", "batch_size": 32},
             "dynamic": {"kind": "dynamic"}, "mb4": {"kind": "multibin_dynamic", "bins": 4, "warmup": 1000}}
    gpus = {"_h100": ("H100/vLLM/Meta-Llama-3-8B/tp1", 0.0101), "_a100": ("A100/vLLM/Meta-Llama-3-8B/tp1", 0.0179)}
    variants = {p + g: {**settings, "profile": prof, "d_sla": d} for g, (prof, d) in gpus.items()
                for p, settings in kinds.items()}

    def cap(policy):
        base, gpu = (policy[:-5], policy[-5:]) if policy[-5:] in gpus else (policy, None)
        return HARDWARE_CAPS[base][0 if gpu in (None, "_h100") else 1]

    out = {}
    for name, seed in (("hardware_policies", 11), ("hardware_trace", 12)):
        out[name] = _token_sweep(name, {"policy": list(variants), "rate": rates},
                                 lambda policy, rate: (cap(policy), 0.0), policies=variants,
                                 attrs=dict(n=20000, b_max=256), seed=seed, service_model="profile")
    out["hardware_multibin"] = _hardware_multibin()
    out["continuous_vs_binned"] = _continuous_vs_binned()
    out["continuous_memory"] = _continuous_memory()
    out["policy_gains"] = _policy_gains()
    out["policy_gains_classes"] = _policy_gains_classes()
    out["continuous_controller"] = _continuous_controller()
    out["continuous_trace_capacity"], out["continuous_trace"] = _continuous_trace()
    out["hardware_trace_default"] = _token_sweep(
        "hardware_trace_default", {"policy": list(kinds), "rate": rates},
        lambda policy, rate: (HARDWARE_CAPS[policy][1] * 0.9, 0.1), policies=kinds, attrs=dict(n=20000, b_max=256),
        seed=13)
    return out


def _hardware_multibin(reps=REPS):
    """hardware_multibin's store: saturated multi-bin batching on two profiles, finished members leaving
    or staying; eq. (2) rising with the bins towards the capacity, the simulation within 1 % of it."""
    bins = np.array([1, 2, 4, 8, 16, 32, 64])
    profiles_ = ["H100/vLLM/Meta-Llama-3-8B/tp1", "A100/vLLM/Meta-Llama-3-8B/tp1"]
    finished = ["leave", "stay"]
    cap = np.array([13.5, 6.4])[None, :, None] * np.ones((bins.size, 2, 2))
    thm = cap * (1.0 - 0.75 / np.sqrt(bins))[:, None, None] * np.array([1.0, 0.8])[None, None, :]
    rng = np.random.default_rng(21)
    sim = thm[..., None] * (1.0 + 0.005 * rng.standard_normal(thm.shape + (reps,)))
    dims = ("bins", "profile", "finished")
    mean = sim.mean(axis=-1)
    ds = xr.Dataset({"theory_service_rate": (dims, thm), "capacity": (dims, cap),
                     "sim_throughput": (dims + ("rep",), sim), "sim_throughput_mean": (dims, mean),
                     "sim_throughput_ci_low": (dims, mean * 0.99), "sim_throughput_ci_high": (dims, mean * 1.01),
                     "unstable": (dims, np.zeros(thm.shape, bool)), "done": (dims, np.ones(thm.shape, bool))},
                    coords={"bins": bins, "profile": profiles_, "finished": finished, "rep": np.arange(reps)})
    ds.attrs.update(name="hardware_multibin", reps=reps, arrivals="saturated", batch_size=32)
    return ds


def _continuous_vs_binned(reps=REPS):
    """continuous_vs_binned's store: the continuous engine, saturated, at 32 and 256 running sequences on
    hardware_multibin's two profiles, above multi-bin batching's capacity."""
    seqs = np.array([32, 256])
    profiles_ = ["H100/vLLM/Meta-Llama-3-8B/tp1", "A100/vLLM/Meta-Llama-3-8B/tp1"]
    thr = np.array([[13.5, 6.5], [34.2, 13.5]])
    rng = np.random.default_rng(22)
    sim = thr[..., None] * (1.0 + 0.002 * rng.standard_normal(thr.shape + (reps,)))
    dims = ("max_num_seqs", "profile")
    mean = sim.mean(axis=-1)
    ds = xr.Dataset({"sim_throughput": (dims + ("rep",), sim), "sim_throughput_mean": (dims, mean),
                     "sim_throughput_ci_low": (dims, mean * 0.998), "sim_throughput_ci_high": (dims, mean * 1.002),
                     "unstable": (dims, np.zeros(thr.shape, bool)), "done": (dims, np.ones(thr.shape, bool))},
                    coords={"max_num_seqs": seqs, "profile": profiles_, "rep": np.arange(reps)})
    ds.attrs.update(name="continuous_vs_binned", reps=reps, arrivals="saturated")
    return ds


def _continuous_memory(reps=REPS, n=20000):
    """continuous_memory's store: preemptions falling and latency with them as the KV cache grows, the
    smallest cache overloaded."""
    kv = np.array([12000.0, 16000.0, 24000.0, 48000.0])
    adm = ["fcfs", "spf", "multibin"]
    shape = (kv.size, len(adm))
    rng = np.random.default_rng(23)
    pre = np.round(n * np.array([0.48, 0.19, 0.002, 0.0])[:, None, None] * np.ones(shape + (reps,)))
    p95 = np.array([1300.0, 6.0, 5.1, 5.1])[:, None] * np.ones(shape)
    thr = np.array([13.5, 15.0, 15.0, 15.0])[:, None, None] * (1 + 0.001 * rng.standard_normal(shape + (reps,)))
    dims = ("kv_tokens", "admission")
    mean = thr.mean(axis=-1)
    unstable = np.zeros(shape, bool)
    unstable[0] = True
    ds = xr.Dataset({"preemptions": (dims + ("rep",), pre.astype(np.int64)),
                     "completed": (dims + ("rep",), np.full(shape + (reps,), n, np.int64)),
                     "sim_latency_p95_mean": (dims, p95), "sim_latency_p95_ci_low": (dims, 0.9 * p95),
                     "sim_latency_p95_ci_high": (dims, 1.1 * p95), "sim_throughput": (dims + ("rep",), thr),
                     "sim_throughput_mean": (dims, mean), "sim_throughput_ci_low": (dims, mean * 0.999),
                     "sim_throughput_ci_high": (dims, mean * 1.001), "unstable": (dims, unstable),
                     "done": (dims, np.ones(shape, bool))},
                    coords={"kv_tokens": kv, "admission": adm, "rep": np.arange(reps)})
    ds.attrs.update(name="continuous_memory", reps=reps, arrivals="poisson", rate=15.0, n=n)
    return ds


def _policy_gains(reps=REPS):
    """policy_gains's store: per replication, the mean time to first token and the p99 latency of five
    admission orders at three rates and three predictor errors, shortest-predicted-first's (plain and
    aged), multi-bin's and the feedback queue's below FCFS's by known ratios, the same noise in every order
    (paired replications); the fastest rate's FCFS without a steady state."""
    pol = ["fcfs", "spf", "spf_aging", "multibin", "mlfq"]
    rate = np.array([5.5, 6.6, 7.4])
    sigma = np.array([0.0, 0.5, 1.0])
    rng = np.random.default_rng(26)
    noise = 1.0 + 0.02 * rng.standard_normal((1, rate.size, sigma.size, reps))
    gain = np.array([1.0, 0.6, 0.75, 0.9, 0.8])[:, None, None, None] * np.ones((1, rate.size, sigma.size, 1))
    base_ttft = np.array([0.05, 0.12, 0.36])[None, :, None, None]
    base_p99 = np.array([6.0, 7.0, 9.0])[None, :, None, None]
    dims = ("policy", "rate", "predictor_sigma")
    unstable = np.zeros((len(pol), rate.size, sigma.size), bool)
    unstable[0, -1] = True
    ds = xr.Dataset({"sim_mean_ttft": (dims + ("rep",), base_ttft * gain * noise),
                     "sim_latency_p99": (dims + ("rep",), base_p99 * gain ** 0.5 * noise),
                     "unstable": (dims, unstable), "done": (dims, np.ones(unstable.shape, bool))},
                    coords={"policy": pol, "rate": rate, "predictor_sigma": sigma, "rep": np.arange(reps)})
    ds.attrs.update(name="policy_gains", reps=reps, arrivals="poisson", baseline="fcfs", confidence_level=0.95,
                    policy_spf_aging='{"admission": "spf", "aging": 200.0, "kind": "continuous"}')
    return ds


#: _policy_gains_classes' orders, and their made-up ratios to FCFS: the interactive tenant's p99 time to first
#: token, the batch tenant's mean latency
TENANT_GAINS = {"fcfs": (1.0, 1.0), "spf": (0.4, 0.95), "edf": (0.6, 1.1), "vtc": (0.5, 1.2), "mlfq": (0.1, 1.5)}


def _policy_gains_classes(reps=REPS):
    """policy_gains_classes' store: two tenants (a tight objective on the first token and a loose one), per
    replication each tenant's p99 time to first token and mean latency, each order's below or above FCFS's
    by TENANT_GAINS (the same noise in every order: paired replications), each tenant's goodput falling
    with the load; the fastest rate's FCFS without a steady state."""
    import json

    pol = list(TENANT_GAINS)
    rate = np.array([2.85, 3.5, 3.9])
    classes = ["interactive", "batch"]
    rng = np.random.default_rng(27)
    noise = 1.0 + 0.02 * rng.standard_normal((1, rate.size, reps, len(classes)))
    # (classes' order: the interactive tenant's column is its first-token gain, the batch tenant's its latency's)
    gain = np.array([TENANT_GAINS[p] for p in pol])[:, None, None, :]
    base = np.array([3.0, 15.0, 46.0])[None, :, None, None]
    dims = ("policy", "rate", "rep", "request_class")
    good = np.clip(0.95 - 0.2 * np.arange(rate.size)[None, :, None] + 0.02 * np.arange(len(pol))[:, None, None],
                   0, 1) * np.ones((1, 1, len(classes)))
    unstable = np.zeros((len(pol), rate.size), bool)
    unstable[0, -1] = True
    ds = xr.Dataset({"sim_class_ttft_p99": (dims, base * gain * noise),
                     "sim_class_mean_latency": (dims, base * gain * noise),
                     "sim_class_goodput_mean": (("policy", "rate", "request_class"), good),
                     "sim_class_goodput_ci_low": (("policy", "rate", "request_class"), good - 0.01),
                     "sim_class_goodput_ci_high": (("policy", "rate", "request_class"), good + 0.01),
                     "unstable": (("policy", "rate"), unstable),
                     "done": (("policy", "rate"), np.ones(unstable.shape, bool))},
                    coords={"policy": pol, "rate": rate, "rep": np.arange(reps), "request_class": classes})
    ds.attrs.update(name="policy_gains_classes", reps=reps, arrivals="poisson", baseline="fcfs",
                    confidence_level=0.95, predictor_sigma=0.5,
                    classes=json.dumps({"batch": {"share": 1.0, "prompt_median": 1024.0, "output_median": 512.0,
                                                  "ttft_slo": 10.0},
                                        "interactive": {"share": 3.0, "prompt_median": 256.0, "output_median": 128.0,
                                                        "ttft_slo": 0.5, "tpot_slo": 0.012}}))
    return ds


def _trace_replay(reps=2):
    """A trace replay through several policies: throughput follows the
    replay's rate up to each policy's own limit."""
    import json

    names = ["multibin1", "static8", "dynamic"]
    settings = [{"kind": "multibin", "bins": 1, "batch_size": 8, "max_wait": 30.0},
                {"kind": "static", "batch_size": 8}, {"kind": "dynamic"}]
    scales = np.array([0.5, 1.0, 2.0, 4.0])
    rate = 5.5 * scales
    limits = np.array([12.0, 12.5, 30.0])
    thr = np.minimum(rate[None, :], limits[:, None])
    unstable = rate[None, :] > limits[:, None]
    p95 = np.where(unstable, 600.0, 4.0 + scales[None, :])[..., None] * (1 + 0.01 * np.arange(reps))
    ds = xr.Dataset({"sim_throughput_mean": (("policy", "scale"), thr),
                     "sim_latency_p95": (("policy", "scale", "rep"), p95),
                     "unstable": (("policy", "scale"), unstable),
                     "done": (("policy", "scale"), np.ones(thr.shape, bool))},
                    coords={"policy": names, "scale": scales, "rep": np.arange(reps)})
    for var in ds.data_vars:
        ds[var].attrs.update(_attrs(var))
    ds.attrs.update(name="trace_replay", reps=reps, servers=4, per_token=0.00574,
                    trace_file="AzureLLMInferenceTrace_conv.csv",
                    trace_requests=19366, trace_span_s=3501.7, arrivals="trace",
                    **{f"policy_{n}": json.dumps(s) for n, s in zip(names, settings)})
    return ds


#: the capacity specs whose synthetic stores the capacity figures read
CAPACITY_SPECS = ("capacity_k", "capacity_latency", "capacity_predictor", "capacity_routers", "policy_gains_capacity",
                  "policy_gains_classes_capacity", "prefix_caching", "prefix_routing", "disaggregation")
#: prefix_routing's made-up capacity laws, 80 / (1 + k x share), k by policy
ROUTING_K = {"no_cache": 3.0, "least_used": 1.0, "cache_aware": 0.5}
#: policy_gains_classes_capacity's made-up capacities (requests/s), by order
TENANT_CAPACITY = {"fcfs": 3.0, "spf": 3.25, "mlfq": 2.95, "edf": 3.1, "vtc": 3.05}


def _real_spec_template(name: str, *, reps: bool = True, capacity: bool = False):
    """The spec ``sweeps/<name>.toml`` and its store's empty template, with
    the attrs a sweep writes (its reps, or its [capacity] settings)."""
    from pathlib import Path as _Path

    spec_path = _Path(__file__).resolve().parents[1] / "sweeps" / f"{name}.toml"
    spec = parse_spec(spec_path.read_text(), source=str(spec_path))
    attrs = {"name": spec.name, "description": spec.description, "service": spec.service,
             **({"reps": spec.reps} if reps else {}),
             **({f"capacity_{k}": v for k, v in spec.capacity.items()} if capacity else {}),
             **schema.spec_attrs(spec)}
    return spec, schema.template(spec, attrs)


def _capacity_store(name):
    """A capacity store on the real spec's template (sweeps/NAME.toml):
    synthetic searches, Theorem 4.2 (or a made-up latency or goodput law) plus 0.2 %,
    intervals of +-0.5 %, every third search unresolved."""
    from mbbatch.sweeps.cells import point_theory

    spec, ds = _real_spec_template(name, reps=False, capacity=True)
    for i, (idx, params) in enumerate(spec.points()):
        th = point_theory(spec.arrivals, spec.service, params)
        for var in schema.CAPACITY_THEORY:
            if var in ds:
                ds[var].values[idx] = th[var]
        if "theory_service_rate" in th:
            cap = th["theory_service_rate"] / (1 + params.get("predictor_sigma", 0.0) * (1 - 1 / params["bins"]))
        elif name == "policy_gains_classes_capacity":
            cap = TENANT_CAPACITY[params["admission"]]
        elif name == "prefix_caching":
            # (without the cache the system prompts' prefill costs capacity as their share grows; with it, little)
            share = params["system_prompt_share"]
            cap = 20.0 / (1 + (0.1 if params["prefix_caching"] else 3.0) * share)
        elif name == "prefix_routing":
            cap = 80.0 / (1 + ROUTING_K[params["policy"]] * params["system_prompt_share"])
        elif name == "disaggregation":
            # (the prefill pool binds below the best split, the decode pool above it; colocated between)
            p = params.get("prefill_engines")
            cap = 14.0 if p is None else 40.0 * min(p / 4.0, (8 - p) / 6.0)
        elif params.get("objective_goodput") is not None:
            # (continuous admission orders under a goodput objective: shortest first carries the most, less with
            # aging, and less as the predictor errs)
            factor = {"fcfs": 1.0, "spf": 1.15, "multibin": 1.05, "mlfq": 0.9}[params["admission"]]
            cap = 6.0 * factor * (0.95 if params.get("aging") else 1.0) / (1 + 0.1 * params["predictor_sigma"])
        else:
            factor = {"static": 0.8, "dynamic": 1.0, "multibin_dynamic": 1.2, "cluster": 1.0}[params["kind"]]
            bound = params.get("objective_latency_p95") or params["objective_ttft_p99"]
            cap = 0.06 * factor * bound * (1.5 if params.get("router") == "autellix" else 1.0)
        ds["sim_capacity"].values[idx] = 1.002 * cap
        ds["sim_capacity_ci_low"].values[idx] = 0.997 * cap
        ds["sim_capacity_ci_high"].values[idx] = 1.007 * cap
        ds["sim_saturated_throughput"].values[idx] = 1.5 * cap
        ds["capacity_probes"].values[idx] = 9
        ds["capacity_requests"].values[idx] = 9 * 3 * params["n"]
        ds["capacity_resolved"].values[idx] = i % 3 != 2
        ds["done"].values[idx] = True
    return ds


def _laps_store():
    """The LAPS sweep on the real spec's template (sweeps/laps.toml):
    synthetic per-rep TTFTs growing with the load, the short share set by the
    prompt median, throughput short of the rate at the highest loads."""
    spec, ds = _real_spec_template("laps")
    rng = np.random.default_rng(8)
    for idx, params in spec.points():
        rate, med = params["rate"], params["prompt_median"]
        cap = 12000.0 / med
        scale = 1.0 + (2 if params["dynamic"] else 0) + (1 if params["dual_queue"] else 0)
        for var, base in (("sim_ttft_short_p99", 0.05), ("sim_ttft_long_p99", 0.3)):
            ds[var].values[idx] = base * scale * (1 + rate / cap) * (1 + 0.05 * rng.standard_normal(spec.reps))
        ds["sim_short_share"].values[idx] = 1.0 / (1.0 + med / 256.0)
        thr = min(rate, cap)
        ds["sim_throughput"].values[idx] = thr
        ds["sim_throughput_mean"].values[idx] = thr
        ds["done"].values[idx] = True
    return ds


def _laps_step_store():
    """The LAPS load-step sweep on the real spec's template
    (sweeps/laps_step.toml): the short group shrinking during the high load,
    the more so the longer the prompts; TTFTs made up."""
    spec, ds = _real_spec_template("laps_step")
    t = ds["time"].values
    E = int(spec.params["instances"])
    high = (t >= spec.params["t_up"]) & (t < spec.params["t_down"])
    for idx, params in spec.points():
        med = params["prompt_median"]
        for rep in range(spec.reps):
            short = np.where(high, 1.0, 3.0 if med < 256 else 2.0) + (rep % 2) * (~high)
            short[0] = np.nan                           # before the first arrival
            ds["ts_short_instances"].values[idx + (rep,)] = short
            ds["ts_long_instances"].values[idx + (rep,)] = E - short
        ds["sim_ttft_short_p99"].values[idx] = 0.05 * (1 + med / 512.0)
        ds["sim_ttft_long_p99"].values[idx] = 0.5 * (1 + med / 256.0)
        ds["sim_short_share"].values[idx] = 1.0 / (1.0 + med / 256.0)
        ds["group_moves"].values[idx] = 4 + np.arange(spec.reps) * (5 if params.get("interval") == 1.0 else 1)
        ds["done"].values[idx] = True
    return ds


def _autellix_store():
    """The Autellix sweep on the real spec's template (sweeps/autellix.toml):
    the large share set by the threshold, Autellix's TTFT and recomputed
    tokens falling with it, the other routers flat."""
    spec, ds = _real_spec_template("autellix")
    rng = np.random.default_rng(9)
    for idx, params in spec.points():
        share = float(np.exp(-params["route_threshold"] / 1000.0))
        auto = params["router"] == "autellix"
        gain = 1.0 - 0.3 * share if auto else 1.0
        ds["sim_large_share"].values[idx] = share
        ds["sim_ttft_p99"].values[idx] = 5.0 * gain * (1 + 0.03 * rng.standard_normal(spec.reps))
        ds["sim_kv_recomputed_tokens"].values[idx] = 800.0 * (1.0 - share if auto else 1.0)
        ds["sim_load_imbalance"].values[idx] = 1.2 + (share if auto else 0.0)
        ds["sim_throughput"].values[idx] = params["rate"] * (1 + 0.001 * rng.standard_normal(spec.reps))
        ds["sim_throughput_mean"].values[idx] = params["rate"]
        ds["done"].values[idx] = True
    return ds


def _autellix_loops_store():
    """The open/closed-loop sweep on the real spec's template
    (sweeps/autellix_loops.toml): TTFT growing with the rate, the closed
    loop and Autellix lower; locality the other way."""
    spec, ds = _real_spec_template("autellix_loops")
    rng = np.random.default_rng(10)
    for idx, params in spec.points():
        gain = (0.9 if params["closed_loop"] else 1.0) * (0.85 if params["router"] == "autellix" else 1.0)
        noise = 1 + 0.03 * rng.standard_normal(spec.reps)
        ds["sim_ttft_p99"].values[idx] = 0.3 * params["rate"] * gain * noise
        ds["sim_throughput"].values[idx] = params["rate"] * (0.98 if params["closed_loop"] else 0.99) * noise
        ds["sim_throughput_mean"].values[idx] = params["rate"]
        ds["sim_kv_recomputed_tokens"].values[idx] = 800.0 * gain
        ds["sim_locality_hit_rate"].values[idx] = 0.2 / gain
        ds["done"].values[idx] = True
    return ds


def _engine_event():
    """The engine-event example's shape (mbbatch.examples.engine_event), made up."""
    t = np.arange(5.0, 300.0, 10.0)
    bump = np.where((t > 100.0) & (t < 200.0), 1.5, 1.0)
    routers = ["autellix", "least_used", "round_robin"]
    lat = np.array([bump * f for f in (1.5, 2.0, 2.2)])
    return xr.Dataset({"mean_latency": (("router", "time"), lat), "ttft_p99": (("router", "time"), 2 * lat),
                       "rerouted": (("router",), np.array([2.0, 3.0, 3.5]))},
                      coords={"router": routers, "time": t},
                      attrs={"engines": 8, "rate": 16.0, "remove": 100.0, "back": 200.0, "bin": 10.0, "seeds": 8,
                             "calls": 4, "threshold": 1024})


def write_results(path):
    path.mkdir(parents=True, exist_ok=True)
    rates = np.array([1.0, 2.5, 4.0, 5.5, 7.0, 8.0, 9.0, 10.0, 11.0, 12.5, 14.0])
    dsets = {
        "fig3": _sweep("fig3", {"bins": [1, 2, 3, 4, 5], "rate": rates}, _uniform_cell(),
                       attrs=_uniform_attrs(servers=1.0)),
        "fig4": _sweep("fig4", {"bins": [1, 2, 3], "rate": rates}, _uniform_cell(),
                       attrs=_uniform_attrs(servers=1.0)),
        "fig8": _sweep("fig8",
                        {"bins": [1, 2, 3, 4, 5], "rate": np.array([1.0, 3.0, 5.0, 7.0, 9.0, 10.5, 12.0, 13.5, 15.0])},
                       _expon_cell(), attrs=dict(batch_size=200, mu=0.1, n=200000,
                                                 service="expon", edges="lemma_a1", servers=1.0)),
        "thm43": _sweep("thm43", {"bins": [1, 2, 4, 8, 16, 32, 64]}, _uniform_cell(),
                        attrs=_uniform_attrs(servers=1.0), saturated=True),
        "servers": _sweep("servers", {"servers": [1.0, 2.0, 8.0, math.inf], "rate": rates},
                          _uniform_cell(bins=2), attrs=_uniform_attrs(bins=2)),
        # the trace figures: synthetic closed forms stand in for the trace's
        "fig6": _sweep("fig6", {"bins": [1, 2, 4], "rate": np.array([2.0, 5.0, 10.0, 20.0, 30.0, 40.0])},
                       _uniform_cell(B=8, servers=8.0), attrs=_trace_attrs(servers=8.0, n=100000)),
        "fig7": _sweep("fig7", {"bins": [1, 2, 4, 8, 16, 32]}, _uniform_cell(B=8), saturated=True,
                       attrs=_trace_attrs(servers=1.0, n=200000)),
        # realistic workloads
        "predictor_error": _sweep("predictor_error", {"bins": [1, 2, 4, 8],
                                                      "predictor_sigma": [0.0, 0.1, 0.3, 1.0]},
                                  _uniform_cell(B=32), saturated=True,
                                  attrs=_uniform_attrs(batch_size=32, servers=1.0)),
        "bin_confusion": _sweep("bin_confusion", {"bins": [1, 2, 4, 8], "predictor_p": [1.0, 0.9, 0.7, 0.5]},
                                _uniform_cell(B=32), saturated=True,
                                attrs=_uniform_attrs(batch_size=32, servers=1.0)),
        "bursty": _sweep("bursty", {"cv": [1.0, 2.0, 4.0], "bins": [1, 4], "rate": np.array([0.5, 1.0, 1.5, 2.0])},
                         _uniform_cell(B=32), attrs=_uniform_attrs(batch_size=32, servers=1.0)),
    }
    # as in the real store: the burstiest process unstable at k = 4's last rate, its latency on scale and
    # its replications' interval (of a transient) far wider than the axis
    unstable = dict(cv=4.0, bins=4, rate=2.0)
    dsets["bursty"]["unstable"].loc[unstable] = True
    dsets["bursty"]["sim_mean_latency_ci_high"].loc[unstable] = 1e4
    onoff = _sweep("bursty_onoff", {"bins": [1, 4], "rate": np.array([0.5, 1.0, 1.5, 2.0])}, _uniform_cell(B=32),
                   attrs=_uniform_attrs(batch_size=32, servers=1.0, mean_on=10.0, mean_off=10.0, rate_off=0.0))
    dsets["bursty_onoff"] = onoff.rename({"rate": "rate_on"}).assign_coords(rate_on=onoff["rate"].values * 2)
    dsets["mb_only_load"] = _sweep("mb_only_load", {"bins": [1, 2, 4, 8], "rate": np.array([0.5, 1.0, 2.0, 3.0])},
                                   _uniform_cell(B=32), attrs=_uniform_attrs(batch_size=32, servers=1.0))
    dsets["trace_replay"] = _trace_replay()
    for name in CAPACITY_SPECS:
        dsets[name] = _capacity_store(name)
    dsets["laps"] = _laps_store()
    dsets["laps_step"] = _laps_step_store()
    dsets["autellix"] = _autellix_store()
    dsets["autellix_loops"] = _autellix_loops_store()
    for name, ds in dsets.items():
        ds.to_zarr(path / f"{name}.zarr", mode="w")
    _fig1b().to_netcdf(path / "fig1b.nc")
    _engine_event().to_netcdf(path / "engine_event.nc")
    write_token_results(path)
    return path


# Fixtures imported into several test modules are separate fixtures to pytest,
# each set up once per module; this cache makes them one per process, and
# _shared one per test run: the test workers (pytest-xdist) take turns under a
# file lock, the first one writes, the others read what it wrote.
_SESSION: dict = {}


def _shared(tmp_path_factory, name: str, make) -> Path:
    """The folder ``name`` made once per test run by ``make(folder)``, shared by every worker."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # (each worker's base is a folder of the run's)
    folder, complete = root / name, root / f"{name}.complete"
    with FileLock(str(root / f"{name}.lock")):
        if not complete.exists():
            if folder.exists():
                shutil.rmtree(folder)  # (a worker stopped halfway: start again)
            folder.mkdir()
            make(folder)
            complete.touch()
    return folder


@pytest.fixture(scope="session")
def results(tmp_path_factory):
    """The folder holding every synthetic dataset."""
    pytest.importorskip("zarr")
    if "results" not in _SESSION:
        _SESSION["results"] = _shared(tmp_path_factory, "results", write_results)
    return _SESSION["results"]


@pytest.fixture(scope="session")
def drawn(results, tmp_path_factory):
    """Every figure drawn from ``results`` with every way to simulate
    refusing (figure code never simulates): the folder and the files
    written, in the order written.  PNG files only: a PDF draws the figure
    again, and the heavy check draws both."""
    if "drawn" not in _SESSION:
        def draw(out):
            import mbbatch
            import mbbatch.simulation

            def refuse(*args, **kwargs):
                raise AssertionError("a figure script ran a simulation")

            with mock.patch.object(mbbatch, "simulate", refuse), \
                    mock.patch.object(mbbatch.simulation, "simulate", refuse):
                files = figures.make_figures(results, out / "figures", formats="png")
            (out / "order.json").write_text(json.dumps([f.name for f in files]))

        folder = _shared(tmp_path_factory, "drawn", draw)
        out = folder / "figures"
        _SESSION["drawn"] = out, [out / name for name in json.loads((folder / "order.json").read_text())]
    return _SESSION["drawn"]


def _continuous_controller(reps=REPS):
    """continuous_controller's store: fixed caps carrying up to a limit each at a time between tokens that
    grows with it, the controller holding its D_SLA on the mean (the p99, the prefill chunks', above it); the
    cap in force per replication."""
    import json

    names = {"cap32": 32, "cap128": 128, "cap256": 256, "sla20": 0.02}
    rate = np.array([5.0, 15.0, 25.0, 30.0])
    limit = np.array([13.4, 27.5, 32.0, 26.5])
    thr = np.minimum(rate[None, :], limit[:, None])
    tbt = np.array([[0.010, 0.0117, 0.0117, 0.0117], [0.010, 0.014, 0.022, 0.0224],
                    [0.010, 0.014, 0.0226, 0.030], [0.010, 0.014, 0.0203, 0.0205]])
    cap = np.array([[32.0] * 4, [128.0] * 4, [256.0] * 4, [140.0, 160.0, 155.0, 116.0]])
    rng = np.random.default_rng(24)
    noise = 1.0 + 0.01 * rng.standard_normal(thr.shape + (reps,))
    dims = ("policy", "rate")
    unstable = rate[None, :] > limit[:, None]
    ds = xr.Dataset({"sim_throughput_mean": (dims, thr), "sim_throughput_ci_low": (dims, thr * 0.99),
                     "sim_throughput_ci_high": (dims, thr * 1.01),
                     "sim_mean_tbt": (dims + ("rep",), tbt[..., None] * noise),
                     "sim_tbt_p99": (dims + ("rep",), 2.4 * tbt[..., None] * noise),
                     "sim_mean_max_num_seqs": (dims + ("rep",), cap[..., None] * np.ones(reps)),
                     "sim_latency_p95_mean": (dims, np.where(unstable, 500.0, 8.0)),
                     "unstable": (dims, unstable), "done": (dims, np.ones(thr.shape, bool))},
                    coords={"policy": list(names), "rate": rate, "rep": np.arange(reps)})
    ds.attrs.update(name="continuous_controller", reps=reps, arrivals="poisson", policy="continuous")
    for name, v in names.items():
        ds.attrs[f"policy_{name}"] = json.dumps({"kind": "continuous", "max_num_seqs": v} if name.startswith("cap")
                                                else {"d_sla": v, "kind": "continuous", "sla_control": True})
    return ds


def _continuous_trace(reps=REPS):
    """continuous_trace's two stores: the capacities (multi-bin rising with k beside eq. (2), towards its
    limit near the continuous engine's at 32 sequences) and p95 latency against load."""
    import json

    names = {"continuous256": ("continuous", 256), "continuous32": ("continuous", 32), "multibin1": ("multibin", 1),
             "multibin4": ("multibin", 4), "dynamic": ("dynamic", None)}
    thr = np.array([4.6, 3.4, 2.2, 2.9, 2.85])
    theory = np.array([np.nan, np.nan, 2.21, 2.88, np.nan])
    limit = np.array([np.nan, np.nan, 3.35, 3.35, np.nan])
    rng = np.random.default_rng(25)
    sim = thr[:, None] * (1.0 + 0.005 * rng.standard_normal((thr.size, reps)))
    mean = sim.mean(axis=1)
    cap = xr.Dataset({"sim_throughput": (("policy", "rep"), sim), "sim_throughput_mean": ("policy", mean),
                      "sim_throughput_ci_low": ("policy", mean * 0.99),
                      "sim_throughput_ci_high": ("policy", mean * 1.01),
                      "theory_service_rate": ("policy", theory), "capacity": ("policy", limit),
                      "unstable": ("policy", np.zeros(thr.size, bool)), "done": ("policy", np.ones(thr.size, bool))},
                     coords={"policy": list(names), "rep": np.arange(reps)})
    rate = np.array([0.5, 1.5, 2.5, 3.5])
    unstable = rate[None, :] > thr[:, None] * 0.9
    p95 = np.where(unstable, 1000.0, 10.0 * (1 + rate[None, :]))
    lat = xr.Dataset({"sim_latency_p95_mean": (("policy", "rate"), p95), "unstable": (("policy", "rate"), unstable),
                      "done": (("policy", "rate"), np.ones(p95.shape, bool))},
                     coords={"policy": list(names), "rate": rate})
    for ds, name in ((cap, "continuous_trace_capacity"), (lat, "continuous_trace")):
        ds.attrs.update(name=name, reps=reps, arrivals="saturated" if ds is cap else "poisson",
                        profile="A100/vLLM/Meta-Llama-3-8B/tp1")
        for v, (kind, x) in names.items():
            key = {"continuous": "max_num_seqs", "multibin": "bins"}.get(kind)
            ds.attrs[f"policy_{v}"] = json.dumps({"kind": kind, **({key: x} if key else {})})
    return cap, lat
