"""The README is a first read, and its examples run as written: the values
its quickstart's comments quote are what the code returns (to the digits
quoted), its command lines (and the user guide's) parse, and the pages and
files it links to exist."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"

#: The README's length limit, in words (`wc -w`): the rest is the user guide's.
MAX_WORDS = 1250


def blocks(path: Path = README, lang: str = "python") -> list:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


def block_with(text: str, path: Path = README) -> str:
    (found,) = [b for b in blocks(path) if text in b]
    return found


def quoted(block):
    """(expression, numbers) for every expression statement whose comment
    quotes its value: the comment's leading number (or bracketed list), else
    the first after its first colon ("Theorem 4.2: [6.45, ...]"), else the
    first anywhere in it."""
    lines = block.splitlines()
    out = []
    for node in ast.parse(block).body:
        if not isinstance(node, ast.Expr):
            continue
        comment = lines[node.end_lineno - 1][node.end_col_offset:].partition("#")[2].strip()
        number = r"[\[(]?-?\d[\d.]*(?:, -?\d[\d.]*)*[\])]?"
        m = re.match(number, comment)
        if m is None and ":" in comment:
            m = re.search(number, comment.partition(":")[2])
        if m is None:
            m = re.search(number, comment)
        if m:
            values = [v.rstrip(".") for v in re.findall(r"-?\d[\d.]*", m.group(0))]
            out.append((ast.get_source_segment(block, node), values))
    return out


def check_quoted(block, ns) -> int:
    """Every value ``block``'s comments quote is what its expression returns
    in ``ns`` (a sequence quoted in full, or its first entries); returns how
    many expressions were checked."""
    checked = 0
    for expr, numbers in quoted(block):
        value = np.atleast_1d(np.asarray(eval(expr, ns), dtype=float))
        for v, number in zip(value, numbers):
            digits = len(number.split(".")[1]) if "." in number else 0
            assert round(float(v), digits) == pytest.approx(float(number)), (expr, v, number)
        checked += 1
    return checked


def test_the_readme_is_a_first_read():
    words = len(README.read_text().split())
    assert words <= MAX_WORDS, f"README.md has {words} words; move detail to docs/guide/ (limit {MAX_WORDS})"


def test_the_quickstart_runs_as_written_and_quotes_its_values(tmp_path, monkeypatch):
    """Run from a checkout's root (the spec it names, under sweeps/), into a
    scratch folder: the simulation beside Theorem 4.2, the sweep and its plot."""
    (block,) = blocks()
    assert "mb.simulate(" in block and "run_sweep(" in block and "figures.plot(" in block
    (tmp_path / "sweeps").mkdir()
    shutil.copy(ROOT / "sweeps" / "fig3.toml", tmp_path / "sweeps")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    with pytest.warns(UserWarning, match="no steady state"):   # the grid's overloaded cells, said
        exec(compile(block, "README.md", "exec"), ns)
    assert check_quoted(block, ns) == 3
    assert (tmp_path / "results" / "fig3.zarr").is_dir()
    assert (tmp_path / "fig3_latency.png").stat().st_size > 0
    # the simulation sits within 1% of the closed form it is shown beside
    assert ns["res"].throughput == pytest.approx(ns["theory"].throughput(128, 1, 20, k=4), rel=0.01)


def _shell_lines(text: str) -> list:
    lines = []
    for block in re.findall(r"```(?:sh|console|bash)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.partition("#")[0].strip().removeprefix("$ ")
            if line.startswith("mbbatch "):
                lines.append(line)
    return lines


def test_shell_examples_are_valid_commands():
    """Every `mbbatch ...` line of the README's and the user guide's shell
    examples parses (flags exist, choices are valid) and names spec files
    that exist."""
    import shlex

    from mbbatch.cli import _parser

    readme = _shell_lines(README.read_text())
    assert len(readme) >= 2
    commands = [(README.name, line) for line in readme]
    for page in sorted(GUIDE.glob("*.md")):
        commands += [(page.name, line) for line in _shell_lines(page.read_text())]
    assert len(commands) >= 15
    for where, line in commands:
        args = _parser().parse_args(shlex.split(line)[1:])
        for spec in getattr(args, "spec", None) or []:
            if "*" not in spec:
                assert (ROOT / spec).is_file(), (where, line)


def test_the_readme_links_to_pages_and_files_that_exist():
    links = re.findall(r"\]\(([^)#:]+)\)", README.read_text())
    assert any(link.startswith("docs/guide/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link
    for path in re.findall(r"`((?:sweeps|mbbatch/data)/[\w/.]+)`", README.read_text()):
        assert (ROOT / path).exists(), path


def test_every_guide_page_is_in_the_guides_toctree():
    toctree = re.search(r"```\{toctree\}\n(.*?)```", (GUIDE / "index.md").read_text(), re.S).group(1)
    listed = {line.strip() for line in toctree.splitlines() if line.strip() and not line.startswith(":")}
    assert listed == {p.stem for p in GUIDE.glob("*.md")} - {"index"}


def test_the_citation_file_names_this_version_and_the_multi_bin_paper():
    import mbbatch

    cff = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf'^version: "{re.escape(mbbatch.__version__)}"$', cff, re.M)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^version = "{re.escape(mbbatch.__version__)}"$', pyproject, re.M)
    assert "arXiv:2412.04504" in cff and "The mbbatch developers" in cff
