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
import scipy.stats as st

import mbbatch as mb
from mbbatch import _running
from mbbatch._kernels.common import ARRIVED, BLOCK, STOP_SIZE
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


def test_interruptible_shows_the_requests_arrived_once_the_run_is_long(monkeypatch, capsys):
    monkeypatch.setattr(_running, "PROGRESS_DELAY", 0.0)
    stop = stop_flag()

    def run():
        for k in range(1, 5):          # (the kernel writes the requests arrived at each block)
            stop[ARRIVED] = 250 * k
            time.sleep(2 * _running.POLL_SECONDS)
        return "done"

    assert interruptible(run, stop, total=1000) == "done"
    err = capsys.readouterr().err
    assert "simulate:" in err and "500/1.00k" in err and "750/1.00k" in err, err


def test_a_short_run_shows_no_progress(capsys):
    assert interruptible(lambda: 42, stop_flag(), total=1000) == 42
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("policy", ["multibin", "dynamic", "laps"])
def test_every_kernel_writes_the_requests_arrived(policy, monkeypatch):
    """What the progress bar reads: at each check, the requests arrived so
    far (the kernels check at every block, LAPS every 65,536 events)."""
    flag = _running.new_stop_flag()
    assert flag.shape == (STOP_SIZE,) and not flag.any()
    monkeypatch.setattr(_running._enclosing, "stop", flag, raising=False)
    wl = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128))
    n = 300_000
    if policy == "multibin":
        mb.simulate(mb.MultiBin(bins=2, batch_size=8), mb.Poisson(0.3), st.uniform(1, 19), n=n, seed=0)
    elif policy == "dynamic":
        mb.simulate(mb.DynamicBatching(), mb.Poisson(4.0), workload=wl, n=n, seed=0)
    else:
        mb.simulate(mb.LAPS(instances=2), mb.Poisson(4.0), workload=wl, n=n, seed=0,
                    service_model=mb.PrefillModel())
    low = n - 65_536 if policy == "laps" else n - BLOCK
    assert low <= flag[ARRIVED] <= n


def test_a_stop_flag_of_the_wrong_shape_is_refused():
    from mbbatch._kernels import multibin

    config, inputs = mb.simulation.plan(mb.MultiBin(bins=1, batch_size=2), mb.Poisson(1.0), n=10,
                                        service=st.uniform(1, 2)).kernel_args
    gen = np.random.Generator(np.random.PCG64(0))
    with pytest.raises(TypeError, match=r"stop must be an int64 array of shape \(2,\)"):
        multibin.run(config, inputs, multibin.MultiBinStreams(gen, gen, gen, gen), np.zeros(1, np.int64), groups=1)


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


LIMITED = textwrap.dedent("""
    import resource
    from mbbatch import _running

    def used(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

    for name, field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        limit = getattr(resource, name)
        soft, hard = resource.getrlimit(limit)
        resource.setrlimit(limit, (used(field) + (256 << 20), hard))
        assert _running.available_memory() <= 256 << 20
        _running.check_memory({"n": (100 << 20, "the requests")})
        try:
            _running.check_memory({"n": (1 << 30, "the requests"), "servers": (1 << 20, "the engines")})
        except ValueError as e:
            print(e)
        resource.setrlimit(limit, (soft, hard))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_the_memory_check_no_longer_ignores_the_process_memory_limits():
    """Issue 49: the check read only the machine's free memory, so under
    ``ulimit -v`` (RLIMIT_AS) or ``ulimit -d`` (RLIMIT_DATA) a run it let
    through ended in a MemoryError.  It now takes the limit less what the
    process uses of it, and names the limit (a process of its own, each limit
    256 MiB above its use: 100 MiB pass, 1 GiB is refused)."""
    out = subprocess.run([sys.executable, "-c", LIMITED], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    for line, name, what in zip(lines, ("RLIMIT_AS", "RLIMIT_DATA"), ("address-space", "data-segment")):
        assert line.startswith("n: this run needs 1.0 GiB of memory (1.0 GiB for the requests), more than the "), line
        assert f"available under the process's {what} limit ({name} = " in line, line
        assert line.endswith("; make it smaller or raise the limit"), line


def _advice() -> bool:
    """numpy's huge-page advice now (set back as it was)."""
    setter = _running._hugepage_setter()
    now = setter(True)
    setter(now)
    return now


@pytest.mark.parametrize("before", [True, False])
def test_a_run_allocates_on_small_pages_and_gives_numpys_advice_back(before, monkeypatch):
    """Inside small_pages numpy's huge-page advice is off; nested blocks keep
    it off until the outer one ends, which gives numpy's setting back as it
    was (on or off).  simulate runs inside one, seen by a kernel's run."""
    monkeypatch.delenv(_running.HUGEPAGE_ENV, raising=False)
    monkeypatch.setattr(_running, "free_page_reporting", lambda: True)
    setter = _running._hugepage_setter()
    assert setter is not None
    old = setter(before)
    try:
        with _running.small_pages():
            assert _advice() is False
            with _running.small_pages():
                assert _advice() is False
            assert _advice() is False
        assert _advice() is before
        seen = []
        from mbbatch.planners import continuous as planner

        run = planner._run
        monkeypatch.setattr(planner, "_run", lambda *a, **k: (seen.append(_advice()), run(*a, **k))[1])
        mb.simulate(mb.ContinuousBatching(), arrivals=mb.Poisson(1.0), n=50, seed=0,
                    workload=mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=16)))
        assert seen == [False] and _advice() is before
    finally:
        setter(old)


@pytest.mark.parametrize("env, reporting", [("1", True), (None, False)])
def test_numpys_advice_stands_where_set_or_where_the_host_takes_no_memory_back(env, reporting, monkeypatch):
    """With NUMPY_MADVISE_HUGEPAGE in the environment, or on a machine whose
    free memory is not reported to a host, small_pages leaves numpy's
    advice as it is."""
    if env is None:
        monkeypatch.delenv(_running.HUGEPAGE_ENV, raising=False)
    else:
        monkeypatch.setenv(_running.HUGEPAGE_ENV, env)
    monkeypatch.setattr(_running, "free_page_reporting", lambda: reporting)
    setter = _running._hugepage_setter()
    old = setter(True)
    try:
        with _running.small_pages():
            assert _advice() is True
    finally:
        setter(old)


def test_free_page_reporting_reads_the_balloons_feature_bit(tmp_path, monkeypatch):
    """Bit 5 (VIRTIO_BALLOON_F_REPORTING) of a virtio balloon's features
    string: set, cleared, no balloon."""
    dev = tmp_path / "virtio0"
    dev.mkdir()
    pattern = str(tmp_path / "*" / "features")
    real = _running.glob.glob
    monkeypatch.setattr(_running.glob, "glob", lambda p: real(pattern))
    for bits, want in (("0110010100000000", True), ("0110000100000000", False)):
        (dev / "features").write_text(bits + "\n")
        _running.free_page_reporting.cache_clear()
        assert _running.free_page_reporting() is want
    (dev / "features").unlink()
    _running.free_page_reporting.cache_clear()
    assert _running.free_page_reporting() is False
    _running.free_page_reporting.cache_clear()


class _Mallopt:
    """A stand-in for glibc's ``mallopt``: the calls, in order."""

    def __init__(self):
        self.calls = []

    def __call__(self, param, value):
        self.calls.append((param, value))
        return 1


@pytest.fixture
def mallopt(monkeypatch):
    fake = _Mallopt()
    monkeypatch.setattr(_running, "_mallopt", lambda: fake)
    # (MBBATCH_KEPT_MB's default, whatever the environment running the tests set)
    monkeypatch.setattr(_running.arena, "LIMIT", 2048 << 20)
    for name in _running.MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    return fake


def test_a_run_takes_large_arrays_from_glibcs_heap_and_maps_them_again_after(mallopt, monkeypatch):
    """Inside kept_heap glibc maps no allocation on its own (M_MMAP_MAX 0)
    and trims its heap's top at MBBATCH_KEPT_MB (2,048 MB: at most an int's
    2**31 - 1 bytes, what mallopt takes); nested blocks
    set it once, and the outer one's end sets M_MMAP_MAX back to glibc's
    default, the threshold left.  simulate runs inside one."""
    kept = _running.heap_kept()
    assert kept == 2**31 - 1
    with _running.kept_heap():
        with _running.kept_heap():
            assert mallopt.calls == [(_running.M_TRIM_THRESHOLD, kept), (_running.M_MMAP_MAX, 0)]
        assert len(mallopt.calls) == 2
    assert mallopt.calls[2:] == [(_running.M_MMAP_MAX, _running.MMAP_MAX_DEFAULT)]
    seen = []
    from mbbatch.planners import continuous as planner

    run = planner._run
    monkeypatch.setattr(planner, "_run", lambda *a, **k: (seen.append(list(mallopt.calls)), run(*a, **k))[1])
    mallopt.calls.clear()
    mb.simulate(mb.ContinuousBatching(), arrivals=mb.Poisson(1.0), n=50, seed=0,
                workload=mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=16)))
    assert seen == [[(_running.M_TRIM_THRESHOLD, kept), (_running.M_MMAP_MAX, 0)]]
    assert mallopt.calls[-1] == (_running.M_MMAP_MAX, _running.MMAP_MAX_DEFAULT)


@pytest.mark.parametrize("how", ["env", "none kept", "not glibc"])
def test_malloc_stands_where_tuned_where_nothing_is_kept_or_not_glibc(how, mallopt, monkeypatch):
    """kept_heap leaves malloc as it is where the environment tunes it, where
    MBBATCH_KEPT_MB=0 keeps nothing, and where the C library is not glibc."""
    if how == "env":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_max=8")
    elif how == "none kept":
        monkeypatch.setattr(_running.arena, "LIMIT", 0)
    else:
        monkeypatch.setattr(_running, "_mallopt", lambda: None)
    with _running.kept_heap():
        pass
    assert mallopt.calls == []


@pytest.mark.skipif(_running._mallopt() is None, reason="glibc's mallopt only (this C library is another)")
def test_inside_kept_heap_a_freed_arrays_memory_serves_the_next_until_released(monkeypatch):
    """On glibc, in the main thread, an array of 64 MB freed inside kept_heap
    leaves its pages mapped in the heap: the next one of its size writes
    them with at most a tenth of its 16,384 small pages faulted (on small
    pages: numpy's huge-page advice off).  After mb.release_memory() the
    next one faults at least half of them: the heap gave them back."""
    import resource

    for name in _running.MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(_running.HUGEPAGE_ENV, raising=False)
    monkeypatch.setattr(_running, "free_page_reporting", lambda: True)
    monkeypatch.setattr(_running.arena, "LIMIT", 2048 << 20)
    m = 1 << 23

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    with _running.small_pages(), _running.kept_heap():
        a = np.empty(m)
        a[:] = 1.0
        del a
        before = faults()
        b = np.empty(m)
        b[:] = 2.0
        assert faults() - before < m * 8 // 4096 // 10
        del b
        # (mb.release_memory gives the heap's free memory back: the next array's pages are fresh, each faulted)
        mb.release_memory()
        before = faults()
        c = np.empty(m)
        c[:] = 3.0
        assert faults() - before >= m * 8 // 4096 // 2
        del c
