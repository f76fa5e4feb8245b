"""The per-batch aggregates (mbbatch.service_models.aggregates): equal to plain loops over the
members, broadcast, and their errors naming the argument."""

import math

import numpy as np
import pytest

from mbbatch.service_models import (
    BatchTimes,
    CalibratedModel,
    DecodeModel,
    MaxModel,
    batch_aggregates,
)


PROMPT = np.array([10.0, 20.0, 30.0, 40.0])
OUTPUT = np.array([5.0, 50.0, 7.0, 9.0])


def test_batch_aggregates_equal_a_loop():
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 20, 100)
    n = int(sizes.sum())
    p, o = rng.integers(0, 1000, n).astype(float), rng.integers(0, 1000, n).astype(float)
    agg = batch_aggregates(p, o, sizes)
    start = 0
    for i, b in enumerate(sizes):
        sl = slice(start, start + b)
        start += b
        assert (agg.size[i], agg.sum_prompt[i], agg.max_output[i], agg.max_seq_len[i]) == (
            b, sum(p[sl]), max(o[sl]), max(p[sl] + o[sl]))


def test_references_broadcast_and_return_floats_for_scalars():
    m = DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-4)
    assert isinstance(m.service_time(4, max_output=50, sum_prompt=100), float)
    grid = m.service_time(np.arange(1, 5)[:, None], max_output=np.array([10.0, 20.0]), sum_prompt=0.0)
    assert grid.shape == (4, 2)
    assert isinstance(m.times(1, max_output=1, sum_prompt=0), BatchTimes)


def test_reference_errors_name_the_argument():
    m = CalibratedModel()
    with pytest.raises(TypeError, match=r"service_time needs size \(requests\), max_seq_len \(tokens\) \(or size, "
                                        r"prompt and output of uniform batches\); max_seq_len not given"):
        m.service_time(4)
    with pytest.raises(TypeError, match=r"times needs .*max_output \(tokens\) \(or .*\); max_output not given"):
        m.times(4, 100)
    with pytest.raises(ValueError, match=r"size must hold integers in \[1, inf\) \(requests\); got size\[1\] = 0"):
        m.service_time([3, 0], 100.0)
    with pytest.raises(TypeError, match=r"size must hold integers .*got floats"):
        m.service_time(4.0, 100.0)
    with pytest.raises(TypeError, match="size must be a real number"):
        m.service_time(True, 100.0)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[0, inf\) \(tokens\); got max_seq_len = -1.0"):
        m.service_time(4, -1.0)
    with pytest.raises(ValueError, match=r"max_seq_len must be finite \(tokens\); got max_seq_len\[0\] = nan"):
        m.service_time(4, [math.nan])
    with pytest.raises(ValueError, match=r"must be at least max_output; got 10.0 < 20.0 \(element 0\)"):
        m.times(4, 10.0, 20.0)
    with pytest.raises(TypeError, match="MaxModel.service_time needs max_output"):
        MaxModel().service_time(4)
    with pytest.raises(ValueError, match=r"sizes must sum to the 4 members .*got sum\(sizes\) = 5"):
        batch_aggregates(PROMPT, OUTPUT, [2, 3])
    with pytest.raises(ValueError, match=r"output must be in \[0, inf\) \(tokens\); got output\[1\] = -2.0"):
        batch_aggregates([1.0, 2.0], [3.0, -2.0])
