"""Event kernel of the batch-forming policies: static batching, dynamic
batching (Algorithms 1-3 and 7 of Pang, Li and Wang, 2025, arXiv:2503.05248) and
multi-bin dynamic batching (Algorithms 4-6 on top), without a GPU.

Requests carry prompt, output and predicted output lengths (tokens).  A batch
is formed whenever a server is free and requests are queued (at an arrival or
at a completion): no policy here waits for a batch to fill.  Controller
feedback (Algorithm 7) happens when a batch completes, in time order, so a
batch formed at time t sees exactly the feedback of the batches completed by t.

Memory is O(bins x queue + servers): the per-bin FIFOs are ring buffers
that grow with the backlog, and a server keeps only its batch's aggregates.

Python calls :func:`run`.  The event loop, :func:`dynamic_kernel`, reads as
its steps: draw a block of requests, an arrival, a completion, form a batch
(choose the bin, the target size, the candidates, the service time, serve
the members), each a function of its own that LLVM inlines into the loop
(see :mod:`.common`).  It returns to :func:`run` when a queue is full (the
queues grow there) and at the end of Algorithm 6's warm-up (the bin edges
are computed there, in numpy), and resumes where it stopped.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import types

from .common import (
    APART, ARR_POISSON, ARR_REPLAY, ARR_SATURATED, ARRIVED, BLOCK, HIST_SIZE, PRED_CONFUSION, PRED_ORACLE, STOP,
    STOP_SIZE, SVC_UNIFORM, check_stop, draw_arrivals, draw_block, drawers, helper, hist_bucket,
    by_address, compiled_apart, kernel, member_work, padded_work, predict, ranked_expert_reads, replay_time,
    round_lengths, step, subroutine,
)
from .controller import (
    BATCH_STATS, CONTROLLER, CTL_VARIANT_MULTIPLICATIVE, DEFAULT_EMA, DEFAULT_TOKENS, EDGE_MAX, MEMORY, SLA, A, C,
    M, T, controller_init, decode_tbt, equal_mass_edges, feedback_core,
)
from .cost import FIELDS as COST_FIELDS, N as N_COST, PER_EXPERT, PREFILL_ATTENTION, iteration_times, prefill_square
from .formation import (FORM_DYNAMIC, FORM_MULTIBIN, FORM_MULTIBIN_DYNAMIC, FORM_STATIC, SEL_ROUND_ROBIN, Rule,
                        form_batch, ordering)
from .layout import Arrays, Layout
from .programs import NO_CLOSED_LOOP, _before, _closed_call, _follow_ups, _heap_pop, _heap_push
from .queues import FIELDS, QUEUE_START, Q, doubling_bytes, grow, join, rebin
from .routing import (EN, ENGINES, ROUTE_NONE, TABLE, Router, engine_done, engine_formed, engine_of, engine_started,
                      remove_engine, route_call)

# the batch service models
MODEL_MAX = 0       # base + per_token * max output_len (the multi-bin paper's max)
MODEL_LINEAR = 1    # base + alpha * max_seq_len * (1 + beta (b-1)/b)
MODEL_DECODE = 2    # prefill_per_token * sum prompt + TBT(b) * max output_len
# Pang et al.'s calibrated model: base + TBT(b) * max_seq_len, fed back to the
# controller as TBT(b), as the uncalibrated 5.74 ms, or by the legacy rule (service / max output_len)
MODEL_CALIBRATED = 3
MODEL_CALIBRATED_UNCALIBRATED = 4
MODEL_CALIBRATED_LEGACY = 5
# an engine iteration's time, linear in its prefill tokens, decoded sequences and their context
# (service_models.IterationModel): a batch's prefill iteration, then one per decode step
MODEL_ITERATION = 6
#: ComputeDecodeTBT's ELSE branch (Pang et al., Algorithm 7): the decode time fed back
#: when the latency model is not calibrated, s/token
UNCALIBRATED_TBT = 0.00574

# --- the configuration: TokenConfig(run, policy, sla, memory, model), each
# an (ints, floats) pair from its layout's pack(); sla and memory are the
# controller's layouts (controller.SLA, controller.MEMORY)
RUN = Layout("token run", ints=("n", "arrival_kind", "prompt_kind", "output_kind",
                                "integer",          # round lengths up to whole tokens
                                "keep_requests", "keep_batches",
                                "predictor"),       # common.PRED_*: what a request is binned by
             floats=("rate",                        # requests/s (Poisson; the first piecewise rate)
                     "predictor_sigma",             # log-normal predictor error; 0: oracle
                     "predictor_p",                 # bin confusion: the true bin's probability
                     "ttft_slo",                    # the requests' objectives (goodput: inf, none), s
                     "tpot_slo"))                   # and s/token
POLICY = Layout("token policy", ints=("policy", "bins",
                                      "pin",        # static B, or the pinned b_target (0: not pinned)
                                      "max_candidates", "selection",
                                      "warmup",     # Algorithm 6's warm-up window, requests
                                      "memory_on",
                                      "servers",    # at most n (more are never all busy)
                                      "scratch"),   # floats of scratch the formation rule works in
                floats=("max_wait",))               # a request that waited this long goes first (inf: never)
#: a model uses its own fields (see the MODEL_ codes) and leaves the others 0
MODEL = Layout("service model", ints=("model",
                                      "padded"),    # IterationModel: finished members stay
               floats=("base", "per_token", "alpha", "beta", "prefill_per_token", "tbt_beta", "tbt_gamma",
                       *COST_FIELDS, "expert_span", "expert_miss"))
#: a cluster of ``engines`` engines, each running the policy on its own
#: queues and ``servers / engines`` servers, behind the router (``ROUTE_*``;
#: ``ROUTE_NONE``: one engine); ``threshold``: Autellix's largest small
#: request (prefill tokens); ``programs``: the program table's size (0:
#: every request its own one-call program, no table); ``kv_reuse`` 1: a call
#: on the engine holding its program's context prefills only its new tokens
#: ``calls``: a closed loop's calls per program (0: the programs' calls are
#: given in arrival order, open loop)
CLUSTER = Layout("cluster", ints=("engines", "router", "threshold", "programs", "kv_reuse", "calls"))
TokenConfig = namedtuple("TokenConfig", ("run", "policy", "sla", "memory", "model"))

#: read-only inputs: replayed arrival times (s), the piecewise-Poisson rates
#: and segment ends (the last one inf), each length's (loc, scale[, shape])
#: or replayed values (tokens), and the per-bin batch limits (<= 0: none)
INPUTS = Arrays("TokenInputs", __name__, readonly=True, arrival_times=np.float64, arrival_params=np.float64,
                arrival_ends=np.float64, predictions=np.float64, prompt_params=np.float64, prompt_values=np.float64,
                output_params=np.float64, output_values=np.float64, bin_b_max=np.float64)
TokenInputs = INPUTS.type
TokenStreams = namedtuple("TokenStreams", ("arrival", "output", "prompt", "prediction"))

# --- the outputs
STATS = Layout("token statistics",
               ints=("completed", "batches",
                     "rejected",       # requests alone above the token capacity (never servable)
                     "mem_exceed",     # batches above the token capacity (memory constraint off)
                     "sla_requests",   # requests decoded slower than D_SLA + eps_D
                     "sla_requests_dsla",  # requests decoded slower than D_SLA (Pang et al.'s SLA violation rate)
                     "ts_rows",        # rows of the time series in use
                     # a cluster's router: large requests (above the threshold), those the program
                     # table routed, calls with a context before them and those served on the engine
                     # holding it, requests re-routed from a removed engine, routing decisions
                     "large", "table_hits", "followups", "kv_hits", "rerouted", "routes",
                     "good"),          # requests within both their objectives (goodput)
               floats=("first_arrival", "last_completion", "busy", "sum_latency", "sum_ttft",
                       "sum_tbt_tokens",   # sum over output tokens of their decode time per token
                       "tokens_out",
                       "sla_tokens",       # output tokens decoded slower than D_SLA + eps_D
                       "peak_tokens",
                       "token_seconds",    # sum over batches of tokens x service time
                       "sum_b", "sum_b2",
                       "warmup_time",      # when Algorithm 6's edges were set (NaN: never)
                       "kv_recomputed",    # context tokens prefilled again (a call away from its context)
                       "sum_active_max",   # over routing decisions: the most active requests of an engine
                       "sum_active_mean"))  # ... and their mean over the registered engines
#: the time series' columns, then one queue length per bin
TIME_SERIES = Layout("time series", floats=("time", "b_target", "b_low", "b_high", "tau_avg", "bin",
                                            "batch_size"))
TS_QUEUE = TIME_SERIES.size   # the first queue column
#: ``ctl`` and ``st`` hold a controller.CONTROLLER and a controller.BATCH_STATS
#: row per bin; group g of the batch-means statistics holds the batches whose
#: first member has arrival index i with g = i * G // n.  ``hist``,
#: ``hist_ttft`` and ``hist_tbt`` are log-linear histograms (:func:`~.common.hist_bucket`)
#: of the latencies and the times to first token (a count per request) and of
#: the times between tokens: a batch's decode time per token, weighted by its
#: members' gaps between two tokens, ``max(output - 1, 0)`` each (fractional
#: for lengths that are not whole tokens: hence floats)
OUTPUTS = Arrays("TokenOutputs", __name__, ints=np.int64, floats=np.float64, hist=np.int64,
                 size_hist=np.int64, ts=(np.float64, 2), ctl=(np.float64, 2), st=(np.float64, 2),
                 edges_lo=np.float64, edges_hi=np.float64, group_latency=np.float64, group_count=np.int64,
                 bin_completed=np.int64, bin_latency=np.float64, hist_ttft=np.int64, hist_tbt=np.float64,
                 engine_completed=np.int64, engine_busy=np.float64)
TokenOutputs = OUTPUTS.type
#: per-request records (keep_requests; n of them, else 0): ``REQUESTS.records(n)``
REQUESTS = Layout("token requests", ints=("bin", "batch", "engine"),
                  floats=("arrival", "prompt", "output", "pred", "start", "completion", "ttft"))
#: per-batch records (keep_batches; n of them, else 0): ``BATCHES.records(n)``
BATCHES = Layout("token batches", ints=("bin", "size", "b_target", "b_mem", "b_sla"),
                 floats=("start", "service", "tokens"))

#: the servers, columns of ``servers_i`` and ``servers_f``: the batch in
#: service and the aggregates its feedback reads
SERVERS = Layout("servers", ints=("busy", "size",
                                 "bin",      # its batch's queue (engine x bins + bin)
                                 "orphan"),  # 1: its engine was removed while it served
                 floats=("free_at", "service", "tbt", "sum_prompt", "sum_output", "max_output", "m2"))
#: the event loop's state between two calls
LOOP = Layout("loop state", ints=("i",         # next request to arrive
                                  "jj",        # its place in the current block
                                  "m",         # requests in the current block
                                  "seg",       # the piecewise-Poisson rate segment, or the ON/OFF state
                                  "rr",        # round-robin pointer of Algorithm 5
                                  "ts_seen",   # batches offered to the time series
                                  "ts_stride",  # every ts_stride-th of them is kept
                                  "pending",   # 1: free servers form batches at `now` first
                                  "deferred",  # 1: free servers wait, with requests queued, for the end of `now`
                                  "key",       # the run's key of request_uniform (bin confusion)
                                  "ev",        # the next engine event
                                  "rr_route",  # the round-robin router's next engine
                                  "routed",    # request i's engine, routed before its queue was full (-1)
                                  "heap",      # closed-loop programs: calls waiting to arrive
                                  "joins"),    # requests that joined a queue (arrivals and reroutes)
              floats=("t",                     # the arrival clock, s
                      "now",                   # the time of the last event, s
                      "t_switch",              # the ON/OFF process's next change of state, s
                      "routed_prefill"))       # request i's prefill tokens, routed before its queue was full
#: a cluster's arrays, the kernel's last argument (None: one engine, and the
#: kernel compiled without the cluster's code): its configuration
#: (:data:`CLUSTER` ints), its programs (per request: its program, new
#: tokens, 1 on its program's last call; empty without programs), its
#: engine events (time, engine, 1 add / 0 remove; in time order), its
#: engines (:data:`ENGINES` rows) and its program table (:data:`TABLE` rows)
#: Closed-loop programs (``config`` calls C > 0) arrive in the kernel: call c
#: of program p (its id p C + c, per request in ``call``) arrives, for c > 0,
#: ``gap[p C + c]`` s after call c - 1 completes, program p's first call at
#: ``start[p]``; new tokens and outputs in ``new[p C + c]`` and ``out[p C + c]``;
#: the calls waiting to arrive in the heap ``(heap_t, heap_id)`` (by time,
#: then id).  Empty for given calls.
CLUSTER_ARRAYS = Arrays("ClusterArrays", __name__, config=np.int64, program=np.int64, new_tokens=np.float64,
                        session_end=np.int8, event_time=np.float64, event_engine=np.int64, event_add=np.int8,
                        eng=(np.int64, 2), table=(np.int64, 2), call=np.int64, start=np.float64, gap=np.float64,
                        new=np.float64, out=np.float64, heap_t=np.float64, heap_id=np.int64)
ClusterArrays = CLUSTER_ARRAYS.type
WORKSPACE = Arrays("TokenWorkspace", __name__, q=(np.float64, 3), qidx=(np.int64, 2), head=np.int64,
                   size=np.int64, window=np.float64, servers_i=(np.int64, 2), servers_f=(np.float64, 2),
                   blk=(np.float64, 2), loop_ints=np.int64, loop_floats=np.float64, draws=np.int64,
                   scratch=np.float64, steps=np.int64, timing=np.float64)
TokenWorkspace = WORKSPACE.type

R = RUN.index
P = POLICY.index
O = MODEL.index  # noqa: E741  (the layouts' one-letter indices)
S = STATS.index
TS = TIME_SERIES.index
RQ = REQUESTS.index
BT = BATCHES.index
SV = SERVERS.index
L = LOOP.index
CL = CLUSTER.index


#: dynamic_kernel's return codes
DONE = 0
QUEUE_FULL = 1      # an arrival found its bin's ring buffer full (nothing of it done yet)
WARMUP_DONE = 2     # the warm-up window is complete: Python sets the edges and re-bins
STOPPED = 3         # stop[STOP] was set

#: batches between two looks at the stop flag while no blocks are drawn
STOP_CHECK_BATCHES = 4096


class QueueOverflow(MemoryError):
    """The queues' ring buffers would outgrow the memory :func:`run` was
    told is available (an overloaded run's backlog): ``waiting`` requests
    were queued, and doubling the buffers needed ``needed`` more bytes
    (:func:`doubling_bytes`) than the ``limit`` available then."""

    def __init__(self, waiting: int, needed: int, limit: int):
        super().__init__(f"{waiting} requests waiting: doubling the queues needs {needed} bytes, beyond the "
                         f"{limit} available")
        self.waiting, self.needed, self.limit = waiting, needed, limit


def run(config: TokenConfig, inputs: TokenInputs, streams: TokenStreams, stop: np.ndarray, *, groups: int,
        ts_rows: int, key: int = 0, edges=None, cluster=None, available=None):
    """Simulate the run ``config`` on ``inputs`` (:data:`INPUTS` ``.pack(...)``)
    with ``groups`` batch-means groups and a time series of ``ts_rows`` rows.

    Returns ``(outputs, requests, batches)``: a :data:`TokenOutputs` (the
    statistics as ``STATS.unpack((outputs.ints, outputs.floats))``), and the
    per-request and per-batch records as ``{field: array}`` (None unless
    kept; :data:`REQUESTS` and :data:`BATCHES` name the fields).  Once
    ``stop[STOP]`` is set (the caller's Ctrl-C) the kernel returns early, its
    outputs incomplete.  ``key`` (a draw of the prediction stream) sets each
    request's uniform of bin confusion.  ``edges``, ``(lo, hi)``, sets the
    bins before the run (with a warm-up of 0 in ``config``).  ``cluster``,
    ``(config, programs, events)``: a cluster's :data:`CLUSTER`
    configuration (``pack()``'s pair), its programs (``{program, new_tokens,
    session_end}``, :data:`NO_PROGRAMS` without) and its engine events
    (``{event_time, event_engine, event_add}``); None: one engine.

    The kernel returns whenever an arrival finds its bin's ring buffer full;
    the buffers are then doubled here and it resumes where it stopped, or,
    if the doubled buffers (:func:`doubling_bytes`) would take more than
    ``available()`` bytes, asked at each doubling (the memory available
    then, so other processes' use counts too; None: no limit),
    :class:`QueueOverflow` is raised.
    Growing the queue out here keeps the queue array a plain argument of the
    event loop, never rebound there.  It also returns at the end of
    Algorithm 6's warm-up, for the bin edges (numpy: numba's sort would cost
    seconds of compile time).
    """
    check_stop(stop)
    rn, pol, sla = RUN.unpack(config.run), POLICY.unpack(config.policy), SLA.unpack(config.sla)
    md = MODEL.unpack(config.model)
    cl = CLUSTER.unpack(cluster[0]) if cluster is not None else {"engines": 1, "router": ROUTE_NONE, "programs": 0}
    n, c, E = rn["n"], pol["servers"], cl["engines"]
    # each engine's bins are queues of their own: engine e's bin b is queue e * bins + b
    K = pol["bins"] * E
    ints, floats = STATS.zeros(last_completion=-np.inf, warmup_time=np.nan)
    ctl = np.empty((K, CONTROLLER.size))
    controller_init(ctl, sla["b_min"], sla["b_max"])
    out = OUTPUTS.pack(ints=ints, floats=floats, hist=np.zeros(HIST_SIZE, np.int64),
                       # no batch holds more than n requests
                       size_hist=np.zeros(int(min(sla["b_max"], n)) + 1, np.int64),
                       ts=np.zeros((ts_rows, TS_QUEUE + pol["bins"] + (E if cluster is not None else 0))), ctl=ctl,
                       st=np.zeros((K, BATCH_STATS.size)), edges_lo=np.zeros(pol["bins"]),
                       edges_hi=np.full(pol["bins"], EDGE_MAX), group_latency=np.zeros(groups),
                       group_count=np.zeros(groups, np.int64), bin_completed=np.zeros(pol["bins"], np.int64),
                       bin_latency=np.zeros(pol["bins"]),
                       hist_ttft=np.zeros(HIST_SIZE, np.int64), hist_tbt=np.zeros(HIST_SIZE),
                       engine_completed=np.zeros(E, np.int64), engine_busy=np.zeros(E))
    if edges is not None:
        out.edges_lo[:], out.edges_hi[:] = edges
        floats[S.warmup_time] = 0.0
    requests = REQUESTS.records(n if rn["keep_requests"] else 0)
    batches = BATCHES.records(n if rn["keep_batches"] else 0)
    window = min(pol["warmup"], n)
    # (a closed loop's heap starts with its first program's first call)
    loop_ints, loop_floats = LOOP.zeros(ts_stride=1, t_switch=-1.0, key=key, routed=-1,
                                        heap=1 if cl.get("calls", 0) > 0 else 0)
    servers_i, servers_f = SERVERS.records(c, fill=0)
    arrays = None
    if cluster is not None:
        eng = np.zeros((ENGINES.size, E), np.int64)
        eng[EN.registered] = 1
        eng[EN.free] = c // E
        arrays = CLUSTER_ARRAYS.pack(config=cluster[0][0], **{**NO_CLOSED_LOOP, **cluster[1]}, **cluster[2], eng=eng,
                                     table=np.full((TABLE.size, max(cl["programs"], 1)), -1, np.int64))
    ws = WORKSPACE.pack(q=np.empty((FIELDS.size, K, QUEUE_START)), qidx=np.empty((K, QUEUE_START), np.int64),
                        head=np.zeros(K, np.int64), size=np.zeros(K, np.int64), window=np.empty(max(window, 1)),
                        servers_i=servers_i, servers_f=servers_f, blk=np.empty((FIELDS.size, BLOCK)),
                        loop_ints=loop_ints, loop_floats=loop_floats,
                        draws=drawers(rn["arrival_kind"], rn["output_kind"], rn["prompt_kind"],
                                      predictor=rn["predictor"]),
                        scratch=np.empty(max(pol["scratch"], 1)),
                        steps=np.array([ordering(pol["policy"]), timing_address(md["model"])]),
                        timing=TIMING.zeros(**{f: md[f] for f in COST_FIELDS}, expert_span=md["expert_span"],
                                            expert_miss=md["expert_miss"])[1])
    while True:
        code = dynamic_kernel(config, inputs, streams, out, requests, batches, ws, stop, arrays)
        if code == QUEUE_FULL:
            needed, limit = doubling_bytes(ws.qidx.size), available() if available is not None else None
            if limit is not None and needed > limit:
                raise QueueOverflow(int(ws.size.sum()), needed, limit)
            ws = ws._replace(**grow(ws.q, ws.qidx, ws.head, ws.size))
        elif code == WARMUP_DONE:
            out.edges_lo[:], out.edges_hi[:] = equal_mass_edges(ws.window[:window], pol["bins"])
            confusion = rn["predictor"] == PRED_CONFUSION
            rebin(ws.q, ws.qidx, ws.head, ws.size, out.edges_lo, out.edges_hi, rn["predictor_p"] if confusion
                   else 1.0, key)
        else:
            break
    return (out, REQUESTS.rows(requests) if rn["keep_requests"] else None,
            BATCHES.rows(batches) if rn["keep_batches"] else None)


# --- the steps of the event loop ----------------------------------------------

@subroutine
def _draw_requests(i0, m, t, seg, t_switch, draws, inv_rate, arrival_times, arrival_params, arrival_ends,
                   gen_arrival, output_params, output_values, gen_output, prompt_params, prompt_values, gen_prompt,
                   integer, sigma, gen_pred, predictor, predictions, blk):
    """Step 1: requests i0 .. i0+m-1 into the rows of ``blk``, one stream at a
    time: arrival times, output and prompt lengths (whole tokens when
    ``integer``), predicted outputs (log-normal error ``sigma``), through
    the drawers at ``draws`` (:func:`~.common.drawers`).  Returns
    the arrival clock and process state ``(t, seg, t_switch)``."""
    arrival = blk[Q.arrival]
    prompt = blk[Q.prompt]
    output = blk[Q.output]
    pred = blk[Q.pred]
    t, seg, t_switch = draw_arrivals(draws[0], t, inv_rate, arrival_times, i0, m, gen_arrival, arrival,
                                     arrival_params, arrival_ends, seg, t_switch)
    draw_block(draws[1], output_params, output_values, i0, m, gen_output, output)
    draw_block(draws[2], prompt_params, prompt_values, i0, m, gen_prompt, prompt)
    round_lengths(output, m, integer)
    round_lengths(prompt, m, integer)
    # (the copy of the rounded outputs of the oracle and bin confusion is rounded already)
    predict(draws[3], sigma, predictions, i0, m, gen_pred, output, pred)
    if predictor != PRED_ORACLE and predictor != PRED_CONFUSION:
        round_lengths(pred, m, integer)
    return t, seg, t_switch


@step
def _complete(s, in_service, ema, ctl, st, servers_i, servers_f):
    """Step 2a: Algorithm 7's feedback for the batch server s completes, with
    ``in_service`` requests still decoding, into its bin's controller."""
    b = servers_i[SV.bin, s]
    (st[b, T.avg_prompt], st[b, T.avg_output], st[b, T.count], st[b, T.mean_tokens], st[b, T.m2_tokens],
     ctl[b, C.tau_avg], ctl[b, C.b_avg]) = feedback_core(
        servers_i[SV.size, s], servers_f[SV.sum_prompt, s], servers_f[SV.sum_output, s], servers_f[SV.m2, s],
        servers_f[SV.max_output, s], servers_f[SV.service, s], servers_f[SV.tbt, s], ema, st[b, T.avg_prompt],
        st[b, T.avg_output], st[b, T.count], st[b, T.mean_tokens], st[b, T.m2_tokens], ctl[b, C.tau_avg],
        ctl[b, C.b_avg])
    ctl[b, C.n_decode] = float(in_service)
    ctl[b, C.updates] += 1.0


@step
def _next_completion(servers_i, servers_f):
    """The first completion ``(t_next, s_next)``: the lowest server index
    among ties, ``(inf, -1)`` when every server is free."""
    s_next = -1
    t_next = np.inf
    for k in range(servers_i.shape[1]):
        if servers_i[SV.busy, k] != 0 and servers_f[SV.free_at, k] < t_next:
            t_next = servers_f[SV.free_at, k]
            s_next = k
    return t_next, s_next


@step
def _batch_service(model, base, per_token, alpha, beta, prefill_per_token, tbt_beta, tbt_gamma, nb, sum_prompt,
                   max_out, max_seq):
    """A batch's service time (s), decode time between tokens (s/token; 0:
    none, the legacy feedback rule), time per output token (s/token, what
    the SLA bounds) and time to first token after its start (s), under
    every model but the iteration model (:func:`iteration_batch`)."""
    bf = float(nb)
    if model == MODEL_MAX:
        service = base + per_token * max_out
        tpot = service / max(max_out, 1.0)
        return service, 0.0, tpot, tpot
    if model == MODEL_LINEAR:
        service = base + alpha * max_seq * (1.0 + beta * (bf - 1.0) / bf)
        tpot = service / max(max_out, 1.0)
        return service, 0.0, tpot, tpot
    tbt = decode_tbt(tbt_beta, tbt_gamma, bf)
    if model >= MODEL_CALIBRATED:
        service = base + tbt * max_seq
        fed = tbt if model == MODEL_CALIBRATED else UNCALIBRATED_TBT if model == MODEL_CALIBRATED_UNCALIBRATED \
            else 0.0
        return service, fed, tbt, min(base + tbt * (max_seq - max_out + 1.0), service)
    prefill = prefill_per_token * sum_prompt
    service = prefill + tbt * max_out
    # (a batch whose outputs are all under one token ends sooner)
    return service, tbt, tbt, min(prefill + tbt, service)


@step
def decode_work(q, b, h0, nb, mask, max_out, sum_prompt, padded):
    """The decode work of a batch (the first nb of queue b, head at slot h0)
    under the iteration model: its members' decode steps and the context
    tokens they attend over (``service_models.BatchAggregates``'
    ``sequence_steps`` and ``context_steps``); ``padded``: every member
    steps until the longest is done (``sum_prompt``: the members' prompts)."""
    if padded:
        return padded_work(nb, sum_prompt, max_out)
    ub = np.uint64(b)
    seq = 0.0
    ctx = 0.0
    for j in range(nb):
        sl = np.uint64((h0 + j) & mask)
        d, c = member_work(q[Q.prompt, ub, sl], q[Q.output, ub, sl])
        seq += d
        ctx += c
    return seq, ctx


#: the coefficients of the iteration model in :func:`iteration_batch`'s
#: ``timing`` (then its two outputs)
TIMING = Layout("iteration timing", floats=(*COST_FIELDS, "expert_span", "expert_miss", "tbt", "prefill"))
TI = TIMING.index
#: the coefficients' place in ``timing`` and in a :data:`MODEL`'s floats
TI_COST = getattr(TI, COST_FIELDS[0])
O_COST = getattr(MODEL.index, COST_FIELDS[0])
#: :func:`iteration_batch`: (q, b, h0, nb, mask, max_out, sum_prefill,
#: sum_prompt, padded, timing) -> the batch's service time
TIMING_SIG = types.float64(types.Array(types.float64, 3, "C"), types.int64, types.int64, types.int64, types.int64,
                           types.float64, types.float64, types.float64, types.int64, types.Array(types.float64, 1, "C"))
#: ``call_timing(address, args)``: :func:`iteration_batch` at ``address``
call_timing = by_address(TIMING_SIG, "call_timing")


@step
def iteration_batch(q, b, h0, nb, mask, max_out, sum_prefill, sum_prompt, padded, timing):
    """A batch's service time (s) under the iteration model (the first nb of
    queue b, head at slot h0; ``sum_prefill`` tokens prefilled of its
    members' ``sum_prompt``): its decode work (:func:`decode_work`) timed by
    :func:`~.common.iteration_times` with the coefficients in ``timing``
    (:data:`TIMING`), whose ``tbt`` and ``prefill`` receive its decode time
    per step and its prefill iteration's (the time to first token after its
    start).  The event kernel calls it by address (:func:`timing_address`):
    a run of another model compiles none of it."""
    seq, ctx = decode_work(q, b, h0, nb, mask, max_out, sum_prompt, padded)
    c = timing[TI_COST:TI_COST + N_COST]
    span, miss = timing[TI.expert_span], timing[TI.expert_miss]
    # (a mixture of experts' decode reads: the members' outputs in queue b's ring)
    reads = (ranked_expert_reads(q[Q.output, np.uint64(b)], h0, mask, nb, max_out, padded, span, miss)
             if c[PER_EXPERT] > 0.0 else 0.0)
    sq = prefill_squares(q, b, h0, nb, mask) if c[PREFILL_ATTENTION] > 0.0 else 0.0
    service, timing[TI.tbt], timing[TI.prefill] = iteration_times(c, span, miss, nb, sum_prefill, sq, max_out, seq,
                                                                  ctx, sum_prompt, reads)
    return service


@step
def prefill_squares(q, b, h0, nb, mask):
    """The prefill attention's feature of a batch (the first nb of queue b,
    head at slot h0; :mod:`.cost`): each member prefills its last ``f`` of
    ``p`` prompt tokens (``f < p``: the rest's KV cache was reused), adding
    ``p^2 - (p - f)^2`` (:func:`.cost.prefill_square`)."""
    ub = np.uint64(b)
    sq = 0.0
    for j in range(nb):
        sl = np.uint64((h0 + j) & mask)
        f = q[Q.prefill, ub, sl]
        sq += prefill_square(q[Q.prompt, ub, sl] - f, f)
    return sq


def _iteration_batch():
    def iteration_batch_apart(q, b, h0, nb, mask, max_out, sum_prefill, sum_prompt, padded, timing):
        return iteration_batch(q, b, h0, nb, mask, max_out, sum_prefill, sum_prompt, padded, timing)
    return iteration_batch_apart


APART[("timing", MODEL_ITERATION)] = _iteration_batch


def timing_address(model: int) -> int:
    """The address of the step that times a batch of service model ``model``
    (:func:`iteration_batch`, compiled apart the first time a process asks),
    0: :func:`_batch_service` times it in the kernel."""
    if model != MODEL_ITERATION:
        return 0
    return compiled_apart(("timing", MODEL_ITERATION), APART[("timing", MODEL_ITERATION)], TIMING_SIG).address


@helper
def batch_times(model, sizes, sum_prompt, max_out, max_seq, seq_steps, ctx_steps, reads, squares, out):
    """:func:`_batch_service` of batches, from Python: ``model`` a
    :data:`MODEL` pair, one batch per entry of ``sizes`` (requests),
    ``sum_prompt`` (tokens prefilled), ``max_out`` and ``max_seq`` (tokens),
    ``seq_steps``, ``ctx_steps``, ``reads`` and ``squares`` (the iteration
    model's decode work, experts read and prefill squares);
    ``out`` (4, batches) receives each batch's service time, fed-back decode
    time, time per output token and time to first token (the numbers
    :meth:`mbbatch.service_models.MaxModel.times` and its siblings state in
    numpy, held equal by the tests)."""
    code = model[0][O.model]
    mf = model[1]
    for j in range(sizes.shape[0]):
        if code == MODEL_ITERATION:
            out[0, j], out[1, j], out[3, j] = iteration_times(
                mf[O_COST:O_COST + N_COST], mf[O.expert_span], mf[O.expert_miss], sizes[j], sum_prompt[j], squares[j],
                max_out[j], seq_steps[j], ctx_steps[j], sum_prompt[j], reads[j])
            out[2, j] = out[1, j]
        else:
            out[0, j], out[1, j], out[2, j], out[3, j] = _batch_service(
                code, mf[O.base], mf[O.per_token], mf[O.alpha], mf[O.beta], mf[O.prefill_per_token],
                mf[O.tbt_beta], mf[O.tbt_gamma], sizes[j], sum_prompt[j], max_out[j], max_seq[j])


@step
def _serve(q, qidx, b, lb, e, h0, nb, mask, now, done, ttft, tpot, slo, mean_tok, hist, hist_ttft, keep, r_i, r_f,
           batch):
    """The members of a batch (the first nb of queue b, head at slot h0:
    engine e's bin lb), started at ``now`` and done at ``done``: their
    latencies and times to first token into the histograms and, with
    ``keep``, their records.  Returns their summed latency and arrival
    times, the sum of squared deviations of their tokens from ``mean_tok``
    (for the feedback), their gaps between two tokens, ``max(output - 1,
    0)`` each (one decode step apart: the batch's time between tokens), and
    those within both objectives ``slo = (ttft, tpot, counted)``: their time
    to first token, and the batch's ``tpot`` (every member's time per output
    token; a member of one token has none); none unless ``counted``."""
    ub = np.uint64(b)
    m2 = 0.0
    sum_lat = 0.0
    sum_arr = 0.0
    gaps = 0.0
    good = 0
    paced = tpot <= slo[1]
    for j in range(nb):
        sl = np.uint64((h0 + j) & mask)
        a = q[Q.arrival, ub, sl]
        lat = done - a
        sum_lat += lat
        sum_arr += a
        hist[hist_bucket(lat)] += 1
        o = q[Q.output, ub, sl]
        d = q[Q.prompt, ub, sl] + o - mean_tok
        m2 += d * d
        if o > 1.0:
            gaps += o - 1.0
        hist_ttft[hist_bucket(now - a + ttft)] += 1
        if slo[2] and now - a + ttft <= slo[0] and (paced or o <= 1.0):
            good += 1
        if keep:
            idx = qidx[ub, sl]
            r_i[RQ.bin, idx] = lb
            r_i[RQ.batch, idx] = batch
            r_i[RQ.engine, idx] = e
            r_f[RQ.start, idx] = now
            r_f[RQ.completion, idx] = done
            r_f[RQ.ttft, idx] = now - a + ttft
    return sum_lat, sum_arr, m2, gaps, good


@subroutine
def _sample(ts, rows, stride, seen, now, target, ctl, b, lb, nb, size, K):
    """The downsampled time series, at batch number ``seen`` (a multiple of
    the stride) of queue b (its engine's bin ``lb``; the queues' sizes by
    bin, summed over the engines, then a cluster's by engine): when the
    buffer is full, every other row
    is kept and the stride doubles; the batch is then kept if ``seen`` is a
    multiple of the stride still.  Returns the rows in use and the stride."""
    if rows == ts.shape[0]:
        for r in range(rows // 2):
            for c in range(ts.shape[1]):
                ts[r, c] = ts[2 * r, c]
        rows //= 2
        stride *= 2
    if seen & (stride - 1) == 0:  # the stride is a power of two
        ts[rows, TS.time] = now
        ts[rows, TS.b_target] = target
        ts[rows, TS.b_low] = ctl[b, C.b_low]
        ts[rows, TS.b_high] = ctl[b, C.b_high]
        ts[rows, TS.tau_avg] = ctl[b, C.tau_avg]
        ts[rows, TS.bin] = lb
        ts[rows, TS.batch_size] = nb
        for kb in range(K):
            ts[rows, TS_QUEUE + kb] = size[kb]
        for kb in range(K, size.shape[0]):
            ts[rows, TS_QUEUE + kb % K] += size[kb]
        # a cluster's engines: each one's queued requests, all its bins (its backlog check)
        if ts.shape[1] > TS_QUEUE + K:
            for e in range(size.shape[0] // K):
                q = 0
                for kb in range(e * K, (e + 1) * K):
                    q += size[kb]
                ts[rows, TS_QUEUE + K + e] = q
        rows += 1
    return rows, stride


@kernel
def dynamic_kernel(config, inputs, streams, out, requests, batches, ws, stop, cl):
    """Simulate the run ``config`` (a :data:`TokenConfig`); outputs and records
    (``(ints, floats)`` pairs) are written in place, the workspace ``ws``
    holds the queues, the servers, the block of draws and the loop state,
    from which a call resumes (see :func:`run`, which allocates them).

    Returns QUEUE_FULL when an arrival found its bin's buffer full (nothing
    of that arrival done yet), WARMUP_DONE when Algorithm 6's window is
    complete (after that arrival), STOPPED once ``stop[STOP]`` is nonzero
    (checked at every block of draws and every STOP_CHECK_BATCHES batches:
    the caller's Ctrl-C; the kernel runs without the GIL so that the
    caller's thread can take the signal meanwhile), DONE at the end.  At
    each block of draws it writes the requests arrived so far to
    ``stop[ARRIVED]`` (the caller's progress).
    """
    # the configuration, as scalars
    ri, rf = config.run
    n = ri[R.n]
    arrival_kind = ri[R.arrival_kind]
    integer = ri[R.integer] != 0
    keep = ri[R.keep_requests] != 0
    keep_batches = ri[R.keep_batches] != 0
    inv_rate = 1.0 / rf[R.rate] if rf[R.rate] > 0.0 else 0.0
    sigma = rf[R.predictor_sigma]
    predictor = ri[R.predictor]
    confusion_p = rf[R.predictor_p] if predictor == PRED_CONFUSION else 1.0
    # (the objectives, and whether any is set: goodput's count costs nothing otherwise)
    slo = (rf[R.ttft_slo], rf[R.tpot_slo], rf[R.ttft_slo] < np.inf or rf[R.tpot_slo] < np.inf)
    predictions = inputs.predictions
    pi = config.policy[0]
    policy = pi[P.policy]
    K = pi[P.bins]
    pin = pi[P.pin]
    max_cand = pi[P.max_candidates]
    select = pi[P.selection]
    warmup = pi[P.warmup]
    memory_on = pi[P.memory_on] != 0
    n_srv = pi[P.servers]
    multiplicative = config.sla[0][A.variant] == CTL_VARIANT_MULTIPLICATIVE
    sla = config.sla[1]
    ema = sla[A.ema]
    # the SLA constraint tau <= D_SLA + eps_D (Pang et al., Algorithm 2)
    sla_limit = sla[A.d_sla] + sla[A.eps_d]
    d_sla = sla[A.d_sla]
    memory_variant = config.memory[0][M.variant]
    memory = config.memory[1]
    eta = memory[M.eta]
    model = config.model[0][O.model]
    mf = config.model[1]
    # the cluster: engine e's bins are queues e * K .. e * K + K - 1, its
    # servers e * per_engine .. (e + 1) * per_engine - 1
    # (``cl is None``, one engine: numba prunes the cluster's branches, each
    # under ``if cl is not None``, before typing)
    E = 1
    kv = False
    if cl is not None:
        E = cl.config[CL.engines]
        router = cl.config[CL.router]
        threshold = cl.config[CL.threshold]
        programs = cl.config[CL.programs] > 0
        kv = cl.config[CL.kv_reuse] != 0 and programs
        program = cl.program
        new_tokens = cl.new_tokens
        session_end = cl.session_end
        event_time = cl.event_time
        n_events = event_time.shape[0]
        eng = cl.eng
        table = cl.table
        C = cl.config[CL.calls]
        closed = C > 0
        rt = Router(router, threshold, programs, kv)
    per_engine = n_srv // E
    # the controllers learn from each batch's completion (Algorithm 7)
    controlled = policy == FORM_DYNAMIC or policy == FORM_MULTIBIN_DYNAMIC
    # the policy's batch formation rule (formation.form_batch)
    rule = Rule(policy, K, pin, max_cand, select, memory_on,
                memory_on and policy != FORM_STATIC and policy != FORM_MULTIBIN, multiplicative, memory_variant, sla,
                memory, inputs.bin_b_max, eta, config.policy[1][P.max_wait], ws.steps[0])
    base_time, per_token, alpha, beta = mf[O.base], mf[O.per_token], mf[O.alpha], mf[O.beta]
    prefill_per_token, tbt_beta, tbt_gamma = mf[O.prefill_per_token], mf[O.tbt_beta], mf[O.tbt_gamma]
    # (the iteration model's coefficients, and its outputs: iteration_batch)
    timing = ws.timing
    padded = config.model[0][O.padded]
    # the arrays and streams
    arrival_times = inputs.arrival_times
    hist = out.hist
    size_hist = out.size_hist
    ts = out.ts
    ctl = out.ctl
    st = out.st
    lo = out.edges_lo
    hi = out.edges_hi
    group_latency = out.group_latency
    group_count = out.group_count
    bin_completed = out.bin_completed
    bin_latency = out.bin_latency
    hist_ttft = out.hist_ttft
    hist_tbt = out.hist_tbt
    engine_completed = out.engine_completed
    engine_busy = out.engine_busy
    r_i = requests[0]
    r_f = requests[1]
    b_i = batches[0]
    b_f = batches[1]
    q = ws.q
    qidx = ws.qidx
    head = ws.head
    size = ws.size
    window = ws.window
    servers_i = ws.servers_i
    servers_f = ws.servers_f
    blk = ws.blk
    G = group_latency.shape[0]
    mask = q.shape[2] - 1   # the capacity is a power of two

    # the loop state, resumed
    li = ws.loop_ints
    lf = ws.loop_floats
    i = li[L.i]
    jj = li[L.jj]
    m = li[L.m]
    seg = li[L.seg]
    rr = li[L.rr]
    ts_seen = li[L.ts_seen]
    ts_stride = li[L.ts_stride]
    pending = li[L.pending] != 0
    deferred = li[L.deferred] != 0
    key = li[L.key]
    ev = li[L.ev]
    rr_route = li[L.rr_route]
    routed = li[L.routed]
    hsize = li[L.heap]
    joins = li[L.joins]
    t = lf[L.t]
    now = lf[L.now]
    t_switch = lf[L.t_switch]
    routed_prefill = lf[L.routed_prefill]
    queued = np.int64(0)   # (int64 from the start: a literal 0 would compile form_batch twice)
    for b in range(size.shape[0]):
        queued += size[b]
    # Algorithm 6's warm-up: bins are used once `warmup` predictions are seen
    binned = K == 1 or policy != FORM_MULTIBIN_DYNAMIC or i >= warmup
    # the servers: (t_next, s_next) is the first completion
    in_service = 0
    n_free = 0
    for k in range(n_srv):
        if servers_i[SV.busy, k] != 0:
            in_service += servers_i[SV.size, k]
        else:
            n_free += 1
    t_next, s_next = _next_completion(servers_i, servers_f)

    # the statistics, accumulated in locals (registers) and stored on return
    ints = out.ints
    floats = out.floats
    kv_recomputed = floats[S.kv_recomputed]
    sum_active_max = floats[S.sum_active_max]
    sum_active_mean = floats[S.sum_active_mean]
    n_large = ints[S.large]
    table_hits = ints[S.table_hits]
    followups = ints[S.followups]
    kv_hits = ints[S.kv_hits]
    rerouted = ints[S.rerouted]
    routes = ints[S.routes]
    sum_latency = floats[S.sum_latency]
    sum_ttft = floats[S.sum_ttft]
    busy_time = floats[S.busy]
    tokens_out = floats[S.tokens_out]
    sum_tbt_tokens = floats[S.sum_tbt_tokens]
    token_seconds = floats[S.token_seconds]
    peak_tokens = floats[S.peak_tokens]
    sum_b = floats[S.sum_b]
    sum_b2 = floats[S.sum_b2]
    sla_tokens = floats[S.sla_tokens]
    last_completion = floats[S.last_completion]
    completed = ints[S.completed]
    rejected = ints[S.rejected]
    mem_exceed = ints[S.mem_exceed]
    sla_requests = ints[S.sla_requests]
    sla_requests_dsla = ints[S.sla_requests_dsla]
    n_batches = ints[S.batches]
    ts_rows = ints[S.ts_rows]

    code = DONE
    while True:
        # 3. free servers form batches, once every event of the instant `now` is in
        if pending:
            pending = False
            for k in range(n_srv):
                if queued == 0:
                    break
                if servers_i[SV.busy, k] != 0:
                    continue
                # the server's engine: its queues start at `base`
                e, base, rr_e, waiting = engine_of(cl, k, per_engine, K, rr, queued)
                if waiting == 0:
                    continue
                # 3a. the batch of the policy's rule: a bin, its target size, the head of its queue
                (nb, lb, rr_e, rej, target, bm, bs, h0, tokens, sum_prompt, sum_out, max_out, max_seq,
                 sum_prefill) = form_batch(rule, ws, ctl, st, base, rr_e, waiting, kv, now)
                queued -= rej
                rejected += rej
                rr = engine_formed(cl, e, rr_e, rr, rej)
                if nb == 0:
                    if cl is not None:
                        continue   # every request queued on this engine was rejected (or no bin is full)
                    break   # every queued request was rejected (or no bin is full)
                if tokens > eta:
                    mem_exceed += 1   # (the memory constraint is off)
                b = base + lb
                # the batch: the first nb of bin b (unused candidates stay at the front)
                if model == MODEL_ITERATION:
                    service = call_timing(ws.steps[1], (q, b, h0, nb, mask, max_out, sum_prefill, sum_prompt,
                                                        padded, timing))
                    tbt = tpot = timing[TI.tbt]
                    ttft = timing[TI.prefill]
                else:
                    service, tbt, tpot, ttft = _batch_service(model, base_time, per_token, alpha, beta,
                                                              prefill_per_token, tbt_beta, tbt_gamma, nb,
                                                              sum_prefill, max_out, max_seq)
                done = now + service
                if done > last_completion:
                    last_completion = done
                bf = float(nb)
                sum_lat, sum_arr, m2, gaps, good_b = _serve(q, qidx, b, lb, e, h0, nb, mask, now, done, ttft, tpot,
                                                            slo, (sum_prompt + sum_out) / bf, hist, hist_ttft, keep,
                                                            r_i, r_f, n_batches)
                if slo[2]:
                    ints[S.good] += good_b
                # (the model times the batch, not each step: every gap of its members is its decode
                # time per token, one bucket per batch)
                if gaps > 0.0:
                    hist_tbt[hist_bucket(tpot)] += gaps
                if cl is not None:
                    if closed:
                        hsize = _follow_ups(q, qidx, b, h0, nb, mask, done, C, cl.call, cl.gap, cl.heap_t,
                                            cl.heap_id, hsize)
                        if jj < m and routed < 0 and hsize > 0 and _before(
                                cl.heap_t[0], cl.heap_id[0], blk[Q.arrival, jj], cl.call[i]):
                            # a call now arrives before the one drawn: that one waits in the heap again
                            hsize = _heap_push(cl.heap_t, cl.heap_id, hsize, blk[Q.arrival, jj], cl.call[i])
                            jj = m
                sum_latency += sum_lat
                sum_ttft += bf * (now + ttft) - sum_arr
                # batch-means group of the batch: that of its first member's arrival index
                g = (qidx[np.uint64(b), np.uint64(h0)] * G) // n
                group_latency[g] += sum_lat
                group_count[g] += nb
                head[b] = (h0 + nb) & mask
                size[b] -= nb
                queued -= nb
                engine_started(cl, e, nb, service, engine_completed, engine_busy)

                busy_time += service
                tokens_out += sum_out
                sum_tbt_tokens += tpot * sum_out
                tok = sum_prompt + sum_out
                token_seconds += tok * service
                if tok > peak_tokens:
                    peak_tokens = tok
                sum_b += bf
                sum_b2 += bf * bf
                if tpot > sla_limit:
                    sla_tokens += sum_out
                    sla_requests += nb
                if tpot > d_sla:
                    sla_requests_dsla += nb
                bin_completed[lb] += nb
                bin_latency[lb] += sum_lat
                completed += nb
                size_hist[nb if nb < size_hist.shape[0] else size_hist.shape[0] - 1] += 1
                if keep_batches:
                    b_f[BT.start, n_batches] = now
                    b_f[BT.service, n_batches] = service
                    b_f[BT.tokens, n_batches] = tok
                    b_i[BT.bin, n_batches] = lb
                    b_i[BT.size, n_batches] = nb
                    b_i[BT.b_target, n_batches] = target
                    b_i[BT.b_mem, n_batches] = bm
                    b_i[BT.b_sla, n_batches] = bs
                if ts_seen & (ts_stride - 1) == 0:  # the stride is a power of two
                    ts_rows, ts_stride = _sample(ts, ts_rows, ts_stride, ts_seen, now, target, ctl, b, lb, nb, size,
                                                 K)
                ts_seen += 1

                # server k takes it
                servers_i[SV.busy, k] = 1
                servers_i[SV.size, k] = nb
                servers_i[SV.bin, k] = b
                servers_i[SV.orphan, k] = 0
                servers_f[SV.free_at, k] = done
                servers_f[SV.service, k] = service
                servers_f[SV.tbt, k] = tbt
                servers_f[SV.sum_prompt, k] = sum_prompt
                servers_f[SV.sum_output, k] = sum_out
                servers_f[SV.max_output, k] = max_out
                servers_f[SV.m2, k] = m2
                n_free -= 1
                if done < t_next or (done == t_next and k < s_next):
                    t_next = done
                    s_next = k
                in_service += nb
                n_batches += 1
                if n_batches & (STOP_CHECK_BATCHES - 1) == 0 and stop[STOP] != 0:
                    # (a long drain after the last arrival draws no blocks)
                    code = STOPPED
                    break
            if code == STOPPED:
                break

        # 1. the next block of draws (a closed loop: the next call to arrive, if any waits)
        closed_next = False
        if cl is not None:
            closed_next = closed and jj == m and i < n and hsize > 0
        if closed_next:
            if stop[STOP] != 0:
                code = STOPPED
                break
            stop[ARRIVED] = i
            t_k, k_c, hsize = _heap_pop(cl.heap_t, cl.heap_id, hsize)
            _closed_call(t_k, k_c, C, i, cl.new, cl.out, program, new_tokens, session_end, cl.call, predictions,
                         predictor, integer, blk)
            m = 1
            jj = 0
            if i == 0:
                floats[S.first_arrival] = t_k
        elif jj == m and i < n and (cl is None or not closed):
            if stop[STOP] != 0:
                code = STOPPED
                break
            stop[ARRIVED] = i
            m = n - i if n - i < BLOCK else BLOCK
            jj = 0
            t, seg, t_switch = _draw_requests(i, m, t, seg, t_switch, ws.draws, inv_rate, arrival_times,
                                              inputs.arrival_params, inputs.arrival_ends, streams.arrival,
                                              inputs.output_params, inputs.output_values, streams.output,
                                              inputs.prompt_params, inputs.prompt_values, streams.prompt,
                                              integer, sigma, streams.prediction, predictor, predictions, blk)
            if i == 0:
                floats[S.first_arrival] = blk[Q.arrival, 0]

        # 2. the next event: the first completion, which wins ties, then an
        # engine event, then arrivals
        t_arr = blk[Q.arrival, jj] if i < n and jj < m else np.inf
        t_ev = np.inf
        if cl is not None:
            if ev < n_events:
                t_ev = event_time[ev]
        if s_next < 0 and t_arr == np.inf:
            # (every request arrived; or, closed loop, none waits to arrive)
            break
        if s_next >= 0 and t_next <= t_arr and t_next <= t_ev:
            # 2a. a completion: Algorithm 7's feedback, in time order
            now = t_next
            nd = servers_i[SV.size, s_next]
            in_service -= nd
            decoding = engine_done(cl, s_next, per_engine, nd, servers_i[SV.orphan, s_next] != 0, in_service)
            if controlled:
                _complete(s_next, decoding, ema, ctl, st, servers_i, servers_f)
            servers_i[SV.busy, s_next] = 0
            n_free += 1
            t_next, s_next = _next_completion(servers_i, servers_f)
        elif t_ev <= t_arr:
            # 2c. an engine leaves or joins the cluster (t_ev is finite: a cluster)
            if cl is None:
                break
            e = cl.event_engine[ev]
            if cl.event_add[ev] != 0:
                eng[EN.registered, e] = 1
                for k in range(e * per_engine, (e + 1) * per_engine):
                    if servers_i[SV.busy, k] == 0:
                        eng[EN.free, e] += 1
            else:
                # its queued requests are routed again: every queue must hold them
                most = 0
                for b in range(size.shape[0]):
                    if size[b] > most:
                        most = size[b]
                if most + eng[EN.queued, e] > mask + 1:
                    code = QUEUE_FULL
                    break
                # (the batches it serves finish outside the router's counts)
                for k in range(e * per_engine, (e + 1) * per_engine):
                    if servers_i[SV.busy, k] != 0:
                        servers_i[SV.orphan, k] = 1
                rr_route, recomputed, moved, hits, joins = remove_engine(e, K, router, threshold, programs, kv,
                                                                         rr_route, q, qidx, head, size, eng, table,
                                                                         program, new_tokens, session_end, joins)
                kv_recomputed += recomputed
                rerouted += moved
                kv_hits += hits
            now = t_ev
            ev += 1
        else:
            # 2b. an arrival joins its bin; while every server is busy, so do
            # all the arrivals of this block before the first completion, in
            # one loop
            while True:
                now = blk[Q.arrival, jj]
                e = 0
                prefill = blk[Q.prompt, jj]
                if cl is not None:
                    if routed >= 0:
                        # (routed before its queue was found full)
                        e = routed
                        prefill = routed_prefill
                    else:
                        # 2c. the router's engine for it
                        if prefill > threshold:
                            n_large += 1
                        pid, new, last = i, 0.0, False
                        if programs:
                            pid, new, last = program[i], new_tokens[i], session_end[i] != 0
                        e, prefill, rr_route, hit, followup, held, most, mean = route_call(rt, eng, table, prefill,
                                                                                           pid, new, last, rr_route)
                        routes += 1
                        sum_active_max += most
                        sum_active_mean += mean
                        if hit:
                            table_hits += 1
                        if programs:
                            kv_recomputed += prefill - new
                            if followup:
                                followups += 1
                            if held:
                                kv_hits += 1
                        routed = e
                        routed_prefill = prefill
                bq, slot = join(i, jj, binned, K, e * K, lo, hi, window, blk, q, qidx, head, size, mask, confusion_p,
                                key, prefill)
                if bq < 0:
                    code = QUEUE_FULL
                    break
                if cl is not None:
                    # (a multi-bin engine's batch forms when its last member joins its queue)
                    q[Q.joined, np.uint64(bq), slot] = joins
                    joins += 1
                routed = -1
                if keep:
                    r_f[RQ.arrival, i] = now
                    r_f[RQ.prompt, i] = blk[Q.prompt, jj]
                    r_f[RQ.output, i] = blk[Q.output, jj]
                    r_f[RQ.pred, i] = blk[Q.pred, jj]
                queued += 1
                if cl is not None:
                    if closed:
                        k_c = cl.call[i]
                        if k_c % C == 0 and k_c // C + 1 < cl.start.shape[0]:
                            # a program starts: the next program's first call waits to arrive
                            hsize = _heap_push(cl.heap_t, cl.heap_id, hsize, cl.start[k_c // C + 1], k_c + C)
                i += 1
                jj += 1
                if cl is not None:
                    # (counted before the warm-up may end: the request is queued on its engine either way)
                    eng[EN.queued, e] += 1
                if not binned and i == warmup:
                    floats[S.warmup_time] = now
                    code = WARMUP_DONE
                    break
                if cl is not None:
                    # (a free server of another engine may hold batches deferred to the end of this
                    # instant: they form before a later arrival)
                    if eng[EN.free, e] > 0 or jj == m or blk[Q.arrival, jj] >= t_next or blk[Q.arrival, jj] >= t_ev \
                            or (deferred and blk[Q.arrival, jj] > now):
                        break
                elif n_free > 0 or jj == m or blk[Q.arrival, jj] >= t_next:
                    break
            if code == QUEUE_FULL:
                break
        # the batches wait until every event of this instant is in
        pending = queued > 0 and n_free > 0
        deferred = pending
        if pending and i < n:
            if jj < m:
                nxt = blk[Q.arrival, jj]
            elif cl is not None and closed:
                nxt = cl.heap_t[0] if hsize > 0 else np.inf
            elif arrival_kind == ARR_SATURATED:
                nxt = 0.0
            elif arrival_kind == ARR_REPLAY:
                # (request i of the trace repeated end to end: not arrival_times[i],
                # which lies beyond the trace once it repeats)
                nxt = replay_time(arrival_times, inputs.arrival_params[0], i)
            else:
                nxt = np.inf  # a continuous draw ties with probability 0
            pending = nxt > now
        if cl is not None:
            if pending and ev < n_events and event_time[ev] <= now:
                pending = False
        deferred = deferred and not pending
        if code == WARMUP_DONE:
            break

    floats[S.sum_latency] = sum_latency
    floats[S.kv_recomputed] = kv_recomputed
    floats[S.sum_active_max] = sum_active_max
    floats[S.sum_active_mean] = sum_active_mean
    ints[S.large] = n_large
    ints[S.table_hits] = table_hits
    ints[S.followups] = followups
    ints[S.kv_hits] = kv_hits
    ints[S.rerouted] = rerouted
    ints[S.routes] = routes
    floats[S.sum_ttft] = sum_ttft
    floats[S.busy] = busy_time
    floats[S.tokens_out] = tokens_out
    floats[S.sum_tbt_tokens] = sum_tbt_tokens
    floats[S.token_seconds] = token_seconds
    floats[S.peak_tokens] = peak_tokens
    floats[S.sum_b] = sum_b
    floats[S.sum_b2] = sum_b2
    floats[S.sla_tokens] = sla_tokens
    floats[S.last_completion] = last_completion
    ints[S.completed] = completed
    ints[S.rejected] = rejected
    ints[S.mem_exceed] = mem_exceed
    ints[S.sla_requests] = sla_requests
    ints[S.sla_requests_dsla] = sla_requests_dsla
    ints[S.batches] = n_batches
    ints[S.ts_rows] = ts_rows
    li[L.i] = i
    li[L.jj] = jj
    li[L.m] = m
    li[L.seg] = seg
    li[L.rr] = rr
    li[L.ts_seen] = ts_seen
    li[L.ts_stride] = ts_stride
    li[L.pending] = 1 if pending else 0
    li[L.deferred] = 1 if deferred else 0
    li[L.ev] = ev
    li[L.rr_route] = rr_route
    li[L.routed] = routed
    li[L.heap] = hsize
    li[L.joins] = joins
    lf[L.routed_prefill] = routed_prefill
    lf[L.t] = t
    lf[L.now] = now
    lf[L.t_switch] = t_switch
    return code


# --- the calls of open-loop programs, in arrival order (called from Python)


def warmup() -> None:
    """Compile the event kernel (or load it from the cache) on a tiny input:
    multi-bin dynamic batching of 2 bins after a warm-up of 4 requests, 2
    servers, 16 requests (one specialization serves every single-engine run).
    A cluster's runs take a second specialization of the kernel (its engine
    arrays typed, not None) and the helpers that order its programs' calls
    (:mod:`.programs`), compiled on a process's first cluster run and
    cached: compiling them here would add about 6 s and 1.5 s (cache off,
    measured) to every cold warm-up, for runs most sessions never make."""
    n = 16
    config = TokenConfig(
        run=RUN.pack(n=n, arrival_kind=ARR_POISSON, prompt_kind=SVC_UNIFORM, output_kind=SVC_UNIFORM, integer=1,
                     keep_requests=1, keep_batches=1, rate=1.0, predictor_sigma=0.0, predictor=PRED_ORACLE,
                     predictor_p=1.0, ttft_slo=np.inf, tpot_slo=np.inf),
        policy=POLICY.pack(policy=FORM_MULTIBIN_DYNAMIC, bins=2, pin=0, max_candidates=4, selection=SEL_ROUND_ROBIN,
                           warmup=4, memory_on=1, servers=2, scratch=0, max_wait=np.inf),
        sla=SLA.pack(variant=0, d_sla=7.5e-3, eps_d=5e-5, b_min=1.0, b_max=4.0, alpha=4.0, delta=2.0,
                     ema=DEFAULT_EMA),
        memory=MEMORY.pack(variant=0, eta=1e5, b_min=1.0, b_max=4.0, z=1.645, default_tokens=DEFAULT_TOKENS),
        model=MODEL.zeros(model=MODEL_DECODE, tbt_beta=5.74e-3, tbt_gamma=0.316))
    inputs = INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                         predictions=np.empty(0),
                         prompt_params=np.array([1.0, 9.0]), prompt_values=np.empty(0),
                         output_params=np.array([1.0, 9.0]), output_values=np.empty(0), bin_b_max=np.zeros(2))
    gen = np.random.default_rng(0)
    run(config, inputs, TokenStreams(gen, gen, gen, gen), np.zeros(STOP_SIZE, np.int64), groups=1, ts_rows=4)
