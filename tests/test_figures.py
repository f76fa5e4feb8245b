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
pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")

import mbbatch  # noqa: E402
from mbbatch import figures, theory  # noqa: E402

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
    coords = {n: np.asarray(v, dtype=float if n in ("rate", "servers", "mu") else int)
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
