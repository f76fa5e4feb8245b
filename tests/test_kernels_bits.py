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


#: a child's probe, after it imports ``bits``: 100 raw draws through the kernels' step, whether it was
#: inlined (``fast``), and whether they are numpy's (``equal``)
_PROBE = textwrap.dedent("""
    import numpy as np
    from numba import njit

    @njit
    def probe(gen, n):
        out = np.empty(n, np.uint64)
        for i in range(n):
            out[i] = bits.next_uint64(gen.bit_generator)
        return bits.inlined(gen.bit_generator), out

    fast, got = probe(np.random.Generator(np.random.PCG64DXSM(7)), 100)
    equal = bool((got == np.random.PCG64DXSM(7).random_raw(100)).all())
""")

_NEVER = textwrap.dedent("""
    import json
    from llvmlite import binding
    import mbbatch._kernels.bits as bits

    binding.add_symbol(bits.SYMBOL, bits._never())      # as on a numpy whose state the step cannot read
""") + _PROBE + """print(json.dumps({"inlined": bool(fast), "equal": equal}))
"""


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


_SWITCH = textwrap.dedent("""
    import json
    import numpy as np
    from numba import njit
    from mbbatch._kernels import bits

    @njit(cache=True)
    def probe(gen, n):
        out = np.empty(n, np.uint64)
        dbl = np.empty(n)
        for i in range(n):
            out[i] = bits.next_uint64(gen.bit_generator)
            dbl[i] = bits.next_double(gen.bit_generator)
        return bits.inlined(gen.bit_generator), out, dbl

    fast, raw, dbl = probe(np.random.Generator(np.random.PCG64DXSM(7)), 100)
    want = np.random.Generator(np.random.PCG64DXSM(7))
    equal = all(r == want.integers(0, 2 ** 64, dtype=np.uint64) and d == want.random() for r, d in zip(raw, dbl))
    print(json.dumps({"enabled": bits.ENABLED, "inlined": bool(fast), "equal": bool(equal),
                      "hits": sum(probe.stats.cache_hits.values())}))
""")


@pytest.mark.heavy
def test_the_switch_turns_the_inlined_step_off_even_in_code_loaded_from_the_disk_cache(tmp_path):
    """MBBATCH_INLINE_DRAWS=0 (read at import) points the linker's symbol at
    a function no generator draws with: a function compiled with the step in
    one process and loaded from the disk cache in one with the switch off
    calls the generator instead, and draws numpy's numbers both times."""
    (tmp_path / "switch.py").write_text(_SWITCH)
    runs = []
    base = {k: v for k, v in os.environ.items() if k != "MBBATCH_INLINE_DRAWS"}
    for switch in ({}, {"MBBATCH_INLINE_DRAWS": "0"}):
        env = {**base, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), **switch}
        runs.append(json.loads(subprocess.run([sys.executable, str(tmp_path / "switch.py")], env=env, check=True,
                                              capture_output=True, text=True).stdout))
    assert runs == [{"enabled": True, "inlined": True, "equal": True, "hits": 0},
                    {"enabled": False, "inlined": False, "equal": True, "hits": 1}]


_RUN = textwrap.dedent("""
    import hashlib
    import scipy.stats as st
    import mbbatch as mb
    from mbbatch._kernels import bits

    res = mb.simulate(mb.MultiBinDynamic(bins=2, warmup=50), mb.Gamma(4.0, cv=2.0), n=2000, seed=3, keep_requests=True,
                      workload=mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64),
                                           predictor_sigma=0.5))
    digest = hashlib.sha256(res.requests.completion.tobytes()).hexdigest()
""")


def test_a_run_with_the_switch_off_is_the_same_run():
    """A token-level run (gamma arrivals, log-normal lengths and predictions,
    drawn in the kernels) in a process with MBBATCH_INLINE_DRAWS=0, every
    draw the generator's own call (its kernels loaded from the disk cache),
    completes every request at the same instant, to the bit."""
    here = {}
    exec(_RUN, here)
    assert here["bits"].ENABLED
    off = subprocess.run([sys.executable, "-c", _RUN + "print(bits.ENABLED, digest)"], check=True,
                         capture_output=True, text=True, env={**os.environ, "MBBATCH_INLINE_DRAWS": "0"})
    assert off.stdout.split() == ["False", here["digest"]]


@pytest.mark.heavy
def test_a_numpy_or_numba_newer_than_tested_draws_through_the_generator_with_a_warning(tmp_path):
    """TESTED names the newest numpy and numba the step is tested on (the
    versions these tests ran on when it was set); a newer one, here numba
    0.99 as it reports itself, warns at import and every draw is the
    generator's own call, numpy's numbers still; MBBATCH_INLINE_DRAWS=0
    silences it (test_a_run_with_the_switch_off_is_the_same_run runs it
    off), and MBBATCH_INLINE_DRAWS=1 takes the step anyway (to test it on a
    new version before raising TESTED)."""
    from mbbatch._kernels import bits

    assert bits.untested({"numpy": np.__version__, "numba": __import__("numba").__version__}) == [], (
        "this environment is newer than bits.TESTED: once these tests pass with the step on here, raise TESTED")
    assert bits.untested({"numpy": "2.5.0.dev0", "numba": "0.68.9"}) == ["numpy 2.5.0.dev0"]
    assert bits.untested({"numpy": "1.26.4", "numba": "0.60.0"}) == []
    code = textwrap.dedent("""
        import json, warnings
        import numba
        numba.__version__ = "0.99.0"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from mbbatch._kernels import bits
    """) + _PROBE + textwrap.dedent("""
        print(json.dumps({"warned": [str(w.message) for w in seen if w.category is bits.UntestedDrawsWarning],
                          "inlined": bool(fast), "equal": equal}))
    """)
    (tmp_path / "newer.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "MBBATCH_INLINE_DRAWS"}
    out = [json.loads(subprocess.run([sys.executable, str(tmp_path / "newer.py")], check=True, capture_output=True,
                                     text=True, env={**env, **switch}).stdout)
           for switch in ({}, {"MBBATCH_INLINE_DRAWS": "1"})]
    (warned,) = out[0]["warned"]
    assert "with numba 0.99.0" in warned and "tested up to numpy 2.4 and numba 0.68" in warned
    assert out[0]["inlined"] is False and out[0]["equal"] is True
    # (forced: the step taken, untested as the version says it is)
    assert out[1] == {"warned": [], "inlined": True, "equal": True}


def test_the_switch_and_the_version_check_decide_the_address(monkeypatch):
    """bits._address, in this process: switched off (MBBATCH_INLINE_DRAWS=0) the step is never
    taken and nothing warns, even on an untested numba; on an untested numba it warns and is not
    taken, unless forced (MBBATCH_INLINE_DRAWS=1); else numpy's PCG64DXSM next_uint64 is it."""
    import warnings

    import numba

    from mbbatch._kernels import bits

    never, dxsm = bits._never(), bits._dxsm_address()
    monkeypatch.setattr(numba, "__version__", "0.99.0")
    monkeypatch.setattr(bits, "ENABLED", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bits._address() == never
    monkeypatch.setattr(bits, "ENABLED", True)
    with pytest.warns(bits.UntestedDrawsWarning, match="with numba 0.99.0"):
        assert bits._address() == never
    monkeypatch.setattr(bits, "FORCED", True)
    assert bits._address() == dxsm
    monkeypatch.setattr(numba, "__version__", "0.68.1")
    monkeypatch.setattr(bits, "FORCED", False)
    assert bits._address() == dxsm
