"""The iteration cost declared once (mbbatch._kernels.cost): every reader
takes its terms from the one declaration, and the compiled step, the numpy
path and the fit's design matrix are one expression."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mbbatch as mb
from mbbatch._kernels import continuous, cost, dynamic, multibin
from mbbatch.params import PARAMS
from mbbatch.sweeps.spec import SPEC_PARAMS


def test_every_reader_takes_the_terms_from_the_declaration():
    """The model's fields, the parameter table, the spec keys and the kernels'
    layouts: one entry per term, in the declaration's order."""
    assert mb.IterationModel._params == cost.NAMES
    for t in cost.TERMS:
        p = PARAMS[f"IterationModel.{t.name}"]
        assert (p.units, p.default, p.description) == (t.unit, t.default, t.doc)
        assert SPEC_PARAMS[t.spec].key == f"IterationModel.{t.name}"
        assert mb.IterationModel.spec_keys[t.spec] == t.name
    for layout in (continuous.CONFIG, dynamic.MODEL, dynamic.TIMING, multibin.CONFIG):
        i = layout.floats.index(cost.FIELDS[0])
        assert layout.floats[i:i + cost.N] == cost.FIELDS, layout.name
    m = mb.IterationModel(setup=1.0, step=2.0, prefill_per_token=3.0, per_sequence=4.0, per_context_token=5.0,
                          per_expert=6.0, experts=8)
    assert m.coefficients().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0][:cost.N] + [0.0] * (cost.N - 6)
    assert list(m.cost_fields()) == list(cost.FIELDS)


finite = st.floats(0.0, 1e6, allow_nan=False)


@given(c=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=cost.N, max_size=cost.N),
       x=st.lists(finite, min_size=cost.N, max_size=cost.N))
def test_the_compiled_cost_is_the_numpy_cost_and_the_design_row(c, x):
    """The compiled step, its plain-Python twin and the design matrix's row
    times the coefficients: the same number (the first two bit for bit)."""
    c = np.array(c)
    compiled = _call(c, *x)
    assert compiled == cost.cost_py(c, *x)
    row = cost.design({f: np.array([v]) for f, v in zip(cost.FEATURES, x)})
    assert (row @ c)[0] == pytest.approx(compiled, rel=1e-12, abs=1e-300)


def _call(c, *x):
    from numba import njit

    global _COMPILED
    if _COMPILED is None:
        @njit
        def call(c, *x):
            return cost.cost(c, *x)
        _COMPILED = call
    return _COMPILED(c, *x)


_COMPILED = None


def test_a_term_at_zero_adds_exactly_nothing():
    """A coefficient of 0 leaves the sum bit for bit (so a new term, 0 by
    default, keeps earlier numbers)."""
    c = np.array([0.0, 0.01, 1e-4, 1e-3, 1e-7, 0.0][:cost.N] + [0.0] * (cost.N - 6))
    base = 0.01 + 1e-4 * 300.0 + 1e-3 * 7.0 + 1e-7 * 2100.0
    assert cost.cost_py(c, 0.0, 1.0, 300.0, 7.0, 2100.0, *[123.0] * (cost.N - 5)) == base


def test_design_names_the_features_it_needs():
    with pytest.raises(ValueError, match="the features are"):
        cost.design({"iterations": np.ones(2)})


@given(cuts=st.lists(st.integers(1, 4096), min_size=1, max_size=8))
def test_a_prompts_chunks_add_up_to_its_square(cuts):
    """``prefill_square(a, c)``, tokens a to a + c of a prompt: a prompt cut
    into any chunks adds up to P^2 exactly (whole tokens)."""
    a, total = 0.0, 0.0
    for c in cuts:
        total += cost.prefill_square.py_func(a, float(c))
        a += c
    assert total == a * a
