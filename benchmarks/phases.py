"""Where a report's time goes, phase by phase, and what a re-open costs.

    python benchmarks/phases.py [TRACE ...] [--repeat 5] [--json OUT]

For each input, ``--repeat`` fresh processes of each kind, interleaved (A, B, C, A, B, C, ...)
so that all see the same machine:

* phases: ``import tracelens.cli`` and polars, the parse of every file without the cache
  (``open_job(..., use_cache=False)``), the analysis (``analyze``), the JSON report
  (``to_dict`` + ``render``): the analysis' share of the parse is issue 15's "at most 20%";
* cached: ``tracelens report FILE -o r.json`` end to end with the caches warm (one run before
  fills them), the command line's ``main`` in a fresh process, imports included;
* cold: the same with ``--no-cache``.

Medians are reported (and the best run).  Without arguments: every trace in tests/data/traces
over 10 MB of JSON, and the two-rank sample job.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"

PHASES = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
t0 = time.perf_counter()
import tracelens.cli  # noqa: F401
import polars  # noqa: F401
t1 = time.perf_counter()
from tracelens.store.job import load
from tracelens.analysis import analyze
from tracelens.render import render
job = load([sys.argv[1]], use_cache=False)
t2 = time.perf_counter()
a = analyze(job)
t3 = time.perf_counter()
out = render(a.to_dict(), "json")
t4 = time.perf_counter()
assert len(out) > 0
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""

REPORT = r"""
import os, sys, tempfile, time
sys.path.insert(0, sys.argv[2])
out = os.path.join(tempfile.mkdtemp(), "report.json")
t0 = time.perf_counter()
from tracelens.cli import main
rc = main(["report", sys.argv[1], "-o", out] + sys.argv[3:])
t = time.perf_counter() - t0
assert rc == 0 and os.path.getsize(out) > 0, rc
print(t)
"""


def json_mb(p: Path) -> float:
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.name.endswith((".json", ".json.gz")))
    total = 0
    for f in files:
        if f.name.endswith(".gz"):
            with gzip.open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    total += len(chunk)
        else:
            total += f.stat().st_size
    return total / 1e6


def run(code: str, path: Path, env: dict, *extra: str, root: Path = ROOT) -> list[float] | None:
    r = subprocess.run([sys.executable, "-c", code, str(path), str(root), *extra], capture_output=True, text=True,
                       env=env, timeout=1800)
    if r.returncode != 0:
        sys.stderr.write(f"{path.name}: {(r.stderr.strip().splitlines() or ['?'])[-1]}\n")
        return None
    return [float(x) for x in r.stdout.strip().splitlines()[-1].split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--root", type=Path, action="append",
                    help="a checkout whose code runs (e.g. a worktree of an older commit); given twice, the two are "
                         "measured side by side, run by run (default: this one)")
    args = ap.parse_args()
    roots = [r.resolve() for r in (args.root or [ROOT])]
    traces = args.traces or sorted((p for p in TRACES.rglob("*.json.gz") if json_mb(p) > 10), key=json_mb, reverse=True)
    traces += [] if args.traces else [ROOT / "sample_traces" / "h100_bert_small"]
    import compileall

    for root in roots:
        for pkg in ("tracelens", "parsers"):
            compileall.compile_dir(str(root / pkg), quiet=1)
    rows = []
    print("| input | code | JSON MB | imports | parse | analysis | analysis / parse | JSON | cached report | cold report |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for p in traces:
        env = {root: dict(os.environ, TRACELENS_CACHE_DIR=tempfile.mkdtemp()) for root in roots}
        got_all: dict[Path, tuple[list, list, list]] = {root: ([], [], []) for root in roots}
        for root in roots:
            run(REPORT, p, env[root], root=root)  # fill the caches
        for _ in range(args.repeat):
            for root in roots:
                phases, cached, cold = got_all[root]
                if (got := run(PHASES, p, env[root], root=root)) is not None:
                    phases.append(got)
                if (got := run(REPORT, p, env[root], root=root)) is not None:
                    cached.append(got[0])
                if (got := run(REPORT, p, env[root], "--no-cache", root=root)) is not None:
                    cold.append(got[0])
        for root in roots:
            phases, cached, cold = got_all[root]
            if not phases:
                continue
            med = [statistics.median(x[i] for x in phases) for i in range(4)]
            row = {"input": p.name, "code": root.name, "json_mb": round(json_mb(p), 1), "imports_s": med[0], "parse_s": med[1],
                   "analysis_s": med[2], "json_s": med[3], "analysis_over_parse": med[2] / med[1] if med[1] else None,
                   "cached_report_s": statistics.median(cached) if cached else None, "cached_best_s": min(cached, default=None),
                   "cold_report_s": statistics.median(cold) if cold else None, "cold_best_s": min(cold, default=None),
                   "runs": args.repeat}
            rows.append(row)
            f = lambda x: f"{x:.3f} s" if x is not None else "-"  # noqa: E731
            print(f"| {p.name} | {root.name} | {row['json_mb']} | {f(med[0])} | {f(med[1])} | {f(med[2])} | "
                  f"{row['analysis_over_parse']:.0%} | {f(med[3])} | {f(row['cached_report_s'])} | {f(row['cold_report_s'])} |",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
