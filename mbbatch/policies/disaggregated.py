"""Prefill/decode disaggregation: a pool of prefill engines, the KV cache
moved over a link, a pool of decode engines (Patel et al., 2024, Splitwise,
arXiv:2311.18677; Zhong et al., 2024, DistServe, arXiv:2401.09670)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from .._validation import check_count, check_fields, check_instance, check_scalar_real
from ..params import Domain, default
from .base import Carries, ComposedSettings, Policy, declaring
from .cluster import checked_events, programs_of, refuse_events

__all__ = ["Disaggregated", "KVTransfer"]


@dataclass(frozen=True, eq=False)
class KVTransfer:
    """The link that moves a request's KV cache from its prefill engine to
    its decode engine: a prompt of ``p`` tokens takes
    ``latency + p x bytes_per_token / bandwidth`` seconds.

    ``bytes_per_token`` is the KV cache of one token, keys and values of
    every layer: ``2 x layers x kv_heads x head_dim x dtype bytes``
    (:meth:`of_model`); the default, 131,072 bytes, is Llama-3-8B's (32
    layers, 8 KV heads of 128, 16-bit).  The default ``bandwidth``, 25 GB/s,
    is a 200 Gb/s InfiniBand (HDR) link between machines; a transfer
    within a machine over NVLink is an order of magnitude faster.  Each
    transfer has the link to itself (transfers do not share bandwidth).
    ``bytes_per_token=0`` moves the cache in ``latency`` alone: with LAPS's
    prefill instances, the deployment is then :class:`LAPS` with that
    decode stage, bit for bit (LAPS's decode stage receives the cache for
    free)."""

    bandwidth: float = default("KVTransfer.bandwidth")
    latency: float = default("KVTransfer.latency")
    bytes_per_token: float = default("KVTransfer.bytes_per_token")

    def __post_init__(self):
        check_fields(self, {"bandwidth": "KVTransfer.bandwidth", "latency": "KVTransfer.latency",
                            "bytes_per_token": "KVTransfer.bytes_per_token"})

    @classmethod
    def of_model(cls, layers: int, kv_heads: int, head_dim: int, dtype_bytes: float = 2.0, **link) -> "KVTransfer":
        """The transfer of a model's KV cache: ``layers`` layers of
        ``kv_heads`` key-value heads of ``head_dim`` each, ``dtype_bytes`` a
        value (2: 16-bit), keys and values; ``link``: ``bandwidth``,
        ``latency``.

        >>> KVTransfer.of_model(80, 8, 128).bytes_per_token    # Llama-3-70B
        327680.0
        """
        count, positive = Domain(1, math.inf, lo_closed=True), Domain(0, math.inf)
        sizes = [check_count(name, v, count) for name, v in (("layers", layers), ("kv_heads", kv_heads),
                                                            ("head_dim", head_dim))]
        value = check_scalar_real("dtype_bytes", dtype_bytes, positive)
        return cls(bytes_per_token=float(2 * sizes[0] * sizes[1] * sizes[2] * value), **link)

    def seconds(self, prompt):
        """The transfer time of prompts of ``prompt`` tokens (an array or a number), s."""
        return self.latency + prompt * (self.bytes_per_token / self.bandwidth)

    def describe(self) -> dict:
        return {"kv_bandwidth": self.bandwidth, "kv_latency": self.latency,
                "kv_bytes_per_token": self.bytes_per_token}


@dataclass(frozen=True, eq=False)
class Disaggregated(Policy):
    """Prefill/decode disaggregation (Patel et al., 2024, Splitwise,
    arXiv:2311.18677; Zhong et al., 2024, DistServe, arXiv:2401.09670):
    ``prefill_engines`` engines running ``prefill`` compute each request's
    prompt and first token, its KV cache moves over ``kv_transfer``
    (:class:`KVTransfer`), and ``decode_engines`` engines running ``decode``
    generate the rest of its output.

    Both pools are :class:`ContinuousBatching` engines (default
    ``ContinuousBatching()``), timed by the ``service_model`` of the
    ``simulate`` call (an :class:`~mbbatch.IterationModel` or a profile),
    the decode pool by ``decode_model`` where given (another accelerator).
    The prefill pool may instead be :class:`LAPS`'s prefill instances
    (``prefill=LAPS(instances=k)``, without a decode stage of its own: the
    deployment's decode pool is it), scheduled and routed by LAPS's rules
    (arXiv:2601.11589) and timed by the service model's prefill iteration;
    the pool's engines are then LAPS's ``instances`` (``prefill_engines``
    left at its default, or equal to them) and its ``router`` LAPS's own;
    it takes ``programs`` as continuous engines do (in a closed loop a
    batch's end gives its calls their first tokens, with no time outside
    the instances).

    - a request arrives at the prefill pool, whose ``router``
      (``"least_used"``, ``"round_robin"``, ``"cache_aware"``; a
      :class:`Cluster`'s, with its default balance) sends it to an engine;
      there it is a request of one output token, done at its first token,
      whose KV blocks are freed then (with ``prefill=ContinuousBatching(
      prefix_caching=True)`` its prompt's full blocks stay cached, and a
      workload's system prompts are prefilled once on each engine: the
      ``prefix`` metrics are the prefill pool's; with ``programs``,
      :class:`Programs` or a trace's :class:`Sessions`, the requests are
      their calls, as a :class:`Cluster`'s, each call's context in its
      prompt: a prefix a caching engine keeps; in a closed loop, a call
      arrives its think time after its client has the answer to the one
      before it, from the decode pool: its last token plus the decode
      engine's ``request_overhead``, or for a one-token call its first
      token plus the prefill engine's; both pools then run in one loop,
      :mod:`mbbatch._kernels.disaggregated`);
    - it joins the decode pool at its first token, sent by the pool's
      ``decode_router``: ``"round_robin"`` (default) deals the requests to
      the decode engines in turn in the order of their first tokens (as
      LAPS's decode instances), ``"least_used"`` to the engine with the
      fewest active requests at that instant (a :class:`Cluster`'s rule);
      it waits in the engine's queue until the engine admits it (its
      blocks free, fewer than ``max_num_seqs`` running), which then pulls
      its KV cache, its whole prompt's (system prompt included), taking
      :meth:`KVTransfer.seconds` of its prompt, as vLLM's KV connectors do
      (the decode side's ``WAITING_FOR_REMOTE_KVS``): the request holds
      its blocks and a slot meanwhile, and decodes its other ``output - 1``
      tokens from the first iteration after the cache lands (a one-token
      request is done at its first token and never reaches it);
    - its prefill engine holds its KV blocks from its first token until the
      pull lands (DistServe's prefill instances, and vLLM's with a KV
      connector, free them once the decode side has read them), so a
      decode pool that falls behind keeps the prefill engines' memory
      taken and later prompts wait for it.  The pools are run one after
      the other, then tested: where the held blocks could have kept a
      prompt waiting, the prefill pool runs again with the landings as
      its releases, or both pools run in one loop (the decode engine
      starting a pull sets its landing).  The held
      blocks are not counted in the prefill pool's KV usage
      (``mean_kv_usage`` and ``kv_blocks`` count the blocks of the requests
      an engine runs).  Not with prefix caching on the prefill engines,
      whose blocks go back to their cache at the first token, nor on
      LAPS's instances, which model no KV blocks.

    ``prefill_events`` and ``decode_events`` (:class:`EngineEvent`, the
    engines numbered within their pool) take engines out of a pool and
    bring them back, as a :class:`Cluster`'s events do on continuous
    engines: a leaving engine runs what it admitted to its end and hands
    the requests it had not admitted back to its pool's router, each
    routed again at that instant keeping its arrival (a decode request its
    KV cache, moved again at no cost).  A decode pool with events is a
    cluster behind its ``decode_router`` (``"round_robin"`` deals the
    requests in turn among the engines in the pool; in a closed loop its
    routing counts but the load imbalance, NaN).  A LAPS pool's instance
    leaving hands back the requests in its queues (the short queue's
    first), each routed again by LAPS's router as it arrives, to an
    instance of its group in the pool (of any, if none of its group is);
    the router's groups count the instances in the pool, and one back
    rejoins its group (the count is each request's ``prefill_engine``, not
    a metric: LAPS's result has no router metrics).

    Choices where the papers leave it open: the transfer starts when the
    decode engine admits the request, so a request that finds it full
    waits before its transfer, not after, its KV cache still held by its
    prefill engine; transfers do not share a link.

    The results: the latency end to end (arrival to last token), the time
    to first token (the prefill pool's), the time between tokens (the gaps
    between the tokens the decode pool generates), the mean transfer time
    and wait for a decode engine, each pool's utilization, and ``goodput``,
    DistServe's share of the requests within both the workload's
    ``ttft_slo`` and ``tpot_slo``, a request's time per output token
    ``(last token - first token) / (output - 1)`` counting its wait and
    its transfer; ``res.prefill`` and ``res.decode`` are the pools' own
    results.

    >>> import mbbatch as mb, scipy.stats as st
    >>> wl = mb.Workload(prompt=st.lognorm(0.8, scale=512), output=st.lognorm(0.8, scale=128))
    >>> pd = mb.Disaggregated(prefill_engines=1, decode_engines=2)
    >>> res = mb.simulate(pd, arrivals=mb.Poisson(4.0), workload=wl, n=2000, seed=1)
    >>> round(res.mean_transfer_time * 1e3, 2)      # ms, 131,072 bytes a token at 25 GB/s
    3.75
    """

    prefill: object = None
    decode: object = None
    prefill_engines: int = default("Disaggregated.prefill_engines")
    decode_engines: int = default("Disaggregated.decode_engines")
    kv_transfer: object = None
    router: str = default("Disaggregated.router")
    decode_model: object = None
    decode_router: str = default("Disaggregated.decode_router")
    programs: object = None
    prefill_events: tuple = ()
    decode_events: tuple = ()

    kind: ClassVar[str] = "disaggregated"
    planner: ClassVar[str] = "disaggregated"
    #: (a workload's system prompts: the prefill pool's engines run them, and with prefix_caching keep them)
    prefixes: ClassVar[bool] = True
    reports: ClassVar[frozenset] = frozenset({"run", "decode", "ttft", "ttft_quantiles", "tbt_quantiles", "goodput",
                                              "disaggregated", "prefix"})
    #: (its own keys, then its engines': every resumable engine's settings, both pools running them, less
    #: ``servers``: its pools' engines are prefill_engines and decode_engines)
    settings = ComposedSettings(("prefill_engines", "decode_engines", "prefill_router", "decode_router",
                                 "kv_bandwidth", "kv_latency", "kv_bytes_per_token", "programs", "calls",
                                 "think_time", "closed_loop", "session_context"), "resumable", leaves=("servers",))
    models: ClassVar[tuple] = ("iteration", "profile")
    #: (programs only where a spec asks for them: specs written before a deployment took them run none)
    spec_defaults: ClassVar[dict] = {"programs": "none"}

    def __post_init__(self):
        from .continuous import ContinuousBatching

        for name in ("prefill", "decode"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, ContinuousBatching())
        if not (isinstance(self.prefill, Policy) and self.prefill.prefill_stage):
            raise TypeError(f"prefill must be {' or '.join(declaring('prefill_stage'))} (the prefill pool's "
                            f"engines); got {type(self.prefill).__name__}")
        check_instance("decode", self.decode, (ContinuousBatching,))
        if self.laps:
            self._take_laps_pool()
        if self.kv_transfer is None:
            object.__setattr__(self, "kv_transfer", KVTransfer())
        check_instance("kv_transfer", self.kv_transfer, (KVTransfer,))
        check_fields(self, {"prefill_engines": "Disaggregated.prefill_engines",
                            "decode_engines": "Disaggregated.decode_engines", "router": "Disaggregated.router",
                            "decode_router": "Disaggregated.decode_router"})
        if self.decode_model is not None:
            from ..service_models import IterationModel

            check_instance("decode_model", self.decode_model, (IterationModel,))
        if self.programs is not None:
            self._take_programs()
        if self.decode.prefix_caching:
            raise ValueError("decode.prefix_caching: a decode engine receives each prompt's KV cache with its "
                             "request (its prefix cache, the prefill pool's, is not modelled); give the prefill "
                             "pool's engines prefix_caching=True and the decode pool's False")
        self._take_events()

    def _take_events(self) -> None:
        """Each pool's engine events, checked (:class:`EngineEvent`; a LAPS
        pool's engines its instances)."""
        object.__setattr__(self, "prefill_events", checked_events(self.prefill_events, self.prefill_engines,
                                                                  "prefill_events", "prefill_engines"))
        object.__setattr__(self, "decode_events", checked_events(self.decode_events, self.decode_engines,
                                                                 "decode_events", "decode_engines"))
        for pool in ("prefill", "decode"):
            if getattr(self, f"{pool}_events"):
                refuse_events(getattr(self, pool), f"{pool}_events")

    def _take_laps_pool(self) -> None:
        """A LAPS prefill pool: its engines are LAPS's instances, its router
        LAPS's; a decode stage of its own is refused (the deployment's
        decode pool is it)."""
        laps = self.prefill
        if laps.decode is not None:
            raise ValueError("prefill.decode: a LAPS prefill pool hands its requests to the deployment's decode "
                             "pool (decode=...); give LAPS(decode=None)")
        k = laps.instances
        if self.prefill_engines not in (default("Disaggregated.prefill_engines"), k):
            raise ValueError(f"prefill_engines: a LAPS prefill pool's engines are its instances "
                             f"(LAPS(instances={k})); leave prefill_engines at its default or give {k}; got "
                             f"{self.prefill_engines}")
        if self.router != default("Disaggregated.router"):
            raise ValueError(f"router: a LAPS prefill pool routes by LAPS's own rules (its threshold and instance "
                             f"groups); leave router at {default('Disaggregated.router')!r}; got {self.router!r}")
        object.__setattr__(self, "prefill_engines", k)

    def _take_programs(self) -> None:
        """Programs (or a trace's sessions) on continuous prefill engines; a
        closed loop's calls wait for their answers from the decode pool
        (both pools run in one loop: :mod:`mbbatch._kernels.disaggregated`),
        on a LAPS prefill pool too (an open loop's calls are LAPS's
        requests)."""
        from .cluster import Programs, Sessions

        check_instance("programs", self.programs, (Programs, Sessions))

    @property
    def laps(self) -> bool:
        """Whether the prefill pool is LAPS's prefill instances (its prefill
        policy's declared ``prefill_stage``)."""
        return self.prefill.prefill_stage == "laps"

    @property
    def engines(self) -> int:
        """The engines of both pools."""
        return self.prefill_engines + self.decode_engines

    def carries(self) -> Carries:
        """The decode engines' continuous batching: judged by the backlog, a
        probe holding what every engine of both pools holds."""
        # (a LAPS pool's carries every instance's)
        pool = self.prefill.carries().held * (1 if self.laps else self.prefill_engines)
        held = pool + self.decode_engines * self.decode.carries().held
        return Carries(load=False, backlog=True, held=held, iterations=True)

    def describe(self) -> dict:
        eng = {k: v for k, v in self.decode.describe().items() if k != "policy"}
        if getattr(self.prefill, "prefix_caching", False):
            eng["prefix_caching"] = True        # (the prefill pool's)
        laps = {f"prefill_{k}": v for k, v in self.prefill.describe().items()} if self.laps else {}
        programs = self.programs.describe() if self.programs is not None else {}
        events = {f"{pool}_events": len(ev) for pool, ev in (("prefill", self.prefill_events),
                                                            ("decode", self.decode_events)) if ev}
        return {**eng, "policy": self.kind, "prefill_engines": self.prefill_engines,
                "decode_engines": self.decode_engines, "router": "laps" if self.laps else self.router,
                "decode_router": self.decode_router,
                **laps, **programs, **events, **self.kv_transfer.describe()}

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "Disaggregated":
        """A cell's deployment: both pools' engines run the cell's
        ``ContinuousBatching`` settings (``prefix_caching`` the prefill
        pool's alone), the link its ``kv_*`` settings, its programs those of
        its ``programs`` key (a deployment's default: none)."""
        engine = ctx.build("continuous", params)
        link = KVTransfer(bandwidth=params["kv_bandwidth"], latency=params["kv_latency"],
                          bytes_per_token=params["kv_bytes_per_token"])
        return cls(prefill=engine, decode=replace(engine, prefix_caching=False),
                   prefill_engines=params["prefill_engines"],
                   decode_engines=params["decode_engines"], kv_transfer=link, router=params["prefill_router"],
                   decode_router=params["decode_router"],
                   programs=programs_of(params, ctx.trace))
