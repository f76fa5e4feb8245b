"""The README's examples run as written, and the values its comments quote
are what they return (to the digits quoted)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from .conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
TRACE = SHARED_DATA / "AzureLLMInferenceTrace_conv.csv"


def blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


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


def test_examples_run_and_quote_their_values():
    b = blocks()
    assert len(b) >= 4, "the README lost its examples"
    theory_block, simulate_block, token_block = b[0], b[1], block_with("dyn = ")
    ns: dict = {}
    checked = 0
    for block in (theory_block, simulate_block, token_block):
        exec(compile(block, "README.md", "exec"), ns)
        for expr, numbers in quoted(block):
            value = np.atleast_1d(np.asarray(eval(expr, ns), dtype=float))
            # a sequence quoted in full, or its first entries (a confidence interval)
            for v, number in zip(value, numbers):
                digits = len(number.split(".")[1]) if "." in number else 0
                assert round(float(v), digits) == pytest.approx(float(number)), (expr, v, number)
            checked += 1
    assert checked >= 10
    # the token-level example's per-batch records and controller time series
    res = ns["dyn"]
    assert res.batches["b_target"].size == res.n_batches
    assert res.time_series["tau_avg"].size > 0


def block_with(text: str) -> str:
    (found,) = [b for b in blocks() if text in b]
    return found


def test_arrivals_example_runs_and_quotes_its_values():
    import scipy.stats as st

    import mbbatch as mb

    block = block_with("mb.OnOff(")
    ns = {"mb": mb, "np": np, "st": st}
    exec(compile(block, "README.md", "exec"), ns)
    assert ns["res"].completed > 0
    (expr, numbers), = quoted(block)
    for v, number in zip(eval(expr, ns), numbers):
        assert round(v, len(number.split(".")[1])) == pytest.approx(float(number))


@pytest.mark.skipif(not TRACE.exists(), reason="the Azure LLM inference trace is not beside the checkout "
                    "(shared/data/AzureLLMInferenceTrace_conv.csv); see README, Real traces")
def test_trace_example_runs():
    import mbbatch as mb

    block = block_with("load_azure_trace").replace('"AzureLLMInferenceTrace_conv.csv"', repr(str(TRACE)))
    ns = {"mb": mb}
    exec(compile(block, "README.md", "exec"), ns)
    assert ns["res"].completed > 0


def test_shell_examples_are_valid_commands():
    """Every `mbbatch ...` line of the README's shell examples parses (flags
    exist, choices are valid) and names spec files that exist."""
    import shlex

    from mbbatch.cli import _parser

    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.partition("#")[0].strip()
            if line.startswith("mbbatch "):
                commands.append(line)
    assert len(commands) >= 8
    for line in commands:
        args = _parser().parse_args(shlex.split(line)[1:])
        for spec in getattr(args, "spec", None) or []:
            if "*" not in spec:
                assert (ROOT / spec).is_file(), line


def _hardware_example(*markers) -> dict:
    """The namespace of the README's hardware examples: its dynamic-batching
    block, its profile block, then the blocks holding ``markers``, run in
    order (each reads the names the ones before it set)."""
    import scipy.stats as st

    import mbbatch as mb

    ns = {"mb": mb, "np": np, "st": st}
    for marker in ("dyn = ", "profiles.get(", *markers):
        exec(compile(block_with(marker), "README.md", "exec"), ns)
    return ns


def test_profiles_example_runs_and_quotes_its_error():
    ns = _hardware_example()
    m = ns["m"]
    assert m.profile == "H100/vLLM/Meta-Llama-3-8B/tp1"
    assert round(100 * ns["profiles"].fit(m.profile).holdout_error, 1) == 1.6
    assert ns["res"].completed == 20_000 and not ns["res"].unstable
    assert [round(x, 2) for x in ns["carried"]] == [3.29, 4.53, 6.09, 7.74]
    readme = (ROOT / "README.md").read_text()
    assert "`carried` is 3.29, 4.53, 6.09, 7.74 requests/s" in " ".join(readme.split())


def test_continuous_batching_example_runs_and_quotes_its_throughputs():
    ns = _hardware_example("ContinuousBatching(max_num_seqs=s)")
    cb = [round(x, 2) for x in ns["cb"]]
    assert cb == [13.42, 33.97]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`cb` is 13.42 and 33.97 requests/s" in readme
    assert [round(100 * x / cb[0]) for x in (ns["carried"][0], ns["carried"][3])] == [25, 58]
    assert "carries 25 % of the continuous engine's throughput with one bin and 58 % with eight" in readme


def test_the_controller_example_runs_and_quotes_its_times_between_tokens():
    ns = _hardware_example("SLAController(d_sla=0.02")
    assert [round(x, 2) for x in ns["tbt"]] == [22.03, 20.24]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`tbt` is 22.03 and 20.24 ms" in readme


def test_the_continuous_cluster_example_runs_and_quotes_its_routing():
    ns = _hardware_example("for r in (\"autellix\", \"least_used\")")
    a, lu = ns["cl"]["autellix"], ns["cl"]["least_used"]
    assert not a.unstable and not lu.unstable
    assert [round(100 * r.locality_hit_rate) for r in (a, lu)] == [74, 25]
    assert [round(r.kv_recomputed_tokens, 1) for r in (a, lu)] == [97.0, 585.0]
    assert [round(1e3 * r.ttft_p99, 1) for r in (a, lu)] == [117.2, 210.8]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("Autellix serves 74 % of the later calls where their context is (least used: 25 %), prefills 97.0 "
            "context tokens again per call (585.0) and has a p99 time to first token of 117.2 ms (210.8 ms)") in readme


def test_capacity_example_quotes_its_interval_around_theorem_4_2():
    import scipy.stats as st

    import mbbatch as mb
    from mbbatch import theory

    block = block_with("cap = mb.find_capacity(mb.MultiBin(bins=4")
    ns = {"mb": mb, "st": st}
    exec(compile(block, "README.md", "exec"), ns)
    for expr, numbers in quoted(block):
        value = np.atleast_1d(np.asarray(eval(expr, ns), dtype=float))
        assert value.size == len(numbers), (expr, numbers)
        for v, number in zip(value, numbers):
            digits = len(number.split(".")[1]) if "." in number else 0
            assert round(float(v), digits) == pytest.approx(float(number)), (expr, v, number)
    lo, hi = ns["cap"].rate_ci
    assert lo <= 128 / theory.service_time(128, 1.0, 20.0, 4) <= hi
