"""End to end, cold: tracelens parse + analyze + JSON vs HTA load + its breakdowns, same files.

    python benchmarks/analyze.py [TRACE ...] [--repeat 3] [--hta-python PATH]

tracelens: ``tracelens report FILE -o out.json --no-cache`` (load without the cache, analyze,
write the JSON report), run through the command line's ``main``.  As after a regular install,
tracelens' modules are byte-compiled first (``compileall``; HTA's were when pip installed it):
without that, a machine with PYTHONDONTWRITEBYTECODE set compiles them from source on every run.  HTA 0.5.0: ``TraceAnalysis`` load, then
``get_temporal_breakdown``, ``get_idle_time_breakdown`` and ``get_comm_comp_overlap`` (the HTA
analyses that cover what the report holds).  Each run is a fresh process; the two sides run
alternately (--repeat runs each) and the best and the median of each are reported.  Without arguments: the largest traces in tests/data/traces and the
two-rank sample job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "tests" / "data" / "traces"  # the real traces the tests use
DEFAULT = [
    SHARED / "hta/trace_diff/control/control.json.gz",
    SHARED / "kineto-tbplugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    SHARED / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    SHARED / "hta/nccl_parser_config/nccl_data.json.gz",
    SHARED / "hta/trace_filter",
]

OURS = r"""
import os, sys, tempfile, time
sys.path.insert(0, sys.argv[2])
out = os.path.join(tempfile.mkdtemp(), "report.json")
t0 = time.perf_counter()
from tracelens.cli import main
rc = main(["report", sys.argv[1], "-o", out, "--no-cache"])
t = time.perf_counter() - t0
assert rc == 0 and os.path.getsize(out) > 0, rc
print(t)
"""

HTA = r"""
import logging, os, sys, tempfile, time
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
path = sys.argv[1]
if os.path.isdir(path):
    d = path
else:
    d = tempfile.mkdtemp()
    os.symlink(os.path.abspath(path), os.path.join(d, os.path.basename(path)))
ta = TraceAnalysis(trace_dir=d)
ta.get_temporal_breakdown(visualize=False)
ta.get_idle_time_breakdown(ranks=list(ta.t.traces.keys()), visualize=False)
ta.get_comm_comp_overlap(visualize=False)
print(time.perf_counter() - t0)
"""


def run(python: str, code: str, path: Path, env: dict) -> float | None:
    r = subprocess.run([python, "-c", code, str(path), str(ROOT)], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.stderr.write(f"{path.name}: {r.stderr.strip().splitlines()[-1:]}\n")
        return None
    return float(r.stdout.strip().splitlines()[-1])


def interleaved(python_a: str, code_a: str, python_b: str | None, code_b: str, path: Path, env: dict,
                repeat: int) -> tuple[list[float], list[float]]:
    """``repeat`` fresh-process runs of each side, alternating A, B, A, B, ... so that both
    sides see the same machine (load from elsewhere moves timings on a shared machine)."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeat):
        t = run(python_a, code_a, path, env)
        if t is not None:
            a.append(t)
        if python_b is not None:
            t = run(python_b, code_b, path, env)
            if t is not None:
                b.append(t)
    return a, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-python", default=str(ROOT / "benchmarks/.hta-venv/bin/python"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    traces = args.traces or [p for p in DEFAULT if p.exists()]
    env = dict(os.environ, TRACELENS_CACHE_DIR=tempfile.mkdtemp())
    import compileall

    for pkg in ("tracelens", "parsers"):
        compileall.compile_dir(str(ROOT / pkg), quiet=1)
    have_hta = Path(args.hta_python).exists()
    rows = []
    print("| input | tracelens: parse + analyze + JSON (best / median) | HTA: load + breakdowns (best / median) "
          "| speed-up (best / median) |\n|---|---|---|---|")
    for p in traces:
        ours, hta = interleaved(sys.executable, OURS, args.hta_python if have_hta else None, HTA, p, env, args.repeat)
        row = {"input": p.name, "tracelens_s": min(ours, default=None), "hta_s": min(hta, default=None),
               "tracelens_median_s": statistics.median(ours) if ours else None,
               "hta_median_s": statistics.median(hta) if hta else None, "runs": args.repeat}
        rows.append(row)
        fmt = lambda a, b: f"{a:.3f} / {b:.3f} s" if a is not None else "failed"  # noqa: E731
        ratio = (
            f"{row['hta_s'] / row['tracelens_s']:.2f}x / {row['hta_median_s'] / row['tracelens_median_s']:.2f}x"
            if ours and hta else "-"
        )
        print(f"| {p.name} | {fmt(row['tracelens_s'], row['tracelens_median_s'])} | "
              f"{fmt(row['hta_s'], row['hta_median_s'])} | {ratio} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
