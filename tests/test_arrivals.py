"""Arrival processes (mbbatch.arrivals): what each one produces in a run, and
how it describes itself."""

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb

U = st.uniform(1, 1)
POL = mb.MultiBin(bins=1, batch_size=1)


def _arrivals(arrivals, n=20000, **kw):
    res = mb.simulate(kw.pop("policy", POL), arrivals=arrivals, n=n, seed=2, keep_requests=True,
                      **(kw or {"service": U}))
    return res.requests.arrival


def test_poisson_gaps_are_exponential_at_the_rate():
    """Kolmogorov-Smirnov on 20,000 gaps at rate 4: p > 1e-4 (a correct
    kernel fails with probability 1e-4)."""
    gaps = np.diff(_arrivals(mb.Poisson(rate=4.0)))
    assert st.kstest(gaps, st.expon(scale=0.25).cdf).pvalue > 1e-4
    assert mb.Poisson(rate=4.0).describe() == {"arrivals": "poisson", "rate": 4.0}


def test_saturated_arrives_at_time_zero():
    assert (_arrivals(mb.Saturated(), n=100) == 0).all()


def test_replay_replays_the_times_in_order():
    t = np.cumsum(np.random.default_rng(0).exponential(1.0, 500))
    np.testing.assert_array_equal(_arrivals(mb.Replay(t), n=None), t)
    with pytest.raises(ValueError, match="non-decreasing"):
        mb.Replay([0.0, 2.0, 1.0])


def test_piecewise_poisson_steps_its_rate():
    """Rates 1, 10, 1 with changes at 100 s and 200 s: the arrivals per
    second in each segment are within 99.99% Poisson bounds of the rate."""
    wl = mb.Workload(prompt=U, output=U)
    t = _arrivals(mb.PiecewisePoisson([1.0, 10.0, 1.0], [100.0, 200.0]), n=1500,
                  policy=mb.StaticBatching(4), workload=wl, service_model=mb.MaxModel(per_token=1e-3))
    z = st.norm.ppf(1 - 1e-4 / 2)
    for lo, hi, rate in ((0.0, 100.0, 1.0), (100.0, 200.0, 10.0)):
        count = ((t >= lo) & (t < hi)).sum()
        mean = rate * (hi - lo)
        assert abs(count - mean) < z * np.sqrt(mean), (lo, hi, count)
    with pytest.raises(ValueError, match="len\\(rates\\) - 1"):
        mb.PiecewisePoisson([1.0, 2.0], [1.0, 2.0])
