"""The kernels' raw draws (:mod:`mbbatch._kernels.bits`): PCG64DXSM's step
inlined, any other bit generator called, numpy's numbers and numpy's state
after them either way, and the inlined step found again by code loaded from
the disk cache in another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

from mbbatch._kernels.bits import inlined, next_double, next_uint64

GENERATORS = [np.random.PCG64DXSM, np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64]


@njit
def _mixed(bits, n):
    """n draws alternating 64 raw bits and a double."""
    raw = np.empty(n, np.uint64)
    dbl = np.empty(n)
    for i in range(n):
        raw[i] = next_uint64(bits)
        dbl[i] = next_double(bits)
    return raw, dbl


@njit
def _inlined(gen):
    return inlined(gen.bit_generator)


@pytest.mark.parametrize("kind", GENERATORS, ids=lambda k: k.__name__)
def test_raw_draws_are_the_bit_generators_own(kind):
    """next_uint64 and next_double interleaved are numpy's ``random_raw`` and
    ``Generator.random`` of the same bit generator, value for value, and leave
    its state where numpy's draws leave it (the draws after them agree); the
    step is inlined exactly for PCG64DXSM."""
    ours = np.random.Generator(kind(2024))
    theirs = np.random.Generator(kind(2024))
    raw, dbl = _mixed(ours.bit_generator, 500)
    for i in range(500):
        # (integers over the whole 64-bit range: one next_uint64 each)
        assert raw[i] == theirs.integers(0, 2 ** 64, dtype=np.uint64)
        assert dbl[i] == theirs.random()
    np.testing.assert_array_equal(ours.integers(0, 2 ** 64, 20, dtype=np.uint64),
                                  theirs.integers(0, 2 ** 64, 20, dtype=np.uint64))
    np.testing.assert_array_equal(ours.standard_normal(10), theirs.standard_normal(10))
    assert _inlined(ours) == (kind is np.random.PCG64DXSM)


_CACHED = textwrap.dedent("""
    import json, sys
    import numpy as np
    from numba import njit
    from mbbatch._kernels.bits import inlined, next_uint64

    @njit(cache=True)
    def probe(gen):
        return inlined(gen.bit_generator), next_uint64(gen.bit_generator)

    a = probe(np.random.Generator(np.random.PCG64DXSM(7)))
    b = probe(np.random.Generator(np.random.PCG64(7)))
    print(json.dumps({"dxsm": [bool(a[0]), int(a[1])], "pcg64": [bool(b[0]), int(b[1])],
                      "hits": sum(probe.stats.cache_hits.values())}))
""")


def test_code_loaded_from_the_disk_cache_finds_the_inlined_step(tmp_path):
    """The address of numpy's PCG64DXSM step is a symbol the JIT linker
    resolves in each process: a function compiled in one process and loaded
    from the disk cache in the next still takes the inlined step for
    PCG64DXSM only, and draws numpy's numbers."""
    (tmp_path / "probe.py").write_text(_CACHED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    runs = [json.loads(subprocess.run([sys.executable, str(tmp_path / "probe.py")], env=env, check=True,
                                      capture_output=True, text=True).stdout) for _ in range(2)]
    assert runs[0]["hits"] == 0 and runs[1]["hits"] > 0
    want_dxsm = int(np.random.PCG64DXSM(7).random_raw())
    want_pcg64 = int(np.random.PCG64(7).random_raw())
    for r in runs:
        assert r["dxsm"] == [True, want_dxsm] and r["pcg64"] == [False, want_pcg64]


_NEVER = textwrap.dedent("""
    import json
    import numpy as np
    from llvmlite import binding
    from numba import njit
    import mbbatch._kernels.bits as bits

    binding.add_symbol(bits.SYMBOL, bits._never())      # as on a numpy whose state the step cannot read

    @njit
    def probe(gen, n):
        out = np.empty(n, np.uint64)
        for i in range(n):
            out[i] = bits.next_uint64(gen.bit_generator)
        return bits.inlined(gen.bit_generator), out

    fast, got = probe(np.random.Generator(np.random.PCG64DXSM(7)), 100)
    print(json.dumps({"inlined": bool(fast), "equal": bool((got == np.random.PCG64DXSM(7).random_raw(100)).all())}))
""")


def test_a_numpy_whose_generator_state_the_step_cannot_read_is_called_instead(tmp_path):
    """On this numpy the step reads PCG64DXSM's state (its address is numpy's
    next_uint64); where it could not (a build storing the 128-bit state as
    two halves), the symbol resolves to a function no generator draws with:
    every draw is the generator's own call, numpy's numbers still."""
    import ctypes

    from mbbatch._kernels import bits

    assert bits.ADDRESS == ctypes.cast(np.random.PCG64DXSM().ctypes.next_uint64, ctypes.c_void_p).value
    (tmp_path / "never.py").write_text(_NEVER)
    out = subprocess.run([sys.executable, str(tmp_path / "never.py")], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout) == {"inlined": False, "equal": True}
