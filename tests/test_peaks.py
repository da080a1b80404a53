"""Peaks: matmul time without FLOPs, the FLOP coverage of the MFU, impossible values, one
definition of "% of peak" (the dtype's own peak) everywhere, the convention bar's name, and the
checks on what the user gives (issue 13, items 2-4)."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLE_TRACES, real_traces
from tracelens.analysis import Options, analyze
from tracelens.analysis.rank.flops import op_flops
from tracelens.analysis.waterfall import BEYOND_PEAK, NO_FLOPS
from tracelens.model.kclass import classify
from tracelens.render import render_text
from tracelens.render import tables as views
from tracelens.store.job import load

H100_BF16, H100_FP8 = 989.4e12, 1978.9e12
A100_BF16, A100_TF32, A100_FP32 = 312e12, 156e12, 19.5e12


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(op, kernel, ts, dur, corr, op_ts=None, stream=7, **op_args):
    """A CPU op (None: no op) whose launch at its start + 2 µs runs ``kernel`` at [ts, ts + dur) µs."""
    t = (ts - 50) if op_ts is None else op_ts
    ev = [] if op is None else [X("cpu_op", op, t, 20, **op_args)]
    ev.append(X("cuda_runtime", "cudaLaunchKernel", t + 2, 5, correlation=corr))
    ev.append(X("kernel", kernel, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=corr))
    return ev


def write(tmp_path, events, gpu="NVIDIA H100 80GB HBM3", sms=132, name="rank-0.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": gpu, "numSms": sms}], "traceEvents": events}))
    return p


def mm_args(m, k, n, dtype="c10::BFloat16"):
    return {"Input Dims": [[m, k], [k, n]], "Input type": [dtype, dtype]}


def bars(d, rank=0):
    return {b["key"]: b for b in d["ranks"][rank]["waterfall"]}


def parts(bar):
    return {p["key"]: p["ns"] for p in bar["parts"]}


# --- item 2: matmul kernel time without FLOPs -----------------------------------------------

def custom_attention_trace(tmp_path):
    # One step, CPU [0, 1000) µs, H100.  aten::mm [4096, 8192] x [8192, 4096] bf16 runs a GEMM kernel
    # [100, 600) µs: 2·4096·4096·8192 = 2.749e11 FLOPs, 277.8 µs at the BF16 peak.  A custom op with no
    # counted FLOPs (mylib::attention) runs a FlashAttention kernel [600, 900) µs.  GPU window [100, 1000):
    # 900 µs.  Matmul-class time 800 µs, of it 500 µs with FLOPs: coverage 500/800 = 0.625.
    # Matmul below peak = 800 - 277.8 µs: 300 µs of it are the kernel without FLOPs, 222.2 µs the GEMM's.
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    ev += launch("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32", 100, 500, 9, op_ts=10, **mm_args(4096, 8192, 4096))
    ev += launch("mylib::attention", "void flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", 600, 300, 10, op_ts=40)
    return write(tmp_path, ev)


def test_matmul_time_without_flops_is_its_own_part(tmp_path):
    d = analyze(load([custom_attention_trace(tmp_path)], use_cache=False)).to_dict()
    flops = 2 * 4096 * 4096 * 8192
    ideal_ns = flops / H100_BF16 * 1e9
    below = bars(d)["matmul_below_peak"]
    assert below["ns"] == round(800_000 - ideal_ns)
    p = parts(below)
    assert p[NO_FLOPS] == 300_000  # the attention kernel's time, exactly: never spread over the GEMM's shape
    (shape,) = [k for k in p if k != NO_FLOPS]
    assert shape.startswith("aten::mm [[4096, 8192], [8192, 4096]]") and p[shape] == below["ns"] - 300_000
    (m,) = d["ranks"][0]["matmul_efficiency"]
    assert p[shape] <= m["kernel_ns"] - m["ideal_ns"] + 1  # a shape's part never exceeds its own kernels' time
    mfu = d["ranks"][0]["mfu"]
    assert mfu["flops_coverage"] == pytest.approx(0.625) and mfu["lower_bound"] is True and mfu["above_peak"] is False
    assert mfu["matmul_ns"] == 800_000 and mfu["matmul_without_flops_ns"] == 300_000
    assert d["job"]["flops_coverage"] == pytest.approx(0.625) and d["job"]["mfu_lower_bound"] is True
    (w,) = [w for w in d["warnings"] if "lower bound" in w]
    assert "62.5%" in w and "flash_fwd_kernel" in w and str(tmp_path) in w
    assert sum(b["fraction"] for b in d["ranks"][0]["waterfall"]) == pytest.approx(1.0, abs=1e-9)
    # next to the MFU in every front end: text, HTML, TUI headline (all from views.headline / mfu_note)
    note = "a lower bound: FLOPs known for 62.5% of the matmul kernel time"
    assert views.headline(d)["mfu_note"] == note
    text = render_text(d)
    mfu_line = text.splitlines().index(next(ln for ln in text.splitlines() if ln.startswith("MFU:")))
    assert note in text.splitlines()[mfu_line + 1]
    from tracelens.render.html import render_html

    page = render_html(d).decode()
    summary = page[page.index('id="summary"'):page.index("</div></div></div>", page.index('id="summary"'))]
    assert note in summary
    from tracelens.tui.panes import OverviewPane

    assert note in OverviewPane._headline(None, views.headline(d)).plain


@pytest.mark.parametrize("rel", [
    # FP8 fmhaSm100a attention kernels under vllm::unified_attention and the MoE expert GEMMs (bmm_*) of
    # vllm::moe_forward, whose recorded inputs hold no expert weights: no FLOPs
    "amd-tracelens/b200/eager_trace.json.gz",
    "amd-tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",  # GEMMs run before the recorded ops began: no FLOPs
    "amd-tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",  # every matmul kernel has its op: coverage 1
])
def test_flops_coverage_on_real_traces(rel):
    """On the B200 trace the matmul-below-peak bar was split over four GEMM shapes whose kernels took
    0.79 ms (one shape shown with 0.40 ms where its kernels ran 0.29 ms): the 0.49 ms of FP8 attention
    kernels without FLOPs were spread over them (5.7 ms, with the MoE expert GEMMs now classed as
    GEMMs).  Now that time is its own part, each shape's part fits in its kernels' time beyond peak,
    and the MFU says it is a lower bound (FLOPs known for 12.2% of the matmul kernel time)."""
    d = analyze(load([real_traces() / rel], use_cache=False)).to_dict()
    r = d["ranks"][0]
    m = r["mfu"]
    assert m["matmul_ns"] > 0 and 0 <= m["matmul_without_flops_ns"] <= m["matmul_ns"]
    assert m["flops_coverage"] == pytest.approx(1 - m["matmul_without_flops_ns"] / m["matmul_ns"])
    assert m["lower_bound"] == (m["matmul_without_flops_ns"] > 0)
    lower = [w for w in d["warnings"] if "is a lower bound" in w and "matmul-class kernel time" in w]
    assert bool(lower) == m["lower_bound"]
    below = bars(d)["matmul_below_peak"]
    p = parts(below)
    assert p.get(NO_FLOPS, 0) == m["matmul_without_flops_ns"]
    assert sum(p.values()) == below["ns"]
    rows = {f"{x['op']} {x['shapes']} {x['dtype']}": x for x in r["matmul_efficiency"]}
    for key, ns in p.items():
        if key in rows:
            # (within rounding: the bar is union time, the shapes' weights sums of kernel durations)
            assert ns <= (rows[key]["kernel_ns"] - rows[key]["ideal_ns"]) * 1.001 + 2, key
    if "b200" in rel:
        # the FP8 attention kernels alone: 485.8 µs without FLOPs of 1.27 ms (61.8%); with the MoE GEMMs 12.2%
        assert m["flops_coverage"] < 0.65 and m["matmul_without_flops_ns"] >= 485_821 and "matmul-class kernel time" in lower[0]
        assert max(p[k] for k in p if k != NO_FLOPS) <= 235_049 + 2  # the largest shape part, bounded by its kernels
        assert d["job"]["mfu_lower_bound"] and "lower bound" in views.headline(d)["mfu_note"]
    if "bert" in rel:
        assert m["flops_coverage"] == 1.0 and not views.headline(d)["mfu_note"]


@pytest.mark.parametrize("name,cls", [
    ("void qk_int_sv_f8_attn_kernel<128u, 64u, 16u, 64u>(signed char*, signed char*)", "attention"),  # SageAttention
    ("void qk_int_sv_f16_attn_kernel<128u, 64u>(signed char*)", "attention"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<KernelTraits<1>>", "attention"),
    ("void flashinfer::SingleDecodeWithKVCacheKernel<true, 4u>", "attention"),
    ("void flashinfer::PODWithKVCacheTensorKernel<KTraits>", "attention"),
    ("void flashinfer::mla::BatchMLAPagedAttentionKernel<x>", "attention"),
    ("ck_tile::kentry<ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVS>>", "attention"),  # AMD ck_tile FMHA
    ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm100FlashAttentionForwardSm100_object", "attention"),  # FA4
    ("masked_multihead_attention_kernel<float, 128>", "attention"),  # TensorRT-LLM MMHA
    ("_fwd_kernel_stage1", "attention"),  # SGLang Triton decode attention
    ("_fwd_grouped_kernel_stage1", "attention"),
    ("_fwd_kernel", "attention"),  # SGLang/vLLM Triton prefill
    ("triton_poi_fused_attn_mask_0", "elementwise"),  # an inductor kernel *about* attention is not attention
    ("my_fwd_kernel", "other"),
])
def test_custom_attention_kernels_are_attention(name, cls):
    assert classify(name) == cls


def test_attention_flops_from_the_launching_ops_shapes():
    """Attention below the SDPA wrappers or as a library op: 2·B·H·S_q·S_k·(D + D_v) forward,
    2·B·H·S_q·S_k·(3·D + 2·D_v) backward (FlopCounterMode's convention), layout [B, S, H, D]."""
    q = [2, 1024, 16, 64]
    fwd = 2 * 2 * 16 * 1024 * 1024 * (64 + 64)
    bwd = 2 * 2 * 16 * 1024 * 1024 * (3 * 64 + 2 * 64)
    assert op_flops("aten::_flash_attention_forward", {"Input Dims": [q, q, q, [], [], [], []]}) == fwd
    assert op_flops("flash_attn::_flash_attn_forward", {"Input Dims": [q, q, q]}) == fwd
    assert op_flops("aten::_efficient_attention_forward", {"Input Dims": [q, q, q, [], [], []]}) == fwd
    assert op_flops("aten::_flash_attention_backward", {"Input Dims": [q, q, q, q, q, [2, 16, 1024]]}) == bwd
    assert op_flops("flash_attn::_flash_attn_backward", {"Input Dims": [q, q, q, q, q]}) == bwd
    # GQA: 4 key/value heads for 16 query heads: the query's heads count
    kv = [2, 1024, 4, 64]
    assert op_flops("aten::_flash_attention_forward", {"Input Dims": [q, kv, kv]}) == fwd
    # packed variable-length calls: the per-sequence lengths are in no shape, so unknown, not guessed
    assert op_flops("aten::_flash_attention_forward", {"Input Dims": [[2048, 16, 64], [2048, 16, 64], [2048, 16, 64], [3], [3]]}) is None
    assert op_flops("aten::_efficient_attention_forward", {"Input Dims": [[1, 2048, 16, 64]] * 3 + [[], [3], [3]]}) is None
    # SageAttention: the layout is its tensor_layout argument (0: [B, S, H, D], 1: [B, H, S, D]); forward 4·B·H·S_q·S_k·D
    sage = 4 * 2 * 16 * 1024 * 1024 * 64
    dims_hnd = [[2, 16, 1024, 64], [2, 16, 1024, 64], [2, 16, 1024, 64], [2, 16, 1024, 64], [2, 16, 16], [2, 16, 8], [], [], [], [], []]
    conc = [""] * 6 + ["1", "0", "2", "0.125", "0"]
    assert op_flops("sageattention::qk_int8_sv_f16_accum_f32_attn", {"Input Dims": dims_hnd, "Concrete Inputs": conc}) == sage
    dims_nhd = [[2, 1024, 16, 64]] * 4 + [[2, 16, 16], [2, 16, 8], [2, 16, 64], [], [], [], [], []]  # with a value scale
    conc = [""] * 7 + ["0", "1", "2", "0.125", "0"]
    assert op_flops("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn", {"Input Dims": dims_nhd, "Concrete Inputs": conc}) == sage
    assert op_flops("sageattention::qk_int8_sv_f16_accum_f32_attn", {"Input Dims": dims_hnd}) is None  # layout not recorded


def test_sage_attention_op_and_kernel_have_their_flops(tmp_path):
    # A SageAttention op (HND, B=2, H=16, S=1024, D=64: 4·2·16·1024²·64 = 8.59e9 FLOPs) runs its CUDA kernel
    # for 100 µs: the kernel is attention-class, its FLOPs known from the op, so coverage is 1.
    sage_args = {"Input Dims": [[2, 16, 1024, 64]] * 4 + [[2, 16, 16], [2, 16, 8], [], [], [], [], []],
                 "Input type": ["signed char", "signed char", "c10::Half", "c10::Half", "float", "float", "Scalar", "Scalar", "Scalar",
                                "Scalar", "Scalar"],
                 "Concrete Inputs": [""] * 6 + ["1", "0", "2", "0.125", "0"]}
    ev = [X("user_annotation", "ProfilerStep#1", 0, 400)]
    ev += launch("sageattention::qk_int8_sv_f16_accum_f32_attn", "void qk_int_sv_f16_attn_kernel<128u, 64u>(signed char*)",
                 100, 100, 5, op_ts=10, **sage_args)
    d = analyze(load([write(tmp_path, ev)], use_cache=False)).to_dict()
    r = d["ranks"][0]
    assert r["kernels"][0]["kclass"] == "attention" and r["kernels"][0]["flops"] == 4 * 2 * 16 * 1024 * 1024 * 64
    assert r["mfu"]["model_flops"] == 4 * 2 * 16 * 1024 * 1024 * 64 and r["mfu"]["flops_coverage"] == 1.0


# --- item 3: impossible values --------------------------------------------------------------

def test_above_peak_shapes_are_flagged_on_the_v100_resnet():
    """The 2021 V100 ResNet-50 runs its 3x3 FP32 convolutions with Winograd kernels, which do fewer
    FLOPs than the direct count: before, the matmul table showed up to 300% of the FP32 peak (and the
    kernel table 155%) as fact.  Now no row shows more than 100%; those rows are flagged, ranked
    last, named in a warning, and their excess is a negative part of the convention bar."""
    d = analyze(load([real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_0"], use_cache=False)).to_dict()
    r = d["ranks"][0]
    rows, kernels = r["matmul_efficiency"], r["kernels"]
    assert all(x["of_peak"] is None or x["of_peak"] <= 1.0 for x in rows + kernels)
    assert all(x["of_peak"] is None for x in rows + kernels if x.get("above_peak"))
    flagged = [x for x in rows if x["above_peak"]]
    assert flagged and all(x["achieved_tflops"] * 1e12 > x["peak_flops"] for x in flagged)
    assert [x["above_peak"] for x in rows] == sorted(x["above_peak"] for x in rows)  # flagged rows after the ranked ones
    (w,) = [w for w in d["warnings"] if "above 100% of the peak of their dtype" in w]
    worst = max(flagged, key=lambda x: x["kernel_ns"])
    assert worst["op"] in w and worst["shapes"][:80] in w and "Winograd" in w
    assert r["mfu"]["above_peak"] and d["job"]["mfu_above_peak"]
    assert parts(bars(d)["flop_convention"])[BEYOND_PEAK] < 0
    assert "possibly overstated" in views.headline(d)["mfu_note"]
    assert all(not k["above_peak"] or views.peak_text(k) == "⚠ >100%" for k in views.kernel_rows(d))


def test_flops_with_no_kernel_are_flagged_on_the_sglang_capture_trace():
    """SGLang's CUDA-graph capture trace records 145 aten::mm ops with shapes while no matmul kernel
    runs (they are captured, not run): before, it reported an MFU of 1.13% with a compute share of
    0.03% and no warning.  Now the MFU is flagged, the ops are named, and the convention bar's
    negative part holds exactly the FLOPs that fit in no kernel time."""
    d = analyze(load([real_traces() / "amd-tracelens/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz"],
                     use_cache=False)).to_dict()
    r = d["ranks"][0]
    g = r["gpu_time_ns"]
    assert r["mfu"]["value"] > g["compute"] / r["window_ns"]  # impossible as a fact ...
    assert r["mfu"]["above_peak"] and d["job"]["mfu_above_peak"]  # ... so flagged
    (w,) = [w for w in d["warnings"] if "launched no matmul kernel" in w]
    assert "aten::mm x145" in w and "100.0% of the model FLOPs" in w
    b = bars(d)
    assert parts(b["flop_convention"]) == {BEYOND_PEAK: -b["mfu"]["ns"]}
    assert b["flop_convention"]["label"].startswith("FLOPs beyond peak")


def test_ops_over_peak_in_a_hand_built_trace(tmp_path):
    # H100.  An FP32 mm [4096, 4096] x [4096, 4096] (1.374e11 FLOPs) in a 500 µs kernel named like a SIMT
    # SGEMM: 274.9 TFLOP/s, 411% of the FP32 peak (66.9): its dtype must be wrong (TF32 not recognised).
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    ev += launch("aten::mm", "sm90_sgemm_128x64_nn", 100, 500, 3, op_ts=10, **mm_args(4096, 4096, 4096, "float"))
    d = analyze(load([write(tmp_path, ev)], use_cache=False)).to_dict()
    (m,) = d["ranks"][0]["matmul_efficiency"]
    assert m["above_peak"] and m["of_peak"] is None and m["peak_flops"] == pytest.approx(66.9e12)
    assert d["ranks"][0]["kernels"][0]["above_peak"] and d["ranks"][0]["kernels"][0]["of_peak"] is None
    (w,) = [w for w in d["warnings"] if "above 100%" in w]
    assert "aten::mm [[4096, 4096], [4096, 4096]] fp32 at 411% of the FP32 peak" in w
    # the op is held to its kernel's time: ideal 1.374e11 / 66.9e12 = 2054 µs -> 500 µs; the rest, -1554 µs, is
    # the convention bar's negative part, next to the FP32 part (+ the same FLOPs at FP32 minus at BF16 peak)
    flops = 2 * 4096 ** 3
    conv = parts(bars(d)["flop_convention"])
    assert conv[BEYOND_PEAK] == pytest.approx(500_000 - flops / 66.9e12 * 1e9, abs=1)
    assert conv["fp32"] == pytest.approx(flops / 66.9e12 * 1e9 - flops / H100_BF16 * 1e9, abs=1)
    assert bars(d)["matmul_below_peak"]["ns"] == 0


def cli(args, capsys):
    from tracelens.cli import main

    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("flags,says", [
    (["--peak-tflops", "0"], "--peak-tflops 0: must be a positive number"),
    (["--peak-tflops", "-5"], "--peak-tflops -5: must be a positive number"),
    (["--peak-tflops", "nan"], "--peak-tflops nan: must be a positive number"),
    (["--peak-tflops", "inf"], "--peak-tflops inf: must be a positive number"),
    (["--model-flops-per-step", "0"], "--model-flops-per-step 0: must be a positive number"),
    (["--params=-1e9", "--tokens-per-step", "16"], "--params -1e+09: must be a positive number"),
    (["--params", "1e9"], "--params needs --tokens-per-step too"),
    (["--tokens-per-step", "4096"], "--tokens-per-step needs --params too"),
    (["--params", "1e9", "--tokens-per-step", "16", "--seq-len", "4096"], "--seq-len, --layers and --hidden go together"),
    (["--model-flops-per-step", "1e10", "--params", "1e9", "--tokens-per-step", "16"], "give the model FLOPs one way"),
    # 1e15 FLOPs in the 900 µs window at 312 TFLOP/s: 356,125% of the A100's peak
    (["--gpu", "A100", "--model-flops-per-step", "1e15"], "--model-flops-per-step 1e+15 with --gpu A100 gives an MFU of 356125% on rank 0"),
    # 6 · 1e12 · 4096 = 2.46e16 FLOPs: 2,761,517% of the H100's 989.4 TFLOP/s
    (["--params", "1e12", "--tokens-per-step", "4096"], "--params 1e+12 --tokens-per-step 4096 gives an MFU of"),
    # the trace's FLOPs (2.749e11) over a user peak of 1 TFLOP/s for 900 µs: 30,542%
    (["--peak-tflops", "1"], "--peak-tflops 1 TFLOP/s gives an MFU of 30542%"),
])
def test_numbers_the_user_gives_are_checked(tmp_path, capsys, flags, says):
    """Zero, negative, NaN or infinite peaks and FLOPs, options that only mean something together,
    and FLOPs or peaks that make the MFU exceed 100%: a usage error, one line, exit 2, nothing written."""
    from tests.test_mfu import trace

    out = tmp_path / "r.json"
    rc, stdout, err = cli(["report", trace(tmp_path), "--config", "none", "-o", out, *flags], capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("tracelens: error: ") and says in err, err
    assert not out.exists() and stdout == ""


def test_a_user_flops_mfu_over_100_is_null_in_the_analysis(tmp_path):
    """The API (and so the TUI) never shows it either: the MFU is null and says why."""
    from tests.test_mfu import trace

    d = analyze(load([trace(tmp_path)], use_cache=False), Options(gpu="A100", model_flops_per_step=1e15)).to_dict()
    assert d["job"]["mfu"] is None and all(s["mfu"] is None for s in d["ranks"][0]["steps"])
    assert d["job"]["waterfall_kind"] == "gpu_time" and d["job"]["waterfall"][-1]["key"] == "compute"  # no MFU waterfall
    assert "356125%" in views.headline(d)["why_unknown"]


# --- item 4: one definition of % of peak ---------------------------------------------------

def test_percent_of_peak_is_against_the_dtype_it_ran_at_in_every_front_end():
    """The two-rank A100 job runs FP32 matmuls on TF32 tensor-op kernels (CUTLASS s1688) and on SIMT
    SGEMM.  Before, the kernel table of the TUI and the HTML held every kernel to the 312 TFLOP/s
    BF16 peak (the JSON to the dtype's): a TF32 kernel at 50 TFLOP/s showed 16% on screen and 32% in
    the JSON.  Now each kernel's and shape's share is of its own dtype's peak, the same everywhere."""
    d = analyze(load([SAMPLE_TRACES / "job_2ranks"]), Options(gpu="A100")).to_dict()
    own = {"tf32": A100_TF32, "fp32": A100_FP32}
    rows = views.kernel_rows(d)
    checked = 0
    for k in rows:
        if k["dtype"] in own and k["of_peak"] is not None:
            assert k["of_peak"] == pytest.approx(k["tflops"] * 1e12 / own[k["dtype"]], rel=1e-9)
            checked += 1
    assert checked >= 5 and {k["dtype"] for k in rows if k["of_peak"]} >= {"tf32", "fp32"}
    # one rank: the view's share is the rank's JSON row's, kernel by kernel
    one = analyze(load([SAMPLE_TRACES / "job_2ranks" / "rank-0.json.gz"]), Options(gpu="A100")).to_dict()
    view = {v["name"]: v for v in views.kernel_rows(one)}
    for k in one["ranks"][0]["kernels"]:
        assert view[k["name"]]["of_peak"] == pytest.approx(k["of_peak"], rel=1e-12) if k["of_peak"] is not None else \
            view[k["name"]]["of_peak"] is None
    for m in views.matmul_rows(d):
        if m["of_peak"] is not None:
            assert m["of_peak"] == pytest.approx(m["achieved_tflops"] * 1e12 / own[m["dtype"]], rel=1e-9)
    # the HTML tables show exactly the views' numbers
    from tracelens.model.units import fmt_pct
    from tracelens.render.html import render_html

    page = render_html(d).decode()
    top = next(k for k in rows if k["of_peak"] is not None)
    from html import escape

    row = page[page.index(f'title="{escape(top["name"])}"'):]
    row = row[:row.index("</tr>")]
    assert f">{fmt_pct(top['of_peak'])}</td>" in row


def test_the_roofline_draws_a_roof_per_dtype_and_agrees_with_its_bound_labels():
    """Before, the roofline drew one roof at the 312 TFLOP/s BF16 peak (ridge 153 FLOP/B) while each
    point's "bound" came from its own dtype's ridge: FP32 shapes at 14 FLOP/B were labelled compute-
    bound under a roof that said memory-bound.  Now each dtype has its roof (TF32 ridge 76.5, FP32
    9.56 FLOP/B on the A100's 2.039 TB/s) and every label agrees with the ridge of its own roof."""
    from tracelens.render.html import render_html

    d = analyze(load([SAMPLE_TRACES / "job_2ranks"]), Options(gpu="A100")).to_dict()
    svg = render_html(d).decode()
    svg = svg[svg.index('<svg id="roofline"'):]
    svg = svg[:svg.index("</svg>")]
    roofs = {m.group(1): (float(m.group(2)), float(m.group(3)))
             for m in re.finditer(r'class="roof" data-dtype="(\w+)" data-peak="([^"]+)" data-ridge="([^"]+)"', svg)}
    bw = d["ranks"][0]["device"]["peak_bandwidth"]
    assert roofs.keys() == {"TF32", "FP32"}
    assert roofs["TF32"] == (A100_TF32, pytest.approx(A100_TF32 / bw)) and roofs["FP32"] == (A100_FP32, pytest.approx(A100_FP32 / bw))
    points = re.findall(r'<circle [^>]*data-dtype="(\w+)" data-bound="(\w+)" data-ai="([^"]+)"', svg)
    assert len(points) >= 10
    for dt, bound, ai in points:
        assert bound == ("memory" if float(ai) < roofs[dt][1] else "compute"), (dt, bound, ai)
    assert any(dt == "FP32" and bound == "compute" and float(ai) < A100_BF16 / bw for dt, bound, ai in points)


def test_convention_bar_is_named_for_what_it_measures(tmp_path):
    # A100.  An FP32 mm [2048, 2048] x [2048, 2048] (1.718e10 FLOPs) on a SIMT SGEMM for 1000 µs (17.2 TFLOP/s,
    # 88% of the FP32 peak): at the FP32 peak it takes 881 µs, at the BF16 reference 55 µs.  The convention
    # bar is those 881 - 55 = 826 µs: FP32 math instead of tensor cores, and it says so in every front end.
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1500)]
    ev += launch("aten::mm", "ampere_sgemm_128x64_nn", 100, 1000, 3, op_ts=10, **mm_args(2048, 2048, 2048, "float"))
    d = analyze(load([write(tmp_path, ev, gpu="NVIDIA A100-SXM4-80GB", sms=108)], use_cache=False)).to_dict()
    flops = 2 * 2048 ** 3
    conv = bars(d)["flop_convention"]
    assert conv["label"] == "FP32 math instead of tensor cores"
    assert parts(conv) == {"fp32": conv["ns"]}
    assert conv["ns"] == round(flops / A100_FP32 * 1e9 - flops / A100_BF16 * 1e9)
    assert "FP32/TF32 matmuls cannot reach the 16-bit peak" in conv["note"]
    assert d["job"]["waterfall"][-2]["label"] == conv["label"] and d["job"]["waterfall"][-2]["note"] == conv["note"]
    assert f"({conv['note']})" in render_text(d)
    from tracelens.render.html import render_html

    assert conv["note"] in render_html(d).decode()
    # the same op on a TF32 tensor-op kernel: held to the TF32 peak, and the bar says TF32
    ev2 = [X("user_annotation", "ProfilerStep#1", 0, 1500)]
    ev2 += launch("aten::mm", "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", 100, 300, 3, op_ts=10,
                  **mm_args(2048, 2048, 2048, "float"))
    (tmp_path / "b").mkdir()
    d2 = analyze(load([write(tmp_path / "b", ev2, gpu="NVIDIA A100-SXM4-80GB", sms=108)], use_cache=False)).to_dict()
    conv2 = bars(d2)["flop_convention"]
    assert conv2["label"] == "TF32 math, below the 16-bit peak" and set(parts(conv2)) == {"tf32"}
    assert d2["ranks"][0]["matmul_efficiency"][0]["of_peak"] == pytest.approx(flops / 300e-6 / A100_TF32)


def test_v100_resnet_convention_bar_names_fp32_and_the_over_count():
    d = analyze(load([real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_0"], use_cache=False)).to_dict()
    conv = {b["key"]: b for b in d["job"]["waterfall"]}["flop_convention"]
    assert set(parts(conv)) == {"fp32", BEYOND_PEAK} and parts(conv)["fp32"] > 0 > parts(conv)[BEYOND_PEAK]
    assert conv["label"] == "precision and FLOP convention (signed)" and "over-counted" in conv["note"]


# --- the property: for any generated trace ---------------------------------------------------

KERNELS = {  # kind -> (kernel name, op, input dtype)
    "bf16": ("sm90_xmma_gemm_bf16bf16_bf16f32", "aten::mm", "c10::BFloat16"),
    "fp8": ("sm90_xmma_gemm_e4m3e4m3_bf16f32", "aten::_scaled_mm", "c10::Float8_e4m3fn"),
    "fp32": ("sm90_sgemm_128x64_nn", "aten::mm", "float"),
    "tf32": ("cutlass_80_tensorop_s1688gemm_64x64", "aten::mm", "float"),
    "attn": ("void flash_fwd_kernel<Flash_fwd_kernel_traits>", None, None),  # no op: no FLOPs
    "comm": ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", None, None),
    "norm": ("layer_norm_kernel", None, None),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 2000), st.integers(1, 150), st.sampled_from(sorted(KERNELS)), st.sampled_from([7, 8]),
                  st.sampled_from([64, 512, 4096]), st.sampled_from([256, 2048, 8192]), st.sampled_from([128, 1024, 4096])),
        min_size=1, max_size=16,
    ),
    st.integers(1, 3),
)
# a step without kernels whose CPU span opens before the step before it has started its first kernel: its window
# began there, before that step's, and that step's window was empty (its MFU null, so the rank's waterfall was
# its GPU-time one while the rank's MFU was known)
@example(kernels=[(0, 1, "attn", 7, 64, 256, 128)] * 4 + [(1513, 1, "bf16", 7, 64, 256, 128)], n_steps=3)
def test_no_percent_of_peak_above_one_unless_named_and_mfu_within_compute(kernels, n_steps):
    """Generated H100 traces, with shapes from tiny to far beyond what their kernel time allows: no %
    of peak above 1 is shown (a row above is flagged, its share null, and a warning counts and names
    it), the MFU is at most the compute share of the window (FP8 counted at its peak, twice the BF16
    reference) unless a warning says some FLOPs exceed peak, coverage and lower bound agree, and every
    waterfall still sums to 1 with parts that sum to their bar."""
    import tempfile
    from pathlib import Path

    span = 2300 // n_steps
    ev = [X("user_annotation", f"ProfilerStep#{i}", i * span, span) for i in range(n_steps)]
    kinds = set()
    for j, (ts, dur, kind, stream, m, k, n) in enumerate(kernels):
        name, op, dtype = KERNELS[kind]
        args = {"Input Dims": [[m, k], [k, n]], "Input type": [dtype, dtype]} if op else {}
        ev += launch(op, name, ts + 50, dur, j + 1, op_ts=ts, stream=stream, **args)
        kinds.add(kind)
    with tempfile.TemporaryDirectory() as tmp:
        d = analyze(load([write(Path(tmp), ev)], use_cache=False)).to_dict()
    r = d["ranks"][0]
    windows = [(s["start_ns"], s["start_ns"] + s["dur_ns"]) for s in r["steps"]]
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:])), windows  # the steps' windows tile: none overlaps another
    warned = " ".join(d["warnings"])
    flagged = [x for x in r["matmul_efficiency"] if x["above_peak"]]
    for x in r["matmul_efficiency"] + r["kernels"] + views.kernel_rows(d) + views.matmul_rows(d):
        assert x["of_peak"] is None or x["of_peak"] <= 1.0
        assert not x.get("above_peak") or x["of_peak"] is None
    if flagged:
        assert f"{len(flagged)} matmul op shape(s) run above 100%" in warned
        worst = max(flagged, key=lambda x: x["kernel_ns"])
        assert f"{worst['op']} {worst['shapes']}" in warned
    if any(k["above_peak"] for k in r["kernels"]):
        assert "above 100%" in warned and r["mfu"]["above_peak"]
    m = r["mfu"]
    if m["value"] is not None:
        g = r["gpu_time_ns"]
        allowance = H100_FP8 / H100_BF16 if "fp8" in kinds else 1.0
        if not m["above_peak"]:
            assert m["value"] <= allowance * g["compute"] / r["window_ns"] + 1 / r["window_ns"]  # (an excess under 1 ns rounds away)
        else:
            assert "possibly overstated" in views.headline(d)["mfu_note"] and ("above 100%" in warned or "no matmul kernel" in warned
                                                                 or "more time at their dtypes' peak" in warned)
        for w in [d["job"]["waterfall"], r["waterfall"]] + [s["waterfall"] for s in r["steps"]]:
            if w:
                assert abs(sum(b["fraction"] for b in w) - 1.0) < 1e-9 and w[-1]["key"] == "mfu"
                assert all(b["fraction"] >= -1e-12 for b in w if b["key"] != "flop_convention")
                for b in w:
                    if b["parts"]:
                        assert sum(p["ns"] for p in b["parts"]) == b["ns"], b
        if r["waterfall"]:
            assert parts(bars(d)["matmul_below_peak"]).get(NO_FLOPS, 0) == (m["matmul_without_flops_ns"] or 0)
            assert bars(d)["mfu"]["fraction"] == pytest.approx(m["value"], rel=1e-9, abs=1e-15)  # the waterfall ends at the rank's MFU
    elif r["waterfall"]:  # no MFU over a window that is not empty: no waterfall of the rank ends with one
        assert all(w[-1]["key"] == "compute" for w in [d["job"]["waterfall"], r["waterfall"]] + [s["waterfall"] for s in r["steps"]] if w)
    if m["flops_coverage"] is not None:
        assert 0.0 <= m["flops_coverage"] <= 1.0 and m["lower_bound"] == (m["flops_coverage"] < 1.0)
        assert math.isclose(m["flops_coverage"], 1 - m["matmul_without_flops_ns"] / m["matmul_ns"])


def test_given_flops_beyond_the_matmul_time_are_flagged(tmp_path):
    """The user's FLOPs are held to the matmul time too.  On test_mfu's trace (H100, one 500 µs GEMM
    in a 900 µs window) 7e11 FLOPs take 707.5 µs at the BF16 peak: an MFU of 78.6%, below 100% so
    not an error, but 207.5 µs more than the matmul kernels ran: flagged, and the convention bar's
    negative part holds exactly that."""
    from tests.test_mfu import trace

    d = analyze(load([trace(tmp_path)], use_cache=False), Options(model_flops_per_step=7e11)).to_dict()
    r = d["ranks"][0]
    assert r["mfu"]["value"] == pytest.approx(7e11 / (H100_BF16 * 900e-6))
    assert r["mfu"]["above_peak"] and r["mfu"]["flops_coverage"] is None and not r["mfu"]["lower_bound"]
    assert parts(bars(d)["flop_convention"])[BEYOND_PEAK] == pytest.approx(500_000 - 7e11 / H100_BF16 * 1e9, abs=1)
    assert any("the given model FLOPs need 207.5 µs more time" in w for w in d["warnings"])
    ok = analyze(load([trace(tmp_path)], use_cache=False), Options(model_flops_per_step=3e11)).to_dict()
    assert not ok["ranks"][0]["mfu"]["above_peak"] and BEYOND_PEAK not in parts(bars(ok)["flop_convention"])


def test_user_given_numbers_in_the_job_settings_are_named_in_the_error(tmp_path, capsys):
    from tests.test_mfu import trace

    p = trace(tmp_path)
    (tmp_path / "tracelens.toml").write_text('gpu = "A100"\nmodel_flops_per_step = 1e15\n')
    rc, _, err = cli(["report", p], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert f"model_flops_per_step = 1e+15 in {tmp_path / 'tracelens.toml'} with gpu = A100 in" in err
    # a flag wins over the file: --params on the command line replaces the file's model FLOPs (6·1e9·16 = 9.6e10: 34%)
    rc, out, err = cli(["report", p, "--params", "1e9", "--tokens-per-step", "16"], capsys)
    assert rc == 0, err
    assert "model FLOPs from params: 6·N·T" in out


def test_reports_with_the_new_keys_validate_against_the_schema(tmp_path):
    import jsonschema

    from tests.conftest import ROOT
    from tests.test_mfu import trace

    schema = json.loads((ROOT / "tracelens/model/report.schema.json").read_text())
    for d in (analyze(load([custom_attention_trace(tmp_path)], use_cache=False)).to_dict(),
              analyze(load([trace(tmp_path)], use_cache=False), Options(params=1e9, tokens_per_step=16)).to_dict()):
        jsonschema.Draft202012Validator(schema).validate(d)
    assert d["ranks"][0]["mfu"]["flops_source"] == "params: 6·N·T"


def test_without_launch_records_the_coverage_is_unknown_and_said(tmp_path):
    # The hand-built GEMM trace of test_mfu without its cudaLaunchKernel: the kernel cannot be tied to its op,
    # so which matmul time has FLOPs is unknown: null, with a warning, never 0 or 1.
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000), X("cpu_op", "aten::mm", 10, 20, **mm_args(4096, 8192, 4096)),
          X("kernel", "sm90_xmma_gemm_bf16bf16", 100, 500, pid=0, tid=7, device=0, stream=7)]
    d = analyze(load([write(tmp_path, ev)], use_cache=False)).to_dict()
    m = d["ranks"][0]["mfu"]
    assert m["value"] is not None and m["flops_coverage"] is None and m["matmul_without_flops_ns"] is None
    assert any("no kernel can be tied to the op that launched it" in w for w in d["warnings"])
    assert sum(b["fraction"] for b in d["ranks"][0]["waterfall"]) == pytest.approx(1.0, abs=1e-9)
