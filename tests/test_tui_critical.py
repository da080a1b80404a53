"""The TUI's "Critical path" view (tracelens.tui.panes.CriticalPathPane), driven by Textual's Pilot on a
real two-rank job analysed with the critical path: the view shows the report's numbers, enter on an
event jumps to the timeline at its step with the step's whole path traced and highlighted; without
the critical path the view says how to get it, and C computes it."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

from tests.conftest import real_traces
from tests.tui_pilot import back_to, open_view, settle, view_key
from tracelens.analysis import Options, analyze
from tracelens.model.units import fmt_ns
from tracelens.store.job import load
from tracelens.tui import make_app
from tracelens.tui.panes import NO_CRITICAL_PATH
from tracelens.tui.widgets.table import FilterTable, RowTable
from tracelens.tui.widgets.timeline import TimelineView

KEY = view_key("critical")


def test_view_shows_the_reports_path_and_enter_jumps_to_the_timeline():
    trace = load([real_traces() / "hta/trace_filter"])
    report = analyze(trace, Options(critical_path=True)).to_dict()

    async def go():
        app = make_app(report=report, trace=trace)
        async with app.run_test(size=(140, 45)) as pilot:
            await open_view(app, pilot, KEY)
            assert app.query_one("#tabs").active == "critical"
            steps = app.query_one("#critical-steps-table", FilterTable)
            want = [(r["rank"], s["length_ns"]) for r in report["ranks"] for s in r["critical_path"]["steps"]]
            assert [(r["rank"], r["length_ns"]) for r in steps.shown] == want
            s0 = report["ranks"][0]["critical_path"]["steps"][0]
            bar = str(app.query_one("#critical-bar").render())
            top_cat, top_ns = next(iter(s0["by_category_ns"].items()))
            assert top_cat in bar and fmt_ns(top_ns) in bar
            # the second step's events once it is highlighted
            steps.query_one(RowTable).focus()
            await pilot.press("down")
            await pilot.pause()
            events = app.query_one("#critical-events-table", FilterTable)
            s1 = steps.shown[1]
            assert [(e["name"], e["ns"]) for e in events.shown] == [(e["name"], e["ns"]) for e in s1["top_events"]]
            events.query_one(RowTable).focus()
            await pilot.pause()
            await pilot.press("enter")
            await settle(app, pilot)
            assert app.query_one("#tabs").active == "timeline-tab"
            view = app.query_one(TimelineView)
            assert view.t0 <= s1["start_ns"] and view.t1 >= s1["start_ns"] + s1["dur_ns"]
            # the step's whole path, traced on demand: its segments tile the step and sum, per category,
            # to the report's numbers for that step (computed by the analysis, not by the view)
            path = view.path
            assert path is not None and path.rank == s1["rank"] and view.path_rank == s1["rank"]
            assert path.starts[0] == s1["start_ns"] and path.ends[-1] <= s1["start_ns"] + s1["dur_ns"]
            assert all(b == a for a, b in zip(path.ends, path.starts[1:]))  # one after another, no gap, no overlap
            by: dict[str, int] = {}
            for a, b, c in zip(path.starts, path.ends, path.categories):
                by[c] = by.get(c, 0) + b - a
            assert by == {c: ns for c, ns in s1["by_category_ns"].items() if ns}
            # each top event is where the path is at its start (a host event there: no stream)
            for e in s1["top_events"]:
                if e["ts_ns"] is not None and e["kind"] == "kernel":
                    i = path.at(e["ts_ns"])
                    assert i is not None and path.streams[i] is not None
            # on a GPU stream row the path is drawn where it runs on that stream, never elsewhere
            rank_tracks = [t for t in view.timeline.tracks if t.rank == s1["rank"] and not t.is_union and not t.is_host]
            k = next((i for i, s in enumerate(path.streams) if s is not None), None)
            if k is not None:
                mid = (path.starts[k] + path.ends[k]) // 2
                assert [t.stream for t in rank_tracks if path.on(t, mid)] == [path.streams[k]]
            assert "path: " in view.status() or path.at(view.cell_time(view.cursor)) is None
            assert view.timeline.tracks[view.sel].rank == s1["rank"]
            await back_to(app, pilot, "critical")

    asyncio.run(go())


def test_without_the_critical_path_the_view_says_how_to_get_it():
    trace = load([real_traces() / "hta/trace_filter"])
    report = analyze(trace).to_dict()

    async def go():
        app = make_app(report=report, trace=trace)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_view(app, pilot, KEY)
            assert str(app.query_one("#critical-none").render()) == NO_CRITICAL_PATH
            assert "--critical-path" in NO_CRITICAL_PATH and "press C" in NO_CRITICAL_PATH
            # C computes it here: the analysis runs again with the critical path, the view shows it
            await pilot.press("C")
            await settle(app, pilot)
            await pilot.press(KEY)
            await settle(app, pilot)
            steps = app.query_one("#critical-steps-table", FilterTable)
            want = analyze(trace, Options(critical_path=True)).to_dict()
            assert [(r["rank"], r["length_ns"]) for r in steps.shown] == \
                [(r["rank"], s["length_ns"]) for r in want["ranks"] for s in r["critical_path"]["steps"]]

    asyncio.run(go())


def test_view_shows_each_suggestions_what_if_next_to_its_bound():
    # The ResNet-50 golden report (--critical-path; a saved report, no trace): its one suggestion
    # with a what_if (input-bound, data_loading=0 replayed) in the view's what-if table, its
    # strings shown as text (no markup); a report without what_if has no such table
    golden = json.loads((Path(__file__).resolve().parent / "golden" / "resnet50_v100_2021_critical_path.json").read_text())
    report = copy.deepcopy(golden)
    sg = next(s for s in report["suggestions"] if s.get("what_if"))
    sg["title"] = "[bold red]not markup[/]"

    async def go(rep):
        app = make_app(report=rep)
        async with app.run_test(size=(140, 45)) as pilot:
            await open_view(app, pilot, KEY)
            assert app.query_one("#tabs").active == "critical"
            found = app.query("#critical-whatif-table")
            if not found:
                return None
            t = found.first(FilterTable)
            return [(r["title"], r["change"], r["upper"], r["predicted_speedup"], r["predicted_step_ns"]) for r in t.shown], \
                "\n".join(str(line) for line in t.query_one(RowTable).render_lines(t.query_one(RowTable).region.reset_offset)[:4])

    shown, text = asyncio.run(go(report))
    wi = sg["what_if"]
    assert shown == [("[bold red]not markup[/]", "data_loading=0", sg["est_speedup"], wi["predicted_speedup"], wi["predicted_step_ns"])]
    assert wi["predicted_step_ns"] == 118_479_000 and fmt_ns(118_479_000) in text and "[bold red]not markup[/]" in text
    for s in report["suggestions"]:
        s.pop("what_if", None)
    assert asyncio.run(go(report)) is None
