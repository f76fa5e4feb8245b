"""Dynamic batching and multi-bin dynamic batching: memory-aware,
SLA-constrained batch sizes (Pang, Li and Wang, 2025, "Optimizing LLM
Inference Throughput via Memory-aware and SLA-constrained Dynamic Batching",
arXiv:2503.05248; Algorithms 1-3 and 7), and the same controllers on the
bins of multi-bin batching (Guldogan et al., 2024, arXiv:2412.04504;
Algorithms 4-6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from .._kernels.formation import FORM_DYNAMIC, FORM_MULTIBIN_DYNAMIC, SEL_ROUND_ROBIN, SELECTIONS
from .._validation import check, check_fields, check_instance
from ..params import default
from ..predictors import Oracle, as_predictor
from .base import Carries, EventPolicy, Policy, controller_from_spec, memory_from_spec, predictor_from_spec

__all__ = ["DynamicBatching", "MultiBinDynamic"]


@dataclass(frozen=True, eq=False)
class DynamicBatching(Policy):
    """Memory-aware, SLA-constrained dynamic batching from one FIFO
    (Algorithms 1-3, feedback by Algorithm 7).

    At each free server: ``b_target = min(b_mem, b_SLA)`` (Algorithm 3), the
    first ``b_target`` queued requests, then the last ones dropped while the
    batch's tokens exceed the capacity.

    Parameters
    ----------
    controller : SLAController
        D_SLA, bounds and the controller variant.
    memory : Memory
        Token capacity and the b_mem variant; ``Memory(enabled=False)`` turns
        the memory constraint off.
    max_candidates : int, optional
        Candidates looked at per decision; default ``controller.b_max``.
    pin : int, optional
        Pin ``b_target`` to this value (the controller still learns); for
        checks against fixed-B theory.
    """

    controller: object = None
    memory: object = None
    max_candidates: Optional[int] = None
    pin: Optional[int] = None

    kind: ClassVar[str] = "dynamic"
    planner: ClassVar[str] = "tokens"
    reports: ClassVar[frozenset] = frozenset({"run", "batch_means", "tokens", "decode", "ttft", "ttft_quantiles",
                                              "tbt_quantiles", "controller", "goodput"})
    settings: ClassVar[tuple] = ("d_sla", "eps_d", "b_min", "b_max", "controller", "memory", "eta", "eps_m",
                                 "ttft_slo", "tpot_slo", "servers")
    engine: ClassVar[bool] = True
    decode_stage: ClassVar[bool] = True

    def __post_init__(self):
        from ..controller import Memory, SLAController

        c = check_instance("controller", self.controller, SLAController, SLAController)
        object.__setattr__(self, "controller", c)
        object.__setattr__(self, "memory", check_instance("memory", self.memory, Memory, Memory))
        check_fields(self, {"max_candidates": "max_candidates", "pin": "pin"})
        if self.pin is not None and self.pin > c.b_max:
            raise ValueError(f"pin must be at most controller.b_max = {c.b_max}; got {self.pin}")

    bins = 1

    def carries(self) -> Carries:
        """Batches of up to the controller's ``b_max`` of whatever waits: near
        its limit the server is always busy and its batches grow with the
        backlog, so the load is 1 over a range of rates below it and the
        backlog decides (see :class:`~mbbatch.policies.base.Carries`)."""
        return Carries(load=False, backlog=True, held=self.controller.b_max)

    def describe(self) -> dict:
        c, m = self.controller, self.memory
        return {"policy": DynamicBatching.kind, "d_sla": c.d_sla, "eps_d": c.eps_d, "b_min": c.b_min,
                "b_max": c.b_max, "alpha": c.alpha, "delta": c.delta, "controller": c.variant,
                "memory": m.variant if m.enabled else "off", "eta": m.eta, "eps_m": m.eps_m,
                "max_candidates": self.max_candidates or c.b_max, "pin": self.pin or 0}

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "DynamicBatching":
        """A cell's dynamic batching: its controller and memory."""
        return cls(controller=controller_from_spec(params), memory=memory_from_spec(params))

    def event_config(self) -> EventPolicy:
        """Algorithm 3 on one FIFO (``FORM_DYNAMIC``), fed back by Algorithm 7."""
        c = self.controller
        return EventPolicy(formation=FORM_DYNAMIC, bins=1, b_max=c.b_max, pin=self.pin or 0,
                           max_candidates=self.max_candidates or c.b_max, selection=SEL_ROUND_ROBIN, warmup=1,
                           memory_on=self.memory.enabled, sla=c, memory=self.memory, predictor=Oracle(),
                           controlled=True)


@dataclass(frozen=True, eq=False)
class MultiBinDynamic(DynamicBatching):
    """Multi-bin dynamic batching (Algorithm 5): K bins by predicted output
    length, each with its own statistics and SLA controller.

    Bin edges come from Algorithm 6 (equal mass, floors of the quantiles) on
    the predicted lengths of the first ``warmup`` requests, computed when the
    ``warmup``-th request arrives; until then every request waits in bin 0,
    and then the waiting ones are re-binned by their own predictions.  At each
    free server one bin is selected (round-robin or longest queue), up to
    ``max_candidates`` of its head are candidates, Algorithm 3 forms the batch
    with that bin's controller, and unused candidates stay at the bin's front.

    Parameters
    ----------
    bins : int
        K, >= 1.
    selection : {"round_robin", "longest_queue"}
        Which non-empty bin forms the next batch (Algorithm 5): the next in
        turn after the last one served, or the one holding the most requests
        (of equal queues, the lowest bin).  Default ``"round_robin"``.
    warmup : int
        Requests whose predictions set the edges, >= bins.  Default 1000.
    bin_b_max : sequence of int, optional
        Per-bin batch limits (Algorithm 1, step 5).
    predictor : Oracle, LogNormalError, BinConfusion or Predictions, optional
        The output-length predictor Algorithms 4 and 6 read
        (:mod:`mbbatch.predictors`); default the oracle, or the workload's
        ``predictor_sigma``.
    bin_edges : {"warmup", "presample", "optimal"}
        Where the edges come from: Algorithm 6 on the first ``warmup``
        requests' predictions, every request waiting in bin 0 until then
        (default); Algorithm 6 on ``warmup`` predicted lengths pre-sampled
        from the workload before the run (Pang et al., 2025, arXiv:2503.05248), binning from
        the first request; or :func:`mbbatch.theory.optimal_boundaries` on
        the output-length distribution at ``B = b_max`` (a distribution, not
        an array), floored as Algorithm 6 floors its quantiles.
    controller, memory, max_candidates, pin
        As for :class:`DynamicBatching`.
    """

    bins: int = default("MultiBinDynamic.bins")
    selection: str = default("selection")
    warmup: int = default("warmup")
    bin_b_max: Optional[tuple] = None
    predictor: object = None
    bin_edges: str = default("bin_edges")

    kind: ClassVar[str] = "multibin_dynamic"
    reports: ClassVar[frozenset] = DynamicBatching.reports | {"warmup"}
    settings: ClassVar[tuple] = ("bins", "predictor_sigma", "predictor_p", *DynamicBatching.settings[:-1],
                                 "selection", "bin_edges", "warmup", "servers")

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, {"bins": "bins", "selection": "selection", "bin_edges": "bin_edges"})
        object.__setattr__(self, "predictor", as_predictor(self.predictor))
        object.__setattr__(self, "warmup", check("warmup", self.warmup))
        if self.warmup < self.bins:
            raise ValueError(f"warmup must be at least bins = {self.bins}; got {self.warmup}")
        if self.bin_b_max is not None:
            lim = check("bin_b_max", self.bin_b_max)
            if lim.size != self.bins:
                raise ValueError(f"bin_b_max must have bins = {self.bins} entries; got {lim.size}")
            object.__setattr__(self, "bin_b_max", tuple(int(v) for v in lim))

    def describe(self) -> dict:
        d = super().describe()
        d.update(policy=self.kind, bins=self.bins, selection=self.selection, warmup=self.warmup)
        if self.bin_edges != "warmup":
            d["bin_edges"] = self.bin_edges
        if not isinstance(self.predictor, Oracle):
            d.update(self.predictor.describe())
        return d

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "MultiBinDynamic":
        """A cell's multi-bin dynamic batching: its bins, controller, memory,
        selection rule, warm-up, edges and predictor."""
        return cls(bins=params["bins"], controller=controller_from_spec(params), memory=memory_from_spec(params),
                   selection=params["selection"], warmup=params["warmup"], predictor=predictor_from_spec(params),
                   bin_edges=params["bin_edges"])

    def event_config(self) -> EventPolicy:
        """Algorithm 5 with Algorithm 3 (``FORM_MULTIBIN_DYNAMIC``): the
        warm-up of Algorithm 6 unless the edges are set before the run."""
        c = self.controller
        return EventPolicy(formation=FORM_MULTIBIN_DYNAMIC, bins=self.bins, b_max=c.b_max, pin=self.pin or 0,
                           max_candidates=self.max_candidates or c.b_max, selection=SELECTIONS[self.selection],
                           warmup=self.warmup if self.bin_edges == "warmup" else 0, memory_on=self.memory.enabled,
                           sla=c, memory=self.memory, predictor=self.predictor,
                           bin_b_max=None if self.bin_b_max is None else np.array(self.bin_b_max, dtype=float),
                           controlled=True, preset="" if self.bin_edges == "warmup" else self.bin_edges)
