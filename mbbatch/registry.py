"""The registry: every policy, router and arrival process, declared once.

A policy is one line of :data:`POLICIES`; everything else about it it
declares itself (:mod:`mbbatch.policies.base`): its kind name, its planner,
the metrics it reports, the spec keys of its settings, the service models it
takes, whether it runs as a cluster's engines or as LAPS's decode stage, and
how a sweep cell builds it.  The metric table's kinds, the sweep spec's keys
per kind, a cell's objects, the command line's ``--policy`` choices, the
parameter table's ``engine_policy`` and ``decode`` choices and the tests'
lists of kinds are read from here.

Routers and arrival processes are declared the same way: a router's name is
its kernel code (:data:`mbbatch._kernels.routing.ROUTERS`, the parameter
table's ``Cluster.router`` choices), and an arrival process declares its
spec name, its spec keys and its kernel fields
(:class:`mbbatch.arrivals.Arrivals`).

>>> sorted(POLICIES)[:3]
['cluster', 'continuous', 'disaggregated']
>>> kind_of(MultiBin(bins=2, batch_size=4)).planner
'multibin'
"""

from __future__ import annotations

import dataclasses

from . import params as _params
from ._kernels.routing import ROUTERS
from .arrivals import Gamma, OnOff, PiecewisePoisson, Poisson, Replay, Saturated
from .policies.cluster import Cluster
from .policies.continuous import ContinuousBatching
from .policies.disaggregated import Disaggregated
from .policies.dynamic import DynamicBatching, MultiBinDynamic
from .policies.laps import LAPS
from .policies.multibin import MultiBin
from .policies.spf import ShortestPredictedFirst
from .policies.static import StaticBatching
from .policies.base import Policy, SpecContext

__all__ = ["POLICIES", "KINDS", "ARRIVALS", "ROUTERS", "kind_of", "build", "engine_kinds", "decode_kinds", "with_tag"]

#: The policies, by kind (their spec name): one line each.
POLICIES: dict = {cls.kind: cls for cls in (
    MultiBin,
    StaticBatching,
    DynamicBatching,
    MultiBinDynamic,
    LAPS,
    Cluster,
    ShortestPredictedFirst,
    ContinuousBatching,
    Disaggregated,
)}
#: The kinds, in the registry's order.
KINDS = tuple(POLICIES)

#: The arrival processes, by their spec name.
ARRIVALS: dict = {cls.spec: cls for cls in (Poisson, Gamma, OnOff, Saturated, PiecewisePoisson, Replay)}


def kind_of(policy) -> type:
    """The registered class of ``policy`` (its kind: ``kind_of(p).kind``);
    a TypeError naming the policies for anything else."""
    cls = POLICIES.get(getattr(policy, "kind", None)) if isinstance(policy, Policy) else None
    if cls is None or not isinstance(policy, cls):
        names = ", ".join(c.__name__ for c in POLICIES.values())
        raise TypeError(f"policy must be one of {names}; got {type(policy).__name__}")
    return cls


def build(kind: str, params: dict, trace=None):
    """The policy of kind ``kind`` of a sweep cell's parameters (``trace``:
    the cell's trace, for a cluster of its sessions)."""
    return POLICIES[kind].from_spec(params, SpecContext(build=lambda k, p: build(k, p, trace), kinds=POLICIES,
                                                        trace=trace))


def engine_kinds() -> tuple:
    """The kinds that run as a :class:`~mbbatch.Cluster`'s engines."""
    return tuple(k for k, cls in POLICIES.items() if cls.engine)


def decode_kinds() -> tuple:
    """The kinds that run as :class:`~mbbatch.LAPS`'s decode stage."""
    return tuple(k for k, cls in POLICIES.items() if cls.decode_stage)


def with_tag(tag: str) -> frozenset:
    """The kinds that report the metrics of ``tag`` (:data:`mbbatch.metrics.TAGS`)."""
    return frozenset(k for k, cls in POLICIES.items() if tag in cls.reports)


def _choices(key: str, choices: tuple) -> None:
    """The parameter table's ``key`` offers ``choices``."""
    p = _params.PARAMS[key]
    _params.PARAMS[key] = dataclasses.replace(p, choices=tuple(choices))


# the parameters whose choices are the registry's (the default first)
_choices("engine_policy", ("dynamic", *(k for k in engine_kinds() if k != "dynamic")))
_choices("decode", ("none", *decode_kinds()))
