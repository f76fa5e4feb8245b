"""Seeds: every random stream derives from one numpy SeedSequence.

A seed's streams are numpy ``Generator`` objects on ``PCG64DXSM``.

Stream ``i`` of a seed is the SeedSequence with the seed's entropy and spawn
key extended by ``i``; the indices are fixed forever, so adding a stream never
changes an existing one.  Never ``seed + i``, never global state.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STREAM_ARRIVALS", "STREAM_SERVICE", "STREAM_PROMPT", "STREAM_PREDICTION", "STREAM_PRESAMPLE",
           "STREAM_CLASS", "as_seed_sequence", "stream", "substream"]

#: the arrival gaps
STREAM_ARRIVALS = 0
#: the output lengths (the service times of the paper's model)
STREAM_SERVICE = 1
#: the prompt lengths
STREAM_PROMPT = 2
#: the output-length predictor's errors
STREAM_PREDICTION = 3
#: the pre-sample of predicted lengths that sets multi-bin dynamic batching's
#: edges before a run (``bin_edges="presample"``)
STREAM_PRESAMPLE = 4
#: the requests' classes (:class:`~mbbatch.workload.Mixture`); a class's
#: lengths come from its own stream of the prompt and output streams
#: (:func:`substream`)
STREAM_CLASS = 5
#: the requests' system prompts (:class:`~mbbatch.workload.SystemPrompts`): their lengths, which requests carry
#: one and which
STREAM_SYSTEM = 6

#: The bit generator of every stream.  PCG64DXSM is numpy's recommended
#: successor to PCG64 (stronger mixing for many parallel streams) and is also
#: the cheaper of the two per draw inside a numba kernel.
BIT_GENERATOR = np.random.PCG64DXSM


def as_seed_sequence(seed) -> np.random.SeedSequence:
    """``seed``: None (fresh OS entropy, recorded in the result), a non-negative
    int or sequence of ints, or a SeedSequence."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, (bool, np.bool_)) or isinstance(seed, (float, np.floating)):
        raise TypeError(f"seed must be None, a non-negative integer or a SeedSequence; got {seed!r}")
    try:
        return np.random.SeedSequence(seed)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"seed must be None, a non-negative integer or a SeedSequence; got {seed!r}") from None


def stream(ss: np.random.SeedSequence, index: int) -> np.random.Generator:
    """The Generator of stream ``index`` of ``ss`` (independent of ``ss``'s
    spawn count): ``Generator(PCG64DXSM(SeedSequence(entropy, spawn_key + (index,))))``."""
    child = np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, index), pool_size=ss.pool_size)
    return np.random.Generator(BIT_GENERATOR(child))


def substream(ss: np.random.SeedSequence, index: int, sub: int) -> np.random.Generator:
    """Stream ``sub`` of stream ``index`` of ``ss`` (a request class's part
    of the prompt or output stream): the spawn key extended by both."""
    return stream(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, index), pool_size=ss.pool_size), sub)


def entropy_str(ss: np.random.SeedSequence) -> str:
    """The seed as a string that reproduces it: entropy and spawn key."""
    key = ",".join(str(x) for x in ss.spawn_key)
    return f"{ss.entropy}" + (f"/{key}" if key else "")
