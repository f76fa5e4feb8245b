"""The one pass of exact quantiles (:mod:`mbbatch._kernels.select`): each
bracket's values below it counted, those inside it counted and kept in
order, NaN in none; past the room, the count says so."""

from __future__ import annotations

import numpy as np

from mbbatch._kernels.select import bracketed


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
