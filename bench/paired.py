"""`make bench`, before and after: the event kernel's workloads timed in one
process against an earlier commit of mbbatch, run by run.

The earlier commit's package is extracted (``git archive``) into a temporary
folder as ``mbbatch_before`` (the package imports itself relatively) and
imported beside the checkout's, so both run in this process, on the same
machine load: each timing is a pair of runs, the earlier version's and this
one's in turn first, timed in the process's CPU time (a run descheduled
while another process runs does not count it), and the ratio is the median
of the pairs' ratios (after / before: below 1 is faster).  The cases: the
token policies (static, dynamic and multi-bin dynamic batching on one
engine), a 16-engine Autellix cluster of dynamic batching with programs, and
LAPS's 4 instances; then the cold compile of each version's warm-up (fresh
processes, the numba cache off, their CPU time).  A control row runs the
earlier version against a second copy of itself: what the pairs read when
nothing changed (on a 2-core machine shared with others, a few per cent).

Run ``python bench/paired.py --before REF`` (``make bench`` runs it against
``BENCH_BEFORE``).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import resource
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


def extract(ref: str, folder: Path, name: str) -> None:
    """The package of commit ``ref`` as ``folder/name``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "mbbatch"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "mbbatch").rename(folder / name)


def pairs(run_a, run_b, n: int, runs: int) -> tuple:
    """Medians of ``runs`` pairs of runs of ``n`` requests (CPU time, s, the
    two in turn first) and the median of the pairs' ratios b / a."""
    ta, tb = [], []
    for r in range(runs):
        for which in ((run_a, ta), (run_b, tb)) if r % 2 == 0 else ((run_b, tb), (run_a, ta)):
            t0 = time.process_time()
            which[0](n, r)
            which[1].append(time.process_time() - t0)
    return median(ta), median(tb), median(b / a for a, b in zip(ta, tb))


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
import sys
mb = __import__(sys.argv[1])
mb.warmup()
"""


def cold(package: str, path: Path) -> float:
    """CPU seconds of ``import package; package.warmup()`` in a fresh process
    with the numba cache off."""
    env = {**os.environ, "MBBATCH_NUMBA_CACHE": "0", "PYTHONPATH": str(path)}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", _COLD, package], env=env, check=True, capture_output=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--n", type=int, default=2_000_000, help="requests per run")
    ap.add_argument("--runs", type=int, default=30, help="pairs per case (median)")
    ap.add_argument("--cold-runs", type=int, default=5, help="cold compiles per version (median)")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                         capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        extract(args.before, folder, "mbbatch_before")
        extract(args.before, folder, "mbbatch_control")
        sys.path.insert(0, str(folder))
        before = importlib.import_module("mbbatch_before")
        control = importlib.import_module("mbbatch_control")
        for mb in (before, control, after):
            mb.warmup()
        rows = []
        for name, run_before in cases(before).items():
            run_after = cases(after)[name]
            run_before(10_000, 0), run_after(10_000, 0)          # (a cluster compiles on its first run)
            tb, ta, ratio = pairs(run_before, run_after, args.n, args.runs)
            rows.append((f"{name}, n={args.n:.0e}", f"{tb:.3f} s", f"{ta:.3f} s", f"{ratio:.3f}"))
        name = "StaticBatching(B=32)"
        run_control = cases(control)[name]
        run_control(10_000, 0)
        tb, tc, ratio = pairs(cases(before)[name], run_control, args.n, args.runs)
        rows.append((f"control: {name} against a copy of itself", f"{tb:.3f} s", f"{tc:.3f} s", f"{ratio:.3f}"))
        cb, ca = [], []
        for r in range(args.cold_runs):
            for mine in ((cb, "mbbatch_before", folder), (ca, "mbbatch", ROOT))[::1 if r % 2 == 0 else -1]:
                mine[0].append(cold(mine[1], mine[2]))
        rows.append(("cold compile, warmup() (cache off)", f"{median(cb):.2f} s", f"{median(ca):.2f} s",
                     f"{median(a / b for a, b in zip(ca, cb)):.3f}"))
    head = ("case", f"before ({rev})", "after (this checkout)", "after / before")
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    print(f"mbbatch paired benchmark against {rev}: CPU time, medians of {args.runs} pairs, one process "
          "(ratio: the median of the pairs' ratios)")
    line = "-+-".join("-" * x for x in w)
    for r in (head, None, *rows, None):
        print(line if r is None else " | ".join(c.ljust(x) for c, x in zip(r, w)))


if __name__ == "__main__":
    main()
