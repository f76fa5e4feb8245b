"""Shortest-predicted-first's step of the event kernel (mbbatch._kernels.spf):
its batches on hand-computed traces, its starvation guard and its scratch."""

import numpy as np

import mbbatch as mb
from mbbatch._kernels import spf
from mbbatch._kernels.queues import N_FIELDS

MODEL = mb.MaxModel(base=0.0, per_token=1.0)


def _run(times, output, B, pred=None, max_wait=np.inf, servers=1):
    n = len(output)
    wl = mb.Workload(prompt=np.ones(n), output=np.array(output, float))
    pol = mb.ShortestPredictedFirst(B, max_wait=max_wait,
                                    predictor=None if pred is None else mb.Predictions(np.array(pred, float)))
    return mb.simulate(pol, mb.Replay(np.array(times, float)), workload=wl, service_model=MODEL, n=n,
                       servers=servers, seed=0, keep_requests=True).requests


def test_the_smallest_predictions_go_first_ties_in_arrival_order():
    """Six requests at time 0, batches of two: (1, 3) of 10 tokens (a tie,
    by arrival), then 5 and 4 (20, 30), then 2 and 0 (40, 50)."""
    r = _run([0.0] * 6, [50, 10, 40, 10, 30, 20], 2)
    assert r.start.tolist() == [40.0, 0.0, 40.0, 0.0, 10.0, 10.0]
    assert r.completion.tolist() == [90.0, 10.0, 90.0, 10.0, 40.0, 40.0]


def test_it_sorts_by_the_prediction_and_serves_the_truth():
    """Predictions reversed: the longest true request goes first, and its
    batch takes its true length."""
    r = _run([0.0] * 4, [10, 20, 30, 40], 2, pred=[4, 3, 2, 1])
    assert r.start.tolist() == [40.0, 40.0, 0.0, 0.0]
    assert r.completion.tolist() == [60.0, 60.0, 40.0, 40.0]


def test_a_request_that_waited_max_wait_goes_first():
    """A short request (10 s) holds the server from 0; a long one (100 s)
    arrives at 0.5 s, short ones every 10 s from 5 s.  Without a guard the
    long one waits for every short one; with max_wait = 25 s it goes at 30 s,
    the first batch start once it has waited 25 s (at 20 s it had waited
    19.5 s: a short one went)."""
    times = [0.0, 0.5] + [5.0 + 10.0 * j for j in range(7)]
    output = [10, 100] + [10] * 7
    unguarded = _run(times, output, 1)
    assert unguarded.start[1] == max(unguarded.start) == 80.0   # last
    guarded = _run(times, output, 1, max_wait=25.0)
    assert guarded.start.tolist()[:5] == [0.0, 30.0, 10.0, 20.0, 130.0]


def test_max_wait_zero_is_fifo_in_arrival_order():
    r = _run([0.0] * 6, [50, 10, 40, 10, 30, 20], 2, max_wait=0.0)
    assert r.start.tolist() == [0.0, 0.0, 50.0, 50.0, 90.0, 90.0]


def test_its_scratch_holds_a_batch():
    assert spf.scratch_size(8) == 8 * (N_FIELDS + 2)
    pol = mb.ShortestPredictedFirst(10**9)
    assert pol.event_config().scratch == spf.scratch_size(10**9)
    # (sized for the run's n, not B: a batch holds n requests at most)
    from mbbatch.simulation import check_simulation

    small = check_simulation(mb.ShortestPredictedFirst(8), mb.Poisson(1.0), workload=mb.Workload([1.0], [1.0]),
                             n=100)
    big = check_simulation(pol, mb.Poisson(1.0), workload=mb.Workload([1.0], [1.0]), n=100)
    assert big - small < 8 * (spf.scratch_size(100) + 101)
