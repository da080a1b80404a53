"""``tracelens export-trace`` (tracelens.export.perfetto): the job as a Chrome/Perfetto trace with its
critical path overlaid.  Every output is held to the Trace Event Format's rules as Perfetto's JSON
importer reads them (``check_trace``), its path slices to the report's critical path, its events to
the raw file (counted in plain Python)."""

from __future__ import annotations

import gzip
import json
import os
from bisect import bisect_right
from collections import Counter, defaultdict
from itertools import accumulate
from pathlib import Path

import pytest

from tests.test_critical import ON, K, L, X, write
from tracelens.analysis import analyze
from tracelens.cli import main
from tracelens.export.perfetto import FLOW_CAT, PATH_THREAD, export_trace
from tracelens.store.job import load

HTA = Path(__file__).parent / "data" / "traces" / "hta"
CONTROL = HTA / "trace_diff" / "control"
TWO_RANKS = HTA / "trace_filter"


def read(p: Path) -> dict:
    raw = p.read_bytes()
    return json.loads(gzip.decompress(raw) if p.name.endswith(".gz") else raw)


def check_trace(d: dict) -> list[dict]:
    """The Trace Event Format rules the export must keep; returns the events."""
    evs = d["traceEvents"]
    assert evs, "no events"
    for e in evs:
        assert {"ph", "pid", "tid", "ts"} <= e.keys(), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and 0 <= e["pid"] < 2**32 and 0 <= e["tid"] < 2**32
        assert isinstance(e["ts"], (int, float))
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            assert isinstance(e["name"], str)
    procs = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"]}
    threads = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"]}
    used = {(e["pid"], e["tid"]) for e in evs if e["ph"] != "M"}
    assert used <= threads, used - threads
    assert {p for p, _ in threads} <= procs
    # flows: one "s" and one "f" per (id, cat, name), the "f" binding to its enclosing slice; each
    # point inside a complete event on its own thread (what the importer binds it to)
    flows: dict[tuple, list[dict]] = defaultdict(list)
    for e in evs:
        if e["ph"] in "sft":
            flows[(e["id"], e["cat"], e["name"])].append(e)
    slices = defaultdict(list)
    for e in evs:
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    covers = {}  # per thread: the slices' starts, sorted, and the latest end among those up to each
    for key, iv in slices.items():
        iv.sort()
        covers[key] = ([a for a, _ in iv], list(accumulate((b for _, b in iv), max)))

    def inside(e: dict) -> bool:  # some slice of its thread holds e's time
        starts, ends = covers.get((e["pid"], e["tid"]), ([], []))
        i = bisect_right(starts, e["ts"] + 1e-6)
        return i > 0 and ends[i - 1] >= e["ts"] - 1e-6
    for key, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], key
        f = next(e for e in pair if e["ph"] == "f")
        assert f["bp"] == "e"
        for e in pair:
            assert inside(e), e
    return evs


def path_slices(evs: list[dict]) -> dict[tuple[int, object], int]:
    """ns of the critical-path slices per (pid, step)."""
    path_tids = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == PATH_THREAD}
    out: Counter = Counter()
    for e in evs:
        if e["ph"] == "X" and (e["pid"], e["tid"]) in path_tids:
            assert e["cat"] == FLOW_CAT
            out[(e["pid"], e["args"]["step"])] += round(e["dur"] * 1000)
    return dict(out)


def test_real_trace_valid_and_path_sums_to_the_report(tmp_path):
    out = tmp_path / "t.json.gz"
    w = export_trace([CONTROL], out)
    evs = check_trace(read(out))
    rep = analyze(load([CONTROL]), ON).to_dict()
    (rank,) = rep["ranks"]
    want = {(1, s["step"]): s["length_ns"] for s in rank["critical_path"]["steps"]}
    assert path_slices(evs) == {k: v for k, v in want.items() if v}
    assert w.flows > 1000 and w.segments > 1000
    # every timed event of the raw file is there once (plain Python over the raw JSON)
    raw = json.loads(gzip.decompress((CONTROL / "control.json.gz").read_bytes()))["traceEvents"]
    n_x = sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") not in ("python_function",))
    got_x = sum(1 for e in evs if e["ph"] == "X" and e["cat"] not in (FLOW_CAT, "what_if"))  # not the export's own tracks
    assert got_x <= n_x and got_x >= 0.95 * n_x, (got_x, n_x)
    # a kernel keeps its ns: ts/dur in µs with three decimals
    k = next(e for e in raw if e.get("cat") == "kernel")
    mine = [e for e in evs if e["ph"] == "X" and e["name"] == k["name"] and e["cat"] == "kernel"]
    durs = sorted(round(e["dur"] * 1000) for e in mine)
    assert round(k["dur"] * 1000) in durs


def test_two_ranks_one_process_each_and_aligned_clocks(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    export_trace([TWO_RANKS], a)
    export_trace([TWO_RANKS], b, align_clocks=True)
    ea, eb = check_trace(read(a)), check_trace(read(b))
    names = {e["pid"]: e["args"]["name"] for e in ea if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == 2 and all(n.startswith("rank ") for n in names.values())
    rep = analyze(load([TWO_RANKS]), ON).to_dict()
    for i, r in enumerate(rep["ranks"]):
        want = {(i + 1, s["step"]): s["length_ns"] for s in r["critical_path"]["steps"] if s["length_ns"]}
        assert {k: v for k, v in path_slices(ea).items() if k[0] == i + 1} == want
    # aligned: rank 2's events move by its offset relative to rank 1's (the origin moves with the earliest)
    off = {i + 1: r["clock_offset_ns"] for i, r in enumerate(rep["ranks"])}

    def first(evs, pid):
        return min(e["ts"] for e in evs if e["pid"] == pid and e["ph"] == "X")
    shift_a = round((first(ea, 2) - first(ea, 1)) * 1000)
    shift_b = round((first(eb, 2) - first(eb, 1)) * 1000)
    assert abs(shift_b - shift_a - (off[2] - off[1])) <= 2


def test_hand_built_path_and_flows(tmp_path):
    # test_critical's CPU-bound step: window [38, 100] µs, path cpu 57 + launch 5.  Its segments:
    # A's tail [38, 40] cpu, B's self [40, 90] cpu, the call [90, 95] launch, B's tail [95, 100] cpu:
    # the events A -> B -> call -> B: three arrows, slices summing to 62 µs.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("cpu_op", "aten::A", 0, 40), L(30, 5, 1), K("sm90_xmma_gemm_a", 38, 2, corr=1),
        X("cpu_op", "aten::B", 40, 60), L(90, 5, 2), K("sm90_xmma_gemm_b", 97, 2, corr=2),
    ]
    p = write(tmp_path, ev)
    out = tmp_path / "o.json"
    w = export_trace([p], out, use_cache=False)
    evs = check_trace(read(out))
    assert path_slices(evs) == {(1, 1): 62_000}
    marks = sorted((e["ts"], e["dur"], e["name"], e["args"]["event"]) for e in evs if e["ph"] == "X" and e["cat"] == FLOW_CAT)
    t0 = marks[0][0]
    assert [(round((t - t0) * 1000), round(d * 1000), n, ev_) for t, d, n, ev_ in marks] == [
        (0, 2_000, "cpu", "aten::A"), (2_000, 50_000, "cpu", "aten::B"), (52_000, 5_000, "launch_overhead", "cudaLaunchKernel"),
        (57_000, 5_000, "cpu", "aten::B")]
    assert w.flows == 3


def test_hostile_names_are_cleaned(tmp_path):
    bad = 'evil\x1b[31m"red"\x1b]0;title\x07\\ \u202eright-to-left\nnewline\ttab\x85'
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), X("cpu_op", bad, 0, 40), L(30, 5, 1), K(bad, 38, 2, corr=1),
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main\x1b[2J"}}]
    out = tmp_path / "o.json"
    export_trace([write(tmp_path, ev)], out, use_cache=False)
    text = out.read_text(encoding="utf-8")
    evs = check_trace(json.loads(text))
    strings = [e.get("name", "") for e in evs] + [e["args"].get("name", "") for e in evs if e["ph"] == "M"] + \
              [str(e.get("args", {}).get("event") or "") for e in evs]
    for s in strings:
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in s), repr(s)
    assert any('"red"' in s and "evil" in s for s in strings)


def test_unwritable_output_one_line_error_and_no_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    rc = main(["export-trace", str(CONTROL), "-o", str(tmp_path / "afile" / "x.json")])
    err = capsys.readouterr().err
    assert rc == 5 and err.count("\n") == 1 and "not a directory" in err
    rc = main(["export-trace", str(CONTROL), "-o", str(tmp_path / "missing" / "x.json")])
    err = capsys.readouterr().err
    assert rc == 5 and err.count("\n") == 1 and not (tmp_path / "missing").exists()
    assert sorted(os.listdir(tmp_path)) == ["afile"]
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if os.access(ro, os.W_OK):
            return  # root writes anywhere: the read-only case cannot be made here
        rc = main(["export-trace", str(CONTROL), "-o", str(ro / "x.json.gz")])
        err = capsys.readouterr().err
        assert rc == 5 and err.count("\n") == 1 and "x.json.gz" in err and "not writable" in err
        assert os.listdir(ro) == []
    finally:
        os.chmod(ro, 0o700)


def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    import tracelens.export.perfetto as pf

    def boom(*a, **k):
        yield b'{"ph":"M"}'
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(pf, "_rank_events", boom)
    with pytest.raises(RuntimeError):
        export_trace([CONTROL], tmp_path / "o.json.gz")
    assert os.listdir(tmp_path) == []


def test_cli_writes_and_reports(tmp_path, capsys):
    out = tmp_path / "cli.json"
    steps = [s["step"] for s in analyze(load([CONTROL]), ON).to_dict()["ranks"][0]["steps"]]
    pick = steps[1:3]
    assert main(["export-trace", str(CONTROL), "-o", str(out), "--steps", f"{pick[0]}:{pick[1]}"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("tracelens: wrote 1 rank(s)") and "arrows" in said
    evs = check_trace(read(out))
    assert {k[1] for k in path_slices(evs)} == set(pick)


def test_what_if_tracks_one_slice_per_step(tmp_path):
    # control.json.gz with the critical path: the suggestions it triggers that map to a change are
    # replayed (RankResult.what_if: each step's predicted time); the export shows each as a thread
    # "what-if: <change>" with one slice per step, from the step's start, lasting the prediction;
    # the suggestion's what_if is the mean of those over the kept steps
    out = tmp_path / "t.json"
    export_trace([CONTROL], out)
    evs = check_trace(read(out))
    a = analyze(load([CONTROL]), ON)
    (r,) = a.ranks
    assert r.what_if
    names = {e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    for change, pred in r.what_if.items():
        (tid,) = [t for t, n in names.items() if n == f"what-if: {change}"]
        got = sorted((e["ts"], e["dur"]) for e in evs if e["ph"] == "X" and e["tid"] == tid)
        assert [round(d * 1000) for _, d in got] == pred
        starts = [round(ts * 1000) for ts, _ in got]
        assert [b - a for a, b in zip(starts, starts[1:])] == [s2.start_ns - s1.start_ns for s1, s2 in zip(r.steps, r.steps[1:])]
    d = a.to_dict()
    kept = [i for i, s in enumerate(d["ranks"][0]["steps"]) if not s.get("warmup")]
    for sg in d["suggestions"]:
        wi = sg.get("what_if")
        if wi:
            assert abs(wi["predicted_step_ns"] - sum(r.what_if[wi["change"]][i] for i in kept) / len(kept)) <= 1


def test_the_export_is_the_same_run_after_run(tmp_path):
    """Two exports of one job are the same bytes: the events were joined to their lanes by a join that
    keeps no order, so their order (not their content) changed from run to run (192 of the 3,531 events
    of sample_traces/h100_bert_small moved between two runs)."""
    job = Path(__file__).resolve().parents[1] / "sample_traces" / "h100_bert_small"
    outs = []
    for i in range(3):
        out = tmp_path / f"e{i}.json.gz"
        export_trace([job], out)
        outs.append(gzip.decompress(out.read_bytes()))
    assert outs[0] == outs[1] == outs[2]
    assert len(json.loads(outs[0])["traceEvents"]) > 3000
