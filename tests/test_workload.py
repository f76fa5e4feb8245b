"""The request model's requests (mbbatch.workload): lengths drawn or
replayed, rounded to whole tokens, and the predictor's error."""

import numpy as np
import scipy.stats as st

import mbbatch as mb


def _requests(wl, n=4000):
    return mb.simulate(mb.StaticBatching(8), arrivals=mb.Poisson(2.0), workload=wl, n=n, seed=3,
                       keep_requests=True, service_model=mb.MaxModel(per_token=1e-3)).requests


def test_integer_lengths_are_whole_tokens_at_least_one():
    r = _requests(mb.Workload(prompt=st.uniform(0, 5), output=st.expon(scale=3)))
    for col in (r.prompt, r.output):
        assert (col == np.ceil(col)).all() and col.min() >= 1
    r = _requests(mb.Workload(prompt=st.uniform(0, 5), output=st.expon(scale=3), integer_lengths=False))
    assert (r.output != np.ceil(r.output)).any()


def test_replayed_lengths_come_back_in_order():
    p, o = np.arange(1, 501, dtype=float), np.arange(500, 0, -1, dtype=float)
    r = _requests(mb.Workload(prompt=p, output=o), n=None)
    np.testing.assert_array_equal(r.prompt, p)
    np.testing.assert_array_equal(r.output, o)


def test_the_oracle_predicts_exactly_and_sigma_adds_lognormal_error():
    """With predictor_sigma = 0.5 and real lengths, log(pred / output) is
    N(0, 0.5^2): KS p > 1e-4."""
    r = _requests(mb.Workload(prompt=st.uniform(1, 9), output=st.uniform(10, 90)))
    np.testing.assert_array_equal(r.pred, r.output)
    r = _requests(mb.Workload(prompt=st.uniform(1, 9), output=st.uniform(10, 90), integer_lengths=False,
                              predictor_sigma=0.5))
    assert st.kstest(np.log(r.pred / r.output), st.norm(scale=0.5).cdf).pvalue > 1e-4


def test_describe_names_both_lengths():
    d = mb.Workload(prompt=st.uniform(1, 9), output=st.expon(scale=2)).describe()
    assert d["prompt"] == "uniform" and d["output"] == "expon" and d["integer_lengths"] is True
