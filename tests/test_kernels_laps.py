"""The LAPS kernel (mbbatch._kernels.laps) through mb.simulate: its router
decides as mbbatch.routing.LapsRouter at every step, every request is served
once, the dual queue and the waiting window on a hand-checked schedule, the
256/257 boundary, the equivalence with one FIFO queue, and goodput without a
decode stage (the first tokens within ttft_slo)."""

import math

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given, settings
from hypothesis import strategies as hs

import mbbatch as mb
from mbbatch.routing import LapsRouter

WL = mb.Workload(prompt=st.lognorm(1.0, scale=200), output=st.lognorm(0.8, scale=64))


def _run(policy, n=3000, rate=60.0, seed=1, workload=WL, arrivals=None, model=None):
    return mb.simulate(policy, arrivals=arrivals or mb.Poisson(rate), workload=workload, n=n, seed=seed,
                       keep_requests=True, service_model=model)


def _replay_router(res, policy):
    """Replay the run's arrivals and first tokens through LapsRouter in the
    kernel's order (at equal times batch ends first, then arrivals in
    order); return its (category, instance) per request and its moves."""
    r = res.requests
    router = LapsRouter(policy.instances, threshold=policy.threshold, interval=policy.interval,
                        ratio=policy.ratio, long_instances=policy.long_instances)
    events = sorted([(t, 1, i) for i, t in enumerate(r.arrival)] + [(t, 0, i) for i, t in enumerate(r.first_token)])
    got = [None] * len(r.arrival)
    for t, kind, i in events:
        if kind == 0:
            router.request_done("short" if r.category[i] == 0 else "long", int(r.instance[i]))
        else:
            cat, inst = router.select(int(r.prompt[i]), float(t))
            got[i] = (0 if cat == "short" else 1, inst)
    return got, router.moves


@settings(max_examples=12, deadline=None)
@given(instances=hs.integers(2, 5), interval=hs.sampled_from([0.0, 0.05, 0.5, 5.0]),
       ratio=hs.sampled_from([1.0, 2.0, 4.0]), rate=hs.sampled_from([20.0, 60.0, 120.0]), seed=hs.integers(0, 99))
def test_the_kernels_router_decides_as_laps_router_at_every_step(instances, interval, ratio, rate, seed):
    pol = mb.LAPS(instances=instances, interval=interval, ratio=ratio)
    res = _run(pol, n=1500, rate=rate, seed=seed)
    got, moves = _replay_router(res, pol)
    want = list(zip(res.requests.category.tolist(), res.requests.instance.tolist()))
    assert got == want
    log = res.group_moves_log
    assert res.group_moves == len(moves)
    assert [(float(t), int(i), g) for t, i, g in zip(log.time, log.instance, log.to_group)] == \
        [(t, i, to) for t, i, _, to in moves]


@pytest.mark.parametrize("policy", [mb.LAPS(instances=3), mb.LAPS(instances=4, window=0.0),
                                    mb.LAPS(instances=2, dynamic=False),
                                    mb.LAPS(instances=3, dual_queue=False, dynamic=False, max_batch=1)])
def test_every_request_is_served_once_in_batches_that_do_not_overlap(policy):
    res = _run(policy, n=4000, rate=80.0)
    r = res.requests
    assert res.completed == 4000 and np.all(np.isfinite(r.first_token))
    assert np.all(r.start >= r.arrival) and np.all(r.first_token > r.start)
    for e in range(policy.instances):
        mine = r.instance == e
        starts, ends = np.unique(r.start[mine], return_index=True)
        order = np.argsort(starts)
        batch_end = r.first_token[mine][ends][order]
        assert np.all(batch_end[:-1] <= starts[order][1:] + 1e-12), "batches overlap on one instance"
        sizes = np.unique(r.start[mine], return_counts=True)[1]
        assert sizes.max() <= policy.max_batch
    assert res.mean_batch_size == pytest.approx(4000 / res.n_batches)


def test_the_dual_queue_and_the_window_on_a_hand_checked_schedule():
    """One instance, window 5 ms, batches of 3, a = 0, b = 1 ms a token: a
    short request waits in its window; a long one arriving then runs at
    once; the third short request fills the batch, which runs when the long
    one ends (1.001 s)."""
    times = np.array([0.0, 0.001, 0.002, 0.010])
    prompts = np.array([100.0, 1000.0, 100.0, 100.0])
    wl = mb.Workload(prompt=prompts, output=np.ones(4))
    pol = mb.LAPS(instances=1, window=0.005, max_batch=3)
    res = _run(pol, n=4, workload=wl, arrivals=mb.Replay(times), model=mb.PrefillModel(a=0.0, b=1e-3))
    r = res.requests
    np.testing.assert_allclose(r.start, [1.001, 0.001, 1.001, 1.001])
    np.testing.assert_allclose(r.first_token, [1.301, 1.001, 1.301, 1.301])
    assert r.category.tolist() == [0, 1, 0, 0]
    # alone, a short request starts when its window expires
    alone = _run(pol, n=1, workload=mb.Workload(prompt=np.array([10.0]), output=np.ones(1)),
                 arrivals=mb.Replay(np.array([2.0])), model=mb.PrefillModel(a=0.0, b=1e-3))
    assert alone.requests.start[0] == pytest.approx(2.005)


def test_a_long_request_waits_while_short_ones_are_ready():
    """Window 0: a long request queued behind short ones starts only once no
    short request is pending."""
    times = np.array([0.0, 0.0, 0.0, 0.0])
    prompts = np.array([100.0, 1000.0, 100.0, 100.0])
    wl = mb.Workload(prompt=prompts, output=np.ones(4))
    pol = mb.LAPS(instances=1, window=0.0, max_batch=1)
    r = _run(pol, n=4, workload=wl, arrivals=mb.Replay(times), model=mb.PrefillModel(a=0.0, b=1e-3)).requests
    # request 0 starts at once; then the two other short ones; the long one last
    np.testing.assert_allclose(r.start, [0.0, 0.3, 0.1, 0.2])


def test_256_prompt_tokens_are_short_and_257_long():
    wl = mb.Workload(prompt=np.array([256.0, 257.0, 255.0, 258.0]), output=np.ones(4))
    r = _run(mb.LAPS(instances=2), n=4, workload=wl, arrivals=mb.Replay(np.arange(4.0))).requests
    assert r.category.tolist() == [0, 1, 0, 1]
    assert mb.LAPS(threshold=1000).threshold == 1000


def test_window_zero_and_a_threshold_above_every_prompt_is_one_fifo_queue():
    """Every request short, no window: the dual queue is one FIFO queue, bit
    for bit (router without groups)."""
    big = mb.LAPS(instances=3, threshold=10**9, window=0.0, dynamic=False)
    fifo = mb.LAPS(instances=3, threshold=10**9, window=0.0, dynamic=False, dual_queue=False)
    a, b = _run(big, n=3000, rate=90.0), _run(fifo, n=3000, rate=90.0)
    for col in ("instance", "start", "first_token"):
        np.testing.assert_array_equal(getattr(a.requests, col), getattr(b.requests, col))


def test_groups_keep_an_instance_and_move_at_most_once_per_interval():
    pol = mb.LAPS(instances=4, interval=0.2)
    res = _run(pol, n=6000, rate=100.0, seed=3)
    log = res.group_moves_log
    assert res.group_moves > 0
    assert np.all(np.diff(log.time) >= 0.2)
    short = pol.instances - pol.long_instances
    for g in log.to_group:
        short += 1 if g == "short" else -1
        assert 1 <= short <= pol.instances - 1
    assert 1.0 <= res.mean_short_instances <= pol.instances - 1


def test_instances_per_group_over_time():
    """With dynamic allocation, ``res.time_series`` holds the groups'
    instances from the first arrival and after each move: they sum to the
    instances, each keeps one, a move changes each by one, and their time
    average is ``mean_short_instances``.  Without it there is none."""
    pol = mb.LAPS(instances=4, interval=0.2)
    res = _run(pol, n=6000, rate=100.0, seed=3)
    ts = res.time_series
    short, long_, t = ts["short_instances"].values, ts["long_instances"].values, ts["time"].values
    assert ts["short_instances"].attrs["units"] == "instances"
    assert t.size == res.group_moves + 1 and t[0] == res.requests.arrival[0]
    np.testing.assert_array_equal(t[1:], res.group_moves_log.time)
    assert short[0] == pol.instances - pol.long_instances
    assert np.all(short + long_ == pol.instances) and short.min() >= 1 and long_.min() >= 1
    assert np.all(np.abs(np.diff(short)) == 1)
    end = t[0] + res.span
    area = np.sum(short * np.diff(np.append(t, end)))
    assert area / res.span == pytest.approx(res.mean_short_instances, rel=1e-12)
    assert _run(mb.LAPS(instances=4, dynamic=False), n=500, seed=3).time_series is None


def test_the_same_seed_gives_the_token_policies_requests():
    """LAPS draws arrivals and prompts on the token-level policies' streams:
    the same seed, the same arrival times and prompt lengths."""
    res = _run(mb.LAPS(instances=2), n=500, seed=9)
    tok = mb.simulate(mb.DynamicBatching(), arrivals=mb.Poisson(60.0), workload=WL, n=500, seed=9, keep_requests=True)
    np.testing.assert_array_equal(res.requests.arrival, tok.requests.arrival)
    np.testing.assert_array_equal(res.requests.prompt, tok.requests.prompt)
    again = _run(mb.LAPS(instances=2), n=500, seed=9)
    np.testing.assert_array_equal(res.requests.first_token, again.requests.first_token)


def test_decode_after_prefill_is_the_decode_policy_on_the_first_tokens():
    """With a decode stage, each request of more than one output token joins
    the decode policy at its first token to generate the others: the same
    run as the decode policy given those times, the prompts and the outputs
    less one as a trace, bit for bit; a one-token request is done at its
    first token; the prefill is untouched (its TTFT metrics and first
    tokens as without decode); latency is end to end."""
    rng = np.random.default_rng(4)
    n = 1500
    wl = mb.Workload(prompt=rng.integers(1, 1500, n).astype(float), output=rng.integers(1, 300, n).astype(float))
    for decode in (mb.DynamicBatching(), mb.StaticBatching(batch_size=8), mb.MultiBinDynamic(bins=2, warmup=100)):
        pol = mb.LAPS(instances=3, decode=decode, decode_servers=3)
        res = _run(pol, n=n, rate=30.0, workload=wl)
        alone = _run(mb.LAPS(instances=3), n=n, rate=30.0, workload=wl)
        r = res.requests
        np.testing.assert_array_equal(r.first_token, alone.requests.first_token)
        for m in ("mean_ttft", "ttft_short_p99", "ttft_long_p99", "utilization", "group_moves"):
            assert getattr(res, m) == getattr(alone, m), m
        many = np.flatnonzero(wl.output > 1)
        order = many[np.argsort(r.first_token[many], kind="stable")]
        assert 0 < many.size < n
        hand = mb.simulate(decode, mb.Replay(r.first_token[order]),
                           workload=mb.Workload(prompt=r.prompt[order], output=wl.output[order] - 1),
                           service_model=mb.DecodeModel(prefill_per_token=0.0), servers=3, n=many.size, seed=1,
                           keep_requests=True)
        np.testing.assert_array_equal(res.decode.requests.completion, hand.requests.completion)
        assert res.decode.kind == decode.kind and res.decode.n == many.size
        np.testing.assert_array_equal(r.completion[order], hand.requests.completion)
        np.testing.assert_array_equal(r.output, wl.output)
        one = wl.output == 1
        np.testing.assert_array_equal(r.completion[one], r.first_token[one])
        assert np.all(r.completion[~one] > r.first_token[~one])
        np.testing.assert_array_equal(r.latency, r.completion - r.arrival)
        assert res.mean_latency == pytest.approx(r.latency.mean(), rel=1e-12)
        assert res.latency_p99 == np.quantile(r.latency, 0.99, method="inverted_cdf")
        assert res.span == r.completion.max() - r.arrival.min()
        assert res.throughput == n / res.span


def test_a_continuous_decode_stage_decodes_from_the_iteration_that_admits_it():
    """decode=ContinuousBatching(): each request joins an engine (dealt in
    turn to 2) at its first token with its prompt's KV cache, so it
    prefills nothing: with iterations of a fixed 10 ms, it completes its
    output of o tokens o - 1 iterations after the iteration boundary that
    admits it (at its arrival, or within 10 ms: the first token is the
    prefill's, and the stage's first iteration reads it), and a one-token
    request at its first token; the prefill is untouched."""
    rng = np.random.default_rng(5)
    n = 1200
    wl = mb.Workload(prompt=rng.integers(1, 1500, n).astype(float), output=rng.integers(1, 300, n).astype(float))
    step = mb.IterationModel(setup=0.0, step=0.01, prefill_per_token=0.0, per_sequence=0.0, per_context_token=0.0)
    pol = mb.LAPS(instances=3, decode=mb.ContinuousBatching(max_num_seqs=64), decode_servers=2, decode_model=step)
    res = _run(pol, n=n, rate=30.0, workload=wl)
    alone = _run(mb.LAPS(instances=3), n=n, rate=30.0, workload=wl)
    r = res.requests
    np.testing.assert_array_equal(r.first_token, alone.requests.first_token)
    assert res.decode.kind == "continuous" and res.decode.servers == 2
    assert res.decode.recomputed_tokens == 0 and res.decode.preemptions == 0
    took = r.completion - r.first_token
    assert np.all(took >= 0.01 * (r.output - 1) - 1e-9) and np.all(took < 0.01 * r.output + 1e-9)
    # (some arrived at an idle engine: exactly o - 1 iterations)
    assert np.any((took < 0.01 * (r.output - 1) + 1e-9) & (r.output > 1))
    assert np.any(r.output == 1) and np.all(took[r.output == 1] == 0.0)
    np.testing.assert_array_equal(r.latency, r.completion - r.arrival)


def test_a_decode_stage_no_request_reaches_is_refused_before_the_prefill():
    """The prefill generates a request's first token: outputs of one token leave the decode stage
    nothing, which is refused before any run, naming decode and the outputs' bound."""
    wl = mb.Workload(prompt=st.uniform(1, 100), output=np.ones(50))
    with pytest.raises(ValueError, match=r"decode: LAPS's decode stage .* got workload.output of at most 1 tokens"):
        mb.simulate(mb.LAPS(instances=2, decode=mb.DynamicBatching()), arrivals=mb.Poisson(10.0), workload=wl,
                    n=50, seed=0)
    res = mb.simulate(mb.LAPS(instances=2), arrivals=mb.Poisson(10.0), workload=wl, n=50, seed=0)
    assert res.completed == 50


def test_decode_stage_settings_are_checked():
    with pytest.raises(TypeError, match="decode must be"):
        mb.LAPS(decode=mb.LAPS())
    with pytest.raises(TypeError, match="pass decode="):
        mb.LAPS(decode_model=mb.DecodeModel())
    with pytest.raises(ValueError, match="decode_servers"):
        mb.LAPS(decode=mb.DynamicBatching(), decode_servers=0)
    with pytest.raises(TypeError, match="decode_model must be an instance of MaxModel or LinearModel or"):
        mb.LAPS(decode=mb.DynamicBatching(), decode_model=mb.PrefillModel())


def test_metrics_by_category():
    res = _run(mb.LAPS(instances=4), n=5000)
    r = res.requests
    short = r.category == 0
    assert res.short_share == pytest.approx(short.mean())
    assert res.mean_ttft_short == pytest.approx(r.ttft[short].mean(), rel=1e-9)
    assert res.mean_ttft_long == pytest.approx(r.ttft[~short].mean(), rel=1e-9)
    # histogram quantiles: within half a bucket (relative 2**-11) of the exact ones
    for c, sel in (("short", short), ("long", ~short)):
        exact = np.quantile(r.ttft[sel], [0.5, 0.95, 0.99], method="inverted_cdf")
        got = [getattr(res, f"ttft_{c}_{q}") for q in ("p50", "p95", "p99")]
        np.testing.assert_allclose(got, exact, rtol=2.0 ** -10)
    # the time to first token over both categories; no tokens after it without a decode stage
    exact = np.quantile(r.ttft, [0.5, 0.95, 0.99], method="inverted_cdf")
    np.testing.assert_allclose([res.ttft_p50, res.ttft_p95, res.ttft_p99], exact, rtol=2.0 ** -10)
    assert np.isnan(res.mean_tbt) and np.isnan(res.tbt_p99) and np.isnan(res.token_throughput)
    with pytest.raises(AttributeError, match="does not apply to laps"):
        res.preemptions


def test_laps_with_a_decode_stage_reports_its_time_between_tokens():
    """LAPS reported no time between tokens (nor its time to first token's quantiles) though its
    decode stage generates the tokens: they are the decode stage's now (its result, ``res.decode``),
    and the tokens generated over the whole run's span."""
    for stage in (mb.ContinuousBatching(max_num_seqs=16), mb.StaticBatching(8)):
        res = _run(mb.LAPS(instances=2, decode=stage), n=3000)
        dec = res.decode
        assert (res.mean_tbt, res.tbt_p50, res.tbt_p95, res.tbt_p99) == (dec.mean_tbt, dec.tbt_p50, dec.tbt_p95,
                                                                          dec.tbt_p99)
        assert 0 < res.tbt_p50 <= res.tbt_p99 and res.ttft_p50 <= res.ttft_p99 < res.latency_p99
        assert res.token_throughput == pytest.approx(res.requests.output.sum() / res.span, rel=1e-12)


@pytest.mark.parametrize("kw, exc, match", [
    ({"service": st.uniform(1, 2), "workload": None}, TypeError, "LAPS takes workload="),
    ({"servers": 4}, ValueError, r"servers does not apply to LAPS"),
    ({"service_model": mb.DecodeModel()}, TypeError, r"LAPS takes service_model=PrefillModel"),
    ({"keep_batches": True}, TypeError, "keep_batches is for the token-level policies"),
])
def test_bad_arguments_are_refused(kw, exc, match):
    args = dict(arrivals=mb.Poisson(1.0), workload=WL, n=10, seed=0)
    args.update(kw)
    with pytest.raises(exc, match=match):
        mb.simulate(mb.LAPS(), **args)


@pytest.mark.parametrize("kw, match", [
    ({"instances": 0}, r"instances must be"), ({"window": -0.1}, r"window must be in \[0, inf\)"),
    ({"max_batch": 0}, "max_batch must be"), ({"ratio": 0.0}, r"ratio must be in \(0, inf\)"),
    ({"instances": 3, "long_instances": 3}, r"long_instances must be in \[1, instances - 1 = 2\]"),
    ({"dual_queue": 1}, "dual_queue must be a bool"),
])
def test_laps_settings_are_checked(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        mb.LAPS(**kw)


def test_the_prefill_model_and_its_fit():
    m = mb.PrefillModel(a=0.01, b=2e-4)
    assert m.service_time(sum_prompt=1000) == pytest.approx(0.21)
    rng = np.random.default_rng(0)
    x = rng.uniform(100, 5000, 200)
    fit = mb.PrefillModel.fit({"sum_prompt": x, "service": 0.01 + 2e-4 * x + rng.normal(0, 1e-4, x.size)})
    assert fit.params["a"] == pytest.approx(0.01, abs=1e-4) and fit.params["b"] == pytest.approx(2e-4, rel=1e-3)
    with pytest.raises(ValueError, match=r"b must be in \(0, 1e\+290\)"):
        mb.PrefillModel(b=0.0)


def test_find_capacity_searches_laps():
    """LAPS's groups can overload one group while the instances' average
    load is below 1: the throughput criterion decides its capacity.  With a
    1 % tolerance the highest rate that passed keeps up within 1 %, the
    lowest that failed does not; a TTFT objective gives less."""
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=200), output=st.lognorm(0.8, scale=64))
    pol = mb.LAPS(instances=2, window=0.0)
    kw = dict(workload=wl, n=4000, seed=1, rel_tol=0.05, throughput_tol=0.01, searches=1)
    cap = mb.find_capacity(pol, **kw)
    passed = max((p for p in cap.probes if p.verdict == "pass"), key=lambda p: p.rate)
    failed = min((p for p in cap.probes if p.verdict == "fail"), key=lambda p: p.rate)
    assert passed.row("throughput / rate")[3] >= 0.99 > failed.row("throughput / rate")[3]
    assert failed.row("load")[5] == "pass"          # the average load alone would not see it
    tight = mb.find_capacity(pol, **kw, objective=mb.Objective(mean_ttft=0.05))
    assert tight.rate < cap.rate


def test_find_capacity_refuses_an_objective_laps_does_not_measure():
    with pytest.raises(ValueError, match="sla_violation_share is not a metric of LAPS"):
        mb.find_capacity(mb.LAPS(instances=2), workload=WL, n=100,
                         objective=mb.Objective(sla_violation_share=0.1))


def _kernel_args(n, ttft_slo=np.inf):
    """The kernel's configuration and inputs of a small run: 3 instances, uniform prompts in [1, 601]."""
    from mbbatch._kernels import laps as k

    config = k.CONFIG.pack(n=n, arrival_kind=k.ARR_POISSON, prompt_kind=k.SVC_UNIFORM, integer=1, instances=3,
                           threshold=256, max_batch=4, dual=1, dynamic=1, long0=1, keep=1, rate=40.0, window=0.005,
                           max_batch_tokens=4000.0, interval=0.5, ratio=2.0, a=0.01, b=1e-4, ttft_slo=ttft_slo)
    inputs = k.INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                           prompt_params=np.array([1.0, 600.0]), prompt_values=np.empty(0))
    return config, inputs


@pytest.mark.parametrize("n,groups", [(5, 32), (100, 7), (1000, 32), (1000, 64), (777, 1)])
def test_the_backlog_checks_group_sums_are_each_arrival_groups(n, groups):
    """The kernel's TTFT sums and counts per category and contiguous group of
    arrivals (request r in group r * G // n, the backlog check's input; the
    kernel keeps each request's group beside its category) equal those
    recomputed from its per-request records, with fewer requests than
    groups too; more groups than a request's record holds are refused."""
    from mbbatch._kernels import laps as k

    config, inputs = _kernel_args(n)
    gen = np.random.default_rng(n)
    out, req, code = k.run(config, inputs, k.LapsStreams(gen, gen), np.zeros(k.STOP_SIZE, np.int64), groups=groups)
    assert code == 0
    g = np.arange(n) * groups // n
    count = np.zeros((2, groups), np.int64)
    total = np.zeros((2, groups))
    np.add.at(count, (req["category"], g), 1)
    np.add.at(total, (req["category"], g), req["first_token"] - req["arrival"])
    assert np.array_equal(out.group_count, count) and count.sum() == n
    np.testing.assert_allclose(out.group_ttft, total, rtol=1e-12, atol=0.0)
    with pytest.raises(ValueError, match=r"groups must be an integer in \[1, 64\]; got 65"):
        k.run(config, inputs, k.LapsStreams(gen, gen), np.zeros(k.STOP_SIZE, np.int64), groups=65)


# --- goodput --------------------------------------------------------------------------------


def test_the_kernel_counts_the_first_tokens_within_ttft_slo_only_where_it_is_set():
    """The kernel's ``good`` is the records' count of first tokens within
    ttft_slo; without an objective (inf) it counts nothing, and the run is
    the same bit for bit either way."""
    from mbbatch._kernels import laps as k

    n, slo = 2000, 0.05
    runs = {}
    for key, value in (("slo", slo), ("none", np.inf)):
        config, inputs = _kernel_args(n, ttft_slo=value)
        gen = np.random.default_rng(11)
        runs[key] = k.run(config, inputs, k.LapsStreams(gen, gen), np.zeros(k.STOP_SIZE, np.int64))
    (out, req, _), (bare, bare_req, _) = runs["slo"], runs["none"]
    good = np.count_nonzero(req["first_token"] - req["arrival"] <= slo)
    assert k.STATS.unpack((out.ints, out.floats))["good"] == good and 0 < good < n
    assert k.STATS.unpack((bare.ints, bare.floats))["good"] == 0
    np.testing.assert_array_equal(np.delete(out.ints, k.STATS.index.good), np.delete(bare.ints, k.STATS.index.good))
    np.testing.assert_array_equal(out.floats, bare.floats)
    for col in req:
        np.testing.assert_array_equal(req[col], bare_req[col])


def test_goodput_without_a_decode_stage_is_the_share_of_first_tokens_within_ttft_slo():
    """Without a decode stage a request ends at its first token: goodput is
    the share of the records whose time to first token is within ttft_slo,
    recomputed here exactly; the objective changes nothing else (every other
    metric and record bit for bit); without objectives goodput is NaN."""
    pol = mb.LAPS(instances=3)
    bare = _run(pol, n=4000, rate=70.0, seed=5)
    slo = float(np.median(bare.requests.first_token - bare.requests.arrival))
    res = _run(pol, n=4000, rate=70.0, seed=5,
               workload=mb.Workload(prompt=WL.prompt, output=WL.output, ttft_slo=slo))
    r = res.requests
    within = r.first_token - r.arrival <= slo
    assert res.goodput == within.mean() and 0.4 < within.mean() < 0.6
    assert math.isnan(bare.goodput)
    others = {m: v for m, v in res.metrics().items() if m != "goodput"}
    np.testing.assert_equal(others, {m: v for m, v in bare.metrics().items() if m != "goodput"})
    for col in r.columns:
        np.testing.assert_array_equal(getattr(r, col), getattr(bare.requests, col))


def test_a_time_per_output_token_objective_without_a_decode_stage_is_refused():
    """LAPS without a decode stage returns only each request's first token:
    there is no time per output token to hold to tpot_slo, so a workload
    with one is refused, naming it, rather than counted as met; with a
    decode stage it is taken."""
    wl = mb.Workload(prompt=WL.prompt, output=WL.output, ttft_slo=0.1, tpot_slo=0.02)
    with pytest.raises(ValueError, match=r"tpot_slo: LAPS without a decode stage .* got tpot_slo = 0\.02"):
        mb.simulate(mb.LAPS(instances=2), arrivals=mb.Poisson(10.0), workload=wl, n=100, seed=0)
    res = mb.simulate(mb.LAPS(instances=2, decode=mb.DynamicBatching()), arrivals=mb.Poisson(10.0), workload=wl,
                      n=200, seed=0)
    assert 0.0 <= res.goodput <= 1.0


@pytest.mark.parametrize("policy, slo", [
    (mb.LAPS(instances=2), dict(ttft_slo=0.1)),
    (mb.LAPS(instances=2, decode=mb.ContinuousBatching(max_num_seqs=16)), dict(ttft_slo=0.1, tpot_slo=0.02)),
], ids=["prefill", "continuous decode stage"])
def test_find_capacity_searches_laps_under_a_goodput_objective(policy, slo):
    """Objective(goodput=0.9) applies to LAPS (it was refused: not a metric
    of LAPS): the highest rate that passed has its goodput's interval at or
    above 0.9, and some probe the instances carry (load and throughput
    passing) fails on goodput alone."""
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=200), output=st.expon(scale=16), **slo)
    cap = mb.find_capacity(policy, workload=wl, n=2000, seed=3, rel_tol=0.05, searches=1,
                           objective=mb.Objective(goodput=0.9))
    passed = max((p for p in cap.probes if p.verdict == "pass"), key=lambda p: p.rate)
    assert cap.rate > 0 and passed.row("goodput")[2] >= 0.9
    assert any(p.row("goodput")[5] == "fail" and p.row("load")[5] == p.row("throughput / rate")[5] == "pass"
               for p in cap.probes)
