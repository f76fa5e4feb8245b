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
    hist[h] += 1


#: requests drawn per block: random numbers are drawn in tight loops, one
#: stream at a time, then the block is processed without calls in its loop
BLOCK = 1024


@njit(cache=CACHE)
def _draw_block(kind, params, values, i0, m, gen, out):
    # the switch sits outside the loops so each draw loop is a tight one
    loc = params[0]
    scale = params[1]
    if kind == SVC_UNIFORM:
        for j in range(m):
            out[j] = loc + scale * gen.random()
    elif kind == SVC_EXPON:
        for j in range(m):
            out[j] = loc + scale * gen.standard_exponential()
    elif kind == SVC_LOGNORM:
        for j in range(m):
            out[j] = loc + scale * np.exp(params[2] * gen.standard_normal())
    elif kind == SVC_GAMMA:
        for j in range(m):
            out[j] = loc + scale * gen.standard_gamma(params[2])
    elif kind == SVC_WEIBULL_MIN:
        for j in range(m):
            out[j] = loc + scale * gen.weibull(params[2])
    else:
        for j in range(m):
            out[j] = values[i0 + j]


@njit(cache=CACHE)
def multibin_kernel(
    n, arrival_kind, rate, arrival_times, service_kind, service_params, service_values,
    edges, batch_size, servers, gen_arrival, gen_service, keep,
    out_arrival, out_service, out_bin, out_completion, out_batch,
    stats, istats, batches_per_bin, group_latency, group_count, group_batch_wait,
    group_batches, hist,
):
    """Simulate ``n`` requests through multi-bin batching; outputs are written in place.

    ``servers == 0`` means infinitely many servers (Assumption 5.1).  Requests
    of a bin whose last batch never fills are counted in ``istats[I_EXCLUDED]``
    and get no completion time.  Group ``g`` of the batch-means statistics
    holds the batches whose last member has arrival index ``i`` with
    ``g = i * G // n``.
    """
    k = edges.shape[0] - 1
    B = batch_size
    G = group_latency.shape[0]
    # bin b's partial batch occupies [b * B, (b + 1) * B) of flat buffers
    buf_arrival = np.empty(k * B, np.float64)
    buf_service = np.empty(k * B, np.float64)
    buf_index = np.empty(k * B, np.int64)
    count = np.zeros(k, np.int64)
    block_time = np.empty(BLOCK, np.float64)
    block_bin = np.empty(BLOCK, np.int32)
    block_service = np.empty(BLOCK, np.float64)
    # server free times: a binary min-heap when 1 < servers < inf
    n_heap = servers if servers > 1 else 1
    heap = np.zeros(n_heap, np.float64)
    free_at = 0.0
    inv_rate = 1.0 / rate if rate > 0.0 else 0.0

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

    for i0 in range(0, n, BLOCK):
        m = min(BLOCK, n - i0)
        if arrival_kind == ARR_POISSON:
            for j in range(m):
                t += gen_arrival.standard_exponential() * inv_rate
                block_time[j] = t
        elif arrival_kind == ARR_REPLAY:
            for j in range(m):
                block_time[j] = arrival_times[i0 + j]
        else:
            for j in range(m):
                block_time[j] = 0.0
        if i0 == 0:
            first_arrival = block_time[0]
        _draw_block(service_kind, service_params, service_values, i0, m, gen_service, block_service)
        # bin j holds edges[j] <= s < edges[j+1], the last bin closed above.
        # Counting the inner edges passed is branch-free and vectorizes, unlike
        # a search inside the request loop; binary search for many bins.
        if k <= 16:
            for j in range(m):
                block_bin[j] = 0
            for q in range(1, k):
                e = edges[q]
                for j in range(m):
                    block_bin[j] += block_service[j] >= e
        else:
            for j in range(m):
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
        for jj in range(m):
            i = i0 + jj
            t = block_time[jj]
            s = block_service[jj]
            b = block_bin[jj]
            c = count[b]
            o = b * B
            buf_arrival[o + c] = t
            buf_service[o + c] = s
            if keep:
                buf_index[o + c] = i
                out_arrival[i] = t
                out_service[i] = s
                out_bin[i] = b
            c += 1
            if c < B:
                count[b] = c
                continue

            # the bin's batch is ready now, at the arrival of its B-th request;
            # batches reach the central FIFO in ready-time order, so serving
            # them in generation order is "first completed batch, first served"
            count[b] = 0
            # max in four lanes, like the sum below: no long compare chain
            m0 = buf_service[o]
            m1 = m0
            m2 = m0
            m3 = m0
            j = 0
            while j + 4 <= B:
                x0 = buf_service[o + j]
                x1 = buf_service[o + j + 1]
                x2 = buf_service[o + j + 2]
                x3 = buf_service[o + j + 3]
                m0 = x0 if x0 > m0 else m0
                m1 = x1 if x1 > m1 else m1
                m2 = x2 if x2 > m2 else m2
                m3 = x3 if x3 > m3 else m3
                j += 4
            while j < B:
                x0 = buf_service[o + j]
                m0 = x0 if x0 > m0 else m0
                j += 1
            m0 = m1 if m1 > m0 else m0
            m2 = m3 if m3 > m2 else m2
            S = m2 if m2 > m0 else m0
            if servers == 1:
                start = t if t > free_at else free_at
                free_at = start + S
            elif servers == 0:
                start = t
            else:
                start = t if t > heap[0] else heap[0]
                # replace the root by the new free time and sift down
                v = start + S
                j = 0
                while True:
                    l = 2 * j + 1
                    if l >= n_heap:
                        break
                    r = l + 1
                    mm = l
                    if r < n_heap and heap[r] < heap[l]:
                        mm = r
                    if heap[mm] < v:
                        heap[j] = heap[mm]
                        j = mm
                    else:
                        break
                heap[j] = v
            C = start + S
            if C > last_completion:
                last_completion = C
            busy += S
            busy_sq += S * S
            # latencies of the members: summed in four lanes in a fixed order
            # (deterministic, and free of one long add chain) and histogrammed
            a0 = 0.0
            a1 = 0.0
            a2 = 0.0
            a3 = 0.0
            j = 0
            while j + 4 <= B:
                l0 = C - buf_arrival[o + j]
                l1 = C - buf_arrival[o + j + 1]
                l2 = C - buf_arrival[o + j + 2]
                l3 = C - buf_arrival[o + j + 3]
                a0 += l0
                a1 += l1
                a2 += l2
                a3 += l3
                _hist_add(hist, l0)
                _hist_add(hist, l1)
                _hist_add(hist, l2)
                _hist_add(hist, l3)
                j += 4
            while j < B:
                l0 = C - buf_arrival[o + j]
                a0 += l0
                _hist_add(hist, l0)
                j += 1
            lat_batch = (a0 + a1) + (a2 + a3)
            if keep:
                for j in range(B):
                    out_completion[buf_index[o + j]] = C
                    out_batch[buf_index[o + j]] = n_batches
            # lat_batch = B*C - sum(arrivals), so the fill wait B*t - sum(arrivals)
            sum_fill += lat_batch - B * (C - t)
            sum_latency += lat_batch
            sum_queue += B * (start - t)
            g = (i * G) // n
            group_latency[g] += lat_batch
            group_count[g] += B
            group_batch_wait[g] += start - t
            group_batches[g] += 1
            batches_per_bin[b] += 1
            completed += B
            n_batches += 1

    excluded = 0
    for b in range(k):
        excluded += count[b]
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
