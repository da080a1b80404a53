"""Parse rate of the nsys parser: the shared exports, and a synthetic export of N kernels with
their launches and N NVTX ranges (2022.4 schema, StringIds with a few hundred names), written
once under a temporary directory.  Each parse runs in a fresh process; prints MB/s, rows and peak
RSS, and writes nsys_parse_results.json beside this file.

    python benchmarks/nsys_parse.py [N]   # default 1,000,000 kernels (about 200 MB)
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
import resource, sys, time
from tracelens.parsers.nsys import parse
t = time.perf_counter()
df, meta = parse(sys.argv[1])
dt = time.perf_counter() - t
print(dt, df.height, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
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


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    dt, rows, rss = out.stdout.split()
    size = path.stat().st_size
    return {"file": path.name, "mb": round(size / 1e6, 2), "seconds": round(float(dt), 3), "rows": int(rows),
            "mb_per_s": round(size / 1e6 / float(dt), 1), "rows_per_s": round(int(rows) / float(dt)),
            "peak_rss_mb": round(int(rss) / 1e6)}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    results = [measure(p) for p in sorted((ROOT / "tests" / "data" / "traces" / "nsys").glob("*.sqlite"))]
    with tempfile.TemporaryDirectory() as d:
        results.append(measure(synthetic(Path(d) / f"synthetic_{n}_kernels.sqlite", n)))
    for r in results:
        print(json.dumps(r))
    (Path(__file__).parent / "nsys_parse_results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
