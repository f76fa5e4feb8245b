"""``simulate`` for the token-level policies: static, dynamic and multi-bin
dynamic batching.  Validates, derives the streams, runs the event kernel,
wraps the result."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _st

from ._kernels import controller as _c
from ._kernels import dynamic as _d
from ._kernels import multibin as _k
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


def _lengths(spec):
    return spec.kind, spec.params, spec.values


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
        "bins": (K * (queue + 8 * (TIME_SERIES_ROWS + _c.N_CTL + _c.N_ST + 4)), "the bins' queues"),
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


def _run_tokens(plan: _TokenPlan, ss) -> "TokenSimulationResult":
    policy, arrivals, workload, service_model = plan.policy, plan.arrivals, plan.workload, plan.model
    n, servers, keep_requests, keep_batches = plan.n, plan.servers, plan.keep_requests, plan.keep_batches
    static = isinstance(policy, StaticBatching)
    ctl_cfg = policy.sla if static else policy.controller
    mem = policy.memory
    K = policy.bins if isinstance(policy, MultiBinDynamic) else 1
    if static:
        pol, pin, b_max = _d.POL_STATIC, policy.batch_size, policy.batch_size
    else:
        pol = _d.POL_MB_DYNAMIC if isinstance(policy, MultiBinDynamic) else _d.POL_DYNAMIC
        pin, b_max = (policy.pin or 0), ctl_cfg.b_max
    max_cand = b_max if static else (policy.max_candidates or ctl_cfg.b_max)
    pp = np.zeros(_d.N_PP)
    pp[_d.PP_POLICY] = pol
    pp[_d.PP_BINS] = K
    pp[_d.PP_B] = pin
    pp[_d.PP_MAX_CAND] = max_cand
    pp[_d.PP_SELECT] = (_d.SEL_LONGEST_QUEUE if isinstance(policy, MultiBinDynamic)
                        and policy.selection == "longest_queue" else _d.SEL_ROUND_ROBIN)
    pp[_d.PP_WARMUP] = policy.warmup if isinstance(policy, MultiBinDynamic) else 1
    pp[_d.PP_MEMORY_ON] = 1.0 if mem.enabled and not static else 0.0
    # more servers than requests are never all busy: the kernel needs at most n
    c = min(servers, n)
    pp[_d.PP_SERVERS] = c
    pp[_d.PP_INTEGER] = 1.0 if workload.integer_lengths else 0.0
    pp[_d.PP_PRED_SIGMA] = workload.predictor_sigma
    pp[_d.PP_MODEL] = service_model.code

    ccfg = np.zeros(_c.N_CC)
    ccfg[_c.CC_D_SLA] = ctl_cfg.d_sla
    ccfg[_c.CC_EPS_D] = ctl_cfg.eps_d
    ccfg[_c.CC_B_MIN] = ctl_cfg.b_min
    ccfg[_c.CC_B_MAX] = b_max if static else ctl_cfg.b_max
    ccfg[_c.CC_ALPHA] = ctl_cfg.alpha
    ccfg[_c.CC_DELTA] = ctl_cfg.delta
    ccfg[_c.CC_VARIANT] = _c.CTL_VARIANT_SPEC if ctl_cfg.variant == "spec" else _c.CTL_VARIANT_MULTIPLICATIVE
    ccfg[_c.CC_EMA] = _c.DEFAULT_EMA
    mcfg = np.zeros(_c.N_MC)
    mcfg[_c.MC_ETA] = mem.eta
    mcfg[_c.MC_B_MIN] = ctl_cfg.b_min
    mcfg[_c.MC_B_MAX] = ccfg[_c.CC_B_MAX]
    mcfg[_c.MC_VARIANT] = _c.MEM_VARIANT_CLT if mem.variant == "clt" else 0
    mcfg[_c.MC_Z] = float(_st.norm.ppf(1.0 - mem.eps_m))
    mcfg[_c.MC_DEFAULT_TOKENS] = _c.DEFAULT_TOKENS
    bin_b_max = np.zeros(K)
    if isinstance(policy, MultiBinDynamic) and policy.bin_b_max is not None:
        bin_b_max[:] = policy.bin_b_max

    if isinstance(arrivals, Poisson):
        akind, rate = _k.ARR_POISSON, arrivals.rate
    elif isinstance(arrivals, PiecewisePoisson):
        akind, rate = _d.ARR_PIECEWISE, arrivals.rates[0]
    elif isinstance(arrivals, Saturated):
        akind, rate = _k.ARR_SATURATED, 0.0
    else:
        akind, rate = _k.ARR_REPLAY, 0.0
    times = arrivals.times if isinstance(arrivals, Replay) else np.empty(0)
    pw_rates = np.array(arrivals.rates if isinstance(arrivals, PiecewisePoisson) else [1.0])
    pw_ends = np.array(list(arrivals.ends) + [np.inf] if isinstance(arrivals, PiecewisePoisson) else [np.inf])

    fstats = np.zeros(_d.N_F)
    fstats[_d.F_WARMUP_TIME] = np.nan
    fstats[_d.F_LAST_COMPLETION] = -np.inf
    istats = np.zeros(_d.N_I, np.int64)
    istats[_d.I_TS_STRIDE] = 1
    hist = np.zeros(_k.HIST_SIZE, np.int64)
    # no batch holds more than n requests
    size_hist = np.zeros(int(min(b_max, n)) + 1, np.int64)
    ts = np.zeros((TIME_SERIES_ROWS, _d.N_TS_FIXED + K))
    ctl = np.zeros((K, _c.N_CTL))
    for b in range(K):
        _c.controller_init(ctl[b], float(ctl_cfg.b_min), float(ccfg[_c.CC_B_MAX]))
    st = np.zeros((K, _c.N_ST))
    edges_lo = np.zeros(K)
    edges_hi = np.full(K, _c.EDGE_MAX)
    G = 32
    group_latency = np.zeros(G)
    group_count = np.zeros(G, np.int64)
    m = n if keep_requests else 0
    r = {f: np.full(m, np.nan) for f in ("arrival", "prompt", "output", "pred", "start", "completion", "ttft")}
    r_bin = np.full(m, -1, np.int64)
    r_batch = np.full(m, -1, np.int64)
    mb_ = n if keep_batches else 0
    bt = {f: np.full(mb_, np.nan) for f in ("start", "service", "tokens")}
    bi = {f: np.full(mb_, -1, np.int64) for f in ("bin", "size", "b_target", "b_mem", "b_sla")}

    pk, pprm, pval = _lengths(workload._prompt)
    ok, oprm, oval = _lengths(workload._output)
    stop = stop_flag()
    interruptible(lambda: _d.run_kernel((
        n, akind, rate, times, pw_rates, pw_ends, pk, pprm, pval, ok, oprm, oval,
        stream(ss, STREAM_ARRIVALS), stream(ss, STREAM_SERVICE), stream(ss, STREAM_PROMPT),
        stream(ss, STREAM_PREDICTION), pp, ccfg, mcfg, bin_b_max, service_model.vector(),
        bool(keep_requests), bool(keep_batches), fstats, istats, hist, size_hist, ts, ctl, st,
        edges_lo, edges_hi, group_latency, group_count,
        r["arrival"], r["prompt"], r["output"], r["pred"], r_bin, r_batch, r["start"], r["completion"],
        r["ttft"], bt["start"], bi["bin"], bi["size"], bi["b_target"], bi["b_mem"], bi["b_sla"],
        bt["service"], bt["tokens"],
    ), K, c, min(int(pp[_d.PP_WARMUP]), n), stop), stop)

    completed = int(istats[_d.I_COMPLETED])
    nb = int(istats[_d.I_BATCHES])
    nan = math.nan
    span = float(fstats[_d.F_LAST_COMPLETION] - fstats[_d.F_FIRST_ARRIVAL]) if completed else nan
    tokens_out = float(fstats[_d.F_TOKENS_OUT])
    with np.errstate(invalid="ignore", divide="ignore"):
        g_lat = np.where(group_count > 0, group_latency / group_count, nan)
    mean_lat = float(fstats[_d.F_SUM_LATENCY]) / completed if completed else nan
    ci = _batch_means_ci(g_lat, mean_lat)
    if keep_requests and completed:
        lat = r["completion"] - r["arrival"]
        q = np.quantile(lat[~np.isnan(lat)], QUANTILES)
    else:
        q = _hist_quantiles(hist, QUANTILES)
    mean_b = float(fstats[_d.F_SUM_B]) / nb if nb else nan
    var_b = float(fstats[_d.F_SUM_B2]) / nb - mean_b ** 2 if nb else nan
    # infeasible: a controller still above D_SLA + eps_D with its interval
    # shrunk to B_min (the midpoint may sit higher: alpha, N_decode)
    infeasible = False
    if not static:
        for b in range(K):
            if (ctl[b, _c.CTL_UPDATES] >= 3 and ctl[b, _c.CTL_TAU_AVG] > ctl_cfg.d_sla + ctl_cfg.eps_d
                    and ctl[b, _c.CTL_B_LOW] <= ctl_cfg.b_min):
                infeasible = True
    metrics = {
        "throughput": completed / span if completed and span > 0 else nan,
        "token_throughput": tokens_out / span if completed and span > 0 else nan,
        "mean_latency": mean_lat,
        "mean_latency_ci_low": ci[0],
        "mean_latency_ci_high": ci[1],
        "latency_p50": float(q[0]), "latency_p95": float(q[1]), "latency_p99": float(q[2]),
        "mean_ttft": float(fstats[_d.F_SUM_TTFT]) / completed if completed else nan,
        "mean_tbt": float(fstats[_d.F_SUM_TBT_TOKENS]) / tokens_out if tokens_out > 0 else nan,
        "sla_violation_tokens": float(fstats[_d.F_SLA_TOKENS]) / tokens_out if tokens_out > 0 else nan,
        "sla_violation_requests": int(istats[_d.I_SLA_REQUESTS]) / completed if completed else nan,
        "gpu_utilization": float(fstats[_d.F_BUSY]) / (servers * span) if completed and span > 0 else nan,
        "memory_peak": float(fstats[_d.F_PEAK_TOKENS]) / mem.eta,
        "memory_mean": (float(fstats[_d.F_TOKEN_SECONDS]) / (servers * span * mem.eta)
                        if completed and span > 0 else nan),
        "mem_exceed_batches": int(istats[_d.I_MEM_EXCEED]),
        "rejected": int(istats[_d.I_REJECTED]),
        "batch_size_mean": mean_b,
        "batch_size_std": math.sqrt(max(var_b, 0.0)) if nb else nan,
        "completed": completed,
        "n_batches": nb,
        "span": span,
        "warmup_time": float(fstats[_d.F_WARMUP_TIME]),
        "sla_infeasible": int(infeasible),
    }
    cnt = int(istats[_d.I_TS_COUNT])
    ts_dict = {"time": ts[:cnt, _d.TS_TIME].copy()}
    for j, col in enumerate(TS_COLUMNS):
        ts_dict[col] = ts[:cnt, _d.TS_B_TARGET + j].copy()
    ts_dict["queue"] = ts[:cnt, _d.N_TS_FIXED:].copy()
    config = {**policy.describe(), **arrivals.describe(), **workload.describe(),
              "service_model": type(service_model).__name__,
              **{f"model_{k}": v for k, v in vars(service_model).items()},
              "n": n, "servers": int(servers), "seed_entropy": entropy_str(ss)}
    requests = None
    if keep_requests:
        requests = {**r, "bin": r_bin, "batch": r_batch}
        requests["latency"] = requests["completion"] - requests["arrival"]
    batches = None
    if keep_batches:
        batches = {k: v[:nb] for k, v in {**bt, **bi}.items()}
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
    res = TokenSimulationResult(config=config, metrics_=metrics, batch_size_hist=size_hist,
                                edges=np.stack([edges_lo, edges_hi], axis=1), time_series=ts_dict,
                                group_mean_latency=g_lat, requests=requests, batches=batches,
                                unstable=unstable, unstable_reason=reason)
    if unstable:
        warnings.warn(f"no steady state: {reason}", UnstableWarning, stacklevel=4)
    return res
