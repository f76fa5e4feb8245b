"""The sweep Dataset's schema: variables, their dimensions, units and text.

One dimension per grid axis (named like the parameter; ``policy`` holds
variant names) plus ``rep``; every dimension has a coordinate.  The simulated
variables come from the metric table (:mod:`mbbatch.metrics`): each metric
that applies to a policy of the spec, per replication, and for every real
one its per-point mean and t-interval at the spec's confidence.  ``theory_*`` and
``capacity`` are the multi-bin paper's closed forms on the same coordinates.
A cell whose policy a metric does not apply to holds the fill value (NaN, -1
or False).  A spec of request classes ([classes.NAME] tables) adds the
``request_class`` dimension and each class's metrics on it (:data:`PER_CLASS`).
"""

from __future__ import annotations

import json
import math

import numpy as np

from ..metrics import METRICS
from ..metrics import PER_CLASS as CLASS_ROWS
from .spec import SPEC_PARAMS, SweepSpec, _values

__all__ = ["CAPACITY", "CAPACITY_THEORY", "variables", "rep_vars", "aggregates", "time_grid", "template",
           "coord_values", "THEORY", "PER_CLASS", "CLASS_DIM", "class_vars", "class_aggregates", "class_dims",
           "TIME_SERIES", "LAPS_TIME_SERIES", "time_series", "TIME_POINTS", "FILL", "spec_attrs"]

#: the closed forms of the multi-bin paper: name -> (units, description)
THEORY = {
    "theory_mean_batch_service": ("s", "E[t_service]: Theorem 4.2 eq. (20) for uniform equal-mass bins, "
                                       "exact quadrature (batch_service_time) otherwise"),
    "theory_service_rate": ("requests/s",
                            "saturated throughput servers x B / E[t_service] (Proposition 4.1, Theorem 4.2)"),
    "capacity": ("requests/s", "c_max x servers = servers x B / mean service time of one request (Remark 4.2)"),
    "theory_throughput_bound": ("requests/s", "Corollary A.1.1 (corrected) lower bound servers x B mu / L_k; "
                                              "exponential service at Lemma A.1 edges only"),
    "theory_throughput": ("requests/s",
                          "predicted throughput: min(rate, theory_service_rate); the service rate when saturated"),
    "theory_latency": ("s", "Lemma 5.1 eq. (7): E[t_service] + (B-1) k / (2 rate); exact with infinitely many "
                            "servers, a lower bound otherwise; NaN when saturated"),
}
#: time series of the token-level policies' load-step experiments: name -> (units, description)
TIME_SERIES = {
    "ts_b_target": ("requests", "b_target at the last batch start before each time"),
    "ts_b_low": ("requests", "the controller's b_low"),
    "ts_b_high": ("requests", "the controller's b_high"),
    "ts_tau_avg": ("s/token", "the controller's EMA of the decode time per token"),
    "ts_queue": ("requests", "requests waiting, all bins"),
}
#: time series of LAPS's load-step experiments: its router's dynamic allocation
LAPS_TIME_SERIES = {
    "ts_short_instances": ("instances", "prefill instances in LAPS's short group (the router's dynamic allocation)"),
    "ts_long_instances": ("instances", "prefill instances in LAPS's long group"),
}
#: samples of the load-step time series over [0, 2 t_down - t_up]
TIME_POINTS = 241
#: fill value of a variable not (yet) computed, by dtype
FILL = {"f8": np.nan, "i8": -1, "bool": False}


def _metrics(spec: SweepSpec):
    kinds = set(spec.kinds)
    return [m for m in METRICS.values() if m.per_rep and kinds & m.kinds]


#: a capacity sweep's variables (per grid point): name -> (dtype, units, description)
CAPACITY = {
    "sim_capacity": ("f8", "requests/s", "the largest arrival rate meeting the criterion (mb.find_capacity): "
                                         "the mean of its independent searches' answers"),
    "sim_capacity_ci_low": ("f8", "requests/s", "lower end of the capacity's t-interval over the searches "
                                                "([capacity] confidence; NaN with one search)"),
    "sim_capacity_ci_high": ("f8", "requests/s", "upper end of the capacity's t-interval over the searches"),
    "sim_capacity_bracket_low": ("f8", "requests/s", "lower end of the first search's final bracket (the "
                                                     "highest rate that passed; not an interval of the capacity)"),
    "sim_capacity_bracket_high": ("f8", "requests/s", "upper end of the first search's final bracket (the "
                                                      "lowest rate that failed)"),
    "sim_saturated_throughput": ("f8", "requests/s", "the policy's saturated throughput (the search's "
                                                     "upper bound), the searches' mean"),
    "capacity_probes": ("i8", "probes", "rates probed, every search"),
    "capacity_requests": ("i8", "requests", "requests simulated by the searches, saturated runs included"),
    "capacity_resolved": ("bool", "1", "every end of every search's final bracket is a verdict (else an end "
                                       "moved to a probe undecided at the cap)"),
}
#: the closed forms beside a capacity search (the multi-bin paper's model)
CAPACITY_THEORY = ("theory_mean_batch_service", "theory_service_rate", "capacity")

#: the dimension of a mixture's classes (named as the requests' column, ``keep_requests``'s ``request_class``;
#: not ``class``, a Python keyword that ``ds.sel(class=...)`` could not take); its coordinate holds their names
CLASS_DIM = "request_class"
#: a mixture's metrics per class (:attr:`SimulationResult.classes`), each stored per replication on the
#: request_class axis (``class_completed``, ``sim_class_<metric>``) and every real one with its mean and
#: t-interval over the replications: metric -> (dtype, units, description), from the metric table
#: (:data:`mbbatch.metrics.PER_CLASS`)
PER_CLASS = {m.name: (m.dtype, m.units, m.description) for m in CLASS_ROWS.values()}


def class_vars(names) -> dict:
    """The per-replication variables of a mixture's classes ``names`` (none
    without classes): name -> (metric, dtype, units, description)."""
    if not names:
        return {}
    return {(f"sim_class_{m}" if dtype == "f8" else f"class_{m}"): (m, dtype, units, desc)
            for m, (dtype, units, desc) in PER_CLASS.items()}


def class_aggregates(spec: SweepSpec) -> dict:
    """A mixture's per-class variable -> (its mean, CI low, CI high variables), for its real ones."""
    return {var: (f"{var}_mean", f"{var}_ci_low", f"{var}_ci_high")
            for var, (_, dtype, _, _) in class_vars(_class_names(spec)).items() if dtype == "f8"}


def _class_names(spec: SweepSpec) -> list:
    """The classes whose metrics a sweep stores: a sweep's at fixed rates (a capacity search stores none)."""
    return list(spec.classes or ()) if spec.capacity is None else []


def class_dims(spec: SweepSpec) -> set:
    """The variables on the ``request_class`` dimension (after the grid's and ``rep``)."""
    return set(class_vars(_class_names(spec))) | {v for vs in class_aggregates(spec).values() for v in vs}


def variables(spec: SweepSpec) -> dict:
    """The variables of a sweep's Dataset (without the time series):
    name -> (per rep?, dtype, units, description)."""
    out = {}
    if spec.capacity is not None:
        for name, (dtype, units, desc) in CAPACITY.items():
            out[name] = (False, dtype, units, desc)
        if "multibin" in spec.kinds:
            for name in CAPACITY_THEORY:
                out[name] = (False, "f8", *THEORY[name])
        out["done"] = (False, "bool", "1", "this grid point's search is computed and stored")
        return out
    for m in _metrics(spec):
        out[m.var] = (True, m.dtype, m.units, m.description)
    level = f"{100 * spec.confidence:g}%"
    for m in _metrics(spec):
        if m.aggregated:
            mean_v, lo_v, hi_v = m.aggregates
            out[mean_v] = (False, "f8", m.units, f"mean of {m.var} over reps")
            for v, word in ((lo_v, "lower"), (hi_v, "upper")):
                out[v] = (False, "f8", m.units, f"{level} t-interval of {mean_v} over reps, {word} end (NaN "
                                                 "with fewer than two finite reps)")
    for var, (_, dtype, units, desc) in class_vars(_class_names(spec)).items():
        out[var] = (True, dtype, units, desc)
    for var, (mean_v, lo_v, hi_v) in class_aggregates(spec).items():
        out[mean_v] = (False, "f8", out[var][2], f"mean of {var} over reps")
        for v, word in ((lo_v, "lower"), (hi_v, "upper")):
            out[v] = (False, "f8", out[var][2], f"{level} t-interval of {mean_v} over reps, {word} end (NaN "
                                                "with fewer than two finite reps)")
    if "multibin" in spec.kinds:
        for name, (units, desc) in THEORY.items():
            out[name] = (False, "f8", units, desc)
    why = "rate >= theory_service_rate, or " if "multibin" in spec.kinds else ""
    out["unstable"] = (False, "bool", "1", f"{why}the backlog grew in some rep: no steady state")
    out["done"] = (False, "bool", "1", "every rep of this grid point is computed and stored")
    return out


def rep_vars(spec: SweepSpec) -> list:
    return [v for v, d in variables(spec).items() if d[0]]


def aggregates(spec: SweepSpec) -> dict:
    """Per-rep variable -> (its mean variable, CI low variable, CI high variable)."""
    return {m.var: m.aggregates for m in _metrics(spec) if m.aggregated}


def time_series(kinds) -> dict:
    """The time series a load-step store holds for policies of ``kinds``
    (LAPS runs alone in a spec): name -> (units, description)."""
    return LAPS_TIME_SERIES if "laps" in kinds else TIME_SERIES


def time_grid(spec: SweepSpec):
    """Times (s) the load-step time series are sampled at, or None."""
    if spec.arrivals != "step":
        return None
    up, down = max(_values(spec, "t_up")), max(_values(spec, "t_down"))
    return np.linspace(0.0, 2.0 * down - up, TIME_POINTS)


def coord_values(name: str, values) -> np.ndarray:
    """A grid axis's values as stored in its coordinate (and the classes' names)."""
    if name in ("policy", CLASS_DIM):
        return np.array(values, dtype=object)
    p = SPEC_PARAMS[name].table
    if p.kind == "servers":
        return np.array([float(v) for v in values])
    if p.kind == "count":
        return np.array(values, dtype=np.int64)
    if p.kind == "choice":
        return np.array(values, dtype=object)  # variable-length strings: a zarr v3 data type
    if p.kind == "flag":
        return np.array(values, dtype=bool)
    return np.array(values, dtype=np.float64)


def _coord(spec: SweepSpec, name: str, values) -> tuple:
    data = coord_values(name, values)
    if name == "policy":
        attrs = {"units": "", "long_name": "policy", "description": "policy variant (settings in the attrs "
                 "policy_<name>)"}
    else:
        p = SPEC_PARAMS[name].table
        attrs = {"units": p.units, "long_name": name.replace("_", " "), "description": p.description}
    return (name,), data, attrs


def template(spec: SweepSpec, attrs: dict):
    """The Dataset of a sweep before any cell is computed: simulated variables
    at their fill values (NaN, -1, False), nothing done."""
    import xarray as xr

    dims = list(spec.axes)
    shape = spec.shape
    coords = {nm: _coord(spec, nm, vals) for nm, vals in spec.axes.items()}
    if spec.capacity is None:
        coords["rep"] = (("rep",), np.arange(spec.reps), {"units": "1", "long_name": "replication",
                                                           "description": "independent replication index"})
    names = _class_names(spec)
    if names:
        coords[CLASS_DIM] = ((CLASS_DIM,), coord_values(CLASS_DIM, names),
                             {"units": "", "long_name": "request class", "description": "a class of the requests "
                              "([classes.NAME]: its share and keys in the attrs classes)"})
    by_class = class_dims(spec)
    data = {}
    for name, (per_rep, dtype, units, desc) in variables(spec).items():
        vdims = dims + ["rep"] if per_rep else dims
        vshape = shape + (spec.reps,) if per_rep else shape
        if name in by_class:
            vdims, vshape = vdims + [CLASS_DIM], vshape + (len(names),)
        arr = np.full(vshape, FILL[dtype], dtype=dtype)
        data[name] = (vdims, arr, {"units": units, "long_name": name.replace("_", " "), "description": desc})
    grid = time_grid(spec)
    if grid is not None:
        coords["time"] = (("time",), grid, {"units": "s", "long_name": "time",
                                            "description": "time since the first arrival's clock start"})
        for name, (units, desc) in time_series(spec.kinds).items():
            data[name] = (dims + ["rep", "time"], np.full(shape + (spec.reps, grid.size), np.nan),
                          {"units": units, "long_name": name.replace("_", " "), "description": desc})
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _enc(v):
    return "inf" if v == math.inf else v


def spec_attrs(spec: SweepSpec) -> dict:
    """The spec's settings as Dataset attrs: every parameter that has one
    value in every cell and is not an axis (defaults included; inf as the
    string "inf"), the policy kind (a variant's kind, or "mixed"), each
    variant's settings as JSON under ``policy_<name>``, and the classes'
    tables as JSON under ``classes``."""
    seen: dict = {}
    cells = [params for _, params in spec.points()]
    for params in cells:
        for k, v in params.items():
            seen.setdefault(k, set()).add(json.dumps(_enc(v)))
    out = {k: _enc(cells[0][k]) for k, vs in seen.items()
           if len(vs) == 1 and k not in spec.axes and k not in ("kind", "policy", "trace", "classes")
           and all(k in c for c in cells) and cells[0][k] is not None}
    out["policy"] = spec.policy
    if spec.classes is not None:
        # (each class as the spec gives it: its share and its own keys; the others are the cells')
        out["classes"] = json.dumps({nm: {k: _enc(v) for k, v in c.items()} for nm, c in spec.classes.items()},
                                    sort_keys=True)
    if not spec.single:
        for name, settings in spec.policies.items():
            out[f"policy_{name}"] = json.dumps({k: _enc(v) for k, v in settings.items()}, sort_keys=True)
    return out

