"""A plain-Python discrete-event simulation of shortest-predicted-first
batching on ``servers`` identical servers, written from its definition (the
docstring of ``mb.ShortestPredictedFirst``), to check the kernel request by
request.

At each instant every completion and every arrival is in before batches
form; then each free server, lowest index first, takes a batch of the
waiting requests: those that have waited ``max_wait`` s or more, oldest
first, then the smallest predicted output lengths (ties by arrival), up to
``batch_size``.  A batch takes the service model's time on its members'
lengths; its requests complete together.
"""

from __future__ import annotations

import math

import numpy as np


def reference_spf(arrival, prompt, output, pred, batch_size, servers, model, max_wait=math.inf):
    """Per-request batch start and completion times (arrays)."""
    n = len(arrival)
    start = np.full(n, np.nan)
    completion = np.full(n, np.nan)
    waiting = []                        # request indices, in arrival order
    free_at = [math.inf] * servers      # a busy server's completion time (inf: free)
    busy = [False] * servers
    i = 0
    while i < n or any(busy):
        t_done = min((free_at[s] for s in range(servers) if busy[s]), default=math.inf)
        t_arr = arrival[i] if i < n else math.inf
        now = min(t_done, t_arr)
        for s in range(servers):
            if busy[s] and free_at[s] == now:
                busy[s] = False
        while i < n and arrival[i] == now:
            waiting.append(i)
            i += 1
        for s in range(servers):
            if busy[s] or not waiting:
                continue
            old = [r for r in waiting if now - arrival[r] >= max_wait][:batch_size]
            rest = sorted((r for r in waiting if r not in set(old)), key=lambda r: (pred[r], r))
            members = old + rest[:batch_size - len(old)]
            chosen = set(members)
            waiting = [r for r in waiting if r not in chosen]
            times = model.batch_times([prompt[r] for r in members], [output[r] for r in members])
            done = now + float(times.service[0])
            for r in members:
                start[r] = now
                completion[r] = done
            busy[s] = True
            free_at[s] = done
    return start, completion
