"""The continuous-batching kernel against an independent plain-Python
engine (tests/reference_continuous.py), request by request."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mbbatch._kernels import continuous as ck
from mbbatch._kernels import controller as kc
from mbbatch._kernels.common import ARR_REPLAY, STOP_SIZE

from . import reference_continuous as ref

COEF = dict(step=0.01, prefill_per_token=1e-4, per_sequence=1e-3, per_context=1e-5, per_expert=0.0,
            expert_span=0.0, expert_miss=1.0)
#: a mixture of experts' term (8 experts, 2 a token: IterationModel.expert_fields)
MOE = dict(per_expert=2e-3, expert_span=6.0, expert_miss=0.75)
#: the kernel's cost fields (mbbatch._kernels.cost.FIELDS) of the reference's coefficients
_COST_NAMES = dict(step="cost_step", prefill_per_token="cost_prefill_per_token", per_sequence="cost_per_sequence",
                   per_context="cost_per_context_token", per_expert="cost_per_expert",
                   prefill_attention="cost_prefill_attention")


def _fields(coef):
    """The kernel's configuration fields of the reference engine's ``coef`` (its ``step``,
    ``prefill_per_token``, ... and the experts' span and miss); every other cost term 0."""
    coef = dict(coef)
    steps = coef.pop("num_scheduler_steps", 1)
    aging = coef.pop("aging", 0.0)
    # (the engine's overhead per iteration is in the kernel's step: as the planner packs it)
    coef["step"] = coef.get("step", 0.0) + coef.pop("iteration_overhead", 0.0)
    return {**dict.fromkeys(ck.COST_FIELDS, 0.0), "request_overhead": 0.0, "scheduler_steps": steps, "aging": aging,
            "goodput": coef.pop("goodput", 0), "quantum": coef.pop("quantum", 16),
            **{_COST_NAMES.get(k, k): v for k, v in coef.items()}}


def _control(controller):
    """The kernel's control packs of the reference's ``controller`` dict (None: none)."""
    if controller is None:
        return ck.controls()
    d_sla, eps_d, b_min, b_max, alpha, delta, mult = controller["sla"]
    sla = kc.SLA.pack(variant=int(mult), d_sla=d_sla, eps_d=eps_d, b_min=float(b_min), b_max=float(b_max),
                      alpha=float(alpha), delta=float(delta), ema=controller["ema"])
    mem = controller.get("memory")
    if mem is None:
        return ck.controls(sla)
    eta, variant, z, default_tokens, mb_min, mb_max = mem
    return ck.controls(sla, kc.MEMORY.pack(variant=variant, eta=eta, b_min=float(mb_min), b_max=float(mb_max), z=z,
                                           default_tokens=default_tokens))


def _kernel(arr, p, o, pred, *, max_num_seqs, max_batched_tokens, chunked, kv_tokens, block_size, admission,
            edges, controller=None, ts_rows=8, cached=None, klass=None, class_slo=None, class_tpot=None, goodput=0,
            quantum=16, levels=4, prefix_caching=False, chain=None, shared=None, grows=None, pull=None, release=None,
            **coef):
    n = len(arr)
    blocks = -1 if np.isinf(kv_tokens) else int(kv_tokens // block_size)
    cfg = ck.CONFIG.pack(n=n, arrival_kind=ARR_REPLAY, max_num_seqs=max_num_seqs,
                         max_batched_tokens=max_batched_tokens, chunked=int(chunked), blocks=blocks,
                         block_size=block_size, admission=ck.ADMISSIONS[admission],
                         bins=(len(class_slo) if admission == "vtc" else levels if admission == "mlfq"
                               else len(edges) + 1), keep=1,
                         controlled=int(controller is not None),
                         memory_on=int(controller is not None and controller.get("memory") is not None),
                         rate=0.0, until=np.inf, **_fields({**coef, "goodput": goodput, "quantum": quantum}))
    inputs = ck.INPUTS.pack(arrival_times=np.asarray(arr, float), arrival_params=np.ones(1),
                            arrival_ends=np.full(1, np.inf), prompt=p.astype(float), output=o.astype(float),
                            prediction=pred.astype(float), edges=np.asarray(edges, float),
                            cached=np.empty(0) if cached is None else np.asarray(cached, float),
                            pull=np.empty(0) if pull is None else np.asarray(pull, float),
                            release=np.empty(0) if release is None else np.asarray(release, float),
                            klass=np.empty(0) if klass is None else np.asarray(klass, float),
                            class_slo=np.full(1, np.inf) if class_slo is None else np.asarray(class_slo, float),
                            class_tpot=np.full(1, np.inf) if class_tpot is None else np.asarray(class_tpot, float),
                            **(dict(chain=np.full(n, -1.0) if chain is None else np.asarray(chain, float),
                                    shared=np.zeros(n) if shared is None else np.asarray(shared, float),
                                    grows=np.zeros(0) if grows is None else np.asarray(grows, float))
                               if prefix_caching else {}))
    out, req, code = ck.run(cfg, inputs, ck.ContinuousStreams(np.random.default_rng(0)),
                            np.zeros(STOP_SIZE, np.int64), control=_control(controller), groups=4,
                            ts_rows=ts_rows)
    return out, req, code


def _config(rng, moe=False):
    """A random small run: arrival times (ties sometimes), lengths, predictions
    off by a few tokens half the time, memory from unlimited to one that
    forces preemptions, budgets and orders; ``moe``: a mixture of experts'
    iteration cost."""
    n = int(rng.integers(1, 60))
    arr = np.sort(rng.exponential(rng.choice([0.01, 0.1, 1.0]), n).cumsum())
    if rng.random() < 0.2:
        arr = np.round(arr, 1)       # equal arrival times
    p = rng.integers(1, 40, n)
    o = rng.integers(1, 30, n)
    pred = o + rng.integers(-3, 4, n) * (rng.random() < 0.5)
    # (powers of two divide by shifts and masks in the kernel, 3 and 12 by division: both paths)
    bs = int(rng.choice([1, 3, 4, 12, 16]))
    longest = int((p + o).max())
    kv = rng.choice([np.inf, longest + bs * rng.integers(0, 4), longest * 3, longest * 10])
    kv = np.inf if np.isinf(kv) else float(bs * (-(-kv // bs)))
    chunked = bool(rng.random() < 0.5)
    M = int(rng.choice([1, 2, 4, 16]))
    budget = int(rng.choice([max(M, 8), 64, 256])) if chunked else int(max(longest, rng.choice([64, 256])))
    return (arr, p, o, pred), dict(max_num_seqs=M, max_batched_tokens=budget, chunked=chunked, kv_tokens=kv,
                                   block_size=bs, admission=str(rng.choice(["fcfs", "spf", "multibin"])),
                                   edges=np.array([10.0, 20.0]), **{**COEF, **(MOE if moe else {})})


def _aged(rng, arr, kw):
    """Shortest predicted first with aging (tokens/s) on half the configurations admitting shortest first,
    on arrival times not rounded (at a decimal tie the kernel's key, prediction + aging x arrival, and the
    reference's priority, prediction - aging x waited, round apart)."""
    if kw["admission"] != "spf" or rng.random() < 0.5:
        return arr, kw
    arr = np.sort(arr + rng.uniform(0.0, 1e-3, arr.size))
    return arr, {**kw, "aging": float(rng.choice([0.5, 5.0, 50.0]))}


def _classed(rng, kw):
    """Earliest deadline first or fair sharing (alike) on half the
    configurations admitting first come first served: each request of one
    of three classes, two with an objective on the time to first token
    (drawn), one without."""
    if kw["admission"] != "fcfs" or rng.random() < 0.5:
        return kw
    slo = np.array([rng.choice([0.01, 0.1, 1.0]), rng.choice([0.05, 0.5, 5.0]), np.inf])
    tpot = np.array([rng.choice([0.005, 0.02, 0.1]), np.inf, rng.choice([0.01, 0.05])])
    return {**kw, "admission": str(rng.choice(["edf", "vtc"])), "class_slo": slo, "class_tpot": tpot, "goodput": 1}


def _same_classes(out, want, arr, o, klass, slo, tpot_slo):
    """The kernel's per-class statistics are the reference's requests'
    counted by class: completed, first tokens within their class's
    objective, requests within both its objectives (goodput: the time per
    output token from the first token to the last), the sums, and each
    class's latency histogram."""
    ttft = want["first_token"] - np.asarray(arr)
    lat = want["completion"] - np.asarray(arr)
    tpot = np.where(o > 1, (want["completion"] - want["first_token"]) / np.maximum(o - 1.0, 1.0), 0.0)
    good = (ttft <= slo[klass]) & (tpot <= tpot_slo[klass])
    assert out.ints[ck.S.good] == good.sum()
    for c in range(len(slo)):
        mine = klass == c
        st = out.class_stats[c]
        assert st[ck.CLASS.completed] == mine.sum()
        assert st[ck.CLASS.ttft_met] == (ttft[mine] <= slo[c]).sum()
        assert st[ck.CLASS.good] == good[mine].sum()
        assert st[ck.CLASS.sum_ttft] == pytest.approx(ttft[mine].sum(), rel=1e-12, abs=1e-12)
        assert st[ck.CLASS.sum_latency] == pytest.approx(lat[mine].sum(), rel=1e-12, abs=1e-12)
        hist = np.zeros_like(out.hist)
        np.add.at(hist, [int(ck.hist_bucket(x)) for x in lat[mine]], 1)
        np.testing.assert_array_equal(out.class_hist[c, 0], hist)


def _same_run(out, req, code, want, kw) -> dict:
    """The kernel's run ``(out, req, code)`` is the reference's ``want``:
    each request's admission, first token, completion and preemptions, the
    iterations, preemptions and recomputed tokens.  Returns its statistics."""
    st = ck.STATS.unpack((out.ints, out.floats))
    assert code == ck.DONE
    for col in ("admitted", "first_token", "completion"):
        np.testing.assert_array_equal(req[col], want[col], err_msg=f"{col} {kw}")
    np.testing.assert_array_equal(req["preemptions"], want["preempted"])
    assert (st["iterations"], st["preemptions"], st["recomputed"]) == (
        want["iterations"], want["preemptions"], want["recomputed"]), kw
    return st


@pytest.mark.parametrize("seed", range(6))
def test_the_kernel_is_the_reference_engine_request_by_request(seed):
    """Over 40 random configurations per seed (chunked and not, memory that
    binds with preemptions and memory that does not, every admission order,
    equal arrival times): each request's admission, first token and
    completion times and preemptions, the iterations, preemptions and
    recomputed tokens, equal; the gaps between tokens equal in number, in
    their histogram and (summed in another order) their sum.  A third of
    the configurations time a mixture of experts' iterations; half of those
    admitting shortest predicted first age it (:func:`_aged`), and half of
    those admitting first come first served admit earliest deadline first
    or by fair sharing, their requests in three classes (:func:`_classed`),
    whose statistics are checked too."""
    rng = np.random.default_rng(seed)
    seen_preemptions = 0
    for k in range(40):
        (arr, p, o, pred), kw = _config(rng, moe=k % 3 == 0)
        arr, kw = _aged(rng, arr, kw)
        kw = _classed(rng, kw)
        if "class_slo" in kw:
            kw["klass"] = rng.integers(0, 3, len(arr))
        want = ref.simulate(arr, p, o, pred, **kw)
        out, req, code = _kernel(arr, p, o, pred, **kw)
        st = _same_run(out, req, code, want, kw)
        if "class_slo" in kw:
            _same_classes(out, want, arr, o, kw["klass"], kw["class_slo"], kw["class_tpot"])
        assert st["tbt_count"] == want["tbt"].size == int((o - 1).sum())
        hist = np.zeros_like(out.hist_tbt)
        for gap in want["tbt"]:
            hist[int(ck.hist_bucket(gap))] += 1
        np.testing.assert_array_equal(out.hist_tbt, hist)
        assert st["sum_tbt"] == pytest.approx(want["tbt"].sum(), rel=1e-12, abs=1e-15)
        assert st["completed"] == len(arr) and st["busy"] == pytest.approx(want["busy"], rel=1e-12)
        seen_preemptions += st["preemptions"]
    assert seen_preemptions > 0          # (the memory bound some runs)


def _prefixed(rng, p, kw):
    """Prefix caching on a random configuration: 1 to 6 chains (some of
    them sessions', which a completed request's context extends), each
    request in one (or none, a fifth) sharing a random part of its prompt
    (its whole prompt sometimes); a memory of one to three times the longest
    request, so that cached blocks are evicted and sequences preempted."""
    n = p.size
    chains = int(rng.integers(1, 7))
    chain = np.where(rng.random(n) < 0.8, rng.integers(0, chains, n), -1)
    shared = np.where(chain >= 0, np.minimum(p, rng.integers(0, 2 * p.max() + 1, n)), 0)
    bs = kw["block_size"]
    longest = int((p + 40).max())
    kv = float(bs * -(-longest * rng.choice([1.0, 1.5, 3.0]) // bs))
    return {**kw, "prefix_caching": True, "chain": chain, "shared": shared,
            "grows": rng.random(chains) < 0.4, "kv_tokens": kv}


@pytest.mark.parametrize("seed", range(4))
def test_prefix_caching_is_the_reference_engines(seed):
    """Prefix caching (vLLM's automatic prefix caching, by chains of
    blocks: the kernel's docstring) over 40 random configurations per seed
    (:func:`_prefixed`; every admission order but the classes', chunked and
    not, a quarter in multi-step blocks): each request's admission, first
    token, completion and preemptions, the iterations, preemptions and
    recomputed tokens, and the cache's hits, lookups and evictions equal the
    reference's; some runs hit, some evict, some preempt."""
    rng = np.random.default_rng(100 + seed)
    seen = dict(hits=0, evictions=0, preemptions=0)
    for k in range(40):
        (arr, p, o, pred), kw = _config(rng)
        p = p + rng.integers(0, 60) * (rng.random(p.size) < 0.7)
        kw = _prefixed(rng, p, kw)
        kw["admission"] = str(rng.choice(["fcfs", "spf", "multibin", "mlfq"]))
        if kw["admission"] == "mlfq":
            kw.update(quantum=int(rng.integers(1, 9)), levels=int(rng.integers(1, 5)))
        if rng.random() < 0.25:
            kw["num_scheduler_steps"] = int(rng.integers(2, 5))
        if not kw["chunked"]:
            kw["max_batched_tokens"] = int(max(kw["max_batched_tokens"], (p + o).max()))
        want = ref.simulate(arr, p, o, pred, **kw)
        out, req, code = _kernel(arr, p, o, pred, **kw)
        st = _same_run(out, req, code, want, kw)
        assert (st["prefix_hits"], st["prefix_queries"], st["evictions"]) == (
            want["prefix_hits"], want["prefix_queries"], want["evictions"]), kw
        assert st["completed"] == len(arr) and st["busy"] == pytest.approx(want["busy"], rel=1e-12)
        seen["hits"] += st["prefix_hits"]
        seen["evictions"] += st["evictions"]
        seen["preemptions"] += st["preemptions"]
    assert all(v > 0 for v in seen.values()), seen


@pytest.mark.parametrize("seed", range(4))
def test_the_feedback_queue_is_the_reference_engines(seed):
    """The skip-join multi-level feedback queue (FastServe) over 40 random
    configurations per seed: first quanta of 1 to 8 tokens, 1 to 5 levels,
    a third with a mixture of experts' or the prefill's attention term (the
    skip-join's costs), a quarter with multi-step blocks; each request's
    admission, first token, completion and preemptions (the quanta's and
    the memory's), the iterations, preemptions and recomputed tokens equal
    the reference's, and the gaps between tokens.  The quanta preempt some
    runs for a waiting head the running sequences' cap keeps out and some
    for one the free blocks cannot hold (the test would not see the order's
    preemptions otherwise)."""
    rng = np.random.default_rng(900 + seed)
    demoted = for_memory = 0
    for k in range(40):
        (arr, p, o, pred), kw = _config(rng, moe=k % 3 == 0)
        kw.update(admission="mlfq", quantum=int(rng.choice([1, 2, 3, 8])), levels=int(rng.integers(1, 6)))
        if k % 3 == 1:
            kw["prefill_attention"] = float(rng.choice([1e-6, 1e-5]))
        if k % 4 == 3:
            kw["num_scheduler_steps"] = int(rng.integers(2, 5))
        want = ref.simulate(arr, p, o, pred, **kw)
        out, req, code = _kernel(arr, p, o, pred, **kw)
        st = _same_run(out, req, code, want, kw)
        assert st["tbt_count"] == want["tbt"].size == int((o - 1).sum())
        assert st["sum_tbt"] == pytest.approx(want["tbt"].sum(), rel=1e-12, abs=1e-15)
        assert st["completed"] == len(arr) and st["busy"] == pytest.approx(want["busy"], rel=1e-12)
        if np.isinf(kw["kv_tokens"]):
            demoted += st["preemptions"]
        for_memory += want["quanta_for_memory"]
    assert demoted > 0 and for_memory > 0


def test_one_level_is_first_come_first_served():
    """A feedback queue of one level, whose quantum is unbounded, is first
    come first served: the same run, bit for bit."""
    rng = np.random.default_rng(11)
    for _ in range(10):
        (arr, p, o, pred), kw = _config(rng)
        kw.pop("admission")
        fcfs = _kernel(arr, p, o, pred, admission="fcfs", **kw)
        one = _kernel(arr, p, o, pred, admission="mlfq", levels=1, quantum=1, **kw)
        for col in ("admitted", "first_token", "completion", "preemptions"):
            np.testing.assert_array_equal(one[1][col], fcfs[1][col])
        np.testing.assert_array_equal(one[0].ints, fcfs[0].ints)
        np.testing.assert_array_equal(one[0].floats, fcfs[0].floats)


@pytest.mark.parametrize("seed", range(3))
def test_multi_step_scheduling_is_the_reference_engines(seed):
    """Blocks of 2 to 6 iterations (vLLM's ``--num-scheduler-steps``) over
    30 random configurations per seed, a controller in a third: each
    request's admission, first token and completion (the ends of the blocks
    that made them), the iterations and preemptions equal the reference's;
    the engine's gaps between tokens too."""
    rng = np.random.default_rng(700 + seed)
    held = 0
    for k in range(30):
        (arr, p, o, pred), kw = _config(rng)
        kw["num_scheduler_steps"] = int(rng.integers(2, 7))
        controller = _controller(rng) if k % 3 == 0 else None
        want = ref.simulate(arr, p, o, pred, controller=controller, **kw)
        out, req, code = _kernel(arr, p, o, pred, controller=controller, **kw)
        st = _same_run(out, req, code, want, kw)
        assert st["tbt_count"] == want["tbt"].size
        assert st["sum_tbt"] == pytest.approx(want["tbt"].sum(), rel=1e-12, abs=1e-15)
        assert st["completed"] == len(arr)
        assert st["sum_ttft"] == pytest.approx(float(np.sum(want["first_token"] - arr)), rel=1e-12, abs=1e-12)
        held += int(np.sum(want["first_token"] > arr))
    assert held > 0


def test_a_block_holds_back_its_tokens_and_admits_nothing():
    """Two requests, blocks of 4 quarter-second iterations: the first,
    alone, prefills at [0, 0.25) and decodes 3 more iterations; its first
    token is returned at the block's end, 1.0 s.  The second arrives at 0.1,
    within the block: admitted only at the next block, at 1.0; that block
    makes the first's last two tokens and the second's two, and ends early,
    at 1.5, with nothing left to decode: every token it made is returned
    then."""
    arr = np.array([0.0, 0.1])
    p = np.array([8, 8])
    o = np.array([6, 2])
    out, req, code = _kernel(arr, p, o, o, max_num_seqs=4, max_batched_tokens=64, chunked=True, kv_tokens=np.inf,
                             block_size=4, admission="fcfs", edges=[], num_scheduler_steps=4, **QUARTER)
    assert code == ck.DONE
    np.testing.assert_array_equal(req["admitted"], [0.0, 1.0])
    np.testing.assert_array_equal(req["first_token"], [1.0, 1.5])
    np.testing.assert_array_equal(req["completion"], [1.5, 1.5])
    one = _kernel(arr, p, o, o, max_num_seqs=4, max_batched_tokens=64, chunked=True, kv_tokens=np.inf,
                  block_size=4, admission="fcfs", edges=[], **QUARTER)[1]
    np.testing.assert_array_equal(one["first_token"], [0.25, 0.5])


def _controller(rng):
    """A random controller: D_SLA about the iterations' times (so that
    every case of Algorithm 2 happens), either variant, and half the time
    Algorithm 1 on a token capacity that binds now and then."""
    d_sla = float(rng.choice([0.012, 0.02, 0.04]))
    b_min = int(rng.integers(1, 3))
    b_max = int(rng.choice([4, 8, 16]))
    c = dict(sla=(d_sla, float(rng.choice([0.0, 1e-3])), b_min, max(b_min, b_max), int(rng.choice([2, 4])),
                  int(rng.choice([1, 2])), bool(rng.random() < 0.3)), ema=kc.DEFAULT_EMA)
    if rng.random() < 0.5:
        c["memory"] = (float(rng.choice([150.0, 400.0, 2000.0])), int(rng.integers(0, 2)), 1.645, 50.0, b_min,
                       max(b_min, b_max))
    return c


@pytest.mark.parametrize("seed", range(2))
def test_requests_bringing_their_prompts_kv_cache_are_the_reference_engines(seed):
    """A decode stage's requests, bringing the KV cache of their whole
    prompt (or of part of it), over 40 random configurations per seed:
    equal to the reference request by request; a request that brings its
    whole prompt and is never preempted prefills nothing (its first token
    ends the iteration that admits it)."""
    rng = np.random.default_rng(200 + seed)
    for _ in range(40):
        (arr, p, o, pred), kw = _config(rng)
        cached = np.where(rng.random(len(p)) < 0.6, p, rng.integers(0, p + 1))
        want = ref.simulate(arr, p, o, pred, cached=cached, **kw)
        st = _same_run(*_kernel(arr, p, o, pred, cached=cached, **kw), want, kw)
        assert st["prefill_tokens"] == int((p - cached).sum()) + st["recomputed"]


def test_the_decode_kernel_is_the_full_one_bit_for_bit(monkeypatch):
    """Over 30 random runs of requests pulling their KV caches that need
    nothing else of the full kernel's, :data:`ck.decode_kernel` (the lean
    kernel with the pulls: :func:`ck.kernel_of` picks it) writes every
    statistic, histogram, group, time-series row and record the full
    kernel writes."""
    rng = np.random.default_rng(77)
    ran = 0
    for _ in range(30):
        (arr, p, o, pred), kw = _config(rng)
        pull = np.where(rng.random(len(p)) < 0.85, rng.exponential(float(rng.choice([1e-3, 0.1])), len(p)), 0.0)
        got = _kernel(arr, p, o, pred, cached=p, pull=pull, **kw)
        with monkeypatch.context() as m:
            m.setattr(ck, "decode_kernel", ck.continuous_kernel)
            want = _kernel(arr, p, o, pred, cached=p, pull=pull, **kw)
        assert got[2] == want[2] == ck.DONE
        for f in got[0]._fields:
            np.testing.assert_array_equal(getattr(got[0], f), getattr(want[0], f), err_msg=f)
        for k in want[1]:
            np.testing.assert_array_equal(got[1][k], want[1][k], err_msg=k)
        ran += kw["admission"] in ("fcfs", "spf", "multibin")
    assert ran >= 10        # (the decode kernel ran)


@pytest.mark.parametrize("seed", range(3))
def test_requests_pulling_their_kv_cache_are_the_reference_engines(seed):
    """A disaggregated deployment's decode pool: each request bringing its
    whole prompt's KV cache, most pulling it once admitted (from 0.1 ms to
    a second; a few not at all, or equal pulls that land together), over 40
    random configurations per seed, chunked and not, memory that preempts,
    multi-step scheduling and a controller on some: equal to the reference
    request by request.  A request that pulls is admitted before its pull
    ends and its first token comes after it."""
    rng = np.random.default_rng(900 + seed)
    pulled = 0
    for j in range(40):
        (arr, p, o, pred), kw = _config(rng)
        if j % 4 == 1:
            kw["num_scheduler_steps"] = int(rng.choice([2, 4]))
        if j % 4 == 2:
            kw["controller"] = _controller(rng)
        scale = float(rng.choice([1e-4, 0.01, 0.3, 1.0]))
        pull = np.where(rng.random(len(p)) < 0.85, rng.exponential(scale, len(p)), 0.0)
        if rng.random() < 0.3:
            pull = np.where(pull > 0, scale, 0.0)      # (equal pulls: landings at one instant)
        want = ref.simulate(arr, p, o, pred, cached=p, pull=pull, **kw)
        out, req, code = _kernel(arr, p, o, pred, cached=p, pull=pull, **kw)
        _same_run(out, req, code, want, kw)
        fresh = (pull > 0) & (req["preemptions"] == 0)
        assert np.all(req["first_token"][fresh] >= req["admitted"][fresh] + pull[fresh])
        pulled += int(fresh.sum())
    assert pulled > 500


@pytest.mark.parametrize("seed", range(3))
def test_requests_holding_their_blocks_past_completion_are_the_reference_engines(seed):
    """A disaggregated deployment's prefill engine: each request (one
    output token, or a few) holding its KV blocks past its completion until
    a release drawn after it (from 0.1 ms to 2 s; some freed at once, some
    at equal instants), over 40 random configurations per seed, chunked
    and not, memory that preempts, multi-step scheduling and a controller
    on some: equal to the reference request by request.  The releases bind:
    over the seeds, some request waits longer than it does with its blocks
    freed at completion."""
    rng = np.random.default_rng(950 + seed)
    slower = 0
    for j in range(40):
        (arr, p, o, pred), kw = _config(rng)
        if j % 2 == 0:
            o = np.ones_like(o)
            pred = o.copy()
        if j % 4 == 1:
            kw["num_scheduler_steps"] = int(rng.choice([2, 4]))
        if j % 4 == 2:
            kw["controller"] = _controller(rng)
        free = _kernel(arr, p, o, pred, **kw)[1]
        scale = float(rng.choice([1e-4, 0.01, 0.3, 2.0]))
        wait = np.where(rng.random(len(p)) < 0.85, rng.exponential(scale, len(p)), 0.0)
        if rng.random() < 0.3:
            wait = np.where(wait > 0, scale, 0.0)     # (equal holds: releases at one instant, for some)
        release = free["completion"] + wait
        want = ref.simulate(arr, p, o, pred, release=release, **kw)
        out, req, code = _kernel(arr, p, o, pred, release=release, **kw)
        _same_run(out, req, code, want, kw)
        slower += int(np.any(req["completion"] > free["completion"]))
    assert slower > 0


@pytest.mark.parametrize("seed", range(2))
def test_the_prefill_attention_is_the_reference_engines(seed):
    """The prefill's attention term (``prefill_attention`` times each
    chunk's part of its prompt's P^2), over 30 random configurations per
    seed, chunked and not, preempted and resumed, some requests bringing part
    of their prompt's KV cache, and an engine's overhead per iteration (10
    more): equal to the reference request by request; a prompt prefilled in
    chunks pays its whole P^2."""
    rng = np.random.default_rng(300 + seed)
    for _ in range(30):
        (arr, p, o, pred), kw = _config(rng)
        kw["prefill_attention"] = float(rng.choice([1e-6, 3e-4]))
        cached = rng.integers(0, p + 1) if rng.random() < 0.3 else None
        want = ref.simulate(arr, p, o, pred, cached=cached, **kw)
        _same_run(*_kernel(arr, p, o, pred, cached=cached, **kw), want, kw)
    # with an overhead per iteration too
    for _ in range(10):
        (arr, p, o, pred), kw = _config(rng)
        kw["iteration_overhead"] = float(rng.choice([1e-4, 5e-3]))
        want = ref.simulate(arr, p, o, pred, **kw)
        _same_run(*_kernel(arr, p, o, pred, **kw), want, kw)
    # one request alone, its prompt in chunks of 64: its first token after step + P (prefill_per_token
    # + P prefill_attention) + 2 step (three chunks), the chunks' squares adding to P^2
    P = 150
    coef = {**COEF, "prefill_attention": 1e-6}
    _, req, _ = _kernel([0.0], np.array([P]), np.array([1]), np.array([1]), max_num_seqs=1, max_batched_tokens=64,
                        chunked=True, kv_tokens=np.inf, block_size=16, admission="fcfs", edges=[], **coef)
    want = 3 * coef["step"] + P * coef["prefill_per_token"] + P * P * coef["prefill_attention"]
    assert req["first_token"][0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_the_controlled_kernel_is_the_reference_engine_request_by_request(seed):
    """Algorithms 1, 2 and 7 setting the running sequences' cap at every
    iteration, over 30 random configurations per seed: the cap of every
    iteration (the time series, a row per iteration), each request's
    admission, first token and completion, the preemptions and the
    controller's last state equal the reference's."""
    rng = np.random.default_rng(100 + seed)
    caps_seen = set()
    for _ in range(30):
        (arr, p, o, pred), kw = _config(rng)
        kw["controller"] = _controller(rng)
        want = ref.simulate(arr, p, o, pred, **kw)
        out, req, code = _kernel(arr, p, o, pred, ts_rows=2 * (len(want["caps"]) + 1), **kw)
        st = _same_run(out, req, code, want, kw)
        assert st["ts_stride"] == 1
        np.testing.assert_array_equal(out.ts[:st["ts_rows"], ck.TS.max_num_seqs], want["caps"], err_msg=f"{kw}")
        caps_seen.update(np.unique(want["caps"]).tolist())
    assert len(caps_seen) > 5             # (the cap moved)


@pytest.mark.parametrize("moe", [False, True])
def test_one_sequence_at_a_time_is_a_fifo_server_of_the_iteration_models_batches(moe):
    """max_num_seqs = 1 without chunking: each request runs alone, from its
    admission to its completion the IterationModel's time of a batch of one
    (its prefill iteration, then one per further token), in arrival order;
    for a mixture of experts too (its prefill reads experts, its decode
    steps of one token none beyond the first's)."""
    import mbbatch as mb

    rng = np.random.default_rng(3)
    n = 300
    arr = np.sort(rng.exponential(0.5, n).cumsum())
    p, o = rng.integers(1, 500, n), rng.integers(1, 200, n)
    coef = {**COEF, **(MOE if moe else {})}
    out, req, code = _kernel(arr, p, o, o.copy(), max_num_seqs=1, max_batched_tokens=int(p.max()), chunked=False,
                             kv_tokens=np.inf, block_size=16, admission="fcfs", edges=[], **coef)
    model = mb.IterationModel(setup=0.0, step=COEF["step"], prefill_per_token=COEF["prefill_per_token"],
                              per_sequence=COEF["per_sequence"], per_context_token=COEF["per_context"],
                              per_expert=coef["per_expert"], experts=8 if moe else 0)
    assert model.expert_fields() == {k: coef[k] for k in ("expert_span", "expert_miss")}
    assert model.cost_fields()["cost_per_expert"] == coef["per_expert"]
    service = model.service_time(size=np.ones(n, np.int64), prompt=p, output=o)
    np.testing.assert_allclose(req["completion"] - req["admitted"], service, rtol=1e-9)
    start = np.maximum.accumulate(np.maximum(arr, np.concatenate(([0.0], req["completion"][:-1]))))
    np.testing.assert_allclose(req["admitted"], start, rtol=1e-12)
    assert np.all(np.diff(req["completion"]) > 0)


def test_unlimited_memory_never_preempts_and_memory_for_one_sequence_serializes():
    """Without a memory bound nothing is preempted.  With 30 blocks of 4
    tokens, prompts of 70 to 79 tokens (an admission takes 18 blocks at
    least: two never fit) and outputs up to 40 (every request fits alone):
    one sequence runs at a time, in arrival order, never preempted, each
    from its admission to its completion the IterationModel's batch of one."""
    import mbbatch as mb

    rng = np.random.default_rng(4)
    n = 200
    arr = np.sort(rng.exponential(0.05, n).cumsum())
    p, o = rng.integers(1, 60, n), rng.integers(1, 60, n)
    kw = dict(max_batched_tokens=512, chunked=True, block_size=4, admission="fcfs", edges=[], **COEF)
    out, _, _ = _kernel(arr, p, o, o.copy(), max_num_seqs=64, kv_tokens=np.inf, **kw)
    st = ck.STATS.unpack((out.ints, out.floats))
    assert st["preemptions"] == 0 and st["max_running"] > 1
    p, o = rng.integers(70, 80, n), rng.integers(1, 41, n)
    out, req, _ = _kernel(arr, p, o, o.copy(), max_num_seqs=64, kv_tokens=120.0, **kw)
    st = ck.STATS.unpack((out.ints, out.floats))
    assert st["completed"] == n and st["preemptions"] == 0 and st["max_running"] == 1
    assert np.all(np.diff(req["admitted"]) > 0) and np.all(req["admitted"][1:] >= req["completion"][:-1])
    model = mb.IterationModel(setup=0.0, step=COEF["step"], prefill_per_token=COEF["prefill_per_token"],
                              per_sequence=COEF["per_sequence"], per_context_token=COEF["per_context"])
    np.testing.assert_allclose(req["completion"] - req["admitted"],
                               model.service_time(size=np.ones(n, np.int64), prompt=p, output=o), rtol=1e-9)


def test_the_time_series_keeps_a_row_every_stride_iterations():
    rng = np.random.default_rng(5)
    n = 400
    arr = np.sort(rng.exponential(0.02, n).cumsum())
    p, o = rng.integers(1, 60, n), rng.integers(1, 60, n)
    out, _, _ = _kernel(arr, p, o, o.copy(), max_num_seqs=8, max_batched_tokens=64, chunked=True, kv_tokens=400.0,
                        block_size=4, admission="spf", edges=[], **COEF)
    st = ck.STATS.unpack((out.ints, out.floats))
    rows, stride = st["ts_rows"], st["ts_stride"]
    assert stride > 1 and 4 <= rows <= 8 and rows * stride <= st["iterations"] < (rows + 1) * stride
    ts = out.ts[:rows]
    assert np.all(np.diff(ts[:, ck.TS.time]) > 0) and np.all(ts[:, ck.TS.running] <= 8)
    assert np.all((ts[:, ck.TS.kv_blocks] >= 0) & (ts[:, ck.TS.kv_blocks] <= 100))


def test_warmup_leaves_it_to_its_first_run():
    """mb.warmup() does not compile the kernel (about 27 s of CPU cold); a
    process's first continuous-batching run compiles the variant it uses
    (or loads it from the cache): the lean one by default, the full one
    with multi-step scheduling."""
    count = "print(len(ck.lean_kernel.signatures), len(ck.continuous_kernel.signatures))\n"
    run = "mb.simulate(mb.ContinuousBatching({}), mb.Poisson(1.0), workload=mb.Workload([10.0], [5.0]), n=20)\n"
    code = ("import mbbatch as mb\n"
            "from mbbatch._kernels import continuous as ck\n"
            "mb.warmup()\n" + count + run.format("") + count + run.format("num_scheduler_steps=4") + count)
    got = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["0", "0", "1", "0", "1", "1"]


def _same_runs(kernels, cfg, inputs, control):
    """Each of ``kernels`` run on a new engine of ``cfg`` and ``inputs`` (the
    ``control`` packs; None: none) to its end: every output, record and
    engine scalar the same as the first's, bit for bit."""
    runs = []
    for fn in kernels:
        eng = ck.start(cfg, inputs, control=control, groups=4, ts_rows=64)
        code = fn(eng.config, eng.control, eng.inputs, ck.ContinuousStreams(np.random.default_rng(0)), eng.out,
                  eng.requests, eng.ws, np.zeros(STOP_SIZE, np.int64))
        assert code == ck.DONE
        runs.append(eng)
    first = runs[0]
    for other in runs[1:]:
        for f in first.out._fields:
            np.testing.assert_array_equal(getattr(first.out, f), getattr(other.out, f), err_msg=f)
        for a, b in zip(first.requests, other.requests):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(first.ws.state_i, other.ws.state_i)
        np.testing.assert_array_equal(first.ws.state_f, other.ws.state_f)


@pytest.mark.parametrize("seed", range(2))
def test_the_lean_kernel_is_the_full_kernel_where_both_apply(seed):
    """Without multi-step scheduling, the prefill's attention, request
    classes or fair sharing, the kernel compiled without them (the lean
    variant, which such runs use) gives every record, statistic, histogram
    and time-series row of the full kernel, bit for bit, over 30 random
    configurations (a controller in a third); a run with any of them
    selects the full kernel."""
    rng = np.random.default_rng(900 + seed)
    for k in range(30):
        (arr, p, o, pred), kw = _config(rng, moe=k % 4 == 0)
        controller = _controller(rng) if k % 3 == 0 else None
        blocks = -1 if np.isinf(kw["kv_tokens"]) else int(kw["kv_tokens"] // kw["block_size"])
        coef = {c: kw[c] for c in COEF}
        cfg = ck.CONFIG.pack(n=len(arr), arrival_kind=ARR_REPLAY, max_num_seqs=kw["max_num_seqs"],
                             max_batched_tokens=kw["max_batched_tokens"], chunked=int(kw["chunked"]), blocks=blocks,
                             block_size=kw["block_size"], admission=ck.ADMISSIONS[kw["admission"]], bins=3, keep=1,
                             controlled=int(controller is not None),
                             memory_on=int(controller is not None and controller.get("memory") is not None),
                             rate=0.0, until=np.inf, **_fields(coef))
        inputs = ck.INPUTS.pack(arrival_times=np.asarray(arr, float), arrival_params=np.ones(1),
                                arrival_ends=np.full(1, np.inf), prompt=p.astype(float), output=o.astype(float),
                                prediction=pred.astype(float), edges=np.asarray(kw["edges"], float),
                                cached=np.empty(0), klass=np.empty(0), class_slo=np.full(1, np.inf),
                                class_tpot=np.full(1, np.inf))
        assert not ck.uses_full(cfg, inputs)
        _same_runs((ck.lean_kernel, ck.continuous_kernel), cfg, inputs, _control(controller))
    steps = ck.CONFIG.pack(**{**ck.CONFIG.unpack(cfg), "scheduler_steps": 2})
    attention = ck.CONFIG.pack(**{**ck.CONFIG.unpack(cfg), "cost_prefill_attention": 1e-9})
    vtc = ck.CONFIG.pack(**{**ck.CONFIG.unpack(cfg), "admission": ck.ADMISSIONS["vtc"]})
    classed = inputs._replace(klass=np.zeros(len(arr)))
    assert ck.uses_full(steps, inputs) and ck.uses_full(attention, inputs) and ck.uses_full(vtc, inputs)
    assert ck.uses_full(cfg, classed)


@pytest.mark.parametrize("order", ["edf", "vtc", "mlfq"])
def test_an_orders_own_kernel_is_the_full_kernel(order):
    """Each order of the full kernel only runs on a kernel of its own
    (:func:`~.continuous.kernel_of`: its code compiled in, the other orders'
    code out), which gives every record, statistic, histogram and
    time-series row of the full kernel, bit for bit, over 12 random
    configurations: three classes with objectives, goodput on half,
    multi-step scheduling on a third, the feedback queue's levels (the
    ``bins``; fair sharing's: a queue per class) and quanta drawn."""
    rng = np.random.default_rng(950 + ck.ADMISSIONS[order])
    for k in range(12):
        (arr, p, o, pred), kw = _config(rng)
        blocks = -1 if np.isinf(kw["kv_tokens"]) else int(kw["kv_tokens"] // kw["block_size"])
        coef = {**{c: kw[c] for c in COEF}, "num_scheduler_steps": int(rng.choice([1, 1, 3])), "goodput": k % 2,
                "quantum": int(rng.integers(1, 6))}
        cfg = ck.CONFIG.pack(n=len(arr), arrival_kind=ARR_REPLAY, max_num_seqs=kw["max_num_seqs"],
                             max_batched_tokens=kw["max_batched_tokens"], chunked=int(kw["chunked"]), blocks=blocks,
                             block_size=kw["block_size"], admission=ck.ADMISSIONS[order],
                             bins=3 if order == "vtc" else int(rng.integers(1, 4)),
                             keep=1, controlled=0, memory_on=0, rate=0.0, until=np.inf, **_fields(coef))
        inputs = ck.INPUTS.pack(arrival_times=np.asarray(arr, float), arrival_params=np.ones(1),
                                arrival_ends=np.full(1, np.inf), prompt=p.astype(float), output=o.astype(float),
                                prediction=pred.astype(float), edges=np.asarray(kw["edges"], float),
                                cached=np.empty(0), klass=rng.integers(0, 3, len(arr)).astype(float),
                                class_slo=np.array([0.5, 2.0, np.inf]), class_tpot=np.array([0.05, np.inf, np.inf]))
        own = ck.kernel_of(cfg, inputs)
        assert own is ck.order_kernels[ck.ADMISSIONS[order]] and own is not ck.continuous_kernel
        _same_runs((own, ck.continuous_kernel), cfg, inputs, None)
    fcfs = ck.CONFIG.pack(**{**ck.CONFIG.unpack(cfg), "admission": ck.ADMISSIONS["fcfs"]})
    assert ck.kernel_of(fcfs, inputs) is ck.continuous_kernel


def test_warmup_refuses_an_unknown_variant():
    with pytest.raises(ValueError, match="no variant.*the variants are full, lean, decode, edf, vtc, mlfq"):
        ck.warmup(("fast",))


@pytest.mark.parametrize("seed", range(2))
def test_a_run_advanced_in_steps_is_the_run_advanced_at_once(seed):
    """advance(engine, ..., until) pauses before an iteration would start at
    or after until and resumes where it stopped: over 30 random
    configurations (a controller half the time, blocks of 3 iterations half
    the time: multi-step scheduling), advanced to random times
    (arrival instants among them), every record, statistic, histogram and
    time-series row equal the run's in one call."""
    rng = np.random.default_rng(300 + seed)
    paused = 0
    for _ in range(30):
        (arr, p, o, pred), kw = _config(rng)
        controller = _controller(rng) if rng.random() < 0.5 else None
        n = len(arr)
        blocks = -1 if np.isinf(kw["kv_tokens"]) else int(kw["kv_tokens"] // kw["block_size"])
        cfg = ck.CONFIG.pack(n=n, arrival_kind=ARR_REPLAY, max_num_seqs=kw["max_num_seqs"],
                             max_batched_tokens=kw["max_batched_tokens"], chunked=int(kw["chunked"]), blocks=blocks,
                             block_size=kw["block_size"], admission=ck.ADMISSIONS[kw["admission"]], bins=3, keep=1,
                             controlled=int(controller is not None),
                             memory_on=int(controller is not None and controller.get("memory") is not None),
                             rate=0.0, until=np.inf,
                             **_fields({**COEF, "num_scheduler_steps": int(rng.choice([1, 3]))}))
        inputs = ck.INPUTS.pack(arrival_times=np.asarray(arr, float), arrival_params=np.ones(1),
                                arrival_ends=np.full(1, np.inf), prompt=p.astype(float), output=o.astype(float),
                                prediction=pred.astype(float), edges=np.asarray(kw["edges"], float),
                                cached=np.empty(0), klass=np.empty(0), class_slo=np.full(1, np.inf),
                                class_tpot=np.full(1, np.inf))
        runs = []
        for steps in (False, True):
            eng = ck.start(cfg, inputs, control=_control(controller), groups=4, ts_rows=64)
            stop = np.zeros(STOP_SIZE, np.int64)
            streams = ck.ContinuousStreams(np.random.default_rng(0))
            if steps:
                span = float(arr[-1]) + 5.0
                ts = np.sort(np.concatenate((rng.uniform(0, span, 8), rng.choice(arr, 4))))
                for until in ts:
                    code = ck.advance(eng, streams, stop, until)
                    paused += code == ck.PAUSED
            assert ck.advance(eng, streams, stop, np.inf) == ck.DONE
            runs.append(eng)
        one, many = runs
        for f in ("ints", "floats", "hist", "hist_ttft", "hist_tbt", "group_latency", "group_count", "ts",
                  "size_hist", "ctl", "bstats"):
            np.testing.assert_array_equal(getattr(one.out, f), getattr(many.out, f), err_msg=f)
        for a, b in zip(one.requests, many.requests):
            np.testing.assert_array_equal(a, b)
    assert paused > 50


# --- the engine's choices (docs/guide/continuous.md, "The engine's choices"): a test each ------------------------

#: iterations of a quarter of a second whatever they do: every time below is exact
QUARTER = dict(step=0.25, prefill_per_token=0.0, per_sequence=0.0, per_context=0.0, per_expert=0.0,
               expert_span=0.0, expert_miss=1.0)


def _blocks_held(p, o):
    """The KV blocks (of 4 tokens) one request of prompt ``p`` and output ``o`` holds at each of its iterations."""
    out, _, _ = _kernel(np.zeros(1), np.array([p]), np.array([o]), np.array([o]), max_num_seqs=4,
                        max_batched_tokens=64, chunked=True, kv_tokens=400.0, block_size=4, admission="fcfs",
                        edges=[], ts_rows=64, **QUARTER)
    st = ck.STATS.unpack((out.ints, out.floats))
    return out.ts[:st["ts_rows"], ck.TS.kv_blocks].tolist()


def test_an_admission_takes_the_blocks_of_its_prompt_and_its_first_token():
    """A prompt of 4 tokens fills one block of 4, yet its admission takes 2:
    the first token's block too (vLLM would take it at the next step)."""
    assert _blocks_held(4, 4) == [2.0, 2.0, 2.0, 2.0]


def test_a_decode_takes_its_next_block_one_token_early():
    """Prompt 3, output 6, blocks of 4: at its k-th iteration the sequence
    holds the blocks of 3 + k tokens, the token that iteration generates
    counted (vLLM's blocks of the tokens with KV, 3 + k - 1, would be
    [1, 1, 2, 2, 2, 2])."""
    assert _blocks_held(3, 6) == [1.0, 2.0, 2.0, 2.0, 2.0, 3.0]


def test_arrivals_at_an_iterations_end_join_the_next():
    """Iterations of 0.25 s from 0: requests arriving during the first
    (0.1) or exactly at its end (0.25) are admitted at 0.25; one arriving
    just after that end waits for the next, 0.5."""
    ones = np.ones(4, np.int64)
    _, req, _ = _kernel(np.array([0.0, 0.1, 0.25, 0.2500001]), ones, 2 * ones, 2 * ones, max_num_seqs=8,
                        max_batched_tokens=64, chunked=True, kv_tokens=np.inf, block_size=4, admission="fcfs",
                        edges=[], **QUARTER)
    assert req["admitted"].tolist() == [0.0, 0.25, 0.25, 0.5]


def test_the_controllers_batch_is_the_decodes_and_prefill_chunks_and_n_decode_the_running_after_completions():
    """Six requests at 0 (prompt 2; output 1, then 5), a controller of
    B_min 1, B_max 8 (EMA weight 0.2): the first iteration prefills 4
    prompts (the cap: the warm-up midpoint 4) and request 0 completes in it,
    so Algorithm 7 sees a batch of 4 and N_decode 3; the second decodes 3
    and admits one more: a batch of 4 (3 decodes, 1 chunk), N_decode 4."""
    n = 6
    cfg = ck.CONFIG.pack(n=n, arrival_kind=ARR_REPLAY, max_num_seqs=8, max_batched_tokens=64, chunked=1, blocks=-1,
                         block_size=4, admission=ck.ADMISSIONS["fcfs"], bins=1, keep=1, controlled=1, memory_on=0,
                         rate=0.0, until=np.inf, **_fields(QUARTER))
    inputs = ck.INPUTS.pack(arrival_times=np.zeros(n), arrival_params=np.ones(1), arrival_ends=np.full(1, np.inf),
                            prompt=np.full(n, 2.0), output=np.array([1.0, 5, 5, 5, 5, 5]),
                            prediction=np.ones(n), edges=np.empty(0), cached=np.empty(0), klass=np.empty(0),
                            class_slo=np.full(1, np.inf), class_tpot=np.full(1, np.inf))
    eng = ck.start(cfg, inputs, control=_control(dict(sla=(0.02, 0.0, 1, 8, 4, 2, False), ema=kc.DEFAULT_EMA)))
    streams, stop = ck.ContinuousStreams(np.random.default_rng(0)), np.zeros(STOP_SIZE, np.int64)
    CT = kc.C
    assert ck.advance(eng, streams, stop, 0.1) == ck.PAUSED        # after the first iteration
    ctl = eng.out.ctl
    assert (ctl[CT.updates], ctl[CT.b_avg], ctl[CT.n_decode]) == (1.0, pytest.approx(0.2 * 4), 3.0)
    assert np.count_nonzero(eng.requests[1][ck.RQ.admitted] == 0.0) == 4
    assert ck.advance(eng, streams, stop, 0.3) == ck.PAUSED        # after the second
    assert (ctl[CT.updates], ctl[CT.b_avg], ctl[CT.n_decode]) == (2.0, pytest.approx(0.2 * 4 + 0.8 * 0.2 * 4), 4.0)


def test_a_request_with_a_cached_prompt_preempted_while_prefilling_frees_the_blocks_it_took():
    """Request 1 brings the KV cache of 30 of its 40 prompt tokens (a
    cluster's call on the engine holding its program's context) and
    prefills the other 10, two an iteration beside request 0's decode; with
    45 blocks of one token, request 0's next block preempts it while it
    prefills: it must give back the 41 blocks it took, as the reference
    engine does.  The kernel gave back 11 (the blocks of the tokens it had
    to prefill, not of the prompt it holds), leaked the rest and never
    served it, ending DONE with it waiting: a cluster's continuous engines
    with KV reuse lost 8,834 of 20,000 requests that way."""
    arr, p, o = np.array([0.0, 0.3]), np.array([1, 40]), np.array([12, 3])
    kw = dict(max_num_seqs=4, max_batched_tokens=3, chunked=True, kv_tokens=45.0, block_size=1, admission="fcfs",
              edges=[], **QUARTER)
    want = ref.simulate(arr, p, o, o, cached=np.array([0, 30]), **kw)
    assert want["preempted"].tolist() == [0, 1]
    _same_run(*_kernel(arr, p, o, o, cached=np.array([0, 30]), **kw), want, kw)


def test_aging_bounds_how_long_a_request_is_overtaken():
    """Shortest predicted first with aging alpha (Fu et al., 2024): a request is admitted no later than
    every request arriving more than its prediction / alpha after it, here on an overloaded engine (4
    sequences, arrivals twice its service rate) with alpha = 20 tokens/s; plain shortest first (alpha = 0)
    breaks that bound on the same requests: long requests are overtaken by shorter ones arriving long after
    them.  Aging also admits everything the plain order does, in another order."""
    rng = np.random.default_rng(5)
    n = 400
    arr = np.cumsum(rng.exponential(0.05, n))
    p, o = rng.integers(1, 40, n), rng.integers(1, 60, n)
    pred = o.astype(float)
    kw = dict(max_num_seqs=4, max_batched_tokens=64, chunked=True, kv_tokens=np.inf, block_size=16,
              admission="spf", edges=np.array([10.0, 20.0]), **COEF)
    alpha = 20.0
    late = arr[None, :] > arr[:, None] + pred[:, None] / alpha      # [i, j]: j arrives over pred_i / alpha after i
    overtaken = {}
    for aging in (alpha, 0.0):
        out, req, code = _kernel(arr, p, o, pred, aging=aging, **kw)
        assert code == ck.DONE and ck.STATS.unpack((out.ints, out.floats))["completed"] == n
        adm = req["admitted"]
        overtaken[aging] = int((late & (adm[None, :] < adm[:, None])).sum())
    assert overtaken[alpha] == 0 and overtaken[0.0] > 100, overtaken
