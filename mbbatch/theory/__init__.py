"""Closed forms and exact numerics from the multi-bin batching paper.

Uniform service times (Assumption 3.2; Sections 4-5):
:func:`service_time` (eq. 20), :func:`throughput` (eqs. 4, 21),
:func:`capacity` (eq. 5), :func:`min_bins` (eqs. 6, 26), :func:`latency`
(eq. 7), :func:`uniform_boundaries` (eqs. 3, 16).

Exponential service times (Assumption A.1; Appendix A.4):
:func:`exponential_boundaries` (eqs. 28-29, 59),
:func:`exponential_service_bound` (eq. 27 at those edges),
:func:`exponential_throughput_bound` (Corollary A.1.1, eq. 60 corrected),
:func:`harmonic_number`.

Any continuous distribution: :func:`batch_service_time` (eq. 2, exact, by
quadrature) and :func:`optimal_boundaries` (numerical minimiser).

A measured engine: :func:`iteration_batch_service_time` (eq. 2 with a batch
timed by an ``IterationModel``, exact for whole-token lengths,
:func:`integer_lengths`).

Continuous batching: :func:`continuous_capacity` (Li, Dai and Peng, 2025,
arXiv:2504.07347: the stability limit of an engine whose iterations cost
the tokens they process).

Pure numpy/scipy; no randomness.  See ``theory/NOTES.md`` in the repository
for the assumptions of each formula and the paper's errata.  Outside a
formula's assumptions a function returns NaN and warns
:class:`OutsideAssumptions` (:mod:`.assumptions`); outside its arguments'
domains it raises, naming the argument.
"""

from .assumptions import OutsideAssumptions

from .continuous import continuous_capacity
from .exponential import (
    exponential_boundaries,
    exponential_service_bound,
    exponential_throughput_bound,
    harmonic_number,
)
from .general import batch_service_time, empirical_batch_service_time, optimal_boundaries
from .iteration import integer_lengths, iteration_batch_service_time
from .uniform import (
    capacity,
    latency,
    min_bins,
    service_time,
    throughput,
    uniform_boundaries,
)

__all__ = [
    "OutsideAssumptions",
    "empirical_batch_service_time",
    "service_time",
    "throughput",
    "capacity",
    "min_bins",
    "latency",
    "uniform_boundaries",
    "exponential_boundaries",
    "exponential_service_bound",
    "exponential_throughput_bound",
    "harmonic_number",
    "batch_service_time",
    "optimal_boundaries",
    "iteration_batch_service_time",
    "integer_lengths",
    "continuous_capacity",
]
