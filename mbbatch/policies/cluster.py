"""A cluster of engines behind a router, its programs (multi-call sessions)
and its engine events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from .._kernels.admission import CODES as ADMISSIONS, HANDS_BACK
from .._kernels.routing import CACHE_ROUTERS
from .._validation import check_fields, check_instance
from ..params import PARAMS, default
from .base import Carries, ComposedSettings, Policy, declaring
from .dynamic import DynamicBatching

__all__ = ["Cluster", "EngineEvent", "Programs", "Sessions"]


@dataclass(frozen=True)
class EngineEvent:
    """A scheduled change of a cluster: engine ``engine`` leaves
    (``action="remove"``) or joins again (``"add"``) at ``time`` s.

    A removed engine finishes the batches it is serving but starts no more;
    its queued requests are routed again at that instant (none is lost), and
    the programs the program table assigned to it are reassigned at their
    next large call (its KV contexts are gone).

    On :class:`~mbbatch.ContinuousBatching` engines a removed engine keeps
    the requests it admitted (running, or preempted and waiting to resume)
    and runs them to their end; the requests it had not admitted at the
    instant (those in its admission order's queue, taken out in the order
    it would admit them) are routed again at that instant, each keeping its
    first arrival (its latency and time to first token count from it), and
    join their new engine's queue at its next iteration boundary.  The
    router counts a rejoined engine's requests still running as its
    active ones.  Not with ``prefix_caching`` (a leaving engine would have
    to drop its cache) nor ``admission="mlfq"`` (it holds requests it
    preempted among its waiting)."""

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
    whose predecessor is never served never arrives).  On run-to-completion
    engines closed loops take the oracle, bin confusion or given
    predictions (not a log-normal error); on
    :class:`~mbbatch.ContinuousBatching` engines the oracle or a log-normal
    error (each call predicted as its program draws it), and a call arrives
    ``think_time`` after its client has the answer: its completion plus the
    engine's ``request_overhead``."""

    calls: int = default("Programs.calls")
    think_time: float = default("Programs.think_time")
    closed: bool = default("Programs.closed")

    def __post_init__(self):
        check_fields(self, {"calls": "Programs.calls", "think_time": "Programs.think_time",
                            "closed": "Programs.closed"})

    def describe(self) -> dict:
        return {"calls": self.calls, "think_time": self.think_time, **({"closed_loop": True} if self.closed else {})}

    def table_size(self, n: int) -> int:
        """The programs of the first ``n`` calls (the program table's size)."""
        return -(-n // self.calls)

    def drawn(self, n: int) -> int:
        """The calls a run of ``n`` draws for each program: all ``calls``, or
        ``n`` when a program has more (a run takes its first ``n`` calls: a
        single program's first ``n``, the rest never drawn)."""
        return min(self.calls, n)


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
        from .._validation import check_count_array
        from ..traces import Trace, first_appearance

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

    #: a trace's sessions replay their calls' times: never a closed loop
    closed: ClassVar[bool] = False

    @property
    def count(self) -> int:
        """The number of programs (sessions, and one-call programs) in ``ids``."""
        return int(self.ids.max()) + 1

    def table_size(self, n: int) -> int:
        """The programs of the first ``n`` requests, the trace's sessions
        repeated end to end (the program table's size)."""
        return -(-n // self.ids.size) * self.count

    def describe(self) -> dict:
        return {"programs": "sessions", "sessions": self.count, "session_calls": int(self.ids.size),
                "context": self.context}


#: an engine's settings that a cluster's spec keys leave at their defaults
_ENGINE_DEFAULTS = ("edges", "max_wait", "selection", "warmup", "bin_edges", "predictor_sigma", "predictor_p")


@dataclass(frozen=True, eq=False)
class Cluster(Policy):
    """A cluster of ``engines`` engines behind a router (Autellix: Luo et al.,
    2025, "Autellix: An Efficient Serving Engine for LLM Agents as General
    Programs", arXiv:2502.13965).

    Each engine runs ``policy`` (a policy that declares ``engine``:
    :class:`MultiBin`, :class:`StaticBatching`, :class:`DynamicBatching`,
    :class:`MultiBinDynamic`, :class:`ContinuousBatching`, ...) on queues of its
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
    entry is cleared at its last call (the engine holding its context keeps
    it: an earlier call routed again after an engine's removal finds it
    there).  Prefill tokens cost time under the
    :class:`~mbbatch.DecodeModel` (``prefill_per_token``); the other service
    models read the prompt lengths only as context.

    ``events`` (:class:`EngineEvent`) remove engines and add them back
    mid-run.  Engine multi-bin edges (Algorithm 6) are shared: the warm-up
    window counts the requests of every engine.

    A :class:`ContinuousBatching` engine batches at every iteration
    (:mod:`mbbatch._kernels.continuous_cluster`): each engine is one engine
    (``servers`` 1), timed by an :class:`~mbbatch.IterationModel`; at each
    arrival every engine is advanced to that instant, so the router counts
    the requests completed by then; with ``kv_reuse`` a call on the engine
    holding its program's context brings that context's KV cache (its
    blocks taken, only its new tokens prefilled).  With closed-loop
    programs the engines run one iteration at a time, the one whose
    iteration starts first next, so that a completion issues its program's
    next call before any later iteration starts
    (:data:`~mbbatch._kernels.disaggregated.cluster_closed_loop_kernel`, the
    closed-loop driver of a deployment, without its decode pool).
    Engine ``events`` hand a leaving engine's waiting requests back to the
    router (:class:`EngineEvent`).
    With ``ContinuousBatching(prefix_caching=True)`` each engine caches the
    prefixes of the requests routed to it: a workload's system prompts, or
    with ``programs`` each program's context (a call shares its prompt but
    its new tokens with it; the engine's cache replaces ``kv_reuse``, and
    can evict it).  ``router="cache_aware"`` routes by those caches
    (SGLang's cache-aware router, reading the engines' KV cache state as its
    event-driven mode does): while the loads are out of balance (the most
    active requests of an engine exceed the least by more than
    ``balance_abs`` and are more than ``balance_rel`` times them) the
    least-used engine; else the engine whose cache holds the most of the
    request's prefix (ties: the fewer active requests, then the lower id)
    if that is more than ``cache_threshold`` of its prompt, else the
    least-used engine.  With programs, the engine holding a program's
    context is the one its cache matches: Autellix's locality, bounded by
    the load.
    The metrics of the other engine kind are NaN (0 for counts): a
    run-to-completion cluster has no time between tokens, a
    continuous-batching one no batch SLA shares.
    """

    policy: object = None
    engines: int = default("Cluster.engines")
    router: str = default("Cluster.router")
    threshold: int = default("Cluster.threshold")
    programs: Optional[Programs] = None
    kv_reuse: bool = default("Cluster.kv_reuse")
    events: tuple = ()
    cache_threshold: float = default("Cluster.cache_threshold")
    balance_abs: int = default("Cluster.balance_abs")
    balance_rel: float = default("Cluster.balance_rel")

    kind: ClassVar[str] = "cluster"
    planner: ClassVar[str] = "cluster"
    reports: ClassVar[frozenset] = frozenset({"run", "batch_means", "tokens", "decode", "ttft", "ttft_quantiles",
                                              "tbt_quantiles", "router", "continuous", "goodput", "prefix"})
    #: (its own keys, then every engine's settings: ``engine_batch_size`` and ``engine_bins`` the engines'
    #: batch size and bins, the predictor's and the bins' left at their defaults)
    settings = ComposedSettings(("engines", "engine_policy", "engine_batch_size", "engine_bins", "router",
                                 "route_threshold", "kv_reuse", "programs", "calls", "think_time", "closed_loop",
                                 "session_context", "cache_threshold", "balance_abs", "balance_rel"), "engine",
                                renames={"batch_size": "engine_batch_size", "bins": "engine_bins"},
                                leaves=_ENGINE_DEFAULTS)

    def __post_init__(self):
        if self.policy is None:
            object.__setattr__(self, "policy", DynamicBatching())
        if not (isinstance(self.policy, Policy) and self.policy.engine):
            raise TypeError(f"policy must be {' or '.join(declaring('engine'))} (each engine's batching); got "
                            f"{type(self.policy).__name__}")
        self.policy.engine_form()                   # (checked now: a MultiBin's full batches only)
        check_fields(self, {"engines": "Cluster.engines", "router": "Cluster.router",
                            "threshold": "Cluster.threshold", "kv_reuse": "Cluster.kv_reuse",
                            "cache_threshold": "Cluster.cache_threshold", "balance_abs": "Cluster.balance_abs",
                            "balance_rel": "Cluster.balance_rel"})
        if self.router in CACHE_ROUTERS and not getattr(self.policy, "prefix_caching", False):
            raise ValueError(f"router = {self.router!r} routes by the engines' prefix caches: its engines must be "
                             f"ContinuousBatching(prefix_caching=True); got {type(self.policy).__name__}"
                             + ("(prefix_caching=False)" if hasattr(self.policy, "prefix_caching") else ""))
        if self.programs is not None:
            check_instance("programs", self.programs, (Programs, Sessions))
        object.__setattr__(self, "events", checked_events(self.events, self.engines))
        if self.events:
            refuse_events(self.policy, "events")

    @property
    def engine_kind(self) -> str:
        """The engines' policy kind."""
        return self.policy.kind

    def carries(self) -> Carries:
        """Its engines' (their load averaged over the engines, with the
        throughput check for a router that overloads one of them), the
        requests every engine holds together."""
        e = self.policy.carries()
        return e._replace(held=self.engines * e.held)

    def request_engine(self):
        """Its engines' policy: they run its requests."""
        return self.policy

    def describe(self) -> dict:
        d = {k: v for k, v in self.policy.describe().items() if k != "policy"}
        d.update(policy=self.kind, engine_policy=self.engine_kind, engines=self.engines, router=self.router,
                 threshold=self.threshold, kv_reuse=bool(self.kv_reuse and self.programs is not None),
                 events=len(self.events))
        if self.router in CACHE_ROUTERS:
            d.update(cache_threshold=self.cache_threshold, balance_abs=self.balance_abs, balance_rel=self.balance_rel)
        if self.programs is not None:
            d.update(self.programs.describe())
        return d

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "Cluster":
        """A cell's cluster: its engines run ``engine_policy`` (that kind's
        policy of the cell's settings, ``engine_batch_size`` and
        ``engine_bins`` as its batch size and bins, its other settings at
        their defaults), behind ``router``, with synthetic programs, the
        trace's sessions or none."""
        kind = params["engine_policy"]
        engine = {key: default(key) for key in _ENGINE_DEFAULTS}
        engine.update(params, batch_size=params["engine_batch_size"], bins=params["engine_bins"])
        return cls(ctx.build(kind, engine), engines=params["engines"], router=params["router"],
                   threshold=params["route_threshold"], kv_reuse=params["kv_reuse"],
                   programs=programs_of(params, ctx.trace),
                   cache_threshold=params["cache_threshold"], balance_abs=params["balance_abs"],
                   balance_rel=params["balance_rel"])


def checked_events(events, engines: int, name: str = "events", count: str = "engines") -> tuple:
    """``events``, a list of :class:`EngineEvent` for ``engines`` engines
    (``count``: their parameter's name), checked (each engine among them,
    removed only while in, added only while out, one engine kept at least)
    and sorted by time (stable); ``name`` the parameter's."""
    if isinstance(events, EngineEvent) or not isinstance(events, (list, tuple)):
        raise TypeError(f"{name} must be a list of EngineEvent; got {type(events).__name__}")
    for j, ev in enumerate(events):
        if not isinstance(ev, EngineEvent):
            raise TypeError(f"{name}[{j}] must be an EngineEvent; got {type(ev).__name__}")
    events = tuple(sorted(events, key=lambda ev: ev.time))
    registered = set(range(engines))
    for ev in events:
        if ev.engine >= engines:
            raise ValueError(f"{name}: engine must be in [0, {count} - 1 = {engines - 1}]; got {ev}")
        if ev.action == "remove":
            if ev.engine not in registered:
                raise ValueError(f"{name}: engine {ev.engine} is not in the cluster at {ev.time:g} s; got {ev}")
            if len(registered) == 1:
                raise ValueError(f"{name}: the cluster keeps one engine at least; got {ev}, removing its last")
            registered.discard(ev.engine)
        else:
            if ev.engine in registered:
                raise ValueError(f"{name}: engine {ev.engine} is in the cluster already at {ev.time:g} s; got {ev}")
            registered.add(ev.engine)
    return events


def refuse_events(engine, name: str) -> None:
    """Raise the ValueError, naming the events' parameter ``name``, where
    engines of ``engine`` cannot take engine events: resumable engines
    caching prefixes (an engine leaving would have to drop its cache), or
    whose admission order cannot hand its queue back (MLFQ's holds the
    requests it preempted among them)."""
    if not engine.resumable:
        return
    if engine.prefix_caching:
        raise ValueError(f"{name}: ContinuousBatching(prefix_caching=True) engines take no engine events yet (an "
                         f"engine leaving would have to drop its cache)")
    if not HANDS_BACK[ADMISSIONS[engine.admission]]:
        raise ValueError(f"{name}: an engine leaving hands its waiting requests back to the router, which "
                         f"ContinuousBatching(admission={engine.admission!r}) cannot (it holds requests it "
                         f"preempted among them); the admissions that can: "
                         f"{', '.join(a for a, ok in zip(ADMISSIONS, HANDS_BACK) if ok)}")


def programs_of(params: dict, trace=None):
    """A sweep cell's programs (its ``programs`` key): synthetic
    :class:`Programs` of its ``calls``, ``think_time`` and ``closed_loop``,
    the ``trace``'s :class:`Sessions` (their ``session_context``), or None."""
    if params["programs"] == "sessions":
        return Sessions(trace, context=params["session_context"])
    if params["programs"] == "synthetic":
        return Programs(calls=params["calls"], think_time=params["think_time"], closed=params["closed_loop"])
    return None

