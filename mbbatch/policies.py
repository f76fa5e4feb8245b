"""Batching policies: configuration only, validated at the boundary."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ._validation import check, check_fields, check_instance
from .params import PARAMS, default
from .predictors import Oracle, as_predictor

__all__ = ["MultiBin", "StaticBatching", "DynamicBatching", "MultiBinDynamic", "LAPS", "Cluster", "EngineEvent",
           "Programs", "Sessions"]


@dataclass(frozen=True, eq=False)
class MultiBin:
    """Multi-bin batching (Algorithm 1 of the multi-bin paper).

    Requests are assigned to a bin by their predicted service time (the
    true one by default: an oracle) and served for their true one; each bin
    forms batches of exactly ``batch_size`` in
    arrival order; a batch joins one central FIFO when its last request
    arrives; a batch's service time is the maximum of its members'.

    Parameters
    ----------
    bins : int
        Number of bins k, >= 1. ``bins=1`` is standard batching.
    batch_size : int
        Batch size B in requests, >= 1.
    edges : array_like of float, optional
        The k+1 bin edges in s, strictly increasing (with one bin the two
        may be equal: all service times equal), covering the support of
        the service distribution (first edge <= its lower end, last edge >= its
        upper end, ``inf`` allowed).  Bin i holds ``edges[i] <= l < edges[i+1]``
        and the last bin is closed above.  Default: equal probability mass of
        the service distribution (Lemma 4.1 for the uniform).
    max_wait : float
        A bin sends a partial batch to the central FIFO once its oldest
        request has waited ``max_wait`` s (the real-system variant of the
        paper's Section 3); partial batches due at the same time go in the
        order their oldest requests arrived.  Default ``inf``: batches of
        exactly B only.
    predictor : Oracle, LogNormalError, BinConfusion or Predictions, optional
        What a request is binned by (:mod:`mbbatch.predictors`).  Default:
        the oracle.
    """

    bins: int
    batch_size: int
    edges: Optional[np.ndarray] = None
    max_wait: float = default("max_wait")
    predictor: object = None

    def __post_init__(self):
        check_fields(self, {"bins": "bins", "batch_size": "batch_size", "max_wait": "max_wait"})
        object.__setattr__(self, "predictor", as_predictor(self.predictor))
        if self.edges is not None:
            # NaN refused here; -inf first and inf last allowed, checked below
            e = check("MultiBin.edges", self.edges, "edges")
            if e.size != self.bins + 1:
                raise ValueError(
                    f"edges must hold bins + 1 = {self.bins + 1} values; got {e.size}")
            # one bin may have equal edges (all service times equal): the
            # kernel puts every request in bin 0 when there is one bin
            if np.any(np.diff(e) < 0) or (self.bins > 1 and np.any(np.diff(e) == 0)):
                raise ValueError(f"edges must be strictly increasing; got {e.tolist()}")
            if np.isinf(e[1:-1]).any() or e[0] == np.inf or e[-1] == -np.inf:
                raise ValueError(f"edges must be finite except edges[0]=-inf or edges[-1]=inf; got {e.tolist()}")
            e.flags.writeable = False
            object.__setattr__(self, "edges", e)

    def describe(self) -> dict:
        d = {"policy": "multibin", "bins": self.bins, "batch_size": self.batch_size,
             "max_wait": "inf" if self.max_wait == float("inf") else self.max_wait}
        d["edges"] = "equal_mass" if self.edges is None else [float(x) for x in self.edges]
        if not isinstance(self.predictor, Oracle):
            d.update(self.predictor.describe())
        return d


@dataclass(frozen=True, eq=False)
class StaticBatching:
    """The baseline: one FIFO; whenever a server is free and requests wait, it
    takes up to ``batch_size`` of them, without waiting for a full batch.

    Parameters
    ----------
    batch_size : int
        B, requests, >= 1.
    sla : SLAController, optional
        Only its ``d_sla`` and ``eps_d`` are used, to measure SLA violations;
        default ``SLAController()``.
    memory : Memory, optional
        Only its token capacity is used, to count batches above it (static
        batching never enforces it); default ``Memory()``.
    """

    batch_size: int
    sla: object = None
    memory: object = None

    def __post_init__(self):
        from .controller import Memory, SLAController

        check_fields(self, {"batch_size": "batch_size"})
        object.__setattr__(self, "sla", check_instance("sla", self.sla, SLAController, SLAController))
        object.__setattr__(self, "memory", check_instance("memory", self.memory, Memory, Memory))

    def describe(self) -> dict:
        return {"policy": "static", "batch_size": self.batch_size, "d_sla": self.sla.d_sla,
                "eps_d": self.sla.eps_d, "eta": self.memory.eta}


@dataclass(frozen=True, eq=False)
class DynamicBatching:
    """Memory-aware, SLA-constrained dynamic batching from one FIFO
    (Algorithms 1-3, feedback by Algorithm 7).

    At each free server: ``b_target = min(b_mem, b_SLA)`` (Algorithm 3), the
    first ``b_target`` queued requests, then the last ones dropped while the
    batch's tokens exceed the capacity.

    Parameters
    ----------
    controller : SLAController
        D_SLA, bounds and the controller variant.
    memory : Memory
        Token capacity and the b_mem variant; ``Memory(enabled=False)`` turns
        the memory constraint off.
    max_candidates : int, optional
        Candidates looked at per decision; default ``controller.b_max``.
    pin : int, optional
        Pin ``b_target`` to this value (the controller still learns); for
        checks against fixed-B theory.
    """

    controller: object = None
    memory: object = None
    max_candidates: Optional[int] = None
    pin: Optional[int] = None

    def __post_init__(self):
        from .controller import Memory, SLAController

        c = check_instance("controller", self.controller, SLAController, SLAController)
        object.__setattr__(self, "controller", c)
        object.__setattr__(self, "memory", check_instance("memory", self.memory, Memory, Memory))
        check_fields(self, {"max_candidates": "max_candidates", "pin": "pin"})
        if self.pin is not None and self.pin > c.b_max:
            raise ValueError(f"pin must be at most controller.b_max = {c.b_max}; got {self.pin}")

    bins = 1

    def describe(self) -> dict:
        c, m = self.controller, self.memory
        return {"policy": "dynamic", "d_sla": c.d_sla, "eps_d": c.eps_d, "b_min": c.b_min,
                "b_max": c.b_max, "alpha": c.alpha, "delta": c.delta, "controller": c.variant,
                "memory": m.variant if m.enabled else "off", "eta": m.eta, "eps_m": m.eps_m,
                "max_candidates": self.max_candidates or c.b_max, "pin": self.pin or 0}


@dataclass(frozen=True, eq=False)
class MultiBinDynamic(DynamicBatching):
    """Multi-bin dynamic batching (Algorithm 5): K bins by predicted output
    length, each with its own statistics and SLA controller.

    Bin edges come from Algorithm 6 (equal mass, floors of the quantiles) on
    the predicted lengths of the first ``warmup`` requests, computed when the
    ``warmup``-th request arrives; until then every request waits in bin 0,
    and then the waiting ones are re-binned by their own predictions.  At each
    free server one bin is selected (round-robin or longest queue), up to
    ``max_candidates`` of its head are candidates, Algorithm 3 forms the batch
    with that bin's controller, and unused candidates stay at the bin's front.

    Parameters
    ----------
    bins : int
        K, >= 1.
    selection : {"round_robin", "longest_queue"}
        Which non-empty bin forms the next batch (Algorithm 5): the next in
        turn after the last one served, or the one holding the most requests
        (of equal queues, the lowest bin).  Default ``"round_robin"``.
    warmup : int
        Requests whose predictions set the edges, >= bins.  Default 1000.
    bin_b_max : sequence of int, optional
        Per-bin batch limits (Algorithm 1, step 5).
    predictor : Oracle, LogNormalError, BinConfusion or Predictions, optional
        The output-length predictor Algorithms 4 and 6 read
        (:mod:`mbbatch.predictors`); default the oracle, or the workload's
        ``predictor_sigma``.
    bin_edges : {"warmup", "presample", "optimal"}
        Where the edges come from: Algorithm 6 on the first ``warmup``
        requests' predictions, every request waiting in bin 0 until then
        (default); Algorithm 6 on ``warmup`` predicted lengths pre-sampled
        from the workload before the run (seed 001, section 7), binning from
        the first request; or :func:`mbbatch.theory.optimal_boundaries` on
        the output-length distribution at ``B = b_max`` (a distribution, not
        an array), floored as Algorithm 6 floors its quantiles.
    controller, memory, max_candidates, pin
        As for :class:`DynamicBatching`.
    """

    bins: int = default("MultiBinDynamic.bins")
    selection: str = default("selection")
    warmup: int = default("warmup")
    bin_b_max: Optional[tuple] = None
    predictor: object = None
    bin_edges: str = default("bin_edges")

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, {"bins": "bins", "selection": "selection", "bin_edges": "bin_edges"})
        object.__setattr__(self, "predictor", as_predictor(self.predictor))
        object.__setattr__(self, "warmup", check("warmup", self.warmup))
        if self.warmup < self.bins:
            raise ValueError(f"warmup must be at least bins = {self.bins}; got {self.warmup}")
        if self.bin_b_max is not None:
            lim = check("bin_b_max", self.bin_b_max)
            if lim.size != self.bins:
                raise ValueError(f"bin_b_max must have bins = {self.bins} entries; got {lim.size}")
            object.__setattr__(self, "bin_b_max", tuple(int(v) for v in lim))

    def describe(self) -> dict:
        d = super().describe()
        d.update(policy="multibin_dynamic", bins=self.bins, selection=self.selection, warmup=self.warmup)
        if self.bin_edges != "warmup":
            d["bin_edges"] = self.bin_edges
        if not isinstance(self.predictor, Oracle):
            d.update(self.predictor.describe())
        return d


@dataclass(frozen=True, eq=False)
class LAPS:
    """LAPS, length-aware prefill scheduling (seed 004), on ``instances``
    prefill instances behind its router.

    A request of at most ``threshold`` prompt tokens is short, a longer one
    long.  The router (``dynamic``) keeps a short and a long group of
    instances (the ``long_instances`` highest ids long at first) and sends a
    request to the instance of its group with the fewest outstanding
    requests, ties to the lowest id; on each routing decision, at most once
    per ``interval`` s, it moves one instance toward the group whose pending
    requests exceed ``ratio`` times the other's (each group keeps one).
    Without ``dynamic``, or with one instance, every instance serves both.

    Each instance runs one prefill batch at a time, of at most ``max_batch``
    requests and ``max_batch_tokens`` prompt tokens (its first request always
    joins).  With ``dual_queue``, short requests go first: a short batch
    starts once the oldest short request has waited ``window`` s or
    ``max_batch`` are queued (window 0: at once); meanwhile long requests
    run.  Without it, one FIFO queue.  The batch takes
    :class:`~mbbatch.PrefillModel` time; at its end its requests have their
    first token.

    Decode runs on separate instances: with ``decode`` (a token-level
    policy: :class:`StaticBatching`, :class:`DynamicBatching` or
    :class:`MultiBinDynamic`) each request joins it when its prefill ends,
    its output drawn from the workload's output lengths, and is served by
    one of ``decode_servers`` servers under ``decode_model`` (default
    ``DecodeModel(prefill_per_token=0)``: the KV cache arrives with the
    request, so decode prefills nothing again).  A request's latency is then
    end to end, arrival to last token (throughput and span too); the TTFT,
    utilization and batch metrics stay the prefill instances';
    ``res.decode`` is the decode stage's own result.  Without ``decode`` a
    request's latency is its time to first token.

    ``dual_queue=False, dynamic=False`` is one FIFO queue per instance;
    ``window=0`` the dual queue alone.  The parameter table gives the
    defaults: the specification's (256 tokens, 5 ms, 8 requests, 5 s, 2.0).
    """

    instances: int = default("LAPS.instances")
    threshold: int = default("LAPS.threshold")
    window: float = default("LAPS.window")
    max_batch: int = default("LAPS.max_batch")
    max_batch_tokens: float = default("LAPS.max_batch_tokens")
    dual_queue: bool = default("LAPS.dual_queue")
    dynamic: bool = default("LAPS.dynamic")
    interval: float = default("LAPS.interval")
    ratio: float = default("LAPS.ratio")
    long_instances: Optional[int] = None
    decode: object = None
    decode_servers: int = default("LAPS.decode_servers")
    decode_model: object = None

    def __post_init__(self):
        from ._validation import check_flag

        check_fields(self, {"instances": "LAPS.instances", "threshold": "LAPS.threshold", "window": "LAPS.window",
                            "max_batch": "LAPS.max_batch", "max_batch_tokens": "LAPS.max_batch_tokens",
                            "interval": "LAPS.interval", "ratio": "LAPS.ratio",
                            "long_instances": "LAPS.long_instances", "decode_servers": "LAPS.decode_servers"})
        if self.decode is not None and not isinstance(self.decode, (StaticBatching, DynamicBatching)):
            raise TypeError(f"decode must be StaticBatching, DynamicBatching or MultiBinDynamic (the decode "
                            f"instances' batching) or None; got {type(self.decode).__name__}")
        if self.decode is None and self.decode_model is not None:
            raise TypeError("decode_model is the decode stage's service model: pass decode= too")
        if self.decode_model is not None:
            from .service_models import CalibratedModel, DecodeModel, LinearModel, MaxModel

            check_instance("decode_model", self.decode_model, (MaxModel, LinearModel, DecodeModel, CalibratedModel))
        object.__setattr__(self, "dual_queue", check_flag("dual_queue", self.dual_queue))
        object.__setattr__(self, "dynamic", check_flag("dynamic", self.dynamic))
        if self.long_instances is None:
            object.__setattr__(self, "long_instances", max(1, self.instances // 3))
        elif self.instances >= 2 and not self.long_instances <= self.instances - 1:
            raise ValueError(f"long_instances must be in [1, instances - 1 = {self.instances - 1}] (each group "
                             f"keeps one instance); got {self.long_instances}")

    bins = 1

    @property
    def routed(self) -> bool:
        """Whether the router keeps groups (dynamic, and two instances at least)."""
        return self.dynamic and self.instances >= 2

    def describe(self) -> dict:
        return {"policy": "laps", "instances": self.instances, "threshold": self.threshold, "window": self.window,
                "max_batch": self.max_batch, "max_batch_tokens": self.max_batch_tokens,
                "dual_queue": self.dual_queue, "dynamic": self.dynamic, "interval": self.interval,
                "ratio": self.ratio, "long_instances": self.long_instances if self.routed else 0,
                **({"decode_policy": token_kind(self.decode), "decode_servers": self.decode_servers}
                   if self.decode is not None else {})}


@dataclass(frozen=True)
class EngineEvent:
    """A scheduled change of a cluster: engine ``engine`` leaves
    (``action="remove"``) or joins again (``"add"``) at ``time`` s.

    A removed engine finishes the batches it is serving but starts no more;
    its queued requests are routed again at that instant (none is lost), and
    the programs the program table assigned to it are reassigned at their
    next large call (its KV contexts are gone)."""

    time: float
    engine: int
    action: str = "remove"

    def __post_init__(self):
        check_fields(self, {"time": "EngineEvent.time", "engine": "EngineEvent.engine",
                            "action": "EngineEvent.action"})


@dataclass(frozen=True)
class Programs:
    """Multi-call programs (agentic sessions): every program makes ``calls``
    calls, each ``think_time`` s (exponential, mean) after the one before;
    a call's prompt is its program's context (every earlier call's prompt
    and output) plus its new tokens.

    In a :class:`Cluster`, programs start as a Poisson process at the
    arrival rate / ``calls`` (so the calls arrive at the arrival rate in the
    long run, open loop), a call's new tokens are drawn from the workload's
    prompt lengths and its output from its output lengths.  Think times are
    open loop by default: a call arrives ``think_time`` after the one before
    it arrived, whether that one finished or not.  ``closed=True`` makes them
    closed loop, as an agent's calls are: a call arrives ``think_time`` after
    the one before it completed (its whole output), so a slow cluster slows
    its programs down; the run takes the first ``n`` calls to arrive (a call
    whose predecessor is never served never arrives).  Closed loops take the
    oracle, bin confusion or given predictions (not a log-normal error)."""

    calls: int = default("Programs.calls")
    think_time: float = default("Programs.think_time")
    closed: bool = default("Programs.closed")

    def __post_init__(self):
        check_fields(self, {"calls": "Programs.calls", "think_time": "Programs.think_time",
                            "closed": "Programs.closed"})

    def describe(self) -> dict:
        return {"calls": self.calls, "think_time": self.think_time, **({"closed_loop": True} if self.closed else {})}


@dataclass(frozen=True, eq=False)
class Sessions:
    """A trace's sessions as a cluster's programs: request ``i`` is a call of
    program ``ids[i]`` (-1: a one-call program of its own), the calls of a
    program in request order, its session ending at its last call.

    Parameters
    ----------
    ids : Trace or array_like of int
        A :class:`~mbbatch.traces.Trace` with a ``session`` column (BurstGPT
        v1.2's ``Session ID``: :func:`~mbbatch.traces.load_burstgpt`), or one
        id >= -1 per request.  Pair it with the same trace's arrivals and
        lengths: ``Replay(trace)`` and ``Workload.from_trace(trace)``.
    context : {"included", "added"}
        What the trace's prompt lengths hold.  ``"included"`` (default): the
        whole prompt, the session's context included, as the calls of a
        stateless API carry it (BurstGPT logs Azure OpenAI API calls, whose
        request tokens are the tokens sent).  A call then extends its
        session's context (the previous call's prompt and output) by ``prompt
        - context`` new tokens; a call whose prompt is shorter than that
        context does not extend it and counts as new whole.  ``"added"``:
        each prompt length is the call's new tokens, and its prompt is its
        session's context (every earlier call's prompt and output) plus them,
        as :class:`Programs` builds its calls.

    A run of more requests than ``ids`` holds repeats them end to end (as
    the trace's arrivals and lengths repeat), each copy's sessions new ones.
    """

    ids: object = None
    context: str = default("Sessions.context")

    def __post_init__(self):
        from ._validation import check_count_array
        from .traces import Trace, first_appearance

        ids = self.ids
        if isinstance(ids, Trace):
            if ids.session is None:
                raise ValueError("ids: the trace has no sessions (its file has no Session ID column: a BurstGPT "
                                 "v1.2 file has one); pass one id per request instead")
            ids = ids.session
        arr = check_count_array("ids", ids, PARAMS["Sessions.ids"].domain)
        check_fields(self, {"context": "Sessions.context"})
        # programs numbered 0 .. count - 1 in order of first call; every -1 a program of its own
        alone = arr < 0
        arr[alone] = arr.max(initial=-1) + 1 + np.arange(int(alone.sum()))
        program = first_appearance(arr)
        program.flags.writeable = False
        object.__setattr__(self, "ids", program)

    @property
    def count(self) -> int:
        """The number of programs (sessions, and one-call programs) in ``ids``."""
        return int(self.ids.max()) + 1

    def describe(self) -> dict:
        return {"programs": "sessions", "sessions": self.count, "session_calls": int(self.ids.size),
                "context": self.context}


_ENGINE_POLICIES = (MultiBin, StaticBatching, DynamicBatching)


@dataclass(frozen=True, eq=False)
class MultiBinEngine(StaticBatching):
    """A :class:`MultiBin` policy as a cluster's engine runs it, in the event
    kernel: requests join ``bins`` FIFOs by their predicted output length
    (tokens), a batch is exactly ``batch_size`` requests of one bin and leaves
    only when full, and a free server takes the batch that formed first (the
    paper's central FIFO of formed batches).  Made by :class:`Cluster` from
    its ``MultiBin``; ``edges`` in tokens, or None (equal mass on the
    workload's output lengths)."""

    bins: int = 1
    edges: Optional[np.ndarray] = None
    predictor: object = None

    @classmethod
    def of(cls, policy: MultiBin) -> "MultiBinEngine":
        if policy.max_wait != math.inf:
            raise ValueError(f"a Cluster's MultiBin engines release full batches only: max_wait must be inf; "
                             f"got {policy.max_wait:g}")
        return cls(policy.batch_size, bins=policy.bins, edges=policy.edges, predictor=policy.predictor)


def token_kind(policy) -> str:
    """The kind of a token-level policy: ``static``, ``dynamic`` or
    ``multibin_dynamic`` (``multibin`` for a cluster's MultiBin engines)."""
    if isinstance(policy, (MultiBin, MultiBinEngine)):
        return "multibin"
    if isinstance(policy, StaticBatching):
        return "static"
    return "multibin_dynamic" if isinstance(policy, MultiBinDynamic) else "dynamic"


@dataclass(frozen=True, eq=False)
class Cluster:
    """A cluster of ``engines`` engines behind a router (Autellix, seed 002).

    Each engine runs ``policy`` (:class:`MultiBin`, :class:`StaticBatching`,
    :class:`DynamicBatching` or :class:`MultiBinDynamic`) on queues of its
    own with ``servers`` servers (``simulate(..., servers=)``, per engine).
    A MultiBin engine bins requests by their predicted output length in
    tokens (its ``edges`` in tokens, else equal mass on the workload's output
    lengths), serves full batches of ``batch_size`` only (``max_wait`` inf),
    the first formed first, and its batch time is the service model's
    (``MaxModel`` for the paper's max of members);
    the router sends each request to one engine when it arrives:

    - ``"autellix"``: Algorithm 2 (:class:`mbbatch.routing.LoadBalancer`): a
      request of at most ``threshold`` prompt (prefill) tokens goes to the
      least-used engine; a larger one to its program's engine in the program
      table, assigned least-used on first sight;
    - ``"least_used"``: the engine with the fewest active requests (routed
      and not completed), ties to the lowest id;
    - ``"round_robin"``: the registered engines in turn.

    Without ``programs`` every request is a one-call program of its own (so
    Autellix routes as least-used).  ``programs`` are synthetic
    (:class:`Programs`) or a trace's sessions (:class:`Sessions`).  With
    them, and
    ``kv_reuse``, a call served on the engine that holds its program's
    context (the engine of the program's previous call) prefills only its new
    tokens; anywhere else it prefills its whole context.  A program's table
    entry is cleared at its last call.  Prefill tokens cost time under the
    :class:`~mbbatch.DecodeModel` (``prefill_per_token``); the other service
    models read the prompt lengths only as context.

    ``events`` (:class:`EngineEvent`) remove engines and add them back
    mid-run.  Engine multi-bin edges (Algorithm 6) are shared: the warm-up
    window counts the requests of every engine.
    """

    policy: object = None
    engines: int = default("Cluster.engines")
    router: str = default("Cluster.router")
    threshold: int = default("Cluster.threshold")
    programs: Optional[Programs] = None
    kv_reuse: bool = default("Cluster.kv_reuse")
    events: tuple = ()

    def __post_init__(self):
        if self.policy is None:
            object.__setattr__(self, "policy", DynamicBatching())
        if not isinstance(self.policy, _ENGINE_POLICIES):
            raise TypeError(f"policy must be MultiBin, StaticBatching, DynamicBatching or MultiBinDynamic (each "
                            f"engine's batching); got {type(self.policy).__name__}")
        if isinstance(self.policy, MultiBin):
            MultiBinEngine.of(self.policy)          # (checked now: full batches only)
        check_fields(self, {"engines": "Cluster.engines", "router": "Cluster.router",
                            "threshold": "Cluster.threshold", "kv_reuse": "Cluster.kv_reuse"})
        if self.programs is not None:
            check_instance("programs", self.programs, (Programs, Sessions))
        events = self.events
        if isinstance(events, EngineEvent) or not isinstance(events, (list, tuple)):
            raise TypeError(f"events must be a list of EngineEvent; got {type(events).__name__}")
        for j, ev in enumerate(events):
            if not isinstance(ev, EngineEvent):
                raise TypeError(f"events[{j}] must be an EngineEvent; got {type(ev).__name__}")
        events = tuple(sorted(events, key=lambda ev: ev.time))
        registered = set(range(self.engines))
        for ev in events:
            if ev.engine >= self.engines:
                raise ValueError(f"events: engine must be in [0, engines - 1 = {self.engines - 1}]; got {ev}")
            if ev.action == "remove":
                if ev.engine not in registered:
                    raise ValueError(f"events: engine {ev.engine} is not in the cluster at {ev.time:g} s; got {ev}")
                if len(registered) == 1:
                    raise ValueError(f"events: the cluster keeps one engine at least; got {ev}, removing its last")
                registered.discard(ev.engine)
            else:
                if ev.engine in registered:
                    raise ValueError(f"events: engine {ev.engine} is in the cluster already at {ev.time:g} s; "
                                     f"got {ev}")
                registered.add(ev.engine)
        object.__setattr__(self, "events", events)

    @property
    def kind(self) -> str:
        """The engines' policy kind."""
        return token_kind(self.policy)

    def describe(self) -> dict:
        d = {k: v for k, v in self.policy.describe().items() if k != "policy"}
        d.update(policy="cluster", engine_policy=self.kind, engines=self.engines, router=self.router,
                 threshold=self.threshold, kv_reuse=bool(self.kv_reuse and self.programs is not None),
                 events=len(self.events))
        if self.programs is not None:
            d.update(self.programs.describe())
        return d
