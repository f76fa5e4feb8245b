"""Continuous (iteration-level) batching: the engine vLLM, SGLang and
TensorRT-LLM serve with, on paged KV memory, with chunked prefill and
preemption by recomputation (:mod:`mbbatch._kernels.continuous`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .._validation import DOMAINS, check_fields, check_instance, check_real_array
from ..params import default
from ..predictors import BinConfusion, Oracle, as_predictor
from .base import Carries, Policy, controller_from_spec

__all__ = ["ContinuousBatching"]


@dataclass(frozen=True, eq=False)
class ContinuousBatching(Policy):
    """An engine that batches at every iteration (Yu et al., 2022, "Orca: a
    distributed serving system for transformer-based generative models",
    OSDI; Kwon et al., 2023, "Efficient memory management for large language
    model serving with PagedAttention", arXiv:2309.06180).

    Each iteration, every running sequence whose prompt is prefilled decodes
    one token, and waiting requests are admitted while fewer than
    ``max_num_seqs`` run and the KV memory holds their prompt and first
    token:

    - ``chunked_prefill=True`` (Agrawal et al., 2024, Sarathi-Serve,
      arXiv:2403.02310; vLLM's V1 scheduler): the decodes count one token
      each against the iteration's ``max_batched_tokens``; prompts being
      prefilled take chunks of the rest in admission order, then newly
      admitted requests, so a prompt may span several iterations;
    - ``chunked_prefill=False`` (Orca's and vLLM's V0 scheduler): an
      iteration that can admit the waiting head prefills whole prompts (as
      many as ``max_batched_tokens``, the count and the memory allow) and
      pauses the decodes; otherwise it decodes.

    KV memory holds ``kv_tokens`` tokens in blocks of ``block_size``; a
    sequence holds the blocks of its prompt and generated tokens.  When the
    decodes need a block and none is free, the most recently admitted
    running sequence is preempted (recompute: its blocks freed, it returns to
    the head of the queue, the last preempted first, and its prompt and
    generated tokens are prefilled again when it resumes).  A run with a
    request the engine could never finish is refused before it starts (a
    ValueError naming the first such request): its prompt and output exceed
    ``kv_tokens`` in whole blocks, or, without chunked prefill, one
    iteration's ``max_batched_tokens`` cannot prefill it (prompt + output - 1
    tokens with finite ``kv_tokens``, since a preempted request prefills its
    generated tokens again; the prompt alone with infinite).

    Admission order (``admission``): ``"fcfs"``; ``"spf"``, the smallest
    predicted output first (ties in arrival order); ``"multibin"``, ``bins``
    first-come-first-served queues by predicted output (between the
    workload's output quantiles at equal mass, or ``edges`` in tokens)
    served round robin; ``"edf"``, earliest deadline first; ``"vtc"``, fair
    sharing across request classes.  Admission stops at the first waiting
    request that does not fit (no request overtakes the head).

    An iteration takes the :class:`~mbbatch.IterationModel`'s time of what
    it does: ``step``, plus ``prefill_per_token`` per prompt token
    prefilled, ``per_sequence`` per sequence decoded and
    ``per_context_token`` per context token those sequences attend over.
    The model's ``setup`` (a batch's, once when it starts: scheduling,
    admission) is not paid: the engine never starts a batch.  (Charged at
    every iteration that admits, the A100 profile's 95 ms would dominate its
    iterations.)

    Run with ``servers = c`` (:func:`~mbbatch.simulate`), it is ``c``
    independent engines, request ``r`` going to engine ``r mod c`` (round
    robin at arrival, a load balancer in front of data-parallel replicas);
    the metrics are the engines' together (``mean_running``,
    ``mean_kv_usage`` and ``mean_max_num_seqs`` per engine).

    With ``controller`` (an :class:`~mbbatch.SLAController`), the dynamic
    batching controller sets the running sequences' cap during the run, as
    the vLLM patch of Pang, Li and Wang (2025, arXiv:2503.05248) sets
    ``max_num_seqs``: before every iteration Algorithm 2's b_SLA with
    ``N_decode`` the running sequences, at most Algorithm 1's b_mem (the
    ``memory``, by default the L0 rule on the engine's own ``kv_tokens``
    when finite), at most ``max_num_seqs`` (the engine's slots: a
    ``controller.b_max`` above it is cut to it); after every iteration
    Algorithm 7 with the iteration as the batch, its time the latency signal
    (the time between tokens of its decodes), and the requests it completed
    as the length statistics' batch.  A cap below the running sequences
    admits nothing and preempts nothing.

    Parameters
    ----------
    max_num_seqs : int
        Running sequences at most, >= 1; default 256 (vLLM's).
    max_batched_tokens : int
        Tokens an iteration processes at most (decodes one each, prefill
        chunks), >= max_num_seqs with chunked prefill; default 2048 (vLLM's
        with chunked prefill).
    chunked_prefill : bool
        Chunked prefill mixed with decodes (default), or whole prompts in
        iterations of their own.
    kv_tokens : float
        KV cache capacity, tokens, > 0; default inf (memory never binds; an
        H100 of 80 GB serving Llama-3-8B in vLLM holds about 4e5).
    block_size : int
        Tokens per KV block, >= 1; default 16 (vLLM's).
    admission : {"fcfs", "spf", "multibin", "edf", "vtc", "mlfq"}
        The order waiting requests are admitted in (each declared in
        :mod:`mbbatch._kernels.admission`): first come first served,
        shortest predicted output first, multi-bin, earliest deadline
        first (a request's deadline its arrival plus its class's
        ``ttft_slo``: :meth:`Workload.mixture`, or the workload's), or fair
        sharing across the request classes (each class a client) by virtual
        token counters (Sheng et al., 2024, "Fairness in serving large
        language models", OSDI, arXiv:2401.00588: a prompt token counts 1,
        a generated token 2; the earliest request of the client served
        least is admitted next).  With one class, both are first come first
        served.  ``"mlfq"``: the skip-join multi-level feedback queue of
        FastServe (Wu et al., 2023, "Fast distributed inference serving for
        large language models", arXiv:2305.05920), which needs no
        prediction: ``levels`` queues, level l's quantum ``quantum x 2^l``
        decode tokens (the last level's unbounded); a request starts at the
        first level whose quantum is at least its prefill's time in its
        decode iterations', the head of the first non-empty level is
        admitted, and a running sequence whose quantum ends goes down a
        level and is preempted (its KV cache recomputed on resumption) if
        a request of a higher level waits that the engine cannot admit
        beside it (``max_num_seqs`` running, or too few free blocks).
    bins : int
        Bins of ``admission="multibin"``, >= 1; default 4.
    aging : float
        Shortest predicted output first with aging (``admission="spf"``):
        a waiting request's priority is its predicted output minus
        ``aging`` times the time it has waited (tokens/s, >= 0; default 0,
        none), the rule of Fu et al. (2024, "Efficient LLM scheduling by
        learning to rank", arXiv:2408.15792).  The waiting requests keep
        their order between arrivals (each one's priority falls at the same
        rate), so the order is that of ``prediction + aging x arrival``;
        a request is admitted before every request that arrives more than
        ``prediction / aging`` seconds after it (the starvation bound:
        plain shortest-first has none).
    quantum : int
        The feedback queue's first quantum (``admission="mlfq"``), decode
        tokens, >= 1; default 16.
    levels : int
        Its levels, 1 to 32; default 4 (1: first come first served).
    edges : sequence of float, optional
        Its ``bins - 1`` inner edges, tokens of predicted output, ascending.
    predictor : Oracle, LogNormalError or Predictions, optional
        What ``"spf"`` and ``"multibin"`` order by; default the oracle, or
        the workload's ``predictor_sigma``.
    controller : SLAController, optional
        Algorithms 2 and 7 set the cap on running sequences; default none
        (``max_num_seqs`` throughout).
    memory : Memory, optional
        Algorithm 1's memory under a controller; default the L0 rule on
        ``kv_tokens`` (none when it is inf); ``Memory(enabled=False)``: none.
    iteration_overhead : float
        Time every iteration pays beyond the model's forward time, s, >= 0
        (the scheduler, sampling, the CPU side: vLLM's per-step overhead),
        paid as part of its fixed time (the model's ``step`` plus it);
        default 0.
    request_overhead : float
        Time added to every request's time to first token and latency
        outside the engine, s, >= 0 (the API server, tokenization,
        detokenization: a constant delay, so it shifts those metrics and
        changes nothing inside the engine); default 0.
    num_scheduler_steps : int
        Iterations one scheduling decision runs, 1 to 1024 (vLLM's multi-step
        scheduling, ``--num-scheduler-steps``); default 1.  With k > 1 the
        iterations come in blocks of k: the first schedules as above, the
        other k - 1 only decode the running sequences (no request is
        admitted, no prompt chunk runs), and a block returns the tokens it
        made at its end, so a request's first token and its last wait for
        the end of the block that made them; a block whose sequences are
        all done or preempted ends early.  The time between tokens is the
        engine's, iteration to iteration.
    prefix_caching : bool
        Keep KV blocks by content, as vLLM's automatic prefix caching does
        (Kwon et al., 2023; SGLang's RadixAttention, Zheng et al., 2024,
        arXiv:2312.07104); default False.  A request's prompt blocks that
        an earlier request of its shared prefix (a
        :class:`~mbbatch.SystemPrompts` system prompt) left in memory are
        not prefilled again; a cached block no running sequence holds is
        evictable, and when the memory runs short the least recently used
        are evicted before any sequence is preempted.  The rules, and the
        choices they make where the engines differ, are
        :mod:`mbbatch._kernels.continuous`'s.  Reported: ``prefix_hit_rate``,
        ``prefix_saved_tokens`` and ``kv_evictions``.

    :mod:`mbbatch.engines` gives the settings of released engines, and
    :func:`mbbatch.validation.calibrate` fits the two overheads to measured
    serving runs.
    """

    max_num_seqs: int = default("max_num_seqs")
    max_batched_tokens: int = default("max_batched_tokens")
    chunked_prefill: bool = default("chunked_prefill")
    kv_tokens: float = default("kv_tokens")
    block_size: int = default("block_size")
    admission: str = default("admission")
    bins: int = default("ContinuousBatching.bins")
    aging: float = default("aging")
    quantum: int = default("mlfq_quantum")
    levels: int = default("mlfq_levels")
    edges: tuple | None = None
    predictor: object = None
    controller: object = None
    memory: object = None
    iteration_overhead: float = default("iteration_overhead")
    request_overhead: float = default("request_overhead")
    num_scheduler_steps: int = default("num_scheduler_steps")
    prefix_caching: bool = default("prefix_caching")

    kind: ClassVar[str] = "continuous"
    planner: ClassVar[str] = "continuous"
    resumable: ClassVar[bool] = True
    prefill_stage: ClassVar[str] = "engines"
    classes: ClassVar[bool] = True
    prefixes: ClassVar[bool] = True
    reports: ClassVar[frozenset] = frozenset({"run", "batch_means", "decode", "ttft", "ttft_quantiles",
                                              "tbt_quantiles", "continuous", "controller", "goodput",
                                              "prefix"})
    settings: ClassVar[tuple] = ("max_num_seqs", "max_batched_tokens", "chunked_prefill", "kv_tokens", "block_size",
                                 "admission", "admission_bins", "aging", "mlfq_quantum", "mlfq_levels",
                                 "predictor_sigma", "sla_control", "d_sla", "eps_d", "b_min", "b_max", "controller",
                                 "memory", "eps_m", "servers",
                                 "iteration_overhead", "request_overhead", "num_scheduler_steps", "ttft_slo",
                                 "tpot_slo", "prefix_caching", "system_prompts", "system_prompt_length",
                                 "system_prompt_share")
    models: ClassVar[tuple] = ("iteration", "profile")
    engine: ClassVar[bool] = True
    decode_stage: ClassVar[bool] = True

    def __post_init__(self):
        check_fields(self, {"max_num_seqs": "max_num_seqs", "max_batched_tokens": "max_batched_tokens",
                            "chunked_prefill": "chunked_prefill", "kv_tokens": "kv_tokens",
                            "block_size": "block_size", "admission": "admission",
                            "bins": "ContinuousBatching.bins", "aging": "aging", "quantum": "mlfq_quantum",
                            "levels": "mlfq_levels",
                            "iteration_overhead": "iteration_overhead",
                            "request_overhead": "request_overhead",
                            "num_scheduler_steps": "num_scheduler_steps", "prefix_caching": "prefix_caching"})
        if self.chunked_prefill and self.max_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_batched_tokens = {self.max_batched_tokens} must be >= max_num_seqs = "
                             f"{self.max_num_seqs} with chunked prefill: every running sequence's decode takes one "
                             "token of the iteration's budget")
        if self.aging > 0 and self.admission != "spf":
            raise ValueError(f"aging = {self.aging:g} ages shortest predicted output first (admission='spf'); "
                             f"admission is {self.admission!r}")
        if math.isfinite(self.kv_tokens) and self.kv_tokens < self.block_size:
            raise ValueError(f"kv_tokens = {self.kv_tokens:g} must hold at least one block of block_size = "
                             f"{self.block_size} tokens")
        if self.edges is not None:
            e = tuple(check_real_array("edges", self.edges, DOMAINS["ContinuousBatching.edges"],
                                       allow_empty=True).tolist())
            if self.admission != "multibin":
                raise ValueError(f"edges are the bins of admission='multibin'; admission is {self.admission!r}")
            if len(e) != self.bins - 1 or list(e) != sorted(set(e)):
                raise ValueError(f"edges must be bins - 1 = {self.bins - 1} finite, strictly ascending inner edges "
                                 f"(tokens); got {self.edges!r}")
            object.__setattr__(self, "edges", e)
        predictor = as_predictor(self.predictor)
        if isinstance(predictor, BinConfusion):
            raise TypeError("predictor: ContinuousBatching orders by predicted lengths; bin confusion has no "
                            "lengths: use mb.Oracle(), mb.LogNormalError(sigma) or mb.Predictions(values)")
        object.__setattr__(self, "predictor", predictor)
        from ..controller import Memory, SLAController

        if self.controller is not None:
            check_instance("controller", self.controller, SLAController)
        if self.memory is not None:
            check_instance("memory", self.memory, Memory)
            if self.controller is None:
                raise ValueError("memory is Algorithm 1's, under a controller: give controller=mb.SLAController(...) "
                                 "too (the engine's own memory is kv_tokens)")

    @property
    def algorithm1(self):
        """Algorithm 1's :class:`~mbbatch.Memory` under the controller: the
        one given, else the L0 rule on ``kv_tokens``; None where it does
        not apply (no controller, memory disabled, ``kv_tokens`` inf)."""
        from ..controller import Memory
        from .base import memory_kw

        if self.controller is None:
            return None
        if self.memory is not None:
            return self.memory if self.memory.enabled else None
        return None if math.isinf(self.kv_tokens) else Memory(**memory_kw(self.kv_tokens))

    def carries(self) -> Carries:
        """Iterations, not batches: a request holds one of ``max_num_seqs``
        slots over many of them, so there is no batch load; the throughput
        and the backlog decide every probe."""
        return Carries(load=False, backlog=True, held=self.max_num_seqs, iterations=True)

    def describe(self) -> dict:
        d = {"policy": self.kind, "max_num_seqs": self.max_num_seqs, "max_batched_tokens": self.max_batched_tokens,
             "chunked_prefill": self.chunked_prefill,
             "kv_tokens": "inf" if math.isinf(self.kv_tokens) else self.kv_tokens, "block_size": self.block_size,
             "admission": self.admission}
        if self.iteration_overhead or self.request_overhead:
            d.update(iteration_overhead=self.iteration_overhead, request_overhead=self.request_overhead)
        if self.num_scheduler_steps > 1:
            d["num_scheduler_steps"] = self.num_scheduler_steps
        if self.prefix_caching:
            d["prefix_caching"] = True
        if self.admission == "mlfq":
            d.update(quantum=self.quantum, levels=self.levels)
        if self.admission == "multibin":
            d["bins"] = self.bins
            if self.edges is not None:
                d["edges"] = list(self.edges)
        if not isinstance(self.predictor, Oracle):
            d.update(self.predictor.describe())
        c = self.controller
        if c is not None:
            d.update({"d_sla": c.d_sla, "eps_d": c.eps_d, "b_min": c.b_min, "b_max": c.b_max, "alpha": c.alpha,
                      "delta": c.delta, "controller": c.variant})
            m = self.algorithm1
            d.update({"memory": "off"} if m is None else {"memory": m.variant, "eta": m.eta, "eps_m": m.eps_m})
        return d

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "ContinuousBatching":
        """A cell's engine: its settings and log-normal predictor."""
        from ..predictors import LogNormalError

        from ..controller import Memory
        from .base import memory_kw

        def get(key, table_key=None):
            # (a LAPS decode stage's cell gives only some: the rest at the table's defaults)
            return params[key] if key in params else default(table_key or key)

        sigma = params.get("predictor_sigma", 0.0)
        controller = memory = None
        if get("sla_control"):
            controller = controller_from_spec(params)
            # (Algorithm 1 on the engine's own KV cache: eta = kv_tokens)
            if get("memory") == "off" or math.isinf(get("kv_tokens")):
                memory = Memory(enabled=False)
            else:
                memory = Memory(variant=get("memory"), eps_m=get("eps_m"), **memory_kw(get("kv_tokens")))
        return cls(max_num_seqs=get("max_num_seqs"), max_batched_tokens=get("max_batched_tokens"),
                   chunked_prefill=get("chunked_prefill"), kv_tokens=get("kv_tokens"),
                   block_size=get("block_size"), admission=get("admission"),
                   bins=get("admission_bins", "ContinuousBatching.bins"), aging=get("aging"),
                   quantum=get("mlfq_quantum"), levels=get("mlfq_levels"),
                   predictor=LogNormalError(sigma) if sigma > 0 else None, controller=controller, memory=memory,
                   iteration_overhead=get("iteration_overhead"), request_overhead=get("request_overhead"),
                   num_scheduler_steps=get("num_scheduler_steps"), prefix_caching=get("prefix_caching"))
