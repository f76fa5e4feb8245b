"""Capacity search (mbbatch.capacity): the paper's model against Theorem 4.2
and Lemma A.1, objectives against stability, monotone in the threshold, and
the arrival process's shape kept as its rate is set."""

import functools
import math
import warnings

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given, settings
from hypothesis import strategies as hs

import mbbatch as mb
from mbbatch import theory
from mbbatch.capacity import Objective, find_capacity, with_rate

#: one search: these tests are about the search itself (its bracket, probes and verdicts)
search = functools.partial(find_capacity, searches=1)

U = st.uniform(1, 19)


@pytest.mark.parametrize("k", range(1, 9))
def test_stability_capacity_of_the_paper_model_is_theorem_4_2(k):
    """1 server, U(1, 20), B = 128: the interval holds B / E[t_service]
    (Theorem 4.2) and the midpoint is within 1 % of it."""
    want = 128 / theory.service_time(128, 1.0, 20.0, k)
    r = search(mb.MultiBin(bins=k, batch_size=128), service=U, n=60_000, seed=k)
    assert r.bracket[0] <= want <= r.bracket[1], (r.summary(), want)
    assert abs(r.rate / want - 1) <= 0.01, (r.summary(), want)
    assert r.resolved and r.bracket[1] - r.bracket[0] <= 0.01 * r.rate + 1e-12


@pytest.mark.parametrize("servers", [2, 4])
def test_c_servers_carry_c_times_theorem_4_2(servers):
    want = servers * 128 / theory.service_time(128, 1.0, 20.0, 3)
    r = search(mb.MultiBin(bins=3, batch_size=128), service=U, servers=servers, n=60_000, seed=2)
    assert r.bracket[0] <= want <= r.bracket[1] and abs(r.rate / want - 1) <= 0.01, (r.summary(), want)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_exponential_service_at_lemma_a1_edges(k):
    """Exponential service, Lemma A.1's edges: within 1 % of B /
    batch_service_time on those edges."""
    B, mu = 64, 0.5
    edges = theory.exponential_boundaries(B, mu, k)
    dist = st.expon(scale=1 / mu)
    want = B / theory.batch_service_time(dist, edges, B)
    r = search(mb.MultiBin(bins=k, batch_size=B, edges=edges), service=dist, n=200_000, seed=5)
    assert abs(r.rate / want - 1) <= 0.01 and r.bracket[0] <= want <= r.bracket[1], (r.summary(), want)


def test_probes_share_their_seeds_and_report_every_criterion():
    """Common random numbers: the paper's model forms the same batches at
    every rate, so the load is exactly proportional to the rate."""
    r = search(mb.MultiBin(bins=2, batch_size=32), service=U, n=20_000, seed=3)
    three = [p for p in r.probes if p.reps == 3]
    ratio = [p.row("load")[1] / p.rate for p in three]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    for p in r.probes:
        assert [c[0] for c in p.criteria] == ["load", "throughput / rate", "backlog growing",
                                              "rate / saturated throughput"]
        assert p.verdict in ("pass", "fail", "undecided")
    assert r.requests == 3 * 20_000 + sum(p.reps for p in r.probes) * 20_000
    assert r.probes[0].rate == pytest.approx(1.05 * r.searches[0].saturated_throughput)


WL = mb.Workload(prompt=st.lognorm(0.5, scale=128), output=st.lognorm(0.8, scale=64))
DYN = mb.DynamicBatching(controller=mb.SLAController(d_sla=0.0074, b_max=64))
#: a dynamic-batching search: latency grows with the rate, so objectives bound it
SEARCH = dict(workload=WL, n=3_000, seed=4, rel_tol=0.05)


def test_an_objective_met_below_capacity_gives_the_stability_capacity():
    stable = search(DYN, **SEARCH)
    loose = search(DYN, **SEARCH, objective=Objective(latency_p95=1e9))
    assert (loose.bracket[0], loose.bracket[1]) == (stable.bracket[0], stable.bracket[1])
    assert "latency_p95 <= 1e+09" in loose.criterion


def test_a_tighter_objective_gives_a_smaller_rate():
    stable = search(DYN, **SEARCH)
    tight = search(DYN, **SEARCH, objective=Objective(mean_latency=2.0))
    assert tight.bracket[1] < stable.bracket[0], (tight.summary(), stable.summary())
    # at the highest rate that passed the objective holds; at the lowest that failed it does not
    passed = max((p for p in tight.probes if p.verdict == "pass"), key=lambda p: p.rate)
    failed = min((p for p in tight.probes if p.verdict == "fail"), key=lambda p: p.rate)
    assert passed.row("mean_latency")[3] <= 2.0 < failed.row("mean_latency")[2]
    # the interval lies between the verdicts; it is theirs when no undecided probe narrowed it
    assert passed.rate <= tight.bracket[0] <= tight.bracket[1] <= failed.rate
    if tight.resolved:
        assert (tight.bracket[0], tight.bracket[1]) == (passed.rate, failed.rate)


@pytest.mark.parametrize("bins, B, target", [(3, 40, 100.0), (2, 32, 60.0)])
def test_a_latency_objective_met_only_at_higher_load_is_found(bins, B, target):
    """The paper's model (full batches only) fills its batches slowly at low
    rates: its p95 latency falls with the rate, then rises near saturation,
    so the light load fails and the objective holds higher up (K = 3,
    B = 40: p95 119 s at 1.19 requests/s, 87 s at 1.78, 69 s at 2.82).  The
    search found nothing down to a thousandth of the light load and answered
    a rate of 0.0003; it must find the highest passing rate, and there the
    objective holds while the lowest failing rate above it breaks it."""
    r = search(mb.MultiBin(bins=bins, batch_size=B), service=U, n=20_000, seed=3, max_reps=8,
                      objective=Objective(latency_p95=target))
    light = 0.1 * r.searches[0].saturated_throughput
    assert r.bracket[0] > 5 * light, r.summary()
    passed = max((p for p in r.probes if p.verdict == "pass"), key=lambda p: p.rate)
    failed = min((p for p in r.probes if p.verdict == "fail" and p.rate > passed.rate), key=lambda p: p.rate)
    assert passed.rate <= r.bracket[0] <= r.bracket[1] <= failed.rate
    # and the light load did fail on the objective (what sent the search upwards)
    at_light = next(p for p in r.probes if p.rate == light)
    assert at_light.verdict == "fail" and at_light.row("latency_p95")[2] > target


def test_an_objective_met_nowhere_gives_a_rate_of_0():
    """Where no probed rate passes, the capacity is 0 (it was the midpoint of
    [0, the lowest failing rate], a small positive rate nothing supports);
    the bracket says how far down that was checked."""
    r = search(mb.MultiBin(bins=3, batch_size=40), service=U, n=20_000, seed=3, max_reps=8,
                      objective=Objective(latency_p95=20.0))
    assert r.rate == 0.0 and r.summary().startswith("capacity 0 requests/s"), r.summary()
    assert r.bracket[0] == 0.0 and r.bracket[1] < 1e-3 * r.saturated_throughput and r.resolved, r.summary()
    assert not any(p.verdict == "pass" for p in r.probes)


@pytest.mark.heavy      # (10 searches of dynamic batching: make thorough runs it, on 500 examples)
@settings(max_examples=5, deadline=None)
@given(a=hs.floats(1.5, 8.0), b=hs.floats(1.5, 8.0))
def test_capacity_is_monotone_in_the_objectives_threshold(a, b):
    """Property: a looser latency bound never gives a smaller capacity (same
    seeds; up to the search's tolerance)."""
    lo_x, hi_x = sorted((a, b))
    r1 = search(DYN, **SEARCH, objective=Objective(latency_p95=lo_x))
    r2 = search(DYN, **SEARCH, objective=Objective(latency_p95=hi_x))
    assert r1.rate <= r2.rate * (1 + r2.rel_tol), (r1.summary(), r2.summary())


def test_token_policies_and_their_objectives():
    """Dynamic batching under a mean TTFT bound: a smaller capacity than
    stability alone, every probe's TTFT row present."""
    stable = search(DYN, **SEARCH)
    ttft = search(DYN, **SEARCH, objective=Objective(mean_ttft=0.5, sla_violation_share=0.5))
    assert ttft.rate < stable.rate
    assert all(p.row("mean_ttft") and p.row("sla_violation_share") for p in ttft.probes)


@pytest.mark.parametrize("proc", [mb.Poisson(rate=2.0), mb.Gamma(rate=2.0, cv=3.0),
                                  mb.OnOff(rate_on=8.0, rate_off=1.0, mean_on=1.0, mean_off=3.0)])
def test_with_rate_keeps_the_shape(proc):
    p = with_rate(proc, 5.0)
    assert p.rate == pytest.approx(5.0, rel=1e-12)
    assert type(p) is type(proc)
    if isinstance(proc, mb.Gamma):
        assert p.cv == proc.cv
    if isinstance(proc, mb.OnOff):
        assert p.rate_off / p.rate_on == pytest.approx(proc.rate_off / proc.rate_on)
        assert (p.mean_on, p.mean_off) == (proc.mean_on, proc.mean_off)


def test_with_rate_scales_a_replay():
    t = np.cumsum(np.random.default_rng(0).exponential(0.5, 1000))
    p = with_rate(mb.Replay(t), 8.0)
    assert p.rate == pytest.approx(8.0, rel=1e-12)
    np.testing.assert_allclose(p.times * 8.0, (t - 0) * mb.Replay(t).rate, rtol=1e-12)


@pytest.mark.parametrize("kw, exc, match", [
    ({"arrivals": mb.Saturated()}, TypeError, "arrivals must have one mean rate"),
    ({"servers": math.inf}, ValueError, "servers must be finite"),
    ({"rel_tol": 0.0}, ValueError, r"rel_tol must be in \[1e-09, 1\)"),
    ({"confidence": 1.0}, ValueError, r"confidence must be in \(0, 1\)"),
    ({"max_reps": 2}, ValueError, r"max_reps must be an integer in \[3, inf\)"),
    ({"objective": {"latency_p95": 3}}, TypeError, "objective must be None"),
    ({"objective": Objective(mean_ttft=1.0)}, ValueError, "mean_ttft is not a metric of MultiBin"),
    ({"n": 0}, ValueError, "n must be"),
    ({"progress": 1}, TypeError, r"progress must be a bool \(True or False\); got 1"),
    ({"n": 5}, ValueError, r"n must be at least 160 requests per probe for a capacity search of MultiBin on 1 "
                           r"server\(s\) \(100 at least, and 10 times the 16 requests .*got n = 5$"),
])
def test_bad_arguments_are_refused_before_any_work(kw, exc, match):
    with pytest.raises(exc, match=match):
        search(mb.MultiBin(bins=2, batch_size=8), **{"service": U, **kw})


def test_a_search_whose_saturated_runs_complete_nothing_is_refused_naming_n():
    """4 MultiBin engines of batches of 30, 100 requests: no engine's batch
    fills.  The search went on at a rate of NaN (1.05 x the saturated
    throughput) and failed inside a probe; found by make fuzz.  Refused now
    before any run: a probe needs 10 times the 120 requests the engines
    hold."""
    cluster = mb.Cluster(mb.MultiBin(bins=1, batch_size=30), engines=4, router="round_robin")
    with pytest.raises(ValueError, match=r"^n must be at least 1200 requests per probe .*got n = 100$"):
        search(cluster, workload=mb.Workload(st.uniform(1, 10), st.uniform(1, 10)),
                      service_model=mb.MaxModel(base=0.1, per_token=0.01), n=100)


def test_progress_prints_the_saturated_runs_every_probe_and_the_result(capsys):
    r = search(mb.MultiBin(bins=2, batch_size=8), service=U, n=5_000, rel_tol=0.05, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == r.n_probes + 3
    sat = r.searches[0].saturated_throughput
    assert lines[0].startswith(f"find_capacity: saturated throughput {sat:.6g} requests/s [")
    for i, (line, p) in enumerate(zip(lines[1:], r.probes), 1):
        assert line.startswith(f"find_capacity: probe {i}: {p.rate:.6g} requests/s {p.verdict} after {p.reps} "
                               "replications ["), line
    assert lines[-2].startswith(f"find_capacity: {r.rate:.6g} requests/s, bracket [{r.bracket[0]:.6g}, "
                                f"{r.bracket[1]:.6g}] [")
    assert lines[-1] == f"find_capacity: {r.summary()}"
    # the same search without the lines
    quiet = search(mb.MultiBin(bins=2, batch_size=8), service=U, n=5_000, rel_tol=0.05)
    assert capsys.readouterr() == ("", "")
    assert (quiet.rate, quiet.probes) == (r.rate, r.probes)


def test_a_rel_tol_below_float_resolution_is_refused_and_the_finest_ends():
    """rel_tol = 1e-300 was accepted, and the bisection never ended: near
    float64's resolution a midpoint is one of the bracket's ends, so the
    bracket stopped narrowing (a sweep cell ran for 15 minutes before it was
    killed).  It is refused now, naming the range; at the finest rel_tol the
    search ends (about 30 halvings, and the narrowing around undecided
    probes)."""
    from mbbatch.capacity import REL_TOL_MIN, check_search

    with pytest.raises(ValueError, match=r"^rel_tol must be in \[1e-09, 1\); got 1e-300$"):
        check_search(mb.MultiBin(bins=2, batch_size=4), mb.Poisson(1.0), 1, None, 1e-300, 0.95, 24, 0.05)
    r = search(mb.MultiBin(bins=2, batch_size=4), service=U, n=300, max_reps=3, rel_tol=REL_TOL_MIN,
                      seed=0)
    assert r.bracket[1] - r.bracket[0] <= 2 * REL_TOL_MIN * r.bracket[1] and r.n_probes < 100, r.summary()
    _between_its_verdicts(r)


def _between_its_verdicts(r):
    """The answer lies between the highest rate that passed and the lowest that failed above it (it is
    where the binding criterion's means cross its threshold: see capacity._crossing)."""
    passed = max(p.rate for p in r.probes if p.verdict == "pass")
    failed = min(p.rate for p in r.probes if p.verdict == "fail" and p.rate >= passed)
    assert passed <= r.rate <= failed, r.summary()


def test_objective_needs_a_bound_in_its_domain():
    with pytest.raises(ValueError, match="at least one bound"):
        Objective()
    with pytest.raises(ValueError, match=r"sla_violation_share must be in \[0, 1\]"):
        Objective(sla_violation_share=2.0)
    with pytest.raises(ValueError, match=r"latency_p95 must be in \(0, inf\)"):
        Objective(latency_p95=-1.0)


def test_an_undecided_probe_narrows_the_bracket_from_both_sides_to_rel_tol():
    """A criterion the probes cannot tell from its threshold near the limit
    (p95 of a few thousand requests, a few replications): the search still
    ends within rel_tol, flags itself unresolved, and lists the undecided
    probes."""
    r = search(DYN, workload=WL, n=3_000, seed=4, rel_tol=0.02, max_reps=6,
                      objective=Objective(latency_p95=5.0))
    undecided = [p for p in r.probes if p.verdict == "undecided"]
    assert undecided and all(p.reps == 6 for p in undecided)
    assert not r.resolved and "unresolved" in r.summary()
    assert r.bracket[1] - r.bracket[0] <= 0.02 * 0.5 * (r.bracket[0] + r.bracket[1]) * (1 + 1e-12)
    _between_its_verdicts(r)


def _rows(load, growing, objective=None, saturation="pass"):
    """A probe's criteria rows: (metric, mean, low, high, threshold, verdict); the backlog's share of
    replications grown as 3 replications' Clopper-Pearson interval would decide it (undecided unless
    at the cap's rule: every one or none)."""
    rows = [("load", 1.0, 0.99, 1.01, 1.0, load), ("throughput / rate", 1.0, 0.99, 1.01, 0.95, "pass"),
            ("backlog growing", growing, 0.0, 1.0, 0.5, "undecided"),
            ("rate / saturated throughput", 0.9, 0.8, 1.0, 1.0, saturation)]
    return rows + ([("latency_p95", 1.0, 0.9, 1.1, 1.0, objective)] if objective else [])


@pytest.mark.parametrize("load, growing, objective, at_cap, want", [
    ("pass", 0.5, None, False, "pass"),            # the load decides, the backlog check does not
    ("fail", 0.0, None, False, "fail"),
    ("undecided", 0.0, None, False, "undecided"),  # before the cap: more replications
    ("undecided", 1.0, None, True, "fail"),        # at the cap: every backlog grew
    ("undecided", 0.0, None, True, "pass"),        # at the cap: none grew, only the load undecided
    ("undecided", 0.5, None, True, "undecided"),   # some grew
    ("undecided", 0.0, "undecided", True, "undecided"),   # an objective undecided too: it is not the backlog's
    ("pass", 0.0, "undecided", True, "undecided"),
])
def test_the_backlog_check_decides_only_a_load_undecided_at_the_cap(load, growing, objective, at_cap, want):
    from mbbatch.capacity import _verdict

    assert _verdict(_rows(load, growing, objective), at_cap) == want
    # above the saturated throughput nothing passes
    assert _verdict(_rows(load, growing, objective, saturation="fail"), at_cap) == "fail"
    # where the backlog decides every probe (a continuous engine: no guards), it is a criterion as any
    decided = _verdict(_rows(load, growing, objective), at_cap, guards=())
    assert decided == ("fail" if load == "fail" else "undecided")


def test_no_probe_above_the_answer_passes_on_a_short_runs_backlog():
    """1,149 requests a run, exponential service: the first upper probe (1.05
    times the saturated throughput) had an undecided load and no replication
    flagged a growing backlog (the check misses an overload in so short a
    run); it passed, above the answer.  No probe at or above the saturated
    throughput passes on the backlog now."""
    r = search(mb.MultiBin(bins=5, batch_size=12), service=st.expon(scale=3.0), n=1149, seed=12,
                      rel_tol=0.01, max_reps=5)
    assert all(p.rate <= r.bracket[1] for p in r.probes if p.verdict == "pass"), r.summary()
    assert r.rate < r.saturated_throughput


def test_a_policy_whose_batches_grow_with_the_load_is_searched_to_its_stable_limit():
    """8 Autellix engines of dynamic batching keep their servers busy from
    about 20 calls/s up to their limit near 40: their load was 1 within its
    interval all along, and the search answered 24.7 there (probes undecided
    on the load narrowed the bracket wherever they fell).  Such a policy's
    batches take whatever waits: the backlog decides each of its probes, and
    it has no load row.  The runs are stable up to the answer and not 15 %
    above it."""
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=300.0), output=st.lognorm(0.8, scale=64.0))
    engine = mb.DynamicBatching(controller=mb.SLAController(d_sla=0.0075, b_max=64))
    cluster = mb.Cluster(engine, engines=8, router="autellix", threshold=1024,
                         programs=mb.Programs(calls=4, think_time=1.0))
    kw = dict(workload=wl, service_model=mb.DecodeModel(prefill_per_token=1e-4), n=200_000)
    r = search(cluster, objective=Objective(ttft_p99=16.0), max_reps=8, rel_tol=0.05, seed=20251124, **kw)
    assert r.rate > 30.0 and not any(p.has("load") for p in r.probes), r.summary()
    below = mb.simulate(cluster, mb.Poisson(r.bracket[0]), seed=1, **kw)
    assert not below.unstable and below.throughput / r.bracket[0] > 0.99 and below.ttft_p99 <= 16.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mb.UnstableWarning)
        above = mb.simulate(cluster, mb.Poisson(1.15 * r.bracket[1]), seed=1, **kw)
    assert above.unstable or above.ttft_p99 > 16.0


@pytest.mark.parametrize("arrivals", [mb.Gamma(rate=1.0, cv=2.0),
                                      mb.OnOff(rate_on=2.0, rate_off=0.5, mean_on=5.0, mean_off=5.0),
                                      mb.Replay(np.cumsum(np.random.default_rng(2).exponential(1.0, 30_000)))])
def test_the_stable_limit_does_not_depend_on_the_arrivals_shape(arrivals):
    """Bursty or replayed arrivals, their shape kept while the search sets
    their rate: the paper's model still carries Theorem 4.2's B / E[t_service]
    (its batches do not depend on the arrivals)."""
    want = 32 / theory.service_time(32, 1.0, 20.0, 2)
    r = search(mb.MultiBin(bins=2, batch_size=32), arrivals=arrivals, service=U, n=30_000, seed=6)
    assert r.bracket[0] <= want <= r.bracket[1] and abs(r.rate / want - 1) <= 0.01, (r.summary(), want)


def test_a_fraction_confidence_reads_as_its_float():
    """confidence=Fraction(9, 10) searches as 0.9 (the summary once raised a TypeError formatting it)."""
    from fractions import Fraction

    cap = search(mb.MultiBin(bins=2, batch_size=8), service=st.uniform(1, 19), n=4000, seed=0,
                           confidence=Fraction(9, 10), rel_tol=Fraction(1, 20))
    assert cap.confidence == 0.9 and isinstance(cap.confidence, float) and "90%" in cap.summary()


@pytest.mark.parametrize("n", [1, 2, 10, 99])
def test_a_search_too_short_to_judge_is_refused(n):
    """A 4-engine cluster searched at n = 1 answered 5.03 requests/s,
    "resolved" (20.2 at n = 4,000): fewer than 100 requests a probe are
    refused, naming n, before any work."""
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=300), output=st.lognorm(0.8, scale=64))
    with pytest.raises(ValueError, match=rf"n must be at least 10240 requests per probe .*; got n = {n}$"):
        search(mb.Cluster(engines=4), workload=wl, n=n)


# --- the capacity's interval over independent searches ------------------------------------

@pytest.mark.heavy      # (20 find_capacity calls of five searches: 40 s of CPU)
def test_the_capacity_interval_covers_theorem_4_2_at_its_confidence():
    """Twenty find_capacity calls on independent seeds (five searches each): the 95% interval
    ``rate_ci`` holds Theorem 4.2's B / E[t_service] in at least 17 of them (a 95% interval covers
    in fewer than 17 of 20 with probability 1.6%, binomial); the first search's bracket alone did not
    claim to (it is one search's answer, not the capacity's uncertainty)."""
    B, k = 8, 2
    want = B / theory.service_time(B, 1.0, 20.0, k)
    covered = 0
    for s in range(20):
        r = find_capacity(mb.MultiBin(bins=k, batch_size=B), service=U, n=2_000, rel_tol=0.05, seed=100 + s)
        assert len(r.searches) == 5 and r.rate == pytest.approx(np.mean([x.rate for x in r.searches]), rel=1e-12)
        lo, hi = r.rate_ci
        assert lo < r.rate < hi and hi - lo < 0.05 * r.rate, r.summary()
        covered += lo <= want <= hi
    assert covered >= 17, covered


@pytest.mark.heavy      # (30 find_capacity searches: 30 s of CPU)
def test_capacity_intervals_of_different_seeds_overlap_where_brackets_did_not():
    """A noisy objective (static batching under a p95 latency bound): the 95% intervals of six
    seeds overlap pairwise in at least 14 of the 15 pairs (two independent 95% t-intervals of one
    mean from five answers each miss each other with probability 0.5%: 0.08 misses expected in 15
    pairs); the brackets, one search each, overlap in few."""
    import itertools

    pol = mb.StaticBatching(batch_size=8)
    found = [find_capacity(pol, workload=WL, n=2_000, seed=s, rel_tol=0.02, objective=Objective(latency_p95=3.0))
             for s in range(6)]
    pairs = list(itertools.combinations(found, 2))
    overlap = sum(max(a.rate_ci[0], b.rate_ci[0]) <= min(a.rate_ci[1], b.rate_ci[1]) for a, b in pairs)
    brackets = sum(max(a.bracket[0], b.bracket[0]) <= min(a.bracket[1], b.bracket[1]) for a, b in pairs)
    assert overlap >= 14 and brackets <= 7, (overlap, brackets)


def test_searches_are_independent_and_the_first_is_a_lone_search():
    """Search 0 is the search ``searches=1`` runs, bit for bit; the others have seeds of their own;
    one search has no interval, and says so."""
    kw = dict(service=U, n=2_000, rel_tol=0.05, seed=7)
    pol = mb.MultiBin(bins=2, batch_size=8)
    one, three = search(pol, **kw), find_capacity(pol, **kw, searches=3)
    assert three.searches[0] == one.searches[0] and one.rate == one.searches[0].rate
    assert len({s.rate for s in three.searches}) == 3
    assert all(math.isnan(x) for x in one.rate_ci) and "one search, no interval" in one.summary()
    assert "95% interval [" in three.summary() and "over 3 independent searches" in three.summary()
    assert {row["search"] for row in three.table()} == {0, 1, 2} and three.n_probes == sum(
        len(s.probes) for s in three.searches)
    with pytest.warns(DeprecationWarning, match="rate_ci"):
        assert three.rate_low == three.bracket[0]
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match=r"searches must be an integer in \[1, inf\)"):
            find_capacity(pol, **kw, searches=bad)


def test_a_capacity_result_shows_each_search_in_a_notebook():
    r = find_capacity(mb.MultiBin(bins=2, batch_size=8), service=U, n=2_000, rel_tol=0.05, seed=1, searches=2)
    html = r._repr_html_()
    assert r.summary() in html and html.count("<tr>") == 3
    assert f"{r.searches[1].rate:.6g}" in html


# --- every kind's capacity: at most its saturated throughput, stable below ---------------

#: a small configuration of every registered kind (and the two whose stability needs the backlog
#: check at every probe besides a continuous engine: a cluster of them, LAPS with a decode stage)
PROFILE = "H100/vLLM/Meta-Llama-3-8B/tp1"
_CTL = mb.SLAController(d_sla=0.0074, b_max=32)
KIND_CALLS = {
    "multibin": (mb.MultiBin(bins=2, batch_size=8), {"service": U}),
    "static": (mb.StaticBatching(8), {"workload": WL}),
    "dynamic": (mb.DynamicBatching(controller=_CTL), {"workload": WL}),
    "multibin_dynamic": (mb.MultiBinDynamic(bins=2, warmup=100, controller=_CTL), {"workload": WL}),
    "laps": (mb.LAPS(instances=2), {"workload": WL}),
    "cluster": (mb.Cluster(mb.DynamicBatching(controller=_CTL), engines=2), {"workload": WL}),
    "spf": (mb.ShortestPredictedFirst(8), {"workload": WL}),
    "continuous": (mb.ContinuousBatching(max_num_seqs=16), {"workload": WL, "profile": PROFILE}),
    "disaggregated": (mb.Disaggregated(mb.ContinuousBatching(max_num_seqs=8), mb.ContinuousBatching(max_num_seqs=16)),
                      {"workload": WL, "profile": PROFILE}),
}
EXTRA_CALLS = {
    "cluster of continuous engines": (mb.Cluster(mb.ContinuousBatching(max_num_seqs=8), engines=2),
                                      {"workload": WL, "profile": PROFILE}),
    "laps with a continuous decode stage": (mb.LAPS(instances=2, decode=mb.ContinuousBatching(max_num_seqs=16)),
                                            {"workload": WL}),
}


def _side(side: dict) -> dict:
    side = dict(side)
    if "profile" in side:
        side["service_model"] = mb.profiles.get(side.pop("profile"))
    return side


def test_every_registered_kind_has_a_capacity_case():
    """The registry is the list (a kind added without a case here fails)."""
    assert set(KIND_CALLS) == set(mb.registry.KINDS)


def _at_most_saturated_and_stable_below(pol, side, seed):
    """find_capacity on 3 searches at twice the kind's fewest requests (2,000 at least): its interval
    lies at or below the saturated throughput's, each search's saturated runs are simulate's own
    (Saturated arrivals, the search's seeds: their throughput over their utilization), and a probe
    at 98 % of the capacity on 6 seeds of its own is not unstable by the kind's criteria
    (:class:`~mbbatch.policies.base.Carries`; each at 95 %)."""
    from mbbatch.capacity import _Search, min_requests

    n = max(2_000, 2 * min_requests(pol))
    r = find_capacity(pol, n=n, seed=seed, searches=3, rel_tol=0.05, **side)
    assert r.rate_ci[0] <= r.rate <= r.rate_ci[1] <= r.saturated_ci[1], r.summary()
    assert r.saturated_ci[0] <= r.saturated_throughput <= r.saturated_ci[1]
    first = r.searches[0]
    for rep in (0, 2):
        sat = mb.simulate(pol, mb.Saturated(), n=n, seed=np.random.SeedSequence(seed, spawn_key=(rep,)), **side)
        assert first.saturated[rep] == sat.throughput / sat.utilization
    for s in r.searches:
        assert all(p.verdict == "fail" for p in s.probes if p.row("rate / saturated throughput")[2] > 1.0)
    below = _Search(pol, mb.Poisson(1.0), {**side, "n": n}, 1, None, 0.95, 24, 0.05, seed + 1000)
    below.saturated_throughput()
    probe = below.probe(0.98 * r.rate)
    assert probe.verdict != "fail", (r.summary(), probe)
    return r


@pytest.mark.parametrize("kind", mb.registry.KINDS)
def test_every_kinds_capacity_is_at_most_its_saturated_throughput_and_stable_below_it(kind):
    pol, side = KIND_CALLS[kind]
    _at_most_saturated_and_stable_below(pol, _side(side), seed=mb.registry.KINDS.index(kind))


@pytest.mark.parametrize("case", EXTRA_CALLS)
def test_engines_whose_backlog_decides_are_at_most_saturated_and_stable_below(case):
    pol, side = EXTRA_CALLS[case]
    _at_most_saturated_and_stable_below(pol, _side(side), seed=11)


#: the issue's continuous engine: 32 sequences on the H100 profile, log-normal prompts and outputs
ISSUE_WL = mb.Workload(prompt=st.lognorm(0.6, scale=256), output=st.lognorm(1.0, scale=128))


def test_a_continuous_engines_capacity_is_not_above_its_saturated_throughput():
    """ContinuousBatching(max_num_seqs=32) on the H100 profile answered 14.28 [14.18, 14.39]
    requests/s against a saturated throughput of 13.43, every run there unstable: the load divided by
    an iteration's batch (0.002-0.01 at any rate) always passed, and the throughput check passed once
    its interval touched 0.95.  Now the throughput, the backlog (at every probe) and the saturated
    throughput decide; a probe whose throughput interval holds its floor replicates further."""
    pol, prof = mb.ContinuousBatching(max_num_seqs=32), mb.profiles.get(PROFILE)
    r = find_capacity(pol, workload=ISSUE_WL, service_model=prof, n=4_000, seed=0, rel_tol=0.05, searches=3)
    # (the old answer was 6 % above the saturated throughput; each search's now lies at most where its
    # rate crosses its replications' saturated throughputs)
    assert r.rate_ci[1] <= r.saturated_ci[1] and r.rate < 1.01 * r.saturated_throughput, r.summary()
    assert all(not p.has("load") for p in r.probes)
    borderline = [p for p in r.probes if p.row("throughput / rate")[5] == "undecided" and p.verdict != "fail"]
    assert borderline and all(p.reps == 24 for p in borderline)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mb.UnstableWarning)
        runs = [mb.simulate(pol, mb.Poisson(0.98 * r.rate), workload=ISSUE_WL, service_model=prof, n=4_000,
                            seed=s) for s in range(4)]
    assert sum(x.unstable for x in runs) <= 1 and np.mean([x.throughput for x in runs]) > 0.95 * 0.98 * r.rate


def test_a_continuous_engine_searched_on_too_few_requests_is_refused():
    """At n = 100 a continuous engine's capacity came out at 10.1 [5.2, 15.0] requests/s, "resolved",
    against 27.2 at n = 4,000: its slots turn over once per output, so a probe needs 100 times its
    max_num_seqs (3,200 here), named before any work."""
    with pytest.raises(ValueError, match=r"^n must be at least 3200 requests per probe for a capacity search of "
                                         r"ContinuousBatching on 1 server\(s\) \(100 at least, and 100 times the 32 "
                                         r"requests .*; got n = 100$"):
        find_capacity(mb.ContinuousBatching(max_num_seqs=32), workload=ISSUE_WL, n=100)
    with pytest.raises(ValueError, match=r"^n must be at least 6400 .* on 2 server\(s\)"):
        find_capacity(mb.ContinuousBatching(max_num_seqs=32), workload=ISSUE_WL, servers=2, n=3_200)


def test_a_backlog_decided_search_needs_the_replications_to_decide_it():
    """Where the backlog decides every probe, 0 of k growing puts the growing share below one half
    (Clopper-Pearson, 95 %) only from k = 6: fewer replications at the cap could never pass a probe
    (a dynamic-batching search with max_reps = 4 answered 0)."""
    from mbbatch.capacity import backlog_reps

    assert [backlog_reps(c) for c in (0.5, 0.8, 0.9, 0.95, 0.99)] == [3, 4, 5, 6, 8]
    with pytest.raises(ValueError, match=r"^max_reps must be at least 6 for a capacity search of DynamicBatching "
                                         r"at confidence 0.95: .*; got 4$"):
        find_capacity(DYN, workload=WL, n=3_000, max_reps=4)
    find_capacity(mb.MultiBin(bins=2, batch_size=8), service=U, n=2_000, max_reps=4, searches=1, rel_tol=0.1)


# --- each class's objectives, on a mixture ------------------------------------------------------------

#: a chat class with an objective on its first token and a batch class of long requests, 3 : 1, on one
#: continuous engine of 16 sequences (the guide's mixture, docs/guide/continuous.md)
CHAT = mb.Workload(prompt=st.uniform(16, 240), output=st.expon(scale=64), ttft_slo=0.3)
BATCH = mb.Workload(prompt=st.uniform(512, 1536), output=st.expon(scale=512))
MIX = mb.Workload.mixture({"chat": (3, CHAT), "batch": (1, BATCH)})
CB16 = mb.ContinuousBatching(max_num_seqs=16)
MIXED = dict(workload=MIX, n=2_000, seed=3, rel_tol=0.05)


@functools.cache
def _mixed(objective=None):
    """One search of the mixture (cached: several tests compare with the stable one)."""
    return search(CB16, service_model=mb.profiles.get(PROFILE), objective=objective, **MIXED)


def test_a_class_objective_that_binds_lowers_the_capacity_and_a_loose_one_does_not():
    """The chat class's p99 time to first token at most 0.5 s binds below the
    engine's stable limit; the batch class's mean latency at most 10^9 s
    holds everywhere, so that search probes as the stable one does, rate
    for rate.  The answer is where the class's means cross the bound: the
    highest passing probe's interval lies at or below it, the lowest failing
    one's above it."""
    stable = _mixed()
    chat = _mixed(Objective(classes={"chat": Objective(ttft_p99=0.5)}))
    assert chat.rate < 0.9 * stable.rate, (chat.summary(), stable.summary())
    assert chat.criterion == "stable and ttft_p99['chat'] <= 0.5"
    passed = max((p for p in chat.probes if p.verdict == "pass"), key=lambda p: p.rate)
    failed = min((p for p in chat.probes if p.verdict == "fail" and p.rate > passed.rate), key=lambda p: p.rate)
    assert passed.row("ttft_p99['chat']")[3] <= 0.5 < failed.row("ttft_p99['chat']")[2]
    assert failed.row("ttft_p99['chat']")[5] == "fail"
    loose = _mixed(Objective(classes={"batch": Objective(mean_latency=1e9)}))
    assert [p.rate for p in loose.probes] == [p.rate for p in stable.probes] and loose.rate == stable.rate
    # a lower bound: the chat class's goodput (its requests within 0.3 s to their first token)
    good = _mixed(Objective(classes={"chat": Objective(goodput=0.95)}))
    assert good.rate < stable.rate and "goodput['chat'] >= 0.95" in good.criterion


def test_a_class_criterion_is_the_t_interval_of_the_class_metric_over_the_replications():
    """Two paths: a probe's row for ttft_p99['chat'] is the t-interval, at the
    search's confidence, of ``result.classes['chat']['ttft_p99']`` over
    runs of the probe's rate on the search's seeds (replication r: child r
    of the seed), as the run's own metrics are."""
    from mbbatch import stats
    from mbbatch.simulation import plan

    r = _mixed(Objective(classes={"chat": Objective(ttft_p99=0.5)}))
    p = next(p for p in r.probes if p.verdict == "pass")
    run = plan(CB16, mb.Poisson(p.rate), workload=MIX, service_model=mb.profiles.get(PROFILE), n=MIXED["n"])
    runs = [run.run(np.random.SeedSequence(MIXED["seed"], spawn_key=(rep,)), warn=False) for rep in range(p.reps)]
    want = stats.t_interval(np.array([x.classes["chat"]["ttft_p99"] for x in runs]), 0.95)
    assert p.row("ttft_p99['chat']")[1:4] == want
    assert p.row("ttft_p99['chat']")[4] == 0.5


@pytest.mark.parametrize("objective, workload, exc, match", [
    (Objective(classes={"chats": Objective(ttft_p99=0.5)}), MIX, ValueError,
     r"^objective: classes: no class 'chats' in the workload's mixture; its classes: 'chat', 'batch'$"),
    (Objective(classes={"chat": Objective(ttft_p99=0.5)}), CHAT, ValueError,
     r"^objective: classes bound the metrics of a Workload.mixture's classes; the workload is not a mixture"),
    (Objective(classes={"batch": Objective(goodput=0.9)}), MIX, ValueError,
     r"^objective: classes\['batch'\]: goodput is the share of the class's requests within its objectives.*"
     r"class 'batch' sets neither$"),
])
def test_class_objectives_are_refused_before_any_work(monkeypatch, objective, workload, exc, match):
    """A class the mixture does not have (named with those it has), classes
    on a workload of one kind, a class's goodput without its objectives:
    refused by find_capacity's checks, before a search starts."""
    import mbbatch.capacity as capacity

    monkeypatch.setattr(capacity, "_search", lambda *a: pytest.fail("a search started"))
    with pytest.raises(exc, match=match):
        find_capacity(CB16, workload=workload, service_model=mb.profiles.get(PROFILE), n=2_000, objective=objective)


@pytest.mark.parametrize("classes, exc, match", [
    ({"chat": Objective(tbt_p99=0.02)}, ValueError,
     r"^classes\['chat'\]: tbt_p99 is not a metric of a class \(the run reports mean_latency, latency_p99, "
     r"mean_ttft, ttft_p99, goodput for each class"),
    ({"chat": {"ttft_p99": 0.5}}, TypeError, r"^classes\['chat'\] must be an Objective"),
    ({}, TypeError, "^classes must be a non-empty dict"),
    ({"": Objective(ttft_p99=0.5)}, TypeError, "^classes: a class's name must be a non-empty string"),
    ({"chat": Objective(classes={"x": Objective(ttft_p99=0.5)})}, ValueError,
     r"^classes\['chat'\]: a class's objective bounds its own metrics; it takes no classes$"),
])
def test_a_class_objective_bounds_only_what_a_class_reports(classes, exc, match):
    with pytest.raises(exc, match=match):
        Objective(classes=classes)


def test_the_class_metrics_an_objective_bounds_are_those_a_mixtures_run_reports():
    """CLASS_METRICS (what a class's objective may bound) against a run's
    ``result.classes``: each is reported for every class, and is a metric an
    objective bounds for the whole run, in the same direction."""
    from mbbatch.capacity import CLASS_METRICS, LOWER_BOUNDS, OBJECTIVE_METRICS

    res = mb.simulate(CB16, mb.Poisson(2.0), workload=MIX, service_model=mb.profiles.get(PROFILE), n=300, seed=1)
    assert all(set(CLASS_METRICS) <= set(c) for c in res.classes.values())
    assert set(CLASS_METRICS) <= set(OBJECTIVE_METRICS) and set(LOWER_BOUNDS) <= set(CLASS_METRICS)
    o = Objective(latency_p99=60.0, classes={"chat": Objective(ttft_p99=0.5), "batch": Objective(goodput=0.8)})
    assert o.describe() == "latency_p99 <= 60 and ttft_p99['chat'] <= 0.5 and goodput['batch'] >= 0.8"
    assert o == Objective(latency_p99=60.0, classes={"chat": Objective(ttft_p99=0.5),
                                                     "batch": Objective(goodput=0.8)})
    assert hash(o) == hash(Objective(latency_p99=60.0))   # (classes, a dict, stay out of the hash)


def test_find_split_searches_every_split_and_names_the_best():
    """Three engines: the splits 1:2 and 2:1, each a Disaggregated capacity
    search on the same seeds (the one of 1:2 is find_capacity's of that
    deployment, bit for bit), the colocated cluster's beside them; the best is
    the larger.  Long outputs on short prompts: two decode engines carry
    more than one."""
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=256))
    kw = dict(workload=wl, n=3000, searches=1, rel_tol=0.05, max_reps=6, seed=2,
              objective=Objective(ttft_p99=2.0))
    engine = mb.ContinuousBatching(max_num_seqs=8)
    got = mb.find_split(3, prefill=engine, decode=engine, colocated=True, **kw)
    assert sorted(got.capacities) == [1, 2] and got.engines == 3
    assert got.best == 1 and got.rate == got.capacities[1].rate > got.capacities[2].rate
    assert got.capacities[1].rate == find_capacity(mb.Disaggregated(engine, engine, decode_engines=2), **kw).rate
    assert got.colocated is not None and got.colocated.rate > 0
    assert "1:2" in got.table() and "<- best" in got.table() and "colocated" in got.table()
    with pytest.raises(ValueError, match=r"engines: .* \[2, 2\*\*20\]"):
        mb.find_split(1, **kw)


def test_find_split_takes_a_laps_prefill_pool():
    """With LAPS as the prefill pool, each split p:(3 - p) is LAPS of p
    instances (its other settings kept) before 3 - p decode engines: the
    split 2:1's capacity is find_capacity's of that deployment, bit for
    bit; the best carries the most."""
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=256))
    kw = dict(workload=wl, n=3000, searches=1, rel_tol=0.05, max_reps=6, seed=2,
              objective=Objective(ttft_p99=2.0))
    engine = mb.ContinuousBatching(max_num_seqs=8)
    got = mb.find_split(3, prefill=mb.LAPS(instances=7, threshold=48), decode=engine, **kw)
    assert sorted(got.capacities) == [1, 2] and got.colocated is None
    want = find_capacity(mb.Disaggregated(mb.LAPS(instances=2, threshold=48), engine, decode_engines=1), **kw)
    assert got.capacities[2].rate == want.rate
    assert got.rate == max(c.rate for c in got.capacities.values())


def test_find_split_refuses_a_prefill_policy_that_declares_no_stage():
    """A split's prefill pool is the stage its policy declares: a policy
    declaring none is refused by name, before any search runs."""
    with pytest.raises(TypeError, match=r"prefill must be ContinuousBatching or LAPS .* got StaticBatching"):
        mb.find_split(3, prefill=mb.StaticBatching(), n=100,
                      workload=mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=64)))
