"""mb.simulate: the paper's examples, agreement with the closed forms, the
plain-Python reference, reproducibility and common random numbers.

Statistical tests state their confidence level.  Under the derandomized
``ci`` hypothesis profile the drawn examples are fixed, so each run repeats the
same experiment; at 99.99% per example and at most 25 examples per test, a
correct kernel passes a test with probability >= 99.75%.
"""

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given
from hypothesis import strategies as hs

import mbbatch as mb
import mbbatch._running
import mbbatch.simulation
from mbbatch import theory
from mbbatch.metrics import METRICS
from mbbatch.simulation import check_simulation

from .reference import reference_latencies

#: two-sided normal quantile for 99.99% confidence
Z_9999 = st.norm.ppf(1 - 0.0001 / 2)

widths = hs.floats(0.5, 100.0)
l_mins = hs.floats(0.0, 50.0)


# --- the paper's Figure 1b example -------------------------------------------

def test_figure_1b_one_bin_takes_11():
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=2, edges=[1, 6]), arrivals=mb.Saturated(),
                      service=[1, 5, 2, 6])
    assert res.span == 11.0
    assert res.n_batches == 2 and res.excluded_partial == 0


def test_figure_1b_two_bins_take_8():
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=2, edges=[1, 3, 6]), arrivals=mb.Saturated(),
                      service=[1, 5, 2, 6], keep_requests=True)
    assert res.span == 8.0
    assert res.throughput == 4 / 8
    assert res.requests.bin.tolist() == [0, 1, 0, 1]
    # batch (1, 2) runs 0..2, batch (5, 6) runs 2..8
    np.testing.assert_array_equal(res.requests.completion, [2.0, 8.0, 2.0, 8.0])


# --- agreement with the closed forms -----------------------------------------

@given(B=hs.integers(2, 64), k=hs.integers(1, 6), l_min=l_mins, width=widths)
def test_saturated_throughput_matches_theorem_4_2(B, k, l_min, width):
    """Saturated, one server: throughput = B / mean batch service time, and the
    mean batch service time estimates E[t_service,k] of Theorem 4.2 (eq. 20);
    99.99% CLT interval from the sample standard deviation of the batches."""
    n_batches = 3000
    res = mb.simulate(mb.MultiBin(bins=k, batch_size=B), arrivals=mb.Saturated(),
                      service=st.uniform(l_min, width), n=n_batches * B, seed=B * 1000 + k)
    assert res.throughput == pytest.approx(B / res.mean_batch_service, rel=1e-12)
    half = Z_9999 * res.std_batch_service / math.sqrt(res.n_batches)
    expected = theory.service_time(B, l_min, l_min + width, k)
    assert abs(res.mean_batch_service - expected) <= half
    predicted = theory.throughput(B, l_min, l_min + width, k)
    assert B / (res.mean_batch_service + half) <= predicted <= B / (res.mean_batch_service - half)


@given(B=hs.integers(2, 32), k=hs.integers(1, 4), lam=hs.floats(0.5, 50.0),
       l_min=l_mins, width=widths)
def test_infinite_server_latency_matches_lemma_5_1(B, k, lam, l_min, width):
    """Infinitely many servers (Assumption 5.1): the mean latency is Lemma 5.1's
    (eq. 7); 99.99% batch-means interval (t with 31 degrees of freedom)."""
    n = 2000 * B * k
    res = mb.simulate(mb.MultiBin(bins=k, batch_size=B), arrivals=mb.Poisson(rate=lam),
                      service=st.uniform(l_min, width), n=n, servers=math.inf, seed=7 + B + 100 * k)
    g = res.group_mean_latency
    half = st.t.ppf(1 - 0.0001 / 2, g.size - 1) * g.std(ddof=1) / math.sqrt(g.size)
    expected = theory.latency(B, l_min, l_min + width, k, lam)
    assert abs(res.mean_latency - expected) <= half
    assert res.mean_queue_wait == 0.0


@given(B=hs.integers(2, 64), k=hs.integers(1, 5), mu=hs.floats(0.05, 5.0),
       lemma_a1=hs.booleans())
def test_saturated_exponential_matches_batch_service_time(B, k, mu, lemma_a1):
    """Exponential service (Assumption A.1), at Lemma A.1's edges or at
    equal-mass edges: the saturated mean batch service time estimates the
    exact ``batch_service_time``; 99.99% CLT interval."""
    dist = st.expon(scale=1 / mu)
    edges = theory.exponential_boundaries(B, mu, k) if lemma_a1 else dist.ppf(np.linspace(0, 1, k + 1))
    res = mb.simulate(mb.MultiBin(bins=k, batch_size=B, edges=edges), arrivals=mb.Saturated(),
                      service=dist, n=3000 * B, seed=B + 64 * k)
    half = Z_9999 * res.std_batch_service / math.sqrt(res.n_batches)
    assert abs(res.mean_batch_service - theory.batch_service_time(dist, edges, B)) <= half
    if lemma_a1:
        # and Corollary A.1.1: the bound holds beyond sampling error
        assert res.mean_batch_service - half <= theory.exponential_service_bound(B, mu, k)


def test_one_server_latency_exceeds_lemma_5_1():
    """Remark 5.1: with one server the infinite-server latency is a lower bound
    (99.99% batch-means interval)."""
    B, k, lam = 128, 2, 8.0
    res = mb.simulate(mb.MultiBin(bins=k, batch_size=B), arrivals=mb.Poisson(rate=lam),
                      service=st.uniform(1, 19), n=400_000, seed=3)
    g = res.group_mean_latency
    half = st.t.ppf(1 - 0.0001 / 2, g.size - 1) * g.std(ddof=1) / math.sqrt(g.size)
    assert res.mean_latency - half > theory.latency(B, 1, 20, k, lam)


# --- two computation paths ---------------------------------------------------

@given(n=hs.integers(1, 3000), B=hs.integers(1, 8), k=hs.integers(1, 4),
       servers=hs.sampled_from([1, 2, 3, math.inf]), saturated=hs.booleans(),
       expon=hs.booleans(), seed=hs.integers(0, 2**32),
       max_wait=hs.sampled_from([math.inf, math.inf, 0.0, 0.5, 3.0]))
def test_kernel_matches_python_event_loop(n, B, k, servers, saturated, expon, seed, max_wait):
    """The kernel and an independent plain-Python event loop, fed the same
    draws, give identical per-request latencies (NaN for excluded requests),
    with and without max_wait.  n spans several of the kernel's draw blocks."""
    service = st.expon(scale=2.0) if expon else st.uniform(1, 19)
    arrivals = mb.Saturated() if saturated else mb.Poisson(rate=3.0)
    res = mb.simulate(mb.MultiBin(bins=k, batch_size=B, max_wait=max_wait), arrivals=arrivals,
                      service=service, n=n, servers=servers, seed=seed, keep_requests=True)
    req = res.requests
    ref = reference_latencies(req.arrival, req.service, res.edges, B, servers, max_wait)
    np.testing.assert_array_equal(req.latency, ref)
    assert res.completed == int(np.sum(~np.isnan(ref)))
    assert res.excluded_partial == n - res.completed
    if max_wait < math.inf:
        assert res.excluded_partial == 0
    if res.completed:
        assert res.mean_latency == pytest.approx(np.nanmean(ref), rel=1e-12)


@pytest.mark.parametrize("arrivals", [mb.Saturated(), mb.Replay(np.repeat(np.arange(0.0, 60.0, 0.5), 4))],
                         ids=["saturated", "replayed_ties"])
@pytest.mark.parametrize("max_wait", [0.0, 0.7])
@pytest.mark.parametrize("servers", [1, 3])
@pytest.mark.parametrize("n", [2, 45, 480])
def test_partial_batches_due_together_leave_in_arrival_order(arrivals, max_wait, servers, n):
    """Partial batches due at the same time (their oldest members arrived at
    the same time) leave in the order those members arrived, as in the
    reference event loop; the kernel once sent the lowest bin first.  The
    first case (n = 2, saturated, max_wait = 0, seed 1) is the one hypothesis
    found."""
    for seed in (1, 2, 3):
        res = mb.simulate(mb.MultiBin(bins=5 if n > 2 else 2, batch_size=2 if n == 2 else 16, max_wait=max_wait),
                          arrivals=arrivals, service=st.uniform(1, 19), n=n, servers=servers, seed=seed,
                          keep_requests=True)
        req = res.requests
        ref = reference_latencies(req.arrival, req.service, res.edges, 2 if n == 2 else 16, servers, max_wait)
        np.testing.assert_array_equal(req.latency, ref)
        assert res.excluded_partial == 0


def test_max_wait_releases_partial_batches():
    """max_wait = 0 with all requests at time 0: simultaneous arrivals still
    join their batch, then every bin's partial batch leaves at once; no
    request is left over.  With a finite max_wait under Poisson arrivals no
    request waits for its batch longer than max_wait."""
    kw = dict(service=st.uniform(1, 19), seed=3, keep_requests=True)
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8, max_wait=0.0), arrivals=mb.Saturated(), n=20, **kw)
    assert res.excluded_partial == 0 and res.completed == 20
    full = mb.simulate(mb.MultiBin(bins=2, batch_size=8), arrivals=mb.Saturated(), n=20, **kw)
    extra = int(np.sum(full.batches_per_bin * 8 < np.bincount(full.requests.bin, minlength=2)))
    assert res.n_batches == full.n_batches + extra
    res = mb.simulate(mb.MultiBin(bins=3, batch_size=64, max_wait=5.0), arrivals=mb.Poisson(rate=2.0),
                      n=5000, **kw)
    assert res.excluded_partial == 0
    assert res.mean_fill_wait <= 5.0 + 1e-12
    # the trade-off: here (service of 1-20 s) the small batches overload the
    # server; with fast service they cut the latency
    no_wait = mb.simulate(mb.MultiBin(bins=3, batch_size=64), arrivals=mb.Poisson(rate=2.0), n=5000, **kw)
    assert res.throughput < no_wait.throughput
    fast = dict(kw, service=st.uniform(0.1, 0.1))
    waited = mb.simulate(mb.MultiBin(bins=1, batch_size=64, max_wait=5.0), arrivals=mb.Poisson(rate=2.0),
                         n=5000, **fast)
    full = mb.simulate(mb.MultiBin(bins=1, batch_size=64), arrivals=mb.Poisson(rate=2.0), n=5000, **fast)
    assert waited.mean_latency < 6.0 < full.mean_latency


@given(seed=hs.integers(0, 2**32), k=hs.integers(1, 4), B=hs.integers(1, 16))
def test_more_servers_never_delay_a_request(seed, k, B):
    """Common random numbers: with one seed, every request's latency is
    non-increasing from 1 to 2 to infinitely many servers (FCFS), and with
    infinitely many it is exactly fill wait + batch service."""
    kw = dict(arrivals=mb.Poisson(rate=4.0), service=st.uniform(1, 19), n=2000, seed=seed,
              keep_requests=True)
    p = mb.MultiBin(bins=k, batch_size=B)
    lat = [mb.simulate(p, servers=c, **kw).requests.latency for c in (1, 2, math.inf)]
    done = ~np.isnan(lat[0])
    assert np.all(lat[1][done] <= lat[0][done])
    assert np.all(lat[2][done] <= lat[1][done])


def test_streaming_quantiles_match_exact_within_bucket():
    p = mb.MultiBin(bins=3, batch_size=32)
    kw = dict(arrivals=mb.Poisson(rate=5.0), service=st.uniform(1, 19), n=200_000, seed=11)
    streamed = mb.simulate(p, **kw)
    exact = mb.simulate(p, keep_requests=True, **kw)
    lat = exact.requests.latency
    for q, name in zip((0.5, 0.95, 0.99), ("latency_p50", "latency_p95", "latency_p99")):
        truth = np.quantile(lat[~np.isnan(lat)], q, method="inverted_cdf")
        assert abs(getattr(streamed, name) - truth) <= 2.0**-11 * truth
    # everything but the quantiles is identical with and without keep_requests
    for name in ("throughput", "mean_latency", "utilization", "mean_batch_service", "completed"):
        assert getattr(streamed, name) == getattr(exact, name)


def test_zero_latencies_stream_as_zero():
    """Zero service times on infinitely many servers: every latency is 0, and
    so is every streamed quantile (it was the first bucket's midpoint,
    9.3e-10 s), as the kept ones are."""
    run = dict(arrivals=mb.Poisson(1.0), service=np.zeros(100), n=100, servers=math.inf)
    streamed = mb.simulate(mb.MultiBin(bins=1, batch_size=1), **run)
    kept = mb.simulate(mb.MultiBin(bins=1, batch_size=1), keep_requests=True, **run)
    for q in ("latency_p50", "latency_p95", "latency_p99"):
        assert getattr(streamed, q) == getattr(kept, q) == 0.0


@pytest.mark.parametrize("policy, kw", [
    (mb.MultiBin(bins=2, batch_size=1), dict(service=st.uniform(1, 19))),
    (mb.DynamicBatching(), dict(workload=mb.Workload(prompt=st.uniform(10, 100), output=st.uniform(5, 50)))),
    (mb.LAPS(), dict(workload=mb.Workload(prompt=st.uniform(10, 500), output=st.uniform(5, 50)))),
], ids=["multibin", "dynamic", "laps"])
@pytest.mark.parametrize("n", [2, 4, 7, 1559])
def test_kept_and_streamed_quantiles_are_one_definition(policy, kw, n):
    """With and without keep_requests a run's latency quantiles are the same
    inverted-CDF quantile, within the histogram's half bucket (2**-11
    relative); the kept ones were numpy's linear interpolation, which at
    n = 2 put the median halfway between the two latencies."""
    for seed in range(3):
        run = dict(arrivals=mb.Poisson(rate=0.5), n=n, seed=seed, **kw)
        streamed, kept = mb.simulate(policy, **run), mb.simulate(policy, keep_requests=True, **run)
        for q in ("latency_p50", "latency_p95", "latency_p99"):
            got, exact = getattr(streamed, q), getattr(kept, q)
            assert abs(got - exact) <= 2.0 ** -11 * exact, (q, got, exact)


def test_latency_decomposes_into_fill_queue_and_service():
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=16), arrivals=mb.Poisson(rate=2.0),
                      service=st.uniform(1, 9), n=50_000, seed=5)
    total = res.mean_fill_wait + res.mean_queue_wait + res.mean_batch_service
    assert res.mean_latency == pytest.approx(total, rel=1e-9)
    assert 0 < res.utilization < 1
    assert res.batches_per_bin.sum() == res.n_batches


# --- reproducibility and common random numbers --------------------------------

def test_same_seed_bit_identical():
    p = mb.MultiBin(bins=4, batch_size=8)
    kw = dict(arrivals=mb.Poisson(rate=3.0), service=st.expon(scale=2), n=20_000, seed=123,
              keep_requests=True)
    a, b = mb.simulate(p, **kw), mb.simulate(p, **kw)
    assert a.metrics() == b.metrics()
    for f in ("arrival", "service", "completion", "bin", "batch"):
        np.testing.assert_array_equal(getattr(a.requests, f), getattr(b.requests, f))
    c = mb.simulate(p, **{**kw, "seed": 124})
    assert c.mean_latency != a.mean_latency


def test_every_policy_sees_the_same_requests():
    """Common random numbers: the arrival and service streams do not depend on
    the policy, the servers or the arrival process's kind."""
    kw = dict(service=st.uniform(1, 19), n=5000, seed=42, keep_requests=True)
    runs = [
        mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Poisson(rate=2.0), **kw),
        mb.simulate(mb.MultiBin(bins=5, batch_size=32), arrivals=mb.Poisson(rate=2.0), servers=3, **kw),
        mb.simulate(mb.MultiBin(bins=3, batch_size=7), arrivals=mb.Saturated(), **kw),
    ]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.requests.service, runs[0].requests.service)
    np.testing.assert_array_equal(runs[1].requests.arrival, runs[0].requests.arrival)


def test_draws_are_numpys_seedsequence_streams():
    """The kernel's draws are exactly numpy's: stream 0 (arrivals) and 1
    (service) of the seed's SeedSequence, each a PCG64DXSM Generator."""
    n = 5000
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Poisson(rate=2.0),
                      service=st.expon(loc=1, scale=3), n=n, seed=9, keep_requests=True)
    ss = np.random.SeedSequence(9)
    gen = [np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(ss.entropy, spawn_key=(i,))))
           for i in (0, 1)]
    np.testing.assert_array_equal(res.requests.arrival, np.cumsum(gen[0].standard_exponential(n) * 0.5))
    np.testing.assert_array_equal(res.requests.service, 1 + 3 * gen[1].standard_exponential(n))


def test_arrival_clock_survives_block_boundaries():
    """Regression: the kernel draws requests in blocks, and a batch dispatched
    inside a block once reset the arrival clock to that batch's ready time, so
    the next block's arrivals started early.  n spans many blocks, with
    batches closing mid-block, and no request may be served before it arrives."""
    from mbbatch._kernels.multibin import BLOCK

    n = 5 * BLOCK + 17
    res = mb.simulate(mb.MultiBin(bins=3, batch_size=5), arrivals=mb.Poisson(rate=3.0),
                      service=st.uniform(1, 2), n=n, seed=4, keep_requests=True)
    a = res.requests.arrival
    assert np.all(np.diff(a) > 0)
    gaps = np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(4, spawn_key=(0,))))
    np.testing.assert_allclose(a, np.cumsum(gaps.standard_exponential(n) / 3.0), rtol=1e-12)
    assert np.nanmin(res.requests.latency) > 0


@pytest.mark.parametrize("dist, draw", [
    (st.lognorm(0.8, scale=5), lambda g, n: 5 * np.exp(0.8 * g.standard_normal(n))),
    (st.gamma(2.0, loc=0.5, scale=3), lambda g, n: 0.5 + 3 * g.standard_gamma(2.0, n)),
    (st.weibull_min(1.5, scale=4), lambda g, n: 4 * g.weibull(1.5, n)),
])
def test_other_distributions_draw_their_law(dist, draw):
    """Kernel draws are numpy's draws of the scipy law (to the last bit but
    for the libm ``exp`` of lognorm), and follow it:
    a Kolmogorov-Smirnov test at the 99.9999% level, a threshold that any
    parametrization error (shape, loc, scale swapped or misread) fails by far."""
    n = 20_000
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Saturated(), service=dist,
                      n=n, seed=1, keep_requests=True)
    ss = np.random.SeedSequence(1)
    gen = np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(ss.entropy, spawn_key=(1,))))
    np.testing.assert_allclose(res.requests.service, draw(gen, n), rtol=1e-15, atol=0)
    assert st.kstest(res.requests.service, dist.cdf).pvalue > 1e-6


def test_partial_batches_are_counted_and_excluded():
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=10), arrivals=mb.Saturated(),
                      service=st.uniform(1, 1), n=25, seed=0, keep_requests=True)
    assert res.completed == 20 and res.excluded_partial == 5
    assert np.isnan(res.requests.completion[20:]).all()
    none = mb.simulate(mb.MultiBin(bins=1, batch_size=10), arrivals=mb.Saturated(),
                       service=st.uniform(1, 1), n=5, seed=0)
    assert none.completed == 0 and math.isnan(none.throughput)


def test_to_dataset_has_units_and_provenance():
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Poisson(rate=2.0),
                      service=st.uniform(1, 19), n=1000, seed=0)
    ds = res.to_dataset(arrays=True)
    for name in ("sim_throughput", "sim_mean_latency", "sim_latency_p95", "sim_utilization", "batches_per_bin",
                 "sim_mean_latency_ci_low", "excluded_partial", "backlog_growing"):
        assert ds[name].attrs["units"] and ds[name].attrs["description"]
    assert ds.sizes["bin"] == 2
    assert ds.attrs["seed_entropy"] == "0"
    assert ds.attrs["numba_version"] and ds.attrs["mbbatch_version"] == mb.__version__
    assert ds["sim_throughput"].item() == res.throughput and ds.sizes["rep"] == 1


# --- bad input ----------------------------------------------------------------

U = st.uniform(1, 19)


@pytest.mark.parametrize("make, exc, name", [
    (lambda: mb.Poisson(rate=-1.0), ValueError, "rate"),
    (lambda: mb.Poisson(rate=float("nan")), ValueError, "rate"),
    (lambda: mb.Poisson(rate=math.inf), ValueError, "rate"),
    (lambda: mb.MultiBin(bins=0, batch_size=4), ValueError, "bins"),
    (lambda: mb.MultiBin(bins=2.0, batch_size=4), TypeError, "bins"),
    (lambda: mb.MultiBin(bins=2, batch_size=0), ValueError, "batch_size"),
    (lambda: mb.MultiBin(bins=2, batch_size=4.5), TypeError, "batch_size"),
    (lambda: mb.MultiBin(bins=2, batch_size=True), TypeError, "batch_size"),
    (lambda: mb.MultiBin(bins=2, batch_size=float("nan")), ValueError, "batch_size"),
    (lambda: mb.MultiBin(bins=math.inf, batch_size=4), ValueError, "bins"),
    (lambda: mb.MultiBin(bins=2, batch_size=4, edges=[1, 5, 3]), ValueError, "edges"),
    (lambda: mb.MultiBin(bins=2, batch_size=4, edges=[1, 20]), ValueError, "edges"),
    (lambda: mb.simulate(mb.MultiBin(2, 4, edges=[2, 5, 20]), mb.Saturated(), U, n=10), ValueError, "edges"),
    (lambda: mb.simulate(mb.MultiBin(2, 4, edges=[1, 5, 19]), mb.Saturated(), U, n=10), ValueError, "edges"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=0), ValueError, "n"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=10.0), TypeError, "n"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=10, servers=0), ValueError, "servers"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=10, servers=1.5), TypeError, "servers"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=10, servers=float("nan")), ValueError, "servers"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), st.norm(0, 1), n=10), ValueError, "support"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), st.uniform(-1, 3), n=10), ValueError, "support"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), st.uniform, n=10), TypeError, "service"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), [1.0, -2.0], n=2), ValueError, "service"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), st.norm(5, 1), n=10), ValueError, "service"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=10, seed=-1), ValueError, "seed"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), mb.Saturated(), U, n=10, seed=1.5), TypeError, "seed"),
    (lambda: mb.simulate("multibin", mb.Saturated(), U, n=10), TypeError, "policy"),
    (lambda: mb.simulate(mb.MultiBin(2, 4), 8.0, U, n=10), TypeError, "arrivals"),
    (lambda: mb.Replay([0.0, 2.0, 1.0]), ValueError, "times"),
])
def test_bad_input_names_the_parameter(make, exc, name):
    with pytest.raises(exc, match=name):
        make()


# --- simulate()'s own arguments: refused before any work, naming the parameter --------

from .test_validation import BAD_VALUES, Count, Flag  # noqa: E402

WL = mb.Workload(prompt=st.uniform(10, 100), output=st.uniform(5, 50))
#: simulate(**base) for a multi-bin and a token policy; each argument's oracle
#: (None: any outcome, but a refusal must be a TypeError or ValueError naming it)
SIMULATE = {
    "multibin": dict(policy=mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Saturated(), service=U, n=200,
                     servers=1, seed=0),
    "static": dict(policy=mb.StaticBatching(4), arrivals=mb.Saturated(), workload=WL, n=200, servers=1, seed=0),
}
class _N(Count):
    """n: a count in [1, 2**53]; None (nothing replayed to count) is the parameter table's default."""

    def expect(self, v):
        return "ok" if v is None else super().expect(v)


ORACLE = {"n": _N("[1, 9007199254740992]"), "keep_requests": Flag(), "keep_batches": Flag(), "progress": Flag(),
          "servers": None, "seed": None, "policy": None, "arrivals": None, "service": None,
          "workload": None, "service_model": None}
U = st.uniform(1, 19)


def _simulate_case(which, name, value):
    base = SIMULATE[which]
    if name == "keep_batches" and which == "multibin":
        return
    kw = {**base, name: value}
    oracle = ORACLE[name]
    expected = oracle.expect(value) if oracle is not None else None
    call = mb.simulate
    if name == "n" and expected == "ok" and value is not None and int(value) > 10**6:
        # a valid count that large is checked, not run: check_simulation raises what simulate would
        call = check_simulation
        del kw["seed"]
    try:
        call(**kw)
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        # an array given for the replayed service may clash with n instead
        names = (name, "n") if name in ("service", "workload") else (name,)
        assert any(nm in msg for nm in names), f"simulate({name}={value!r}): {msg}"
        # (a valid n may still need more memory than this machine has: refused, naming n)
        if expected == "ok" and not (name == "n" and msg.startswith("n: this run needs")):
            raise AssertionError(f"simulate({name}={value!r}) is valid but was refused: {msg}")
        if expected not in (None, "refused", "ok"):
            assert isinstance(exc, expected), f"simulate({name}={value!r}): {type(exc).__name__}: {msg}"
    else:
        assert expected in (None, "ok"), f"simulate({name}={value!r}) was accepted"


@pytest.mark.parametrize("which", sorted(SIMULATE))
@pytest.mark.parametrize("name", sorted(ORACLE))
def test_every_bad_simulate_argument_is_refused_naming_it(which, name):
    for label, value in BAD_VALUES.items():
        _simulate_case(which, name, value)


@pytest.mark.parametrize("which", sorted(SIMULATE))
def test_progress_changes_nothing_but_stderr(which, monkeypatch, capsys):
    monkeypatch.setattr(mbbatch._running, "PROGRESS_DELAY", 0.0)     # the bar shows at once
    kw = {**SIMULATE[which], "keep_requests": True}
    quiet, shown = mb.simulate(**kw), mb.simulate(**kw, progress=True)
    assert quiet.to_dataset(arrays=True).identical(shown.to_dataset(arrays=True))
    np.testing.assert_array_equal(quiet.requests.latency, shown.requests.latency)
    out, err = capsys.readouterr()
    assert out == "" and "simulate:" in err


def test_check_simulation_takes_every_argument_of_simulate():
    """The check of a call without running it takes the call's arguments,
    with their defaults, and refuses what the call refuses."""
    import inspect

    assert inspect.signature(check_simulation).parameters.keys() == \
        inspect.signature(mb.simulate).parameters.keys() - {"seed"}
    for name, p in inspect.signature(check_simulation).parameters.items():
        assert p.default == inspect.signature(mb.simulate).parameters[name].default, name
    kw = {k: v for k, v in SIMULATE["static"].items() if k != "seed"}
    for call in (mb.simulate, check_simulation):
        with pytest.raises(TypeError, match=r"^progress must be a bool \(True or False\); got 1 \(int\)$"):
            call(**kw, progress=1)


@given(which=hs.sampled_from(sorted(SIMULATE)), name=hs.sampled_from(sorted(ORACLE)),
       value=hs.sampled_from(list(BAD_VALUES.values())) | hs.integers() | hs.floats() | hs.text(max_size=4)
       | hs.lists(hs.floats(), max_size=3))
def test_any_simulate_argument_is_refused_naming_it(which, name, value):
    _simulate_case(which, name, value)


@pytest.mark.parametrize("policy", [mb.StaticBatching(4), mb.DynamicBatching(), mb.MultiBinDynamic(bins=3)],
                         ids=["static", "dynamic", "multibin_dynamic"])
def test_saturated_queues_too_big_for_memory_name_n(monkeypatch, policy):
    """Saturated arrivals queue all n requests at time 0: a run whose queues
    cannot fit names n (the size to make smaller), not bins."""
    monkeypatch.setattr(mbbatch._running, "available_memory", lambda: 50 * 2**20)
    check_simulation(policy, mb.Saturated(), workload=WL, n=10**4)
    with pytest.raises(ValueError, match=r"^n: this run needs .* for the queues of the n requests waiting at "
                                         r"time 0 \(saturated arrivals\)"):
        check_simulation(policy, mb.Saturated(), workload=WL, n=10**6)


@pytest.mark.parametrize("call, name", [
    (lambda scale: mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(0.1 / scale), st.uniform(scale, scale),
                               n=1000), "service"),
    (lambda scale: mb.simulate(mb.StaticBatching(4), mb.Poisson(0.1 / scale), workload=WL, n=1000,
                               service_model=mb.MaxModel(base=0.0, per_token=scale / 30)), "(service_model|workload)"),
    (lambda scale: mb.simulate(mb.LAPS(), mb.Poisson(0.1 / scale), workload=WL, n=1000,
                               service_model=mb.PrefillModel(a=scale / 2, b=scale / 110)), "(service_model|workload)"),
], ids=["multibin", "static", "laps"])
def test_service_times_beyond_the_latency_histogram_are_refused(call, name):
    """A typical service time outside about 1 us .. 34 years (10 octaves
    inside the histogram's 2**-30 .. 2**50 s at the bottom, 20 at the top)
    is refused, naming the parameter: its latency quantiles would be read off
    the end buckets (at 1e-12 s the median came out as 9.3e-10 s).  The
    token-level models' times scale here: where a request of one token is
    out of range too the model is named (service_model), else the
    workload's lengths."""
    lo, hi = mbbatch.simulation.SCALE_RANGE
    for bad in (1e-12, lo / 2, hi * 2, 1e16):
        with pytest.raises(ValueError, match=rf"^{name}: service times of about .* lie outside "):
            call(bad)
    for good in (lo * 1.5, 1.0, hi / 4):
        call(good)


def test_replayed_arrays_of_different_lengths_name_both():
    """100 replayed arrivals with 50 service times silently simulated 50."""
    with pytest.raises(ValueError, match="arrivals.times has 100 values but service has 50"):
        mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Replay(np.arange(100.0)), service=np.ones(50))
    with pytest.raises(ValueError, match="workload.prompt has 30 values but workload.output has 20"):
        mb.simulate(mb.StaticBatching(4), arrivals=mb.Saturated(),
                    workload=mb.Workload(prompt=np.ones(30), output=np.ones(20)))


def test_clock_beyond_float64_resolution_is_refused():
    """Replay(np.linspace(0, 1e308, 100)) reported utilization 1.5."""
    with pytest.raises(ValueError, match="arrivals.times reach 1e\\+308 s"):
        mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Replay(np.linspace(0, 1e308, 100)), service=U)
    with pytest.raises(ValueError, match="mean rate of 1e-300"):
        mb.simulate(mb.StaticBatching(4), arrivals=mb.Poisson(1e-300), workload=WL, n=100)


@pytest.mark.parametrize("make, name", [
    (lambda: mb.simulate(mb.MultiBin(bins=10**12, batch_size=4), mb.Saturated(), U, n=1000), "bins"),
    (lambda: mb.simulate(mb.MultiBin(bins=1, batch_size=4), mb.Saturated(), U, n=2**52, keep_requests=True),
     "keep_requests"),
    (lambda: mb.simulate(mb.MultiBinDynamic(bins=10**12, warmup=10**12), mb.Saturated(), workload=WL, n=1000),
     "bins"),
    (lambda: mb.simulate(mb.StaticBatching(4), mb.Poisson(1.0), workload=WL, n=2**52, keep_batches=True),
     "keep_batches"),
])
def test_runs_that_cannot_fit_are_refused_saying_the_memory(make, name):
    with pytest.raises(ValueError, match=rf"^{name}: this run needs [0-9.]+ [KMGTPE]iB of memory"):
        make()


def test_huge_counts_run_in_memory_of_what_the_run_can_use():
    """servers = 10**12, batch_size = 10**9, StaticBatching(10**11) and
    b_max = 10**11 tried to allocate hundreds of GiB.  Buffers are sized by
    what n requests can use, and the results equal those of the smallest
    sufficient values, bit for bit."""
    kw = dict(arrivals=mb.Poisson(2.0), service=U, n=3000, seed=5, keep_requests=True)
    a = mb.simulate(mb.MultiBin(bins=2, batch_size=4), servers=10**12, **kw)
    b = mb.simulate(mb.MultiBin(bins=2, batch_size=4), servers=3000, **kw)
    np.testing.assert_array_equal(a.requests.completion, b.requests.completion)
    assert a.mean_busy_servers == b.mean_busy_servers and a.utilization * 10**12 == pytest.approx(b.utilization * 3000)
    big = mb.simulate(mb.MultiBin(bins=2, batch_size=10**9), **kw)
    assert big.completed == 0 and big.excluded_partial == 3000
    tk = dict(arrivals=mb.Poisson(2.0), workload=WL, n=2000, seed=5, keep_requests=True)
    a = mb.simulate(mb.StaticBatching(10**11), servers=10**12, **tk)
    b = mb.simulate(mb.StaticBatching(2000), servers=2000, **tk)
    np.testing.assert_array_equal(a.requests["completion"], b.requests["completion"])
    assert a.batch_size_hist.size == 2001
    a = mb.simulate(mb.DynamicBatching(controller=mb.SLAController(b_max=10**11)), **tk)
    assert a.completed == 2000


# --- steady state: res.unstable, its reason and an UnstableWarning ---------------------------

from mbbatch.results import UnstableWarning  # noqa: E402

from .conftest import SHARED_DATA  # noqa: E402

WL_LOGNORM = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))


def test_overloaded_multibin_run_is_unstable_with_a_reason():
    # B = 4, U(1, 20): one server serves 4 / E[max of 4] = 0.24 requests/s < 1
    with pytest.warns(UnstableWarning, match="backlog grows"):
        res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Poisson(1.0), service=U, n=20000, seed=1)
    assert res.unstable and "central FIFO" in res.unstable_reason
    ds = res.to_dataset()
    assert ds.attrs["unstable"] == 1 and "backlog grows" in ds.attrs["unstable_reason"]


def test_stable_run_is_not_unstable(recwarn):
    res = mb.simulate(mb.MultiBin(bins=4, batch_size=32), arrivals=mb.Poisson(2.0), service=U, n=50000, seed=1)
    assert not res.unstable and res.unstable_reason == "no growing backlog"
    assert not [w for w in recwarn if issubclass(w.category, UnstableWarning)]


def test_saturated_runs_are_not_assessed():
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Saturated(), service=U, n=2000, seed=1)
    assert not res.unstable and "not assessed" in res.unstable_reason
    res = mb.simulate(mb.StaticBatching(8), arrivals=mb.Saturated(), workload=WL_LOGNORM, n=2000, seed=1)
    assert not res.unstable and "not assessed" in res.unstable_reason


def test_overloaded_token_run_is_unstable():
    with pytest.warns(UnstableWarning, match="requests waited"):
        res = mb.simulate(mb.StaticBatching(2), arrivals=mb.Poisson(50.0), workload=WL_LOGNORM, n=20000, seed=2)
    assert res.unstable and res.to_dataset().attrs["unstable"] == 1
    res = mb.simulate(mb.StaticBatching(32), arrivals=mb.Poisson(2.0), workload=WL_LOGNORM, n=20000, seed=2)
    assert not res.unstable


def test_one_bin_b4_on_a_replayed_trace_warns():
    """One bin, B = 4, one server on a trace returned a mean latency of
    hundreds of seconds with no warning: the trace's arrival rate is above
    what the server can serve, and the backlog grows through the replay."""
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(1 / 5.5, 20000))       # 5.5 requests/s, like the Azure trace
    service = 1.0 + rng.integers(1, 500, 20000) / 100.0
    with pytest.warns(UnstableWarning):
        res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Replay(times), service=service)
    assert res.unstable


@pytest.mark.skipif(not (SHARED_DATA / "AzureLLMInferenceTrace_conv.csv").is_file(),
                    reason="the Azure LLM inference trace is not beside the checkout "
                    "(shared/data/AzureLLMInferenceTrace_conv.csv); see docs/guide/traces.md")
def test_one_bin_b4_on_the_azure_trace_warns():
    tr = mb.traces.load_azure_trace(SHARED_DATA / "AzureLLMInferenceTrace_conv.csv")
    with pytest.warns(UnstableWarning):
        res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Replay(tr.arrival),
                          service=1.0 + tr.output_tokens / 100.0)
    assert res.unstable
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=8), arrivals=mb.Replay(tr.arrival),
                      service=1.0 + tr.output_tokens / 100.0, servers=4)
    assert not res.unstable


# --- MultiBin on the request model: workload= with MaxModel(base, per_token) ----------------


def test_multibin_service_shorthand_equals_its_workload_form():
    """service=dist is output lengths from dist under MaxModel(0, 1): the
    same draws (stream 1), so the same numbers, bit for bit."""
    pol, arr = mb.MultiBin(bins=3, batch_size=8), mb.Poisson(0.5)
    a = mb.simulate(pol, arrivals=arr, service=U, n=5000, seed=4, keep_requests=True)
    b = mb.simulate(pol, arrivals=arr, workload=mb.Workload(prompt=st.uniform(1, 9), output=U, integer_lengths=False),
                    service_model=mb.MaxModel(base=0.0, per_token=1.0), n=5000, seed=4, keep_requests=True)
    assert a.metrics() == b.metrics()
    np.testing.assert_array_equal(a.edges, b.edges)
    np.testing.assert_array_equal(a.requests.completion, b.requests.completion)


def test_multibin_on_a_trace_transforms_lengths_to_service_times():
    """workload= replaying a trace's output lengths under MaxModel(base,
    per_token): each request's service time is base + per_token x
    ceil(length), and the run equals replaying those service times."""
    rng = np.random.default_rng(3)
    out_len = rng.uniform(1, 500, 4000)          # fractional: rounded up to whole tokens
    times = np.cumsum(rng.exponential(1 / 3.0, 4000))
    model = mb.MaxModel(base=0.5, per_token=0.02)
    wl = mb.Workload(prompt=np.ones(4000), output=out_len)
    a = mb.simulate(mb.MultiBin(bins=4, batch_size=8), arrivals=mb.Replay(times), workload=wl,
                    service_model=model, keep_requests=True)
    svc = 0.5 + 0.02 * np.ceil(out_len)
    pol = mb.MultiBin(bins=4, batch_size=8, edges=a.edges)
    b = mb.simulate(pol, arrivals=mb.Replay(times), service=svc, keep_requests=True)
    np.testing.assert_array_equal(a.requests.service, svc)
    np.testing.assert_array_equal(a.requests.completion, b.requests.completion)
    assert a.mean_latency == b.mean_latency
    # equal-mass edges of the lengths, rounded and mapped as the lengths are
    q = np.quantile(out_len, [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(a.edges, 0.5 + 0.02 * np.ceil(q))
    assert a.config["service_model"] == "MaxModel" and a.config["model_base"] == 0.5


def test_multibin_refuses_other_models_and_predictors():
    wl = mb.Workload(prompt=U, output=U)
    with pytest.raises(TypeError, match="MaxModel"):
        mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(1.0), workload=wl,
                    service_model=mb.DecodeModel(), n=100)
    with pytest.raises(ValueError, match="not both"):
        mb.simulate(mb.MultiBin(bins=2, batch_size=4, predictor=mb.BinConfusion(0.5)), mb.Poisson(1.0),
                    workload=mb.Workload(prompt=U, output=U, predictor_sigma=0.5), n=100)
    with pytest.raises(TypeError, match="not both"):
        mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(1.0), service=U, workload=wl, n=100)
    with pytest.raises(TypeError, match="service or workload must be given"):
        mb.simulate(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(1.0), n=100)
    with pytest.raises(TypeError, match="not service="):
        mb.simulate(mb.StaticBatching(4), mb.Poisson(1.0), service=U, n=100)


# --- per-bin statistics, the SLA violation share, convergence --------------------------

WL_BINS = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128))


@pytest.mark.parametrize("policy, kw", [
    (mb.MultiBin(bins=3, batch_size=8), {"service": st.uniform(1, 19), "arrivals": mb.Poisson(0.3)}),
    (mb.MultiBinDynamic(bins=4, warmup=200), {"workload": WL_BINS, "arrivals": mb.Poisson(3.0)}),
])
def test_per_bin_throughput_and_latency_add_up(policy, kw):
    """Every binned policy reports per-bin throughput and mean latency; the
    bins' throughputs sum to the run's and their latencies, weighted by the
    requests served, average to its mean latency."""
    res = mb.simulate(policy, n=30_000, seed=4, **kw)
    assert res.bin_throughput.shape == res.bin_mean_latency.shape == (res.edges.size - 1,)
    assert res.bin_throughput.sum() == pytest.approx(res.throughput, rel=1e-12)
    assert res.bin_completed.sum() == res.completed
    assert np.average(res.bin_mean_latency, weights=res.bin_completed) == pytest.approx(res.mean_latency,
                                                                                        rel=1e-12)


def test_sla_violation_share_uses_d_sla_alone():
    """Pang et al.'s SLA violation rate counts requests slower than D_SLA; the
    per-batch measure counts those slower than D_SLA + eps_D, never more."""
    def run(d_sla, eps_d=5e-5):
        pol = mb.DynamicBatching(controller=mb.SLAController(d_sla=d_sla, eps_d=eps_d))
        return mb.simulate(pol, mb.Poisson(4.0), workload=WL_BINS, n=20_000, seed=3)

    res = run(7.0e-3, eps_d=5e-4)
    assert res.sla_violation_share >= res.sla_violation_requests
    assert 0.0 < res.sla_violation_share <= 1.0
    assert run(1e-4).sla_violation_share == 1.0          # every batch decodes slower than 0.1 ms/token
    assert run(1.0).sla_violation_share == 0.0
    assert "D_SLA" in METRICS["sla_violation_share"].description


def test_convergence_time_is_a_result_of_the_controlled_policies():
    pinned = mb.simulate(mb.DynamicBatching(pin=16), mb.Poisson(4.0), workload=WL_BINS, n=20_000, seed=3)
    assert pinned.convergence_time == 0.0                 # b_target pinned: settled from the start
    res = mb.simulate(mb.DynamicBatching(), mb.Poisson(4.0), workload=WL_BINS, n=20_000, seed=3)
    assert 0.0 <= res.convergence_time < res.span or np.isnan(res.convergence_time)
    static = mb.simulate(mb.StaticBatching(8), mb.Poisson(4.0), workload=WL_BINS, n=2000, seed=3)
    with pytest.raises(AttributeError, match="convergence_time"):
        static.convergence_time


# --- the paper's Figure 7 on real lengths: simulation against eq. (2) --------------------

TRACE_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "AzureLLMInferenceTrace_conv.csv"


@pytest.mark.skipif(not TRACE_FILE.exists(), reason="the Azure conversation trace is not in shared/data/ beside "
                    "the checkout (download it from github.com/Azure/AzurePublicDataset)")
@pytest.mark.parametrize("k", [1, 8, 32])
def test_saturated_multibin_on_the_traces_lengths_meets_eq_2(k):
    """MultiBin on the Azure conversation trace's output lengths (drawn
    i.i.d.), saturated, B = 8: the throughput over 8 replications has a
    99.9% t-interval containing B / E[t_service] of eq. (2) on the empirical
    distribution, with the edges the simulation uses."""
    trace = mb.traces.load_azure_trace(TRACE_FILE)
    model = mb.MaxModel(base=0.0, per_token=0.00574)
    wl = mb.Workload.from_trace(trace, resample=True)
    thr = [mb.simulate(mb.MultiBin(bins=k, batch_size=8), mb.Saturated(), workload=wl, service_model=model,
                       n=60_000, seed=s).throughput for s in range(8)]
    lengths = trace.output_tokens.astype(float)
    edges = np.maximum(np.ceil(np.quantile(lengths, np.linspace(0, 1, k + 1))), 1.0)
    want = 8 / (0.00574 * theory.empirical_batch_service_time(lengths, edges, 8))
    half = st.t.ppf(0.9995, 7) * np.std(thr, ddof=1) / np.sqrt(8)
    assert abs(np.mean(thr) - want) <= half, (np.mean(thr), want, half)


# --- multi-bin dynamic batching's bin edges ------------------------------------------------

@pytest.mark.parametrize("rule", ["presample", "optimal"])
def test_bin_edges_set_before_the_run(rule):
    """presample: Algorithm 6 on `warmup` predicted lengths drawn before the
    run from the workload (stream 4 of the seed); optimal: eq. (2)'s
    minimising edges at B = b_max, floored.  Binning starts with the first
    request; the requests are those of the warm-up rule."""
    from mbbatch._kernels.controller import EDGE_MAX, equal_mass_edges
    from mbbatch._seeding import STREAM_PRESAMPLE, stream

    wl = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128))
    kw = dict(arrivals=mb.Poisson(3.0), workload=wl, n=20_000, seed=2, keep_requests=True)
    res = mb.simulate(mb.MultiBinDynamic(bins=4, warmup=500, bin_edges=rule), **kw)
    base = mb.simulate(mb.MultiBinDynamic(bins=4, warmup=500), **kw)
    np.testing.assert_array_equal(res.requests.output, base.requests.output)
    assert res.warmup_time == 0.0
    if rule == "presample":
        gen = stream(np.random.SeedSequence(2), STREAM_PRESAMPLE)
        x = np.maximum(np.ceil(wl.output.rvs(size=500, random_state=gen)), 1.0)
        lo, hi = equal_mass_edges(x, 4)
    else:
        e = np.floor(theory.optimal_boundaries(wl.output, 256, 4))
        lo, hi = np.r_[0.0, e[1:-1]], np.r_[e[1:-1], EDGE_MAX]
    np.testing.assert_array_equal(res.edges, np.append(lo, hi[-1]))
    with pytest.raises(ValueError, match="bin_edges"):
        mb.MultiBinDynamic(bin_edges="median")


def test_optimal_bin_edges_need_a_distribution_and_are_checked_before_the_run():
    """bin_edges="optimal" on replayed or resampled output lengths is refused
    when the call is checked (naming bin_edges), not when it runs; LAPS's
    decode stage, whose output lengths are drawn from the workload's
    distribution, takes eq. (2)'s edges on that distribution."""
    from mbbatch._kernels.controller import EDGE_MAX
    from mbbatch.simulation import check_simulation

    mbd = mb.MultiBinDynamic(bins=3, bin_edges="optimal")
    for output in (np.arange(1.0, 200.0), mb.Empirical(np.arange(1.0, 200.0))):
        wl = mb.Workload(prompt=st.uniform(16, 496), output=output)
        for policy, model in ((mbd, None), (mb.LAPS(decode=mbd), mb.PrefillModel())):
            with pytest.raises(ValueError, match="bin_edges=\"optimal\" needs the output lengths as a distrib"):
                check_simulation(policy, mb.Poisson(1.0), workload=wl, n=1000, service_model=model)
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=100), output=st.lognorm(0.5, scale=50))
    res = mb.simulate(mb.LAPS(decode=mbd), mb.Poisson(1.0), workload=wl, n=2000, seed=1,
                      service_model=mb.PrefillModel())
    e = np.floor(theory.optimal_boundaries(wl.output, 256, 3))
    np.testing.assert_array_equal(res.decode.edges, np.r_[0.0, e[1:-1], EDGE_MAX])
