"""Memory and time against the number of ranks: ``tracelens report`` over N copies of one trace.

    python benchmarks/ranks.py [--trace TRACE] [--ranks 8 64 256] [--root CHECKOUT ...] [--out ranks_results.json]

Each copy is the trace with its ``distributedInfo`` rewritten (rank r of world N), gzip level 1,
as ``rank-r.json.gz`` in a job folder per N (made once under --work, reused).  For each N and
each checkout (``--root``, default this one; give the old and the new one to compare them), a
fresh process runs the command line's ``report JOB -o r.json`` three times: cold (an empty
parse cache: every file parsed, the cache written), cached (the parse cache warm, the analysis
run) and report_cache (the same again: the report cache serves it).  Measured: wall
time, and peak RSS of the report process itself (ru_maxrss) and of its largest worker.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "tests/data/traces/hta/trace_diff/control/control.json.gz"

RUNNER = r"""
import json, resource, sys
root, job, out = sys.argv[1:4]
sys.path.insert(0, root)
from tracelens.cli import main
rc = main(["report", job, "-o", out])
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": rc, "self_kb": me, "workers_kb": kids}), file=sys.stderr)
"""

_DIST = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*\}')


def make_job(trace: Path, n: int, work: Path) -> Path:
    d = work / f"{trace.name.split('.')[0]}-{n}"
    if (d / f"rank-{n - 1}.json.gz").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    raw = gzip.decompress(trace.read_bytes())
    m = _DIST.search(raw)
    if m is None:
        raise SystemExit(f"{trace}: no distributedInfo object to rewrite")
    info = json.loads(m.group(0).split(b":", 1)[1])
    for r in range(n):
        new = json.dumps({**info, "rank": r, "world_size": n}).encode()
        body = raw[: m.start()] + b'"distributedInfo": ' + new + raw[m.end():]
        tmp = d / f".rank-{r}.tmp"
        tmp.write_bytes(gzip.compress(body, compresslevel=1))
        tmp.rename(d / f"rank-{r}.json.gz")
    return d


def run(root: Path, job: Path, cache: Path, **extra: str) -> dict:
    with tempfile.TemporaryDirectory() as t:
        env = {**os.environ, "TRACELENS_CACHE_DIR": str(cache), **extra}
        env.pop("PYTHONPATH", None)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", RUNNER, str(root), str(job), str(Path(t) / "r.json")],
                           env=env, capture_output=True, text=True, cwd=root)
        wall = time.perf_counter() - t0
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "{}"
    try:
        got = json.loads(last)
    except ValueError:
        got = {"rc": p.returncode, "error": p.stderr[-2000:]}
    return {"wall_s": round(wall, 3), "rss_mb": round(got.get("self_kb", 0) / 1024, 1),
            "worker_rss_mb": round(got.get("workers_kb", 0) / 1024, 1), "rc": got.get("rc", p.returncode)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--root", type=Path, nargs="+", default=[ROOT], help="checkouts to run (their tracelens)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tracelens-ranks-bench")
    ap.add_argument("--max-ranks-for", nargs="*", default=[], metavar="ROOT=N",
                    help="run a checkout only up to N ranks (an old one that holds every rank in memory)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/ranks_results.json")
    args = ap.parse_args()
    limit = {Path(k).resolve(): int(v) for k, v in (x.split("=", 1) for x in args.max_ranks_for)}
    results = []
    for n in args.ranks:
        job = make_job(args.trace, n, args.work)
        for root in args.root:
            if n > limit.get(root.resolve(), n):
                continue
            cache = args.work / f"cache-{n}-{abs(hash(str(root.resolve())))}"
            shutil.rmtree(cache, ignore_errors=True)
            # cold: nothing cached; cached: the parse cache warm, the analysis run (the report cache keys on every
            # TRACELENS_* variable, so a new one misses it); report: the same again, served by the report cache
            # the checkout relative to this one (no path of the machine in the results file)
            row = {"trace": args.trace.name, "ranks": n, "root": os.path.relpath(root, ROOT), "cold": run(root, job, cache),
                   "cached": run(root, job, cache, TRACELENS_BENCH_RUN="1"),
                   "report_cache": run(root, job, cache, TRACELENS_BENCH_RUN="1")}
            shutil.rmtree(cache, ignore_errors=True)
            results.append(row)
            print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
