"""The metric table: every metric a simulation reports, declared once.

One row per metric: its name (the attribute of
:class:`~mbbatch.SimulationResult`), units, description, its tag (the kind
of run it describes) and how a sweep stores it (the Dataset variable, per
replication or not, and its per-point aggregate).  A policy declares the
tags it reports (``reports``, :mod:`mbbatch.policies.base`); the registry
(:mod:`mbbatch.registry`) turns them into the kinds each metric applies to.
The table drives the result's attributes, ``SimulationResult.to_dataset()``,
the sweep schema and the figures' axis labels.  A metric that does not apply
to a policy is absent from that policy's results (an ``AttributeError`` saying
so), not NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# (KINDS: the registry's, read lazily by the module's __getattr__)
__all__ = ["Metric", "METRICS", "PER_CLASS", "RENAMED", "TAGS", "KINDS", "applicable", "kinds_of", "by_var", "label"]  # noqa: F822

#: The tags of the metric table: what kind of run a metric describes.
TAGS = {
    "run": "every run: throughput, latency, servers, batches",
    "batch_means": "the run's own batch-means confidence interval of the mean latency",
    "tokens": "batches of token-level requests: tokens, decode time per token, SLA shares, memory",
    "decode": "generated tokens: their throughput and the time between them",
    "ttft": "the time to first token",
    "ttft_quantiles": "quantiles of the time to first token",
    "tbt_quantiles": "quantiles of the time between tokens",
    "multibin": "the multi-bin paper's model: bins filling, a central FIFO of full batches",
    "controller": "SLA controllers (Algorithms 2 and 7)",
    "warmup": "Algorithm 6's warm-up",
    "router": "a cluster's router: its routing and programs",
    "laps": "LAPS's prefill instances: short and long requests, its groups",
    "continuous": "a continuous-batching engine: preemptions, running sequences, KV memory",
    "goodput": "the requests within their objectives on the first token and per output token",
    "prefix": "a continuous-batching engine's prefix cache: hits, prefill saved, evictions",
    "disaggregated": "prefill and decode on pools of their own: the KV transfers, each pool's utilization",
}


def __getattr__(name):
    # the policy kinds, from the registry (read lazily: the registry imports the policies)
    if name == "KINDS":
        from .registry import KINDS

        return KINDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Metric:
    """One metric.

    ``tag`` is the kind of run it describes (:data:`TAGS`); ``var`` is its
    Dataset variable (default ``sim_<name>`` for real values, ``<name>`` for
    counts and flags); ``per_rep`` whether sweeps store it per replication.
    A sweep stores every real metric it keeps per replication (``sim_X``)
    with its mean and t-interval over the replications at the spec's
    confidence: ``sim_X_mean``, ``sim_X_ci_low``, ``sim_X_ci_high``
    (:attr:`aggregated`).  ``better`` is its direction, ``"higher"`` or
    ``"lower"`` is better (``""``: neither, a description of the run), which
    :func:`mbbatch.compare` reads to call a difference better or worse.
    """

    name: str
    units: str
    description: str
    tag: str = "run"
    dtype: str = "f8"
    per_rep: bool = True
    var_name: str = ""
    better: str = ""

    @property
    def var(self) -> str:
        if self.var_name:
            return self.var_name
        return f"sim_{self.name}" if self.dtype == "f8" else self.name

    @property
    def aggregated(self) -> bool:
        """Sweeps store its mean and t-interval over replications (every real per-replication metric)."""
        return self.per_rep and self.dtype == "f8"

    @property
    def aggregates(self) -> tuple:
        """The Dataset variables of its mean and interval over replications, or ()."""
        return (f"{self.var}_mean", f"{self.var}_ci_low", f"{self.var}_ci_high") if self.aggregated else ()

    @property
    def kinds(self) -> frozenset:
        """The policy kinds whose runs report it (those that declare its tag)."""
        return kinds_of(self.tag)

    @property
    def label(self) -> str:
        """An axis label: the name in words and the units."""
        words = self.name.replace("_", " ")
        return f"{words} ({self.units})" if self.units not in ("", "1") else words


def _m(*args, **kw) -> Metric:
    return Metric(*args, **kw)


#: The one table of metrics, by name.
METRICS: dict[str, Metric] = {m.name: m for m in [
    _m("throughput", "requests/s", "completed requests / (last completion - first arrival)"),
    _m("token_throughput", "tokens/s", "generated (output) tokens / (last completion - first arrival)",
       "decode"),
    _m("mean_latency", "s", "mean over completed requests of batch completion - request arrival (LAPS: of "
       "its prefill, the time to first token; with a decode stage, of its last token)"),
    _m("mean_latency_ci_low", "s", "lower end of the run's 95% batch-means confidence interval of "
       "mean_latency", "batch_means", per_rep=False),
    _m("mean_latency_ci_high", "s", "upper end of the run's 95% batch-means confidence interval of "
       "mean_latency", "batch_means", per_rep=False),
    _m("latency_p50", "s", "median latency of completed requests"),
    _m("latency_p95", "s", "95th percentile latency of completed requests"),
    _m("latency_p99", "s", "99th percentile latency of completed requests"),
    _m("mean_ttft", "s", "mean time to first token: batch start + prefill + one decode step - arrival (LAPS: "
       "its prefill batch's end - arrival)", "ttft"),
    *[_m(f"ttft_{c}_{q}", "s", f"{'median' if q == 'p50' else q[1:] + 'th percentile'} time to first token of "
         f"the {c} requests (LAPS: prompt {'at most' if c == 'short' else 'above'} the threshold)", "laps")
      for c in ("short", "long") for q in ("p50", "p95", "p99")],
    _m("mean_ttft_short", "s", "mean time to first token of the short requests", "laps"),
    _m("mean_ttft_long", "s", "mean time to first token of the long requests", "laps"),
    _m("short_share", "1", "share of the requests that are short", "laps"),
    _m("group_moves", "moves", "instances the LAPS router moved between its groups", "laps", dtype="i8"),
    _m("mean_short_instances", "instances", "time-average instances in LAPS's short group (all of them without "
       "dynamic allocation)", "laps"),
    _m("mean_tbt", "s/token", "mean decode time per output token (token-weighted; continuous batching: "
       "the mean gap between two tokens of a request)", "decode"),
    _m("sla_violation_tokens", "1", "share of output tokens decoded slower than D_SLA + eps_D per token",
       "tokens"),
    _m("sla_violation_requests", "1", "share of requests decoded slower than D_SLA + eps_D per token", "tokens"),
    _m("sla_violation_share", "1", "share of requests whose decode time per token exceeds D_SLA (Pang et al., "
       "2025, arXiv:2503.05248: the SLA violation rate; threshold D_SLA, without eps_D)", "tokens"),
    _m("utilization", "1", "busy server-time / (servers x span); NaN for infinitely many servers (LAPS: "
       "instances for servers)"),
    _m("mean_busy_servers", "servers", "busy server-time / span: mean number of servers busy",
       per_rep=False),
    _m("mean_batch_service", "s", "mean batch service time"),
    _m("std_batch_service", "s", "sample standard deviation of the batch service time", "multibin",
       per_rep=False),
    _m("mean_fill_wait", "s", "mean time from a request's arrival until its batch is full",
       "multibin"),
    _m("mean_queue_wait", "s", "mean time a request's full batch waits in the central FIFO",
       "multibin"),
    _m("memory_peak", "1", "largest batch's prompt + output tokens / token capacity eta", "tokens"),
    _m("mean_memory", "1", "time-average tokens in service / (servers x eta)", "tokens"),
    _m("mean_batch_size", "requests", "mean batch size"),
    _m("std_batch_size", "requests", "standard deviation of the batch size", "tokens"),
    _m("span", "s", "last completion - first arrival", per_rep=False),
    _m("completed", "requests", "requests served", dtype="i8"),
    _m("excluded_partial", "requests", "requests left in partial batches when arrivals ended; excluded",
       "multibin", dtype="i8"),
    _m("n_batches", "batches", "batches served", dtype="i8"),
    _m("mem_exceed_batches", "batches", "batches above the token capacity (0 when the memory constraint "
       "is on)", "tokens", dtype="i8"),
    _m("rejected", "requests", "requests alone above the token capacity, never servable, dropped", "tokens",
       dtype="i8"),
    _m("warmup_time", "s", "time Algorithm 6's edges were set", "warmup", per_rep=False),
    _m("sla_infeasible", "1", "the controller ended above D_SLA + eps_D with b_low shrunk to B_min",
       "controller", dtype="bool"),
    _m("convergence_time", "s", "time from the first arrival until b_target stays within 10% of its median "
       "over the last 20% of the run (sampled time series); NaN if it settles only in that last part",
       "controller"),
    *[_m(f"ttft_{q}", "s", f"{'median' if q == 'p50' else q[1:] + 'th percentile'} time to first token",
         "ttft_quantiles")
      for q in ("p50", "p95", "p99")],
    _m("large_share", "1", "share of the requests above the router's threshold (Autellix: large)", "router"),
    _m("locality_hit_rate", "1", "share of the calls with an earlier context (a program's later calls) served "
       "on the engine holding it", "router"),
    _m("kv_recomputed_tokens", "tokens/request", "context tokens prefilled again (a call away from the engine "
       "holding its context, or without KV reuse), per request", "router"),
    _m("load_imbalance", "1", "most active requests on an engine / mean active requests per engine, each "
       "averaged over the routing decisions (Poisson arrivals see time averages)", "router"),
    _m("rerouted", "requests", "queued requests routed again when their engine was removed", "router", dtype="i8"),
    *[_m(f"tbt_{q}", "s", f"{'median' if q == 'p50' else q[1:] + 'th percentile'} time between tokens: of "
         "every gap between two tokens of a request (run-to-completion batches: the batch's decode time per "
         "token, once for each of a member's output - 1 gaps, fractional for lengths not in whole tokens)",
         "tbt_quantiles") for q in ("p50", "p95", "p99")],
    _m("preemptions", "preemptions", "running sequences preempted (recompute) when the KV blocks ran out",
       "continuous", dtype="i8"),
    _m("recomputed_tokens", "tokens/request", "prompt and generated tokens prefilled again on resuming after a "
       "preemption, per request", "continuous"),
    _m("mean_running", "sequences", "mean running sequences per unit of busy time", "continuous"),
    _m("mean_in_system", "requests", "time-average requests in the engine, waiting or running, from the first "
       "arrival to the last completion (Little's law: throughput x mean_latency)", "continuous"),
    _m("mean_kv_usage", "1", "mean share of the KV blocks in use per unit of busy time (NaN: unlimited memory)",
       "continuous"),
    _m("goodput", "1", "share of the completed requests that met both their objectives, on the time to first "
       "token (ttft_slo) and per output token (tpot_slo; Zhong et al., 2024, DistServe, arXiv:2401.09670; "
       "run-to-completion batches: the batch's decode time per token); NaN where the workload sets neither",
       "goodput"),
    _m("prefix_hit_rate", "1", "prompt tokens found in the prefix cache / prompt tokens looked up, at every "
       "admission (vLLM's prefix cache hit rate; NaN: prefix caching off)", "prefix", better="higher"),
    _m("prefix_saved_tokens", "tokens/request", "prompt tokens not prefilled because the prefix cache held "
       "them, per completed request (0: prefix caching off)", "prefix", better="higher"),
    _m("kv_evictions", "blocks", "cached KV blocks no running sequence held, evicted least recently used to make "
       "room (0: prefix caching off)", "prefix", dtype="i8"),
    _m("mean_transfer_time", "s", "mean time a request's KV cache takes from its prefill engine to its decode "
       "engine once that admits it: latency + prompt x bytes per token / bandwidth (the requests of more than one "
       "output token)", "disaggregated"),
    _m("mean_decode_wait", "s", "mean time a request waits for its decode engine's admission after its first "
       "token, before its KV transfer starts (memory full, or max_num_seqs running)", "disaggregated"),
    _m("prefill_utilization", "1", "the prefill pool's busy engine-time / (its engines x its span)",
       "disaggregated"),
    _m("decode_utilization", "1", "the decode pool's busy engine-time / (its engines x its span)",
       "disaggregated"),
    _m("mean_max_num_seqs", "sequences", "mean cap on the running sequences per unit of busy time: the "
       "controller's (Algorithms 1, 2 and 7), else max_num_seqs", "continuous"),
    _m("unstable", "1", "the backlog grew through the run (last quarter of the arrivals vs the second): "
       "no steady state", dtype="bool", var_name="backlog_growing"),
]}


#: Each metric's direction (:attr:`Metric.better`): higher is better for what is served, lower for every
#: wait, delay, violation and piece of work done again; the rest describe a run without a direction.
_BETTER = {
    "higher": ("throughput", "token_throughput", "locality_hit_rate", "goodput"),
    "lower": ("mean_latency", "latency_p50", "latency_p95", "latency_p99", "mean_ttft",
              *[f"ttft_{c}_{q}" for c in ("short", "long") for q in ("p50", "p95", "p99")], "mean_ttft_short",
              "mean_ttft_long", "mean_tbt", "sla_violation_tokens", "sla_violation_requests", "sla_violation_share",
              "mean_fill_wait", "mean_queue_wait", "ttft_p50", "ttft_p95", "ttft_p99", "kv_recomputed_tokens",
              "load_imbalance", "tbt_p50", "tbt_p95", "tbt_p99", "preemptions", "recomputed_tokens",
              "rejected", "mean_in_system", "mean_transfer_time", "mean_decode_wait"),
}
METRICS.update({name: replace(METRICS[name], better=way) for way, names in _BETTER.items() for name in names})


#: A mixture's metrics of each class (:attr:`SimulationResult.classes`), by name, each declared once: the
#: metric table's row (units, direction) where the class's is that metric of the class's requests alone.  Sweeps
#: store each per replication on the ``request_class`` axis (:data:`mbbatch.sweeps.schema.PER_CLASS`); a
#: comparison reads a ``class_<metric>``'s units and direction here (:func:`mbbatch.stats.metric_spec`).
PER_CLASS: dict[str, Metric] = {m.name: m for m in [
    _m("completed", "requests", "requests of the class served", dtype="i8"),
    replace(METRICS["mean_latency"], description="mean latency of the class's completed requests"),
    replace(METRICS["latency_p99"], description="99th percentile latency of the class's completed requests"),
    replace(METRICS["mean_ttft"], description="mean time to first token of the class's completed requests"),
    replace(METRICS["ttft_p99"],
            description="99th percentile time to first token of the class's completed requests"),
    _m("ttft_attainment", "1", "share of the class's completed requests whose first token came within its "
                               "ttft_slo", "goodput", better="higher"),
    replace(METRICS["goodput"], description="share of the class's completed requests within both its "
                                            "objectives, ttft_slo and tpot_slo (NaN where no class sets one)"),
]}


#: Metrics renamed so that a sweep's names read ``sim_X``, ``sim_X_mean`` (no ``_mean_mean``):
#: old name -> new.  ``SimulationResult`` still answers to the old names, with a DeprecationWarning.
RENAMED = {"batch_size_mean": "mean_batch_size", "batch_size_std": "std_batch_size", "memory_mean": "mean_memory",
           "kv_usage_mean": "mean_kv_usage", "max_num_seqs_mean": "mean_max_num_seqs"}


def kinds_of(tag: str) -> frozenset:
    """The policy kinds that report the metrics of ``tag``."""
    from .registry import with_tag

    return with_tag(tag)


def applicable(kind: str) -> dict[str, Metric]:
    """The metrics of a policy kind, in table order."""
    from .registry import POLICIES

    tags = POLICIES[kind].reports
    return {name: m for name, m in METRICS.items() if m.tag in tags}


def by_var(var: str) -> Metric | None:
    """The metric stored as Dataset variable ``var`` (or one of its aggregates)."""
    for m in METRICS.values():
        if var == m.var:
            return m
    for m in METRICS.values():
        if var in m.aggregates:
            return m
    return None


def label(var: str, default: str = "") -> str:
    """The axis label of Dataset variable ``var`` (a metric or its aggregate)."""
    m = by_var(var)
    return m.label if m is not None else default
