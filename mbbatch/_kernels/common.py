"""Kernel parts shared by the five kernels (multi-bin, event, LAPS,
continuous-batching and its cluster driver) and their helper modules: the
codes of the arrival processes and length distributions, the blocks of
random draws, whole-token rounding, the log-linear latency histogram, and
the decorators of kernels and their helpers.

Kernels allocate nothing (Python hands them every array), so they run without
numba's reference counting (``_nrt=False``): with it, every array passed to a
helper would cost an atomic increment and decrement per call, more than an
event loop's own work, and seconds of compile time for the code that counts.
A kernel's helpers are compiled on their own, once (numba's
``inline="always"`` would copy a helper's code into every caller before
typing, which costs seconds of compile time too):

- :data:`step`: a step of an event loop, inlined by LLVM at every call
  (``forceinline``), so that it costs nothing at run time;
- :data:`subroutine`: called once per block of requests, left to LLVM.

Neither can be called from Python (no wrappers: less to compile).

The random draws of a block (arrival times, lengths, predictions) are
compiled per kind, apart from the kernels, and called by address
(:func:`drawers`): a kernel compiles once for every kind, and a run compiles
only the kinds it uses.  So is a batch formation rule's step that reorders a
queue (:func:`compiled_apart`, :func:`by_address`; shortest-predicted-first's,
:mod:`.spf`).
"""

from __future__ import annotations

import math
import os
import threading
import types as pytypes

import numpy as np
from llvmlite import ir
from numba import cfunc, njit, types
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload
# numpy's ziggurat tables (as numba holds them) and the bit generator's raw
# draws (inlined for PCG64DXSM: .bits): the distributions are drawn below, by
# numpy's algorithms (so numpy's numbers), written once each.  numba's own
# ``random_standard_*`` compile once per caller's flags and take a
# mispredicted branch per normal draw.
from numba.np.random._constants import (
    fe_double, fi_double, ke_double, ki_double, we_double, wi_double, ziggurat_exp_r, ziggurat_nor_inv_r,
    ziggurat_nor_r,
)

from .bits import next_double, next_uint64

#: numba's disk cache: on unless the environment says MBBATCH_NUMBA_CACHE=0
#: (see the package's docstring)
CACHE: bool = os.environ.get("MBBATCH_NUMBA_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")

# arrival kinds
ARR_POISSON = 0
ARR_SATURATED = 1
ARR_REPLAY = 2
ARR_PIECEWISE = 3   # Poisson with a piecewise-constant rate: params = rates, ends = change times
ARR_GAMMA = 4       # renewal, Gamma(shape, scale) gaps: params = (shape, scale)
ARR_ONOFF = 5       # two-state MMPP: params = (rate_on, rate_off, mean_on, mean_off)

# service (or length) kinds: the draw is loc + scale * X with X from the table
# below, params = (loc, scale, shape)
SVC_UNIFORM = 0      # X ~ U[0, 1)
SVC_EXPON = 1        # X ~ Exp(1)
SVC_LOGNORM = 2      # X = exp(s Z), shape = s
SVC_GAMMA = 3        # X ~ Gamma(a, 1), shape = a
SVC_WEIBULL_MIN = 4  # X ~ Weibull(c), shape = c
SVC_REPLAY = 5       # values given in an array, in order
SVC_EMPIRICAL = 6    # values drawn uniformly, with replacement, from an array

# predictor kinds: what a request is binned by (it is served for its true length)
PRED_ORACLE = 0      # the true value
PRED_LOGNORMAL = 1   # true x exp(sigma Z), Z from the prediction stream: param = sigma
PRED_CONFUSION = 2   # the true bin with probability p, else a neighbour (each side alike): param = p
PRED_REPLAY = 3      # given values, in request order

#: a kernel's ``stop`` array (int64): ``stop[STOP]`` nonzero asks it to return
#: at its next check (the caller's Ctrl-C); at each check it writes to
#: ``stop[ARRIVED]`` how many requests have arrived so far (the caller's progress)
STOP, ARRIVED = 0, 1
STOP_SIZE = 2


def check_stop(stop) -> None:
    """Refuse a ``stop`` array the kernels cannot use (they write to it without bounds checks)."""
    if not (isinstance(stop, np.ndarray) and stop.dtype == np.int64 and stop.shape == (STOP_SIZE,)):
        raise TypeError(f"stop must be an int64 array of shape ({STOP_SIZE},) (common.STOP, common.ARRIVED); "
                        f"got {stop!r}")

#: requests drawn per block: random numbers are drawn in tight loops, one
#: stream at a time, then the block is processed without calls in its loop
BLOCK = 1024

# latency histogram: log-linear buckets on the float64 bit pattern (HDR-style).
# HIST_SUB_BITS mantissa bits per octave give buckets of relative width
# 2**-HIST_SUB_BITS; quantiles read off bucket midpoints are within half that.
HIST_SUB_BITS = 10
HIST_MIN_EXP = -30   # 2**-30 s ~ 1 ns: smaller latencies land in bucket 0
HIST_MAX_EXP = 50    # 2**50 s: larger latencies land in the last bucket
HIST_SIZE = (HIST_MAX_EXP - HIST_MIN_EXP) << HIST_SUB_BITS
HIST_SHIFT = 52 - HIST_SUB_BITS                    # 52 mantissa bits in a float64
HIST_BASE = (1023 + HIST_MIN_EXP) << HIST_SUB_BITS  # 1023: the float64 exponent bias


#: a kernel: called from Python, runs without the GIL (see mbbatch._running)
kernel = njit(cache=CACHE, nogil=True, no_cfunc_wrapper=True, _nrt=False)
#: a step of an event loop: compiled once, inlined by LLVM wherever it is called
step = njit(cache=CACHE, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True, _nrt=False)
#: a stage's step in a driver of several stages (a closed loop's prefill
#: stage: :mod:`.disaggregated`), inlined by numba into the driver's own
#: code before it is compiled, so that the stage's namedtuple is read field
#: by field where the step reads it.  (Inlined by LLVM, as a ``step``, the
#: closed-loop driver of continuous prefill engines ran about 4 % slower
#: than the loop written out; inlined so, about 2.5 %.)
stage_step = njit(cache=CACHE, inline="always", no_cpython_wrapper=True, no_cfunc_wrapper=True, _nrt=False)
#: a helper called once per block of requests.  (It keeps the C wrapper: its
#: flags are then those numba compiles the random draws with, so it compiles
#: each of them once, not once per set of flags.)
subroutine = njit(cache=CACHE, no_cpython_wrapper=True, _nrt=False)


def variant(decorator, fn, name: str, module: str | None = None, **constants):
    """Kernel ``fn`` (a numba dispatcher) compiled again by ``decorator``,
    as ``name`` (of ``module``: default ``fn``'s; the module whose disk
    caches are flushed with it, :func:`mbbatch._kernels._drop_stale_caches`),
    with the module globals ``constants`` set to other values.
    numba reads a global as a constant when it compiles, and LLVM drops the
    code a constant condition never runs, so a variant with a feature off
    pays nothing for it: neither its branches nor the registers its values
    held in the loop.  Named apart because numba names a function's disk
    cache after its qualified name (two variants under one name would load
    each other's code)."""
    py = fn.py_func
    glob = dict(py.__globals__)
    unknown = sorted(set(constants) - set(glob))
    if unknown:
        raise ValueError(f"variant: {py.__qualname__} has no global {unknown}")
    glob.update(constants)
    copy = pytypes.FunctionType(py.__code__, glob, name, py.__defaults__, py.__closure__)
    copy.__qualname__ = name
    copy.__module__ = module or py.__module__
    copy.__doc__ = py.__doc__
    return decorator(copy)


def event_arrays(events) -> tuple:
    """The engine events a kernel takes, ``(times, engines, add)`` as
    contiguous float64, int64 and int8 arrays (None, or none given: three
    empty arrays)."""
    if events is None or len(events[0]) == 0:
        return (np.empty(0), np.empty(0, np.int64), np.empty(0, np.int8))
    return tuple(np.ascontiguousarray(a, t) for a, t in zip(events, (float, np.int64, np.int8)))


def load_tuple(vector, size):
    """The tuple of ``vector``'s first ``size`` values (``size`` a
    compile-time constant), each read by a load of its own.  numba's
    ``to_fixed_tuple`` builds its tuple an item at a time, copying the
    whole tuple through memory at each (quadratic in ``size``: about
    0.4 us for an engine's 29 counters, paid each time a cluster resumes
    an engine)."""
    return tuple(vector[:size])


@overload(load_tuple, jit_options={"forceinline": True, "_nrt": False})
def _load_tuple(vector, size):
    if not isinstance(size, types.IntegerLiteral):
        raise TypingError("load_tuple: size must be a compile-time constant")
    k = size.literal_value
    src = f"def impl(vector, size):\n    return ({''.join(f'vector[{j}], ' for j in range(k))})\n"
    ns = {}
    exec(src, ns)
    return ns["impl"]


@intrinsic
def float_bits(typingctx, x):
    """The IEEE-754 bit pattern of a float64 as an int64, in a register."""
    if isinstance(x, types.Float) and x.bitwidth == 64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(x), codegen
    return None


@njit(cache=CACHE, forceinline=True)
def hist_bucket(x):
    """The histogram bucket of a latency x >= 0: its exponent and top
    HIST_SUB_BITS mantissa bits, clipped to the histogram."""
    h = (float_bits(x) >> HIST_SHIFT) - HIST_BASE
    return np.uint64(0 if h < 0 else (h if h < HIST_SIZE else HIST_SIZE - 1))


@step
def blocks(tokens, bs, sh):
    """Blocks of ``bs`` tokens that hold ``tokens`` (``sh``: log2 of ``bs``
    when a power of two, a shift for the division; else -1)."""
    return (tokens + bs - 1) >> sh if sh >= 0 else (tokens + bs - 1) // bs


@step
def arrival_group(r, groups, n, scale):
    """The batch-means group of request ``r`` (in arrival order) among ``n``
    in ``groups`` groups, ``r * groups // n``, without an integer division:
    ``scale = groups / n`` (float) gives it to within one, and an integer
    comparison on each side makes it exact."""
    g = np.int64(r * scale)
    x = r * groups
    if (g + 1) * n <= x:
        g += 1
    elif g * n > x:
        g -= 1
    return g


#: a helper called from Python on a run's outputs: it holds the GIL (a
#: release and a retake cost more than its work while another thread of
#: the process holds the interpreter)
helper = njit(cache=CACHE, no_cfunc_wrapper=True, _nrt=False)


@helper
def draw_classes(gen, edges, klass, counts):
    """Each request's class by inversion of one uniform draw of ``gen`` (its
    ``random()``, in request order): the number of ``edges`` (the shares'
    cumulative sums but the last) at or below it, into ``klass`` (as floats,
    the engines' input); each class's requests counted into ``counts``.
    One pass, and no array of the draws."""
    bits = gen.bit_generator
    for i in range(klass.shape[0]):
        u = next_double(bits)
        c = 0
        for e in range(edges.shape[0]):
            if u >= edges[e]:
                c += 1
        klass[i] = c
        counts[c] += 1


@helper
def scatter_class(klass, c, a, b, out_a, out_b):
    """Class ``c``'s values ``a`` and ``b`` (its requests', in request order)
    into ``out_a`` and ``out_b`` at its requests' places in ``klass``."""
    k = 0
    for i in range(klass.shape[0]):
        if klass[i] == c:
            out_a[i] = a[k]
            out_b[i] = b[k]
            k += 1


@helper
def draw_mixture(klass, counts, fns_a, params_a, values_a, gens_a, fns_b, params_b, values_b, gens_b, integer,
                 blk_a, blk_b, at, out_a, out_b):
    """Every class's lengths of two streams straight into ``out_a`` and
    ``out_b`` at its requests' places in ``klass``, in one pass: class c's
    (its ``counts[c]`` requests', in request order) are the draws
    :func:`draw_lengths` would give them from its own generators
    ``gens_a[c]`` and ``gens_b[c]`` (by the length drawers at ``fns_a[c]``
    and ``fns_b[c]`` with its ``params`` and ``values``, whole tokens where
    ``integer``), a block of :data:`BLOCK` of each drawn into row c of
    ``blk_a`` and ``blk_b`` as its last is used up (``at``, zeros of 3 rows
    by class: each class's lengths drawn, of its block used, and its
    block's size).  No array of a class's own, and no pass a class."""
    drawn, used, size = at[0], at[1], at[2]
    for i in range(klass.shape[0]):
        c = np.int64(klass[i])
        if used[c] == size[c]:
            m = min(BLOCK, counts[c] - drawn[c])
            a, b = blk_a[c, :m], blk_b[c, :m]
            draw_block(fns_a[c], params_a[c], values_a[c], drawn[c], m, gens_a[c], a)
            round_lengths(a, m, integer)
            draw_block(fns_b[c], params_b[c], values_b[c], drawn[c], m, gens_b[c], b)
            round_lengths(b, m, integer)
            drawn[c] += m
            used[c] = 0
            size[c] = m
        out_a[i] = blk_a[c, used[c]]
        out_b[i] = blk_b[c, used[c]]
        used[c] += 1


@helper
def hist_ranks(hist, qs, out):
    """For each quantile ``qs[j]`` (ascending), the first bucket of ``hist``
    whose cumulative count reaches the rank ``max(1, ceil(qs[j] * total))``
    into ``out[j]`` (-1 for an empty histogram); returns the total.  One
    pass, up to the last rank's bucket.  (Plain comparisons rather than
    ``max``, which numba takes twice as long to compile.)"""
    total = 0
    for h in range(hist.shape[0]):
        total += hist[h]
    if total == 0:
        for j in range(qs.shape[0]):
            out[j] = -1
        return total
    j = 0
    rank = math.ceil(qs[0] * total)
    if rank < 1:
        rank = 1
    c = 0
    for h in range(hist.shape[0]):
        c += hist[h]
        while c >= rank:
            out[j] = h
            j += 1
            if j == qs.shape[0]:
                return total
            rank = math.ceil(qs[j] * total)
            if rank < 1:
                rank = 1
    return total


U8 = np.uint64(8)
U9 = np.uint64(9)
ONE = np.uint64(1)
MASK8 = np.uint64(0xFF)
MASK52 = np.uint64(0x000FFFFFFFFFFFFF)


@step
def standard_normal(bits):
    """A standard normal draw: numpy's ziggurat line for line (the same
    draws, the same values; numba's ``random_standard_normal`` copies it),
    written for speed.  The sign is applied without a branch on the fast path
    (multiplying by +-1.0 is exact): a branch on a random bit mispredicts
    half the time, which made numba's version 9 ns a draw against 4 ns here.
    The integer mantissa goes to float64 as a signed integer (it is below
    2**52), one instruction rather than the unsigned conversion's several."""
    while True:
        r = next_uint64(bits)
        idx = np.int64(r & MASK8)
        neg = (r >> U8) & ONE
        rabs = np.int64((r >> U9) & MASK52)
        x = np.float64(rabs) * wi_double[idx]
        if rabs < np.int64(ki_double[idx]):
            return x * (1.0 - 2.0 * np.float64(neg))
        if neg:
            x = -x
        if idx == 0:
            while True:
                xx = -ziggurat_nor_inv_r * np.log1p(-next_double(bits))
                yy = -np.log1p(-next_double(bits))
                if yy + yy > xx * xx:
                    if (rabs >> 8) & 1:
                        return -(ziggurat_nor_r + xx)
                    return ziggurat_nor_r + xx
        elif (fi_double[idx - 1] - fi_double[idx]) * next_double(bits) + fi_double[idx] < np.exp(-0.5 * x * x):
            return x


@step
def standard_exponential(bits):
    """A standard exponential draw: numpy's ziggurat line for line (the
    same draws, the same values), with the signed conversion of
    :func:`standard_normal`."""
    while True:
        ri = next_uint64(bits) >> np.uint64(3)
        idx = np.int64(ri & MASK8)
        ri = np.int64(ri >> U8)
        x = np.float64(ri) * we_double[idx]
        if ri < np.int64(ke_double[idx]):
            return x
        if idx == 0:
            return ziggurat_exp_r - np.log1p(-next_double(bits))
        if (fe_double[idx - 1] - fe_double[idx]) * next_double(bits) + fe_double[idx] < np.exp(-x):
            return x


@step
def gamma_constants(shape):
    """``(b, c, inv)`` of :func:`standard_gamma` for ``shape``: Marsaglia and
    Tsang's ``b = a - 1/3`` and ``c = 1 / sqrt(9 b)`` for ``a = shape`` (``shape
    + 1`` below 1), and ``1 / shape``, computed once per block of draws."""
    a = shape + 1.0 if shape < 1.0 else shape
    b = a - 1.0 / 3.0
    return b, 1.0 / math.sqrt(9.0 * b), (1.0 / shape if shape != 0.0 else math.inf)


@step
def marsaglia_tsang(bits, b, c, recycle):
    """A Gamma(b + 1/3, 1) draw (shape at least 1) by Marsaglia and Tsang's
    method, line for line numpy's (the same draws, the same values), with its
    constants ``b`` and ``c`` computed by the caller once, not per draw.

    Returns ``(draw, w)``.  With ``recycle``, w is a uniform on (0, 1]
    independent of the draw, for :func:`standard_gamma`: when the squeeze
    accepts (u < s(x)), u / s is uniform on [0, 1) and independent of x, so
    1 - u / s is recycled; when the log test accepts (a few draws in a
    hundred) w is drawn afresh.  Either way w is independent of x, and so of
    the draw.  Without ``recycle`` w is 0 and nothing more is drawn."""
    while True:
        while True:
            x = standard_normal(bits)
            v = 1.0 + c * x
            if v > 0.0:
                break
        v = v * v * v
        u = next_double(bits)
        s = 1.0 - 0.0331 * (x * x) * (x * x)
        if u < s:
            return b * v, (1.0 - u / s if recycle else 0.0)
        if math.log(u) < 0.5 * x * x + b * (1.0 - v + math.log(v)):
            return b * v, (1.0 - next_double(bits) if recycle else 0.0)


#: how gamma arrival gaps are drawn (:func:`standard_gamma`), as a sweep
#: store of gamma arrivals records it: a store drawn another way is not
#: resumed (the points still to compute would be drawn differently from
#: those it holds).  Stores without it drew every shape below 1 by exp.
GAMMA_GAPS = ("Marsaglia-Tsang at shape a + 1 times U^(1/a): a product with the test's recycled uniform "
              "when 1/a is within 4 ulps of an integer from 2 to 1024, else exp(-E/a)")

#: float64's machine epsilon
EPS = float(np.finfo(np.float64).eps)
#: the largest integer 1/shape whose U^(1/shape) :func:`standard_gamma` takes
#: as a product (a CV of 32): the products' rounding errors grow as k ulps
#: (2e-13 relative at 1024), and larger powers underflow for most U anyway
MAX_POWER = 1024


@step
def integer_inverse(inv):
    """``1/shape`` as an int64 when it is an integer k from 2 to
    :data:`MAX_POWER` to within 4 ulps, else 0: the power by which
    :func:`standard_gamma` takes U^(1/shape).  The tolerance takes every cv
    whose square is an integer (up to 32): float64 rounds 1/(1/cv**2) off
    the integer for cv = 7, 14, 28, 29, 31, sqrt(2) and sqrt(3), by an ulp."""
    if not 1.5 <= inv <= MAX_POWER + 0.5:
        return np.int64(0)   # (inf and NaN too, before they reach an integer conversion)
    k = math.floor(inv + 0.5)
    if abs(inv - k) <= 4.0 * EPS * k:
        return np.int64(k)
    return np.int64(0)


@step
def power(x, k):
    """``x ** k`` for an integer k >= 1 by repeated squaring: IEEE products,
    the same on every machine (no libm), within 2k ulps of x**k."""
    r = 1.0
    while True:
        if k & 1:
            r *= x
        k >>= 1
        if k == 0:
            return r
        x *= x


@step
def standard_gamma(bits, shape, b, c, inv, k):
    """A Gamma(shape, 1) draw (``b, c, inv = gamma_constants(shape)``, ``k =
    integer_inverse(inv)``): the exponential at shape 1 and Marsaglia-Tsang
    above it, as numpy draws them; below 1 by Stuart's theorem, Gamma(a) =
    Gamma(a + 1) U^(1/a), U uniform on (0, 1] independent of Gamma(a + 1).
    When 1/a is an integer k (cv**2 = 2, 3, 4, ...), U^k is a product, with
    U recycled from Marsaglia-Tsang's test: 15 ns a draw at a = 1/4 against
    24 ns by exp(-E / a), E ~ Exp(1), the way other shapes below 1 are
    drawn.  numba's own sampler takes 100 ns at a = 1/4 and 30 ns at a = 4
    (a rejection sampler below 1, its constants recomputed at every draw)."""
    if shape == 1.0:
        return standard_exponential(bits)
    if k > 0:
        g, w = marsaglia_tsang(bits, b, c, True)
        return g * power(w, k)
    g, _ = marsaglia_tsang(bits, b, c, False)
    if shape < 1.0:
        g *= math.exp(-standard_exponential(bits) * inv)
    return g


@step
def numpy_gamma(bits, shape, b, c, inv):
    """A Gamma(shape, 1) draw by numpy's own algorithm, line for line (the
    same draws, the same values as ``Generator.standard_gamma``), with the
    constants of ``gamma_constants(shape)`` computed once per block: the
    exponential at shape 1, 0 at shape 0, Marsaglia-Tsang above 1, and
    below 1 numpy's rejection sampler (two ``pow`` per draw, which is why
    :func:`standard_gamma` draws arrival gaps another way)."""
    if shape == 1.0:
        return standard_exponential(bits)
    if shape == 0.0:
        return 0.0
    if shape > 1.0:
        return marsaglia_tsang(bits, b, c, False)[0]
    while True:
        u = next_double(bits)
        v = standard_exponential(bits)
        if u <= 1.0 - shape:
            x = pow(u, inv)
            if x <= v:
                return x
        else:
            y = -np.log((1 - u) / shape)
            x = pow(1.0 - shape + shape * y, inv)
            if x <= v + y:
                return x


# --- the draws, compiled per kind -------------------------------------------------
#
# A kernel draws its requests a block at a time through three drawers: the
# arrival process, a length (or service) distribution, the predictor.  Each
# is compiled for one kind at a time, when a run first uses that kind, and
# called by address: a kernel compiles none of the kinds it does not use
# (a Poisson run compiles no gamma, ON/OFF or replay code), and compiles
# once for all of them.  ``kind`` is a constant of each compiled drawer
# (numba prunes the other kinds' branches before typing), and a call costs
# one indirect call per block of requests.

#: numba types of the drawers' arguments: the kernels' input arrays
#: (read-only), their blocks, and a numpy Generator
_IN = types.Array(types.float64, 1, "C", readonly=True)
_OUT = types.Array(types.float64, 1, "C")
_GEN = types.NumPyRandomGeneratorType("NumPyRandomGeneratorType")
#: (t, inv_rate, arrival_times, i0, m, gen, out, params, ends, seg, t_switch) -> (t, seg, t_switch)
ARRIVALS_SIG = types.Tuple((types.float64, types.int64, types.float64))(
    types.float64, types.float64, _IN, types.int64, types.int64, _GEN, _OUT, _IN, _IN, types.int64, types.float64)
#: (params, values, i0, m, gen, out) -> None
LENGTHS_SIG = types.void(_IN, _IN, types.int64, types.int64, _GEN, _OUT)
#: (sigma, values, i0, m, gen, true, out) -> None
PREDICT_SIG = types.void(types.float64, _IN, types.int64, types.int64, _GEN, _OUT, _OUT)

#: the kinds each drawer is compiled for
ARRIVAL_KINDS = (ARR_POISSON, ARR_SATURATED, ARR_REPLAY, ARR_PIECEWISE, ARR_GAMMA, ARR_ONOFF)
LENGTH_KINDS = (SVC_UNIFORM, SVC_EXPON, SVC_LOGNORM, SVC_GAMMA, SVC_WEIBULL_MIN, SVC_REPLAY, SVC_EMPIRICAL)
PREDICT_KINDS = (PRED_ORACLE, PRED_LOGNORMAL, PRED_CONFUSION, PRED_REPLAY)


def by_address(sig, name):
    """An intrinsic ``call(fn, args)``: calls the function compiled for
    ``sig`` (a drawer, or any function :func:`compiled_apart`) at address
    ``fn`` with the tuple ``args``.  Scalars are converted to the function's
    types; arrays must match its dtype, dimensions and layout (a read-only
    array passes for a writable one: numba stores both alike)."""

    @intrinsic
    def call(typingctx, fn, args):
        if not isinstance(fn, types.Integer) or not isinstance(args, types.BaseTuple) \
                or len(args) != len(sig.args):
            raise TypingError(f"{name}(fn, args): an address and a tuple of {len(sig.args)} arguments")
        for k, (have, want) in enumerate(zip(args.types, sig.args)):
            if isinstance(want, types.Array):
                ok = isinstance(have, types.Array) and (have.dtype, have.ndim, have.layout) == (
                    want.dtype, want.ndim, want.layout)
            else:
                ok = have == want or (isinstance(want, types.Number) and isinstance(have, (types.Number,
                                                                                       types.Boolean)))
            if not ok:
                raise TypingError(f"{name}: argument {k} is {have}; the function takes {want}")

        def codegen(context, builder, signature, llargs):
            fnty = ir.FunctionType(context.get_value_type(sig.return_type),
                                   [context.get_value_type(t) for t in sig.args])
            ptr = builder.inttoptr(llargs[0], fnty.as_pointer())
            vals = []
            for k, (have, want) in enumerate(zip(args.types, sig.args)):
                v = builder.extract_value(llargs[1], k)
                vals.append(v if isinstance(want, types.Array) or have == want
                            else context.cast(builder, v, have, want))
            return builder.call(ptr, vals)

        return sig.return_type(fn, args), codegen

    return call


_call_arrivals = by_address(ARRIVALS_SIG, "draw_arrivals")
_call_lengths = by_address(LENGTHS_SIG, "draw_block")
_call_predict = by_address(PREDICT_SIG, "predict")


def _arrivals_py(kind):
    """The arrival drawer of ``kind``, as Python (see :func:`drawers`)."""

    def arrivals(t, inv_rate, arrival_times, i0, m, gen, out, params, ends, seg, t_switch):
        um = np.uint64(m)
        bits = gen.bit_generator
        if kind == ARR_POISSON:
            for j in range(um):
                t += standard_exponential(bits) * inv_rate
                out[j] = t
        elif kind == ARR_GAMMA:
            shape = params[0]
            scale = params[1]
            b, c, inv = gamma_constants(shape)
            k = integer_inverse(inv)
            for j in range(um):
                t += standard_gamma(bits, shape, b, c, inv, k) * scale
                out[j] = t
        elif kind == ARR_ONOFF:
            if t_switch < 0.0:
                # the stationary state, and (memoryless) a whole sojourn from t
                seg = np.int64(0) if next_double(bits) * (params[2] + params[3]) < params[2] else np.int64(1)
                t_switch = t + standard_exponential(bits) * params[2 + seg]
            for j in range(um):
                # exact: memorylessness lets a gap that crosses a change of state
                # restart at the change, at the new state's rate
                while True:
                    r = params[seg]
                    if r > 0.0:
                        nt = t + standard_exponential(bits) / r
                        if nt <= t_switch:
                            t = nt
                            break
                    t = t_switch
                    seg = 1 - seg
                    t_switch = t + standard_exponential(bits) * params[2 + seg]
                out[j] = t
        elif kind == ARR_PIECEWISE:
            for j in range(um):
                # exact piecewise-constant Poisson: memorylessness lets a gap
                # that crosses a rate change restart at the change
                while True:
                    nt = t + standard_exponential(bits) / params[seg]
                    if nt <= ends[seg] or seg == params.shape[0] - 1:
                        t = nt
                        break
                    t = ends[seg]
                    seg += 1
                out[j] = t
        elif kind == ARR_REPLAY:
            # request i is time i % size of copy i // size, shifted by (i // size) * period (params[0])
            size = arrival_times.shape[0]
            r = i0 % size
            c = i0 // size
            shift = c * params[0]
            for j in range(um):
                out[j] = arrival_times[r] if c == 0 else arrival_times[r] + shift
                r += 1
                if r == size:
                    r = 0
                    c += 1
                    shift = c * params[0]
        else:
            for j in range(um):
                out[j] = 0.0
        return t, seg, t_switch

    return arrivals


def _lengths_py(kind):
    """The length drawer of ``kind``, as Python (see :func:`drawers`)."""

    def lengths(params, values, i0, m, gen, out):
        um = np.uint64(m)
        loc = params[0]
        scale = params[1]
        bits = gen.bit_generator
        if kind == SVC_UNIFORM:
            for j in range(um):
                out[j] = loc + scale * next_double(bits)
        elif kind == SVC_EXPON:
            for j in range(um):
                out[j] = loc + scale * standard_exponential(bits)
        elif kind == SVC_LOGNORM:
            # the normals first, then their exps: two tight loops
            sigma = params[2]
            for j in range(um):
                out[j] = standard_normal(bits)
            for j in range(um):
                out[j] = loc + scale * np.exp(sigma * out[j])
        elif kind == SVC_GAMMA:
            shape = params[2]
            b, c, inv = gamma_constants(shape)
            for j in range(um):
                out[j] = loc + scale * numpy_gamma(bits, shape, b, c, inv)
        elif kind == SVC_WEIBULL_MIN:
            # numpy's Weibull: E ** (1 / c), 0 at c = 0
            inv = 1.0 / params[2] if params[2] != 0.0 else 0.0
            for j in range(um):
                out[j] = loc + scale * (0.0 if inv == 0.0 else pow(standard_exponential(bits), inv))
        elif kind == SVC_EMPIRICAL:
            size = values.shape[0]
            for j in range(um):
                # a 53-bit uniform times the size: an index in [0, size), each equally likely
                # up to 2**-53 relative (sizes far below 2**53)
                out[j] = values[np.uint64(next_double(bits) * size)]
        else:
            replay(values, i0, m, out)

    return lengths


def _predict_py(kind):
    """The predictor of ``kind``, as Python (see :func:`drawers`)."""

    def predictions(sigma, values, i0, m, gen, true, out):
        um = np.uint64(m)
        if kind == PRED_LOGNORMAL:
            bits = gen.bit_generator
            for j in range(um):
                out[j] = true[j] * math.exp(sigma * standard_normal(bits))
        elif kind == PRED_REPLAY:
            replay(values, i0, m, out)
        else:
            for j in range(um):
                out[j] = true[j]

    return predictions


#: (Python drawer of a kind, its signature, its kinds)
DRAWERS = {"arrivals": (_arrivals_py, ARRIVALS_SIG, ARRIVAL_KINDS),
           "lengths": (_lengths_py, LENGTHS_SIG, LENGTH_KINDS),
           "predict": (_predict_py, PREDICT_SIG, PREDICT_KINDS)}


#: the functions compiled apart in this process (the drawers, by (what,
#: kind)): kept for the process's life, since kernels call them by address
_COMPILED: dict = {}
_COMPILING = threading.Lock()


#: the makers of the functions compiled apart other than the drawers, by their key: each module
#: registers its own where it defines them (:func:`apart_caches` flushes their caches with the rest)
APART: dict = {}


def compiled_apart(key: tuple, make, sig):
    """``make()``, a Python function, compiled as a C function of ``sig``
    (a kernel calls it by address: :func:`by_address`), once per process
    under ``key`` (a lock: a function compiled twice by two threads, one copy
    dropped, would leave a kernel calling freed code).  ``make`` names the
    function after its key: numba names a function's disk cache after it."""
    fn = _COMPILED.get(key)
    if fn is None:
        with _COMPILING:
            fn = _COMPILED.get(key)
            if fn is None:
                fn = _COMPILED[key] = cfunc(sig, cache=CACHE, _nrt=False)(make())
    return fn


def _drawer(what: str, kind: int):
    """The drawer ``what`` compiled for ``kind``, once per process."""
    py, sig, kinds = DRAWERS[what]
    if int(kind) not in kinds:
        raise ValueError(f"no {what} drawer of kind {kind}; kinds are {kinds}")
    return compiled_apart((what, int(kind)), lambda: _named(what, int(kind)), sig)


def _named(what: str, kind: int):
    """The Python drawer ``what`` of ``kind``, named for both: numba names a
    function's disk cache after it, so each kind has a cache of its own.
    (Kinds sharing one cache index could cross: two processes compiling two
    kinds at once could each file its code under the same data file, and the
    index of one could end up pointing at the other's code.)"""
    fn = DRAWERS[what][0](kind)
    fn.__qualname__ = fn.__name__ = f"drawer_{what}_{kind}"
    return fn


def drawers(arrival_kind: int, *length_kinds: int, predictor: int = PRED_ORACLE) -> np.ndarray:
    """The addresses a kernel draws its requests through (compiling each
    drawer the first time a process uses its kind): the arrival process,
    then one per length stream, then the predictor."""
    fns = [_drawer("arrivals", arrival_kind)] + [_drawer("lengths", k) for k in length_kinds] + [
        _drawer("predict", predictor)]
    return np.array([f.address for f in fns], np.int64)


@step
def draw_arrivals(fn, t, inv_rate, arrival_times, i0, m, gen, out, params, ends, seg, t_switch):
    """Arrival times of requests i0 .. i0+m-1 into ``out`` by the arrival
    drawer at ``fn`` (:func:`drawers`), continuing the clock ``t`` and the
    process's state: the rate segment or ON/OFF state ``seg`` and, for
    ON/OFF, the time ``t_switch`` of the next change of state (negative
    before the first call).  Returns the new ``(t, seg, t_switch)``."""
    return _call_arrivals(fn, (t, inv_rate, arrival_times, i0, m, gen, out, params, ends, seg, t_switch))


@step
def draw_block(fn, params, values, i0, m, gen, out):
    """Draws (or replayed values) i0 .. i0+m-1 of one length or service
    stream into ``out``, by the length drawer at ``fn`` (:func:`drawers`)."""
    _call_lengths(fn, (params, values, i0, m, gen, out))


@step
def predict(fn, sigma, values, i0, m, gen, true, out):
    """Predicted values of requests i0 .. i0+m-1 into ``out`` from their true
    values ``true``, by the predictor at ``fn`` (:func:`drawers`): log-normal
    error ``sigma`` (draws of ``gen``) or the given ``values``; the oracle
    and bin confusion copy the truth."""
    _call_predict(fn, (sigma, values, i0, m, gen, true, out))


@step
def replay_time(arrival_times, period, i):
    """The arrival time of request ``i`` of a replayed trace repeated end to
    end, as the replay arrivals drawer makes it: time ``i % size`` of copy
    ``i // size``, shifted by ``(i // size) * period``."""
    size = arrival_times.shape[0]
    c = i // size
    r = i - c * size
    return arrival_times[r] if c == 0 else arrival_times[r] + c * period


@step
def replay(values, i0, m, out):
    """Values i0 .. i0+m-1 of ``values`` into ``out``, in order, repeated
    end to end when the run is longer than they are."""
    size = values.shape[0]
    r = i0 % size
    for j in range(np.uint64(m)):
        out[j] = values[r]
        r += 1
        if r == size:
            r = 0


#: SplitMix64's increment and multipliers (Steele, Lea and Flood, "Fast splittable
#: pseudorandom number generators", OOPSLA 2014)
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_M1 = 0xBF58476D1CE4E5B9
SPLITMIX_M2 = 0x94D049BB133111EB


@njit(cache=CACHE, forceinline=True)
def request_uniform(key, i):
    """A uniform in [0, 1) that belongs to request ``i`` of a run: SplitMix64
    at counter ``i + 1`` from ``key`` (a draw of the run's prediction
    stream), so that it does not depend on when the request is looked at."""
    z = np.uint64(key) + (np.uint64(i) + np.uint64(1)) * np.uint64(SPLITMIX_GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(SPLITMIX_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(SPLITMIX_M2)
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


def request_uniforms(key: int, i: np.ndarray) -> np.ndarray:
    """:func:`request_uniform` for an array of request indices, in numpy
    (the same uint64 arithmetic, so the same numbers)."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (i.astype(np.uint64) + np.uint64(1)) * np.uint64(SPLITMIX_GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(SPLITMIX_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(SPLITMIX_M2)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


@njit(cache=CACHE, forceinline=True)
def confused_bin(b, u, p, k):
    """Bin ``b`` kept when ``u < p`` (or with one bin), else moved to a
    neighbour: either side alike where both exist, the one neighbour at an
    end.  (:func:`confuse_bins` for one request.)"""
    if u < p or k == 1:
        return b
    if b == 0:
        return 1
    if b == k - 1:
        return k - 2
    return b - 1 if (u - p) < 0.5 * (1.0 - p) else b + 1


def confused_bins(b: np.ndarray, u: np.ndarray, p: float, k: int) -> np.ndarray:
    """:func:`confused_bin` over arrays, in numpy."""
    if k == 1:
        return b
    moved = u >= p
    down = np.where(b == 0, 1, np.where(b == k - 1, k - 2, np.where((u - p) < 0.5 * (1.0 - p), b - 1, b + 1)))
    return np.where(moved, down, b)


@subroutine
def confuse_bins(bins, m, k, p, gen):
    """Each of the first m bins kept with probability ``p``, else moved to a
    neighbouring bin: either side with probability (1 - p) / 2 where both
    exist, the one neighbour with probability 1 - p at an end (one bin:
    kept).  One uniform of ``gen`` per request."""
    bits = gen.bit_generator
    last = k - 1
    for j in range(np.uint64(m)):
        u = next_double(bits)
        if u < p or k == 1:
            continue
        b = np.int64(bins[j])
        if b == 0:
            b = 1
        elif b == last:
            b = last - 1
        elif (u - p) < 0.5 * (1.0 - p):
            b -= 1
        else:
            b += 1
        bins[j] = b


@subroutine
def round_lengths(x, m, integer):
    """Whole tokens: each of the first m lengths rounded up, and at least 1."""
    if integer:
        for j in range(m):
            v = math.ceil(x[j])
            x[j] = v if v >= 1.0 else 1.0


@helper
def draw_lengths(fn, params, values, gen, out, integer):
    """``out.size`` lengths of one stream drawn before a run as a kernel
    draws a run's (:func:`draw_block` by the length drawer at ``fn``, in
    blocks of :data:`BLOCK`, then :func:`round_lengths` when ``integer``):
    the stream's first draws, the values a kernel would give its first
    requests."""
    n = out.shape[0]
    for i0 in range(0, n, BLOCK):
        m = min(BLOCK, n - i0)
        blk = out[i0:i0 + m]
        draw_block(fn, params, values, i0, m, gen, blk)
        round_lengths(blk, m, integer)


def length_drawer(kind: int) -> int:
    """The address of the length drawer of ``kind`` (compiled the first time
    a process uses it), for :func:`draw_lengths`."""
    return _drawer("lengths", kind).address


@subroutine
def token_service(x, m, base, per_token, integer):
    """Each of the first m output lengths x (tokens) becomes its request's
    service time under the max-of-members model, ``base + per_token * x``
    (s), after :func:`round_lengths` when ``integer``."""
    round_lengths(x, m, integer)
    for j in range(m):
        x[j] = base + per_token * x[j]


# --- the iteration model (service_models.IterationModel), shared by the kernels

@step
def member_work(prompt, output):
    """One member's decode work in a batch whose finished members leave:
    its decode steps ``d = max(output - 1, 0)`` (its first token comes from
    the prefill iteration) and the context tokens it attends over in them,
    ``prompt * d + d (d + 1) / 2``."""
    d = max(output - 1.0, 0.0)
    return d, prompt * d + d * (d + 1.0) / 2.0


@step
def padded_work(nb, sum_prompt, max_out):
    """The decode work of a batch of ``nb`` whose finished members stay
    (padded): every member steps until the longest is done."""
    dmax = max(max_out - 1.0, 0.0)
    bf = float(nb)
    return bf * dmax, sum_prompt * dmax + bf * dmax * (dmax + 1.0) / 2.0


@step
def extra_experts(span, miss, tokens):
    """The experts of a mixture-of-experts layer an iteration of ``tokens``
    tokens reads beyond its first token's: ``span (1 - miss^(tokens - 1))``,
    ``span = E - k``, ``miss = 1 - k/E`` (0 for no token;
    ``service_models.extra_experts``)."""
    if tokens < 1.0:
        return 0.0
    return span * (1.0 - miss ** (tokens - 1.0))


@step
def expert_share(span, miss, nb, rank, d):
    """A member's share of its batch's decode expert reads, finished members
    leaving: ``d`` decode steps, ``rank`` (1, 2, ...) its place among the
    ``nb`` members by decode steps.  With the steps sorted, ``d_(i) -
    d_(i-1)`` iterations decode the ``nb - i + 1`` members left, so the batch
    reads ``sum_i d_(i) (x(nb - i + 1) - x(nb - i))`` experts
    (:func:`extra_experts` x), whatever the order of equal steps."""
    left = float(nb - rank + 1)
    return d * (extra_experts(span, miss, left) - extra_experts(span, miss, left - 1.0))


@step
def ranked_expert_reads(outputs, start, mask, nb, max_out, padded, span, miss):
    """The experts a batch's decode iterations read (``BatchAggregates.expert_reads``):
    its ``nb`` members' output lengths at ``outputs[(start + i) & mask]`` (a
    ring's slots, or ``mask = -1``: a run of the array), each member's
    :func:`expert_share` by its rank among them (O(nb^2), run for a mixture
    of experts only); ``padded``: every iteration decodes all nb."""
    if padded:
        return max(max_out - 1.0, 0.0) * extra_experts(span, miss, float(nb))
    reads = 0.0
    for i in range(nb):
        di = max(outputs[(start + i) & mask] - 1.0, 0.0)
        rank = 1
        for j in range(nb):
            dj = max(outputs[(start + j) & mask] - 1.0, 0.0)
            if dj < di or (dj == di and j < i):
                rank += 1
        reads += expert_share(span, miss, nb, rank, di)
    return reads


def warmup() -> None:
    """Compile (or load from the cache) the helpers called from Python and
    the drawer of every kind."""
    hist_ranks(np.zeros(2, np.int64), np.array([0.5]), np.empty(1, np.int64))
    for what, (_, _, kinds) in DRAWERS.items():
        for kind in kinds:
            _drawer(what, kind)
    ro = np.zeros(3)
    ro.flags.writeable = False
    draw_lengths(length_drawer(SVC_UNIFORM), ro, ro, np.random.Generator(np.random.PCG64DXSM(0)), np.empty(2), True)


def drawer_caches() -> list:
    """numba's disk caches of the drawers (one per drawer and kind), without
    compiling any."""
    from numba.core.caching import FunctionCache
    return [FunctionCache(_named(what, kind)) for what, (_, _, kinds) in DRAWERS.items() for kind in kinds] \
        if CACHE else []


def apart_caches() -> list:
    """numba's disk caches of every function compiled apart (the drawers and
    :data:`APART`'s), without compiling any, for
    :func:`mbbatch._kernels._drop_stale_caches`: a function compiled apart
    inlines the steps of other modules, which numba's own check of its
    source file does not see change."""
    from numba.core.caching import FunctionCache
    return drawer_caches() + [FunctionCache(make()) for make in APART.values()] if CACHE else []
