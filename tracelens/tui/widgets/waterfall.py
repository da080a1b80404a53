"""The MFU loss waterfall as labelled horizontal bars: each bar starts where the one above it
ended, so the chart walks from 100% of the GPU's peak down to the MFU (or, when the MFU is
unknown, across the GPU-time partition down to the compute share)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tracelens.units import fmt_ns
from tracelens.views import BAR_COLOURS

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar_text(start: float, frac: float, width: int, colour: str) -> Text:
    """A bar from ``start`` to ``start + frac`` (fractions of ``width`` cells), drawn with
    eighth blocks so that small bars still show; a negative bar (the signed FLOP-convention
    bar) is drawn leftwards from ``start`` in a hatched style."""
    text = Text(no_wrap=True, overflow="crop")
    if width <= 0 or frac == 0:
        return text
    if frac < 0:
        lo, hi = start + frac, start
        style = f"{colour} on grey11"
        glyph = "░"
    else:
        lo, hi = start, start + frac
        style = colour
        glyph = "█"
    lo8, hi8 = max(0, round(lo * width * 8)), min(width * 8, round(hi * width * 8))
    if frac != 0 and hi8 <= lo8:
        hi8 = min(width * 8, lo8 + 1)  # at least an eighth: a non-zero bar never vanishes
    lead = lo8 // 8
    text.append(" " * lead)
    pos = lead * 8
    if glyph == "█":
        # a partial first cell cannot start mid-cell in a terminal: round its start down
        full, rem = divmod(hi8 - pos, 8)
        text.append("█" * full + (_EIGHTHS[rem] if rem else ""), style=style)
    else:
        text.append(glyph * max(1, -(-(hi8 - pos) // 8)), style=style)
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
        start = 0.0
        for b in self.bars:
            key, frac = b["key"], b["fraction"]
            colour = BAR_COLOURS.get(key, "grey70")
            final = key in ("mfu", "compute")
            label = Text(b["label"], style="bold" if final else ("dim" if frac == 0 else ""))
            if final:
                bar = bar_text(1.0 - frac if key == "mfu" else start, frac, width, colour)
            else:
                bar = bar_text(start, frac, width, colour)
            table.add_row(label, bar, Text(f"{100 * frac:6.2f}%", style="bold" if final else ""), fmt_ns(b["ns"]))
            if self.show_parts:
                pstart = start
                for p in b.get("parts", [])[:4]:  # the largest parts, each where it lies inside its bar
                    table.add_row(Text(f"   {p['label']}", style="dim"), bar_text(pstart, p["fraction"], width, f"dim {colour}"),
                                  Text(f"{100 * p['fraction']:6.2f}%", style="dim"), Text(fmt_ns(p["ns"]), style="dim"))
                    pstart += p["fraction"]
            if key != "mfu":
                start += frac
        return table
