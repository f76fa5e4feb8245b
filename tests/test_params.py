"""The parameter table (mbbatch.params): complete, consistent, and what the
constructors, the spec checker and the command line read."""

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mbbatch as mb
from mbbatch._validation import check
from mbbatch.params import PARAMS, REQUIRED, SYMBOLS
from mbbatch.sweeps.spec import SPEC_PARAMS

from .strategies import outside, valid

KINDS = {"real", "count", "servers", "flag", "choice", "reals", "counts"}


@pytest.mark.parametrize("key", sorted(PARAMS))
def test_every_parameter_is_declared_whole(key):
    p = PARAMS[key]
    assert p.name == key and p.kind in KINDS and p.description
    if p.kind in ("real", "count", "servers", "reals", "counts"):
        assert p.domain is not None, key
    if p.kind == "choice":
        assert p.choices and all(isinstance(c, str) for c in p.choices)
    if p.default is not REQUIRED and p.default is not None and p.kind not in ("reals", "counts"):
        assert check(key, p.default) == p.default        # the default lies in the domain


@pytest.mark.parametrize("key", sorted(k for k, p in PARAMS.items() if p.kind in ("real", "count", "choice", "flag")))
@given(data=st.data())
def test_check_accepts_the_domain_and_refuses_what_lies_outside(key, data):
    value = data.draw(valid(key))
    assert check(key, value) == value
    bad = data.draw(outside(key) | st.nothing()) if PARAMS[key].kind in ("real", "count") else None
    if bad is not None:
        with pytest.raises(ValueError, match=key.rsplit(".", 1)[-1]):
            check(key, bad)


CLASSES = [mb.Poisson, mb.Gamma, mb.OnOff, mb.Replay, mb.MultiBin, mb.StaticBatching, mb.DynamicBatching,
           mb.MultiBinDynamic, mb.Workload, mb.MaxModel, mb.LinearModel, mb.DecodeModel, mb.CalibratedModel,
           mb.Memory, mb.SLAController, mb.LogNormalError, mb.BinConfusion, mb.SystemPrompts]
#: fields that are objects or arrays checked by their own classes
OBJECT_FIELDS = {"sla", "memory", "controller", "prompt", "output", "edges", "bin_b_max", "predictor", "times",
                 "system_prompts"}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_constructor_defaults_are_the_tables(cls):
    """Every default of a constructor is the table's, for its key."""
    for f in dataclasses.fields(cls):
        if not f.init or f.name in OBJECT_FIELDS or f.default is dataclasses.MISSING:
            continue
        keys = [k for k in (f"{cls.__name__}.{f.name}", f.name) if k in PARAMS]
        if cls is mb.SLAController and f.name == "variant":
            keys = ["controller"]
        if cls is mb.MultiBinDynamic and f.name == "bins":
            keys = ["MultiBinDynamic.bins"]
        assert keys, f"{cls.__name__}.{f.name} is not in the parameter table"
        assert PARAMS[keys[0]].default == f.default or (
            isinstance(f.default, float) and math.isinf(f.default) and PARAMS[keys[0]].default == math.inf), \
            (cls.__name__, f.name)


def test_every_spec_key_reads_the_table():
    for name, sp in SPEC_PARAMS.items():
        assert sp.table is PARAMS[sp.key or name]


def test_the_papers_symbols_name_table_entries():
    assert set(SYMBOLS) == {"B", "k", "lam"}
    for sym, key in SYMBOLS.items():
        assert key in PARAMS and PARAMS[key].domain is not None


def test_cli_theory_flags_come_from_the_table():
    from mbbatch.cli import _parser

    sub = _parser()._subparsers._group_actions[0].choices["theory"]._subparsers._group_actions[0].choices
    opts = {o for a in sub["throughput"]._actions for o in a.option_strings}
    assert {"--batch-size", "--B", "--bins", "--k", "--l-min", "--l-max"} <= opts
    help_ = {a.dest: a.help for a in sub["throughput"]._actions}
    assert PARAMS["batch_size"].description in help_["B"] and "[1, inf)" in help_["B"]
