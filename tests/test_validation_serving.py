"""Predicted against measured (mbbatch/validation.py; tests/test_validation.py
holds the argument checks of mbbatch/_validation.py): the measured serving
runs read as the sources give them, a replay equal to the simulation it
stands for, the calibration's fit in sample, and the accuracy held out
(leave one deployment out) within the targets on runs no calibration saw.

The runs are read from ../shared/data/serving beside the checkout; where it
is absent these tests skip, saying so (the package does not ship them)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import mbbatch as mb
from mbbatch import validation

from .conftest import SHARED_DATA

SERVING = SHARED_DATA / "serving"
needs_runs = pytest.mark.skipif(not (SERVING / "apex_plus_vllm_runs.csv").is_file(),
                                reason=f"the measured serving runs are not beside the checkout ({SERVING})")


def test_without_the_runs_the_error_names_where_they_are_looked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("MBBATCH_DATA", raising=False)
    with pytest.raises(validation.ServingDataNotFound, match="MBBATCH_DATA"):
        validation.serving_runs()
    with pytest.raises(validation.ServingDataNotFound, match="holds no measured serving runs"):
        validation.serving_runs(tmp_path)
    # the command line skips, saying why, and succeeds
    env = {**os.environ, "MBBATCH_DATA": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "mbbatch.cli", "validate"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "skipped" in out.stdout and str(tmp_path) in out.stdout


@pytest.fixture(scope="module")
def runs():
    return validation.serving_runs(SHARED_DATA)


@needs_runs
def test_the_runs_are_the_sources_runs(runs):
    """APEX's 120 rows less the deployments pooled over replicas and the two
    empty results, and LLMServingSim's 4; 15 have a shipped profile (Llama
    3.1 70B at tensor parallelism 4 on H100s)."""
    assert len(runs) == 98
    timed = [r for r in runs if r.profile is not None]
    assert len(timed) == 15 and {r.profile for r in timed} == {"H100/vLLM/Meta-Llama-3-70B/tp4"}
    assert len({r.deployment for r in timed}) == 9
    r = next(r for r in runs if r.name == "llama_lmsys_05_2DP4TP_0")
    assert (r.n, r.settings["max_batched_tokens"], r.settings["chunked_prefill"]) == (512, 512, True)
    assert r.measured["ttft_mean"] == pytest.approx(0.041008, abs=1e-6)
    assert np.all(np.diff(r.arrival) >= 0) and r.arrival[0] == 0.0


@needs_runs
def test_a_prediction_is_the_replayed_simulation(runs):
    r = next(r for r in runs if r.name == "llama_lmsys_025_2DP4TP_0")
    params = dict(iteration_overhead=1e-3, request_overhead=0.01, prefill_per_token=4e-5)
    got = validation.predict(r, params)
    res = mb.simulate(mb.ContinuousBatching(**r.settings, iteration_overhead=1e-3, request_overhead=0.01),
                      mb.Replay(r.arrival), workload=mb.Workload(prompt=r.prompt, output=r.output),
                      service_model=mb.profiles.get(r.profile).__class__(
                          **{**mb.profiles.get(r.profile).__dict__, "prefill_per_token": 4e-5}),
                      n=r.n, keep_requests=True, seed=0)
    assert got["ttft_mean"] == pytest.approx(res.mean_ttft, rel=1e-12)
    assert got["e2e_mean"] == pytest.approx(res.mean_latency, rel=1e-12)
    with pytest.raises(ValueError, match="no shipped profile"):
        validation.predict(next(r for r in runs if r.profile is None))
    with pytest.raises(ValueError, match="not among the terms"):
        validation.predict(r, {"step": 1.0})


@needs_runs
def test_the_chat_runs_held_out_are_within_the_targets(runs):
    """The chat (lmsys) runs, 3 deployments: each predicted by a
    calibration on the other two, the median |error| over its metrics within
    10 % and its time to first token's within 15 % (the issue's targets; the
    full set, ``mbbatch validate``, is the heavy test's and the docs')."""
    rep = validation.run(runs=[r for r in runs if "lmsys" in r.name], fitted=False)
    assert len(rep.rows) == 5 * 3 and len(rep.calibrations) == 3 and not rep.fits
    assert {r["method"] for r in rep.rows} == {"profile"}
    assert rep.median_error() <= 0.10 and rep.median_error("ttft_mean") <= 0.15
    # what the calibration buys: the profile alone misses the time to first token by 38-46 %
    assert rep.median_error("ttft_mean", uncalibrated=True) > 0.3
    assert "median |error| held out" in str(rep)


@needs_runs
def test_the_runs_without_a_profile_are_fitted_from_their_own_and_held_out(runs):
    """LLMServingSim's four vLLM 0.19 runs (no shipped profile; every
    request's times measured): each group fitted from its run's earlier half
    predicts the later half's metrics within a median 10 %, time to first
    token within 15 % (the issue's targets); the report says how each was
    held out."""
    sim = [r for r in runs if r.source.startswith("LLMServingSim")]
    assert len(sim) == 4 and all(r.per_request for r in sim)
    assert next(r for r in sim if "Qwen3-30B" in r.name).dp == 2
    assert next(r for r in sim if "RTX4090" in r.name).settings["kv_tokens"] == 41408
    rep = validation.run(runs=sim)
    assert rep.calibration is None and len(rep.fits) == 4 and not rep.skipped
    assert {r["method"] for r in rep.rows} == {"from_serving"}
    assert rep.median_error() <= 0.10 and rep.median_error("ttft_mean") <= 0.15
    assert all(f.holdout.startswith("one run") for f in rep.fits.values())
    ds = rep.to_dataset()
    assert set(ds.metric.values) == set(mb.serving.METRICS)
    assert "fitted from 1 run(s)" in str(rep)
    with pytest.raises(ValueError, match="method must be"):
        rep.median_error(method="magic")


@needs_runs
def test_a_calibration_needs_more_measured_means_than_terms(runs):
    with pytest.raises(ValueError, match="needs more than 2 runs"):
        validation.calibrate([r for r in runs if r.profile][:2])
    with pytest.raises(ValueError, match="terms must be"):
        validation.calibrate([r for r in runs if r.profile][:4], terms=("step",))


@pytest.mark.heavy
@needs_runs
def test_every_run_held_out_is_within_the_targets_and_the_docs_quote_it(runs):
    """``mbbatch validate``: every run held out, the 15 with a profile and
    those fitted from their own group's runs, median |error| within 10 %
    (time to first token within 15 %), and the numbers the accuracy page
    quotes are this run's (to their one decimal)."""
    from pathlib import Path

    rep = validation.run(runs=runs)
    assert rep.median_error() <= 0.10 and rep.median_error("ttft_mean") <= 0.15
    for method in validation.METHODS:
        assert rep.median_error(method=method) <= 0.10
    page = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "accuracy.md").read_text()
    for quoted in (rep.median_error(), rep.median_error(method="profile"), rep.median_error(method="from_serving")):
        assert f"{quoted:.1%}" in page
