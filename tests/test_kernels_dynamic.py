"""Token-level policies through ``mb.simulate``: StaticBatching, DynamicBatching
and MultiBinDynamic on the event kernel (``mbbatch/_kernels/dynamic.py``).

What is checked, mostly as hypothesis properties over drawn configurations
(policy, bins, B_min/B_max, D_SLA, eps_D, alpha/delta, controller variant,
servers, arrival process, service model, memory variant, selection rule,
integer lengths, predictor error, pin, max_candidates, bin_b_max):

- conservation: every request completes exactly once (or, with the memory
  constraint on, is rejected exactly when it alone exceeds eta);
- per-batch bounds and Algorithm 3's greedy batch formation, recomputed from
  the per-request and per-batch records;
- FIFO order within each bin; no more than ``servers`` batches in service;
  work conservation (a batch starts as soon as a server is free and a request
  waits);
- an independent replay of Algorithms 1, 2 and 7 in Python event order (the
  controller kernels are unit-tested in test_kernels_controller.py; here it is the
  kernel's wiring: feedback in completion order, N_decode, per-bin state);
- common random numbers and bit-identical reruns;
- the pinned multi-bin policy against the multi-bin paper's theory;
- the controller's fixed points under slack and overload; ``sla_infeasible``;
- every metric recomputed from the records; the downsampled time series;
- Algorithm 6's warm-up edges and Algorithm 4's bins recomputed in numpy;
- round-robin and longest-queue selection on a hand-computed trace;
- configuration errors.

Statistical tests state their confidence level.  Under the derandomized ``ci``
profile the examples are fixed, so each run repeats the same experiment.
"""

import heapq
import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import assume, given, settings
from hypothesis import strategies as hs

import mbbatch as mb
from mbbatch import theory
from mbbatch._kernels import controller as c

from .reference import token_gaps, weighted_quantiles


#: two-sided normal quantile for 99.99% confidence
Z_9999 = st.norm.ppf(1 - 0.0001 / 2)

BETA = 5.74e-3     # DecodeModel's default beta, s/token
GAMMA = 0.316      # DecodeModel's default gamma


# --- drawn configurations --------------------------------------------------

PROMPTS = {
    "uniform": st.uniform(1, 299),
    "lognorm": st.lognorm(0.8, scale=100),
    "expon": st.expon(scale=80),
}
OUTPUTS = {
    "uniform": st.uniform(1, 399),
    "expon": st.expon(scale=100),
    "gamma": st.gamma(2.0, scale=60),
    "lognorm": st.lognorm(1.0, scale=80),
}
MODELS = {
    "max": mb.MaxModel(base=0.01, per_token=6e-3),
    "linear": mb.LinearModel(base=0.01, alpha=2e-3, beta=0.3),
    "decode": mb.DecodeModel(),
    "decode_prefill": mb.DecodeModel(prefill_per_token=1e-5),
}
#: eta = (m_max_gb - 8) / 4e-4 tokens: 180,000 by default, 20,000 "tight",
#: 1,000 "small" (many batches above it; with the constraint on, long
#: requests alone exceed it and are rejected)
MEMORIES = {
    "off": mb.Memory(enabled=False),
    "off_small": mb.Memory(m_max_gb=8.4, enabled=False),
    "l0": mb.Memory(),
    "clt": mb.Memory(variant="clt"),
    "tight": mb.Memory(m_max_gb=16.0),
    "tight_clt": mb.Memory(m_max_gb=16.0, variant="clt", eps_m=0.01),
    "reject": mb.Memory(m_max_gb=8.4),
}


@hs.composite
def configs(draw, kinds=("static", "dynamic", "multibin"), memories=tuple(MEMORIES),
            arrivals=("poisson", "saturated", "replay"), integer=None):
    """A random configuration: a dict with everything ``run`` needs."""
    kind = draw(hs.sampled_from(kinds))
    b_min = draw(hs.integers(1, 6))
    b_max = b_min + draw(hs.integers(0, 40))
    cfg = dict(
        kind=kind,
        b_min=b_min,
        b_max=b_max,
        bins=draw(hs.integers(1, 6)) if kind == "multibin" else 1,
        d_sla=draw(hs.sampled_from([4e-3, 6.5e-3, 7.5e-3, 1e-2, 3e-2, 1.0])),
        eps_d=draw(hs.sampled_from([0.0, 5e-5, 1e-3])),
        alpha=draw(hs.sampled_from([4, 0, 1, 3, 6])),
        delta=draw(hs.sampled_from([2, 0, 1, 3])),
        variant=draw(hs.sampled_from(["spec", "multiplicative"])),
        servers=draw(hs.integers(1, 3)),
        arrivals=draw(hs.sampled_from(arrivals)),
        rate=draw(hs.floats(0.5, 300.0)),
        model=draw(hs.sampled_from(sorted(MODELS))),
        memory=draw(hs.sampled_from(memories)),
        selection=draw(hs.sampled_from(["round_robin", "longest_queue"])),
        integer=draw(hs.booleans()) if integer is None else integer,
        sigma=draw(hs.sampled_from([0.0, 0.0, 0.5])),
        prompt=draw(hs.sampled_from(sorted(PROMPTS))),
        output=draw(hs.sampled_from(sorted(OUTPUTS))),
        n=draw(hs.integers(200, 1500)),
        seed=draw(hs.integers(0, 2**32 - 1)),
    )
    cfg["pin"] = draw(hs.one_of(hs.none(), hs.integers(1, b_max))) if kind != "static" else None
    cfg["max_candidates"] = draw(hs.one_of(hs.none(), hs.integers(1, b_max + 5)))
    K = cfg["bins"]
    cfg["warmup"] = draw(hs.one_of(hs.integers(K, 60), hs.integers(K, 2000)))
    cfg["bin_b_max"] = (draw(hs.one_of(hs.none(), hs.lists(hs.integers(1, b_max + 5),
                                                            min_size=K, max_size=K)))
                        if kind == "multibin" else None)
    return cfg


def make_policy(cfg):
    ctl = mb.SLAController(d_sla=cfg["d_sla"], eps_d=cfg["eps_d"], b_min=cfg["b_min"],
                           b_max=cfg["b_max"], alpha=cfg["alpha"], delta=cfg["delta"],
                           variant=cfg["variant"])
    if cfg["kind"] == "static":
        return mb.StaticBatching(batch_size=cfg["b_max"], sla=ctl)
    common = dict(controller=ctl, memory=MEMORIES[cfg["memory"]],
                  max_candidates=cfg["max_candidates"], pin=cfg["pin"])
    if cfg["kind"] == "dynamic":
        return mb.DynamicBatching(**common)
    return mb.MultiBinDynamic(bins=cfg["bins"], selection=cfg["selection"], warmup=cfg["warmup"],
                              bin_b_max=cfg["bin_b_max"], **common)


def make_arrivals(cfg):
    a = cfg["arrivals"]
    if a == "poisson":
        return mb.Poisson(rate=cfg["rate"])
    if a == "saturated":
        return mb.Saturated()
    if a == "piecewise":
        r = cfg["rate"]
        return mb.PiecewisePoisson(rates=(r / 4, 4 * r, r), ends=(200 / r, 600 / r))
    # a replayed trace on a coarse clock: many simultaneous arrivals
    rng = np.random.default_rng(cfg["seed"])
    gaps = rng.exponential(1 / cfg["rate"], cfg["n"])
    tick = 5.0 / cfg["rate"]
    return mb.Replay(np.floor(np.cumsum(gaps) / tick) * tick)


def run(cfg, **kw):
    """Simulate ``cfg`` with both records kept; returns (result, policy)."""
    pol = make_policy(cfg)
    wl = mb.Workload(prompt=PROMPTS[cfg["prompt"]], output=OUTPUTS[cfg["output"]],
                     integer_lengths=cfg["integer"], predictor_sigma=cfg["sigma"])
    args = dict(arrivals=make_arrivals(cfg), workload=wl, service_model=MODELS[cfg["model"]],
                n=cfg["n"], servers=cfg["servers"], seed=cfg["seed"],
                keep_requests=True, keep_batches=True)
    args.update(kw)
    return mb.simulate(pol, **args), pol


def eta_of(pol):
    """The token capacity the kernel uses (static batching: the default Memory)."""
    return pol.memory.eta if isinstance(pol, mb.DynamicBatching) else mb.Memory().eta


def memory_on(pol):
    return isinstance(pol, mb.DynamicBatching) and pol.memory.enabled


def bins_of(pol):
    return pol.bins if isinstance(pol, mb.MultiBinDynamic) else 1


def members(res):
    """Request indices of each batch, in arrival (= queue) order."""
    batch = res.requests["batch"]
    nb = res.batches["size"].size
    served = np.flatnonzero(batch >= 0)
    order = served[np.argsort(batch[served], kind="stable")]
    cuts = np.searchsorted(batch[order], np.arange(nb + 1))
    return [order[cuts[j]:cuts[j + 1]] for j in range(nb)]


def queue_bin(res, pol, j):
    """Bin each request sits in while batch j is formed: bin 0 for everyone
    before the warm-up instant, then its recorded (Algorithm 4) bin."""
    if isinstance(pol, mb.MultiBinDynamic) and pol.bins > 1 and not (res.batches["start"][j] >= res.warmup_time):
        return np.zeros(res.requests["bin"].size, np.int64)
    return res.requests["bin"]


# --- 1. conservation --------------------------------------------------------

def check_conservation(cfg, res, pol):
    """Every request is served in exactly one batch, or rejected (memory on)
    exactly when its own prompt + output exceeds the token capacity."""
    r, b = res.requests, res.batches
    n, nb = cfg["n"], res.n_batches
    assert b["size"].size == nb
    served = r["batch"] >= 0
    eta = eta_of(pol)
    too_big = r["prompt"] + r["output"] > eta
    if memory_on(pol):
        np.testing.assert_array_equal(~served, too_big)
    else:
        assert served.all()
    assert res.completed + res.rejected == n
    assert res.rejected == int((~served).sum())
    assert res.completed == int(served.sum()) == int(b["size"].sum())
    # served requests: finite times, in order; the others: none at all
    for f in ("start", "completion", "ttft", "latency"):
        assert np.isfinite(r[f][served]).all()
        assert np.isnan(r[f][~served]).all()
    assert (r["bin"][~served] == -1).all()
    assert (r["start"][served] >= r["arrival"][served]).all()
    assert (r["completion"][served] >= r["start"][served]).all()
    # batch ids cover 0..n_batches-1; member counts are the recorded sizes
    np.testing.assert_array_equal(np.bincount(r["batch"][served], minlength=nb), b["size"])
    assert (b["size"] >= 1).all()
    # members share their batch's bin, start and completion
    j = r["batch"][served]
    np.testing.assert_array_equal(r["bin"][served], b["bin"][j])
    np.testing.assert_array_equal(r["start"][served], b["start"][j])
    np.testing.assert_array_equal(r["completion"][served], b["start"][j] + b["service"][j])
    np.testing.assert_array_equal(r["latency"], r["completion"] - r["arrival"])
    # batches are recorded in start order
    assert (np.diff(b["start"]) >= 0).all()


@given(cfg=configs())
def test_every_request_completes_exactly_once(cfg):
    check_conservation(cfg, *run(cfg))


# --- 2. per-batch bounds and Algorithm 3 ------------------------------------

def check_batches(cfg, res, pol):
    """Per batch: 1 <= size <= b_target; b_target is the pin, the static B,
    min(b_mem, b_SLA) (memory on) or b_SLA (memory off); B_min <= b_SLA, b_mem
    <= B_max; b_mem respects the per-bin limit; tokens <= eta with the memory
    constraint on, and the counted exceedances without it.  And Algorithm 3
    is greedy: the batch is the longest prefix of the bin's queue (at most
    min(b_target, max_candidates) requests) whose tokens fit."""
    r, b = res.requests, res.batches
    size, target, bm, bs = b["size"], b["b_target"], b["b_mem"], b["b_sla"]
    assert (size >= 1).all() and (size <= target).all()
    eta = eta_of(pol)
    if isinstance(pol, mb.StaticBatching):
        assert (target == pol.batch_size).all()
        assert (bm == -1).all() and (bs == -1).all()
        max_cand = pol.batch_size
    else:
        ctl = pol.controller
        max_cand = pol.max_candidates or ctl.b_max
        assert ((bs >= ctl.b_min) & (bs <= ctl.b_max)).all()
        assert ((bm >= ctl.b_min) & (bm <= ctl.b_max)).all()
        if pol.pin:
            assert (target == pol.pin).all()
        elif pol.memory.enabled:
            np.testing.assert_array_equal(target, np.minimum(bm, bs))
        else:
            np.testing.assert_array_equal(target, bs)
        if isinstance(pol, mb.MultiBinDynamic) and pol.bin_b_max is not None:
            lim = np.maximum(np.asarray(pol.bin_b_max)[b["bin"]], ctl.b_min)
            assert (bm <= lim).all()
    assert (size <= max_cand).all()
    # tokens: recomputed from the members; the memory constraint
    mem = members(res)
    tok = np.array([np.sum(r["prompt"][m] + r["output"][m]) for m in mem])
    np.testing.assert_allclose(b["tokens"], tok, rtol=1e-12)
    if memory_on(pol):
        assert (b["tokens"] <= eta).all()
        assert res.mem_exceed_batches == 0
    else:
        assert res.mem_exceed_batches == int((b["tokens"] > eta).sum())
    # greedy maximality: a shorter batch than min(b_target, max_cand, waiting)
    # only when the next request of the bin would not fit in memory
    if res.rejected:
        return  # rejected requests leave the queue at an unrecorded time
    tokens = r["prompt"] + r["output"]
    for j in range(res.n_batches):
        qb = queue_bin(res, pol, j)
        waiting = np.flatnonzero((qb == b["bin"][j]) & (r["batch"] >= j)
                                 & (r["arrival"] <= b["start"][j]))
        np.testing.assert_array_equal(waiting[:size[j]], mem[j])  # the head of the bin
        limit = min(target[j], max_cand, waiting.size)
        if size[j] < limit:
            assert memory_on(pol) and not isinstance(pol, mb.StaticBatching)
            assert tokens[waiting[:size[j] + 1]].sum() > eta


@given(cfg=configs())
def test_batch_bounds_and_greedy_formation(cfg):
    check_batches(cfg, *run(cfg))


# --- 3. FIFO within a bin ---------------------------------------------------

def check_fifo(cfg, res, pol):
    """Requests of one bin are served in arrival order: along the arrival
    order of each bin, the batch id and start time never decrease (globally
    for one bin); and before the warm-up instant everything is one FIFO."""
    r = res.requests
    assert (np.diff(r["arrival"]) >= 0).all()
    served = r["batch"] >= 0
    for k in range(bins_of(pol)):
        idx = np.flatnonzero(served & (r["bin"] == k))
        assert (np.diff(r["batch"][idx]) >= 0).all()
        assert (np.diff(r["start"][idx]) >= 0).all()
    if bins_of(pol) == 1:
        assert (np.diff(r["batch"][served]) >= 0).all()
    else:
        early = served & (r["start"] < res.warmup_time)
        # everything served before the warm-up came from one FIFO, ahead of the rest
        idx = np.flatnonzero(early)
        assert (np.diff(r["batch"][idx]) >= 0).all()
        if idx.size:
            assert idx.max() < np.flatnonzero(served & ~early).min(initial=cfg["n"])


@given(cfg=configs())
def test_fifo_within_each_bin(cfg):
    check_fifo(cfg, *run(cfg))


# --- 4. servers -------------------------------------------------------------

def check_servers(cfg, res, pol):
    """At most ``servers`` batches are in service at once, and the policies
    are work-conserving: batch j starts at max(F_j, A_j), F_j the earliest time
    a server is free after batches 0..j-1 (each on the earliest free server),
    A_j the earliest arrival among requests not in batches 0..j-1."""
    r, b = res.requests, res.batches
    c_ = cfg["servers"]
    start, end = b["start"], b["start"] + b["service"]
    # sweep: ends before starts at equal times (a freed server is reused at once)
    ev = sorted([(t, 0) for t in end] + [(t, 1) for t in start])
    busy = 0
    for _, kind in ev:
        busy += 1 if kind else -1
        assert 0 <= busy <= c_
    # work conservation
    served = r["batch"] >= 0
    batch_of = np.where(served, r["batch"], np.iinfo(np.int64).max)
    # A_j: min arrival of requests in batches >= j (suffix minimum over batch order)
    first_arr = np.full(res.n_batches, np.inf)
    np.minimum.at(first_arr, batch_of[served], r["arrival"][served])
    A = np.minimum.accumulate(first_arr[::-1])[::-1]
    free = [-np.inf] * c_
    for j in range(res.n_batches):
        F = heapq.heappop(free)
        assert start[j] == max(F, A[j]), j
        heapq.heappush(free, end[j])
    assert res.utilization <= 1 + 1e-12


@given(cfg=configs())
def test_servers_never_overlap_and_work_conserving(cfg):
    check_servers(cfg, *run(cfg))


@settings(max_examples=10)
@given(cfg=configs(arrivals=("piecewise",)))
def test_piecewise_poisson_arrivals(cfg):
    """PiecewisePoisson arrivals (rates r/4, 4r, r with changes at 200/r and
    600/r): every property above holds."""
    res, pol = run(cfg)
    for check in (check_conservation, check_batches, check_fifo, check_servers, check_metrics):
        check(cfg, res, pol)


@pytest.mark.parametrize("kind,arrivals,bins", [("dynamic", "poisson", 1), ("multibin", "poisson", 3),
                                                ("multibin", "saturated", 3), ("static", "replay", 1)])
def test_queues_grow_through_a_deep_backlog(kind, arrivals, bins):
    """A backlog of thousands of requests per bin: the ring buffers (1024
    requests to start with) double while arrivals keep coming, both while
    every server is busy and at one instant, and every property holds."""
    cfg = dict(kind=kind, b_min=1, b_max=8, bins=bins, d_sla=7.5e-3, eps_d=5e-5, alpha=4, delta=2,
               variant="spec", servers=2, arrivals=arrivals, rate=300.0, model="max", memory="l0",
               selection="round_robin", integer=True, sigma=0.0, prompt="uniform", output="uniform",
               n=7000, seed=5, pin=None, max_candidates=None, warmup=50, bin_b_max=None)
    res, pol = run(cfg)
    assert res.time_series["queue"].max() > 2 * 1024  # grown twice at least
    for check in (check_conservation, check_batches, check_fifo, check_servers):
        check(cfg, res, pol)


def test_piecewise_poisson_rates():
    """The arrival counts in [0, 100) and [100, 200) at rates 1 and 20 are
    Poisson(100) and Poisson(2000); 99.99% normal intervals."""
    arr = mb.PiecewisePoisson(rates=(1.0, 20.0, 2.0), ends=(100.0, 200.0))
    res = mb.simulate(mb.DynamicBatching(), arrivals=arr,
                      workload=mb.Workload(prompt=st.uniform(20, 200), output=st.uniform(1, 400)),
                      n=3000, seed=11, keep_requests=True)
    a = res.requests["arrival"]
    assert a.max() > 200.0
    for lo, hi, rate in ((0.0, 100.0, 1.0), (100.0, 200.0, 20.0)):
        mean = rate * (hi - lo)
        assert abs(np.count_nonzero((a >= lo) & (a < hi)) - mean) <= Z_9999 * math.sqrt(mean)


# --- 5. common random numbers, reproducibility ------------------------------

@given(cfg=configs(kinds=("dynamic",)), bins=hs.integers(2, 6))
def test_common_random_numbers_across_policies(cfg, bins):
    """One seed: the same arrivals, prompts, outputs and predictions for
    static, dynamic and multi-bin dynamic batching."""
    res_d, pol = run(cfg)
    res_s, _ = run({**cfg, "kind": "static"})
    res_m, _ = run({**cfg, "kind": "multibin", "bins": bins, "bin_b_max": None,
                    "warmup": max(bins, cfg["warmup"])})
    for f in ("arrival", "prompt", "output", "pred"):
        np.testing.assert_array_equal(res_s.requests[f], res_d.requests[f])
        np.testing.assert_array_equal(res_m.requests[f], res_d.requests[f])


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@given(cfg=configs())
def test_same_seed_is_bit_identical(cfg):
    res1, _ = run(cfg)
    res2, _ = run(cfg)
    m1, m2 = res1.metrics(), res2.metrics()
    assert m1.keys() == m2.keys()
    for k in m1:
        assert m1[k] == m2[k] or (math.isnan(m1[k]) and math.isnan(m2[k])), k
    _same(res1.requests, res2.requests)
    _same(res1.batches, res2.batches)
    _same(res1.time_series, res2.time_series)
    np.testing.assert_array_equal(res1.batch_size_hist, res2.batch_size_hist)
    np.testing.assert_array_equal(res1.edges, res2.edges)
    # streaming (no records) gives the same metrics
    res3, _ = run(cfg, keep_requests=False, keep_batches=False)
    m3 = res3.metrics()
    for k in m1:
        if k.startswith(("latency_p", "ttft_p")):
            # exact quantiles with records, histogram ones (within half a bucket) without
            assert m3[k] == pytest.approx(m1[k], rel=HIST_RELATIVE, abs=0), k
            continue
        assert m1[k] == m3[k] or (math.isnan(m1[k]) and math.isnan(m3[k])), k


# --- the controller replayed in Python --------------------------------------

def controller_config(pol):
    ctl, mem = pol.controller, pol.memory
    sla = c.SLA.pack(d_sla=ctl.d_sla, eps_d=ctl.eps_d, b_min=ctl.b_min, b_max=ctl.b_max, alpha=ctl.alpha,
                     delta=ctl.delta, ema=0.2,  # Algorithm 7's fixed EMA weight
                     variant=c.CTL_VARIANT_SPEC if ctl.variant == "spec" else c.CTL_VARIANT_MULTIPLICATIVE)
    memory = c.MEMORY.pack(eta=mem.eta, b_min=ctl.b_min, b_max=ctl.b_max, z=st.norm.ppf(1 - mem.eps_m),
                           default_tokens=500.0,  # Algorithm 1's default
                           variant=c.MEM_VARIANT_CLT if mem.variant == "clt" else c.MEM_VARIANT_L0)
    return sla, memory


@given(cfg=configs(kinds=("dynamic", "multibin"), arrivals=("poisson", "saturated"),
                   integer=False))
def test_controller_replay(cfg):
    """Replaying the recorded batches in event order through Algorithms 1, 2
    and 7 (one controller and one set of statistics per bin; feedback when a
    batch completes, before any batch formed at the same instant, with
    N_decode = requests still in service) reproduces every recorded b_SLA and
    b_mem exactly, and the sampled controller state of the time series.
    Continuous lengths and arrivals, so completion times never tie."""
    res, pol = run(cfg)
    assume(res.rejected == 0)  # a rejection re-runs Algorithm 2 unrecorded
    r, b = res.requests, res.batches
    end = b["start"] + b["service"]
    assume(np.unique(end).size == end.size)
    K = bins_of(pol)
    ccfg, mcfg = controller_config(pol)
    lim = np.zeros(K)
    if isinstance(pol, mb.MultiBinDynamic) and pol.bin_b_max is not None:
        lim[:] = pol.bin_b_max
    ctl = np.zeros((K, c.CONTROLLER.size))
    for k in range(K):
        c.controller_init(ctl[k], float(pol.controller.b_min), float(pol.controller.b_max))
    stats = np.zeros((K, c.BATCH_STATS.size))
    mem = members(res)
    model = MODELS[cfg["model"]]
    order = np.argsort(end, kind="stable")
    ptr = 0
    in_service = 0
    low = np.empty(res.n_batches)
    high = np.empty(res.n_batches)
    tau = np.empty(res.n_batches)
    for j in range(res.n_batches):
        while ptr < res.n_batches and order[ptr] < j and end[order[ptr]] <= b["start"][j]:
            d = order[ptr]
            ptr += 1
            in_service -= b["size"][d]
            tbt = (c.decode_tbt(model.beta, model.gamma, float(b["size"][d]))
                   if isinstance(model, mb.DecodeModel) else 0.0)
            k = b["bin"][d]
            c.feedback(ctl[k], stats[k], ccfg, r["prompt"][mem[d]], r["output"][mem[d]],
                       int(b["size"][d]), b["service"][d], tbt, float(in_service))
        k = b["bin"][j]
        bm = c.b_mem(stats[k], mcfg, k if isinstance(pol, mb.MultiBinDynamic) else -1, lim)
        bs = c.b_sla(ctl[k], ccfg)
        assert (bm, bs) == (b["b_mem"][j], b["b_sla"][j]), j
        low[j], high[j], tau[j] = ctl[k, c.C.b_low], ctl[k, c.C.b_high], ctl[k, c.C.tau_avg]
        in_service += b["size"][j]
    rows = ts_rows(res)
    np.testing.assert_array_equal(res.time_series["b_low"], low[rows])
    np.testing.assert_array_equal(res.time_series["b_high"], high[rows])
    np.testing.assert_array_equal(res.time_series["tau_avg"], tau[rows])


# --- 6. the pinned policy against the multi-bin theory ----------------------

@settings(max_examples=10)
@given(B=hs.integers(2, 32), k=hs.integers(1, 5),
       selection=hs.sampled_from(["round_robin", "longest_queue"]))
def test_pinned_saturated_matches_multibin_theory(B, k, selection):
    """Pinned b_target = B, memory off, MaxModel(base=0, per_token=1),
    saturated, one server: the multi-bin paper's model with output lengths
    U(0, L).  The warm-up window is the whole population (all arrive at 0), so
    Algorithm 6's edges are floored sample quantiles of it and no prediction
    lies below floor(min): Algorithm 4's fallback never fires.

    The mean service time of the full batches (size B) estimates the exact
    ``theory.batch_service_time(U(0, L), edges, B)`` at the edges used
    (res.edges, last upper end L); 99.99% CLT interval from the sample
    standard deviation of the full batches; and bin by bin, the mean of
    B uniforms' maximum on each bin (99.99% each).  The edges estimate the
    equal-mass ones (L = 20000 tokens makes the floors negligible), so the
    throughput B / mean also matches ``theory.throughput(B, 0, L, k)``
    (Theorem 4.2) within the same 99.99% interval widened by the exact change
    of the expected service time between the two sets of edges."""
    L = 20000.0
    n_full = 1500
    n = n_full * B
    pol = mb.MultiBinDynamic(bins=k, pin=B, controller=mb.SLAController(b_min=1, b_max=B),
                             memory=mb.Memory(enabled=False), warmup=n, selection=selection)
    dist = st.uniform(0, L)
    res = mb.simulate(pol, arrivals=mb.Saturated(),
                      workload=mb.Workload(prompt=st.uniform(0, 1e-9), output=dist,
                                           integer_lengths=False),
                      service_model=mb.MaxModel(base=0, per_token=1), n=n, seed=1000 * B + k,
                      keep_requests=True, keep_batches=True)
    b = res.batches
    mem = members(res)
    # batch service = max member output; batches are full but for the last of each bin
    np.testing.assert_array_equal(b["service"], [res.requests["output"][m].max() for m in mem])
    full = b["size"] == B
    assert (~full).sum() <= k
    assert (b["size"] <= B).all()
    # one server, never idle: span is the running sum of the service times
    assert res.span == np.cumsum(b["service"])[-1]
    s = b["service"][full]
    mean, half = s.mean(), Z_9999 * s.std(ddof=1) / math.sqrt(s.size)
    # the edges used: lower ends, and L for the last bin's upper end (10000
    # tokens in the kernel); the first lower end floor(min) lies below every
    # request, so the first bin reaches down to the support's end 0
    assert res.edges[0] <= res.requests["output"].min() and res.edges[-1] == c.EDGE_MAX
    edges = np.append(res.edges[:-1], L)
    edges[0] = 0.0
    exact = theory.batch_service_time(dist, edges, B)
    assert abs(mean - exact) <= half
    # bin by bin (99.99% each): a full batch of bin i is the max of B
    # uniforms on [e_i, e_i+1), mean e_i + (e_i+1 - e_i) B / (B + 1)
    for i in range(k):
        si = b["service"][full & (b["bin"] == i)]
        assert si.size >= n_full / k - 50
        assert ((si >= edges[i]) & (si < edges[i + 1])).all()
        h = Z_9999 * si.std(ddof=1) / math.sqrt(si.size)
        assert abs(si.mean() - (edges[i] + (edges[i + 1] - edges[i]) * B / (B + 1))) <= h
    # equal mass: the edge estimates move E[service] by far less than the interval
    ideal = theory.service_time(B, 0.0, L, k)
    np.testing.assert_allclose(edges, np.linspace(0, L, k + 1), atol=0.02 * L)
    bias = abs(exact - ideal)
    assert bias <= half / 2
    predicted = theory.throughput(B, 0.0, L, k)
    assert predicted == pytest.approx(B / ideal, rel=1e-12)
    assert B / (mean + half + bias) <= predicted <= B / (mean - half - bias)


# --- 7. fixed points of the controller ---------------------------------------

def drained(res, pol):
    """Per batch: whether its bin's queue held fewer than b_target requests
    (the end of a saturated run), so a short batch is expected."""
    b = res.batches
    waiting = np.empty(res.n_batches, np.int64)
    r = res.requests
    for j in range(res.n_batches):
        qb = queue_bin(res, pol, j)
        waiting[j] = np.count_nonzero((qb == b["bin"][j]) & (r["batch"] >= j))
    return waiting < b["b_target"]


def slack_fixed_point(b_max, alpha):
    """b_SLA under persistent slack with batches of b_SLA itself (Algorithm 2,
    case 2 every time): B_max - ceil(alpha/2) for alpha >= 3.

    Case 2 sets b_high = B_max and b_low = max(b_low, min(floor(b_avg),
    B_max - alpha)), so the interval ends at [B_max - alpha, B_max], whose
    midpoint floor((2 B_max - alpha) / 2) is B_max - ceil(alpha/2): for odd
    alpha one less than the B_max - floor(alpha/2) of controller.py's
    docstring.  (For alpha <= 2 the walk stops at B_max - 2 while floor(b_avg)
    = b_SLA - 1, i.e. as long as the EMA of a constant batch size has not
    reached it; in floating point it reaches some integers exactly and others
    never, so B_max - 1 or B_max - 2; not tested.)"""
    return b_max - (alpha + 1) // 2


@settings(max_examples=12)
@given(kind=hs.sampled_from(["dynamic", "multibin"]), bins=hs.integers(1, 3),
       b_min=hs.integers(1, 4), extra=hs.integers(8, 60), alpha=hs.sampled_from([3, 4, 5, 6, 7]),
       model=hs.sampled_from(["decode", "max"]), clt=hs.booleans(), tight=hs.booleans(),
       seed=hs.integers(0, 1000))
def test_slack_settles_at_b_max_minus_half_alpha_or_b_mem(kind, bins, b_min, extra, alpha, model,
                                                          clt, tight, seed):
    """D_SLA = 1 s/token is never violated; saturated, one server, memory on.
    Over the last half of the batches b_target = min(b_mem, fixed point of
    Algorithm 2) batch by batch, and the batch is that large unless its bin
    has fewer requests left.

    The issue text says min(B_max, b_mem), but Algorithm 2's case 2 never
    raises b_low above b_high - alpha, so under persistent slack b_SLA settles
    at :func:`slack_fixed_point`, not at B_max.  When b_mem binds (tight
    memory: eta = 20,000 tokens, b_mem about 18,000 / 320 = 56 < B_max - alpha
    with B_max = 200), b_SLA stays far above it and b_target = b_mem batch by
    batch.  One server, so N_decode = 0 at every feedback."""
    b_max = 200 if tight else b_min + extra
    mem = mb.Memory(m_max_gb=16.0 if tight else 80.0, variant="clt" if clt else "l0")
    ctl = mb.SLAController(d_sla=1.0, b_min=b_min, b_max=b_max, alpha=alpha)
    pol = (mb.DynamicBatching(controller=ctl, memory=mem) if kind == "dynamic"
           else mb.MultiBinDynamic(bins=bins, controller=ctl, memory=mem, warmup=50))
    n = 250 * bins_of(pol) * min(b_max, 60)
    res = mb.simulate(pol, arrivals=mb.Saturated(),
                      workload=mb.Workload(prompt=st.uniform(20, 200), output=st.uniform(1, 400)),
                      service_model=MODELS[model], n=n, seed=seed,
                      keep_requests=True, keep_batches=True)
    b = res.batches
    assert res.rejected == 0 and res.sla_infeasible == 0
    assert res.sla_violation_tokens == 0
    late = np.arange(res.n_batches) >= res.n_batches // 2
    fixed = slack_fixed_point(b_max, alpha)
    np.testing.assert_array_equal(b["b_target"][late], np.minimum(b["b_mem"][late], fixed))
    if not tight:
        # b_mem = floor(0.9 * 180000 / E[tokens]) > 300 is clamped to B_max
        assert (b["b_mem"] == b_max).all()
        assert (b["b_sla"][late] == fixed).all()
        short = b["size"] < b["b_target"]
        np.testing.assert_array_equal(short[late], drained(res, pol)[late])
    else:
        assert (b["b_mem"][late] < fixed - alpha).all()
        assert (b["b_sla"][late] > b["b_mem"][late]).all()
        assert (b["tokens"] <= mem.eta).all()


@pytest.mark.parametrize("alpha, expected", [(4, 38), (5, 37), (6, 37), (7, 36)])
def test_slack_fixed_point_for_odd_alpha(alpha, expected):
    """B_max = 40: persistent slack pins the interval at [40 - alpha, 40],
    whose midpoint, rounded down, is 40 - ceil(alpha/2) (as ``b_sla`` in
    ``_kernels/controller.py`` documents): 38, 37, 37, 36."""
    ctl = mb.SLAController(d_sla=1.0, b_min=1, b_max=40, alpha=alpha)
    res = mb.simulate(mb.DynamicBatching(controller=ctl), arrivals=mb.Saturated(),
                      workload=mb.Workload(prompt=st.uniform(20, 200), output=st.uniform(1, 400)),
                      service_model=mb.DecodeModel(), n=6000, seed=3, keep_batches=True)
    bs = res.batches["b_sla"]
    assert (bs[50:-1] == expected).all()
    assert bs.max() == expected


@settings(max_examples=12)
@given(kind=hs.sampled_from(["dynamic", "multibin"]), bins=hs.integers(1, 3),
       b_min=hs.integers(1, 8), extra=hs.integers(6, 80), alpha=hs.sampled_from([2, 4, 5]),
       saturated=hs.booleans(), seed=hs.integers(0, 1000))
def test_unreachable_sla_drives_b_sla_to_b_min_plus_half_alpha(kind, bins, b_min, extra, alpha,
                                                               saturated, seed):
    """D_SLA = 1e-3 s/token is below TBT(1) = beta = 5.74e-3 s/token of the
    DecodeModel: every feedback after the warm-up is Algorithm 2's case 1, and
    b_SLA settles at B_min + floor(alpha/2) (case 1 never pulls b_high below
    b_low + alpha; B_max - B_min >= alpha here); ``sla_infeasible`` is 1.
    One server, so N_decode = 0."""
    b_max = b_min + max(extra, alpha)
    ctl = mb.SLAController(d_sla=1e-3, b_min=b_min, b_max=b_max, alpha=alpha)
    pol = (mb.DynamicBatching(controller=ctl) if kind == "dynamic"
           else mb.MultiBinDynamic(bins=bins, controller=ctl, warmup=50))
    n = 300 * bins_of(pol) * (b_min + alpha)
    # far above capacity: TBT(b) * E[max output] >= 5.74e-3 * 200 s per batch
    arr = mb.Saturated() if saturated else mb.Poisson(rate=1000.0)
    res = mb.simulate(pol, arrivals=arr,
                      workload=mb.Workload(prompt=st.uniform(20, 200), output=st.uniform(1, 400)),
                      service_model=mb.DecodeModel(), n=n, seed=seed, keep_batches=True)
    b = res.batches
    late = np.arange(res.n_batches) >= res.n_batches // 2
    assert (b["b_sla"][late] == b_min + alpha // 2).all()
    assert res.sla_infeasible == 1
    assert res.sla_violation_tokens == 1.0 and res.sla_violation_requests == 1.0


@settings(max_examples=12)
@given(kind=hs.sampled_from(["dynamic", "multibin"]), bins=hs.integers(1, 4),
       d_sla=hs.sampled_from([BETA * (1 + GAMMA) + 1e-4, 0.02, 1.0]),
       servers=hs.integers(1, 3), rate=hs.sampled_from([5.0, 1000.0]), seed=hs.integers(0, 1000))
def test_comfortable_sla_is_feasible(kind, bins, d_sla, servers, rate, seed):
    """D_SLA above the largest decode time per token TBT(inf) = beta (1 + gamma):
    no token is ever late and the run is not flagged infeasible."""
    ctl = mb.SLAController(d_sla=d_sla, b_min=1, b_max=64)
    pol = (mb.DynamicBatching(controller=ctl) if kind == "dynamic"
           else mb.MultiBinDynamic(bins=bins, controller=ctl, warmup=50))
    res = mb.simulate(pol, arrivals=mb.Poisson(rate=rate),
                      workload=mb.Workload(prompt=st.uniform(20, 200), output=st.uniform(1, 400)),
                      service_model=mb.DecodeModel(), n=3000, servers=servers, seed=seed)
    assert res.sla_infeasible == 0
    assert res.sla_violation_tokens == 0 and res.sla_violation_requests == 0
    assert res.mean_tbt <= BETA * (1 + GAMMA)


# --- 8. metrics -------------------------------------------------------------

def ts_rows(res):
    """Batch indices of the time-series rows: every s-th batch, s the least
    power of two keeping at most 512 rows."""
    nb = res.n_batches
    s = 1
    while -(-nb // s) > 512:
        s *= 2
    return np.arange(0, nb, s)


def per_token_time(model, service, size, max_out):
    if isinstance(model, mb.DecodeModel):
        return model.beta * (1 + model.gamma * (size - 1) / np.maximum(1, size))
    return service / np.maximum(max_out, 1.0)


def check_metrics(cfg, res, pol):
    """Every metric from the per-request and per-batch records."""
    r, b = res.requests, res.batches
    m = res.metrics()
    served = r["batch"] >= 0
    nb = res.n_batches
    c_ = cfg["servers"]
    eta = eta_of(pol)
    model = MODELS[cfg["model"]]
    assert m["completed"] == served.sum() and m["n_batches"] == nb
    span = r["completion"][served].max() - r["arrival"][0]
    assert m["span"] == span
    out = r["output"][served].sum()
    assert m["throughput"] == pytest.approx(served.sum() / span, rel=1e-12)
    assert m["token_throughput"] == pytest.approx(out / span, rel=1e-9)
    lat = r["latency"][served]
    assert m["mean_latency"] == pytest.approx(lat.mean(), rel=1e-9)
    np.testing.assert_allclose([m["latency_p50"], m["latency_p95"], m["latency_p99"]],
                               np.quantile(lat, [0.5, 0.95, 0.99], method="inverted_cdf"), rtol=1e-12)
    assert m["mean_ttft"] == pytest.approx(r["ttft"][served].mean(), rel=1e-9)
    # TTFT: one decode step (and the prefill) after the batch starts
    mem = members(res)
    max_out = np.array([r["output"][mm].max() for mm in mem])
    ptok = per_token_time(model, b["service"], b["size"], max_out)
    j = r["batch"][served]
    prefill = (model.prefill_per_token * np.array([r["prompt"][mm].sum() for mm in mem])
               if isinstance(model, mb.DecodeModel) else 0.0 * ptok)
    # (capped at the batch's service: a batch whose outputs are all under one
    # token, possible with integer_lengths=False, ends before a full step)
    np.testing.assert_allclose(r["ttft"][served] - (r["start"][served] - r["arrival"][served]),
                               np.minimum(prefill[j] + ptok[j], b["service"][j]), rtol=1e-9, atol=1e-12)
    if cfg["integer"]:
        # with whole tokens (max output >= 1) the first token comes before the last
        # (up to rounding: (start - arrival) + TTFT against (start + service) - arrival)
        tol = 1e-12 * r["completion"][served]
        assert (r["ttft"][served] <= r["latency"][served] + tol).all()
        assert m["mean_ttft"] <= m["mean_latency"] + tol.max()
    # service time of each batch by its model
    if isinstance(model, mb.MaxModel):
        expect = model.base + model.per_token * max_out
    elif isinstance(model, mb.LinearModel):
        seq = np.array([np.max(r["prompt"][mm] + r["output"][mm]) for mm in mem])
        sz = b["size"].astype(float)
        expect = model.base + model.alpha * seq * (1 + model.beta * (sz - 1) / sz)
    else:
        expect = prefill + ptok * max_out
    np.testing.assert_allclose(b["service"], expect, rtol=1e-12)
    # SLA: a batch is late when its decode time per token exceeds D_SLA + eps_D
    sla = pol.controller if isinstance(pol, mb.DynamicBatching) else pol.sla
    late = ptok > sla.d_sla + sla.eps_d
    out_b = np.array([r["output"][mm].sum() for mm in mem])
    assert m["sla_violation_requests"] == pytest.approx(b["size"][late].sum() / served.sum(),
                                                        rel=1e-12, abs=0)
    assert m["sla_violation_tokens"] == pytest.approx(out_b[late].sum() / out, rel=1e-9, abs=1e-15)
    assert 0 <= m["sla_violation_tokens"] <= 1 and 0 <= m["sla_violation_requests"] <= 1
    assert m["mean_tbt"] == pytest.approx((ptok * out_b).sum() / out, rel=1e-9)
    check_token_times(m, r, served, mem, ptok)
    # servers and memory
    assert m["utilization"] == pytest.approx(b["service"].sum() / (c_ * span), rel=1e-9)
    assert 0 < m["utilization"] <= 1 + 1e-12
    assert m["memory_peak"] == b["tokens"].max() / eta
    assert m["mean_memory"] == pytest.approx((b["tokens"] * b["service"]).sum() / (c_ * span * eta),
                                             rel=1e-9)
    if memory_on(pol):
        assert m["memory_peak"] <= 1
    # batch sizes
    assert m["mean_batch_size"] == pytest.approx(b["size"].mean(), rel=1e-12)
    assert m["std_batch_size"] == pytest.approx(b["size"].std(), rel=1e-6, abs=1e-6)
    hist = res.batch_size_hist
    assert hist.sum() == nb
    np.testing.assert_array_equal(hist, np.bincount(b["size"], minlength=hist.size))
    lo, hi = m["mean_latency_ci_low"], m["mean_latency_ci_high"]
    if not math.isnan(lo):
        assert lo <= m["mean_latency"] <= hi
    # the time series: every s-th batch, as recorded
    ts = res.time_series
    rows = ts_rows(res)
    assert (np.diff(ts["time"]) >= 0).all()
    np.testing.assert_array_equal(ts["time"], b["start"][rows])
    np.testing.assert_array_equal(ts["batch_size"], b["size"][rows])
    np.testing.assert_array_equal(ts["b_target"], b["b_target"][rows])
    np.testing.assert_array_equal(ts["batch_bin"], b["bin"][rows])
    assert ts["queue"].shape == (rows.size, bins_of(pol))
    if res.rejected == 0:
        for i, jb in enumerate(rows):
            qb = queue_bin(res, pol, jb)
            # queued after batch jb left: arrived by its start, served later
            # (batches formed at the same instant come later)
            wait = (r["arrival"] <= b["start"][jb]) & (r["batch"] > jb)
            np.testing.assert_array_equal(ts["queue"][i],
                                          np.bincount(qb[wait], minlength=bins_of(pol)))


#: the largest relative error of a quantile read off the kernels' histograms:
#: half a bucket, buckets 2**-10 of an octave wide
HIST_RELATIVE = 2.0 ** -11


def check_token_times(m, r, served, mem, ptok):
    """The time to first token's quantiles (exact: the records are kept) and
    the time between tokens' (from the histogram): each batch's decode time
    per token ``ptok``, recomputed from its model, once for each gap between
    two tokens of each member (a member of output o has max(o - 1, 0) of
    them), against plain-Python weighted quantiles."""
    qs = (0.5, 0.95, 0.99)
    np.testing.assert_array_equal([m["ttft_p50"], m["ttft_p95"], m["ttft_p99"]],
                                  np.quantile(r["ttft"][served], qs, method="inverted_cdf"))
    gaps = np.array([token_gaps(r["output"][mm]).sum() for mm in mem])
    expect = weighted_quantiles(ptok, gaps, qs)
    got = np.array([m["tbt_p50"], m["tbt_p95"], m["tbt_p99"]])
    if gaps.sum() == 0:
        assert np.isnan(got).all()     # (every output one token or less: no gap)
    else:
        np.testing.assert_allclose(got, expect, rtol=HIST_RELATIVE * (1 + 1e-9), atol=0)
        assert ptok.min() * (1 - HIST_RELATIVE) <= got.min() and got.max() <= ptok.max() * (1 + HIST_RELATIVE)


@given(cfg=configs())
def test_metrics_recomputed_from_records(cfg):
    check_metrics(cfg, *run(cfg))


# --- 9. warm-up, Algorithms 6 and 4 ------------------------------------------

def numpy_edges(pred, K):
    """Algorithm 6 in numpy: floors of the linspace quantiles, last upper 10000
    (the K + 1 edges of K bins that tile [edges[0], edges[K]))."""
    if K == 1:
        return np.array([0.0, 10000.0])
    e = np.floor(np.quantile(pred, np.linspace(0, 1, K + 1)))
    e[-1] = 10000.0
    return e


def numpy_partition(pred, e):
    """Algorithm 4 in numpy: the first i with lo <= pred < hi, else K - 1."""
    K = e.shape[0] - 1
    inside = (e[:-1][None, :] <= pred[:, None]) & (pred[:, None] < e[1:][None, :])
    return np.where(inside.any(axis=1), np.argmax(inside, axis=1), K - 1)


@given(cfg=configs(kinds=("multibin",)), large_sigma=hs.booleans())
def test_warmup_edges_and_bins(cfg, large_sigma):
    """The warm-up time is the arrival of request ``warmup``; the edges are
    Algorithm 6 on the first ``warmup`` predictions (numpy); requests served
    before then are in bin 0, the rest in their Algorithm 4 bin (numpy)."""
    if large_sigma:
        cfg = {**cfg, "sigma": 1.5}
    res, pol = run(cfg)
    r = res.requests
    K, W = pol.bins, pol.warmup
    served = r["batch"] >= 0
    if K == 1 or W > cfg["n"]:
        # one bin: no warm-up; too few requests: never binned
        assert math.isnan(res.warmup_time)
        np.testing.assert_array_equal(r["bin"][served], 0)
        np.testing.assert_array_equal(res.edges, [0.0] * K + [10000.0])
        return
    assert res.warmup_time == r["arrival"][W - 1]
    e = numpy_edges(r["pred"][:W], K)
    np.testing.assert_array_equal(res.edges, e)
    before = served & (r["start"] < res.warmup_time)
    after = served & (r["start"] >= res.warmup_time)
    np.testing.assert_array_equal(r["bin"][before], 0)
    np.testing.assert_array_equal(r["bin"][after], numpy_partition(r["pred"][after], e))
    # nothing is served before it arrived in the warm-up window
    assert not (before & (np.arange(cfg["n"]) >= W) & (r["arrival"] > res.warmup_time)).any()
    # predictions: the oracle, or log-normal error, rounded up with integer lengths
    if cfg["sigma"] == 0:
        np.testing.assert_array_equal(r["pred"], r["output"])
    elif cfg["integer"]:
        assert (r["pred"] == np.ceil(r["pred"])).all() and (r["pred"] >= 1).all()


# --- 10. selection rules on a hand-computed trace ---------------------------

#: arrival (s) and output length (tokens) of 13 requests; prompts are 1 token.
#: Policy: 2 bins, warm-up 2, pinned b_target = 2, memory off, one server,
#: MaxModel(base=0, per_token=1): a batch takes its largest output in seconds.
#:
#: Warm-up: r0 (t=0, out 10) arrives alone and is served alone in bin 0 on
#: [0, 10).  r1 (t=1, out 2) completes the window {10, 2}: quantiles at 0,
#: 0.5, 1 are 2, 6, 10, so bin 0 = [2, 6) and bin 1 = [6, 10000).  Then
#: r1 (2), r3 (3), r7 (4), r8 (5), r11 (2), r12 (3) go to bin 0 and r2 (7),
#: r4 (8), r5 (9), r9 (6), r10 (7) to bin 1; r6 (1) lies below every bin and
#: falls back to the last bin, bin 1 (Algorithm 4).
#: At t = 10: bin 0 = [r1, r3, r7, r8], bin 1 = [r2, r4, r5, r6].
TRACE_T = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 12.0, 13.0, 50.0, 50.5]
TRACE_OUT = [10, 2, 7, 3, 8, 9, 1, 4, 5, 6, 7, 2, 3]

#: Round robin.  Serving r0 at t = 0 already took bin 0, so the pointer is at 1.
#:   t=10: bin 1 -> [r2, r4], max(7, 8) = 8, on [10, 18); pointer 0
#:   (r9 at 12 and r10 at 13 join bin 1 = [r5, r6, r9, r10])
#:   t=18: bin 0 -> [r1, r3], 3, on [18, 21); pointer 1
#:   t=21: bin 1 -> [r5, r6], 9, on [21, 30); pointer 0
#:   t=30: bin 0 -> [r7, r8], 5, on [30, 35); pointer 1
#:   t=35: bin 1 -> [r9, r10], 7, on [35, 42); pointer 0; then idle
#:   t=50: r11 arrives, bin 0 -> [r11], 2, on [50, 52); pointer 1
#:   (r12 arrives at 50.5 into bin 0)
#:   t=52: bin 1 is empty and is skipped: bin 0 -> [r12], 3, on [52, 55)
ROUND_ROBIN = dict(
    batches=[[0], [2, 4], [1, 3], [5, 6], [7, 8], [9, 10], [11], [12]],
    start=[0, 10, 18, 21, 30, 35, 50, 52], service=[10, 8, 3, 9, 5, 7, 2, 3],
    bin=[0, 1, 0, 1, 0, 1, 0, 0])

#: Longest queue (ties to the lower bin).
#:   t=10: sizes (4, 4), tie -> bin 0: [r1, r3], 3, on [10, 13); bin 0 = [r7, r8]
#:   (r9 at 12 -> bin 1 holds 5)
#:   t=13: the completion and r10's arrival coincide; the batch is formed after
#:   both: sizes (2, 6) -> bin 1: [r2, r4], 8, on [13, 21)
#:   t=21: sizes (2, 4) -> bin 1: [r5, r6], 9, on [21, 30)
#:   t=30: sizes (2, 2), tie -> bin 0: [r7, r8], 5, on [30, 35)
#:   t=35: sizes (0, 2) -> bin 1: [r9, r10], 7, on [35, 42)
#:   t=50: [r11] on [50, 52); t=52: [r12] on [52, 55)
LONGEST_QUEUE = dict(
    batches=[[0], [1, 3], [2, 4], [5, 6], [7, 8], [9, 10], [11], [12]],
    start=[0, 10, 13, 21, 30, 35, 50, 52], service=[10, 3, 8, 9, 5, 7, 2, 3],
    bin=[0, 0, 1, 1, 0, 1, 0, 0])


@pytest.mark.parametrize("selection, expected", [("round_robin", ROUND_ROBIN),
                                                 ("longest_queue", LONGEST_QUEUE)])
def test_selection_rule_on_hand_trace(selection, expected):
    pol = mb.MultiBinDynamic(bins=2, warmup=2, pin=2, selection=selection,
                             controller=mb.SLAController(b_min=1, b_max=2),
                             memory=mb.Memory(enabled=False))
    res = mb.simulate(pol, arrivals=mb.Replay(TRACE_T),
                      workload=mb.Workload(prompt=np.ones(13), output=TRACE_OUT),
                      service_model=mb.MaxModel(base=0, per_token=1), seed=0,
                      keep_requests=True, keep_batches=True)
    np.testing.assert_array_equal(res.edges, [2, 6, 10000])
    assert res.warmup_time == 1.0
    assert [m.tolist() for m in members(res)] == expected["batches"]
    np.testing.assert_array_equal(res.batches["start"], expected["start"])
    np.testing.assert_array_equal(res.batches["service"], expected["service"])
    np.testing.assert_array_equal(res.batches["bin"], expected["bin"])
    assert res.span == 55.0
    assert res.n_batches == 8 and res.completed == 13


def test_static_and_dynamic_on_hand_trace():
    """One FIFO on the same trace: static B = 2 takes the first two waiting
    requests whenever the server frees, never waiting for a full batch.
      t=0: [r0] 10 on [0, 10); t=10: [r1, r2] 7; t=17: [r3, r4] 8;
      t=25: [r5, r6] 9; t=34: [r7, r8] 5; t=39: [r9, r10] 7 until 46;
      t=50: [r11] 2; t=52: [r12] 3 until 55."""
    expect = [[0], [1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11], [12]]
    starts = [0, 10, 17, 25, 34, 39, 50, 52]
    for pol in (mb.StaticBatching(batch_size=2),
                mb.DynamicBatching(pin=2, controller=mb.SLAController(b_min=1, b_max=2),
                                   memory=mb.Memory(enabled=False))):
        res = mb.simulate(pol, arrivals=mb.Replay(TRACE_T),
                          workload=mb.Workload(prompt=np.ones(13), output=TRACE_OUT),
                          service_model=mb.MaxModel(base=0, per_token=1), seed=0,
                          keep_requests=True, keep_batches=True)
        assert [m.tolist() for m in members(res)] == expect
        np.testing.assert_array_equal(res.batches["start"], starts)
        assert res.span == 55.0


# --- 11. configuration errors -----------------------------------------------

WL = mb.Workload(prompt=st.uniform(1, 10), output=st.uniform(1, 10))


@pytest.mark.parametrize("make, exc, name", [
    (lambda: mb.SLAController(b_min=5, b_max=4), ValueError, "b_min"),
    (lambda: mb.SLAController(d_sla=-1e-3), ValueError, "d_sla"),
    (lambda: mb.SLAController(d_sla=0.0), ValueError, "d_sla"),
    (lambda: mb.SLAController(eps_d=-1.0), ValueError, "eps_d"),
    (lambda: mb.SLAController(b_min=0), ValueError, "b_min"),
    (lambda: mb.SLAController(b_max=2.5), TypeError, "b_max"),
    (lambda: mb.SLAController(alpha=-1), ValueError, "alpha"),
    (lambda: mb.SLAController(variant="pid"), ValueError, "variant"),
    (lambda: mb.Memory(m_max_gb=8.0, m_model_gb=8.0), ValueError, "m_model_gb"),
    (lambda: mb.Memory(m_max_gb=4.0), ValueError, "m_model_gb"),
    (lambda: mb.Memory(kv_mem_per_token_gb=0.0), ValueError, "kv_mem_per_token_gb"),
    (lambda: mb.Memory(variant="gauss"), ValueError, "variant"),
    (lambda: mb.Memory(eps_m=1.0), ValueError, "eps_m"),
    (lambda: mb.Memory(enabled=1), TypeError, "enabled"),
    (lambda: mb.MultiBinDynamic(bins=4, warmup=3), ValueError, "warmup"),
    (lambda: mb.MultiBinDynamic(bins=0), ValueError, "bins"),
    (lambda: mb.MultiBinDynamic(bins=2, bin_b_max=(4, 4, 4)), ValueError, "bin_b_max"),
    (lambda: mb.MultiBinDynamic(bins=2, bin_b_max=(4, 0)), ValueError, "bin_b_max"),
    (lambda: mb.MultiBinDynamic(selection="shortest"), ValueError, "selection"),
    (lambda: mb.DynamicBatching(pin=300), ValueError, "pin"),
    (lambda: mb.MultiBinDynamic(pin=5, controller=mb.SLAController(b_max=4)), ValueError, "pin"),
    (lambda: mb.DynamicBatching(max_candidates=0), ValueError, "max_candidates"),
    (lambda: mb.DynamicBatching(controller=mb.Memory()), TypeError, "controller"),
    (lambda: mb.DynamicBatching(memory=mb.SLAController()), TypeError, "memory"),
    (lambda: mb.StaticBatching(batch_size=0), ValueError, "batch_size"),
    (lambda: mb.StaticBatching(batch_size=4, sla=mb.Memory()), TypeError, "sla"),
    (lambda: mb.Workload(prompt=st.uniform(-1, 2), output=st.uniform(1, 10)), ValueError, "prompt"),
    (lambda: mb.Workload(prompt=st.uniform(1, 10), output=st.norm(100, 10)), ValueError, "output"),
    (lambda: mb.Workload(prompt=[1.0, -2.0], output=[1.0, 2.0]), ValueError, "prompt"),
    (lambda: mb.Workload(prompt=st.uniform(1, 10), output=st.uniform(1, 10), integer_lengths=1),
     TypeError, "integer_lengths"),
    (lambda: mb.Workload(prompt=st.uniform(1, 10), output=st.uniform(1, 10), predictor_sigma=-0.1),
     ValueError, "predictor_sigma"),
    (lambda: mb.MaxModel(per_token=0.0), ValueError, "per_token"),
    (lambda: mb.PiecewisePoisson(rates=(1.0, -2.0), ends=(5.0,)), ValueError, "rates"),
    (lambda: mb.PiecewisePoisson(rates=(1.0, 2.0), ends=()), ValueError, "ends"),
    (lambda: mb.PiecewisePoisson(rates=(1.0, 2.0, 3.0), ends=(5.0, 4.0)), ValueError, "ends"),
    (lambda: mb.DecodeModel(beta=-1.0), ValueError, "beta"),
    (lambda: mb.simulate(mb.DynamicBatching(), arrivals=mb.Poisson(1.0), workload=WL, n=10,
                         servers=math.inf), ValueError, "servers"),
    (lambda: mb.simulate(mb.StaticBatching(4), arrivals=mb.Poisson(1.0), workload=WL, n=10,
                         servers=0), ValueError, "servers"),
    (lambda: mb.simulate(mb.DynamicBatching(), arrivals=mb.Replay([0.0, 1.0]), workload=mb.Workload(
        prompt=[1.0, 2.0, 3.0], output=[1.0, 2.0, 3.0]), n=3), ValueError, "has 2 values but"),
    (lambda: mb.simulate(mb.DynamicBatching(), arrivals=mb.Poisson(1.0), service=st.uniform(1, 2),
                         n=10), TypeError, "workload"),
    (lambda: mb.simulate(mb.MultiBinDynamic(), arrivals=mb.Poisson(1.0), workload=WL, n=10,
                         service_model=mb.Memory()), TypeError, "service_model"),
    (lambda: mb.simulate(mb.StaticBatching(4), arrivals=mb.Poisson(1.0), workload=st.uniform(1, 2),
                         n=10), TypeError, "workload"),
    (lambda: mb.simulate(mb.StaticBatching(4), arrivals=mb.Poisson(1.0), workload=WL, n=10,
                         keep_batches=1), TypeError, "keep_batches"),
])
def test_bad_input_names_the_parameter(make, exc, name):
    with pytest.raises(exc, match=name):
        make()


def test_the_iteration_models_step_is_compiled_apart_on_first_use():
    """mb.warmup() compiles none of the iteration model's batch time (the
    event kernel calls it by address); a process's first run under an
    IterationModel does, and a run under another model never."""
    code = ("import mbbatch as mb\n"
            "from mbbatch._kernels import common, dynamic\n"
            "mb.warmup()\n"
            "key = ('timing', dynamic.MODEL_ITERATION)\n"
            "wl = mb.Workload([10.0], [5.0])\n"
            "mb.simulate(mb.StaticBatching(2), mb.Poisson(1.0), workload=wl, service_model=mb.DecodeModel(), n=20)\n"
            "print(key in common._COMPILED)\n"
            "mb.simulate(mb.StaticBatching(2), mb.Poisson(1.0), workload=wl, service_model=mb.IterationModel(),"
            " n=20)\n"
            "print(key in common._COMPILED)\n")
    got = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["False", "True"]


@pytest.mark.filterwarnings("ignore::mbbatch.arrivals.TraceTiledWarning")
@pytest.mark.parametrize("policy", [mb.DynamicBatching(), mb.StaticBatching(8), mb.MultiBinDynamic(bins=3)])
def test_a_trace_repeated_in_the_kernel_equals_the_same_times_given_whole(policy):
    """A replayed trace shorter than n is repeated end to end in the kernel;
    the run equals one given every arrival time up front (the same times,
    never repeated).  The kernel once read the time of the next arrival,
    where a block of draws ends, from beyond the trace's end (memory past
    it: a result that changed with the process's history); with 3 servers
    and the linear model that read decided whether a batch started."""
    times = np.cumsum(np.random.default_rng(5).exponential(0.3, 500))
    wl = mb.Workload(prompt=st.lognorm(0.7, scale=200), output=st.lognorm(0.9, scale=100))
    kw = dict(workload=wl, service_model=mb.LinearModel(), n=1500, seed=13, servers=3, keep_requests=True)
    tiled = mb.simulate(policy, mb.Replay(times), **kw)
    whole = mb.simulate(policy, mb.Replay(tiled.requests.arrival.copy()), **kw)
    np.testing.assert_array_equal(tiled.requests.arrival, whole.requests.arrival)
    for col in ("start", "completion", "batch"):
        np.testing.assert_array_equal(getattr(tiled.requests, col), getattr(whole.requests, col), err_msg=col)
    assert tiled.n_batches == whole.n_batches
