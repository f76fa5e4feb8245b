"""``simulate`` for the token-level policies: static, dynamic and multi-bin
dynamic batching.  Validates, derives the streams, runs the event kernel,
wraps the result."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _st

from ._kernels import common as _k
from ._kernels import controller as _c
from ._kernels import dynamic as _d
from ._seeding import STREAM_ARRIVALS, STREAM_SERVICE, as_seed_sequence, entropy_str, stream
from ._running import check_clock, check_memory, interruptible, stop_flag
from ._validation import check_servers, resolve_n
from .arrivals import PiecewisePoisson, Poisson, Replay, Saturated
from .policies import MultiBinDynamic, StaticBatching
from .results import QUANTILES, UnstableWarning, _batch_means_ci, _hist_quantiles, queue_growing
from .workload import DecodeModel, LinearModel, MaxModel, Workload

__all__ = ["simulate_tokens", "TokenSimulationResult", "TOKEN_METRICS", "STREAM_PROMPT", "STREAM_PREDICTION"]

STREAM_PROMPT = 2
STREAM_PREDICTION = 3
#: rows of the downsampled time series
TIME_SERIES_ROWS = 512
#: contiguous groups (by arrival index) of the batch-means confidence interval
BATCH_MEANS_GROUPS = 32

TOKEN_METRICS = {
    "throughput": ("requests/s", "completed requests / (last completion - first arrival)"),
    "token_throughput": ("tokens/s", "generated (output) tokens / (last completion - first arrival)"),
    "mean_latency": ("s", "mean over completed requests of batch completion - arrival"),
    "mean_latency_ci_low": ("s", "95% batch-means confidence interval of mean_latency, lower end"),
    "mean_latency_ci_high": ("s", "95% batch-means confidence interval of mean_latency, upper end"),
    "latency_p50": ("s", "median latency"),
    "latency_p95": ("s", "95th percentile latency"),
    "latency_p99": ("s", "99th percentile latency"),
    "mean_ttft": ("s", "mean time to first token: batch start + prefill + one decode step - arrival"),
    "mean_tbt": ("s/token", "mean decode time per output token (token-weighted)"),
    "sla_violation_tokens": ("1", "share of output tokens decoded slower than D_SLA + eps_D per token"),
    "sla_violation_requests": ("1", "share of requests decoded slower than D_SLA + eps_D per token"),
    "gpu_utilization": ("1", "busy server-time / (servers x span)"),
    "memory_peak": ("1", "largest batch's prompt + output tokens / token capacity eta"),
    "memory_mean": ("1", "time-average tokens in service / (servers x eta)"),
    "mem_exceed_batches": ("batches", "batches above the token capacity (0 when the memory constraint is on)"),
    "rejected": ("requests", "requests alone above the token capacity, never servable, dropped"),
    "batch_size_mean": ("requests", "mean batch size"),
    "batch_size_std": ("requests", "standard deviation of the batch size"),
    "completed": ("requests", "requests served"),
    "n_batches": ("batches", "batches served"),
    "span": ("s", "last completion - first arrival"),
    "warmup_time": ("s", "time Algorithm 6's edges were set (NaN without warm-up)"),
    "sla_infeasible": ("1", "1 if a controller ends above D_SLA + eps_D with b_low shrunk to B_min"),
}
TS_COLUMNS = ("b_target", "b_low", "b_high", "tau_avg", "bin", "batch_size")


@dataclass(frozen=True, eq=False)
class TokenSimulationResult:
    """Metrics of one token-level run (units in :data:`TOKEN_METRICS`).

    ``time_series`` holds a downsampled record, one row per sampled batch
    start: ``time`` (s), :data:`TS_COLUMNS` and ``queue`` (requests waiting
    per bin after the batch left).  ``batch_size_hist[b]`` counts batches of
    size b.  ``requests`` and ``batches`` hold per-request and per-batch
    arrays when asked for.  ``unstable`` says whether the queue grew
    through the arrivals (no steady state), ``unstable_reason`` why or why
    it was not assessed.
    """

    config: dict
    metrics_: dict
    batch_size_hist: np.ndarray
    edges: np.ndarray
    time_series: dict
    group_mean_latency: np.ndarray = field(repr=False)
    requests: dict | None = field(default=None, repr=False)
    batches: dict | None = field(default=None, repr=False)
    unstable: bool = False
    unstable_reason: str = ""

    def __getattr__(self, name):
        m = self.__dict__.get("metrics_", {})
        if name in m:
            return m[name]
        raise AttributeError(name)

    @property
    def mean_latency_ci(self):
        return (self.metrics_["mean_latency_ci_low"], self.metrics_["mean_latency_ci_high"])

    def metrics(self) -> dict:
        return dict(self.metrics_)

    def to_dataset(self):
        """The metrics, the batch-size histogram and the time series (with a
        ``time`` dimension) as an xarray Dataset with units and provenance."""
        import xarray as xr

        from .provenance import versions

        data = {name: xr.Variable((), self.metrics_[name],
                                  {"units": u, "long_name": name.replace("_", " "), "description": d})
                for name, (u, d) in TOKEN_METRICS.items()}
        data["batch_size_hist"] = xr.Variable(("batch_size",), self.batch_size_hist,
                                              {"units": "batches", "long_name": "batch size histogram",
                                               "description": "batches of each size"})
        data["bin_edges"] = xr.Variable(("bin", "edge_side"), self.edges,
                                        {"units": "tokens", "long_name": "bin edges",
                                         "description": "Algorithm 6 edges [min_len, max_len) per bin"})
        ts = self.time_series
        for col in TS_COLUMNS:
            data[f"ts_{col}"] = xr.Variable(("time",), ts[col], {
                "units": "s/token" if col == "tau_avg" else "requests" if col != "bin" else "1",
                "long_name": col.replace("_", " "), "description": f"{col} at sampled batch starts"})
        data["ts_queue"] = xr.Variable(("time", "bin"), ts["queue"], {
            "units": "requests", "long_name": "queue length", "description": "requests waiting per bin"})
        coords = {"time": ("time", ts["time"], {"units": "s", "long_name": "batch start time",
                                               "description": "downsampled batch start times"}),
                  "batch_size": np.arange(self.batch_size_hist.size),
                  "bin": np.arange(self.edges.shape[0]), "edge_side": ["min_len", "max_len"]}
        attrs = {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in self.config.items()}
        attrs.update(versions())
        attrs["confidence_level"] = 0.95
        attrs["unstable"] = int(self.unstable)
        attrs["unstable_reason"] = self.unstable_reason
        return xr.Dataset(data, coords=coords, attrs=attrs)


@dataclass(frozen=True, eq=False)
class _TokenPlan:
    """A validated token-level run, ready to allocate and simulate."""

    policy: object
    arrivals: object
    workload: Workload
    model: object
    n: int
    servers: int
    keep_requests: bool
    keep_batches: bool
    memory: int


def _model_scale(model, workload) -> float:
    """Service time of a batch of one mean request, s: the clock's yardstick."""
    p, o = workload._prompt.mean, workload._output.mean
    if isinstance(model, MaxModel):
        return model.base + model.per_token * o
    if isinstance(model, LinearModel):
        return model.base + model.alpha * (p + o)
    return model.prefill_per_token * p + model.beta * o


def plan_tokens(policy, arrivals, workload, service_model, n, servers, keep_requests,
                keep_batches) -> _TokenPlan:
    """Check a token-level run (everything :func:`simulate_tokens` checks
    before simulating, memory included) and return its plan."""
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a Workload; got {type(workload).__name__}")
    if service_model is None:
        service_model = DecodeModel()
    if not isinstance(service_model, (MaxModel, LinearModel, DecodeModel)):
        raise TypeError("service_model must be MaxModel, LinearModel or DecodeModel; "
                        f"got {type(service_model).__name__}")
    if not isinstance(arrivals, (Poisson, Saturated, Replay, PiecewisePoisson)):
        raise TypeError(f"arrivals must be Poisson, PiecewisePoisson, Saturated or Replay; "
                        f"got {type(arrivals).__name__}")
    for name, flag in (("keep_requests", keep_requests), ("keep_batches", keep_batches)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {flag!r}")
    replay = []
    if isinstance(arrivals, Replay):
        replay.append(("arrivals.times", arrivals.times.size))
    for nm, sp in (("workload.prompt", workload._prompt), ("workload.output", workload._output)):
        if sp.kind == _k.SVC_REPLAY:
            replay.append((nm, sp.values.size))
    n = resolve_n(n, replay)
    servers = check_servers(servers)
    if servers == math.inf:
        raise ValueError("servers must be finite for the token-level policies; got inf")
    static = isinstance(policy, StaticBatching)
    K = policy.bins if isinstance(policy, MultiBinDynamic) else 1
    b_max = policy.batch_size if static else policy.controller.b_max
    warm = policy.warmup if isinstance(policy, MultiBinDynamic) else 1
    c = min(servers, n)
    queue = 40 * 1024
    if isinstance(arrivals, Saturated):
        # every request is queued at time 0: the ring buffers grow to hold n
        queue = 60 * (1 << max(int(n - 1).bit_length(), 10))
    parts = {
        "bins": (K * (queue + 8 * (TIME_SERIES_ROWS + _c.CONTROLLER.size + _c.BATCH_STATS.size + 4)),
                 "the bins' queues"),
        "servers": (80 * c, "the servers' batches"),
        "warmup": (8 * min(warm, n), "the warm-up window"),
        ("batch_size" if static else "b_max"): (8 * (min(b_max, n) + 1), "the batch-size histogram"),
        "n": (8 * _k.HIST_SIZE, "the latency histogram"),
    }
    if keep_requests:
        parts["keep_requests"] = (72 * n, "the per-request arrays (keep_requests)")
    if keep_batches:
        parts["keep_batches"] = (64 * n, "the per-batch arrays (keep_batches)")
    memory = check_memory(parts)
    scale = _model_scale(service_model, workload)
    if isinstance(arrivals, Replay):
        check_clock(float(np.max(np.abs(arrivals.times[:n]))), scale, "arrivals.times")
    elif isinstance(arrivals, Poisson):
        check_clock(n / arrivals.rate, scale, f"rate = {arrivals.rate:g} requests/s and n = {n} arrivals")
    elif isinstance(arrivals, PiecewisePoisson):
        check_clock(arrivals.ends[-1] + n / min(arrivals.rates) if arrivals.ends else n / arrivals.rates[0],
                    scale, f"rates down to {min(arrivals.rates):g} requests/s and n = {n} arrivals")
    return _TokenPlan(policy, arrivals, workload, service_model, n, int(servers), bool(keep_requests),
                      bool(keep_batches), memory)


def simulate_tokens(policy, arrivals, workload, service_model, n=None, servers=1, seed=None,
                    keep_requests=False, keep_batches=False):
    """Simulate a token-level policy; see :func:`mbbatch.simulate`."""
    plan = plan_tokens(policy, arrivals, workload, service_model, n, servers, keep_requests, keep_batches)
    ss = as_seed_sequence(seed)
    return _run_tokens(plan, ss)


def _pack_tokens(plan: _TokenPlan, ss) -> tuple:
    """The event kernel's arguments for ``plan``: ``(config, inputs, streams)``."""
    policy, arrivals, workload, model, n = plan.policy, plan.arrivals, plan.workload, plan.model, plan.n
    static = isinstance(policy, StaticBatching)
    multibin = isinstance(policy, MultiBinDynamic)
    sla, mem = (policy.sla if static else policy.controller), policy.memory
    b_max = policy.batch_size if static else sla.b_max
    if isinstance(arrivals, Poisson):
        akind, rate = _k.ARR_POISSON, arrivals.rate
    elif isinstance(arrivals, PiecewisePoisson):
        akind, rate = _k.ARR_PIECEWISE, arrivals.rates[0]
    elif isinstance(arrivals, Saturated):
        akind, rate = _k.ARR_SATURATED, 0.0
    else:
        akind, rate = _k.ARR_REPLAY, 0.0
    if isinstance(model, MaxModel):
        model_fields = dict(model=_d.MODEL_MAX, base=model.base, per_token=model.per_token)
    elif isinstance(model, LinearModel):
        model_fields = dict(model=_d.MODEL_LINEAR, base=model.base, alpha=model.alpha, beta=model.beta)
    else:
        model_fields = dict(model=_d.MODEL_DECODE, prefill_per_token=model.prefill_per_token, tbt_beta=model.beta,
                            tbt_gamma=model.gamma)
    config = _d.TokenConfig(
        run=_d.RUN.pack(n=n, arrival_kind=akind, rate=rate, prompt_kind=workload._prompt.kind,
                        output_kind=workload._output.kind, integer=workload.integer_lengths,
                        predictor_sigma=workload.predictor_sigma, keep_requests=plan.keep_requests,
                        keep_batches=plan.keep_batches),
        policy=_d.POLICY.pack(
            policy=_d.POL_STATIC if static else _d.POL_MB_DYNAMIC if multibin else _d.POL_DYNAMIC,
            bins=policy.bins if multibin else 1, pin=b_max if static else (policy.pin or 0),
            max_candidates=b_max if static else (policy.max_candidates or sla.b_max),
            selection=(_d.SEL_LONGEST_QUEUE if multibin and policy.selection == "longest_queue"
                       else _d.SEL_ROUND_ROBIN),
            warmup=policy.warmup if multibin else 1, memory_on=mem.enabled and not static,
            # more servers than requests are never all busy: the kernel needs at most n
            servers=min(plan.servers, n)),
        sla=_c.SLA.pack(variant=_c.CTL_VARIANT_SPEC if sla.variant == "spec" else _c.CTL_VARIANT_MULTIPLICATIVE,
                        d_sla=sla.d_sla, eps_d=sla.eps_d, b_min=sla.b_min, b_max=b_max, alpha=sla.alpha,
                        delta=sla.delta, ema=_c.DEFAULT_EMA),
        memory=_c.MEMORY.pack(variant=_c.MEM_VARIANT_CLT if mem.variant == "clt" else _c.MEM_VARIANT_L0,
                              eta=mem.eta, b_min=sla.b_min, b_max=b_max, z=float(_st.norm.ppf(1.0 - mem.eps_m)),
                              default_tokens=_c.DEFAULT_TOKENS),
        model=_d.MODEL.zeros(**model_fields))
    piecewise = isinstance(arrivals, PiecewisePoisson)
    limits = multibin and policy.bin_b_max is not None
    inputs = _d.INPUTS.pack(
        arrival_times=arrivals.times if isinstance(arrivals, Replay) else np.empty(0),
        pw_rates=arrivals.rates if piecewise else [1.0], pw_ends=[*arrivals.ends, np.inf] if piecewise else [np.inf],
        prompt_params=workload._prompt.params, prompt_values=workload._prompt.values,
        output_params=workload._output.params, output_values=workload._output.values,
        bin_b_max=policy.bin_b_max if limits else np.zeros(policy.bins if multibin else 1))
    streams = _d.TokenStreams(*(stream(ss, s) for s in (STREAM_ARRIVALS, STREAM_SERVICE, STREAM_PROMPT,
                                                         STREAM_PREDICTION)))
    return config, inputs, streams


def _run_tokens(plan: _TokenPlan, ss) -> "TokenSimulationResult":
    policy, arrivals, workload, service_model = plan.policy, plan.arrivals, plan.workload, plan.model
    n, servers, keep_requests, keep_batches = plan.n, plan.servers, plan.keep_requests, plan.keep_batches
    static = isinstance(policy, StaticBatching)
    ctl_cfg = policy.sla if static else policy.controller
    mem = policy.memory
    K = policy.bins if isinstance(policy, MultiBinDynamic) else 1
    args = _pack_tokens(plan, ss)
    stop = stop_flag()
    out, req, bat = interruptible(lambda: _d.run(*args, stop, groups=BATCH_MEANS_GROUPS, ts_rows=TIME_SERIES_ROWS),
                                  stop)
    stats = _d.STATS.unpack((out.ints, out.floats))

    completed = stats["completed"]
    nb = stats["batches"]
    nan = math.nan
    span = stats["last_completion"] - stats["first_arrival"] if completed else nan
    tokens_out = stats["tokens_out"]
    with np.errstate(invalid="ignore", divide="ignore"):
        g_lat = np.where(out.group_count > 0, out.group_latency / out.group_count, nan)
    mean_lat = stats["sum_latency"] / completed if completed else nan
    ci = _batch_means_ci(g_lat, mean_lat)
    if keep_requests and completed:
        lat = req["completion"] - req["arrival"]
        q = np.quantile(lat[~np.isnan(lat)], QUANTILES)
    else:
        q = _hist_quantiles(out.hist, QUANTILES)
    mean_b = stats["sum_b"] / nb if nb else nan
    var_b = stats["sum_b2"] / nb - mean_b ** 2 if nb else nan
    # infeasible: a controller still above D_SLA + eps_D with its interval
    # shrunk to B_min (the midpoint may sit higher: alpha, N_decode)
    infeasible = False
    if not static:
        C = _c.C
        for b in range(K):
            if (out.ctl[b, C.updates] >= 3 and out.ctl[b, C.tau_avg] > ctl_cfg.d_sla + ctl_cfg.eps_d
                    and out.ctl[b, C.b_low] <= ctl_cfg.b_min):
                infeasible = True
    metrics = {
        "throughput": completed / span if completed and span > 0 else nan,
        "token_throughput": tokens_out / span if completed and span > 0 else nan,
        "mean_latency": mean_lat,
        "mean_latency_ci_low": ci[0],
        "mean_latency_ci_high": ci[1],
        "latency_p50": float(q[0]), "latency_p95": float(q[1]), "latency_p99": float(q[2]),
        "mean_ttft": stats["sum_ttft"] / completed if completed else nan,
        "mean_tbt": stats["sum_tbt_tokens"] / tokens_out if tokens_out > 0 else nan,
        "sla_violation_tokens": stats["sla_tokens"] / tokens_out if tokens_out > 0 else nan,
        "sla_violation_requests": stats["sla_requests"] / completed if completed else nan,
        "gpu_utilization": stats["busy"] / (servers * span) if completed and span > 0 else nan,
        "memory_peak": stats["peak_tokens"] / mem.eta,
        "memory_mean": (stats["token_seconds"] / (servers * span * mem.eta)
                        if completed and span > 0 else nan),
        "mem_exceed_batches": stats["mem_exceed"],
        "rejected": stats["rejected"],
        "batch_size_mean": mean_b,
        "batch_size_std": math.sqrt(max(var_b, 0.0)) if nb else nan,
        "completed": completed,
        "n_batches": nb,
        "span": span,
        "warmup_time": stats["warmup_time"],
        "sla_infeasible": int(infeasible),
    }
    cnt = stats["ts_rows"]
    ts_dict = {col: out.ts[:cnt, getattr(_d.TS, col)].copy() for col in ("time", *TS_COLUMNS)}
    ts_dict["queue"] = out.ts[:cnt, _d.TS_QUEUE:].copy()
    config = {**policy.describe(), **arrivals.describe(), **workload.describe(),
              "service_model": type(service_model).__name__,
              **{f"model_{k}": v for k, v in vars(service_model).items()},
              "n": n, "servers": int(servers), "seed_entropy": entropy_str(ss)}
    requests = None
    if keep_requests:
        requests = {**req, "latency": req["completion"] - req["arrival"]}
    batches = None
    if keep_batches:
        batches = {k: v[:nb] for k, v in bat.items()}
    if isinstance(arrivals, Poisson):
        unstable, reason = queue_growing(ts_dict["time"], ts_dict["queue"], metrics["batch_size_mean"],
                                         0.0, n / arrivals.rate)
    elif isinstance(arrivals, Replay):
        unstable, reason = queue_growing(ts_dict["time"], ts_dict["queue"], metrics["batch_size_mean"],
                                         float(arrivals.times[0]), float(arrivals.times[n - 1]))
    elif isinstance(arrivals, Saturated):
        unstable, reason = False, "not assessed: every request arrives at time 0 (saturated)"
    else:
        unstable, reason = False, "not assessed: a load step has no single steady state"
    res = TokenSimulationResult(config=config, metrics_=metrics, batch_size_hist=out.size_hist,
                                edges=np.stack([out.edges_lo, out.edges_hi], axis=1), time_series=ts_dict,
                                group_mean_latency=g_lat, requests=requests, batches=batches,
                                unstable=unstable, unstable_reason=reason)
    if unstable:
        warnings.warn(f"no steady state: {reason}", UnstableWarning, stacklevel=4)
    return res
