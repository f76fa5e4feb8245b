"""A plain-Python discrete-event simulation of a cluster of engines behind a
router (``mb.Cluster``), written from the documented rules to check the
event kernel request by request.

Scope: ``engines`` engines of ``servers`` servers each, every engine running
static batching (a free server takes up to ``batch_size`` requests from the
head of its engine's FIFO) or the multi-bin paper's batching (requests join
bins by their predicted output tokens; a batch is ``batch_size`` requests of
one bin and leaves only when full; a free server takes the batch that formed
first); the routers ``round_robin``, ``least_used`` and ``autellix``;
programs (a call's program, its new tokens, its program's last call) and KV
reuse; engine events.  A batch of b requests takes ``DecodeModel(beta,
gamma, prefill_per_token)``'s ``prefill_per_token * (its prefill tokens) +
beta (1 + gamma (b-1)/max(1, b)) * (its largest output)`` s; or, with
``iteration`` (an ``mb.IterationModel``), its iterations from that model's
definition: a prefill iteration over its prefill tokens, then one decode
iteration per step, each member attending over its whole prompt and the
tokens it generated.

The rules, from the user guide (docs/guide/clusters.md), ``mb.Cluster``,
``mb.EngineEvent``, ``mb.Programs`` and ``mbbatch.routing.LoadBalancer``:

- An engine's load is its active requests: routed to it and not completed.
  ``least_used`` takes the registered engine with the fewest (ties to the
  lowest id); ``round_robin`` the registered engines in turn; ``autellix``
  a request of at most ``threshold`` prompt tokens least-used, a larger one
  its program's engine in the program table, assigned least-used on first
  sight.  A program's table entry is cleared at its last call.
- A call's context is held by the engine of its program's most recently
  routed call.  Routed to that engine, a follow-up (new tokens < prompt)
  prefills its new tokens only (with ``kv_reuse``), elsewhere its prompt.
- A removed engine finishes the batches it serves (their requests leave
  the router's counts: the engine is unregistered) and starts none; the
  program table forgets it (its programs and the contexts it held); its
  queued requests are routed again at that instant, in queue order (a
  multi-bin engine's bin by bin), each to the tail of its new engine's
  queue, and their prefill and hit verdicts are those of the new engine
  (a multi-bin batch that a rerouted request fills forms at that instant).
  An engine added back starts with no active requests.
- At one instant: completions first (lowest server index first), then
  engine events (in their order), then arrivals (in request order); then
  every free server of a registered engine, in server-index order (server
  k belongs to engine k // servers), takes a batch of its engine.

Read from the kernel, as conventions only: the event order at one instant,
the round-robin router's pointer (the engine after the one last chosen,
reroutes included) and a multi-bin engine's reroute order (bin by bin).  A
batch's service time follows ``DecodeModel`` and ``decode_tbt`` operation
for operation (its prefill tokens summed in queue order), so that times are
equal bit for bit.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

COMPLETION, ENGINE_EVENT = 0, 1
ROUTERS = ("round_robin", "least_used", "autellix")


@dataclass
class Reroute:
    """A queued request routed again at an engine's removal."""

    time: float
    request: int
    old_engine: int
    new_engine: int
    old_hit: bool
    new_hit: bool
    #: its program's last call had been routed before (that call itself excluded)
    after_last_call: bool


@dataclass
class ReferenceRun:
    """Per request: the engine that served it (-1: never served), its batch's
    start and completion (s, NaN: never served), its prefill tokens and KV
    hit verdict (those of its last routing); and the routing counters."""

    engine: np.ndarray
    start: np.ndarray
    completion: np.ndarray
    prefill: np.ndarray
    hit: np.ndarray
    routes: int = 0                # routing decisions at arrival
    large: int = 0                 # of them, prompts above the threshold
    followups: int = 0             # calls with a context before them
    kv_recomputed: float = 0.0     # context tokens prefilled again (summed in event order)
    rerouted: int = 0              # requests routed again at a removal
    sum_active_max: float = 0.0    # over routing decisions: the most active requests of a registered engine
    sum_active_mean: float = 0.0   # ... and their mean over the registered engines
    reroutes: list = field(default_factory=list)
    #: instants at which a free server takes waiting requests while the instant's last
    #: arrival found its own engine without a free server and the next arrival comes before
    #: the next completion and engine event (a kernel that keeps taking arrivals until the
    #: arriving request's engine has a free server runs past such an instant)
    held_instants: list = field(default_factory=list)

    @property
    def kv_hits(self) -> int:
        return int(self.hit.sum())

    def metrics(self) -> dict:
        """The routing metrics as ``SimulationResult`` defines them."""
        nan = math.nan
        return {"large_share": self.large / self.routes if self.routes else nan,
                "locality_hit_rate": self.kv_hits / self.followups if self.followups else nan,
                "kv_recomputed_tokens": self.kv_recomputed / self.routes if self.routes else nan,
                "load_imbalance": self.sum_active_max / self.sum_active_mean if self.sum_active_mean > 0 else nan,
                "rerouted": self.rerouted}


def reference_cluster(arrival, prompt, output, *, engines, servers, batch_size, router, threshold=2048,
                      program=None, new_tokens=None, kv_reuse=False, events=(), beta=None, gamma=None,
                      prefill_per_token=None, iteration=None,
                      edges=None, pred=None, forget_context_at_last_call=False, verdict_at_first_routing=False,
                      formed_at_last_arrival=False):
    """Simulate the cluster on the given requests (in arrival order).

    Parameters
    ----------
    arrival, prompt, output : array_like
        Arrival times (s, non-decreasing), prompt (the call's whole prompt,
        its context included) and output lengths (tokens).
    engines, servers, batch_size : int
        Engines, servers per engine, and B.
    router : {"round_robin", "least_used", "autellix"}
    threshold : int
        Autellix's largest small request, prompt tokens.
    program, new_tokens : array_like, optional
        Each call's program and new tokens; None: every request a one-call
        program of its own.  A program's last call is its last request.
    kv_reuse : bool
    events : sequence of mb.EngineEvent
    beta, gamma, prefill_per_token : float
        The ``DecodeModel``.
    edges, pred : array_like, optional
        Multi-bin engines: the K + 1 bin edges (output tokens; bin i holds
        ``edges[i] <= pred < edges[i+1]``, a prediction below ``edges[0]``
        bin 0, the last bin closed above) and each request's predicted
        output.  None: static batching.
    forget_context_at_last_call, verdict_at_first_routing, formed_at_last_arrival : bool
        Variants of three rules, off by default (the documented rules), to
        name which departure a disagreement comes from: the context holder
        is cleared with the program-table entry at a program's last call; a
        rerouted call keeps the hit verdict of its first routing; a
        multi-bin engine's free server takes, of each bin's first full
        batch, the one whose last member arrived first (ties to the lower
        request index), rather than the batch that filled first.
    """
    arrival = np.asarray(arrival, float)
    prompt = np.asarray(prompt, float)
    output = np.asarray(output, float)
    n = arrival.size
    E, c, B = int(engines), int(servers), int(batch_size)
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}; got {router!r}")
    # without programs every request is a one-call program of its own: all new tokens
    has_programs = program is not None
    pid = np.asarray(program, np.int64) if has_programs else np.arange(n)
    new = np.asarray(new_tokens, float) if has_programs else prompt.copy()
    kv = bool(kv_reuse) and has_programs
    last_call = {}
    for i in range(n):
        last_call[int(pid[i])] = i
    multibin = edges is not None
    if multibin:
        inner = [float(x) for x in np.asarray(edges, float)[1:-1]]
        pred = np.asarray(pred, float)
        K = len(inner) + 1

    run = ReferenceRun(engine=np.full(n, -1, np.int64), start=np.full(n, np.nan), completion=np.full(n, np.nan),
                       prefill=np.full(n, np.nan), hit=np.zeros(n, bool))

    # the router's state (LoadBalancer: engines registered, active requests, program table)
    registered = [True] * E
    active = [0] * E
    epoch = [0] * E                 # registrations of each engine: a removal starts a new one
    routed_epoch = np.zeros(n, np.int64)
    table = {}                      # program -> engine (Autellix's program table)
    holder = {}                     # program -> engine holding its context
    last_routed = set()             # programs whose last call was routed
    rr_next = 0
    # the engines' queues: a FIFO each (static), or per bin a FIFO of waiting requests and per
    # engine a FIFO of formed batches (multi-bin)
    fifo = [deque() for _ in range(E)]
    bins = [[[] for _ in range(K)] for _ in range(E)] if multibin else None
    formed = [deque() for _ in range(E)]
    # the servers
    busy = [None] * (E * c)         # the members of the batch each serves

    # completions and engine events in a heap, by (time, kind, server or event number); the
    # arrivals, in request order, at a pointer
    heap = [(float(ev.time), ENGINE_EVENT, j, ev) for j, ev in enumerate(sorted(events, key=lambda ev: ev.time))]
    heapq.heapify(heap)
    nxt = 0

    def least_used():
        return min((e for e in range(E) if registered[e]), key=lambda e: (active[e], e))

    def route(i):
        nonlocal rr_next
        if router == "round_robin":
            e = rr_next
            while not registered[e]:
                e = (e + 1) % E
            rr_next = (e + 1) % E
        elif router == "least_used" or prompt[i] <= threshold:
            e = least_used()
        else:
            p = int(pid[i])
            e = table.get(p)
            if e is None:
                e = table[p] = least_used()
        active[e] += 1
        routed_epoch[i] = epoch[e]
        return e

    def verdict(i, e):
        """The call's prefill tokens and hit on engine e; e then holds its context."""
        p = int(pid[i])
        followup = new[i] < prompt[i]
        hit = kv and followup and holder.get(p) == e
        holder[p] = e
        return (new[i] if hit else prompt[i]), bool(hit)

    def after_routing(i):
        p = int(pid[i])
        if last_call[p] == i:
            table.pop(p, None)
            if forget_context_at_last_call:
                holder.pop(p, None)
            last_routed.add(p)

    def enqueue(i, e):
        if not multibin:
            fifo[e].append(i)
            return
        b = 0
        while b < K - 1 and pred[i] >= inner[b]:
            b += 1
        bins[e][b].append(i)
        if len(bins[e][b]) == B:
            formed[e].append((b, bins[e][b]))
            bins[e][b] = []

    def queued_in_order(e):
        """Engine e's waiting requests in queue order (multi-bin: bin by bin)."""
        if not multibin:
            out = list(fifo[e])
            fifo[e].clear()
            return out
        out = []
        for b in range(K):
            out += [i for (bb, members) in formed[e] if bb == b for i in members]
            out += bins[e][b]
            bins[e][b] = []
        formed[e].clear()
        return out

    def take_batch(e):
        if not multibin:
            q = fifo[e]
            return [q.popleft() for _ in range(min(B, len(q)))]
        if not formed[e]:
            return []
        x = 0
        if formed_at_last_arrival:
            first = {}
            for y, (b, members) in enumerate(formed[e]):
                first.setdefault(b, y)
            x = min(first.values(), key=lambda y: (arrival[formed[e][y][1][-1]], formed[e][y][1][-1]))
        members = formed[e][x][1]
        del formed[e][x]
        return list(members)

    def has_batch(e):
        return bool(formed[e]) if multibin else bool(fifo[e])

    def remove(e, now):
        registered[e] = False
        active[e] = 0
        epoch[e] += 1
        for d in (table, holder):
            for p in [p for p, x in d.items() if x == e]:
                del d[p]
        for i in queued_in_order(e):
            p = int(pid[i])
            after_last = p in last_routed and last_call[p] != i
            e2 = route(i)
            old_prefill, old_hit = run.prefill[i], bool(run.hit[i])
            prefill, hit = verdict(i, e2)
            run.prefill[i] = prefill
            if not verdict_at_first_routing:
                run.hit[i] = hit
            run.kv_recomputed += prefill - old_prefill
            after_routing(i)
            enqueue(i, e2)
            run.rerouted += 1
            run.reroutes.append(Reroute(now, i, e, e2, old_hit, hit, after_last))

    def arrive(i):
        run.routes += 1
        on = [e for e in range(E) if registered[e]]
        run.sum_active_max += max(active[e] for e in on)
        run.sum_active_mean += sum(active[e] for e in on) / len(on)
        if prompt[i] > threshold:
            run.large += 1
        e = route(i)
        prefill, hit = verdict(i, e)
        run.followups += bool(new[i] < prompt[i])
        run.kv_recomputed += prefill - new[i]
        after_routing(i)
        run.prefill[i] = prefill
        run.hit[i] = hit
        enqueue(i, e)
        return e

    def batch_time(members):
        b = float(len(members))
        sum_prefill = 0.0
        for j in members:
            sum_prefill += run.prefill[j]
        max_out = max(output[j] for j in members)
        if iteration is None:
            tbt = beta * (1.0 + gamma * (b - 1.0) / max(1.0, b))
            return prefill_per_token * sum_prefill + tbt * max_out
        # IterationModel, from its definition: the prefill iteration over the tokens prefilled, then
        # one decode iteration per step; a member's context is its whole prompt (reused or not) + j
        m = iteration
        dmax = max(max_out - 1.0, 0.0)
        if m.finished == "stay":
            sum_prompt = 0.0
            for j in members:
                sum_prompt += prompt[j]
            seq, ctx = b * dmax, sum_prompt * dmax + b * dmax * (dmax + 1.0) / 2.0
        else:
            seq = ctx = 0.0
            for j in members:
                d = max(output[j] - 1.0, 0.0)
                seq += d
                ctx += prompt[j] * d + d * (d + 1.0) / 2.0
        prefill = m.setup + m.step + m.prefill_per_token * sum_prefill
        return prefill + (m.step * dmax + m.per_sequence * seq + m.per_context_token * ctx)

    def serve(k, members, now):
        done = now + batch_time(members)
        for j in members:
            run.engine[j] = k // c
            run.start[j] = now
            run.completion[j] = done
        busy[k] = members
        heapq.heappush(heap, (done, COMPLETION, k, None))

    def free_with_work():
        return [k for k in range(E * c) if busy[k] is None and registered[k // c] and has_batch(k // c)]

    while heap or nxt < n:
        now = min(heap[0][0] if heap else math.inf, arrival[nxt] if nxt < n else math.inf)
        last_engine = -1
        while heap and heap[0][0] == now:
            _, kind, key, payload = heapq.heappop(heap)
            if kind == COMPLETION:
                members, busy[key] = busy[key], None
                e = key // c
                for j in members:
                    if routed_epoch[j] == epoch[e]:
                        active[e] -= 1
            elif payload.action == "remove":
                remove(payload.engine, now)
            else:
                registered[payload.engine] = True
        while nxt < n and arrival[nxt] == now:
            last_engine = arrive(nxt)
            nxt += 1
        waiting = free_with_work()
        if waiting and last_engine >= 0:
            e = last_engine
            own_free = any(busy[k] is None for k in range(e * c, (e + 1) * c))
            if not own_free and nxt < n and arrival[nxt] < (heap[0][0] if heap else math.inf):
                run.held_instants.append(now)
        for k in waiting:
            if busy[k] is None and has_batch(k // c):
                serve(k, take_batch(k // c), now)
    return run
