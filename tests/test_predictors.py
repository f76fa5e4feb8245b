"""Length predictors (mbbatch.predictors): a request is binned by its
prediction and served for its true value; the predictions have their own
stream, so every predictor sees the same requests."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb

U = st.uniform(1, 19)
N = 40_000
#: two-sided confidence of the statistical checks: a correct kernel fails one with probability 1e-3
LEVEL = 0.999
Z = st.norm.ppf(0.5 + LEVEL / 2)


def run(predictor=None, bins=4, **kw):
    kw = {"arrivals": mb.Poisson(rate=2.0), "service": U, "n": N, "seed": 5, "keep_requests": True, **kw}
    return mb.simulate(mb.MultiBin(bins=bins, batch_size=8, predictor=predictor), **kw)


def true_bins(res):
    return np.clip(np.searchsorted(res.edges, res.requests.service, side="right") - 1, 0, res.edges.size - 2)


@pytest.mark.parametrize("predictor", [mb.LogNormalError(0.0), mb.BinConfusion(1.0), mb.Oracle()])
def test_the_perfect_cases_equal_the_oracle_bit_for_bit(predictor):
    oracle, res = run(), run(predictor)
    for col in ("arrival", "service", "predicted", "completion", "bin", "batch"):
        np.testing.assert_array_equal(getattr(res.requests, col), getattr(oracle.requests, col))
    assert res.metrics() == oracle.metrics()


def test_every_predictor_sees_the_same_requests():
    oracle = run()
    for predictor in (mb.LogNormalError(0.7), mb.BinConfusion(0.5), mb.Predictions(np.full(N, 3.0))):
        res = run(predictor)
        np.testing.assert_array_equal(res.requests.arrival, oracle.requests.arrival)
        np.testing.assert_array_equal(res.requests.service, oracle.requests.service)
        assert not np.array_equal(res.requests.bin, oracle.requests.bin)


@pytest.mark.parametrize("sigma", [0.2, 1.0])
def test_lognormal_error_has_its_sigma_and_bins_by_the_prediction(sigma):
    """log(predicted / true) ~ N(0, sigma^2): its mean within the z-interval
    of 0 and its variance within the chi-square interval of sigma^2 (LEVEL);
    each request sits in the bin of its prediction."""
    res = run(mb.LogNormalError(sigma))
    r = np.log(res.requests.predicted / res.requests.service)
    assert abs(r.mean()) < Z * sigma / np.sqrt(N)
    lo, hi = st.chi2.ppf([(1 - LEVEL) / 2, (1 + LEVEL) / 2], N - 1) / (N - 1)
    assert lo * sigma ** 2 < r.var(ddof=1) < hi * sigma ** 2
    e = res.edges
    want = np.clip(np.searchsorted(e, res.requests.predicted, side="right") - 1, 0, e.size - 2)
    np.testing.assert_array_equal(res.requests.bin, want)
    assert res.config["predictor"] == "lognormal_error" and res.config["predictor_sigma"] == sigma


@pytest.mark.parametrize("p", [0.0, 0.5, 0.9])
def test_bin_confusion_keeps_the_bin_with_probability_p_and_moves_to_a_neighbour(p):
    """Kept with probability p (binomial interval, LEVEL); a moved request
    lands in a neighbouring bin, either side equally often in the inner bins
    (binomial interval of 1/2), the one neighbour at the ends."""
    res = run(mb.BinConfusion(p))
    true, got = true_bins(res), res.requests.bin
    kept = np.mean(got == true)
    assert abs(kept - p) <= Z * np.sqrt(p * (1 - p) / N) + 1e-12
    moved = got != true
    assert np.all(np.abs(got[moved] - true[moved]) == 1)
    inner = moved & (true > 0) & (true < 3)
    down = np.mean(got[inner] < true[inner])
    assert abs(down - 0.5) <= Z * np.sqrt(0.25 / inner.sum())
    assert np.all(got[moved & (true == 0)] == 1) and np.all(got[moved & (true == 3)] == 2)
    np.testing.assert_array_equal(res.requests.predicted, res.requests.service)   # bins move, not lengths


def test_bin_confusion_with_one_bin_changes_nothing():
    np.testing.assert_array_equal(run(mb.BinConfusion(0.0), bins=1).requests.bin, 0)


def test_predictions_bin_by_the_users_values_and_serve_the_truth():
    rng = np.random.default_rng(1)
    pred = rng.uniform(1, 20, N)
    res = run(mb.Predictions(pred))
    np.testing.assert_array_equal(res.requests.predicted, pred)
    e = res.edges
    np.testing.assert_array_equal(res.requests.bin, np.clip(np.searchsorted(e, pred, side="right") - 1, 0, 3))
    np.testing.assert_array_equal(res.requests.service, run().requests.service)
    with pytest.raises(ValueError, match="predictor.values has 10 values; the n = 20 requests need one each"):
        run(mb.Predictions(np.ones(10)), n=20)
    with pytest.raises(ValueError, match="has 10 values but predictor.values has 12"):
        run(mb.Predictions(np.ones(12)), service=np.ones(10), n=None)


def test_workload_predictor_sigma_is_the_lognormal_error_case():
    """`Workload(predictor_sigma=s)` under MultiBin is `LogNormalError(s)`."""
    kw = dict(arrivals=mb.Poisson(rate=0.2), n=5000, seed=2, keep_requests=True,
              service_model=mb.MaxModel(base=0.5, per_token=0.02))
    lengths = dict(prompt=st.uniform(10, 90), output=st.lognorm(0.8, scale=60))
    a = mb.simulate(mb.MultiBin(bins=3, batch_size=4), workload=mb.Workload(**lengths, predictor_sigma=0.4), **kw)
    b = mb.simulate(mb.MultiBin(bins=3, batch_size=4, predictor=mb.LogNormalError(0.4)),
                    workload=mb.Workload(**lengths), **kw)
    np.testing.assert_array_equal(a.requests.bin, b.requests.bin)
    assert a.metrics() == b.metrics()
    with pytest.raises(ValueError, match="not both"):
        mb.simulate(mb.MultiBin(bins=3, batch_size=4, predictor=mb.BinConfusion(0.5)),
                    workload=mb.Workload(**lengths, predictor_sigma=0.4), **kw)


def test_predictors_validate_their_parameters():
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        mb.BinConfusion(1.5)
    with pytest.raises(ValueError, match="sigma"):
        mb.LogNormalError(-0.1)
    with pytest.raises(ValueError, match="values"):
        mb.Predictions([1.0, -1.0])
    with pytest.raises(TypeError, match="predictor must be"):
        mb.MultiBin(bins=2, batch_size=4, predictor=0.5)


# --- multi-bin dynamic batching ---------------------------------------------------------

WL = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=128))


def run_mbd(predictor=None, n=30_000, **kw):
    kw = {"arrivals": mb.Poisson(rate=3.0), "workload": WL, "n": n, "seed": 2, "keep_requests": True, **kw}
    return mb.simulate(mb.MultiBinDynamic(bins=4, warmup=500, predictor=predictor), **kw)


@pytest.mark.parametrize("predictor", [mb.LogNormalError(0.0), mb.BinConfusion(1.0)])
def test_multibin_dynamic_perfect_predictors_equal_the_oracle_bit_for_bit(predictor):
    oracle, res = run_mbd(), run_mbd(predictor)
    for col in ("arrival", "output", "pred", "start", "completion", "bin"):
        np.testing.assert_array_equal(getattr(res.requests, col), getattr(oracle.requests, col))
    assert res.metrics() == oracle.metrics()


def test_multibin_dynamic_lognormal_error_is_the_workloads_predictor_sigma():
    a = run_mbd(mb.LogNormalError(0.5))
    b = mb.simulate(mb.MultiBinDynamic(bins=4, warmup=500), arrivals=mb.Poisson(rate=3.0),
                    workload=mb.Workload(prompt=WL.prompt, output=WL.output, predictor_sigma=0.5), n=30_000,
                    seed=2, keep_requests=True)
    np.testing.assert_array_equal(a.requests.bin, b.requests.bin)
    assert a.metrics() == b.metrics()


def test_multibin_dynamic_bin_confusion_keeps_the_bin_with_probability_p():
    """After the warm-up, a request's bin is its prediction's bin (by the
    edges Algorithm 6 set) with probability p (binomial interval, LEVEL),
    else a neighbour; the requests are the oracle's."""
    p = 0.7
    res, oracle = run_mbd(mb.BinConfusion(p)), run_mbd()
    np.testing.assert_array_equal(res.requests.output, oracle.requests.output)
    after = res.requests.start >= res.warmup_time        # served once the edges were set
    lo, hi = res.edges[:-1], res.edges[1:]
    pred = res.requests.pred[after]
    true = np.clip(np.searchsorted(res.edges, pred, side="right") - 1, 0, 3)
    got = res.requests.bin[after]
    ok = (pred >= lo[0]) & (pred < hi[-1])
    kept = np.mean(got[ok] == true[ok])
    assert abs(kept - p) <= Z * np.sqrt(p * (1 - p) / ok.sum())
    assert np.all(np.abs(got[ok] - true[ok]) <= 1)


def test_multibin_dynamic_takes_the_users_predictions():
    pred = np.where(np.arange(30_000) % 2 == 0, 10.0, 400.0)
    res = run_mbd(mb.Predictions(pred))
    np.testing.assert_array_equal(res.requests.pred, pred)
    with pytest.raises(ValueError, match="not both"):
        mb.simulate(mb.MultiBinDynamic(bins=4, predictor=mb.BinConfusion(0.5)), arrivals=mb.Poisson(rate=3.0),
                    workload=mb.Workload(prompt=WL.prompt, output=WL.output, predictor_sigma=0.5), n=2000)


def test_each_predictor_predicts_lengths_before_a_run():
    """Predictor.predict (the continuous engine's predictions, made in numpy):
    the oracle gives the true values and draws nothing, the log-normal error
    multiplies them by exp(sigma Z) from the prediction stream, the given
    predictions repeat end to end, and a bin confusion, which has no length
    to give, is refused by name."""
    true = np.array([3.0, 10.0, 50.0, 7.0, 1.0])

    def no_draws():
        raise AssertionError("the predictor drew")

    assert mb.Oracle().predict(true, no_draws) is true
    z = np.random.default_rng(5).standard_normal(true.size)
    got = mb.LogNormalError(0.4).predict(true, lambda: np.random.default_rng(5))
    assert np.array_equal(got, true * np.exp(0.4 * z))
    assert mb.Predictions(np.array([2.0, 4.0])).predict(true, no_draws).tolist() == [2.0, 4.0, 2.0, 4.0, 2.0]
    with pytest.raises(TypeError, match="BinConfusion predicts a request's bin, not its length"):
        mb.BinConfusion(0.9).predict(true, no_draws)
