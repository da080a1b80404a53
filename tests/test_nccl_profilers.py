"""The NCCL profiler plugin, Inspector and nccl-tests parsers (FORMATS.md 3, 4): numbers held to
plain Python over the raw files and to the bandwidth formulas of FORMATS 4.2, recomputed here."""

from __future__ import annotations

import json
import re

import pytest
from tracelens.parsers import collective_parser_for, sniff

from tests.conftest import real_traces
from tracelens import cli

NCCL = real_traces() / "nccl"


def _read(path):
    return collective_parser_for(sniff(path)).read(path)


def _factor(coll, n):  # FORMATS 4.2, written out again
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "reducescatter": (n - 1) / n, "broadcast": 1.0}[coll]


@pytest.mark.parametrize("path", sorted((NCCL / "nccl-tests").glob("*.txt")), ids=lambda p: p.name[:24])
def test_nccl_tests_real_tables_rows_and_formula(path):
    p = _read(path)
    assert p.format == "nccl_tests" and p.bandwidth.height and p.facts["unknown_lines"] == 0
    # plain Python: a data row is a line holding " float " (all three samples are float tables)
    raw = [re.sub(r"\[\d+\]", " ", ln).split() for ln in path.read_text().splitlines() if " float " in ln]
    assert p.bandwidth.height == 2 * len(raw)
    out = p.bandwidth.filter(~p.bandwidth["in_place"])
    assert out["bytes"].to_list() == [int(r[0]) for r in raw]
    assert out["time_us"].to_list() == [float(r[-8]) for r in raw]
    assert p.bandwidth.filter(p.bandwidth["in_place"])["busbw_gbps"].to_list() == [float(r[-2]) for r in raw]
    for row in p.bandwidth.filter(p.bandwidth["algbw_gbps"] >= 1).to_dicts():
        # algbw = bytes / time (GB/s = B / (us * 1e3)); busbw = algbw x 2(n-1)/n; printed to 2 decimals
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3, abs=0.006)
        if p.facts["nranks"]:
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * _factor("allreduce", p.facts["nranks"]), abs=0.02)


def test_nccl_tests_variants():
    t = {x.name[:14]: _read(x) for x in (NCCL / "nccl-tests").glob("*.txt")}
    interleaved = t["nccl-issue1453"]
    # 1.24 / 0.64 is too coarse, but 12.91 / 6.74 = 1.9154 ~ 2 x 23/24 = 1.9167: 24 ranks
    assert interleaved.facts["nranks"] == 24 and interleaved.bandwidth["root"].unique().to_list() == [-1]
    old = t["nccl-issue392_"]  # no root column, the float error column: wrong is null
    assert old.facts["error_column"] and old.bandwidth["wrong"].null_count() == old.bandwidth.height
    assert old.bandwidth["root"].null_count() == old.bandwidth.height and old.bandwidth["redop"][0] == "sum"
    mm = t["nccl-tests-iss"]
    assert mm.bandwidth["redop"].unique(maintain_order=True).to_list() == ["max", "min"] and mm.facts["nranks"] == 16
    assert mm.bandwidth["wrong"].to_list() == [0] * mm.bandwidth.height


def test_nccl_tests_header_footer_and_bad_lines(tmp_path):
    f = tmp_path / "out.txt"
    # 2 ranks: allgather factor (2-1)/2 = 0.5; size 1048576 B in 100 us -> algbw 10.49, busbw 5.24
    f.write_text("# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20\n"
                 "# Collective test starting: all_gather_perf\n"
                 "#  Rank  0 Group  0 Pid 11 on h1 device  0 [0x07] NVIDIA H100\n"
                 "#  Rank  1 Group  0 Pid 12 on h1 device  1 [0x08] NVIDIA H100\n"
                 "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
                 "h1:11:11 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 7000 - Init COMPLETE\n"
                 "     1048576        131072     float    none      -1    100.0   10.49    5.24      0    99.00   10.59    5.30    N/A\n"
                 "garbage \x1b[31m line\n"
                 "# Avg bus bandwidth    : 5.27\n"
                 "     2097152        262144     fl")  # cut tail
    p = _read(f)
    assert p.facts["nranks"] == 2 and p.facts["nranks_source"] == "header" and p.facts["avg_busbw_gbps"] == 5.27
    assert p.facts["test"] == "all_gather_perf" and p.facts["nccl_lines"] == 1 and p.facts["unknown_lines"] == 2
    b = p.bandwidth.to_dicts()
    assert [(r["collective"], r["nranks"], r["in_place"], r["wrong"]) for r in b] == [
        ("allgather", 2, False, 0), ("allgather", 2, True, None)]
    assert b[0]["busbw_gbps"] == pytest.approx(b[0]["algbw_gbps"] * _factor("allgather", 2), abs=0.006)
    assert any("2 line(s)" in w for w in p.warnings)


def test_inspector_real_record_formula():
    path = next((NCCL / "inspector").glob("*.jsonl"))
    rec = json.loads(path.read_text().splitlines()[0])["coll_perf"]
    p = _read(path)
    assert p.format == "nccl_inspector"
    r = p.rows.row(0, named=True)
    assert (r["collective"], r["seq"], r["rank"], r["group_size"], r["bytes"]) == ("allreduce", 8995, 1, 3, 2360832)
    assert r["dur_ns"] == 5663000 and r["group"] == "0xad56c683b0c4ef"
    # 2360832 B / 5663 us = 0.416887 GB/s; x 2(3-1)/3 = 0.555850
    assert r["algbw_gbps"] == rec["coll_algobw_gbs"] == pytest.approx(2360832 / 5663 / 1e3, abs=1e-6)
    assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * _factor("allreduce", 3), abs=1e-6)
    assert p.bandwidth.row(0, named=True)["busbw_gbps"] == rec["coll_busbw_gbs"]


def test_inspector_p2p_unknown_and_cut(tmp_path):
    f = tmp_path / "h-pid1.log"
    f.write_text('{"header":{"id":"0x1","rank":0,"n_ranks":4},"metadata":{"inspector_output_format_version":"v5.0"},'
                 '"coll_perf":{"coll":"AllGather","coll_sn":3,"coll_msg_size_bytes":1000,"coll_exec_time_us":10,'
                 '"coll_timing_source":"kernel_gpu","coll_algobw_gbs":0.4,"coll_busbw_gbs":0.3,"new_key":[1,2]}}\n'
                 '{"header":{"id":"0x1","rank":0,"n_ranks":4},"p2p_perf":{"p2p":"Send","p2p_sn":7,"p2p_peer":2,'
                 '"p2p_msg_size_bytes":64,"p2p_exec_time_us":2}}\n'
                 '{"header":{"id":"0x1"},"dump_stats":{"dropped":0}}\n'
                 '{"header":{"id":"0x1","rank":0,"n_ranks":4},"coll_perf":{"coll":"AllRed')
    p = _read(f)
    rows = p.rows.select("collective", "seq", "bytes", "root", "p2p_seq").rows()
    assert rows == [("allgather", 3, 4000, None, None), ("send", 7, 64, 2, 7)]  # AllGather: 1000 B per rank x 4
    assert p.facts["other_records"] == 1 and p.facts["bad_lines"] == 1 and len(p.warnings) == 2


def test_profiler_plugin_real_trace_pairs():
    path = next((NCCL / "profiler_plugin").glob("*.txt"))
    p = _read(path)
    assert p.format == "nccl_profiler" and p.facts["bad_lines"] == 0
    # plain Python: P2P begin/end lines by (name, id), quoting the unquoted values first
    ev = [json.loads(re.sub(r'(:\s*)(ncclFloat32|0x[0-9a-f]+)', r'\1"\2"', ln.rstrip(",")))
          for ln in path.read_text().splitlines() if '"cat": "P2P"' in ln]
    begin = {(e["name"], e["id"]): e for e in ev if e["ph"] == "b"}
    end = {(e["name"], e["id"]): e for e in ev if e["ph"] == "e"}
    want = sorted((begin[k]["args"]["Rank"], k[0], begin[k]["args"]["Peer"], round((end[k]["ts"] - begin[k]["ts"]) * 1000))
                  for k in begin)
    got = sorted(p.rows.select("rank", "op_name", "root", "dur_ns").rows())
    assert got == want and len(got) == 8
    assert set(p.rows["bytes"]) == {268435456 * 4} and set(p.rows["channels"]) == {16}
    assert p.rows["state"].unique().to_list() == ["completed"]


def test_profiler_plugin_coll_and_cut_tail(tmp_path):
    f = tmp_path / "prof_1_0.json"
    f.write_text('[\n{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "pid": 9, "tid": 1, "ts": 10.5, "args": '
                 '{"SeqNum": 4, "CommHash": 77, "Rank": 1, "Count": 1024, "Datatype": ncclBfloat16, "Algorithm": "RING", '
                 '"Protocol": "LL128", "nChannels": 2}},\n'
                 '{"name": "KernelCh", "cat": "GPU", "ph": "b", "id": 0, "pid": 9, "tid": 1, "ts": 11, "args": {"Channel": 0}},\n'
                 '{"name": "KernelCh", "cat": "GPU", "ph": "b", "id": 1, "pid": 9, "tid": 1, "ts": 11, "args": {"Channel": 1}},\n'
                 '{"name": "ProgressSend", "cat": "PROXY", "ph": "b", "id": 0, "pid": 9, "tid": 1, "ts": 12, "args": {"Channel": 0, "Peer": 0, "Steps": 8}},\n'
                 '{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, "pid": 9, "tid": 1, "ts": 30.5},\n'
                 '{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": 9, "tid": 1, "ts": 40, "args": {"SeqNum": 5, "Comm')
    p = _read(f)
    r = p.rows.row(0, named=True)
    # 10.5 us -> 10500 ns, 20 us long; 1024 bf16 = 2048 B; 2 KernelCh channels; 8 proxy steps
    assert (r["seq"], r["collective"], r["start_ns"], r["dur_ns"], r["bytes"], r["dtype"]) == (4, "allreduce", 10500, 20000, 2048, "bfloat16")
    assert (r["algo"], r["proto"], r["channels"], r["detail"]) == ("RING", "LL128", 2, "kernel_channels=2 proxy_steps=8 net_events=0")
    assert p.rows.height == 1 and p.facts["bad_lines"] == 1 and any("not whole" in w for w in p.warnings)


def test_standalone_directory_of_every_nccl_tool(capsys, tmp_path):
    import shutil

    import jsonschema

    from tests.test_nccl_report import SCHEMA, report

    d = tmp_path / "nccl"
    for sub in ("nccl-tests", "inspector", "profiler_plugin"):
        shutil.copytree(NCCL / sub, d / sub)
    shutil.copy(next((NCCL / "logs").glob("nccl-issue203*")), d / "rank.log")
    code, err, out = report(capsys, tmp_path, d)
    assert code == 0, err
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    nccl = doc["job"]["nccl"]
    assert {i["format"] for i in nccl["inputs"]} == {"nccl_tests", "nccl_inspector", "nccl_profiler", "nccl_log"}
    # 10 + 8 + 11 nccl-tests rows x (out-of-place, in-place) + 1 Inspector record
    assert nccl["bandwidth_total"] == len(nccl["bandwidth"]) == 2 * (10 + 8 + 11) + 1
    assert set(nccl["bandwidth"][0]) == {"path", "test", "collective", "nranks", "bytes", "count", "dtype", "redop", "root",
                                         "in_place", "time_us", "algbw_gbps", "busbw_gbps", "wrong"}
    text = cli.main(["report", "--no-cache", str(d)])
    assert text == 0 and "measured bandwidth (59 row(s)" in capsys.readouterr().out


def test_bandwidth_tables_alone_say_there_is_nothing_to_align(capsys, tmp_path):
    """nccl-tests tables alone: no per-call sequence, so the verdict says what the inputs are
    (2 x (10 + 8 + 11) = 58 bandwidth rows: out-of-place and in-place), not 'no collective records'."""
    import shutil

    from tests.test_nccl_report import report

    d = tmp_path / "nccl"
    shutil.copytree(NCCL / "nccl-tests", d)
    code, err, out = report(capsys, tmp_path, d)
    assert code == 0, err
    diag = json.loads(out.read_text())["job"]["nccl_diagnosis"]
    assert diag["verdict"] == "no_collectives" and diag["culprits"] == []
    assert diag["summary"].startswith("nothing to align: these inputs hold 58 bandwidth measurement(s)")
