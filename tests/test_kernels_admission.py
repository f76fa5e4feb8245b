"""The continuous engine's admission orders (mbbatch/_kernels/admission.py):
the registry read by the kernel, the workspace and the parameter table, and
each order's rules on small runs.  (Every order against the plain-Python
reference engine, request by request: tests/test_kernels_continuous.py.)"""

from __future__ import annotations

import ast
import inspect

import numpy as np
from numba import njit

from mbbatch import params
from mbbatch._kernels import admission
from mbbatch._kernels import continuous as ck

from .test_kernels_continuous import QUARTER, _kernel


def test_the_parameter_tables_choices_are_the_registered_orders():
    assert params.PARAMS["admission"].choices == tuple(admission.ORDERS)
    assert ck.ADMISSIONS == {name: code for code, name in enumerate(admission.ORDERS)}


def test_each_orders_per_request_arrays_are_workspace_arrays_sized_to_its_runs():
    """An order's per-request arrays get n elements (times its width,
    ``admission.WIDTHS``) in its runs, one (times its width) in the others'
    (a run of 50 requests)."""
    for name, order in admission.ORDERS.items():
        assert set(order.arrays) <= set(ck.WORKSPACE.fields), name
        cfg = ck.CONFIG.pack(n=50, arrival_kind=0, max_num_seqs=4, max_batched_tokens=64, chunked=1, blocks=-1,
                             block_size=4, admission=ck.ADMISSIONS[name], bins=2, keep=0, controlled=0, memory_on=0,
                             scheduler_steps=1, goodput=0, quantum=1, rate=1.0,
                             **dict.fromkeys(ck.COST_FIELDS, 0.0),
                             expert_span=0.0, expert_miss=1.0, request_overhead=0.0, aging=0.0, until=np.inf)
        x = np.ones(50)
        inputs = ck.INPUTS.pack(arrival_times=np.empty(0), arrival_params=np.ones(1), arrival_ends=np.ones(1),
                                prompt=x, output=x, prediction=x, edges=np.array([2.0]), cached=np.empty(0),
                                klass=np.empty(0), class_slo=np.full(1, np.inf), class_tpot=np.full(1, np.inf))
        ws = ck.start(cfg, inputs).ws
        for a in {a for o in admission.ORDERS.values() for a in o.arrays}:
            assert getattr(ws, a).shape[0] == admission.WIDTHS.get(a, 1) * (50 if a in order.arrays else 1), (name, a)


def test_the_kernel_loads_and_stores_the_engines_scalars_in_the_states_order():
    """The kernel unpacks the first of ``ws.state_i`` and ``ws.state_f``
    (its loop's locals; it counts the others in place) into names and stores
    them back by position: both lists must be the layout's fields, in its
    order."""
    tree = ast.parse(inspect.getsource(ck.continuous_kernel.py_func))
    loads, stores = {}, {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.targets[0], ast.Tuple)
                and getattr(node.value.func, "id", "") == "load_tuple"):
            loads[ast.unparse(node.value.args[0])] = [ast.unparse(e) for e in node.targets[0].elts]
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_store":
            stores[ast.unparse(node.args[0])] = [ast.unparse(e) for e in node.args[1].elts]
    renamed = {"sum_lat": "sum_latency", "last_done": "last_completion"}
    for vector, fields in (("ws.state_i", ck.STATE.ints[:ck.LOOP_INTS]),
                           ("ws.state_f", ck.STATE.floats[:ck.LOOP_FLOATS])):
        assert [renamed.get(f, f) for f in loads[vector]] == list(fields)
        assert [renamed.get(f, f) for f in stores[vector]] == list(fields)


def _one_at_a_time(pred, edges):
    """The admission times of requests of one token each way, all arriving at
    0, predicted ``pred``, admitted one at a time by multi-bin ``edges``."""
    n = len(pred)
    ones = np.ones(n, np.int64)
    _, req, _ = _kernel(np.zeros(n), ones, ones, np.array(pred), max_num_seqs=1, max_batched_tokens=64,
                        chunked=True, kv_tokens=np.inf, block_size=4, admission="multibin", edges=edges, **QUARTER)
    return req["admitted"].tolist()


def test_a_prediction_equal_to_a_bin_edge_goes_to_the_upper_bin():
    """Edge 10: request 0, predicted 10, is in bin 1, so request 1
    (predicted 5, bin 0, where the round robin starts) is admitted first."""
    assert _one_at_a_time([10, 5], [10.0]) == [0.25, 0.0]


def test_the_round_robin_pointer_moves_past_the_bin_admitted_from():
    """Bins 1, 1 and 2 (edges 10, 20), bin 0 empty: request 0 from bin 1,
    then past it request 2 from bin 2, then request 1.  (A pointer moved one
    bin on from where it stood, bin 0, would serve bin 1 twice: 0, 0.25, 0.5.)"""
    assert _one_at_a_time([15, 15, 25], [10.0, 20.0]) == [0.0, 0.5, 0.25]


def test_a_resumed_request_does_not_move_the_round_robin_pointer():
    """Four blocks of one token, two sequences at most, bins by edges 10
    and 20.  Requests 0 and 1 (bin 0, prompt 1, output 3) are admitted at
    0, the pointer past bin 0 at bin 1; at the next iteration their decodes
    need two blocks, none is free, and request 1 is preempted; it resumes at
    0.75 (three blocks, admitted before any bin) and ends at 1.25.
    Requests 2, 3 and 4 (bins 0, 1 and 2, one token each way, arrived at
    0.1) are then admitted from the pointer, still at bin 1: 3 and 4 at
    1.25, 2 at 1.5.  (Had the resumption moved it, to bin 0 or one on to
    bin 2, request 2 would be admitted at 1.25.)"""
    _, req, _ = _kernel(np.array([0.0, 0.0, 0.1, 0.1, 0.1]), np.ones(5, np.int64), np.array([3, 3, 1, 1, 1]),
                        np.array([5, 5, 5, 15, 25]), max_num_seqs=2, max_batched_tokens=64, chunked=True,
                        kv_tokens=4.0, block_size=1, admission="multibin", edges=[10.0, 20.0], **QUARTER)
    assert req["preemptions"].tolist() == [0, 1, 0, 0, 0]
    assert req["completion"][1] == 1.25
    assert req["admitted"].tolist() == [0.0, 0.0, 1.5, 1.25, 1.25]


@njit
def _skip_level(p, quantum, coef, K):
    return admission.skip_level(p, (0.0, True, False, quantum, coef, 0.0, 1.0), K)


def test_a_request_skips_to_the_first_level_whose_quantum_holds_its_prefill():
    """Iterations of 1 s plus 0.1 s per prompt token, quanta 2, 4, 8 and
    unbounded: a prefill of p tokens takes 1 + 0.1 p decode iterations' time,
    so prompts of 5, 10, 25, 65 and 100 tokens (1.5, 2, 3.5, 7.5 and 11)
    join levels 0, 0 (a quantum equal to it holds it), 1, 2 and 3."""
    coef = tuple(float(x) for x in np.zeros(len(ck.COST_FIELDS)))
    coef = coef[:1] + (1.0, 0.1) + coef[3:]            # step 1 s, 0.1 s per prompt token
    assert [_skip_level(p, 2, coef, 4) for p in (5, 10, 25, 65, 100)] == [0, 0, 1, 2, 3]
    assert _skip_level(100, 2, coef, 1) == 0           # (one level: every request's)


def _feedback(arrival, prompt, output):
    return _kernel(np.array(arrival), np.array(prompt), np.array(output), np.array(output), max_num_seqs=1,
                   max_batched_tokens=64, chunked=True, kv_tokens=np.inf, block_size=4, admission="mlfq", edges=[],
                   quantum=2, levels=2, **QUARTER)


def test_a_quantum_ends_in_a_preemption_only_where_a_higher_level_waits():
    """Quarter-second iterations, one sequence at a time, quanta 2 and
    unbounded.  Request A (output 6) has its first token at 0.25 and its
    quantum ends with its second decode, at 0.75: B (output 2, arrived at
    0.1, level 0) waits, so A goes down a level and is preempted; B runs
    (first token 1.0, done 1.25); A resumes, recomputing its prompt and 3
    tokens (7), and ends at 2.0.  Alone, A goes down a level at 0.75 and
    decodes on, done at 1.5."""
    out, req, code = _feedback([0.0, 0.1], [4, 4], [6, 2])
    assert code == ck.DONE
    assert req["preemptions"].tolist() == [1, 0]
    assert req["admitted"].tolist() == [0.0, 0.75]
    assert req["first_token"].tolist() == [0.25, 1.0]
    assert req["completion"].tolist() == [2.0, 1.25]
    assert out.ints[ck.S.recomputed] == 7
    _, alone, _ = _feedback([0.0], [4], [6])
    assert alone["preemptions"].tolist() == [0] and alone["completion"].tolist() == [1.5]
