"""The routers of a cluster in the event kernel, by name and code.

``ROUTERS`` maps each router's name (``Cluster(router=...)``, a spec's
``router``) to the code the kernel branches on; ``ROUTE_NONE`` is one
engine, no router.  Their rules (Autellix: Luo et al., 2025, arXiv:2502.13965,
Algorithm 2):

- ``round_robin``: the registered engines in turn;
- ``least_used``: the fewest active requests (routed, not completed), ties
  to the lowest id;
- ``autellix``: a request of at most ``threshold`` prefill tokens least-used,
  a larger one to its program's engine in the program table, assigned
  least-used on first sight.
"""

from __future__ import annotations

__all__ = ["ROUTE_NONE", "ROUTE_ROUND_ROBIN", "ROUTE_LEAST_USED", "ROUTE_AUTELLIX", "ROUTERS"]

ROUTE_NONE = 0
ROUTE_ROUND_ROBIN = 1
ROUTE_LEAST_USED = 2
ROUTE_AUTELLIX = 3
#: the routers by name, in the parameter table's order (the first is the default)
ROUTERS = {"autellix": ROUTE_AUTELLIX, "least_used": ROUTE_LEAST_USED, "round_robin": ROUTE_ROUND_ROBIN}
