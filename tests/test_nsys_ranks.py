"""nsys exports holding several ranks (``nsys profile torchrun ...``: one process per GPU; or one
process driving several GPUs): one rank per (process, device), each with its own handle, cache
entry and rank; checked against plain sqlite3 queries of the same file."""

from __future__ import annotations

import json
import shutil
import sqlite3

import polars as pl
import pytest
from tracelens.parsers import nsys

from tests.nsys_build import ALLREDUCE, GEMM, several_ranks
from tracelens import cli
from tracelens.analysis import analyze
from tracelens.model.errors import EXIT_OK
from tracelens.store.job import load

TWO_PROCS = [(301, [0]), (302, [1])]  # two processes, one GPU each
TWO_GPUS = [(401, [0, 1])]  # one process, two GPUs


def _q(path, sql, args=()):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(sql, args).fetchone()
    finally:
        con.close()


def _kernels(path, pid, device):
    return _q(path, "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE (globalPid >> 24) & 16777215 = ? "
                    "AND deviceId = ?", (pid, device))


@pytest.fixture
def exports(tmp_path):
    return {"procs": several_ranks(tmp_path / "procs.sqlite", TWO_PROCS),
            "gpus": several_ranks(tmp_path / "gpus.sqlite", TWO_GPUS),
            "both": several_ranks(tmp_path / "both.sqlite", TWO_PROCS + [(403, [2, 3])])}


def test_parts_listed_by_pid_then_device(exports):
    assert [(p["pid"], p["device"], p["index"], p["of"]) for p in nsys.parts(exports["both"])] == [
        (301, 0, 0, 4), (302, 1, 1, 4), (403, 2, 2, 4), (403, 3, 3, 4)]
    assert [(p["pid"], p["device"]) for p in nsys.parts(exports["gpus"])] == [(401, 0), (401, 1)]
    pairs = _q(exports["both"], "SELECT group_concat(p || ':' || d) FROM (SELECT DISTINCT (globalPid >> 24) & 16777215 AS p, "
                                "deviceId AS d FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1, 2)")[0]
    assert pairs == ",".join(f"{p['pid']}:{p['device']}" for p in nsys.parts(exports["both"]))


@pytest.mark.parametrize("which", ["procs", "gpus", "both"])
def test_one_rank_per_process_and_device(exports, which, tmp_path, monkeypatch):
    """Rank count; each rank's kernels, their time and CUDA calls equal sqlite3's for its (process,
    device); host rows go with their process; nothing is counted twice; the partition sums."""
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(tmp_path / "cache"))
    path = exports[which]
    job = load([path])
    listed = nsys.parts(path)
    assert len(job.handles) == len(listed) > 1 and job.ranks == list(range(len(listed)))
    for h, part in zip(job.handles, listed):
        df = h.read()
        pid, dev = part["pid"], part["device"]
        k = df.filter(pl.col("kind") == "kernel")
        assert (k.height, k.get_column("dur_ns").sum()) == _kernels(path, pid, dev)
        assert set(k.get_column("device").unique()) == {dev} and set(df.get_column("pid").drop_nulls().unique()) == {pid}
        # its launches: the CUDA calls whose correlation is a kernel of this process on this device
        (calls,) = _q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE (r.globalTid >> 24) & 16777215 = ? AND "
                            "NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId = r.correlationId AND "
                            "k.globalPid >> 24 = r.globalTid >> 24 AND k.deviceId != ?)", (pid, dev))
        assert df.filter(pl.col("kind") == "runtime").height == calls
        linked = k.join(df.filter(pl.col("kind") == "runtime").select("correlation"), on="correlation").height
        assert linked == k.height
        (osrt,) = _q(path, "SELECT count(*) FROM OSRT_API WHERE (globalTid >> 24) & 16777215 = ?", (pid,))
        assert df.filter(pl.col("cat") == "osrt").height == osrt  # a process's host rows: in each of its parts
        (steps,) = _q(path, "SELECT count(*) FROM NVTX_EVENTS WHERE (globalTid >> 24) & 16777215 = ? AND text LIKE "
                            "'ProfilerStep#%'", (pid,))
        assert df.filter(pl.col("kind") == "step").height == steps == 3
        # NCCL's ranges: one per collective this device ran, not its process's other devices' too
        assert df.filter(pl.col("kind") == "collective").height == k.filter(pl.col("name") == ALLREDUCE).height == 3
        assert h.meta.attributes["nsys_part"] == {"index": part["index"], "of": len(listed), "pid": pid, "device": dev}
        assert h.meta.device_id == dev
    # the parts together hold every kernel of the file, once
    total = sum(h.read_lazy(pl.col("kind").eq("kernel").sum()).item() for h in job.handles)
    assert total == _q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    a = analyze(job)
    for r in a.ranks:
        for s in r.steps:
            g = s.gpu
            assert g.idle + g.compute + g.exposed_comm + g.exposed_memcpy == s.end_ns - s.start_ns
    # the collectives are matched across the ranks: each all-reduce on every rank, in order
    table = a.collectives
    assert table.height == 3 * len(listed)
    assert table.group_by("seq").agg(pl.col("rank").n_unique()).get_column("rank").to_list() == [len(listed)] * 3


def test_cache_entries_per_part_and_a_second_load_reads_them(exports, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(tmp_path / "cache"))
    path = exports["both"]
    first = load([path])
    listings = []
    real = nsys.parts
    monkeypatch.setattr(nsys, "parts", lambda p: listings.append(p) or real(p))
    again = load([path])
    assert listings == []  # every part in the cache: the file is not queried
    keys = [h.parquet.name for h in again.handles]
    assert len(set(keys)) == 4 and all(f"-p{k}." in n for k, n in enumerate(keys))
    assert [h.parquet for h in again.handles] == [h.parquet for h in first.handles]
    for a, b in zip(first.handles, again.handles):
        assert a.meta.rank == b.meta.rank and a.read().equals(b.read())
    # a part's entry removed: the file is listed again and only that part parsed
    again.handles[2].parquet.unlink()
    third = load([path])
    assert len(listings) == 1 and [h.meta.rank for h in third.handles] == [0, 1, 2, 3]
    assert third.handles[2].read().height == first.handles[2].read().height


def test_a_part_read_back_without_the_cache(exports):
    job = load([exports["gpus"]], use_cache=False)
    h = job.handles[1]
    want = h.read()
    h.frame = None  # neither kept nor cached: parsed again, that part only
    assert h.read().equals(want)


def test_rank_from_each_process_environment(tmp_path):
    path = several_ranks(tmp_path / "env.sqlite", [(501, [0]), (502, [1]), (503, [2])],
                         env={501: {"RANK": "5", "WORLD_SIZE": "6"}, 502: {"RANK": "3"}})
    job = load([path], use_cache=False)
    assert [(m.rank, m.rank_source) for m in job.metas] == [(5, "environment RANK"), (3, "environment RANK"), (0, "order")]
    assert job.metas[0].world_size == 6
    said = [w for w in job.all_warnings if "rank 0 given by that order" in w]
    assert len(said) == 1 and "pid 503" in said[0] and said[0].startswith(f"{path} [pid 503, device 2]")


def test_two_exports_of_several_ranks_each(exports, tmp_path):
    """A directory of two such exports (two nodes): their ranks in file order, then part order."""
    d = tmp_path / "job"
    d.mkdir()
    shutil.copyfile(exports["procs"], d / "node0.sqlite")
    shutil.copyfile(exports["gpus"], d / "node1.sqlite")
    job = load([d], use_cache=False)
    assert [(m.path.rsplit("/", 1)[1], m.rank, m.attributes["nsys_part"]["pid"]) for m in job.metas] == [
        ("node0.sqlite", 0, 301), ("node0.sqlite", 1, 302), ("node1.sqlite", 2, 401), ("node1.sqlite", 3, 401)]
    assert [h.file for h in job.handles] == [0, 1, 2, 3]


def test_report_inputs_say_which_part_fed_each_rank(exports, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["report", "--no-cache", str(exports["both"]), "-o", str(out)]) == EXIT_OK, capsys.readouterr().err
    capsys.readouterr()
    d = json.loads(out.read_bytes())
    assert [(i["rank"], i["part"]["pid"], i["part"]["device"]) for i in d["inputs"]] == [
        (0, 301, 0), (1, 302, 1), (2, 403, 2), (3, 403, 3)]
    assert all(i["path"] == str(exports["both"]) for i in d["inputs"]) and len(d["ranks"]) == 4
    # a parse-cached run gives the same report
    again = tmp_path / "r2.json"
    assert cli.main(["report", str(exports["both"]), "-o", str(again)]) == EXIT_OK
    assert cli.main(["report", str(exports["both"]), "-o", str(again)]) == EXIT_OK
    capsys.readouterr()
    d2 = json.loads(again.read_bytes())
    assert d2["inputs"] == d["inputs"] and d2["ranks"] == d["ranks"]


def test_an_export_of_one_rank_is_as_before(tmp_path):
    """One (process, device): no parts, the file's cache key and meta as for any single export."""
    path = several_ranks(tmp_path / "one.sqlite", [(601, [0])])
    assert len(nsys.parts(path)) == 1
    job = load([path], use_cache=False)
    (h,) = job.handles
    assert h.part is None and "nsys_part" not in h.meta.attributes and h.meta.rank == 0
    df, meta = nsys.parse(path)
    assert df.filter(pl.col("kind") == "kernel").height == 6 and "nsys_part" not in meta.attributes
    assert set(df.filter(pl.col("kind") == "kernel").get_column("name").cast(pl.String)) == {GEMM, ALLREDUCE}


def test_parse_of_a_part_by_index_and_a_bad_index(exports):
    df, meta = nsys.parse(exports["gpus"], part=1)
    assert meta.attributes["nsys_part"]["device"] == 1 and set(df.filter(pl.col("kind") == "kernel").get_column("device")) == {1}
    with pytest.raises(nsys.ParseError, match="no part 5"):
        nsys.parse(exports["gpus"], part=5)


def test_copies_without_kernels_make_no_rank(exports):
    from tests.nsys_build import global_tid, table_sql

    path = exports["procs"]
    con = sqlite3.connect(path)
    con.execute(table_sql()["CUPTI_ACTIVITY_KIND_MEMCPY"])
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, globalPid, "
                "bytes, copyKind, deprecatedSrcId, srcKind, dstKind, srcDeviceId, srcContextId, dstDeviceId, dstContextId) "
                "VALUES (5, 9, 5, 1, 7, 999, ?, 64, 1, 0, 0, 2, 0, 0, 5, 1)", (global_tid(302, 0),))
    con.commit()
    con.close()
    listed = nsys.parts(path)
    assert [(p["pid"], p["device"]) for p in listed] == [(301, 0), (302, 1)]
    assert listed[0]["left_out"] == [{"proc": global_tid(302, 0) >> 24, "pid": 302, "device": 5}]
    job = load([path], use_cache=False)
    said = [w for w in job.all_warnings if "make no rank" in w]
    assert len(said) == 1 and "pid 302, device 5" in said[0]
    assert all(h.read().filter(pl.col("kind") == "memcpy").height == 0 for h in job.handles)


@pytest.mark.parametrize("which", ["procs", "gpus", "both", "payloads"])
def test_parts_same_through_both_readers(exports, which, tmp_path):
    """Each part (and the whole-file parse) gives the same frame and TraceMeta through ADBC's SQLite
    driver as through sqlite3 alone; ADBC reads every table itself (NCCL payload blobs included)."""
    from polars.testing import assert_frame_equal
    from tracelens.parsers.nsys import read

    path = (several_ranks(tmp_path / "pay.sqlite", TWO_PROCS, comms={301: [7, 0xF00000000000000A], 302: [0xF00000000000000A, 7]})
            if which == "payloads" else exports[which])
    refused = []
    saved_close = read.Db.close
    read.Db.close = lambda self: (refused.append(self.fallbacks), saved_close(self))[1]
    try:
        for part in [None, *nsys.parts(path)]:
            got = []
            for adbc in (True, False):
                saved = read.ADBC, read.ADBC_MIN_BYTES
                read.ADBC, read.ADBC_MIN_BYTES = adbc and read.ADBC, 0  # ADBC for every export, however small
                try:
                    got.append(nsys.parse(path, part=part))
                finally:
                    read.ADBC, read.ADBC_MIN_BYTES = saved
            (a, ma), (b, mb) = got
            assert_frame_equal(a, b)
            assert ma == mb
            if which == "payloads" and part is not None:
                assert a.filter(pl.col("kind") == "collective").get_column("group").null_count() == 0
    finally:
        read.Db.close = saved_close
    if read.ADBC:
        assert not any(refused[::2])  # the ADBC runs (every other close) fell back on no table
