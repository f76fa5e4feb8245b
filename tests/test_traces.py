"""The trace loader: golden small files made here, a regression test per fault
users reported, a hypothesis fuzz of good and broken files against an
expectation computed here, and the real Azure trace when its copy is beside
the checkout (skipped, saying why, otherwise)."""

import csv
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
from mbbatch.traces import TraceError, load_azure_trace

from .conftest import SHARED_DATA

AZURE = SHARED_DATA / "AzureLLMInferenceTrace_conv.csv"
needs_azure = pytest.mark.skipif(
    not AZURE.is_file(), reason="the Azure LLM inference trace is not beside the checkout "
    "(shared/data/AzureLLMInferenceTrace_conv.csv); see README, Real traces")

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
