"""FLOPs from recorded shapes, against torch.utils.flop_counter.FlopCounterMode on the same
models and inputs (the oracle), on traces recorded here with torch's profiler on the CPU."""

from __future__ import annotations

from collections import Counter

import polars as pl
import pytest
import torch  # a test dependency: missing, the suite fails instead of skipping
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelens.analysis.rank.flops import CONV, count
from tracelens.store.job import load

pytestmark = pytest.mark.slow


def _key(name: str) -> str:
    if name in CONV:
        return "aten.convolution"
    return name.replace("::", ".")


def record_and_count(tmp_path, fn):
    """Run fn() under FlopCounterMode and, separately, under the profiler; return both
    per-op FLOP totals."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    with FlopCounterMode(display=False) as fc:
        fn()
    oracle = {str(k): v for k, v in fc.get_flop_counts().get("Global", {}).items()}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    ev = load([path], use_cache=False).events().collect()
    counted = count(ev)
    names = (
        ev.select("name").with_row_index("_row").join(counted, on="_row").select(pl.col("name").cast(pl.String), "flops")
    )
    ours: Counter[str] = Counter()
    for name, f in names.iter_rows():
        ours[_key(name)] += int(f) if f is not None else 0
    return {k: v for k, v in ours.items() if k in oracle or v}, oracle


def test_linear_stack_training_step(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 96, bias=False), torch.nn.Linear(96, 10))
    x = torch.randn(16, 48)

    def step():
        model(x).square().mean().backward()

    ours, oracle = record_and_count(tmp_path, step)
    assert ours == oracle and set(oracle) == {"aten.addmm", "aten.mm"}


def test_conv_net(tmp_path):
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4),
        torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, output_padding=0),
    )
    x = torch.randn(2, 3, 20, 20, requires_grad=True)

    def step():
        net(x).sum().backward()

    ours, oracle = record_and_count(tmp_path, step)
    # FlopCounterMode counts a grouped convolution's weight gradient at full width: g times its
    # multiply-adds.  tracelens counts the weight gradient as one forward, like the input's: for
    # the groups=4 conv (input [2, 8, 10, 10], 3x3, dilation 2, padding 2, output 10x10: forward
    # 2*2*8*(8/4)*9*100 = 57,600 FLOPs) that is 3 * 57,600 fewer than FlopCounterMode.
    assert oracle["aten.convolution_backward"] - ours["aten.convolution_backward"] == 3 * 57_600
    ours["aten.convolution_backward"] += 3 * 57_600
    assert ours == oracle and {"aten.convolution", "aten.convolution_backward"} <= set(oracle)


def test_batched_gemms(tmp_path):
    a, b, c = torch.randn(4, 8, 16), torch.randn(4, 16, 12), torch.randn(4, 8, 12)

    def step():
        torch.bmm(a, b)
        torch.baddbmm(c, a, b)
        torch.matmul(a, b)  # a leaf bmm under matmul: counted once

    ours, oracle = record_and_count(tmp_path, step)
    assert ours == oracle and set(oracle) == {"aten.bmm", "aten.baddbmm"}


@pytest.mark.parametrize("causal", [False, True])
def test_attention_uses_flop_counter_formulas(tmp_path, causal):
    """FlopCounterMode has no formula registered for the CPU flash kernel, so the oracle is its
    own shape functions (sdpa_flop_count, sdpa_backward_flop_count) on the recorded shapes.
    Causal masking is not discounted, as in FlopCounterMode (a documented convention)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, k, v = (torch.randn(2, 4, 32, 16, requires_grad=True) for _ in range(3))  # shapes the CPU flash kernel takes

    def step():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    ours, _ = record_and_count(tmp_path, step)
    fwd = sdpa_flop_count(q.shape, k.shape, v.shape)
    bwd = sdpa_backward_flop_count(q.shape[:3] + (v.shape[3],), q.shape, k.shape, v.shape)
    assert ours["aten._scaled_dot_product_flash_attention_for_cpu"] == fwd
    assert ours["aten._scaled_dot_product_flash_attention_for_cpu_backward"] == bwd


def test_fused_moe_flops_from_expert_weights():
    """vLLM's fused_experts(hidden [T, H], w1 [E, 2I, H], w2 [E, H, I], topk_weights [T, k], topk_ids [T, k]):
    each of T=8 tokens runs k=2 of E=4 experts, a gate/up GEMM (2I x H = 256 x 64) and a down GEMM
    (H x I = 64 x 128): 2 * 8 * 2 * (256*64 + 64*128) = 786432 FLOPs."""
    from tracelens.analysis.rank.flops import op_flops

    args = {"Input Dims": [[8, 64], [4, 256, 64], [4, 64, 128], [8, 2], [8, 2]]}
    assert op_flops("vllm::inplace_fused_experts", args) == 2 * 8 * 2 * (256 * 64 + 64 * 128) == 786432
    # weights that do not match the hidden size, or no top-k tensor: unknown, not guessed
    assert op_flops("vllm::fused_experts", {"Input Dims": [[8, 64], [4, 256, 32], [4, 64, 128], [8, 2], [8, 2]]}) is None
    assert op_flops("vllm::fused_experts", {"Input Dims": [[8, 64], [4, 256, 64], [4, 64, 128]]}) is None


def test_fused_moe_without_weights_is_warned():
    """The B200 vLLM trace runs vllm::moe_forward(hidden, router_logits, layer name): the expert weights
    are module state, so the report says its FLOPs are missing and MFU is a lower bound."""
    from tests.conftest import real_traces
    from tracelens.analysis import analyze
    from tracelens.store.job import load

    d = analyze(load([real_traces() / "amd-tracelens/b200/eager_trace.json.gz"])).to_dict()
    assert any("vllm::moe_forward x36" in w and "lower bounds" in w for w in d["warnings"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 20), st.integers(0, 8)), max_size=30))
def test_count_keeps_the_outermost_ops(ops):
    """count() counts an op unless it lies inside the last op counted on its thread (the
    sequential rule, walked here op by op in start order, longer first); done in polars with a
    running maximum of the ends, it must pick exactly the same ops."""
    from tracelens.model.schema import conform

    rows = [{"kind": "cpu_op", "name": "aten::mm", "pid": 1, "tid": t, "ts_ns": s, "dur_ns": d, "file": 0,
             "args": '{"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}'} for t, s, d in ops]
    ev = conform(pl.DataFrame(rows, schema={"kind": pl.String, "name": pl.String, "pid": pl.Int64, "tid": pl.Int64,
                                            "ts_ns": pl.Int64, "dur_ns": pl.Int64, "file": pl.Int32, "args": pl.String}))
    got = sorted(count(ev).get_column("_row").to_list())
    want, last = [], {}
    order = sorted(range(len(ops)), key=lambda i: (ops[i][0], ops[i][1], -ops[i][2], i))
    for i in order:
        t, s, d = ops[i]
        end = last.get(t)
        if end is not None and s < end and s + d <= end:
            continue
        last[t] = s + d
        want.append(i)
    assert got == sorted(want)


@pytest.mark.parametrize("grad", [True, False])
def test_conv_net_without_concrete_inputs(tmp_path, grad):
    """The same conv net recorded here, its trace then stripped of "Concrete Inputs" (what torch
    before 2.1 and the 2021 schema record): stride, padding and dilation are gone, and tracelens
    must take each convolution's output size from the trace itself, from the backward op linked by
    its sequence number when training, from the op consuming the output in inference (no_grad:
    no backward, no sequence numbers).  Per op, the FLOPs must not change."""
    import json

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4),
        torch.nn.Conv2d(8, 16, 1, stride=2),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(16, 4, 4, stride=2, padding=1),
    )
    x = torch.randn(2, 3, 20, 20, requires_grad=True)

    def step():
        if grad:
            net(x).sum().backward()
        else:
            with torch.no_grad():
                net(x).sum()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    full = tmp_path / "full.json"
    prof.export_chrome_trace(str(full))
    doc = json.loads(full.read_text())
    for e in doc["traceEvents"]:
        (e.get("args") or {}).pop("Concrete Inputs", None)
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(doc))

    def per_op(path):
        ev = load([path], use_cache=False).events().collect()
        c = ev.select(pl.col("name").cast(pl.String), "ts_ns").with_row_index("_row").join(count(ev), on="_row")
        return c.filter(pl.col("name").str.contains("conv")).sort("ts_ns").select("name", "flops").rows()

    want, got = per_op(full), per_op(stripped)
    assert len(want) == (8 if grad else 4) and all(f for _, f in want)
    assert got == want
