"""Real LLM inference traces.

Two public traces are read, each by its own loader; both return a `Trace`.

- The Azure LLM inference trace 2023 (Patel et al., "Splitwise: Efficient
  generative LLM inference using phase splitting", ISCA 2024; CC-BY 4.0),
  published in the Azure Public Dataset (github.com/Azure/AzurePublicDataset)
  as ``AzureLLMInferenceTrace_conv.csv`` (a conversation service) and
  ``AzureLLMInferenceTrace_code.csv`` (a coding assistant).  The two files
  have the same layout, one row per request with ``TIMESTAMP``,
  ``ContextTokens`` (prompt length) and ``GeneratedTokens`` (output length),
  and `load_azure_trace` reads either.
- BurstGPT (Wang et al., "BurstGPT: A real-world workload dataset to
  optimize LLM serving systems", KDD 2025; github.com/HPMLL/BurstGPT, CC-BY
  4.0): ChatGPT and GPT-4 requests served through Azure OpenAI, read by
  `load_burstgpt`.

mbbatch does not ship the traces; pass the path of your copy.

The loaders check every cell, and stream the file: memory stays near the
size of the arrays they return.  A file they cannot read raises `TraceError`
(a ValueError) whose message starts with the file's path and, where one cell
or row is to blame, its line and column::

    trace.csv:7: column 'ContextTokens': value '-1' is not a non-negative integer

Every `Trace` records where it came from: the file's name, size and SHA-256
(hashed as it is read) and the filters applied, which `Trace.describe`
returns as a JSON-serialisable dict for a Dataset's attrs.

Accepted input
--------------
- UTF-8 text (a byte-order mark is skipped), LF, CRLF or CR line endings, in
  the csv module's default ("excel") dialect: comma separated, ``"`` quotes.
- Blank lines, and lines holding only whitespace, anywhere (before the
  header too): skipped.
- A header row naming the loader's columns (below) in any order
  (case-sensitive; whitespace around names ignored); other columns are
  allowed and ignored.  Every other non-blank row has as many fields as the
  header, no more and no fewer.  The cells below may be padded with spaces
  or tabs.
- Lengths (``ContextTokens``, ``GeneratedTokens``; BurstGPT's ``Request
  tokens``, ``Response tokens``, ``Total tokens``): ASCII digits, at most
  ``2**63 - 1``.  Signs, fractions and exponents (``+5``, ``1.0``, ``1e3``)
  are refused: a length written that way is more likely a shifted or
  mislabelled column than a count.
- Azure's ``TIMESTAMP``, in one of three formats, chosen by the first data
  row and required of every later row:

  * an ISO-8601 datetime ``YYYY-MM-DD HH:MM[:SS[.fraction]]`` (``T`` or one
    space between date and time, as in the Azure trace), years 1678 to 2261
    (the range of ``numpy.datetime64[ns]``); fraction digits past the ninth
    are truncated;
  * the same with a UTC offset (``Z``, ``+HH:MM``, ``+HHMM`` or ``+HH``,
    also ``-``): converted to UTC, so a file that crosses a daylight-saving
    change keeps its true spacing;
  * a number of seconds (epoch seconds or seconds since the start), integer
    or decimal, with optional sign and exponent; it must be finite.

- BurstGPT's ``Timestamp``: a number of seconds, as above.  ``Model`` and
  ``Log Type``: any non-empty text (padding removed), such as ``ChatGPT``,
  ``GPT-4``, ``Conversation log``, ``API log``.

Filters and the time origin
---------------------------
Both loaders take ``drop_failed`` (drop the requests that generated no
token) and ``window=(start, end)``; `load_burstgpt` also takes ``model`` and
``log_type``.  Every row is checked whatever the filters, and the filters
are applied chunk by chunk as the file is read.

Arrival times are measured from one origin: the file's first request (the
earliest timestamp of all its rows, filtered out or not), moved to ``start``
when a window is given.  A window keeps the requests with
``start <= t < end``, where ``t`` is the time in s since the file's first
request, and returns ``t - start``: the gap between ``start`` and the first
kept request stays, so a replay of the window starts at the window's start,
and traces filtered differently share one clock.  Without a window and
filters, the first arrival is 0.0 and the arrival times are those mbbatch has
always returned, bit for bit.
"""

from __future__ import annotations

import codecs
import copy
import csv
import hashlib
import io
import math
import os
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np

from ._validation import check_flag, check_scalar_real
from .params import Domain

__all__ = ["Trace", "TraceError", "load_azure_trace", "load_burstgpt"]

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TIME = _COLUMNS[0]
_BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                     "Log Type")

#: csv records per chunk.  Memory holds one chunk's cells as Python strings,
#: and a regex match over a chunk's joined cells keeps up to ~1 KB of
#: backtracking state per cell (and slows down per cell on longer runs).
_CHUNK = 2048
_INT64_MAX = int(np.iinfo(np.int64).max)
_SHORT = 40
#: names of a category column listed in full in an error message
_LISTED = 20

# Cell grammars.  Only spaces and tabs count as padding: the fast paths join a
# chunk's cells with "\n" and match them in one call, which is exact only if
# no cell grammar can match a newline.
_PAD = "[ \t]*"
_LENGTH = re.compile(f"{_PAD}([0-9]+){_PAD}")
# up to 18 digits always fits int64; longer values take the checked slow path
_LENGTH_RUN_BARE = re.compile("(?:[0-9]{1,18}\n)*[0-9]{1,18}")
_LENGTH_RUN = re.compile(f"(?:{_PAD}[0-9]{{1,18}}{_PAD}\n)*{_PAD}[0-9]{{1,18}}{_PAD}")
_NUMBER = f"{_PAD}[+-]?(?:[0-9]+(?:\\.[0-9]*)?|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?{_PAD}"
_SECONDS = re.compile(_NUMBER)
_SECONDS_RUN = re.compile(f"(?:{_NUMBER}\n)*{_NUMBER}")
_CLOCK = "[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\\.[0-9]+)?)?"
_ISO = re.compile(f"{_PAD}(?P<dt>(?P<year>[0-9]{{4}})-{_CLOCK})"
                  f"(?P<tz>Z|(?P<sign>[+-])(?P<hh>[0-9]{{2}})(?::?(?P<mm>[0-9]{{2}}))?)?{_PAD}")
# unpadded, no offset, years 1678-2261: what numpy parses to datetime64[ns]
# without wrapping around or warning
_ISO_PLAIN = f"(?:167[89]|1[7-9][0-9]{{2}}|2[01][0-9]{{2}}|22[0-5][0-9]|226[01])-{_CLOCK}"
_ISO_RUN = re.compile(f"(?:{_ISO_PLAIN}\n)*{_ISO_PLAIN}")
_YEARS = (1678, 2261)

_SECONDS_FMT, _ISO_FMT, _ISO_UTC_FMT = "seconds", "iso", "iso+offset"

#: window=(start, end): 0 <= start < end <= inf, in s
_WINDOW_START = Domain(0.0, math.inf, lo_closed=True)


@dataclass(frozen=True)
class _Layout:
    """A trace format: its columns, by role."""

    format: str
    columns: tuple  # the required columns, in the order error messages list them
    time: str
    prompt: str
    output: str
    iso: bool = True  # ISO-8601 timestamps accepted as well as seconds
    total: str | None = None  # a column that must equal prompt + output
    categories: tuple = ()  # (column, filter parameter, what a cell is)
    session: str | None = None  # an optional column of session ids (read when present)


_AZURE = _Layout("azure", _COLUMNS, time=_TIME, prompt="ContextTokens", output="GeneratedTokens")
_BURSTGPT = _Layout("burstgpt", _BURSTGPT_COLUMNS, time="Timestamp", prompt="Request tokens",
                    output="Response tokens", iso=False, total="Total tokens",
                    categories=(("Model", "model", "a model name"),
                                ("Log Type", "log_type", "a log type")),
                    session="Session ID")


class TraceError(ValueError):
    """A trace file whose content cannot be read as a trace.

    The message starts with the file's path, then ``:LINE`` where one row is to
    blame.

    Attributes
    ----------
    path : str or None
        The file, as given to the loader.
    line : int or None
        1-based physical line of the offending row in the file, if one is.
    column : str or None
        Header name of the offending cell, if one is.
    """

    def __init__(self, message, *, path=None, line=None, column=None):
        super().__init__(message)
        self.path, self.line, self.column = path, line, column


@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace in arrival order, with where it came from.

    Attributes
    ----------
    arrival : numpy.ndarray
        Arrival times in s (float64, non-decreasing) since the trace's
        origin: the file's first request, moved to the window's start if a
        window was applied (see the `mbbatch.traces` module docstring).
    prompt_tokens, output_tokens : numpy.ndarray
        Prompt and generated lengths in tokens (int64).
    source : str
        File name the trace was read from.
    format : str or None
        ``"azure"`` or ``"burstgpt"``: the loader that read the file.
    size : int or None
        Size of the file in bytes.
    sha256 : str or None
        SHA-256 of the file's bytes, as 64 hex digits.
    filters : dict
        The loader's filter arguments, normalised (``window`` a list of two
        floats or None; ``model`` and ``log_type`` sorted lists of names or
        None; ``drop_failed`` a bool).
    session : numpy.ndarray or None
        Each request's session (int64): the distinct ``Session ID`` values
        of the kept requests of a BurstGPT v1.2 file numbered 0, 1, ... in
        order of first appearance, -1 where the cell is empty (API logs);
        None when the file has no such column.  :class:`mbbatch.Sessions` makes
        them a cluster's programs.

    A Trace built by hand rather than by a loader has None for `format`,
    `size`, `sha256` and `session` unless given.
    """

    arrival: np.ndarray = field(repr=False)
    prompt_tokens: np.ndarray = field(repr=False)
    output_tokens: np.ndarray = field(repr=False)
    source: str = ""
    format: str | None = None
    size: int | None = None
    sha256: str | None = None
    filters: dict = field(default_factory=dict)
    session: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.session is not None:
            s = np.asarray(self.session)
            if s.shape != np.shape(self.arrival) or not np.issubdtype(s.dtype, np.integer) or \
                    (s.size and s.min() < -1):
                raise ValueError(f"session must hold one integer >= -1 per request ({np.size(self.arrival)}); "
                                 f"got {s.dtype} of shape {s.shape}")
            object.__setattr__(self, "session", s.astype(np.int64, copy=False))

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def rate(self) -> float:
        """Mean arrival rate over the trace, requests/s."""
        span = float(self.arrival[-1] - self.arrival[0])
        return (len(self) - 1) / span if span > 0 else float("nan")

    def describe(self) -> dict:
        """The trace's provenance, JSON-serialisable, for a Dataset's attrs.

        Returns
        -------
        dict
            ``format``, ``source``, ``size`` (bytes), ``sha256``, ``filters``
            (a copy of `filters`), ``requests`` (the number of requests) and
            ``span_s`` (s from the first to the last arrival; 0.0 for fewer
            than two requests).
        """
        span = float(self.arrival[-1] - self.arrival[0]) if len(self) else 0.0
        return {"format": self.format, "source": self.source, "size": self.size,
                "sha256": self.sha256, "filters": copy.deepcopy(self.filters),
                "requests": len(self), "span_s": span}


def load_azure_trace(path, *, drop_failed=False, window=None) -> Trace:
    """Read an Azure LLM inference trace CSV, checking every row.

    Reads both files of the Azure LLM inference trace 2023,
    ``AzureLLMInferenceTrace_conv.csv`` and ``AzureLLMInferenceTrace_code.csv``:
    they have the same layout.

    Parameters
    ----------
    path : str or path-like
        The CSV file, with a header naming ``TIMESTAMP``, ``ContextTokens``
        and ``GeneratedTokens`` (any order, other columns ignored).  The
        accepted formats are listed in the `mbbatch.traces` module docstring:
        lengths are non-negative integers; timestamps are ISO-8601 datetimes
        (``2023-11-16 18:15:46.6805900``, optionally with a UTC offset) or
        numbers of seconds, in the format of the first data row throughout.
    drop_failed : bool, default False
        Drop the requests with ``GeneratedTokens`` 0 (failed requests).  The
        conversation trace of 2023 holds none: its outputs are at least 7
        tokens long.
    window : (float, float) or None, default None
        ``(start, end)`` in s since the file's first request, with
        ``0 <= start < end <= inf``: keep the requests with
        ``start <= t < end``, and return their arrival times as
        ``t - start`` (see the module docstring).

    Returns
    -------
    Trace
        Rows sorted by timestamp (stable), arrival in s since the origin
        (float64), lengths in tokens (int64), ``format="azure"``.  For ISO
        timestamps the arrivals are ``(t - t0) / 1e9`` of the
        datetime64[ns] values, as mbbatch has always computed them, less
        the window's start if one is given.

    Raises
    ------
    TypeError
        If `drop_failed` is not a bool, or `window` is not a pair of real
        numbers (or None).
    ValueError
        If `window` is out of its domain (``0 <= start < end <= inf``, NaN
        refused), or the filters leave no request: the message then gives the
        number of requests each filter kept.
    FileNotFoundError
        If `path` is not a file (missing, or a directory).
    TraceError
        If the content is not a trace.  The first problem in file order is
        reported, except that a file that is not UTF-8 is reported as such
        whatever else is wrong with it.  Messages:

        - ``FILE: not a UTF-8 text file (REASON at byte offset N: 0xFF)``;
        - ``FILE: holds no requests (...)``, if no data row follows the header;
        - ``FILE:LINE: the header has no column 'NAME' ...; found [...]``;
        - ``FILE:LINE: expected N fields (HEADER), got M``, for a non-blank row
          with a different number of fields than the header;
        - ``FILE:LINE: column 'NAME': value '...' is not ...``, for a bad cell
          (values over 40 characters shortened with ``...``);
        - ``FILE:LINE: ...``, in words, for malformed CSV such as a field over
          the csv module's limit of 131072 characters;
        - ``FILE: column 'TIMESTAMP': the times span more than ...``, if the
          arrival times would overflow (ISO times over 292 years apart).

        FILE is `path` as given and LINE the 1-based physical line in the
        file where the row starts.

    Notes
    -----
    The file is read once, by `csv.reader`, in chunks of 2048 records whose
    cells are checked and converted by a few vectorized calls per column
    (one regular-expression match over the chunk's joined cells, one numpy
    parse); only a chunk that fails them is checked cell by cell, to name the
    first bad cell.  Its bytes are hashed as they are read.  Peak memory is
    about 4/3 of the returned arrays (5/3 if the rows need sorting) plus a
    few MB for one chunk, whatever the file's size.  Finding a bad cell's
    line reads the file again up to it.

    Examples
    --------
    Ten minutes of the conversation trace, from its second minute on, with
    arrival times counted from the window's start (60 s after the first
    request)::

        tr = load_azure_trace("AzureLLMInferenceTrace_conv.csv", window=(60, 660))
    """
    drop_failed = check_flag("drop_failed", drop_failed)
    window = _check_window(window)
    layout = _AZURE
    stages = []
    if drop_failed:
        stages.append((f"drop_failed=True ({layout.output} > 0)",
                       lambda v: v[layout.output] > 0))
    filters = {"drop_failed": drop_failed, "window": None if window is None else list(window)}
    return _load(path, layout, {}, stages, window, filters)


def load_burstgpt(path, *, model=None, log_type=None, drop_failed=True, window=None) -> Trace:
    """Read a BurstGPT trace CSV, checking every row.

    BurstGPT (github.com/HPMLL/BurstGPT) logs ChatGPT and GPT-4 requests
    served through Azure OpenAI.  Its releases have the header
    ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
    (v1.1) or ``Timestamp,Session ID,Elapsed time,Model,Request tokens,
    Response tokens,Total tokens,Log Type`` (v1.2); both are read.

    Parameters
    ----------
    path : str or path-like
        The CSV file.  Its header must name ``Timestamp`` (s since the start
        of the trace, a finite number, possibly fractional), ``Model``,
        ``Request tokens`` (prompt length), ``Response tokens`` (output
        length; 0 for a failed request), ``Total tokens`` (their sum; any
        other value is an error) and ``Log Type``, in any order.  A
        ``Session ID`` column (v1.2; any text, empty outside conversation
        logs) is read as the trace's `session`.  Other columns, such as
        ``Elapsed time``, are not read, and may be empty.
    model : str or collection of str, optional
        Keep only the requests whose ``Model`` is one of these names
        (compared exactly, e.g. ``"ChatGPT"``, ``"GPT-4"``).  Each name must
        occur in the file.  Default: every model.
    log_type : str or collection of str, optional
        Likewise for ``Log Type`` (``"Conversation log"``, ``"API log"``).
    drop_failed : bool, default True
        Drop the failed requests (``Response tokens`` 0).
    window : (float, float) or None, default None
        ``(start, end)`` in s since the file's first request (of any model
        or log type, failed or not), with ``0 <= start < end <= inf``: keep
        the requests with ``start <= t < end`` and return their arrival
        times as ``t - start`` (see the `mbbatch.traces` module docstring).

    Returns
    -------
    Trace
        The kept requests sorted by timestamp (stable), arrival in s since
        the origin (float64), ``Request tokens`` as `prompt_tokens` and
        ``Response tokens`` as `output_tokens` (int64),
        ``format="burstgpt"``; `session` numbers the ``Session ID`` values
        (None for a v1.1 file).

    Raises
    ------
    TypeError
        If `model` or `log_type` is neither a string nor a collection of
        strings, `drop_failed` not a bool, or `window` not a pair of real
        numbers.
    ValueError
        If `model` or `log_type` names a value the file's column does not
        hold (the message lists the values it holds), is an empty
        collection, `window` is outside ``0 <= start < end <= inf``, or the
        filters leave no request (the message gives the number each kept).
    FileNotFoundError
        If `path` is not a file.
    TraceError
        If the content is not a BurstGPT trace, with the messages of
        `load_azure_trace`, and ``FILE:LINE: column 'Total tokens': value
        '...' is not Request tokens + Response tokens (P + R = T)`` for a row
        whose total is wrong.  Every row is checked, kept by the filters or
        not.

    Notes
    -----
    Streams the file as `load_azure_trace` does; the filters are applied to
    each chunk as it is read, so memory follows the kept rows.  ``Model``
    and ``Log Type`` are held as small integer codes per chunk.

    Examples
    --------
    ::

        tr = load_burstgpt("BurstGPT_1.csv", model="GPT-4", log_type="Conversation log")
    """
    layout = _BURSTGPT
    wanted = {"model": _check_names("model", model),
              "log_type": _check_names("log_type", log_type)}
    drop_failed = check_flag("drop_failed", drop_failed)
    window = _check_window(window)
    categories = {col: _Category(what, wanted[param], param)
                  for col, param, what in layout.categories}
    stages = []
    for col, param, _ in layout.categories:
        if wanted[param] is not None:
            cat = categories[col]
            stages.append((f"{param}={_names(wanted[param])}",
                           lambda v, c=col, cat=cat: cat.keep(v[c])))
    if drop_failed:
        stages.append((f"drop_failed=True ({layout.output} > 0)",
                       lambda v: v[layout.output] > 0))
    filters = {param: None if wanted[param] is None else sorted(wanted[param])
               for _, param, _ in layout.categories}
    filters.update(drop_failed=drop_failed, window=None if window is None else list(window))
    return _load(path, layout, categories, stages, window, filters)


def _check_window(window):
    """None, or (start, end) as floats with 0 <= start < end <= inf."""
    if window is None:
        return None
    form = "window must be None or a pair (start, end) of seconds with 0 <= start < end <= inf"
    wrong_kind = TypeError(f"{form}; got {_short(repr(window), 80)} ({type(window).__name__})")
    if isinstance(window, (str, bytes, dict, set, frozenset)) or not hasattr(window, "__getitem__"):
        raise wrong_kind
    try:
        n = len(window)
    except TypeError:  # a 0-d array has __len__ but no length
        raise wrong_kind from None
    if n != 2:
        raise ValueError(f"{form}; got {n} values: {_short(repr(window), 80)}")
    start = check_scalar_real("window[0] (start)", window[0], _WINDOW_START)
    # (end = inf: to the trace's end)
    end = check_scalar_real("window[1] (end)", window[1], Domain(start, math.inf, hi_closed=True))
    return start, end


def _check_names(param, value):
    """None, or the names `value` gives (a str or a collection of str) as a frozenset."""
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset([value])
    form = f"{param} must be None, a string or a collection of strings"
    if isinstance(value, (bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{form}; got {_short(repr(value), 80)} ({type(value).__name__})")
    names = list(value)
    for v in names:
        if not isinstance(v, str):
            raise TypeError(f"{form}; got {_short(repr(v), 80)} ({type(v).__name__}) "
                            f"in {_short(repr(value), 80)}")
    if not names:
        raise ValueError(f"{param} must name at least one value; got {value!r}")
    return frozenset(names)


def _names(names):
    """A set of names as a message shows them: 'a' or ['a', 'b']."""
    names = sorted(names)
    return repr(names[0]) if len(names) == 1 else repr(names)


class _Category:
    """A text column (Model, Log Type) as int32 codes, chunk by chunk.

    The codes number the distinct names (cells without padding) in the order
    first seen; `counts` holds the rows of each name so far.  `wanted` is the
    set of names a filter keeps, or None.
    """

    def __init__(self, what, wanted, param):
        self.what, self.wanted, self.param = what, wanted, param
        self.codes = {}  # cell as read -> code
        self.names = []  # code -> name
        self._code = {}  # name -> code
        self.counts = np.zeros(0, dtype=np.int64)
        self._keep = np.zeros(0, dtype=bool)

    def encode(self, cells):
        """The cells' codes (int32), or _CellError at the first empty cell."""
        codes = self.codes
        new = set(cells).difference(codes)
        if new:
            empty = {s for s in new if not s.strip(" \t")}
            if empty:
                i = next(i for i, s in enumerate(cells) if s in empty)
                raise _CellError(i, cells[i], f"{self.what} (it is empty)")
            for s in sorted(new):  # sorted: codes independent of set order
                name = s.strip(" \t")
                if name not in self._code:
                    self._code[name] = len(self.names)
                    self.names.append(name)
                codes[s] = self._code[name]
            if self.wanted is not None:
                self._keep = np.array([n in self.wanted for n in self.names], dtype=bool)
        out = np.fromiter(map(codes.__getitem__, cells), dtype=np.int32, count=len(cells))
        counts = np.bincount(out, minlength=len(self.names))
        counts[:self.counts.size] += self.counts
        self.counts = counts
        return out

    def keep(self, codes):
        """Row mask: the codes of wanted names."""
        return self._keep[codes]

    def present(self):
        """The names held, with their rows, as an error message lists them."""
        order = sorted(range(len(self.names)), key=self.names.__getitem__)
        counts = self.counts.tolist()
        shown = [f"{self.names[c]!r} ({counts[c]} row{'s' * (counts[c] != 1)})"
                 for c in order[:_LISTED]]
        if len(order) > _LISTED:
            shown.append(f"and {len(order) - _LISTED} more")
        return ", ".join(shown)


class _SessionIds:
    """A session-id column, chunk by chunk, as 64-bit BLAKE2b digests of the
    ids (padding removed; 0 for an empty cell): memory follows the rows
    kept, not the distinct ids (a million distinct ids would take about 100
    MB as Python strings).  :func:`_session_codes` numbers them at the end.
    Two distinct ids share a digest with probability about ``m**2 / 2**65``
    for ``m`` ids (3e-8 for a million), and would then count as one
    session."""

    def encode(self, cells):
        digests = {}
        for c in set(cells):
            name = c.strip(" \t")
            digests[c] = hashlib.blake2b(name.encode(), digest_size=8).digest() if name else bytes(8)
        return np.frombuffer(b"".join(map(digests.__getitem__, cells)), dtype=np.int64)


def first_appearance(h):
    """The distinct values of the int64 array ``h`` numbered 0, 1, ... in
    order of first appearance, written over ``h`` (copied first if
    read-only), with few temporaries alive at a time."""
    n = h.size
    if not h.flags.writeable:
        h = h.copy()
    order = np.argsort(h, kind="stable")
    new = np.empty(n, bool)
    new[0] = True
    sorted_h = h[order]
    np.not_equal(sorted_h[1:], sorted_h[:-1], out=new[1:])
    first = order[new]                       # each id's first row (the sort is stable)
    group = np.cumsum(new, out=sorted_h)     # (over the sorted digests, no longer needed)
    del new
    group -= 1
    h[order] = group                         # each row's id, numbered in sorted order
    del order, group, sorted_h
    perm = np.argsort(first, kind="stable")
    del first
    rank = np.empty(perm.size, np.int64)
    rank[perm] = np.arange(perm.size)
    del perm
    step = 1 << 16
    for i in range(0, n, step):
        h[i:i + step] = rank[h[i:i + step]]
    return h


def _session_codes(h):
    """Sessions numbered 0, 1, ... in order of first appearance, -1 for an
    empty cell, from the rows' digests ``h`` (:class:`_SessionIds`), written
    over them."""
    empty = h == 0
    h = first_appearance(h)
    if empty.any():
        # the empty cells' number goes: the ids after them move down by one
        e = h[np.argmax(empty)]
        np.subtract(h, 1, out=h, where=h > e)
        np.copyto(h, -1, where=empty)
    return h


class _State:
    """What the chunks of one file share: its time format and text columns."""

    def __init__(self, layout, categories):
        self.layout, self.categories, self.fmt = layout, categories, None
        self.sessions = _SessionIds()


class _HashingReader(io.RawIOBase):
    """A binary file that hashes (SHA-256) and counts the bytes read through it."""

    def __init__(self, raw):
        self._raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def readable(self):
        return True

    def readinto(self, buffer):
        n = self._raw.readinto(buffer)
        if n:
            self.hash.update(memoryview(buffer)[:n])
            self.size += n
        return n

    def close(self):
        self._raw.close()
        super().close()


def _load(path, layout, categories, stages, window, filters):
    """Read, filter and sort a trace file: the loaders' common body."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise TypeError(f"path must be a str or a path-like object naming a text file; got {path!r} "
                        f"({type(path).__name__})")
    name = os.fsdecode(path)
    path = Path(path)
    if not path.is_file():
        why = " (it is a directory)" if path.is_dir() else ""
        raise FileNotFoundError(f"path: no trace file at {name!r}{why}")
    state = _State(layout, categories)
    select = _Stages(stages) if stages else None
    try:
        hashed = _HashingReader(open(path, "rb", buffering=0))
        with io.TextIOWrapper(io.BufferedReader(hashed), encoding="utf-8-sig", newline="") as f:
            stamps, prompt, output, session, origin, total = _read(csv.reader(f), path, name, state, select)
            while hashed.read(1 << 13):  # the csv reader read to the end; make sure
                pass
            size, digest = hashed.size, hashed.hash.hexdigest()
    except UnicodeDecodeError as exc:
        raise (_utf8_error(path, name) or TraceError(
            f"{name}: not a UTF-8 text file ({exc.reason})", path=name)) from None
    except TraceError:
        # a binary file fails some other check first; name the real cause
        err = _utf8_error(path, name)
        if err is not None:
            raise err from None
        raise

    for col, cat in categories.items():
        unknown = None if cat.wanted is None else cat.wanted.difference(cat.names)
        if unknown:
            raise ValueError(f"{cat.param} must name values of column {col!r} in {name}, which "
                             f"holds {cat.present()}; got {_names(unknown)}")
    kept = [(f"the file holds {total}", total)]
    if select is not None:
        kept += [(f"{label} keeps {n}", n) for (label, _), n in zip(stages, select.kept)]
    if stamps.size == 0:
        raise _empty(name, kept)

    if not np.all(stamps[:-1] <= stamps[1:]):
        order = np.argsort(stamps, kind="stable")
        # one at a time, so only one column is held twice
        stamps = stamps[order]
        prompt = prompt[order]
        output = output[order]
        if session is not None:
            session = session[order]
        del order
    time = layout.time
    if state.fmt == _SECONDS_FMT:
        with np.errstate(over="ignore"):  # checked just below
            stamps -= origin
        arrival = stamps
        if not np.isfinite(arrival[-1]):
            raise TraceError(f"{name}: column {time!r}: the times span more than a float64 holds",
                             path=name, column=time)
    else:
        # int64 ns, ordered like datetime64[ns]: the old loader's
        # (stamps - stamps[0]).astype(np.int64) / 1e9 bit for bit
        if int(stamps[-1]) - int(origin) > _INT64_MAX:
            lo, hi = np.array([origin, stamps[-1]], dtype=np.int64).astype("datetime64[ns]")
            raise TraceError(f"{name}: column {time!r}: the times span more than 292 years "
                             f"({lo} to {hi}); arrival times in ns would overflow",
                             path=name, column=time)
        stamps -= origin
        arrival = stamps / 1e9
        del stamps
    if window is not None:
        start, end = window
        inside = (arrival >= start) & (arrival < end)
        if not inside.all():
            first, last = float(arrival[0]), float(arrival[-1])
            arrival, prompt, output = arrival[inside], prompt[inside], output[inside]
            if session is not None:
                session = session[inside]
            kept.append((f"window=({start!r}, {end!r}) keeps {arrival.size} (the requests "
                         f"left arrive {first!r} s to {last!r} s after the file's first)",
                         arrival.size))
            if arrival.size == 0:
                raise _empty(name, kept)
        if start != 0.0:
            arrival -= start
    if session is not None:
        session = _session_codes(session)
    return Trace(arrival=arrival, prompt_tokens=prompt, output_tokens=output, source=path.name,
                 format=layout.format, size=size, sha256=digest, filters=filters, session=session)


def _empty(name, kept):
    """ValueError for filters that left no request, with what each kept."""
    return ValueError(f"{name}: the filters leave no requests: "
                      f"{'; '.join(label for label, _ in kept)}")


class _Stages:
    """Row filters applied to each chunk in turn, counting the rows each keeps.

    Called with a chunk's converted columns, returns the mask of the rows all
    the filters keep.
    """

    def __init__(self, stages):
        self.tests = [test for _, test in stages]
        self.kept = [0] * len(stages)

    def __call__(self, values):
        mask = None
        for i, test in enumerate(self.tests):
            m = test(values)
            mask = m if mask is None else mask & m
            self.kept[i] += int(np.count_nonzero(mask))
        return mask


class _CellError(Exception):
    """Bad cell `index` of a chunk's column: (index, value, what it is not)."""


def _read(reader, path, name, state, select):
    """Header, then data rows chunk by chunk.

    Returns (stamps, prompt, output, session, origin, total): the rows
    `select` keeps (all if it is None; `session` None without the layout's
    session column), the earliest timestamp of all rows and their number.
    """
    layout = state.layout
    header, line = _header(reader, name)
    found = [h.strip() for h in header]
    missing = [c for c in layout.columns if c not in found]
    # the optional session column, read when the header names it
    session = layout.session if layout.session in found else None
    wanted = (*layout.columns, session) if session else layout.columns
    twice = [c for c in wanted if found.count(c) > 1]
    if missing or twice:
        where = (f"has no column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}"
                 if missing else f"names the column {twice[0]!r} twice")
        raise TraceError(f"{name}:{line}: the header {where} (it needs "
                         f"{', '.join(layout.columns)}); found {_short(repr(found), 200)}",
                         path=name, line=line)
    # (position, name) in file order, so the first bad cell of a row is reported
    columns = sorted((found.index(c), c) for c in wanted)
    expect = _short(",".join(found), 80)
    keep = (layout.time, layout.prompt, layout.output) + ((session,) if session else ())
    parts = {c: [] for c in keep}
    origin, total = None, 0
    width = len(header)
    for cells, start in _chunks(reader, columns, width, expect, name):
        values = _convert(cells, start, columns, state, path, name, width)
        del cells
        total += values[layout.time].size
        lo = values[layout.time].min()
        origin = lo if origin is None else min(origin, lo)
        mask = None if select is None else select(values)
        for c in keep:
            parts[c].append(values[c] if mask is None or mask.all() else values[c][mask])
        del values, mask
    if origin is None:
        raise TraceError(f"{name}: holds no requests (only a header, at line {line})", path=name)
    # one column at a time, so at most one column is held twice
    out = [np.concatenate(parts.pop(c)) for c in keep]
    return (*out[:3], out[3] if session else None, origin, total)


def _header(reader, name):
    """The first non-blank row and the line it starts on."""
    line = reader.line_num + 1
    try:
        for row in reader:
            if not _blank(row):
                return row, line
            line = reader.line_num + 1
    except csv.Error as exc:
        raise TraceError(f"{name}:{reader.line_num}: {_csv_words(exc)}",
                         path=name, line=reader.line_num) from None
    raise TraceError(f"{name}: holds no requests (the file is empty)", path=name)


def _blank(row):
    return not row or (len(row) == 1 and not row[0].strip())


def _chunks(reader, columns, width, expect, name):
    """Yield (cells, start): each column's cells in up to `_CHUNK` records.

    `cells` lists one list of strings per entry of `columns`, and `start` is
    the line before the chunk, from which `_data_line` finds a row's line
    again when a cell is bad: cheaper than keeping a line per row.  Rows are
    taken apart as they are read, so the csv module's per-row lists die young
    and never reach the garbage collector's older generations.  A malformed
    record or csv error is raised after the cells before it were yielded, so
    an earlier bad cell is reported first.
    """
    size = _CHUNK
    positions = [pos for pos, _ in columns]
    while True:
        start, bad = reader.line_num, None
        lists = [[] for _ in positions]
        try:
            if len(positions) == 3:
                # the Azure layout, unrolled: a third faster than the loop below
                a, b, c = lists
                add_a, add_b, add_c = a.append, b.append, c.append
                i, j, k = positions
                for row in islice(reader, size):
                    if len(row) == width:
                        add_a(row[i])
                        add_b(row[j])
                        add_c(row[k])
                    elif not _blank(row):
                        bad = _width_error(reader, row, width, expect, name)
                        break
            else:
                adds = [(col.append, pos) for col, pos in zip(lists, positions)]
                for row in islice(reader, size):
                    if len(row) == width:
                        for add, pos in adds:
                            add(row[pos])
                    elif not _blank(row):
                        bad = _width_error(reader, row, width, expect, name)
                        break
        except csv.Error as exc:
            bad = TraceError(f"{name}:{reader.line_num}: {_csv_words(exc)}",
                             path=name, line=reader.line_num)
        if lists[0]:
            yield lists, start
        if bad is not None:
            raise bad
        if reader.line_num == start:
            return


def _width_error(reader, row, width, expect, name):
    # a quoted field keeps its line breaks; the row started that many lines up
    line = reader.line_num - len(_BREAK.findall(",".join(row)))
    return TraceError(f"{name}:{line}: expected {width} fields ({expect}), got {len(row)}",
                      path=name, line=line)


_BREAK = re.compile("\r\n|\r|\n")


def _data_line(path, name, start, index, width):
    """The line on which data row `index` after line `start` starts.

    For error messages only: it reads the file again up to that row.
    """
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader, line = csv.reader(f), 1
        for row in reader:
            if line > start and len(row) == width:
                if index == 0:
                    return line
                index -= 1
            line = reader.line_num + 1
    raise TraceError(f"{name}: changed while it was read", path=name)


def _convert(cells, start, columns, state, path, name, width):
    """One chunk's columns as arrays: {name: array}.

    Timestamps are int64 ns or float64 s (`state.fmt` says which), lengths
    int64, text columns int32 codes.  Raises the chunk's first fault (by row,
    then column; a wrong total comes after the row's cells) as a TraceError.
    """
    layout = state.layout
    values, errors = {}, []
    for (pos, col), column in zip(columns, cells):
        try:
            if col == layout.time:
                state.fmt, values[col] = _times(column, state.fmt, layout.iso)
            elif col in state.categories:
                values[col] = state.categories[col].encode(column)
            elif col == layout.session:
                values[col] = state.sessions.encode(column)
            else:
                values[col] = _lengths(column)
        except _CellError as exc:
            index, value, what = exc.args
            errors.append((index, pos, col, value, what))
    if errors:
        index, _, col, value, what = min(errors)
        if index and layout.total is not None:
            # every cell before row `index` is good: a wrong total there comes first
            _convert([c[:index] for c in cells], start, columns, state, path, name, width)
        line = _data_line(path, name, start, index, width)
        raise TraceError(f"{name}:{line}: column {col!r}: value {_short(value)!r} is not {what}",
                         path=name, line=line, column=col)
    if layout.total is not None:
        prompt, output = values[layout.prompt], values[layout.output]
        # total >= 0 and prompt >= 0: the difference cannot overflow, the sum could
        wrong = values[layout.total] - prompt != output
        if wrong.any():
            i = int(wrong.argmax())
            col = layout.total
            value = cells[[c for _, c in columns].index(col)][i]
            p, r = int(prompt[i]), int(output[i])
            line = _data_line(path, name, start, i, width)
            raise TraceError(f"{name}:{line}: column {col!r}: value {_short(value)!r} is not "
                             f"{layout.prompt} + {layout.output} ({p} + {r} = {p + r})",
                             path=name, line=line, column=col)
    return values


def _lengths(cells):
    """Token counts as int64, or _CellError at the first bad one."""
    joined = "\n".join(cells)
    # unpadded cells first: that pattern is twice as fast
    if _LENGTH_RUN_BARE.fullmatch(joined) or _LENGTH_RUN.fullmatch(joined):
        out = np.fromstring(joined, dtype=np.int64, sep="\n")
        if out.size == len(cells):
            return out
    out = np.empty(len(cells), dtype=np.int64)
    for i, s in enumerate(cells):
        m = _LENGTH.fullmatch(s)
        if m is None:
            raise _CellError(i, s, "a non-negative integer")
        # (more than 19 digits cannot fit, whatever they are: refused before Python's int(), which refuses
        # over 4,300 digits with a message of its own)
        digits = m[1].lstrip("0")
        v = int(digits) if 0 < len(digits) <= 19 else (0 if not digits else _INT64_MAX + 1)
        if v > _INT64_MAX:
            raise _CellError(i, s, f"a non-negative integer that fits int64 (at most {_INT64_MAX})")
        out[i] = v
    return out


def _times(cells, fmt, iso=True):
    """Timestamps as (format, int64 ns or float64 s), format from cell 0 if None.

    With `iso` false only numbers of seconds are accepted.
    """
    if fmt is None:
        first = cells[0]
        if _SECONDS.fullmatch(first):
            fmt = _SECONDS_FMT
        elif iso and (m := _ISO.fullmatch(first)) is not None:
            fmt = _ISO_FMT if m["tz"] is None else _ISO_UTC_FMT
        else:
            raise _CellError(0, first, "an ISO-8601 datetime or a number of seconds" if iso
                             else "a number of seconds")
    if fmt == _SECONDS_FMT:
        return fmt, _seconds(cells, "a number of seconds like the first row's" if iso
                             else "a number of seconds")
    return fmt, _iso(cells, utc=fmt == _ISO_UTC_FMT)


def _seconds(cells, what="a number of seconds like the first row's"):
    """Numbers of seconds as float64, or _CellError at the first bad one."""
    n = len(cells)
    if not _SECONDS_RUN.fullmatch("\n".join(cells)):
        n = next(i for i, s in enumerate(cells) if not _SECONDS.fullmatch(s))
    out = np.fromiter(map(float, cells[:n]), dtype=np.float64, count=n)
    bad = ~np.isfinite(out)
    if bad.any():  # before cell n, so reported first
        i = int(bad.argmax())
        raise _CellError(i, cells[i], "a finite number of seconds")
    if n < len(cells):
        raise _CellError(n, cells[n], what)
    return out


def _iso(cells, utc):
    """ISO-8601 cells as int64 ns since 1970 (UTC if `utc`), or _CellError."""
    bad = None
    if not utc and _ISO_RUN.fullmatch("\n".join(cells)):
        cores, offsets = cells, None
    else:
        cores, offsets = [], []
        for i, s in enumerate(cells):
            m = _ISO.fullmatch(s)
            if m is None:
                bad = _CellError(i, s, "an ISO-8601 datetime like the first row's")
            elif (m["tz"] is not None) != utc:
                which = "with" if utc else "without"
                bad = _CellError(i, s, f"an ISO-8601 datetime {which} a UTC offset, "
                                 "like the first row's")
            elif not _YEARS[0] <= int(m["year"]) <= _YEARS[1]:
                bad = _CellError(i, s, f"an ISO-8601 datetime in the years {_YEARS[0]} to "
                                 f"{_YEARS[1]} (the range of numpy.datetime64[ns])")
            elif utc and (int(m["hh"] or 0) > 23 or int(m["mm"] or 0) > 59):
                bad = _CellError(i, s, "an ISO-8601 datetime with a valid UTC offset")
            if bad is not None:
                break
            cores.append(m["dt"])
            if utc:
                sign = -1 if m["sign"] == "-" else 1
                offsets.append(sign * (int(m["hh"] or 0) * 3600 + int(m["mm"] or 0) * 60) * 10**9)
    try:
        # one vectorized parse, the call the loader has always used (only of
        # the cells before a bad one, which numpy might also refuse)
        ns = np.array(cores, dtype="datetime64[ns]").view(np.int64)
    except ValueError:
        for i, s in enumerate(cores):
            try:
                np.datetime64(s, "ns")
            except ValueError as exc:
                reason = str(exc).split(" in datetime string", 1)[0].lower()
                raise _CellError(i, cells[i], f"a valid ISO-8601 datetime ({reason})") from None
        raise
    if bad is not None:
        raise bad
    if utc:
        ns = ns - np.array(offsets, dtype=np.int64)
    return ns


def _short(text, limit=_SHORT):
    return text if len(text) <= limit else text[:limit] + "..."


def _csv_words(exc):
    """A csv.Error in plain words."""
    text = str(exc)
    if text.startswith("field larger than field limit"):
        return (f"a field is longer than {csv.field_size_limit()} characters, the csv "
                "module's limit (is this a CSV trace file?)")
    return f"not valid CSV ({text})"


def _utf8_error(path, name):
    """TraceError naming the first byte that is not UTF-8, or None if all are."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as f:
        while True:
            block = f.read(1 << 20)
            held = len(decoder.getstate()[0])
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                at = offset - held + exc.start
                byte = exc.object[exc.start]
                return TraceError(f"{name}: not a UTF-8 text file ({exc.reason} at byte offset "
                                  f"{at}: 0x{byte:02x})", path=name)
            if not block:
                return None
            offset += len(block)
