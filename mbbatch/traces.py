"""Real LLM inference traces.

The Azure LLM inference trace 2023 (Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024; CC-BY 4.0) is
published in the Azure Public Dataset (github.com/Azure/AzurePublicDataset),
as ``AzureLLMInferenceTrace_conv.csv`` and ``AzureLLMInferenceTrace_code.csv``:
one row per request with ``TIMESTAMP``, ``ContextTokens`` (prompt length) and
``GeneratedTokens`` (output length).  mbbatch does not ship the trace; pass
the path of your copy.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Trace", "load_azure_trace"]

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace in arrival order.

    Attributes
    ----------
    arrival : numpy.ndarray
        Arrival times in s since the first request.
    prompt_tokens, output_tokens : numpy.ndarray
        Prompt and generated lengths in tokens.
    source : str
        File name the trace was read from.
    """

    arrival: np.ndarray = field(repr=False)
    prompt_tokens: np.ndarray = field(repr=False)
    output_tokens: np.ndarray = field(repr=False)
    source: str = ""

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def rate(self) -> float:
        """Mean arrival rate over the trace, requests/s."""
        span = float(self.arrival[-1] - self.arrival[0])
        return (len(self) - 1) / span if span > 0 else float("nan")


def load_azure_trace(path) -> Trace:
    """Read an Azure LLM inference trace CSV.

    Parameters
    ----------
    path : str or path-like
        The CSV file, with header ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    Returns
    -------
    Trace
        Rows sorted by timestamp (stable), times relative to the first request.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no trace file at {str(path)!r}")
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != _COLUMNS:
            raise ValueError(f"path: {path.name} must have the header {','.join(_COLUMNS)}; got {header}")
        rows = list(reader)
    if not rows:
        raise ValueError(f"path: {path.name} holds no requests")
    stamps = np.array([r[0].strip().replace(" ", "T") for r in rows], dtype="datetime64[ns]")
    prompt = np.array([int(r[1]) for r in rows], dtype=np.int64)
    output = np.array([int(r[2]) for r in rows], dtype=np.int64)
    order = np.argsort(stamps, kind="stable")
    stamps, prompt, output = stamps[order], prompt[order], output[order]
    arrival = (stamps - stamps[0]).astype(np.int64) / 1e9
    return Trace(arrival=arrival, prompt_tokens=prompt, output_tokens=output, source=path.name)
