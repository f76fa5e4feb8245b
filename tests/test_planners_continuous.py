"""The continuous-batching planner: what it refuses before a run, the
requests it runs (the token-level policies' for one seed), its metrics, and
the engine as a queue."""

import math
import warnings

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb

WL = mb.Workload(prompt=st.lognorm(0.8, scale=256), output=st.lognorm(0.8, scale=128))


@pytest.mark.parametrize("kw, exc, match", [
    (dict(service=st.uniform(1, 2)), (TypeError, ValueError), "service="),
    (dict(keep_batches=True), TypeError, "keep_batches"),
    (dict(servers=2), ValueError, "servers"),
    (dict(service_model=mb.DecodeModel()), TypeError, "IterationModel"),
    (dict(workload=mb.Workload(prompt=st.lognorm(0.8, scale=256), output=st.expon(scale=50),
                               integer_lengths=False)), ValueError, "integer_lengths"),
])
def test_bad_calls_are_refused_before_the_run(kw, exc, match):
    args = {"workload": WL, **kw}
    with pytest.raises(exc, match=match):
        mb.simulate(mb.ContinuousBatching(), mb.Poisson(1.0), n=100, **args)


def test_a_request_that_never_fits_is_refused_naming_it():
    wl = mb.Workload(prompt=[100.0, 3000.0, 50.0], output=[10.0, 200.0, 20.0])
    with pytest.raises(ValueError, match=r"kv_tokens = 3000: request 1 \(prompt 3000 \+ output 200 tokens\)"):
        mb.simulate(mb.ContinuousBatching(kv_tokens=3000), mb.Poisson(1.0), workload=wl)
    with pytest.raises(ValueError, match="max_batched_tokens = 2048: without chunked prefill.*request 1 needs 3000"):
        mb.simulate(mb.ContinuousBatching(chunked_prefill=False), mb.Poisson(1.0), workload=wl)
    # chunked prefill spreads the long prompt over iterations
    res = mb.simulate(mb.ContinuousBatching(), mb.Poisson(1.0), workload=wl)
    assert res.completed == 3


def test_the_same_seed_runs_the_token_policies_requests_and_the_same_results():
    a = mb.simulate(mb.StaticBatching(8), mb.Poisson(2.0), workload=WL, n=2000, seed=5, keep_requests=True)
    pol = mb.ContinuousBatching(kv_tokens=20_000, admission="spf")
    b = mb.simulate(pol, mb.Poisson(2.0), workload=WL, n=2000, seed=5, keep_requests=True)
    for col in ("arrival", "prompt", "output"):
        np.testing.assert_array_equal(getattr(a.requests, col), getattr(b.requests, col))
    c = mb.simulate(pol, mb.Poisson(2.0), workload=WL, n=2000, seed=5, keep_requests=True)
    assert b.to_dataset().drop_attrs().equals(c.to_dataset().drop_attrs())
    np.testing.assert_array_equal(b.requests.completion, c.requests.completion)


def test_its_metrics_hold_together():
    pol = mb.ContinuousBatching(max_num_seqs=64, kv_tokens=30_000, admission="multibin", bins=3)
    res = mb.simulate(pol, mb.Poisson(15.0), workload=WL, n=20_000, seed=2, keep_requests=True)
    r = res.requests
    assert res.completed == 20_000 and not res.unstable
    assert res.preemptions == r.preemptions.sum() > 0
    assert 0 < res.mean_ttft < res.mean_latency and res.tbt_p50 <= res.tbt_p95 <= res.tbt_p99
    assert res.mean_running <= 64 and 0 < res.kv_usage_mean <= 1
    # the first token after the admission, the completion after it; latency quantiles exact from the records
    assert np.all(r.admitted >= r.arrival) and np.all(r.first_token > r.admitted)
    assert np.all(r.completion >= r.first_token)
    assert res.latency_p95 == np.quantile(r.latency, 0.95, method="inverted_cdf")
    assert res.token_throughput == pytest.approx(r.output.sum() / res.span, rel=1e-12)
    assert set(res.time_series.data_vars) == {"running", "waiting", "kv_blocks"}
    assert int(res.batch_size_hist.sum()) == res.n_batches


@pytest.mark.parametrize("kw", [dict(), dict(chunked_prefill=False, max_batched_tokens=16384, admission="spf"),
                                dict(max_num_seqs=16, kv_tokens=20_000, admission="multibin")])
def test_littles_law_holds_on_every_run(kw):
    """The engine's time-average requests in it (counted by the kernel as
    they wait and run) is the throughput times the mean latency: the
    sample-path Little's law, L T = sum of latencies, to rounding."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mb.UnstableWarning)
        for arr in (mb.Poisson(15.0), mb.Saturated()):
            res = mb.simulate(mb.ContinuousBatching(**kw), arr, workload=WL, n=5000, seed=4)
            assert res.mean_in_system == pytest.approx(res.throughput * res.mean_latency, rel=1e-9)


def test_one_sequence_at_a_time_is_an_mg1_queue():
    """max_num_seqs = 1 without chunking is a FIFO single server whose
    service is the IterationModel's batch of one: its mean wait is the
    Pollaczek-Khinchine formula's lambda E[S^2] / (2 (1 - rho)), with E[S]
    and E[S^2] exact over the replayed lengths, within the 99.9 % t-interval
    of 8 independent runs' mean waits (n = 20,000 each, load 0.6; each
    run's first requests see an empty queue, a bias below a tenth of the
    interval here)."""
    m = mb.IterationModel(setup=0.0, step=0.01, prefill_per_token=1e-4, per_sequence=1e-3,
                          per_context_token=1e-6)
    # independent uniform whole-token lengths: E[S] and E[S^2] over every pair
    wl = mb.Workload(prompt=st.uniform(0, 299), output=st.uniform(0, 99))   # (rounded up: 1 .. 299, 1 .. 99)
    p, o = np.meshgrid(np.arange(1.0, 300.0), np.arange(1.0, 100.0))
    s = m.service_time(size=np.ones(p.size, np.int64), prompt=p.ravel(), output=o.ravel())
    es, es2 = s.mean(), (s ** 2).mean()
    lam = 0.6 / es
    want = lam * es2 / (2 * (1 - lam * es))
    pol = mb.ContinuousBatching(max_num_seqs=1, max_batched_tokens=400, chunked_prefill=False)
    waits = []
    for seed in range(8):
        res = mb.simulate(pol, mb.Poisson(lam), workload=wl, service_model=m, n=20_000, seed=seed,
                          keep_requests=True)
        waits.append(float(np.mean(res.requests.admitted - res.requests.arrival)))
    w = np.array(waits)
    half = st.t.ppf(0.9995, w.size - 1) * w.std(ddof=1) / math.sqrt(w.size)
    assert abs(w.mean() - want) < half, (w.mean(), want, half)
