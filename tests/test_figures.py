"""The figures package as a whole: the FIGURES registry and make_figures.

Every figure is written, byte-identically from run to run, without
simulating; the registry names real datasets and every figure function; the
package imports nothing of mbbatch but the closed forms.  The modules'
own tests are in test_figures_<module>.py.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import shlex
from pathlib import Path

import pytest

from mbbatch import figures
from mbbatch.cli import _parser
from mbbatch.figures import experiments, paper

from .figure_datasets import MARKS, drawn, results  # noqa: F401  (fixtures)

pytestmark = MARKS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mbbatch" / "figures"


def test_every_figure_written(drawn):
    out, files = drawn
    expected = [out / f"{n}.png" for n in figures.FIGURES]
    assert files == expected
    for f in files:
        assert f.is_file() and f.stat().st_size > 1000, f
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in expected)
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in files)


@pytest.mark.heavy
def test_figures_do_not_simulate_and_two_processes_draw_the_same_bytes(results, drawn, tmp_path):
    """``drawn`` drew every figure in this process with simulation refused;
    drawn again by two worker processes (what ``mbbatch figures`` does on
    two cores), PNG and PDF, every PNG is the same, in the same order, byte
    for byte, and every PDF is one."""
    out, files = drawn
    again = figures.make_figures(results, tmp_path, workers=2)
    assert [f.name for f in again] == [f"{n}.{ext}" for n in figures.FIGURES for ext in ("png", "pdf")]
    assert [f.name for f in again if f.suffix == ".png"] == [f.name for f in files]
    for a, b in zip(files, [f for f in again if f.suffix == ".png"]):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert all(f.read_bytes().startswith(b"%PDF") and f.stat().st_size > 1000 for f in again if f.suffix == ".pdf")
    with pytest.raises(ValueError, match="workers"):
        figures.make_figures(results, tmp_path, only="fig3", workers=0)


def test_only_one_figure(results, tmp_path):
    files = figures.make_figures(results, tmp_path, only="fig3")
    assert files == [tmp_path / "fig3.png", tmp_path / "fig3.pdf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig3.pdf", "fig3.png"]
    assert files[1].read_bytes().startswith(b"%PDF") and files[0].read_bytes().startswith(b"\x89PNG")


def test_formats_choose_the_files_written_and_a_bad_one_is_refused(results, tmp_path):
    """formats="pdf" writes the PDF alone, the same bytes as beside the PNG;
    an unknown format, or none, is refused naming the parameter before
    anything is drawn."""
    both = figures.make_figures(results, tmp_path / "both", only="fig3")
    pdf = figures.make_figures(results, tmp_path / "pdf", only="fig3", formats=["pdf"])
    assert pdf == [tmp_path / "pdf" / "fig3.pdf"] and sorted(p.name for p in (tmp_path / "pdf").iterdir()) == [
        "fig3.pdf"]
    assert pdf[0].read_bytes() == both[1].read_bytes()
    for bad in ("svg", (), ["png", "jpg"]):
        with pytest.raises(ValueError, match="formats must be one or more of png, pdf"):
            figures.make_figures(results, tmp_path / "bad", only="fig3", formats=bad)
    assert not (tmp_path / "bad").exists()


def test_unknown_figure_raises(results, tmp_path):
    with pytest.raises(ValueError, match="fig3") as info:
        figures.make_figures(results, tmp_path, only="fig99")
    assert "fig99" in str(info.value)
    assert all(name in str(info.value) for name in figures.FIGURES)


def test_registry_holds_every_figure_under_its_own_name():
    """A figure is found by its name: the function of that name in paper, experiments, workloads,
    capacity, cluster, hardware or continuous."""
    from mbbatch.figures import capacity, cluster, continuous, hardware, workloads

    defined = {}
    for module in (paper, experiments, workloads, capacity, cluster, hardware, continuous):
        public = {n: f for n, f in inspect.getmembers(module, inspect.isfunction)
                  if f.__module__ == module.__name__ and not n.startswith("_")}
        assert sorted(module.__all__) == sorted(public), module.__name__
        assert not set(public) & set(defined), "a figure name defined twice"
        defined.update(public)
    assert {name: func for name, (func, _) in figures.FIGURES.items()} == defined


@pytest.mark.parametrize("name", list(figures.FIGURES))
def test_registered_datasets_have_a_real_command(name):
    """Each dataset's command is one the CLI accepts, and a sweep's spec exists."""
    datasets = figures.FIGURES[name][1]
    # (hardware_fit and hardware_moe read the measurements shipped with mbbatch, no dataset)
    assert (datasets or name in ("hardware_fit", "hardware_moe")) and len(set(datasets)) == len(datasets)
    for d in datasets:
        argv = shlex.split(figures.dataset_command(d))
        assert argv[0] == "mbbatch"
        args = _parser().parse_args(argv[1:])  # SystemExit on an unknown example name
        if args.command == "sweep":
            assert all((ROOT / spec).is_file() for spec in args.spec), args.spec
        else:
            assert (args.command, args.name) == ("example", [d])
        assert Path(args.out) == figures.dataset_path("results", d)


def test_package_imports_only_theory_and_itself():
    """Figure code reads stored Datasets: never the simulation or sweep code
    (the closed forms, the metric and parameter tables for labels, and the
    statistics)."""
    own = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "mbbatch" for a in node.names), path.name
            elif isinstance(node, ast.ImportFrom):
                where = f"{path.name}:{node.lineno}"
                if node.level == 0:
                    assert node.module.split(".")[0] != "mbbatch", where
                elif node.level == 1:
                    assert (node.module or "") in own or (
                        node.module is None and {a.name for a in node.names} <= own), where
                else:
                    assert node.level == 2, where
                    # (and the measured hardware's fits, which simulate nothing)
                    allowed = {"theory", "metrics", "params", "stats", "profiles", "service_models"}
                    assert (node.module or "").split(".")[0] in allowed or (
                        node.module is None and {a.name for a in node.names} <= allowed), where


@pytest.mark.parametrize("module", ["mbbatch.figures"] + [
    f"mbbatch.figures.{p.stem}" for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_figures_of_an_absent_trace_are_skipped_with_a_note(tmp_path):
    """make figures without the trace: fig6 and fig7 are skipped (a warning
    naming the file), the other figures' datasets are still required."""
    from mbbatch.figures import TraceFigureSkipped, make_figures

    with pytest.warns(TraceFigureSkipped, match="AzureLLMInferenceTrace_conv.csv"):
        with pytest.raises(FileNotFoundError) as exc:
            make_figures(tmp_path, tmp_path / "out")
    assert "fig3" in str(exc.value) and "fig6" not in str(exc.value)
    with pytest.raises(FileNotFoundError, match="fig6"):
        make_figures(tmp_path, tmp_path / "out", only="fig6")     # asked for by name: an error


def test_a_figure_of_an_interrupted_sweep_says_what_it_leaves_out(results, tmp_path):
    """Grid points not done (a sweep killed before its end) are left out of
    a figure, with a note naming the store, how many, and the command that
    resumes it into the same folder; a complete store draws without one."""
    import shutil
    import warnings

    import zarr

    from mbbatch.figures import IncompleteDataset, make_figures

    with warnings.catch_warnings():
        warnings.simplefilter("error", IncompleteDataset)
        make_figures(results, tmp_path / "whole", only="fig3")
    shutil.copytree(results / "fig3.zarr", tmp_path / "res" / "fig3.zarr")
    done = zarr.open_array(str(tmp_path / "res" / "fig3.zarr"), path="done", mode="r+")
    flags = done[...]
    flags.flat[[1, 4]] = False
    done[...] = flags
    with pytest.warns(IncompleteDataset) as caught:
        make_figures(tmp_path / "res", tmp_path / "out", only="fig3")
    message = str(caught[0].message)
    assert f"has 2 of {flags.size} grid points not done" in message
    assert f"mbbatch sweep sweeps/fig3.toml --out {tmp_path / 'res' / 'fig3.zarr'}" in message



def test_the_figures_command_writes_the_formats_asked_for(results, tmp_path, capsys):
    """`mbbatch figures --only fig3 --format png` writes the PNG alone and prints its path."""
    from mbbatch.cli import main

    assert main(["figures", "--results", str(results), "--out", str(tmp_path), "--only", "fig3", "--format", "png",
                 "--workers", "1"]) in (0, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig3.png"]
    assert capsys.readouterr().out.split() == [str(tmp_path / "fig3.png")]
