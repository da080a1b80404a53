"""Parse rate of the nsys parser: the shared exports, and synthetic exports of N kernels with
their launches and N NVTX ranges (2022.4 schema, StringIds with a few hundred names; the same
rows for the same N), each written once under a temporary directory (or kept in ``--keep DIR``
and reused).  Each parse runs in a fresh process, through ADBC's SQLite driver (the default) and
through sqlite3 alone; prints MB/s, rows/s, peak RSS (VmHWM) and what it holds per event, and
writes nsys_parse_results.json beside this file.

    python benchmarks/nsys_parse.py [N ...] [--keep DIR]   # default N: 1,000,000 kernels (152 MB)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import sys, time
import polars as pl
from tracelens.parsers.nsys import parse, read
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
read.ADBC = read.ADBC and sys.argv[2] == "adbc"
read.ADBC_MIN_BYTES = 0  # measure the reader asked for, whatever the size
if sys.argv[2] == "adbc" and not read.ADBC:
    sys.exit("adbc-driver-sqlite is not installed")
base = status("VmRSS:")
t = time.perf_counter()
df, meta = parse(sys.argv[1])
dt = time.perf_counter() - t
print(dt, df.height, status("VmHWM:"), base, df.estimated_size())
"""


def synthetic(path: Path, n: int) -> Path:
    from tests.nsys_build import Export, global_tid

    ex = Export(path, ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"))
    names = [ex.string(f"void kernel_{i}<float, {i % 7}>(float*, int)") for i in range(300)]
    launch = ex.string("cudaLaunchKernel_v7000")
    gpid, gtid = global_tid(100, 0), global_tid(100, 100)
    k = ((1000 * i + 500, 1000 * i + 900, 0, 1, 7, i, gpid, names[i % 300], names[i % 300], 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, i)
         for i in range(n))
    ex.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, globalPid, "
                       "demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
                       "dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", k)
    r = ((1000 * i, 1000 * i + 300, 0, gtid, i, launch, 0) for i in range(n))
    ex.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, returnValue) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", r)
    v = ((1000 * i, 1000 * i + 950, 59, f"layer_{i % 50}", gtid, 0) for i in range(n))
    ex.con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, ?, ?, ?, ?)", v)
    return ex.close()


def measure(path: Path, reader: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), reader], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    dt, rows, hwm, base, frame = (float(v) for v in out.stdout.split())
    size = path.stat().st_size
    return {"file": path.name, "reader": reader, "mb": round(size / 1e6, 2), "seconds": round(dt, 3), "rows": int(rows),
            "mb_per_s": round(size / 1e6 / dt, 1), "rows_per_s": round(rows / dt), "peak_rss_mb": round(hwm / 1e6),
            "rss_before_mb": round(base / 1e6), "frame_mb": round(frame / 1e6),
            # what the parse held at its peak per event (the high-water mark less the process before it), and the table
            "peak_bytes_per_event": round((hwm - base) / rows) if rows else None,
            "frame_bytes_per_event": round(frame / rows) if rows else None}


def main() -> None:
    args = sys.argv[1:]
    keep = None
    if "--keep" in args:
        i = args.index("--keep")
        keep = Path(args[i + 1])
        del args[i:i + 2]
    sizes = [int(a) for a in args] or [1_000_000]
    results = [measure(p, r) for p in sorted((ROOT / "tests" / "data" / "traces" / "nsys").glob("*.sqlite"))
               for r in ("adbc", "sqlite3")]
    with tempfile.TemporaryDirectory() as d:
        where = keep or Path(d)
        where.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            path = where / f"synthetic_{n}_kernels.sqlite"
            if not path.exists():
                synthetic(path, n)
            results += [measure(path, r) for r in ("adbc", "sqlite3")]
    for r in results:
        print(json.dumps(r))
    (Path(__file__).parent / "nsys_parse_results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
