"""mbbatch.warmup() (mbbatch._kernels.warmup): after it, in a fresh process
with the numba cache off, the public API compiles nothing more.  (A test of
its own module: its cold compile takes most of a minute, and the test files
are spread over the workers whole.)"""

import os
import subprocess
import sys

from .helpers import ROOT


def test_warmup_compiles_every_kernel():
    """After ``mb.warmup()`` in a fresh process, the public API adds no
    specialization to any kernel, whatever the policy, arrivals, service or
    lengths, model, servers and records: warmup() compiles every kernel and
    every drawer of every kind, and each kernel has one specialization
    (read-only replayed arrays and writable ones, drawn and replayed lengths,
    all of one type).  The session's own warmup has compiled everything in
    this process already, so only a fresh one can tell.  The child uses the
    disk cache (the session's warmup has filled it): a specialization counts
    whether compiled or loaded from the cache (numba's ``add_overload``), so
    the cache hides none."""
    out = subprocess.run([sys.executable, "-c", WARMUP_CHILD], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split()[-1] == "compiled:0", out.stdout
    cluster = out.stdout.split("cluster:")[1].split()[0].split(",")
    # a cluster's first run compiles its kernel and the helpers ordering its programs' calls (warmup does not)
    assert {"dynamic_kernel", "order_calls", "program_span"} <= set(cluster), cluster
    assert "draw_lengths" not in cluster, cluster


WARMUP_CHILD = """
import math
import numpy as np
import scipy.stats as st
from numba.core.dispatcher import Dispatcher
import mbbatch as mb

from mbbatch._kernels import common

mb.warmup()
compiled = []
drawers = set(common._COMPILED)
_add_overload = Dispatcher.add_overload
recording = [False]

def add_overload(self, cres):
    # every new specialization, compiled or loaded from the disk cache
    if recording[0]:
        compiled.append(self.py_func.__qualname__)
    return _add_overload(self, cres)

Dispatcher.add_overload = add_overload

class Recording:
    def __enter__(self):
        recording[0] = True

    def __exit__(self, *exc):
        recording[0] = False

trace = np.cumsum(np.random.default_rng(0).exponential(0.5, 300))
trace.flags.writeable = False
with Recording():
    for arrivals in (mb.Poisson(2.0), mb.Saturated(), mb.Replay(trace)):
        for service in (st.uniform(1, 3), st.expon(), st.lognorm(0.5), st.gamma(2.0), st.weibull_min(1.5),
                        np.linspace(1.0, 4.0, 300)):
            for servers in (1, 3, math.inf):
                mb.simulate(mb.MultiBin(bins=3, batch_size=4, max_wait=2.0 if servers == 3 else math.inf),
                            arrivals=arrivals, service=service, n=300, servers=servers, seed=1,
                            keep_requests=servers == 1)
    mb.simulate(mb.MultiBin(bins=20, batch_size=2), arrivals=mb.Poisson(2.0), service=st.uniform(1, 3), n=300)
    workloads = (mb.Workload(st.uniform(1, 100), st.expon(scale=50)),
                 mb.Workload(st.gamma(2.0, scale=30), st.lognorm(0.8, scale=40), integer_lengths=False,
                             predictor_sigma=0.5),
                 mb.Workload(np.arange(1.0, 301.0), np.arange(300.0, 0.0, -1.0)))
    policies = (mb.StaticBatching(8), mb.DynamicBatching(), mb.DynamicBatching(memory=mb.Memory(variant="clt")),
                mb.MultiBinDynamic(bins=3, warmup=20, selection="longest_queue", bin_b_max=(4, 8, 16)),
                mb.MultiBinDynamic(bins=1))
    models = (mb.DecodeModel(), mb.LinearModel(), mb.MaxModel(per_token=0.01))
    arrivals = (mb.Poisson(50.0), mb.Saturated(), mb.Replay(trace), mb.PiecewisePoisson((1.0, 50.0), (2.0,)))
    for j, policy in enumerate(policies):
        for a, arr in enumerate(arrivals):
            for m, model in enumerate(models):
                keep = (j + a + m) % 2 == 0
                mb.simulate(policy, arrivals=arr, workload=workloads[(j + a + m) % 3], service_model=model,
                            n=300, servers=1 + m, seed=2, keep_requests=keep, keep_batches=not keep)
    # a deep backlog: the queues grow
    mb.simulate(mb.MultiBinDynamic(bins=2, warmup=50), arrivals=mb.Saturated(), workload=workloads[0], n=5000)
# the drawers, compiled apart from the kernels (mbbatch records them)
compiled += ["drawer %s %d" % key for key in set(common._COMPILED) - drawers]
# open-loop programs on a cluster (whose event kernel, and the helpers ordering
# its programs' calls, compile on first use)
n_single = len(compiled)
with Recording():
    for arr in (mb.Poisson(50.0), mb.Saturated()):
        mb.simulate(mb.Cluster(engines=2, programs=mb.Programs(calls=3)), arrivals=arr, workload=workloads[0],
                    n=300, seed=3)
print("cluster:" + ",".join(sorted(set(compiled[n_single:]))))
print(*compiled[:n_single], "compiled:%d" % n_single)
"""
