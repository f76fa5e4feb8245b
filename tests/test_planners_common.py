"""What the planners share (mbbatch.planners.common): the metrics of a run
assembled from the metric table, one formula each; lengths and think times
drawn before a run by the kernels' drawers; the arrivals' and the clock's
checks."""

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch.planners.common import RunTotals, assemble, check_arrivals, check_batch_model


def _totals(**kw):
    base = dict(completed=10, span=5.0, sum_latency=20.0, busy=6.0, servers=2, batches=4, members=10.0,
                latency_quantiles=np.array([1.0, 2.0, 3.0]), group_latency=None)
    return RunTotals(**{**base, **kw})


MULTIBIN_EXTRA = {"std_batch_service": 0.1, "mean_fill_wait": 1.0, "mean_queue_wait": 0.5, "excluded_partial": 0}


def test_a_runs_metrics_follow_from_its_totals_by_one_formula_each():
    """throughput = completed / span, utilization = busy / (servers x span),
    mean batch service = busy / batches, and so on, for every family;
    the result is in the metric table's order, the family's extra values
    beside them."""
    g = np.array([1.0, 2.0, 3.0, 2.0])
    m = assemble("multibin", _totals(group_latency=g), MULTIBIN_EXTRA)
    assert list(m) == [k for k in mb.metrics.applicable("multibin") if k != "unstable"]
    assert (m["throughput"], m["mean_latency"], m["utilization"], m["mean_busy_servers"]) == (2.0, 2.0, 0.6, 1.2)
    assert (m["mean_batch_service"], m["mean_batch_size"], m["span"], m["n_batches"]) == (1.5, 2.5, 5.0, 4)
    assert (m["latency_p50"], m["latency_p99"]) == (1.0, 3.0)
    assert m["mean_latency_ci_low"] < m["mean_latency"] < m["mean_latency_ci_high"]
    assert math.isnan(assemble("multibin", _totals(servers=math.inf, group_latency=g),
                               MULTIBIN_EXTRA)["utilization"])


def test_a_run_of_no_time_or_no_request():
    """Every request completed at its arrival instant: infinitely fast, its
    rates of time undefined; no request completed: nothing defined."""
    g = np.full(4, np.nan)
    m = assemble("multibin", _totals(span=0.0, group_latency=g), MULTIBIN_EXTRA)
    assert m["throughput"] == math.inf and math.isnan(m["utilization"]) and math.isnan(m["mean_busy_servers"])
    m = assemble("multibin", _totals(completed=0, span=-math.inf, batches=0, members=0, group_latency=g),
                 MULTIBIN_EXTRA)
    assert all(math.isnan(m[k]) for k in ("throughput", "mean_latency", "utilization", "mean_batch_service",
                                          "mean_batch_size", "span"))


def test_a_missing_or_unexpected_metric_is_the_planners_bug():
    with pytest.raises(RuntimeError, match=r"missing \['excluded_partial'\]"):
        assemble("multibin", _totals(group_latency=np.ones(4)), {k: v for k, v in MULTIBIN_EXTRA.items()
                                                                 if k != "excluded_partial"})
    with pytest.raises(RuntimeError, match=r"unexpected \['mean_ttft'\]"):
        assemble("multibin", _totals(group_latency=np.ones(4)), {**MULTIBIN_EXTRA, "mean_ttft": 1.0})


def test_the_calls_arrivals_and_batch_model_are_checked():
    check_arrivals(mb.Poisson(1.0))
    with pytest.raises(TypeError, match="arrivals must be Poisson, Gamma, OnOff, Saturated, PiecewisePoisson or "
                                        "Replay; got float"):
        check_arrivals(1.0)
    check_batch_model(mb.DecodeModel())
    with pytest.raises(TypeError, match="service_model must be MaxModel, LinearModel, DecodeModel, "
                                        "CalibratedModel or IterationModel; got PrefillModel"):
        check_batch_model(mb.PrefillModel())


@pytest.mark.parametrize("scale", [1e-3, 0.25, 1.0, 7.5])
def test_programs_exponentials_are_numpys(scale):
    """The programs' starts and think times, drawn by the kernels' drawer,
    are numpy's ``exponential`` draws bit for bit, and leave the generator
    where numpy leaves it."""
    from mbbatch.planners.common import exponentials

    a, b = np.random.default_rng(4), np.random.default_rng(4)
    m = 3 * 1024 + 7
    assert exponentials(a, scale, m).tobytes() == b.exponential(scale, m).tobytes()
    assert a.random() == b.random()


@pytest.mark.parametrize("dist", [st.uniform(1, 10), st.expon(scale=3), st.lognorm(0.8, scale=64),
                                  st.lognorm(1.5, loc=2, scale=0.5), st.gamma(0.3, scale=3), st.gamma(2.5),
                                  st.weibull_min(1.5, scale=2), st.pareto(2.5)])
@pytest.mark.parametrize("integer", [True, False])
def test_python_lengths_are_the_kernels_draws(dist, integer):
    """The lengths drawn before a run (programs' calls, presampled edges, a
    LAPS decode stage's outputs): a family the kernels draw is drawn by
    their drawer, the values a run on that stream gives its first requests
    (bit for bit); any other is one rvs call's values (rounded up to whole
    tokens, at least 1, when ``integer``)."""
    from mbbatch._seeding import STREAM_PROMPT, stream
    from mbbatch.lengths import SUPPORTED_DISTRIBUTIONS, as_service
    from mbbatch.planners.common import lengths

    m = 3 * 1024 + 5     # (blocks of draws and a part)
    got = lengths(as_service(dist), stream(np.random.SeedSequence(8), STREAM_PROMPT), m, integer)
    if dist.dist.name in SUPPORTED_DISTRIBUTIONS:
        res = mb.simulate(mb.StaticBatching(8), mb.Poisson(1.0), n=m, seed=8, keep_requests=True,
                          workload=mb.Workload(prompt=dist, output=st.uniform(1, 2), integer_lengths=integer))
        want = res.requests.prompt
    else:
        want = np.asarray(dist.rvs(size=m, random_state=stream(np.random.SeedSequence(8), STREAM_PROMPT)), float)
        if integer:
            want = np.maximum(np.ceil(want), 1.0)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("prompt, output", [(st.lognorm(0.8, scale=64), st.uniform(1, 300)),
                                             (st.expon(scale=40), st.weibull_min(1.5, scale=2)),
                                             (st.beta(2, 3, scale=800), st.gamma(0.3, scale=3))])
def test_a_mixtures_lengths_are_each_classs_streams_draws_at_its_places(prompt, output):
    """A mixture's lengths (:func:`mixture_lengths`: in one pass, a block of
    each class's at a time, where the kernels draw every class's families;
    else each class's drawn whole, then placed) are, for each class,
    :func:`lengths`'s draws of its own streams at its requests' places, bit
    for bit, across blocks and a part; every place is written."""
    from mbbatch.lengths import as_service
    from mbbatch.planners.common import lengths, mixture_lengths

    u = np.random.default_rng(2).random(5 * 1024 + 3)
    klass = (u >= 0.3).astype(float) + (u >= 0.9)
    counts = np.bincount(klass.astype(np.int64), minlength=3)
    specs = [(as_service(prompt), as_service(output)), (as_service(output), as_service(prompt)),
             (as_service(st.lognorm(0.5, scale=100)), as_service(st.lognorm(0.5, scale=20)))]
    seeds = [(5, 6), (7, 8), (9, 10)]
    outs = (np.full(klass.size, -1.0), np.full(klass.size, -1.0))
    mixture_lengths(klass, counts, specs, [tuple(np.random.default_rng(k) for k in pair) for pair in seeds], outs)
    for c in range(3):
        for spec, seed, out in zip(specs[c], seeds[c], outs):
            want = lengths(spec, np.random.default_rng(seed), int(counts[c]), True)
            assert out[klass == c].tobytes() == want.tobytes()
    assert (outs[0] >= 1.0).all() and (outs[1] >= 1.0).all()


def test_one_engine_whose_queue_grows_is_an_overload_the_sum_can_hide():
    """Three engines holding 100 requests each, steadily, and a fourth whose queue grows from 0 to
    40: the sum grows by 10 % (under the rule's half), the fourth engine's by far more than two
    batches: the run is flagged, naming the engine; with steady engines, or one engine, it is not."""
    import numpy as np

    from mbbatch import stats
    from mbbatch.planners.common import engines_backlog

    t = np.linspace(0.0, 100.0, 401)
    engines = np.column_stack([np.full(t.size, 100.0)] * 3 + [0.4 * t])
    total = engines.sum(axis=1, keepdims=True)
    assert not stats.queue_verdict(t, total, 1.0, 0.0, 100.0)[0]      # the sum alone misses it
    for queue in (total, engines):      # (bins summed, as the event kernel keeps them; or one column an engine)
        grows, why = engines_backlog(t, queue, engines, 1.0, 0.0, 100.0)
        assert grows and why.startswith("engine 3: the backlog grows"), why
    steady = engines.copy()
    steady[:, 3] = 5.0
    assert engines_backlog(t, steady, steady, 1.0, 0.0, 100.0) == (False, "no growing backlog")
    assert engines_backlog(t, total, None, 1.0, 0.0, 100.0) == (False, "no growing backlog")


def test_service_times_out_of_range_blame_the_model_when_one_token_is_already_out():
    """IterationModel(setup=1e200) under static batching said "workload: service times of about
    1e+200 s lie outside ...", blaming the lengths for the model's own time: a request of one prompt
    and one output token is already out of range, so it names service_model; lengths that make an
    in-range model's requests too long still name the workload."""
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))
    for pol in (mb.StaticBatching(8), mb.ContinuousBatching(max_num_seqs=8)):
        with pytest.raises(ValueError, match=r"^service_model: service times of about 1e\+200 s lie outside"):
            mb.simulate(pol, mb.Poisson(1.0), workload=wl, service_model=mb.IterationModel(setup=1e200), n=100)
    long = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=1e12))
    with pytest.raises(ValueError, match=r"^workload: service times of about .* lie outside"):
        mb.simulate(mb.StaticBatching(8), mb.Poisson(1.0), workload=long, n=100)
