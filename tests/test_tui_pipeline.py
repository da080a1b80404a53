"""The TUI's "Pipeline" view (tracelens.tui.panes.PipelinePane), driven by Textual's Pilot on a
simulated 4-stage 1F1B job: the picture has a lane per stage, the bubbles table holds the
report's bubbles of the step shown, and enter on a bubble jumps to the timeline at it (marked);
without a pipeline the view says so."""

from __future__ import annotations

import asyncio

from tests import pipesim as ps
from tests.conftest import real_traces
from tests.tui_pilot import back_to, open_view, settle, view_key
from tracelens.analysis import analyze
from tracelens.render import tables as views
from tracelens.store.job import load
from tracelens.tui import make_app
from tracelens.tui.panes import NO_PIPELINE, pipeline_bubble_rows
from tracelens.tui.widgets.table import FilterTable, RowTable
from tracelens.tui.widgets.timeline import TimelineView

KEY = view_key("pipeline")


def test_view_shows_the_stages_and_enter_jumps_to_the_bubble(tmp_path):
    sim = ps.simulate("1f1b", 4, 8, latency_ns=50_000, slow_stage=2, slow_factor=1.6)
    trace = load(ps.write(sim, tmp_path))
    report = analyze(trace).to_dict()
    lanes = views.pipeline_lanes(report)
    assert [ln["stage"] for ln in lanes] == [0, 1, 2, 3]
    for ln, r in zip(lanes, report["ranks"]):
        assert len(ln["blocks"]) == 16 and ln["step"] == r["pipeline"]["view"]["step"]
        # the step's bubbles between its blocks: the measured bubble of that step (the simulator's blocks are gapless)
        st = next(s for s in r["pipeline"]["steps"] if s["step"] == ln["step"])
        assert ln["bubble_ns"] == st["bubble_ns"]

    async def go():
        app = make_app(report=report, trace=trace)
        async with app.run_test(size=(150, 45)) as pilot:
            await open_view(app, pilot, KEY)
            assert app.query_one("#tabs").active == "pipeline"
            pic = str(app.query_one("#pipeline-picture").render())
            assert all(f"stage  {s}" in pic for s in range(4))
            assert "1f1b" in str(app.query_one("#pipeline-summary").render())
            table = app.query_one("#pipeline-bubbles-table", FilterTable)
            want = pipeline_bubble_rows(lanes)
            assert [(r["rank"], r["ns"]) for r in table.shown] == [(r["rank"], r["ns"]) for r in want]
            b = table.shown[0]
            table.query_one(RowTable).focus()
            await pilot.pause()
            await pilot.press("enter")
            await settle(app, pilot)
            assert app.query_one("#tabs").active == "timeline-tab"
            view = app.query_one(TimelineView)
            assert view.hl_window == (b["start_ns"], b["end_ns"])
            assert view.t0 <= b["start_ns"] and view.t1 >= b["end_ns"]
            assert view.timeline.tracks[view.sel].rank == b["rank"]
            await back_to(app, pilot, "pipeline")

    asyncio.run(go())


def test_without_a_pipeline_the_view_says_so():
    trace = load([real_traces() / "hta/trace_filter"])
    report = analyze(trace).to_dict()

    async def go():
        app = make_app(report=report, trace=trace)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_view(app, pilot, KEY)
            text = str(app.query_one("#pipeline-none").render())
            assert NO_PIPELINE in text and "2 of 128 ranks" in text

    asyncio.run(go())
