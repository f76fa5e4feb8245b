"""The multi-bin batching kernel (Section 3 and Algorithm 1 of the paper).

One pass over the requests in arrival order, streaming: memory is
O(bins x batch_size + servers) unless per-request outputs are requested.

Random draws happen inside the loop in a fixed order that does not depend on
the policy: request ``i`` takes its inter-arrival gap from the arrival stream
and its service time from the service stream, whatever the bins, batch size or
servers.  One seed therefore gives every policy the same requests (common
random numbers).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import CACHE

# arrival kinds
ARR_POISSON = 0
ARR_SATURATED = 1
ARR_REPLAY = 2
ARR_PIECEWISE = 3   # Poisson with a piecewise-constant rate

# service kinds: the draw is loc + scale * X with X from the table below
SVC_UNIFORM = 0      # X ~ U[0, 1)
SVC_EXPON = 1        # X ~ Exp(1)
SVC_LOGNORM = 2      # X = exp(s Z), params[2] = s
SVC_GAMMA = 3        # X ~ Gamma(a, 1), params[2] = a
SVC_WEIBULL_MIN = 4  # X ~ Weibull(c), params[2] = c
SVC_REPLAY = 5       # service times given in an array

# latency histogram: log-linear buckets on the float64 bit pattern (HDR-style).
# HIST_SUB_BITS mantissa bits per octave give buckets of relative width
# 2**-HIST_SUB_BITS; quantiles read off bucket midpoints are within half that.
HIST_SUB_BITS = 10
HIST_MIN_EXP = -30   # 2**-30 s ~ 1 ns: smaller latencies land in bucket 0
HIST_MAX_EXP = 50    # 2**50 s: larger latencies land in the last bucket
HIST_SIZE = (HIST_MAX_EXP - HIST_MIN_EXP) << HIST_SUB_BITS
_HIST_SHIFT = 52 - HIST_SUB_BITS
_HIST_BASE = (1023 + HIST_MIN_EXP) << HIST_SUB_BITS

# indices into the float statistics vector
S_FIRST_ARRIVAL = 0
S_LAST_COMPLETION = 1
S_BUSY = 2            # summed batch service time (server-seconds busy)
S_SUM_LATENCY = 3
S_SUM_FILL_WAIT = 4   # request arrival -> its batch is ready
S_SUM_QUEUE_WAIT = 5  # batch ready -> batch starts service, per request
S_BUSY_SQ = 6         # summed squared batch service time
N_FLOAT_STATS = 7

# indices into the integer statistics vector
I_COMPLETED = 0
I_BATCHES = 1
I_EXCLUDED = 2
N_INT_STATS = 3


@intrinsic
def _float_bits(typingctx, x):
    """The IEEE-754 bit pattern of a float64 as an int64, in a register."""
    if isinstance(x, types.Float) and x.bitwidth == 64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(x), codegen
    return None


@njit(cache=CACHE, inline="always")
def _hist_add(hist, x):
    # bucket = exponent and top HIST_SUB_BITS mantissa bits of x (x >= 0)
    h = (_float_bits(x) >> _HIST_SHIFT) - _HIST_BASE
    h = min(max(h, 0), HIST_SIZE - 1)
    hist[np.uint64(h)] += 1


@njit(cache=CACHE)
def _fill(j0, m, i0, block_time, block_service, block_bin, count, max_service, uB, uS,
          buf_arrival, keep, buf_index, out_arrival, out_service, out_bin, deadline, max_wait):
    """Add requests j0, j0+1, ... of the block to their bins' partial batches
    (arrival time kept, service time folded into the bin's running maximum).

    Returns ``(j, deadline)``: ``j`` is the index of the first request that
    fills a batch (its bin's count is reset), or ``-1 - j`` when request ``j``
    arrives after ``deadline``, the earliest time a partial batch must
    leave (``max_wait``), or ``m``.  ``deadline`` is updated as bins get their
    first member.  Bin b's partial batch starts at ``b * uS`` of the
    buffers.  A small function of its own so that its loop keeps its few
    pointers in registers."""
    one = np.uint64(1)
    for jj in range(np.uint64(j0), np.uint64(m)):
        t = block_time[jj]
        if t > deadline:
            # (an arrival exactly at a deadline still joins its bin's batch)
            return -1 - np.int64(jj), deadline
        b = np.uint64(block_bin[jj])
        c = count[b]
        o = b * uS + c
        s = block_service[jj]
        if c == 0:
            # a bin's oldest member sets its deadline; later ones cannot be earlier
            d = t + max_wait
            deadline = d if d < deadline else deadline
        buf_arrival[o] = t
        mx = max_service[b]
        max_service[b] = s if s > mx else mx
        if keep:
            i = i0 + np.int64(jj)
            buf_index[o] = i
            out_arrival[i] = t
            out_service[i] = s
            out_bin[i] = b
        c += one
        if c == uB:
            count[b] = 0
            return np.int64(jj), deadline
        count[b] = c
    return m, deadline


#: requests drawn per block: random numbers are drawn in tight loops, one
#: stream at a time, then the block is processed without calls in its loop
BLOCK = 1024


@njit(cache=CACHE)
def _draw_arrivals(kind, t, inv_rate, arrival_times, i0, m, gen, out, pw_rates, pw_ends, seg):
    """Arrival times of requests i0 .. i0+m-1 into ``out``, continuing the
    clock ``t`` (and, for piecewise Poisson, the rate segment ``seg``);
    returns the new ``(t, seg)``."""
    um = np.uint64(m)
    if kind == ARR_POISSON:
        for j in range(um):
            t += gen.standard_exponential() * inv_rate
            out[j] = t
    elif kind == ARR_PIECEWISE:
        for j in range(um):
            # exact piecewise-constant Poisson: memorylessness lets a gap
            # that crosses a rate change restart at the change
            while True:
                nt = t + gen.standard_exponential() / pw_rates[seg]
                if nt <= pw_ends[seg] or seg == pw_rates.shape[0] - 1:
                    t = nt
                    break
                t = pw_ends[seg]
                seg += 1
            out[j] = t
    elif kind == ARR_REPLAY:
        ui0 = np.uint64(i0)
        for j in range(um):
            out[j] = arrival_times[ui0 + j]
    else:
        for j in range(um):
            out[j] = 0.0
    return t, seg


@njit(cache=CACHE)
def _draw_block(kind, params, values, i0, m, gen, out):
    # the switch sits outside the loops so each draw loop is a tight one
    um = np.uint64(m)
    ui0 = np.uint64(i0)
    loc = params[0]
    scale = params[1]
    if kind == SVC_UNIFORM:
        for j in range(um):
            out[j] = loc + scale * gen.random()
    elif kind == SVC_EXPON:
        for j in range(um):
            out[j] = loc + scale * gen.standard_exponential()
    elif kind == SVC_LOGNORM:
        for j in range(um):
            out[j] = loc + scale * np.exp(params[2] * gen.standard_normal())
    elif kind == SVC_GAMMA:
        for j in range(um):
            out[j] = loc + scale * gen.standard_gamma(params[2])
    elif kind == SVC_WEIBULL_MIN:
        for j in range(um):
            out[j] = loc + scale * gen.weibull(params[2])
    else:
        for j in range(um):
            out[j] = values[ui0 + j]


@njit(cache=CACHE, nogil=True)
def multibin_kernel(
    n, arrival_kind, rate, arrival_times, service_kind, service_params, service_values,
    edges, batch_size, servers, max_wait, gen_arrival, gen_service, keep,
    out_arrival, out_service, out_bin, out_completion, out_batch,
    stats, istats, batches_per_bin, group_latency, group_count, group_batch_wait,
    group_batches, hist, stop,
):
    """Simulate ``n`` requests through multi-bin batching; outputs are written in place.

    ``servers == 0`` means infinitely many servers (Assumption 5.1).  With
    ``max_wait`` finite a bin also releases a partial batch once its oldest
    request has waited ``max_wait`` (then nothing is left over); otherwise
    requests of a bin whose last batch never fills are counted in
    ``istats[I_EXCLUDED]`` and get no completion time.  Group ``g`` of the batch-means statistics
    holds the batches whose last member has arrival index ``i`` with
    ``g = i * G // n``.

    ``servers`` need be at most ``n`` (more are never all busy).  The kernel
    returns early, its outputs incomplete, once ``stop[0]`` is nonzero
    (checked at every block of draws): the caller's Ctrl-C.  It runs without
    the GIL, so the caller's thread can take the signal meanwhile.

    The hot loops index with unsigned integers: numba then emits no
    negative-index wraparound, which costs a third of the request loop.
    """
    k = edges.shape[0] - 1
    B = batch_size
    G = group_latency.shape[0]
    U0 = np.uint64(0)
    U1 = np.uint64(1)
    U2 = np.uint64(2)
    U3 = np.uint64(3)
    U4 = np.uint64(4)
    uB = np.uint64(B)
    # bin b's partial batch occupies [b * stride, (b + 1) * stride) of flat buffers: a
    # bin never holds more than min(B, n) requests
    stride = B if B < n else n
    uS = np.uint64(stride)
    buf_arrival = np.empty(k * stride, np.float64)
    buf_index = np.empty(k * stride, np.int64)
    count = np.zeros(k, np.uint64)
    max_service = np.full(k, -np.inf)
    lat = np.empty(stride, np.float64)
    hidx = np.empty(stride, np.uint64)
    block_time = np.empty(BLOCK, np.float64)
    block_bin = np.empty(BLOCK, np.uint32)
    block_service = np.empty(BLOCK, np.float64)
    # server free times: a binary min-heap when 1 < servers < inf
    n_heap = servers if servers > 1 else 1
    heap = np.zeros(n_heap, np.float64)
    free_at = 0.0
    inv_rate = 1.0 / rate if rate > 0.0 else 0.0
    no_segments = np.empty(0, np.float64)
    seg = 0

    t = 0.0
    first_arrival = 0.0
    last_completion = -np.inf
    busy = 0.0
    busy_sq = 0.0
    sum_latency = 0.0
    sum_fill = 0.0
    sum_queue = 0.0
    completed = 0
    n_batches = 0

    i0 = 0
    m = 0
    jj = np.int64(0)  # not a literal: one compiled _fill, not two
    deadline = np.inf
    arrivals_over = False
    while True:
        if jj == m and not arrivals_over:
            if stop[0] != 0:
                return
            i0 += m
            if i0 >= n:
                arrivals_over = True
            else:
                m = min(BLOCK, n - i0)
                jj = np.int64(0)
            # 1. draws, one stream at a time, in tight loops
            um = np.uint64(m)
            t, seg = _draw_arrivals(arrival_kind, t, inv_rate, arrival_times, i0, m, gen_arrival,
                                    block_time, no_segments, no_segments, seg)
            if i0 == 0:
                first_arrival = block_time[0]
            _draw_block(service_kind, service_params, service_values, i0, m, gen_service, block_service)

            # 2. bins: bin b holds edges[b] <= s < edges[b+1], the last one closed
            # above.  Counting the inner edges passed is branch-free and
            # vectorizes; binary search for many bins.
            if k <= 16:
                for j in range(um):
                    block_bin[j] = 0
                for q in range(1, k):
                    e = edges[q]
                    for j in range(um):
                        block_bin[j] += block_service[j] >= e
            else:
                for j in range(um):
                    s = block_service[j]
                    lo = 0
                    hi = k - 1
                    while lo < hi:
                        mid = (lo + hi + 1) >> 1
                        if s >= edges[mid]:
                            lo = mid
                        else:
                            hi = mid - 1
                    block_bin[j] = lo


        # 3. requests in arrival order; _fill returns at each full batch and
        # before the first arrival past a partial batch's deadline
        if not arrivals_over:
            jj, deadline = _fill(jj, m, i0, block_time, block_service, block_bin, count, max_service,
                                 uB, uS, buf_arrival, keep, buf_index, out_arrival, out_service, out_bin,
                                 deadline, max_wait)
            if jj == m:
                continue
        if arrivals_over or jj < 0:
            if deadline == np.inf:
                break
            # a partial batch leaves at its deadline: the bin whose oldest
            # member is oldest
            if jj < 0:
                jj = -1 - jj
            ready = deadline
            b = np.uint64(0)
            first = np.inf
            for q in range(k):
                if count[q] > 0 and buf_arrival[q * stride] < first:
                    first = buf_arrival[q * stride]
                    b = np.uint64(q)
            o = b * uS
            members = count[b]
            count[b] = 0
            i = min(i0 + jj, n - 1)
        else:
            i = i0 + jj
            ready = block_time[jj]
            b = np.uint64(block_bin[jj])
            o = b * uS
            members = uB
            jj += 1

        # The batch is ready now: at the arrival of its B-th request, or at its
        # bin's deadline.  Batches reach the central FIFO in ready-time order, so serving
        # them in generation order is "first completed batch, first served".
        # batch service time = max of the members'
        S = max_service[b]
        max_service[b] = -np.inf

        if servers == 1:
            start = ready if ready > free_at else free_at
            free_at = start + S
        elif servers == 0:
            start = ready
        else:
            start = ready if ready > heap[0] else heap[0]
            # replace the root by the new free time and sift down
            v = start + S
            p = 0
            while True:
                l = 2 * p + 1
                if l >= n_heap:
                    break
                r = l + 1
                mm = l
                if r < n_heap and heap[r] < heap[l]:
                    mm = r
                if heap[mm] < v:
                    heap[p] = heap[mm]
                    p = mm
                else:
                    break
            heap[p] = v
        C = start + S
        if C > last_completion:
            last_completion = C
        busy += S
        busy_sq += S * S

        # member latencies, then their histogram buckets: both loops
        # vectorize; only the bucket increments stay scalar
        for j in range(members):
            lat[j] = C - buf_arrival[o + j]
        for j in range(members):
            h = (_float_bits(lat[j]) >> _HIST_SHIFT) - _HIST_BASE
            hidx[j] = min(max(h, 0), HIST_SIZE - 1)
        for j in range(members):
            hist[hidx[j]] += 1
        # summed in four lanes in a fixed order: deterministic, and free
        # of one long add chain
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        a3 = 0.0
        j = U0
        while j + U4 <= members:
            a0 += lat[j]
            a1 += lat[j + U1]
            a2 += lat[j + U2]
            a3 += lat[j + U3]
            j += U4
        while j < members:
            a0 += lat[j]
            j += U1
        lat_batch = (a0 + a1) + (a2 + a3)
        if keep:
            for jm in range(members):
                r_i = buf_index[o + jm]
                out_completion[r_i] = C
                out_batch[r_i] = n_batches
        # lat_batch = nm*C - sum(arrivals), so the fill wait is nm*ready - sum(arrivals)
        nm = np.int64(members)
        sum_fill += lat_batch - nm * (C - ready)
        sum_latency += lat_batch
        sum_queue += nm * (start - ready)
        g = (i * G) // n
        group_latency[g] += lat_batch
        group_count[g] += nm
        group_batch_wait[g] += start - ready
        group_batches[g] += 1
        batches_per_bin[b] += 1
        completed += nm
        n_batches += 1
        if max_wait < np.inf:
            # the earliest deadline among the bins still holding requests
            deadline = np.inf
            for q in range(k):
                if count[q] > 0:
                    d = buf_arrival[q * stride] + max_wait
                    deadline = d if d < deadline else deadline

    excluded = 0
    for q in range(k):
        excluded += count[q]
    stats[S_FIRST_ARRIVAL] = first_arrival
    stats[S_LAST_COMPLETION] = last_completion
    stats[S_BUSY] = busy
    stats[S_BUSY_SQ] = busy_sq
    stats[S_SUM_LATENCY] = sum_latency
    stats[S_SUM_FILL_WAIT] = sum_fill
    stats[S_SUM_QUEUE_WAIT] = sum_queue
    istats[I_COMPLETED] = completed
    istats[I_BATCHES] = n_batches
    istats[I_EXCLUDED] = excluded


def warmup() -> None:
    """Compile the kernel (or load it from the cache) on a tiny input."""
    from ..simulation import simulate
    from ..policies import MultiBin
    from ..arrivals import Poisson
    import scipy.stats as st

    simulate(MultiBin(bins=2, batch_size=2), arrivals=Poisson(rate=1.0),
             service=st.uniform(1, 1), n=8, seed=0)
