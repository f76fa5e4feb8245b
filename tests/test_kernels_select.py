"""The one pass of exact quantiles (:mod:`mbbatch._kernels.select`): each
bracket's values below it counted, those inside it counted and kept in
order, NaN in none; past the room, the count says so.  The stable order of
nearly sorted keys: numpy's stable sort's, or a refusal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbbatch._kernels.select import bracketed, stable_order
from mbbatch.planners.common import decode_stage_requests


def _run(x, lo, hi, room):
    below, size = np.zeros(len(lo), np.int64), np.zeros(len(lo), np.int64)
    kept = np.full((len(lo), room), -1.0)
    m = bracketed(np.asarray(x, float), np.asarray(lo, float), np.asarray(hi, float), below, kept, size)
    return m, below, size, kept


def test_each_bracket_counts_below_and_keeps_inside_in_order():
    rng = np.random.default_rng(0)
    x = rng.normal(size=5000)
    x[rng.random(5000) < 0.1] = np.nan
    lo, hi = [-np.inf, -0.5, 1.0], [-1.0, 0.5, np.inf]
    m, below, size, kept = _run(x, lo, hi, 5000)
    real = x[~np.isnan(x)]
    assert m == real.size
    for b in range(3):
        inside = real[(real >= lo[b]) & (real <= hi[b])]
        assert below[b] == np.count_nonzero(real < lo[b])
        assert size[b] == inside.size
        np.testing.assert_array_equal(kept[b, :size[b]], inside)


def test_a_bracket_past_its_room_counts_every_value_inside():
    x = np.arange(100.0)
    m, below, size, kept = _run(x, [10.0], [59.0], 20)
    assert (m, below[0], size[0]) == (100, 10, 50)
    np.testing.assert_array_equal(kept[0, :19], np.arange(10.0, 29.0))


def test_nothing_but_nan_is_nothing():
    m, below, size, _ = _run(np.full(10, np.nan), [-np.inf], [np.inf], 4)
    assert (m, below[0], size[0]) == (0, 0, 0)


def _stable(key, x):
    many = np.flatnonzero(x > 1.0)
    return many[np.argsort(key[many], kind="stable")]


def _order(key, x, budget):
    out = np.full(key.size, -1, np.int64)
    m = stable_order(np.asarray(key, float), np.asarray(x, float), 1.0, out, budget)
    return m, out[:max(m, 0)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, -0.0]),
                          st.floats(0.0, 3.0, allow_nan=False)), max_size=60))
def test_stable_order_is_numpys_stable_sort_or_refuses(pairs):
    """Whatever the keys (ties, -0.0 beside 0.0, any order), the order is a
    stable sort's of the requests above the floor, or -1 once past the
    budget of moves; a generous budget always answers."""
    key = np.array([k for k, _ in pairs], float)
    x = np.array([v for _, v in pairs], float)
    want = _stable(key, x)
    m, got = _order(key, x, 10**6)
    assert m == want.size
    np.testing.assert_array_equal(got, want)
    m, got = _order(key, x, 3)
    assert m == -1 or np.array_equal(got, want)


def test_stable_order_on_nearly_sorted_keys_reversed_ones_and_nan():
    rng = np.random.default_rng(1)
    arrival = np.cumsum(rng.exponential(size=100_000))
    first = arrival + rng.lognormal(0.0, 1.0, arrival.size)
    x = rng.integers(0, 5, arrival.size).astype(float)
    m, got = _order(first, x, 16 * first.size)
    np.testing.assert_array_equal(got, _stable(first, x))
    # (reversed keys: every request moves past all before it, over the budget)
    assert _order(first[::-1].copy(), x, 16 * first.size)[0] == -1
    first[500] = np.nan
    x[500] = 2.0
    assert _order(first, x, 10**12)[0] == -1


@pytest.mark.parametrize("shuffle", [False, True])
def test_decode_stage_requests_is_the_stable_sort(shuffle):
    """:func:`decode_stage_requests` (insertion where nearly sorted, else
    numpy's sort) is the stable sort of the requests of more than one token."""
    rng = np.random.default_rng(2)
    first = np.cumsum(rng.exponential(size=20_000)) + rng.exponential(3.0, 20_000)
    if shuffle:
        rng.shuffle(first)
    out = rng.integers(1, 4, first.size).astype(float)
    np.testing.assert_array_equal(decode_stage_requests(first, out), _stable(first, out))
