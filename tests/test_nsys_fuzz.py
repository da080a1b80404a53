"""The nsys parser never crashes: a real export with random tables dropped, columns nulled, garbage
values (text, blobs, invalid UTF-8, huge numbers) written into them, or its bytes cut, gives a frame
that follows EVENT_SCHEMA or one ParseError / TraceInputError line."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracelens.parsers.nsys import parse, parts
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


def _check(path: Path) -> None:
    try:
        df, meta = parse(path)
    except TraceInputError as e:
        assert e.path == str(path) and e.problem and "\n" not in e.problem
        return
    validate(df)
    try:  # the ranks it holds (a damaged globalPid or deviceId can make several), each parsed
        listed = parts(path)
    except TraceInputError as e:
        assert e.path == str(path) and e.problem and "\n" not in e.problem
        return
    for part in listed[:3] if len(listed) > 1 else ():
        try:
            df, meta = parse(path, part=part)
        except TraceInputError as e:
            assert e.path == str(path) and e.problem and "\n" not in e.problem
            continue
        validate(df)


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
