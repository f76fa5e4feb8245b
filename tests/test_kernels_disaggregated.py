"""The two-stage driver of closed-loop programs on a disaggregated
deployment (mbbatch._kernels.disaggregated), through its planner: the
decode pool takes its calls in the order they become ready (at their first
tokens), dealt in turn, and pulls each one's KV cache once it admits it;
each call's first token is its prefill engine's record; every call after
another arrives after that one's answer.  (Request by request against a
plain-Python deployment: tests/test_planners_disaggregated.py.)"""

from __future__ import annotations

import numpy as np
import scipy.stats as st

import mbbatch as mb


def test_the_decode_pool_takes_calls_as_they_become_ready_and_answers_issue_the_next():
    wl = mb.Workload(prompt=st.lognorm(0.6, scale=64), output=st.lognorm(0.6, scale=16))
    engine = mb.ContinuousBatching(max_num_seqs=8, request_overhead=0.002)
    pol = mb.Disaggregated(engine, engine, prefill_engines=2, decode_engines=3,
                           programs=mb.Programs(calls=3, think_time=0.0, closed=True))
    res = mb.simulate(pol, mb.Poisson(30.0), workload=wl, n=600, seed=4, keep_requests=True)
    r = res.requests
    assert np.all(np.diff(r["arrival"]) >= 0) and np.isfinite(r["completion"]).all()
    many = r["output"] > 1
    # (ready at its first token; admitted at or after it, its KV cache pulled then: its next token after that)
    assert np.all(r["decode_admitted"][many] >= r["first_token"][many])
    assert np.all(r["completion"][many] > (r["decode_admitted"] + r["transfer_time"])[many])
    # (a program's next call arrives the instant its client has the answer: no think time)
    prog, done = r["program"], r["completion"]
    follow = 0
    for p in np.unique(prog):
        idx = np.flatnonzero(prog == p)
        for a, b in zip(idx[:-1], idx[1:]):
            np.testing.assert_array_equal(r["arrival"][b], done[a] + 0.002)
            follow += 1
    assert follow > 100
    assert res.decode.n == int(many.sum())
