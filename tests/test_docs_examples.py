"""The user guide's examples that read a trace file: shown as plain code on
the pages (users download the traces; the documentation's build does not
have them), run here where the file is beside the checkout, and skipped,
saying why, where it is not.  The guide's other examples are doctests, run
by the documentation's build (tests/test_docs_build.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
AZURE = SHARED_DATA / "AzureLLMInferenceTrace_conv.csv"
BURSTGPT = SHARED_DATA / "BurstGPT_without_fails_2.csv"


def _block_with(page: str, text: str) -> str:
    (found,) = [b for b in re.findall(r"```python\n(.*?)```", (GUIDE / page).read_text(), re.S) if text in b]
    return found


def test_the_trace_examples_are_not_doctests():
    """A ``{doctest}`` block would fail the documentation's build without the file."""
    for page in GUIDE.glob("*.md"):
        for block in re.findall(r"```\{doctest\}\n(.*?)```", page.read_text(), re.S):
            assert "load_azure_trace" not in block and "load_burstgpt" not in block, page.name


@pytest.mark.parametrize("page, loader, path", [("traces.md", "load_azure_trace", AZURE),
                                                 ("clusters.md", "load_burstgpt", BURSTGPT)])
def test_a_trace_example_runs(page, loader, path):
    """The page's example that reads ``path`` runs as written (the file name swapped for where it is);
    its run serves every request the trace gives it."""
    import mbbatch as mb

    if not path.exists():
        pytest.skip(f"{path.name} is not beside the checkout (shared/data/{path.name}); see docs/guide/traces.md")
    block = _block_with(page, loader).replace(repr(path.name).replace("'", '"'), repr(str(path)))
    ns = {"mb": mb}
    exec(compile(block, f"docs/guide/{page}", "exec"), ns)
    res = ns["res"]
    assert res.completed > 0
    if "tr" in ns:
        assert res.completed + res.excluded_partial == len(ns["tr"])
