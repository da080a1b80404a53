"""Build Nsight Systems-schema SQLite exports for the tests: the table definitions are the real
nsys 2022.4.2.1 ones (tests/data/traces/nsys/schema_nsys_2022.4.2.1_export3.0.0.sql, with their
NOT NULL constraints and primary keys), the rows whatever a test gives, e.g. the kernels, copies
and CUDA calls of a real Kineto trace (``from_kineto``)."""

from __future__ import annotations

import re
import sqlite3
from functools import lru_cache
from pathlib import Path

import polars as pl

from tests.conftest import real_traces

SCHEMA = real_traces() / "nsys" / "schema_nsys_2022.4.2.1_export3.0.0.sql"
HW = 1 << 48  # the hardware/VM bits nsys sets above the pid in a globalTid


@lru_cache(maxsize=1)
def table_sql() -> dict[str, str]:
    """Table name -> its CREATE TABLE statement in the 2022.4 schema."""
    text = SCHEMA.read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"CREATE TABLE (\w+) \((?:.|\n)*?\n\);", text)}


def global_tid(pid: int, tid: int) -> int:
    return HW | (pid << 24) | tid


class Export:
    """An nsys-schema SQLite file being written: ``string(text)`` interns a string into StringIds."""

    def __init__(self, path: Path, tables: tuple[str, ...]):
        self.path = path
        self.con = sqlite3.connect(path)
        sql = table_sql()
        for t in ("StringIds", "EXPORT_META_DATA", "PROCESSES", "ThreadNames", *tables):
            self.con.execute(sql[t])
        self.con.executemany("INSERT INTO EXPORT_META_DATA VALUES (?, ?)",
                             [("EXPORT_PRODUCT_VERSION", "2022.4.2.1"), ("EXPORT_SCHEMA_VERSION", "3.0.0")])
        self.strings: dict[str, int] = {}

    def string(self, s: str) -> int:
        if s not in self.strings:
            self.strings[s] = len(self.strings) + 1
            self.con.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[s], s))
        return self.strings[s]

    def insert(self, table: str, **values) -> None:
        cols = ", ".join(values)
        self.con.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(values))})", tuple(values.values()))

    def close(self) -> Path:
        self.con.commit()
        self.con.close()
        return self.path


def from_kineto(df: pl.DataFrame, path: Path, pid: int = 4242) -> Path:
    """An nsys export of a parsed Kineto trace's GPU work and CUDA calls: kernels, copies and fills
    (with their device, stream and correlation), the runtime and driver calls (``_vNNNN`` API suffix
    added to the runtime's, as nsys records them), and the ProfilerStep spans as NVTX push/pop ranges."""
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
    ex = Export(path, tables)
    gpid = global_tid(pid, 0)
    ex.con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (gpid, pid, "python"))
    rows = df.with_columns(pl.col("name").cast(pl.String), pl.col("cat").cast(pl.String), pl.col("kind").cast(pl.String))
    grid = dict(registersPerThread=32, gridX=1, gridY=1, gridZ=1, blockX=128, blockY=1, blockZ=1, staticSharedMemory=0,
                dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0)
    for r in rows.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"])).iter_rows(named=True):
        base = dict(start=r["ts_ns"], end=r["ts_ns"] + r["dur_ns"], deviceId=r["device"], contextId=1, streamId=r["stream"],
                    correlationId=r["correlation"], globalPid=gpid)
        if r["kind"] == "kernel":
            n = ex.string(r["name"])
            ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", **base, demangledName=n, shortName=n, **grid)
        elif r["kind"] == "memcpy":
            m = re.search(r"Memcpy (\w+)", r["name"])
            ck, sk, dk = {"HtoD": (1, 0, 2), "DtoH": (2, 2, 0), "DtoD": (8, 2, 2)}.get(m.group(1) if m else "", (0, 7, 7))
            ex.insert("CUPTI_ACTIVITY_KIND_MEMCPY", **base, bytes=r["bytes"] or 0, copyKind=ck, srcKind=sk, dstKind=dk)
        else:
            ex.insert("CUPTI_ACTIVITY_KIND_MEMSET", **base, value=0, bytes=r["bytes"] or 0, memKind=2)
    for r in rows.filter(pl.col("kind").is_in(["runtime", "sync"]) & pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])
                         ).iter_rows(named=True):
        driver = r["cat"] == "cuda_driver"
        name = r["name"] if driver else f"{r['name']}_v7000"
        ex.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=r["ts_ns"], end=r["ts_ns"] + r["dur_ns"], eventClass=int(driver),
                  globalTid=global_tid(pid, r["tid"] & 0xFFFFFF), correlationId=r["correlation"], nameId=ex.string(name),
                  returnValue=0)
    for r in rows.filter(pl.col("kind") == "step").iter_rows(named=True):
        ex.insert("NVTX_EVENTS", start=r["ts_ns"], end=r["ts_ns"] + r["dur_ns"], eventType=59, text=r["name"],
                  globalTid=global_tid(pid, r["tid"] & 0xFFFFFF), domainId=0)
    return ex.close()
