"""`make fuzz`: random sweep specs, run every way a sweep can run.

Each spec is drawn at random: every policy kind (single, or several as
variants on a policy axis), every arrival process, the paper's service
laws, log-normal tokens and synthetic traces (replayed or resampled), every
service model, capacity specs with objectives, and any spec parameter
that applies, fixed, on the grid or in a variant.  Each must either be
refused as a SpecError before any store exists, or run, and then:

- its store passes :func:`mbbatch.sweeps.check_store`;
- with probability ``--pool``, a 2-process pool gives the same store, bit
  for bit;
- ``--kill``: a ``mbbatch sweep`` process killed (SIGKILL) at a random
  moment, then resumed, gives the same store;
- ``--dask``: a dask LocalCluster of 2 workers gives the same store, and its
  NetCDF export the same arrays;
- ``--multi``: the spec run beside another on one pool (``run_sweeps``)
  gives the same store as each alone;
- ``--cli``: ``mbbatch simulate`` with the first grid point's flags prints
  the store's throughput;
- ``--mutate``: the spec with one value anywhere (a parameter, a grid axis,
  a variant's setting, a top-level key, the capacity or workload table)
  replaced by junk (:data:`JUNK`: NaN, inf, 2**63, strings, booleans,
  lists, tables, ...) is refused as a SpecError naming its file before any
  store exists, or runs cleanly (not run when a grid point asks for more
  than :data:`MAX_MUTATED_N` requests, n x reps).

A refusal whose message is Python's own (``NoneType``, ``unsupported
operand``, ... :data:`INTERNAL`) is a fault too, and so is a spec whose
checks take longer than ``--timeout`` seconds (a capacity search with
``rel_tol = 1e-300`` once never ended).

Usage: ``python -m tests.fuzz_sweeps --specs 200 --seed 1`` from the
checkout (``make fuzz`` runs 100 with every comparison).  Leave mbbatch's
sources alone while it runs (or run it in a copy): a store records the
code's hash, so an edit mid-run makes a resumed store differ.  A failing spec is
printed with its traceback, and kept with its trace file under
``--keep-failures`` (default ``fuzz-failures/``).  Refusals are counted and
their messages summarised: read them, as a refusal of a valid spec is a
fault as well.  Not a test module: pytest does not collect it;
``tests/test_fuzz_sweeps.py`` checks that it draws every spec parameter and
runs a few specs.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mbbatch.params import PARAMS
from mbbatch.policies.base import TOKEN_MODELS as _TOKEN_MODELS
from mbbatch.registry import POLICIES
from mbbatch.sweeps import check_store, load_spec, run_sweep, run_sweeps
from mbbatch.sweeps.cells import check_points
from mbbatch.sweeps.spec import SEARCHED, SPEC_PARAMS, SpecError

from .helpers import ROOT, assert_identical, toml

#: the policy kinds a spec can name (the registry's)
KINDS = tuple(POLICIES)
#: token service models (LAPS takes the prefill model, MultiBin the max model)
TOKEN_MODELS = _TOKEN_MODELS
#: the token policies that can share a spec as variants: those that take every token service model
VARIANT_KINDS = tuple(k for k, cls in POLICIES.items() if cls.models == TOKEN_MODELS)
#: the parameters drawn only as the spec's structure needs them (see :func:`make_spec`)
STRUCTURAL = ("session_context",)
#: what a mutation puts in place of a value
JUNK = (0, -1, 1, 2 ** 63, 10 ** 30, -0.0, 0.0, 1e-300, 1e300, 5e-324, math.inf, -math.inf, math.nan, "", "inf",
        "nan", "x", True, False, [], [1, 2], [0.5, 0.5], {"a": 1}, "poisson", 0.5, 3, 7.5, 1e6, 2 ** 31, "true",
        [True, False])
#: a mutated spec accepted with more requests (n x reps) at a grid point is not run (it would take minutes)
MAX_MUTATED_N = 10 ** 6
#: a refusal whose message holds one of these is Python's, not the checker's: a fault
INTERNAL = ("NoneType", "unsupported operand", "has no attribute", "not subscriptable", "unhashable",
            "positional argument", "referenced before assignment", "object is not", "KeyError", "IndexError")


def _ranges(R: random.Random) -> dict:
    """Every spec parameter's sampler: values a run of a few thousand
    requests handles in well under a second, edges included (0, inf, 1)."""
    def u(a, b):
        """Uniform on [a, b] to 4 significant digits (readable specs; a
        small range, as prefill_b's, is not rounded to 0)."""
        return float(f"{R.uniform(a, b):.4g}")

    def pick(*xs):
        return lambda: R.choice(xs)

    return {
        "bins": lambda: R.randint(1, 4),
        "batch_size": lambda: R.randint(1, 16),
        "edges": pick("equal_mass", "lemma_a1", "optimal"),
        "max_wait": lambda: R.choice([math.inf, u(0, 5), 0.0]),
        "rate": lambda: u(0.05, 3),
        "scale": lambda: u(0.2, 3),
        "cv": lambda: u(0.3, 3),
        "rate_on": lambda: u(0.1, 4),
        "rate_off": lambda: u(0, 0.5),
        "mean_on": lambda: u(1, 30),
        "mean_off": lambda: u(1, 30),
        "rate_high": lambda: u(0.5, 5),
        "t_up": lambda: u(1, 50),
        "t_down": lambda: u(60, 200),
        "l_min": lambda: u(0, 3),
        "l_max": lambda: u(3.5, 20),
        "mu": lambda: u(0.2, 3),
        "base": lambda: u(0, 0.1),
        "per_token": lambda: u(0.001, 0.05),
        "linear_alpha": lambda: u(0.0001, 0.01),
        "linear_beta": lambda: u(0, 0.2),
        "decode_beta": lambda: u(0.001, 0.01),
        "prefill_per_token": lambda: u(0, 1e-4),
        "gamma": lambda: u(0, 1),
        "calibrated_alpha": lambda: u(0, 0.01),
        "calibrated_beta": lambda: u(0.001, 0.01),
        "feedback": pick("calibrated", "uncalibrated", "legacy"),
        "iteration_setup": lambda: u(0, 0.1),
        "iteration_step": lambda: u(0.002, 0.03),
        "iteration_prefill": lambda: u(0, 2e-4),
        "iteration_per_sequence": lambda: u(0, 2e-4),
        "iteration_per_context": lambda: u(0, 2e-7),
        # (a mixture of experts: per_expert > 0 needs experts, experts_per_token at most experts)
        "iteration_per_expert": lambda: u(0, 3e-3),
        "iteration_prefill_attention": lambda: u(0, 1e-8),
        "iteration_overhead": lambda: u(0, 5e-3),
        "request_overhead": lambda: u(0, 0.05),
        "num_scheduler_steps": pick(1, 2, 8),
        "prefix_caching": pick(True, False),
        "system_prompts": pick(0, 0, 1, 4),
        "system_prompt_length": lambda: u(0, 300),
        "system_prompt_share": lambda: u(0, 1),
        "experts": pick(8, 16),
        "experts_per_token": pick(1, 2),
        "finished": pick("leave", "stay"),
        "profile": pick("H100/vLLM/Meta-Llama-3-8B/tp1", "A100/vLLM/Meta-Llama-3-8B/tp1",
                        "MI250/llama.cpp/Mixtral-8x7B-v0.1/tp4", "SN40L/sambaflow/Meta-Llama-3-8B/tp8",
                        "A100/vLLM/Mixtral-8x7B-v0.1/tp4"),
        "window_start": lambda: u(0, 100),
        "window_end": lambda: R.choice([math.inf, u(300, 3000)]),
        "drop_failed": pick(True, False),
        "prompt_median": lambda: u(10, 300),
        "prompt_sigma": lambda: u(0.1, 1.2),
        "output_median": lambda: u(5, 200),
        "output_sigma": lambda: u(0.1, 1.2),
        "predictor_sigma": lambda: u(0, 1),
        "predictor_p": lambda: u(0, 1),
        "ttft_slo": lambda: R.choice([float("inf"), u(0.05, 5)]),
        "tpot_slo": lambda: R.choice([float("inf"), u(0.005, 0.1)]),
        "d_sla": lambda: u(0.003, 0.03),
        "eps_d": lambda: u(0, 1e-3),
        "b_min": lambda: R.randint(1, 4),
        "b_max": lambda: R.randint(4, 64),
        "controller": pick("spec", "multiplicative"),
        "memory": pick("l0", "clt", "off"),
        "eta": lambda: u(500, 50000),
        "eps_m": lambda: u(0.01, 0.3),
        "selection": pick("round_robin", "longest_queue"),
        "bin_edges": pick("warmup", "presample", "optimal"),
        "warmup": lambda: R.randint(1, 300),
        "instances": lambda: R.randint(1, 4),
        "laps_threshold": lambda: R.randint(0, 600),
        "window": lambda: u(0, 0.02),
        "max_batch": lambda: R.randint(1, 16),
        "max_batch_tokens": lambda: u(100, 20000),
        "dual_queue": pick(True, False),
        "max_num_seqs": lambda: R.randint(1, 64),
        "max_batched_tokens": lambda: R.choice([R.randint(1, 64), R.randint(64, 4096)]),
        "chunked_prefill": pick(True, False),
        "sla_control": pick(True, False),
        "kv_tokens": lambda: R.choice([math.inf, u(500, 100000)]),
        "block_size": pick(1, 16, 32),
        "admission": pick("fcfs", "spf", "multibin", "mlfq"),
        "admission_bins": lambda: R.randint(1, 4),
        "aging": lambda: R.choice([0.0, u(0, 500)]),
        "mlfq_quantum": lambda: R.randint(1, 64),
        "mlfq_levels": lambda: R.randint(1, 6),
        "dynamic": pick(True, False),
        "interval": lambda: u(0, 10),
        "ratio": lambda: u(0.3, 4),
        "long_instances": lambda: R.randint(1, 3),
        "decode": pick(*PARAMS["decode"].choices),
        "decode_servers": lambda: R.randint(1, 3),
        "decode_batch_size": lambda: R.randint(1, 16),
        "decode_bins": lambda: R.randint(1, 4),
        "decode_d_sla": lambda: u(0.003, 0.03),
        "decode_b_max": lambda: R.randint(4, 64),
        "decode_eta": lambda: u(500, 50000),
        "decode_model_beta": lambda: u(0.001, 0.01),
        "decode_model_gamma": lambda: u(0, 1),
        "prefill_a": lambda: u(0, 0.01),
        "prefill_b": lambda: u(1e-5, 1e-3),
        "engines": lambda: R.randint(1, 4),
        "engine_policy": pick(*PARAMS["engine_policy"].choices),
        "engine_batch_size": lambda: R.randint(1, 16),
        "engine_bins": lambda: R.randint(1, 4),
        "router": pick(*PARAMS["Cluster.router"].choices),
        "route_threshold": lambda: R.randint(0, 4096),
        "kv_reuse": pick(True, False),
        "cache_threshold": lambda: round(R.uniform(0.0, 1.0), 3),
        "balance_abs": lambda: R.randint(0, 100),
        "balance_rel": lambda: round(R.uniform(1.0, 3.0), 3),
        "prefill_engines": lambda: R.randint(1, 3),
        "decode_engines": lambda: R.randint(1, 3),
        "prefill_router": pick(*PARAMS["Disaggregated.router"].choices),
        "decode_router": pick(*PARAMS["Disaggregated.decode_router"].choices),
        "kv_bandwidth": lambda: R.choice([1e8, 1e9, 25e9]),
        "kv_latency": lambda: R.choice([0.0, u(0, 0.01)]),
        "kv_bytes_per_token": lambda: R.choice([65536.0, 131072.0, u(1e3, 4e5)]),
        "programs": pick("synthetic", "none"),
        "calls": lambda: R.randint(1, 5),
        "think_time": lambda: u(0, 2),
        "closed_loop": pick(True, False),
        "session_context": pick("included", "added"),
        "n": lambda: R.choice([R.randint(30, 1500), R.randint(30, 1500), R.randint(20000, 200000)]),
        "servers": lambda: R.choice([1, 1, 2, 3, "inf"]),
        "objective_latency_p50": lambda: u(0.5, 50),
        "objective_latency_p95": lambda: u(1, 100),
        "objective_latency_p99": lambda: u(1, 200),
        "objective_mean_latency": lambda: u(0.5, 50),
        "objective_mean_ttft": lambda: u(0.05, 5),
        "objective_ttft_p50": lambda: u(0.05, 5),
        "objective_ttft_p95": lambda: u(0.1, 10),
        "objective_ttft_p99": lambda: u(0.1, 10),
        "objective_mean_tbt": lambda: u(0.005, 0.1),
        "objective_tbt_p50": lambda: u(0.005, 0.1),
        "objective_tbt_p95": lambda: u(0.005, 0.2),
        "objective_tbt_p99": lambda: u(0.005, 0.2),
        "objective_sla_violation_share": lambda: u(0, 1),
        "objective_sla_violation_tokens": lambda: u(0, 1),
        "objective_sla_violation_requests": lambda: u(0, 1),
        "objective_goodput": lambda: u(0.5, 0.99),
    }


def trace_file(R: random.Random, path: Path) -> None:
    """A synthetic trace in the Azure format at ``path``: 50 to 800 rows."""
    rng = np.random.default_rng(R.randrange(10 ** 6))
    rows = R.randint(50, 800)
    t = np.cumsum(rng.exponential(R.choice([0.1, 1.0, 5.0]), rows))
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{x:.6f},{p},{o}" for x, p, o in zip(t, rng.integers(1, 2000, rows), rng.integers(1, 500, rows))]
    path.write_text("\n".join(lines) + "\n")


def make_spec(R: random.Random, folder: Path, trace: str = "trace.csv") -> dict:
    """A random spec (a dict for :func:`tests.helpers.toml`); a trace it
    replays is written to ``folder / trace``.  Most are valid; some combine values
    the checker must refuse (a variant axis of one kind with a policy
    setting, an objective of a metric the policy lacks, ...)."""
    sample = _ranges(R)
    capacity = R.random() < 0.12
    main = R.choice(KINDS)
    if main not in VARIANT_KINDS:
        kinds = [main]
    else:
        kinds = R.sample(VARIANT_KINDS, R.choice([1, 1, 2, 3]))
        if main not in kinds:
            kinds[0] = main
    spec = {"name": "fz", "seed": R.randint(0, 10 ** 6)}
    if not capacity:
        spec["reps"] = R.randint(1, 3)
    arrivals = R.choice(["poisson", "gamma", "onoff", "trace"] if capacity
                        else ["poisson", "gamma", "onoff", "saturated", "step", "trace"])
    spec["arrivals"] = arrivals
    token_model = POLICIES[main].models[0] if main not in VARIANT_KINDS else R.choice(TOKEN_MODELS)
    if arrivals == "trace" or R.random() < 0.1:
        wl = "trace"
        trace_file(R, folder / trace)
        spec["workload"] = {"trace": trace, "format": "azure",
                            "resample": arrivals != "trace" and R.random() < 0.5}
        spec["service_model"] = model = token_model
    elif POLICIES[main].paper and R.random() < 0.7:
        wl = spec["service"] = R.choice(["uniform", "expon"])
        model = "max"
    else:
        wl = "tokens"
        spec["service_model"] = model = token_model
    params, grid, policies = {}, {}, {}
    names = []
    if len(kinds) > 1 or R.random() < 0.3:
        for i, k in enumerate(kinds + ([R.choice(kinds)] if R.random() < 0.3 else [])):
            names.append(f"v{i}_{k}")
            policies[names[-1]] = {"kind": k}
            if R.random() < 0.2:
                policies[names[-1]]["seed"] = R.randint(0, 100)
    else:
        spec["policy"] = kinds[0]
    points = 1
    if "cluster" in kinds and arrivals not in ("poisson", "saturated") and R.random() < 0.9:
        params["programs"] = "none"         # (programs start as a Poisson process: else refused)
    for name, sp in SPEC_PARAMS.items():
        applies = [k for k in set(kinds) if sp.applies(k, arrivals, wl, model, capacity)]
        if not applies or name in STRUCTURAL or name in params:
            continue
        if capacity and name in SEARCHED:
            continue                        # the search sets the rate
        if not sp.required and R.random() > 0.35:
            continue
        if ((name.startswith("decode_") and params.get("decode", "none") == "none")
                or (name == "engine_batch_size"
                    and "batch_size" not in POLICIES[params.get("engine_policy", "dynamic")].settings)
                or (name == "engine_bins" and "bins" not in POLICIES[params.get("engine_policy", "dynamic")].settings)
                or (name in ("calls", "think_time", "closed_loop")
                    and params.get("programs", "synthetic") != "synthetic")
                or (name == "edges" and wl not in ("uniform", "expon"))):
            continue
        if name in ("engine_policy", "decode", "programs"):
            params[name] = sample[name]()
            continue
        if name == "n":
            params["n"] = R.randint(100, 400) if capacity else sample["n"]()
            continue
        r = R.random()
        if r < 0.2 and points < 6 and len(applies) == len(set(kinds)):
            k = R.choice([1, 2, 2, 3])
            values = []
            for _ in range(10):
                v = sample[name]()
                if v not in values:
                    values.append(v)
                if len(values) == k:
                    break
            if points * len(values) <= 8:
                grid[name] = values
                points *= len(values)
                continue
        if names and r < 0.45:
            for vn in names:
                if policies[vn]["kind"] in applies and (sp.required or R.random() < 0.7):
                    policies[vn][name] = sample[name]()
            if sp.required and any(policies[v]["kind"] in applies and name not in policies[v] for v in names):
                params[name] = sample[name]()
            continue
        params[name] = sample[name]()
    if names:
        if R.random() < 0.95 or len(names) == 1:
            grid["policy"] = names
        else:
            params["policy"] = names[0]     # (variants left off the axis: refused)
    if capacity:
        spec["capacity"] = {"max_reps": 3, "rel_tol": R.choice([0.05, 0.2])}
    spec["params"] = params
    # (n has a default: a spec without a grid sweeps its n, drawn if not set)
    spec["grid"] = grid or {"n": [params.pop("n") if "n" in params else sample["n"]()]}
    if policies:
        spec["policies"] = policies
    return spec


def _refusal(e: SpecError, what: str) -> str:
    """A SpecError's message past its file name, checked to be the checker's
    words, not Python's (:data:`INTERNAL`)."""
    message = str(e).split(": ", 1)[-1]
    assert not any(w in message for w in INTERNAL), f"{what} with an internal error: {message}"
    return message


def mutated(R: random.Random, spec: dict) -> dict:
    """``spec`` with one value replaced by a :data:`JUNK` value (a copy)."""
    m = copy.deepcopy(spec)
    junk = R.choice(JUNK)
    where = R.choice(["params", "grid", "top", "policies", "capacity", "workload"])
    if where == "params" and m["params"]:
        m["params"][R.choice(sorted(m["params"]))] = junk
    elif where == "grid" and m["grid"]:
        k = R.choice(sorted(m["grid"]))
        m["grid"][k] = junk if R.random() < 0.5 else [junk] + list(m["grid"][k])[:1]
    elif where == "policies" and m.get("policies"):
        p = R.choice(sorted(m["policies"]))
        m["policies"][p][R.choice(sorted(m["policies"][p]))] = junk
    elif where == "capacity" and m.get("capacity"):
        m["capacity"][R.choice(sorted(m["capacity"]) + ["confidence", "throughput_tol"])] = junk
    elif where == "workload" and m.get("workload"):
        m["workload"][R.choice(sorted(m["workload"]) + ["model", "log_type"])] = junk
    else:
        m[R.choice(["reps", "seed", "arrivals", "service", "service_model", "policy", "name", "description"])] = junk
    return m


def _check_mutated(R: random.Random, spec: dict, folder: Path) -> str:
    """Mutate ``spec`` (:func:`mutated`) and check the contract; returns what
    happened: "mutant refused", "mutant ran" or "mutant not run"."""
    path = folder / "m.toml"
    path.write_text(toml(mutated(R, spec)))
    try:
        parsed = load_spec(path)
        check_points(parsed)
    except SpecError as e:
        assert "m.toml" in str(e), f"a refusal not naming the file: {e}"
        _refusal(e, "mutant refused")
        assert not (folder / "m.zarr").exists()
        return "mutant refused"
    if max(params["n"] * parsed.reps for _, params in parsed.points()) > MAX_MUTATED_N:
        return "mutant not run"
    run_sweep(path, folder / "m.zarr", workers=1, progress=False)
    report = check_store(folder / "m.zarr")
    assert report.ok, report
    return "mutant ran"


def _cli_throughput(spec: dict) -> str:
    """What ``mbbatch simulate`` prints as the throughput at the spec's first
    grid point (a spec of one policy, no workload table, no capacity)."""
    args = ["--policy", spec["policy"], "--arrivals", spec["arrivals"], "--reps", str(spec["reps"]),
            "--seed", str(spec["seed"])]
    args += ["--service", spec["service"]] if "service" in spec else ["--service-model", spec["service_model"]]
    values = {**spec["params"], **{k: v[0] for k, v in spec["grid"].items()}}
    for k, v in values.items():
        text = "true" if v is True else "false" if v is False else "inf" if v == math.inf else str(v)
        args += ["--" + k.replace("_", "-"), text]
    out = subprocess.run([sys.executable, "-m", "mbbatch.cli", "simulate", *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, (args, out.stderr[-2000:])
    return {line.split()[0]: line.split()[1] for line in out.stdout.splitlines()[1:]}["throughput"]


def fuzz_one(R: random.Random, folder: Path, *, pool=0.0, kill=0.0, dask=0.0, multi=0.0, cli=0.0,
             mutate=0.0) -> tuple:
    """Draw one spec into ``folder`` and check it; returns ``(spec text,
    outcome, note)``: outcome "refused" (note: the SpecError's message) or
    the comparisons made ("ran", "pool", ...).  Raises on any fault."""
    spec = make_spec(R, folder)
    text = toml(spec)
    path = folder / "s.toml"
    path.write_text(text)
    try:
        check_points(load_spec(path))
    except SpecError as e:
        assert not any(folder.glob("*.zarr"))
        return text, ("refused",), _refusal(e, "refused")
    done = ["ran"]
    a = run_sweep(path, folder / "a.zarr", workers=1, progress=False).load()
    report = check_store(folder / "a.zarr")
    assert report.ok, report
    if R.random() < cli and "policies" not in spec and "workload" not in spec and "capacity" not in spec:
        x = np.asarray(a["sim_throughput"].isel({d: 0 for d in a["sim_throughput"].dims if d != "rep"}).values,
                       float)
        assert _cli_throughput(spec) == f"{x.mean() if spec['reps'] > 1 else x[0]:.6g}"
        done.append("cli")
    if R.random() < kill:
        cmd = [sys.executable, "-m", "mbbatch.cli", "sweep", str(path), "--out", str(folder / "k.zarr"),
               "--workers", str(R.choice([1, 2])), "--quiet"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(R.uniform(0.5, 4.0))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            done.append("killed")
        proc.wait()
        assert_identical(a, run_sweep(path, folder / "k.zarr", workers=1, progress=False).load())
        done.append("resumed")
    if R.random() < pool:
        assert_identical(a, run_sweep(path, folder / "b.zarr", workers=2, progress=False).load())
        done.append("pool")
    if R.random() < dask:
        import xarray as xr

        nc = folder / "export" / "d.nc"
        assert_identical(a, run_sweep(path, folder / "d.zarr", scheduler="local", workers=2, progress=False,
                                      netcdf=nc).load())
        with xr.open_dataset(nc) as ds:
            for v in a.data_vars:
                np.testing.assert_array_equal(a[v].values, ds[v].values, err_msg=v)
        done.append("dask")
    if R.random() < mutate:
        done.append(_check_mutated(R, spec, folder))
    if R.random() < multi:
        other = make_spec(R, folder, trace="other.csv")       # (not the first spec's trace)
        other["name"] = "other"
        (folder / "o.toml").write_text(toml(other))
        try:
            check_points(load_spec(folder / "o.toml"))
        except SpecError:
            return text, tuple(done), ""
        alone = run_sweep(folder / "o.toml", folder / "oa.zarr", workers=1, progress=False).load()
        both = run_sweeps([path, folder / "o.toml"], folder / "multi", workers=2, progress=False)
        assert_identical(a, both[0][0].load())
        assert_identical(alone, both[1][0].load())
        done.append("multi")
    return text, tuple(done), ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", type=int, default=100, help="random specs to draw (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    for name, default in (("pool", 0.3), ("kill", 0.15), ("dask", 0.03), ("multi", 0.03), ("cli", 0.2),
                          ("mutate", 0.5)):
        ap.add_argument(f"--{name}", type=float, default=default, metavar="P",
                        help=f"share of accepted specs given this comparison (default {default})")
    ap.add_argument("--timeout", type=float, default=600.0, metavar="S",
                    help="seconds a spec's checks may take before it counts as a failure (default 600)")
    ap.add_argument("--keep-failures", type=Path, default=Path("fuzz-failures"), metavar="DIR",
                    help="where a failing spec's folder is kept (default fuzz-failures/)")
    args = ap.parse_args(argv)
    R = random.Random(args.seed)
    counts, refusals, failures = Counter(), Counter(), 0
    t0 = time.perf_counter()
    bar = tqdm(range(args.specs), unit="spec", file=sys.stderr)

    def too_long(signum, frame):
        raise TimeoutError(f"the spec's checks took more than {args.timeout:g} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    for i in bar:
        folder = Path(tempfile.mkdtemp(prefix="mbbatch-fuzz-"))
        signal.setitimer(signal.ITIMER_REAL, args.timeout)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, done, note = fuzz_one(R, folder, pool=args.pool, kill=args.kill, dask=args.dask,
                                            multi=args.multi, cli=args.cli, mutate=args.mutate)
            counts.update(done)
            if note:
                refusals[note[:100]] += 1
        except Exception:
            failures += 1
            keep = args.keep_failures / f"seed{args.seed}_spec{i}"
            spec_file = folder / "s.toml"
            text = spec_file.read_text() if spec_file.is_file() else ""
            bar.write(f"===== spec {i} (seed {args.seed}) FAILED; kept in {keep}\n{traceback.format_exc()}{text}")
            shutil.copytree(folder, keep, dirs_exist_ok=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            shutil.rmtree(folder, ignore_errors=True)
        bar.set_postfix(failed=failures, refused=counts["refused"])
    signal.signal(signal.SIGALRM, previous)
    print(f"{args.specs} specs in {time.perf_counter() - t0:.0f} s: "
          + ", ".join([f"{failures} failed"] + [f"{k} {v}" for k, v in sorted(counts.items())]))
    for message, c in refusals.most_common(20):
        print(f"  refused {c}x: {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
