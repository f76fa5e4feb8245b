"""The open-loop driver (mbbatch._kernels.driver): one driver, each stage
its steps, the cluster and LAPS composed from it."""

from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np
import pytest

from mbbatch._kernels import continuous_cluster, driver, laps
from mbbatch._kernels.common import ARRIVED, STOP, STOP_SIZE, stage_step

#: a stage of the test's own: arrival times, and a log of the steps called
Toy = namedtuple("Toy", ("times", "log", "size"))


@numba.njit
def _logged(st, what, a, b):
    k = st.size[0]
    st.log[k, 0], st.log[k, 1], st.log[k, 2] = what, a, b
    st.size[0] = k + 1


@stage_step
def _set_up_toy(st, streams, estop):
    _logged(st, 0.0, -1.0, -1.0)
    return (np.int64(0), 0.0)


@stage_step
def _arrival_toy(st, carry, j):
    return st.times[j]


@stage_step
def _until_toy(st, carry, t, stop, streams, estop):
    routed, last = carry
    _logged(st, 1.0, t, last)
    # (a stage code: the run stalls at an arrival at a negative time)
    return (3 if t < 0.0 else 0), (routed, t)


@stage_step
def _arrive_toy(st, carry, j, t):
    routed, last = carry
    _logged(st, 2.0, float(j), t)
    return (routed + 1, last)


@stage_step
def _run_out_toy(st, carry, n, stop, streams, estop):
    routed, last = carry
    _logged(st, 3.0, float(n), float(routed))
    return 0


def _toy_kernel(monkeypatch):
    # (compiled without numba's disk cache: the toy's steps live in this file, which the cache of a kernel of the
    # driver's source does not watch)
    monkeypatch.setattr(driver, "kernel", numba.njit)
    return driver.open_loop_driver("toy_kernel", __name__, _set_up_open=_set_up_toy, _arrival=_arrival_toy,
                                   _until=_until_toy, _arrive_open=_arrive_toy, _run_out=_run_out_toy)


def _toy(times):
    times = np.asarray(times, float)
    return Toy(times, np.full((3 * times.size + 2, 3), np.nan), np.zeros(1, np.int64))


def test_the_driver_takes_each_arrival_after_the_stage_events_before_it(monkeypatch):
    run = _toy_kernel(monkeypatch)
    st = _toy([0.5, 0.5, 2.0])
    stop = np.zeros(STOP_SIZE, np.int64)
    assert run(st, 3, None, stop, np.zeros_like(stop)) == driver.DONE
    got = [tuple(row) for row in st.log[:st.size[0]]]
    # set up; per arrival: the stage until its instant (the last instant before it), then the arrival; run out
    assert got == [(0.0, -1.0, -1.0),
                   (1.0, 0.5, 0.0), (2.0, 0.0, 0.5),
                   (1.0, 0.5, 0.5), (2.0, 1.0, 0.5),
                   (1.0, 2.0, 0.5), (2.0, 2.0, 2.0),
                   (3.0, 3.0, 3.0)]
    assert stop[ARRIVED] == 0


def test_a_stage_code_ends_the_run_and_a_stop_comes_before_an_arrival(monkeypatch):
    run = _toy_kernel(monkeypatch)
    st = _toy([0.5, -1.0, 2.0])
    stop = np.zeros(STOP_SIZE, np.int64)
    assert run(st, 3, None, stop, np.zeros_like(stop)) == 3
    assert st.size[0] == 4          # set up, the first arrival's two steps, the second's until
    st = _toy([0.5, 1.0])
    stop[STOP] = 1
    assert run(st, 2, None, stop, np.zeros_like(stop)) == driver.STOPPED
    assert st.size[0] == 1          # set up only


@numba.njit
def _asked(j, stop):
    # (a step has no Python wrapper: called from numba)
    return driver.stop_asked(j, stop)


def test_stop_is_read_every_check_of_arrivals():
    stop = np.zeros(STOP_SIZE, np.int64)
    assert not _asked(driver.CHECK, stop)
    assert stop[ARRIVED] == driver.CHECK
    stop[STOP] = 1
    assert not _asked(driver.CHECK + 1, stop)      # (between checks: not read)
    assert _asked(2 * driver.CHECK, stop)


def test_a_stage_without_all_its_steps_is_refused():
    with pytest.raises(ValueError, match=r"toy.*_run_out"):
        driver.open_loop_driver("toy", __name__, _set_up_open=_set_up_toy, _arrival=_arrival_toy, _until=_until_toy,
                                _arrive_open=_arrive_toy)


@pytest.mark.parametrize("kernel", [continuous_cluster.cluster_kernel, laps.laps_kernel, laps.laps_events_kernel],
                         ids=["cluster", "laps", "laps events"])
def test_the_cluster_and_laps_are_the_driver_with_their_steps(kernel):
    # (the same code, the stage's steps bound by name; its disk cache flushed with its stage's module)
    assert kernel.py_func.__code__ is driver.open_loop.__code__
    module = continuous_cluster if kernel is continuous_cluster.cluster_kernel else laps
    assert kernel.py_func.__module__ == module.__name__
    assert vars(module)[kernel.py_func.__qualname__] is kernel
    steps = {name: kernel.py_func.__globals__[name]
             for name in ("_set_up_open", "_arrival", "_until", "_arrive_open", "_run_out")}
    assert all(getattr(s, "py_func", None) is not None and s.py_func.__module__ == module.__name__
               for s in steps.values())
