"""LAPS, length-aware prefill scheduling (arXiv:2601.11589): prefill
instances behind its router, and a decode stage."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from .._validation import check, check_fields, check_flag, check_instance
from ..params import default
from .base import Carries, Policy, declaring

__all__ = ["LAPS"]


@dataclass(frozen=True, eq=False)
class LAPS(Policy):
    """LAPS, length-aware prefill scheduling ("LAPS: Length-Aware Prefill
    Scheduling", 2026, arXiv:2601.11589), on ``instances``
    prefill instances behind its router.

    A request of at most ``threshold`` prompt tokens is short, a longer one
    long.  The router (``dynamic``) keeps a short and a long group of
    instances (the ``long_instances`` highest ids long at first) and sends a
    request to the instance of its group with the fewest outstanding
    requests, ties to the lowest id; on each routing decision, at most once
    per ``interval`` s, it moves one instance toward the group whose pending
    requests exceed ``ratio`` times the other's (each group keeps one).
    Without ``dynamic``, or with one instance, every instance serves both.

    Each instance runs one prefill batch at a time, of at most ``max_batch``
    requests and ``max_batch_tokens`` prompt tokens (its first request always
    joins).  With ``dual_queue``, short requests go first: a short batch
    starts once the oldest short request has waited ``window`` s or
    ``max_batch`` are queued (window 0: at once); meanwhile long requests
    run.  Without it, one FIFO queue.  The batch takes
    :class:`~mbbatch.PrefillModel` time; at its end its requests have their
    first token.

    Decode runs on separate instances: with ``decode`` (a token-level
    policy: :class:`StaticBatching`, :class:`DynamicBatching` or
    :class:`MultiBinDynamic`) each request joins it when its prefill ends,
    its output drawn from the workload's output lengths, and is served by
    one of ``decode_servers`` servers under ``decode_model`` (default
    ``DecodeModel(prefill_per_token=0)``: the KV cache arrives with the
    request, so decode prefills nothing again).  With
    ``decode=ContinuousBatching(...)`` the decode instances are
    continuous-batching engines (``decode_servers`` of them, the requests
    dealt in turn), as LAPS's decode instances are vLLM engines: a request
    brings its prompt's KV cache, takes its blocks and decodes from the
    iteration that admits it (a preempted one prefills again), its
    iterations timed by ``decode_model`` (an
    :class:`~mbbatch.IterationModel`, default ``IterationModel()``).  A request's latency is then
    end to end, arrival to last token (throughput and span too); the TTFT,
    utilization and batch metrics stay the prefill instances';
    ``res.decode`` is the decode stage's own result.  Without ``decode`` a
    request's latency is its time to first token.

    ``goodput`` is the share of the requests within the workload's
    objectives (Zhong et al., 2024, DistServe, arXiv:2401.09670; NaN where
    it sets neither).  Without ``decode`` a request ends at its first token
    and has no time per output token: goodput counts ``ttft_slo`` alone, and
    a workload with ``tpot_slo`` is refused (a ValueError naming it) rather
    than reported as if it were met.  With ``decode`` it counts both, per
    request: the time to first token, the prefill's, within ``ttft_slo``, and
    ``(last token - first token) / (output - 1)``, from the prefill's first
    token to the decode stage's last (the wait for the decode stage
    included; none for a single token), within ``tpot_slo``.

    With a ``ContinuousBatching`` decode stage, LAPS is, bit for bit, a
    :class:`Disaggregated` deployment of its instances and
    ``decode_servers`` decode engines over a link that moves the KV cache in
    no time (``kv_transfer=KVTransfer(bytes_per_token=0)``): programs, open
    or closed loop, and instances leaving and joining run there
    (``programs=``, ``prefill_events=``).

    ``dual_queue=False, dynamic=False`` is one FIFO queue per instance;
    ``window=0`` the dual queue alone.  The parameter table gives the
    defaults: the LAPS paper's (256 tokens, 5 ms, 8 requests, 5 s, 2.0).
    """

    instances: int = default("LAPS.instances")
    threshold: int = default("LAPS.threshold")
    window: float = default("LAPS.window")
    max_batch: int = default("LAPS.max_batch")
    max_batch_tokens: float = default("LAPS.max_batch_tokens")
    dual_queue: bool = default("LAPS.dual_queue")
    dynamic: bool = default("LAPS.dynamic")
    interval: float = default("LAPS.interval")
    ratio: float = default("LAPS.ratio")
    long_instances: Optional[int] = None
    decode: object = None
    decode_servers: int = default("LAPS.decode_servers")
    decode_model: object = None

    kind: ClassVar[str] = "laps"
    planner: ClassVar[str] = "laps"
    prefill_stage: ClassVar[str] = "laps"
    reports: ClassVar[frozenset] = frozenset({"run", "ttft", "ttft_quantiles", "decode", "tbt_quantiles", "laps",
                                              "goodput"})
    settings: ClassVar[tuple] = ("instances", "laps_threshold", "window", "max_batch", "max_batch_tokens",
                                 "dual_queue", "dynamic", "interval", "ratio", "long_instances", "decode",
                                 "decode_servers", "decode_batch_size", "decode_bins", "decode_d_sla", "decode_b_max",
                                 "decode_eta", "decode_model_beta", "decode_model_gamma", "ttft_slo", "tpot_slo")
    models: ClassVar[tuple] = ("prefill",)
    spec_names: ClassVar[dict] = {"decode.kv_tokens": "decode_eta"}

    def __post_init__(self):
        check_fields(self, {"instances": "LAPS.instances", "threshold": "LAPS.threshold", "window": "LAPS.window",
                            "max_batch": "LAPS.max_batch", "max_batch_tokens": "LAPS.max_batch_tokens",
                            "interval": "LAPS.interval", "ratio": "LAPS.ratio",
                            "long_instances": "LAPS.long_instances", "decode_servers": "LAPS.decode_servers"})
        if self.decode is not None and not (isinstance(self.decode, Policy) and self.decode.decode_stage):
            raise TypeError(f"decode must be {' or '.join(declaring('decode_stage'))} (the decode instances' "
                            f"batching) or None; got {type(self.decode).__name__}")
        if self.decode is None and self.decode_model is not None:
            raise TypeError("decode_model is the decode stage's service model: pass decode= too")
        if self.decode_model is not None:
            from ..service_models import CalibratedModel, DecodeModel, IterationModel, LinearModel, MaxModel

            check_instance("decode_model", self.decode_model, (MaxModel, LinearModel, DecodeModel, CalibratedModel,
                                                               IterationModel))
        object.__setattr__(self, "dual_queue", check_flag("dual_queue", self.dual_queue))
        object.__setattr__(self, "dynamic", check_flag("dynamic", self.dynamic))
        if self.long_instances is None:
            object.__setattr__(self, "long_instances", max(1, self.instances // 3))
        elif self.instances >= 2 and not self.long_instances <= self.instances - 1:
            raise ValueError(f"long_instances must be in [1, instances - 1 = {self.instances - 1}] (each group "
                             f"keeps one instance); got {self.long_instances}")

    bins = 1

    @property
    def routed(self) -> bool:
        """Whether the router keeps groups (dynamic, and two instances at least)."""
        return self.dynamic and self.instances >= 2

    def carries(self) -> Carries:
        """The prefill instances' batches, each holding its instance to
        completion; with a decode stage the load covers the prefill only, so
        the throughput and the backlog decide every probe too."""
        return Carries(load=True, backlog=self.decode is not None, held=self.instances * self.max_batch)

    def describe(self) -> dict:
        return {"policy": self.kind, "instances": self.instances, "threshold": self.threshold, "window": self.window,
                "max_batch": self.max_batch, "max_batch_tokens": self.max_batch_tokens,
                "dual_queue": self.dual_queue, "dynamic": self.dynamic, "interval": self.interval,
                "ratio": self.ratio, "long_instances": self.long_instances if self.routed else 0,
                **({"decode_policy": self.decode.kind, "decode_servers": self.decode_servers}
                   if self.decode is not None else {})}

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "LAPS":
        """A cell's LAPS: its instances and router, and its decode stage
        (``decode``, a kind whose ``decode_*`` settings are its own: eta
        tokens of KV capacity (the parameter table's by default), one GB a
        token as for the token policies' cells, the other settings at their
        defaults) under a
        :class:`~mbbatch.DecodeModel` without prefill (the KV cache comes with
        the request); a ``"continuous"`` stage runs ``decode_b_max`` sequences
        at most on ``decode_eta`` KV tokens (inf without), timed by the
        default :class:`~mbbatch.IterationModel`."""
        stage = {}
        kind = params["decode"]
        if kind != "none":
            if kind == "static" and params["decode_batch_size"] is None:
                raise ValueError("decode = \"static\" needs decode_batch_size (requests per decode batch)")
            from ..service_models import DecodeModel, IterationModel

            own = {key: default(key) for key in _DECODE_DEFAULTS}
            # (a memory-aware stage without decode_eta: the parameter table's eta, as the API's Memory())
            eta = params["decode_eta"]
            own.update(batch_size=params["decode_batch_size"], bins=params["decode_bins"],
                       d_sla=params["decode_d_sla"], b_max=params["decode_b_max"],
                       eta=default("eta") if eta is None and kind not in ("static", "continuous") else eta)
            if kind == "continuous":
                # the engines' running sequences at most and KV cache (inf without decode_eta), timed by the
                # default IterationModel
                # (decode_eta is their kv_tokens: refused in its domain under the spec's name)
                own.update(max_num_seqs=params["decode_b_max"],
                           kv_tokens=math.inf if eta is None else check("kv_tokens", eta, "decode_eta"))
                model = IterationModel()
            else:
                model = DecodeModel(beta=params["decode_model_beta"], gamma=params["decode_model_gamma"],
                                    prefill_per_token=0.0)
            stage = {"decode": ctx.build(kind, own), "decode_servers": params["decode_servers"],
                     "decode_model": model}
        return cls(instances=params["instances"], threshold=params["laps_threshold"], window=params["window"],
                   max_batch=params["max_batch"], max_batch_tokens=params["max_batch_tokens"],
                   dual_queue=params["dual_queue"], dynamic=params["dynamic"], interval=params["interval"],
                   ratio=params["ratio"], long_instances=params["long_instances"], **stage)


#: a decode stage's settings that LAPS's spec keys leave at their defaults
_DECODE_DEFAULTS = ("eps_d", "b_min", "controller", "memory", "eps_m", "selection", "warmup", "bin_edges",
                    "predictor_sigma", "predictor_p")
