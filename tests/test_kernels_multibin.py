"""The multi-bin kernel's entry point (``multibin.run``) with token-level
requests: each drawn or replayed value x is an output length, and a request's
service time is ``base + per_token * x`` (x rounded up to whole tokens, at
least 1, with ``integer``), the max-of-members model ``MaxModel(base,
per_token)``.  The kernel must equal the plain-Python event loop of
tests/reference.py given those service times, request by request."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from mbbatch._kernels import multibin as k
from mbbatch._seeding import STREAM_ARRIVALS, STREAM_SERVICE, stream

from .reference import reference_latencies


def streams(seed):
    ss = np.random.SeedSequence(seed)
    arrival = stream(ss, STREAM_ARRIVALS)
    return k.MultiBinStreams(arrival, stream(ss, STREAM_SERVICE), arrival, arrival)


def run(values=None, *, n, edges, base=0.0, per_token=1.0, integer=0, batch_size=4, servers=1,
        max_wait=math.inf, rate=2.0, uniform=None, seed=0):
    """Poisson arrivals; replayed lengths ``values``, or uniform ones on
    ``uniform = (loc, scale)``; every request kept."""
    kind = k.SVC_REPLAY if values is not None else k.SVC_UNIFORM
    config = k.CONFIG.zeros(n=n, arrival_kind=k.ARR_POISSON, service_kind=kind, prompt_kind=kind,
                            batch_size=batch_size, servers=0 if servers == math.inf else servers, keep=1,
                            integer=integer, rate=rate, max_wait=max_wait, base=base, per_token=per_token,
                            predictor=k.PRED_ORACLE)
    inputs = k.INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                           service_params=uniform or [0.0, 1.0],
                           service_values=np.empty(0) if values is None else values, edges=edges,
                           predictions=np.empty(0), prompt_params=np.empty(0), prompt_values=np.empty(0))
    out, req = k.run(config, inputs, streams(seed), np.zeros(k.STOP_SIZE, np.int64), groups=4)
    return out, req


def transformed(x, base, per_token, integer):
    x = np.asarray(x, np.float64)
    if integer:
        x = np.maximum(np.ceil(x), 1.0)
    return base + per_token * x


@given(lengths=hs.lists(hs.floats(0.0, 500.0, allow_subnormal=False), min_size=1, max_size=200),
       base=hs.sampled_from([0.0, 0.01, 1.5]), per_token=hs.sampled_from([1.0, 6e-3, 0.25]),
       integer=hs.sampled_from([0, 1]), batch_size=hs.integers(1, 6),
       servers=hs.sampled_from([1, 2, math.inf]), max_wait=hs.sampled_from([math.inf, 5.0]))
def test_token_requests_equal_the_reference(lengths, base, per_token, integer, batch_size, servers, max_wait):
    s = transformed(lengths, base, per_token, integer)
    # bins by service time: equal-width edges spanning the transformed values
    edges = np.linspace(0.0, float(s.max()) + 1.0, 4)
    out, req = run(np.array(lengths), n=len(lengths), edges=edges, base=base, per_token=per_token,
                   integer=integer, batch_size=batch_size, servers=servers, max_wait=max_wait)
    np.testing.assert_array_equal(req["service"], s)
    ref = reference_latencies(req["arrival"], s, edges, batch_size, servers, max_wait)
    np.testing.assert_array_equal(req["completion"] - req["arrival"], ref)
    stats = k.STATS.unpack((out.ints, out.floats))
    assert stats["completed"] == int(np.sum(~np.isnan(ref)))


@pytest.mark.parametrize("integer", [0, 1])
def test_drawn_lengths_are_transformed(integer):
    """Drawn lengths (uniform on [1, 501)): the service times are the
    transform of the service stream's draws, and the run equals the
    reference on them."""
    n, base, per_token = 3000, 0.02, 6e-3
    edges = np.array([0.0, 0.5, 1.5, 4.0])
    out, req = run(n=n, edges=edges, base=base, per_token=per_token, integer=integer, uniform=[1.0, 500.0],
                   batch_size=16, servers=2, rate=20.0, seed=3)
    draws = 1.0 + 500.0 * streams(3).service.random(n)
    np.testing.assert_array_equal(req["service"], transformed(draws, base, per_token, integer))
    ref = reference_latencies(req["arrival"], req["service"], edges, 16, 2)
    np.testing.assert_array_equal(req["completion"] - req["arrival"], ref)


def test_identity_transform_leaves_the_values():
    """base 0, per_token 1, not integer: the values themselves (the kernel
    skips the transform), as the public mb.simulate runs."""
    x = np.array([0.4, 2.5, 3.0, 7.25, 1.0])
    _, req = run(x, n=5, edges=np.array([0.0, 3.0, 8.0]), batch_size=2)
    np.testing.assert_array_equal(req["service"], x)
    _, req = run(x, n=5, edges=np.array([0.0, 3.0, 8.0]), batch_size=2, integer=1)
    np.testing.assert_array_equal(req["service"], [1.0, 3.0, 3.0, 8.0, 1.0])
