"""The planner of continuous batching (:mod:`mbbatch._kernels.continuous`):
one engine batching at every iteration, timed by an
:class:`~mbbatch.IterationModel`; several independent engines
(``servers``), or a cluster's engines behind its router
(:mod:`mbbatch._kernels.continuous_cluster`, its part of the plan from
:mod:`.cluster`)."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import scipy.stats as _st

from .._kernels import common as _common
from .._kernels import continuous as _k
from .._kernels.arena import Lease
from .._kernels import continuous_cluster as _cc
from .._kernels import disaggregated as _kd
from .._kernels import controller as _c
from .._running import check_memory, interruptible, stop_flag
from .._seeding import (STREAM_ARRIVALS, STREAM_CLASS, STREAM_PREDICTION, STREAM_PROMPT, STREAM_SERVICE,
                        STREAM_SYSTEM, entropy_str, stream, substream)
from ..predictors import LogNormalError, Oracle
from ..results import SimulationResult, Table
from ..service_models import IterationModel
from ..workload import Mixture
from .common import (BATCH_MEANS_GROUPS, HISTOGRAM_QUANTILES, TIME_SERIES_ROWS, RunTotals, assemble, call_streams,
                     check_arrivals, check_times, engines_backlog, finish, lengths, model_config,
                     mixture_lengths, quantiles, resolve_n, rvs_memory, settled, steady_state, times_name)

__all__ = ["Plan", "check"]


@dataclass(frozen=True, eq=False)
class Plan:
    """A checked continuous-batching run, ready to allocate and simulate."""

    policy: object
    arrivals: object
    workload: object
    model: IterationModel
    predictor: object
    n: int
    keep_requests: bool
    memory: int
    servers: int = 1
    prefilled: bool = False
    #: a cluster's part of the plan (:class:`.cluster.ContinuousPart`): its
    #: engines behind its router; None: ``servers`` engines in turn
    cluster: object = None
    #: the parameter that sets the engines' ``kv_tokens``, as the refusal of a request names it
    kv_name: str = "kv_tokens"
    #: a deployment's pool (:mod:`.disaggregated`): the record columns its driver reads, the only ones its
    #: requests keep beside their lengths and engines; its latency quantiles then its histograms' (the driver
    #: reports its own, exact).  Empty: a run of its own, every column kept
    stage_records: tuple = ()
    #: a decode pool's requests (``prefilled``): the seconds each takes to pull its KV cache once its engine
    #: admits it (:mod:`mbbatch._kernels.continuous`'s ``pull``), in the plan's order; None: none
    pull: object = None
    #: a prefill pool's requests: the instant each frees its KV blocks if it completes before (its decode
    #: engine's pull landed: :mod:`mbbatch._kernels.continuous`'s ``release``), in the plan's order; None: at
    #: its completion
    release: object = None

    keep_batches = False

    @property
    def engines(self) -> int:
        """The engines: the cluster's, or ``servers``."""
        return self.cluster.policy.engines if self.cluster is not None else self.servers

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss`` (``warn`` and ``progress`` as the other plans')."""
        return _run(self, ss, warn, progress)

    def check_requests(self, ss: np.random.SeedSequence) -> None:
        """Raise the error :meth:`run` with the seed ``ss`` would raise before
        simulating: a request it draws that could never run on the engine
        (its prompt and output beyond the KV blocks, or its prompt beyond
        ``max_batched_tokens`` without chunked prefill), named.  Draws the
        requests, runs nothing (a sweep asks it of every cell before its
        store exists)."""
        if self.cluster is None:
            _requests(self, ss)
            return
        _, prompt, output, _ = self.cluster.calls(self, call_streams(ss))
        _requests(self, ss, prompt, output)

    @functools.cached_property
    def edges(self) -> np.ndarray:
        """The multi-bin admission's inner edges (tokens of predicted output)."""
        pol = self.policy
        if pol.admission != "multibin" or pol.bins == 1:
            return np.empty(0)
        if pol.edges is not None:
            return np.asarray(pol.edges, dtype=float)
        return np.asarray(self.workload._output.equal_mass_edges(pol.bins, "ContinuousBatching(edges=...)")[1:-1],
                          dtype=float)

    @functools.cached_property
    def class_slo(self) -> np.ndarray:
        """Each request class's objective on the time to first token (s; one class without a mixture)."""
        return np.atleast_1d(np.array(self.workload.ttft_slo, dtype=float))

    @functools.cached_property
    def class_tpot(self) -> np.ndarray:
        """Each request class's objective on the time per output token (s/token)."""
        return np.atleast_1d(np.array(self.workload.tpot_slo, dtype=float))

    @property
    def goodput(self) -> bool:
        """Whether the run counts goodput: some class has an objective."""
        return self.workload.has_objectives

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and the arrival inputs."""
        pol, m = self.policy, self.model
        akind, rate, times, aparams, aends = self.arrivals.kernel_fields(self.n)
        blocks = -1 if math.isinf(pol.kv_tokens) else int(pol.kv_tokens // pol.block_size)
        config = _k.CONFIG.pack(
            n=self.n, arrival_kind=akind, max_num_seqs=pol.max_num_seqs, max_batched_tokens=pol.max_batched_tokens,
            chunked=int(pol.chunked_prefill), blocks=blocks, block_size=pol.block_size,
            admission=_k.ADMISSIONS[pol.admission],
            # (the queues: multi-bin admission's bins, fair sharing's clients, the feedback queue's levels)
            bins=(self.class_slo.size if pol.admission == "vtc" else pol.levels if pol.admission == "mlfq"
                  else max(1, self.edges.size + 1)), aging=pol.aging, quantum=pol.quantum,
            keep=self.keep_requests,
            controlled=pol.controller is not None, memory_on=pol.algorithm1 is not None,
            scheduler_steps=pol.num_scheduler_steps, goodput=self.goodput, rate=rate,
            **_cost_fields(m, pol), **m.expert_fields(), request_overhead=pol.request_overhead, until=math.inf)
        return config, dict(arrival_times=times, arrival_params=aparams, arrival_ends=aends)

    @functools.cached_property
    def control(self) -> tuple:
        """The kernel's controller packs (zeros without one): B_max is the
        smaller of the controller's and ``max_num_seqs``."""
        pol = self.policy
        sla, mem = pol.controller, pol.algorithm1
        if sla is None:
            return _k.controls()
        b_max = float(min(sla.b_max, pol.max_num_seqs))
        b_min = float(min(sla.b_min, b_max))
        packs = [_c.SLA.pack(variant=_c.CTL_VARIANT_SPEC if sla.variant == "spec" else _c.CTL_VARIANT_MULTIPLICATIVE,
                             d_sla=sla.d_sla, eps_d=sla.eps_d, b_min=b_min, b_max=b_max, alpha=float(sla.alpha),
                             delta=float(sla.delta), ema=_c.DEFAULT_EMA)]
        if mem is not None:
            packs.append(_c.MEMORY.pack(variant=_c.MEM_VARIANT_CLT if mem.variant == "clt" else _c.MEM_VARIANT_L0,
                                        eta=mem.eta, b_min=b_min, b_max=b_max,
                                        z=float(_st.norm.ppf(1.0 - mem.eps_m)), default_tokens=_c.DEFAULT_TOKENS))
        return _k.controls(*packs)

    @functools.cached_property
    def description(self) -> dict:
        policy = self.policy if self.cluster is None else self.cluster.policy
        return {**policy.describe(), **self.arrivals.describe(), **self.workload.describe(),
                **model_config(self.model), "n": self.n, "servers": self.servers}


def check(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches, *,
          prefilled: bool = False, cluster=None, servers_name: str = "servers", kv_name: str = "kv_tokens") -> Plan:
    """The checked :class:`Plan` of a ``simulate`` call of
    :class:`~mbbatch.ContinuousBatching`; ``prefilled``: each request brings
    its whole prompt's KV cache (a decode stage's, as LAPS's); ``cluster``:
    a cluster's part (:class:`.cluster.ContinuousPart`), the policy its
    engines'; ``servers_name``: the parameter that sets ``servers``, as the
    memory check names it (LAPS's ``decode_servers``), and ``kv_name`` the
    one that sets ``kv_tokens``, as a request's refusal names it (LAPS's
    ``decode.kv_tokens``)."""
    if service is not None:
        raise TypeError("ContinuousBatching takes workload=Workload(prompt=..., output=...) (and an "
                        "IterationModel), not service=: its iterations are timed by their tokens")
    if keep_batches:
        raise TypeError("keep_batches: ContinuousBatching batches at every iteration and keeps no batch records; "
                        "keep_requests=True keeps each request's admission, first token and completion")
    servers = 1 if servers is None else servers
    if cluster is not None and servers != 1:
        raise ValueError(f"servers: each ContinuousBatching engine of a Cluster is one engine (batching at every "
                         f"iteration: its max_num_seqs are its slots); servers must be 1; got servers = {servers!r}")
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 1:
        raise ValueError(f"servers: ContinuousBatching runs servers independent engines, an integer in [1, inf) "
                         f"(each request to the next in turn); got servers = {servers!r}")
    model = IterationModel() if service_model is None else service_model
    if not isinstance(model, IterationModel):
        raise TypeError(f"service_model: ContinuousBatching's iterations are timed by an IterationModel (or a "
                        f"profile: mb.profiles.get(name)); got {type(service_model).__name__}")
    if not workload.integer_lengths:
        raise ValueError("workload.integer_lengths: ContinuousBatching steps whole tokens; it must be True")
    check_arrivals(arrivals)
    predictor = policy.predictor
    if not isinstance(predictor, Oracle) and workload.predictor_sigma != 0:
        raise ValueError(f"ContinuousBatching takes one predictor: workload.predictor_sigma (a LogNormalError) or "
                         f"ContinuousBatching(predictor=...), not both; got predictor_sigma = "
                         f"{workload.predictor_sigma:g} and {predictor}")
    if workload.predictor_sigma != 0:
        predictor = LogNormalError(workload.predictor_sigma)
    if policy.prefix_caching and prefilled:
        raise ValueError("prefix_caching: a ContinuousBatching engine caches prefixes alone or as a Cluster's "
                         "engines (not yet as LAPS's decode stage); give prefix_caching=False")
    if (cluster is not None and cluster.policy.programs is not None
            and getattr(workload, "system_prompts", None) is not None):
        raise ValueError("workload.system_prompts: a Cluster's programs build each call's prompt from its program's "
                         "context; their calls carry no system prompts (yet): give programs=None, or a Workload "
                         "without system_prompts")
    if isinstance(workload, Mixture):
        if cluster is not None and cluster.policy.programs is not None:
            raise TypeError("workload: a Workload.mixture's requests are independent; a Cluster's programs draw "
                            "their calls from one Workload (give programs=None, or a Workload)")
        if policy.admission == "multibin" and policy.bins > 1 and policy.edges is None:
            raise ValueError("edges: multi-bin admission takes its bins' edges from the output lengths' "
                             "distribution, which a Workload.mixture does not have in closed form; give "
                             "ContinuousBatching(edges=...)")
    specs = workload.length_specs()
    n = resolve_n(n, arrivals, specs, predictor)
    M = policy.max_num_seqs
    # (a cluster's engines each have room for every request, but the pages of a request's entries are touched
    # only on the engine it is routed to: its memory is the requests' once, and each engine's records)
    per = 8 * 14 * n if cluster is None else 8 * 19 * n
    # (a mixture's classes, and their draw's uniforms; goodput's first-token times)
    per += 8 * n * (2 * isinstance(workload, Mixture) + workload.has_objectives)
    # (system prompts or a cluster's programs cached: each request's chain and shared tokens)
    per += 16 * n * (getattr(workload, "system_prompts", None) is not None
                     or (policy.prefix_caching and cluster is not None and cluster.policy.programs is not None))
    # servers engines run one after another, each folded into the run's as it ends (_merged): one engine's
    # workspace and histograms at a time (beside their sums and a temporary), each engine's time series and
    # controller state kept to the end; a cluster's engines run side by side, all theirs at once
    c = min(servers, n) if cluster is None else cluster.policy.engines
    live = 1 if cluster is None else c
    hists = 3 * live + (0 if c == 1 else 4)
    # (an engine's series: up to TIME_SERIES_ROWS rows of TS_WIDTH; in the merge, its rows' instants in the
    # union (concatenated, sorted, unique: 3) and its waiting requests at the merged instants (1))
    each = 8 * ((_k.TS_WIDTH + 4) * TIME_SERIES_ROWS + _c.CONTROLLER.size)
    parts = {
        "n": (per, "the requests' arrival times, lengths, predictions, states, links and heaps"),
        "max_num_seqs": (live * 8 * 20 * (M + 1), "the running sequences, the prefill queue and the decodes' "
                                                  "groups"),
        "batch_size": (hists * 8 * _common.HIST_SIZE, "the latency, first-token and between-token histograms"),
        "block_size": (live * 8 * policy.block_size, "the decodes' count by block phase"),
    }
    if keep_requests:
        parts["keep_requests"] = (live * 8 * 5 * n, "the per-request records")
    engines = (c * each, f"the {c} engines' time series and controller states, and the series' merge")
    if cluster is None:
        parts[servers_name] = engines
    else:
        for key, (size, what) in cluster.memory(n).items():
            parts[key] = (size + engines[0], f"{what}; {engines[1]}") if key == "engines" else (size, what)
        parts.setdefault("engines", engines)
    parts.update(rvs_memory(specs, n))
    memory = check_memory(parts)
    check_times(arrivals, n, model.one_request(workload.mean("prompt"), workload.mean("output")), times_name(model))
    return Plan(policy=policy, arrivals=arrivals, workload=workload, model=model, predictor=predictor, n=n,
                keep_requests=bool(keep_requests), memory=memory, servers=int(servers), prefilled=bool(prefilled),
                cluster=cluster, kv_name=kv_name)


def no_prefixes(n: int) -> dict:
    """The prefix caching inputs of ``n`` requests that share nothing: no
    chain, no shared tokens, no chains."""
    return dict(chain=np.full(n, -1.0), shared=np.zeros(n), grows=np.zeros(0))


def _requests(plan: Plan, ss: np.random.SeedSequence, prompt=None, output=None, prefixes=None,
              lease=None) -> tuple:
    """The requests' prompts and outputs (whole tokens: the prompt and output
    streams, as the token-level policies' requests, unless given: a
    cluster's programs' calls), predicted outputs and classes (None without
    a mixture), checked against the engine: a request that could never run
    is refused, named, before the run.  A workload's system prompts
    (:class:`~mbbatch.workload.SystemPrompts`, their own stream) lead their
    requests' prompts; each request's and its length are put in
    ``prefixes`` (a dict: ``chain``, ``shared``) where it is given.  The
    arrays drawn come from ``lease`` (:class:`~mbbatch._kernels.arena.Lease`)
    where one is given."""
    wl, n = plan.workload, plan.n
    lease = lease or Lease(keep=False)
    klass = None
    if isinstance(wl, Mixture):
        klass, prompt, output = _mixed(wl, ss, n, lease)
    elif prompt is None:
        prompt = lengths(wl._prompt, stream(ss, STREAM_PROMPT), n, True, empty=lambda m: lease.empty(m, role="prompt"))
        output = lengths(wl._output, stream(ss, STREAM_SERVICE), n, True, empty=lambda m: lease.empty(m, role="output"))
    if getattr(wl, "system_prompts", None) is not None:
        chain, shared = wl.system_prompts.draw(stream(ss, STREAM_SYSTEM), n)
        prompt = prompt + shared
        if prefixes is not None:
            prefixes.update(chain=chain, shared=shared, grows=np.zeros(wl.system_prompts.count))
    first_token = plan.cluster is not None and plan.cluster.first_token
    if first_token:
        # (a prefill pool's engines: one token each, known)
        output = np.ones(prompt.size)
    prediction = output if first_token else plan.predictor.predict(output, lambda: stream(ss, STREAM_PREDICTION))
    check_fits(plan, prompt, output)
    return prompt, output, prediction, klass


def check_fits(plan: Plan, prompt: np.ndarray, output: np.ndarray) -> None:
    """Refuse, named by its place, the first of the requests (``prompt`` and
    ``output`` tokens, arrival order) that could never run on ``plan``'s
    engine: beyond its KV blocks alone, or (without chunked prefill) a
    prompt, with the tokens a preempted request prefills again, beyond
    ``max_batched_tokens``."""
    pol = plan.policy
    # (the longest prompt and output first: the requests' sums only where they might not fit)
    longest_p, longest_o = float(prompt.max(initial=0.0)), float(output.max(initial=0.0))
    if math.isfinite(pol.kv_tokens) and longest_p + longest_o > pol.kv_tokens // pol.block_size * pol.block_size:
        capacity = int(pol.kv_tokens // pol.block_size) * pol.block_size
        too_big = np.flatnonzero(prompt + output > capacity)
        if too_big.size:
            r = int(too_big[0])
            raise ValueError(f"{plan.kv_name} = {pol.kv_tokens:g}: request {r} (prompt {prompt[r]:g} + output "
                             f"{output[r]:g} tokens) can never fit the {capacity} tokens of KV blocks alone "
                             f"({too_big.size} requests cannot); raise {plan.kv_name} or bound the lengths")
    # (a decode stage's prompts come prefilled: only a preempted request prefills)
    fresh = 0.0 if plan.prefilled else longest_p
    bound = longest_p + longest_o - 1 if math.isfinite(pol.kv_tokens) else fresh
    if not pol.chunked_prefill and bound > pol.max_batched_tokens:
        # a prompt (with the tokens a preempted request prefills again) must fit one iteration
        longest = prompt + output - 1 if math.isfinite(pol.kv_tokens) else prompt
        too_big = np.flatnonzero(longest > pol.max_batched_tokens)
        if too_big.size:
            r = int(too_big[0])
            raise ValueError(f"max_batched_tokens = {pol.max_batched_tokens}: without chunked prefill a prompt "
                             f"(and, where preemption may recompute it, its generated tokens) is prefilled in one "
                             f"iteration; request {r} needs {longest[r]:g} tokens ({too_big.size} requests do); "
                             "raise max_batched_tokens or turn chunked_prefill on")


def _mixed(wl: Mixture, ss: np.random.SeedSequence, n: int, lease: Lease) -> tuple:
    """A mixture's requests: each one's class (the class stream: the same
    for every policy), then each class's prompts and outputs, in request
    order, from the class's own part of the prompt and output streams.
    Returns ``(klass, prompt, output)``, the classes as floats (as the
    kernel's inputs), in arrays of ``lease``."""
    # (class c where a uniform draw falls in [share_0 + .. + share_{c-1}, .. + share_c): inversion, one draw each,
    # counting the boundaries at or below it; as floats, the kernel's input; one compiled pass, then one placing
    # every class's lengths, where masks and fancy indexing took a pass per boundary and four per class)
    klass = lease.empty(n, role="klass")
    counts = np.zeros(len(wl.parts), np.int64)
    _common.draw_classes(stream(ss, STREAM_CLASS), np.cumsum(wl.shares)[:-1], klass, counts)
    prompt, output = lease.empty(n, role="prompt"), lease.empty(n, role="output")
    mixture_lengths(klass, counts, [(part._prompt, part._output) for part in wl.parts],
                    [(substream(ss, STREAM_PROMPT, c), substream(ss, STREAM_SERVICE, c)) for c in range(len(wl.parts))],
                    (prompt, output))
    return klass, prompt, output


def _classes(klass) -> np.ndarray:
    """The kernel's per-request classes (empty: none)."""
    return np.empty(0) if klass is None else klass


def _arrival_times(plan: Plan, gen) -> np.ndarray:
    """The arrival times one engine would draw for all ``n`` requests (from
    ``gen``, the arrival stream): those its engines share out."""
    config, arr = plan.kernel_args
    cfg = _k.CONFIG.unpack(config)
    times = np.empty(plan.n)
    _k.arrival_times(_common.drawers(cfg["arrival_kind"])[0], 1.0 / cfg["rate"] if cfg["rate"] > 0 else 0.0,
                     arr["arrival_times"], gen, times, arr["arrival_params"], arr["arrival_ends"])
    return times


def _engines(plan: Plan, ss: np.random.SeedSequence, prompt, output, prediction, klass, progress: bool,
             seconds: list, prefixes=None):
    """Run the engines: one kernel run per engine, request r going to engine
    ``r % servers`` (round robin, at arrival; more engines than requests:
    the others idle).  Yields each engine's ``(outputs, records, code)`` as
    its run ends, in engine order (the caller folds each into the run's and
    lets its histograms go: never all the engines' at once), and appends
    each run's kernel seconds to ``seconds``.  With prefix caching, each
    engine caches the ``prefixes`` (:func:`_requests`) of its requests.  (With several, a progress bar
    counts each engine's requests in turn.)"""
    config, arr = plan.kernel_args
    c, n = _busy_engines(plan), plan.n
    streams = _k.ContinuousStreams(stream(ss, STREAM_ARRIVALS))
    stop = stop_flag()
    kw = dict(control=plan.control, groups=BATCH_MEANS_GROUPS, ts_rows=TIME_SERIES_ROWS)

    def timed(call, m: int):
        # (the engine's arrays made here, on this thread: the main thread's large ones come from glibc's heap,
        # mbbatch._running.kept_heap)
        t0 = time.perf_counter()
        run = interruptible(call(), stop, m if progress else None)
        seconds.append(time.perf_counter() - t0)
        _check_codes([run])
        return run

    if plan.policy.prefix_caching:
        prefixes = prefixes or no_prefixes(n)
    else:
        prefixes = {}
    if c == 1:
        inputs = _k.INPUTS.pack(**arr, prompt=prompt, output=output, prediction=prediction, edges=plan.edges,
                                cached=prompt if plan.prefilled else np.empty(0),
                                pull=plan.pull if plan.pull is not None else np.empty(0),
                                release=plan.release if plan.release is not None else np.empty(0),
                                klass=_classes(klass),
                                class_slo=plan.class_slo, class_tpot=plan.class_tpot, **prefixes)
        with Lease() as lease:
            yield timed(lambda: _k.prepare(config, inputs, streams, stop, lease=lease, **kw), n)
        return
    # the arrival times one engine would draw for all n, dealt out; each engine replays its share
    cfg = _k.CONFIG.unpack(config)
    times = _arrival_times(plan, streams.arrival)
    for e in range(c):
        part = slice(e, n, c)
        m = len(range(e, n, c))
        cfg_e = _k.CONFIG.pack(**{**cfg, "n": m, "arrival_kind": _common.ARR_REPLAY, "rate": 0.0})
        # (the engine's share of the requests and its records leased: the caller copies its records out, _merged,
        # before the lease closes)
        with Lease() as lease:
            def share(a, role):
                out = lease.empty(m, a.dtype, role)
                out[:] = a[part]
                return out

            # (a decode pool's prompts come prefilled: the engine reads its prompts as its cached tokens too,
            # both read-only; an oracle's predictions are the outputs: one share of both)
            mine, theirs = share(prompt, "prompt"), share(output, "output")
            inputs = _k.INPUTS.pack(arrival_times=share(times, "arrival_times"), arrival_params=np.zeros(1),
                                    arrival_ends=arr["arrival_ends"], prompt=mine, output=theirs,
                                    prediction=theirs if prediction is output else share(prediction, "prediction"),
                                    edges=plan.edges,
                                    cached=mine if plan.prefilled else np.empty(0),
                                    pull=share(plan.pull, "pull") if plan.pull is not None else np.empty(0),
                                    release=share(plan.release, "release") if plan.release is not None
                                    else np.empty(0),
                                    klass=share(_classes(klass), "klass") if klass is not None else np.empty(0),
                                    class_slo=plan.class_slo, class_tpot=plan.class_tpot,
                                    **{k: v if k == "grows" else share(v, k) for k, v in prefixes.items()})
            yield timed(lambda: _k.prepare(cfg_e, inputs, streams, stop, lease=lease, records_lease=lease, **kw), m)


def _check_codes(runs) -> None:
    if any(code == _k.STALLED for _, _, code in runs):      # pragma: no cover (a bug: see the kernel's tests)
        raise RuntimeError("mbbatch: the continuous-batching engine stalled with work waiting; please report this")


def _cluster(plan: Plan, ss: np.random.SeedSequence, progress: bool, drawn=None, lease=None) -> tuple:
    """Run a cluster's engines behind its router
    (:func:`mbbatch._kernels.continuous_cluster.run`) on its requests (its
    programs' calls, or requests of its own).  Returns the requests'
    ``(prompt, output, prediction)``, each engine's ``(outputs, records,
    code)``, each request's engine and number there, the routing
    statistics, the requests' columns of the cluster (their engine; with
    programs their program and new tokens) and the kernel seconds.
    ``drawn``: the requests' ``(prompt, output)`` as the run draws them
    (the prompt and output streams), drawn already by a deployment's check
    (None: drawn here; never given with programs); ``lease``: the
    :class:`~mbbatch._kernels.arena.Lease` an open loop's engines' arrays
    come from (None: fresh; their records the caller's to copy out before
    it closes)."""
    sources = call_streams(ss)
    arrivals = sources.arrival
    times, prompt, output, programs = plan.cluster.calls(plan, sources)
    if drawn is not None:
        prompt, output = drawn
    prefixes = {}
    prompt, output, prediction, klass = _requests(plan, ss, prompt, output, prefixes=prefixes)
    closed = plan.cluster.closed
    chains = programs
    if closed:
        # (by call id: the kernel makes the requests as the calls arrive)
        P = programs["start"].size
        chains = ((np.arange(prompt.size) // (prompt.size // P), programs["new"], None), P)
    prefixes = plan.cluster.prefixes(plan, prompt, chains, prefixes)
    if times is None and not closed:
        times = _arrival_times(plan, arrivals)
    config, _ = plan.kernel_args
    stop = stop_flag()
    streams = _k.ContinuousStreams(arrivals)
    cluster = dict(control=plan.control, groups=BATCH_MEANS_GROUPS, ts_rows=TIME_SERIES_ROWS, prefixes=prefixes,
                   cache_routing=plan.cluster.cache_routing, events=plan.cluster.events)
    t0 = time.perf_counter()
    if closed:
        calls = {**programs, "prompt": prompt, "output": output, "prediction": prediction}
        runs, where, local, routed, _, got = interruptible(
            lambda: _kd.run_cluster_closed(config, calls, plan.edges, plan.cluster.router, plan.engines, streams,
                                           stop, **cluster),
            stop, plan.n if progress else None)
        # (each request is the call that arrived: its lengths and prediction, its program and new tokens)
        k = got["call"]
        prompt, output, prediction = prompt[k], output[k], prediction[k]
        programs = ((got["program"], got["new_tokens"], got["session_end"]), P)
    else:
        # (its arrays made on this thread, its kernel run on interruptible's: as _engines)
        go = _cc.prepare(config, times, prompt, output, prediction, plan.edges, plan.cluster.router, plan.engines,
                         streams, stop, programs=programs, klass=klass, class_slo=plan.class_slo,
                         class_tpot=plan.class_tpot, brought=prompt if plan.prefilled else None, pull=plan.pull,
                         release=plan.release, lease=lease, **cluster)
        runs, where, local, routed, _ = interruptible(go, stop, plan.n if progress else None)
    kernel_seconds = time.perf_counter() - t0
    _check_codes(runs)
    columns = {"engine": where}
    if programs is not None:
        (program, new_tokens, _), _ = programs
        columns.update(program=program, new_tokens=new_tokens)
    return (prompt, output, prediction, klass), runs, (where, local), routed, columns, kernel_seconds


def _busy_engines(plan: Plan) -> int:
    """The engines that serve a request: ``servers``, at most ``n``."""
    return min(plan.servers, plan.n)


#: a cluster's metrics of run-to-completion batches (the tag ``tokens``), on
#: continuous-batching engines: no SLA of the batches' (NaN), no batch
#: memory of the token capacity's (NaN; the engines' KV use is
#: ``mean_kv_usage``), no batch over it, no request dropped (each that could
#: never fit is refused before the run)
_NOT_BATCHES = {"sla_violation_tokens": math.nan, "sla_violation_requests": math.nan,
                "sla_violation_share": math.nan, "memory_peak": math.nan, "mean_memory": math.nan,
                "std_batch_size": math.nan, "mem_exceed_batches": 0, "rejected": 0}

#: the statistics of several engines: summed but for these
_FIRST, _LAST = ("first_arrival",), ("last_completion", "max_running")


#: the engines' outputs summed
_SUMMED = ("hist", "hist_ttft", "hist_tbt", "group_latency", "group_count", "size_hist", "class_stats", "class_hist")


def _merged(plan: Plan, runs, placed=None) -> tuple:
    """The engines' statistics, histograms, batch-means groups and records
    as one run's (``runs``: each engine's ``(outputs, records, code)`` in
    engine order, folded in one at a time, so that an iterator of them holds
    one engine's histograms at a time; ``placed``: each request's engine and
    number there; None: request r is number r // c of engine r % c); their
    time series summed at the union of their sampling instants, thinned to
    at most :data:`TIME_SERIES_ROWS` rows (each held from its last sample, 0
    before its first), and each engine's waiting requests (a column each)
    for the backlog check.  The engines' series are read at the thinned
    instants only: memory linear in the engines (at every instant of the
    union it was their square)."""
    c = plan.engines if plan.cluster is not None else _busy_engines(plan)
    if c == 1:
        (out, req, _), = runs
        st = _k.STATS.unpack((out.ints, out.floats))
        ts = {name: out.ts[:st["ts_rows"], col].copy() for name, col in zip(_k.TS._fields, _k.TS)}
        return st, out, req, ts, ts["waiting"][:, None]
    stats_, series, ctl, sums = [], [], [], {}
    req = {} if plan.keep_requests else None
    # (a deployment's pool merges only the columns its driver reads)
    wanted = plan.stage_records or _k.REQUESTS.ints + _k.REQUESTS.floats
    n = plan.n
    # (with ``placed``, each field's rows of the engines, gathered in the cluster's order once all are read)
    rows = {}
    for e, (out, r, _) in enumerate(runs):
        s = _k.STATS.unpack((out.ints, out.floats))
        stats_.append(s)
        series.append({name: out.ts[:s["ts_rows"], col] for name, col in zip(_k.TS._fields, _k.TS)})
        ctl.append(out.ctl)
        for f in _SUMMED:
            # (0 + the first, then each in engine order: as sum() adds them)
            sums[f] = sums.get(f, 0) + getattr(out, f)
        if req is not None:
            r = {k: v for k, v in r.items() if k in wanted}
            if placed is None:
                for k, v in r.items():
                    req.setdefault(k, np.empty(n, v.dtype))[e::c] = v
            else:
                for k, v in r.items():
                    rows.setdefault(k, []).append(v)
        del out, r          # (not held while the next engine runs)
    for k, row in rows.items():
        # (request j is number local[j] of engine where[j]: an engine numbers its requests as they reach it)
        req[k] = np.empty(n, row[0].dtype)
        _cc.gathered(*placed, _cc.stacked_rows(row), req[k])
    del rows
    # (an engine given no request has no first arrival)
    st = {k: (min if k in _FIRST else max if k in _LAST else sum)(s[k] for s in stats_ if not math.isnan(s[k]))
          for k in stats_[0]}
    t = np.unique(np.concatenate([s["time"] for s in series]))
    step = max(1, -(-t.size // TIME_SERIES_ROWS))
    at = t[::step].copy()
    del t
    ts = dict.fromkeys(series[0], 0)
    queue = np.empty((at.size, c))
    for e, s in enumerate(series):
        k = np.searchsorted(s["time"], at, side="right") - 1
        for name, col in s.items():
            if name != "time":
                # (an engine given no request has no sample: 0 throughout)
                held = np.where(k >= 0, col[np.maximum(k, 0)], 0.0) if col.size else np.zeros(at.size)
                ts[name] = ts[name] + held
                if name == "waiting":
                    queue[:, e] = held
    ts["time"] = at
    merged = SimpleNamespace(ctl=np.stack(ctl), **sums)
    return st, merged, req, ts, queue


def _class_metrics(workload, out, goodput: bool) -> dict | None:
    """Each class's metrics (a mixture's; None for one workload): its share,
    requests completed, mean and 99th percentile of the latency and of the
    time to first token (histogram quantiles), its objective on the time to
    first token and the share of its requests whose first token came within
    it (the attainment), and its goodput (with objectives)."""
    if not isinstance(workload, Mixture):
        return None
    S = _k.CLASS
    table = {}
    for c, name in enumerate(workload.names):
        st = out.class_stats[c]
        done = st[S.completed]
        q_lat, q_ttft = quantiles(out.class_hist[c, 0], None), quantiles(out.class_hist[c, 1], None)
        nan = math.nan
        table[name] = {
            "share": workload.shares[c], "completed": int(done),
            "mean_latency": float(st[S.sum_latency] / done) if done else nan, "latency_p99": float(q_lat[2]),
            "mean_ttft": float(st[S.sum_ttft] / done) if done else nan, "ttft_p99": float(q_ttft[2]),
            "ttft_slo": workload.parts[c].ttft_slo, "tpot_slo": workload.parts[c].tpot_slo,
            "ttft_attainment": float(st[S.ttft_met] / done) if done else nan,
            "goodput": float(st[S.good] / done) if done and goodput else nan}
    return table


def _cost_fields(model, policy) -> dict:
    """The kernel's iteration-cost fields: the model's, the engine's
    ``iteration_overhead`` paid in every iteration's fixed time (``step +
    iteration_overhead``; with none, the model's ``step`` exactly)."""
    fields = model.cost_fields()
    fields["cost_step"] = fields["cost_step"] + policy.iteration_overhead
    return fields

def _run(plan: Plan, ss: np.random.SeedSequence, warn: bool, progress: bool, ran=None,
         drawn=None) -> SimulationResult:
    """The run with the seed ``ss``; ``ran``: its engines already run by a
    driver of several stages (:mod:`mbbatch._kernels.disaggregated`), as
    :func:`_cluster` returns them (the requests, each engine's run, each
    request's engine and number there, or None: request r number ``r //
    c`` of engine ``r % c``; the routing statistics, the requests' columns
    and the kernel seconds): its result from them.  ``drawn``: the
    requests' ``(prompt, output)`` drawn already, as the plan's workload
    draws them (a deployment's: :func:`_cluster`'s, or its decode pool's,
    which are its workload's replayed values, not drawn again)."""
    n = plan.n
    placed = routed = None
    columns = {}
    if ran is not None:
        (prompt, output, prediction, klass), runs, placed, routed, columns, kernel_seconds = ran
        st, out, req, ts, queue = _merged(plan, runs, placed)
    elif plan.cluster is None:
        prefixes = {}
        seconds = []
        # (the requests' arrays leased for the run: kept for the next unless the result holds them)
        with Lease(keep=not plan.keep_requests) as lease:
            prompt, output, prediction, klass = _requests(plan, ss, *(drawn or (None, None)), prefixes=prefixes,
                                                          lease=lease)
            st, out, req, ts, queue = _merged(plan, _engines(plan, ss, prompt, output, prediction, klass,
                                                             progress, seconds, prefixes))
            if lease.keep:
                # (given back as the lease closes: nothing here may read them after)
                prompt = output = prediction = klass = None
        kernel_seconds = sum(seconds)
    else:
        # (the engines' arrays leased, their records copied out by _merged; one engine's records are the result's
        # own: none kept then)
        with Lease(keep=plan.engines > 1 or not plan.keep_requests) as lease:
            (prompt, output, prediction, klass), runs, placed, routed, columns, kernel_seconds = _cluster(
                plan, ss, progress, drawn, lease)
            st, out, req, ts, queue = _merged(plan, runs, placed)
            # (the engines' records, read: none held past the lease)
            runs = [(o, None, code) for o, _, code in runs]
    if klass is not None and plan.keep_requests:
        columns = {**columns, "request_class": klass.astype(np.int64)}
    completed, iters = st["completed"], st["iterations"]
    nan = math.nan
    span = st["last_completion"] - st["first_arrival"] if completed else nan
    positive = bool(completed) and span > 0
    requests = None
    # (the requests' time outside the engine: in the kernel's latencies, and in the records' columns)
    delay = plan.policy.request_overhead
    if plan.keep_requests and plan.stage_records:
        requests = Table({**{k: req[k] for k in plan.stage_records}, "prompt": prompt, "output": output,
                          "prediction": prediction, **columns})
    elif plan.keep_requests:
        requests = Table({**req, "prompt": prompt, "output": output, "prediction": prediction,
                          "latency": req["completion"] - req["arrival"] + delay,
                          "ttft": req["first_token"] - req["arrival"] + delay, **columns})
    exact = requests is not None and bool(completed) and not plan.stage_records
    q = quantiles(out.hist, requests.latency if exact else None)
    q_ttft = quantiles(out.hist_ttft, requests.ttft if exact else None)
    q_tbt = quantiles(out.hist_tbt, None)
    busy = st["busy"]
    tokens = st["tokens"]
    blocks = (int(plan.policy.kv_tokens // plan.policy.block_size) if math.isfinite(plan.policy.kv_tokens)
              else 0)
    extra = {
        "token_throughput": tokens / span if positive else nan,
        "mean_tbt": st["sum_tbt"] / st["tbt_count"] if st["tbt_count"] else nan,
        "mean_ttft": st["sum_ttft"] / completed if completed else nan,
        **{f"ttft_{k}": float(v) for k, v in zip(("p50", "p95", "p99"), q_ttft)},
        **{f"tbt_{k}": float(v) for k, v in zip(("p50", "p95", "p99"), q_tbt)},
        "preemptions": st["preemptions"],
        "goodput": st["good"] / completed if plan.goodput and completed else nan,
        "recomputed_tokens": st["recomputed"] / completed if completed else nan,
        "mean_running": st["running_time"] / busy if busy > 0 else nan,
        "mean_in_system": st["system_time"] / span if positive else nan,
        "mean_kv_usage": st["blocks_time"] / (busy * blocks) if busy > 0 and blocks else nan,
        "mean_max_num_seqs": (st["cap_time"] / busy if plan.policy.controller is not None
                              else float(plan.policy.max_num_seqs)) if busy > 0 else nan,
        "prefix_hit_rate": (st["prefix_hits"] / st["prefix_queries"] if plan.policy.prefix_caching
                            and st["prefix_queries"] else nan),
        "prefix_saved_tokens": st["prefix_hits"] / completed if completed else nan,
        "kv_evictions": st["evictions"],
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        g_lat = np.where(out.group_count > 0, out.group_latency / out.group_count, nan)
    if not math.isfinite(plan.policy.kv_tokens):
        ts.pop("kv_blocks")
    sla = plan.policy.controller
    if sla is None:
        ts.pop("max_num_seqs")
        extra.update(sla_infeasible=False, convergence_time=nan)
    else:
        # infeasible: still above D_SLA + eps_D with its interval shrunk to B_min (as the event policies')
        C = _c.C
        ctl = np.atleast_2d(out.ctl)
        extra["sla_infeasible"] = bool(np.any((ctl[:, C.updates] >= _c.SLA_WARMUP_UPDATES)
                                              & (ctl[:, C.tau_avg] > sla.d_sla + sla.eps_d)
                                              & (ctl[:, C.b_low] <= min(sla.b_min, plan.policy.max_num_seqs))))
        extra["convergence_time"] = settled(ts["time"], ts["max_num_seqs"], st)
    kind = plan.policy.kind
    arrays = {}
    if plan.cluster is not None:
        kind = plan.cluster.policy.kind
        # (a cluster reports no controller verdict; its batches' metrics do not apply to iterations)
        del extra["sla_infeasible"], extra["convergence_time"]
        extra.update(plan.cluster.metrics(routed), **_NOT_BATCHES)
        engine_busy = np.array([r[0].floats[_k.S.busy] for r in runs])
        with np.errstate(invalid="ignore", divide="ignore"):
            arrays = {"engine_completed": np.array([r[0].ints[_k.S.completed] for r in runs]),
                      "engine_utilization": engine_busy / span if positive else np.full(len(runs), nan)}
    metrics = assemble(kind, RunTotals(
        completed=completed, span=span, sum_latency=st["sum_latency"], busy=busy, servers=plan.engines,
        batches=iters, members=st["sum_batch"], latency_quantiles=q, group_latency=g_lat), extra)
    mean_running = extra["mean_running"]
    unstable, reason = steady_state(plan.arrivals, n, lambda start, end: engines_backlog(
        ts["time"], queue, queue, mean_running, start, end))
    res = SimulationResult(
        kind=kind, config={**plan.description, "seed_entropy": entropy_str(ss)}, n=n,
        servers=plan.servers,
        edges=np.concatenate(([-np.inf], plan.edges, [np.inf])), metrics=metrics,
        arrays={"latency_histogram": out.hist, "ttft_histogram": out.hist_ttft, "tbt_histogram": out.hist_tbt,
                "group_mean_latency": g_lat, "batch_size_hist": out.size_hist, **arrays},
        requests=requests, time_series=ts, unstable=unstable, unstable_reason=reason,
        latency_quantiles="exact" if requests is not None and not plan.stage_records else HISTOGRAM_QUANTILES,
        kernel_seconds=kernel_seconds, classes=_class_metrics(plan.workload, out, plan.goodput))
    return finish(res, warn, stacklevel=5)
