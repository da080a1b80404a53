"""What NCCL's own records hold: the rows its logs and PyTorch's Flight Recorder dumps give
(``NCCL_ROW_SCHEMA``), and NCCL's enums (FORMATS.md 2.2).

``NCCL_ROW_SCHEMA`` is ``COLLECTIVE_SCHEMA`` (its columns first, same dtypes but for the strings, held as
Categorical: ``rows.cast(COLLECTIVE_SCHEMA)`` of its columns gives plain collective rows) plus what a hang
diagnosis compares across ranks.  Every string column but ``frames`` is Categorical (4 bytes a row where a
String is a 16-byte view, plus its heap past 12 bytes: a communicator's ``0x...`` id, a host name), ``source``
the event table's Enum; a concat with a frame whose column is String (``how="diagonal_relaxed"``) gives String;
a join on one of them with a String frame needs a cast (``as_strings``):

group, group_desc, collective   Categorical   (``COLLECTIVE_SCHEMA``'s String columns)
source       Enum     ``nccl_log`` | ``flight_recorder`` ... (``tracelens.model.schema.SOURCES``)
member       Categorical  who issued it within the group: the rank when known, else ``host:pid[dev]``
op_name      Categorical  the name as recorded (``AllReduce``, ``gloo:all_reduce`` ...)
count        Int64    elements (NCCL's ``count``; Flight Recorder: the input's elements)
out_count    Int64    output elements (Flight Recorder); null in logs
dtype        Categorical  element type (``float32``; torch names as recorded: ``Float``)
root         Int32    root (Broadcast/Reduce) or peer (Send/Recv); null when the source has none
redop        Categorical  reduction op (``sum`` ...); null when not logged
state        Categorical  ``scheduled`` | ``started`` | ``completed`` (a log line: ``scheduled``)
p2p_seq      Int64    Flight Recorder ``p2p_seq_id``; null in logs
comm         Categorical  the communicator in its process (log ``comm`` pointer; FR ``pg_id``)
host, pid    Categorical, Int64   the process (logs); null when unknown
order        Int64    the row's place in its file (line number, FR ``record_id``)
frames       String   stack frames, JSON list of ``[name, filename, line]`` (FR pickles); null elsewhere
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracelens.model.schema import COLLECTIVE_SCHEMA, SOURCES

_CAT = pl.Categorical()
NCCL_ROW_SCHEMA: dict[str, pl.DataType] = {
    **COLLECTIVE_SCHEMA,
    "group": _CAT,
    "group_desc": _CAT,
    "collective": _CAT,
    "source": pl.Enum(SOURCES),
    "member": _CAT,
    "op_name": _CAT,
    "count": pl.Int64(),
    "out_count": pl.Int64(),
    "dtype": _CAT,
    "root": pl.Int32(),
    "redop": _CAT,
    "state": _CAT,
    "p2p_seq": pl.Int64(),
    "comm": _CAT,
    "host": _CAT,
    "pid": pl.Int64(),
    "order": pl.Int64(),
    "frames": pl.String(),
}


def as_strings(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with its Categorical and Enum columns as String: for code that joins them with String frames."""
    return rows.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))


# the communicators an NCCL log names: one row per (file, host, pid, comm pointer)
COMM_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.Int32(), "host": pl.String(), "pid": pl.Int64(), "comm": pl.String(), "comm_id": pl.String(),
    "rank": pl.Int32(), "nranks": pl.Int32(), "cuda_dev": pl.Int32(), "nvml_dev": pl.Int32(), "bus_id": pl.String(),
    "nnodes": pl.Int32(), "local_ranks": pl.Int32(), "launcher_rank": pl.Int32(),
}

# ncclDataType_t, ncclRedOp_t
NCCL_DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
               "float8_e4m3", "float8_e5m2")
NCCL_REDOPS = ("sum", "prod", "max", "min", "avg")

# NCCL's op names (COLL lines) -> the normalised collective
NCCL_OPS = {
    "AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reducescatter", "Broadcast": "broadcast",
    "Bcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv", "AlltoAll": "alltoall",
    "AllToAll": "alltoall", "Gather": "gather", "Scatter": "scatter", "PutSignal": "putsignal", "Signal": "signal",
    "WaitSignal": "waitsignal",
}


# columns beyond NCCL_ROW_SCHEMA that NCCL's profilers give (the profiler plugin, Inspector); rows of
# other sources lack them (``pl.concat(..., how="diagonal_relaxed")`` fills nulls)
NCCL_DETAIL_SCHEMA: dict[str, pl.DataType] = {
    "algo": pl.String(), "proto": pl.String(), "channels": pl.Int32(), "dur_ns": pl.Int64(),
    "algbw_gbps": pl.Float64(), "busbw_gbps": pl.Float64(), "detail": pl.String(),
}

# one measured bandwidth (an nccl-tests row's out-of-place or in-place block; an Inspector record):
# the report's ``job.nccl.bandwidth`` items, keys exactly these
BANDWIDTH_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String(), "test": pl.String(), "collective": pl.String(), "nranks": pl.Int32(), "bytes": pl.Int64(),
    "count": pl.Int64(), "dtype": pl.String(), "redop": pl.String(), "root": pl.Int32(), "in_place": pl.Boolean(),
    "time_us": pl.Float64(), "algbw_gbps": pl.Float64(), "busbw_gbps": pl.Float64(), "wrong": pl.Int64(),
}

# nccl-tests / NCCL type tokens -> the names NCCL_DTYPES uses
NCCL_TYPE_TOKENS = {
    "float": "float32", "half": "float16", "double": "float64", "bfloat16": "bfloat16", "int8": "int8", "uint8": "uint8",
    "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64", "int": "int32", "char": "int8",
    "ncclFloat32": "float32", "ncclFloat": "float32", "ncclFloat16": "float16", "ncclHalf": "float16",
    "ncclFloat64": "float64", "ncclDouble": "float64", "ncclBfloat16": "bfloat16", "ncclInt8": "int8",
    "ncclChar": "int8", "ncclUint8": "uint8", "ncclInt32": "int32", "ncclInt": "int32", "ncclUint32": "uint32",
    "ncclInt64": "int64", "ncclUint64": "uint64", "ncclFloat8e4m3": "float8_e4m3", "ncclFloat8e5m2": "float8_e5m2",
    "f8e4m3": "float8_e4m3", "f8e5m2": "float8_e5m2",
}
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2, "float32": 4,
               "float64": 8, "bfloat16": 2, "float8_e4m3": 1, "float8_e5m2": 1}

# collectives whose algbw uses the full (n x per-rank) buffer, and whose busbw factor is (n-1)/n (FORMATS 4.2)
FULL_BUFFER = ("allgather", "reducescatter", "alltoall", "gather", "scatter")


def busbw_factor(collective: str, nranks: int | None) -> float | None:
    """busbw / algbw for ``collective`` over ``nranks`` ranks (nccl-tests' ``*GetBw``, FORMATS 4.2)."""
    if not nranks or nranks < 1:
        return None
    if collective == "allreduce":
        return 2 * (nranks - 1) / nranks
    if collective in FULL_BUFFER:
        return (nranks - 1) / nranks
    if collective in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        return 1.0
    return None


def busbw_factor_expr(collective: pl.Expr, nranks: pl.Expr) -> pl.Expr:
    """``busbw_factor`` as a polars expression."""
    n = nranks.cast(pl.Float64)
    return (pl.when(collective == "allreduce").then(2 * (n - 1) / n)
            .when(collective.is_in(FULL_BUFFER)).then((n - 1) / n)
            .when(collective.is_in(["broadcast", "reduce", "send", "recv", "sendrecv"])).then(pl.lit(1.0))
            .otherwise(None))


def empty_bandwidth() -> pl.DataFrame:
    return pl.DataFrame(schema=BANDWIDTH_SCHEMA)


def empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema=NCCL_ROW_SCHEMA)


class NcclParse:
    """What one NCCL input gave: its rows (``NCCL_ROW_SCHEMA``), the communicators it names
    (``COMM_SCHEMA``; empty for a Flight Recorder dump), its measured bandwidths (``BANDWIDTH_SCHEMA``:
nccl-tests tables, Inspector records; else empty), its facts (version, transports, channels
    ...: plain JSON values) and its warnings (each with its count)."""

    __slots__ = ("path", "format", "rows", "comms", "facts", "warnings", "bandwidth")

    def __init__(self, path: str, fmt: str, rows: pl.DataFrame, comms: pl.DataFrame | None = None,
                 facts: dict | None = None, warnings: list[str] | None = None, bandwidth: pl.DataFrame | None = None):
        self.bandwidth = bandwidth if bandwidth is not None else empty_bandwidth()
        self.path = path
        self.format = fmt
        self.rows = rows
        self.comms = comms if comms is not None else pl.DataFrame(schema=COMM_SCHEMA)
        self.facts = facts or {}
        self.warnings = warnings or []


def watchdog_text(w: dict[str, Any]) -> str:
    """One line on a PyTorch watchdog timeout (``job.nccl_diagnosis.watchdog``)."""
    who = f"rank {w['rank']}" if w.get("rank") is not None else "a rank"
    what = f"seq {w['seq']}" + (f" ({w['op']})" if w.get("op") else "") if w.get("seq") is not None else "a collective"
    what += f" of group {w['pg']}" if w.get("pg") is not None else ""
    ran = f" after {w['ran_ms']} ms" if w.get("ran_ms") is not None else ""
    pg = (f"; its group's last enqueued work {w['last_enqueued']}, last completed {w['last_completed']}"
          if w.get("last_enqueued") is not None else "")
    return f"PyTorch's watchdog: {who} timed out in {what}{ran}{pg}"
