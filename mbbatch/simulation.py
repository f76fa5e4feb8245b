"""The ``simulate`` entry point: validate, derive the random streams, allocate,
run the kernel, wrap the result."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ._kernels import multibin as _k
from ._running import check_clock, check_memory, interruptible, stop_flag
from ._seeding import STREAM_ARRIVALS, STREAM_SERVICE, as_seed_sequence, entropy_str, stream
from ._validation import check_servers, resolve_n
from .arrivals import Poisson, Replay, Saturated
from .policies import DynamicBatching, MultiBin, StaticBatching
from .results import RequestTable, SimulationResult, UnstableWarning
from .service import as_service
from .token_simulation import plan_tokens, simulate_tokens

__all__ = ["simulate", "check_simulation", "BATCH_MEANS_GROUPS"]

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

    Every argument is checked before anything runs, and a run whose memory
    cannot fit is refused, saying how much it would need.  Ctrl-C stops a
    long run within about a second (``KeyboardInterrupt``).  A run whose
    backlog grows through it has no steady state: ``res.unstable`` is then
    True, ``res.unstable_reason`` says why, and an :class:`UnstableWarning`
    is issued.

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
        Number of requests, in [1, 2**53].  Defaults to the length of the
        replayed arrivals or service times when one is given (replayed arrays
        must then have the same length); required otherwise.
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
    plan = _plan_multibin(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                          keep_batches)
    ss = as_seed_sequence(seed)
    return _run_multibin(plan, ss)


def check_simulation(policy, arrivals, service=None, n=None, servers=1, keep_requests=False, *,
                     workload=None, service_model=None, keep_batches=False) -> int:
    """Check a :func:`simulate` call without running it: raise the error the
    call would raise before simulating (bad arguments, memory that cannot
    fit); return the bytes of memory it would allocate."""
    if isinstance(policy, (StaticBatching, DynamicBatching)):
        if service is not None:
            raise TypeError(f"{type(policy).__name__} takes workload=Workload(...), not service")
        return plan_tokens(policy, arrivals, workload, service_model, n, servers, keep_requests,
                           keep_batches).memory
    return _plan_multibin(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                          keep_batches).memory


@dataclass(frozen=True, eq=False)
class _Plan:
    """A validated multi-bin run, ready to allocate and simulate."""

    policy: MultiBin
    arrivals: object
    spec: object
    edges: np.ndarray
    n: int
    servers: float
    keep: bool
    memory: int


def _plan_multibin(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                   keep_batches) -> _Plan:
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
    k, B = policy.bins, policy.batch_size
    S = min(B, n)
    parts = {
        "bins": (16 * k * S + 40 * k + 8 * (k + 1), "the bins' partial batches"),
        "servers": (0 if servers == math.inf else 8 * min(servers, n), "the servers' free times"),
        "batch_size": (16 * S, "one batch's latencies"),
        "n": (8 * _k.HIST_SIZE, "the latency histogram"),
    }
    if keep_requests:
        parts["keep_requests"] = (40 * n, "the per-request arrays (keep_requests)")
    memory = check_memory(parts)
    scale = spec.mean
    if isinstance(arrivals, Replay):
        check_clock(float(np.max(np.abs(arrivals.times[:n]))), scale, "arrivals.times")
    elif isinstance(arrivals, Poisson):
        check_clock(n / arrivals.rate, scale, f"rate = {arrivals.rate:g} requests/s and n = {n} arrivals")

    if policy.edges is None:
        edges = spec.equal_mass_edges(k)
    else:
        edges = np.array(policy.edges, dtype=np.float64)
        lo, hi = spec.support
        if edges[0] > lo or edges[-1] < hi:
            raise ValueError(
                f"edges must cover the support of service [{lo:g}, {hi:g}]: "
                f"edges[0] <= {lo:g} and edges[-1] >= {hi:g}; got [{edges[0]:g}, {edges[-1]:g}]")
    return _Plan(policy, arrivals, spec, edges, n, servers, bool(keep_requests), memory)


def _pack_multibin(plan: _Plan, ss: np.random.SeedSequence) -> tuple:
    """The multi-bin kernel's arguments for ``plan``: ``(config, inputs, streams)``."""
    arrivals, spec, n, servers = plan.arrivals, plan.spec, plan.n, plan.servers
    if isinstance(arrivals, Poisson):
        akind, rate, times = _k.ARR_POISSON, arrivals.rate, np.empty(0)
    elif isinstance(arrivals, Saturated):
        akind, rate, times = _k.ARR_SATURATED, 0.0, np.empty(0)
    else:
        akind, rate, times = _k.ARR_REPLAY, 0.0, arrivals.times
    config = _k.CONFIG.pack(
        n=n, arrival_kind=akind, rate=rate, service_kind=spec.kind, batch_size=plan.policy.batch_size,
        # more servers than requests are never all busy: the kernel needs at most n (0: infinitely many)
        servers=0 if servers == math.inf else int(min(servers, n)), max_wait=plan.policy.max_wait,
        keep=plan.keep, integer=0, base=0.0, per_token=1.0)   # service times as drawn
    inputs = _k.INPUTS.pack(arrival_times=times, service_params=spec.params, service_values=spec.values,
                            edges=plan.edges)
    return config, inputs, _k.MultiBinStreams(stream(ss, STREAM_ARRIVALS), stream(ss, STREAM_SERVICE))


def _run_multibin(plan: _Plan, ss: np.random.SeedSequence) -> SimulationResult:
    policy, arrivals, spec, edges, n, servers = (plan.policy, plan.arrivals, plan.spec, plan.edges,
                                                 plan.n, plan.servers)
    args = _pack_multibin(plan, ss)
    stop = stop_flag()
    out, req = interruptible(lambda: _k.run(*args, stop, groups=BATCH_MEANS_GROUPS), stop)

    requests = None if req is None else RequestTable(**req)
    config = {**policy.describe(), **arrivals.describe(), **spec.description,
              "n": n, "servers": "inf" if servers == math.inf else int(servers),
              "seed_entropy": entropy_str(ss)}
    res = SimulationResult.from_kernel(
        config=config, n=n, servers=servers, edges=edges, stats=out.floats, istats=out.ints,
        batches_per_bin=out.batches_per_bin, group_latency=out.group_latency, group_count=out.group_count,
        group_batch_wait=out.group_batch_wait, group_batches=out.group_batches, hist=out.hist,
        requests=requests, assess_stability=not isinstance(arrivals, Saturated))
    if res.unstable:
        warnings.warn(f"no steady state: {res.unstable_reason}", UnstableWarning, stacklevel=3)
    return res
