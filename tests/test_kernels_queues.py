"""The event kernel's queues (mbbatch._kernels.queues): ring buffers that
double without reordering, the warm-up's re-binning, and their sizes."""

import numpy as np
import scipy.stats as st

import mbbatch as mb
from mbbatch._kernels import queues


def _rings(K=3, cap=8, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.random((queues.N_FIELDS, K, cap))
    qidx = rng.integers(0, 10**6, (K, cap))
    head = rng.integers(0, cap, K)
    size = rng.integers(0, cap + 1, K)
    return q, qidx, head, size


def test_doubling_keeps_each_queue_in_order():
    q, qidx, head, size = _rings()
    before = [(q[:, b, queues.ring(head[b], size[b], 8)].copy(), qidx[b, queues.ring(head[b], size[b], 8)].copy())
              for b in range(3)]
    new = queues.grow(q, qidx, head, size)
    assert new["q"].shape == (queues.N_FIELDS, 3, 16) and (head == 0).all()
    for b in range(3):
        np.testing.assert_array_equal(new["q"][:, b, :size[b]], before[b][0])
        np.testing.assert_array_equal(new["qidx"][b, :size[b]], before[b][1])


def test_the_warmups_end_rebins_by_prediction_in_queue_order():
    """Bin 0 held every request; afterwards each is in the bin of its own
    prediction, the order within a bin kept."""
    K, cap = 3, 16
    q = np.zeros((queues.N_FIELDS, K, cap))
    qidx = np.zeros((K, cap), np.int64)
    head, size = np.array([5, 0, 0]), np.array([10, 0, 0])
    pred = np.array([5.0, 50.0, 500.0, 7.0, 70.0, 700.0, 1.0, 2.0, 60.0, 900.0])
    slots = queues.ring(5, 10, cap)
    q[queues.Q.pred, 0, slots] = pred
    qidx[0, slots] = np.arange(10)
    queues.rebin(q, qidx, head, size, np.array([0.0, 10.0, 100.0]), np.array([10.0, 100.0, 1e4]))
    assert size.tolist() == [4, 3, 3] and head.tolist() == [0, 0, 0]
    assert qidx[0, :4].tolist() == [0, 3, 6, 7] and qidx[1, :3].tolist() == [1, 4, 8]
    assert qidx[2, :3].tolist() == [2, 5, 9]


def test_queues_grow_through_a_deep_backlog_and_their_memory_is_counted():
    """A saturated run queues every request at time 0: its queues double
    from QUEUE_START to hold them all, as check_simulation counts."""
    wl = mb.Workload(prompt=st.uniform(10, 100), output=st.uniform(5, 50))
    n = 5 * queues.QUEUE_START
    res = mb.simulate(mb.StaticBatching(4), mb.Saturated(), workload=wl, n=n, seed=1)
    assert res.completed == n
    assert queues.grow_bytes(8) == queues.SLOT_BYTES * 8 + queues.doubling_bytes(8) == 3 * queues.SLOT_BYTES * 8
