"""The metric table (mbbatch.metrics): complete, and the one source of the
sweep schema's simulated variables."""

import pytest

from mbbatch.metrics import KINDS, METRICS, TAGS, applicable, by_var, label
from mbbatch.sweeps import parse_spec
from mbbatch.sweeps.schema import aggregates, rep_vars, variables

from .helpers import SMALL, TOKEN


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_metric_is_declared_whole(name):
    m = METRICS[name]
    assert m.name == name and m.description and m.tag in TAGS and m.kinds and m.kinds <= set(KINDS)
    assert m.dtype in ("f8", "i8", "bool")
    # every real metric kept per replication has its mean and interval over them; nothing else has
    assert m.aggregated == (m.per_rep and m.dtype == "f8")
    assert m.aggregates == ((f"{m.var}_mean", f"{m.var}_ci_low", f"{m.var}_ci_high") if m.aggregated else ())
    # (a run's own batch-means interval of the mean latency is named as a sweep's over replications)
    assert all(by_var(v) is m or (v == by_var(v).var and not by_var(v).per_rep) for v in m.aggregates)
    assert not any(v.endswith("_mean_mean") for v in (m.var, *m.aggregates))   # one naming scheme
    assert by_var(m.var) is m
    assert label(m.var).startswith(name.replace("_", " "))


def test_variable_names_are_unique():
    vars_ = [m.var for m in METRICS.values()]
    assert len(vars_) == len(set(vars_))


def _spec(kind):
    if kind == "multibin":
        return parse_spec(SMALL)
    if kind == "laps":
        return parse_spec(TOKEN.replace('service_model = "decode"', 'service_model = "prefill"')
                          .replace("d_sla = 0.0074\n", "").replace("eta = 20000.0\n", "")
                          .format(policy=kind, arrivals="poisson", extra="instances = 2", grid="rate = [1.0]"))
    if kind in ("continuous", "disaggregated"):
        return parse_spec(TOKEN.replace('service_model = "decode"', 'service_model = "iteration"')
                          .replace("d_sla = 0.0074\n", "").replace("eta = 20000.0\n", "")
                          .format(policy=kind, arrivals="poisson", extra="max_num_seqs = 16", grid="rate = [1.0]"))
    extra = {"static": "batch_size = 8", "dynamic": "b_max = 64", "multibin_dynamic": "b_max = 64\nbins = 2",
             "cluster": "b_max = 64\nengines = 2", "spf": "batch_size = 8"}[kind]
    return parse_spec(TOKEN.format(policy=kind, arrivals="poisson", extra=extra, grid="rate = [1.0]"))


@pytest.mark.parametrize("kind", KINDS)
def test_the_schema_stores_the_tables_metrics_of_a_policy(kind):
    """A sweep of one policy stores exactly the metrics the table applies to
    it and marks per replication, each real one with its mean and t-interval."""
    spec = _spec(kind)
    want = {m.var for m in applicable(kind).values() if m.per_rep}
    assert set(rep_vars(spec)) == want
    assert set(aggregates(spec)) == {v for v in want if v.startswith("sim_")}
    for var, (mean, lo, hi) in aggregates(spec).items():
        assert by_var(var).aggregated and {mean, lo, hi} <= set(variables(spec))
    for var, (_, dtype, units, desc) in variables(spec).items():
        m = by_var(var)
        if m is not None:
            assert units == m.units and (dtype == m.dtype or var != m.var)


MIXED = """
name = "mixed"
arrivals = "poisson"
reps = 2
seed = 1
[params]
prompt_median = 128.0
prompt_sigma = 0.5
output_median = 64.0
output_sigma = 0.8
d_sla = 0.0074
eta = 20000.0
n = 500
rate = 1.0
[policies.s]
kind = "static"
batch_size = 8
[policies.d]
kind = "dynamic"
b_max = 64
[grid]
policy = ["s", "d"]
"""


def test_a_mixed_spec_stores_the_union():
    spec = parse_spec(MIXED)
    assert set(rep_vars(spec)) == {m.var for m in METRICS.values() if m.per_rep and m.kinds & {"static", "dynamic"}}


def test_every_token_level_policy_reports_the_time_to_first_token_and_between_tokens():
    """Regression: the quantiles of the time between tokens were tagged
    continuous batching's, so StaticBatching, ShortestPredictedFirst,
    DynamicBatching, MultiBinDynamic and a cluster of them had none (NaN, or
    absent) though their batches decode one token per step; their tag is
    every token-level policy's now, as the time to first token's."""
    from mbbatch.metrics import kinds_of

    token = {"static", "spf", "dynamic", "multibin_dynamic", "cluster", "continuous", "laps", "disaggregated"}
    assert kinds_of("tbt_quantiles") == token == kinds_of("ttft_quantiles")
    for q in ("p50", "p95", "p99"):
        assert METRICS[f"tbt_{q}"].tag == "tbt_quantiles" and METRICS[f"tbt_{q}"].var == f"sim_tbt_{q}"
        assert METRICS[f"ttft_{q}"].kinds == token
    assert {"mean_tbt", "mean_ttft"} <= set(applicable("static"))


CAPACITY = """
name = "cap"
policy = "static"
arrivals = "poisson"
service_model = "decode"
seed = 3
[params]
prompt_median = 128.0
prompt_sigma = 0.5
output_median = 64.0
output_sigma = 0.8
d_sla = 0.0074
n = 1500
batch_size = 8
objective_ttft_p95 = 2.0
[grid]
objective_tbt_p99 = [0.007, 0.0075]
[capacity]
"""


def test_every_objective_metric_is_an_objective_field_and_a_spec_parameter():
    """Objective(tbt_p99=..., tbt_p95=..., ttft_p95=...): each metric an
    objective may bound is a field of Objective and a capacity spec's
    parameter objective_<metric> in the metric's units, for the policies
    that report it; a spec's bounds become its cells' Objective."""
    from dataclasses import fields

    from mbbatch.capacity import OBJECTIVE_METRICS, Objective
    from mbbatch.sweeps.cells import _objective, check_points
    from mbbatch.sweeps.spec import SPEC_PARAMS

    assert [f.name for f in fields(Objective)] == list(OBJECTIVE_METRICS)
    assert {"ttft_p50", "ttft_p95", "ttft_p99", "mean_tbt", "tbt_p50", "tbt_p95", "tbt_p99"} <= set(OBJECTIVE_METRICS)
    for m in OBJECTIVE_METRICS:
        sp = SPEC_PARAMS[f"objective_{m}"]
        assert sp.capacity_only and sp.kinds == METRICS[m].kinds and sp.table.units == METRICS[m].units, m
    spec = parse_spec(CAPACITY)
    cells = [params for _, params in spec.points()]
    assert [_objective(c) for c in cells] == [Objective(ttft_p95=2.0, tbt_p99=0.007),
                                              Objective(ttft_p95=2.0, tbt_p99=0.0075)]
    check_points(spec)
