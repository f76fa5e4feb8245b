"""Batch formation's codes (mbbatch._kernels.formation): one per rule, and
Algorithm 5's selections by the parameter table's names."""

from mbbatch import registry
from mbbatch._kernels import formation
from mbbatch.params import PARAMS


def test_the_rules_have_distinct_codes():
    codes = [getattr(formation, n) for n in formation.__all__ if n.startswith("FORM_")]
    assert len(codes) == len(set(codes))


def test_the_selections_are_the_parameter_tables():
    assert tuple(formation.SELECTIONS) == PARAMS["selection"].choices
    assert formation.SELECTIONS["round_robin"] == formation.SEL_ROUND_ROBIN


def test_every_token_policy_names_a_rule():
    codes = {getattr(formation, n) for n in formation.__all__ if n.startswith("FORM_")}
    for cls in registry.POLICIES.values():
        if cls.planner == "tokens":
            assert cls.from_spec is not None and hasattr(cls, "event_config")
    import mbbatch as mb
    for pol in (mb.StaticBatching(4), mb.DynamicBatching(), mb.MultiBinDynamic(),
                mb.MultiBin(bins=2, batch_size=4).engine_form()):
        assert pol.event_config().formation in codes
