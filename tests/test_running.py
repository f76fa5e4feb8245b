"""Running kernels (mbbatch/_running.py): Ctrl-C stops a long simulate within
about a second, on a real process; memory and clock checks refuse what
cannot run."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from mbbatch._running import check_clock, check_memory, format_bytes, interruptible, stop_flag

from .helpers import ROOT, take_ctrl_c

LONG_RUN = textwrap.dedent("""
    import sys, scipy.stats as st, mbbatch as mb
    mb.warmup()
    print("ready", flush=True)
    try:
        if sys.argv[1] == "multibin":
            mb.simulate(mb.MultiBin(bins=4, batch_size=128), arrivals=mb.Poisson(8.0),
                        service=st.uniform(1, 19), n=10**10, seed=0)
        else:
            mb.simulate(mb.DynamicBatching(), arrivals=mb.Poisson(4.0),
                        workload=mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128)),
                        n=10**10, seed=0)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


@pytest.mark.parametrize("kernel", ["multibin", "dynamic"])
def test_ctrl_c_stops_a_long_simulate(kernel):
    """n = 10**10 takes minutes; Ctrl-C raised KeyboardInterrupt only once the
    kernel returned.  It now arrives within about a second."""
    proc = subprocess.Popen([sys.executable, "-c", LONG_RUN, kernel], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=take_ctrl_c)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)                                  # well into the kernel
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.strip() == "interrupted" and proc.returncode == 0
    # far below the minutes the run takes (not a speed test: a loaded machine is fine)
    assert time.monotonic() - t0 < 10


def test_interruptible_returns_the_value_and_raises_the_error():
    stop = stop_flag()
    assert interruptible(lambda: 42, stop) == 42

    def fail():
        raise MemoryError("big")

    with pytest.raises(MemoryError, match="big"):
        interruptible(fail, stop)


def test_check_memory_names_the_largest_part():
    assert check_memory({"bins": (100, "x"), "n": (10, "y")}) == 110
    with pytest.raises(ValueError, match=r"^keep_requests: this run needs 8\.0 EiB|^keep_requests: this run needs"):
        check_memory({"bins": (100, "x"), "keep_requests": (2**63, "the per-request arrays")})
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(10) == "10 bytes"


def test_check_clock():
    check_clock(1e6, 1.0, "times")                   # spacing 1e-10 s: fine
    with pytest.raises(ValueError, match="times reach 1e\\+308 s"):
        check_clock(1e308, 1.0, "times")
    with pytest.raises(ValueError, match="times reach"):
        check_clock(np.inf, 1.0, "times")
    check_clock(1e308, 0.0, "times")                  # no yardstick: not assessed
