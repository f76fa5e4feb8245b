"""mbbatch.theory.assumptions: every closed form says where it holds.

One row per public function of mbbatch.theory: an argument inside the
formula's assumptions gives a finite value and no warning; one outside them
gives NaN and an OutsideAssumptions warning (where an argument in its domain
can break an assumption), or, for a formula whose only assumptions are its
arguments' domains, a ValueError naming the argument."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats

import mbbatch as mb
from mbbatch import theory

U = stats.uniform(1, 19)
LINEAR = mb.IterationModel(step=0.01, prefill_per_token=1e-4, per_sequence=1e-4, per_context_token=0.0)
ATTENTION = mb.IterationModel(step=0.01, prefill_per_token=1e-4, per_sequence=1e-4, per_context_token=1e-7)

#: function -> (call inside its assumptions, call outside them, what outside gives: "nan" or a ValueError match)
CASES = {
    "latency": (lambda: theory.latency(128, 1, 20, 1, 6.0, servers=1),
                lambda: theory.latency(128, 1, 20, 1, 6.5, servers=1), "nan"),
    "batch_service_time": (lambda: theory.batch_service_time(stats.expon(scale=2.0), [0, np.inf], 8),
                           lambda: theory.batch_service_time(stats.cauchy(), [-np.inf, np.inf], 8), "nan"),
    "optimal_boundaries": (lambda: theory.optimal_boundaries(stats.expon(scale=2.0), 8, 2),
                           lambda: theory.optimal_boundaries(stats.pareto(0.9), 8, 2), "nan"),
    "continuous_capacity": (lambda: theory.continuous_capacity(LINEAR, 512, 200, 101),
                            lambda: theory.continuous_capacity(ATTENTION, 512, 200, 101), "nan"),
    "service_time": (lambda: theory.service_time(128, 1, 20, 4), lambda: theory.service_time(0, 1, 20, 4), "B"),
    "throughput": (lambda: theory.throughput(128, 1, 20, 4), lambda: theory.throughput(128, 20, 1, 4), "l_max"),
    "capacity": (lambda: theory.capacity(128, 1, 20), lambda: theory.capacity(128, -1, 20), "l_min"),
    "min_bins": (lambda: theory.min_bins(128, 1, 20, 1.0), lambda: theory.min_bins(128, 1, 20, 0.0), "eps"),
    "uniform_boundaries": (lambda: theory.uniform_boundaries(1, 20, 4), lambda: theory.uniform_boundaries(1, 20, 0),
                           "k"),
    "exponential_boundaries": (lambda: theory.exponential_boundaries(64, 0.5, 3),
                               lambda: theory.exponential_boundaries(64, -0.5, 3), "mu"),
    "exponential_service_bound": (lambda: theory.exponential_service_bound(64, 0.5, 3),
                                  lambda: theory.exponential_service_bound(64, 0.5, 0), "k"),
    "exponential_throughput_bound": (lambda: theory.exponential_throughput_bound(64, 0.5, 3),
                                     lambda: theory.exponential_throughput_bound(0, 0.5, 3), "B"),
    "harmonic_number": (lambda: theory.harmonic_number(10), lambda: theory.harmonic_number(0), "B must be"),
    "empirical_batch_service_time": (lambda: theory.empirical_batch_service_time(np.array([1.0, 2.0, 5.0]), [0, 10], 4),
                                     lambda: theory.empirical_batch_service_time(np.array([1.0, 2.0, 5.0]), [0, 3], 4),
                                     "edges"),
    "iteration_batch_service_time": (lambda: theory.iteration_batch_service_time(LINEAR, [1.0, 3.0], 2,
                                                                                 prompt_mean=10.0),
                                     lambda: theory.iteration_batch_service_time(LINEAR, [1.0, 3.0], 2,
                                                                                 prompt_mean=-1.0), "prompt_mean"),
    "integer_lengths": (lambda: theory.integer_lengths(stats.lognorm(0.8, scale=64)),
                        lambda: theory.integer_lengths(stats.pareto(0.5)), "too long to enumerate"),
}


def test_every_function_has_its_boundary_checked():
    functions = {name for name in theory.__all__ if callable(getattr(theory, name))
                 and not isinstance(getattr(theory, name), type)}
    assert functions == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_inside_finite_outside_nan_with_a_warning_or_refused(name):
    inside, out, gives = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", theory.OutsideAssumptions)     # inside its assumptions: none
        value = inside()
    flat = np.concatenate([np.ravel(np.asarray(v, dtype=float)) for v in (value if isinstance(value, tuple)
                                                                             else (value,))])
    assert not np.isnan(flat).any(), (name, value)       # (boundaries may end at an infinite support)
    if gives == "nan":
        with pytest.warns(theory.OutsideAssumptions, match=name):
            got = out()
        assert np.isnan(np.asarray(got, dtype=float)).all(), (name, got)
        # (and a user can make it an error)
        with warnings.catch_warnings():
            warnings.simplefilter("error", theory.OutsideAssumptions)
            with pytest.raises(theory.OutsideAssumptions):
                out()
    else:
        with pytest.raises(ValueError, match=gives):
            out()


def test_infinite_mean_gives_infinite_service_exactly():
    """A service time with an infinite mean has a batch's longest member's infinite too: inf, not
    outside the formula (the quadrature gave 493,580 s for Pareto(0.8))."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert theory.batch_service_time(stats.pareto(0.8), [1, np.inf], 8) == math.inf
        assert np.array_equal(theory.batch_service_time(stats.pareto(1.0), [1, 2, np.inf], [1, 4]), [np.inf] * 2)
