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
    (ENGINE_BITS bits of id), active counts up to 2**42 and ties included."""
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
