"""The ``mbbatch`` command line."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import warnings
from pathlib import Path

#: CLI name -> (function name in mbbatch.theory, its parameters in order)
_THEORY = {
    "service-time": ("service_time", ("B", "l_min", "l_max", "k")),
    "throughput": ("throughput", ("B", "l_min", "l_max", "k")),
    "capacity": ("capacity", ("B", "l_min", "l_max")),
    "min-bins": ("min_bins", ("B", "l_min", "l_max", "eps")),
    "latency": ("latency", ("B", "l_min", "l_max", "k", "lam")),
    "uniform-boundaries": ("uniform_boundaries", ("l_min", "l_max", "k")),
    "exponential-boundaries": ("exponential_boundaries", ("B", "mu", "k")),
    "exponential-service-bound": ("exponential_service_bound", ("B", "mu", "k")),
    "exponential-throughput-bound": ("exponential_throughput_bound", ("B", "mu", "k")),
    "harmonic-number": ("harmonic_number", ("B",)),
}


def _param_flag(p, symbol: str, required=True) -> tuple:
    """The flags and help of a theory argument, from the parameter table:
    ``--batch-size`` (and the paper's ``--B`` as an alias)."""
    from .params import PARAMS, SYMBOLS

    entry = PARAMS[SYMBOLS.get(symbol, symbol)]
    flags = [entry.flag] + ([f"--{symbol}"] if symbol in SYMBOLS else [])
    help_ = f"{entry.description}, {entry.units}, in {entry.domain}" if entry.domain else entry.description
    return flags, dict(dest=symbol, type=_number, required=required, metavar=symbol.upper(), help=help_)


def _flag_named(message: str) -> str:
    """A theory function's error, its leading parameter named by the flag
    the user typed (the paper's symbol beside it): ``B must be ...`` ->
    ``--batch-size (B) must be ...``."""
    from .params import PARAMS, SYMBOLS

    symbol, _, rest = message.partition(" ")
    name = SYMBOLS.get(symbol, symbol)
    if name not in PARAMS or not rest:
        return message
    flag = PARAMS[name].flag
    return f"{flag} ({symbol}) {rest}" if symbol in SYMBOLS else f"{flag} {rest}"


def _number(text: str):
    """An int if the text is one, else a float (so `--B 4.0` reaches the
    function as a float and is refused as the wrong kind)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


#: the examples of ``mbbatch example``: name -> function of :mod:`mbbatch.examples`
_EXAMPLES = {"fig1b": "figure_1b", "engine_event": "engine_event"}


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = argparse.ArgumentParser(prog="mbbatch", description="Monte Carlo and closed forms for "
                                 "batching policies in LLM inference.")
    ap.add_argument("--version", action="version", version=f"mbbatch {__version__}")
    ap.add_argument("--debug", action="store_true",
                    help="on an error, show the full traceback instead of one line")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for command, help_ in (("sweep", "run (or resume) sweep specs into Zarr stores"),
                           ("capacity", "run (or resume) capacity searches: specs with a [capacity] table, "
                                        "a search at every grid point")):
        sw = sub.add_parser(command, help=help_)
        sw.add_argument("spec", nargs="+", help="sweep specs, TOML files (see sweeps/)")
        where = sw.add_mutually_exclusive_group(required=True)
        where.add_argument("--out", help="the Zarr store to write (resumed if it exists); one spec")
        where.add_argument("--out-dir", help="write each spec's store to OUT_DIR/NAME.zarr, on one pool of "
                                             "workers for all")
        sw.add_argument("--rebuild-stale", action="store_true",
                        help="with --out-dir: discard and recompute a store made from another spec or by "
                             "other code (what `make figures` does)")
        sw.add_argument("--scheduler", default=None,
                        help='run cells on dask.distributed: "local" starts a LocalCluster, anything '
                             "else is the address of a running scheduler")
        sw.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
        sw.add_argument("--overwrite", action="store_true",
                        help="discard the store at --out and start over (only ever deletes an mbbatch "
                             "sweep store; anything else at that path is refused)")
        sw.add_argument("--netcdf", default=None, help="also export the Dataset to this NetCDF file")
        sw.add_argument("--quiet", action="store_true", help="no progress output")
        sw.add_argument("--skip-missing-traces", action="store_true",
                        help="skip, with a note, the specs whose trace file is absent (what `make figures` does)")

    _simulate_parser(sub)

    pr = sub.add_parser("profiles", help="list the measured hardware profiles, their fits and errors",
                        description="The hardware profiles of mbbatch.profiles: IterationModel fitted to each "
                                    "group of LLM-Inference-Bench's measured batches (Chitty-Venkata et al., "
                                    "2024, arXiv:2411.00136), with the fit's relative errors in and out of "
                                    "sample.  Use one with --service-model profile --profile NAME.")
    pr.add_argument("--match", default="", help="only the names containing this text (e.g. H100/vLLM)")

    va = sub.add_parser("validate", help="predict measured serving runs of real engines, held out, and print the "
                        "errors", description="Replay every measured serving run with a shipped profile on the "
                        "continuous engine, calibrated on the other deployments' runs (leave one deployment out); "
                        "fit the runs without a profile from their own group's runs (mbbatch.serving.fit), held "
                        "out; and print measured against predicted with the median error per metric "
                        "(mbbatch.validation); every run, about 3 minutes on 2 cores.  The runs are read from "
                        "DATA/serving; without them it says so and exits 0.")
    va.add_argument("--data", default=None,
                    help="the data directory (its serving/ folder holds the runs); default $MBBATCH_DATA")
    va.add_argument("--match", default="", help="only the runs whose name contains this (default: every run)")
    va.add_argument("--figure", default=None, metavar="PATH",
                    help="also draw measured against predicted into PATH (.png, and a .pdf beside it)")
    va.add_argument("--no-fit", action="store_true",
                    help="only the runs with a shipped profile (skip fitting the others from their own runs)")
    fs = sub.add_parser("from-serving", help="fit a profile of your own engine to its serving benchmark runs",
                        description="Read the files `vllm bench serve --save-result --save-detailed` writes (one "
                        "per run, several request rates if you can), fit an iteration model and the server's "
                        "per-request overhead to them by replaying each run on the continuous engine with the "
                        "server's settings (mbbatch.profiles.from_serving), and print the fit, its held-out "
                        "error and the sweep-spec keys that use it.")
    fs.add_argument("runs", nargs="+", metavar="RUN.json", help="the benchmark's result files, one per run")
    fs.add_argument("--engine", default="vllm-v1", choices=("vllm-v1", "vllm-0.6", "sglang"),
                    help="the server's engine, whose default settings the runs used (default vllm-v1)")
    fs.add_argument("--gpu-memory-gib", type=float, default=80.0,
                    help="one GPU's memory, GiB (the engine's defaults depend on it; default 80)")
    fs.add_argument("--max-num-seqs", type=int, default=None, help="the server's --max-num-seqs, if set")
    fs.add_argument("--max-batched-tokens", type=int, default=None,
                    help="the server's --max-num-batched-tokens, if set")
    fs.add_argument("--kv-tokens", type=float, default=None,
                    help="the server's KV cache capacity in tokens (its log's 'GPU KV cache size'); default "
                         "unbounded")
    fs.add_argument("--base", default=None, metavar="PROFILE",
                    help="the shipped profile the fit starts from (default: the iteration model's defaults)")
    cp = sub.add_parser("compare", help="a sweep's policies against a baseline: differences and ratios with "
                                        "paired intervals",
                        description="Compare the policies of a sweep along its policy axis: at every point of its "
                                    "other axes, each policy's difference and ratio to the baseline over the "
                                    "paired replications (the cells that differ only in their policy see the "
                                    "same requests), with their t-intervals, and whether it is better.")
    cp.add_argument("source", help="a sweep store (.zarr), or a spec (.toml), run or resumed into --out first")
    cp.add_argument("--baseline", default=None,
                    help="the policy compared with (default: the spec's baseline, else the first)")
    cp.add_argument("--metric", action="append", dest="metrics", default=None,
                    help="a metric to compare (repeatable; default: mean_latency, latency_p99, throughput; "
                         "a tenant's, on a store with classes: class_mean_ttft, class_ttft_p99, ...)")
    cp.add_argument("--level", type=float, default=0.95, help="the intervals' confidence level (default 0.95)")
    cp.add_argument("--out", default=None, help="a spec's store (default: results/NAME.zarr)")
    ck = sub.add_parser("check", help="verify a sweep store: done, missing and damaged grid points")
    ck.add_argument("store", help="the Zarr store a sweep wrote")

    fg = sub.add_parser("figures", help="draw the figures from stored sweep results")
    fg.add_argument("--only", default=None, help="one figure by name")
    fg.add_argument("--results", default="results", help="folder of the stored Datasets")
    fg.add_argument("--out", default="figures", help="folder for the PNG and PDF files")
    fg.add_argument("--workers", type=int, default=None, help="processes drawing at once (default: all cores)")
    fg.add_argument("--format", action="append", choices=("png", "pdf"), dest="formats", default=None,
                    help="write only this kind of file (repeatable; default: PNG and PDF)")

    pl = sub.add_parser("plot", help="draw any sweep store: a metric against an axis",
                        description="Draw a variable of a sweep store against one of its axes, in the figures' "
                                    "style: simulated metrics at their mean with their stored interval (hollow "
                                    "where the cell has no steady state), the closed form beside them where the "
                                    "store keeps one; a count or flag kept per replication (completed, "
                                    "preemptions, backlog_growing) at its mean over them with its t-interval.  "
                                    "Every axis other than --x, --hue and --col must have one value or be fixed "
                                    "with --sel.  The store is verified first, as `mbbatch check` does: a "
                                    "damaged store is not drawn.")
    pl.add_argument("store", help="the Zarr store a sweep wrote")
    pl.add_argument("--x", required=True, help="the axis along the horizontal (rate, bins, policy, ...)")
    pl.add_argument("--y", required=True, help="the variable: a simulated metric by its per-replication name "
                                               "(sim_mean_latency), a count or flag (completed), sim_capacity, "
                                               "a theory_* closed form, ...; an unknown one lists them")
    pl.add_argument("--hue", default=None, help="an axis drawn as series (one colour and marker each)")
    pl.add_argument("--col", default=None, help="an axis drawn as panels side by side")
    pl.add_argument("--sel", nargs="*", default=[], metavar="AXIS=VALUE",
                    help="a value for each other axis (policy=dynamic rate=0.5)")
    pl.add_argument("--logx", action="store_true", help="a log-scaled horizontal axis")
    pl.add_argument("--logy", action="store_true", help="a log-scaled vertical axis")
    pl.add_argument("--out", default=None, help="the image to write (PNG, PDF or SVG by its suffix; default "
                                                 "STORENAME_Y.png here)")

    ex = sub.add_parser("example", help="store worked examples as Datasets")
    ex.add_argument("name", nargs="+", choices=list(_EXAMPLES),
                    help="fig1b: the paper's Figure 1b example; engine_event: an engine of a cluster removed and "
                         "returned mid-run, under each router")
    where = ex.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="NetCDF file to write (one example)")
    where.add_argument("--out-dir", help="folder for NAME.nc of each example")

    th = sub.add_parser("theory", help="evaluate a closed form of mbbatch.theory")
    thsub = th.add_subparsers(dest="function", required=True, metavar="FUNCTION")
    for name, (fn, params) in _THEORY.items():
        from . import theory

        doc = inspect.getdoc(getattr(theory, fn)) or ""
        p = thsub.add_parser(name, help=doc.splitlines()[0] if doc else fn)
        for prm in params:
            flags, kw = _param_flag(p, prm)
            p.add_argument(*flags, **kw)
    for name, help_ in (("batch-service-time", "exact E[t_service] for a distribution and edges (eq. 2)"),
                        ("optimal-boundaries", "edges minimising the exact E[t_service]")):
        p = thsub.add_parser(name, help=help_)
        p.add_argument("--dist", required=True, help="scipy.stats continuous distribution name, e.g. expon")
        p.add_argument("--shape", type=float, nargs="*", default=[], help="its shape parameters")
        p.add_argument("--loc", type=float, default=0.0)
        p.add_argument("--scale", type=float, default=1.0)
        flags, kw = _param_flag(p, "B")
        p.add_argument(*flags, **kw)
        if name == "batch-service-time":
            from .params import PARAMS

            rules = PARAMS["edges"].choices
            p.add_argument("--edges", nargs="+", required=True, metavar="EDGES",
                           help=f"k+1 edges (inf allowed), or a rule as a spec and mbbatch simulate name it: "
                                f"{', '.join(rules)} (lemma_a1: exponential service), with --bins")
            flags, kw = _param_flag(p, "k", required=False)
            p.add_argument(*flags, **kw)
        else:
            flags, kw = _param_flag(p, "k")
            p.add_argument(*flags, **kw)
    p = thsub.add_parser("iteration-batch-service-time",
                         help="E[t_service] of multi-bin batching on a measured engine (eq. 2 under a hardware "
                              "profile's IterationModel), log-normal lengths, equal-mass bins")
    from .params import PARAMS

    p.add_argument("--profile", default=PARAMS["profile"].default,
                   help=f"a hardware profile (mbbatch profiles lists them; default {PARAMS['profile'].default})")
    p.add_argument("--finished", default=PARAMS["IterationModel.finished"].default,
                   choices=PARAMS["IterationModel.finished"].choices,
                   help="finished members leave the batch (vLLM) or stay (padded)")
    for prm in ("B", "k"):
        flags, kw = _param_flag(p, prm)
        p.add_argument(*flags, **kw)
    for name in ("prompt_median", "prompt_sigma", "output_median", "output_sigma"):
        flags, kw = _param_flag(p, name)
        p.add_argument(*flags, **kw)
    return ap


def _iteration_service(args) -> float:
    """``mbbatch theory iteration-batch-service-time``: eq. (2) under the
    profile's model, at the equal-mass edges a simulation of these lengths
    uses (in whole tokens), as a sweep stores it."""
    import dataclasses

    import scipy.stats as st

    from . import profiles, simulation
    from .arrivals import Poisson
    from .policies.multibin import MultiBin
    from .sweeps.cells import iteration_closed_form
    from .workload import Workload

    model = dataclasses.replace(profiles.get(args.profile), finished=args.finished)
    wl = Workload(prompt=st.lognorm(args.prompt_sigma, scale=args.prompt_median),
                  output=st.lognorm(args.output_sigma, scale=args.output_median))
    return iteration_closed_form(simulation.plan(MultiBin(bins=args.k, batch_size=args.B), Poisson(1.0),
                                                 n=args.B * args.k, workload=wl, service_model=model))[0]


def _spec_value(p):
    """The argparse type of a spec parameter of the table."""
    def parse(text: str):
        if p.kind == "choice":
            return text
        if p.kind == "flag":
            if text.lower() not in ("true", "false"):
                raise argparse.ArgumentTypeError(f"not true or false: {text!r}")
            return text.lower() == "true"
        if p.kind == "servers" and text == "inf":
            return "inf"
        return _number(text) if text not in ("inf", "nan") else float(text)

    parse.__name__ = p.kind
    return parse


def _simulate_params() -> dict:
    """The spec parameters that are ``mbbatch simulate`` flags: all but a
    capacity search's objective (``mbbatch capacity``) and a trace's
    settings (a spec's [workload] table)."""
    from .sweeps.spec import SPEC_PARAMS

    return {name: sp for name, sp in SPEC_PARAMS.items()
            if not sp.capacity_only and {"trace"} not in (sp.arrivals, sp.workload)}


def _simulate_parser(sub) -> None:
    """``mbbatch simulate``: one grid point from flags, each flag a parameter
    of the table, checked as a spec's would be."""
    from . import stats
    from .registry import KINDS
    from .params import PARAMS, REQUIRED
    from .sweeps.spec import ARRIVALS, SPEC_PARAMS, TOP_DEFAULTS

    sim = sub.add_parser("simulate", help="simulate one configuration and print its metrics",
                         description="Simulate one configuration (a one-point sweep, not stored) and print "
                                     "its metrics, with t-intervals over --reps replications at "
                                     "--confidence.  Flags are the parameters of a sweep spec.  (A trace's "
                                     "requests need a spec's [workload] table: mbbatch sweep.)")
    sim.add_argument("--policy", required=True, choices=KINDS, help="the batching policy")
    arrivals = [a for a in ARRIVALS if a != "trace"]
    flags = {a: ", ".join("--" + nm.replace("_", "-") for nm, sp in SPEC_PARAMS.items() if a in sp.arrivals)
             for a in arrivals}
    sim.add_argument("--arrivals", default=TOP_DEFAULTS["arrivals"], choices=arrivals,
                     help=f"the arrival process (default {TOP_DEFAULTS['arrivals']}), with its flags: "
                          + "; ".join(f"{a}: {f}" for a, f in flags.items() if f))
    form = sim.add_mutually_exclusive_group()
    form.add_argument("--service", choices=("uniform", "expon"),
                      help="the paper's workload: the service-time distribution (policy multibin; default "
                           "uniform, --l-min and --l-max; expon: --mu)")
    form.add_argument("--service-model", choices=PARAMS["service_model"].choices,
                      help="token-level requests (log-normal prompt and output lengths) and their batch "
                           "service model (default: the policy's own, decode for most)")
    sim.add_argument("--reps", type=int, default=TOP_DEFAULTS["reps"],
                     help=f"replications (default {TOP_DEFAULTS['reps']}; 2 or more give every metric a "
                          "t-interval)")
    sim.add_argument("--confidence", type=float, default=stats.CONFIDENCE,
                     help=f"the level of the t-intervals, in (0, 1) (default {stats.CONFIDENCE:g})")
    sim.add_argument("--seed", type=int, default=TOP_DEFAULTS["seed"],
                     help=f"root seed (default {TOP_DEFAULTS['seed']})")
    for name, sp in _simulate_params().items():
        p = sp.table
        where = f" in {p.domain}" if p.domain is not None else \
            ": true or false" if p.kind == "flag" else f": {', '.join(p.choices)}" if len(p.choices) <= 12 else \
            f": one of {len(p.choices)} (mbbatch {name}s lists them; default {p.default})"
        units = f", {p.units}" if p.units else ""
        # (the default a cell takes when the flag is not given: the parameter table's, or required)
        d = sp.default
        shown = ("; required where it applies" if sp.required and d is REQUIRED
                 else "" if d is None or d is REQUIRED else f"; default {d:g}" if isinstance(d, float)
                 else f"; default {d}")
        sim.add_argument("--" + name.replace("_", "-"), dest=f"p_{name}", type=_spec_value(p), default=None,
                         metavar=name.upper(), help=f"{p.description}{units}{where}{shown}")


def _simulate(args) -> None:
    import math

    import numpy as np

    from . import stats
    from .metrics import METRICS
    from .sweeps.cells import run_point
    from .sweeps.spec import spec_from_dict

    params = {name: getattr(args, f"p_{name}") for name in _simulate_params()
              if getattr(args, f"p_{name}") is not None}
    raw = {"name": "simulate", "policy": args.policy, "arrivals": args.arrivals, "reps": args.reps,
           "seed": args.seed, "params": params, "confidence": args.confidence}
    if args.service is not None:
        raw["service"] = args.service
    elif args.service_model is not None:
        raw["service_model"] = args.service_model
    import re

    from .sweeps.cells import check_points
    from .sweeps.spec import SpecError

    def flag(m):
        return "--" + m.group(1).replace("_", "-")

    try:
        spec = spec_from_dict(raw, source="command line")
        check_points(spec)
    except SpecError as exc:
        # name the flags, not the spec's tables
        text = re.sub(r"params\.(\w+) or grid\.\w+", flag, str(exc))
        text = re.sub(r"\bconfidence must", "--confidence must", text)
        text = re.sub(r"\bparams: (\w+)(?= must)", flag, text)
        raise SpecError(re.sub(r"\bparams\.(\w+)", flag, text)) from None
    (_, cell), = spec.points()
    sim = run_point(spec.arrivals, spec.service, cell, spec.seed, spec.reps)
    level = f"{100 * spec.confidence:g}%"
    print(f"{args.policy}, {args.arrivals} arrivals, {spec.reps} rep{'s' if spec.reps > 1 else ''}, "
          f"seed {spec.seed}" + (f": mean [{level} t-interval over the replications]" if spec.reps > 1
                                 else ": one replication, no intervals (--reps 2 or more gives each metric "
                                      "its t-interval)"))
    for m in METRICS.values():
        if m.var not in sim:
            continue
        x = np.asarray(sim[m.var], dtype=float)
        if m.dtype == "bool":
            shown = f"{int(x.sum())} of {x.size}"
        elif spec.reps > 1:
            mean, lo, hi = stats.t_interval(x, spec.confidence)
            shown = f"{mean:.6g}  [{lo:.6g}, {hi:.6g}]" if math.isfinite(lo) else f"{mean:.6g}"
        else:
            shown = f"{x[0]:.6g}"
        print(f"  {m.name:<26} {shown:<36} {m.units}")
    unstable = np.asarray(sim[METRICS["unstable"].var], dtype=bool)
    if unstable.any():
        # (as a sweep and mb.simulate warn: the table alone showed it as one more row)
        k = int(unstable.sum())
        print(f"warning: {k} of {unstable.size} replication{'s' if unstable.size > 1 else ''} "
              f"{'has' if k == 1 else 'have'} no steady state (the backlog grew through the run): the averages "
              "describe a transient, not the policy's long-run behaviour", file=sys.stderr)


#: a capacity store's searches printed at most (the rest: mbbatch check, or the store itself)
CAPACITY_LINES = 40


def _print_capacities(ds) -> None:
    """A capacity store's searches, one line a grid point: the point, the
    capacity and its interval, and whether probes undecided at the
    replication cap narrowed it."""
    import numpy as np

    cap = ds["sim_capacity"]
    units = cap.attrs.get("units", "")
    dims = list(cap.dims)
    cells = list(np.ndindex(*cap.shape))
    for idx in cells[:CAPACITY_LINES]:
        point = ", ".join(f"{d}={ds[d].values[i]}" for d, i in zip(dims, idx))
        if not bool(ds["done"].values[idx]):
            print(f"  {point}: not done")
            continue
        lo, hi = ds["sim_capacity_ci_low"].values[idx], ds["sim_capacity_ci_high"].values[idx]
        note = "" if bool(ds["capacity_resolved"].values[idx]) else "  (unresolved: probes undecided at the cap)"
        ci = f" [{lo:.4g}, {hi:.4g}]" if np.isfinite(lo) else " (one search: no interval)"
        print(f"  {point}: {cap.values[idx]:.4g} {units}{ci}{note}")
    if len(cells) > CAPACITY_LINES:
        print(f"  ... and {len(cells) - CAPACITY_LINES} more grid points in the store")


def _compared(source, variants: list, baseline) -> None:
    """A sweep's policy ``variants`` as `mbbatch compare` needs them: two or
    more, with ``--baseline`` (None: not given) among them."""
    if len(variants) < 2:
        raise ValueError(f"{source}: the sweep has no policy axis (a [grid] policy = [...] of two or more "
                         "variants) to compare along")
    if baseline is not None and baseline not in variants:
        raise ValueError(f"--baseline must be one of the sweep's policies ({', '.join(variants)}); got {baseline!r}")


def _compare(args) -> None:
    from .comparison import differences_table
    from .metrics import METRICS, PER_CLASS
    from .stats import paired_differences
    from .sweeps import open_store, run_sweep

    # (every flag checked before a spec's sweep runs)
    if not 0.0 < args.level < 1.0:
        raise ValueError(f"--level must be in (0, 1); got {args.level}")
    # (a tenant's metrics that a comparison reads: the real ones, per replication)
    tenants = [name for name, row in PER_CLASS.items() if row.dtype == "f8"]
    for m in args.metrics or ():
        if m not in METRICS and not (m.startswith("class_") and m[len("class_"):] in tenants):
            raise ValueError(f"--metric: unknown metric {m!r}; the metric table's: {', '.join(METRICS)}; or "
                             f"a tenant's (a store with request_class): {', '.join('class_' + c for c in tenants)}")
    source = Path(args.source)
    if source.suffix == ".toml":
        from .sweeps.spec import load_spec

        spec = load_spec(source)
        _compared(source, [str(v) for v in spec.axes.get("policy", ())], args.baseline)
        out = Path(args.out) if args.out is not None else Path("results") / f"{spec.name}.zarr"
        run_sweep(spec, out, progress=True)
        source = out
    ds = open_store(source)
    policies = [str(p) for p in ds["policy"].values] if "policy" in ds.dims else []
    _compared(source, policies, args.baseline)
    baseline = args.baseline or ds.attrs.get("baseline") or policies[0]
    kept = [m for m in ("mean_latency", "latency_p99", "throughput") if f"sim_{m}" in ds]
    metrics = args.metrics or kept
    for m in metrics:
        if f"sim_{m}" not in ds or "rep" not in ds[f"sim_{m}"].dims:
            raise ValueError(f"--metric: the store keeps no replications of {m!r}")
    ds = ds[[f"sim_{m}" for m in metrics]].load()
    diffs = paired_differences(ds, baseline, args.level, metrics)
    head = (f"{source}: {len(policies)} policies against {baseline!r}, {ds.sizes['rep']} paired replications, "
            f"intervals at {100 * args.level:g} %")
    print(differences_table(ds, diffs, baseline, metrics, head))


def _plot(args) -> None:
    from .figures.plotting import plot
    from .figures.style import DPI, PDF_METADATA, PNG_METADATA, house_style
    from .sweeps import open_store

    # a folder that is not a sweep store, or a damaged store, named before anything is read
    ds = open_store(args.store)
    store = Path(args.store)
    axes = [d for d in ds.dims if d not in ("rep", "time")]
    sel = {}
    for item in args.sel:
        axis, eq, text = item.partition("=")
        if not eq or axis not in axes:
            raise ValueError(f"--sel: {item!r} must be AXIS=VALUE with AXIS one of {axes}")
        sel[axis] = text
    try:
        # (the store was verified above; the values of --sel are matched by their text)
        fig = plot(ds, x=args.x, y=args.y, hue=args.hue, col=args.col, sel=sel, logx=args.logx, logy=args.logy)
    except ValueError as exc:
        # the flags by their names: `x must be ...` -> `--x must be ...`
        message = str(exc)
        flagged = any(message.startswith((f"{name} must", f"{name}:")) for name in ("x", "y", "hue", "col", "sel"))
        raise ValueError(f"--{message}" if flagged else message) from None
    out = Path(args.out) if args.out is not None else Path(f"{store.stem}_{args.y}.png")
    with house_style():
        fig.savefig(out, dpi=DPI, metadata=PDF_METADATA if out.suffix.lower() == ".pdf" else
                    PNG_METADATA if out.suffix.lower() == ".png" else None)
    print(out)


def _frozen(args):
    import scipy.stats as st

    law = getattr(st, args.dist, None)
    if not isinstance(law, st.rv_continuous):
        raise ValueError(f"dist must name a scipy.stats continuous distribution; got {args.dist!r}")
    return law(*args.shape, loc=args.loc, scale=args.scale)


def _theory_edges(args, dist):
    """``mbbatch theory batch-service-time``'s edges: the k+1 numbers given,
    or the edges of the rule named (as a spec's ``edges``): equal mass of
    ``dist`` (as a simulation bins it), Lemma A.1's (exponential ``dist``
    only) or those minimising eq. (2), for ``--bins`` bins."""
    from . import theory
    from .lengths import as_service
    from .params import PARAMS

    rules = PARAMS["edges"].choices
    if len(args.edges) == 1 and args.edges[0] in rules:
        rule, k = args.edges[0], args.k
        if k is None:
            raise ValueError(f"--edges {rule} needs --bins (k), the number of bins")
        if rule == "equal_mass":
            return as_service(dist, "dist").equal_mass_edges(int(k))
        if rule == "optimal":
            return theory.optimal_boundaries(dist, args.B, k)
        if dist.dist.name != "expon" or dist.kwds.get("loc", 0.0) != 0.0:
            raise ValueError("--edges lemma_a1 is Lemma A.1's edges of exponential service: --dist expon "
                             "(--loc 0)")
        return theory.exponential_boundaries(args.B, 1.0 / dist.std(), k)
    try:
        return [float(x) for x in args.edges]
    except ValueError:
        raise ValueError(f"--edges takes k+1 numbers or one of {', '.join(rules)}; got "
                         f"{' '.join(args.edges)}") from None


def _one_line(exc: BaseException) -> str:
    """An error as one line, naming the path or key it is about."""
    if isinstance(exc, MemoryError):
        return "out of memory" + (f": {exc}" if str(exc) else "") + "; make the run smaller"
    if isinstance(exc, UnicodeDecodeError):
        return (f"a file is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                "check the input files")
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def _from_serving(args) -> None:
    """``mbbatch from-serving``: the fit, then the spec keys that use it."""
    from . import engines, profiles, serving
    from ._kernels.cost import TERMS

    name, _, version = args.engine.partition("-")
    given = {k: v for k, v in (("max_num_seqs", args.max_num_seqs), ("max_batched_tokens", args.max_batched_tokens),
                               ("kv_tokens", args.kv_tokens)) if v is not None}
    engine = (engines.vllm(version, gpu_memory_gib=args.gpu_memory_gib, **given) if name == "vllm"
              else engines.sglang(gpu_memory_gib=args.gpu_memory_gib, **given))
    settings = {k: getattr(engine, k) for k in ("max_num_seqs", "max_batched_tokens", "chunked_prefill",
                                                "kv_tokens", "block_size")}
    runs = [serving.read_vllm_bench(path, settings=settings, name=Path(path).stem) for path in args.runs]
    fit = profiles.from_serving(runs, base=args.base,
                                progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(fit)
    spec = {t.name: t.spec for t in TERMS}
    print("\n# in a sweep spec (policy = \"continuous\"): the fitted model and the engine's settings")
    print('service_model = "iteration"\n\n[params]')
    for t in TERMS:
        print(f"{spec[t.name]} = {getattr(fit.model, t.name):.6g}")
    print(f"request_overhead = {fit.overheads['request_overhead']:.6g}")
    for k, v in settings.items():
        print(f"{k} = {str(v).lower() if isinstance(v, bool) else ('inf' if v == math.inf else v)}")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        if args.command in ("sweep", "capacity"):
            # every finished grid point (a capacity search's too) is stored with its done flag last
            where = args.out or args.out_dir
            print(f"\nmbbatch {args.command}: interrupted; the grid points finished so far are kept in {where}: "
                  "run the same command again to resume", file=sys.stderr)
        else:
            print(f"\nmbbatch {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, RuntimeError, OSError, MemoryError) as exc:
        if args.debug:
            raise
        print(f"mbbatch {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _print_warnings(caught) -> None:
    for w in caught:
        kind = w.category.__name__
        if kind == "UnstableWarning":
            print(f"warning: {w.message}", file=sys.stderr)
        elif kind == "StoreNote":
            print(f"note: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _dispatch(args) -> int:
    if args.command in ("sweep", "capacity"):
        from .sweeps import run_sweep, run_sweeps
        from .sweeps.spec import TraceNotFound, load_spec

        if args.out is not None and len(args.spec) > 1:
            raise ValueError(f"--out names one store, for one spec; got {len(args.spec)} specs: use --out-dir")
        if args.out_dir is not None and args.netcdf is not None:
            raise ValueError("--netcdf goes with --out (one spec)")
        if args.rebuild_stale and args.out_dir is None:
            raise ValueError("--rebuild-stale goes with --out-dir")
        specs = []
        for path in args.spec:
            try:
                specs.append(load_spec(path))
            except TraceNotFound as exc:
                if not args.skip_missing_traces:
                    raise
                print(f"note: skipped {path}: {exc}", file=sys.stderr)
                continue
            if args.command == "capacity" and specs[-1].capacity is None:
                raise ValueError(f"{path}: no [capacity] table: `mbbatch capacity` runs capacity searches "
                                 "(a spec without a rate axis and with [capacity]); run it with `mbbatch sweep`")
        if not specs:
            return 0
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if args.out is not None:
                    ds = run_sweep(specs[0], args.out, scheduler=args.scheduler, workers=args.workers,
                                   overwrite=args.overwrite, netcdf=args.netcdf, progress=not args.quiet)
                    done = [(ds, args.out)]
                else:
                    runs = run_sweeps(specs, args.out_dir, scheduler=args.scheduler, workers=args.workers,
                                      overwrite=args.overwrite, rebuild_stale=args.rebuild_stale,
                                      progress=not args.quiet)
                    done = [(ds, Path(args.out_dir) / f"{ds.attrs['name']}.zarr") for ds, _ in runs]
        finally:
            # (outside the recording: there warnings.showwarning would record each warning shown again,
            # onto the list being shown, without end)
            _print_warnings(caught)
        for ds, out in done:
            print(f"{ds.attrs['name']}: {int(ds['done'].sum())} grid points done in {out}")
            if "sim_capacity" in ds:
                _print_capacities(ds)
    elif args.command == "simulate":
        _simulate(args)
    elif args.command == "profiles":
        from . import profiles

        # (only the matching profiles are fitted)
        keep = [name for name in profiles.names() if args.match in name]
        if not keep:
            raise ValueError(f"--match: no profile name contains {args.match!r} (mbbatch profiles lists them)")
        print(f"{'profile':<44} {'rows':>4}  {'R^2':>6}  {'median':>7}  {'held out':>8}  step (ms)  "
              f"per context token (ns)  per expert (ms)  not identified by the data")
        for name in keep:
            p = profiles.provenance(name)
            # (per expert: a mixture of experts' only, '-' for a dense model)
            expert = f"{1e3 * p['per_expert']:15.3f}" if p["experts"] else f"{'-':>15}"
            print(f"{name:<44} {p['rows']:>4}  {p['r2']:>6.3f}  {p['median_error']:>7.1%}  "
                  f"{p['holdout_error']:>8.1%}  {1e3 * p['step']:>9.3f}  {1e9 * p['per_context_token']:22.3f}  "
                  f"{expert}  {p['unidentified'] or '-'}")
    elif args.command == "validate":
        from . import validation

        try:
            runs = [r for r in validation.serving_runs(args.data) if args.match in r.name]
        except validation.ServingDataNotFound as exc:
            print(f"mbbatch validate: skipped: {exc}")
            return 0
        if not runs:
            raise ValueError(f"--match: no measured run's name contains {args.match!r}")
        report = validation.run(runs=runs, fitted=not args.no_fit,
                                progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(report)
        if args.figure is not None:
            from .figures.style import house_style, save
            from .figures.validation import validation as draw

            path = Path(args.figure)
            with house_style():
                written = save(draw(report.to_dataset()), path.parent, path.with_suffix("").name)
            print("wrote " + ", ".join(map(str, written)))
    elif args.command == "from-serving":
        _from_serving(args)
    elif args.command == "compare":
        _compare(args)
    elif args.command == "check":
        from .sweeps import check_store

        report = check_store(args.store)
        print(report.text)
        return 0 if report.ok else 1
    elif args.command == "plot":
        _plot(args)
    elif args.command == "figures":
        from .figures import make_figures

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            paths = make_figures(Path(args.results), Path(args.out), only=args.only,
                                 workers=args.workers if args.workers is not None else os.cpu_count() or 1,
                                 formats=args.formats or ("png", "pdf"))
        for w in caught:
            print(f"note: {w.message}", file=sys.stderr)
        for path in paths:
            print(path)
    elif args.command == "example":
        from . import examples

        if args.out is not None and len(args.name) > 1:
            raise ValueError("--out names one file: give one example, or --out-dir for several")
        from .sweeps.store import write_netcdf

        for name in dict.fromkeys(args.name):
            out = Path(args.out) if args.out is not None else Path(args.out_dir) / f"{name}.nc"
            print(write_netcdf(getattr(examples, _EXAMPLES[name])(), out, "--out" if args.out else "--out-dir"))
    elif args.command == "theory":
        from . import theory

        try:
            if args.function == "batch-service-time":
                dist = _frozen(args)
                value = theory.batch_service_time(dist, _theory_edges(args, dist), args.B)
            elif args.function == "optimal-boundaries":
                value = theory.optimal_boundaries(_frozen(args), args.B, args.k)
            elif args.function == "iteration-batch-service-time":
                value = _iteration_service(args)
            else:
                fn, params = _THEORY[args.function]
                value = getattr(theory, fn)(*(getattr(args, p) for p in params))
        except (TypeError, ValueError) as exc:
            raise type(exc)(_flag_named(str(exc))) from None
        print(value if not hasattr(value, "tolist") else value.tolist())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
