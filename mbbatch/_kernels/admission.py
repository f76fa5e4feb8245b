"""The continuous engine's admission orders: the order its waiting requests
are admitted in, each declared once in :data:`ORDERS`.

An order keeps the waiting requests (not the preempted ones: the engine
resumes those first, the last preempted first) in the workspace's arrays and
three scalars, its queue ``q = (front, size, rr)``, and is ten steps
(``rounds``: the engine's decode rounds so far; ``par = (aging, full,
goodput, quantum, coef, expert_span, expert_miss)``: the aging rate,
tokens/s, the kernel variant's compile-time ``FULL``, whether the run
counts goodput, the feedback queue's first quantum, tokens, and the
iteration cost's coefficients and experts, :mod:`.cost`):

- ``join(q, i, par, ws, inputs, rounds) -> q``: request ``i`` arrived;
- ``head(q, par, ws, inputs, rounds) -> (r, b)``: the request it admits
  next and its bin or client (-1: none), called only while a request waits;
- ``admit(q, r, b, par, ws, inputs) -> q``: that request admitted;
- ``leave(q, r, b, par, ws, inputs) -> q``: that request leaves the
  waiting unadmitted (its engine leaves a cluster and hands it back to the
  router: :func:`.continuous_cluster._hand_back`); None: the order cannot
  hand its waiting back (it holds requests it preempted among them);
- ``served(kind, r, rounds, par, ws, inputs)``: request r's tokens as the
  engine serves them (:data:`JOINED`: it joins the decodes, which give it a
  token every round from the next; :data:`LEFT`: it leaves them, at
  ``rounds``; :data:`TOKEN`: a token outside the rounds, as a prefill
  completes); most orders ignore it;
- ``quota(r, par, ws) -> tokens``: the decode tokens request r may take
  before the order reconsiders it (:data:`UNLIMITED`: to its end; the
  engine asks as it joins the decodes);
- ``expire(q, r, g, now, rounds, crowded, free, bs, sh, par, ws, inputs) ->
  (q, preempt)``: its quota ran out at ``g`` tokens generated (at ``now``,
  round ``rounds``; ``crowded``: the running sequences at the engine's cap;
  ``free``: its free blocks of ``bs`` tokens, ``sh`` the shift of
  :func:`.common.blocks`): the order's update, and whether the engine
  preempts it (the order then holds it among its waiting, to be admitted
  again, its ``g`` tokens recomputed);
- ``resume(r, ws) -> (g, last)``: a waiting request's tokens generated and
  the time of its last (0 and 0.0 but for one the order preempted);
- ``contested(q, par, ws) -> bool``: whether a quota's end now could
  preempt; where none could, the engine does not look at the ends as they
  come (its decodes stay in the lists of their outputs' last rounds), and
- ``catch_up(r, before, par, ws) -> round``: decoding request r's quota's
  ends before round ``before`` that it did not look at, taken into account
  as ``expire`` takes an end it does not preempt at; the round its quota
  ends at now (the engine calls it for every decoding sequence as the ends
  become contested; the feedback queue calls it as a sequence leaves the
  decodes).  The numbers are those of looking at every end.

The engine calls :func:`join`, :func:`head`, :func:`admit`,
:func:`leave`, :func:`served`, :func:`quota`, :func:`expire`, :func:`resume`,
:func:`contested` and :func:`catch_up` (each
with the kernel variant's ``full``), which pick the order of a run's code
(its place in :data:`ORDERS`): a new order is its steps and a line of
:data:`ORDERS`, and, where it keeps a per-request array, that array's
name in its ``arrays``, which
:func:`mbbatch._kernels.continuous.start` sizes to the run's requests (the
others get one element).  An order that reads the requests' classes or
counts the tokens served declares ``full``: only the full kernel has its
code (the lean kernel, which runs the others, would otherwise hold the
arrays it reads through its loop, 3 % of its time in ``make bench``).

The orders:

- ``fcfs``, first come first served: the requests arrived, from ``front``
  on;
- ``spf``, shortest predicted output first (ties in arrival order), with
  ``aging`` (Fu et al., 2024, "Efficient LLM scheduling by learning to
  rank", arXiv:2408.15792) by priority ``prediction - aging x waited``:
  every waiting request's priority falls at the same rate, so the order is
  that of ``prediction + aging x arrival``, a key fixed at arrival (a heap
  of ``size``);
- ``multibin``: multi-bin admission (Guldogan et al., 2024, "Multi-bin
  batching for increasing LLM inference throughput", arXiv:2412.04504):
  a first-come-first-served queue per bin of predicted output between
  ``edges``, the bins served round robin from ``rr``;
- ``edf``, earliest deadline first: a request's deadline is its arrival
  plus its class's objective on the time to first token (``class_slo``;
  ties, and every request of a class without one, in arrival order), a key
  fixed at arrival (a heap of ``size``).  The deadline is the first
  token's, as in SLO-aware LLM schedulers that order prefills by their
  TTFT deadlines; a request is not dropped when it misses it;
- ``vtc``, fair sharing by virtual token counters (Sheng et al., 2024,
  "Fairness in serving large language models", OSDI, arXiv:2401.00588,
  Algorithm 2): each request's class is its client; a client's counter
  grows by :data:`INPUT_WEIGHT` per prompt token as its request is admitted
  and by :data:`OUTPUT_WEIGHT` per token the engine generates for it; the
  engine admits the earliest waiting request of the client with the least
  counter (ties: the lower class); a client arriving with nothing waiting
  has its counter lifted to the least counter of the clients with requests
  waiting (none waiting: to that of the client admitted last), so that idle
  time earns no credit.  Choices the paper leaves open: a preempted
  request's recomputed prompt is not charged again (its client asked for it
  once), and the counters count tokens as generated, not as returned.
  Counters are O(1) per event: ``vtc[u] + OUTPUT_WEIGHT x decoding[u] x
  rounds``, each of u's decoding sequences having subtracted its joining
  round;
- ``mlfq``, the skip-join multi-level feedback queue with preemption (Wu
  et al., 2023, "Fast distributed inference serving for large language
  models", FastServe, arXiv:2305.05920): ``levels`` first-come-first-served
  queues, level l's quantum ``quantum x 2^l`` decode tokens (the ratio 2
  of the paper; the last level's unbounded).  A request skips to the first
  level whose quantum is at least its first iteration's time in its decode
  iterations' (its prompt's prefill alone over one decode of its context,
  by the engine's iteration cost: long prompts start lower, as the paper's
  skip-join).  The engine admits the head of the first level holding one.
  A running sequence whose quantum ends is demoted a level and, if a
  request of a higher level waits that the engine cannot admit beside it
  (the head of the first level holding one, when the running sequences are
  at the engine's cap or the free blocks do not hold that head's prompt
  and first token: the paper's scheduler, choosing the highest-priority
  jobs at every iteration up to its batch, would run that one in its
  place), preempted to its new level's tail; one the engine can admit
  waits only for the iteration's token budget, and nothing is preempted.  Choices the paper leaves open or
  that mbbatch's engine makes: the quantum counts decode tokens (an
  iteration's unit of service in continuous batching; the prefill that
  produces the first token is what skip-join weighs), a running sequence is
  preempted only as its quantum ends (an arrival does not preempt one
  within its quantum), a preempted sequence loses its KV cache and
  recomputes it on resumption (the engine's preemption; FastServe swaps the
  cache to host memory instead), and there is no promotion of starved
  requests (the paper's optional starvation guard).

Pure numba steps, inlined into the engine's loop (:data:`~.common.step`).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import blocks, extra_experts, step
from .cost import PER_EXPERT, cost
from .programs import _heap_pop, _heap_push

#: an admission order: its steps, the workspace arrays it keeps per request, and whether only the full kernel
#: has it (an order reading the requests' classes or counting the tokens served: the lean kernel, which runs
#: the others, carries none of its code or of the arrays it reads)
Order = namedtuple("Order", ("join", "head", "admit", "leave", "served", "quota", "expire", "resume", "contested",
                             "catch_up", "arrays", "full"))
#: :func:`served`'s kinds
JOINED, LEFT, TOKEN = 0, 1, 2
#: the quota of an order that lets a running sequence run to its end
UNLIMITED = 1 << 62
#: fair sharing's weights of a prompt token and of a generated token (the paper's evaluation's 1 and 2)
INPUT_WEIGHT, OUTPUT_WEIGHT = 1.0, 2.0


@step
def _ignored(kind, r, rounds, par, ws, inputs):
    """(an order the tokens served do not move)"""
    return 0


@step
def _unlimited(r, par, ws):
    """(an order that lets a running sequence run to its end)"""
    return UNLIMITED


@step
def _never(q, r, g, now, rounds, crowded, free, bs, sh, par, ws, inputs):
    """(an order whose quotas never end)"""
    return q, False


@step
def _fresh(r, ws):
    """(an order whose waiting requests are all new)"""
    return np.int64(0), 0.0


@step
def _uncontested(q, par, ws):
    """(an order whose quotas never end: no quota's end could preempt)"""
    return False


@step
def _current(r, before, par, ws):
    """(an order whose quotas never end)"""
    return np.int64(UNLIMITED)


# first come first served -----------------------------------------------------------------------------------------

@step
def _fcfs_join(q, i, par, ws, inputs, rounds):
    """(the arrived requests are the queue: ``front`` .. the last arrived)"""
    return q


@step
def _fcfs_head(q, par, ws, inputs, rounds):
    return q[0], -1


@step
def _fcfs_admit(q, r, b, par, ws, inputs):
    return q[0] + 1, q[1], q[2]


# shortest predicted output first, with aging ---------------------------------------------------------------------

@step
def arrived(full, ws, r):
    """Request r's arrival, which its latency, time to first token and
    order keys count from: its first, ``ws.origin[r]``, where a run hands
    requests back to a cluster's router (the full kernel's), else the time
    it reached the engine, ``ws.arrival[r]``."""
    return ws.origin[r] if full and ws.origin.shape[0] > 0 else ws.arrival[r]


@step
def _spf_join(q, i, par, ws, inputs, rounds):
    """(with aging, the priority prediction - aging x (now - arrival) orders the waiting as prediction + aging x
    arrival does: every one's falls at the same rate)"""
    size = _heap_push(ws.sk, ws.sid, q[1], inputs.prediction[i] + par[0] * arrived(par[1], ws, i), i)
    return q[0], size, q[2]


@step
def _heap_head(q, par, ws, inputs, rounds):
    """(an order keeping its waiting in the heap: its top)"""
    return ws.sid[0], -1


@step
def _heap_admit(q, r, b, par, ws, inputs):
    _, _, size = _heap_pop(ws.sk, ws.sid, q[1])
    return q[0], size, q[2]


# queues per bin or per client ------------------------------------------------------------------------------------

@step
def _enqueue(i, b, ws):
    """Request i at the tail of queue b (``ws.bh``, ``ws.bt``, ``ws.qnext``).
    A request's ``qnext`` is written only as one joins behind it (the tail
    has none: :func:`_dequeue` knows it by ``bt``), so a run whose queues are
    mostly empty touches few of its pages."""
    bh, bt = ws.bh, ws.bt
    if bt[b] >= 0:
        ws.qnext[bt[b]] = i
    else:
        bh[b] = i
    bt[b] = i


@step
def _dequeue(r, b, ws):
    """The head r of queue b out of it."""
    if ws.bt[b] == r:
        ws.bh[b] = -1
        ws.bt[b] = -1
    else:
        ws.bh[b] = ws.qnext[r]


# multi-bin: a queue per bin of predicted output, round robin ---------------------------------------------------

@step
def _multibin_join(q, i, par, ws, inputs, rounds):
    """Into the bin of its prediction (an edge's value goes to the upper bin), at that bin's tail."""
    edges = inputs.edges
    K = ws.bh.shape[0]
    b = 0
    while b < K - 1 and inputs.prediction[i] >= edges[b]:
        b += 1
    _enqueue(i, b, ws)
    return q


@step
def _multibin_head(q, par, ws, inputs, rounds):
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
def _multibin_admit(q, r, b, par, ws, inputs):
    """Out of its bin (the head of bin b), the round robin past it."""
    _dequeue(r, b, ws)
    return q[0], q[1], b + 1 if b + 1 < ws.bh.shape[0] else 0


# earliest deadline first ---------------------------------------------------------------------------------------

@step
def class_of(inputs, r):
    """Request r's class (0 where the requests have none)."""
    return np.int64(inputs.klass[r]) if inputs.klass.shape[0] > 0 else np.int64(0)


@step
def _edf_join(q, i, par, ws, inputs, rounds):
    """(its deadline: its arrival plus its class's objective on the time to first token)"""
    size = _heap_push(ws.sk, ws.sid, q[1], arrived(par[1], ws, i) + inputs.class_slo[class_of(inputs, i)], i)
    return q[0], size, q[2]


# fair sharing: virtual token counters ----------------------------------------------------------------------------

@step
def _counter(u, rounds, ws):
    """Client u's virtual token counter after ``rounds`` decode rounds."""
    return ws.vtc[u] + OUTPUT_WEIGHT * ws.vtc_decoding[u] * rounds


@step
def _least(rounds, ws):
    """The client of least counter among those with requests waiting (ties:
    the lower) and its counter; ``(-1, inf)`` where none waits."""
    bh = ws.bh
    best, least = -1, np.inf
    for v in range(bh.shape[0]):
        if bh[v] >= 0:
            c = _counter(v, rounds, ws)
            if c < least:
                best, least = v, c
    return best, least


@step
def _vtc_join(q, i, par, ws, inputs, rounds):
    """Into its client's queue; a client with nothing waiting first has its
    counter lifted to the least of the waiting clients' (none waiting: to
    that of the client admitted last, ``q[2]``; before any admission client
    0's, whose counter is then 0 as every client's: no lift)."""
    u = class_of(inputs, i)
    if ws.bh[u] < 0:
        _, least = _least(rounds, ws)
        if least == np.inf and q[2] >= 0:
            least = _counter(q[2], rounds, ws)
        if least != np.inf and least > _counter(u, rounds, ws):
            ws.vtc[u] = least - OUTPUT_WEIGHT * ws.vtc_decoding[u] * rounds
    _enqueue(i, u, ws)
    return q


@step
def _vtc_head(q, par, ws, inputs, rounds):
    """The earliest waiting request of the client of least counter (ties: the lower)."""
    best, _ = _least(rounds, ws)
    return (ws.bh[best], best) if best >= 0 else (-1, -1)


@step
def _vtc_admit(q, r, b, par, ws, inputs):
    """Out of its client's queue, its prompt charged to the client, the client the last admitted."""
    _dequeue(r, b, ws)
    ws.vtc[b] += INPUT_WEIGHT * inputs.prompt[r]
    return q[0], q[1], b


@step
def _vtc_leave(q, r, b, par, ws, inputs):
    """Out of its client's queue, nothing charged (its client was not served)."""
    _dequeue(r, b, ws)
    return q


@step
def _vtc_served(kind, r, rounds, par, ws, inputs):
    """A decoding sequence's tokens accrue as ``OUTPUT_WEIGHT x (rounds -
    joined)``: joining subtracts its round and counts it decoding, leaving
    adds the round it leaves at; a token outside the rounds is charged at
    once."""
    u = class_of(inputs, r)
    if kind == JOINED:
        ws.vtc[u] -= OUTPUT_WEIGHT * rounds
        ws.vtc_decoding[u] += 1
    elif kind == LEFT:
        ws.vtc[u] += OUTPUT_WEIGHT * rounds
        ws.vtc_decoding[u] -= 1
    else:
        ws.vtc[u] += OUTPUT_WEIGHT
    return 0


# skip-join multi-level feedback queue ---------------------------------------------------------------------------

#: the feedback queue's state of a request, side by side in ``ws.mlfq`` (a cache line where four arrays took
#: four): ``mlfq[MLFQ x r + LEVEL]`` its level, ``+ QUOTA`` its quota's decode tokens left, ``+ FROM`` the
#: round they were last counted from (while it decodes), ``+ GEN`` the tokens it had generated when last
#: preempted (0 from its arrival: written as it joins, beside its level, where an array of zeros would have
#: its pages faulted in, one by one, as requests are preempted)
MLFQ, LEVEL, QUOTA, FROM, GEN = 4, 0, 1, 2, 3
#: the elements a request takes in an order's per-request array (1 unless named here)
WIDTHS = {"mlfq": MLFQ}


@step
def _level_quantum(level, par, K):
    """Level ``level``'s quantum of ``K`` levels: ``quantum x 2^level``
    decode tokens, the last level's unbounded."""
    return np.int64(par[3]) << level if level < K - 1 else np.int64(UNLIMITED)


@step
def skip_level(p, par, K):
    """The level a request of prompt ``p`` joins: the first whose quantum is
    at least its first iteration's time (its prefill alone) in units of one
    decode of its context (``p + 1`` tokens), by the iteration cost
    (:func:`.cost.cost`; the last level where none is)."""
    coef = par[4]
    x = float(p)
    reads = extra_experts(par[5], par[6], x) if coef[PER_EXPERT] > 0.0 else 0.0
    first = cost(coef, 0.0, 1.0, x, 0.0, 0.0, reads, x * x)
    decode = cost(coef, 0.0, 1.0, 0.0, 1.0, x + 1.0, 0.0, 0.0)
    e = first / decode if decode > 0.0 else (0.0 if first <= 0.0 else np.inf)
    lv = 0
    while lv < K - 1 and float(_level_quantum(lv, par, K)) < e:
        lv += 1
    return lv


@step
def _mlfq_join(q, i, par, ws, inputs, rounds):
    """Into the queue of its skip-join level (:func:`skip_level`), its quota that level's quantum."""
    K = ws.bh.shape[0]
    lv = skip_level(np.int64(inputs.prompt[i]), par, K)
    ws.mlfq[MLFQ * i + LEVEL] = lv
    ws.mlfq[MLFQ * i + QUOTA] = _level_quantum(lv, par, K)
    ws.mlfq[MLFQ * i + GEN] = 0
    _enqueue(i, lv, ws)
    return q


@step
def _mlfq_head(q, par, ws, inputs, rounds):
    """The head of the first level holding one."""
    bh = ws.bh
    for b in range(bh.shape[0]):
        if bh[b] >= 0:
            return bh[b], b
    return -1, -1


@step
def _mlfq_admit(q, r, b, par, ws, inputs):
    _dequeue(r, b, ws)
    return q


@step
def _mlfq_served(kind, r, rounds, par, ws, inputs):
    """A sequence's decode tokens spend its quota: joining the decodes
    records the round, leaving them subtracts the rounds since (its
    quantum's ends up to this round caught up first: :func:`_mlfq_catch_up`)."""
    if kind == JOINED:
        ws.mlfq[MLFQ * r + FROM] = rounds
    elif kind == LEFT:
        _mlfq_catch_up(r, rounds + 1, par, ws)
        ws.mlfq[MLFQ * r + QUOTA] -= rounds - ws.mlfq[MLFQ * r + FROM]
    return 0


@step
def _mlfq_quota(r, par, ws):
    return ws.mlfq[MLFQ * r + QUOTA]


@step
def _mlfq_expire(q, r, g, now, rounds, crowded, free, bs, sh, par, ws, inputs):
    """Its quantum spent: down a level (a new quantum from this round);
    preempted to that level's tail where the head of a higher level waits
    that the engine cannot admit beside it (``crowded``, or its prompt, tokens
    generated and first token need more than the ``free`` blocks), its
    ``g`` tokens and the time of its last kept for its resumption."""
    K = ws.bh.shape[0]
    at = MLFQ * r
    lv = ws.mlfq[at + LEVEL] + 1 if ws.mlfq[at + LEVEL] + 1 < K else K - 1
    ws.mlfq[at + LEVEL] = lv
    ws.mlfq[at + QUOTA] = _level_quantum(lv, par, K)
    ws.mlfq[at + FROM] = rounds
    for b in range(lv):
        h = ws.bh[b]
        if h >= 0:
            if crowded or blocks(np.int64(inputs.prompt[h]) + ws.mlfq[MLFQ * h + GEN] + 1, bs, sh) > free:
                ws.mlfq[at + GEN] = g
                ws.resume_last[r] = now
                _enqueue(r, lv, ws)
                return q, True
            return q, False
    return q, False


@step
def _mlfq_contested(q, par, ws):
    """Whether a quantum's end now could preempt: a request waits at a level
    but the last (:func:`_mlfq_expire` preempts only for the head of a level
    above the one a sequence goes down to, never the last)."""
    bh = ws.bh
    for b in range(bh.shape[0] - 1):
        if bh[b] >= 0:
            return True
    return False


@step
def _mlfq_catch_up(r, before, par, ws):
    """Decoding request r's quantum's ends before round ``before`` that were
    not looked at (no request waited that they could have been preempted
    for): down a level at each, a new quantum from it, as
    :func:`_mlfq_expire` takes a sequence down that it does not preempt.
    Returns the round its quantum ends at now."""
    K = ws.bh.shape[0]
    at = MLFQ * r
    lv = ws.mlfq[at + LEVEL]
    end = ws.mlfq[at + FROM] + ws.mlfq[at + QUOTA]
    while lv < K - 1 and end < before:
        lv += 1
        ws.mlfq[at + FROM] = end
        ws.mlfq[at + QUOTA] = _level_quantum(lv, par, K)
        end += ws.mlfq[at + QUOTA]
    ws.mlfq[at + LEVEL] = lv
    return end


@step
def _mlfq_resume(r, ws):
    return ws.mlfq[MLFQ * r + GEN], ws.resume_last[r]


#: the orders, by name (the parameter table's ``admission`` choices); a run's code is an order's place here
ORDERS: dict = {
    "fcfs": Order(_fcfs_join, _fcfs_head, _fcfs_admit, _fcfs_admit, _ignored, _unlimited, _never, _fresh,
                  _uncontested, _current, (), False),
    "spf": Order(_spf_join, _heap_head, _heap_admit, _heap_admit, _ignored, _unlimited, _never, _fresh, _uncontested,
                 _current, ("sk", "sid"), False),
    "multibin": Order(_multibin_join, _multibin_head, _multibin_admit, _multibin_admit, _ignored, _unlimited, _never,
                      _fresh, _uncontested, _current, ("qnext",), False),
    "edf": Order(_edf_join, _heap_head, _heap_admit, _heap_admit, _ignored, _unlimited, _never, _fresh, _uncontested,
                 _current, ("sk", "sid"), True),
    "vtc": Order(_vtc_join, _vtc_head, _vtc_admit, _vtc_leave, _vtc_served, _unlimited, _never, _fresh, _uncontested,
                 _current, ("qnext",), True),
    "mlfq": Order(_mlfq_join, _mlfq_head, _mlfq_admit, None, _mlfq_served, _mlfq_quota, _mlfq_expire, _mlfq_resume,
                  _mlfq_contested, _mlfq_catch_up, ("qnext", "mlfq", "resume_last"), True),
}
#: every order's per-request arrays (:attr:`Order.arrays`), each named once
ARRAYS = tuple(dict.fromkeys(a for o in ORDERS.values() for a in o.arrays))
#: per order (by code), whether it can hand its waiting requests back (:attr:`Order.leave` given)
HANDS_BACK = tuple(o.leave is not None for o in ORDERS.values())
#: per order (by code), whether only the full kernel has it (:attr:`Order.full`)
FULL_ONLY = tuple(o.full for o in ORDERS.values())
#: an order's code, by name
CODES: dict = {name: code for code, name in enumerate(ORDERS)}


def _dispatch(name: str):
    """A step calling order ``adm``'s step ``name`` for ``(adm, full,
    *args)``: a chain of comparisons on the code, inlined like the steps it
    calls (the loop pays a well-predicted branch per call, as it did when
    the orders were written into it).  The orders of the full kernel only
    (:data:`FULL_ONLY`) are in the chain only where ``full`` (a
    compile-time constant of the kernel's variant): the lean kernel, which
    never runs them, carries none of their code."""
    # (numba compiles a closure's free variables as constants: each link is a step of its own, calling its order's
    # step or the next link; the chain's end, reached by no valid code, is the first order's)
    # (an order without ``leave``, None, has one that is never called: its runs hand nothing back)
    steps = [getattr(o, name) or _unreachable for o in ORDERS.values()]
    chain = _end(steps[0], name)
    for code in reversed(range(len(steps))):
        chain = _link(code, steps[code], chain, name, FULL_ONLY[code])
    return chain


@step
def _unreachable(q, r, b, par, ws, inputs):
    """(an order's ``leave`` it does not have: never called)"""
    return q


def _end(fn, name):
    def end(adm, full, *args):
        return fn(*args)
    end.__qualname__ = f"admission_{name}_end"
    return step(end)


def _link(code, fn, rest, name, full_only):
    def link(adm, full, *args):
        if (full or not full_only) and adm == code:
            return fn(*args)
        return rest(adm, full, *args)
    link.__qualname__ = f"admission_{name}_{code}"
    return step(link)


#: ``join(adm, full, q, i, par, ws, inputs, rounds) -> q``: request i arrived, into order ``adm``'s queue
join = _dispatch("join")
#: ``head(adm, full, q, par, ws, inputs, rounds) -> (r, b)``: the request order ``adm`` admits next and its bin
head = _dispatch("head")
#: ``admit(adm, full, q, r, b, par, ws, inputs) -> q``: the head ``r`` (of bin ``b``) admitted
admit = _dispatch("admit")
#: ``leave(adm, full, q, r, b, par, ws, inputs) -> q``: the head ``r`` (of bin ``b``) leaves unadmitted
leave = _dispatch("leave")
#: ``served(adm, full, kind, r, rounds, par, ws, inputs)``: request r's tokens served (:data:`JOINED`,
#: :data:`LEFT`, :data:`TOKEN`)
served = _dispatch("served")
#: ``quota(adm, full, r, par, ws) -> tokens``: the decode tokens order ``adm`` lets request r take
quota = _dispatch("quota")
#: ``expire(adm, full, q, r, g, now, rounds, crowded, free, bs, sh, par, ws, inputs) -> (q, preempt)``: r's quota spent
expire = _dispatch("expire")
#: ``resume(adm, full, r, ws) -> (g, last)``: a waiting request's tokens generated and the time of its last
resume = _dispatch("resume")
#: ``contested(adm, full, q, par, ws) -> bool``: whether a quota's end now could preempt (else the engine need
#: not look at it as it comes: :func:`catch_up` takes it into account later)
contested = _dispatch("contested")
#: ``catch_up(adm, full, r, before, par, ws) -> round``: decoding request r's quota's ends before round
#: ``before``, not looked at (uncontested), taken into account; the round its quota ends at now
catch_up = _dispatch("catch_up")


def arrays(code: int) -> tuple:
    """The workspace arrays order ``code`` keeps per request."""
    return tuple(ORDERS.values())[code].arrays
