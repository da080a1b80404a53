"""Activation recomputation (MFU.md 2.4): forward ops run again during the backward pass.

A forward op (``aten::convolution``, ``aten::linear``, ``aten::addmm``, attention forward ...)
that runs nested inside an ``autograd::engine::evaluate_function`` on its thread is a
recomputation: the backward pass never calls forward ops except to rebuild activations
(``torch.utils.checkpoint``, Megatron/TE checkpointing).  Backward matmuls (``mm``/``bmm``
under ``AddmmBackward0`` ...) are not, since no forward op encloses them."""

from __future__ import annotations

import polars as pl

from tracelens.analysis.rank.flops import SDPA_FWD
from tracelens.analysis.rank.names import Names
from tracelens.analysis.rank.names import of as of_names
from tracelens.model.schema import END

FORWARD = {
    "aten::convolution", "aten::_convolution", "aten::linear", "aten::matmul", "aten::addmm", "aten::baddbmm",
    "aten::scaled_dot_product_attention", *SDPA_FWD,
}
_EVAL = "autograd::engine::evaluate_function"


_EMPTY = {"_row": pl.UInt32, "pid": pl.Int64, "tid": pl.Int64, "ts_ns": pl.Int64, "end": pl.Int64}


def _covered(flag: pl.Expr) -> pl.Expr:
    """Whether an op of the ``flag`` ops before it on its thread (in start order, longer first)
    still runs at its start: the running maximum of their ends reaches past it."""
    reach = pl.when(flag).then(pl.col("end")).cum_max().shift(1).forward_fill().over("pid", "tid")
    return reach.fill_null(pl.col("ts_ns")) > pl.col("ts_ns")


def find(df: pl.DataFrame, names: Names | None = None) -> pl.DataFrame:
    """Row index, thread, start and end of each outermost recomputed forward op.

    On a thread, ops nest: an op runs inside the ones that started before it and end after its
    start.  A forward op inside an evaluate_function is a recomputation; the outermost of them
    (the forward ops under an evaluate_function that no such op encloses) are the ones kept."""
    names = of_names(df, names)
    evals = names.distinct.filter(names.distinct.str.starts_with(_EVAL))
    if evals.len() == 0:  # no backward pass recorded: nothing recomputed
        return pl.DataFrame(schema=_EMPTY)
    is_eval = pl.col("name").is_in(evals.implode())
    ops = (  # lazy: only these columns are filtered (a DataFrame filter copies every column)
        df.lazy().with_row_index("_row")
        .filter((pl.col("kind") == "cpu_op") & pl.col("tid").is_not_null())
        .select("_row", "pid", "tid", "ts_ns", END.alias("end"), is_eval.alias("_eval"), pl.col("name").is_in(list(FORWARD)).alias("_fwd"))
        # only backward-pass frames and forward ops take part in the nesting test, on threads that have a backward pass
        .filter(pl.col("_eval") | pl.col("_fwd"))
        .filter(pl.col("_eval").any().over("pid", "tid"))
        .sort("pid", "tid", "ts_ns", pl.col("end"), descending=[False, False, False, True])
        .with_columns((pl.col("_fwd") & _covered(pl.col("_eval"))).alias("_cand"))  # forward, under an evaluate_function
        .filter(pl.col("_cand") & ~_covered(pl.col("_cand")))  # and no such op encloses it
        .select(*_EMPTY)
        .collect(engine="in-memory")
    )
    return ops.cast(_EMPTY)
