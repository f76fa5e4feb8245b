"""The planner of LAPS (mbbatch.planners.laps): its prefill model, its
refusals, and its decode stage planned on the event kernel."""

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
