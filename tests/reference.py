"""A plain-Python discrete-event simulation of the multi-bin model.

Written independently of the kernel, as an event loop over a heap of
arrival and completion events, to check the kernel request by request.
It takes the arrival and service times as given (the kernel's draws).
Below it, plain-Python weighted quantiles, against which the event kernel's
time-between-tokens histogram is checked.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

ARRIVAL, DEADLINE, COMPLETION = 0, 1, 2


def reference_latencies(arrival, service, edges, batch_size, servers, max_wait=math.inf):
    """Per-request latency (NaN for requests left in partial batches).

    Bin i holds edges[i] <= l < edges[i+1]; the last bin is closed above.
    With ``max_wait`` finite a bin's partial batch leaves once its oldest
    request has waited ``max_wait`` (a timer event per bin generation).
    """
    k = len(edges) - 1
    n = len(arrival)
    bins = [[] for _ in range(k)]
    generation = [0] * k
    fifo = deque()
    idle = servers
    completion = np.full(n, np.nan)
    events = []
    seq = 0
    for i in range(n):
        heapq.heappush(events, (arrival[i], ARRIVAL, seq, i))
        seq += 1

    def start_batches(now):
        nonlocal idle, seq
        while idle > 0 and fifo:
            members = fifo.popleft()
            idle -= 1
            S = max(service[j] for j in members)
            heapq.heappush(events, (now + S, COMPLETION, seq, members))
            seq += 1

    while events:
        now, kind, _, payload = heapq.heappop(events)
        if kind == ARRIVAL:
            i = payload
            b = 0
            while b < k - 1 and service[i] >= edges[b + 1]:
                b += 1
            bins[b].append(i)
            if len(bins[b]) == 1 and max_wait < math.inf:
                heapq.heappush(events, (now + max_wait, DEADLINE, seq, (b, generation[b])))
                seq += 1
            if len(bins[b]) == batch_size:
                fifo.append(bins[b])
                bins[b] = []
                generation[b] += 1
        elif kind == DEADLINE:
            b, gen = payload
            if gen == generation[b] and bins[b]:
                fifo.append(bins[b])
                bins[b] = []
                generation[b] += 1
        else:
            for j in payload:
                completion[j] = now
            idle += 1
        start_batches(now)
    return completion - np.asarray(arrival)


def reference_makespan(service, edges, batch_size):
    """Saturated, one server: the sum of the batches' service times."""
    lat = reference_latencies(np.zeros(len(service)), np.asarray(service, float), edges,
                              batch_size, servers=1)
    return float(np.nanmax(lat)) if np.any(~np.isnan(lat)) else math.nan


def weighted_quantiles(values, weights, qs):
    """The inverted-CDF quantiles ``qs`` of ``values`` weighted by
    ``weights`` (>= 0, fractional allowed): for each q the smallest value
    with a share q of the total weight at or below it; NaN for no weight.
    A loop over the values in order, as a hand computation would go (the
    kernels' time between tokens: each batch's decode time per token,
    weighted by its members' gaps)."""
    pairs = sorted((float(v), float(w)) for v, w in zip(values, weights) if w > 0)
    total = sum(w for _, w in pairs)
    out = []
    for q in qs:
        if not pairs:
            out.append(math.nan)
            continue
        c = 0.0
        for v, w in pairs:
            c += w
            if c >= q * total:
                break
        out.append(v)
    return np.array(out)


def token_gaps(output):
    """The gaps between two tokens of requests of ``output`` tokens each
    (fractional where lengths are not whole tokens): ``max(output - 1, 0)``."""
    return np.maximum(np.asarray(output, dtype=float) - 1.0, 0.0)
