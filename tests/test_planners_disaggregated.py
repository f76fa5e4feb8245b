"""Prefill/decode disaggregation (mb.Disaggregated) against a plain-Python
deployment: the plain-Python cluster of the plain-Python engine as the
prefill pool, each KV transfer computed from the link, and plain-Python
engines as the decode pool, request by request; the same requests as a
colocated cluster on the same seed; its metrics and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb

from . import reference_continuous as ref
from . import reference_laps as ref_laps
from .test_kernels_continuous import COEF
from .test_kernels_continuous_cluster import _reference_cluster

#: the reference engine's iteration cost (tests/test_kernels_continuous.py's), as an IterationModel
MODEL = mb.IterationModel(setup=0.0, step=COEF["step"], prefill_per_token=COEF["prefill_per_token"],
                          per_sequence=COEF["per_sequence"], per_context_token=COEF["per_context"])
WL = mb.Workload(prompt=st.lognorm(0.8, scale=256), output=st.lognorm(0.8, scale=64))


def _engine(rng, longest):
    """Random engine settings: slots, a budget (chunked or not), memory that binds or not."""
    chunked = bool(rng.random() < 0.5)
    bs = int(rng.choice([4, 16]))
    kv = float(rng.choice([math.inf, bs * (-(-longest * 2 // bs)), bs * (-(-longest * 8 // bs))]))
    return dict(max_num_seqs=int(rng.choice([2, 4, 16])), chunked_prefill=chunked, kv_tokens=kv, block_size=bs,
                max_batched_tokens=int(rng.choice([64, 256])) if chunked else int(max(longest, 512)))


def _reference(kw):
    """The reference engine's keywords of an engine's settings."""
    return dict(max_num_seqs=kw["max_num_seqs"], max_batched_tokens=kw["max_batched_tokens"],
                chunked=kw["chunked_prefill"], kv_tokens=kw["kv_tokens"], block_size=kw["block_size"],
                admission="fcfs", edges=np.array([10.0, 20.0]), **COEF)


@pytest.mark.parametrize("router", ["least_used", "round_robin"])
def test_a_deployment_is_the_plain_python_pools_request_by_request(router):
    """Over 5 random deployments per router (1 to 3 engines a pool, each
    pool's own settings, a random link): each request's prefill engine,
    first token, transfer, decode admission and completion equal a
    plain-Python deployment's: the plain-Python cluster behind the router
    on requests of one output token; the transfer ``latency + prompt x
    (bytes_per_token / bandwidth)``; the requests of more than one token,
    in the order of their first tokens (ties in arrival order), dealt in
    turn to plain-Python engines, each bringing its prompt's KV cache,
    pulled once admitted, and generating ``output - 1`` tokens; the
    prefill engines each hold a request's KV blocks until its pull lands
    (:func:`_landings`)."""
    rng = np.random.default_rng(["least_used", "round_robin"].index(router))
    waited = 0
    for _ in range(5):
        wl = mb.Workload(prompt=st.lognorm(0.6, scale=float(rng.uniform(20, 120))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))))
        pk, dk = _engine(rng, 2048), _engine(rng, 2048)
        ep, ed = (int(k) for k in rng.integers(1, 4, 2))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), latency=float(rng.choice([0.0, 0.005])),
                             bytes_per_token=float(rng.uniform(1e4, 3e5)))
        pol = mb.Disaggregated(prefill=mb.ContinuousBatching(**pk), decode=mb.ContinuousBatching(**dk),
                               prefill_engines=ep, decode_engines=ed, kv_transfer=link, router=router)
        res = mb.simulate(pol, mb.Poisson(float(rng.uniform(2, 20))), workload=wl, service_model=MODEL, n=200,
                          seed=int(rng.integers(1 << 30)), keep_requests=True)
        r = res.requests
        arr, p = r["arrival"], r["prompt"]
        n = len(arr)
        where, runs, mine, _ = _reference_cluster(arr, p, np.ones(n), p, ep, router, release=_landings(r),
                                                  **_reference(pk))
        first = _first_tokens(runs, mine, n)
        np.testing.assert_array_equal(r["prefill_engine"], where)
        np.testing.assert_array_equal(r["first_token"], first)
        waited += _check_decode_pool(res, first, link, ed, dk)
    assert waited >= 2          # (some requests waited for a decode engine: the comparison saw queues)


def test_a_decode_pool_behind_a_router_is_the_plain_python_cluster_of_prefilled_requests():
    """Over 5 random deployments (1 to 3 engines a pool), a decode pool
    behind the least-used router (``decode_router="least_used"``): each
    request of more than one token, at its first token (ties in arrival
    order), goes to the plain-Python cluster behind that router, bringing
    its prompt's KV cache, pulled once admitted, and generating ``output -
    1`` tokens; its decode
    engine, admission and completion equal it.  With one decode engine the
    deployment is the round-robin one, bit for bit (a closed loop's:
    :func:`test_closed_loop_programs_are_the_plain_python_deployment`)."""
    rng = np.random.default_rng(31)
    spread = 0
    for k in range(5):
        wl = mb.Workload(prompt=st.lognorm(0.6, scale=float(rng.uniform(20, 120))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))))
        pk, dk = _engine(rng, 2048), _engine(rng, 2048)
        ep, ed = int(rng.integers(1, 4)), 1 if k == 0 else int(rng.integers(2, 4))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), bytes_per_token=float(rng.uniform(1e4, 3e5)))
        kw = dict(prefill=mb.ContinuousBatching(**pk), decode=mb.ContinuousBatching(**dk), prefill_engines=ep,
                  decode_engines=ed, kv_transfer=link)
        run = dict(arrivals=mb.Poisson(float(rng.uniform(2, 20))), workload=wl, service_model=MODEL, n=200,
                   seed=int(rng.integers(1 << 30)), keep_requests=True)
        res = mb.simulate(mb.Disaggregated(**kw, decode_router="least_used"), **run)
        r = res.requests
        o, first = r["output"], r["first_token"]
        ready = first
        many = np.flatnonzero(o > 1)
        order = many[np.argsort(ready[many], kind="stable")]
        p = r["prompt"][order]
        where, runs, mine, _ = _reference_cluster(ready[order], p, o[order] - 1, o[order] - 1, ed, "least_used",
                                                  brought=p, pull=r["transfer_time"][order], **_reference(dk))
        completion, admitted = first.copy(), np.full(len(o), np.nan)
        for e in range(ed):
            if mine[e]:
                idx = order[mine[e]]
                completion[idx], admitted[idx] = runs[e]["completion"], runs[e]["admitted"]
        np.testing.assert_array_equal(r["decode_admitted"], admitted)
        np.testing.assert_array_equal(r["completion"], completion)
        np.testing.assert_array_equal(res.decode.requests["engine"], where)
        spread += len({len(m) for m in mine}) > 1 and ed > 1
        if ed == 1:
            dealt = mb.simulate(mb.Disaggregated(**kw), **run).requests
            for col in ("decode_admitted", "completion", "first_token"):
                np.testing.assert_array_equal(r[col], dealt[col], err_msg=col)
    assert spread >= 1          # (least used dealt the engines unequal shares: not round robin)


@pytest.mark.parametrize("router", ["least_used", "cache_aware"])
def test_a_prefix_caching_prefill_pool_is_the_plain_python_cluster(router):
    """Prefill engines caching prefixes, on requests a share of which carry
    one of a few system prompts, over 4 random deployments per router: each
    request's prefill engine and first token equal the plain-Python cluster
    of plain-Python prefix-caching engines (each system prompt a chain, the
    cache-aware router at a Cluster's default balance), its prompt (system
    prompt included) the one whose KV cache moves, and the decode pool the
    plain-Python engines' (:func:`_check_decode_pool`); the prefix metrics
    are the prefill pool's, and some requests hit."""
    from mbbatch._seeding import STREAM_SYSTEM, as_seed_sequence, stream

    rng = np.random.default_rng(20 + ["least_used", "cache_aware"].index(router))
    hits = 0
    for _ in range(4):
        system = mb.SystemPrompts(length=int(rng.choice([16, 64, 100])), count=int(rng.integers(1, 5)),
                                  share=float(rng.uniform(0.3, 0.9)))
        wl = mb.Workload(prompt=st.lognorm(0.6, scale=float(rng.uniform(20, 120))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))), system_prompts=system)
        pk, dk = {**_engine(rng, 1024), "prefix_caching": True}, _engine(rng, 2048)
        ep, ed = (int(k) for k in rng.integers(1, 4, 2))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), bytes_per_token=float(rng.uniform(1e4, 3e5)))
        pol = mb.Disaggregated(prefill=mb.ContinuousBatching(**pk), decode=mb.ContinuousBatching(**dk),
                               prefill_engines=ep, decode_engines=ed, kv_transfer=link, router=router)
        seed = int(rng.integers(1 << 30))
        res = mb.simulate(pol, mb.Poisson(float(rng.uniform(2, 20))), workload=wl, service_model=MODEL, n=200,
                          seed=seed, keep_requests=True)
        r = res.requests
        arr, p = r["arrival"], r["prompt"]
        n = len(arr)
        chain, shared = system.draw(stream(as_seed_sequence(seed), STREAM_SYSTEM), n)
        where, runs, mine, _ = _reference_cluster(arr, p, np.ones(n), p, ep, router, prefix_caching=True,
                                                  chain=chain, shared=shared, grows=np.zeros(system.count),
                                                  **_reference(pk))
        first = _first_tokens(runs, mine, n)
        np.testing.assert_array_equal(r["prefill_engine"], where)
        np.testing.assert_array_equal(r["first_token"], first)
        _check_decode_pool(res, first, link, ed, dk)
        pre = res.prefill
        assert (res.prefix_hit_rate, res.prefix_saved_tokens, res.kv_evictions) == (
            pre.prefix_hit_rate, pre.prefix_saved_tokens, pre.kv_evictions)
        hits += sum(runs[e]["prefix_hits"] for e in range(ep) if mine[e])
        assert res.prefix_saved_tokens * n == sum(runs[e]["prefix_hits"] for e in range(ep) if mine[e])
    assert hits > 0


@pytest.mark.parametrize("caching", [False, True])
def test_programs_calls_are_the_plain_python_pools(caching):
    """Open-loop programs (2 to 4 calls, think times) over 3 random
    deployments each: the requests are a colocated cluster's calls on the
    same seed (arrivals, prompts, each a call's context and new tokens,
    outputs, programs); each request's prefill engine and first token equal
    the plain-Python cluster's behind least-used routing with the programs
    (no KV reuse: a call's context holds outputs the decode pool made),
    its engines, where they cache prefixes, keeping each program's context
    as a chain (the prompts they prefilled), else holding a request's KV
    blocks until its pull lands (:func:`_landings`); and the decode pool is
    the plain-Python engines' (:func:`_check_decode_pool`)."""
    rng = np.random.default_rng(30 + caching)
    for _ in range(3):
        wl = mb.Workload(prompt=st.lognorm(0.6, scale=float(rng.uniform(20, 80))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))))
        pk, dk = {**_engine(rng, 4096), "prefix_caching": caching}, _engine(rng, 8192)
        ep, ed = (int(k) for k in rng.integers(1, 4, 2))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), bytes_per_token=float(rng.uniform(1e4, 3e5)))
        progs = mb.Programs(calls=int(rng.integers(2, 5)), think_time=float(rng.choice([0.1, 1.0])))
        pol = mb.Disaggregated(prefill=mb.ContinuousBatching(**pk), decode=mb.ContinuousBatching(**dk),
                               prefill_engines=ep, decode_engines=ed, kv_transfer=link, programs=progs)
        kw = dict(arrivals=mb.Poisson(float(rng.uniform(2, 20))), workload=wl, service_model=MODEL, n=200,
                  seed=int(rng.integers(1 << 30)), keep_requests=True)
        res = mb.simulate(pol, **kw)
        r = res.requests
        colocated = mb.simulate(mb.Cluster(mb.ContinuousBatching(**dk), engines=ep + ed, programs=progs), **kw)
        for col in ("arrival", "prompt", "output", "program", "new_tokens"):
            np.testing.assert_array_equal(r[col], colocated.requests[col], err_msg=col)
        arr, p, pid, new = r["arrival"], r["prompt"], r["program"], r["new_tokens"]
        n = len(arr)
        assert (p > new).any()             # (later calls carry their contexts)
        chains = dict(prefix_caching=True, chain=pid.astype(float), shared=p - new,
                      grows=np.ones(int(pid.max()) + 1)) if caching else {}
        where, runs, mine, _ = _reference_cluster(arr, p, np.ones(n), p, ep, "least_used",
                                                  programs=(pid, new, np.zeros(n, np.int8)), kv=False, **chains,
                                                  release=_landings(r), **_reference(pk))
        first = _first_tokens(runs, mine, n)
        np.testing.assert_array_equal(r["prefill_engine"], where)
        np.testing.assert_array_equal(r["first_token"], first)
        _check_decode_pool(res, first, link, ed, dk)
        assert (res.prefix_hit_rate > 0) if caching else math.isnan(res.prefix_hit_rate)


@pytest.mark.parametrize("router, decode_router", [("least_used", "round_robin"), ("round_robin", "round_robin"),
                                                   ("least_used", "least_used")])
def test_closed_loop_programs_are_the_plain_python_deployment(router, decode_router):
    """Closed-loop programs (2 to 4 calls, think times or none, a time
    outside each pool's engines or none; prefill engines caching prefixes
    half the time) over 4 random deployments per
    router (1 to 3 engines a pool, each pool's settings, a random link),
    10 to 40 calls: the calls that arrive, in their order, their arrival
    times, prompts and outputs, and each request's prefill engine, first
    token, decode admission and completion equal the plain-Python
    deployment's, whose arrivals come from its own runs
    (:func:`_closed_reference`).  Some call waits for its predecessor's
    answer from the decode pool, some for a decode engine, and some
    prompt hits a prefill engine's cache.  The decode pool dealt in turn,
    or behind the least-used router."""
    rng = np.random.default_rng(40 + ["least_used", "round_robin"].index(router) + 2 * (decode_router != "round_robin"))
    later = waited = 0
    hits = 0.0
    for _ in range(4):
        wl = mb.Workload(prompt=st.lognorm(0.6, scale=float(rng.uniform(20, 80))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(2, 30))))
        pk, dk = {**_engine(rng, 4096), "prefix_caching": bool(rng.random() < 0.5)}, _engine(rng, 8192)
        delays = tuple(float(rng.choice([0.0, 0.01])) for _ in range(2))
        ep, ed = (int(k) for k in rng.integers(1, 4, 2))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), latency=float(rng.choice([0.0, 0.005])),
                             bytes_per_token=float(rng.uniform(1e4, 3e5)))
        progs = mb.Programs(calls=int(rng.integers(2, 5)), think_time=float(rng.choice([0.0, 0.05, 0.5])),
                            closed=True)
        pol = mb.Disaggregated(prefill=mb.ContinuousBatching(**pk, request_overhead=delays[0]),
                               decode=mb.ContinuousBatching(**dk, request_overhead=delays[1]), prefill_engines=ep,
                               decode_engines=ed, kv_transfer=link, router=router, programs=progs,
                               decode_router=decode_router)
        arrivals, n, seed = mb.Poisson(float(rng.uniform(2, 40))), int(rng.integers(10, 41)), int(rng.integers(1 << 30))
        res = mb.simulate(pol, arrivals, workload=wl, service_model=MODEL, n=n, seed=seed, keep_requests=True)
        draws = _drawn_calls(progs, arrivals, wl, n, seed)
        k, times, want = _closed_reference(draws, n, ep, ed, pk, dk, link, router, delays, decode_router)
        r = res.requests
        C = draws[1].size // draws[0].size
        np.testing.assert_array_equal(r["arrival"], times, err_msg=f"{pk} {dk}")
        np.testing.assert_array_equal(r["program"], k // C)
        np.testing.assert_array_equal(r["output"], draws[3][k])
        for col, v in want.items():
            np.testing.assert_array_equal(r[col], v, err_msg=col)
        many = r["output"] > 1
        later += int(np.count_nonzero(k % C > 0))
        waited += int(np.count_nonzero(r["decode_admitted"][many] > r["first_token"][many]))
        hits += res.prefix_saved_tokens if pk["prefix_caching"] else 0.0
    assert later > 0 and waited > 0 and hits > 0


@pytest.mark.parametrize("closed", [False, True])
def test_prefill_engines_hold_each_kv_cache_until_its_pull_lands(closed):
    """Deployments whose one decode engine is their bottleneck (2 or 3
    prefill engines of little KV memory, 3 random ones), where holding each
    request's KV blocks on its prefill engine until its decode engine's
    pull lands keeps later requests waiting for prefill memory.  Open loop
    (the pools then run in one loop): each request's prefill engine and
    first token equal the plain-Python cluster's freeing each request's
    blocks as its pull lands, and its transfer, decode admission and
    completion the plain-Python decode engine's on those first tokens (so
    the runs agree with each other, which makes them the deployment's);
    some first token is later than with the blocks freed at the first
    token.  Closed loop (programs of 2 calls, 70 calls): equal to the plain-Python
    deployment (:func:`_closed_reference`), which differs from the one
    freeing the blocks at the first token."""
    rng = np.random.default_rng(70 + closed)
    bound = 0
    for _ in range(3):
        wl = mb.Workload(prompt=st.lognorm(0.5, scale=float(rng.uniform(60, 120))),
                         output=st.lognorm(0.5, scale=float(rng.uniform(10, 30))))
        pk = dict(max_num_seqs=8, chunked_prefill=bool(rng.random() < 0.5), kv_tokens=float(rng.choice([1024, 2048])),
                  block_size=16, max_batched_tokens=1024)
        dk = dict(max_num_seqs=2, chunked_prefill=True, kv_tokens=8192.0, block_size=16, max_batched_tokens=256)
        ep = int(rng.integers(2, 4))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e8, 1e9)), latency=0.005, bytes_per_token=1e5)
        progs = mb.Programs(calls=2, think_time=0.05, closed=True) if closed else None
        pol = mb.Disaggregated(prefill=mb.ContinuousBatching(**pk), decode=mb.ContinuousBatching(**dk),
                               prefill_engines=ep, decode_engines=1, kv_transfer=link, programs=progs)
        arrivals, n, seed = mb.Poisson(float(rng.uniform(30, 60))), 70 if closed else 120, int(rng.integers(1 << 30))
        res = mb.simulate(pol, arrivals, workload=wl, service_model=MODEL, n=n, seed=seed, keep_requests=True)
        r = res.requests
        if closed:
            draws = _drawn_calls(progs, arrivals, wl, n, seed)
            k, times, want = _closed_reference(draws, n, ep, 1, pk, dk, link, "least_used", (0.0, 0.0))
            np.testing.assert_array_equal(r["arrival"], times)
            for col, v in want.items():
                np.testing.assert_array_equal(r[col], v, err_msg=col)
            _, free_times, _ = _closed_reference(draws, n, ep, 1, pk, dk, link, "least_used", (0.0, 0.0),
                                                 hold=False)
            bound += int(not np.array_equal(free_times, times))
            continue
        arr, p = r["arrival"], r["prompt"]
        where, runs, mine, _ = _reference_cluster(arr, p, np.ones(n), p, ep, "least_used", release=_landings(r),
                                                  **_reference(pk))
        first = _first_tokens(runs, mine, n)
        np.testing.assert_array_equal(r["prefill_engine"], where)
        np.testing.assert_array_equal(r["first_token"], first)
        _check_decode_pool(res, first, link, 1, dk)
        _, runs, mine, _ = _reference_cluster(arr, p, np.ones(n), p, ep, "least_used", **_reference(pk))
        bound += int(np.any(first > _first_tokens(runs, mine, n)))
    assert bound >= 2


def test_a_prefill_pool_whose_held_blocks_never_bind_is_not_run_again(monkeypatch):
    """Over 8 random deployments (some whose held blocks bind): each
    deployment's requests and metrics are the same whether the planner's
    test of how the held blocks fit (``_held_fit``) is taken or the pools
    always run in one loop; the test says they fit on some and not on
    some."""
    from mbbatch._kernels.disaggregated import FITS
    from mbbatch.planners import disaggregated as D

    rng = np.random.default_rng(61)
    said = []
    real = D._held_fit
    monkeypatch.setattr(D, "_held_fit", lambda *a: said.append(real(*a)) or said[-1])
    for _ in range(8):
        wl = mb.Workload(prompt=st.lognorm(0.5, scale=float(rng.uniform(30, 80))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))))
        pk = {**_engine(rng, 2048), "kv_tokens": float(rng.choice([2048, 4096, 65536]))}
        pol = mb.Disaggregated(prefill=mb.ContinuousBatching(**pk), decode=mb.ContinuousBatching(**_engine(rng, 2048)),
                               prefill_engines=int(rng.integers(1, 4)), decode_engines=int(rng.integers(1, 3)))
        kw = dict(arrivals=mb.Poisson(float(rng.uniform(5, 60))), workload=wl, service_model=MODEL, n=300,
                  seed=int(rng.integers(1 << 30)), keep_requests=True)
        tested = mb.simulate(pol, **kw)
        with monkeypatch.context() as m:
            m.setattr(D, "_held_fit", lambda *a: D._kd.EXCEEDS)
            again = mb.simulate(pol, **kw)
        for col in tested.requests:
            np.testing.assert_array_equal(tested.requests[col], again.requests[col], err_msg=col)
        for k, v in tested.metrics().items():
            assert v == again.metrics()[k] or (v != v and again.metrics()[k] != again.metrics()[k]), k
    assert FITS in said and set(said) - {FITS}


@pytest.mark.parametrize("decode_router", ["round_robin", "least_used"])
def test_closed_loop_programs_on_a_laps_prefill_pool_are_laps_alone_then_the_decode_pool(decode_router):
    """Closed-loop programs (2 to 4 calls, think times or none) on LAPS's
    prefill instances (1 to 4, a random threshold, window, batch bounds,
    the dual queue or one FIFO, dynamic allocation or none; instances
    leaving and joining in 3 of 5) over 5 random deployments (1 to 3 decode
    engines of random settings, a random link), 10 to 40 calls: the calls
    that arrive, in their order, their arrival times, and each request's
    instance, first token, decode admission and completion equal those of
    the plain-Python LAPS pool (tests/reference_laps.py) on the same calls
    followed by plain-Python decode engines, re-run as each call arrives
    (:func:`_closed_reference`).  The calls by call id are those a
    continuous prefill pool's closed loop draws on the same seed (common
    random numbers: :func:`mbbatch.planners.cluster._program_draws`).  Some
    call follows another, some waits for a decode engine, and some batch
    holds more than one request."""
    rng = np.random.default_rng(77 + (decode_router != "round_robin"))
    later = waited = batched = 0
    for _ in range(5):
        wl = mb.Workload(prompt=st.lognorm(0.8, scale=float(rng.uniform(20, 200))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(2, 30))))
        k = int(rng.integers(1, 5))
        laps = _random_laps(rng, k)
        dk = _engine(rng, 8192)
        delay = float(rng.choice([0.0, 0.01]))
        ed = int(rng.integers(1, 4))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), latency=float(rng.choice([0.0, 0.005])),
                             bytes_per_token=float(rng.uniform(1e4, 3e5)))
        progs = mb.Programs(calls=int(rng.integers(2, 5)), think_time=float(rng.choice([0.0, 0.05, 0.5])),
                            closed=True)
        events = _laps_events(rng, k, 1.5) if rng.random() < 0.6 else []
        pol = mb.Disaggregated(prefill=laps, decode=mb.ContinuousBatching(**dk, request_overhead=delay),
                               decode_engines=ed, kv_transfer=link, programs=progs, decode_router=decode_router,
                               prefill_events=events)
        arrivals, n, seed = mb.Poisson(float(rng.uniform(5, 60))), int(rng.integers(10, 41)), int(rng.integers(1 << 30))
        res = mb.simulate(pol, arrivals, workload=wl, service_model=MODEL, n=n, seed=seed, keep_requests=True)
        draws = _drawn_calls(progs, arrivals, wl, n, seed)
        kc, times, want = _closed_reference(draws, n, k, ed, (laps, events), dk, link, None, (0.0, delay),
                                            decode_router)
        r = res.requests
        C = draws[1].size // draws[0].size
        np.testing.assert_array_equal(r["arrival"], times)
        np.testing.assert_array_equal(r["program"], kc // C)
        np.testing.assert_array_equal(r["new_tokens"], draws[2][kc])
        np.testing.assert_array_equal(r["output"], draws[3][kc])
        for col, v in want.items():
            np.testing.assert_array_equal(r[col], v, err_msg=col)
        assert res.prefill.kind == "laps" and res.prefill.n == n
        many = r["output"] > 1
        later += int(np.count_nonzero(kc % C > 0))
        waited += int(np.count_nonzero(r["decode_admitted"][many] > r["first_token"][many]))
        batched += int(res.prefill.mean_batch_size > 1)
    assert later > 0 and waited > 0 and batched > 0


@pytest.mark.parametrize("laps", [False, True])
def test_a_closed_loop_of_one_call_programs_is_the_open_loop_deployment(laps):
    """One-call programs in a closed loop start as the open loop's
    requests arrive and draw its prompts and outputs, so the two-pool loop
    (:mod:`mbbatch._kernels.disaggregated`, with continuous prefill engines
    or LAPS's instances) gives the feed-forward deployment's requests bit
    for bit: each pool's run feeds the other only forward when no answer
    issues a call."""
    rng = np.random.default_rng(5 + laps)
    for _ in range(2):
        wl = mb.Workload(prompt=st.lognorm(0.9, scale=float(rng.uniform(40, 300))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 40))))
        dk = _engine(rng, 8192)
        prefill = (mb.LAPS(instances=int(rng.integers(1, 4)), threshold=int(rng.choice([64, 128])),
                           window=float(rng.choice([0.0, 0.01]))) if laps
                   else mb.ContinuousBatching(**_engine(rng, 4096)))
        kw = dict(prefill=prefill, decode=mb.ContinuousBatching(**dk), decode_engines=int(rng.integers(1, 4)),
                  **({} if laps else {"prefill_engines": int(rng.integers(1, 3))}))
        run = dict(arrivals=mb.Poisson(float(rng.uniform(10, 60))), workload=wl, service_model=MODEL, n=300,
                   seed=int(rng.integers(1 << 30)), keep_requests=True)
        open_ = mb.simulate(mb.Disaggregated(**kw), **run).requests
        closed = mb.simulate(mb.Disaggregated(**kw, programs=mb.Programs(calls=1, closed=True)), **run).requests
        for col in open_:
            np.testing.assert_array_equal(closed[col], open_[col], err_msg=col)


def test_open_loop_programs_on_a_laps_prefill_pool_are_laps_alone_on_their_calls():
    """Open-loop programs (2 to 4 calls, think times) on LAPS's prefill
    instances over 3 random deployments: the requests are a colocated
    cluster's calls on the same seed (arrivals, prompts, each a call's
    context and new tokens, outputs, programs); each request's instance
    and first token equal LAPS's alone on those arrivals and prompts; and
    the decode pool is the plain-Python engines' (:func:`_check_decode_pool`)."""
    rng = np.random.default_rng(61)
    for _ in range(3):
        wl = mb.Workload(prompt=st.lognorm(0.8, scale=float(rng.uniform(20, 120))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))))
        laps = mb.LAPS(instances=int(rng.integers(2, 4)), threshold=int(rng.choice([64, 128, 256])),
                       window=float(rng.choice([0.0, 0.01])))
        dk, ed = _engine(rng, 8192), int(rng.integers(1, 4))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), bytes_per_token=float(rng.uniform(1e4, 3e5)))
        progs = mb.Programs(calls=int(rng.integers(2, 5)), think_time=float(rng.choice([0.1, 1.0])))
        pol = mb.Disaggregated(prefill=laps, decode=mb.ContinuousBatching(**dk), decode_engines=ed,
                               kv_transfer=link, programs=progs)
        kw = dict(arrivals=mb.Poisson(float(rng.uniform(2, 20))), workload=wl, service_model=MODEL, n=200,
                  seed=int(rng.integers(1 << 30)), keep_requests=True)
        res = mb.simulate(pol, **kw)
        r = res.requests
        colocated = mb.simulate(mb.Cluster(mb.ContinuousBatching(**dk), engines=laps.instances + ed,
                                           programs=progs), **kw)
        for col in ("arrival", "prompt", "output", "program", "new_tokens"):
            np.testing.assert_array_equal(r[col], colocated.requests[col], err_msg=col)
        assert (r["prompt"] > r["new_tokens"]).any()         # (later calls carry their contexts)
        alone = mb.simulate(laps, arrivals=mb.Replay(r["arrival"]),
                            workload=mb.Workload(prompt=r["prompt"], output=np.ones(len(r["arrival"]))),
                            service_model=MODEL, n=len(r["arrival"]), seed=0, keep_requests=True).requests
        np.testing.assert_array_equal(r["prefill_engine"], alone["instance"])
        np.testing.assert_array_equal(r["first_token"], alone["first_token"])
        _check_decode_pool(res, alone["first_token"], link, ed, dk)


def test_a_traces_sessions_on_a_laps_prefill_pool_are_laps_alone_on_their_calls():
    """A trace's sessions (``mb.Sessions``, the context included in each
    prompt) on LAPS's prefill instances: the requests are the trace's, each
    with its session and new tokens as a colocated cluster's; each
    request's instance and first token LAPS's alone on the trace."""
    from mbbatch.traces import Trace

    rng = np.random.default_rng(8)
    m = 150
    sid = rng.integers(-1, 30, m)
    out = rng.integers(1, 60, m)
    prompt, ctx = np.empty(m, np.int64), {}
    for i in range(m):
        s_ = int(sid[i])
        prompt[i] = int(rng.integers(1, 300)) + (ctx.get(s_, 0) if s_ >= 0 else 0)
        if s_ >= 0:
            ctx[s_] = prompt[i] + out[i]
    tr = Trace(arrival=np.sort(rng.uniform(0.0, 30.0, m)), prompt_tokens=prompt, output_tokens=out, session=sid)
    laps = mb.LAPS(instances=2, threshold=128)
    kw = dict(arrivals=mb.Replay(tr), workload=mb.Workload.from_trace(tr), service_model=MODEL, seed=0,
              keep_requests=True)
    r = mb.simulate(mb.Disaggregated(prefill=laps, decode_engines=2, programs=mb.Sessions(tr)), **kw).requests
    colocated = mb.simulate(mb.Cluster(mb.ContinuousBatching(), engines=4, programs=mb.Sessions(tr)), **kw).requests
    for col in ("arrival", "prompt", "output", "program", "new_tokens"):
        np.testing.assert_array_equal(r[col], colocated[col], err_msg=col)
    assert np.any(r["new_tokens"] < r["prompt"])
    alone = mb.simulate(laps, **kw).requests
    np.testing.assert_array_equal(r["prefill_engine"], alone["instance"])
    np.testing.assert_array_equal(r["first_token"], alone["first_token"])


def _random_laps(rng, k: int):
    """LAPS on ``k`` instances of random settings: threshold, window, batch
    bounds, the dual queue or one FIFO, dynamic allocation or none."""
    return mb.LAPS(instances=k, threshold=int(rng.choice([32, 64, 128, 256])),
                   window=float(rng.choice([0.0, 0.002, 0.02, 0.05])), max_batch=int(rng.choice([1, 4, 8, 16])),
                   max_batch_tokens=float(rng.choice([256, 512, 4096, 8192])), dual_queue=bool(rng.random() < 0.7),
                   dynamic=bool(rng.random() < 0.6), interval=float(rng.choice([0.0, 0.05])))


def _laps_events(rng, k: int, span: float) -> list:
    """Random events of a LAPS pool of ``k`` instances within ``span`` s:
    instances leaving and coming back, one kept in the pool at least."""
    events, out = [], set()
    for t in np.sort(rng.uniform(0.0, span, int(rng.integers(1, 5)))):
        e = int(rng.integers(0, k))
        if e in out:
            events.append(mb.EngineEvent(float(t), e, "add"))
            out.discard(e)
        elif len(out) < k - 1:
            events.append(mb.EngineEvent(float(t), e))
            out.add(e)
    return events


def _laps_reference(arr, p, laps, events) -> dict:
    """The plain-Python LAPS pool (tests/reference_laps.py) of ``laps`` on
    arrivals ``arr`` and prompts ``p``, timed by :data:`MODEL`'s prefill
    iteration, with its instances' ``events``."""
    pm = MODEL.prefill_model()
    return ref_laps.simulate(arr, p, instances=laps.instances, threshold=laps.threshold, window=laps.window,
                             max_batch=laps.max_batch, max_batch_tokens=laps.max_batch_tokens,
                             dual_queue=laps.dual_queue, dynamic=laps.dynamic, interval=laps.interval,
                             ratio=laps.ratio, long_instances=laps.long_instances, a=pm.a, b=pm.b,
                             events=[(ev.time, ev.engine, ev.action == "add") for ev in events])


@pytest.mark.parametrize("closed", [False, True])
def test_a_laps_pools_instances_leaving_hand_their_queues_back_as_the_plain_python_pool(closed):
    """LAPS's prefill instances (2 to 4, random settings, dynamic
    allocation or none) leaving and joining the pool over 6 random
    deployments, 150 requests at a rate that queues them: each request's
    instance, batch start and first token equal the plain-Python pool's
    (tests/reference_laps.py), and its decode admission and completion the
    plain-Python decode engines'; some request is handed back, and none
    starts on an instance while it is out of the pool.  Closed loop: as
    :func:`test_closed_loop_programs_on_a_laps_prefill_pool_are_laps_alone_then_the_decode_pool`."""
    rng = np.random.default_rng(90 + closed)
    handed = grouped = 0
    for _ in range(6):
        wl = mb.Workload(prompt=st.lognorm(0.9, scale=float(rng.uniform(40, 300))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(2, 20))))
        k = int(rng.integers(2, 5))
        laps = _random_laps(rng, k)
        dk, ed = _engine(rng, 8192), int(rng.integers(1, 3))
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e8, 1e9)), bytes_per_token=float(rng.uniform(1e4, 3e5)))
        n = 150
        pm = MODEL.prefill_model()
        rate = float(rng.uniform(1.0, 3.0)) * k / (pm.a + pm.b * wl._prompt.mean)
        events = _laps_events(rng, k, n / rate)
        progs = mb.Programs(calls=3, think_time=0.05, closed=True) if closed else None
        pol = mb.Disaggregated(prefill=laps, decode=mb.ContinuousBatching(**dk), decode_engines=ed,
                               kv_transfer=link, prefill_events=events, programs=progs)
        res = mb.simulate(pol, arrivals=mb.Poisson(rate), workload=wl, service_model=MODEL, n=n,
                          seed=int(rng.integers(1 << 30)), keep_requests=True)
        r = res.requests
        want = _laps_reference(r["arrival"], r["prompt"], laps, events)
        np.testing.assert_array_equal(r["prefill_engine"], want["instance"])
        np.testing.assert_array_equal(res.prefill.requests["start"], want["start"])
        np.testing.assert_array_equal(r["first_token"], want["first_token"])
        cols = _decode_reference(want["instance"], want["first_token"], r["prompt"], r["output"], ed, dk, link)
        for col in ("decode_admitted", "completion"):
            np.testing.assert_array_equal(r[col], cols[col], err_msg=col)
        handed += want["handed"]
        start, inst = res.prefill.requests["start"], r["prefill_engine"]
        out = {}
        for ev in events:
            if ev.action == "remove":
                out[ev.engine] = ev.time
            else:
                lo = out.pop(ev.engine)
                assert not np.any((inst == ev.engine) & (start >= lo) & (start < ev.time))
        for e, lo in out.items():
            assert not np.any((inst == e) & (start >= lo))
        ts = res.prefill.time_series
        if ts is not None:
            # (the router's groups over time count the instances in the pool: all of them but those out at the end)
            assert ts["short_instances"][-1] + ts["long_instances"][-1] == k - len(out)
            assert np.all(np.diff(ts["time"]) >= 0)
            grouped += 1
    assert handed > 0 and grouped > 0



def test_a_request_handed_back_by_a_laps_instance_keeps_its_window_from_its_arrival():
    """Hand-checked: one short request at 0 s on instance 0 of 2 (window
    50 ms); instance 0 leaves at 10 ms and hands it back to instance 1,
    idle, where its window still ends 50 ms after its arrival: its batch
    starts at 50 ms, not 60."""
    pm = MODEL.prefill_model()
    laps = mb.LAPS(instances=2, window=0.05, dynamic=False)
    pol = mb.Disaggregated(prefill=laps, decode_engines=1, prefill_events=[mb.EngineEvent(0.01, 0)])
    res = mb.simulate(pol, arrivals=mb.Replay(np.array([0.0])), service_model=MODEL, n=1, seed=0,
                      workload=mb.Workload(prompt=np.array([10.0]), output=np.array([3.0])), keep_requests=True)
    assert res.requests["prefill_engine"][0] == 1
    assert res.prefill.requests["start"][0] == 0.05
    assert res.requests["first_token"][0] == 0.05 + (pm.a + pm.b * 10.0)



def test_laps_with_a_continuous_decode_stage_is_a_deployment_of_a_free_link():
    """LAPS's decode stage on continuous engines receives each prompt's KV
    cache for free: LAPS(decode=...) is, request by request and bit for
    bit, a deployment of LAPS's instances and as many decode engines over a
    link that moves the cache in no time (``bytes_per_token=0``), so its
    programs, closed loops and engine events are the deployment's."""
    rng = np.random.default_rng(12)
    for _ in range(3):
        wl = mb.Workload(prompt=st.lognorm(0.9, scale=float(rng.uniform(40, 300))),
                         output=st.lognorm(0.7, scale=float(rng.uniform(4, 60))))
        dk, k, d = _engine(rng, 8192), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        laps = dict(instances=k, threshold=int(rng.choice([64, 256])), window=float(rng.choice([0.0, 0.01])))
        kw = dict(arrivals=mb.Poisson(float(rng.uniform(5, 40))), workload=wl, service_model=MODEL, n=300,
                  seed=int(rng.integers(1 << 30)), keep_requests=True)
        alone = mb.simulate(mb.LAPS(**laps, decode=mb.ContinuousBatching(**dk), decode_servers=d,
                                    decode_model=MODEL), **kw)
        pool = mb.simulate(mb.Disaggregated(prefill=mb.LAPS(**laps), decode=mb.ContinuousBatching(**dk),
                                            decode_engines=d, kv_transfer=mb.KVTransfer(bytes_per_token=0.0)), **kw)
        for col in ("arrival", "prompt", "output", "first_token", "completion"):
            np.testing.assert_array_equal(pool.requests[col], alone.requests[col], err_msg=col)
        assert pool.mean_transfer_time == 0.0


def _drawn_calls(progs, arrivals, wl, n: int, seed: int) -> tuple:
    """The calls closed-loop programs ``progs`` draw on ``seed`` by call id,
    a cluster's (:func:`mbbatch.planners.cluster._program_draws`): the
    programs' starts, and the calls' think times, new tokens and outputs."""
    from types import SimpleNamespace

    from mbbatch._seeding import STREAM_ARRIVALS, STREAM_PROMPT, STREAM_SERVICE, as_seed_sequence, stream
    from mbbatch.planners.cluster import _program_draws

    ss = as_seed_sequence(seed)
    return _program_draws(mb.Cluster(mb.ContinuousBatching(), programs=progs), arrivals, wl, n, SimpleNamespace(
        arrival=stream(ss, STREAM_ARRIVALS), prompt=stream(ss, STREAM_PROMPT), output=stream(ss, STREAM_SERVICE)))


def _closed_reference(draws, n, ep, ed, pk, dk, link, router, delays, decode_router="round_robin", hold=True):
    """The plain-Python deployment of closed-loop programs (``draws``: their
    starts and by call id think times, new tokens and outputs; ``delays``:
    the prefill and decode engines' ``request_overhead``), ``n`` calls
    arriving: the next call is the first (by time, then id) of those that
    can arrive, each program's first call at its start once the program
    before it has started, each call after another its think time after
    that one's answer (its completion plus the overhead of the engine that
    gave its last token: the decode engine's, or for one token the prefill
    engine's) in the plain-Python deployment's run of the calls arrived so
    far (the prefill cluster, the transfers, the decode engines dealt in
    turn or behind ``decode_router``: :func:`_pools`; ``pk`` a :class:`~mbbatch.LAPS` and its
    instances' events: the plain-Python LAPS pool, which adds no time outside its instances); the earliest such
    arrival is final (an answer
    before it cannot depend on a later arrival).  ``hold``: :func:`_pools`'s.
    Returns the calls in arrival order, their arrival times and the last
    run's columns."""
    start, gap, new, out = draws
    P = start.size
    C = gap.size // P
    ctx = (np.cumsum((new + out).reshape(P, C), axis=1) - out.reshape(P, C)).ravel()
    calls, times = [], []
    while True:
        k = np.array(calls, np.int64)
        cols = _pools(np.array(times), ctx[k], out[k], new[k], k, C, ep, ed, pk, dk, link, router, decode_router,
                      hold)
        if len(calls) == n:
            return k, np.array(times), cols
        answered = np.where(out[k] > 1, cols["completion"] + delays[1], cols["first_token"] + delays[0])
        known = set(calls)
        cand = [(start[p], p * C) for p in range(P) if p * C not in known and (p == 0 or (p - 1) * C in known)]
        cand += [(a + gap[c + 1], c + 1) for c, a in zip(calls, answered) if (c + 1) % C and c + 1 not in known]
        t, c = min(cand)
        calls.append(int(c))
        times.append(float(t))


def _pools(arr, p, o, new, k, C, ep, ed, pk, dk, link, router, decode_router="round_robin", hold=True) -> dict:
    """The plain-Python deployment's open-loop run of calls ``k`` (``C`` a
    program; ``new`` their new tokens) arriving at ``arr``: the prefill cluster behind ``router``
    with the programs, each call one output token (engines caching
    prefixes keep each program's context as a chain, the prompts they
    prefilled, else holding a request's KV blocks until its pull lands);
    the decode pool :func:`_decode_reference`'s.  The landings are the
    decode pool's, whose run reads the prefill pool's first tokens: the two
    are run in turn, the prefill pool with the last landings, until the
    first tokens repeat (the consistent runs: unique, as each engine's state
    at an instant depends only on earlier landings and first tokens).
    ``hold=False``: the prefill engines free the blocks at the first token
    (one run of each pool)."""
    n = arr.size
    if isinstance(pk, tuple):
        # (LAPS's prefill instances and their events: the plain-Python pool, tests/reference_laps.py)
        r = _laps_reference(arr, p, *pk)
        return _decode_reference(r["instance"], r["first_token"], p, o, ed, dk, link, decode_router)
    programs = (k // C, new, (k % C == C - 1).astype(np.int8))
    chains = dict(prefix_caching=True, chain=(k // C).astype(float), shared=p - new,
                  grows=np.ones(int(k.max(initial=0)) // C + 1)) if pk.get("prefix_caching") else {}
    release, cols = None, None
    for _ in range(100):
        where, runs, mine, _ = _reference_cluster(arr, p, np.ones(n), p, ep, router, programs=programs, kv=False,
                                                  release=release, **chains, **_reference(pk))
        first = _first_tokens(runs, mine, n)
        if cols is not None and (np.array_equal(first, cols["first_token"]) or not hold):
            return cols
        cols = _decode_reference(where, first, p, o, ed, dk, link, decode_router)
        release = _landings(dict(output=o, decode_admitted=cols["decode_admitted"],
                                 transfer_time=link.latency + p * (link.bytes_per_token / link.bandwidth)))
    raise AssertionError("the plain-Python pools did not agree within 100 rounds")


def _decode_reference(where, first, p, o, ed, dk, link, decode_router="round_robin") -> dict:
    """The plain-Python decode pool after a prefill pool (each request's
    engine there ``where`` and first token ``first``): each call of more
    tokens ready at its first token, the ready calls in their order (ties
    in arrival order) dealt in turn to the decode engines (or,
    ``decode_router="least_used"``, to the plain-Python cluster behind it),
    each bringing its prompt's KV cache, pulled in its transfer's time once
    admitted, and generating ``o - 1`` tokens.  Returns the requests'
    columns."""
    n = p.size
    transfer = link.latency + p * (link.bytes_per_token / link.bandwidth)
    ready = first
    many = np.flatnonzero(o > 1)
    order = many[np.argsort(ready[many], kind="stable")]
    completion, admitted = first.copy(), np.full(n, np.nan)
    if decode_router != "round_robin" and order.size:
        q = order
        _, druns, dmine, _ = _reference_cluster(ready[q], p[q], o[q] - 1, o[q] - 1, ed, decode_router, brought=p[q],
                                                pull=transfer[q], **_reference(dk))
        for e in range(ed):
            if dmine[e]:
                idx = q[dmine[e]]
                completion[idx], admitted[idx] = druns[e]["completion"], druns[e]["admitted"]
        return dict(prefill_engine=where, first_token=first, decode_admitted=admitted, completion=completion)
    for e in range(min(ed, order.size)):
        idx = order[e::ed]
        w = ref.simulate(ready[idx], p[idx], o[idx] - 1, o[idx] - 1, cached=p[idx], pull=transfer[idx],
                         **_reference(dk))
        completion[idx], admitted[idx] = w["completion"], w["admitted"]
    return dict(prefill_engine=where, first_token=first, decode_admitted=admitted, completion=completion)


def _landings(r) -> np.ndarray:
    """Each request of a deployment's records ``r`` frees its prefill
    engine's KV blocks as its pull lands: its decode admission plus its
    transfer; a request of one token at its first token (-inf: at its
    completion)."""
    return np.where(r["output"] > 1, r["decode_admitted"] + r["transfer_time"], -np.inf)


def _first_tokens(runs, mine, n: int) -> np.ndarray:
    """Each request's first token in the plain-Python prefill pool (each
    engine's run ``runs[e]`` of its requests ``mine[e]``)."""
    first = np.empty(n)
    for run, idx in zip(runs, mine):
        if idx:
            first[idx] = run["first_token"]
    return first


def _check_decode_pool(res, first, link, ed, dk) -> bool:
    """A deployment's transfers, decode admissions and completions against
    plain-Python decode engines (settings ``dk``, ``ed`` of them) given its
    first tokens ``first``: the transfer ``latency + prompt x
    (bytes_per_token / bandwidth)``; the requests of more than one token, in
    the order of their first tokens (ties in arrival order), dealt in turn,
    each bringing its prompt's KV cache, pulled in its transfer's time once
    its engine admits it, and generating ``output - 1`` tokens.  Returns
    whether some request waited for a decode engine."""
    r = res.requests
    arr, p, o = r["arrival"], r["prompt"], r["output"]
    transfer = link.latency + p * (link.bytes_per_token / link.bandwidth)
    ready = first
    many = np.flatnonzero(o > 1)
    order = many[np.argsort(ready[many], kind="stable")]
    completion, admitted = first.copy(), np.full(len(arr), np.nan)
    for e in range(min(ed, order.size)):
        idx = order[e::ed]
        w = ref.simulate(ready[idx], p[idx], o[idx] - 1, o[idx], cached=p[idx], pull=transfer[idx],
                         **_reference(dk))
        completion[idx], admitted[idx] = w["completion"], w["admitted"]
        # (a request's first token on its decode engine comes after its pull lands)
        assert np.all(w["first_token"] >= w["admitted"] + transfer[idx])
    np.testing.assert_array_equal(r["transfer_time"][many], transfer[many])
    assert np.isnan(r["transfer_time"][o == 1]).all()
    np.testing.assert_array_equal(r["decode_admitted"], admitted)
    np.testing.assert_array_equal(r["completion"], completion)
    assert res.mean_transfer_time == pytest.approx(transfer[many].mean(), rel=1e-12)
    assert res.mean_decode_wait == pytest.approx((admitted - ready)[order].mean(), rel=1e-9, abs=1e-12)
    assert res.mean_latency == pytest.approx((completion - arr).mean(), rel=1e-12)
    return bool(((admitted - ready)[order] > 0).any())


def test_a_laps_prefill_pool_is_laps_alone_then_the_decode_pool():
    """LAPS's prefill instances as the prefill pool
    (``Disaggregated(prefill=LAPS(...))``), over 4 random deployments (2 to
    4 instances, a random threshold and link, 1 to 3 decode engines of
    random settings): the pool's engines are LAPS's instances; each
    request's arrival, prompt, instance and first token equal LAPS's run
    alone on the same seed, its prompts and outputs those of the
    deployment with a continuous prefill pool (common random numbers), and
    its transfer, decode admission and completion plain-Python decode
    engines' (:func:`_check_decode_pool`)."""
    rng = np.random.default_rng(9)
    waited = 0
    for _ in range(4):
        wl = mb.Workload(prompt=st.lognorm(0.8, scale=float(rng.uniform(40, 200))),
                         output=st.lognorm(0.6, scale=float(rng.uniform(4, 30))))
        k, ed = int(rng.integers(2, 5)), int(rng.integers(1, 4))
        laps = mb.LAPS(instances=k, threshold=int(rng.choice([32, 64, 128])))
        dk = _engine(rng, 4096)
        link = mb.KVTransfer(bandwidth=float(rng.uniform(1e7, 1e9)), latency=float(rng.choice([0.0, 0.005])),
                             bytes_per_token=float(rng.uniform(1e4, 3e5)))
        pol = mb.Disaggregated(prefill=laps, decode=mb.ContinuousBatching(**dk), decode_engines=ed, kv_transfer=link)
        assert pol.prefill_engines == k and pol.engines == k + ed
        kw = dict(arrivals=mb.Poisson(float(rng.uniform(5, 30))), workload=wl, service_model=MODEL, n=200,
                  seed=int(rng.integers(1 << 30)), keep_requests=True)
        res = mb.simulate(pol, **kw)
        r = res.requests
        alone = mb.simulate(laps, **kw).requests
        for mine, theirs in (("arrival", "arrival"), ("prompt", "prompt"), ("first_token", "first_token"),
                             ("prefill_engine", "instance")):
            np.testing.assert_array_equal(r[mine], alone[theirs], err_msg=mine)
        colocated = mb.simulate(mb.Disaggregated(decode=mb.ContinuousBatching(**dk), decode_engines=ed), **kw)
        for col in ("arrival", "prompt", "output"):
            np.testing.assert_array_equal(r[col], colocated.requests[col], err_msg=col)
        waited += _check_decode_pool(res, alone["first_token"], link, ed, dk)
        assert res.prefill.kind == "laps" and res.prefill_utilization == res.prefill.utilization
    assert waited >= 1


def test_the_requests_are_a_colocated_clusters_on_the_same_seed():
    """Common random numbers: a deployment serves the same requests, arrival
    times, prompts and outputs, as a colocated cluster on the same seed (so a
    comparison between them is paired)."""
    kw = dict(arrivals=mb.Poisson(6.0), workload=WL, n=400, seed=7, keep_requests=True)
    a = mb.simulate(mb.Disaggregated(prefill_engines=1, decode_engines=2), **kw).requests
    b = mb.simulate(mb.Cluster(mb.ContinuousBatching(), engines=3, router="least_used"), **kw).requests
    for col in ("arrival", "prompt", "output"):
        np.testing.assert_array_equal(a[col], b[col], err_msg=col)


@pytest.mark.parametrize("programs", [None, mb.Programs(calls=3, think_time=0.5, closed=True)],
                         ids=["open", "closed"])
def test_without_kept_requests_the_pools_keep_none_and_the_metrics_are_the_same(programs):
    """keep_requests=False: the deployment's metrics are those with it, bit
    for bit (its quantiles exact either way, read from its pools' records);
    its pools' results hold no records (their quantiles then their
    histograms'), with it each pool's records are whole."""
    pol = mb.Disaggregated(mb.ContinuousBatching(max_num_seqs=8), mb.ContinuousBatching(max_num_seqs=8),
                           prefill_engines=2, decode_engines=2, programs=programs)
    kw = dict(arrivals=mb.Poisson(6.0), workload=WL, n=600, seed=3)
    kept = mb.simulate(pol, keep_requests=True, **kw)
    lean = mb.simulate(pol, keep_requests=False, **kw)
    assert lean.requests is None and lean.prefill.requests is None and lean.decode.requests is None
    assert lean.metrics() == kept.metrics()
    for pool in ("prefill", "decode"):
        req = getattr(kept, pool).requests
        assert {"arrival", "admitted", "first_token", "completion", "preemptions", "latency", "ttft"} <= set(req)
        assert getattr(kept, pool).completed == getattr(lean, pool).completed


def test_a_slow_link_and_one_prefill_engine_show_in_their_metrics():
    """The transfer time is the link's (a tenth of the bandwidth: ten times
    the transfer); the time per output token that goodput reads counts it, so
    a tight objective on it is met less often over the slower link; the
    pools' results are kept."""
    kw = dict(arrivals=mb.Poisson(4.0), workload=mb.Workload(prompt=st.lognorm(0.8, scale=256),
                                                             output=st.lognorm(0.8, scale=64), tpot_slo=0.012),
              n=1500, seed=3)
    fast = mb.simulate(mb.Disaggregated(decode_engines=2), **kw)
    slow = mb.simulate(mb.Disaggregated(decode_engines=2, kv_transfer=mb.KVTransfer(bandwidth=1e8)), **kw)
    assert slow.mean_transfer_time == pytest.approx(fast.mean_transfer_time * 250, rel=1e-9)
    assert slow.goodput < fast.goodput
    assert fast.mean_ttft == slow.mean_ttft               # (the prefill pool does not see the link)
    assert isinstance(fast.prefill, mb.SimulationResult) and isinstance(fast.decode, mb.SimulationResult)
    assert fast.prefill.completed == 1500 and 0 < fast.decode.completed <= 1500
    assert 0 < fast.prefill_utilization < 1 and 0 < fast.decode_utilization <= 1
    assert fast.mean_tbt == fast.decode.mean_tbt and fast.tbt_p99 == fast.decode.tbt_p99


def test_bad_calls_are_refused_before_anything_runs():
    pol = mb.Disaggregated()
    kw = dict(arrivals=mb.Poisson(1.0), n=100)
    with pytest.raises(TypeError, match="service"):
        mb.simulate(pol, service=st.expon(), **kw)
    with pytest.raises(ValueError, match="servers"):
        mb.simulate(pol, workload=WL, servers=2, **kw)
    with pytest.raises(TypeError, match="mixture"):
        mb.simulate(pol, workload=mb.Workload.mixture({"a": (1, WL), "b": (1, WL)}), **kw)
    with pytest.raises(ValueError, match="workload.system_prompts: a LAPS prefill pool"):
        mb.simulate(mb.Disaggregated(prefill=mb.LAPS(instances=2)), workload=mb.Workload(
            prompt=st.lognorm(0.8, scale=256), output=st.lognorm(0.8, scale=64),
            system_prompts=mb.SystemPrompts(length=64, count=2, share=0.5)), **kw)
    with pytest.raises(ValueError, match=r"decode\.kv_tokens"):
        mb.simulate(mb.Disaggregated(decode=mb.ContinuousBatching(kv_tokens=256.0)), workload=WL, **kw)
    closed = mb.Programs(calls=2, closed=True)
    with pytest.raises(ValueError, match=r"decode\.predictor: in a closed loop"):
        mb.simulate(mb.Disaggregated(decode=mb.ContinuousBatching(predictor=mb.Predictions(np.ones(100))),
                                     programs=closed), workload=WL, **kw)
    with pytest.raises(ValueError, match=r"decode\.kv_tokens"):
        # (a closed loop's calls, checked by call id before the run)
        mb.simulate(mb.Disaggregated(decode=mb.ContinuousBatching(kv_tokens=256.0), programs=closed), workload=WL,
                    **kw)


@pytest.mark.parametrize("decode_router", ["round_robin", "least_used"])
@pytest.mark.parametrize("shared", [False, True])
def test_a_request_a_pool_could_never_run_is_named_by_its_place_in_arrival_order(decode_router, shared):
    """The refusal names the first request, in arrival order, whose KV cache
    could never fit a pool's blocks: on the decode pool its prompt (with its
    system prompt's tokens, which it brings) and ``output - 1`` tokens (a
    one-token request checked as two), on the prefill pool its prompt and
    one token; each pool's setting named (both pools' engines have a
    ``kv_tokens``); the requests are those a run with room for all of them
    serves on the same seed."""
    prompts = mb.SystemPrompts(length=64, count=3, share=0.5) if shared else None
    wl = mb.Workload(prompt=st.lognorm(0.8, scale=256), output=st.lognorm(0.8, scale=64), system_prompts=prompts)
    kw = dict(arrivals=mb.Poisson(2.0), workload=wl, n=300, seed=4)
    req = mb.simulate(mb.Disaggregated(decode_engines=2, decode_router=decode_router), keep_requests=True,
                      **kw).requests
    need = req["prompt"] + np.maximum(req["output"] - 1.0, 1.0)
    cap = float(np.quantile(need, 0.9)) // 16 * 16
    if shared:
        # (a bound the first request beyond which differs from the first beyond it without its system prompt:
        # the check must count those tokens)
        raw = mb.simulate(mb.Disaggregated(decode_engines=2), keep_requests=True,
                          **{**kw, "workload": mb.Workload(prompt=wl.prompt, output=wl.output)}).requests
        bare = raw["prompt"] + np.maximum(raw["output"] - 1.0, 1.0)
        cap = next(c for c in np.arange(16.0, need.max(), 16.0)
                   if np.flatnonzero(need > c)[0] != np.flatnonzero(bare > c)[0])
    r = int(np.flatnonzero(need > cap)[0])
    with pytest.raises(ValueError, match=rf"decode\.kv_tokens = {cap:g}: request {r} \(prompt "
                                         rf"{req['prompt'][r]:g} \+ output"):
        mb.simulate(mb.Disaggregated(decode=mb.ContinuousBatching(kv_tokens=cap), decode_engines=2,
                                     decode_router=decode_router), **kw)
    cap = float(np.quantile(req["prompt"] + 1.0, 0.9)) // 16 * 16
    r = int(np.flatnonzero(req["prompt"] + 1.0 > cap)[0])
    with pytest.raises(ValueError, match=rf"prefill\.kv_tokens = {cap:g}: request {r} \(prompt "
                                         rf"{req['prompt'][r]:g} \+ output 1 tokens\)"):
        mb.simulate(mb.Disaggregated(prefill=mb.ContinuousBatching(kv_tokens=cap), decode_engines=2,
                                     decode_router=decode_router), **kw)


def test_a_pool_whose_backlog_grows_is_named():
    """One decode engine of 8 sequences cannot keep up with long outputs at 20
    requests/s, though the prefill engine can: the run is unstable, the
    decode pool named (its arrivals, the transfers' ends, are judged as any
    run's); four decode engines at 5 requests/s keep up."""
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=256))
    e = mb.ContinuousBatching(max_num_seqs=8)
    with pytest.warns(mb.UnstableWarning, match="decode: the backlog grows"):
        res = mb.simulate(mb.Disaggregated(e, e), arrivals=mb.Poisson(20.0), workload=wl, n=4000, seed=1)
    assert res.unstable and res.unstable_reason.startswith("decode: ") and not res.prefill.unstable
    ok = mb.simulate(mb.Disaggregated(e, e, decode_engines=4), arrivals=mb.Poisson(5.0), workload=wl, n=4000, seed=1)
    assert not ok.unstable


def _peak(req, mine) -> tuple:
    """The instant one engine's queue is longest in a pool's records (its
    requests ``mine``: arrived before the instant, first admitted at or
    after it), taken at its arrivals: ``(requests waiting, instant)``."""
    a, ad = req["arrival"][mine], req["admitted"][mine]
    waiting = [int(np.sum((a < t) & (ad >= t))) for t in a]
    k = int(np.argmax(waiting))
    return waiting[k], float(a[k])


@pytest.mark.parametrize("pool, closed", [("prefill", False), ("prefill", True), ("decode", False),
                                          ("decode", True)])
def test_a_pools_engine_leaving_hands_its_queue_back_and_none_is_lost(pool, closed):
    """A pool's engine (prefill engine 0, decode engine 1; round robin)
    leaves when its queue is longest in the run without events and joins
    again 20 s later: the requests its pool routes again are exactly those
    waiting there then (the runs are the same up to that instant), every
    request completes, each keeps its arrival (the latency end to end and
    the time to first token count from it), and the engine takes no
    request while it is out.  Open loop and closed-loop programs alike."""
    wl = mb.Workload(prompt=st.lognorm(0.8, scale=512), output=st.lognorm(0.8, scale=64 if pool == "prefill" else 128))
    if pool == "prefill":
        engines = dict(prefill=mb.ContinuousBatching(max_num_seqs=1, max_batched_tokens=256),
                       decode=mb.ContinuousBatching(max_num_seqs=16, kv_tokens=40_000), decode_engines=4)
        rate, e = 20.0, 0
    else:
        engines = dict(prefill=mb.ContinuousBatching(max_num_seqs=2, max_batched_tokens=512),
                       decode=mb.ContinuousBatching(max_num_seqs=4, kv_tokens=20_000), decode_engines=3)
        rate, e = 8.0, 1
    programs = mb.Programs(calls=3, think_time=0.5, closed=True) if closed else None
    run = dict(arrivals=mb.Poisson(rate), workload=wl, n=3000, seed=1, keep_requests=True)
    base = mb.simulate(mb.Disaggregated(**engines, prefill_engines=2, router="round_robin", programs=programs),
                       **run)
    req = getattr(base, pool).requests
    mine = req["engine"] == e if pool == "prefill" else np.arange(req["arrival"].size) % 3 == e
    waiting, t = _peak(req, mine)
    events = [mb.EngineEvent(t, e), mb.EngineEvent(t + 20.0, e, "add")]
    res = mb.simulate(mb.Disaggregated(**engines, prefill_engines=2, router="round_robin", programs=programs,
                                       **{f"{pool}_events": events}), **run)
    assert getattr(res, pool).rerouted == waiting >= 5
    assert res.completed == 3000 and getattr(res, pool).completed == getattr(base, pool).completed
    r = res.requests
    assert np.all(r.first_token > r.arrival) and np.all(r.completion >= r.first_token)
    assert res.mean_latency == pytest.approx(float(np.mean(r.completion - r.arrival)), rel=1e-9)
    got = getattr(res, pool).requests
    out = (got["arrival"] >= t) & (got["arrival"] < t + 20.0)
    assert out.sum() > 20 and not np.any(got["engine"][out] == e)


@pytest.mark.parametrize("kw, match", [
    (dict(prefill=mb.ContinuousBatching(prefix_caching=True), prefill_engines=2,
          prefill_events=[mb.EngineEvent(1.0, 0)]),
     r"prefill_events: ContinuousBatching\(prefix_caching=True\) engines take no engine events"),
    (dict(decode=mb.ContinuousBatching(admission="mlfq"), decode_engines=2, decode_events=[mb.EngineEvent(1.0, 0)]),
     r"decode_events: an engine leaving .* ContinuousBatching\(admission='mlfq'\) cannot"),
    (dict(prefill_engines=2, prefill_events=[mb.EngineEvent(1.0, 2)]),
     r"prefill_events: engine must be in \[0, prefill_engines - 1 = 1\]"),
])
def test_engine_events_a_deployment_cannot_take_are_refused_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        mb.Disaggregated(**kw)


def test_each_prefill_stage_a_policy_declares_is_a_stage_of_the_planner():
    """A deployment's prefill pool is the stage its prefill policy declares
    (``prefill_stage``): every stage declared is one the planner runs and
    each it runs is declared; a policy that declares none is refused,
    the policies that do named."""
    from mbbatch.planners.disaggregated import STAGES
    from mbbatch.registry import POLICIES

    declared = {cls.__name__: cls.prefill_stage for cls in POLICIES.values() if cls.prefill_stage}
    assert declared == {"ContinuousBatching": "engines", "LAPS": "laps"}
    assert set(declared.values()) == set(STAGES)
    with pytest.raises(TypeError, match="prefill must be ContinuousBatching or LAPS .*; got MultiBin"):
        mb.Disaggregated(prefill=mb.MultiBin())
