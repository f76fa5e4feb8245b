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
