"""The UI's tables on a big job: 50,000 step rows (1,000 ranks x 50 steps), filled, sorted and paged.

    python benchmarks/tables.py [--rows 50000]

tracelens' FilterTable draws only the visible rows (line API); Textual's DataTable, measured
beside it, builds every row first.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    n = ap.parse_args().rows

    from textual.app import App
    from textual.widgets import DataTable

    from tracelens.model.units import fmt_ns
    from tracelens.tui.widgets.table import Column, FilterTable

    rows = [{"rank": i % 1000, "name": f"ProfilerStep#{i // 1000}", "dur_ns": 1_000_000 + (i * 7919) % 100_003} for i in range(n)]
    cols = [Column("rank", "rank", str, True), Column("name", "step"), Column("dur_ns", "time", fmt_ns, True)]

    class Ours(App):
        def compose(self):
            yield FilterTable("steps", cols, rows)

    class Theirs(App):
        def compose(self):
            yield DataTable()

        def on_mount(self):
            t = self.query_one(DataTable)
            t.add_columns("rank", "step", "time")
            t.add_rows([(str(r["rank"]), r["name"], fmt_ns(r["dur_ns"])) for r in rows])

    async def run(app_cls, label: str) -> None:
        t0 = time.perf_counter()
        app = app_cls()
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            print(f"{label}: first screen with {n:,} rows: {time.perf_counter() - t0:.3f} s")
            if app_cls is Ours:
                ft = app.query_one(FilterTable)
                t0 = time.perf_counter()
                ft.sort_by("dur_ns")
                await pilot.pause()
                print(f"{label}: sort by time: {time.perf_counter() - t0:.3f} s")
            else:
                t = app.query_one(DataTable)
                t0 = time.perf_counter()
                t.sort(list(t.columns)[2])
                await pilot.pause()
                print(f"{label}: sort by time: {time.perf_counter() - t0:.3f} s")

    asyncio.run(run(Ours, "tracelens FilterTable"))
    asyncio.run(run(Theirs, "Textual DataTable"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
