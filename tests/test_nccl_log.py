"""NCCL_DEBUG=INFO logs -> collective rows, communicators and facts (parsers/nccl/log.py): the real
excerpts under tests/data/traces/nccl/logs, and whole logs built from their line shapes with each
launcher's prefix, one file with many ranks or one per rank, read in batches as small as a line."""

from __future__ import annotations

import polars as pl
import pytest

from parsers.nccl import log
from tests.conftest import real_traces
from tracelens.model.nccl import NCCL_ROW_SCHEMA
from tracelens.model.schema import COLLECTIVE_SCHEMA

LOGS = real_traces() / "nccl" / "logs"
CID = "0x9ad9a6b1c2d3e4f5"


def rank_lines(rank: int, world: int = 4, ops: int = 3, host: str = "node01", *, skip_last: bool = False) -> list[str]:
    """One rank's log in NCCL 2.21's shapes (from the real excerpts): init, topology, COLL lines."""
    pid, dev = 4000 + rank, rank % 8
    core = f"{host}:{pid}:{pid + 17} [{dev}] NCCL INFO "
    comm = f"0x55{rank:02d}e3c10180"
    out = ["NCCL version 2.21.5+cuda12.4"] if rank == 0 else []
    out += [
        core + "Bootstrap : Using eth0:10.0.1.9<0>",
        core + f"comm {comm} rank {rank} nranks {world} cudaDev {dev} nvmlDev {dev} busId {dev + 1}000 commId {CID} - Init START",
        core + f"Channel 00/02 : {' '.join(str(r) for r in range(world))}",
        core + f"Channel 01/02 : {' '.join(str(r) for r in range(world))}",
        core + f"Trees [0] {(rank + 1) % world}/-1/-1->{rank}->{(rank - 1) % world} [1] -1/-1/-1->{rank}->{(rank - 1) % world}",
        core + f"Channel 00/0 : {rank}[{dev}] -> {(rank + 1) % world}[{(dev + 1) % 8}] via P2P/CUMEM/read",
        core + f"Channel 01/0 : {rank}[{dev}] -> {(rank + 1) % world}[{(dev + 1) % 8}] [send] via NET/IB/3/GDRDMA",
        core + "Connected all rings",
        core + "32 coll channels, 32 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
        core + f"ncclCommInitRank comm {comm} rank {rank} nranks {world} cudaDev {dev} nvmlDev {dev} busId {dev + 1}000 commId {CID} - Init COMPLETE",
    ]
    for i in range(ops - (1 if skip_last else 0)):
        out.append(core + f"AllReduce: opCount {i:x} sendbuff 0x7f0c{i:04x}00 recvbuff 0x7f0c{i:04x}80 count 4096 datatype 7 op 0 "
                          f"root 0 comm {comm} [nranks={world}] stream 0x7f0c74002f00")
        out.append(core + "AllReduce: 16384 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}")
    return out


PREFIXES = {
    "none": lambda r: "",
    "openmpi": lambda r: f"[1,{r}]<stdout>:",
    "slurm": lambda r: f"{r}: ",
    "torchrun": lambda r: f"[default{r}]:",
    "torchrun_rank": lambda r: f"[rank{r}]:",
    "ray": lambda r: f"(RayTrainWorker pid={615 + r}, ip=10.72.7.{r}) ",
    "pdsh": lambda r: "node01: ",
}


@pytest.mark.parametrize("launcher", sorted(PREFIXES))
def test_one_file_of_many_ranks_with_each_launchers_prefix(tmp_path, launcher):
    pre = PREFIXES[launcher]
    per_rank = [[pre(r) + ln for ln in rank_lines(r)] for r in range(4)]
    lines = [ln for group in zip(*[p + [""] * (20 - len(p)) for p in per_rank]) for ln in group if ln]  # interleaved by rank
    f = tmp_path / "job.log"
    f.write_text("\n".join(lines) + "\n")
    got = log.read(f)
    assert got.warnings == []
    rows = got.rows
    assert dict(rows.schema) == NCCL_ROW_SCHEMA and list(rows.columns[: len(COLLECTIVE_SCHEMA)]) == list(COLLECTIVE_SCHEMA)
    assert rows.height == 12 and set(rows["group"]) == {CID} and sorted(set(rows["seq"])) == [0, 1, 2]
    assert sorted(set(rows["rank"])) == [0, 1, 2, 3] and set(rows["member"]) == {"0", "1", "2", "3"}
    assert set(rows["collective"]) == {"allreduce"} and set(rows["dtype"]) == {"float32"} and set(rows["redop"]) == {"sum"}
    assert set(rows["bytes"]) == {4096 * 4} and set(rows["group_size"]) == {4} and set(rows["state"]) == {"scheduled"}
    comms = got.comms
    assert comms.height == 4 and set(comms["comm_id"]) == {CID} and sorted(comms["rank"]) == [0, 1, 2, 3]
    assert set(comms["nranks"]) == {4} and sorted(comms["bus_id"]) == ["1000", "2000", "3000", "4000"]
    f_ = got.facts
    assert f_["nccl_version"] == "2.21.5+cuda12.4" and f_["unknown_lines"] == 0 and f_["collective_lines"] == 12
    assert {t["transport"]: t["connections"] for t in f_["transports"]} == {"P2P": 4, "NET/IB": 4}
    assert f_["channels"] == 2 and f_["tree_lines"] == 4 and f_["coll_channels"] == 32 and f_["rings_connected"] == 4
    assert f_["tuning"] == [{"op": "AllReduce", "algo": "RING", "proto": "LL", "calls": 12, "min_bytes": 16384, "max_bytes": 16384}]


def test_one_file_per_rank_and_batches_as_small_as_a_line(tmp_path, monkeypatch):
    whole = tmp_path / "whole.log"
    whole.write_text("\n".join(ln for r in range(4) for ln in rank_lines(r)) + "\n")
    ref = log.read(whole).rows
    monkeypatch.setattr(log, "BATCH_BYTES", 97)
    small = log.read(whole).rows
    assert small.drop("order").equals(ref.drop("order"))
    per_file = pl.concat([log.read(_write(tmp_path / f"rank{r}.log", rank_lines(r)), file=r).rows for r in range(4)])
    cols = ["rank", "group", "seq", "collective", "count", "member"]
    assert per_file.select(cols).sort(cols).equals(ref.select(cols).sort(cols))


def _write(p, lines):
    p.write_text("\n".join(lines) + "\n")
    return p


def test_real_excerpts_read_without_error():
    seen = {}
    for f in sorted(LOGS.glob("*.log")):
        got = log.read(f)
        seen[f.name] = got
        assert got.facts["unknown_lines"] == 0, (f.name, got.facts)
    r = seen["nccl-issue531_ib_warn_and_allgather_16ranks.log"]
    assert r.rows.height == 4 and set(r.rows["seq"]) == {0xF7} and set(r.rows["group_size"]) == {16}
    assert r.facts["warn_lines"] == 1 and "collective mismatch" in r.facts["warnings_logged"][0]
    assert any("grouped by size" in w for w in r.warnings)  # an excerpt: no init lines name the communicator
    ts = seen["deepep-issue330_timestamped_allgather_coll_32ranks.log"].rows
    assert ts["start_ns"].is_not_null().all() and ts["start_ns"].is_sorted()  # NCCL_DEBUG_TIMESTAMP_FORMAT lines
    assert seen["nccl-issue300_openmpi_prefix_version_nccl2.5.6.log"].facts["nccl_version"] == "2.5.6+cuda10.2"
    trees = seen["nccl-issue1357_h100_2node_comm_trees.log"]
    assert sorted(trees.comms["rank"]) == [13, 14] and set(trees.comms["nnodes"]) == {2}
    assert seen["nccl-tests-issue293_init_nccl2.21.5.log"].facts["networks"] == ["IBext_v8"]
    wd = seen["olmo-core-issue829_pytorch_watchdog_timeout.log"].facts["watchdog"]  # PyTorch's message over 6 lines
    assert wd == [{"rank": 4, "seq": 27732, "op": "_REDUCE_SCATTER_BASE", "pg": None, "timeout_ms": 1800000, "ran_ms": 1800003,
                   "last_enqueued": 27753, "last_completed": 27731}]
    assert seen["tinygrad-pr22_connected_all_rings_trees_4gpu.log"].facts["trees_connected"] == 4


def test_unknown_truncated_and_interleaved_lines_are_counted(tmp_path):
    good = rank_lines(0, world=2) + rank_lines(1, world=2)
    cut = good[-2][:40]
    mixed = good[-4][:50] + good[-3]  # a cut line with another line run into it
    f = tmp_path / "bad.log"
    f.write_bytes(("\n".join(good[:-4] + ["some program output", mixed, "garbage \x00\x1f\xff"]) + "\n" + cut).encode("utf-8", "surrogateescape"))
    got = log.read(f)
    assert got.facts["unknown_lines"] == 2 and got.facts["interleaved_lines"] == 1
    assert any("2 line(s) are neither" in w for w in got.warnings) and any("interleaved" in w for w in got.warnings)
    assert got.rows.height >= 3


def test_without_init_lines_communicators_are_guessed_by_size_and_order(tmp_path):
    """NCCL_DEBUG_SUBSYS=COLL: no commId; two communicators of one size (TP and DP of 2) stay apart
    by the order each process first used them; the launcher's rank names the rank."""
    lines = []
    for r in range(2):
        core = f"[1,{r}]<stdout>:node01:{400 + r}:{500 + r} [{r}] NCCL INFO "
        for i, comm in enumerate((f"0x{r}aa", f"0x{r}bb")):
            for op in range(2):
                lines.append(core + f"AllReduce: opCount {op} sendbuff 0x1 recvbuff 0x2 count {10 + i} datatype 9 op 0 root 0 "
                                    f"comm {comm} [nranks=2] stream 0x3")
    got = log.read(_write(tmp_path / "coll.log", lines))
    rows = got.rows
    assert sorted(set(rows["group"])) == ["nranks=2#1", "nranks=2#2"] and sorted(set(rows["rank"])) == [0, 1]
    assert rows.filter(pl.col("group") == "nranks=2#2")["count"].unique().to_list() == [11]
    assert set(rows["dtype"]) == {"bfloat16"} and set(rows["bytes"]) == {20, 22} and set(rows["member"]) == {"0", "1"}
    assert any("a guess" in w for w in got.warnings)


def test_tail_fields_codes_and_an_unreadable_device_per_batch(tmp_path, monkeypatch):
    """The COLL tail's globalrank (its regex runs only in a batch that has one), unknown dtype / redop
    codes by name, and a device number too big for Int32 (null) still joined to its communicator."""
    core = "node01:4000:4017 [{d}] NCCL INFO "
    init = core.format(d=0) + f"comm 0x55 rank 1 nranks 2 cudaDev 0 busId 1000 commId {CID} - Init COMPLETE"
    plain = core.format(d=0) + "AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 8 datatype 13 op 7 root 0 comm 0x55 [nranks=2] stream 0x3"
    grank = (core.format(d=0) + "AllReduce: opCount 2 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 0 comm 0x55 "
             "[nranks=2] stream 0x3 task 4 globalrank 6")
    big = core.format(d=99999999999) + "AllReduce: opCount 3 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 0 comm 0x55 [nranks=2] stream 0x3"
    monkeypatch.setattr(log, "BATCH_BYTES", len(init) + len(plain) + 3)  # init + plain in one batch, the others after
    rows = log.read(_write(tmp_path / "t.log", [init, plain, grank, big])).rows
    assert rows["seq"].to_list() == [1, 2, 3]
    # plain: no globalrank, the communicator's rank; grank: NCCL's globalrank 6 wins; big: dev null, the comm still found
    assert rows["rank"].to_list() == [1, 6, 1] and rows["group"].to_list() == [CID] * 3 and rows["member"].to_list() == ["1"] * 3
    assert rows["dtype"].to_list() == ["datatype13", "float32", "float32"] and rows["redop"].to_list() == ["premulsum7", "sum", "sum"]
    assert rows["group_size"].to_list() == [2, 2, 2] and rows["bytes"].to_list() == [None, 32, 32]  # 8 float32 = 32 B


def test_many_logs_read_by_worker_processes_are_the_same(tmp_path, monkeypatch):
    """Files over PARALLEL_MIN_BYTES in all are read one per worker task (``engine.choose``): the
    same parses, in the files' order, as read here."""
    from tracelens import engine
    from tracelens.store import nccl as store

    found = [(p, "nccl_log") for p in sorted(LOGS.glob("*.log"))]
    here, _ = store.read_all(found, jobs=1)
    monkeypatch.setattr(engine, "PARALLEL_MIN_BYTES", 0)
    pooled, _ = store.read_all(found, jobs=None)
    assert [p.path for p in here] == [p.path for p in pooled] == [str(p) for p, _ in found]
    for a, b in zip(here, pooled):
        assert a.rows.equals(b.rows) and a.comms.equals(b.comms) and a.facts == b.facts and a.warnings == b.warnings


def test_categorical_rows_diagnose_and_concat_with_string_rows(tmp_path):
    # 4 ranks, 3 AllReduce each, rank 3's last missing: a hang at seq 2 with rank 3 behind, whether the rows are
    # the parser's (Categorical strings: 4-byte codes, no 16-byte views) or the same rows with String columns,
    # alone or concatenated (a String frame and a Categorical one give String, they do not fail)
    from tracelens.analysis.job.hang import MEMBERS_SCHEMA, diagnose
    from tracelens.model.nccl import as_strings

    f = tmp_path / "job.log"
    f.write_text("\n".join(ln for r in range(4) for ln in rank_lines(r, skip_last=r == 3)) + "\n")
    rows = log.read(f).rows
    assert rows.height == 11
    assert {c for c, t in rows.schema.items() if t == pl.Categorical} == {
        "group", "group_desc", "collective", "member", "op_name", "dtype", "redop", "state", "comm", "host"}
    plain = as_strings(rows)
    assert plain.schema["group"] == pl.String and plain.schema["source"] == pl.String
    half = pl.concat([rows.filter(pl.col("rank") < 2), plain.filter(pl.col("rank") >= 2)], how="diagonal_relaxed")
    assert half.schema["member"] == pl.String and half.height == 11
    # the group's config as a Flight Recorder dump would give it (String group and member: joined with the rows')
    members = pl.DataFrame({"group": [CID] * 4, "member": ["0", "1", "2", "3"], "group_rank": [0, 1, 2, 3], "from_start": [None] * 4},
                           schema=MEMBERS_SCHEMA)
    for r in (rows, plain, half):
        d = diagnose(r, members=members)
        assert d["verdict"] == "hang" and d["culprits"] == [3], d["summary"]
        assert d["groups"][0]["behind"] == [{"member": 3, "rank": 3, "last_seq": 1}]


def test_numbers_that_do_not_cast_are_null_not_an_error(tmp_path):
    """``\\d`` also matches non-ASCII digits (``\\u0663``, Arabic-Indic 3) and a number can overflow its
    column: each of these lines raised InvalidOperationError (a strict cast) before.  Now the value is
    null: the channel is not counted, the communicator's rank and size are unknown, the tuning line
    is counted in calls but gives no bytes."""
    core = "node01:4000:4017 [0] NCCL INFO "
    got = log.read(_write(tmp_path / "n.log", [
        core + "Channel \u06631/02 : 0 1", core + "Channel 01/02 : 0 1",
        core + f"comm 0x55 rank \u0663 nranks 99999999999 cudaDev 0 busId 1000 commId {CID} - Init COMPLETE",
        core + "AllReduce: \u06634 Bytes -> Algo RING proto LL", core + "AllReduce: 16384 Bytes -> Algo RING proto LL"]))
    assert got.facts["channels"] == 1  # channel 01 only
    assert got.comms.select("comm", "comm_id", "rank", "nranks", "cuda_dev").to_dicts() == [
        {"comm": "0x55", "comm_id": CID, "rank": None, "nranks": None, "cuda_dev": 0}]
    assert got.facts["tuning"] == [{"op": "AllReduce", "algo": "RING", "proto": "LL", "calls": 2, "min_bytes": 16384, "max_bytes": 16384}]


def test_collective_lines_the_fast_regex_misses_are_read_by_the_full_one(tmp_path):
    """A COLL line is read by ``_COLL_FAST`` (ASCII classes, one pass) and, where that does not
    match, by ``_COLL_NR`` (``\\S``/``\\d``).  Lines 2-4 below miss the fast regex (checked first, so
    the fallback is what is tested): a non-ASCII byte in the send buffer, a tab after the comm, a
    non-ASCII digit in the count.  All five lines give a row, in line order (opCount 0..4), with
    the fields the full regex reads: the count of line 4 is null (not a number once cast), its root
    1; every row of the comm ``0x5500e3c10180`` in the commId's group, member 0."""
    core = "node01:4000:4017 [0] NCCL INFO "
    c = "comm 0x5500e3c10180"
    head = "sendbuff 0x7f0c00 recvbuff 0x7f0c80"
    calls = [f"AllReduce: opCount 0 {head} count 4096 datatype 7 op 0 root 0 {c} [nranks=4] stream 0x7f",
             f"AllReduce: opCount 1 sendbuff 0x7f0c\u00e9 recvbuff 0x7f0c80 count 4096 datatype 7 op 0 root 0 {c} [nranks=4] stream 0x7f",
             f"AllReduce: opCount 2 {head} count 8192 datatype 7 op 0 root 0 {c}\t[nranks=4] stream 0x7f",
             f"Broadcast: opCount 3 {head} count \u06632 datatype 7 op 0 root 1 {c} [nranks=4] stream 0x7f",
             f"AllReduce: opCount 4 {head} count 4096 datatype 7 op 0 root 0 {c}"]
    fast = pl.Series(calls).str.extract_groups(log._COLL_FAST).struct.field("op").is_null().to_list()
    assert fast == [False, True, True, True, False]  # lines 2-4 need the fallback
    full = pl.Series(calls).str.extract_groups(log._COLL_NR).struct.field("op").is_not_null().to_list()
    assert all(full)
    init = core + f"comm 0x5500e3c10180 rank 0 nranks 4 cudaDev 0 busId 1000 commId {CID} - Init COMPLETE"
    got = log.read(_write(tmp_path / "fallback.log", [init] + [core + ln for ln in calls]))
    assert got.rows.select("seq", "collective", "count", "root", "group", "member").to_dicts() == [
        {"seq": 0, "collective": "allreduce", "count": 4096, "root": 0, "group": CID, "member": "0"},
        {"seq": 1, "collective": "allreduce", "count": 4096, "root": 0, "group": CID, "member": "0"},
        {"seq": 2, "collective": "allreduce", "count": 8192, "root": 0, "group": CID, "member": "0"},
        {"seq": 3, "collective": "broadcast", "count": None, "root": 1, "group": CID, "member": "0"},
        {"seq": 4, "collective": "allreduce", "count": 4096, "root": 0, "group": CID, "member": "0"},
    ]
    assert got.facts["unknown_lines"] == 0
