"""Shared helpers of the sweep tests (not a test module)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]

SMALL = """
name = "small"
description = "a small sweep for the tests"
policy = "multibin"
arrivals = "poisson"
service = "uniform"
reps = 3
seed = 7

[params]
batch_size = 8
l_min = 1.0
l_max = 20.0
n = 4000

[grid]
bins = [1, 3]
rate = [0.2, 0.5, 2.0]
"""


def cli_run(*args, cwd=None) -> subprocess.CompletedProcess:
    """``mbbatch ARGS`` run in this process (``mbbatch.cli.main``, as the
    ``mbbatch`` script calls it), its output captured: its exit status (an
    argparse exit's too), stdout and stderr, as ``subprocess.run`` gives a
    process's.  A test of what only a process shows (a signal, the script
    itself) runs one; the rest save its start-up (seconds each)."""
    import contextlib
    import io

    from mbbatch import cli

    out, err = io.StringIO(), io.StringIO()
    argv = [str(a) for a in args]
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            here = os.getcwd()
            os.chdir(cwd)
            stack.callback(os.chdir, here)
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = cli.main(argv)
        except SystemExit as exc:           # argparse: --help, a bad flag
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["mbbatch", *argv], code, out.getvalue(), err.getvalue())


#: deterministic attrs: everything but the volatile git state of a work tree
VOLATILE_ATTRS = {"git_commit"}


def write(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def assert_identical(a: xr.Dataset, b: xr.Dataset):
    """Bit-identical data (NaN equal to NaN) and deterministic attrs."""
    assert set(a.data_vars) == set(b.data_vars)
    for v in a.data_vars:
        np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=v)
    for c in a.coords:
        np.testing.assert_array_equal(a[c].values, b[c].values)
    strip = lambda d: {k: v for k, v in d.items() if k not in VOLATILE_ATTRS}  # noqa: E731
    assert strip(a.attrs) == strip(b.attrs)


def n_done(out) -> int:
    """Grid points a (possibly running) sweep has marked done so far."""
    import zarr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return int(np.sum(zarr.open_array(store=str(out), path="done", mode="r")[...]))
    except Exception:  # noqa: BLE001 - not created yet, or a chunk being replaced
        return 0


def take_ctrl_c():
    """``preexec_fn`` of a child that is sent Ctrl-C: SIGINT back to its
    default.  A shell starts background jobs with SIGINT ignored, children
    inherit that, and Python then keeps it ignored: a suite run in the
    background would otherwise see its Ctrl-C tests hang."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_sweep(spec_path, out, workers, points, session=False):
    """Start a real `mbbatch sweep` process (in a session of its own, as a
    terminal's foreground job, if ``session``) and return it once ``points``
    grid points are stored (it must still be running then)."""
    cmd = [sys.executable, "-m", "mbbatch.cli", "sweep", str(spec_path), "--out", str(out), "--workers",
           str(workers), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=session,
                            preexec_fn=take_ctrl_c)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if n_done(out) >= points or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed: make it slower"
    return proc


SLOW = SMALL.replace("n = 4000", "n = 4000000").replace("bins = [1, 3]", "bins = [1, 2, 3, 4]").replace(
    "rate = [0.2, 0.5, 2.0]", "rate = [0.5, 1.0, 1.5, 2.0, 3.0]")


TOKEN = """
name = "tok"
policy = "{policy}"
arrivals = "{arrivals}"
service_model = "decode"
reps = 2
seed = 3

[params]
prompt_median = 128.0
prompt_sigma = 0.5
output_median = 64.0
output_sigma = 0.8
d_sla = 0.0074
eta = 20000.0
n = 1500
{extra}

[grid]
{grid}
"""


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return json.dumps(v)          # a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml(spec: dict) -> str:
    """A spec (a dict of keys and tables) as TOML text."""
    top = [f"{k} = {toml_value(v)}" for k, v in spec.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())
              for k, v in spec.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"
