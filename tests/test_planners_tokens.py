"""The planner of the event kernel (mbbatch.planners.tokens): a token-level
policy's plan from the rule it declares (``event_config``), its memory, and
its run's backlog guarded against the memory available at each doubling."""

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch._kernels import formation
from mbbatch.planners import tokens
from mbbatch.simulation import plan

WL = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))


@pytest.mark.parametrize("policy, form, bins", [
    (mb.StaticBatching(8), formation.FORM_STATIC, 1),
    (mb.DynamicBatching(), formation.FORM_DYNAMIC, 1),
    (mb.MultiBinDynamic(bins=3, warmup=50), formation.FORM_MULTIBIN_DYNAMIC, 3),
])
def test_a_plan_packs_the_rule_its_policy_declares(policy, form, bins):
    p = plan(policy, mb.Poisson(1.0), workload=WL, n=1000)
    assert isinstance(p, tokens.Plan) and p.kind == policy.kind and p.event == policy.event_config()
    config, _ = p.kernel_args
    assert config.policy[0][0] == form and config.policy[0][1] == bins
    assert p.kernel_args is p.kernel_args            # (packed once: every run of the plan shares them)


def test_a_plans_runs_are_simulates_runs():
    p = plan(mb.DynamicBatching(), mb.Poisson(2.0), workload=WL, n=2000)
    ss = np.random.SeedSequence(5)
    a, b = p.run(ss), mb.simulate(mb.DynamicBatching(), mb.Poisson(2.0), workload=WL, n=2000, seed=ss)
    assert a.metrics() == b.metrics() or all(x == y or (x != x and y != y) for x, y in
                                             zip(a.metrics().values(), b.metrics().values()))


def test_presampled_and_optimal_edges_are_set_before_the_run():
    """bin_edges = "presample" or "optimal": no warm-up, the bins from the
    first request (Algorithm 6 on a pre-sample, or eq. (2)'s optimum)."""
    for rule in ("presample", "optimal"):
        res = mb.simulate(mb.MultiBinDynamic(bins=3, bin_edges=rule), mb.Poisson(2.0), workload=WL, n=2000, seed=1)
        assert res.warmup_time == 0.0 and np.all(np.diff(res.edges) > 0)


def test_a_backlog_that_outgrows_the_memory_stops_the_run_naming_n(monkeypatch):
    """An overloaded open-arrival run queues a backlog that grows with n,
    which no check before the run can size: when its queues would outgrow
    the memory available, the run stops with a MemoryError naming n (it
    was the operating system's out-of-memory kill: 24 GB at n = 2**31).
    A run whose queues fit is unchanged."""
    import mbbatch.planners.tokens as sim

    wl = mb.Workload(prompt=st.lognorm(0.9, scale=250), output=st.lognorm(0.5, scale=40))
    kw = dict(arrivals=mb.Poisson(50.0), workload=wl, n=200_000, seed=3)
    full = mb.simulate(mb.StaticBatching(batch_size=2), **kw)
    assert full.throughput < 10.0                       # overloaded: the backlog grows with n
    monkeypatch.setattr(sim, "available_memory", lambda: 8 << 20)
    with pytest.raises(MemoryError, match=r"^n: this run's backlog outgrew the memory: [\d,]+ requests were "
                                          r"waiting .* more than the 8.0 MiB available"):
        mb.simulate(mb.StaticBatching(batch_size=2), **kw)
    small = mb.simulate(mb.StaticBatching(batch_size=2), **{**kw, "n": 2000})
    monkeypatch.undo()
    more = mb.simulate(mb.StaticBatching(batch_size=2), **{**kw, "n": 2000})
    assert small.to_dataset(arrays=True).equals(more.to_dataset(arrays=True))


def test_the_memory_guard_asks_at_each_doubling(monkeypatch):
    """The guard reads the memory available when the queues double, not once
    before the run: memory another process (another worker of a sweep) takes
    while the run goes on counts.  Here the first doublings see 1 TiB and the
    later ones 4 MiB: the run stops (read once, at the start, the 1 TiB let
    it run on to its end, as it would have run on to the out-of-memory kill)."""
    import mbbatch.planners.tokens as sim

    asked = []

    def available():
        asked.append(1)
        return 1 << 40 if len(asked) <= 3 else 4 << 20

    monkeypatch.setattr(sim, "available_memory", available)
    wl = mb.Workload(prompt=st.lognorm(0.9, scale=250), output=st.lognorm(0.5, scale=40))
    with pytest.raises(MemoryError, match=r"^n: this run's backlog outgrew .* more than the 4.0 MiB available"):
        mb.simulate(mb.StaticBatching(batch_size=2), arrivals=mb.Poisson(50.0), workload=wl, n=200_000, seed=3)
    assert len(asked) > 3                     # stopped at a doubling after the memory was taken


# --- the time to first token and between tokens, of every token-level policy -----------------------------

#: the largest relative error of a quantile read off the kernel's histograms (half a bucket)
HIST_RELATIVE = 2.0 ** -11
#: the token-level policies, and a cluster of run-to-completion engines
TOKEN_POLICIES = {
    "static": mb.StaticBatching(8),
    "spf": mb.ShortestPredictedFirst(batch_size=8),
    "dynamic": mb.DynamicBatching(controller=mb.SLAController(d_sla=7.4e-3, b_max=32)),
    "multibin_dynamic": mb.MultiBinDynamic(bins=3, warmup=50),
    "cluster": mb.Cluster(mb.DynamicBatching(), engines=2),
}
MODELS = {"decode": mb.DecodeModel(prefill_per_token=1e-5), "profile": mb.profiles.get("H100/vLLM/Meta-Llama-3-8B/tp1")}
QUANTILES = ("p50", "p95", "p99")


def token_times(res) -> tuple:
    return (np.array([getattr(res, f"ttft_{q}") for q in QUANTILES]),
            np.array([getattr(res, f"tbt_{q}") for q in QUANTILES]))


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("name", sorted(TOKEN_POLICIES))
def test_every_token_policy_reports_its_time_to_first_token_and_between_tokens(name, model):
    """Each token-level policy's TTFT quantiles, exact from the kept records
    and read off the histogram without them (within half a bucket), and its
    TBT quantiles, from the histogram either way, finite and ordered (their
    values are checked against the batches in test_kernels_dynamic.py); the
    other metrics identical with and without records."""
    kw = dict(arrivals=mb.Poisson(4.0 if model == "profile" else 20.0), workload=WL, service_model=MODELS[model],
              n=3000, servers=2, seed=11)
    kept = mb.simulate(TOKEN_POLICIES[name], keep_requests=True, **kw)
    hist = mb.simulate(TOKEN_POLICIES[name], **kw)
    ttft, tbt = token_times(kept)
    np.testing.assert_array_equal(ttft, np.quantile(kept.requests.ttft, (0.5, 0.95, 0.99), method="inverted_cdf"))
    h_ttft, h_tbt = token_times(hist)
    np.testing.assert_allclose(h_ttft, ttft, rtol=HIST_RELATIVE, atol=0)
    np.testing.assert_array_equal(h_tbt, tbt)
    assert np.all(np.diff(ttft) >= 0) and np.all(np.diff(tbt) >= 0) and np.isfinite(tbt).all()
    # (the quantiles of the latency and TTFT aside, exact or from the histogram, the same run)
    a, b = kept.metrics(), hist.metrics()
    assert a.keys() == b.keys()
    for k in a:
        if not k.startswith(("ttft_p", "latency_p")):
            assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), k


def test_tbt_counts_each_gap_between_two_tokens_once_on_a_hand_trace():
    """Static batches of 2 from 3 requests waiting at 0, outputs 1, 1 and 5
    tokens: the first batch (2 members, decode time per token beta (1 +
    gamma / 2)) has no gap between two tokens, the second (1 member, beta)
    has 4: every TBT quantile is beta's bucket.  Weighing batches by their
    tokens instead (7, of which 2 in the first batch) would make p95 and p99
    the first batch's.  The mean time per token stays token-weighted."""
    m = mb.DecodeModel()
    wl = mb.Workload(prompt=np.array([10.0, 10.0, 10.0]), output=np.array([1.0, 1.0, 5.0]))
    res = mb.simulate(mb.StaticBatching(2), mb.Saturated(), workload=wl, service_model=m, keep_requests=True)
    first = m.beta * (1 + m.gamma / 2)
    ttft, tbt = token_times(res)
    np.testing.assert_allclose(tbt, m.beta, rtol=HIST_RELATIVE, atol=0)
    # (the first tokens at one step of the first batch, twice, and one step after it ends)
    np.testing.assert_allclose(ttft, [first, first + m.beta, first + m.beta], rtol=1e-12)
    assert res.mean_tbt == pytest.approx((2 * first + 5 * m.beta) / 7, rel=1e-12)
    # outputs of one token: no gap, no time between tokens (the mean time per token is the batches')
    one = mb.simulate(mb.StaticBatching(2), mb.Saturated(), service_model=m,
                      workload=mb.Workload(prompt=np.full(3, 10.0), output=np.ones(3)))
    assert np.isnan(token_times(one)[1]).all() and one.mean_tbt > 0


def test_fractional_gaps_weigh_the_time_between_tokens():
    """Regression: lengths not in whole tokens give fractional gaps (output
    1.5 has 0.5 of a gap, output 0.5 none), which the TBT histogram weighs as
    they are.  Here the gaps 0.5 (first batch, beta (1 + gamma / 2)) and 2.25
    (second, beta), 2.75 in all: a whole-count reading (rank ceil(q x 2.75)
    = 3 for p95) would look for a third gap that is not there; the weights'
    own inverted CDF puts p50 at beta (2.25 >= 1.375) and p95, p99 at the
    first batch's (0.95 x 2.75 > 2.25)."""
    m = mb.DecodeModel()
    wl = mb.Workload(prompt=np.full(3, 10.0), output=np.array([1.5, 0.5, 3.25]), integer_lengths=False)
    _, tbt = token_times(mb.simulate(mb.StaticBatching(2), mb.Saturated(), workload=wl, service_model=m))
    np.testing.assert_allclose(tbt, [m.beta, m.beta * (1 + m.gamma / 2), m.beta * (1 + m.gamma / 2)],
                               rtol=HIST_RELATIVE, atol=0)


def test_a_cluster_of_run_to_completion_engines_reports_its_time_between_tokens():
    """Regression: a Cluster of DynamicBatching engines reported NaN for
    tbt_p50/p95/p99 (its planner set the continuous engines' TBT quantiles
    NaN for run-to-completion engines, though their batches decode one token
    per step): they are its batches' decode times per token now, as one
    engine's."""
    res = mb.simulate(mb.Cluster(mb.DynamicBatching(), engines=2), mb.Poisson(20.0), workload=WL, n=2000, seed=2,
                      keep_batches=True)
    m = mb.DecodeModel()
    size = res.batches["size"]
    tbt = token_times(res)[1]
    assert np.isfinite(tbt).all()
    step = m.beta * (1 + m.gamma * (size - 1) / size)
    assert step.min() * (1 - HIST_RELATIVE) <= tbt[0] and tbt[2] <= step.max() * (1 + HIST_RELATIVE)


def test_laps_decode_stage_reports_its_time_between_tokens():
    """LAPS's decode stage is a token-level run: its own result has the TBT
    quantiles (LAPS's own metrics stay the prefill's)."""
    res = mb.simulate(mb.LAPS(decode=mb.DynamicBatching()), mb.Poisson(2.0), workload=WL, n=500, seed=1)
    assert np.isfinite(token_times(res.decode)[1]).all()


def test_a_capacity_search_bounds_the_time_between_tokens():
    """Objective(tbt_p99=...) in find_capacity: static batches of up to 8
    under the decode model decode slower per token as they fill (beta (1 +
    gamma (b - 1) / b)), so 7 ms, met by batches of 3 or fewer, caps the rate
    far below the stability capacity."""
    from mbbatch.capacity import Objective, find_capacity

    kw = dict(workload=WL, n=2000, seed=4, rel_tol=0.1, searches=2)
    free = find_capacity(mb.StaticBatching(8), **kw)
    bound = find_capacity(mb.StaticBatching(8), objective=Objective(tbt_p99=7e-3), **kw)
    assert "tbt_p99 <= 0.007" in bound.criterion
    assert bound.rate_ci[1] < free.rate_ci[0]
    with pytest.raises(ValueError, match="objective: tbt_p99 is not a metric of MultiBin"):
        find_capacity(mb.MultiBin(bins=2, batch_size=8), service=st.uniform(1, 19), n=2000,
                      objective=Objective(tbt_p99=7e-3))


@pytest.mark.parametrize("policy", [mb.StaticBatching(16), mb.DynamicBatching(), mb.ShortestPredictedFirst(16),
                                    mb.Cluster(mb.DynamicBatching(), engines=2)], ids=lambda p: type(p).__name__)
def test_goodput_counts_each_member_within_its_objectives(policy):
    """A member of a run-to-completion batch meets the objective per output
    token when its batch's decode time per token does (one of a single token
    has none): with only a time-to-first-token objective goodput is the
    records' share within it; an unreachable per-token objective leaves the
    single-token requests within it; no objective, NaN."""
    prompt, output = st.uniform(16, 496), st.expon(scale=8)
    runs = {}
    for key, slo in (("ttft", dict(ttft_slo=0.05)), ("both", dict(ttft_slo=0.05, tpot_slo=1e-9)), ("none", {})):
        wl = mb.Workload(prompt=prompt, output=output, **slo)
        runs[key] = mb.simulate(policy, arrivals=mb.Poisson(40.0), workload=wl, n=3000, seed=2, keep_requests=True)
    q = runs["ttft"].requests
    within = q.ttft <= 0.05
    assert runs["ttft"].goodput == pytest.approx(within.mean(), rel=1e-12) and 0.2 < within.mean() < 1.0
    assert runs["both"].goodput == pytest.approx((within & (q.output <= 1)).mean(), rel=1e-12)
    assert math.isnan(runs["none"].goodput)
