"""mbbatch: vectorized Monte Carlo for batching policies in LLM inference.

>>> import scipy.stats as st, mbbatch as mb
>>> res = mb.simulate(mb.MultiBin(bins=4, batch_size=128), arrivals=mb.Poisson(rate=8.0),
...                   service=st.uniform(1, 19), n=100_000, seed=0)
"""

from ._version import __version__

from . import theory, traces
from ._kernels import warmup
from ._running import release_memory
from .arrivals import Gamma, OnOff, PiecewisePoisson, Poisson, Replay, Saturated, TraceTiledWarning
from .policies.multibin import MultiBin
from .policies.static import StaticBatching
from .policies.dynamic import DynamicBatching, MultiBinDynamic
from .policies.laps import LAPS
from .policies.cluster import Cluster, EngineEvent, Programs, Sessions
from .policies.spf import ShortestPredictedFirst
from .policies.continuous import ContinuousBatching
from .policies.disaggregated import Disaggregated, KVTransfer
from . import registry  # (the policies' registry: it sets the parameter table's choices of kinds)
from .controller import Memory, SLAController
from .service_models import CalibratedModel, DecodeModel, IterationModel, LinearModel, MaxModel, PrefillModel
from .lengths import Empirical
from .predictors import BinConfusion, LogNormalError, Oracle, Predictions
from .workload import Mixture, SystemPrompts, Workload
from .results import SimulationResult, Table, UnstableWarning
from ._kernels.bits import UntestedDrawsWarning
from .simulation import simulate
from .capacity import CapacityResult, Objective, SplitResult, find_capacity, find_split
from .comparison import Comparison, compare
from . import engines, profiles, serving, validation

__all__ = [
    "simulate",
    "find_capacity",
    "find_split",
    "SplitResult",
    "Objective",
    "CapacityResult",
    "compare",
    "Comparison",
    "MultiBin",
    "StaticBatching",
    "DynamicBatching",
    "MultiBinDynamic",
    "ShortestPredictedFirst",
    "ContinuousBatching",
    "LAPS",
    "Cluster",
    "EngineEvent",
    "Programs",
    "Sessions",
    "Disaggregated",
    "KVTransfer",
    "Workload",
    "Mixture",
    "SystemPrompts",
    "Empirical",
    "Oracle",
    "LogNormalError",
    "BinConfusion",
    "Predictions",
    "MaxModel",
    "LinearModel",
    "DecodeModel",
    "CalibratedModel",
    "PrefillModel",
    "IterationModel",
    "Memory",
    "SLAController",
    "PiecewisePoisson",
    "Poisson",
    "Gamma",
    "OnOff",
    "TraceTiledWarning",
    "Saturated",
    "Replay",
    "SimulationResult",
    "Table",
    "UnstableWarning",
    "UntestedDrawsWarning",
    "theory",
    "traces",
    "profiles",
    "engines",
    "serving",
    "validation",
    "registry",
    "warmup",
    "release_memory",
    "__version__",
]

