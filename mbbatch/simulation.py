"""The ``simulate`` entry point, for every policy: check the call, derive the
random streams, run the policy's kernel, wrap the one result type.

The request model: requests arrive by an arrival process; each has a prompt
and an output length and a predicted output length (a :class:`Workload`);
a policy forms batches; a batch service model times them.  The multi-bin
paper's model is the case ``service=dist``: output lengths drawn from
``dist`` under the max-of-members model ``MaxModel(base=0, per_token=1)``,
so a request's service time is its length; it runs on the multi-bin kernel.
The batch-forming policies (static, dynamic, multi-bin dynamic) run on the
event kernel.

Each policy names its planner (:mod:`mbbatch.planners`); this module checks
what every call shares and hands the call to it.
"""

from __future__ import annotations

import numpy as np

from ._running import kept_heap, small_pages
from ._seeding import as_seed_sequence
from ._validation import check_flag
from .planners import PLANNERS
from .planners.common import BATCH_MEANS_GROUPS, SCALE_RANGE, TIME_SERIES_ROWS
from .registry import kind_of
from .results import SimulationResult
from .workload import Mixture, Workload

__all__ = ["simulate", "check_simulation", "plan", "run_plan", "BATCH_MEANS_GROUPS", "TIME_SERIES_ROWS", "SCALE_RANGE"]


def simulate(policy, arrivals, service=None, n=None, servers=1, seed=None, keep_requests=False, *,
             workload=None, service_model=None, keep_batches=False, progress=False) -> SimulationResult:
    """Simulate a batching policy on one stream of requests.

    Requests arrive by ``arrivals``.  Their lengths come from ``workload``
    (prompt, output and predicted output lengths, tokens), or, as shorthand
    for the multi-bin paper's model, from ``service``: output lengths whose
    value is the service time, under ``MaxModel(base=0, per_token=1)``.  The
    policy forms batches, and ``service_model`` gives a batch's service time.

    - :class:`MultiBin` is Section 3 and Algorithm 1 of the multi-bin paper:
      an oracle assigns each request to the bin holding its true service time
      (``base + per_token * output length`` under :class:`MaxModel`); each
      bin forms batches of exactly ``batch_size`` requests in arrival order
      (or fewer after ``max_wait``); a batch is ready when its last request
      arrives and joins one central FIFO ordered by ready time; ``servers``
      identical servers take batches from that FIFO; a batch occupies a
      server for the maximum of its members' service times.  Requests still
      waiting in a partial batch when the arrivals end never complete: they
      are counted in ``excluded_partial`` and excluded from every metric.
      MultiBin takes ``service=`` or ``workload=`` with a :class:`MaxModel`.
    - :class:`StaticBatching`, :class:`DynamicBatching`,
      :class:`MultiBinDynamic` and :class:`ShortestPredictedFirst` form a
      batch whenever a server is free and requests wait (the
      dynamic-batching paper's Algorithms 1-7; shortest predicted output
      first); they take ``workload=`` and any service model (default
      :class:`DecodeModel`).
    - :class:`ContinuousBatching` batches at every iteration (vLLM's,
      SGLang's engine: paged KV memory, chunked prefill, preemption); it
      takes ``workload=`` with whole-token lengths and an
      :class:`IterationModel` (default; or a profile); ``servers`` are
      independent engines taking the requests in turn.
    - :class:`Cluster` runs one of the run-to-completion policies (or
      MultiBin) on engines behind a router, and :class:`LAPS` prefill
      instances behind theirs (its decode stage any of them, or
      ContinuousBatching).

    Every argument is checked before anything runs, and a run whose memory
    cannot fit is refused, saying how much it would need.  Ctrl-C stops a
    long run within about a second (``KeyboardInterrupt``).  A run whose
    backlog grows through it has no steady state: ``res.unstable`` is then
    True, ``res.unstable_reason`` says why, and an :class:`UnstableWarning`
    is issued.

    Parameters
    ----------
    policy : a policy of :data:`mbbatch.registry.POLICIES`
        The batching policy: MultiBin, StaticBatching, DynamicBatching,
        MultiBinDynamic, ShortestPredictedFirst, ContinuousBatching, Cluster
        or LAPS.
    arrivals : Poisson, Gamma, OnOff, PiecewisePoisson, Saturated or Replay
        The arrival process (rates in requests/s), for every policy; see
        :mod:`mbbatch.arrivals`.  A Replay of fewer times than ``n`` is
        repeated end to end, with a :class:`TraceTiledWarning`.
    service : scipy.stats frozen distribution or array_like, optional
        MultiBin: the paper's model, shorthand for output lengths drawn from
        ``service`` that are service times (``MaxModel(base=0,
        per_token=1)``, lengths not rounded): each request's service time, s.  Distributions drawn
        inside the kernel: uniform, expon, lognorm, gamma, weibull_min; an
        array replays the given values in order.
    n : int, optional
        Number of requests, in [1, 2**53].  Defaults to the length of the
        replayed arrays when one is given (replayed arrays must then have the
        same length), else to the parameter table's 10,000.
    servers : int or math.inf
        Number of identical servers, >= 1; ``math.inf`` (MultiBin only)
        serves every batch the moment it is ready (Assumption 5.1).
    seed : None, int or numpy.random.SeedSequence
        Seeds the arrival, length and predictor streams through
        SeedSequence.  The same seed gives bit-identical results, and every
        policy sees the same arrivals and output lengths for one seed
        (common random numbers).  None draws fresh entropy, recorded in the
        result's ``config``.
    keep_requests : bool
        Also return per-request records (``res.requests``); memory O(n).
        Without it the kernels stream in memory independent of n.
    workload : Workload, optional
        The requests' lengths; give it or ``service``, not both.
    service_model : MaxModel, LinearModel, DecodeModel, CalibratedModel or IterationModel, optional
        The batch service model (with ``workload``).  Default
        :class:`DecodeModel` for the token-level policies (a measured
        accelerator: :func:`mbbatch.profiles.get`); MultiBin takes MaxModel
        only (the max of its members' service times); LAPS a PrefillModel,
        or an IterationModel's prefill iteration.
    keep_batches : bool
        Token-level policies: also return per-batch records
        (``res.batches``).
    progress : bool
        Show a progress bar of the requests arrived on stderr, once the run
        has taken a second (tqdm; shorter runs show nothing).

    Returns
    -------
    SimulationResult
        The one result type: the metrics of :data:`mbbatch.metrics.METRICS`
        that apply to the policy, as attributes.
    """
    progress = check_flag("progress", progress)
    plan = _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches)
    return run_plan(plan, as_seed_sequence(seed), progress=progress)


def run_plan(plan, ss: np.random.SeedSequence, **kw) -> SimulationResult:
    """``plan.run(ss, **kw)`` (a checked plan, :func:`plan`), its arrays on
    small pages (:func:`mbbatch._running.small_pages`), its large ones from
    glibc's heap (:func:`mbbatch._running.kept_heap`): every run of
    ``simulate``, a sweep's cells and a capacity search goes through here."""
    with small_pages(), kept_heap():
        return plan.run(ss, **kw)


def check_simulation(policy, arrivals, service=None, n=None, servers=1, keep_requests=False, *,
                     workload=None, service_model=None, keep_batches=False, progress=False) -> int:
    """Check a :func:`simulate` call without running it: raise the error the
    call would raise before simulating (bad arguments, memory that cannot
    fit); return the bytes of memory it would allocate."""
    check_flag("progress", progress)
    return _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model,
                 keep_batches).memory


def plan(policy, arrivals, service=None, n=None, servers=1, keep_requests=False, *, workload=None,
         service_model=None, keep_batches=False):
    """A checked :func:`simulate` call, to run for many seeds:
    ``plan(...).run(seed_sequence)`` equals ``simulate(..., seed=seed_sequence)``
    without checking the arguments again (a sweep's replications)."""
    return _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches)


# --- checking a call -------------------------------------------------------------------------


def _plan(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches):
    cls = kind_of(policy)
    for name, flag in (("keep_requests", keep_requests), ("keep_batches", keep_batches)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {flag!r}")
    if service is not None:
        if workload is not None or service_model is not None:
            raise TypeError("give service=... (the paper's model) or workload=... with service_model=..., "
                            "not both")
    elif workload is None:
        raise TypeError("service or workload must be given: service=<scipy.stats frozen distribution or "
                        "array> (service times), or workload=Workload(prompt=..., output=...)")
    elif isinstance(workload, Mixture):
        engine = policy.request_engine()
        if not kind_of(engine).classes:
            raise TypeError(f"workload: a Workload.mixture's requests run on ContinuousBatching engines (alone or "
                            f"as a Cluster's); got {type(policy).__name__}")
        if any(part.system_prompts is not None for part in workload.parts):
            raise ValueError("system_prompts: a Workload.mixture's classes take no system prompts (yet); give them "
                             "to a Workload")
    elif not isinstance(workload, Workload):
        raise TypeError(f"workload must be a Workload (or a Workload.mixture); got {type(workload).__name__}")
    elif workload.system_prompts is not None and not kind_of(policy.request_engine()).prefixes:
        engine = policy.request_engine()
        raise ValueError(f"workload.system_prompts: requests sharing prompt prefixes run on ContinuousBatching "
                         f"engines (alone, as a Cluster's or as a Disaggregated deployment's; prefix_caching keeps "
                         f"them); got {type(policy).__name__}" + (f" of {type(engine).__name__} engines"
                                                                  if engine is not policy else ""))
    return PLANNERS[cls.planner].check(policy, arrivals, service, n, servers, keep_requests, workload,
                                       service_model, keep_batches)
