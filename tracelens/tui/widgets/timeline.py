"""The timeline: one line per GPU stream of every rank, drawn with Textual's line API.

Only the visible tracks and time window are computed (``tracelens.analysis.timeline.Timeline.cells``,
one polars query), and the result is cached until the window, the width or the visible tracks
change, so scrolling and zooming cost the size of the screen, not of the trace.
Each cell is a slice of time: its height (▁..█) is how busy the stream was, its colour the
kernel class that took most of it.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tracelens.model.printable import printable
from tracelens.model.units import fmt_ns, fmt_offset
from tracelens.render.tables import KCLASS_COLOURS

if TYPE_CHECKING:  # the index is built by the app's loader: importing this widget imports no polars
    from tracelens.analysis.timeline import Timeline

LABEL_W = 10
HEADER = 2  # the time axis and the step row
_LEVELS = "▁▂▃▄▅▆▇█"
_DIM = Style(color="grey35")
_IDLE_HL = Style(color="#e01b24", dim=True)
_HOST = "#62a0ea"  # an nsys rank's NVTX row (not a kernel class)


class PathOverlay:
    """One step's whole critical path on one rank (``analysis.rank.step_path_segments``): its
    segments tile the step's window, each charged to an event — a GPU activity (its device and
    stream) or a host event (neither) — so at any time the path is in one place, found by bisection."""

    def __init__(self, rank: int | None, starts: list[int], ends: list[int], categories: list[str],
                 devices: list[int | None], streams: list[int | None], names: list[str | None]):
        self.rank = rank
        self.starts, self.ends, self.categories = starts, ends, categories
        self.devices, self.streams, self.names = devices, streams, names

    def __len__(self) -> int:
        return len(self.starts)

    def at(self, t: int) -> int | None:
        """The segment the path is in at time ``t`` (its index), or None outside the path."""
        i = bisect_right(self.starts, t) - 1
        return i if i >= 0 and t < self.ends[i] else None

    def on(self, track: Any, t: int) -> bool:
        """Whether the path runs on ``track`` at time ``t``: its stream's activity (a stream row),
        any GPU activity of its device (the rank's GPU row), a host event (the host row)."""
        i = self.at(t)
        if i is None or track.rank != self.rank:
            return False
        if track.is_host:
            return self.streams[i] is None
        if self.streams[i] is None or self.devices[i] != track.device:
            return False
        return track.is_union or self.streams[i] == track.stream

    def describe(self, t: int) -> str | None:
        i = self.at(t)
        if i is None:
            return None
        where = f"stream {self.streams[i]}" if self.streams[i] is not None else "host"
        name = printable(self.names[i] or "(no event)")  # a name from the trace: no control codes reach the terminal
        return f"path: {self.categories[i]} · {name[:100]} ({where}, {fmt_ns(self.ends[i] - self.starts[i])})"


def _glyph(busy: float) -> str:
    return _LEVELS[min(7, max(0, int(busy * 8 + 0.5) - 1))]


class TimelineView(Widget, can_focus=True):
    """Zoom and pan over the GPU streams of the job."""

    DEFAULT_CSS = "TimelineView { height: 1fr; }"
    BINDINGS = [
        Binding("left", "cursor(-1)", "←", show=False),
        Binding("right", "cursor(1)", "→", show=False),
        Binding("up", "track(-1)", "↑", show=False),
        Binding("down", "track(1)", "↓", show=False),
        Binding("a", "pan(-0.25)", "Pan ←"),
        Binding("d", "pan(0.25)", "Pan →"),
        Binding("w,plus,equals_sign", "zoom(0.5)", "Zoom in"),
        Binding("s,minus", "zoom(2.0)", "Zoom out"),
        Binding("left_square_bracket", "step(-1)", "Prev step"),
        Binding("right_square_bracket", "step(1)", "Next step"),
        Binding("z", "zoom_step", "Zoom to step"),
        Binding("0", "reset", "Whole trace"),
        Binding("g", "gpu_rows", "GPU rows only"),
    ]

    class CursorMoved(Message):
        def __init__(self, info: str):
            super().__init__()
            self.info = info

    t0: reactive[int] = reactive(0)
    t1: reactive[int] = reactive(1)
    cursor: reactive[int] = reactive(0)
    sel: reactive[int] = reactive(0)
    top: reactive[int] = reactive(0)

    def __init__(self, timeline: Timeline, steps: dict[int, list[tuple[Any, str, int, int]]], *, id: str | None = None):
        super().__init__(id=id)
        self.timeline = timeline
        self.steps = steps  # rank -> [(step, name, start_ns, end_ns)]
        self.highlight: set[str] = set()
        self.hl_window: tuple[int, int] | None = None
        # the critical path's events (their spans, ns) on one rank: drawn bold and underlined, the rest of that rank dimmed
        self.path_spans: list[tuple[int, int]] = []
        self.path_rank: int | None = None
        self.path: PathOverlay | None = None  # the whole path of one step (computed on demand), else None
        self._cache_key: tuple | None = None
        self._sized = False
        self.gpu_only = False
        self._gpu_tracks = [t for t in timeline.tracks if t.is_union]
        self._cache: dict[int, dict[int, Any]] = {}
        self.set_reactive(TimelineView.t0, timeline.start)
        self.set_reactive(TimelineView.t1, max(timeline.end, timeline.start + 1))

    # -- geometry ---------------------------------------------------------------------------
    @property
    def tracks(self) -> list:
        """The tracks shown: every stream, or (``g``) one "GPU" row per rank."""
        return self._gpu_tracks if self.gpu_only else self.timeline.tracks

    def action_gpu_rows(self) -> None:
        current = self.tracks[self.sel] if self.tracks else None
        self.gpu_only = not self.gpu_only
        # keep the same rank selected
        idx = next((i for i, t in enumerate(self.tracks) if current is not None and t.rank == current.rank), 0)
        self.sel = idx
        self.top = max(0, min(idx, len(self.tracks) - self.rows))
        self._cache_key = None
        self._moved()

    @property
    def data_width(self) -> int:
        return max(1, self.size.width - LABEL_W)

    @property
    def rows(self) -> int:
        return max(0, self.size.height - HEADER)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return HEADER + len(self.tracks)

    def _visible(self) -> list[int]:
        return [t.id for t in self.tracks[self.top : self.top + self.rows]]

    def cell_time(self, col: int) -> int:
        return self.t0 + int((self.t1 - self.t0) * (col + 0.5) / self.data_width)

    # -- navigation -------------------------------------------------------------------------
    def show_window(self, start: int, end: int, rank: int | None = None, highlight: set[str] | None = None,
                    hl_window: tuple[int, int] | None = None, path_spans: list[tuple[int, int]] | None = None,
                    path: PathOverlay | None = None) -> None:
        """Zoom to [start, end] (with a little margin), select ``rank``'s first track;
        ``path_spans``: the critical path's events on ``rank``, highlighted; ``path``: the step's
        whole path, highlighted on the tracks it runs on (it replaces ``path_spans``)."""
        pad = max(1, (end - start) // 40)
        self.t0, self.t1 = start - pad, end + pad
        self.highlight = set(highlight or ())
        self.hl_window = hl_window
        self.path_spans = sorted(path_spans or ())
        self.path_rank = rank if path_spans or path is not None else None
        self.path = path
        self._cache_key = None
        if rank is not None:  # its GPU row (an nsys rank's NVTX row comes first)
            idx = next((i for i, t in enumerate(self.tracks) if t.rank == rank and not t.is_host), None)
            if idx is not None:
                self.sel = idx
                self.top = max(0, min(idx, len(self.tracks) - self.rows))
        self.cursor = self.data_width // 2
        self._moved()

    def on_path(self, t: int) -> bool:
        """Whether time ``t`` falls in one of the highlighted path events' spans."""
        return any(a <= t < b for a, b in self.path_spans)  # a step's top events: a handful

    def select_track(self, track_id: int) -> None:
        """Select a track (by id) and scroll it into view (showing every stream again if needed)."""
        if self.gpu_only and not any(t.id == track_id for t in self.tracks):
            self.gpu_only = False
        idx = next((i for i, t in enumerate(self.tracks) if t.id == track_id), None)
        if idx is None:
            return
        self.sel = idx
        if not (self.top <= idx < self.top + self.rows):
            self.top = max(0, min(idx, len(self.tracks) - self.rows))
        self._moved()

    def action_cursor(self, delta: int) -> None:
        c = self.cursor + delta
        if c < 0:
            self.action_pan(-0.1)
            c = 0
        elif c >= self.data_width:
            self.action_pan(0.1)
            c = self.data_width - 1
        self.cursor = c
        self._moved()

    def action_track(self, delta: int) -> None:
        n = len(self.tracks)
        if not n:
            return
        self.sel = max(0, min(n - 1, self.sel + delta))
        if self.sel < self.top:
            self.top = self.sel
        elif self.sel >= self.top + self.rows:
            self.top = self.sel - self.rows + 1
        self._moved()

    def action_pan(self, frac: float) -> None:
        span = self.t1 - self.t0
        shift = int(span * frac) or (1 if frac > 0 else -1)
        self.t0, self.t1 = self.t0 + shift, self.t1 + shift
        self._moved()

    def action_zoom(self, factor: float) -> None:
        span = self.t1 - self.t0
        new = max(self.data_width, int(span * factor))  # at most one ns per cell
        full = (self.timeline.end - self.timeline.start) * 2 + 1
        new = min(new, max(full, self.data_width))
        anchor = self.cell_time(self.cursor)
        left = (anchor - self.t0) / span if span else 0.5
        self.t0 = int(anchor - left * new)
        self.t1 = self.t0 + new
        self._moved()

    def action_reset(self) -> None:
        self.t0, self.t1 = self.timeline.start, max(self.timeline.end, self.timeline.start + 1)
        self._moved()

    def _rank_steps(self) -> list[tuple[Any, str, int, int]]:
        if not self.tracks:
            return []
        return self.steps.get(self.tracks[self.sel].rank, [])

    def action_step(self, delta: int) -> None:
        steps = self._rank_steps()
        if not steps:
            return
        mid = (self.t0 + self.t1) // 2
        cur = next((i for i, s in enumerate(steps) if s[2] <= mid < s[3]), None)
        if cur is None:
            cur = sum(1 for s in steps if s[3] <= mid) - (1 if delta > 0 else 0)
        i = max(0, min(len(steps) - 1, cur + delta))
        _, _, a, b = steps[i]
        self.show_window(a, b, highlight=self.highlight, hl_window=self.hl_window)

    def action_zoom_step(self) -> None:
        t = self.cell_time(self.cursor)
        for _, _, a, b in self._rank_steps():
            if a <= t < b:
                self.show_window(a, b, highlight=self.highlight, hl_window=self.hl_window)
                return

    def on_click(self, event) -> None:
        self.focus()
        if event.x >= LABEL_W:
            self.cursor = min(self.data_width - 1, event.x - LABEL_W)
        row = event.y - HEADER
        if 0 <= row < self.rows and self.top + row < len(self.tracks):
            self.sel = self.top + row
        self._moved()

    def on_mouse_scroll_down(self, event) -> None:
        event.stop()
        if event.ctrl:
            self.action_zoom(2.0)
        else:
            self.top = max(0, min(len(self.tracks) - self.rows, self.top + 1))

    def on_mouse_scroll_up(self, event) -> None:
        event.stop()
        if event.ctrl:
            self.action_zoom(0.5)
        else:
            self.top = max(0, self.top - 1)

    def on_resize(self) -> None:
        if not self._sized and self.size.width > LABEL_W:
            # first real size (a hidden tab has none): the cursor starts mid-screen, where zoom anchors
            self._sized = True
            self.cursor = self.data_width // 2
            self._moved()
        else:
            self.cursor = min(self.cursor, self.data_width - 1)

    def status(self) -> str:
        tl = self.timeline
        if not self.tracks:
            return "no GPU events in these traces"
        track = self.tracks[self.sel]
        t = self.cell_time(self.cursor)
        cell = (self.t1 - self.t0) / self.data_width
        where = "host, NVTX ranges" if track.is_host else f"device {track.device}"
        head = (f"{track.label} ({where}) at {fmt_offset(t - tl.start)} · window {fmt_ns(self.t1 - self.t0)}, "
                f"{fmt_ns(int(cell))}/cell")
        if track.is_union:
            busy = tl.busy_ns(track.id, self.t0, self.t1)
            return head + f" · GPU busy {100 * busy / max(1, self.t1 - self.t0):.1f}% of the window" + self._path_note(track, t)
        ev = tl.event_at(track.id, t, slack=int(cell / 2))
        if ev is None:
            return head + (" · no range" if track.is_host else " · idle") + self._path_note(track, t)
        what = "range" if track.is_host else ev["kclass"]
        return head + f" · {what}: {ev['name'][:120]} ({fmt_ns(ev['dur_ns'])})" + self._path_note(track, t)

    def _path_note(self, track: Any, t: int) -> str:
        if self.path is None or track.rank != self.path.rank:
            return ""
        said = self.path.describe(t)
        return f" · {said}" if said else ""

    def _moved(self) -> None:
        self.refresh()
        self.post_message(self.CursorMoved(self.status()))

    # -- drawing ----------------------------------------------------------------------------
    def _cells(self) -> dict[int, dict[int, Any]]:
        vis = self._visible()
        key = (self.t0, self.t1, self.data_width, tuple(vis))
        if key != self._cache_key:
            self._cache = self.timeline.cells(vis, self.t0, self.t1, self.data_width)
            self._cache_key = key
        return self._cache

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return self._axis(width)
        if y == 1:
            return self._step_row(width)
        row = self.top + y - HEADER
        tracks = self.tracks
        if row >= len(tracks):
            return Strip.blank(width)
        track = tracks[row]
        label_style = Style(bold=True, color="#c0bfbc" if track.is_union else _HOST if track.is_host else None)
        if row == self.sel:
            label_style += Style(reverse=True)
        segs = [Segment(f"{track.label:<{LABEL_W - 1}.{LABEL_W - 1}} ", label_style)]
        cells = self._cells().get(track.id, {})
        hl0, hl1 = self.hl_window or (None, None)
        run_text, run_style = [], None
        for col in range(self.data_width):
            c = cells.get(col)
            if c is None:
                ch, style = " ", None
                if track.is_union and "idle" in self.highlight and hl0 is not None and hl0 <= self.cell_time(col) < hl1:
                    ch, style = "·", _IDLE_HL
            else:
                ch = _glyph(c.busy)
                if self.highlight and c.kclass not in self.highlight and c.kclass != "busy":
                    style = _DIM
                else:
                    style = Style(color=_HOST if track.is_host else KCLASS_COLOURS.get(c.kclass, "grey70"))
            if self.path is not None and track.rank == self.path.rank and c is not None:
                style = (style or Style()) + (Style(bold=True, underline=True) if self.path.on(track, self.cell_time(col)) else Style(dim=True))
            elif self.path_spans and track.rank == self.path_rank and c is not None:
                on_path = self.on_path(self.cell_time(col))
                style = (style or Style()) + (Style(bold=True, underline=True) if on_path else Style(dim=True))
            if col == self.cursor:
                style = (style or Style()) + Style(bgcolor="grey30")
            if style is run_style or style == run_style:
                run_text.append(ch)
            else:
                if run_text:
                    segs.append(Segment("".join(run_text), run_style))
                run_text, run_style = [ch], style
        if run_text:
            segs.append(Segment("".join(run_text), run_style))
        return Strip(segs, width).crop(0, width)

    def _axis(self, width: int) -> Strip:
        w = self.data_width
        chars = [" "] * w
        step = 16
        for col in range(0, w, step):
            label = f"|{fmt_offset(self.cell_time(col) - self.timeline.start)}"
            for i, ch in enumerate(label):
                if col + i < w:
                    chars[col + i] = ch
        return Strip([Segment(f"{'time':<{LABEL_W}}", Style(dim=True)), Segment("".join(chars), Style(color="grey62"))], width).crop(0, width)

    def _step_row(self, width: int) -> Strip:
        w = self.data_width
        chars = [" "] * w
        styles: list[Style | None] = [None] * w
        rank = self.tracks[self.sel].rank if self.tracks else None
        span = self.t1 - self.t0
        for i, (_, name, a, b) in enumerate(self._rank_steps()):
            c0 = max(0, int((a - self.t0) * w / span))
            c1 = min(w, int((b - self.t0) * w / span) + 1)
            if c1 <= 0 or c0 >= w:
                continue
            st = Style(bgcolor="grey23" if i % 2 == 0 else "grey15", color="white")
            label = name.replace("ProfilerStep", "step")[: max(0, c1 - c0)]
            for col in range(c0, c1):
                styles[col] = st
                j = col - c0
                chars[col] = label[j] if j < len(label) else " "
        segs = [Segment(f"{'steps r' + str(rank) if rank is not None else 'steps':<{LABEL_W}}", Style(dim=True))]
        for ch, st in zip(chars, styles):
            segs.append(Segment(ch, st))
        return Strip(segs, width).simplify().crop(0, width)
