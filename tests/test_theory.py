"""Tests of mbbatch.theory as a whole: what holds across its modules
(uniform, exponential, general).  Every public function with array
arguments broadcasts them and matches its scalar results; every function
checks its arguments and names the bad one.

The tests of each module are in test_theory_uniform.py,
test_theory_exponential.py and test_theory_general.py; shared strategies and
reference implementations are in theory_helpers.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mbbatch.theory import (
    batch_service_time,
    capacity,
    exponential_boundaries,
    exponential_service_bound,
    exponential_throughput_bound,
    harmonic_number,
    latency,
    min_bins,
    service_time,
    throughput,
    uniform_boundaries,
)

# --------------------------------------------------------------------------
# broadcasting
# --------------------------------------------------------------------------

def test_broadcasting_matches_scalars():
    B = np.array([1, 2, 128, 512])
    k = np.array([[1], [3], [64]])
    lam = np.array([0.5, 2.0, 10.0, 1e3])
    l_min = np.array([0.0, 1.0, 5.0, 99.0])
    l_max = l_min + np.array([1e-3, 19.0, 1.0, 900.0])
    eps = np.array([1e-6, 0.5, 1.0, 0.01])
    cases = [
        (service_time, (B, l_min, l_max, k)),
        (throughput, (B, l_min, l_max, k)),
        (capacity, (B, l_min, l_max)),
        (min_bins, (B, l_min, l_max, eps)),
        (latency, (B, l_min, l_max, k, lam)),
        (exponential_service_bound, (B, lam, k)),
        (exponential_throughput_bound, (B, lam, k)),
        (harmonic_number, (B,)),
    ]
    for fn, args in cases:
        out = fn(*args)
        shape = np.broadcast_shapes(*(np.shape(a) for a in args))
        assert out.shape == shape, fn.__name__
        bargs = np.broadcast_arrays(*args)
        for idx in np.ndindex(shape):
            scal = [a[idx].item() for a in bargs]
            assert out[idx] == fn(*scal), (fn.__name__, idx)
    assert min_bins(B, l_min, l_max, eps).dtype == np.int64
    # edges: edge axis last
    e = uniform_boundaries(l_min, l_max, 5)
    assert e.shape == (4, 6)
    for i in range(4):
        assert e[i].tolist() == uniform_boundaries(l_min[i], l_max[i], 5).tolist()
    mu = np.array([0.1, 1.0, 3.0])
    e = exponential_boundaries(64, mu, 4)
    for i in range(3):
        assert e[i].tolist() == exponential_boundaries(64, float(mu[i]), 4).tolist()
    # batch_service_time over an array of B
    dist = stats.uniform(1, 19)
    edges = uniform_boundaries(1.0, 20.0, 3)
    bs = np.array([[1, 2], [8, 64]])
    out = batch_service_time(dist, edges, bs)
    assert out.shape == (2, 2)
    for idx in np.ndindex(2, 2):
        assert out[idx] == batch_service_time(dist, edges, int(bs[idx]))
    # scalar in, Python scalar out
    assert type(service_time(2, 1.0, 2.0, 3)) is float
    assert type(min_bins(2, 1.0, 2.0, 0.1)) is int


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------

GOOD = dict(B=4, l_min=1.0, l_max=20.0, k=3, eps=0.5, lam=2.0, mu=0.1)
REAL_FUNCS = {
    service_time: ("B", "l_min", "l_max", "k"),
    throughput: ("B", "l_min", "l_max", "k"),
    capacity: ("B", "l_min", "l_max"),
    min_bins: ("B", "l_min", "l_max", "eps"),
    latency: ("B", "l_min", "l_max", "k", "lam"),
    uniform_boundaries: ("l_min", "l_max", "k"),
    exponential_boundaries: ("B", "mu", "k"),
    exponential_service_bound: ("B", "mu", "k"),
    exponential_throughput_bound: ("B", "mu", "k"),
    harmonic_number: ("B",),
}
CASES = [(fn, p) for fn, ps in REAL_FUNCS.items() for p in ps]


def _call(fn, **override):
    args = [override.get(p, GOOD[p]) for p in REAL_FUNCS[fn]]
    return fn(*args)


@pytest.mark.parametrize("fn,param", CASES, ids=[f"{f.__name__}-{p}" for f, p in CASES])
def test_bad_values_raise_naming_the_parameter(fn, param):
    if param in ("B", "k"):
        for bad in (-1, 0, np.int64(-3)):
            with pytest.raises(ValueError, match=param):
                _call(fn, **{param: bad})
        # counts: NaN and inf are out of the domain; any finite float (4.0,
        # 2.5) or bool is the wrong kind
        for bad in (math.nan, math.inf, -math.inf, np.float64(math.nan)):
            with pytest.raises(ValueError, match=param):
                _call(fn, **{param: bad})
        for bad in (4.0, 2.5, True, np.float64(3.0)):
            with pytest.raises(TypeError, match=param):
                _call(fn, **{param: bad})
    else:
        for bad in (-1.0, math.nan, math.inf, -math.inf, np.array([1.0, math.nan])):
            with pytest.raises(ValueError, match=param):
                _call(fn, **{param: bad})
        with pytest.raises(TypeError, match=param):
            _call(fn, **{param: True})


@pytest.mark.parametrize("fn", [f for f in REAL_FUNCS if "l_max" in REAL_FUNCS[f]],
                         ids=lambda f: f.__name__)
def test_l_max_not_above_l_min(fn):
    for lo, hi in ((5.0, 5.0), (5.0, 4.0), (np.array([1.0, 5.0]), np.array([2.0, 5.0]))):
        with pytest.raises(ValueError, match="l_max must be greater than l_min"):
            _call(fn, l_min=lo, l_max=hi)


def test_count_arrays_validated():
    with pytest.raises(ValueError, match="B"):
        service_time(np.array([2, 0]), 1.0, 2.0, 1)
    with pytest.raises(TypeError, match="k"):
        service_time(2, 1.0, 2.0, np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="k"):
        uniform_boundaries(1.0, 2.0, np.array([2, 3]))
    with pytest.raises(TypeError, match="B"):
        exponential_boundaries(np.array([2, 3]), 1.0, 2)


def test_the_package_exports_every_submodules_closed_form():
    from mbbatch import theory
    from mbbatch.theory import continuous, exponential, general, iteration, uniform

    assert set(theory.__all__) == (set(uniform.__all__) | set(exponential.__all__) | set(general.__all__)
                                   | set(iteration.__all__) | set(continuous.__all__) | {"OutsideAssumptions"})
    for name in theory.__all__:
        assert callable(getattr(theory, name)), name
