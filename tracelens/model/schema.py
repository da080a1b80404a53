"""The event table: one polars schema for every input format, and the per-file metadata.

Every parser returns a frame with exactly ``EVENT_SCHEMA`` (same columns, same order, same
dtypes) plus one :class:`TraceMeta`.  Times are int64 nanoseconds on the source's own clock
(Kineto ``ts`` x 1000); ranks are aligned later by ``clock_offset_ns``, never by rewriting
``ts_ns``.

Columns
-------
file         Int32    index of the input file in the load (two files may claim one rank)
rank         Int32    global rank (distributedInfo, else the file name, else the file order)
source       Enum     which kind of input produced the row (``SOURCES``)
kind         Enum     what the row is (``KINDS``); every GPU kernel is ``kernel``, NCCL ones
                      included (their ``kclass`` is ``comm``); ``collective``/``p2p`` are the
                      host-side records of a collective (``record_param_comms``)
name         Categorical  op / kernel / range name as recorded
cat          Categorical  the source's own category string (``cpu_op``, ``Kernel`` ...)
pid, tid     Int64    host process / thread; null on device rows
device       Int32    GPU ordinal; null on host rows
stream       Int64    GPU stream (or HIP queue); null on host rows
ts_ns        Int64    start, ns, never null
dur_ns       Int64    duration, ns, never negative (null only for instant-like rows)
correlation  Int64    runtime launch <-> GPU activity link
external_id  Int64    op <-> launch link (``External id``); ids above int64 wrap to signed
kclass       Categorical  kernel class (``KCLASSES``; ``tracelens.model.kclass``); null on host rows
flops        Float64  FLOPs of the op (filled by the analysis from shapes; null = unknown)
bytes        Int64    bytes moved (copies, memsets, collectives)
collective   Categorical  normalised collective (allreduce, allgather, reducescatter, ...)
group        Categorical  process group name (``Process Group Name``)
group_desc   Categorical  process group description (``default_pg``, user ``group_desc``)
group_size   Int32    ranks in the process group
seq          Int64    sequence number of the collective within its group (matches ranks)
dtype        Categorical  element type of a collective (``Float``, ``BFloat16`` ...)
args         String   what an analysis reads of the event's ``args``, as JSON (no line breaks): on host ops and
                      annotations the ``Input Dims``, ``Input type``, ``Concrete Inputs``, ``Sequence
                      number`` and ``Process Group ID/Ranks`` keys they have; on a collective's record
                      (``record_param_comms``) all of them; null on other rows (their fields are columns)

Collective rows
---------------
``COLLECTIVE_SCHEMA``: the only per-event data that crosses ranks (DESIGN.md 8).  One row per
rank x collective instance, i.e. per (file, group, group_desc, seq, collective): every
communication kernel of that collective on that rank (coalesced, several streams) folded into
one span.  Each rank derives its own rows (``tracelens.analysis.rank.collectives``), exposed
time included, since that needs the rank's compute kernels; the job reduce
(``tracelens.analysis.job``) matches them across ranks by (group, seq, collective) and reads
nothing else of the events.

file         Int32    input file index (two files may claim one rank)
rank         Int32    the file's global rank (``TraceMeta.rank``; null when unknown)
group        String   process group name; "" when unknown (so that keys with it still join)
group_desc   String   process group description (``default_pg`` ...); null when unknown
seq          Int64    sequence number within the group (the trace's, or derived from the
                      rank's order: ``TraceMeta.attributes["seq_source"]``); never null
collective   String   normalised collective (allreduce ...); "" when unknown
start_ns     Int64    first start of its kernels, on the rank's own clock
end_ns       Int64    last end of its kernels, on the rank's own clock
bytes        Int64    bytes it moves (the largest over its kernels); null when unknown
group_size   Int32    ranks in the group (the largest stated over its kernels); null when unknown
on_host      Boolean  its spans are host-side records (a rank without GPU communication
                      kernels, e.g. CPU-only gloo), not GPU kernels
exposed_ns   Int64    time of its kernels (their union) not under the rank's compute union
n_parts      Int32    kernels (or host records) folded into the row
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from tracelens.model.saved import SCHEMA_VERSION  # noqa: F401 (the report's version; re-exported)

SOURCES = ("kineto", "nsys", "nccl_log", "flight_recorder", "nccl_profiler", "nccl_inspector", "nccl_tests")

KINDS = (
    "cpu_op",
    "annotation",
    "python",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "collective",
    "p2p",
    "sync",
    "step",
    "dataloader",
    "other",
)

# Kernel classes (MFU.md 2.6).  ``comm``/``memcpy``/``memset`` are the non-compute classes of
# the GPU-time partition; everything else is compute.
KCLASSES = (
    "comm",
    "memcpy",
    "memset",
    "attention",
    "conv",
    "gemm",
    "moe_routing",
    "embedding",
    "norm",
    "softmax_reduce",
    "optimizer",
    "cast_quant",
    "elementwise",
    "copy",
    "other",
)
NON_COMPUTE_KCLASSES = ("comm", "memcpy", "memset")

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.Int32(),
    "rank": pl.Int32(),
    "source": pl.Enum(SOURCES),
    "kind": pl.Enum(KINDS),
    "name": pl.Categorical(),
    "cat": pl.Categorical(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "device": pl.Int32(),
    "stream": pl.Int64(),
    "ts_ns": pl.Int64(),
    "dur_ns": pl.Int64(),
    "correlation": pl.Int64(),
    "external_id": pl.Int64(),
    "kclass": pl.Categorical(),
    "flops": pl.Float64(),
    "bytes": pl.Int64(),
    "collective": pl.Categorical(),
    "group": pl.Categorical(),
    "group_desc": pl.Categorical(),
    "group_size": pl.Int32(),
    "seq": pl.Int64(),
    "dtype": pl.Categorical(),
    "args": pl.String(),
}

DEVICE_KINDS = ("kernel", "memcpy", "memset")

# Where an event ends: ``ts_ns + dur_ns`` (null where ``dur_ns`` is: an instant-like row).  The
# one spelling of it, so that every analysis means the same end.
END: pl.Expr = pl.col("ts_ns") + pl.col("dur_ns")

# The collective rows (COLLECTIVE_SCHEMA, columns in the module docstring): one row per rank x
# (group, group_desc, seq, collective), derived by each rank, exposed time included; the job
# reduce reads only these of the events.
COLLECTIVE_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.Int32(),
    "rank": pl.Int32(),
    "group": pl.String(),
    "group_desc": pl.String(),
    "seq": pl.Int64(),
    "collective": pl.String(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "bytes": pl.Int64(),
    "group_size": pl.Int32(),
    "on_host": pl.Boolean(),
    "exposed_ns": pl.Int64(),
    "n_parts": pl.Int32(),
}
# the key of one collective instance across ranks, and the order of the rows (total with file)
COLLECTIVE_KEY = ("group", "seq", "collective", "group_desc")


class SchemaError(ValueError):
    """A frame does not follow EVENT_SCHEMA or breaks one of its invariants."""


def empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


def conform_exprs(columns: list[str]) -> list[pl.Expr]:
    """Expressions that turn a frame with ``columns`` into EVENT_SCHEMA (missing ones null)."""
    return [
        pl.col(col).cast(dtype) if col in columns else pl.lit(None, dtype=dtype).alias(col)
        for col, dtype in EVENT_SCHEMA.items()
    ]


def conform(df: pl.DataFrame) -> pl.DataFrame:
    """Add missing columns as nulls, cast to the schema's dtypes and order the columns."""
    return df.select(conform_exprs(df.columns))


def validate(df: pl.DataFrame) -> pl.DataFrame:
    """Check a frame against EVENT_SCHEMA and its invariants; return it unchanged.

    Raises SchemaError naming the first problem: wrong/missing/extra columns or dtypes,
    null ``ts_ns``/``kind``/``name``, negative durations, device rows without a device,
    or a kernel row without a kernel class.
    """
    got = dict(df.schema)
    if list(got) != list(EVENT_SCHEMA):
        missing = [c for c in EVENT_SCHEMA if c not in got]
        extra = [c for c in got if c not in EVENT_SCHEMA]
        raise SchemaError(f"columns differ from EVENT_SCHEMA (missing {missing}, extra {extra}, or order)")
    for col, dtype in EVENT_SCHEMA.items():
        if got[col] != dtype:
            raise SchemaError(f"column {col!r} has dtype {got[col]}, expected {dtype}")
    if df.height == 0:
        return df
    checks = df.select(
        pl.col("ts_ns").null_count().alias("null_ts"),
        pl.col("kind").null_count().alias("null_kind"),
        pl.col("name").null_count().alias("null_name"),
        (pl.col("dur_ns") < 0).sum().alias("neg_dur"),
        (pl.col("kind").is_in(DEVICE_KINDS) & pl.col("device").is_null()).sum().alias("dev_no_device"),
        ((pl.col("kind") == "kernel") & pl.col("kclass").is_null()).sum().alias("kernel_no_class"),
        (pl.col("kind").is_in(["cpu_op", "runtime", "python"]) & pl.col("tid").is_null()).sum().alias("host_no_tid"),
        pl.col("rank").null_count().alias("null_rank"),
    ).row(0, named=True)
    for key, msg in (
        ("null_ts", "rows with null ts_ns"),
        ("null_kind", "rows with null kind"),
        ("null_name", "rows with null name"),
        ("neg_dur", "rows with negative dur_ns"),
        ("dev_no_device", "device rows without a device"),
        ("kernel_no_class", "kernel rows without a kclass"),
        ("host_no_tid", "host rows without a tid"),
        ("null_rank", "rows without a rank"),
    ):
        if checks[key]:
            raise SchemaError(f"{checks[key]} {msg}")
    bad = set(df.get_column("kclass").drop_nulls().unique().cast(pl.String).to_list()) - set(KCLASSES)
    if bad:
        raise SchemaError(f"unknown kernel classes {sorted(bad)}")
    return df


@dataclass
class TraceMeta:
    """What one input file says about itself (everything but the events)."""

    path: str
    format: str  # "kineto", ...
    source: str  # value of the ``source`` column
    parser: str
    parser_version: str
    size_bytes: int
    content_hash: str = ""
    uncompressed_bytes: int | None = None
    rank: int | None = None
    rank_source: str = "unknown"  # distributedInfo | filename | order
    world_size: int | None = None
    backend: str | None = None
    distributed: dict[str, Any] = field(default_factory=dict)  # distributedInfo as recorded
    device_id: int | None = None  # the GPU this rank's kernels ran on
    device_name: str | None = None
    device_properties: dict[str, Any] = field(default_factory=dict)  # of device_id
    devices: list[dict[str, Any]] = field(default_factory=list)  # every deviceProperties entry
    platform: str | None = None  # cuda | rocm | None (CPU only)
    trace_schema: str | None = None  # "2021" (capitalised categories) | "current"
    base_time_ns: int | None = None
    clock_offset_ns: int = 0
    threads: dict[str, str] = field(default_factory=dict)  # "pid:tid" -> thread name
    attributes: dict[str, Any] = field(default_factory=dict)  # other top-level scalars
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceMeta:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
