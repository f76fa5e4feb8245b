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
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic, register_jitable

__all__ = ["SYMBOL", "inlined", "next_double", "next_uint64"]

#: the name under which the JIT linker knows numpy's PCG64DXSM next_uint64
SYMBOL = "mbbatch_pcg64dxsm_next_uint64"
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


#: the address of the bit generators' next_uint64 the inlined step is taken for
ADDRESS = _dxsm_address()
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


def _call(builder, addr, state, ret, name):
    """The generator's own function at ``addr`` on its ``state``."""
    fnty = ir.FunctionType(ret, (state.type,))
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(builder.bitcast(builder.inttoptr(addr, ir.IntType(8).as_pointer()), fn.type), (state,))


@intrinsic
def _raw(tyctx, bits_t, as_double_t):
    """64 raw bits of ``bits`` (a bit generator) as an integer, or, with
    ``as_double`` (a literal), the generator's double: PCG64DXSM's inlined
    (the double from the top 53 bits, as numpy's), another's called."""
    if not isinstance(bits_t, types.NumPyRandomBitGeneratorType) or not isinstance(as_double_t, types.BooleanLiteral):
        return None
    as_double = as_double_t.literal_value
    ret_t = types.float64 if as_double else types.uint64

    def codegen(ctx, builder, sig, args):
        proxy = cgutils.create_struct_proxy(bits_t)(ctx, builder, value=args[0])
        i64 = ir.IntType(64)
        ll_ret = ctx.get_value_type(ret_t)
        with builder.if_else(_is_dxsm(builder, proxy), likely=True) as (then, otherwise):
            with then:
                x = _dxsm_step(builder, proxy.state)
                if as_double:
                    x = builder.fmul(builder.uitofp(builder.lshr(x, ir.Constant(i64, 11)), ll_ret),
                                     ir.Constant(ll_ret, TWO_M53))
                bb_fast = builder.basic_block
            with otherwise:
                y = _call(builder, proxy.fnptr_next_double if as_double else proxy.fnptr_next_uint64, proxy.state,
                          ll_ret, "next_double" if as_double else "next_uint64")
                bb_slow = builder.basic_block
        out = builder.phi(ll_ret)
        out.add_incoming(x, bb_fast)
        out.add_incoming(y, bb_slow)
        return out

    return ret_t(bits_t, as_double_t), codegen


@register_jitable
def next_uint64(bits):
    """64 random bits of bit generator ``bits`` (numpy's ``next_uint64``)."""
    return _raw(bits, False)


@register_jitable
def next_double(bits):
    """A uniform double in [0, 1) of bit generator ``bits`` (numpy's
    ``next_double``)."""
    return _raw(bits, True)
