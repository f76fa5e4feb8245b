"""`make bench`, sweeps: how much of a sweep's time the kernels take, and how
long `make figures` takes from an empty results folder.

Run alone (``python bench/sweeps.py``) or through ``bench/run.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: targets of the sweeps: the share of fig3's wall time (one worker) in the
#: kernels, and `make figures` from an empty results folder (.venv present)
KERNEL_SHARE_TARGET = 0.70
MAKE_FIGURES_TARGET = 60.0


def _scratch():
    """A temporary folder inside the project, where `make figures` writes its
    stores (a machine's /tmp may sit on a slower file system)."""
    return tempfile.TemporaryDirectory(prefix=".bench-", dir=ROOT)


def sweep_kernel_share(spec="sweeps/fig3.toml", runs=3):
    """Median (wall time, kernel time, share) of a sweep run from scratch on
    one worker, in this process (imports and compilation excluded)."""
    import mbbatch as mb
    from mbbatch.sweeps import run_sweeps

    mb.warmup()
    walls, kernels, shares = [], [], []
    with _scratch() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(runs):
            ((_, s),) = run_sweeps([ROOT / spec], Path(tmp) / str(r), workers=1, progress=False)
            walls.append(s.wall)
            kernels.append(s.kernel)
            shares.append(s.kernel_share)
    return median(walls), median(kernels), median(shares)


def _data_dir() -> str:
    """Where `make figures` looks for traces (the Makefile's MBBATCH_DATA)."""
    if os.environ.get("MBBATCH_DATA"):
        return os.environ["MBBATCH_DATA"]
    for d in (ROOT / "data", ROOT.parent / "shared" / "data"):
        if d.is_dir():
            return str(d)
    return ""


def make_figures_seconds(runs=1):
    """Median wall time of `make figures`'s work from an empty results
    folder, as whole commands, the Makefile's (imports, pool start, sweeps,
    the examples, figures on every core),
    into a temporary folder (the committed figures are not touched)."""
    exe = Path(sys.executable).parent / "mbbatch"
    specs = sorted(str(p) for p in (ROOT / "sweeps").glob("*.toml"))
    times = []
    for _ in range(runs):
        with _scratch() as tmp:
            res, figs = Path(tmp) / "results", Path(tmp) / "figures"
            t0 = time.perf_counter()
            for cmd in ([str(exe), "sweep", *specs, "--out-dir", str(res), "--quiet", "--skip-missing-traces"],
                        [str(exe), "example", "fig1b", "engine_event", "--out-dir", str(res)],
                        [str(exe), "figures", "--results", str(res), "--out", str(figs)]):
                subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "MBBATCH_DATA": _data_dir()})
            times.append(time.perf_counter() - t0)
    return median(times)


def main():
    wall, kernel, share = sweep_kernel_share()
    verdict = "PASS" if share >= KERNEL_SHARE_TARGET else "FAIL"
    print(f"sweeps/fig3.toml, 1 worker: {wall:.2f} s, kernels {kernel:.2f} s = {100 * share:.0f}% "
          f"(target >= {100 * KERNEL_SHARE_TARGET:.0f}%) {verdict}")
    t = make_figures_seconds()
    verdict = "PASS" if t <= MAKE_FIGURES_TARGET else "FAIL"
    print(f"make figures from an empty results/: {t:.1f} s (target <= {MAKE_FIGURES_TARGET:.0f} s) {verdict}")


if __name__ == "__main__":
    main()
