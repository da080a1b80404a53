"""Convolution FLOPs where the trace has no ``Concrete Inputs`` (the 2021 schema, torch <= 2.0):
stride, padding and dilation are not recorded, so the output size has to come from the trace
itself (the backward op's ``grad_output``, else the op that consumes the output), and the
2021 backward ops (``aten::cudnn_convolution_backward`` and its ``_input``/``_weight``
children) have to be counted."""

from __future__ import annotations

import json
from math import fsum

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import real_traces
from tracelens.analysis import analyze
from tracelens.analysis.rank.flops import count, op_flops
from tracelens.store.job import load


def resnet50_macs_per_image() -> tuple[int, int]:
    """(MACs of all convolutions and the fc layer, MACs of the stem) of torchvision's ResNet-50
    (v1.5: the stride of a downsampling bottleneck is on its 3x3 conv) at 224x224, counted from
    the architecture alone: no trace, no tracelens code.

    stem 7x7/2, 3 -> 64 channels, output 112x112; max-pool to 56x56; four stages of bottlenecks
    (blocks, width, output size, stride) = (3, 64, 56, 1), (4, 128, 28, 2), (6, 256, 14, 2),
    (3, 512, 7, 2), expansion 4: conv1 1x1 at the input size, conv2 3x3 (stride s), conv3 1x1 to
    4*width, and on each stage's first block a 1x1 stride-s downsample; fc 2048 -> 1000.
    The well-known total: 4.089e9 MACs (about 8.2 GFLOPs) per image."""
    stem = 112 * 112 * 64 * 3 * 7 * 7  # 118,013,952
    macs, in_c, size = stem, 64, 56
    for blocks, width, out, _stride in ((3, 64, 56, 1), (4, 128, 28, 2), (6, 256, 14, 2), (3, 512, 7, 2)):
        for b in range(blocks):
            macs += (size if b == 0 else out) ** 2 * in_c * width  # conv1 1x1
            macs += out * out * width * width * 9  # conv2 3x3, stride s on the first block
            macs += out * out * width * 4 * width  # conv3 1x1
            if b == 0:
                macs += out * out * in_c * 4 * width  # downsample 1x1, stride s
            in_c = 4 * width
        size = out
    return macs + 2048 * 1000, stem


# Per training step at batch 32: forward 2*MACs FLOPs per image; backward twice that (the
# gradient of each layer's input and of its weights, one forward's worth each; the fc's two
# aten::mm), except the stem's input gradient, which is never computed (the images need none).
# MFU.md's convention counts only GEMM/conv/attention FLOPs: batch-norm, ReLU, pooling, the
# residual adds and the optimizer are left out, so the trace-derived count must equal this exactly.
MACS, STEM_MACS = resnet50_macs_per_image()
assert MACS == 4_089_184_256
EXPECTED_STEP_FLOPS = 32 * (3 * 2 * MACS - 2 * STEM_MACS)  # 777,570,484,224 = 777.6 GFLOPs


@pytest.mark.parametrize("run", ["resnet50_num_workers_0", "resnet50_num_workers_4"])
def test_resnet50_2021_model_flops_per_step(run):
    """Before: 373.1 GFLOPs per step (strides read as 1, padding as 0, backward ops not counted):
    less than half the true 777.6, and MFU halved with it."""
    a = analyze(load([real_traces() / "kineto-tbplugin/samples" / run], use_cache=False))
    r = a.ranks[0]
    assert r.flops_source == "shapes" and len(r.steps) == 6
    for s in r.steps:
        assert s.flops == pytest.approx(EXPECTED_STEP_FLOPS, rel=1e-12), s.name
    kept = [s for s in r.steps if not s.warmup]
    assert r.flops == pytest.approx(EXPECTED_STEP_FLOPS * len(kept), rel=1e-12)
    d = a.to_dict()
    # every conv was counted: no op is left out of the model FLOPs (the Winograd convolutions
    # above the FP32 peak are flagged by another warning, about their efficiency, not their count)
    assert not any("FLOPs are left out" in w or "lower bound" in w or "cannot read" in w for w in d["warnings"])
    # Above 100% of the FP32 peak only where cuDNN ran Winograd (this trace's winograd kernels),
    # which does fewer multiplications than the direct convolution FLOPs are counted by: 3x3
    # convolutions of stride 1 (the output's size is the input's).  Read as stride 1, the
    # strided ones showed up there too (the stem at ~300%).
    # (such rows are flagged: above_peak, their % of peak shown as unknown)
    over = [m for m in d["ranks"][0]["matmul_efficiency"] if m.get("above_peak")]
    assert all(m["of_peak"] is None for m in over)
    assert over
    for m in over:  # forward [[x], [w], ...] or backward [[grad_out], [x], [w], ...]: x and w of a C -> C 3x3 conv
        dims = [d for d in json.loads(m["shapes"]) if d]
        x, w = dims[-2], dims[-1]
        assert w[1:] == [x[1], 3, 3] and w[0] == x[1], m["shapes"]
        if m["op"].endswith("_backward"):
            assert dims[0] == x, m["shapes"]  # grad_output the input's size: stride 1


def test_resnet50_2021_per_op_counts():
    """The stem's forward (7x7/2 to 112x112) and its backward (weight gradient only: no
    aten::cudnn_convolution_backward_input under it) and a 3x3 stride-2 conv's backward (both
    gradients), op by op."""
    ev = load([real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_4"], use_cache=False).events().collect()
    got = ev.select(pl.col("name").cast(pl.String), "args").with_row_index("_row").join(count(ev), on="_row")
    stem = 2 * 32 * STEM_MACS
    fwd = got.filter((pl.col("name") == "aten::convolution") & pl.col("shapes").str.starts_with("[[32, 3, 224, 224]"))
    bwd = got.filter((pl.col("name") == "aten::cudnn_convolution_backward") & pl.col("shapes").str.starts_with("[[32, 3, 224, 224]"))
    assert fwd.height == bwd.height == 6
    assert fwd.get_column("flops").to_list() == [stem] * 6
    assert bwd.get_column("flops").to_list() == [stem] * 6  # the weight gradient alone
    # layer2's first 3x3 conv: [32, 128, 56, 56] * [128, 128, 3, 3], stride 2 -> 28x28
    s2 = 2 * 32 * 28 * 28 * 128 * 128 * 9
    assert got.filter((pl.col("name") == "aten::convolution")
                      & pl.col("shapes").str.starts_with("[[32, 128, 56, 56], [128, 128, 3, 3]")).get_column("flops").to_list() == [s2] * 6
    assert got.filter((pl.col("name") == "aten::cudnn_convolution_backward")
                      & pl.col("shapes").str.starts_with("[[32, 128, 56, 56], [32, 128, 28, 28]")).get_column("flops").to_list() == [2 * s2] * 6
    # one op per call tree: 53 convs forward and backward per step, 6 steps; never their children
    names = got.group_by("name").len()
    assert dict(names.iter_rows())["aten::convolution"] == dict(names.iter_rows())["aten::cudnn_convolution_backward"] == 318
    assert not set(names.get_column("name")) & {"aten::_convolution", "aten::cudnn_convolution", "CudnnConvolutionBackward",
                                                 "aten::cudnn_convolution_backward_input", "aten::cudnn_convolution_backward_weight"}


def test_resnet50_2021_forward_only_output_sizes_from_the_consumers():
    """The same real trace with its autograd thread dropped (as an inference trace would be): no
    backward op tells the output sizes, so each convolution's comes from the op consuming its
    output (batch-norm); all 318 forward convolutions must get exactly the FLOPs the backward
    ops' grad_output gave (5 convs per step at stride 2, the stem 7x7/2 among them)."""
    ev = load([real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_4"], use_cache=False).events().collect()

    def convs(events):
        return (events.select(pl.col("name").cast(pl.String), "ts_ns", "tid").with_row_index("_row")
                .join(count(events), on="_row").filter(pl.col("name") == "aten::convolution").sort("ts_ns"))

    full = convs(ev)
    forward = convs(ev.filter(pl.col("tid").is_null() | pl.col("tid").is_in(full.get_column("tid").unique().implode())))
    assert full.height == forward.height == 318 and forward.get_column("flops").null_count() == 0
    assert forward.get_column("flops").to_list() == full.get_column("flops").to_list()
    assert fsum(full.get_column("flops").to_list()) == 6 * 2 * 32 * (MACS - 2048 * 1000)  # the convs of 6 forwards


def _op(name, ts, dur, dims, types=None, tid=1, seq=None, **extra):
    args = {"Input Dims": dims, "Input type": types or ["float"] * len(dims), **extra}
    if seq is not None:
        args["Sequence number"] = seq
    return {"ph": "X", "cat": "Operator", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _conv_tree(ts, x, w, child="aten::cudnn_convolution", seq=None):
    """aten::convolution -> aten::_convolution -> child, as the 2021 schema records it (x, w and
    seven empty entries: bias, stride, padding, dilation, transposed, output_padding, groups)."""
    return [
        _op("aten::convolution", ts, 100, [x, w] + [[]] * 7, seq=seq),
        _op("aten::_convolution", ts + 5, 90, [x, w] + [[]] * 11, seq=seq),
        _op(child, ts + 10, 80, [x, w] + [[]] * 7, seq=seq),
    ]


def _write(tmp_path, ev):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100_000}, *ev]}))
    return p


def _flops_by_name(path):
    ev = load([path], use_cache=False).events().collect()
    got = ev.select(pl.col("name").cast(pl.String), "ts_ns").with_row_index("_row").join(count(ev), on="_row").sort("ts_ns")
    return got.select("name", "flops", "why").rows()


def test_forward_only_conv_output_from_the_consumer(tmp_path):
    """Inference (no backward op): the output size comes from the op that consumes the output.
    conv A [8, 16, 32, 32] * [32, 16, 3, 3] feeds aten::batch_norm([8, 32, 16, 16]): stride 2, out
    16x16, FLOPs 2*8*32*16*9*16*16 = 18,874,368 (read as stride 1, padding 0 it was 30x30 = 2.7x more).
    The scalar aten::add in between (BN's num_batches_tracked += 1) is not a consumer.
    conv B [8, 32, 16, 16] * [64, 32, 1, 1] feeds aten::relu_([8, 64, 8, 8]): 1x1 stride 2, out 8x8,
    FLOPs 2*8*64*32*8*8 = 2,097,152.
    conv C [8, 64, 8, 8] * [10, 64, 8, 8] is the last op: nothing shows its output: unknown.
    conv D [8, 64, 8, 8] * [64, 64, 3, 3] is followed by a tensor of another channel count:
    not its output (unknown, not guessed)."""
    ev = [
        *_conv_tree(1000, [8, 16, 32, 32], [32, 16, 3, 3]),
        _op("aten::add", 1200, 10, [[], [], []], ["long int", "long int", "Int"]),
        _op("aten::batch_norm", 1300, 50, [[8, 32, 16, 16], [32], [32], [32], [32], [], [], [], []]),
        *_conv_tree(2000, [8, 32, 16, 16], [64, 32, 1, 1]),
        _op("aten::relu_", 2200, 20, [[8, 64, 8, 8]]),
        *_conv_tree(3000, [8, 64, 8, 8], [64, 64, 3, 3]),
        _op("aten::add_", 3200, 20, [[8, 128, 8, 8], [8, 128, 8, 8], []]),
        *_conv_tree(9000, [8, 64, 8, 8], [10, 64, 8, 8]),
    ]
    rows = _flops_by_name(_write(tmp_path, ev))
    assert [r[:2] for r in rows] == [("aten::convolution", 18_874_368.0), ("aten::convolution", 2_097_152.0),
                                     ("aten::convolution", None), ("aten::convolution", None)]
    assert rows[2][2] == rows[3][2] == "conv_output"
    a = analyze(load([_write(tmp_path, ev)], use_cache=False)).to_dict()
    assert any("2 convolutions" in w and "stride" in w and "lower bound" in w for w in a["warnings"]), a["warnings"]


def test_output_from_the_backward_grad_output_wins(tmp_path):
    """Training, 2021 schema: the forward conv (Sequence number 7) is linked to its backward node
    CudnnConvolutionBackward (same sequence number, autograd thread), whose
    aten::cudnn_convolution_backward(x, grad_output, w) holds grad_output [4, 8, 5, 5]: the output
    is 5x5 (stride 2, padding 1 on 10x10, 3x3), although the next op forward (an aten::add_ of
    another 4x8x10x10 tensor) would say 10x10.  Forward 2*4*8*3*9*25 = 43,200 FLOPs; backward: only
    the weight gradient is computed (no _backward_input child), 43,200 again."""
    x, w, go = [4, 3, 10, 10], [8, 3, 3, 3], [4, 8, 5, 5]
    ev = [
        *_conv_tree(1000, x, w, seq=7),
        _op("aten::add_", 1200, 20, [[4, 8, 10, 10], [4, 8, 10, 10], []]),
        _op("CudnnConvolutionBackward", 5000, 300, [go], tid=2, seq=7, **{"Fwd thread id": 1}),
        _op("aten::cudnn_convolution_backward", 5010, 280, [x, go, w] + [[]] * 8, tid=2),
        _op("aten::cudnn_convolution_backward_weight", 5020, 200, [[], go, x] + [[]] * 7, tid=2),
    ]
    rows = _flops_by_name(_write(tmp_path, ev))
    assert [r[:2] for r in rows] == [("aten::convolution", 43_200.0), ("aten::cudnn_convolution_backward", 43_200.0)]


def test_backward_with_both_gradients_and_grouped(tmp_path):
    """A grouped 2021 backward (x [2, 8, 6, 6], w [8, 2, 3, 3]: groups 4), grad_output [2, 8, 6, 6],
    both children present: grad_input 2*2*8*2*9*36 = 20,736 and grad_weight as many (each of the
    8*2*3*3 weights gathers 2*6*6 products: 20,736; FlopCounterMode's full-width count would say
    2*8*8*2*36*9 = 82,944, g = 4 times too many); total 41,472.  The forward (no consumer, but
    linked by its sequence number) gets the output 6x6 from grad_output: 20,736."""
    x, w, go = [2, 8, 6, 6], [8, 2, 3, 3], [2, 8, 6, 6]
    ev = [
        *_conv_tree(1000, x, w, seq=3),
        _op("CudnnConvolutionBackward", 5000, 300, [go], tid=2, seq=3),
        _op("aten::cudnn_convolution_backward", 5010, 280, [x, go, w] + [[]] * 8, tid=2),
        _op("aten::cudnn_convolution_backward_input", 5020, 100, [[], go, w] + [[]] * 7, tid=2),
        _op("aten::cudnn_convolution_backward_weight", 5130, 100, [[], go, x] + [[]] * 7, tid=2),
    ]
    rows = _flops_by_name(_write(tmp_path, ev))
    assert [r[:2] for r in rows] == [("aten::convolution", 20_736.0), ("aten::cudnn_convolution_backward", 41_472.0)]


def test_depthwise_2021_backward(tmp_path):
    """A depthwise convolution on CUDA in the 2021 schema runs torch's own kernel:
    aten::convolution -> aten::_convolution -> aten::thnn_conv_depthwise2d, backward
    ThnnConvDepthwise2DBackward -> aten::thnn_conv_depthwise2d_backward(grad_output, self, weight,
    ...).  x [4, 32, 16, 16], w [32, 1, 3, 3] (groups 32), stride 2 -> grad_output [4, 32, 8, 8]:
    forward 2*4*32*1*9*64 = 147,456 FLOPs; backward (no output_mask recorded, no child ops: both
    gradients, as for aten::convolution_backward) 2 x 147,456 = 294,912 (FlopCounterMode's
    full-width weight gradient would say 32 times 147,456 for it)."""
    x, w, go = [4, 32, 16, 16], [32, 1, 3, 3], [4, 32, 8, 8]
    ev = [
        *_conv_tree(1000, x, w, child="aten::thnn_conv_depthwise2d", seq=11),
        _op("ThnnConvDepthwise2DBackward", 5000, 300, [go], tid=2, seq=11),
        _op("aten::thnn_conv_depthwise2d_backward", 5010, 280, [go, x, w] + [[]] * 5, tid=2),
    ]
    rows = _flops_by_name(_write(tmp_path, ev))
    assert [r[:2] for r in rows] == [("aten::convolution", 147_456.0), ("aten::thnn_conv_depthwise2d_backward", 294_912.0)]


def test_backward_without_children_is_unknown(tmp_path):
    """A 2021 backward op whose gradient children are not in the trace: which gradients it
    computed is not recorded, so its FLOPs are unknown (not assumed)."""
    x, go, w = [2, 8, 6, 6], [2, 8, 6, 6], [8, 8, 3, 3]
    rows = _flops_by_name(_write(tmp_path, [_op("aten::cudnn_convolution_backward", 5010, 280, [x, go, w] + [[]] * 8, tid=2)]))
    assert rows[0][:2] == ("aten::cudnn_convolution_backward", None) and rows[0][2] == "conv_bwd_mask"


def test_transposed_conv_from_its_child(tmp_path):
    """A 2021 transposed convolution (the child is aten::cudnn_convolution_transpose): x [2, 16, 8, 8],
    w [16, 4, 4, 4] (C_in, C_out/g, k, k); FlopCounterMode counts it over the input's 8x8:
    2*2*16*4*16*64 = 262,144, whatever the stride (which is why no output size is needed)."""
    rows = _flops_by_name(_write(tmp_path, _conv_tree(1000, [2, 16, 8, 8], [16, 4, 4, 4], child="aten::cudnn_convolution_transpose")))
    assert rows == [("aten::convolution", 262_144.0, None)]


def test_backend_op_arguments_by_its_own_layout():
    """When a backend op is the outermost recorded one, its Concrete Inputs are read by its own
    argument order: cudnn_convolution(self, weight, padding, stride, dilation, groups, ...), not
    convolution's (input, weight, bias, stride, padding, dilation, ...).  x [1, 4, 16, 16],
    w [8, 4, 3, 3], padding 1, stride 2 -> 8x8: 2*1*8*4*9*64 = 36,864 (read by convolution's
    order: stride 2 read as padding ... a different, wrong number)."""
    args = {"Input Dims": [[1, 4, 16, 16], [8, 4, 3, 3], [], [], [], [], [], [], []],
            "Concrete Inputs": ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]}
    assert op_flops("aten::cudnn_convolution", args) == 36_864
    # miopen_convolution(self, weight, bias, padding, stride, dilation, groups, benchmark, deterministic)
    args = {"Input Dims": [[1, 4, 16, 16], [8, 4, 3, 3], [], [], [], [], [], [], []],
            "Concrete Inputs": ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False"]}
    assert op_flops("aten::miopen_convolution", args) == 36_864


def test_conv_without_stride_and_no_hint_is_unknown():
    """No Concrete Inputs and no output size from the trace: unknown (the old code read stride 1,
    padding 0)."""
    assert op_flops("aten::convolution", {"Input Dims": [[1, 4, 16, 16], [8, 4, 3, 3], [], [], [], [], [], [], []]}) is None


_NAMES = ["aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::cudnn_convolution_transpose",
          "CudnnConvolutionBackward", "aten::cudnn_convolution_backward", "aten::cudnn_convolution_backward_input",
          "aten::cudnn_convolution_backward_weight", "aten::convolution_backward", "ConvolutionBackward0",
          "aten::batch_norm", "aten::relu_", "aten::add"]
_DIM = st.one_of(st.integers(-3, 40), st.integers(2**62, 2**70), st.just(True), st.just("7"), st.just(None), st.just([2]))
_SHAPES = st.lists(st.one_of(st.lists(_DIM, max_size=5), st.just([])), max_size=5)
_TEXT = st.one_of(
    _SHAPES.map(lambda d: json.dumps({"Input Dims": d})),
    st.sampled_from(['{"Input Dims": [[1,,2], [3]]}', '{"Input Dims": [[1 2], [3]]}', '{"Input Dims": [[8, 3, 9, 9], [4, 3, 3, 3]',
                     '{"Input Dims": 5}', '{"Input Dims": [[[1, 2]], [3]]}', "not json", "", '{"Sequence number": 1}']),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_NAMES), st.integers(0, 1), st.integers(0, 60), st.integers(0, 30), _TEXT,
                          st.one_of(st.none(), st.integers(0, 3), st.integers(2**63, 2**64))), max_size=25))
def test_hostile_convolution_args_cost_the_op_not_the_file(ops):
    """Whatever the shapes, sequence numbers and nesting, count() returns (never raises) and every
    FLOP count it gives is a whole number >= 0; unreadable ops are null."""
    from tracelens.model.schema import conform

    rows = []
    for name, tid, ts, dur, text, seq in ops:
        if seq is not None and text.startswith("{") and text.endswith("}"):
            text = text[:-1] + (", " if len(text) > 2 else "") + f'"Sequence number": {seq}}}'
        rows.append({"kind": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts_ns": ts, "dur_ns": dur, "file": 0, "args": text})
    ev = conform(pl.DataFrame(rows, schema={"kind": pl.String, "name": pl.String, "pid": pl.Int64, "tid": pl.Int64,
                                            "ts_ns": pl.Int64, "dur_ns": pl.Int64, "file": pl.Int32, "args": pl.String}))
    got = count(ev)
    flops = got.get_column("flops").drop_nulls().to_list()
    assert all(f >= 0 and f == int(f) for f in flops)


def test_convolution_backward_without_concrete_inputs_transposed_by_shapes():
    """aten::convolution_backward(grad_output, input, weight, ...) of torch 1.11-2.0 records its
    transposed flag only among Concrete Inputs.  Unlinked to its forward, the channels tell:
    weight [16, 4, 4, 4] matches the input's 16 channels, not grad_output's 4: transposed, counted
    over the input's 10x10: 2 gradients x 2*2*16*4*16*100 = 819,200.  With weight [8, 8, 3, 3] and
    8 channels on both sides but sizes 10x10 -> 5x5 it could be either: unknown, and said why."""
    from tracelens.analysis.rank.flops import _op_flops

    dims = [[2, 4, 20, 20], [2, 16, 10, 10], [16, 4, 4, 4]] + [[]] * 8
    assert _op_flops("aten::convolution_backward", {"Input Dims": dims}) == (2 * 2 * 2 * 16 * 4 * 16 * 100, None)
    plain = [[2, 8, 5, 5], [2, 8, 10, 10], [8, 8, 3, 3]] + [[]] * 8
    assert _op_flops("aten::convolution_backward", {"Input Dims": plain}) == (None, "conv_bwd_transposed")
    # linked to a forward convolution that was not transposed: 2 x 2*2*8*8*9*25
    assert _op_flops("aten::convolution_backward", {"Input Dims": plain}, {"transposed": False}) == (2 * 2 * 2 * 8 * 8 * 9 * 25, None)
    same = [[2, 8, 10, 10], [2, 8, 10, 10], [8, 8, 3, 3]] + [[]] * 8  # same sizes: either reading gives the same count
    assert _op_flops("aten::convolution_backward", {"Input Dims": same}) == (2 * 2 * 2 * 8 * 8 * 9 * 100, None)
