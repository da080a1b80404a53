"""NCCL's typed NVTX payloads (FORMATS.md 1.6): since NCCL 2.16 the ranges NCCL emits in its NVTX
domain (``ncclAllReduce`` ...) carry a payload, which recent nsys exports keep in
``NVTX_EVENTS.binaryData`` and describe in ``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES``
(each field's name, entry type and byte offset) and ``NVTX_PAYLOAD_ENUM_ENTRIES`` (the names of an
enum's values, e.g. the reduction operations).

A blob: a 32-byte little-endian header (domain id, schema id, payload size, total size: four
uint64) followed by the struct, each field at its schema entry's offset.  What is read:
``NCCL communicator ID`` -> the collective's ``group`` (the communicator's hash, as a decimal
string), ``Message size [bytes]`` -> ``bytes``, ``No. of ranks`` -> ``group_size``, and into
``args`` (JSON) ``Reduction operation``, ``Root`` and ``Peer rank`` where the schema has them.

Best-effort and version-gated: only where the export has the ``binaryData`` column and the two
schema tables; a blob whose schema is not described, or too short for its fields, is skipped (and
counted: one warning).  Decoded in polars, per field, over all blobs at once: each field's bytes
are a ``bin.slice`` at its offset, read with ``bin.reinterpret`` (no Python work per range).
"""

from __future__ import annotations

import sqlite3

import polars as pl

from .read import Db
from .schema import Probe

HEADER = 32
KEY = ["ts_ns", "end_ns", "tid", "domain"]  # a range among the process's NVTX ranges
SCHEMAS, ENTRIES, ENUM_ENTRIES = "NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES", "NVTX_PAYLOAD_ENUM_ENTRIES"
# NVTX payload entry types (nvToolsExtPayload.h) -> (bytes, polars type); a type that is an enum's
# schema id is read as a 4-byte int and named through its enum entries
TYPES: dict[int, tuple[int, pl.DataType]] = {
    5: (4, pl.Int32()), 6: (4, pl.UInt32()), 15: (4, pl.Int32()), 16: (4, pl.UInt32()),  # int, unsigned, int32, uint32
    7: (8, pl.Int64()), 8: (8, pl.UInt64()), 9: (8, pl.Int64()), 10: (8, pl.UInt64()),  # long, ulong, long long, ull
    17: (8, pl.Int64()), 18: (8, pl.UInt64()), 22: (8, pl.UInt64()),  # int64, uint64, size_t
}
# NCCL's field names -> where they go
FIELDS = {"NCCL communicator ID": "group", "Message size [bytes]": "bytes", "No. of ranks": "group_size",
          "Reduction operation": "reduction_op", "Root": "root", "Peer rank": "peer"}
OUT_SCHEMA = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "tid": pl.Int64, "domain": pl.Int64, "group": pl.String, "bytes": pl.Int64,
              "group_size": pl.Int32, "args": pl.String}


def available(p: Probe) -> bool:
    """Whether the export can hold NCCL payloads: ``binaryData`` and the schema tables."""
    return (p.col("NVTX_EVENTS", "binaryData") and SCHEMAS in p.all_tables and ENTRIES in p.all_tables)


def _cols(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def nccl(db: Db, p: Probe, proc: int | None, domain_ids: list[int]) -> tuple[pl.DataFrame, int, int]:
    """(the decoded payloads of the process's NCCL ranges: their start, end and thread (to find
    them among the ranges) with ``group``, ``bytes``, ``group_size`` and ``args``; ranges with a
    blob; blobs skipped).  The small schema tables through sqlite3, the blobs through the reader
    (``read.Db``: Arrow through ADBC, else sqlite3)."""
    con = db.con
    empty = pl.DataFrame(schema=OUT_SCHEMA)
    if not domain_ids or not available(p):
        return empty, 0, 0
    ecols = _cols(con, ENTRIES)
    if not {"schemaId", "name", "type", "offset"} <= ecols:
        return empty, 0, 0
    doms = ", ".join(str(int(d)) for d in domain_ids)
    dom_filter = f" AND domainId IN ({doms})" if "domainId" in ecols else ""
    entries = pl.DataFrame(
        con.execute(f"SELECT schemaId, name, type, offset FROM {ENTRIES} WHERE typeof(schemaId) = 'integer' AND "
                    f"typeof(type) = 'integer' AND typeof(offset) = 'integer' AND name IN ({', '.join('?' * len(FIELDS))})"
                    f"{dom_filter}", tuple(FIELDS)).fetchall(),
        schema={"schema": pl.Int64, "field": pl.String, "type": pl.Int64, "offset": pl.Int64}, orient="row")
    enums = pl.DataFrame(schema={"type": pl.Int64, "raw": pl.Int64, "label": pl.String})
    if ENUM_ENTRIES in p.all_tables and {"schemaId", "name", "value"} <= _cols(con, ENUM_ENTRIES):
        enums = pl.DataFrame(
            con.execute(f"SELECT schemaId, value, name FROM {ENUM_ENTRIES} WHERE typeof(schemaId) = 'integer' AND "
                        "typeof(value) = 'integer' AND typeof(name) = 'text'").fetchall(),
            schema=enums.schema, orient="row").unique(["type", "raw"], keep="first")
    sql = (f"SELECT start AS ts_ns, end AS end_ns, globalTid & 16777215 AS tid, domainId AS domain, CAST(binaryData AS BLOB) "
           f"AS blob FROM NVTX_EVENTS WHERE (globalTid >> 24) IS {'NULL' if proc is None else int(proc)} AND domainId IN ({doms}) "
           "AND eventType IN (59, 60) AND binaryData IS NOT NULL AND typeof(start) = 'integer' AND typeof(end) = 'integer'")
    blobs = db.frame(sql, {"ts_ns": pl.Int64, "end_ns": pl.Int64, "tid": pl.Int64, "domain": pl.Int64, "blob": pl.Binary})
    if not blobs.height:
        return empty, 0, 0
    blobs = blobs.with_row_index("_r").with_columns(
        pl.col("blob").bin.slice(8, 8).bin.reinterpret(dtype=pl.UInt64, endianness="little").cast(pl.Int64, strict=False)
        .alias("schema"), pl.col("blob").bin.size().alias("_len"))
    # each blob's fields: its schema's entries (known types, or enums read as 4-byte ints)
    enum_types = set(enums.get_column("type").unique().to_list())
    known = entries.filter(pl.col("type").is_in(list(TYPES)) | pl.col("type").is_in(list(enum_types)))
    size = pl.col("type").replace_strict({t: n for t, (n, _) in TYPES.items()}, default=4, return_dtype=pl.Int64)
    long = blobs.select("_r", "blob", "schema", "_len").join(known, on="schema", how="inner").with_columns(
        (pl.col("offset") + HEADER).alias("_at"), size.alias("_size"))
    fits = long.group_by("_r").agg((pl.col("_at") + pl.col("_size") <= pl.col("_len")).all().alias("ok"))
    bad = blobs.height - fits.filter(pl.col("ok")).height
    long = long.join(fits.filter(pl.col("ok")).select("_r"), on="_r", how="semi")
    value = pl.lit(None, pl.Int64)
    for t, (n, dt) in TYPES.items():
        raw = pl.col("blob").bin.slice(pl.col("_at"), n).bin.reinterpret(dtype=dt, endianness="little")
        value = pl.when(pl.col("type") == t).then(raw.cast(pl.Int64, strict=False)).otherwise(value)
    u64 = pl.col("blob").bin.slice(pl.col("_at"), 8).bin.reinterpret(dtype=pl.UInt64, endianness="little")
    i32 = pl.col("blob").bin.slice(pl.col("_at"), 4).bin.reinterpret(dtype=pl.Int32, endianness="little").cast(pl.Int64)
    long = long.with_columns(
        pl.when(pl.col("type").is_in(list(enum_types))).then(i32).otherwise(value).alias("raw"),
        u64.cast(pl.String).alias("_u64"))
    long = long.join(enums, on=["type", "raw"], how="left")
    wide = long.with_columns(pl.col("field").replace_strict(FIELDS, return_dtype=pl.String)).group_by("_r").agg(
        pl.col("_u64").filter(pl.col("field") == "group").first().alias("group"),
        pl.col("raw").filter(pl.col("field") == "bytes").first().alias("bytes"),
        pl.col("raw").filter(pl.col("field") == "group_size").first().cast(pl.Int32, strict=False).alias("group_size"),
        pl.coalesce(pl.col("label"), pl.col("raw").cast(pl.String)).filter(pl.col("field") == "reduction_op").first()
        .alias("reduction_op"),
        pl.col("raw").filter(pl.col("field") == "root").first().alias("root"),
        pl.col("raw").filter(pl.col("field") == "peer").first().alias("peer"),
    )
    extra = [c for c in ("reduction_op", "root", "peer") if wide.get_column(c).null_count() < wide.height]
    args = (pl.struct(extra).struct.json_encode() if extra else pl.lit(None, pl.String)).alias("args")
    out = blobs.select("_r", "ts_ns", "end_ns", "tid", "domain").join(wide.with_columns(args), on="_r", how="inner")
    out = out.select(list(OUT_SCHEMA)).unique(KEY, keep="first")  # one payload per range
    return out.cast(OUT_SCHEMA), blobs.height, bad
