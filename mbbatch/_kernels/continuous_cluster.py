"""A cluster of continuous-batching engines behind a router.

The requests arrive in time order (drawn before the run: their arrival
times, whole-token prompts and outputs, predicted outputs and, for the
calls of programs, their program, new tokens and last-call flag).  At each
arrival every engine is advanced (:func:`.continuous.continuous_kernel`,
resumed from the scalars it keeps) until an iteration would start at or
after that instant, so the router sees every completion up to it; then the
router (:func:`.routing.route_call`: round robin, least used, Autellix's
Algorithm 2, with a program table) picks the engine and the request joins
that engine's requests, joining its queue at the engine's next iteration
boundary, as one engine's arrivals do.  After the last arrival every engine
runs to its end.

Prefix caching (the engines' ``chain`` given: :mod:`.continuous`'s): each
engine caches the prefixes of the requests routed to it, in its own
blocks; the cache-aware router (:func:`.routing.cache_aware`) reads each
engine's cache of the request's chain as it stands at the arrival (after
every iteration that started before it: an iteration running across the
arrival has cached its blocks, as an engine reports a block when it is
scheduled to be filled).

KV reuse (Autellix: Luo et al., 2025, arXiv:2502.13965): a call routed to
the engine that holds its program's context (the engine of the program's
previous call) brings the KV cache of that context, ``prompt - new``
tokens: the engine takes the blocks of its whole prompt but prefills its
new tokens only (:mod:`.continuous`'s ``cached``).  The engine keeps a
program's context between its calls outside its block pool (a prefix cache
that is never evicted); preempted, a call loses its cache and prefills its
whole prompt and generated tokens again.

An engine's arrays have room for every request it may be routed (the
run's ``n``), but those the kernel reads only after writing them start
unset (:data:`.continuous.UNSET`), so the memory a run touches is about
its requests' once, not once per engine (the per-request records, with
``keep``, excepted); an engine numbers its requests in the order they
reach it.  Each request's batch-means group is its group among the
cluster's arrivals.

The driver is pure numba on arrays and scalars; :func:`run` sets the
engines up, and the Python side is :mod:`mbbatch.planners.continuous`.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import types
from numba.extending import overload

from .common import ARRIVED, STOP, kernel, step
from .continuous import DONE, ES, STALLED, STOPPED, C, continuous_kernel, prefix_blocks
from .layout import Layout
from .routing import EN, ROUTE_CACHE_AWARE, cache_aware, route_call, routed_call

__all__ = ["ROUTED", "Feed", "rows", "cluster_kernel", "run"]

#: the router's statistics: routing decisions, requests above the threshold,
#: requests the program table routed, calls with an earlier context, calls
#: served on the engine that held it; context tokens prefilled again (a call
#: away from its context), and over the decisions the most active requests of
#: an engine and their mean over the engines
ROUTED = Layout("continuous cluster routing", ints=("routes", "large", "table_hits", "followups", "kv_hits"),
                floats=("kv_recomputed", "sum_active_max", "sum_active_mean"))
R = ROUTED.index

#: an engine's inputs as the cluster writes them (the engine reads them
#: through read-only views): each request's prompt, output, predicted output,
#: the prompt tokens whose KV cache it brings, its class and, with prefix
#: caching, its chain and the tokens it shares with it
Feed = namedtuple("Feed", ("prompt", "output", "prediction", "cached", "klass", "chain", "shared"), module=__name__)

#: arrivals between two checks of ``stop``
_CHECK = 1024


def rows(stacked, e):
    """Engine ``e``'s row of ``stacked``, a tuple or namedtuple of arrays,
    each with a leading axis of engines: the same tuple of each array's row
    (views).  In numba, generated for each tuple type: the engines' arrays
    are rows of the cluster's (every engine of a cluster has arrays of the
    same shapes), so the driver holds a handful of arrays, not a list of
    engines, and hands an engine to the kernel at no cost."""
    return _like(stacked, [a[e] for a in stacked])


def _like(t, items):
    """A tuple of ``items`` of the type of ``t`` (a namedtuple's or a plain one)."""
    return type(t)(*items) if hasattr(t, "_fields") else tuple(items)


# (not inline="always": numba's inlining of it dropped a write to the tuple's arrays made just before)
@overload(rows)
def _rows(stacked, e):
    k = len(stacked)
    args = ", ".join(f"stacked[{j}][e]" for j in range(k))
    if isinstance(stacked, types.BaseNamedTuple):
        ns = {"cls": stacked.instance_class}
        src = f"def impl(stacked, e):\n    return cls({args})\n"
    else:
        ns = {}
        src = f"def impl(stacked, e):\n    return ({args},)\n"
    exec(src, ns)
    return ns["impl"]


@step
def _completed_by(si, sf, t):
    """The requests an engine (its scalars ``si``, ``sf``) completed by time
    ``t``: it may have run one iteration past t (it started before t),
    whose completions come after."""
    return si[ES.completed_before] if sf[ES.now] > t else si[ES.completed]


@step
def _idle(si, count):
    """Whether an engine has nothing to do: every one of the ``count``
    requests routed to it joined, none waits or runs."""
    return si[ES.i] >= count and si[ES.running] == 0 and si[ES.waiting] == 0 and si[ES.nstack] == 0


@step
def _advance(e, count, until, config, control, inputs, out, requests, ws, streams, estop):
    """Engine e (``count`` requests routed to it so far) advanced until an
    iteration would start at or after ``until``."""
    ci, cf = config
    ci[e, C.n] = count
    cf[e, C.until] = until
    return continuous_kernel(rows(config, e), control, rows(inputs, e), streams, rows(out, e), rows(requests, e),
                             rows(ws, e), estop)


@step
def _matches(match, c, s, p, bs, pc):
    """Each engine's cached blocks of a request's prefix (``match[e]``):
    chain ``c`` (-1: none) of which it shares ``s`` tokens of its ``p``-token
    prompt (:func:`.continuous.prefix_blocks`, as an engine looks it up),
    ``pc[e, c]`` the blocks engine e caches."""
    k = prefix_blocks(s, p, bs) if c >= 0 else 0
    for e in range(match.shape[0]):
        match[e] = min(pc[e, c], k) if k > 0 else 0


@kernel
def cluster_kernel(config, control, inputs, out, requests, ws, feeds, times, prompt, output, prediction, klass,
                   chain, shared, program, new_tokens, session_end, groups, rt, ca, eng, table, counts, match, where,
                   local, routed, streams, stop, estop):
    """Route the ``times.size`` requests to the engines and simulate them.
    The engines' ``config``, ``inputs``, ``out``, ``requests`` and ``ws``
    are the continuous kernel's, each array with a leading axis of engines
    (``control``: one, shared), ``feeds`` their inputs' writable arrays;
    ``rt`` the router (:class:`.routing.Router`), ``eng`` the engines'
    counts (:data:`.routing.ENGINES`, every engine registered), ``table``
    the program table (-1: none), ``ca`` the cache-aware router's settings
    (:class:`.routing.CacheRouting`); per request its engine (``where``) and
    its number there (``local``), per engine its requests (``counts``) and
    the blocks of the arriving request's prefix it caches (``match``); the
    routing statistics into ``routed`` (:data:`ROUTED`); ``groups``
    batch-means groups of arrivals.  Returns :data:`.continuous.DONE`,
    ``STOPPED`` (``stop[STOP]`` set; checked every 1,024 arrivals, when
    ``stop[ARRIVED]`` gets the requests routed so far) or ``STALLED``;
    ``estop`` the engines' own (zeros: ``stop[ARRIVED]`` counts the
    cluster's requests, not an engine's)."""
    ri, rf = routed
    n = times.shape[0]
    E = counts.shape[0]
    si, sf = ws.state_i, ws.state_f
    caching = chain.shape[0] > 0
    bs = config[0][0, C.block_size]
    for e in range(E):
        # (each engine's first call sets it up: no request yet; a count typed as the others', not the literal 0,
        # or numba compiles the whole engine a second time for it)
        _advance(e, np.int64(0), -np.inf, config, control, inputs, out, requests, ws, streams, estop)
    rr_route = 0
    for j in range(n):
        if j % _CHECK == 0:
            if stop[STOP] != 0:
                return STOPPED
            stop[ARRIVED] = j
        t = times[j]
        for e in range(E):
            # (an engine idle, or paused at or after t, has nothing to do before t)
            if sf[e, ES.now] < t and not _idle(si[e], counts[e]):
                if _advance(e, counts[e], t, config, control, inputs, out, requests, ws, streams,
                            estop) == STALLED:
                    return STALLED
            eng[EN.active, e] = counts[e] - _completed_by(si[e], sf[e], t)
        p = prompt[j]
        if p > rt.threshold:
            ri[R.large] += 1
        pid, new, last = j, 0.0, False
        if rt.programs:
            pid, new, last = program[j], new_tokens[j], session_end[j] != 0
        if rt.router == ROUTE_CACHE_AWARE:
            if caching:
                _matches(match, np.int64(chain[j]), np.int64(shared[j]), np.int64(p), bs, ws.pc)
            e, most, total, count = cache_aware(eng, match, p, bs, ca)
            e, prefill, rr_route, hit, followup, held, most, mean = routed_call(rt, eng, table, e, p, pid, new, last,
                                                                                rr_route, False, most, total, count)
        else:
            e, prefill, rr_route, hit, followup, held, most, mean = route_call(rt, eng, table, p, pid, new, last,
                                                                               rr_route)
        ri[R.routes] += 1
        rf[R.sum_active_max] += most
        rf[R.sum_active_mean] += mean
        if hit:
            ri[R.table_hits] += 1
        if rt.programs:
            rf[R.kv_recomputed] += prefill - new
            if followup:
                ri[R.followups] += 1
            if held:
                ri[R.kv_hits] += 1
        k = counts[e]
        ws.arrival[e, k] = t
        ws.group[e, k] = (j * groups) // n
        feeds.prompt[e, k] = p
        feeds.output[e, k] = output[j]
        feeds.prediction[e, k] = prediction[j]
        feeds.cached[e, k] = p - prefill
        if klass.shape[0] > 0:
            feeds.klass[e, k] = klass[j]
        if caching:
            feeds.chain[e, k] = chain[j]
            feeds.shared[e, k] = shared[j]
        where[j] = e
        local[j] = k
        counts[e] = k + 1
    for e in range(E):
        # (the arrivals are over: each engine runs to its end, Ctrl-C passed on)
        estop[STOP] = stop[STOP]
        if not _idle(si[e], counts[e]):
            code = _advance(e, counts[e], np.inf, config, control, inputs, out, requests, ws, streams, estop)
            if code != DONE:
                return code
    stop[ARRIVED] = n
    return DONE


def _stacked(one, engines: int, unset=()):
    """The tuple (or namedtuple) of arrays ``one`` for ``engines`` engines:
    each array with a leading axis of engines, every row a copy of it but
    for the fields ``unset`` (left as ``np.empty`` leaves them: their pages
    are touched only as the kernel writes them)."""
    fields = getattr(one, "_fields", ())
    out = []
    for j, a in enumerate(one):
        s = np.empty((engines, *a.shape), a.dtype)
        if not (fields and fields[j] in unset):
            s[...] = a
        out.append(s)
    return _like(one, out)


def run(config, times, prompt, output, prediction, edges, router, engines: int, streams, stop, *, control=None,
        programs=None, groups: int = 1, ts_rows: int = 2, klass=None, class_slo=None, class_tpot=None,
        prefixes=None, cache_routing=None) -> tuple:
    """Simulate ``engines`` engines of the continuous run ``config``
    (:data:`.continuous.CONFIG` ``.pack(...)``, its ``n`` the requests)
    behind ``router`` (:class:`.routing.Router`) on the requests' arrival
    ``times``, lengths and predictions (``edges``: the multi-bin admission's
    inner edges), ``programs`` the calls' ``(program, new_tokens,
    session_end)`` and the program table's size (None: every request its
    own program); ``klass`` each request's class and ``class_slo`` and
    ``class_tpot`` each class's objectives on the time to first token and
    per output token (None: no classes, no objectives); ``prefixes`` the
    engines' prefix caching, a dict of each request's ``chain`` and
    ``shared`` tokens and each chain's ``grows`` (None: none);
    ``cache_routing`` the cache-aware router's settings
    (:class:`.routing.CacheRouting`; None with another router).
    Returns each engine's ``(outputs, records, code)`` (as
    :func:`.continuous.run`'s, its requests in the order they reached it),
    each request's engine and number there, the routing statistics
    (``ROUTED.unpack``) and the code."""
    from . import continuous as _k
    from .common import ARR_REPLAY, check_stop
    from .routing import ENGINES, NO_CACHE_ROUTING, TABLE

    check_stop(stop)
    cfg = _k.CONFIG.unpack(config)
    n = cfg["n"]
    config = _k.CONFIG.pack(**{**cfg, "arrival_kind": ARR_REPLAY, "rate": 0.0})
    klass = np.empty(0) if klass is None else np.ascontiguousarray(klass, float)
    class_slo = np.full(1, np.inf) if class_slo is None else np.asarray(class_slo, float)
    class_tpot = np.full(class_slo.size, np.inf) if class_tpot is None else np.asarray(class_tpot, float)
    chain = np.ascontiguousarray(prefixes["chain"], float) if prefixes else np.empty(0)
    shared = np.ascontiguousarray(prefixes["shared"], float) if prefixes else np.empty(0)
    grows = np.asarray(prefixes["grows"], float) if prefixes else np.empty(0)
    given = {"klass": klass.size, "chain": chain.size, "shared": shared.size}
    feeds = Feed(*(np.zeros((engines, given.get(f, n))) for f in Feed._fields))
    one = _k.start(config, _k.INPUTS.pack(arrival_times=np.zeros(1), arrival_params=np.zeros(1),
                                          arrival_ends=np.full(1, np.inf),
                                          **{f: np.zeros(given.get(f, n)) for f in Feed._fields},
                                          edges=edges, class_slo=class_slo, class_tpot=class_tpot, grows=grows),
                   control=control, groups=groups, ts_rows=ts_rows, grouped=True,
                   longest=int(np.max(output)) if n else 1)
    # (every engine starts as this one; its inputs are read-only views of the feeds)
    inputs = _k.INPUTS.type(*(_readonly(getattr(feeds, f) if f in Feed._fields else _stacked((a,), engines)[0])
                              for f, a in zip(one.inputs._fields, one.inputs)))
    config_s, out_s, requests_s = (_stacked(part, engines) for part in (one.config, one.out, one.requests))
    ws_s = _stacked(one.ws, engines, _k.UNSET)
    eng = np.zeros((ENGINES.size, engines), np.int64)
    eng[ENGINES.index.registered] = 1
    if programs is None:
        program = new_tokens = np.empty(0)
        session_end = np.empty(0, np.int8)
        size = 1
    else:
        (program, new_tokens, session_end), size = programs
    table = np.full((TABLE.size, max(size, 1)), -1, np.int64)
    counts = np.zeros(engines, np.int64)
    where = np.empty(n, np.int64)
    local = np.empty(n, np.int64)
    routed = ROUTED.zeros()
    code = cluster_kernel(config_s, one.control, inputs, out_s, requests_s, ws_s, feeds,
                          np.ascontiguousarray(times, float), np.ascontiguousarray(prompt, float),
                          np.ascontiguousarray(output, float), np.ascontiguousarray(prediction, float), klass,
                          chain, shared, np.ascontiguousarray(program, np.int64),
                          np.ascontiguousarray(new_tokens, float), np.ascontiguousarray(session_end, np.int8), groups,
                          router, cache_routing or NO_CACHE_ROUTING, eng, table, counts, np.zeros(engines, np.int64),
                          where, local, routed, streams, stop, np.zeros_like(stop))
    runs = []
    for e, c in enumerate(counts):
        rec = None
        if cfg["keep"]:
            rec = {k: v[:c] for k, v in _k.REQUESTS.rows(rows(requests_s, e)).items()}
        runs.append((rows(out_s, e), rec, code))
    return runs, where, local, ROUTED.unpack(routed), code


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v
