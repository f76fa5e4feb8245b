"""The ``simulate`` entry point: validate, derive the random streams, allocate,
run the kernel, wrap the result."""

from __future__ import annotations

import math

import numpy as np

from ._kernels import multibin as _k
from ._seeding import STREAM_ARRIVALS, STREAM_SERVICE, as_seed_sequence, entropy_str, stream
from ._validation import check_servers, resolve_n
from .arrivals import Poisson, Replay, Saturated
from .policies import DynamicBatching, MultiBin, StaticBatching
from .results import RequestTable, SimulationResult
from .service import as_service
from .token_simulation import simulate_tokens

__all__ = ["simulate", "BATCH_MEANS_GROUPS"]

#: Number of contiguous groups (by arrival index) for the batch-means
#: confidence interval of the mean latency.
BATCH_MEANS_GROUPS = 32


def simulate(policy, arrivals, service=None, n=None, servers=1, seed=None, keep_requests=False, *,
             workload=None, service_model=None, keep_batches=False):
    """Simulate a batching policy on one stream of requests.

    The model is Section 3 and Algorithm 1 of the multi-bin batching paper:
    requests arrive by ``arrivals``; each has an i.i.d. service time from
    ``service``; an oracle assigns it to the bin holding its true service time;
    each bin forms batches of exactly ``batch_size`` requests in arrival order;
    a batch is ready when its last request arrives and joins one central FIFO
    ordered by ready time ("first completed batch, first served"); ``servers``
    identical servers take batches from that FIFO; a batch occupies a server
    for the maximum of its members' service times.

    Requests still waiting in a partial batch when the arrivals end never
    complete: they are counted in ``excluded_partial`` and excluded from every
    latency and throughput metric (there are fewer than ``bins x batch_size``
    of them).

    Parameters
    ----------
    policy : MultiBin
        The batching policy.
    arrivals : Poisson, Saturated or Replay
        The arrival process (rate in requests/s for Poisson).
    service : scipy.stats frozen distribution or array_like
        Service time of one request, in s.  Distributions drawn inside the
        kernel: uniform, expon, lognorm, gamma, weibull_min.  An array replays
        the given service times in order.
    n : int, optional
        Number of requests, >= 1.  Defaults to the length of the replayed
        arrivals or service times when one is given; required otherwise.
    servers : int or math.inf
        Number of identical servers, >= 1; ``math.inf`` serves every batch the
        moment it is ready (Assumption 5.1).
    seed : None, int or numpy.random.SeedSequence
        Seeds the arrival and service streams through SeedSequence.  The same
        seed gives bit-identical results, and every policy sees the same
        arrivals and service times for one seed (common random numbers).
        None draws fresh entropy, recorded in the result.
    keep_requests : bool
        Also return per-request arrays (``res.requests``); memory O(n).
        Without it the kernel streams in O(bins x batch_size) memory.

    workload : Workload
        Token-level requests, for StaticBatching, DynamicBatching and
        MultiBinDynamic (which take ``workload`` instead of ``service``).
    service_model : MaxModel, LinearModel or DecodeModel
        Batch service model of the token-level policies (default DecodeModel).
    keep_batches : bool
        Token-level policies: also return per-batch arrays (``res.batches``).

    Returns
    -------
    SimulationResult, or TokenSimulationResult for the token-level policies
    """
    if isinstance(policy, (StaticBatching, DynamicBatching)):
        if service is not None:
            raise TypeError(f"{type(policy).__name__} takes workload=Workload(...), not service")
        return simulate_tokens(policy, arrivals, workload, service_model, n=n, servers=servers,
                               seed=seed, keep_requests=keep_requests, keep_batches=keep_batches)
    if not isinstance(policy, MultiBin):
        raise TypeError("policy must be MultiBin, StaticBatching, DynamicBatching or MultiBinDynamic; "
                        f"got {type(policy).__name__}")
    if workload is not None or service_model is not None or keep_batches:
        raise TypeError("MultiBin takes service=..., not workload, service_model or keep_batches")
    if service is None:
        raise TypeError("service must be given: a scipy.stats frozen distribution or an array")
    if not isinstance(arrivals, (Poisson, Saturated, Replay)):
        raise TypeError(f"arrivals must be Poisson, Saturated or Replay; got {type(arrivals).__name__}")
    if not isinstance(keep_requests, (bool, np.bool_)):
        raise TypeError(f"keep_requests must be a bool; got {keep_requests!r}")
    spec = as_service(service)
    replay_lengths = []
    if isinstance(arrivals, Replay):
        replay_lengths.append(("arrivals.times", arrivals.times.size))
    if spec.kind == _k.SVC_REPLAY:
        replay_lengths.append(("service", spec.values.size))
    n = resolve_n(n, replay_lengths)
    servers = check_servers(servers)
    ss = as_seed_sequence(seed)

    k, B = policy.bins, policy.batch_size
    if policy.edges is None:
        edges = spec.equal_mass_edges(k)
    else:
        edges = np.array(policy.edges, dtype=np.float64)
        lo, hi = spec.support
        if edges[0] > lo or edges[-1] < hi:
            raise ValueError(
                f"edges must cover the support of service [{lo:g}, {hi:g}]: "
                f"edges[0] <= {lo:g} and edges[-1] >= {hi:g}; got [{edges[0]:g}, {edges[-1]:g}]")

    if isinstance(arrivals, Poisson):
        akind, rate, times = _k.ARR_POISSON, arrivals.rate, np.empty(0)
    elif isinstance(arrivals, Saturated):
        akind, rate, times = _k.ARR_SATURATED, 0.0, np.empty(0)
    else:
        akind, rate, times = _k.ARR_REPLAY, 0.0, arrivals.times
    n_servers = 0 if servers == math.inf else int(servers)

    m = n if keep_requests else 0
    out_arrival = np.empty(m, np.float64)
    out_service = np.empty(m, np.float64)
    out_bin = np.empty(m, np.int64)
    out_completion = np.full(m, np.nan)
    out_batch = np.full(m, -1, np.int64)
    stats = np.zeros(_k.N_FLOAT_STATS)
    istats = np.zeros(_k.N_INT_STATS, np.int64)
    batches_per_bin = np.zeros(k, np.int64)
    G = BATCH_MEANS_GROUPS
    group_latency = np.zeros(G)
    group_count = np.zeros(G, np.int64)
    group_batch_wait = np.zeros(G)
    group_batches = np.zeros(G, np.int64)
    hist = np.zeros(_k.HIST_SIZE, np.int64)

    _k.multibin_kernel(
        n, akind, rate, times, spec.kind, spec.params, spec.values, edges, B, n_servers,
        policy.max_wait,
        stream(ss, STREAM_ARRIVALS), stream(ss, STREAM_SERVICE), bool(keep_requests),
        out_arrival, out_service, out_bin, out_completion, out_batch,
        stats, istats, batches_per_bin, group_latency, group_count, group_batch_wait,
        group_batches, hist,
    )

    requests = None
    if keep_requests:
        requests = RequestTable(arrival=out_arrival, service=out_service, bin=out_bin,
                                completion=out_completion, batch=out_batch)
    config = {**policy.describe(), **arrivals.describe(), **spec.description,
              "n": n, "servers": "inf" if servers == math.inf else int(servers),
              "seed_entropy": entropy_str(ss)}
    return SimulationResult.from_kernel(
        config=config, n=n, servers=servers, edges=edges, stats=stats, istats=istats,
        batches_per_bin=batches_per_bin, group_latency=group_latency, group_count=group_count,
        group_batch_wait=group_batch_wait, group_batches=group_batches, hist=hist,
        requests=requests)
