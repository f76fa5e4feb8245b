"""`make bench`, before and after: the event kernel's workloads timed in one
process against an earlier commit of mbbatch, run by run.

The earlier commit's package is extracted (``git archive``) into a temporary
folder as ``mbbatch_before`` (the package imports itself relatively) and
imported beside the checkout's, so both run in one process, on the same
machine load: each timing is a pair of runs, the earlier version's and this
one's in turn first, timed in the process's CPU time (a run descheduled
while another process runs does not count it), and a process's ratio is the
median of its pairs' ratios (after / before: below 1 is faster).

The package imported first in a process runs faster, by about 2 % on the
machine these figures were taken on at n = 2e6 (and by 1 ms a call at
n = 1,000), whichever it is: where each package's compiled code lands moves
both (Mytkowicz, Diwan, Hauswirth and Sweeney 2009, "Producing wrong data
without doing anything obviously wrong!", ASPLOS).  So the pairs run twice,
in two processes, each version imported first in one of them, and the ratio
printed is the geometric mean of the two processes' ratios (each shown):
the order's bias cancels.  The cases: the token policies (static, dynamic
and multi-bin dynamic batching on one engine), a 16-engine Autellix cluster
of dynamic batching with programs, and LAPS's 4 instances; the iteration
cost's paths (a measured engine's profile timing the continuous engine,
dynamic batching and multi-bin batching); then the cold
compile of each version's warm-up (fresh processes, the numba cache off,
their CPU time).  A control row runs the earlier version against a second
copy of itself in the same way: what the pairs read when nothing changed.

Run ``python bench/paired.py --before REF`` (``make bench`` runs it against
``BENCH_BEFORE``); ``--only TEXT`` times the cases whose name contains it
(and the control), ``--cold-runs 0`` skips the cold compiles.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import math
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

#: the import orders of the two processes: each version first in one of them
#: (the control row's two copies too)
ORDERS = (("mbbatch", "mbbatch_before", "mbbatch_control"), ("mbbatch_control", "mbbatch_before", "mbbatch"))


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
    from constants import D_SLA

    # (the controller as the earlier commit's default: D_SLA 7.5 ms, the table's default then, 7.4 ms now;
    # a case does the same work in both versions or its ratio times different runs)
    ctl = mb.SLAController(d_sla=D_SLA)
    cluster = mb.Cluster(mb.DynamicBatching(controller=ctl), engines=16, router="autellix",
                         programs=mb.Programs(calls=4, think_time=1.0))

    def token(policy):
        return lambda n, seed: mb.simulate(policy, arrivals=mb.Poisson(4.0), workload=token_wl, n=n, seed=seed)

    # (the iteration cost's paths: an engine measured on real hardware times the continuous engine's
    # iterations, the event kernel's and the multi-bin kernel's batches; its batches-only fit in both
    # versions, as earlier ones' profiles had no measured prefill and a case does the same work in both;
    # a version without profiles, e.g. 3171bff, has none of these cases)
    try:
        profiles = importlib.import_module(mb.__name__ + ".profiles")
    except ModuleNotFoundError:
        profiles = None
    if profiles is not None:
        try:
            measured = profiles.get("H100/vLLM/Meta-Llama-3-8B/tp1", prefill=False)
        except TypeError:
            measured = profiles.get("H100/vLLM/Meta-Llama-3-8B/tp1")

    def timed(policy, rate):
        return lambda n, seed: mb.simulate(policy, arrivals=mb.Poisson(rate), workload=token_wl, n=n, seed=seed,
                                           service_model=measured)

    found = {
        "StaticBatching(B=32)": token(mb.StaticBatching(32, sla=ctl)),
        "DynamicBatching": token(mb.DynamicBatching(controller=ctl)),
        "MultiBinDynamic(K=4)": token(mb.MultiBinDynamic(controller=ctl, bins=4)),
        "Autellix, 16 engines": lambda n, seed: mb.simulate(cluster, arrivals=mb.Poisson(80.0), workload=cluster_wl,
                                                            n=n, seed=seed),
        "LAPS, 4 instances, heavy load": lambda n, seed: mb.simulate(mb.LAPS(instances=4), arrivals=mb.Poisson(100.0),
                                                                     workload=laps_wl, n=n, seed=seed),
    }
    if profiles is not None:
        found.update({
            "ContinuousBatching, measured": timed(mb.ContinuousBatching(), 20.0),
            "ContinuousBatching spf, measured": timed(mb.ContinuousBatching(admission="spf"), 20.0),
            "ContinuousBatching multibin, measured": timed(mb.ContinuousBatching(admission="multibin"), 20.0),
            "DynamicBatching, measured": timed(mb.DynamicBatching(controller=ctl), 4.0),
            "MultiBin(K=4, B=32), measured": timed(mb.MultiBin(bins=4, batch_size=32), 4.0),
        })
        # (the continuous kernel's full variant: an order of its own, multi-step blocks; a version without them
        # has no such case)
        for name, kw in (("ContinuousBatching mlfq, measured", dict(admission="mlfq")),
                         ("ContinuousBatching 4-step, measured", dict(num_scheduler_steps=4))):
            try:
                found[name] = timed(mb.ContinuousBatching(**kw), 20.0)
            except (TypeError, ValueError):
                pass
    return found


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


def worker(order: tuple, folder: Path, n: int, runs: int, only: str = "") -> dict:
    """In this process: import the versions in ``order``, and time the pairs
    of every case.  Returns ``{case: (before s, after s, ratio)}``."""
    sys.path.insert(0, str(folder))
    mods = {name: importlib.import_module(name) for name in order}
    for name in order:
        mods[name].warmup()
    before, after, control = mods["mbbatch_before"], mods["mbbatch"], mods["mbbatch_control"]
    out = {}
    for name, run_before in cases(before).items():
        if only not in name:
            continue
        run_after = cases(after)[name]
        run_before(10_000, 0), run_after(10_000, 0)          # (a cluster compiles on its first run)
        out[name] = pairs(run_before, run_after, n, runs)
    name = "StaticBatching(B=32)"
    run_control = cases(control)[name]
    run_control(10_000, 0)
    out["control"] = pairs(cases(before)[name], run_control, n, runs)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--n", type=int, default=2_000_000, help="requests per run")
    ap.add_argument("--runs", type=int, default=30, help="pairs per case and process (median)")
    ap.add_argument("--cold-runs", type=int, default=5, help="cold compiles per version (median; 0: none)")
    ap.add_argument("--only", default="", help="only the cases whose name contains this (the control runs too)")
    ap.add_argument("--worker", type=int, choices=range(len(ORDERS)), help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(ORDERS[args.worker], args.folder, args.n, args.runs, args.only)))
        return
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                         capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        extract(args.before, folder, "mbbatch_before")
        extract(args.before, folder, "mbbatch_control")
        got = []
        for w, order in enumerate(ORDERS):
            print(f"pairs, imported in the order {', '.join(order)} ...", file=sys.stderr, flush=True)
            got.append(json.loads(subprocess.run(
                [sys.executable, __file__, "--before", args.before, "--n", str(args.n), "--runs", str(args.runs),
                 "--only", args.only, "--worker", str(w), "--folder", str(folder)], check=True, capture_output=True,
                text=True).stdout))
        rows = []
        for name in got[0]:
            (tb1, ta1, r1), (tb2, ta2, r2) = got[0][name], got[1][name]
            label = ("control: StaticBatching(B=32) against a copy of itself" if name == "control"
                     else f"{name}, n={args.n:.0e}")
            rows.append((label, f"{median((tb1, tb2)):.3f} s", f"{median((ta1, ta2)):.3f} s",
                         f"{r1:.3f} / {r2:.3f}", f"{math.sqrt(r1 * r2):.3f}"))
        cb, ca = [], []
        for r in range(args.cold_runs):
            for mine in ((cb, "mbbatch_before", folder), (ca, "mbbatch", ROOT))[::1 if r % 2 == 0 else -1]:
                mine[0].append(cold(mine[1], mine[2]))
        if args.cold_runs > 0:
            rows.append(("cold compile, warmup() (cache off)", f"{median(cb):.2f} s", f"{median(ca):.2f} s", "",
                         f"{median(a / b for a, b in zip(ca, cb)):.3f}"))
    head = ("case", f"before ({rev})", "after (this checkout)", "ratio: after first / before first",
            "after / before")
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"mbbatch paired benchmark against {rev}: CPU time, medians of {args.runs} pairs in each of two processes "
          "(each version imported first in one); ratio: the geometric mean of the two processes' medians of the "
          "pairs' ratios")
    line = "-+-".join("-" * x for x in w)
    for r in (head, None, *rows, None):
        print(line if r is None else " | ".join(c.ljust(x) for c, x in zip(r, w)))


if __name__ == "__main__":
    main()
