"""Batching policies: configuration only, validated at the boundary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ._validation import check_count

__all__ = ["MultiBin"]


@dataclass(frozen=True, eq=False)
class MultiBin:
    """Multi-bin batching (Algorithm 1 of the multi-bin paper).

    Requests are assigned to a bin by their true service time (an oracle
    length predictor); each bin forms batches of exactly ``batch_size`` in
    arrival order; a batch joins one central FIFO when its last request
    arrives; a batch's service time is the maximum of its members'.

    Parameters
    ----------
    bins : int
        Number of bins k, >= 1. ``bins=1`` is standard batching.
    batch_size : int
        Batch size B in requests, >= 1.
    edges : array_like of float, optional
        The k+1 bin edges in s, strictly increasing, covering the support of
        the service distribution (first edge <= its lower end, last edge >= its
        upper end, ``inf`` allowed).  Bin i holds ``edges[i] <= l < edges[i+1]``
        and the last bin is closed above.  Default: equal probability mass of
        the service distribution (Lemma 4.1 for the uniform).
    """

    bins: int
    batch_size: int
    edges: Optional[np.ndarray] = None

    def __post_init__(self):
        object.__setattr__(self, "bins", check_count("bins", self.bins))
        object.__setattr__(self, "batch_size", check_count("batch_size", self.batch_size))
        if self.edges is not None:
            e = np.asarray(self.edges, dtype=np.float64)
            if e.ndim != 1 or e.size != self.bins + 1:
                raise ValueError(
                    f"edges must hold bins + 1 = {self.bins + 1} values; got shape {e.shape}")
            if np.any(np.isnan(e)):
                raise ValueError("edges must not contain NaN")
            if np.any(np.diff(e) <= 0):
                raise ValueError(f"edges must be strictly increasing; got {e.tolist()}")
            if np.isinf(e[1:-1]).any() or e[0] == np.inf or e[-1] == -np.inf:
                raise ValueError(f"edges must be finite except edges[0]=-inf or edges[-1]=inf; got {e.tolist()}")
            e = e.copy()
            e.flags.writeable = False
            object.__setattr__(self, "edges", e)

    def describe(self) -> dict:
        d = {"policy": "multibin", "bins": self.bins, "batch_size": self.batch_size}
        d["edges"] = "equal_mass" if self.edges is None else [float(x) for x in self.edges]
        return d
