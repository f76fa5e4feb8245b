"""Routers (mbbatch.routing): the Autellix load balancer (Luo et al.,
2025, arXiv:2502.13965) in nine groups of tests, thread safety, and the LAPS router's
classification, selection and rebalancing."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from mbbatch.routing import LapsRouter, LoadBalancer, RequestSize


def _lb(n=3):
    lb = LoadBalancer()
    for i in range(n):
        lb.register_engine(f"engine_{i}")
    return lb


class TestRequestClassification:
    def test_threshold_is_2048_prefill_tokens(self):
        lb = LoadBalancer()
        assert lb.threshold == 2048
        assert lb.classify(2048) is RequestSize.SMALL
        assert lb.classify(2049) is RequestSize.LARGE

    def test_boundaries_route_as_their_class(self):
        lb = _lb(2)
        lb.route_request("p", 2049)                  # large: assigns p to engine_0
        lb.route_request("q", 10)                    # small: least used is engine_1
        assert lb.route_request("p", 2049) == "engine_0"   # large again: locality
        assert lb.route_request("p", 2048) == "engine_1"   # 2048 is small: least used
        s = lb.get_stats()
        assert (s["small_requests"], s["large_requests"]) == (2, 2)

    def test_a_custom_threshold(self):
        lb = LoadBalancer(threshold=100)
        assert lb.classify(100) is RequestSize.SMALL and lb.classify(101) is RequestSize.LARGE


class TestSmallRequestLoadBalancing:
    def test_small_requests_go_to_the_least_used_engine(self):
        lb = _lb(3)
        got = [lb.route_request(f"p{i}", 100) for i in range(6)]
        assert got == ["engine_0", "engine_1", "engine_2"] * 2

    def test_ties_go_to_the_lowest_id(self):
        lb = LoadBalancer()
        for e in (5, 2, 9):
            lb.register_engine(e)
        assert lb.route_request("p", 1) == 2
        assert lb.route_request("p", 1) == 5

    def test_load_spreads_evenly(self):
        lb = _lb(4)
        for i in range(400):
            lb.route_request(f"p{i % 7}", i % 2049)
        loads = [e["active_requests"] for e in lb.get_stats()["engines"].values()]
        assert max(loads) - min(loads) <= 1 and sum(loads) == 400


class TestLargeRequestLocality:
    def test_first_large_request_assigns_least_used_then_sticks(self):
        lb = _lb(3)
        lb.route_request("x", 5)                      # engine_0 busy
        first = lb.route_request("p", 3000)
        assert first == "engine_1" and lb.assigned_engine("p") == "engine_1"
        for _ in range(5):                            # however loaded engine_1 becomes
            assert lb.route_request("p", 4000) == "engine_1"

    def test_locality_hits_and_assigns_are_counted(self):
        lb = _lb(2)
        for pid in ("a", "b", "a", "a", "b"):
            lb.route_request(pid, 3000)
        s = lb.get_stats()
        assert (s["locality_assigns"], s["locality_hits"], s["programs_in_table"]) == (2, 3, 2)


class TestMixedRequestPatterns:
    def test_small_requests_ignore_the_program_table(self):
        lb = _lb(2)
        assert lb.route_request("p", 3000) == "engine_0"
        # engine_0 now has one active request: a small call of p goes elsewhere
        assert lb.route_request("p", 10) == "engine_1"
        assert lb.assigned_engine("p") == "engine_0"

    def test_large_requests_keep_locality_between_small_ones(self):
        lb = _lb(3)
        home = lb.route_request("p", 5000)
        for i in range(10):
            lb.route_request("p", 50)
            assert lb.route_request("p", 2049 + i) == home


class TestEngineManagement:
    def test_register_and_unregister(self):
        lb = _lb(2)
        assert lb.engines == ["engine_0", "engine_1"]
        lb.unregister_engine("engine_0")
        assert lb.engines == ["engine_1"]
        with pytest.raises(ValueError, match="already registered"):
            lb.register_engine("engine_1")
        with pytest.raises(KeyError, match="engine_7"):
            lb.unregister_engine("engine_7")

    def test_unregistering_clears_its_programs_which_are_reassigned(self):
        lb = _lb(2)
        assert lb.route_request("p", 3000) == "engine_0"
        lb.unregister_engine("engine_0")
        assert lb.assigned_engine("p") is None and lb.get_stats()["programs_in_table"] == 0
        assert lb.route_request("p", 3000) == "engine_1"
        assert lb.get_stats()["locality_assigns"] == 2

    def test_ids_must_be_comparable(self):
        lb = LoadBalancer()
        lb.register_engine(1)
        with pytest.raises(TypeError, match="comparable"):
            lb.register_engine("two")


class TestRequestCompletion:
    def test_completion_decrements_the_workload(self):
        lb = _lb(2)
        e = lb.route_request("p", 1)
        assert lb.get_stats()["engines"][e]["workload"] == 1
        lb.complete_request(e, "p")
        assert lb.get_stats()["engines"][e]["workload"] == 0

    def test_workload_steers_routing(self):
        lb = _lb(2)
        a, b = lb.route_request("p", 1), lb.route_request("q", 1)
        lb.complete_request(b, "q")
        assert lb.route_request("r", 1) == b
        lb.complete_request(a, "p")
        assert lb.route_request("s", 1) == a

    def test_completing_more_than_was_routed_is_refused(self):
        lb = _lb(1)
        with pytest.raises(ValueError, match="no active request"):
            lb.complete_request("engine_0", "p")


class TestProgramRemoval:
    def test_removing_a_program_clears_its_entry(self):
        lb = _lb(2)
        e = lb.route_request("p", 3000)
        assert lb.remove_program("p") is True
        assert lb.assigned_engine("p") is None
        assert lb.get_stats()["engines"][e]["programs_assigned"] == 0
        assert lb.remove_program("p") is False

    def test_a_removed_program_is_assigned_afresh(self):
        lb = _lb(2)
        lb.route_request("p", 3000)                  # engine_0
        lb.remove_program("p")
        assert lb.route_request("p", 3000) == "engine_1"   # least used now


class TestStatistics:
    def test_counters(self):
        lb = _lb(2)
        for pid, tokens in [("a", 10), ("a", 3000), ("b", 3000), ("a", 3000), ("c", 2048)]:
            lb.route_request(pid, tokens)
        s = lb.get_stats()
        assert {k: s[k] for k in ("total_requests", "small_requests", "large_requests", "locality_hits",
                                  "locality_assigns", "programs_in_table")} == {
            "total_requests": 5, "small_requests": 2, "large_requests": 3, "locality_hits": 1,
            "locality_assigns": 2, "programs_in_table": 2}
        assert set(s["engines"]) == {"engine_0", "engine_1"}
        assert sum(e["active_requests"] for e in s["engines"].values()) == 5


class TestEdgeCases:
    def test_no_engines(self):
        with pytest.raises(RuntimeError, match="no engine is registered"):
            LoadBalancer().route_request("p", 1)

    def test_all_engines_removed(self):
        lb = _lb(1)
        lb.unregister_engine("engine_0")
        with pytest.raises(RuntimeError, match="no engine is registered"):
            lb.route_request("p", 3000)

    def test_zero_tokens_is_small(self):
        assert _lb(1).classify(0) is RequestSize.SMALL

    @pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
    def test_bad_token_counts(self, bad):
        with pytest.raises((TypeError, ValueError), match="num_tokens must be a non-negative integer"):
            _lb(1).route_request("p", bad)

    def test_numpy_integers_are_counts(self):
        assert _lb(1).route_request("p", np.int64(3000)) == "engine_0"


def test_the_balancer_is_thread_safe():
    """Eight threads routing and completing at once: every request counted,
    every completion matched, no workload negative or lost."""
    lb = _lb(4)
    per_thread = 500

    def work(t):
        rng = np.random.default_rng(t)
        for i in range(per_thread):
            e = lb.route_request(f"p{t}-{i % 5}", int(rng.integers(0, 5000)))
            lb.complete_request(e, f"p{t}-{i % 5}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = lb.get_stats()
    assert s["total_requests"] == 8 * per_thread
    assert s["small_requests"] + s["large_requests"] == s["total_requests"]
    assert s["locality_hits"] + s["locality_assigns"] == s["large_requests"]
    assert all(e["active_requests"] == 0 for e in s["engines"].values())


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(0, 4096)), min_size=1, max_size=60))
def test_with_the_threshold_above_every_request_autellix_is_least_used(calls):
    """Property: with every request small, Algorithm 2 routes as LEAST_USED."""
    lb, ref = LoadBalancer(threshold=10_000), _lb(0)
    loads = {}
    for e in range(3):
        lb.register_engine(e)
        loads[e] = 0
    for pid, tokens in calls:
        want = min(loads, key=lambda e: (loads[e], e))
        assert lb.route_request(pid, tokens) == want
        loads[want] += 1
    assert ref.get_stats()["total_requests"] == 0


# --- LAPS ---------------------------------------------------------------------------------


def test_laps_classifies_256_short_and_257_long():
    r = LapsRouter(3)
    assert (r.classify(256), r.classify(257), r.classify(0)) == ("short", "long", "short")
    assert (r.short, r.long) == ([0, 1], [2])


def test_laps_picks_the_least_outstanding_instance_of_the_group():
    r = LapsRouter(4, long_instances=2)
    assert [r.select(10, 0.0)[1] for _ in range(3)] == [0, 1, 0]
    assert [r.select(1000, 0.0)[1] for _ in range(3)] == [2, 3, 2]
    r.request_done("short", 0)
    r.request_done("short", 0)
    assert r.select(10, 0.0) == ("short", 0)


def test_laps_moves_one_instance_toward_pressure_at_most_once_per_interval():
    r = LapsRouter(4, long_instances=2, interval=5.0, ratio=2.0)
    r.select(1000, 0.0)                              # the first check: 0 short vs 0 long, no move
    for _ in range(5):
        r.select(10, 1.0)                            # within the interval: no check
    assert (r.short, r.long) == ([0, 1], [2, 3])
    r.select(10, 5.0)                                # 5 short > 2 x 1 long: one long instance moves
    assert (r.short, r.long) == ([0, 1, 3], [2]) and r.moves == [(5.0, 3, "long", "short")]
    for _ in range(20):
        r.select(10, 20.0)                           # long keeps its last instance
    assert r.long == [2]


def test_laps_moves_short_to_long_symmetrically_and_keeps_one_short():
    r = LapsRouter(3, long_instances=1, interval=1.0)
    for t in range(10):
        r.select(1000, float(t))
    assert r.short == [0] and r.long == [1, 2]


def test_laps_with_one_instance_has_no_groups():
    r = LapsRouter(1)
    assert not r.enabled
    assert r.select(10, 0.0) == ("short", 0) and r.select(5000, 0.0) == ("long", 0)
    assert r.maybe_rebalance(100.0) is None


@pytest.mark.parametrize("kw, match", [
    ({"instances": 0}, r"instances must be an integer in \[1, 1048576\]"),
    ({"instances": 2 ** 64}, r"instances must be an integer in \[1, 1048576\]; got 18446744073709551616"),
    ({"instances": 3, "long_instances": 3}, r"long_instances must be an integer in \[1, 2\]"),
    ({"instances": 3, "interval": -1.0}, r"interval must be in \[0, inf\)"),
    ({"instances": 3, "ratio": 0.0}, r"ratio must be in \(0, inf\)"),
    ({"instances": 3, "threshold": -5}, r"threshold must be a non-negative integer"),
])
def test_laps_arguments_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        LapsRouter(**kw)


@settings(max_examples=80, deadline=None)
@given(n=hs.integers(2, 6), events=hs.lists(hs.tuples(hs.floats(0, 3.0), hs.integers(0, 600), hs.booleans()),
                                            max_size=80))
def test_laps_groups_keep_an_instance_and_move_at_most_once_per_interval(n, events):
    """Property: whatever the requests, each group keeps at least one
    instance, the groups partition the instances, and moves are an interval
    apart."""
    r = LapsRouter(n, interval=2.0)
    now, live = 0.0, []
    for gap, tokens, finish in events:
        now += gap
        live.append(r.select(tokens, now))
        if finish and live:
            r.request_done(*live.pop(0))
        assert r.short and r.long and sorted(r.short + r.long) == list(range(n))
    times = [m[0] for m in r.moves]
    assert all(b - a >= 2.0 for a, b in zip(times, times[1:]))


def test_laps_router_takes_numpy_integers_and_checks_what_it_is_told():
    """An instance count of any integer type; a finished request names an
    instance of the router (no other is decremented), a time is a finite
    number of seconds; nothing changes on a refusal."""
    r = LapsRouter(np.int64(4), long_instances=np.int64(1))
    assert r.instances == 4 and r.long == [3]
    with pytest.raises(TypeError, match=r"instances must be an integer in \[1, 1048576\]; got 1.5"):
        LapsRouter(1.5)
    cat, inst = r.select(10, 0.0)
    before = r.status()
    for bad, exc, match in ((-3, ValueError, r"instance must be an integer in \[0, 3\]; got -3"),
                            (99, ValueError, r"instance must be an integer in \[0, 3\]; got 99"),
                            (1.0, TypeError, r"instance must be an integer in \[0, 3\]; got 1.0"),
                            (True, TypeError, "instance must be an integer")):
        with pytest.raises(exc, match=match):
            r.request_done(cat, bad)
        assert r.status() == before
    for now, exc in (("x", TypeError), (float("nan"), ValueError), (float("inf"), ValueError)):
        with pytest.raises(exc, match=r"now must be (a real number )?in \(-inf, inf\)"):
            r.select(10, now)
        with pytest.raises(exc, match=r"now must be (a real number )?in \(-inf, inf\)"):
            r.maybe_rebalance(now)
        assert r.status() == before
    r.request_done(cat, np.int64(inst))
    assert r.outstanding == [0, 0, 0, 0]


def test_balancer_ids_are_checked_at_the_boundary():
    """Engine and program ids: hashable, not None, not NaN, each refusal
    naming its argument and changing nothing (a None engine once lost its
    locality hits; a NaN one could not be found again)."""
    lb = LoadBalancer(threshold=100)
    lb.register_engine(0)
    lb.register_engine(1)
    for bad, exc, match in ((None, TypeError, "engine_id must be a hashable id, not None"),
                            (float("nan"), ValueError, "engine_id must not be NaN"),
                            ([1], TypeError, "engine_id must be a hashable id")):
        with pytest.raises(exc, match=match):
            lb.register_engine(bad)
        with pytest.raises(exc, match=match):
            lb.unregister_engine(bad)
    assert lb.engines == [0, 1]
    stats = lb.get_stats()
    for bad, exc, match in (([1], TypeError, r"pid must be a hashable id \(an int or a str, say\); got \[1\]"),
                            (None, TypeError, "pid must be a hashable id, not None"),
                            (float("nan"), ValueError, "pid must not be NaN")):
        with pytest.raises(exc, match=match):
            lb.route_request(bad, 5000)
        with pytest.raises(exc, match=match):
            lb.remove_program(bad)
    assert lb.get_stats() == stats
    # an engine id that is falsy still gives its locality hits
    lb2 = LoadBalancer(threshold=100)
    lb2.register_engine(0)
    assert lb2.route_request("p", 5000) == 0 and lb2.route_request("p", 5000) == 0
    assert lb2.get_stats()["locality_hits"] == 1 and lb2.remove_program("p") and not lb2.remove_program("p")


_IDS = hs.one_of(hs.integers(-2, 4), hs.sampled_from(["a", "b"]), hs.just(None), hs.just(float("nan")),
                 hs.just([1]))


@settings(max_examples=150, deadline=None)
@given(ops=hs.lists(hs.tuples(hs.sampled_from(["register", "unregister", "route", "complete", "remove"]), _IDS,
                              _IDS, hs.integers(0, 5000)), max_size=60))
def test_balancer_operation_sequences_keep_its_counts(ops):
    """Property: any sequence of operations, bad ids among them: a refused
    call raises TypeError, ValueError, KeyError or RuntimeError and changes
    nothing; the counters always add up (large = hits + assigns, total =
    small + large, active requests = routed - completed), and the program
    table points at registered engines only."""
    lb = LoadBalancer(threshold=2048)
    routed = completed = 0
    for op, a, b, tokens in ops:
        before = lb.get_stats()
        try:
            if op == "register":
                lb.register_engine(a)
            elif op == "unregister":
                lb.unregister_engine(a)
            elif op == "route":
                lb.route_request(a, tokens)
                routed += 1
            elif op == "complete":
                lb.complete_request(a, b)
                completed += 1
            else:
                lb.remove_program(a)
        except (TypeError, ValueError, KeyError, RuntimeError):
            assert lb.get_stats() == before
            continue
        st = lb.get_stats()
        assert st["large_requests"] == st["locality_hits"] + st["locality_assigns"]
        assert st["total_requests"] == st["small_requests"] + st["large_requests"] == routed
        for pid in range(-2, 5):
            e = lb.assigned_engine(pid)
            assert e is None or e in lb.engines
    assert sum(e["active_requests"] for e in lb.get_stats()["engines"].values()) <= routed - completed


def test_laps_classify_names_its_prompt_tokens():
    """LapsRouter.classify(-1) said "num_tokens must be a non-negative integer" (Autellix's
    balancer's parameter, whose check it shares): its parameter is prompt_tokens."""
    r = LapsRouter(instances=3)
    with pytest.raises(ValueError, match=r"^prompt_tokens must be a non-negative integer, in \[0, inf\); got -1$"):
        r.classify(-1)
    with pytest.raises(TypeError, match=r"^prompt_tokens must be a non-negative integer, in \[0, inf\); got 2\.0 "
                                        r"\(float\)$"):
        r.classify(2.0)
    with pytest.raises(ValueError, match=r"^num_tokens must be a non-negative integer, in \[0, inf\); got -1$"):
        _lb(1).classify(-1)
    assert r.classify(0) == "short"
