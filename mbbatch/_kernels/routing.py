"""The routers of a cluster in the event kernel, by name and code.

``ROUTERS`` maps each router's name (``Cluster(router=...)``, a spec's
``router``) to the code the kernel branches on; ``ROUTE_NONE`` is one
engine, no router.  Their rules (Autellix: Luo et al., 2025, arXiv:2502.13965,
Algorithm 2):

- ``round_robin``: the registered engines in turn;
- ``least_used``: the fewest active requests (routed, not completed), ties
  to the lowest id;
- ``autellix``: a request of at most ``threshold`` prefill tokens least-used,
  a larger one to its program's engine in the program table, assigned
  least-used on first sight;
- ``cache_aware`` (continuous-batching engines that cache prefixes only:
  :func:`cache_aware`): the engine whose cache holds the most of the
  request's prefix, unless the engines' loads are out of balance
  (SGLang's cache-aware router, routing by the engines' KV cache state as
  its event-driven mode does).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import step, subroutine
from .layout import Layout
from .queues import N_FIELDS, Q

__all__ = ["ROUTE_NONE", "ROUTE_ROUND_ROBIN", "ROUTE_LEAST_USED", "ROUTE_AUTELLIX", "ROUTE_CACHE_AWARE", "ROUTERS",
           "CACHE_ROUTERS", "CacheRouting", "NO_CACHE_ROUTING", "cache_aware", "routed_call", "ENGINES", "EN",
           "TABLE", "TB", "Router", "scan_engines", "route", "context", "route_call", "remove_engine", "engine_of",
           "engine_formed", "engine_started", "engine_done"]

ROUTE_NONE = 0
ROUTE_ROUND_ROBIN = 1
ROUTE_LEAST_USED = 2
ROUTE_AUTELLIX = 3
ROUTE_CACHE_AWARE = 4
#: the routers by name, in the parameter table's order (the first is the default)
ROUTERS = {"autellix": ROUTE_AUTELLIX, "least_used": ROUTE_LEAST_USED, "round_robin": ROUTE_ROUND_ROBIN,
           "cache_aware": ROUTE_CACHE_AWARE}
#: the routers that read the engines' prefix caches (continuous-batching engines with prefix caching only)
CACHE_ROUTERS = ("cache_aware",)


#: a cluster's engines, columns of ``eng``: registered (0: removed), active
#: requests (the router's count: routed, not completed), queued requests,
#: free servers (0 while removed), requests decoding, Algorithm 5's
#: round-robin pointer
ENGINES = Layout("engines", ints=("registered", "active", "queued", "free", "decoding", "rr"))


#: the program table's rows (``table[row, program]``): the program's engine
#: (Autellix's program table; -1: none) and the engine holding its context (-1: none)
TABLE = Layout("program table", ints=("engine", "holder"))


EN = ENGINES.index


TB = TABLE.index


#: bits of an engine's id in :func:`scan_engines`' packed keys (at most
#: 2**20 engines, ``Cluster.engines``' domain; an engine's active requests,
#: bounded by its queues' memory, stay far below 2**43)
ENGINE_BITS = 20


#: above any engine's packed key
ACTIVE_NONE = np.iinfo(np.int64).max


#: the most engines :func:`scan_engines` reads one at a time; more are read by a loop the compiler
#: vectorizes
SCALAR_SCAN = 8


@step
def _scanned(e, active, registered, least, most, total, count):
    """:func:`scan_engines`' reductions with engine e read in (no branch on
    its values)."""
    on = registered[e] != 0
    a = active[e] if on else 0
    return (min(least, (active[e] << ENGINE_BITS) | e if on else ACTIVE_NONE), max(most, a), total + a,
            count + (1 if on else 0))


@step
def scan_engines(eng):
    """The least-used registered engine (fewest active requests, ties to the
    lowest id), the most active requests of a registered engine, their sum
    and the registered engines."""
    active = eng[EN.active]
    registered = eng[EN.registered]
    E = active.shape[0]
    # (the least key, active requests then id, is the least-used engine's)
    least, most, total, count = ACTIVE_NONE, 0, 0, 0
    if E <= SCALAR_SCAN:
        for e in range(E):
            if active[e] < 0:
                # (never: a count.  The loop may leave early, so the compiler keeps it scalar: a cluster of
                # continuous engines stores each engine's count just before (continuous_cluster._until_engines),
                # and a vector load of four counts stored one by one waits for the stores to land (store
                # forwarding fails): about 20 cycles a route, a twentieth of a prefill pool's kernel.  Over
                # more engines the vector loop is the faster: Autellix's 16 took 7 % longer scalar)
                break
            least, most, total, count = _scanned(e, active, registered, least, most, total, count)
    else:
        for e in range(E):
            least, most, total, count = _scanned(e, active, registered, least, most, total, count)
    best = least & ((1 << ENGINE_BITS) - 1) if count > 0 else -1
    return best, most, total, count


@step
def route(router, threshold, prompt, pid, programs, eng, rr_route, table):
    """The router's engine for a request of ``prompt`` tokens of program
    ``pid``: round-robin over the registered engines, least-used, or
    Autellix's Algorithm 2 (at most ``threshold`` tokens: least-used; more:
    the program table's engine, assigned least-used on first sight; without
    ``programs``, every request is its own program: least-used).  Returns
    the engine, the round-robin pointer after it, whether the program table
    routed it, and the engine loads (:func:`scan_engines`)."""
    best, most, total, count = scan_engines(eng)
    if router == ROUTE_ROUND_ROBIN:
        E = eng.shape[1]
        e = rr_route
        for _ in range(E):
            if eng[EN.registered, e] != 0:
                break
            e = e + 1 if e + 1 < E else 0
        return e, (e + 1 if e + 1 < E else 0), False, most, total, count
    if router == ROUTE_AUTELLIX and programs and prompt > threshold:
        e = table[TB.engine, pid]
        if e >= 0:
            return e, rr_route, True, most, total, count
        table[TB.engine, pid] = best
    return best, rr_route, False, most, total, count


@step
def context(kv, pid, e, prompt, new, table):
    """KV reuse: a call on the engine holding its program's context prefills
    its ``new`` tokens only, elsewhere its whole ``prompt``; the engine then
    holds the context.  Returns the prefill tokens and whether a context
    came before (and whether it was held there)."""
    followup = new < prompt
    hit = kv and followup and table[TB.holder, pid] == e
    table[TB.holder, pid] = e
    return (new if hit else prompt), followup, hit


@subroutine
def remove_engine(e, K, router, threshold, programs, kv, rr_route, q, qidx, head, size, eng, table, program,
                  new_tokens, session_end, joins):
    """Engine e leaves the cluster: it starts no batch (those it serves
    finish, outside the router's counts: the caller marks them); the program
    table forgets it and
    the contexts it held; its queued requests, bin by bin in queue order, are
    routed again to the tail of their bin on their new engine (every queue
    has room: checked by the caller), each with the verdict of its new
    engine (whether it holds the call's context).  Returns the round-robin
    pointer, the context tokens prefilled again, the requests moved and the
    change in calls served on the engine holding their context, and the
    joins counted (``joins`` before: each moved request joins its new queue
    at this instant)."""
    mask = qidx.shape[1] - 1
    eng[EN.registered, e] = 0
    eng[EN.free, e] = 0
    eng[EN.active, e] = 0
    if programs:
        for pp in range(table.shape[1]):
            if table[TB.engine, pp] == e:
                table[TB.engine, pp] = -1
            if table[TB.holder, pp] == e:
                table[TB.holder, pp] = -1
    recomputed = 0.0
    moved = 0
    hits = 0
    for lb in range(K):
        b = e * K + lb
        ub = np.uint64(b)
        while size[b] > 0:
            sl = np.uint64(head[b])
            idx = qidx[ub, sl]
            prompt = q[Q.prompt, ub, sl]
            pid = program[idx] if programs else idx
            e2, rr_route, _, _, _, _ = route(router, threshold, prompt, pid, programs, eng, rr_route, table)
            prefill = prompt
            if programs:
                was = q[Q.prefill, ub, sl]
                prefill, _, hit = context(kv, pid, e2, prompt, new_tokens[idx], table)
                recomputed += prefill - was
                # the call's verdict is the engine's that serves it: a hit prefilled fewer than its prompt
                hits += (1 if hit else 0) - (1 if was < prompt else 0)
                if session_end[idx] != 0:
                    table[TB.engine, pid] = -1
            b2 = e2 * K + lb
            ub2 = np.uint64(b2)
            sl2 = np.uint64((head[b2] + size[b2]) & mask)
            for f in range(N_FIELDS):
                q[f, ub2, sl2] = q[f, ub, sl]
            q[Q.prefill, ub2, sl2] = prefill
            q[Q.joined, ub2, sl2] = joins
            joins += 1
            qidx[ub2, sl2] = idx
            size[b2] += 1
            head[b] = (head[b] + 1) & mask
            size[b] -= 1
            eng[EN.queued, e2] += 1
            eng[EN.active, e2] += 1
            moved += 1
    eng[EN.queued, e] = 0
    return rr_route, recomputed, moved, hits, joins


#: A cluster's router and its settings, made once by the event kernel: its
#: code (``ROUTE_*``), Autellix's threshold (prefill tokens of the largest
#: small request), whether requests are calls of programs (a program table)
#: and whether a call on the engine holding its program's context prefills
#: its new tokens only (KV reuse).
Router = namedtuple("Router", ("router", "threshold", "programs", "kv"))


@step
def route_call(rt, eng, table, prompt, pid, new, last, rr_route):
    """An arriving request of ``prompt`` tokens, a call of program ``pid``
    with ``new`` tokens of its own (``last``: its program's last call),
    routed (:func:`route`) and counted there (:func:`routed_call`).
    Returns ``(engine, prefill tokens, round-robin pointer, routed by the
    table, followup, held, most, mean)``: whether a context came before it
    and whether its engine held it, and the most and the mean active
    requests of the registered engines (before it)."""
    e, rr_route, hit, most, total, count = route(rt.router, rt.threshold, prompt, pid, rt.programs, eng, rr_route,
                                                 table)
    return routed_call(rt, eng, table, e, prompt, pid, new, last, rr_route, hit, most, total, count)


@step
def routed_call(rt, eng, table, e, prompt, pid, new, last, rr_route, hit, most, total, count):
    """The request of :func:`route_call` sent to engine ``e``: with programs
    its engine holds the program's context from now on (:func:`context`),
    and at its program's last call the program table forgets the program
    (the engine holding its context keeps it: an earlier call rerouted
    finds it).  The engine counts it active.  Returns :func:`route_call`'s
    tuple (``hit``, ``most``, ``total`` and ``count`` as :func:`route`
    gave them)."""
    prefill = prompt
    followup = False
    held = False
    if rt.programs:
        prefill, followup, held = context(rt.kv, pid, e, prompt, new, table)
        if last:
            table[TB.engine, pid] = -1
    eng[EN.active, e] += 1
    return e, prefill, rr_route, hit, followup, held, most, total / count


#: the cache-aware router's settings (SGLang's router's): the share of a request's
#: prompt an engine's cache must hold for the request to go there, and the loads out of balance, when the most
#: active requests of an engine exceed the least by more than ``balance_abs`` and are more than ``balance_rel``
#: times them
CacheRouting = namedtuple("CacheRouting", ("threshold", "balance_abs", "balance_rel"))
#: the settings a router that reads no cache is given (unread)
NO_CACHE_ROUTING = CacheRouting(1.0, 0, 1.0)


@step
def cache_aware(eng, match, prompt, bs, ca):
    """The cache-aware router's engine for a request of ``prompt`` tokens
    whose prefix engine e's cache holds ``match[e]`` blocks of ``bs`` tokens
    (SGLang's cache-aware router, its event-driven mode, which reads the
    engines' KV cache state): while the loads (active requests) are out of
    balance (:class:`CacheRouting`), the least-used engine; else the engine
    holding the most blocks (ties: the fewer active requests, then the lower
    id) where they are more than ``ca.threshold`` of the prompt, and the
    least-used engine where none does.  Returns the engine and
    :func:`scan_engines`' loads."""
    best, most, total, count = scan_engines(eng)
    least = eng[EN.active, best]
    if most - least > ca.balance_abs and most > ca.balance_rel * least:
        return best, most, total, count
    active, registered = eng[EN.active], eng[EN.registered]
    pick, held = -1, np.int64(0)
    for e in range(active.shape[0]):
        if registered[e] != 0 and match[e] > 0 and (
                match[e] > held or (match[e] == held and active[e] < active[pick])):
            pick, held = e, match[e]
    if pick >= 0 and float(held * bs) > ca.threshold * prompt:
        return pick, most, total, count
    return best, most, total, count


# --- an engine's counts as its servers form, start and finish batches (``cl`` the kernel's
# cluster arrays, None for one engine: numba prunes the other branch)

@step
def engine_of(cl, k, per_engine, K, rr, queued):
    """Server k's engine, where the engine's queues start, its round-robin
    pointer (Algorithm 5's) and the requests waiting for it (0: none it may
    serve: a removed engine's servers start no batch).  One engine: engine
    0, the run's pointer ``rr`` and its ``queued`` requests."""
    if cl is None:
        return 0, 0, rr, queued
    eng = cl.eng
    e = k // per_engine
    return e, e * K, eng[EN.rr, e], eng[EN.queued, e] if eng[EN.registered, e] != 0 else 0


@step
def engine_formed(cl, e, rr_e, rr, rejected):
    """After engine e chose its batch: its round-robin pointer kept, the
    requests it rejected no longer queued nor active.  Returns the run's
    pointer (one engine: ``rr_e``)."""
    if cl is None:
        return rr_e
    eng = cl.eng
    eng[EN.rr, e] = rr_e
    eng[EN.queued, e] -= rejected
    eng[EN.active, e] -= rejected
    return rr


@step
def engine_started(cl, e, nb, service, completed, busy):
    """Engine e's server started a batch of ``nb`` requests taking
    ``service`` s: the requests decode, a server less is free."""
    if cl is not None:
        eng = cl.eng
        eng[EN.queued, e] -= nb
        eng[EN.free, e] -= 1
        eng[EN.decoding, e] += nb
        completed[e] += nb
        busy[e] += service


@step
def engine_done(cl, s, per_engine, nd, orphan, in_service):
    """Server s finished its batch of ``nd`` requests: its engine's counts
    (they stay active nowhere; the server is free again if its engine is in
    the cluster).  Returns the requests still decoding that Algorithm 7's
    N_decode reads: the engine's (one engine: the run's ``in_service``)."""
    if cl is None:
        return in_service
    eng = cl.eng
    e = s // per_engine
    eng[EN.decoding, e] -= nd
    if not orphan:
        eng[EN.active, e] -= nd
    if eng[EN.registered, e] != 0:
        eng[EN.free, e] += 1
    return eng[EN.decoding, e]
