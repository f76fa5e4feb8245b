"""mbbatch.theory.iteration: multi-bin batching's expected batch service
time under an IterationModel, exact against the model's own batch times and
against simulation within Monte Carlo error.

Statistical tests state their confidence level; under the derandomized
``ci`` hypothesis profile the property's examples are fixed."""

import dataclasses
import math

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given
from hypothesis import strategies as hs

import mbbatch as mb
from mbbatch import theory

#: a two-sided 99.99 % normal quantile
Z_9999 = st.norm.ppf(1 - 0.0001 / 2)

MODEL = mb.IterationModel(setup=0.02, step=7e-3, prefill_per_token=3e-5, per_sequence=8e-5, per_context_token=6e-8)
#: a mixture of experts (Mixtral's 8 experts, 2 a token)
MOE = dataclasses.replace(MODEL, per_expert=1.5e-3, experts=8, experts_per_token=2)


@pytest.mark.parametrize("model", [MODEL, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("finished", ["leave", "stay"])
def test_one_length_is_the_models_batch(finished, model):
    """Every member of one length: the batch's time, IterationModel.service_time."""
    m = dataclasses.replace(model, finished=finished)
    got = theory.iteration_batch_service_time(m, [200.0], 8, prompt_mean=300.0)
    assert got == pytest.approx(float(m.service_time(size=8, prompt=300.0, output=200.0)), rel=1e-13)


@pytest.mark.parametrize("model", [MODEL, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("finished", ["leave", "stay"])
def test_two_lengths_by_enumeration(finished, model):
    """Lengths 1, 4 and 10 with probabilities 0.5, 0.3, 0.2, batches of 3 in
    two bins ([0, 5) and [5, 10]): the mean over every batch of each bin,
    weighted by its probability, timed by the model (a mixture of experts'
    too, whose decode iterations read more experts the more members they
    have left)."""
    import itertools

    m = dataclasses.replace(model, finished=finished)
    v, w = np.array([1.0, 4.0, 10.0]), np.array([0.5, 0.3, 0.2])
    want = 0.0
    for members, mass in (((0, 1), 0.8), ((2,), 0.2)):
        q = w[list(members)] / w[list(members)].sum()
        for combo in itertools.product(range(len(members)), repeat=3):
            o = v[[members[c] for c in combo]]
            pr = float(np.prod(q[list(combo)]))
            t = m.batch_times(np.full(3, 50.0), o, [3]).service[0]
            want += mass * pr * t
    got = theory.iteration_batch_service_time(m, v, 3, [0.0, 5.0, 10.0], prompt_mean=50.0, weights=w)
    assert got == pytest.approx(want, rel=1e-12)


def test_integer_lengths_are_the_simulations():
    """max(ceil(x), 1) of a log-normal: mass 1 in all, the mean to 1e-9 of
    the enumerated sum, the first length's mass F(1)."""
    d = st.lognorm(1.0, scale=50)
    v, w = theory.integer_lengths(d)
    assert v[0] == 1.0 and w.sum() == pytest.approx(1.0) and w[0] == pytest.approx(d.cdf(1.0))
    with pytest.raises(ValueError, match="tail must be"):
        theory.integer_lengths(d, tail=0.1)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="edges must cover"):
        theory.iteration_batch_service_time(MODEL, [1.0, 9.0], 2, [2.0, 9.0], prompt_mean=1.0)
    with pytest.raises(ValueError, match="prompt_mean"):
        theory.iteration_batch_service_time(MODEL, [1.0], 2, prompt_mean=-1.0)
    with pytest.raises(ValueError, match="weights"):
        theory.iteration_batch_service_time(MODEL, [1.0, 2.0], 2, prompt_mean=1.0, weights=[1.0])


@pytest.mark.parametrize("model", [MODEL, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("finished", ["leave", "stay"])
@pytest.mark.parametrize("bins", [1, 4])
def test_simulation_agrees_within_monte_carlo_error(finished, bins, model):
    """Saturated multi-bin batching (B = 16) on a log-normal workload under
    the model (dense, and a mixture of experts): the simulated mean batch
    service time within 3.29 standard errors of the closed form (99.9 %
    confidence; batches of a saturated run are independent), at the edges
    the simulation used."""
    m = dataclasses.replace(model, finished=finished)
    po, oo = st.lognorm(0.6, scale=200), st.lognorm(1.0, scale=80)
    res = mb.simulate(mb.MultiBin(bins=bins, batch_size=16), arrivals=mb.Saturated(),
                      workload=mb.Workload(prompt=po, output=oo), service_model=m, n=100_000, seed=5)
    pv, pw = theory.integer_lengths(po)
    ov, ow = theory.integer_lengths(oo)
    want = theory.iteration_batch_service_time(m, ov, 16, res.edges, prompt_mean=float(pv @ pw), weights=ow)
    se = res.std_batch_service / math.sqrt(res.n_batches)
    assert abs(res.mean_batch_service - want) < 3.29 * se, (res.mean_batch_service, want, se)


def test_docstring_examples():
    import doctest

    from mbbatch.theory import iteration

    result = doctest.testmod(iteration, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0


@given(B=hs.integers(1, 48), k=hs.integers(1, 6), finished=hs.sampled_from(["leave", "stay"]),
       out_median=hs.floats(5.0, 200.0), out_sigma=hs.floats(0.2, 1.0), prompt_median=hs.floats(10.0, 500.0),
       prompt_sigma=hs.floats(0.2, 1.0), step=hs.floats(1e-4, 0.05), per_sequence=hs.floats(0.0, 1e-3),
       per_context=hs.floats(0.0, 1e-6), prefill=hs.floats(0.0, 1e-4), setup=hs.floats(0.0, 0.1))
def test_saturated_simulation_matches_the_closed_form(B, k, finished, out_median, out_sigma, prompt_median,
                                                       prompt_sigma, step, per_sequence, per_context, prefill,
                                                       setup):
    """Any model, batch size, bins and log-normal lengths: the saturated
    mean batch service time of 2,000 batches within a 99.99 % CLT interval of
    eq. (2) under the model (batches of a saturated run are independent)."""
    m = mb.IterationModel(setup=setup, step=step, prefill_per_token=prefill, per_sequence=per_sequence,
                          per_context_token=per_context, finished=finished)
    po, oo = st.lognorm(prompt_sigma, scale=prompt_median), st.lognorm(out_sigma, scale=out_median)
    res = mb.simulate(mb.MultiBin(bins=k, batch_size=B), arrivals=mb.Saturated(),
                      workload=mb.Workload(prompt=po, output=oo), service_model=m, n=2000 * B * k, seed=B + 100 * k)
    pv, pw = theory.integer_lengths(po)
    ov, ow = theory.integer_lengths(oo)
    want = theory.iteration_batch_service_time(m, ov, B, res.edges, prompt_mean=float(pv @ pw), weights=ow)
    half = Z_9999 * res.std_batch_service / math.sqrt(res.n_batches)
    assert abs(res.mean_batch_service - want) <= half, (res.mean_batch_service, want, half)
