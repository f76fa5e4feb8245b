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


def _fits_reference(admitted, first, release, prompt, engine, engines, bs, blocks) -> int:
    """Plain Python: at each admission, each engine's blocks taken by the
    requests admitted by then (itself included) and not freed before it
    (a request frees its blocks at its release, or at its first token where
    that is later): more than ``blocks`` anywhere, EXCEEDS; else, with the
    most any request takes, more than ``blocks`` anywhere, TIGHT; else
    FITS."""
    from mbbatch._kernels.disaggregated import EXCEEDS, FITS, TIGHT

    need = [(int(p) + bs) // bs for p in prompt]
    most = max(need)
    worst = 0
    for r in range(len(admitted)):
        e, a = engine[r], admitted[r]
        worst = max(worst, sum(need[x] for x in range(len(admitted))
                               if engine[x] == e and admitted[x] <= a and max(release[x], first[x]) > a))
    return EXCEEDS if worst > blocks else TIGHT if worst + most > blocks else FITS


def test_held_blocks_fit_as_plain_python_counts_them():
    """holds_fit over 600 random pools (1 to 3 engines, admissions in
    arrival order per engine or not, ties, releases before, at and after
    the first token) and blocks around the most taken: the plain-Python
    count's answer (each of the three over the draws)."""
    from mbbatch._kernels.disaggregated import holds_fit

    rng = np.random.default_rng(12)
    answers = set()
    for _ in range(600):
        n, E, bs = int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.choice([1, 4, 16]))
        engine = rng.integers(0, E, n)
        admitted = np.round(rng.exponential(1.0, n).cumsum(), int(rng.choice([1, 6])))
        if rng.random() < 0.5:
            admitted = rng.permutation(admitted)
        first = admitted + rng.exponential(0.5, n)
        release = np.where(rng.random(n) < 0.3, -np.inf, first + rng.exponential(rng.choice([0.1, 2.0]), n))
        prompt = rng.integers(1, 100, n).astype(float)
        blocks = int(rng.integers(1, 4 * ((prompt.max() + bs) // bs) + 2))
        want = _fits_reference(admitted, first, release, prompt, engine, E, bs, blocks)
        assert holds_fit(admitted, first, release, prompt, engine, E, bs, blocks) == want
        answers.add(want)
    assert answers == {0, 1, 2}
