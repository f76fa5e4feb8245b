"""The planner of prefill/decode disaggregation (:class:`~mbbatch.Disaggregated`;
Patel et al., 2024, Splitwise, arXiv:2311.18677; Zhong et al., 2024,
DistServe, arXiv:2401.09670): the prefill pool, a cluster of continuous
engines behind its router on requests of one output token (:mod:`.continuous`
under :mod:`.cluster`) or LAPS's prefill instances (:mod:`.laps`, without a
decode stage), the stage its prefill policy declares (``prefill_stage``:
:data:`STAGES`); each request's KV transfer; the decode pool,
continuous engines on the prompts prefilled, joined at the transfers' ends
(:mod:`.continuous`, as LAPS's decode stage).

The requests are those of any policy on the same seed: the arrival and
prompt streams drive the prefill pool, the output lengths are drawn on the
service stream as a cluster draws them (common random numbers: a
disaggregated deployment and a colocated cluster serve the same requests).
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from .._kernels import continuous as _k
from .._kernels import continuous_cluster as _cc
from .._kernels import disaggregated as _kd
from .._running import interruptible, stop_flag
from .._seeding import (STREAM_PREDICTION, STREAM_PROMPT, STREAM_SERVICE, STREAM_SYSTEM,
                        entropy_str, stream)
from ..arrivals import Poisson, Replay
from ..predictors import Predictions
from ..results import SimulationResult, Table
from ..service_models import IterationModel
from ..workload import Mixture, Workload
from . import cluster, continuous, laps
from .common import (BATCH_MEANS_GROUPS, HISTOGRAM_ERROR, TIME_SERIES_ROWS, RunTotals, assemble, call_streams,
                     decode_stage_requests, finish, lengths, model_config, quantiles, resolve_n,
                     stage_goodput)

__all__ = ["Plan", "check"]


@dataclass(frozen=True, eq=False)
class Plan:
    """A checked disaggregated run: the prefill pool's plan, the decode
    pool's settings (its plan is made on the transfers' ends)."""

    policy: object
    arrivals: object
    workload: Workload
    model: IterationModel
    decode_model: IterationModel
    n: int
    keep_requests: bool
    memory: int
    prefill: object

    keep_batches = False

    @property
    def servers(self) -> int:
        """The engines of both pools."""
        return self.policy.engines

    @property
    def kernel_args(self) -> tuple:
        """The prefill pool's kernel arguments (the decode pool's follow from its run)."""
        return self.prefill.kernel_args

    @property
    def stage(self):
        """The prefill stage the prefill policy declares (:data:`STAGES`)."""
        return STAGES[self.policy.prefill.prefill_stage]

    @functools.cached_property
    def description(self) -> dict:
        decode = {f"decode_{k}": v for k, v in model_config(self.decode_model).items()}
        return {**self.policy.describe(), **self.arrivals.describe(), **self.workload.describe(),
                **model_config(self.model), **decode, "n": self.n}

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss`` (``warn``: an UnstableWarning where a
        pool's backlog grows; ``progress``: the prefill pool's bar)."""
        drawn = self._checked(ss)
        return finish(_run(self, ss, progress, drawn), warn, stacklevel=4)

    def check_requests(self, ss: np.random.SeedSequence) -> None:
        """Raise the error :meth:`run` with the seed ``ss`` would raise, before
        either pool runs: a request a pool could never run (beyond its KV
        blocks, or its prompt beyond ``max_batched_tokens`` without chunked
        prefill), named by its place in arrival order; the decode pool's
        output less the prefill's first token (a one-token request, which
        never reaches it, checked as one of two tokens, so that the places
        stay those of arrival order)."""
        self._checked(ss)

    def _checked(self, ss: np.random.SeedSequence) -> tuple | None:
        """:meth:`check_requests`'s work.  Returns the requests' prompts and
        outputs as the run draws them (the prompt and service streams), for
        the run to take rather than draw again; None with programs (their
        calls are the prefill pool's to draw)."""
        n, wl = self.n, self.workload
        dplan = _decode_plan(self.policy, Poisson(1.0), wl, self.decode_model, n)
        if self.policy.programs is not None:
            self.stage.check_requests(self, ss, None)
            # (the programs' calls: each one's context and output; a closed loop's by call id, every call its
            # programs may make)
            _, prompt, out = _calls(self, ss)
            continuous.check_fits(dplan, prompt, np.maximum(out - 1.0, 1.0))
            return None
        prompt, out = (lengths(d, stream(ss, k), n, True) for d, k in ((wl._prompt, STREAM_PROMPT),
                                                                        (wl._output, STREAM_SERVICE)))
        self.stage.check_requests(self, ss, (prompt, out))
        # (the decode pool's prompts: with the KV cache of a request's system prompt too)
        brought = prompt
        if wl.system_prompts is not None:
            brought = prompt + wl.system_prompts.draw(stream(ss, STREAM_SYSTEM), n)[1]
        continuous.check_fits(dplan, brought, np.maximum(out - 1.0, 1.0))
        return prompt, out


def _calls(plan: Plan, ss: np.random.SeedSequence) -> tuple:
    """A deployment's programs' calls, as its prefill pool draws them:
    ``(program arrays, prompts, outputs)`` in arrival order, or by call id
    in a closed loop (the outputs the pool's engines do not run, drawn).  A
    LAPS pool's closed loop draws them as a cluster's
    (:func:`.cluster._program_draws`: common random numbers)."""
    _, prompt, out, arrays = plan.stage.calls(plan, ss)
    return arrays, prompt, out


def _laps_calls(plan: Plan, ss: np.random.SeedSequence) -> tuple:
    """A LAPS pool's programs' calls, drawn as a cluster's
    (:mod:`.cluster`'s rules: common random numbers with a continuous
    prefill pool): ``(times, prompts, outputs, arrays)``, an open loop's
    calls in arrival order (their times, None: the arrival process's, a
    trace's sessions'; ``arrays``: each call's ``program``, ``new_tokens``),
    a closed loop's by call id (no times; ``arrays``: the programs'
    ``start``, the calls' ``gap`` and ``new``)."""
    from ..policies.cluster import Cluster, Sessions
    from ..policies.continuous import ContinuousBatching

    programs, wl, n = plan.policy.programs, plan.workload, plan.n
    if getattr(programs, "closed", False):
        start, gap, new, out = cluster._program_draws(Cluster(ContinuousBatching(), programs=programs),
                                                      plan.arrivals, wl, n, call_streams(ss))
        return None, cluster._contexts(new, out, programs.drawn(n)), out, dict(start=start, gap=gap, new=new)
    if isinstance(programs, Sessions):
        calls, arrays = cluster._session_calls(programs, wl, n)
    else:
        calls, arrays = cluster._program_calls(Cluster(ContinuousBatching(), programs=programs), plan.arrivals, wl,
                                               n, call_streams(ss))
    return (calls.get("arrival_times"), calls["prompt_values"], calls["output_values"],
            {"program": arrays["program"], "new_tokens": arrays["new_tokens"]})


def _laps_open(plan: Plan, ss: np.random.SeedSequence, progress: bool) -> tuple:
    """A LAPS pool's run of open-loop programs' calls (:func:`_laps_calls`):
    LAPS on their arrivals and prompts, each request's program and new
    tokens among its columns.  Returns its result and the calls' outputs."""
    times, prompt, out, arrays = _laps_calls(plan, ss)
    arrivals = plan.arrivals if times is None else Replay(times)
    pp = replace(laps.check(plan.policy.prefill, arrivals, None, plan.n, 1, True,
                            Workload(prompt=prompt, output=np.ones(plan.n), integer_lengths=True), plan.model,
                            False), events=plan.prefill.events)
    return laps.run_columns(pp, ss, progress, arrays), out


#: the records a deployment reads of its pools' requests (:attr:`.continuous.Plan.stage_records`): the
#: prefill pool's arrivals, admissions and first tokens, the decode pool's admissions and completions.  Without
#: ``keep_requests`` its pools keep only these, and its result drops them once read; with it, each pool's
#: result is whole (``res.prefill.requests``, ``res.decode.requests``)
PREFILL_RECORDS = ("arrival", "admitted", "first_token")
DECODE_RECORDS = ("admitted", "completion")


def _decode_plan(pol, arrivals, workload, model, n: int, dealt: bool = False, records: tuple = (), pull=None):
    """The checked plan of the decode pool: ``decode_engines`` engines, the
    requests dealt in turn (or, with another ``decode_router``, unless
    ``dealt``, a cluster of the engines behind it: a closed loop's pool,
    which its kernel routes, is planned as dealt), each bringing its
    prompt's KV cache, pulled in ``pull`` s each once its engine admits it
    (None: none, or every pull 0: its cache came with it); ``records``: the
    only record columns it keeps (:attr:`.continuous.Plan.stage_records`;
    empty: all)."""
    if pull is not None and not np.any(pull > 0.0):
        pull = None
    if (pol.decode_router != "round_robin" or pol.decode_events) and not dealt:
        from ..policies.cluster import Cluster

        pool = Cluster(pol.decode, engines=pol.decode_engines, router=pol.decode_router, programs=None,
                       events=list(pol.decode_events))
        return replace(cluster.check(pool, arrivals, None, n, 1, True, workload, model, False, prefilled=True),
                       kv_name="decode.kv_tokens", stage_records=records, pull=pull)
    return replace(continuous.check(pol.decode, arrivals, None, n, pol.decode_engines, True, workload, model, False,
                                    prefilled=True, servers_name="decode_engines", kv_name="decode.kv_tokens"),
                   stage_records=records, pull=pull)


def _prefill_workload(workload: Workload, n: int) -> Workload:
    """A LAPS prefill pool's requests: the workload's prompts, one output
    token each (the first, the prefill's)."""
    return Workload(prompt=workload.prompt, output=np.ones(n), integer_lengths=True)


def check(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches) -> Plan:
    """The checked :class:`Plan` of a ``simulate`` call of :class:`~mbbatch.Disaggregated`."""
    if service is not None:
        raise TypeError("Disaggregated takes workload=Workload(prompt=..., output=...) (its engines' iterations are "
                        "timed by their tokens), not service=")
    if keep_batches:
        raise TypeError("keep_batches: a Disaggregated deployment's engines batch at every iteration and keep no "
                        "batch records; keep_requests=True keeps each request's first token, transfer and completion")
    if not (servers == 1 or servers is None):
        raise ValueError(f"servers does not apply to Disaggregated: its engines are prefill_engines and "
                         f"decode_engines; got servers = {servers!r}")
    if isinstance(workload, Mixture):
        raise TypeError("workload: a Disaggregated deployment runs one Workload (a Workload.mixture's classes are "
                        "not modelled across its pools yet)")
    if (policy.programs is not None and getattr(policy.programs, "closed", False)
            and isinstance(policy.decode.predictor, Predictions)):
        raise ValueError("decode.predictor: in a closed loop the decode pool predicts each call as its program draws "
                         "it (Oracle() or LogNormalError(sigma)); Predictions(values) are one per request in "
                         "arrival order, which a closed loop makes only as it runs")
    model = IterationModel() if service_model is None else service_model
    if not isinstance(model, IterationModel):
        raise TypeError(f"service_model: a Disaggregated deployment's engines are timed by an IterationModel (or a "
                        f"profile: mb.profiles.get(name)); got {type(service_model).__name__}")
    decode_model = model if policy.decode_model is None else policy.decode_model
    if not workload.integer_lengths:
        raise ValueError("workload.integer_lengths: a Disaggregated deployment's engines step whole tokens; it must "
                         "be True")
    n = resolve_n(n, arrivals, workload.length_specs())
    prefill = STAGES[policy.prefill.prefill_stage].check(policy, arrivals, n, workload, model,
                                                         _records(keep_requests, PREFILL_RECORDS))
    # the decode pool, checked now on as many requests (its arrivals are the transfers' ends, known after the
    # prefill)
    decode = _decode_plan(policy, Poisson(1.0), workload, decode_model, n)
    return Plan(policy=policy, arrivals=arrivals, workload=workload, model=model, decode_model=decode_model, n=n,
                keep_requests=bool(keep_requests), memory=prefill.memory + decode.memory + 8 * 8 * n,
                prefill=prefill)


#: the most runs of the pools a deployment takes to find its prefill engines' KV caches held until read
#: (:func:`_pools`)
HOLD_ROUNDS = 30


def _pools(plan: Plan, ss: np.random.SeedSequence, progress: bool, drawn) -> tuple:
    """Run the pools one after the other: the prefill pool whole, then the
    decode pool on the transfers' ends (``drawn``: the requests' prompts
    and outputs, :meth:`Plan._checked`'s); where the prefill engines hold
    each request's KV blocks until its decode engine's pull lands
    (:meth:`EnginesStage.holds`), the runs that hold them
    (:func:`_held_until_read`).  Returns the prefill pool's result, the
    decode pool's (None: no request of more than one token), each
    request's output, transfer time, readiness for the decode pool, and the
    requests in the order the decode pool takes them."""
    pol = plan.policy
    pre, out = plan.stage.open(plan, ss, progress, drawn)
    transfer = pol.kv_transfer.seconds(pre.requests["prompt"])
    dec, order = _decode_pool(plan, ss, pre, out, transfer)
    if plan.stage.holds(plan):
        return _held_until_read(plan, ss, progress, drawn, pre, dec, out, transfer, order)
    return pre, dec, out, transfer, pre.requests["first_token"], order


def _decode_pool(plan: Plan, ss, pre, out, transfer) -> tuple:
    """The decode pool's run on the prefill pool's ``pre`` (None: no request
    of more than one token) and the requests in the order it takes them."""
    req = pre.requests
    prompt, first = req["prompt"], req["first_token"]
    # (ready for the decode pool at its first token: its engine admits it, then pulls its KV cache)
    order = decode_stage_requests(first, out)
    if not order.size:
        return None, order
    brought, rest = prompt[order], out[order] - 1.0
    stage = Workload(prompt=brought, output=rest, integer_lengths=True, predictor_sigma=plan.workload.predictor_sigma)
    dplan = _decode_plan(plan.policy, Replay(first[order]), stage, plan.decode_model, order.size,
                         records=_records(plan.keep_requests, DECODE_RECORDS), pull=transfer[order])
    # (its requests the stage's values: whole tokens, as its workload would replay them)
    return continuous._run(dplan, ss, False, False, drawn=(brought, rest)), order


def _landings(pre, dec, order, transfer) -> np.ndarray:
    """Each request's release of its prefill engine's KV blocks: its first
    token for a request of one token, else its decode engine's admission
    plus its pull (the pull's landing), in arrival order."""
    release = pre.requests["first_token"].copy()
    if dec is not None:
        release[order] = dec.requests["admitted"] + transfer[order]
    return release


def _held_until_read(plan: Plan, ss, progress, drawn, pre, dec, out, transfer, order) -> tuple:
    """The pools' runs with each prefill engine holding a request's KV
    blocks until its decode engine's pull lands (vLLM's KV connectors keep
    the prefill side's blocks until the decode side has read them; Zhong et
    al., 2024, DistServe, arXiv:2401.09670), from the runs ``pre`` and
    ``dec`` that freed them at the first token.

    The landings are known only from the decode pool's run, which reads the
    prefill pool's first tokens.  Where the blocks held could never have
    kept a request waiting (:func:`_held_fit`), ``pre`` and ``dec``
    stand.  Where that test cannot tell, the prefill pool is run again with the
    landings as its releases: when every first token is the same as before
    (the held blocks never kept a request waiting), the runs agree with
    each other, which is the deployment's answer (by induction over time,
    each engine's state at an instant depends only on earlier releases and
    first tokens, an iteration taking time, so the consistent runs are
    unique).  Otherwise, or where the blocks held would exceed an engine's,
    the pools run again in one loop
    (:func:`_in_one_loop`, :func:`mbbatch._kernels.disaggregated.run_closed`),
    each pull's landing freeing its blocks as the decode engine starts it,
    each request a program of one call arriving at its arrival time.  Its
    decode pool's predictions are then drawn per request in arrival order
    (:func:`_decode_calls`), where the pools run one after the other draw
    them in the order the decode pool takes the requests.

    Open-loop programs, whose calls one loop does not take, are run in
    turn instead: the prefill pool with the last landings, then the decode
    pool, until the first tokens repeat; after :data:`HOLD_ROUNDS` rounds
    without it a warning says so and the last runs stand.  Returns
    :func:`_pools`'s answer."""
    first = pre.requests["first_token"]
    release = _landings(pre, dec, order, transfer)
    fit = _held_fit(plan, pre, release)
    if fit == _kd.FITS:
        return pre, dec, out, transfer, first, order
    if plan.policy.programs is None:
        if fit == _kd.TIGHT:
            held, _ = plan.stage.open(plan, ss, False, drawn, release=release)
            if np.array_equal(held.requests["first_token"], first, equal_nan=True):
                return held, dec, out, transfer, first, order
        return _open_in_one_loop(plan, ss, progress, drawn, pre, transfer)
    for _ in range(HOLD_ROUNDS):
        held, _ = plan.stage.open(plan, ss, False, drawn, release=release)
        if np.array_equal(held.requests["first_token"], first, equal_nan=True):
            return held, dec, out, transfer, first, order
        pre, first = held, held.requests["first_token"]
        dec, order = _decode_pool(plan, ss, pre, out, transfer)
        release = _landings(pre, dec, order, transfer)
    warnings.warn(f"the prefill engines' KV caches held until the decode engines read them: the pools' runs did "
                  f"not agree within {HOLD_ROUNDS} rounds; the last runs stand", RuntimeWarning, stacklevel=6)
    return pre, dec, out, transfer, first, order


def _held_fit(plan: Plan, pre, release) -> int:
    """How holding each request's KV blocks on its prefill engine until
    ``release`` (in arrival order) fits the prefill pool's run ``pre``,
    which freed them at the first token.  In that run a request takes its
    blocks as it is admitted and frees them at its first token; held, it
    would free them at its release.  :data:`~mbbatch._kernels.disaggregated.FITS`
    (:func:`~mbbatch._kernels.disaggregated.holds_fit`): on every engine,
    the most blocks taken at once that way and the most a request takes fit
    its blocks together, so every memory test of the run (a request's
    blocks against the free ones) passes held or not, and both runs decide
    alike at every step: holding changes nothing.  ``EXCEEDS``: at some
    admission an engine would hold more than its blocks, so holding changes
    the run.  Else (or with a preemption: a request admitted twice)
    ``TIGHT``: the test cannot tell."""
    if pre.preemptions:
        return _kd.TIGHT
    engine, req = plan.policy.prefill, pre.requests
    return _kd.holds_fit(req["admitted"], req["first_token"], release, req["prompt"], req[plan.stage.column],
                         plan.prefill.engines, engine.block_size, int(engine.kv_tokens // engine.block_size))


def _open_in_one_loop(plan: Plan, ss, progress: bool, drawn, pre, transfer) -> tuple:
    """An open loop's pools in one loop (:func:`_held_until_read`): each
    request of the prefill pool's run ``pre`` a program of one call,
    arriving at its arrival time, its prompt and output (``drawn``), its
    transfer time ``transfer``."""
    arrival = pre.requests["arrival"]
    prompt, one, one_pred, _ = continuous._requests(plan.prefill, ss, *drawn)
    out = drawn[1]
    programs = dict(start=arrival, gap=np.zeros(arrival.size), new=prompt)
    return _in_one_loop(plan, ss, progress, programs, prompt, out, one, one_pred, None,
                        call_streams(ss).arrival, ())


def _closed_pools(plan: Plan, ss: np.random.SeedSequence, progress: bool) -> tuple:
    """:func:`_pools` for closed-loop programs: both pools in one loop
    (:func:`mbbatch._kernels.disaggregated.run_closed`), a call's answer
    from the decode pool (or, of one token, from the prefill pool) issuing
    its program's next call.  The calls (by call id) are those a Cluster
    with these programs draws on the same seed; the decode pool's
    predictions are drawn by call id."""
    pp = plan.prefill
    sources = call_streams(ss)
    arrivals = sources.arrival
    _, prompt, out, programs = pp.cluster.calls(pp, sources)
    drawn = {}
    prompt, one, one_pred, _ = continuous._requests(pp, ss, prompt, out, prefixes=drawn)
    P = programs["start"].size
    prefixes = pp.cluster.prefixes(pp, prompt, ((np.arange(prompt.size) // (prompt.size // P), programs["new"],
                                                 None), P), drawn)
    return _in_one_loop(plan, ss, progress, programs, prompt, out, one, one_pred, prefixes, arrivals,
                        ("program", "new_tokens"))


def _in_one_loop(plan: Plan, ss, progress: bool, programs: dict, prompt, out, one, one_pred, prefixes, arrivals,
                 columns: tuple) -> tuple:
    """Both pools in one loop (:func:`mbbatch._kernels.disaggregated.run_closed`)
    on the calls of ``programs`` (the programs' ``start``, by call id their
    ``gap`` and ``new`` tokens), by call id their ``prompt``, output
    (``out``), the prefill pool's outputs and predictions (``one``,
    ``one_pred``: one token) and ``prefixes``, the arrival stream
    ``arrivals``; the prefill engines hold a call's KV blocks until its
    pull lands where the stage :meth:`~EnginesStage.holds` them.  The
    prefill pool's records get the kernel's ``columns`` beside each
    request's engine.  Returns :func:`_pools`'s answer."""
    pol, pp, n = plan.policy, plan.prefill, plan.n
    dplan, d_out, d_pred, link = _decode_calls(plan, ss, prompt, out)
    calls = {**programs, "prompt": prompt, "output": one, "prediction": one_pred, "d_output": d_out,
             "d_prediction": d_pred, "link": link}
    if plan.stage.holds(plan):
        # (a call the decode pool takes holds its blocks until its pull lands, the kernel says when; one of one
        # token frees them at its first token)
        calls["release"] = np.where(d_out > 0.0, np.inf, -np.inf)
    stop = stop_flag()
    t0 = time.perf_counter()
    (runs, where, local), d_runs, routed, code, got = interruptible(
        lambda: _kd.run_closed(pp.kernel_args[0], dplan.kernel_args[0], calls, pp.edges, dplan.edges,
                               pp.cluster.router, pp.engines, pol.decode_engines, _k.ContinuousStreams(arrivals),
                               stop, control=pp.control, d_control=dplan.control, groups=BATCH_MEANS_GROUPS,
                               ts_rows=TIME_SERIES_ROWS, prefixes=prefixes, cache_routing=pp.cluster.cache_routing,
                               d_router=pol.decode_router, events=pp.cluster.events,
                               d_events=cluster.event_arrays(pol.decode_events)),
        stop, n if progress else None)
    seconds = time.perf_counter() - t0
    continuous._check_codes(runs + d_runs)
    k = got["call"]
    pre = continuous._run(pp, ss, False, False, ran=((prompt[k], one[k], one_pred[k], None), runs, (where, local),
                                                     routed, {"engine": where, **{c: got[c] for c in columns}},
                                                     seconds))
    return pre, *_closed_decode(plan, ss, prompt, out, d_out, d_pred, link, got, d_runs)


def _closed_decode(plan: Plan, ss, prompt, out, d_out, d_pred, link, got: dict, d_runs) -> tuple:
    """The rest of :func:`_pools`'s answer for a closed loop (by call id:
    the calls' ``prompt``, ``out``, the decode pool's ``d_out`` and
    ``d_pred``, and ``link``; ``got``: the kernel's): the decode pool's
    result (None: no call of more than one token), and per request its
    output, transfer time, readiness and the order the pool took them."""
    pol, k = plan.policy, got["call"]
    order = got["handed"]
    dec = None
    if order.size:
        j = k[order]
        stage = Workload(prompt=prompt[j], output=d_out[j], integer_lengths=True)
        events = bool(pol.decode_events)
        dp = _decode_plan(pol, Replay(got["ready"][order]), stage, plan.decode_model, order.size,
                          dealt=not events, records=_records(plan.keep_requests, DECODE_RECORDS))
        # (dealt in turn: request m number m // D of engine m % D; else as the kernel's router placed it)
        placed = None if pol.decode_router == "round_robin" and not events else tuple(got["d_placed"])
        routed = None
        if events:
            # (a pool with engine events is a cluster's: its routing counts, the decisions and requests dealt
            # again the kernel's, the loads over the decisions not kept: NaN imbalance)
            routed = dict(_cc.ROUTED.unpack(_cc.ROUTED.zeros()), routes=int(order.size),
                          large=int(np.count_nonzero(prompt[j] > dp.cluster.policy.threshold)),
                          rerouted=got["d_rerouted"])
        dec = continuous._run(dp, ss, False, False, ran=((prompt[j], d_out[j], d_pred[j], None), d_runs, placed,
                                                         routed, {"engine": placed[0]} if events else {}, 0.0))
    return dec, out[k], link[k], got["ready"], order


def _closed_laps_pools(plan: Plan, ss: np.random.SeedSequence, progress: bool) -> tuple:
    """:func:`_closed_pools` with LAPS's prefill instances as the prefill
    pool (:func:`mbbatch._kernels.disaggregated.run_closed_laps`): the same
    calls as a continuous prefill pool's on the same seed (:func:`_calls`),
    LAPS's result its pool's, with each request's program and new tokens."""
    pol, pp, n = plan.policy, plan.prefill, plan.n
    programs, prompt, out = _calls(plan, ss)
    dplan, d_out, d_pred, link = _decode_calls(plan, ss, prompt, out)
    calls = {**programs, "prompt": prompt, "d_output": d_out, "d_prediction": d_pred, "link": link}
    stop = stop_flag()
    t0 = time.perf_counter()
    (lo, req), d_runs, code, got = interruptible(
        lambda: _kd.run_closed_laps(pp.kernel_args[0], dplan.kernel_args[0], calls, dplan.edges, pol.decode_engines,
                                    _k.ContinuousStreams(call_streams(ss).arrival), stop, d_control=dplan.control,
                                    groups=BATCH_MEANS_GROUPS, ts_rows=TIME_SERIES_ROWS, d_router=pol.decode_router,
                                    events=pp.events, d_events=cluster.event_arrays(pol.decode_events)),
        stop, n if progress else None)
    seconds = time.perf_counter() - t0
    continuous._check_codes(d_runs + [(None, None, code)])
    req.update(program=got["program"], new_tokens=got["new_tokens"])
    pre = laps.result(pp, ss, lo, req, seconds)
    return pre, *_closed_decode(plan, ss, prompt, out, d_out, d_pred, link, got, d_runs)


def _records(keep_requests: bool, records: tuple) -> tuple:
    """A pool's record columns: ``records`` without ``keep_requests``, else
    all (empty)."""
    return () if keep_requests else records


def _decode_calls(plan: Plan, ss: np.random.SeedSequence, prompt, out) -> tuple:
    """A closed loop's decode pool, by call id (the calls' ``prompt`` and
    ``out``): its plan (dealt: the kernel routes), outputs (``out - 1``),
    predictions (drawn by call id) and each call's KV transfer time."""
    pol = plan.policy
    d_out = out - 1.0
    dplan = _decode_plan(pol, Replay(np.zeros(plan.n)), plan.workload, plan.decode_model, plan.n, dealt=True)
    d_pred = dplan.predictor.predict(np.maximum(d_out, 1.0), lambda: stream(ss, STREAM_PREDICTION))
    return dplan, d_out, d_pred, pol.kv_transfer.seconds(prompt)


class EnginesStage:
    """A prefill pool of continuous engines (``prefill_stage = "engines"``:
    :class:`~mbbatch.ContinuousBatching`): a cluster of them behind the
    deployment's router (:mod:`.cluster`'s continuous driver), each request
    served to its first token.  A stage answers, for a deployment's
    :class:`Plan`: its pool's checked plan (:meth:`check`), its requests'
    check (:meth:`check_requests`), its programs' calls (:meth:`calls`), its
    open-loop run (:meth:`open`), its closed loop beside the decode pool
    (:meth:`closed`) and the requests' column naming their engine
    (:attr:`column`)."""

    #: the column of each request's prefill engine in the pool's records
    column = "engine"

    def holds(self, plan: Plan) -> bool:
        """Whether the pool's engines hold a request's KV blocks until its
        pull lands (:func:`_held_until_read`): with limited KV blocks and
        no prefix cache.  (With one, a request's blocks go back to the cache
        at its first token, as before: holding cached blocks is not
        modelled.)"""
        engine = plan.policy.prefill
        return math.isfinite(engine.kv_tokens) and not engine.prefix_caching

    def split(self, prefill, p: int, router) -> dict:
        """A deployment's settings for a pool of ``p`` of these engines
        (:func:`~mbbatch.find_split`): ``p`` copies of ``prefill`` behind
        ``router``."""
        return dict(prefill=prefill, prefill_engines=p, router=router)

    def colocated(self, deployment):
        """The engine a colocated cluster of ``deployment``'s engines runs
        (:func:`~mbbatch.find_split`): its prefill engine, which runs both
        phases."""
        return deployment.prefill

    def check(self, policy, arrivals, n: int, workload, model, records: tuple = ()):
        """The pool's checked plan: the workload's requests, each served to
        its first token (``records``: the only record columns it keeps,
        :attr:`.continuous.Plan.stage_records`; empty: all).  A program's calls grow by their outputs, whose KV
        cache the decode pool made, so no engine of the pool holds a whole
        context: no KV reuse; a prefix cache keeps the prompts it
        prefilled."""
        from ..policies.cluster import Cluster

        pool = Cluster(policy.prefill, engines=policy.prefill_engines, router=policy.router, programs=policy.programs,
                       kv_reuse=False, events=list(policy.prefill_events))
        return replace(cluster.check(pool, arrivals, None, n, 1, True, workload, model, False, first_token=True),
                       kv_name="prefill.kv_tokens", stage_records=records)

    def check_requests(self, plan: Plan, ss: np.random.SeedSequence, drawn) -> None:
        """Refuse a request the pool could never run (``drawn``: the
        requests' prompts and outputs, :meth:`Plan._checked`'s; None with
        programs: their calls, drawn by the pool)."""
        if drawn is None:
            plan.prefill.check_requests(ss)
        else:
            continuous._requests(plan.prefill, ss, *drawn)

    def calls(self, plan: Plan, ss: np.random.SeedSequence) -> tuple:
        """The programs' calls, ``(times, prompts, outputs, arrays)``
        (:meth:`.cluster.ContinuousPart.calls`)."""
        return plan.prefill.cluster.calls(plan.prefill, call_streams(ss))

    def open(self, plan: Plan, ss: np.random.SeedSequence, progress: bool, drawn, release=None) -> tuple:
        """The pool's run and each request's output (``drawn``: as
        :meth:`check_requests`'s; ``release``: the instant each request's
        engine frees its KV blocks, in arrival order, None: at its first
        token)."""
        pp = plan.prefill if release is None else replace(plan.prefill, release=release)
        if drawn is None:
            return pp.run(ss, warn=False, progress=progress), self.calls(plan, ss)[2]
        return continuous._run(pp, ss, False, progress, drawn=drawn), drawn[1]

    def closed(self, plan: Plan, ss: np.random.SeedSequence, progress: bool) -> tuple:
        """Closed-loop programs, both pools in one loop (:func:`_closed_pools`)."""
        return _closed_pools(plan, ss, progress)


class LapsStage(EnginesStage):
    """LAPS's prefill instances as the prefill pool (``prefill_stage =
    "laps"``: :class:`~mbbatch.LAPS`, without a decode stage): its own
    instances behind its own router, timed by the model's prefill
    iteration; :class:`EnginesStage`'s answers."""

    column = "instance"
    def holds(self, plan: Plan) -> bool:
        """LAPS's instances model no KV blocks: none held."""
        return False

    def split(self, prefill, p: int, router) -> dict:
        """LAPS with ``p`` prefill instances (its long instances derived
        again, its own router: ``router`` unused)."""
        return dict(prefill=replace(prefill, instances=p, long_instances=None))

    def colocated(self, deployment):
        """The decode engine's settings: LAPS's instances run no decode."""
        return deployment.decode

    def check(self, policy, arrivals, n: int, workload, model, records: tuple = ()):
        if workload.system_prompts is not None:
            raise ValueError("workload.system_prompts: a LAPS prefill pool does not model system prompts; give a "
                             "Workload without system_prompts, or ContinuousBatching prefill engines")
        return replace(laps.check(policy.prefill, arrivals, None, n, 1, True, _prefill_workload(workload, n), model,
                                  False), events=cluster.event_arrays(policy.prefill_events))

    def check_requests(self, plan: Plan, ss: np.random.SeedSequence, drawn) -> None:
        plan.prefill.check_requests(ss)

    def calls(self, plan: Plan, ss: np.random.SeedSequence) -> tuple:
        return _laps_calls(plan, ss)

    def open(self, plan: Plan, ss: np.random.SeedSequence, progress: bool, drawn) -> tuple:
        if drawn is None:
            # (the calls drawn once: their outputs with LAPS's run)
            return _laps_open(plan, ss, progress)
        return plan.prefill.run(ss, warn=False, progress=progress), drawn[1]

    def closed(self, plan: Plan, ss: np.random.SeedSequence, progress: bool) -> tuple:
        """Closed-loop programs on LAPS's instances (:func:`_closed_laps_pools`)."""
        return _closed_laps_pools(plan, ss, progress)


#: the prefill stages, by the name a prefill policy declares (its
#: ``prefill_stage``, :mod:`mbbatch.policies.base`)
STAGES = {"engines": EnginesStage(), "laps": LapsStage()}


def _run(plan: Plan, ss: np.random.SeedSequence, progress: bool, drawn) -> SimulationResult:
    pol, wl, n = plan.policy, plan.workload, plan.n
    if getattr(pol.programs, "closed", False):
        pre, dec, out, transfer, ready, order = plan.stage.closed(plan, ss, progress)
    else:
        pre, dec, out, transfer, ready, order = _pools(plan, ss, progress, drawn)
    pool = pre.metrics()
    req = pre.requests
    arrival, prompt, first = req["arrival"], req["prompt"], req["first_token"]
    completion = first.copy()
    admitted = np.full(n, math.nan)
    if dec is not None:
        completion[order] = dec.requests["completion"]
        admitted[order] = dec.requests["admitted"]
    latency = completion - arrival
    ttft = first - arrival
    start = float(arrival.min())
    span = float(completion.max()) - start
    nan = math.nan
    pools = [r for r in (pre, dec) if r is not None]
    busy = sum(r.mean_busy_servers * r.span for r in pools if r.completed)
    batches = sum(r.n_batches for r in pools)
    members = sum(r.mean_batch_size * r.n_batches for r in pools if r.n_batches)
    totals = RunTotals(completed=n, span=span, sum_latency=float(latency.sum()), busy=busy, servers=pol.engines,
                       batches=batches, members=members, latency_quantiles=quantiles(None, latency))
    moved = out > 1.0
    q_ttft = quantiles(None, ttft)
    extra = {
        "token_throughput": float(out.sum()) / span if span > 0 else nan,
        "mean_tbt": dec.mean_tbt if dec is not None else nan,
        **{f"tbt_{q}": getattr(dec, f"tbt_{q}") if dec is not None else nan for q in ("p50", "p95", "p99")},
        "mean_ttft": float(ttft.mean()),
        **{f"ttft_{q}": float(v) for q, v in zip(("p50", "p95", "p99"), q_ttft)},
        "goodput": stage_goodput(wl, {"first_token": first, "arrival": arrival}, completion, out)
        if wl.has_objectives else nan,
        "mean_transfer_time": float(transfer[moved].mean()) if moved.any() else nan,
        # (admitted[order] is the decode pool's admissions: the waits in the order it took the requests)
        "mean_decode_wait": float((dec.requests["admitted"] - ready[order]).mean()) if order.size else nan,
        # (the prefix cache: the prefill pool's, per request; NaN and 0 without it)
        **{k: pool.get(k, nan) for k in ("prefix_hit_rate", "prefix_saved_tokens")},
        "kv_evictions": int(pool.get("kv_evictions", 0)),
        "prefill_utilization": pre.utilization,
        "decode_utilization": dec.utilization if dec is not None else nan,
    }
    requests = None
    if plan.keep_requests:
        requests = Table({"arrival": arrival, "prompt": prompt, "output": out, "first_token": first,
                          "transfer_time": np.where(moved, transfer, nan), "decode_admitted": admitted,
                          "completion": completion, "latency": latency, "ttft": ttft,
                          "prefill_engine": req[plan.stage.column],
                          **{k: req[k] for k in ("program", "new_tokens") if pol.programs is not None}})
    else:
        # (the pools' records, read: a result that keeps none holds none of theirs either)
        for r in pools:
            r.requests = None
    unstable = [f"{name}: {r.unstable_reason}" for name, r in (("prefill", pre), ("decode", dec))
                if r is not None and r.unstable]
    reason = "; ".join(unstable) if unstable else pre.unstable_reason
    return SimulationResult(
        kind=pol.kind, config={**plan.description, "seed_entropy": entropy_str(ss)}, n=n, servers=pol.engines,
        edges=np.array([-np.inf, np.inf]), metrics=assemble(pol.kind, totals, extra),
        arrays={"prefill": pre, **({"decode": dec} if dec is not None else {}),
                # (the batch-means groups: contiguous blocks of arrivals, their mean latency end to end)
                "group_mean_latency": np.array([g.mean() if g.size else math.nan
                                                for g in np.array_split(latency, BATCH_MEANS_GROUPS)])},
        requests=requests,
        time_series=None, unstable=bool(unstable), unstable_reason=reason,
        latency_quantiles=f"latency and time to first token exact; time between tokens the decode pool's, "
                          f"{HISTOGRAM_ERROR}",
        kernel_seconds=pre.kernel_seconds + (dec.kernel_seconds if dec is not None else 0.0))
