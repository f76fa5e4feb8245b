"""Shared test configuration.

Hypothesis profiles (select with HYPOTHESIS_PROFILE=name):
- ``ci`` (default): few examples, derandomized, so every run draws the same
  examples and a statistical test's stated confidence level is that of a
  fixed, repeatable experiment;
- ``thorough``: many more random examples, for a local deep check.
Both have deadline=None: the first example of a test may compile a kernel.
"""

import functools
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


def _warm_cluster(engine):
    """A tiny run of a cluster of two ``engine`` (its driver's specialization
    compiled), and of continuous engines with closed-loop programs (their
    driver: about 10 s more, once) and with multi-step scheduling (the
    driver resuming the full kernel; ``engine``'s resumes the lean one)."""
    import dataclasses

    import scipy.stats as st

    import mbbatch as mb

    wl = mb.Workload(prompt=st.uniform(1, 50), output=st.uniform(1, 50))
    mb.simulate(mb.Cluster(engine, engines=2), arrivals=mb.Poisson(1.0), workload=wl, n=50, seed=0)
    if engine.resumable:
        mb.simulate(mb.Cluster(dataclasses.replace(engine, num_scheduler_steps=2), engines=2),
                    arrivals=mb.Poisson(1.0), workload=wl, n=50, seed=0)
        mb.simulate(mb.Cluster(engine, engines=2, programs=mb.Programs(calls=2, closed=True)),
                    arrivals=mb.Poisson(1.0), workload=wl, n=50, seed=0)


def _warm_groups() -> dict:
    """The kernels the tests run, in groups (cold CPU seconds measured on a
    2-core machine): ``{name: compile or load them}``.  A cluster's driver
    compiles the continuous engine's kernel it calls, and a cluster of
    token-level engines the drawers of ``mb.warmup``, unless cached."""
    import mbbatch as mb
    from mbbatch._kernels import continuous

    return {"warmup": mb.warmup,                                                         # ~30 s
            "continuous_full": lambda: continuous.warmup(("full",)),                   # ~30 s
            "continuous_lean": lambda: continuous.warmup(("lean",)),                   # ~30 s
            "continuous_decode": lambda: continuous.warmup(("decode",)),               # ~30 s
            **{f"continuous_{name}": functools.partial(continuous.warmup, (name,))     # ~30 s each
               for name in ("edf", "vtc", "mlfq")},
            "cluster_continuous": lambda: _warm_cluster(mb.ContinuousBatching(max_num_seqs=8)),  # ~25 s after full
            "cluster_tokens": lambda: _warm_cluster(mb.StaticBatching(4))}            # ~15 s after warmup


#: the order two workers take the groups in (each compiles a half; a group it reaches second it waits for,
#: then loads from the cache; a group another depends on comes after it in both orders)
_WARM_ORDERS = (("warmup", "continuous_full", "cluster_continuous", "continuous_edf", "continuous_lean",
                 "continuous_vtc", "continuous_mlfq", "continuous_decode", "cluster_tokens"),
                ("continuous_lean", "continuous_vtc", "continuous_decode", "continuous_mlfq", "warmup",
                 "cluster_tokens", "continuous_full", "cluster_continuous", "continuous_edf"))


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels(tmp_path_factory, worker_id):
    """Compile (or load from the numba cache) every kernel once per session.
    Under pytest-xdist the workers share the work on a fresh checkout: each
    group of kernels is compiled under a file lock by the first worker to
    reach it, the workers taking the groups in the orders of
    :data:`_WARM_ORDERS`, and the other worker then loads it from the disk
    cache (two workers compiling
    the same kernels at once would each pay its whole compile time:
    about a minute of a fresh ``make test``)."""
    from filelock import FileLock

    groups = _warm_groups()
    if worker_id == "master":
        for warm in groups.values():
            warm()
        return
    root = tmp_path_factory.getbasetemp().parent
    for name in _WARM_ORDERS[int(worker_id.removeprefix("gw")) % 2]:
        with FileLock(str(root / f"compile_{name}.lock")):
            groups[name]()


#: the test files that take longest (a warm run's seconds on a 2-core machine: 72, 64, 54, 54, 37, 30, 30, 25,
#: 23, 22, 22, 21), collected first: pytest-xdist hands each worker the next file as it finishes one
#: (``--dist loadfile``), so the longest go first and the last files a worker takes are short ones, not a
#: long file that keeps one worker busy while the other waits
SLOW_FIRST = ("test_sweeps_run.py", "test_figures.py", "test_docs_build.py", "test_capacity.py",
              "test_comparison.py", "test_sweeps_spec.py", "test_figures_plotting.py", "test_kernels_bits.py",
              "test_sweeps_store.py", "test_docs_site.py", "test_sweeps_cells.py", "test_validation_serving.py")


def pytest_collection_modifyitems(config, items):
    """The files of :data:`SLOW_FIRST` first, in its order; the others, and
    every file's tests, in their order (the same in every worker)."""
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
