"""The controllers' configuration (mbbatch.controller): the memory's token
capacity and the SLA controller's settings (the controllers themselves are
tested in test_kernels_controller.py)."""

import warnings

import pytest

import mbbatch as mb
from mbbatch.params import default

from .helpers import ROOT, cli_run

try:
    import tomllib
except ModuleNotFoundError:      # (Python 3.10)
    import tomli as tomllib


def test_token_capacity():
    assert mb.Memory().eta == (80.0 - 8.0) / 4e-4
    assert mb.Memory(m_max_gb=10.0, m_model_gb=2.0, kv_mem_per_token_gb=0.5).eta == 16.0
    with pytest.raises(ValueError, match="m_model_gb must be less than m_max_gb"):
        mb.Memory(m_max_gb=8.0, m_model_gb=8.0)


def test_sla_controller_defaults_are_the_tables():
    c = mb.SLAController()
    for field, key in (("d_sla", "d_sla"), ("eps_d", "eps_d"), ("alpha", "SLAController.alpha"),
                       ("variant", "controller")):
        assert getattr(c, field) == default(key)
    with pytest.raises(ValueError, match="b_min"):
        mb.SLAController(b_min=10, b_max=5)


# --- D_SLA in the wrong unit -------------------------------------------------------------------


def test_a_d_sla_in_milliseconds_is_warned_about():
    """Regression: ``--d-sla 20`` (meaning 20 ms) ran with D_SLA = 20 s per
    token, a bound no batch reaches, without a word.  Above
    D_SLA_LIKELY_MAX (1 s/token) the controller warns, naming d_sla, its
    unit and the value meant; at or below it, silently as before."""
    from mbbatch.controller import D_SLA_LIKELY_MAX

    with pytest.warns(UserWarning, match=r"^d_sla is in s/token; got 20 s/token, .* milliseconds .*d_sla = 0\.02"):
        mb.SLAController(d_sla=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for d in (default("d_sla"), 0.05, D_SLA_LIKELY_MAX):
            assert mb.SLAController(d_sla=d).d_sla == d


def test_every_policy_taking_d_sla_warns_of_milliseconds():
    """The policies that measure or control D_SLA take it through an
    SLAController, so each warns (LAPS's decode stage's too)."""
    ctl = dict(d_sla=20.0)
    for make in (lambda: mb.StaticBatching(8, sla=mb.SLAController(**ctl)),
                 lambda: mb.DynamicBatching(controller=mb.SLAController(**ctl)),
                 lambda: mb.registry.build("laps", {**_laps_cell(), "decode": "dynamic", "decode_d_sla": 20.0})):
        with pytest.warns(UserWarning, match="d_sla is in s/token"):
            make()


def _laps_cell() -> dict:
    from mbbatch.sweeps.spec import SPEC_PARAMS

    return {name: sp.default for name, sp in SPEC_PARAMS.items() if "laps" in sp.kinds}


def test_the_cli_warns_of_a_d_sla_in_milliseconds():
    """``mbbatch simulate --d-sla 20``: the run goes on (20 s/token is a
    valid bound), with the warning."""
    with pytest.warns(UserWarning, match="d_sla is in s/token; got 20 s/token"):
        r = cli_run("simulate", "--policy", "dynamic", "--service-model", "decode", "--rate", "2", "--n", "200",
                    "--reps", "1", "--d-sla", "20")
    assert r.returncode == 0, r.stderr


def test_no_shipped_sweep_gives_a_d_sla_in_milliseconds():
    """Every D_SLA of the shipped specs (d_sla, decode_d_sla: in [params],
    [grid] and the policy variants' tables) is in s/token, so none warns."""
    from mbbatch.controller import D_SLA_LIKELY_MAX

    def values(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("d_sla", "decode_d_sla"):
                    yield from (v if isinstance(v, list) else [v])
                else:
                    yield from values(v)

    specs = sorted((ROOT / "sweeps").glob("*.toml"))
    found = {p.name: list(values(tomllib.loads(p.read_text()))) for p in specs}
    assert sum(map(len, found.values())) >= 10          # (the specs still name D_SLA this way)
    assert all(0 < d <= D_SLA_LIKELY_MAX for ds in found.values() for d in ds), found
