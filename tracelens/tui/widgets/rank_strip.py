"""One bar per rank, from zero (never from the minimum: a 1% spread must look like 1%), so a
rank that is slower or less efficient than the others stands out: stragglers in red, ranks
more than 5% worse than the median (``views.outliers``) in orange."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tracelens.render.tables import outliers

_EIGHTHS = " ▁▂▃▄▅▆▇█"
ROWS = 3


class RankStrip(Widget):
    DEFAULT_CSS = "RankStrip { height: 4; }"

    def __init__(self, ranks: list[int], values: list[float], stragglers: set[int], higher_is_worse: bool, *, id: str | None = None):
        super().__init__(id=id)
        self.ranks, self.values, self.stragglers = ranks, values, stragglers
        self.odd = outliers(ranks, values, higher_is_worse)

    def render(self) -> Text:
        width = max(1, self.size.width)
        n = len(self.values)
        if not n:
            return Text("")
        # more ranks than columns: each column shows the largest value of its ranks
        per = max(1, -(-n // width))
        cols = []
        for i in range(0, n, per):
            group = self.ranks[i : i + per]
            colour = ("#e01b24" if any(r in self.stragglers for r in group)
                      else "#ff7800" if any(r in self.odd for r in group) else "#3584e4")
            cols.append((self.ranks[i], max(self.values[i : i + per]), colour))
        cw = max(1, min(6, width // len(cols)))
        top = max((v for _, v, _ in cols), default=0) or 1.0
        lines = [Text(no_wrap=True, overflow="crop") for _ in range(ROWS + 1)]
        for rank, v, colour in cols:
            eighths = round(v / top * ROWS * 8)
            for row in range(ROWS):  # row 0 is the top line
                level = max(0, min(8, eighths - (ROWS - 1 - row) * 8))
                lines[row].append((_EIGHTHS[level] * max(1, cw - 1)) + (" " if cw > 1 else ""), style=colour)
            label = str(rank) if per == 1 else f"{rank}+"
            lines[ROWS].append(label[:cw].ljust(cw) if cw >= len(label) or cw > 2 else " " * cw, style="dim")
        return Text("\n").join(lines)
