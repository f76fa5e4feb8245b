"""Shortest-predicted-first batching: shortest job first on predicted output
lengths, a batch at a time, with a starvation guard.  The length-aware
baseline of multi-bin batching (Guldogan et al., 2024, arXiv:2412.04504),
which sorts requests into k bins by predicted length instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._kernels.formation import SEL_ROUND_ROBIN
from .._kernels.spf import FORM_SPF, scratch_size
from .._validation import check_fields, check_instance
from ..params import default
from ..predictors import BinConfusion, Oracle, as_predictor
from .base import Carries, EventPolicy, Policy, memory_kw

__all__ = ["ShortestPredictedFirst"]


@dataclass(frozen=True, eq=False)
class ShortestPredictedFirst(Policy):
    """Shortest predicted output first, in batches: whenever a server is
    free and requests wait, it takes the ``batch_size`` waiting requests
    with the smallest predicted output lengths (ties in arrival order),
    without waiting for a full batch; each is served for its true length
    under the service model.  A request that has waited ``max_wait`` s or
    more goes first (oldest first): long requests do not starve.

    Multi-bin batching is its coarse cousin: it sorts requests into ``k``
    bins by predicted length and batches within a bin; with an oracle and
    ever more bins its batches approach these (a saturated server's
    throughput converges to this policy's).  ``max_wait=0`` is static
    batching (every request is old enough to go first, in arrival order).

    Choosing a batch scans the waiting requests: its cost grows with the
    backlog, so an overloaded run (whose backlog grows with ``n``) costs
    about ``n^2 / B`` steps; 196,647 requests of a trace at ``B = 2``, far
    beyond the server, take 97 s where a stable run takes a second.

    Parameters
    ----------
    batch_size : int
        B, requests, >= 1.  Default 128.
    max_wait : float
        A request that has waited this long, s, goes first; default inf
        (never: pure shortest-predicted-first).
    predictor : Oracle, LogNormalError or Predictions, optional
        What requests are sorted by (:mod:`mbbatch.predictors`); default the
        oracle, or the workload's ``predictor_sigma``.  Bin confusion moves
        requests between bins and has no meaning without bins: refused.
    sla : SLAController, optional
        Only its ``d_sla`` and ``eps_d`` are used, to measure SLA violations.
    memory : Memory, optional
        Only its token capacity is used, to count batches above it (never
        enforced).
    """

    batch_size: int = default("batch_size")
    max_wait: float = default("max_wait")
    predictor: object = None
    sla: object = None
    memory: object = None

    kind: ClassVar[str] = "spf"
    planner: ClassVar[str] = "tokens"
    reports: ClassVar[frozenset] = frozenset({"run", "batch_means", "tokens", "decode", "ttft", "ttft_quantiles",
                                              "tbt_quantiles", "goodput"})
    settings: ClassVar[tuple] = ("batch_size", "max_wait", "predictor_sigma", "d_sla", "eps_d", "eta", "ttft_slo",
                                 "tpot_slo", "servers")
    engine: ClassVar[bool] = True

    def __post_init__(self):
        from ..controller import Memory, SLAController

        check_fields(self, {"batch_size": "batch_size", "max_wait": "max_wait"})
        predictor = as_predictor(self.predictor)
        if isinstance(predictor, BinConfusion):
            raise TypeError("predictor: ShortestPredictedFirst sorts requests by their predicted lengths; bin "
                            "confusion moves requests between bins, which it has none of: use mb.Oracle(), "
                            "mb.LogNormalError(sigma) or mb.Predictions(values)")
        object.__setattr__(self, "predictor", predictor)
        object.__setattr__(self, "sla", check_instance("sla", self.sla, SLAController, SLAController))
        object.__setattr__(self, "memory", check_instance("memory", self.memory, Memory, Memory))

    def carries(self) -> Carries:
        """Batches of up to ``batch_size`` of whatever waits: near its limit
        the server is always busy and its batches grow with the backlog, so
        the load is 1 over a range of rates below it and the backlog decides
        (see :class:`~mbbatch.policies.base.Carries`)."""
        return Carries(load=False, backlog=True, held=self.batch_size)

    def describe(self) -> dict:
        d = {"policy": self.kind, "batch_size": self.batch_size,
             "max_wait": "inf" if self.max_wait == float("inf") else self.max_wait, "d_sla": self.sla.d_sla,
             "eps_d": self.sla.eps_d, "eta": self.memory.eta}
        if not isinstance(self.predictor, Oracle):
            d.update(self.predictor.describe())
        return d

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "ShortestPredictedFirst":
        """A cell's policy: its batch size, maximum wait, log-normal predictor
        (``predictor_sigma``), D_SLA and token capacity."""
        from ..controller import Memory, SLAController
        from ..predictors import LogNormalError

        eta = params.get("eta")
        sigma = params["predictor_sigma"]
        return cls(params["batch_size"], max_wait=params["max_wait"],
                   predictor=LogNormalError(sigma) if sigma > 0 else None,
                   sla=SLAController(d_sla=params["d_sla"], eps_d=params["eps_d"]),
                   memory=Memory(enabled=False, **(memory_kw(eta) if eta is not None else {})))

    def event_config(self) -> EventPolicy:
        """Up to ``batch_size`` of one FIFO, the oldest past ``max_wait``
        then the smallest predictions (``FORM_SPF``)."""
        B = self.batch_size
        return EventPolicy(formation=FORM_SPF, bins=1, b_max=B, pin=B, max_candidates=B, selection=SEL_ROUND_ROBIN,
                           warmup=1, memory_on=False, sla=self.sla, memory=self.memory, predictor=self.predictor,
                           max_wait=self.max_wait, scratch=scratch_size(B))
