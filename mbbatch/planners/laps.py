"""The planner of LAPS (arXiv:2601.11589) on its kernel
(:mod:`mbbatch._kernels.laps`): prefill instances behind the LAPS router,
and, with a decode stage, the token-level plan (:mod:`.tokens`) of the decode
servers on the requests' first tokens.

Goodput (Zhong et al., 2024, DistServe, arXiv:2401.09670): without a decode
stage a request ends at its first token, so only ``ttft_slo`` applies (the
kernel counts the requests within it) and a ``tpot_slo`` is refused; with
one, each request's time to first token (the prefill's) and time per output
token, ``(last token - first token) / (output - 1)`` from its prefill's first
token to the decode stage's last (the wait for the decode stage included),
are read from the per-request arrays the decode stage needs anyway.  NaN
where the workload sets neither objective."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np

from .._kernels import common as _common
from .._kernels import laps as _l
from .._running import check_memory, interruptible, stop_flag
from .._seeding import STREAM_ARRIVALS, STREAM_PROMPT, STREAM_SERVICE, entropy_str, stream
from ..arrivals import Poisson, Replay
from ..results import SimulationResult, Table
from ..service_models import DecodeModel, IterationModel, PrefillModel
from ..workload import Workload
from . import continuous, tokens
from .. import stats
from .common import (BATCH_MEANS_GROUPS, HISTOGRAM_ERROR, HISTOGRAM_QUANTILES, RunTotals, assemble, check_arrivals,
                     check_times, decode_stage_checked, decode_stage_requests, drawn, finish, lengths, model_config,
                     quantiles, resolve_n, rvs_memory, stage_goodput, steady_state, times_name)

__all__ = ["Plan", "check"]


@dataclass(frozen=True, eq=False)
class Plan:
    """A checked LAPS run, ready to allocate and simulate."""

    policy: object
    arrivals: object
    workload: Workload
    model: PrefillModel
    n: int
    keep_requests: bool
    memory: int
    decode_model: object = None
    #: the instances' events (:func:`mbbatch._kernels.laps.run`'s; None: none): a disaggregated deployment's
    events: tuple = None

    keep_batches = False

    @property
    def servers(self) -> int:
        """The instances (what serves batches side by side)."""
        return self.policy.instances

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss`` (``warn``: an UnstableWarning where an
        instance group's backlog grows, as the other plans warn; ``progress``
        as theirs)."""
        dec = self.policy.decode
        if dec is not None and dec.resumable and (math.isfinite(dec.kv_tokens) or not dec.chunked_prefill):
            self.check_requests(ss)     # (a request the decode stage would refuse: before the prefill runs)
        return finish(_run(self, ss, progress), warn, stacklevel=4)

    def check_requests(self, ss: np.random.SeedSequence) -> None:
        """Raise the error a continuous decode stage would raise in :meth:`run`
        with the seed ``ss``, before any stage runs: a request it could never
        run (its prompt and output beyond the KV blocks), named by its place
        in arrival order.  The prompts and outputs are those the run draws
        (the prefill instances' prompts are the prompt stream's lengths, as
        every token-level policy's), each output less the prefill's first
        token (:func:`.common.decode_stage_requests`; a one-token request, which never
        reaches the stage, checked as one of two tokens, so that the places
        stay those of arrival order); no other stage refuses a drawn
        request."""
        pol, wl, n = self.policy, self.workload, self.n
        if pol.decode is None or not pol.decode.resumable:
            return
        # (the stage's fit, on the arrays: no workload or arrivals of their own to validate)
        continuous.check_fits(_decode_plan(pol, Poisson(1.0), wl, self.decode_model, n),
                              *decode_stage_checked(wl, ss, n))

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and inputs."""
        pol, arrivals, workload, n = self.policy, self.arrivals, self.workload, self.n
        akind, rate, times, aparams, aends = arrivals.kernel_fields(n)
        config = _l.CONFIG.pack(
            n=n, arrival_kind=akind, prompt_kind=workload._prompt.kernel_kind, integer=workload.integer_lengths,
            instances=pol.instances, threshold=pol.threshold, max_batch=pol.max_batch, dual=pol.dual_queue,
            dynamic=pol.routed, long0=pol.long_instances if pol.routed else 0,
            # (the decode stage starts each request at its first token)
            keep=self.keep_requests or pol.decode is not None, rate=rate,
            window=pol.window, max_batch_tokens=pol.max_batch_tokens, interval=pol.interval, ratio=pol.ratio,
            a=self.model.a, b=self.model.b,
            # (goodput's count: the kernel's without a decode stage; with one, from the per-request arrays)
            ttft_slo=workload.ttft_slo if pol.decode is None else math.inf)
        inputs = _l.INPUTS.pack(arrival_times=times, arrival_params=aparams, arrival_ends=aends,
                                prompt_params=workload._prompt.params, prompt_values=workload._prompt.values)
        return config, inputs

    @functools.cached_property
    def description(self) -> dict:
        decode = {} if self.decode_model is None else {
            f"decode_{k}": v for k, v in model_config(self.decode_model).items()}
        return {**self.policy.describe(), **self.arrivals.describe(), **self.workload.describe(),
                **model_config(self.model), **decode, "n": self.n}


def check(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches) -> Plan:
    """The checked :class:`Plan` of a ``simulate`` call of :class:`~mbbatch.LAPS`."""
    if service is not None:
        raise TypeError("LAPS takes workload=Workload(prompt=..., output=...) (prompt lengths decide its routing "
                        "and its prefill time), not service=")
    if keep_batches:
        raise TypeError("keep_batches is for the token-level policies; LAPS keeps per-request records "
                        "(keep_requests=True)")
    if not (servers == 1 or servers is None):
        raise ValueError(f"servers does not apply to LAPS: its instances are LAPS(instances=...); got servers = "
                         f"{servers!r}")
    model = PrefillModel() if service_model is None else service_model
    if not isinstance(model, (PrefillModel, IterationModel)):
        raise TypeError(f"LAPS takes service_model=PrefillModel(a, b) (a prefill batch takes a + b x its prompt "
                        f"tokens) or an IterationModel (its prefill iteration); got {type(model).__name__}")
    # (an engine's prefill batch is one prefill iteration: exactly a PrefillModel)
    model = model.prefill_model()
    if policy.decode is None and math.isfinite(workload.tpot_slo):
        raise ValueError(f"tpot_slo: LAPS without a decode stage returns each request's first token alone, so it "
                         f"has no time per output token to hold to an objective; give LAPS a decode stage "
                         f"(decode=..., its decode instances) or leave tpot_slo at inf (goodput then counts "
                         f"ttft_slo alone); got tpot_slo = {workload.tpot_slo!r}")
    if policy.decode is not None and workload._output.support[1] <= 1.0:
        raise ValueError(_ONE_TOKEN + f"; got workload.output of at most {workload._output.support[1]:g} tokens")
    check_arrivals(arrivals)
    n = resolve_n(n, arrivals, [("workload.prompt", workload._prompt)])
    E = policy.instances
    parts = {
        "n": (25 * n, "the requests' arrival times, prompts, queue links and classes"),
        "instances": (8 * (7 * E + E * policy.max_batch), "the instances' queues and batches"),
        "batch_size": (3 * 8 * _common.HIST_SIZE, "the time-to-first-token histograms"),
    }
    if keep_requests or policy.decode is not None:
        parts["keep_requests"] = (48 * n, "the per-request arrays (keep_requests, or the decode stage)")
    decode_model = None
    if policy.decode is not None:
        decode_model = policy.decode_model if policy.decode_model is not None else (
            IterationModel() if policy.decode.resumable else DecodeModel(prefill_per_token=0.0))
        # the decode stage, checked now (its arrivals are the first tokens, known after the prefill)
        parts["decode"] = (_decode_plan(policy, Poisson(1.0), workload, decode_model, n).memory,
                           "the decode stage")
    parts.update(rvs_memory([("workload.prompt", workload._prompt)], n))
    memory = check_memory(parts)
    check_times(arrivals, n, model.one_request(workload._prompt.mean, workload._output.mean), times_name(model))
    return Plan(policy=policy, arrivals=arrivals, workload=workload, model=model, n=n,
                     keep_requests=bool(keep_requests), memory=memory, decode_model=decode_model)


def _decode_plan(pol, arrivals, workload, model, n: int, output_law=None):
    """The checked plan of LAPS's decode stage, the prompts prefilled (their
    KV cache comes with the requests): a resumable engine's
    (:attr:`~mbbatch.policies.base.Policy.resumable`, on its own KV memory)
    or a token-level policy's."""
    if pol.decode.resumable:
        return continuous.check(pol.decode, arrivals, None, n, pol.decode_servers, True, workload, model, False,
                                prefilled=True, servers_name="decode_servers", kv_name="decode.kv_tokens")
    return tokens.check(pol.decode, arrivals, None, n, pol.decode_servers, True, workload, model, False,
                        output_law=output_law)


#: the refusal of a decode stage no request reaches
_ONE_TOKEN = ("decode: LAPS's decode stage generates each request's output after its first token (the prefill's), "
              "so a one-token request never reaches it and a workload of one-token outputs leaves it nothing to do; "
              "drop decode or give outputs of more than one token")


def _run_decode(plan: Plan, req: dict, ss: np.random.SeedSequence):
    """The decode stage after LAPS's prefill: each request of more than one
    output token joins the decode policy at its first token
    (:func:`.common.decode_stage_requests`), its prompt the one prefilled, its output the
    workload's output length (replayed in order, or drawn in Python on the
    output stream) less the first token; a one-token request is done at its
    first token.  Returns the decode run's result and each request's
    completion (its last token) and output length, in arrival order."""
    pol, wl, n = plan.policy, plan.workload, plan.n
    first = req["first_token"]
    out = lengths(wl._output, stream(ss, STREAM_SERVICE), n, bool(wl.integer_lengths))
    order = decode_stage_requests(first, out)
    if order.size == 0:
        # (outputs that may pass one token are checked in check(); these draws all happened to be one)
        raise ValueError(_ONE_TOKEN + f"; every one of the {n} outputs drawn is")
    stage = Workload(prompt=req["prompt"][order], output=out[order] - 1.0, integer_lengths=wl.integer_lengths,
                     predictor_sigma=wl.predictor_sigma)
    # (the output law: the workload's, whose edges a decode stage's optimal bins read, one token apart from the
    # stage's outputs)
    res = _decode_plan(pol, Replay(first[order]), stage, plan.decode_model, order.size,
                       output_law=wl._output.dist).run(ss, warn=False)
    completion = first.copy()
    completion[order] = res.requests.completion
    return res, completion, out


def _laps_groups(pol, E: int, start: float, move_time: np.ndarray, move_instance: np.ndarray,
                 move_group: np.ndarray, events=None) -> dict:
    """The instances in the pool of LAPS's short and long groups over time,
    a step function: at the first arrival, then after each move of the
    router's dynamic allocation (from its log of moves) and each instance
    leaving or joining the pool (``events``: :func:`mbbatch._kernels.laps.run`'s;
    at equal times before a move, which comes with an arrival)."""
    group = np.where(np.arange(E) >= E - pol.long_instances, _l.LONG, _l.SHORT)
    inside = np.ones(E, bool)
    steps = [(t, 0, int(e), bool(add)) for t, e, add in zip(*events)] if events is not None else []
    steps += [(float(t), 1, int(e), int(g)) for t, e, g in zip(move_time, move_instance, move_group)]
    steps.sort(key=lambda x: (x[0], x[1]))
    times, short, in_long = [], [], []
    for t, kind, e, value in [(start, 2, 0, 0)] + steps:
        if kind == 0:
            inside[e] = value
        elif kind == 1:
            group[e] = value
        if times and t <= start:
            times.pop(), short.pop(), in_long.pop()
        times.append(max(t, start))
        short.append(int(np.count_nonzero(inside & (group == _l.SHORT))))
        in_long.append(int(np.count_nonzero(inside & (group == _l.LONG))))
    return {"time": np.array(times), "short_instances": np.array(short, np.int64),
            "long_instances": np.array(in_long, np.int64)}


def _backlog(out, st: dict, batches: int) -> tuple:
    """``(growing, reason)``: each category's time to first token by contiguous
    group of arrivals (:func:`mbbatch.stats.groups_verdict`); one growing
    category, whose instance group cannot keep up, is an overload of the run.
    (The prefill stage: a decode stage's own backlog is not checked.)"""
    unit = st["busy"] / batches if batches else math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        means = out.group_ttft / out.group_count
    verdicts = [stats.groups_verdict(means[c], unit, name) for c, name in ((_l.SHORT, "short"), (_l.LONG, "long"))]
    growing = [reason for grows, reason in verdicts if grows]
    if growing:
        return True, "; ".join(growing)
    if all(reason.startswith("not assessed") for _, reason in verdicts):
        return False, verdicts[0][1]
    return False, "no growing backlog"


def run_columns(plan: Plan, ss: np.random.SeedSequence, progress: bool, columns: dict) -> SimulationResult:
    """:meth:`Plan.run`'s result (no warning) with ``columns`` (per request,
    in arrival order) among its requests' (``plan.keep_requests``)."""
    return _run(plan, ss, progress, columns)


def _run(plan: Plan, ss: np.random.SeedSequence, progress: bool, columns: dict | None = None) -> SimulationResult:
    config, inputs = plan.kernel_args
    # the arrival and prompt streams of the token-level policies: the same seed, the same requests
    streams = _l.LapsStreams(stream(ss, STREAM_ARRIVALS), stream(ss, STREAM_PROMPT))
    inputs = drawn(inputs, _l.INPUTS, "prompt_values", plan.workload._prompt, streams.prompt, plan.n)
    stop = stop_flag()
    t0 = time.perf_counter()
    out, req, _ = interruptible(lambda: _l.run(config, inputs, streams, stop, groups=BATCH_MEANS_GROUPS,
                                               events=plan.events), stop, plan.n if progress else None)
    if columns:
        req.update(columns)
    return result(plan, ss, out, req, time.perf_counter() - t0)


def result(plan: Plan, ss: np.random.SeedSequence, out, req, kernel_seconds: float) -> SimulationResult:
    """The result of LAPS's run ``(out, req)`` (:func:`mbbatch._kernels.laps.run`'s,
    or a closed loop's prefill pool's), its decode stage run on it."""
    st = _l.STATS.unpack((out.ints, out.floats))
    pol, E = plan.policy, plan.policy.instances
    completed, nb, short = st["completed"], st["batches"], st["short"]
    nan = math.nan
    span = st["last_completion"] - st["first_arrival"] if completed else nan
    positive = bool(completed) and span > 0
    hist = out.hist_short + out.hist_long
    q_all, q_s, q_l = (quantiles(h, None) for h in (hist, out.hist_short, out.hist_long))
    long_ = completed - short
    totals = RunTotals(completed=completed, span=span, sum_latency=st["sum_ttft"], busy=st["busy"], servers=E,
                       batches=nb, members=st["sum_batch"], latency_quantiles=q_all)
    extra = {
        "mean_ttft": st["sum_ttft"] / completed if completed else nan,
        # (a prefill instance's latency is the time to first token)
        **{f"ttft_{q}": float(v) for q, v in zip(("p50", "p95", "p99"), q_all)},
        # the generated tokens: the decode stage's, NaN without one
        "token_throughput": nan, "mean_tbt": nan, **{f"tbt_{q}": nan for q in ("p50", "p95", "p99")},
        **{f"ttft_short_{q}": float(v) for q, v in zip(("p50", "p95", "p99"), q_s)},
        **{f"ttft_long_{q}": float(v) for q, v in zip(("p50", "p95", "p99"), q_l)},
        "mean_ttft_short": st["sum_ttft_short"] / short if short else nan,
        "mean_ttft_long": st["sum_ttft_long"] / long_ if long_ else nan,
        "short_share": short / completed if completed else nan,
        "group_moves": st["moves"],
        "mean_short_instances": (st["short_instance_time"] / span if pol.routed else float(E)) if positive else nan,
        # (the requests whose first token met ttft_slo, no tpot_slo without a decode stage: NaN without objectives)
        "goodput": st["good"] / completed if completed and plan.workload.has_objectives else nan,
    }
    k = min(st["moves"], out.move_time.size)
    how = HISTOGRAM_QUANTILES
    arrays = {}
    # (a prefill instance's latency is the time to first token: completion is the first token)
    completion = None if req is None else req["first_token"]
    output = None
    if pol.decode is not None and completed:
        # the decode stage: latency end to end, to the last token
        decode, completion, output = _run_decode(plan, req, ss)
        kernel_seconds += decode.kernel_seconds
        e2e = completion - req["arrival"]
        span = float(completion.max()) - st["first_arrival"]
        q = quantiles(None, e2e)
        extra.update(throughput=completed / span if span > 0 else nan, mean_latency=float(e2e.mean()),
                     latency_p50=float(q[0]), latency_p95=float(q[1]), latency_p99=float(q[2]), span=span,
                     token_throughput=float(output.sum()) / span if span > 0 else nan, mean_tbt=decode.mean_tbt,
                     **{f"tbt_{k}": getattr(decode, f"tbt_{k}") for k in ("p50", "p95", "p99")},
                     goodput=stage_goodput(plan.workload, req, completion, output) if plan.workload.has_objectives
                     else nan)
        arrays["decode"] = decode
        how = f"latency exact (end to end); time to first token from histograms, {HISTOGRAM_ERROR}"
    requests = None
    if plan.keep_requests:
        cols = dict(req) if output is None else {**req, "output": output}
        requests = Table({**cols, "completion": completion, "latency": completion - req["arrival"],
                          "ttft": req["first_token"] - req["arrival"]})
    config = {**plan.description, "seed_entropy": entropy_str(ss)}
    unstable, reason = steady_state(plan.arrivals, plan.n, lambda start, end: _backlog(out, st, nb))
    ts = _laps_groups(pol, E, st["first_arrival"] if completed else 0.0, out.move_time[:k], out.move_instance[:k],
                      out.move_group[:k], plan.events) \
        if pol.routed and k == st["moves"] else None
    return SimulationResult(
        kind=pol.kind, config=config, n=plan.n, servers=E, edges=np.array([-np.inf, pol.threshold, np.inf]),
        metrics=assemble(pol.kind, totals, extra),
        arrays={**arrays, "latency_histogram": hist, "ttft_short_histogram": out.hist_short,
                "ttft_long_histogram": out.hist_long,
                "group_moves_log": Table({"time": out.move_time[:k].copy(), "instance": out.move_instance[:k].copy(),
                                          "to_group": np.where(out.move_group[:k] == _l.SHORT, "short", "long")})},
        requests=requests, time_series=ts, unstable=unstable, unstable_reason=reason,
        latency_quantiles=how, kernel_seconds=kernel_seconds)
