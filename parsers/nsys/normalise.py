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
from collections.abc import Callable

import polars as pl

from tracelens.model.collectives import P2P, normalize_collective
from tracelens.model.kclass import classify, collective_from_kernel
from tracelens.model.schema import EVENT_SCHEMA, conform

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


def _final(df: pl.DataFrame) -> pl.DataFrame:
    """Only the event table's columns, in its dtypes (what a table needed on the way is let go now)."""
    return df.select(pl.col(c).cast(EVENT_SCHEMA[c]) for c in df.columns if c in EVENT_SCHEMA)


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


def _const(col: str, value: str) -> pl.Expr:
    """A column of one value, held as the event table holds it (a code, not a string per row)."""
    return pl.lit(value, dtype=EVENT_SCHEMA[col]).alias(col)


def _derive(df: pl.DataFrame, keys: list[str], derive: Callable[[pl.DataFrame], pl.DataFrame],
            names: pl.DataFrame | None = None) -> pl.DataFrame:
    """``df`` with the columns ``derive`` computes from each distinct value of ``keys`` joined on
    (string work per distinct name, not per row; the strings then held as the event table's codes).
    With ``names``, the first key is a StringIds id and ``derive`` sees its text as ``name``."""
    t = df.select(keys).unique(maintain_order=True)
    if names is not None:
        t = t.join(names.select(pl.col("id").alias(keys[0]), pl.col("value").alias("name")), on=keys[0], how="left",
                   maintain_order="left")
    t = derive(t)
    t = t.with_columns(pl.col(c).cast(EVENT_SCHEMA.get(c, pl.Categorical)) for c, dt in t.schema.items()
                       if dt == pl.String and c not in keys)
    # the join on the key columns alone: the frame's other columns are not copied
    got = df.select(keys).join(t, on=keys, how="left", maintain_order="left", nulls_equal=True).drop(keys)
    df = df.drop(keys[0]) if names is not None else df.drop([c for c in got.columns if c in df.columns])
    return df.hstack(got)


def _names(col: str = "name") -> pl.Expr:
    return pl.col(col).fill_null("").str.slice(0, MAX_NAME_BYTES)


def _name_id(cols: list[str], names: pl.DataFrame) -> pl.Expr:
    """The first of the id columns ``cols`` that names a text string."""
    ids = names.get_column("id").implode()
    return pl.coalesce([pl.when(pl.col(c).is_in(ids)).then(pl.col(c)) for c in cols])


def kernels(df: pl.DataFrame, names: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "kernels", counts)
    ids = [c for c in df.columns if c.startswith("name_id")]
    df = df.with_columns(_name_id(ids, names).alias("name_id")).drop([c for c in ids if c != "name_id"])
    unnamed = df.select(pl.col("name_id").is_null().sum()).item()
    if unnamed:
        counts["kernels without a name (named 'unknown kernel')"] += unnamed

    def derive(t: pl.DataFrame) -> pl.DataFrame:
        t = t.with_columns(pl.col("name").fill_null("unknown kernel").str.slice(0, MAX_NAME_BYTES))
        uniq = t.get_column("name").unique().to_list()
        classes = {n: classify(n) for n in uniq}
        comm = {n: collective_from_kernel(n) for n in uniq if classes[n] == "comm"}
        return t.with_columns(
            pl.col("name").replace_strict(classes, default="other", return_dtype=pl.String).alias("kclass"),
            (pl.col("name").replace_strict(comm, default=None, return_dtype=pl.String) if comm else pl.lit(None, pl.String))
            .alias("collective"))

    df = _derive(df, ["name_id"], derive, names)
    return _final(df.with_columns(_const("kind", "kernel"), _const("cat", "kernel"), _dur()))


def _labels(col: str, table: dict[int, str], default: str = "Unknown") -> pl.Expr:
    return pl.col(col).replace_strict(table, default=default, return_dtype=pl.String)


def memcpys(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "copies", counts)
    name = pl.format("Memcpy {} ({} -> {})", _labels("copy_kind", COPY_KINDS), _labels("src_kind", MEM_KINDS),
                     _labels("dst_kind", MEM_KINDS))
    df = _derive(df, ["copy_kind", "src_kind", "dst_kind"], lambda t: t.with_columns(name.alias("name")))
    return _final(df.with_columns(_const("kind", "memcpy"), _const("cat", "gpu_memcpy"), _const("kclass", "memcpy"), _dur()))


def memsets(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "fills", counts)
    name = pl.format("Memset ({})", _labels("mem_kind", MEM_KINDS))
    df = _derive(df, ["mem_kind"], lambda t: t.with_columns(name.alias("name")))
    return _final(df.with_columns(_const("kind", "memset"), _const("cat", "gpu_memset"), _const("kclass", "memset"), _dur()))


def syncs(df: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "device"], "synchronisation records", counts)
    df = _derive(df, ["sync_type"], lambda t: t.with_columns(_labels("sync_type", SYNC_TYPES).alias("name")))
    return _final(df.with_columns(_const("kind", "sync"), _const("cat", "cuda_sync"), _dur()))


def runtime(df: pl.DataFrame, names: pl.DataFrame, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "tid"], "runtime calls", counts)
    df = df.with_columns(_name_id(["name_id"], names).alias("name_id"))

    def derive(t: pl.DataFrame) -> pl.DataFrame:
        t = t.with_columns(pl.col("name").fill_null("unknown CUDA call").str.replace(_API_VERSION, ""))
        return t.with_columns(pl.when(pl.col("name").str.contains(_SYNC_RE)).then(pl.lit("sync")).otherwise(pl.lit("runtime"))
                              .alias("kind"))

    df = _derive(df, ["name_id"], derive, names)
    df = _derive(df, ["event_class"], lambda t: t.with_columns(_labels("event_class", RUNTIME_CLASSES, "cuda_runtime").alias("cat")))
    return _final(df.with_columns(_dur()))


def host_calls(df: pl.DataFrame, names: pl.DataFrame, cat: str, counts: Counter[str]) -> pl.DataFrame:
    df = _valid(df, ["ts_ns", "end_ns", "tid"], f"{cat} calls", counts)
    df = df.with_columns(_name_id(["name_id"], names).alias("name_id"))
    df = _derive(df, ["name_id"], lambda t: t.with_columns(_names()), names)
    return _final(df.with_columns(_const("kind", "other"), _const("cat", cat), _dur()))


def nvtx(df: pl.DataFrame, names: pl.DataFrame, domains: dict[int, str], counts: Counter[str]) -> pl.DataFrame:
    """NVTX ranges: annotations, steps, DataLoader spans and NCCL's collective records."""
    df = _valid(df, ["ts_ns", "end_ns", "tid"], "NVTX ranges", counts)
    # the name: the range's own text, else the registered string of its textId (Categorical codes per row)
    df = df.with_columns(pl.col("text").cast(pl.Categorical), _name_id(["text_id"], names).alias("text_id"))
    df = _derive(df, ["text_id"], lambda t: t, names)
    df = df.with_columns(pl.coalesce("text", "name").alias("name")).drop("text")
    unnamed = df.select(pl.col("name").is_null().sum()).item()
    if unnamed:
        counts["NVTX ranges without a message (named 'unnamed range')"] += unnamed
    dom = pl.col("domain").replace_strict(domains, default=None, return_dtype=pl.String) if domains else pl.lit(None, pl.String)
    colls: dict[str, str] = {}

    def derive(t: pl.DataFrame) -> pl.DataFrame:
        # per distinct (name, domain): steps (ProfilerStep#N as recorded; a user's step range numbered by the
        # number in its name, else in order below), NCCL's API ranges (the collective records of its calls)
        t = t.with_columns(pl.col("name").cast(pl.String).fill_null("unnamed range").str.slice(0, MAX_NAME_BYTES).alias("_n"),
                           dom.alias("_domain"))
        user = pl.col("_n").str.extract(_USER_STEP, 1)
        num = pl.col("_n").str.extract(_USER_STEP, 2).cast(pl.Int64, strict=False)
        t = t.with_columns(pl.col("_n").str.extract(_PROFILER_STEP, 1).alias("_pstep"), user.alias("_ustep"), num.alias("_num"))
        nccl = pl.col("_domain") == NCCL_DOMAIN
        api = pl.col("_n").str.extract(r"^nccl([A-Za-z]+)$", 1)
        found = {a: normalize_collective(a) for a in t.filter(nccl).select(api.alias("a")).get_column("a").drop_nulls().unique()}
        colls.update({a: c for a, c in found.items() if c is not None})
        coll = (pl.when(nccl).then(api.replace_strict(colls, default=None, return_dtype=pl.String)) if colls
                else pl.lit(None, pl.String))
        t = t.with_columns(coll.alias("collective"))
        kind = (
            pl.when(pl.col("_pstep").is_not_null() | pl.col("_ustep").is_not_null()).then(pl.lit("step"))
            .when(pl.col("collective").is_in(list(P2P))).then(pl.lit("p2p"))
            .when(pl.col("collective").is_not_null()).then(pl.lit("collective"))
            .when(pl.col("_n").str.contains(_DATALOADER_RE)).then(pl.lit("dataloader"))
            .otherwise(pl.lit("annotation"))
        )
        cat = pl.when(pl.col("_domain").is_not_null()).then(pl.format("nvtx:{}", pl.col("_domain"))).otherwise(pl.lit("nvtx"))
        return t.with_columns(kind.alias("kind"), cat.alias("cat"), pl.coalesce("_pstep", "_n").alias("_n")).drop("_domain")

    df = _derive(df, ["name", "domain"], derive)
    df = df.sort("ts_ns", "end_ns", maintain_order=True).with_columns(
        pl.when(pl.col("_ustep").is_not_null())
        .then(pl.coalesce("_num", pl.int_range(pl.len(), dtype=pl.Int64).over(["tid", "_ustep"])))
        .alias("_num"))
    # a user's step is named <step>#N: one string per distinct (step, N), not per row
    steps = df.filter(pl.col("_ustep").is_not_null()).select("_ustep", "_num").unique(maintain_order=True)
    steps = steps.with_columns(pl.format("{}#{}", pl.col("_ustep"), pl.col("_num")).cast(pl.Categorical).alias("_uname"))
    df = df.join(steps, on=["_ustep", "_num"], how="left", maintain_order="left")
    name = pl.when(pl.col("_uname").is_not_null()).then(pl.col("_uname")).otherwise(pl.col("_n"))
    return _final(df.with_columns(name.alias("name"), _dur()))


def assemble(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The normalised frames as one event table, in time order (source, file and rank filled later).
    Empties ``parts`` (each frame is let go once it is in the table)."""
    keep = []
    while parts:
        p = parts.pop(0)
        if p.height:
            keep.append(_final(p))
    if not keep:
        return conform(pl.DataFrame({"ts_ns": pl.Series([], dtype=pl.Int64)}))
    df = pl.concat(keep, how="diagonal_relaxed", rechunk=False)  # only the columns some part has
    keep.clear()
    # in time order, a column at a time (each unsorted column let go once its sorted copy is made)
    order = df.select(pl.arg_sort_by("ts_ns", "dur_ns", maintain_order=True)).to_series()
    df = pl.DataFrame([df.drop_in_place(c).gather(order) for c in list(df.columns)])
    # the columns no nsys row has, and the constant ones: one value for the column, not a buffer per row
    return conform(df.with_columns(_const("source", "nsys"), pl.lit(0, dtype=pl.Int32).alias("file"),
                                   pl.lit(-1, dtype=pl.Int32).alias("rank")))

