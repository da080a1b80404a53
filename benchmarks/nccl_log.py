"""NCCL log parse rate and peak memory: a synthetic log of ``--mb`` MB built by repeating the real
excerpts (tests/data/traces/nccl/logs) is read by parsers.nccl.log in a child process; prints MB/s
the child's CPU time (all threads) and peak RSS.  ``python benchmarks/nccl_log.py --mb 250``; with ``--coll``
each excerpt's COLL lines (``opCount``) are repeated 50 times after its other lines, the shape of a real
long log (mostly per-call lines after one init block)."""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _excerpt(text: bytes, coll: bool) -> bytes:
    if not coll:
        return text
    lines = text.splitlines(keepends=True)
    calls = [ln for ln in lines if b" opCount " in ln]
    return b"".join(ln for ln in lines if b" opCount " not in ln) + b"".join(calls) * 50


def build(path: Path, mb: int, coll: bool = False) -> int:
    base = b"".join(_excerpt(p.read_bytes(), coll) for p in sorted((ROOT / "tests/data/traces/nccl/logs").glob("*.log")))
    reps = max(1, (mb << 20) // len(base))
    with open(path, "wb") as fh:
        for _ in range(reps):
            fh.write(base)
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=250)
    ap.add_argument("--coll", action="store_true", help="COLL lines mostly (each excerpt's repeated 50x)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "big.log"
        size = build(f, args.mb, args.coll)
        code = ("import sys, time; sys.path.insert(0, %r); from parsers.nccl import log; t = time.perf_counter(); "
                "r = log.read(%r); print(time.perf_counter() - t, r.rows.height, r.facts['lines'])") % (str(ROOT), str(f))
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        wall = time.perf_counter() - t0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss = ru.ru_maxrss / 1024
        cpu = ru.ru_utime + ru.ru_stime  # the child's CPU time, all threads: the rate on a loaded machine
        secs, rows, lines = float(out[0]), int(out[1]), int(out[2])
        print(f"{size / 1e6:.0f} MB, {lines} lines, {rows} collective rows: parse {secs:.2f} s = {size / 1e6 / secs:.0f} MB/s "
              f"(process {wall:.2f} s, {cpu:.2f} CPU-s = {size / 1e6 / cpu:.0f} MB per CPU-s); peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
