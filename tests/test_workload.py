"""The request model's requests (mbbatch.workload): lengths drawn or
replayed, rounded to whole tokens, and the predictor's error; request
classes (a mixture's: its runs are tests/test_planners_continuous.py's)."""

import math

import numpy as np
import pytest
import scipy.stats as st

import mbbatch as mb


def _requests(wl, n=4000):
    return mb.simulate(mb.StaticBatching(8), arrivals=mb.Poisson(2.0), workload=wl, n=n, seed=3,
                       keep_requests=True, service_model=mb.MaxModel(per_token=1e-3)).requests


def test_integer_lengths_are_whole_tokens_at_least_one():
    r = _requests(mb.Workload(prompt=st.uniform(0, 5), output=st.expon(scale=3)))
    for col in (r.prompt, r.output):
        assert (col == np.ceil(col)).all() and col.min() >= 1
    r = _requests(mb.Workload(prompt=st.uniform(0, 5), output=st.expon(scale=3), integer_lengths=False))
    assert (r.output != np.ceil(r.output)).any()


def test_replayed_lengths_come_back_in_order():
    p, o = np.arange(1, 501, dtype=float), np.arange(500, 0, -1, dtype=float)
    r = _requests(mb.Workload(prompt=p, output=o), n=None)
    np.testing.assert_array_equal(r.prompt, p)
    np.testing.assert_array_equal(r.output, o)


def test_the_oracle_predicts_exactly_and_sigma_adds_lognormal_error():
    """With predictor_sigma = 0.5 and real lengths, log(pred / output) is
    N(0, 0.5^2): KS p > 1e-4."""
    r = _requests(mb.Workload(prompt=st.uniform(1, 9), output=st.uniform(10, 90)))
    np.testing.assert_array_equal(r.pred, r.output)
    r = _requests(mb.Workload(prompt=st.uniform(1, 9), output=st.uniform(10, 90), integer_lengths=False,
                              predictor_sigma=0.5))
    assert st.kstest(np.log(r.pred / r.output), st.norm(scale=0.5).cdf).pvalue > 1e-4


def test_describe_names_both_lengths():
    d = mb.Workload(prompt=st.uniform(1, 9), output=st.expon(scale=2)).describe()
    assert d["prompt"] == "uniform" and d["output"] == "expon" and d["integer_lengths"] is True


# --- request classes (Workload.mixture) ---------------------------------------------------------------------------

def _two(**kw):
    chat = mb.Workload(prompt=st.uniform(16, 240), output=st.expon(scale=64), ttft_slo=0.5, **kw)
    batch = mb.Workload(prompt=st.uniform(512, 1536), output=st.expon(scale=512), **kw)
    return chat, batch


def test_a_mixtures_shares_are_normalised_and_its_classes_keep_their_objectives():
    chat, batch = _two()
    mix = mb.Workload.mixture({"chat": (3, chat), "batch": (1, batch)})
    assert mix.names == ("chat", "batch") and mix.shares == (0.75, 0.25)
    assert mix.ttft_slo == (0.5, math.inf)
    assert mix.mean("prompt") == pytest.approx(0.75 * chat.mean("prompt") + 0.25 * batch.mean("prompt"))
    assert mix.describe()["classes"] == "chat,batch"


@pytest.mark.parametrize("classes, exc, match", [
    ({}, TypeError, "non-empty dict"),
    ({"a": (0, mb.Workload(prompt=st.uniform(1, 2), output=st.uniform(1, 2)))}, ValueError,
     r"classes\['a'\] share must be in \(0, "),
    ({"a": (1, "chat")}, TypeError, r"classes\['a'\] must be \(share, Workload\)"),
    ({3: (1, mb.Workload(prompt=st.uniform(1, 2), output=st.uniform(1, 2)))}, TypeError, "name"),
])
def test_a_bad_mixture_is_refused_naming_the_class(classes, exc, match):
    with pytest.raises(exc, match=match):
        mb.Workload.mixture(classes)


def test_a_mixtures_classes_share_one_predictor():
    chat, _ = _two()
    _, batch = _two(predictor_sigma=0.5)
    with pytest.raises(ValueError, match="predictor_sigma differ"):
        mb.Workload.mixture({"chat": (1, chat), "batch": (1, batch)})


def test_a_bad_ttft_objective_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"ttft_slo must be in \(0, "):
        mb.Workload(prompt=st.uniform(1, 2), output=st.uniform(1, 2), ttft_slo=0.0)


def test_system_prompts_lead_a_share_of_the_prompts_each_one_of_count():
    """SystemPrompts.draw: each request carries one with probability share (a
    binomial count within 4 standard deviations), uniformly one of count; a
    number's length for all, a distribution's drawn once per prompt, in
    whole tokens; the draws are the generator's, so a seed repeats them."""
    sp = mb.SystemPrompts(length=st.uniform(100, 900), count=5, share=0.3)
    chain, shared = sp.draw(np.random.default_rng(1), 20_000)
    on = chain >= 0
    assert abs(on.sum() - 6000) < 4 * math.sqrt(20_000 * 0.3 * 0.7)
    assert set(np.unique(chain[on])) == {0.0, 1.0, 2.0, 3.0, 4.0} and (shared[~on] == 0).all()
    per = {c: np.unique(shared[chain == c]) for c in range(5)}
    assert all(v.size == 1 and v[0] == np.ceil(v[0]) and 100 <= v[0] <= 1000 for v in per.values())
    again = sp.draw(np.random.default_rng(1), 20_000)
    np.testing.assert_array_equal(again[0], chain) and np.testing.assert_array_equal(again[1], shared)
    chain, shared = mb.SystemPrompts(length=511.5, count=2).draw(np.random.default_rng(0), 100)
    assert (chain >= 0).all() and (shared == 512).all()
    none = mb.SystemPrompts(length=64, share=0.0).draw(np.random.default_rng(0), 100)
    assert (none[0] == -1).all() and (none[1] == 0).all()


@pytest.mark.parametrize("kw, match", [
    (dict(length=64, share=1.5), r"share must be in \[0, 1\]"),
    (dict(length=64, count=0), "count"),
    (dict(length=-1.0), "length"),
    (dict(length=st.norm(0, 1)), "SystemPrompts.length"),
])
def test_bad_system_prompts_are_refused_naming_the_parameter(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        mb.SystemPrompts(**kw)


def test_a_workloads_mean_prompt_counts_its_system_prompts():
    wl = mb.Workload(prompt=st.uniform(0, 200), output=st.expon(scale=50),
                     system_prompts=mb.SystemPrompts(length=1000, count=3, share=0.25))
    assert wl.mean("prompt") == pytest.approx(100 + 250)
    assert wl.describe()["system_prompts"] == 3
    with pytest.raises(TypeError, match="system_prompts"):
        mb.Workload(prompt=st.uniform(0, 200), output=st.expon(scale=50), system_prompts=3)
