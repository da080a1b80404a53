"""A sortable, filterable table over a list of row dicts, drawn with Textual's line API.

Only the visible rows are formatted and drawn, so a table of a hundred thousand steps fills,
sorts and scrolls at once (Textual's DataTable builds every row: 3 s for 50k rows).  The rows
keep their raw values (numbers sort as numbers); columns say how to show them.  ``/`` opens the
filter (a case-insensitive substring over the shown cells), ``s`` sorts by the column under the
cursor (again: reversed; a click on a header does the same), ``enter`` (or a click on the
highlighted row) posts ``Chosen`` with the row's dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Label


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    fmt: Callable[[Any], str | Text] = str
    numeric: bool = False  # right-aligned, sorts largest first


_HEADER = Style(bold=True, bgcolor="grey23")
_HEADER_CURSOR = Style(bold=True, bgcolor="grey35", underline=True)
_CURSOR = Style(bgcolor="#0178d4", color="white", bold=True)
_ZEBRA = Style(bgcolor="grey11")
_MAX_WIDTH = 160


class RowTable(ScrollView, can_focus=True):
    """The table body: a header line and the rows of ``FilterTable.shown``, cursor by row."""

    DEFAULT_CSS = "RowTable { height: 1fr; }"
    BINDINGS = [
        Binding("enter", "choose", "Open", show=True),
        Binding("s", "sort_column", "Sort", show=True),
        Binding("slash", "filter", "Filter", show=True),
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("left", "column(-1)", "Column left", show=False),
        Binding("right", "column(1)", "Column right", show=False),
    ]

    class Chosen(Message):
        def __init__(self, table: FilterTable, row: dict[str, Any]):
            super().__init__()
            self.table = table
            self.row = row

    class Highlighted(Message):
        def __init__(self, table: FilterTable, row: dict[str, Any] | None):
            super().__init__()
            self.table = table
            self.row = row

    cursor_row: reactive[int] = reactive(0)
    cursor_column: reactive[int] = reactive(0)

    def __init__(self, columns: list[Column]):
        super().__init__()
        self.columns = columns
        self.rows: list[dict[str, Any]] = []
        self.widths: list[int] = [len(c.label) for c in columns]
        self._cells: dict[int, list[Text]] = {}  # formatted rows, by index in ``rows``

    # -- data -------------------------------------------------------------------------------
    def cell(self, c: Column, v: Any) -> Text:
        out = c.fmt(v) if v is not None else "-"
        t = out if isinstance(out, Text) else Text(str(out))
        return t

    def formatted(self, i: int) -> list[Text]:
        got = self._cells.get(i)
        if got is None:
            got = self._cells[i] = [self.cell(c, self.rows[i].get(c.key)) for c in self.columns]
        return got

    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self._cells = {}
        # widths from the header and the first rows (formatting every row would cost what we save)
        widths = [len(c.label) for c in self.columns]
        for i in range(min(len(rows), 500)):
            for j, t in enumerate(self.formatted(i)):
                widths[j] = max(widths[j], min(_MAX_WIDTH, t.cell_len))
        self.widths = widths
        self.virtual_size = Size(sum(w + 2 for w in widths), len(rows) + 1)
        self.cursor_row = min(self.cursor_row, max(0, len(rows) - 1))
        self.refresh()
        self._highlighted()

    # -- navigation -------------------------------------------------------------------------
    @property
    def page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def move_cursor(self, row: int | None = None, column: int | None = None) -> None:
        if row is not None and self.rows:
            self.cursor_row = max(0, min(len(self.rows) - 1, row))
            self._scroll_to_cursor()
            self._highlighted()
        if column is not None and self.columns:
            self.cursor_column = max(0, min(len(self.columns) - 1, column))
        self.refresh()

    def _scroll_to_cursor(self) -> None:
        top = round(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + self.page:
            self.scroll_to(y=self.cursor_row - self.page + 1, animate=False)

    def _highlighted(self) -> None:
        row = self.rows[self.cursor_row] if 0 <= self.cursor_row < len(self.rows) else None
        self.post_message(self.Highlighted(self.parent_table, row))

    def action_move(self, delta: int) -> None:
        self.move_cursor(row=self.cursor_row + delta)

    def action_page(self, delta: int) -> None:
        self.move_cursor(row=self.cursor_row + delta * self.page)

    def action_jump(self, where: int) -> None:
        self.move_cursor(row=0 if where == 0 else len(self.rows) - 1)

    def action_column(self, delta: int) -> None:
        self.move_cursor(column=self.cursor_column + delta)
        # keep the cursor's column in view
        left = sum(w + 2 for w in self.widths[: self.cursor_column])
        right = left + self.widths[self.cursor_column] + 2
        width = self.scrollable_content_region.width
        if left < self.scroll_x:
            self.scroll_to(x=left, animate=False)
        elif right > self.scroll_x + width:
            self.scroll_to(x=right - width, animate=False)

    def action_choose(self) -> None:
        self.parent_table.choose()

    def action_sort_column(self) -> None:
        self.parent_table.sort_by_cursor()

    def action_filter(self) -> None:
        self.parent_table.open_filter()

    @property
    def parent_table(self) -> FilterTable:
        return self.query_ancestor(FilterTable)

    def _column_at(self, x: int) -> int | None:
        pos = 0
        for j, w in enumerate(self.widths):
            if pos <= x < pos + w + 2:
                return j
            pos += w + 2
        return None

    def on_click(self, event) -> None:
        self.focus()
        x = event.x + round(self.scroll_x)
        col = self._column_at(x)
        if event.y == 0:  # the header: sort by that column
            if col is not None:
                self.move_cursor(column=col)
                self.parent_table.sort_by(self.columns[col].key)
            return
        row = round(self.scroll_y) + event.y - 1
        if not (0 <= row < len(self.rows)):
            return
        if row == self.cursor_row:
            self.parent_table.choose()  # a click on the highlighted row opens it
        else:
            self.move_cursor(row=row, column=col)

    # -- drawing ----------------------------------------------------------------------------
    def _line(self, cells: list[Text], base: Style | None, cursor_col: int | None = None) -> list[Segment]:
        segs = []
        for j, (c, t, w) in enumerate(zip(self.columns, cells, self.widths)):
            t = t.copy()
            t.truncate(w, overflow="ellipsis")
            pad = w - t.cell_len
            t = Text(" " * pad) + t if c.numeric else t + Text(" " * pad)
            style = base
            if cursor_col is not None and j == cursor_col:
                style = _HEADER_CURSOR
            segs.append(Segment(" ", base))
            for seg in t.render(self.app.console):
                segs.append(Segment(seg.text, (style + seg.style) if (style and seg.style) else (seg.style or style)))
            segs.append(Segment(" ", base))
        return segs

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        sx = round(self.scroll_x)
        if y == 0:
            header = [Text(c.label, style="bold") for c in self.columns]
            segs = self._line(header, _HEADER, self.cursor_column if self.has_focus else None)
            return Strip(segs).crop(sx, sx + width).extend_cell_length(width, _HEADER)
        i = round(self.scroll_y) + y - 1
        if not (0 <= i < len(self.rows)):
            return Strip.blank(width)
        base = _CURSOR if i == self.cursor_row else (_ZEBRA if i % 2 else None)
        segs = self._line(self.formatted(i), base)
        strip = Strip(segs).crop(sx, sx + width)
        return strip.extend_cell_length(width, base) if base else strip

    def watch_cursor_row(self, old: int, new: int) -> None:
        self.refresh(Region(0, 0, self.size.width, self.size.height))


class FilterTable(Vertical):
    """A titled RowTable with a filter box that shows when asked for."""

    DEFAULT_CSS = """
    FilterTable { height: 1fr; }
    FilterTable > .title { padding: 0 1; text-style: bold; }
    FilterTable > Input { display: none; height: 3; }
    FilterTable.filtering > Input { display: block; }
    FilterTable > RowTable { height: 1fr; }
    """

    def __init__(self, title: str, columns: list[Column], rows: list[dict[str, Any]], *, id: str | None = None,
                 empty: str = "nothing to show"):
        super().__init__(id=id)
        self.title = title
        self.columns = columns
        self.all_rows = rows
        self.shown: list[dict[str, Any]] = rows
        self.sort_key: str | None = None
        self.sort_reverse = False
        self.filter_text = ""
        self.empty = empty
        self._text: list[str] | None = None  # every row's shown cells as one lower-case string, for the filter

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="title")
        yield Input(placeholder="filter rows (esc: clear)")
        yield RowTable(self.columns)

    def on_mount(self) -> None:
        self.refill()

    @property
    def table(self) -> RowTable:
        return self.query_one(RowTable)

    def set_rows(self, rows: list[dict[str, Any]], title: str | None = None) -> None:
        self.all_rows = rows
        self._text = None
        if title is not None:
            self.title = title
        self.table.cursor_row = 0
        self.refill()

    def _haystack(self) -> list[str]:
        if self._text is None:
            t = self.table
            self._text = ["\t".join(str(t.cell(c, r.get(c.key))) for c in self.columns).lower() for r in self.all_rows]
        return self._text

    def refill(self) -> None:
        rows = self.all_rows
        if self.filter_text:
            needle = self.filter_text.lower()
            rows = [r for r, text in zip(self.all_rows, self._haystack()) if needle in text]
        if self.sort_key is not None:
            k = self.sort_key
            present = [r for r in rows if r.get(k) is not None]
            missing = [r for r in rows if r.get(k) is None]
            present.sort(key=lambda r: r[k], reverse=self.sort_reverse)
            rows = present + missing
        self.shown = rows
        self.table.set_rows(rows)
        n, total = len(rows), len(self.all_rows)
        label = self.title + (f"  ({n} of {total} rows match '{self.filter_text}')" if self.filter_text else f"  ({total})")
        if not total:
            label = f"{self.title}  — {self.empty}"
        self.query_one(".title", Label).update(Text(label))  # a filter typed with "[" is text, not markup

    def sort_by_cursor(self) -> None:
        if self.columns:
            self.sort_by(self.columns[max(0, min(self.table.cursor_column, len(self.columns) - 1))].key)

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = (not self.sort_reverse) if self.sort_key == key else any(c.key == key and c.numeric for c in self.columns)
        self.sort_key, self.sort_reverse = key, reverse
        self.refill()

    def open_filter(self) -> None:
        self.add_class("filtering")
        self.query_one(Input).focus()

    def close_filter(self) -> bool:
        """Clear and hide the filter; False when it was not open."""
        if not self.has_class("filtering"):
            return False
        self.query_one(Input).value = ""
        self.remove_class("filtering")
        self.filter_text = ""
        self.refill()
        self.table.focus()
        return True

    @on(Input.Changed)
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.filter_text = event.value.strip()
        self.refill()

    @on(Input.Submitted)
    def _filter_done(self, event: Input.Submitted) -> None:
        event.stop()
        self.table.focus()

    def choose(self) -> None:
        t = self.table
        if 0 <= t.cursor_row < len(self.shown):
            self.post_message(RowTable.Chosen(self, self.shown[t.cursor_row]))
