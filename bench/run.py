"""`make bench`: speed and memory of the multi-bin kernel.

Model: k = 4 bins, B = 128, Poisson(lambda = 8), uniform(1, 20) service, one
server (stable: Theorem 4.2 puts the k = 4 capacity at 9.97).  Ratios are
taken within one process; times are medians of several runs.  Every timed
run must be stable: a run whose backlog grows (UnstableWarning) stops the
bench, since it would time an overloaded server (the sweep bench's grid is
timed as the sweep runs it, warnings and all).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from statistics import median

import numpy as np
import scipy.stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mbbatch as mb  # noqa: E402

K, B, LAM = 4, 128, 8.0
SERVICE = st.uniform(1, 19)


def policy():
    return mb.MultiBin(bins=K, batch_size=B)


def time_simulate(n, seed):
    t0 = time.perf_counter()
    mb.simulate(policy(), arrivals=mb.Poisson(rate=LAM), service=SERVICE, n=n, seed=seed)
    return time.perf_counter() - t0


def time_numpy_draws(n, seed):
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / LAM, n)
    svc = rng.uniform(1, 20, n)
    elapsed = time.perf_counter() - t0
    del gaps, svc
    return elapsed


def bench_speed(n, runs):
    mb.warmup()
    sim, draw = [], []
    for r in range(runs):  # interleaved, so drift hits both alike
        sim.append(time_simulate(n, r))
        draw.append(time_numpy_draws(n, r))
    ratios = [s / d for s, d in zip(sim, draw)]
    return median(sim), median(draw), median(ratios)


#: the token-level scenario of the dynamic kernels' benchmark
TOKEN_RATE = 4.0


def token_policies():
    from constants import D_SLA

    ctl = mb.SLAController(d_sla=D_SLA)
    return {
        "StaticBatching(B=32)": mb.StaticBatching(32, sla=ctl),
        "DynamicBatching": mb.DynamicBatching(controller=ctl),
        "MultiBinDynamic(K=4)": mb.MultiBinDynamic(controller=ctl, bins=4),
    }


def bench_dynamic(n, runs):
    """Requests/s of the event kernel, one core: prompt U(16, 512) and output
    Exp(mean 128) tokens, the calibrated decode model, Poisson(4) arrivals.
    Each run of a policy is paired with a run of mb.simulate, so the ratio of
    their times is taken under the same machine load."""
    wl = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128))
    out = {}
    for name, pol in token_policies().items():
        times, ratios = [], []
        for r in range(runs):
            t0 = time.perf_counter()
            res = mb.simulate(pol, arrivals=mb.Poisson(rate=TOKEN_RATE), workload=wl, n=n, seed=r)
            times.append(time.perf_counter() - t0)
            ratios.append(times[-1] / time_simulate(n, r))
        out[name] = (median(times), median(ratios), res)
    return out


def bench_simpy(n, sim_per_request, runs):
    from simpy_model import run_simpy

    res = mb.simulate(policy(), arrivals=mb.Poisson(rate=LAM), service=SERVICE, n=n, seed=0,
                      keep_requests=True)
    req = res.requests
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        completed, mean_lat = run_simpy(req.arrival, req.service, res.edges, B)
        times.append(time.perf_counter() - t0)
    # same draws, same model: same answer
    assert completed == res.completed, (completed, res.completed)
    assert abs(mean_lat - res.mean_latency) <= 1e-9 * res.mean_latency, (mean_lat, res.mean_latency)
    per_request = median(times) / n
    return per_request, per_request / sim_per_request


_CHILD = """
import sys, time, json
import scipy.stats as st
t0 = time.perf_counter()
import mbbatch as mb
t1 = time.perf_counter()
mb.warmup()
t2 = time.perf_counter()
out = {"import_s": t1 - t0, "warmup_s": t2 - t1}
n = int(sys.argv[1])
if n:
    t3 = time.perf_counter()
    res = mb.simulate(mb.MultiBin(bins=4, batch_size=128), arrivals=mb.Poisson(rate=8.0),
                      service=st.uniform(1, 19), n=n, seed=0)
    out["run_s"] = time.perf_counter() - t3
    out["throughput"] = res.throughput
# VmHWM, the high-water mark of this process's own memory map: unlike
# ru_maxrss it is not inherited from the parent across fork and exec
with open("/proc/self/status") as f:
    hwm = next(line for line in f if line.startswith("VmHWM:"))
out["peak_rss_mb"] = int(hwm.split()[1]) / 1024
print(json.dumps(out))
"""


def child(n, cache_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


#: a fresh process, the numba cache off: import, then one first call
_COLD = """
import sys, time, json
t0 = time.perf_counter()
import scipy.stats as st
import mbbatch as mb
t1 = time.perf_counter()
if sys.argv[1] == "multibin":
    mb.simulate(mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Poisson(1.0), service=st.uniform(1, 2), n=100,
                seed=0)
else:
    mb.simulate(mb.DynamicBatching(), arrivals=mb.Poisson(1.0),
                workload=mb.Workload(st.uniform(1, 10), st.uniform(1, 10)), n=100, seed=0)
print(json.dumps({"import_s": t1 - t0, "first_s": time.perf_counter() - t1}))
"""


def bench_cold(runs):
    """Cold compile (numba cache off, fresh processes): medians of the import
    and of the first MultiBin and the first token-policy mb.simulate call,
    runs of the two interleaved."""
    env = {**os.environ, "MBBATCH_NUMBA_CACHE": "0", "PYTHONPATH": str(ROOT)}
    out = {"multibin": [], "token": []}
    for _ in range(runs):
        for kind in out:
            res = subprocess.run([sys.executable, "-c", _COLD, kind], env=env, check=True, capture_output=True,
                                 text=True)
            out[kind].append(json.loads(res.stdout))
    return {kind: (median(r["import_s"] for r in v), median(r["first_s"] for r in v)) for kind, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000, help="requests for the speed run")
    ap.add_argument("--n-simpy", type=int, default=100_000, help="requests for the SimPy run")
    ap.add_argument("--n-memory", type=int, default=100_000_000, help="requests for the memory run")
    ap.add_argument("--runs", type=int, default=7, help="runs per timing (median)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    warnings.simplefilter("error", mb.UnstableWarning)

    rows = []
    sim_t, draw_t, ratio = bench_speed(args.n, args.runs)
    rows.append(("mb.simulate, n=%.0e" % args.n, f"{sim_t:.3f} s", f"{args.n / sim_t / 1e6:.1f} M requests/s", ""))
    rows.append(("numpy draws (n exponentials + n uniforms)", f"{draw_t:.3f} s", "", ""))
    rows.append(("simulate / numpy draws", f"{ratio:.2f}", "target <= 1.0", "PASS" if ratio <= 1.0 else "FAIL"))

    for name, (t, ratio, res) in bench_dynamic(args.n, max(3, args.runs // 2)).items():
        rate = args.n / t
        rows.append((f"{name}, n=%.0e" % args.n, f"{t:.3f} s", f"{rate / 1e6:.1f} M requests/s",
                     "PASS" if rate >= 20e6 else "FAIL"))
        rows.append(("  its time / mb.simulate's", f"{ratio:.2f}",
                     f"b = {res.mean_batch_size:.1f}, util {res.utilization:.2f}", ""))

    simpy_per_req, speedup = bench_simpy(args.n_simpy, sim_t / args.n, max(1, args.runs // 3))
    rows.append(("SimPy, n=%.0e, per request" % args.n_simpy, f"{simpy_per_req * 1e6:.2f} us", "", ""))
    rows.append(("SimPy / mb.simulate per request", f"{speedup:.0f}x", "target >= 100x",
                 "PASS" if speedup >= 100 else "FAIL"))

    with tempfile.TemporaryDirectory() as cache:
        cold = child(0, cache)
        warm = child(args.n_memory, cache)
    rows.append(("numba compile, cold (warmup())", f"{cold['warmup_s']:.2f} s", "", ""))
    rows.append(("numba compile, cached (warmup())", f"{warm['warmup_s']:.2f} s", "", ""))
    rows.append(("peak RSS, n=%.0e (whole process)" % args.n_memory, f"{warm['peak_rss_mb']:.0f} MB",
                 "target < 300 MB", "PASS" if warm["peak_rss_mb"] < 300 else "FAIL"))
    rows.append(("  its run time", f"{warm['run_s']:.2f} s",
                 f"{args.n_memory / warm['run_s'] / 1e6:.1f} M requests/s", ""))
    rows.append(("  peak RSS of a cold compile (import + warmup)", f"{cold['peak_rss_mb']:.0f} MB", "", ""))
    first = bench_cold(max(3, args.runs // 2))
    rows.append(("cold compile (cache off): import mbbatch", f"{first['multibin'][0]:.2f} s", "", ""))
    for kind, name, target in (("multibin", "MultiBin", 4.0), ("token", "token-policy (DynamicBatching)", 8.0)):
        t = first[kind][1]
        rows.append((f"  then the first {name} mb.simulate", f"{t:.2f} s", f"target <= {target:g} s",
                     "PASS" if t <= target else "FAIL"))

    import workloads as workload_bench   # bench/workloads.py

    for name, t, ratio in workload_bench.bench_workloads(args.n, max(3, args.runs // 2)):
        target = workload_bench.TARGETS.get(name)
        rows.append((f"MultiBin, {name}, n=%.0e" % args.n, f"{t:.3f} s", f"{args.n / t / 1e6:.1f} M requests/s",
                     ""))
        if target is not None:
            rows.append(("  its time / Poisson-uniform's", f"{ratio:.2f}", f"target <= {target:g}",
                         "PASS" if ratio <= target else "FAIL"))
        elif name in workload_bench.UNTARGETED:
            rows.append(("  its time / Poisson-uniform's", f"{ratio:.2f}", "(no target)", ""))

    import laps as laps_bench   # bench/laps.py

    for name, t in laps_bench.bench_laps(args.n):
        rate = args.n / t
        rows.append((f"LAPS, 4 instances, {name}, n=%.0e" % args.n, f"{t:.3f} s", f"{rate / 1e6:.1f} M requests/s",
                     "PASS" if rate >= laps_bench.TARGET else "FAIL"))

    import continuous as continuous_bench   # bench/continuous.py

    got = continuous_bench.bench_continuous(args.n)
    for seqs, t, res in got:
        rate = args.n / t
        target = seqs == 256
        rows.append((f"ContinuousBatching(max_num_seqs={seqs}), 80 % load, n={args.n:.0e}", f"{t:.3f} s",
                     f"{rate / 1e6:.1f} M requests/s ({res.preemptions:,} preemptions)",
                     ("PASS" if rate >= continuous_bench.TARGET else "FAIL") if target else ""))
    ratio = got[2][1] / got[0][1]
    rows.append(("  time per request, 1,024 sequences / 64", f"{ratio:.2f}",
                 f"target <= {continuous_bench.SCALING_TARGET:g}",
                 "PASS" if ratio <= continuous_bench.SCALING_TARGET else "FAIL"))
    m = max(1, args.n // 10)
    t_cluster, t_one = continuous_bench.bench_cluster(m)
    rows.append((f"Cluster of {continuous_bench.ENGINES} ContinuousBatching engines, least used, n=%.0e" % m,
                 f"{t_cluster:.3f} s", f"{m / t_cluster / 1e6:.2f} M requests/s", ""))
    rows.append(("  its time per request / one engine's", f"{t_cluster / t_one:.2f}", "(no target)", ""))
    for name, t, targeted, sys_t in continuous_bench.bench_orders(args.n):
        rate = args.n / t
        rows.append((f"ContinuousBatching(admission={name}), 256 sequences, n={args.n:.0e}", f"{t:.3f} s",
                     f"{rate / 1e6:.1f} M requests/s ({sys_t:.2f} s of it system time)",
                     ("PASS" if rate >= continuous_bench.TARGET else "FAIL") if targeted else ""))

    t, res = continuous_bench.bench_prefix(args.n)
    rate = args.n / t
    rows.append((f"ContinuousBatching(prefix_caching=True), 64 system prompts, n={args.n:.0e}", f"{t:.3f} s",
                 f"{rate / 1e6:.1f} M requests/s (hit rate {res.prefix_hit_rate:.0%}, "
                 f"{res.kv_evictions:,} blocks evicted)",
                 "PASS" if rate >= continuous_bench.PREFIX_TARGET else "FAIL"))

    t, res = continuous_bench.bench_disaggregated(args.n)
    rate = args.n / t
    rows.append((f"Disaggregated, {continuous_bench.ENGINES} prefill + {continuous_bench.ENGINES} decode engines, "
                 f"n={args.n:.0e}", f"{t:.3f} s", f"{rate / 1e6:.1f} M requests/s (transfer "
                 f"{res.mean_transfer_time * 1e3:.2f} ms, decode pool busy {res.decode_utilization:.0%})",
                 "PASS" if rate >= continuous_bench.DISAGGREGATED_TARGET else "FAIL"))

    import cluster as cluster_bench   # bench/cluster.py

    for what, t in zip(("simulate", "its kernel"), cluster_bench.bench_cluster(args.n)):
        rate = args.n / t
        rows.append((f"Autellix, {cluster_bench.ENGINES} engines, {what}, n=%.0e" % args.n, f"{t:.3f} s",
                     f"{rate / 1e6:.1f} M requests/s", "PASS" if rate >= cluster_bench.TARGET else "FAIL"))

    import capacity as capacity_bench   # bench/capacity.py

    t, res, want = capacity_bench.bench_capacity()
    rows.append(("find_capacity to 1 %, paper's model k=4, n=1e5", f"{t:.2f} s",
                 f"target <= {capacity_bench.TARGET_SECONDS:g} s",
                 "PASS" if t <= capacity_bench.TARGET_SECONDS else "FAIL"))
    rows.append(("  its probes, simulated requests", f"{res.n_probes}", f"{res.requests:.3g} requests", ""))
    # (the capacity's confidence interval, rate_ci; rate_low and rate_high, deprecated, were the first search's
    # bracket)
    low, high = res.rate_ci
    rows.append(("  its rate against Theorem 4.2", f"{res.rate:.4f}",
                 f"[{low:.4f}, {high:.4f}] vs {want:.4f}",
                 "PASS" if low <= want <= high else "FAIL"))

    import sweeps as sweep_bench   # bench/sweeps.py

    wall, kernel, share = sweep_bench.sweep_kernel_share(runs=3)
    rows.append(("sweeps/fig3.toml, 1 worker, from scratch", f"{wall:.2f} s", f"kernels {kernel:.2f} s", ""))
    rows.append(("  the kernels' share of its wall time", f"{100 * share:.0f}%",
                 f"target >= {100 * sweep_bench.KERNEL_SHARE_TARGET:.0f}%",
                 "PASS" if share >= sweep_bench.KERNEL_SHARE_TARGET else "FAIL"))
    t = sweep_bench.make_figures_seconds()
    rows.append(("make figures from an empty results/", f"{t:.1f} s",
                 f"target <= {sweep_bench.MAKE_FIGURES_TARGET:.0f} s",
                 "PASS" if t <= sweep_bench.MAKE_FIGURES_TARGET else "FAIL"))

    w = [max(len(r[i]) for r in rows) for i in range(4)]
    line = "-+-".join("-" * x for x in w)
    print(f"mbbatch benchmark: multi-bin k={K}, B={B}, lambda={LAM}, uniform(1, 20), one server; "
          f"token policies: Poisson({TOKEN_RATE}), prompt U(16, 512), output Exp(128), decode model; "
          f"target >= 20 M requests/s; medians of {args.runs} runs")
    print(line)
    for r in rows:
        print(" | ".join(c.ljust(x) for c, x in zip(r, w)))
    print(line)


if __name__ == "__main__":
    main()
