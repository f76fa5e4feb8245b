"""Running kernels: Ctrl-C within a fraction of a second; memory, and the
clock's resolution, checked before anything is allocated; a run's arrays on
small pages (:func:`small_pages`), its large ones from the C library's heap
where that is glibc's (:func:`kept_heap`).

A numba kernel holds the thread that calls it until it returns, and Python
runs signal handlers only between bytecodes, so a Ctrl-C during a long
``simulate`` would wait for the whole run.  :func:`interruptible` runs the
kernel (compiled ``nogil``) on a helper thread while the main thread waits,
ready to take the signal: it then sets the kernel's stop flag, which the
kernel checks at every block of requests, waits the few milliseconds until
it returns, and raises ``KeyboardInterrupt``.  Meanwhile it can show a
progress bar of the requests arrived, which the kernel writes beside the
flag at every check.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import math
import os
import sys
import threading

import numpy as np

from ._kernels import arena
from ._kernels.common import ARRIVED, STOP, STOP_SIZE

#: how often (s) the waiting main thread wakes: Python runs a signal handler
#: only between bytecodes, so a blocking join without a timeout would hold Ctrl-C
POLL_SECONDS = 0.25
#: a run's clock must resolve this fraction of a typical service time
CLOCK_RESOLUTION = 1e-4
#: a progress bar shows once a run has taken this long (s): short runs print nothing
PROGRESS_DELAY = 1.0

#: the environment variable of numpy's huge-page advice (numpy reads it at import); where it is set, its
#: setting stands through mbbatch's runs (:func:`small_pages`)
HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"
#: the environment variables by which glibc's malloc is tuned (read at the process's start): where one is set,
#: mbbatch leaves malloc as it is (:func:`kept_heap`)
MALLOC_ENV = ("GLIBC_TUNABLES", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
              "MALLOC_TOP_PAD_")

__all__ = ["POLL_SECONDS", "CLOCK_RESOLUTION", "PROGRESS_DELAY", "HUGEPAGE_ENV", "new_stop_flag", "stop_flag",
           "watch_stop_flag", "interruptible", "free_page_reporting", "small_pages", "kept_heap", "release_memory",
           "available_memory",
           "memory_limits", "check_memory", "check_clock", "format_bytes"]


_enclosing = threading.local()


def new_stop_flag() -> np.ndarray:
    """A fresh stop flag: ``flag[STOP]`` nonzero asks a kernel to return at
    its next check; the kernel writes the requests arrived so far to
    ``flag[ARRIVED]`` (see :mod:`mbbatch._kernels.common`)."""
    return np.zeros(STOP_SIZE, np.int64)


def stop_flag() -> np.ndarray:
    """A kernel's stop flag (:func:`new_stop_flag`).

    Inside :func:`interruptible`'s helper thread it is the enclosing call's
    flag, so that many kernels run back to back on one helper thread (a
    sweep's replications) all stop at one Ctrl-C."""
    enclosing = getattr(_enclosing, "stop", None)
    return enclosing if enclosing is not None else new_stop_flag()


def watch_stop_flag(stop: np.ndarray) -> None:
    """Make ``stop`` the flag every kernel run on this (helper) thread
    watches from now on (see :func:`stop_flag`)."""
    _enclosing.stop = stop


def interruptible(call, stop: np.ndarray, total: int | None = None):
    """``call()`` (which runs a kernel watching ``stop``) on a helper thread,
    so that Ctrl-C in the main thread stops it within about a block of
    requests and raises ``KeyboardInterrupt``.  Elsewhere than the main
    thread (signals only reach the main thread) ``call()`` runs directly.

    With ``total`` (the run's requests), a progress bar of the requests
    arrived goes to stderr once the run has taken :data:`PROGRESS_DELAY`."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    box = {}

    def target():
        watch_stop_flag(stop)
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=target, name="mbbatch-kernel", daemon=True)
    bar = None
    if total is not None:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="request", unit_scale=True, desc="simulate", delay=PROGRESS_DELAY,
                   file=sys.stderr, leave=False)
    try:
        worker.start()          # (a Ctrl-C may come while it waits for the thread to start)
        while worker.is_alive():
            worker.join(POLL_SECONDS)
            if bar is not None:
                bar.update(min(int(stop[ARRIVED]), total) - bar.n)
    except BaseException:
        stop[STOP] = 1          # set before the kernel starts, it returns at its first check
        if worker.ident is not None:
            worker.join()
        raise
    finally:
        if bar is not None:
            bar.close()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _hugepage_setter():
    """numpy's switch of its huge-page advice (it returns the setting it
    replaced), or None where this numpy has none."""
    try:
        from numpy._core import multiarray
    except ImportError:                 # pragma: no cover (numpy 1)
        from numpy.core import multiarray
    return getattr(multiarray, "_set_madvise_hugepage", None)


class _Shared:
    """A process-wide setting that nested and concurrent blocks share: the
    first block to begin sets it (``enter()``, whose value is kept), the
    last to end gives it back (``leave(kept)``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._kept = None

    @contextlib.contextmanager
    def block(self, enter, leave):
        with self._lock:
            if self._depth == 0:
                self._kept = enter()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    leave(self._kept)


#: the runs inside :func:`small_pages` now (numpy's setting before the first kept)
_pages = _Shared()


#: virtio-balloon's feature bit of free page reporting (VIRTIO_BALLOON_F_REPORTING)
_REPORTING_BIT = 5


@functools.cache
def free_page_reporting() -> bool:
    """Whether this machine is a virtual machine whose balloon reports its
    free memory to the host (Linux: a ``virtio_balloon`` device offering
    free page reporting; False wherever that cannot be read)."""
    for features in glob.glob("/sys/bus/virtio/drivers/virtio_balloon/*/features"):
        try:
            with open(features) as f:
                bits = f.read().strip()
        except OSError:
            continue
        if len(bits) > _REPORTING_BIT and bits[_REPORTING_BIT] == "1":
            return True
    return False


@contextlib.contextmanager
def small_pages():
    """Run a block with numpy's huge-page advice off where huge pages cost
    the most (:func:`free_page_reporting`), as it was after.

    numpy asks Linux to back each large array with transparent huge pages
    (``madvise(MADV_HUGEPAGE)``).  A run's first write to each such page
    then needs 2 MB of contiguous free memory.  On a virtual machine that
    reports its free memory to the host (virtio-balloon's free page
    reporting reports free blocks of 2 MB and more, which the host then
    takes back) that is memory the host must back afresh at its first
    touch: measured, about 5 ms a huge page, where small pages come from
    memory the guest freed lately and the host still backs.  A 4 + 4
    disaggregated deployment at n = 10^7 took 8 to 17 s of system time on
    huge pages against about 2 s on small ones; LAPS's bench ran 7.0 and
    7.6 M requests/s against 10.2 and 11.3 (the performance guide).
    Elsewhere numpy's advice stands, as it does wherever
    ``NUMPY_MADVISE_HUGEPAGE`` is set in the environment.  Nested and
    concurrent runs share one setting: numpy's is given back as the last of
    them ends."""
    setter = _hugepage_setter()
    if setter is None or HUGEPAGE_ENV in os.environ or not free_page_reporting():
        yield
        return
    with _pages.block(lambda: setter(False), setter):
        yield


#: glibc's ``mallopt`` parameters (``malloc.h``): the free bytes its heap keeps at its top, and the most
#: allocations it maps on their own
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: glibc's default of ``M_MMAP_MAX``
MMAP_MAX_DEFAULT = 65536


@functools.cache
def _glibc():
    """The C library where it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version       # (glibc's own: musl and others have no such function)
        libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):   # pragma: no cover (another C library)
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def _mallopt():
    """glibc's ``mallopt`` (``int mallopt(int param, int value)``), or None
    where the C library is another (or none is found)."""
    libc = _glibc()
    return None if libc is None else libc.mallopt


def release_memory() -> int:
    """Let go of the memory mbbatch keeps between the runs of this process:
    the per-request arrays a continuous engine's next run would reuse
    (:func:`.arena.release_memory`), and the free memory of glibc's heap
    (:func:`kept_heap`; ``malloc_trim(0)``), which goes back to the
    system.  Returns the bytes the arrays held (see the performance
    guide).  At most ``MBBATCH_KEPT_MB`` megabytes (environment, read at
    import; default 2,048; ``0``: none) of each are ever kept."""
    freed = arena.release_memory()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    return freed


#: the runs inside :func:`kept_heap` now
_heap = _Shared()


def heap_kept() -> int:
    """glibc's ``M_TRIM_THRESHOLD`` of :func:`kept_heap`: the free bytes at
    its heap's top it keeps (once they reach it, it gives the whole of them
    back to the system): :data:`.arena.LIMIT` (``MBBATCH_KEPT_MB``), at most
    what ``mallopt`` takes (an ``int``, about 2 GB)."""
    return min(arena.LIMIT, 2**31 - 1)


@contextlib.contextmanager
def kept_heap():
    """Run a block with glibc's ``malloc`` serving large allocations from
    its heap, which keeps its free memory for the next run (up to
    :func:`heap_kept` bytes of it at its top).

    glibc maps each allocation of more than 128 KB to 32 MB (its threshold
    grows with use) on pages of its own and gives them back to the system
    as soon as it is freed: every array of a run at n = 10^7, and each
    temporary of numpy's (a gather, a copy, a sort's), is then memory
    the system maps and zeroes afresh at its first write, page by page.  A
    4 + 4 disaggregated deployment at n = 10^7 wrote about 5 GB of such
    pages a run: 1.2 million page faults, 2 s of system time beside 5.7 s
    of work.  Inside this block glibc takes them from its heap instead
    (``mallopt(M_MMAP_MAX, 0)``), where a freed array's memory serves the
    next one without a fault, and the heap gives the free memory at its
    top back to the system only once it reaches :func:`heap_kept` bytes
    (``M_TRIM_THRESHOLD``, by default 128 KB growing with use;
    ``MBBATCH_KEPT_MB``, as the :mod:`~mbbatch._kernels.arena` keeps its
    arrays), then the whole of it.  After the block allocations are
    mapped again as before (``M_MMAP_MAX`` back to glibc's default); the
    threshold stays, so that a process's next run finds its memory.
    Memory freed below memory still held (a result's arrays) stays in the
    heap until reused.

    Only where the C library is glibc; not where ``MBBATCH_KEPT_MB=0``
    (nothing kept), nor where the environment tunes glibc's malloc
    (:data:`MALLOC_ENV`).  Allocations of threads other than the main one
    come from glibc's arenas of their own, whose large ones are mapped
    whatever the setting.  Nested and concurrent runs share one setting,
    given back as the last of them ends."""
    mallopt = _mallopt()
    if mallopt is None or arena.LIMIT == 0 or any(name in os.environ for name in MALLOC_ENV):
        yield
        return
    with _heap.block(lambda: (mallopt(M_TRIM_THRESHOLD, heap_kept()), mallopt(M_MMAP_MAX, 0)),
                     lambda _: mallopt(M_MMAP_MAX, MMAP_MAX_DEFAULT)):
        yield


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation: the machine's (Linux
    ``MemAvailable``, else the physical memory), or less where the process's
    limits leave less (:func:`memory_limits`); None if unknown."""
    free = _free_memory()
    rooms = [room for room, _ in memory_limits()] + ([] if free is None else [free])
    return min(rooms) if rooms else None


def _free_memory() -> int | None:
    """The machine's memory available (Linux ``MemAvailable``, else the
    physical memory), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


#: the process's limits on its memory: ``(resource's name, /proc/self/status
#: field of the memory it counts, what it limits)``.  An allocation counts
#: in full against them (its address space), touched or not.
_LIMITS = (("RLIMIT_AS", "VmSize", "address-space limit"), ("RLIMIT_DATA", "VmData", "data-segment limit"))


def _status_bytes(field: str) -> int:
    """A ``kB`` field of Linux's ``/proc/self/status`` in bytes (0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_limits() -> list:
    """``(bytes left, why)`` under each limit set on the process's memory
    (``ulimit -v``'s ``RLIMIT_AS``, ``ulimit -d``'s ``RLIMIT_DATA``): the
    limit less what the process uses of it now; none where unlimited (or
    where the platform has no such limits)."""
    try:
        import resource
    except ImportError:                 # pragma: no cover (not POSIX)
        return []
    out = []
    for name, field, what in _LIMITS:
        limit = getattr(resource, name, None)
        if limit is None:               # pragma: no cover (a platform without it)
            continue
        soft, _ = resource.getrlimit(limit)
        if soft == resource.RLIM_INFINITY:
            continue
        used = _status_bytes(field)
        out.append((max(0, soft - used), f"under the process's {what} ({name} = {format_bytes(soft)}, "
                                         f"{format_bytes(used)} of it in use)"))
    return out


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover


def check_memory(parts: dict) -> int:
    """Refuse a run whose allocations cannot fit.

    ``parts`` maps the parameter that sizes an allocation to ``(bytes,
    what)``.  Raises ``ValueError`` naming the largest part's parameter, the
    total needed and the memory available (:func:`available_memory`: the
    machine's, or what the process's ``RLIMIT_AS`` or ``RLIMIT_DATA`` leaves,
    named where it is the less); returns the total in bytes.
    """
    total = int(sum(b for b, _ in parts.values()))
    avail = available_memory()
    if avail is not None and total > avail:
        name, (big, what) = max(parts.items(), key=lambda kv: kv[1][0])
        # (where a limit of the process's leaves less than the machine has free, say so: raising it is a fix)
        free = _free_memory()
        room, why = min(memory_limits(), default=(None, ""), key=lambda rw: rw[0])
        limited = room is not None and (free is None or room < free)
        raise ValueError(f"{name}: this run needs {format_bytes(total)} of memory ({format_bytes(big)} "
                         f"for {what}), more than the {format_bytes(avail)} available"
                         + (f" {why}; make it smaller or raise the limit" if limited else "; make it smaller"))
    return total


def check_clock(horizon: float, scale: float, what: str) -> None:
    """Refuse a run whose clock reaches times where float64 cannot resolve
    the service times: float64 numbers at ``horizon`` (s) must be closer
    than :data:`CLOCK_RESOLUTION` (1e-4) of a typical service time ``scale`` (s)."""
    if not (math.isfinite(scale) and scale > 0):
        return
    step = float(np.spacing(horizon)) if math.isfinite(horizon) else math.inf
    if step > CLOCK_RESOLUTION * scale:
        raise ValueError(f"{what} reach {horizon:.3g} s, where float64 times are {step:.3g} s apart, too "
                         f"coarse for service times of about {scale:.3g} s (results would lose them); "
                         "shift the times to start near 0, or change their units")
