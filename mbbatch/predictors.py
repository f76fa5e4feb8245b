"""Length predictors: what a binning policy bins a request by.

A request is binned by its prediction and served for its true length (or
service time).  The predictions have their own random stream (stream 3 of
the run's seed), so the requests themselves (arrivals, lengths) are the same
whatever the predictor: comparing predictors on one seed is a paired
comparison.  ``LogNormalError(0)`` and ``BinConfusion(1)`` give the oracle's
results bit for bit.

- :class:`Oracle`: the true value (the default);
- :class:`LogNormalError`: ``true * exp(sigma Z)``, Z standard normal;
- :class:`BinConfusion`: the true bin with probability ``p``, otherwise a
  neighbouring bin, either side equally likely where both exist;
- :class:`Predictions`: the user's own predicted values, one per request, in
  request order (in the units of the true values: service times under
  ``service=``, output lengths under ``workload=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ._kernels import common as _common
from ._validation import check_fields, check_real_array
from .params import PARAMS

__all__ = ["Predictor", "Oracle", "LogNormalError", "BinConfusion", "Predictions", "PREDICTORS", "as_predictor"]

_EMPTY = np.empty(0)
_EMPTY.flags.writeable = False


class Predictor:
    """What a predictor gives the kernels: its code (``common.PRED_*``), its
    parameter, its given values (:class:`Predictions`) and whether it draws
    on the prediction stream."""

    code: ClassVar[int] = _common.PRED_ORACLE
    #: whether it draws from the prediction stream (stream 3)
    draws: ClassVar[bool] = False

    @property
    def param(self) -> float:
        return 0.0

    @property
    def given(self) -> np.ndarray:
        """The predictions given per request (empty: none)."""
        return _EMPTY

    def predict(self, true: np.ndarray, draws) -> np.ndarray:
        """The predictions of the true values ``true`` (one per request, in
        request order), made in numpy before a run (the continuous-batching
        engine's); ``draws()`` gives the generator of the prediction stream,
        asked for only by a predictor that draws.  The oracle's are the true
        values themselves."""
        return true

    def event_fields(self) -> dict:
        """The event kernel's predictor fields: its code, its log-normal
        error (0: none) and its bin confusion's probability (1: none)."""
        return {"predictor": self.code,
                "predictor_sigma": self.param if self.code == _common.PRED_LOGNORMAL else 0.0,
                "predictor_p": self.param if self.code == _common.PRED_CONFUSION else 1.0}


@dataclass(frozen=True)
class Oracle(Predictor):
    """Bins by the true value."""

    code = _common.PRED_ORACLE

    def describe(self) -> dict:
        return {"predictor": "oracle"}


@dataclass(frozen=True)
class LogNormalError(Predictor):
    """Prediction = true value x exp(sigma Z), Z ~ N(0, 1): a multiplicative
    error whose log has standard deviation ``sigma`` (in [0, inf); 0 is the
    oracle)."""

    sigma: float

    code = _common.PRED_LOGNORMAL
    draws = True

    def __post_init__(self):
        check_fields(self, {"sigma": "LogNormalError.sigma"})

    @property
    def param(self) -> float:
        return self.sigma

    def predict(self, true: np.ndarray, draws) -> np.ndarray:
        return true * np.exp(self.sigma * draws().standard_normal(true.size))

    def describe(self) -> dict:
        return {"predictor": "lognormal_error", "predictor_sigma": self.sigma}


@dataclass(frozen=True)
class BinConfusion(Predictor):
    """The true bin with probability ``p`` (in [0, 1]; 1 is the oracle),
    otherwise a neighbouring bin: either side with probability (1 - p) / 2
    where both exist, the one neighbour with probability 1 - p in the first
    and last bins (with one bin, always that bin)."""

    p: float

    code = _common.PRED_CONFUSION
    draws = True

    def __post_init__(self):
        check_fields(self, {"p": "BinConfusion.p"})

    @property
    def param(self) -> float:
        return self.p

    def predict(self, true: np.ndarray, draws) -> np.ndarray:
        raise TypeError("BinConfusion predicts a request's bin, not its length: a policy without bins takes "
                        "Oracle(), LogNormalError(sigma) or Predictions(values)")

    def describe(self) -> dict:
        return {"predictor": "bin_confusion", "predictor_p": self.p}


@dataclass(frozen=True, eq=False)
class Predictions(Predictor):
    """The user's predicted values, one per request in request order, in the
    units of the true values (non-negative, finite)."""

    values: np.ndarray = field(repr=False)

    code = _common.PRED_REPLAY

    def __post_init__(self):
        v = check_real_array("values", self.values, PARAMS["service"].domain)
        v.flags.writeable = False
        object.__setattr__(self, "values", v)

    @property
    def given(self) -> np.ndarray:
        return self.values

    def predict(self, true: np.ndarray, draws) -> np.ndarray:
        """The values given, repeated end to end to one per request."""
        return np.resize(np.asarray(self.values, dtype=float), true.size)

    def describe(self) -> dict:
        return {"predictor": "predictions", "n_predictions": int(self.values.size)}


PREDICTORS = (Oracle, LogNormalError, BinConfusion, Predictions)


def as_predictor(predictor):
    """``predictor`` checked: None is the oracle."""
    if predictor is None:
        return Oracle()
    if not isinstance(predictor, PREDICTORS):
        raise TypeError("predictor must be mb.Oracle(), mb.LogNormalError(sigma), mb.BinConfusion(p) or "
                        f"mb.Predictions(values); got {type(predictor).__name__}")
    return predictor
