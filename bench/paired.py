"""`make bench`, before and after: the event kernel's workloads timed in one
process against an earlier commit of mbbatch, run by run.

The earlier commit's package is extracted (``git archive``) into a temporary
folder as ``mbbatch_before`` (the package imports itself relatively) and
imported beside the checkout's, so both run in this process, on the same
machine load: each timing is a pair, the earlier version's run then this
one's, and the ratio is the median of the pairs' ratios (after / before:
below 1 is faster).  The cases: the token policies (static, dynamic and
multi-bin dynamic batching on one engine), a 16-engine Autellix cluster of
dynamic batching with programs, and LAPS's 4 instances; then the cold compile
of each version's warm-up (fresh processes, the numba cache off).

Run ``python bench/paired.py --before REF`` (``make bench`` runs it against
``BENCH_BEFORE``).
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import scipy.stats as st  # noqa: E402

import mbbatch as after  # noqa: E402


def extract(ref: str, folder: Path) -> None:
    """The package of commit ``ref`` as ``folder/mbbatch_before``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "mbbatch"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "mbbatch").rename(folder / "mbbatch_before")


def cases(mb) -> dict:
    """name -> a function of (n, seed) running one simulation of version ``mb``."""
    token_wl = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128))
    cluster_wl = mb.Workload(prompt=st.lognorm(1.0, scale=300), output=st.lognorm(0.8, scale=64))
    laps_wl = mb.Workload(prompt=st.lognorm(1.0, scale=200), output=st.lognorm(0.8, scale=64))
    cluster = mb.Cluster(engines=16, router="autellix", programs=mb.Programs(calls=4, think_time=1.0))

    def token(policy):
        return lambda n, seed: mb.simulate(policy, arrivals=mb.Poisson(4.0), workload=token_wl, n=n, seed=seed)

    return {
        "StaticBatching(B=32)": token(mb.StaticBatching(32)),
        "DynamicBatching": token(mb.DynamicBatching()),
        "MultiBinDynamic(K=4)": token(mb.MultiBinDynamic(bins=4)),
        "Autellix, 16 engines": lambda n, seed: mb.simulate(cluster, arrivals=mb.Poisson(80.0), workload=cluster_wl,
                                                            n=n, seed=seed),
        "LAPS, 4 instances, heavy load": lambda n, seed: mb.simulate(mb.LAPS(instances=4), arrivals=mb.Poisson(100.0),
                                                                     workload=laps_wl, n=n, seed=seed),
    }


_COLD = """
import json, sys, time
t0 = time.perf_counter()
mb = __import__(sys.argv[1])
mb.warmup()
print(json.dumps({"warmup_s": time.perf_counter() - t0}))
"""


def cold(package: str, path: Path, runs: int) -> float:
    """Median seconds of ``import package; package.warmup()`` in fresh
    processes with the numba cache off."""
    env = {**os.environ, "MBBATCH_NUMBA_CACHE": "0", "PYTHONPATH": str(path)}
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _COLD, package], env=env, check=True, capture_output=True,
                             text=True)
        times.append(json.loads(out.stdout)["warmup_s"])
    return median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--n", type=int, default=10_000_000, help="requests per run")
    ap.add_argument("--runs", type=int, default=9, help="pairs per case (median)")
    ap.add_argument("--cold-runs", type=int, default=3, help="cold compiles per version (median)")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                         capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        extract(args.before, folder)
        sys.path.insert(0, str(folder))
        before = importlib.import_module("mbbatch_before")
        before.warmup()
        after.warmup()
        rows = []
        for name, run_before in cases(before).items():
            run_after = cases(after)[name]
            run_before(10_000, 0), run_after(10_000, 0)          # (a cluster compiles on its first run)
            tb, ta = [], []
            for r in range(args.runs):
                t0 = time.perf_counter()
                run_before(args.n, r)
                tb.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                run_after(args.n, r)
                ta.append(time.perf_counter() - t0)
            ratio = median(a / b for a, b in zip(ta, tb))
            rows.append((f"{name}, n={args.n:.0e}", f"{median(tb):.3f} s", f"{median(ta):.3f} s", f"{ratio:.3f}"))
        cb, ca = cold("mbbatch_before", folder, args.cold_runs), cold("mbbatch", ROOT, args.cold_runs)
        rows.append(("cold compile, warmup() (cache off)", f"{cb:.2f} s", f"{ca:.2f} s", f"{ca / cb:.3f}"))
    head = ("case", f"before ({rev})", "after (this checkout)", "after / before")
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    print(f"mbbatch paired benchmark against {rev}: medians of {args.runs} pairs, one process "
          "(ratio: the median of the pairs' ratios)")
    line = "-+-".join("-" * x for x in w)
    for r in (head, None, *rows, None):
        print(line if r is None else " | ".join(c.ljust(x) for c, x in zip(r, w)))


if __name__ == "__main__":
    main()
