"""Where a sweep's grid points run: in this process, on a pool of worker
processes, or on dask.distributed; and how Ctrl-C and a killed sweep reach
them.

An :class:`Executor` is opened once and may run several sweeps (``mbbatch
sweep`` with several specs shares one pool).  Tasks are picklable top-level
calls; results come back as they finish, in any order: what a point holds
depends only on its own parameters, so the order never changes a value.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from .._running import POLL_SECONDS, STOP, new_stop_flag, watch_stop_flag

__all__ = ["Executor", "check_spawn_safe", "sigint_handler", "whole"]


#: where Python's documentation explains the guard a script that starts processes needs
_GUARD_DOCS = ('the multiprocessing documentation\'s "Safe importing of main module": '
               "https://docs.python.org/3/library/multiprocessing.html#multiprocessing-safe-main-import")


def check_spawn_safe(caller: str, scheduler, workers) -> None:
    """Refuse a sweep that its worker processes would start again, before
    anything runs (its spec is read, its store touched).

    A pool's workers are spawned (as a LocalCluster's are): each imports
    the script that started the sweep again, as ``__mp_main__``, and runs
    its top level.  A script that calls ``caller`` there, outside ``if
    __name__ == "__main__":``, so starts the sweep once more in every
    worker, which found the store locked by the first ("being written by
    another sweep") and died, and the first then failed with
    ``BrokenProcessPool``.  Refused here, with a ``RuntimeError``: in a
    worker while it starts (``multiprocessing``'s own test for a process
    started while importing the main module), and in the first process
    where the call stands at the script's top level outside any ``if``
    (read from the script's source)."""
    import multiprocessing as mp

    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(f"{caller} was called while a worker process of a sweep was starting: a worker imports "
                           "the script that started the sweep again, and this script calls it at its top level. "
                           f'Put the call under `if __name__ == "__main__":` ({_GUARD_DOCS})')
    spawns = scheduler == "local" or (scheduler is None and (workers or os.cpu_count() or 1) > 1)
    line = _unguarded_main_line() if spawns else None
    if line is not None:
        n = workers or os.cpu_count() or 1
        raise RuntimeError(f"workers={workers!r}: {caller} runs the sweep on {n} spawned worker processes, and each "
                           f"imports the script that called it again; the call at line {line} of "
                           f"{sys.modules['__main__'].__file__} stands outside an `if __name__ == \"__main__\":` "
                           "block, so every worker would start the sweep once more. Put it under that block "
                           f"({_GUARD_DOCS}), or pass workers=1")


def _unguarded_main_line():
    """The line of the script being run (``__main__``, a file a spawned
    process imports again) whose top-level statement is executing now,
    when no ``if`` encloses it; else None (a guarded call, a call from an
    interactive session or ``python -c``, or source that cannot be read)."""
    import ast

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            body = ast.parse(f.read()).body
    except (OSError, SyntaxError, ValueError):
        return None
    while body:
        node = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if node is None:
            return None
        if isinstance(node, (ast.If, ast.Match)):
            return None          # (guarded, as far as can be told)
        body = [s for field in ("body", "orelse", "finalbody", "handlers") for s in getattr(node, field, [])
                if isinstance(s, ast.stmt) or isinstance(s, ast.excepthandler)]
    return line


def warm_worker():
    """Compile (or load from the cache) every kernel in this process."""
    from .._kernels import warmup

    warmup()


def _start_pool_worker(sweep_pid):
    # Ctrl-C reaches the whole job: the sweep reports it, and a worker just
    # ends, without a traceback of its own (its finished points are stored)
    signal.signal(signal.SIGINT, _end_worker)
    _exit_with(sweep_pid)
    warm_worker()


def _end_worker(signum, frame):
    os._exit(128 + signum)


def _exit_with(sweep_pid, every=0.5):
    """End this pool worker once the sweep process that started it is gone.

    A killed sweep (kill -9, a batch scheduler's time limit) cannot shut its
    pool down, and the workers, which hold both ends of the pool's queues,
    would wait on them forever.  A daemon thread notices the new parent
    within ``every`` seconds and exits the process; the sweep resumes from
    its store."""
    def watch():
        while os.getppid() == sweep_pid:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="mbbatch-exit-with-sweep", daemon=True).start()


class Executor:
    """Runs tasks ``(key, function, args)`` and yields ``(key, result)`` as
    they finish.

    Parameters
    ----------
    scheduler : None, "local" or str
        None: this process (``workers == 1``) or a pool of ``workers``
        spawned processes; ``"local"``: a dask LocalCluster on loopback;
        anything else: the address of a running dask.distributed scheduler.
    workers : int, optional
        Processes (or LocalCluster workers); default: all cores.
    """

    def __init__(self, scheduler=None, workers=None):
        self.scheduler = scheduler
        self.workers = workers or os.cpu_count() or 1
        self.pool = None
        self.client = None
        self.cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(cancel=exc[0] is not None)
        return False

    @property
    def submits_ahead(self) -> bool:
        """Whether :meth:`run` hands its tasks to other processes at once (a
        pool of more than one worker, or dask), so that the tasks of several
        runs may be queued together."""
        return self.scheduler is not None or self.workers > 1

    @property
    def parallel(self) -> int:
        """Processes computing at once."""
        if self.scheduler is None:
            return self.workers
        if self.client is not None:
            return max(1, len(self.client.scheduler_info().get("workers", {})))
        return self.workers

    def close(self, cancel=False) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self.pool = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def run(self, tasks):
        """An iterator of ``(key, function(*args))`` for each task, as they
        finish.  In this process the tasks start at once, on a helper thread,
        and run back to back while the caller handles (stores) the results
        already finished: close the iterator to stop them."""
        if not tasks:
            return iter(())
        if self.scheduler is not None:
            return self._dask(tasks)
        if self.workers == 1 or (len(tasks) <= 1 and self.pool is None):
            return _InProcess(tasks)
        return self._pool(tasks)

    def _dask(self, tasks):
        """Submit the tasks now; return the iterator of their results."""
        from distributed import Client, LocalCluster

        if self.client is None:
            if self.scheduler == "local":
                self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                            host="127.0.0.1", dashboard_address=None)
                self.client = Client(self.cluster)
            else:
                self.client = Client(self.scheduler)
        futures = {self.client.submit(fn, *args, pure=False): key for key, fn, args in tasks}
        return self._dask_completed(futures)

    def _dask_completed(self, futures):
        from distributed import as_completed as dask_completed

        try:
            for fut in dask_completed(futures):
                yield futures[fut], fut.result()
        except BaseException:
            self.client.cancel(list(futures))
            raise

    def _pool(self, tasks):
        """Submit the tasks now (they compute while the caller prepares their
        store); return the iterator of their results."""
        import multiprocessing as mp

        if self.pool is None:
            self.pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                            initializer=_start_pool_worker, initargs=(os.getpid(),))
        # the workers start while submitting: with Ctrl-C ignored from birth,
        # until their initializer makes it end them quietly
        with sigint_handler(signal.SIG_IGN):
            futures = {self.pool.submit(fn, *args): key for key, fn, args in tasks}
        return self._completed(futures)

    def _completed(self, futures):
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        except BaseException as exc:
            # interrupted (or a failed point): drop the queued points, not wait for them
            # (shutdown cancels them; cancelling them here as well races the pool's
            # own thread, which then fails on a future already cancelled)
            workers = list(getattr(self.pool, "_processes", {}).values())
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
            if isinstance(exc, KeyboardInterrupt):
                # Ctrl-C sent to this process alone (not its process group, as a terminal
                # sends it) reached no worker: each would finish its point first, 9 to 20 s
                # for a capacity search, and the exit waits for them.  A worker ends on SIGINT
                # at once (its finished points are stored already).  (The pool's processes are
                # not public: Python 3.14 adds ProcessPoolExecutor.terminate_workers.)
                for w in workers:
                    if w.is_alive():
                        with contextlib.suppress(OSError):
                            os.kill(w.pid, signal.SIGINT)
            raise


class _InProcess:
    """The tasks, one after another, on one helper thread of this process,
    started at once: their kernels (which release the GIL) keep running
    while the main thread stores finished points.  Ctrl-C in the main thread
    (waiting on the results) sets the kernels' stop flag; the helper returns
    within about a block of requests and ``KeyboardInterrupt`` is raised."""

    #: finished results waiting for the caller, at most: the helper runs this
    #: far ahead, no further
    AHEAD = 4

    def __init__(self, tasks):
        self.stop = new_stop_flag()
        self.results = queue.Queue(maxsize=self.AHEAD)
        self.left = len(tasks)
        self.thread = threading.Thread(target=self._work, args=(list(tasks),), name="mbbatch-kernel",
                                       daemon=True)
        self.thread.start()

    def _work(self, tasks):
        watch_stop_flag(self.stop)        # every kernel of every task watches it
        for key, fn, args in tasks:
            if self.stop[STOP]:
                return
            try:
                item = (key, fn(*args), None)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller
                item = (key, None, exc)
            while not self.stop[STOP]:
                try:
                    self.results.put(item, timeout=POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if item[2] is not None:
                return

    def __iter__(self):
        return self

    def __next__(self):
        if self.left == 0:
            self.close()
            raise StopIteration
        try:
            while True:
                try:
                    key, value, error = self.results.get(timeout=POLL_SECONDS)
                    break
                except queue.Empty:
                    if not self.thread.is_alive() and self.results.empty():
                        raise RuntimeError("the sweep's kernel thread ended without its results") from None
        except BaseException:
            self.close()
            raise
        self.left -= 1
        if error is not None:
            self.close()
            raise error
        return key, value

    def close(self) -> None:
        """Stop the tasks not yet finished and wait for the helper."""
        self.stop[STOP] = 1
        self.thread.join()


@contextlib.contextmanager
def sigint_handler(handler):
    """Ctrl-C (SIGINT) handled by ``handler`` during the block.  Only the main
    thread sets signal handlers and receives signals: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def whole():
    """Hold a Ctrl-C that comes during the block until its end: a batch of
    grid points (or the metadata) is written whole, and the store is never
    left in the middle of an operation."""
    caught = []
    with sigint_handler(lambda signum, frame: caught.append(signum)):
        yield
    if caught:
        signal.raise_signal(signal.SIGINT)
