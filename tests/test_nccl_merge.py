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


def _log(ranks, ops=("Broadcast", "Broadcast", "AllReduce", "AllReduce", "AllReduce")):
    # one process per rank, one 2-rank communicator, RING/LL tuning, 2 channels; the calls in the
    # recorded DDP job's order (its two broadcasts at DDP's start, then one all-reduce a step)
    out = []
    for r in ranks:
        h = f"node:{100 + r}:{100 + r} [{r}]"
        out += [f"{h} NCCL INFO comm 0xa{r} rank {r} nranks 2 cudaDev {r} busId {r}000 commId 0xbeef - Init COMPLETE",
                f"{h} NCCL INFO Channel 00/02 : 0 1", f"{h} NCCL INFO Channel 01/02 : 0 1",
                f"{h} NCCL INFO AllReduce: 38440 Bytes -> Algo RING proto LL channel{{Lo..Hi}}={{0..1}}"]
        out += [f"{h} NCCL INFO {op}: opCount {k:x} sendbuff 0x1 recvbuff 0x2 count 9610 datatype 7 op 0 root 0 "
                f"comm 0xa{r} [nranks=2] stream 0x3" for k, op in enumerate(ops)]
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
    assert d["job"]["nccl_diagnosis"]["verdict"] == "ok"
    assert d["job"]["nccl"]["bandwidth_total"] == 6
    flagged = [w for w in d["warnings"] if "above the achievable" in w]
    assert bool(flagged) == (g["busbw_gbps_median"] > want * 1.1)
    assert cli.main(["report", "--no-cache", str(ddp_traces[0].parent), "--nccl", str(nccl)]) == 0
    assert "NCCL RING/LL, 2 channel(s); achievable busbw" in capsys.readouterr().out


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
