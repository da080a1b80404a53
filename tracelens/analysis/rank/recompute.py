"""Activation recomputation (MFU.md 2.4): forward ops run again during the backward pass.

A forward op (``aten::convolution``, ``aten::linear``, ``aten::addmm``, attention forward ...)
that runs nested inside an ``autograd::engine::evaluate_function`` on its thread is a
recomputation: the backward pass never calls forward ops except to rebuild activations
(``torch.utils.checkpoint``, Megatron/TE checkpointing).  Backward matmuls (``mm``/``bmm``
under ``AddmmBackward0`` ...) are not, since no forward op encloses them."""

from __future__ import annotations

import polars as pl

from tracelens.analysis.rank.flops import SDPA_FWD
from tracelens.model.schema import END

FORWARD = {
    "aten::convolution", "aten::_convolution", "aten::linear", "aten::matmul", "aten::addmm", "aten::baddbmm",
    "aten::scaled_dot_product_attention", *SDPA_FWD,
}
_EVAL = "autograd::engine::evaluate_function"


def find(df: pl.DataFrame) -> pl.DataFrame:
    """Row index, thread, start and end of each outermost recomputed forward op."""
    ops = (  # lazy: only these columns are filtered (a DataFrame filter copies every column)
        df.lazy().with_row_index("_row")
        .filter((pl.col("kind") == "cpu_op") & pl.col("tid").is_not_null())
        .select("_row", "pid", "tid", "ts_ns", END.alias("end"), pl.col("name").cast(pl.String))
        .collect()
    )
    # only backward-pass frames and forward ops take part in the nesting test
    ops = ops.filter(pl.col("name").str.starts_with(_EVAL) | pl.col("name").is_in(list(FORWARD)))
    threads = ops.filter(pl.col("name").str.starts_with(_EVAL)).select("pid", "tid").unique()
    if threads.height == 0:
        return pl.DataFrame(schema={"_row": pl.UInt32, "pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64, "end": pl.Int64})
    ops = ops.join(threads, on=["pid", "tid"]).sort("pid", "tid", "ts_ns", pl.col("end"), descending=[False, False, False, True])
    rows = []
    stack: list[tuple[int, bool, bool]] = []  # (end, under evaluate_function, under a recomputed op)
    current = None
    for row, pid, tid, ts, end, name in ops.iter_rows():
        if (pid, tid) != current:
            stack, current = [], (pid, tid)
        while stack and stack[-1][0] <= ts:
            stack.pop()
        in_eval = bool(stack) and stack[-1][1]
        in_recompute = bool(stack) and stack[-1][2]
        is_recompute = in_eval and not in_recompute and name in FORWARD
        if is_recompute:
            rows.append((row, pid, tid, ts, end))
        stack.append((end, in_eval or name.startswith(_EVAL), in_recompute or is_recompute))
    return pl.DataFrame(rows, schema={"_row": pl.UInt32, "pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64, "end": pl.Int64}, orient="row")
