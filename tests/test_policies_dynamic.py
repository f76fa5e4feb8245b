"""Dynamic and multi-bin dynamic batching (mbbatch.policies.dynamic)."""

import numpy as np
import pytest

import mbbatch as mb
from mbbatch._kernels.formation import FORM_DYNAMIC, FORM_MULTIBIN_DYNAMIC, SEL_LONGEST_QUEUE

CELL = {"d_sla": 7.5e-3, "eps_d": 5e-5, "b_min": 1, "b_max": 32, "controller": "spec", "memory": "l0",
        "eta": 2000.0, "eps_m": 0.05}


def test_multibin_dynamic_needs_a_warmup_of_at_least_its_bins():
    with pytest.raises(ValueError, match="warmup must be at least bins"):
        mb.MultiBinDynamic(bins=4, warmup=2)
    with pytest.raises(ValueError, match="bin_b_max must have bins = 2 entries"):
        mb.MultiBinDynamic(bins=2, bin_b_max=[4])


def test_they_run_as_their_formation_rules_say():
    ev = mb.DynamicBatching(pin=8, max_candidates=16).event_config()
    assert (ev.formation, ev.bins, ev.pin, ev.max_candidates, ev.controlled) == (FORM_DYNAMIC, 1, 8, 16, True)
    ev = mb.MultiBinDynamic(bins=3, warmup=40, selection="longest_queue", bin_b_max=[4, 8, 16]).event_config()
    assert (ev.formation, ev.bins, ev.selection, ev.warmup, ev.preset) == (FORM_MULTIBIN_DYNAMIC, 3,
                                                                          SEL_LONGEST_QUEUE, 40, "")
    assert ev.bin_b_max.tolist() == [4.0, 8.0, 16.0]
    ev = mb.MultiBinDynamic(bins=3, bin_edges="presample").event_config()
    assert (ev.warmup, ev.preset) == (0, "presample")


def test_a_cells_policies():
    dyn = mb.DynamicBatching.from_spec(CELL, None)
    assert dyn.controller.b_max == 32 and dyn.memory.eta == 2000.0
    mbd = mb.MultiBinDynamic.from_spec({**CELL, "bins": 2, "selection": "round_robin", "warmup": 100,
                                        "bin_edges": "optimal", "predictor_sigma": 0.3, "predictor_p": 1.0}, None)
    assert (mbd.bins, mbd.bin_edges, mbd.predictor) == (2, "optimal", mb.LogNormalError(0.3))
    assert np.isclose(mbd.memory.eta, 2000.0)
