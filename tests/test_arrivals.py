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


# --- bursty arrivals: Gamma renewal and ON/OFF (MMPP-2) ------------------------------

RUNS, N_RUN = 20, 20000
#: two-sided confidence of the checks below: a correct kernel fails one with probability 1e-3
LEVEL = 0.999


def _rate_and_cv(arrivals, policy=POL, **kw):
    """Per-run estimates of the mean rate (arrivals / span) and of the gaps'
    coefficient of variation, over RUNS independent seeds."""
    rates, cvs = [], []
    for seed in range(RUNS):
        res = mb.simulate(policy, arrivals=arrivals, n=N_RUN, seed=seed, keep_requests=True,
                          **(kw or {"service": U}))
        g = np.diff(np.sort(res.requests.arrival))
        rates.append(g.size / g.sum())
        cvs.append(g.std(ddof=1) / g.mean())
    return np.array(rates), np.array(cvs)


def _within(estimates, target):
    """The t-interval (LEVEL) of the runs' mean contains ``target``: runs are
    independent, so the interval holds whatever the correlation of gaps
    within a run."""
    m, se = estimates.mean(), estimates.std(ddof=1) / np.sqrt(estimates.size)
    half = st.t.ppf(0.5 + LEVEL / 2, estimates.size - 1) * se
    return abs(m - target) <= half, (m, target, half)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_arrivals_have_their_rate_and_cv(cv):
    """Gamma(rate, cv): gaps of mean 1/rate and coefficient of variation cv."""
    rates, cvs = _rate_and_cv(mb.Gamma(rate=5.0, cv=cv))
    ok, info = _within(rates, 5.0)
    assert ok, info
    ok, info = _within(cvs, cv)
    assert ok, info


@pytest.mark.parametrize("proc", [mb.OnOff(rate_on=20.0, rate_off=0.0, mean_on=1.0, mean_off=3.0),
                                  mb.OnOff(rate_on=8.0, rate_off=2.0, mean_on=0.5, mean_off=0.5)])
def test_onoff_arrivals_have_their_mean_rate_and_interarrival_cv(proc):
    """The MMPP-2's long-run rate (rate_on mean_on + rate_off mean_off) /
    (mean_on + mean_off), and the stationary inter-arrival CV of its MAP
    (phase-type moments), which an ON/OFF process with rate_off = 0 makes
    far above 1."""
    m1, cv = proc.interarrival_moments()
    assert m1 == pytest.approx(1.0 / proc.rate, rel=1e-12)
    rates, cvs = _rate_and_cv(proc)
    ok, info = _within(rates, proc.rate)
    assert ok, info
    ok, info = _within(cvs, cv)
    assert ok, info


def test_onoff_with_equal_rates_is_poisson_in_law():
    """rate_on = rate_off: the modulation changes nothing; the moments say
    CV 1 and the gaps pass Kolmogorov-Smirnov against Exp(rate) (p > 1e-4)."""
    proc = mb.OnOff(rate_on=3.0, rate_off=3.0, mean_on=1.0, mean_off=2.0)
    assert proc.interarrival_moments() == pytest.approx((1 / 3, 1.0), rel=1e-12)
    gaps = np.diff(_arrivals(proc))
    assert st.kstest(gaps, st.expon(scale=1 / 3).cdf).pvalue > 1e-4


@pytest.mark.parametrize("shape", [1 / 16, 1 / 9, 0.25, 0.5, 0.3, 0.9, 1.0, 4.0])
def test_the_kernels_gamma_draws_follow_the_gamma_law(shape):
    """The kernels' Gamma(shape) draws pass Kolmogorov-Smirnov against
    scipy's gamma (p > 1e-4: a correct sampler fails with probability 1e-4).
    Below shape 1 they are drawn as Gamma(a + 1) U^(1/a): U^k a product
    when 1/a = k is an integer (1/16, 1/9, 1/4, 1/2: k even and odd), else
    exp(-E / a) (0.3, 0.9); above it by Marsaglia-Tsang with constants
    computed once.  (Drawn directly: arrival gaps, differences of a clock
    near 10^4 s, lose gaps below 10^-12 s, a sixth of them at shape 1/16.)"""
    from numba import njit

    from mbbatch._kernels.common import gamma_constants, integer_inverse, standard_gamma

    @njit
    def draw(gen, a, n):
        bits = gen.bit_generator
        b, c, inv = gamma_constants(a)
        k = integer_inverse(inv)
        out = np.empty(n)
        for i in range(n):
            out[i] = standard_gamma(bits, a, b, c, inv, k)
        return out, k

    x, k = draw(np.random.Generator(np.random.PCG64DXSM(11)), shape, 20000)
    assert k == (round(1 / shape) if shape in (1 / 16, 1 / 9, 0.25, 0.5) else 0)
    assert st.kstest(x, st.gamma(shape).cdf).pvalue > 1e-4


def test_the_recycled_uniform_is_uniform_and_independent_of_the_draw():
    """Marsaglia-Tsang's recycled uniform (what U^k is made of) is uniform
    on (0, 1] and independent of the gamma draw it comes with: KS against
    the uniform, and a chi-square test of independence on the 8 x 8 table
    of their octiles (p > 1e-4 each), on 200,000 pairs at shape 1.25 (the
    a + 1 of a = 1/4).  Recycling ``u`` itself rather than ``u / s`` fails
    it."""
    from numba import njit

    from mbbatch._kernels.common import gamma_constants, marsaglia_tsang

    @njit
    def pairs(gen, a, n):
        bits = gen.bit_generator
        b, c, _ = gamma_constants(a)
        g = np.empty(n)
        w = np.empty(n)
        for i in range(n):
            g[i], w[i] = marsaglia_tsang(bits, b, c, True)
        return g, w

    g, w = pairs(np.random.Generator(np.random.PCG64DXSM(5)), 1.25, 200_000)
    assert w.min() > 0.0 and w.max() <= 1.0
    assert st.kstest(w, st.uniform.cdf).pvalue > 1e-4
    gq = np.searchsorted(np.quantile(g, np.arange(1, 8) / 8), g)
    table = np.zeros((8, 8))
    np.add.at(table, (gq, np.minimum((w * 8).astype(int), 7)), 1)
    assert st.chi2_contingency(table).pvalue > 1e-4
    np.testing.assert_allclose(st.gamma(1.25).mean(), g.mean(), rtol=0.01)


@pytest.mark.parametrize("inv, k", [(4.0, 4), (9.0, 9), (2.0, 2), (1024.0, 1024), (1.0, 0), (0.25, 0), (2.25, 0),
                                    (1025.0, 0), (1.5, 0), (1024.5, 0), (np.inf, 0), (np.nan, 0), (2.0 + 1e-9, 0),
                                    (49.0 * (1 - 1e-14), 0)]
                         + [(1 / (1 / (cv * cv)), round(cv * cv)) for cv in (2 ** 0.5, 3 ** 0.5, 3, 7, 29, 31)])
def test_integer_inverse(inv, k):
    """U^(1/a) is a product when 1/a is an integer from 2 to 1024 to within
    4 ulps: every cv whose square is an integer, though float64 rounds
    1/(1/cv**2) an ulp off it for cv = sqrt(2), sqrt(3), 7, 29, 31; a gap
    of 1e-9 or 1e-14 relative is not rounding."""
    from numba import njit

    from mbbatch._kernels.common import integer_inverse

    assert njit(lambda v: integer_inverse(v))(inv) == k   # (a kernel step: called from compiled code)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 9, 16, 31, 1024])
def test_power_is_the_integer_power(k):
    """``power(x, k)`` by squarings is ``x**k`` to within 2k ulps (each
    squaring doubles the rounding errors before it: about 2e-13 relative at
    k = 1024, far below anything a gap's statistics can see)."""
    from numba import njit

    from mbbatch._kernels.common import power

    @njit
    def powers(x, k):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = power(x[i], k)
        return out

    x = np.random.default_rng(k).uniform(0.5, 1.0, 200)
    got = powers(x, np.int64(k))
    np.testing.assert_allclose(got, x ** k, rtol=2 * k * np.finfo(float).eps)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_gaps_follow_the_gamma_law(cv):
    """The arrival gaps pass Kolmogorov-Smirnov against Gamma(1/cv^2, scale
    cv^2/rate) (p > 1e-4)."""
    rate = 4.0
    gaps = np.diff(_arrivals(mb.Gamma(rate=rate, cv=cv)))
    assert st.kstest(gaps, st.gamma(1 / cv ** 2, scale=cv ** 2 / rate).cdf).pvalue > 1e-4


def test_gamma_with_cv_one_has_exponential_gaps():
    gaps = np.diff(_arrivals(mb.Gamma(rate=4.0, cv=1.0)))
    assert st.kstest(gaps, st.expon(scale=0.25).cdf).pvalue > 1e-4


@pytest.mark.parametrize("arrivals", [mb.Poisson(rate=3.0), mb.Gamma(rate=3.0, cv=2.0),
                                      mb.OnOff(rate_on=9.0, rate_off=0.0, mean_on=1.0, mean_off=2.0),
                                      mb.PiecewisePoisson([1.0, 5.0, 1.0], [50.0, 100.0])])
def test_every_policy_sees_the_same_arrival_times(arrivals):
    """The arrival stream is the same in both kernels: MultiBin and a
    token-level policy with the same seed see identical arrival times."""
    a = _arrivals(arrivals, n=3000)
    wl = mb.Workload(prompt=U, output=U)
    for pol in (mb.StaticBatching(4), mb.DynamicBatching(), mb.MultiBinDynamic(bins=2, warmup=50)):
        b = _arrivals(arrivals, n=3000, policy=pol, workload=wl, service_model=mb.MaxModel(per_token=1e-3))
        np.testing.assert_array_equal(np.sort(b), a)


def test_bursty_arrivals_validate_their_parameters():
    with pytest.raises(ValueError, match=r"cv must be in \(0, inf\); got 0.0"):
        mb.Gamma(rate=1.0, cv=0.0)
    with pytest.raises(ValueError, match="rate_off"):
        mb.OnOff(rate_on=1.0, rate_off=-1.0, mean_on=1.0, mean_off=1.0)
    with pytest.raises(ValueError, match="mean_off"):
        mb.OnOff(rate_on=1.0, rate_off=0.0, mean_on=1.0, mean_off=0.0)
    assert mb.Gamma(rate=2.0, cv=3.0).describe() == {"arrivals": "gamma", "rate": 2.0, "cv": 3.0}


# --- replaying: scale, window, tiling ------------------------------------------------

def test_replay_scale_and_window():
    t = np.array([0.0, 1.0, 2.0, 5.0, 9.0])
    np.testing.assert_array_equal(mb.Replay(t, scale=2.0).times, t / 2)
    np.testing.assert_array_equal(mb.Replay(t, window=(1.0, 9.0)).times, [0.0, 1.0, 4.0])
    np.testing.assert_array_equal(mb.Replay(t, window=(1.0, 9.0), scale=4.0).times, [0.0, 0.25, 1.0])
    assert mb.Replay(t, scale=2.0).describe() == {"arrivals": "replay", "n_times": 5, "scale": 2.0}
    with pytest.raises(ValueError, match="window must be"):
        mb.Replay(t, window=(3.0, 1.0))
    with pytest.raises(ValueError, match="holds none"):
        mb.Replay(t, window=(10.0, 20.0))
    with pytest.raises(ValueError, match="scale"):
        mb.Replay(t, scale=0.0)


def test_a_run_longer_than_its_trace_tiles_it_and_says_so():
    """n above the trace's length: the times repeat end to end, shifted by
    the span plus one mean gap (the mean rate is kept), with a warning; the
    replayed lengths repeat with them."""
    t = np.array([0.0, 1.0, 3.0])                     # span 3, mean gap 1.5: period 4.5
    with pytest.warns(mb.TraceTiledWarning, match="repeated 3 times"):
        got = _arrivals(mb.Replay(t), n=7, service=np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(got, [0.0, 1.0, 3.0, 4.5, 5.5, 7.5, 9.0])
    wl = mb.Workload(prompt=np.array([5.0, 6.0, 7.0]), output=np.array([1.0, 2.0, 3.0]))
    with pytest.warns(mb.TraceTiledWarning):
        res = mb.simulate(mb.StaticBatching(1), arrivals=mb.Replay(t), workload=wl, n=5, seed=0,
                          keep_requests=True, service_model=mb.MaxModel(per_token=1e-3))
    np.testing.assert_array_equal(res.requests.output, [1.0, 2.0, 3.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="cannot be tiled"):
        _arrivals(mb.Replay([2.0, 2.0]), n=3, service=np.array([1.0, 1.0]))


def test_replay_takes_a_trace(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n0.5,20,6\n2,30,7\n")
    trace = mb.traces.load_azure_trace(p)
    np.testing.assert_array_equal(mb.Replay(trace).times, [0.0, 0.5, 2.0])


def test_the_kernels_tile_a_trace_as_times_for_does():
    """Both kernels repeat a replayed trace in place (no copy of n values):
    the times equal Replay.times_for(n) bit for bit, and the lengths repeat."""
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(0.3, 777))
    rep = mb.Replay(t, scale=1.5)
    n = 5 * 777 + 12
    with pytest.warns(mb.TraceTiledWarning):
        got = _arrivals(rep, n=n, service=rng.uniform(1, 2, 777))
    np.testing.assert_array_equal(got, rep.times_for(n, warn=False))
    wl = mb.Workload(prompt=rng.integers(1, 50, 777).astype(float), output=rng.integers(1, 50, 777).astype(float))
    with pytest.warns(mb.TraceTiledWarning):
        res = mb.simulate(mb.StaticBatching(4), arrivals=rep, workload=wl, n=n, seed=0, keep_requests=True,
                          service_model=mb.MaxModel(per_token=1e-3))
    np.testing.assert_array_equal(np.sort(res.requests.arrival), rep.times_for(n, warn=False))
    np.testing.assert_array_equal(res.requests.output[777:1554], wl.output)


@pytest.mark.parametrize("shape", [1.0, 1.0625, 4.0])
def test_the_kernels_gamma_draws_from_shape_one_up_are_numpys(shape):
    """From shape 1 up the kernels' gamma draws are numba's (numpy's
    algorithm), value for value: only its constants move out of the loop."""
    from numba import njit
    from numba.np.random.distributions import random_standard_gamma

    from mbbatch._kernels.common import gamma_constants, standard_gamma

    @njit
    def draws(gen, a, n, ours):
        bits = gen.bit_generator
        b, c, inv = gamma_constants(a)
        out = np.empty(n)
        for i in range(n):
            out[i] = standard_gamma(bits, a, b, c, inv, 0) if ours else random_standard_gamma(bits, a)
        return out

    ours = draws(np.random.Generator(np.random.PCG64DXSM(3)), shape, 50000, True)
    theirs = draws(np.random.Generator(np.random.PCG64DXSM(3)), shape, 50000, False)
    np.testing.assert_array_equal(ours, theirs)
