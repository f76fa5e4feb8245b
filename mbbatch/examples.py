"""Small worked examples, stored as Datasets for the figures."""

from __future__ import annotations

import numpy as np

from .arrivals import Saturated
from .policies.multibin import MultiBin
from .simulation import simulate

__all__ = ["figure_1b", "engine_event"]

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
    data = {f: (("case", "request"), np.array(v),
                {"units": units[f], "long_name": f"batch {f}" if f in ("start",) else f})
            for f, v in fields.items()}
    data["service"] = (("request",), service, {"units": "s", "long_name": "service time"})
    return xr.Dataset(data, coords={"case": cases, "request": np.arange(service.size)}, attrs=attrs)


#: The engine-event example, on the settings of sweeps/autellix.toml: 8
#: engines (dynamic batching each, D_SLA 7.5 ms, B_max 64; prefill 0.1 ms a
#: token) serve 4-call programs at 16 calls/s; engine 0 leaves at 100 s and
#: returns at 200 s.
ENGINE_EVENT = {"engines": 8, "rate": 16.0, "n": 4_800, "remove": 100.0, "back": 200.0, "bin": 10.0, "seeds": 8,
                "calls": 4, "think_time": 1.0, "threshold": 1024, "d_sla": 0.0075, "b_max": 64,
                "prefill_per_token": 1e-4}


def engine_event():
    """An engine removed and returned mid-run, under each router: calls'
    mean latency and p99 time to first token by arrival time (10 s windows,
    pooled over 8 seeds).  Returns an xarray Dataset (dims router, time)."""
    import scipy.stats as st
    import xarray as xr

    from .arrivals import Poisson
    from .controller import SLAController
    from .policies.cluster import Cluster, EngineEvent, Programs
    from .policies.dynamic import DynamicBatching
    from .service_models import DecodeModel
    from .workload import Workload

    p = ENGINE_EVENT
    wl = Workload(prompt=st.lognorm(1.0, scale=300.0), output=st.lognorm(0.8, scale=64.0))
    events = [EngineEvent(p["remove"], 0, "remove"), EngineEvent(p["back"], 0, "add")]
    routers = ["autellix", "least_used", "round_robin"]
    end = p["n"] / p["rate"]
    edges = np.arange(0.0, end + p["bin"], p["bin"])
    mid = 0.5 * (edges[:-1] + edges[1:])
    lat = np.full((len(routers), mid.size), np.nan)
    ttft = np.full_like(lat, np.nan)
    rerouted = []
    for j, router in enumerate(routers):
        engine = DynamicBatching(controller=SLAController(d_sla=p["d_sla"], b_max=p["b_max"]))
        cluster = Cluster(engine, engines=p["engines"], router=router, threshold=p["threshold"],
                          programs=Programs(calls=p["calls"], think_time=p["think_time"]), events=events)
        arrival, latency, first = [], [], []
        moved = 0
        for seed in range(p["seeds"]):
            res = simulate(cluster, Poisson(p["rate"]), workload=wl, n=p["n"], seed=seed, keep_requests=True,
                           service_model=DecodeModel(prefill_per_token=p["prefill_per_token"]))
            arrival.append(res.requests.arrival)
            latency.append(res.requests.latency)
            first.append(res.requests.ttft)
            moved += res.rerouted
        arrival, latency, first = np.concatenate(arrival), np.concatenate(latency), np.concatenate(first)
        which = np.digitize(arrival, edges) - 1
        for b in range(mid.size):
            sel = which == b
            if sel.any():
                lat[j, b] = latency[sel].mean()
                ttft[j, b] = np.quantile(first[sel], 0.99)
        rerouted.append(moved / p["seeds"])
    return xr.Dataset(
        {"mean_latency": (("router", "time"), lat, {"units": "s", "long_name": "mean latency of the calls "
                                                     "arriving in the window"}),
         "ttft_p99": (("router", "time"), ttft, {"units": "s", "long_name": "p99 time to first token of the "
                                                 "calls arriving in the window"}),
         "rerouted": (("router",), np.array(rerouted), {"units": "requests", "long_name": "queued calls routed "
                                                         "again at the removal, per run"})},
        coords={"router": routers, "time": mid},
        attrs={**{k: v for k, v in p.items()}, "description": "an engine removed and returned mid-run"})
