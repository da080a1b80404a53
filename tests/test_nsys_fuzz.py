"""The nsys parser never crashes: a real export with random tables dropped, columns nulled, garbage
values (text, blobs, invalid UTF-8, huge numbers) written into them, or its bytes cut, gives a frame
that follows EVENT_SCHEMA or one ParseError / TraceInputError line, the same through ADBC's SQLite
driver and through sqlite3 alone."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from tracelens.parsers.nsys import parse, parts, read
from tracelens.parsers.nsys.schema import WANTED

from tests.conftest import real_traces
from tracelens.model.errors import TraceInputError
from tracelens.model.schema import validate

SEEDS = ["nvfuser_test_matmul_h200_nsys2024.6.2.sqlite", "generated_nsys2022.4.2.1_cpu_nvtx_osrt_demo.sqlite",
         "pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite"]
TABLES = sorted(WANTED) + ["EXPORT_META_DATA", "META_DATA_EXPORT"]
COLUMNS = sorted({c for need, opt in WANTED.values() for c in need + opt} | {"eventClass", "eventType", "bytes", "copyKind"})
GARBAGE = st.one_of(st.none(), st.text(max_size=20), st.binary(max_size=20), st.integers(min_value=-2**63, max_value=2**63 - 1),
                    st.floats(allow_nan=True), st.just(b"\xff\xfe invalid utf-8 \x80"))


def _parse_both(path: Path, part=None):
    """parse(path) (or one part of it) through ADBC (the default) and through sqlite3 alone: the same
    frame, warnings and error."""
    out = []
    for adbc in (True, False):
        saved = read.ADBC, read.ADBC_MIN_BYTES
        read.ADBC, read.ADBC_MIN_BYTES = adbc and read.ADBC, 0  # ADBC for every export, however small
        try:
            out.append(parse(path, part=part))
        except TraceInputError as e:
            out.append(e)
        finally:
            read.ADBC, read.ADBC_MIN_BYTES = saved
    a, b = out
    if isinstance(a, TraceInputError) or isinstance(b, TraceInputError):
        assert (type(a), str(a)) == (type(b), str(b))
    else:
        assert_frame_equal(a[0], b[0])
        assert a[1] == b[1]
    return a


def _check(path: Path) -> None:
    got = _parse_both(path)
    if isinstance(got, TraceInputError):
        assert got.path == str(path) and got.problem and "\n" not in got.problem
        return
    validate(got[0])
    try:  # the ranks it holds (a damaged globalPid or deviceId can make several), each parsed, by both readers
        listed = parts(path)
    except TraceInputError as e:
        assert e.path == str(path) and e.problem and "\n" not in e.problem
        return
    for part in listed[:3] if len(listed) > 1 else ():
        got = _parse_both(path, part)
        if isinstance(got, TraceInputError):
            assert got.path == str(path) and got.problem and "\n" not in got.problem
            continue
        validate(got[0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(SEEDS),
       edits=st.lists(st.tuples(st.sampled_from(["drop", "null", "set"]), st.sampled_from(TABLES), st.sampled_from(COLUMNS),
                                GARBAGE, st.integers(0, 3)), max_size=6))
def test_damaged_tables(seed, edits):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.sqlite"
        shutil.copy(real_traces() / "nsys" / seed, path)
        con = sqlite3.connect(path)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for op, table, col, value, every in edits:
            if table not in tables:
                continue
            cols = {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}
            if op == "drop":
                con.execute(f'DROP TABLE "{table}"')
                tables.discard(table)
            elif col in cols:
                # NOT NULL columns of the real schema refuse NULLs: rewrite the table without constraints
                con.execute(f'CREATE TABLE "_t" AS SELECT * FROM "{table}"')
                con.execute(f'DROP TABLE "{table}"')
                con.execute(f'ALTER TABLE "_t" RENAME TO "{table}"')
                where = f"WHERE rowid % {every + 1} = 0"
                # bytes stored as TEXT: invalid UTF-8 in a text column
                put = "CAST(? AS TEXT)" if isinstance(value, bytes) and every % 2 else "?"
                con.execute(f'UPDATE "{table}" SET "{col}" = {put} {where}', (None if op == "null" else value,))
        con.commit()
        con.close()
        _check(path)


@settings(max_examples=25, deadline=None)
@given(seed=st.sampled_from(SEEDS), frac=st.floats(0.0, 1.0), noise=st.binary(max_size=64))
def test_cut_and_noisy_bytes(seed, frac, noise):
    data = (real_traces() / "nsys" / seed).read_bytes()
    at = int(len(data) * frac)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.sqlite"
        path.write_bytes(data[:at] + noise + data[at + len(noise):] if noise else data[:at])
        _check(path)


def test_adbc_refusals_read_through_sqlite3(tmp_path):
    """What ADBC cannot read as given (a text column NULL for its first batch of rows, then text; text
    that is not UTF-8, in a kernel's name and an NVTX range) is read again through sqlite3: the
    same frame as sqlite3 alone gives, invalid text read with replacement characters."""
    from tests.nsys_build import Export, global_tid

    ex = Export(tmp_path / "x.sqlite", ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"))
    gpid, gtid = global_tid(7, 0), global_tid(7, 7)
    bad = ex.string("placeholder")
    ex.con.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", (b"k\xff\xfe", bad))
    for i in range(3):
        ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", start=10 * i, end=10 * i + 5, deviceId=0, contextId=1, streamId=7, correlationId=i,
                  globalPid=gpid, demangledName=bad, shortName=bad, registersPerThread=32, gridX=1, gridY=1, gridZ=1, blockX=1,
                  blockY=1, blockZ=1, staticSharedMemory=0, dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0)
    n = read.BATCH + 10  # more than the first batch ADBC infers the column types from
    rows = [(i, i + 1, 59, None, gtid) for i in range(n)] + [(n, n + 1, 59, "late text", gtid)]
    ex.con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)", rows)
    path = ex.close()
    df, meta = _parse_both(path)
    assert "late text" in df.get_column("name").cast(str).to_list()
    assert any("not valid UTF-8" in w for w in meta.warnings)
    assert df.filter(df.get_column("kind") == "kernel").get_column("name").cast(str).to_list() == ["k\ufffd\ufffd"] * 3
    clean = tmp_path / "clean.sqlite"  # the late text alone: ADBC refuses the NVTX table, sqlite3 reads it
    con = sqlite3.connect(path)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.execute("VACUUM INTO ?", (str(clean),))
    con.close()
    refused = []
    saved = read.Db.close
    read.Db.close = lambda self: (refused.append(self.fallbacks), saved(self))[1]
    try:
        df, meta = _parse_both(clean)
    finally:
        read.Db.close = saved
    assert not any("UTF-8" in w for w in meta.warnings) and "late text" in df.get_column("name").cast(str).to_list()
    if read.ADBC:
        assert refused[0] >= 1


@pytest.mark.parametrize("name", SEEDS)
def test_shared_exports_same_through_both_readers(name):
    saved = read.Db.close
    refused = []
    read.Db.close = lambda self: (refused.append(self.fallbacks), saved(self))[1]
    try:
        _parse_both(real_traces() / "nsys" / name)
    finally:
        read.Db.close = saved
    assert refused[0] == 0  # ADBC read every table of the shared exports itself
