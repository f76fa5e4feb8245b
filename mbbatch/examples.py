"""Small worked examples, stored as Datasets for the figures."""

from __future__ import annotations

import numpy as np

from .arrivals import Saturated
from .policies import MultiBin
from .simulation import simulate

__all__ = ["figure_1b"]

#: The paper's Figure 1b: four requests arrive together with service times
#: 1, 5, 2 and 6 s; batches of B = 2.
FIGURE_1B_SERVICE = (1.0, 5.0, 2.0, 6.0)
FIGURE_1B_CASES = {"one_bin": (1.0, 6.0), "two_bins": (1.0, 3.0, 6.0)}


def figure_1b():
    """The Figure 1b example, simulated: one bin takes 11 s, bins [1, 3) and
    [3, 6] take 8 s.  Returns an xarray Dataset (dims case, request) with each
    request's bin, batch, batch start and completion times."""
    import xarray as xr

    service = np.array(FIGURE_1B_SERVICE)
    cases = list(FIGURE_1B_CASES)
    fields = {f: [] for f in ("bin", "batch", "start", "completion")}
    attrs = {"batch_size": 2, "description": "the multi-bin paper's Figure 1b example"}
    for case in cases:
        edges = FIGURE_1B_CASES[case]
        res = simulate(MultiBin(bins=len(edges) - 1, batch_size=2, edges=edges), arrivals=Saturated(),
                       service=service, keep_requests=True)
        req = res.requests
        batch_service = np.array([service[req.batch == b].max() for b in req.batch])
        fields["bin"].append(req.bin)
        fields["batch"].append(req.batch)
        fields["completion"].append(req.completion)
        fields["start"].append(req.completion - batch_service)
        attrs[f"makespan_{case}"] = float(res.span)
        attrs[f"edges_{case}"] = list(edges)
    units = {"bin": "1", "batch": "1", "start": "s", "completion": "s"}
    data = {f: (("case", "request"), np.array(v), {"units": units[f], "long_name": f"batch {f}" if f in ("start",) else f})
            for f, v in fields.items()}
    data["service"] = (("request",), service, {"units": "s", "long_name": "service time"})
    return xr.Dataset(data, coords={"case": cases, "request": np.arange(service.size)}, attrs=attrs)
