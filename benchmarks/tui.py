"""How the terminal UI holds up on a big job: a million-event, 16-rank job built from a real trace.

    python benchmarks/tui.py [TRACE] [--ranks 16]

The trace's events are repeated as ranks 0..N-1 (one handle each, all reading the trace's one
cache entry), which gives a job of about N x its events.  Measured, in this process: building the timeline index, one screen of timeline
cells (all streams of the visible ranks) zoomed out over the whole trace and zoomed into one
step, and in a running app (Textual's headless Pilot, 200x50): time to the first screen with
the report ready, and the time per key (pan, zoom, next step, scroll one track) on the timeline,
each as the process CPU time of the press and the repaint that follows it (Pilot's own waits
are not work), and the time our widget takes to draw every line of the screen from scratch.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT = ROOT / "tests/data/traces/hta/trace_diff/control/control.json.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--ranks", type=int, default=16)
    args = ap.parse_args()

    from tracelens.analysis import analyze
    from tracelens.analysis.timeline import JobTimeline
    from tracelens.store.job import Job, RankHandle, load

    one = load([args.trace])
    h0 = one.handles[0]
    handles = []
    for r in range(args.ranks):  # every rank reads the one cached file (or the one frame in memory)
        m = h0.meta
        meta = type(m)(**{**m.__dict__, "rank": r, "path": f"{m.path}#rank{r}", "warnings": []})
        handles.append(RankHandle(r, meta, parquet=h0.parquet, frame=h0.frame))
    trace = Job(handles)
    per = one.n_events
    print(f"job: {args.ranks} ranks x {per:,} events = {args.ranks * per:,} events")

    t = time.perf_counter()
    report = analyze(trace).to_dict()
    print(f"analyze: {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    tl = JobTimeline(trace)
    print(f"timeline index: {time.perf_counter() - t:.3f} s, {tl.n_events:,} GPU rows, {len(tl.tracks)} tracks")
    vis = [tr.id for tr in tl.tracks[:46]]
    for label, (a, b) in (("whole trace", (tl.start, tl.end)),
                          ("one step", (report["ranks"][0]["steps"][-1]["start_ns"],
                                        report["ranks"][0]["steps"][-1]["start_ns"] + report["ranks"][0]["steps"][-1]["dur_ns"]))):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            tl.cells(vis, a, b, 190)
            times.append(time.perf_counter() - t)
        print(f"one screen of cells (46 tracks x 190 columns), {label}: {1000 * statistics.median(times):.1f} ms")

    from tracelens.tui import make_app
    from tracelens.tui.widgets.timeline import TimelineView

    async def drive() -> None:
        t0 = time.perf_counter()
        app = make_app(report=report, trace=trace)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            print(f"app: first screen with the report ready: {time.perf_counter() - t0:.2f} s (includes the timeline index)")
            await pilot.press("7")
            await pilot.pause()
            view = app.query_one(TimelineView)
            for key in ("d", "a", "w", "s", "]", "down", "up"):
                cpu, paint = [], []
                for _ in range(5):
                    view._cache_key = None  # every press recomputes its screen
                    t = time.process_time()
                    await pilot.press(key)
                    await pilot.pause()
                    cpu.append(time.process_time() - t)
                    view._cache_key = None
                    t = time.perf_counter()
                    for y in range(view.size.height):
                        view.render_line(y)
                    paint.append(time.perf_counter() - t)
                print(f"timeline key {key!r}: {1000 * statistics.median(cpu):.0f} ms of CPU per press (Textual included), "
                      f"{1000 * statistics.median(paint):.1f} ms to draw the {view.size.height} lines from scratch")

    asyncio.run(drive())
    return 0


if __name__ == "__main__":
    sys.exit(main())
