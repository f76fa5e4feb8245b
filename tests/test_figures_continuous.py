"""mbbatch.figures.continuous: continuous batching against multi-bin
batching run to completion, on measured hardware."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mbbatch import figures

from .conftest import SHARED_DATA
from .figure_datasets import MARKS, results  # noqa: F401  (fixtures)

pytestmark = MARKS
ROOT = Path(__file__).resolve().parents[1]


def _draws(results, out_dir, name):
    """Figure ``name`` drawn from the synthetic stores: its PDF (test_figures'
    ``drawn`` writes every figure's PNG; a PDF draws the figure again)."""
    files = figures.make_figures(results, out_dir, only=name, formats="pdf")
    assert [f.name for f in files] == [f"{name}.pdf"]


def _small(name, out_dir, *swaps):
    """The store of sweeps/NAME.toml with each ``(old, new)`` of ``swaps``
    replaced in its text (a smaller run)."""
    from mbbatch.sweeps import run_sweep
    from mbbatch.sweeps.spec import parse_spec

    text = (ROOT / "sweeps" / f"{name}.toml").read_text()
    for old, new in swaps:
        assert old in text, old
        text = text.replace(old, new)
    spec = parse_spec(text, source=ROOT / "sweeps" / f"{name}.toml")
    return run_sweep(spec, out_dir / f"{name}.zarr", workers=1, progress=False).load()


def test_it_draws_from_the_two_stores(results, tmp_path):
    assert figures.FIGURES["continuous_vs_binned"][1] == ["hardware_multibin", "continuous_vs_binned"]
    _draws(results, tmp_path, "continuous_vs_binned")


def test_its_spec_runs_small_and_the_engine_is_multi_bins_limit(tmp_path):
    """continuous_vs_binned's spec, run small (n = 20,000, 2 replications),
    on hardware_multibin's workload: the engine at 32 running sequences
    carries more than multi-bin batching at 64 bins (11.29 and 5.90
    requests/s on the H100 and A100 profiles, finished members leaving:
    docs/gallery/hardware.md) and about what its limit of every batch one length
    does (13.06 and 6.75: at every iteration both step 32 sequences; within
    3 %, this small run's start and drain), and 256 sequences more than 32."""
    ds = _small("continuous_vs_binned", tmp_path, ("n = 1000000", "n = 20000"), ("reps = 3", "reps = 2"))
    thr = ds["sim_throughput_mean"]
    assert np.all(thr.sel(max_num_seqs=256) > thr.sel(max_num_seqs=32))
    binned = {"H100/vLLM/Meta-Llama-3-8B/tp1": (11.29, 13.06), "A100/vLLM/Meta-Llama-3-8B/tp1": (5.90, 6.75)}
    for name, (k64, limit) in binned.items():
        got = float(thr.sel(max_num_seqs=32, profile=name))
        assert got > k64 and abs(got / limit - 1) < 0.03, (name, got)


def test_the_memory_figure_draws_and_its_spec_shows_preemptions_rising_as_the_cache_shrinks(results, tmp_path):
    """continuous_memory draws; its spec, run small (n = 20,000, 2
    replications, three caches): preemptions per request fall as the cache
    grows, to none at 48,000 tokens, for every admission order."""
    _draws(results, tmp_path, "continuous_memory")
    ds = _small("continuous_memory", tmp_path, ("n = 200000", "n = 20000"), ("reps = 3", "reps = 2"),
                ("kv_tokens = [12000.0, 16000.0, 20000.0, 24000.0, 32000.0, 48000.0]",
                 "kv_tokens = [16000.0, 24000.0, 48000.0]"))
    pre = (ds["preemptions"] / ds["completed"]).mean("rep")
    assert np.all(pre.diff("kv_tokens") <= 0) and np.all(pre.sel(kv_tokens=48000.0) == 0)
    assert np.all(pre.sel(kv_tokens=16000.0) > 0.05)


def test_the_controller_figure_draws_and_its_spec_holds_the_mean_sla_where_a_fixed_cap_does_not(results, tmp_path):
    """continuous_controller draws; its spec, run small (n = 20,000, 2
    replications, loads 10 and 30 requests/s): at 10 every variant but the
    cap of 32 carries the load at the same mean time between tokens; at 30
    the cap of 256 carries it at a mean above 25 ms, the controller with
    D_SLA = 20 ms holds its mean within 3 % of it (carrying less, its
    backlog growing) at a cap below 256, the one with 25 ms within 3 % of
    25 ms; the p99s are the iterations carrying a prefill chunk (the
    profile's measured prefill: 52 ms for 2,048 tokens), above 2 x D_SLA
    under either controller."""
    _draws(results, tmp_path, "continuous_controller")
    ds = _small("continuous_controller", tmp_path, ("n = 50000", "n = 20000"), ("reps = 3", "reps = 2"),
                ("rate = [5.0, 10.0, 15.0, 20.0, 22.5, 25.0, 27.5, 30.0, 32.5]", "rate = [10.0, 30.0]"))
    mean = ds["sim_mean_tbt"].mean("rep")
    low = mean.sel(rate=10.0)
    assert float(abs(low.sel(policy="sla20") / low.sel(policy="cap256") - 1)) < 0.02
    high = mean.sel(rate=30.0)
    assert float(high.sel(policy="cap256")) > 0.025
    assert abs(float(high.sel(policy="sla20")) / 0.02 - 1) < 0.03
    assert abs(float(high.sel(policy="sla25")) / 0.025 - 1) < 0.03
    p99 = ds["sim_tbt_p99"].mean("rep").sel(rate=30.0)
    assert float(p99.sel(policy="sla20")) > 0.04 and float(p99.sel(policy="sla25")) > 0.05
    assert float(ds["sim_mean_max_num_seqs"].sel(policy="sla20", rate=30.0).mean()) < 200
    assert bool(ds["unstable"].sel(policy="sla20", rate=30.0)) and not bool(ds["unstable"].sel(policy="cap256",
                                                                                                 rate=30.0))


def test_the_trace_figure_draws(results, tmp_path):
    assert figures.FIGURES["continuous_trace"][1] == ["continuous_trace_capacity", "continuous_trace"]
    assert figures.TRACE_FIGURES["continuous_trace"] == "AzureLLMInferenceTrace_conv.csv"
    _draws(results, tmp_path, "continuous_trace")


@pytest.mark.skipif(not (SHARED_DATA / "AzureLLMInferenceTrace_conv.csv").is_file(),
                    reason="needs the Azure LLM inference trace (shared/data/AzureLLMInferenceTrace_conv.csv); "
                           "see docs/guide/traces.md")
def test_the_trace_capacity_spec_runs_small_multi_bin_beside_eq_2_and_its_limit_the_engine_at_32(tmp_path,
                                                                                                 monkeypatch):
    """continuous_trace_capacity, run small (n = 20,000, 2 replications):
    multi-bin batching's saturated throughput within 2 % of eq. (2) under
    the profile at every k and rising with k; its limit of every batch one
    length within 3 % of the continuous engine's at the same 32 sequences
    (at every iteration both step 32 of them); the engine at 256 above every
    policy run to completion."""
    monkeypatch.setenv("MBBATCH_DATA", str(SHARED_DATA))
    ds = _small("continuous_trace_capacity", tmp_path, ("n = 100000", "n = 20000"), ("reps = 3", "reps = 2"))
    thr = ds["sim_throughput_mean"]
    mbs = ["multibin1", "multibin2", "multibin4", "multibin8"]
    sim = thr.sel(policy=mbs).values
    theory = ds["theory_service_rate"].sel(policy=mbs).values
    assert np.all(np.abs(sim / theory - 1) < 0.02) and np.all(np.diff(sim) > 0)
    limit = float(ds["capacity"].sel(policy="multibin1"))
    assert abs(limit / float(thr.sel(policy="continuous32")) - 1) < 0.03
    assert float(thr.sel(policy="continuous256")) > float(thr.drop_sel(policy="continuous256").max())


def test_the_policy_gains_figure_draws_each_orders_ratio_with_its_paired_interval(results, tmp_path):
    """policy_gains draws; on its synthetic store (the same noise in every order, replication by
    replication) the paired ratio of the mean time to first token is exactly the store's gain, 0.6 for
    shortest predicted output first, 0.75 with aging, 0.9 for multi-bin and 0.8 for the feedback queue,
    with an interval of no width: the markers of the top row sit there, at every rate and predictor error,
    beside the dashed line of FCFS at 1; the legend names the aging rate of the variant's settings; the
    right panel draws each order's capacity under the goodput objective from policy_gains_capacity's
    store; the bottom row, from policy_gains_classes', each order's paired ratio of the interactive
    tenant's p99 time to first token and of the batch tenant's mean latency, exactly the store's, and
    each order's capacity under the interactive tenant's goodput objective."""
    import xarray as xr

    from mbbatch.figures import continuous

    from .figure_datasets import TENANT_CAPACITY, TENANT_GAINS

    _draws(results, tmp_path, "policy_gains")
    data = {name: xr.open_zarr(results / f"{name}.zarr", chunks=None).load()
            for name in ("policy_gains", "policy_gains_capacity", "policy_gains_classes",
                         "policy_gains_classes_capacity")}
    fig = continuous.policy_gains(data)
    top, bottom = fig.subfigs
    left, right = top.subfigs
    first, goodput, latency, capacity = bottom.axes
    for ax, column in ((first, 0), (latency, 1)):
        ys = sorted({round(float(y), 9) for ln in ax.lines if ln.get_marker() not in (None, "None", "")
                     for y in ln.get_ydata()})
        assert ys == sorted({g[column] for name, g in TENANT_GAINS.items() if name != "fcfs"}), ys
    assert first.get_title().startswith("interactive:") and latency.get_title().startswith("batch:")
    assert [t.get_text() for t in capacity.get_xticklabels()] == ["fcfs", "spf", "mlfq", "edf", "vtc"]
    # (the capacity under the interactive tenant's goodput objective: the store's made-up ones, x 1.002)
    marked = [float(y) for ln in capacity.lines if ln.get_marker() not in (None, "None", "") for y in ln.get_ydata()]
    np.testing.assert_allclose(sorted(marked), sorted(1.002 * c for c in TENANT_CAPACITY.values()))
    for ax in left.axes[:3]:
        ys = sorted({round(float(y), 9) for ln in ax.lines if ln.get_marker() not in (None, "None", "")
                     for y in ln.get_ydata()})
        assert ys == [0.6, 0.75, 0.8, 0.9], ys
        assert any(list(ln.get_ydata()) == [1.0, 1.0] and ln.get_linestyle() == "--" for ln in ax.lines)
    labels = [t.get_text() for t in left.legends[0].get_texts()]
    assert "shortest predicted output first, aging 200 tokens/s" in labels
    # (the right panel: each order's capacity under the goodput objective, the store's made-up law: 6 x its
    # factor / (1 + sigma / 10), x 1.002)
    (ax,) = right.axes
    drawn = [ln.get_ydata() for ln in ax.lines if ln.get_marker() in (None, "None", "")]    # (the joining lines)
    sigma = np.array([0.0, 0.5, 1.0])
    for factor in (1.0, 1.15, 1.15 * 0.95, 1.05, 0.9):
        want = 1.002 * 6.0 * factor / (1 + 0.1 * sigma)
        assert any(len(y) == 3 and np.allclose(y, want) for y in drawn), (factor, drawn)


def test_its_spec_runs_small_and_shortest_first_buys_the_mean_with_the_tail(tmp_path):
    """policy_gains's spec, run small (n = 5,000, 4 replications, 95 % load, the oracle and sigma 1): its
    baseline gives shortest predicted output first a decided gain in the mean time to first token at both
    predictor errors, and a p99 latency above FCFS's; FCFS against itself is 0 and 1."""
    ds = _small("policy_gains", tmp_path, ("n = 20000", "n = 5000"), ("reps = 10", "reps = 4"),
                ("rate = [5.5, 6.6, 7.4]", "rate = [7.4]"),
                ("predictor_sigma = [0.0, 0.5, 1.0]", "predictor_sigma = [0.0, 1.0]"))
    spf, fcfs = ds.sel(policy="spf", rate=7.4), ds.sel(policy="fcfs", rate=7.4)
    assert np.all(spf["verdict_mean_ttft"] == 1) and np.all(spf["ratio_mean_ttft_ci_high"] < 0.6)
    assert np.all(spf["ratio_latency_p99"] > 1.0)
    assert np.all(fcfs["diff_mean_ttft"] == 0.0) and np.all(fcfs["ratio_latency_p99"] == 1.0)


def test_the_tenants_spec_runs_small_and_deadlines_and_fair_sharing_favour_the_interactive_tenant(tmp_path):
    """policy_gains_classes's spec, run small (n = 4,000, 4 replications, 85 % load): earliest deadline
    first, fair sharing and shortest predicted output first each bring the interactive tenant's first
    tokens sooner than FCFS (the paired interval below 1), and fair sharing makes the batch
    tenant's later (above 1); each tenant's goodput is a share."""
    from mbbatch.stats import paired_differences

    ds = _small("policy_gains_classes", tmp_path, ("n = 20000", "n = 4000"), ("reps = 10", "reps = 4"),
                ("rate = [2.85, 3.5, 3.9]", "rate = [3.5]"))
    d = paired_differences(ds, "fcfs", 0.95, ["class_mean_ttft"]).sel(rate=3.5)
    for order in ("edf", "vtc", "spf"):
        assert float(d["ratio_class_mean_ttft_ci_high"].sel(policy=order, request_class="interactive")) < 1.0
    assert float(d["ratio_class_mean_ttft_ci_low"].sel(policy="vtc", request_class="batch")) > 1.0
    good = ds["sim_class_goodput"].values
    assert np.all((good >= 0.0) & (good <= 1.0))


def test_the_prefix_caching_figure_draws_each_engines_capacity_and_their_ratio(results, tmp_path):
    """prefix_caching draws; from its synthetic stores (one engine: capacity 20 / (1 + 3 share) without the
    cache, 20 / (1 + 0.1 share) with it; the cluster: 80 / (1 + k share), k 3, 1 and 0.5 without the cache,
    with it least used and cache-aware; all x 1.002) the left panel's lines are the engine's capacities
    against the share, the middle panel's the cluster's, and the right panel's the two ratios, 1 where no
    request shares a prompt."""
    import xarray as xr

    from mbbatch.figures import continuous

    from .figure_datasets import ROUTING_K

    _draws(results, tmp_path, "prefix_caching")
    data = {name: xr.open_zarr(results / f"{name}.zarr", chunks=None).load()
            for name in ("prefix_caching", "prefix_routing")}
    fig = continuous.prefix_caching(data)
    ax, ax_c, ax_r = fig.axes
    share = np.asarray(data["prefix_caching"]["system_prompt_share"].values, dtype=float)

    def joined(a):
        return [ln.get_ydata() for ln in a.lines if ln.get_marker() in (None, "None", "")]

    for k in (3.0, 0.1):
        assert any(np.allclose(y, 1.002 * 20.0 / (1 + k * share)) for y in joined(ax)), k
    for k in ROUTING_K.values():
        assert any(np.allclose(y, 1.002 * 80.0 / (1 + k * share)) for y in joined(ax_c)), k
    one, routed = [ln.get_ydata() for ln in ax_r.lines if ln.get_marker() not in (None, "None", "")]
    np.testing.assert_allclose(one, (1 + 3.0 * share) / (1 + 0.1 * share))
    np.testing.assert_allclose(routed, (1 + 1.0 * share) / (1 + 0.5 * share))
    assert one[0] == pytest.approx(1.0) and routed[0] == pytest.approx(1.0)


def test_the_prefix_caching_spec_runs_small_and_the_cache_carries_more_where_prompts_are_shared(tmp_path):
    """sweeps/prefix_caching.toml on 1,600 requests a probe (16 sequences), one search, two shares: with every request
    carrying a system prompt the cache carries at least 30 % more than the engine without it (about 45 %
    on these seeds: it prefills 2,048 tokens fewer of most requests, and the decodes still bind); with
    none, both engines are one (the same requests, nothing to cache)."""
    ds = _small("prefix_caching", tmp_path, ("n = 8000", "n = 1600"), ("max_num_seqs = 64", "max_num_seqs = 16"),
                ("searches = 3", "searches = 1"),
                ("system_prompt_share = [0.0, 0.25, 0.5, 0.75, 1.0]", "system_prompt_share = [0.0, 1.0]"))
    cap = ds["sim_capacity"]
    on, off = (cap.sel(prefix_caching=c) for c in (True, False))
    assert float(on.sel(system_prompt_share=1.0)) > 1.3 * float(off.sel(system_prompt_share=1.0))
    assert float(on.sel(system_prompt_share=0.0)) == float(off.sel(system_prompt_share=0.0))


@pytest.mark.heavy
def test_the_prefix_routing_spec_runs_small_and_cache_aware_routing_carries_more(tmp_path):
    """(Heavy: 20 s, three searches whose probes near the objective take 24 replications.)
    sweeps/prefix_routing.toml on 2 engines of 8 sequences and 12,000 KV tokens (16 system prompts of 2,048
    tokens: 32,768, more than an engine holds), 1,600 requests a probe, one search a policy, every request
    carrying a system prompt: the cache carries more than no cache, and the cache-aware router at least 10 %
    more than least-used routing (each engine keeps about half the prompts instead of evicting them all;
    2.16, 2.51 and 2.82 requests/s on these seeds)."""
    ds = _small("prefix_routing", tmp_path, ("n = 26000", "n = 1600"), ("engines = 4", "engines = 2"),
                ("max_num_seqs = 64", "max_num_seqs = 8"), ("kv_tokens = 48000.0", "kv_tokens = 12000.0"),
                ("system_prompts = 32", "system_prompts = 16"), ("searches = 3", "searches = 1"),
                ("system_prompt_share = [0.0, 0.25, 0.5, 0.75, 1.0]", "system_prompt_share = [1.0]"))
    cap = ds["sim_capacity"].sel(system_prompt_share=1.0)
    none, least, aware = (float(cap.sel(policy=p)) for p in ("no_cache", "least_used", "cache_aware"))
    assert least > none and aware > 1.1 * least, (none, least, aware)
