"""Kernel argument layouts, each declared once.

A kernel takes a handful of arguments, not sixty: its scalar configuration
as one int64 and one float64 vector, and its arrays grouped in namedtuples.
Both are declared once, in the kernel's module, and that declaration serves
both sides:

- :class:`Layout` (scalars).  The kernel reads ``ints[P.bins]`` and
  ``floats[P.rate]`` with ``P = POLICY.index``, a global namedtuple of ints
  that numba folds into constant offsets.  The caller writes
  ``POLICY.pack(bins=4, rate=2.0, ...)``, which refuses a missing or unknown
  field and a non-integer where an integer belongs, and reads outputs back
  with ``POLICY.unpack(vectors)``.  Integers travel as integers.
- :class:`Arrays` (arrays).  A namedtuple class, so the kernel reads
  ``requests.arrival``; ``pack`` checks the names and gives every array the
  one type the kernel was compiled for (dtype, dimensions, C order, and for
  inputs read-only), so no call compiles a second specialization.

Pure Python: nothing here is compiled.
"""

from __future__ import annotations

import operator
from collections import namedtuple

import numpy as np

__all__ = ["Layout", "Arrays"]


def _check_names(what: str, fields: tuple, given) -> None:
    missing = [f for f in fields if f not in given]
    unknown = sorted(set(given) - set(fields))
    if missing or unknown:
        raise TypeError(f"{what}: " + "; ".join(
            s for s in (missing and f"missing fields {missing}", unknown and f"unknown fields {unknown}") if s))


class Layout:
    """Named scalar fields, carried as an int64 vector and a float64 vector.

    Parameters
    ----------
    name : str
        What the fields describe, for error messages.
    ints, floats : sequence of str
        The integer and the floating-point fields, in vector order.

    Attributes
    ----------
    index : namedtuple of int
        Each field's position in its vector (ints and floats count apart).
    size : int
        Number of fields.

    Examples
    --------
    >>> RUN = Layout("run", ints=("n", "bins"), floats=("rate",))
    >>> RUN.index.bins, RUN.index.rate
    (1, 0)
    >>> RUN.pack(n=10, bins=4, rate=2.0)
    (array([10,  4]), array([2.]))
    >>> RUN.unpack(RUN.pack(n=10, bins=4, rate=2.0))
    {'n': 10, 'bins': 4, 'rate': 2.0}
    """

    def __init__(self, name: str, ints=(), floats=()):
        self.name = name
        self.ints = tuple(ints)
        self.floats = tuple(floats)
        fields = self.ints + self.floats
        if len(set(fields)) != len(fields):
            raise ValueError(f"{name}: duplicate fields in {fields}")
        self.index = namedtuple("Index", fields)(*range(len(self.ints)), *range(len(self.floats)))
        self.size = len(fields)

    def __repr__(self) -> str:
        return f"Layout({self.name!r}, ints={self.ints}, floats={self.floats})"

    def pack(self, **values) -> tuple[np.ndarray, np.ndarray]:
        """The ``(ints, floats)`` vectors of ``values``, one value per field."""
        _check_names(self.name, self.ints + self.floats, values)
        ints = np.empty(len(self.ints), np.int64)
        for j, f in enumerate(self.ints):
            try:
                ints[j] = operator.index(values[f])
            except TypeError:
                raise TypeError(f"{self.name}: {f} must be an integer; got {values[f]!r}") from None
        floats = np.array([float(values[f]) for f in self.floats], np.float64)
        return ints, floats

    def zeros(self, **values) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`pack` with every field not given set to 0 (an output's start)."""
        return self.pack(**{**dict.fromkeys(self.ints + self.floats, 0), **values})

    def unpack(self, vectors) -> dict:
        """``{field: value}`` of an ``(ints, floats)`` pair, as Python ints and floats."""
        ints, floats = vectors
        return {**{f: int(ints[j]) for j, f in enumerate(self.ints)},
                **{f: float(floats[j]) for j, f in enumerate(self.floats)}}

    def records(self, n: int, fill=None) -> tuple[np.ndarray, np.ndarray]:
        """Records of ``n`` items as an ``(ints, floats)`` pair of arrays of
        shape ``(fields, n)``, a row per field, filled with ``fill``; by
        default -1 in the integer rows and NaN in the float rows (what an
        unserved request or an unused row keeps)."""
        return (np.full((len(self.ints), n), -1 if fill is None else fill, np.int64),
                np.full((len(self.floats), n), np.nan if fill is None else fill, np.float64))

    def rows(self, records) -> dict:
        """``{field: row}`` of :meth:`records`, the float fields first: views,
        not copies."""
        ints, floats = records
        return {**dict(zip(self.floats, floats)), **dict(zip(self.ints, ints))}


class Arrays:
    """Named arrays that travel as one namedtuple argument.

    Parameters
    ----------
    typename : str
        Name of the namedtuple class (:attr:`type`).  Bind the class to this
        name in ``module``: numba's disk cache pickles it by reference.
    module : str
        The declaring module's ``__name__``.
    readonly : bool
        Inputs: :meth:`pack` hands the kernel read-only views (no copy), so a
        read-only array and a writable one give the same kernel type.
    optional : tuple of str
        The one-dimensional arrays :meth:`pack` may be given none of: empty
        then (a feature the run does not use).
    **fields : dtype or (dtype, ndim)
        The arrays, in order; one-dimensional unless ``ndim`` is given.
    """

    def __init__(self, typename: str, module: str, readonly: bool = False, optional: tuple = (), **fields):
        self.fields = {f: (np.dtype(spec), 1) if not isinstance(spec, tuple) else (np.dtype(spec[0]), spec[1])
                       for f, spec in fields.items()}
        self.readonly = readonly
        self.optional = tuple(optional)
        self.type = namedtuple(typename, tuple(self.fields), module=module)

    def pack(self, **arrays):
        """An instance of :attr:`type`: each array C-ordered in its declared
        dtype (a copy only where it is not already), read-only views for inputs."""
        arrays = {**{f: np.empty(0, self.fields[f][0]) for f in self.optional}, **arrays}
        _check_names(self.type.__name__, tuple(self.fields), arrays)
        out = {}
        for f, (dtype, ndim) in self.fields.items():
            a = np.ascontiguousarray(arrays[f], dtype=dtype)
            if a.ndim != ndim:
                raise ValueError(f"{self.type.__name__}.{f} must have {ndim} dimension(s); got shape {a.shape}")
            if self.readonly:
                a = a.view()
                a.flags.writeable = False
            out[f] = a
        return self.type(**out)

