"""Build Nsight Systems-schema SQLite exports for the tests: the table definitions are the real
nsys 2022.4.2.1 ones (tests/data/traces/nsys/schema_nsys_2022.4.2.1_export3.0.0.sql, with their
NOT NULL constraints and primary keys), the rows whatever a test gives, e.g. the kernels, copies
and CUDA calls of a real Kineto trace (``from_kineto``)."""

from __future__ import annotations

import re
import sqlite3
import struct
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


GEMM = "ampere_sgemm_128x64_nn"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
STEP_NS = 10_000_000


NCCL_ALLREDUCE_SCHEMA = (1 << 24) + 5  # NCCL's static schema ids: 2^24 + its NVTX_SID (5: AllReduce)
NCCL_REDOP_ENUM = (1 << 24) + 11
# the AllReduce payload as this builder lays it out: (entry name, NVTX entry type, offset); the
# parser reads whatever layout the schema tables give
ALLREDUCE_ENTRIES = (("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8), ("Reduction operation", NCCL_REDOP_ENUM, 16),
                     ("No. of ranks", 5, 20))


def nccl_blob(comm: int, nbytes: int, redop: int, nranks: int, domain: int = 1) -> bytes:
    """An NCCL AllReduce NVTX payload as FORMATS.md 1.6 documents it (no real export with NCCL
    payloads is available here): a 32-byte little-endian header (domain id, schema id, payload
    size, total size) and the struct of ``ALLREDUCE_ENTRIES``."""
    body = struct.pack("<QQiI", comm, nbytes, redop, nranks)
    return struct.pack("<QQQQ", domain, NCCL_ALLREDUCE_SCHEMA, len(body), 32 + len(body)) + body


def _payload_tables(ex: Export) -> None:
    """NVTX_EVENTS.binaryData and the payload schema tables, with FORMATS.md 1.6's columns."""
    ex.con.execute("ALTER TABLE NVTX_EVENTS ADD COLUMN binaryData TEXT")
    ex.con.execute("CREATE TABLE NVTX_PAYLOAD_SCHEMAS (domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER, flags INTEGER, "
                   "numEntries INTEGER, payloadSize INTEGER, alignTo INTEGER)")
    ex.con.execute("CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INTEGER, schemaId INTEGER, idx INTEGER, flags INTEGER, "
                   "type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER)")
    ex.con.execute("CREATE TABLE NVTX_PAYLOAD_ENUM_ENTRIES (domainId INTEGER, schemaId INTEGER, idx INTEGER, name TEXT, "
                   "value INTEGER, isFlag INTEGER)")
    ex.con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (1, ?, 'NCCL AllReduce', 1, 0, ?, 24, 0)",
                   (NCCL_ALLREDUCE_SCHEMA, len(ALLREDUCE_ENTRIES)))
    ex.con.executemany("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (1, ?, ?, 0, ?, ?, NULL, NULL, ?)",
                       [(NCCL_ALLREDUCE_SCHEMA, i, t, n, o) for i, (n, t, o) in enumerate(ALLREDUCE_ENTRIES)])
    ex.con.executemany("INSERT INTO NVTX_PAYLOAD_ENUM_ENTRIES VALUES (1, ?, ?, ?, ?, 0)",
                       [(NCCL_REDOP_ENUM, i, n, i) for i, n in enumerate(("Sum", "Prod", "Max", "Min", "Avg"))])


def several_ranks(path: Path, procs: list[tuple[int, list[int]]], *, steps: int = 3, nccl_ranges: bool = True,
                  env: dict[int, dict[str, str]] | None = None, other_process: bool = True,
                  comms: dict[int, list[int]] | None = None, blob=nccl_blob) -> Path:
    """An export of several ranks in one file, as ``nsys profile torchrun ...`` writes: each
    (pid, devices) of ``procs`` is a process driving those GPUs.  Per step and device: a GEMM
    kernel (its length differs per pid and device, so that ranks differ) and an all-reduce kernel,
    each launched by ``cudaLaunchKernel`` on the process's main thread (correlation ids count per
    process, as CUPTI's do); per step and process a ``ProfilerStep#N`` NVTX range and an OS runtime
    call; with ``nccl_ranges``, NCCL's ``ncclAllReduce`` range (domain NCCL, registered string)
    around each all-reduce launch.  ``env``: pid -> environment variables, written to a
    per-process ``PROCESS_ENVIRONMENT(globalPid, name, value)`` table.  ``other_process``: a
    process with NVTX ranges and no GPU work (a launcher) is in the export too.  ``comms``: pid ->
    the NCCL communicators (their 64-bit ids) of its all-reduces in each step, in call order; each
    NCCL range then carries a typed payload (``blob(comm, bytes, redop, nranks)``, 4 KiB x the
    step + 1, Sum, the number of processes) in ``binaryData``, described by the payload tables."""
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "OSRT_API")
    ex = Export(path, tables)
    grid = dict(registersPerThread=32, gridX=1, gridY=1, gridZ=1, blockX=128, blockY=1, blockZ=1, staticSharedMemory=0,
                dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0)
    launch, wait = ex.string("cudaLaunchKernel_v7000"), ex.string("pthread_cond_wait")
    nccl_name = ex.string("ncclAllReduce")
    if comms:
        _payload_tables(ex)
    if env:
        ex.con.execute("CREATE TABLE PROCESS_ENVIRONMENT (globalPid INTEGER, name TEXT, value TEXT)")
    if other_process:
        ex.con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (global_tid(99, 0), 99, "torchrun"))
        ex.insert("NVTX_EVENTS", start=0, end=STEP_NS * steps, eventType=59, text="launcher", globalTid=global_tid(99, 99),
                  domainId=0)
    for pid, devices in procs:
        gpid, tid = global_tid(pid, 0), global_tid(pid, pid)
        ex.con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (gpid, pid, "python"))
        ex.insert("ThreadNames", nameId=ex.string(f"pt_main_{pid}"), priority=0, globalTid=tid)
        for k, v in (env or {}).get(pid, {}).items():
            ex.con.execute("INSERT INTO PROCESS_ENVIRONMENT VALUES (?, ?, ?)", (gpid, k, v))
        if nccl_ranges:
            ex.insert("NVTX_EVENTS", start=0, eventType=75, text="NCCL", globalTid=tid, domainId=1)
        corr = 0
        for s in range(steps):
            t0 = STEP_NS * s + 1_000
            ex.insert("NVTX_EVENTS", start=t0, end=t0 + STEP_NS - 2_000, eventType=59, text=f"ProfilerStep#{s}",
                      globalTid=tid, domainId=0)
            ex.insert("OSRT_API", start=t0 + 9_000_000, end=t0 + 9_500_000, eventClass=27, globalTid=tid, nameId=wait,
                      returnValue=0, nestingLevel=0, callchainId=0)
            for n, d in enumerate(devices):
                at = t0 + 10_000 + 20_000 * n
                gemm = 3_000_000 + 100_000 * (pid % 7) + 50_000 * d  # per rank
                corr += 1
                ex.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=at, end=at + 5_000, eventClass=0, globalTid=tid,
                          correlationId=corr, nameId=launch, returnValue=0)
                ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", start=at + 20_000, end=at + 20_000 + gemm, deviceId=d, contextId=1,
                          streamId=7, correlationId=corr, globalPid=gpid, demangledName=ex.string(GEMM),
                          shortName=ex.string(GEMM), **grid)
                for c, comm in enumerate((comms or {}).get(pid) or [None]):
                    at = t0 + 100_000 + 20_000 * n + 40_000 * c
                    corr += 1
                    if nccl_ranges:
                        data = None if comm is None else blob(comm, 4096 * (s + 1), 0, len(procs))
                        ex.insert("NVTX_EVENTS", start=at - 1_000, end=at + 8_000, eventType=59, textId=nccl_name,
                                  globalTid=tid, domainId=1, **({} if comm is None else {"binaryData": data}))
                    ex.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=at, end=at + 5_000, eventClass=0, globalTid=tid,
                              correlationId=corr, nameId=launch, returnValue=0)
                    start = t0 + 20_000 + 3_700_000 + 100_000 * (pid % 7) + 50_000 * d  # after the GEMM: its wait differs
                    end = t0 + 6_000_000
                    if c:  # the next all-reduces, one after the other
                        start, end = t0 + 5_000_000 + 1_000_000 * c + 100_000 * (pid % 3), t0 + 5_600_000 + 1_000_000 * c
                    ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", start=start, end=end, deviceId=d, contextId=1, streamId=13,
                              correlationId=corr, globalPid=gpid, demangledName=ex.string(ALLREDUCE),
                              shortName=ex.string(ALLREDUCE), **grid)
    return ex.close()
