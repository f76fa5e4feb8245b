"""Controller kernels: Algorithms 1, 2, 4, 6 and 7 line by line on hand-computed
values, the Section 2.2-2.3 variants, agreement with numpy (quantiles, Welford)
and hypothesis invariants of the closed feedback loop.

The hand values use binary-exact configurations (D_SLA = 0.5, eps_D = 0.125)
so that the band edges D_SLA +- eps_D are exact and the case boundaries can be
tested at equality.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from mbbatch._kernels import controller as c

ROOT = Path(__file__).resolve().parents[1]

# --- helpers ---------------------------------------------------------------


def ccfg(D=0.5, eps=0.125, B_min=1.0, B_max=64.0, alpha=4.0, delta=2.0, variant=0, ema=0.2):
    return c.SLA.pack(d_sla=D, eps_d=eps, b_min=B_min, b_max=B_max, alpha=alpha, delta=delta, variant=variant,
                      ema=ema)


def ctl(b_low, b_high, tau, b_avg, n_decode=0.0, updates=10.0):
    out = np.zeros(c.CONTROLLER.size)
    out[c.C.b_low] = b_low
    out[c.C.b_high] = b_high
    out[c.C.tau_avg] = tau
    out[c.C.b_avg] = b_avg
    out[c.C.n_decode] = n_decode
    out[c.C.updates] = updates
    return out


def mcfg(eta, B_min=1.0, B_max=64.0, variant=0, z=1.645, default=500.0):
    return c.MEMORY.pack(eta=eta, b_min=B_min, b_max=B_max, variant=variant, z=z, default_tokens=default)


def stats(prompt=0.0, output=0.0, count=0.0, mean=0.0, m2=0.0):
    out = np.zeros(c.BATCH_STATS.size)
    out[c.T.avg_prompt] = prompt
    out[c.T.avg_output] = output
    out[c.T.count] = count
    out[c.T.mean_tokens] = mean
    out[c.T.m2_tokens] = m2
    return out


NO_LIMIT = np.zeros(2)


def interval(state):
    return state[c.C.b_low], state[c.C.b_high]


def test_state_rows_are_laid_out_in_order():
    # the state rows are read by name (c.C, c.T) everywhere, by position nowhere
    assert list(c.C) == list(range(c.CONTROLLER.size))
    assert list(c.T) == list(range(c.BATCH_STATS.size))
    assert c.SLA.unpack(ccfg())["d_sla"] == 0.5 and c.MEMORY.unpack(mcfg(7.0))["eta"] == 7.0


def test_controller_init():
    state = np.full(c.CONTROLLER.size, 7.0)
    c.controller_init(state, 2.0, 48.0)
    np.testing.assert_array_equal(state, [2.0, 48.0, 0.0, 0.0, 0.0, 0.0])


def test_kernels_run_on_rows_of_a_per_bin_array():
    # a kernel holds one controller per bin as the rows of a 2-D array
    states = np.zeros((3, c.CONTROLLER.size))
    for k in range(3):
        c.controller_init(states[k], 1.0, 64.0)
    p = np.array([10.0])
    c.feedback(states[1], np.zeros(c.BATCH_STATS.size), ccfg(), p, p, 1, 1.0, 0.0, 0.0)
    assert states[1, c.C.updates] == 1.0
    assert states[0, c.C.updates] == 0.0 and states[2, c.C.updates] == 0.0


# --- Algorithm 1: b_mem, L0 variant ------------------------------------------

def test_alg1_step1_token_capacity():
    # (80 - 16) GB / (1/1024 GB/token) = 64 * 1024 = 65536 tokens
    assert c.token_capacity(80.0, 16.0, 1.0 / 1024.0) == 65536.0


def test_alg1_default_500_tokens_without_stats():
    # E_l_total = 0 + 0 <= 0 -> 500; L0 = 1000; floor(9000 / 500) = 18
    assert c.b_mem(stats(), mcfg(10000.0), -1, NO_LIMIT) == 18


def test_alg1_default_tokens_come_from_mcfg():
    # floor(9000 / 250) = 36
    assert c.b_mem(stats(), mcfg(10000.0, default=250.0), -1, NO_LIMIT) == 36


def test_alg1_uses_avg_prompt_plus_output_and_l0_is_tenth_of_eta():
    # E = 100 + 200 = 300; L0 = 0.1 * 10000 = 1000; (10000 - 1000) / 300 = 30
    assert c.b_mem(stats(100.0, 200.0), mcfg(10000.0), -1, NO_LIMIT) == 30


def test_alg1_floors():
    # E = 80 + 200 = 280; 9000 / 280 = 32.14... -> 32
    assert c.b_mem(stats(80.0, 200.0), mcfg(10000.0), -1, NO_LIMIT) == 32
    # 9000 / 299 = 30.1 -> 30 (just above an integer); 9000 / 301 = 29.9 -> 29
    assert c.b_mem(stats(99.0, 200.0), mcfg(10000.0), -1, NO_LIMIT) == 30
    assert c.b_mem(stats(101.0, 200.0), mcfg(10000.0), -1, NO_LIMIT) == 29


def test_alg1_per_bin_limit():
    st = stats(100.0, 200.0)  # unlimited: 30
    limits = np.array([0.0, 20.0, 50.0])
    assert c.b_mem(st, mcfg(10000.0), 1, limits) == 20  # min(30, 20)
    assert c.b_mem(st, mcfg(10000.0), 2, limits) == 30  # min(30, 50)
    assert c.b_mem(st, mcfg(10000.0), 0, limits) == 30  # entry 0: no limit
    # bin_idx = -1 is the global controller: limits are not applied
    assert c.b_mem(st, mcfg(10000.0), -1, np.array([5.0, 5.0])) == 30


def test_alg1_clamps_after_per_bin_limit():
    st = stats(100.0, 200.0)
    # eta = 1000: floor(900 / 300) = 3 < B_min = 4 -> 4
    assert c.b_mem(st, mcfg(1000.0, B_min=4.0), -1, NO_LIMIT) == 4
    # eta = 1e6: floor(900000 / 300) = 3000 > B_max = 64 -> 64
    assert c.b_mem(st, mcfg(1e6), -1, NO_LIMIT) == 64
    # per-bin limit 2 below B_min = 4: step 6 comes after step 5 -> 4
    assert c.b_mem(st, mcfg(10000.0, B_min=4.0), 0, np.array([2.0])) == 4
    # eta < 0 (model larger than memory): floor(-0.9 eta / E) < 0 -> B_min
    assert c.b_mem(st, mcfg(-10.0, B_min=2.0), -1, NO_LIMIT) == 2


def test_alg1_huge_quotient_does_not_wrap():
    # 9000 / 1e-300 overflows int64; the clamp happens in float64 first
    assert c.b_mem(stats(1e-300, 0.0), mcfg(10000.0), -1, NO_LIMIT) == 64


# --- Algorithm 1: b_mem, CLT variant -----------------------------------------

def clt_f(b, mu, sigma, z):
    # same operations as the kernel, so the comparison is exact
    return b * mu + (z * sigma) * math.sqrt(b)


def test_clt_hand_example():
    # mu = 100, sigma = sqrt(M2 / (n - 1)) = sqrt(3600 / 9) = 20, z = 1.645:
    # 100 b + 32.9 sqrt(b) <= 1000;  sqrt(b) = (-32.9 + sqrt(32.9^2 + 4e5)) / 200
    # = (-32.9 + 633.31) / 200 = 3.00205 -> b = floor(9.0123) = 9.
    # Check: b = 9: 900 + 32.9 * 3 = 998.7 <= 1000; b = 10: 1000 + 104.04 > 1000.
    st = stats(count=10.0, mean=100.0, m2=3600.0)
    assert c.b_mem(st, mcfg(1000.0, variant=1), -1, NO_LIMIT) == 9
    # the L0 rule on the same mean (EMAs 40 + 60 = 100): floor(900 / 100) = 9 too
    assert c.b_mem(stats(40.0, 60.0), mcfg(1000.0), -1, NO_LIMIT) == 9


def test_clt_sigma_zero_is_floor_eta_over_mu():
    # sigma = 0: b = floor(1000 / 100) = 10, the inequality holding at equality
    st = stats(count=10.0, mean=100.0, m2=0.0)
    assert c.b_mem(st, mcfg(1000.0, variant=1), -1, NO_LIMIT) == 10
    # floor(1000 / 300) = 3
    st = stats(count=10.0, mean=300.0, m2=0.0)
    assert c.b_mem(st, mcfg(1000.0, variant=1), -1, NO_LIMIT) == 3


@pytest.mark.parametrize("mu", [0.1, 7.0, 123.7, 333.3])
def test_clt_exact_at_the_boundary(mu):
    # eta = k mu exactly (the kernel's own product): b = k; one ulp less: k - 1.
    # floor(x^2) of the closed form misses by one in about a third of these
    # cases, in both directions; the +-1 steps must repair every one.
    st = stats(count=10.0, mean=mu, m2=0.0)
    for k in range(1, 200):
        eta = k * mu
        assert c.b_mem(st, mcfg(eta, B_max=1000.0, variant=1), -1, NO_LIMIT) == k
        below = float(np.nextafter(eta, 0.0))
        # (k = 1: 0 fits, clamped to B_min = 1)
        assert c.b_mem(st, mcfg(below, B_max=1000.0, variant=1), -1, NO_LIMIT) == max(k - 1, 1)


def test_clt_falls_back_to_default_before_two_requests():
    # count 1: mu = 500, sigma = 0 -> floor(1000 / 500) = 2, whatever the mean says
    st = stats(count=1.0, mean=100.0, m2=0.0)
    assert c.b_mem(st, mcfg(1000.0, variant=1), -1, NO_LIMIT) == 2
    assert c.b_mem(stats(), mcfg(1000.0, variant=1), -1, NO_LIMIT) == 2


def test_clt_per_bin_limit_and_clamp():
    st = stats(count=10.0, mean=100.0, m2=3600.0)  # unlimited: 9
    assert c.b_mem(st, mcfg(1000.0, variant=1), 0, np.array([5.0])) == 5
    assert c.b_mem(st, mcfg(1000.0, variant=1), -1, np.array([5.0])) == 9
    assert c.b_mem(st, mcfg(1000.0, variant=1, B_min=12.0), -1, NO_LIMIT) == 12
    assert c.b_mem(st, mcfg(1000.0, variant=1, B_max=8.0), -1, NO_LIMIT) == 8
    # no b >= 0 fits a negative capacity: 0, clamped to B_min
    assert c.b_mem(st, mcfg(-5.0, variant=1, B_min=3.0), -1, NO_LIMIT) == 3


@given(eta=hs.floats(-100.0, 1e6), mu=hs.floats(1.0, 5000.0), sd=hs.floats(0.0, 3000.0),
       z=hs.floats(0.0, 4.0), count=hs.integers(2, 10_000),
       B_min=hs.integers(1, 64), extra=hs.integers(0, 512))
def test_clt_is_largest_b_satisfying_the_inequality(eta, mu, sd, z, count, B_min, extra):
    B_max = B_min + extra
    st = stats(count=float(count), mean=mu, m2=sd * sd * (count - 1))
    b = c.b_mem(st, mcfg(eta, B_min=B_min, B_max=B_max, variant=1, z=z), -1, NO_LIMIT)
    sigma = math.sqrt(st[c.T.m2_tokens] / (count - 1))
    assert B_min <= b <= B_max
    if b > B_min:  # not clamped up: the inequality holds at b
        assert clt_f(b, mu, sigma, z) <= eta
    if b < B_max:  # not clamped down: it fails at b + 1
        assert clt_f(b + 1, mu, sigma, z) > eta


@given(eta=hs.floats(-1e3, 1e7), prompt=hs.floats(0.0, 4000.0), output=hs.floats(0.0, 4000.0),
       B_min=hs.integers(1, 64), extra=hs.integers(0, 512), variant=hs.sampled_from([0, 1]),
       limit=hs.floats(-1.0, 600.0), bin_idx=hs.sampled_from([-1, 0]))
def test_b_mem_within_bounds(eta, prompt, output, B_min, extra, variant, limit, bin_idx):
    B_max = B_min + extra
    st = stats(prompt, output, count=5.0, mean=prompt + output, m2=4.0 * prompt)
    b = c.b_mem(st, mcfg(eta, B_min=B_min, B_max=B_max, variant=variant), bin_idx,
                np.array([limit]))
    assert B_min <= b <= B_max


# --- Algorithm 2: b_SLA, Pang et al.'s variant ---------------------------------
# ccfg(): D_SLA = 0.5, eps_D = 0.125 (band [0.375, 0.625]), B = [1, 64], alpha 4, delta 2

def test_alg2_warmup_when_tau_is_zero():
    state = ctl(10.0, 21.0, tau=0.0, b_avg=30.0, n_decode=40.0, updates=10.0)
    before = state.copy()
    # floor((10 + 21) / 2) = 15; no state change, and no N_decode rule
    assert c.b_sla(state, ccfg()) == 15
    np.testing.assert_array_equal(state, before)


def test_alg2_warmup_while_fewer_than_three_updates():
    for updates in (0.0, 1.0, 2.0):
        state = ctl(10.0, 21.0, tau=1.0, b_avg=30.0, updates=updates)
        before = state.copy()
        assert c.b_sla(state, ccfg()) == 15
        np.testing.assert_array_equal(state, before)
    # the third update ends the warm-up: tau = 1 > 0.625 -> case 1:
    # b_high = min(21, max(30, 14)) = 21, b_low = max(8, 1) = 8 -> floor(29 / 2) = 14
    state = ctl(10.0, 21.0, tau=1.0, b_avg=30.0, updates=3.0)
    assert c.b_sla(state, ccfg()) == 14
    assert interval(state) == (8.0, 21.0)


def test_alg2_case1_floor_b_avg_wins():
    # tau 0.7 > 0.625. new_high = max(floor(30.7), 10 + 4) = 30, new_low = max(10 - 2, 1) = 8
    # b_high = min(40, 30) = 30, b_low = 8 -> floor(38 / 2) = 19
    state = ctl(10.0, 40.0, tau=0.7, b_avg=30.7)
    assert c.b_sla(state, ccfg()) == 19
    assert interval(state) == (8.0, 30.0)


def test_alg2_case1_b_low_plus_alpha_wins():
    # new_high = max(floor(12.9), 10 + 4) = 14; b_high = min(40, 14) = 14; b_low = 8 -> 11
    state = ctl(10.0, 40.0, tau=0.7, b_avg=12.9)
    assert c.b_sla(state, ccfg()) == 11
    assert interval(state) == (8.0, 14.0)


def test_alg2_case1_only_shrinks():
    # new_high = max(35, 14) = 35 but b_high = min(20, 35) = 20; b_low = 8 -> 14
    state = ctl(10.0, 20.0, tau=0.7, b_avg=35.0)
    assert c.b_sla(state, ccfg()) == 14
    assert interval(state) == (8.0, 20.0)


def test_alg2_case1_b_low_stops_at_B_min():
    # new_high = max(3, 2 + 4) = 6; new_low = max(2 - 2, 1) = 1 -> floor(7 / 2) = 3
    state = ctl(2.0, 10.0, tau=0.7, b_avg=3.0)
    assert c.b_sla(state, ccfg()) == 3
    assert interval(state) == (1.0, 6.0)


def test_alg2_case2_floor_b_avg_wins():
    # tau 0.3 < 0.375. new_low = min(floor(30.7), 40 - 4) = 30, new_high = min(42, 64) = 42
    # b_low = max(10, 30) = 30, b_high = 42 -> 36
    state = ctl(10.0, 40.0, tau=0.3, b_avg=30.7)
    assert c.b_sla(state, ccfg()) == 36
    assert interval(state) == (30.0, 42.0)


def test_alg2_case2_b_high_minus_alpha_wins():
    # new_low = min(50, 40 - 4) = 36; b_low = 36, b_high = 42 -> 39
    state = ctl(10.0, 40.0, tau=0.3, b_avg=50.0)
    assert c.b_sla(state, ccfg()) == 39
    assert interval(state) == (36.0, 42.0)


def test_alg2_case2_only_shifts_right():
    # new_low = min(20, 36) = 20 but b_low = max(25, 20) = 25; b_high = 42 -> floor(67/2) = 33
    state = ctl(25.0, 40.0, tau=0.3, b_avg=20.5)
    assert c.b_sla(state, ccfg()) == 33
    assert interval(state) == (25.0, 42.0)


def test_alg2_case2_b_high_stops_at_B_max():
    # new_high = min(63 + 2, 64) = 64; new_low = min(50, 59) = 50 -> floor(114 / 2) = 57
    state = ctl(10.0, 63.0, tau=0.3, b_avg=50.0)
    assert c.b_sla(state, ccfg()) == 57
    assert interval(state) == (50.0, 64.0)


def test_alg2_case3_centres_on_b_avg():
    # tau in [0.375, 0.625]; half_alpha = floor(4 / 2) = 2, floor(20.9) = 20:
    # [max(18, 1), min(22, 64)] = [18, 22] -> 20
    for tau in (0.5, 0.375, 0.625):  # the band is closed: equality is case 3
        state = ctl(10.0, 40.0, tau=tau, b_avg=20.9)
        assert c.b_sla(state, ccfg()) == 20
        assert interval(state) == (18.0, 22.0)


def test_alg2_case3_half_alpha_floors_and_clips():
    # alpha = 5: half_alpha = floor(2.5) = 2 -> [18, 22] -> 20
    state = ctl(10.0, 40.0, tau=0.5, b_avg=20.9)
    assert c.b_sla(state, ccfg(alpha=5.0)) == 20
    assert interval(state) == (18.0, 22.0)
    # floor(63.5) = 63: [61, min(65, 64)] = [61, 64] -> 62
    state = ctl(10.0, 40.0, tau=0.5, b_avg=63.5)
    assert c.b_sla(state, ccfg()) == 62
    assert interval(state) == (61.0, 64.0)
    # floor(1.2) = 1: [max(-1, 1), 3] = [1, 3] -> 2
    state = ctl(10.0, 40.0, tau=0.5, b_avg=1.2)
    assert c.b_sla(state, ccfg()) == 2
    assert interval(state) == (1.0, 3.0)


def test_alg2_interval_collapses_then_final_clamp():
    # B_min = 10, case 3 with floor(3.4) = 3: b_high = min(5, 64) = 5,
    # b_low = max(1, 10) = 10; valid interval: b_low = 10 > b_high = 5 -> b_low = 5;
    # midpoint 5; final clamp -> B_min = 10
    state = ctl(10.0, 40.0, tau=0.5, b_avg=3.4)
    assert c.b_sla(state, ccfg(B_min=10.0)) == 10
    assert interval(state) == (5.0, 5.0)


def test_alg2_n_decode_rule():
    # case 2 example above gives the midpoint 36
    for n_decode, expected in ((50.0, 50), (20.0, 36), (0.0, 36), (36.0, 36), (100.0, 64)):
        state = ctl(10.0, 40.0, tau=0.3, b_avg=30.7, n_decode=n_decode)
        # N_decode = 100 > B_max: max(36, 100) = 100, final clamp -> 64
        assert c.b_sla(state, ccfg()) == expected
        assert interval(state) == (30.0, 42.0)  # the rule never touches the interval


# --- Algorithm 2: variant 1 (design notes, Section 2.3) -----------------------

V1 = ccfg(variant=1)


def test_variant1_case1():
    # b_high = min(40, int(30.7)) = 30; b_low = max(10, int(24.56)) = 24 -> 27
    state = ctl(10.0, 40.0, tau=0.7, b_avg=30.7, n_decode=60.0)
    assert c.b_sla(state, V1) == 27  # no N_decode rule in this variant
    assert interval(state) == (24.0, 30.0)


def test_variant1_case2():
    # b_low = max(10, int(30.7)) = 30; b_high = min(40 + int(6.14), 64) = 46 -> 38
    state = ctl(10.0, 40.0, tau=0.3, b_avg=30.7)
    assert c.b_sla(state, V1) == 38
    assert interval(state) == (30.0, 46.0)
    # b_high = min(60 + 6, 64) = 64; b_low = 30 -> 47
    state = ctl(10.0, 60.0, tau=0.3, b_avg=30.7)
    assert c.b_sla(state, V1) == 47
    assert interval(state) == (30.0, 64.0)


def test_variant1_case3():
    # margin = int(0.1 * (40 - 10)) = 3; [max(1, 30 - 3), min(64, 30 + 3)] = [27, 33] -> 30
    state = ctl(10.0, 40.0, tau=0.5, b_avg=30.7)
    assert c.b_sla(state, V1) == 30
    assert interval(state) == (27.0, 33.0)


def test_variant1_has_no_warmup():
    # updates = 0 but tau = 0.7: case 1 acts at once (b_high = 30, b_low = 24)
    state = ctl(10.0, 40.0, tau=0.7, b_avg=30.7, updates=0.0)
    assert c.b_sla(state, V1) == 27


def test_variant1_midpoint_below_B_min_is_clamped():
    # B_min = 10, case 1 with b_avg = 6.4: b_high = min(40, 6) = 6,
    # b_low = max(10, int(5.12)) = 10; fix: 10 > 6 -> b_low = 6; the source's
    # midpoint 6 < B_min is clamped to 10; the state stays as the source leaves it
    state = ctl(10.0, 40.0, tau=0.7, b_avg=6.4)
    assert c.b_sla(state, ccfg(B_min=10.0, variant=1)) == 10
    assert interval(state) == (6.0, 6.0)


def test_variant1_cannot_grow_from_small_b_avg():
    # a property of the source: case 2 adds int(0.2 b_avg), which is 0 for
    # b_avg < 5, so an interval [4, 4] never widens while batches stay below 5
    state = ctl(4.0, 4.0, tau=0.1, b_avg=4.9)
    assert c.b_sla(state, V1) == 4
    assert interval(state) == (4.0, 4.0)


# --- Algorithm 7: feedback ---------------------------------------------------

def test_alg7_empty_batch_is_a_no_op():
    state = ctl(1.0, 64.0, tau=0.3, b_avg=5.0, updates=4.0)
    st = stats(10.0, 20.0, 3.0, 30.0, 5.0)
    before = (state.copy(), st.copy())
    c.feedback(state, st, ccfg(), np.array([1.0]), np.array([1.0]), 0, 1.0, 0.0, 3.0)
    np.testing.assert_array_equal(state, before[0])
    np.testing.assert_array_equal(st, before[1])


def test_alg7_from_zero_state_legacy_tbt():
    state = np.zeros(c.CONTROLLER.size)
    c.controller_init(state, 1.0, 64.0)
    st = np.zeros(c.BATCH_STATS.size)
    # the trailing entries are not batch members
    prompt = np.array([100.0, 300.0, 9e9])
    output = np.array([50.0, 150.0, 9e9])
    c.feedback(state, st, ccfg(), prompt, output, 2, 3.0, 0.0, 7.0)
    # means 200 and 100; first EMA step from 0 is 0.2 x: 40 and 20
    assert st[c.T.avg_prompt] == pytest.approx(40.0, rel=1e-15)
    assert st[c.T.avg_output] == pytest.approx(20.0, rel=1e-15)
    # legacy: recent_tbt = 3.0 / max(50, 150) = 0.02; tau = 0.2 * 0.02 = 0.004
    assert state[c.C.tau_avg] == pytest.approx(0.004, rel=1e-15)
    # b_avg = 0.2 * 2 = 0.4
    assert state[c.C.b_avg] == pytest.approx(0.4, rel=1e-15)
    assert state[c.C.n_decode] == 7.0
    assert state[c.C.updates] == 1.0
    assert interval(state) == (1.0, 64.0)  # feedback never moves the interval

    # second batch, v2 rule: recent_tbt = decode_tbt = 0.01 (service time ignored)
    c.feedback(state, st, ccfg(), np.array([50.0]), np.array([10.0]), 1, 99.0, 0.01, 0.0)
    # prompt: 0.2 * 50 + 0.8 * 40 = 42; output: 0.2 * 10 + 0.8 * 20 = 18
    assert st[c.T.avg_prompt] == pytest.approx(42.0, rel=1e-15)
    assert st[c.T.avg_output] == pytest.approx(18.0, rel=1e-15)
    # tau: 0.2 * 0.01 + 0.8 * 0.004 = 0.0052; b_avg: 0.2 * 1 + 0.8 * 0.4 = 0.52
    assert state[c.C.tau_avg] == pytest.approx(0.0052, rel=1e-14)
    assert state[c.C.b_avg] == pytest.approx(0.52, rel=1e-15)
    assert state[c.C.n_decode] == 0.0
    assert state[c.C.updates] == 2.0


def test_alg7_ema_weight_comes_from_ccfg():
    state = np.zeros(c.CONTROLLER.size)
    st = np.zeros(c.BATCH_STATS.size)
    c.feedback(state, st, ccfg(ema=0.5), np.array([10.0]), np.array([4.0]), 1, 2.0, 0.0, 0.0)
    # 0.5 * 10, 0.5 * 4, 0.5 * (2 / 4), 0.5 * 1
    assert (st[c.T.avg_prompt], st[c.T.avg_output]) == (5.0, 2.0)
    assert (state[c.C.tau_avg], state[c.C.b_avg]) == (0.25, 0.5)


def test_alg7_all_empty_outputs_do_not_divide_by_zero():
    state = np.zeros(c.CONTROLLER.size)
    c.feedback(state, np.zeros(c.BATCH_STATS.size), ccfg(), np.array([5.0]), np.array([0.0]), 1,
               2.0, 0.0, 0.0)
    assert state[c.C.tau_avg] == pytest.approx(0.2 * 2.0)


@given(batches=hs.lists(hs.lists(hs.tuples(hs.integers(1, 4000), hs.integers(1, 4000)),
                                 min_size=0, max_size=6), min_size=1, max_size=12))
def test_alg7_welford_matches_numpy(batches):
    st = np.zeros(c.BATCH_STATS.size)
    state = np.zeros(c.CONTROLLER.size)
    tokens = []
    for batch in batches:
        p = np.array([float(a) for a, _ in batch] + [0.0])
        o = np.array([float(b) for _, b in batch] + [0.0])
        c.feedback(state, st, ccfg(), p, o, len(batch), 1.0, 0.0, 0.0)
        tokens += [a + b for a, b in batch]
    assert st[c.T.count] == len(tokens)
    assert state[c.C.updates] == sum(1 for b in batches if b)
    if tokens:
        assert st[c.T.mean_tokens] == pytest.approx(np.mean(tokens), rel=1e-12)
    if len(tokens) >= 2:
        var = st[c.T.m2_tokens] / (len(tokens) - 1)
        assert var == pytest.approx(np.var(tokens, ddof=1), rel=1e-9, abs=1e-6)


def test_decode_tbt():
    # b = 1: no penalty; b = 4: 5.74e-3 * (1 + 0.316 * 3 / 4) = 5.74e-3 * 1.237
    assert c.decode_tbt(5.74e-3, 0.316, 1) == 5.74e-3
    assert c.decode_tbt(5.74e-3, 0.316, 4) == pytest.approx(7.10038e-3, rel=1e-12)
    assert c.decode_tbt(5.74e-3, 0.316, 4.0) == pytest.approx(7.10038e-3, rel=1e-12)
    # b = 0: max(1, b) = 1 keeps it finite: beta (1 - gamma)
    assert c.decode_tbt(1.0, 0.25, 0) == 0.75


def test_check_memory():
    assert c.check_memory(100.0, 100.0)
    assert not c.check_memory(100.5, 100.0)


# --- Algorithm 6: equal-mass edges ------------------------------------------

def edges(predicted, K):
    return c.equal_mass_edges(np.asarray(predicted, dtype=np.float64), K)


def test_alg6_one_bin():
    lo, hi = edges([3.0, 700.0], 1)
    assert (lo.tolist(), hi.tolist()) == ([0.0], [10000.0])


def test_alg6_four_bins_by_hand():
    x = np.array([33.3, 2.5, 70.9, 20.0, 11.0, 50.0, 41.0])
    before = x.copy()
    lo, hi = edges(x, 4)
    # sorted: 2.5 11 20 33.3 41 50 70.9; virtual index 6 q at q = 0, .25, .5, .75, 1:
    # 0 -> 2.5; 1.5 -> 20 - 9 * 0.5 = 15.5; 3 -> 33.3; 4.5 -> 50 - 9 * 0.5 = 45.5; 6 -> 70.9
    # floors 2, 15, 33, 45 (70 replaced by 10000 in step 4)
    assert lo.tolist() == [2.0, 15.0, 33.0, 45.0]
    assert hi.tolist() == [15.0, 33.0, 45.0, 10000.0]
    np.testing.assert_array_equal(x, before)  # sorts a copy


def test_alg6_ties_give_empty_bins():
    # sorted 5 5 5 5 7 9, index 5 q: 0 -> 5; 5/3 -> 5 + 0 = 5; 10/3 -> 5 + 2/3 -> 5; 5 -> 9
    lo, hi = edges([9.0, 5.0, 5.0, 7.0, 5.0, 5.0], 3)
    assert lo.tolist() == [5.0, 5.0, 5.0]
    assert hi.tolist() == [5.0, 5.0, 10000.0]  # bins 0 and 1 are [5, 5): empty
    assert c.partition(5.0, lo, hi, 3) == 2


finite_lengths = hs.lists(hs.floats(0.0, 2e4, allow_subnormal=False), min_size=1, max_size=60)


integer_lengths = hs.lists(hs.integers(0, 50).map(float), min_size=1, max_size=40)


@given(x=hs.one_of(finite_lengths, integer_lengths), K=hs.integers(1, 16))
def test_alg6_matches_np_quantile(x, K):
    x = np.array(x)
    lo, hi = edges(x, K)
    if K == 1:
        ref_lo, ref_hi = np.array([0.0]), np.array([10000.0])
    else:
        q = np.quantile(x, np.linspace(0, 1, K + 1))
        ref_lo, ref_hi = np.floor(q[:-1]), np.floor(q[1:])
        ref_hi[-1] = 10000.0
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)


# --- Algorithm 4: partition --------------------------------------------------

def test_alg4_partition():
    lo = np.array([2.0, 15.0, 33.0, 45.0])
    hi = np.array([15.0, 33.0, 45.0, 10000.0])
    cases = {2.0: 0, 14.99: 0, 15.0: 1, 32.999: 1, 33.0: 2, 44.0: 2, 45.0: 3, 9999.5: 3,
             # below the minimum edge and at/above 10000: no bin matches -> fallback K-1
             1.9: 3, 0.0: 3, 10000.0: 3, 1e6: 3}
    for pred, expected in cases.items():
        assert c.partition(pred, lo, hi, 4) == expected, pred
    assert c.partition(123.0, np.array([0.0]), np.array([10000.0]), 1) == 0


@given(x=hs.one_of(finite_lengths, integer_lengths), K=hs.integers(1, 16),
       preds=hs.lists(hs.one_of(hs.floats(0.0, 2e4, allow_subnormal=False), hs.integers(0, 60).map(float)),
                      min_size=1, max_size=30))
def test_alg4_tiled_partition_matches_the_pseudocode(x, K, preds):
    # the kernels' branch-free form, on every tiling Algorithm 6 makes (ties,
    # empty bins, predictions below the minimum or at/above 10000 included)
    lo, hi = edges(np.array(x), K)
    for pred in preds + x + lo.tolist() + hi.tolist():
        assert c.partition_tiled(pred, lo, hi, K) == c.partition(pred, lo, hi, K), pred


# --- invariants of the feedback loop -----------------------------------------

step = hs.tuples(hs.floats(0.0, 2.0), hs.floats(0.0, 1.0), hs.floats(0.0, 1.0),
                 hs.booleans())


@given(B_min=hs.integers(1, 32), extra=hs.integers(0, 96), D=hs.floats(1e-3, 1.0),
       eps_frac=hs.floats(0.0, 1.5), alpha=hs.integers(1, 8), delta=hs.integers(1, 4),
       variant=hs.sampled_from([0, 1]), steps=hs.lists(step, min_size=1, max_size=40))
def test_b_sla_invariants(B_min, extra, D, eps_frac, alpha, delta, variant, steps):
    B_max = B_min + extra
    cfg = ccfg(D=D, eps=eps_frac * D, B_min=B_min, B_max=B_max, alpha=alpha, delta=delta,
               variant=variant)
    state = np.zeros(c.CONTROLLER.size)
    c.controller_init(state, B_min, B_max)
    st = np.zeros(c.BATCH_STATS.size)
    lengths = np.full(B_max, 10.0)
    for tau_rel, size_u, decode_u, v2 in steps:
        n = B_min + int(size_u * (B_max - B_min))            # a batch size within bounds
        n_decode = float(int(decode_u * B_max))               # 0 <= N_decode <= B_max
        tau = tau_rel * D
        # v2 sets recent_tbt = tau directly; legacy = service / max output (10)
        c.feedback(state, st, cfg, lengths, lengths, n, 10.0 * tau, tau if v2 else 0.0, n_decode)
        warm = state[c.C.tau_avg] == 0.0 or state[c.C.updates] < 3
        b = c.b_sla(state, cfg)
        assert B_min <= b <= B_max
        assert state[c.C.b_low] <= state[c.C.b_high]
        if variant == 0 and not warm and n_decode > 0:
            assert b >= n_decode


def run_loop(cfg, steps, tau, size):
    """b_SLA before each of ``steps`` feedbacks with constant tau; batch size
    ``size(b_SLA)``."""
    state = np.zeros(c.CONTROLLER.size)
    c.controller_init(state, cfg[1][c.A.b_min], cfg[1][c.A.b_max])
    st = np.zeros(c.BATCH_STATS.size)
    seq = []
    for _ in range(steps):
        b = int(c.b_sla(state, cfg))
        seq.append(b)
        n = size(b)
        lengths = np.full(n, 10.0)
        c.feedback(state, st, cfg, lengths, lengths, n, 0.0, tau, 0.0)
    return seq


@pytest.mark.parametrize("B_max", [16, 37, 64, 200])
def test_slack_drives_b_sla_to_B_max_minus_half_alpha(B_max):
    # D_SLA huge: every step is case 2 with b_high = B_max, so b_SLA =
    # floor((b_low + B_max) / 2) with b_low = max(b_low, min(floor(b_avg), B_max - 4)).
    # Batches of B_max from a zero EMA: b_avg after k feedbacks = B_max (1 - 0.8^k),
    # and floor(b_avg) >= B_max - 4 once B_max 0.8^k <= 4, i.e. from
    # k* = max(3, ceil(ln(B_max / 4) / ln 1.25)) feedbacks on (k* = 13 for B_max = 64).
    # From then on b_SLA = floor((2 B_max - 4) / 2) = B_max - 2: case 2 cannot
    # raise b_low above b_high - alpha, so B_max itself is never reached.
    cfg = ccfg(D=1e9, eps=0.0, B_min=1.0, B_max=float(B_max))
    k_star = max(3, math.ceil(math.log(B_max / 4) / math.log(1.25)))
    seq = run_loop(cfg, k_star + 20, tau=0.01, size=lambda b: B_max)
    assert seq[:3] == [(1 + B_max) // 2] * 3                 # warm-up midpoint
    assert all(a <= b for a, b in zip(seq[3:], seq[4:]))     # monotone after warm-up
    assert seq[k_star - 1] < B_max - 2
    assert seq[k_star:] == [B_max - 2] * 20


def test_slack_closed_loop_converges_to_B_max_minus_half_alpha():
    # batch size = b_SLA (the controller's own output): same fixed point, slower
    # because b_avg lags b_SLA
    cfg = ccfg(D=1e9, eps=0.0, B_min=1.0, B_max=64.0)
    seq = run_loop(cfg, 100, tau=0.01, size=lambda b: b)
    assert all(a <= b for a, b in zip(seq[3:], seq[4:]))
    assert seq[-1] == 62 and max(seq) == 62


def test_overload_drives_b_sla_to_B_min_plus_half_alpha():
    # D_SLA unreachable: every step is case 1. Batches of B_min = 1 from zero:
    # after 3 feedbacks b_avg = 1 - 0.8^3 = 0.488, floor 0; the first
    # post-warm-up call gives b_high = min(64, max(0, 1 + 4)) = 5,
    # b_low = max(1 - 2, 1) = 1 -> floor(6 / 2) = 3 = B_min + 2, and it stays there
    cfg = ccfg(D=1e-12, eps=0.0, B_min=1.0, B_max=64.0)
    seq = run_loop(cfg, 30, tau=0.01, size=lambda b: 1)
    assert seq[:3] == [32, 32, 32]
    assert seq[3:] == [3] * 27
    # closed loop: monotone down to the same fixed point
    seq = run_loop(cfg, 100, tau=0.01, size=lambda b: b)
    assert all(a >= b for a, b in zip(seq[3:], seq[4:]))
    assert seq[-1] == 3 and min(seq) == 3


def test_variant1_slack_and_overload():
    # slack, batches of 64: b_low = int(b_avg) -> 63 once b_avg >= 63, i.e.
    # 64 * 0.8^k <= 1, k >= ln 64 / ln 1.25 = 18.6; b_SLA = floor(127 / 2) = 63
    cfg = ccfg(D=1e9, eps=0.0, B_min=1.0, B_max=64.0, variant=1)
    seq = run_loop(cfg, 40, tau=0.01, size=lambda b: 64)
    assert all(a <= b for a, b in zip(seq, seq[1:]))
    assert seq[19:] == [63] * 21
    # overload in closed loop: the first feedback (b = 32) gives b_avg = 6.4;
    # b_high = int(6.4) = 6, b_low = max(1, int(5.12)) = 5 -> 5, and case 1 never
    # lowers b_low again: the source's controller stays at 5, not B_min
    cfg = ccfg(D=1e-12, eps=0.0, B_min=1.0, B_max=64.0, variant=1)
    seq = run_loop(cfg, 30, tau=0.01, size=lambda b: b)
    assert seq[0] == 32 and seq[1:] == [5] * 29


def test_warmup_compiles_everything():
    """controller.warmup(), in a fresh process with the numba cache off,
    compiles every numba function of the module (the session's own warmup
    has compiled them all in this process already)."""
    out = subprocess.run([sys.executable, "-c", WARMUP_CHILD], capture_output=True, text=True, check=True,
                         env={**os.environ, "MBBATCH_NUMBA_CACHE": "0", "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["ok"], out.stdout


WARMUP_CHILD = """
from numba.core.registry import CPUDispatcher
from mbbatch._kernels import controller as c
c.warmup()
empty = [name for name, f in vars(c).items()
         if isinstance(f, CPUDispatcher) and f.py_func.__module__ == c.__name__ and not f.signatures]
print(" ".join(empty) or "ok")
"""
