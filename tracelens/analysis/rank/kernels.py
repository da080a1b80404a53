"""Kernel tables: time by kernel name and class, and per matmul op the achieved TFLOP/s, its
share of the dtype's peak, and whether it is memory- or compute-bound on the GPU's roofline."""

from __future__ import annotations

from math import fsum
from typing import Any

import polars as pl

from tracelens.analysis.rank.names import Names
from tracelens.analysis.rank.names import of as of_names
from tracelens.model.gpus import GpuSpec
from tracelens.model.schema import END

KERNELS_TOP = 30  # kernels by name kept in each rank of the report (the longest; job.kernels has them all, merged)
MATMULS_TOP = 20  # matmul op shapes kept in the report, per rank (the longest)


# the kernel table's columns (``by_name``): what each row of a report's ``kernels`` holds, in that order
# ``name`` stays Categorical, as in the events: the ranks of a job share their kernels' (long) names once
KERNEL_TABLE_SCHEMA = {
    "name": pl.Categorical, "kclass": pl.String, "count": pl.UInt32, "total_ns": pl.Int64, "mean_ns": pl.Float64,
    "flops": pl.Float64, "achieved_tflops": pl.Float64, "of_peak": pl.Float64, "flops_ns": pl.Int64,
    "ideal_ns": pl.Float64, "dtype": pl.String, "above_peak": pl.Boolean,
}


def by_name(kernels: pl.DataFrame, linked: pl.DataFrame) -> pl.DataFrame:
    """Kernels grouped by name (a frame of ``KERNEL_TABLE_SCHEMA``, every name, longest first):
    class, count, total and mean time, and, for the launches inside ops whose FLOPs are known (an
    op's FLOPs split among its kernels by duration), their time (``flops_ns``), FLOPs, the time
    those FLOPs take at the peak of the op's dtype (``ideal_ns``), the achieved TFLOP/s and the
    share of that dtype's peak, both over ``flops_ns`` (not over launches whose FLOPs are
    unknown).  A share above 1 is impossible: ``of_peak`` is then null and ``above_peak`` true
    (the FLOPs or the dtype are wrong).  ``kernels``: the rank's kernel rows; ``linked``:
    ``kernel_ops`` of them.  A frame, not dicts: a rank's table of every name is small this way
    (``table_rows`` gives the report's rows)."""
    k = kernels
    if k.height == 0:
        return pl.DataFrame(schema=KERNEL_TABLE_SCHEMA)
    if linked.height:
        k = k.with_row_index("_k").join(linked.select("_k", "kflops", "kideal", pl.col("dtype").alias("_odtype")), on="_k", how="left")
    else:
        k = k.with_columns(pl.lit(None, pl.Float64).alias("kflops"), pl.lit(None, pl.Float64).alias("kideal"),
                           pl.lit(None, pl.String).alias("_odtype"))
    known = pl.col("kflops").is_not_null()
    has, f, fns, ideal = pl.col("has_flops"), pl.col("flops"), pl.col("flops_ns"), pl.col("ideal_ns")
    share = pl.when(has & (fns != 0) & (ideal != 0)).then(ideal / fns)
    dts = pl.col("dtypes")
    return (
        k.lazy().group_by("name", "kclass")  # on the Categoricals; the few groups' names cast after
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").mean().alias("mean_ns"),
            pl.col("kflops").sum().alias("flops"),
            pl.col("kideal").sum().alias("ideal_ns"),
            known.any().alias("has_flops"),
            pl.col("dur_ns").filter(known).sum().alias("flops_ns"),
            pl.col("_odtype").drop_nulls().unique().sort().alias("dtypes"),  # the launching ops' dtypes
        )
        .with_columns(share.alias("_share"))
        .select(
            "name", pl.col("kclass").cast(pl.String), "count", "total_ns", "mean_ns",
            pl.when(has).then(f).alias("flops"),
            pl.lit(None, pl.Float64).alias("achieved_tflops"),  # table_rows: in Python, the same bits as the job's table
            pl.when(pl.col("_share") <= 1.0).then(pl.col("_share")).alias("of_peak"),
            pl.when(has).then(fns).alias("flops_ns"),
            pl.when(has & (ideal != 0)).then(ideal).alias("ideal_ns"),
            pl.when(dts.list.len() == 1).then(dts.list.first()).when(dts.list.len() > 1).then(pl.lit("mixed")).alias("dtype"),
            (pl.col("_share") > 1.0).fill_null(False).alias("above_peak"),
        )
        .sort(pl.col("total_ns"), pl.col("name").cast(pl.String), descending=[True, False])
        .collect(engine="in-memory")
        .cast(KERNEL_TABLE_SCHEMA)
    )


def table_rows(table: pl.DataFrame, top: int | None = KERNELS_TOP) -> list[dict[str, Any]]:
    """The first ``top`` rows (None: all) of a ``by_name`` table as the report's dicts, with the
    achieved TFLOP/s: FLOPs / ``flops_ns`` (polars would fold the literal divisions into a
    product, a different last bit)."""
    rows = (table if top is None else table.head(top)).to_dicts()
    for r in rows:
        f, fns = r["flops"], r["flops_ns"]
        r["achieved_tflops"] = f / (fns / 1e9) / 1e12 if (f is not None and fns) else None
    return rows


# TF32 tensor-core kernels: cuDNN/xmma names say tf32; CUTLASS's single-precision tensor-op GEMMs
# are "s1688" (the 16x8x8 TF32 MMA); hipBLASLt says xf32.  A plain FP32 SGEMM ("sgemm", SIMT) is none.
TF32_KERNEL = r"(?i)tf32|xf32|tensorop_s1688|_s1688gemm|s1688gemm"


def _launched_in(df: pl.DataFrame, ops: pl.DataFrame, kernels: pl.DataFrame, kernel_cols: list) -> pl.DataFrame:
    """Kernels joined to the op (a row of ``ops``, with its ``_row`` and any other columns) that
    launched them: on the launching thread, the op whose span holds the launch.  ``kernels``
    needs the launch columns the analysis adds (launch_ns, launch_tid, launch_known)."""
    spans = (  # one lazy query (each eager step would be a query of its own, with its fixed cost)
        df.lazy().select("tid", "ts_ns", "dur_ns").with_row_index("_row").join(ops.lazy(), on="_row")
        .with_columns(pl.col("tid").alias("launch_tid"), pl.col("ts_ns").alias("_ots"), END.alias("_oend"))
        .drop("tid", "ts_ns", "dur_ns")
        .sort("_ots")
    )
    return (
        kernels.lazy().filter(pl.col("launch_known") & pl.col("launch_tid").is_not_null())
        .select("launch_ns", "launch_tid", *kernel_cols).sort("launch_ns")
        .join_asof(spans, left_on="launch_ns", right_on="_ots", by="launch_tid", strategy="backward", check_sortedness=False)
        .filter(pl.col("_ots").is_not_null() & (pl.col("launch_ns") < pl.col("_oend")))
        .collect(engine="in-memory")
    )


def tf32_ops(df: pl.DataFrame, counted: pl.DataFrame, kernels: pl.DataFrame, names: Names | None = None) -> pl.DataFrame:
    """``counted`` with dtype "tf32" for the FP32 ops whose kernels ran on TF32 tensor cores:
    cuDNN runs FP32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32), matmuls
    too with allow_tf32 / set_float32_matmul_precision("high").  Their FLOPs are then held to
    the TF32 peak, not the FP32 one (which would let them exceed 100%)."""
    fp32 = counted.filter(pl.col("dtype") == "fp32")
    if fp32.height == 0 or "launch_ns" not in kernels.columns:
        return counted
    hits = (
        _launched_in(df, fp32.select("_row"), kernels, [of_names(df, names).like(TF32_KERNEL).alias("_tf32")])
        .filter(pl.col("_tf32"))
        .get_column("_row").unique()
    )
    if hits.len() == 0:
        return counted
    return counted.with_columns(pl.when(pl.col("_row").is_in(hits.implode())).then(pl.lit("tf32")).otherwise(pl.col("dtype")).alias("dtype"))


def kernel_ops(df: pl.DataFrame, counted: pl.DataFrame, kernels: pl.DataFrame, spec: GpuSpec | None) -> pl.DataFrame:
    """Each kernel launched inside a counted op (``_launched_in``): ``_k`` (its row in ``kernels``),
    ``_row`` (the op's row), the op's dtype, whether the kernel is of a matmul class (``_mm``), and
    its share of the op's FLOPs and ideal time, split among the op's kernels by duration."""
    from tracelens.analysis.waterfall import MATMUL_CLASSES

    ops = counted.drop_nulls("flops").select("_row", "flops", "dtype")
    if ops.height == 0 or "launch_ns" not in kernels.columns:
        return pl.DataFrame(schema={"_k": pl.UInt32, "_row": pl.UInt32, "dur_ns": pl.Int64, "dtype": pl.String, "_mm": pl.Boolean,
                                    "kflops": pl.Float64, "kideal": pl.Float64})
    mm = pl.col("kclass").cast(pl.String).is_in(list(MATMUL_CLASSES)).alias("_mm")
    k = _launched_in(df, ops, kernels.with_row_index("_k"), ["_k", "dur_ns", mm])
    if spec:
        peaks = spec.op_peaks(k.get_column("dtype").unique().to_list())
        ideal = pl.col("flops") / pl.col("dtype").replace_strict(peaks, default=spec.op_peak(None), return_dtype=pl.Float64) * 1e9
    else:
        ideal = pl.lit(None, pl.Float64)
    share = pl.col("dur_ns") / pl.col("dur_ns").sum().over("_row")
    return k.with_columns((pl.col("flops") * share).alias("kflops"), (ideal * share).alias("kideal")).select(
        "_k", "_row", "dur_ns", "dtype", "_mm", "kflops", "kideal"
    )


def op_matmul_ns(linked: pl.DataFrame) -> pl.DataFrame:
    """(_row, _mmk): per counted op, the summed time of the matmul-class kernels it launched."""
    return linked.filter(pl.col("_mm")).group_by("_row").agg(pl.col("dur_ns").sum().alias("_mmk"))


def matmul_efficiency(
    df: pl.DataFrame, counted: pl.DataFrame, linked: pl.DataFrame, spec: GpuSpec | None, top: int | None = 20,
) -> list[dict[str, Any]]:
    """Per (op, shapes, dtype): calls, FLOPs, kernel time, achieved TFLOP/s, % of the peak of the
    dtype it ran at (``peak_flops``; TF32 for FP32 ops on TF32 tensor-core kernels), arithmetic
    intensity against that dtype's ridge point (``ridge``: peak / memory bandwidth, FLOP/B).  A
    shape above 100% of its dtype's peak cannot be: its FLOPs or its dtype are wrong, so its
    ``of_peak`` is null, ``above_peak`` true, and it is ranked after the others.  ``counted`` is
    tracelens.analysis.rank.flops.count(df); ``linked`` is ``kernel_ops`` of the rank's kernels."""
    counted = counted.drop_nulls("flops")
    if counted.height == 0:
        return []
    k = linked.lazy().group_by("_row").agg(pl.col("dur_ns").sum().alias("kernel_ns"))
    ops = counted.with_columns(df.get_column("name").gather(counted.get_column("_row")).cast(pl.String).alias("name"))
    joined = ops.lazy().join(k, on="_row", how="inner").filter(pl.col("kernel_ns") > 0).collect(engine="in-memory")  # one query
    if joined.height == 0:
        return []
    g = (
        joined.group_by("name", "shapes", "dtype")
        .agg(
            pl.len().alias("calls"),
            pl.col("flops").sort().alias("flops"),  # summed exactly below (math.fsum): same bits every run
            pl.col("kernel_ns").sum(),
            pl.col("gemm_bytes").sum().alias("bytes"),
            pl.col("gemm_bytes").is_not_null().all().alias("bytes_known"),
        )
    )
    rows = {}
    for name, shapes, dtype, calls, flops, kns, nbytes, known in g.iter_rows():
        rows[(name, shapes, dtype)] = {"op": name, "shapes": shapes, "dtype": dtype, "calls": calls, "flops": fsum(flops),
                                       "kernel_ns": int(kns), "bytes": int(nbytes or 0), "bytes_known": known}
    out = []
    for r in rows.values():
        peak = spec.op_peak(r["dtype"]) if spec else None
        achieved = r["flops"] / (r["kernel_ns"] / 1e9)
        ai = r["flops"] / r["bytes"] if (r.pop("bytes_known") and r["bytes"]) else None
        ridge = (peak / (spec.mem_tbps * 1e12)) if (spec and peak and spec.mem_tbps) else None
        share = (achieved / peak) if peak else None
        r.update(
            ideal_ns=(r["flops"] / peak * 1e9) if peak else None,
            achieved_tflops=achieved / 1e12,
            of_peak=share if (share is None or share <= 1.0) else None,
            arithmetic_intensity=ai,
            bound=None if (ai is None or ridge is None) else ("memory" if ai < ridge else "compute"),
            peak_flops=peak,
            ridge=ridge,
            above_peak=bool(share is not None and share > 1.0),
        )
        out.append(r)
    out.sort(key=lambda r: (r["above_peak"], -r["kernel_ns"], r["op"], r["shapes"]))
    return out if top is None else out[:top]


def keep_top(matmuls: list[dict[str, Any]], top: int = MATMULS_TOP) -> list[dict[str, Any]]:
    """The rows the report keeps: the ``top`` longest ranked shapes, then up to ``top`` flagged
    ones (above 100% of their peak), so that those stay visible, flagged, after the ranking."""
    return [m for m in matmuls if not m["above_peak"]][:top] + [m for m in matmuls if m["above_peak"]][:top]


def below_peak_by_shape(matmuls: list[dict[str, Any]]) -> dict[str, float]:
    """Each op shape's kernel time beyond its FLOPs at peak (the weights that split the
    matmul-below-peak bar by shape)."""
    out: dict[str, float] = {}
    for m in matmuls:
        if m.get("ideal_ns") is None or m.get("above_peak"):
            continue
        key = f"{m['op']} {m['shapes']} {m['dtype']}"
        out[key] = out.get(key, 0.0) + max(m["kernel_ns"] - m["ideal_ns"], 0.0)
    return out


def above_peak_warning(matmuls: list[dict[str, Any]], top: int = 3) -> str | None:
    """The op shapes whose counted FLOPs run faster than the peak of their dtype: impossible, so
    the FLOPs (a Winograd or FFT convolution does fewer than the direct count; kernels of the op
    missing from the trace) or the dtype (an FP32 op on tensor cores whose kernel names do not
    tell TF32) are wrong; named, largest first."""
    bad = [m for m in matmuls if m.get("above_peak")]
    if not bad:
        return None
    bad.sort(key=lambda m: -m["kernel_ns"])
    named = "; ".join(
        f"{m['op']} {m['shapes'][:80]} {m['dtype'] or '?'} at {100 * m['flops'] / (m['kernel_ns'] / 1e9) / m['peak_flops']:.0f}% "
        f"of the {(m['dtype'] or 'reference').upper()} peak"
        for m in bad[:top]
    )
    more = f" and {len(bad) - top} more" if len(bad) > top else ""
    return (f"{len(bad)} matmul op shape(s) run above 100% of the peak of their dtype, which no GPU can: their FLOPs or their "
            f"dtype are wrong (a Winograd/FFT convolution does fewer FLOPs than counted; an FP32 op on tensor cores not "
            f"recognised as TF32; some of the op's kernels missing from the trace): {named}{more}; left out of the efficiency "
            "ranking (% of peak shown as unknown)")
