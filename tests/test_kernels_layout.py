"""Kernel argument layouts (mbbatch/_kernels/layout.py): one declaration gives
the kernels constant indices and the callers their packing, refusing what
does not fit; every layout the kernels declare is consistent."""

import numpy as np
import pytest
from numba import njit

from mbbatch._kernels import controller, dynamic, multibin
from mbbatch._kernels.layout import Arrays, Layout

RUN = Layout("run", ints=("n", "bins"), floats=("rate", "scale"))


def test_index_counts_ints_and_floats_apart():
    assert RUN.index == (0, 1, 0, 1)
    assert (RUN.index.n, RUN.index.bins, RUN.index.rate, RUN.index.scale) == (0, 1, 0, 1)
    assert RUN.size == 4


def test_pack_and_unpack():
    ints, floats = RUN.pack(n=10, bins=np.int64(4), rate=2, scale=0.5)
    assert ints.dtype == np.int64 and floats.dtype == np.float64
    assert ints.tolist() == [10, 4] and floats.tolist() == [2.0, 0.5]
    assert RUN.unpack((ints, floats)) == {"n": 10, "bins": 4, "rate": 2.0, "scale": 0.5}
    assert RUN.unpack(RUN.zeros(n=3)) == {"n": 3, "bins": 0, "rate": 0.0, "scale": 0.0}


def test_pack_refuses_missing_unknown_and_non_integer_fields():
    with pytest.raises(TypeError, match=r"run: missing fields \['scale'\]"):
        RUN.pack(n=1, bins=1, rate=1.0)
    with pytest.raises(TypeError, match=r"unknown fields \['servers'\]"):
        RUN.pack(n=1, bins=1, rate=1.0, scale=1.0, servers=2)
    with pytest.raises(TypeError, match="bins must be an integer; got 4.0"):
        RUN.pack(n=1, bins=4.0, rate=1.0, scale=1.0)
    with pytest.raises(ValueError, match="duplicate"):
        Layout("bad", ints=("a",), floats=("a",))


def test_integers_travel_as_integers():
    """2**53 + 1 is not a float64: an integer field keeps it."""
    ints, _ = RUN.pack(n=2 ** 53 + 1, bins=1, rate=1.0, scale=1.0)
    assert int(ints[RUN.index.n]) == 2 ** 53 + 1


R = RUN.index


@njit
def _read(vectors):
    ints, floats = vectors
    return ints[R.bins], floats[R.scale]


def test_a_kernel_reads_fields_by_name():
    assert _read(RUN.pack(n=1, bins=7, rate=1.0, scale=0.25)) == (7, 0.25)


def test_records_and_rows():
    ints, floats = RUN.records(3)
    assert ints.shape == (2, 3) and floats.shape == (2, 3)
    assert (ints == -1).all() and np.isnan(floats).all()
    rows = RUN.rows((ints, floats))
    assert list(rows) == ["rate", "scale", "n", "bins"]   # the float fields first
    rows["n"][1] = 5
    assert ints[R.n, 1] == 5                               # views, not copies
    assert (RUN.records(2, fill=0)[1] == 0).all()


Pair = Arrays("Pair", __name__, readonly=True, a=np.float64, b=(np.int64, 2))
Box = Arrays("Box", __name__, a=np.float64)


def test_arrays_pack_gives_one_type_per_field():
    x = np.arange(6.0)[::2]                     # not contiguous
    y = np.zeros((2, 2), np.int32)              # another dtype
    p = Pair.pack(a=x, b=y)
    assert isinstance(p, Pair.type) and p._fields == ("a", "b")
    assert p.a.flags.c_contiguous and p.a.dtype == np.float64 and not p.a.flags.writeable
    assert p.b.dtype == np.int64 and not p.b.flags.writeable
    # a read-only input and a writable one give the same kernel type: one specialization
    ro = np.arange(3.0)
    ro.flags.writeable = False
    assert Pair.pack(a=ro, b=y).a.flags.writeable is False
    w = np.arange(3.0)
    assert Pair.pack(a=w, b=y).a.base is w       # a view, no copy
    assert Box.pack(a=w).a is w                  # outputs: the array itself


def test_arrays_pack_refuses_missing_unknown_and_wrong_dimensions():
    with pytest.raises(TypeError, match=r"Pair: missing fields \['b'\]"):
        Pair.pack(a=np.zeros(2))
    with pytest.raises(TypeError, match=r"unknown fields \['c'\]"):
        Box.pack(a=np.zeros(2), c=np.zeros(2))
    with pytest.raises(ValueError, match=r"Pair.b must have 2 dimension\(s\); got shape \(3,\)"):
        Pair.pack(a=np.zeros(2), b=np.zeros(3))


LAYOUTS = [multibin.CONFIG, multibin.STATS, multibin.REQUESTS, dynamic.RUN, dynamic.POLICY, dynamic.MODEL,
           dynamic.STATS, dynamic.TIME_SERIES, dynamic.REQUESTS, dynamic.BATCHES, dynamic.FIELDS, dynamic.SERVERS,
           dynamic.LOOP, controller.SLA, controller.MEMORY, controller.CONTROLLER, controller.BATCH_STATS]
GROUPS = [multibin.INPUTS, multibin.OUTPUTS, multibin.WORKSPACE, dynamic.INPUTS, dynamic.OUTPUTS,
          dynamic.WORKSPACE]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_kernel_layouts_are_consecutive(layout):
    assert list(layout.index) == [*range(len(layout.ints)), *range(len(layout.floats))]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.type.__name__)
def test_kernel_argument_types_are_importable(group):
    """numba's disk cache pickles a kernel's argument types by name."""
    cls = group.type
    assert getattr(__import__(cls.__module__, fromlist=["_"]), cls.__name__) is cls
    for tup in (multibin.MultiBinStreams, dynamic.TokenStreams, dynamic.TokenConfig):
        assert getattr(__import__(tup.__module__, fromlist=["_"]), tup.__name__) is tup


def test_the_old_statistics_names_results_py_reads():
    assert (multibin.S_FIRST_ARRIVAL, multibin.I_EXCLUDED) == (multibin.S.first_arrival, multibin.S.excluded)
