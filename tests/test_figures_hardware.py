"""mbbatch.figures.hardware: the fits to measured hardware, and the batching
policies on two measured GPUs beside the default DecodeModel."""

from __future__ import annotations

import numpy as np

from mbbatch import figures, profiles
from mbbatch.figures import hardware

from .figure_datasets import MARKS

pytestmark = MARKS


def test_hardware_fit_draws_from_an_empty_folder(tmp_path):
    """It reads the measurements shipped with mbbatch: no results folder is needed."""
    empty = tmp_path / "results"
    empty.mkdir()
    assert figures.FIGURES["hardware_fit"][1] == []
    files = figures.make_figures(empty, tmp_path / "out", only="hardware_fit")
    assert [f.name for f in files] == ["hardware_fit.png", "hardware_fit.pdf"]


def test_its_four_profiles_are_two_gpus_and_two_model_sizes():
    names = hardware.FIT_PROFILES
    assert set(names) <= set(profiles.names())
    assert {n.split("/")[0] for n in names} == {"H100", "A100"}
    assert {"70" in n.split("/")[2] for n in names} == {True, False}


def test_the_held_out_errors_of_each_family():
    """The figure's bottom panel: every family fitted to every profile; IterationModel's median is the
    profiles' (5.4 %, each profile fitted with its measured prefill where there is one), below every other
    family's."""
    errs = hardware._holdout_errors()
    assert list(errs) == [label for label, _, _ in hardware.FAMILIES]
    assert all(e.size == len(profiles.names()) for e in errs.values())
    mine = np.nanmedian(errs["IterationModel (relative)"])
    assert round(100 * mine, 1) == 5.4
    assert all(np.nanmedian(e) > mine for label, e in errs.items() if label != "IterationModel (relative)")


def test_carried_is_the_last_stable_rate_before_the_first_unstable():
    s = {"rate": np.array([0.5, 1.0, 2.0, 3.0]), "unstable": np.array([False, False, True, False])}
    assert hardware._carried(s) == 1.0
    assert hardware._carried({**s, "unstable": np.ones(4, bool)}) == 0.0


def test_the_multibin_figure_draws_from_its_sweep(tmp_path):
    """hardware_multibin's spec, run small (n = 20,000), draws; its store
    holds eq. (2) beside each cell, rising with the bins towards its
    capacity, and the simulation near it."""
    from pathlib import Path

    from mbbatch.sweeps import run_sweep
    from mbbatch.sweeps.spec import parse_spec

    text = (Path(__file__).resolve().parents[1] / "sweeps" / "hardware_multibin.toml").read_text()
    spec = parse_spec(text.replace("n = 1000000", "n = 20000").replace("reps = 3", "reps = 2"))
    ds = run_sweep(spec, tmp_path / "hardware_multibin.zarr", workers=1, progress=False).load()
    thm = ds["theory_service_rate"]
    assert np.all(thm.diff("bins") > 0) and np.all(thm < ds["capacity"])
    rel = ds["sim_throughput_mean"] / thm - 1.0
    assert float(np.abs(rel).max()) < 0.1
    files = figures.make_figures(tmp_path, tmp_path / "out", only="hardware_multibin")
    assert [f.name for f in files] == ["hardware_multibin.png", "hardware_multibin.pdf"]


def test_the_mixture_of_experts_figure_draws_from_the_shipped_data(tmp_path):
    """hardware_moe reads no sweep: its Mixtral profiles are mixtures of experts, and the dense fit it
    draws beside each is worse held out."""
    assert figures.FIGURES["hardware_moe"][1] == []
    for name in hardware.MOE_PROFILES:
        assert profiles.get(name).experts == 8
        assert hardware._dense_fit(name).holdout_error > 3 * profiles.fit(name).holdout_error
    files = figures.make_figures(tmp_path / "empty", tmp_path / "out", only="hardware_moe")
    assert [f.name for f in files] == ["hardware_moe.png", "hardware_moe.pdf"]
