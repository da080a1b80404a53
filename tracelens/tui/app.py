"""TracelensApp: loads a job in a worker (with progress), then shows the report's views in
tabs.  Every number comes from the report dict (``Analysis.to_dict()``) through
``tracelens.render.tables``, as the HTML report's do; the timeline reads the event table.

The load is a ``tracelens.tui.loading.JobLoad``: the report first (from the report cache when
the job is unchanged), shown at once; the event table for the timeline after the first screen."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import AwaitMount
from textual.widgets import Footer, Header, Label, ProgressBar, Static, TabbedContent
from textual.worker import Worker, WorkerState

from tracelens.model.units import fmt_ns
from tracelens.render import tables as views
from tracelens.tui.loading import JobLoad
from tracelens.tui.panes import STEPS_TITLE, TIMELINE_LOADING, VIEWS, MainView
from tracelens.tui.widgets.table import FilterTable, RowTable
from tracelens.tui.widgets.timeline import TimelineView
from tracelens.tui.widgets.waterfall import WaterfallChart


class Progress(Message):
    def __init__(self, text: str, done: int | None, total: int | None):
        super().__init__()
        self.text, self.done, self.total = text, done, total


class Loaded(Message):
    def __init__(self, report: dict[str, Any], timeline: Any):
        super().__init__()
        self.report, self.timeline = report, timeline


class TimelineReady(Message):
    """The event table is read (after the first screen): the timeline and a re-analysis can run."""

    def __init__(self, timeline: Any, trace: Any):
        super().__init__()
        self.timeline, self.trace = timeline, trace


class Reanalyzed(Message):
    def __init__(self, report: dict[str, Any]):
        super().__init__()
        self.report = report


class PathReady(Message):
    """A step's whole critical path, computed on demand for the timeline (or why it could not be)."""

    def __init__(self, row: dict[str, Any], path: Any, error: str | None = None):
        super().__init__()
        self.row, self.path, self.error = row, path, error


class Failed(Message):
    def __init__(self, text: str):
        super().__init__()
        self.text = text


class LoadingPane(Vertical):
    def __init__(self, what: str):
        super().__init__(id="loading")
        self.what = what

    def compose(self) -> ComposeResult:
        yield Label(Text(f"opening {self.what}"), id="loading-title")  # a path is data, not markup ("run[/]" crashed it)
        yield ProgressBar(total=None, show_eta=False, id="loading-bar")
        yield Label("", id="loading-status")


class TracelensApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "tracelens"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("escape", "back", "Back"),
        Binding("p", "toggle_parts", "Bar parts", show=False),
        Binding("G", "set_gpu", "Set GPU"),
        Binding("F", "set_flops", "Set FLOPs"),
        Binding("C", "critical_path", "Critical path", show=False),
        Binding("n", "show_tab('nccl')", "NCCL"),
    ] + [Binding(str((i + 1) % 10), f"show_tab('{pane_id}')", title, show=False) for i, (pane_id, title, _) in enumerate(VIEWS)]  # the tenth: 0

    def __init__(self, *, paths: list[str], options: Any = None, use_cache: bool = True, jobs: int | None = None,
                 report: dict[str, Any] | None = None, trace: Any = None, strict: bool = False, error: str | None = None,
                 job_load: JobLoad | None = None):
        super().__init__()
        self._job_load = job_load  # a load started before Textual was imported (tracelens open), else started here
        self._startup_error = error
        self.paths = paths
        self.options = options
        self.use_cache = use_cache
        self.jobs = jobs
        self.strict = strict
        self.report: dict[str, Any] | None = report
        self._trace = trace
        self.timeline = None
        self.timeline_pending = False  # the report is shown, its event table still loading
        self.history: list[tuple] = []
        self.error: str | None = None
        self._views_composed: MainView | None = None  # the views, when composed with the app (the report was ready)

    def compose(self) -> ComposeResult:
        yield Header()
        job = self._job_load
        if self.report is None and job is not None and job.report_ready.is_set() and job.report is not None:
            # the report was there (the report cache) before Textual was even imported: the views at once,
            # no loading screen drawn first; its events follow after the first screen (on_mount, load_job)
            self.timeline_pending = True
            self._views_composed = self._main_view(job.report)
            yield self._views_composed
        else:
            yield LoadingPane(", ".join(self.paths) if self.paths else "the report")
        yield Footer()

    async def on_mount(self) -> None:
        if self._startup_error is not None:
            self.on_failed(Failed(self._startup_error))
        elif self._views_composed is not None:
            self.load_job()  # the events: once the first screen is drawn
            await AwaitMount(self.screen, [self._views_composed])
            self.call_after_refresh(self._job_load.go_on.set)
        elif self.report is not None:
            if self._trace is not None:
                from tracelens.analysis.timeline import JobTimeline

                self.timeline = JobTimeline(self._trace)
            self._show(self.report)
        else:
            self.load_job()

    # -- loading ----------------------------------------------------------------------------
    @work(thread=True, exclusive=True, exit_on_error=False, group="load", description="load and analyze the traces")
    def load_job(self) -> None:
        job = self._job_load or JobLoad(self.paths, options=self.options, use_cache=self.use_cache, jobs=self.jobs,
                                        strict=self.strict).start()
        self._job_load = job
        job.attach(lambda text, done, total: self.post_message(Progress(text, done, total)))
        job.report_ready.wait()
        if job.report is None:
            self.post_message(Failed(self._failure(job.error)))
            return
        if self._views_composed is None:
            self.post_message(Loaded(job.report, None))
        job.done.wait()
        if job.error is not None:  # the report is shown; only its events could not be read
            self.post_message(TimelineReady(None, None))
            self.call_from_thread(self.notify, f"no timeline: {self._failure(job.error)}", severity="warning", markup=False)
        else:
            self.post_message(TimelineReady(job.timeline, job.trace))

    @staticmethod
    def _failure(e: BaseException | None) -> str:
        from tracelens.model.errors import TraceInputError

        if isinstance(e, TraceInputError):
            return f"cannot open {e}"
        return f"internal error: {type(e).__name__}: {e}"

    async def on_timeline_ready(self, msg: TimelineReady) -> None:
        self.timeline, self._trace, self.timeline_pending = msg.timeline, msg.trace, False
        main = self._main()
        if main is not None:  # a timeline view built before the events were there is built again with them
            await main.set_timeline(self.timeline)

    def on_unmount(self) -> None:
        if self._job_load is not None:
            self._job_load.go_on.set()  # a load waiting for a first screen that never came goes on (and ends)

    def _can_reanalyse(self) -> bool:
        if self.report is None:
            self.notify("still loading", severity="warning")
            return False
        if self.timeline_pending:
            self.notify("still reading the events: try again in a moment", severity="warning")
            return False
        if self._trace is None:
            self.notify("a saved report cannot be re-analysed: open its traces", severity="warning")
            return False
        return True

    def action_set_gpu(self) -> None:
        if self._can_reanalyse():
            from tracelens.tui.screens.ask import gpu_screen

            self.push_screen(gpu_screen(self.options.gpu if self.options is not None else None), self._gpu_chosen)

    def action_set_flops(self) -> None:
        if self._can_reanalyse():
            from tracelens.tui.screens.ask import flops_screen

            current = self.options.model_flops_per_step if self.options is not None else None
            self.push_screen(flops_screen(current), self._flops_chosen)

    def _flops_chosen(self, answer: str | None) -> None:
        from dataclasses import replace

        from tracelens.analysis import Options
        from tracelens.model.units import parse_count

        if not answer:
            return
        try:
            flops = parse_count(answer, "model FLOPs per step")
        except ValueError as e:
            self.notify(str(e), severity="error", markup=False)
            return
        self.options = replace(self.options or Options(), model_flops_per_step=flops)
        self.reanalyze()

    def _gpu_chosen(self, answer: str | None) -> None:
        from dataclasses import replace

        from tracelens.analysis import Options
        from tracelens.model import gpus

        if not answer:
            return
        opts = self.options or Options()
        try:
            peak = float(answer)
        except ValueError:
            if gpus.lookup(answer) is None:
                self.notify(f"{answer!r} is not in the peak table; give its dense peak in TFLOP/s instead", severity="error", markup=False)
                return
            opts = replace(opts, gpu=answer, peak_tflops=None)
        else:
            if not (peak > 0 and peak != float("inf")):  # also NaN
                self.notify("the peak must be a positive number of TFLOP/s", severity="error")
                return
            opts = replace(opts, peak_tflops=peak)
        self.options = opts
        self.reanalyze()

    def action_critical_path(self) -> None:
        """Analyse again with the critical path (and its what-if replays), when the report has none."""
        from dataclasses import replace

        from tracelens.analysis import Options

        if self.options is not None and self.options.critical_path and self.report is not None and \
                any(r.get("critical_path") for r in self.report["ranks"]):
            self.notify("the critical path is in this report: press 9 for its view")
            return
        if self._can_reanalyse():
            self.options = replace(self.options or Options(), critical_path=True)
            self.notify("computing each step's critical path…")
            self.reanalyze()

    @work(thread=True, exclusive=True, exit_on_error=False, group="load", description="analyze again with new options")
    def reanalyze(self) -> None:
        from tracelens.analysis import analyze

        try:
            report = analyze(self._trace, self.options).to_dict()
        except Exception as e:  # shown in the app, never as a traceback
            self.post_message(Failed(f"internal error: {type(e).__name__}: {e}"))
            return
        self.post_message(Reanalyzed(report))

    async def on_reanalyzed(self, msg: Reanalyzed) -> None:
        await self.query("#main").remove()
        self.history.clear()
        self._show(msg.report)
        self.notify(f"re-analysed: MFU {100 * msg.report['job']['mfu']:.2f}%" if msg.report["job"]["mfu"] is not None
                    else f"re-analysed: {views.why_unknown(self.report)}", markup=False)

    @work(thread=True, exclusive=True, exit_on_error=False, group="path", description="trace one step's critical path")
    def _step_path(self, row: dict[str, Any]) -> None:
        from tracelens.analysis import Options
        from tracelens.analysis.rank import step_path_segments
        from tracelens.tui.widgets.timeline import PathOverlay

        try:
            fi = row["file"]
            seg = step_path_segments(self._trace.frame(fi), self._trace.metas[fi], self.options or Options(),
                                     row["step_start_ns"], row["step_end_ns"])
            cols = {c: seg.get_column(c).to_list() for c in ("start_ns", "end_ns", "category", "device", "stream", "name")}
            path = PathOverlay(row["rank"], cols["start_ns"], cols["end_ns"], cols["category"], cols["device"], cols["stream"],
                               cols["name"])
        except Exception as e:  # shown as a notice, never a traceback: the top events still go to the timeline
            self.post_message(PathReady(row, None, f"{type(e).__name__}: {e}"))
            return
        self.post_message(PathReady(row, path))

    async def on_path_ready(self, msg: PathReady) -> None:
        row = msg.row
        if msg.path is None:
            self.notify(f"the step's whole path could not be traced ({views.printable(msg.error or '')[:200]}): its top events "
                        "are highlighted", severity="warning", markup=False)
            await self._timeline_at(row["step_start_ns"], row["step_end_ns"], row["rank"], None, None, row["path_spans"])
            return
        await self._timeline_at(row["step_start_ns"], row["step_end_ns"], row["rank"], None, None, None, msg.path)

    def on_progress(self, msg: Progress) -> None:
        if not self.query("#loading-status"):
            return
        self.query_one("#loading-status", Label).update(msg.text)
        bar = self.query_one("#loading-bar", ProgressBar)
        if msg.total:
            bar.update(total=msg.total, progress=msg.done)
        else:
            bar.update(total=None)

    async def on_loaded(self, msg: Loaded) -> None:
        self.timeline = msg.timeline
        self.timeline_pending = msg.timeline is None and self._job_load is not None
        mounted = self._show(msg.report)
        if self._job_load is not None:
            # the events (polars: a GIL-heavy import, then the scans) only once the first view's widgets
            # are mounted and the screen that shows them is drawn, never while it is being built
            await mounted
            self.call_after_refresh(self._job_load.go_on.set)

    def on_failed(self, msg: Failed) -> None:
        self.error = msg.text
        for w in self.query("#loading"):
            w.remove()
        shown = views.printable(msg.text)  # may quote a file: no control codes, and Text is never markup
        self.mount(Static(Text.assemble(("✗ ", "bold red"), (shown, "bold"), "\n\npress q to quit"), id="error"),
                   before=self.query_one(Footer))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and self.error is None:
            self.on_failed(Failed(f"internal error: {event.worker.error}"))

    # -- the views --------------------------------------------------------------------------
    def _show(self, report: dict[str, Any]) -> Any:
        """Shows ``report``'s views (the first one built now, the others on first show): the
        AwaitMount of the main view, done once the first view's widgets are mounted."""
        for w in self.query("#loading"):
            w.remove()
        return self.mount(self._main_view(report), before=self.query_one(Footer))

    def _main_view(self, report: dict[str, Any]) -> MainView:
        report = views.printable_report(report)  # no control character from a file reaches the terminal
        self.report = report
        n = len(report["ranks"])
        self.sub_title = f"{n} rank(s) · " + (f"MFU {100 * report['job']['mfu']:.2f}%" if report["job"]["mfu"] is not None else "MFU unknown")
        return MainView(report, TIMELINE_LOADING if self.timeline_pending else self.timeline)

    def _tabs(self) -> TabbedContent | None:
        q = self.query("#tabs")
        return q.first(TabbedContent) if q else None

    def _main(self) -> MainView | None:
        q = self.query("#main")
        return q.first(MainView) if q else None

    def _state(self) -> tuple:
        """Where the user is (the tab, the steps table's rows, the timeline's window), for esc:
        None for a view not built yet (it is then as it was built)."""
        tabs, main = self._tabs(), self._main()
        tl = self.query("#timeline")
        tls = None
        if tl:
            v = tl.first(TimelineView)
            tls = (v.t0, v.t1, v.sel, v.top, v.cursor, set(v.highlight), v.hl_window, v.path_spans, v.path_rank, v.path)
        steps = None
        if main is not None and main.built("steps") and self.query("#steps-table"):
            ft = self.query_one("#steps-table", FilterTable)
            steps = (ft.all_rows, ft.title)
        return (tabs.active if tabs else None, steps, tls)

    async def _restore(self, state: tuple) -> None:
        tab, steps, tls = state
        if self.query("#steps-table"):  # built since: back to what it was (its first rows when it was not built then)
            rows, title = steps if steps is not None else (views.step_rows(self.report), STEPS_TITLE)
            self.query_one("#steps-table", FilterTable).set_rows(rows, title)
        if tls is not None and self.query("#timeline"):
            v = self.query_one("#timeline", TimelineView)
            v.t0, v.t1, v.sel, v.top, v.cursor, v.highlight, v.hl_window, v.path_spans, v.path_rank, v.path = tls
            v.refresh()
        await self.action_show_tab(tab)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The NCCL key only where the report has an NCCL view (hidden from the footer elsewhere)."""
        if action == "show_tab" and parameters == ("nccl",):
            main = self._main()
            return main is not None and any(v[0] == "nccl" for v in main.views)
        return True

    async def action_show_tab(self, tab: str) -> None:
        tabs, main = self._tabs(), self._main()
        if tabs is None or main is None or tab is None or all(v[0] != tab for v in main.views):
            return
        await main.ensure(tab)  # built on first show
        tabs.active = tab
        self.call_after_refresh(self._focus_active)

    def _focus_active(self) -> None:
        tabs = self._tabs()
        if tabs is None:
            return
        pane = tabs.get_pane(tabs.active)
        target = pane.query("TimelineView, RowTable")
        if target:
            target.first().focus()

    def action_help(self) -> None:
        from tracelens.tui.screens.help import HelpScreen  # (Markdown: imported when first asked for)

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_parts(self) -> None:
        main = self._main()
        if main is not None:
            main.parts_flipped = not main.parts_flipped  # and the charts of views built later
        for w in self.query(WaterfallChart):
            w.show_parts = not w.show_parts

    async def action_back(self) -> None:
        for ft in self.query(FilterTable):
            if ft.close_filter():
                return
        if self.history:
            await self._restore(self.history.pop())
        elif self._tabs() is not None and self._tabs().active != "overview":
            await self.action_show_tab("overview")

    async def _timeline_at(self, start: int | None, end: int | None, rank: int | None, show: set[str] | None = None,
                     hl: tuple[int, int] | None = None, spans: list[tuple[int, int]] | None = None, path: Any = None) -> None:
        if self.timeline_pending:
            self.notify("the timeline is still loading: try again in a moment", severity="warning")
            return
        if self.timeline is None or start is None or end is None:
            self.notify("no timeline for this (a saved report, or no GPU events)", severity="warning")
            return
        self.history.append(self._state())
        await self.action_show_tab("timeline-tab")
        self.call_after_refresh(lambda: self.query_one("#timeline", TimelineView).show_window(start, end, rank, show, hl, spans, path))

    @on(RowTable.Chosen)
    async def _drill(self, event: RowTable.Chosen) -> None:
        tid, row = event.table.id, event.row
        main = self._main()
        if main is None:
            return
        if tid == "ranks-table":
            self.history.append(self._state())
            await main.ensure("steps")
            self.query_one("#steps-table", FilterTable).set_rows(
                views.step_rows(self.report, row["rank"]), f"steps of rank {row['rank']} (enter: timeline · esc: back)")
            await self.action_show_tab("steps")
        elif tid == "steps-table":
            await self._timeline_at(row["start_ns"], row["start_ns"] + row["dur_ns"], row["rank"])
        elif tid == "suggestions-table":
            w = row["evidence"].get("where") or {}
            show = set(w.get("show") or ())
            await self._timeline_at(w.get("start_ns"), w.get("end_ns"), w.get("rank"), show,
                                    (w["start_ns"], w["end_ns"]) if w.get("start_ns") is not None else None)
        elif tid in ("critical-events-table", "critical-steps-table"):  # the step in the timeline, its path highlighted
            if self._trace is not None and self.timeline is not None and row.get("file") is not None:
                self.notify("tracing the step's whole critical path…")
                self._step_path(row)  # the whole path, computed now (the report holds only its top events)
            else:  # a saved report: the top events the report holds
                await self._timeline_at(row["step_start_ns"], row["step_end_ns"], row["rank"], None, None, row["path_spans"])
        elif tid == "pipeline-bubbles-table":  # the bubble, in its step, marked
            await self._timeline_at(row["step_start_ns"], row["step_end_ns"], row["rank"], None, (row["start_ns"], row["end_ns"]))
        elif tid == "slow-table":
            if row["start_ns"] is not None:
                await self._timeline_at(row["start_ns"], row["start_ns"] + (row["max_ns"] or 1), row["first_rank"], {"comm"})
        elif tid == "kernels-table":
            ev = self.timeline.longest(row["name"]) if self.timeline is not None else None
            if ev is None:
                self.notify(f"{row['name'][:80]}: {row['count']:,} launches, {fmt_ns(row['total_ns'])} in all", markup=False)
                return
            # its longest launch, with ten times its length of context on each side
            pad = max(ev["dur_ns"] * 10, 10_000)
            rank = self.timeline.tracks[ev["track"]].rank
            await self._timeline_at(ev["ts"] - pad, ev["end"] + pad, rank, {row["kclass"]})
            self.call_after_refresh(lambda: self.query_one("#timeline", TimelineView).select_track(ev["track"]))
