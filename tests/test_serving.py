"""Serving runs and the fit from them (mbbatch/serving.py): a run read from
``vllm bench serve``'s file, its metrics on one definition for measured and
replayed requests, the replay equal to the simulation it stands for, and a
fit that recovers the iteration model which wrote a run, with its held-out
error.  (The measured runs' fits: tests/test_validation_serving.py.)"""

import json
import math

import numpy as np
import pytest

import mbbatch as mb
from mbbatch import serving

#: the engine that "measures" the synthetic runs: an iteration model unlike the defaults
TRUTH = mb.IterationModel(step=0.02, per_sequence=2e-4, per_context_token=1.5e-7, prefill_per_token=6e-5,
                          prefill_attention=0.0)
OVERHEAD = 0.03
SETTINGS = dict(max_num_seqs=32, max_batched_tokens=1024, chunked_prefill=True, block_size=16)


def _measured(rate, n=160, seed=1):
    """A run measured on TRUTH: Poisson arrivals at ``rate``, lengths from a log-normal workload."""
    rng = np.random.default_rng(seed)
    prompt = np.round(rng.lognormal(6.0, 0.6, n)).clip(8, 4000)
    output = np.round(rng.lognormal(5.0, 0.7, n)).clip(2, 2000)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    arrival -= arrival[0]
    res = mb.simulate(mb.ContinuousBatching(**SETTINGS, request_overhead=OVERHEAD), mb.Replay(arrival),
                      workload=mb.Workload(prompt=prompt, output=output), service_model=TRUTH, n=n,
                      keep_requests=True, seed=0)
    return arrival, prompt, output, res.requests.ttft, res.requests.latency


def _bench_file(path, arrival, prompt, output, ttft, latency, failed=()):
    """What ``vllm bench serve --save-result --save-detailed`` writes (the keys read), absolute start times."""
    itls = [[(lat - t) / (o - 1)] * int(o - 1) for t, lat, o in zip(ttft, latency, output)]
    doc = {"model_id": "synthetic/model", "start_times": list(1000.0 + arrival), "input_lens": list(prompt),
           "output_lens": list(output), "ttfts": list(ttft), "itls": itls,
           "errors": ["boom" if i in failed else "" for i in range(len(ttft))]}
    path.write_text(json.dumps(doc))
    return path


def test_summarize_computes_each_metric_by_its_definition():
    arrival = np.array([0.0, 1.0, 2.0])
    output = np.array([1.0, 3.0, 5.0])
    ttft = np.array([0.1, 0.2, 0.3])
    lat = np.array([0.1, 0.6, 1.1])
    got = serving.summarize(arrival, output, ttft, lat)
    assert got["ttft_mean"] == pytest.approx(0.2) and got["ttft_p50"] == pytest.approx(0.2)
    # token-weighted: (0.4 + 0.8) / (2 + 4); the per-request ones over requests with a second token
    assert got["tpot_mean"] == pytest.approx(1.2 / 6) and got["tpot_p50"] == pytest.approx(0.2)
    assert got["throughput"] == pytest.approx(9.0 / 3.1)
    assert list(got) == list(serving.METRICS)
    half = serving.summarize(arrival, output, ttft, lat, np.array([True, True, False]))
    # (a subset's throughput is its own: its 4 tokens from its first arrival, 0, to its last completion, 1.6)
    assert half["throughput"] == pytest.approx(4.0 / 1.6) and half["e2e_mean"] == pytest.approx(0.35)


def test_a_bench_file_reads_as_its_requests_in_arrival_order(tmp_path):
    arrival, prompt, output, ttft, lat = _measured(2.0, n=40)
    order = np.arange(40)[::-1]   # the file lists them in any order
    path = _bench_file(tmp_path / "run.json", arrival[order], prompt[order], output[order], ttft[order],
                       lat[order], failed={0})
    run = serving.read_vllm_bench(path, settings=SETTINGS)
    assert run.n == 39 and run.model == "synthetic/model" and run.arrival[0] == 0.0
    assert np.all(np.diff(run.arrival) >= 0)
    np.testing.assert_allclose(run.latency, lat[:39], rtol=1e-9)
    assert run.measured["ttft_mean"] == pytest.approx(np.mean(ttft[:39]))
    # a file without the requests' times says how to get them
    (tmp_path / "bare.json").write_text(json.dumps({"ttfts": [0.1]}))
    with pytest.raises(ValueError, match="--save-detailed"):
        serving.read_vllm_bench(tmp_path / "bare.json")


def test_a_run_refuses_inconsistent_requests():
    with pytest.raises(ValueError, match="latency has 2 values for 3"):
        serving.ServingRun.from_requests("r", [0, 1, 2], [5, 5, 5], [3, 3, 3], [0.1, 0.1, 0.1], [1, 1])
    with pytest.raises(ValueError, match="0 <= ttft <= latency"):
        serving.ServingRun.from_requests("r", [0, 1], [5, 5], [3, 3], [0.5, 0.1], [0.2, 1.0])


def test_the_replay_is_the_simulation_and_data_parallel_replicas_take_turns():
    arrival, prompt, output, ttft, lat = _measured(4.0, n=60)
    run = serving.ServingRun.from_requests("r", arrival, prompt, output, ttft, lat, settings=SETTINGS)
    got_ttft, got_lat = serving.replay(run, TRUTH, request_overhead=OVERHEAD)
    np.testing.assert_array_equal(got_ttft, ttft)
    np.testing.assert_array_equal(got_lat, lat)
    two = serving.ServingRun.from_requests("r2", arrival, prompt, output, ttft, lat, settings=SETTINGS, dp=2)
    t2, _ = serving.replay(two, TRUTH)
    odd = mb.simulate(mb.ContinuousBatching(**SETTINGS), mb.Replay(arrival[1::2] - arrival[1]),
                      workload=mb.Workload(prompt=prompt[1::2], output=output[1::2]), service_model=TRUTH,
                      n=30, keep_requests=True, seed=0)
    np.testing.assert_array_equal(t2[1::2], odd.requests.ttft)


def test_a_fit_recovers_the_engine_that_wrote_the_runs_and_predicts_a_load_it_did_not_see(tmp_path):
    """Three runs of one engine at three loads (read from bench files), the
    fit started from the defaults: every held-out run's metrics within a
    median 2 %, and the iteration's fixed time within 5 % of the truth.
    (The terms that trade off against each other in these runs' metrics are
    further off: per_sequence 0.174 ms against 0.2, request_overhead 26 ms
    against 30, what the docs say about reading the coefficients.)"""
    runs = [serving.read_vllm_bench(_bench_file(tmp_path / f"r{k}.json", *_measured(rate, seed=k)),
                                    settings=SETTINGS, name=f"rate{rate}")
            for k, rate in enumerate((1.0, 3.0, 6.0))]
    fit = mb.profiles.from_serving(runs, terms=("step", "per_sequence", "per_context_token", "prefill_per_token",
                                                "request_overhead"))
    assert fit.holdout == "leave one deployment out" and set(fit.heldout) == {r.name for r in runs}
    assert fit.median_heldout() < 0.02, str(fit)
    assert max(abs(e) for errs in fit.heldout.values() for m, e in errs.items() if m.endswith("_mean")) < 0.05
    assert fit.params["step"] == pytest.approx(TRUTH.step, rel=0.05)
    assert fit.engine(**SETTINGS).request_overhead == fit.overheads["request_overhead"] > 0
    assert fit.model.profile.startswith("serving:") and "held out" in str(fit)


def test_one_run_is_judged_on_its_later_half(tmp_path):
    arrival, prompt, output, ttft, lat = _measured(5.0, n=200, seed=7)
    run = serving.ServingRun.from_requests("one", arrival, prompt, output, ttft, lat, settings=SETTINGS)
    fit = serving.fit(run)
    assert fit.holdout.startswith("one run") and fit.median_heldout() < 0.03
    assert set(fit.heldout["one"]) == set(serving.METRICS)   # (the later half's throughput is its own)


def test_a_fit_refuses_what_it_cannot_do():
    arrival, prompt, output, ttft, lat = _measured(2.0, n=20)
    a = serving.ServingRun.from_requests("a", arrival, prompt, output, ttft, lat, settings=SETTINGS)
    b = serving.ServingRun.from_requests("b", arrival, prompt, output, ttft, lat, settings=SETTINGS,
                                         hardware="other GPU")
    with pytest.raises(ValueError, match="one engine, hardware, model"):
        serving.fit([a, b])
    with pytest.raises(ValueError, match="terms must be distinct names"):
        serving.fit(a, terms=("setup",))
    with pytest.raises(TypeError, match="ServingRun"):
        serving.fit([{"arrival": [0.0]}])
    with pytest.raises(TypeError, match="profiles.from_serving"):
        serving.fit(a, base="H100/vLLM/Meta-Llama-3-8B/tp1")
    means = serving.ServingRun(name="m", deployment="m", source="", engine="", hardware="", model="", tp=1,
                               profile=None, settings=SETTINGS, arrival=arrival, prompt=prompt, output=output,
                               measured={"ttft_mean": 0.1, "tpot_mean": 0.01, "e2e_mean": 1.0})
    with pytest.raises(ValueError, match="needs more measured metrics"):
        serving.fit(means)
    assert math.isnan(serving.fit(means, terms=("step",), holdout=True).median_heldout())

