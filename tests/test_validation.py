"""Validation at the boundary (mbbatch/_validation.py and the constructors).

The rule: a scalar parameter refuses lists, arrays, strings, bools and
complex numbers with a ``TypeError`` naming it; a value outside its domain
(NaN, inf, negative where not allowed, a count beyond 64 bits) is a
``ValueError`` naming the parameter and its range.  Sequence parameters
refuse strings, bools, dicts and nested lists with a ``TypeError`` and
wrong shapes with a ``ValueError``.

The domains below are written out here, not read from ``DOMAINS``, so the
table is checked too.  The property tests drive every public constructor:
one valid call, one argument replaced by a bad value, and an oracle that says
what the rule demands for that value: refused with ``TypeError``, refused
with ``ValueError``, or accepted.
"""

import math
import re

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given
from hypothesis import strategies as hs
from hypothesis.extra import numpy as hnp

import mbbatch as mb
from mbbatch._validation import Domain

INT64_MAX = 2**63 - 1
U = st.uniform(1, 10)


# --------------------------------------------------------------------------
# the oracle: what the rule demands for one value of one kind of parameter
# --------------------------------------------------------------------------

OK = "ok"                  # valid on its own; the call must succeed
REFUSED = "refused"        # TypeError or ValueError, either is right
MAYBE = "ok or ValueError" # numerically fine; other constraints (order, length) decide


def interval(text: str) -> Domain:
    """``"(0, inf)"`` -> Domain(0, inf), ends open or closed as written."""
    m = re.fullmatch(r"([\[(])(-?[\w.+]+), (-?[\w.+]+)([\])])", text)
    lo, hi = float(m.group(2)), float(m.group(3))
    return Domain(lo, hi, lo_closed=m.group(1) == "[", hi_closed=m.group(4) == "]")


def _is_bool(v):
    return isinstance(v, (bool, np.bool_))


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not _is_bool(v)


def _is_float(v):
    return isinstance(v, (float, np.floating))


def _is_number(v):
    return _is_int(v) or _is_float(v)


def _in(domain: Domain, x) -> bool:
    try:
        return bool(domain.contains(float(x)))
    except OverflowError:  # an int beyond the float range is in no domain
        return False


class Real:
    """A real scalar in ``domain``: ints accepted, bools never."""

    def __init__(self, domain, cross=False):
        self.text, self.domain, self.cross = domain, interval(domain), cross

    def expect(self, v):
        if not _is_number(v):
            return TypeError
        return OK if _in(self.domain, v) else ValueError


class Count:
    """An integer in ``domain`` below 2**63: floats (even 4.0) and bools are the
    wrong kind, NaN and inf out of the domain."""

    def __init__(self, domain, cross=False, optional=False):
        self.text, self.domain, self.cross, self.optional = domain, interval(domain), cross, optional

    def expect(self, v):
        if v is None and self.optional:
            return OK
        if _is_float(v):
            return TypeError if math.isfinite(v) else ValueError
        if not _is_int(v):
            return TypeError
        return OK if int(v) <= INT64_MAX and _in(self.domain, v) else ValueError


class Flag:
    text, cross = None, False

    def expect(self, v):
        return OK if _is_bool(v) else TypeError


class Choice:
    text, cross = None, False

    def __init__(self, *choices):
        self.choices = choices

    def expect(self, v):
        if not isinstance(v, str):
            return TypeError
        return OK if v in self.choices else ValueError


class Instance:
    text, cross = None, False

    def __init__(self, cls):
        self.cls = cls

    def expect(self, v):
        return OK if v is None or isinstance(v, self.cls) else TypeError


class Sequence:
    """A 1-D sequence of reals (or of counts) in ``domain``.  ``exact``: no
    constraint beyond the domain, so a numeric 1-D value is decided here."""

    cross = True

    def __init__(self, domain, integer=False, allow_scalar=False, allow_empty=False, optional=False,
                 exact=False):
        self.text, self.domain = None, interval(domain)
        self.integer, self.allow_scalar, self.allow_empty = integer, allow_scalar, allow_empty
        self.optional, self.exact = optional, exact

    def _element(self, x):
        # None: fine; else the refusal an element of this kind demands
        if self.integer:
            if _is_float(x):
                return REFUSED
            return None if _is_int(x) else TypeError
        return None if _is_number(x) else TypeError

    def _values(self, values):
        if self.integer and any(_is_int(x) and not -INT64_MAX <= int(x) <= INT64_MAX for x in values):
            return ValueError
        if not all(_in(self.domain, x) for x in values):
            return ValueError
        return OK if self.exact else MAYBE

    def expect(self, v):
        if v is None:
            return OK if self.optional else TypeError
        if isinstance(v, (list, tuple)):
            kinds = {self._element(x) for x in v} - {None}
            if kinds:
                return TypeError if kinds == {TypeError} else REFUSED
            if not v and not self.allow_empty:
                return ValueError
            return self._values(v)
        if isinstance(v, np.ndarray):
            k = v.dtype.kind
            if k == "O":
                return self.expect(v.tolist()) if v.ndim == 1 else REFUSED
            if k == "f" and self.integer:
                return REFUSED
            if k not in "iuf":
                return TypeError
            if v.ndim == 0:
                return self._values([v.item()]) if self.allow_scalar else ValueError
            if v.ndim != 1 or (v.size == 0 and not self.allow_empty):
                return ValueError
            return self._values(v.tolist())
        if _is_number(v):
            if self.integer:
                return REFUSED
            return self._values([v]) if self.allow_scalar else ValueError
        return TypeError


DISTRIBUTIONS = {
    # id -> (value, outcome as a service-time or token-length distribution)
    "uniform": (U, OK),
    "lognorm(300)": (st.lognorm(300), ValueError),          # infinite mean
    "expon(scale=1e308)": (st.expon(scale=1e308), ValueError),  # draws overflow to inf
    "expon(loc=1e300)": (st.expon(loc=1e300), ValueError),  # draws above 1e290
    "uniform(-1, 2)": (st.uniform(-1, 2), ValueError),      # negative support
    "norm": (st.norm(), ValueError),                          # negative support
    "truncpareto": (st.truncpareto(1.5, 20), OK),             # drawn in Python, from its rvs
    "pareto(0.5)": (st.pareto(0.5), ValueError),              # infinite mean
    "unfrozen uniform": (st.uniform, TypeError),
    "poisson(3)": (st.poisson(3), TypeError),                 # discrete
    "uniform([1, 2], 10)": (st.uniform([1, 2], 10), TypeError),  # a vector of distributions
}


class Service(Sequence):
    """A frozen continuous distribution or an array of values in [0, 1e290]."""

    def __init__(self):
        super().__init__("[0, 1e290]", exact=True)
        self.cross = False

    def expect(self, v):
        for dist, outcome in DISTRIBUTIONS.values():
            if v is dist:
                return outcome
        return super().expect(v)


# --------------------------------------------------------------------------
# every public constructor: one valid call and the kind of each parameter
# --------------------------------------------------------------------------

WORKLOAD = dict(prompt=U, output=st.uniform(1, 100))
CONSTRUCTORS = {
    mb.Poisson: (dict(rate=8.0), {"rate": Real("(0, inf)")}),
    mb.PiecewisePoisson: (dict(rates=(1.0, 5.0), ends=(600.0,)), {
        "rates": Sequence("(0, inf)", allow_scalar=True),
        "ends": Sequence("(0, inf)", allow_scalar=True, allow_empty=True)}),
    mb.Replay: (dict(times=[0.0, 1.0, 2.0]), {"times": Sequence("(-inf, inf)")}),
    mb.MultiBin: (dict(bins=2, batch_size=4, edges=None, max_wait=math.inf), {
        "bins": Count("[1, inf)"),
        "batch_size": Count("[1, inf)"),
        "edges": Sequence("[-inf, inf]", optional=True),
        "max_wait": Real("[0, inf]")}),
    mb.StaticBatching: (dict(batch_size=4, sla=None, memory=None), {
        "batch_size": Count("[1, inf)"),
        "sla": Instance(mb.SLAController),
        "memory": Instance(mb.Memory)}),
    mb.DynamicBatching: (dict(controller=None, memory=None, max_candidates=None, pin=None), {
        "controller": Instance(mb.SLAController),
        "memory": Instance(mb.Memory),
        "max_candidates": Count("[1, inf)", optional=True),
        "pin": Count("[1, inf)", optional=True, cross=True)}),       # pin <= controller.b_max
    mb.MultiBinDynamic: (dict(bins=2, selection="round_robin", warmup=10, bin_b_max=None, controller=None,
                              memory=None, max_candidates=None, pin=None), {
        "bins": Count("[1, inf)", cross=True),                         # bins <= warmup
        "selection": Choice("round_robin", "longest_queue"),
        "warmup": Count("[1, inf)", cross=True),
        "bin_b_max": Sequence("[1, inf)", integer=True, optional=True),
        "controller": Instance(mb.SLAController),
        "memory": Instance(mb.Memory),
        "max_candidates": Count("[1, inf)", optional=True),
        "pin": Count("[1, inf)", optional=True, cross=True)}),
    mb.Workload: (dict(**WORKLOAD, integer_lengths=True, predictor_sigma=0.0), {
        "prompt": Service(),
        "output": Service(),
        "integer_lengths": Flag(),
        "predictor_sigma": Real("[0, inf)")}),
    mb.MaxModel: (dict(base=0.0, per_token=1.0), {
        "base": Real("[0, 1e+290)"), "per_token": Real("(0, 1e+290)")}),
    mb.LinearModel: (dict(base=0.0, alpha=1e-3, beta=0.1), {
        "base": Real("[0, 1e+290)"), "alpha": Real("(0, 1e+290)"), "beta": Real("[0, inf)")}),
    mb.DecodeModel: (dict(beta=5.74e-3, gamma=0.316, prefill_per_token=0.0), {
        "beta": Real("(0, 1e+290)"), "gamma": Real("[0, inf)"), "prefill_per_token": Real("[0, 1e+290)")}),
    mb.Memory: (dict(m_max_gb=80.0, m_model_gb=8.0, kv_mem_per_token_gb=4e-4, variant="l0", eps_m=0.05,
                     enabled=True), {
        # m_model_gb < m_max_gb, and the token capacity eta must be finite
        "m_max_gb": Real("(0, inf)", cross=True),
        "m_model_gb": Real("[0, inf)", cross=True),
        "kv_mem_per_token_gb": Real("(0, inf)", cross=True),
        "variant": Choice("l0", "clt"),
        "eps_m": Real("(0, 1)"),
        "enabled": Flag()}),
    mb.SLAController: (dict(d_sla=7.5e-3, eps_d=5e-5, b_min=1, b_max=256, alpha=4, delta=2, variant="spec"), {
        "d_sla": Real("(0, inf)"),
        "eps_d": Real("[0, inf)"),
        "b_min": Count("[1, inf)", cross=True),                        # b_min <= b_max
        "b_max": Count("[1, inf)", cross=True),
        "alpha": Count("[0, inf)"),
        "delta": Count("[0, inf)"),
        "variant": Choice("spec", "multiplicative")}),
}
CASES = [(cls, name) for cls, (_, params) in CONSTRUCTORS.items() for name in params]
CASE_IDS = [f"{cls.__name__}.{name}" for cls, name in CASES]


class Opaque:
    def __repr__(self):
        return "Opaque()"


#: Named bad values, each tried on every parameter.
BAD_VALUES = {
    "None": None, "empty list": [], "empty tuple": (), "list [8.0]": [8.0], "list [1, 2]": [1, 2],
    "nested list": [[1.0, 2.0]], "nested empty": [[]], "ragged": [[1.0], [2.0, 3.0]],
    "list of str": ["a", "b", "c"], "list of bools": [True, False], "mixed list": [1.0, "a"],
    "list with nan": [1.0, math.nan], "list of huge ints": [2**63, 2**64],
    "float array": np.array([1.0, 2.0, 3.0]), "int array": np.array([1, 2, 3], dtype=np.int64),
    "2-D array": np.array([[1.0, 2.0]]), "0-d array": np.array(8.0), "empty array": np.array([]),
    "bool array": np.array([True, False]), "str array": np.array(["1", "2"]),
    "object array": np.array([None, "a"], dtype=object), "complex array": np.array([1 + 1j]),
    "uint64 array": np.array([2**63], dtype=np.uint64),
    "empty str": "", "numeric str": "8", "str": "abc", "str inf": "inf", "bytes": b"8",
    "True": True, "False": False, "np.True_": np.True_,
    "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "np.nan": np.float64("nan"),
    "-1.0": -1.0, "-1": -1, "0": 0, "0.0": 0.0, "4.0": 4.0, "0.5": 0.5, "1": 1, "tiny": 1e-320,
    "1e308": 1e308, "10**30": 10**30, "2**63": 2**63, "2**63-1": 2**63 - 1, "-2**63-1": -(2**63) - 1,
    "10**400": 10**400, "np.float64(8.0)": np.float64(8.0), "np.int64(4)": np.int64(4),
    "np.float32(0.5)": np.float32(0.5), "complex": 1 + 0j, "imaginary": 2j,
    "empty dict": {}, "dict": {"a": 1}, "int dict": {1: 2}, "set": {1.0}, "object": Opaque(),
    **{f"dist {k}": v for k, (v, _) in DISTRIBUTIONS.items()},
}


def _call(cls, name, value):
    base, _ = CONSTRUCTORS[cls]
    return cls(**{**base, name: value})


def _check(cls, name, value):
    """Call with one argument replaced; assert what the oracle demands."""
    kind = CONSTRUCTORS[cls][1][name]
    expected = kind.expect(value)
    try:
        _call(cls, name, value)
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        assert re.search(rf"\b{re.escape(name)}\b", msg), (
            f"{cls.__name__}({name}={value!r}): the message does not name {name}: {msg}")
        if expected == OK or expected == MAYBE:
            # valid on its own: only a constraint between parameters may refuse it
            assert (kind.cross or expected == MAYBE) and isinstance(exc, ValueError), (
                f"{cls.__name__}({name}={value!r}) is valid but was refused: {type(exc).__name__}: {msg}")
        elif expected != REFUSED:
            assert isinstance(exc, expected), (
                f"{cls.__name__}({name}={value!r}): expected {expected.__name__}, "
                f"got {type(exc).__name__}: {msg}")
            if expected is ValueError and kind.text is not None:
                # scalars out of their domain: the message gives the range
                assert kind.text in msg, f"{cls.__name__}({name}={value!r}): no range in {msg}"
    else:
        assert expected in (OK, MAYBE), (
            f"{cls.__name__}({name}={value!r}) was accepted; expected {getattr(expected, '__name__', expected)}")


@pytest.mark.parametrize("cls", list(CONSTRUCTORS), ids=lambda c: c.__name__)
def test_the_valid_base_calls_succeed(cls):
    base, params = CONSTRUCTORS[cls]
    assert set(params) == set(base), "every parameter of the base call has a kind"
    cls(**base)


def test_saturated_takes_no_parameters():
    assert mb.Saturated().describe() == {"arrivals": "saturated"}
    with pytest.raises(TypeError):
        mb.Saturated(8.0)


def test_the_oracle_refuses_the_named_bad_values():
    """No vacuous property: on every parameter most named bad values are refused."""
    for cls, name in CASES:
        kind = CONSTRUCTORS[cls][1][name]
        refused = [v for v in BAD_VALUES.values() if kind.expect(v) not in (OK, MAYBE)]
        assert len(refused) >= len(BAD_VALUES) // 2, (cls.__name__, name)


# (in-range extremes of d_sla, 4 to 1e308 s/token, are accepted with the unit warning)
@pytest.mark.filterwarnings("ignore:d_sla is in s/token")
@pytest.mark.parametrize("cls, name", CASES, ids=CASE_IDS)
def test_every_named_bad_value_is_refused_naming_the_parameter(cls, name):
    for value in BAD_VALUES.values():
        _check(cls, name, value)


# generated bad values, for the property test below
_scalars = hs.one_of(
    hs.floats(), hs.integers(min_value=-(2**70), max_value=2**70), hs.booleans(), hs.none(),
    hs.text(max_size=4), hs.floats(allow_nan=False).map(str), hs.integers(0, 300).map(str),
    hs.complex_numbers(max_magnitude=1e10),
)
_arrays = hs.one_of(
    hnp.arrays(hs.sampled_from([np.float64, np.int64, np.bool_, np.complex128, "<U3"]),
               hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3)),
    hs.lists(hs.one_of(hs.none(), hs.text(max_size=2), hs.floats()), max_size=3).map(
        lambda x: np.array(x, dtype=object)),
)
BAD = hs.one_of(
    _scalars,
    hs.lists(_scalars, max_size=4),
    hs.lists(hs.lists(hs.floats(), max_size=3), max_size=3),
    hs.tuples(hs.floats(), hs.floats()),
    _arrays,
    hs.dictionaries(hs.text(max_size=2), hs.integers(), max_size=2),
    hs.sampled_from(list(BAD_VALUES.values())),
)


@pytest.mark.parametrize("cls, name", CASES, ids=CASE_IDS)
@given(value=BAD)
def test_any_bad_argument_is_refused_naming_the_parameter(cls, name, value):
    _check(cls, name, value)


# --------------------------------------------------------------------------
# regressions: each named after the fault a user found
# --------------------------------------------------------------------------

def test_poisson_rate_list_is_refused_not_a_numba_typing_error():
    # np.asarray([8.0]) passed the domain check as an array, which numba cannot type as the float rate
    with pytest.raises(TypeError, match=r"^rate must be a real number"):
        mb.Poisson(rate=[8.0])


@pytest.mark.parametrize("max_wait", [[1, 2], []], ids=["list", "empty"])
def test_multibin_max_wait_list_is_refused_not_a_numba_typing_error(max_wait):
    # a list became an array (an empty one has no element outside the domain) and reached the kernel
    with pytest.raises(TypeError, match=r"^max_wait must be a real number"):
        mb.MultiBin(bins=2, batch_size=4, max_wait=max_wait)


def test_multibin_string_edges_error_names_edges():
    # np.asarray(edges, dtype=float) raised numpy's "could not convert string to float: 'a'"
    with pytest.raises(TypeError, match=r"^edges must be a 1-D sequence of real numbers"):
        mb.MultiBin(bins=2, batch_size=4, edges=["a", "b", "c"])


def test_replay_string_times_error_names_times():
    # np.asarray(times, dtype=float) raised numpy's "could not convert string to float: 'a'"
    with pytest.raises(TypeError, match=r"^times must be a 1-D sequence of real numbers"):
        mb.Replay(["a", "b"])


@pytest.mark.parametrize("make, name", [
    (lambda: mb.SLAController(d_sla=[7e-3, 8e-3]), "d_sla"),
    (lambda: mb.DecodeModel(beta=[1e-3, 2e-3]), "beta"),
    (lambda: mb.Memory(m_max_gb=[80.0, 90.0]), "m_max_gb"),
], ids=["d_sla", "beta", "m_max_gb"])
def test_list_for_a_real_parameter_is_refused_naming_it(make, name):
    # the list became an array that passed the domain check, stored (d_sla, beta) or compared
    # later ("truth value of an array is ambiguous", naming nothing)
    with pytest.raises(TypeError, match=rf"^{name} must be a real number"):
        make()


@pytest.mark.parametrize("make, name", [
    (lambda: mb.Poisson(rate="8"), "rate"),
    (lambda: mb.MultiBin(bins=2, batch_size=4, max_wait="5"), "max_wait"),
    (lambda: mb.theory.throughput(128, "1", 20.0, 4), "l_min"),
    (lambda: mb.theory.exponential_boundaries(200, np.array(["0.1"]), 2), "mu"),
    (lambda: mb.theory.exponential_boundaries(200, np.array([0.1, None]), 2), "mu"),
], ids=["rate", "max_wait", "theory-l_min", "theory-mu-str-array", "theory-mu-object-array"])
def test_numeric_string_is_refused_not_parsed(make, name):
    # np.asarray("8", dtype=float) parses a numeric string into 8.0
    with pytest.raises(TypeError, match=rf"^{name} must be"):
        make()


def test_boolean_service_array_is_refused():
    # np.asarray(dtype=float) turned [True, False] into service times [1.0, 0.0]
    with pytest.raises(TypeError, match=r"^service must be"):
        mb.simulate(mb.MultiBin(1, 1, edges=[0, 1]), mb.Saturated(), service=np.array([True, False]), n=2)


@pytest.mark.parametrize("dist, what", [
    (st.lognorm(300), "mean inf"),                    # exp(300**2 / 2) overflows
    (st.expon(scale=1e308), r"isf\(2\*\*-64\) = inf"),  # a draw of 1e308 * 44 overflows
    (st.weibull_min(0.005), "mean inf"),
], ids=["lognorm(300)", "expon(scale=1e308)", "weibull_min(0.005)"])
def test_service_distribution_with_infinite_draws_is_refused(dist, what):
    # the kernel drew infinite service times and the run returned throughput 0.0
    with pytest.raises(ValueError, match=rf"^service .*{what}"):
        mb.simulate(mb.MultiBin(1, 2), mb.Saturated(), dist, n=100, seed=0)
    with pytest.raises(ValueError, match=rf"^output .*{what}"):
        mb.Workload(prompt=U, output=dist)


def test_heavy_but_finite_service_distribution_is_accepted():
    # the refusal is about overflow, not heavy tails: isf(2**-64) = 5e164 here
    mb.Workload(prompt=U, output=st.weibull_min(0.01))


def test_service_times_above_1e290_are_refused():
    # sums of such service times over many requests overflow to inf
    with pytest.raises(ValueError, match=r"^service must hold values in \[0, 1e\+290\]; "
                                         r"got service\[1\] = 1e\+300"):
        mb.simulate(mb.MultiBin(1, 2), mb.Saturated(), [1.0, 1e300], n=2)
    with pytest.raises(ValueError, match=r"^prompt must hold values"):
        mb.Workload(prompt=[1.0, 1e300], output=U)


def test_vector_distribution_is_refused_naming_the_parameter():
    # scipy freezes array arguments into a vector of distributions; float() of its support failed
    with pytest.raises(TypeError, match=r"^prompt loc must be a real number"):
        mb.Workload(prompt=st.uniform([1, 2], 10), output=U)


def test_constant_service_array_with_one_bin_runs():
    # equal-mass edges of a constant array are [3, 3], refused as "not strictly increasing"
    # although one bin takes every request whatever its edges
    res = mb.simulate(mb.MultiBin(bins=1, batch_size=4), arrivals=mb.Saturated(), service=np.full(100, 3.0),
                      n=100, seed=0)
    # 25 batches of 3 s back to back: span 75 s
    assert res.throughput == 100 / 75
    assert res.edges.tolist() == [3.0, 3.0]
    assert mb.MultiBin(bins=1, batch_size=4, edges=[3.0, 3.0]).edges.tolist() == [3.0, 3.0]


def test_constant_service_array_with_two_bins_is_still_refused():
    # atoms make equal-mass bins ill-defined for k > 1
    with pytest.raises(ValueError, match="not strictly increasing"):
        mb.simulate(mb.MultiBin(bins=2, batch_size=4), arrivals=mb.Saturated(), service=np.full(100, 3.0),
                    n=100, seed=0)
    with pytest.raises(ValueError, match="^edges must be strictly increasing"):
        mb.MultiBin(bins=2, batch_size=4, edges=[1.0, 3.0, 3.0])


@pytest.mark.parametrize("make, name", [
    (lambda: mb.MultiBinDynamic(selection=["round_robin"]), "selection"),
    (lambda: mb.MultiBinDynamic(selection={"round_robin": 1}), "selection"),
    (lambda: mb.Memory(variant={}), "variant"),
    (lambda: mb.Memory(variant=1), "variant"),
    (lambda: mb.SLAController(variant=["spec"]), "variant"),
], ids=["selection-list", "selection-dict", "memory-dict", "memory-int", "controller-list"])
def test_choice_given_a_non_string_is_a_type_error_naming_it(make, name):
    # a list or dict was compared to the choices and reported as an unknown value, or raised
    # an unhashable-type error naming nothing
    with pytest.raises(TypeError, match=rf"^{name} must be one of"):
        make()


@pytest.mark.parametrize("make, name", [
    (lambda: mb.Workload(**WORKLOAD, integer_lengths=1), "integer_lengths"),
    (lambda: mb.Workload(**WORKLOAD, integer_lengths="yes"), "integer_lengths"),
    (lambda: mb.Memory(enabled=0), "enabled"),
    (lambda: mb.Memory(enabled=[True]), "enabled"),
], ids=["int", "str", "zero", "list"])
def test_flag_refuses_non_bools(make, name):
    # 1 and "yes" are truthy; a flag must say True or False
    with pytest.raises(TypeError, match=rf"^{name} must be a bool"):
        make()


def test_numpy_bool_flag_is_stored_as_a_python_bool():
    assert mb.Memory(enabled=np.False_).enabled is False


@pytest.mark.parametrize("make, exc, name", [
    (lambda: mb.PiecewisePoisson("abc"), TypeError, "rates"),
    (lambda: mb.PiecewisePoisson([True, True], [1.0]), TypeError, "rates"),       # were rates 1.0, 1.0
    (lambda: mb.PiecewisePoisson([1.0, 2.0], ["1"]), TypeError, "ends"),          # was parsed
    (lambda: mb.PiecewisePoisson([[1.0, 2.0]], [3.0]), TypeError, "rates"),
    (lambda: mb.PiecewisePoisson({1.0: 2.0}), TypeError, "rates"),
    (lambda: mb.PiecewisePoisson(np.ones((2, 2)), [1.0]), ValueError, "rates"),
    (lambda: mb.MultiBinDynamic(bins=1, bin_b_max={1: 2}), TypeError, "bin_b_max"),  # iterated the keys
    (lambda: mb.MultiBinDynamic(bins=1, bin_b_max=5), ValueError, "bin_b_max"),      # "int is not iterable"
    (lambda: mb.MultiBinDynamic(bins=2, bin_b_max=np.array([True, True])), TypeError, "bin_b_max"),
    (lambda: mb.MultiBinDynamic(bins=2, bin_b_max=[[4, 4]]), TypeError, "bin_b_max"),
    (lambda: mb.MultiBinDynamic(bins=2, bin_b_max=[4.0, 4.0]), TypeError, "bin_b_max"),
    (lambda: mb.MultiBin(bins=1, batch_size=4, edges=[False, True]), TypeError, "edges"),  # was [0, 1]
    (lambda: mb.MultiBin(bins=1, batch_size=4, edges=[[1.0], [2.0]]), TypeError, "edges"),
    (lambda: mb.MultiBin(bins=1, batch_size=4, edges=np.array([[1.0], [2.0]])), ValueError, "edges"),
    (lambda: mb.MultiBin(bins=1, batch_size=4, edges="12"), TypeError, "edges"),
    (lambda: mb.Replay(np.array([False, True])), TypeError, "times"),             # was [0.0, 1.0]
    (lambda: mb.Replay({0: 1.0}), TypeError, "times"),                            # float() of a dict
    (lambda: mb.Replay([[0.0, 1.0]]), TypeError, "times"),
    (lambda: mb.Replay(np.zeros((2, 2))), ValueError, "times"),
    (lambda: mb.Replay(5.0), ValueError, "times"),
    (lambda: mb.MultiBinDynamic(warmup=None), TypeError, "warmup"),               # '<' with None
])
def test_sequence_parameter_refuses_wrong_kinds_and_shapes(make, exc, name):
    # strings, bools, dicts and nested lists went through np.asarray(dtype=float) or iteration
    with pytest.raises(exc, match=rf"^{name}"):
        make()


def test_sequence_parameters_accept_lists_tuples_and_arrays():
    assert mb.PiecewisePoisson(np.array([1, 2]), (5,)).rates == (1.0, 2.0)
    assert mb.PiecewisePoisson(2.0).rates == (2.0,)  # one rate for ever, as before
    assert mb.MultiBinDynamic(bins=2, bin_b_max=np.array([3, 4])).bin_b_max == (3, 4)
    assert mb.Replay(range(3)).times.tolist() == [0.0, 1.0, 2.0]
    assert mb.MultiBin(bins=1, batch_size=2, edges=(0, math.inf)).edges.tolist() == [0.0, math.inf]


def test_config_object_of_the_wrong_class_names_the_parameter():
    # kept: a Memory passed where an SLAController belongs
    with pytest.raises(TypeError, match=r"^sla must be an instance of SLAController; got Memory"):
        mb.StaticBatching(5, sla=mb.Memory())


def test_real_parameters_take_ints_and_numpy_scalars_as_floats():
    for rate in (8, np.int64(8), np.float64(8.0), np.float32(8.0)):
        p = mb.Poisson(rate=rate)
        assert p.rate == 8.0 and type(p.rate) is float
    pol = mb.MultiBin(np.int64(2), np.int64(4))
    assert (pol.bins, pol.batch_size) == (2, 4) and type(pol.bins) is int
    with pytest.raises(TypeError, match="^rate"):
        mb.Poisson(rate=np.True_)


@pytest.mark.parametrize("make, name", [
    (lambda: mb.MultiBin(bins=2, batch_size=2**63), "batch_size"),
    (lambda: mb.SLAController(b_max=10**30), "b_max"),
    (lambda: mb.theory.throughput([2**63], 1.0, 20.0, 4), "B"),   # was wrapped to -2**63: throughput < 0
    (lambda: mb.theory.throughput([2**64], 1.0, 20.0, 4), "B"),   # was an OverflowError
    (lambda: mb.Poisson(rate=10**400), "rate"),                   # was an OverflowError
])
def test_count_beyond_64_bits_is_a_value_error_naming_it(make, name):
    # kernels and theory hold counts in int64
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        make()


def test_n_beyond_64_bits_is_refused_before_the_kernel():
    # the kernel ran for ever on n = 2**63
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 9007199254740992\]; got 9223372036854775808"):
        mb.simulate(mb.MultiBin(1, 2), mb.Saturated(), U, n=2**63)
    # n is exact in float64 statistics up to 2**53
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 9007199254740992\]; got 9007199254740993"):
        mb.simulate(mb.MultiBin(1, 2), mb.Saturated(), U, n=2**53 + 1)


def test_memory_with_infinite_token_capacity_is_refused():
    # (80 - 8) / 1e-320 overflows: eta = inf
    with pytest.raises(ValueError, match="kv_mem_per_token_gb"):
        mb.Memory(kv_mem_per_token_gb=1e-320)


def test_theory_functions_still_broadcast_arrays():
    B = np.array([[16], [128]])
    got = mb.theory.throughput(B, 1.0, [20.0, 30.0], 4)
    assert got.shape == (2, 2)
    assert got[1, 0] == mb.theory.throughput(128, 1.0, 20.0, 4)
    assert mb.theory.throughput([16, 128], 1.0, 20.0, np.int64(4)).shape == (2,)
    with pytest.raises(TypeError, match="^B must be"):
        mb.theory.throughput([16, True], 1.0, 20.0, 4)


@given(values=hnp.arrays(np.float64, hs.integers(1, 40),
                         elements=hs.sampled_from([0.0, 1.0, 5.0, 10.0, 20.0, -1.0, math.inf, -math.inf, math.nan])),
       closed=hs.booleans(), or_inf=hs.booleans())
def test_a_real_array_is_refused_at_its_first_value_outside_the_domain(values, closed, or_inf):
    """The arrays test read off their least and greatest values first
    (:func:`mbbatch._validation._all_inside`) refuse what the elementwise
    test refuses, naming the first value outside, and take the rest whole,
    with their ends (:func:`mbbatch._validation.real_array_ends`)."""
    from mbbatch._validation import check_real_array, real_array_ends

    domain = Domain(0.0, 10.0, lo_closed=closed, hi_closed=closed, or_inf=or_inf)
    bad = ~domain.contains(values)
    if bad.any():
        i = int(np.argmax(bad))
        with pytest.raises(ValueError, match=re.escape(f"x[{i}] = ")):
            check_real_array("x", values, domain)
    else:
        got = check_real_array("x", values, domain)
        np.testing.assert_array_equal(got, values)
        assert got is not values
        # (and the ends it read are the array's: what a replayed length's spec keeps)
        got, low, high = real_array_ends("x", values, domain)
        np.testing.assert_array_equal(got, values)
        assert (low, high) == (float(got.min()), float(got.max()))
