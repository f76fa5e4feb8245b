"""`make bench`, multi-engine serving: requests/s of a 4-instance LAPS setup
(dual queue, 5 ms window, dynamic allocation: the specification's defaults)
at n = 10^7, log-normal prompts (median 200 tokens, sigma 1), at a light and
a heavy load.  Target: at least 10 million requests/s on one core.

Run alone (``python bench/laps.py``) or through ``bench/run.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from statistics import median

import scipy.stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mbbatch as mb  # noqa: E402

#: requests/s a LAPS run must reach
TARGET = 10e6
#: (name, arrival rate): about 55 % and 90 % of the 4 instances' capacity
LOADS = (("light load", 60.0), ("heavy load", 100.0))


def bench_laps(n: int = 10_000_000, runs: int = 3) -> list:
    """``[(name, median seconds), ...]`` of the loads."""
    mb.warmup()
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=200), output=st.lognorm(0.8, scale=64))
    out = []
    for name, rate in LOADS:
        times = []
        for r in range(runs):
            t0 = time.perf_counter()
            mb.simulate(mb.LAPS(instances=4), arrivals=mb.Poisson(rate), workload=wl, n=n, seed=r)
            times.append(time.perf_counter() - t0)
        out.append((name, median(times)))
    return out


def main():
    n = 10_000_000
    for name, t in bench_laps(n):
        rate = n / t
        print(f"LAPS, 4 instances, {name}, n={n:.0e}: {t:.3f} s, {rate / 1e6:.1f} M requests/s "
              f"(target >= {TARGET / 1e6:g} M) {'PASS' if rate >= TARGET else 'FAIL'}")


if __name__ == "__main__":
    main()
