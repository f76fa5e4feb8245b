"""The continuous-batching kernel: one engine that batches at every iteration.

Requests arrive (:func:`~.common.draw_arrivals`) with whole-token prompt and
output lengths and a predicted output (drawn before the run).  At each
iteration boundary the engine schedules one iteration:

- *decodes*: every running sequence whose prompt is prefilled steps one
  token.  Its KV cache takes blocks of ``block_size`` tokens; a sequence of
  ``L`` tokens holds ``ceil(L / block_size)`` blocks, and one about to grow
  past a full block takes a new one.  While the blocks the decodes need
  exceed the free ones, the most recently admitted running sequence is
  preempted (recompute: its blocks are freed, it goes back to the head of the
  queue, and its prompt and generated tokens are prefilled again on resume);
- *prefill*: with ``chunked`` (Agrawal et al., 2024, "Taming
  throughput-latency tradeoff in LLM inference with Sarathi-Serve",
  arXiv:2403.02310; vLLM's V1 scheduler), the decodes count one token each
  against the iteration's budget of ``max_batched_tokens``, the prompts being
  prefilled take chunks of what is left in admission order, then waiting
  requests are admitted (each with a chunk) while the budget lasts, the
  running count is below ``max_num_seqs`` and the free blocks hold the new
  sequence's prompt (and its first token); without it (Yu et al., 2022,
  "Orca", OSDI; vLLM's V0 scheduler), an iteration that can admit the
  waiting head prefills whole prompts (as many as the budget, the count and
  the blocks allow) and pauses the decodes, else it decodes.  The waiting
  head is a preempted request (the last preempted first), else the next by
  the admission order: first come first served, shortest predicted output
  first (ties in arrival order; with ``aging``, by prediction + aging x
  arrival time: Fu et al., 2024, arXiv:2408.15792), or multi-bin (bins by predicted output
  between ``edges``, each first come first served, served round robin).
  Admission stops at the first request that does not fit.

An iteration takes :func:`.cost.cost`: ``step + prefill_per_token x (tokens
prefilled) + per_sequence x (sequences decoded) + per_context_token x (their
context tokens)``, and for a mixture of experts ``+ per_expert x`` the
experts its tokens (the sequences decoded and the tokens prefilled) read
beyond the first token's (:func:`~.common.extra_experts`)
(:class:`mbbatch.IterationModel`; a sequence of prompt ``p`` with ``g``
tokens generated attends over ``p + g``).  The model's ``setup``, a batch's
once when it starts, has no counterpart: the engine never starts a batch.  At its
end each decoded sequence has its next token, each prompt whose prefill
completes its first token (a resumed one its next), and the sequences with
all their output leave, freeing their blocks.  An idle engine waits for the
next arrival.  Arrivals at an iteration's end join before the next is
scheduled.

A request may bring the KV cache of ``cached`` tokens of its prompt (a
decode stage's, behind prefill instances that processed the prompt): its
admission takes the blocks of its whole prompt but prefills only the rest,
none when the whole prompt came (a chunk of no tokens: the iteration it is
admitted in ends with its next token); preempted, it loses the cache and
prefills prompt and generated tokens again, as any other.

A request may also *pull* its KV cache (``pull``: seconds, > 0; a
disaggregated deployment's decode pool, whose prefill engines hold the
cache until it is read: vLLM's KV connectors, the decode side's
``WAITING_FOR_REMOTE_KVS``).  At each scheduling boundary, before the
iteration is scheduled, the waiting heads that pull are admitted while the
running are fewer than the cap and the free blocks hold the head's prompt
and first token, in the admission order, stopping at the first head that
does not pull or does not fit: each takes its blocks and a slot (counted
running) and its pull starts; it neither decodes nor is prefilled, nor can
it be preempted, until the pull lands ``pull`` s later.  At the first
iteration boundary at or after that it joins the running list's tail as a
prompt whose whole cache came (a chunk of no tokens: the iteration ends
with its next token); landings at one instant in the order their pulls
started.  An engine with nothing to run waits for the next landing or
arrival.  A pulling head is never admitted by the iteration's own
admission.  (vLLM's scheduler counts a pulling request against
``max_num_seqs`` only once its cache landed; here it holds its slot from
its admission, so that the slots bound the engine's sequences.)

A request may *hold* its KV cache past its last token (``release``: the
instant its blocks are freed; a disaggregated deployment's prefill pool,
whose engine keeps a request's cache until its decode engine has read
it): completing before its ``release``, it leaves the running list and
frees its slot, but its blocks stay taken until the first scheduling
boundary at or after ``release``, freed there before any admission.
``release`` inf holds them until the engine's driver says when
(:func:`release_at`: a deployment's one loop, once the decode engine has
admitted the request and started its pull).  Not with prefix caching,
whose blocks go back to the cache at the last token.  Held blocks are not
counted as used in the engine's KV statistics
(``blocks_time``, the time series' ``kv_blocks``): those count the blocks
of the requests it runs.  An engine whose waiting requests do not fit
while blocks are held waits for the next release or arrival, as for a
pull.

With a controller (``controlled``), the running sequences an iteration may
admit up to are not ``max_num_seqs`` but the dynamic-batching paper's
``b_target`` (Pang, Li and Wang, 2025, "Optimizing LLM inference throughput via
memory-aware and SLA-constrained dynamic batching", arXiv:2503.05248), as
its vLLM patch sets ``max_num_seqs``: at every iteration Algorithm 2's
b_SLA (and, ``memory_on``, at most Algorithm 1's b_mem), capped by
``max_num_seqs``; a cap below the running count admits nothing and
preempts nothing.  After every iteration Algorithm 7 feeds it back: the
iteration is the batch (its sequences, its time the time between tokens of
its decodes), ``N_decode`` the sequences still running, and the requests
the iteration completed update the length statistics Algorithm 1 reads.

Prefix caching (``chain`` given; Kwon et al., 2023's paged memory as
vLLM's automatic prefix caching keeps it: blocks by the hash of their
tokens and every token before them, the unreferenced ones evicted least
recently used).  Blocks with the same content are those of the same
*chain*: request ``r`` shares its prompt's first ``shared[r]`` tokens with
chain ``chain[r]`` (a system prompt; -1: none), and a chain that ``grows``
(a session's) is extended, as each of its requests completes, by that
request's whole context.  The engine keeps per chain its first ``cached``
blocks and the running sequences holding it (``refs``):

- admitting ``r`` (new or resumed; ``L`` tokens, prompt and generated), its
  prefix's full blocks ``k = min(shared, L - 1) // block_size`` (one token at
  least is computed; ``k = 0``: it holds no chain), the cached ones of them
  ``h = min(cached, k)`` are hits: it prefills ``L - h x block_size`` tokens
  and takes ``ceil((L + 1) / block_size) - h`` blocks; the chain is held
  (``refs`` + 1) and its cache is ``max(cached, k)`` blocks (the request's
  own beyond the hit join it at admission, as vLLM v1 caches a block when
  it is scheduled to be filled);
- the free blocks that admission and the decodes' new blocks are tested
  against count the *evictable* ones, the cached blocks of the chains no
  running sequence holds, and holding such a chain takes its blocks out of
  them: the first to hold it again cuts it to its own ``k`` blocks (the
  deeper ones evicted), so it needs ``ceil((L + 1) / block_size)`` free
  blocks like a request without a chain; a sequence is preempted only when
  no evictable block is left;
- after blocks are taken, while the truly free ones are negative, the
  deepest blocks of the unreferenced chain released longest ago are evicted
  (at equal times the lower chain first);
- a sequence leaving (completed or preempted) frees its blocks but its
  chain's; completed in a chain that grows, its context's full blocks
  (``(p + o - 1) // block_size``) join the chain (held by it or not); a
  chain no sequence holds any more becomes evictable, the newest;
- without chunked prefill, an iteration whose decodes were all preempted
  to make room prefills the waiting head instead, if it fits (a chain held
  deeper than its holders use can force that; without prefix caching it
  cannot happen).

Where the engines differ we took: a chain is held whole while any
sequence holds part of it (vLLM frees per block: the blocks beyond every
holder's hit stay evictable), which is the same for a system prompt
(every request holds all of it) and a session (a turn holds all its
predecessor's context), and otherwise keeps blocks a little longer; the
multi-level feedback queue's test of whether its head fits counts the free
blocks as above, not the head's hits.
Counted: the prefix's hits and lookups (tokens, every admission), the
blocks evicted.

The loop never visits every running sequence at an iteration: a decode
round is a counter, and a sequence joining the decodes records the round it
joined at, so that its length, its completion round, the decodes' context
(a sum) and the new blocks a round takes (a count per block phase) follow in
O(1) per event; the gaps between tokens are counted per group of sequences
whose last token came at the same instant.  The completion rounds are a
bucket queue (a calendar): a ring of lists, one per round, longer than any
output, so that a round's list holds exactly the sequences that complete in
it, in the order ``request x (max_num_seqs + 1) + slot`` (a preempted
sequence leaves its list at once).

The kernel is compiled several times from this one code
(:func:`~.common.variant`): :func:`continuous_kernel` has every feature,
and :data:`lean_kernel`, with :data:`FULL` off, has neither multi-step
scheduling, the prefill's attention term, the request classes'
statistics, goodput's count, prefix caching nor the admission orders that
read the classes or count the tokens served (earliest deadline first, fair
sharing, the feedback queue: :data:`.admission.FULL_ONLY`), whose branches
and arrays cost the loop several % where they are never taken (``make
bench``).  Each of those orders has a full kernel of its own
(:data:`order_kernels`: its code the constant :data:`ADMISSION`), with none
of the other orders' code: 2.5 to 4 % faster than the full kernel, at the
price of compiling it (about 30 s of CPU cold, the first time a process
runs the order, then the disk cache's).  :func:`advance` runs the lean one
where a run uses none of the full kernel's features (:func:`uses_full`),
else its order's where it has one (:func:`kernel_of`): they give the same
numbers, bit for bit, where several apply.  A cluster's engines run
:func:`continuous_kernel`, compiled into their driver.

Pure numba on arrays and scalars; the Python side is
:mod:`mbbatch.planners.continuous`.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .common import (ARR_POISSON, ARRIVED, HIST_SIZE, STOP, STOP_SIZE, arrival_group, check_stop, draw_arrivals,
                     drawers, extra_experts, helper, hist_bucket, kernel, load_tuple, step, subroutine,
                     variant)
from .controller import (A, BATCH_STATS, C as CT, CONTROLLER, DEFAULT_EMA, DEFAULT_TOKENS, MEMORY, SLA, T, b_mem_core,
                         b_sla, controller_init, feedback_core)
from .controller import M as MM
from .cost import FIELDS as COST_FIELDS, N as N_COST, PER_EXPERT, PREFILL_ATTENTION, cost, prefill_square
from . import admission
from .admission import class_of
from .common import blocks as _blocks
from .layout import Arrays, Layout
from .programs import _heap_pop, _heap_push

#: the admission orders' codes, by name (:data:`.admission.ORDERS`)
ADMISSIONS = admission.CODES
#: the kernel's codes: done (every one of the run's ``n`` requests served: a cluster's engine may be given more
#: and called again), stopped (Ctrl-C), paused (at ``until``: :func:`advance`), stalled (a bug, which the planner
#: reports: requests run or wait, nothing runs and nothing can be admitted)
DONE, STOPPED, PAUSED, STALLED = 0, 1, 2, 3
#: no limit on the KV blocks
UNLIMITED = 1 << 62
#: compile-time: multi-step scheduling, the prefill's attention term, the request classes' statistics and the
#: admission orders' token accounting in the kernel (False in :data:`lean_kernel`, the same code compiled without
#: them)
FULL = True
#: compile-time: the decode pool's KV caches pulled (:func:`_pull_heads`, :func:`_land`) in the kernel (the full
#: kernel's, and :data:`decode_kernel`'s: the lean kernel with them; False in :data:`lean_kernel`)
PULLS = True
#: compile-time: the admission order's code of a kernel compiled for one order (:data:`order_kernels`); -1: the
#: run's, read from its configuration
ADMISSION = -1
#: compile-time: the kernel writes the run's statistics (:func:`_publish`) as it returns (False in a driver's
#: hot resumes, ``.continuous_cluster._inlined_engine``: the driver writes them once, :func:`published`, as its
#: run ends)
PUBLISH = True

#: the run's scalars (``blocks``: the KV capacity in blocks, -1: none)
CONFIG = Layout("continuous run", ints=("n", "arrival_kind", "max_num_seqs", "max_batched_tokens", "chunked",
                                        "blocks", "block_size", "admission", "bins", "keep", "controlled",
                                        "memory_on", "scheduler_steps", "goodput", "quantum"),
                floats=("rate", *COST_FIELDS, "expert_span", "expert_miss", "request_overhead", "aging", "until"))
#: read-only inputs: replayed arrival times, the arrival process's
#: parameters and change times, the requests' lengths (whole tokens) and
#: predicted outputs, the bins' inner edges (tokens), the prompt tokens
#: whose KV cache each request brings (empty: none; a decode stage's) and
#: the seconds its pull of that cache takes (empty, or 0: none), the instant
#: its blocks are freed if it completes before (empty: none), each
#: request's class (empty: none, one class), and each class's objectives on
#: the time to first token (s) and per output token (s/token; inf: none);
#: with prefix caching (``chain`` not empty), each request's chain (-1: none)
#: and the prompt tokens it shares with it, and whether each chain grows by
#: its requests' contexts (a session's)
INPUTS = Arrays("ContinuousInputs", __name__, readonly=True, optional=("chain", "shared", "grows", "pull", "release"),
                arrival_times=np.float64, arrival_params=np.float64,
                arrival_ends=np.float64, prompt=np.float64, output=np.float64, prediction=np.float64,
                edges=np.float64, cached=np.float64, pull=np.float64, release=np.float64, klass=np.float64,
                class_slo=np.float64,
                class_tpot=np.float64, chain=np.float64, shared=np.float64, grows=np.float64)
ContinuousInputs = INPUTS.type
#: the random streams: arrival gaps
ContinuousStreams = namedtuple("ContinuousStreams", ("arrival",))
STATS = Layout("continuous statistics", ints=("completed", "iterations", "rounds", "preemptions", "recomputed",
                                              "prefill_tokens", "tokens", "tbt_count", "max_running",
                                              "ts_rows", "ts_stride", "good", "prefix_hits", "prefix_queries",
                                              "evictions"),
               floats=("first_arrival", "last_completion", "busy", "sum_latency", "sum_ttft", "sum_tbt",
                       "running_time", "blocks_time", "waiting_time", "sum_batch", "system_time", "cap_time"))

#: the outputs: histograms of the latency, the time to first token and the
#: time between tokens (every gap between two tokens of a request), the
#: latencies summed per group of arrivals (batch means), the iterations by
#: the sequences they process (decodes and prefill chunks), and the time series
#: (:data:`TS` columns, a row every ``ts_stride`` iterations, the stride
#: doubling whenever the rows fill)
OUTPUTS = Arrays("ContinuousOutputs", __name__, ints=np.int64, floats=np.float64, hist=np.int64,
                 hist_ttft=np.int64, hist_tbt=np.int64, group_latency=np.float64, group_count=np.int64,
                 ts=(np.float64, 2), size_hist=np.int64, ctl=np.float64, bstats=np.float64,
                 class_stats=(np.float64, 2), class_hist=(np.int64, 3))
ContinuousOutputs = OUTPUTS.type
#: per class (the requests having classes; else none): the requests completed, the sums of their latencies and
#: times to first token, those whose first token came within their class's objective, and (``goodput``) those
#: that met both its objectives, on the first token and per output token (``class_stats``
#: columns); ``class_hist[c]``: class c's histograms of the latency and of the time to first token
CLASS = namedtuple("CLASS", ("completed", "sum_latency", "sum_ttft", "ttft_met", "good"))(0, 1, 2, 3, 4)
#: per-request records (``keep``): preemptions; arrival, first admission,
#: first token and completion
REQUESTS = Layout("continuous requests", ints=("preemptions",),
                  floats=("arrival", "admitted", "first_token", "completion"))
#: the kernel's arrays: per request its arrival; per preempted request, on
#: the resumption stack (at most ``max_num_seqs`` deep), the request, its
#: tokens generated and the time of its last token; per running sequence (a
#: slot of ``max_num_seqs + 1``: the memory a run touches grows with the
#: engine, not with n) its request, tokens generated (before its admission,
#: then when it joined the decodes), tokens prefilled and to prefill, the
#: round it joined the decodes at, its completion round (-1: not decoding),
#: its links in the running list (admission order), the time of its last
#: token, and the free slots; the links of the bins' queues; the heaps
#: (completion rounds, by request and slot; predictions), the prefill
#: queue (slots), the bins' heads and tails, the decodes per block phase,
#: the groups of decodes by their last token's time, the scratch of an
#: iteration's prefill chunks, the arrival drawer's address, and (multi-step
#: scheduling) the requests whose first token or last token an unfinished
#: block holds back; where a cluster's engines hand requests back to its
#: router (:func:`.continuous_cluster._hand_back`; else empty), per request the time it first
#: arrived (``origin``: ``arrival`` is the time it reached this engine) and
#: the log of those the engine handed back; the pulls under way, a heap by landing time and then the order
#: they started (``pull_t``; ``pull_k``: that order x (max_num_seqs + 1) + slot); the blocks held past their
#: requests' completions, a heap by release instant (``rel_t``; ``rel_b``: the blocks); the log of the pulls
#: started since the driver emptied it (``pull_log``: each request's number and landing; empty: none kept)
WORKSPACE = Arrays("ContinuousWorkspace", __name__, arrival=np.float64, gen=np.int64, last_pre=np.float64,
                   occ=np.int64, gs=np.int64, pre=np.int64, need=np.int64, d0=np.int64, fin=np.int64,
                   prv=np.int64, nxt=np.int64, last=np.float64, free_slots=np.int64, qnext=np.int64,
                   due=np.int64, due_tail=np.int64, due_next=np.int64, due_prev=np.int64, sk=np.float64, sid=np.int64,
                   stack=np.int64, pq=np.int64,
                   bh=np.int64, bt=np.int64, phase=np.int64, gt=np.float64, gc=np.int64, chunk=np.int64,
                   tally=np.int64, state_i=np.int64, state_f=np.float64, group=np.int64, draws=np.int64,
                   pend_first=np.int64, pend_done=np.int64, vtc=np.float64, vtc_decoding=np.int64, first=np.float64,
                   mlfq=np.int64, resume_last=np.float64, pc=np.int64, prefs=np.int64, lru_prev=np.int64,
                   lru_next=np.int64, lru_time=np.float64, pin=np.int64, done_log=(np.float64, 2), origin=np.float64,
                   handed=np.int64, pull_t=np.float64, pull_k=np.int64, rel_t=np.float64, rel_b=np.int64,
                   pull_log=(np.float64, 2))
ContinuousWorkspace = WORKSPACE.type
#: the workspace's per-request arrays that start unset (``np.empty``: the
#: kernel writes an entry before it reads it), so that the pages of those
#: a run does not reach are never touched (a cluster's engines each hold
#: every request they might be routed)
UNSET = ("arrival", "qnext", "sk", "sid", "group", "first", "mlfq", "resume_last", "origin", "handed")

#: an engine's scalars between two calls of the kernel (a run advanced to a
#: time, then resumed: :func:`advance`); ``started``: not the first call
STATE = Layout("continuous engine state",
               ints=("head", "tail", "running", "n_dec", "s0", "ssize", "nstack", "pq_h", "pq_n", "qh",
                     "waiting", "rr", "rounds", "ph", "n_main", "ng", "completed", "iterations", "prefill_tokens",
                     "tokens", "tbt_count", "sum_batch", "i", "nfree", "free", "blocks_total", "block_left", "npf",
                     "npd",
                     # (kept here, not in the loop's registers: counted as they change, read at each iteration)
                     "started", "completed_before", "logged", "preemptions", "recomputed", "max_running", "ts_rows",
                     "ts_stride", "ts_due", "quotas_due",
                     # (prefix caching: the unreferenced chains' order, oldest first, their blocks, the counters)
                     "lru_head", "lru_tail", "evictable", "prefix_hits", "prefix_queries", "evictions",
                     # (the requests the engine handed back to its cluster's router, in all:
                     # .continuous_cluster._hand_back)
                     "handed",
                     # (the pulls under way, and those started in all)
                     "npull", "pulls",
                     # (the releases of held blocks due, and the blocks held; the pulls logged)
                     "nheld", "held", "pulled"),
               floats=("t_round", "busy", "sum_latency", "sum_ttft", "sum_tbt", "running_time", "blocks_time",
                       "waiting_time", "system_time", "last_completion", "now",
                       "cap_time", "last_iteration",
                       # (an engine paused with nothing to run but pulls or blocks held: when the first lands
                       # or is released, or the next arrival comes; -inf otherwise: .continuous_cluster._earliest)
                       "wake"))
#: the scalars the loop keeps as locals (the first of the state's ints and floats; the others it counts in place)
LOOP_INTS = STATE.ints.index("started")
LOOP_FLOATS = STATE.floats.index("cap_time")

#: the time series' columns
TS = namedtuple("TS", ("time", "running", "waiting", "kv_blocks", "max_num_seqs"))(0, 1, 2, 3, 4)
TS_WIDTH = len(TS)
#: the requests completed in an iteration (Algorithm 7's batch): their count, the sums of their prompts, outputs
#: and squared prompt + output, and the longest output (whole tokens: exact in any order)
TALLY = namedtuple("TALLY", ("n", "prompt", "output", "square", "longest"))(0, 1, 2, 3, 4)

C = CONFIG.index
#: the iteration cost's coefficients in the floats (:mod:`.cost`)
C_COST = getattr(C, COST_FIELDS[0])
S = STATS.index
ES = STATE.index
RQ = REQUESTS.index
#: the statistics that are the engine's counters of the same name: (statistic, counter) indices, ints and floats
STATS_FROM_STATE = tuple(tuple((getattr(S, f), getattr(ES, f)) for f in mine if f in theirs)
                         for mine, theirs in ((STATS.ints, STATE.ints), (STATS.floats, STATE.floats)))


@step
def order_parameters(ci, cf, coef, full):
    """The admission orders' parameters ``par`` (:mod:`.admission`) of a
    run's configuration (``ci``, ``cf``; ``coef`` its iteration cost's
    coefficients), for the kernel variant ``full``."""
    return (cf[C.aging], full, ci[C.goodput] != 0, ci[C.quantum], coef, cf[C.expert_span], cf[C.expert_miss])


@step
def _shift(bs):
    """log2 of ``bs`` where a power of two (a block size that divides by
    shifts and masks), else -1."""
    sh = -1
    if bs & (bs - 1) == 0:
        sh = 0
        while (1 << sh) < bs:
            sh += 1
    return sh


@step
def _phase(x, bs, sh):
    """``x`` mod ``bs``, in [0, bs) (a mask where ``bs`` is a power of two:
    two's complement keeps a negative x's residue)."""
    return x & (bs - 1) if sh >= 0 else x % bs


@step
def _waiting_head(adm, q, par, waiting, nstack, ws, inputs, rounds):
    """The request admitted next and its bin: ``(-1, -1)`` when none waits;
    the last preempted (bin -1), else the admission order's head
    (:func:`.admission.head`)."""
    if nstack > 0:
        return ws.stack[nstack - 1], -1
    if waiting == 0:
        return -1, -1
    return admission.head(adm, par[1], q, par, ws, inputs, rounds)


@step
def _join_arrivals(i, n, now, adm, q, par, rounds, waiting, system_time, ws, inputs, keep, r_f):
    """The arrivals up to ``now`` join the waiting requests (their order's
    queue).  Returns ``(i, q, waiting, system_time)`` after."""
    arrival = ws.arrival
    while i < n and arrival[i] <= now:
        q = admission.join(adm, par[1], q, i, par, ws, inputs, rounds)
        # (it arrived during the iteration that just ended: in the engine since)
        system_time += now - arrival[i]
        if keep:
            r_f[RQ.arrival, i] = admission.arrived(FULL, ws, i)
        waiting += 1
        i += 1
    return i, q, waiting, system_time


@step
def _due_push(due, due_tail, due_next, due_prev, occ, M1, sl, key):
    """Slot ``sl``, whose decodes complete at round ``key``, into that round's
    list (``due[key mod len(due)]``, its last ``due_tail[...]``), in the
    order of ``request x M1 + slot``.  A slot goes to the list's end in
    O(1) where it sorts after the last, as the sequences joining or
    reconsidered at one round do (in the order of their list or their
    admission); else the list is walked from its head."""
    b = key & (due.shape[0] - 1)
    me = occ[sl] * M1 + sl
    last = due_tail[b]
    if last < 0 or occ[last] * M1 + last < me:
        due_next[sl] = -1
        due_prev[sl] = last
        if last >= 0:
            due_next[last] = sl
        else:
            due[b] = sl
        due_tail[b] = sl
        return
    # (the last sorts after sl: the walk stops on the list, never past its end)
    before = -1
    at = due[b]
    while occ[at] * M1 + at < me:
        before = at
        at = due_next[at]
    due_next[sl] = at
    due_prev[sl] = before
    due_prev[at] = sl
    if before >= 0:
        due_next[before] = sl
    else:
        due[b] = sl


@step
def _due_remove(due, due_tail, due_next, due_prev, sl, key):
    """Slot ``sl`` out of the list of round ``key`` (preempted)."""
    b = key & (due.shape[0] - 1)
    if due_prev[sl] >= 0:
        due_next[due_prev[sl]] = due_next[sl]
    else:
        due[b] = due_next[sl]
    if due_next[sl] >= 0:
        due_prev[due_next[sl]] = due_prev[sl]
    else:
        due_tail[b] = due_prev[sl]


@step
def _release(s, occ, free_slots, nfree):
    """Slot s freed (its sequence done or preempted); returns the free slots."""
    occ[s] = -1
    free_slots[nfree] = s
    return nfree + 1


@step
def _met(r, now, first, since, delay, inputs, c):
    """Whether request r, done at ``now`` (its first token at ``first``),
    met both its class c's objectives: its time to first token (with its
    ``delay`` outside the engine) and its time per output token, the time
    from its first token to its last over its other tokens (none: 0), as
    DistServe's goodput counts them (Zhong et al., 2024, arXiv:2401.09670);
    ``since``: its arrival (:func:`.admission.arrived`)."""
    o = inputs.output[r]
    tpot = (now - first) / (o - 1.0) if o > 1.0 else 0.0
    return first - since + delay <= inputs.class_slo[c] and tpot <= inputs.class_tpot[c]


@step
def _done(r, now, n, gscale, ws, out, inputs, keep, r_f, delay, full, good):
    """Request r's last token returned at ``now``: its latency (plus its
    ``delay`` outside the engine) into the histogram (and its class's) and
    its batch-means group, its record kept; with ``good``, counted if it met
    its objectives (:func:`_met`, from its first token's time ``ws.first[r]``:
    -inf where a multi-step block holds that token back, to return it at
    the block's end, which is ``now``: the block's last iteration ends at
    it)."""
    since, group = admission.arrived(full, ws, r), ws.group
    lat = now - since + delay
    out.hist[hist_bucket(lat)] += 1
    classed = full and inputs.klass.shape[0] > 0
    c = class_of(inputs, r)
    if full and good and _met(r, now, ws.first[r] if ws.first[r] > -np.inf else now, since, delay, inputs, c):
        out.ints[S.good] += 1
        if classed:
            out.class_stats[c, CLASS.good] += 1.0
    if classed:
        out.class_stats[c, CLASS.completed] += 1.0
        out.class_stats[c, CLASS.sum_latency] += lat
        out.class_hist[c, 0, hist_bucket(lat)] += 1
    g = group[r] if group.shape[0] > 0 else arrival_group(r, out.group_latency.shape[0], n, gscale)
    out.group_latency[g] += lat
    out.group_count[g] += 1
    if keep:
        r_f[RQ.completion, r] = now
    if full and ws.done_log.shape[1] > 0:
        _log_done(r, now, ws)


@step
def _log_done(r, now, ws):
    """Request r, done at ``now``, into the completions' log (``ws.done_log``:
    its rows the requests and their times, ``ES.logged`` of them since its
    reader emptied it; those past its end are not kept): a closed loop's
    driver reads it (:mod:`.continuous_cluster`)."""
    k = ws.state_i[ES.logged]
    if k < ws.done_log.shape[1]:
        ws.done_log[0, k] = r
        ws.done_log[1, k] = now
        ws.state_i[ES.logged] = k + 1


@step
def _unlink(s, prv, nxt, head, tail, occ, free_slots, nfree):
    """Slot s out of the running list and freed, its request's record left
    for later (multi-step: its last token is returned at its block's end).
    Returns ``(head, tail, nfree)`` after."""
    if prv[s] >= 0:
        nxt[prv[s]] = nxt[s]
    else:
        head = nxt[s]
    if nxt[s] >= 0:
        prv[nxt[s]] = prv[s]
    else:
        tail = prv[s]
    return head, tail, _release(s, occ, free_slots, nfree)


@step
def _first_token(r, now, since, delay, out, inputs, keep, r_f, full, good, first):
    """Request r's first token returned at ``now``: its time to first token
    (from its arrival ``since``, :func:`.admission.arrived`, plus its
    ``delay`` outside the engine) into the histogram (and its
    class's, counted within its class's objective or not), its record
    kept.  Returns the time to first token."""
    ttft = now - since + delay
    out.hist_ttft[hist_bucket(ttft)] += 1
    if full and good:
        first[r] = now
    if full and inputs.klass.shape[0] > 0:
        c = class_of(inputs, r)
        out.class_stats[c, CLASS.sum_ttft] += ttft
        if ttft <= inputs.class_slo[c]:
            out.class_stats[c, CLASS.ttft_met] += 1.0
        out.class_hist[c, 1, hist_bucket(ttft)] += 1
    if keep:
        r_f[RQ.first_token, r] = now
    return ttft


@subroutine
def _return_block(npf, npd, ws, now, out, inputs, requests, config):
    """Multi-step scheduling: the block that ends at ``now`` returns the
    tokens it held back, the first tokens of its ``npf`` requests
    ``ws.pend_first`` and the last of its ``npd`` requests ``ws.pend_done``.
    Returns the sums of their times to first token and of their latencies.
    (Given the kernel's structures, not their arrays: the call sits in the
    loop, and each argument it passes is a value the loop keeps.)"""
    pend_first, pend_done = ws.pend_first, ws.pend_done
    ci, cf = config
    n = ci[C.n]
    keep = ci[C.keep] != 0
    good = ci[C.goodput] != 0
    gscale = out.group_latency.shape[0] / n if n > 0 else 0.0
    r_f = requests[1]
    delay = cf[C.request_overhead]
    s_ttft = 0.0
    for k in range(npf):
        r = pend_first[k]
        s_ttft += _first_token(r, now, admission.arrived(True, ws, r), delay, out, inputs, keep, r_f, True, good,
                               ws.first)
    s_lat = 0.0
    for k in range(npd):
        r = pend_done[k]
        _done(r, now, n, gscale, ws, out, inputs, keep, r_f, delay, True, good)
        s_lat += now - admission.arrived(True, ws, r) + delay
    return s_ttft, s_lat


@subroutine
def _prefill_squares(nc, pq_h, ws, inputs):
    """The iteration's part of its prompts' squares (the prefill attention's
    feature, :mod:`.cost`): its ``nc`` chunks are those of the prefill
    queue's first ``nc`` sequences, in order (the prompts being prefilled,
    then those admitted, appended), each ``chunk[k]`` tokens from the
    ``a`` its sequence holds already (a cached prompt's part, or those
    prefilled before), adding ``(a + c)^2 - a^2`` (a whole prompt of P
    tokens, in any chunks, P^2).  Called, not inlined, and given the
    kernel's structures rather than their arrays: a model without the term
    keeps the engine's loop as it was."""
    chunk, pq, occ, gs, need, pre = ws.chunk, ws.pq, ws.occ, ws.gs, ws.need, ws.pre
    prompt = inputs.prompt
    PQ = pq.shape[0]
    sq = 0.0
    for k in range(nc):
        at = pq_h + k
        sl = pq[at if at < PQ else at - PQ]
        a = np.int64(prompt[occ[sl]]) + gs[sl] - need[sl] + pre[sl]
        sq += prefill_square(float(a), float(chunk[k]))
    return sq


@subroutine
def _cap(ctl, bst, sla, memory, memory_on, M):
    """The running sequences allowed at this iteration under the controller
    (the dynamic-batching paper's vLLM patch setting ``max_num_seqs``):
    Algorithm 2's b_SLA (its interval moved in ``ctl``), with ``memory_on``
    at most Algorithm 1's b_mem from the completed requests' statistics
    ``bst``, and at most the engine's ``M`` slots."""
    b = b_sla(ctl, sla)
    if memory_on:
        mi, mf = memory
        bm = b_mem_core(mf[MM.eta], mi[MM.variant], mf[MM.z], mf[MM.default_tokens], mf[MM.b_min], mf[MM.b_max],
                        bst[T.avg_prompt], bst[T.avg_output], bst[T.count], bst[T.mean_tokens], bst[T.m2_tokens],
                        0.0)
        if bm < b:
            b = bm
    return b if b < M else np.int64(M)


@step
def _freed(p, o, bs, sh, tally, memory_on):
    """The KV blocks a request of prompt ``p`` and output ``o`` tokens frees
    as it completes (with ``memory_on``, counted into the iteration's tally
    first)."""
    if memory_on:
        _tally(tally, p, o)
    return _blocks(p + o, bs, sh)


@step
def _tally(tally, p, o):
    """Request of prompt ``p`` and output ``o`` tokens completed: into the iteration's tally."""
    tally[TALLY.n] += 1
    tally[TALLY.prompt] += p
    tally[TALLY.output] += o
    tally[TALLY.square] += (p + o) * (p + o)
    if o > tally[TALLY.longest]:
        tally[TALLY.longest] = o


@subroutine
def _feedback(ctl, bst, tally, ema, t, size, running):
    """Algorithm 7 after an iteration of ``size`` sequences that took ``t``
    (the time between tokens of its decodes), ``running`` sequences left:
    the completed requests' statistics (the tally, emptied) when any, the
    controller's EMAs of the time between tokens and of the iteration's
    sequences, its N_decode and update count."""
    nb = tally[TALLY.n]
    if nb > 0:
        s = tally[TALLY.prompt] + tally[TALLY.output]
        # (their squared deviations from their mean, from whole-token sums: exact in any order)
        m2_b = float(nb * tally[TALLY.square] - s * s) / nb
        (bst[T.avg_prompt], bst[T.avg_output], bst[T.count], bst[T.mean_tokens], bst[T.m2_tokens], _,
         _) = feedback_core(nb, float(tally[TALLY.prompt]), float(tally[TALLY.output]), m2_b,
                            float(tally[TALLY.longest]), t, t, ema, bst[T.avg_prompt], bst[T.avg_output],
                            bst[T.count], bst[T.mean_tokens], bst[T.m2_tokens], 0.0, 0.0)
        for k in range(tally.shape[0]):
            tally[k] = 0
    # (the controller's half of the same step, the iteration its batch)
    _, _, _, _, _, ctl[CT.tau_avg], ctl[CT.b_avg] = feedback_core(
        size, 0.0, 0.0, 0.0, 1.0, t, t, ema, 0.0, 0.0, 0.0, 0.0, 0.0, ctl[CT.tau_avg], ctl[CT.b_avg])
    ctl[CT.n_decode] = float(running)
    ctl[CT.updates] += 1.0


@step
def _end_block(full, block_left, n_dec, npf, npd, now, sum_ttft, acc, ws, out, inputs, requests, config):
    """Multi-step scheduling (``full``): a block with nothing left to decode
    ends, and the block that ended returns the tokens it held back.  Returns
    ``(block_left, npf, npd, sum_ttft, acc)`` after."""
    if full and block_left > 0 and n_dec == 0:
        block_left = 0
    if full and block_left == 0 and npf + npd > 0:
        d_ttft, d_lat = _return_block(npf, npd, ws, now, out, inputs, requests, config)
        completed, sum_lat, last_done = acc
        sum_ttft += d_ttft
        acc = (completed + npd, sum_lat + d_lat, now if npd > 0 else last_done)
        npf = 0
        npd = 0
    return block_left, npf, npd, sum_ttft, acc


@step
def _caching(par, inputs):
    """Whether the run caches prefixes: the full kernel's feature, on when
    the requests' chains are given."""
    return par[1] and inputs.chain.shape[0] > 0


@step
def prefix_blocks(s, L0, bs):
    """The full blocks of ``bs`` tokens of a shared prefix of ``s`` tokens
    that a request of ``L0`` tokens can hit: of at most ``L0 - 1`` tokens
    (one at least is computed)."""
    return (s if s < L0 - 1 else L0 - 1) // bs


@step
def _prefix_look(r, L0, bs, ws, inputs):
    """Prefix caching: request ``r``, of ``L0`` tokens (its prompt and those
    generated), looked up in its chain's cache.  Returns ``(c, k, h)``: its
    chain (-1: none), the full blocks ``k`` of the prefix it shares (of at
    most ``L0 - 1`` tokens: one at least is computed) and those of them
    cached ``h``.  A request whose prefix fills no block holds no chain
    (-1)."""
    z = np.int64(0)
    c = np.int64(inputs.chain[r])
    if c < 0:
        return c, z, z
    s = np.int64(inputs.shared[r])
    k = prefix_blocks(s, L0, bs)
    if k == 0:
        return np.int64(-1), z, z
    cached = ws.pc[c]
    return c, k, cached if cached < k else k


@step
def _lru_join(a, b, ws):
    """Chain ``a`` just before chain ``b`` in the unreferenced chains'
    order (-1: the order's start or end)."""
    if a >= 0:
        ws.lru_next[a] = b
    else:
        ws.state_i[ES.lru_head] = b
    if b >= 0:
        ws.lru_prev[b] = a
    else:
        ws.state_i[ES.lru_tail] = a


@step
def _lru_unlink(c, ws):
    """Chain ``c`` out of the unreferenced chains' order."""
    _lru_join(ws.lru_prev[c], ws.lru_next[c], ws)


@step
def _lru_push(c, now, ws):
    """Chain ``c``, unreferenced at ``now``, into the unreferenced chains'
    order: the newest (among those released at the same instant, after the
    lower chains, before the higher: an order that does not depend on the
    order the engine releases them in)."""
    si = ws.state_i
    t = si[ES.lru_tail]
    while t >= 0 and ws.lru_time[t] == now and t > c:
        t = ws.lru_prev[t]
    nx = ws.lru_next[t] if t >= 0 else si[ES.lru_head]
    _lru_join(t, c, ws)
    _lru_join(c, nx, ws)
    ws.lru_time[c] = now


@step
def _pin_chain(c, k, sl, ws):
    """Prefix caching: the sequence of slot ``sl`` admitted holding chain
    ``c``'s first ``k`` blocks: the chain referenced (if no sequence held
    it: out of the unreferenced order, its blocks no longer evictable, those
    beyond ``k`` evicted), cached to ``k`` blocks at least (the sequence's
    own beyond the hit join it)."""
    if c < 0:
        return
    pc = ws.pc
    if ws.prefs[c] == 0 and pc[c] > 0:
        _lru_unlink(c, ws)
        ws.state_i[ES.evictable] -= pc[c]
        if pc[c] > k:
            ws.state_i[ES.evictions] += pc[c] - k
            pc[c] = k
    ws.prefs[c] += 1
    if k > pc[c]:
        pc[c] = k
    ws.pin[sl] = k


@step
def _evict(free, ws):
    """Prefix caching: after blocks were taken, while the free blocks
    (``free`` counts the evictable ones) are fewer than the evictable, the
    deepest blocks of the chain unreferenced longest are evicted, then the
    next chain's."""
    si = ws.state_i
    x = si[ES.evictable] - free
    if x <= 0:
        return
    si[ES.evictable] = free
    si[ES.evictions] += x
    pc = ws.pc
    while x > 0:
        c = si[ES.lru_head]
        take = pc[c] if pc[c] < x else x
        pc[c] -= take
        x -= take
        if pc[c] == 0:
            _lru_unlink(c, ws)


@step
def _unpin(sl, r, o, now, free, bs, ws, inputs):
    """Prefix caching: the sequence of slot ``sl`` (request ``r``) left the
    running at ``now``, ``free`` counting all its blocks freed: the chain
    blocks it holds stay the chain's; completed (``o`` its output; 0:
    preempted) in a chain that grows (a session's), its context's full
    blocks join the chain, held or not; a chain no sequence holds now is
    evictable, the newest in the order.  Returns ``free`` after."""
    c = np.int64(inputs.chain[r])
    if c < 0:
        return free
    k = ws.pin[sl]
    ws.pin[sl] = 0
    free -= k
    pc, si = ws.pc, ws.state_i
    if o > 0 and inputs.grows[c] != 0.0:
        kf = (np.int64(inputs.prompt[r]) + o - 1) // bs
        if kf > pc[c]:
            d = kf - pc[c]
            if k == 0 and ws.prefs[c] == 0:
                # (a chain it does not hold, nor any other: its new blocks are evictable, it the newest)
                if pc[c] > 0:
                    _lru_unlink(c, ws)
                si[ES.evictable] += d
                pc[c] = kf
                _lru_push(c, now, ws)
                return free
            free -= d
            pc[c] = kf
    if k == 0:
        return free
    ws.prefs[c] -= 1
    if ws.prefs[c] == 0 and pc[c] > 0:
        free += pc[c]
        si[ES.evictable] += pc[c]
        _lru_push(c, now, ws)
    return free


@step
def _need(r, L0, bs, sh, par, ws, inputs):
    """The free blocks request ``r`` (``L0`` tokens: prompt and generated)
    needs to be admitted: its tokens' and its first token's, less, with
    prefix caching, its chain's cached blocks where a running sequence holds
    the chain (an unheld chain's hit blocks are counted free: holding it
    takes them).  Returns ``(need, c, k, h)`` (:func:`_prefix_look`; no
    chain and no hit without prefix caching)."""
    nb = _blocks(L0 + 1, bs, sh)
    if _caching(par, inputs):
        c, k, h = _prefix_look(r, L0, bs, ws, inputs)
        return (nb - h if c >= 0 and ws.prefs[c] > 0 else nb), c, k, h
    z = np.int64(0)
    return nb, np.int64(-1), z, z


@step
def _head_fits(adm, q, par, waiting, nstack, free, rounds, bs, sh, ws, inputs):
    """Whether the waiting head (:func:`_waiting_head`) fits the free
    blocks (:func:`_need`); False with none waiting."""
    r, _ = _waiting_head(adm, q, par, waiting, nstack, ws, inputs, rounds)
    return r >= 0 and _need(r, np.int64(inputs.prompt[r]) + _resumes(adm, par, nstack, r, ws)[0], bs, sh, par, ws,
                            inputs)[0] <= free


@step
def _preempt(slots, running, n_dec, s0, n_main, pq_n, free, nstack, rounds, t_round, ng, now, bs, sh, adm, par,
             ws, inputs, keep, r_i):
    """The most recently admitted running sequence (the list's tail)
    preempted: out of the decodes (its round's list, its length now) or the
    prefill queue (its last), its blocks and slot freed, onto the
    resumption stack with its tokens generated and its last token's time.
    Returns ``(slots, running, n_dec, s0, n_main, pq_n, free, nstack)``
    after."""
    occ, prv, nxt, fin, gs, d0, last, gt, gc = ws.occ, ws.prv, ws.nxt, ws.fin, ws.gs, ws.d0, ws.last, ws.gt, ws.gc
    head, tail, nfree = slots
    sl = tail
    r = occ[sl]
    tail = prv[sl]
    if tail >= 0:
        nxt[tail] = -1
    else:
        head = -1
    running -= 1
    p = np.int64(inputs.prompt[r])
    if fin[sl] >= 0:
        # a decode: its length now, then out of the decodes and its round's list
        _due_remove(ws.due, ws.due_tail, ws.due_next, ws.due_prev, sl, fin[sl])
        if par[1]:
            admission.served(adm, par[1], admission.LEFT, r, rounds, par, ws, inputs)
        gj = gs[sl]
        g = gj + rounds - d0[sl]
        n_dec -= 1
        s0 -= p + gj - d0[sl]
        ws.phase[_phase(p + gj - d0[sl], bs, sh)] -= 1
        fin[sl] = -1
        lt = last[sl]
        if d0[sl] < rounds:
            n_main -= 1
            lt = t_round
        else:
            for k in range(ng):
                if gt[k] == lt:
                    gc[k] -= 1
                    break
        free += _blocks(p + g, bs, sh)
    else:
        # prefilling: the last of the prefill queue
        g = gs[sl]
        lt = last[sl]
        pq_n -= 1
        free += _blocks(p + g + 1, bs, sh)
    if _caching(par, inputs):
        free = _unpin(sl, r, 0, now, free, bs, ws, inputs)
    nfree = _release(sl, occ, ws.free_slots, nfree)
    ws.state_i[ES.preemptions] += 1
    if keep:
        r_i[RQ.preemptions, r] += 1
    ws.stack[nstack] = r
    ws.gen[nstack] = g
    ws.last_pre[nstack] = lt
    return (head, tail, nfree), running, n_dec, s0, n_main, pq_n, free, nstack + 1


@step
def _make_room(ph, slots, running, n_dec, s0, n_main, pq_n, free, nstack, rounds, t_round, ng, now, bs, sh, adm,
               par, ws, inputs, keep, r_i):
    """The decodes' new blocks (those of block phase ``ph``) taken, the most
    recently admitted preempted while they do not fit.  Returns ``(slots,
    running, n_dec, s0, n_main, pq_n, free, nstack)`` after."""
    want = ws.phase[ph] if n_dec > 0 else 0
    while want > free:
        slots, running, n_dec, s0, n_main, pq_n, free, nstack = _preempt(
            slots, running, n_dec, s0, n_main, pq_n, free, nstack, rounds, t_round, ng, now, bs, sh, adm, par, ws,
            inputs, keep, r_i)
        want = ws.phase[ph] if n_dec > 0 else 0
    return slots, running, n_dec, s0, n_main, pq_n, free - want, nstack


@step
def _continue_prefills(pq_h, pq_n, budget, ws):
    """The prompts being prefilled take chunks of the iteration's token
    budget, in admission order.  Returns ``(nc, budget, ptok)``: the chunks
    (``ws.chunk``), the budget left and the tokens they prefill."""
    pq, chunk, need, pre = ws.pq, ws.chunk, ws.need, ws.pre
    PQ = pq.shape[0]
    nc = 0
    ptok = 0
    for k in range(pq_n):
        if budget <= 0:
            break
        at = pq_h + k
        sl = pq[at if at < PQ else at - PQ]
        c = need[sl] - pre[sl]
        if c > budget:
            c = budget
        chunk[nc] = c
        nc += 1
        budget -= c
        ptok += c
    return nc, budget, ptok


@step
def _take_slot(r, g0, lt, todo, slots, ws):
    """A free slot for request ``r`` (``g0`` tokens generated, its last at
    ``lt``, ``todo`` to prefill), not decoding.  Returns ``(slot, slots)``."""
    head, tail, nfree = slots
    nfree -= 1
    sl = ws.free_slots[nfree]
    ws.occ[sl] = r
    ws.gs[sl] = g0
    ws.last[sl] = lt
    ws.need[sl] = todo
    ws.pre[sl] = 0
    ws.fin[sl] = -1
    return sl, (head, tail, nfree)


@step
def _enqueue(sl, slots, pq_h, pq_n, ws):
    """Slot ``sl`` at the tails of the running list and of the prefill
    queue.  Returns ``(slots, pq_n)`` after."""
    head, tail, nfree = slots
    ws.prv[sl] = tail
    ws.nxt[sl] = -1
    if tail >= 0:
        ws.nxt[tail] = sl
    else:
        head = sl
    pq = ws.pq
    at = pq_h + pq_n
    pq[at if at < pq.shape[0] else at - pq.shape[0]] = sl
    return (head, sl, nfree), pq_n + 1


@step
def _place(r, g0, lt, todo, slots, pq_h, pq_n, ws):
    """Request ``r`` (``g0`` tokens generated, its last at ``lt``, ``todo``
    to prefill) into a free slot (:func:`_take_slot`), at the tails of the
    running list and of the prefill queue (:func:`_enqueue`).  Returns
    ``(slots, pq_n)`` after."""
    sl, slots = _take_slot(r, g0, lt, todo, slots, ws)
    return _enqueue(sl, slots, pq_h, pq_n, ws)


@step
def _pulls(r, nstack, inputs):
    """Whether the waiting head ``r`` pulls its KV cache: a request not
    taken from the resumption stack (``nstack`` is 0) whose ``pull`` is
    positive."""
    pull = inputs.pull
    return nstack == 0 and pull.shape[0] > 0 and pull[r] > 0.0


@step
def _pull_heads(adm, q, par, rounds, waiting, nstack, cap, running, free, slots, now, bs, sh, ws, inputs, keep, r_f):
    """The waiting heads that pull their KV cache (:func:`_pulls`; a
    request the admission order resumes, its tokens generated kept, does
    not), admitted while the running are fewer than ``cap`` and the free
    blocks hold the head's prompt and first token: each takes its blocks and
    a slot, out of the running list, and its pull lands ``pull`` s from
    ``now`` (:func:`_land`).  Stops at the first head that does not pull or
    does not fit.  Returns ``(q, waiting, running, free, slots)``."""
    si = ws.state_i
    M1 = ws.pull_t.shape[0]
    while running < cap:
        r, b = _waiting_head(adm, q, par, waiting, nstack, ws, inputs, rounds)
        if r < 0 or not _pulls(r, nstack, inputs):
            break
        g0, lt = _resumes(adm, par, nstack, r, ws)
        if g0 > 0:
            break
        need = _need(r, np.int64(inputs.prompt[r]), bs, sh, par, ws, inputs)[0]
        if need > free:
            break
        waiting -= 1
        q = admission.admit(adm, par[1], q, r, b, par, ws, inputs)
        if keep:
            r_f[RQ.admitted, r] = now
        free -= need
        sl, slots = _take_slot(r, g0, lt, np.int64(0), slots, ws)
        si[ES.npull] = _heap_push(ws.pull_t, ws.pull_k, si[ES.npull], now + inputs.pull[r], si[ES.pulls] * M1 + sl)
        if ws.pull_log.shape[1] > 0:
            ws.pull_log[0, si[ES.pulled]] = r
            ws.pull_log[1, si[ES.pulled]] = now + inputs.pull[r]
            si[ES.pulled] += 1
        si[ES.pulls] += 1
        running += 1
    return q, waiting, running, free, slots


@step
def _land(now, slots, pq_h, pq_n, ws):
    """The pulls landed by ``now`` (:func:`_pull_heads`), in the order they
    land: each sequence joins the running list's tail and the prefill queue
    with nothing to prefill.  Returns ``(slots, pq_n)`` after."""
    si = ws.state_i
    M1 = ws.pull_t.shape[0]
    while si[ES.npull] > 0 and ws.pull_t[0] <= now:
        _, k, si[ES.npull] = _heap_pop(ws.pull_t, ws.pull_k, si[ES.npull])
        slots, pq_n = _enqueue(k % M1, slots, pq_h, pq_n, ws)
    return slots, pq_n


@step
def _resumes(adm, par, nstack, r, ws):
    """The waiting head ``r``'s tokens generated and the time of its last:
    the resumption stack's top's (``nstack`` > 0), else those its order
    kept (:func:`.admission.resume`: 0 for a new request)."""
    if nstack > 0:
        return ws.gen[nstack - 1], ws.last_pre[nstack - 1]
    if par[1]:
        return admission.resume(adm, par[1], r, ws)
    return np.int64(0), 0.0


@step
def _admit(adm, q, par, rounds, waiting, nstack, budget, cap, chunked, running, free, slots, pq_h, pq_n, nc, ptok,
           now, bs, sh, ws, inputs, keep, r_f):
    """The waiting heads admitted, each with a chunk of the budget, while the
    budget lasts, the running are fewer than ``cap`` and the free blocks
    hold the head's prompt and first token (without ``chunked``, while the
    budget holds its whole prompt); admission stops at the first that does
    not fit.  Returns ``(q, waiting, nstack, budget, running, free, slots,
    pq_n, nc, ptok)`` after."""
    prompt, cached = inputs.prompt, inputs.cached
    has_cached = cached.shape[0] > 0
    chunk = ws.chunk
    while budget > 0 and running < cap:
        r, b = _waiting_head(adm, q, par, waiting, nstack, ws, inputs, rounds)
        from_stack = nstack > 0
        if r < 0:
            break
        if PULLS and _pulls(r, nstack, inputs):
            break
        g0, lt = _resumes(adm, par, nstack, r, ws)
        again = from_stack or g0 > 0
        L0 = np.int64(prompt[r]) + g0
        # (the tokens to prefill: a cached prompt's KV came with it, a resumed one's is gone; with prefix caching,
        # all but its chain's cached blocks; a cluster's engine has both, its requests' cached tokens 0)
        need, c, k, h = _need(r, L0, bs, sh, par, ws, inputs)
        todo = L0 - h * bs - (np.int64(cached[r]) if has_cached and not again else 0)
        if need > free or (not chunked and todo > budget):
            break
        if again:
            ws.state_i[ES.recomputed] += todo
        if from_stack:
            nstack -= 1
        else:
            waiting -= 1
            q = admission.admit(adm, par[1], q, r, b, par, ws, inputs)
            if keep and g0 == 0:
                r_f[RQ.admitted, r] = now
        free -= need
        slots, pq_n = _place(r, g0, lt, todo, slots, pq_h, pq_n, ws)
        if _caching(par, inputs):
            _pin_chain(c, k, slots[1], ws)
            ws.state_i[ES.prefix_queries] += L0
            ws.state_i[ES.prefix_hits] += h * bs
            _evict(free, ws)
        running += 1
        c = todo if todo < budget else budget
        chunk[nc] = c
        nc += 1
        budget -= c
        ptok += c
    return q, waiting, nstack, budget, running, free, slots, pq_n, nc, ptok


@step
def _schedule(scheduling, chunked, cap, B, adm, q, par, waiting, nstack, running, free, slots, n_dec, s0, n_main,
              pq_h, pq_n, ph, rounds, t_round, ng, now, bs, sh, ws, inputs, keep, r_i, r_f):
    """An iteration's work (``scheduling``: the first of a multi-step
    block; the others only decode): the decodes, their new blocks made room
    for (:func:`_make_room`), the prefills continued, and the waiting
    admitted.  Returns ``(n_d, ctx, nc, ptok, q, waiting, nstack, running,
    free, slots, n_dec, s0, n_main, pq_n)``: the
    decodes and their context, the prefill chunks and their tokens, and the
    state after."""
    # without chunked prefill, an iteration that can admit the waiting head prefills and pauses the decodes
    prefill_phase = False
    if scheduling and not chunked and running < cap:
        # (:func:`_head_fits` written out: through the step, the lean kernel ran 4 % more instructions a request,
        # counted under callgrind)
        r, _ = _waiting_head(adm, q, par, waiting, nstack, ws, inputs, rounds)
        if r >= 0 and _need(r, np.int64(inputs.prompt[r]) + _resumes(adm, par, nstack, r, ws)[0], bs, sh, par, ws,
                            inputs)[0] <= free and not (PULLS and _pulls(r, nstack, inputs)):
            prefill_phase = True
    n_d = 0
    ctx = 0
    if chunked or not prefill_phase:
        slots, running, n_dec, s0, n_main, pq_n, free, nstack = _make_room(
            ph, slots, running, n_dec, s0, n_main, pq_n, free, nstack, rounds, t_round, ng, now, bs, sh, adm, par,
            ws, inputs, keep, r_i)
        if _caching(par, inputs):
            _evict(free, ws)
            if not chunked and scheduling and n_dec == 0 and running < cap:
                # (its decodes all preempted to make room, which a chain held deeper than its holders use can
                # force: the iteration prefills instead, as it would have had they not been there)
                prefill_phase = _head_fits(adm, q, par, waiting, nstack, free, rounds, bs, sh, ws, inputs)
        n_d = n_dec
        ctx = s0 + n_dec * rounds
    budget = B - n_d
    nc = 0
    ptok = 0
    # (without chunked prefill the queue holds only the pulls landed: a prefill completes in its iteration)
    if scheduling and (chunked or (PULLS and pq_n > 0)):
        nc, budget, ptok = _continue_prefills(pq_h, pq_n, budget, ws)
    if (chunked and scheduling) or prefill_phase:
        q, waiting, nstack, budget, running, free, slots, pq_n, nc, ptok = _admit(
            adm, q, par, rounds, waiting, nstack, budget, cap, chunked, running, free, slots, pq_h, pq_n, nc, ptok,
            now, bs, sh, ws, inputs, keep, r_f)
    return n_d, ctx, nc, ptok, q, waiting, nstack, running, free, slots, n_dec, s0, n_main, pq_n


@step
def _record(iterations, si, ts, now, running, waiting, used, limited, cap):
    """The time series' row of iteration ``iterations`` (every ``ts_stride``
    iterations; full, every other row kept and the stride doubled; its
    counters in the state ``si``)."""
    if iterations == si[ES.ts_due]:
        ts_rows, ts_stride = si[ES.ts_rows], si[ES.ts_stride]
        ts_max = ts.shape[0]
        if ts_rows == ts_max:
            for k in range(ts_max // 2):
                for col in range(TS_WIDTH):
                    ts[k, col] = ts[2 * k + 1, col]
            ts_rows = ts_max // 2
            ts_stride *= 2
        if iterations % ts_stride == 0:
            ts[ts_rows, TS.time] = now
            ts[ts_rows, TS.running] = running
            ts[ts_rows, TS.waiting] = waiting
            ts[ts_rows, TS.kv_blocks] = used if limited else -1.0
            ts[ts_rows, TS.max_num_seqs] = cap
            ts_rows += 1
        # (the next multiple of the stride: no division at every iteration)
        si[ES.ts_due] = (iterations // ts_stride + 1) * ts_stride
        si[ES.ts_rows] = ts_rows
        si[ES.ts_stride] = ts_stride


@step
def _iteration_time(coef, exp_span, exp_miss, attention, n_d, ctx, nc, ptok, pq_h, ws, inputs):
    """An iteration's time (:func:`.cost.cost`) of ``n_d`` decodes over
    ``ctx`` context tokens and ``nc`` prefill chunks of ``ptok`` tokens: a
    mixture of experts' reads, and the prefill's attention where the model
    has it (its chunks' part of their prompts' squares)."""
    reads = extra_experts(exp_span, exp_miss, float(n_d + ptok)) if coef[PER_EXPERT] > 0.0 else 0.0
    psq = _prefill_squares(nc, pq_h, ws, inputs) if attention else 0.0
    return cost(coef, 0.0, 1.0, float(ptok), float(n_d), float(ctx), reads, psq)


@step
def _integrals(t, running, waiting, used, running_time, system_time, blocks_time, waiting_time, busy):
    """An iteration of ``t`` seconds into the integrals over time of the
    running, the requests in the engine (Little's law's L x T), the blocks
    used, the waiting, and into the busy time."""
    return (running_time + running * t, system_time + (running + waiting) * t, blocks_time + used * t,
            waiting_time + waiting * t, busy + t)


@step
def _leave(sl, r, o, now, block_left, npd, slots, free, running, acc, n, gscale, bs, sh, memory_on, delay, keep,
           par, ws, inputs, out, r_f):
    """Request ``r`` (slot ``sl``, ``o`` tokens of output) has its last token
    at ``now``: its blocks freed (counted into the iteration's tally with
    ``memory_on``), out of the running list and its slot freed, its latency
    recorded (:func:`_done`) and counted, or, inside a multi-step block
    (``block_left`` > 0), held back for the block's end (``ws.pend_done``).
    Its blocks stay taken where it holds them past ``now``
    (:func:`_hold`).  Returns ``(slots, free, running, npd, acc)`` after."""
    b = _freed(np.int64(inputs.prompt[r]), o, bs, sh, ws.tally, memory_on)
    if FULL and inputs.release.shape[0] > 0 and inputs.release[r] > now and not _caching(par, inputs):
        _hold(inputs.release[r], b, ws)
    else:
        free += b
    if _caching(par, inputs):
        free = _unpin(sl, r, o, now, free, bs, ws, inputs)
    head, tail, nfree = slots
    slots = _unlink(sl, ws.prv, ws.nxt, head, tail, ws.occ, ws.free_slots, nfree)
    if block_left > 0:
        ws.pend_done[npd] = r
        npd += 1
    else:
        completed, sum_lat, last_done = acc
        _done(r, now, n, gscale, ws, out, inputs, keep, r_f, delay, par[1], par[2])
        acc = (completed + 1, sum_lat + (now - admission.arrived(par[1], ws, r) + delay), now)
    return slots, free, running - 1, npd, acc


@step
def _hold(release, b, ws):
    """``b`` blocks of a completed request held until ``release`` (inf:
    until the engine's driver says when, :func:`release_at`)."""
    ws.state_i[ES.held] += b
    if release < np.inf:
        release_at(release, b, ws.state_i, ws.state_f, ws.rel_t, ws.rel_b)


@step
def release_at(release, b, si, sf, rel_t, rel_b):
    """``b`` blocks held (:func:`_hold`) freed at ``release``: into the
    heap of held blocks (``rel_t``, ``rel_b``; the engine's scalars ``si``,
    ``sf``); an engine asleep until later wakes then."""
    si[ES.nheld] = _heap_push(rel_t, rel_b, si[ES.nheld], release, b)
    if sf[ES.wake] > release:
        sf[ES.wake] = release


@step
def _unhold(now, free, ws):
    """The blocks held until ``now`` or before (:func:`_hold`), freed.
    Returns ``free`` after."""
    si = ws.state_i
    while si[ES.nheld] > 0 and ws.rel_t[0] <= now:
        _, b, si[ES.nheld] = _heap_pop(ws.rel_t, ws.rel_b, si[ES.nheld])
        free += b
        si[ES.held] -= b
    return free


@step
def _next_wake(i, n, ws):
    """When an engine with nothing to run but pulls or held blocks may run
    again: the first pull's landing, the first release of held blocks or
    the next arrival, whichever comes first."""
    si = ws.state_i
    nxt = np.inf
    if si[ES.npull] > 0:
        nxt = ws.pull_t[0]
    if si[ES.nheld] > 0 and ws.rel_t[0] < nxt:
        nxt = ws.rel_t[0]
    if i < n and ws.arrival[i] < nxt:
        nxt = ws.arrival[i]
    return nxt


@step
def _tbt_gaps(now, t_round, n_main, ng, gt, gc, hist_tbt, tbt):
    """A decode round ended at ``now``: the gaps since each group's last
    token (the ``n_main`` decodes' at ``t_round``, then each group that
    joined since) into the histogram and ``tbt = (sum, count)``."""
    sum_tbt, tbt_count = tbt
    gap = now - t_round
    if n_main > 0:
        hist_tbt[hist_bucket(gap)] += n_main
        sum_tbt += n_main * gap
        tbt_count += n_main
    for k in range(ng):
        if gc[k] > 0:
            gap = now - gt[k]
            hist_tbt[hist_bucket(gap)] += gc[k]
            sum_tbt += gc[k] * gap
            tbt_count += gc[k]
    return sum_tbt, tbt_count


@step
def _next_look(r, g, rounds, adm, par, ws, inputs):
    """The round a decoding request ``r`` (``g`` tokens generated at round
    ``rounds``) is next looked at, the key of its round's list: its output's
    last, or, sooner, while the quotas are looked at as they end
    (``ES.quotas_due``: :func:`_key_quotas`), the round its order's quota
    ends at (:func:`.admission.quota`; the full kernel's orders only)."""
    key = rounds + np.int64(inputs.output[r]) - g
    if par[1] and ws.state_i[ES.quotas_due] != 0:
        left = admission.quota(adm, par[1], r, par, ws)
        if rounds + left < key:
            key = rounds + left
    return key


@step
def _key_quotas(rounds, q, waiting, head, M1, adm, par, ws, inputs):
    """Whether the decodes' quotas are looked at as they end this round: only
    where the end of one could preempt (:func:`.admission.contested`: of the
    ``waiting`` requests, one the order would preempt for).  Elsewhere an end
    changes nothing but the order's bookkeeping, which it catches up later
    (:func:`.admission.catch_up`), so the decodes stay in the lists of their
    outputs' last rounds: most quotas' ends are then never looked at one by
    one.  Where the ends become contested, each decoding sequence's quota
    is caught up to this round and the sequence moved to the list of the
    round its quota ends at, where sooner than its output's last (this
    round's included, before the list is taken).  The numbers are those of
    looking at every end."""
    contested = waiting > 0 and admission.contested(adm, par[1], q, par, ws)
    if not contested:
        ws.state_i[ES.quotas_due] = 0
        return
    if ws.state_i[ES.quotas_due] != 0:
        return
    ws.state_i[ES.quotas_due] = 1
    fin, occ = ws.fin, ws.occ
    sl = head
    while sl >= 0:
        if fin[sl] >= 0:
            r = occ[sl]
            key = ws.d0[sl] - ws.gs[sl] + np.int64(inputs.output[r])
            ends = admission.catch_up(adm, par[1], r, rounds, par, ws)
            if ends < key:
                key = ends
            if key != fin[sl]:
                _due_remove(ws.due, ws.due_tail, ws.due_next, ws.due_prev, sl, fin[sl])
                fin[sl] = key
                _due_push(ws.due, ws.due_tail, ws.due_next, ws.due_prev, occ, M1, sl, key)
        sl = ws.nxt[sl]


@step
def _out_of_decodes(sl, r, rounds, s0, bs, sh, adm, par, ws, inputs):
    """Slot ``sl`` (request ``r``) leaves the decodes at round ``rounds``
    (its output done, or preempted by its order): out of the context sum
    and its block phase, no round's list, and its order told
    (:data:`.admission.LEFT`).  Returns ``s0`` after."""
    p = np.int64(inputs.prompt[r])
    g0, d0 = ws.gs[sl], ws.d0[sl]
    ws.phase[_phase(p + g0 - d0, bs, sh)] -= 1
    ws.fin[sl] = -1
    if par[1]:
        admission.served(adm, par[1], admission.LEFT, r, rounds, par, ws, inputs)
    return s0 - (p + g0 - d0)


@step
def _expire(sl, r, now, rounds, q, waiting, s0, n_dec, n_main, slots, free, running, cap, M1, bs, sh, keep, adm,
            par, ws, inputs, r_i):
    """Slot ``sl`` (request ``r``), in this round's list before its output:
    its order's quota is spent (:func:`.admission.expire`).  It decodes on,
    in the list of the round its new quota or its output ends at, or the
    order preempts it: out of the decodes, its blocks and slot freed, among
    the order's waiting.  Returns ``(q, waiting, s0, n_dec, n_main, slots,
    free, running)`` after."""
    g = ws.gs[sl] + rounds - ws.d0[sl]
    q, preempt = admission.expire(adm, par[1], q, r, g, now, rounds, running >= cap, free, bs, sh, par, ws, inputs)
    if not preempt:
        key = _next_look(r, g, rounds, adm, par, ws, inputs)
        ws.fin[sl] = key
        _due_push(ws.due, ws.due_tail, ws.due_next, ws.due_prev, ws.occ, M1, sl, key)
        return q, waiting, s0, n_dec, n_main, slots, free, running
    s0 = _out_of_decodes(sl, r, rounds, s0, bs, sh, adm, par, ws, inputs)
    free += _blocks(np.int64(inputs.prompt[r]) + g, bs, sh)
    if _caching(par, inputs):
        free = _unpin(sl, r, 0, now, free, bs, ws, inputs)
    head, tail, nfree = slots
    slots = _unlink(sl, ws.prv, ws.nxt, head, tail, ws.occ, ws.free_slots, nfree)
    ws.state_i[ES.preemptions] += 1
    if keep:
        r_i[RQ.preemptions, r] += 1
    return q, waiting + 1, s0, n_dec - 1, n_main - 1, slots, free, running - 1


@step
def _decode_round(n_d, now, rounds, ph, s0, n_dec, t_round, n_main, ng, tokens, tbt, block_left, npd, slots, free,
                  running, acc, q, waiting, cap, n, gscale, M1, bs, sh, memory_on, delay, keep, adm, par, ws, inputs,
                  out, r_i, r_f):
    """The iteration's ``n_d`` decodes each gave a token: their gaps
    (:func:`_tbt_gaps`), the round counted, and the decodes done with this
    round leave (its list: no later round shares its bucket), those whose
    order's quota it ends first reconsidered (:func:`_expire`).  Returns
    ``(rounds, ph, s0, n_dec, t_round, n_main, ng, tokens, tbt, npd, slots,
    free, running, acc, q, waiting)`` after."""
    tbt = _tbt_gaps(now, t_round, n_main, ng, ws.gt, ws.gc, out.hist_tbt, tbt)
    rounds += 1
    ph = ph - 1 if ph > 0 else bs - 1
    n_main = n_d
    tokens += n_d
    due, occ, gs, d0 = ws.due, ws.occ, ws.gs, ws.d0
    if par[1]:
        _key_quotas(rounds, q, waiting, slots[0], M1, adm, par, ws, inputs)
    bk = rounds & (due.shape[0] - 1)
    sl = due[bk]
    due[bk] = -1
    ws.due_tail[bk] = -1
    while sl >= 0:
        following = ws.due_next[sl]
        r = occ[sl]
        if par[1] and gs[sl] + rounds - d0[sl] < np.int64(inputs.output[r]):
            q, waiting, s0, n_dec, n_main, slots, free, running = _expire(
                sl, r, now, rounds, q, waiting, s0, n_dec, n_main, slots, free, running, cap, M1, bs, sh, keep, adm,
                par, ws, inputs, r_i)
            sl = following
            continue
        s0 = _out_of_decodes(sl, r, rounds, s0, bs, sh, adm, par, ws, inputs)
        n_dec -= 1
        n_main -= 1
        slots, free, running, npd, acc = _leave(sl, r, np.int64(inputs.output[r]), now, block_left, npd, slots, free,
                                                running, acc, n, gscale, bs, sh, memory_on, delay, keep, par, ws,
                                                inputs, out, r_f)
        sl = following
    return rounds, ph, s0, n_dec, now, n_main, 0, tokens, tbt, npd, slots, free, running, acc, q, waiting


@step
def _join_decodes(sl, r, g, now, rounds, s0, n_dec, M1, bs, sh, adm, par, ws, inputs):
    """Slot ``sl`` (request ``r``, ``g`` tokens generated, its prompt
    prefilled) joins the decodes at this round: its completion round's list
    (or, sooner, the round its order's quota ends at: :func:`.admission.quota`),
    the decodes' context sum and its block phase.  Returns ``(s0, n_dec)``."""
    p = np.int64(inputs.prompt[r])
    ws.d0[sl] = rounds
    ws.last[sl] = now
    key = _next_look(r, g, rounds, adm, par, ws, inputs)
    ws.fin[sl] = key
    _due_push(ws.due, ws.due_tail, ws.due_next, ws.due_prev, ws.occ, M1, sl, key)
    ws.phase[_phase(p + g - rounds, bs, sh)] += 1
    if par[1]:
        admission.served(adm, par[1], admission.JOINED, r, rounds, par, ws, inputs)
    return s0 + (p + g - rounds), n_dec + 1


@step
def _finish_prefills(nc, pq_h, pq_n, now, rounds, s0, n_dec, ng, tokens, sum_ttft, tbt, block_left, npf, npd, slots,
                     free, running, acc, n, gscale, M1, bs, sh, memory_on, delay, keep, adm, par, ws, inputs, out,
                     r_f):
    """The iteration's ``nc`` prefill chunks: those that complete their
    prompt give a token (the first, held back inside a multi-step block,
    or a resumed one's next), then the sequence leaves if that was its last,
    else joins the decodes.  Returns ``(pq_h, pq_n, s0, n_dec, ng, tokens,
    sum_ttft, tbt, npf, npd, slots, free, running, acc)`` after."""
    pq, pre, need, occ, gs = ws.pq, ws.pre, ws.need, ws.occ, ws.gs
    PQ = pq.shape[0]
    joined = 0
    for k in range(nc):
        sl = pq[pq_h]
        pre[sl] += ws.chunk[k]
        if pre[sl] < need[sl]:
            break
        pq_h = pq_h + 1 if pq_h + 1 < PQ else 0
        pq_n -= 1
        r = occ[sl]
        g = gs[sl]
        if g == 0:
            if block_left > 0:
                ws.pend_first[npf] = r
                npf += 1
                if par[1] and par[2]:
                    ws.first[r] = -np.inf
            else:
                sum_ttft += _first_token(r, now, admission.arrived(par[1], ws, r), delay, out, inputs, keep, r_f,
                                         par[1], par[2], ws.first)
        else:
            sum_tbt, tbt_count = tbt
            gap = now - ws.last[sl]
            out.hist_tbt[hist_bucket(gap)] += 1
            tbt = (sum_tbt + gap, tbt_count + 1)
        g += 1
        gs[sl] = g
        tokens += 1
        if par[1]:
            admission.served(adm, par[1], admission.TOKEN, r, rounds, par, ws, inputs)
        if g >= np.int64(inputs.output[r]):
            # (g is its output now)
            slots, free, running, npd, acc = _leave(sl, r, g, now, block_left, npd, slots, free, running, acc, n,
                                                    gscale, bs, sh, memory_on, delay, keep, par, ws, inputs, out,
                                                    r_f)
            continue
        s0, n_dec = _join_decodes(sl, r, g, now, rounds, s0, n_dec, M1, bs, sh, adm, par, ws, inputs)
        joined += 1
    if joined > 0:
        ws.gt[ng] = now
        ws.gc[ng] = joined
        ng += 1
    return pq_h, pq_n, s0, n_dec, ng, tokens, sum_ttft, tbt, npf, npd, slots, free, running, acc


@step
def _store(vector, values):
    """``values`` (a tuple in the layout's order) into ``vector``."""
    for k in range(len(values)):
        vector[k] = values[k]


@step
def _publish(si, sf, out, first_arrival, limited):
    """The run's statistics (``out.ints``, ``out.floats``): the engine's
    counters of the same names (:data:`STATE`), the first arrival, and the
    blocks' integral where the memory is ``limited``."""
    for k in range(len(STATS_FROM_STATE[0])):
        out.ints[STATS_FROM_STATE[0][k][0]] = si[STATS_FROM_STATE[0][k][1]]
    for k in range(len(STATS_FROM_STATE[1])):
        out.floats[STATS_FROM_STATE[1][k][0]] = sf[STATS_FROM_STATE[1][k][1]]
    out.floats[S.sum_batch] = si[ES.sum_batch]
    out.floats[S.first_arrival] = first_arrival
    if not limited:
        out.floats[S.blocks_time] = 0.0


@step
def published(config, out, ws):
    """The engine's statistics written from its scalars as its kernel
    writes them when it returns (:func:`_publish`): by a driver whose
    engines' hot resumes leave them out (:data:`PUBLISH` off), once every
    engine has run to its end.  Writing them again changes nothing."""
    si = ws.state_i
    n = config[0][C.n]
    _publish(si, ws.state_f, out, ws.arrival[0] if n > 0 else np.nan, si[ES.blocks_total] < UNLIMITED)


@kernel
def continuous_kernel(config, control, inputs, streams, out, requests, ws, stop):
    """Simulate the run ``config`` (with ``controlled``, the controller of
    ``control``: :data:`~.controller.SLA` and :data:`~.controller.MEMORY`
    packs, its state in ``out.ctl`` and ``out.bstats``), its statistics and
    records written in place, from the engine's scalars in ``ws.state_i``
    and ``ws.state_f`` (a new engine's: :func:`start`), which it leaves
    there to be resumed.  Returns :data:`DONE`, :data:`PAUSED` (an
    iteration would start at or after ``until``), :data:`STOPPED`
    (``stop[STOP]`` set: checked every 65,536 iterations, when
    ``stop[ARRIVED]`` gets the requests arrived so far) or :data:`STALLED`."""
    ci, cf = config
    n = ci[C.n]
    M = ci[C.max_num_seqs]
    B = ci[C.max_batched_tokens]
    # (multi-step scheduling: the iterations a scheduling decision runs; the lean kernel's blocks, one iteration,
    # are written out below as ``FULL and``: without the feature, no branch on them)
    ksteps = ci[C.scheduler_steps]
    chunked = ci[C.chunked] != 0
    bs = ci[C.block_size]
    sh = _shift(bs)
    adm = ci[C.admission] if ADMISSION < 0 else np.int64(ADMISSION)
    keep = ci[C.keep] != 0
    controlled = ci[C.controlled] != 0
    memory_on = ci[C.memory_on] != 0
    sla, memory = control
    ema = sla[1][A.ema]
    # (the cost's coefficients as a tuple: values in registers through the loop, not loads from memory)
    coef = load_tuple(cf[C_COST:C_COST + N_COST], N_COST)
    attention = FULL and coef[PREFILL_ATTENTION] > 0.0
    # (a real server's time outside the engine, every request's; its overhead per iteration is in the cost's
    # step, cost_step: mbbatch.planners.continuous)
    delay = cf[C.request_overhead]
    # (the admission orders' parameters, .admission, and whether the kernel has the orders' token accounting and the
    # classes' statistics: the full kernel's)
    exp_span = cf[C.expert_span]
    exp_miss = cf[C.expert_miss]
    par = order_parameters(ci, cf, coef, FULL)
    inv_rate = 1.0 / cf[C.rate] if cf[C.rate] > 0.0 else 0.0
    gscale = out.group_latency.shape[0] / n if n > 0 else 0.0
    r_i, r_f = requests
    M1 = M + 1
    until = cf[C.until]
    if ws.state_i[ES.started] == 0:
        draw_arrivals(ws.draws[0], 0.0, inv_rate, inputs.arrival_times, np.int64(0), n, streams.arrival,
                      ws.arrival, inputs.arrival_params, inputs.arrival_ends, np.int64(0), -1.0)
    # the engine's scalars (a new engine's: start), the running list and free slots, the waiting queue, the
    # completions' and the gaps' sums as tuples
    (head, tail, running, n_dec, s0, ssize, nstack, pq_h, pq_n, qh, waiting, rr, rounds, ph, n_main, ng, completed,
     iterations, prefill_tokens, tokens, tbt_count, sum_batch, i, nfree, free, blocks_total, block_left, npf,
     npd) = load_tuple(ws.state_i, LOOP_INTS)
    (t_round, busy, sum_lat, sum_ttft, sum_tbt, running_time, blocks_time, waiting_time, system_time, last_done,
     now) = load_tuple(ws.state_f, LOOP_FLOATS)
    si = ws.state_i
    if not FULL:
        block_left, npf, npd = 0, 0, 0
    slots = (head, tail, nfree)
    q = (qh, ssize, rr)
    acc = (completed, sum_lat, last_done)
    tbt = (sum_tbt, tbt_count)
    code = DONE
    t = 0.0
    while True:
        if (iterations & 65535) == 0:
            if stop[STOP] != 0:
                code = STOPPED
                break
            stop[ARRIVED] = i
        i, q, waiting, system_time = _join_arrivals(i, n, now, adm, q, par, rounds, waiting, system_time, ws, inputs,
                                                    keep, r_f)
        if PULLS and si[ES.npull] > 0:
            slots, pq_n = _land(now, slots, pq_h, pq_n, ws)
        if FULL and si[ES.nheld] > 0:
            free = _unhold(now, free, ws)
        block_left, npf, npd, sum_ttft, acc = _end_block(FULL, block_left, n_dec, npf, npd, now, sum_ttft, acc, ws,
                                                         out, inputs, requests, config)
        if running == 0 and waiting == 0 and nstack == 0:
            if i >= n:
                break
            now = ws.arrival[i] if ws.arrival[i] > now else now
            continue
        if now >= until:
            # (an iteration starting at or after until waits for what arrives up to then)
            if FULL:
                # (the last iteration's time: a cluster's driver reads it as the engine hands requests back)
                ws.state_f[ES.last_iteration] = t
            code = PAUSED
            break
        iterations += 1
        si[ES.completed_before] = acc[0]
        if (iterations & 65535) == 0:
            stop[ARRIVED] = i
        cap = _cap(out.ctl, out.bstats, sla, memory, memory_on, M) if controlled else M
        # (multi-step: only the first iteration of a block schedules; the others decode)
        scheduling = not FULL or block_left == 0
        if not scheduling:
            block_left -= 1
        if PULLS and scheduling and inputs.pull.shape[0] > 0:
            q, waiting, running, free, slots = _pull_heads(adm, q, par, rounds, waiting, nstack, cap, running, free,
                                                           slots, now, bs, sh, ws, inputs, keep, r_f)
        n_d, ctx, nc, ptok, q, waiting, nstack, running, free, slots, n_dec, s0, n_main, pq_n = _schedule(
            scheduling, chunked, cap, B, adm, q, par, waiting, nstack, running, free, slots, n_dec, s0, n_main, pq_h,
            pq_n, ph, rounds, t_round, ng, now, bs, sh, ws, inputs, keep, r_i, r_f)
        if n_d == 0 and nc == 0:
            if not scheduling:
                # (multi-step: the block's decodes were preempted; the block ends, the next iteration schedules)
                block_left = 0
                iterations -= 1
                continue
            if (PULLS and si[ES.npull] > 0) or (FULL and si[ES.held] > 0):
                # (nothing runs but pulls, or what waits does not fit the blocks held: the engine waits for the
                # first pull to land or blocks to be released, or an arrival before; past the instant it runs
                # to, it pauses there, saying when it wakes)
                nxt = _next_wake(i, n, ws)
                if nxt >= until:
                    ws.state_f[ES.wake] = nxt
                    nxt = until
                now = nxt if nxt > now else now
                iterations -= 1
                continue
            # (nothing runs and nothing is admitted: with requests waiting, a stall, not the end)
            if running > 0 or (i >= n and (waiting > 0 or nstack > 0)):
                code = STALLED
                break
            if i >= n:
                break
            now = ws.arrival[i] if ws.arrival[i] > now else now
            iterations -= 1
            continue
        if FULL and scheduling:
            block_left = ksteps - 1
        if running > si[ES.max_running]:
            si[ES.max_running] = running
        t = _iteration_time(coef, exp_span, exp_miss, attention, n_d, ctx, nc, ptok, pq_h, ws, inputs)
        # (blocks held past their requests' completions are not counted used)
        used = blocks_total - free - (si[ES.held] if FULL else 0)
        sum_batch += n_d + nc
        out.size_hist[n_d + nc] += 1
        _record(iterations, si, out.ts, now, running, waiting + nstack, used, blocks_total < UNLIMITED, cap)
        running_time, system_time, blocks_time, waiting_time, busy = _integrals(
            t, running, waiting + nstack, used, running_time, system_time, blocks_time, waiting_time, busy)
        now = now + t
        prefill_tokens += ptok
        held = block_left if FULL else 0
        if n_d > 0:
            (rounds, ph, s0, n_dec, t_round, n_main, ng, tokens, tbt, npd, slots, free, running, acc, q,
             waiting) = _decode_round(n_d, now, rounds, ph, s0, n_dec, t_round, n_main, ng, tokens, tbt, held, npd,
                                      slots, free, running, acc, q, waiting, cap, n, gscale, M1, bs, sh, memory_on,
                                      delay, keep, adm, par, ws, inputs, out, r_i, r_f)
        (pq_h, pq_n, s0, n_dec, ng, tokens, sum_ttft, tbt, npf, npd, slots, free, running,
         acc) = _finish_prefills(nc, pq_h, pq_n, now, rounds, s0, n_dec, ng, tokens, sum_ttft, tbt, held, npf, npd,
                                 slots, free, running, acc, n, gscale, M1, bs, sh, memory_on, delay, keep, adm,
                                 par, ws, inputs, out, r_f)
        if controlled:
            ws.state_f[ES.cap_time] += cap * t
            _feedback(out.ctl, out.bstats, ws.tally, ema, t, n_d + nc, running)
    head, tail, nfree = slots
    qh, ssize, rr = q
    completed, sum_lat, last_done = acc
    sum_tbt, tbt_count = tbt
    _store(ws.state_i, (head, tail, running, n_dec, s0, ssize, nstack, pq_h, pq_n, qh, waiting, rr, rounds, ph,
                        n_main, ng, completed, iterations, prefill_tokens, tokens, tbt_count, sum_batch, i, nfree,
                        free, blocks_total, block_left, npf, npd))
    _store(ws.state_f, (t_round, busy, sum_lat, sum_ttft, sum_tbt, running_time, blocks_time, waiting_time,
                        system_time, last_done, now))
    si[ES.started] = 1
    if PUBLISH:
        _publish(ws.state_i, ws.state_f, out, ws.arrival[0] if n > 0 else np.nan, blocks_total < UNLIMITED)
    return code


#: :func:`continuous_kernel` without multi-step scheduling, the prefill's attention term, the classes' statistics
#: or the orders' token accounting (:data:`FULL` off)
lean_kernel = variant(kernel, continuous_kernel, "continuous_kernel_lean", FULL=False, PULLS=False)
#: :data:`lean_kernel` with the KV caches pulled (:data:`PULLS`): a decode pool's engines, which need nothing
#: else of the full kernel's
decode_kernel = variant(kernel, continuous_kernel, "continuous_kernel_decode", FULL=False)
#: :func:`continuous_kernel` for each order of the full kernel only (:data:`.admission.FULL_ONLY`), by its code:
#: the order's code the constant :data:`ADMISSION`, the chains of :mod:`.admission` folded to its steps
order_kernels = {code: variant(kernel, continuous_kernel, f"continuous_kernel_{name}", ADMISSION=code)
                 for name, code in ADMISSIONS.items() if admission.FULL_ONLY[code]}


def uses_full(config, inputs, pulls: bool = True) -> bool:
    """Whether a run (its ``config`` and ``inputs``) needs
    :func:`continuous_kernel`'s features: multi-step scheduling, the
    prefill's attention, request classes (their statistics), an admission
    order of the full kernel only (:data:`.admission.FULL_ONLY`: earliest
    deadline first, fair sharing),
    goodput (objectives whose attainment it counts), prefix caching, KV
    caches pulled (unless ``pulls`` is False: :data:`decode_kernel` has
    them) or blocks held past completion; else :data:`lean_kernel` runs it."""
    ci, cf = config
    return bool(ci[C.scheduler_steps] > 1 or cf[C_COST + PREFILL_ATTENTION] > 0.0 or inputs.klass.shape[0] > 0
                or admission.FULL_ONLY[ci[C.admission]] or ci[C.goodput] != 0 or inputs.chain.shape[0] > 0
                or (pulls and inputs.pull.shape[0] > 0) or inputs.release.shape[0] > 0)


def kernel_of(config, inputs):
    """The kernel that runs a run (its ``config`` and ``inputs``):
    :data:`lean_kernel` where it needs none of the full kernel's features
    (:func:`uses_full`), :data:`decode_kernel` where it needs only the KV
    caches pulled, else its admission order's own (:data:`order_kernels`)
    or :func:`continuous_kernel`."""
    if not uses_full(config, inputs):
        return lean_kernel
    if not uses_full(config, inputs, pulls=False):
        return decode_kernel
    return order_kernels.get(int(config[0][C.admission]), continuous_kernel)


@helper
def arrival_times(fn, inv_rate, times, gen, out, params, ends):
    """The arrival times a run of ``out.size`` requests draws (by the
    arrival drawer at ``fn``, from ``gen``), into ``out``: those the
    engines of a run of several share out."""
    draw_arrivals(fn, 0.0, inv_rate, times, np.int64(0), out.shape[0], gen, out, params, ends, np.int64(0), -1.0)


def controls(sla=None, memory=None) -> tuple:
    """The kernel's ``control``: the SLA controller's and the memory's packs
    (:data:`~.controller.SLA`, :data:`~.controller.MEMORY`), zeros where
    none (a run without ``controlled`` or ``memory_on``)."""
    return (SLA.zeros() if sla is None else sla, MEMORY.zeros() if memory is None else memory)


#: an engine being simulated: its run's configuration (a copy: ``until`` is
#: set by :func:`advance`), controller packs, inputs, outputs, records and
#: workspace (its scalars between calls in ``ws.state_i``, ``ws.state_f``)
Engine = namedtuple("Engine", ("config", "control", "inputs", "out", "requests", "ws"))


def run(config, inputs: ContinuousInputs, streams: ContinuousStreams, stop: np.ndarray, *, control=None,
        groups: int = 1, ts_rows: int = 2, lease=None):
    """Simulate ``config`` (:data:`CONFIG` ``.pack(...)``) on ``inputs``,
    with the controller ``control`` (:func:`controls`; needed with
    ``controlled``): returns ``(outputs, requests, code)``: the statistics
    as ``STATS.unpack((outputs.ints, outputs.floats))`` (the controller's
    last state in ``outputs.ctl``), the per-request records as
    ``{field: row}`` (None without ``keep``) and the kernel's code;
    ``groups`` batch-means groups of arrivals and a time series of at most
    ``ts_rows`` rows (even); ``lease``: as :func:`start`'s."""
    return prepare(config, inputs, streams, stop, control=control, groups=groups, ts_rows=ts_rows, lease=lease)()


def prepare(config, inputs: ContinuousInputs, streams: ContinuousStreams, stop: np.ndarray, *, control=None,
            groups: int = 1, ts_rows: int = 2, lease=None, records_lease=None):
    """:func:`run` with its engine started, its kernel not called yet: a
    function of no arguments that calls it and returns :func:`run`'s tuple
    (so that a caller makes the engine's arrays in its own thread and may
    run the kernel on another); ``records_lease``: as :func:`start`'s."""
    engine = start(config, inputs, control=control, groups=groups, ts_rows=ts_rows, lease=lease,
                   records_lease=records_lease)

    def go() -> tuple:
        code = advance(engine, streams, stop, np.inf)
        return engine.out, (REQUESTS.rows(engine.requests) if CONFIG.unpack(config)["keep"] else None), code

    return go


def advance(engine: Engine, streams: ContinuousStreams, stop: np.ndarray, until: float) -> int:
    """Simulate ``engine`` on until an iteration would start at or after
    ``until`` (:data:`PAUSED`; what arrives up to then joins first when it
    resumes), or to its end (:data:`DONE`), or :data:`STOPPED` /
    :data:`STALLED` as :func:`run`.  A run advanced in steps is the run
    advanced at once, bit for bit."""
    check_stop(stop)
    engine.config[1][C.until] = until
    fn = kernel_of(engine.config, engine.inputs)
    return fn(engine.config, engine.control, engine.inputs, streams, engine.out, engine.requests, engine.ws, stop)


def start(config, inputs: ContinuousInputs, *, control=None, groups: int = 1, ts_rows: int = 2,
          grouped: bool = False, longest: int | None = None, log: int = 0, lease=None,
          handing: bool = False, records_lease=None) -> Engine:
    """An :class:`Engine` ready for :func:`advance` (the arguments as
    :func:`run`'s); ``grouped``: each request's batch-means group is given
    in ``ws.group`` (a cluster's engine: its group among the cluster's
    arrivals), not its place among the engine's ``n``; ``longest``: the
    longest output it will be given (default: of ``inputs``; a cluster's
    engine is fed its requests as they are routed); ``log``: the
    completions its log holds (``ws.done_log``, the full kernel's; 0:
    none); ``lease``: an :class:`.arena.Lease` the per-request arrays of
    :data:`UNSET` come from (default: fresh ones); ``handing``: the engine
    may hand its waiting requests back (a cluster's with engine events:
    ``ws.origin`` and ``ws.handed`` sized to its requests, else empty);
    ``records_lease``: the :class:`.arena.Lease` its per-request records
    come from (default: fresh ones; a caller that copies them out before
    the lease closes: a pool's engine dealt its share of the requests)."""
    config = (config[0].copy(), config[1].copy())
    cfg = CONFIG.unpack(config)
    control = controls() if control is None else control
    ctl = np.zeros(CONTROLLER.size)
    if cfg["controlled"]:
        sf = SLA.unpack(control[0])
        controller_init(ctl, sf["b_min"], sf["b_max"])
    n, M, bs, K = cfg["n"], cfg["max_num_seqs"], cfg["block_size"], cfg["bins"]
    # (per-class statistics where the requests have classes)
    classes = inputs.class_slo.shape[0] if inputs.klass.shape[0] > 0 else 0
    ints, floats = STATS.zeros(last_completion=-np.inf)
    out = OUTPUTS.pack(ints=ints, floats=floats, hist=np.zeros(HIST_SIZE, np.int64),
                       hist_ttft=np.zeros(HIST_SIZE, np.int64), hist_tbt=np.zeros(HIST_SIZE, np.int64),
                       group_latency=np.zeros(groups), group_count=np.zeros(groups, np.int64),
                       ts=np.zeros((2 * (ts_rows // 2), TS_WIDTH)), size_hist=np.zeros(M + 1, np.int64), ctl=ctl,
                       bstats=np.zeros(BATCH_STATS.size), class_stats=np.zeros((classes, len(CLASS))),
                       class_hist=np.zeros((classes, 2, HIST_SIZE), np.int64))
    if records_lease is None or not cfg["keep"]:
        requests = REQUESTS.records(n if cfg["keep"] else 0, fill=0)
    else:
        requests = tuple(records_lease.empty(len(fields) * n, dtype, "records." + kind, shape=(len(fields), n))
                         for kind, fields, dtype in (("ints", REQUESTS.ints, np.int64),
                                                     ("floats", REQUESTS.floats, np.float64)))
        requests[0][:] = 0
    if cfg["keep"]:
        requests[1][:] = np.nan
    # (the completion rounds' ring: longer than any output, so that the rounds pending, at most the
    # longest output ahead, each have a list of their own)
    if longest is None:
        longest = int(inputs.output.max()) if inputs.output.shape[0] else 1
    ring = 1 << max(1, longest.bit_length())
    # (the per-request arrays but the arrivals are written only for preempted requests and, with multi-bin
    # admission, queued ones: np.empty leaves the rest of their pages untouched)
    M1 = M + 1
    # (the resumption stack holds at most max_num_seqs: a request is admitted from the queue only while it is
    # empty and the running count is below the cap, so the running and the preempted are never more)
    # (the admission order's per-request arrays: one element for the others)
    kept = admission.arrays(cfg["admission"])
    per = {name: n if name in kept else 1 for name in admission.ARRAYS}
    blocks = cfg["blocks"] if cfg["blocks"] >= 0 else UNLIMITED
    # (the heap of blocks held past completions: each holds one block at least)
    held = min(n, blocks) + 1 if inputs.release.shape[0] > 0 else 0
    # (a new engine's scalars: an empty running list, every slot free, the free slots taken from M down to 0)
    state_i, state_f = STATE.zeros(head=-1, tail=-1, nfree=M1, free=blocks, blocks_total=blocks, ts_stride=1,
                                   ts_due=1, last_completion=-np.inf, lru_head=-1, lru_tail=-1, wake=-np.inf)
    # (prefix caching: per chain its cached blocks, references and place in the unreferenced chains' order; per
    # slot the chain blocks its sequence holds)
    chains = inputs.grows.shape[0] if inputs.chain.shape[0] > 0 else 1
    empty = (lambda size, dtype, role: np.empty(size, dtype)) if lease is None else lease.empty
    ws = WORKSPACE.pack(arrival=empty(n, np.float64, "arrival"), gen=np.empty(M1, np.int64), last_pre=np.empty(M1),
                        occ=np.full(M1, -1, np.int64), gs=np.zeros(M1, np.int64), pre=np.zeros(M1, np.int64),
                        need=np.zeros(M1, np.int64), d0=np.zeros(M1, np.int64), fin=np.full(M1, -1, np.int64),
                        prv=np.empty(M1, np.int64), nxt=np.empty(M1, np.int64), last=np.zeros(M1),
                        free_slots=np.arange(M, -1, -1, dtype=np.int64), qnext=empty(per["qnext"], np.int64, "qnext"),
                        due=np.full(ring, -1, np.int64), due_tail=np.full(ring, -1, np.int64),
                        due_next=np.empty(M1, np.int64),
                        due_prev=np.empty(M1, np.int64), sk=empty(per["sk"], np.float64, "sk"),
                        sid=empty(per["sid"], np.int64, "sid"),
                        stack=np.empty(M1, np.int64), pq=np.empty(M + 1, np.int64), bh=np.full(K, -1, np.int64),
                        bt=np.full(K, -1, np.int64), phase=np.zeros(bs, np.int64), gt=np.empty(M + 1),
                        gc=np.empty(M + 1, np.int64), chunk=np.empty(M + 1, np.int64),
                        tally=np.zeros(len(TALLY), np.int64), state_i=state_i, state_f=state_f,
                        group=empty(n if grouped else 0, np.int64, "group"), draws=drawers(cfg["arrival_kind"]),
                        pend_first=np.empty(M1, np.int64), pend_done=np.empty(M1, np.int64),
                        vtc=np.zeros(max(classes, 1)), vtc_decoding=np.zeros(max(classes, 1), np.int64),
                        first=empty(n if cfg["goodput"] else 1, np.float64, "first"),
                        mlfq=empty(admission.WIDTHS["mlfq"] * per["mlfq"], np.int64, "mlfq"),
                        resume_last=empty(per["resume_last"], np.float64, "resume_last"),
                        pc=np.zeros(chains, np.int64), prefs=np.zeros(chains, np.int64),
                        lru_prev=np.full(chains, -1, np.int64), lru_next=np.full(chains, -1, np.int64),
                        lru_time=np.zeros(chains), pin=np.zeros(M1, np.int64), done_log=np.empty((2, log)),
                        origin=empty(n if handing else 0, np.float64, "origin"),
                        handed=empty(n if handing else 0, np.int64, "handed"), pull_t=np.empty(M1),
                        pull_k=np.empty(M1, np.int64), rel_t=np.empty(held), rel_b=np.empty(held, np.int64),
                        pull_log=np.empty((2, log if inputs.pull.shape[0] > 0 else 0)))
    return Engine(config, control, inputs, out, requests, ws)


def warmup(variants=("full", "lean")) -> None:
    """Compile the kernel's ``variants`` (``"full"``: :func:`continuous_kernel`,
    ``"lean"``: :data:`lean_kernel`, ``"decode"``: :data:`decode_kernel`, an order's name: its kernel of
    :data:`order_kernels`; or load them from the cache), on a tiny input.
    ``mb.warmup()`` leaves them out (about 27 s of CPU cold each): a
    process's first continuous-batching run compiles the one it uses, and
    the disk cache keeps it."""
    known = ("full", "lean", "decode", *(name for name, code in ADMISSIONS.items() if code in order_kernels))
    unknown = sorted(set(variants) - set(known))
    if unknown:
        raise ValueError(f"warmup: no variant {unknown}; the variants are {', '.join(known)}")
    full = CONFIG.pack(n=4, arrival_kind=ARR_POISSON, max_num_seqs=2, max_batched_tokens=64, chunked=1, blocks=8,
                         block_size=4, admission=ADMISSIONS["multibin"], bins=2, keep=1, controlled=1, memory_on=1,
                         scheduler_steps=2, goodput=1, quantum=1, rate=1.0, **dict.fromkeys(COST_FIELDS, 1e-3),
                         expert_span=0.0, expert_miss=1.0, request_overhead=0.0, aging=0.0, until=np.inf)
    ctl = controls(SLA.pack(variant=0, d_sla=0.02, eps_d=1e-3, b_min=1.0, b_max=2.0, alpha=4.0, delta=2.0,
                           ema=DEFAULT_EMA),
                  MEMORY.pack(variant=0, eta=64.0, b_min=1.0, b_max=2.0, z=1.645, default_tokens=DEFAULT_TOKENS))
    x = np.full(4, 3.0)
    inputs = INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                         prompt=x, output=x, prediction=x, edges=np.array([2.0]), cached=np.empty(0),
                         klass=np.array([0.0, 1.0, 0.0, 1.0]), class_slo=np.array([0.5, np.inf]),
                         class_tpot=np.array([0.1, np.inf]))
    lean = (full[0].copy(), full[1].copy())
    lean[0][C.scheduler_steps] = 1
    lean[0][C.goodput] = 0
    lean[1][C_COST + PREFILL_ATTENTION] = 0.0
    one_class = INPUTS.pack(**{**inputs._asdict(), "klass": np.empty(0)})
    runs = [("full", full, inputs), ("lean", lean, one_class),
            ("decode", lean, INPUTS.pack(**{**one_class._asdict(), "cached": x, "pull": np.full(4, 1e-3)}))]
    for name in variants:
        if name in ADMISSIONS:
            order = (full[0].copy(), full[1].copy())
            order[0][C.admission] = ADMISSIONS[name]
            runs.append((name, order, inputs))
    for name, config, given in runs:
        if name not in variants:
            continue
        run(config, given, ContinuousStreams(np.random.default_rng(0)), np.zeros(STOP_SIZE, np.int64), control=ctl)
