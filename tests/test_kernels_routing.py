"""The routers' names and codes (mbbatch._kernels.routing): one name from
the API to the kernel."""

from mbbatch._kernels import routing
from mbbatch.params import PARAMS


def test_one_code_per_router_none_for_one_engine():
    codes = list(routing.ROUTERS.values())
    assert len(set(codes)) == len(codes) and routing.ROUTE_NONE not in codes
    assert tuple(routing.ROUTERS) == PARAMS["Cluster.router"].choices
    assert PARAMS["Cluster.router"].default in routing.ROUTERS
