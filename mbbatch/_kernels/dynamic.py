"""Event kernels of the batch-forming policies: static batching, dynamic
batching (Algorithms 1-3 and 7 of the dynamic-batching specification) and
multi-bin dynamic batching (Algorithms 4-6 on top), without a GPU.

Requests carry prompt, output and predicted output lengths (tokens).  A batch
is formed whenever a server is free and requests are queued (at an arrival or
at a completion): no policy here waits for a batch to fill.  Controller
feedback (Algorithm 7) happens when a batch completes, in time order, so a
batch formed at time t sees exactly the feedback of the batches completed by t.

Memory is O(bins x queue + servers): the per-bin FIFOs are ring buffers
that grow with the backlog, and a server keeps only its batch's aggregates.

Speed (``make bench``): the hot paths call only functions of scalars, and
no array variable is rebound inside the event loop, so numba emits no
reference counting there: an atomic increment and decrement per request
would take longer than everything else the loop does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import CACHE
from . import controller as ctl_
from .multibin import (  # noqa: F401  (ARR_PIECEWISE is part of this module's vocabulary)
    ARR_PIECEWISE, ARR_POISSON, ARR_REPLAY, ARR_SATURATED, BLOCK, HIST_SIZE, _HIST_BASE, _HIST_SHIFT,
    _draw_arrivals, _draw_block, _float_bits,
)


POL_STATIC = 0
POL_DYNAMIC = 1
POL_MB_DYNAMIC = 2

SEL_ROUND_ROBIN = 0
SEL_LONGEST_QUEUE = 1

MODEL_MAX = 0       # base + per_token * max output_len (the multi-bin paper's max)
MODEL_LINEAR = 1    # base + alpha * max_seq_len * (1 + beta (b-1)/b)
MODEL_DECODE = 2    # prefill_per_token * sum prompt + TBT(b) * max output_len

# service-model parameter vector
SM_BASE = 0
SM_PER_TOKEN = 1
SM_ALPHA = 2
SM_BETA = 3
SM_PREFILL = 4
SM_TBT_BETA = 5
SM_TBT_GAMMA = 6
N_SM = 7

# policy parameter vector (integers stored as float64)
PP_POLICY = 0
PP_BINS = 1
PP_B = 2             # static B, or the pinned b_target (0: not pinned)
PP_MAX_CAND = 3
PP_SELECT = 4
PP_WARMUP = 5        # warm-up window of Algorithm 6, requests
PP_MEMORY_ON = 6
PP_SERVERS = 7
PP_INTEGER = 8       # round lengths up to whole tokens
PP_PRED_SIGMA = 9    # log-normal predictor error; 0: oracle
PP_MODEL = 10        # MODEL_MAX, MODEL_LINEAR or MODEL_DECODE
N_PP = 11

# float statistics
F_FIRST_ARRIVAL = 0
F_LAST_COMPLETION = 1
F_BUSY = 2
F_SUM_LATENCY = 3
F_SUM_TTFT = 4
F_SUM_TBT_TOKENS = 5      # sum over output tokens of their decode time per token
F_TOKENS_OUT = 6
F_TOKENS_IN = 7
F_SLA_TOKENS = 8          # output tokens decoded slower than D_SLA
F_PEAK_TOKENS = 9
F_TOKEN_SECONDS = 10      # sum over batches of tokens x service time
F_SUM_B = 11
F_SUM_B2 = 12
F_WARMUP_TIME = 13
F_SUM_LATENCY2 = 14
N_F = 15

# integer statistics
I_COMPLETED = 0
I_BATCHES = 1
I_REJECTED = 2           # requests alone above the token capacity (never servable)
I_MEM_EXCEED = 3         # batches above the token capacity (memory constraint off)
I_SLA_REQUESTS = 4       # requests decoded slower than D_SLA
I_TS_COUNT = 5
I_TS_STRIDE = 6
N_I = 7

# time-series columns
TS_TIME = 0
TS_B_TARGET = 1
TS_B_LOW = 2
TS_B_HIGH = 3
TS_TAU_AVG = 4
TS_BIN = 5
TS_SIZE = 6
N_TS_FIXED = 7           # then one queue length per bin


@njit(cache=CACHE)
def _round_lengths(x, m, integer):
    if integer:
        for j in range(m):
            v = math.ceil(x[j])
            x[j] = v if v >= 1.0 else 1.0


@njit(cache=CACHE)
def _grow(q, head, size, K, cap):
    """Double the ring buffers' capacity, unrolling each bin's ring."""
    new = np.empty((q.shape[0], K, 2 * cap), np.float64)
    for f in range(q.shape[0]):
        for b in range(K):
            for j in range(size[b]):
                new[f, b, j] = q[f, b, (head[b] + j) & (cap - 1)]
    for b in range(K):
        head[b] = 0
    return new


# queue fields
Q_ARRIVAL = 0
Q_PROMPT = 1
Q_OUTPUT = 2
Q_PRED = 3
Q_INDEX = 4
N_Q = 5


@njit(cache=CACHE)
def _rebin(q, head, size, window, K, edges_lo, edges_hi):
    """Algorithm 6 on the warm-up window, then bin 0's queue (every request
    so far) re-binned by each waiting request's own prediction: no future
    is used.  No bin receives more than the requests bin 0 held, so none
    overflows.  (A function of its own: an array allocated in the event loop
    would cost reference counting on every arrival.)"""
    ctl_.equal_mass_edges(window, K, edges_lo, edges_hi)
    mask = q.shape[2] - 1
    cnt0 = size[0]
    tmp = np.empty((N_Q, cnt0), np.float64)
    for j in range(cnt0):
        for f in range(N_Q):
            tmp[f, j] = q[f, 0, (head[0] + j) & mask]
    size[0] = 0
    head[0] = 0
    for j in range(cnt0):
        b = ctl_.partition_tiled(tmp[Q_PRED, j], edges_lo, edges_hi, K)
        sl = (head[b] + size[b]) & mask
        for f in range(N_Q):
            q[f, b, sl] = tmp[f, j]
        size[b] += 1


# the loop state dynamic_kernel keeps between its calls (it returns when a queue is full)
L_T = 0           # the arrival clock, s
L_SEG = 1         # its piecewise-Poisson rate segment
L_I = 2           # next request to arrive
L_JJ = 3          # its place in the current block
L_M = 4           # requests in the current block
L_RR = 5          # round-robin pointer of Algorithm 5
L_TS_SEEN = 6     # batches offered to the time series
N_L = 7

# per-server batch aggregates, rows of s_f
SF_SERVICE = 0
SF_TBT = 1
SF_SUM_P = 2
SF_SUM_O = 3
SF_MAX_O = 4
SF_M2 = 5
N_SF = 6


#: dynamic_kernel's return codes
DONE = 0
QUEUE_FULL = 1
STOPPED = 2


def run_kernel(args, bins, servers, warmup, stop):
    """Simulate: :func:`dynamic_kernel` on ``args`` (its arguments up to
    ``b_tokens``, outputs written in place) and a fresh workspace for ``bins``
    bins, ``servers`` servers and a warm-up window of ``warmup`` requests.
    Returns False if ``stop[0]`` was set (the outputs are then incomplete).

    The kernel returns whenever an arrival finds its bin's ring buffer full;
    the buffers are then doubled here and it resumes where it stopped.
    Growing the queue out here keeps the queue array a plain argument of the
    event loop, never rebound there: numba would otherwise count references
    to it on every arrival (about half of the kernel's time).
    """
    ws = [np.empty((N_Q, bins, 1024)), np.zeros(bins, np.int64), np.zeros(bins, np.int64),
          np.empty(max(warmup, 1)), np.zeros(servers), np.zeros(servers, np.bool_),
          np.zeros(servers, np.int64), np.zeros(servers, np.int64), np.zeros((N_SF, servers)),
          np.empty(BLOCK), np.empty(BLOCK), np.empty(BLOCK), np.empty(BLOCK), np.zeros(N_L)]
    while True:
        code = dynamic_kernel(*args, *ws, stop)
        if code == DONE:
            return True
        if code == STOPPED:
            return False
        ws[0] = _grow(ws[0], ws[1], ws[2], bins, ws[0].shape[2])


@njit(cache=CACHE, nogil=True)
def dynamic_kernel(
    n, arrival_kind, rate, arrival_times, pw_rates, pw_ends,
    prompt_kind, prompt_params, prompt_values, output_kind, output_params, output_values,
    gen_arrival, gen_output, gen_prompt, gen_pred,
    pp, ccfg, mcfg, bin_b_max, sm,
    keep, keep_batches,
    fstats, istats, hist, size_hist, ts, ctl, st, edges_lo, edges_hi,
    group_latency, group_count,
    r_arrival, r_prompt, r_output, r_pred, r_bin, r_batch, r_start, r_completion, r_ttft,
    b_start, b_bin, b_size, b_target_out, b_mem_out, b_sla_out, b_service, b_tokens,
    q, head, size, window, free_at, busy, s_n, s_bin, s_f, blk_t, blk_p, blk_o, blk_r, loop, stop,
):
    """Simulate ``n`` requests under the policy in ``pp``; outputs are written
    in place.  The arguments after ``b_tokens`` are the event loop's
    workspace (see :func:`run_kernel`): the per-bin ring buffers, the
    warm-up window, the servers, the draw blocks and the loop state, from
    which a call resumes.  Returns QUEUE_FULL when it stopped because an
    arrival found its bin's buffer full (nothing of that arrival done yet),
    STOPPED once ``stop[0]`` is nonzero (checked at every block of draws and
    every 4096 batches: the caller's Ctrl-C; the kernel runs without the GIL
    so that the caller's thread can take the signal meanwhile), DONE at the
    end.  The server arrays need at most ``n`` entries (more servers are
    never all busy), the warm-up window at most ``n``.
    ``fstats[F_LAST_COMPLETION]`` must start at -inf and
    ``istats[I_TS_STRIDE]`` at 1; with one bin its edges are [0, 10000)."""
    policy = np.int64(pp[PP_POLICY])
    K = np.int64(pp[PP_BINS])
    pin = np.int64(pp[PP_B])
    max_cand = np.int64(pp[PP_MAX_CAND])
    select = np.int64(pp[PP_SELECT])
    warmup = np.int64(pp[PP_WARMUP])
    memory_on = pp[PP_MEMORY_ON] != 0.0
    n_srv = np.int64(pp[PP_SERVERS])
    integer = pp[PP_INTEGER] != 0.0
    sigma = pp[PP_PRED_SIGMA]
    model = np.int64(pp[PP_MODEL])
    eta = mcfg[ctl_.MC_ETA]
    # the SLA constraint tau <= D_SLA + eps_D (specification, Algorithm 2)
    d_sla = ccfg[ctl_.CC_D_SLA] + ccfg[ctl_.CC_EPS_D]
    G = group_latency.shape[0]
    TSN = ts.shape[0]
    # the controller's configuration, as the scalars its kernel forms take
    mem_variant = mcfg[ctl_.MC_VARIANT]
    mem_z = mcfg[ctl_.MC_Z]
    mem_default = mcfg[ctl_.MC_DEFAULT_TOKENS]
    mem_b_min = mcfg[ctl_.MC_B_MIN]
    mem_b_max = mcfg[ctl_.MC_B_MAX]
    sla_target = ccfg[ctl_.CC_D_SLA]
    sla_eps = ccfg[ctl_.CC_EPS_D]
    sla_b_min = ccfg[ctl_.CC_B_MIN]
    sla_b_max = ccfg[ctl_.CC_B_MAX]
    sla_alpha = ccfg[ctl_.CC_ALPHA]
    sla_delta = ccfg[ctl_.CC_DELTA]
    multiplicative = ccfg[ctl_.CC_VARIANT] == ctl_.CTL_VARIANT_MULTIPLICATIVE
    ema = ccfg[ctl_.CC_EMA]

    # per-bin FIFOs: ring buffers of the queue fields, of a power-of-two capacity
    cap = q.shape[2]
    mask = cap - 1
    queued = 0
    for b in range(K):
        queued += size[b]
    rr = np.int64(loop[L_RR])
    i = np.int64(loop[L_I])         # next request to arrive
    jj = np.int64(loop[L_JJ])       # its place in the current block
    m = np.int64(loop[L_M])         # requests in the current block
    # Algorithm 6's warm-up: bins are used once `warmup` predictions are seen
    binned = K == 1 or policy != POL_MB_DYNAMIC or i >= warmup

    # servers: free time, busy flag, and the aggregates of their batch that
    # the feedback reads; (t_next, s_next) is the first completion, the lowest
    # server index among ties (s_next = -1: every server is free)
    in_service = 0
    n_free = 0
    s_next = -1
    t_next = np.inf
    for k in range(n_srv):
        if busy[k]:
            in_service += s_n[k]
            if free_at[k] < t_next:
                t_next = free_at[k]
                s_next = k
        else:
            n_free += 1

    # the statistics, accumulated in locals (registers) and stored on return
    sum_latency = fstats[F_SUM_LATENCY]
    sum_latency2 = fstats[F_SUM_LATENCY2]
    sum_ttft = fstats[F_SUM_TTFT]
    busy_time = fstats[F_BUSY]
    tokens_out = fstats[F_TOKENS_OUT]
    tokens_in = fstats[F_TOKENS_IN]
    sum_tbt_tokens = fstats[F_SUM_TBT_TOKENS]
    token_seconds = fstats[F_TOKEN_SECONDS]
    peak_tokens = fstats[F_PEAK_TOKENS]
    sum_b = fstats[F_SUM_B]
    sum_b2 = fstats[F_SUM_B2]
    sla_tokens = fstats[F_SLA_TOKENS]
    last_completion = fstats[F_LAST_COMPLETION]
    completed = istats[I_COMPLETED]
    rejected = istats[I_REJECTED]
    mem_exceed = istats[I_MEM_EXCEED]
    sla_requests = istats[I_SLA_REQUESTS]
    n_batches = istats[I_BATCHES]
    ts_stride = istats[I_TS_STRIDE]
    ts_count = istats[I_TS_COUNT]
    ts_seen = np.int64(loop[L_TS_SEEN])

    t = loop[L_T]
    seg = np.int64(loop[L_SEG])
    inv_rate = 1.0 / rate if rate > 0.0 else 0.0

    code = DONE
    while True:
        if jj == m and i < n:
            if stop[0] != 0:
                code = STOPPED
                break
            # 1. the next block of draws, one stream at a time
            i0 = i
            m = min(BLOCK, n - i0)
            jj = 0
            t, seg = _draw_arrivals(arrival_kind, t, inv_rate, arrival_times, i0, m, gen_arrival, blk_t,
                                    pw_rates, pw_ends, seg)
            if i0 == 0:
                fstats[F_FIRST_ARRIVAL] = blk_t[0]
            _draw_block(output_kind, output_params, output_values, i0, m, gen_output, blk_o)
            _draw_block(prompt_kind, prompt_params, prompt_values, i0, m, gen_prompt, blk_p)
            _round_lengths(blk_o, m, integer)
            _round_lengths(blk_p, m, integer)
            if sigma > 0.0:
                for j in range(m):
                    blk_r[j] = blk_o[j] * math.exp(sigma * gen_pred.standard_normal())
                _round_lengths(blk_r, m, integer)
            else:
                for j in range(m):
                    blk_r[j] = blk_o[j]
        t_arr = blk_t[jj] if i < n else np.inf
        s = s_next
        if s < 0 and i >= n:
            break
        if s >= 0 and t_next <= t_arr:
            # 2a. a completion: Algorithm 7's feedback, in time order
            now = t_next
            in_service -= s_n[s]
            if policy != POL_STATIC:
                bb = s_bin[s]
                (st[bb, ctl_.ST_AVG_PROMPT], st[bb, ctl_.ST_AVG_OUTPUT], st[bb, ctl_.ST_COUNT],
                 st[bb, ctl_.ST_MEAN_TOKENS], st[bb, ctl_.ST_M2_TOKENS], ctl[bb, ctl_.CTL_TAU_AVG],
                 ctl[bb, ctl_.CTL_B_AVG]) = ctl_.feedback_core(
                    s_n[s], s_f[SF_SUM_P, s], s_f[SF_SUM_O, s], s_f[SF_M2, s], s_f[SF_MAX_O, s],
                    s_f[SF_SERVICE, s], s_f[SF_TBT, s], ema, st[bb, ctl_.ST_AVG_PROMPT],
                    st[bb, ctl_.ST_AVG_OUTPUT], st[bb, ctl_.ST_COUNT], st[bb, ctl_.ST_MEAN_TOKENS],
                    st[bb, ctl_.ST_M2_TOKENS], ctl[bb, ctl_.CTL_TAU_AVG], ctl[bb, ctl_.CTL_B_AVG])
                ctl[bb, ctl_.CTL_N_DECODE] = float(in_service)
                ctl[bb, ctl_.CTL_UPDATES] += 1.0
            busy[s] = False
            n_free += 1
            s_next = -1
            t_next = np.inf
            for k in range(n_srv):
                if busy[k] and free_at[k] < t_next:
                    t_next = free_at[k]
                    s_next = k
        else:
            # 2b. an arrival joins its bin (Algorithm 4), or bin 0 during warm-up;
            # while every server is busy, so do all the arrivals of this block
            # before the first completion (which wins ties), in one loop
            while True:
                now = blk_t[jj]
                pred = blk_r[jj]
                if keep:
                    r_arrival[i] = now
                    r_prompt[i] = blk_p[jj]
                    r_output[i] = blk_o[jj]
                    r_pred[i] = pred
                if binned:
                    b = ctl_.partition_tiled(pred, edges_lo, edges_hi, K) if K > 1 else 0
                else:
                    b = 0
                    window[i] = pred
                if size[b] == cap:
                    code = QUEUE_FULL
                    break
                # unsigned indices: no negative-index wraparound code
                ub = np.uint64(b)
                slot = np.uint64((head[b] + size[b]) & mask)
                q[Q_ARRIVAL, ub, slot] = now
                q[Q_PROMPT, ub, slot] = blk_p[jj]
                q[Q_OUTPUT, ub, slot] = blk_o[jj]
                q[Q_PRED, ub, slot] = pred
                q[Q_INDEX, ub, slot] = i
                size[b] += 1
                queued += 1
                if not binned and i + 1 == warmup:
                    _rebin(q, head, size, window[:warmup], K, edges_lo, edges_hi)
                    fstats[F_WARMUP_TIME] = now
                    binned = True
                i += 1
                jj += 1
                if n_free > 0 or jj == m or blk_t[jj] >= t_next:
                    break
            if code == QUEUE_FULL:
                break
        # 3. free servers form batches, once every event of this instant is in
        if queued == 0 or n_free == 0:
            continue
        if i < n:
            if jj < m:
                nxt = blk_t[jj]
            elif arrival_kind == ARR_SATURATED:
                nxt = 0.0
            elif arrival_kind == ARR_REPLAY:
                nxt = arrival_times[i]
            else:
                nxt = np.inf  # a continuous draw ties with probability 0
            if nxt <= now:
                continue
        for k in range(n_srv):
            if queued == 0:
                break
            if busy[k]:
                continue
            # form one batch on the free server k at time now
            found = False
            b = 0
            nb = 0
            target = 0
            bm = -1
            bs = -1
            sum_prompt = 0.0
            sum_out = 0.0
            max_out = 0.0
            max_seq = 0.0
            while queued > 0:
                # Algorithm 5, step 1: the bin
                if K == 1:
                    b = 0
                elif select == SEL_ROUND_ROBIN:
                    b = -1
                    for off in range(K):
                        idx = rr + off  # (rr + off) % K, without a division
                        if idx >= K:
                            idx -= K
                        if size[idx] > 0:
                            b = idx
                            rr = idx + 1 if idx + 1 < K else 0
                            break
                else:
                    b = 0
                    for idx in range(1, K):
                        if size[idx] > size[b]:
                            b = idx
                # step 2: candidates, the head of that bin only
                n_cand = min(max_cand, size[b])
                # step 3 (Algorithm 3): the target size
                bm = -1
                bs = -1
                if policy == POL_STATIC:
                    target = pin
                else:
                    # (a per-bin limit only for the multi-bin policy)
                    limit = bin_b_max[b] if policy == POL_MB_DYNAMIC else 0.0
                    bm = ctl_.b_mem_core(eta, mem_variant, mem_z, mem_default, mem_b_min, mem_b_max,
                                         st[b, ctl_.ST_AVG_PROMPT], st[b, ctl_.ST_AVG_OUTPUT], st[b, ctl_.ST_COUNT],
                                         st[b, ctl_.ST_MEAN_TOKENS], st[b, ctl_.ST_M2_TOKENS], limit)
                    bs, ctl[b, ctl_.CTL_B_LOW], ctl[b, ctl_.CTL_B_HIGH] = ctl_.b_sla_core(
                        ctl[b, ctl_.CTL_B_LOW], ctl[b, ctl_.CTL_B_HIGH], ctl[b, ctl_.CTL_TAU_AVG],
                        ctl[b, ctl_.CTL_B_AVG], ctl[b, ctl_.CTL_N_DECODE], ctl[b, ctl_.CTL_UPDATES],
                        sla_target, sla_eps, sla_b_min, sla_b_max, sla_alpha, sla_delta, multiplicative)
                    if pin > 0:
                        target = pin
                    elif memory_on:
                        target = min(bm, bs)
                    else:
                        target = bs
                nb = min(target, n_cand)
                # the candidates' tokens, sums and maxima, in one pass
                ub = np.uint64(b)
                h0 = head[b]
                tokens = 0.0
                sum_prompt = 0.0
                sum_out = 0.0
                max_out = 0.0
                max_seq = 0.0
                for j in range(nb):
                    sl = np.uint64((h0 + j) & mask)
                    p = q[Q_PROMPT, ub, sl]
                    o = q[Q_OUTPUT, ub, sl]
                    tokens += p + o
                    sum_prompt += p
                    sum_out += o
                    if o > max_out:
                        max_out = o
                    if p + o > max_seq:
                        max_seq = p + o
                if memory_on and policy != POL_STATIC:
                    # Algorithm 3, step 3: drop the last candidates while over capacity
                    nb0 = nb
                    while nb > 0 and not ctl_.check_memory(tokens, eta):
                        sl = np.uint64((h0 + nb - 1) & mask)
                        tokens -= q[Q_PROMPT, ub, sl] + q[Q_OUTPUT, ub, sl]
                        nb -= 1
                    if nb == 0:
                        # the head request alone exceeds the capacity: it can never be
                        # served, so it leaves the queue as rejected
                        head[b] = (h0 + 1) & mask
                        size[b] -= 1
                        queued -= 1
                        rejected += 1
                        continue
                    if nb < nb0:
                        # the sums again, over the members kept (rare; the batch
                        # pass above stays a single one in the common case)
                        sum_prompt = 0.0
                        sum_out = 0.0
                        max_out = 0.0
                        max_seq = 0.0
                        for j in range(nb):
                            sl = np.uint64((h0 + j) & mask)
                            p = q[Q_PROMPT, ub, sl]
                            o = q[Q_OUTPUT, ub, sl]
                            sum_prompt += p
                            sum_out += o
                            if o > max_out:
                                max_out = o
                            if p + o > max_seq:
                                max_seq = p + o
                elif tokens > eta:
                    mem_exceed += 1
                found = True
                break
            if not found:
                break
            # the batch: the first nb of bin b (unused candidates stay at the front)
            bf = float(nb)
            if model == MODEL_MAX:
                service = sm[SM_BASE] + sm[SM_PER_TOKEN] * max_out
                tbt = 0.0
                per_token = service / max(max_out, 1.0)
                ttft = per_token
            elif model == MODEL_LINEAR:
                service = sm[SM_BASE] + sm[SM_ALPHA] * max_seq * (1.0 + sm[SM_BETA] * (bf - 1.0) / bf)
                tbt = 0.0
                per_token = service / max(max_out, 1.0)
                ttft = per_token
            else:
                tbt = ctl_.decode_tbt(sm[SM_TBT_BETA], sm[SM_TBT_GAMMA], bf)
                prefill = sm[SM_PREFILL] * sum_prompt
                service = prefill + tbt * max_out
                per_token = tbt
                # (a batch whose outputs are all under one token ends sooner)
                ttft = min(prefill + tbt, service)
            C = now + service
            if C > last_completion:
                last_completion = C
            violating = per_token > d_sla

            # the members' latencies, and their tokens' deviations for the feedback
            mean_tok = (sum_prompt + sum_out) / bf
            m2 = 0.0
            sum_lat = 0.0
            sum_lat2 = 0.0
            sum_arr = 0.0
            ub = np.uint64(b)
            h0 = head[b]
            for j in range(nb):
                sl = np.uint64((h0 + j) & mask)
                a = q[Q_ARRIVAL, ub, sl]
                lat = C - a
                sum_lat += lat
                sum_lat2 += lat * lat
                sum_arr += a
                h = (_float_bits(lat) >> _HIST_SHIFT) - _HIST_BASE
                h = min(max(h, 0), HIST_SIZE - 1)
                hist[h] += 1
                d = q[Q_PROMPT, ub, sl] + q[Q_OUTPUT, ub, sl] - mean_tok
                m2 += d * d
                if keep:
                    idx = np.int64(q[Q_INDEX, ub, sl])
                    r_bin[idx] = b
                    r_batch[idx] = n_batches
                    r_start[idx] = now
                    r_completion[idx] = C
                    r_ttft[idx] = now - a + ttft
            sum_latency += sum_lat
            sum_latency2 += sum_lat2
            sum_ttft += bf * (now + ttft) - sum_arr
            # batch-means group of the batch: that of its first member's arrival index
            g = (np.int64(q[Q_INDEX, ub, np.uint64(h0)]) * G) // n
            group_latency[g] += sum_lat
            group_count[g] += nb
            head[b] = (h0 + nb) & mask
            size[b] -= nb
            queued -= nb

            busy_time += service
            tokens_out += sum_out
            tokens_in += sum_prompt
            sum_tbt_tokens += per_token * sum_out
            tok = sum_prompt + sum_out
            token_seconds += tok * service
            if tok > peak_tokens:
                peak_tokens = tok
            sum_b += bf
            sum_b2 += bf * bf
            if violating:
                sla_tokens += sum_out
                sla_requests += nb
            completed += nb
            size_hist[min(nb, size_hist.shape[0] - 1)] += 1
            if keep_batches:
                b_start[n_batches] = now
                b_bin[n_batches] = b
                b_size[n_batches] = nb
                b_target_out[n_batches] = target
                b_mem_out[n_batches] = bm
                b_sla_out[n_batches] = bs
                b_service[n_batches] = service
                b_tokens[n_batches] = tok

            # downsampled time series: every ts_stride-th batch; when the buffer is
            # full, keep every other row and double the stride
            if ts_seen & (ts_stride - 1) == 0:  # the stride is a power of two
                if ts_count == TSN:
                    for r in range(TSN // 2):
                        for c in range(ts.shape[1]):
                            ts[r, c] = ts[2 * r, c]
                    ts_count = TSN // 2
                    ts_stride *= 2
                if ts_seen & (ts_stride - 1) == 0:
                    ts[ts_count, TS_TIME] = now
                    ts[ts_count, TS_B_TARGET] = target
                    ts[ts_count, TS_B_LOW] = ctl[b, ctl_.CTL_B_LOW]
                    ts[ts_count, TS_B_HIGH] = ctl[b, ctl_.CTL_B_HIGH]
                    ts[ts_count, TS_TAU_AVG] = ctl[b, ctl_.CTL_TAU_AVG]
                    ts[ts_count, TS_BIN] = b
                    ts[ts_count, TS_SIZE] = nb
                    for kb in range(K):
                        ts[ts_count, N_TS_FIXED + kb] = size[kb]
                    ts_count += 1
            ts_seen += 1

            busy[k] = True
            free_at[k] = C
            n_free -= 1
            if C < t_next or (C == t_next and k < s_next):
                t_next = C
                s_next = k
            s_n[k] = nb
            s_bin[k] = b
            s_f[SF_SERVICE, k] = service
            s_f[SF_TBT, k] = tbt
            s_f[SF_SUM_P, k] = sum_prompt
            s_f[SF_SUM_O, k] = sum_out
            s_f[SF_MAX_O, k] = max_out
            s_f[SF_M2, k] = m2
            in_service += nb
            n_batches += 1
            if n_batches & 4095 == 0 and stop[0] != 0:
                # (a long drain after the last arrival draws no blocks)
                code = STOPPED
                break
        if code == STOPPED:
            break

    fstats[F_SUM_LATENCY] = sum_latency
    fstats[F_SUM_LATENCY2] = sum_latency2
    fstats[F_SUM_TTFT] = sum_ttft
    fstats[F_BUSY] = busy_time
    fstats[F_TOKENS_OUT] = tokens_out
    fstats[F_TOKENS_IN] = tokens_in
    fstats[F_SUM_TBT_TOKENS] = sum_tbt_tokens
    fstats[F_TOKEN_SECONDS] = token_seconds
    fstats[F_PEAK_TOKENS] = peak_tokens
    fstats[F_SUM_B] = sum_b
    fstats[F_SUM_B2] = sum_b2
    fstats[F_SLA_TOKENS] = sla_tokens
    fstats[F_LAST_COMPLETION] = last_completion
    istats[I_COMPLETED] = completed
    istats[I_REJECTED] = rejected
    istats[I_MEM_EXCEED] = mem_exceed
    istats[I_SLA_REQUESTS] = sla_requests
    istats[I_BATCHES] = n_batches
    istats[I_TS_COUNT] = ts_count
    istats[I_TS_STRIDE] = ts_stride
    loop[L_T] = t
    loop[L_SEG] = seg
    loop[L_I] = i
    loop[L_JJ] = jj
    loop[L_M] = m
    loop[L_RR] = rr
    loop[L_TS_SEEN] = ts_seen
    return code




def warmup() -> None:
    """Compile the event kernel (or load it from the cache) on a tiny input."""
    import scipy.stats as st

    from ..arrivals import Poisson
    from ..policies import MultiBinDynamic
    from ..simulation import simulate
    from ..workload import Workload

    simulate(MultiBinDynamic(bins=2, warmup=4), arrivals=Poisson(rate=1.0),
             workload=Workload(prompt=st.uniform(1, 10), output=st.uniform(1, 10)), n=16, seed=0)
    # and the queue growth, which a run this small never needs
    _grow(np.zeros((N_Q, 1, 2)), np.zeros(1, np.int64), np.zeros(1, np.int64), 1, 2)
