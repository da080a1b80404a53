"""Parse speed and memory: tracelens vs orjson.loads vs HTA, side by side on the same files.

    python benchmarks/parse.py [TRACE ...] [--repeat 3] [--tile N] [--hta-python PATH] [--markdown]

For each trace it reports MB/s of uncompressed JSON and peak RSS growth (above the process's
footprint after imports) for
  (a) orjson.loads of the whole (decompressed) file,
  (b) tracelens cold (``--no-cache``: read, gunzip, parse, build the table),
  (c) tracelens from its Parquet cache,
  (d) HTA's ``TraceAnalysis`` load of the same file (PyPI ``HolisticTraceAnalysis``; it has
      its own venv because its pins clash: ``make bench`` creates ``benchmarks/.hta-venv``).
Every measurement runs in a fresh process; the best time and the largest RSS of --repeat runs
are kept.  RSS is the process's own high-water mark (VmHWM) minus its RSS just before the work;
"warmed" first loads a small real trace in the same process, so that one-off runtime costs
(polars' thread pools and allocator arenas; pandas' for HTA) are not charged to the file.  ``--tile N`` also measures a trace made of N copies of each input's events (shifted
in time), to show how the costs grow past the sizes in tests/data/traces.
Without arguments it takes the largest traces in tests/data/traces.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "tests" / "data" / "traces"  # the real traces the tests use
DEFAULT = [
    "hta/trace_diff/control/control.json.gz",
    "kineto-tbplugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "amd-tracelens/mi300/resnet_act_checkpoint.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]

CHILD_PRELUDE = r"""
import gzip, json, os, sys, time
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
def peak():  # VmHWM: this process's own high-water mark (ru_maxrss can carry a parent's)
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) * 1024
def done(t0, base):
    print(json.dumps({"seconds": time.perf_counter() - t0, "rss": peak() - base}))
path = sys.argv[1]
warm = sys.argv[3] if len(sys.argv) > 3 else None
"""

PARSE = r"""
sys.path.insert(0, sys.argv[2])
import polars, msgspec, orjson
from tracelens.store.job import parse_file
import tracelens.parsers.kineto
if warm:  # the runtime's one-off costs (polars' thread pools and arenas) are not the file's
    parse_file(warm, use_cache=False)
base = rss(); t0 = time.perf_counter()
df, meta = parse_file(path, use_cache={cache})
done(t0, base)
"""

CHILD = {
    "orjson": CHILD_PRELUDE
    + r"""
import orjson
base = rss(); t0 = time.perf_counter()
raw = open(path, 'rb').read()
if raw[:2] == b'\x1f\x8b':
    raw = gzip.decompress(raw)
doc = orjson.loads(raw)
done(t0, base)
""",
    "cold": CHILD_PRELUDE + PARSE.format(cache=False),
    "cached": CHILD_PRELUDE + PARSE.format(cache=True),
    "hta": CHILD_PRELUDE
    + r"""
import logging, shutil, tempfile
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp()
os.symlink(os.path.abspath(path), os.path.join(d, os.path.basename(path)))
if warm:  # the same warm-up: HTA loads a tiny trace first
    w = tempfile.mkdtemp()
    os.symlink(os.path.abspath(warm), os.path.join(w, os.path.basename(warm)))
    TraceAnalysis(trace_dir=w)
base = rss(); t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=d)
done(t0, base)
shutil.rmtree(d)
""",
}


def uncompressed_size(path: Path) -> int:
    raw = path.read_bytes()
    return len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)


WARM = SHARED / "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"  # a small real trace


def run_child(mode: str, path: Path, python: str, env: dict, warm: Path | None = None) -> dict | None:
    argv = [python, "-c", CHILD[mode], str(path), str(ROOT)] + ([str(warm)] if warm else [])
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.stderr.write(f"{mode} on {path.name} failed: {r.stderr.strip().splitlines()[-1:]}\n")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(mode: str, path: Path, python: str, env: dict, repeat: int, warm: Path | None) -> dict | None:
    runs = [run_child(mode, path, python, env) for _ in range(repeat)]
    runs = [r for r in runs if r]
    if not runs:
        return None
    out = {"seconds": min(r["seconds"] for r in runs), "rss": max(r["rss"] for r in runs)}
    if warm is not None and mode != "orjson":
        warmed = run_child(mode, path, python, env, warm)
        out["rss_warm"] = warmed["rss"] if warmed else None
    return out


def tile(path: Path, n: int, out_dir: Path) -> Path:
    """A trace with the input's events repeated n times, each copy shifted past the last."""
    import orjson

    raw = path.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts)) + 1000 if ts else 0
    out = []
    for k in range(n):
        for e in events:
            if k and isinstance(e.get("ts"), (int, float)):
                e = dict(e, ts=e["ts"] + k * span)
            out.append(e)
    doc["traceEvents"] = out
    dest = out_dir / f"tiled{n}x-{path.name.removesuffix('.gz')}"
    dest.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tile", type=int, default=0, help="also measure N copies of the first trace's events")
    ap.add_argument("--hta-python", default=str(ROOT / "benchmarks/.hta-venv/bin/python"))
    ap.add_argument("--json", type=Path, help="write the raw numbers here")
    args = ap.parse_args()
    traces = args.traces or [SHARED / p for p in DEFAULT if (SHARED / p).exists()]
    tmp = Path(tempfile.mkdtemp(prefix="tracelens-bench-"))
    env = dict(os.environ, TRACELENS_CACHE_DIR=str(tmp / "cache"))
    if args.tile and traces:
        traces = traces + [tile(traces[0], args.tile, tmp)]
    have_hta = Path(args.hta_python).exists()
    if not have_hta:
        sys.stderr.write(f"no HTA interpreter at {args.hta_python}: HTA columns left empty\n")
    rows = []
    for path in traces:
        mb = uncompressed_size(path) / 1e6
        row = {"trace": path.name, "json_mb": mb}
        warm = WARM if WARM.exists() and WARM != path else None
        row["orjson"] = measure("orjson", path, sys.executable, env, args.repeat, None)
        row["cold"] = measure("cold", path, sys.executable, env, args.repeat, warm)
        subprocess.run([sys.executable, "-c", CHILD["cached"], str(path), str(ROOT)], env=env, capture_output=True)
        row["cached"] = measure("cached", path, sys.executable, env, args.repeat, None)
        row["hta"] = measure("hta", path, args.hta_python, env, args.repeat, warm) if have_hta else None
        rows.append(row)
        print_row(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print()
    print(markdown(rows))
    return 0


def fmt(m: dict | None, mb: float) -> str:
    if not m:
        return "-"
    return f"{m['seconds']:.3f} s ({mb / m['seconds']:.0f} MB/s), {m['rss'] / 1e6:.0f} MB"


def print_row(row: dict) -> None:
    mb = row["json_mb"]
    print(f"{row['trace']}  ({mb:.1f} MB of JSON)")
    for k in ("orjson", "cold", "cached", "hta"):
        print(f"  {k:8s} {fmt(row[k], mb)}")


def warm_ratio(m: dict | None, mb: float) -> str:
    return f"{m['rss_warm'] / 1e6 / mb:.2f}x" if m and m.get("rss_warm") is not None else "-"


def markdown(rows: list[dict]) -> str:
    head = (
        "| trace | JSON MB | orjson.loads | tracelens cold | tracelens cached | HTA load | cold vs HTA | cold vs orjson | "
        "cold RSS / JSON | HTA RSS / JSON | cold RSS / JSON, warmed | HTA RSS / JSON, warmed |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        mb = r["json_mb"]
        c, o, h = r["cold"], r["orjson"], r["hta"]
        ratio = lambda a, b: f"{a['seconds'] / b['seconds']:.1f}x" if a and b else "-"  # noqa: E731
        lines.append(
            f"| {r['trace'][:40]} | {mb:.1f} | {fmt(o, mb)} | {fmt(c, mb)} | {fmt(r['cached'], mb)} | {fmt(h, mb)} | "
            f"{ratio(h, c)} faster | {c['seconds'] / o['seconds']:.2f}x the time | "
            f"{c['rss'] / 1e6 / mb:.2f}x | " + (f"{h['rss'] / 1e6 / mb:.2f}x" if h else "-") + " | "
            + warm_ratio(c, mb) + " | " + warm_ratio(h, mb) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
