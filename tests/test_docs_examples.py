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


@pytest.mark.skipif(not AZURE.exists(), reason="the Azure LLM inference trace is not beside the checkout "
                    "(shared/data/AzureLLMInferenceTrace_conv.csv); see docs/guide/traces.md")
def test_the_azure_trace_example_runs():
    import mbbatch as mb

    block = _block_with("traces.md", "load_azure_trace").replace('"AzureLLMInferenceTrace_conv.csv"',
                                                                 repr(str(AZURE)))
    ns = {"mb": mb}
    exec(compile(block, "docs/guide/traces.md", "exec"), ns)
    res = ns["res"]
    assert res.completed > 0
    assert res.completed + res.excluded_partial == len(ns["tr"])


@pytest.mark.skipif(not BURSTGPT.exists(), reason="BurstGPT is not beside the checkout "
                    "(shared/data/BurstGPT_without_fails_2.csv); see docs/guide/traces.md")
def test_the_burstgpt_sessions_example_runs():
    import mbbatch as mb

    block = _block_with("clusters.md", "load_burstgpt").replace('"BurstGPT_without_fails_2.csv"',
                                                               repr(str(BURSTGPT)))
    ns = {"mb": mb}
    exec(compile(block, "docs/guide/clusters.md", "exec"), ns)
    assert ns["res"].completed > 0
