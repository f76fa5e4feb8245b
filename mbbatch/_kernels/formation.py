"""Batch formation in the event kernel: how a free server's batch is chosen.

Each token-level policy forms its batches by one rule, named by a code the
policy gives (:meth:`mbbatch.policies.base.Policy.event_config`):

- ``FORM_STATIC``: up to ``B`` requests from the head of one FIFO;
- ``FORM_DYNAMIC``: Algorithm 3's target size ``min(b_mem, b_SLA)`` from
  Algorithms 1 and 2, then the head of the FIFO within the token capacity;
- ``FORM_MULTIBIN_DYNAMIC``: Algorithm 5 on top, a bin chosen by
  ``SEL_ROUND_ROBIN`` or ``SEL_LONGEST_QUEUE``, its own controller;
- ``FORM_MULTIBIN``: the multi-bin paper's batching (a cluster's engines):
  full batches of ``B`` of one bin only, the first formed first;
- ``FORM_SPF``: up to ``B`` requests, the smallest predicted outputs first
  (:mod:`.spf`).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from .common import CACHE, step
from .controller import A, C, M, T, b_mem_core, b_sla_core, check_memory
from .queues import Q
from .spf import FORM_SPF, call_order, order_address

__all__ = ["FORM_STATIC", "FORM_DYNAMIC", "FORM_MULTIBIN_DYNAMIC", "FORM_MULTIBIN", "FORM_SPF", "SEL_ROUND_ROBIN",
           "SEL_LONGEST_QUEUE", "SELECTIONS", "Rule", "form_batch", "ordering"]

FORM_STATIC = 0
FORM_DYNAMIC = 1
FORM_MULTIBIN_DYNAMIC = 2
FORM_MULTIBIN = 3
#: Algorithm 5's bin selection rules, by their names in the parameter table
SEL_ROUND_ROBIN = 0
SEL_LONGEST_QUEUE = 1
SELECTIONS = {"round_robin": SEL_ROUND_ROBIN, "longest_queue": SEL_LONGEST_QUEUE}

#: A run's batch formation rule and its settings, made once by the event
#: kernel: the rule (``FORM_*``), the bins per engine, the pinned or static
#: size (0: the controller's), the candidates looked at, Algorithm 5's
#: selection, whether the token capacity bounds the target (``memory_on``)
#: and drops the last candidates (``fit``), the controller's variants, its
#: SLA and memory settings (:data:`~.controller.SLA`, :data:`~.controller.MEMORY`
#: floats), the per-bin limits, the token capacity, the age (s) after
#: which a request goes first (inf: never), and the address of the step that
#: orders its queue (:func:`ordering`).
Rule = namedtuple("Rule", ("form", "bins", "pin", "max_candidates", "selection", "memory_on", "fit",
                           "multiplicative", "memory_variant", "sla", "memory", "bin_b_max", "eta", "max_wait",
                           "order"))


def ordering(form: int) -> int:
    """The address of rule ``form``'s step that puts its batch at the head
    of a queue (:data:`~.spf.ORDER_SIG`), compiled apart the first time a
    process runs the rule; 0: the rule serves the head as it is."""
    return order_address() if form == FORM_SPF else 0


@step
def _select_bin(K, select, rr, size):
    """Algorithm 5, step 1: the bin to serve (one holds requests), and the
    round-robin pointer after it."""
    if K == 1:
        return 0, rr
    if select == SEL_ROUND_ROBIN:
        for off in range(K):
            b = rr + off  # (rr + off) % K, without a division
            if b >= K:
                b -= K
            if size[b] > 0:
                return b, (b + 1 if b + 1 < K else 0)
        return -1, rr
    b = 0
    for idx in range(1, K):
        if size[idx] > size[b]:
            b = idx
    return b, rr


@step
def _full_bin(K, base, B, size, head, q, mask):
    """Multi-bin batching (the paper's model) on the engine whose bins start
    at ``base``: of the bins holding a full batch (``B`` requests), the one
    whose batch formed first (its B-th request joined first: by arrival,
    ties at one instant in request order; a request routed again from a
    removed engine joins at that instant, after every batch formed before),
    as the paper's central FIFO of formed batches serves them; -1 when no
    bin is full."""
    best = -1
    first = np.inf
    for lb in range(K):
        b = base + lb
        if size[b] < B:
            continue
        joined = q[Q.joined, np.uint64(b), np.uint64((head[b] + B - 1) & mask)]
        if joined < first:
            best = lb
            first = joined
    return best


@step
def _target_size(b, lb, policy, pin, memory_on, bin_b_max, memory_variant, memory, multiplicative, sla, ctl, st):
    """Algorithm 3, steps 1-2: the target size ``(b_target, b_mem, b_SLA)``
    of queue b's batch (-1: not computed; its engine's bin ``lb``), from
    Algorithm 1 and Algorithm 2 (which moves the queue's interval)."""
    if policy != FORM_DYNAMIC and policy != FORM_MULTIBIN_DYNAMIC:
        return pin, -1, -1      # (a size of its own: no controller)
    # (a per-bin limit only for the multi-bin policy)
    limit = bin_b_max[lb] if policy == FORM_MULTIBIN_DYNAMIC else 0.0
    bm = b_mem_core(memory[M.eta], memory_variant, memory[M.z], memory[M.default_tokens], memory[M.b_min],
                    memory[M.b_max], st[b, T.avg_prompt], st[b, T.avg_output], st[b, T.count],
                    st[b, T.mean_tokens], st[b, T.m2_tokens], limit)
    bs, ctl[b, C.b_low], ctl[b, C.b_high] = b_sla_core(
        ctl[b, C.b_low], ctl[b, C.b_high], ctl[b, C.tau_avg], ctl[b, C.b_avg], ctl[b, C.n_decode],
        ctl[b, C.updates], sla[A.d_sla], sla[A.eps_d], sla[A.b_min], sla[A.b_max], sla[A.alpha], sla[A.delta],
        multiplicative)
    if pin > 0:
        return pin, bm, bs
    if memory_on:
        return (bm if bm < bs else bs), bm, bs
    return bs, bm, bs


@njit(cache=CACHE, inline="always")
def _head_sums(q, ub, h0, nb, mask, kv):
    """The first nb requests of queue ub (head at slot h0), in one pass:
    their tokens, summed prompt and output lengths, largest output, largest
    prompt + output, and summed prefill tokens (with ``kv``; else the
    summed prompt)."""
    tokens = 0.0
    sum_prompt = 0.0
    sum_out = 0.0
    max_out = 0.0
    max_seq = 0.0
    sum_prefill = 0.0
    for j in range(nb):
        sl = np.uint64((h0 + j) & mask)
        p = q[Q.prompt, ub, sl]
        o = q[Q.output, ub, sl]
        tokens += p + o
        sum_prompt += p
        sum_out += o
        if o > max_out:
            max_out = o
        if p + o > max_seq:
            max_seq = p + o
        if kv:
            sum_prefill += q[Q.prefill, ub, sl]
    return tokens, sum_prompt, sum_out, max_out, max_seq, (sum_prefill if kv else sum_prompt)


@step
def _candidates(q, b, h0, nb, mask, fit, eta, kv):
    """Algorithm 3, step 3: the head of bin b's queue (at slot h0) that makes
    the batch: its first nb requests, and with ``fit`` fewer, the last ones
    dropped while their tokens exceed the capacity eta (0: the head request
    alone does).  Returns how many and their aggregates (:func:`_head_sums`;
    ``kv``: prefill tokens of their own);
    ``tokens`` is that of the nb candidates less those dropped."""
    ub = np.uint64(b)
    tokens, sum_prompt, sum_out, max_out, max_seq, sum_prefill = _head_sums(q, ub, h0, nb, mask, kv)
    if fit:
        nb0 = nb
        while nb > 0 and not check_memory(tokens, eta):
            sl = np.uint64((h0 + nb - 1) & mask)
            tokens -= q[Q.prompt, ub, sl] + q[Q.output, ub, sl]
            nb -= 1
        if 0 < nb < nb0:
            # the sums again, over the members kept (rare; the batch pass
            # above stays a single one in the common case)
            _, sum_prompt, sum_out, max_out, max_seq, sum_prefill = _head_sums(q, ub, h0, nb, mask, kv)
    return nb, tokens, sum_prompt, sum_out, max_out, max_seq, sum_prefill


@step
def form_batch(rule, ws, ctl, st, base, rr, waiting, kv, now):
    """The batch a free server takes at ``now`` from the engine whose queues
    start at ``base`` (``waiting`` requests queued there; ``ws`` holds the
    queues and the rule's scratch):
    by the rule, a bin (the first formed full batch's, or Algorithm 5's
    choice) and its target size (the static size, or Algorithm 3's from
    Algorithms 1 and 2), then the head of that bin's queue within the size
    and, where the rule fits it, the token capacity.  A head request alone
    above the capacity can never be served: it leaves the queue, rejected,
    and the rule looks again.

    Returns ``(nb, lb, rr, rejected, target, b_mem, b_sla, h0, tokens,
    sum_prompt, sum_out, max_out, max_seq, sum_prefill)``: the batch's size
    (0: none, no bin full or every request rejected), its bin on the engine,
    the round-robin pointer after it, the requests rejected, the sizes behind
    it (-1: not computed), its head slot and its members' aggregates
    (:func:`_candidates`)."""
    q = ws.q
    qidx = ws.qidx
    head = ws.head
    size = ws.size
    mask = q.shape[2] - 1
    K = rule.bins
    sizes = size[base:base + K]
    rejected = 0
    while waiting > 0:
        if rule.form == FORM_MULTIBIN:
            # a full batch, or none: requests wait for their bin to fill
            lb = _full_bin(K, base, rule.pin, size, head, q, mask)
            if lb < 0:
                break
            b = base + lb
            target, bm, bs = rule.pin, -1, -1
        else:
            lb, rr = _select_bin(K, rule.selection, rr, sizes)
            b = base + lb
            target, bm, bs = _target_size(b, lb, rule.form, rule.pin, rule.memory_on, rule.bin_b_max,
                                          rule.memory_variant, rule.memory, rule.multiplicative, rule.sla, ctl, st)
        # Algorithm 3, step 2: candidates, the head of that bin only
        nb = size[b] if size[b] < rule.max_candidates else rule.max_candidates
        nb = nb if nb < target else target
        if rule.form == FORM_SPF:
            head[b] = call_order(rule.order, (q, qidx, b, head[b], size[b], nb, now, rule.max_wait, ws.scratch))
        h0 = head[b]
        nb, tokens, sum_prompt, sum_out, max_out, max_seq, sum_prefill = _candidates(q, b, h0, nb, mask, rule.fit,
                                                                                     rule.eta, kv)
        if nb == 0:
            # the head request alone exceeds the capacity: it can never be served
            head[b] = (h0 + 1) & mask
            size[b] -= 1
            waiting -= 1
            rejected += 1
            continue
        return nb, lb, rr, rejected, target, bm, bs, h0, tokens, sum_prompt, sum_out, max_out, max_seq, sum_prefill
    return 0, 0, rr, rejected, 0, -1, -1, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
