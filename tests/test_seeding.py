"""Seeds (mbbatch._seeding): streams by fixed index, never seed + i."""

import numpy as np

from mbbatch._seeding import (BIT_GENERATOR, STREAM_ARRIVALS, STREAM_PREDICTION, STREAM_PROMPT, STREAM_SERVICE,
                              as_seed_sequence, entropy_str, stream)


def test_streams_are_fixed_independent_children():
    ss = as_seed_sequence(7)
    assert (STREAM_ARRIVALS, STREAM_SERVICE, STREAM_PROMPT, STREAM_PREDICTION) == (0, 1, 2, 3)
    a, b = stream(ss, 0).random(4), stream(ss, 1).random(4)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, stream(as_seed_sequence(7), 0).random(4))
    assert isinstance(stream(ss, 0).bit_generator, BIT_GENERATOR)
    # seed 8's stream 0 is not seed 7's stream 1
    assert not np.array_equal(stream(as_seed_sequence(8), 0).random(4), b)


def test_fresh_entropy_is_recorded():
    ss = as_seed_sequence(None)
    assert entropy_str(ss) == str(ss.entropy)
    assert entropy_str(as_seed_sequence(5)) == "5"
