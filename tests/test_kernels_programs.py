"""A cluster's programs in the event kernel (mbbatch._kernels.programs):
the calls of open-loop programs put in arrival order, chunk by chunk or all
at once, bit for bit as numpy orders them."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs


# --- the calls of open-loop programs, in arrival order (order_calls; call_times, sort_calls, permute_calls) ---

def _program_draws(seed, C, n, think, rate):
    """Programs' starts, gaps, new tokens and outputs, by call id, for n calls."""
    rng = np.random.default_rng(seed)
    P = -(-n // C)
    start = np.cumsum(rng.exponential(C / rate, P))
    gap = rng.exponential(think, P * C) if think > 0 else np.zeros(P * C)
    new = np.ceil(rng.lognormal(4.0, 1.0, P * C))
    out = np.ceil(rng.lognormal(3.0, 0.8, P * C))
    return start, gap, new, out


def _numpy_calls(start, gap, new, out, C, n, order=None):
    """The calls as numpy computes them on ``(P, C)`` arrays: a stable
    argsort of the times, the first ``n`` kept, a program's last kept call
    ending its session."""
    P = start.size
    g = gap.reshape(P, C).copy()
    g[:, 0] = 0.0
    times = (start[:, None] + np.cumsum(g, axis=1)).ravel()
    no, oo = new.reshape(P, C), out.reshape(P, C)
    ctx = (np.cumsum(no + oo, axis=1) - oo).ravel()
    if order is None:
        order = np.argsort(times, kind="stable")
    first = order[:n]
    pid = first // C
    kept = np.bincount(pid, minlength=P)
    end = (first % C) == kept[pid] - 1
    return times, ctx, order, (times[first], ctx[first], out[first], pid, new[first], end.astype(np.int8))


def _kernel_calls(start, gap, new, out, C, n, order=None):
    """The calls as call_times, sort_calls and permute_calls give them."""
    from mbbatch._kernels import programs as d
    N = new.size
    times, ctx = np.empty(N), np.empty(N)
    hi = d.call_times(start, gap, new, out, C, times, ctx)
    # the span of the times, as the sort takes it
    assert (times[0], hi) == (times.min(), times.max())
    if order is None:
        order = np.empty(N, np.int64)
        assert d.sort_calls(times, order, np.empty(N // 2 + 2, np.int64), times[0], hi)
    t_id, c_id, o_id = times.copy(), ctx.copy(), order.copy()
    new, out = new.copy(), out.copy()
    end = np.empty(n, np.int8)
    d.permute_calls(order, times, ctx, new, out, C, np.empty(start.size, np.int64), end)
    return t_id, c_id, o_id, (times[:n], ctx[:n], out[:n], order[:n], new[:n], end)


@settings(max_examples=60, deadline=None)
@given(seed=hs.integers(0, 2 ** 32 - 1), C=hs.integers(1, 9), n=hs.integers(1, 3000),
       think=hs.sampled_from([0.0, 0.01, 1.0, 50.0]), rate=hs.sampled_from([0.5, 20.0, 1e4]))
def test_open_loop_calls_are_numpys_bit_for_bit(seed, C, n, think, rate):
    """call_times, sort_calls and permute_calls give what numpy gives on the
    programs' ``(P, C)`` arrays (cumsums, a stable argsort of the times, the
    first n calls, each program's last kept call ending its session), bit for
    bit, ties (think time 0: a program's calls at one instant) included."""
    start, gap, new, out = _program_draws(seed, C, n, think, rate)
    t_np, c_np, o_np, want = _numpy_calls(start, gap, new, out, C, n)
    t_k, c_k, o_k, got = _kernel_calls(start, gap, new, out, C, n)
    assert t_np.tobytes() == t_k.tobytes() and c_np.tobytes() == c_k.tobytes()
    np.testing.assert_array_equal(o_np, o_k)
    for w, g, name in zip(want, got, ("arrival", "prompt", "output", "program", "new_tokens", "session_end")):
        assert w.tobytes() == np.asarray(g, w.dtype).tobytes(), name


def _chunked_calls(start, gap, new, out, C, n, chunk, cap, top):
    """order_calls' calls (``chunk`` programs at a time, scratch for ``cap``
    calls, ``top`` at least every call's time), or None when they did not
    fit."""
    from mbbatch._kernels import programs as d
    N = new.size
    times, new, out = gap.copy(), new.copy(), out.copy()
    ctx, prog, end = np.empty(N), np.empty(N, np.int64), np.empty(n, np.int8)
    last = np.empty(start.size if n < N else 0, np.int64)     # (as simulate gives it)
    written = d.order_calls(start, times, new, out, C, chunk, top, ctx, prog, end, last,
                            np.empty((3, cap, 4)), np.empty((3, cap), np.int64), np.empty(cap),
                            np.empty(cap, np.int64), np.empty(cap // 2 + 2, np.int64))
    if written < 0:
        return None
    assert written == N
    return times[:n], ctx[:n], out[:n], prog[:n], new[:n], end


@settings(max_examples=80, deadline=None)
@given(seed=hs.integers(0, 2 ** 32 - 1), C=hs.integers(1, 9), n=hs.integers(1, 3000),
       think=hs.sampled_from([0.0, 0.01, 1.0, 50.0]), rate=hs.sampled_from([0.5, 20.0, 1e4]),
       chunk=hs.sampled_from([1, 2, 7, 64, 5000]))
def test_chunked_calls_are_numpys_bit_for_bit(seed, C, n, think, rate, chunk):
    """order_calls, chunk by chunk, gives what numpy gives (as
    test_open_loop_calls_are_numpys_bit_for_bit), bit for bit, for any
    chunk, with the scratch simulate gives it (for a chunk and the calls its
    programs' span may carry); program_span is numpy's longest span."""
    from mbbatch._kernels import programs as d
    from mbbatch.planners import cluster as planner
    start, gap, new, out = _program_draws(seed, C, n, think, rate)
    g = gap.reshape(-1, C).copy()
    g[:, 0] = 0.0
    assert d.program_span(gap, C) == np.cumsum(g, axis=1)[:, -1].max()
    *_, want = _numpy_calls(start, gap, new, out, C, n)
    got = _chunked_calls(start, gap, new, out, C, n, *planner._order_chunks(start, gap, C, chunk))
    for w, x, name in zip(want, got, ("arrival", "prompt", "output", "program", "new_tokens", "session_end")):
        assert w.tobytes() == np.asarray(x, w.dtype).tobytes(), name


def test_chunked_calls_refuse_a_scratch_too_small():
    """Calls carried beyond the scratch: order_calls says so (-1) instead of
    losing any; with room for them it orders them as numpy does."""
    from mbbatch._kernels import programs as d
    rng = np.random.default_rng(5)
    C, P = 3, 40
    start = np.cumsum(rng.exponential(0.01, P))
    gap = rng.exponential(5.0, P * C)        # calls long after the next programs' starts
    new, out = np.ceil(rng.uniform(1, 99, P * C)), np.ceil(rng.uniform(1, 50, P * C))
    top = start[-1] + d.program_span(gap, C)
    assert _chunked_calls(start, gap, new, out, C, P * C, 2, 2 * C + 1, top) is None
    *_, want = _numpy_calls(start, gap, new, out, C, P * C)
    got = _chunked_calls(start, gap, new, out, C, P * C, 2, P * C, top)
    for w, x in zip(want, got):
        assert w.tobytes() == np.asarray(x, w.dtype).tobytes()


def test_saturated_order_and_the_sort_fallback():
    """A given order (saturated programs: every first call, then every
    second) is applied as numpy's fancy indexing applies it; times bunched
    in one bucket (one late outlier) make sort_calls give up (the caller
    then sorts with numpy), and equal times keep their ids' order."""
    from mbbatch._kernels import programs as d
    C, n = 3, 10
    P = -(-n // C)
    rng = np.random.default_rng(3)
    new, out = np.ceil(rng.uniform(1, 100, P * C)), np.ceil(rng.uniform(1, 50, P * C))
    order = np.arange(P * C).reshape(P, C).T.ravel()
    zeros = np.zeros(P)
    *_, want = _numpy_calls(zeros, np.zeros(P * C), new, out, C, n, order=order)
    *_, got = _kernel_calls(zeros, np.zeros(P * C), new, out, C, n, order=order)
    for w, g in zip(want, got):
        assert w.tobytes() == np.asarray(g, w.dtype).tobytes()
    # ends: the calls left out are the last programs' third calls
    assert got[5].sum() == P
    times = np.concatenate([rng.uniform(0.0, 1.0, 5000)[::-1], [1e12]])
    order = np.empty(times.size, np.int64)
    assert not d.sort_calls(times, order, np.empty(times.size // 2 + 2, np.int64), times.min(), times.max())
    times = np.repeat([2.0, 1.0, 3.0], 1000)
    assert d.sort_calls(times, order[:3000], np.empty(1502, np.int64), 1.0, 3.0)
    np.testing.assert_array_equal(order[:3000], np.argsort(times, kind="stable"))


def test_sort_calls_on_a_span_too_small_for_its_scale():
    """Times a few ulps apart (their span times the buckets overflows, or
    is 0 times inf) still sort, stably, every bucket index in range."""
    from mbbatch._kernels import programs as d

    times = np.array([5e-324, 0.0, 1e-323, 0.0, 5e-324, 1e-323, 0.0])
    order = np.empty(times.size, np.int64)
    assert d.sort_calls(times, order, np.empty(times.size // 2 + 2, np.int64), times.min(), times.max())
    np.testing.assert_array_equal(order, np.argsort(times, kind="stable"))


