"""Sweep specs are validated whole before a store exists: every grid point's
objects are built and its simulation checked, and any bad value, anywhere,
is a SpecError naming the file (a fuzz over keys and values)."""

import json

import pytest

import mbbatch as mb
from hypothesis import given
from hypothesis import strategies as st

from mbbatch.sweeps import run_sweep
from mbbatch.sweeps.cells import check_points
from mbbatch.sweeps.spec import SPEC_PARAMS, SpecError, load_spec, parse_spec

from .helpers import ROOT, SMALL, TOKEN, toml, write

BASES = {
    "multibin": {
        "name": "m", "policy": "multibin", "arrivals": "poisson", "service": "uniform", "reps": 2, "seed": 1,
        "params": {"batch_size": 8, "l_min": 1.0, "l_max": 20.0, "n": 1000},
        "grid": {"bins": [1, 3], "rate": [0.5, 2.0]},
    },
    "multibin_expon": {
        "name": "e", "policy": "multibin", "arrivals": "saturated", "service": "expon", "reps": 2, "seed": 1,
        "params": {"batch_size": 8, "mu": 0.5, "n": 1000, "edges": "lemma_a1"},
        "grid": {"bins": [1, 3]},
    },
    "static": {
        "name": "s", "policy": "static", "arrivals": "poisson", "reps": 2, "seed": 1,
        "params": {"prompt_median": 128.0, "prompt_sigma": 0.5, "output_median": 64.0, "output_sigma": 0.8,
                   "d_sla": 0.0074, "eta": 20000.0, "n": 1000},
        "grid": {"batch_size": [4, 16], "rate": [0.5, 2.0]},
    },
    "variants": {
        "name": "v", "arrivals": "poisson", "reps": 2, "seed": 1,
        "params": {"prompt_median": 128.0, "prompt_sigma": 0.5, "output_median": 64.0, "output_sigma": 0.8,
                   "d_sla": 0.0074, "eta": 20000.0, "n": 1000, "rate": 1.0},
        "grid": {"policy": ["static8", "dynamic"]},
        "policies": {"static8": {"kind": "static", "batch_size": 8}, "dynamic": {"kind": "dynamic", "b_max": 64}},
    },
    "multibin_dynamic": {
        "name": "d", "policy": "multibin_dynamic", "arrivals": "step", "reps": 2, "seed": 1,
        "params": {"prompt_median": 128.0, "prompt_sigma": 0.5, "output_median": 64.0, "output_sigma": 0.8,
                   "d_sla": 0.0074, "eta": 20000.0, "n": 1000, "b_max": 64, "warmup": 100, "rate": 1.0,
                   "rate_high": 2.0, "t_up": 100.0, "t_down": 200.0},
        "grid": {"bins": [2, 4]},
    },
}


scalars = st.one_of(
    st.integers(min_value=-10**20, max_value=10**20), st.sampled_from([0, 1, -1, 2**63, 10**12, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e300, 5e-324]),
    st.text(max_size=8), st.sampled_from(["inf", "nan", "8", "", "poisson", "uniform", "spec", "l0"]),
    st.booleans(),
)
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.sampled_from(["a", "x"]), scalars,
                                                                           max_size=2))


def check(tmp_path, text: str, name="fuzz.toml"):
    """Load and check a spec; any failure must be a SpecError naming the file."""
    p = tmp_path / name
    p.write_text(text)
    try:
        spec = load_spec(p)
        check_points(spec)
    except SpecError as exc:
        assert name in str(exc), str(exc)
        return None
    return spec


@given(base=st.sampled_from(sorted(BASES)), table=st.sampled_from(["", "params", "grid"]),
       key=st.sampled_from(sorted(SPEC_PARAMS) + ["name", "policy", "arrivals", "service", "service_model", "reps",
                                            "seed", "description", "bogus"]),
       value=values, data=st.data())
def test_spec_fuzz_only_spec_errors_naming_the_file(tmp_path_factory, base, table, key, value, data):
    spec = json.loads(json.dumps(BASES[base]))
    if table:
        spec[table][key] = value
        other = "grid" if table == "params" else "params"
        if data.draw(st.booleans()):
            spec[other].pop(key, None)       # often: the key in one table only
    else:
        spec[key] = value
    check(tmp_path_factory.mktemp("fuzz"), toml(spec))


@pytest.mark.parametrize("table", ["params", "grid"])
@pytest.mark.parametrize("value", [[0.5, 0.5], {"a": 1}, 3, True, "nosuch"])
def test_a_policy_that_is_not_a_variant_name_is_a_spec_error(tmp_path, table, value):
    """grid.policy and params.policy name variants: any other value (a list,
    a table, a number) is a SpecError naming the key (it was a TypeError)."""
    spec = json.loads(json.dumps(BASES["variants"]))
    if table == "grid":
        spec["grid"]["policy"] = [value, "dynamic"]
    else:
        del spec["grid"]["policy"]
        spec["params"]["policy"] = value
    p = tmp_path / "bad.toml"
    p.write_text(toml(spec))
    with pytest.raises(SpecError, match=f"bad.toml: {'grid' if table == 'grid' else 'params'}.policy"):
        load_spec(p)


@given(raw=st.binary(max_size=200))
def test_spec_fuzz_arbitrary_bytes(tmp_path_factory, raw):
    p = tmp_path_factory.mktemp("bytes") / "raw.toml"
    p.write_bytes(raw)
    with pytest.raises(SpecError, match="raw.toml"):
        load_spec(p)


@pytest.mark.parametrize("base", sorted(BASES))
def test_the_fuzz_bases_are_valid(tmp_path, base):
    assert check(tmp_path, toml(BASES[base])) is not None


# --- the failures users met, one by one: each is a SpecError before any store ------------

def refused(tmp_path, spec: dict, *needles):
    p = tmp_path / "bad.toml"
    p.write_text(toml(spec))
    out = tmp_path / "out.zarr"
    with pytest.raises(SpecError) as err:
        run_sweep(p, out, workers=1, progress=False)
    assert not out.exists() and not list(tmp_path.glob(".*"))   # no store, no lock, no temporary
    for needle in ("bad.toml", *needles):
        assert needle in str(err.value), str(err.value)


def test_warmup_below_bins_at_some_grid_point(tmp_path):
    """`warmup = 3` with `bins = [2, 4]` failed only after points were computed."""
    spec = json.loads(json.dumps(BASES["multibin_dynamic"]))
    spec["params"]["warmup"] = 3
    refused(tmp_path, spec, "bins=4", "warmup")


def test_prompt_sigma_zero(tmp_path):
    """`prompt_sigma = 0.0` was inside the spec's range but refused by the
    log-normal later; the spec's domain now says (0, inf)."""
    spec = json.loads(json.dumps(BASES["static"]))
    spec["params"]["prompt_sigma"] = 0.0
    refused(tmp_path, spec, "prompt_sigma", "(0, inf)")


def test_infinite_servers_with_a_token_policy(tmp_path):
    spec = json.loads(json.dumps(BASES["static"]))
    spec["params"]["servers"] = "inf"
    refused(tmp_path, spec, "servers", "finite")


def test_a_billion_reps_is_refused_saying_the_memory(tmp_path):
    """`reps = 1000000000` ended in a raw MemoryError."""
    spec = json.loads(json.dumps(BASES["multibin"]))
    spec["reps"] = 10**12
    refused(tmp_path, spec, "reps", "GiB")


def test_a_huge_batch_size_runs_in_bounded_memory(tmp_path):
    """`batch_size = 1000000000` ended in a raw MemoryError: a bin's buffer is
    now min(batch_size, n), so the sweep runs (no batch ever fills)."""
    spec = json.loads(json.dumps(BASES["multibin"]))
    spec["params"]["batch_size"] = 10**9
    p = tmp_path / "big.toml"
    p.write_text(toml(spec))
    ds = run_sweep(p, tmp_path / "out.zarr", workers=1, progress=False)
    assert int(ds["completed"].sum()) == 0 and int(ds["excluded_partial"].min()) == 1000


def test_too_many_bins_is_refused_saying_the_memory(tmp_path):
    spec = json.loads(json.dumps(BASES["multibin"]))
    spec["grid"]["bins"] = [1, 10**13]
    refused(tmp_path, spec, "bins=10000000000000", "bins:", "GiB")


# --- spec validation, key by key --------------------------------------------------------

@pytest.mark.parametrize("edit, key", [
    (lambda s: s.replace('reps = 3', 'reps = 3\nrepz = 4'), "repz"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nmu = 0.1'), "params.mu"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = []'), "grid.rate"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = [0.2, 0.5, 0.2]'), "grid.rate"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]\n', ''), "grid.rate"),
    (lambda s: s.replace('seed = 7\n', 'seed = -7\n'), "seed"),
    (lambda s: s.replace('bins = [1, 3]', 'bins = [1, 0]'), "grid.bins"),
    (lambda s: s.replace('bins = [1, 3]', 'bins = [1, 2.5]'), "grid.bins"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = [0.2, -1.0]'), "grid.rate"),
    (lambda s: s.replace('rate = [0.2, 0.5, 2.0]', 'rate = [0.2, nan]'), "grid.rate"),
    (lambda s: s.replace('l_max = 20.0', 'l_max = 0.5'), "l_max"),
    (lambda s: s.replace('service = "uniform"', 'service = "weibull"'), "service"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nservers = 0'), "servers"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nedges = "lemma_a1"'), "edges"),
    (lambda s: s.replace('n = 4000', 'n = 4000\nbins = 2'), "bins"),
    (lambda s: s.replace('reps = 3', 'reps = 0'), "reps"),
    (lambda s: s + "\n[extra]\nx = 1\n", "extra"),
])
def test_bad_specs_name_key_and_file(tmp_path, edit, key):
    p = write(tmp_path, edit(SMALL), "bad.toml")
    with pytest.raises(SpecError) as err:
        load_spec(p)
    assert key in str(err.value) and "bad.toml" in str(err.value)
    # and nothing runs: no store appears
    out = tmp_path / "out.zarr"
    with pytest.raises(SpecError):
        run_sweep(p, out, workers=1, progress=False)
    assert not out.exists()


def test_spec_files_of_the_project_are_valid(monkeypatch):
    """Every spec of sweeps/ is valid; one that replays a trace is valid with
    the trace at hand, and without it names the file and where to get it."""
    from mbbatch.sweeps.spec import TraceNotFound

    from .conftest import SHARED_DATA

    for p in sorted((ROOT / "sweeps").glob("*.toml")):
        monkeypatch.delenv("MBBATCH_DATA", raising=False)
        if "[workload]" in p.read_text():
            with pytest.raises(TraceNotFound, match="AzurePublicDataset"):
                load_spec(p)
            if not SHARED_DATA.is_dir():
                continue
            monkeypatch.setenv("MBBATCH_DATA", str(SHARED_DATA))
        spec = load_spec(p)
        assert spec.name == p.stem


def test_spec_hash_ignores_layout_and_comments():
    a = parse_spec(SMALL)
    b = parse_spec("# a comment\n" + SMALL.replace("reps = 3", "reps   =   3"))
    assert a.hash == b.hash
    assert parse_spec(SMALL.replace("reps = 3", "reps = 4")).hash != a.hash


def test_confidence_is_checked_and_changes_the_hash_only_when_given():
    """The t-intervals' level: 0.95 unless the spec says; a spec without it keeps its hash (and so
    its stores)."""
    base = parse_spec(SMALL)
    assert base.confidence == 0.95 and "confidence" not in base.to_dict()
    given = parse_spec(SMALL.replace("reps = 3", "reps = 3\nconfidence = 0.95"))
    assert given.hash == base.hash
    other = parse_spec(SMALL.replace("reps = 3", "reps = 3\nconfidence = 0.8"))
    assert other.confidence == 0.8 and other.hash != base.hash
    for bad in ("0.0", "1.0", "-0.5", "true", '"high"', "nan"):
        with pytest.raises(SpecError, match=r"confidence must be a number in \(0, 1\); got"):
            parse_spec(SMALL.replace("reps = 3", f"reps = 3\nconfidence = {bad}"))
    assert parse_spec(CAP.replace("[capacity]", "[capacity]\nconfidence = 0.9")).confidence == 0.9


def test_token_spec_errors(tmp_path):
    # (no b_max, d_sla or eta: the parameter table's defaults, as the API's)
    plain = TOKEN.format(policy="dynamic", arrivals="poisson", extra="", grid="rate = [1.0]")
    plain = plain.replace("d_sla = 0.0074\n", "").replace("eta = 20000.0\n", "")
    (_, params), = load_spec(write(tmp_path, plain, "a.toml")).points()
    assert (params["d_sla"], params["b_max"], params["eta"]) == (0.0074, 256, 180_000.0)
    assert mb.SLAController().d_sla == 0.0074 and mb.SLAController().b_max == 256 and mb.Memory().eta == 180_000.0
    bad = TOKEN.format(policy="static", arrivals="poisson", extra="b_max = 4", grid="batch_size = [4]\nrate = [1.0]")
    with pytest.raises(SpecError, match="params.b_max"):              # not a static parameter
        load_spec(write(tmp_path, bad, "b.toml"))
    bad = TOKEN.format(policy="dynamic", arrivals="step", extra="b_max = 8\nrate = 1.0\nrate_high = 2.0\n"
                       "t_up = 10.0\nt_down = 5.0", grid="controller = [\"spec\"]")
    with pytest.raises(SpecError, match="t_down"):
        load_spec(write(tmp_path, bad, "c.toml"))


# --- policy variants as a sweep axis ------------------------------------------------------

VARIANTS = """
name = "variants"
arrivals = "poisson"
service_model = "decode"
reps = 2
seed = 11

[params]
prompt_median = 128.0
prompt_sigma = 0.5
output_median = 64.0
output_sigma = 0.8
d_sla = 0.0074
eta = 20000.0
n = 800
b_max = 64

[policies.static8]
kind = "static"
batch_size = 8

[policies.dyn]
kind = "dynamic"

[policies.dyn_small]
kind = "dynamic"
b_max = 16
n = 600

[grid]
policy = ["static8", "dyn", "dyn_small"]
rate = [0.5, 2.0]
"""


def test_variants_take_shared_values_and_override_them():
    spec = parse_spec(VARIANTS)
    assert spec.policy == "mixed" and spec.kinds == ["static", "dynamic"] and spec.shape == (3, 2)
    cells = {(p["policy"], p["rate"]): p for _, p in spec.points()}
    assert cells["static8", 0.5]["batch_size"] == 8 and "b_max" not in cells["static8", 0.5]
    assert cells["dyn", 0.5]["b_max"] == 64 and cells["dyn_small", 0.5]["b_max"] == 16
    assert cells["dyn_small", 2.0]["n"] == 600 and cells["dyn", 2.0]["n"] == 800
    assert cells["dyn", 0.5]["kind"] == "dynamic" and cells["dyn", 0.5]["eps_d"] == 5e-5   # a default


def test_cells_that_differ_only_in_policy_share_their_seed():
    """Common random numbers: the seed hashes the workload only."""
    from mbbatch.sweeps.cells import cell_seed

    spec = parse_spec(VARIANTS)
    cells = {(p["policy"], p["rate"]): p for _, p in spec.points()}
    seed = lambda c: cell_seed(spec.seed_of(c), c, 0).spawn_key  # noqa: E731
    assert seed(cells["static8", 0.5]) == seed(cells["dyn", 0.5])
    assert seed(cells["dyn", 0.5]) != seed(cells["dyn_small", 0.5])          # n differs: another workload
    reseeded = parse_spec(VARIANTS.replace('kind = "static"', 'kind = "static"\nseed = 5'))
    c = {(p["policy"], p["rate"]): p for _, p in reseeded.points()}
    assert reseeded.seed_of(c["static8", 0.5]) == 5 and reseeded.seed_of(c["dyn", 0.5]) == 11


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace('kind = "static"\n', ''), "policies.static8: missing field 'kind'"),
    (lambda s: s.replace('kind = "static"', 'kind = "fifo"'), "kind must be one of"),
    (lambda s: s.replace("batch_size = 8", "batch_size = 8\nbins = 3"), "policies.static8: unknown key bins"),
    (lambda s: s.replace('"static8", ', ""), "the variants ['static8'] are in no grid.policy axis"),
    (lambda s: s.replace('policy = ["static8"', 'policy = ["nosuch", "static8"'), "no variant named 'nosuch'"),
    (lambda s: s.replace("rate = [0.5, 2.0]", "rate = [0.5, 2.0]\nbatch_size = [8, 16]"),
     "grid.batch_size does not apply to the variants"),
    (lambda s: s.replace("rate = [0.5, 2.0]\n", ""), "missing field policies.static8, params.rate"),
    (lambda s: s.replace("[grid]", 'policy = "dyn"\n[grid]'), "policies.dyn_small: unknown key policy"),
    (lambda s: 'policy = "static"\n' + s, "give either policy = KIND"),
])
def test_variant_errors_name_the_key(edit, needle):
    with pytest.raises(SpecError) as err:
        parse_spec(edit(VARIANTS), source="v.toml")
    assert needle in str(err.value) and "v.toml" in str(err.value), str(err.value)


def test_a_variant_sweep_stores_a_policy_axis(tmp_path):
    ds = run_sweep(write(tmp_path, VARIANTS), tmp_path / "v.zarr", workers=1, progress=False)
    assert ds["policy"].values.tolist() == ["static8", "dyn", "dyn_small"]
    assert ds.attrs["policy"] == "mixed" and json.loads(ds.attrs["policy_dyn_small"]) == {
        "kind": "dynamic", "b_max": 16, "n": 600}
    assert bool(ds["done"].all())
    # sla_infeasible applies to the controlled policies only: static cells keep the fill value
    assert not bool(ds["sla_infeasible"].sel(policy="static8").any())
    assert int(ds["completed"].sel(policy="dyn_small").sum()) == 600 * 2 * 2 - int(
        ds["rejected"].sel(policy="dyn_small").sum())


# --- a trace's requests: the [workload] table -------------------------------------------

TRACE_SPEC = """
name = "t"
policy = "multibin"
arrivals = "{arrivals}"
reps = 1
seed = 1
{top}
{workload}
[params]
n = 100
bins = 2
batch_size = 4
"""


@pytest.mark.parametrize("arrivals, top, workload, message", [
    ("trace", "", "", r"arrivals = \"trace\" replays a trace's arrival times: it needs a \[workload\]"),
    ("trace", "", "[workload]\ntrace = \"t.csv\"\ncolour = 1\n", "unknown key 'colour'"),
    ("trace", "", "[workload]\ntrace = \"t.csv\"\nformat = \"csv\"\n", "format must be one of"),
    ("trace", "", "[workload]\ntrace = \"t.csv\"\nformat = [\"azure\"]\n", "format must be one of"),
    ("trace", "", "[workload]\ntrace = \"t.csv\"\nformat = {a = 1}\n", "format must be one of"),
    ("trace", "", "[workload]\ntrace = \"t.csv\"\nmodel = \"GPT-4\"\n", "model and log_type filter BurstGPT"),
    ("trace", "service = \"uniform\"", "[workload]\ntrace = \"t.csv\"\n", "service does not apply"),
    ("trace", "service_model = \"decode\"", "[workload]\ntrace = \"t.csv\"\n", "multibin takes service_model"),
    ("poisson", "", "[workload]\ntrace = \"t.csv\"\n", "missing field params.rate or grid.rate"),
])
def test_trace_workloads_are_checked(tmp_path, arrivals, top, workload, message):
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,1,1\n1,2,2\n")
    p = tmp_path / "s.toml"
    p.write_text(TRACE_SPEC.format(arrivals=arrivals, top=top, workload=workload))
    with pytest.raises(SpecError, match=message):
        load_spec(p)


# --- capacity specs --------------------------------------------------------------------

CAP = """
name = "c"
policy = "multibin"
arrivals = "poisson"
service = "uniform"
seed = 1
[params]
batch_size = 8
l_min = 1.0
l_max = 20.0
n = 1000
[grid]
bins = [1, 2]
[capacity]
"""


def test_a_capacity_spec_has_its_defaults_and_no_rate():
    spec = parse_spec(CAP, source="c.toml")
    assert spec.capacity == {"rel_tol": 0.01, "confidence": 0.95, "max_reps": 24, "throughput_tol": 0.05,
                             "searches": 5}
    assert all("rate" not in params for _, params in spec.points())
    assert "capacity" in spec.to_dict()


@pytest.mark.parametrize("change, match", [
    (("[params]", "[params]\nrate = 2.0"), r"params\.rate: a capacity search sets the arrival rate"),
    (("bins = [1, 2]", "bins = [1, 2]\nrate = [1.0, 2.0]"), r"grid\.rate: a capacity search sets the arrival rate"),
    (("seed = 1", "seed = 1\nreps = 3"), "reps does not apply to a capacity search"),
    (("seed = 1", "seed = 1\nconfidence = 0.9"), r"a capacity search's confidence is \[capacity\] confidence"),
    (('arrivals = "poisson"', 'arrivals = "saturated"'), "a capacity search sets the rate of arrivals"),
    (("[capacity]", "[capacity]\nrel_tol = 0.0"), r"capacity: rel_tol must be in \[1e-09, 1\); got 0\.0"),
    (("[capacity]", "[capacity]\nrel_tol = 1e-300"), r"capacity: rel_tol must be in \[1e-09, 1\); got 1e-300"),
    (("[capacity]", "[capacity]\nmax_reps = 2"), r"capacity: max_reps must be in \[3, inf\), an integer; got 2"),
    (("[capacity]", "[capacity]\nspeed = 1"), "capacity: unknown key 'speed'"),
    (("[capacity]", "[capacity]\nlatency_p95 = 3.0"), "capacity: latency_p95: an objective's bounds are "
                                                         "parameters, objective_<metric>"),
    (("[params]", "[params]\nobjective_latency_p95 = -3.0"), r"objective_latency_p95 must be in \(0, inf\)"),
    (("[params]", "[params]\nobjective_mean_ttft = 3.0"), r"unknown key params\.objective_mean_ttft"),
])
def test_capacity_specs_are_checked(change, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(CAP.replace(*change), source="c.toml")


def test_objective_bounds_are_capacity_parameters_and_axes():
    from mbbatch.sweeps.cells import check_points

    with pytest.raises(SpecError, match="objective_latency_p95.*does not apply"):
        parse_spec(CAP.replace("[capacity]", "").replace("seed = 1", "seed = 1\nreps = 1")
                   .replace("[params]", "[params]\nobjective_latency_p95 = 3.0")
                   .replace("[grid]", "[grid]\nrate = [1.0]"),
                   source="c.toml")
    spec = parse_spec(CAP.replace("bins = [1, 2]", "bins = [1, 2]\nobjective_latency_p95 = [100.0, 200.0]"),
                      source="c.toml")
    cells = [params for _, params in spec.points()]
    assert [c["objective_latency_p95"] for c in cells] == [100.0, 200.0, 100.0, 200.0]
    check_points(spec)


GOODPUT = """
name = "g"
policy = "continuous"
arrivals = "poisson"
service_model = "profile"
seed = 1
[params]
profile = "H100/vLLM/Meta-Llama-3-8B/tp1"
n = 2000
max_num_seqs = 16
ttft_slo = 0.2
tpot_slo = 0.0095
objective_goodput = 0.9
[capacity]
"""


def test_a_goodput_objective_reads_the_requests_objectives_and_needs_one():
    """objective_goodput bounds goodput from below (the cells' workloads
    carry ttft_slo and tpot_slo, which leave the cells' seeds alone: the
    requests are the same); without either objective, the spec is refused
    before any run, naming goodput."""
    from mbbatch.sweeps.cells import _words, check_points, point_objects

    spec = parse_spec(GOODPUT, source="g.toml")
    (_, params), = spec.points()
    _, _, side = point_objects(spec.arrivals, spec.service, {**params, "rate": 1.0})
    assert (side["workload"].ttft_slo, side["workload"].tpot_slo) == (0.2, 0.0095)
    assert _words(params) == _words({**params, "ttft_slo": 5.0})
    check_points(spec)
    bare = parse_spec(GOODPUT.replace("ttft_slo = 0.2\n", "").replace("tpot_slo = 0.0095\n", ""), source="g.toml")
    with pytest.raises(SpecError, match="goodput"):
        check_points(bare)


def test_a_spec_with_several_problems_names_them_all_at_once(tmp_path):
    """An unknown key, two bad values and a missing field: one error, one line each (it stopped at
    the first, one round trip per problem)."""
    text = TOKEN.format(policy="dynamic", arrivals="gamma", extra="speed = 3\nb_max = 0",
                        grid="rate = [1.0, -2.0]")
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text, "bad.toml"))
    lines = str(info.value).splitlines()
    assert lines[0].endswith("bad.toml: 4 problems:"), lines
    assert any("unknown key speed" in ln for ln in lines[1:])
    assert any("b_max must be an integer in [1, inf); got 0" in ln for ln in lines[1:])
    assert any(ln.strip().startswith("grid.rate: rate must be in (0, inf); got -2.0") for ln in lines[1:])
    assert any("missing field params.cv or grid.cv" in ln for ln in lines[1:])


def test_a_trace_spec_defaults_its_arrivals_and_n_to_the_traces(tmp_path):
    """No arrivals: the trace's (replayed); no n: the requests its filters keep; n given, or a window
    as an axis (the length differs by cell), asks for n."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{t}.0,{10 + t},{1 + t % 7}" for t in range(50)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    base = ('name = "t"\npolicy = "dynamic"\nservice_model = "decode"\nreps = 1\nseed = 1\n'
            '[workload]\ntrace = "t.csv"\n')
    p = tmp_path / "a.toml"
    p.write_text(base)
    spec = load_spec(p)
    (_, params), = spec.points()
    assert spec.arrivals == "trace" and params["n"] == 50
    p.write_text(base + "[params]\nwindow_end = 20.0\n")
    (_, params), = load_spec(p).points()
    assert params["n"] == 20
    p.write_text(base + "[params]\nn = 7\n")
    (_, params), = load_spec(p).points()
    assert params["n"] == 7
    p.write_text(base + "[grid]\nwindow_end = [10.0, 20.0]\n")
    with pytest.raises(SpecError, match=r"the trace's length differs along the axes \['window_end'\]: give n"):
        load_spec(p)


# --- one set of defaults: a spec of a policy, a workload and a rate runs --------------------

def _explicit_workload(kind):
    from mbbatch.registry import POLICIES

    return 'service = "uniform"' if POLICIES[kind].paper else f'service_model = "{POLICIES[kind].models[0]}"'


@pytest.mark.parametrize("kind", mb.registry.KINDS)
@pytest.mark.parametrize("named", [False, True], ids=["default_workload", "named_workload"])
def test_a_spec_of_a_policy_a_workload_and_a_rate_runs(tmp_path, kind, named):
    """Every other field is the parameter table's default (the API's), or the kind's own where it
    declares one (a disaggregated deployment's programs: none, as its API's): name (the file's),
    arrivals (poisson), seed (0), reps (5), n and the policy's and workload's parameters."""
    from mbbatch.params import PARAMS, REQUIRED

    text = f'policy = "{kind}"\n' + (_explicit_workload(kind) + "\n" if named else "") + "[params]\nrate = 2.0\n"
    p = write(tmp_path, text, "first_look.toml")
    spec = load_spec(p)
    assert (spec.name, spec.arrivals, spec.seed, spec.reps) == ("first_look", "poisson", 0, 5)
    (_, cell), = spec.points()
    for nm, value in cell.items():
        sp = SPEC_PARAMS.get(nm)
        if sp is None or nm == "rate" or sp.unset:
            continue
        d = sp.default_for(kind)
        assert d is not REQUIRED, nm
        assert d == sp.table.default or nm in mb.registry.POLICIES[kind].spec_defaults, nm
        assert value == sp.check(d, "defaults") or (value is None and d is None), (nm, value, d)
    assert cell["n"] == PARAMS["n"].default == 10_000
    ds = run_sweep(p, tmp_path / "first_look.zarr", workers=1, progress=False)
    assert ds.sizes["rep"] == 5 and bool(ds["done"].all())
    assert float(ds["sim_throughput_mean"].squeeze()) == pytest.approx(2.0, rel=0.1)


def test_the_parameter_table_alone_decides_what_a_spec_must_give():
    """A spec key is required exactly when its table entry has no default, except where its spec entry
    says otherwise (a key whose absence means something: unset)."""
    from mbbatch.params import REQUIRED

    for name, sp in SPEC_PARAMS.items():
        if sp.table.default is REQUIRED and not sp.capacity_only:
            assert sp.required, name
        if sp.required is True:
            assert sp.table.default is REQUIRED, f"{name} has a table default but a spec must give it"


def test_the_api_takes_the_same_defaults():
    from mbbatch.params import PARAMS

    assert (mb.MultiBin().bins, mb.MultiBin().batch_size) == (4, 128)
    assert mb.StaticBatching().batch_size == mb.ShortestPredictedFirst().batch_size == PARAMS["batch_size"].default
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8), mb.Poisson(0.5), service=st_uniform(1, 19), seed=1)
    assert res.n == PARAMS["n"].default


def st_uniform(loc, scale):
    import scipy.stats

    return scipy.stats.uniform(loc, scale)


def test_a_spec_without_a_name_outside_a_file_says_so():
    with pytest.raises(SpecError, match="missing field 'name'"):
        parse_spec('policy = "static"\n[params]\nrate = 1.0\n')


LENGTHS = """name = "len"
policy = "{kind}"
service_model = "{model}"
reps = 1
seed = 1
[params]
n = 200
rate = 0.5
prompt_median = {prompt_median}
prompt_sigma = {prompt_sigma}
output_median = {output_median}
output_sigma = {output_sigma}
{extra}
"""
_LENGTHS = {"prompt_median": 128.0, "prompt_sigma": 0.5, "output_median": 64.0, "output_sigma": 0.8}


@pytest.mark.parametrize("kind, model", [("static", "decode"), ("continuous", "iteration"), ("laps", "prefill")])
@pytest.mark.parametrize("key, value", [("prompt_median", 1e30), ("prompt_sigma", 20.0), ("prompt_sigma", 40.0),
                                        ("output_median", 1e30), ("output_sigma", 20.0), ("output_sigma", 40.0),
                                        ("prompt_median", 1e300), ("output_median", 1e300)])
def test_lognormal_lengths_out_of_range_are_refused_naming_their_key(tmp_path, kind, model, key, value):
    """prompt_median = 1e30 (or an output_* or *_sigma key's absurd value) was refused by the
    planners' checks, which name their API's arguments: "service_model: service times of about
    5.74e+24 s lie outside ...", "workload: ...", "prompt must have a finite mean".  The spec names
    the key whose law or whose requests' time is out of range, when it is loaded (before a store
    exists).  (A prompt the model does not time, static's under DecodeModel, is no refusal.)"""
    import re

    text = LENGTHS.format(kind=kind, model=model, extra="", **{**_LENGTHS, key: value})
    path = write(tmp_path, text, "len.toml")
    # (a law beyond the float range, or drawing beyond MAX_DURATION, is refused whatever times it; else the
    # lengths a model does not time are no refusal: DecodeModel(prefill_per_token=0)'s prompt, LAPS's output)
    untimed = (kind, key.split("_")[0]) in (("static", "prompt"), ("laps", "output"))
    if value not in (40.0, 1e300) and untimed:
        load_spec(path)
        return
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}: .*\b{key} = {re.escape(repr(value))}\b"):
        load_spec(path)


def test_a_service_models_time_out_of_range_names_its_keys(tmp_path):
    """IterationModel(setup=1e300) under static batching blamed workload.output (in a spec:
    "workload: service times of about 1e+300 s lie outside ..."); a setup beyond MAX_DURATION is out
    of the table's domain, and one that a request of one token already takes outside the latency
    histogram's range names the service model and its keys."""
    text = LENGTHS.format(kind="static", model="iteration", extra="batch_size = 4\niteration_setup = {setup}",
                          **_LENGTHS)
    with pytest.raises(SpecError, match=r"params: iteration_setup must be in \[0, 1e\+290\); got 1e\+300$"):
        load_spec(write(tmp_path, text.format(setup=1e300)))
    with pytest.raises(SpecError, match=r"service_model = 'iteration' \(iteration_setup = 1e\+200\): a request of one "
                                        r"prompt and one output token takes about 1e\+200 s, outside "):
        load_spec(write(tmp_path, text.format(setup=1e200)))
    with pytest.raises(ValueError, match=r"^setup must be in \[0, 1e\+290\); got 1e\+300$"):
        mb.IterationModel(setup=1e300)


LAPS_DECODE = """name = "l"
policy = "laps"
service_model = "prefill"
reps = 1
seed = 1
[params]
prompt_median = 128.0
prompt_sigma = 0.5
output_median = 64.0
output_sigma = 0.8
n = 500
rate = 5.0
decode = "continuous"
decode_eta = {eta}
"""


def test_a_laps_specs_continuous_decode_names_decode_eta():
    """A LAPS spec's continuous decode stage takes decode_eta as its engines' kv_tokens: a value
    beyond kv_tokens' domain (1e30: the engine's int64 block counts) is refused naming decode_eta,
    the spec's key, not kv_tokens."""
    with pytest.raises(SpecError, match=r"<spec>: at its one grid point: decode_eta must be in \(0, 2\*\*62\) or "
                                        r"inf; got 1e\+30$"):
        check_points(parse_spec(LAPS_DECODE.format(eta=1e30)))


def test_a_laps_specs_decode_refusal_of_a_request_names_decode_eta():
    """A request the decode stage's KV cache could never hold said "raise kv_tokens or bound the
    lengths", where the LAPS spec's key is decode_eta."""
    with pytest.raises(SpecError, match=r"decode_eta = 300: request \d+ .* can never fit .*; raise decode_eta"):
        check_points(parse_spec(LAPS_DECODE.format(eta=300.0)))


# --- request classes: a mixture's sweep ----------------------------------------------------------------

MIXTURE = """
name = "mix"
policy = "continuous"
service_model = "profile"
reps = 2
seed = 1
[params]
n = 1600
max_num_seqs = 16
output_sigma = 0.8
[classes.chat]
share = 3
prompt_median = 128.0
output_median = 64.0
ttft_slo = 0.3
[classes.batch]
share = 1
prompt_median = 1024.0
output_median = 256.0
[grid]
admission = ["fcfs", "edf"]
rate = [4.0]
"""


def test_a_mixture_specs_classes_take_their_own_keys_and_the_cells_others():
    """[classes.NAME]: each class's share and the keys it gives; the keys it
    does not give are the cell's ([params], or the table's default).  The
    cell's workload is the mixture of them; the spec's dict and hash hold
    the classes (a spec without them keeps its hash)."""
    from mbbatch.sweeps.cells import point_objects

    spec = parse_spec(MIXTURE, source="mix.toml")
    assert spec.classes == {"chat": {"share": 3.0, "prompt_median": 128.0, "output_median": 64.0, "ttft_slo": 0.3},
                            "batch": {"share": 1.0, "prompt_median": 1024.0, "output_median": 256.0}}
    (_, cell), _ = spec.points()
    assert cell["classes"]["batch"] == {"share": 1.0, "prompt_median": 1024.0, "prompt_sigma": 0.6,
                                        "output_median": 256.0, "output_sigma": 0.8, "ttft_slo": float("inf"),
                                        "tpot_slo": float("inf")}
    _, _, side = point_objects(spec.arrivals, spec.service, cell)
    mix = side["workload"]
    assert isinstance(mix, mb.Mixture) and mix.names == ("chat", "batch") and mix.shares == (0.75, 0.25)
    assert mix.ttft_slo == (0.3, float("inf")) and mix.parts[1].mean("prompt") == pytest.approx(1024 * 1.19722,
                                                                                               rel=1e-5)
    assert spec.to_dict()["classes"]["chat"]["ttft_slo"] == 0.3
    assert parse_spec(MIXTURE.replace("share = 3", "share = 2")).hash != spec.hash
    assert "classes" not in parse_spec(MIXTURE.split("[classes.chat]")[0] + "[grid]\nrate = [4.0]\n").to_dict()


def test_a_mixture_sweep_stores_each_class_metrics_on_a_request_class_axis(tmp_path):
    """Two paths: the store's class variables are each cell's runs'
    ``result.classes``, replication by replication (a sweep's seeds), on the
    ``request_class`` dimension, with their means and t-intervals at the
    spec's confidence; the attrs hold the classes' tables, and the store
    verifies."""
    import numpy as np

    from mbbatch import stats
    from mbbatch.simulation import plan
    from mbbatch.sweeps.cells import cell_seed, point_objects

    from mbbatch.sweeps import check_store

    spec = parse_spec(MIXTURE, source="mix.toml")
    ds = run_sweep(spec, tmp_path / "mix.zarr", workers=1, progress=False)
    # (verified whole, the classes' coordinate and variables with the rest)
    assert check_store(tmp_path / "mix.zarr").ok
    assert ds["request_class"].values.tolist() == ["chat", "batch"]
    assert ds["sim_class_ttft_attainment"].dims == ("admission", "rate", "rep", "request_class")
    assert ds["class_completed"].dtype == np.int64 and ds["sim_class_goodput_mean"].dims == ("admission", "rate",
                                                                                             "request_class")
    assert ds["sim_class_ttft_p99"].attrs["units"] == "s"
    assert json.loads(ds.attrs["classes"]) == json.loads(json.dumps(spec.classes))
    for idx, params in spec.points():
        pol, arr, kw = point_objects(spec.arrivals, spec.service, params)
        run = plan(pol, arr, n=params["n"], **kw)
        for rep in range(spec.reps):
            res = run.run(cell_seed(spec.seed_of(params), params, rep), warn=False)
            for j, name in enumerate(("chat", "batch")):
                at = {"admission": idx[0], "rate": idx[1], "rep": rep, "request_class": j}
                assert int(ds["class_completed"][at]) == res.classes[name]["completed"]
                for m in ("mean_latency", "latency_p99", "mean_ttft", "ttft_p99", "ttft_attainment", "goodput"):
                    assert float(ds[f"sim_class_{m}"][at]) == res.classes[name][m], (m, name)
    col = ds["sim_class_mean_ttft"].isel(admission=1, rate=0, request_class=0).values
    want = stats.t_interval(col, spec.confidence)
    got = tuple(float(ds[f"sim_class_mean_ttft{s}"].isel(admission=1, rate=0, request_class=0))
                for s in ("_mean", "_ci_low", "_ci_high"))
    assert got == want


@pytest.mark.parametrize("change, match", [
    (("share = 3\n", ""), r"mix\.toml: classes\.chat: missing field 'share' \(a request class's weight"),
    (("share = 3", "share = 0"), r"mix\.toml: classes\.chat: share must be in \(0, 1e\+290\); got 0"),
    (("share = 3", "share = true"), r"mix\.toml: classes\.chat: share must be a real number.*got True"),
    (("ttft_slo = 0.3", "ttft_slo = -1.0"), r"classes\.chat: ttft_slo must be in \(0, 1e\+290\) or inf; got -1\.0"),
    (("share = 3", "share = 3\nspeed = 1"), r"classes\.chat: unknown key 'speed' \(not a key of a class\); allowed: "
                                            r"\['share', 'prompt_median'"),
    (("share = 3", "share = 3\nobjective_ttft_p99 = 0.5"), r"classes\.chat: unknown key 'objective_ttft_p99' \(a "
                                                           r"capacity search's objective"),
    (("share = 3", "share = 3\nrate = 2.0"), r"classes\.chat: unknown key 'rate'"),
    (("[classes.batch]", "[classes.\"b c\"]"), r"classes\.b c: a class's name must be an identifier"),
    (('policy = "continuous"', 'policy = "dynamic"'), None),
    (("prompt_median = 128.0", "prompt_median = 1e300"),
     r"classes\.chat\.prompt_median = 1e\+300 and classes\.chat\.prompt_sigma = 0\.6: the log-normal prompt lengths"),
    (('service_model = "profile"', 'service_model = "profile"\nclasses = 3'), r"classes must be a table"),
])
def test_a_mixture_specs_errors_name_the_class_and_the_key(change, match):
    text = MIXTURE.replace(*change)
    if change[1] == 'policy = "dynamic"':
        # (the engine's own keys off: what is left to refuse is the mixture)
        text = text.replace("max_num_seqs = 16\n", "").replace('admission = ["fcfs", "edf"]\n', "")
        match = (r"mix\.toml: classes: a mixture's requests run on continuous batching engines \(policy "
                 r"\"continuous\", or a cluster of them\); got policies \['dynamic'\]")
    if "classes = 3" in change[1]:
        text = text.split("[classes.chat]")[0] + "[grid]\nrate = [4.0]\n"
    with pytest.raises(SpecError, match=match):
        check_points(parse_spec(text, source="mix.toml"))


@pytest.mark.parametrize("text, match", [
    ('policy = "multibin"\nservice = "uniform"\n[params]\nrate = 1.0\n[classes.a]\nshare = 1\n',
     r"classes: a mixture's classes draw log-normal token lengths .* not apply to service = 'uniform'"),
    ('policy = "cluster"\n[params]\nrate = 1.0\nengine_policy = "continuous"\n[classes.a]\nshare = 1\n',
     r"classes: a mixture's requests are independent, not a cluster's programs; set programs = \"none\""),
    ('policy = "cluster"\n[params]\nrate = 1.0\nprograms = "none"\n[classes.a]\nshare = 1\n',
     r"classes: a cluster's mixture runs on continuous batching engines; set engine_policy = \"continuous\""),
    ('policy = "continuous"\n[params]\nrate = 1.0\n[classes]\na = 1\n', r"classes: a mixture's classes are tables"),
])
def test_a_mixture_runs_on_continuous_engines_with_token_lengths(text, match):
    with pytest.raises(SpecError, match=match):
        parse_spec("name = \"m\"\n" + text, source="m.toml")


def test_a_cluster_of_continuous_engines_takes_a_mixture(tmp_path):
    spec = parse_spec("""
name = "m"
policy = "cluster"
service_model = "profile"
reps = 2
[params]
rate = 2.0
n = 1000
engines = 2
engine_policy = "continuous"
programs = "none"
max_num_seqs = 8
[classes.a]
share = 1
[classes.b]
share = 2
output_median = 32.0
""", source="m.toml")
    ds = run_sweep(spec, tmp_path / "m.zarr", workers=1, progress=False)
    assert ds["class_completed"].sum("request_class").values.tolist() == ds["completed"].values.tolist()


MIXTURE_CAPACITY = MIXTURE.replace("reps = 2\n", "").replace('[grid]\nadmission = ["fcfs", "edf"]\nrate = [4.0]\n',
                                                             "[capacity]\n")


def test_a_capacity_spec_bounds_each_classes_metrics():
    """objective_<metric> in a class's table bounds that class's metric
    (mbbatch.capacity.CLASS_METRICS) beside the run's objective_<metric>
    parameters; a class's goodput needs the class's objectives, refused
    before any search naming the class."""
    from mbbatch.capacity import Objective
    from mbbatch.sweeps.cells import _objective

    text = MIXTURE_CAPACITY.replace("ttft_slo = 0.3", "ttft_slo = 0.3\nobjective_ttft_p99 = 0.5").replace(
        "[params]", "[params]\nobjective_latency_p99 = 60.0")
    spec = parse_spec(text, source="mix.toml")
    (_, cell), = spec.points()
    assert _objective(cell) == Objective(latency_p99=60.0, classes={"chat": Objective(ttft_p99=0.5)})
    check_points(spec)
    bad = parse_spec(text.replace("output_median = 256.0", "output_median = 256.0\nobjective_goodput = 0.9"),
                     source="mix.toml")
    with pytest.raises(SpecError, match=r"mix\.toml: at its one grid point: objective: classes\['batch'\]: goodput "
                                        r"is the share .*class 'batch' sets neither"):
        check_points(bad)
    with pytest.raises(SpecError, match=r"classes\.chat: unknown key 'objective_tbt_p99' \(not a metric of a "
                                        r"class: its objectives bound mean_latency, latency_p99, mean_ttft"):
        parse_spec(text.replace("objective_ttft_p99", "objective_tbt_p99"), source="mix.toml")
