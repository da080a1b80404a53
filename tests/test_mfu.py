"""MFU: model FLOPs over the GPU's dense peak and the window; the GPU table and overrides."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.conftest import real_traces
from tracelens.analysis import Options, analyze
from tracelens.analysis.rank.flops import count
from tracelens.model import gpus
from tracelens.store.job import load


def trace(tmp_path, name="NVIDIA H100 80GB HBM3", sms=132, shapes=True):
    # One step, CPU [0, 1000) µs; aten::mm [4096, 8192] x [8192, 4096] launches one GEMM kernel
    # running [100, 600) µs.  FLOPs = 2 * 4096 * 4096 * 8192 = 274877906944.
    # GPU window = [100, 1000) µs = 900 µs (the last step ends at its CPU end: the host works until then
    # in aten::add_; without it, [600, 1000) would be the untraced tail, out of the window: test_windows).
    args = {"External id": 1}
    if shapes:
        args |= {"Input Dims": [[4096, 8192], [8192, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20, "args": args},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 5,
         "args": {"External id": 1, "correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16", "pid": 0, "tid": 7, "ts": 100, "dur": 500,
         "args": {"External id": 1, "correlation": 9, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 1, "tid": 1, "ts": 600, "dur": 400},
    ]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": name, "numSms": sms}], "traceEvents": ev}))
    return p


FLOPS = 2 * 4096 * 4096 * 8192
WINDOW_S = 900e-6


def test_mfu_by_hand(tmp_path):
    a = analyze(load([trace(tmp_path)], use_cache=False))
    r = a.ranks[0]
    assert r.flops == FLOPS and r.flops_source == "shapes"
    assert r.peak_flops == pytest.approx(989.4e12)
    assert r.mfu == pytest.approx(FLOPS / (989.4e12 * WINDOW_S), rel=1e-12)
    d = a.to_dict()
    assert d["job"]["mfu"] == pytest.approx(r.mfu) and d["ranks"][0]["mfu"]["gpu_model"] == "NVIDIA H100 SXM"


def test_mig_slice_scales_the_peak(tmp_path):
    r = analyze(load([trace(tmp_path, sms=66)], use_cache=False)).ranks[0]
    assert r.peak_flops == pytest.approx(989.4e12 / 2)


def test_unknown_gpu_gives_null_and_a_warning(tmp_path):
    a = analyze(load([trace(tmp_path, name="Quadro GP100")], use_cache=False))
    assert a.ranks[0].mfu is None and a.to_dict()["job"]["mfu"] is None
    assert any("not in tracelens' peak table" in w for w in a.to_dict()["warnings"])


def test_overrides(tmp_path):
    p = trace(tmp_path, name="Quadro GP100", shapes=False)
    a = analyze(load([p], use_cache=False))
    assert a.ranks[0].mfu is None and any("shapes were not recorded" in w for w in a.to_dict()["warnings"])
    b = analyze(load([p], use_cache=False), Options(gpu="A100", model_flops_per_step=1e11))
    assert b.ranks[0].flops_source == "user" and b.ranks[0].mfu == pytest.approx(1e11 / (312e12 * WINDOW_S))
    c = analyze(load([p], use_cache=False), Options(peak_tflops=100.0, model_flops_per_step=1e10))
    assert c.ranks[0].mfu == pytest.approx(1e10 / (100e12 * WINDOW_S))
    # 1e12 FLOPs in 900 µs is 1.1 PFLOP/s, 356% of the A100's 312 TFLOP/s: not an MFU but a mistake in the number given
    e = analyze(load([p], use_cache=False), Options(gpu="A100", model_flops_per_step=1e12))
    assert e.ranks[0].mfu is None and "356%" in e.ranks[0].mfu_error


@pytest.mark.parametrize(
    "name,model",
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA GH200 480GB", "NVIDIA GH200"),
        ("NVIDIA B200", "NVIDIA B200"),
        ("NVIDIA GB200", "NVIDIA GB200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A10G", "NVIDIA A10G"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("Tesla V100-SXM2-32GB", "NVIDIA V100 SXM2"),
        ("AMD Instinct MI300X", "AMD Instinct MI300X"),
        ("AMD Instinct MI300X VF", "AMD Instinct MI300X"),
        ("AMD Instinct MI355X", "AMD Instinct MI355X"),
    ],
)
def test_gpu_names(name, model):
    spec = gpus.lookup(name)
    assert spec is not None and spec.name == model


def test_v100_has_no_bf16_and_uses_fp16():
    spec = gpus.lookup("Tesla V100-SXM2-32GB")
    assert spec.reference_dtype == "fp16" and spec.peak("bf16") == pytest.approx(125e12)


def test_real_h100_gemms_are_physically_plausible():
    """Per aten::mm/addmm on the public H100 Qwen prefill trace: FLOPs over the op's kernel
    time never exceed the BF16 peak, and the large GEMMs land near the 60-69% MFU.md 2.5 reports."""
    ev = load([real_traces() / "amd-tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"], use_cache=False).events().collect()
    counted = count(ev)
    ops = ev.select("name", "external_id").with_row_index("_row").join(counted, on="_row").drop_nulls("flops")
    kernels = (
        ev.filter(pl.col("kind") == "kernel").group_by("external_id").agg(pl.col("dur_ns").sum().alias("kernel_ns"))
    )
    eff = ops.join(kernels, on="external_id").with_columns(
        (pl.col("flops") / (pl.col("kernel_ns") / 1e9) / 989.4e12).alias("of_peak")
    )
    assert eff.height >= 100
    assert eff.get_column("of_peak").max() <= 1.0
    big = eff.filter(pl.col("flops") > 1e10)
    assert big.height > 0 and 0.55 <= big.get_column("of_peak").median() <= 0.75  # measured: 0.61


def test_waterfall_by_hand(tmp_path):
    # From test_mfu_by_hand: T = 900 µs; the GEMM kernel runs 500 µs; after it the GPU idles to
    # the step's end with nothing launched: 400 µs of idle "other".  The GEMM's FLOPs at the
    # BF16 peak take FLOPS / 989.4e12 s = 277.8 µs: matmul below peak = 500 - 277.8 µs; the op is
    # BF16 so the convention bar is 0; MFU = 277.8 / 900.
    a = analyze(load([trace(tmp_path)], use_cache=False))
    bars = {b["key"]: b for b in a.to_dict()["ranks"][0]["waterfall"]}
    ideal_ns = FLOPS / 989.4e12 * 1e9
    assert bars["idle_other"]["ns"] == 400_000 and bars["idle_other"]["fraction"] == pytest.approx(400 / 900)
    assert bars["matmul_below_peak"]["fraction"] == pytest.approx((500_000 - ideal_ns) / 900_000)
    assert bars["flop_convention"]["fraction"] == pytest.approx(0.0, abs=1e-12)
    assert bars["mfu"]["fraction"] == pytest.approx(ideal_ns / 900_000)
    assert list(bars)[-1] == "mfu"
    assert sum(b["fraction"] for b in bars.values()) == pytest.approx(1.0, abs=1e-9)


def test_waterfalls_on_real_traces_sum_to_one():
    """Every shared trace: step, rank and job waterfalls sum to 1, only the convention bar is
    signed, and the last bar is the MFU (or, where the MFU is unknown, the compute share)."""
    from tests.conftest import real_trace_files

    checked = 0
    for f in real_trace_files("hta", "amd-tracelens", "kineto-tbplugin"):
        try:
            d = analyze(load([f], use_cache=False)).to_dict()
        except Exception:
            continue
        falls = ([(d["job"]["waterfall"], d["job"]["mfu"])] + [(r["waterfall"], r["mfu"]["value"]) for r in d["ranks"]]
                 + [(s["waterfall"], s["mfu"]) for r in d["ranks"] for s in r["steps"]])
        for w, mfu in falls:
            if not w:
                continue
            assert w[-1]["key"] == ("mfu" if mfu is not None else "compute")  # MFU unknown: the GPU-time waterfall
            assert abs(sum(b["fraction"] for b in w) - 1.0) < 1e-9, f
            assert all(b["fraction"] >= -1e-12 for b in w if b["key"] != "flop_convention"), f
            for b in w:
                if b["parts"]:
                    assert sum(p["ns"] for p in b["parts"]) == b["ns"]
            checked += 1
    assert checked >= 20


def test_model_flops_from_parameters(tmp_path):
    p = trace(tmp_path, shapes=False)
    # 6·N·T with N = 1e9 parameters and T = 16 tokens: 9.6e10 FLOPs per step (MFU 10.8% of 989.4 TFLOP/s in 900 µs)
    a = analyze(load([p], use_cache=False), Options(params=1e9, tokens_per_step=16))
    r = a.ranks[0]
    assert r.flops == pytest.approx(6 * 1e9 * 16) and r.flops_source == "params: 6·N·T"
    # PaLM's attention term: + 12·L·h·S per token (L=24, h=2048, S=4096)
    b = analyze(load([p], use_cache=False), Options(params=1e9, tokens_per_step=16, seq_len=4096, layers=24, hidden=2048))
    assert b.ranks[0].flops == pytest.approx((6 * 1e9 + 12 * 24 * 2048 * 4096) * 16)
    assert b.ranks[0].mfu == pytest.approx(b.ranks[0].flops / (989.4e12 * WINDOW_S))


def test_matmul_efficiency_table(tmp_path):
    r = analyze(load([trace(tmp_path)], use_cache=False)).to_dict()["ranks"][0]
    (m,) = r["matmul_efficiency"]
    # 2.749e11 FLOPs in a 500 µs kernel: 549.8 TFLOP/s, 55.6% of 989.4
    assert m["calls"] == 1 and m["achieved_tflops"] == pytest.approx(FLOPS / 500e-6 / 1e12)
    assert m["of_peak"] == pytest.approx(FLOPS / 500e-6 / 989.4e12)
    # bytes: (4096·8192 + 8192·4096 + 4096·4096) x 2; intensity 1638 FLOP/B > ridge 989.4e12/3.35e12 = 295
    assert m["arithmetic_intensity"] == pytest.approx(FLOPS / (2 * (2 * 4096 * 8192 + 4096 * 4096)))
    assert m["bound"] == "compute"
    assert r["kernels"][0]["kclass"] == "gemm" and r["kernels"][0]["total_ns"] == 500_000


def test_recompute_on_the_mi300x_checkpointed_resnet():
    """MFU.md 2.4 / 9.8: 19 convolutions per step are recomputed on the autograd thread; the
    trace-derived model FLOPs of steps 16-17 (without them) are 0.213 TFLOP."""
    from tracelens.analysis.rank import recompute

    path = real_traces() / "amd-tracelens/mi300/resnet_act_checkpoint.json.gz"
    ev = load([path], use_cache=False).events().collect()
    rec = recompute.find(ev)
    names = ev.with_row_index("_row").join(rec.select("_row"), on="_row").get_column("name").cast(pl.String)
    assert names.to_list() == ["aten::convolution"] * 57  # 19 per step, 3 steps
    r = analyze(load([path], use_cache=False), Options(steps=(16, 17), include_warmup=True)).ranks[0]
    assert r.flops == pytest.approx(0.213e12, rel=0.005)
    assert r.recompute_flops > 0 and r.hfu > r.mfu
    bars = {b.key: b for b in r.waterfall.bars}
    assert bars["recompute"].ns > 0


def test_recompute_with_torch_checkpoint(tmp_path):
    """torch.utils.checkpoint on the CPU: the recomputed forward matmuls are found, and what is
    left is exactly FlopCounterMode's count of the same step without checkpointing."""
    import torch
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    head = torch.nn.Linear(64, 8)
    x = torch.randn(32, 64, requires_grad=True)

    def step():
        head(checkpoint(block, x, use_reentrant=False)).sum().backward()

    with FlopCounterMode(display=False) as fc:  # the same step without checkpointing: the model FLOPs
        head(block(x)).sum().backward()
    model_flops = fc.get_total_flops()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    from tracelens.analysis.rank import flops as fl
    from tracelens.analysis.rank import recompute

    ev = load([tmp_path / "t.json"], use_cache=False).events().collect()
    rec = recompute.find(ev)
    assert rec.height >= 2  # the two Linear layers of the block, run again in backward
    counted = fl.count(ev).drop_nulls("flops")
    total = counted.get_column("flops").sum()
    ops = ev.select("pid", "tid", "ts_ns").with_row_index("_row").join(counted, on="_row")
    inside = ops.join(rec.select("pid", "tid", pl.col("ts_ns").alias("rs"), "end"), on=["pid", "tid"]).filter(
        (pl.col("ts_ns") >= pl.col("rs")) & (pl.col("ts_ns") < pl.col("end"))
    )
    # the recomputed part is the block's forward (2·32·64·128 per Linear, two Linears) ...
    assert inside.get_column("flops").sum() == 2 * (2 * 32 * 64 * 128)
    # ... and the rest is exactly the model FLOPs of the step without checkpointing
    assert total - inside.get_column("flops").sum() == model_flops


@pytest.mark.parametrize(
    "rel,peak",
    [("amd-tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", 989.4e12), ("amd-tracelens/b200/eager_trace.json.gz", 2250e12)],
)
def test_matmul_efficiency_never_exceeds_the_peak(rel, peak):
    """No matmul op shape nor kernel name of the public H100 and B200 traces runs above the
    dense peak of its dtype; the B200 trace's small GEMMs (M=888) reach about 18%."""
    r = analyze(load([real_traces() / rel], use_cache=False)).to_dict()["ranks"][0]
    assert r["mfu"]["peak_flops"] == pytest.approx(peak)
    effs = [m["of_peak"] for m in r["matmul_efficiency"]] + [k["of_peak"] for k in r["kernels"] if k["of_peak"] is not None]
    assert effs and max(effs) <= 1.0
    assert all(m["achieved_tflops"] * 1e12 <= peak for m in r["matmul_efficiency"])


def test_gpu_identified_from_nsys_target_info():
    """nsys exports describe their GPUs in TARGET_INFO_GPU: the H200 (132 SMs) and the A100-SXM4-40GB
    (108 SMs) of the shared exports map to full parts; the 2022 CPU-only export has no GPU table."""
    from tracelens.parsers.nsys import target_gpus

    from tests.conftest import real_traces
    from tracelens.model import gpus

    nsys = real_traces() / "nsys"
    h200 = target_gpus(nsys / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite")
    assert [(g["id"], g["name"], g["numSms"]) for g in h200] == [(0, "NVIDIA H200", 132)]
    assert h200[0]["memoryBandwidth"] == 4916736000000
    spec, why = gpus.identify(h200[0], h200[0]["name"])
    assert why is None and spec.name == "NVIDIA H200 SXM" and spec.scale == 1.0 and spec.peak("bf16") == 989.4e12
    a100 = target_gpus(nsys / "pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite")
    spec, why = gpus.identify(a100[0], a100[0]["name"])
    assert a100[0]["numSms"] == 108 and spec.name == "NVIDIA A100 40GB" and spec.scale == 1.0
    assert spec.mem_tbps * 1e12 == pytest.approx(a100[0]["memoryBandwidth"], rel=0.01)  # 1.555 TB/s, as nsys measured
    assert target_gpus(nsys / "generated_nsys2022.4.2.1_cpu_nvtx_osrt_demo.sqlite") == []
    # a MIG-like slice (fewer SMs than the full part) scales the peaks
    spec, _ = gpus.identify({**h200[0], "numSms": 66}, "NVIDIA H200")
    assert spec.scale == 0.5 and spec.peak("bf16") == 989.4e12 / 2


def test_fp32_ops_on_tf32_tensor_cores_are_held_to_the_tf32_peak():
    """The two-rank job's FP32 matmuls run CUTLASS s1688 (TF32 tensor-op) kernels, except a few on
    ampere_sgemm (SIMT FP32).  On an A100 (FP32 19.5, TF32 156 TFLOP/s) some reach more TFLOP/s than
    FP32 can, so they must be TF32: they are held to the TF32 peak and none exceeds 100%."""
    from tests.conftest import SAMPLE_TRACES
    from tracelens.analysis import Options, analyze
    from tracelens.store.job import load

    d = analyze(load([SAMPLE_TRACES / "job_2ranks"]), Options(gpu="A100")).to_dict()
    rows = [m for r in d["ranks"] for m in r["matmul_efficiency"]]
    tf32 = [m for m in rows if m["dtype"] == "tf32"]
    fp32 = [m for m in rows if m["dtype"] == "fp32"]
    assert tf32 and fp32
    assert max(m["achieved_tflops"] for m in tf32) > 19.5  # faster than FP32 can go: tensor cores
    assert all(m["of_peak"] is None or m["of_peak"] <= 1.0 for m in rows)
    # an FP32 shape faster than FP32 can go (its GEMM kernel's launch is missing from the sampled trace): flagged, not shown
    assert all(m["achieved_tflops"] <= 19.5 or (m["above_peak"] and m["of_peak"] is None) for m in fp32)
