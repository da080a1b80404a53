"""The MFU loss waterfall as labelled horizontal bars: each bar starts where the one above it
ended, so the chart walks from 100% of the GPU's peak down to the MFU (or, when the MFU is
unknown, across the GPU time down to the compute share).  Rows, parts and positions come from
``views.waterfall_layout`` and the glyphs from ``views.bar_cells``, as in the text report."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tracelens.model.units import fmt_ns, fmt_pct
from tracelens.render import tables as views
from tracelens.render.tables import BAR_COLOURS


def bar_text(start: float, frac: float, width: int, colour: str) -> Text:
    """A bar from ``start`` to ``start + frac`` (fractions of ``width`` cells), in eighth blocks
    (``views.bar_cells``: its length is proportional to ``frac``, at least an eighth); a negative
    bar (the signed FLOP-convention bar) is drawn leftwards from ``start``, hatched."""
    text = Text(no_wrap=True, overflow="crop")
    lead, glyphs = views.bar_cells(start, frac, width)
    if not glyphs:
        return text
    text.append(" " * lead)
    text.append(glyphs, style=f"{colour} on grey11" if frac < 0 else colour)
    return text


class WaterfallChart(Widget):
    """Draws a list of bars (the report's waterfall entries)."""

    DEFAULT_CSS = "WaterfallChart { height: auto; }"

    bars: reactive[list[dict[str, Any]]] = reactive(list, layout=True)
    kind: reactive[str] = reactive("mfu")
    show_parts: reactive[bool] = reactive(True, layout=True)

    def __init__(self, bars: list[dict[str, Any]], kind: str, *, id: str | None = None):
        super().__init__(id=id)
        self.set_reactive(WaterfallChart.bars, bars)
        self.set_reactive(WaterfallChart.kind, kind)

    def render(self) -> Group | Text:
        if not self.bars:
            return Text("no waterfall: no GPU time in the window", style="dim")
        # the labels take up to 38 columns, less in a narrow terminal, so the bars keep room
        label_w = max(20, min(38, self.size.width // 2 - 12))
        width = max(10, self.size.width - label_w - 9 - 11 - 3)
        table = Table.grid(padding=(0, 1))
        table.add_column(width=label_w, no_wrap=True, overflow="ellipsis")
        table.add_column(width=width, no_wrap=True)
        table.add_column(width=8, justify="right")
        table.add_column(width=10, justify="right")
        rows = views.waterfall_layout(self.bars)
        for row in rows:
            frac, final = row["fraction"], row["final"]
            colour = BAR_COLOURS.get(row["key"], "grey70")
            label = Text(row["label"], style="bold" if final else ("dim" if frac == 0 else ""))
            table.add_row(label, bar_text(row["start"], frac, width, colour), Text(fmt_pct(frac, 2), style="bold" if final else ""),
                          fmt_ns(row["ns"]))
            if self.show_parts:
                for p in row["parts"]:  # each part where it lies inside its bar
                    table.add_row(Text(f"   {p['label']}", style="dim"), bar_text(p["start"], p["fraction"], width, f"dim {colour}"),
                                  Text(fmt_pct(p["fraction"], 2), style="dim"), Text(fmt_ns(p["ns"]), style="dim"))
        notes = [Text(f"{row['label']}: {row['note']}", style="dim") for row in rows if row.get("note")]
        return Group(table, *notes) if notes else table
