"""`make bench`, capacity search: `mb.find_capacity` to 1 % for the paper's
model (MultiBin k = 4, B = 128, U(1, 20), one server, n = 100,000 a
replication), in this process on one core: wall time (median of several
searches, compilation excluded), probes and simulated requests, and the
found rate against Theorem 4.2.  Target: under 5 s.

Run alone (``python bench/capacity.py``) or through ``bench/run.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

import scipy.stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mbbatch as mb  # noqa: E402
from mbbatch import theory  # noqa: E402

#: seconds a 1 % capacity search of the paper's model may take
TARGET_SECONDS = 5.0


def bench_capacity(runs: int = 5):
    """``(median seconds, result of the last run, Theorem 4.2's capacity)``;
    each run has its own seed."""
    mb.warmup()
    pol = mb.MultiBin(bins=4, batch_size=128)
    times, res = [], None
    for seed in range(runs):
        res = mb.find_capacity(pol, service=st.uniform(1, 19), rel_tol=0.01, n=100_000, seed=seed)
        times.append(res.seconds)
    return median(times), res, 128 / theory.service_time(128, 1.0, 20.0, 4)


def main():
    t, res, want = bench_capacity()
    verdict = "PASS" if t <= TARGET_SECONDS else "FAIL"
    print(f"capacity search to 1 %, paper's model k=4: {t:.2f} s (target <= {TARGET_SECONDS:g} s) {verdict}; "
          f"{res.n_probes} probes, {res.requests:.3g} requests; {res.rate:.4f} [{res.rate_ci[0]:.4f}, "
          f"{res.rate_ci[1]:.4f}] against Theorem 4.2's {want:.4f}")


if __name__ == "__main__":
    main()
