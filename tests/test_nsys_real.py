"""The nsys parser on every shared Nsight Systems export, checked against plain sqlite3 queries of
the same file; the whole report on each; Kineto and nsys exports of the same GPU work agree to the
nanosecond; bad inputs are one-line errors and no file is ever created or modified."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3

import polars as pl
import pytest
from tracelens.parsers.nsys import parse

from tests.conftest import SAMPLE_TRACES, real_traces
from tests.nsys_build import Export, from_kineto
from tracelens import cli
from tracelens.analysis import analyze
from tracelens.model.errors import EXIT_BAD_INPUT, EXIT_OK, ParseError
from tracelens.model.schema import validate
from tracelens.store.job import load

NSYS = real_traces() / "nsys"
EXPORTS = sorted(NSYS.glob("*.sqlite"))


def _q(path, sql):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return con.execute(sql).fetchone() if all(t in tables for t in _tables(sql)) else None
    finally:
        con.close()


def _tables(sql):
    return [w for w in sql.replace(",", " ").split() if w.isupper() and ("_" in w) and not w.startswith("ENUM")]


def test_three_shared_exports():
    assert [p.name for p in EXPORTS] == ["generated_nsys2022.4.2.1_cpu_nvtx_osrt_demo.sqlite",
                                         "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite",
                                         "pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite"]


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name)
def test_counts_match_sqlite(path):
    """Kernel count and time, copy bytes, NVTX ranges, OS calls: what sqlite3 says the file holds."""
    df, meta = parse(path)
    validate(df)
    kernels = df.filter(pl.col("kind") == "kernel")
    n, total = _q(path, "SELECT count(*), coalesce(sum(end - start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL") or (0, 0)
    assert (kernels.height, kernels.get_column("dur_ns").sum()) == (n, total)
    (nbytes,) = _q(path, "SELECT coalesce(sum(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY") or (0,)
    assert df.filter(pl.col("kind") == "memcpy").get_column("bytes").sum() == nbytes
    (ranges,) = _q(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL") or (0,)
    assert df.filter(pl.col("cat").cast(pl.String).str.starts_with("nvtx")).height == ranges
    (osrt,) = _q(path, "SELECT count(*) FROM OSRT_API WHERE eventClass NOT IN (31, 32)") or (0,)
    assert df.filter(pl.col("cat") == "osrt").height == osrt
    (calls,) = _q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)") or (0,)
    assert df.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])).height == calls
    assert meta.format == "nsys" and meta.parser_version and meta.attributes["nsys_version"].startswith(path.name.split("nsys")[-1][:6])


@pytest.mark.parametrize("path", [p for p in EXPORTS if "cpu" not in p.name], ids=lambda p: p.name)
def test_every_launch_links_its_kernel(path):
    """Each GPU activity whose correlation id the runtime table holds has its launch in the frame."""
    df, _ = parse(path)
    want = _q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                    "WHERE r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24)")[0]
    launches = df.filter(pl.col("kind").is_in(["runtime", "sync"])).select("correlation").unique()
    linked = df.filter(pl.col("kind") == "kernel").join(launches, on="correlation").height
    assert linked == want == df.filter(pl.col("kind") == "kernel").height


def test_gpu_names_and_names_like_kineto():
    h200, meta = parse(NSYS / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite")
    assert meta.device_id == 0 and meta.device_name == "NVIDIA H200" and meta.platform == "cuda"
    names = set(h200.get_column("name").cast(pl.String))
    assert {"cudaLaunchKernel", "cudaStreamSynchronize", "cuLaunchKernelEx", "cuGetProcAddress_v2", "Memset (Device)",
            "Stream Wait Event"} <= names
    assert not any(n.endswith("_v7000") or n.endswith("_v3020") for n in names)
    sync = h200.filter(pl.col("name") == "cudaStreamSynchronize")
    assert sync.get_column("kind").to_list() == ["sync"]
    saxpy, meta = parse(NSYS / "pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite")
    assert meta.device_name == "NVIDIA A100-SXM4-40GB" and meta.attributes["nvtx_domains"] == "MPI"
    assert set(saxpy.filter(pl.col("kind") == "memcpy").get_column("name").cast(pl.String)) == {
        "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)"}
    # the backtrace copies of each runtime call (event class 67) are not calls
    assert saxpy.filter(pl.col("name") == "cudaLaunchKernel").height == 5
    assert set(saxpy.filter(pl.col("cat") == "nvtx:MPI").get_column("name").cast(pl.String)) == {
        "MPI_Init", "MPI_Send", "MPI_Recv", "MPI_Finalize"}


def test_steps_threads_and_pids_from_nvtx():
    """The 2022.4 demo: train_step_N push/pop ranges are the steps, pid/tid decoded from globalTid."""
    df, meta = parse(NSYS / "generated_nsys2022.4.2.1_cpu_nvtx_osrt_demo.sqlite")
    steps = df.filter(pl.col("kind") == "step")
    assert steps.get_column("name").cast(pl.String).to_list() == ["train_step#0", "train_step#1", "train_step#2"]
    gtid = 281582199904503
    assert set(steps.get_column("pid")) == {(gtid >> 24) & 0xFFFFFF} and set(steps.get_column("tid")) == {gtid & 0xFFFFFF}
    assert meta.threads[f"{(gtid >> 24) & 0xFFFFFF}:{gtid & 0xFFFFFF}"] == "nvtx_demo"
    assert meta.attributes["nvtx_marks"] == 3 and meta.attributes["nvtx_domains"] == "tracelens_demo"
    start_end = df.filter(pl.col("name") == "async_backward")
    assert start_end.height == 3 and start_end.get_column("kind").to_list() == ["annotation"] * 3
    assert {"usleep", "pthread_join", "fopen"} <= set(df.filter(pl.col("cat") == "osrt").get_column("name").cast(pl.String))
    assert meta.device_id is None and "no GPU events (a CPU-only trace)" in meta.warnings


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name)
def test_report_runs_and_partitions_exactly(path, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["report", "--no-cache", str(path), "-o", str(out)]) == EXIT_OK
    capsys.readouterr()
    r = json.loads(out.read_bytes())
    (rank,) = r["ranks"]
    assert rank["path"] == str(path)
    for s in rank["steps"]:
        g = s["gpu_time_ns"]
        if g is None:
            continue
        assert g["idle"] + g["compute"] + g["exposed_comm"] + g["exposed_memcpy"] == s["dur_ns"]
        assert min(g.values()) >= 0
    if "cpu" in path.name:
        assert [s["name"] for s in rank["steps"]] == ["train_step#0", "train_step#1", "train_step#2"]
    else:
        assert rank["window_basis"] == "gpu_activity" and rank["device"]["peak_flops"]


def test_kineto_and_nsys_of_the_same_work_agree(tmp_path):
    """A real Kineto trace's kernels, copies, CUDA calls and steps written as an nsys export (the
    2022.4 schema's tables): the same GPU-time partition, to the nanosecond, and the same idle split
    (BERT on an H100, one ProfilerStep; B200 eager training with NCCL kernels, no steps)."""
    from tracelens.parsers.kineto import parse as kineto

    for src in (SAMPLE_TRACES / "h100_bert_small" / "rank-0.json.gz",
                real_traces() / "amd-tracelens" / "b200" / "eager_trace.json.gz"):
        kdf, _ = kineto(src)
        export = from_kineto(kdf, tmp_path / f"{src.parent.name}.sqlite")
        ndf, meta = parse(export)
        assert ndf.filter(pl.col("kind") == "kernel").height == kdf.filter(pl.col("kind") == "kernel").height
        ka, na = analyze(load([src], use_cache=False)), analyze(load([export], use_cache=False))
        kr, nr = ka.ranks[0], na.ranks[0]
        assert [(s.name, s.start_ns, s.end_ns, s.gpu) for s in nr.steps] == [(s.name, s.start_ns, s.end_ns, s.gpu) for s in kr.steps]
        if "bert" in str(src):
            assert [s.idle for s in nr.steps] == [s.idle for s in kr.steps]
            assert nr.steps[0].name == "ProfilerStep#6"
        else:
            assert nr.steps[0].gpu.comm > 0 and meta.attributes["seq_source"].startswith("derived")


# ---- bad input -------------------------------------------------------------------------------

def _error(capsys, path, tmp_path):
    code = cli.main(["report", "--no-cache", str(path), "-o", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and len(err) == 1 and err[0].startswith("tracelens: error: "), err
    assert not (tmp_path / "r.json").exists()
    return err[0]


def test_an_sqlite_database_that_is_not_an_export(tmp_path, capsys):
    db = tmp_path / "app.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    assert "not an Nsight Systems export" in _error(capsys, db, tmp_path)


def test_an_export_with_no_events(tmp_path, capsys):
    empty = Export(tmp_path / "empty.sqlite", ()).close()
    assert "with no events" in _error(capsys, empty, tmp_path)


@pytest.mark.parametrize("cut", [100, 4096, 50_000, 300_000])
def test_truncated_and_corrupt_exports(tmp_path, capsys, cut):
    data = (NSYS / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite").read_bytes()
    short = tmp_path / "short.sqlite"
    short.write_bytes(data[:cut])
    try:
        df, _ = parse(short)
        validate(df)
    except ParseError as e:
        assert "\n" not in e.problem
    garbled = tmp_path / "garbled.sqlite"
    garbled.write_bytes(data[:cut] + bytes((i * 37) % 256 for i in range(20_000)) + data[cut + 20_000:])
    try:
        validate(parse(garbled)[0])
    except ParseError as e:
        assert "\n" not in e.problem


def test_never_creates_or_modifies_a_file(tmp_path):
    """Read-only immutable URI: no -journal, -wal or -shm beside the export, not even while
    another connection holds it locked (a locked database is read as it is on disk)."""
    d = tmp_path / "a #dir?x%"
    d.mkdir()
    copy = d / "profile #1?.sqlite"
    shutil.copy(NSYS / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite", copy)
    before = (copy.read_bytes(), os.stat(copy).st_mtime_ns)
    locker = sqlite3.connect(copy, timeout=0)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        df, meta = parse(copy)
    finally:
        locker.rollback()
        locker.close()
    assert df.filter(pl.col("kind") == "kernel").height == 19
    assert sorted(p.name for p in d.iterdir()) == [copy.name]
    assert (copy.read_bytes(), os.stat(copy).st_mtime_ns) == before


def test_strings_that_are_not_utf8(tmp_path):
    bad = tmp_path / "bad.sqlite"
    shutil.copy(NSYS / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite", bad)
    con = sqlite3.connect(bad)
    con.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id % 3 = 0", (b"\xff\xfeab\x80",))
    con.commit()
    con.close()
    df, meta = parse(bad)
    validate(df)
    assert df.filter(pl.col("name").cast(pl.String).str.contains("\ufffd")).height > 0
    assert any("not valid UTF-8" in w for w in meta.warnings)


def test_several_gpu_processes_keep_the_busiest(tmp_path):
    ex = Export(tmp_path / "two.sqlite", ("CUPTI_ACTIVITY_KIND_KERNEL",))
    k = ex.string("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    grid = dict(registersPerThread=1, gridX=1, gridY=1, gridZ=1, blockX=1, blockY=1, blockZ=1, staticSharedMemory=0,
                dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0)
    for pid, dur in ((11, 100), (22, 500), (22, 500)):
        ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", start=1000, end=1000 + dur, deviceId=pid % 2, contextId=1, streamId=7,
                  correlationId=1, globalPid=(1 << 48) | (pid << 24), demangledName=k, shortName=k, **grid)
    df, meta = parse(ex.close())
    assert df.height == 2 and set(df.get_column("device")) == {0} and meta.attributes["pid"] == 22
    assert any("2 processes ran GPU work" in w and "pid 11" in w for w in meta.warnings)
    assert df.get_column("kclass").to_list() == ["comm", "comm"] and df.get_column("collective").to_list() == ["allreduce"] * 2
    assert df.get_column("seq").to_list() == [0, 1]


def test_rank_from_the_recorded_environment(tmp_path):
    ex = Export(tmp_path / "env.sqlite", ("NVTX_EVENTS",))
    ex.con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
    ex.con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", [
        ("PROCESS_0:ENVIRONMENT_VARIABLE", "HOME=/root"), ("PROCESS_0:ENVIRONMENT_VARIABLE", "RANK=3"),
        ("PROCESS_0:ENVIRONMENT_VARIABLE", "WORLD_SIZE=8"), ("PROCESS_0:ENVIRONMENT_VARIABLE", "LOCAL_RANK=1")])
    ex.insert("NVTX_EVENTS", start=0, end=10, eventType=59, text="step", globalTid=(1 << 48) | (5 << 24) | 5)
    df, meta = parse(ex.close())
    assert (meta.rank, meta.rank_source, meta.world_size) == (3, "environment RANK", 8)
    assert df.get_column("rank").to_list() == [3] and df.get_column("name").to_list() == ["step#0"]


def test_adbc_reads_only_big_exports(monkeypatch):
    """ADBC's reader costs more than it saves on a small export: under read.ADBC_MIN_BYTES the
    tables go through sqlite3 (no ADBC connection is opened); at or above it, through ADBC. The
    size is the database's own (page_count x page_size)."""
    from tracelens.parsers.nsys import _connect, read, sqlite_uri

    path = real_traces() / "nsys" / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite"
    opened = []
    real = read.Db._adbc
    monkeypatch.setattr(read.Db, "_adbc", lambda self: (opened.append(1), real(self))[1])
    db = read.Db(_connect(path), sqlite_uri(path))
    assert 0 < db._size() == path.stat().st_size < read.ADBC_MIN_BYTES
    db.close()
    parse(path)
    assert opened == []
    if read.ADBC:
        monkeypatch.setattr(read, "ADBC_MIN_BYTES", 0)
        parse(path)
        assert opened
