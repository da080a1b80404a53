"""The critical path of each step (tracelens.analysis.rank.critical): hand-built traces whose path is
known pin the categories to the ns; a property test; the HTA critical-path traces.

Why the length always equals the step's time here (not just within 1%): every edge weighs the time
between its two nodes and runs forward in the graph's order (an edge that would run backwards, from
clock skew, is dropped), so the path from the step's last node back to its start telescopes to
t1 - t0, the lead-in cut at the window's start.  No shared trace differs; the test below checks it
on every one of them."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import real_trace_files
from tracelens.analysis import Options, analyze
from tracelens.analysis.rank import _step_spans, critical
from tracelens.analysis.rank.names import Names
from tracelens.store.job import load

ON = Options(critical_path=True)  # off by default (--critical-path)


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def K(name, ts, dur, stream=7, corr=None):
    return X("kernel", name, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=corr)


def L(ts, dur, corr, name="cudaLaunchKernel"):
    return X("cuda_runtime", name, ts, dur, correlation=corr)


def write(tmp_path, events, name="rank-0.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    return p


def path_of(tmp_path, events) -> tuple[dict, dict]:
    """The report's critical path of the one rank, and its one step's."""
    d = analyze(load([write(tmp_path, events)], use_cache=False), ON).to_dict()
    cp = d["ranks"][0]["critical_path"]
    (step,) = cp["steps"]
    assert step["length_ns"] == d["ranks"][0]["steps"][0]["dur_ns"] == sum(step["by_category_ns"].values())
    assert d["job"]["critical_path"]["length_ns"] == cp["length_ns"]
    return cp, step


def test_cpu_bound_step(tmp_path):
    # ProfilerStep [0, 100] µs.  Main thread: op A [0, 40] launches k1 (call [30, 35]); op B [40, 100]
    # launches k2 (call [90, 95]).  k1 [38, 40], k2 [97, 99]: the GPU waits for the host.
    # Window: the first kernel's start (38) to the step's end (100): 62 µs.
    # Path back from B's end (100): B's tail after the call [95, 100] cpu 5; the call [90, 95]
    # launch 5; B's self time [40, 90] cpu 50; A's end at 40; A's tail after its call [35, 40],
    # cut at the window's start: [38, 40] cpu 2.  cpu 57 + launch 5 = 62.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("cpu_op", "aten::A", 0, 40), L(30, 5, 1), K("sm90_xmma_gemm_a", 38, 2, corr=1),
        X("cpu_op", "aten::B", 40, 60), L(90, 5, 2), K("sm90_xmma_gemm_b", 97, 2, corr=2),
    ]
    cp, step = path_of(tmp_path, ev)
    assert step["by_category_ns"] == {"cpu": 57_000, "launch_overhead": 5_000}
    assert step["top_events"][0] == {"name": "aten::B", "kind": "cpu_op", "category": "cpu", "ns": 55_000, "ts_ns": 40_000}


def test_gpu_bound_step(tmp_path):
    # The host launches k1 and k2 early (calls [1, 3], [4, 6]) and blocks in cudaDeviceSynchronize
    # [7, 100].  k1 [10, 50], k2 [52, 98] on one stream.  Window [10, 100]: 90 µs.
    # Path back from the sync's end (100): its last-arriving dependency is k2's end (98), not the
    # call's start: sync 2; k2 46; k2 waited for k1 (ended at 50, its launch was at 4): the stream
    # gap [50, 52] launch 2; k1 [10, 50] 40.  gemm 86 + sync 2 + launch 2 = 90.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        L(1, 2, 1), L(4, 2, 2), X("cuda_runtime", "cudaDeviceSynchronize", 7, 93, correlation=3),
        K("sm90_xmma_gemm_a", 10, 40, corr=1), K("sm90_xmma_gemm_b", 52, 46, corr=2),
    ]
    cp, step = path_of(tmp_path, ev)
    assert step["by_category_ns"] == {"compute_gemm": 86_000, "sync": 2_000, "launch_overhead": 2_000}
    assert [e["name"] for e in step["top_events"][:2]] == ["sm90_xmma_gemm_b", "sm90_xmma_gemm_a"]


def _sync_bound(with_events: bool) -> list[dict]:
    # A [5, 15] on stream 7; the host records an event on 7 (call [3, 4]) and makes stream 8 wait for
    # it (cudaStreamWaitEvent [5, 6]); B [16, 20] on stream 8; an event recorded on 8 (call [9, 10]);
    # C [20, 95] on stream 9, which nothing waits for; cudaEventSynchronize [11, 100] on B's event.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        L(1, 1, 1), X("cuda_runtime", "cudaEventRecord", 3, 1, correlation=2),
        X("cuda_runtime", "cudaStreamWaitEvent", 5, 1, correlation=3), L(7, 1, 4),
        X("cuda_runtime", "cudaEventRecord", 9, 1, correlation=5), L(9, 1, 7),
        X("cuda_runtime", "cudaEventSynchronize", 11, 89, correlation=6),
        K("sm90_xmma_gemm_a", 5, 10, stream=7, corr=1), K("sm90_xmma_gemm_b", 16, 4, stream=8, corr=4),
        K("vectorized_elementwise_kernel", 20, 75, stream=9, corr=7),
    ]
    if with_events:  # what PyTorch >= 2.1 records with the experimental cuda_sync flag
        ev += [
            X("cuda_sync", "Stream Wait Event", 6, 0, pid=0, tid=8, cuda_sync_kind="Stream Wait Event", wait_on_stream=7,
              wait_on_cuda_event_record_corr_id=2, stream=8, correlation=3, device=0),
            X("cuda_sync", "Event Sync", 20, 80, pid=0, tid=-1, cuda_sync_kind="Event Sync", wait_on_stream=8,
              wait_on_cuda_event_record_corr_id=5, stream=-1, correlation=6, device=0),
        ]
    return ev


def test_sync_bound_step_follows_the_event_edges(tmp_path):
    # Window [5, 100]: 95 µs.  Path back from the event sync's end (100): it waited for B (recorded
    # on stream 8), not for C: the sync's wait after B [20, 100] sync 80; B [16, 20] gemm 4; B waited
    # on A through the event (stream wait [15, 16]) sync 1; A [5, 15] gemm 10.  sync 81 + gemm 14 = 95.
    cp, step = path_of(tmp_path, _sync_bound(True))
    assert step["by_category_ns"] == {"sync": 81_000, "compute_gemm": 14_000}
    # without the cuda_sync rows the sync can only wait for the whole device: C, the last activity
    # to end (95), is then on the path: the sync after it [95, 100] 5, C [20, 95] 75
    cp, step = path_of(_fresh(tmp_path), _sync_bound(False))
    assert step["by_category_ns"]["compute_elementwise"] == 75_000 and step["by_category_ns"]["sync"] == 5_000


def test_off_by_default(tmp_path):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), X("cpu_op", "aten::A", 0, 40), L(30, 5, 1),
          K("sm90_xmma_gemm_a", 38, 2, corr=1)]
    d = analyze(load([write(tmp_path, ev)], use_cache=False)).to_dict()
    assert d["ranks"][0]["critical_path"] is None and "critical_path" not in d["job"]


def _fresh(tmp_path):
    d = tmp_path / "other"
    d.mkdir(exist_ok=True)
    return d


def test_hta_event_sync_traces():
    # HTA's cuda_event_sync traces: the cudaEventSynchronize waits for the spin kernel recorded
    # before it (Event Sync names the record), and the path goes through that kernel
    for p in real_trace_files("hta/critical_path/cuda_event_sync", "hta/critical_path/cuda_event_sync_multi_stream"):
        d = analyze(load([p], use_cache=False), ON).to_dict()
        for r in d["ranks"]:
            for s, c in zip(r["steps"], r["critical_path"]["steps"]):
                assert c["length_ns"] == s["dur_ns"] == sum(c["by_category_ns"].values())
    d = analyze(load(real_trace_files("hta/critical_path/cuda_event_sync"), use_cache=False), ON).to_dict()
    (c,) = d["ranks"][0]["critical_path"]["steps"]
    assert c["top_events"][0]["name"].startswith("at::cuda::(anonymous namespace)::spin_kernel")
    assert c["by_category_ns"]["sync"] > 0


@pytest.mark.parametrize("folder", ["hta", "kineto-tbplugin", "amd-tracelens"])
def test_length_is_the_step_time_on_every_shared_trace(folder):
    for p in real_trace_files(folder):
        try:
            job = load([p], use_cache=False)
        except Exception:  # unreadable on purpose (bad-input samples): the parser's tests cover them
            continue
        d = analyze(job, ON).to_dict()
        for r in d["ranks"]:
            cp = r["critical_path"]
            assert cp is not None, p
            for s, c in zip(r["steps"], cp["steps"]):
                assert c["length_ns"] == s["dur_ns"] == sum(c["by_category_ns"].values()), (p, s["name"])


def _frame(events, tmp_path):
    h = load([write(tmp_path, events)], use_cache=False).handles[0]
    return h.read(), h.meta


def _path(df: pl.DataFrame, meta) -> critical.StepPath:
    """The path through the span of all the frame's events."""
    lo, hi = df.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
    _, main = _step_spans(df, Options())
    (p,) = critical.step_paths(df, 0, [(lo, hi)], main, Names(df), with_rows=True)
    assert p.length_ns == hi - lo == sum(p.by_category_ns.values())
    return p


@st.composite
def _traces(draw):
    ev, t, corr = [], 0, 0
    for _ in range(draw(st.integers(1, 8))):
        t += draw(st.integers(0, 20))
        dur = draw(st.integers(1, 40))
        ev.append(X("cpu_op", "aten::op", t, dur))
        if draw(st.booleans()):
            corr += 1
            at = t + draw(st.integers(0, dur - 1))
            ev.append(L(at, 1, corr))
            ev.append(K("sm90_xmma_gemm_x" if draw(st.booleans()) else "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                        at + draw(st.integers(1, 30)), draw(st.integers(1, 60)), stream=draw(st.sampled_from([7, 8])), corr=corr))
        if draw(st.integers(0, 4)) == 0:
            ev.append(X("cuda_runtime", "cudaDeviceSynchronize", t + dur, draw(st.integers(1, 50)), correlation=10_000 + corr))
        t += dur
    return ev


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_traces(), st.randoms(use_true_random=False))
def test_removing_an_event_off_the_path_never_lengthens_it(tmp_path_factory, events, rnd):
    tmp = tmp_path_factory.mktemp("cp")
    df, meta = _frame(events, tmp)
    p = _path(df, meta)
    off = [i for i in range(df.height) if i not in set(p.rows) and df.get_column("kind")[i] in ("cpu_op", "runtime", "sync", "kernel")]
    if not off:
        return
    i = rnd.choice(off)
    q = _path(df.with_row_index("_i").filter(pl.col("_i") != i).drop("_i"), meta)
    assert q.length_ns <= p.length_ns


def _coll(ts, dur, seq, n=2, stream=20):
    return X("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts, dur, pid=0, tid=stream, device=0, stream=stream,
             **{"Collective name": "allreduce", "Process Group Name": "0", "Group size": n, "Seq": seq, "dtype": "Float",
                "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20})


def test_a_late_rank_at_an_all_reduce(tmp_path):
    # Two ranks, one step [0, 1000] µs each, same clock.  Each: a gemm on stream 7 from 100 µs
    # (rank 0: [100, 300]; rank 1: [100, 700], the late one), then on the same stream an all-reduce
    # that starts right after it (rank 0 at 300, rank 1 at 700) and ends on both at 900.  The GPU
    # window: the first kernel's start to the last kernel's end, [100, 900]: 800 µs on both.
    # Rank 0's own path: the all-reduce [300, 900] after the gemm [100, 300]; it waited [300, 700]
    # = 400 for rank 1.  The job's path: rank 0 (a tie on the window's end: the lowest file) from
    # 900 back to rank 1's arrival at 700: exposed_comm 200; then rank 1 from its start of the
    # all-reduce (700): its gemm [100, 700] 600.  800 in all, the step's window.
    paths = []
    for r, gemm_end in ((0, 300), (1, 700)):
        ev = [X("user_annotation", "ProfilerStep#1", 0, 1000),
              K("sm90_xmma_gemm", 100, gemm_end - 100), _coll(gemm_end, 900 - gemm_end, seq=1, stream=7)]
        p = tmp_path / f"rank-{r}.json"
        p.write_text(json.dumps({"distributedInfo": {"rank": r, "world_size": 2}, "traceEvents": ev,
                                 "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
        paths.append(p)
    d = analyze(load(paths, use_cache=False, jobs=1), ON).to_dict()
    job = d["job"]["critical_path"]
    (step,) = job["steps"]
    assert step["length_ns"] == 800_000 == sum(step["by_category_ns"].values())
    assert step["by_category_ns"] == {"compute_gemm": 600_000, "exposed_comm": 200_000}
    assert d["ranks"][0]["critical_path"]["by_category_ns"] == {"exposed_comm": 600_000, "compute_gemm": 200_000}
    assert step["ranks"] == [1, 0]
    assert job["wait_rank_ns"] == {"0": {"1": 400_000}}
    assert job["length_ns"] == 800_000 and job["ranks_length_ns"] == 1_600_000


@pytest.mark.parametrize("packed", [True, False])
def test_mark_prefixes_match_a_plain_sum(packed, monkeypatch):
    # step_paths' marks: the path's ns per category from the window's start to each mark.  The
    # path's segments tile each window; _mark_prefixes finds, by searches of one packed (window,
    # time) key of the marks, the first mark at or after each segment's end and the segment each
    # mark falls in (packed=False: the join fallback for windows x time spans past int64).  Here
    # random tilings of 3 windows (the last one starting where the second ends, the two sharing
    # that time) with marks on segment edges, inside segments, at the windows' edges and twice at
    # one time, against the plain sum over the segments of each one's part before the mark.
    import random

    if not packed:
        monkeypatch.setattr(critical, "_MARK_KEY_LIMIT", 0)
    rng = random.Random(17)
    cats = ["cpu", "sync", "idle", "compute_gemm"]
    for _ in range(20):
        spans, marks, edges = [], [], {}
        t = rng.randint(0, 10**6)
        for k in range(3):
            if k == 2:
                t = edges[1][-1]
            start, cuts = t, [t]
            for _ in range(rng.randint(1, 12)):
                t += rng.randint(1, 1000)
                spans.append((k, rng.choice(cats), cuts[-1], t))
                cuts.append(t)
            edges[k] = cuts
            for _ in range(rng.randint(0, 8)):
                m = rng.choice([rng.choice(cuts), rng.randint(start, t)])
                marks += [(k, len(marks), m)] * (2 if rng.random() < 0.2 else 1)
            t += rng.randint(0, 500)
        marks = [(k, i, m) for i, (k, _, m) in enumerate(marks)]
        if not marks:
            continue
        sp = pl.DataFrame(spans, schema={"k": pl.Int64, "cat": critical.CAT, "_s": pl.Int64, "_e": pl.Int64}, orient="row")
        mk = pl.DataFrame(marks, schema={"k": pl.Int64, "m": pl.Int64, "t": pl.Int64}, orient="row")
        want = {}
        for k, m, at in marks:
            for sk, c, s, e in spans:
                if sk == k and s < at:
                    want[(k, m, c)] = want.get((k, m, c), 0) + min(e, at) - s
        got = {(k, m, c): ns for k, m, c, ns in critical._mark_prefixes(sp, mk).iter_rows()}
        assert got == {key: ns for key, ns in want.items() if ns > 0}
