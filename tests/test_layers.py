"""The package's layers, read from its imports (every import, those inside
functions too): kernels -> model objects and ``simulate`` -> sweeps ->
figures -> CLI, each importing only from its own layer or those below, and
no module depending on itself through others.  Every module has its test
module (tests/test_<path>.py), as a newcomer looks for it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mbbatch"

#: the layers, bottom up: a module's layer is that of the first prefix it starts with, else MODEL
KERNELS, MODEL, SWEEPS, FIGURES, TOP = range(5)
LAYERS = {"mbbatch._kernels": KERNELS, "mbbatch.sweeps": SWEEPS, "mbbatch.figures": FIGURES,
          "mbbatch.cli": TOP, "mbbatch": TOP}   # (the package itself: its API gathers every layer)
#: the figures read stored Datasets: of the model layer, only these (see test_figures)
FIGURES_MAY_READ = ("mbbatch.theory", "mbbatch.metrics", "mbbatch.params", "mbbatch.stats",
                    # the measured hardware and the fits of the service models (they simulate nothing)
                    "mbbatch.profiles", "mbbatch.service_models")
#: modules with nothing of their own to test
NO_TESTS = {"mbbatch._version": "one constant (tests/test_provenance.py checks it is pyproject's version)"}


def _modules() -> dict:
    """Dotted name -> path of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _layer(name: str) -> int:
    if name in LAYERS:
        return LAYERS[name]
    for prefix, layer in LAYERS.items():
        if prefix != "mbbatch" and (name == prefix or name.startswith(prefix + ".")):
            return layer
    return MODEL


def _imports(name: str) -> set:
    """The package's modules that module ``name`` imports (anywhere in it)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from . import x`: x is a module when there is one of that name
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:     # `import mbbatch.sweeps.store as s`, `from numpy import x`
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def test_the_import_reader_sees_relative_lazy_and_package_imports():
    # (a reader that saw nothing would pass every test below)
    assert "mbbatch._kernels.common" in GRAPH["mbbatch._kernels.dynamic"]           # from .common import ...
    assert "mbbatch.simulation" in GRAPH["mbbatch.examples"]                        # from .simulation import
    assert "mbbatch.workload" in GRAPH["mbbatch.examples"]                          # inside a function
    assert "mbbatch.theory" in GRAPH["mbbatch.figures.paper"]                       # from .. import theory
    assert sum(map(len, GRAPH.values())) > 100


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_and_those_below(name):
    up = sorted(t for t in GRAPH[name] if _layer(t) > _layer(name))
    assert not up, f"{name} (layer {_layer(name)}) imports from above: {up}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _layer(n) == KERNELS))
def test_kernels_import_only_kernels(name):
    assert all(_layer(t) == KERNELS for t in GRAPH[name]), GRAPH[name]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _layer(n) == FIGURES))
def test_figures_read_only_the_closed_forms_and_tables(name):
    other = sorted(t for t in GRAPH[name] if _layer(t) != FIGURES
                   and not any(t == m or t.startswith(m + ".") for m in FIGURES_MAY_READ))
    assert not other, other


def test_no_module_depends_on_itself():
    """No import cycle, through any number of modules (depth-first search)."""
    state, path = {}, []

    def visit(name):
        state[name] = "open"
        path.append(name)
        for t in sorted(GRAPH[name]):
            if state.get(t) == "open":
                cycle = path[path.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        path.pop()
        state[name] = "done"

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if MODULES[n].name != "__init__.py" and n not in NO_TESTS))
def test_every_module_has_its_test_module(name):
    stem = name.removeprefix("mbbatch.").replace(".", "_").lstrip("_")
    assert (ROOT / "tests" / f"test_{stem}.py").is_file(), f"{name}: no tests/test_{stem}.py"
