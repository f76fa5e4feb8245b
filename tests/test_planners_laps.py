"""The planner of LAPS (mbbatch.planners.laps): its prefill model, its
refusals, its decode stage planned on the event kernel, and goodput across
the two stages."""

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb
from mbbatch.planners import laps, tokens
from mbbatch.simulation import check_simulation, plan

WL = mb.Workload(prompt=st.lognorm(1.0, scale=200), output=st.lognorm(0.8, scale=64))


def test_a_laps_plan_counts_its_decode_stage():
    alone = plan(mb.LAPS(instances=2), mb.Poisson(10.0), workload=WL, n=2000)
    staged = plan(mb.LAPS(instances=2, decode=mb.StaticBatching(8), decode_servers=2), mb.Poisson(10.0),
                  workload=WL, n=2000)
    assert isinstance(alone, laps.Plan) and alone.servers == 2
    decode = tokens.check(mb.StaticBatching(8), mb.Poisson(1.0), None, 2000, 2, True, WL,
                          mb.DecodeModel(prefill_per_token=0.0), False)
    # (the decode stage's plan, and the per-request arrays it needs)
    assert staged.memory == alone.memory + decode.memory + 48 * 2000


@pytest.mark.parametrize("kw, exc, match", [
    ({"service": st.uniform(1, 9)}, TypeError, "LAPS takes workload="),
    ({"workload": WL, "keep_batches": True}, TypeError, "keep_batches is for the token-level policies"),
    ({"workload": WL, "servers": 2}, ValueError, "servers does not apply to LAPS"),
    ({"workload": WL, "service_model": mb.MaxModel()}, TypeError, "LAPS takes service_model=PrefillModel"),
])
def test_laps_refuses_what_does_not_apply(kw, exc, match):
    with pytest.raises(exc, match=match):
        check_simulation(mb.LAPS(), mb.Poisson(1.0), n=100, **kw)


# --- the backlog check -------------------------------------------------------------------

#: sweeps/laps.toml's requests at 50 % short: log-normal prompts, median 256, sigma 1 (threshold 256)
MIX = mb.Workload(prompt=st.lognorm(1.0, scale=256), output=st.lognorm(0.8, scale=64))


@pytest.mark.parametrize("mode", [dict(dual_queue=False, dynamic=False), dict(dynamic=False), dict()])
def test_laps_overload_at_100_requests_per_second_is_flagged(mode):
    """The laps_modes headline load (4 instances, 100 requests/s, 50 % short) overloads every mode:
    it was reported with unstable False, "not assessed".  Each category's TTFT by arrival group
    grows there (the stats' backlog rule); at 20 requests/s none does."""
    pol = mb.LAPS(instances=4, **mode)
    with pytest.warns(mb.results.UnstableWarning, match="the backlog grows: (short|long) requests"):
        hot = mb.simulate(pol, mb.Poisson(100.0), workload=MIX, n=20_000, seed=1)
    assert hot.unstable and "for their first token" in hot.unstable_reason
    cool = mb.simulate(pol, mb.Poisson(20.0), workload=MIX, n=20_000, seed=1)
    assert not cool.unstable and cool.unstable_reason == "no growing backlog"


def test_one_overloaded_group_is_an_overload():
    """Without dynamic allocation, a quarter of the requests short: the one long instance of
    LAPS(2) saturates at 30 requests/s (it carries 23.5) while the short one keeps up: the long
    requests' backlog is named."""
    wl = mb.Workload(prompt=st.lognorm(1.0, scale=512), output=st.lognorm(0.8, scale=64))
    with pytest.warns(mb.results.UnstableWarning, match="long requests"):
        res = mb.simulate(mb.LAPS(instances=2, dynamic=False), mb.Poisson(30.0), workload=wl, n=20_000, seed=2)
    assert res.unstable and "long requests" in res.unstable_reason and "short requests" not in res.unstable_reason
    saturated = mb.simulate(mb.LAPS(instances=2), mb.Saturated(), workload=wl, n=2_000, seed=2)
    assert not saturated.unstable and saturated.unstable_reason.startswith("not assessed")


def test_a_request_the_continuous_decode_stage_could_never_run_is_refused_before_the_prefill(monkeypatch):
    """A continuous decode stage refuses a request beyond its KV blocks: LAPS draws the requests (as
    its run will: the prompt stream's lengths) and refuses it before its prefill instances run (it once
    ran the whole prefill stage first), naming the request by its place in arrival order and the output
    the stage generates, its output less the prefill's first token (a one-token request checked as two)."""
    import numpy as np

    from mbbatch._seeding import STREAM_PROMPT, STREAM_SERVICE, stream
    from mbbatch.planners.common import lengths

    pol = mb.LAPS(instances=2, decode=mb.ContinuousBatching(max_num_seqs=8, kv_tokens=600.0))
    ss = np.random.SeedSequence(3)
    p = lengths(WL._prompt, stream(ss, STREAM_PROMPT), 2000, True)
    o = np.maximum(lengths(WL._output, stream(ss, STREAM_SERVICE), 2000, True) - 1, 1)
    first = int(np.flatnonzero(p + o > 592)[0])

    def no_prefill(*args, **kwargs):
        raise AssertionError("the prefill stage ran")

    monkeypatch.setattr(laps, "_run", no_prefill)
    with pytest.raises(ValueError, match=rf"kv_tokens = 600: request {first} \(prompt {p[first]:g} \+ output "
                                         rf"{o[first]:g} tokens\) can never fit the 592 tokens"):
        mb.simulate(pol, mb.Poisson(10.0), workload=WL, n=2000, seed=ss)


def test_many_decode_servers_no_longer_take_memory_in_their_square():
    """Issue 49: LAPS's continuous decode stage on decode_servers = 256 held
    1.6 GB at n = 2,000 (its engines' time series merged at every instant of
    their union: 256 x 256 x rows floats; every engine's histograms held to
    the end), of which the memory check counted 4 MiB.  Now the peak is a
    few tens of MB, within a factor 2 of the check's count."""
    import tracemalloc

    kw = dict(arrivals=mb.Poisson(300.0), workload=WL, n=2000)
    mb.simulate(mb.LAPS(instances=2, decode=mb.ContinuousBatching(), decode_servers=2), **kw)   # (compiled)
    pol = mb.LAPS(instances=2, decode=mb.ContinuousBatching(), decode_servers=256)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        res = mb.simulate(pol, seed=0, **kw)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    memory = plan(pol, **kw).memory
    assert res.completed == 2000 and res.decode.servers == 256
    assert peak < 40 << 20 and memory / 2 < peak < 2 * memory, (peak, memory)


def test_the_memory_check_names_decode_servers_when_the_decode_engines_are_too_many(monkeypatch):
    """The decode stage's engines are counted one each, under the parameter
    that sets them: 100,000 of them need 3 GiB, more than 1 GiB."""
    import mbbatch._running

    monkeypatch.setattr(mbbatch._running, "available_memory", lambda: 1 << 30)
    kw = dict(arrivals=mb.Poisson(1.0), workload=WL, n=200_000)
    check_simulation(mb.LAPS(instances=2, decode=mb.ContinuousBatching(), decode_servers=1000), **kw)
    with pytest.raises(ValueError, match=r"^decode_servers: this run needs 3\.\d GiB .* for the 100000 engines'"):
        check_simulation(mb.LAPS(instances=2, decode=mb.ContinuousBatching(), decode_servers=100_000), **kw)


# --- goodput across the prefill and the decode stage ---------------------------------------


@pytest.mark.parametrize("stage", [mb.StaticBatching(8), mb.DynamicBatching(), mb.ContinuousBatching(max_num_seqs=16)],
                         ids=lambda p: type(p).__name__)
def test_goodput_with_a_decode_stage_counts_both_objectives_end_to_end(stage):
    """With a decode stage goodput is the share of the requests within both
    objectives, recomputed here from the records exactly: the prefill's time
    to first token within ttft_slo, and (completion - first token) /
    (output - 1), the decode stage's wait included (0 for a single token),
    within tpot_slo.  Each objective turns away requests the other lets
    through; the objectives change nothing else (every other metric and
    record bit for bit); with ttft_slo alone it is the share within it;
    without objectives, NaN."""
    pol = mb.LAPS(instances=2, decode=stage, decode_servers=2)
    prompt, output = st.lognorm(1.0, scale=200), st.expon(scale=16)
    kw = dict(arrivals=mb.Poisson(20.0), n=3000, seed=2, keep_requests=True)
    bare = mb.simulate(pol, workload=mb.Workload(prompt=prompt, output=output), **kw)
    q = bare.requests
    ttft = q.first_token - q.arrival
    many = q.output > 1
    tpot = np.zeros(q.output.size)
    tpot[many] = (q.completion[many] - q.first_token[many]) / (q.output[many] - 1)
    ttft_slo, tpot_slo = float(np.quantile(ttft, 0.8)), float(np.quantile(tpot, 0.8))
    res = mb.simulate(pol, workload=mb.Workload(prompt=prompt, output=output, ttft_slo=ttft_slo, tpot_slo=tpot_slo),
                      **kw)
    fast, paced = ttft <= ttft_slo, tpot <= tpot_slo
    within = fast & paced
    assert res.goodput == within.mean()
    assert np.any(fast & ~paced) and np.any(paced & ~fast) and np.any(within & ~many)
    assert math.isnan(bare.goodput)
    others = {m: v for m, v in res.metrics().items() if m != "goodput"}
    np.testing.assert_equal(others, {m: v for m, v in bare.metrics().items() if m != "goodput"})
    for col in q.columns:
        np.testing.assert_array_equal(getattr(res.requests, col), getattr(q, col))
    first = mb.simulate(pol, workload=mb.Workload(prompt=prompt, output=output, ttft_slo=ttft_slo), **kw)
    assert first.goodput == fast.mean()
