"""The trace loader, on a small file made here and on the real Azure trace
when its copy is beside the checkout (skipped, saying why, otherwise)."""

import numpy as np
import pytest

import mbbatch as mb
from mbbatch.traces import load_azure_trace

from .conftest import SHARED_DATA

AZURE = SHARED_DATA / "AzureLLMInferenceTrace_conv.csv"


def test_load_small_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.5000000,374,44\n"
                 "2023-11-16 18:15:46.0000000,10,5\n"
                 "2023-11-16 18:15:48.0000000,396,109\n")
    tr = load_azure_trace(p)
    np.testing.assert_allclose(tr.arrival, [0.0, 0.5, 2.0])
    assert tr.prompt_tokens.tolist() == [10, 374, 396]
    assert tr.output_tokens.tolist() == [5, 44, 109]
    assert tr.rate == pytest.approx(1.0)


def test_bad_trace_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        load_azure_trace(tmp_path / "missing.csv")
    p = tmp_path / "bad.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="header"):
        load_azure_trace(p)


@pytest.mark.skipif(not AZURE.is_file(), reason="the Azure LLM inference trace is not beside the "
                    "checkout (shared/data/AzureLLMInferenceTrace_conv.csv); see README, Real traces")
def test_replay_the_azure_trace():
    tr = load_azure_trace(AZURE)
    # 19,366 requests: the file ends without a newline, so `wc -l` shows one fewer
    assert len(tr) == 19_366
    assert np.all(np.diff(tr.arrival) >= 0) and tr.arrival[0] == 0.0
    assert tr.output_tokens.min() >= 0
    # replay its arrivals and output lengths (1 s per 100 tokens, oracle bins)
    service = 1.0 + tr.output_tokens / 100.0
    edges = np.quantile(service, [0.0, 0.5, 1.0])
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8, edges=edges),
                      arrivals=mb.Replay(tr.arrival), service=service, servers=4, keep_requests=True)
    assert res.completed + res.excluded_partial == len(tr)
    np.testing.assert_array_equal(res.requests.arrival, tr.arrival)
    assert res.throughput > 0 and res.mean_latency > 0
