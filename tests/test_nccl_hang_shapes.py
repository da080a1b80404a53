"""The hang verdict on the shapes real hangs leave (issue 19), hand-built: Flight Recorder dumps of an
older format (``seq_id``), a rank whose dump holds no entry, a rank whose dump is missing, and
PyTorch's watchdog messages of several ranks in one log (the newer ``[PG ID 0 PG GUID 0(default_pg)
Rank 3]`` / ``last enqueued NCCL work`` lines), read by ``tracelens report`` on the folder alone."""

from __future__ import annotations

import json
import pickle

import jsonschema

from parsers.nccl import flight_recorder as fr
from parsers.nccl import log
from tests.test_nccl_report import SCHEMA, report
from tracelens.analysis.job.hang import diagnose_watchdog
from tracelens.model.errors import EXIT_OK

T0 = 1_700_000_000_000_000_000


def entry(rid, seq, state="completed", name="nccl:all_reduce", pg=("0", "default_pg"), legacy=False):
    e = {"record_id": rid, "pg_id": int(pg[0]), "process_group": list(pg), "collective_seq_id": seq, "p2p_seq_id": 0,
         "op_id": seq, "profiling_name": name, "time_created_ns": T0 + rid, "input_sizes": [[1024]], "output_sizes": [[1024]],
         "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": state, "is_p2p": False, "timeout_ms": 600000,
         "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": state == "completed",
         "frames": [{"name": "train_step", "filename": "train.py", "line": 42}]}
    if legacy:  # an older dump: one seq_id, no collective_seq_id / p2p_seq_id / is_p2p / dtypes
        e["seq_id"] = e.pop("collective_seq_id")
        for k in ("p2p_seq_id", "is_p2p", "input_dtypes", "output_dtypes", "timeout_ms"):
            e.pop(k)
    return e


def write_dumps(d, per_rank: dict[int, list], world: int, version="2.10"):
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for r, entries in per_rank.items():
        (d / f"rank_{r}").write_bytes(pickle.dumps({"version": version, "comm_lib_version": "2.21.5", "pg_config": cfg,
                                                     "pg_status": {}, "entries": entries}))
    return d


def verdict(capsys, tmp_path, src):
    code, err, o = report(capsys, tmp_path, src)
    assert code == EXIT_OK, err
    d = json.loads(o.read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(d)
    return d["job"]["nccl_diagnosis"]


def test_older_dump_numbers_entries_with_seq_id(capsys, tmp_path):
    # 2 ranks, format 2.2 entries keyed "seq_id": rank 0 at seqs 1, 2 (completed) and 3 (started), rank 1 at 1, 2 only:
    # rank 1 never entered seq 3 (before: every entry dropped "without a sequence id", verdict "no collective records")
    d = write_dumps(tmp_path / "old", {0: [entry(i, i + 1, "completed" if i < 2 else "started", legacy=True) for i in range(3)],
                                       1: [entry(i, i + 1, legacy=True) for i in range(2)]}, world=2, version="2.2")
    assert fr.read(d / "rank_1").rows["seq"].to_list() == [1, 2]
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [1] and "rank 1 never entered seq 3" in v["summary"]


def test_a_rank_whose_dump_holds_no_entry_never_entered(capsys, tmp_path):
    # 3 ranks of one group: ranks 0 and 2 completed seq 1 and are in seq 2 ("started"); rank 1's dump is read, from its
    # first entry on (none: "entries": []), so it never called the group: the culprit (before: STUCK, no culprit)
    d = write_dumps(tmp_path / "empty", {0: [entry(0, 1), entry(1, 2, "started")], 1: [],
                                         2: [entry(0, 1), entry(1, 2, "started")]}, world=3)
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [1], v["summary"]
    assert "rank 1 never entered seq 2 (nccl:all_reduce count 1024 Float), which ranks 0, 2 entered" in v["summary"]
    g = v["groups"][0]
    assert g["never_called"] == [1] and g["behind"] == [{"member": 1, "rank": 1, "last_seq": None}] and g["waiting_for"]["seq"] == 2
    assert g["missing_members"] == 0  # rank 1's dump is in the inputs
    code, _, o = report(capsys, tmp_path, d, out="r.txt")
    text = o.read_text()
    assert "group 0: behind: 1 (no record of the group); waiting in seq 2: 0, 2" in text and "not in the inputs" not in text


def test_a_wrapped_dump_without_the_group_is_no_evidence(capsys, tmp_path):
    # as above, but rank 1's ring buffer wrapped (its one entry, of another group, has record id 500): that it holds no
    # entry of group 0 says nothing (dropped by the ring), so no culprit: every member seen is in seq 2, STUCK
    d = write_dumps(tmp_path / "wrapped", {0: [entry(0, 1), entry(1, 2, "started")], 1: [entry(500, 9, pg=("1", "tp"))],
                                           2: [entry(0, 1), entry(1, 2, "started")]}, world=3)
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "incomplete" and v["culprits"] == [] and v["groups"][0]["never_called"] == []


def test_the_rank_whose_dump_is_missing_is_the_culprit(capsys, tmp_path):
    # 4 ranks (pg_config "[0, 1, 2, 3]"), dumps of 0, 1, 2 only: each completed seqs 1-4 and is in seq 5 (started);
    # the one they wait for is rank 3, which left no dump (before: STUCK with no culprit)
    d = write_dumps(tmp_path / "missing", {r: [entry(i, i + 1, "completed" if i < 4 else "started") for i in range(5)]
                                           for r in range(3)}, world=4)
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "incomplete" and v["culprits"] == [3], v["summary"]
    assert "rank 3 of the group left no dump in the inputs" in v["summary"] and v["groups"][0]["no_input"] == [3]


# PyTorch's watchdog lines as torch 2.3-2.6 print them, 4 ranks in one Slurm log (prefix "N: " and torch's "[rankN]:")
TIMEOUT = ("{r}: [rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600060 "
           "milliseconds before timing out.")
STATUS = ("{r}: [rank{r}]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Exception "
          "(either an error or timeout) detected by watchdog at work: {s}, last enqueued NCCL work: {e}, last completed NCCL "
          "work: {c}.")


def test_watchdog_lines_of_ranks_interleaved_give_the_verdict(capsys, tmp_path):
    # ranks 0, 1, 3 time out in seq 1580 of PG 0 (last completed 1579); their lines interleaved, each status line after
    # another rank's timeout line (its rank is its own "Rank N]", not the line before's); rank 2 logs only a warning:
    # it never timed out in 1580, the culprit (before: "no collective records", no verdict)
    lines = [TIMEOUT.format(r=0, s=1580), TIMEOUT.format(r=3, s=1580), STATUS.format(r=0, s=1580, e=1580, c=1579),
             TIMEOUT.format(r=1, s=1580), STATUS.format(r=3, s=1580, e=1580, c=1579), STATUS.format(r=1, s=1580, e=1580, c=1579),
             "2: [rank2]:[W321 02:07:09.000000000 ProcessGroupNCCL.cpp:1200] [PG ID 0 PG GUID 0(default_pg) Rank 2] a warning"]
    f = tmp_path / "slurm-123.out"
    f.write_text("\n".join(lines) + "\n")
    r = log.read(f)
    assert [(w["rank"], w["seq"], w["pg"], w["last_enqueued"], w["last_completed"]) for w in r.facts["watchdog"]] == [
        (0, 1580, "0", 1580, 1579), (1, 1580, "0", 1580, 1579), (3, 1580, "0", 1580, 1579)]
    assert r.facts["ranks_named"] == [0, 1, 2, 3]
    v = verdict(capsys, tmp_path, f)
    assert v["verdict"] == "hang" and v["culprits"] == [2], v["summary"]
    assert v["summary"].startswith("HANG: PyTorch's watchdog: ranks 0, 1, 3 timed out in seq 1580 (ALLREDUCE) of group 0")


def test_watchdog_verdicts_by_hand():
    def item(rank, seq, pg="0", enq=None):
        return {"rank": rank, "seq": seq, "op": "ALLREDUCE", "pg": pg, "last_enqueued": enq, "last_completed": seq - 1}
    # rank 2 timed out in seq 7 (its last enqueued work 7) while 0, 1 did in 8: rank 2 never entered 8, the culprit
    v = diagnose_watchdog([item(0, 8, enq=9), item(1, 8, enq=8), item(2, 7, enq=7)], named=[0, 1, 2])
    assert v["verdict"] == "hang" and v["culprits"] == [2]
    assert "rank 2 timed out at seq 7: it never entered it" in v["reason"]
    # all in one collective, every rank named timed out: stuck inside it, no culprit
    v = diagnose_watchdog([item(r, 8, enq=8) for r in range(3)], named=[0, 1, 2])
    assert v["verdict"] == "incomplete" and v["culprits"] == []
    # the communicators' size says 4 ranks, the logs hold 3 (one node's log, say): no culprit for that, the gap said
    v = diagnose_watchdog([item(r, 8) for r in range(3)], named=[0, 1, 2], world=4)
    assert v["verdict"] == "incomplete" and v["culprits"] == [] and "the logs hold 3 of the job's 4 ranks" in v["reason"]
    # a rank timed out on two seqs of groups the lines do not name: which group each is, unknown: no verdict
    assert diagnose_watchdog([item(0, 8, pg=None), item(0, 96, pg=None), item(1, 8, pg=None)], named=[0, 1]) is None
    # an older log ("[Rank 4] ... at work sequence id", no PG): one rank, one seq: STUCK, no culprit
    assert diagnose_watchdog([item(4, 27732, pg=None, enq=27753)], named=[4])["verdict"] == "incomplete"


def p2p(rid, name, p2p_seq, state, pg=("0", "default_pg")):
    return {**entry(rid, 0, state, name=name, pg=pg), "is_p2p": True, "p2p_seq_id": p2p_seq}


def test_point_to_point_calls_that_never_completed(capsys, tmp_path):
    # rank 0 sent twice to rank 1 (p2p seqs 1, 2); rank 1 received once (completed) and posted nothing more: rank 0's
    # second send is "started" forever, rank 1 never posted its recv, the culprit (before: "consistent: 0 group(s)")
    d = write_dumps(tmp_path / "never", {0: [p2p(0, "nccl:send 0->1", 1, "completed"), p2p(1, "nccl:send 0->1", 2, "started")],
                                         1: [p2p(0, "nccl:recv 1<-0", 1, "completed")]}, world=2)
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [1], v["summary"]
    assert v["p2p_open"][0]["kind"] == "never_posted" and "it never posted the matching recv" in v["summary"]
    # both sides posted the pair (rank 1's recv started too): stuck inside the transfer, no culprit
    d = write_dumps(tmp_path / "posted", {0: [p2p(0, "nccl:send 0->1", 1, "started")], 1: [p2p(0, "nccl:recv 1<-0", 1, "started")]},
                    world=2)
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "incomplete" and v["culprits"] == [] and {f["kind"] for f in v["p2p_open"]} == {"posted"}
    # both send to each other, neither receives: a deadlock, both culprits
    d = write_dumps(tmp_path / "dead", {0: [p2p(0, "nccl:send 0->1", 1, "started")], 1: [p2p(0, "nccl:send 1->0", 1, "started")]},
                    world=2)
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [0, 1] and v["p2p_open"][0]["kind"] == "deadlock"


def test_point_to_point_peer_of_a_subgroup_is_its_global_rank(capsys, tmp_path):
    # a pipeline group "pp" of global ranks [1, 3] (pg_config); rank 3 (group rank 1) is in "send 1->0" to group rank 0,
    # global rank 1, whose dump holds nothing open in pp: rank 1 is the culprit (not group rank 0 read as global rank 0)
    d = tmp_path / "pp"
    d.mkdir()
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}, "5": {"name": "5", "desc": "pp", "ranks": "[1, 3]"}}
    per = {0: [entry(0, 1)], 1: [entry(0, 1)], 2: [entry(0, 1)], 3: [entry(0, 1), p2p(1, "nccl:send 1->0", 1, "started", pg=("5", "pp"))]}
    for r, es in per.items():
        (d / f"rank_{r}").write_bytes(pickle.dumps({"version": "2.10", "pg_config": cfg, "pg_status": {}, "entries": es}))
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [1], v["summary"]
    assert v["p2p_open"][0] == {**v["p2p_open"][0], "group": "5", "member": 3, "peer": 1, "kind": "never_posted"}


def test_an_unreadable_dump_alone_is_an_error_and_writes_nothing(capsys, tmp_path):
    from tracelens.model.errors import EXIT_BAD_INPUT

    # rank 1's dump cut 40 bytes short (pickle) beside rank 0's whole one: a warning, the report of rank 0 (exit 0);
    # the cut dump alone, or the folder with --strict: one line, exit 3, no output file (before: exit 0, an empty report)
    d = write_dumps(tmp_path / "cut", {r: [entry(i, i + 1) for i in range(3)] for r in range(2)}, world=2)
    (d / "rank_1").write_bytes((d / "rank_1").read_bytes()[:-40])
    code, err, o = report(capsys, tmp_path, d)
    assert code == 0 and any("rank_1: skipped (not a readable pickle" in e for e in err) and o.exists()
    o.unlink()
    code, err, o = report(capsys, tmp_path, d / "rank_1")
    assert code == EXIT_BAD_INPUT and not o.exists() and len(err) == 1 and "not a readable pickle" in err[0], err
    from tracelens import cli

    code = cli.main(["report", "--no-cache", "--strict", str(d), "-o", str(o)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and not o.exists() and "rank_1" in err[-1] and "Traceback" not in "".join(err)


def test_watchdog_of_a_subgroup_blames_no_rank_outside_it():
    # ranks 0, 1 time out in seq 40 of PG 3 (a tensor-parallel pair, say); the logs name ranks 0-7 and the world is 8:
    # ranks 2-7 are not members of PG 3, so none is a culprit for logging no timeout: STUCK
    v = diagnose_watchdog([{"rank": r, "seq": 40, "op": "ALLGATHER", "pg": "3", "last_enqueued": 40, "last_completed": 39}
                           for r in (0, 1)], named=list(range(8)), world=8)
    assert v["verdict"] == "incomplete" and v["culprits"] == []


def test_torchs_analyser_blames_the_same_ranks(capsys, tmp_path):
    import subprocess
    import sys

    import pytest

    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")

    def torch_says(d):
        r = subprocess.run([sys.executable, "-W", "ignore", "-m", "torch.distributed.flight_recorder.fr_trace", str(d),
                            "--prefix", "rank_"], capture_output=True, text=True, timeout=120)
        return r.stdout + r.stderr
    # the empty dump of rank 1 (as in test_a_rank_whose_dump_holds_no_entry_never_entered): torch: "missing ranks: {1}"
    d = write_dumps(tmp_path / "empty", {0: [entry(0, 1), entry(1, 2, "started")], 1: [],
                                         2: [entry(0, 1), entry(1, 2, "started")]}, world=3)
    out = torch_says(d)
    assert "Not all ranks joining collective, sequence number: 2" in out and "missing ranks: {1}" in out, out
    assert verdict(capsys, tmp_path, d)["culprits"] == [1]
    # rank 3's dump missing: torch refuses ("Missing dump files from ranks {3}"), tracelens names rank 3
    d = write_dumps(tmp_path / "missing", {r: [entry(0, 1, "started")] for r in range(3)}, world=4)
    assert "Missing dump files from ranks {3}" in torch_says(d)
    assert verdict(capsys, tmp_path, d)["culprits"] == [3]


def coalesced(rid, seq, sizes):
    """The entries of one coalesced collective at ``seq``: an all_reduce per size, then the ``nccl:coalesced`` marker."""
    out = [{**entry(rid + i, seq), "input_sizes": [[n]], "output_sizes": [[n]]} for i, n in enumerate(sizes)]
    return out + [{**entry(rid + len(sizes), seq, name="nccl:coalesced"), "input_sizes": [], "output_sizes": []}]


def test_a_coalesced_group_is_compared_whole(capsys, tmp_path):
    # 3 ranks, seq 1 a plain all_reduce, seq 2 coalesced all_reduces of 10 and 20 elements; rank 2's second one is of
    # 30: a mismatch at seq 2 that its first call (10 everywhere) hides (before: "consistent")
    per = {r: [entry(0, 1)] + coalesced(1, 2, [10, 20 if r < 2 else 30]) for r in range(3)}
    v = verdict(capsys, tmp_path, write_dumps(tmp_path / "odd", per, world=3))
    assert v["verdict"] == "mismatch" and v["culprits"] == [2], v["summary"]
    assert v["first_mismatch"]["seq"] == 2 and v["first_mismatch"]["fields"] == ["coalesced calls"]
    assert "nccl:all_reduce (first of 3 coalesced) count 10 Float" in v["summary"]
    # the same calls on every rank: consistent
    per = {r: [entry(0, 1)] + coalesced(1, 2, [10, 20]) for r in range(3)}
    assert verdict(capsys, tmp_path, write_dumps(tmp_path / "same", per, world=3))["verdict"] == "ok"


def test_a_jobs_output_whose_watchdog_lines_come_last(capsys, tmp_path):
    from parsers import TAIL_BYTES, sniff
    from tracelens.model.errors import EXIT_BAD_INPUT

    # a torchrun rank's stderr: 20000 lines of the program's own ("[rank1]: step ..."; ~0.7 MB, far past the 4 KB sniff reads
    # first), then rank 1's watchdog timeout in seq 1580 (after 600060 ms) and its status (last completed 1579); before:
    # taken for Kineto JSON by its leading "[", "invalid JSON"; now an NCCL log, STUCK in seq 1580
    lines = [f"[rank1]: step {i} loss 2.{i % 10} lr 1e-4" for i in range(20000)]
    lines += [TIMEOUT.format(r=1, s=1580)[3:], STATUS.format(r=1, s=1580, e=1581, c=1579)[3:]]  # without the Slurm "1: "
    f = tmp_path / "stderr.log"
    f.write_text("\n".join(lines) + "\n")
    assert f.stat().st_size > TAIL_BYTES and sniff(f) == "nccl_log"
    v = verdict(capsys, tmp_path, f)
    assert v["verdict"] == "incomplete" and v["watchdog"][0]["seq"] == 1580 and v["watchdog"][0]["last_completed"] == 1579
    # the same output without any NCCL or watchdog line: not a trace (one line, exit 3), as before
    g = tmp_path / "plain.log"
    g.write_text("\n".join(lines[:20000]) + "\n")
    code, err, _ = report(capsys, tmp_path, g)
    assert code == EXIT_BAD_INPUT and "not a trace" in err[-1]
    # the same two outputs gzipped (a job's log archived as stderr.log.gz): the watchdog lines are read past the head by
    # inflating the file as a stream (parsers._gzip_mentions_nccl); before, a gzip file was only head-sniffed: "not a trace"
    import gzip

    fz = tmp_path / "gz" / "stderr.log.gz"
    fz.parent.mkdir()
    fz.write_bytes(gzip.compress(f.read_bytes()))
    assert sniff(fz) == "nccl_log"
    vz = verdict(capsys, tmp_path, fz)
    assert vz["verdict"] == v["verdict"] and [{**w, "path": None} for w in vz["watchdog"]] == [{**w, "path": None} for w in v["watchdog"]]
    gz = tmp_path / "gz" / "plain.log.gz"
    gz.write_bytes(gzip.compress(g.read_bytes()))
    code, err, _ = report(capsys, tmp_path, gz)
    assert code == EXIT_BAD_INPUT and "not a trace" in err[-1]


def test_the_dump_signal_line_of_a_rank_that_did_not_time_out(capsys, tmp_path):
    # torch 2.4+ lines: ranks 0, 1, 3 "Timeout at NCCL work: 1261" in PG 0 (last enqueued 1261, completed 1260); rank 2
    # did not time out, its dump signal line says "Last enqueued NCCL work: 1260": it never enqueued 1261, the culprit;
    # rank 4 only ever printed "-1" (no work): behind too
    def timeout(r):
        return (f"[rank{r}]:[E804 23:05:54.816499929 ProcessGroupNCCL.cpp:1709] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Timeout at "
                f"NCCL work: 1261, last enqueued NCCL work: 1261, last completed NCCL work: 1260.")

    def signal(r, e, c):
        return (f"[rank{r}]:[E804 23:05:54.817424543 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Received a "
                f"dump signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. Last "
                f"enqueued NCCL work: {e}, last completed NCCL work: {c}.This is most likely caused by incorrect usages")
    f = tmp_path / "job.out"
    f.write_text("\n".join([timeout(0), signal(2, 1260, 1260), timeout(1), timeout(3), signal(4, -1, -1)]) + "\n")
    v = verdict(capsys, tmp_path, f)
    assert v["verdict"] == "hang" and v["culprits"] == [2, 4], v["summary"]
    assert "ranks 0, 1, 3 timed out in seq 1261 of group 0; rank 2 had enqueued only up to seq 1260: it never entered it" in v["summary"]


def test_a_rank_whose_records_end_before_the_others_begin(capsys, tmp_path):
    # ranks 0, 1, 3 hold seqs 100-105 (105 started: their ring buffers wrapped); rank 2's dump holds 1-5 (another run's,
    # or a rank stuck far behind). Before: "rank 2 never entered seq 6, which ranks 0, 1, 3 entered" (none holds 6);
    # now it says where the records stop and points at the warnings on runs mixed together
    per = {r: [entry(1000 + s, s, "completed" if s < 105 else "started") for s in range(100, 106)] for r in (0, 1, 3)}
    per[2] = [entry(s, s) for s in range(1, 6)]
    v = verdict(capsys, tmp_path, write_dumps(tmp_path / "mixed", per, world=4))
    assert v["verdict"] == "hang" and v["culprits"] == [2]
    assert ("rank 2 stopped at seq 5, before the others' first recorded seq (100; ranks 0, 1, 3 reached seq 105): a rank far "
            "behind, or a dump of another run") in v["summary"] and "which ranks 0, 1, 3 entered" not in v["summary"]


def test_a_peer_whose_dump_holds_only_collectives_is_in_the_inputs(capsys, tmp_path):
    # no pg_config (gloo's dumps leave it empty); rank 0 in "send 0->1" (started); rank 1's dump holds one all_reduce and
    # no send/recv: it is in the inputs and never posted the recv (before this fix it was said to have left no dump)
    d = tmp_path / "nocfg"
    d.mkdir()
    per = {0: [entry(0, 1), p2p(1, "nccl:send 0->1", 1, "started")], 1: [entry(0, 1)]}
    for r, es in per.items():
        (d / f"rank_{r}").write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": es}))
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [1] and v["p2p_open"][0]["kind"] == "never_posted", v["summary"]
    # rank 1's dump absent: "missing", rank 1 named
    (d / "rank_1").unlink()
    v = verdict(capsys, tmp_path, d)
    assert v["p2p_open"][0]["kind"] == "missing" and v["culprits"] == [1], v["summary"]


def test_one_group_name_of_several_groups_is_told_apart(capsys, tmp_path):
    # split_group / a DeviceMesh: every rank's tensor-parallel group is named "1", ranks [0, 1] one group, [2, 3]
    # another. Ranks 0, 1 ran 3 collectives in theirs, ranks 2, 3 ran 5 in theirs, all completed: consistent (before:
    # one group "1" of 4 members, "ranks 0, 1 never entered seq 4", a false hang)
    d = tmp_path / "tp"
    d.mkdir()
    for r in range(4):
        tp = [0, 1] if r < 2 else [2, 3]
        cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}, "1": {"name": "1", "desc": "tp", "ranks": str(tp)}}
        es = [entry(0, 1)] + [entry(1 + i, i + 1, pg=("1", "tp")) for i in range(3 if r < 2 else 5)]
        (d / f"rank_{r}").write_bytes(pickle.dumps({"version": "2.10", "pg_config": cfg, "pg_status": {}, "entries": es}))
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "ok" and v["groups_checked"] == 3, v["summary"]
    # rank 3 stops at seq 4 of its group [2, 3]: the hang is that group's, rank 3 the culprit
    es = [entry(0, 1)] + [entry(1 + i, i + 1, pg=("1", "tp"), state="completed" if i < 3 else "started") for i in range(4)]
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}, "1": {"name": "1", "desc": "tp", "ranks": "[2, 3]"}}
    (d / "rank_3").write_bytes(pickle.dumps({"version": "2.10", "pg_config": cfg, "pg_status": {}, "entries": es[:4]}))
    (d / "rank_2").write_bytes(pickle.dumps({"version": "2.10", "pg_config": cfg, "pg_status": {}, "entries": es}))
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [3] and "group 1 [2, 3] (tp): rank 3 never entered seq 4" in v["summary"]


def test_a_collective_every_rank_entered_that_one_never_started(capsys, tmp_path):
    # 3 ranks completed seq 1-2 and entered seq 3: ranks 0, 1 "started" it (kernel running, waiting), rank 2's is only
    # "scheduled" (its GPU never began it): STUCK, rank 2 the likely culprit (before: no culprit)
    per = {r: [entry(0, 1), entry(1, 2), entry(2, 3, "started" if r < 2 else "scheduled")] for r in range(3)}
    v = verdict(capsys, tmp_path, write_dumps(tmp_path / "sched", per, world=3))
    assert v["verdict"] == "incomplete" and v["culprits"] == [2], v["summary"]
    assert "ranks 0, 1 started it (waiting for a peer), rank 2 only scheduled it" in v["summary"]
    # all only scheduled (no start times recorded): nothing tells them apart, no culprit
    per = {r: [entry(0, 1), entry(1, 2), entry(2, 3, "scheduled")] for r in range(3)}
    v = verdict(capsys, tmp_path, write_dumps(tmp_path / "all", per, world=3))
    assert v["verdict"] == "incomplete" and v["culprits"] == []


def test_collective_lines_that_agree_and_a_watchdog_timeout(capsys, tmp_path):
    from tests.test_nccl_log import rank_lines

    # NCCL_DEBUG_SUBSYS=COLL: 4 ranks' logs (Slurm prefixes), each enqueued AllReduce opCount 0-3 alike (the lines agree:
    # "consistent" before); then every rank's watchdog timed out in seq 1580 of PG 0: the job hung inside that
    # collective all the same, STUCK (the lines' agreement said with it)
    lines = [f"{r}: {ln}" for r in range(4) for ln in rank_lines(r, 4, ops=4)]
    lines += [TIMEOUT.format(r=r, s=1580) for r in range(4)] + [STATUS.format(r=r, s=1580, e=1580, c=1579) for r in range(4)]
    f = tmp_path / "job.log"
    f.write_text("\n".join(lines) + "\n")
    v = verdict(capsys, tmp_path, f)
    assert v["verdict"] == "incomplete" and v["culprits"] == [], v["summary"]
    assert v["summary"].startswith("STUCK: PyTorch's watchdog: ranks 0, 1, 2, 3 timed out in seq 1580 (ALLREDUCE) of group 0")
    assert "(the logs' collective lines are consistent: 1 group(s)" in v["summary"]


def test_a_fifo_beside_the_dumps_is_not_read(capsys, tmp_path):
    import os

    import pytest

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    # torch's dump trigger pipe ("<prefix><rank>.pipe", a FIFO) beside 2 dumps (rank 1 behind at seq 2): before, the
    # first read of it blocked forever; now it is not a file of the job, the verdict is the dumps'
    d = write_dumps(tmp_path / "fifo", {0: [entry(0, 1), entry(1, 2, "started")], 1: [entry(0, 1)]}, world=2)
    os.mkfifo(d / "nccl_trace_rank_0.pipe")
    v = verdict(capsys, tmp_path, d)
    assert v["verdict"] == "hang" and v["culprits"] == [1]


def test_the_second_nodes_log_with_torchruns_local_rank_prefixes(capsys, tmp_path):
    from tests.test_nccl_log import rank_lines

    # node 2 of an 8-rank job: torchrun's "[default0]:".."[default3]:" (local ranks) before global ranks 4-7's NCCL init
    # lines (no COLL lines), then ranks 4-7 all time out in seq 1580 of PG 0. Local ranks 0-3 are not "ranks that logged
    # no timeout"; the world (8) says ranks 0-3's logs are not in the inputs: STUCK, no culprit
    lines = [f"[default{r - 4}]:{ln}" for r in range(4, 8) for ln in rank_lines(r, 8, ops=0)]
    lines += [TIMEOUT.format(r=r, s=1580)[3:] for r in range(4, 8)]
    f = tmp_path / "node2.log"
    f.write_text("\n".join(lines) + "\n")
    v = verdict(capsys, tmp_path, f)
    assert v["verdict"] == "incomplete" and v["culprits"] == [], v["summary"]
    assert "ranks 4, 5, 6, 7 timed out in seq 1580" in v["summary"] and "the logs hold 4 of the job's 8 ranks" in v["summary"]
