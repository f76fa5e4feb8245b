"""One grid point (mbbatch.sweeps.cells): its seed depends on its workload
only, and its cells equal reference values recorded before the sweeps were
restructured."""

import math

from mbbatch.sweeps.cells import cell_seed


def test_cell_seed_depends_on_workload_only():
    base = {"bins": 1, "batch_size": 8, "rate": 2.0, "l_min": 1.0, "l_max": 20.0, "n": 100, "servers": 1}
    s = cell_seed(7, base, 0)
    assert cell_seed(7, {**base, "bins": 4, "servers": math.inf}, 0).spawn_key == s.spawn_key
    assert cell_seed(7, {**base, "rate": 3.0}, 0).spawn_key != s.spawn_key
    assert cell_seed(7, base, 1).spawn_key != s.spawn_key
    assert cell_seed(8, base, 0).entropy != s.entropy


# --- reference values --------------------------------------------------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mbbatch.sweeps.cells import run_point  # noqa: E402
from mbbatch.sweeps.schema import time_grid  # noqa: E402
from mbbatch.sweeps.spec import SPEC_PARAMS, load_spec  # noqa: E402

from .helpers import ROOT, SMALL, TOKEN  # noqa: E402

#: cells of every spec in sweeps/, recorded before the sweeps were
#: restructured (and before their specs were regrouped): spec, policy kind,
#: parameters, seed, and every per-rep metric as a hex float or an int
REFERENCE = json.loads((Path(__file__).parent / "data" / "reference_cells.json").read_text())


#: parameters added since the reference was recorded, at the defaults that
#: leave a cell as it was (the oracle predictor)
ADDED_SINCE = {"predictor_sigma": 0.0, "predictor_p": 1.0, "bin_edges": "warmup",
               # the requests' objectives (goodput's), none
               "ttft_slo": math.inf, "tpot_slo": math.inf,
               # the service models' parameters, at the models' defaults
               **{nm: SPEC_PARAMS[nm].default for nm in ("base", "per_token", "linear_alpha", "linear_beta",
                                                         "decode_beta", "prefill_per_token", "gamma",
                                                         "calibrated_alpha", "calibrated_beta", "feedback")}}


def _find(cell):
    """The spec of sweeps/ and its grid point with this cell's parameters."""
    want = {k: (math.inf if v == "inf" else v) for k, v in cell["params"].items()}
    for path in sorted((ROOT / "sweeps").glob("*.toml")):
        if "[workload]" in path.read_text():
            continue            # (the recorded cells predate the trace specs)
        spec = load_spec(path)
        if spec.arrivals != cell["arrivals"] or spec.service != cell["service"] or spec.reps != cell["reps"]:
            continue
        for _, params in spec.points():
            got = {k: v for k, v in params.items() if k not in ("kind", "policy")
                   and not (k in ADDED_SINCE and v == ADDED_SINCE[k])}
            if params["kind"] == cell["policy"] and got == want and spec.seed_of(params) == cell["seed"]:
                return spec, params
    return None, None


@pytest.mark.parametrize("cell", REFERENCE, ids=[f"{c['spec']}-{i}" for i, c in enumerate(REFERENCE)])
def test_cells_equal_their_reference_values_bit_for_bit(cell):
    spec, params = _find(cell)
    assert spec is not None, f"no spec in sweeps/ has the cell {cell['params']} of {cell['spec']} any more"
    sim = run_point(spec.arrivals, spec.service, params, spec.seed_of(params), spec.reps, time_grid(spec))
    for var, ref in cell["metrics"].items():
        got = sim[var]
        if isinstance(ref[0], str):
            assert [float(x).hex() for x in got] == ref, var
        else:
            np.testing.assert_array_equal(got, ref, err_msg=var)


# --- bursty arrivals and predictors in sweeps -------------------------------------------

import warnings  # noqa: E402

from mbbatch.sweeps import run_sweep  # noqa: E402
from mbbatch.sweeps.cells import point_theory  # noqa: E402
from mbbatch.sweeps.spec import SpecError, parse_spec  # noqa: E402

BURSTY = """
name = "bursty"
description = "bursty arrivals"
policy = "multibin"
arrivals = "{arrivals}"
service = "uniform"
reps = 2
seed = 3

[params]
batch_size = 8
l_min = 1.0
l_max = 20.0
n = 3000
{params}

[grid]
bins = [1, 4]
{grid}
"""


@pytest.mark.parametrize("arrivals, params, grid", [
    ("gamma", "rate = 0.3", "cv = [0.5, 4.0]"),
    ("onoff", "rate_off = 0.0\nmean_on = 1.0\nmean_off = 3.0", "rate_on = [1.2, 2.0]"),
])
def test_bursty_arrivals_are_sweep_axes_with_their_closed_form_throughput(tmp_path, arrivals, params, grid):
    """A gamma or ON/OFF spec runs; the closed-form throughput is min(mean
    rate, service rate) whatever the process, and no Poisson latency is
    claimed for it."""
    p = tmp_path / "s.toml"
    p.write_text(BURSTY.format(arrivals=arrivals, params=params, grid=grid))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mb_unstable())       # (rate_on = 2 overloads one bin)
        ds = run_sweep(p, tmp_path / "s.zarr", workers=1, progress=False).load()
    rate = 0.3 if arrivals == "gamma" else ds["rate_on"] * 1.0 / 4.0
    want = np.minimum(rate, ds["theory_service_rate"]).transpose(*ds["theory_throughput"].dims)
    np.testing.assert_allclose(ds["theory_throughput"], want, rtol=1e-12)
    assert bool(np.isnan(ds["theory_latency"]).all())
    assert ds.attrs["arrivals"] == arrivals


def mb_unstable():
    from mbbatch.results import UnstableWarning

    return UnstableWarning


PREDICTED = BURSTY.format(arrivals="saturated", params="", grid="predictor_sigma = [0.0, 0.5]")


def test_a_predictor_axis_keeps_the_requests_of_its_cells(tmp_path):
    """Cells that differ only in the predictor see the same requests: with
    one bin the predictor is moot, so its cells are identical; with four,
    a noisy predictor lowers the saturated throughput (paired, same seed)."""
    p = tmp_path / "s.toml"
    p.write_text(PREDICTED)
    ds = run_sweep(p, tmp_path / "s.zarr", workers=1, progress=False).load()
    one = ds["sim_throughput"].sel(bins=1)
    np.testing.assert_array_equal(one.sel(predictor_sigma=0.0), one.sel(predictor_sigma=0.5))
    four = ds["sim_throughput"].sel(bins=4)
    assert bool((four.sel(predictor_sigma=0.5) < four.sel(predictor_sigma=0.0)).all())


def test_one_predictor_per_cell(tmp_path):
    text = PREDICTED.replace("[params]", "[params]\npredictor_p = 0.5")
    with pytest.raises(SpecError, match="set one predictor, not both"):
        from mbbatch.sweeps.cells import check_points

        check_points(parse_spec(text, source="s.toml"))
    assert point_theory("gamma", "uniform", {"kind": "static"}) == {"unstable": False}


def test_optimal_edges_are_a_sweep_choice_of_multibin():
    """edges = "optimal": eq. (2)'s minimising edges, so the closed-form batch
    service time is at most that of equal mass and of Lemma A.1."""
    from mbbatch.policies.multibin import spec_edges

    base = {"kind": "multibin", "batch_size": 200, "mu": 0.1, "bins": 4, "servers": 1, "max_wait": math.inf,
            "rate": 1.0}
    ets = {rule: point_theory("poisson", "expon", {**base, "edges": rule})["theory_mean_batch_service"]
           for rule in ("equal_mass", "lemma_a1", "optimal")}
    assert ets["optimal"] <= ets["lemma_a1"] <= ets["equal_mass"]
    e = spec_edges({**base, "edges": "optimal"})
    assert e.shape == (5,) and e[0] == 0.0 and np.isinf(e[-1])
    text = SMALL.replace('[params]', '[params]\nedges = "optimal"')
    assert parse_spec(text, source="s.toml").params["edges"] == "optimal"


def test_optimal_edges_under_uniform_service():
    """Uniform service with edges = "optimal": every such spec was refused
    (its closed forms read mu = None as exponential service: "unsupported
    operand type(s) for /: 'float' and 'NoneType'").  Its batch service time
    is eq. (2)'s at the optimal edges; for uniform service those are the
    equal-width (equal-mass) edges, so it is Theorem 4.2's."""
    import scipy.stats as st

    from mbbatch import theory
    from mbbatch.sweeps.cells import check_points

    text = SMALL.replace('[params]', '[params]\nedges = "optimal"')
    check_points(parse_spec(text, source="s.toml"))
    base = {"kind": "multibin", "batch_size": 8, "l_min": 1.0, "l_max": 20.0, "bins": 3, "servers": 1,
            "max_wait": math.inf, "rate": 0.5}
    got = point_theory("poisson", "uniform", {**base, "edges": "optimal"})["theory_mean_batch_service"]
    dist = st.uniform(1.0, 19.0)
    want = theory.batch_service_time(dist, theory.optimal_boundaries(dist, 8, 3), 8)
    assert got == want
    np.testing.assert_allclose(theory.optimal_boundaries(dist, 8, 3), np.linspace(1.0, 20.0, 4), rtol=1e-12)
    equal = point_theory("poisson", "uniform", {**base, "edges": "equal_mass"})["theory_mean_batch_service"]
    assert got == pytest.approx(equal, rel=1e-12)


# --- the batch service model's parameters ---------------------------------------------------

def _service_spec(model: str, params: str, grid: str) -> str:
    """A dynamic-batching spec (helpers.TOKEN) under service model ``model``."""
    return TOKEN.replace('service_model = "decode"', f'service_model = "{model}"').format(
        policy="dynamic", arrivals="poisson", extra="b_max = 64\n" + params, grid="rate = [2.0]\n" + grid)


@pytest.mark.parametrize("model", ["max", "linear", "decode", "calibrated"])
def test_a_cells_service_model_is_the_models_default_unless_the_spec_sets_it(model):
    from mbbatch.service_models import SERVICE_MODELS
    from mbbatch.sweeps.cells import service_model

    (_, params), = parse_spec(_service_spec(model, "", ""), source="s.toml").points()
    assert service_model(model, params) == SERVICE_MODELS[model]()


@pytest.mark.parametrize("model, params, grid, want", [
    ("max", "base = 0.01", "per_token = [0.001, 0.002]", {"base": 0.01, "per_token": 0.002}),
    ("linear", "linear_beta = 0.2", "base = [0.0, 0.05]", {"base": 0.05, "alpha": 1e-3, "beta": 0.2}),
    ("decode", "gamma = 0.5\nprefill_per_token = 1e-4", "decode_beta = [0.004, 0.006]",
     {"beta": 0.006, "gamma": 0.5, "prefill_per_token": 1e-4}),
    ("calibrated", 'feedback = "legacy"\ncalibrated_alpha = 0.002', "calibrated_beta = [0.004, 0.006]",
     {"alpha": 0.002, "beta": 0.006, "feedback": "legacy"}),
])
def test_service_model_parameters_are_params_and_grid_axes(tmp_path, model, params, grid, want):
    """Each model's parameters in [params] or as an axis; the last cell's
    model holds the given values; the axis changes the latency while the
    cells keep their requests (the parameters are not in the seed)."""
    from mbbatch.sweeps.cells import cell_seed, service_model

    spec = parse_spec(_service_spec(model, params, grid), source="s.toml")
    cells = [p for _, p in spec.points()]
    got = service_model(model, cells[-1])
    assert {k: getattr(got, k) for k in want} == want
    assert cell_seed(3, cells[0], 0).spawn_key == cell_seed(3, cells[1], 0).spawn_key
    p = tmp_path / "s.toml"
    p.write_text(_service_spec(model, params, grid))
    ds = run_sweep(p, tmp_path / "s.zarr", workers=1, progress=False).load()
    axis = grid.split(" = ")[0]
    lat = ds["sim_mean_latency"].isel(rate=0)
    assert bool((lat.isel({axis: 1}) > lat.isel({axis: 0})).all()), lat.values


@pytest.mark.parametrize("model, key", [("decode", "linear_alpha"), ("max", "decode_beta"),
                                        ("linear", "feedback"), ("calibrated", "per_token")])
def test_a_service_model_parameter_of_another_model_is_refused(model, key):
    text = _service_spec(model, f"{key} = 0.5" if key != "feedback" else 'feedback = "legacy"', "")
    with pytest.raises(SpecError, match=rf"params\.{key} \(it does not apply to dynamic with arrivals='poisson' "
                                        rf"and token-level requests under service_model='{model}'\)"):
        parse_spec(text, source="s.toml")


def test_a_service_model_parameter_is_checked_against_its_domain():
    text = _service_spec("decode", "decode_beta = -1.0", "")
    with pytest.raises(SpecError, match=r"s.toml: params: decode_beta must be in \(0, 1e\+290\); got -1"):
        parse_spec(text, source="s.toml")


def test_a_capacity_spec_whose_batches_cannot_fill_is_refused_before_any_store():
    """batch_size above n in a MultiBin capacity spec: the search went on at
    a rate of NaN and failed mid-sweep (found by make fuzz's mutants)."""
    from mbbatch.sweeps.cells import check_points

    from .test_sweeps_run import CAPACITY_SPEC

    check_points(parse_spec(CAPACITY_SPEC, source="c.toml"))
    text = CAPACITY_SPEC.replace("batch_size = 64", "batch_size = 2147483648")
    with pytest.raises(SpecError, match=r"c.toml: at grid point bins=1, servers=1: n must be at least 21474836480 "
                                        r"requests per probe .* 10 times the 2147483648 requests .*got n = 30000"):
        check_points(parse_spec(text, source="c.toml"))


# --- a cell's steady-state flag ----------------------------------------------------------------


@pytest.mark.parametrize("arrivals, rate, growing", [("poisson", 0.3, False), ("poisson", 20.0, True),
                                                      ("step", 20.0, False)])
def test_a_cells_backlog_growing_is_its_runs_unstable_flag(arrivals, rate, growing):
    """The store's backlog_growing is, rep by rep, the unstable flag of the
    run simulate makes from the cell's objects and seed (a load step, which
    has no single steady state, is never flagged).  At 20 requests/s a
    MultiBin of 2 bins and B = 8 on U(1, 20) service (Theorem 4.2: 0.56
    requests/s) is overloaded: every rep's flag is set."""
    from mbbatch.simulation import plan
    from mbbatch.sweeps.cells import _words, point_objects

    params = {"kind": "multibin", "bins": 2, "batch_size": 8, "edges": "equal_mass", "max_wait": math.inf,
              "rate": rate, "rate_high": 2 * rate, "t_up": 100.0, "t_down": 200.0, "l_min": 1.0, "l_max": 20.0,
              "n": 4000, "servers": 1, "predictor_sigma": 0.0, "predictor_p": 1.0}
    out = run_point(arrivals, "uniform", params, 3, 3)
    pol, arr, kw = point_objects(arrivals, "uniform", params)
    run = plan(pol, arr, n=params["n"], **kw)
    flags = [run.run(cell_seed(3, params, rep, _words(params)), warn=False).unstable for rep in range(3)]
    assert out["backlog_growing"].tolist() == ([False] * 3 if arrivals == "step" else flags)
    assert out["backlog_growing"].tolist() == [growing] * 3
    # Lemma 5.1 beside it: NaN past saturation (no expected latency), Poisson arrivals only
    if arrivals == "poisson":
        from mbbatch.sweeps.cells import point_theory

        assert math.isnan(point_theory(arrivals, "uniform", params)["theory_latency"]) == growing


_ITERATION_SPEC = """
name = "it"
seed = 1
reps = 1
arrivals = "poisson"
policy = "multibin"
service_model = "profile"
[params]
rate = 1.5
bins = 4
batch_size = 8
n = 1000
prompt_median = 300.0
prompt_sigma = 0.8
output_median = 100.0
output_sigma = 0.9
[grid]
max_wait = [inf, 30.0]
"""


def test_multibin_under_an_iteration_model_has_its_closed_forms():
    """A multibin cell on a profile: eq. (2) under the profile's model
    (theory.iteration_batch_service_time) at the edges the simulation uses,
    its service rate and Lemma 5.1's latency; NaN with a finite max_wait."""
    import scipy.stats as st

    import mbbatch as mb
    from mbbatch import theory

    spec = parse_spec(_ITERATION_SPEC)
    (_, full), (_, partial) = spec.points()
    got = point_theory(spec.arrivals, spec.service, full)
    wl = mb.Workload(prompt=st.lognorm(0.8, scale=300.0), output=st.lognorm(0.9, scale=100.0))
    model = mb.profiles.get(mb.profiles.DEFAULT)
    edges = mb.simulation.plan(mb.MultiBin(bins=4, batch_size=8), mb.Poisson(1.5), n=1000, workload=wl,
                               service_model=model).edges
    ov, ow = theory.integer_lengths(wl._output.dist)
    pv, pw = theory.integer_lengths(wl._prompt.dist)
    es = theory.iteration_batch_service_time(model, ov, 8, edges, prompt_mean=float(pv @ pw), weights=ow)
    assert got["theory_mean_batch_service"] == es and got["theory_service_rate"] == 8 / es
    assert got["theory_throughput"] == 1.5 and got["theory_latency"] == es + 7 * 4 / 3.0
    assert got["capacity"] > got["theory_service_rate"] and not got["unstable"]
    assert all(math.isnan(v) for k, v in point_theory(spec.arrivals, spec.service, partial).items()
               if k != "unstable")


# --- programs on a disaggregated deployment ------------------------------------------------

_DISAGGREGATED = """
name = "d"
arrivals = "poisson"
service_model = "iteration"
seed = 4
reps = 2
[params]
rate = 4.0
n = 400
prompt_median = 256.0
output_median = 32.0
[policies.split]
kind = "disaggregated"
prefill_engines = 1
decode_engines = 2
[policies.agents]
kind = "disaggregated"
prefill_engines = 1
decode_engines = 2
programs = "synthetic"
calls = 3
closed_loop = true
[policies.colocated]
kind = "cluster"
engine_policy = "continuous"
engines = 3
programs = "none"
[grid]
policy = ["split", "agents", "colocated"]
"""


def test_a_disaggregated_spec_takes_programs_and_shares_the_clusters_requests():
    """A spec's disaggregated deployment runs no programs unless it asks
    (its kind's default, ``none``: a spec written before it took them runs
    as it did), and runs synthetic ones, closed loop, where it does, each
    rep the run ``mb.simulate`` gives on the cell's seed.  A deployment's
    cells draw a cluster's requests where their workloads are the same (the
    programs' keys are workload keys of both: cells that differ only in
    policy share their seed)."""
    import mbbatch as mb
    from mbbatch.registry import build
    from mbbatch.sweeps.cells import _words, point_objects
    from mbbatch.sweeps.spec import SpecError, parse_spec

    spec = parse_spec(_DISAGGREGATED)
    cells = {p["policy"]: p for _, p in spec.points()}
    assert cells["split"]["programs"] == "none" and build("disaggregated", cells["split"]).programs is None
    agents = build("disaggregated", cells["agents"])
    assert agents.programs == mb.Programs(calls=3, think_time=1.0, closed=True)
    assert _words(cells["split"]) == _words(cells["colocated"]) != _words(cells["agents"])   # (calls 3)
    # (the programs' keys without programs: refused, not ignored)
    lone = _DISAGGREGATED.replace('programs = "synthetic"\n', "").replace('programs = "none"\n', "")
    with pytest.raises(SpecError, match=r"calls, closed_loop shape synthetic programs, and a disaggregated "
                                        r"deployment runs none unless asked \(policies.agents\)"):
        parse_spec(lone)
    params = cells["agents"]
    got = run_point(spec.arrivals, spec.service, params, spec.seed_of(params), spec.reps)
    _, arrivals, request_side = point_objects(spec.arrivals, spec.service, params)
    for rep in range(spec.reps):
        res = mb.simulate(agents, arrivals=arrivals, n=400, seed=cell_seed(spec.seed_of(params), params, rep),
                          **request_side)
        assert res.completed == 400
        assert got["sim_mean_latency"][rep] == res.mean_latency and got["sim_ttft_p99"][rep] == res.ttft_p99


def test_a_composites_spec_sets_every_setting_of_its_engines():
    """A cluster's and a deployment's spec keys are theirs and their
    engines' (:class:`~mbbatch.policies.base.ComposedSettings`): a cluster
    of continuous engines and a disaggregated deployment take the engines'
    overheads, scheduler steps and aging, each cell's engines built with
    them; a cluster of dynamic-batching engines refuses them, naming the
    engines that have them."""
    from mbbatch.registry import build
    from mbbatch.sweeps.spec import SpecError, parse_spec

    engine = ("iteration_overhead = 0.002\nrequest_overhead = 0.01\nnum_scheduler_steps = 4\n"
              "admission = \"spf\"\naging = 0.5\n")
    text = _DISAGGREGATED.replace('decode_engines = 2\n[policies.agents]', 'decode_engines = 2\n' + engine
                                  + '[policies.agents]')
    text = text.replace('engines = 3\nprograms = "none"\n', 'engines = 3\nprograms = "none"\n' + engine)
    cells = {p["policy"]: p for _, p in parse_spec(text).points()}
    split, colocated = build("disaggregated", cells["split"]), build("cluster", cells["colocated"])
    for got in (split.prefill, split.decode, colocated.policy):
        assert (got.iteration_overhead, got.request_overhead, got.num_scheduler_steps, got.admission,
                got.aging) == (0.002, 0.01, 4, "spf", 0.5)
    # (the engines of the other policies keep the defaults)
    assert build("disaggregated", cells["agents"]).prefill.request_overhead == 0.0
    dynamic = text.replace('engine_policy = "continuous"', 'engine_policy = "dynamic"')
    with pytest.raises(SpecError, match=r"(\w+) sets the \1 of the engines of continuous; engine_policy = "
                                        r"\['dynamic'\] has none"):
        parse_spec(dynamic)
    only = dynamic.replace('admission = "spf"\n', "").replace("aging = 0.5\n", "")
    with pytest.raises(SpecError, match=r"(iteration|request)_overhead sets the \1_overhead of the engines of "
                                        r"continuous"):
        parse_spec(only)


def test_every_sweeps_policies_see_the_same_requests():
    """In every spec of sweeps/ (those whose trace is here), cells that
    differ only in policy have the same seed (:data:`SEED_SCHEME`: policy
    parameters stay out of it), unless a variant sets a seed of its own:
    a comparison across policies is on common random numbers.  (A cluster's
    programs' keys once entered its cells' seeds but not a disaggregated
    deployment's, and the ``disaggregation`` figure compared the two on
    different requests.)"""
    from mbbatch.sweeps.cells import _words
    from mbbatch.sweeps.spec import TraceNotFound

    compared = 0
    for path in sorted((ROOT / "sweeps").glob("*.toml")):
        try:
            spec = load_spec(path)
        except TraceNotFound:
            continue
        if len(spec.policies) < 2 or any("seed" in s for s in spec.policies.values()):
            continue
        seeds = {}
        for _, params in spec.points():
            others = tuple(str(params.get(a)) for a in spec.axes if a != "policy")
            seeds.setdefault(others, {})[params.get("policy")] = _words(params)
        for others, by_policy in seeds.items():
            assert len(set(by_policy.values())) == 1, (path.name, others, sorted(by_policy))
        compared += 1
    assert compared >= 5
