"""The multi-bin model written idiomatically in SimPy, for the benchmark only.

Same model as mbbatch's kernel: Poisson arrivals, oracle binning by service
time, per-bin batches of exactly B, one FIFO of ready batches in front of the
servers, batch service = max of the members' service times.  Inputs are
pre-drawn with numpy, which only flatters SimPy.
"""

from __future__ import annotations

import numpy as np
import simpy


def run_simpy(arrival, service, edges, batch_size, servers=1):
    """Return (completed, mean latency) of the SimPy model on the given draws."""
    env = simpy.Environment()
    pool = simpy.Resource(env, capacity=servers)
    k = len(edges) - 1
    bins = [[] for _ in range(k)]
    latencies = []

    def serve(batch):
        with pool.request() as slot:  # FIFO: batches queue in ready order
            yield slot
            yield env.timeout(max(s for _, s in batch))
            for a, _ in batch:
                latencies.append(env.now - a)

    def source():
        for a, s in zip(arrival, service):
            yield env.timeout(a - env.now)
            b = min(int(np.searchsorted(edges, s, side="right")) - 1, k - 1)
            bins[b].append((a, s))
            if len(bins[b]) == batch_size:
                env.process(serve(bins[b]))
                bins[b] = []

    env.process(source())
    env.run()
    return len(latencies), float(np.mean(latencies))
