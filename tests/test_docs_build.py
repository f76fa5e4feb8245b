"""The documentation builds as `make docs` builds it: its examples run and
return the values they quote (the doctest builder, over the docstrings and the
pages' ``{doctest}`` blocks), with warnings as errors (the HTML site:
tests/test_docs_site.py, a file of its own so that the two builds run on two
workers).  And the gallery shows every committed figure, with the spec and the
command that make it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GALLERY = DOCS / "gallery"

# what docs/conf.py loads: without them (an environment without the docs extra) the
# build cannot run, which says nothing about the documentation
DOC_TOOLS = ("sphinx", "myst_parser", "numpydoc", "pydata_sphinx_theme", "sphinxarg")


def _require_doc_tools():
    for name in DOC_TOOLS:
        pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[docs]')")


def _sphinx(builder, tmp_path):
    """One build, as `make docs` runs it (one process, warnings as errors)."""
    env = dict(os.environ, MPLBACKEND="Agg", MPLCONFIGDIR=str(tmp_path / "mplconfig"))
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "1", "-q", "-b", builder,
           "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / builder)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_examples_return_what_the_docs_quote(tmp_path):
    _require_doc_tools()
    r = _sphinx("doctest", tmp_path)
    report = (tmp_path / "doctest" / "output.txt")
    text = report.read_text() if report.exists() else ""
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{text}"
    # the builder found the examples (the docstrings' and the pages' blocks), and none failed
    tests = int(re.search(r"^\s+(\d+) tests?$", text, re.M).group(1))
    assert tests >= 40, text
    assert "0 failures in tests" in text, text
    assert "Document: glossary" in text, "the pages' {doctest} blocks are not collected"


def _gallery_text():
    return {p.name: p.read_text() for p in sorted(GALLERY.glob("*.md"))}


def test_the_gallery_shows_every_committed_figure_once():
    shown = []
    for text in _gallery_text().values():
        shown += re.findall(r"^```\{image\} \.\./\.\./figures/(\w+)\.png$", text, re.M)
    committed = sorted(p.stem for p in (ROOT / "figures").glob("*.png"))
    assert sorted(shown) == committed


def test_every_figure_the_code_draws_has_a_gallery_entry_with_its_commands():
    from mbbatch.figures import FIGURES, dataset_command

    text = "\n".join(_gallery_text().values())
    entries = dict(re.findall(r"^\(gallery-(\w+)\)=\n## `\w+`\n(.*?)(?=^\(gallery-|\Z)", text, re.M | re.S))
    assert sorted(entries) == sorted(FIGURES)
    for name, (_, datasets) in FIGURES.items():
        for d in datasets:
            assert dataset_command(d) in entries[name], (name, d)
        assert f"mbbatch figures --only {name}" in entries[name], name


def test_every_path_the_gallery_includes_exists():
    for page, text in _gallery_text().items():
        for rel in re.findall(r"^```\{(?:literalinclude|image)\} (\S+)$", text, re.M):
            assert (GALLERY / rel).resolve().is_file(), (page, rel)
        for spec in re.findall(r"\bsweeps/\w+\.toml\b", text):
            assert (ROOT / spec).is_file(), (page, spec)
