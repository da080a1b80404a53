"""The nsys parser on exports of several ranks: ``parts(path)`` and one part's parse on an export of
8 processes (one GPU each; N kernels and N CUDA launches per process, 2022.4 schema), and the NCCL
payload decode on an export of M NCCL NVTX ranges with typed payloads (FORMATS.md 1.6, laid out by
tests/nsys_build.nccl_blob).  Each export is written once under a temporary directory (or kept in
``--keep DIR`` and reused); each measurement runs in a fresh process, through ADBC's SQLite driver
(the default) and through sqlite3 alone; prints seconds, rows/s and peak RSS (VmHWM), and writes
nsys_ranks_results.json beside this file.

    python benchmarks/nsys_ranks.py [--kernels N] [--payloads M] [--keep DIR]   # default: 250,000 x 8 (201 MB), 500,000
    python benchmarks/nsys_ranks.py --ranks X.sqlite --nccl Y.sqlite   # exports given instead
    python benchmarks/nsys_ranks.py --tree DIR ...   # another checkout's parser, sqlite3 only (no results file)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROCS = 8

CHILD = r"""
import sys, time
from tracelens.parsers import nsys
from tracelens.parsers.nsys import read
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
what, path, reader = sys.argv[1:4]
if hasattr(read, "ADBC"):
    read.ADBC = read.ADBC and reader == "adbc"
    read.ADBC_MIN_BYTES = 0  # measure the reader asked for, whatever the size
elif reader == "adbc":
    sys.exit("this tree has no ADBC reader")
base = status("VmRSS:")
t = time.perf_counter()
if what == "parts":
    rows = len(nsys.parts(path))
elif what == "part":
    rows = nsys.parse(path, part=0)[0].height
elif what == "whole":
    rows = nsys.parse(path)[0].height
else:  # the payloads of the first GPU process's NCCL ranges, fetched and decoded
    from tracelens.parsers.nsys import payload
    from tracelens.parsers.nsys.schema import probe
    con = nsys._connect(__import__("pathlib").Path(path))
    p = probe(con)
    part = nsys.parts(path)[0]
    t = time.perf_counter()
    src = read.Db(con, nsys.sqlite_uri(__import__("pathlib").Path(path))) if hasattr(read, "Db") else con
    got, rows, bad = payload.nccl(src, p, part["proc"], [1])
    assert got.height == rows and not bad
dt = time.perf_counter() - t
print(dt, rows, status("VmHWM:"), base)
"""


def ranks_export(path: Path, n: int) -> Path:
    """8 processes, one GPU each: n kernels (300 names) and their n launches per process, a step range each."""
    from tests.nsys_build import Export, global_tid

    ex = Export(path, ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"))
    names = [ex.string(f"void kernel_{i}<float, {i % 7}>(float*, int)") for i in range(300)]
    launch = ex.string("cudaLaunchKernel_v7000")
    for r in range(PROCS):
        pid = 1000 + r
        gpid, gtid = global_tid(pid, 0), global_tid(pid, pid)
        ex.con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (gpid, pid, "python"))
        k = ((1000 * i + 500, 1000 * i + 900 + r, r, 1, 7, i, gpid, names[i % 300], names[i % 300], 32, 1, 1, 1, 128, 1, 1, 0, 0,
              0, 0, i) for i in range(n))
        ex.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
                           "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
                           "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) VALUES "
                           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", k)
        c = ((1000 * i, 1000 * i + 300, 0, gtid, i, launch, 0) for i in range(n))
        ex.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
                           "returnValue) VALUES (?, ?, ?, ?, ?, ?, ?)", c)
        ex.insert("NVTX_EVENTS", start=0, end=1000 * n, eventType=59, text="ProfilerStep#0", globalTid=gtid, domainId=0)
    return ex.close()


def payload_export(path: Path, m: int) -> Path:
    """One process with m NCCL all-reduce ranges, each with its typed payload (two communicators)."""
    from tests.nsys_build import ALLREDUCE, Export, _payload_tables, global_tid, nccl_blob

    ex = Export(path, ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"))
    _payload_tables(ex)
    gpid, gtid = global_tid(301, 0), global_tid(301, 301)
    ex.con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (gpid, 301, "python"))
    ex.insert("NVTX_EVENTS", start=0, eventType=75, text="NCCL", globalTid=gtid, domainId=1)
    name = ex.string("ncclAllReduce")
    rows = ((10_000 * i, 10_000 * i + 8_000, 59, name, gtid, 1, nccl_blob((0xA, 0xB)[i % 2], 4096 * (i % 64 + 1), 0, 8))
            for i in range(m))
    ex.con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, textId, globalTid, domainId, binaryData) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    for i in range(2):
        ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", start=10_000 * i + 1_000, end=10_000 * i + 7_000, deviceId=0, contextId=1,
                  streamId=13, correlationId=i, globalPid=gpid, demangledName=ex.string(ALLREDUCE), shortName=ex.string(ALLREDUCE),
                  registersPerThread=32, gridX=1, gridY=1, gridZ=1, blockX=128, blockY=1, blockZ=1, staticSharedMemory=0,
                  dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=0)
    return ex.close()


def measure(what: str, path: Path, reader: str, tree: Path = ROOT, repeat: int = 3) -> dict:
    """The fastest of ``repeat`` runs (the machine is shared: the others are its noise)."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, what, str(path), reader], capture_output=True, text=True, cwd=tree,
                             env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, check=True)
        runs.append(tuple(float(v) for v in out.stdout.split()))
    dt, rows, hwm, base = min(runs)
    return {"what": what, "file": path.name, "reader": reader, "mb": round(path.stat().st_size / 1e6, 1), "seconds": round(dt, 3),
            "rows": int(rows), "rows_per_s": round(rows / dt), "peak_rss_mb": round(hwm / 1e6),
            "rss_before_mb": round(base / 1e6)}


def main() -> None:
    args = sys.argv[1:]
    opts = {"--kernels": "250000", "--payloads": "500000", "--keep": None, "--tree": None, "--ranks": None, "--nccl": None}
    for k in list(opts):
        if k in args:
            i = args.index(k)
            opts[k] = args[i + 1]
            del args[i:i + 2]
    n, m = int(opts["--kernels"]), int(opts["--payloads"])
    tree = Path(opts["--tree"]) if opts["--tree"] else ROOT  # another checkout's parser (a before/after comparison)
    readers = ("adbc", "sqlite3") if tree == ROOT else ("sqlite3",)
    results = []
    with tempfile.TemporaryDirectory() as d:
        where = Path(opts["--keep"] or d)
        where.mkdir(parents=True, exist_ok=True)
        ranks = Path(opts["--ranks"] or where / f"ranks_{PROCS}x{n}_kernels.sqlite")  # or an export given
        pays = Path(opts["--nccl"] or where / f"nccl_{m}_payloads.sqlite")
        if not ranks.exists():
            ranks_export(ranks, n)
        if not pays.exists():
            payload_export(pays, m)
        for r in readers:
            results += [measure("parts", ranks, r, tree), measure("part", ranks, r, tree), measure("payloads", pays, r, tree),
                        measure("part", pays, r, tree)]
    for r in results:
        print(json.dumps(r))
    if tree == ROOT:
        (Path(__file__).parent / "nsys_ranks_results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
