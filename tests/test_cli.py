"""The command line: errors are one line naming the path or key, with a
non-zero exit status (a traceback only with --debug); Ctrl-C stops a sweep
on one worker within about a second."""

import os
import signal
import subprocess
import sys
import time

import pytest

from mbbatch import cli

from .helpers import ROOT, SMALL, cli_run, take_ctrl_c, write


#: ``mbbatch ARGS`` in this process (tests/helpers.cli_run); the tests of a signal and of the script itself
#: run a process
run = cli_run


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_missing_spec_file_is_one_line(tmp_path):
    one_line_error(run("sweep", tmp_path / "nosuch.toml", "--out", tmp_path / "x.zarr"), "nosuch.toml")


def test_non_utf8_spec_names_the_file(tmp_path):
    """A non-UTF-8 spec gave a decode error without its name."""
    p = tmp_path / "latin1.toml"
    p.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    one_line_error(run("sweep", p, "--out", tmp_path / "x.zarr"), "latin1.toml", "UTF-8")
    assert not (tmp_path / "x.zarr").exists()


def test_store_in_a_path_that_cannot_be_written_is_one_line(tmp_path):
    spec = write(tmp_path, SMALL)
    (tmp_path / "afile").write_text("x")
    one_line_error(run("sweep", spec, "--out", tmp_path / "afile" / "s.zarr"), "afile", "not a folder")
    # /proc takes no new files, even for root
    one_line_error(run("sweep", spec, "--out", "/proc/mbbatch-test.zarr"), "/proc/")


def test_check_of_something_else_is_one_line(tmp_path):
    one_line_error(run("check", tmp_path / "nosuch.zarr"), "nosuch.zarr", "does not exist")
    (tmp_path / "d").mkdir()
    one_line_error(run("check", tmp_path / "d"), "not an mbbatch sweep store")


@pytest.mark.parametrize("exc, needle", [
    (MemoryError(), "out of memory"),
    (OSError(30, "Read-only file system", "/data/s.zarr"), "/data/s.zarr: Read-only file system"),
    (UnicodeDecodeError("utf-8", b"ab\xff", 2, 3, "invalid start byte"), "not UTF-8"),
    (PermissionError(13, "Permission denied", "results/x.zarr"), "results/x.zarr: Permission denied"),
])
def test_errors_become_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch, capsys, exc, needle):
    import mbbatch.sweeps

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(mbbatch.sweeps, "run_sweep", fail)
    argv = ["sweep", str(write(tmp_path, SMALL)), "--out", str(tmp_path / "s.zarr")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(type(exc)):
        cli.main(["--debug", *argv])


def test_ctrl_c_stops_a_one_worker_sweep_within_seconds(tmp_path):
    """A sweep with --workers 1 waited for its running cell (4 s on a 3.4 s
    cell).  Its one cell here would take minutes; Ctrl-C ends the process
    with status 130 and the resume hint in seconds."""
    spec = write(tmp_path, SMALL.replace("n = 4000", "n = 20000000000").replace("reps = 3", "reps = 1")
                 .replace("bins = [1, 3]", "bins = [3]").replace("rate = [0.2, 0.5, 2.0]", "rate = [0.2]"))
    proc = subprocess.Popen([sys.executable, "-m", "mbbatch.cli", "sweep", str(spec), "--out",
                             str(tmp_path / "s.zarr"), "--workers", "1"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                            preexec_fn=take_ctrl_c)
    try:
        assert "cells to compute" in proc.stderr.readline()
        time.sleep(1.0)                       # into the cell
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:           # (a failed check leaves no process behind)
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "run the same command again to resume" in err, err
    assert "Traceback" not in err, err
    # the cell alone takes minutes; stopping must not wait for it
    assert took < 10, took


WARNS_THEN_STOPS = """
import sys, warnings
import mbbatch.sweeps
from mbbatch import cli

def run_sweep(*args, **kwargs):
    warnings.warn("a warning neither unstable nor a store note", RuntimeWarning)
    raise KeyboardInterrupt

mbbatch.sweeps.run_sweep = run_sweep
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_sweeps_other_warnings_are_shown_once_and_the_command_ends(tmp_path):
    """A warning other than the sweep's own (here as an interrupted store write leaves one: a coroutine
    never awaited) is shown once after the run, and the command ends: shown while still recording, each
    was recorded again onto the list being shown, without end (a process, so that a regression fails
    on the timeout instead of hanging the suite)."""
    spec = write(tmp_path, SMALL)
    r = subprocess.run([sys.executable, "-c", WARNS_THEN_STOPS, "sweep", str(spec), "--out", str(tmp_path / "s.zarr")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 130, r.stderr
    assert r.stderr.count("RuntimeWarning: a warning neither unstable nor a store note") == 1, r.stderr
    assert "interrupted" in r.stderr

def test_cli_help_and_theory():
    # (the script itself, once, as a process)
    r = subprocess.run([sys.executable, "-m", "mbbatch.cli", "--help"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "sweep" in r.stdout and "figures" in r.stdout and "theory" in r.stdout
    assert run("--help").stdout == r.stdout
    r = run("theory", "throughput", "--B", "128", "--l-min", "1", "--l-max", "20", "--k", "4")
    assert r.returncode == 0 and float(r.stdout) == pytest.approx(9.970261906558987, rel=1e-12)
    r = run("theory", "throughput", "--B", "128", "--l-min", "1", "--l-max", "20", "--k", "0")
    assert r.returncode == 2 and "--bins (k) must be" in r.stderr
    # an error names the flag (the paper's symbol beside it), its numbers plain
    for args, needle in ((["throughput", "--batch-size", "0", "--l-min", "1", "--l-max", "20", "--bins", "2"],
                          "error: --batch-size (B) must be an integer in [1, inf); got 0"),
                         (["latency", "--batch-size", "8", "--l-min", "1", "--l-max", "20", "--bins", "2",
                           "--rate", "-1"], "error: --rate (lam) must be in (0, inf); got -1.0"),
                         (["service-time", "--batch-size", "8", "--l-min", "5", "--l-max", "2", "--bins", "2"],
                          "error: --l-max must be greater than l_min; got l_max=2.0, l_min=5.0")):
        assert needle in one_line_error(run("theory", *args))
    r = run("theory", "batch-service-time", "--dist", "expon", "--scale", "10", "--B", "200",
                "--edges", "0", "inf")
    assert r.returncode == 0 and float(r.stdout) == pytest.approx(58.780309481214, rel=1e-12)  # H_200 / 0.1
    r = run("theory", "optimal-boundaries", "--dist", "nosuch", "--B", "4", "--k", "2")
    assert r.returncode == 2 and "dist" in r.stderr


def test_theory_edges_take_a_rule_as_a_spec_names_it():
    """`--edges` of batch-service-time takes numbers or the rule a spec and `mbbatch simulate` take
    (equal_mass, lemma_a1, optimal) with --bins: the same edges the simulation and theory use."""
    import scipy.stats as st

    from mbbatch import theory
    from mbbatch.lengths import as_service

    def value(*args):
        r = run("theory", "batch-service-time", *args)
        assert r.returncode == 0, r.stderr
        return float(r.stdout)

    uni = ("--dist", "uniform", "--loc", "1", "--scale", "19", "--batch-size", "128")
    assert value(*uni, "--edges", "equal_mass", "--bins", "4") == value(*uni, "--edges", "1", "5.75", "10.5",
                                                                        "15.25", "20")
    exp = ("--dist", "expon", "--scale", "10", "--batch-size", "200")
    law = st.expon(scale=10)
    assert value(*exp, "--edges", "lemma_a1", "--bins", "4") == pytest.approx(
        theory.batch_service_time(law, theory.exponential_boundaries(200, 0.1, 4), 200), rel=1e-12)
    assert value(*exp, "--edges", "equal_mass", "--bins", "3") == pytest.approx(
        theory.batch_service_time(law, as_service(law, "dist").equal_mass_edges(3), 200), rel=1e-12)
    assert value(*exp, "--edges", "optimal", "--bins", "4") <= value(*exp, "--edges", "lemma_a1", "--bins", "4")
    for args, needle in (((*exp, "--edges", "optimal"), "--edges optimal needs --bins (k)"),
                         ((*uni, "--edges", "lemma_a1", "--bins", "2"), "--edges lemma_a1 is Lemma A.1's edges"),
                         ((*exp, "--edges", "wide"), "--edges takes k+1 numbers or one of equal_mass")):
        assert needle in one_line_error(run("theory", "batch-service-time", *args))



def test_cli_theory_on_a_measured_engine():
    """iteration-batch-service-time: eq. (2) under a profile's model at the simulation's equal-mass edges,
    as the sweeps store it; a bad profile or batch size is named."""
    import scipy.stats as st

    import mbbatch as mb
    from mbbatch import theory

    lengths = ["--prompt-median", "256", "--prompt-sigma", "0.6", "--output-median", "128", "--output-sigma", "1"]
    r = run("theory", "iteration-batch-service-time", "--batch-size", "32", "--bins", "4", "--finished", "stay",
                *lengths)
    wl = mb.Workload(prompt=st.lognorm(0.6, scale=256), output=st.lognorm(1.0, scale=128))
    model = mb.IterationModel(**{**vars(mb.profiles.get(mb.profiles.DEFAULT)), "finished": "stay"})
    edges = mb.simulation.plan(mb.MultiBin(bins=4, batch_size=32), mb.Poisson(1.0), n=128, workload=wl,
                               service_model=model).edges
    ov, ow = theory.integer_lengths(wl._output.dist)
    pv, pw = theory.integer_lengths(wl._prompt.dist)
    want = theory.iteration_batch_service_time(model, ov, 32, edges, prompt_mean=float(pv @ pw), weights=ow)
    assert r.returncode == 0 and float(r.stdout) == pytest.approx(want, rel=1e-12)
    r = run("theory", "iteration-batch-service-time", "--batch-size", "32", "--bins", "4", "--profile", "x",
                *lengths)
    assert r.returncode == 2 and "--profile must be one of the 227 shipped profiles" in one_line_error(r)
    r = run("theory", "iteration-batch-service-time", "--batch-size", "0", "--bins", "4", *lengths)
    assert r.returncode == 2 and "--batch-size must be an integer in [1, inf); got 0" in one_line_error(r)


def test_cli_sweep_reports_bad_spec(tmp_path):
    p = write(tmp_path, SMALL.replace("reps = 3", "reps = -1"), "bad.toml")
    r = run("sweep", str(p), "--out", str(tmp_path / "x.zarr"))
    assert r.returncode == 2 and "reps" in r.stderr and "bad.toml" in r.stderr
    assert not (tmp_path / "x.zarr").exists()


def test_cli_sweep_progress_lines_when_not_a_tty(tmp_path):
    p = write(tmp_path, SMALL)
    out = tmp_path / "s.zarr"
    r = run("sweep", str(p), "--out", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "ETA" in r.stderr and "requests/s" in r.stderr and "cells" in r.stderr
    assert "\r" not in r.stderr                       # plain lines, no bar redraws
    assert "no steady state" in r.stderr              # the unstable warning, at the end
    assert "6 grid points done" in r.stdout


def test_simulate_prints_the_metrics_of_one_configuration():
    r = run("simulate", "--policy", "multibin", "--service", "uniform", "--bins", "2", "--batch-size", "8",
            "--l-min", "1", "--l-max", "20", "--rate", "0.3", "--n", "20000", "--reps", "3", "--seed", "5")
    assert r.returncode == 0, r.stderr
    head, *rows = r.stdout.splitlines()
    assert head == "multibin, poisson arrivals, 3 reps, seed 5: mean [95% t-interval over the replications]"
    lines = {ln.split()[0]: ln for ln in rows}
    assert "throughput" in lines and "requests/s" in lines["throughput"] and "[" in lines["throughput"]
    assert "mean_ttft" not in lines                          # a token-policy metric: absent, not NaN
    # the same numbers as the sweep's cell with these parameters
    from mbbatch.sweeps.cells import cell_seed
    import mbbatch as mb
    import scipy.stats as st

    params = {"bins": 2, "batch_size": 8, "edges": "equal_mass", "max_wait": float("inf"), "rate": 0.3,
              "l_min": 1.0, "l_max": 20.0, "n": 20000, "servers": 1, "kind": "multibin"}
    thr = [mb.simulate(mb.MultiBin(bins=2, batch_size=8), mb.Poisson(0.3), st.uniform(1, 19), n=20000,
                       seed=cell_seed(5, params, rep)).throughput for rep in range(3)]
    assert f"{sum(thr) / 3:.6g}" in lines["throughput"]
    # every real metric with its interval, at the level asked for
    from mbbatch import stats
    from mbbatch.metrics import applicable

    reals = [m for m in applicable("multibin").values() if m.aggregated]
    assert all("[" in lines[m.name] for m in reals), [m.name for m in reals if "[" not in lines[m.name]]
    _, lo95, hi95 = stats.t_interval(thr)
    assert f"[{lo95:.6g}, {hi95:.6g}]" in lines["throughput"]
    r = run("simulate", "--policy", "multibin", "--service", "uniform", "--bins", "2", "--batch-size", "8",
            "--l-min", "1", "--l-max", "20", "--rate", "0.3", "--n", "20000", "--reps", "3", "--seed", "5",
            "--confidence", "0.5")
    head, *rows = r.stdout.splitlines()
    assert "mean [50% t-interval over the replications]" in head
    _, lo50, hi50 = stats.t_interval(thr, 0.5)
    assert f"[{lo50:.6g}, {hi50:.6g}]" in {ln.split()[0]: ln for ln in rows}["throughput"]
    assert lo95 < lo50 < hi50 < hi95
    r = run("simulate", "--policy", "multibin", "--service", "uniform", "--bins", "2", "--batch-size", "8",
            "--l-min", "1", "--l-max", "20", "--rate", "0.3", "--n", "2000", "--confidence", "1.5")
    assert r.returncode == 2 and "--confidence must be a number in (0, 1); got 1.5" in r.stderr, r.stderr
    r = run("simulate", "--policy", "multibin", "--service", "uniform", "--bins", "2", "--batch-size", "8",
            "--l-min", "1", "--l-max", "20", "--rate", "0.3", "--n", "2000", "--reps", "1")
    assert "one replication, no intervals (--reps 2 or more" in r.stdout.splitlines()[0]


def test_simulate_warns_when_the_backlog_grows():
    """The table's unstable row was the only sign of an overloaded run; a
    sweep and mb.simulate warn."""
    flags = ["--policy", "multibin", "--service", "uniform", "--bins", "2", "--batch-size", "8", "--l-min", "1",
             "--l-max", "20", "--n", "20000", "--reps", "2"]
    r = run("simulate", *flags, "--rate", "30")    # the service rate: Theorem 4.2, 0.56 requests/s
    assert r.returncode == 0, r.stderr
    assert "unstable                   2 of 2" in r.stdout
    assert r.stderr.strip() == ("warning: 2 of 2 replications have no steady state (the backlog grew through "
                                "the run): the averages describe a transient, not the policy's long-run behaviour")
    r = run("simulate", *flags, "--rate", "0.3")
    assert r.returncode == 0 and "unstable                   0 of 2" in r.stdout and r.stderr == ""


@pytest.mark.parametrize("arrivals, flags, process", [
    ("gamma", ["--rate", "0.3", "--cv", "2"], "Gamma(rate=0.3, cv=2.0)"),
    ("onoff", ["--rate-on", "0.6", "--rate-off", "0.1", "--mean-on", "20", "--mean-off", "30"],
     "OnOff(rate_on=0.6, rate_off=0.1, mean_on=20.0, mean_off=30.0)"),
])
def test_simulate_takes_every_arrival_process_a_spec_takes(arrivals, flags, process):
    """Each arrival process but a trace's (a spec's [workload]), with its
    own flags; the numbers are those of simulate with the cell's seed."""
    import mbbatch as mb
    import scipy.stats as st
    from mbbatch.sweeps.cells import cell_seed
    from mbbatch.sweeps.spec import SPEC_PARAMS

    r = run("simulate", "--policy", "multibin", "--service", "uniform", "--bins", "2", "--batch-size", "8",
            "--l-min", "1", "--l-max", "20", "--n", "5000", "--seed", "3", "--reps", "1", "--arrivals", arrivals,
            *flags)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"multibin, {arrivals} arrivals, 1 rep, seed 3")
    values = dict(zip((f[2:].replace("-", "_") for f in flags[::2]), map(float, flags[1::2])))
    params = {"bins": 2, "batch_size": 8, "edges": "equal_mass", "max_wait": float("inf"), "l_min": 1.0,
              "l_max": 20.0, "n": 5000, "servers": 1, "kind": "multibin", **values}
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8), eval(process, vars(mb)), st.uniform(1, 19), n=5000,
                      seed=cell_seed(3, params, 0))
    thr = next(ln for ln in r.stdout.splitlines() if ln.split()[0] == "throughput")
    assert f"{res.throughput:.6g}" == thr.split()[1]
    # a trace's settings are not flags: they need a spec's [workload] table
    usage = run("simulate", "--help").stdout
    trace_only = [nm for nm, sp in SPEC_PARAMS.items() if {"trace"} in (sp.arrivals, sp.workload)]
    assert trace_only and not any(f"--{nm.replace('_', '-')} " in usage for nm in trace_only)
    assert "%%" not in usage


def test_simulate_takes_boolean_settings_as_a_spec_does():
    """A boolean parameter's flag takes true or false (as a spec's TOML
    does): the numbers are the sweep cell's with the same settings; any
    other word is refused naming the flag."""
    from mbbatch.sweeps.cells import run_point
    from mbbatch.sweeps.spec import spec_from_dict

    params = {"rate": 2.0, "prompt_median": 100.0, "prompt_sigma": 0.5, "output_median": 50.0, "output_sigma": 0.5,
              "n": 800, "dual_queue": False, "dynamic": False}
    flags = [x for k, v in params.items() for x in ("--" + k.replace("_", "-"), str(v).lower())]
    r = run("simulate", "--policy", "laps", "--service-model", "prefill", "--seed", "4", "--reps", "1", *flags)
    assert r.returncode == 0, r.stderr
    spec = spec_from_dict({"name": "s", "policy": "laps", "arrivals": "poisson", "service_model": "prefill",
                           "reps": 1, "seed": 4, "params": params})
    (_, cell), = spec.points()
    assert cell["dual_queue"] is False and cell["dynamic"] is False
    sim = run_point(spec.arrivals, spec.service, cell, spec.seed, spec.reps)
    thr = next(ln for ln in r.stdout.splitlines() if ln.split()[0] == "throughput")
    assert thr.split()[1] == f"{sim['sim_throughput'][0]:.6g}"
    r = run("simulate", "--policy", "laps", "--service-model", "prefill", *flags[:-1], "0")
    assert r.returncode == 2 and "error: argument --dynamic: not true or false: '0'" in r.stderr, r.stderr


def test_simulate_names_the_flag_of_a_bad_value():
    # several missing or bad: all named at once, one line each, by their flags
    r = run("simulate", "--policy", "static", "--arrivals", "onoff", "--n", "100", "--batch-size", "0")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[0].endswith("command line: 4 problems:") and "Traceback" not in r.stderr
    assert sorted(ln.split("(")[0].strip() for ln in lines[1:]) == sorted(
        ["--batch-size must be an integer in [1, inf); got 0"]
        + [f"missing field --{flag}" for flag in ("rate-on", "mean-on", "mean-off")]), lines
    # policy and rate alone: every other flag takes the parameter table's default
    r = run("simulate", "--policy", "static", "--rate", "0.5", "--n", "400")
    assert r.returncode == 0 and r.stdout.startswith("static, poisson arrivals, 5 reps, seed 0"), r.stderr
    one_line_error(run("simulate", "--policy", "static", "--service-model", "decode", "--rate", "-2",
                       "--batch-size", "4", "--n", "100", "--d-sla", "0.01", "--eta", "1000",
                       "--prompt-median", "10", "--prompt-sigma", "0.5", "--output-median", "10",
                       "--output-sigma", "0.5"), "rate must be in (0, inf)")
    r = run("simulate", "--policy", "static", "--service-model", "decode", "--bins", "3", "--batch-size", "4",
            "--n", "100")
    assert r.returncode == 2 and "unknown key --bins (it does not apply to static" in r.stderr, r.stderr


def test_sweep_skips_a_spec_whose_trace_is_absent_only_when_asked(tmp_path):
    spec = tmp_path / "t.toml"
    spec.write_text('name = "t"\npolicy = "multibin"\narrivals = "trace"\nreps = 1\nseed = 1\n'
                    '[workload]\ntrace = "absent.csv"\n[params]\nn = 10\nbins = 2\nbatch_size = 2\n')
    r = run("sweep", str(spec), "--out-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "no trace file 'absent.csv'" in r.stderr and "AzurePublicDataset" in r.stderr
    r = run("sweep", str(spec), "--out-dir", str(tmp_path / "res"), "--skip-missing-traces")
    assert r.returncode == 0 and "note: skipped" in r.stderr, r.stderr
    assert not (tmp_path / "res" / "t.zarr").exists()


def test_profiles_lists_the_matching_fits():
    from mbbatch import profiles

    r = run("profiles", "--match", "H100/vLLM/Meta-Llama-3-8B/")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("profile") and len(lines) == 1 + 3     # tp1, tp2, tp4
    fit = profiles.fit(profiles.DEFAULT)
    row = next(ln for ln in lines if ln.startswith(profiles.DEFAULT + " "))
    assert f"{fit.holdout_error:.1%}" in row and f"{1e3 * fit.params['step']:.3f}" in row
    # a dense model: no expert term; then the coefficients its data do not identify
    assert row.endswith(f" -  {profiles.provenance(profiles.DEFAULT)['unidentified']}")
    moe = run("profiles", "--match", "A100/vLLM/Mixtral").stdout.splitlines()[1]
    name = "A100/vLLM/Mixtral-8x7B-v0.1/tp4"
    assert moe.endswith(f" {1e3 * profiles.fit(name).params['per_expert']:.3f}  "
                        f"{profiles.provenance(name)['unidentified']}")
    one_line_error(run("profiles", "--match", "TPUv9"), "--match: no profile name contains 'TPUv9'")


def test_an_interrupted_capacity_search_says_how_to_resume(tmp_path, monkeypatch, capsys):
    """`mbbatch capacity` keeps its finished searches as `mbbatch sweep`
    does: Ctrl-C gives the same resume hint (it printed "interrupted" alone)."""
    import mbbatch.sweeps

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mbbatch.sweeps, "run_sweep", interrupted)
    spec = write(tmp_path, 'name = "cap"\npolicy = "multibin"\narrivals = "poisson"\nservice = "uniform"\n'
                           'seed = 1\n\n[params]\nbatch_size = 8\nl_min = 1.0\nl_max = 20.0\nn = 3000\n\n'
                           '[grid]\nbins = [1, 2]\n\n[capacity]\nrel_tol = 0.05\n')
    assert cli.main(["capacity", str(spec), "--out", str(tmp_path / "c.zarr")]) == 130
    err = capsys.readouterr().err
    assert "mbbatch capacity: interrupted" in err and "run the same command again to resume" in err, err


def test_simulate_help_shows_every_default():
    """Each flag's help says its default (the parameter table's) or that it is required where it applies."""
    from mbbatch.cli import _simulate_params

    text = " ".join(run("simulate", "--help").stdout.split())
    assert "SLA target D_SLA on the decode time per token, s/token in (0, inf); default 0.0074" in text
    assert "KV-cache token capacity eta, tokens in (0, inf); default 180000" in text
    assert "number of bins, bins in [1, inf); default 4" in text
    assert "arrival rate, requests/s in (0, inf); required where it applies" in text
    assert "replications (default 5;" in text and "root seed (default 0)" in text
    import argparse

    from mbbatch.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["simulate"]
    helps = {a.dest[2:]: a.help for a in sub._actions if a.dest.startswith("p_")}
    assert set(helps) == set(_simulate_params())
    for name, sp in _simulate_params().items():
        # (an optional setting without a table default, such as decode_eta, is unset unless given)
        assert "; default " in helps[name] or "required where it applies" in helps[name] or sp.default is None, name


def test_plot_names_a_folder_that_is_not_a_sweep_store(tmp_path):
    """Bug: `mbbatch plot` on a folder that is not a store gave zarr's "No group found in store ...
    at path ''", and a Zarr store that no sweep wrote was opened and failed later, on whatever
    it lacked.  Each is named as not a sweep store, and why, on one line, before anything is read."""
    import xarray as xr

    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "notes.txt").write_text("not a store")
    (tmp_path / "notes.txt").write_text("not a store")
    xr.Dataset({"a": ("x", [1.0, 2.0])}).to_zarr(tmp_path / "other.zarr", zarr_format=3, consolidated=False)
    for path, why in [("thesis", "it has no zarr.json"), ("notes.txt", "it is a file, not a folder"),
                      ("nosuch.zarr", "no such file or folder"),
                      ("other.zarr", "its zarr.json has no sweep metadata")]:
        r = run("plot", tmp_path / path, "--x", "rate", "--y", "sim_throughput", "--out", tmp_path / "p.png")
        one_line_error(r, f"{tmp_path / path} is not an mbbatch sweep store: {why}")
    assert not (tmp_path / "p.png").exists()


def test_from_serving_fits_bench_files_and_prints_the_spec_keys_that_use_the_fit(tmp_path):
    """``mbbatch from-serving``: two runs' bench files (written by the
    engine itself, tests/test_serving.py) fitted, the held-out error
    printed, and the spec's keys: the iteration model's and the engine's."""
    from .test_serving import SETTINGS, _bench_file, _measured

    files = [str(_bench_file(tmp_path / f"rate{r}.json", *_measured(r, n=80, seed=r))) for r in (2, 5)]
    r = run("from-serving", *files, "--engine", "vllm-v1", "--max-num-seqs", str(SETTINGS["max_num_seqs"]),
            "--max-batched-tokens", str(SETTINGS["max_batched_tokens"]))
    assert r.returncode == 0, r.stderr
    assert "held out (leave one deployment out)" in r.stdout
    keys = dict(line.split(" = ") for line in r.stdout.splitlines() if " = " in line)
    assert keys["service_model"] == '"iteration"' and keys["max_num_seqs"] == "32"
    assert float(keys["iteration_step"]) > 0 and float(keys["request_overhead"]) > 0
    one_line_error(run("from-serving", str(tmp_path / "none.json")), "read_vllm_bench: cannot read")
