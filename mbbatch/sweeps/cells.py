"""One grid point of a sweep: its seeds, its simulations and its closed forms.

These functions are what workers run (in-process, in a process pool or on a
dask cluster); they take and return plain Python and numpy values only.  A
cell's parameters are the dict :meth:`SweepSpec.points` yields: every
parameter that applies to it, its policy ``kind`` and, under a policy axis,
its variant's name ``policy``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math

import numpy as np
import scipy.stats as st

from .. import theory
from .._running import interruptible, stop_flag
from ..metrics import METRICS
from ..policies.multibin import spec_edges
from ..registry import ARRIVALS, POLICIES, build
from ..simulation import check_simulation, plan, run_plan
from ..workload import SystemPrompts, Workload
from .schema import TIME_POINTS, class_dims, class_vars, rep_vars, time_series, variables
from .spec import SEARCHED, WORKLOAD_PARAMS, SpecError, service_model, trace_filters, trace_of

__all__ = ["SEED_SCHEME", "cell_seed", "run_point", "point_theory", "check_points", "point_objects",
           "service_model", "trace_filters", "run_capacity_point", "check_capacity_point", "iteration_closed_form"]

SEED_SCHEME = (
    "SeedSequence(entropy=<spec seed, or its policy variant's>, spawn_key=(w0, ..., w7, rep)), where "
    "w0..w7 are the eight big-endian 32-bit words of SHA-256 over the canonical JSON of the cell's "
    "workload parameters (" + ", ".join(WORKLOAD_PARAMS) + ", those that apply; the system prompts' "
    "only where system_prompts > 0); stream 0 of it draws "
    "the arrivals, stream 1 the service times (output lengths), stream 2 the prompt lengths and "
    "stream 3 the predictor's errors (PCG64DXSM).  Policy parameters do not enter the seed: cells "
    "that differ only in policy see the same requests."
)


#: the arrival processes with a steady state (a load step has none; saturated
#: runs are not assessed)
STEADY = tuple(a for a, cls in ARRIVALS.items() if not cls.unassessed)


#: the workload parameters of the system prompts, which shape the requests only where there are some: without,
#: they stay out of the seed (a cell's requests the same as before they existed)
_SYSTEM_PROMPTS = ("system_prompts", "system_prompt_length", "system_prompt_share")


def _canonical(params: dict) -> str:
    skip = _SYSTEM_PROMPTS if not params.get("system_prompts") else ()
    enc = {k: ("inf" if v == math.inf else v) for k, v in params.items() if k in WORKLOAD_PARAMS and k not in skip}
    return json.dumps(enc, sort_keys=True, separators=(",", ":"))


def _words(params: dict) -> tuple:
    digest = hashlib.sha256(_canonical(params).encode()).digest()
    return tuple(int.from_bytes(digest[i:i + 4], "big") for i in range(0, 32, 4))


def cell_seed(root_seed: int, params: dict, rep: int, words: tuple | None = None) -> np.random.SeedSequence:
    """The SeedSequence of one cell (see :data:`SEED_SCHEME`); ``words``, the
    digest of ``params``, when already known (a cell's reps share it)."""
    return np.random.SeedSequence(root_seed, spawn_key=(*(words or _words(params)), rep))


def _service_dist(service: str, params: dict):
    if service == "uniform":
        return _frozen("uniform", params["l_min"], params["l_max"] - params["l_min"])
    return _frozen("expon", 0.0, 1.0 / params["mu"])


@functools.lru_cache(maxsize=1024)
def _frozen(name: str, loc: float, scale: float, *shapes):
    """A frozen scipy.stats distribution, made once per process for its
    parameters (making one costs about a millisecond; every rep of every
    cell with these parameters shares it)."""
    return getattr(st, name)(*shapes, loc=loc, scale=scale)


def point_objects(arrivals: str, service: str, params: dict) -> tuple:
    """The :func:`~mbbatch.simulate` arguments of one grid point: the policy
    (its kind's, :data:`mbbatch.registry.POLICIES`), the arrival process
    (:data:`mbbatch.registry.ARRIVALS`) and the keyword arguments of the
    request side.  ``service`` is the spec's workload: ``uniform`` or
    ``expon`` (the paper's service times), else the token-level service
    model's name."""
    trace = trace_of(params)
    arr = ARRIVALS[arrivals].from_spec(params, trace)
    if service in ("uniform", "expon"):
        request_side = {"service": _service_dist(service, params)}
    elif trace is not None:
        request_side = {"workload": Workload.from_trace(trace, resample=params["trace"]["resample"],
                                                        **_objectives(params)),
                        "service_model": service_model(service, params)}
    else:
        request_side = {"workload": _token_workload(params), "service_model": service_model(service, params)}
    return build(params["kind"], params, trace), arr, request_side


def _token_workload(params: dict):
    """A cell's token-level requests: log-normal lengths, of one kind or of
    each of its classes (a :meth:`Workload.mixture`, the spec's [classes.NAME]
    tables, each class's keys resolved by :meth:`SweepSpec.cell_params`)."""
    if "classes" in params:
        return Workload.mixture({name: (c["share"], _lognormal(c)) for name, c in params["classes"].items()})
    return _lognormal(params)


def _lognormal(values: dict) -> Workload:
    """Log-normal prompt and output lengths (``prompt_median``, ..., ``output_sigma``) and their objectives."""
    system = None
    if values.get("system_prompts", 0) > 0:
        system = SystemPrompts(length=values["system_prompt_length"], count=values["system_prompts"],
                               share=values["system_prompt_share"])
    return Workload(prompt=_frozen("lognorm", 0.0, values["prompt_median"], values["prompt_sigma"]),
                    output=_frozen("lognorm", 0.0, values["output_median"], values["output_sigma"]),
                    system_prompts=system, **_objectives(values))


def _objectives(params: dict) -> dict:
    """The requests' objectives a cell sets (``ttft_slo``, ``tpot_slo``; the others' defaults)."""
    return {k: params[k] for k in ("ttft_slo", "tpot_slo") if k in params}


def check_points(spec) -> None:
    """Everything a sweep would refuse at any of its grid points, refused now,
    before the store exists: every point's objects are built and its
    simulation checked (without simulating; a continuous engine's requests
    drawn, rep by rep, for one it could never run), its closed forms
    evaluated, and the store's template bounded in memory.  Raises
    :class:`SpecError` naming the spec file, the grid point and the
    parameter."""
    from .._running import check_memory

    # (a mixture's per-class variables hold a value per class)
    width = {v: len(spec.classes) for v in class_dims(spec)}
    per_rep = (sum(width.get(v, 1) for v in rep_vars(spec))
               + (len(time_series(spec.kinds)) * TIME_POINTS if spec.arrivals == "step" else 0))
    per_point = sum(width.get(v, 1) for v, d in variables(spec).items() if not d[0])
    try:
        check_memory({"reps": (spec.n_points * (8 * spec.reps * per_rep + 8 * per_point),
                               "the store's values (grid points x reps x variables)")})
    except ValueError as exc:
        raise SpecError(f"{spec.source}: {exc}") from None
    for idx, params in spec.points():
        where = ", ".join(f"{nm}={params[nm]!r}" for nm in spec.axes)
        where = f"at grid point {where}" if where else "at its one grid point"
        try:
            if spec.capacity is not None:
                check_capacity_point(spec.arrivals, spec.service, params, spec.capacity)
                point_theory(spec.arrivals, spec.service, params)
                continue
            pol, arr, kw = point_objects(spec.arrivals, spec.service, params)
            run = plan(pol, arr, n=params["n"], servers=params.get("servers", 1), **kw)
            if hasattr(run, "check_requests"):
                # (a continuous engine refuses a request it could never run: each rep's, drawn now)
                words = _words(params)
                for rep in range(spec.reps):
                    try:
                        run.check_requests(cell_seed(spec.seed_of(params), params, rep, words))
                    except ValueError as exc:
                        # (named by the spec's keys, not the API's arguments)
                        text = str(exc)
                        for api, key in type(pol).spec_names.items():
                            text = text.replace(api, key)
                        raise ValueError(f"rep {rep}: {text}") from None
            point_theory(spec.arrivals, spec.service, params)
        except (ValueError, TypeError, OverflowError, ZeroDivisionError) as exc:
            raise SpecError(f"{spec.source}: {where}: {exc}") from None


def run_point(arrivals: str, service: str, params: dict, root_seed: int, reps: int, time_grid=None) -> dict:
    """Simulate every rep of one grid point; return the per-rep arrays of the
    metrics that apply to its policy (by Dataset variable), and its time
    series on ``time_grid`` when given."""
    kind = params["kind"]
    pol, arr, kw = point_objects(arrivals, service, params)
    metrics = [m for m in METRICS.values() if m.per_rep and kind in m.kinds]
    out = {m.var: np.empty(reps, dtype=m.dtype) for m in metrics}
    if time_grid is not None:
        for var in time_series({kind}):
            out[var] = np.full((reps, time_grid.size), np.nan)
    run = plan(pol, arr, n=params["n"], servers=params.get("servers", 1), **kw)   # checked once, run per rep
    words = _words(params)
    scalars = [m for m in metrics if m.name != "unstable"]     # (unstable is stored as backlog_growing below)
    names = list(params.get("classes") or ())
    # (a mixture's classes: each one's metrics per rep, SimulationResult.classes, on the request_class axis)
    per_class = {var: (metric, dtype) for var, (metric, dtype, _, _) in class_vars(names).items()}
    for var, (_, dtype) in per_class.items():
        out[var] = np.empty((reps, len(names)), dtype=dtype)

    def reps_():
        kernel = 0.0
        for rep in range(reps):
            # (no warning per run: the sweep reports its unstable cells together, at its end)
            res = run_plan(run, cell_seed(root_seed, params, rep, words), warn=False)
            kernel += res.kernel_seconds
            for m in scalars:
                out[m.var][rep] = getattr(res, m.name)
            for var, (metric, _) in per_class.items():
                out[var][rep] = [res.classes[name][metric] for name in names]
            # (the backlog check is a steady-state question: not asked of a load step)
            out["backlog_growing"][rep] = bool(res.unstable) if arrivals in STEADY else False
            if time_grid is not None:
                _sample_time_series(res.time_series_columns(), time_grid, out, rep)
        out["_kernel_seconds"] = kernel      # (popped by the sweep for its summary line)

    # every rep on one helper thread, all watching one stop flag (Ctrl-C)
    interruptible(reps_, stop_flag())
    return out


def _search_objects(arrivals: str, service: str, params: dict) -> tuple:
    """:func:`point_objects` of a capacity cell: the arrival process at a
    placeholder rate (a replay at scale 1), whose shape the search keeps."""
    return point_objects(arrivals, service, {**params, **dict.fromkeys(SEARCHED, 1.0)})


def run_capacity_point(arrivals: str, service: str, params: dict, root_seed: int, capacity: dict) -> dict:
    """A capacity search (:func:`mbbatch.find_capacity`) at one grid point of
    a capacity spec: its [capacity] table's settings and objective, the
    point's seed (every probe's replication r uses seed r of the cell's
    seed sequence, as a sweep's rep r would)."""
    from ..capacity import find_capacity

    pol, arr, kw = _search_objects(arrivals, service, params)
    objective = _objective(params)
    stop = stop_flag()

    def search():
        return find_capacity(pol, arrivals=arr, servers=params.get("servers", 1), objective=objective,
                             rel_tol=capacity["rel_tol"], confidence=capacity["confidence"], n=params["n"],
                             seed=cell_seed(root_seed, params, 0, _words(params)), max_reps=capacity["max_reps"],
                             throughput_tol=capacity["throughput_tol"], searches=capacity["searches"], **kw)

    res = interruptible(search, stop)
    return {"sim_capacity": res.rate, "sim_capacity_ci_low": res.rate_ci[0], "sim_capacity_ci_high": res.rate_ci[1],
            "sim_capacity_bracket_low": res.bracket[0], "sim_capacity_bracket_high": res.bracket[1],
            "sim_saturated_throughput": res.saturated_throughput, "capacity_probes": res.n_probes,
            "capacity_requests": res.requests, "capacity_resolved": res.resolved,
            "_kernel_seconds": res.kernel_seconds}


def _objective(params: dict):
    """The cell's objective: its ``objective_<metric>`` bounds that are set,
    and its classes' (a [classes.NAME] table's), else None."""
    from ..capacity import CLASS_METRICS, OBJECTIVE_METRICS, Objective

    bounds = {m: params[f"objective_{m}"] for m in OBJECTIVE_METRICS if params.get(f"objective_{m}") is not None}
    classes = {}
    for name, c in (params.get("classes") or {}).items():
        own = {m: c[f"objective_{m}"] for m in CLASS_METRICS if c.get(f"objective_{m}") is not None}
        if own:
            classes[name] = Objective(**own)
    return Objective(**bounds, classes=classes or None) if bounds or classes else None


def check_capacity_point(arrivals: str, service: str, params: dict, capacity: dict) -> None:
    """Raise what :func:`run_capacity_point` would refuse, without searching."""
    from ..capacity import check_search

    pol, arr, kw = _search_objects(arrivals, service, params)
    objective = _objective(params)
    check_search(pol, arr, params.get("servers", 1), objective, capacity["rel_tol"], capacity["confidence"],
                 capacity["max_reps"], capacity["throughput_tol"], params["n"], workload=kw.get("workload"))
    check_simulation(pol, arr, n=params["n"], servers=params.get("servers", 1), **kw)


def _sample_time_series(ts, time_grid, out: dict, rep: int) -> None:
    """The value in force at each grid time: that of the last sampled batch
    start (or, for LAPS, the last change of its groups) at or before it
    (``ts``: a result's time-series columns); NaN before the first, and
    throughout where the run has no series (LAPS without its groups, a
    continuous engine's controller series but its cap)."""
    if ts is None or not ts["time"].size:
        return
    at = np.searchsorted(ts["time"], time_grid, side="right") - 1
    ok = at >= 0
    if "short_instances" in ts:
        for var, col in (("ts_short_instances", "short_instances"), ("ts_long_instances", "long_instances")):
            out[var][rep, ok] = ts[col][at[ok]]
        return
    # (a continuous engine's: its cap on the running sequences, the controller's b_target, where a
    # controller sets it, and its waiting requests; the controller's other series have no counterpart)
    for var, col in (("ts_b_target", "b_target" if "b_target" in ts else "max_num_seqs"), ("ts_b_low", "b_low"),
                     ("ts_b_high", "b_high"), ("ts_tau_avg", "tau_avg")):
        if col in ts:
            out[var][rep, ok] = ts[col][at[ok]]
    queue = ts["queue"].sum(axis=1) if "queue" in ts else ts["waiting"]
    out["ts_queue"][rep, ok] = queue[at[ok]]


@functools.lru_cache(maxsize=4096)
def _mean_batch_service(service, l_min, l_max, mu, edges_rule, B, k) -> float:
    """E[t_service] of the paper's model: Theorem 4.2 for uniform equal-mass
    bins, else the exact quadrature (tens of milliseconds: computed once per
    process for its arguments, whatever the rate or the servers)."""
    params = {"l_min": l_min, "l_max": l_max, "mu": mu, "edges": edges_rule, "batch_size": B, "bins": k}
    if service == "uniform" and edges_rule == "equal_mass":
        return theory.service_time(B, l_min, l_max, k)                          # Theorem 4.2
    dist = _service_dist(service, params)
    edges = spec_edges(params)
    if edges is None:
        edges = dist.ppf(np.linspace(0.0, 1.0, k + 1))
    return theory.batch_service_time(dist, edges, B)


def _mean_rate(arrivals: str, params: dict):
    """The long-run arrival rate of a process with a steady state and a rate
    set by its parameters, else None (a capacity search sets it; a trace's
    is its own)."""
    cls = ARRIVALS[arrivals]
    if cls.unassessed or arrivals == "trace" or any(params.get(k) is None for k in cls.spec_keys):
        return None
    return cls.from_spec(params).rate


#: a cell's closed forms where none applies
_NO_THEORY = {"theory_mean_batch_service": math.nan, "theory_service_rate": math.nan, "capacity": math.nan,
              "theory_throughput_bound": math.nan, "theory_throughput": math.nan, "theory_latency": math.nan,
              "unstable": False}


def _forms(arrivals: str, params: dict, es: float, mean_one: float, *, bound: float = math.nan,
           latency: bool = True) -> dict:
    """A multibin cell's closed forms from its expected batch service time
    ``es`` (s) and one request's (``mean_one``: the capacity's batches of one
    length): the service rate, the throughput (the arrival rate where a
    steady state has one), ``bound`` (Corollary A.1.1's, scaled by the
    servers) and, with ``latency`` under Poisson arrivals, Lemma 5.1's
    latency, for any edges: a request waits ``(B-1)/(2 lam p_i)`` for its
    bin's batch to fill, and ``sum_i p_i (B-1)/(2 lam p_i) = k(B-1)/(2 lam)``."""
    B, k, servers = params["batch_size"], params["bins"], params["servers"]
    rate_s = servers * B / es if servers != math.inf else math.inf
    out = {"theory_mean_batch_service": es, "theory_service_rate": rate_s,
           "capacity": servers * B / mean_one if servers != math.inf else math.inf,
           "theory_throughput_bound": bound, "theory_throughput": rate_s, "theory_latency": math.nan}
    lam = _mean_rate(arrivals, params)
    if lam is not None:
        # a stable system serves what arrives, whatever the arrival process
        out["theory_throughput"] = min(lam, rate_s)
    if latency and arrivals == "poisson" and lam is not None and lam < rate_s:
        # (NaN when saturated: no steady state, no expected latency, though the formula gives a number)
        out["theory_latency"] = es + (B - 1) * k / (2.0 * lam)
    out["unstable"] = bool(lam is not None and lam >= rate_s)
    return {key: (float(v) if key != "unstable" else v) for key, v in out.items()}


def _trace_theory(arrivals: str, params: dict) -> dict:
    """Closed forms of MultiBin on a trace's output lengths drawn i.i.d. (the
    Empirical resample) under the max model: eq. (2) on the empirical
    distribution, with the edges the simulation uses (equal-mass quantiles
    of the lengths, rounded up to whole tokens)."""
    if params["max_wait"] < math.inf:
        return dict(_NO_THEORY)
    B, k = params["batch_size"], params["bins"]
    lengths = trace_of(params).output_tokens.astype(float)
    edges = np.maximum(np.ceil(np.quantile(lengths, np.linspace(0.0, 1.0, k + 1))), 1.0)
    es = params["base"] + params["per_token"] * theory.empirical_batch_service_time(lengths, edges, B)
    mean_one = params["base"] + params["per_token"] * float(lengths.mean())
    return _forms(arrivals, params, es, mean_one, latency=False)


@functools.lru_cache(maxsize=64)
def _whole_tokens(dist) -> tuple:
    """:func:`~mbbatch.theory.integer_lengths` of a frozen distribution, once
    per process (a grid's cells share their lengths' distributions:
    :func:`_frozen`)."""
    return theory.integer_lengths(dist)


def _length_law(spec) -> tuple:
    """``(values, weights)`` of the whole-token lengths a simulation draws
    from a workload's length ``spec``: a distribution's enumerated, or
    replayed values (a trace's, resampled) equally likely (weights None)."""
    if spec.dist is not None:
        return _whole_tokens(spec.dist)
    return np.maximum(np.ceil(np.asarray(spec.values, dtype=float)), 1.0), None


def iteration_closed_form(run_plan) -> tuple:
    """Eq. (2) for a checked MultiBin plan on a workload under an
    :class:`~mbbatch.IterationModel` (:func:`mbbatch.simulation.plan`):
    ``(E[t_service], the batch time of one length)``, s, at the edges its
    simulation uses, over the whole-token lengths it draws, the prompts'
    mean independent of the outputs
    (:func:`~mbbatch.theory.iteration_batch_service_time`; the second is the
    capacity's limit of one length per bin)."""
    model, wl, B = run_plan.model, run_plan.workload, run_plan.policy.batch_size
    outputs, weights = _length_law(wl._output)
    pv, pw = _length_law(wl._prompt)
    prompt_mean = float(pv @ pw) if pw is not None else float(np.mean(pv))
    es = theory.iteration_batch_service_time(model, outputs, B, run_plan.edges, prompt_mean=prompt_mean,
                                             weights=weights)
    # (a batch of one length takes the same time whether finished members leave or stay)
    one = model.service_time(size=B, prompt=prompt_mean, output=outputs)
    return es, float(np.average(one, weights=weights))


def _iteration_theory(arrivals: str, service: str, params: dict) -> dict:
    """Closed forms of MultiBin on token-level requests under an iteration
    model (``service_model = "iteration"`` or ``"profile"``): eq. (2) with a
    batch timed by the model (:func:`~mbbatch.theory.iteration_batch_service_time`),
    at the edges the simulation uses, over the whole-token lengths it draws
    (a trace's, where it resamples them); ``capacity`` its limit of one
    length per bin.  NaN with a finite ``max_wait``, lengths not rounded to
    whole tokens, or a trace replayed in order."""
    trace = trace_of(params)
    if params["max_wait"] < math.inf or (trace is not None and not params["trace"]["resample"]):
        return dict(_NO_THEORY)
    policy, arr, side = point_objects(arrivals, service, params)
    wl = side["workload"]
    if not wl.integer_lengths:
        return dict(_NO_THEORY)
    es, one = iteration_closed_form(plan(policy, arr, n=params["n"], servers=params["servers"], **side))
    return _forms(arrivals, params, es, one)


def point_theory(arrivals: str, service: str, params: dict) -> dict:
    """Closed-form predictions at one grid point (NaN where none applies).

    The multi-bin closed forms assume the paper's workload (or an iteration
    model's, :func:`_iteration_theory`) and batches of exactly B: with a
    finite ``max_wait`` they are left NaN, and the token policies have none."""
    paper = POLICIES[params["kind"]].paper
    if paper and service in ("iteration", "profile"):
        return _iteration_theory(arrivals, service, params)
    if paper and params.get("trace", {}).get("resample") and service == "max":
        return _trace_theory(arrivals, params)
    if not paper or service not in ("uniform", "expon"):
        return {"unstable": False}
    if params["max_wait"] < math.inf:
        return dict(_NO_THEORY)
    B, k, servers = params["batch_size"], params["bins"], params["servers"]
    dist = _service_dist(service, params)
    es = _mean_batch_service(service, params.get("l_min"), params.get("l_max"), params.get("mu"),
                             params["edges"], B, k)
    bound = math.nan
    if service == "expon" and params["edges"] == "lemma_a1":
        bound = theory.exponential_throughput_bound(B, params["mu"], k)         # Corollary A.1.1
        bound = servers * bound if servers != math.inf else math.inf
    # Lemma 5.1, eq. (7), for any edges (see _forms)
    return _forms(arrivals, params, es, float(dist.mean()), bound=bound)
