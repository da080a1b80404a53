"""Every suggestion rule fires when its number crosses the threshold and stays silent below it;
on real traces, the DataLoader rule fires on ResNet-50 with num_workers=0 and not with 4."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import real_traces
from tests.test_analysis import K, X, write
from tracelens.analysis import GpuTime, IdleSplit, analyze, input_bound_class
from tracelens.analysis.suggest import RULES, suggest
from tracelens.analysis.waterfall import Bar, Waterfall
from tracelens.store.job import load

T = 1_000_000


def rank(**over):
    """A healthy rank: 95% compute, 5% idle split evenly; nothing over any threshold."""
    base = dict(
        rank=0,
        gpu=GpuTime(window=T, idle=50_000, compute=950_000, exposed_comm=0, exposed_memcpy=0, comm=0, memcpy=0),
        idle=IdleSplit(data_loading=0, host_launch=20_000, sync=0, launch_latency=30_000, pipeline_bubble=0, other=0),
        waterfall=Waterfall(T, (Bar("non_matmul", "", 100_000, 0.1), Bar("matmul_below_peak", "", 100_000, 0.1), Bar("mfu", "", 0, 0.5))),
        facts={"steps": 2, "kernels": 100, "kernels_under_10us": 10, "pageable_memcpy_ns": 0, "fp32_matmul_flops_share": 0.0,
               "has_tensor_cores": True, "optimizer_kernel_ns": 0, "item_calls": 0},
    )
    base.update(over)
    return SimpleNamespace(**base)


def idle(key, v):
    i = IdleSplit(**{key: int(v * T)})
    return {"idle": i, "gpu": GpuTime(T, int(v * T), T - int(v * T), 0, 0, 0, 0)}


def bar(key, v):
    bars = (Bar(key, "", int(v * T), v), Bar("mfu", "", 0, 0.1))
    return {"waterfall": Waterfall(T, bars)}


def fact(**kw):
    f = dict(rank().facts)
    f.update(kw)
    return {"facts": f}


SCENARIOS = {
    "input_bound_high": lambda x: idle("data_loading", x),
    "input_bound_moderate": lambda x: idle("data_loading", x),
    "host_launch_bound": lambda x: idle("host_launch", x),
    "sync_drain": lambda x: idle("sync", x),
    "launch_latency": lambda x: idle("launch_latency", x),
    "pipeline_bubble": lambda x: idle("pipeline_bubble", x),
    "low_gpu_utilization": lambda x: idle("other", x),
    "exposed_communication": lambda x: {"gpu": GpuTime(T, 0, T - int(x * T), int(x * T), 0, int(x * T), 0)},
    "exposed_memcpy": lambda x: {"gpu": GpuTime(T, 0, T - int(x * T), 0, int(x * T), 0, int(x * T))},
    "non_matmul_heavy": lambda x: bar("non_matmul", x),
    "matmul_below_peak": lambda x: bar("matmul_below_peak", x),
    "recompute_heavy": lambda x: bar("recompute", x),
    "pageable_memcpy": lambda x: fact(pageable_memcpy_ns=int(x * T)),
    "fp32_matmul": lambda x: fact(fp32_matmul_flops_share=x),
    "optimizer_kernels": lambda x: fact(optimizer_kernel_ns=int(x * T)),
    "many_tiny_kernels": lambda x: fact(kernels=100, kernels_under_10us=int(x * 100)),
    "item_in_step": lambda x: fact(steps=2, item_calls=int(x * 2)),
}


def fired(r) -> set[str]:
    return {s.id for s in suggest(SimpleNamespace(ranks=[r], stragglers=()))}


def test_every_rule_has_a_scenario_and_there_are_enough_rules():
    assert {r.id for r in RULES} == set(SCENARIOS)
    assert len(RULES) + 1 >= 15  # and the straggler rule


def test_a_healthy_rank_gets_no_advice():
    assert fired(rank()) == set()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_fires_above_and_not_below(rule):
    hi = 0.21 if rule.id == "input_bound_high" else min(rule.threshold * 1.5, 0.19 if rule.id == "input_bound_moderate" else 1e9)
    lo = rule.threshold * 0.5
    above = fired(rank(**SCENARIOS[rule.id](hi)))
    below = fired(rank(**SCENARIOS[rule.id](lo)))
    assert rule.id in above and rule.id not in below


def test_fp32_rule_needs_tensor_cores():
    assert "fp32_matmul" not in fired(rank(**fact(fp32_matmul_flops_share=1.0, has_tensor_cores=False)))


def test_dataloader_rule_on_the_resnet_pair():
    base = real_traces() / "kineto-tbplugin/samples"
    slow = analyze(load([base / "resnet50_num_workers_0"], use_cache=False)).to_dict()["suggestions"]
    fast = analyze(load([base / "resnet50_num_workers_4"], use_cache=False)).to_dict()["suggestions"]
    assert "input_bound_high" in {s["id"] for s in slow}
    top = slow[0]
    assert top["id"] == "input_bound_high" and 1.3 < top["est_speedup"] < 1.5  # 27.6% of the step: up to 1/(1-0.276)
    assert not {"input_bound_high", "input_bound_moderate"} & {s["id"] for s in fast}
    # ResNet-50 in FP32 on a V100 (FP16 tensor cores): the precision rule fires on both
    assert "fp32_matmul" in {s["id"] for s in slow} and "fp32_matmul" in {s["id"] for s in fast}


# ---------------------------------------------------------------------------------------------
# Issue 13, items 5 and 6: verdicts and advice that agree with their own evidence.  The claims
# are checked against the raw trace with plain Python (json, no polars, no tracelens code).

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def raw_events(path) -> list[dict]:
    """The complete ('X') events of a trace file (or of the one trace in a folder), as recorded."""
    p = Path(path)
    if p.is_dir():
        (p,) = [f for f in p.iterdir() if f.name.endswith((".json", ".json.gz"))]
    data = p.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def ns(us) -> int:
    return round(us * 1000)


def raw_data_wait(events, windows, main_tid) -> list[int]:
    """Per window [ws, we): the GPU idle during which the host thread that launches the next
    GPU activity sits in a DataLoader __next__ (MFU.md 9.4), computed from the raw events: the
    idle gaps are the window minus the union of its kernels/copies; for a gap [a, b) the next
    activity starts at b, was launched at l by thread t; [a, clamp(l)) is host-starved and its
    overlap with t's DataLoader spans is data loading; a gap nothing ends (the tail) counts the
    main thread's DataLoader spans.  Activities launched before the first step are not the
    steps' (as in the analysis)."""
    launch = {}
    for e in events:
        c = e.get("args", {}).get("correlation")
        if e.get("cat", "").lower() in ("runtime", "cuda_runtime") and c is not None:
            launch[c] = min(launch.get(c, (ns(e["ts"]), e["tid"])), (ns(e["ts"]), e["tid"]))
    first_step = min(ns(e["ts"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    gpu = []
    for e in events:
        if e.get("cat", "").lower() in GPU_CATS:
            s, c = ns(e["ts"]), e.get("args", {}).get("correlation")
            lt = launch.get(c, (s, None))
            if lt[0] >= first_step:
                gpu.append((s, ns(e["ts"] + e["dur"]), lt[0], lt[1]))
    starting = {}
    for s, _, lt, tid in sorted(gpu, key=lambda g: (g[0], g[2])):
        starting.setdefault(s, (lt, tid))
    dl = defaultdict(list)
    for e in events:
        if str(e.get("name", "")).startswith("enumerate(DataLoader)#"):
            dl[e["tid"]].append((ns(e["ts"]), ns(e["ts"] + e["dur"])))

    def under(spans, a, b):  # length of [a, b) under the union of spans
        pts = sorted((max(s, a), min(e, b)) for s, e in spans if min(e, b) > max(s, a))
        total, reach = 0, a
        for s, e in pts:
            if e > reach:
                total += e - max(s, reach)
                reach = e
        return total

    out = []
    for ws, we in windows:
        busy = sorted((max(s, ws), min(e, we)) for s, e, _, _ in gpu if min(e, we) > max(s, ws))
        gaps, reach = [], ws
        for s, e in busy:
            if s > reach:
                gaps.append((reach, s))
            reach = max(reach, e)
        if reach < we:
            gaps.append((reach, we))
        total = 0
        for a, b in gaps:
            if b not in starting:
                total += under(dl[main_tid], a, b)
                continue
            lt, tid = starting[b]
            h = min(max(lt, a), b)
            total += under(dl[tid], a, h)
        out.append(total)
    return out


def _bar_ns(fall, key):
    return next(b["ns"] for b in fall if b["key"] == key)


@pytest.mark.parametrize("folder", ["resnet50_num_workers_0", "resnet50_num_workers_4"])
def test_a_steps_data_wait_is_its_waterfall_bar_and_the_raw_traces(folder):
    """Item 5: a step's data wait, its share and its class are the data-loading idle of the
    step's own GPU window: the same ns as the step's waterfall bar, and (summed over the kept
    steps) the rank's bar.  ResNet-50 num_workers=0 on a V100 (2021): the last step's window
    holds no data-loading idle (its batch was fetched before its first kernel, inside the
    previous window), so it scores 0, not the 41% the step-that-waited crediting gave it."""
    path = real_traces() / "kineto-tbplugin/samples" / folder
    d = analyze(load([path], use_cache=False)).to_dict()
    (r,) = d["ranks"]
    events = raw_events(path)
    main = next(e["tid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    raw = raw_data_wait(events, [(s["start_ns"], s["start_ns"] + s["dur_ns"]) for s in r["steps"]], main)
    for s, want in zip(r["steps"], raw):
        dl = s["data_loading"]
        assert dl["gpu_idle_ns"] == want == s["idle_ns"]["data_loading"] == _bar_ns(s["waterfall"], "idle_data_loading"), s["name"]
        assert dl["fraction"] == want / s["dur_ns"] and dl["input_bound"] == input_bound_class(dl["fraction"])
    kept = [s for s in r["steps"] if not s["warmup"]]
    total = sum(s["data_loading"]["gpu_idle_ns"] for s in kept)
    assert total == r["idle_ns"]["data_loading"] == _bar_ns(r["waterfall"], "idle_data_loading") == _bar_ns(d["job"]["waterfall"], "idle_data_loading")
    if folder.endswith("_0"):
        last = r["steps"][-1]
        assert last["data_loading"]["gpu_idle_ns"] == 0 and last["data_loading"]["input_bound"] == "no"
        assert [s["data_loading"]["input_bound"] for s in kept[:-1]] == ["highly"] * (len(kept) - 1)
        # the host's DataLoader time is over the same window: the fetch of the next batch
        assert all(s["data_loading"]["host_ns"] >= s["data_loading"]["gpu_idle_ns"] for s in kept)


def test_the_input_bound_suggestion_speaks_of_the_same_steps():
    """Item 5: the suggestion's class (its id and title), its per-rank number, its worst/mean
    and its `where` are the rank's kept steps' data-loading idle; where.value is the share of
    the very step the step table shows, and the step verdicts are counted in the evidence."""
    d = analyze(load([real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_0"], use_cache=False)).to_dict()
    (r,) = d["ranks"]
    kept = [s for s in r["steps"] if not s["warmup"]]
    share = r["idle_ns"]["data_loading"] / r["window_ns"]
    assert share == sum(s["data_loading"]["gpu_idle_ns"] for s in kept) / sum(s["dur_ns"] for s in kept)
    (sg,) = [s for s in d["suggestions"] if s["id"].startswith("input_bound")]
    ev = sg["evidence"]
    assert sg["id"] == f"input_bound_{'high' if input_bound_class(share) == 'highly' else 'moderate'}"
    assert sg["title"].lower().startswith(input_bound_class(share))
    assert ev["worst"] == ev["mean"] == ev["per_rank"]["0"] == round(share, 4)
    top = max(kept, key=lambda s: s["data_loading"]["fraction"])
    assert (ev["where"]["step"], ev["where"]["value"]) == (top["step"], round(top["data_loading"]["fraction"], 4))
    classes = [s["data_loading"]["input_bound"] for s in kept]
    assert ev["steps"] == {c: classes.count(c) for c in ("highly", "moderately", "no")}


def _step(i, dl, window=T, warmup=False):
    """A step whose GPU window holds ``dl`` ns of data-loading idle (and nothing else idle)."""
    gpu = GpuTime(window, dl, window - dl, 0, 0, 0, 0)
    return SimpleNamespace(step=i, name=f"ProfilerStep#{i}", start_ns=i * window, end_ns=(i + 1) * window, dur_ns=window,
                           warmup=warmup, gpu=gpu, idle=IdleSplit(data_loading=dl), waterfall=None)


def test_a_moderately_input_bound_rank_with_one_highly_step_says_both():
    # Four kept steps of 1 ms with 300, 40, 60 and 80 µs of data-loading idle (30%, 4%, 6%,
    # 8%: highly, no, moderately, moderately): the rank's share is 480 / 4000 = 12%, so the
    # verdict is "moderately", the title says that 1 of the 4 steps is highly input-bound, and
    # `where` is that step (0.3).  The warm-up step (90%) counts nowhere.
    steps = [_step(0, 900_000, warmup=True)] + [_step(i, v) for i, v in enumerate((300_000, 40_000, 60_000, 80_000), start=1)]
    r = rank(steps=steps, gpu=sum((s.gpu for s in steps[1:]), GpuTime(0, 0, 0, 0, 0, 0, 0)),
             idle=IdleSplit(data_loading=480_000))
    (sg,) = [s for s in suggest(SimpleNamespace(ranks=[r], stragglers=())) if s.id.startswith("input_bound")]
    assert sg.id == "input_bound_moderate" and sg.evidence["worst"] == 0.12
    assert "1 of 4 steps highly" in sg.title
    assert sg.evidence["steps"] == {"highly": 1, "moderately": 2, "no": 1}
    assert (sg.evidence["where"]["step"], sg.evidence["where"]["value"]) == (1, 0.3)


def analyze_events(tmp_path, ev, name="rank-0.json"):
    return analyze(load([write(tmp_path, ev, name)], use_cache=False))


def test_idle_while_the_host_sits_in_a_blocking_copy_is_sync(tmp_path):
    # Step CPU [0, 300) µs on thread 1.  k1 [10, 20) launched at 5.  The host then sits in a
    # blocking cudaMemcpy [50, 201) whose copy runs on the GPU [195, 200); k2 [200, 210) was
    # launched at 30.  Nothing is traced after k2 ends at 210 (the host's last event, the copy,
    # ends at 201), so [210, 300) is the last step's untraced tail, outside the window.
    # Window [10, 210), busy 25, idle 175:
    #   [20, 195): ended by the copy, launched at 50 -> host launch [20, 50) = 30 (no blocking
    #              call had ended), and [50, 195) = 145 with the copy queued while the host sits
    #              in cudaMemcpy: sync (it was "launch latency" before)
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 300),
        X("cuda_runtime", "cudaLaunchKernel", 5, 1, correlation=1),
        X("cuda_runtime", "cudaLaunchKernel", 30, 1, correlation=2),
        X("cuda_runtime", "cudaMemcpy", 50, 151, correlation=3),
        K("k1_elementwise_kernel", 10, 10, corr=1),
        X("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 195, 5, pid=0, tid=7, device=0, stream=7, correlation=3),
        K("k2_elementwise_kernel", 200, 10, corr=2),
    ]
    a = analyze_events(tmp_path, ev)
    (s,) = a.ranks[0].steps
    assert s.gpu.idle == 175_000 == s.idle.total() and s.untraced_tail_ns == 90_000
    assert (s.idle.host_launch, s.idle.sync, s.idle.launch_latency, s.idle.other) == (30_000, 145_000, 0, 0)
    sgs = {x.id: x for x in suggest(a)}
    assert "launch_latency" not in sgs
    assert sgs["sync_drain"].evidence["calls"] == {"cudaMemcpy": 145_000}
    assert "cudaMemcpy" in sgs["sync_drain"].detail


def test_a_blocking_aten_to_is_sync_for_its_whole_span(tmp_path):
    # aten::to (non_blocking=False, device to host) [40, 180) on thread 1 holds cudaMemcpyAsync
    # [45, 47) and cudaStreamSynchronize [47, 170).  k1 [10, 20) launched at 5; its copy runs
    # [150, 155) (launched at 45); k2 [185, 195) is launched at 182.  Nothing is traced after
    # 195 (the host's last event ends at 183), so [195, 200) is the untraced tail, outside the
    # window.  Window [10, 195), idle 160:
    #   [20, 150): the copy was launched at 45 -> host launch [20, 45) = 25; [45, 150) = 105 the
    #              host sits in the blocking aten::to -> sync (the sync call alone covers 103)
    #   [155, 185): k2 launched at 182 -> [155, 182) = 27 just after the synchronize returned:
    #              sync; [182, 185) = 3 launch latency
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 200),
        X("cpu_op", "aten::to", 40, 140),
        X("cuda_runtime", "cudaMemcpyAsync", 45, 2, correlation=3),
        X("cuda_runtime", "cudaStreamSynchronize", 47, 123),
        X("cuda_runtime", "cudaLaunchKernel", 5, 1, correlation=1),
        X("cuda_runtime", "cudaLaunchKernel", 182, 1, correlation=2),
        K("k1_elementwise_kernel", 10, 10, corr=1),
        X("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 150, 5, pid=0, tid=7, device=0, stream=7, correlation=3),
        K("k2_elementwise_kernel", 185, 10, corr=2),
    ]
    (s,) = analyze_events(tmp_path, ev).ranks[0].steps
    assert s.gpu.idle == 160_000 == s.idle.total() and s.untraced_tail_ns == 5_000
    assert (s.idle.host_launch, s.idle.sync, s.idle.launch_latency, s.idle.other) == (25_000, 132_000, 3_000, 0)


def test_short_queued_waits_under_a_synchronize_stay_launch_latency(tmp_path):
    # The host queues k1..k4 (launched at 1..4 µs) and sits in cudaStreamSynchronize [5, 100)
    # while they run back to back with 3 µs gaps: [10, 20) [23, 33) [36, 46) [49, 59).  The
    # queue drains at the GPU's own pace: the 3 x 3 µs gaps are launch latency, not sync (a
    # queued kernel that waits under 50 µs is the GPU's latency, whatever the host does).
    # Then k5 is launched at 101, after the synchronize returned at 100: [59, 101) is sync
    # drain (42 µs) and [101, 105) launch latency (4).  Window [10, 115): [115, 200) is the
    # step's untraced tail (nothing is traced after k5), outside the window.
    ev = [X("user_annotation", "ProfilerStep#1", 0, 200), X("cuda_runtime", "cudaStreamSynchronize", 5, 95)]
    for i, (launch, ts) in enumerate(((1, 10), (2, 23), (3, 36), (4, 49), (101, 105)), start=1):
        ev += [X("cuda_runtime", "cudaLaunchKernel", launch, 0.5, correlation=i), K(f"k{i}_elementwise_kernel", ts, 10, corr=i)]
    (s,) = analyze_events(tmp_path, ev).ranks[0].steps
    assert (s.idle.sync, s.idle.launch_latency, s.idle.host_launch, s.idle.other) == (42_000, 13_000, 0, 0)
    assert s.untraced_tail_ns == 85_000


def test_sglang_decode_blocking_copy_is_sync_not_launch_latency():
    """Item 6 on the real SGLang decode trace (MI300X, ROCm): the host sits 463 ms in
    hipMemcpyWithStream while the GPU idles with kernels queued.  That idle is sync drain; the
    launch-latency advice (CUDA graphs) is not given, and the sync advice names the call."""
    path = real_traces() / "amd-tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
    events = raw_events(path)
    (cp,) = [e for e in events if e["name"] == "hipMemcpyWithStream"]
    a0, a1 = ns(cp["ts"]), ns(cp["ts"] + cp["dur"])
    gpu = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events if e.get("cat", "").lower() in GPU_CATS)
    # GPU idle inside the copy's span: its span minus the GPU activities in it
    busy, reach = 0, a0
    for s, e in gpu:
        s, e = max(s, reach), min(e, a1)
        if e > s:
            busy += e - s
            reach = e
    idle_in_copy = (a1 - a0) - busy
    assert idle_in_copy > 460_000_000
    a = analyze(load([path], use_cache=False))
    (r,) = a.ranks
    assert r.idle.sync >= idle_in_copy - 100_000  # all of it but the part after the copy finished on the GPU
    assert r.idle.launch_latency < 0.02 * r.gpu.window
    sgs = {s["id"]: s for s in a.to_dict()["suggestions"]}
    assert "launch_latency" not in sgs
    sync = sgs["sync_drain"]
    assert max(sync["evidence"]["calls"], key=sync["evidence"]["calls"].get) == "hipMemcpyWithStream"
    assert "hipMemcpyWithStream" in sync["detail"]


def graph_trace(launcher: str):
    # Three 5 µs kernels at 10, 60 and 120 µs, all launched at 5 µs: by one cudaGraphLaunch
    # (one correlation) or by three cudaLaunchKernel calls.  Step CPU [0, 300): window [10, 300)
    # = 290, gaps [15, 60) and [65, 120) = 100 of launch latency (34%), tail [125, 300) other.
    ev = [X("user_annotation", "ProfilerStep#1", 0, 300)]
    for i, ts in enumerate((10, 60, 120), start=1):
        corr = 1 if launcher == "cudaGraphLaunch" else i
        if launcher != "cudaGraphLaunch" or i == 1:
            ev.append(X("cuda_runtime", launcher, 5, 0.5, correlation=corr))
        ev.append(K(f"k{i}_elementwise_kernel", ts, 5, corr=corr))
    return ev


@pytest.mark.parametrize("launcher", ["cudaGraphLaunch", "cudaLaunchKernel"])
def test_no_cuda_graph_advice_for_kernels_already_replayed_from_graphs(tmp_path, launcher):
    a = analyze_events(tmp_path, graph_trace(launcher))
    (s,) = a.ranks[0].steps
    assert s.idle.launch_latency == 100_000
    sgs = {x.id: x for x in suggest(a)}
    lat, tiny = sgs["launch_latency"], sgs["many_tiny_kernels"]
    graphs = launcher == "cudaGraphLaunch"
    assert lat.evidence["graph_replayed"] == (1.0 if graphs else 0.0)
    assert a.ranks[0].facts["graph_kernels"] == (3 if graphs else 0)
    # graph-replayed: the advice says so and offers no capture; launched one by one: it offers it
    assert ("Capture the step with CUDA graphs" in lat.detail) != graphs
    assert ("replay the step with CUDA graphs" in tiny.detail) != graphs
    assert all(("already replayed from CUDA graphs" in sg.detail) == graphs for sg in (lat, tiny))


def test_sglang_decode_graph_replayed_kernels_get_no_cuda_graph_advice():
    """The SGLang decode trace replays its decode step with one hipGraphLaunch: whatever idle
    ends at those kernels, no suggestion tells it to capture CUDA graphs."""
    path = real_traces() / "amd-tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
    events = raw_events(path)
    graph = {e["args"]["correlation"] for e in events if e["name"] == "hipGraphLaunch"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    replayed = sum(e["args"].get("correlation") in graph for e in kernels)
    assert replayed / len(kernels) > 0.9
    a = analyze(load([path], use_cache=False))
    assert a.ranks[0].facts["graph_kernels"] == replayed
    for sg in a.to_dict()["suggestions"]:
        assert "Capture the step with CUDA graphs" not in sg["detail"] and "replay the step with CUDA graphs" not in sg["detail"], sg["id"]


def raw_item_calls(events) -> tuple[int, int]:
    """(.item() calls in the kept steps, kept steps): aten::item, and _local_scalar_dense not
    inside an aten::item of its thread; kept steps are all but the first ProfilerStep."""
    steps = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    kept = steps[1:] or steps
    items = [(e["tid"], ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events if e["name"] == "aten::item"]
    calls = [t for _, t, _ in items]
    for e in events:
        if e["name"] == "aten::_local_scalar_dense":
            t0, t1 = ns(e["ts"]), ns(e["ts"] + e["dur"])
            if not any(tid == e["tid"] and a <= t0 and t1 <= b for tid, a, b in items):
                calls.append(t0)
    return sum(any(a <= t < b for a, b in kept) for t in calls), len(kept)


@pytest.mark.parametrize("trace", ["sample_traces/job_2ranks/rank-0.json.gz", "sample_traces/job_2ranks/rank-1.json.gz",
                                   "tests/data/traces/hta/trace_diff/control/control.json.gz"])
def test_item_calls_count_each_call_once_per_kept_step(trace):
    from tests.conftest import ROOT

    path = ROOT / trace
    calls, steps = raw_item_calls(raw_events(path))
    a = analyze(load([path], use_cache=False))
    f = a.ranks[0].facts
    assert (f["item_calls"], f["steps"]) == (calls, steps)
    sgs = {s.id: s for s in suggest(a)}
    if calls / steps >= 3:
        item = sgs["item_in_step"]
        assert item.evidence["worst"] == round(calls / steps, 4)
        per = f["item_calls_by_step"]
        best = max(per, key=lambda i: (per[i], a.ranks[0].steps[i].dur_ns))
        assert (item.evidence["where"]["step"], item.evidence["where"]["value"]) == (a.ranks[0].steps[best].step, per[best])
    else:
        assert "item_in_step" not in sgs


def test_item_calls_by_hand(tmp_path):
    # Steps [0, 100) (warm-up), [100, 200), [200, 300) µs.  aten::item with its nested
    # _local_scalar_dense at 10 (warm-up), 110, 210 and 250; a bare _local_scalar_dense at 150;
    # an aten::item at 320, after the last step.  Kept steps: 2 calls in each -> 2.0 per step
    # (counting every name in the whole trace gave (5 + 5) / 2 = 5).
    ev = []
    for i in range(3):
        ev.append(X("user_annotation", f"ProfilerStep#{i + 1}", i * 100, 100))
        ev.append(X("cuda_runtime", "cudaLaunchKernel", i * 100 + 1, 1, correlation=i + 1))
        ev.append(K("elementwise_kernel", i * 100 + 5, 50, corr=i + 1))
    for t in (10, 110, 210, 250, 320):
        ev += [X("cpu_op", "aten::item", t, 5), X("cpu_op", "aten::_local_scalar_dense", t + 1, 3)]
    ev.append(X("cpu_op", "aten::_local_scalar_dense", 150, 2))
    f = analyze_events(tmp_path, ev).ranks[0].facts
    assert (f["item_calls"], f["steps"]) == (4, 2)
    assert f["item_calls_by_step"] == {1: 2, 2: 2}


INFERENCE = ["amd-tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz", "amd-tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
             "amd-tracelens/b200/eager_trace.json.gz", "amd-tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"]
TRAINING_WORDS = ("micro-batch", "optimizer", "GradScaler", "Train in", "DDP(", "FSDP", "checkpoint", "metrics")


def raw_has_backward(events) -> bool:
    names = [str(e.get("name", "")) for e in events]
    return any("backward" in n.lower() or n.startswith(("autograd::engine", "Optimizer.")) for n in names)


@pytest.mark.parametrize("trace", INFERENCE)
def test_inference_traces_get_no_training_advice(trace):
    path = real_traces() / trace
    assert not raw_has_backward(raw_events(path))
    a = analyze(load([path], use_cache=False))
    assert a.ranks[0].facts["workload"] == "inference"
    sgs = a.to_dict()["suggestions"]
    assert sgs
    for sg in sgs:
        assert not [w for w in TRAINING_WORDS if w in sg["detail"]], (sg["id"], sg["detail"])
        assert sg["id"] not in ("optimizer_kernels", "recompute_heavy")


@pytest.mark.parametrize("trace", ["kineto-tbplugin/samples/resnet50_num_workers_0", "amd-tracelens/mi300/resnet_act_checkpoint.json.gz",
                                   "hta/trace_diff/control"])
def test_training_traces_are_told_apart(trace):
    path = real_traces() / trace
    assert raw_has_backward(raw_events(path))
    assert analyze(load([path], use_cache=False)).ranks[0].facts["workload"] == "training"


def test_no_tf32_or_bf16_advice_on_a_v100():
    """ResNet-50 in FP32 on a V100: FP16 tensor cores, no TF32, no BF16.  The precision advice
    is float16 autocast with a GradScaler, and nothing the GPU cannot do."""
    a = analyze(load([real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_0"], use_cache=False))
    assert "V100" in a.ranks[0].gpu_model
    (sg,) = [s for s in suggest(a) if s.id == "fp32_matmul"]
    assert "tf32" not in sg.detail.lower() and "bfloat16" not in sg.detail
    assert "float16" in sg.detail and "GradScaler" in sg.detail


@pytest.mark.parametrize("workload", ["training", "inference"])
def test_precision_advice_follows_the_gpu_and_the_workload(workload):
    r = rank(**fact(fp32_matmul_flops_share=1.0, has_tf32=True, has_bf16=True, workload=workload))
    (sg,) = [s for s in suggest(SimpleNamespace(ranks=[r], stragglers=())) if s.id == "fp32_matmul"]
    assert "allow_tf32" in sg.detail and "bfloat16" in sg.detail
    assert ("GradScaler" in sg.detail or "Train" in sg.detail) == (workload == "training")


def test_non_matmul_advice_names_the_class_that_dominates():
    """The HTA recommender trace (A100): embedding lookups are the largest part of the
    non-matmul bar; the advice leads with them, and `where` shows embedding kernels."""
    a = analyze(load([real_traces() / "hta/trace_diff/control"], use_cache=False))
    parts = next(b for b in a.ranks[0].waterfall.bars if b.key == "non_matmul").parts
    top = parts[0]["key"]
    assert top == "embedding"
    (sg,) = [s for s in suggest(a) if s.id == "non_matmul_heavy"]
    assert "embedding" in sg.title and sg.detail.lower().index("embedding") < min(
        sg.detail.lower().index(w) for w in ("elementwise", "normalization") if w in sg.detail.lower())
    assert sg.evidence["classes"] == {p["key"]: round(p["fraction"], 4) for p in parts}
    assert sg.evidence["where"]["show"][0] == "embedding"


def test_non_matmul_advice_by_hand():
    # non-matmul bar of 40%, of which norm 25%, elementwise 15% (over half the largest, so named
    # too): the advice leads with norms and says nothing of embeddings
    bars = (Bar("non_matmul", "", 400_000, 0.4, ({"key": "norm", "ns": 250_000, "fraction": 0.25},
                                                 {"key": "elementwise", "ns": 150_000, "fraction": 0.15})), Bar("mfu", "", 0, 0.1))
    (sg,) = [s for s in suggest(SimpleNamespace(ranks=[rank(waterfall=Waterfall(T, bars))], stragglers=())) if s.id == "non_matmul_heavy"]
    assert "norm" in sg.title and "embedding" not in sg.detail.lower()
    assert sg.detail.lower().index("norm") < sg.detail.lower().index("elementwise")


@pytest.mark.parametrize("trace", ["amd-tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", "hta/trace_diff/control",
                                   "kineto-tbplugin/samples/resnet50_num_workers_0", "amd-tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"])
def test_the_new_evidence_is_in_the_report_schema(trace):
    import jsonschema

    from tests.conftest import ROOT

    schema = json.loads((ROOT / "tracelens/model/report.schema.json").read_text())
    d = analyze(load([real_traces() / trace], use_cache=False)).to_dict()
    jsonschema.Draft202012Validator(schema).validate(d)
    keys = {k for s in d["suggestions"] for k in s["evidence"]}
    assert keys <= set(schema["properties"]["suggestions"]["items"]["properties"]["evidence"]["properties"]) | {
        "excess_ns", "last_in", "of", "p_value", "detail"}


def test_the_tui_shows_a_count_rules_step_as_a_count():
    """`where.value` of the .item() rule is that step's count of calls (HTA control: 5 in each
    kept step), so the suggestion's detail says "5 in that step", not a percentage."""
    from tracelens.tui.panes import SuggestionsPane

    d = analyze(load([real_traces() / "hta/trace_diff/control"], use_cache=False)).to_dict()
    (item,) = [s for s in d["suggestions"] if s["id"] == "item_in_step"]
    assert item["evidence"]["where"]["value"] == 5 == item["evidence"]["worst"]
    text = SuggestionsPane(d)._detail(item).plain
    assert "(5 in that step)" in text and "500" not in text


def test_a_replay_past_its_bars_bound_is_said_not_shown_as_bounded():
    """MI250 minitoy (hta/amd_trace): two rules share the change launch=0 (host launch time and
    launch latency): its replay removes both bars' time, 3.8x, past the host-launch bar's own
    1/(1-bar) of ~1.21x.  That suggestion's what_if says so (beyond_bound) and the text report
    says it beside the numbers; a replay within its bound carries no such note."""
    from tracelens.model.options import Options
    from tracelens.render.text import render_text as text_render

    d = analyze(load(sorted((real_traces() / "hta" / "amd_trace").glob("*.json.gz")), use_cache=False),
                Options(critical_path=True)).to_dict()
    wis = {s["id"]: (s["est_speedup"], s["what_if"]) for s in d["suggestions"] if s.get("what_if")}
    for est, wi in wis.values():
        past = est is not None and wi["predicted_speedup"] > est * 1.02  # (suggest.BOUND_SLACK)
        assert ("beyond_bound" in wi) == past
    est, wi = wis["host_launch_bound"]
    assert wi["change"] == "launch=0" and wi["predicted_speedup"] > 2 * est and "not bounded" in wi["beyond_bound"]
    assert "beyond this bar's bound" in text_render(d)
