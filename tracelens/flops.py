"""FLOPs of aten ops from their recorded shapes (``record_shapes=True``; MFU.md 2.3).

Counted at the outermost op of each call (``aten::convolution``, not also the
``aten::_convolution`` / ``cudnn_convolution`` it calls; never ``aten::linear`` or
``aten::matmul``, whose work is their ``mm``/``addmm``/``bmm`` children).  The convention is
``torch.utils.flop_counter.FlopCounterMode``'s, so the two agree exactly on GEMMs and convs:
2·M·N·K per GEMM (no bias term), convolutions 2·N·C_out·(C_in/g)·k·out_spatial, their backward
one convolution per computed gradient (``output_mask``; FlopCounterMode's shapes, which count
a grouped convolution's weight gradient at full width), attention 2·B·H_q·S_q·S_k·(D + D_v) forward and 2·B·H_q·S_q·S_k·(3·D + 2·D_v) backward (the
"executed" count, score recompute included: 10·B·H·S²·D for D = D_v), causal masking not
discounted (as FlopCounterMode; MFU.md 1.10).
"""

from __future__ import annotations

import ast
import math
from typing import Any

import orjson
import polars as pl

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::_grouped_mm"}
CONV = {
    "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::mkldnn_convolution",
    "aten::miopen_convolution", "aten::convolution_overrideable", "aten::cudnn_convolution_transpose",
}
CONV_BWD = {"aten::convolution_backward", "aten::convolution_backward_overrideable"}
# name -> index of is_causal in Concrete Inputs (query, key, value are inputs 0..2)
SDPA_FWD = {
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
}
# backward: grad_out is input 0, query/key/value 1..3
SDPA_BWD = {
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
}
# fused MoE ops that take the expert weights as inputs: (hidden [T, H], w1 [E, N1, H], w2 [E, H, N2],
# topk_weights [T, k], topk_ids [T, k], ...): every token runs k experts, two GEMMs each
FUSED_MOE = {
    "vllm::fused_experts", "vllm::inplace_fused_experts", "vllm::outplace_fused_experts", "vllm::fused_moe",
    "sglang::inplace_fused_experts", "sglang::outplace_fused_experts", "sglang::fused_experts",
}
# fused MoE ops whose recorded inputs hold no expert weights (module state): FLOPs unknowable
MOE_NO_WEIGHTS = r"(?i)(^vllm::moe_forward|trtllm.*moe|flashinfer.*moe|fused_moe|moe_forward)"
COUNTED = GEMM | CONV | CONV_BWD | set(SDPA_FWD) | SDPA_BWD | FUSED_MOE

DTYPES = {
    "c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16", "float": "fp32", "Float": "fp32",
    "double": "fp64", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8", "unsigned char": "int8",
}


def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def _lit(s: Any) -> Any:
    """A Concrete Inputs entry ("[2, 2]", "True", "1") as a Python value; None if empty."""
    if not isinstance(s, str) or not s:
        return None
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        return None


def _conv_out(x: list[int], w: list[int], stride, padding, dilation, transposed: bool, output_padding) -> list[int]:
    dims = len(x) - 2
    as_list = lambda v, d: list(v) if isinstance(v, (list, tuple)) else [v if v is not None else d] * dims  # noqa: E731
    s, p, d, op = as_list(stride, 1), as_list(padding, 0), as_list(dilation, 1), as_list(output_padding, 0)
    k = w[2:]
    if transposed:
        return [(x[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1 for i in range(dims)]
    return [(x[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(dims)]


def _conv_count(x, w, out, transposed: bool) -> int:
    """2 · batch · C_out · C_in/g · prod(kernel) · prod(spatial), the spatial size being the
    output's (the input's for a transposed convolution), as FlopCounterMode counts it."""
    spatial = x[2:] if transposed else out[2:]
    return 2 * x[0] * w[0] * w[1] * _prod(w[2:]) * _prod(spatial)


def _conv_flops(x, w, out_spatial, transposed: bool) -> int:
    return _conv_count(x, w, [0, 0, *out_spatial], transposed)


def op_flops(name: str, args: dict) -> int | None:
    """FLOPs of one op from its recorded args; None when the shapes do not tell."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list):
        return None
    conc = args.get("Concrete Inputs") or []
    try:
        if name in ("aten::mm", "aten::_scaled_mm"):
            (m, k), (_, n) = dims[0], dims[1]
            return 2 * m * n * k
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return 2 * m * n * k
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2 * b * m * n * k
        if name == "aten::baddbmm":
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return 2 * b * m * n * k
        if name == "aten::_grouped_mm":
            a, bmat = dims[0], dims[1]
            if len(a) == 2 and len(bmat) == 3:  # routed tokens [T, K] x experts [E, K, N]
                return 2 * a[0] * a[1] * bmat[2]
            return None
        if name in FUSED_MOE:
            hidden, w1, w2 = dims[0], dims[1], dims[2]
            topk = next((d for d in dims[3:5] if isinstance(d, list) and len(d) == 2 and d[0] == hidden[0]), None)
            if len(hidden) != 2 or len(w1) != 3 or len(w2) != 3 or topk is None or w1[2] != hidden[1]:
                return None
            return 2 * hidden[0] * topk[1] * (w1[1] * w1[2] + w2[1] * w2[2])
        if name in CONV:
            x, w = dims[0], dims[1]
            if len(x) < 3 or len(w) != len(x):
                return None
            transposed = bool(_lit(conc[6])) if len(conc) > 6 else False
            out = _conv_out(x, w, _lit(conc[3]) if len(conc) > 3 else 1, _lit(conc[4]) if len(conc) > 4 else 0,
                            _lit(conc[5]) if len(conc) > 5 else 1, transposed, _lit(conc[7]) if len(conc) > 7 else 0)
            return _conv_flops(x, w, out, transposed)
        if name in CONV_BWD:
            # FlopCounterMode's conv_backward_flop: one convolution per computed gradient
            grad_out, x, w = dims[0], dims[1], dims[2]
            transposed = bool(_lit(conc[7])) if len(conc) > 7 else False
            mask = _lit(conc[10]) if len(conc) > 10 else None
            mask = mask if isinstance(mask, (list, tuple)) and len(mask) >= 2 else [True, True]
            t = lambda s: [s[1], s[0], *s[2:]]  # noqa: E731
            total = 0
            if mask[0]:  # grad_input: a convolution of grad_out with w, the other way round
                total += _conv_count(grad_out, w, x, not transposed)
            if mask[1]:  # grad_weight
                total += _conv_count(t(grad_out), t(x), t(w), False) if transposed else _conv_count(t(x), t(grad_out), t(w), False)
            return total
        if name in SDPA_FWD:
            q, k, v = dims[0], dims[1], dims[2]
            b, h, sq, d = q
            sk, dv = k[2], v[3]
            return 2 * b * h * sq * sk * (d + dv)
        if name in SDPA_BWD:
            q, k, v = dims[1], dims[2], dims[3]
            b, h, sq, d = q
            sk, dv = k[2], v[3]
            # score recompute (d), grad of scores and of v (dv each), grads of q and k (d each)
            return 2 * b * h * sq * sk * (3 * d + 2 * dv)
    except (TypeError, ValueError, IndexError):
        return None
    return None


def op_dtype(args: dict) -> str | None:
    types = args.get("Input type")
    if not isinstance(types, list):
        return None
    for t in types:
        if isinstance(t, str) and t in DTYPES:
            return DTYPES[t]
    return None


def count(events: pl.DataFrame) -> pl.DataFrame:
    """(row index, flops, dtype, shapes, gemm_bytes) of the outermost counted ops of every thread:
    ``shapes`` is the recorded ``Input Dims`` as text, ``gemm_bytes`` the bytes a GEMM must move
    at least (operands and result once; null for other ops or unreadable shapes)."""
    from tracelens.collectives import dtype_bytes

    # An op inside an op already counted on its thread (_convolution under convolution) is not
    # counted.  The end of the last counted op is the running maximum of the ends before it:
    # an op that is skipped ends within it, and an op that is counted ends at or past it.
    end = pl.col("ts_ns") + pl.col("dur_ns")
    reach = end.cum_max().shift(1).over("file", "pid", "tid")
    ops = (
        events.with_row_index("_row")
        .filter((pl.col("kind") == "cpu_op") & pl.col("name").cast(pl.String).is_in(list(COUNTED)))
        .select("_row", "file", "pid", "tid", "ts_ns", "dur_ns", pl.col("name").cast(pl.String), "args")
        .sort("file", "pid", "tid", "ts_ns", pl.col("dur_ns"), "_row", descending=[False, False, False, False, True, False])
        .filter(reach.is_null() | (pl.col("ts_ns") >= reach) | (end > reach))
    )
    rows, flops, dtypes, shapes, nbytes = [], [], [], [], []
    for row, name, args_s in ops.select("_row", "name", "args").iter_rows():
        try:
            args = orjson.loads(args_s) if args_s else {}
        except orjson.JSONDecodeError:
            args = {}
        if not isinstance(args, dict):
            args = {}
        dtype = op_dtype(args)
        rows.append(row)
        flops.append(op_flops(name, args))
        dtypes.append(dtype)
        shapes.append(str(args.get("Input Dims", "")))
        nbytes.append(gemm_bytes(name, args.get("Input Dims"), dtype_bytes(dtype)))
    return pl.DataFrame(
        {"_row": rows, "flops": flops, "dtype": dtypes, "shapes": shapes, "gemm_bytes": nbytes},
        schema={"_row": pl.UInt32, "flops": pl.Float64, "dtype": pl.String, "shapes": pl.String, "gemm_bytes": pl.Int64},
    )


def gemm_bytes(name: str, dims: Any, size: int | None) -> int | None:
    """Bytes a GEMM must move at least: its operands and result once (``size`` bytes each)."""
    if not isinstance(dims, list) or size is None:
        return None
    try:
        if name in ("aten::mm", "aten::_scaled_mm"):
            (m, k), (_, n) = dims[0], dims[1]
            return _int64(size * (m * k + k * n + m * n))
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return _int64(size * (m * k + k * n + m * n))
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (dims[0], dims[1]) if name == "aten::bmm" else (dims[1], dims[2])
            bt, m, k = a
            n = b[2]
            return _int64(size * bt * (m * k + k * n + m * n))
    except (TypeError, ValueError, IndexError):
        return None
    return None


def _int64(v: Any) -> int | None:
    return v if isinstance(v, int) and 0 <= v < (1 << 63) else None
