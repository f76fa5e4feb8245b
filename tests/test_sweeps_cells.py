"""One grid point (mbbatch.sweeps.cells): its seed depends on its workload
only, and its cells equal reference values recorded before the sweeps were
restructured."""

import math

from mbbatch.sweeps.cells import cell_seed


def test_cell_seed_depends_on_workload_only():
    base = {"bins": 1, "batch_size": 8, "rate": 2.0, "l_min": 1.0, "l_max": 20.0, "n": 100, "servers": 1}
    s = cell_seed(7, base, 0)
    assert cell_seed(7, {**base, "bins": 4, "servers": math.inf}, 0).spawn_key == s.spawn_key
    assert cell_seed(7, {**base, "rate": 3.0}, 0).spawn_key != s.spawn_key
    assert cell_seed(7, base, 1).spawn_key != s.spawn_key
    assert cell_seed(8, base, 0).entropy != s.entropy


# --- reference values --------------------------------------------------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mbbatch.sweeps.cells import run_point  # noqa: E402
from mbbatch.sweeps.schema import time_grid  # noqa: E402
from mbbatch.sweeps.spec import load_spec  # noqa: E402

from .helpers import ROOT  # noqa: E402

#: cells of every spec in sweeps/, recorded before the sweeps were
#: restructured (and before their specs were regrouped): spec, policy kind,
#: parameters, seed, and every per-rep metric as a hex float or an int
REFERENCE = json.loads((Path(__file__).parent / "data" / "reference_cells.json").read_text())


def _find(cell):
    """The spec of sweeps/ and its grid point with this cell's parameters."""
    want = {k: (math.inf if v == "inf" else v) for k, v in cell["params"].items()}
    for path in sorted((ROOT / "sweeps").glob("*.toml")):
        spec = load_spec(path)
        if spec.arrivals != cell["arrivals"] or spec.service != cell["service"] or spec.reps != cell["reps"]:
            continue
        for _, params in spec.points():
            got = {k: v for k, v in params.items() if k not in ("kind", "policy")}
            if params["kind"] == cell["policy"] and got == want and spec.seed_of(params) == cell["seed"]:
                return spec, params
    return None, None


@pytest.mark.parametrize("cell", REFERENCE, ids=[f"{c['spec']}-{i}" for i, c in enumerate(REFERENCE)])
def test_cells_equal_their_reference_values_bit_for_bit(cell):
    spec, params = _find(cell)
    assert spec is not None, f"no spec in sweeps/ has the cell {cell['params']} of {cell['spec']} any more"
    sim = run_point(spec.arrivals, spec.service, params, spec.seed_of(params), spec.reps, time_grid(spec))
    for var, ref in cell["metrics"].items():
        got = sim[var]
        if isinstance(ref[0], str):
            assert [float(x).hex() for x in got] == ref, var
        else:
            np.testing.assert_array_equal(got, ref, err_msg=var)
