"""The per-rank analysis next to the parse: how long ``_analyze_rank`` (and the whole ``analyze``)
takes on a trace, as a share of its cold parse, and where that time goes.

    python benchmarks/rank.py [TRACE ...] [--repeat 7] [--cpu] [--stages] [--profile N] [--json OUT] [--critical-path]

Per trace, in one process (polars warmed by the first round), ``--repeat`` rounds of: a cold
load (``load([path], use_cache=False)``: read, gunzip, parse, no cache), ``_analyze_rank`` of
its one file, and the whole ``analyze`` (the rank, the collectives, the timeline).  Medians are
reported.  ``--cpu``: process CPU time (all threads) instead of wall time, steadier on a
loaded machine.  ``queries``: how many polars queries one ``_analyze_rank`` runs (lazy
collects, eager operations that run through the engine, ``collect_all`` batches).  ``--stages``: the self time of each stage of ``_analyze_rank`` (the functions it
calls, each timed without the stages it calls itself), median over the rounds.  ``--profile
N``: cProfile of one ``_analyze_rank``, the N costliest functions by total time.  Without
arguments: every real trace in tests/data/traces with more than 10 MB of JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import io
import json
import pstats
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACES = ROOT / "tests" / "data" / "traces"


def json_mb(p: Path) -> float:
    with (gzip.open(p) if p.name.endswith(".gz") else open(p, "rb")) as f:
        n = 0
        while chunk := f.read(1 << 24):
            n += len(chunk)
    return n / 1e6


def default_traces(min_mb: float = 10.0) -> list[tuple[Path, float]]:
    found = [p for p in TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))]
    sized = [(p, json_mb(p)) for p in found]
    return sorted(((p, mb) for p, mb in sized if mb > min_mb), key=lambda x: -x[1])


# the stages of _analyze_rank: (module, attribute) pairs wrapped by the stage timer
STAGES = [
    ("tracelens.analysis.rank", "_step_spans"),
    ("tracelens.analysis.rank", "_traced_host_end"),
    ("tracelens.analysis.rank", "_step_flops"),
    ("tracelens.analysis.rank", "_known_matmul"),
    ("tracelens.analysis.rank", "_waterfalls"),
    ("tracelens.analysis.rank", "_facts"),
    ("tracelens.analysis.rank", "_item_calls"),
    ("tracelens.analysis.rank", "_workload"),
    ("tracelens.analysis.rank", "_flops_quality"),
    ("tracelens.analysis.rank", "_given_mfu_error"),
    ("tracelens.analysis.rank.idle", "_blocking_spans"),
    ("tracelens.analysis.rank.idle", "_IdleAttribution.__init__"),
    ("tracelens.analysis.rank.idle", "_IdleAttribution.ends"),
    ("tracelens.analysis.rank.idle", "_IdleAttribution.split"),
    ("tracelens.analysis.rank.idle", "_IdleAttribution.run"),
    ("tracelens.analysis.rank.idle", "_IdleAttribution.dl_host"),
    ("tracelens.analysis.rank.recompute", "find"),
    ("tracelens.analysis.rank.critical", "graph"),
    ("tracelens.analysis.rank.critical", "_events"),
    ("tracelens.analysis.rank.critical", "_nodes"),
    ("tracelens.analysis.rank.critical", "candidate_edges"),
    ("tracelens.analysis.rank.critical", "_last_arrivals"),
    ("tracelens.analysis.rank.critical", "step_paths"),
    ("tracelens.analysis.rank.replay", "Replay.__init__"),
    ("tracelens.analysis.rank.replay", "Replay.run"),
    ("tracelens.analysis.rank.replay", "Replay.weights"),
    ("tracelens.analysis.rank.critical", "summarize"),
    ("tracelens.analysis.rank.critical", "collective_marks"),
    ("tracelens.analysis.rank.collectives", "collective_rows"),
    ("tracelens.analysis.suggest", "changes_for"),
    ("tracelens.analysis.rank.segments", "cut"),
    ("tracelens.analysis.rank.segments", "cut_frames"),
    ("tracelens.analysis.rank.flops", "count"),
    ("tracelens.analysis.rank.kernels", "tf32_ops"),
    ("tracelens.analysis.rank.kernels", "kernel_ops"),
    ("tracelens.analysis.rank.kernels", "by_name"),
    ("tracelens.analysis.rank.kernels", "matmul_efficiency"),
    ("tracelens.analysis.waterfall", "build"),
    ("tracelens.analysis.waterfall", "build_time"),
    ("tracelens.analysis.waterfall", "combine"),
]


@contextmanager
def query_counter(n: list[int]):
    """Count the polars queries run inside (into ``n[0]``): every LazyFrame collect, the eager
    operations that polars runs as a lazy query, and each ``collect_all`` once."""
    import polars as pl
    from polars.lazyframe.frame import LazyFrame

    saved = {name: getattr(LazyFrame, name) for name in ("collect", "_collect_eager")}
    saved_all = pl.collect_all
    depth = [0]

    def counted(fn):
        def run(*a, **k):
            if depth[0] == 0:
                n[0] += 1
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
        return run

    for name, fn in saved.items():
        setattr(LazyFrame, name, counted(fn))
    pl.collect_all = counted(saved_all)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(LazyFrame, name, fn)
        pl.collect_all = saved_all


@contextmanager
def stage_timer(acc: dict[str, float], clock=time.perf_counter):
    """Wrap the STAGES that exist; add each one's self time (s) to ``acc``."""
    import importlib

    stack: list[float] = []  # time spent in the children of each open stage
    undo = []

    def wrap(label, fn):
        def timed(*a, **k):
            stack.append(0.0)
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                dt = clock() - t0
                children = stack.pop()
                acc[label] += dt - children
                if stack:
                    stack[-1] += dt
        return timed

    for mod, attr in STAGES:
        m = importlib.import_module(mod)
        owner, name = (getattr(m, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (m, attr)
        if not hasattr(owner, name):
            continue
        fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, wrap(f"{mod.rsplit('.', 1)[-1]}.{attr}", fn))
        undo.append((owner, name, fn))
    try:
        yield
    finally:
        for owner, name, fn in undo:
            setattr(owner, name, fn)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--critical-path", action="store_true", help="with the critical path (Options.critical_path)")
    args = ap.parse_args()
    from tracelens.analysis import analyze
    from tracelens.analysis.rank import _analyze_rank
    from tracelens.model.options import Options
    from tracelens.store.job import load

    traces = [(p, json_mb(p)) for p in args.traces] if args.traces else default_traces()
    clock = time.process_time if args.cpu else time.perf_counter
    rows = []
    print(f"{'CPU' if args.cpu else 'wall'} time, medians of {args.repeat}")
    print("| trace | JSON MB | events | cold parse | `_analyze_rank` | share | `analyze` | share | queries |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for path, mb in traces:
        parse, rank, whole = [], [], []
        stages: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.repeat):
            gc.collect()
            t0 = clock()
            tr = load([path], use_cache=False, jobs=1)
            parse.append(clock() - t0)
            opts = Options(critical_path=args.critical_path)
            ev = tr.handles[0].read()  # the rank's frame, as analyze's map reads it
            acc: dict[str, float] = defaultdict(float)
            t0 = clock()
            if args.stages:
                with stage_timer(acc, clock):
                    t1 = clock()
                    _analyze_rank(ev, 0, tr.metas[0], opts)
                    total = clock() - t1
                acc["(rest of _analyze_rank)"] = total - sum(acc.values())
                rank.append(total)
                for k, v in acc.items():
                    stages[k].append(v)
            else:
                _analyze_rank(ev, 0, tr.metas[0], opts)
                rank.append(clock() - t0)
            t0 = clock()
            analyze(tr, opts)
            whole.append(clock() - t0)
        nq = [0]
        with query_counter(nq):
            _analyze_rank(ev, 0, tr.metas[0], Options(critical_path=args.critical_path))
        p, r, w = (statistics.median(x) for x in (parse, rank, whole))
        row = {"trace": path.name, "json_mb": round(mb, 1), "events": ev.height, "parse_s": p, "rank_s": r,
               "analyze_s": w, "rank_share": r / p, "analyze_share": w / p, "runs": args.repeat,
               "queries": nq[0], "clock": "cpu" if args.cpu else "wall"}
        rows.append(row)
        print(f"| {path.name} | {mb:.1f} | {ev.height:,} | {p * 1e3:.0f} ms | {r * 1e3:.1f} ms | {100 * r / p:.0f}% "
              f"| {w * 1e3:.1f} ms | {100 * w / p:.0f}% | {nq[0]} |", flush=True)
        if args.stages:
            med = sorted(((statistics.median(v), k) for k, v in stages.items()), reverse=True)
            row["stages_ms"] = {k: round(v * 1e3, 2) for v, k in med}
            print("    " + ", ".join(f"{k} {v * 1e3:.1f}" for v, k in med if v >= 0.0005), flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            _analyze_rank(ev, 0, tr.metas[0], Options(critical_path=args.critical_path))
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.profile)
            print("\n".join("    " + ln for ln in s.getvalue().splitlines() if ln.strip()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
