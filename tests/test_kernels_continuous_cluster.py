"""A cluster of continuous-batching engines behind a router, against a
plain-Python cluster: the routers' rules written again from Autellix's
Algorithm 2 (Luo et al., 2025, arXiv:2502.13965) and the independent
plain-Python engine (tests/reference_continuous.py) run on each engine's
requests, request by request."""

from __future__ import annotations

import numpy as np
import pytest

from mbbatch._kernels import continuous as ck
from mbbatch._kernels import continuous_cluster as cc
from mbbatch._kernels import disaggregated as kd
from mbbatch._kernels.common import ARR_REPLAY, STOP_SIZE
from mbbatch._kernels.routing import ROUTERS, CacheRouting, Router

from . import reference_continuous as ref
from .test_kernels_continuous import COEF, _classed, _config, _fields, _kernel, _prefixed

#: the prefix caching keywords of a configuration (:func:`.test_kernels_continuous._prefixed`)
_PREFIX = ("chain", "shared", "grows")


def _prefixes(kw):
    """A configuration's prefix caching (None: none) and its other keywords."""
    if not kw.get("prefix_caching"):
        return None, kw
    return {k: np.asarray(kw[k], float) for k in _PREFIX}, {
        k: v for k, v in kw.items() if k not in _PREFIX and k != "prefix_caching"}


def _cluster(arr, p, o, pred, engines, router, *, threshold=20, programs=None, kv=True, cache=(0.3, 64, 1.5),
             closed=None, events=None, klass=None, **kw):
    """The kernel's cluster (``closed``: closed-loop programs, as
    :func:`_reference_cluster`'s, for ``len(arr)`` requests; ``events``:
    engine events; ``klass``: the requests' classes, of ``kw["class_slo"]``)."""
    prefixes, kw = _prefixes(kw)
    n = len(arr)
    blocks = -1 if np.isinf(kw["kv_tokens"]) else int(kw["kv_tokens"] // kw["block_size"])
    cfg = ck.CONFIG.pack(n=n, arrival_kind=ARR_REPLAY, max_num_seqs=kw["max_num_seqs"],
                         max_batched_tokens=kw["max_batched_tokens"], chunked=int(kw["chunked"]), blocks=blocks,
                         block_size=kw["block_size"], admission=ck.ADMISSIONS[kw["admission"]],
                         bins=len(kw["edges"]) + 1, keep=1, controlled=0, memory_on=0, rate=0.0, until=np.inf,
                         **{**_fields(COEF), **({} if closed is None else {"request_overhead": closed["delay"]})})
    calls = programs is not None or closed is not None
    rt = Router(ROUTERS[router], threshold, calls, bool(kv and calls))
    if closed is not None:
        return kd.run_cluster_closed(cfg, {**closed, "prompt": _contexts(closed)}, np.asarray(kw["edges"], float),
                                     rt, engines, ck.ContinuousStreams(np.random.default_rng(0)),
                                     np.zeros(STOP_SIZE, np.int64), groups=4, ts_rows=8,
                                     cache_routing=CacheRouting(*cache), events=events)
    progs = None if programs is None else (programs, int(programs[0].max()) + 1)
    return cc.run(cfg, np.asarray(arr, float), p.astype(float), o.astype(float), pred.astype(float),
                  np.asarray(kw["edges"], float), rt, engines, ck.ContinuousStreams(np.random.default_rng(0)),
                  np.zeros(STOP_SIZE, np.int64), programs=progs, groups=4, ts_rows=8, prefixes=prefixes,
                  cache_routing=CacheRouting(*cache), events=events, klass=klass, class_slo=kw.get("class_slo"))


def _contexts(closed):
    """A closed loop's prompts by call id: each call's program's context
    (every earlier call's new tokens and output) and its new tokens."""
    new, out = closed["new"], closed["output"]
    C = new.size // closed["start"].size
    prompt = np.empty(new.size)
    for k in range(new.size):
        row = k - k % C
        prompt[k] = new[row:k + 1].sum() + out[row:k].sum()
    return prompt


class _Calls:
    """A plain-Python closed loop's calls (``closed``: their programs'
    ``start`` and by call id ``gap``, ``new``, ``output``, ``prediction``,
    and ``delay``), made into ``n`` requests as they arrive: their arrays
    (``arr``, ``p``, ``o``, ``pred``), programs and call ids."""

    def __init__(self, closed, n):
        self.start, self.gap, self.new, self.out, self.pred, self.delay = (
            closed[k] for k in ("start", "gap", "new", "output", "prediction", "delay"))
        self.prompt = _contexts(closed)
        self.C = self.gap.size // self.start.size
        self.arr, self.p, self.o, self.pred_r = np.full(n, np.nan), np.zeros(n), np.zeros(n), np.zeros(n)
        self.programs = (np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int8))
        self.call = np.full(n, -1, np.int64)
        self.pending = {0: self.start[0]}   # (programs' first calls that may arrive: id -> time)
        self.followed = set()               # (requests whose next call arrived, or who have none)

    def next(self, j, done):
        """The next call to arrive, the earliest that can, ``done(r)`` the
        completion of request r (< j) as it stands: ``(time, call id, the
        request it follows; -1, a program's first)``."""
        C = self.C
        cands = [(t, k, -1) for k, t in self.pending.items()]
        for r in range(j):
            k = int(self.call[r]) + 1
            if r in self.followed or k % C == 0:
                continue
            cands.append((done(r) + self.delay + self.gap[k], k, r))
        return min(cands)

    def take(self, j, nxt):
        """Call ``nxt`` (:meth:`next`'s) arrives as request j."""
        t, k, r = nxt
        C = self.C
        if r < 0:
            del self.pending[k]
            if k % C == 0 and k // C + 1 < self.start.size:
                self.pending[k + C] = self.start[k // C + 1]
        else:
            self.followed.add(r)
        self.arr[j], self.p[j], self.o[j], self.pred_r[j], self.call[j] = (t, self.prompt[k], self.out[k],
                                                                           self.pred[k], k)
        self.programs[0][j], self.programs[1][j], self.programs[2][j] = k // C, self.new[k], int(k % C == C - 1)

    def arrays(self):
        """The requests' ``(arr, p, o, pred, programs, call)``."""
        return self.arr, self.p, self.o, self.pred_r, self.programs, self.call


def _reference_cluster(arr, p, o, pred, engines, router, *, threshold=20, programs=None, kv=True,
                       cache=(0.3, 64, 1.5), closed=None, brought=None, pull=None, release=None, **kw):
    """The plain-Python cluster: at each arrival, an engine's active requests
    are those routed to it and not completed by then in the reference
    engine's run of its requests so far (a completion at or before the
    arrival cannot depend on it: it joins at the next iteration boundary);
    the router's rule; with programs, the program table (a large call to
    its program's engine, assigned least used on first sight, forgotten at
    the program's last call) and the engine holding each program's context
    (a call there brings the KV cache of its prompt but its new tokens);
    ``pull``: each request's pull of the KV cache it brings (a decode
    pool's: the reference engine's ``pull``); ``release``: the instant each
    request's engine frees its blocks if it completes before (a prefill
    pool's: the reference engine's ``release``).
    With prefix caching each engine caches its requests' chains; the
    cache-aware router (SGLang's, on the engines' caches) reads engine e's
    cache of the request's chain from the reference engine stopped before
    its first iteration starting at or after the arrival: while the most
    and the fewest active requests differ by more than ``cache[1]`` and
    the most are more than ``cache[2]`` times the fewest, least used; else
    the engine caching the most of the request's prefix blocks (ties: the
    fewer active, then the lower id) if they are more than ``cache[0]`` of
    its prompt, else least used.

    ``closed``: closed-loop programs (their ``start`` times and by call id
    their think times ``gap``, ``new`` tokens, ``output`` and
    ``prediction``, and the time ``delay`` outside the engine), ``len(arr)``
    of their calls the requests: the next request is the first (by time,
    then id) of the calls that can arrive, each program's first call at its
    start once the program before it has started, and each call after
    another ``delay + gap`` after that one's completion in its engine's run
    of its requests so far; the earliest such arrival is final (a
    completion at or before it cannot depend on a later arrival, and a
    later completion only gives a later arrival).  The requests' arrays
    (``arr``, ``p``, ... and the programs') are filled as they arrive;
    returned as a fifth item, with each request's call id."""
    prefixes, kw = _prefixes(kw)
    if closed is not None:
        calls = _Calls(closed, len(arr))
        arr, p, o, pred, programs, _ = calls.arrays()
    pre = {} if prefixes is None else {"prefix_caching": True, "grows": prefixes["grows"]}
    mine = [[] for _ in range(engines)]
    # (the KV cache each request brings: ``brought``, a decode pool's whole prompts; else a program's context)
    cached = np.zeros(len(arr)) if brought is None else np.array(brought, float)
    where = np.empty(len(arr), np.int64)
    table, holder, rr = {}, {}, 0
    runs = {}

    def run(e, until=None):
        key = (e, len(mine[e]), until)
        if key not in runs:         # (an engine's run changes only with its requests)
            idx = mine[e]
            if prefixes is not None:
                pre.update(chain=prefixes["chain"][idx].astype(np.int64), shared=prefixes["shared"][idx].astype(
                    np.int64))
            runs[key] = ref.simulate(arr[idx], p[idx], o[idx], pred[idx], cached=None if pre else cached[idx],
                                     until=until, pull=None if pull is None else np.asarray(pull)[idx],
                                     release=None if release is None else np.asarray(release)[idx], **pre, **kw)
        return runs[key]

    def cache_aware(j, active, least):
        t, bs = arr[j], kw["block_size"]
        if max(active) - min(active) > cache[1] and max(active) > cache[2] * min(active):
            return least
        c = int(prefixes["chain"][j])
        k = min(int(prefixes["shared"][j]), int(p[j]) - 1) // bs if c >= 0 else 0
        held = [min(run(e, t)["cached_blocks"][c], k) if mine[e] and k > 0 else 0 for e in range(engines)]
        some = [e for e in range(engines) if held[e] > 0]
        if not some:
            return least
        best = min(some, key=lambda e: (-held[e], active[e], e))
        return best if held[best] * bs > cache[0] * p[j] else least

    spot = {}       # (request -> its number on its engine)
    for j in range(len(arr)):
        if closed is not None:
            calls.take(j, calls.next(j, lambda r: run(where[r])["completion"][spot[r]]))
        t = arr[j]
        active = []
        for e in range(engines):
            done = run(e)["completion"] <= t if mine[e] else np.zeros(0, bool)
            active.append(len(mine[e]) - int(done.sum()))
        least = int(np.argmin(active))          # (the first of the fewest)
        if router == "round_robin":
            e, rr = rr, (rr + 1) % engines
        elif router == "autellix" and programs is not None and p[j] > threshold:
            pid = programs[0][j]
            e = table.setdefault(pid, least)
        elif router == "cache_aware":
            e = cache_aware(j, active, least)
        else:
            e = least
        if programs is not None:
            pid, new, last = programs[0][j], programs[1][j], programs[2][j]
            if kv and new < p[j] and holder.get(pid) == e:
                cached[j] = p[j] - new
            holder[pid] = e
            if last:
                table.pop(pid, None)
        spot[j] = len(mine[e])
        mine[e].append(j)
        where[j] = e
    got = where, [run(e) if mine[e] else None for e in range(engines)], mine, cached
    return got if closed is None else got + (calls.arrays(),)


def _programs(rng, p):
    """Random programs of the requests: each request a call of one of a few
    programs, its new tokens at most its prompt (a first call: all of it),
    the last call of each program flagged."""
    n = len(p)
    pid = rng.integers(0, max(1, n // 3), n)
    first = np.ones(n, bool)
    seen = set()
    for j in range(n):
        first[j] = pid[j] not in seen
        seen.add(pid[j])
    new = np.where(first, p, rng.integers(1, p + 1)).astype(float)
    last = np.zeros(n, np.int8)
    for q in set(pid.tolist()):
        last[np.flatnonzero(pid == q)[-1]] = 1
    return pid.astype(np.int64), new, last


def _engines_equal(runs, want, mine, local, kw) -> list:
    """Each engine's run equals the plain-Python cluster's (``want``, its
    requests ``mine``): its completions, and each request's number there,
    admission, first token, completion and preemptions.  Returns the
    ``(engine, run)`` of the engines given requests."""
    given = []
    for e, (run, w) in enumerate(zip(runs, want)):
        out, req, _ = run
        assert out.ints[ck.S.completed] == len(mine[e])
        if w is None:
            continue
        np.testing.assert_array_equal(local[mine[e]], np.arange(len(mine[e])))
        for col in ("admitted", "first_token", "completion"):
            np.testing.assert_array_equal(req[col], w[col], err_msg=f"{col} engine {e} {kw}")
        np.testing.assert_array_equal(req["preemptions"], w["preempted"])
        given.append((e, run))
    return given


def test_one_engine_is_the_engine_request_by_request():
    """A cluster of one engine is the engine alone, bit for bit: every
    record, statistic, histogram, batch-means group and time-series row,
    over 40 random configurations (every admission order, chunked and not,
    memory that binds and not, equal arrival times)."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        (arr, p, o, pred), kw = _config(rng)
        out, req, code = _kernel(arr, p, o, pred, **kw)
        runs, where, local, routed, code2 = _cluster(arr, p, o, pred, 1, "least_used", **kw)
        (out2, req2, _), = runs
        assert code == code2 == ck.DONE and routed["routes"] == len(arr)
        np.testing.assert_array_equal(where, 0)
        np.testing.assert_array_equal(local, np.arange(len(arr)))
        for f in ("ints", "floats", "hist", "hist_ttft", "hist_tbt", "group_latency", "group_count", "ts",
                  "size_hist"):
            np.testing.assert_array_equal(getattr(out, f), getattr(out2, f), err_msg=f)
        for k in req:
            np.testing.assert_array_equal(req[k], req2[k], err_msg=k)


def test_the_lean_driver_is_the_full_one_bit_for_bit(monkeypatch):
    """Over 20 random configurations of 2 to 4 engines, the cluster whose
    hot resumes are the lean engine's (:data:`cc.cluster_kernel_lean`,
    where :func:`cc.lean_engines` says none of the full kernel's features
    is needed) equals the full driver's: every record, statistic,
    histogram, group and time-series row, each request's engine."""
    rng = np.random.default_rng(21)
    lean = 0
    for _ in range(20):
        (arr, p, o, pred), kw = _config(rng)
        engines = int(rng.integers(2, 5))
        router = ["round_robin", "least_used"][int(rng.integers(2))]
        got = _cluster(arr, p, o, pred, engines, router, **kw)
        with monkeypatch.context() as m:
            m.setattr(cc, "cluster_kernel_lean", cc.cluster_kernel)
            want = _cluster(arr, p, o, pred, engines, router, **kw)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[2], want[2])
        assert got[3] == want[3] and got[4] == want[4] == ck.DONE
        for (out, req, _), (out2, req2, _) in zip(got[0], want[0]):
            for f in ("ints", "floats", "hist", "hist_ttft", "hist_tbt", "group_latency", "group_count", "ts",
                      "size_hist"):
                np.testing.assert_array_equal(getattr(out, f), getattr(out2, f), err_msg=f)
            for k in req:
                np.testing.assert_array_equal(req[k], req2[k], err_msg=k)
        lean += kw["admission"] in ("fcfs", "spf", "multibin")
    assert lean >= 5        # (the lean driver ran)


def test_the_lean_driver_only_where_no_feature_of_the_full_kernel_is_needed():
    cfg = ck.CONFIG.pack(n=4, arrival_kind=ARR_REPLAY, max_num_seqs=2, max_batched_tokens=64, chunked=1, blocks=8,
                         block_size=4, admission=ck.ADMISSIONS["fcfs"], bins=1, keep=1, controlled=0, memory_on=0,
                         rate=0.0, until=np.inf, **_fields(COEF))
    one = ck.INPUTS.pack(arrival_times=np.zeros(4), arrival_params=np.zeros(1), arrival_ends=np.full(1, np.inf),
                         prompt=np.ones(4), output=np.ones(4), prediction=np.ones(4), edges=np.empty(0),
                         cached=np.empty(0), klass=np.empty(0), class_slo=np.full(1, np.inf),
                         class_tpot=np.full(1, np.inf))
    none = (np.empty(0), np.empty(0, np.int64), np.empty(0, np.int8))
    assert cc.lean_engines(cfg, one, none)
    assert not cc.lean_engines(cfg, one, (np.ones(1), np.zeros(1, np.int64), np.ones(1, np.int8)))
    assert not cc.lean_engines(cfg, one._replace(pull=np.ones(4)), none)
    assert not cc.lean_engines(cfg, one._replace(klass=np.zeros(4)), none)
    edf = (cfg[0].copy(), cfg[1])
    edf[0][ck.C.admission] = ck.ADMISSIONS["edf"]
    assert not cc.lean_engines(edf, one, none)


@pytest.mark.parametrize("router", ["round_robin", "least_used", "autellix"])
def test_the_cluster_is_the_plain_python_cluster_request_by_request(router):
    """Over 12 random configurations per router (2 to 4 engines; Autellix
    with programs and KV reuse half the time): each request's engine, and on
    each engine each request's admission, first token, completion and
    preemptions, equal the plain-Python cluster's."""
    rng = np.random.default_rng(["round_robin", "least_used", "autellix"].index(router))
    moved = 0
    for _ in range(12):
        (arr, p, o, pred), kw = _config(rng)
        engines = int(rng.integers(2, 5))
        programs = _programs(rng, p) if router == "autellix" and rng.random() < 0.5 else None
        if router == "autellix" and programs is None and rng.random() < 0.5:
            programs = _programs(rng, p)
        where_ref, want, mine, cached = _reference_cluster(arr, p, o, pred, engines, router, programs=programs, **kw)
        runs, where, local, routed, code = _cluster(arr, p, o, pred, engines, router, programs=programs, **kw)
        assert code == ck.DONE
        np.testing.assert_array_equal(where, where_ref, err_msg=f"{router} {kw}")
        for e, (out, _, _) in _engines_equal(runs, want, mine, local, kw):
            st = ck.STATS.unpack((out.ints, out.floats))
            assert st["prefill_tokens"] == int((p[mine[e]] - cached[mine[e]]).sum()) + st["recomputed"]
        if programs is not None:
            assert routed["kv_hits"] == int((cached > 0).sum())
            assert routed["kv_recomputed"] == pytest.approx(float((p - programs[1] - cached).sum()))
        moved += len(set(where.tolist())) > 1
    assert moved >= 10          # (the router spread the requests)


@pytest.mark.parametrize("router", ["least_used", "cache_aware"])
def test_prefix_caching_engines_are_the_plain_python_cluster(router):
    """Prefix caching on a cluster's engines (random chains, some growing,
    memory that evicts: :func:`.test_kernels_continuous._prefixed`) behind
    least-used routing or the cache-aware router (random thresholds,
    balance bounds that bind and not), over 12 random configurations: each
    request's engine, and on each engine each request's admission, first
    token, completion and preemptions and the engine's hits, lookups and
    evictions, equal the plain-Python cluster's of plain-Python engines.
    The cache-aware router sends some requests elsewhere than least used,
    and some engines hit."""
    rng = np.random.default_rng(40 + ["least_used", "cache_aware"].index(router))
    hits = differs = 0
    for _ in range(12):
        (arr, p, o, pred), kw = _config(rng)
        p = p + rng.integers(0, 60) * (rng.random(p.size) < 0.7)
        kw = _prefixed(rng, p, kw)
        kw["admission"] = str(rng.choice(["fcfs", "spf", "multibin"]))
        if not kw["chunked"]:
            kw["max_batched_tokens"] = int(max(kw["max_batched_tokens"], (p + o).max()))
        engines = int(rng.integers(2, 5))
        cache = (float(rng.choice([0.0, 0.3, 0.9])), int(rng.choice([0, 2, 64])), float(rng.choice([1.0, 1.5])))
        where_ref, want, mine, _ = _reference_cluster(arr, p, o, pred, engines, router, cache=cache, **kw)
        runs, where, local, routed, code = _cluster(arr, p, o, pred, engines, router, cache=cache, **kw)
        assert code == ck.DONE
        np.testing.assert_array_equal(where, where_ref, err_msg=f"{router} {cache} {kw}")
        for e, ((out, req, _), w) in enumerate(zip(runs, want)):
            if w is None:
                continue
            for col in ("admitted", "first_token", "completion"):
                np.testing.assert_array_equal(req[col], w[col], err_msg=f"{col} engine {e} {kw}")
            np.testing.assert_array_equal(req["preemptions"], w["preempted"])
            st = ck.STATS.unpack((out.ints, out.floats))
            assert (st["prefix_hits"], st["prefix_queries"], st["evictions"]) == (
                w["prefix_hits"], w["prefix_queries"], w["evictions"])
            hits += st["prefix_hits"]
        if router == "cache_aware":
            least, _, _, _ = _reference_cluster(arr, p, o, pred, engines, "least_used", **kw)
            differs += int((least != where).sum())
    assert hits > 0
    assert router != "cache_aware" or differs > 0


def _closed_loop(rng, kw):
    """Random closed-loop programs (1 to 8 programs of 1 to 4 calls, starts
    a Poisson process or all at 0, think times exponential or 0, a time
    outside the engine or none), the requests some or all of their calls,
    and the configuration ``kw`` with memory and budgets that fit their
    contexts."""
    P, C = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    saturated = rng.random() < 0.2
    start = np.zeros(P) if saturated else np.sort(rng.exponential(rng.choice([0.05, 0.5]), P).cumsum())
    think = 0.0 if saturated or rng.random() < 0.2 else float(rng.choice([0.01, 0.2]))
    gap = rng.exponential(think, P * C) if think > 0 else np.zeros(P * C)
    out = rng.integers(1, 20, P * C).astype(float)
    closed = dict(start=start, gap=gap, new=rng.integers(1, 25, P * C).astype(float), output=out,
                  prediction=out + rng.integers(-3, 4, P * C) * (rng.random() < 0.5),
                  delay=float(rng.choice([0.0, 0.01])))
    longest = int((_contexts(closed) + out).max())
    bs = kw["block_size"]
    if np.isfinite(kw["kv_tokens"]):
        kw["kv_tokens"] = float(bs * -(-longest * int(rng.choice([1, 3, 10])) // bs))
    if not kw["chunked"]:
        kw["max_batched_tokens"] = max(kw["max_batched_tokens"], longest)
    return closed, int(rng.integers(1, P * C + 1)), kw


@pytest.mark.parametrize("router", ["round_robin", "least_used", "autellix"])
def test_closed_loop_programs_are_the_plain_python_cluster(router):
    """Closed-loop programs (:func:`_closed_loop`) on 1 to 3 engines, over
    12 random configurations per router (Autellix with KV reuse half the
    time): the calls that arrive, in their order, with their arrival times
    (each after the completion of the call before it), and each request's
    engine and on each engine its admission, first token, completion and
    preemptions equal the plain-Python cluster's, whose arrivals come from
    its engines' runs."""
    rng = np.random.default_rng(70 + ["round_robin", "least_used", "autellix"].index(router))
    later = 0
    for _ in range(12):
        _, kw = _config(rng)
        closed, n, kw = _closed_loop(rng, kw)
        engines = int(rng.integers(1, 4))
        kv = bool(rng.random() < 0.5)
        slot = np.zeros(n)
        where_ref, want, mine, cached, (arr, p, o, pred, programs, call) = _reference_cluster(
            slot, slot, slot, slot, engines, router, closed=closed, kv=kv, **kw)
        runs, where, local, routed, code, got = _cluster(slot, slot, slot, slot, engines, router, closed=closed,
                                                         kv=kv, **kw)
        assert code == ck.DONE, kw
        np.testing.assert_array_equal(got["call"], call, err_msg=f"{kw} {closed}")
        np.testing.assert_array_equal(got["arrival_times"], arr)
        np.testing.assert_array_equal(got["program"], programs[0])
        np.testing.assert_array_equal(got["new_tokens"], programs[1])
        np.testing.assert_array_equal(got["session_end"], programs[2])
        np.testing.assert_array_equal(where, where_ref, err_msg=f"{router} {kw}")
        _engines_equal(runs, want, mine, local, kw)
        if router == "autellix":
            assert routed["kv_hits"] == int((cached > 0).sum())
        # (a follow-up call arrives after its predecessor completes: the loop is closed)
        C = closed["gap"].size // closed["start"].size
        for j in range(n):
            k = call[j]
            if k % C:
                before = int(np.flatnonzero(call == k - 1)[0])
                e = where[before]
                done = runs[e][1]["completion"][local[before]]
                assert arr[j] == done + closed["delay"] + closed["gap"][k]
                later += 1
    assert later > 0


def test_progress_and_stop():
    """The driver reports the requests routed and stops when asked."""
    rng = np.random.default_rng(5)
    (arr, p, o, pred), kw = _config(rng)
    blocks = -1 if np.isinf(kw["kv_tokens"]) else int(kw["kv_tokens"] // kw["block_size"])
    cfg = ck.CONFIG.pack(n=len(arr), arrival_kind=ARR_REPLAY, max_num_seqs=kw["max_num_seqs"],
                         max_batched_tokens=kw["max_batched_tokens"], chunked=int(kw["chunked"]), blocks=blocks,
                         block_size=kw["block_size"], admission=0, bins=1, keep=0, controlled=0, memory_on=0,
                         rate=0.0, until=np.inf, **_fields(COEF))
    rt = Router(ROUTERS["least_used"], 20, False, False)
    streams = ck.ContinuousStreams(np.random.default_rng(0))
    stop = np.zeros(STOP_SIZE, np.int64)
    *_, code = cc.run(cfg, arr, p.astype(float), o.astype(float), pred.astype(float), np.empty(0), rt, 2, streams,
                      stop)
    assert code == ck.DONE and stop[1] == len(arr)
    stop = np.array([1, 0], np.int64)
    *_, code = cc.run(cfg, arr, p.astype(float), o.astype(float), pred.astype(float), np.empty(0), rt, 2, streams,
                      stop)
    assert code == ck.STOPPED


def _events(rng, arr, engines):
    """Random engine events over the arrivals' span: one to three, each an
    engine leaving (one at least stays) or, once left, joining again;
    ``(time, engine, add)`` arrays in time order."""
    span = float(arr[-1]) if arr.size else 1.0
    times = np.sort(rng.uniform(0.0, span * 1.1 + 0.01, int(rng.integers(1, 4))))
    if rng.random() < 0.3 and arr.size:
        times[0] = arr[int(rng.integers(0, arr.size))]        # (at an arrival's instant: the event first)
        times.sort()
    on = set(range(engines))
    ev = []
    for t in times:
        off = sorted(set(range(engines)) - on)
        if off and rng.random() < 0.5:
            e = int(rng.choice(off))
            on.add(e)
            ev.append((t, e, 1))
        elif len(on) > 1:
            e = int(rng.choice(sorted(on)))
            on.discard(e)
            ev.append((t, e, 0))
    return (np.array([x[0] for x in ev], float), np.array([x[1] for x in ev], np.int64),
            np.array([x[2] for x in ev], np.int8))


def _reference_events(arr, p, o, pred, engines, router, events, *, threshold=20, programs=None, kv=True,
                      closed=None, **kw):
    """The plain-Python cluster with engine events (no prefix caching): at
    each arrival, an engine's active requests are those routed
    to it, not handed back and not completed by then in the reference
    engine's run of its requests so far; the router's rule over the engines
    in the cluster (round robin skipping those out).  An event at an
    arrival's instant comes first.  An engine leaving at t is out of the
    router's choice, the program table forgets it, and its run (leaving at
    t: :func:`.reference_continuous.simulate`'s ``leave``) hands back its
    waiting requests, which are routed again at t in that order (the rule,
    on the active requests at t, each counted as it goes), each joining its
    new engine at t (``join``) and keeping its arrival; with programs a
    call routed again prefills what its new engine's context gives it.
    ``closed``: closed-loop programs, as :func:`_reference_cluster`'s (the
    next call to arrive the earliest that can, from its engines' runs so
    far; an event at or before it first, then the calls again).
    Returns each request's engine, each engine's run, its requests (slot by
    slot) and which it kept, every request's KV cache brought, the requests
    routed again and, closed, the requests' arrays and call ids."""
    n = len(arr)
    klass = kw.pop("klass", None)
    if closed is not None:
        calls = _Calls(closed, n)
        arr, p, o, pred, programs, _ = calls.arrays()
        spot = {}
    cached = np.zeros(n)
    mine = [[] for _ in range(engines)]
    joins = [[] for _ in range(engines)]       # (when each of an engine's requests reached it)
    leaves = [[] for _ in range(engines)]
    gone = [set() for _ in range(engines)]
    where = np.empty(n, np.int64)
    on = [True] * engines
    table, holder, rr = {}, {}, [0]
    moved = 0

    def run(e):
        idx = mine[e]
        return ref.simulate(arr[idx], p[idx], o[idx], pred[idx], cached=cached[idx], join=joins[e],
                            leave=leaves[e], klass=None if klass is None else klass[idx], **kw)

    def active(t):
        out = []
        for e in range(engines):
            done = int((run(e)["completion"] <= t).sum()) if mine[e] else 0
            out.append(len(mine[e]) - len(gone[e]) - done)
        return out

    def pick(j, act):
        least = min((e for e in range(engines) if on[e]), key=lambda e: (act[e], e))
        if router == "round_robin":
            e = rr[0]
            while not on[e]:
                e = (e + 1) % engines
            rr[0] = (e + 1) % engines
            return e
        if router == "autellix" and programs is not None and p[j] > threshold:
            pid = programs[0][j]
            e = table.get(pid, -1)
            if e < 0:
                e = table[pid] = least
            return e
        return least

    def place(j, e, t):
        was = p[j] - cached[j]
        if programs is not None:
            pid, new, last = programs[0][j], programs[1][j], programs[2][j]
            cached[j] = p[j] - new if kv and new < p[j] and holder.get(pid) == e else 0.0
            holder[pid] = e
            if last:
                table.pop(pid, None)
        if closed is not None:
            spot[j] = len(mine[e])
        mine[e].append(j)
        joins[e].append(t)
        where[j] = e
        return was

    ev = 0
    times, engine, add = events
    for j in range(n + 1):
        while True:
            if closed is not None and j < n:
                nxt = calls.next(j, lambda r: run(where[r])["completion"][spot[r]])
                t_next = nxt[0]
            else:
                t_next = arr[j] if j < n else np.inf
            if not (ev < times.size and times[ev] <= t_next):
                break
            t, e = float(times[ev]), int(engine[ev])
            if add[ev]:
                on[e] = True
            else:
                on[e] = False
                for d in (table, holder):
                    for pid in [k for k, v in d.items() if v == e]:
                        del d[pid]
                leaves[e].append(t)
                slots = run(e)["handed"][-1] if mine[e] else []
                back = [mine[e][k] for k in slots]
                gone[e].update(slots)
                act = active(t)
                for h in back:
                    e2 = pick(h, act)
                    place(h, e2, t)
                    act[e2] += 1
                    moved += 1
            ev += 1
        if j == n:
            break
        if closed is not None:
            calls.take(j, nxt)
        e = pick(j, active(arr[j]))
        place(j, e, arr[j])
    runs = [run(e) if mine[e] else None for e in range(engines)]
    kept = [np.array([k not in gone[e] for k in range(len(mine[e]))], bool) for e in range(engines)]
    got = where, runs, mine, kept, cached, moved
    return got if closed is None else got + (calls.arrays(),)


@pytest.mark.parametrize("router", ["round_robin", "least_used", "autellix"])
def test_engine_events_are_the_plain_python_cluster_request_by_request(router):
    """Engines leaving and joining again (:func:`_events`) over 12 random
    configurations per router (2 to 4 engines; every admission order that
    hands its waiting back; Autellix with programs and KV reuse): each
    request's engine, the requests routed again, and on each engine each
    request it kept's arrival (its first), admission, first token,
    completion and preemptions equal the plain-Python cluster's
    (:func:`_reference_events`).  No request is lost: the engines complete
    them all, their latencies summed from their first arrivals, and the
    system-time integral counts each request once, arrival to completion."""
    rng = np.random.default_rng(90 + ["round_robin", "least_used", "autellix"].index(router))
    moved = 0
    for _ in range(12):
        (arr, p, o, pred), kw = _config(rng)
        kw = _classed(rng, kw)
        kw.pop("goodput", None)
        kw.pop("class_tpot", None)
        engines = int(rng.integers(2, 5))
        programs = _programs(rng, p) if router == "autellix" else None
        events = _events(rng, arr, engines)
        klass = rng.integers(0, 3, len(arr)) if "class_slo" in kw else None
        ref_kw = {**kw, "klass": klass} if klass is not None else kw
        where_ref, want, mine, kept, cached, moved_ref = _reference_events(arr, p, o, pred, engines, router, events,
                                                                            programs=programs, **ref_kw)
        live = [np.asarray(mine[e], np.int64)[kept[e]] for e in range(engines)]
        runs, where, local, routed, code = _cluster(arr, p, o, pred, engines, router, programs=programs,
                                                    events=events, klass=klass, **kw)
        assert code == ck.DONE
        np.testing.assert_array_equal(where, where_ref, err_msg=f"{router} {events} {kw}")
        assert routed["rerouted"] == moved_ref
        completed = latency = system = 0.0
        for e, ((out, req, _), w) in enumerate(zip(runs, want)):
            st = ck.STATS.unpack((out.ints, out.floats))
            assert st["completed"] == len(live[e])
            completed += st["completed"]
            latency += st["sum_latency"]
            system += st["system_time"]
            if w is None:
                continue
            np.testing.assert_array_equal(local[live[e]], np.arange(len(live[e])))
            keep = kept[e]
            np.testing.assert_array_equal(req["arrival"], arr[live[e]])
            for col in ("admitted", "first_token", "completion"):
                np.testing.assert_array_equal(req[col], w[col][keep], err_msg=f"{col} engine {e} {events} {kw}")
            np.testing.assert_array_equal(req["preemptions"], w["preempted"][keep])
        assert completed == len(arr)
        alldone = np.concatenate([w["completion"][kept[e]] for e, w in enumerate(want) if w])
        arrived = np.concatenate([arr[live[e]] for e, w in enumerate(want) if w])
        assert latency == pytest.approx(float((alldone - arrived).sum()), rel=1e-9)
        assert system == pytest.approx(float((alldone - arrived).sum()), rel=1e-9)
        moved += moved_ref
    assert moved >= 5           # (engines left with requests waiting)


@pytest.mark.parametrize("router", ["round_robin", "least_used", "autellix"])
def test_engine_events_in_a_closed_loop_are_the_plain_python_cluster(router):
    """Closed-loop programs (:func:`_closed_loop`) on 2 engines of one
    sequence each (queues to hand back), engines leaving and joining again
    over the span of the run without events, 12 random configurations per
    router (KV reuse half the time):
    the calls that arrive, in their order and at their times, each
    request's engine, the requests routed again, and on each engine each
    request it kept's admission, first token, completion and preemptions
    equal the plain-Python cluster's (:func:`_reference_events` with
    ``closed``)."""
    rng = np.random.default_rng(110 + ["round_robin", "least_used", "autellix"].index(router))
    moved = 0
    for _ in range(12):
        _, kw = _config(rng)
        closed, n, kw = _closed_loop(rng, kw)
        kw["max_num_seqs"] = 1                              # (queues to hand back)
        engines = 2
        kv = bool(rng.random() < 0.5)
        slot = np.zeros(n)
        *_, got0 = _cluster(slot, slot, slot, slot, engines, router, closed=closed, kv=kv, **kw)
        span = got0["arrival_times"][np.isfinite(got0["arrival_times"])]
        events = _events(rng, span, engines)
        where_ref, want, mine, kept, _, moved_ref, (arr, _, _, _, _, call) = _reference_events(
            slot, slot, slot, slot, engines, router, events, closed=closed, kv=kv, **kw)
        runs, where, local, routed, code, got = _cluster(slot, slot, slot, slot, engines, router, closed=closed,
                                                         kv=kv, events=events, **kw)
        assert code == ck.DONE, kw
        np.testing.assert_array_equal(got["call"], call, err_msg=f"{events} {kw} {closed}")
        np.testing.assert_array_equal(got["arrival_times"], arr)
        np.testing.assert_array_equal(where, where_ref, err_msg=f"{router} {events} {kw}")
        assert routed["rerouted"] == moved_ref
        for e, ((out, req, _), w) in enumerate(zip(runs, want)):
            if w is None:
                continue
            live = np.asarray(mine[e], np.int64)[kept[e]]
            np.testing.assert_array_equal(local[live], np.arange(live.size))
            for col in ("admitted", "first_token", "completion"):
                np.testing.assert_array_equal(req[col], w[col][kept[e]], err_msg=f"{col} engine {e} {events} {kw}")
            np.testing.assert_array_equal(req["preemptions"], w["preempted"][kept[e]])
        moved += moved_ref
    assert moved >= 3           # (engines left with calls waiting)


def test_the_engines_records_are_gathered_from_one_array():
    """A cluster's engines' records are rows of one array:
    :func:`cc.stacked_rows` reads each field's rows as one read-only view
    of it (no copy); rows of separate arrays it copies into one, the
    shorter padded.  Either way :func:`cc.gathered` puts request j's
    value, number ``local[j]`` of engine ``where[j]``, at ``out[j]``."""
    rng = np.random.default_rng(5)
    (arr, p, o, pred), kw = _config(rng)
    runs, where, local, _, code = _cluster(arr, p, o, pred, 3, "least_used", **kw)
    assert code == ck.DONE and np.unique(where).size == 3
    for k, first in runs[0][1].items():
        row = [r[k] for _, r, _ in runs]
        for st, view in ((cc.stacked_rows(row), True), (cc.stacked_rows([r.copy() for r in row]), False)):
            assert st.shape == (3, max(r.size for r in row)) and np.shares_memory(st, first) == view
            assert not (view and st.flags.writeable)
            for e, r in enumerate(row):
                np.testing.assert_array_equal(st[e, :r.size], r)
            out = np.empty(len(arr), first.dtype)
            cc.gathered(where, local, st, out)
            np.testing.assert_array_equal(out, [row[e][j] for e, j in zip(where, local)], err_msg=k)
