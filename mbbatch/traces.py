"""Real LLM inference traces.

The Azure LLM inference trace 2023 (Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024; CC-BY 4.0) is
published in the Azure Public Dataset (github.com/Azure/AzurePublicDataset),
as ``AzureLLMInferenceTrace_conv.csv`` and ``AzureLLMInferenceTrace_code.csv``:
one row per request with ``TIMESTAMP``, ``ContextTokens`` (prompt length) and
``GeneratedTokens`` (output length).  mbbatch does not ship the trace; pass
the path of your copy.

`load_azure_trace` reads any CSV file in that layout, checking every cell, and
streams it: memory stays near the size of the arrays it returns.  A file it
cannot read raises `TraceError` (a ValueError) whose message starts with the
file's path and, where one cell or row is to blame, its line and column::

    trace.csv:7: column 'ContextTokens': value '-1' is not a non-negative integer

Accepted input
--------------
- UTF-8 text (a byte-order mark is skipped), LF, CRLF or CR line endings, in
  the csv module's default ("excel") dialect: comma separated, ``"`` quotes.
- Blank lines, and lines holding only whitespace, anywhere (before the
  header too): skipped.
- A header row naming ``TIMESTAMP``, ``ContextTokens`` and ``GeneratedTokens``
  in any order (case-sensitive; whitespace around names ignored); other
  columns are allowed and ignored.  Every other non-blank row has as many
  fields as the header, no more and no fewer.  The cells below may be
  padded with spaces or tabs.
- ``ContextTokens``, ``GeneratedTokens``: ASCII digits, at most
  ``2**63 - 1``.  Signs, fractions and exponents (``+5``, ``1.0``, ``1e3``)
  are refused: a length written that way is more likely a shifted or
  mislabelled column than a count.
- ``TIMESTAMP``, in one of three formats, chosen by the first data row and
  required of every later row:

  * an ISO-8601 datetime ``YYYY-MM-DD HH:MM[:SS[.fraction]]`` (``T`` or one
    space between date and time, as in the Azure trace), years 1678 to 2261
    (the range of ``numpy.datetime64[ns]``); fraction digits past the ninth
    are truncated;
  * the same with a UTC offset (``Z``, ``+HH:MM``, ``+HHMM`` or ``+HH``,
    also ``-``): converted to UTC, so a file that crosses a daylight-saving
    change keeps its true spacing;
  * a number of seconds (epoch seconds or seconds since the start), integer
    or decimal, with optional sign and exponent; it must be finite.
"""

from __future__ import annotations

import codecs
import csv
import os
import re
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np

__all__ = ["Trace", "TraceError", "load_azure_trace"]

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TIME = _COLUMNS[0]

#: csv records per chunk.  Memory holds one chunk's cells as Python strings,
#: and a regex match over a chunk's joined cells keeps up to ~1 KB of
#: backtracking state per cell (and slows down per cell on longer runs).
_CHUNK = 2048
_INT64_MAX = int(np.iinfo(np.int64).max)
_SHORT = 40

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
    """A request trace in arrival order.

    Attributes
    ----------
    arrival : numpy.ndarray
        Arrival times in s since the first request (float64).
    prompt_tokens, output_tokens : numpy.ndarray
        Prompt and generated lengths in tokens (int64).
    source : str
        File name the trace was read from.
    """

    arrival: np.ndarray = field(repr=False)
    prompt_tokens: np.ndarray = field(repr=False)
    output_tokens: np.ndarray = field(repr=False)
    source: str = ""

    def __len__(self) -> int:
        return int(self.arrival.size)

    @property
    def rate(self) -> float:
        """Mean arrival rate over the trace, requests/s."""
        span = float(self.arrival[-1] - self.arrival[0])
        return (len(self) - 1) / span if span > 0 else float("nan")


def load_azure_trace(path) -> Trace:
    """Read an Azure LLM inference trace CSV, checking every row.

    Parameters
    ----------
    path : str or path-like
        The CSV file, with a header naming ``TIMESTAMP``, ``ContextTokens``
        and ``GeneratedTokens`` (any order, other columns ignored).  The
        accepted formats are listed in the `mbbatch.traces` module docstring:
        lengths are non-negative integers; timestamps are ISO-8601 datetimes
        (``2023-11-16 18:15:46.6805900``, optionally with a UTC offset) or
        numbers of seconds, in the format of the first data row throughout.

    Returns
    -------
    Trace
        Rows sorted by timestamp (stable), arrival in s relative to the first
        request (float64), lengths in tokens (int64).  For ISO timestamps the
        arrivals are ``(t - t[0]) / 1e9`` of the datetime64[ns] values, as
        mbbatch has always computed them.

    Raises
    ------
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
    first bad cell.  Peak memory is about 4/3 of the returned arrays (5/3 if
    the rows need sorting) plus a few MB for one chunk, whatever the file's
    size.  Finding
    a bad cell's line reads the file again up to it.
    """
    name = os.fsdecode(path)
    path = Path(path)
    if not path.is_file():
        why = " (it is a directory)" if path.is_dir() else ""
        raise FileNotFoundError(f"path: no trace file at {name!r}{why}")
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            stamps, prompt, output, fmt = _read(csv.reader(f), path, name)
    except UnicodeDecodeError as exc:
        raise (_utf8_error(path, name) or TraceError(
            f"{name}: not a UTF-8 text file ({exc.reason})", path=name)) from None
    except TraceError:
        # a binary file fails some other check first; name the real cause
        err = _utf8_error(path, name)
        if err is not None:
            raise err from None
        raise

    if not np.all(stamps[:-1] <= stamps[1:]):
        order = np.argsort(stamps, kind="stable")
        # one at a time, so only one column is held twice
        stamps = stamps[order]
        prompt = prompt[order]
        output = output[order]
        del order
    if fmt == _SECONDS_FMT:
        with np.errstate(over="ignore"):  # checked just below
            stamps -= stamps[0]
        arrival = stamps
        if not np.isfinite(arrival[-1]):
            raise TraceError(f"{name}: column {_TIME!r}: the times span more than a float64 holds",
                             path=name, column=_TIME)
    else:
        # int64 ns, ordered like datetime64[ns]: the old loader's
        # (stamps - stamps[0]).astype(np.int64) / 1e9 bit for bit
        if int(stamps[-1]) - int(stamps[0]) > _INT64_MAX:
            lo, hi = stamps[[0, -1]].astype("datetime64[ns]")
            raise TraceError(f"{name}: column {_TIME!r}: the times span more than 292 years "
                             f"({lo} to {hi}); arrival times in ns would overflow",
                             path=name, column=_TIME)
        stamps -= stamps[0]
        arrival = stamps / 1e9
    return Trace(arrival=arrival, prompt_tokens=prompt, output_tokens=output, source=path.name)


class _CellError(Exception):
    """Bad cell `index` of a chunk's column: (index, value, what it is not)."""


def _read(reader, path, name):
    """Header, then data rows chunk by chunk: (stamps, prompt, output, format)."""
    header, line = _header(reader, name)
    found = [h.strip() for h in header]
    missing = [c for c in _COLUMNS if c not in found]
    twice = [c for c in _COLUMNS if found.count(c) > 1]
    if missing or twice:
        where = (f"has no column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}"
                 if missing else f"names the column {twice[0]!r} twice")
        raise TraceError(f"{name}:{line}: the header {where} (it needs "
                         f"{', '.join(_COLUMNS)}); found {_short(repr(found), 200)}",
                         path=name, line=line)
    # (position, name) in file order, so the first bad cell of a row is reported
    columns = sorted((found.index(c), c) for c in _COLUMNS)
    expect = _short(",".join(found), 80)
    fmt = None
    parts = {c: [] for c in _COLUMNS}
    width = len(header)
    for cells, start in _chunks(reader, columns, width, expect, name):
        fmt, values = _convert(cells, start, columns, fmt, path, name, width)
        for c in _COLUMNS:
            parts[c].append(values[c])
        del cells, values
    if fmt is None:
        raise TraceError(f"{name}: holds no requests (only a header, at line {line})", path=name)
    # one column at a time, so at most one column is held twice
    out = [np.concatenate(parts.pop(c)) for c in _COLUMNS]
    return (*out, fmt)


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
    (i, _), (j, _), (k, _) = columns
    while True:
        start, bad = reader.line_num, None
        a, b, c = [], [], []
        add_a, add_b, add_c = a.append, b.append, c.append
        try:
            for row in islice(reader, size):
                if len(row) == width:
                    add_a(row[i])
                    add_b(row[j])
                    add_c(row[k])
                elif not _blank(row):
                    # a quoted field keeps its line breaks; the row started that many lines up
                    line = reader.line_num - len(_BREAK.findall(",".join(row)))
                    bad = TraceError(f"{name}:{line}: expected {width} fields ({expect}), "
                                     f"got {len(row)}", path=name, line=line)
                    break
        except csv.Error as exc:
            bad = TraceError(f"{name}:{reader.line_num}: {_csv_words(exc)}",
                             path=name, line=reader.line_num)
        if a:
            yield [a, b, c], start
        if bad is not None:
            raise bad
        if reader.line_num == start:
            return


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


def _convert(cells, start, columns, fmt, path, name, width):
    """One chunk's columns as arrays: (format, {name: array}).

    Raises the chunk's first bad cell (by row, then column) as a TraceError.
    """
    values, errors = {}, []
    for (pos, col), column in zip(columns, cells):
        try:
            if col == _TIME:
                fmt, values[col] = _times(column, fmt)
            else:
                values[col] = _lengths(column)
        except _CellError as exc:
            index, value, what = exc.args
            errors.append((index, pos, col, value, what))
    if errors:
        index, _, col, value, what = min(errors)
        line = _data_line(path, name, start, index, width)
        raise TraceError(f"{name}:{line}: column {col!r}: value {_short(value)!r} is not {what}",
                         path=name, line=line, column=col)
    return fmt, values


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
        v = int(m[1])
        if v > _INT64_MAX:
            raise _CellError(i, s, f"a non-negative integer that fits int64 (at most {_INT64_MAX})")
        out[i] = v
    return out


def _times(cells, fmt):
    """Timestamps as (format, int64 ns or float64 s), format from cell 0 if None."""
    if fmt is None:
        first = cells[0]
        if _SECONDS.fullmatch(first):
            fmt = _SECONDS_FMT
        elif (m := _ISO.fullmatch(first)) is not None:
            fmt = _ISO_FMT if m["tz"] is None else _ISO_UTC_FMT
        else:
            raise _CellError(0, first, "an ISO-8601 datetime or a number of seconds")
    if fmt == _SECONDS_FMT:
        return fmt, _seconds(cells)
    return fmt, _iso(cells, utc=fmt == _ISO_UTC_FMT)


def _seconds(cells):
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
        raise _CellError(n, cells[n], "a number of seconds like the first row's")
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
