"""Capacity search: the largest arrival rate a policy sustains, stable or
within a latency or SLA objective, with its confidence interval.

:func:`find_capacity` keeps the shape of the arrival process (Poisson, Gamma
with its CV, ON/OFF with its burst ratio and sojourns, a replayed trace) and
searches its rate:

1. **Bracket.**  The saturated throughput of the same policy on the same
   requests bounds the stable rate from above: a probe at 1.05 times it must
   fail (else the bound is doubled).  A light load, a tenth of it, bounds it
   from below: a probe there must pass (else it is halved, down to a
   thousandth).  Where none of those passes, rates between the light load
   and the upper end, a tenth of it apart, are probed from the top down:
   a criterion can fail at light load and pass at higher load (the paper's
   model fills its batches slowly at low rates, so its latency falls with
   the rate before it rises near saturation); the highest that passes, if
   any, is the lower end, else the result is a rate of 0.
2. **Bisect.**  A probe at the bracket's midpoint replicates until each
   criterion's confidence interval lies on one side of its threshold
   (pass or fail), or ``max_reps`` is reached (undecided).  An undecided
   probe narrows the bracket from both sides, to the points halfway to its
   ends: they are probed, and an end moves to a point that decides as a
   verdict would move it; where a point stays undecided too, the end moves
   there all the same (the limit lies within the probes' resolution of the
   undecided rate), and ``resolved`` is False.  The search ends when the
   bracket is within ``rel_tol`` of its midpoint.
3. **Answer.**  Where the binding criterion's means over the probes cross
   its threshold, joined by lines, kept between the highest rate that
   passed and the lowest that failed (:func:`_crossing`); the bracket's
   midpoint where they do not cross.

Every probe uses the same seeds, replication by replication (common random
numbers): neighbouring probes are paired comparisons.

The search finds one boundary: where a criterion passes again above a rate
where it failed (besides the light-load case of step 1), the answer is the
boundary the bisection meets, the lowest in practice.  DynamicBatching under
its SLA controller is such a case: the controller sets the batch size from
the time between tokens alone (Pang et al., 2025, arXiv:2503.05248), which the decode model keeps
nearly flat above about 20 requests a batch, so the batch size stays
wherever it entered the dead band; on U(10, 500) prompts and Exp(60)
outputs it is stable at 80 requests/s but not at 20 (n = 200,000), and the
search answers about 11 (n = 100,000) against a saturated throughput of 82.

The criteria:

- **Stability** (always), from what the policy's engine carries (its
  :meth:`~mbbatch.policies.base.Policy.carries`):

  * *the load*, where batches hold their servers to completion at a
    batching the load does not change (the multi-bin paper's full batches,
    LAPS's prefill batches): ``rate x mean batch service time / (servers x
    mean batch size)`` below 1, the arrival rate below the service rate at
    the run's batching (in a stable run the servers' busy fraction; in an
    overloaded one the arrival rate over the throughput, above 1), decided
    with a t-interval.  There the backlog check of results and sweeps
    (:attr:`SimulationResult.unstable`) decides only a probe still undecided
    at the replication cap (:func:`_verdict`).
  * *the backlog*, at every probe, where there is no such load: a
    continuous engine's batch is one iteration (that ratio is about one over
    the output tokens, 0.002-0.01, at any rate: continuous engines were
    searched above their saturated throughput by it), and static,
    shortest-first and dynamic batches take whatever waits (near the limit
    the server is always busy and the batches grow with the backlog, the
    load 1 within any interval over a range of rates below it); and with
    LAPS's decode stage, which the prefill instances' load does not see.
    A probe fails where the share of its replications whose backlog grew
    lies above one half (Clopper-Pearson interval), passes where it lies
    below, and replicates further between (it passes with
    :func:`backlog_reps` replications at least, 6 at 95 %).
  * *the throughput keeps up*, every probe: the throughput over the rate
    against ``1 - throughput_tol``, decided with a t-interval; an interval
    holding the floor replicates further.  (The load is an average over the
    servers: with LAPS's groups one group can be overloaded while it is
    below 1.)
  * *not above the saturated throughput*, every probe: the rate over each
    replication's saturated throughput (its requests all waiting at time 0;
    completed x servers / busy server-time, so the idle servers of a finite
    run's drain do not lower it), paired replication by replication, below
    1 (a t-interval).  The capacity's interval ends at most at the upper end
    of the saturated throughput's (``saturated_ci``).

  Give runs long enough for the policy's start-up and drain to be a small
  part of them: :func:`min_requests` refuses fewer than 10 times the
  requests its servers hold at once (a batch, every bin's batch), 100 times
  a continuous engine's running sequences (they turn over once per output),
  and 100 in any case.  The controllers of dynamic batching start with small
  batches, which weigh on a short run (3 % at 8,000 calls for 8 Autellix
  engines).
- **Objectives**, :class:`Objective`: any of ``latency_p50``,
  ``latency_p95``, ``latency_p99``, ``mean_latency``, the time to first
  token's ``mean_ttft``, ``ttft_p50``, ``ttft_p95``, ``ttft_p99`` and between
  tokens' ``mean_tbt``, ``tbt_p50``, ``tbt_p95``, ``tbt_p99`` (every
  token-level policy), ``sla_violation_share`` (share of requests above D_SLA: the SLA
  violation rate of Pang et al., 2025, arXiv:2503.05248),
  ``sla_violation_tokens`` (share of output tokens decoded slower than
  D_SLA + eps_D) and ``sla_violation_requests``, each at most its value: a
  criterion passes when the t-interval of its mean over the replications
  lies at or below it.
- **Each class's objectives**, ``Objective(classes={name: Objective(...)})``
  on a :meth:`Workload.mixture <mbbatch.Workload.mixture>`: bounds on the
  metrics the run reports for each class (:data:`CLASS_METRICS`, from
  :attr:`SimulationResult.classes <mbbatch.SimulationResult.classes>`),
  each decided as the run's are, by the t-interval of the class's value over
  the replications; a criterion named ``metric['name']`` (``ttft_p99['chat']``).

Each criterion's interval is at ``confidence``.  A search's final bracket
(``bracket``: the highest rate that passed and the lowest that failed) holds
that search's answer, not the uncertainty of the capacity: the answer moves
with the seeds (three seed sets of one multi-bin dynamic batching search gave
brackets 6x narrower than their spread, two of them disjoint).  So the search
is repeated on ``searches`` independent seed sets and the capacity is the
mean of their answers, ``rate_ci`` its Student-t interval at ``confidence``
(the answers are independent and identically distributed: each search is the
same deterministic procedure on its own seeds).  The interval covers the
expected answer of a search at ``n`` requests a probe; where the finite-``n``
answer is biased (a start-up transient, a backlog check's verdicts), make
``n`` larger.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import InitVar, dataclass, field

import numpy as np

from . import stats
from ._validation import check_flag, check_scalar_real
from .arrivals import Arrivals, Poisson, Saturated
from .metrics import METRICS, PER_CLASS
from .simulation import plan, run_plan
from .params import Domain
from scipy import stats as _st

__all__ = ["Objective", "Probe", "Search", "CapacityResult", "find_capacity", "find_split", "SplitResult",
           "check_search", "with_rate",
           "min_requests", "backlog_reps",
           "OBJECTIVE_METRICS", "CLASS_METRICS", "SEARCH_DOMAINS", "SEARCHES"]

#: the metrics an objective may bound (from above, but :data:`LOWER_BOUNDS`)
OBJECTIVE_METRICS = ("latency_p50", "latency_p95", "latency_p99", "mean_latency", "mean_ttft", "ttft_p50",
                     "ttft_p95", "ttft_p99", "mean_tbt", "tbt_p50", "tbt_p95", "tbt_p99", "sla_violation_share",
                     "sla_violation_tokens", "sla_violation_requests", "goodput")
#: the metrics an objective bounds from below: those where higher is better (:attr:`mbbatch.metrics.Metric.better`)
LOWER_BOUNDS = tuple(m for m in OBJECTIVE_METRICS if METRICS[m].better == "higher")
#: the metrics a class's objective may bound: those of :data:`OBJECTIVE_METRICS` that a mixture's run
#: reports for each class (:data:`mbbatch.metrics.PER_CLASS`)
CLASS_METRICS = tuple(m for m in PER_CLASS if m in OBJECTIVE_METRICS)
#: the stability criterion's statistic and threshold (see the module docstring)
LOAD, LOAD_LIMIT = "load", 1.0
#: the other stability criteria's names: the throughput over the rate, the share of replications whose
#: backlog grew, the rate over the saturated throughput
THROUGHPUT, BACKLOG, SATURATION = "throughput / rate", "backlog growing", "rate / saturated throughput"
#: a probe's backlog check fails where more than this share of its replications grew (Clopper-Pearson)
BACKLOG_SHARE = 0.5
#: the saturated throughput times this must fail: the bracket's first upper end
UPPER_MARGIN = 1.05
#: the bracket's first lower end, as a share of the saturated throughput
LIGHT_LOAD = 0.1
#: halvings of the lower end, and doublings of the upper end, tried at most
BRACKET_STEPS = 10
#: where no rate down to a thousandth of the light load passes, rates this
#: share of the upper end apart are probed from the top down (see the module
#: docstring): a criterion can fail at light load and pass at higher load
SCAN_STEP = 0.1
#: replications of a probe at first (two at least: an interval needs two)
FIRST_REPS = 3
#: independent searches by default: the capacity's interval is their answers' t-interval (4 degrees
#: of freedom: a 95% half-width of 1.24 standard deviations of one search's answer)
SEARCHES = 5
#: the finest rel_tol.  A bisection ends only when its bracket is within rel_tol of its midpoint;
#: near float64's resolution (2.2e-16) a midpoint is one of the bracket's ends, the bracket stops
#: narrowing and the search never ended (rel_tol = 1e-300 did so).  1e-9 keeps millions of float64
#: steps in every bracket, about 30 halvings from the first one, and lies far below what replications
#: can resolve (a probe's load interval is about 1e-5 wide even at 10^9 requests)
REL_TOL_MIN = 1e-9
#: find_capacity's own settings: their domains (the sweep spec's [capacity] table reads them)
SEARCH_DOMAINS = {"rel_tol": Domain(REL_TOL_MIN, 1.0, lo_closed=True), "confidence": Domain(0.0, 1.0),
                  "throughput_tol": Domain(0.0, 1.0)}


@dataclass(frozen=True)
class Objective:
    """Bounds on metrics of the run: each one set must hold, an upper bound
    (its t-interval at or below it) on every metric but ``goodput``, a
    lower bound (its t-interval at or above it) on the share of requests
    that met both their objectives on the time to first token and per
    output token (the workload's ``ttft_slo`` and ``tpot_slo``; Zhong et
    al., 2024, DistServe, arXiv:2401.09670, whose goodput is the largest
    rate with ``Objective(goodput=0.9)``).  Latencies and times to first token in s;
    times between tokens (``mean_tbt``, ``tbt_p50`` .. ``tbt_p99``) in
    s/token, e.g. 0.02 for 20 ms; SLA shares in [0, 1].  Each applies to the
    policies that report its metric (:data:`mbbatch.metrics.METRICS`): the
    time to first token's and between tokens' quantiles to every token-level
    policy, a cluster and continuous batching.

    ``classes``, on a :meth:`Workload.mixture <mbbatch.Workload.mixture>`:
    ``{name: Objective(...)}``, bounds on a class's own metrics, which its
    requests alone must meet (:data:`CLASS_METRICS`: ``mean_latency``,
    ``latency_p99``, ``mean_ttft``, ``ttft_p99`` and ``goodput``, the
    metrics :attr:`SimulationResult.classes <mbbatch.SimulationResult.classes>`
    reports); the bounds outside ``classes`` hold for the whole run.

    >>> Objective(latency_p95=30.0).latency_p95     # p95 latency at most 30 s
    30.0
    >>> Objective(mean_ttft=0.5, sla_violation_share=0.05).sla_violation_share
    0.05
    >>> Objective(ttft_p95=2.0, tbt_p99=0.02).describe()   # 2 s to the first token, 20 ms between tokens
    'ttft_p95 <= 2 and tbt_p99 <= 0.02'
    >>> Objective(goodput=0.9).describe()                  # 90 % of the requests within their objectives
    'goodput >= 0.9'
    >>> Objective(latency_p99=60.0, classes={"chat": Objective(ttft_p99=0.5)}).describe()
    "latency_p99 <= 60 and ttft_p99['chat'] <= 0.5"
    """

    latency_p50: float | None = None
    latency_p95: float | None = None
    latency_p99: float | None = None
    mean_latency: float | None = None
    mean_ttft: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    ttft_p99: float | None = None
    mean_tbt: float | None = None
    tbt_p50: float | None = None
    tbt_p95: float | None = None
    tbt_p99: float | None = None
    sla_violation_share: float | None = None
    sla_violation_tokens: float | None = None
    sla_violation_requests: float | None = None
    goodput: float | None = None
    # each class's objective, by class name: an argument, not a field (the fields are the metrics'
    # bounds, OBJECTIVE_METRICS), kept as the attribute ``classes`` (None: none)
    classes: InitVar[dict | None] = None

    def __post_init__(self, classes):
        object.__setattr__(self, "classes", None if classes is None else _check_classes(classes))
        for name in OBJECTIVE_METRICS:
            v = getattr(self, name)
            if v is None:
                continue
            share = name.startswith("sla_") or name in LOWER_BOUNDS
            dom = Domain(0.0, 1.0, lo_closed=True, hi_closed=True) if share else Domain(0.0, math.inf)
            object.__setattr__(self, name, check_scalar_real(name, v, dom))
        if not self.bounds() and not self.classes:
            raise ValueError(f"an Objective needs at least one bound: {', '.join(OBJECTIVE_METRICS)}, or "
                             "classes={name: Objective(...)}")

    def __eq__(self, other):
        """Equal bounds and equal classes (the hash is the dataclass's, of the fields alone: equal
        objectives have equal fields, and the classes' dict has no hash)."""
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.bounds() == other.bounds() and self.classes == other.classes

    def __repr__(self) -> str:
        given = f", classes={self.classes!r}" if self.classes is not None else ""
        return f"Objective({', '.join(f'{m}={getattr(self, m)!r}' for m in OBJECTIVE_METRICS)}{given})"

    def bounds(self) -> dict:
        """``{metric: bound}`` of the run's bounds set (not the classes')."""
        return {m: getattr(self, m) for m in OBJECTIVE_METRICS if getattr(self, m) is not None}

    def class_bounds(self) -> dict:
        """``{(class name, metric): bound}`` of the classes' bounds."""
        return {(name, m): x for name, o in (self.classes or {}).items() for m, x in o.bounds().items()}

    def criteria(self) -> dict:
        """``{criterion: bound}`` of every bound: the run's by metric, a
        class's as ``metric['name']`` (the names of a probe's criteria)."""
        return {**self.bounds(), **{_class_label(c, m): x for (c, m), x in self.class_bounds().items()}}

    def describe(self) -> str:
        return " and ".join(f"{c} {'>=' if _metric_of(c) in LOWER_BOUNDS else '<='} {x:g}"
                            for c, x in self.criteria().items())


def _class_label(name: str, metric: str) -> str:
    """A class's criterion, as a probe names it: ``ttft_p99['chat']``."""
    return f"{metric}[{name!r}]"


def _metric_of(criterion: str) -> str:
    """The metric a criterion bounds (a class's, :func:`_class_label`, or the run's)."""
    return criterion.split("[", 1)[0]


def _check_classes(classes) -> dict:
    """An Objective's ``classes``, checked: a non-empty dict of class names
    to objectives on the metrics a class reports (:data:`CLASS_METRICS`);
    returned as a new dict (the caller's may change)."""
    if not isinstance(classes, dict) or not classes:
        raise TypeError(f"classes must be a non-empty dict {{class name: Objective(...)}}; got {classes!r}")
    for name, objective in classes.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"classes: a class's name must be a non-empty string; got {name!r}")
        if not isinstance(objective, Objective):
            raise TypeError(f"classes[{name!r}] must be an Objective (bounds on the class's metrics); got "
                            f"{objective!r}")
        if objective.classes:
            raise ValueError(f"classes[{name!r}]: a class's objective bounds its own metrics; it takes no classes")
        other = [m for m in objective.bounds() if m not in CLASS_METRICS]
        if other:
            raise ValueError(f"classes[{name!r}]: {', '.join(other)} is not a metric of a class (the run reports "
                             f"{', '.join(CLASS_METRICS)} for each class, SimulationResult.classes)")
    return dict(classes)


@dataclass(frozen=True)
class Probe:
    """One probed rate: its replications, each criterion's ``(metric, mean,
    low, high, threshold, verdict)`` and the probe's verdict (``"pass"``,
    ``"fail"`` or ``"undecided"``)."""

    rate: float
    reps: int
    criteria: tuple
    verdict: str

    def row(self, metric: str) -> tuple:
        return next(c for c in self.criteria if c[0] == metric)

    def has(self, metric: str) -> bool:
        """Whether ``metric`` is one of its criteria (the load is not, for
        continuous batching: :class:`~mbbatch.policies.base.Carries`)."""
        return any(c[0] == metric for c in self.criteria)


@dataclass(frozen=True)
class Search:
    """One search on one seed set: its answer ``rate`` (where the binding
    criterion crosses its threshold, step 3 of the module docstring; 0 where
    no probed rate passes), its final ``bracket``
    (widened by the load's interval where stability decides it; from 0 to
    the lowest rate probed where none passes), the saturated throughput of
    its seeds, its ``probes`` in order, the requests it simulated, and
    whether every end of its bracket is a verdict (``resolved``), and each
    replication's saturated throughput (``saturated``)."""

    rate: float
    bracket: tuple
    saturated_throughput: float
    probes: tuple = field(repr=False)
    requests: int = 0
    resolved: bool = True
    #: each replication's saturated throughput (the first ones, and any more its probes needed)
    saturated: tuple = field(default=(), repr=False)


@dataclass(frozen=True)
class CapacityResult:
    """What :func:`find_capacity` found.

    ``rate`` is the mean of the answers of ``searches`` independent searches
    (each one's in :attr:`searches`); ``rate_ci`` its t-interval at
    ``confidence``, an interval for the capacity itself (NaN ends with one
    search: there is nothing to tell its spread from); ``bracket`` is the
    first search's final bracket (where that search stopped, not an
    interval of the capacity: see the module docstring), its upper end at
    most that of ``saturated_ci``, the t-interval of the saturated
    throughput over every saturated run of the searches (no rate above the
    saturated throughput is stable).  ``criterion`` says what was
    required; ``requests`` counts the simulated requests of every search,
    the saturated runs included; ``resolved`` is False when an end of some
    search's bracket moved to a probe that stayed undecided at the
    replication cap.
    """

    rate: float
    rate_ci: tuple
    bracket: tuple
    criterion: str
    confidence: float
    rel_tol: float
    saturated_throughput: float
    searches: tuple = field(repr=False)
    requests: int = 0
    resolved: bool = True
    seconds: float = 0.0
    kernel_seconds: float = 0.0
    saturated_ci: tuple = (math.nan, math.nan)

    @property
    def probes(self) -> tuple:
        """Every search's probes, search by search."""
        return tuple(p for s in self.searches for p in s.probes)

    @property
    def n_probes(self) -> int:
        return len(self.probes)

    @property
    def rate_low(self) -> float:
        warnings.warn("CapacityResult.rate_low is bracket[0], the first search's bracket; the capacity's "
                      "interval is rate_ci", DeprecationWarning, stacklevel=2)
        return self.bracket[0]

    @property
    def rate_high(self) -> float:
        warnings.warn("CapacityResult.rate_high is bracket[1], the first search's bracket; the capacity's "
                      "interval is rate_ci", DeprecationWarning, stacklevel=2)
        return self.bracket[1]

    def summary(self) -> str:
        ok = "" if self.resolved else " (unresolved: narrowed by probes undecided at the replication cap)"
        k = len(self.searches)
        if k > 1:
            ci = (f"{self.confidence:.0%} interval [{self.rate_ci[0]:.6g}, {self.rate_ci[1]:.6g}] over {k} "
                  "independent searches")
        else:
            ci = "one search, no interval (searches >= 2 give one)"
        return (f"capacity {self.rate:.6g} requests/s, {ci} ({self.criterion}; each verdict at "
                f"{self.confidence:.0%}; bracket of the first search [{self.bracket[0]:.6g}, "
                f"{self.bracket[1]:.6g}]){ok}; {self.n_probes} probes, {self.requests:.3g} requests simulated "
                f"in {self.seconds:.2f} s")

    def _repr_html_(self) -> str:
        """A notebook's view: the summary, then each search's answer and bracket."""
        import html

        rows = "".join(f"<tr><td>{j}</td><td style='text-align:right'>{s.rate:.6g}</td>"
                       f"<td>[{s.bracket[0]:.6g}, {s.bracket[1]:.6g}]</td><td>{len(s.probes)}</td>"
                       f"<td>{'yes' if s.resolved else 'no'}</td></tr>" for j, s in enumerate(self.searches))
        return (f"<p><b>CapacityResult</b>: {html.escape(self.summary())}</p><table><tr><th>search</th>"
                "<th>answer (requests/s)</th><th>bracket</th><th>probes</th><th>resolved</th></tr>"
                + rows + "</table>")

    def table(self):
        """The probes as an xarray-free table: a list of dicts, one per
        search, probe and criterion."""
        return [{"search": j, "rate": p.rate, "reps": p.reps, "metric": c[0], "mean": c[1], "low": c[2],
                 "high": c[3], "threshold": c[4], "verdict": c[5], "probe_verdict": p.verdict}
                for j, s in enumerate(self.searches) for p in s.probes for c in p.criteria]


def with_rate(arrivals, rate: float):
    """The arrival process ``arrivals`` at mean rate ``rate``, its shape kept:
    Poisson; Gamma with its CV; ON/OFF with its burst ratio (rate_off /
    rate_on) and its sojourns; a replay by its ``scale``
    (:meth:`mbbatch.arrivals.Arrivals.at_rate`)."""
    if not isinstance(arrivals, Arrivals):
        raise TypeError(f"arrivals must be Poisson, Gamma, OnOff or Replay (a process with a mean rate to set); "
                        f"got {type(arrivals).__name__}")
    return arrivals.at_rate(rate)


def check_search(policy, arrivals, servers, objective, rel_tol, confidence, max_reps, throughput_tol, n=None,
                 searches=SEARCHES, workload=None):
    """Raise what :func:`find_capacity` refuses in its own arguments (the
    simulation's are checked by :func:`mbbatch.simulation.plan`); returns
    ``rel_tol``, ``confidence`` and ``throughput_tol`` as floats."""
    if isinstance(arrivals, Arrivals) and arrivals.unassessed:
        raise TypeError(f"arrivals must have one mean rate to search (Poisson, Gamma, OnOff or Replay); got "
                        f"{type(arrivals).__name__}")
    with_rate(arrivals, 1.0)          # (refuses any other type)
    if servers == math.inf:
        raise ValueError("servers must be finite: infinitely many servers sustain every rate")
    if objective is not None and not isinstance(objective, Objective):
        raise TypeError(f"objective must be None (stability only) or an mb.Objective; got {objective!r}")
    # (the policy's kind as its description names it; anything else is refused by the plan)
    kind = policy.describe()["policy"] if hasattr(policy, "describe") else None
    if objective is not None and kind is not None:
        for m in objective.bounds():
            if kind not in METRICS[m].kinds:
                raise ValueError(f"objective: {m} is not a metric of {type(policy).__name__} (it applies to "
                                 f"{', '.join(sorted(METRICS[m].kinds))})")
    if objective is not None and objective.goodput is not None:
        if not getattr(workload, "has_objectives", False):
            raise ValueError("objective: goodput is the share of requests within their objectives, the workload's "
                             "ttft_slo and tpot_slo; the workload sets neither (Workload(..., ttft_slo=..., "
                             "tpot_slo=...))")
    if objective is not None and objective.classes:
        _check_class_objectives(objective, workload)
    reals = tuple(check_scalar_real(name, value, SEARCH_DOMAINS[name])
                  for name, value in (("rel_tol", rel_tol), ("confidence", confidence),
                                      ("throughput_tol", throughput_tol)))
    if isinstance(max_reps, bool) or not isinstance(max_reps, (int, np.integer)) or max_reps < FIRST_REPS:
        raise ValueError(f"max_reps must be an integer in [{FIRST_REPS}, inf); got {max_reps!r}")
    carries = policy.carries() if hasattr(policy, "carries") else None
    if carries is not None and carries.backlog and max_reps < backlog_reps(reals[1]):
        raise ValueError(f"max_reps must be at least {backlog_reps(reals[1])} for a capacity search of "
                         f"{type(policy).__name__} at confidence {reals[1]:g}: its backlog check decides each "
                         f"probe by the share of replications whose backlog grew, which fewer cannot show below "
                         f"one half; got {max_reps!r}")
    if isinstance(searches, bool) or not isinstance(searches, (int, np.integer)) or searches < 1:
        raise ValueError(f"searches must be an integer in [1, inf); got {searches!r}")
    least = min_requests(policy, servers)
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 0 < n < least:
        carries = policy.carries()
        times = _fills(carries)
        raise ValueError(f"n must be at least {least} requests per probe for a capacity search of "
                         f"{type(policy).__name__} on {servers} server(s) ({MIN_PROBE_REQUESTS} at least, and "
                         f"{times} times the {carries.held} requests a server holds at once): fewer leave a 99th "
                         f"percentile no more than the largest value, and a start-up and a drain that are much of "
                         f"the run and bias the capacity low; got n = {n}")
    return reals


def _check_class_objectives(objective: Objective, workload) -> None:
    """Raise what the classes' objectives refuse on ``workload``: classes
    of a workload that is not a mixture, a class it does not have, a
    class's goodput where the class sets no objective of its own."""
    from .workload import Mixture

    if not isinstance(workload, Mixture):
        raise ValueError(f"objective: classes bound the metrics of a Workload.mixture's classes; the workload is "
                         f"{'none' if workload is None else 'not a mixture'} (workload=Workload.mixture({{name: "
                         "(share, Workload)}}))")
    for name, o in objective.classes.items():
        if name not in workload.names:
            raise ValueError(f"objective: classes: no class {name!r} in the workload's mixture; its classes: "
                             f"{', '.join(map(repr, workload.names))}")
        part = workload.parts[workload.names.index(name)]
        if o.goodput is not None and not part.has_objectives:
            raise ValueError(f"objective: classes[{name!r}]: goodput is the share of the class's requests within "
                             f"its objectives, its workload's ttft_slo and tpot_slo; class {name!r} sets neither")


def backlog_reps(confidence: float) -> int:
    """The fewest replications whose backlogs, none of them growing, put the
    share that grows below one half at ``confidence`` (Clopper-Pearson: 6 at
    95 %): where the backlog decides, a probe passes with these at least
    (:data:`FIRST_REPS` decide one that fails on another criterion)."""
    alpha = (1.0 - float(confidence)) / 2.0
    return max(FIRST_REPS, math.floor(math.log(alpha) / math.log(BACKLOG_SHARE)) + 1)


def min_requests(policy, servers=1) -> int:
    """The fewest requests a capacity probe of ``policy`` on ``servers``
    servers may simulate: :data:`MIN_PROBE_REQUESTS`, and :data:`MIN_FILLS`
    times the requests its servers hold at once
    (:meth:`~mbbatch.policies.base.Policy.carries`)."""
    if not hasattr(policy, "carries"):
        return MIN_PROBE_REQUESTS        # (refused by the plan)
    carries = policy.carries()
    servers = servers if isinstance(servers, (int, np.integer)) and not isinstance(servers, bool) else 1
    return max(MIN_PROBE_REQUESTS, _fills(carries) * int(servers) * int(carries.held))


def _fills(carries) -> int:
    """How many times over a probe simulates the requests a policy's servers
    hold at once: :data:`MIN_TURNOVERS` for a continuous engine's slots,
    else :data:`MIN_FILLS`."""
    return MIN_TURNOVERS if carries.iterations else MIN_FILLS


#: the fewest requests a capacity probe may simulate, whatever the policy: a
#: 99th percentile of fewer is no more than the largest value, and the
#: backlog check's quarters would hold under 25 arrivals (see also
#: :func:`min_requests`)
MIN_PROBE_REQUESTS = 100
#: a capacity probe simulates at least this many times the requests its
#: policy's servers hold at once (:func:`min_requests`): batches that hold
#: their servers to completion fill this many times over
MIN_FILLS = 10
#: ... and a continuous engine's slots (:attr:`Carries.iterations`) turn over
#: this many times: a request holds its slot for its whole output, and the
#: run's drain (the longest outputs finishing alone) stays a few percent of
#: it (ContinuousBatching(max_num_seqs=32) on the H100 profile, log-normal
#: lengths: a capacity of 1.7 requests/s at n = 100, 7.0 at 1,280, 12.8 at
#: 4,000 and 13.3 at 20,000)
MIN_TURNOVERS = 100


def _busy_throughput(res) -> float:
    """What a saturated run's servers complete while busy: its throughput over
    its utilization (completed x servers / busy server-time).  Not the
    throughput alone: a run of finitely many requests ends with servers idle
    while the last batches finish, which puts its throughput below what they
    carry (0.7 % below Theorem 4.2's for MultiBin(3, 128) on 4 servers at n =
    60,000).  A continuous engine is busy while any sequence runs: its drain
    stays in."""
    u = res.utilization
    return res.throughput / u if math.isfinite(u) and u > 0 else res.throughput


class _Search:
    """The probes of one search: the same seeds at every rate, a plan per
    rate, replications added until decided."""

    def __init__(self, policy, arrivals, sim_kw, servers, objective, confidence, max_reps, throughput_tol,
                 seed, progress=False, label=""):
        self.policy, self.arrivals, self.sim_kw, self.servers = policy, arrivals, sim_kw, servers
        self.carries = policy.carries()
        # (the backlog check: a guard of the load, or decisive at every probe)
        self.guards = () if self.carries.backlog else GUARDS
        self.label = label      # (which search, in the progress lines)
        self.bounds = objective.bounds() if objective is not None else {}
        # (each class's bounds: criterion -> (class, metric, bound), read from each run's classes)
        self.class_bounds = {_class_label(c, m): (c, m, x)
                             for (c, m), x in (objective.class_bounds() if objective is not None else {}).items()}
        self.confidence, self.max_reps, self.throughput_tol = confidence, max_reps, throughput_tol
        root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        self.root = root
        self.probes, self.requests, self.kernel_seconds = [], 0, 0.0
        self.seen = {}          # rate -> Probe: a rate probed again (an undecided neighbour) is not rerun
        self.progress, self.t0 = progress, time.perf_counter()
        self.saturated = {}     # replication -> its saturated run's throughput (busy)

    def say(self, text: str) -> None:
        """A progress line on stderr (with ``progress``)."""
        if self.progress:
            print(f"find_capacity: {self.label}{text} [{time.perf_counter() - self.t0:.1f} s, "
                  f"{self.requests:.3g} requests]",
                  file=sys.stderr, flush=True)

    def seed(self, rep: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(self.root.entropy, spawn_key=(*self.root.spawn_key, rep))

    def saturated_throughput(self) -> float:
        """The mean of the first replications' saturated throughputs (:func:`_busy_throughput`)."""
        sat = float(np.mean([self.saturated_of(r) for r in range(FIRST_REPS)]))
        self.say(f"saturated throughput {sat:.6g} requests/s")
        return sat

    def saturated_of(self, rep: int) -> float:
        """Replication ``rep``'s saturated throughput: its seed's requests all
        waiting at time 0 (run once, the first time a probe needs it)."""
        if rep not in self.saturated:
            run = plan(self.policy, Saturated(), servers=self.servers, **self.sim_kw)
            res = run_plan(run, self.seed(rep), warn=False)
            self.requests += run.n
            self.kernel_seconds += res.kernel_seconds
            self.saturated[rep] = _busy_throughput(res)
        return self.saturated[rep]

    def probe(self, rate: float) -> Probe:
        if rate in self.seen:
            return self.seen[rate]
        run = plan(self.policy, with_rate(self.arrivals, rate), servers=self.servers, **self.sim_kw)
        values = {LOAD: [], THROUGHPUT: [], SATURATION: [], **{m: [] for m in self.bounds},
                  **{c: [] for c in self.class_bounds}}
        growing = []
        reps = 0
        target = FIRST_REPS
        while True:
            for r in range(reps, target):
                res = run_plan(run, self.seed(r), warn=False)
                self.kernel_seconds += res.kernel_seconds
                # (the plan's servers: LAPS's instances; a cluster's engines' servers, all of them)
                values[LOAD].append(rate * res.mean_batch_service / (res.servers * res.mean_batch_size))
                values[THROUGHPUT].append(res.throughput / rate)
                values[SATURATION].append(rate / self.saturated_of(r))
                growing.append(bool(res.unstable))
                for m in self.bounds:
                    values[m].append(getattr(res, m))
                for c, (name, m, _) in self.class_bounds.items():
                    values[c].append(res.classes[name][m])
            self.requests += (target - reps) * run.n
            reps = target
            rows = self._criteria(values, growing)
            verdict = _verdict(rows, at_cap=reps >= self.max_reps, guards=self.guards)
            if verdict != "undecided" or reps >= self.max_reps:
                break
            target = min(2 * reps, self.max_reps)
        p = Probe(rate=float(rate), reps=reps, criteria=tuple(rows), verdict=verdict)
        self.probes.append(p)
        self.seen[rate] = p
        self.say(f"probe {len(self.probes)}: {rate:.6g} requests/s {verdict} after {reps} replications")
        return p

    def _criteria(self, values, growing) -> list:
        rows = []

        def row(metric, x, threshold):
            """An upper bound: passes when the interval lies at or below it (a
            lower bound, :data:`LOWER_BOUNDS`: at or above it)."""
            m, lo, hi = stats.t_interval(np.asarray(x, float), self.confidence)
            if _metric_of(metric) in LOWER_BOUNDS:
                v = "pass" if lo >= threshold else "fail" if hi < threshold else "undecided"
            else:
                v = "pass" if hi <= threshold else "fail" if lo > threshold else "undecided"
            if math.isnan(m):
                v = "fail"   # (nothing completed)
            rows.append((metric, m, lo, hi, threshold, v))

        # the load: the arrival rate against the service rate at the run's batching (where a batch holds
        # its servers to completion: Carries.load)
        if self.carries.load:
            row(LOAD, values[LOAD], LOAD_LIMIT)
        # the throughput keeps up: decided as the others, undecided (more replications) where its interval
        # holds the floor
        m, lo, hi = stats.t_interval(np.asarray(values[THROUGHPUT], float), self.confidence)
        floor = 1.0 - self.throughput_tol
        v = "pass" if lo >= floor else "fail" if hi < floor or math.isnan(m) else "undecided"
        rows.append((THROUGHPUT, m, lo, hi, floor, v))
        # the backlog check of results and sweeps: the share of the replications whose backlog grew,
        # against one half (Clopper-Pearson); a guard of the load, or decisive (Carries.backlog)
        k, reps = int(sum(growing)), len(growing)
        low, high = _st.binomtest(k, reps).proportion_ci(self.confidence, method="exact")
        v = "fail" if low > BACKLOG_SHARE else "pass" if high < BACKLOG_SHARE else "undecided"
        rows.append((BACKLOG, k / reps, float(low), float(high), BACKLOG_SHARE, v))
        # no rate above the saturated throughput of the same policy and seeds is stable: the rate over
        # each replication's saturated throughput, paired (the same requests), decided as the load
        row(SATURATION, values[SATURATION], 1.0)
        for metric, bound in self.bounds.items():
            row(metric, values[metric], bound)
        # each class's bounds, decided as the run's: the t-interval of the class's value over the replications
        for c, (_, _, bound) in self.class_bounds.items():
            row(c, values[c], bound)
        return rows


#: the backlog check of results and sweeps, which decides a probe of a policy with a load
#: (:attr:`Carries.backlog` False) only where the load cannot, at the replication cap
GUARDS = (BACKLOG,)


def _verdict(rows, at_cap: bool, guards: tuple = GUARDS) -> str:
    """A probe's verdict from its criteria: it fails if any criterion but
    the ``guards`` fails, passes if they all pass.

    The guards are the backlog check where the policy has a load
    (:attr:`Carries.backlog` False; the search passes ``()`` where the
    backlog decides every probe).  A guard decides only a probe still
    undecided at the replication cap (``at_cap``): it fails where more than
    half of the replications' backlogs grew (at the confidence level), or
    every one did; it passes where fewer than half grew (at that level), or
    none did, and only the load or the throughput is undecided.  No probe
    above the saturated throughput passes (its criterion fails there; a
    short run's backlog check misses such an overload: a probe at 1.05 times
    it passed with none of its 1,149 requests' runs flagged).

    Not before the cap: near the limit a stable queue run for finitely many
    requests still shows the transient growth those checks look for (every
    replication of a probe at 99.7 % of Theorem 4.2's capacity flags a
    growing backlog at n = 200,000), so it would put the limit below the
    theorem's.  And not only to fail: a policy whose batches grow with the
    load (dynamic batching) keeps its servers busy over a wide range of rates
    below its limit, where the load is 1 within any interval the
    replications give (0.996 to 1.001 from 22 to 33 calls/s for 8 Autellix
    engines stable up to 40, n = 200,000), and an undecided load there
    left the answer anywhere in that range (21 to 36 calls/s as ``max_reps``
    went from 32 to 8).  Whether such a probe is stable is whether its
    backlog grows."""
    decisive = [c[5] for c in rows if c[0] not in guards]
    if "fail" in decisive:
        return "fail"
    if all(v == "pass" for v in decisive):
        return "pass"
    if at_cap:
        guard = [c for c in rows if c[0] in guards]
        if any(c[5] == "fail" or c[1] == 1.0 for c in guard):
            return "fail"
        undecided = {c[0] for c in rows if c[0] not in guards and c[5] == "undecided"}
        if guard and undecided <= {LOAD, THROUGHPUT} and all(c[5] == "pass" or c[1] == 0.0 for c in guard):
            return "pass"
    return "undecided"


def _interval(probes, lo: float, hi: float) -> tuple:
    """The capacity's interval: the final bracket ``[lo, hi]``, widened by
    the uncertainty of the load where stability decides it.

    The load is proportional to the rate at a fixed batching, so a probe at
    rate r whose load has the t-interval [a, b] puts the stable limit, the
    rate of load 1, in [r / b, r / a].  When the probe at ``hi`` failed on
    the load (stability binds), the bracket is widened to hold that interval
    at both its ends.  A bracket an objective decided is its own interval."""
    at = {p.rate: p for p in probes}
    top = at.get(hi)
    if top is None or top.verdict != "fail" or not top.has(LOAD) or top.row(LOAD)[5] != "fail":
        return lo, hi
    low, high = lo, hi
    for p in (at.get(lo), top):
        if p is None or p.verdict == "undecided":
            continue
        a, b = p.row(LOAD)[2:4]
        if a > 0 and b > 0:
            low, high = min(low, p.rate / b), max(high, p.rate / a)
    return low, high


def _crossing(probes, lo: float, hi: float, guards: tuple = GUARDS) -> float:
    """A search's answer: where the criterion that binds crosses its
    threshold, read from the means of its probes.

    The binding criteria are those that fail at the lowest failing probe at
    or above ``lo``, and those undecided at the replication cap at the probes
    between ``lo`` and it (``guards`` aside).  For each, its means over the probes in rate order
    (common random numbers make them smooth in the rate) are joined by lines
    and the crossing of the threshold nearest the final bracket ``[lo,
    hi]`` is taken (a criterion can cross more than once: the paper's model's
    latency first falls with the rate); the answer is the lowest of them,
    kept between the highest rate that passed below it and the lowest that
    failed above it.  Where no criterion's means cross, the bracket's
    midpoint.

    Not the midpoint itself: every search of one policy bisects nearly the
    same grid of rates (its ends are set by the saturated throughput), so
    the midpoints of different seeds share one rounding error of up to
    ``rel_tol / 2``, which an interval over the searches cannot see (five
    searches of MultiBin(4, 128) put Theorem 4.2's 9.970 below their 95%
    interval [9.975, 9.999] that way); and where probes stay undecided at
    the replication cap the bracket ends wherever the undecided region let
    it (a static-batching search under a p95 bound ended in [1.367, 1.385]
    while its probes' p95 crossed the bound between 1.229 and 1.303)."""
    ordered = sorted(probes, key=lambda p: p.rate)
    failing = [p for p in ordered if p.rate >= lo and p.verdict == "fail"]
    if hi <= lo or not failing:
        return 0.5 * (lo + hi)
    ceiling = min(p.rate for p in failing)
    binding = [c[0] for c in failing[0].criteria if c[5] == "fail" and c[0] not in guards]
    # (and those undecided at the replication cap below it: the limit lies within their resolution there)
    for p in ordered:
        if lo <= p.rate < ceiling and p.verdict == "undecided":
            binding += [c[0] for c in p.criteria if c[5] == "undecided" and c[0] not in guards + tuple(binding)]
    passed = [p.rate for p in ordered if p.verdict == "pass" and p.rate <= hi]
    floor = max(passed) if passed else lo
    mid = 0.5 * (lo + hi)
    found = []
    for metric in binding:
        # (throughput / rate and the lower bounds are floors: below them fails; the others are ceilings)
        sign = -1.0 if metric == THROUGHPUT or _metric_of(metric) in LOWER_BOUNDS else 1.0
        pts = [(p.rate, sign * (p.row(metric)[1] - p.row(metric)[4])) for p in ordered]
        pts = [(r, d) for r, d in pts if math.isfinite(d)]
        crossings = [r0 + (r1 - r0) * (-d0) / (d1 - d0) for (r0, d0), (r1, d1) in zip(pts, pts[1:])
                     if d0 <= 0 < d1]
        if crossings:
            found.append(min(crossings, key=lambda r: abs(r - mid)))
    if not found:
        return mid
    return min(max(min(found), floor), ceiling)


def find_capacity(policy, *, arrivals=None, service=None, workload=None, service_model=None, servers=1,
                  objective=None, rel_tol=0.01, confidence=0.95, n=100_000, seed=0, max_reps=24,
                  throughput_tol=0.05, searches=SEARCHES, progress=False) -> CapacityResult:
    """The largest arrival rate ``policy`` sustains: stable, and within
    ``objective`` if given, with its confidence interval (see the module
    docstring for the criteria and the method).

    Parameters
    ----------
    policy : a policy of :data:`mbbatch.registry.POLICIES`
        MultiBin, StaticBatching, DynamicBatching, MultiBinDynamic,
        ShortestPredictedFirst, ContinuousBatching, Cluster, LAPS or
        Disaggregated (:func:`find_split` searches its splits).
    arrivals : Poisson, Gamma, OnOff or Replay, optional
        The shape of the arrival process (default Poisson); its rate is what
        the search sets.
    service, workload, service_model, servers, n
        As :func:`mbbatch.simulate` (``servers`` finite).
    objective : Objective, optional
        Bounds on latency or SLA metrics, of the run and (``classes``, on a
        :meth:`Workload.mixture <mbbatch.Workload.mixture>`) of each class;
        stability is required as well.
    rel_tol : float
        A search ends when its bracket is within this share of its midpoint;
        in [1e-9, 1) (:data:`REL_TOL_MIN`).
    confidence : float
        Level of each criterion's t-interval over the replications, and of
        the capacity's interval over the searches.
    seed : int or SeedSequence
        Replication ``r`` of every probe of a search uses the same seed
        (common random numbers); the first search's seeds are the children
        ``r`` of ``seed``, search ``j >= 1``'s the children ``r`` of its child
        ``j`` (independent of every other).
    max_reps : int
        Replications of a probe at most.
    throughput_tol : float
        A probe whose throughput interval lies below ``(1 - throughput_tol)``
        times its rate fails.
    searches : int
        Independent searches (default :data:`SEARCHES`): the capacity is the
        mean of their answers, ``rate_ci`` its t-interval; 1 gives no
        interval (and costs a fifth).
    progress : bool
        Print a line on stderr for the saturated runs and for each probe
        (its rate, verdict and replications), with the time and requests so
        far: a search at large ``n`` takes minutes.

    Returns
    -------
    CapacityResult
    """
    t0 = time.perf_counter()
    arrivals = Poisson(rate=1.0) if arrivals is None else arrivals
    # (the reals as floats from here on: a Fraction or a numpy scalar reads as any float)
    rel_tol, confidence, throughput_tol = check_search(policy, arrivals, servers, objective, rel_tol, confidence,
                                                       max_reps, throughput_tol, n, searches, workload)
    progress = check_flag("progress", progress)
    sim_kw = {"service": service, "workload": workload, "service_model": service_model, "n": n}
    # (every argument checked now, before any work: the plan refuses what simulate would)
    plan(policy, with_rate(arrivals, 1.0), servers=servers, **sim_kw)
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    criterion = "stable" + (f" and {objective.describe()}" if objective is not None else "")
    found, kernel_seconds = [], 0.0
    for j in range(int(searches)):
        seeds = root if j == 0 else np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, j))
        s = _Search(policy, arrivals, sim_kw, servers, objective, confidence, max_reps, throughput_tol, seeds,
                    progress, label=f"search {j + 1} of {searches}: " if searches > 1 else "")
        found.append(_search(s, rel_tol))
        kernel_seconds += s.kernel_seconds
    answers = np.array([f.rate for f in found])
    rate, low, high = stats.t_interval(answers, confidence)
    # no rate above the saturated throughput is stable: nor is the interval's upper end above the
    # saturated throughput's (every saturated run of every search)
    sat, sat_low, sat_high = stats.t_interval(np.concatenate([f.saturated for f in found]), confidence)
    if math.isfinite(high) and math.isfinite(sat_high):
        high = min(high, sat_high)
    out = CapacityResult(rate=rate, rate_ci=(low, high), bracket=found[0].bracket, criterion=criterion,
                         confidence=confidence, rel_tol=rel_tol,
                         saturated_throughput=sat, saturated_ci=(sat_low, sat_high),
                         searches=tuple(found), requests=sum(f.requests for f in found),
                         resolved=all(f.resolved for f in found), seconds=time.perf_counter() - t0,
                         kernel_seconds=kernel_seconds)
    if progress:
        print(f"find_capacity: {out.summary()}", file=sys.stderr, flush=True)
    return out


def _search(s: _Search, rel_tol: float) -> Search:
    """One search on the seeds of ``s``: bracket, then bisect (the module docstring's steps 1 and 2)."""
    sat = s.saturated_throughput()
    if not (math.isfinite(sat) and sat > 0):
        # (batches that never fill: a MultiBin engine's, each seeing fewer than batch_size requests)
        raise ValueError(f"n: the saturated runs of n = {s.sim_kw['n']} requests completed none, so there is no "
                         f"rate to search below their throughput ({sat}); make n larger")

    def result(lo, hi, resolved=True, rate=None):
        out = Search(rate=_crossing(s.probes, lo, hi, s.guards) if rate is None else rate,
                     bracket=_interval(s.probes, lo, hi),
                     saturated_throughput=sat, probes=tuple(s.probes), requests=s.requests, resolved=resolved,
                     saturated=tuple(s.saturated[r] for r in sorted(s.saturated)))
        s.say(f"{out.rate:.6g} requests/s, bracket [{out.bracket[0]:.6g}, {out.bracket[1]:.6g}]")
        return out

    hi = UPPER_MARGIN * sat
    for _ in range(BRACKET_STEPS):
        if s.probe(hi).verdict == "fail":
            break
        hi *= 2.0
    else:
        raise RuntimeError(f"no failing rate up to {hi:g} requests/s (the saturated throughput is {sat:g}): "
                           "the criterion does not bound the rate")
    top, lo = hi, LIGHT_LOAD * sat
    for _ in range(BRACKET_STEPS):
        v = s.probe(lo).verdict
        if v == "pass":
            break
        hi = min(hi, lo) if v == "fail" else hi
        lo *= 0.5
    else:
        # nothing passes at light load or below: the paper's model, whose batches fill slowly at low
        # rates, can pass at higher load only (its latency falls with the rate, then rises near
        # saturation); the highest passing rate above the light load, if any, starts the bisection
        floor, hi, v = hi, top, None
        for j in range(1, round(1 / SCAN_STEP)):
            rate = top * (1.0 - j * SCAN_STEP)
            if rate <= LIGHT_LOAD * sat:
                break
            v = s.probe(rate).verdict
            if v == "pass":
                lo = rate
                break
            hi = rate if v == "fail" else hi
        if v != "pass":
            # no rate passes (the lowest probed fails too): the capacity is 0, and the bracket says
            # how far down that was checked
            return result(0.0, floor, resolved=True, rate=0.0)
    unverified = False
    while hi - lo > rel_tol * 0.5 * (lo + hi):
        mid = 0.5 * (lo + hi)
        v = s.probe(mid).verdict
        if v == "pass":
            lo = mid
        elif v == "fail":
            hi = mid
        else:
            # undecided at the cap: the limit is near mid, within the probes' resolution.  The
            # bracket narrows from both sides, to the points halfway to its ends: each kept as a
            # verdict where one of them decides, else narrowed without one (and so reported)
            a, b = 0.5 * (lo + mid), 0.5 * (mid + hi)
            va = s.probe(a).verdict
            if va == "fail":
                hi = a
                continue
            lo = a
            unverified |= va == "undecided"
            vb = s.probe(b).verdict
            if vb == "pass":
                lo = b
            else:
                hi = b
                unverified |= vb == "undecided"
    return result(lo, hi, resolved=not unverified)


@dataclass(frozen=True)
class SplitResult:
    """What :func:`find_split` found: ``capacities[p]``, the capacity of ``p``
    prefill and ``engines - p`` decode engines; ``best``, the ``p`` of the
    largest; ``colocated``, the capacity of a cluster of the same ``engines``
    running both phases (None where not asked)."""

    engines: int
    capacities: dict
    best: int
    colocated: CapacityResult | None = None

    @property
    def rate(self) -> float:
        """The best split's capacity."""
        return self.capacities[self.best].rate

    def table(self) -> str:
        """A line per split: ``p:d``, its capacity and interval."""
        rows = [f"{p}:{self.engines - p}  {c.rate:10.3f}  [{c.rate_ci[0]:.3f}, {c.rate_ci[1]:.3f}]"
                + ("  <- best" if p == self.best else "") for p, c in self.capacities.items()]
        if self.colocated is not None:
            c = self.colocated
            rows.append(f"colocated {c.rate:10.3f}  [{c.rate_ci[0]:.3f}, {c.rate_ci[1]:.3f}]")
        return "\n".join(rows)


def find_split(engines: int, *, prefill=None, decode=None, kv_transfer=None, router: str = "least_used",
               decode_model=None, colocated: bool = False, **search) -> SplitResult:
    """The prefill:decode split of ``engines`` engines that carries the
    most (:class:`~mbbatch.Disaggregated`; Zhong et al., 2024, DistServe,
    arXiv:2401.09670, search the goodput-optimal split the same way): for
    each ``p`` from 1 to ``engines - 1``, the capacity (:func:`find_capacity`
    with ``search``: ``workload``, ``service_model``, ``objective``, ``n``,
    ``seed``, ...) of ``Disaggregated(prefill, decode, p, engines - p,
    kv_transfer, router, decode_model)``, every split on the same seeds;
    ``colocated``: also that of ``Cluster(prefill, engines, router)``, the
    same engines each running both phases.  A :class:`~mbbatch.LAPS`
    ``prefill`` is the pool of each split with its ``instances`` set to
    ``p`` (its long instances derived again; LAPS's router; ``colocated``
    then runs the decode engine's settings): each split is the one its
    prefill policy's stage declares (:data:`.planners.disaggregated.STAGES`,
    ``split`` and ``colocated``).  The best split is the largest capacity (ties: fewer prefill
    engines)."""
    from .planners.disaggregated import STAGES
    from .policies.cluster import Cluster
    from .policies.disaggregated import Disaggregated

    if isinstance(engines, bool) or not isinstance(engines, (int, np.integer)) or not 2 <= engines <= 2 ** 20:
        raise ValueError(f"engines: a split keeps one engine in each pool at least, an integer in [2, 2**20]; got "
                         f"{engines!r}")
    # (a deployment of the two refuses a prefill policy that declares no stage, naming those that do)
    stage = STAGES[Disaggregated(prefill=prefill, decode=decode).prefill.prefill_stage]
    pools = [Disaggregated(decode=decode, decode_engines=int(engines) - p, kv_transfer=kv_transfer,
                           decode_model=decode_model, **stage.split(prefill, p, router))
             for p in range(1, int(engines))]
    caps = {pol.prefill_engines: find_capacity(pol, **search) for pol in pools}
    best = max(caps, key=lambda p: (caps[p].rate, -p))
    together = None
    if check_flag("colocated", colocated):
        # (the engine the prefill stage names: ContinuousBatching() where not given)
        engine = stage.colocated(pools[0])
        together = find_capacity(Cluster(engine, engines=int(engines), router=router), **search)
    return SplitResult(engines=int(engines), capacities=caps, best=best, colocated=together)
