"""Multi-bin batching: the multi-bin paper's policy (Guldogan, Kunde, Lee and
Pedarsani, 2024, "Multi-Bin Batching for Increasing LLM Inference
Throughput", arXiv:2412.04504), Section 3 and Algorithm 1."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from .. import theory
from .._validation import check, check_fields
from ..params import default
from .._kernels.formation import FORM_MULTIBIN, SEL_ROUND_ROBIN
from ..predictors import Oracle, as_predictor
from .base import Carries, EventPolicy, Policy, predictor_from_spec
from .static import StaticBatching

__all__ = ["MultiBin", "MultiBinEngine"]


@dataclass(frozen=True, eq=False)
class MultiBin(Policy):
    """Multi-bin batching (Algorithm 1 of the multi-bin paper).

    Requests are assigned to a bin by their predicted service time (the
    true one by default: an oracle) and served for their true one; each bin
    forms batches of exactly ``batch_size`` in
    arrival order; a batch joins one central FIFO when its last request
    arrives; a batch's service time is the maximum of its members' (the
    paper's model; on a workload, ``MaxModel``).  On a workload it may take
    an :class:`~mbbatch.IterationModel` instead (a measured engine:
    :func:`mbbatch.profiles.get`): a batch then takes its prefill iteration
    and one iteration per decode step of its longest member, requests are
    binned by their predicted output length (tokens; ``edges`` too), and
    each request's ``service`` record is its time in a batch of its own.

    Parameters
    ----------
    bins : int
        Number of bins k, >= 1. ``bins=1`` is standard batching.  Default 4.
    batch_size : int
        Batch size B in requests, >= 1.  Default 128 (the paper's Figures 3,
        4 and 6).
    edges : array_like of float, optional
        The k+1 bin edges in s, strictly increasing (with one bin the two
        may be equal: all service times equal), covering the support of
        the service distribution (first edge <= its lower end, last edge >= its
        upper end, ``inf`` allowed).  Bin i holds ``edges[i] <= l < edges[i+1]``
        and the last bin is closed above.  Default: equal probability mass of
        the service distribution (Lemma 4.1 for the uniform).
    max_wait : float
        A bin sends a partial batch to the central FIFO once its oldest
        request has waited ``max_wait`` s (the real-system variant of the
        paper's Section 3); partial batches due at the same time go in the
        order their oldest requests arrived.  Default ``inf``: batches of
        exactly B only.
    predictor : Oracle, LogNormalError, BinConfusion or Predictions, optional
        What a request is binned by (:mod:`mbbatch.predictors`).  Default:
        the oracle.
    """

    bins: int = default("bins")
    batch_size: int = default("batch_size")
    edges: Optional[np.ndarray] = None
    max_wait: float = default("max_wait")
    predictor: object = None

    kind: ClassVar[str] = "multibin"
    planner: ClassVar[str] = "multibin"
    reports: ClassVar[frozenset] = frozenset({"run", "batch_means", "multibin"})
    settings: ClassVar[tuple] = ("bins", "batch_size", "edges", "max_wait", "predictor_sigma", "predictor_p",
                                 "servers")
    models: ClassVar[tuple] = ("max", "iteration", "profile")
    paper: ClassVar[bool] = True
    engine: ClassVar[bool] = True

    def __post_init__(self):
        check_fields(self, {"bins": "bins", "batch_size": "batch_size", "max_wait": "max_wait"})
        object.__setattr__(self, "predictor", as_predictor(self.predictor))
        if self.edges is not None:
            # NaN refused here; -inf first and inf last allowed, checked below
            e = check("MultiBin.edges", self.edges, "edges")
            if e.size != self.bins + 1:
                raise ValueError(
                    f"edges must hold bins + 1 = {self.bins + 1} values; got {e.size}")
            # one bin may have equal edges (all service times equal): the
            # kernel puts every request in bin 0 when there is one bin
            if np.any(np.diff(e) < 0) or (self.bins > 1 and np.any(np.diff(e) == 0)):
                raise ValueError(f"edges must be strictly increasing; got {e.tolist()}")
            if np.isinf(e[1:-1]).any() or e[0] == np.inf or e[-1] == -np.inf:
                raise ValueError(f"edges must be finite except edges[0]=-inf or edges[-1]=inf; got {e.tolist()}")
            e.flags.writeable = False
            object.__setattr__(self, "edges", e)

    def carries(self) -> Carries:
        """Full batches of ``batch_size``, each holding its server to
        completion; a probe fills every bin's batch many times."""
        return Carries(load=True, backlog=False, held=self.bins * self.batch_size)

    def describe(self) -> dict:
        d = {"policy": self.kind, "bins": self.bins, "batch_size": self.batch_size,
             "max_wait": "inf" if self.max_wait == float("inf") else self.max_wait}
        d["edges"] = "equal_mass" if self.edges is None else [float(x) for x in self.edges]
        if not isinstance(self.predictor, Oracle):
            d.update(self.predictor.describe())
        return d

    @classmethod
    def from_spec(cls, params: dict, ctx) -> "MultiBin":
        """A sweep cell's MultiBin: its bins, batch size, maximum wait and
        predictor, and its edges (:func:`spec_edges`)."""
        return cls(bins=params["bins"], batch_size=params["batch_size"], edges=spec_edges(params),
                   max_wait=params["max_wait"], predictor=predictor_from_spec(params))


    def engine_form(self) -> "MultiBinEngine":
        """The paper's batching as a cluster's engines run it (full batches
        only: ``max_wait`` must be inf)."""
        if self.max_wait != math.inf:
            raise ValueError(f"a Cluster's MultiBin engines release full batches only: max_wait must be inf; "
                             f"got {self.max_wait:g}")
        return MultiBinEngine(self.batch_size, bins=self.bins, edges=self.edges, predictor=self.predictor)


@dataclass(frozen=True, eq=False)
class MultiBinEngine(StaticBatching):
    """A :class:`MultiBin` policy as a cluster's engine runs it, in the event
    kernel: requests join ``bins`` FIFOs by their predicted output length
    (tokens), a batch is exactly ``batch_size`` requests of one bin and leaves
    only when full, and a free server takes the batch that formed first (the
    paper's central FIFO of formed batches).  Made by
    :meth:`MultiBin.engine_form`; ``edges`` in tokens, or None (equal mass on
    the workload's output lengths)."""

    bins: int = 1
    edges: Optional[np.ndarray] = None
    predictor: object = None

    kind: ClassVar[str] = "multibin"
    engine: ClassVar[bool] = False
    decode_stage: ClassVar[bool] = False
    title: ClassVar[str] = "MultiBin"

    def event_config(self) -> EventPolicy:
        """Full batches of one bin, the first formed first (``FORM_MULTIBIN``)."""
        B = self.batch_size
        return EventPolicy(formation=FORM_MULTIBIN, bins=self.bins, b_max=B, pin=B, max_candidates=B,
                           selection=SEL_ROUND_ROBIN, warmup=1, memory_on=False, sla=self.sla, memory=self.memory,
                           predictor=self.predictor, preset="edges", edges=self.edges)


def spec_edges(params: dict):
    """The edges a cell's ``edges`` rule gives (None: equal mass, computed by
    the planner)."""
    if params.get("edges") == "lemma_a1":
        return theory.exponential_boundaries(params["batch_size"], params["mu"], params["bins"])
    if params.get("edges") == "optimal":
        return _optimal_edges(params.get("l_min"), params.get("l_max"), params.get("mu"), params["batch_size"],
                              params["bins"])
    return None


@functools.lru_cache(maxsize=256)
def _optimal_edges(l_min, l_max, mu, B, k):
    """theory.optimal_boundaries for the paper's workload (uniform on [l_min,
    l_max], or exponential of rate mu), once per process."""
    from scipy import stats

    dist = stats.expon(scale=1.0 / mu) if mu is not None else stats.uniform(l_min, l_max - l_min)
    return np.asarray(theory.optimal_boundaries(dist, B, k), dtype=float)
