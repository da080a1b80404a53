"""Steps and the exact GPU-time partition."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, real_trace_files, real_traces
from tests.reference import exclusive, partition
from tracelens.analysis import Options, analyze, parse_steps
from tracelens.analysis import intervals as iv
from tracelens.store.job import load


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def K(name, ts, dur, stream=7, corr=None):
    a = {"device": 0, "stream": stream}
    if corr is not None:
        a["correlation"] = corr
    return X("kernel", name, ts, dur, pid=0, tid=stream, **a)


def write(tmp_path, events, name="rank-0.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    return p


def test_partition_by_hand(tmp_path):
    # One step, CPU span [0, 100) µs.  GPU (µs):
    #   gemm A on stream 7   [10, 30)     gemm B on stream 8 [20, 40)   -> compute C = [10, 40)  = 30
    #   allreduce on stream 9 [35, 60)                                   -> comm M = [35, 60)     = 25, exposed X = [40, 60) = 20
    #   memcpy on stream 7    [55, 70)                                   -> copies Y = [55, 70)  = 15, exposed Z = [60, 70) = 10
    # The window starts at the first kernel (10) and, for the last step, ends at the later of
    # the CPU span's end (100) and the last kernel's end (70): W = [10, 100) = 90.
    # idle I = W minus busy [10, 70) = 30.   30 + 30 + 20 + 10 = 90.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=1),
        X("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=2),
        X("cuda_runtime", "cudaLaunchKernel", 3, 1, correlation=3),
        X("cuda_runtime", "cudaMemcpyAsync", 4, 1, correlation=4),
        K("sm90_xmma_gemm_a", 10, 20, stream=7, corr=1),
        K("sm90_xmma_gemm_b", 20, 20, stream=8, corr=2),
        K("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 35, 25, stream=9, corr=3),
        {**X("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 55, 15, pid=0, tid=7, device=0, stream=7, correlation=4)},
        X("cpu_op", "aten::add_", 70, 30),  # host work to the step's end (else [70, 100) is the untraced tail)
    ]
    a = analyze(load([write(tmp_path, ev)], use_cache=False))
    r = a.ranks[0]
    (s,) = r.steps
    assert (s.step, s.start_ns, s.end_ns, s.kernels, s.warmup) == (1, 10_000, 100_000, 4, False)
    g = s.gpu
    assert (g.window, g.idle, g.compute, g.exposed_comm, g.exposed_memcpy, g.comm, g.memcpy) == (
        90_000, 30_000, 30_000, 20_000, 10_000, 25_000, 15_000)
    d = a.to_dict()
    assert d["schema_version"] == 1 and d["ranks"][0]["gpu_time_ns"]["idle"] == 30_000


def test_kernels_belong_to_the_step_that_launched_them(tmp_path):
    # Step 1 CPU [0, 50), step 2 CPU [50, 100).  Kernel k1 is launched at 40 (step 1) but runs
    # at [60, 80), inside step 2's CPU span; k2 is launched at 60 and runs [85, 95).
    # Step 1's GPU window: [60, 85) (to step 2's first kernel); step 2: [85, 100).
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 50),
        X("user_annotation", "ProfilerStep#2", 50, 50),
        X("cuda_runtime", "cudaLaunchKernel", 40, 1, correlation=1),
        X("cuda_runtime", "cudaLaunchKernel", 60, 1, correlation=2),
        K("k1_elementwise_kernel", 60, 20, corr=1),
        K("k2_elementwise_kernel", 85, 10, corr=2),
        X("cpu_op", "aten::add_", 95, 5),  # host work to the last step's end (else [95, 100) is its untraced tail)
    ]
    a = analyze(load([write(tmp_path, ev)], use_cache=False), Options(include_warmup=True))
    s1, s2 = a.ranks[0].steps
    assert (s1.start_ns, s1.end_ns, s1.kernels, s1.gpu.compute, s1.gpu.idle) == (60_000, 85_000, 1, 20_000, 5_000)
    assert (s2.start_ns, s2.end_ns, s2.kernels, s2.gpu.compute, s2.gpu.idle) == (85_000, 100_000, 1, 10_000, 5_000)
    # by default the first step is the warm-up and stays out of the rank's totals
    b = analyze(load([write(tmp_path, ev)], use_cache=False))
    assert b.ranks[0].steps[0].warmup and b.ranks[0].gpu.window == 15_000
    # --steps keeps the named steps only
    c = analyze(load([write(tmp_path, ev)], use_cache=False), Options(steps=parse_steps("2")))
    assert [s.step for s in c.ranks[0].steps] == [2]


def test_parse_steps():
    assert parse_steps("3:7") == (3, 7) and parse_steps("5") == (5, 5) and parse_steps(":4") == (0, 4)
    assert parse_steps("3:")[0] == 3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["gemm", "comm", "memcpy", "elementwise"]), st.integers(0, 1000), st.integers(0, 300)),
        max_size=40,
    ),
    st.integers(0, 600),
    st.integers(0, 1500),
    st.randoms(use_true_random=False),
)
def test_partition_sums_to_the_window(kernels, lo, span, rnd):
    rows = [{"ts_ns": s, "dur_ns": d, "kclass": c} for c, s, d in kernels]

    def sets(rs):
        f = pl.DataFrame(rs, schema={"ts_ns": pl.Int64, "dur_ns": pl.Int64, "kclass": pl.String})
        return (
            iv.union_of(f.filter(~pl.col("kclass").is_in(["comm", "memcpy"]))),
            iv.union_of(f.filter(pl.col("kclass") == "comm")),
            iv.union_of(f.filter(pl.col("kclass") == "memcpy")),
        )

    g = partition(*sets(rows), lo, lo + span)
    assert g.idle + g.compute + g.exposed_comm + g.exposed_memcpy == g.window == span
    assert min(g.idle, g.compute, g.exposed_comm, g.exposed_memcpy) >= 0
    assert g.exposed_comm <= g.comm and g.exposed_memcpy <= g.memcpy
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    assert partition(*sets(shuffled), lo, lo + span) == g  # row order changes nothing
    # brute force on integer points: each ns is exactly one of the four
    C, M, Y = (iv.clip(x, lo, lo + span) for x in sets(rows))
    inside = lambda t, s: any(a <= t < b for a, b in s)  # noqa: E731
    n = {"i": 0, "c": 0, "x": 0, "z": 0}
    for t in range(lo, lo + span):
        n["c" if inside(t, C) else "x" if inside(t, M) else "z" if inside(t, Y) else "i"] += 1
    assert (n["i"], n["c"], n["x"], n["z"]) == (g.idle, g.compute, g.exposed_comm, g.exposed_memcpy)


def test_real_traces_partition_exactly():
    files = [f for f in real_trace_files("hta", "amd-tracelens", "kineto-tbplugin") if f.stat().st_size > 20_000]
    checked = 0
    for f in files:
        try:
            trace = load([f], use_cache=False)
        except Exception:
            continue  # non-trace files are covered by test_kineto_real
        a = analyze(trace)
        for r in a.ranks:
            if r.gpu is None:
                continue
            for s in r.steps:
                g = s.gpu
                assert g.idle + g.compute + g.exposed_comm + g.exposed_memcpy == g.window, (f, s.name)
                assert min(g.idle, g.compute, g.exposed_comm, g.exposed_memcpy) >= 0
            checked += 1
    assert checked >= 15


def report_json(tmp_path, trace: str) -> dict:
    """``tracelens report TRACE -o r.json`` in a subprocess; the parsed report."""
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "tracelens", "report", trace, "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_report_cli_json_and_text(tmp_path):
    d = report_json(tmp_path, "sample_traces/job_2ranks")
    assert d["schema_version"] == 1 and d["job"]["ranks"] == 2
    assert [x["rank"] for x in d["ranks"]] == [0, 1]
    for rk in d["ranks"]:
        g = rk["gpu_time_ns"]
        kept = [s for s in rk["steps"] if not s["warmup"]]
        assert g["idle"] + g["compute"] + g["exposed_comm"] + g["exposed_memcpy"] == rk["window_ns"] == sum(s["dur_ns"] for s in kept)
    t = subprocess.run([sys.executable, "-m", "tracelens", "report", "sample_traces/job_2ranks"], capture_output=True, text=True, cwd=ROOT)
    assert t.returncode == 0 and "ProfilerStep#552" in t.stdout
    bad = subprocess.run([sys.executable, "-m", "tracelens", "report", "sample_traces/job_2ranks", "-o", str(tmp_path / "r.pdf")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and not (tmp_path / "r.pdf").exists()
    empty = tmp_path / "empty.json"
    empty.write_text("")
    e = subprocess.run([sys.executable, "-m", "tracelens", "report", str(empty), "-o", str(tmp_path / "x.json")],
                       capture_output=True, text=True, cwd=ROOT)
    assert e.returncode == 3 and not (tmp_path / "x.json").exists()


def _tb_expected_dataloader(run: int) -> dict[int, int]:
    """The TensorBoard plugin's own expected per-step "DataLoader" time (µs) for the two
    ResNet-50 runs, from kineto-tbplugin/test/result_check_file.txt (its first and sixth
    lines are the step breakdowns of num_workers_0 and num_workers_4)."""
    from tests.conftest import real_traces

    lines = (real_traces() / "kineto-tbplugin/test/result_check_file.txt").read_text().splitlines()
    d = json.loads(lines[run])["steps"]
    names = [c.get("name") for c in d["columns"]]
    col = names.index("DataLoader")
    return {int(r[0]): r[col] for r in d["rows"]}


def test_data_loading_against_the_tensorboard_plugin():
    """TB's "DataLoader" is step time when the GPU idles while the host is in the DataLoader:
    our data-loading idle.  TB's steps start at the CPU step start, so the wait before a step's
    first kernel is that step's; our GPU windows run from first kernel to first kernel, so that
    wait ends the previous step's window and is that window's data wait (the same ns as its
    waterfall bar): ours[step - 1] is TB's [step].  The last step's window holds no wait (its
    batch came before its first kernel), so its share is 0 and its verdict "no".
    Tolerance 3% of TB's value: we clip to the launching thread's DataLoader spans, TB to any."""
    from tests.conftest import real_traces

    base = real_traces() / "kineto-tbplugin/samples"
    for run, folder in ((0, "resnet50_num_workers_0"), (5, "resnet50_num_workers_4")):
        tb = _tb_expected_dataloader(run)
        a = analyze(load([base / folder], use_cache=False))
        ours = {s.step: s.data.gpu_idle_ns / 1000 for s in a.ranks[0].steps}
        assert all(s.data.gpu_idle_ns == s.idle.data_loading for s in a.ranks[0].steps)
        for step in sorted(tb)[1:]:
            assert abs(ours[step - 1] - tb[step]) <= max(0.03 * tb[step], 10), (folder, step, ours[step - 1], tb[step])
        kept = [s for s in a.ranks[0].steps if not s.warmup]
        share = sum(s.data.gpu_idle_ns for s in kept) / sum(s.gpu.window for s in kept)
        assert share == a.ranks[0].idle.data_loading / a.ranks[0].gpu.window
        if folder.endswith("_0"):
            assert 0.25 <= share <= 0.40  # the plugin: DataLoader 33.4% of the step (its steps include the last batch's wait)
            assert [s.data.input_bound for s in kept] == ["highly"] * (len(kept) - 1) + ["no"]
        else:
            assert share < 0.02  # the plugin: 0.84%
            assert all(s.data.input_bound == "no" for s in a.ranks[0].steps)


def test_idle_split_by_hand(tmp_path):
    # Step CPU [0, 200) µs on thread 1.  Kernels (stream 7): k1 [10, 20) launched at 5,
    # k2 [50, 60) launched at 45, k3 [100, 110) launched at 70, k4 [150, 160) launched at 150.
    # DataLoader __next__ on thread 1: [20, 40).   cudaStreamSynchronize on thread 1: [60, 65).
    # Window [10, 200); idle gaps: [20, 50), [60, 100), [110, 150), [160, 200).
    #   [20, 50): k2 launched at 45 -> latency [45, 50) = 5; host part [20, 45): DataLoader 20, rest 5 -> host launch
    #   [60, 100): k3 launched at 70 -> latency [70, 100) = 30; host [60, 70) after the sync returned at 65 -> sync 10
    #   [110, 150): k4 launched at 150 -> host [110, 150) = 40, no sync, no DataLoader -> host launch 40
    #   [160, 200): nothing follows (end of the last step), the host is busy in aten::add_ -> other 40
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 200),
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 20, 20),
        X("cuda_runtime", "cudaStreamSynchronize", 60, 5),
        X("cpu_op", "aten::add_", 160, 40),  # the host works on to the step's end (else [160, 200) is the untraced tail)
    ]
    for i, (ts, launch) in enumerate([(10, 5), (50, 45), (100, 70), (150, 150)], start=1):
        ev.append(X("cuda_runtime", "cudaLaunchKernel", launch, 0.5, correlation=i))
        ev.append(K(f"k{i}_elementwise_kernel", ts, 10, corr=i))
    a = analyze(load([write(tmp_path, ev)], use_cache=False))
    (s,) = a.ranks[0].steps
    idle = s.idle
    assert s.gpu.idle == 150_000 == idle.total()
    assert (idle.data_loading, idle.host_launch, idle.sync, idle.launch_latency, idle.other) == (
        20_000, 45_000, 10_000, 35_000, 40_000)
    assert s.data.host_ns == 20_000 and s.data.gpu_idle_ns == 20_000


interval_sets = st.lists(st.tuples(st.integers(0, 300), st.integers(1, 40)), max_size=25).map(
    lambda xs: iv.normalize([(s, s + d) for s, d in xs])
)


@settings(max_examples=300, deadline=None)
@given(interval_sets, interval_sets, st.integers(0, 350), st.integers(0, 100))
def test_interval_operations_pointwise(a, b, lo, span):
    """Every set operation agrees with its definition on each integer point."""
    pts = lambda s: {t for x, y in s for t in range(x, y)}  # noqa: E731
    A, B = pts(a), pts(b)
    assert pts(iv.union(a, b)) == A | B
    assert pts(iv.intersect(a, b)) == A & B
    assert pts(iv.subtract(a, b)) == A - B
    assert pts(iv.clip(a, lo, lo + span)) == {t for t in A if lo <= t < lo + span}
    for res in (iv.union(a, b), iv.intersect(a, b), iv.subtract(a, b), iv.clip(a, lo, lo + span)):
        assert res == iv.normalize(res)  # sorted, disjoint, non-touching, non-empty


@settings(max_examples=25, deadline=None)  # (40: 16 s of the suite's 10 minutes)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2000),  # kernel start (µs)
            st.integers(1, 150),  # duration
            st.integers(0, 120),  # launch this long before the start
            st.sampled_from(["sm90_xmma_gemm", "ncclDevKernel_AllReduce_Sum_f32", "Memcpy HtoD", "elementwise_kernel"]),
            st.sampled_from([7, 8, 9]),  # stream
        ),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 200)), max_size=4),  # DataLoader spans
    st.lists(st.integers(0, 2000), max_size=3),  # synchronize calls
    st.integers(1, 3),  # steps
    st.randoms(use_true_random=False),
)
def test_every_split_sums_and_order_does_not_matter(kernels, loaders, syncs, n_steps, rnd):
    """On generated traces: each step's four GPU buckets sum to its window, its idle split sums
    to its idle, nothing is negative, and shuffling the file's events changes no number."""
    import tempfile
    from pathlib import Path

    ev = []
    span = 2300 // n_steps
    for i in range(n_steps):
        ev.append(X("user_annotation", f"ProfilerStep#{i}", i * span, span))
    for j, (ts, dur, lead, name, stream) in enumerate(kernels):
        launch = max(ts - lead, 0)
        cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
        ev.append(X("cuda_runtime", "cudaLaunchKernel", launch, 1, correlation=j + 1))
        ev.append(X(cat, name, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=j + 1))
    for ts, dur in loaders:
        ev.append(X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts, dur))
    for ts in syncs:
        ev.append(X("cuda_runtime", "cudaDeviceSynchronize", ts, 3))

    def run(events):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "rank-0.json"
            p.write_text(json.dumps({"traceEvents": events}))
            out = analyze(load([p], use_cache=False), Options(critical_path=True)).to_dict()  # the critical path too
        out["inputs"] = out["ranks"][0]["path"] = None
        out["warnings"] = [w.replace(str(p), "<trace>") for w in out["warnings"]]
        return out

    d = run(ev)
    windows = [(s["start_ns"], s["start_ns"] + s["dur_ns"]) for s in d["ranks"][0]["steps"]]
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:])), windows  # the steps' windows tile: none overlaps another
    for s in d["ranks"][0]["steps"]:
        g, idle = s["gpu_time_ns"], s["idle_ns"]
        assert g["idle"] + g["compute"] + g["exposed_comm"] + g["exposed_memcpy"] == s["dur_ns"]
        assert sum(idle.values()) == g["idle"]
        assert min(list(g.values()) + list(idle.values())) >= 0
        # the step's data wait is its window's data-loading idle: never more than its idle
        assert s["data_loading"]["gpu_idle_ns"] == idle["data_loading"] <= g["idle"]
    shuffled = ev[:]
    rnd.shuffle(shuffled)
    assert run(shuffled) == d


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2000), st.integers(1, 150), st.integers(0, 120),
                  st.sampled_from(["sm90_xmma_gemm", "ncclDevKernel_AllReduce_Sum_f32", "Memcpy HtoD", "elementwise_kernel", "layer_norm_kernel"]),
                  st.sampled_from([7, 8, 9]), st.integers(1, 64)),
        min_size=1, max_size=25,
    ),
    st.integers(1, 3),
    st.sampled_from(["c10::BFloat16", "float", "c10::Float8_e4m3fn"]),
)
def test_waterfall_sums_to_one(kernels, n_steps, dtype):
    """Generated traces with GEMM shapes on an H100: every waterfall (steps, rank, job) sums to
    1 within 1e-9, ends with the MFU, and only the convention bar can be negative."""
    import tempfile
    from pathlib import Path

    span = 2300 // n_steps
    ev = [X("user_annotation", f"ProfilerStep#{i}", i * span, span) for i in range(n_steps)]
    for j, (ts, dur, lead, name, stream, m) in enumerate(kernels):
        launch = max(ts - lead, 0)
        if "gemm" in name:
            ev.append(X("cpu_op", "aten::mm", launch, 1, **{"External id": 1000 + j, "Input Dims": [[m * 16, 256], [256, 128]],
                                                            "Input type": [dtype, dtype]}))
        ev.append(X("cuda_runtime", "cudaLaunchKernel", launch, 1, correlation=j + 1))
        cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
        ev.append(X(cat, name, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=j + 1))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "rank-0.json"
        p.write_text(json.dumps({"traceEvents": ev, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]}))
        out = analyze(load([p], use_cache=False)).to_dict()
    r0 = out["ranks"][0]
    falls = [(out["job"]["waterfall"], out["job"]["mfu"]), (r0["waterfall"], r0["mfu"]["value"])]
    falls += [(s["waterfall"], s["mfu"]) for s in r0["steps"]]
    for w, mfu in falls:
        if not w:
            continue
        # the MFU waterfall ends with the MFU; without FLOPs (a trace of comm kernels only) the
        # GPU-time waterfall ends with the compute share
        assert w[-1]["key"] == ("mfu" if mfu is not None else "compute")
        if mfu is not None:  # and the waterfall ends at that MFU
            assert w[-1]["fraction"] == pytest.approx(mfu, rel=1e-9, abs=1e-15)
        assert abs(sum(b["fraction"] for b in w) - 1.0) < 1e-9
        assert all(b["fraction"] >= -1e-12 for b in w if b["key"] != "flop_convention")


def test_report_has_the_design_contract_keys(tmp_path):
    """DESIGN.md §5: the keys users' scripts read."""
    d = report_json(tmp_path, "sample_traces/h100_bert_small")
    assert set(d) >= {"schema_version", "tool", "inputs", "warnings", "job", "ranks", "suggestions"}
    assert set(d["inputs"][0]) >= {"path", "format", "rank", "size_bytes"}
    assert set(d["job"]) >= {"ranks", "mfu", "step_time_ns", "waterfall", "stragglers"}
    assert set(d["job"]["step_time_ns"]) == {"mean", "p50", "max"}
    rk = d["ranks"][0]
    assert set(rk) >= {"rank", "device", "window", "window_ns", "clock_offset_ns", "steps", "gpu_time_ns", "idle_ns", "mfu",
                       "waterfall", "pipeline", "critical_path"}
    assert set(rk["device"]) >= {"name", "peak_flops"} and rk["device"]["peak_flops"]["bf16"] > 0
    assert set(rk["window"]) == {"start_ns", "end_ns"}
    assert set(rk["steps"][0]) >= {"step", "start_ns", "dur_ns"}
    assert set(rk["gpu_time_ns"]) == {"idle", "compute", "exposed_comm", "exposed_memcpy", "comm", "memcpy"}
    assert set(rk["idle_ns"]) == {"data_loading", "host_launch", "sync", "launch_latency", "pipeline_bubble", "other"}
    assert set(rk["mfu"]) >= {"value", "model_flops", "flops_source"}
    assert set(rk["pipeline"]) == {"stage", "bubble_ns", "bubble_fraction"}
    for b in rk["waterfall"]:
        assert set(b) >= {"key", "label", "fraction", "ns"}
    for sg in d["suggestions"]:
        assert set(sg) >= {"id", "title", "detail", "evidence", "ranks", "est_speedup"}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200), st.sampled_from("abc")), max_size=30),
    st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 300)), min_size=1, max_size=10),
    st.booleans(),
)
def test_exclusive_split_sums_to_the_covered_time(raw, win, disjoint):
    """reference.exclusive splits the part of `within` under any span among the labels: the shares
    add up to |within ∩ ∪spans|, and they are exactly what a slow, obvious split gives: one
    elementary segment at a time (between consecutive span ends), its length inside `within`
    walked piece by piece, shared by the active spans, the remainder to the label with most spans."""
    spans = [(s, s + d, lb) for s, d, lb in raw]
    if disjoint:  # lay the spans end to end
        t, spans = 0, []
        for s, d, lb in raw:
            t += s % 50
            spans.append((t, t + d, lb))
            t += d
    within = iv._merge_sorted(sorted((s, s + d) for s, d in win))
    got = exclusive(spans, within)
    covered = iv.length(iv.intersect(within, iv._merge_sorted(sorted((s, e) for s, e, _ in spans if e > s))))
    assert sum(got.values()) == covered and all(v > 0 for v in got.values())
    want: dict[str, int] = {}
    cuts = sorted({t for s, e, _ in spans if e > s for t in (s, e)})
    for a, b in zip(cuts, cuts[1:]):
        active: dict[str, int] = {}
        for s, e, lb in spans:
            if s <= a and e >= b and e > s:
                active[lb] = active.get(lb, 0) + 1
        length = iv.length(iv.intersect(within, [(a, b)]))
        if not active or not length:
            continue
        n = sum(active.values())
        for lb, c in active.items():
            want[lb] = want.get(lb, 0) + length * c // n
        rest = length - sum(length * c // n for c in active.values())
        if rest:
            top = max(active, key=lambda lb: (active[lb], lb))
            want[top] += rest
    assert got == {k: v for k, v in want.items() if v}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gemm", "attention", "comm", "memcpy", "memset", "elementwise", "reduce"]),
            st.integers(0, 1000), st.integers(0, 300), st.sampled_from(["dp", "tp", None]),
        ),
        max_size=40,
    ),
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=8),
    st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 700)), min_size=1, max_size=4),
    st.integers(0, 2**40 - 1),
)
def test_segments_match_the_interval_arithmetic(kernels, recomputed, windows, known_bits):
    """segments.cut (every window at once, in polars) gives, window by window, exactly what the
    interval-list arithmetic gives on that window alone: the partition, the idle gaps, the
    recompute and matmul time and the exclusive splits of exposed communication and non-matmul
    time, and the time of a chosen subset of the activities (``known``: the matmul kernels whose
    FLOPs are known) outside recomputed work.  Windows may overlap and be empty."""
    from tracelens.analysis import waterfall
    from tracelens.analysis.rank import segments
    from tracelens.model.schema import NON_COMPUTE_KCLASSES

    f = pl.DataFrame(
        [{"ts_ns": s, "dur_ns": d, "kclass": c, "group": g if c == "comm" else None, "group_desc": None,
          "collective": "all_reduce" if c == "comm" else None} for c, s, d, g in kernels],
        schema={"ts_ns": pl.Int64, "dur_ns": pl.Int64, "kclass": pl.String, "group": pl.String,
                "group_desc": pl.String, "collective": pl.String},
    )
    rec = pl.DataFrame([{"ts_ns": s, "dur_ns": d} for s, d in recomputed], schema={"ts_ns": pl.Int64, "dur_ns": pl.Int64})
    wins = [(s, s + d) for s, d in windows]
    known = [i for i in range(f.height) if known_bits >> i & 1]  # any subset of the rows, by position
    cuts = segments.cut(f, rec, wins, pl.Series(known, dtype=pl.UInt32))
    K = iv.union_of(f[known]) if known else []
    compute = ~pl.col("kclass").is_in(list(NON_COMPUTE_KCLASSES))
    mm = pl.col("kclass").is_in(list(waterfall.MATMUL_CLASSES))
    C, M, Y, MM = (iv.union_of(f.filter(e)) for e in (compute, pl.col("kclass") == "comm",
                                                       pl.col("kclass").is_in(["memcpy", "memset"]), mm))
    R = iv.union_of(rec)
    label = f.select(segments.comm_label()).to_series().to_list()
    comm_spans = [(s, s + d, lb) for (s, d, k), lb in zip(f.select("ts_ns", "dur_ns", "kclass").iter_rows(), label) if k == "comm"]
    nm_spans = [(s, s + d, k) for s, d, k in f.filter(compute & ~mm).select("ts_ns", "dur_ns", "kclass").iter_rows()]
    for (ws, we), k in zip(wins, cuts):
        g = partition(C, M, Y, ws, we)
        assert (k.window, k.idle, k.compute, k.exposed_comm, k.exposed_memcpy, k.comm, k.memcpy) == (
            g.window, g.idle, g.compute, g.exposed_comm, g.exposed_memcpy, g.comm, g.memcpy)
        busy = iv.union(iv.union(C, M), Y)
        assert k.gaps == (iv.subtract([(ws, we)], busy) if we > ws else [])
        c = iv.clip(C, ws, we)
        r = iv.intersect(iv.clip(R, ws, we), c)
        mmw = iv.subtract(iv.clip(MM, ws, we), r)
        assert (k.recompute, k.matmul) == (iv.length(r), iv.length(mmw))
        assert k.known_matmul == iv.length(iv.subtract(iv.clip(K, ws, we), iv.clip(R, ws, we)))
        x = iv.subtract(iv.clip(M, ws, we), c)
        nm = iv.subtract(iv.subtract(c, mmw), r)
        assert k.comm_by_group == exclusive([sp for sp in comm_spans if sp[0] < we and sp[1] > ws], x)
        assert k.non_matmul == exclusive([sp for sp in nm_spans if sp[0] < we and sp[1] > ws], nm)


@pytest.mark.parametrize("trace", [
    "sample_traces/job_2ranks",
    "amd-tracelens/mi300/resnet_act_checkpoint.json.gz",
    "hta/trace_diff/control/control.json.gz",
])
def test_same_trace_same_report_bytes(tmp_path, trace):
    """A CI gate compares reports: the same trace must give the same bytes, however many threads
    polars runs (its parallel float sums and joins may order work differently; tracelens sums
    floats exactly and sorts ties)."""
    path = trace if trace.startswith("sample_traces") else str(real_traces() / trace)
    outs = []
    for threads in ("1", "3"):
        out = tmp_path / f"r{threads}.json"
        env = dict(os.environ, POLARS_MAX_THREADS=threads)
        r = subprocess.run([sys.executable, "-m", "tracelens", "report", path, "-o", str(out), "--no-cache", "--gpu", "A100"],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
