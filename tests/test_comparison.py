"""mbbatch.comparison (mb.compare) and mbbatch.stats.paired_differences: policies on the same
replications, each against a baseline with intervals."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import scipy.stats as st
import xarray as xr

import mbbatch as mb
from mbbatch import comparison as cmp
from mbbatch import stats

SVC = st.uniform(0.1, 1.9)
ONE, FOUR = mb.MultiBin(bins=1, batch_size=8), mb.MultiBin(bins=4, batch_size=8)


def test_every_run_is_simulate_on_the_replications_seed():
    """Replication r of every policy is simulate on SeedSequence(seed, spawn_key=(r,)): the same arrivals
    and lengths for every policy (common random numbers), value for value."""
    c = mb.compare({"one": ONE, "four": FOUR}, mb.Poisson(1.0), service=SVC, n=500, reps=3, seed=7)
    for name, pol in (("one", ONE), ("four", FOUR)):
        for r in range(3):
            res = mb.simulate(pol, mb.Poisson(1.0), service=SVC, n=500, seed=np.random.SeedSequence(7, spawn_key=(r,)))
            for m in c.metrics:
                want = getattr(res, m)
                got = float(c.dataset[f"sim_{m}"].sel(policy=name, rep=r))
                assert got == want or (math.isnan(got) and math.isnan(want)), (name, r, m)


def test_the_same_seed_gives_the_same_comparison_bit_for_bit():
    a = mb.compare([ONE, FOUR], mb.Poisson(1.0), service=SVC, n=400, reps=3, seed=3)
    b = mb.compare([ONE, FOUR], mb.Poisson(1.0), service=SVC, n=400, reps=3, seed=3)
    xr.testing.assert_identical(a.dataset, b.dataset)


def test_two_identical_policies_differ_by_exactly_zero():
    """Common random numbers: the same policy twice runs the same numbers, so every difference is 0 with the
    interval [0, 0], every ratio 1, and no verdict."""
    c = mb.compare([ONE, mb.MultiBin(bins=1, batch_size=8)], mb.Poisson(1.0), service=SVC, n=500, reps=4)
    other = c.policies[1]
    assert other.endswith("#2")
    for m in c.metrics:
        d = c.diff(other, m)
        assert d == (0.0, 0.0, 0.0) or all(math.isnan(x) for x in d), m
        assert c.verdict(other, m) == "undecided"
    assert c.ratio(other, "mean_latency") == (1.0, 1.0, 1.0)


def test_a_clear_difference_is_called_by_the_metrics_direction():
    """At light load four bins wait longer to fill their batches (the paper's Section 5): against one bin
    their mean latency is worse, their difference's interval above 0; from four bins' side one bin is
    better.  Their throughputs are the arrival rate's to within a percent (four bins' slightly lower, paired
    replications tell: more requests wait in partial batches at the end)."""
    kw = dict(arrivals=mb.Poisson(1.0), service=SVC, n=2_000, reps=5, seed=1)
    c = mb.compare({"one": ONE, "four": FOUR}, **kw)
    d, lo, hi = c.diff("four", "mean_latency")
    assert 0 < lo <= d <= hi and c.verdict("four", "mean_latency") == "worse"
    r, rlo, rhi = c.ratio("four", "mean_latency")
    assert 1 < rlo <= r <= rhi
    assert 0.99 < c.ratio("four", "throughput")[1] <= c.ratio("four", "throughput")[2] < 1.01
    back = mb.compare({"one": ONE, "four": FOUR}, baseline="four", **kw)
    assert back.verdict("one", "mean_latency") == "better"
    assert back.diff("one", "mean_latency")[0] == pytest.approx(-d, rel=1e-12)
    text = c.summary("mean_latency")
    assert "four" in text and "worse" in text and "lower is better" in text


def test_one_run_each_gives_the_mean_latencys_interval_from_batch_means():
    c = mb.compare({"one": ONE, "four": FOUR}, mb.Poisson(1.0), service=SVC, n=20_000, reps=1, seed=2)
    d, lo, hi = c.diff("four", "mean_latency")
    assert lo < d < hi and c.verdict("four", "mean_latency") == "worse"
    sim = c.dataset["sim_mean_latency"]
    assert d == float(sim.sel(policy="four", rep=0) - sim.sel(policy="one", rep=0))
    assert all(math.isnan(x) for x in c.diff("four", "throughput")[1:])
    assert "batch means" in c.dataset.attrs["method"]


@pytest.mark.parametrize("kw, match", [
    (dict(policies=[ONE]), r"policies must hold at least 2 policies to compare; got 1"),
    (dict(policies="ONE"), r"policies must be a dict of name -> policy, or a list of policies; got str"),
    (dict(policies={"a": ONE, "b": "static"}), r"policies\['b'\]: policy must be one of"),
    (dict(reps=0), r"reps must be an integer in \[1, 100000\]; got 0"),
    (dict(level=1.0), r"level must be in \(0, 1\); got 1.0"),
    (dict(baseline="two"), r"baseline must be one of the policies' names \('one', 'four'\); got 'two'"),
    (dict(metrics=["latency"]), r"metrics: unknown metric 'latency'"),
    (dict(metrics="mean_tbt"), r"metrics: 'mean_tbt' is not a real metric every policy here reports"),
    (dict(metrics=3), r"metrics must be a metric's name or a list of them; got 3"),
    (dict(n=0), r"policies\['one'\]: n must be an integer in \[1, 9007199254740992\]; got 0"),
    (dict(progress=1), r"progress must be a bool"),
])
def test_a_bad_argument_is_refused_naming_it_before_any_run(kw, match):
    args = dict(policies={"one": ONE, "four": FOUR}, arrivals=mb.Poisson(1.0), service=SVC, n=100, reps=2)
    with mock.patch.object(cmp, "simulate", side_effect=AssertionError("a run started")), \
            pytest.raises((TypeError, ValueError), match=match):
        mb.compare(**{**args, **kw})


def test_the_paired_interval_covers_the_true_difference_at_its_level():
    """Coverage, the interval's promise: 150 comparisons of one bin against two (10 paired replications
    of 2,000 requests each, fresh seeds) cover the expected difference of the mean latency (and the ratio
    of the expected means), estimated apart from 1,500 pairs of runs on other seeds, at the nominal 95 %:
    a two-sided binomial test of the covers' count at the 99.9 % level.  (The pilot's own error, 1/12 of
    an interval's half width, moves the coverage by well under a point.)"""
    two = mb.MultiBin(bins=2, batch_size=8)
    arrivals = mb.Poisson(1.2)

    def latency(pol, seed):
        return mb.simulate(pol, arrivals, service=SVC, n=2_000, seed=seed).mean_latency

    pilot = np.array([[latency(p, np.random.SeedSequence(10_000 + s)) for p in (ONE, two)] for s in range(1_500)])
    true_diff = float((pilot[:, 1] - pilot[:, 0]).mean())
    true_ratio = float(pilot[:, 1].mean() / pilot[:, 0].mean())
    M = 150
    covers = ratio_covers = 0
    for k in range(M):
        c = mb.compare({"one": ONE, "two": two}, arrivals, service=SVC, n=2_000, reps=10, seed=k,
                       metrics="mean_latency")
        _, lo, hi = c.diff("two", "mean_latency")
        covers += lo <= true_diff <= hi
        _, rlo, rhi = c.ratio("two", "mean_latency")
        ratio_covers += rlo <= true_ratio <= rhi
    for count in (covers, ratio_covers):
        assert st.binomtest(count, M, 0.95).pvalue > 0.001, (covers, ratio_covers, M)


SWEEP = """
name = "pairs"
arrivals = "poisson"
service = "uniform"
reps = 4
seed = 5

[params]
batch_size = 8
l_min = 0.1
l_max = 2.0
n = 1500

[policies.one]
kind = "multibin"
bins = 1
[policies.four]
kind = "multibin"
bins = 4

[grid]
policy = ["one", "four"]
rate = [1.0, 4.2]
"""


def test_a_sweeps_policies_are_compared_along_its_policy_axis(tmp_path):
    """paired_differences on a sweep store: its cells that differ only in their policy see the same requests,
    so each policy's difference to the baseline at every rate is the t-interval of the replications'
    differences (stats.t_interval, written apart), its ratio that of the means; the baseline's is 0 and 1."""
    from mbbatch.sweeps import run_sweep

    spec = tmp_path / "pairs.toml"
    spec.write_text(SWEEP)
    ds = run_sweep(spec, tmp_path / "pairs.zarr", workers=1, progress=False).load()
    d = stats.paired_differences(ds, "one", 0.9)
    assert d["diff_mean_latency"].dims == ("policy", "rate") and d.attrs == {"baseline": "one", "level": 0.9}
    for rate in (1.0, 4.2):
        x = ds["sim_mean_latency"].sel(rate=rate)
        want = stats.t_interval((x.sel(policy="four") - x.sel(policy="one")).values, 0.9)
        got = d.sel(policy="four", rate=rate)
        np.testing.assert_allclose([float(got["diff_mean_latency"]), float(got["diff_mean_latency_ci_low"]),
                                    float(got["diff_mean_latency_ci_high"])], want, rtol=1e-12)
        assert float(got["ratio_mean_latency"]) == pytest.approx(
            float(x.sel(policy="four").mean() / x.sel(policy="one").mean()), rel=1e-12)
        base = d.sel(policy="one", rate=rate)
        assert float(base["diff_mean_latency"]) == 0.0 and float(base["ratio_mean_latency_ci_high"]) == 1.0
    assert int(d["verdict_mean_latency"].sel(policy="four", rate=1.0)) == -1
    with pytest.raises(ValueError, match=r"baseline must be one of the policies \('one', 'four'\); got 'two'"):
        stats.paired_differences(ds, "two")


def test_the_compare_command_runs_a_spec_and_prints_each_rates_differences(tmp_path, capsys):
    """`mbbatch compare SPEC --out STORE` runs the sweep, then prints, per rate, each policy's mean, its
    difference and ratio to the baseline with their intervals, and the verdict: those of
    paired_differences on the store; a baseline the sweep does not hold is refused, naming the flag."""
    from mbbatch.cli import main
    from mbbatch.sweeps import open_store

    spec = tmp_path / "pairs.toml"
    spec.write_text(SWEEP)
    store = tmp_path / "pairs.zarr"
    assert main(["compare", str(spec), "--out", str(store), "--metric", "mean_latency", "--level", "0.9"]) in (0, None)
    out = capsys.readouterr().out
    d = stats.paired_differences(open_store(store).load(), "one", 0.9, ["mean_latency"]).sel(policy="four")
    for rate in (1.0, 4.2):
        row = d.sel(rate=rate)
        assert (f"diff {float(row['diff_mean_latency']):+.4g} [{float(row['diff_mean_latency_ci_low']):+.4g}, "
                f"{float(row['diff_mean_latency_ci_high']):+.4g}]") in out
        assert f"rate={rate}" in out
    assert "against 'one', 4 paired replications, intervals at 90 %" in out and "worse" in out
    assert main(["compare", str(store), "--baseline", "two"]) == 2
    assert "--baseline must be one of the sweep's policies (one, four); got 'two'" in capsys.readouterr().err
    # (a spec's flags are checked before its sweep runs: no store is made)
    for flags, message in ((["--baseline", "two"], "--baseline must be one of the sweep's policies"),
                           (["--level", "1.5"], "--level must be in (0, 1); got 1.5"),
                           (["--metric", "latency"], "--metric: unknown metric 'latency'")):
        assert main(["compare", str(spec), "--out", str(tmp_path / "new.zarr"), *flags]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "new.zarr").exists()


def test_a_spec_with_a_baseline_stores_its_policies_differences(tmp_path):
    """baseline = "one": the sweep's Dataset, as run_sweep returns it and as open_store reads it, holds
    paired_differences at the spec's confidence; `mbbatch compare` takes it as its default baseline, and
    `mbbatch plot` draws a difference with its intervals beside the line of none."""
    from mbbatch.figures.plotting import plot, plottable
    from mbbatch.sweeps import open_store, run_sweep

    spec = tmp_path / "pairs.toml"
    spec.write_text(SWEEP.replace('seed = 5\n', 'seed = 5\nbaseline = "one"\nconfidence = 0.9\n'))
    ds = run_sweep(spec, tmp_path / "pairs.zarr", workers=1, progress=False)
    want = stats.paired_differences(ds, "one", 0.9)
    xr.testing.assert_equal(ds[list(want.data_vars)].load(), want[list(want.data_vars)])
    again = open_store(tmp_path / "pairs.zarr")
    np.testing.assert_array_equal(again["diff_latency_p99_ci_low"].values, want["diff_latency_p99_ci_low"].values)
    assert "diff_mean_latency" in plottable(again) and "diff_mean_latency_ci_low" not in plottable(again)
    fig = plot(again, x="rate", y="diff_mean_latency", hue="policy")
    (ax,) = fig.axes[:1]
    assert any(list(ln.get_ydata()) == [0.0, 0.0] and ln.get_linestyle() == "--" for ln in ax.lines)


@pytest.mark.parametrize("change, match", [
    ('baseline = "two"', r"baseline must be one of the policy axis's variants \['one', 'four'\]; got 'two'"),
    ("baseline = 1", r"baseline must be one of the policy axis's variants \['one', 'four'\]; got 1"),
])
def test_a_baseline_not_on_the_policy_axis_is_refused(tmp_path, change, match):
    from mbbatch.sweeps.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match=match):
        parse_spec(SWEEP.replace('seed = 5\n', f'seed = 5\n{change}\n'))
    one = SWEEP.replace('policy = ["one", "four"]', 'policy = ["one"]').replace(
        '[policies.four]\nkind = "multibin"\nbins = 4\n', "")
    with pytest.raises(SpecError, match=r"baseline needs a policy axis of two or more variants"):
        parse_spec(one.replace('seed = 5\n', 'seed = 5\nbaseline = "one"\n'))


def test_importing_mbbatch_leaves_xarray_to_what_needs_it():
    """`import mbbatch` stays light (its cold start is benched): mb.compare imports xarray when it runs."""
    import subprocess
    import sys

    code = "import sys, mbbatch; print('xarray' in sys.modules)"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["False"]


TENANTS = """
name = "tenants"
arrivals = "poisson"
service_model = "profile"
reps = 3
seed = 8

[params]
n = 1500
rate = 3.5
profile = "H100/vLLM/Meta-Llama-3-8B/tp1"
max_num_seqs = 16

[classes.chat]
share = 3
prompt_median = 256.0
output_median = 128.0
ttft_slo = 0.5

[classes.batch]
share = 1
prompt_median = 1024.0
output_median = 512.0
ttft_slo = 10.0

[policies.fcfs]
kind = "continuous"
[policies.vtc]
kind = "continuous"
admission = "vtc"

[grid]
policy = ["fcfs", "vtc"]
"""


def test_the_compare_command_compares_each_tenants_metric(tmp_path, capsys):
    """`mbbatch compare STORE --metric class_mean_ttft` on a store of two tenants prints each tenant's
    rows (request_class=...), their differences those of paired_differences on sim_class_mean_ttft; so
    does class_ttft_attainment (a metric of the classes alone); a per-class metric the classes do not
    report is refused, naming the flag and the choices."""
    from mbbatch.cli import main
    from mbbatch.sweeps import open_store

    spec = tmp_path / "tenants.toml"
    spec.write_text(TENANTS)
    store = tmp_path / "tenants.zarr"
    assert main(["compare", str(spec), "--out", str(store), "--metric", "class_mean_ttft"]) in (0, None)
    out = capsys.readouterr().out
    d = stats.paired_differences(open_store(store).load(), "fcfs", 0.95, ["class_mean_ttft"]).sel(policy="vtc")
    assert d["diff_class_mean_ttft"].attrs["units"] == "s"
    for tenant in ("chat", "batch"):
        row = d.sel(request_class=tenant)
        assert f"request_class={tenant}" in out
        assert f"ratio {float(row['ratio_class_mean_ttft']):.4g} [" in out
    # (a tenant's share of first tokens within its ttft_slo: higher is better, as the metric table's rows say)
    assert main(["compare", str(store), "--metric", "class_ttft_attainment"]) in (0, None)
    out = capsys.readouterr().out
    a = stats.paired_differences(open_store(store).load(), "fcfs", 0.95, ["class_ttft_attainment"]).sel(policy="vtc")
    assert a["diff_class_ttft_attainment"].attrs["units"] == "1"
    assert mb.metrics.PER_CLASS["ttft_attainment"].better == "higher"
    for tenant in ("chat", "batch"):
        row = a.sel(request_class=tenant)
        assert f"request_class={tenant}" in out and f"ratio {float(row['ratio_class_ttft_attainment']):.4g} [" in out
    assert main(["compare", str(store), "--metric", "class_throughput"]) == 2
    err = capsys.readouterr().err
    assert "--metric: unknown metric 'class_throughput'" in err and "class_ttft_p99" in err
