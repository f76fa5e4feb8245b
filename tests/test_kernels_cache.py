"""The kernels' disk cache (mbbatch/_kernels/__init__.py): a second process
loads the kernels without compiling, and a change to any kernel module (a
helper another kernel compiles in) makes the next process compile afresh.
On a copy of the package, in fresh processes: a heavy check (20 s of
compiling), run by `make thorough`."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import scipy.stats as st
from numba.core import event
import mbbatch as mb

compiled = []

class Listener(event.Listener):
    def on_start(self, ev):
        pass

    def on_end(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__qualname__)

with event.install_listener("numba:compile", Listener()):
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Poisson(1.0), service=st.uniform(1, 2),
                      n=100, seed=0)
print(res.completed, len(compiled), "multibin_kernel" in compiled)
"""


def run_child(root):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "MBBATCH_NUMBA_CACHE")}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, cwd=root,
                         env={**env, "PYTHONPATH": str(root)})
    completed, n_compiled, kernel = out.stdout.split()
    return int(completed), int(n_compiled), kernel == "True"


def test_cache_is_reused_and_dropped_when_a_kernel_module_changes(tmp_path):
    shutil.copytree(ROOT / "mbbatch", tmp_path / "mbbatch", ignore=shutil.ignore_patterns("__pycache__"))
    first = run_child(tmp_path)
    assert first[1] > 0 and first[2]                    # compiled, and cached
    assert run_child(tmp_path) == (first[0], 0, False)  # loaded from the cache
    common = tmp_path / "mbbatch" / "_kernels" / "common.py"
    common.write_text(common.read_text() + "\n# a change in a helper the kernel compiles in\n")
    again = run_child(tmp_path)
    assert again[0] == first[0] and again[2]            # the kernel compiled afresh
