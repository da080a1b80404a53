"""The frames ``read`` fetched -> the event table (``EVENT_SCHEMA``), with the names and kinds the
analysis knows from Kineto traces, so that nothing downstream needs to know the source:

* kernels: ``kernel``, the demangled name (else the short one), their class by name
  (``tracelens.model.kclass``: ``nccl*`` kernels are ``comm``);
* copies: ``memcpy`` named like Kineto's (``Memcpy HtoD (Pinned -> Device)``), with their bytes;
  fills: ``memset`` (``Memset (Device)``);
* CUDA runtime and driver calls: ``runtime`` (``cat`` ``cuda_runtime`` / ``cuda_driver``), their
  ``_vNNNN`` API-version suffix dropped (``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``); the
  synchronising ones (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ...) are ``sync``, and
  the ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` records are ``sync`` rows on their stream, as
  Kineto's ``cuda_sync`` events are;
* NVTX ranges: ``annotation`` (``cat`` ``nvtx``, or ``nvtx:DOMAIN``); a step range (``ProfilerStep#N``,
  or one named ``step``, ``train_step_3``, ``iteration 3`` ...) is ``step`` named ``<name>#N``; a
  DataLoader range ``dataloader``; NCCL's API ranges (domain ``NCCL``: ``ncclAllReduce`` ...)
  ``collective`` / ``p2p`` records;
* OS runtime calls (``cat`` ``osrt``), cuBLAS and cuDNN API ranges (``cublas`` / ``cudnn``): ``other``.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from tracelens.model.collectives import P2P, normalize_collective
from tracelens.model.kclass import classify, collective_from_kernel
from tracelens.model.schema import conform

MAX_NAME_BYTES = 64 << 10  # as the Kineto parser: a longer name is cut

# CUPTI's copy kinds and memory kinds, as Kineto names them (ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND)
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static",
             7: "Unknown"}
SYNC_TYPES = {0: "Unknown", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
RUNTIME_CLASSES = {0: "cuda_runtime", 1: "cuda_driver"}

_API_VERSION = r"_v\d{4,}$"  # cudaLaunchKernel_v7000, cudaGetDeviceProperties_v2_v12000 (not cuGetProcAddress_v2)
_SYNC_RE = r"^(cuda|cu)(Device|Stream|Event|Ctx)Synchronize"
_PROFILER_STEP = r"^(ProfilerStep#\d+)(?:\D.*)?$"  # emit_nvtx adds ", seq = N" to some names
# a range the user's code names as a step: "step", "train_step", "train_step_3", "Step 3", "iteration#3"
_USER_STEP = r"(?i)^((?:train(?:ing)?[_ -]?)?(?:step|iteration|iter))(?:[ _#:-]*(\d+))?$"
_DATALOADER_RE = r"(?i)enumerate\(DataLoader\)|DataLoaderIter\.__next__|^## data_load"
NCCL_DOMAIN = "NCCL"


def _dur(end: str = "end_ns") -> pl.Expr:
    return (pl.col(end) - pl.col("ts_ns")).clip(lower_bound=0).alias("dur_ns")


def _valid(df: pl.DataFrame, need: list[str], what: str, counts: Counter[str]) -> pl.DataFrame:
    """Drop the rows without a value in ``need`` (a damaged row costs that row), counting them."""
    bad = pl.any_horizontal(pl.col(c).is_null() for c in need)
    n = df.select(bad.sum()).item()
    if n:
        counts[f"{what} without {'/'.join(need)}"] += n
        df = df.filter(~bad)
    neg = df.select((pl.col("end_ns") < pl.col("ts_ns")).sum()).item() if "end_ns" in df.columns else 0
    if neg:
        counts[f"{what} ending before they start (given 0 duration)"] += neg
    return df


def _names(col: str = "name") -> pl.Expr:
    return pl.col(col).fill_null("").str.slice(0, MAX_NAME_BYTES)


def kernels(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "kernels", counts)
    unnamed = df.select(pl.col("name").is_null().sum()).item()
    if unnamed:
        counts["kernels without a name (named 'unknown kernel')"] += unnamed
    df = df.with_columns(pl.col("name").fill_null("unknown kernel").str.slice(0, MAX_NAME_BYTES))
    names = df.get_column("name").unique().to_list()
    classes = {n: classify(n) for n in names}
    comm = {n: collective_from_kernel(n) for n in names if classes[n] == "comm"}
    return df.with_columns(
        pl.lit("kernel").alias("kind"), pl.lit("kernel").alias("cat"), _dur(),
        pl.col("name").replace_strict(classes, default="other", return_dtype=pl.String).alias("kclass"),
        (pl.col("name").replace_strict(comm, default=None, return_dtype=pl.String) if comm else pl.lit(None, pl.String))
        .alias("collective"),
    )


def _labels(col: str, table: dict[int, str], default: str = "Unknown") -> pl.Expr:
    return pl.col(col).replace_strict(table, default=default, return_dtype=pl.String)


def memcpys(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "copies", counts)
    name = pl.format("Memcpy {} ({} -> {})", _labels("copy_kind", COPY_KINDS), _labels("src_kind", MEM_KINDS),
                     _labels("dst_kind", MEM_KINDS))
    return df.with_columns(name.alias("name"), pl.lit("memcpy").alias("kind"), pl.lit("gpu_memcpy").alias("cat"),
                           pl.lit("memcpy").alias("kclass"), _dur())


def memsets(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "fills", counts)
    name = pl.format("Memset ({})", _labels("mem_kind", MEM_KINDS))
    return df.with_columns(name.alias("name"), pl.lit("memset").alias("kind"), pl.lit("gpu_memset").alias("cat"),
                           pl.lit("memset").alias("kclass"), _dur())


def syncs(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "synchronisation records", counts)
    return df.with_columns(_labels("sync_type", SYNC_TYPES).alias("name"), pl.lit("sync").alias("kind"),
                           pl.lit("cuda_sync").alias("cat"), _dur())


def runtime(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "tid"], "runtime calls", counts)
    name = pl.col("name").fill_null("unknown CUDA call").str.replace(_API_VERSION, "")
    return df.with_columns(name.alias("name")).with_columns(
        pl.when(pl.col("name").str.contains(_SYNC_RE)).then(pl.lit("sync")).otherwise(pl.lit("runtime")).alias("kind"),
        _labels("event_class", RUNTIME_CLASSES, "cuda_runtime").alias("cat"), _dur(),
    )


def host_calls(df: pl.DataFrame, cat: str, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "tid"], f"{cat} calls", counts)
    return df.with_columns(_names(), pl.lit("other").alias("kind"), pl.lit(cat).alias("cat"), _dur())


def nvtx(df: pl.DataFrame, domains: dict[int, str], counts: Counter[str]) -> pl.DataFrame:
    """NVTX ranges: annotations, steps, DataLoader spans and NCCL's collective records."""
    df = _valid(df, ["ts_ns", "end_ns", "tid"], "NVTX ranges", counts)
    unnamed = df.select(pl.col("name").is_null().sum()).item()
    if unnamed:
        counts["NVTX ranges without a message (named 'unnamed range')"] += unnamed
    dom = pl.col("domain").replace_strict(domains, default=None, return_dtype=pl.String) if domains else pl.lit(None, pl.String)
    df = df.with_columns(pl.col("name").fill_null("unnamed range").str.slice(0, MAX_NAME_BYTES), dom.alias("_domain"))
    # steps: ProfilerStep#N as recorded; a user's step range numbered by the number in its name, else in order
    user = pl.col("name").str.extract(_USER_STEP, 1)
    num = pl.col("name").str.extract(_USER_STEP, 2).cast(pl.Int64, strict=False)
    df = df.with_columns(pl.col("name").str.extract(_PROFILER_STEP, 1).alias("_pstep"), user.alias("_ustep"), num.alias("_unum"))
    df = df.sort("ts_ns", "end_ns", maintain_order=True).with_columns(
        pl.when(pl.col("_ustep").is_not_null())
        .then(pl.coalesce("_unum", pl.int_range(pl.len(), dtype=pl.Int64).over(["tid", "_ustep"])))
        .alias("_unum"))
    # NCCL's API ranges: the collective records of its calls
    nccl = pl.col("_domain") == NCCL_DOMAIN
    api = pl.col("name").str.extract(r"^nccl([A-Za-z]+)$", 1)
    colls = {a: normalize_collective(a) for a in df.filter(nccl).select(api.alias("a")).get_column("a").drop_nulls().unique()}
    colls = {a: c for a, c in colls.items() if c is not None}
    coll = (pl.when(nccl).then(api.replace_strict(colls, default=None, return_dtype=pl.String)) if colls
            else pl.lit(None, pl.String))
    df = df.with_columns(coll.alias("collective"))
    kind = (
        pl.when(pl.col("_pstep").is_not_null() | pl.col("_ustep").is_not_null()).then(pl.lit("step"))
        .when(pl.col("collective").is_in(list(P2P))).then(pl.lit("p2p"))
        .when(pl.col("collective").is_not_null()).then(pl.lit("collective"))
        .when(pl.col("name").str.contains(_DATALOADER_RE)).then(pl.lit("dataloader"))
        .otherwise(pl.lit("annotation"))
    )
    name = (pl.when(pl.col("_pstep").is_not_null()).then(pl.col("_pstep"))
            .when(pl.col("_ustep").is_not_null()).then(pl.format("{}#{}", pl.col("_ustep"), pl.col("_unum")))
            .otherwise(pl.col("name")))
    cat = pl.when(pl.col("_domain").is_not_null()).then(pl.format("nvtx:{}", pl.col("_domain"))).otherwise(pl.lit("nvtx"))
    return df.with_columns(kind.alias("kind"), name.alias("name"), cat.alias("cat"), _dur())


def assemble(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The normalised frames as one event table, in time order (source, file and rank filled later)."""
    parts = [p.drop([c for c in p.columns if c.startswith("_") or c in _DROP]) for p in parts if p.height]
    if not parts:
        return conform(pl.DataFrame({"ts_ns": pl.Series([], dtype=pl.Int64)}))
    df = pl.concat(parts, how="diagonal_relaxed").with_columns(
        pl.lit("nsys").alias("source"), pl.lit(0, dtype=pl.Int32).alias("file"), pl.lit(-1, dtype=pl.Int32).alias("rank"))
    return conform(df.sort("ts_ns", "dur_ns", maintain_order=True))


_DROP = ("end_ns", "copy_kind", "src_kind", "dst_kind", "mem_kind", "sync_type", "event_class", "event_type", "domain")
