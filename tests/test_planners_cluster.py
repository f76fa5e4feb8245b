"""A cluster of engines behind a router (mb.Cluster): one engine equals the
single-engine run bit for bit; the simulated Autellix router makes the
LoadBalancer's decision at every step of the run's event sequence; the
invariants of routing, engine removal and KV reuse."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

import mbbatch as mb
from mbbatch.metrics import applicable
from mbbatch.planners.common import call_streams
from mbbatch.routing import LoadBalancer
from mbbatch.traces import Trace

WL = mb.Workload(prompt=stats.uniform(1, 1999), output=stats.uniform(1, 127))
ENGINE_POLICIES = [mb.StaticBatching(batch_size=8), mb.DynamicBatching(),
                   mb.MultiBinDynamic(bins=3, warmup=50)]


def _run(policy, rate, n, seed, workload=WL, **kw):
    return mb.simulate(policy, mb.Poisson(rate), workload=workload, n=n, seed=seed, keep_requests=True,
                       keep_batches=True, **kw)


# --- one engine ---------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ENGINE_POLICIES, ids=["static", "dynamic", "multibin_dynamic"])
@pytest.mark.parametrize("router", ["round_robin", "least_used", "autellix"])
def test_one_engine_equals_the_single_engine_run(policy, router):
    """E = 1: every shared metric, request and batch record equal, bit for bit."""
    one = _run(policy, 25.0, 3000, 7, servers=2)
    cl = _run(mb.Cluster(policy, engines=1, router=router), 25.0, 3000, 7, servers=2)
    assert cl.kind == "cluster"
    shared = set(applicable(one.kind)) & set(applicable("cluster")) - {"unstable"}
    assert {"throughput", "mean_latency", "latency_p99", "mean_ttft", "utilization"} <= shared
    for m in shared:
        a, b = getattr(one, m), getattr(cl, m)
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), m
    for c in one.requests.columns:
        np.testing.assert_array_equal(one.requests[c], cl.requests[c], err_msg=c)
    assert (cl.requests.engine == 0).all()
    for c in one.batches.columns:
        np.testing.assert_array_equal(one.batches[c], cl.batches[c], err_msg=c)
    np.testing.assert_array_equal(one.edges, cl.edges)


# --- the router against the LoadBalancer ----------------------------------------------------------

def _replay_balancer(res, cluster):
    """Replay the run's event sequence (completions, then engine events, then
    arrivals at equal times) into a LoadBalancer; returns each request's
    engine by the balancer's decisions and the requests it routed again."""
    req = res.requests
    n = len(req)
    pid = req.program if cluster.programs is not None else np.arange(n)
    last = {}
    for i in range(n):
        last[int(pid[i])] = i
    lb = LoadBalancer(threshold=cluster.threshold)
    for e in range(cluster.engines):
        lb.register_engine(e)
    registered_at = {e: -math.inf for e in range(cluster.engines)}
    engine = np.full(n, -1)
    queued = {e: [] for e in range(cluster.engines)}       # in the order they joined
    # events: (time, order, payload): completions 0, engine events 1, arrivals 2
    ev = [(float(req.completion[i]), 0, i) for i in range(n)]
    ev += [(e.time, 1, e) for e in cluster.events]
    ev += [(float(req.arrival[i]), 2, i) for i in range(n)]
    ev.sort(key=lambda x: (x[0], x[1], x[2] if isinstance(x[2], int) else 0))
    rerouted = 0

    def route(i):
        e = lb.route_request(int(pid[i]), int(req.prompt[i]))
        if last[int(pid[i])] == i:
            lb.remove_program(int(pid[i]))
        engine[i] = e
        queued[e].append(i)

    for t, kind, x in ev:
        if kind == 0:
            e = int(engine[x])
            if e in lb.engines and req.start[x] >= registered_at[e]:
                lb.complete_request(e, int(pid[x]))
        elif kind == 1:
            if x.action == "add":
                lb.register_engine(x.engine)
                registered_at[x.engine] = t
            else:
                lb.unregister_engine(x.engine)
                waiting = [i for i in queued[x.engine] if req.start[i] >= t]
                queued[x.engine] = []
                for i in waiting:
                    route(i)
                    rerouted += 1
        else:
            route(x)
    return engine, rerouted


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), engines=st.integers(1, 5), calls=st.integers(1, 6),
       threshold=st.sampled_from([0, 500, 2048, 6000, 10 ** 9]), think=st.sampled_from([0.0, 0.05, 1.0]),
       load=st.floats(0.3, 1.3), removals=st.integers(0, 2), closed=st.booleans())
def test_autellix_router_makes_the_load_balancers_decisions(seed, engines, calls, threshold, think, load,
                                                              removals, closed):
    """On random runs (programs, open or closed loop, loads up to overload,
    engines removed and added back) every request's engine is the
    LoadBalancer's decision."""
    rng = np.random.default_rng(seed)
    events = []
    for _ in range(removals if engines > 1 else 0):
        e = int(rng.integers(engines))
        t0 = float(rng.uniform(0.5, 8.0))
        events += [mb.EngineEvent(t0, e, "remove"), mb.EngineEvent(t0 + float(rng.uniform(0.1, 4.0)), e, "add")]
    events.sort(key=lambda x: x.time)
    # (overlapping removals of one engine are not a valid schedule: keep the consistent prefix)
    ok, state = [], set(range(engines))
    for x in events:
        if (x.action == "remove") == (x.engine in state) and (x.action == "add" or len(state) > 1):
            ok.append(x)
            (state.discard if x.action == "remove" else state.add)(x.engine)
    cluster = mb.Cluster(mb.DynamicBatching(), engines=engines, router="autellix", threshold=threshold,
                         programs=mb.Programs(calls=calls, think_time=think, closed=closed), events=ok)
    res = _run(cluster, 12.0 * engines * load, 400, seed)
    engine, rerouted = _replay_balancer(res, cluster)
    np.testing.assert_array_equal(res.requests.engine, engine)
    assert res.rerouted == rerouted


@pytest.mark.parametrize("router", ["least_used", "round_robin"])
def test_plain_routers_match_their_definitions(router):
    """Least-used is the LoadBalancer with every request small; round-robin
    takes the engines in turn."""
    cluster = mb.Cluster(mb.DynamicBatching(), engines=3, router=router)
    res = _run(cluster, 30.0, 600, 4)
    if router == "round_robin":
        np.testing.assert_array_equal(res.requests.engine, np.arange(600) % 3)
    else:
        engine, _ = _replay_balancer(res, mb.Cluster(mb.DynamicBatching(), engines=3, threshold=10 ** 9))
        np.testing.assert_array_equal(res.requests.engine, engine)


def test_threshold_above_every_prompt_is_least_used():
    """With the threshold above every prompt, Autellix routes as least-used."""
    programs = mb.Programs(calls=3, think_time=0.5)
    a = _run(mb.Cluster(engines=3, router="autellix", threshold=10 ** 9, programs=programs), 30.0, 2000, 5)
    b = _run(mb.Cluster(engines=3, router="least_used", programs=programs), 30.0, 2000, 5)
    np.testing.assert_array_equal(a.requests.engine, b.requests.engine)
    np.testing.assert_array_equal(a.requests.completion, b.requests.completion)
    assert a.mean_latency == b.mean_latency


def test_threshold_boundary_2048_small_2049_large():
    """A prompt of 2048 tokens is small, 2049 large (Autellix's default)."""
    prompts = np.tile([2048.0, 2049.0, 2049.0, 100.0], 50)
    wl = mb.Workload(prompt=prompts, output=np.full(200, 16.0))
    res = _run(mb.Cluster(engines=2), 5.0, 200, 1, workload=wl)
    assert res.large_share == pytest.approx(0.5)
    res = _run(mb.Cluster(engines=2, threshold=2049), 5.0, 200, 1, workload=wl)
    assert res.large_share == 0.0


# --- MultiBin engines ----------------------------------------------------------------------------

@pytest.mark.parametrize("arrivals", [mb.Poisson(0.04), mb.Saturated()], ids=["poisson", "saturated"])
@pytest.mark.parametrize("servers", [1, 3])
def test_one_multibin_engine_is_the_papers_model_bit_for_bit(arrivals, servers):
    """E = 1 with MultiBin engines (the event kernel waiting for full
    batches) equals MultiBin on its own kernel with the same lengths under
    the max model: every request's arrival and completion bit for bit,
    the requests of partial batches left unserved in both."""
    wl = mb.Workload(prompt=stats.lognorm(1.0, scale=300), output=stats.lognorm(0.8, scale=64))
    pol = mb.MultiBin(bins=3, batch_size=8, edges=[0.0, 40.5, 90.5, math.inf])
    kw = dict(arrivals=arrivals, workload=wl, service_model=mb.MaxModel(base=0.0, per_token=1.0), n=3000, seed=3,
              keep_requests=True, servers=servers)
    one = mb.simulate(pol, **kw)
    cl = mb.simulate(mb.Cluster(pol, engines=1, router="round_robin"), **kw)
    a, c = one.requests, cl.requests
    np.testing.assert_array_equal(a.arrival, c.arrival)
    np.testing.assert_array_equal(a.service, c.output)        # (seconds = tokens here)
    np.testing.assert_array_equal(a.completion, c.completion)  # NaN: left in a partial batch, in both
    assert one.completed == cl.completed < 3000 and one.mean_latency == cl.mean_latency
    assert cl.config["engine_policy"] == "multibin"


def test_multibin_engines_serve_full_batches_first_formed_first():
    """Autellix over MultiBin engines: every batch holds B requests of one
    bin, starts no earlier than its B-th arrival and, on each engine, in
    the order the batches formed; a request is served at most once, and at
    most B - 1 per bin and engine are left."""
    B, K, E = 8, 3, 3
    cluster = mb.Cluster(mb.MultiBin(bins=K, batch_size=B), engines=E, router="autellix",
                         programs=mb.Programs(calls=3, think_time=0.5))
    res = _run(cluster, 30.0, 4000, 5, servers=2)
    req, bat = res.requests, res.batches
    assert (bat.size == B).all() and res.completed == B * res.n_batches
    assert 4000 - res.completed <= E * K * (B - 1)
    served = np.isfinite(req.completion)
    ids, members = np.unique(req.batch[served], return_counts=True)
    assert (members == B).all() and ids.size == res.n_batches
    for e in range(E):
        on = served & (req.engine == e)
        formed, start, bins = {}, {}, {}
        for b_id, t, s, b in zip(req.batch[on], req.arrival[on], req.start[on], req.bin[on]):
            formed[b_id] = max(formed.get(b_id, -np.inf), t)
            start[b_id] = s
            bins.setdefault(b_id, set()).add(b)
        order = sorted(formed, key=lambda k: (start[k], k))
        assert all(len(bins[k]) == 1 for k in order)
        f = np.array([formed[k] for k in order])
        assert (np.array([start[k] for k in order]) >= f).all() and (np.diff(f) >= 0).all()


def test_multibin_engines_release_full_batches_only():
    with pytest.raises(ValueError, match="MultiBin engines release full batches only: max_wait must be inf"):
        mb.Cluster(mb.MultiBin(bins=2, batch_size=4, max_wait=5.0))


# --- invariants -------------------------------------------------------------------------------------

@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), router=st.sampled_from(["autellix", "least_used", "round_robin"]),
       engines=st.integers(2, 5), t_remove=st.floats(0.5, 5.0), down=st.floats(0.1, 5.0),
       closed=st.booleans())
def test_every_request_is_served_once_by_a_registered_engine(seed, router, engines, t_remove, down, closed):
    """Every request completes exactly once, on an engine registered when
    its batch started; none is lost when its engine leaves (open or closed
    loop)."""
    e = seed % engines
    events = [mb.EngineEvent(t_remove, e, "remove"), mb.EngineEvent(t_remove + down, e, "add")]
    cluster = mb.Cluster(mb.DynamicBatching(), engines=engines, router=router, events=events,
                         programs=mb.Programs(calls=3, think_time=0.2, closed=closed))
    res = _run(cluster, 14.0 * engines, 500, seed)
    req = res.requests
    assert res.completed == 500 and np.isfinite(req.completion).all()
    assert ((req.engine >= 0) & (req.engine < engines)).all()
    down_now = (req.engine == e) & (req.start >= t_remove) & (req.start < t_remove + down)
    assert not down_now.any()
    assert res.engine_completed.sum() == 500
    # each batch's members start and complete together on one engine
    assert len(np.unique(req.batch)) == res.n_batches


def test_removal_reroutes_the_queued_requests():
    """Removing a busy engine re-routes its queue (counted), and the engine
    serves nothing while it is out."""
    events = [mb.EngineEvent(2.0, 0, "remove"), mb.EngineEvent(6.0, 0, "add")]
    res = _run(mb.Cluster(engines=2, router="round_robin", events=events), 60.0, 1500, 2)
    req = res.requests
    assert res.rerouted > 0
    assert not ((req.engine == 0) & (req.start >= 2.0) & (req.start < 6.0)).any()
    assert ((req.engine == 0) & (req.start >= 6.0)).any()


def test_kv_reuse_locality():
    """KV reuse: without it every context is prefilled again; Autellix keeps
    large calls on their program's engine, so more calls find their context
    than under round-robin, and fewer context tokens are recomputed."""
    programs = mb.Programs(calls=6, think_time=0.5)
    kw = dict(engines=4, programs=programs)
    auto = _run(mb.Cluster(router="autellix", threshold=1024, **kw), 20.0, 6000, 3)
    rr = _run(mb.Cluster(router="round_robin", **kw), 20.0, 6000, 3)
    off = _run(mb.Cluster(router="autellix", threshold=1024, kv_reuse=False, **kw), 20.0, 6000, 3)
    assert auto.locality_hit_rate > rr.locality_hit_rate
    assert auto.kv_recomputed_tokens < rr.kv_recomputed_tokens
    assert off.locality_hit_rate == 0.0
    req = off.requests
    followups = req.new_tokens < req.prompt
    np.testing.assert_allclose(off.kv_recomputed_tokens * len(req),
                               float((req.prompt - req.new_tokens)[followups].sum()))
    # round-robin over 4 engines: a later call lands on its context's engine about a quarter of the time
    assert 0.15 < rr.locality_hit_rate < 0.35


def test_programs_contexts_grow_call_by_call():
    """A program's calls arrive in order; each call's prompt is the context
    before it (earlier prompts and outputs) plus its new tokens."""
    res = _run(mb.Cluster(engines=2, programs=mb.Programs(calls=4, think_time=1.0)), 10.0, 400, 9)
    req = res.requests
    for p in np.unique(req.program)[:30]:
        j = np.flatnonzero(req.program == p)
        assert np.all(np.diff(req.arrival[j]) >= 0)
        ctx = 0.0
        for i in j:
            assert req.prompt[i] == ctx + req.new_tokens[i]
            ctx = req.prompt[i] + req.output[i]


def test_programs_calls_sorted_in_the_kernel_or_by_numpy_alike(monkeypatch):
    """The calls' order from the kernel's bucket sort and from numpy's
    stable argsort (its fallback when the times are bunched) give the same
    run, bit for bit."""
    from mbbatch._kernels import programs as d
    from mbbatch.planners import cluster as planner

    monkeypatch.setattr(planner, "ORDER_CAP", 0)     # (the calls sorted all at once)
    cluster = mb.Cluster(engines=3, router="autellix", programs=mb.Programs(calls=3, think_time=0.5))
    fast = _run(cluster, 20.0, 2000, 4)
    calls = []

    def give_up(*args):
        calls.append(args)
        return False

    monkeypatch.setattr(d, "sort_calls", give_up)
    slow = _run(cluster, 20.0, 2000, 4)
    assert calls
    for c in fast.requests.columns:
        np.testing.assert_array_equal(fast.requests[c], slow.requests[c], err_msg=c)
    assert fast.mean_latency == slow.mean_latency


@pytest.mark.parametrize("think", [1.0, 0.0])
def test_chunked_order_equals_the_whole_sort(monkeypatch, think):
    """A run whose calls are put in order chunk by chunk gives what sorting
    them all at once gives (no room for chunks: ORDER_CAP 0), record for
    record, ties (think time 0) included."""
    from mbbatch.planners import cluster as planner

    cluster = mb.Cluster(engines=3, router="autellix", programs=mb.Programs(calls=4, think_time=think))
    monkeypatch.setattr(planner, "ORDER_CHUNK", 64)
    fast = _run(cluster, 20.0, 3000, 6)
    monkeypatch.setattr(planner, "ORDER_CAP", 0)
    slow = _run(cluster, 20.0, 3000, 6)
    for c in fast.requests.columns:
        np.testing.assert_array_equal(fast.requests[c], slow.requests[c], err_msg=c)
    assert fast.mean_latency == slow.mean_latency


@pytest.mark.parametrize("integer", [True, False])
def test_programs_draw_the_lengths_a_single_engine_run_draws(integer):
    """Common random numbers: with one call a program, call k's new tokens
    and output are the k-th draws of the prompt and output streams, the
    lengths a single-engine run on the same seed gives its request k (the
    kernels' drawers draw both, log-normal and Weibull included)."""
    wl = mb.Workload(prompt=stats.lognorm(1.0, scale=300), output=stats.weibull_min(1.5, scale=64),
                     integer_lengths=integer)
    cluster = mb.Cluster(engines=3, router="autellix", programs=mb.Programs(calls=1, think_time=0.0))
    res = _run(cluster, 5.0, 3000, 9, workload=wl)
    plain = _run(mb.DynamicBatching(), 5.0, 3000, 9, workload=wl)
    np.testing.assert_array_equal(res.requests.program, np.arange(3000))
    assert res.requests.new_tokens.tobytes() == plain.requests.prompt.tobytes()
    assert res.requests.output.tobytes() == plain.requests.output.tobytes()


# --- a trace's sessions as programs ----------------------------------------------------------------

def _session_trace(seed, m=600, sessions=60):
    """A trace of ``m`` requests over ``sessions`` sessions (and some calls
    without one), each session's prompts growing by its previous call's
    prompt and output plus a few new tokens (a stateless API's calls), but
    for a few calls that start over."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0.0, 60.0, m))
    sid = rng.integers(-1, sessions, m)
    prompt = np.empty(m, np.int64)
    output = rng.integers(1, 200, m)
    ctx = {}
    for i in range(m):
        new = int(rng.integers(1, 3000))
        s_ = int(sid[i])
        start_over = rng.uniform() < 0.1
        prompt[i] = new + (0 if s_ < 0 or start_over else ctx.get(s_, 0))
        if s_ >= 0:
            ctx[s_] = prompt[i] + output[i]
    return Trace(arrival=t, prompt_tokens=prompt, output_tokens=output, session=sid)


def _session_run(trace, n=None, **kw):
    cluster = mb.Cluster(mb.DynamicBatching(), engines=kw.pop("engines", 3), router=kw.pop("router", "autellix"),
                         threshold=kw.pop("threshold", 2048), programs=mb.Sessions(trace, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mb.TraceTiledWarning)
        return cluster, mb.simulate(cluster, mb.Replay(trace), workload=mb.Workload.from_trace(trace),
                                    service_model=mb.DecodeModel(prefill_per_token=1e-4), n=n or len(trace),
                                    seed=5, keep_requests=True)


@pytest.mark.parametrize("policy", ENGINE_POLICIES + [mb.MultiBin(bins=2, batch_size=4)],
                         ids=["static", "dynamic", "multibin_dynamic", "multibin"])
def test_closed_loop_calls_wait_for_the_call_before(policy):
    """Closed loop: with no think time each call arrives the instant the
    call before it completes; requests are numbered in arrival order, each
    program's calls in order with its context grown call by call, and its
    last call ends its session."""
    C = 4
    cluster = mb.Cluster(policy, engines=3, router="autellix", threshold=1000,
                         programs=mb.Programs(calls=C, think_time=0.0, closed=True))
    res = _run(cluster, 8.0, 2000, 11)
    req = res.requests
    arrived = req.program >= 0
    assert np.all(np.diff(req.arrival[arrived]) >= 0)
    served = np.isfinite(req.completion)
    order = np.lexsort((req.arrival, req.program))
    order = order[arrived[order]]
    p, a, c = req.program[order], req.arrival[order], req.completion[order]
    prompt, out, new = req.prompt[order], req.output[order], req.new_tokens[order]
    follow = p[1:] == p[:-1]
    np.testing.assert_array_equal(a[1:][follow], c[:-1][follow])      # (exact: arrival = completion + 0)
    np.testing.assert_array_equal(prompt[1:][follow], prompt[:-1][follow] + out[:-1][follow] + new[1:][follow])
    first = np.ones(p.size, bool)
    first[1:] = ~follow
    np.testing.assert_array_equal(prompt[first], new[first])
    # a program's calls: at most C, its next call only after its previous one is served
    counts = np.bincount(p)
    assert counts.max() <= C and (counts[:-1] == C).sum() > 0
    if isinstance(policy, mb.MultiBin):
        assert not served.all()      # partial batches wait: their programs stop there
    else:
        assert served.all() and arrived.all()


@pytest.mark.parametrize("closed", [False, True])
@pytest.mark.parametrize("engines", [1, 3])
def test_the_warmups_end_keeps_every_request_on_its_engine(engines, closed):
    """Multi-bin dynamic batching's warm-up ends at an arrival: that request
    counts on its engine's queue like any other, and every request is
    served (it was once left out of its engine's count: a request stuck in
    its queue, or a batch of none)."""
    cluster = mb.Cluster(mb.MultiBinDynamic(bins=3, warmup=50), engines=engines, router="autellix", threshold=1000,
                         programs=mb.Programs(calls=4, think_time=0.0, closed=closed))
    res = _run(cluster, 8.0, 600, 0)
    assert res.completed == 600 and np.isfinite(res.requests.completion).all()
    assert res.engine_completed.sum() == 600


def test_closed_loop_think_times_are_exponential_after_completion():
    """Closed loop: the gaps from a call's completion to its program's next
    call are exponential with mean think_time (Kolmogorov-Smirnov, p > 1e-4:
    a correct run fails with probability 1e-4)."""
    cluster = mb.Cluster(mb.DynamicBatching(), engines=2, programs=mb.Programs(calls=5, think_time=0.7, closed=True))
    req = _run(cluster, 10.0, 5000, 2).requests
    order = np.lexsort((req.arrival, req.program))
    p, a, c = req.program[order], req.arrival[order], req.completion[order]
    follow = p[1:] == p[:-1]
    gaps = a[1:][follow] - c[:-1][follow]
    assert gaps.size > 3000
    assert stats.kstest(gaps, stats.expon(scale=0.7).cdf).pvalue > 1e-4


def test_closed_loop_slows_programs_down_where_open_loop_does_not():
    """Overloaded (programs starting at 40 calls/s on two busy engines), a
    closed loop's calls wait for the calls before them, so its n calls take
    longer to arrive than the open loop's: its call rate falls."""
    kw = dict(engines=2, router="least_used")
    open_ = _run(mb.Cluster(programs=mb.Programs(calls=8, think_time=0.1), **kw), 40.0, 6000, 4)
    closed = _run(mb.Cluster(programs=mb.Programs(calls=8, think_time=0.1, closed=True), **kw), 40.0, 6000, 4)
    assert closed.requests.arrival.max() > 1.05 * open_.requests.arrival.max()


def test_closed_loop_refuses_a_lognormal_predictor():
    cluster = mb.Cluster(mb.MultiBinDynamic(bins=2, predictor=mb.LogNormalError(0.5)),
                         programs=mb.Programs(closed=True))
    with pytest.raises(ValueError, match="closed-loop programs take the oracle"):
        _run(cluster, 5.0, 100, 1)


def test_sessions_are_the_traces_programs():
    """Each session is one program, each call without a session one of its
    own; with the context included, a call that extends its session's
    context (the previous call's prompt and output) is new by the difference,
    one that does not is new whole; with it added, prompts grow call by call."""
    trace = _session_trace(1)
    _, res = _session_run(trace)
    req = res.requests
    np.testing.assert_array_equal(req.prompt, trace.prompt_tokens)
    sid = trace.session
    for s_ in range(60):
        j = np.flatnonzero(sid == s_)
        assert np.unique(req.program[j]).size == 1
        before = None
        for i in j:
            p = trace.prompt_tokens[i]
            extends = before is not None and p >= before
            assert req.new_tokens[i] == (p - before if extends else p)
            before = p + trace.output_tokens[i]
    alone = np.flatnonzero(sid < 0)
    assert np.unique(req.program[alone]).size == alone.size
    assert not np.isin(req.program[alone], req.program[sid >= 0]).any()
    np.testing.assert_array_equal(req.new_tokens[alone], trace.prompt_tokens[alone])
    # added: the trace's prompts are the new tokens
    _, res = _session_run(trace, context="added")
    req = res.requests
    np.testing.assert_array_equal(req.new_tokens, trace.prompt_tokens)
    for s_ in range(0, 60, 7):
        ctx = 0.0
        for i in np.flatnonzero(sid == s_):
            assert req.prompt[i] == ctx + trace.prompt_tokens[i]
            ctx = req.prompt[i] + req.output[i]


def test_sessions_route_as_the_load_balancer_and_end_at_their_last_call():
    """The simulated router makes the LoadBalancer's decisions on a trace's
    sessions, clearing each session at its last call; a trace repeated end
    to end makes each copy's sessions new ones."""
    trace = _session_trace(2, m=400)
    for n in (400, 1000):
        cluster, res = _session_run(trace, n=n, threshold=1500)
        engine, rerouted = _replay_balancer(res, cluster)
        np.testing.assert_array_equal(res.requests.engine, engine)
        assert rerouted == 0
    prog = res.requests.program
    assert not np.isin(prog[400:800], prog[:400]).any()
    np.testing.assert_array_equal(np.diff(prog[:800].reshape(2, 400), axis=0)[0],
                                  np.full(400, mb.Sessions(trace).count))


def test_sessions_locality_autellix_beats_round_robin():
    """Autellix keeps a session's large calls on its engine: more calls find
    their context there than under round-robin, fewer tokens are recomputed."""
    trace = _session_trace(3, m=1500, sessions=100)
    _, auto = _session_run(trace, engines=4, threshold=1024)
    _, rr = _session_run(trace, engines=4, router="round_robin")
    assert auto.locality_hit_rate > rr.locality_hit_rate
    assert auto.kv_recomputed_tokens < rr.kv_recomputed_tokens


def test_sessions_are_checked():
    with pytest.raises(ValueError, match="no sessions"):
        mb.Sessions(Trace(arrival=np.arange(3.0), prompt_tokens=np.ones(3, np.int64),
                          output_tokens=np.ones(3, np.int64)))
    with pytest.raises(ValueError, match="ids"):
        mb.Sessions([0, -2, 1])
    with pytest.raises(TypeError, match="ids"):
        mb.Sessions([0.5, 1.0])
    with pytest.raises(ValueError, match="context"):
        mb.Sessions([0, 1], context="whole")
    assert mb.Sessions([7, -1, 7, 3, -1]).ids.tolist() == [0, 1, 0, 2, 3]
    trace = _session_trace(4, m=50)
    with pytest.raises(ValueError, match="Workload.from_trace"):
        mb.simulate(mb.Cluster(programs=mb.Sessions(trace)), mb.Replay(trace), workload=WL, n=50)


def test_same_seed_same_cluster_run():
    cluster = mb.Cluster(engines=3, programs=mb.Programs(calls=3, think_time=0.3),
                         events=[mb.EngineEvent(1.0, 1, "remove")])
    a, b = _run(cluster, 30.0, 1500, 11), _run(cluster, 30.0, 1500, 11)
    for c in a.requests.columns:
        np.testing.assert_array_equal(a.requests[c], b.requests[c])


# --- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(engines=0), "engines"),
    # (the router's scan packs an engine's id in ENGINE_BITS bits)
    (dict(engines=2 ** 20 + 1), r"engines must be an integer in \[1, 1048576\]"),
    (dict(router="random"), "router"),
    (dict(threshold=-1), "threshold"),
    (dict(policy=mb.LAPS()), "policy"),
    (dict(events=[mb.EngineEvent(1.0, 5)]), "engine must be in"),
    (dict(events=[mb.EngineEvent(1.0, 0, "add")]), "in the cluster already"),
    (dict(engines=1, events=[mb.EngineEvent(1.0, 0)]), "keeps one engine"),
    (dict(events=mb.EngineEvent(1.0, 0)), "list of EngineEvent"),
])
def test_bad_cluster_is_refused(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        mb.Cluster(**kw)


def test_bad_event_and_programs_are_refused():
    with pytest.raises(ValueError, match="time"):
        mb.EngineEvent(-1.0, 0)
    with pytest.raises(ValueError, match="action"):
        mb.EngineEvent(1.0, 0, "pause")
    with pytest.raises(ValueError, match="calls"):
        mb.Programs(calls=0)
    with pytest.raises(TypeError, match="Poisson"):
        mb.simulate(mb.Cluster(programs=mb.Programs()), mb.Gamma(1.0, 2.0), workload=WL, n=10)


def test_a_program_of_more_calls_than_the_run_draws_the_runs_only():
    """Programs(calls=10**8) at n = 10 draws 10 calls (it tried 10**8 of
    each stream, 4 GB); the calls drawn are those the longer draw gives: n =
    10 of a 12-call program are the first 10 of n = 12's, bit for bit,
    open loop and closed."""
    wl = mb.Workload(prompt=stats.lognorm(0.6, scale=256), output=stats.lognorm(1.0, scale=64))
    kw = dict(workload=wl, seed=0, service_model=mb.DecodeModel(prefill_per_token=1e-4), keep_requests=True)
    for closed in (False, True):
        huge = _run(mb.Cluster(engines=2, programs=mb.Programs(calls=10 ** 8, closed=closed)), 5.0, 10, 0,
                    workload=wl, service_model=kw["service_model"])
        assert huge.completed == 10 and np.all(huge.requests.program == 0)
        r10, r12 = (mb.simulate(mb.Cluster(engines=2, programs=mb.Programs(calls=12, closed=closed)),
                                mb.Poisson(5.0), n=m, **kw).requests for m in (10, 12))
        for col in ("arrival", "prompt", "output", "new_tokens"):
            np.testing.assert_array_equal(getattr(r10, col), getattr(r12, col)[:10], err_msg=col)


# --- prefix caching on continuous-batching engines, and the cache-aware router ---------------------

H100 = "H100/vLLM/Meta-Llama-3-8B/tp1"


def _prompted(count, share=1.0):
    return mb.Workload(prompt=stats.lognorm(0.6, scale=256), output=stats.lognorm(0.8, scale=128),
                       system_prompts=mb.SystemPrompts(length=2048, count=count, share=share))


def test_cache_aware_routing_keeps_each_system_prompt_on_fewer_engines():
    """32 system prompts of 2,048 tokens on 4 engines of 48,000 KV tokens (an
    engine cannot hold them all): behind least-used routing every engine
    sees every prompt and evicts; the cache-aware router sends a prompt where
    it is cached, so on the same requests it hits more (by at least 15
    points: 0.86 against 0.51 on this seed) and evicts less (530 blocks
    against 342,690).  The engines' counts are summed: no request is lost.
    The router's KV reuse metrics are NaN: the engines' caches tell."""
    runs = {}
    for router in ("least_used", "cache_aware"):
        cl = mb.Cluster(mb.ContinuousBatching(prefix_caching=True, max_num_seqs=64, kv_tokens=48_000), engines=4,
                        router=router)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mb.UnstableWarning)
            runs[router] = mb.simulate(cl, mb.Poisson(50.0), workload=_prompted(32), n=6000, seed=1,
                                       service_model=mb.profiles.get(H100), keep_requests=True)
    least, aware = runs["least_used"], runs["cache_aware"]
    np.testing.assert_array_equal(least.requests.prompt, aware.requests.prompt)
    assert aware.prefix_hit_rate > least.prefix_hit_rate + 0.15
    assert aware.kv_evictions < least.kv_evictions
    assert aware.completed == least.completed == 6000
    assert not np.array_equal(least.requests.engine, aware.requests.engine)
    assert math.isnan(aware.locality_hit_rate) and math.isnan(aware.kv_recomputed_tokens)


def test_sessions_cache_their_context_on_continuous_engines():
    """A trace's sessions on prefix-caching continuous engines: each session
    is a chain its calls extend, so a call finds its context's blocks where
    its session ran before.  Behind Autellix (a session's large calls kept
    on its engine) the engines hit; the prefill saved per call is at most
    the context a call shares (its prompt but its new tokens).  On the same
    calls the mean time to first token falls between the engines' without
    any reuse (every call prefills its whole context: 19 s here, overloaded)
    and Autellix's KV reuse, whose contexts are kept outside the engines'
    memory and never evicted (0.3 s); the cache, bounded by the memory,
    evicts (4.2 s)."""
    trace = _session_trace(7, m=1200, sessions=80)
    runs = {}
    for caching, reuse in ((False, False), (True, False), (False, True)):
        cl = mb.Cluster(mb.ContinuousBatching(prefix_caching=caching, kv_tokens=200_000), engines=3,
                        threshold=1024, programs=mb.Sessions(trace), kv_reuse=reuse)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mb.TraceTiledWarning)
            runs[caching, reuse] = mb.simulate(cl, mb.Replay(trace), workload=mb.Workload.from_trace(trace),
                                               service_model=mb.profiles.get(H100), n=len(trace), seed=5,
                                               keep_requests=True)
    none, on, unbounded = runs[False, False], runs[True, False], runs[False, True]
    np.testing.assert_array_equal(on.requests.prompt, none.requests.prompt)
    context = (on.requests.prompt - on.requests.new_tokens).mean()
    assert 0 < on.prefix_saved_tokens <= context
    assert on.prefix_hit_rate > 0.2 and on.kv_evictions > 0
    assert none.mean_ttft > on.mean_ttft > unbounded.mean_ttft
    assert math.isnan(none.prefix_hit_rate) and unbounded.locality_hit_rate > 0


@pytest.mark.parametrize("cluster, workload, match", [
    (lambda: mb.Cluster(mb.DynamicBatching(), router="cache_aware"), None, "prefix_caching=True"),
    (lambda: mb.Cluster(mb.ContinuousBatching(), router="cache_aware"), None, "prefix_caching=False"),
    (lambda: mb.Cluster(mb.ContinuousBatching(prefix_caching=True), programs=mb.Programs(calls=2)),
     _prompted(4), "system_prompts"),
    (lambda: mb.Cluster(mb.DynamicBatching()), _prompted(4), "DynamicBatching engines"),
    (lambda: mb.Cluster(mb.ContinuousBatching(prefix_caching=True), router="cache_aware", cache_threshold=1.5),
     None, "cache_threshold"),
    (lambda: mb.Cluster(mb.ContinuousBatching(prefix_caching=True), router="cache_aware", balance_rel=0.5),
     None, "balance_rel"),
])
def test_prefix_caching_clusters_are_checked(cluster, workload, match):
    """The cache-aware router needs engines that cache prefixes; a cluster's
    programs carry no system prompts; system prompts need continuous
    engines; the router's settings are in their ranges.  Each refused by
    name, before any run."""
    with pytest.raises(ValueError, match=match):
        mb.simulate(cluster(), mb.Poisson(1.0), workload=workload or _prompted(4), n=100,
                    service_model=mb.profiles.get(H100))


def _states(streams):
    return [g.bit_generator.state for g in (streams.arrival, streams.prompt, streams.output)]


@pytest.mark.parametrize("closed", [False, True])
def test_a_runs_calls_drawn_again_are_the_draw_kept_and_leave_the_streams_as_it_did(closed):
    """A plan's programs' calls asked again on fresh streams of the same
    seed (a run's checks, then the run) are the draw it kept, the same
    arrays, and leave the streams where the draw left them; another seed,
    or another plan sharing the cluster's part (another rate), draws its
    own, equal to a fresh part's draw."""
    from dataclasses import replace

    from mbbatch.simulation import _plan

    wl = mb.Workload(prompt=stats.uniform(1, 50), output=stats.uniform(1, 50))
    pol = mb.Cluster(mb.ContinuousBatching(max_num_seqs=8), engines=2,
                     programs=mb.Programs(calls=3, think_time=0.5, closed=closed))
    plan = _plan(pol, mb.Poisson(2.0), None, 300, 1, False, wl, None, False)
    part = plan.cluster
    first = call_streams(np.random.SeedSequence(5))
    got = part.calls(plan, first)
    again = call_streams(np.random.SeedSequence(5))
    assert part.calls(plan, again) is got
    assert repr(_states(again)) == repr(_states(first))

    def fresh(p, seed):
        s = call_streams(np.random.SeedSequence(seed))
        return replace(p.cluster).calls(p, s), _states(s)

    def equal(a, b):
        for x, y in zip(a, b):
            if isinstance(x, dict):
                assert sorted(x) == sorted(y)
                equal([x[k] for k in sorted(x)], [y[k] for k in sorted(y)])
            elif isinstance(x, tuple):
                equal(x, y)
            else:
                np.testing.assert_array_equal(x, y)

    other = call_streams(np.random.SeedSequence(6))
    mine = part.calls(plan, other)
    want, after = fresh(plan, 6)
    equal(mine, want)
    assert repr(_states(other)) == repr(after)
    faster = replace(plan, arrivals=mb.Poisson(4.0))
    assert faster.cluster is part
    s = call_streams(np.random.SeedSequence(6))
    mine = part.calls(faster, s)
    want, after = fresh(faster, 6)
    equal(mine, want)
    assert repr(_states(s)) == repr(after)
    starts = (lambda c: c[3]["start"]) if closed else (lambda c: c[0])
    assert not np.array_equal(starts(mine), starts(part.calls(plan, call_streams(np.random.SeedSequence(6)))))
