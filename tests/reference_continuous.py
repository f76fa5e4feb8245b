"""An independent plain-Python continuous-batching engine: every iteration
visits every running sequence (the obvious loop), written from the rules in
:mod:`mbbatch._kernels.continuous`'s docstring, not from its code.  The
tests hold the kernel to it request by request."""

from __future__ import annotations

import math

import numpy as np

from mbbatch._kernels.controller import b_mem_core, b_sla_core, feedback_core

#: fair sharing's weights of a prompt token and a generated token (Sheng et al., 2024's evaluation)
INPUT_WEIGHT, OUTPUT_WEIGHT = 1.0, 2.0


def simulate(arrival, prompt, output, prediction, *, max_num_seqs, max_batched_tokens, chunked, kv_tokens,
             block_size, admission, edges=None, step=0.01, prefill_per_token=0.0, per_sequence=0.0,
             per_context=0.0, per_expert=0.0, expert_span=0.0, expert_miss=1.0, controller=None, cached=None,
             prefill_attention=0.0, iteration_overhead=0.0, num_scheduler_steps=1, aging=0.0, klass=None,
             class_slo=None, class_tpot=None, goodput=0, quantum=16, levels=4, prefix_caching=False, chain=None,
             shared=None, grows=None, until=None, join=None, leave=(), pull=None, release=None):
    """Run the engine on requests ``arrival`` (sorted), ``prompt`` and
    ``output`` (whole tokens, output >= 1) and ``prediction`` (admission
    order).  Returns a dict of per-request arrays (``first_token``,
    ``completion``, ``admitted`` the time of first admission, ``preempted``
    counts), the TBT samples (every gap between two tokens of a request),
    and totals (``iterations``, ``busy``, ``preemptions``, ``recomputed``).

    ``controller``: a dict of Algorithm 2's settings ``sla = (d_sla, eps_d,
    b_min, b_max, alpha, delta, multiplicative)``, the EMA weight ``ema``
    and optionally Algorithm 1's ``memory = (eta, variant, z,
    default_tokens, b_min, b_max)``: before every iteration b_SLA (at most
    b_mem) caps the running sequences (at most ``max_num_seqs``); after it,
    Algorithm 7 with the iteration as the batch (its sequences, its time),
    N_decode the sequences left running and the requests it completed as the
    statistics' batch.  The algorithms themselves are the kernels' scalar
    forms (their own tests hold them to the pseudocode); this engine checks
    when and with what the kernel calls them.  The cap per iteration is
    returned as ``caps``.

    ``cached``: per request, the prompt tokens whose KV cache it brings; a
    first admission prefills only the rest (a resumed one everything).

    ``per_expert``: a mixture of experts' time per expert read beyond an
    iteration's first token's, ``expert_span (1 - expert_miss^(T - 1))``
    experts for its T tokens (the sequences it decodes and the tokens it
    prefills).

    ``num_scheduler_steps`` k (multi-step scheduling): iterations come in
    blocks of k; the first schedules, the others only decode what runs
    (no admission, no prefill); a block ends after k iterations, or before
    one that would have nothing to decode; its first tokens and last tokens
    are returned (stamped) at its end.

    ``aging`` (shortest predicted first with aging, tokens/s): at every
    iteration the waiting request of least ``prediction - aging x (t -
    arrival)``, the time t the iteration starts (ties in arrival order),
    computed as that priority is defined, not as the kernel's key.

    ``admission="edf"`` (earliest deadline first): the waiting request of
    least deadline, its arrival plus ``class_slo`` of its class ``klass``
    (ties in arrival order).

    ``admission="vtc"`` (fair sharing by virtual token counters, Sheng et
    al., 2024, Algorithm 2): a counter per client (class ``klass``),
    charged ``INPUT_WEIGHT`` per prompt token at a first admission and
    ``OUTPUT_WEIGHT`` per token as each is generated; the earliest waiting
    request of the client of least counter (ties: the lower client); a
    client arriving with none waiting lifted to the least counter of the
    clients waiting (none: to the counter of the client admitted last).
    The counters are kept token by token, not as the kernel keeps them.

    ``admission="mlfq"`` (FastServe's skip-join multi-level feedback queue,
    Wu et al., 2023): ``levels`` first-come-first-served queues, level l's
    quantum ``quantum x 2^l`` decode tokens (the last level's unbounded); a
    request joins the first level whose quantum is at least its prefill
    iteration's time over one decode iteration's of its context (prompt + 1
    tokens), both alone; the head of the first non-empty level is admitted;
    a decoding sequence that has taken its level's quantum of decode tokens
    there (counted token by token, across memory preemptions) goes down a
    level and, if the head of the first level above it holding one cannot
    be admitted beside it (the running at the iteration's cap, or the free
    blocks fewer than its prompt, tokens generated and first token need), is
    preempted to its new level's tail, keeping its tokens generated for the
    recomputation of its resumption (an iteration's decodes in request
    order, those it completes leaving in that order too).

    ``class_tpot`` and ``goodput`` (the objectives goodput counts) do not
    change the run: the tests count goodput from its records.

    ``prefix_caching`` (vLLM's automatic prefix caching: KV blocks kept by
    their content after their sequences leave, and found again by a later
    prompt beginning with the same tokens; modelled by chains): request r
    may belong to chain ``chain[r]`` (-1: none), its prompt's first
    ``shared[r]`` tokens the chain's first ``shared[r]`` (a system prompt
    shared by many requests, or a session's context); ``grows[c]`` (per
    chain, ids 0 .. len(grows) - 1) a session's chain, which a completed
    request's whole context extends.  Per chain the engine keeps cached[c],
    the chain's first blocks held (initially 0), and refs[c], the running
    sequences holding it.  The free blocks (what admission and the decodes'
    new blocks are tested against) are the truly free ones plus the
    evictable ones, the cached blocks of the chains no sequence holds.  An
    admission (a first one or a resumption) of r, its context L0 (prompt and
    tokens generated), with k = min(shared[r], L0 - 1) // block_size >= 1
    full blocks of a chain's prefix (one token at least is computed; k = 0:
    it holds no chain), hits h = min(cached[c], k) of them; it needs
    blocks(L0 + 1) - h blocks if the chain is held, else blocks(L0 + 1)
    (holding it again, it cuts the chain to its k blocks, the deeper ones
    evicted, and takes them out of the evictable); it prefills (and a
    resumption recomputes) L0 - h x block_size tokens, those the no-chunked
    prefill's budget tests; its prefix's blocks beyond the hit join the
    chain (cached[c] = max(cached[c], k)), which it holds (refs[c] += 1).
    After an allocation (each admission; the decodes' new blocks, which
    still preempt only when they exceed the free blocks, so only once no
    evictable block is left) the engine evicts, while the truly free blocks
    are negative, the deepest blocks of the unreferenced chain released
    least recently (by the time its refs last fell to 0; ties: the lower
    chain id), then the next.  A sequence leaving the running (completed,
    preempted for memory or by its order) frees its own blocks, not its k
    chain blocks; on completion only, if its chain grows, its blocks
    cached[c] .. kf - 1, kf = (prompt + output - 1) // block_size, join the
    chain instead (if kf > cached[c], whether it held the chain or not: an
    unheld chain's new blocks are evictable and it the newest); a chain
    whose refs fall to 0 becomes evictable, the newest in the eviction
    order.  Without chunked prefill, an iteration whose decodes were all
    preempted to make room prefills the head instead if it fits.  The
    feedback queue's test whether its head fits is the engine's without
    prefix caching (blocks(L0 + 1) against the free blocks).  Without a
    chain a request is as before (its tokens still counted as queried).
    Returns ``prefix_hits`` and ``prefix_queries`` (tokens: h x block_size
    and L0 at every admission, resumptions too), ``evictions`` (blocks) and
    the final ``cached_blocks`` and ``refs`` per chain (0, 0, 0, [] and []
    without prefix caching).

    ``pull``: per request, the seconds its KV cache takes to come once its
    engine admits it (with ``cached``: a decode pool's, its prefill engine
    holding the cache until the pull; 0: it came with the request).  At
    every boundary that schedules, before anything else is scheduled, the
    waiting head that pulls (a new request of pull > 0, not a resumption)
    is admitted while the running and pulling are fewer than the cap and
    the free blocks hold blocks(prompt + 1), in the admission order,
    stopping at the first head that does not pull or does not fit: it takes
    its blocks, is neither running nor waiting, and cannot be preempted.  At
    the first boundary at or after its pull's end (ties: in the order the
    pulls started) it joins the running as a prompt whose whole cache came,
    its chunk of no tokens taken at the next iteration that schedules, in
    running order, while the budget is positive (without chunked prefill
    too).  A pulling head is never admitted otherwise, nor starts a prefill
    phase.  With nothing to run but pulls the engine waits for the first to
    end or the next arrival.  The controller's N_decode counts the pulling.

    ``release``: per request, the instant its blocks are freed if it
    completes before (a disaggregated deployment's prefill engine, holding
    a request's KV cache until its decode engine has read it; not with
    prefix caching).  Completed before it, the request leaves the running
    but its blocks stay taken until the first boundary at or after
    ``release``, where they are freed before anything is admitted.  With
    nothing to run but pulls or held blocks the engine waits for the first
    pull to end or blocks to be released, or the next arrival.

    ``until``: the engine stops before its first iteration that would
    start at or after ``until`` (the per-chain ``cached_blocks`` and
    ``refs`` then as they stand; the requests not done unstamped).
    Incompatible with ``cached`` (a ``ValueError``).

    ``join``: per request, the time it reaches the engine (default: its
    arrival; a request a cluster routed again, handed back by an engine
    leaving): it joins the waiting at the first iteration boundary at or
    after it, in the order given; ``arrival`` stays what its order's keys
    (aging, deadlines) count from.  ``leave``: times (increasing) the
    engine leaves its cluster: at its first iteration boundary at or after
    each, once the requests that reached it by the leave time have joined
    (those reaching it later join after), every waiting request but the
    preempted ones (the stack) leaves it unadmitted, in the order its
    admission order would admit them, none charged (fair sharing's
    counters); returned as ``handed``, a list per leave time (idle then, it
    hands back none).  A request the feedback queue preempted among its
    waiting cannot be handed back: a ``ValueError``."""
    if prefix_caching and cached is not None:
        raise ValueError("prefix caching is incompatible with cached (a decode stage's KV brought along)")
    n = len(arrival)
    arrival = [float(a) for a in arrival]
    join = list(arrival) if join is None else [float(x) for x in join]
    leave = list(leave)
    handed = [[] for _ in leave]
    nl = 0                   # the next leave
    prompt = [int(p) for p in prompt]
    output = [int(o) for o in output]
    blocks_total = math.inf if math.isinf(kv_tokens) else int(kv_tokens // block_size)
    free = blocks_total
    first = [math.nan] * n
    done = [math.nan] * n
    admitted = [math.nan] * n
    preempted = [0] * n
    g = [0] * n              # tokens generated
    pre = [0] * n            # tokens prefilled of the current admission
    need = [0] * n           # tokens to prefill at this admission (prompt + generated)
    held = [0] * n           # blocks held
    last_tok = [math.nan] * n
    running = []             # admission order
    resume = []              # preempted: a stack (the last pushed resumes first)
    waiting = []             # arrived, not admitted (arrival order)
    bins = []
    if admission == "multibin":
        bins = [[] for _ in range(len(edges) + 1)]
    rr = [0]
    counter = [0.0] * (len(class_slo) if class_slo is not None else 1)
    queues = [[] for _ in range(levels)]
    level = [0] * n
    used = [0] * n           # decode tokens taken at its level
    # prefix caching: the request's chain and shared tokens, the chains' cached blocks and the running holding them
    chain_of = [-1] * n
    shared_tokens = [0] * n
    grows_of = []
    if prefix_caching:
        if chain is not None:
            chain_of = [int(c) for c in chain]
        if shared is not None:
            shared_tokens = [int(s) for s in shared]
        if grows is not None:
            grows_of = [bool(x) for x in grows]
        else:
            grows_of = [False] * (max(chain_of) + 1 if n else 0)
        for r in range(n):
            if chain_of[r] >= len(grows_of) or (chain_of[r] >= 0 and not 0 <= shared_tokens[r] <= prompt[r]):
                raise ValueError(f"request {r}: chain {chain_of[r]}, shared {shared_tokens[r]}")
    chains = len(grows_of)
    chain_cached = [0] * chains     # the chain's first blocks kept
    refs = [0] * chains             # the running sequences holding the chain
    released_at = [-math.inf] * chains   # when its refs last fell to 0
    pinned = [0] * n                # the chain blocks a running sequence holds (held[r]: its own)
    evictable = 0                   # the cached blocks of the chains of refs 0 (counted in free)
    prefix_hits = 0
    prefix_queries = 0
    evictions = 0

    def level_quantum(lv):
        return quantum * 2 ** lv if lv < levels - 1 else math.inf

    def skip_level(p):
        first = step + iteration_overhead + prefill_per_token * p + prefill_attention * p * p
        if per_expert > 0.0:
            first += per_expert * (expert_span * (1.0 - expert_miss ** (p - 1.0)) if p >= 1 else 0.0)
        decode = step + iteration_overhead + per_sequence + per_context * (p + 1)
        e = first / decode
        lv = 0
        while lv < levels - 1 and level_quantum(lv) < e:
            lv += 1
        return lv
    clients = [[] for _ in counter]
    last_client = [None]
    tbt = []
    i = 0
    now = 0.0
    busy = 0.0
    iterations = 0
    preemptions = 0
    recomputed = 0
    quanta_for_memory = 0    # the feedback queue's preemptions for a head the free blocks could not hold
    caps = []
    pulling = []             # (pull's end, its number, r): the pulls under way
    holding = []             # (release, blocks): the blocks of completed requests held until their release
    releases = release       # (the parameter: ``release`` below is the step that frees a request's blocks)
    pending = set()          # the pulls landed, their chunk of no tokens still to come
    npulls = 0
    block_left = 0           # iterations of the block after the current one
    held_first, held_done = [], []
    if controller is not None:
        d_sla, eps_d, b_min, b_max, alpha, delta, mult = controller["sla"]
        ema = controller["ema"]
        mem = controller.get("memory")
        ctl = dict(lo=float(b_min), hi=float(b_max), tau=0.0, b_avg=0.0, n_decode=0.0, updates=0.0)
        st = [0.0] * 5       # avg prompt, avg output, count, mean tokens, m2 tokens

    def bin_of(r):
        return int(np.searchsorted(edges, prediction[r], side="right"))

    def arrive_until(t):
        nonlocal i
        while i < n and join[i] <= t:
            if admission == "multibin":
                bins[bin_of(i)].append(i)
            elif admission == "mlfq":
                level[i] = skip_level(prompt[i])
                queues[level[i]].append(i)
            elif admission == "vtc":
                u = klass[i]
                if not clients[u]:
                    backlogged = [counter[v] for v in range(len(clients)) if clients[v]]
                    if backlogged:
                        counter[u] = max(counter[u], min(backlogged))
                    elif last_client[0] is not None:
                        counter[u] = max(counter[u], counter[last_client[0]])
                clients[u].append(i)
            else:
                waiting.append(i)
            i += 1

    def peek():
        if resume:
            return resume[-1]
        if admission == "fcfs":
            return waiting[0] if waiting else -1
        if admission == "mlfq":
            return next((qu[0] for qu in queues if qu), -1)
        if admission == "edf":
            return min(waiting, key=lambda r: (arrival[r] + class_slo[klass[r]], r)) if waiting else -1
        if admission == "vtc":
            backlogged = [v for v in range(len(clients)) if clients[v]]
            return clients[min(backlogged, key=lambda v: (counter[v], v))][0] if backlogged else -1
        if admission == "spf":
            if not waiting:
                return -1
            if aging > 0.0:
                return min(waiting, key=lambda r: (float(prediction[r]) - aging * (now - arrival[r]), r))
            return min(waiting, key=lambda r: (prediction[r], r))
        K = len(bins)
        for off in range(K):
            b = (rr[0] + off) % K
            if bins[b]:
                return bins[b][0]
        return -1

    def take(r):
        if resume and resume[-1] == r:
            resume.pop()
            return
        if admission == "mlfq":
            assert queues[level[r]][0] == r
            queues[level[r]].pop(0)
            return
        if admission == "vtc":
            u = klass[r]
            assert clients[u][0] == r
            clients[u].pop(0)
            counter[u] += INPUT_WEIGHT * prompt[r]
            last_client[0] = u
            return
        if admission == "multibin":
            K = len(bins)
            for off in range(K):
                b = (rr[0] + off) % K
                if bins[b]:
                    assert bins[b][0] == r
                    bins[b].pop(0)
                    rr[0] = (b + 1) % K
                    return
        waiting.remove(r)

    def blocks(tokens):
        return -(-tokens // block_size)

    def pulls(r):
        """Whether the waiting head r pulls its KV cache (a new request, pull > 0)."""
        return (pull is not None and float(pull[r]) > 0.0 and not (resume and resume[-1] == r) and g[r] == 0)

    def hand_back():
        """Every waiting request (not a preempted one) out, in admission order."""
        gone = []
        stack = resume[:]
        resume.clear()
        while True:
            r = peek()
            if r < 0:
                break
            if g[r] > 0:
                raise ValueError("the engine holds requests it preempted among its waiting: it cannot hand them back")
            if admission == "vtc":
                clients[klass[r]].pop(0)
            else:
                take(r)
            gone.append(r)
        resume.extend(stack)
        return gone

    def plan(r):
        """Admitting r: its chain (-1: none), its prefix's full blocks k, the hit
        blocks h and the free blocks it needs."""
        L0 = prompt[r] + g[r]
        c = chain_of[r]
        k = min(shared_tokens[r], L0 - 1) // block_size if c >= 0 else 0
        if k == 0:
            return -1, 0, 0, blocks(L0 + 1)      # (no full block of its prefix: it holds no chain)
        h = min(chain_cached[c], k)
        # (an unreferenced chain is held to k blocks, its deeper ones evicted: it needs all its blocks)
        return c, k, h, blocks(L0 + 1) - (h if refs[c] > 0 else 0)

    def evict():
        """While the truly free blocks (free - evictable) are negative: the deepest
        blocks of the unreferenced chain released least recently."""
        nonlocal evictable, evictions
        while free < evictable:
            lru = [c for c in range(chains) if refs[c] == 0 and chain_cached[c] > 0]
            c = min(lru, key=lambda c: (released_at[c], c))
            x = min(chain_cached[c], evictable - free)
            chain_cached[c] -= x
            evictable -= x
            evictions += x

    def release(r, completed):
        """r leaves the running (completed, or preempted): it frees its own blocks
        (those a growing chain takes on completion aside) and lets go of its chain."""
        nonlocal free, evictable
        c = chain_of[r]
        holds = pinned[r] > 0
        joined = 0
        if c >= 0 and completed and grows_of[c]:
            kf = (prompt[r] + output[r] - 1) // block_size
            if kf > chain_cached[c]:
                joined = kf - chain_cached[c]        # its blocks cached[c] .. kf - 1 join the chain
                assert joined <= held[r]
                chain_cached[c] = kf
        kept = 0
        if completed and releases is not None and float(releases[r]) > now and not prefix_caching:
            # (held until its release: freed at the first boundary at or after it)
            holding.append((float(releases[r]), held[r]))
            kept = held[r]
        free += held[r] - joined - kept
        held[r] = 0
        if joined and not holds and refs[c] == 0:
            # (a chain it did not hold, no sequence holds: the blocks joined are evictable, the chain the newest)
            free += joined
            evictable += joined
            released_at[c] = now
        if holds:
            pinned[r] = 0
            refs[c] -= 1
            if refs[c] == 0:
                free += chain_cached[c]
                evictable += chain_cached[c]
                released_at[c] = now

    def check():
        """(prefix caching) the blocks' accounting."""
        if not prefix_caching:
            return
        assert evictable == sum(chain_cached[c] for c in range(chains) if refs[c] == 0)
        assert sum(refs) == sum(1 for r in running if pinned[r] > 0)
        assert all(pinned[r] <= chain_cached[chain_of[r]] for r in running if chain_of[r] >= 0)
        if not math.isinf(free):
            assert free >= evictable
            pinned_chains = sum(chain_cached[c] for c in range(chains) if refs[c] > 0)
            assert free + sum(held[r] for r in running) + pinned_chains == blocks_total

    def preempt_last():
        nonlocal preemptions
        r = running.pop()
        pending.discard(r)
        release(r, completed=False)
        preempted[r] += 1
        preemptions += 1
        resume.append(r)
        return r

    while True:
        while nl < len(leave) and now >= leave[nl]:
            # (the first boundary at or after a leave: the requests that reached the engine by then are in; those
            # that reach it later, it joining the cluster again, join after)
            arrive_until(leave[nl])
            handed[nl] = hand_back()
            nl += 1
        arrive_until(now)
        pulling.sort()
        while pulling and pulling[0][0] <= now:
            running.append(pulling.pop(0)[2])
            pending.add(running[-1])
        free += sum(b for t, b in holding if t <= now)
        holding = [(t, b) for t, b in holding if t > now]
        if block_left > 0 and not any(pre[r] == need[r] and r not in pending for r in running):
            block_left = 0
        if block_left == 0:
            for r in held_first:
                first[r] = now
            for r in held_done:
                done[r] = now
            held_first, held_done = [], []
        if not running and not pulling and peek() < 0:
            if i >= n:
                break
            now = max(now, join[i])
            continue
        if until is not None and now >= until:
            break
        cap = max_num_seqs
        if controller is not None:
            b, ctl["lo"], ctl["hi"] = b_sla_core(ctl["lo"], ctl["hi"], ctl["tau"], ctl["b_avg"], ctl["n_decode"],
                                                 ctl["updates"], d_sla, eps_d, float(b_min), float(b_max),
                                                 float(alpha), float(delta), mult)
            if mem is not None:
                eta, variant, z, default_tokens, mb_min, mb_max = mem
                b = min(b, b_mem_core(eta, variant, z, default_tokens, float(mb_min), float(mb_max), *st, 0.0))
            cap = min(int(b), max_num_seqs)
        caps.append(cap)
        scheduling = block_left == 0
        if not scheduling:
            block_left -= 1
        if scheduling and pull is not None:
            while len(running) + len(pulling) < cap:
                r = peek()
                if r < 0 or not pulls(r) or blocks(prompt[r] + 1) > free:
                    break
                take(r)
                held[r] = blocks(prompt[r] + 1)
                free -= held[r]
                need[r] = pre[r] = 0
                if math.isnan(admitted[r]):
                    admitted[r] = now
                pulling.append((now + float(pull[r]), npulls, r))
                npulls += 1
        decoding = [r for r in running if pre[r] == need[r] and r not in pending]
        prefill = {}
        prefill_phase = False
        if not chunked and scheduling:
            r = peek()
            if r >= 0 and len(running) + len(pulling) < cap and plan(r)[3] <= free and not pulls(r):
                prefill_phase = True
        if chunked or not prefill_phase:
            # the decodes' new blocks, preempting the most recently admitted while they do not fit
            while True:
                want = sum(1 for r in decoding if (prompt[r] + g[r]) % block_size == 0)
                if want <= free:
                    break
                gone = preempt_last()
                decoding = [r for r in decoding if r != gone]
            for r in decoding:
                if (prompt[r] + g[r]) % block_size == 0:
                    held[r] += 1     # (its own block, not its chain's)
                    free -= 1
            if prefix_caching:
                evict()
                check()
                if not chunked and scheduling and not decoding:
                    # every decode preempted to make room: this iteration prefills the head if it fits
                    r = peek()
                    if r >= 0 and len(running) + len(pulling) < cap and plan(r)[3] <= free:
                        prefill_phase = True
        else:
            decoding = []
        budget = max_batched_tokens - len(decoding)
        if scheduling and (chunked or pending):
            for r in running:
                if (pre[r] < need[r] or r in pending) and budget > 0:
                    c = min(need[r] - pre[r], budget)
                    prefill[r] = c
                    budget -= c
        if (chunked and scheduling) or prefill_phase:
            while budget > 0 and len(running) + len(pulling) < cap:
                r = peek()
                if r < 0 or pulls(r):
                    break
                L0 = prompt[r] + g[r]
                # (a resumption: from the stack, or a sequence the feedback queue preempted)
                resumed = (bool(resume) and resume[-1] == r) or g[r] > 0
                todo = L0 if resumed or cached is None else L0 - int(cached[r])
                b = blocks(L0 + 1)
                ch, k, h, b_need = plan(r)           # (no prefix caching: no chain, b_need = b)
                todo -= h * block_size               # (the hit blocks' tokens are not prefilled)
                if b_need > free or (not chunked and todo > budget):
                    break
                if resumed:
                    recomputed += L0 - h * block_size   # a resumption: its prompt and generated tokens prefilled again
                take(r)
                if prefix_caching:
                    prefix_queries += L0
                    prefix_hits += h * block_size
                if ch >= 0:
                    if refs[ch] == 0:
                        free -= chain_cached[ch]     # the chain's blocks are no longer evictable
                        evictable -= chain_cached[ch]
                        if chain_cached[ch] > k:
                            # (held to k blocks: its deeper ones are evicted, free again)
                            evictions += chain_cached[ch] - k
                            free += chain_cached[ch] - k
                            chain_cached[ch] = k
                    refs[ch] += 1
                    free -= b - h
                    chain_cached[ch] = max(chain_cached[ch], k)   # its prefix's blocks beyond the hit join the chain
                    held[r] = b - k
                    pinned[r] = k
                else:
                    free -= b
                    held[r] = b
                need[r] = todo
                pre[r] = 0
                if math.isnan(admitted[r]):
                    admitted[r] = now
                running.append(r)
                if prefix_caching:
                    evict()
                    check()
                c = min(todo, budget)
                prefill[r] = c
                budget -= c
        if not decoding and not prefill and not scheduling:
            block_left = 0           # (the block's decodes were all preempted: it ends)
            continue
        if not decoding and not prefill and (pulling or holding):
            # nothing to run but pulls or blocks held: wait for the first pull to end or blocks to be released,
            # or an arrival before (at most until)
            nxt = min([p[0] for p in pulling] + [t for t, _ in holding])
            if i < n:
                nxt = min(nxt, join[i])
            if until is not None:
                nxt = min(nxt, until)
            now = max(now, nxt)
            continue
        if not decoding and not prefill:
            # nothing fits (a lone request's blocks exceed the free ones: cannot happen when every request fits
            # the memory alone and nothing runs) or nothing to do
            assert not running, "stalled"
            if i >= n:
                break
            now = max(now, join[i])
            continue
        if scheduling:
            block_left = num_scheduler_steps - 1
        ptok = sum(prefill.values())
        ctx = sum(prompt[r] + g[r] for r in decoding)
        # (an engine's overhead per iteration is part of its fixed time)
        t = ((step + iteration_overhead) + prefill_per_token * ptok + per_sequence * len(decoding)
             + per_context * ctx)
        if per_expert > 0.0:
            tokens = len(decoding) + ptok
            t += per_expert * (expert_span * (1.0 - expert_miss ** (tokens - 1.0)) if tokens >= 1 else 0.0)
        if prefill_attention > 0.0:
            # causal attention over the prompt: a chunk of c tokens after the first `a` of its sequence's
            # tokens in the cache adds (a + c)^2 - a^2 (its part of the whole prompt's P^2)
            squares = 0.0
            for r, c in prefill.items():
                a = prompt[r] + g[r] - need[r] + pre[r]
                squares += (a + c) ** 2 - a ** 2
            t += prefill_attention * squares
        now = now + t
        busy += t
        iterations += 1
        for r in decoding:
            g[r] += 1
            used[r] += 1
            tbt.append(now - last_tok[r])
            last_tok[r] = now
            if admission == "vtc":
                counter[klass[r]] += OUTPUT_WEIGHT
        decoded = []             # decodes done with this iteration's token, out in request order below
        if admission == "mlfq":
            for r in sorted(decoding):
                if g[r] >= output[r]:
                    running.remove(r)
                    release(r, completed=True)
                    decoded.append(r)
                elif used[r] >= level_quantum(level[r]):
                    level[r] = min(level[r] + 1, levels - 1)
                    used[r] = 0
                    ahead = next((queues[lv][0] for lv in range(level[r]) if queues[lv]), -1)
                    if ahead >= 0 and (len(running) + len(pulling) >= cap
                                       or blocks(prompt[ahead] + g[ahead] + 1) > free):
                        quanta_for_memory += len(running) < cap
                        running.remove(r)
                        release(r, completed=False)
                        preempted[r] += 1
                        preemptions += 1
                        queues[level[r]].append(r)
        for r, c in prefill.items():
            pre[r] += c
            pending.discard(r)
            if pre[r] == need[r]:
                if g[r] == 0:
                    if block_left > 0:
                        held_first.append(r)
                    else:
                        first[r] = now
                else:
                    tbt.append(now - last_tok[r])
                g[r] += 1
                last_tok[r] = now
                if admission == "vtc":
                    counter[klass[r]] += OUTPUT_WEIGHT
        finished = [r for r in running if pre[r] == need[r] and g[r] >= output[r]]
        for r in finished:
            running.remove(r)
            release(r, completed=True)
        check()
        finished = decoded + finished
        for r in finished:
            if block_left > 0:
                held_done.append(r)
            else:
                done[r] = now
        if controller is not None:
            if mem is not None and finished:
                k = len(finished)
                sp, so = sum(prompt[r] for r in finished), sum(output[r] for r in finished)
                sq = sum((prompt[r] + output[r]) ** 2 for r in finished)
                m2 = float(k * sq - (sp + so) ** 2) / k
                st = list(feedback_core(k, float(sp), float(so), m2, float(max(output[r] for r in finished)), t,
                                        t, ema, *st, 0.0, 0.0)[:5])
            ctl["tau"], ctl["b_avg"] = feedback_core(len(decoding) + len(prefill), 0.0, 0.0, 0.0, 1.0, t, t, ema,
                                                     0.0, 0.0, 0.0, 0.0, 0.0, ctl["tau"], ctl["b_avg"])[5:]
            ctl["n_decode"] = float(len(running) + len(pulling))
            ctl["updates"] += 1.0
    if prefix_caching and until is None:
        assert not running and all(x == 0 for x in refs)
        assert math.isinf(free) or free == blocks_total   # (every chain's blocks evictable, counted free)
    return dict(first_token=np.array(first), completion=np.array(done), admitted=np.array(admitted),
                preempted=np.array(preempted), tbt=np.array(tbt), iterations=iterations, busy=busy,
                preemptions=preemptions, recomputed=recomputed, caps=np.array(caps),
                quanta_for_memory=quanta_for_memory, prefix_hits=prefix_hits, prefix_queries=prefix_queries,
                evictions=evictions, cached_blocks=list(chain_cached), refs=list(refs), handed=handed)
