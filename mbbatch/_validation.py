"""The checks that the parameter table (:mod:`mbbatch.params`) drives.

Every public entry point validates its arguments here before any work runs:
:func:`check` validates a value as one parameter of the table.

Errors follow one rule: ``ValueError`` for a value outside its domain (NaN and
inf included, also where a count belongs; a count beyond 64 bits; a sequence of
the wrong shape), ``TypeError`` for the wrong kind of value: a string, list,
array, dict, complex number or bool where a real number belongs; a float (even
4.0) or a bool where a count belongs; a string, bool, dict or nested list where
a sequence of numbers belongs.  Every message names the parameter and the
value, e.g. ``rate must be in (0, inf); got -1.0``.

numpy scalars count as the Python numbers they hold (``np.float64(8.0)`` is a
real number, ``np.int64(4)`` a count), and ``np.bool_`` as a bool.
"""

from __future__ import annotations

import decimal
import math
import numbers
import reprlib
import numpy as np

from .params import MAX_DURATION, PARAMS, SYMBOLS, Domain

__all__ = ["Domain", "DOMAINS", "check", "check_fields", "check_real", "check_count", "check_servers",
           "check_scalar_real", "check_real_array", "check_count_array", "check_flag", "check_choice",
           "check_instance", "MAX_DURATION"]


INF = math.inf

#: Domains by parameter key (from the table in :mod:`mbbatch.params`), and
#: by the multi-bin paper's symbols that :mod:`mbbatch.theory` takes.
DOMAINS: dict[str, Domain] = {
    **{key: p.domain for key, p in PARAMS.items() if p.domain is not None},
    **{sym: PARAMS[key].domain for sym, key in SYMBOLS.items()},
}


def check(key: str, value, name: str | None = None):
    """Validate ``value`` as parameter ``key`` of the table in
    :mod:`mbbatch.params` (its kind, domain and choices); ``name`` is the
    name in messages (default: the key without its class).  Returns the
    value normalised: a float, an int, a bool, a str or a new array."""
    p = PARAMS[key]
    name = name or key.rsplit(".", 1)[-1]
    if p.kind == "real":
        return check_scalar_real(name, value, p.domain)
    if p.kind == "count":
        return check_count(name, value, p.domain)
    if p.kind == "servers":
        return check_servers(value)
    if p.kind == "flag":
        return check_flag(name, value)
    if p.kind == "choice":
        return check_choice(name, value, p.choices)
    if p.kind == "reals":
        return check_real_array(name, value, p.domain)
    if p.kind == "counts":
        return check_count_array(name, value, p.domain)
    raise AssertionError(f"unknown kind {p.kind!r} of parameter {key}")  # pragma: no cover


def check_fields(obj, fields: dict) -> None:
    """Validate and normalise the fields of a frozen dataclass ``obj`` in
    place: ``fields`` maps each field to its key in the parameter table
    (``None`` values pass through where the table's default is ``None``)."""
    for field, key in fields.items():
        value = getattr(obj, field)
        if value is None and PARAMS[key].default is None:
            continue
        object.__setattr__(obj, field, check(key, value, field))


_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)

# values shown in error messages are shortened to a line: strings to 60
# characters, other reprs to 80, containers to their first 8 items
_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8


#: integers wider than this are described by their size, not printed (about 60 digits)
_HUGE_BITS = 200


def _show(value) -> str:
    """A short repr for messages (that of a huge int would be long, or raise)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        v = int(value)
        if v.bit_length() > _HUGE_BITS:
            digits = int(v.bit_length() * math.log10(2)) + 1
            return f"{'-' if v < 0 else ''}an integer of about {digits} digits"
        return repr(v)
    try:
        return _repr.repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        return f"<{type(value).__name__} object>"


def _kind(value) -> str:
    return type(value).__name__


def _is_real_scalar(x) -> bool:
    """A real number: Python or numpy int or float, Fraction, Decimal; never a bool."""
    if isinstance(x, (bool, np.bool_)):
        return False
    return isinstance(x, (numbers.Real, np.integer, np.floating, decimal.Decimal))


def _is_count_like(x) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return False
    return isinstance(x, (numbers.Integral, np.integer))


def _count_value_error(name: str, domain: Domain, v: int):
    if v > _INT64_MAX and domain.hi > _INT64_MAX:
        return ValueError(f"{name} must be an integer in {domain} below 2**63; got {_show(v)}")
    return ValueError(f"{name} must be an integer in {domain}; got {_show(v)}")


def check_scalar_real(name: str, value, domain: Domain | None = None) -> float:
    """Validate one real number against its domain; return it as a float.

    Ints are accepted and converted; lists, arrays (0-d included), strings,
    bools, complex numbers and None are a ``TypeError``; NaN, inf (unless the
    domain is closed at inf) and other values outside the domain a
    ``ValueError``.
    """
    domain = domain or DOMAINS[name]
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number in {domain}; got {_show(value)} ({_kind(value)})")
    try:
        x = float(value)
    except (OverflowError, ValueError):  # an int beyond the float range; Decimal('sNaN')
        raise ValueError(f"{name} must be in {domain}; got {_show(value)}") from None
    if not domain.contains(x):
        raise ValueError(f"{name} must be in {domain}; got {x!r}")
    return x


def check_count(name: str, value, domain: Domain | None = None, *, array: bool = False):
    """Validate a count (scalar or, with ``array=True``, an integer array of
    any shape, for the broadcasting theory functions).

    Counts must fit in 64 bits.  Returns the value as a Python int (scalar)
    or an int64 array.
    """
    domain = domain or DOMAINS[name]
    if array:
        arr = _numeric_array(name, value, integer=True, nested=True,
                             what="an integer or an array of integers", domain=domain)
        bad = ~domain.contains(arr)
        if np.any(bad):
            raise _count_value_error(name, domain, int(arr[bad].ravel()[0]))
        return arr.astype(np.int64)
    if not _is_count_like(value):
        # NaN and inf are out of the domain, whatever their type; any other
        # float, even 4.0, is the wrong kind for a count
        if isinstance(value, (float, np.floating)) and not math.isfinite(value):
            raise ValueError(f"{name} must be an integer in {domain}; got {value!r}")
        raise TypeError(f"{name} must be an integer in {domain}; got {_show(value)} ({_kind(value)})")
    v = int(value)
    # (Python compares an int with a float exactly; numpy would round the int)
    inside = ((v >= domain.lo if domain.lo_closed else v > domain.lo)
              and (v <= domain.hi if domain.hi_closed else v < domain.hi))
    if v > _INT64_MAX or v < _INT64_MIN or not inside:
        raise _count_value_error(name, domain, v)
    return v


def check_real(name: str, value, domain: Domain | None = None):
    """Validate a real scalar or an array of any shape (the broadcasting theory
    functions) against its domain; NaN and inf refused unless the domain is
    closed at inf.  Strings, bools, complex numbers, and arrays of them or of
    other objects are a ``TypeError``.  Returns a float or float64 array."""
    domain = domain or DOMAINS[name]
    if _is_real_scalar(value):
        return check_scalar_real(name, value, domain)
    arr = _numeric_array(name, value, integer=False, nested=True,
                         what="a real number or an array of real numbers")
    bad = ~domain.contains(arr)
    if np.any(bad):
        raise ValueError(f"{name} must be in {domain}; got {float(arr[bad].ravel()[0])!r}")
    return float(arr) if arr.ndim == 0 else arr


def check_real_array(name: str, value, domain: Domain | None = None, *, allow_scalar: bool = False,
                     allow_empty: bool = False) -> np.ndarray:
    """Validate a 1-D sequence of real numbers; return a new float64 array.

    Strings, bools and bool arrays, dicts, nested lists and arrays of
    non-numbers are a ``TypeError``; another shape (a 2-D array, a scalar
    unless ``allow_scalar``, an empty sequence unless ``allow_empty``) or a
    value outside ``domain`` a ``ValueError``.
    """
    return real_array_ends(name, value, domain, allow_scalar=allow_scalar, allow_empty=allow_empty)[0]


def real_array_ends(name: str, value, domain: Domain | None = None, *, allow_scalar: bool = False,
                    allow_empty: bool = False) -> tuple:
    """:func:`check_real_array`'s array and its least and greatest values,
    ``(array, low, high)`` (NaN for an empty array): the ends its check read
    (converting to float64 keeps the order of the values, so the copy's ends
    are the same)."""
    domain = domain or DOMAINS[name]
    arr = _numeric_array(name, value, integer=False, nested=False, what="a 1-D sequence of real numbers")
    arr = _one_dim(name, arr, allow_scalar, allow_empty)
    ends = _ends(arr)
    if arr.size and not _all_inside(domain, ends):
        bad = ~domain.contains(arr)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(f"{name} must hold values in {domain}; got {name}[{i}] = {float(arr[i])!r}")
    return np.array(arr, dtype=np.float64), float(ends[0]), float(ends[1])


def _ends(arr: np.ndarray) -> np.ndarray:
    """The least and greatest values of ``arr`` as float64 (NaN where it holds
    a NaN, or is empty)."""
    if arr.size == 0:
        return np.full(2, np.nan)
    return np.array([np.min(arr), np.max(arr)], dtype=float)


def _all_inside(domain: Domain, ends: np.ndarray) -> bool:
    """Whether every value of a non-empty array whose least and greatest
    values are ``ends`` (:func:`_ends`) is in ``domain`` (an interval,
    perhaps with inf), read off them alone (two passes and no temporary,
    where the elementwise test took seven); False where that cannot tell (a
    NaN, or inf beside values past the interval's end): the caller then
    tests each value."""
    if domain.or_inf and ends[1] == np.inf:
        return False
    return bool(np.all(domain.contains(ends)))


def check_count_array(name: str, value, domain: Domain | None = None) -> np.ndarray:
    """Validate a non-empty 1-D sequence of counts; return a new int64 array.
    Kinds and shapes as for :func:`check_real_array`; floats are a ``TypeError``."""
    domain = domain or DOMAINS[name]
    arr = _numeric_array(name, value, integer=True, nested=False, what="a 1-D sequence of integers",
                         domain=domain)
    arr = _one_dim(name, arr, False, False)
    bad = ~domain.contains(arr)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise _count_value_error(f"{name}[{i}]", domain, int(arr[i]))
    return np.array(arr, dtype=np.int64)


def check_flag(name: str, value) -> bool:
    """A bool (Python or numpy); anything else, 0 and 1 included, is a ``TypeError``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False); got {_show(value)} ({_kind(value)})")
    return bool(value)


def check_choice(name: str, value, choices: tuple) -> str:
    """One of ``choices`` (strings): another string is a ``ValueError``, a
    non-string a ``TypeError``."""
    allowed = ", ".join(repr(c) for c in choices)
    if len(choices) > 12:
        # (a long list, such as the hardware profiles: its size, and the names closest to the value)
        import difflib

        close = difflib.get_close_matches(str(value), choices, n=3, cutoff=0.5) if isinstance(value, str) else []
        allowed = f"the {len(choices)} choices ({', '.join(repr(c) for c in choices[:3])}, ...)" + (
            f"; the closest: {', '.join(repr(c) for c in close)}" if close else "")
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed}; got {_show(value)} ({_kind(value)})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {allowed}; got {_show(value)}")
    return str(value)


def check_instance(name: str, value, cls, default=None):
    """An instance of ``cls`` (a class or a tuple of them); ``None`` gives ``default()`` when a default is given."""
    if value is None and default is not None:
        return default()
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in cls) if isinstance(cls, tuple) else cls.__name__
        raise TypeError(f"{name} must be an instance of {names}; got {_kind(value)}")
    return value


def _one_dim(name: str, arr: np.ndarray, allow_scalar: bool, allow_empty: bool) -> np.ndarray:
    if arr.ndim == 0 and allow_scalar:
        arr = arr.reshape(1)
    if arr.ndim != 1 or (arr.size == 0 and not allow_empty):
        need = "a 1-D sequence" if allow_empty else "a non-empty 1-D sequence"
        got = f"a scalar, {_show(arr.item())}" if arr.ndim == 0 else f"shape {arr.shape}"
        raise ValueError(f"{name} must be {need}; got {got}")
    return arr


def _leaf_error(name: str, what: str, leaf, integer: bool):
    if integer and isinstance(leaf, (float, np.floating)) and not math.isfinite(leaf):
        return ValueError(f"{name} must hold integers; got {leaf!r}")
    return TypeError(f"{name} must be {what}; got an element {_show(leaf)} ({_kind(leaf)})")


def _check_leaves(name: str, items, what: str, integer: bool, nested: bool):
    """Each item a number of the right kind (or, if ``nested``, a list of them)."""
    ok = _is_count_like if integer else _is_real_scalar
    # one isinstance test per distinct type keeps a long trace fast; types in
    # order of first appearance, so the error is the same on every run
    for t in dict.fromkeys(map(type, items)):
        if nested and issubclass(t, (list, tuple, np.ndarray)):
            for sub in (x for x in items if type(x) is t):
                if isinstance(sub, np.ndarray):
                    _numeric_array(name, sub, integer=integer, nested=True, what=what)
                else:
                    _check_leaves(name, sub, what, integer, nested)
            continue
        sample = next(x for x in items if type(x) is t)
        if not ok(sample):
            # NaN before a finite float, so a NaN in a list of counts is out of the domain
            bad = [x for x in items if type(x) is t]
            if integer and isinstance(sample, (float, np.floating)):
                bad.sort(key=lambda x: math.isfinite(x))
            raise _leaf_error(name, what, bad[0], integer)


def _numeric_array(name: str, value, *, integer: bool, nested: bool, what: str,
                   domain: Domain | None = None) -> np.ndarray:
    """``value`` as an int64 (``integer``) or float64 ndarray of any shape,
    refusing strings, bools, complex numbers, dicts and arrays of non-numbers
    with a ``TypeError`` naming ``name``; a list within a list is refused too
    unless ``nested``."""
    if value is None or isinstance(value, (str, bytes, dict, set, frozenset, bool, np.bool_)):
        raise TypeError(f"{name} must be {what}; got {_show(value)} ({_kind(value)})")
    if isinstance(value, (list, tuple)):
        _check_leaves(name, value, what, integer, nested)
        src = value
    else:
        if _is_count_like(value) if integer else _is_real_scalar(value):
            src = value
        else:
            try:
                arr = np.asarray(value)
            except Exception:
                raise TypeError(f"{name} must be {what}; got {_show(value)} ({_kind(value)})") from None
            k = arr.dtype.kind
            if k == "O":
                _check_leaves(name, arr.ravel().tolist() if arr.ndim else [arr.item()], what, integer,
                              nested=False)
            elif k == "f" and integer:
                if not np.all(np.isfinite(arr)):
                    raise ValueError(f"{name} must hold integers; got "
                                     f"{float(arr[~np.isfinite(arr)].ravel()[0])!r}")
                raise TypeError(f"{name} must be {what}; got {_show(value)} ({arr.dtype})")
            elif k not in "iuf":
                raise TypeError(f"{name} must be {what}; got {_show(value)} ({_kind(value)} of {arr.dtype})")
            src = arr
    try:
        if not integer:
            return np.asarray(src, dtype=float)
        arr = np.asarray(src)
    except (OverflowError, decimal.InvalidOperation):  # an int beyond the float range
        raise ValueError(f"{name} must hold real numbers within the float range; got {_show(value)}") from None
    except ValueError:  # a ragged nested list
        raise ValueError(f"{name} must be a rectangular array; got {_show(value)}") from None
    if arr.dtype.kind in "uO":
        # uint64 values and Python ints beyond int64 would wrap or overflow in the cast
        big = [int(v) for v in arr.ravel().tolist() if not _INT64_MIN <= int(v) <= _INT64_MAX]
        if big:
            raise _count_value_error(name, domain or Domain(-INF, INF), big[0])
    return arr.astype(np.int64, copy=False)


def check_servers(value) -> float:
    """``servers``: a positive integer, or ``math.inf`` (Assumption 5.1)."""
    if isinstance(value, float) and value == math.inf:
        return math.inf
    if isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        if math.isnan(value) or value < 1:
            raise ValueError(f"servers must be an integer in {DOMAINS['servers']} or math.inf; got {value!r}")
        raise TypeError(f"servers must be an integer or math.inf; got {value!r}")
    return check_count("servers", value)


def resolve_n(n, replayed: list, *, tile: bool = False) -> int:
    """``n`` checked, defaulting to the length of the replayed arrays (the
    parameter table's default when nothing is replayed).

    ``replayed`` lists ``(name, length)`` of the arrays a run replays
    (arrival times, service times, token lengths).  They must have the same
    length (a shorter one would silently cut the others); ``n`` may not
    exceed it unless ``tile`` (the caller repeats them).
    """
    for (what_a, size_a), (what_b, size_b) in zip(replayed, replayed[1:]):
        if size_a != size_b:
            raise ValueError(f"{what_a} has {size_a} values but {what_b} has {size_b}; replayed arrays "
                             "must have the same length (one value per request)")
    if n is None:
        # (nothing replayed: the parameter table's default)
        n = min(size for _, size in replayed) if replayed else PARAMS["n"].default
    n = check_count("n", n)
    for what, size in replayed:
        if n > size and not tile:
            raise ValueError(f"n must be at most the {size} values of {what}; got {n}")
    return n
