"""A sortable, filterable table over a list of row dicts.

The rows keep their raw values (numbers sort as numbers); columns say how to show them.
``/`` opens the filter (a case-insensitive substring over the shown cells), ``s`` sorts by the
column under the cursor (again: reversed), ``enter`` posts ``Chosen`` with the row's dict.
Textual's DataTable draws only the visible lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Label


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    fmt: Callable[[Any], str | Text] = str
    numeric: bool = False  # right-aligned


class RowTable(DataTable):
    """The DataTable inside a FilterTable: row-wise cursor, zebra stripes."""

    BINDINGS = [
        Binding("enter", "choose", "Open", show=True),
        Binding("s", "sort_column", "Sort", show=True),
        Binding("slash", "filter", "Filter", show=True),
    ]

    class Chosen(Message):
        def __init__(self, table: FilterTable, row: dict[str, Any]):
            super().__init__()
            self.table = table
            self.row = row

    def action_choose(self) -> None:
        self.parent_table.choose()

    def action_sort_column(self) -> None:
        self.parent_table.sort_by_cursor()

    def action_filter(self) -> None:
        self.parent_table.open_filter()

    @property
    def parent_table(self) -> FilterTable:
        return self.query_ancestor(FilterTable)


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

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="title")
        yield Input(placeholder="filter rows (esc: clear)")
        yield RowTable(cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        t = self.query_one(RowTable)
        for c in self.columns:
            t.add_column(Text(c.label, justify="right") if c.numeric else c.label, key=c.key)
        self.refill()

    @property
    def table(self) -> RowTable:
        return self.query_one(RowTable)

    def set_rows(self, rows: list[dict[str, Any]], title: str | None = None) -> None:
        self.all_rows = rows
        if title is not None:
            self.title = title
            self.query_one(".title", Label).update(title)
        self.refill()

    def _cell(self, c: Column, v: Any) -> str | Text:
        out = c.fmt(v) if v is not None else "-"
        if c.numeric and isinstance(out, str):
            return Text(out, justify="right")
        return out

    def refill(self) -> None:
        rows = self.all_rows
        if self.filter_text:
            needle = self.filter_text.lower()
            rows = [r for r in rows if any(needle in str(self._cell(c, r.get(c.key))).lower() for c in self.columns)]
        if self.sort_key is not None:
            k = self.sort_key
            present = [r for r in rows if r.get(k) is not None]
            missing = [r for r in rows if r.get(k) is None]
            present.sort(key=lambda r: r[k], reverse=self.sort_reverse)
            rows = present + missing
        self.shown = rows
        t = self.table
        col = t.cursor_column
        t.clear()
        t.add_rows([[self._cell(c, r.get(c.key)) for c in self.columns] for r in rows])
        t.move_cursor(column=col)  # clear() forgets the column: keep it (sort twice = reverse)
        n, total = len(rows), len(self.all_rows)
        label = self.title + (f"  ({n} of {total} rows match '{self.filter_text}')" if self.filter_text else f"  ({total})")
        if not total:
            label = f"{self.title}  — {self.empty}"
        self.query_one(".title", Label).update(label)

    def sort_by_cursor(self) -> None:
        t = self.table
        if not self.columns:
            return
        key = self.columns[max(0, min(t.cursor_column, len(self.columns) - 1))].key
        self.sort_by(key)

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = (not self.sort_reverse) if self.sort_key == key else any(c.key == key and c.numeric for c in self.columns)
        self.sort_key, self.sort_reverse = key, reverse
        self.refill()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))

    def open_filter(self) -> None:
        self.add_class("filtering")
        self.query_one(Input).focus()

    def close_filter(self) -> bool:
        """Clear and hide the filter; False when it was not open."""
        if not self.has_class("filtering"):
            return False
        inp = self.query_one(Input)
        inp.value = ""
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

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        # clicking the highlighted row again opens it, as enter does
        event.stop()
        self.choose()
