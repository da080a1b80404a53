"""``tracelens report TRACES --nccl PATH``: a real CPU recording (gloo, 2 ranks: the session's
ddp_traces) joined with a hand-made nccl-tests table and a hand-made NCCL log whose ranks match."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from tests.test_nccl_report import SCHEMA, report
from tracelens import cli
from tracelens.analysis.nccl_merge import achievable, merge

# all_reduce_perf over 2 ranks: 16384 B at 0.05 GB/s busbw (in-place 0.04: the better one counts),
# 65536 B at 0.20; 1048576 B at 0.60 (out-of-place), so algbw = busbw / (2 x 1/2) = busbw
TABLE = """# nThread 1 nGpus 1 minBytes 16384 maxBytes 1048576 step: 4(factor) warmup iters: 5 iters: 20
# Collective test starting: all_reduce_perf
#  Rank  0 Group  0 Pid 11 on h1 device  0 [0x07] NVIDIA H100
#  Rank  1 Group  0 Pid 12 on h1 device  1 [0x08] NVIDIA H100
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
       16384          4096     float     sum      -1   327.68    0.05    0.05      0   409.60    0.04    0.04      0
       65536         16384     float     sum      -1   327.68    0.20    0.20      0   327.68    0.20    0.20      0
     1048576        262144     float     sum      -1  1747.63    0.60    0.60      0  1747.63    0.60    0.60      0
# Avg bus bandwidth    : 0.28
"""


# the recorded DDP job's calls in its traced steps, in start order on each rank: DDP's bucket rebuild
# broadcasts 5 then 1 int32 (20 B, 4 B), then one 9610-float all-reduce a step (38440 B)
JOB_OPS = ("Broadcast", "Broadcast", "AllReduce", "AllReduce", "AllReduce")
COUNTS = {"Broadcast": (5, 1), "AllReduce": (9610,)}  # elements per call (datatype: int32 = 2, float32 = 7)


def _log(ranks, ops=JOB_OPS, counts=None):
    # one process per rank, one 2-rank communicator, RING/LL tuning, 2 channels; opCount k is the k-th
    # call; ``counts``: (rank, opCount) -> elements, to make one call's size differ
    out = []
    for r in ranks:
        h = f"node:{100 + r}:{100 + r} [{r}]"
        out += [f"{h} NCCL INFO comm 0xa{r} rank {r} nranks 2 cudaDev {r} busId {r}000 commId 0xbeef - Init COMPLETE",
                f"{h} NCCL INFO Channel 00/02 : 0 1", f"{h} NCCL INFO Channel 01/02 : 0 1",
                f"{h} NCCL INFO AllReduce: 38440 Bytes -> Algo RING proto LL channel{{Lo..Hi}}={{0..1}}"]
        seen: dict[str, int] = {}
        for k, op in enumerate(ops):
            i = seen[op] = seen.get(op, -1) + 1
            n = (counts or {}).get((r, k), COUNTS[op][min(i, len(COUNTS[op]) - 1)])
            out.append(f"{h} NCCL INFO {op}: opCount {k:x} sendbuff 0x1 recvbuff 0x2 count {n} datatype {7 if op == 'AllReduce' else 2} "
                       f"op 0 root 0 comm 0xa{r} [nranks=2] stream 0x3")
    return "\n".join(out) + "\n"


def test_achievable_interpolates_in_log_size():
    import polars as pl

    ref = pl.DataFrame({"collective": ["allreduce"] * 2, "nranks": [2, 2], "bytes": [16384, 65536], "busbw_gbps": [0.05, 0.2]},
                       schema_overrides={"nranks": pl.Int32})
    # 32768 B is half way in log size between 16384 and 65536: 0.05 + 0.5 x 0.15 = 0.125
    v, note = achievable(ref, "allreduce", 2, 32768)
    assert v == pytest.approx(0.125) and note.startswith("interpolated in log size between 16384 and 65536")
    assert achievable(ref, "allreduce", 2, 1 << 30) == (0.2, "nearest measured size 65536 B (allreduce, 2 ranks)")
    assert achievable(ref, "allreduce", 8, 32768) is None  # no 8-rank rows and none of unknown ranks: no reference
    assert achievable(ref.with_columns(pl.lit(None, pl.Int32).alias("nranks")), "allreduce", 8, 16384)[0] == 0.05
    assert achievable(ref, "allgather", 2, 32768) is None


def test_merge_real_gloo_job(capsys, tmp_path, ddp_traces):
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    (nccl / "all_reduce_perf.txt").write_text(TABLE)
    (nccl / "ranks.log").write_text(_log([0, 1]))
    code, err, out = report(capsys, tmp_path, ddp_traces[0].parent, "--nccl", nccl)
    assert code == 0, err
    d = json.loads(out.read_text())
    jsonschema.validate(d, SCHEMA)
    g = next(x for x in d["communication"]["by_group"] if x["collective"] == "allreduce")
    size = g["bytes"] / g["count"]
    # independent: best busbw at each size, linear in log size between the two around the call's mean size
    pts = [(16384, 0.05), (65536, 0.20), (1048576, 0.60)]
    lo, hi = next((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= size <= b[0])
    want = lo[1] + (math.log(size) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0])) * (hi[1] - lo[1])
    assert g["achievable_busbw_gbps"] == pytest.approx(want) and "interpolated in log size" in g["achievable_note"]
    assert g["busbw_efficiency"] == pytest.approx(g["busbw_gbps_median"] / want)
    assert (g["nccl_algo"], g["nccl_proto"], g["nccl_channels"], g["nccl_communicator"]) == ("RING", "LL", 2, "0xbeef")
    assert g["nccl_sequence"] == "the job's sequence found in the NCCL records on 2 rank(s)"
    # the log holds exactly the job's 5 calls a rank: offset 0, each of the 3 all-reduces x 2 ranks paired, sizes equal
    assert (g["nccl_pairing"], g["nccl_paired_calls"], g["nccl_mismatched_calls"]) == (
        "by position in the communicator's sequence at offset 0", 6, 0)
    b = next(x for x in d["communication"]["by_group"] if x["collective"] == "broadcast")
    assert (b["nccl_paired_calls"], b["nccl_mismatched_calls"]) == (4, 0)
    # every slowest item's rank: the job's i-th all-reduce (its derived seq i) is opCount 2 + i, broadcast i is opCount i
    for s in d["communication"]["slowest"]:
        assert [r["nccl_seq"] for r in s["ranks"]] == [s["seq"] + (2 if s["collective"] == "allreduce" else 0)] * 2
    assert d["job"]["nccl_diagnosis"]["verdict"] == "ok"
    assert d["job"]["nccl"]["bandwidth_total"] == 6
    flagged = [w for w in d["warnings"] if "above the achievable" in w]
    assert bool(flagged) == (g["busbw_gbps_median"] > want * 1.1)
    assert cli.main(["report", "--no-cache", str(ddp_traces[0].parent), "--nccl", str(nccl)]) == 0
    text = capsys.readouterr().out
    assert "NCCL RING/LL, 2 channel(s); achievable busbw" in text
    assert "6 rank-call(s) paired with NCCL records by position in the communicator's sequence at offset 0" in text


def test_merge_flags_busbw_above_achievable(tmp_path, ddp_traces):
    from tracelens.api import analyze, open_job
    from tracelens.model.options import Options

    t = tmp_path / "all_reduce_perf.txt"  # a reference far below anything gloo measures: 1e-6 GB/s at every size
    t.write_text(TABLE.replace("0.05", "0.00").replace("0.04", "0.00").replace("0.20", "0.00").replace("0.60", "0.00")
                 .replace("    0.00      0\n", "    0.000001      0\n"))
    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(t),)))).to_dict()
    g = next(x for x in d["communication"]["by_group"] if x["collective"] == "allreduce")
    assert g["achievable_busbw_gbps"] == 1e-6 and g["busbw_efficiency"] > 1.1
    assert sum("above the achievable" in w and "not a fact" in w for w in d["warnings"]) >= 1


def test_merge_ranks_that_do_not_match(tmp_path, ddp_traces):
    from tracelens.api import analyze, open_job
    from tracelens.model.options import Options

    nccl = tmp_path / "other.log"
    nccl.write_text(_log([5, 6]))  # ranks 5 and 6: not in the job
    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(nccl),)))).to_dict()
    assert any("2 rank(s)" not in w and "rank(s) [5, 6] that the job does not hold" in w for w in d["warnings"])
    assert all("nccl_algo" not in g and "achievable_busbw_gbps" not in g for g in d["communication"]["by_group"])
    assert merge(d, [str(tmp_path / "nothing")])["warnings"][-1].endswith("(nothing joined)")
    # ranks that match, but calls in another order than the job's: not joined, said
    (tmp_path / "order.log").write_text(_log([0, 1], ops=("AllReduce", "Broadcast", "AllReduce", "Broadcast", "AllReduce")))
    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(tmp_path / "order.log"),)))).to_dict()
    assert all("nccl_algo" not in g for g in d["communication"]["by_group"])
    assert any("do not occur in that order" in w and "not joined" in w for w in d["warnings"])


def _merged(tmp_path, ddp_traces, name, log):
    from tracelens.api import analyze, open_job
    from tracelens.model.options import Options

    (tmp_path / name).write_text(log)
    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(tmp_path / name),)))).to_dict()
    jsonschema.validate(d, SCHEMA)
    return d, {x["collective"]: x for x in d["communication"]["by_group"]}


def test_pairing_by_position_offset_repeat_and_size(tmp_path, ddp_traces):
    # two all-reduces before the traced steps (the profiler's warm-up): the job's 5 calls are opCounts
    # 2..6, offset 2; its i-th all-reduce is opCount 2 + 2 + i, its i-th broadcast opCount 2 + i
    d, g = _merged(tmp_path, ddp_traces, "late.log", _log([0, 1], ops=("AllReduce", "AllReduce", *JOB_OPS)))
    assert g["allreduce"]["nccl_pairing"] == "by position in the communicator's sequence at offset 2"
    assert (g["allreduce"]["nccl_paired_calls"], g["broadcast"]["nccl_paired_calls"]) == (6, 4)
    for s in d["communication"]["slowest"]:
        assert [r["nccl_seq"] for r in s["ranks"]] == [s["seq"] + (4 if s["collective"] == "allreduce" else 2)] * 2
    # the 5 calls twice over: the run occurs at offsets 0 and 5, so no call is paired (said), and the
    # communicator's own facts (the log's tuning and channel lines) still join
    d, g = _merged(tmp_path, ddp_traces, "twice.log", _log([0, 1], ops=JOB_OPS * 2))
    for x in g.values():
        assert x["nccl_paired_calls"] == 0 and x["nccl_pairing"].startswith("not paired: rank 0's 5 collective(s) occur at several offsets")
        assert "(0, 5, ...: a repeated pattern" in x["nccl_pairing"] and x["nccl_channels"] == 2
    assert g["allreduce"]["nccl_algo"] == "RING"  # the log tunes its all-reduces only
    assert all("nccl_seq" not in r for s in d["communication"]["slowest"] for r in s["ranks"])
    # rank 1's opCount 3 (its second all-reduce, seq 1) reduces 4805 floats, half the job's 38440 B: paired
    # (by position), counted, warned
    d, g = _merged(tmp_path, ddp_traces, "size.log", _log([0, 1], counts={(1, 3): 4805}))
    assert (g["allreduce"]["nccl_paired_calls"], g["allreduce"]["nccl_mismatched_calls"], g["broadcast"]["nccl_mismatched_calls"]) == (6, 1, 0)
    warned = [w for w in d["warnings"] if "differ in collective or size" in w]
    assert len(warned) == 1 and "1 of 6 call(s)" in warned[0] and "rank 1 seq 1: the job's allreduce 38440 B, NCCL's record 3 allreduce 19220 B" in warned[0]


def test_pair_tiny_frames():
    """_pair and _summary on hand-built rows: the exact (rank, seq) join, the positional one, and the
    plugin's per-call values taken from the paired records only."""
    import polars as pl

    from tracelens.analysis.nccl_merge import _pair, _summary, _with_sizes

    # the job: rank 0 calls A(seq 7) B(seq 8) A(seq 9), 100 B each, trace seqs (not derived)
    job = pl.DataFrame({"rank": [0, 0, 0], "group": ["g"] * 3, "seq": [7, 8, 9], "collective": ["allreduce", "broadcast", "allreduce"],
                        "bytes": [100, 100, 100], "group_size": [2] * 3, "start_ns": [10, 20, 30], "derived": [False] * 3},
                       schema_overrides={"rank": pl.Int32, "group_size": pl.Int32})
    # the records: opCounts 0..4 = A A B A B; algo RING except opCount 1 TREE, opCount 4 NVLS; 100 B except opCount 3 (200 B)
    recs = _with_sizes(pl.DataFrame({
        "rank": [0] * 5, "group": ["c"] * 5, "seq": [0, 1, 2, 3, 4], "collective": ["allreduce", "allreduce", "broadcast", "allreduce", "broadcast"],
        "bytes": [100, 100, 100, 200, 100], "group_size": [2] * 5, "source": ["nccl_profiler"] * 5, "dtype": ["float32"] * 5,
        "count": [25] * 5, "out_count": [None] * 5, "state": [None] * 5, "start_ns": [1, 2, 3, 4, 5], "end_ns": [None] * 5,
        "algo": ["RING", "TREE", "RING", "RING", "NVLS"], "proto": ["LL"] * 5, "channels": [2, 4, 2, 2, 8]},
        schema_overrides={"rank": pl.Int32, "group_size": pl.Int32, "out_count": pl.Int64, "state": pl.String, "end_ns": pl.Int64}))
    # by position: "ABA" occurs in "AABAB" once, at 1: the job's calls are opCounts 1, 2, 3
    ok, pairs, note = _pair(job, recs, {0}, "seq", exact=False)
    assert ok and note == "by position in the communicator's sequence at offset 1"
    assert pairs.sort("start_ns")["n_seq"].to_list() == [1, 2, 3]
    warnings: list[str] = []
    out = _summary((ok, pairs, note), {"group": "g", "collective": "allreduce"}, "nccl", warnings)
    # the paired all-reduces are opCounts 1 (TREE, 4 ch, 100 B) and 3 (RING, 2 ch, 200 B: a size mismatch):
    # the mode of {TREE, RING} is both, the first in sort order is RING; of {4, 2}: 2; never NVLS (unpaired)
    assert (out["nccl_paired_calls"], out["nccl_mismatched_calls"], out["nccl_algo"], out["nccl_channels"]) == (2, 1, "RING", 2)
    assert len(warnings) == 1 and "1 of 2 call(s)" in warnings[0]
    # "AB" occurs in "AABAB" at 1 and at 3: refused
    ok, pairs, note = _pair(job.head(2), recs, {0}, "seq", exact=False)
    assert ok and pairs is None and "several offsets among its 5 records (1, 3, ...: a repeated pattern" in note
    # "BB" nowhere: not ok
    assert _pair(job.with_columns(pl.lit("broadcast").alias("collective")).head(2), recs, {0}, "seq", exact=False)[0] is False
    # exact: the records renumbered 7..11 (a Flight Recorder's collective_seq_id): A7 A8 B9 A10 B11 against the
    # job's A7 B8 A9: 3 pairs by number; of the job's all-reduces, 7 is record A7 (same) and 9 record B9 (differs)
    fr = recs.with_columns((pl.col("seq") + 7).alias("seq"), (pl.col("seq") + 7).alias("n_seq"))
    ok, pairs, note = _pair(job, fr, {0}, "order", exact=True)
    assert note == "by process group and sequence number" and pairs.sort("seq")["n_seq"].to_list() == [7, 8, 9]
    warnings.clear()
    out = _summary((ok, pairs, note), {"group": "g", "collective": "allreduce"}, "fr", warnings)
    assert (out["fr_paired_calls"], out["fr_mismatched_calls"], out["fr_states"]) == (2, 1, {})
    assert "rank 0 seq 9: the job's allreduce 100 B, NCCL's record 9 broadcast 100 B" in warnings[0]


def test_flight_recorder_pairs_with_the_same_runs_kineto(capsys, tmp_path, ddp_traces, ddp_fr):
    """The recorded DDP run's Flight Recorder (ddp_fr) joined to its own profiler traces; every pair
    checked against plain Python over the raw Kineto JSON and the raw dumps: the trace's gloo calls
    (no ``Seq`` on the CPU: the job's numbers are derived) are one run of the recorder's entries of
    the default group, found at one offset (its 3 earlier calls and the warm-up step's all-reduce
    come before), each call the same collective with the same elements as its entry."""
    from tracelens.api import analyze, open_job
    from tracelens.model.options import Options

    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(ddp_fr),)))).to_dict()
    jsonschema.validate(d, SCHEMA)
    want_calls: dict[str, int] = {}
    want_seq: dict[tuple, tuple] = {}  # (rank, collective, the job's i-th of that collective) -> (FR seq, state)
    for r, trace in enumerate(ddp_traces):
        calls = sorted((e for e in json.loads(trace.read_text())["traceEvents"]
                        if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")), key=lambda e: e["ts"])
        dump = json.loads((ddp_fr / f"rank_{r}").read_text())
        entries = sorted((e for e in dump["entries"] if e["process_group"][0] == "0"), key=lambda e: e["record_id"])
        done = int(dump["pg_status"]["0"]["last_completed_collective"])
        names = [c["name"] for c in calls]
        theirs = [e["profiling_name"] for e in entries]
        at = [i for i in range(len(theirs) - len(names) + 1) if theirs[i:i + len(names)] == names]
        assert len(names) == 5 and len(at) == 1, (names, theirs)
        nth: dict[str, int] = {}
        for c, e in zip(calls, entries[at[0]:]):
            assert math.prod(c["args"]["Input Dims"][0]) == math.prod(e["input_sizes"][0])
            op = c["name"].removeprefix("gloo:").replace("_", "")
            i = nth[op] = nth.get(op, -1) + 1
            want_calls[op] = want_calls.get(op, 0) + 1
            want_seq[(r, op, i)] = (e["collective_seq_id"], "completed" if e["collective_seq_id"] <= done else e["state"])
        assert all(e["time_discovered_completed_ns"] == 0 for e in entries)  # gloo: the watchdog never stamps one
    got = {g["collective"]: g for g in d["communication"]["by_group"]}
    assert set(got) == set(want_calls)
    for op, n in want_calls.items():
        g = got[op]
        assert g["fr_pairing"] == f"by position in the process group's recorded sequence at offset {at[0]}"
        assert (g["fr_paired_calls"], g["fr_mismatched_calls"], g["fr_dur_ns_median"]) == (n, 0, None)
        assert g["fr_states"] == {s: sum(1 for (_, o, _), (_, st) in want_seq.items() if o == op and st == s)
                                  for s in {st for (_, o, _), (_, st) in want_seq.items() if o == op}}
    checked = 0
    for s in d["communication"]["slowest"]:
        for r in s["ranks"]:
            assert (r["fr_seq"], r["fr_state"]) == want_seq[(r["rank"], s["collective"], s["seq"])]
            checked += 1
    assert checked == 2 * len(d["communication"]["slowest"]) > 0
    assert not [w for w in d["warnings"] if "Flight Recorder" in w or "differ in collective" in w]
    assert cli.main(["report", "--no-cache", str(ddp_traces[0].parent), "--nccl", str(ddp_fr)]) == 0
    n, states = want_calls["allreduce"], got["allreduce"]["fr_states"]
    assert (f"{n} rank-call(s) paired with Flight Recorder entries by position in the process group's recorded sequence "
            f"at offset {at[0]} (" + ", ".join(f"{v} {k}" for k, v in states.items()) + ")") in capsys.readouterr().out
    from tracelens.render.html import render_html

    assert (f"0 allreduce: {n} rank-call(s) paired with Flight Recorder entries by position in the process group&#x27;s "
            f"recorded sequence at offset {at[0]}") in render_html(d).decode()


def test_flight_recorder_of_another_order_is_not_paired(tmp_path, ddp_traces, ddp_fr):
    # the same run's rank-1 dump with its entries' collectives in reverse order (all-gather, broadcast x 2,
    # all-reduce, broadcast x 2, all-reduce x 3, barrier becomes barrier, all-reduce x 3, broadcast x 2,
    # all-reduce, broadcast x 2, all-gather): the trace's broadcast x 2, all-reduce x 3 occur nowhere
    # there in that order: refused, said once
    fr = tmp_path / "fr"
    fr.mkdir()
    (fr / "rank_0").write_bytes((ddp_fr / "rank_0").read_bytes())
    dump = json.loads((ddp_fr / "rank_1").read_text())
    names = [e["profiling_name"] for e in dump["entries"]]
    for e, n in zip(dump["entries"], names[::-1]):
        e["profiling_name"] = n
    (fr / "rank_1").write_text(json.dumps(dump))
    from tracelens.api import analyze, open_job
    from tracelens.model.options import Options

    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(fr),)))).to_dict()
    jsonschema.validate(d, SCHEMA)
    for x in d["communication"]["by_group"]:
        assert x["fr_paired_calls"] == 0 and x["fr_pairing"].startswith("rank 1's 5 collective(s) do not occur in that order")
    assert sum("Flight Recorder: rank 1's" in w and "not paired" in w for w in d["warnings"]) == 1
    assert all("fr_seq" not in r for s in d["communication"]["slowest"] for r in s["ranks"])


def _plugin(rank: int) -> str:
    # the profiler plugin's COLL events of one rank, one 2-rank communicator (CommHash 77): SeqNum 0, 1 two
    # all-reduces before the traced steps (TREE, 4 channels), then the job's five calls (SeqNum 2..6):
    # broadcast 5 and 1 int32, all-reduce 9610 floats RING 2 ch, RING 2 ch, TREE 4 ch
    calls = [("AllReduce", 9610, "ncclFloat32", "TREE", 4), ("AllReduce", 9610, "ncclFloat32", "TREE", 4),
             ("Broadcast", 5, "ncclInt32", "RING", 1), ("Broadcast", 1, "ncclInt32", "RING", 1),
             ("AllReduce", 9610, "ncclFloat32", "RING", 2), ("AllReduce", 9610, "ncclFloat32", "RING", 2),
             ("AllReduce", 9610, "ncclFloat32", "TREE", 4)]
    out = []
    for k, (op, n, dt, algo, ch) in enumerate(calls):
        args = (f'{{"SeqNum": {k}, "CommHash": 77, "Rank": {rank}, "Count": {n}, "Datatype": {dt}, "Algorithm": "{algo}", '
                f'"Protocol": "LL", "nChannels": {ch}}}')
        out += [f'{{"name": "{op}", "cat": "COLL", "ph": "b", "id": {k}, "pid": {9 + rank}, "tid": 1, "ts": {10 * k + 1}, "args": {args}}},',
                f'{{"name": "{op}", "cat": "COLL", "ph": "e", "id": {k}, "pid": {9 + rank}, "tid": 1, "ts": {10 * k + 5}}},']
    return "[\n" + "\n".join(out) + "\n]\n"


def test_plugin_values_from_the_paired_calls_only(tmp_path, ddp_traces):
    from tracelens.api import analyze, open_job
    from tracelens.model.options import Options

    nccl = tmp_path / "plugin"
    nccl.mkdir()
    for r in (0, 1):
        (nccl / f"prof_{9 + r}_{r}.json").write_text(_plugin(r))
    d = analyze(open_job(ddp_traces, options=Options(nccl=(str(nccl),)))).to_dict()
    jsonschema.validate(d, SCHEMA)
    g = {x["collective"]: x for x in d["communication"]["by_group"]}
    # offset 2; the paired all-reduces are RING 2, RING 2, TREE 4 a rank: mode RING, 2 channels (over all
    # five of a rank's all-reduces TREE, 4 would win, 3 to 2)
    assert g["allreduce"]["nccl_pairing"] == "by position in the communicator's sequence at offset 2"
    assert (g["allreduce"]["nccl_paired_calls"], g["allreduce"]["nccl_mismatched_calls"]) == (6, 0)
    assert (g["allreduce"]["nccl_algo"], g["allreduce"]["nccl_proto"], g["allreduce"]["nccl_channels"]) == ("RING", "LL", 2)
    assert (g["broadcast"]["nccl_paired_calls"], g["broadcast"]["nccl_channels"]) == (4, 1)
    # per slowest rank item: all-reduce i is SeqNum 4 + i (i = 2: TREE, 4 channels), broadcast i SeqNum 2 + i
    for s in d["communication"]["slowest"]:
        k = s["seq"] + (4 if s["collective"] == "allreduce" else 2)
        want = ("TREE", 4) if k == 6 else (("RING", 2) if s["collective"] == "allreduce" else ("RING", 1))
        assert [(r["nccl_seq"], r["nccl_algo"], r["nccl_channels"]) for r in s["ranks"]] == [(k, *want)] * 2
