"""The continuous engine's admission orders: the order its waiting requests
are admitted in, each declared once in :data:`ORDERS`.

An order keeps the waiting requests (not the preempted ones: the engine
resumes those first, the last preempted first) in the workspace's arrays and
three scalars, its queue ``q = (front, size, rr)``, and is three steps:

- ``join(q, i, par, ws, inputs) -> q``: request ``i`` arrived;
- ``head(q, ws) -> (r, b)``: the request it admits next and its bin (-1:
  none), called only while a request waits;
- ``admit(q, r, b, ws) -> q``: that request admitted.

``par`` holds the orders' parameters (``(aging,)``, tokens/s).  The engine
calls :func:`join`, :func:`head` and :func:`admit`, which pick the order of
a run's code (its place in :data:`ORDERS`): a new order is its three steps
and a line of :data:`ORDERS`, and, where it keeps a per-request array, that
array's name in its ``arrays``, which :func:`mbbatch._kernels.continuous.start`
sizes to the run's requests (the others get one element).

The orders:

- ``fcfs``, first come first served: the requests arrived, from ``front``
  on;
- ``spf``, shortest predicted output first (ties in arrival order), with
  ``aging`` (Fu et al., 2024, "Efficient LLM scheduling by learning to
  rank", arXiv:2408.15792) by priority ``prediction - aging x waited``:
  every waiting request's priority falls at the same rate, so the order is
  that of ``prediction + aging x arrival``, a key fixed at arrival (a heap
  of ``size``);
- ``edf``, earliest deadline first: a request's deadline is its arrival
  plus its class's objective on the time to first token (``class_slo``;
  ties, and every request of a class without one, in arrival order), a key
  fixed at arrival (a heap of ``size``).  The deadline is the first
  token's, as in SLO-aware LLM schedulers that order prefills by their
  TTFT deadlines; a request is not dropped when it misses it;
- ``multibin``: multi-bin admission (Guldogan et al., 2024, "Multi-bin
  batching for increasing LLM inference throughput", arXiv:2412.04504):
  a first-come-first-served queue per bin of predicted output between
  ``edges``, the bins served round robin from ``rr``.

Pure numba steps, inlined into the engine's loop (:data:`~.common.step`).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import step
from .programs import _heap_pop, _heap_push

#: an admission order: its steps and the workspace arrays it keeps per request
Order = namedtuple("Order", ("join", "head", "admit", "arrays"))


# first come first served -----------------------------------------------------------------------------------------

@step
def _fcfs_join(q, i, par, ws, inputs):
    """(the arrived requests are the queue: ``front`` .. the last arrived)"""
    return q


@step
def _fcfs_head(q, ws):
    return q[0], -1


@step
def _fcfs_admit(q, r, b, ws):
    return q[0] + 1, q[1], q[2]


# shortest predicted output first, with aging ---------------------------------------------------------------------

@step
def _spf_join(q, i, par, ws, inputs):
    """(with aging, the priority prediction - aging x (now - arrival) orders the waiting as prediction + aging x
    arrival does: every one's falls at the same rate)"""
    size = _heap_push(ws.sk, ws.sid, q[1], inputs.prediction[i] + par[0] * ws.arrival[i], i)
    return q[0], size, q[2]


@step
def _heap_head(q, ws):
    """(an order keeping its waiting in the heap: its top)"""
    return ws.sid[0], -1


@step
def _heap_admit(q, r, b, ws):
    _, _, size = _heap_pop(ws.sk, ws.sid, q[1])
    return q[0], size, q[2]


# earliest deadline first ---------------------------------------------------------------------------------------

@step
def class_of(inputs, r):
    """Request r's class (0 where the requests have none)."""
    return np.int64(inputs.klass[r]) if inputs.klass.shape[0] > 0 else np.int64(0)


@step
def _edf_join(q, i, par, ws, inputs):
    """(its deadline: its arrival plus its class's objective on the time to first token)"""
    size = _heap_push(ws.sk, ws.sid, q[1], ws.arrival[i] + inputs.class_slo[class_of(inputs, i)], i)
    return q[0], size, q[2]


# multi-bin: a queue per bin of predicted output, round robin ---------------------------------------------------

@step
def _multibin_join(q, i, par, ws, inputs):
    """Into the bin of its prediction (an edge's value goes to the upper bin), at that bin's tail."""
    edges, bh, bt, qnext = inputs.edges, ws.bh, ws.bt, ws.qnext
    K = bh.shape[0]
    b = 0
    while b < K - 1 and inputs.prediction[i] >= edges[b]:
        b += 1
    qnext[i] = -1
    if bt[b] >= 0:
        qnext[bt[b]] = i
    else:
        bh[b] = i
    bt[b] = i
    return q


@step
def _multibin_head(q, ws):
    """The head of the first bin holding one from the round-robin pointer on."""
    bh = ws.bh
    K = bh.shape[0]
    rr = q[2]
    for off in range(K):
        b = rr + off
        if b >= K:
            b -= K
        if bh[b] >= 0:
            return bh[b], b
    return -1, -1


@step
def _multibin_admit(q, r, b, ws):
    """Out of its bin (the head of bin b), the round robin past it."""
    bh, bt = ws.bh, ws.bt
    bh[b] = ws.qnext[r]
    if bh[b] < 0:
        bt[b] = -1
    return q[0], q[1], b + 1 if b + 1 < bh.shape[0] else 0


#: the orders, by name (the parameter table's ``admission`` choices); a run's code is an order's place here
ORDERS: dict = {
    "fcfs": Order(_fcfs_join, _fcfs_head, _fcfs_admit, ()),
    "spf": Order(_spf_join, _heap_head, _heap_admit, ("sk", "sid")),
    "multibin": Order(_multibin_join, _multibin_head, _multibin_admit, ("qnext",)),
    "edf": Order(_edf_join, _heap_head, _heap_admit, ("sk", "sid")),
}
#: an order's code, by name
CODES: dict = {name: code for code, name in enumerate(ORDERS)}


def _dispatch(steps, args: str):
    """A step calling ``steps[adm]`` on ``args``: a chain of comparisons
    on the code, inlined like the steps it calls (the loop pays a
    well-predicted branch per call, as it did when the orders were written
    into it)."""
    # (numba compiles a closure's free variables as constants: each link is a step of its own, calling its order's
    # step or the next link)
    chain = None
    for code in reversed(range(len(steps))):
        chain = _link(code, steps[code], chain, args)
    return chain


def _link(code, fn, rest, args):
    if args == "join":
        if rest is None:
            def link(adm, q, i, par, ws, inputs):
                return fn(q, i, par, ws, inputs)
        else:
            def link(adm, q, i, par, ws, inputs):
                if adm == code:
                    return fn(q, i, par, ws, inputs)
                return rest(adm, q, i, par, ws, inputs)
    elif args == "head":
        if rest is None:
            def link(adm, q, ws):
                return fn(q, ws)
        else:
            def link(adm, q, ws):
                if adm == code:
                    return fn(q, ws)
                return rest(adm, q, ws)
    else:
        if rest is None:
            def link(adm, q, r, b, ws):
                return fn(q, r, b, ws)
        else:
            def link(adm, q, r, b, ws):
                if adm == code:
                    return fn(q, r, b, ws)
                return rest(adm, q, r, b, ws)
    link.__qualname__ = f"admission_{args}_{code}"
    return step(link)


#: ``join(adm, q, i, par, ws, inputs)``: request i arrived, into order ``adm``'s queue
join = _dispatch([o.join for o in ORDERS.values()], "join")
#: ``head(adm, q, ws) -> (r, b)``: the request order ``adm`` admits next and its bin
head = _dispatch([o.head for o in ORDERS.values()], "head")
#: ``admit(adm, q, r, b, ws) -> q``: the head ``r`` (of bin ``b``) admitted
admit = _dispatch([o.admit for o in ORDERS.values()], "admit")


def arrays(code: int) -> tuple:
    """The workspace arrays order ``code`` keeps per request."""
    return tuple(ORDERS.values())[code].arrays
