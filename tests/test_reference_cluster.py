"""The cluster's event kernel (``mb.Cluster``) against the plain-Python
discrete-event reference of tests/reference_cluster.py, request by request:
each request's engine, batch start and completion, and the routing counters
behind ``locality_hit_rate``, ``kv_recomputed_tokens``, ``rerouted``,
``large_share`` and ``load_imbalance``, all equal bit for bit.

The reference takes the kernel's requests (``keep_requests=True``: their
arrivals, prompts, outputs, predictions, programs and new tokens) and
simulates the routing, queues and servers from the documented rules alone.
"""

from __future__ import annotations

import itertools
import math
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import stats

import mbbatch as mb
from mbbatch.traces import Trace

from .reference_cluster import reference_cluster

WL = mb.Workload(prompt=stats.uniform(1, 1999), output=stats.uniform(1, 127))
#: about 3.3 s for a batch of four: a server serves about 1.2 requests/s
MODEL = mb.DecodeModel(beta=0.02, gamma=0.5, prefill_per_token=1e-4)
N = 1500
#: the coarse grid of replayed arrival times, s: many arrivals share an instant
GRID = 0.5
THRESHOLD = 1024
B = 4
#: a multi-bin engine's bins, output tokens (the workload's outputs are 1 .. 128)
EDGES = np.array([0.0, 40.0, 90.0, np.inf])
#: requests/s per server: about 85% of what a server serves
PER_SERVER = 1.0


@dataclass(frozen=True)
class Case:
    """One configuration: the router, engines and servers per engine, the
    requests (``workload``: see :data:`WORKLOADS`), KV reuse, engine events
    and the engines' batching (``static`` or ``multibin``)."""

    router: str
    engines: int
    servers: int
    workload: str
    kv: bool = False
    events: bool = False
    batching: str = "static"

    @property
    def id(self) -> str:
        return "-".join([self.router, f"E{self.engines}", f"c{self.servers}", self.workload, self.batching]
                        + (["kv"] if self.kv else []) + (["events"] if self.events else []))


#: the requests: no programs on Poisson arrivals, or on arrival times replayed on a coarse grid;
#: open-loop programs (Poisson starts); a trace's sessions, replayed at its own times or on the grid
WORKLOADS = ("poisson", "grid", "programs", "sessions", "sessions_grid")
PROGRAM_WORKLOADS = ("programs", "sessions", "sessions_grid")


def _cases():
    cases = []
    for router, E, c, w in itertools.product(("round_robin", "least_used", "autellix"), (1, 2, 3, 8), (1, 2),
                                             WORKLOADS):
        for kv, ev in itertools.product((False, True) if w in PROGRAM_WORKLOADS else (False,),
                                        (False, True) if E > 1 else (False,)):
            cases.append(Case(router, E, c, w, kv, ev))
    for router, E, w, ev in itertools.product(("round_robin", "least_used", "autellix"), (2, 3),
                                              ("poisson", "grid", "programs", "sessions_grid"), (False, True)):
        cases.append(Case(router, E, 1, w, w in PROGRAM_WORKLOADS, ev, "multibin"))
    return cases


CASES = _cases()


def _seed(text: str) -> int:
    """A case's seed, from its parameters (not its place in the list)."""
    return zlib.crc32(text.encode())


def _session_trace(rng, n: int, times) -> Trace:
    """A trace of ``n`` calls at ``times``: within each window of 24
    consecutive calls, six sessions of about four calls each (and a few
    calls of no session), so that a session's calls wait in the queues
    together; a call's prompt is its session's context (its previous call's
    prompt and output) plus 1 .. 1000 new tokens, one in ten starting over."""
    window = np.arange(n) // 24
    sid = np.where(rng.uniform(size=n) < 0.05, -1, window * 6 + rng.integers(0, 6, n))
    output = rng.integers(1, 129, n)
    prompt = np.empty(n, np.int64)
    ctx = {}
    for i in range(n):
        new = int(rng.integers(1, 1001))
        s = int(sid[i])
        prompt[i] = new + (ctx.get(s, 0) if s >= 0 and rng.uniform() >= 0.1 else 0)
        if s >= 0:
            ctx[s] = int(prompt[i] + output[i])
    return Trace(arrival=times, prompt_tokens=prompt, output_tokens=output, session=sid)


def _events(E: int, horizon: float) -> list:
    """Engine 0 out and back, then engine E - 1 out (at the instant engine 0
    comes back) and back; on the grid, so that the events share instants
    with arrivals."""
    t1, t2, t3 = (math.floor(f * horizon / GRID) * GRID for f in (0.2, 0.45, 0.75))
    return [mb.EngineEvent(t1, 0, "remove"), mb.EngineEvent(t2, 0, "add"), mb.EngineEvent(t2, E - 1, "remove"),
            mb.EngineEvent(t3, E - 1, "add")]


def build(case: Case, n: int = N) -> tuple:
    """The case's cluster and the rest of its ``mb.simulate`` arguments."""
    rng = np.random.default_rng(_seed(case.id + "/inputs"))
    rate = PER_SERVER * case.engines * case.servers
    horizon = n / rate
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    if case.workload.endswith("grid"):
        times = np.floor(times / GRID) * GRID
    programs, arrivals, workload = None, mb.Replay(times), WL
    if case.workload == "poisson":
        arrivals = mb.Poisson(rate)
    elif case.workload == "programs":
        programs, arrivals = mb.Programs(calls=4, think_time=1.0), mb.Poisson(rate)
    elif case.workload.startswith("sessions"):
        trace = _session_trace(rng, n, times)
        programs, arrivals, workload = mb.Sessions(trace), mb.Replay(trace), mb.Workload.from_trace(trace)
    policy = mb.MultiBin(bins=3, batch_size=B, edges=EDGES) if case.batching == "multibin" else \
        mb.StaticBatching(batch_size=B)
    cluster = mb.Cluster(policy, engines=case.engines, router=case.router, threshold=THRESHOLD,
                         programs=programs, kv_reuse=case.kv,
                         events=_events(case.engines, horizon) if case.events else [])
    return cluster, dict(arrivals=arrivals, workload=workload, service_model=MODEL, n=n, servers=case.servers,
                         seed=_seed(case.id), keep_requests=True)


def simulate(cluster, kwargs):
    with warnings.catch_warnings():
        # (short runs near saturation: the backlog may grow; the comparison holds either way)
        warnings.simplefilter("ignore", mb.UnstableWarning)
        return mb.simulate(cluster, **kwargs)


def reference_of(res, cluster, model=MODEL, **rules):
    """The reference on the kernel's requests of ``res`` (run under ``model``)."""
    r = res.requests
    programs = cluster.programs is not None
    multibin = isinstance(cluster.policy, mb.MultiBin)
    if isinstance(model, mb.IterationModel):
        rules = {**rules, "iteration": model}
        model = mb.DecodeModel()    # (its fields unused)
    return reference_cluster(
        r.arrival, r.prompt, r.output, engines=cluster.engines, servers=res.servers // cluster.engines,
        batch_size=cluster.policy.batch_size, router=cluster.router, threshold=cluster.threshold,
        program=r.program if programs else None, new_tokens=r.new_tokens if programs else None,
        kv_reuse=cluster.kv_reuse, events=cluster.events, beta=model.beta, gamma=model.gamma,
        prefill_per_token=model.prefill_per_token, edges=cluster.policy.edges if multibin else None,
        pred=r.pred if multibin else None, **rules)


def _same(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b


def differences(res, ref) -> dict:
    """What the kernel's run and the reference disagree on: the first request
    whose engine, start or completion differs, and each metric that differs
    (NaN equals NaN), with both values."""
    r = res.requests
    out = {}
    bad = ~(_same(r.engine, ref.engine) & _same(r.start, ref.start) & _same(r.completion, ref.completion))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        out["request"] = (i, f"{int(bad.sum())} differ; kernel: engine {r.engine[i]}, start {r.start[i]!r}, "
                             f"completion {r.completion[i]!r}; reference: engine {ref.engine[i]}, "
                             f"start {ref.start[i]!r}, completion {ref.completion[i]!r}")
    for name, value in ref.metrics().items():
        got = getattr(res, name)
        if not (got == value or (math.isnan(got) and math.isnan(value))):
            out[name] = (got, value)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_kernel_equals_the_reference_request_by_request(case):
    cluster, kwargs = build(case)
    res = simulate(cluster, kwargs)
    assert differences(res, reference_of(res, cluster)) == {}


#: engines timed iteration by iteration: a batch's prefill counts only the tokens its engine does not
#: hold (KV reuse), its decode steps attend over the whole context
ITERATION = [mb.IterationModel(setup=0.01, step=5e-3, prefill_per_token=1e-4, per_sequence=2e-4,
                               per_context_token=1e-7, finished=f) for f in ("leave", "stay")]


@pytest.mark.parametrize("model", ITERATION, ids=lambda m: m.finished)
@pytest.mark.parametrize("case", CASES[::12], ids=[c.id for c in CASES[::12]])
def test_the_kernel_equals_the_reference_under_the_iteration_model(case, model):
    cluster, kwargs = build(case)
    res = simulate(cluster, {**kwargs, "service_model": model})
    assert differences(res, reference_of(res, cluster, model)) == {}


def _runs_differ(a, b) -> bool:
    """Whether two reference runs differ in a request's engine, start or
    completion, or in a metric."""
    same = all(_same(x, y).all() for x, y in ((a.engine, b.engine), (a.start, b.start),
                                               (a.completion, b.completion)))
    ma, mb_ = a.metrics(), b.metrics()
    return not same or any(not (ma[k] == mb_[k] or (math.isnan(ma[k]) and math.isnan(mb_[k]))) for k in ma)


@pytest.mark.parametrize("case_id, rule", [
    ("round_robin-E2-c1-grid-static", "held_instants"),
    ("least_used-E3-c2-sessions_grid-static-kv", "held_instants"),
    ("least_used-E2-c1-sessions-static-kv-events", "forget_context_at_last_call"),
    ("autellix-E3-c2-sessions_grid-static-kv-events", "forget_context_at_last_call"),
    ("round_robin-E2-c1-programs-static-kv-events", "verdict_at_first_routing"),
    ("autellix-E8-c2-sessions-static-kv-events", "verdict_at_first_routing"),
])
def test_the_configurations_exercise_the_rules_the_kernel_once_broke(case_id, rule):
    """The comparison is not vacuous: in these of its configurations, the
    rules the kernel once broke (commit 1925cf4) decide the outcome.  Bug 1:
    a free server takes waiting requests at an instant whose last arrival
    found its own engine busy, the next arrival before any completion (a
    kernel that takes arrivals until one finds its engine free runs past
    it).  Bugs 2 and 3: the reference under the old rule differs."""
    case = next(c for c in CASES if c.id == case_id)
    cluster, kwargs = build(case)
    res = simulate(cluster, kwargs)
    ref = reference_of(res, cluster)
    if rule == "held_instants":
        assert ref.held_instants
    else:
        assert _runs_differ(ref, reference_of(res, cluster, **{rule: True}))


# --- regressions: hand-made runs on two engines of one server --------------------------------------

#: 10 ms a token decoded, 1 ms a token prefilled: a prefill of a few hundred tokens shows in the times
SLOW = mb.DecodeModel(beta=0.01, gamma=0.0, prefill_per_token=1e-3)


def _hand_run(rows, policy, *, router="round_robin", events=(), sessions=False):
    """The cluster of two engines of one server each, ``router``, ``events``
    and the engines' ``policy``, on the requests ``rows``: (arrival s,
    session or -1, prompt, output tokens), replayed in order (the sessions
    the programs, with KV reuse, when ``sessions``); returns the cluster,
    the kernel's run and the reference's."""
    t, sid, prompt, output = (np.array(col) for col in zip(*rows))
    trace = Trace(arrival=t.astype(float), prompt_tokens=prompt.astype(np.int64),
                  output_tokens=output.astype(np.int64), session=sid.astype(np.int64))
    cluster = mb.Cluster(policy, engines=2, router=router, programs=mb.Sessions(trace) if sessions else None,
                         kv_reuse=sessions, events=list(events))
    res = simulate(cluster, dict(arrivals=mb.Replay(trace), workload=mb.Workload.from_trace(trace),
                                 service_model=SLOW, n=len(rows), servers=1, seed=0, keep_requests=True))
    np.testing.assert_array_equal(res.requests.arrival, t)
    np.testing.assert_array_equal(res.requests.output, output)
    return cluster, res, reference_of(res, cluster, SLOW)


def test_a_free_server_takes_waiting_requests_at_equal_timestamps():
    """Kernel bug 1 (fixed in 1925cf4).  Round robin over two engines: at
    0 s requests 0 (short) and 1 (20 s long) start on engines 0 and 1; at
    10 s request 2 goes to engine 0, idle, and request 3 to engine 1, busy.
    With batches formed at the end of the instant, a kernel whose arrival
    loop stops only at an arrival whose own engine has a free server takes
    request 3 and runs on to request 4 at 10.5 s: request 2 then starts at
    10.5 s with request 4.  The rule: engine 0's free server takes request
    2 at 10 s, and request 4 waits for it."""
    rows = [(0.0, -1, 10, 100), (0.0, -1, 10, 2000), (10.0, -1, 10, 50), (10.0, -1, 10, 50), (10.5, -1, 10, 50)]
    cluster, res, ref = _hand_run(rows, mb.StaticBatching(batch_size=4))
    # the input exercises it: at 10 s two arrivals go to different engines, the second to the busy
    # one, while the other engine's free server has a request waiting, and the next arrival comes
    # before any completion
    assert ref.engine[2] == 0 and ref.engine[3] == 1 and ref.completion[0] < 10.0 < ref.completion[1]
    assert ref.held_instants == [10.0]
    assert ref.start[2] == 10.0 and ref.start[4] == ref.completion[2] > 10.5
    assert differences(res, ref) == {}


def test_a_rerouted_call_after_its_programs_last_call_keeps_the_context():
    """Kernel bug 2 (fixed in 1925cf4).  A program's three calls: the first
    runs on engine 1; the second waits on engine 0 behind a 20 s request;
    the last runs on engine 1, which then holds the program's context (its
    most recent call's engine).  Engine 0 leaves at 4 s: the second call is
    rerouted to engine 1, which holds the context, so it prefills its 300
    new tokens only.  A kernel that forgets the context holder with the
    program-table entry at the last call prefills its whole 850.  (The
    call's verdict changes on the reroute, a miss then a hit: bug 3's
    ``locality_hit_rate`` shows here too.)"""
    rows = [(0.0, 9, 10, 2000), (0.1, 0, 500, 50), (2.0, 0, 850, 50), (3.0, 0, 1100, 50)]
    cluster, res, ref = _hand_run(rows, mb.StaticBatching(batch_size=1), sessions=True,
                                  events=[mb.EngineEvent(4.0, 0, "remove")])
    # the input exercises it: the second call is rerouted after the last call was routed, to the
    # engine of that last call, a hit only while the holder is kept
    (move,) = ref.reroutes
    assert (move.request, move.old_engine, move.new_engine) == (2, 0, ref.engine[3])
    assert move.after_last_call and move.new_hit and ref.prefill[2] == 300.0
    forgot = reference_of(res, cluster, SLOW, forget_context_at_last_call=True)
    assert forgot.prefill[2] == 850.0 and forgot.completion[2] != ref.completion[2]
    assert differences(res, ref) == {}


def test_the_hit_flag_after_a_reroute_is_the_serving_engines():
    """Kernel bug 3 (fixed in 1925cf4).  A program's first call runs on
    engine 0, which then holds its context; its second call is routed there
    (a hit) but waits behind a 20 s request.  Engine 0 leaves at 5 s and
    its contexts with it: the second call is rerouted to engine 1 and
    prefills its whole prompt (a miss); the third call, at 6 s, finds the
    context on engine 1 (a hit).  So one of two follow-ups is served where
    its context is: ``locality_hit_rate`` 0.5.  A kernel that keeps the
    verdict of a call's first routing counts two hits: 1.0."""
    rows = [(0.0, 0, 500, 50), (0.1, 9, 10, 2000), (2.0, 8, 10, 2000), (3.0, 7, 10, 10), (4.0, 0, 850, 50),
            (6.0, 0, 1000, 50)]
    cluster, res, ref = _hand_run(rows, mb.StaticBatching(batch_size=1), sessions=True,
                                  events=[mb.EngineEvent(5.0, 0, "remove")])
    # the input exercises it: the second call's verdict changes on its reroute (a hit, then a miss)
    (move,) = ref.reroutes
    assert (move.request, move.old_hit, move.new_hit) == (4, True, False)
    assert ref.metrics()["locality_hit_rate"] == 0.5
    assert reference_of(res, cluster, SLOW, verdict_at_first_routing=True).metrics()["locality_hit_rate"] == 1.0
    assert differences(res, ref) == {}


def test_a_batch_completed_by_a_reroute_waits_for_the_batches_formed_before_it():
    """A fourth departure this reference found: the kernel ordered full bins
    by their last member's arrival, not by when they filled.
    Multi-bin engines, batches of two, bins of outputs below and above 100
    tokens, round robin over two engines busy until about 10 s.  Engine 1
    holds a short request (2 s) in bin 0, and its bin 1 fills at 5.5 s.
    Engine 0 leaves at 6 s: its short request of 1 s is rerouted to engine
    1's bin 0, which fills then, at 6 s.  The rule, "a free server takes the
    batch that formed first": engine 1's server takes bin 1's batch (full
    at 5.5 s) first.  The kernel ordered full bins by their last member's
    arrival, here the rerouted request's 1 s, and took bin 0's first; it
    now orders them by when their last member joined the queue."""
    long_, short = 1000, 10
    rows = [(0.0, -1, 10, long_)] * 4 + [(1.0, -1, 10, short), (2.0, -1, 10, short), (3.0, -1, 10, long_),
                                         (4.0, -1, 10, long_), (5.0, -1, 10, long_), (5.5, -1, 10, long_)]
    policy = mb.MultiBin(bins=2, batch_size=2, edges=np.array([0.0, 100.0, np.inf]))
    cluster, res, ref = _hand_run(rows, policy, events=[mb.EngineEvent(6.0, 0, "remove")])
    # the input exercises it: request 4 (arrived at 1 s) fills engine 1's bin 0 at 6 s, after
    # bin 1 filled with requests 7 and 9 (at 5.5 s); the rule serves 7 and 9 first
    assert [(m.request, m.new_engine) for m in ref.reroutes][0] == (4, 1)
    assert ref.start[7] == ref.start[9] < ref.start[4] == ref.start[5]
    by_arrival = reference_of(res, cluster, SLOW, formed_at_last_arrival=True)
    assert by_arrival.start[4] < by_arrival.start[7]
    assert differences(res, ref) == {}
