"""The routers' names and codes (mbbatch._kernels.routing): one name from
the API to the kernel."""

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from mbbatch._kernels import routing
from mbbatch.params import PARAMS


def test_one_code_per_router_none_for_one_engine():
    codes = list(routing.ROUTERS.values())
    assert len(set(codes)) == len(codes) and routing.ROUTE_NONE not in codes
    assert tuple(routing.ROUTERS) == PARAMS["Cluster.router"].choices
    assert PARAMS["Cluster.router"].default in routing.ROUTERS


# --- the router's scan of the engines (scan_engines) ---------------------------------------------

@functools.cache
def _scan_from_numba():
    """:func:`scan_engines` called from numba (a step has no Python wrapper)."""
    from numba import njit

    from mbbatch._kernels import routing as d

    return njit(lambda eng: d.scan_engines(eng))


@settings(max_examples=200, deadline=None)
@given(data=hs.data(), E=hs.integers(1, 40))
def test_scan_engines_is_the_plain_reading(data, E):
    """The least-used registered engine (ties to the lowest id), the most and
    the sum of registered engines' active requests and their count, as a
    plain loop reads them: engine ids and active counts packed in one key
    (ENGINE_BITS bits of id), active counts up to 2**42 and ties included;
    up to SCALAR_SCAN engines read one at a time, more by the vector loop."""
    from mbbatch._kernels import routing as d

    eng = np.zeros((len(d.ENGINES.ints), E), np.int64)
    big = data.draw(hs.booleans())
    eng[d.EN.active] = data.draw(hs.lists(hs.integers(0, 2 ** 42 if big else 3), min_size=E, max_size=E))
    eng[d.EN.registered] = data.draw(hs.lists(hs.integers(0, 1), min_size=E, max_size=E))
    on = [e for e in range(E) if eng[d.EN.registered, e]]
    a = eng[d.EN.active]
    least = min((a[e] for e in on), default=None)
    want = (next((e for e in on if a[e] == least), -1), max((a[e] for e in on), default=0),
            sum(int(a[e]) for e in on), len(on))
    assert tuple(int(x) for x in _scan_from_numba()(eng)) == want


# --- the cache-aware router (cache_aware) --------------------------------------------------------

@functools.cache
def _cache_aware_from_numba():
    """:func:`cache_aware` called from numba (a step has no Python wrapper)."""
    from numba import njit

    from mbbatch._kernels import routing as d

    return njit(lambda eng, match, prompt, bs, ca: d.cache_aware(eng, match, prompt, bs, ca))


@settings(max_examples=300, deadline=None)
@given(data=hs.data(), E=hs.integers(1, 12))
def test_cache_aware_is_sglangs_rule_written_plainly(data, E):
    """SGLang's cache-aware rule on the engines' caches, written again: while
    the registered engines' most and fewest active requests differ by more
    than ``balance_abs`` and the most are more than ``balance_rel`` times the
    fewest, the least-used engine (ties: the lowest id); else, among the
    registered engines caching a block of the prefix, the one caching the
    most (ties: fewer active requests, then the lower id), if its blocks'
    tokens are more than ``threshold`` of the prompt; else least used.
    Loads, matches, prompts and settings are drawn small, so ties and
    bounds met exactly are frequent; at least one engine is registered (the cluster
    keeps one)."""
    from mbbatch._kernels import routing as d

    eng = np.zeros((len(d.ENGINES.ints), E), np.int64)
    eng[d.EN.active] = data.draw(hs.lists(hs.integers(0, 6), min_size=E, max_size=E))
    reg = data.draw(hs.lists(hs.integers(0, 1), min_size=E, max_size=E))
    reg[data.draw(hs.integers(0, E - 1))] = 1
    eng[d.EN.registered] = reg
    match = np.array(data.draw(hs.lists(hs.integers(0, 4), min_size=E, max_size=E)), np.int64)
    # (prompts of whole blocks too: a share of them met exactly by the cached tokens)
    prompt = float(data.draw(hs.one_of(hs.integers(1, 200), hs.sampled_from([16, 32, 48, 64, 96, 128]))))
    bs = data.draw(hs.sampled_from([1, 16, 32]))
    ca = d.CacheRouting(data.draw(hs.sampled_from([0.0, 0.3, 0.5, 1.0])), data.draw(hs.integers(0, 4)),
                        data.draw(hs.sampled_from([1.0, 1.5, 2.0])))
    on = [e for e in range(E) if reg[e]]
    a = eng[d.EN.active]
    least = min(on, key=lambda e: (a[e], e))
    lo, hi = a[least], max(a[e] for e in on)
    if hi - lo > ca.balance_abs and hi > ca.balance_rel * lo:
        want = least
    else:
        held = [e for e in on if match[e] > 0]
        best = min(held, key=lambda e: (-match[e], a[e], e)) if held else None
        want = best if best is not None and match[best] * bs > ca.threshold * prompt else least
    got = _cache_aware_from_numba()(eng, match, prompt, bs, ca)
    assert int(got[0]) == want
    assert (int(got[1]), int(got[2]), int(got[3])) == (hi, sum(int(a[e]) for e in on), len(on))
