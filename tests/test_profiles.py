"""mbbatch.profiles: the shipped measurements, their screening, the fitted
profiles and their errors, a user's own CSV."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

import numpy as np
import pytest

import mbbatch as mb
from mbbatch import profiles
from mbbatch.params import PARAMS

#: four profiles of two GPUs and two model sizes (the hardware_fit figure's), with the held-out
#: (leave-one-out) relative error each must stay below: measured 1.6 %, 2.5 %, 2.9 % (20 rows
#: each) and 12.3 % (11 rows: A100's 70B runs stop at batches of 16); the bounds are 1.5 times
#: that, so a refit that loses a term fails
HELD_OUT = {"H100/vLLM/Meta-Llama-3-8B/tp1": 0.024, "A100/vLLM/Meta-Llama-3-8B/tp1": 0.037,
            "H100/vLLM/Meta-Llama-3-70B/tp4": 0.043, "A100/vLLM/Llama-2-70b-hf/tp4": 0.184}


def test_the_measurements_ship_with_their_license_and_citation():
    folder = resources.files("mbbatch").joinpath("data", "llm_inference_bench")
    readme = folder.joinpath("README.md").read_text()
    assert "BSD 3-Clause" in folder.joinpath("LICENSE").read_text()
    assert "arXiv:2411.00136" in readme
    digest = hashlib.sha256(folder.joinpath("All_results.csv").read_bytes()).hexdigest()
    assert digest in readme and profiles.provenance(profiles.DEFAULT)["data_sha256"] == digest


def test_names_follow_the_data():
    names = profiles.names()
    assert len(names) == 227 and names == sorted(names)
    assert all(re.fullmatch(r"[A-Za-z0-9]+/[A-Za-z.\-]+/[A-Za-z0-9.\-]+/tp[1248]", n) for n in names), names[:5]
    assert set(HELD_OUT) <= set(names) and profiles.DEFAULT in names
    with pytest.raises(ValueError, match=r"profile must be one of the 227 shipped profiles .*got "
                                         r"'H100/vLLM/Meta-Llama-3-8B/tp3'; did you mean H100/vLLM/Meta-Llama-3-8B"):
        profiles.get("H100/vLLM/Meta-Llama-3-8B/tp3")
    with pytest.raises(TypeError, match="profile must be a profile's name .*got int"):
        profiles.get(3)


def test_failed_runs_are_screened_out():
    """A 2,048 + 2,048-token request on a model of a 2,048-token context, 'measured' in 0.05 s, is
    not fitted; nothing else of that group is excluded."""
    t = profiles.measurements("GH200/vLLM/opt-6.7b/tp1")
    assert t.excluded.sum() == 4 and set(t.prompt[t.excluded]) == {2048.0}
    assert np.all(t.service[t.excluded] < 3.0) and np.all(t.service[(t.prompt == 1024.0)] > 7.0)
    assert not profiles.measurements(profiles.DEFAULT).excluded.any()
    assert profiles.fit("GH200/vLLM/opt-6.7b/tp1").n == 16


@pytest.mark.parametrize("name", list(HELD_OUT))
def test_held_out_errors_of_four_profiles(name):
    """Each fitted on its rows and, where measured, its prefill (one row more); the batches alone
    (``prefill=False``) on its rows, their in-sample error the model's on them."""
    res = profiles.fit(name)
    batches = int((~profiles.measurements(name).excluded).sum())
    assert res.holdout == "leave-one-out" and res.n == batches + (name in profiles.prefill_names())
    assert res.holdout_error < HELD_OUT[name]
    assert res.r2 > 0.98 and res.median_error <= res.holdout_error
    m = profiles.get(name)
    assert isinstance(m, mb.IterationModel) and m.profile == name
    alone = profiles.fit(name, prefill=False)
    assert alone.n == batches and alone.r2 > 0.98
    rows = profiles.measurements(name)
    pred = alone.model.service_time(size=rows.size, prompt=rows.prompt, output=rows.output)
    assert np.median(np.abs(pred - rows.service) / rows.service) == pytest.approx(alone.median_error, rel=1e-9)


def test_across_profiles_the_median_held_out_error():
    """The issue's target: the median over the profiles of their held-out errors at most 7 % (measured
    5.4 %; 5.2 % fitted on the batches alone); and against today's DecodeModel fitted to the same rows
    (median 20 %): IterationModel fitted on the batches alone (as DecodeModel is) is
    significantly better on 217 of the 227 (one-sided Wilcoxon signed-rank test of the rows' held-out
    errors, 95 % confidence each), significantly worse on none, and its median held-out error is above
    DecodeModel's on 3 (Gaudi2 with DeepSpeed, 4.95 against 4.60 % and 4.64 against 3.79 %; SambaNova,
    9.9 against 5.4 %; p = 0.59, 0.40 and 0.35 that it is not worse: 11 to 16 rows each, whose
    measurements are not monotone in size and length), where the two medians do not tell the models
    apart (the next test)."""
    from scipy.stats import wilcoxon

    t = profiles.list()
    assert len(t) == 227 and set(t.columns) >= {"name", "hardware", "rows", "excluded", "r2", "holdout_error",
                                                "step", "per_context_token", "per_expert", "experts"}
    assert np.median(t.holdout_error.astype(float)) <= 0.07
    worse, better, significantly_worse = [], 0, []
    for name in t.name:
        rows = profiles.measurements(name)
        keep = ~rows.excluded
        dec = mb.DecodeModel.fit({k: rows[k][keep] for k in ("size", "prompt", "output", "service")})
        it = profiles.fit(name, prefill=False)
        if it.holdout_error > dec.holdout_error:
            worse.append(name)
        a, b = it.holdout_errors, dec.holdout_errors
        ok = np.isfinite(a) & np.isfinite(b)
        better += wilcoxon(a[ok], b[ok], alternative="less").pvalue < 0.05
        if wilcoxon(a[ok], b[ok], alternative="greater").pvalue < 0.05:
            significantly_worse.append(name)
    assert significantly_worse == [] and better >= 215
    assert sorted(worse) == ["Gaudi2/Deepspeed/Meta-Llama-3-8B/tp8", "Gaudi2/Deepspeed/Mistral-7B-v0.1/tp8",
                             "SN40L/sambaflow/Meta-Llama-3-8B/tp8"]


#: the profiles whose IterationModel median held-out error is above DecodeModel's (above), and one
#: of as few rows whose is well below (2.9 against 4.2 %)
TIED = ("Gaudi2/Deepspeed/Meta-Llama-3-8B/tp8", "Gaudi2/Deepspeed/Mistral-7B-v0.1/tp8",
        "SN40L/sambaflow/Meta-Llama-3-8B/tp8")
APART = "Gaudi2/Deepspeed/Qwen2-7B/tp8"


def _medians_above(name: str, draws: int, rng) -> int:
    """Of ``draws`` sets of times drawn from the profile's own fitted IterationModel, on its rows,
    with log-normal noise of its residuals' spread (robust: their median absolute relative
    residual / 0.6745, times sqrt(rows / degrees of freedom)), how many refits give IterationModel
    the larger median held-out error than DecodeModel's, each fitted as the test above fits them."""
    rows = profiles.measurements(name)
    keep = ~rows.excluded
    batches = {k: rows[k][keep] for k in ("size", "prompt", "output")}
    fit = profiles.fit(name)
    mean = np.asarray(fit.model.service_time(**batches), dtype=float)
    rel = (rows.service[keep] - mean) / mean
    sigma = float(np.median(np.abs(rel)) / 0.6745 * np.sqrt(rel.size / fit.dof))
    above = 0
    for _ in range(draws):
        service = mean * np.exp(sigma * rng.standard_normal(mean.size) - sigma * sigma / 2.0)
        it = mb.IterationModel.fit({**batches, "service": service}, weights="relative")
        dec = mb.DecodeModel.fit({**batches, "service": service})
        above += it.holdout_error > dec.holdout_error
    return above


def test_on_three_profiles_the_two_medians_do_not_tell_the_models_apart():
    """Why no refit puts IterationModel's median below DecodeModel's on every profile: on the three
    where it is above, even times drawn from their own fitted IterationModel (the true model by
    construction) with their noise give it the larger median in more than a third of the draws
    (measured 36, 38 and 38 % of 400), so a correct model passes on all three with a chance of
    about 0.25; on a profile of as few rows whose models differ (APART), in 1 %.  The bounds are
    exact binomial (Clopper-Pearson) 95 % confidence bounds on that probability from 150 draws."""
    from scipy.stats import binomtest

    rng = np.random.default_rng(20261127)
    draws = 150
    for name in TIED:
        lo = binomtest(_medians_above(name, draws, rng), draws).proportion_ci(0.95, method="exact").low
        assert lo > 0.2, name
    assert binomtest(_medians_above(APART, draws, rng), draws).proportion_ci(0.95, method="exact").high < 0.1

def test_the_mixtures_of_experts_fit_their_expert_reads():
    """Mixtral's profiles fit per_expert, the time to read one expert's weights: on vLLM, which reads
    the experts a batch routes to, it is the order of an expert's 11 GB over the devices' memory
    bandwidth (1.6 ms on four A100s: 11 GB over 4 x 2 TB/s is 1.4 ms; 2.4 ms on one MI300X, 2.1 ms),
    and the held-out errors drop from 6-20 % (without the term) to 0.5-6 %; engines that read every
    expert at every iteration fit it at about 0."""
    p = profiles.fit("A100/vLLM/Mixtral-8x7B-v0.1/tp4")
    assert p.model.experts == 8 and p.model.experts_per_token == 2
    assert 1.2e-3 < p.params["per_expert"] < 2.0e-3 and p.holdout_error < 0.02
    assert 1.8e-3 < profiles.fit("MI300X/vLLM/Mixtral-8x7B-v0.1/tp1").params["per_expert"] < 3.0e-3
    assert profiles.fit("MI250/vLLM/Mixtral-8x7B-v0.1/tp2").holdout_error < 0.01
    assert profiles.fit("MI300X/llama.cpp/Mixtral-8x7B-v0.1/tp1").params["per_expert"] == 0.0
    rows = profiles.measurements("A100/vLLM/Mixtral-8x7B-v0.1/tp4")
    dense = mb.IterationModel.fit({k: rows[k][~rows.excluded] for k in ("size", "prompt", "output", "service")},
                                  weights="relative")
    assert dense.holdout_error > 0.1
    assert profiles.get(profiles.DEFAULT).experts == 0 and profiles.provenance(profiles.DEFAULT)["per_expert"] == 0


def test_the_default_iteration_model_is_the_default_profile():
    fitted = profiles.fit(profiles.DEFAULT).params
    for k, v in fitted.items():
        assert PARAMS[f"IterationModel.{k}"].default == (float(f"{v:.3g}") if v else 0.0), k
    assert mb.IterationModel().profile is None


def test_a_users_csv_fits_as_the_shipped_rows(tmp_path):
    rows = profiles.measurements(profiles.DEFAULT)
    path = tmp_path / "mine.csv"
    lines = ["batch,isl,osl,latency_s"] + [f"{b},{p:g},{o:g},{float(s)!r}" for b, p, o, s in
                                           zip(rows.size, rows.prompt, rows.output, rows.service)]
    path.write_text("\n".join(lines) + "\n")
    res = profiles.from_csv(path, size="batch", prompt="isl", output="osl", service="latency_s")
    assert res.params == pytest.approx(profiles.fit(profiles.DEFAULT, prefill=False).params, rel=1e-12,
                                       abs=1e-18)
    with pytest.raises(ValueError, match="lacks the columns latency"):
        profiles.from_csv(path, size="batch", prompt="isl", output="osl", service="latency")
    with pytest.raises(FileNotFoundError, match="path: no measurements file"):
        profiles.from_csv(tmp_path / "none.csv")


def test_a_profile_times_every_token_policy():
    """A fitted profile is a service model of the token-level policies like any other."""
    import scipy.stats as st

    m = profiles.get("A100/vLLM/Meta-Llama-3-8B/tp1")
    wl = mb.Workload(prompt=st.uniform(16, 496), output=st.uniform(1, 255))
    res = mb.simulate(mb.StaticBatching(16), mb.Poisson(1.0), workload=wl, service_model=m, n=3000, seed=1,
                      keep_batches=True)
    assert res.completed == 3000 and not res.unstable
    b = res.batches
    assert np.all(b.service >= m.step)


def test_the_index_of_names_is_the_fitted_groups():
    from mbbatch.params import PARAMS

    assert profiles._index() == tuple(profiles.names()) == PARAMS["profile"].choices


SWEEP = """
name = "hardware"
arrivals = "poisson"
service_model = "profile"
reps = 2
seed = 11
policy = "{policy}"
[params]
batch_size = 16
prompt_median = 200.0
prompt_sigma = 0.6
output_median = 80.0
output_sigma = 0.7
{settings}
n = 1500
rate = 0.5
[grid]
profile = ["H100/vLLM/Meta-Llama-3-8B/tp1", "A100/vLLM/Meta-Llama-3-8B/tp1"]
finished = ["leave", "stay"]
"""


POLICIES = {"static": ("d_sla = 0.05\neta = 100000.0", lambda: mb.StaticBatching(16)),
            "multibin": ("bins = 2", lambda: mb.MultiBin(bins=2, batch_size=16))}


@pytest.mark.parametrize("kind", POLICIES)
def test_a_sweep_with_a_profile_axis_is_simulate_per_cell(tmp_path, kind):
    """Each cell of a profile axis equals mb.simulate under that profile's model, with the cell's seed, for a
    token policy and for multi-bin batching; the store records each profile's provenance (data hash,
    coefficients, errors)."""
    import dataclasses
    import json

    import scipy.stats as st

    from mbbatch.sweeps import run_sweep
    from mbbatch.sweeps.cells import cell_seed
    from mbbatch.sweeps.spec import parse_spec

    settings, policy = POLICIES[kind]
    spec = parse_spec(SWEEP.format(policy=kind, settings=settings))
    ds = run_sweep(spec, tmp_path / "hw.zarr", workers=1, progress=False).load()
    stored = json.loads(ds.attrs["profiles"])
    assert set(stored) == {"H100/vLLM/Meta-Llama-3-8B/tp1", "A100/vLLM/Meta-Llama-3-8B/tp1"}
    for name, prov in stored.items():
        assert prov["data_sha256"] == profiles.provenance(name)["data_sha256"]
        assert prov["step"] == profiles.fit(name).params["step"]
    wl = mb.Workload(prompt=st.lognorm(0.6, scale=200.0), output=st.lognorm(0.7, scale=80.0))
    for _, params in spec.points():
        model = dataclasses.replace(profiles.get(params["profile"]), finished=params["finished"])
        for rep in range(2):
            res = mb.simulate(policy(), mb.Poisson(0.5), workload=wl, service_model=model, n=1500,
                              seed=cell_seed(11, params, rep))
            got = ds.sel(profile=params["profile"], finished=params["finished"], rep=rep)
            assert float(got["sim_throughput"]) == res.throughput
            assert float(got["sim_mean_latency"]) == res.mean_latency
    # the measured profiles differ, and so do their runs
    lat = ds["sim_mean_latency"].mean("rep")
    assert float(lat.sel(profile="A100/vLLM/Meta-Llama-3-8B/tp1", finished="leave")) > float(
        lat.sel(profile="H100/vLLM/Meta-Llama-3-8B/tp1", finished="leave"))


@pytest.mark.parametrize("spec, context", [("hardware_policies", 256.0 + 128.0 / 2),
                                           ("hardware_trace", 1020.0 + 129.0 / 2)])
def test_the_hardware_specs_d_sla_is_the_profiles_sla_target(spec, context):
    """The specs' D_SLA per profile: sla_target at the workload's median prompt plus half its median output
    (the Azure conversation trace's medians: 1,020 and 129 tokens), to 0.1 ms."""
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:     # (Python 3.10: the backport, a dependency there)
        import tomli as tomllib

    raw = tomllib.loads((Path(__file__).resolve().parents[1] / "sweeps" / f"{spec}.toml").read_text())
    assert raw["service_model"] == "profile"
    for name, variant in raw["policies"].items():
        want = round(profiles.sla_target(profiles.get(variant["profile"]), context), 4)
        assert variant["d_sla"] == want, name


def test_sla_target_keeps_the_papers_headroom():
    assert profiles.SLA_HEADROOM == pytest.approx(7.4 / 5.74)
    m = profiles.get(profiles.DEFAULT)
    assert profiles.sla_target(m, 320.0) == pytest.approx(7.4 / 5.74 * float(m.decode_step(1, 320.0)))
    assert profiles.sla_target(m, 320.0) > float(m.decode_step(1, 320.0)) > 0.0074   # the default D_SLA: unmet
    with pytest.raises(TypeError, match="model must be an IterationModel"):
        profiles.sla_target(mb.DecodeModel(), 320.0)
    with pytest.raises(ValueError, match=r"headroom must be in \(0, inf\)"):
        profiles.sla_target(m, 320.0, headroom=0.0)


def test_docstring_examples():
    import doctest

    assert doctest.testmod(profiles, optionflags=doctest.ELLIPSIS).failed == 0


def test_a_users_malformed_csv_is_refused_naming_what_is_wrong(tmp_path):
    """csv.DictReader kept the last of two columns of one name (the fit silently read it), gave a
    short row's missing fields as None (float(None): a TypeError naming nothing), read a comment
    line as a row and a Latin-1 byte as a UnicodeDecodeError; path=None, size=None and size=3
    failed inside pathlib, a dict and str.join; a size of 2**63 wrapped to -2**63 in int64.  Each
    is now refused before the fit, naming the parameter (or the file's line) and the value."""
    good = ["size,prompt,output,service"] + [f"{b},{p},{o},{s}" for b, p, o, s in (
        (1, 128, 128, 1.0), (2, 256, 128, 1.5), (4, 512, 256, 3.0), (8, 128, 512, 5.0), (16, 1024, 64, 4.0),
        (32, 64, 1024, 12.0), (1, 2048, 16, 0.8), (64, 256, 256, 9.0))]

    def csv(name, lines, encoding="utf-8"):
        path = tmp_path / name
        path.write_bytes(("\n".join(lines) + "\n").encode(encoding))
        return path

    assert profiles.from_csv(csv("good.csv", good)).n == 8
    cases = [
        (csv("dup.csv", [good[0] + ",service"] + [r + ",99" for r in good[1:]]), {},
         r"^service: '.*dup\.csv' has 2 columns named 'service' \(fields 4, 5 of its header\)"),
        (csv("short.csv", good[:3] + ["4,512"] + good[4:]), {},
         r"^path: line 4 of '.*short\.csv' has 2 fields where its header has 4 \('4,512'\)"),
        (csv("comment.csv", good[:3] + ["# measured on an H100"] + good[3:]), {},
         r"^path: line 4 of '.*comment\.csv' is a comment \('# measured on an H100'\)"),
        (csv("latin1.csv", good + ["8,128,512,5.0,café"], "latin-1"), {},
         r"^path: '.*latin1\.csv' is not UTF-8 text \(byte b'\\xe9' at offset \d+\); save it as UTF-8$"),
        (csv("big.csv", good[:2] + ["9223372036854775808,256,128,1.5"] + good[3:]), {},
         r"^size: column 'size' of '.*big\.csv' must hold whole numbers of requests in \[1, 2\*\*63\); line 3 has "
         r"'9223372036854775808'$"),
    ]
    for path, kw, match in cases:
        with pytest.raises(ValueError, match=match):
            profiles.from_csv(path, **kw)
    for kw, match in ((dict(path=None), r"^path must be a path \(str or os\.PathLike\) of a CSV file; got None "
                                        r"\(NoneType\)$"),
                      (dict(size=None), r"^size must be a column's name \(str\); got None \(NoneType\)$"),
                      (dict(size=3), r"^size must be a column's name \(str\); got 3 \(int\)$"),
                      (dict(prefill=1.5), r"^prefill must be a column's name \(str\) or None; got 1\.5 \(float\)$")):
        with pytest.raises(TypeError, match=match):
            profiles.from_csv(**{"path": tmp_path / "good.csv", **kw})


def test_profile_lookups_refuse_the_wrong_kind_naming_the_parameter():
    """profiles.get([name]) said "unhashable type: 'list'" (the fit's cache was asked first),
    sla_target(model, context=[320.0]) "only 0-dimensional arrays can be converted", and
    headroom=True was taken for 1.0: the name, the context and the headroom are checked first
    (the latter two as the parameter table's context and headroom)."""
    m = profiles.get(profiles.DEFAULT)
    with pytest.raises(TypeError, match=r"^profile must be a profile's name \(str; .*\); got list$"):
        profiles.get([profiles.DEFAULT])
    with pytest.raises(TypeError, match=r"^profile must be a profile's name .*; got list$"):
        profiles.fit([profiles.DEFAULT])
    with pytest.raises(TypeError, match=r"^context must be a real number in \[0, inf\); got \[320\.0\] \(list\)$"):
        profiles.sla_target(m, context=[320.0])
    with pytest.raises(ValueError, match=r"^context must be in \[0, inf\); got nan$"):
        profiles.sla_target(m, context=float("nan"))
    with pytest.raises(TypeError, match=r"^headroom must be a real number in \(0, inf\); got True \(bool\)$"):
        profiles.sla_target(m, context=320.0, headroom=True)
    assert profiles.sla_target(m, 320) == profiles.sla_target(m, 320.0)


def test_every_profile_states_what_its_data_identify_and_its_release():
    """``list()`` names, for every profile, the coefficients its data do not
    identify (none is silently 0): LLM-Inference-Bench's batches (prompt =
    output) never identify the prefill rate, its measured prefill does
    (each of the 26 profiles with one), the prefill's attention is not
    fitted, and the release the measurements ran on is stated."""
    t = profiles.list()
    assert all("prefill_attention (not fitted)" in u for u in t.unidentified)
    measured = set(profiles.prefill_names())
    assert list(t.prefill_measured) == [n in measured for n in t.name]
    assert all(("prefill_per_token" in u) != (n in measured) for n, u in zip(t.name, t.unidentified))
    assert all("prefill_per_token" in profiles.unidentified(profiles.fit(n, prefill=False)) for n in measured)
    assert all(r.startswith(f) and "2024" in r for r, f in zip(t.engine_release, t.framework))
    res = profiles.fit("H100/vLLM/Meta-Llama-3-70B/tp4")
    assert res.identification["step"] == "identified"
    assert profiles.unidentified(res) == ", ".join(f"{k} ({v})" for k, v in res.identification.items()
                                                   if v != "identified")


def test_a_profile_is_fitted_with_its_measured_prefill_which_identifies_its_prefill_rate():
    """LLM-Inference-Bench's prefill of 16 prompts of 1,024 tokens, fitted
    with the profile's batches (the default where measured): the prefill
    rate is identified (25.5 us/token on the H100 for Llama-3-8B, its
    standard error 6 %; the batches alone leave it at 0), the batches fit
    about as well as without it, and the model's prefill of that batch is
    the measured one."""
    assert len(profiles.prefill_names()) == 26 and profiles.DEFAULT in profiles.prefill_names()
    alone, joint = profiles.fit(profiles.DEFAULT, prefill=False), profiles.fit(profiles.DEFAULT)
    assert profiles.fit(profiles.DEFAULT, prefill=True) is joint
    assert "prefill_per_token" in profiles.unidentified(alone) and alone.params["prefill_per_token"] == 0.0
    assert joint.identification["prefill_per_token"] == "identified"
    assert 2.3e-5 < joint.params["prefill_per_token"] < 2.8e-5
    assert joint.stderr["prefill_per_token"] < 0.1 * joint.params["prefill_per_token"]
    m = profiles.get(profiles.DEFAULT)
    assert m.profile == profiles.DEFAULT
    assert alone.model.profile == profiles.DEFAULT + profiles.BATCHES_ONLY_SUFFIX
    assert float(m.times(size=16, prompt=1024, output=1).ttft) == pytest.approx(0.42567, rel=0.02)
    # its batches: the same rows, fitted about as well (in sample)
    rows = profiles.measurements(profiles.DEFAULT)
    err = np.median(np.abs(m.service_time(size=rows.size, prompt=rows.prompt, output=rows.output) / rows.service
                           - 1.0))
    assert err < alone.median_error + 0.005
    assert profiles.provenance(profiles.DEFAULT)["prefill_measured"]
    # a profile without a measured prefill: its batches alone, whatever is asked but True
    other = "H100/vLLM/Meta-Llama-3-70B/tp4"
    assert profiles.fit(other) is profiles.fit(other, prefill=False) and profiles.get(other).profile == other
    with pytest.raises(ValueError, match="measured no prefill"):
        profiles.fit(other, prefill=True)
    with pytest.raises(TypeError, match="prefill must be None, True or False"):
        profiles.fit(profiles.DEFAULT, prefill="yes")


def test_a_fit_takes_rows_that_time_one_phase_each():
    """Rows that measured the whole batch and rows that measured only its
    prefill, NaN where not measured, fit together; a row measuring nothing
    is refused, naming it."""
    rows = profiles.measurements(profiles.DEFAULT)
    n = len(rows.size)
    mixed = dict(size=np.append(rows.size, 16), prompt=np.append(rows.prompt, 1024.0),
                 output=np.append(rows.output, 1.0), service=np.append(rows.service, np.nan),
                 prefill=np.append(np.full(n, np.nan), 0.42566500790417194))
    res = mb.IterationModel.fit(mixed, weights="relative")
    assert res.params == pytest.approx(profiles.fit(profiles.DEFAULT).params, rel=1e-12, abs=1e-18)
    mixed["service"][0] = np.nan
    with pytest.raises(ValueError, match="row 0 measures no time"):
        mb.IterationModel.fit(mixed, weights="relative")
