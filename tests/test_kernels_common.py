"""The kernels' shared draws (:mod:`mbbatch._kernels.common`): the standard
normal and exponential steps are numpy's ziggurats, and the gamma and
Weibull service draws numpy's algorithms, value for value, so every stream
drawn through them is the one numpy's Generator draws."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
from numba import njit

from numba.core.errors import TypingError

from mbbatch._kernels.common import (
    ARR_POISSON, ARRIVAL_KINDS, CACHE, LENGTH_KINDS, PRED_ORACLE, PREDICT_KINDS, arrival_group, draw_block,
    drawer_caches, drawers, gamma_constants, load_tuple, numpy_gamma, standard_exponential, standard_normal,
)
from mbbatch.lengths import as_service

#: enough draws that each ziggurat's slow paths run: about 1 % of draws
#: leave the fast path, and the tail (layer 0) about 1 in 2,000
N = 200_000


@njit
def _draws(gen, n, normal):
    bits = gen.bit_generator
    out = np.empty(n)
    for i in range(n):
        out[i] = standard_normal(bits) if normal else standard_exponential(bits)
    return out


@pytest.mark.parametrize("seed", [0, 7])
def test_standard_normal_is_numpys(seed):
    """Value for value numpy's ``Generator.standard_normal`` on the same bit
    generator, signs, zeros and tails included."""
    ours = _draws(np.random.Generator(np.random.PCG64DXSM(seed)), N, True)
    theirs = np.random.Generator(np.random.PCG64DXSM(seed)).standard_normal(N)
    np.testing.assert_array_equal(ours, theirs)
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))
    assert (np.abs(ours) > 3.6541528853610088).any()   # the tail beyond the ziggurat's base was drawn


@pytest.mark.parametrize("seed", [0, 7])
def test_standard_exponential_is_numpys(seed):
    """Value for value numpy's ``Generator.standard_exponential``, tail
    included."""
    ours = _draws(np.random.Generator(np.random.PCG64DXSM(seed)), N, False)
    theirs = np.random.Generator(np.random.PCG64DXSM(seed)).standard_exponential(N)
    np.testing.assert_array_equal(ours, theirs)
    assert (ours > 7.69711747013104972).any()          # the tail beyond the ziggurat's base was drawn


@njit
def _gamma_draws(gen, shape, n):
    bits = gen.bit_generator
    b, c, inv = gamma_constants(shape)
    out = np.empty(n)
    for i in range(n):
        out[i] = numpy_gamma(bits, shape, b, c, inv)
    return out


@pytest.mark.parametrize("shape", [0.0, 0.25, 0.999, 1.0, 1.0625, 4.0])
def test_numpy_gamma_is_numpys(shape):
    """Value for value numpy's ``Generator.standard_gamma``: its rejection
    sampler below shape 1, the exponential at 1, Marsaglia-Tsang above."""
    ours = _gamma_draws(np.random.Generator(np.random.PCG64DXSM(5)), shape, N // 4)
    theirs = np.random.Generator(np.random.PCG64DXSM(5)).standard_gamma(shape, N // 4)
    np.testing.assert_array_equal(ours, theirs)


@njit
def _block(fn, params, values, m, gen, out):
    draw_block(fn, params, values, 0, m, gen, out)


@pytest.mark.parametrize("dist", [st.gamma(0.4, loc=1.0, scale=2.0), st.gamma(2.5, scale=3.0),
                                  st.weibull_min(0.7, loc=0.5, scale=2.0), st.weibull_min(1.5, scale=4.0)])
def test_gamma_and_weibull_blocks_are_numpys(dist):
    """A block of gamma or Weibull service draws is ``loc + scale * X``
    with X numpy's ``standard_gamma`` or ``weibull`` on the same stream."""
    spec = as_service(dist)
    out = np.empty(3000)
    _block(drawers(ARR_POISSON, spec.kind)[1], spec.params, spec.values, out.size,
           np.random.Generator(np.random.PCG64DXSM(9)), out)
    gen = np.random.Generator(np.random.PCG64DXSM(9))
    shape, loc, scale = dist.args[0], dist.kwds.get("loc", 0.0), dist.kwds.get("scale", 1.0)
    x = gen.standard_gamma(shape, out.size) if dist.dist.name == "gamma" else gen.weibull(shape, out.size)
    np.testing.assert_array_equal(out, loc + scale * x)


@pytest.mark.parametrize("dist", [st.lognorm(0.8, scale=8.0), st.lognorm(1.5, loc=2.0, scale=0.5)])
def test_lognormal_blocks_are_numpys(dist):
    """A block of log-normal draws (its normals drawn first, then their
    exps) is ``loc + scale * X`` with X numpy's ``lognormal(0, sigma)`` on
    the same stream."""
    spec = as_service(dist)
    out = np.empty(3000)
    _block(drawers(ARR_POISSON, spec.kind)[1], spec.params, spec.values, out.size,
           np.random.Generator(np.random.PCG64DXSM(4)), out)
    x = np.random.Generator(np.random.PCG64DXSM(4)).lognormal(0.0, dist.args[0], out.size)
    np.testing.assert_array_equal(out, dist.kwds.get("loc", 0.0) + dist.kwds["scale"] * x)


def test_drawers_are_compiled_per_kind_and_called_by_address():
    """Every kind of every drawer compiles on its own and has an address;
    the same kind gives the same compiled drawer; an unknown kind is an
    error naming the kinds."""
    for k in ARRIVAL_KINDS:
        fns = drawers(k, *LENGTH_KINDS, predictor=PRED_ORACLE)
        assert fns.shape == (2 + len(LENGTH_KINDS),) and (fns != 0).all()
    assert len({int(drawers(ARR_POISSON, predictor=p)[1]) for p in PREDICT_KINDS}) == len(PREDICT_KINDS)
    assert np.array_equal(drawers(ARR_POISSON, 0, 1), drawers(ARR_POISSON, 0, 1))
    with pytest.raises(ValueError, match="no lengths drawer of kind 99; kinds are"):
        drawers(ARR_POISSON, 99)


def test_a_drawer_refuses_an_array_of_another_layout():
    """The call by address checks its arguments against the drawers'
    signature when the caller compiles: a strided array where the drawers
    take a contiguous one is a typing error, not a wrong read."""

    @njit
    def strided(fn, params, values, gen, out):
        draw_block(fn, params, values, 0, 2, gen, out[::2])

    with pytest.raises(TypingError, match="argument 5 is .* the function takes"):
        strided(drawers(ARR_POISSON, 0)[1], np.array([0.0, 1.0]), np.empty(0), np.random.default_rng(0),
                np.empty(4))


@pytest.mark.skipif(not CACHE, reason="the numba disk cache is off (MBBATCH_NUMBA_CACHE=0)")
def test_every_drawer_kind_has_a_cache_index_of_its_own():
    """Each (drawer, kind) is cached under an index file of its own: kinds
    sharing one index could cross when two processes (a sweep's workers)
    compile two kinds at once, each filing its code as the index's first
    data file."""
    paths = [cache._cache_file._index_path for cache in drawer_caches()]
    assert len(paths) == len(ARRIVAL_KINDS) + len(LENGTH_KINDS) + len(PREDICT_KINDS)
    assert len(set(paths)) == len(paths)


@pytest.mark.skipif(not CACHE, reason="the numba disk cache is off (MBBATCH_NUMBA_CACHE=0)")
def test_the_caches_of_every_function_compiled_apart_are_flushed_with_the_kernels():
    """A function compiled apart (a drawer, the iteration model's batch time,
    shortest-predicted-first's order) inlines steps of other modules, whose
    change numba's own check of its source file does not see: the package
    flushes its cache with the kernels' when any source changes.  (The
    iteration model's and the order's caches were once left out: after an
    edit of a step they inline, a run read the stale code.)"""
    from mbbatch._kernels import _drop_stale_caches  # noqa: F401  (the caller)
    from mbbatch._kernels.common import APART, apart_caches

    names = {cache._cache_file._index_name for cache in apart_caches()}
    assert {"timing", "order"} <= {key[0] for key in APART}
    assert any("iteration_batch_apart" in n for n in names) and any("order_spf" in n for n in names)
    assert len(names) == len(drawer_caches()) + len(APART)


@njit
def _groups(r, groups, n):
    out = np.empty(r.shape[0], np.int64)
    scale = groups / n
    for j in range(r.shape[0]):
        out[j] = arrival_group(r[j], groups, n, scale)
    return out


@pytest.mark.parametrize("groups", [1, 3, 32, 1000])
def test_arrival_group_is_the_integer_division(groups):
    """``arrival_group`` (no division) is ``r * groups // n`` for every
    request of small runs and for the requests about each group boundary of
    runs up to 10^12 requests, where the float quotient's rounding could
    land a request in a neighbouring group."""
    for n in range(1, 300):
        r = np.arange(n)
        np.testing.assert_array_equal(_groups(r, groups, n), r * groups // n)
    rng = np.random.default_rng(0)
    for n in rng.integers(10 ** 6, 10 ** 12, 200):
        edges = -(-np.arange(groups + 1) * n // groups)          # the first request of each group
        r = np.unique(np.clip(np.concatenate([edges - 1, edges, edges + 1, rng.integers(0, n, 50)]), 0, n - 1))
        np.testing.assert_array_equal(_groups(r, groups, int(n)), r * groups // n)


@pytest.mark.parametrize("bitgen", [np.random.PCG64DXSM, np.random.PCG64, np.random.Philox])
def test_a_requests_class_counts_the_edges_at_or_below_its_draw(bitgen):
    """A request's class is the number of edges at or below its uniform draw
    (the generator's ``random()``, in request order; a draw equal to an edge
    goes to the upper class), as numpy's comparisons count them on numpy's
    draws, each class's requests are counted, and the generator is left
    where numpy's ``random(n)`` leaves it."""
    from mbbatch._kernels.common import draw_classes

    n = 10_000
    gen, want_gen = np.random.Generator(bitgen(3)), np.random.Generator(bitgen(3))
    u = want_gen.random(n)
    edges = np.sort(u[[10, 500]])          # (two draws fall on an edge)
    klass, counts = np.empty(n), np.zeros(3, np.int64)
    draw_classes(gen, edges, klass, counts)
    assert klass.tobytes() == ((u >= edges[0]).astype(float) + (u >= edges[1])).tobytes()
    assert {klass[10], klass[500]} == {1.0, 2.0}
    assert counts.tolist() == np.bincount(klass.astype(int), minlength=3).tolist()
    assert gen.random() == want_gen.random()


def test_a_classs_values_land_at_its_requests_places_in_order():
    from mbbatch._kernels.common import scatter_class

    klass = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    a, b = np.full(5, np.nan), np.full(5, np.nan)
    scatter_class(klass, 1.0, np.array([10.0, 11.0, 12.0]), np.array([20.0, 21.0, 22.0]), a, b)
    assert a[[0, 2, 3]].tolist() == [10.0, 11.0, 12.0] and b[[0, 2, 3]].tolist() == [20.0, 21.0, 22.0]
    assert np.isnan(a[[1, 4]]).all()


@njit(cache=False)
def _loaded(ints, floats):
    return load_tuple(ints, 29), load_tuple(floats[2:5], 3)


def test_load_tuple_is_the_vectors_first_values_in_order():
    ints = np.arange(40, dtype=np.int64) * 7 - 3
    floats = np.linspace(-1.0, 1.0, 9)
    got_i, got_f = _loaded(ints, floats)
    assert got_i == tuple(int(v) for v in ints[:29])
    assert got_f == tuple(float(v) for v in floats[2:5])


def test_load_tuple_refuses_a_size_known_only_at_run_time():
    @njit(cache=False)
    def f(a, k):
        return load_tuple(a, k)

    with pytest.raises(TypingError, match="compile-time constant"):
        f(np.zeros(3), 2)
