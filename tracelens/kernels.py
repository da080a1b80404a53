"""Kernel tables: time by kernel name and class, and per matmul op the achieved TFLOP/s, its
share of the dtype's peak, and whether it is memory- or compute-bound on the GPU's roofline."""

from __future__ import annotations

from typing import Any

import orjson
import polars as pl

from tracelens.gpus import GpuSpec

_ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp64": 8, "int8": 1}
_PEAK_OF = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "fp8", "fp64": "fp32"}


def by_name(gpu_rows: pl.DataFrame, top: int = 30) -> list[dict[str, Any]]:
    """Kernels grouped by name: class, count, total and mean time."""
    k = gpu_rows.filter(pl.col("kind") == "kernel")
    if k.height == 0:
        return []
    g = (
        k.group_by(pl.col("name").cast(pl.String), pl.col("kclass").cast(pl.String))
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"), pl.col("dur_ns").mean().alias("mean_ns"))
        .sort("total_ns", "name", descending=[True, False])
        .head(top)
    )
    return [
        {"name": n, "kclass": c, "count": cnt, "total_ns": int(t), "mean_ns": float(m)}
        for n, c, cnt, t, m in g.iter_rows()
    ]


def _bytes(name: str, args: dict, dtype: str | None) -> int | None:
    """Bytes a GEMM must move at least: its operands and result once."""
    dims = args.get("Input Dims")
    size = _ELEM_BYTES.get(dtype or "", None)
    if not isinstance(dims, list) or size is None:
        return None
    try:
        if name in ("aten::mm", "aten::_scaled_mm"):
            (m, k), (_, n) = dims[0], dims[1]
            return size * (m * k + k * n + m * n)
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return size * (m * k + k * n + m * n)
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (dims[0], dims[1]) if name == "aten::bmm" else (dims[1], dims[2])
            bt, m, k = a
            n = b[2]
            return size * bt * (m * k + k * n + m * n)
    except (TypeError, ValueError, IndexError):
        return None
    return None


def matmul_efficiency(
    df: pl.DataFrame, counted: pl.DataFrame, gpu_rows: pl.DataFrame, spec: GpuSpec | None, top: int = 20
) -> list[dict[str, Any]]:
    """Per (op, shapes, dtype): calls, FLOPs, kernel time, achieved TFLOP/s, % of the dtype's
    peak, arithmetic intensity against the ridge point (peak / memory bandwidth).  ``counted``
    is tracelens.flops.count(df)."""
    counted = counted.drop_nulls("flops")
    if counted.height == 0:
        return []
    ops = (
        df.select("name", "external_id", "args").with_row_index("_row").join(counted, on="_row")
        .filter(pl.col("external_id").is_not_null())
    )
    # a kernel's op: its own External id, else its launch's (ROCm kernels carry none)
    launch_ext = (
        df.filter(pl.col("kind").is_in(["runtime", "sync"]) & pl.col("correlation").is_not_null())
        .group_by("correlation").agg(pl.col("external_id").first().alias("_lext"))
    )
    k = (
        gpu_rows.filter(pl.col("kind") == "kernel")
        .join(launch_ext, on="correlation", how="left")
        .with_columns(pl.coalesce("external_id", "_lext").alias("_ext"))
        .group_by("_ext").agg(pl.col("dur_ns").sum().alias("kernel_ns"))
    )
    joined = ops.join(k, left_on="external_id", right_on="_ext", how="inner").filter(pl.col("kernel_ns") > 0)
    if joined.height == 0:
        return []
    rows: dict[tuple, dict[str, Any]] = {}
    for name, args_s, f, dtype, kns in joined.select(pl.col("name").cast(pl.String), "args", "flops", "dtype", "kernel_ns").iter_rows():
        try:
            args = orjson.loads(args_s) if args_s else {}
        except orjson.JSONDecodeError:
            args = {}
        shapes = str(args.get("Input Dims", ""))
        r = rows.setdefault((name, shapes, dtype), {"op": name, "shapes": shapes, "dtype": dtype, "calls": 0, "flops": 0.0,
                                                   "kernel_ns": 0, "bytes": 0, "bytes_known": True})
        r["calls"] += 1
        r["flops"] += f
        r["kernel_ns"] += kns
        b = _bytes(name, args, dtype)
        if b is None:
            r["bytes_known"] = False
        else:
            r["bytes"] += b
    out = []
    for r in rows.values():
        peak = spec.peak(_PEAK_OF.get(r["dtype"] or "", spec.reference_dtype)) if spec else None
        achieved = r["flops"] / (r["kernel_ns"] / 1e9)
        ai = r["flops"] / r["bytes"] if (r.pop("bytes_known") and r["bytes"]) else None
        ridge = (peak / (spec.mem_tbps * 1e12)) if (spec and peak and spec.mem_tbps) else None
        r.update(
            achieved_tflops=achieved / 1e12,
            of_peak=(achieved / peak) if peak else None,
            arithmetic_intensity=ai,
            bound=None if (ai is None or ridge is None) else ("memory" if ai < ridge else "compute"),
        )
        out.append(r)
    out.sort(key=lambda r: (-r["kernel_ns"], r["op"], r["shapes"]))
    return out[:top]
