"""The TUI's NCCL view (``job.nccl_diagnosis``): the verdict (what happened, the culprits and
why, the divergent calls' stack frames: ``render.text.verdict_lines``, as the text report), then
per process group the members x sequence numbers grid (one cell per seq, coloured by its state,
the first divergence marked ▼ and the odd members in red), then the communicators.  The first
view of a report of NCCL records alone; a tab (key ``n``) of a profiled job's report that has
a diagnosis."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from tracelens.render import nccl as nv
from tracelens.render import tables as views
from tracelens.render.text import verdict_lines

NCCL_KEY = "n"
LABEL_W = 12


def grid_text(g: dict[str, Any]) -> Text:
    """One group's grid: a ruler of seqs (every 8th numbered, ▼ at the first divergence), then a
    row per member (its label, a cell per seq)."""
    n = g["seq_to"] - g["seq_from"] + 1
    div = g.get("divergence")
    at = div["seq"] - g["seq_from"] if div and g["seq_from"] <= div["seq"] <= g["seq_to"] else None
    t = Text()
    ruler = [" "] * n
    for i in range(0, n, 8):
        for j, ch in enumerate(str(g["seq_from"] + i)):
            if i + j < n:
                ruler[i + j] = ch
    t.append(" " * LABEL_W + "".join(ruler) + "\n", style="dim")
    if at is not None:
        t.append(" " * (LABEL_W + at) + "▼", style="bold red")
        t.append(f" {nv.DIVERGENCE.get(div['kind'], div['kind'])}: seq {div['seq']}\n", style="red")
    odd = {str(m) for m in g.get("odd_members") or []}
    for m, states in zip(g["members"], g["states"], strict=False):
        label = views.printable(nv.member_label(m))[:LABEL_W - 1]
        t.append(f"{label:<{LABEL_W}}", style="bold red" if str(m) in odd else "")
        for i, c in enumerate(states[:n]):
            colour = nv.STATES.get(c, nv.STATES["?"])[1]
            t.append("▌" if i == at else "█", style=f"{colour} on #5c0000" if i == at else colour)
        t.append("\n")
    return t


def legend() -> Text:
    t = Text()
    for _, colour, what in nv.STATES.values():
        t.append("█ ", style=colour)
        t.append(what + "   ")
    return t


class NcclPane(VerticalScroll):
    def __init__(self, report: dict[str, Any]):
        super().__init__(id="nccl-body")
        self.report = report
        self.diag = nv.diagnosis(report)

    def compose(self) -> ComposeResult:
        v = self.diag
        if v is None:
            yield Static(Text("no NCCL records in this report (give NCCL logs or Flight Recorder dumps)"), classes="empty")
            return
        lines = [views.printable(x) for x in verdict_lines(v)]
        t = Text(lines[0] + "\n", style="bold green" if v["verdict"] == "ok" else "bold red")
        t.append("\n".join(lines[1:]))
        yield Static(t, id="nccl-verdict")
        grids = v.get("timeline") or []
        if grids:
            yield Label("collective timeline per process group (members x sequence numbers)", classes="section")
            yield Static(legend(), id="nccl-legend")
        for i, g in enumerate(grids):
            yield Label(Text(views.printable(nv.group_title(g))), classes="section")  # a group name is data, not markup
            yield Static(grid_text(g), id=f"nccl-grid-{i}")
        comms = ((self.report.get("job") or {}).get("nccl") or {}).get("communicators") or []
        if comms:
            yield Label(f"communicators ({len(comms)})", classes="section")
            yield Static(Text("\n".join(views.printable(
                f"{str(c.get('comm_id') or c.get('comm'))[:20]:<20} rank {c.get('rank')} of {c.get('nranks')}  {c.get('host')} pid {c.get('pid')} "
                f"cudaDev {c.get('cuda_dev')} busId {c.get('bus_id')}") for c in comms[:64])), id="nccl-comms")
