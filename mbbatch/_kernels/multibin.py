"""The multi-bin batching kernel (Section 3 and Algorithm 1 of the paper).

One pass over the requests in arrival order, streaming: memory is
O(bins x batch_size + servers) unless per-request outputs are requested.

Random draws happen inside the loop in a fixed order that does not depend on
the policy: request ``i`` takes its inter-arrival gap from the arrival stream
and its service time from the service stream, whatever the bins, batch size or
servers.  One seed therefore gives every policy the same requests (common
random numbers).

Python calls :func:`run`; the arguments of :func:`multibin_kernel` are
declared once below (:data:`CONFIG`, :data:`INPUTS`, ...).  With
``base``, ``per_token`` and ``integer`` in :data:`CONFIG` the drawn or
replayed values are output lengths (tokens) and each request's service time
is ``base + per_token * length``: the max-of-members model
``MaxModel(base, per_token)`` of the token-level policies.  With
``iteration`` the values are output lengths, each request draws a prompt
too (the prompt stream, as the event kernel's requests do: one seed, the
same requests), and a batch takes the iteration model's time
(``IterationModel``: its prefill iteration, then one iteration per decode
step) over its members' running aggregates.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import (  # noqa: F401  (re-exported: lengths.py, results.py and a test read them from here)
    ARR_POISSON, ARR_REPLAY, ARR_SATURATED, ARRIVED, BLOCK, HIST_BASE, HIST_SHIFT, HIST_SIZE, SVC_EXPON,
    PRED_CONFUSION, PRED_ORACLE, PRED_REPLAY, STOP, STOP_SIZE, SVC_GAMMA, SVC_LOGNORM, SVC_REPLAY, SVC_UNIFORM,
    SVC_WEIBULL_MIN,
    check_stop, confuse_bins, draw_arrivals, draw_block, drawers, hist_bucket, kernel, member_work,
    padded_work, predict, ranked_expert_reads, round_lengths, step, token_service,
)
from .cost import FIELDS as COST_FIELDS, PER_EXPERT, iteration_times, prefill_square
from .layout import Arrays, Layout

#: the run's scalars.  ``servers`` 0 means infinitely many (Assumption 5.1);
#: ``keep`` 1 writes the per-request records.  Each drawn or replayed service
#: value x becomes ``base + per_token * x`` (x first rounded up to whole
#: tokens, at least 1, when ``integer`` is 1): a request's service time from
#: its output length under the max-of-members model.  ``base = 0,
#: per_token = 1, integer = 0`` leaves the values as they are.
#: ``iteration`` 1: the values are output lengths (``base = 0, per_token =
#: 1``), prompts are drawn (``prompt_kind``), and a batch takes the iteration
#: model's time (its coefficients, :data:`.cost.FIELDS`, and a mixture of
#: experts' ``expert_span``, ``expert_miss``; ``padded`` 1: finished members stay).
CONFIG = Layout("multi-bin run", ints=("n", "arrival_kind", "service_kind", "batch_size", "servers", "keep",
                                       "integer", "predictor", "iteration", "padded", "prompt_kind"),
                floats=("rate", "max_wait", "base", "per_token", "predictor_param", *COST_FIELDS, "expert_span",
                        "expert_miss"))

#: read-only inputs: replayed arrival times (s), the arrival process's
#: parameters and change times (:func:`~.common.draw_arrivals`), the service
#: distribution's (loc, scale[, shape]) or replayed service values, the
#: k + 1 bin edges, the given predictions, and the prompt lengths' (loc,
#: scale[, shape]) or replayed values (read with ``iteration`` only)
INPUTS = Arrays("MultiBinInputs", __name__, readonly=True, arrival_times=np.float64, arrival_params=np.float64,
                arrival_ends=np.float64, service_params=np.float64, service_values=np.float64, edges=np.float64,
                predictions=np.float64, prompt_params=np.float64, prompt_values=np.float64)
MultiBinInputs = INPUTS.type

#: the random streams: arrival gaps, service times, the predictor's errors
#: and the prompt lengths (drawn with ``iteration`` only)
MultiBinStreams = namedtuple("MultiBinStreams", ("arrival", "service", "prediction", "prompt"))

#: the statistics (:data:`MultiBinOutputs` ``ints`` and ``floats``)
STATS = Layout("multi-bin statistics", ints=("completed", "batches", "excluded"),
               floats=("first_arrival", "last_completion",
                       "busy",              # summed batch service time (server-seconds busy)
                       "sum_latency",
                       "sum_fill_wait",     # request arrival -> its batch is ready
                       "sum_queue_wait",    # batch ready -> batch starts service, per request
                       "busy_sq"))          # summed squared batch service time
#: the outputs; group g of the batch-means statistics holds the batches whose
#: last member has arrival index i with g = i * G // n
OUTPUTS = Arrays("MultiBinOutputs", __name__, ints=np.int64, floats=np.float64, batches_per_bin=np.int64,
                 group_latency=np.float64, group_count=np.int64, group_batch_wait=np.float64,
                 group_batches=np.int64, hist=np.int64, bin_completed=np.int64, bin_latency=np.float64)
MultiBinOutputs = OUTPUTS.type

#: per-request records (``keep``: n of them, else 0): ``REQUESTS.records(n)``;
#: completion NaN and batch -1 for requests left in a partial batch
REQUESTS = Layout("multi-bin requests", ints=("bin", "batch"),
                  floats=("arrival", "service", "predicted", "completion"))

#: the kernel's scratch arrays.  Bin b's partial batch occupies
#: [b * stride, (b + 1) * stride) of the buf_ arrays, stride = min(B, n);
#: first[b] is the index of bin b's oldest request (its partial batch's
#: place in arrival order); heap holds the servers' free times when
#: 1 < servers < inf; draws the addresses of the arrival, service, prompt
#: and prediction drawers (:func:`~.common.drawers`); with ``iteration``,
#: block_prompt holds the block's prompts and sum_prompt, seq_steps and
#: ctx_steps each bin's partial batch's summed prompts and decode work
#: (:func:`~.common.member_work`), and for a mixture of experts buf_output
#: its members' output lengths (beside buf_arrival).
WORKSPACE = Arrays("MultiBinWorkspace", __name__, buf_arrival=np.float64, buf_index=np.int64,
                   count=np.uint64, first=np.int64, max_service=np.float64, lat=np.float64, hidx=np.uint64,
                   block_time=np.float64, block_bin=np.uint32, block_service=np.float64, block_pred=np.float64,
                   heap=np.float64, draws=np.int64, block_prompt=np.float64, sum_prompt=np.float64,
                   sq_prompt=np.float64, seq_steps=np.float64, ctx_steps=np.float64, buf_output=np.float64)
MultiBinWorkspace = WORKSPACE.type

C = CONFIG.index
S = STATS.index
RQ = REQUESTS.index

# the statistics' old names, which results.py reads
S_FIRST_ARRIVAL, S_LAST_COMPLETION, S_BUSY = S.first_arrival, S.last_completion, S.busy
S_SUM_LATENCY, S_SUM_FILL_WAIT, S_SUM_QUEUE_WAIT, S_BUSY_SQ = (S.sum_latency, S.sum_fill_wait,
                                                               S.sum_queue_wait, S.busy_sq)
I_COMPLETED, I_BATCHES, I_EXCLUDED = S.completed, S.batches, S.excluded
_HIST_BASE, _HIST_SHIFT = HIST_BASE, HIST_SHIFT

#: bins up to which a request's bin is the count of inner edges at or below
#: its service time (branch-free, vectorized); binary search above
LINEAR_BINNING_MAX = 16


def run(config, inputs: MultiBinInputs, streams: MultiBinStreams, stop: np.ndarray, groups: int):
    """Simulate the run ``config`` (:data:`CONFIG` ``.pack(...)``) on
    ``inputs`` (:data:`INPUTS` ``.pack(...)``), with ``groups`` batch-means
    groups.

    Returns ``(outputs, requests)``: a :data:`MultiBinOutputs` (the
    statistics as ``STATS.unpack((outputs.ints, outputs.floats))``) and the
    per-request records as ``{field: array}`` (:data:`REQUESTS` names the
    fields), or None without ``keep``.  Once ``stop[STOP]`` is set (the
    caller's Ctrl-C) the kernel returns early, its outputs incomplete; it
    writes the requests arrived so far to ``stop[ARRIVED]`` at each block.
    """
    check_stop(stop)
    cfg = CONFIG.unpack(config)
    n, B, servers = cfg["n"], cfg["batch_size"], cfg["servers"]
    k = inputs.edges.shape[0] - 1
    stride = min(B, n)
    ints, floats = STATS.zeros(last_completion=-np.inf)
    out = OUTPUTS.pack(ints=ints, floats=floats, batches_per_bin=np.zeros(k, np.int64),
                       group_latency=np.zeros(groups), group_count=np.zeros(groups, np.int64),
                       group_batch_wait=np.zeros(groups), group_batches=np.zeros(groups, np.int64),
                       hist=np.zeros(HIST_SIZE, np.int64), bin_completed=np.zeros(k, np.int64),
                       bin_latency=np.zeros(k))
    requests = REQUESTS.records(n if cfg["keep"] else 0)
    ws = WORKSPACE.pack(buf_arrival=np.empty(k * stride), buf_index=np.empty(k * stride, np.int64),
                        count=np.zeros(k, np.uint64), first=np.zeros(k, np.int64),
                        max_service=np.full(k, -np.inf), lat=np.empty(stride),
                        hidx=np.empty(stride, np.uint64), block_time=np.empty(BLOCK),
                        block_bin=np.empty(BLOCK, np.uint32), block_service=np.empty(BLOCK),
                        block_pred=np.empty(BLOCK),
                        heap=np.zeros(max(servers, 1)),
                        draws=drawers(cfg["arrival_kind"], cfg["service_kind"], cfg["prompt_kind"],
                                      predictor=cfg["predictor"]),
                        block_prompt=np.empty(BLOCK if cfg["iteration"] else 1),
                        sum_prompt=np.zeros(k), sq_prompt=np.zeros(k), seq_steps=np.zeros(k), ctx_steps=np.zeros(k),
                        buf_output=np.empty(k * stride if cfg["iteration"] and cfg["cost_per_expert"] > 0.0 else 1))
    # (the iteration model's coefficients, or None: the kernel compiled without its code)
    it = ((np.array([cfg[f] for f in COST_FIELDS]), cfg["expert_span"], cfg["expert_miss"]) if cfg["iteration"]
          else None)
    multibin_kernel(config, inputs, streams, out, requests, ws, stop, it)
    return out, (REQUESTS.rows(requests) if cfg["keep"] else None)


@step
def _fill(j0, m, i0, block_time, block_service, block_pred, block_bin, count, first, max_service, uB, uS,
          buf_arrival, keep, buf_index, r_i, r_f, deadline, max_wait, it, ws):
    """Add requests j0, j0+1, ... of the block to their bins' partial batches
    (arrival time kept, service time folded into the bin's running maximum;
    ``it``, the iteration model's ``(coefficients, expert_span,
    expert_miss)`` (:mod:`.cost`) or None: the output
    length is, and the prompt and decode work summed in ``ws``; a request's
    record gets its time alone, a batch of one).

    Returns ``(j, deadline)``: ``j`` is the index of the first request that
    fills a batch (its bin's count is reset), or ``-1 - j`` when request ``j``
    arrives after ``deadline``, the earliest time a partial batch must
    leave (``max_wait``), or ``m``.  ``deadline`` is updated as bins get their
    first member, whose index goes to ``first``.  Bin b's partial batch starts
    at ``b * uS`` of the buffers."""
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
            first[b] = i0 + np.int64(jj)
        buf_arrival[o] = t
        mx = max_service[b]
        max_service[b] = s if s > mx else mx
        alone = s
        if it is not None:
            p = ws.block_prompt[jj]
            dw, cw = member_work(p, s)
            ws.sum_prompt[b] += p
            ws.sq_prompt[b] += prefill_square(0.0, p)
            ws.seq_steps[b] += dw
            ws.ctx_steps[b] += cw
            if it[0][PER_EXPERT] > 0.0:
                ws.buf_output[o] = s
            if keep:
                alone = iteration_times(it[0], it[1], it[2], 1, p, prefill_square(0.0, p), s, dw, cw, p, 0.0)[0]
        if keep:
            i = i0 + np.int64(jj)
            buf_index[o] = i
            r_f[RQ.arrival, i] = t
            r_f[RQ.service, i] = alone
            r_f[RQ.predicted, i] = block_pred[jj]
            r_i[RQ.bin, i] = b
        c += one
        if c == uB:
            count[b] = 0
            return np.int64(jj), deadline
        count[b] = c
    return m, deadline


@kernel
def multibin_kernel(config, inputs, streams, out, requests, ws, stop, it):
    """Simulate ``n`` requests through multi-bin batching; outputs are
    written in place (``out.floats[S.last_completion]`` must start at -inf).
    ``it``: the iteration model's ``(coefficients, expert_span,
    expert_miss)`` (:mod:`.cost`), or None, the max-of-members model (numba
    prunes the iteration model's branches, each under ``if it is not
    None``, before typing: the paper's model compiles as if they were not
    there, and the iteration model's kernel on its first run).

    ``servers == 0`` means infinitely many servers (Assumption 5.1).  With
    ``max_wait`` finite a bin also releases a partial batch once its oldest
    request has waited ``max_wait`` (then nothing is left over); otherwise
    requests of a bin whose last batch never fills are counted as
    ``excluded`` and get no completion time.

    ``servers`` need be at most ``n`` (more are never all busy).  The kernel
    returns early, its outputs incomplete, once ``stop[STOP]`` is nonzero
    (checked at every block of draws, where ``stop[ARRIVED]`` gets the
    requests arrived so far): the caller's Ctrl-C.  It runs without
    the GIL, so the caller's thread can take the signal meanwhile.

    The hot loops index with unsigned integers: numba then emits no
    negative-index wraparound, which costs a third of the request loop.
    """
    ci, cf = config
    n = ci[C.n]
    B = ci[C.batch_size]
    servers = ci[C.servers]
    keep = ci[C.keep] != 0
    integer = ci[C.integer] != 0
    rate = cf[C.rate]
    max_wait = cf[C.max_wait]
    base = cf[C.base]
    per_token = cf[C.per_token]
    tokens = integer or base != 0.0 or per_token != 1.0
    padded = ci[C.padded] != 0
    predictor = ci[C.predictor]
    predictor_param = cf[C.predictor_param]
    # the arrays and streams
    arrival_times = inputs.arrival_times
    service_params = inputs.service_params
    service_values = inputs.service_values
    edges = inputs.edges
    gen_arrival = streams.arrival
    gen_service = streams.service
    gen_prediction = streams.prediction
    predictions = inputs.predictions
    ints = out.ints
    floats = out.floats
    batches_per_bin = out.batches_per_bin
    bin_completed = out.bin_completed
    bin_latency = out.bin_latency
    group_latency = out.group_latency
    group_count = out.group_count
    group_batch_wait = out.group_batch_wait
    group_batches = out.group_batches
    hist = out.hist
    r_i = requests[0]
    r_f = requests[1]
    buf_arrival = ws.buf_arrival
    buf_index = ws.buf_index
    count = ws.count
    first = ws.first
    max_service = ws.max_service
    lat = ws.lat
    hidx = ws.hidx
    block_time = ws.block_time
    block_bin = ws.block_bin
    block_service = ws.block_service
    block_pred = ws.block_pred
    heap = ws.heap
    draws = ws.draws

    k = edges.shape[0] - 1
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
    n_heap = servers if servers > 1 else 1
    free_at = 0.0
    inv_rate = 1.0 / rate if rate > 0.0 else 0.0
    seg = np.int64(0)  # not a literal: one compiled draw_arrivals
    t_switch = -1.0

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
            if stop[STOP] != 0:
                return
            stop[ARRIVED] = i0 + m
            i0 += m
            if i0 >= n:
                arrivals_over = True
            else:
                m = n - i0 if n - i0 < BLOCK else BLOCK
                jj = np.int64(0)
            # 1. draws, one stream at a time, in tight loops
            um = np.uint64(m)
            t, seg, t_switch = draw_arrivals(draws[0], t, inv_rate, arrival_times, i0, m, gen_arrival,
                                             block_time, inputs.arrival_params, inputs.arrival_ends, seg, t_switch)
            if i0 == 0:
                first_arrival = block_time[0]
            draw_block(draws[1], service_params, service_values, i0, m, gen_service, block_service)
            if tokens:
                token_service(block_service, m, base, per_token, integer)
            if it is not None:
                draw_block(draws[2], inputs.prompt_params, inputs.prompt_values, i0, m, streams.prompt,
                           ws.block_prompt)
                round_lengths(ws.block_prompt, m, integer)
            # what a request is binned by (it is served for block_service)
            predict(draws[3], predictor_param, predictions, i0, m, gen_prediction, block_service, block_pred)
            if predictor == PRED_REPLAY and tokens:
                token_service(block_pred, m, base, per_token, integer)

            # 2. bins: bin b holds edges[b] <= s < edges[b+1], the last one closed
            # above.  Counting the inner edges passed is branch-free and
            # vectorizes; binary search for many bins.
            if k <= LINEAR_BINNING_MAX:
                for j in range(um):
                    block_bin[j] = 0
                for q in range(1, k):
                    e = edges[q]
                    for j in range(um):
                        block_bin[j] += block_pred[j] >= e
            else:
                for j in range(um):
                    s = block_pred[j]
                    lo = 0
                    hi = k - 1
                    while lo < hi:
                        mid = (lo + hi + 1) >> 1
                        if s >= edges[mid]:
                            lo = mid
                        else:
                            hi = mid - 1
                    block_bin[j] = lo
            if predictor == PRED_CONFUSION:
                confuse_bins(block_bin, m, k, predictor_param, gen_prediction)

        # 3. requests in arrival order; _fill returns at each full batch and
        # before the first arrival past a partial batch's deadline
        if not arrivals_over:
            jj, deadline = _fill(jj, m, i0, block_time, block_service, block_pred, block_bin, count, first,
                                 max_service, uB, uS, buf_arrival, keep, buf_index, r_i, r_f, deadline, max_wait,
                                 it, ws)
            if jj == m:
                continue
        if arrivals_over or jj < 0:
            if deadline == np.inf:
                break
            # a partial batch leaves at its deadline: the bin whose oldest
            # member is oldest, the earlier arrival of two at the same time
            if jj < 0:
                jj = -1 - jj
            ready = deadline
            b = np.uint64(0)
            oldest = np.inf
            oldest_i = n
            for q in range(k):
                if count[q] > 0:
                    a = buf_arrival[q * stride]
                    if a < oldest or (a == oldest and first[q] < oldest_i):
                        oldest = a
                        oldest_i = first[q]
                        b = np.uint64(q)
            o = b * uS
            members = count[b]
            count[b] = 0
            i = i0 + jj if i0 + jj < n else n - 1
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
        # batch service time = max of the members' (the iteration model: its
        # prefill iteration, then one per decode step of its longest member)
        S_b = max_service[b]
        max_service[b] = -np.inf
        if it is not None:
            sp = ws.sum_prompt[b]
            seq, ctx = (padded_work(members, sp, S_b) if padded else (ws.seq_steps[b], ws.ctx_steps[b]))
            reads = (ranked_expert_reads(ws.buf_output, np.int64(o), np.int64(-1), np.int64(members), S_b, padded,
                                         it[1], it[2]) if it[0][PER_EXPERT] > 0.0 else 0.0)
            S_b = iteration_times(it[0], it[1], it[2], members, sp, ws.sq_prompt[b], S_b, seq, ctx, sp, reads)[0]
            ws.sum_prompt[b] = 0.0
            ws.sq_prompt[b] = 0.0
            ws.seq_steps[b] = 0.0
            ws.ctx_steps[b] = 0.0

        if servers == 1:
            start = ready if ready > free_at else free_at
            free_at = start + S_b
        elif servers == 0:
            start = ready
        else:
            start = ready if ready > heap[0] else heap[0]
            # replace the root by the new free time and sift down
            v = start + S_b
            p = 0
            while True:
                l = 2 * p + 1  # noqa: E741  (the heap's left child)
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
        Cb = start + S_b
        if Cb > last_completion:
            last_completion = Cb
        busy += S_b
        busy_sq += S_b * S_b

        # member latencies, then their histogram buckets: both loops
        # vectorize; only the bucket increments stay scalar
        for j in range(members):
            lat[j] = Cb - buf_arrival[o + j]
        for j in range(members):
            hidx[j] = hist_bucket(lat[j])
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
                idx = buf_index[o + jm]
                r_f[RQ.completion, idx] = Cb
                r_i[RQ.batch, idx] = n_batches
        # lat_batch = nm*C - sum(arrivals), so the fill wait is nm*ready - sum(arrivals)
        nm = np.int64(members)
        sum_fill += lat_batch - nm * (Cb - ready)
        sum_latency += lat_batch
        sum_queue += nm * (start - ready)
        g = (i * G) // n
        group_latency[g] += lat_batch
        group_count[g] += nm
        group_batch_wait[g] += start - ready
        group_batches[g] += 1
        batches_per_bin[b] += 1
        bin_completed[b] += nm
        bin_latency[b] += lat_batch
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
    floats[S.first_arrival] = first_arrival
    floats[S.last_completion] = last_completion
    floats[S.busy] = busy
    floats[S.busy_sq] = busy_sq
    floats[S.sum_latency] = sum_latency
    floats[S.sum_fill_wait] = sum_fill
    floats[S.sum_queue_wait] = sum_queue
    ints[S.completed] = completed
    ints[S.batches] = n_batches
    ints[S.excluded] = excluded


def warmup() -> None:
    """Compile the kernel (or load it from the cache) on a tiny input: two
    bins of two, two servers, two requests."""
    config = CONFIG.zeros(n=2, arrival_kind=ARR_POISSON, service_kind=SVC_UNIFORM, batch_size=2, servers=2,
                          predictor=PRED_ORACLE, keep=1, rate=1.0, max_wait=np.inf, per_token=1.0,
                          prompt_kind=SVC_UNIFORM)
    inputs = INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                         service_params=np.array([1.0, 1.0]), predictions=np.empty(0),
                         service_values=np.empty(0), edges=np.array([1.0, 1.5, 2.0]),
                         prompt_params=np.array([1.0, 1.0]), prompt_values=np.empty(0))
    gen = np.random.default_rng(0)
    run(config, inputs, MultiBinStreams(gen, gen, gen, gen), np.zeros(STOP_SIZE, np.int64), groups=1)
