"""Figure scripts: drawn from small synthetic datasets of the sweep schema.

The datasets below have the shape ``mbbatch sweep`` writes (one dimension per
grid axis plus ``rep``, per-rep ``sim_*`` variables, their means and 95%
t-intervals, closed forms on the same coordinates, ``unstable`` and ``done``)
with made-up simulated values around the closed forms.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import scipy.stats as st
import xarray as xr

pytest.importorskip("zarr")
pytestmark = [pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning"),
              # the controller coordinate is a fixed-length string, as in the real store
              pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3")]

import mbbatch  # noqa: E402
from mbbatch import figures, schema, theory  # noqa: E402

REPS = 3

_UNITS = {
    "sim_throughput": "requests/s", "sim_mean_latency": "s", "sim_latency_p50": "s",
    "sim_latency_p95": "s", "sim_latency_p99": "s", "sim_utilization": "1",
    "sim_mean_batch_service": "s", "completed": "requests", "excluded_partial": "requests",
    "backlog_growing": "1", "theory_mean_batch_service": "s", "theory_service_rate": "requests/s",
    "theory_throughput": "requests/s", "theory_latency": "s", "capacity": "requests/s",
    "theory_throughput_bound": "requests/s", "unstable": "1", "done": "1",
}


def _attrs(name):
    base = name
    for suffix in ("_mean", "_ci_low", "_ci_high"):
        base = base.removesuffix(suffix)
    return {"units": _UNITS.get(base, "1"), "long_name": name.replace("_", " "),
            "description": f"synthetic {name}"}


def _sweep(name, axes, cell, *, attrs, saturated=False, reps=REPS, seed=0):
    """A sweep dataset over ``axes`` (dict name -> values).

    ``cell(**point)`` returns (E[t_service], saturated throughput, capacity,
    Corollary A.1.1 bound or NaN, k, B, servers) for one grid point.
    """
    rng = np.random.default_rng(seed)
    names = list(axes)
    shape = tuple(len(v) for v in axes.values())
    out = {v: np.full(shape, np.nan) for v in
           ("theory_mean_batch_service", "theory_service_rate", "theory_throughput",
            "theory_latency", "capacity", "theory_throughput_bound")}
    unstable = np.zeros(shape, bool)
    thr = np.full(shape + (reps,), np.nan)
    lat = np.full(shape + (reps,), np.nan)
    for idx in np.ndindex(*shape):
        point = {n: axes[n][i] for n, i in zip(names, idx)}
        ets, sr, cap, bound, k, B, servers = cell(**point)
        out["theory_mean_batch_service"][idx] = ets
        out["theory_service_rate"][idx] = sr
        out["capacity"][idx] = cap
        out["theory_throughput_bound"][idx] = bound
        if saturated:
            out["theory_throughput"][idx] = sr
            thr[idx] = sr * (1 + 0.004 * rng.standard_normal(reps))
            lat[idx] = 1e3 * (1 + 0.01 * rng.standard_normal(reps))
            continue
        rate = point["rate"]
        out["theory_throughput"][idx] = min(rate, sr)
        lem = ets + (B - 1) * k / (2 * rate)
        out["theory_latency"][idx] = lem
        rho = rate / sr
        unstable[idx] = rho >= 1
        if rho >= 1:
            thr[idx] = sr * (1 + 0.01 * rng.standard_normal(reps))
            lat[idx] = 5e3 * (1 + 0.05 * rng.standard_normal(reps))
        else:
            extra = 0.0 if math.isinf(servers) else ets * rho ** (2 * servers) / (1 - rho)
            thr[idx] = rate * (1 + 0.01 * rng.standard_normal(reps))
            lat[idx] = (lem + extra) * (1 + 0.02 * rng.standard_normal(reps))

    dims = tuple(names)
    rdims = dims + ("rep",)
    t = st.t.ppf(0.975, reps - 1)
    data = {}
    for var, x in (("sim_throughput", thr), ("sim_mean_latency", lat)):
        m, h = x.mean(-1), t * x.std(-1, ddof=1) / math.sqrt(reps)
        data[var] = (rdims, x)
        data[f"{var}_mean"] = (dims, m)
        data[f"{var}_ci_low"] = (dims, m - h)
        data[f"{var}_ci_high"] = (dims, m + h)
    for q, f in (("p50", 0.9), ("p95", 1.8), ("p99", 2.3)):
        data[f"sim_latency_{q}"] = (rdims, lat * f)
    data["sim_utilization"] = (rdims, np.clip(thr / out["theory_service_rate"][..., None], 0, 1))
    sim_ets = out["theory_mean_batch_service"][..., None] * (1 + 0.003 * rng.standard_normal(thr.shape))
    data["sim_mean_batch_service"] = (rdims, sim_ets)
    data["sim_mean_batch_service_mean"] = (dims, sim_ets.mean(-1))
    data["completed"] = (rdims, np.full(thr.shape, int(attrs["n"]) - 100))
    data["excluded_partial"] = (rdims, np.full(thr.shape, 100))
    data["backlog_growing"] = (rdims, np.broadcast_to(unstable[..., None], thr.shape).copy())
    for var, x in out.items():
        data[var] = (dims, x)
    data["unstable"] = (dims, unstable)
    data["done"] = (dims, np.ones(shape, bool))
    coords = {n: np.asarray(v, dtype=float if n in ("rate", "servers", "mu", "max_wait") else int)
              for n, v in axes.items()}
    coords["rep"] = np.arange(reps)
    ds = xr.Dataset(data, coords=coords)
    for var in ds.data_vars:
        ds[var].attrs.update(_attrs(var))
    for n in names:
        ds[n].attrs.update(units={"rate": "requests/s", "servers": "servers"}.get(n, "1"),
                           long_name=n)
    ds.attrs.update(name=name, spec=f"# synthetic spec for {name}\n", spec_hash="0" * 16,
                    reps=reps, arrivals="saturated" if saturated else "poisson", **attrs)
    return ds


def _uniform_cell(B=128, l_min=1.0, l_max=20.0, bins=None, servers=1.0):
    """Closed forms for uniform service; ``bins``/``servers`` when not an axis."""
    def cell(**point):
        k = int(point.get("bins", bins))
        c = float(point.get("servers", servers))
        ets = float(theory.service_time(B, l_min, l_max, k))
        sr = c * B / ets
        cap = c * float(theory.capacity(B, l_min, l_max))
        return ets, sr, cap, np.nan, k, B, c
    return cell


def _uniform_attrs(**extra):
    return dict(batch_size=128, l_min=1.0, l_max=20.0, n=128000, service="uniform",
                edges="equal_mass", **extra)


def _expon_cell(B=200, mu=0.1):
    @functools.lru_cache(maxsize=None)
    def closed_forms(k):
        edges = theory.exponential_boundaries(B, mu, k)
        ets = float(theory.batch_service_time(st.expon(scale=1 / mu), edges, B))
        bound = float(theory.exponential_throughput_bound(B, mu, k))
        return ets, B / ets, B * mu, bound, k, B, 1.0

    def cell(**point):
        return closed_forms(int(point["bins"]))
    return cell


def _fig1b():
    service = np.array([1.0, 5.0, 2.0, 6.0])
    bins = np.array([[0, 0, 0, 0], [0, 1, 0, 1]])
    batch = np.array([[0, 0, 1, 1], [0, 1, 0, 1]])
    start = np.array([[0.0, 0.0, 5.0, 5.0], [0.0, 2.0, 0.0, 2.0]])
    completion = np.array([[5.0, 5.0, 11.0, 11.0], [2.0, 8.0, 2.0, 8.0]])
    ds = xr.Dataset(
        {"service": ("request", service), "bin": (("case", "request"), bins),
         "batch": (("case", "request"), batch), "start": (("case", "request"), start),
         "completion": (("case", "request"), completion)},
        coords={"case": ["one_bin", "two_bins"], "request": np.arange(4)},
        attrs={"batch_size": 2, "makespan_one_bin": 11.0, "makespan_two_bins": 8.0},
    )
    for var in ds.data_vars:
        ds[var].attrs.update(units="s" if var in ("service", "start", "completion") else "1",
                             long_name=var, description=f"synthetic {var}")
    return ds


# ---------------------------------------------------------------- dynamic batching experiments

_TOKEN_ATTRS = dict(prompt_median=256.0, prompt_sigma=0.6, output_median=128.0, output_sigma=1.0,
                    d_sla=0.0074, eps_d=0.00001, eta=40000.0, service="decode",
                    confidence_level=0.95, servers=1)
STEP = dict(rate=1.0, rate_high=3.0, t_up=2000.0, t_down=4000.0)
#: the synthetic controller_step's b_target: 70, down to 12 SETTLE_UP s after the
#: step up, back to 70 SETTLE_DOWN s after the step down (spec controller)
SETTLE_UP, SETTLE_DOWN = 300.0, 1000.0


def _token_sweep(name, axes, cell, *, policy, attrs, reps=REPS, seed=0, arrivals="poisson",
                 time_series=None):
    """A sweep dataset of a token policy (schema.TOKEN_VARIABLES) over ``axes``.

    ``cell(**point)`` returns (capacity in requests/s, SLA violation share) of one
    grid point; ``time_series(point, rep, time)`` the ts_* values (load steps).
    """
    rng = np.random.default_rng(seed)
    names = list(axes)
    shape = tuple(len(v) for v in axes.values())
    rdims = tuple(names) + ("rep",)
    per_rep = {v: np.full(shape + (reps,), np.nan) for v, d in schema.TOKEN_VARIABLES.items() if d[0]}
    unstable = np.zeros(shape, bool)
    time = None
    if time_series is not None:
        time = np.linspace(0.0, 2 * attrs["t_down"] - attrs["t_up"], schema.TIME_POINTS)
        ts = {v: np.full(shape + (reps, time.size), np.nan) for v in schema.TIME_SERIES}
    for idx in np.ndindex(*shape):
        point = {n: axes[n][i] for n, i in zip(names, idx)}
        cap, sla = cell(**point)
        rate = point.get("rate", attrs.get("rate"))
        rho = rate / cap
        unstable[idx] = 0.97 <= rho < 1.3  # the sweep's flag misses heavier overload
        noise = 1 + 0.01 * rng.standard_normal(reps)
        per_rep["sim_throughput"][idx] = min(rate, cap) * noise
        lat = 3.0 / max(1 - rho, 0.02) if rho < 1 else 500.0 * rho
        per_rep["sim_mean_latency"][idx] = lat * noise
        for q, f in (("p50", 0.8), ("p95", 3.0), ("p99", 4.0)):
            per_rep[f"sim_latency_{q}"][idx] = f * lat * noise
        per_rep["sim_sla_violation_tokens"][idx] = np.clip(sla * noise, 0, 1)
        per_rep["sim_sla_violation_requests"][idx] = np.clip(0.9 * sla * noise, 0, 1)
        per_rep["sim_batch_size_mean"][idx] = 1 + 10 * min(rho, 1) * noise
        per_rep["sim_batch_size_std"][idx] = 0.5 * per_rep["sim_batch_size_mean"][idx]
        per_rep["sim_utilization"][idx] = min(rho, 1.0) * noise / noise.max()
        per_rep["sim_token_throughput"][idx] = 211 * per_rep["sim_throughput"][idx]
        per_rep["sim_mean_ttft"][idx] = per_rep["sim_mean_latency"][idx] * 0.9
        per_rep["sim_mean_tbt"][idx] = 0.0072
        per_rep["sim_memory_peak"][idx] = 0.5 * noise
        per_rep["sim_memory_mean"][idx] = 0.2 * noise
        if time_series is not None:
            for r in range(reps):
                for v, x in time_series(point, r, time).items():
                    ts[v][idx + (r,)] = x
    data = {}
    for v, (is_rep, dtype, units, desc) in schema.TOKEN_VARIABLES.items():
        if not is_rep:
            continue
        x = per_rep[v]
        if dtype == "i8":
            x = np.full(shape + (reps,), {"completed": int(attrs["n"]), "n_batches": 1000}.get(v, 0))
        elif dtype == "bool":
            x = (np.broadcast_to(unstable[..., None], x.shape).copy() if v == "backlog_growing"
                 else np.zeros(x.shape, bool))
        data[v] = (rdims, x)
    t = st.t.ppf(0.975, reps - 1)
    for base, (m, lo, hi) in schema.AGGREGATES.items():
        if m not in schema.TOKEN_VARIABLES:
            continue
        x = per_rep[base]
        data[m] = (tuple(names), x.mean(-1))
        if lo is not None:
            h = t * x.std(-1, ddof=1) / math.sqrt(reps)
            data[lo] = (tuple(names), x.mean(-1) - h)
            data[hi] = (tuple(names), x.mean(-1) + h)
    data["unstable"] = (tuple(names), unstable)
    data["done"] = (tuple(names), np.ones(shape, bool))
    coords = {}
    for n, v in axes.items():
        coords[n] = np.asarray(v, dtype=str if n == "controller" else float if n == "rate" else int)
    coords["rep"] = np.arange(reps)
    if time is not None:
        coords["time"] = time
        for v in schema.TIME_SERIES:
            data[v] = (rdims + ("time",), ts[v])
    ds = xr.Dataset(data, coords=coords)
    for v in ds.data_vars:
        d = schema.TOKEN_VARIABLES.get(v) or (None, None) + schema.TIME_SERIES[v]
        ds[v].attrs.update(units=d[2], long_name=v.replace("_", " "), description=f"synthetic {v}")
    ds["rate" if "rate" in ds.coords else names[0]].attrs.update(units="requests/s")
    if time is not None:
        ds["time"].attrs.update(units="s", long_name="time")
    ds.attrs.update(name=name, spec=f"# synthetic spec for {name}\n", spec_hash="0" * 16, reps=reps,
                    policy=policy, arrivals=arrivals, **_TOKEN_ATTRS, **attrs)
    return ds


def _sla_share(rate, knee):
    return 1.0 / (1.0 + math.exp(-3.0 * (rate - knee)))


def _step_series(point, rep, time):
    """b_target etc. through the load step; the multiplicative variant settles later."""
    late = 1.0 if point["controller"] == "spec" else 1.5
    up, down = STEP["t_up"], STEP["t_down"]
    wiggle = 1 + 0.03 * np.sin(time / 50.0 + rep)
    b = np.where(time < up + late * SETTLE_UP, 70.0, 12.0)
    b = np.where(time >= down + late * SETTLE_DOWN, 70.0, b)
    b = np.where(time < up, 70.0, b) * wiggle
    high = (time >= up) & (time < down + late * SETTLE_DOWN)
    out = {"ts_b_target": b,
           "ts_b_low": np.where(high, 10.0, 6.0),
           "ts_b_high": np.where(high, 14.0, 256.0),
           "ts_tau_avg": np.where(high, 0.0074, 0.0062) * (1 + 0.01 * np.cos(time / 30.0 + rep)),
           "ts_queue": np.where(high, 500.0, 0.0)}
    for x in out.values():
        x[0] = np.nan  # before the first batch
    return out


def write_token_results(path):
    rates = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0]
    caps = {8: 1.7, 32: 3.7, 128: 6.5}
    dsets = {
        "mb_only": _sweep("mb_only", {"bins": [1, 2, 4, 8]}, _uniform_cell(B=32),
                          attrs={**_uniform_attrs(servers=1.0), "batch_size": 32}, saturated=True),
        "dyn_only": _token_sweep("dyn_only", {"rate": rates}, lambda rate: (2.1, _sla_share(rate, 1.8)),
                                 policy="dynamic", attrs=dict(n=20000, b_min=1, b_max=256), seed=1),
        "static_b": _token_sweep("static_b", {"batch_size": [8, 32, 128], "rate": rates},
                                 lambda batch_size, rate: (caps[batch_size],
                                                           0.0 if batch_size == 8 else _sla_share(rate, 2.0)),
                                 policy="static", attrs=dict(n=20000), seed=2),
        "mb_dynamic": _token_sweep("mb_dynamic", {"rate": rates}, lambda rate: (3.8, _sla_share(rate, 3.2)),
                                   policy="multibin_dynamic", attrs=dict(n=20000, bins=4, b_min=1,
                                                                         b_max=256), seed=3),
        "controller_step": _token_sweep("controller_step", {"controller": ["spec", "multiplicative"]},
                                        lambda controller: (2.1, 0.7), policy="dynamic",
                                        arrivals="step", time_series=_step_series, reps=5, seed=4,
                                        attrs=dict(n=10000, b_min=1, b_max=256, **STEP)),
    }
    mw = _sweep("max_wait", {"max_wait": [2.0, 5.0, 10.0, 20.0, 50.0, 100.0, math.inf],
                             "rate": [1.0, 2.0, 4.0, 6.0, 8.0, 9.5]},
                _uniform_cell(bins=4), attrs=_uniform_attrs(bins=4, servers=1.0), seed=5)
    finite = np.isfinite(mw["max_wait"].values)
    for v in ("theory_mean_batch_service", "theory_service_rate", "theory_throughput", "theory_latency",
              "capacity"):  # closed forms only for the classic policy
        mw[v] = mw[v].where(~xr.DataArray(finite, dims="max_wait"))
    short = xr.DataArray(mw["max_wait"].values <= 5.0, dims="max_wait")
    for v in ("sim_throughput", "sim_throughput_mean", "sim_throughput_ci_low", "sim_throughput_ci_high"):
        mw[v] = mw[v].where(~short, mw[v] * 0.1)  # tiny batches: the server saturates early
    mw["unstable"] = mw["unstable"] | short
    dsets["max_wait"] = mw
    for name, ds in dsets.items():
        ds.to_zarr(path / f"{name}.zarr", mode="w")
    return path


def write_results(path):
    path.mkdir(parents=True, exist_ok=True)
    rates = np.array([1.0, 2.5, 4.0, 5.5, 7.0, 8.0, 9.0, 10.0, 11.0, 12.5, 14.0])
    dsets = {
        "fig3": _sweep("fig3", {"bins": [1, 2, 3, 4, 5], "rate": rates}, _uniform_cell(),
                       attrs=_uniform_attrs(servers=1.0)),
        "fig4": _sweep("fig4", {"bins": [1, 2, 3], "rate": rates}, _uniform_cell(),
                       attrs=_uniform_attrs(servers=1.0)),
        "fig8": _sweep("fig8", {"bins": [1, 2, 3, 4, 5], "rate": np.array([1.0, 3.0, 5.0, 7.0, 9.0, 10.5, 12.0, 13.5, 15.0])},
                       _expon_cell(), attrs=dict(batch_size=200, mu=0.1, n=200000,
                                                 service="expon", edges="lemma_a1", servers=1.0)),
        "thm43": _sweep("thm43", {"bins": [1, 2, 4, 8, 16, 32, 64]}, _uniform_cell(),
                        attrs=_uniform_attrs(servers=1.0), saturated=True),
        "servers": _sweep("servers", {"servers": [1.0, 2.0, 8.0, math.inf], "rate": rates},
                          _uniform_cell(bins=2), attrs=_uniform_attrs(bins=2)),
    }
    for name, ds in dsets.items():
        ds.to_zarr(path / f"{name}.zarr", mode="w")
    _fig1b().to_netcdf(path / "fig1b.nc")
    write_token_results(path)
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return write_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def drawn(results, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, figures.make_figures(results, out)


def test_every_figure_written(drawn):
    out, files = drawn
    expected = [out / f"{n}.{ext}" for n in figures.FIGURES for ext in ("png", "pdf")]
    assert files == expected
    for f in files:
        assert f.is_file() and f.stat().st_size > 1000, f
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in expected)
    assert all(f.read_bytes().startswith(b"%PDF") for f in files if f.suffix == ".pdf")
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in files if f.suffix == ".png")


def test_two_runs_are_byte_identical_and_do_not_simulate(results, drawn, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a figure script ran a simulation")

    monkeypatch.setattr(mbbatch, "simulate", refuse)
    monkeypatch.setattr(mbbatch.simulation, "simulate", refuse)
    out, files = drawn
    again = figures.make_figures(results, tmp_path)
    assert [f.name for f in again] == [f.name for f in files]
    for a, b in zip(files, again):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_no_dates_or_versions_in_files(drawn):
    _, files = drawn
    for f in files:
        data = f.read_bytes()
        assert b"CreationDate" not in data and b"Matplotlib" not in data, f.name


def test_only_one_figure(results, tmp_path):
    files = figures.make_figures(results, tmp_path, only="fig3")
    assert files == [tmp_path / "fig3.png", tmp_path / "fig3.pdf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig3.pdf", "fig3.png"]


def test_unknown_figure_raises(results, tmp_path):
    with pytest.raises(ValueError, match="fig3") as info:
        figures.make_figures(results, tmp_path, only="fig99")
    assert "fig99" in str(info.value)
    assert all(name in str(info.value) for name in figures.FIGURES)


def test_missing_dataset_names_the_command(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(results, tmp_path / "out", only="fig4")
    msg = str(info.value)
    assert "fig4.zarr" in msg
    assert "mbbatch sweep sweeps/fig4.toml --out results/fig4.zarr" in msg
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="mbbatch example fig1b --out results/fig1b.nc"):
        figures.make_figures(results, tmp_path / "out", only="fig1b")


def test_cells_not_done_are_left_out(results, tmp_path):
    ds = xr.open_zarr(results / "fig3.zarr", chunks=None).load()
    ds["done"][:] = False
    sub = tmp_path / "partial"
    sub.mkdir()
    ds.to_zarr(sub / "fig3.zarr", mode="w")
    assert np.isnan(figures._line(ds, "sim_throughput_mean", "rate", bins=1)).all()
    figures.make_figures(sub, tmp_path / "out", only="fig3")


EXPERIMENTS = {
    "mb_only": ["mb_only"],
    "dynamic_vs_static": ["dyn_only", "static_b"],
    "controller_step": ["controller_step"],
    "mb_dynamic": ["mb_dynamic", "dyn_only", "static_b"],
    "max_wait": ["max_wait"],
}


def test_experiment_figures_registered():
    for name, datasets in EXPERIMENTS.items():
        assert figures.FIGURES[name][1] == datasets


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_experiment_figure_alone_is_reproducible(results, tmp_path, name):
    a = figures.make_figures(results, tmp_path / "a", only=name)
    b = figures.make_figures(results, tmp_path / "b", only=name)
    assert [f.name for f in a] == [f"{name}.png", f"{name}.pdf"]
    for x, y in zip(a, b):
        assert x.is_file() and x.stat().st_size > 1000
        assert x.read_bytes() == y.read_bytes(), x.name


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_experiment_missing_datasets_name_their_commands(tmp_path, name):
    empty = tmp_path / "results"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(empty, tmp_path / "out", only=name)
    msg = str(info.value)
    for d in EXPERIMENTS[name]:
        assert f"{d}.zarr" in msg
        assert f"mbbatch sweep sweeps/{d}.toml --out results/{d}.zarr" in msg
    assert not (tmp_path / "out").exists()


def test_one_missing_dataset_of_several(results, tmp_path):
    import shutil

    partial = tmp_path / "results"
    for d in ("mb_dynamic", "dyn_only"):
        shutil.copytree(results / f"{d}.zarr", partial / f"{d}.zarr")
    with pytest.raises(FileNotFoundError) as info:
        figures.make_figures(partial, tmp_path / "out", only="mb_dynamic")
    msg = str(info.value)
    assert "mbbatch sweep sweeps/static_b.toml --out results/static_b.zarr" in msg
    assert "sweeps/mb_dynamic.toml" not in msg and "sweeps/dyn_only.toml" not in msg
    assert not (tmp_path / "out").exists()


def test_settling_times(results):
    ds = xr.open_zarr(results / "controller_step.zarr", chunks=None).load()
    got = figures.settling_times(ds)
    step = float(ds["time"][1] - ds["time"][0])
    assert set(got) == {"spec", "multiplicative"}
    for ctl, late in (("spec", 1.0), ("multiplicative", 1.5)):
        for key, expected, ref in (("up", SETTLE_UP, 12.0), ("down", SETTLE_DOWN, 70.0)):
            dt, median, in_tail = got[ctl][key]
            # the first grid time at or after the change
            assert dt == pytest.approx(math.ceil(late * expected / step) * step), (ctl, key)
            assert median == pytest.approx(ref, rel=0.05)
            assert not in_tail


def test_settling_edge_cases():
    t = np.arange(0.0, 101.0, 10.0)
    flat = np.full(t.size, 5.0)
    assert figures._settling(t, flat, 0.0, 100.0)[:2] == (0.0, 5.0)
    drifting = np.linspace(10.0, 30.0, t.size)  # still rising at the end
    dt, ref, late = figures._settling(t, drifting, 0.0, 100.0)
    assert late and dt >= 80.0
    last_out = flat.copy()
    last_out[-1] = 9.0  # the last sample leaves the band around the tail's median 5
    dt, ref, late = figures._settling(t, last_out, 0.0, 100.0)
    assert math.isnan(dt) and ref == 5.0


def test_token_series_and_overload(results):
    ds = xr.open_zarr(results / "dyn_only.zarr", chunks=None).load()
    s = figures._token_series(ds)
    rates = ds["rate"].values
    thr = ds["sim_throughput_mean"].values
    np.testing.assert_array_equal(s["unstable"], ds["unstable"].values | (thr < figures._OVERLOAD * rates))
    assert s["unstable"][-1] and not ds["unstable"].values[-1]  # overload the flag misses
    # the per-rep t-interval reproduces the stored one
    m, lo, hi = figures._rep_ci(ds, "sim_throughput", "rate")
    np.testing.assert_allclose(m, thr)
    np.testing.assert_allclose(lo, ds["sim_throughput_ci_low"].values)
    np.testing.assert_allclose(hi, ds["sim_throughput_ci_high"].values)
    np.testing.assert_allclose(s["sla"][0], 100 * ds["sim_sla_violation_tokens_mean"].values)
