"""The terminal UI, driven by Textual's Pilot on real traces: loading in a worker, the overview,
navigation and drill-down, filter and sort, errors shown in the app, small and large terminals,
and SVG snapshots of the main views.

Snapshots: pytest-textual-snapshot pins syrupy 4.8, which needs pytest < 9 (we run pytest 9), so
the same thing is done here in a few lines: Textual's own ``export_screenshot()`` SVG compared
byte for byte with ``tests/snapshots/*.svg`` (textual is pinned in the test extra so that the
bytes are stable).  ``TRACELENS_UPDATE_SNAPSHOTS=1 pytest tests/test_tui.py`` rewrites them;
look at the SVGs in a browser before committing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from pathlib import Path

import orjson
import pytest

from tests.conftest import ROOT, SAMPLE_TRACES, real_traces
from tests.tui_pilot import settle
from tracelens.analysis import analyze  # noqa: E402
from tracelens.store.job import load  # noqa: E402
from tracelens.tui import make_app  # noqa: E402
from tracelens.tui.screens.help import HelpScreen  # noqa: E402
from tracelens.tui.widgets.table import FilterTable  # noqa: E402
from tracelens.tui.widgets.timeline import TimelineView  # noqa: E402
from tracelens.tui.widgets.waterfall import WaterfallChart  # noqa: E402

SNAPSHOTS = Path(__file__).parent / "snapshots"
H100 = SAMPLE_TRACES / "h100_bert_small"
JOB = SAMPLE_TRACES / "job_2ranks"


def run(coro):
    return asyncio.run(coro)


@functools.lru_cache(maxsize=None)
def ready(path: Path):
    """(report dict, trace) of a job, for apps built without loading (once per job: the app
    never changes the report it is given)."""
    trace = load([os.path.relpath(path, ROOT)])
    return analyze(trace).to_dict(), trace


@contextlib.asynccontextmanager
async def opened(job: Path, size: tuple[int, int]):
    """An app showing ``job``'s ready report, settled, as (app, pilot)."""
    report, trace = ready(job)
    app = make_app(report=report, trace=trace)
    app.animation_level = "none"  # a snapshot must not catch a tab underline halfway through its slide
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        yield app, pilot


def active_tab(app) -> str:
    return app.query_one("#tabs").active


def snapshot(app, name: str) -> None:
    svg = app.export_screenshot(title=name)
    path = SNAPSHOTS / f"{name}.svg"
    if os.environ.get("TRACELENS_UPDATE_SNAPSHOTS") or not path.exists():
        if os.environ.get("CI") and not path.exists():
            raise AssertionError(f"snapshot {path.name} is missing (run with TRACELENS_UPDATE_SNAPSHOTS=1 and commit it)")
        path.write_text(svg, encoding="utf-8")
        return
    expected = path.read_text(encoding="utf-8")
    if svg != expected:
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tracelens-snapshot-{name}.svg"
        out.write_text(svg, encoding="utf-8")
        raise AssertionError(f"{name}: the screen differs from {path} (now: {out}); if the change is wanted, "
                             "rerun with TRACELENS_UPDATE_SNAPSHOTS=1")


def test_loads_in_a_worker_and_shows_the_report_numbers():
    async def go():
        app = make_app([str(H100)])
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            assert app.error is None and app.report is not None
            job = app.report["job"]
            assert job["mfu"] is not None
            headline = str(app.query_one("#headline").render())
            assert f"MFU {100 * job['mfu']:.2f}%" in headline
            chart = app.query_one(WaterfallChart)
            assert chart.kind == "mfu" and chart.bars == job["waterfall"]
            # the bars, including the final MFU bar, sum to 100%
            assert abs(sum(b["fraction"] for b in chart.bars) - 1.0) < 1e-9
            # the loading pane is gone, the tabs are there, the overview is active
            assert not app.query("#loading") and active_tab(app) == "overview"

    run(go())


def test_drill_down_rank_to_steps_to_timeline_and_back():
    d = real_traces() / "hta/trace_filter"

    async def go():
        app = make_app([str(d)])
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("2")
            await pilot.pause()
            assert active_tab(app) == "ranks"
            ranks = app.query_one("#ranks-table", FilterTable)
            assert [r["rank"] for r in ranks.shown] == [0, 1]
            await pilot.press("down", "enter")  # rank 1 -> its steps
            await pilot.pause()
            assert active_tab(app) == "steps"
            steps = app.query_one("#steps-table", FilterTable)
            assert {r["rank"] for r in steps.shown} == {1} and len(steps.shown) == 2
            await pilot.press("down", "enter")  # its second step -> the timeline at that step
            await settle(app, pilot)
            assert active_tab(app) == "timeline-tab"
            view = app.query_one(TimelineView)
            step = steps.shown[1]
            assert view.t0 <= step["start_ns"] and view.t1 >= step["start_ns"] + step["dur_ns"]
            assert view.t1 - view.t0 < 1.2 * step["dur_ns"]  # zoomed to the step, with a small margin
            assert view.timeline.tracks[view.sel].rank == 1
            status = str(app.query_one("#timeline-status").render())
            assert status.startswith("r1 ")
            await pilot.press("escape")
            await pilot.pause()
            assert active_tab(app) == "steps" and {r["rank"] for r in steps.shown} == {1}
            await pilot.press("escape")
            await pilot.pause()
            assert active_tab(app) == "ranks"
            assert len(app.query_one("#steps-table", FilterTable).all_rows) == 4  # all ranks again

    run(go())


def test_views_are_built_on_first_show():
    """The first screen builds the overview only; every other view is built the first time it is
    shown (its number key, a click on its tab, a drill-down into it), then kept as it is."""
    from textual.widgets import TabPane

    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            def built():
                return {p.id for p in app.query(TabPane) if p.children}

            assert built() == {"overview"} and not app.query("#ranks-table") and not app.query(TimelineView)
            await pilot.click("#--content-tab-kernels")
            await settle(app, pilot)
            assert active_tab(app) == "kernels" and built() == {"overview", "kernels"}
            kernels = app.query_one("#kernels-table", FilterTable)
            assert kernels.shown
            await pilot.press("2")
            await pilot.pause()
            await pilot.press("down", "enter")  # rank 1 -> its steps: the steps view is built to show them
            await settle(app, pilot)
            steps = app.query_one("#steps-table", FilterTable)
            assert active_tab(app) == "steps" and {r["rank"] for r in steps.shown} == {1}
            assert built() == {"overview", "kernels", "ranks", "steps"}
            await pilot.press("escape")  # back to the ranks, the steps of every rank again (as first built)
            await pilot.pause()
            assert active_tab(app) == "ranks" and {r["rank"] for r in steps.shown} == {0, 1}
            await pilot.press("4")
            await pilot.pause()
            assert app.query_one("#kernels-table", FilterTable) is kernels  # not built again

    run(go())


def test_a_ready_report_is_shown_at_once_and_its_events_read_after_the_first_screen():
    """``tracelens open`` on a job whose report is cached: the load has the report before the app
    starts, so the app composes the views straight away (no loading screen is ever mounted), and
    the events for the timeline are read only once the first screen is drawn, then shown."""
    from textual import events

    from tracelens.tui.app import LoadingPane
    from tracelens.tui.loading import JobLoad

    job = JobLoad([str(JOB)]).start()
    assert job.report_ready.wait(120) and job.report is not None
    assert not job.go_on.is_set() and job.timeline is None  # waits for the first screen
    mounted = []

    async def go():
        app = make_app([str(JOB)], options=job.options, job_load=job)
        async with app.run_test(size=(120, 40), message_hook=lambda m: mounted.append(m._sender)
                                if isinstance(m, events.Mount) else None) as pilot:
            await settle(app, pilot)
            assert job.go_on.is_set() and job.done.wait(120) and job.error is None
            await settle(app, pilot)
            assert not any(isinstance(w, LoadingPane) for w in mounted) and any(getattr(w, "id", None) == "headline" for w in mounted)
            assert app.error is None and app.report["job"]["mfu"] == job.report["job"]["mfu"]
            await pilot.press("7")
            await settle(app, pilot)
            assert app.timeline is job.timeline and app.query_one(TimelineView).timeline is job.timeline

    run(go())


def test_suggestion_opens_its_evidence_in_the_timeline():
    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            await pilot.press("6")
            await pilot.pause()
            table = app.query_one("#suggestions-table", FilterTable)
            first = table.shown[0]
            where = first["evidence"]["where"]
            detail = str(app.query_one("#suggestion-detail").render())
            assert first["title"] in detail and first["detail"][:40] in detail
            await pilot.press("enter")
            await settle(app, pilot)
            assert active_tab(app) == "timeline-tab"
            view = app.query_one(TimelineView)
            assert view.highlight == set(where["show"]) and view.hl_window == (where["start_ns"], where["end_ns"])
            assert view.t0 <= where["start_ns"] < where["end_ns"] <= view.t1
            assert view.timeline.tracks[view.sel].rank == where["rank"]

    run(go())


def test_kernel_opens_its_longest_launch():
    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            await pilot.press("4")
            await pilot.pause()
            top = app.query_one("#kernels-table", FilterTable).shown[0]  # the kernel with the most time
            await pilot.press("enter")
            await settle(app, pilot)
            assert active_tab(app) == "timeline-tab"
            view = app.query_one(TimelineView)
            ev = view.timeline.longest(top["name"])
            assert view.t0 < ev["ts"] and ev["end"] < view.t1 and view.timeline.tracks[view.sel].id == ev["track"]
            assert view.highlight == {top["kclass"]}
            assert top["name"][:30] in str(app.query_one("#timeline-status").render())  # the cursor sits on it

    run(go())


def test_timeline_keys_zoom_pan_and_steps():
    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            report = app.report
            await pilot.press("7")
            await settle(app, pilot)
            view = app.query_one(TimelineView)
            full = view.t1 - view.t0
            await pilot.press("w")
            assert view.t1 - view.t0 == full // 2 or abs((view.t1 - view.t0) - full / 2) <= 1
            await pilot.press("s", "s")
            assert view.t1 - view.t0 > full
            t0 = view.t0
            await pilot.press("d")
            assert view.t0 > t0
            await pilot.press("0")
            assert (view.t0, view.t1) == (view.timeline.start, view.timeline.end)
            await pilot.press("]")  # a step of the selected rank
            steps = report["ranks"][0]["steps"]
            assert any(view.t0 <= s["start_ns"] and s["start_ns"] + s["dur_ns"] <= view.t1 and view.t1 - view.t0 < 1.2 * s["dur_ns"]
                       for s in steps)
            await pilot.press("g")  # one GPU row per rank
            assert all(t.is_union for t in view.tracks) and len(view.tracks) == len(report["ranks"])
            await pilot.press("g")
            assert len(view.tracks) == len(view.timeline.tracks)
            n = len(view.timeline.tracks)
            for _ in range(n + 3):
                await pilot.press("down")
            assert view.sel == n - 1
            await pilot.pause()
            assert str(app.query_one("#timeline-status").render()).startswith(view.timeline.tracks[-1].label)

    run(go())


def test_filter_and_sort_tables():
    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            await pilot.press("4")
            await pilot.pause()
            kernels = app.query_one("#kernels-table", FilterTable)
            total = len(kernels.all_rows)
            assert total > 10
            await pilot.press("slash")
            await pilot.press(*"nccl")
            await pilot.pause()
            assert 0 < len(kernels.shown) < total and all("nccl" in r["name"].lower() for r in kernels.shown)
            await pilot.press("escape")  # closes the filter first
            await pilot.pause()
            assert len(kernels.shown) == total and active_tab(app) == "kernels"
            # sort by count (third column): numeric columns sort largest first, again reverses
            kernels.table.move_cursor(column=1)
            await pilot.press("s")
            counts = [r["count"] for r in kernels.shown]
            assert counts == sorted(counts, reverse=True)
            await pilot.press("s")
            assert [r["count"] for r in kernels.shown] == sorted(counts)

    run(go())


def test_help_and_quit():
    async def go():
        async with opened(JOB, (100, 30)) as (app, pilot):
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0

    run(go())


@pytest.mark.parametrize("content,expect", [
    (None, "no such file or directory"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"', "truncated"),
    (b"\x1f\x8b garbage", "gzip"),
])
def test_bad_input_is_shown_in_the_app_not_as_a_traceback(tmp_path, content, expect):
    path = tmp_path / "rank-0.json"
    if content is not None:
        path.write_bytes(content)

    async def go():
        app = make_app([str(path)], use_cache=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(app, pilot)
            assert app.error is not None and str(path) in app.error
            assert expect in app.error.lower()
            shown = str(app.query_one("#error").render())
            assert app.error in shown and "press q to quit" in shown
            await pilot.press("q")
        assert app.return_code == 0

    run(go())


def test_small_terminal_every_view_renders():
    """80x24: every tab renders (no exception), the waterfall still has a bar per entry."""
    async def go():
        async with opened(H100, (80, 24)) as (app, pilot):
            report = app.report
            for key in "1234567":
                await pilot.press(key)
                await pilot.pause()
            await pilot.press("1")
            await pilot.pause()
            chart = app.query_one(WaterfallChart)
            assert chart.size.width <= 80 and len(chart.bars) == len(report["job"]["waterfall"])

    run(go())


def test_saved_report_opens_without_traces(tmp_path):
    report, _ = ready(H100)
    saved = orjson.loads(orjson.dumps(report))

    async def go():
        app = make_app(report=saved)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            assert app.query_one(WaterfallChart).bars == saved["job"]["waterfall"]
            await pilot.press("7")
            await pilot.pause()
            assert not app.query(TimelineView) and "no timeline" in str(app.query_one("#timeline-body .empty").render())

    run(go())


# -- snapshots of the main views -----------------------------------------------------------

def test_snapshot_overview_single_gpu():
    async def go():
        async with opened(H100, (120, 40)) as (app, pilot):
            snapshot(app, "overview_h100")

    run(go())


def test_snapshot_ranks_steps_timeline_two_ranks():
    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            snapshot(app, "overview_2ranks")
            await pilot.press("2")
            await pilot.pause()
            snapshot(app, "ranks_2ranks")
            await pilot.press("enter", "enter")
            await settle(app, pilot)
            snapshot(app, "timeline_2ranks")
            await pilot.press("6")
            await pilot.pause()
            snapshot(app, "suggestions_2ranks")

    run(go())


def test_open_refuses_bad_options_before_starting_the_ui():
    """``tracelens open`` refuses a bad option before starting the UI (exit 2, one line)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "tracelens", "open", str(JOB), "--steps", "x:y"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith("tracelens: error:") and len(r.stderr.strip().splitlines()) == 1


def test_loading_reports_progress_in_bytes():
    """The loading worker posts progress: bytes read on disk out of the total, up to the whole job,
    and the MB/s; the bar is determinate once bytes are known."""
    from tracelens.tui.app import Progress

    seen = []
    path = real_traces() / "hta/trace_filter"
    total = sum(p.stat().st_size for p in path.iterdir())

    async def go():
        app = make_app([str(path)], use_cache=False)
        async with app.run_test(size=(100, 30), message_hook=lambda m: seen.append(m) if isinstance(m, Progress) else None) as pilot:
            await settle(app, pilot)

    run(go())
    sized = [m for m in seen if m.total]
    assert sized and sized[-1].total == total and sized[-1].done == total
    assert all(a.done <= b.done for a, b in zip(sized, sized[1:]))
    assert "MB/s" in sized[-1].text and "2/2 files parsed" in sized[-1].text


@pytest.mark.parametrize("job", ["hta/cpu_only", "amd-tracelens/mi210/gpu_only_trace", "hta/triton_example",
                                 "amd-tracelens/mi300/resnet_act_checkpoint.json.gz", "kineto-tbplugin/samples/resnet50_num_workers_4"])
def test_every_view_renders_on_odd_jobs(job):
    """CPU-only, GPU-only (no host events), Triton, ROCm with recompute, a DataLoader job: every view
    opens and draws without an error."""
    path = real_traces() / job

    async def go():
        app = make_app([str(path)])
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(app, pilot)
            assert app.error is None and app.report is not None
            for key in "1234567":
                await pilot.press(key)
                await pilot.pause()
            await pilot.press("enter", "escape", "1")
            await pilot.pause()
            assert active_tab(app) == "overview"

    run(go())


def test_tables_draw_only_what_is_visible():
    """A 100k-row table (a big job's steps): filling, sorting, filtering and jumping to the end
    format only the rows on screen (plus the first rows used to size the columns)."""
    from textual.app import App

    from tracelens.tui.widgets.table import Column

    rows = [{"rank": i % 1000, "name": f"ProfilerStep#{i // 1000}", "dur_ns": (i * 7919) % 100_003} for i in range(100_000)]

    class One(App):
        def compose(self):
            yield FilterTable("steps", [Column("rank", "rank", str, True), Column("name", "step"), Column("dur_ns", "time", str, True)],
                              rows, id="t")

    async def go():
        app = One()
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            ft = app.query_one(FilterTable)
            table = ft.table
            table.focus()
            assert len(ft.shown) == 100_000 and len(table._cells) <= 500 + 30
            table.move_cursor(column=2)
            await pilot.press("s")  # numeric: largest first
            assert [r["dur_ns"] for r in ft.shown[:3]] == sorted((r["dur_ns"] for r in rows), reverse=True)[:3]
            await pilot.press("end")
            await pilot.pause()
            assert table.cursor_row == 99_999 and len(table._cells) <= 500 + 2 * 30
            await pilot.press("slash", *"#99")
            await pilot.pause()
            assert len(ft.shown) == 1000 and all(r["name"] == "ProfilerStep#99" for r in ft.shown)

    run(go())


def test_ranks_and_steps_show_the_highlighted_rows_waterfall():
    from tracelens.render import tables as views

    async def go():
        async with opened(H100, (120, 40)) as (app, pilot):
            await pilot.press("3")
            await settle(app, pilot)
            chart = app.query_one("#steps-body WaterfallChart", WaterfallChart)
            step = app.query_one("#steps-table", FilterTable).shown[0]
            assert chart.bars == views.waterfall(app.report, step["rank"], step["step"])[0] and chart.kind == "mfu"
            assert abs(sum(b["fraction"] for b in chart.bars) - 1.0) < 1e-9
            await pilot.press("down")
            await pilot.pause()
            step = app.query_one("#steps-table", FilterTable).shown[min(1, len(app.report["ranks"][0]["steps"]) - 1)]
            assert chart.bars == views.waterfall(app.report, step["rank"], step["step"])[0]

    run(go())


def test_set_the_gpu_in_the_app_reanalyses():
    """The sample job names no GPU: G asks for one; "A100" re-runs the analysis in a worker and
    the views show the MFU that `report --gpu A100` gives; an unknown name changes nothing."""
    from tracelens.analysis import Options

    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            assert app.report["job"]["mfu"] is None
            await pilot.press("G")
            await pilot.pause()
            await pilot.press(*"Z9000", "enter")
            await settle(app, pilot)
            assert app.report["job"]["mfu"] is None  # not in the table: refused, nothing re-run
            await pilot.press("G")
            await pilot.pause()
            inp = app.screen.query_one("#gpu-input")
            inp.value = ""
            await pilot.press(*"A100", "enter")
            await settle(app, pilot)
            _, trace = ready(JOB)
            want = analyze(trace, Options(gpu="A100")).to_dict()["job"]["mfu"]
            assert want is not None and app.report["job"]["mfu"] == want
            assert f"MFU {100 * want:.2f}%" in str(app.query_one("#headline").render())
            assert app.query_one(WaterfallChart).kind == "mfu"

    run(go())


# -- issue 13, item 10: the warnings, the FLOPs key, the report's waterfall, whole tables, no control codes --

def no_flops_trace(tmp_path, kernel_name: str | None = None) -> Path:
    """The hand-built DeepSeek-style rank of tests/test_frontends.py (an H800, no shapes)."""
    from tests.test_frontends import deepseek_style

    p = deepseek_style(tmp_path / "rank-0.json")
    if kernel_name is not None:
        doc = orjson.loads(p.read_bytes())
        for e in doc["traceEvents"]:
            if e["name"].startswith("sm90_xmma_gemm"):
                e["name"] = kernel_name
        p.write_bytes(orjson.dumps(doc))
    return p


def test_warnings_view_lists_every_warning_and_the_overview_leads_there():
    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            warnings = app.report["warnings"]
            assert warnings  # no GPU named in the trace, and more
            headline = str(app.query_one("#headline").render())
            assert f"{len(warnings)} warning(s): press 8 to read them" in headline
            await pilot.press("8")
            await pilot.pause()
            assert active_tab(app) == "warnings"
            table = app.query_one("#warnings-table", FilterTable)
            assert [r["text"] for r in table.shown] == warnings
            assert f"({len(warnings)})" in str(table.query_one(".title").render())
            detail = str(app.query_one("#warning-detail").render())
            assert table.shown[0]["warning"] in detail
            await pilot.press("down")
            await pilot.pause()
            assert table.shown[1]["warning"] in str(app.query_one("#warning-detail").render())

    run(go())


def test_set_the_model_flops_in_the_app_reanalyses(tmp_path):
    """A trace without shapes on a known GPU (an H800): the overview says the FLOPs are missing
    (not the GPU) and F asks for them; 1e11 gives the MFU that `report --model-flops-per-step 1e11`
    gives (1e12 would be 126%, more than the GPU can do); a non-number is refused and changes nothing."""
    from tracelens.analysis import Options

    path = no_flops_trace(tmp_path)

    async def go():
        app = make_app([str(path)], use_cache=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            assert app.report["job"]["mfu"] is None
            headline = str(app.query_one("#headline").render())
            assert "model FLOPs are missing" in headline and "press F" in headline and "press G" not in headline
            assert "NVIDIA H800" in headline
            chart = app.query_one(WaterfallChart)
            assert chart.kind == "time" and chart.bars == app.report["job"]["waterfall"] and chart.bars[-1]["key"] == "compute"
            await pilot.press("F")
            await pilot.pause()
            await pilot.press(*"lots", "enter")
            await settle(app, pilot)
            assert app.report["job"]["mfu"] is None  # refused
            await pilot.press("F")
            await pilot.pause()
            app.screen.query_one("#flops-input").value = ""
            await pilot.press(*"1e11", "enter")
            await settle(app, pilot)
            want = analyze(load([path], use_cache=False), Options(model_flops_per_step=1e11)).to_dict()["job"]["mfu"]
            assert want is not None and app.report["job"]["mfu"] == want
            assert f"MFU {100 * want:.2f}%" in str(app.query_one("#headline").render())
            assert app.query_one(WaterfallChart).kind == "mfu"

    run(go())


def test_waterfall_chart_draws_the_shared_layout():
    """The chart's rows are views.waterfall_layout's: each bar, then its parts (the first four and
    one row for the rest), as the text report and the HTML page show them."""
    from tracelens.render import tables as views

    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            chart = app.query_one(WaterfallChart)
            table = chart.render()
            labels = [str(c).strip() for c in table.columns[0]._cells]
            want = []
            for r in views.waterfall_layout(chart.bars):
                want.append(r["label"])
                want += [p["label"] for p in r["parts"]]
            assert labels == want and any(lb.startswith("… ") for lb in labels)

    run(go())


def test_kernel_table_shows_every_kernel_with_the_true_total():
    from tracelens.render import tables as views

    async def go():
        async with opened(JOB, (120, 40)) as (app, pilot):
            await pilot.press("4")
            await pilot.pause()
            table = app.query_one("#kernels-table", FilterTable)
            rows = views.kernel_rows(app.report)
            assert len(table.all_rows) == len(rows) == len(app.report["job"]["kernels"]) > 60  # it showed the ranks' 30 longest
            title = str(table.query_one(".title").render())
            assert f"{len(rows):,} names" in title
            await pilot.press("end")
            await pilot.pause()
            assert table.table.cursor_row == len(rows) - 1

    run(go())


def test_names_from_the_trace_never_reach_the_terminal_as_control_codes_or_markup(tmp_path):
    """A kernel named with an escape sequence, a bell, a newline and Rich markup: in the kernel table,
    the timeline's status line and the notification it is shown as text, with U+FFFD for each
    control sequence, the brackets as they are."""
    evil = "gemm\x1b[31m\x07[bold]x[/bold]\nline"
    path = no_flops_trace(tmp_path, kernel_name=evil)

    async def go():
        app = make_app([str(path)], use_cache=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("4")
            await pilot.pause()
            table = app.query_one("#kernels-table", FilterTable)
            top = table.shown[0]
            assert top["name"] == "gemm\ufffd\ufffd[bold]x[/bold]\ufffdline"
            await pilot.press("enter")
            await settle(app, pilot)
            status = str(app.query_one("#timeline-status").render())
            assert "[bold]x[/bold]" in status and "\x1b" not in status
            for key in "12345678":
                await pilot.press(key)
                await pilot.pause()
            svg = app.export_screenshot()
            assert not any(ch in svg for ch in "\x1b\x07\x9b")

    run(go())


def test_overview_shows_the_same_headline_numbers_as_the_text_and_html():
    from tracelens.model.units import fmt_ns, fmt_pct
    from tracelens.render import tables as views

    async def go():
        async with opened(H100, (120, 40)) as (app, pilot):
            d = app.report
            head = str(app.query_one("#headline").render()) + " " + str(app.query_one("#stats").render())
            st, g = d["job"]["step_time_ns"], d["job"]["gpu_time_ns"]
            w = sum(g[k] for k in ("idle", "compute", "exposed_comm", "exposed_memcpy"))
            for x in (f"MFU {100 * d['job']['mfu']:.2f}%", views.mfu_text(views.headline(d)), f"mean {fmt_ns(st['mean'])}",
                      f"p50 {fmt_ns(st['p50'])}", f"max {fmt_ns(st['max'])}", f"compute {fmt_pct(g['compute'] / w)}",
                      f"idle {fmt_pct(g['idle'] / w)}"):
                assert x in head, x

    run(go())


def test_a_path_that_looks_like_markup_is_shown_as_text(tmp_path):
    """A trace at 'x[/]t.json.gz' (a folder 'x[' holding ']t.json.gz'): the loading screen's
    'opening PATH' once parsed the path as markup (Textual MarkupError, a traceback)."""
    import shutil

    (tmp_path / "x[").mkdir()
    path = f"{tmp_path}/x[/]t.json.gz"
    shutil.copyfile(JOB / "rank-0.json.gz", path)

    async def go():
        app = make_app([path], use_cache=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(app, pilot)
            return app.error, app.report is not None

    assert run(go()) == (None, True)
