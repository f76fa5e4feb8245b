"""Planners: one per kernel family, each checking a ``simulate`` call,
sizing its memory, packing its kernel's arguments and running it.

Every planner module implements one protocol (:class:`Planner`): a function
``check(policy, arrivals, service, n, servers, keep_requests, workload,
service_model, keep_batches)`` that raises the error the call would raise
(before anything runs) and returns a plan (:class:`Plan`): its ``memory``
(bytes), ``n``, ``servers``, ``kernel_args`` (cached: every run of the plan
shares them) and ``run(seed_sequence, warn=, progress=)``, which returns the
one :class:`~mbbatch.SimulationResult`.  A policy names its planner
(``planner``, :mod:`mbbatch.policies.base`):

- :mod:`.multibin`: the multi-bin paper's kernel;
- :mod:`.tokens`: the event kernel of the token-level policies;
- :mod:`.cluster`: the event kernel with engines, a router and programs;
- :mod:`.laps`: LAPS's prefill instances, and its decode stage;
- :mod:`.continuous`: the continuous-batching engine;
- :mod:`.disaggregated`: prefill and decode pools of continuous engines, the KV
  transfers between.

:mod:`.common` holds what they share, the metrics of a run assembled from the
metric table among it (:func:`.common.assemble`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..results import SimulationResult
from . import cluster, continuous, disaggregated, laps, multibin, tokens

__all__ = ["Plan", "Planner", "PLANNERS"]


class Plan(Protocol):
    """A checked ``simulate`` call, ready to run for many seeds."""

    n: int
    memory: int
    kernel_args: tuple

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        ...


class Planner(Protocol):
    """A planner module: ``check`` returns the call's :class:`Plan`."""

    def check(self, policy, arrivals, service, n, servers, keep_requests, workload, service_model,
              keep_batches) -> Plan:
        ...


#: the planners by the name a policy declares
PLANNERS: dict = {"multibin": multibin, "tokens": tokens, "cluster": cluster, "laps": laps,
                  "continuous": continuous, "disaggregated": disaggregated}
