"""The views of the terminal UI, one pane each, and their registry (``VIEWS``): the tab
order, the number keys and what each pane is built from (the report dict and the timeline).
A new view (critical path, pipeline) is a pane here and one entry in ``VIEWS``."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import AwaitMount
from textual.widgets import Label, Static, TabbedContent, TabPane

from tracelens.model.units import fmt_bytes, fmt_ns, fmt_num, fmt_pct, fmt_pct2
from tracelens.render import tables as views
from tracelens.render.tables import KCLASS_COLOURS, PIPELINE_COLOURS, PIPELINE_PHASES, path_colour
from tracelens.tui.widgets.rank_strip import RankStrip
from tracelens.tui.widgets.table import Column, FilterTable, RowTable
from tracelens.tui.widgets.timeline import TimelineView
from tracelens.tui.widgets.waterfall import WaterfallChart


def _peak_flag(v: Any) -> Text:
    """The flag of a row above 100% of its dtype's peak (its % is then shown as unknown)."""
    return Text("⚠ >100%", style="bold #f6d32d") if v else Text("")


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
        yield Label(Text(views.waterfall_title(kind, ", all ranks")), classes="section")
        yield WaterfallChart(bars, kind, id="waterfall")
        label, series = views.per_rank_series(r)
        yield Label(f"{label}, one bar per rank from zero (stragglers red, >5% worse than the median orange)", classes="section")
        if len(series) > 1:
            ranks = [row["rank"] for row in views.rank_rows(r)]
            yield RankStrip(ranks, series, {s["rank"] for s in r["job"]["stragglers"] or []}, higher_is_worse="MFU" not in label,
                            id="rank-strip")
        yield Static(self._ranks_line(), id="rank-summary")
        yield Label("top suggestions (press 6 for all of them, with their evidence)", classes="section")
        yield Static(self._suggestions(), id="top-suggestions")

    def _headline(self, h: dict[str, Any]) -> Text:
        t = Text()
        if h["mfu"] is not None:
            t.append(f"MFU {100 * h['mfu']:.2f}%", style="bold #33d17a")
            t.append(f"  {views.mfu_text(h)}")
            if h["hfu"] is not None:
                t.append(f", HFU {100 * h['hfu']:.2f}%")
            if h["mfu_note"]:
                t.append(f"\n⚠ MFU is {h['mfu_note']}", style="#f6d32d")
        else:
            t.append("MFU unknown", style="bold #f6d32d")
            t.append(f"  {h['why_unknown'].removeprefix('MFU unknown: ')}")
            if h["hint"]:
                t.append(f"\n{h['hint']}", style="bold")
        t.append(f"\n{h['ranks']} rank(s) · {h['device'] or 'unknown GPU'}")
        if h["warnings"]:
            t.append(f" · {h['warnings']} warning(s): press {WARNINGS_KEY} to read them", style="#f6d32d")
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
        elif views.straggler_verdict(self.report):
            t.append(f"\nstraggler ranks: {views.straggler_verdict(self.report)[1]}", style="dim")
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
                items = views.worst_ranks(per)[:8]
                t.append("  ranks: " + ", ".join(f"r{k} {val(v)}" for k, v in items) + (" …" if len(per) > 8 else "") + "\n")
        else:
            t.append(f"  {ev.get('detail', '')}\n")
        w = ev.get("where")
        if w and w.get("start_ns") is not None:
            t.append(f"  most visible in rank {w['rank']}, {w.get('step_name') or 'the trace'}"
                     + (f" ({views.evidence_value(ev)(w['value'])} {'of' if ev.get('unit', 'share') == 'share' else 'in'} that step)"
                        if w.get("value") is not None else "") + " — enter shows it\n")
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
        self.query_one(f"#{self.id}-wf-title", Label).update(Text(views.waterfall_title(kind, f" of {what}")))


class KernelsPane(Vertical):
    def __init__(self, report: dict[str, Any]):
        super().__init__(id="kernels-body")
        self.report = report

    def compose(self) -> ComposeResult:
        rows = views.kernel_rows(self.report)
        classes = views.class_rows(self.report, rows)
        t = Text("time by kernel class: ", style="bold")
        for c in classes:
            t.append("■ ", style=KCLASS_COLOURS.get(c["kclass"], "grey70"))
            t.append(f"{c['kclass']} {fmt_pct(c['share'])}  ")
        yield Static(t, id="kernel-classes")
        yield FilterTable(views.kernel_table_title(self.report, rows) + " (% of the peak of the dtype their ops ran at)", [
            Column("kclass", "class"),
            Column("count", "count", lambda v: f"{v:,}", True),
            Column("total_ns", "total", fmt_ns, True),
            Column("mean_ns", "mean", lambda v: fmt_ns(int(v)), True),
            Column("tflops", "TFLOP/s", fmt_num, True),
            Column("of_peak", "% peak", fmt_pct, True),
            Column("above_peak", "", _peak_flag),
            Column("dtype", "dtype"),
            Column("name", "kernel", lambda v: v[:160]),
        ], rows, id="kernels-table", empty="no GPU kernels")
        yield FilterTable(views.matmul_table_title(self.report) + " (% of the peak of the dtype each ran at; memory- or compute-bound "
                          "at that dtype's ridge point)", [
            Column("rank", "rank", str, True),
            Column("op", "op"),
            Column("shapes", "shapes", lambda v: v[:48]),
            Column("dtype", "dtype"),
            Column("calls", "calls", str, True),
            Column("kernel_ns", "time", fmt_ns, True),
            Column("achieved_tflops", "TFLOP/s", fmt_num, True),
            Column("of_peak", "% peak", fmt_pct, True),
            Column("above_peak", "", _peak_flag),
            Column("arithmetic_intensity", "FLOP/B", lambda v: f"{v:,.0f}", True),
            Column("bound", "bound"),
        ], views.matmul_rows(self.report), id="matmuls-table", empty=_no_shapes(self.report))


def _no_shapes(report: dict[str, Any]) -> str:
    """Why the matmul table is empty: Kineto records shapes with record_shapes=True; nsys never does."""
    if report.get("inputs") and all(i.get("format") == "nsys" for i in report["inputs"]):
        return "no matmul shapes: an nsys export records no op shapes (record the job with the PyTorch profiler for them)"
    return "no matmul shapes recorded (record_shapes=True)"


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
        for note in views.comm_notes(self.report):
            yield Label(note, classes="comm-note", markup=False)


TIMELINE_LOADING = "loading"  # the timeline a pane is built with while the job's events are still being read


class TimelinePane(Vertical):
    def __init__(self, timeline: Any, report: dict[str, Any]):
        super().__init__(id="timeline-body")
        self.timeline = timeline
        self.report = report

    def compose(self) -> ComposeResult:
        if self.timeline is TIMELINE_LOADING:
            yield Static("reading the events for the timeline…", classes="empty")
            return
        if self.timeline is None:
            yield Static("no timeline: this is a saved report; open the traces to see their events", classes="empty")
            return
        legend = Text()
        for k, c in KCLASS_COLOURS.items():
            legend.append("■", style=c)
            legend.append(f"{k} ")
        if any(t.is_host for t in self.timeline.tracks):  # nsys ranks' host rows
            from tracelens.tui.widgets.timeline import _HOST

            legend.append("■", style=_HOST)
            legend.append("NVTX ranges (host) ")
        yield Static(legend, id="legend")
        steps = {r["rank"]: [(s["step"], s["name"], s["start_ns"], s["start_ns"] + s["dur_ns"]) for s in r["steps"]]
                 for r in self.report["ranks"]}
        yield TimelineView(self.timeline, steps, id="timeline")
        yield Static("", id="timeline-status")

    @on(TimelineView.CursorMoved)
    def _status(self, event: TimelineView.CursorMoved) -> None:
        self.query_one("#timeline-status", Static).update(Text(views.printable(event.info)))  # names from the trace: no markup


def path_bar(by_category: dict[str, int], width: int = 60) -> Text:
    """A stacked bar of the path's time by category, and its legend with the shares."""
    total = sum(by_category.values()) or 1
    t, used = Text(), 0
    items = list(by_category.items())
    for i, (c, ns) in enumerate(items):
        n = width - used if i == len(items) - 1 else round(width * ns / total)
        t.append("█" * max(n, 0), style=path_colour(c))
        used += max(n, 0)
    t.append("\n")
    for c, ns in items:
        t.append("■ ", style=path_colour(c))
        t.append(f"{c} {fmt_pct(ns / total)} ({fmt_ns(ns)})  ")
    return t


def critical_step_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank and step of the report's critical path."""
    rows = []
    for r in report["ranks"]:
        cp = r.get("critical_path")
        if not cp:
            continue
        for s, st in zip(cp.get("steps") or [], r["steps"]):
            by = s["by_category_ns"]
            total = sum(by.values()) or 1
            top = sorted(by.items(), key=lambda kv: -kv[1])[:3]
            rows.append({"rank": r["rank"], "file": r.get("file"), "step": st["name"], "length_ns": s["length_ns"],
                         "categories": " · ".join(f"{c} {fmt_pct(ns / total)}" for c, ns in top),
                         "warmup": st.get("warmup", False), "start_ns": st["start_ns"], "dur_ns": st["dur_ns"],
                         "by_category_ns": by, "top_events": s["top_events"],
                         # enter: the step in the timeline, its whole path traced then (or these top events)
                         "step_start_ns": st["start_ns"], "step_end_ns": st["start_ns"] + st["dur_ns"],
                         "path_spans": _top_spans(s["top_events"])})
    return rows


def critical_event_rows(step: dict[str, Any]) -> list[dict[str, Any]]:
    """The top events of one step's path (a row of critical_step_rows), with their share of it."""
    total = step["length_ns"] or 1
    return [{"rank": step["rank"], "file": step.get("file"), "step": step["step"], "category": e["category"], "ns": e["ns"],
             "share": e["ns"] / total, "name": e["name"] or "", "kind": e["kind"] or "", "ts_ns": e["ts_ns"],
             "step_start_ns": step["start_ns"], "step_end_ns": step["start_ns"] + step["dur_ns"], "path_spans": _top_spans(step["top_events"])}
            for e in step["top_events"]]


def _top_spans(top_events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(x["ts_ns"], x["ts_ns"] + x["ns"]) for x in top_events if x["ts_ns"] is not None]


NO_CRITICAL_PATH = ("no critical path in this report: press C to compute each step's chain of waits here (or run "
                    "`tracelens open --critical-path PATH`, `tracelens report --critical-path`)")


class CriticalPathPane(Vertical):
    """Per rank and step the critical path's time by category (a bar) and its top events; enter
    on an event shows it in the timeline, the path's top events highlighted."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(id="critical-body")
        self.report = report
        self.steps = critical_step_rows(report)

    def compose(self) -> ComposeResult:
        if not self.steps:
            yield Static(NO_CRITICAL_PATH, id="critical-none", classes="empty", markup=False)
            return
        first = self.steps[0]
        yield Label(f"rank {first['rank']}, {first['step']}: the path's {fmt_ns(first['length_ns'])} by category",
                    id="critical-title", markup=False)
        yield Static(path_bar(first["by_category_ns"]), id="critical-bar")
        yield FilterTable("critical path per rank and step (the highlighted step's events below; enter: the step in the timeline, "
                          "its whole path highlighted)", [
            Column("rank", "rank", str, True),
            Column("step", "step"),
            Column("length_ns", "path", fmt_ns, True),
            Column("categories", "by category"),
            Column("warmup", "", lambda v: "warm-up" if v else ""),
        ], self.steps, id="critical-steps-table")
        yield FilterTable("top events on the path (enter: the timeline there, the path's events highlighted)", [
            Column("category", "category"),
            Column("ns", "on path", fmt_ns, True),
            Column("share", "share", fmt_pct, True),
            Column("kind", "kind"),
            Column("name", "event", lambda v: views.printable(v)[:160]),
        ], critical_event_rows(first), id="critical-events-table", empty="no events on this step's path")
        wis = views.what_if_rows(self.report)
        if wis:  # each suggestion's change replayed on the graph, next to its upper bound
            t = FilterTable("what-if: each suggestion's change replayed on the graph (predicted speed-up next to the upper bound)", [
                Column("title", "suggestion", lambda v: views.printable(v)[:80]),
                Column("change", "change", lambda v: views.printable(v)[:60]),
                Column("upper", "up to", views.fmt_speedup, True),
                Column("predicted_speedup", "replayed", views.fmt_speedup, True),
                Column("predicted_step_ns", "predicted step", fmt_ns, True),
                Column("predicted_mfu", "predicted MFU", lambda v: "-" if v is None else fmt_pct(v), True),
                Column("note", "note"),
            ], wis, id="critical-whatif-table")
            t.styles.height = min(len(wis), 6) + 3  # its rows, the title and the header: the tables above keep the rest
            yield t

    @on(RowTable.Highlighted)
    def _show_step(self, event: RowTable.Highlighted) -> None:
        if event.table.id != "critical-steps-table" or event.row is None or not self.query("#critical-bar"):
            return
        s = event.row
        self.query_one("#critical-title", Label).update(Text(f"rank {s['rank']}, {views.printable(str(s['step']))}: "
                                                             f"the path's {fmt_ns(s['length_ns'])} by category"))
        self.query_one("#critical-bar", Static).update(path_bar(s["by_category_ns"]))
        self.query_one("#critical-events-table", FilterTable).set_rows(critical_event_rows(s))


NO_PIPELINE = "no pipeline parallelism detected (no P2P send/recv records or schedule action ranges with micro-batch blocks)"


def pipeline_picture(lanes: list[dict[str, Any]], width: int = 96) -> Text:
    """Stages x time of one step per lane: F and B blocks coloured, bubbles marked (░); each lane
    over its own window (the slowest kept step's), one width for all."""
    t = Text()
    span = max((ln["window_ns"] for ln in lanes), default=0)
    if span <= 0:
        return t
    for ln in lanes:
        cells = [(" ", "")] * width
        scale = width / span
        for x in ln["bubbles"]:
            for c in range(int(x["s"] * scale), max(int(x["s"] * scale) + 1, int(x["e"] * scale))):
                if c < width:
                    cells[c] = ("░", PIPELINE_COLOURS["bubble"])
        for b in ln["blocks"]:
            ch = b["label"] if b.get("mb") is None else str(b["mb"] % 10)
            for c in range(int(b["s"] * scale), max(int(b["s"] * scale) + 1, int(b["e"] * scale))):
                if c < width:
                    cells[c] = (ch, f"bold white on {PIPELINE_COLOURS.get(b['label'], '#77767b')}")
        stage = ln["stage"] if ln["stage"] is not None else "?"
        t.append(f"stage {stage:>2} rank {ln['rank']!s:>3} ", style="bold")
        for ch, st in cells:
            t.append(ch, style=st)
        t.append(f" {fmt_ns(ln['window_ns'])}, bubble {fmt_pct(ln['bubble_ns'] / ln['window_ns'] if ln['window_ns'] else None)}\n")
    t.append("■", style=PIPELINE_COLOURS["F"])
    t.append(" forward  ")
    t.append("■", style=PIPELINE_COLOURS["B"])
    t.append(" backward  ")
    t.append("░", style=PIPELINE_COLOURS["bubble"])
    t.append(" bubble   (digits: the micro-batch, where the trace names it)")
    return t


def pipeline_bubble_rows(lanes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bubbles of the picture, longest first, each with its place on the rank's clock (for the timeline)."""
    rows = []
    for ln in lanes:
        for x in ln["bubbles"]:
            start = (ln["start_ns"] or 0) + x["s"]
            rows.append({"rank": ln["rank"], "stage": ln["stage"], "step": ln["step"], "phase": PIPELINE_PHASES[x["kind"]],
                         "ns": x["e"] - x["s"], "at_ns": x["s"], "start_ns": start, "end_ns": (ln["start_ns"] or 0) + x["e"],
                         "step_start_ns": ln["start_ns"], "step_end_ns": (ln["start_ns"] or 0) + ln["window_ns"]})
    return sorted(rows, key=lambda r: (-r["ns"], r["rank"] or 0, r["at_ns"]))


class PipelinePane(Vertical):
    """The pipeline: what was detected (schedule, p, m, v, bubble vs theory, the gap's parts), the
    stages x time picture of one step, and its bubbles (enter: the timeline at the bubble)."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(id="pipeline-body")
        self.report = report
        self.lanes = views.pipeline_lanes(report)

    def compose(self) -> ComposeResult:
        lines = views.pipeline_summary_lines(self.report)
        if not self.lanes:
            pipe = (self.report.get("job") or {}).get("pipeline")
            why = "\n".join(views.printable(e) for e in (pipe or {}).get("evidence") or [])
            yield Static(Text(NO_PIPELINE + (f"\n\n{why}" if why else "")), id="pipeline-none", classes="empty")
            return
        yield Static(Text("\n".join(views.printable(x) for x in lines[:2])), id="pipeline-summary")
        yield Label(f"stages x time, one step each (the slowest kept; {fmt_ns(max(ln['window_ns'] for ln in self.lanes))} wide)",
                    classes="section")
        yield Static(pipeline_picture(self.lanes), id="pipeline-picture")
        yield FilterTable("bubbles, longest first (enter: the timeline at the bubble)", [
            Column("rank", "rank", str, True),
            Column("stage", "stage", lambda v: "?" if v is None else str(v), True),
            Column("step", "step", lambda v: "" if v is None else str(v)),
            Column("phase", "phase"),
            Column("ns", "bubble", fmt_ns, True),
            Column("at_ns", "at", fmt_ns, True),
        ], pipeline_bubble_rows(self.lanes), id="pipeline-bubbles-table", empty="no bubbles in the step shown")


class WarningsPane(Horizontal):
    """Every warning of the report, one row each (filterable), the highlighted one in full."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(id="warnings-body")
        self.report = report
        self.rows = views.warning_rows(report)

    def compose(self) -> ComposeResult:
        yield FilterTable("warnings: what is unknown, left out or flagged (the highlighted one in full on the right)", [
            Column("n", "#", str, True),
            Column("file", "file", lambda v: v[-40:]),
            Column("warning", "warning"),
        ], self.rows, id="warnings-table", empty="no warnings")
        yield Static(self._detail(self.rows[0] if self.rows else None), id="warning-detail")

    def _detail(self, w: dict[str, Any] | None) -> Text:
        if w is None:
            return Text("no warnings", style="dim")
        t = Text()
        t.append(f"warning {w['n']} of {len(self.rows)}\n\n", style="bold")
        if w["file"]:
            t.append("file: ", style="bold")
            t.append(f"{w['file']}\n\n")
        t.append(w["warning"])
        return t

    @on(RowTable.Highlighted)
    def _show_detail(self, event: RowTable.Highlighted) -> None:
        if event.row is not None and self.query("#warning-detail"):
            self.query_one("#warning-detail", Static).update(self._detail(event.row))


class MainView(Vertical):
    """The tabs, one per view.  Only the active view is built at first (the first screen waits
    for nothing else); each other view is built the first time it is shown, and every look
    into a view's widgets goes through ``ensure`` (which builds it when it is not there yet)."""

    def __init__(self, report: dict[str, Any], timeline: Any):
        super().__init__(id="main")
        self.report, self.timeline = report, timeline
        self.views = views_for(report)
        self._mounts: dict[str, Any] = {}  # pane id -> the AwaitMount of its content (awaitable again once done)
        self.parts_flipped = False  # "p" pressed an odd number of times: a view built later starts flipped too

    def compose(self) -> ComposeResult:
        with TabbedContent(id="tabs"):
            for i, (pane_id, title, make) in enumerate(self.views):
                with TabPane(tab_label(pane_id, title), id=pane_id):
                    if i == 0:  # the view shown first: composed with the tabs, drawn in the same screen
                        first = make(self.report, self.timeline)
                        self._mounts[pane_id] = AwaitMount(self, [first])
                        yield first

    def built(self, pane_id: str) -> bool:
        return pane_id in self._mounts

    def ensure(self, pane_id: str) -> Any:
        """Builds the view ``pane_id`` unless it is built; an awaitable that is done once its
        widgets are mounted."""
        if pane_id not in self._mounts:
            make = next(m for pid, _, m in self.views if pid == pane_id)
            tab = self.query_one(f"#{pane_id}", TabPane)
            self._mounts[pane_id] = tab.mount(make(self.report, self.timeline))
            if self.parts_flipped:  # after the view's own first drawing of its charts (queued when it mounts)
                self.call_after_refresh(lambda: [setattr(w, "show_parts", not w.show_parts) for w in tab.query(WaterfallChart)])
        return self._mounts[pane_id]

    @on(TabbedContent.TabActivated)
    def _build_shown(self, event: TabbedContent.TabActivated) -> None:
        if event.pane is not None and event.pane.id:
            self.ensure(event.pane.id)

    async def set_timeline(self, timeline: Any) -> None:
        """The events are read: the timeline view, when it is built, is built again with them."""
        self.timeline = timeline
        if self.built("timeline-tab"):
            await self.ensure("timeline-tab")
            tab = self.query_one("#timeline-tab", TabPane)
            await tab.query(TimelinePane).remove()
            self._mounts["timeline-tab"] = tab.mount(TimelinePane(timeline, self.report))
            await self._mounts["timeline-tab"]


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
SOURCE_COLUMN = Column("source", "source", lambda v: v or "?")


def rank_columns(report: dict) -> list[Column]:
    """The ranks table's columns: with each rank's source (kineto, nsys) when the job has nsys exports."""
    return RANK_COLUMNS[:1] + [SOURCE_COLUMN] + RANK_COLUMNS[1:] if views.shows_sources(report) else RANK_COLUMNS


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
STEPS_TITLE = "steps, all ranks (enter: the step's timeline)"


VIEWS += [
    ("overview", "Overview", lambda report, timeline: OverviewPane(report)),
    ("ranks", "Ranks", lambda report, timeline: TableWithWaterfall(report, FilterTable(
        "ranks (enter: the rank's steps)", rank_columns(report), views.rank_rows(report), id="ranks-table"), id="ranks-body")),
    ("steps", "Steps", lambda report, timeline: TableWithWaterfall(report, FilterTable(
        STEPS_TITLE, STEP_COLUMNS, views.step_rows(report), id="steps-table"), id="steps-body")),
    ("kernels", "Kernels", lambda report, timeline: KernelsPane(report)),
    ("comm", "Communication", lambda report, timeline: CommPane(report)),
    ("suggestions", "Suggestions", lambda report, timeline: SuggestionsPane(report)),
    ("timeline-tab", "Timeline", lambda report, timeline: TimelinePane(timeline, report)),
    ("warnings", "Warnings", lambda report, timeline: WarningsPane(report)),
    ("critical", "Critical path", lambda report, timeline: CriticalPathPane(report)),
    ("pipeline", "Pipeline", lambda report, timeline: PipelinePane(report)),
]
NCCL_VIEW = ("nccl", "NCCL", lambda report, timeline: _nccl_pane(report))


def _nccl_pane(report: dict[str, Any]) -> Any:
    from tracelens.tui.nccl import NcclPane

    return NcclPane(report)


def views_for(report: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """The report's views in tab order: NCCL records alone, the NCCL view and the warnings; a
    profiled job's report with an NCCL diagnosis, every view and then the NCCL one."""
    from tracelens.render import nccl as nv

    if nv.nccl_only(report):
        return [NCCL_VIEW] + [v for v in VIEWS if v[0] == "warnings"]
    return VIEWS + [NCCL_VIEW] if nv.diagnosis(report) else VIEWS


def tab_label(pane_id: str, title: str) -> str:
    """The tab's label: the key that opens the view, then its title."""
    if pane_id == "nccl":
        return f"n {title}"
    return f"{(1 + next(i for i, v in enumerate(VIEWS) if v[0] == pane_id)) % 10} {title}"  # the tenth view's key is 0


WARNINGS_KEY = str(1 + next(i for i, (pane_id, _, _) in enumerate(VIEWS) if pane_id == "warnings"))
