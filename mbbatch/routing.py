"""Routers of a cluster of engines, as components usable outside the
simulator: the Autellix program-aware load balancer and the LAPS router.

:class:`LoadBalancer` is Algorithm 2 of the Autellix paper as its load
balancer specifies it (thread-safe, with its counters)::

    procedure LOAD_BALANCER(Call c, Table pt, List Engines)
        if LEN(c.tokens) <= 2048 then              # small request
            assigned_engine = LEAST_USED(Engines)
        else
            if c.pid in pt then                     # program already assigned
                assigned_engine = pt[c.pid]
            else
                assigned_engine = LEAST_USED(Engines)
                pt[c.pid] = assigned_engine         # assign program to engine
        return assigned_engine

``LEAST_USED`` is the engine with the fewest active requests, ties to the
lowest engine id.  A request's size is its prefill tokens only.

:class:`LapsRouter` is the LAPS router's dynamic allocation of prefill
instances between a short and a long group (the router's ``classify``,
``select_pair_laps``, ``_laps_maybe_rebalance`` and ``laps_request_done``):
a request of at most ``threshold`` prompt tokens is short; it goes to the
instance of its group with the fewest outstanding requests (ties to the
lowest id).  On each routing decision, at most once per ``interval``
seconds, one instance moves from the long group to the short one when short
pending > ``ratio`` x long pending and the long group has more than one
instance, or symmetrically; each group keeps at least one instance.  With
fewer than two instances there are no groups: every request goes to the one
instance.
"""

from __future__ import annotations

import enum
import math
import numbers
import threading
from dataclasses import dataclass, field

from ._validation import check_scalar_real
from .params import Domain

__all__ = ["RequestSize", "EngineInfo", "LoadBalancer", "LapsRouter", "AUTELLIX_THRESHOLD", "LAPS_THRESHOLD"]

#: prefill tokens of the largest small request (Autellix Algorithm 2: 2048 is small, 2049 large)
AUTELLIX_THRESHOLD = 2048
#: prompt tokens of the longest short request (LAPS ``--laps-length-threshold``: 256 short, 257 long)
LAPS_THRESHOLD = 256
#: LAPS router defaults: rebalancing interval (s) and pending ratio (``--laps-rebalance-*``)
LAPS_INTERVAL, LAPS_RATIO = 5.0, 2.0


class RequestSize(enum.Enum):
    """A request's class under Algorithm 2: small (at most the threshold's
    prefill tokens: load balanced) or large (program locality)."""

    SMALL = "small"
    LARGE = "large"


@dataclass
class EngineInfo:
    """An engine's state: its id, the requests running on it and the programs
    the program table assigns to it."""

    engine_id: object
    active_requests: int = 0
    programs_assigned: set = field(default_factory=set)

    def workload(self) -> int:
        """The engine's load as LEAST_USED reads it: its active requests."""
        return self.active_requests


def _check_tokens(num_tokens, name: str = "num_tokens") -> int:
    """A count of tokens, an integer in [0, inf); ``name`` is the caller's
    parameter (``num_tokens``, ``prompt_tokens``)."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative integer, in [0, inf); got {num_tokens!r} "
                        f"({type(num_tokens).__name__})")
    n = int(num_tokens)
    if n < 0:
        raise ValueError(f"{name} must be a non-negative integer, in [0, inf); got {n}")
    return n


def _check_threshold(threshold, default_name: str) -> int:
    try:
        t = _check_tokens(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a non-negative integer ({default_name}); got {threshold!r}") from None
    return t


def _check_id(name: str, value):
    """An engine or program id: hashable, not None, not NaN (a NaN is not
    equal to itself, so no table could find it again)."""
    if value is None:
        raise TypeError(f"{name} must be a hashable id, not None (None marks a missing entry)")
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{name} must be a hashable id (an int or a str, say); got {value!r} "
                        f"({type(value).__name__})") from None
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and math.isnan(value):
        raise ValueError(f"{name} must not be NaN (it is not equal to itself: no table finds it again)")
    return value


def _check_now(now) -> float:
    """A routing instant: a finite real number of seconds."""
    return check_scalar_real("now", now, Domain(-math.inf, math.inf))


def _least(candidates, load):
    """The candidate with the smallest ``load``, ties to the lowest id."""
    return min(candidates, key=lambda e: (load(e), e))


class LoadBalancer:
    """Autellix's data-locality-aware load balancer (Algorithm 2).

    Parameters
    ----------
    process_table : object, optional
        The serving system's process table, kept for integration (unused by
        the routing decision).
    threshold : int
        Prefill tokens of the largest small request (default 2048).

    Every public method holds one re-entrant lock: the balancer may be
    called from several threads (a scheduler routing, an engine manager
    completing requests).
    """

    def __init__(self, process_table=None, *, threshold: int = AUTELLIX_THRESHOLD):
        self.process_table = process_table
        self.threshold = _check_threshold(threshold, "Autellix: 2048")
        self._lock = threading.RLock()
        self._engines: dict = {}
        self._program_table: dict = {}
        self._counts = dict(total_requests=0, small_requests=0, large_requests=0, locality_hits=0,
                            locality_assigns=0)

    # --- engines ---------------------------------------------------------------------------

    def register_engine(self, engine_id) -> None:
        """Add an engine to the pool (no active requests, no programs)."""
        _check_id("engine_id", engine_id)
        with self._lock:
            if engine_id in self._engines:
                raise ValueError(f"engine {engine_id!r} is already registered")
            try:
                sorted([engine_id, *self._engines])
            except TypeError:
                raise TypeError(f"engine ids must be comparable with each other (ties go to the lowest id); "
                                f"got {engine_id!r} beside {list(self._engines)!r}") from None
            self._engines[engine_id] = EngineInfo(engine_id)

    def unregister_engine(self, engine_id) -> None:
        """Remove an engine.  The programs assigned to it leave the program
        table, so each is reassigned (LEAST_USED) at its next large request."""
        with self._lock:
            info = self._engine(engine_id)
            for pid in info.programs_assigned:
                if self._program_table.get(pid) == engine_id:
                    del self._program_table[pid]
            del self._engines[engine_id]

    @property
    def engines(self) -> list:
        """The registered engine ids, in registration order."""
        with self._lock:
            return list(self._engines)

    def _engine(self, engine_id) -> EngineInfo:
        _check_id("engine_id", engine_id)
        try:
            return self._engines[engine_id]
        except KeyError:
            raise KeyError(f"engine {engine_id!r} is not registered; registered: {list(self._engines)!r}") from None

    # --- routing -----------------------------------------------------------------------------

    def classify(self, num_tokens) -> RequestSize:
        """SMALL for at most ``threshold`` prefill tokens, else LARGE."""
        return RequestSize.SMALL if _check_tokens(num_tokens) <= self.threshold else RequestSize.LARGE

    def least_used(self):
        """LEAST_USED(Engines): the engine with the fewest active requests,
        ties to the lowest id."""
        with self._lock:
            if not self._engines:
                raise RuntimeError("no engine is registered: register_engine first")
            return _least(self._engines, lambda e: self._engines[e].active_requests)

    def route_request(self, pid, num_tokens) -> object:
        """The engine that serves a request of program ``pid`` with
        ``num_tokens`` prefill tokens (Algorithm 2); the request counts as
        active on it until :meth:`complete_request`."""
        _check_id("pid", pid)
        size = self.classify(num_tokens)
        with self._lock:
            if not self._engines:
                raise RuntimeError("no engine is registered: register_engine first")
            self._counts["total_requests"] += 1
            if size is RequestSize.SMALL:
                self._counts["small_requests"] += 1
                engine = self.least_used()
            else:
                self._counts["large_requests"] += 1
                if pid in self._program_table:
                    engine = self._program_table[pid]
                    self._counts["locality_hits"] += 1
                else:
                    engine = self.least_used()
                    self._program_table[pid] = engine
                    self._engines[engine].programs_assigned.add(pid)
                    self._counts["locality_assigns"] += 1
            self._engines[engine].active_requests += 1
            return engine

    def complete_request(self, engine_id, pid) -> None:
        """A request of ``pid`` finished on ``engine_id``: one active request
        fewer there."""
        _check_id("pid", pid)
        with self._lock:
            info = self._engine(engine_id)
            if info.active_requests == 0:
                raise ValueError(f"engine {engine_id!r} has no active request to complete (program {pid!r})")
            info.active_requests -= 1

    def remove_program(self, pid) -> bool:
        """The session of ``pid`` ended: clear its program-table entry.
        Returns whether it had one."""
        _check_id("pid", pid)
        with self._lock:
            if pid not in self._program_table:
                return False
            engine = self._program_table.pop(pid)
            self._engines[engine].programs_assigned.discard(pid)
            return True

    def assigned_engine(self, pid):
        """The engine the program table holds for ``pid``, or None."""
        _check_id("pid", pid)
        with self._lock:
            return self._program_table.get(pid)

    # --- statistics ----------------------------------------------------------------------------

    def get_stats(self) -> dict:
        """The counters: requests (total, small, large), locality hits (large
        requests routed by the program table) and assigns (large requests
        that created an entry), programs in the table, and per engine its
        active requests, programs assigned and workload."""
        with self._lock:
            return {**self._counts, "programs_in_table": len(self._program_table),
                    "engines": {e: {"active_requests": i.active_requests, "programs_assigned": len(i.programs_assigned),
                                    "workload": i.workload()} for e, i in self._engines.items()}}


#: the most prefill instances a :class:`LapsRouter` takes (as many as a cluster's engines)
MAX_INSTANCES = 1 << 20


class LapsRouter:
    """LAPS's router: short and long groups of prefill instances, rebalanced
    by pending pressure (see the module docstring).

    Parameters
    ----------
    instances : int
        Prefill instances, ids 0 .. instances - 1.
    threshold : int
        Prompt tokens of the longest short request (default 256).
    interval : float
        Seconds between rebalancing checks at least (default 5).
    ratio : float
        Pending ratio that moves an instance (default 2).
    long_instances : int, optional
        Instances in the long group at first (default: a third, at least
        one): the highest ids.
    """

    def __init__(self, instances: int, *, threshold: int = LAPS_THRESHOLD, interval: float = LAPS_INTERVAL,
                 ratio: float = LAPS_RATIO, long_instances: int | None = None):
        if isinstance(instances, bool) or not isinstance(instances, numbers.Integral):
            raise TypeError(f"instances must be an integer in [1, {MAX_INSTANCES}]; got {instances!r} "
                            f"({type(instances).__name__})")
        if not 1 <= instances <= MAX_INSTANCES:
            raise ValueError(f"instances must be an integer in [1, {MAX_INSTANCES}]; got {instances!r}")
        instances = int(instances)
        self.threshold = _check_threshold(threshold, "LAPS: 256")
        self.interval = check_scalar_real("interval", interval, Domain(0.0, math.inf, lo_closed=True))
        self.ratio = check_scalar_real("ratio", ratio, Domain(0.0, math.inf))
        self.instances = instances
        self.enabled = instances >= 2
        if long_instances is None:
            long_instances = max(1, instances // 3)
        if self.enabled and (isinstance(long_instances, bool) or not isinstance(long_instances, numbers.Integral)
                             or not 1 <= long_instances <= instances - 1):
            raise ValueError(f"long_instances must be an integer in [1, {instances - 1}] (each group keeps one "
                             f"instance); got {long_instances!r}")
        n_short = instances - int(long_instances) if self.enabled else instances
        self.short = list(range(n_short))
        self.long = list(range(n_short, instances)) if self.enabled else []
        self.pending = {"short": 0, "long": 0}
        self.outstanding = [0] * instances
        self.last_check = -math.inf
        self.moves: list = []

    def classify(self, prompt_tokens) -> str:
        """``"short"`` for at most ``threshold`` prompt tokens, else ``"long"``."""
        return "short" if _check_tokens(prompt_tokens, "prompt_tokens") <= self.threshold else "long"

    def maybe_rebalance(self, now: float):
        """Move at most one instance between the groups, at most once per
        interval; returns ``(instance, from, to)`` or None.  ``now``: a
        finite number of seconds."""
        now = _check_now(now)
        if not self.enabled or now - self.last_check < self.interval:
            return None
        self.last_check = now
        short, long_ = self.pending["short"], self.pending["long"]
        if short > self.ratio * long_ and len(self.long) > 1:
            move = (self._take(self.long), "long", "short")
            self.short.append(move[0])
        elif long_ > self.ratio * short and len(self.short) > 1:
            move = (self._take(self.short), "short", "long")
            self.long.append(move[0])
        else:
            return None
        self.short.sort()
        self.long.sort()
        self.moves.append((now, *move))
        return move

    def _take(self, group: list) -> int:
        """The instance that leaves ``group``: the one with the fewest
        outstanding requests, ties to the highest id."""
        inst = min(group, key=lambda i: (self.outstanding[i], -i))
        group.remove(inst)
        return inst

    def select(self, prompt_tokens, now: float) -> tuple:
        """Route a request arriving at ``now``: rebalance if due, classify,
        pick the instance of its group with the fewest outstanding requests
        (ties to the lowest id) and count it pending.  Returns ``(category,
        instance)``."""
        cat = self.classify(prompt_tokens)
        self.maybe_rebalance(_check_now(now))
        group = (self.short if cat == "short" else self.long) if self.enabled else self.short
        inst = _least(group, lambda i: self.outstanding[i])
        self.pending[cat] += 1
        self.outstanding[inst] += 1
        return cat, inst

    def request_done(self, category: str, instance: int) -> None:
        """A request of ``category`` finished its prefill on ``instance``."""
        if not isinstance(category, str) or category not in self.pending:
            raise ValueError(f"category must be 'short' or 'long'; got {category!r}")
        if isinstance(instance, bool) or not isinstance(instance, numbers.Integral):
            raise TypeError(f"instance must be an integer in [0, {self.instances - 1}]; got {instance!r} "
                            f"({type(instance).__name__})")
        if not 0 <= instance < self.instances:
            raise ValueError(f"instance must be an integer in [0, {self.instances - 1}]; got {instance!r}")
        if self.pending[category] == 0 or self.outstanding[instance] == 0:
            raise ValueError(f"no pending {category} request on instance {instance}")
        self.pending[category] -= 1
        self.outstanding[instance] -= 1

    def status(self) -> dict:
        """Groups, pending counts and configuration (the router's ``/laps_status``)."""
        return {"short_group": list(self.short), "long_group": list(self.long), "pending": dict(self.pending),
                "outstanding": list(self.outstanding), "threshold": self.threshold, "interval": self.interval,
                "ratio": self.ratio, "enabled": self.enabled}
