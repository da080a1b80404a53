"""The autograd hand-off in the critical path: Kineto's ``fwdbwd`` flows (forward op -> its
backward node) kept by the parser on the ops' args and followed as edges; on a real CPU recording
(torch runs backward on the calling thread there) what torch records and that the path is what it
was without the flows."""

from __future__ import annotations

import json

import polars as pl

from tracelens.analysis import Options, analyze
from tracelens.store.job import load

ON = Options(critical_path=True)


def X(name, ts, dur, tid, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def flow(ph, ts, tid, fid=1):
    e = {"ph": ph, "cat": "fwdbwd", "name": "fwdbwd", "id": fid, "pid": 1, "tid": tid, "ts": ts}
    return {**e, "bp": "e"} if ph == "f" else e


def _report(tmp_path, events, name="rank-0.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events}))
    return analyze(load([p], use_cache=False), ON).to_dict()


def _events(with_flow: bool):
    # The step thread (1): op A [0, 100], op C [800, 900] µs, in ProfilerStep#1 [0, 1000].  A
    # backward node B [500, 700] on thread 2 (an autograd thread: it runs evaluate_function), a
    # forward op F [300, 450] on thread 3, and the fwdbwd flow F -> B.
    ev = [X("ProfilerStep#1", 0, 1000, 1, cat="user_annotation"), X("aten::a", 0, 100, 1), X("aten::c", 800, 100, 1),
          X("autograd::engine::evaluate_function: MulBackward0", 500, 200, 2), X("aten::mul", 300, 150, 3)]
    return ev + ([flow("s", 300, 3), flow("f", 500, 2)] if with_flow else [])


def test_a_fwdbwd_flow_is_an_edge(tmp_path):
    # With the flow: C's start (800) waits for B's end (700: the step thread idle after A, the
    # autograd hand-off), B's start (500) for F's end (450: the flow; the hand-off from the step
    # thread offers only A's end, 100), F's start has no dependency.  Path: idle [0, 300], F 150,
    # flow gap 50, B 200, hand-off 100, C 100 (cpu 600), idle tail [900, 1000] 100: idle 400.
    # Without it: B's start waits for A's end: A 100, gap 400, B 200, 100, C 100 (cpu 900), idle 100.
    d = _report(tmp_path, _events(True))
    (step,) = d["ranks"][0]["critical_path"]["steps"]
    assert step["by_category_ns"] == {"cpu": 600_000, "idle": 400_000}
    assert {e["name"] for e in step["top_events"]} >= {"aten::mul", "autograd::engine::evaluate_function: MulBackward0"}
    d = _report(tmp_path, _events(False))
    (step,) = d["ranks"][0]["critical_path"]["steps"]
    assert step["by_category_ns"] == {"cpu": 900_000, "idle": 100_000}


def test_the_parser_keeps_the_flows_on_their_ops(ddp_traces):
    raw = json.loads(ddp_traces[0].read_text())["traceEvents"]
    xs = {(e["pid"], e["tid"], e["ts"]): e for e in raw if e.get("ph") == "X"}
    flows = [e for e in raw if e.get("cat") == "fwdbwd" and e.get("ph") in ("s", "f")]
    assert flows, "torch 2.13 records fwdbwd flows on the CPU"
    df = load(ddp_traces[:1], use_cache=False).handles[0].read()
    for ph in "sf":
        got = df.filter(pl.col("args").str.contains(f'"fwdbwd_{ph}":', literal=True)).select(
            "name", pl.col("args").str.extract(f'"fwdbwd_{ph}":(\\d+)').cast(pl.Int64).alias("id"))
        # every flow end of the raw file, on an op starting at its time on its thread
        want = sorted(e["id"] for e in flows if e["ph"] == ph)
        assert sorted(got.get_column("id").to_list()) == want
        for e in flows:
            if e["ph"] == ph:
                assert (e["pid"], e["tid"], e["ts"]) in xs
    # what torch records on the CPU: backward runs on the calling thread, every flow on one thread
    assert len({e["tid"] for e in flows}) == 1


def test_on_the_cpu_the_flows_change_no_path(ddp_traces, tmp_path):
    # (on one thread a backward node's start always comes after the forward op's end through the
    # thread's own order: the flow edges never arrive last)
    with_flows = analyze(load(ddp_traces, use_cache=False, jobs=1), ON).to_dict()
    stripped = []
    for p in ddp_traces:
        doc = json.loads(p.read_text())
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "fwdbwd"]
        q = tmp_path / p.name
        q.write_text(json.dumps(doc))
        stripped.append(q)
    without = analyze(load(stripped, use_cache=False, jobs=1), ON).to_dict()
    for a, b in zip(with_flows["ranks"], without["ranks"]):
        assert a["critical_path"]["steps"] == b["critical_path"]["steps"]
