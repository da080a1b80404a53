"""What an nsys export holds: its tables and their columns, probed, never assumed (FORMATS.md 1.7).

nsys 2021.x to 2025.x differ: the metadata table is ``EXPORT_META_DATA`` or ``META_DATA_EXPORT``,
lazy exports (the default) leave out every empty table, columns come and go (``greenContextId``,
``binaryData``, ``TARGET_INFO_CUDA_DEVICE``), ``ENUM_*`` tables are missing or empty in old
exports.  ``probe`` reads ``sqlite_master`` and ``PRAGMA table_info`` of the tables the parser
reads, and says in one line what it looked for and did not find.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

# table -> (columns the parser needs, optional columns it reads when there)
WANTED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": (("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
                                   ("demangledName", "shortName", "mangledName")),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
                                   ("bytes", "copyKind", "srcKind", "dstKind")),
    "CUPTI_ACTIVITY_KIND_MEMSET": (("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
                                   ("bytes", "memKind")),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
                                            ("syncType",)),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (("start", "end", "globalTid", "correlationId", "nameId"), ("eventClass",)),
    "NVTX_EVENTS": (("start", "end", "eventType", "globalTid"), ("text", "textId", "domainId")),
    "OSRT_API": (("start", "end", "globalTid", "nameId"), ("eventClass",)),
    "CUBLAS_EVENTS": (("start", "end", "globalTid", "nameId"), ()),
    "CUDNN_EVENTS": (("start", "end", "globalTid", "nameId"), ()),
    "StringIds": (("id", "value"), ()),
    "ThreadNames": (("nameId", "globalTid"), ()),
    "PROCESSES": (("globalPid", "pid"), ("name",)),
    "TARGET_INFO_GPU": ((), ()),
    "TARGET_INFO_CUDA_DEVICE": (("gpuId", "cudaId", "pid"), ()),
    "TARGET_INFO_SESSION_START_TIME": (("utcEpochNs",), ()),
    "META_DATA_CAPTURE": (("name", "value"), ()),
}
# the tables that hold events: an export without any of them has nothing to analyse
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "OSRT_API",
                "CUBLAS_EVENTS", "CUDNN_EVENTS")
# the tables every nsys export has (schema 2.x to 3.20): their absence means another SQLite file
NSYS_MARKERS = ("StringIds", "EXPORT_META_DATA", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME", "ThreadNames",
                "ANALYSIS_DETAILS", "PROCESSES")
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
ENVIRONMENT_TABLES = ("PROCESS_ENVIRONMENT", "ENV")  # not in the samples: read when they have (name, value) columns


@dataclass
class Probe:
    """The tables found (name -> column set, for the ones the parser reads), the export's
    version metadata, and what was looked for and missing."""

    tables: dict[str, set[str]] = field(default_factory=dict)
    all_tables: set[str] = field(default_factory=set)
    meta: dict[str, str] = field(default_factory=dict)
    missing_tables: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and all(c in self.tables[table] for c in columns)

    def col(self, table: str, column: str) -> bool:
        return column in self.tables.get(table, ())

    @property
    def version(self) -> str | None:
        return self.meta.get("EXPORT_PRODUCT_VERSION")

    @property
    def schema_version(self) -> str | None:
        return self.meta.get("EXPORT_SCHEMA_VERSION")

    def warning(self) -> str | None:
        """One line naming what the parser looked for and did not find, or None."""
        parts = []
        absent = [t for t in self.missing_tables if t in EVENT_TABLES]
        if absent:
            parts.append("tables " + ", ".join(absent))
        if self.missing_columns:
            parts.append("columns " + ", ".join(self.missing_columns))
        if not parts:
            return None
        v = f"nsys {self.version}" if self.version else "an nsys export of unknown version"
        return (f"{v}: not in this export: {'; '.join(parts)} (lazy exports leave out empty tables; "
                "what they would hold is not in the event table)")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def probe(con: sqlite3.Connection) -> Probe:
    """Probe the export behind ``con``; raises sqlite3.DatabaseError on a file SQLite cannot read."""
    p = Probe()
    p.all_tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
                    if isinstance(r[0], str)}
    for t in (*WANTED, *META_TABLES, *ENVIRONMENT_TABLES):
        if t not in p.all_tables:
            if t in WANTED:
                p.missing_tables.append(t)
            continue
        cols = {r[1] for r in con.execute(f"PRAGMA table_info({_quote(t)})") if isinstance(r[1], str)}
        p.tables[t] = cols
        need, optional = WANTED.get(t, (("name", "value"), ()))
        gone = [c for c in need if c not in cols]
        if gone and t in WANTED:
            p.missing_columns.extend(f"{t}.{c}" for c in gone)
            if t != "TARGET_INFO_GPU":
                del p.tables[t]  # unusable without them
                continue
        p.missing_columns.extend(f"{t}.{c}" for c in optional if c not in cols and t in EVENT_TABLES
                                 and not (t == "CUPTI_ACTIVITY_KIND_KERNEL" and c == "mangledName"))
    for t in META_TABLES:
        if p.has(t, "name", "value"):
            for k, v in con.execute(f"SELECT name, value FROM {t} WHERE typeof(name) = 'text' AND typeof(value) = 'text'"):
                p.meta.setdefault(k, v)
    return p


def is_nsys(p: Probe) -> bool:
    """Whether the tables are an nsys export's (an arbitrary SQLite database is not)."""
    return "StringIds" in p.all_tables and any(t in p.all_tables for t in NSYS_MARKERS if t != "StringIds")
