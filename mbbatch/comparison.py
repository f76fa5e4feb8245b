"""Paired comparison of policies: every policy on the same requests, and
each one's difference and ratio to a baseline with a confidence interval.

:func:`compare` simulates every policy on the same replications: replication
``r`` of every policy draws its arrivals, lengths and predictions from one
seed, ``SeedSequence(seed, spawn_key=(r,))`` (common random numbers), so
that the policies' results differ only by what the policies do, and a
difference is estimated from paired replications, whose variance is that of
the difference, not the sum of the two policies' (Law, *Simulation Modeling
and Analysis*, 5th ed., 2015, section 10.2: the paired-t interval).

For every metric and every policy ``p`` against the baseline ``b``, over the
``reps`` replications ``x_p[r]``, ``x_b[r]``:

- the difference ``mean(x_p - x_b)`` and its paired t-interval on
  ``reps - 1`` degrees of freedom;
- the ratio of the means ``R = mean(x_p) / mean(x_b)`` and its interval by
  the delta method, ``R +- t x sd(x_p - R x_b) / (sqrt(reps) x |mean(x_b)|)``
  (Law, section 9.5.2, the ratio estimator; the choice here, where a
  Fieller interval would be exact for normal data, as it is close to the
  delta method's at the sizes an interval is read at);
- a verdict at the interval's level, where the metric has a direction
  (:attr:`mbbatch.metrics.Metric.better`): ``better`` or ``worse`` where the
  difference's interval excludes 0, else ``undecided``.

With ``reps=1`` (one long run of each policy) the mean latency's difference
is estimated by batch means within the run: the runs' contiguous groups of
arrivals (:attr:`~mbbatch.SimulationResult.group_mean_latency`) hold the same
requests in every policy, so the groups' differences are paired the same
way; every other metric then has no interval (NaN), and the result says so.

Two identical policies give a difference of exactly 0 (the same numbers,
replication by replication): the interval is ``[0, 0]``.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import stats
from .stats import VERDICTS, difference_vars, metric_spec, paired_differences, paired_interval
from ._seeding import as_seed_sequence, entropy_str
from ._validation import check_count, check_flag, check_scalar_real
from .metrics import METRICS, applicable
from .params import Domain
from .registry import kind_of
from .results import UnstableWarning
from .simulation import check_simulation, simulate

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["compare", "Comparison", "differences_table"]

_REPS = Domain(1, 100_000, lo_closed=True, hi_closed=True)
_LEVEL = Domain(0.0, 1.0)


def _named(policies) -> dict:
    """``{name: policy}`` from a dict, or from a list named by each policy's
    repr (its class and settings), numbered where two read the same."""
    if isinstance(policies, dict):
        for name in policies:
            if not isinstance(name, str) or not name:
                raise TypeError(f"policies: each name must be a non-empty string; got {name!r}")
        named = dict(policies)
    elif isinstance(policies, (list, tuple)):
        named = {}
        for p in policies:
            name = repr(p)
            if name in named:
                k = 2
                while f"{name} #{k}" in named:
                    k += 1
                name = f"{name} #{k}"
            named[name] = p
    else:
        raise TypeError(f"policies must be a dict of name -> policy, or a list of policies; got "
                        f"{type(policies).__name__}")
    if len(named) < 2:
        raise ValueError(f"policies must hold at least 2 policies to compare; got {len(named)}")
    for name, p in named.items():
        try:
            kind_of(p)
        except TypeError as exc:
            raise TypeError(f"policies[{name!r}]: {exc}") from None
    return named


def _metrics(named: dict, metrics) -> list:
    """The metrics to compare: ``metrics`` (names, each real and reported by
    every policy), or every real per-replication metric every policy reports."""
    common = None
    for p in named.values():
        mine = {m for m, spec in applicable(kind_of(p).kind).items() if spec.dtype == "f8" and spec.per_rep}
        common = mine if common is None else common & mine
    if metrics is None:
        return [m for m in METRICS if m in common]
    if isinstance(metrics, str):
        metrics = [metrics]
    elif not isinstance(metrics, (list, tuple)) or not all(isinstance(m, str) for m in metrics):
        raise TypeError(f"metrics must be a metric's name or a list of them; got {metrics!r}")
    metrics = list(metrics)
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    for m in metrics:
        if m not in METRICS:
            raise ValueError(f"metrics: unknown metric {m!r}; the metrics every policy here reports: "
                             f"{', '.join(x for x in METRICS if x in common)}")
        if m not in common:
            raise ValueError(f"metrics: {m!r} is not a real metric every policy here reports per run; choose from "
                             f"{', '.join(x for x in METRICS if x in common)}")
    return list(dict.fromkeys(metrics))


def differences_table(ds: xr.Dataset, diffs: xr.Dataset, baseline: str, metrics, head: str) -> str:
    """A text table of :func:`paired_differences`' ``diffs`` of the runs in
    ``ds``: for each metric, each point of the axes besides ``policy`` and
    ``rep``, and each policy, its mean over the replications, its difference
    and ratio to ``baseline`` with their intervals, and the verdict; ``head``
    its first line."""
    policies = [str(p) for p in ds["policy"].values]
    width = max(len(p) for p in policies)
    lines = [head]
    for m in metrics:
        spec = metric_spec(m)
        lines.append(f"\n{m} ({spec.units}){', ' + spec.better + ' is better' if spec.better else ''}")
        sim = ds[f"sim_{m}"].mean("rep")
        others = [d for d in sim.dims if d != "policy"]
        # (axes of any types: a tenant's name beside a rate)
        points = [dict(zip(others, vals)) for vals in itertools.product(*[sim[d].values for d in others])]
        for point in points:
            indent = "  "
            if point:
                lines.append("  " + ", ".join(f"{d}={v}" for d, v in point.items()))
                indent = "    "
            here, dhere = sim.sel(point), diffs.sel(point)
            for p in policies:
                mean = float(here.sel(policy=p))
                if p == baseline:
                    lines.append(f"{indent}{p:<{width}}  {mean:12.6g}  (baseline)")
                    continue
                row = dhere.sel(policy=p)
                d, dl, dh = (float(row[f"diff_{m}{x}"]) for x in ("", "_ci_low", "_ci_high"))
                r, rl, rh = (float(row[f"ratio_{m}{x}"]) for x in ("", "_ci_low", "_ci_high"))
                lines.append(f"{indent}{p:<{width}}  {mean:12.6g}  diff {d:+.4g} [{dl:+.4g}, {dh:+.4g}]  "
                             f"ratio {r:.4g} [{rl:.4g}, {rh:.4g}]  {VERDICTS[int(row[f'verdict_{m}'])]}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found: the policies' metrics per replication and
    each policy's difference and ratio to the baseline with their intervals.

    Attributes
    ----------
    dataset : xarray.Dataset
        ``sim_<metric>`` (policy, rep): every run's value;
        ``diff_<metric>``, ``diff_<metric>_ci_low``, ``diff_<metric>_ci_high``
        (policy): the mean difference to the baseline and its interval;
        ``ratio_<metric>`` and its ``_ci_low``, ``_ci_high``: the ratio of the
        means; ``verdict_<metric>`` (policy): 1 better, -1 worse, 0 undecided
        (:data:`VERDICTS`), at ``level``; the baseline's row 0 and ratio 1.
        Attributes: ``baseline``, ``level``, ``reps``, ``seed``, ``method``.
    baseline : str
        The baseline's name.
    level : float
        The intervals' confidence level.
    """

    dataset: xr.Dataset
    baseline: str
    level: float

    @property
    def policies(self) -> list:
        """The policies' names, the baseline among them, in the order given."""
        return [str(p) for p in self.dataset["policy"].values]

    @property
    def metrics(self) -> list:
        """The metrics compared."""
        return [str(v)[len("diff_"):] for v in self.dataset.data_vars
                if v.startswith("diff_") and not v.endswith(("_ci_low", "_ci_high"))]

    def diff(self, policy: str, metric: str) -> tuple:
        """``(difference, low, high)``: policy's mean minus the baseline's, and its interval."""
        return self._row("diff", policy, metric)

    def ratio(self, policy: str, metric: str) -> tuple:
        """``(ratio, low, high)``: policy's mean over the baseline's, and its interval."""
        return self._row("ratio", policy, metric)

    def verdict(self, policy: str, metric: str) -> str:
        """``"better"``, ``"worse"`` or ``"undecided"`` against the baseline at :attr:`level`."""
        self._check(policy, metric)
        return VERDICTS[int(self.dataset[f"verdict_{metric}"].sel(policy=policy))]

    def _check(self, policy, metric):
        if policy not in self.policies:
            raise KeyError(f"no policy {policy!r}; the policies: {', '.join(self.policies)}")
        if metric not in self.metrics:
            raise KeyError(f"no metric {metric!r}; the metrics compared: {', '.join(self.metrics)}")

    def _row(self, what, policy, metric) -> tuple:
        self._check(policy, metric)
        ds = self.dataset.sel(policy=policy)
        v = f"{what}_{metric}"
        return float(ds[v]), float(ds[f"{v}_ci_low"]), float(ds[f"{v}_ci_high"])

    def summary(self, metrics=None) -> str:
        """A text table: for each metric and policy, its mean, its difference
        and ratio to the baseline with their intervals, and the verdict."""
        names = self.metrics if metrics is None else ([metrics] if isinstance(metrics, str) else list(metrics))
        for m in names:
            self._check(self.baseline, m)
        ds = self.dataset
        head = (f"{len(self.policies)} policies against {self.baseline!r}, {ds.attrs['reps']} paired "
                f"replication(s) ({ds.attrs['method']}), intervals at {100 * self.level:g} %")
        return differences_table(ds, ds, self.baseline, names, head)

    def __repr__(self) -> str:
        return self.summary()


def compare(policies, arrivals, service=None, n=None, servers=1, seed=0, *, workload=None, service_model=None,
            baseline=None, reps: int = 10, level: float = stats.CONFIDENCE, metrics=None,
            progress: bool = False) -> Comparison:
    """Simulate every policy on the same replications and compare each with a baseline.

    Parameters
    ----------
    policies : dict of name -> policy, or list of policies
        At least two policies (any of :func:`mbbatch.simulate`'s); a list
        names each by its repr.
    arrivals, service, n, servers, workload, service_model
        As :func:`mbbatch.simulate`'s, the same for every policy.
    seed : int or numpy.random.SeedSequence, default 0
        Replication ``r`` of every policy runs on
        ``SeedSequence(seed, spawn_key=(r,))``: the same arrivals, lengths
        and predictions for every policy (common random numbers).  None
        draws fresh entropy once, recorded in ``dataset.attrs["seed"]``.
    baseline : str, optional
        The name of the policy the others are compared with (default: the
        first).
    reps : int, default 10
        Paired replications, in [1, 100000].  One: the mean latency's
        interval from batch means within each run; the other metrics none.
    level : float, default 0.95
        The intervals' confidence level, in (0, 1).
    metrics : str or list of str, optional
        The metrics to compare (default: every real metric each policy
        reports per run).
    progress : bool
        Show a progress bar of the runs (tqdm).

    Returns
    -------
    Comparison

    Raises
    ------
    TypeError, ValueError
        A bad argument, naming it and its allowed range, before any run:
        every policy's simulation is checked first.
    """
    named = _named(policies)
    reps = check_count("reps", reps, _REPS)
    level = check_scalar_real("level", level, _LEVEL)
    progress = check_flag("progress", progress)
    if baseline is None:
        baseline = next(iter(named))
    if baseline not in named:
        raise ValueError(f"baseline must be one of the policies' names ({', '.join(map(repr, named))}); got "
                         f"{baseline!r}")
    names = _metrics(named, metrics)
    common = dict(service=service, n=n, servers=servers, workload=workload, service_model=service_model)
    for name, p in named.items():
        try:
            check_simulation(p, arrivals, **common)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"policies[{name!r}]: {exc}") from None
    root = as_seed_sequence(seed)

    values = {name: np.full((len(names), reps), np.nan) for name in named}
    groups = {}
    unstable = dict.fromkeys(named, 0)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=reps * len(named), unit="run", desc="compare")
    for r in range(reps):
        ss = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, r), pool_size=root.pool_size)
        for name, p in named.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnstableWarning)
                res = simulate(p, arrivals, seed=ss, **common)
            unstable[name] += bool(res.unstable)
            got = res.metrics()
            values[name][:, r] = [float(got.get(m, math.nan)) for m in names]
            if reps == 1:
                groups[name] = np.asarray(getattr(res, "group_mean_latency", np.empty(0)), float)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    for name, k in unstable.items():
        if k:
            warnings.warn(f"compare: {name} had no steady state in {k} of {reps} replication(s) (its backlog "
                          "grew): its means, and its differences, describe a transient", UnstableWarning,
                          stacklevel=2)

    import xarray as xr

    order = list(named)
    data = {}
    for i, m in enumerate(names):
        spec = METRICS[m]
        data[f"sim_{m}"] = (("policy", "rep"), np.stack([values[name][i] for name in order]),
                            {"units": spec.units, "description": spec.description})
    ds = xr.Dataset(data, coords={"policy": order, "rep": np.arange(reps)})
    diffs = paired_differences(ds, baseline, level, names)
    if reps == 1 and "mean_latency" in names and len({groups[name].size for name in order}) == 1:
        # (one run each: the groups' means paired, the intervals centred on the runs' means)
        x = ds["sim_mean_latency"].values[:, 0]
        xb = x[order.index(baseline)]
        centre = (x - xb, x / xb if xb != 0 else np.full(x.shape, math.nan))
        g = np.stack([groups[name] for name in order])
        rows = paired_interval(g, np.broadcast_to(groups[baseline], g.shape), level, centre)
        diffs = diffs.assign(difference_vars("mean_latency", rows, ("policy",)))
    method = "paired t over replications" if reps > 1 else "batch means within one run (mean latency only)"
    ds = xr.merge([ds, diffs]).assign_attrs(baseline=baseline, level=level, reps=reps, seed=entropy_str(root),
                                            method=method, unstable_runs=[unstable[name] for name in order])
    return Comparison(ds, baseline, level)
