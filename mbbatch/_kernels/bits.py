"""A kernel's raw draws from a numpy bit generator, inlined for PCG64DXSM.

numba calls a bit generator through the function pointers numpy gives it
(``numba.np.random.generator_core``): a call that cannot be inlined for
every 64 bits.  Every stream of mbbatch is a ``PCG64DXSM`` (O'Neill, 2014,
"PCG: A family of simple fast space-efficient statistically good algorithms
for random number generation", HMC-CS-2014-0905; numpy's DXSM output and
cheap-multiplier step): :func:`next_uint64` and :func:`next_double` do its
step in the kernel, on the generator's own state, when the generator's
``next_uint64`` is numpy's PCG64DXSM's, and call the generator's functions
otherwise.  The numbers are numpy's, bit for bit, and the generator's state
after a run is the state numpy's own draws would leave, for any bit
generator.

The check compares the generator's function address with numpy's
PCG64DXSM ``next_uint64``, which this module gives the JIT linker under
:data:`SYMBOL` when it is imported, so that code compiled in one process and
loaded from the disk cache in another reads the address of its own process.
Before it does, it checks that this numpy holds the generator's state as
the step reads it (a native 128-bit state and increment); where not, the
symbol names a function no generator draws with, and every draw is the
generator's own call.

The same symbol turns the step off, so that code compiled with it and
loaded from the disk cache obeys the process that loads it:

- ``MBBATCH_INLINE_DRAWS=0`` in the environment (read at import; ``false``,
  ``no`` and ``off`` too) makes every draw the generator's own call;
- a numpy or numba newer than :data:`TESTED` (the newest the step is tested
  on: numpy 2.4 and numba 0.68, tests/test_kernels_bits.py) does too, with
  an :class:`UntestedDrawsWarning` at import, because the step reads
  numpy's private state through numba's model of a bit generator, and
  either may change.  ``MBBATCH_INLINE_DRAWS=0`` silences the warning;
  ``MBBATCH_INLINE_DRAWS=1`` (``true``, ``yes``, ``on``) takes the step
  anyway, to run the tests there before raising :data:`TESTED`.

The numbers are the same either way (numpy's); only their speed differs
(the inlined step is 5 to 8 % of a token-level run's time).
"""

from __future__ import annotations

import ctypes
import os
import re
import warnings

import numba
import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic, register_jitable
# (any other bit generator: called through its function pointers, as numba calls it)
from numba.np.random.generator_core import next_double as _called_double
from numba.np.random.generator_core import next_uint64 as _called_uint64

__all__ = ["SYMBOL", "TESTED", "ENABLED", "FORCED", "UntestedDrawsWarning", "inlined", "next_double", "next_uint64"]

#: the name under which the JIT linker knows numpy's PCG64DXSM next_uint64
SYMBOL = "mbbatch_pcg64dxsm_next_uint64"
#: the newest numpy and numba, (major, minor), the inlined step is tested on: a newer one's draws are the
#: generator's own calls (older ones, down to pyproject's minimum, take the step where the state check passes)
TESTED = {"numpy": (2, 4), "numba": (0, 68)}
#: the environment's switch, read once, at import: unset, the step where :data:`TESTED`; 0 (or false, no, off)
#: never; 1 (or true, yes, on) even on an untested numpy or numba (to test it there)
_SWITCH = os.environ.get("MBBATCH_INLINE_DRAWS", "").strip().lower()
ENABLED: bool = _SWITCH not in ("0", "false", "no", "off")
FORCED: bool = _SWITCH in ("1", "true", "yes", "on")
#: PCG's 64-bit "cheap multiplier" of its DXSM output and of the step
CHEAP_MULTIPLIER = 0xDA942042E4DD58B5
#: 2**-53: numpy's 53-bit double from the top of 64 bits
TWO_M53 = 1.0 / 9007199254740992.0


def _never() -> int:
    """The address of a function no bit generator draws with (the linker
    needs a symbol it can resolve; a null one it cannot)."""
    return ctypes.cast(ctypes.pythonapi.Py_IsInitialized, ctypes.c_void_p).value


def _dxsm_address() -> int:
    """The address of numpy's PCG64DXSM ``next_uint64``, or of
    :func:`_never` (the inlined step never taken) unless this numpy holds
    the generator's state as the step reads it: its ``pcg64_state``
    pointing first at the 128-bit state and increment, each a native
    little-endian 128-bit integer (a build with emulated 128-bit arithmetic
    stores each as two 64-bit halves, high first)."""
    bg = np.random.PCG64DXSM(20250101)
    want = bg.state["state"]
    pcg = ctypes.c_void_p.from_address(bg.ctypes.state_address).value
    words = (ctypes.c_uint64 * 4).from_address(pcg) if pcg else None
    if words is None or not np.little_endian:
        return _never()
    as_int = int.from_bytes(bytes(words), "little")
    if (as_int & ((1 << 128) - 1), as_int >> 128) != (want["state"], want["inc"]):
        return _never()
    return ctypes.cast(bg.ctypes.next_uint64, ctypes.c_void_p).value


class UntestedDrawsWarning(UserWarning):
    """numpy or numba is newer than the inlined step is tested on
    (:data:`TESTED`): every draw is the generator's own call."""


def untested(versions: dict) -> list:
    """The packages of ``versions`` (name: version string) newer than
    :data:`TESTED`, as ``"name version"``."""
    return [f"{name} {v}" for name, v in versions.items()
            if tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", v).groups()) > TESTED[name]]


def _address() -> int:
    """:func:`_dxsm_address`, unless the step is switched off
    (:data:`ENABLED`) or this numpy or numba is untested and the step not
    :data:`FORCED` (warned): then :func:`_never`'s."""
    if not ENABLED:
        return _never()
    newer = untested({"numpy": np.__version__, "numba": numba.__version__})
    if newer and not FORCED:
        tested = " and ".join(f"{name} {'.'.join(map(str, v))}" for name, v in TESTED.items())
        warnings.warn(f"mbbatch draws its random numbers through the bit generator's own calls with "
                      f"{', '.join(newer)}: its inlined PCG64DXSM step is tested up to {tested} (the numbers are "
                      "the same, a few per cent slower; MBBATCH_INLINE_DRAWS=0 chooses this and silences the "
                      "warning, MBBATCH_INLINE_DRAWS=1 takes the step anyway)", UntestedDrawsWarning, stacklevel=2)
        return _never()
    return _dxsm_address()


#: the address of the bit generators' next_uint64 the inlined step is taken for (:func:`_never`'s: none)
ADDRESS = _address()
binding.add_symbol(SYMBOL, ADDRESS)


def _dxsm_step(builder, state_addr):
    """PCG64DXSM's ``pcg_cm_random_r``: the output of the state at
    ``state_addr`` (numpy's ``pcg64_state``, whose first field points at
    the 128-bit state and increment), and the state stepped."""
    i64, i128 = ir.IntType(64), ir.IntType(128)
    pcg = builder.load(builder.inttoptr(state_addr, i64.as_pointer().as_pointer()))
    p = builder.bitcast(pcg, i128.as_pointer())
    state = builder.load(p, align=8)
    inc = builder.load(builder.gep(p, [ir.Constant(ir.IntType(32), 1)]), align=8)
    hi = builder.trunc(builder.lshr(state, ir.Constant(i128, 64)), i64)
    lo = builder.or_(builder.trunc(state, i64), ir.Constant(i64, 1))
    hi = builder.xor(hi, builder.lshr(hi, ir.Constant(i64, 32)))
    hi = builder.mul(hi, ir.Constant(i64, CHEAP_MULTIPLIER))
    hi = builder.xor(hi, builder.lshr(hi, ir.Constant(i64, 48)))
    hi = builder.mul(hi, lo)
    builder.store(builder.add(builder.mul(state, ir.Constant(i128, CHEAP_MULTIPLIER)), inc), p, align=8)
    return hi


def _is_dxsm(builder, proxy):
    """Whether the bit generator of ``proxy`` is a PCG64DXSM: its
    ``next_uint64`` is numpy's (the address the linker resolves :data:`SYMBOL` to)."""
    i64 = ir.IntType(64)
    dxsm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, (i64,)), SYMBOL)
    return builder.icmp_unsigned("==", proxy.fnptr_next_uint64, builder.ptrtoint(dxsm, i64))


@intrinsic
def inlined(tyctx, bits_t):
    """Whether the draws of ``bits`` (a bit generator) take the inlined PCG64DXSM step."""
    if not isinstance(bits_t, types.NumPyRandomBitGeneratorType):
        return None

    def codegen(ctx, builder, sig, args):
        return _is_dxsm(builder, cgutils.create_struct_proxy(bits_t)(ctx, builder, value=args[0]))

    return types.boolean(bits_t), codegen


@intrinsic
def _dxsm(tyctx, bits_t):
    """64 bits of ``bits`` (a PCG64DXSM: see :func:`inlined`) by its step, inlined."""
    if not isinstance(bits_t, types.NumPyRandomBitGeneratorType):
        return None

    def codegen(ctx, builder, sig, args):
        return _dxsm_step(builder, cgutils.create_struct_proxy(bits_t)(ctx, builder, value=args[0]).state)

    return types.uint64(bits_t), codegen


@register_jitable
def next_uint64(bits):
    """64 random bits of bit generator ``bits`` (numpy's ``next_uint64``)."""
    if inlined(bits):
        return _dxsm(bits)
    return _called_uint64(bits)


@register_jitable
def next_double(bits):
    """A uniform double in [0, 1) of bit generator ``bits`` (numpy's
    ``next_double``: for PCG64DXSM the top 53 of its 64 bits)."""
    if inlined(bits):
        return np.float64(_dxsm(bits) >> np.uint64(11)) * TWO_M53
    return _called_double(bits)
