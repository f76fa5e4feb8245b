"""The trace loaders: golden small files made here, a regression test per fault
users reported, a hypothesis fuzz of good and broken files against an
expectation computed here, the filters and provenance (both loaders, against
a plain-Python reference), BurstGPT files made here, and the real Azure trace
when its copy is beside the checkout (skipped, saying why, otherwise)."""

import csv
import hashlib
import json
import math
import os
import re
import tempfile
import tracemalloc
from datetime import datetime, timedelta
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, strategies as st

import mbbatch as mb
from mbbatch import traces
from mbbatch.traces import Trace, TraceError, load_azure_trace, load_burstgpt

from .conftest import SHARED_DATA

AZURE = SHARED_DATA / "AzureLLMInferenceTrace_conv.csv"
needs_azure = pytest.mark.skipif(
    not AZURE.is_file(), reason="the Azure LLM inference trace is not beside the checkout "
    "(shared/data/AzureLLMInferenceTrace_conv.csv); download it from "
    "github.com/Azure/AzurePublicDataset (data/); see docs/guide/traces.md")

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
TIME, PROMPT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"


def _at(p):
    """A regex matching the path `p` as the loader prints it."""
    return re.escape(str(p))


def _write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def _old_loader(path):
    """The loader before row checks (commit 504e662): the reference for ISO arrivals."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    stamps = np.array([r[0].strip().replace(" ", "T") for r in rows], dtype="datetime64[ns]")
    prompt = np.array([int(r[1]) for r in rows], dtype=np.int64)
    output = np.array([int(r[2]) for r in rows], dtype=np.int64)
    order = np.argsort(stamps, kind="stable")
    stamps, prompt, output = stamps[order], prompt[order], output[order]
    return (stamps - stamps[0]).astype(np.int64) / 1e9, prompt, output


def _assert_bit_identical(tr, arrival, prompt, output):
    assert tr.arrival.dtype == np.float64 and tr.prompt_tokens.dtype == np.int64
    assert tr.output_tokens.dtype == np.int64
    np.testing.assert_array_equal(tr.arrival.view(np.int64), np.asarray(arrival).view(np.int64))
    np.testing.assert_array_equal(tr.prompt_tokens, prompt)
    np.testing.assert_array_equal(tr.output_tokens, output)


# --- golden files -------------------------------------------------------------------------

def test_load_small_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.5000000,374,44\n"
                 "2023-11-16 18:15:46.0000000,10,5\n"
                 "2023-11-16 18:15:48.0000000,396,109\n")
    tr = load_azure_trace(p)
    np.testing.assert_allclose(tr.arrival, [0.0, 0.5, 2.0])
    assert tr.prompt_tokens.tolist() == [10, 374, 396]
    assert tr.output_tokens.tolist() == [5, 44, 109]
    assert tr.rate == pytest.approx(1.0)
    assert tr.source == "t.csv"


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_golden_iso_file(tmp_path, eol):
    # BOM, padded and reordered header with an extra column, unsorted rows with a
    # tie (kept in file order), padded cells, blank lines inside and after
    lines = ["\ufeff GeneratedTokens ,Note, TIMESTAMP ,ContextTokens",
             "44,a,2023-11-16 18:15:46.6805900,374",
             "",
             "109,b,2023-11-16T18:15:45.9951690,396",
             "7,c, 2023-11-16 18:15:46.6805900\t,\t8 ",
             "   ",
             "0,d,2023-11-16 18:16:00,0",
             "", ""]
    tr = load_azure_trace(_write(tmp_path, eol.join(lines)))
    assert tr.prompt_tokens.tolist() == [396, 374, 8, 0]
    assert tr.output_tokens.tolist() == [109, 44, 7, 0]
    # exact: (t - t0) in ns, divided by 1e9
    assert tr.arrival.tolist() == [0.0, 685421000 / 1e9, 685421000 / 1e9, 14004831000 / 1e9]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_golden_numeric_file(tmp_path, eol):
    lines = ["\ufeffContextTokens,GeneratedTokens,Extra,TIMESTAMP",
             "10,1,x,1700000010.5",
             "20,2,y,1700000000",
             "",
             "30,3,z, 1.7e9 ",
             "40,4,w,1700000010.5", "", "\t"]
    tr = load_azure_trace(_write(tmp_path, eol.join(lines) + eol))
    assert tr.prompt_tokens.tolist() == [20, 30, 10, 40]
    assert tr.output_tokens.tolist() == [2, 3, 1, 4]
    assert tr.arrival.tolist() == [0.0, 0.0, 10.5, 10.5]


def test_seconds_since_start_may_be_negative_or_fractional(tmp_path):
    tr = load_azure_trace(_write(tmp_path, HEADER + "0.25,1,1\n-1.5,2,2\n+2,3,3\n.5e1,4,4\n"))
    assert tr.arrival.tolist() == [0.0, 1.75, 3.5, 6.5]
    assert tr.prompt_tokens.tolist() == [2, 1, 3, 4]


def test_utc_offsets_are_converted_to_utc(tmp_path):
    # the same instant three ways, then a daylight-saving change an hour later
    text = HEADER + ("2023-03-26T00:30:00Z,1,1\n2023-03-26 01:30:00+01:00,2,2\n"
                     "2023-03-25T19:30:00-0500,3,3\n2023-03-26T03:30:00+02,4,4\n")
    tr = load_azure_trace(_write(tmp_path, text))
    assert tr.arrival.tolist() == [0.0, 0.0, 0.0, 3600.0]
    assert tr.prompt_tokens.tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("text, line, what", [
    (HEADER + "2023-11-16T18:15:46Z,1,1\n2023-11-16T18:15:47,1,1\n", 3,
     "is not an ISO-8601 datetime with a UTC offset, like the first row's"),
    (HEADER + "2023-11-16T18:15:46,1,1\n\n2023-11-16T18:15:47+00:00,1,1\n", 4,
     "is not an ISO-8601 datetime without a UTC offset, like the first row's"),
    (HEADER + "2023-11-16T18:15:46+24:00,1,1\n", 2,
     "is not an ISO-8601 datetime with a valid UTC offset"),
])
def test_utc_offsets_are_all_or_none(tmp_path, text, line, what):
    p = _write(tmp_path, text)
    with pytest.raises(TraceError,
                       match=f"^{_at(p)}:{line}: column 'TIMESTAMP': value '.*' {what}$"):
        load_azure_trace(p)


def test_lengths_are_plain_digits(tmp_path):
    tr = load_azure_trace(_write(tmp_path, HEADER + "1,05, 7\t\n2,9223372036854775807,0\n"))
    assert tr.prompt_tokens.tolist() == [5, 2**63 - 1] and tr.output_tokens.tolist() == [7, 0]
    for value in ["+5", "1e3", "1.0", "0x10", "1_000", "\u0665", "5 5"]:
        p = _write(tmp_path, HEADER + f"1,{value},2\n")
        with pytest.raises(TraceError, match=f"^{_at(p)}:2: column 'ContextTokens': value "
                           f"'{re.escape(value)}' is not a non-negative integer$"):
            load_azure_trace(p)


@pytest.mark.parametrize("cell, what", [
    ("1e999", "is not a finite number of seconds"),
    ("inf", "is not an ISO-8601 datetime or a number of seconds"),
    ("2023-11-16", "is not an ISO-8601 datetime or a number of seconds"),
    ("2023-02-30 00:00:00", r"is not a valid ISO-8601 datetime \(day out of range\)"),
    ("2023-11-16 24:00:00", r"is not a valid ISO-8601 datetime \(hours out of range\)"),
    ("2300-01-01 00:00:00", r"is not an ISO-8601 datetime in the years 1678 to 2261 "),
    ("today", "is not an ISO-8601 datetime or a number of seconds"),
    ("NaT", "is not an ISO-8601 datetime or a number of seconds"),
])
def test_bad_timestamps(tmp_path, cell, what):
    p = _write(tmp_path, HEADER + f"{cell},1,2\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:2: column 'TIMESTAMP': value "
                       f"'{re.escape(cell)}' {what}"):
        load_azure_trace(p)


@pytest.mark.parametrize("times, what", [
    (("1700-01-01 00:00:00", "2200-01-01 00:00:00"), "292 years"),
    (("-1e308", "1e308"), "a float64 holds"),
])
def test_times_whose_span_overflows(tmp_path, times, what):
    p = _write(tmp_path, HEADER + "".join(f"{t},1,1\n" for t in times))
    with pytest.raises(TraceError, match=f"^{_at(p)}: column 'TIMESTAMP': the times span "
                       f"more than {what}"):
        load_azure_trace(p)


def test_bad_trace_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        load_azure_trace(tmp_path / "missing.csv")
    with pytest.raises(FileNotFoundError, match="^path: .*directory"):
        load_azure_trace(tmp_path)
    p = tmp_path / "bad.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="header"):
        load_azure_trace(p)


@pytest.mark.parametrize("text, match", [
    ("", ": holds no requests \\(the file is empty"),
    ("\n  \n\n", ": holds no requests \\(the file is empty"),
    (HEADER + "\n\n", ": holds no requests \\(only a header"),
    ("\n" + "TIMESTAMP, ContextTokens\n1,2\n",
     r":2: the header has no column 'GeneratedTokens' .*found \['TIMESTAMP', 'ContextTokens'\]"),
    ("a,b\n", ":1: the header has no columns 'TIMESTAMP', 'ContextTokens', 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n1,2,3,4\n",
     ":1: the header names the column 'TIMESTAMP' twice"),
    (HEADER + "1,2,3,4\n",
     r":2: expected 3 fields \(TIMESTAMP,ContextTokens,GeneratedTokens\), got 4$"),
])
def test_header_and_row_shape(tmp_path, text, match):
    p = _write(tmp_path, text)
    with pytest.raises(TraceError, match=f"^{_at(p)}{match}"):
        load_azure_trace(p)


def test_lines_count_physical_lines(tmp_path):
    # a quoted field spanning lines 3-4 shifts the next row to line 5; bad cells
    # in a row are reported in column order
    p = _write(tmp_path, HEADER + '\n1,"2\r\n",3\n\n5,x,y\n')
    with pytest.raises(TraceError) as e:
        load_azure_trace(p)
    assert str(e.value).startswith(f"{p}:3: column 'ContextTokens': value '2\\r\\n' is not ")
    assert (e.value.path, e.value.line, e.value.column) == (str(p), 3, PROMPT)
    p = _write(tmp_path, HEADER + '1,2,3\n"1\n2",3\n')
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: expected 3 fields"):
        load_azure_trace(p)


def test_first_fault_in_file_order(tmp_path):
    # a bad cell before a short row and a huge field is the one reported
    text = HEADER + "1,2,3\n1,-2,3\n1,2\n" + "x" * 200_000 + ",1,2\n"
    p = _write(tmp_path, text)
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: column 'ContextTokens'"):
        load_azure_trace(p)
    # ... unless the file is not UTF-8: then nothing else it says can be trusted
    p = _write(tmp_path, text.encode() + b"\xff")
    with pytest.raises(TraceError, match=f"^{_at(p)}: not a UTF-8 text file"):
        load_azure_trace(p)


def test_long_values_are_shortened(tmp_path):
    p = _write(tmp_path, HEADER + "1," + "9" * 30 + "x" * 30 + ",2\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:2: column 'ContextTokens': value "
                       f"'{'9' * 30}{'x' * 10}\\.\\.\\.' is not a non-negative integer$"):
        load_azure_trace(p)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_chunks_join_seamlessly(tmp_path, chunk):
    rows = [f"2023-11-16 18:15:{(7 * i) % 60:02d}.{i}, {i},{2 * i}" for i in range(11)]
    text = HEADER + "\n\n".join(rows[:4]) + "\n" + "\n".join(rows[4:]) + "\n\n"
    p = _write(tmp_path, text)
    with mock.patch.object(traces, "_CHUNK", 2048):
        ref = load_azure_trace(p)
    with mock.patch.object(traces, "_CHUNK", chunk):
        _assert_bit_identical(load_azure_trace(p), ref.arrival, ref.prompt_tokens,
                              ref.output_tokens)
        q = _write(tmp_path, text + "2023-11-16 18:15:00,1,2\n\n1700000000,1,2\n")
        with pytest.raises(TraceError,
                           match=f"^{_at(q)}:19: column 'TIMESTAMP': value '1700000000' "):
            load_azure_trace(q)


# --- regression tests, one per reported fault -----------------------------------------------

def test_blank_lines_gave_index_error(tmp_path):
    # the old loader indexed r[0] of every row, and a blank line reads as []
    text = HEADER + "2023-11-16 18:15:46,1,2\n\n \t \n2023-11-16 18:15:47,3,4\n\n\n"
    tr = load_azure_trace(_write(tmp_path, text))
    assert tr.arrival.tolist() == [0.0, 1.0] and tr.prompt_tokens.tolist() == [1, 3]


def test_two_field_row_gave_index_error(tmp_path):
    # the old loader read r[2] of every row
    p = _write(tmp_path, HEADER + "2023-11-16 18:15:46,1,2\n2023-11-16 18:15:47,3\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: expected 3 fields "
                       r"\(TIMESTAMP,ContextTokens,GeneratedTokens\), got 2$"):
        load_azure_trace(p)


@pytest.mark.parametrize("column", [PROMPT, OUTPUT])
@pytest.mark.parametrize("value, what", [
    ("abc", "a non-negative integer"), ("nan", "a non-negative integer"),
    ("", "a non-negative integer"), ("1.5", "a non-negative integer"),
    ("99999999999999999999", r"a non-negative integer that fits int64 \(at most "
     "9223372036854775807\\)"),
])
def test_bad_cells_named_no_file_line_or_column(tmp_path, column, value, what):
    # int() and numpy raised on the value alone, knowing nothing of where it was
    cells = {TIME: "2023-11-16 18:15:47", PROMPT: "1", OUTPUT: "2", column: value}
    row = ",".join(cells[c] for c in (TIME, PROMPT, OUTPUT))
    p = _write(tmp_path, HEADER + "2023-11-16 18:15:46,1,2\n" + row + "\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: column '{column}': value "
                       f"'{re.escape(value)}' is not {what}$") as e:
        load_azure_trace(p)
    assert (e.value.line, e.value.column) == (3, column)


@pytest.mark.parametrize("value", ["abc", "nan", ""])
def test_bad_timestamps_named_no_file_line_or_column(tmp_path, value):
    # numpy's datetime parser raised on the value alone ("" even gave NaT)
    p = _write(tmp_path, HEADER + f"2023-11-16 18:15:46,1,2\n{value},1,2\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: column 'TIMESTAMP': value '{value}' is not "
                       "an ISO-8601 datetime like the first row's$"):
        load_azure_trace(p)


def test_negative_length_was_accepted(tmp_path):
    # int("-1") is a valid int
    p = _write(tmp_path, HEADER + "2023-11-16 18:15:46,1,-1\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:2: column 'GeneratedTokens': value '-1' "
                       "is not a non-negative integer$"):
        load_azure_trace(p)


def test_epoch_seconds_were_read_as_years(tmp_path):
    # numpy reads a bare integer string as a year: 1700000000 and 1700000005 were
    # five years (157,852,800 s) apart
    tr = load_azure_trace(_write(tmp_path, HEADER + "1700000000,1,2\n1700000005,3,4\n"))
    assert tr.arrival.tolist() == [0.0, 5.0]
    p = _write(tmp_path, HEADER + "1700000000,1,2\n2023-11-16 18:15:46,3,4\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: column 'TIMESTAMP': value "
                       "'2023-11-16 18:15:46' is not a number of seconds like the first row's$"):
        load_azure_trace(p)


def test_huge_field_gave_raw_csv_error(tmp_path):
    # the csv module refuses a field over csv.field_size_limit() (131072) characters
    p = _write(tmp_path, HEADER + "2023-11-16 18:15:46,1,2\n\n" + "1" * 200_000 + ",1,2\n")
    with pytest.raises(TraceError,
                       match=f"^{_at(p)}:4: a field is longer than 131072 characters") as e:
        load_azure_trace(p)
    assert not isinstance(e.value, csv.Error) and e.value.__cause__ is None


@pytest.mark.parametrize("data, offset", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 0),
    (HEADER.encode() + b"2023-11-16 18:15:46,1,2\n" + bytes(range(256)), 64 + 0x80),
    (HEADER.encode() + b"2023-11-16 18:15:46,1,\xc3", 62),
])
def test_binary_file_gave_unicode_decode_error(tmp_path, data, offset):
    # the file was decoded as UTF-8 and the decoder's error escaped
    p = _write(tmp_path, data)
    with pytest.raises(TraceError, match=f"^{_at(p)}: not a UTF-8 text file "
                       f"\\(.* at byte offset {offset}: 0x"):
        load_azure_trace(p)


def test_every_row_was_held_as_a_python_list(tmp_path, monkeypatch):
    # list(reader) kept each row as a list of three str, ~300 bytes against the
    # 24 bytes it becomes: peak memory was 15x the returned arrays
    n = 40_000
    p = tmp_path / "big.csv"
    p.write_text(HEADER + "".join(f"{1_700_000_000 + i},{i % 977},{i % 313}\n" for i in range(n)))
    monkeypatch.setattr(traces, "_CHUNK", 256)  # a small chunk lets a small file show it
    tracemalloc.start()
    try:
        tr = load_azure_trace(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out = tr.arrival.nbytes + tr.prompt_tokens.nbytes + tr.output_tokens.nbytes
    assert len(tr) == n and peak < 2 * out


# --- fuzz -----------------------------------------------------------------------------------

_T0 = datetime(2023, 11, 16, 18, 0, 0)
_BAD = {PROMPT: ["abc", "nan", "", "-1", "99999999999999999999", "1.5", "+5", "1e3"],
        TIME: ["abc", "nan", "", "inf", "2023-02-30 10:00:00", "2023-11-16"]}
_BAD[OUTPUT] = _BAD[PROMPT]
_pads = st.sampled_from(["", "", "", " ", "\t"])


@st.composite
def _time_cell(draw, fmt):
    """(text, (format, value)): ns since _T0 (UTC) for ISO, seconds for numbers."""
    if fmt in ("iso", "utc"):
        s, frac = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**7 - 1))
        shift, zone = 0, ""
        if fmt == "utc":
            shift = draw(st.integers(-48, 56)) * 15  # minutes east of UTC
            h, m = divmod(abs(shift), 60)
            sign = "-" if shift < 0 else "+"
            zone = draw(st.sampled_from([f"{sign}{h:02d}:{m:02d}", f"{sign}{h:02d}{m:02d}"]
                                        + (["Z"] if shift == 0 else [])))
        t = _T0 + timedelta(seconds=s, minutes=shift)
        text = f"{t:%Y-%m-%d}{draw(st.sampled_from(' T'))}{t:%H:%M:%S}.{frac:07d}{zone}"
        return text, (fmt, s * 10**9 + frac * 100)
    t = 1_700_000_000 + draw(st.integers(0, 10**6)) / 4
    text = draw(st.sampled_from([repr(t), f"{t:.2f}", f"{t:.6e}"]))
    return text, ("sec", float(text))


@st.composite
def _trace_files(draw, fault):
    """A trace file's bytes and what loading it must give, worked out line by line.

    The file has one `fault` ("short", "bad", "other", "binary"), maybe more of
    any kind, or none if `fault` is None.
    """
    names = list(draw(st.permutations(traces._COLUMNS)))
    if draw(st.booleans()):
        names.insert(draw(st.integers(0, 3)), "Note")
    fmt = draw(st.sampled_from(["iso", "utc", "sec"]))
    kinds = ["row"] * 4 + ["blank"] + (["short", "bad", "other"] if fault else [])
    lines = [draw(st.sampled_from(["", "  ", "\t"])) for _ in range(draw(st.integers(0, 2)))]
    lines.append(",".join(draw(_pads) + n + draw(_pads) for n in names))
    expect, seen, rows = None, None, []
    body = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=12))
    if fault:
        body.insert(draw(st.integers(0, len(body))), fault)
    for kind in body:
        if kind == "blank":
            lines.append(draw(st.sampled_from(["", "  ", "\t"])))
            continue
        if kind == "binary":
            lines.append(b"\xff" + draw(st.binary(max_size=6)))
            continue
        cells, truth = {"Note": "n"}, {}
        other = draw(st.sampled_from([f for f in ("iso", "utc", "sec") if f != fmt]))
        text, truth[TIME] = draw(_time_cell(other if kind == "other" else fmt))
        cells[TIME] = draw(_pads) + text + draw(_pads)
        for c in (PROMPT, OUTPUT):
            v = draw(st.integers(0, 10**6))
            text = draw(st.sampled_from([f'"{v}"', draw(_pads) + str(v) + draw(_pads)]))
            cells[c], truth[c] = text, ("ok", v)
        if kind == "bad":
            c = draw(st.sampled_from(traces._COLUMNS))
            cells[c], truth[c] = draw(st.sampled_from(_BAD[c])), ("bad", None)
        fields = [cells[n] for n in names]
        lines.append(",".join(fields[:-1] if kind == "short" else fields))
        if expect is not None:
            continue
        line = len(lines)
        if kind == "short":
            expect = ("fields", line, None)
            continue
        for n in names:  # the first bad cell in reading order
            if n == "Note":
                continue
            ok, value = truth[n]
            if n == TIME and seen is None and ok != "bad":
                seen = ok  # the first data row sets the timestamp format
            if ok == "bad" or (n == TIME and ok != seen):
                expect = ("cell", line, n)
                break
        else:
            rows.append((truth[TIME][1], truth[PROMPT][1], truth[OUTPUT][1]))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    lines += [""] * draw(st.integers(0, 2))
    data = (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + eol.encode().join(
        ln if isinstance(ln, bytes) else ln.encode() for ln in lines)
    if b"\xff" in data:
        expect = ("utf8", data.index(b"\xff"), None)
    elif expect is None and not rows:
        expect = ("empty", None, None)
    elif expect is None:
        rows.sort(key=lambda r: r[0])  # stable, as the loader's
        t0 = rows[0][0]
        arrival = [t - t0 if seen == "sec" else (t - t0) / 1e9 for t, _, _ in rows]
        expect = ("ok", arrival, [r[1] for r in rows], [r[2] for r in rows])
    return data, expect


@pytest.mark.parametrize("fault", [None, "short", "bad", "other", "binary"])
@given(data=st.data(), chunk=st.sampled_from([1, 2, 3, 2048]))
def test_fuzzed_files_load_or_name_their_first_fault(fault, data, chunk):
    data, (kind, *expect) = data.draw(_trace_files(fault), label="file")
    with tempfile.TemporaryDirectory() as d, mock.patch.object(traces, "_CHUNK", chunk):
        path = os.path.join(d, "fuzz.csv")
        with open(path, "wb") as f:
            f.write(data)
        if kind == "ok":
            # exact: the expectation is computed from the values the text was made from
            _assert_bit_identical(load_azure_trace(path), *expect)
            return
        with pytest.raises(TraceError) as e:
            load_azure_trace(path)
    msg, (where, column) = str(e.value), expect
    assert e.value.path == path and msg.startswith(path + ":")
    if kind == "utf8":
        assert msg.startswith(f"{path}: not a UTF-8 text file (") and f"offset {where}:" in msg
    elif kind == "empty":
        assert msg.startswith(f"{path}: holds no requests")
    elif kind == "fields":
        assert msg.startswith(f"{path}:{where}: expected ") and e.value.line == where
    else:
        assert msg.startswith(f"{path}:{where}: column '{column}': value ")
        assert (e.value.line, e.value.column) == (where, column)


# --- filters and provenance, both loaders ----------------------------------------------------

BURST_HEADER = ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                "Total tokens,Log Type\n")
MODEL, LOG, TOTAL = "Model", "Log Type", "Total tokens"
REQ, RESP = "Request tokens", "Response tokens"


def _burst_row(t, model, p, o, log, *, total=None, session="", elapsed="1.5"):
    return f"{t},{session},{elapsed},{model},{p},{o},{p + o if total is None else total},{log}\n"


def test_trace_records_file_size_sha256_and_filters(tmp_path):
    data = (HEADER + "2023-11-16 18:15:46.5,10,5\n2023-11-16 18:15:48,20,0\n").encode()
    p = _write(tmp_path, data)
    tr = load_azure_trace(p)
    assert (tr.format, tr.source, tr.size) == ("azure", "t.csv", len(data))
    assert tr.sha256 == hashlib.sha256(data).hexdigest()
    d = tr.describe()
    assert d == {"format": "azure", "source": "t.csv", "size": len(data),
                 "sha256": hashlib.sha256(data).hexdigest(),
                 "filters": {"drop_failed": False, "window": None}, "requests": 2, "span_s": 1.5}
    assert json.loads(json.dumps(d)) == d
    # describe() hands out a copy: changing it leaves the trace as it was
    d["filters"]["drop_failed"] = True
    assert tr.filters == {"drop_failed": False, "window": None}


def test_hand_built_trace_describes_itself():
    tr = Trace(np.array([0.0, 2.0, 3.0]), np.array([1, 2, 3]), np.array([4, 5, 6]))
    assert tr.describe() == {"format": None, "source": "", "size": None, "sha256": None,
                             "filters": {}, "requests": 3, "span_s": 3.0}


def test_azure_code_trace_has_the_conv_layout(tmp_path):
    # the code trace's layout (same columns as the conversation trace), with
    # its long prompts and short outputs; values made up
    text = HEADER + ("2023-11-16 18:17:03.9799600,4808,10\n"
                     "2023-11-16 18:17:04.0319600,3180,8\n"
                     "2023-11-16 18:17:04.0559240,110,27\n"
                     "2023-11-16 18:17:04.5200000,7433,14\n")
    p = _write(tmp_path, text, name="AzureLLMInferenceTrace_code.csv")
    tr = load_azure_trace(p)
    assert tr.arrival.tolist() == [0.0, 52_000_000 / 1e9, 75_964_000 / 1e9, 540_040_000 / 1e9]
    assert tr.prompt_tokens.tolist() == [4808, 3180, 110, 7433]
    assert tr.output_tokens.tolist() == [10, 8, 27, 14]
    assert (tr.source, tr.format) == ("AzureLLMInferenceTrace_code.csv", "azure")
    tr = load_azure_trace(p, window=(0.06, 1))
    assert tr.arrival.tolist() == [75_964_000 / 1e9 - 0.06, 540_040_000 / 1e9 - 0.06]
    assert tr.prompt_tokens.tolist() == [110, 7433]
    assert tr.filters == {"drop_failed": False, "window": [0.06, 1.0]}


def test_azure_window_keeps_start_drops_end_and_rebases(tmp_path):
    p = _write(tmp_path, HEADER + "0,1,1\n0.5,2,2\n1,3,3\n2,4,4\n3.5,5,5\n")
    tr = load_azure_trace(p, window=(0.75, 2))
    # 1 - 0.75: the gap from the window's start to its first request stays
    assert tr.arrival.tolist() == [0.25] and tr.prompt_tokens.tolist() == [3]
    tr = load_azure_trace(p, window=(1, 3.5))
    assert tr.arrival.tolist() == [0.0, 1.0] and tr.prompt_tokens.tolist() == [3, 4]
    # a window holding the whole trace changes nothing, bit for bit
    whole = load_azure_trace(p)
    _assert_bit_identical(load_azure_trace(p, window=(0, 3.6)), whole.arrival,
                          whole.prompt_tokens, whole.output_tokens)


def test_a_window_to_inf_keeps_the_rest_of_the_trace(tmp_path):
    p = _write(tmp_path, HEADER + "10,5,2\n11,6,3\n12.5,7,1\n14,8,9\n")
    tr = load_azure_trace(p, window=(1.5, math.inf))
    assert tr.arrival.tolist() == [1.0, 2.5] and tr.output_tokens.tolist() == [1, 9]
    assert tr.describe()["filters"]["window"] == [1.5, math.inf]


def test_azure_drop_failed_keeps_the_files_first_request_as_origin(tmp_path):
    p = _write(tmp_path, HEADER + "10,5,0\n11,6,3\n12.5,7,0\n14,8,9\n")
    tr = load_azure_trace(p, drop_failed=True)
    assert tr.arrival.tolist() == [1.0, 4.0]
    assert tr.prompt_tokens.tolist() == [6, 8] and tr.output_tokens.tolist() == [3, 9]
    assert tr.describe()["filters"] == {"drop_failed": True, "window": None}
    assert len(load_azure_trace(p)) == 4


_WINDOW_FORM = (r"window must be None or a pair \(start, end\) of seconds with "
                r"0 <= start < end <= inf; got ")


@pytest.mark.parametrize("loader", [load_azure_trace, load_burstgpt])
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"window": (-1, 5)}, ValueError, r"window\[0\] \(start\) must be in \[0, inf\); got -1\.0"),
    ({"window": (5, 2)}, ValueError, r"window\[1\] \(end\) must be in \(5, inf\]; got 2\.0"),
    ({"window": [0.5, 0.5]}, ValueError, r"window\[1\] \(end\) must be in \(0\.5, inf\]; got 0\.5"),
    ({"window": (math.nan, 1)}, ValueError,
     r"window\[0\] \(start\) must be in \[0, inf\); got nan"),
    ({"window": np.array([0.0, math.nan])}, ValueError, r"window\[1\] \(end\) must be in "
     r"\(0, inf\]; got nan"),
    ({"window": (1, 2, 3)}, ValueError, _WINDOW_FORM + r"3 values: \(1, 2, 3\)"),
    ({"window": ()}, ValueError, _WINDOW_FORM + r"0 values: \(\)"),
    ({"window": 5}, TypeError, _WINDOW_FORM + r"5 \(int\)"),
    ({"window": "0,5"}, TypeError, _WINDOW_FORM + r"'0,5' \(str\)"),
    ({"window": {0, 5}}, TypeError, _WINDOW_FORM + r"\{0, 5\} \(set\)"),
    ({"window": np.array(5.0)}, TypeError, _WINDOW_FORM + r"array\(5\.\) \(ndarray\)"),
    ({"window": (True, 2)}, TypeError, r"window\[0\] \(start\) must be a real number in "
     r"\[0, inf\); got True \(bool\)"),
    ({"window": (0, "5")}, TypeError, r"window\[1\] \(end\) must be a real number in "
     r"\(0, inf\]; got '5' \(str\)"),
    ({"drop_failed": 1}, TypeError, r"drop_failed must be a bool \(True or False\); got 1 \(int\)"),
    ({"drop_failed": None}, TypeError, r"drop_failed must be a bool \(True or False\); got None "
     r"\(NoneType\)"),
])
def test_filter_arguments_are_checked_before_the_file(tmp_path, loader, kwargs, exc, match):
    # the file does not exist: the arguments are refused first, whatever it holds
    with pytest.raises(exc, match=f"^{match}$"):
        loader(tmp_path / "missing.csv", **kwargs)


def test_azure_filters_that_leave_nothing_say_what_each_kept(tmp_path):
    p = _write(tmp_path, HEADER + "0,1,1\n1,2,0\n2,3,4\n")
    with pytest.raises(ValueError, match=f"^{_at(p)}: the filters leave no requests: the file "
                       r"holds 3; window=\(10\.0, 20\.0\) keeps 0 \(the requests left arrive "
                       r"0\.0 s to 2\.0 s after the file's first\)$") as e:
        load_azure_trace(p, window=(10, 20))
    assert not isinstance(e.value, TraceError)  # the file is fine; the filters are not
    with pytest.raises(ValueError, match=r": the file holds 3; drop_failed=True \(GeneratedTokens "
                       r"> 0\) keeps 2; window=\(1\.0, 2\.0\) keeps 0 \(the requests left arrive "
                       r"0\.0 s to 2\.0 s after"):
        load_azure_trace(p, drop_failed=True, window=(1, 2))


_MODELS, _LOGS = ("ChatGPT", "GPT-4"), ("Conversation log", "API log")


@st.composite
def _filtered_files(draw):
    """(loader name, file text, loader kwargs, expectation): a small trace in
    either format with random filters, and what loading must give, worked out
    in plain Python from the rows: the same float operations, so exactly."""
    loader = draw(st.sampled_from(["azure", "burstgpt"]))
    rows = draw(st.lists(st.tuples(st.integers(0, 80).map(lambda k: k / 8),  # ties, exact
                                   st.integers(0, 999), st.sampled_from([0, 0, 1, 7, 300]),
                                   st.sampled_from(_MODELS), st.sampled_from(_LOGS)),
                         min_size=1, max_size=14))
    kwargs = {}
    if draw(st.booleans()):
        kwargs["drop_failed"] = draw(st.booleans())
    drop = kwargs.get("drop_failed", loader == "burstgpt")
    window = None
    if draw(st.booleans()):
        start, length = draw(st.integers(0, 88)), draw(st.integers(1, 40))
        kwargs["window"] = window = (start / 8, (start + length) / 8)
    names = {}
    if loader == "burstgpt":
        for param, col in (("model", 3), ("log_type", 4)):
            present = sorted({r[col] for r in rows})
            chosen = draw(st.none() | st.sets(st.sampled_from(present), min_size=1))
            if chosen is not None:
                names[param] = chosen
                kwargs[param] = (next(iter(chosen)) if len(chosen) == 1 and draw(st.booleans())
                                 else draw(st.sampled_from([sorted(chosen), tuple(chosen)])))
        text = BURST_HEADER + "".join(
            _burst_row(repr(t), m, p, o, log, session="" if log == "API log" else "s",
                       elapsed=draw(st.sampled_from(["", "2.5"])))
            for t, p, o, m, log in rows)
    else:
        text = HEADER + "".join(f"{t!r},{p},{o}\n" for t, p, o, _, _ in rows)
    origin = min(r[0] for r in rows)
    kept = sorted((r for r in rows
                   if r[3] in names.get("model", _MODELS) and r[4] in names.get("log_type", _LOGS)
                   and not (drop and r[2] == 0)), key=lambda r: r[0])  # stable, as the loader's
    arrival = [r[0] - origin for r in kept]
    if window is not None:
        inside = [window[0] <= a < window[1] for a in arrival]
        kept = [r for r, i in zip(kept, inside) if i]
        arrival = [a - window[0] for a, i in zip(arrival, inside) if i]
    filters = {"drop_failed": drop, "window": None if window is None else list(window)}
    if loader == "burstgpt":
        filters.update({p: sorted(names[p]) if p in names else None for p in ("model", "log_type")})
    expect = (arrival, [r[1] for r in kept], [r[2] for r in kept], filters)
    return loader, text, kwargs, expect


@given(case=_filtered_files(), chunk=st.sampled_from([1, 2, 3, 2048]))
def test_filters_agree_with_a_plain_python_reference(case, chunk):
    loader, text, kwargs, (arrival, prompt, output, filters) = case
    load = {"azure": load_azure_trace, "burstgpt": load_burstgpt}[loader]
    with tempfile.TemporaryDirectory() as d, mock.patch.object(traces, "_CHUNK", chunk):
        path = os.path.join(d, "f.csv")
        with open(path, "w", newline="") as f:
            f.write(text)
        if not arrival:
            with pytest.raises(ValueError, match=f"^{re.escape(path)}: the filters leave no "
                               "requests: the file holds "):
                load(path, **kwargs)
            return
        tr = load(path, **kwargs)
    _assert_bit_identical(tr, arrival, prompt, output)
    assert tr.filters == filters and tr.format == loader
    assert tr.size == len(text.encode()) and tr.sha256 == hashlib.sha256(text.encode()).hexdigest()


# --- BurstGPT ---------------------------------------------------------------------------------

#: both models, both log types, a failed request (line 4), Session ID empty for
#: API logs and once Elapsed time, padded names, rows out of order
BURST = BURST_HEADER + "".join([
    _burst_row("0.5", "ChatGPT", 472, 18, "Conversation log", session="s1", elapsed="2.25"),
    _burst_row("3", "GPT-4", 417, 276, "API log", elapsed="9.0"),
    _burst_row("1.25", "ChatGPT", 1087, 0, "Conversation log", session="s1"),
    _burst_row("7.75", " ChatGPT\t", 100, 10, "API log", elapsed=""),
    _burst_row("2", "GPT-4", 50, 5, "Conversation log ", session="s2", elapsed="4.0"),
])


def test_burstgpt_golden_file(tmp_path):
    p = _write(tmp_path, BURST, name="BurstGPT_1.csv")
    tr = load_burstgpt(p)
    # sorted: 0.5, (1.25 failed, dropped), 2, 3, 7.75
    assert tr.arrival.tolist() == [0.0, 1.5, 2.5, 7.25]
    assert tr.prompt_tokens.tolist() == [472, 50, 417, 100]
    assert tr.output_tokens.tolist() == [18, 5, 276, 10]
    assert tr.prompt_tokens.dtype == np.int64 and tr.arrival.dtype == np.float64
    assert tr.describe() == {
        "format": "burstgpt", "source": "BurstGPT_1.csv", "size": len(BURST.encode()),
        "sha256": hashlib.sha256(BURST.encode()).hexdigest(),
        "filters": {"model": None, "log_type": None, "drop_failed": True, "window": None},
        "requests": 4, "span_s": 7.25}
    tr = load_burstgpt(p, drop_failed=False)
    assert tr.arrival.tolist() == [0.0, 0.75, 1.5, 2.5, 7.25]
    assert tr.output_tokens.tolist() == [18, 0, 5, 276, 10]


def test_burstgpt_sessions(tmp_path):
    """Session IDs numbered in the kept requests' order of first appearance,
    -1 where empty; sorted and windowed with the other columns; padding
    removed; None for a v1.1 file."""
    p = _write(tmp_path, BURST)
    # sorted by time: s1 (0.5), s1 (1.25, failed), s2 (2), - (3), - (7.75)
    assert load_burstgpt(p).session.tolist() == [0, 1, -1, -1]
    assert load_burstgpt(p, drop_failed=False).session.tolist() == [0, 0, 1, -1, -1]
    assert load_burstgpt(p, window=(1, 3)).session.tolist() == [0, -1]
    assert load_burstgpt(p, model="GPT-4").session.tolist() == [0, -1]
    text = BURST_HEADER + "".join(  # more than one chunk
        _burst_row(str(4 * k), "ChatGPT", 10, 1, "Conversation log", session=" 77\t")
        + _burst_row(str(4 * k + 1), "ChatGPT", 10, 1, "Conversation log", session="abc")
        + _burst_row(str(4 * k + 2), "ChatGPT", 10, 1, "Conversation log", session="77")
        + _burst_row(str(4 * k + 3), "ChatGPT", 10, 1, "API log", session=" ") for k in range(1500))
    tr = load_burstgpt(_write(tmp_path, text, name="s.csv"))
    assert tr.session.dtype == np.int64
    assert tr.session.tolist() == [0, 1, 0, -1] * 1500
    with pytest.raises(TraceError, match="twice"):
        load_burstgpt(_write(tmp_path, BURST.replace("Elapsed time", "Session ID"), name="d.csv"))


def test_trace_session_must_match_the_requests():
    with pytest.raises(ValueError, match="session"):
        Trace(arrival=np.zeros(3), prompt_tokens=np.ones(3, np.int64), output_tokens=np.ones(3, np.int64),
              session=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="session"):
        Trace(arrival=np.zeros(2), prompt_tokens=np.ones(2, np.int64), output_tokens=np.ones(2, np.int64),
              session=np.array([0, -2]))


def test_burstgpt_release_1_1_layout(tmp_path):
    # v1.1 has no Session ID and Elapsed time columns
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,230,1317,Conversation log\n"
            "118,GPT-4,417,276,693,Conversation log\n")
    tr = load_burstgpt(_write(tmp_path, text))
    assert tr.arrival.tolist() == [0.0, 40.0, 113.0]
    assert tr.prompt_tokens.tolist() == [472, 1087, 417]
    assert tr.session is None


@pytest.mark.parametrize("kwargs, arrival, prompt", [
    ({"model": "GPT-4"}, [1.5, 2.5], [50, 417]),  # from the file's first request, a ChatGPT one
    ({"model": ["ChatGPT", "GPT-4"]}, [0.0, 1.5, 2.5, 7.25], [472, 50, 417, 100]),
    ({"model": {"ChatGPT"}}, [0.0, 7.25], [472, 100]),
    ({"log_type": "API log"}, [2.5, 7.25], [417, 100]),
    ({"model": "ChatGPT", "log_type": ("Conversation log",), "drop_failed": False},
     [0.0, 0.75], [472, 1087]),
    ({"window": (1, 3)}, [0.5, 1.5], [50, 417]),
    ({"window": (1.5, 2.5)}, [0.0], [50]),  # start kept, end not
    ({"window": (0.75, 100), "drop_failed": False}, [0.0, 0.75, 1.75, 6.5], [1087, 50, 417, 100]),
    ({"model": "GPT-4", "window": (2, 3)}, [0.5], [417]),
])
def test_burstgpt_filters(tmp_path, kwargs, arrival, prompt):
    tr = load_burstgpt(_write(tmp_path, BURST), **kwargs)
    assert tr.arrival.tolist() == arrival and tr.prompt_tokens.tolist() == prompt


def test_burstgpt_filters_are_recorded_normalised(tmp_path):
    tr = load_burstgpt(_write(tmp_path, BURST), model=("GPT-4", "ChatGPT"), log_type="API log",
                       window=(0, 10))
    assert tr.filters == {"model": ["ChatGPT", "GPT-4"], "log_type": ["API log"],
                          "drop_failed": True, "window": [0.0, 10.0]}


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "GPT-5"}, r"model must name values of column 'Model' in {p}, which holds "
     r"'ChatGPT' \(3 rows\), 'GPT-4' \(2 rows\); got 'GPT-5'"),
    ({"model": ["ChatGPT", "gpt-4", "GPT-5"]}, r"model must name .*; got \['GPT-5', 'gpt-4'\]"),
    ({"model": " GPT-4"}, r"model must name .*; got ' GPT-4'"),  # exact: no stripping
    ({"log_type": "Chat log"}, r"log_type must name values of column 'Log Type' in {p}, which "
     r"holds 'API log' \(2 rows\), 'Conversation log' \(3 rows\); got 'Chat log'"),
])
def test_burstgpt_unknown_names_list_the_files_values(tmp_path, kwargs, match):
    p = _write(tmp_path, BURST)
    with pytest.raises(ValueError, match="^" + match.format(p=_at(p)) + "$"):
        load_burstgpt(p, **kwargs)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"model": 4}, TypeError, r"model must be None, a string or a collection of strings; "
     r"got 4 \(int\)"),
    ({"model": ["GPT-4", 4]}, TypeError, r"model must be None, a string or a collection of "
     r"strings; got 4 \(int\) in \['GPT-4', 4\]"),
    ({"log_type": b"API log"}, TypeError, r"log_type must be None, a string or a collection of "
     r"strings; got b'API log' \(bytes\)"),
    ({"model": []}, ValueError, r"model must name at least one value; got \[\]"),
    ({"log_type": set()}, ValueError, r"log_type must name at least one value; got set\(\)"),
])
def test_burstgpt_name_arguments_are_checked(tmp_path, kwargs, exc, match):
    with pytest.raises(exc, match=f"^{match}$"):
        load_burstgpt(_write(tmp_path, BURST), **kwargs)


def test_burstgpt_filters_that_leave_nothing_say_what_each_kept(tmp_path):
    p = _write(tmp_path, BURST)
    with pytest.raises(ValueError, match=f"^{_at(p)}: the filters leave no requests: the file "
                       r"holds 5; model='GPT-4' keeps 2; log_type=\['API log', 'Conversation "
                       r"log'\] keeps 2; drop_failed=True \(Response tokens > 0\) keeps 2; "
                       r"window=\(3\.0, 7\.0\) keeps 0 \(the requests left arrive 1\.5 s to "
                       r"2\.5 s after the file's first\)$"):
        load_burstgpt(p, model="GPT-4", log_type=_LOGS, window=(3, 7))
    q = _write(tmp_path, BURST_HEADER + _burst_row("4", "GPT-4", 10, 0, "API log"), name="f.csv")
    with pytest.raises(ValueError, match=f"^{_at(q)}: the filters leave no requests: the file "
                       r"holds 1; drop_failed=True \(Response tokens > 0\) keeps 0$"):
        load_burstgpt(q)
    assert load_burstgpt(q, drop_failed=False).output_tokens.tolist() == [0]


def test_burstgpt_unsorted_rows_are_sorted_stably(tmp_path):
    rows = [("5", 1), ("5.0", 2), ("1", 3), ("5", 4), ("0.5e1", 5), ("2.5", 6), ("1", 7)]
    p = _write(tmp_path, BURST_HEADER + "".join(_burst_row(t, "GPT-4", n, 1, "API log")
                                                for t, n in rows))
    tr = load_burstgpt(p)
    assert tr.prompt_tokens.tolist() == [3, 7, 6, 1, 2, 4, 5]
    assert tr.arrival.tolist() == [0.0, 0.0, 1.5, 4.0, 4.0, 4.0, 4.0]
    # more rows than numpy sorts by insertion (16), where an unstable sort shows
    times = np.random.default_rng(1).integers(0, 4, size=60)
    p = _write(tmp_path, BURST_HEADER + "".join(_burst_row(t, "ChatGPT", n, 1, "API log")
                                                for n, t in enumerate(times)))
    tr = load_burstgpt(p)
    assert tr.prompt_tokens.tolist() == sorted(range(60), key=lambda n: times[n])
    assert tr.arrival.tolist() == sorted(float(t - times.min()) for t in times)


@pytest.mark.parametrize("chunk", [1, 2, 2048])
def test_burstgpt_wrong_total_names_its_line(tmp_path, chunk):
    # a blank line before it: lines are physical lines
    text = (BURST_HEADER + _burst_row("1", "GPT-4", 472, 18, "API log") + "\n"
            + _burst_row("2", "GPT-4", 5, 6, "API log")
            + _burst_row("3", "GPT-4", 472, 18, "API log", total=500)
            + _burst_row("4", "GPT-4", 1, 1, "API log", total=3))
    p = _write(tmp_path, text)
    with mock.patch.object(traces, "_CHUNK", chunk), pytest.raises(TraceError) as e:
        load_burstgpt(p)
    assert str(e.value) == (f"{p}:5: column 'Total tokens': value '500' is not Request tokens + "
                            "Response tokens (472 + 18 = 490)")
    assert (e.value.path, e.value.line, e.value.column) == (str(p), 5, TOTAL)


@pytest.mark.parametrize("chunk", [1, 2048])
def test_burstgpt_faults_in_file_order(tmp_path, chunk):
    ok = _burst_row("1", "GPT-4", 1, 2, "API log")
    wrong = _burst_row("2", "GPT-4", 1, 2, "API log", total=4)
    bad = _burst_row("3", "GPT-4", "x", 2, "API log", total=4)
    with mock.patch.object(traces, "_CHUNK", chunk):
        for body, line, column in [(ok + wrong + bad, 3, TOTAL), (ok + bad + wrong, 3, REQ),
                                   (wrong + ok, 2, TOTAL)]:
            with pytest.raises(TraceError) as e:
                load_burstgpt(_write(tmp_path, BURST_HEADER + body))
            assert (e.value.line, e.value.column) == (line, column), str(e.value)
    # a bad length leaves the total unchecked: the bad cell is the fault
    p = _write(tmp_path, BURST_HEADER + ok + _burst_row("2", "GPT-4", 1, "-2", "API log", total=9))
    with pytest.raises(TraceError, match=f"^{_at(p)}:3: column 'Response tokens': value '-2' is "
                       "not a non-negative integer$"):
        load_burstgpt(p)


@pytest.mark.parametrize("column, value, what", [
    ("Timestamp", "abc", "a number of seconds"),
    ("Timestamp", "", "a number of seconds"),
    ("Timestamp", "inf", "a number of seconds"),
    ("Timestamp", "2023-11-16 18:15:46", "a number of seconds"),  # ISO is Azure's, not BurstGPT's
    ("Timestamp", "1e999", "a finite number of seconds"),
    (REQ, "-1", "a non-negative integer"),
    (REQ, "", "a non-negative integer"),
    (RESP, "1.5", "a non-negative integer"),
    (TOTAL, "1e3", "a non-negative integer"),
    (MODEL, "", r"a model name \(it is empty\)"),
    (LOG, " \t", r"a log type \(it is empty\)"),
])
@pytest.mark.parametrize("row", [0, 1])
def test_burstgpt_bad_cells(tmp_path, column, value, what, row):
    cells = {"Timestamp": "2", MODEL: "GPT-4", REQ: "1", RESP: "2", TOTAL: "3", LOG: "API log",
             column: value}
    bad = ",".join([cells["Timestamp"], "", "1.0", cells[MODEL], cells[REQ], cells[RESP],
                    cells[TOTAL], cells[LOG]]) + "\n"
    ok = _burst_row("1", "ChatGPT", 1, 2, "API log")
    p = _write(tmp_path, BURST_HEADER + (bad + ok if row == 0 else ok + bad))
    with pytest.raises(TraceError, match=f"^{_at(p)}:{row + 2}: column '{column}': value "
                       f"{re.escape(repr(value))} is not {what}$"):
        load_burstgpt(p)


@pytest.mark.parametrize("header, match", [
    ("Timestamp,Model,Request tokens,Response tokens,Log Type",
     r"has no column 'Total tokens' \(it needs Timestamp, Model, Request tokens, Response tokens, "
     r"Total tokens, Log Type\); found \['Timestamp', 'Model', 'Request tokens', "
     r"'Response tokens', 'Log Type'\]"),
    (HEADER.strip(), "has no columns 'Timestamp', 'Model', 'Request tokens', 'Response tokens', "
     "'Total tokens', 'Log Type' "),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log type",
     "has no column 'Log Type' "),  # case-sensitive
])
def test_burstgpt_missing_columns(tmp_path, header, match):
    p = _write(tmp_path, header + "\n1,2,3,4,5\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:1: the header {match}"):
        load_burstgpt(p)


def test_burstgpt_row_shape_and_encoding(tmp_path):
    p = _write(tmp_path, BURST + "9,,1.0,GPT-4,1,2,3\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}:7: expected 8 fields "
                       r"\(Timestamp,Session ID,.*\), got 7$"):
        load_burstgpt(p)
    p = _write(tmp_path, BURST.encode() + b"9,,1.0,GPT\xff,1,2,3,API log\n")
    with pytest.raises(TraceError, match=f"^{_at(p)}: not a UTF-8 text file "):
        load_burstgpt(p)
    p = _write(tmp_path, BURST_HEADER)
    with pytest.raises(TraceError, match=f"^{_at(p)}: holds no requests \\(only a header"):
        load_burstgpt(p)


def _peak(load, *args, **kwargs):
    """(result, peak bytes traced while `load` ran)."""
    tracemalloc.start()
    try:
        out = load(*args, **kwargs)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_burstgpt_streams_and_filters_chunk_by_chunk(tmp_path, monkeypatch):
    # as test_every_row_was_held_as_a_python_list for Azure files; and a filter
    # drops rows chunk by chunk, so memory follows the rows kept (dropping them
    # at the end would need as much as keeping them all)
    n = 20_000
    p = tmp_path / "big.csv"
    p.write_text(BURST_HEADER + "".join(
        _burst_row(i / 4, _MODELS[i % 2], i % 977, i % 313, _LOGS[i % 3 == 0],
                   session="" if i % 3 == 0 else str(i)) for i in range(n)))
    monkeypatch.setattr(traces, "_CHUNK", 128)  # a small chunk lets a small file show it
    tr, peak = _peak(load_burstgpt, p, drop_failed=False)
    out = tr.arrival.nbytes + tr.prompt_tokens.nbytes + tr.output_tokens.nbytes + tr.session.nbytes
    assert len(tr) == n and peak < 2 * out
    half, half_peak = _peak(load_burstgpt, p, model="GPT-4")
    assert len(half) == sum(i % 2 == 1 and i % 313 > 0 for i in range(n))
    assert half_peak < 0.75 * peak, (half_peak, peak)


# --- the real trace -------------------------------------------------------------------------

@needs_azure
def test_azure_trace_arrivals_are_bit_identical_to_the_old_loader(tmp_path):
    _assert_bit_identical(load_azure_trace(AZURE), *_old_loader(AZURE))
    # and with its rows shuffled, so the stable sort has work to do
    with open(AZURE, newline="") as f:
        header, *rows = f.read().splitlines()
    order = np.random.default_rng(0).permutation(len(rows))
    p = _write(tmp_path, "\n".join([header, *(rows[i] for i in order)]) + "\n")
    _assert_bit_identical(load_azure_trace(p), *_old_loader(p))


@needs_azure
def test_replay_the_azure_trace():
    tr = load_azure_trace(AZURE)
    # 19,366 requests: the file ends without a newline, so `wc -l` shows one fewer
    assert len(tr) == 19_366
    assert np.all(np.diff(tr.arrival) >= 0) and tr.arrival[0] == 0.0
    assert tr.output_tokens.min() >= 0
    # replay its arrivals and output lengths (1 s per 100 tokens, oracle bins)
    service = 1.0 + tr.output_tokens / 100.0
    edges = np.quantile(service, [0.0, 0.5, 1.0])
    res = mb.simulate(mb.MultiBin(bins=2, batch_size=8, edges=edges),
                      arrivals=mb.Replay(tr.arrival), service=service, servers=4,
                      keep_requests=True)
    assert res.completed + res.excluded_partial == len(tr)
    np.testing.assert_array_equal(res.requests.arrival, tr.arrival)
    assert res.throughput > 0 and res.mean_latency > 0


@pytest.fixture(scope="module")
def azure_pandas():
    """The conversation trace read by pandas: a second path to its numbers."""
    import pandas as pd

    df = pd.read_csv(AZURE)
    t = pd.to_datetime(df["TIMESTAMP"]).to_numpy().astype("datetime64[ns]").view(np.int64)
    return (t - t.min()) / 1e9, df["ContextTokens"].to_numpy(), df["GeneratedTokens"].to_numpy()


@needs_azure
def test_azure_trace_provenance():
    data = AZURE.read_bytes()
    tr = load_azure_trace(AZURE)
    assert tr.describe() == {
        "format": "azure", "source": "AzureLLMInferenceTrace_conv.csv", "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "filters": {"drop_failed": False, "window": None},
        "requests": 19_366, "span_s": float(tr.arrival[-1])}
    assert tr.size == os.path.getsize(AZURE)
    assert json.loads(json.dumps(tr.describe())) == tr.describe()


@needs_azure
@pytest.mark.parametrize("drop_failed, window", [
    (True, None), (False, (0, 60)), (True, (600.5, 1200)), (False, (3000, 1e6)),
])
def test_azure_trace_filters_agree_with_pandas(azure_pandas, drop_failed, window):
    arrival, prompt, output = azure_pandas
    keep = output > 0 if drop_failed else np.ones(arrival.size, dtype=bool)
    if window is not None:
        keep &= (arrival >= window[0]) & (arrival < window[1])
    tr = load_azure_trace(AZURE, drop_failed=drop_failed, window=window)
    assert len(tr) == keep.sum() > 0
    start = 0.0 if window is None else float(window[0])
    # the file is in time order: no sort needed on this side
    _assert_bit_identical(tr, arrival[keep] - start, prompt[keep], output[keep])
    window = None if window is None else [float(w) for w in window]
    assert tr.describe()["filters"] == {"drop_failed": drop_failed, "window": window}


def test_a_length_of_thousands_of_digits_is_refused_naming_its_cell(tmp_path):
    """Over 4,300 digits, where Python's int() raises its own ValueError: the
    file, line and column, as for any length that does not fit int64; a
    length padded with zeros still reads as its value."""
    huge = "9" * 5000
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n"
                         f"2023-11-16 18:15:47,{huge},5\n")
    with pytest.raises(TraceError, match=r"t\.csv:3.*fits int64") as e:
        load_azure_trace(p)
    assert e.value.line == 3 and e.value.column is not None
    zeros = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,"
                             f"{'0' * 30}12 ,5\n", "z.csv")
    assert load_azure_trace(zeros).prompt_tokens.tolist() == [12]


@pytest.mark.parametrize("path", [None, 3, b"t.csv"])
def test_a_path_of_the_wrong_type_is_refused_naming_path(path):
    for load in (load_azure_trace, mb.traces.load_burstgpt):
        with pytest.raises(TypeError, match="path must be a str or a path-like object"):
            load(path)
