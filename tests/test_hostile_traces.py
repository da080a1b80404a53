"""Damaged and hostile traces (issue 14): a bad token costs its event (or its field), never the
file; the cost of the damage is bounded; memory is bounded on bombs.

Every case parses a real trace damaged in one place and holds it to the clean parse of the same
trace: the events other than the damaged one are all there, unchanged.  "Time" is measured as
the bytes the decoder was handed (deterministic, unlike a wall clock): a damaged file may cost
a small factor over the clean one, never the 400x that trying every later boundary did.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracelens.parsers import jsonstream, kineto

from tests.conftest import real_traces
from tracelens.model import limits
from tracelens.model.errors import ParseError, UsageError

REAL = "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz"  # 324 KB of Kineto JSON: CPU ops, kernels, flows
CHUNK = 16 << 10  # small chunks, so that damage lands at every place a chunk can put it
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
# the columns that say an event is the same event
KEY = ["kind", "name", "ts_ns", "dur_ns", "stream", "tid", "correlation", "external_id"]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(kineto, "CHUNK_BYTES", CHUNK)


_clean: dict[str, bytes] = {}


def clean_bytes() -> bytes:
    if "b" not in _clean:
        _clean["b"] = gzip.decompress((real_traces() / REAL).read_bytes())
    return _clean["b"]


def parse_counting(path: Path) -> tuple[pl.DataFrame, object, int]:
    """(frame, meta, bytes handed to the decoder)."""
    seen = [0]
    inner = kineto._decode_chunk

    def counting(chunk, builder):
        seen[0] += len(chunk)
        return inner(chunk, builder)

    kineto._decode_chunk = counting
    try:
        df, meta = kineto.parse(path)
    finally:
        kineto._decode_chunk = inner
    return df, meta, seen[0]


_reference: dict[str, tuple] = {}


def reference(tmp_path_factory) -> tuple[pl.DataFrame, int]:
    if "r" not in _reference:
        p = tmp_path_factory.mktemp("clean") / "clean.json"
        p.write_bytes(clean_bytes())
        df, meta, work = parse_counting(p)
        assert not any("JSON" in w for w in meta.warnings), meta.warnings
        _reference["r"] = (df, work)
    return _reference["r"]


def event_start(data: bytes, frac: float) -> int:
    """The offset of the first complete event with a name and args that starts after ``frac``
    of the file (the last such event when none follows)."""
    starts = [m.end() - 1 for m in BOUNDARY.finditer(data, data.index(b'"traceEvents"'))]
    ends = starts[1:] + [len(data)]
    good = [s for s, e in zip(starts, ends) if all(k in data[s:e] for k in (b'"ph": "X"', b'"name": "', b'"dur": ', b'"args": {'))]
    after = [s for s in good if s >= frac * len(data)]
    return after[0] if after else good[-1]


def damage(data: bytes, frac: float, kind: str) -> bytes:
    """One event of ``data`` (the first after ``frac``) damaged the way ``kind`` says."""
    s = event_start(data, frac)
    name = data.index(b'"name": "', s) + len(b'"name": "')
    dur = data.index(b'"dur": ', s) + len(b'"dur": ')
    dur_end = dur + re.match(rb"[-0-9.eE+]+", data[dur:]).end()
    args = data.find(b'"args": {', s)
    put = {
        "nan": (dur, dur_end, b"NaN"),
        "infinity": (dur, dur_end, b"-Infinity"),
        "inf": (dur, dur_end, b"inf"),
        "out_of_range": (dur, dur_end, b"1e400"),
        "dur_past_int64": (dur, dur_end, b"1e300"),
        "invalid_utf8": (name, name, b"\xff\xfe\xc3"),
        "lone_surrogate": (name, name, b"\\ud800"),
        "control_chars": (name, name, b"\x1b]0;pwned\x07\x01"),
        "bad_escape": (name, name, b"\\q"),
        "broken_quote": (name - 1, name, b"@"),
        "deep_args": (args + len(b'"args": {'), args + len(b'"args": {'), b'"deep": ' + b"[" * 5000 + b"]" * 5000 + b", "),
    }[kind]
    a, b, text = put
    return data[:a] + text + data[b:]


KINDS = ["nan", "infinity", "inf", "out_of_range", "dur_past_int64", "invalid_utf8", "lone_surrogate",
         "control_chars", "bad_escape", "broken_quote", "deep_args"]
# what becomes of the damaged event: mended (kept, maybe with a field nulled) or lost
LOST = {"broken_quote", "dur_past_int64"}


def lost_rows(clean: pl.DataFrame, got: pl.DataFrame) -> pl.DataFrame:
    """The clean parse's events that the damaged parse does not have, unchanged."""
    return clean.select(KEY).join(got.select(KEY), on=KEY, how="anti", nulls_equal=True)


@pytest.mark.parametrize("frac", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("kind", KINDS)
def test_one_bad_event_costs_that_event(tmp_path, tmp_path_factory, kind, frac):
    clean, clean_work = reference(tmp_path_factory)
    p = tmp_path / "t.json"
    p.write_bytes(damage(clean_bytes(), frac, kind))
    df, meta, work = parse_counting(p)
    lost = lost_rows(clean, df)
    # the damaged event: kept with a field mended (NaN -> null dur -> 0, a name mended, deep args
    # nulled), so that at most its own row differs from the clean one; never any other row
    assert lost.height <= 1, lost
    assert df.height >= clean.height - 1
    if kind in LOST:
        assert df.height == clean.height - 1
    warned = " ".join(meta.warnings)
    if kind == "dur_past_int64":  # valid JSON: the event is dropped by its end, which int64 ns cannot hold
        assert "past what int64 ns can hold" in warned
    else:
        assert "1 events with invalid JSON" in warned and "at byte" in warned, meta.warnings
    # the damage costs about one more pass over a chunk or two, not a pass per later boundary
    assert work <= clean_work + 8 * CHUNK, (work, clean_work)


def test_a_mended_name_is_kept_and_made_valid(tmp_path, tmp_path_factory):
    clean, _ = reference(tmp_path_factory)
    for kind, expect in (("invalid_utf8", "\ufffd"), ("lone_surrogate", "\ufffd"), ("control_chars", "\x1b]0;pwned")):
        p = tmp_path / f"{kind}.json"
        p.write_bytes(damage(clean_bytes(), 0.5, kind))
        df, meta = kineto.parse(p)
        assert df.height == clean.height
        names = df.filter(pl.col("name").cast(pl.String).str.contains(expect, literal=True)).get_column("name")
        assert names.len() == 1, (kind, names)
        assert f"({kind.replace('_', ' ').replace('utf8', 'UTF-8').replace('chars', 'characters').replace('surrogate', 'surrogates')}: 1)" in meta.warnings[0]


def test_many_bad_events_cost_each_one_and_stay_linear(tmp_path, tmp_path_factory):
    """Every 20th event damaged: each one is mended, the work stays within a small factor."""
    clean, clean_work = reference(tmp_path_factory)
    data = clean_bytes()
    starts = [m.end() - 1 for m in BOUNDARY.finditer(data, data.index(b'"traceEvents"'))][::20]
    out, last = [], 0
    for s in starts:
        d = data.index(b'"dur": ', s) + len(b'"dur": ')
        e = d + re.match(rb"[-0-9.eE+]+", data[d:]).end()
        if d < last:
            continue
        out += [data[last:d], b"NaN"]
        last = e
    p = tmp_path / "t.json"
    p.write_bytes(b"".join(out + [data[last:]]))
    df, meta, work = parse_counting(p)
    assert df.height == clean.height
    assert work <= 4 * clean_work, (work, clean_work)
    assert any("events with invalid JSON were read after mending it (NaN or Infinity:" in w for w in meta.warnings)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(frac=st.floats(0.0, 0.98), kind=st.sampled_from(KINDS))
def test_damage_anywhere_costs_one_event(tmp_path_factory, frac, kind):
    clean, clean_work = reference(tmp_path_factory)
    p = tmp_path_factory.mktemp("d") / "t.json"
    p.write_bytes(damage(clean_bytes(), frac, kind))
    df, meta, work = parse_counting(p)
    assert lost_rows(clean, df).height <= 1
    assert work <= clean_work + 8 * CHUNK


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(frac=st.floats(0.0, 1.0), byte=st.integers(0, 255), insert=st.booleans())
def test_any_byte_changed_costs_at_most_two_events(tmp_path_factory, frac, byte, insert):
    """A byte flipped or inserted anywhere: the project's own error (the header or the array's
    key hit), or a table that lacks at most the two events around the byte."""
    clean, clean_work = reference(tmp_path_factory)
    data = clean_bytes()
    at = min(int(frac * len(data)), len(data) - 1)
    bad = data[:at] + bytes([byte]) + data[at + (0 if insert else 1):]
    p = tmp_path_factory.mktemp("b") / "t.json"
    p.write_bytes(bad)
    try:
        df, meta, work = parse_counting(p)
    except ParseError as e:
        assert "\n" not in e.problem and not e.problem.startswith("unreadable trace"), e.problem
        return
    assert lost_rows(clean, df).height <= 2
    assert work <= 2 * clean_work + 8 * CHUNK, (work, clean_work)


# -- shapes of the file around the events --------------------------------------------------
def _events(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(KEY).sort(KEY, nulls_last=True)


@pytest.mark.parametrize(
    "shape",
    ["spaces_8k", "newlines_2m", "bom_and_spaces", "nested_key_first", "key_in_a_string", "keys_after_the_array", "array_only"],
)
def test_file_shapes_that_stay_readable(tmp_path, tmp_path_factory, shape):
    import orjson

    clean, _ = reference(tmp_path_factory)
    data = clean_bytes()
    top = orjson.loads(data)
    events = top.pop("traceEvents")
    body = {
        "spaces_8k": b" " * 8192 + data,
        "newlines_2m": b"\n" * (2 << 20) + data,
        "bom_and_spaces": b"\xef\xbb\xbf" + b"\t " * 4096 + data,
        # a "traceEvents" key nested inside another value, and a string holding the key's text, come first
        "nested_key_first": b'{"meta": {"traceEvents": 5, "x": [{"traceEvents": []}]}, ' + data.lstrip()[1:],
        "key_in_a_string": b'{"note": "\\"traceEvents\\": [1]", "traceEvents\\u0020": 1, ' + data.lstrip()[1:],
        # the device list after the events: its objects look like more events to a byte search
        "keys_after_the_array": orjson.dumps({"traceEvents": events, **top}),
        "array_only": orjson.dumps(events),
    }[shape]
    p = tmp_path / "t.json"
    p.write_bytes(body)
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean))
    assert not any("invalid JSON" in w for w in meta.warnings), meta.warnings
    if shape not in ("array_only",):
        assert meta.devices, "the keys around the array are read"


def test_a_second_traceevents_array_is_read_too(tmp_path, tmp_path_factory):
    import orjson

    clean, _ = reference(tmp_path_factory)
    top = orjson.loads(clean_bytes())
    events = top.pop("traceEvents")
    half = len(events) // 2
    body = orjson.dumps({**top, "traceEvents": events[:half]})[:-1] + b', "traceEvents": ' + orjson.dumps(events[half:]) + b"}"
    p = tmp_path / "t.json"
    p.write_bytes(body)
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean))
    assert f"a second traceEvents array: its {len(events) - half} events were read too" in meta.warnings


@pytest.mark.parametrize(
    "bad, note, gpu_known",
    [
        (b"NVIDIA \xff\xfe H100", "read after mending it (invalid UTF-8)", True),
        (b'NVIDIA H100", "x": NaN, "y": "', "read after mending it (NaN or Infinity)", True),
        (b'NVIDIA H100" "no comma": "', "not valid JSON: they were ignored", False),
    ],
)
def test_damaged_keys_before_the_array_cost_those_keys(tmp_path, tmp_path_factory, bad, note, gpu_known):
    """The device list before the events damaged: mended where it can be, else ignored; the
    events are all there either way."""
    clean, _ = reference(tmp_path_factory)
    data = clean_bytes()
    name = data.index(b'"name": "') + len(b'"name": "')  # the first device's name (deviceProperties come first)
    assert name < data.index(b'"traceEvents"')
    end = data.index(b'"', name)
    p = tmp_path / "t.json"
    p.write_bytes(data[:name] + bad + data[end:])
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean))
    assert any(note in w for w in meta.warnings), meta.warnings
    assert bool(meta.devices) is gpu_known


# -- numbers no int64 ns can hold ------------------------------------------------------------
TINY = {"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 100, "dur": 10, "args": {"device": 0, "stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "BAD", "pid": 0, "tid": 7, "ts": 200, "dur": 10, "args": {"device": 0, "stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, "ts": 300, "dur": 10, "args": {"device": 0, "stream": 7}},
]}


@pytest.mark.parametrize(
    "field, text, outcome",
    [
        ("ts", "123456789012345678901234567890", "without a usable timestamp"),  # an int past int64 and any ns
        ("ts", "9" * 400, "without a usable timestamp"),  # past a double's range too
        ("ts", "1.5e300", "without a usable timestamp"),
        ("ts", "NaN", "without a usable timestamp"),
        ("dur", "1e300", "past what int64 ns can hold"),
        ("dur", "-1e300", "past what int64 ns can hold"),
        ("dur", "9" * 400, "without a duration were given 0"),  # mended to null first
        ("dur", "Infinity", "without a duration were given 0"),
        ("ts", "9200000000000000", "without a usable timestamp"),  # 9.2e15 us = 9.2e18 ns: int64's edge
    ],
)
def test_numbers_past_int64_cost_the_event_or_field(tmp_path, field, text, outcome):
    import json

    raw = json.dumps(TINY).replace('"name": "BAD", "pid": 0, "tid": 7, "ts": 200, "dur": 10',
                                   f'"name": "BAD", "pid": 0, "tid": 7, "ts": {text if field == "ts" else 200}, '
                                   f'"dur": {text if field == "dur" else 10}')
    p = tmp_path / "t.json"
    p.write_text(raw)
    df, meta = kineto.parse(p)
    assert {"k1", "k3"} <= set(df.get_column("name"))
    assert any(outcome in w for w in meta.warnings), meta.warnings
    if "given 0" in outcome:
        assert df.filter(pl.col("name") == "BAD").get_column("dur_ns").to_list() == [0]
    else:
        assert "BAD" not in set(df.get_column("name"))
    assert df.get_column("ts_ns").max() < 1 << 62


# -- bombs: bounded memory, one line -----------------------------------------------------------
def _gz(path: Path, parts: list[tuple[bytes, int]]) -> Path:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        for block, times in parts:
            for _ in range(times):
                f.write(c.compress(block))
        f.write(c.flush())
    return path


BLOCK = b"a" * (1 << 16)


@pytest.mark.parametrize(
    "name, parts, words",
    [
        ("header", [(b'{"x": "', 1), (BLOCK, 64), (b'", "traceEvents": []}', 1)], "the JSON before the traceEvents array"),
        ("one_event", [(b'{"traceEvents": [{"ph": "X", "name": "', 1), (BLOCK, 64), (b'"}]}', 1)], "the JSON value at byte 17"),
        ("whitespace", [(b" " * (1 << 16), 64), (b'{"traceEvents": []}', 1)], "the JSON before the traceEvents array"),
        ("deep", [(b'{"traceEvents": [', 1), (b"[" * (1 << 16), 32), (b"]" * (1 << 16), 32), (b"]}", 1)], "the JSON value at byte 17"),
        ("after_the_array", [(b'{"traceEvents": [{"ph": "X", "name": "e", "ts": 1, "dur": 1}], "x": "', 1), (BLOCK, 64), (b'"}', 1)],
         "is larger than 1 MB"),
    ],
)
def test_bombs_stop_at_the_piece_limit(tmp_path, monkeypatch, name, parts, words):
    """A 4 MB piece of JSON with the limit at 1 MB: refused in one line, having buffered no more
    than about twice the limit."""
    monkeypatch.setenv("TRACELENS_MAX_EVENT_MB", "1")
    most = [0]
    more = jsonstream._Stream._more

    def watching(self, n):
        got = more(self, n)
        most[0] = max(most[0], len(self.buf))
        return got

    monkeypatch.setattr(jsonstream._Stream, "_more", watching)
    p = _gz(tmp_path / f"{name}.json.gz", parts)
    with pytest.raises(ParseError) as e:
        kineto.parse(p)
    assert words in e.value.problem and "TRACELENS_MAX_EVENT_MB" in e.value.problem and "\n" not in e.value.problem
    assert most[0] <= 2 * limits.MB + 2 * (1 << 20), most[0]


def test_a_gzip_that_expands_too_much_is_refused(tmp_path, monkeypatch):
    """Events that compress 1000x: past INFLATE_FREE_BYTES of content the ratio is checked."""
    monkeypatch.setattr(limits, "INFLATE_FREE_BYTES", 1 << 20)
    ev = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100, "dur": 1, "args": {"device": 0}},'
    p = _gz(tmp_path / "bomb.json.gz", [(b'{"traceEvents": [', 1), (ev * 1000, 200), (b'{"ph": "X", "name": "e", "ts": 1, "dur": 1}]}', 1)])
    assert p.stat().st_size * 200 < 20 << 20  # the file does expand past the ratio
    with pytest.raises(ParseError, match="expands more than 200x.*TRACELENS_MAX_INFLATE"):
        kineto.parse(p)
    monkeypatch.setenv("TRACELENS_MAX_INFLATE", "100000")
    df, _ = kineto.parse(p)
    assert df.height == 200 * 1000 + 1


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_a_bad_limit_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv("TRACELENS_MAX_EVENT_MB", value)
    with pytest.raises(UsageError, match="TRACELENS_MAX_EVENT_MB"):
        limits.max_event_bytes()


# -- the mending itself ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, fixed, what",
    [
        (b'{"a": NaN, "b": [Infinity, -Infinity, inf, -inf, nan]}', b'{"a": null, "b": [null, null, null, null, null]}', "NaN or Infinity"),
        (b'{"a": 1e400, "b": -2.5E+999, "c": 1e300}', b'{"a": null, "b": null, "c": 1e300}', "numbers out of range"),
        (b'{"n": "x\\ud800y"}', '{"n": "x\ufffdy"}'.encode(), "lone surrogates"),
        (b'{"n": "\\ud83d\\ude00"}', b'{"n": "\\ud83d\\ude00"}', None),  # a valid pair is left alone
        (b'{"n": "a\x01b"}', b'{"n": "a\\u0001b"}', "control characters"),
        (b'{"n": "a\\qb"}', b'{"n": "a\\\\qb"}', "invalid escapes"),
        (b'{"n": "\xff"}', '{"n": "\ufffd"}'.encode(), "invalid UTF-8"),
        (b'{"s": "NaN inside a string stays", "v": 1}', b'{"s": "NaN inside a string stays", "v": 1}', None),
        (b'{"a": ' + b"[" * 70 + b"]" * 70 + b', "b": 2}', b'{"a": ' + b"[" * 63 + b"null" + b"]" * 63 + b', "b": 2}',
         "values nested deeper than 64"),
    ],
)
def test_repair(raw, fixed, what):
    import orjson

    out, done = jsonstream.repair(raw)
    assert out == fixed
    assert done == ({what} if what else set())
    orjson.loads(out)  # valid JSON now


# -- found by an attack on the first version (each once a defect) ---------------------------
def test_a_stray_bracket_between_events_costs_nothing(tmp_path, tmp_path_factory):
    clean, _ = reference(tmp_path_factory)
    data = clean_bytes()
    s = event_start(data, 0.4)  # "}, {" before it: put a "]" after the "}"
    j = data.rindex(b"}", 0, s) + 1
    p = tmp_path / "t.json"
    p.write_bytes(data[:j] + b"]" + data[j:])
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean))
    assert any("stray brackets: 1" in w for w in meta.warnings), meta.warnings


def test_dense_damage_is_mended_in_one_pass_per_chunk(tmp_path, tmp_path_factory):
    """Kineto's "inf" bandwidths in every event's args: all kept, decoder work a small factor."""
    clean, clean_work = reference(tmp_path_factory)
    p = tmp_path / "t.json"
    p.write_bytes(clean_bytes().replace(b'"args": {', b'"args": {"algbw (GB/sec)": inf, '))
    df, meta, work = parse_counting(p)
    assert _events(df).equals(_events(clean))
    assert any("NaN or Infinity" in w for w in meta.warnings)
    assert work <= 6 * clean_work, (work, clean_work)


def test_a_gzip_member_ending_a_byte_before_a_read_boundary(tmp_path, tmp_path_factory, monkeypatch):
    """Two gzip members, the first (stored) ending 1 byte before a read of the file ends: the
    next member's 2-byte magic spans two reads."""
    clean, _ = reference(tmp_path_factory)
    data = clean_bytes()
    monkeypatch.setattr(jsonstream, "READ_BYTES", 1 << 16)
    want = jsonstream.READ_BYTES - 1
    cut = next(k for k in range(want - 200, want) if len(gzip.compress(data[:k], compresslevel=0)) == want)
    first = gzip.compress(data[:cut], compresslevel=0)
    assert len(first) == want, len(first)
    p = tmp_path / "t.json.gz"
    p.write_bytes(first + gzip.compress(data[cut:]))
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean)) and not meta.truncated


def test_concatenated_documents_read_the_first_and_say_so(tmp_path, tmp_path_factory):
    clean, _ = reference(tmp_path_factory)
    p = tmp_path / "t.json"
    p.write_bytes(clean_bytes() + clean_bytes())
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean))
    said = [int(m.group(1)) for w in meta.warnings if (m := re.match(r"(\d+) bytes after the end of the JSON document", w))]
    assert said and len(clean_bytes()) - 2 <= said[0] <= len(clean_bytes()), meta.warnings  # the second one (its leading newline aside)


@pytest.mark.parametrize("damage_at", ['"schemaVersion"', "]"])
def test_brackets_or_quotes_broken_before_the_array(tmp_path, tmp_path_factory, damage_at):
    """A quote or the device list's closing bracket gone: the keys are lost (said), the events not."""
    clean, _ = reference(tmp_path_factory)
    data = clean_bytes()
    head = data.index(b'"traceEvents"')
    i = data.index(b'"schemaVersion"') if damage_at != "]" else data.rindex(b"]", 0, head)
    p = tmp_path / "t.json"
    p.write_bytes(data[:i] + data[i + 1 :])
    df, meta = kineto.parse(p)
    assert _events(df).equals(_events(clean))
    assert any("the JSON before the traceEvents array is damaged" in w for w in meta.warnings), meta.warnings


def test_one_event_a_day_away_is_dropped_not_stretching_the_window(tmp_path, tmp_path_factory):
    """ts 0 in an epoch-µs trace: 53 years of "idle" unless the event goes."""
    clean, _ = reference(tmp_path_factory)
    data = clean_bytes()
    s = event_start(data, 0.5)
    i = data.index(b'"ts": ', s) + len(b'"ts": ')
    j = i + re.match(rb"[0-9.]+", data[i:]).end()
    p = tmp_path / "t.json"
    p.write_bytes(data[:i] + b"0" + data[j:])
    df, meta = kineto.parse(p)
    assert lost_rows(clean, df).height == 1 and df.height == clean.height - 1
    assert df.get_column("ts_ns").min() >= clean.get_column("ts_ns").min()
    assert any("more than a day away" in w and "at ts 0 µs" in w for w in meta.warnings), meta.warnings


def test_a_huge_name_is_cut(tmp_path):
    import json

    big = "k" * (kineto.MAX_NAME_BYTES * 3)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(TINY).replace('"BAD"', json.dumps(big)))
    df, meta = kineto.parse(p)
    assert df.get_column("name").cast(pl.String).str.len_bytes().max() == kineto.MAX_NAME_BYTES
    assert any("names longer than 64 KB were cut" in w for w in meta.warnings)


def test_a_bad_limit_in_a_parse_is_a_usage_error_not_a_bad_file(tmp_path, monkeypatch):
    import json

    p = tmp_path / "t.json"
    p.write_text(json.dumps(TINY))
    monkeypatch.setenv("TRACELENS_MAX_INFLATE", "-1")
    with pytest.raises(UsageError, match="TRACELENS_MAX_INFLATE"):
        kineto.parse(p)


def test_many_broken_events_cost_each_one_and_stay_linear(tmp_path, tmp_path_factory):
    """Every 20th complete event's name loses its opening quote (cannot be mended): each costs
    itself only, and the decoder's work stays a small factor of the clean parse (after a
    damaged event the next are decoded in small windows, not the rest of the chunk)."""
    clean, clean_work = reference(tmp_path_factory)
    data = clean_bytes()
    starts = [m.end() - 1 for m in BOUNDARY.finditer(data, data.index(b'"traceEvents"'))]
    ends = starts[1:] + [len(data)]
    good = [s for s, e in zip(starts, ends) if b'"ph": "X"' in data[s:e] and b'"name": "' in data[s:e]][::20]
    out, last = [], 0
    for s in good:
        i = data.index(b'"name": "', s)
        out += [data[last:i], b"@"]
        last = i + 1
    p = tmp_path / "t.json"
    p.write_bytes(b"".join(out + [data[last:]]))
    df, meta, work = parse_counting(p)
    assert lost_rows(clean, df).height == len(good) == clean.height - df.height
    assert any(f"{len(good)} events with invalid JSON could not be read and were skipped" in w for w in meta.warnings), meta.warnings
    assert work <= 6 * clean_work, (work, clean_work)
