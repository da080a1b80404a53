"""TracelensApp: loads a job in a worker (with progress), then shows the report's views in
tabs.  Every number comes from the report dict (``Analysis.to_dict()``) through
``tracelens.views``, as the HTML report's do; the timeline reads the event table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, Label, ProgressBar, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from tracelens import views
from tracelens.tui.screens.help import HelpScreen
from tracelens.tui.widgets.rank_strip import RankStrip
from tracelens.tui.widgets.table import Column, FilterTable, RowTable
from tracelens.tui.widgets.timeline import TimelineView
from tracelens.tui.widgets.waterfall import WaterfallChart
from tracelens.units import fmt_bytes, fmt_ns, fmt_num, fmt_pct, fmt_pct2
from tracelens.views import KCLASS_COLOURS


class Progress(Message):
    def __init__(self, text: str, done: int | None, total: int | None):
        super().__init__()
        self.text, self.done, self.total = text, done, total


class Loaded(Message):
    def __init__(self, report: dict[str, Any], timeline: Any):
        super().__init__()
        self.report, self.timeline = report, timeline


class Failed(Message):
    def __init__(self, text: str):
        super().__init__()
        self.text = text


class LoadingPane(Vertical):
    def __init__(self, what: str):
        super().__init__(id="loading")
        self.what = what

    def compose(self) -> ComposeResult:
        yield Label(f"opening {self.what}", id="loading-title")
        yield ProgressBar(total=None, show_eta=False, id="loading-bar")
        yield Label("", id="loading-status")


class OverviewPane(VerticalScroll):
    """The headline MFU, the waterfall, step-time stats, the per-rank strip, top suggestions."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(id="overview-body")
        self.report = report

    def compose(self) -> ComposeResult:
        r = self.report
        h = views.headline(r)
        bars, kind = views.waterfall(r)
        yield Static(self._headline(h), id="headline")
        yield Static(self._stats(), id="stats")
        title = ("MFU loss waterfall, all ranks: from 100% of the dense peak down to the MFU" if kind == "mfu"
                 else "GPU time, all ranks (MFU unknown: no waterfall; bars end at the compute share)")
        yield Label(title, classes="section")
        yield WaterfallChart(bars, kind, id="waterfall")
        label, series = views.per_rank_series(r)
        yield Label(f"{label}, one bar per rank from zero (stragglers red, >5% worse than the median orange)", classes="section")
        if len(series) > 1:
            ranks = [row["rank"] for row in views.rank_rows(r)]
            yield RankStrip(ranks, series, {s["rank"] for s in r["job"]["stragglers"]}, higher_is_worse="MFU" not in label,
                            id="rank-strip")
        yield Static(self._ranks_line(), id="rank-summary")
        yield Label("top suggestions (press 6 for all of them, with their evidence)", classes="section")
        yield Static(self._suggestions(), id="top-suggestions")

    def _headline(self, h: dict[str, Any]) -> Text:
        t = Text()
        if h["mfu"] is not None:
            t.append(f"MFU {100 * h['mfu']:.2f}%", style="bold #33d17a")
            t.append(f"  of {h['gpu_model']} dense peak ({h['peak_flops'] / 1e12:,.0f} TFLOP/s), model FLOPs from {h['flops_source']}")
            if h["hfu"] is not None:
                t.append(f", HFU {100 * h['hfu']:.2f}%")
        else:
            t.append("MFU unknown", style="bold #f6d32d")
            why = h["why_unknown"].removeprefix("MFU unknown").lstrip(": ")
            t.append(f"  {why}; --gpu NAME or --peak-tflops X set the peak")
        t.append(f"\n{h['ranks']} rank(s) · {h['device'] or 'unknown GPU'}")
        return t

    def _stats(self) -> Text:
        s = views.step_stats(self.report)
        g = self.report["job"]["gpu_time_ns"]
        t = Text()
        if s["count"]:
            t.append(f"step time over {s['count']} step(s) (warm-up excluded): mean {fmt_ns(s['mean'])}, p50 {fmt_ns(s['p50'])}, "
                     f"p90 {fmt_ns(s['p90'])}, max {fmt_ns(s['max'])}")
        if g:
            w = g["idle"] + g["compute"] + g["exposed_comm"] + g["exposed_memcpy"]
            if w:
                t.append(f"\nGPU time: compute {fmt_pct(g['compute'] / w)}, idle {fmt_pct(g['idle'] / w)}, exposed comm "
                         f"{fmt_pct(g['exposed_comm'] / w)}, exposed memcpy {fmt_pct(g['exposed_memcpy'] / w)}")
        return t

    def _ranks_line(self) -> Text:
        rows = views.rank_rows(self.report)
        t = Text()
        if not rows:
            return t
        key = "mfu" if all(r["mfu"] is not None for r in rows) else "step_ns"
        lo = min(rows, key=lambda r: r[key] or 0)
        hi = max(rows, key=lambda r: r[key] or 0)
        show = (lambda v: fmt_pct2(v)) if key == "mfu" else (lambda v: fmt_ns(v))
        t.append(f"lowest: rank {lo['rank']} {show(lo[key])} · highest: rank {hi['rank']} {show(hi[key])}")
        odd = views.outliers([x["rank"] for x in rows], [x[key] or 0 for x in rows], higher_is_worse=key != "mfu")
        if odd:
            worst = sorted(odd.items(), key=lambda kv: -kv[1])[:5]
            t.append("\nworse than the median rank by more than 5%: " + ", ".join(f"rank {rk} ({100 * off:.1f}%)" for rk, off in worst)
                     + (f" and {len(odd) - 5} more" if len(odd) > 5 else ""), style="#ff7800")
        strag = self.report["job"]["stragglers"]
        if strag:
            t.append("\nstragglers: " + ", ".join(f"rank {s['rank']} (+{fmt_ns(s['excess_ns'])}, last in {s['last_in']}/{s['of']})"
                                                  for s in strag), style="bold #e01b24")
        elif len(rows) > 1:
            t.append("\nno straggler: no rank arrives last at collectives more often than chance", style="dim")
        return t

    def _suggestions(self) -> Group | Text:
        sg = self.report["suggestions"]
        if not sg:
            return Text("none: no rule fired", style="dim")
        lines = []
        for s in sg[:4]:
            t = Text("• ")
            t.append(s["title"], style="bold")
            if s["est_speedup"]:
                t.append(f"  up to {views.fmt_speedup(s['est_speedup'])} faster", style="#33d17a")
            t.append(f"\n  {s['detail']}", style="dim")
            lines.append(t)
        return Group(*lines)


class SuggestionsPane(Horizontal):
    def __init__(self, report: dict[str, Any]):
        super().__init__(id="suggestions-body")
        self.report = report
        self.rows = [{**s, "n": i + 1, "speedup": s["est_speedup"], "nranks": len(s["ranks"])} for i, s in enumerate(report["suggestions"])]

    def compose(self) -> ComposeResult:
        yield FilterTable("largest possible win first (enter: the evidence in the timeline)", [
            Column("n", "#", str, True),
            Column("speedup", "up to", views.fmt_speedup, True),
            Column("nranks", "ranks", str, True),
            Column("title", "suggestion"),
        ], self.rows, id="suggestions-table", empty="no rule fired")
        yield Static(self._detail(self.rows[0] if self.rows else None), id="suggestion-detail")

    def _detail(self, s: dict[str, Any] | None) -> Text:
        if s is None:
            return Text("no suggestion", style="dim")
        t = Text()
        t.append(s["title"] + "\n\n", style="bold")
        t.append("fix: ", style="bold #33d17a")
        t.append(s["detail"] + "\n\n")
        ev = s["evidence"]
        t.append("evidence\n", style="bold")
        if "measure" in ev:
            val = views.evidence_value(ev)
            t.append(f"  {ev['measure']}: worst {val(ev['worst'])}, mean {val(ev['mean'])} (fires at {val(ev['threshold'])})\n")
            per = ev.get("per_rank", {})
            if per:
                items = sorted(per.items(), key=lambda kv: -kv[1])[:8]
                t.append("  ranks: " + ", ".join(f"r{k} {val(v)}" for k, v in items) + (" …" if len(per) > 8 else "") + "\n")
        else:
            t.append(f"  {ev.get('detail', '')}\n")
        w = ev.get("where")
        if w and w.get("start_ns") is not None:
            t.append(f"  most visible in rank {w['rank']}, {w.get('step_name') or 'the trace'}"
                     + (f" ({fmt_pct(w['value'])} of that step)" if w.get("value") is not None else "") + " — enter shows it\n")
        if s["est_speedup"]:
            t.append(f"\nestimate: up to {views.fmt_speedup(s['est_speedup'])} faster (1 / (1 - share), an upper bound)\n", style="dim")
        return t

    @on(RowTable.Highlighted)
    def _show_detail(self, event: RowTable.Highlighted) -> None:
        if event.row is not None and self.query("#suggestion-detail"):
            self.query_one("#suggestion-detail", Static).update(self._detail(event.row))


class TableWithWaterfall(Vertical):
    """A table of ranks or steps over the waterfall of the highlighted row (its own MFU
    waterfall, or its GPU-time bars when the MFU is unknown)."""

    def __init__(self, report: dict[str, Any], table: FilterTable, *, id: str):
        super().__init__(id=id)
        self.report, self.table = report, table

    def compose(self) -> ComposeResult:
        yield self.table
        yield Label("", classes="section", id=f"{self.id}-wf-title")
        bars, kind = views.waterfall(self.report)
        yield WaterfallChart(bars, kind, id=f"{self.id}-wf")

    def on_mount(self) -> None:
        self.call_after_refresh(lambda: self._show(self.table.shown[0] if self.table.shown else None))

    @on(RowTable.Highlighted)
    def _follow(self, event: RowTable.Highlighted) -> None:
        self._show(event.row)

    def _show(self, r: dict[str, Any] | None) -> None:
        if r is None:
            return
        bars, kind = views.waterfall(self.report, r["rank"], r.get("step") if "step" in r else None)
        chart = self.query_one(WaterfallChart)
        chart.show_parts = False
        chart.kind, chart.bars = kind, bars
        what = f"rank {r['rank']}" + (f", {r['name']}" if "step" in r else " (its kept steps)")
        self.query_one(f"#{self.id}-wf-title", Label).update(
            f"{'MFU loss waterfall' if kind == 'mfu' else 'GPU time (MFU unknown)'} of {what}")


class KernelsPane(Vertical):
    def __init__(self, report: dict[str, Any]):
        super().__init__(id="kernels-body")
        self.report = report

    def compose(self) -> ComposeResult:
        classes = views.class_rows(self.report)
        t = Text("time by kernel class: ", style="bold")
        for c in classes:
            t.append("■ ", style=KCLASS_COLOURS.get(c["kclass"], "grey70"))
            t.append(f"{c['kclass']} {fmt_pct(c['share'])}  ")
        yield Static(t, id="kernel-classes")
        yield FilterTable("kernels by name, all ranks", [
            Column("kclass", "class"),
            Column("count", "count", lambda v: f"{v:,}", True),
            Column("total_ns", "total", fmt_ns, True),
            Column("mean_ns", "mean", lambda v: fmt_ns(int(v)), True),
            Column("tflops", "TFLOP/s", fmt_num, True),
            Column("of_peak", "% peak", fmt_pct, True),
            Column("name", "kernel", lambda v: v[:160]),
        ], views.kernel_rows(self.report), id="kernels-table", empty="no GPU kernels")
        yield FilterTable("matmul ops by shape (roofline: memory- or compute-bound at this GPU's ridge point)", [
            Column("rank", "rank", str, True),
            Column("op", "op"),
            Column("shapes", "shapes", lambda v: v[:48]),
            Column("dtype", "dtype"),
            Column("calls", "calls", str, True),
            Column("kernel_ns", "time", fmt_ns, True),
            Column("achieved_tflops", "TFLOP/s", fmt_num, True),
            Column("of_peak", "% peak", fmt_pct, True),
            Column("arithmetic_intensity", "FLOP/B", lambda v: f"{v:,.0f}", True),
            Column("bound", "bound"),
        ], views.matmul_rows(self.report), id="matmuls-table", empty="no matmul shapes recorded (record_shapes=True)")


class CommPane(Vertical):
    def __init__(self, report: dict[str, Any]):
        super().__init__(id="comm-body")
        self.report = report

    def compose(self) -> ComposeResult:
        yield FilterTable("collectives by group and type (time and exposed summed over ranks)", [
            Column("group", "group", str),
            Column("group_desc", "desc", str),
            Column("collective", "collective"),
            Column("count", "count", str, True),
            Column("bytes", "bytes", fmt_bytes, True),
            Column("time_ns", "time", fmt_ns, True),
            Column("exposed_ns", "exposed", fmt_ns, True),
            Column("wait_ns", "wait", fmt_ns, True),
            Column("busbw_gbps_median", "busbw GB/s", fmt_num, True),
        ], views.comm_rows(self.report), id="comm-table", empty="no collectives in these traces")
        yield FilterTable("slowest collectives (enter: show in the timeline)", [
            Column("group", "group", str),
            Column("seq", "seq", str, True),
            Column("collective", "collective"),
            Column("bytes", "bytes", fmt_bytes, True),
            Column("ranks", "ranks", str, True),
            Column("max_ns", "slowest", fmt_ns, True),
            Column("exposed_ns", "exposed", fmt_ns, True),
            Column("wait_ns", "wait", fmt_ns, True),
            Column("busbw_gbps", "busbw GB/s", fmt_num, True),
            Column("slowest_rank", "slowest rank", str, True),
        ], views.slow_collective_rows(self.report), id="slow-table", empty="no collectives in these traces")


class TimelinePane(Vertical):
    def __init__(self, timeline: Any, report: dict[str, Any]):
        super().__init__(id="timeline-body")
        self.timeline = timeline
        self.report = report

    def compose(self) -> ComposeResult:
        if self.timeline is None:
            yield Static("no timeline: this is a saved report; open the traces to see their events", classes="empty")
            return
        legend = Text()
        for k, c in KCLASS_COLOURS.items():
            legend.append("■", style=c)
            legend.append(f"{k} ")
        yield Static(legend, id="legend")
        steps = {r["rank"]: [(s["step"], s["name"], s["start_ns"], s["start_ns"] + s["dur_ns"]) for s in r["steps"]]
                 for r in self.report["ranks"]}
        yield TimelineView(self.timeline, steps, id="timeline")
        yield Static("", id="timeline-status")

    @on(TimelineView.CursorMoved)
    def _status(self, event: TimelineView.CursorMoved) -> None:
        self.query_one("#timeline-status", Static).update(event.info)


class MainView(Vertical):
    """The tabs, one per view."""

    def __init__(self, report: dict[str, Any], timeline: Any):
        super().__init__(id="main")
        self.report, self.timeline = report, timeline

    def compose(self) -> ComposeResult:
        with TabbedContent(id="tabs"):
            for i, (pane_id, title, make) in enumerate(VIEWS):
                with TabPane(f"{i + 1} {title}", id=pane_id):
                    yield make(self.report, self.timeline)


RANK_COLUMNS = [
    Column("rank", "rank", str, True),
    Column("device", "device"),
    Column("steps", "steps", str, True),
    Column("step_ns", "step time", fmt_ns, True),
    Column("mfu", "MFU", fmt_pct2, True),
    Column("idle", "idle", fmt_pct, True),
    Column("exposed_comm", "exp. comm", fmt_pct, True),
    Column("bubble", "bubble", fmt_pct, True),
    Column("straggler", "straggler", lambda v: "STRAGGLER" if v else ""),
]
# The views, in tab order (key i+1 shows view i): (pane id, title, widget factory taking the report
# dict and the timeline).  A new view (critical path, pipeline) is one more entry here.
VIEWS: list[tuple[str, str, Any]] = []


STEP_COLUMNS = [
    Column("rank", "rank", str, True),
    Column("name", "step"),
    Column("dur_ns", "time", fmt_ns, True),
    Column("kernels", "kernels", lambda v: f"{v:,}", True),
    Column("idle", "idle", fmt_pct, True),
    Column("exposed_comm", "exp. comm", fmt_pct, True),
    Column("data", "data wait", fmt_pct, True),
    Column("mfu", "MFU", fmt_pct2, True),
    Column("warmup", "", lambda v: "warm-up" if v else ""),
]


VIEWS += [
    ("overview", "Overview", lambda report, timeline: OverviewPane(report)),
    ("ranks", "Ranks", lambda report, timeline: TableWithWaterfall(report, FilterTable(
        "ranks (enter: the rank's steps)", RANK_COLUMNS, views.rank_rows(report), id="ranks-table"), id="ranks-body")),
    ("steps", "Steps", lambda report, timeline: TableWithWaterfall(report, FilterTable(
        "steps, all ranks (enter: the step's timeline)", STEP_COLUMNS, views.step_rows(report), id="steps-table"), id="steps-body")),
    ("kernels", "Kernels", lambda report, timeline: KernelsPane(report)),
    ("comm", "Communication", lambda report, timeline: CommPane(report)),
    ("suggestions", "Suggestions", lambda report, timeline: SuggestionsPane(report)),
    ("timeline-tab", "Timeline", lambda report, timeline: TimelinePane(timeline, report)),
]


class TracelensApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "tracelens"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("escape", "back", "Back"),
        Binding("p", "toggle_parts", "Bar parts", show=False),
    ] + [Binding(str(i + 1), f"show_tab('{pane_id}')", title, show=False) for i, (pane_id, title, _) in enumerate(VIEWS)]

    def __init__(self, *, paths: list[str], options: Any = None, use_cache: bool = True, jobs: int | None = None,
                 report: dict[str, Any] | None = None, trace: Any = None):
        super().__init__()
        self.paths = paths
        self.options = options
        self.use_cache = use_cache
        self.jobs = jobs
        self.report: dict[str, Any] | None = report
        self._trace = trace
        self.timeline = None
        self.history: list[tuple] = []
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        what = ", ".join(self.paths) if self.paths else "the report"
        yield LoadingPane(what)
        yield Footer()

    def on_mount(self) -> None:
        if self.report is not None:
            if self._trace is not None:
                from tracelens.timeline import Timeline

                self.timeline = Timeline(self._trace.events)
            self._show(self.report)
        else:
            self.load_job()

    # -- loading ----------------------------------------------------------------------------
    @work(thread=True, exclusive=True, exit_on_error=False, group="load", description="load and analyze the traces")
    def load_job(self) -> None:
        try:
            self.post_message(Loaded(*self._load()))
        except Exception as e:  # shown in the app, never as a traceback
            from tracelens.errors import TraceInputError

            if isinstance(e, TraceInputError):
                self.post_message(Failed(f"cannot open {e}"))
            else:
                self.post_message(Failed(f"internal error: {type(e).__name__}: {e}"))

    def _load(self) -> tuple[dict[str, Any], Any]:
        from tracelens.analysis import Options, analyze
        from tracelens.load import load
        from tracelens.timeline import Timeline

        t0 = time.perf_counter()
        nbytes = 0
        files = [0, 0]  # parsed, total
        last = [0.0]

        def progress(done: int, total: int, meta) -> None:
            nonlocal nbytes
            nbytes += meta.uncompressed_bytes or meta.size_bytes or 0
            files[:] = [done, total]

        def bytes_progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] < 0.1 and done < total:
                return  # ten updates a second are plenty
            last[0] = now
            dt = max(now - t0, 1e-6)
            parsed = f"{files[0]}/{files[1]} files parsed · {nbytes / 1e6:,.1f} MB of JSON · " if files[1] else ""
            self.post_message(Progress(f"{parsed}{done / 1e6:,.1f} of {total / 1e6:,.1f} MB on disk read · {done / 1e6 / dt:,.1f} MB/s",
                                       done, total))

        self.post_message(Progress("reading…", None, None))
        trace = load(self.paths, use_cache=self.use_cache, jobs=self.jobs, progress=progress, bytes_progress=bytes_progress)
        self.post_message(Progress(f"analyzing {trace.events.height:,} events…", None, None))
        report = analyze(trace, self.options or Options()).to_dict()
        timeline = Timeline(trace.events)
        return report, timeline

    def on_progress(self, msg: Progress) -> None:
        if not self.query("#loading-status"):
            return
        self.query_one("#loading-status", Label).update(msg.text)
        bar = self.query_one("#loading-bar", ProgressBar)
        if msg.total:
            bar.update(total=msg.total, progress=msg.done)
        else:
            bar.update(total=None)

    def on_loaded(self, msg: Loaded) -> None:
        self.timeline = msg.timeline
        self._show(msg.report)

    def on_failed(self, msg: Failed) -> None:
        self.error = msg.text
        for w in self.query("#loading"):
            w.remove()
        self.mount(Static(Text.assemble(("✗ ", "bold red"), (msg.text, "bold"), "\n\npress q to quit"), id="error"),
                   before=self.query_one(Footer))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and self.error is None:
            self.on_failed(Failed(f"internal error: {event.worker.error}"))

    # -- the views --------------------------------------------------------------------------
    def _show(self, report: dict[str, Any]) -> None:
        self.report = report
        for w in self.query("#loading"):
            w.remove()
        n = len(report["ranks"])
        self.sub_title = f"{n} rank(s) · " + (f"MFU {100 * report['job']['mfu']:.2f}%" if report["job"]["mfu"] is not None else "MFU unknown")
        self.mount(MainView(report, self.timeline), before=self.query_one(Footer))

    def _tabs(self) -> TabbedContent | None:
        q = self.query("#tabs")
        return q.first(TabbedContent) if q else None

    def _state(self) -> tuple:
        tabs = self._tabs()
        tl = self.query("#timeline")
        tls = None
        if tl:
            v = tl.first(TimelineView)
            tls = (v.t0, v.t1, v.sel, v.top, v.cursor, set(v.highlight), v.hl_window)
        steps = self.query_one("#steps-table", FilterTable)
        return (tabs.active if tabs else None, steps.all_rows, steps.title, tls)

    def _restore(self, state: tuple) -> None:
        tab, rows, title, tls = state
        self.query_one("#steps-table", FilterTable).set_rows(rows, title)
        if tls is not None:
            v = self.query_one("#timeline", TimelineView)
            v.t0, v.t1, v.sel, v.top, v.cursor, v.highlight, v.hl_window = tls
            v.refresh()
        self.action_show_tab(tab)

    def action_show_tab(self, tab: str) -> None:
        tabs = self._tabs()
        if tabs is None or tab is None:
            return
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
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_parts(self) -> None:
        for w in self.query(WaterfallChart):
            w.show_parts = not w.show_parts

    def action_back(self) -> None:
        for ft in self.query(FilterTable):
            if ft.close_filter():
                return
        if self.history:
            self._restore(self.history.pop())
        elif self._tabs() is not None and self._tabs().active != "overview":
            self.action_show_tab("overview")

    def _timeline_at(self, start: int | None, end: int | None, rank: int | None, show: set[str] | None = None,
                     hl: tuple[int, int] | None = None) -> None:
        if self.timeline is None or start is None or end is None:
            self.notify("no timeline for this (a saved report, or no GPU events)", severity="warning")
            return
        self.history.append(self._state())
        self.action_show_tab("timeline-tab")
        self.call_after_refresh(lambda: self.query_one("#timeline", TimelineView).show_window(start, end, rank, show, hl))

    @on(RowTable.Chosen)
    def _drill(self, event: RowTable.Chosen) -> None:
        tid, row = event.table.id, event.row
        if tid == "ranks-table":
            self.history.append(self._state())
            self.query_one("#steps-table", FilterTable).set_rows(
                views.step_rows(self.report, row["rank"]), f"steps of rank {row['rank']} (enter: timeline · esc: back)")
            self.action_show_tab("steps")
        elif tid == "steps-table":
            self._timeline_at(row["start_ns"], row["start_ns"] + row["dur_ns"], row["rank"])
        elif tid == "suggestions-table":
            w = row["evidence"].get("where") or {}
            show = set(w.get("show") or ())
            self._timeline_at(w.get("start_ns"), w.get("end_ns"), w.get("rank"), show,
                              (w["start_ns"], w["end_ns"]) if w.get("start_ns") is not None else None)
        elif tid == "slow-table":
            if row["start_ns"] is not None:
                self._timeline_at(row["start_ns"], row["start_ns"] + (row["max_ns"] or 1), row["first_rank"], {"comm"})
        elif tid == "kernels-table":
            ev = self.timeline.longest(row["name"]) if self.timeline is not None else None
            if ev is None:
                self.notify(f"{row['name'][:80]}: {row['count']:,} launches, {fmt_ns(row['total_ns'])} in all")
                return
            # its longest launch, with ten times its length of context on each side
            pad = max(ev["dur_ns"] * 10, 10_000)
            rank = self.timeline.tracks[ev["track"]].rank
            self._timeline_at(ev["ts"] - pad, ev["end"] + pad, rank, {row["kclass"]})
            self.call_after_refresh(lambda: self.query_one("#timeline", TimelineView).select_track(ev["track"]))
