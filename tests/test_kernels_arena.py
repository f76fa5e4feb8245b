"""The arrays kept between runs (:mod:`mbbatch._kernels.arena`): a lease's
arrays, their return and the limit; and a continuous engine's runs on
arrays an earlier run left full of garbage, equal bit for bit to runs on
fresh ones (the kernel writes every element it leases before it reads it),
with no result's arrays ever reused."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch._kernels import arena


@pytest.fixture
def kept(monkeypatch):
    """An empty store of kept arrays, every size kept (``LEAST`` 0), 1 GB
    at most; emptied after."""
    monkeypatch.setattr(arena, "LEAST", 0)
    monkeypatch.setattr(arena, "LIMIT", 1 << 30)
    mb.release_memory()
    yield arena
    mb.release_memory()


def test_a_lease_takes_the_smallest_kept_array_that_fits_and_gives_all_back(kept):
    arena.give([("", np.empty(100)), ("", np.empty(50)), ("", np.empty(80, np.int64))])
    with arena.Lease() as lease:
        a = lease.empty(60)
        b = lease.empty(60)
        c = lease.empty(10, np.int64)
    assert a.size == b.size == 60 and c.size == 10 and c.dtype == np.int64
    assert a.base.size == 100                     # (50 is too small; 100 the only float one that fits)
    assert b.base is None or b.base.size == 60    # (none left: a fresh one)
    assert c.base.size == 80
    assert sorted(x.size for _, x, _ in arena._kept) == [50, 60, 80, 100]
    assert mb.release_memory() == (50 + 60 + 100) * 8 + 80 * 8
    assert arena.kept() == 0


def test_a_lease_that_raised_or_does_not_keep_gives_nothing_back(kept):
    with pytest.raises(RuntimeError):
        with arena.Lease() as lease:
            lease.empty(10)
            raise RuntimeError("the run failed")
    with arena.Lease(keep=False) as lease:
        lease.empty(10)
    assert arena.kept() == 0


def test_a_lease_takes_an_array_of_the_same_role_first(kept):
    """Of the kept arrays that fit, one last used in the same role (a run's
    heap, written only at its start, is not handed to another run's lengths,
    which would fault its untouched pages in)."""
    small, heap = np.empty(100), np.empty(200)
    arena.give([("prompt", small), ("sk", heap)])
    with arena.Lease() as lease:
        assert lease.empty(100, role="sk").base is heap
        assert lease.empty(100, role="output").base is small
    assert [role for role, _, _ in arena._kept] == ["sk", "output"]


def test_the_oldest_arrays_go_beyond_the_limit(kept, monkeypatch):
    monkeypatch.setattr(arena, "LIMIT", 8 * 250)
    first, second, third = np.empty(100), np.empty(100), np.empty(100)
    arena.give([("", first)])
    arena.give([("", second), ("", third)])
    assert [a is b for (_, a, _), b in zip(arena._kept, (second, third))] == [True, True]
    monkeypatch.setattr(arena, "LIMIT", 0)
    arena.give([("", np.empty(1))])
    assert arena.kept() == 0


@pytest.mark.parametrize("text", ["lots", "-1", "inf", "nan"])
def test_a_bad_limit_is_refused_naming_the_variable(text):
    with pytest.raises(ValueError, match=r"MBBATCH_KEPT_MB = .*a finite number >= 0"):
        arena._limit(text)


def test_the_limit_is_read_in_megabytes():
    assert arena._limit("0") == 0 and arena._limit("1.5") == 3 << 19 and arena._limit("2048") == 2 << 30


def test_small_arrays_are_never_kept(monkeypatch):
    monkeypatch.setattr(arena, "LEAST", 1000)
    mb.release_memory()
    with arena.Lease() as lease:
        lease.empty(999)
    assert arena.kept() == 0


def test_leases_of_several_threads_take_distinct_arrays(kept):
    arena.give([("", np.empty(100)) for _ in range(4)])
    got, barrier = [], threading.Barrier(4)

    def take():
        with arena.Lease() as lease:
            x = lease.empty(100)
            barrier.wait()
            got.append(x.base if x.base is not None else x)
            barrier.wait()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(x) for x in got}) == 4


def _poison():
    """Fill every kept array with garbage (NaN, or the most negative integer)."""
    for _, a, _ in arena._kept:
        a[...] = np.nan if a.dtype.kind == "f" else np.iinfo(a.dtype).min


WL = mb.Workload(prompt=st.lognorm(0.8, scale=300), output=st.lognorm(0.8, scale=80))
MIX = mb.Workload.mixture({"a": (3, mb.Workload(prompt=st.lognorm(0.8, scale=300), output=st.lognorm(0.8, scale=80),
                                                 ttft_slo=0.3, tpot_slo=0.02)),
                           "b": (1, WL)})
#: runs touching every leased array: each admission order, goodput, multi-step, a preempting memory, 2 engines
RUNS = [(dict(admission="fcfs", kv_tokens=20_000), WL), (dict(admission="mlfq", kv_tokens=20_000, quantum=4), WL),
        (dict(admission="edf", kv_tokens=20_000), MIX), (dict(admission="vtc", kv_tokens=30_000), MIX),
        (dict(admission="multibin", kv_tokens=20_000), WL), (dict(admission="spf", aging=50.0), MIX),
        (dict(num_scheduler_steps=4, kv_tokens=20_000), MIX), (dict(admission="mlfq", servers=2), MIX)]


def _run(settings, wl, keep=False):
    settings = dict(settings)
    servers = settings.pop("servers", 1)
    return mb.simulate(mb.ContinuousBatching(max_num_seqs=32, **settings), arrivals=mb.Poisson(60.0 * servers),
                       workload=wl, n=3000, servers=servers, seed=7, keep_requests=keep)


def _same(a, b):
    ma, mb_ = a.metrics(), b.metrics()
    assert ma.keys() == mb_.keys()
    for k in ma:
        assert ma[k] == mb_[k] or (ma[k] != ma[k] and mb_[k] != mb_[k]), k


def test_runs_on_kept_garbage_are_runs_on_fresh_memory(kept, monkeypatch):
    """Each run after the others, on the arrays they gave back filled with
    garbage, equals its run with nothing kept."""
    fresh = []
    monkeypatch.setattr(arena, "LIMIT", 0)
    for settings, wl in RUNS:
        fresh.append(_run(settings, wl))
    monkeypatch.setattr(arena, "LIMIT", 1 << 30)
    for rounds in range(2):
        for (settings, wl), want in zip(RUNS, fresh):
            _poison()
            _same(_run(settings, wl), want)
    assert arena.kept() > 0


def test_a_results_requests_are_not_reused(kept):
    res = _run(*RUNS[2], keep=True)
    before = {k: np.array(res.requests[k], copy=True) for k in res.requests.keys()}
    for settings, wl in RUNS:
        _run(settings, wl)
        _poison()
    for k, v in before.items():
        np.testing.assert_array_equal(res.requests[k], v, err_msg=k)


#: token-policy clusters whose open-loop programs' calls are leased: drawn starts and think times, saturated
#: arrivals (every start and gap 0), no think time (every gap 0), programs cut short (n not a multiple of calls)
CLUSTER_RUNS = [(mb.Poisson(30.0), mb.Programs(calls=4, think_time=1.0), 3000),
                (mb.Saturated(), mb.Programs(calls=3, think_time=0.5), 3000),
                (mb.Poisson(30.0), mb.Programs(calls=3, think_time=0.0), 3001)]


def _cluster_run(arrivals, programs, n, keep=False):
    cl = mb.Cluster(mb.DynamicBatching(), engines=3, router="autellix", programs=programs)
    return mb.simulate(cl, arrivals=arrivals, workload=WL, n=n, seed=5, keep_requests=keep)


def test_a_clusters_programs_on_kept_garbage_are_runs_on_fresh_memory(kept, monkeypatch):
    """A token-policy cluster's open-loop programs' calls (their starts,
    gaps, new tokens, outputs, contexts, order and last-call flags) come
    from the kept arrays: each run on garbage equals its run with nothing
    kept, and a result keeping its requests holds arrays no later run
    takes."""
    monkeypatch.setattr(arena, "LIMIT", 0)
    fresh = [_cluster_run(*r) for r in CLUSTER_RUNS]
    monkeypatch.setattr(arena, "LIMIT", 1 << 30)
    for _ in range(2):
        for r, want in zip(CLUSTER_RUNS, fresh):
            _poison()
            _same(_cluster_run(*r), want)
    assert {role for role, _, _ in arena._kept} >= {"start", "gap", "new", "out", "ctx", "order", "session_end"}
    res = _cluster_run(*CLUSTER_RUNS[0], keep=True)
    before = {k: np.array(res.requests[k], copy=True) for k in res.requests.keys()}
    for r in CLUSTER_RUNS:
        _cluster_run(*r)
        _poison()
    for k, v in before.items():
        np.testing.assert_array_equal(res.requests[k], v, err_msg=k)


def test_an_array_of_another_role_is_taken_only_up_to_twice_the_size(kept):
    big, near = np.empty(1000), np.empty(150)
    arena.give([("cluster.feed.prompt", big), ("sk", near)])
    with arena.Lease() as lease:
        a = lease.empty(100, role="prompt")
        b = lease.empty(100, role="output")
    assert a.base is near                       # (150 <= 2 x 100)
    assert b.base is None or b.base is not big  # (1,000 is more than twice: a fresh one)
    assert any(x is big for _, x, _ in arena._kept)


def test_an_array_written_in_part_is_counted_by_the_bytes_written(kept):
    with arena.Lease() as lease:
        a = lease.empty(4000, role="rows", shape=(4, 1000))
        lease.charge(a, 8 * 400)
        lease.charge(np.empty(5), 1)            # (not one of the lease's: nothing)
    assert a.shape == (4, 1000) and arena.kept() == 8 * 400
    # (again in the same role, the same pages written again: the more of the two)
    with arena.Lease() as lease:
        a = lease.empty(4000, role="rows", shape=(4, 1000))
        lease.charge(a, 8 * 300)
    assert arena.kept() == 8 * 400
    # (in another role, dense: what it writes beside what was written before, at most its size)
    with arena.Lease() as lease:
        lease.empty(3000, role="prompt")
    assert arena.kept() == 8 * 3400
    assert mb.release_memory() == 8 * 3400


#: continuous-engine clusters and deployments whose engines' arrays are leased: least used, round robin with
#: a class mixture, one engine keeping its records (none kept), a deployment's pools (the decode pool's engines
#: dealt their shares), its decode pool least used, two engines dealt their shares (their records leased)
CONTINUOUS_RUNS = [
    lambda keep: mb.simulate(mb.Cluster(mb.ContinuousBatching(max_num_seqs=16, kv_tokens=20_000), engines=3,
                                        router="least_used"), arrivals=mb.Poisson(20.0), workload=WL, n=2000,
                             seed=3, keep_requests=keep),
    lambda keep: mb.simulate(mb.Cluster(mb.ContinuousBatching(max_num_seqs=16, admission="edf"), engines=2,
                                        router="round_robin"), arrivals=mb.Poisson(12.0), workload=MIX, n=2000,
                             seed=4, keep_requests=keep),
    lambda keep: mb.simulate(mb.Cluster(mb.ContinuousBatching(max_num_seqs=16), engines=1),
                             arrivals=mb.Poisson(6.0), workload=WL, n=1500, seed=5, keep_requests=keep),
    lambda keep: mb.simulate(mb.Disaggregated(mb.ContinuousBatching(max_num_seqs=16, kv_tokens=20_000),
                                              mb.ContinuousBatching(max_num_seqs=16, kv_tokens=20_000),
                                              prefill_engines=2, decode_engines=3),
                             arrivals=mb.Poisson(30.0), workload=WL, n=2000, seed=6, keep_requests=keep),
    lambda keep: mb.simulate(mb.Disaggregated(mb.ContinuousBatching(max_num_seqs=16),
                                              mb.ContinuousBatching(max_num_seqs=16), prefill_engines=3,
                                              decode_engines=2, decode_router="least_used"),
                             arrivals=mb.Poisson(20.0), workload=WL, n=2000, seed=7, keep_requests=keep),
    lambda keep: mb.simulate(mb.ContinuousBatching(max_num_seqs=16, kv_tokens=20_000), arrivals=mb.Poisson(12.0),
                             workload=WL, n=2000, servers=2, seed=8, keep_requests=keep)]


def _same_requests(a, b):
    assert (a.requests is None) == (b.requests is None)
    if a.requests is not None:
        assert a.requests.keys() == b.requests.keys()
        for k in a.requests.keys():
            np.testing.assert_array_equal(a.requests[k], b.requests[k], err_msg=k)


@pytest.mark.parametrize("keep", [False, True])
def test_continuous_clusters_and_deployments_on_kept_garbage_are_runs_on_fresh_memory(kept, monkeypatch, keep):
    """A cluster's engines' feeds, records and workspace and a deployment's
    pools' (its decode engines' shares of the requests and their records)
    come from the kept arrays: each run on garbage equals its run with
    nothing kept, metrics and records, and a result keeping its requests
    holds arrays no later run takes."""
    monkeypatch.setattr(arena, "LIMIT", 0)
    fresh = [run(keep) for run in CONTINUOUS_RUNS]
    monkeypatch.setattr(arena, "LIMIT", 1 << 30)
    for _ in range(2):
        for run, want in zip(CONTINUOUS_RUNS, fresh):
            _poison()
            got = run(keep)
            _same(got, want)
            _same_requests(got, want)
    # (a deployment's pools keep the records its result reads, keep_requests or not)
    assert {role for role, _, _ in arena._kept} >= {"cluster.feed.prompt", "cluster.ws.arrival", "prompt",
                                                    "cluster.records.floats"}
    held = [run(True) for run in CONTINUOUS_RUNS]
    before = [{k: np.array(r.requests[k], copy=True) for k in r.requests.keys()} for r in held]
    for run in CONTINUOUS_RUNS:
        run(keep)
        _poison()
    for r, want in zip(held, before):
        for k, v in want.items():
            np.testing.assert_array_equal(r.requests[k], v, err_msg=k)
