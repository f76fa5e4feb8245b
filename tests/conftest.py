"""Shared test configuration.

Hypothesis profiles (select with HYPOTHESIS_PROFILE=name):
- ``ci`` (default): few examples, derandomized, so every run draws the same
  examples and a statistical test's stated confidence level is that of a
  fixed, repeatable experiment;
- ``thorough``: many more random examples, for a local deep check.
Both have deadline=None: the first example of a test may compile a kernel.
"""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, max_examples=25, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough", deadline=None, max_examples=500, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: The shared data folder beside the project checkout (absent for users).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels():
    """Compile (or load from the numba cache) every kernel once per session."""
    import mbbatch

    mbbatch.warmup()


#: The test files that take longest (seconds of one core on a fresh clone: sweeps run and killed,
#: every figure drawn, the documentation built), collected first: `make test` hands each worker one
#: file at a time (--dist loadfile) in collection order, and a long file handed out last would keep
#: one worker busy while the other idles (longest first: Graham's LPT rule, 1969).
LONGEST_FIRST = ("test_sweeps_run.py", "test_figures.py", "test_docs_build.py", "test_capacity.py",
                 "test_comparison.py", "test_kernels_bits.py", "test_docs_site.py", "test_sweeps_store.py",
                 "test_figures_plotting.py", "test_validation_serving.py", "test_kernels_cache.py",
                 "test_running.py", "test_cli.py", "test_sweeps_spec.py", "test_sweeps_cells.py")


def pytest_collection_modifyitems(config, items):
    """The files of :data:`LONGEST_FIRST` first, in its order; the rest as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
