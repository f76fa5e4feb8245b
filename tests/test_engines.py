"""Engine presets (mbbatch/engines.py): the released engines' defaults, each
from the module's sources, and overrides."""

import doctest

import pytest

import mbbatch as mb
from mbbatch import engines


def test_docstring_examples():
    assert doctest.testmod(engines).failed == 0


def test_the_presets_are_the_releases_defaults():
    v0 = engines.vllm("0.6", max_model_len=20560)      # APEX's 2-way layouts: chunked prefill off
    assert (v0.chunked_prefill, v0.max_batched_tokens, v0.max_num_seqs) == (False, 20560, 256)
    assert engines.vllm("0.6", max_model_len=1024).max_batched_tokens == 2048
    v1 = engines.vllm("v1")
    assert (v1.max_num_seqs, v1.max_batched_tokens, v1.chunked_prefill, v1.block_size) == (1024, 8192, True, 16)
    assert engines.vllm("v1", gpu_memory_gib=80, a100=True).max_batched_tokens == 2048
    assert [engines.sglang(gpu_memory_gib=g).max_batched_tokens for g in (24, 80, 192)] == [2048, 8192, 16384]
    assert engines.sglang().block_size == 1
    # overrides win, and the result is an engine like any other
    e = engines.vllm("v1", kv_tokens=4e5, iteration_overhead=1e-3)
    assert isinstance(e, mb.ContinuousBatching) and e.kv_tokens == 4e5 and e.iteration_overhead == 1e-3


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="version must be one of '0.6', 'v1'"):
        engines.vllm("0.5")
    with pytest.raises(ValueError, match="gpu_memory_gib"):
        engines.sglang(gpu_memory_gib=-1)
    with pytest.raises(ValueError, match="max_model_len"):
        engines.vllm("0.6", max_model_len=0)
