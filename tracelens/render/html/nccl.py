"""The HTML report's NCCL section (``job.nccl_diagnosis``, ``job.nccl``): the verdict first (what
happened, the culprits and why, the divergent calls with their stack frames), then per process
group the collective timeline as static SVG (members x sequence numbers, each cell coloured by
its state, the first divergence outlined), the communicators, the inputs and the bandwidth table
(``job.nccl.bandwidth``) when there is one.  Every string from a file is escaped; each cell
carries its member, seq and state in ``data-*`` attributes (the JSON's values)."""

from __future__ import annotations

from html import escape
from typing import Any

from tracelens.render import nccl as nv

CELL_W, CELL_H, LEFT, TOP = 12, 14, 120, 18


def _e(v: Any) -> str:
    return escape("–" if v is None else str(v))


def _table(head: list[str], rows: list[list[Any]], cls: str = "sortable") -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _frames(frames: list[dict[str, Any]] | None, limit: int = 6) -> str:
    if not frames:
        return "<span class='muted'>no stack frames recorded</span>"
    return "<ul class='frames'>" + "".join(f"<li><code>{_e(nv.frame_text(f))}</code></li>" for f in frames[:limit]) + "</ul>"


def _verdict(v: dict[str, Any]) -> str:
    ok = v["verdict"] in ("ok",)
    out = [f"<p class='nccl-verdict {'good' if ok else 'bad'}' data-verdict='{_e(v['verdict'])}'><b>{_e(nv.VERDICT_TITLES.get(v['verdict'], v['verdict']))}</b>"
           f" — {_e(v['summary'])}</p>"]
    if v.get("culprits"):
        out.append("<p>likely culprit(s): <b class='nccl-culprits'>" + _e(", ".join(nv.member_label(c) for c in v["culprits"])) + "</b></p>")
    m = v.get("first_mismatch")
    if m:
        out.append(f"<p>first disagreement: group {_e(m['group'])} seq {_e(m['seq'])}, on {_e(', '.join(m['fields']))}</p>")
    for g in v.get("groups") or []:
        bits = []
        if g.get("behind"):
            bits.append("behind: " + nv.behind_text(g["behind"], 16))
        if g.get("not_completed"):
            nc = g["not_completed"]
            bits.append(f"seq {nc['seq']} never completed on " + ", ".join(str(x) for x in nc["members"][:16]))
        if g.get("missing_members"):
            bits.append(f"{g['missing_members']} member(s) of {g['size']} not in the inputs")
        if bits:
            out.append(f"<p class='muted'>group {_e(g['group'])}: {_e('; '.join(bits))}</p>")
    if v.get("watchdog"):
        from tracelens.model.nccl import watchdog_text

        out.append("<ul>" + "".join(f"<li>{_e(watchdog_text(w))}</li>" for w in v["watchdog"][:8]) + "</ul>")
    if v.get("frames"):
        rows = "".join(f"<tr><td>{_e(', '.join(nv.member_label(x) for x in f['members'][:12]))}</td><td><code>{_e(f['call'])}</code></td>"
                       f"<td>{_frames(f.get('frames'))}</td></tr>" for f in v["frames"][:8])
        out.append("<table class='nccl-calls'><thead><tr><th>who</th><th>call</th><th>stack (the caller's frames first)</th></tr></thead>"
                   f"<tbody>{rows}</tbody></table>")
    return "".join(out)


def timeline_svg(g: dict[str, Any]) -> str:
    """One group's members x seqs grid."""
    n = g["seq_to"] - g["seq_from"] + 1
    w, h = LEFT + CELL_W * n + 4, TOP + CELL_H * len(g["members"]) + 4
    odd = {str(m) for m in g.get("odd_members") or []}
    div = g.get("divergence")
    svg = [f"<svg class='nccl-grid' data-group='{_e(g['group'])}' data-seq-from='{int(g['seq_from'])}' viewBox='0 0 {w} {h}' "
           f"width='{w}' height='{h}' role='img' aria-label='members x sequence numbers'>"]
    step = max(1, n // 8)
    for i in range(0, n, step):
        svg.append(f"<text x='{LEFT + CELL_W * i}' y='12'>{g['seq_from'] + i}</text>")
    for r, (m, states) in enumerate(zip(g["members"], g["states"], strict=False)):
        y = TOP + CELL_H * r
        bad = str(m) in odd
        mark = ' class="bad" font-weight="bold"' if bad else ""
        svg.append(f"<g class='nccl-row{' odd' if bad else ''}' data-member='{_e(m)}' data-states='{_e(states)}'>"
                   f"<text x='0' y='{y + 11}'{mark}>{_e(nv.member_label(m)[:18])}</text>")
        for i, c in enumerate(states[:n]):
            state, colour, what = nv.STATES.get(c, nv.STATES["?"])
            seq = g["seq_from"] + i
            svg.append(f"<rect x='{LEFT + CELL_W * i}' y='{y}' width='{CELL_W - 1}' height='{CELL_H - 1}' fill='{colour}' "
                       f"data-seq='{seq}' data-state='{state}'><title>{_e(nv.member_label(m))} seq {seq}: {_e(what)}</title></rect>")
        svg.append("</g>")
    if div and g["seq_from"] <= div["seq"] <= g["seq_to"]:
        x = LEFT + CELL_W * (div["seq"] - g["seq_from"])
        svg.append(f"<rect class='nccl-divergence' data-seq='{int(div['seq'])}' data-kind='{_e(div['kind'])}' x='{x - 1}' y='{TOP - 2}' "
                   f"width='{CELL_W + 1}' height='{CELL_H * len(g['members']) + 3}' fill='none' stroke='#c01c28' stroke-width='2'>"
                   f"<title>{_e(nv.DIVERGENCE.get(div['kind'], div['kind']))}: seq {int(div['seq'])}</title></rect>")
    svg.append("</svg>")
    return "".join(svg)


def _legend() -> str:
    return ("<p class='legend'>" + "".join(f"<span><i style='background:{colour}'></i>{escape(what)}</span>"
                                           for colour, what in ((c, w) for _, c, w in nv.STATES.values()))
            + "<span><i style='border:2px solid #c01c28'></i>the first divergence</span></p>")


def section(d: dict[str, Any]) -> str:
    """The section, or "" when the report has no NCCL diagnosis."""
    v = nv.diagnosis(d)
    if v is None:
        return ""
    nccl = (d.get("job") or {}).get("nccl") or {}
    out = ["<section id='nccl-section'><h2 id='nccl'>NCCL</h2>", _verdict(v)]
    grids = v.get("timeline") or []
    if grids:
        out.append("<h3>collective timeline per process group (members x sequence numbers)</h3>" + _legend())
        for g in grids:
            out.append(f"<p class='muted'>{_e(nv.group_title(g))}"
                       + (f"; {_e(nv.DIVERGENCE.get(g['divergence']['kind'], ''))} at seq {int(g['divergence']['seq'])}" if g.get("divergence") else "")
                       + "</p>" + timeline_svg(g))
    comms = nccl.get("communicators") or []
    if comms:
        total = nccl.get("communicators_total", len(comms))
        out.append(f"<h3>communicators ({_e(total)})</h3>" + _table(
            ["commId", "rank", "nranks", "host", "pid", "cudaDev", "busId"],
            [[c.get("comm_id") or c.get("comm"), c.get("rank"), c.get("nranks"), c.get("host"), c.get("pid"), c.get("cuda_dev"), c.get("bus_id")]
             for c in comms]))
    if nccl.get("collectives"):
        out.append("<h3>collectives</h3>" + _table(["group", "description", "collective", "records", "members", "first seq", "last seq"], [
            [c.get("group"), c.get("group_desc"), c.get("collective"), c.get("records"), c.get("members"), c.get("first_seq"), c.get("last_seq")]
            for c in nccl["collectives"][:200]]))
    bw = nv.bandwidth(d)
    if bw is not None:
        shown = bw[:nv.BANDWIDTH_SHOWN]
        out.append(f"<h3>bandwidth ({len(bw)} row(s){', the first ' + str(len(shown)) + ' shown' if len(bw) > len(shown) else ''})</h3>"
                   + _table(list(nv.BANDWIDTH_COLUMNS), [[r.get(k) if isinstance(r, dict) else None for k in nv.BANDWIDTH_COLUMNS]
                                                         for r in shown]).replace("<table class='sortable'>", "<table class='sortable nccl-bw'>", 1))
    if nccl.get("inputs"):
        out.append("<h3>inputs</h3>" + _table(["path", "format", "records", "NCCL", "Flight Recorder", "unknown lines"], [
            [i.get("path"), i.get("format"), i.get("records"), (i.get("facts") or {}).get("nccl_version"),
             (i.get("facts") or {}).get("fr_version"), (i.get("facts") or {}).get("unknown_lines")] for i in nccl["inputs"][:200]]))
    out.append("</section>")
    return "".join(out)
