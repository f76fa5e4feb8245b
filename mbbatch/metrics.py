"""The metric table: every metric a simulation reports, declared once.

One row per metric: its name (the attribute of
:class:`~mbbatch.SimulationResult`), units, description, the policy kinds it
applies to, and how a sweep stores it (the Dataset variable, per replication
or not, and its per-point aggregate).  The table drives the result's
attributes, ``SimulationResult.to_dataset()``, the sweep schema and the
figures' axis labels.  A metric that does not apply to a policy is absent from
that policy's results (an ``AttributeError`` saying so), not NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Metric", "METRICS", "KINDS", "ALL", "SINGLE", "TOKEN", "CONTROLLED", "CLUSTER", "ROUTED", "EVERY",
           "applicable",
           "by_var", "label"]

#: The policy kinds, as named in specs, results and stores.
KINDS = ("multibin", "static", "dynamic", "multibin_dynamic", "laps", "cluster")
ALL = frozenset(KINDS)
#: The single-engine policies.
SINGLE = frozenset(("multibin", "static", "dynamic", "multibin_dynamic"))
#: The token-level policies (the event kernel).
TOKEN = frozenset(("static", "dynamic", "multibin_dynamic"))
#: The policies with an SLA controller.
CONTROLLED = frozenset(("dynamic", "multibin_dynamic"))
#: LAPS's prefill instances.
CLUSTER = frozenset(("laps",))
#: A cluster of engines behind a router, each running a token-level policy.
ROUTED = frozenset(("cluster",))
#: Every policy (``ALL``).
EVERY = ALL


@dataclass(frozen=True)
class Metric:
    """One metric.

    ``var`` is its Dataset variable (default ``sim_<name>`` for real values,
    ``<name>`` for counts and flags); ``per_rep`` whether sweeps store it per
    replication; ``aggregate`` the per-point summary sweeps add: ``"ci"``
    (mean and 95% t-interval over replications: ``<var>_mean``,
    ``<var>_ci_low``, ``<var>_ci_high``), ``"mean"`` (``<var>_mean``) or none.
    """

    name: str
    units: str
    description: str
    kinds: frozenset = ALL
    dtype: str = "f8"
    per_rep: bool = True
    aggregate: str = ""
    var_name: str = ""

    @property
    def var(self) -> str:
        if self.var_name:
            return self.var_name
        return f"sim_{self.name}" if self.dtype == "f8" else self.name

    @property
    def label(self) -> str:
        """An axis label: the name in words and the units."""
        words = self.name.replace("_", " ")
        return f"{words} ({self.units})" if self.units not in ("", "1") else words


def _m(*args, **kw) -> Metric:
    return Metric(*args, **kw)


#: The one table of metrics, by name.
METRICS: dict[str, Metric] = {m.name: m for m in [
    _m("throughput", "requests/s", "completed requests / (last completion - first arrival)", EVERY,
       aggregate="ci"),
    _m("token_throughput", "tokens/s", "generated (output) tokens / (last completion - first arrival)",
       TOKEN | ROUTED),
    _m("mean_latency", "s", "mean over completed requests of batch completion - request arrival (LAPS: of "
       "its prefill, the time to first token; with a decode stage, of its last token)", EVERY, aggregate="ci"),
    _m("mean_latency_ci_low", "s", "lower end of the run's 95% batch-means confidence interval of "
       "mean_latency", SINGLE | ROUTED, per_rep=False),
    _m("mean_latency_ci_high", "s", "upper end of the run's 95% batch-means confidence interval of "
       "mean_latency", SINGLE | ROUTED, per_rep=False),
    _m("latency_p50", "s", "median latency of completed requests", EVERY),
    _m("latency_p95", "s", "95th percentile latency of completed requests", EVERY, aggregate="mean"),
    _m("latency_p99", "s", "99th percentile latency of completed requests", EVERY),
    _m("mean_ttft", "s", "mean time to first token: batch start + prefill + one decode step - arrival (LAPS: "
       "its prefill batch's end - arrival)", TOKEN | ROUTED | CLUSTER),
    *[_m(f"ttft_{c}_{q}", "s", f"{'median' if q == 'p50' else q[1:] + 'th percentile'} time to first token of "
         f"the {c} requests (LAPS: prompt {'at most' if c == 'short' else 'above'} the threshold)", CLUSTER)
      for c in ("short", "long") for q in ("p50", "p95", "p99")],
    _m("mean_ttft_short", "s", "mean time to first token of the short requests", CLUSTER),
    _m("mean_ttft_long", "s", "mean time to first token of the long requests", CLUSTER),
    _m("short_share", "1", "share of the requests that are short", CLUSTER),
    _m("group_moves", "moves", "instances the LAPS router moved between its groups", CLUSTER, dtype="i8"),
    _m("mean_short_instances", "instances", "time-average instances in LAPS's short group (all of them without "
       "dynamic allocation)", CLUSTER),
    _m("mean_tbt", "s/token", "mean decode time per output token (token-weighted)", TOKEN | ROUTED),
    _m("sla_violation_tokens", "1", "share of output tokens decoded slower than D_SLA + eps_D per token",
       TOKEN | ROUTED, aggregate="mean"),
    _m("sla_violation_requests", "1", "share of requests decoded slower than D_SLA + eps_D per token", TOKEN | ROUTED),
    _m("sla_violation_share", "1", "share of requests whose decode time per token exceeds D_SLA (seed 001, "
       "section 8.1's SLA violation rate; threshold D_SLA, without eps_D)", TOKEN | ROUTED),
    _m("utilization", "1", "busy server-time / (servers x span); NaN for infinitely many servers (LAPS: "
       "instances for servers)", EVERY),
    _m("mean_busy_servers", "servers", "busy server-time / span: mean number of servers busy", EVERY,
       per_rep=False),
    _m("mean_batch_service", "s", "mean batch service time", EVERY, aggregate="mean"),
    _m("std_batch_service", "s", "sample standard deviation of the batch service time", frozenset({"multibin"}),
       per_rep=False),
    _m("mean_fill_wait", "s", "mean time from a request's arrival until its batch is full",
       frozenset({"multibin"})),
    _m("mean_queue_wait", "s", "mean time a request's full batch waits in the central FIFO",
       frozenset({"multibin"})),
    _m("memory_peak", "1", "largest batch's prompt + output tokens / token capacity eta", TOKEN | ROUTED),
    _m("memory_mean", "1", "time-average tokens in service / (servers x eta)", TOKEN | ROUTED),
    _m("batch_size_mean", "requests", "mean batch size", EVERY, aggregate="mean"),
    _m("batch_size_std", "requests", "standard deviation of the batch size", TOKEN | ROUTED),
    _m("span", "s", "last completion - first arrival", EVERY, per_rep=False),
    _m("completed", "requests", "requests served", EVERY, dtype="i8"),
    _m("excluded_partial", "requests", "requests left in partial batches when arrivals ended; excluded",
       frozenset({"multibin"}), dtype="i8"),
    _m("n_batches", "batches", "batches served", EVERY, dtype="i8"),
    _m("mem_exceed_batches", "batches", "batches above the token capacity (0 when the memory constraint "
       "is on)", TOKEN | ROUTED, dtype="i8"),
    _m("rejected", "requests", "requests alone above the token capacity, never servable, dropped", TOKEN | ROUTED,
       dtype="i8"),
    _m("warmup_time", "s", "time Algorithm 6's edges were set", frozenset({"multibin_dynamic"}), per_rep=False),
    _m("sla_infeasible", "1", "the controller ended above D_SLA + eps_D with b_low shrunk to B_min",
       CONTROLLED, dtype="bool"),
    _m("convergence_time", "s", "time from the first arrival until b_target stays within 10% of its median "
       "over the last 20% of the run (sampled time series); NaN if it settles only in that last part",
       CONTROLLED),
    *[_m(f"ttft_{q}", "s", f"{'median' if q == 'p50' else q[1:] + 'th percentile'} time to first token", ROUTED)
      for q in ("p50", "p95", "p99")],
    _m("large_share", "1", "share of the requests above the router's threshold (Autellix: large)", ROUTED),
    _m("locality_hit_rate", "1", "share of the calls with an earlier context (a program's later calls) served "
       "on the engine holding it", ROUTED),
    _m("kv_recomputed_tokens", "tokens/request", "context tokens prefilled again (a call away from the engine "
       "holding its context, or without KV reuse), per request", ROUTED),
    _m("load_imbalance", "1", "most active requests on an engine / mean active requests per engine, each "
       "averaged over the routing decisions (Poisson arrivals see time averages)", ROUTED),
    _m("rerouted", "requests", "queued requests routed again when their engine was removed", ROUTED, dtype="i8"),
    _m("unstable", "1", "the backlog grew through the run (last quarter of the arrivals vs the second): "
       "no steady state", dtype="bool", var_name="backlog_growing"),
]}


def applicable(kind: str) -> dict[str, Metric]:
    """The metrics of a policy kind, in table order."""
    return {name: m for name, m in METRICS.items() if kind in m.kinds}


def by_var(var: str) -> Metric | None:
    """The metric stored as Dataset variable ``var`` (or one of its aggregates)."""
    for m in METRICS.values():
        if var == m.var:
            return m
    for m in METRICS.values():
        if m.aggregate and var in (f"{m.var}_mean", f"{m.var}_ci_low", f"{m.var}_ci_high"):
            return m
    return None


def label(var: str, default: str = "") -> str:
    """The axis label of Dataset variable ``var`` (a metric or its aggregate)."""
    m = by_var(var)
    return m.label if m is not None else default
