"""Shortest-predicted-first batching (mbbatch.policies.spf): its settings,
the kernel equal to a plain-Python reference request by request, its
relations to static and multi-bin batching, and its use as a cluster's
engines and a sweep's kind."""

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch import theory
from mbbatch._kernels.spf import FORM_SPF

from .reference_spf import reference_spf

WL = mb.Workload(prompt=st.uniform(16, 496), output=st.expon(scale=64))
MODEL = mb.DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-4)


def test_its_settings_are_checked_and_described():
    p = mb.ShortestPredictedFirst(8, max_wait=2.0, predictor=mb.LogNormalError(0.5))
    assert p.describe() == {"policy": "spf", "batch_size": 8, "max_wait": 2.0, "d_sla": 7.4e-3, "eps_d": 5e-5,
                            "eta": 180000.0, "predictor": "lognormal_error", "predictor_sigma": 0.5}
    ev = p.event_config()
    assert (ev.formation, ev.b_max, ev.max_wait, ev.predictor) == (FORM_SPF, 8, 2.0, mb.LogNormalError(0.5))
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        mb.ShortestPredictedFirst(2.5)
    with pytest.raises(ValueError, match=r"max_wait must be in \[0, inf\]; got -1"):
        mb.ShortestPredictedFirst(4, max_wait=-1.0)
    with pytest.raises(TypeError, match="bin confusion moves requests between bins"):
        mb.ShortestPredictedFirst(4, predictor=mb.BinConfusion(0.9))


CASES = [
    # (servers, B, max_wait, predictor, arrivals, rate)
    (1, 4, math.inf, None, "poisson", 3.5),
    (2, 8, math.inf, None, "poisson", 10.0),
    (3, 16, math.inf, mb.LogNormalError(0.6), "poisson", 22.0),
    (1, 1, math.inf, None, "poisson", 2.5),
    (2, 8, 5.0, None, "poisson", 10.0),
    (1, 4, 2.0, mb.LogNormalError(0.3), "grid", 3.5),
    (2, 4, math.inf, None, "grid", 7.0),
    (3, 8, math.inf, "given", "poisson", 15.0),
    (1, 8, math.inf, None, "saturated", None),
    (2, 16, 0.5, None, "saturated", None),
]


#: an engine timed iteration by iteration (finished members leaving, and padded; and a mixture of
#: experts, whose batch's expert reads depend on how many members each decode iteration has left)
ITERATION = [mb.IterationModel(setup=0.01, step=5e-3, prefill_per_token=1e-4, per_sequence=2e-4,
                               per_context_token=1e-7, finished=f, per_expert=pe, experts=e)
             for f in ("leave", "stay") for pe, e in ((0.0, 0), (1e-3, 8))]


@pytest.mark.parametrize("servers, B, max_wait, predictor, arrivals, rate, model",
                         [(*c, MODEL) for c in CASES] + [(2, 8, 5.0, None, "poisson", 10.0, m) for m in ITERATION])
def test_the_kernel_equals_the_reference_request_by_request(servers, B, max_wait, predictor, arrivals, rate, model):
    """Every request's batch start and completion, bit for bit, against the
    plain-Python reference, on the kernel's own requests: light and heavy
    loads (a backlog makes the choice matter), whole-token lengths (ties
    between predictions, broken by arrival), an arrival grid of 0.5 s (many
    requests at one instant), saturated arrivals, a starvation guard."""
    n = 2000
    rng = np.random.default_rng(servers * 100 + B)
    if predictor == "given":
        predictor = mb.Predictions(rng.integers(1, 300, n).astype(float))
    if arrivals == "poisson":
        arr = mb.Poisson(rate)
    elif arrivals == "grid":
        arr = mb.Replay(np.floor(np.cumsum(rng.exponential(1 / rate, n)) * 2) / 2)
    else:
        arr = mb.Saturated()
    pol = mb.ShortestPredictedFirst(B, max_wait=max_wait, predictor=predictor)
    res = mb.simulate(pol, arr, workload=WL, service_model=model, n=n, servers=servers, seed=7, keep_requests=True)
    r = res.requests
    start, completion = reference_spf(r.arrival, r.prompt, r.output, r.pred, B, servers, model, max_wait)
    np.testing.assert_array_equal(r.start, start)
    np.testing.assert_array_equal(r.completion, completion)
    assert res.completed == n
    if max_wait == math.inf and B > 1:
        # the input exercises the rule: some batch is not the queue's head in arrival order
        order = np.lexsort((np.arange(n), r.start))
        assert np.any(np.diff(order) < 0)


def test_max_wait_zero_is_static_batching_bit_for_bit():
    kw = dict(arrivals=mb.Poisson(1.3), workload=WL, service_model=MODEL, n=5000, servers=2, seed=4,
              keep_requests=True)
    a = mb.simulate(mb.StaticBatching(8), **kw)
    b = mb.simulate(mb.ShortestPredictedFirst(8, max_wait=0.0), **kw)
    np.testing.assert_array_equal(a.requests.completion, b.requests.completion)
    assert (a.metrics() == b.metrics()
            or a.to_dataset(arrays=True).drop_attrs().equals(b.to_dataset(arrays=True).drop_attrs()))


def test_it_is_stable_where_static_batching_is_not():
    """Sorting by length shortens the batches (a batch waits for its longest
    member): at 14 requests/s on 2 servers static batching of B = 8 is
    overloaded (it serves about 12.4), shortest-predicted-first is not."""
    kw = dict(arrivals=mb.Poisson(14.0), workload=WL, service_model=MODEL, n=20000, servers=2, seed=4)
    static = mb.simulate(mb.StaticBatching(8), **kw)
    assert static.unstable and static.throughput < 13.0
    spf = mb.simulate(mb.ShortestPredictedFirst(8), **kw)
    assert not spf.unstable and spf.throughput == pytest.approx(14.0, rel=0.01)


def test_multibin_batching_converges_to_it_as_its_bins_multiply():
    """Saturated, one server, the oracle, the paper's workload (a request's
    length, U(1, 20), is its service time), B = 8: multi-bin batching's
    throughput grows with its bins as Theorem 4.2 says (0.447, 0.648,
    0.730, 0.754 requests/s at k = 1, 4, 16, 64) towards
    shortest-predicted-first's, whose batches of sorted requests minimise
    the sum of their longest members; both approach the capacity B / E[t] =
    8 / 10.5 = 0.762 (Remark 4.2) as the run's batches grow in number."""
    B, n = 8, 64 * 8 * 40
    wl = mb.Workload(prompt=np.ones(n), output=st.uniform(1, 19), integer_lengths=False)
    kw = dict(arrivals=mb.Saturated(), workload=wl, service_model=mb.MaxModel(0.0, 1.0), n=n, seed=2)
    spf = mb.simulate(mb.ShortestPredictedFirst(B), **kw).throughput
    ks = (1, 4, 16, 64)
    mbs = [mb.simulate(mb.MultiBin(bins=k, batch_size=B), **kw).throughput for k in ks]
    for k, got in zip(ks, mbs):
        assert got == pytest.approx(theory.throughput(B, 1, 20, k=k), rel=0.01), k
    assert all(a < b for a, b in zip(mbs, mbs[1:])) and mbs[-1] < spf
    assert spf - mbs[-1] < 0.02 * spf < spf - mbs[1]
    assert spf == pytest.approx(theory.capacity(B, 1, 20), rel=0.005)


def test_as_a_clusters_engines_one_engine_is_the_single_engine_run():
    kw = dict(arrivals=mb.Poisson(1.0), workload=WL, service_model=MODEL, n=3000, servers=2, seed=1,
              keep_requests=True)
    pol = mb.ShortestPredictedFirst(8, max_wait=10.0)
    one = mb.simulate(pol, **kw)
    cl = mb.simulate(mb.Cluster(pol, engines=1), **kw)
    np.testing.assert_array_equal(one.requests.completion, cl.requests.completion)
    assert cl.kind == "cluster" and cl.config["engine_policy"] == "spf"
    four = mb.simulate(mb.Cluster(pol, engines=4, router="least_used"), **{**kw, "arrivals": mb.Poisson(4.0)})
    assert four.completed == 3000 and not four.unstable


def test_a_sweep_of_it_and_its_neighbours(tmp_path):
    """A spec names it as a kind (and as a cluster's engine policy); its
    settings are the spec keys it declares, a predictor's error among them."""
    from mbbatch.sweeps.cells import check_points, run_point
    from mbbatch.sweeps.spec import parse_spec

    text = """
name = "spf"
arrivals = "poisson"
reps = 2
seed = 3
[policies.spf]
kind = "spf"
batch_size = 8
[policies.guarded]
kind = "spf"
batch_size = 8
max_wait = 20.0
[policies.cluster]
kind = "cluster"
engine_policy = "spf"
engine_batch_size = 8
engines = 2
programs = "none"
[params]
prompt_median = 200.0
prompt_sigma = 0.5
output_median = 50.0
output_sigma = 0.8
d_sla = 0.0075
eta = 50000.0
b_max = 64
n = 2000
[grid]
policy = ["spf", "guarded", "cluster"]
rate = [1.0]
predictor_sigma = [0.0, 0.5]
"""
    with pytest.raises(Exception, match="predictor_sigma does not apply to the variants"):
        parse_spec(text)
    spec = parse_spec(text.replace("predictor_sigma = [0.0, 0.5]\n", "").replace(
        "batch_size = 8\nmax_wait", "batch_size = 8\npredictor_sigma = 0.5\nmax_wait"))
    check_points(spec)
    for _, params in spec.points():
        out = run_point(spec.arrivals, spec.service, params, spec.seed, spec.reps)
        assert (out["completed"] == 2000).all()
