"""Batching policies: configuration only, validated at the boundary.

One module per policy (its class, what it declares to the registry, how it
is built from a sweep's parameters and, for the token-level policies, how
the event kernel runs it); :mod:`.base` says what a policy declares, and
:mod:`mbbatch.registry` lists the policies.
"""

from .base import EventPolicy, Policy
from .cluster import Cluster, EngineEvent, Programs, Sessions
from .dynamic import DynamicBatching, MultiBinDynamic
from .laps import LAPS
from .multibin import MultiBin, MultiBinEngine
from .static import StaticBatching

__all__ = ["Policy", "EventPolicy", "MultiBin", "StaticBatching", "DynamicBatching", "MultiBinDynamic", "LAPS",
           "Cluster", "EngineEvent", "Programs", "Sessions", "MultiBinEngine"]
