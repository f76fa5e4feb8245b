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
  least-used on first sight.
"""

from __future__ import annotations

import numpy as np

from .common import step, subroutine
from .layout import Layout
from .queues import N_FIELDS, Q

__all__ = ["ROUTE_NONE", "ROUTE_ROUND_ROBIN", "ROUTE_LEAST_USED", "ROUTE_AUTELLIX", "ROUTERS", "ENGINES", "EN",
           "TABLE", "TB", "scan_engines", "route", "context", "remove_engine"]

ROUTE_NONE = 0
ROUTE_ROUND_ROBIN = 1
ROUTE_LEAST_USED = 2
ROUTE_AUTELLIX = 3
#: the routers by name, in the parameter table's order (the first is the default)
ROUTERS = {"autellix": ROUTE_AUTELLIX, "least_used": ROUTE_LEAST_USED, "round_robin": ROUTE_ROUND_ROBIN}


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


@step
def scan_engines(eng):
    """The least-used registered engine (fewest active requests, ties to the
    lowest id), the most active requests of a registered engine, their sum
    and the registered engines."""
    active = eng[EN.active]
    registered = eng[EN.registered]
    E = active.shape[0]
    # (reductions without branches, which the compiler vectorizes; the least
    # key, active requests then id, is the least-used engine's)
    least = ACTIVE_NONE
    most = 0
    total = 0
    count = 0
    for e in range(E):
        on = registered[e] != 0
        a = active[e] if on else 0
        least = min(least, (active[e] << ENGINE_BITS) | e if on else ACTIVE_NONE)
        most = max(most, a)
        total += a
        count += 1 if on else 0
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
                  new_tokens, session_end):
    """Engine e leaves the cluster: it starts no batch (those it serves
    finish, outside the router's counts: the caller marks them); the program
    table forgets it and
    the contexts it held; its queued requests, bin by bin in queue order, are
    routed again to the tail of their bin on their new engine (every queue
    has room: checked by the caller), each with the verdict of its new
    engine (whether it holds the call's context).  Returns the round-robin
    pointer, the context tokens prefilled again, the requests moved and the
    change in calls served on the engine holding their context."""
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
            qidx[ub2, sl2] = idx
            size[b2] += 1
            head[b] = (head[b] + 1) & mask
            size[b] -= 1
            eng[EN.queued, e2] += 1
            eng[EN.active, e2] += 1
            moved += 1
    eng[EN.queued, e] = 0
    return rr_route, recomputed, moved, hits
