"""The parameter table: every parameter's name, kind, domain, units, default
and description, declared once.

The table drives the constructors' validation (:func:`mbbatch._validation.check`),
the sweep spec checker, the sweep Dataset's coordinates (units and
descriptions), the command line's flags and the tests' hypothesis strategies.
Names are those of the config fields, the spec keys, the Dataset dimensions
and (with ``-`` for ``_``) the CLI flags.  Where two classes give one name
different meanings, the key is qualified by the class (``"LinearModel.alpha"``
and ``"SLAController.alpha"``).  The multi-bin paper's symbols (``B``, ``k``,
``lam``) appear only as documented names of :mod:`mbbatch.theory`'s
arguments (:data:`SYMBOLS`).

Kinds:

``real``
    a real number in ``domain`` (ints accepted; bools, strings, lists refused)
``count``
    an integer in ``domain``, below 2**63 (floats, even 4.0, refused)
``servers``
    a count, or ``math.inf`` for infinitely many
``flag``
    a bool
``choice``
    one of ``choices`` (strings)
``reals`` / ``counts``
    a 1-D sequence of reals / counts, each in ``domain``
``object``
    an instance of a config class (no domain)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._kernels.admission import ORDERS as _ORDERS
from ._kernels.cost import TERMS as _COST_TERMS
from ._kernels.routing import ROUTERS as _ROUTERS

__all__ = ["Domain", "Param", "PARAMS", "REQUIRED", "SYMBOLS", "MAX_DURATION", "MAX_KV_TOKENS", "MAX_BLOCK_SIZE",
           "MAX_MEASURED_TIME", "default"]

INF = math.inf

#: Largest service time (or token length) accepted: the kernels sum service
#: times over up to ~1e18 requests, which stays below the float maximum 1.8e308.
MAX_DURATION = 1e290

#: Bound (excluded) of a finite KV cache, tokens: the continuous engine counts a
#: sequence's tokens and the cache's blocks in int64, where 2**62 blocks stand for
#: no limit (``_kernels.continuous.UNLIMITED``), and rounds a sequence of at most
#: ``kv_tokens`` tokens up to blocks as ``tokens + block_size - 1``: below 2**62
#: tokens, with ``block_size`` at most :data:`MAX_BLOCK_SIZE`, that stays below 2**63.
MAX_KV_TOKENS = 2.0 ** 62

#: Largest KV block, tokens: the engine keeps a count of its sequences per block
#: phase, an int64 array of ``block_size`` entries per engine (8 MiB at 2**20;
#: engines use blocks of 16 to a few thousand tokens).
MAX_BLOCK_SIZE = 2 ** 20

#: Largest measured batch time a fit takes (s; about 34 years): the top of the
#: typical service times whose latencies a run resolves
#: (``planners.common.SCALE_RANGE``), far beyond any accelerator's batch, and
#: small enough that the least squares' sums of squared times stay finite
#: (a time of 1e300 s gave an RMSE of inf).  A fit's token counts and their
#: aggregates stay below :data:`MAX_KV_TOKENS`.
MAX_MEASURED_TIME = 2.0 ** 30


def _fmt(v: float) -> str:
    if v == INF:
        return "inf"
    if v == -INF:
        return "-inf"
    if float(v).is_integer() and abs(v) < 1e17:
        return str(int(v))          # 2**53 in full, not 9.0072e+15
    m, e = math.frexp(abs(v))
    if m == 0.5 and float(v).is_integer():
        return f"{'-' if v < 0 else ''}2**{e - 1}"      # 2**62, not 4.61169e+18
    return f"{v:g}"


@dataclass(frozen=True)
class Domain:
    """An interval ``lo < x < hi``, each end open or closed.

    ``math.inf`` is a member only where the interval is closed at inf, or
    ``or_inf`` (a bounded interval and inf for "no limit": ``(0, 2**62) or
    inf``); NaN never is.
    """

    lo: float
    hi: float
    lo_closed: bool = False
    hi_closed: bool = False
    or_inf: bool = False

    def __str__(self) -> str:
        left = "[" if self.lo_closed else "("
        right = "]" if self.hi_closed else ")"
        return f"{left}{_fmt(self.lo)}, {_fmt(self.hi)}{right}" + (" or inf" if self.or_inf else "")

    def contains(self, x):
        """Elementwise membership; NaN is never a member."""
        import numpy as np

        x = np.asarray(x, dtype=float)
        above = x >= self.lo if self.lo_closed else x > self.lo
        below = x <= self.hi if self.hi_closed else x < self.hi
        inside = above & below
        if self.or_inf:
            inside = inside | (x == INF)
        return inside & ~np.isnan(x)


class _Required:
    def __repr__(self):
        return "REQUIRED"


#: The default of a parameter that has none: it must be given.
REQUIRED = _Required()


@dataclass(frozen=True)
class Param:
    """One parameter: see the module docstring for the kinds."""

    name: str
    kind: str
    units: str
    description: str
    domain: Domain | None = None
    default: object = REQUIRED
    choices: tuple = ()

    @property
    def flag(self) -> str:
        """The command-line flag."""
        return "--" + self.name.rsplit(".", 1)[-1].replace("_", "-")

    @property
    def integer(self) -> bool:
        return self.kind in ("count", "counts", "servers")


_POS = Domain(0, INF)
_NONNEG = Domain(0, INF, lo_closed=True)
_NONNEG_INF = Domain(0, INF, lo_closed=True, hi_closed=True)
_COUNT = Domain(1, INF, lo_closed=True)
_COUNT0 = Domain(0, INF, lo_closed=True)
_REAL = Domain(-INF, INF)
# a service model's times (s, s/token, s/expert): below MAX_DURATION, as a service time
_NONNEG_TIME = Domain(0, MAX_DURATION, lo_closed=True)
_POS_TIME = Domain(0, MAX_DURATION)


def _p(name, kind, units, description, domain=None, default=REQUIRED, choices=()):
    return Param(name, kind, units, description, domain, default, choices)


#: The one table of parameters, by key.
PARAMS: dict[str, Param] = {p.name: p for p in [
    # --- the run ------------------------------------------------------------------------
    # 2**53: counts of requests stay exact in float64 statistics
    # (a default long enough for a first look at a stable load; a serious sweep sets its own)
    _p("n", "count", "requests", "number of requests to simulate",
       Domain(1, 2.0 ** 53, lo_closed=True, hi_closed=True), default=10_000),
    _p("servers", "servers", "servers",
       "identical servers sharing the queue; math.inf (\"inf\" in a spec) for Assumption 5.1",
       Domain(1, INF, lo_closed=True, hi_closed=True), default=1),
    # --- arrivals -----------------------------------------------------------------------
    _p("rate", "real", "requests/s", "arrival rate", _POS),
    _p("rates", "reals", "requests/s", "arrival rates of a piecewise Poisson process", _POS),
    _p("ends", "reals", "s", "times the piecewise Poisson rate changes", _POS, default=()),
    _p("times", "reals", "s", "replayed arrival times", _REAL),
    _p("cv", "real", "1", "coefficient of variation of the gamma inter-arrival times (1: Poisson)", _POS),
    # a two-state Markov-modulated Poisson process (BurstGPT-style bursts, as in Pang et al., 2025, arXiv:2503.05248)
    _p("rate_on", "real", "requests/s", "arrival rate in the ON state", _POS),
    _p("rate_off", "real", "requests/s", "arrival rate in the OFF state (0: silent)", _NONNEG, default=0.0),
    _p("mean_on", "real", "s", "mean ON sojourn (exponential)", _POS),
    _p("mean_off", "real", "s", "mean OFF sojourn (exponential)", _POS),
    _p("Replay.scale", "real", "1", "speed-up of a replayed trace: arrival times are divided by it",
       _POS, default=1.0),
    _p("window", "reals", "s", "(start, end): the replayed arrivals with start <= t < end, from t = 0",
       Domain(0, INF, lo_closed=True, hi_closed=True), default=None),
    # a sweep's trace filters, as parameters (grid axes allowed): the loaders' window and drop_failed
    _p("window_start", "real", "s", "start of the trace's time window (s after its first request)",
       Domain(0, INF, lo_closed=True), default=0.0),
    _p("window_end", "real", "s", "end of the trace's time window (inf: to the trace's end)",
       Domain(0, INF, hi_closed=True), default=INF),
    _p("drop_failed", "flag", "", "drop the trace's failed requests (no output token); unset: the loader's "
       "default (false for Azure traces, true for BurstGPT)", default=None),
    _p("rate_high", "real", "requests/s", "arrival rate between t_up and t_down (load step)", _POS),
    _p("t_up", "real", "s", "time the load steps up", _POS),
    _p("t_down", "real", "s", "time the load steps back down", _POS),
    # --- requests: service times and token lengths ----------------------------------------
    _p("service", "reals", "s", "service time of one request (token length for prompt and output)",
       Domain(0, MAX_DURATION, lo_closed=True, hi_closed=True)),
    # the multi-bin paper's workloads (Guldogan et al., 2024, arXiv:2412.04504): U(1, 20) service
    # times (its Figures 3 and 4), exponential with mu = 0.1 (its Figure 8)
    _p("l_min", "real", "s", "smallest service time of a request (uniform service)", _NONNEG, default=1.0),
    _p("l_max", "real", "s", "largest service time of a request (uniform service)", _POS, default=20.0),
    _p("mu", "real", "1/s", "exponential service rate", _POS, default=0.1),
    # token-level requests: log-normal prompts of median 256 tokens and outputs of median 128 (the
    # dynamic-batching experiments' chat-like workload as this project's token specs take it)
    _p("prompt_median", "real", "tokens", "median prompt length (log-normal)", _POS, default=256.0),
    _p("prompt_sigma", "real", "1", "log-normal shape of the prompt length", _POS, default=0.6),
    _p("output_median", "real", "tokens", "median output length (log-normal)", _POS, default=128.0),
    _p("output_sigma", "real", "1", "log-normal shape of the output length", _POS, default=1.0),
    _p("integer_lengths", "flag", "", "round drawn lengths up to whole tokens (at least 1)", default=True),
    _p("predictor_sigma", "real", "1",
       "log-normal error of the output-length predictor: predicted = output * exp(sigma Z); 0 is the oracle",
       _NONNEG, default=0.0),
    _p("ttft_slo", "real", "s", "the requests' objective on their time to first token, which goodput counts; "
       "earliest-deadline-first admission's deadline after arrival (inf: none)", Domain(0, MAX_DURATION, or_inf=True),
       default=INF),
    _p("tpot_slo", "real", "s/token", "the requests' objective on their time per output token, (last token - first "
       "token) / (output - 1), which goodput counts with ttft_slo (inf: none)",
       Domain(0, MAX_DURATION, or_inf=True), default=INF),
    _p("class_share", "real", "1", "a request class's weight in a Workload.mixture: the probability of the class "
       "is its share over the shares' sum", Domain(0, MAX_DURATION)),
    # --- length predictors (what a binning policy bins by) ------------------------------
    _p("LogNormalError.sigma", "real", "1", "log-normal error of the prediction: true * exp(sigma Z)", _NONNEG),
    _p("BinConfusion.p", "real", "1", "probability that a request lands in its true bin (else a neighbour)",
       Domain(0, 1, lo_closed=True, hi_closed=True)),
    _p("predictor_p", "real", "1",
       "bin confusion of the binning policies: probability that a request lands in its true bin; 1 is the oracle",
       Domain(0, 1, lo_closed=True, hi_closed=True), default=1.0),
    # --- policies -----------------------------------------------------------------------
    _p("bins", "count", "bins", "number of bins", _COUNT, default=4),
    # K = 4: the example of Pang et al., 2025, arXiv:2503.05248, Algorithm 6
    _p("MultiBinDynamic.bins", "count", "bins", "number of bins K of multi-bin dynamic batching", _COUNT,
       default=4),
    # B = 128: the multi-bin paper's batch size (its Figures 3, 4 and 6)
    _p("batch_size", "count", "requests", "batch size: requests per batch", _COUNT, default=128),
    _p("MultiBin.edges", "reals", "s",
       "the bins + 1 bin edges; -inf first and inf last allowed, NaN never", Domain(-INF, INF, True, True),
       default=None),
    _p("edges", "choice", "", "bin edges: equal probability mass, Lemma A.1's (exponential only), or the "
       "edges minimising eq. (2) (theory.optimal_boundaries)",
       default="equal_mass", choices=("equal_mass", "lemma_a1", "optimal")),
    _p("max_wait", "real", "s", "starvation guard: a request that waited this long goes without waiting for its "
       "batch (MultiBin: its bin's partial batch leaves; shortest-predicted-first: it goes first, oldest first)",
       _NONNEG_INF, default=INF),
    _p("max_candidates", "count", "requests", "candidates looked at per batching decision (default b_max)",
       _COUNT, default=None),
    _p("pin", "count", "requests", "fixed b_target of the dynamic policies (the controller still learns)",
       _COUNT, default=None),
    # Pang et al. leave the warm-up's length open: with 1000 predictions an edge's
    # probability mass is off by sqrt(p (1 - p) / 1000), at most 1.6 percentage points (1 sd)
    _p("warmup", "count", "requests", "requests whose predictions set Algorithm 6's edges", _COUNT,
       default=1000),
    _p("bin_b_max", "counts", "requests", "per-bin batch size limits (Algorithm 1, step 5)", _COUNT,
       default=None),
    # presample: Pang et al.'s pre-sample of predicted lengths from the workload; optimal: theory.optimal_boundaries
    _p("bin_edges", "choice", "",
       "multi-bin dynamic batching's bin edges: equal mass of the warm-up window's predictions (Algorithm 6), "
       "of a pre-sample of the workload drawn before the run, or the edges minimising eq. (2) at B = b_max",
       default="warmup", choices=("warmup", "presample", "optimal")),
    _p("selection", "choice", "", "bin selection of Algorithm 5", default="round_robin",
       choices=("round_robin", "longest_queue")),
    # --- continuous batching (vLLM's defaults) ---------------------------------------------
    _p("max_num_seqs", "count", "sequences", "running sequences at most (continuous batching)", _COUNT,
       default=256),
    _p("max_batched_tokens", "count", "tokens", "tokens an iteration processes at most: decodes one each, "
       "prefill chunks (continuous batching)", _COUNT, default=2048),
    _p("chunked_prefill", "flag", "", "prefill chunks mixed with the decodes in one iteration (else whole prompts "
       "in iterations of their own, the decodes paused)", default=True),
    _p("kv_tokens", "real", "tokens", "KV cache capacity (continuous batching; inf: memory never binds)",
       Domain(0, MAX_KV_TOKENS, or_inf=True), default=INF),
    _p("block_size", "count", "tokens", "tokens per KV block (paged memory)",
       Domain(1, MAX_BLOCK_SIZE, lo_closed=True, hi_closed=True), default=16),
    _p("admission", "choice", "", "the order waiting requests are admitted in: first come first served, shortest "
       "predicted output first, multi-bin (bins by predicted output, served round robin), earliest deadline first "
       "(the class's objective on the time to first token after arrival), fair sharing across classes by "
       "virtual token counters or a skip-join multi-level feedback queue (preempting at its quanta)", default="fcfs",
       choices=tuple(_ORDERS)),
    _p("ContinuousBatching.bins", "count", "bins", "bins of multi-bin admission (continuous batching)", _COUNT,
       default=4),
    _p("aging", "real", "tokens/s", "shortest predicted output first with aging: the tokens of predicted output a "
       "waiting request's priority gains per second it waits (continuous batching, admission 'spf'; 0: none)",
       _NONNEG, default=0.0),
    _p("mlfq_quantum", "count", "tokens", "skip-join multi-level feedback queue: the first level's quantum, decode "
       "tokens a running sequence takes before it is demoted (level l's: quantum x 2^l; continuous batching, "
       "admission 'mlfq')", Domain(1, 1 << 20, lo_closed=True, hi_closed=True), default=16),
    _p("mlfq_levels", "count", "levels", "skip-join multi-level feedback queue: its levels, the last one's quantum "
       "unbounded (continuous batching, admission 'mlfq'; 1: first come first served)",
       Domain(1, 32, lo_closed=True, hi_closed=True), default=4),
    # what a real server pays beyond the forward pass: 0 (the engine's forward time alone) unless set, as
    # by an engine preset (mbbatch.engines) or a calibration to measured serving runs (mbbatch.validation)
    _p("iteration_overhead", "real", "s", "time every engine iteration pays beyond the forward pass (scheduling, "
       "sampling, the CPU side; continuous batching)", _NONNEG_TIME, default=0.0),
    _p("request_overhead", "real", "s", "time added to every request's time to first token and latency outside "
       "the engine (API server, tokenization, detokenization; continuous batching)", _NONNEG_TIME, default=0.0),
    _p("num_scheduler_steps", "count", "iterations", "iterations one scheduling decision runs (vLLM's multi-step "
       "scheduling, --num-scheduler-steps): requests are admitted and prompts prefilled only at the first of a "
       "block, tokens are returned at its end (continuous batching)", Domain(1, 1024, lo_closed=True, hi_closed=True),
       default=1),
    _p("ContinuousBatching.edges", "reals", "tokens", "the bins - 1 inner edges of multi-bin admission, predicted "
       "output tokens, strictly ascending (default: the output's equal-mass quantiles)", _REAL, default=None),
    _p("sla_control", "flag", "", "the dynamic-batching controller (Algorithms 1, 2 and 7, its memory eta the "
       "engine's kv_tokens) sets the running sequences' cap at every iteration (continuous batching)",
       default=False),
    # --- batch service models -----------------------------------------------------------
    _p("service_model", "choice", "", "batch service model of the token-level policies (prefill: LAPS's; "
       "multibin on a workload: max, iteration or profile)",
       default="decode", choices=("decode", "linear", "max", "calibrated", "prefill", "iteration", "profile")),
    # a measured accelerator (mbbatch.profiles): its choices are the shipped profiles' names
    _p("profile", "choice", "", "a measured hardware profile: IterationModel fitted to an accelerator's batch "
       "times (mbbatch.profiles.names())", default="H100/vLLM/Meta-Llama-3-8B/tp1", choices=()),
    _p("base", "real", "s", "fixed time per batch", _NONNEG_TIME, default=0.0),
    _p("per_token", "real", "s/token", "time per output token (MaxModel)", _POS_TIME, default=1.0),
    # no calibration in the sources: 1 ms per token of the longest sequence and a 10% cost of
    # batching are placeholders of the right order for a small model (pass measured values)
    _p("LinearModel.alpha", "real", "s/token", "time per token of the longest sequence", _POS_TIME, default=1e-3),
    _p("LinearModel.beta", "real", "1", "relative cost of batching, times (b-1)/b", _NONNEG, default=0.1),
    # calibrated on an NVIDIA GPU (Pang, Li and Wang, 2025, arXiv:2503.05248)
    _p("DecodeModel.beta", "real", "s/token", "decode time per token at b = 1", _POS_TIME, default=5.74e-3),
    _p("gamma", "real", "1", "decode-time growth with batch size", _NONNEG, default=0.316),
    _p("prefill_per_token", "real", "s/token", "prefill time per prompt token", _NONNEG_TIME, default=0.0),
    # CalibratedModel: alpha + beta * max_seq_len * h(b) on Algorithm 3's service_time_fn(|batch|,
    # max_seq_len) (Pang et al., 2025, arXiv:2503.05248), h(b) and beta, gamma of
    # ComputeDecodeTBT (gamma is the row above).  The paper gives no fixed
    # time per batch: 0 leaves its formula as written (pass a measured value)
    _p("CalibratedModel.alpha", "real", "s", "fixed time per batch (calibrated model)", _NONNEG_TIME, default=0.0),
    # latency_model.beta = 5.74 ms (Pang et al., Algorithm 7's calibrated model); per token of
    # the longest prompt + output, so not DecodeModel.beta's per output token
    _p("CalibratedModel.beta", "real", "s/token",
       "time per token of the batch's longest prompt + output at b = 1: the calibrated decode time between tokens",
       _POS_TIME, default=5.74e-3),
    # Algorithm 7, step 2, with ComputeDecodeTBT's branches (Pang et al.): beta h(b)
    # when calibrated, the default 5.74 ms when not, service / max output_len when none is provided
    _p("CalibratedModel.feedback", "choice", "",
       "decode time Algorithm 7 feeds the SLA controller: beta h(b), the uncalibrated 5.74 ms, or the legacy "
       "service / max output_len", default="calibrated", choices=("calibrated", "uncalibrated", "legacy")),
    # the prefill instances of LAPS: a batch of prefills takes a + b x its prompt tokens.  The
    # LAPS paper (arXiv:2601.11589) gives the form, not values: 5 ms a batch and 0.1 ms a token (10,000
    # prompt tokens/s, the order of a 7B model's prefill on one GPU) are our placeholders
    _p("PrefillModel.a", "real", "s", "fixed time per prefill batch", _NONNEG_TIME, default=5e-3),
    _p("PrefillModel.b", "real", "s/token", "prefill time per prompt token of the batch", _POS_TIME, default=1e-4),
    # IterationModel: an engine iteration's time, linear in what it does: one entry per term of the
    # cost, declared in mbbatch._kernels.cost.TERMS (name, unit, meaning, default).  Defaults: the fit
    # of the profile H100/vLLM/Meta-Llama-3-8B/tp1 (mbbatch.profiles.DEFAULT), to 3 significant digits
    # (a test holds them to it), fitted with its measured prefill (16 prompts of 1,024 tokens), which
    # identifies the prefill rate; its set-up fits at 0, and the prefill's attention is not fitted.  A
    # mixture of experts (e.g. Mixtral: 8 experts, each token routed to 2): an iteration of T tokens
    # reads (E - k)(1 - (1 - k/E)^(T - 1)) experts beyond its first token's k; 0 experts: a dense
    # model, the term is absent (every profile but Mixtral's)
    *(_p(f"IterationModel.{t.name}", "real", t.unit, t.doc, _NONNEG_TIME, default=t.default) for t in _COST_TERMS),
    _p("IterationModel.experts", "count", "experts", "experts per layer of a mixture-of-experts model; 0: dense",
       _COUNT0, default=0),
    _p("IterationModel.experts_per_token", "count", "experts", "experts each token is routed to (top-k)",
       _COUNT, default=2),
    _p("IterationModel.finished", "choice", "",
       "whether a batch's finished members leave its decode iterations (leave) or step on padded (stay)",
       default="leave", choices=("leave", "stay")),
    # --- LAPS (arXiv:2601.11589): the router's and the prefill servers' settings -----------
    _p("LAPS.instances", "count", "instances", "prefill instances behind the router", _COUNT, default=4),
    _p("LAPS.threshold", "count", "tokens", "prompt tokens of the longest short request (--laps-length-threshold)",
       _COUNT0, default=256),
    _p("LAPS.window", "real", "s", "waiting window of short requests (--laps-wait-window-ms); 0: none",
       _NONNEG, default=5e-3),
    _p("LAPS.max_batch", "count", "requests", "requests of a prefill batch at most; a full window of short "
       "requests dispatches at once (--laps-wait-max-batch)", _COUNT, default=8),
    # sglang's default prefill token budget (--max-prefill-tokens)
    _p("LAPS.max_batch_tokens", "real", "tokens", "prompt tokens of a prefill batch at most (its first request "
       "always joins)", _POS, default=16384.0),
    _p("LAPS.interval", "real", "s", "seconds between the router's rebalancing checks at least "
       "(--laps-rebalance-interval-s)", _NONNEG, default=5.0),
    _p("LAPS.ratio", "real", "1", "pending ratio that moves an instance between the groups "
       "(--laps-rebalance-ratio)", _POS, default=2.0),
    _p("LAPS.long_instances", "count", "instances", "instances of the long group at first (default: a third, "
       "at least one)", _COUNT, default=None),
    _p("LAPS.dual_queue", "flag", "", "short and long queues per instance, short first (else one FIFO queue)",
       default=True),
    _p("LAPS.dynamic", "flag", "", "the router's dynamic allocation of instances to a short and a long group",
       default=True),
    # (choices: "none" and the kinds that declare decode_stage, set by mbbatch.registry)
    _p("decode", "choice", "", "a sweep's LAPS decode stage: the token-level policy its decode servers run "
       "(none: latency is the time to first token)", default="none"),
    _p("LAPS.decode_servers", "count", "servers", "decode servers behind the prefill instances (with a decode "
       "policy): each serves the decode policy's batches", _COUNT, default=1),
    # --- prefill/decode disaggregation (Splitwise, arXiv:2311.18677; DistServe, arXiv:2401.09670) --
    _p("Disaggregated.prefill_engines", "count", "engines", "engines of the prefill pool (each request's prompt and "
       "first token)", Domain(1, 2 ** 20, lo_closed=True, hi_closed=True), default=1),
    _p("Disaggregated.decode_engines", "count", "engines", "engines of the decode pool (each request's other "
       "output tokens, its prompt's KV cache transferred)", Domain(1, 2 ** 20, lo_closed=True, hi_closed=True),
       default=1),
    _p("Disaggregated.router", "choice", "", "the prefill pool's router: least-used (fewest active requests), "
       "round-robin, or cache-aware (SGLang's, on the engines' prefix caches, with a Cluster's default balance)",
       default="least_used", choices=("least_used", "round_robin", "cache_aware")),
    _p("Disaggregated.decode_router", "choice", "", "the decode pool's router, as each request's KV cache has "
       "moved: round-robin (dealt in turn, the order the requests become ready) or least-used (fewest active "
       "requests at that instant)", default="round_robin", choices=("round_robin", "least_used")),
    # (a 200 Gb/s InfiniBand HDR link between machines; Llama-3-8B's KV cache: 2 x 32 layers x 8 heads x 128 x 2 bytes)
    _p("KVTransfer.bandwidth", "real", "bytes/s", "the KV transfer link's bandwidth", _POS, default=25e9),
    _p("KVTransfer.latency", "real", "s", "the KV transfer's fixed time (setup, first byte)", _NONNEG,
       default=0.0),
    _p("KVTransfer.bytes_per_token", "real", "bytes", "the KV cache of one token: 2 x layers x KV heads x head "
       "dimension x bytes a value (0: the cache moves in the link's latency alone, as LAPS's decode stage "
       "receives it)", _NONNEG, default=131072.0),
    # --- a cluster of engines behind a router (Autellix, Luo et al., 2025, arXiv:2502.13965) --
    # (2**20: the router's scan packs an engine's id in 20 bits)
    _p("Cluster.engines", "count", "engines", "engines of the cluster, each with its own queues and servers",
       Domain(1, 2 ** 20, lo_closed=True, hi_closed=True), default=4),
    _p("Cluster.router", "choice", "", "the router: Autellix's Algorithm 2 (small requests least-used, large "
       "ones to their program's engine), least-used (fewest active requests), round-robin, or cache-aware (the "
       "engine whose prefix cache holds the most of the request's prompt, unless the loads are out of balance; "
       "ContinuousBatching engines with prefix_caching)", default="autellix", choices=tuple(_ROUTERS)),
    _p("Cluster.threshold", "count", "tokens", "prefill tokens of the largest small request (Autellix: 2048 "
       "small, 2049 large)", _COUNT0, default=2048),
    # (SGLang's cache-aware router and its defaults)
    _p("Cluster.cache_threshold", "real", "1", "the cache-aware router's threshold: a request goes to the engine "
       "whose cache holds the most of its prompt where that is more than this share of it",
       Domain(0, 1, lo_closed=True, hi_closed=True), default=0.3),
    _p("Cluster.balance_abs", "count", "requests", "the cache-aware router routes least-used while the most "
       "active requests of an engine exceed the least by more than this (and by more than balance_rel times)",
       _COUNT0, default=64),
    _p("Cluster.balance_rel", "real", "1", "the cache-aware router routes least-used while the most active "
       "requests of an engine are more than this times the least (and more than balance_abs above)",
       Domain(1, INF, lo_closed=True), default=1.5),
    _p("Cluster.kv_reuse", "flag", "", "a call on the engine holding its program's context prefills only its "
       "new tokens (else every call prefills its whole context)", default=True),
    # (choices: the kinds that declare engine, set by mbbatch.registry)
    _p("engine_policy", "choice", "", "a sweep's cluster engines' batching: dynamic (the cluster's d_sla, b_max, "
       "eta, ...), or another engine kind, static, multi-bin dynamic or the paper's multi-bin batching "
       "(engine_batch_size, engine_bins)", default="dynamic"),
    _p("prefix_caching", "flag", "", "the engine keeps KV blocks by content: a request's prompt blocks cached by "
       "an earlier one of its shared prefix are not prefilled again; unreferenced cached blocks are evicted least "
       "recently used before any preemption (vLLM's automatic prefix caching; continuous batching)", default=False),
    _p("SystemPrompts.count", "count", "prompts", "the distinct system prompts requests share", _COUNT, default=1),
    _p("system_prompts", "count", "prompts", "a sweep's distinct system prompts, which a share of its requests "
       "carry ahead of their own tokens (0: none; continuous batching)", Domain(0, 1 << 20, lo_closed=True,
                                                                                hi_closed=True), default=0),
    _p("system_prompt_length", "real", "tokens", "a sweep's system prompts' length (each the same)", _NONNEG,
       default=1024.0),
    _p("SystemPrompts.share", "real", "1", "share of the requests that carry a system prompt (each drawn "
       "uniformly among count)", Domain(0, 1, lo_closed=True, hi_closed=True), default=1.0),
    _p("SystemPrompts.length", "real", "tokens", "the system prompts' lengths: a distribution each is drawn from "
       "once per run, or a number of tokens", _NONNEG, default=REQUIRED),
    _p("Programs.calls", "count", "calls", "calls of a program (a multi-call session)", _COUNT, default=4),
    _p("Programs.think_time", "real", "s", "mean think time between two calls of a program (exponential)",
       _NONNEG, default=1.0),
    _p("Programs.closed", "flag", "", "a call arrives think_time after the one before it completes (closed "
       "loop), else think_time after it arrived (open loop)", default=False),
    _p("programs", "choice", "", "a sweep's cluster or disaggregated deployment's programs: synthetic multi-call "
       "programs (calls, think_time), the trace's sessions (a BurstGPT [workload] trace with its Session ID column, "
       "replayed in order) or none (each request a one-call program of its own); a disaggregated deployment's "
       "default is none", default="synthetic", choices=("synthetic", "sessions", "none")),
    _p("Sessions.ids", "count", "", "each request's session in a trace (-1: a one-call program of its own)",
       Domain(-1, INF, lo_closed=True)),
    _p("Sessions.context", "choice", "", "what a trace's prompt lengths hold: the whole prompt, the session's "
       "context included (a stateless API's calls), or the call's new tokens only (the context is added)",
       default="included", choices=("included", "added")),
    _p("EngineEvent.time", "real", "s", "when an engine leaves or joins the cluster", _NONNEG),
    _p("EngineEvent.engine", "count", "", "the engine's id, 0 .. engines - 1", _COUNT0),
    _p("EngineEvent.action", "choice", "", "what happens to the engine", choices=("remove", "add")),
    # --- memory (Algorithm 1) -----------------------------------------------------------
    # defaults: an 80 GB GPU, 8 GB of weights, 0.4 MB of KV cache per token
    # (about Phi-3.5-mini in fp16): eta = 180,000 tokens
    _p("m_max_gb", "real", "GB", "GPU memory", _POS, default=80.0),
    _p("m_model_gb", "real", "GB", "memory of the model weights", _NONNEG, default=8.0),
    _p("kv_mem_per_token_gb", "real", "GB/token", "KV-cache memory per token", _POS, default=4e-4),
    _p("Memory.variant", "choice", "", "b_mem rule: Algorithm 1's L0 = 0.1 eta, or a CLT buffer",
       default="l0", choices=("l0", "clt")),
    # eps_M ~ 0.05, a 5% OOM probability: Pang, Li and Wang, 2025, arXiv:2503.05248, Algorithm 1
    _p("eps_m", "real", "1", "risk eps_M of the CLT memory buffer", Domain(0, 1), default=0.05),
    _p("enabled", "flag", "", "whether the memory constraint is enforced", default=True),
    # Memory()'s: (80 - 8) GB / 0.4 MB a token
    _p("eta", "real", "tokens", "KV-cache token capacity eta", _POS, default=180_000.0),
    _p("memory", "choice", "", "b_mem rule: L0 = 0.1 eta, a CLT buffer, or no memory constraint",
       default="l0", choices=("l0", "clt", "off")),
    # --- the SLA controller (Algorithms 2 and 7) ----------------------------------------
    # the dynamic-batching paper (Pang et al., 2025, arXiv:2503.05248) gives no values.  D_SLA =
    # 7.4 ms (the guide's and the committed specs' value) sits below the calibrated decode time's
    # limit beta (1 + gamma) = 7.55 ms, so the SLA binds: it allows b <= 11 under the default
    # DecodeModel (beta = 5.74 ms, gamma = 0.316).  eps_D = 50 us is 0.7% of D_SLA.
    _p("d_sla", "real", "s/token", "SLA target D_SLA on the decode time per token", _POS, default=7.4e-3),
    _p("eps_d", "real", "s/token", "tolerance band eps_D around D_SLA", _NONNEG, default=5e-5),
    _p("b_min", "count", "requests", "smallest batch size B_min", _COUNT, default=1),
    # 256: vLLM's long-standing default max_num_seqs, a serving engine's usual cap on a batch
    _p("b_max", "count", "requests", "largest batch size B_max", _COUNT, default=256),
    # the paper's steps (Pang et al., Algorithm 2): alpha = 4, delta = 2
    _p("SLAController.alpha", "count", "requests", "expansion step alpha of the SLA controller", _COUNT0,
       default=4),
    _p("delta", "count", "requests", "correction step delta of the SLA controller", _COUNT0, default=2),
    _p("controller", "choice", "",
       "SLA controller: Algorithm 2 as Pang et al. write it, or a multiplicative variant",
       default="spec", choices=("spec", "multiplicative")),
    # --- a capacity search's objective (mb.Objective): upper bounds but goodput's, none by default ----
    _p("objective_goodput", "real", "1", "capacity search: lower bound on goodput, the share of requests within "
       "their ttft_slo and tpot_slo", Domain(0, 1, lo_closed=True, hi_closed=True), default=None),
    *[_p(f"objective_{m}", "real", u, f"capacity search: upper bound on {m}", d, default=None)
      for m, u, d in (("latency_p50", "s", _POS), ("latency_p95", "s", _POS), ("latency_p99", "s", _POS),
                      ("mean_latency", "s", _POS), ("mean_ttft", "s", _POS), ("ttft_p50", "s", _POS),
                      ("ttft_p95", "s", _POS), ("ttft_p99", "s", _POS), ("mean_tbt", "s/token", _POS),
                      ("tbt_p50", "s", _POS), ("tbt_p95", "s", _POS), ("tbt_p99", "s", _POS),
                      ("sla_violation_share", "1", Domain(0, 1, lo_closed=True, hi_closed=True)),
                      ("sla_violation_tokens", "1", Domain(0, 1, lo_closed=True, hi_closed=True)),
                      ("sla_violation_requests", "1", Domain(0, 1, lo_closed=True, hi_closed=True)))],
    # --- closed forms only --------------------------------------------------------------
    _p("eps", "real", "requests/s", "throughput gap to capacity allowed", _POS),
    # --- a decode-time SLA target for measured hardware (mbbatch.profiles.sla_target) ------
    _p("context", "real", "tokens", "typical context of a decoded sequence: its prompt plus the tokens generated",
       _NONNEG),
    # D_SLA 7.4 ms over the dynamic-batching paper's calibrated one-sequence decode step, 5.74 ms
    _p("headroom", "real", "1", "D_SLA over the engine's one-sequence decode step", _POS, default=7.4 / 5.74),
]}

#: The multi-bin paper's symbols, used as argument names in mbbatch.theory only.
SYMBOLS = {"B": "batch_size", "k": "bins", "lam": "rate"}


def default(key: str):
    """The default value of parameter ``key`` (for dataclass fields)."""
    d = PARAMS[key].default
    if d is REQUIRED:
        raise KeyError(f"{key} has no default")
    return d
