"""The planner of the multi-bin kernel (:mod:`mbbatch._kernels.multibin`):
multi-bin batching, the multi-bin paper's model (Guldogan et al., 2024,
arXiv:2412.04504, Section 3 and Algorithm 1)."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np

from .. import stats
from .._kernels import common as _common
from .._kernels import multibin as _k
from .._running import check_memory, interruptible, stop_flag
from .._seeding import STREAM_ARRIVALS, STREAM_PREDICTION, STREAM_PROMPT, STREAM_SERVICE, entropy_str, stream
from .._validation import check_servers
from ..lengths import as_service
from ..predictors import LogNormalError, Oracle
from ..results import SimulationResult, Table
from ..service_models import DENSE_FIELDS, NO_COST, IterationModel, MaxModel
from ..workload import Workload
from .common import (BATCH_MEANS_GROUPS, HISTOGRAM_QUANTILES, RunTotals, assemble, check_arrivals, check_batch_model,
                     check_times, drawn, finish, model_config, per_bin, quantiles, resolve_n, rvs_memory, steady_state)

__all__ = ["Plan", "check"]


@dataclass(frozen=True, eq=False)
class Plan:
    """A checked MultiBin run, ready to allocate and simulate."""

    policy: object
    arrivals: object
    spec: object            # the output lengths (service times under the shorthand)
    workload: Workload | None
    model: MaxModel | IterationModel
    edges: np.ndarray
    n: int
    servers: float
    keep: bool
    memory: int
    predictor: object

    keep_batches = False

    def run(self, ss: np.random.SeedSequence, *, warn: bool = True, progress: bool = False) -> SimulationResult:
        """Simulate with the seed ``ss``; ``warn``: issue an :class:`UnstableWarning`
        for a run with no steady state (else only ``res.unstable`` says it);
        ``progress``: a progress bar on stderr (see :func:`mbbatch.simulate`)."""
        return _run(self, ss, warn, progress)

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """The kernel's run configuration and inputs (read-only: every run of
        the plan shares them)."""
        return _pack(self)

    @functools.cached_property
    def description(self) -> dict:
        """The run's configuration, but for its seed."""
        side = ({**self.workload.describe(), **model_config(self.model)} if self.workload is not None
                else self.spec.description)
        return {**self.policy.describe(), **self.arrivals.describe(), **side,
                "n": self.n, "servers": "inf" if self.servers == math.inf else int(self.servers)}


def check(policy, arrivals, service, n, servers, keep_requests, workload, service_model, keep_batches) -> Plan:
    """The checked :class:`Plan` of a ``simulate`` call of a MultiBin policy."""
    check_batch_model(service_model)
    if keep_batches:
        raise TypeError("keep_batches is for the token-level policies; MultiBin's batches are the bins' "
                        "(see res.batches_per_bin)")
    check_arrivals(arrivals)
    if workload is not None:
        model = service_model if service_model is not None else MaxModel()
        if not isinstance(model, (MaxModel, IterationModel)):
            raise TypeError("MultiBin takes service_model=MaxModel(base, per_token) (a batch takes its "
                            "longest member's time, the multi-bin paper's model) or an IterationModel (a "
                            f"measured engine's: mb.profiles.get(name)); got {type(model).__name__}")
        if workload.predictor_sigma != 0 and not isinstance(policy.predictor, Oracle):
            raise ValueError("MultiBin takes one predictor: workload.predictor_sigma (a LogNormalError) or "
                             f"MultiBin(predictor=...), not both; got predictor_sigma = "
                             f"{workload.predictor_sigma:g} and {policy.predictor}")
        spec = workload._output
        named = [("workload.prompt", workload._prompt), ("workload.output", spec)]
    else:
        model = MaxModel(base=0.0, per_token=1.0)
        spec = as_service(service)
        named = [("service", spec)]
    predictor = policy.predictor
    if workload is not None and workload.predictor_sigma != 0:
        predictor = LogNormalError(workload.predictor_sigma)
    n = resolve_n(n, arrivals, named, predictor)
    servers = check_servers(servers)
    k, B = policy.bins, policy.batch_size
    S = min(B, n)
    parts = {
        "bins": (16 * k * S + 48 * k + 8 * (k + 1), "the bins' partial batches"),
        "servers": (0 if servers == math.inf else 8 * min(servers, n), "the servers' free times"),
        "batch_size": (16 * S, "one batch's latencies"),
        "n": (8 * _common.HIST_SIZE, "the latency histogram"),
    }
    if keep_requests:
        parts["keep_requests"] = (40 * n, "the per-request arrays (keep_requests)")
    parts.update(rvs_memory(named, n))
    memory = check_memory(parts)
    if isinstance(model, IterationModel):
        check_times(arrivals, n, float(model.service_time(size=1, prompt=workload._prompt.mean, output=spec.mean)),
                    "workload.output")
    else:
        check_times(arrivals, n, model.base + model.per_token * spec.mean,
                    "service" if workload is None else "workload.output")

    integer = workload is not None and workload.integer_lengths
    if policy.edges is None:
        edges = spec.equal_mass_edges(k)
        if workload is not None:      # the lengths' edges, as service times
            edges = _service_times(model, integer, edges)
    else:
        edges = np.array(policy.edges, dtype=np.float64)
        lo, hi = _service_times(model, integer, np.array(spec.support, dtype=np.float64))
        if edges[0] > lo or edges[-1] < hi:
            raise ValueError(
                f"edges must cover the support of service [{lo:g}, {hi:g}]: "
                f"edges[0] <= {lo:g} and edges[-1] >= {hi:g}; got [{edges[0]:g}, {edges[-1]:g}]")
    return Plan(policy, arrivals, spec, workload, model, edges, n, servers, bool(keep_requests), memory, predictor)


def _service_times(model, integer: bool, lengths: np.ndarray) -> np.ndarray:
    """Output lengths as the multi-bin kernel makes them service times:
    ``base + per_token * length``, the length first rounded up to whole
    tokens (at least 1) when ``integer``.  Monotone, so equal-mass edges of
    the lengths stay edges of the service times.  Under an IterationModel
    the kernel bins by output length: the (rounded) lengths."""
    if integer:
        lengths = np.maximum(np.ceil(lengths), 1.0)
    if isinstance(model, IterationModel):
        return lengths
    return model.base + model.per_token * lengths


def _pack(plan: Plan) -> tuple:
    """The multi-bin kernel's configuration and inputs for ``plan``: ``(config, inputs)``."""
    akind, rate, times, aparams, aends = plan.arrivals.kernel_fields(plan.n)
    integer = int(plan.workload is not None and plan.workload.integer_lengths)
    model = plan.model
    if isinstance(model, IterationModel):
        prompt = plan.workload._prompt
        timing = dict(iteration=1, padded=int(model.finished == "stay"), prompt_kind=prompt.kernel_kind,
                      base=0.0, per_token=1.0, **model.cost_fields(), **model.expert_fields())
        prompt_params, prompt_values = prompt.params, prompt.values
    else:
        # (no prompts: the service kind's drawer stands in for theirs, never called)
        timing = dict(iteration=0, padded=0, prompt_kind=plan.spec.kernel_kind, base=model.base,
                      per_token=model.per_token, **NO_COST, **DENSE_FIELDS)
        prompt_params = prompt_values = np.empty(0)
    config = _k.CONFIG.pack(
        n=plan.n, arrival_kind=akind, rate=rate, service_kind=plan.spec.kernel_kind,
        batch_size=plan.policy.batch_size,
        # more servers than requests are never all busy: the kernel needs at most n (0: infinitely many)
        servers=0 if plan.servers == math.inf else int(min(plan.servers, plan.n)), max_wait=plan.policy.max_wait,
        keep=plan.keep, integer=integer, predictor=plan.predictor.code, predictor_param=plan.predictor.param,
        **timing)
    inputs = _k.INPUTS.pack(arrival_times=times, arrival_params=aparams, arrival_ends=aends,
                            service_params=plan.spec.params, service_values=plan.spec.values,
                            edges=plan.edges, predictions=plan.predictor.given, prompt_params=prompt_params,
                            prompt_values=prompt_values)
    return config, inputs


def _run(plan: Plan, ss: np.random.SeedSequence, warn: bool, progress: bool) -> SimulationResult:
    config, inputs = plan.kernel_args
    arrival = stream(ss, STREAM_ARRIVALS)
    # (the prediction stream only where the predictor draws: a generator costs ~20 us)
    iteration = isinstance(plan.model, IterationModel)
    streams = _k.MultiBinStreams(arrival, stream(ss, STREAM_SERVICE),
                                 stream(ss, STREAM_PREDICTION) if plan.predictor.draws else arrival,
                                 stream(ss, STREAM_PROMPT) if iteration else arrival)
    inputs = drawn(inputs, _k.INPUTS, "service_values", plan.spec, streams.service, plan.n)
    if iteration:
        inputs = drawn(inputs, _k.INPUTS, "prompt_values", plan.workload._prompt, streams.prompt, plan.n)
    args = (config, inputs, streams)
    stop = stop_flag()
    t0 = time.perf_counter()
    out, req = interruptible(lambda: _k.run(*args, stop, groups=BATCH_MEANS_GROUPS), stop,
                             plan.n if progress else None)
    kernel_seconds = time.perf_counter() - t0
    n, servers = plan.n, plan.servers
    st = _k.STATS.unpack((out.ints, out.floats))
    completed, n_batches = st["completed"], st["batches"]
    nan = math.nan
    span = float(st["last_completion"] - st["first_arrival"]) if completed else nan
    busy = float(st["busy"])
    if n_batches > 1:
        mean_batch_service = busy / n_batches
        var = (float(st["busy_sq"]) - n_batches * mean_batch_service ** 2) / (n_batches - 1)
        std_batch_service = math.sqrt(max(var, 0.0))
    else:
        std_batch_service = nan
    with np.errstate(invalid="ignore", divide="ignore"):
        g_lat = np.where(out.group_count > 0, out.group_latency / out.group_count, nan)
        g_wait = np.where(out.group_batches > 0, out.group_batch_wait / out.group_batches, nan)
    requests = None
    if req is not None:
        requests = Table({**req, "latency": req["completion"] - req["arrival"]})
    q = quantiles(out.hist, requests.latency if requests is not None and completed > 0 else None)
    mean_batch = busy / n_batches if n_batches else nan
    unstable, reason = steady_state(plan.arrivals, n, lambda start, end: stats.backlog_verdict(g_wait, mean_batch))
    metrics = assemble(plan.policy.kind, RunTotals(
        completed=completed, span=span, sum_latency=float(st["sum_latency"]), busy=busy, servers=servers,
        batches=n_batches, members=completed, latency_quantiles=q, group_latency=g_lat), {
        "std_batch_service": std_batch_service,
        "mean_fill_wait": float(st["sum_fill_wait"]) / completed if completed else nan,
        "mean_queue_wait": float(st["sum_queue_wait"]) / completed if completed else nan,
        "excluded_partial": st["excluded"]})
    config = {**plan.description, "seed_entropy": entropy_str(ss)}
    res = SimulationResult(
        kind=plan.policy.kind, config=config, n=n, servers=servers, edges=plan.edges, metrics=metrics,
        arrays={"batches_per_bin": out.batches_per_bin, "group_mean_latency": g_lat,
                "group_mean_batch_wait": g_wait, "latency_histogram": out.hist,
                **per_bin(out.bin_completed, out.bin_latency, span)},
        requests=requests, unstable=unstable, unstable_reason=reason,
        latency_quantiles="exact" if requests is not None else HISTOGRAM_QUANTILES,
        kernel_seconds=kernel_seconds)
    return finish(res, warn, stacklevel=5)
