"""Executors (mbbatch.sweeps.executors): the in-process runner that computes
a sweep's points on a helper thread while the caller stores them.  (The pool,
dask, Ctrl-C and kill -9 paths run real sweeps in test_sweeps_run.py and
test_cli.py.)"""

import threading
import time

import numpy as np
import pytest

from mbbatch._running import stop_flag
from mbbatch.sweeps.executors import Executor


def _square(x):
    return x * x


def test_in_process_yields_every_result_in_order():
    tasks = [(i, _square, (i,)) for i in range(10)]
    with Executor(workers=1) as ex:
        assert list(ex.run(tasks)) == [(i, i * i) for i in range(10)]
        assert list(ex.run([])) == []


def test_in_process_tasks_start_before_the_first_result_is_asked_for():
    """The points compute while the caller does other work (creating the
    store): the first task runs without the iterator being advanced."""
    started = threading.Event()

    def task():
        started.set()
        return 1

    with Executor(workers=1) as ex:
        results = ex.run([("a", task, ())])
        assert started.wait(10), "the task did not start until its result was asked for"
        assert list(results) == [("a", 1)]


def test_in_process_runs_tasks_off_the_main_thread_with_one_shared_stop_flag():
    seen = []

    def task():
        seen.append((threading.current_thread() is threading.main_thread(), stop_flag()))
        return None

    with Executor(workers=1) as ex:
        list(ex.run([(i, task, ()) for i in range(3)]))
    assert [on_main for on_main, _ in seen] == [False] * 3
    flags = {id(flag) for _, flag in seen}
    assert len(flags) == 1, "every task (every kernel) must watch the same stop flag"


def test_in_process_error_reaches_the_caller_after_the_earlier_results():
    ran = []

    def task(i):
        ran.append(i)
        if i == 2:
            raise ValueError("point 2 failed")
        return i

    with Executor(workers=1) as ex:
        results = ex.run([(i, task, (i,)) for i in range(6)])
        assert next(results) == (0, 0) and next(results) == (1, 1)
        with pytest.raises(ValueError, match="point 2 failed"):
            next(results)
    assert ran == [0, 1, 2], "tasks after the failed one must not run"


def test_closing_stops_the_running_task_through_its_stop_flag():
    """Closing the iterator (an error or Ctrl-C in the caller) sets the flag a
    running kernel watches; the helper ends and no further task starts."""
    started, ran = threading.Event(), []

    def long_task(i):
        ran.append(i)
        flag = stop_flag()
        started.set()
        t0 = time.monotonic()
        while not flag[0] and time.monotonic() - t0 < 60:     # a kernel checking its flag per block
            time.sleep(0.001)
        return bool(flag[0])

    with Executor(workers=1) as ex:
        results = ex.run([(i, long_task, (i,)) for i in range(3)])
        assert started.wait(10)
        t0 = time.monotonic()
        results.close()
        assert time.monotonic() - t0 < 5
    assert not results.thread.is_alive()
    assert ran == [0]


def test_in_process_runs_at_most_a_few_points_ahead_of_the_caller():
    done = []

    def task(i):
        done.append(i)
        return np.zeros(1)

    with Executor(workers=1) as ex:
        results = ex.run([(i, task, (i,)) for i in range(50)])
        time.sleep(0.5)
        ahead = len(done)
        assert ahead <= results.AHEAD + 1, ahead
        assert len(list(results)) == 50


def test_a_sweep_started_while_a_worker_starts_is_refused(monkeypatch):
    """A spawned worker imports the script that started the sweep again (as __mp_main__): a call at
    its top level that the first process could not tell unguarded (under `if True:`, say) ran the
    sweep again in every worker, which died on the store's lock ("being written by another sweep").
    While a worker starts, multiprocessing marks it (_inheriting, its own test for a process started
    while the main module is imported): refused there, naming the guard."""
    import multiprocessing as mp

    from mbbatch.sweeps.executors import check_spawn_safe

    check_spawn_safe("run_sweep", None, 1)
    monkeypatch.setattr(mp.current_process(), "_inheriting", True, raising=False)
    for workers in (1, 2):
        with pytest.raises(RuntimeError, match=r"run_sweep was called while a worker process of a sweep was "
                                               r'starting: .* `if __name__ == "__main__":`'):
            check_spawn_safe("run_sweep", None, workers)
