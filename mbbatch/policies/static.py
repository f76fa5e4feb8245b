"""Static batching: a fixed batch size from one FIFO, the baseline of the
dynamic-batching paper (Pang, Li and Wang, 2025, arXiv:2503.05248)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._kernels.formation import FORM_STATIC, SEL_ROUND_ROBIN
from .._validation import check_fields, check_instance
from ..params import default
from ..predictors import Oracle
from .base import Carries, EventPolicy, Policy, memory_kw

__all__ = ["StaticBatching"]


@dataclass(frozen=True, eq=False)
class StaticBatching(Policy):
    """The baseline: one FIFO; whenever a server is free and requests wait, it
    takes up to ``batch_size`` of them, without waiting for a full batch.

    Parameters
    ----------
    batch_size : int
        B, requests, >= 1.  Default 128.
    sla : SLAController, optional
        Only its ``d_sla`` and ``eps_d`` are used, to measure SLA violations;
        default ``SLAController()``.
    memory : Memory, optional
        Only its token capacity is used, to count batches above it (static
        batching never enforces it); default ``Memory()``.
    """

    batch_size: int = default("batch_size")
    sla: object = None
    memory: object = None

    kind: ClassVar[str] = "static"
    planner: ClassVar[str] = "tokens"
    reports: ClassVar[frozenset] = frozenset({"run", "batch_means", "tokens", "decode", "ttft", "ttft_quantiles",
                                              "tbt_quantiles", "goodput"})
    settings: ClassVar[tuple] = ("batch_size", "d_sla", "eps_d", "eta", "ttft_slo", "tpot_slo", "servers")
    engine: ClassVar[bool] = True
    decode_stage: ClassVar[bool] = True

    def __post_init__(self):
        from ..controller import Memory, SLAController

        check_fields(self, {"batch_size": "batch_size"})
        object.__setattr__(self, "sla", check_instance("sla", self.sla, SLAController, SLAController))
        object.__setattr__(self, "memory", check_instance("memory", self.memory, Memory, Memory))

    def carries(self) -> Carries:
        """Batches of up to ``batch_size`` of whatever waits: near its limit
        the server is always busy and its batches grow with the backlog, so
        the load is 1 over a range of rates below it and the backlog decides
        (see :class:`~mbbatch.policies.base.Carries`)."""
        return Carries(load=False, backlog=True, held=self.batch_size)

    def describe(self) -> dict:
        return {"policy": self.kind, "batch_size": self.batch_size, "d_sla": self.sla.d_sla,
                "eps_d": self.sla.eps_d, "eta": self.memory.eta}

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "StaticBatching":
        """A cell's static batching: ``batch_size``, its D_SLA and eps_D (for
        the SLA metrics) and its token capacity ``eta`` (counted, not enforced;
        unset: the default)."""
        from ..controller import Memory, SLAController

        eta = params.get("eta")
        return cls(params["batch_size"], sla=SLAController(d_sla=params["d_sla"], eps_d=params["eps_d"]),
                   memory=Memory(enabled=False, **(memory_kw(eta) if eta is not None else {})))

    def event_config(self) -> EventPolicy:
        """Up to ``batch_size`` from the head of one FIFO (``FORM_STATIC``)."""
        B = self.batch_size
        return EventPolicy(formation=FORM_STATIC, bins=1, b_max=B, pin=B, max_candidates=B,
                           selection=SEL_ROUND_ROBIN, warmup=1, memory_on=False, sla=self.sla, memory=self.memory,
                           predictor=Oracle())
