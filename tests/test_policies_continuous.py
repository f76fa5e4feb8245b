"""mb.ContinuousBatching: its settings checked at the boundary, described,
and built from a sweep's parameters."""

import math

import pytest

import mbbatch as mb
from mbbatch import registry


def test_defaults_are_vllms_and_it_describes_itself():
    p = mb.ContinuousBatching()
    assert (p.max_num_seqs, p.max_batched_tokens, p.chunked_prefill, p.block_size, p.admission) == (
        256, 2048, True, 16, "fcfs")
    assert math.isinf(p.kv_tokens) and isinstance(p.predictor, mb.Oracle)
    assert p.describe() == {"policy": "continuous", "max_num_seqs": 256, "max_batched_tokens": 2048,
                            "chunked_prefill": True, "kv_tokens": "inf", "block_size": 16, "admission": "fcfs"}
    d = mb.ContinuousBatching(admission="multibin", bins=3, edges=(50, 200), kv_tokens=1e5,
                              predictor=mb.LogNormalError(0.5)).describe()
    assert d["bins"] == 3 and d["edges"] == [50.0, 200.0] and d["kv_tokens"] == 1e5 and d["predictor_sigma"] == 0.5
    assert registry.kind_of(p) is mb.ContinuousBatching and registry.POLICIES["continuous"] is mb.ContinuousBatching


@pytest.mark.parametrize("kw, exc, match", [
    (dict(max_num_seqs=0), ValueError, "max_num_seqs"),
    (dict(max_num_seqs=2.0), TypeError, "max_num_seqs"),
    (dict(max_batched_tokens=100, max_num_seqs=256), ValueError, "max_batched_tokens = 100 must be >= max_num_seqs"),
    (dict(kv_tokens=0.0), ValueError, "kv_tokens"),
    (dict(kv_tokens=8.0), ValueError, "at least one block"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(admission="lifo"), ValueError, "admission"),
    (dict(chunked_prefill="yes"), TypeError, "chunked_prefill"),
    (dict(edges=(10.0,)), ValueError, "edges are the bins of admission='multibin'"),
    (dict(admission="multibin", bins=3, edges=(10.0,)), ValueError, "bins - 1 = 2"),
    (dict(admission="multibin", bins=3, edges=(20.0, 10.0)), ValueError, "ascending"),
    (dict(predictor=mb.BinConfusion(0.9)), TypeError, "bin confusion"),
    (dict(aging=-1.0), ValueError, r"aging must be in \[0, inf\); got -1.0"),
    (dict(aging=5.0), ValueError, "aging = 5 ages shortest predicted output first \\(admission='spf'\\); admission "
                                  "is 'fcfs'"),
    (dict(admission="mlfq", quantum=0), ValueError, "quantum"),
    (dict(admission="mlfq", levels=33), ValueError, "levels"),
    (dict(admission="mlfq", levels=2.0), TypeError, "levels"),
])
def test_bad_settings_are_refused_naming_them(kw, exc, match):
    with pytest.raises(exc, match=match):
        mb.ContinuousBatching(**kw)


def test_without_chunked_prefill_the_budget_may_be_below_the_sequences():
    p = mb.ContinuousBatching(max_num_seqs=256, max_batched_tokens=100, chunked_prefill=False)
    assert p.max_batched_tokens == 100


def test_a_sweep_cell_builds_it():
    p = registry.build("continuous", {"max_num_seqs": 8, "max_batched_tokens": 64, "chunked_prefill": False,
                                      "kv_tokens": 4096.0, "block_size": 8, "admission": "spf",
                                      "admission_bins": 4, "aging": 25.0, "predictor_sigma": 0.3})
    assert (p.max_num_seqs, p.max_batched_tokens, p.chunked_prefill, p.kv_tokens, p.block_size, p.admission,
            p.aging) == (8, 64, False, 4096.0, 8, "spf", 25.0)
    assert p.predictor == mb.LogNormalError(0.3)



def test_a_sweep_cell_builds_the_feedback_queue():
    p = registry.build("continuous", {"admission": "mlfq", "mlfq_quantum": 4, "mlfq_levels": 6})
    assert (p.admission, p.quantum, p.levels) == ("mlfq", 4, 6)
    assert p.describe()["quantum"] == 4 and p.describe()["levels"] == 6
    assert "quantum" not in mb.ContinuousBatching().describe()


def test_a_sweep_cell_with_sla_control_builds_the_controller_on_the_engines_memory():
    params = {"max_num_seqs": 64, "max_batched_tokens": 2048, "chunked_prefill": True, "kv_tokens": 4096.0,
              "block_size": 16, "admission": "fcfs", "admission_bins": 4, "sla_control": True, "d_sla": 0.02,
              "eps_d": 1e-3, "b_min": 2, "b_max": 128, "controller": "spec", "memory": "clt", "eps_m": 0.1}
    p = registry.build("continuous", params)
    assert p.controller == mb.SLAController(d_sla=0.02, eps_d=1e-3, b_min=2, b_max=128)
    assert (p.algorithm1.eta, p.algorithm1.variant, p.algorithm1.eps_m) == (4096.0, "clt", 0.1)
    assert p.describe()["eta"] == 4096.0 and p.describe()["controller"] == "spec"
    assert registry.build("continuous", {**params, "memory": "off"}).algorithm1 is None
    assert registry.build("continuous", {**params, "kv_tokens": math.inf}).algorithm1 is None
    assert registry.build("continuous", {**params, "sla_control": False}).controller is None


def test_a_kv_cache_beyond_the_engines_int64_block_counts_is_refused_naming_it():
    """kv_tokens = 1e30 (or 1e19 with block_size = 1) passed every check, then simulate raised
    OverflowError converting the block count to the kernel's int64 (in a sweep, after the store
    existed); block_size = 2**40 asked numpy for 8 TiB (the engine's block phases, an int64 each).
    The domains now stop below 2**62 tokens (the kernel's 2**62 blocks stand for no limit, and
    tokens + block_size - 1 must stay below 2**63) and at 2**20 tokens a block: refused at
    construction, and in a spec before its store exists; the largest values run."""
    import numpy as np
    import scipy.stats as st

    from mbbatch.params import MAX_BLOCK_SIZE, MAX_KV_TOKENS
    from mbbatch.sweeps.spec import SpecError, parse_spec

    for kw, match in ((dict(kv_tokens=1e30), r"^kv_tokens must be in \(0, 2\*\*62\) or inf; got 1e\+30$"),
                      (dict(kv_tokens=1e19, block_size=1), r"^kv_tokens must be in \(0, 2\*\*62\) or inf; got 1e\+19$"),
                      (dict(kv_tokens=2.0 ** 62), r"^kv_tokens must be in \(0, 2\*\*62\) or inf"),
                      (dict(block_size=2 ** 40),
                       r"^block_size must be an integer in \[1, 1048576\]; got 1099511627776$")):
        with pytest.raises(ValueError, match=match):
            mb.ContinuousBatching(**kw)
    with pytest.raises(SpecError, match=r"kv_tokens must be in \(0, 2\*\*62\) or inf; got 1e\+30"):
        parse_spec('name = "c"\npolicy = "continuous"\nservice_model = "iteration"\n'
                   '[params]\nrate = 1.0\nkv_tokens = 1e30\n')
    from mbbatch._kernels.continuous import UNLIMITED

    assert MAX_KV_TOKENS <= UNLIMITED and MAX_KV_TOKENS + MAX_BLOCK_SIZE < 2.0 ** 63
    wl = mb.Workload(prompt=st.lognorm(0.5, scale=64), output=st.lognorm(0.5, scale=32))
    for kw in (dict(kv_tokens=float(np.nextafter(MAX_KV_TOKENS, 0)), block_size=1),
               dict(kv_tokens=float(np.nextafter(MAX_KV_TOKENS, 0)), block_size=MAX_BLOCK_SIZE),
               dict(block_size=MAX_BLOCK_SIZE)):
        res = mb.simulate(mb.ContinuousBatching(**kw), mb.Poisson(1.0), workload=wl, n=200, seed=1)
        assert res.completed == 200


def test_edges_given_as_one_number_are_refused_naming_edges():
    """edges=100.0 said "'float' object is not iterable" (the tuple of its items was taken before
    any check), edges=["ab"] "could not convert string to float": the edges are checked as the
    parameter table's ContinuousBatching.edges (a 1-D sequence of finite reals) first."""
    import math

    with pytest.raises(ValueError, match=r"^edges must be a 1-D sequence; got a scalar, 100\.0$"):
        mb.ContinuousBatching(admission="multibin", bins=2, edges=100.0)
    with pytest.raises(TypeError, match=r"^edges must be a 1-D sequence of real numbers; got an element 'ab' \(str\)$"):
        mb.ContinuousBatching(admission="multibin", bins=2, edges=["ab"])
    with pytest.raises(ValueError, match=r"^edges must hold values in \(-inf, inf\); got edges\[0\] = inf$"):
        mb.ContinuousBatching(admission="multibin", bins=2, edges=[math.inf])
    assert mb.ContinuousBatching(admission="multibin", bins=2, edges=[100]).edges == (100.0,)
    assert mb.ContinuousBatching(admission="multibin", bins=1, edges=()).edges == ()


def _atoms():
    import numpy as np
    import scipy.stats as st

    # a discrete output law: equal-mass quartiles at 10, 10, 20, 20
    return mb.Workload(prompt=st.lognorm(0.5, scale=64),
                       output=mb.Empirical(np.array([10.0] * 50 + [20.0] * 50 + [400.0])))


def test_equal_mass_edges_on_atoms_name_the_callers_argument():
    """Multi-bin admission on output lengths with atoms (equal-mass edges that coincide) said "pass
    MultiBin(edges=...)", the wrong class for ContinuousBatching: the lengths' equal-mass edges take
    the argument the caller's user passes instead (MultiBin's by default)."""
    with pytest.raises(ValueError, match=r"not strictly increasing \(\[10\.0, 10\.0, 20\.0, 20\.0, 400\.0\]\): the "
                                         r"values have atoms .*; pass ContinuousBatching\(edges=\.\.\.\) explicitly"):
        _atoms()._output.equal_mass_edges(4, "ContinuousBatching(edges=...)")
    with pytest.raises(ValueError, match=r"pass MultiBin\(edges=\.\.\.\) explicitly"):
        _atoms()._output.equal_mass_edges(4)


def test_multibin_admission_on_lengths_with_atoms_names_continuous_batchings_edges():
    """The same refusal from a simulation: it named MultiBin(edges=...)."""
    with pytest.raises(ValueError, match=r"pass ContinuousBatching\(edges=\.\.\.\) explicitly"):
        mb.simulate(mb.ContinuousBatching(admission="multibin", bins=4), mb.Poisson(1.0), workload=_atoms(), n=100,
                    seed=1)
