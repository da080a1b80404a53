"""How windows are chosen: a trace without steps is windowed by its GPU activity, and the
untraced tail of the last ProfilerStep (the profiler's own stop) is reported apart, outside the
window, the partition and the waterfall.

Expected numbers come from the raw JSON (read with exact decimals), not from the parser."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import ROOT, real_traces
from tracelens.analysis import Options, analyze
from tracelens.store.job import load

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def raw_events(path: Path) -> list[dict]:
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data, parse_float=Decimal)
    return [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]


def ns(x) -> int:
    return int(Decimal(x) * 1000)


def span(e) -> tuple[int, int]:
    return ns(e["ts"]), ns(e["ts"]) + ns(e.get("dur", 0))


def union_length(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


# Real traces without ProfilerStep spans whose host events start long before the first GPU
# activity (the first host event to the first kernel: 111.7 ms, 30.4 s, 25.1 s).  Before, the
# window ran from the first host event, so those seconds were "idle" (99.9%, 99.8%, ...).
NO_STEPS = [
    "amd-tracelens/perf_model/normalization/normalization_layer_test.json.gz",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "hta/critical_path/end_to_end/simple_add/input/trace.json.gz",
]


@pytest.mark.parametrize("rel", NO_STEPS)
def test_a_trace_without_steps_is_windowed_by_its_gpu_activity(rel):
    path = real_traces() / rel
    ev = raw_events(path)
    assert not any(str(e.get("name", "")).startswith("ProfilerStep#") for e in ev)
    gpu = [span(e) for e in ev if str(e.get("cat", "")).lower() in GPU_CATS and e.get("dur", 0) >= 0]
    host = [span(e) for e in ev if str(e.get("cat", "")).lower() not in GPU_CATS | {"gpu_user_annotation", "cuda_sync", "trace"}]
    first, last = min(a for a, _ in gpu), max(b for _, b in gpu)
    assert min(a for a, _ in host) < first - 100_000_000  # the case: host events start 0.1 s or more before

    a = analyze(load([path], use_cache=False))
    r = a.ranks[0]
    (s,) = r.steps
    assert (r.window_start_ns, r.window_end_ns) == (first, last) == (s.start_ns, s.end_ns)
    assert r.window_basis == "gpu_activity" and r.untraced_tail_ns == 0
    g = r.gpu
    assert g.window == last - first
    assert g.idle + g.compute + g.exposed_comm + g.exposed_memcpy == g.window
    # idle is the window less the union of all GPU activity: none of the host lead-in is idle
    assert g.idle == (last - first) - union_length([x for x in gpu if x[1] > x[0]])
    d = valid(a.to_dict())
    rk = d["ranks"][0]
    assert rk["window_ns"] == last - first and rk["window_basis"] == "gpu_activity"
    msg = [w for w in d["warnings"] if "no ProfilerStep" in w]
    assert len(msg) == 1 and "before the first GPU activity" in msg[0]


def test_the_untraced_tail_of_the_last_step_is_not_idle():
    # hta/triton_example: one ProfilerStep#1 whose CPU span runs 13.3 s past its one kernel; the
    # last host event (cudaDeviceSynchronize) ends 175 µs after the kernel; after that nothing is
    # recorded until the profiler closes the step.  Before: window 13.335 s, idle 100% "other".
    path = real_traces() / "hta/triton_example/triton_example.json.gz"
    ev = raw_events(path)
    (step,) = [e for e in ev if e["name"] == "ProfilerStep#1"]
    kernels = [span(e) for e in ev if e["cat"] == "kernel"]
    host = [span(e) for e in ev if e["cat"] in ("cpu_op", "cuda_runtime", "cuda_driver")]
    s0, cpu_end = span(step)
    k0, k1 = min(a for a, _ in kernels), max(b for _, b in kernels)
    traced_end = max(k1, max(b for _, b in host))
    tail = cpu_end - traced_end
    assert tail > 13_000_000_000

    a = analyze(load([path], use_cache=False))
    r = a.ranks[0]
    (s,) = r.steps
    assert (s.start_ns, s.end_ns, s.cpu_end_ns) == (k0, traced_end, cpu_end)
    assert s.untraced_tail_ns == r.untraced_tail_ns == tail
    g = r.gpu
    assert g.window == traced_end - k0 and g.compute == k1 - k0
    assert g.idle + g.compute + g.exposed_comm + g.exposed_memcpy == g.window
    assert r.idle.total() == g.idle and r.idle.other <= traced_end - k1  # not 13.3 s of "other"
    d = valid(a.to_dict())
    rk = d["ranks"][0]
    assert rk["untraced_tail_ns"] == tail and rk["steps"][0]["untraced_tail_ns"] == tail
    assert rk["window"]["end_ns"] == traced_end and rk["window_basis"] == "steps"
    assert d["job"]["step_time_ns"]["max"] == traced_end - k0
    assert any("untraced tail" in w and "13.335 s" in w for w in d["warnings"])


def valid(d: dict) -> dict:
    import jsonschema

    jsonschema.Draft202012Validator(json.loads((ROOT / "tracelens/model/report.schema.json").read_text())).validate(d)
    return d


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def tail_trace(tmp_path) -> Path:
    # One ProfilerStep#1, CPU [0, 1000) µs.  aten::mm [1024, 1024] x [1024, 1024] (bf16,
    # 2 * 1024^3 = 2147483648 FLOPs) launches a GEMM running [20, 120) µs.  The host then runs
    # aten::add [130, 200) (traced work: the GPU idles while the host is busy, that stays idle).
    # From 200 to 1000 nothing is recorded on any thread that runs framework code; the only event
    # there is a cudaEventQuery on a thread that does nothing else (a watchdog's poll), which is
    # not host work.  So: window [20, 200) = 180 µs, compute 100 µs, idle 80 µs, untraced tail
    # [200, 1000) = 800 µs, MFU = 2147483648 / (989.4e12 * 180e-6).
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "aten::mm", 10, 15, **{"External id": 1, "Input Dims": [[1024, 1024], [1024, 1024]],
                                           "Input type": ["c10::BFloat16", "c10::BFloat16"]}),
        X("cuda_runtime", "cudaLaunchKernel", 12, 5, **{"External id": 1, "correlation": 9}),
        X("kernel", "sm90_xmma_gemm_bf16bf16", 20, 100, pid=0, tid=7, device=0, stream=7, correlation=9,
          **{"External id": 1}),
        X("cpu_op", "aten::add", 130, 70),
        X("cuda_runtime", "cudaEventQuery", 500, 1, tid=99),
    ]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
                             "traceEvents": ev}))
    return p


def test_the_untraced_tail_is_out_of_the_window_and_the_waterfall(tmp_path):
    a = analyze(load([tail_trace(tmp_path)], use_cache=False))
    r = a.ranks[0]
    (s,) = r.steps
    assert (s.start_ns, s.end_ns, s.untraced_tail_ns, r.untraced_tail_ns) == (20_000, 200_000, 800_000, 800_000)
    assert (r.gpu.window, r.gpu.compute, r.gpu.idle) == (180_000, 100_000, 80_000)
    assert r.mfu == pytest.approx(2 * 1024**3 / (989.4e12 * 180e-6), rel=1e-12)
    bars = r.waterfall.to_list()
    assert sum(b["fraction"] for b in bars) == pytest.approx(1, abs=1e-9)
    assert sum(b["ns"] for b in bars if b["key"] != "mfu" and b["ns"] is not None) <= 180_000
    assert not any("tail" in b["key"] for b in bars)
    d = valid(a.to_dict())
    assert d["ranks"][0]["untraced_tail_ns"] == 800_000 and d["ranks"][0]["window_ns"] == 180_000
    assert any("untraced tail" in w and "800.0 µs" in w for w in d["warnings"])


def test_only_the_last_profiler_step_has_an_untraced_tail(tmp_path):
    # Steps #1 [0, 100) and #2 [100, 300) µs.  Step 1's kernel runs [10, 30); nothing else is
    # traced in step 1 after 30: that is real step time (the host ran untraced code before the
    # next step began), so step 1's window is [10, 150) (to step 2's first kernel) with 120 µs
    # idle.  Step 2's kernel runs [150, 170) and nothing follows: its tail [170, 300) is untraced.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("user_annotation", "ProfilerStep#2", 100, 200),
        X("cuda_runtime", "cudaLaunchKernel", 5, 1, correlation=1),
        X("cuda_runtime", "cudaLaunchKernel", 105, 1, correlation=2),
        X("kernel", "k1_elementwise_kernel", 10, 20, pid=0, tid=7, device=0, stream=7, correlation=1),
        X("kernel", "k2_elementwise_kernel", 150, 20, pid=0, tid=7, device=0, stream=7, correlation=2),
    ]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}))
    a = analyze(load([p], use_cache=False), Options(include_warmup=True))
    s1, s2 = a.ranks[0].steps
    assert (s1.start_ns, s1.end_ns, s1.untraced_tail_ns, s1.gpu.idle) == (10_000, 150_000, 0, 120_000)
    assert (s2.start_ns, s2.end_ns, s2.untraced_tail_ns, s2.gpu.idle) == (150_000, 170_000, 130_000, 0)
    assert a.ranks[0].untraced_tail_ns == 130_000
    # selecting step 1 alone: it is not the trace's last step, so nothing is cut from it
    b = analyze(load([p], use_cache=False), Options(steps=(1, 1)))
    (only,) = b.ranks[0].steps
    assert (only.start_ns, only.end_ns, only.untraced_tail_ns) == (10_000, 100_000, 0)
    # with the warm-up left out (the default), the rank's tail is the kept last step's
    c = analyze(load([p], use_cache=False))
    assert c.ranks[0].untraced_tail_ns == 130_000 and c.ranks[0].gpu.window == 20_000


def test_an_empty_last_step_is_not_a_step():
    # hta/amd_trace (MI250, ROCm 6.2): ProfilerStep#1 holds all the work (16 kernels, the optimizer);
    # ProfilerStep#2 is a 49 µs span opened just before the profiler stopped, with nothing traced
    # in it.  Before: #1 was the warm-up and the rank's numbers were #2's: a 49 µs window, 100%
    # idle.  Now #2 is dropped (a warning says so), #1 is the one step, and its untraced tail runs
    # from the end of the last traced work to #2's end.
    path = real_traces() / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    ev = raw_events(path)
    s1, s2 = sorted((e for e in ev if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")),
                    key=lambda e: e["ts"])
    stop = span(s2)[1]
    gpu = [span(e) for e in ev if str(e.get("cat", "")).lower() in GPU_CATS]
    host = [span(e) for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
            and not str(e.get("name", "")).startswith("ProfilerStep#") and ns(e["ts"]) < stop]
    assert not [x for x in gpu + host if x[1] > span(s2)[0]]  # nothing at all in #2
    traced_end = max(max(b for _, b in gpu), max(min(b, stop) for _, b in host))

    a = analyze(load([path], use_cache=False))
    r = a.ranks[0]
    (s,) = r.steps
    assert (s.name, s.warmup, s.kernels) == ("ProfilerStep#1", False, 16)
    assert (s.start_ns, s.end_ns) == (min(a for a, _ in gpu), traced_end)
    assert s.untraced_tail_ns == r.untraced_tail_ns == stop - traced_end
    assert r.gpu.window == traced_end - min(a for a, _ in gpu)
    d = valid(a.to_dict())
    assert any("ProfilerStep#2" in w and "holds no traced work" in w for w in d["warnings"])


def test_a_cpu_only_trace_keeps_its_step_span():
    # hta/cpu_only: one ProfilerStep, no GPU activity: there is no GPU window to cut, so the
    # window stays the step's CPU span and nothing is called an untraced tail
    path = real_traces() / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    (step,) = [e for e in raw_events(path) if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    r = analyze(load([path], use_cache=False)).ranks[0]
    (s,) = r.steps
    assert r.gpu is None and (s.start_ns, s.end_ns) == span(step) and r.untraced_tail_ns == 0


MM = {"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}  # 2·1024³ FLOPs
H100 = {"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]}


def _three_steps() -> list[dict]:
    """Steps #1 [0, 100), #2 [100, 200), #3 [200, 300) µs; #1 launches a kernel at 5 that runs
    [10, 20) on stream 7; #2's aten::mm (a 1024³ BF16 GEMM) launches at 152 (correlation 2)."""
    ev = [X("user_annotation", f"ProfilerStep#{i + 1}", 100 * i, 100) for i in range(3)]
    return ev + [X("cuda_runtime", "cudaLaunchKernel", 5, 1, correlation=1),
                 X("kernel", "elementwise_kernel", 10, 10, pid=0, tid=7, device=0, stream=7, correlation=1),
                 X("cpu_op", "aten::mm", 150, 5, **MM), X("cuda_runtime", "cudaLaunchKernel", 152, 1, correlation=2)]


def _analysed(tmp_path, ev: list[dict]):
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({**H100, "traceEvents": ev}))
    return analyze(load([p], use_cache=False))


def test_a_step_without_kernels_starts_after_the_gpu_work_launched_before_it(tmp_path):
    # Steps #1 [0, 100), #2 [100, 200), #3 [200, 300) µs.  #1 launches a kernel at 5 that runs [10, 20);
    # #2's aten::mm (at 150, launch at 152) runs its GEMM [250, 260): the GPU is 100 µs behind the host.
    # #3 launches nothing (its aten::add_ runs on the CPU [210, 290)).  Before, #3's window began at its CPU
    # start, 200, and #2's ran from 250 to #3's start: empty, so #2's MFU was null, its waterfall the
    # GPU-time one, and #3's window [200, 290) overlapped #1's [10, 250).  Now #3 starts where the GPU work
    # launched before it ends: #1 [10, 250), #2 [250, 260) (its GEMM), #3 [260, 290) (the host's last work).
    ev = _three_steps() + [
        X("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 250, 10, pid=0, tid=7, device=0, stream=7, correlation=2),
        X("cpu_op", "aten::add_", 210, 80)]
    a = _analysed(tmp_path, ev)
    r = a.ranks[0]
    assert [(s.start_ns, s.end_ns, s.kernels) for s in r.steps] == [(10_000, 250_000, 1), (250_000, 260_000, 1), (260_000, 290_000, 0)]
    f = 2 * 1024**3
    s1, s2, s3 = r.steps
    assert (s2.gpu.compute, s2.flops, s3.gpu.idle, s3.flops, s3.mfu) == (10_000, f, 30_000, 0.0, 0.0)
    assert s2.mfu == pytest.approx(f / (989.4e12 * 10e-6), rel=1e-12)
    assert r.gpu.window == 40_000 and r.mfu == pytest.approx(f / (989.4e12 * 40e-6), rel=1e-12)  # #1 is the warm-up
    d = valid(a.to_dict())
    for w in [d["job"]["waterfall"], d["ranks"][0]["waterfall"]] + [s["waterfall"] for s in d["ranks"][0]["steps"]]:
        assert w[-1]["key"] == "mfu" and sum(b["fraction"] for b in w) == pytest.approx(1, abs=1e-9)
    assert d["job"]["waterfall_kind"] == "mfu" and d["ranks"][0]["waterfall"][-1]["fraction"] == pytest.approx(r.mfu, rel=1e-12)


def test_the_flops_of_a_step_with_an_empty_window_stay_in_the_mfu(tmp_path):
    # Steps #1 [0, 100), #2 [100, 200), #3 [200, 300) µs.  #1's kernel runs [10, 20); #2's aten::mm (launch
    # at 152) runs its GEMM on stream 7 [260, 300); #3's kernel (launch at 212) runs on stream 8 [230, 240),
    # before #2's.  A window runs from its step's first kernel to the next step's: #2's would be [260, 230),
    # so it is empty and the windows are #1 [10, 260), #2 [260, 260), #3 [260, 300) (holding #2's GEMM).
    # The kept steps #2 and #3 span 40 µs and their ops count 2·1024³ FLOPs (all #2's): MFU =
    # 2·1024³ / (989.4e12 · 40e-6) = 5.43%, #2's own MFU null (no window), #3's 0.  The rank's waterfall
    # is #3's bars (its 40 µs of GEMM time all "below peak", as #3 counts no FLOPs) ending at the rank's MFU:
    # those 2,170 ns at peak are the convention bar's negative part, so the bars still sum to 1.
    ev = _three_steps() + [
        X("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 260, 40, pid=0, tid=7, device=0, stream=7, correlation=2),
        X("cuda_runtime", "cudaLaunchKernel", 212, 1, correlation=3),
        X("kernel", "elementwise_kernel", 230, 10, pid=0, tid=8, device=0, stream=8, correlation=3)]
    a = _analysed(tmp_path, ev)
    r = a.ranks[0]
    assert [(s.start_ns, s.end_ns) for s in r.steps] == [(10_000, 260_000), (260_000, 260_000), (260_000, 300_000)]
    f = 2 * 1024**3
    s1, s2, s3 = r.steps
    assert (s2.flops, s2.mfu, s2.waterfall, s3.flops, s3.mfu) == (f, None, None, 0.0, 0.0)
    mfu = f / (989.4e12 * 40e-6)
    assert r.gpu.window == 40_000 and r.mfu == pytest.approx(mfu, rel=1e-12)
    d = valid(a.to_dict())
    bars = {b["key"]: b for b in d["ranks"][0]["waterfall"]}
    assert list(bars)[-1] == "mfu" and bars["mfu"]["fraction"] == pytest.approx(mfu, rel=1e-12) and bars["mfu"]["ns"] == 2_170
    assert bars["matmul_below_peak"]["ns"] == 40_000
    assert [(p["key"], p["ns"]) for p in bars["flop_convention"]["parts"]] == [("flops_without_window", -2_170)]
    assert bars["flop_convention"]["ns"] == -2_170 and sum(b["fraction"] for b in bars.values()) == pytest.approx(1, abs=1e-9)
    assert d["job"]["waterfall_kind"] == "mfu" and d["job"]["waterfall"][-1]["fraction"] == pytest.approx(mfu, rel=1e-12)
    assert any("ProfilerStep#2) have an empty GPU window" in w and "2.15e+09 FLOPs" in w for w in d["warnings"])
