"""Shortest-predicted-first's step of the event kernel (mbbatch._kernels.spf):
its batches on hand-computed traces, its starvation guard and its scratch."""

import subprocess
import sys

import numba
import numpy as np

import mbbatch as mb
from mbbatch._kernels import spf
from mbbatch._kernels.queues import N_FIELDS, Q

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


@numba.njit
def _batch(q, qidx, b, h, m, nb, now, max_wait, sc):
    return spf.spf_batch(q, qidx, b, h, m, nb, now, max_wait, sc)


def _gather(cap, h, arrival, pred, idx, nb, now, max_wait):
    """spf_batch on a queue of one ring of ``cap`` slots from slot ``h``:
    the queue (idx) after it from its new head, and that head."""
    m = len(pred)
    q = np.full((N_FIELDS, 2, cap), np.nan)
    qidx = np.full((2, cap), -1, np.int64)
    slots = (h + np.arange(m)) % cap
    q[Q.arrival, 1, slots] = arrival
    q[Q.pred, 1, slots] = pred
    q[Q.prompt, 1, slots] = np.arange(m) + 0.5      # (a field moved with its request)
    qidx[1, slots] = idx
    sc = np.empty(spf.scratch_size(nb))
    h1 = _batch(q, qidx, 1, h, m, nb, now, max_wait, sc)
    got = (h1 + np.arange(m)) % cap
    assert (q[Q.prompt, 1, got] == np.searchsorted(idx, qidx[1, got]) + 0.5).all()   # fields moved with it
    assert (q[Q.pred, 1, got] == np.asarray(pred)[np.searchsorted(idx, qidx[1, got])]).all()
    return qidx[1, got].tolist(), h1


def _expected(arrival, pred, idx, nb, now, max_wait):
    """The queue after the batch, from its definition: the overdue head,
    then the nb - overdue smallest (prediction, index) of the rest, in
    arrival order, then the others in theirs."""
    m = len(pred)
    o = 0
    while o < nb and now - arrival[o] >= max_wait:
        o += 1
    rest = sorted(range(o, m), key=lambda j: (pred[j], idx[j]))[:nb - o]
    members = list(range(o)) + sorted(rest)
    return [idx[j] for j in members] + [idx[j] for j in range(m) if j not in members]


def test_the_batch_is_gathered_either_way_to_the_same_queue():
    """Random queues in rings of 8 to 64 slots (wrapping, ties in the
    predictions, some requests overdue): the queue after spf_batch is its
    definition's, whichever way it gathers; the members at the tail of a
    queue with room move the head back (the cheap way), without room or at
    the front they do not."""
    rng = np.random.default_rng(5)
    moved = kept = 0
    for case in range(600):
        cap = int(rng.choice([8, 16, 64]))
        m = int(rng.integers(2, cap + 1))
        nb = int(rng.integers(1, m + 1))
        h = int(rng.integers(0, cap))
        arrival = np.sort(rng.uniform(0, 10, m))
        pred = rng.integers(0, 6, m).astype(float)
        if case % 3 == 0:
            pred[-nb:] = -1.0 - rng.integers(0, 2, nb)      # the shortest at the tail
        idx = np.sort(rng.choice(1000, m, replace=False))
        max_wait = float(rng.choice([np.inf, 5.0, 0.0]))
        got, h1 = _gather(cap, h, arrival, pred, idx, nb, 10.0, max_wait)
        assert got == _expected(arrival, pred, idx, nb, 10.0, max_wait), case
        moved += h1 != h
        kept += h1 == h
    assert moved > 50 and kept > 50, (moved, kept)


def test_a_full_ring_gathers_in_place():
    """Members at the tail of a full ring: no room before the head, so the
    others move back and the head stays."""
    pred = [5.0, 6.0, 7.0, 1.0]
    got, h1 = _gather(4, 2, [0.0, 1.0, 2.0, 3.0], pred, [0, 1, 2, 3], 1, 4.0, np.inf)
    assert got == [3, 0, 1, 2] and h1 == 2
    got, h1 = _gather(8, 2, [0.0, 1.0, 2.0, 3.0], pred, [0, 1, 2, 3], 1, 4.0, np.inf)
    assert got == [3, 0, 1, 2] and h1 == 1


def test_its_step_is_compiled_apart_on_first_use():
    """mb.warmup() compiles none of the rule (the event kernel calls it by
    address); a process's first run of it does."""
    code = ("import mbbatch as mb, numpy as np\n"
            "from mbbatch._kernels import common\n"
            "mb.warmup()\n"
            "key = ('order', mb._kernels.spf.FORM_SPF)\n"
            "print(key in common._COMPILED)\n"
            "mb.simulate(mb.ShortestPredictedFirst(2), mb.Poisson(1.0), workload=mb.Workload([1.0], [1.0]), n=20)\n"
            "print(key in common._COMPILED)\n")
    got = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["False", "True"]
