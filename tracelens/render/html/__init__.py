"""The HTML report: one self-contained file (no network at view time) that renders the JSON
report (embedded in it) for a post-mortem or a ticket.

Charts are small hand-written HTML/SVG, generated here: the headline numbers, the waterfall,
the per-rank bars, the step-time chart, the roofline and the step timeline all render without
JavaScript (hover text comes from ``title`` attributes).  A few lines of inline JavaScript add
table sorting.  Every number comes from the report dict through ``tracelens.render.tables``, as in the
terminal UI.

The page's style sheet and script are package data files beside this module (``page.css``,
``page.js``), read once with ``importlib.resources`` and inlined; the Content-Security-Policy
names them by the hash of the inlined text.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import math
import re
from html import escape
from importlib import resources
from typing import Any

import orjson

from tracelens.model.units import fmt_bytes, fmt_ns, fmt_num, fmt_pct
from tracelens.render import nccl as nccl_views
from tracelens.render import tables as views
from tracelens.render.tables import BAR_COLOURS, KCLASS_COLOURS, PIPELINE_COLOURS, path_colour

ASSETS = ("page.css", "page.js")  # the static text of the page, package data files beside this module


@functools.cache
def asset(name: str) -> str:
    """A static part of the page as it is inlined: the file's text after a line break (the
    element's text starts on its own line).  Read once per process."""
    if name not in ASSETS:
        raise ValueError(f"no page asset {name!r}")
    return "\n" + resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _td(v: Any, text: str | None = None, cls: str = "n") -> str:
    shown = escape(text if text is not None else ("–" if v is None else str(v)))
    raw = "" if v is None or isinstance(v, str) else f' data-v="{escape(str(v))}"'  # a saved report may hold anything
    return f'<td class="{cls}"{raw}>{shown}</td>'


def _peak_td(row: dict[str, Any]) -> str:
    """A % of peak cell: the share of the peak of the row's dtype, or the flag when above 100%."""
    if row.get("above_peak"):
        return f'<td class="n bad" title="{escape(views.PEAK_FLAG)}">{escape(views.peak_text(row))}</td>'
    return _td(row.get("of_peak"), views.peak_text(row))


def _table(columns: list[tuple[str, bool]], rows: list[str], sortable: bool = True, empty: str = "none") -> str:
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f'<th class="n">{escape(c)}</th>' if num else f"<th>{escape(c)}</th>" for c, num in columns)
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _summary(d: dict[str, Any]) -> str:
    h = views.headline(d)
    s = views.step_stats(d)
    g = d["job"]["gpu_time_ns"]
    cards = []
    if h["mfu"] is not None:
        doubt = f"; the MFU is {h['mfu_note']}" if h["mfu_note"] else ""
        cards.append(("MFU", f"{100 * h['mfu']:.2f}%", views.mfu_text(h) + doubt))
    else:
        cards.append(("MFU", "unknown", h["why_unknown"].removeprefix("MFU unknown: ")))
    if h["hfu"] is not None:
        cards.append(("HFU", f"{100 * h['hfu']:.2f}%", "with recomputed FLOPs"))
    if s["count"]:
        cards.append(("step time", fmt_ns(s["mean"]), f"mean of {s['count']} steps; p50 {fmt_ns(s['p50'])}, max {fmt_ns(s['max'])}"))
    cards.append(("ranks", str(h["ranks"]), h["device"] or "unknown GPU"))
    if h["warnings"]:
        cards.append(("warnings", str(h["warnings"]), "what is unknown, left out or flagged: see the list at the end"))
    if g:
        w = g["idle"] + g["compute"] + g["exposed_comm"] + g["exposed_memcpy"]
        if w:
            cards.append(("GPU idle", fmt_pct(g["idle"] / w), f"compute {fmt_pct(g['compute'] / w)}, exposed comm {fmt_pct(g['exposed_comm'] / w)}"))
    out = ['<div class="cards" id="summary">']
    for k, v, sub in cards:
        link = " <a href='#warnings'>(the warnings)</a>" if k == "warnings" or (k == "MFU" and h["mfu"] is None and h["warnings"]) else ""
        out.append(f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
                   f'<div class="muted">{escape(sub or "")}{link}</div></div>')
    out.append("</div>")
    return "".join(out)


def _waterfall(d: dict[str, Any]) -> str:
    bars, kind = views.waterfall(d)
    title = views.waterfall_title(kind)
    if not bars:
        return f'<h2>{escape(title)}</h2><p class="muted">no GPU time in the window</p>'
    out = [f'<h2>{escape(title)}</h2><div class="wf" id="waterfall" data-kind="{escape(str(kind))}">']
    for row in views.waterfall_layout(bars):  # the rows, parts and positions the text and the TUI draw
        key, f = row["key"], float(row["fraction"])
        colour = BAR_COLOURS.get(key, "#999")
        left = row["start"] + min(f, 0)
        tip = f"{row['label']}: {fmt_pct(f, 2)} ({fmt_ns(row['ns'])})"
        if row["parts"]:
            tip += "\n" + "\n".join(f"  {p['label']}: {fmt_pct(p['fraction'], 2)} ({fmt_ns(p['ns'])})" for p in row["parts"])
        cls = "final" if row["final"] else ""
        out.append(
            f'<div class="label {cls}">{escape(row["label"])}</div>'
            f'<div class="track"><div class="bar" data-key="{escape(key)}" data-fraction="{f!r}" title="{escape(tip)}" '
            f'style="left:{100 * max(left, 0):.4f}%;width:{100 * abs(f):.4f}%;background:{colour}{";display:none" if f == 0 else ""}"></div></div>'
            f'<div class="num {cls}">{escape(fmt_pct(f, 2))}</div><div class="num muted">{escape(fmt_ns(row["ns"]))}</div>'
        )
        for p in row["parts"]:
            pf = float(p["fraction"])
            out.append(
                f'<div class="label part">{escape(p["label"][:70])}</div>'
                f'<div class="track"><div class="bar part" title="{escape(p["label"])}: {escape(fmt_pct(pf, 2))}" '
                f'style="left:{100 * max(p["start"], 0):.4f}%;width:{100 * abs(pf):.4f}%;background:{colour}"></div></div>'
                f'<div class="num muted">{escape(fmt_pct(pf, 2))}</div><div class="num muted">{escape(fmt_ns(p["ns"]))}</div>'
            )
        if row.get("note"):  # what the bar measures, in one line
            out.append(f'<div class="label part note muted" style="grid-column:1/-1">{escape(row["note"])}</div>')
    out.append("</div>")
    return "".join(out)


def _suggestions(d: dict[str, Any]) -> str:
    sg = d["suggestions"]
    out = ["<h2>Suggestions, largest possible win first</h2>"]
    if not sg:
        return out[0] + '<p class="muted">none: no rule fired</p>'
    for s in sg:
        ev = s["evidence"]
        win = f'<span class="win">up to {escape(views.fmt_speedup(s["est_speedup"]))} faster</span>' if s["est_speedup"] else ""
        if "measure" in ev:
            per = views.worst_ranks(ev.get("per_rank", {}))[:8]
            val = views.evidence_value(ev)
            evid = (f"{escape(ev['measure'])}: worst {escape(val(ev['worst']))}, mean {escape(val(ev['mean']))} "
                    f"(fires at {escape(val(ev['threshold']))}); "
                    + "ranks " + ", ".join(f"{escape(k)} ({escape(val(v))})" for k, v in per) + (" …" if len(ev.get("per_rank", {})) > 8 else ""))
        else:
            evid = escape(str(ev.get("detail", "")))
        w = ev.get("where")
        where = ""
        if w and w.get("start_ns") is not None:
            where = f"<div class='muted'>most visible in rank {escape(str(w['rank']))}, {escape(str(w.get('step_name') or ''))}</div>"
        out.append(f'<div class="sugg" data-id="{escape(s["id"])}">{win}<div class="t">{escape(s["title"])}</div>'
                   f"<div><b>fix:</b> {escape(s['detail'])}</div><div class='muted'>evidence: {evid}</div>{where}</div>")
    return "".join(out)


def _ranks(d: dict[str, Any]) -> str:
    rows = views.rank_rows(d)
    label, series = views.per_rank_series(d)
    out = ["<h2>Ranks</h2>"]
    if len(series) > 1:
        top = max(series) or 1.0
        strag = {s["rank"] for s in d["job"]["stragglers"] or []}
        odd = views.outliers([r["rank"] for r in rows], series, higher_is_worse="MFU" not in label)
        out.append(f'<p class="muted">{escape(label)}, one bar per rank from zero; stragglers in red, more than 5% worse than '
                   f'the median rank in orange</p><div class="strip" id="rank-strip">')
        for r, v in zip(rows, series):
            shown = fmt_pct(v, 2) if "MFU" in label else f"{v:,.2f} ms"
            cls = "straggler" if r["rank"] in strag else "outlier" if r["rank"] in odd else ""
            extra = f", {100 * odd[r['rank']]:.1f}% worse than the median" if r["rank"] in odd else ""
            out.append(f'<div class="{cls}" style="height:{100 * v / top:.2f}%" title="rank {escape(str(r["rank"]))}: {escape(shown + extra)}"></div>')
        out.append("</div>")
        if odd:
            worst = sorted(odd.items(), key=lambda kv: -kv[1])[:8]
            out.append("<p class='outlier-text'>worse than the median rank by more than 5%: "
                       + ", ".join(f"rank {escape(str(rk))} ({100 * off:.1f}%)" for rk, off in worst) + "</p>")
    for st in d["job"]["stragglers"] or []:
        out.append(f'<p class="bad">rank {escape(str(st["rank"]))} is a straggler: {escape(st["evidence"])}</p>')
    verdict = views.straggler_verdict(d)
    if verdict and verdict[0] != "found":
        out.append(f'<p class="muted">straggler ranks: {escape(verdict[1])}</p>')
    trs = []
    src = views.shows_sources(d)  # a job with nsys exports: which source fed each rank
    for r in rows:
        cell = _td(None, r["source"] or "?", cls="") if src else ""
        trs.append("<tr>" + _td(r["rank"]) + cell + _td(r["device"], cls="") + _td(r["steps"]) + _td(r["step_ns"], fmt_ns(r["step_ns"]))
                   + _td(r["mfu"], fmt_pct(r["mfu"], 2)) + _td(r["idle"], fmt_pct(r["idle"])) + _td(r["exposed_comm"], fmt_pct(r["exposed_comm"]))
                   + _td(r["bubble"], fmt_pct(r["bubble"])) + _td(None, "straggler" if r["straggler"] else "", cls="bad") + "</tr>")
    out.append(_table([("rank", True)] + ([("source", False)] if src else []) + [
        ("device", False), ("steps", True), ("step time", True), ("MFU", True), ("idle", True),
        ("exp. comm", True), ("bubble", True), ("", False)], trs))
    out.append(_rank_waterfalls(d))
    return "".join(out)


def _rank_waterfalls(d: dict[str, Any]) -> str:
    """Each rank's waterfall as one table row (share of its window per bar), to compare ranks."""
    per = [(r["rank"], *views.waterfall(d, r["rank"])) for r in d["ranks"]]
    per = [(rank, bars, kind) for rank, bars, kind in per if bars]
    if len(per) < 2:
        return ""
    keys = list(dict.fromkeys(b["key"] for _, bars, _ in per for b in bars))
    labels = {b["key"]: b["label"] for _, bars, _ in per for b in bars}
    trs = []
    for rank, bars, _ in per:
        by = {b["key"]: b for b in bars}
        trs.append("<tr>" + _td(rank) + "".join(
            _td(by[k]["fraction"] if k in by else None, fmt_pct(by[k]["fraction"]) if k in by else None) for k in keys) + "</tr>")
    return ("<details><summary>the waterfall of each rank (share of its window)</summary>"
            + _table([("rank", True)] + [(labels[k], True) for k in keys], trs) + "</details>")


def _steps_chart(d: dict[str, Any]) -> str:
    """Step time per step position: the median over ranks as a bar, min..max as a whisker."""
    by_pos: dict[int, list[tuple[int, int, str]]] = {}
    for r in d["ranks"]:
        for i, s in enumerate(r["steps"]):
            by_pos.setdefault(i, []).append((s["dur_ns"], r["rank"], s["name"]))
    if not by_pos:
        return ""
    W, H, pad = 900, 160, 40
    n = len(by_pos)
    top = max(t for v in by_pos.values() for t, _, _ in v) or 1
    bw = (W - pad) / n
    out = [f'<h2>Step time</h2><svg id="step-chart" viewBox="0 0 {W} {H + 20}" width="100%" role="img" aria-label="step time per step">']
    out.append(f'<text x="0" y="12">{escape(fmt_ns(top))}</text><line x1="{pad}" y1="{H}" x2="{W}" y2="{H}" stroke="#ccc"/>')
    warm = {i for r in d["ranks"] for i, s in enumerate(r["steps"]) if s["warmup"]}
    for i, vals in sorted(by_pos.items()):
        ts = sorted(t for t, _, _ in vals)
        med, lo, hi = ts[(len(ts) - 1) // 2], ts[0], ts[-1]
        x = pad + i * bw
        h = H * med / top
        slowest = max(vals)
        tip = f"{vals[0][2]}: median {fmt_ns(med)} over {len(ts)} rank(s), min {fmt_ns(lo)}, max {fmt_ns(hi)} (rank {slowest[1]})"  # escaped below
        colour = "#c0bfbc" if i in warm else "#3584e4"
        w = min(bw * 0.7, 60)
        out.append(f'<rect x="{x + (bw - w) / 2:.1f}" y="{H - h:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{colour}"><title>{escape(tip)}</title></rect>')
        if hi > lo:
            cx = x + bw / 2
            out.append(f'<line x1="{cx:.1f}" y1="{H - H * hi / top:.1f}" x2="{cx:.1f}" y2="{H - H * lo / top:.1f}" stroke="#1d1d1f"/>')
        if n <= 40:
            out.append(f'<text x="{x + bw / 2:.1f}" y="{H + 14}" text-anchor="middle">{escape(str(vals[0][2]).replace("ProfilerStep", ""))}</text>')
    out.append("</svg><p class='muted'>grey: warm-up step (left out of the totals)</p>")
    return "".join(out)


def _path_bar(by: dict[str, int], label: str) -> str:
    """A stacked bar (static SVG) of a critical path's ns by category; each part's ns in ``data-ns``."""
    # the order is the numbers' (largest first, then by name), never the saved file's key order
    by = dict(sorted(((str(c), ns) for c, ns in by.items() if isinstance(ns, int) and ns > 0), key=lambda kv: (-kv[1], kv[0])))
    total = sum(by.values())
    if total <= 0:
        return ""
    W, x, parts = 600, 0.0, []
    for c, ns in by.items():
        w = W * ns / total
        tip = f"{c}: {fmt_ns(ns)} ({fmt_pct(ns / total)})"
        parts.append(f'<rect class="cp-part" data-cat="{escape(c)}" data-ns="{int(ns)}" x="{x:.2f}" y="0" width="{w:.2f}" height="14" '
                     f'fill="{path_colour(c)}"><title>{escape(tip)}</title></rect>')
        x += w
    legend = " · ".join(f'<span style="color:{path_colour(c)}">■</span> {escape(c)} {escape(fmt_pct(ns / total))}' for c, ns in by.items())
    return (f'<div class="cp-row"><span class="cp-label">{escape(label)} ({escape(fmt_ns(total))})</span>'
            f'<svg class="cp-bar" viewBox="0 0 {W} 14" width="{W}" height="14" role="img" aria-label="{escape(label)}">{"".join(parts)}</svg>'
            f'<div class="muted">{legend}</div></div>')


def _job_path(cp: Any) -> str:
    """The job's path stitched across ranks (job.critical_path with ``steps``): a stacked bar over
    the kept steps and one per kept step with its chain of ranks, and who waited for whom
    (``wait_rank_ns``); nothing for a report without it (one rank, older)."""
    if not isinstance(cp, dict) or not isinstance(cp.get("steps"), list) or not isinstance(cp.get("by_category_ns"), dict):
        return ""
    out = ["<h3 id='critical-path-job'>job (stitched across ranks)</h3>", _path_bar(cp["by_category_ns"], "kept steps")]
    for st in cp["steps"]:
        if isinstance(st, dict) and st.get("kept") and isinstance(st.get("by_category_ns"), dict):
            chain = " → ".join("?" if r is None else str(r) for r in (st.get("ranks") or []))
            out.append(_path_bar(st["by_category_ns"], f"step {st.get('step')}, ranks {chain or '?'}"))
    waits = [(str(w), str(late), ns) for w, by in (cp.get("wait_rank_ns") or {}).items() if isinstance(by, dict)
             for late, ns in by.items() if isinstance(ns, int)]
    trs = ["<tr>" + _td(None, w, "") + _td(None, late, "") + _td(ns, fmt_ns(ns)) + "</tr>"
           for w, late, ns in sorted(waits, key=lambda x: (-x[2], x[0], x[1]))]
    out.append(_table([("rank", False), ("waited for rank", False), ("wait", True)], trs, empty="no rank waited for another"))
    return "".join(out)


def _critical_path(d: dict[str, Any]) -> str:
    """Each rank's critical path over its kept steps and each kept step's (stacked bars by
    category) and the kept steps' top events on the path; nothing when the report has none."""
    from tracelens.model.summary import kept_indices

    ranks = [r for r in d["ranks"] if r.get("critical_path")]
    if not ranks:
        return ""
    out = ["<h2 id='critical-path'>Critical path</h2><p class='muted'>the chain of waits that set each step's time "
           "(the path's length is the step's time), by category</p>"]
    wis = views.what_if_rows(d)
    if wis:  # each suggestion's change replayed on the graph, next to its upper bound
        trs = ["<tr>" + _td(None, w["title"], "") + _td(None, w["change"], "")
               + _td(w["upper"], views.fmt_speedup(w["upper"]) if w["upper"] is not None else None)
               + _td(w["predicted_speedup"], views.fmt_speedup(w["predicted_speedup"]))
               + _td(w["predicted_step_ns"], fmt_ns(w["predicted_step_ns"]) if w["predicted_step_ns"] is not None else None)
               + _td(w["predicted_mfu"], fmt_pct(w["predicted_mfu"]) if w["predicted_mfu"] is not None else None)
               + _td(None, w["note"], "") + "</tr>"
               for w in wis]
        out.append("<h3 id='what-if'>What-if, replayed on the graph</h3><p class='muted'>each suggestion's change applied to "
                   "every kept step's dependency graph: the predicted speed-up next to the upper bound 1 / (1 - bar)</p>"
                   + _table([("suggestion", False), ("change", False), ("up to", True), ("replayed", True),
                             ("predicted step", True), ("predicted MFU", True), ("note", False)], trs))
    out.append(_job_path(d["job"].get("critical_path")))
    for r in ranks:
        cp = r["critical_path"]
        out.append(f"<h3>rank {escape(str(r['rank']))}</h3>" + _path_bar(cp["by_category_ns"], "kept steps"))
        trs = []
        per = cp.get("steps") or []  # optional in a saved report
        for i in kept_indices(r["steps"]):
            if i >= len(per):
                break
            st, s = r["steps"][i], per[i]
            out.append(_path_bar(s["by_category_ns"], str(st["name"])))
            for e in s["top_events"]:
                share = e["ns"] / s["length_ns"] if s["length_ns"] else None
                trs.append("<tr>" + _td(None, str(st["name"]), "") + _td(None, e["category"], "") + _td(e["ns"], fmt_ns(e["ns"]))
                           + _td(share, fmt_pct(share) if share is not None else None) + _td(None, e["kind"] or "", "")
                           + _td(None, (e["name"] or "")[:200], "") + "</tr>")
        out.append(_table([("step", False), ("category", False), ("on path", True), ("share", True), ("kind", False), ("event", False)],
                          trs, empty="no events on the path"))
    return "<section id='critical'>" + "".join(out) + "</section>"


def _pipeline(d: dict[str, Any]) -> str:
    """The pipeline: what was detected and why, the bubble against the theory and the gap's parts,
    the ranks' bubbles, and stages x time of one step per rank as static SVG (blocks coloured F/B,
    bubbles marked; each rect's ns in ``data-ns``, the lane's bubble in ``data-bubble-ns``: the
    JSON's numbers); nothing without a pipeline in the report."""
    pipe = (d.get("job") or {}).get("pipeline")
    if not pipe:
        return ""
    out = ["<h2 id='pipeline'>Pipeline</h2>"]
    out += [f"<p>{escape(line.strip())}</p>" for line in views.pipeline_summary_lines(d)[:2]]
    out.append("<ul class='muted'>" + "".join(f"<li>{escape(str(e))}</li>" for e in pipe.get("evidence") or []) + "</ul>")
    lanes = views.pipeline_lanes(d)
    span = max((ln["window_ns"] for ln in lanes), default=0)
    if lanes and span > 0:
        W, H, left = 720, 18, 110
        svg = [f'<svg class="pp-chart" viewBox="0 0 {left + W} {H * len(lanes) + 4}" width="{left + W}" height="{H * len(lanes) + 4}" '
               f'role="img" aria-label="pipeline stages x time">']
        for i, ln in enumerate(lanes):
            y = i * H + 2
            stage = "?" if ln["stage"] is None else str(ln["stage"])
            name = f"stage {stage} · rank {ln['rank']}"
            svg.append(f'<g class="pp-lane" data-rank="{escape(str(ln["rank"]))}" data-stage="{escape(stage)}" '
                       f'data-window-ns="{int(ln["window_ns"])}" data-bubble-ns="{int(ln["bubble_ns"])}">'
                       f'<text x="0" y="{y + 12}">{escape(name)}</text>')
            for kind, items in (("block", ln["blocks"]), ("bubble", ln["bubbles"])):
                for b in items:
                    x, w = left + W * b["s"] / span, max(W * (b["e"] - b["s"]) / span, 0.5)
                    label = b.get("label") if kind == "block" else None
                    colour = PIPELINE_COLOURS.get(label or "bubble", "#77767b")
                    what = (f"{label}{'' if b.get('mb') is None else ' mb ' + str(b['mb'])}" if kind == "block"
                            else views.PIPELINE_PHASES.get(b["kind"], b["kind"]) + " bubble")
                    tip = f"{what}: {fmt_ns(b['e'] - b['s'])} at {fmt_ns(b['s'])}"
                    faint = ' fill-opacity="0.35"' if kind == "bubble" else ""
                    svg.append(f'<rect class="pp-{kind}" data-ns="{int(b["e"] - b["s"])}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{H - 4}" '
                               f'fill="{colour}"{faint}><title>{escape(tip)}</title></rect>')
            svg.append("</g>")
        svg.append("</svg>")
        out.append(f"<p class='muted'>stages x time: one step per rank (its slowest kept one, {escape(fmt_ns(span))} wide); "
                   f"<span style='color:{PIPELINE_COLOURS['F']}'>■</span> forward · <span style='color:{PIPELINE_COLOURS['B']}'>■</span> "
                   f"backward · <span style='color:{PIPELINE_COLOURS['bubble']}'>■</span> bubble</p>" + "".join(svg))
    trs = []
    for r in d["ranks"]:
        pr = r.get("pipeline") or {}
        if "warmup_ns" not in pr:
            continue
        trs.append("<tr>" + _td(r["rank"]) + _td(pr["stage"]) + _td(pr["bubble_ns"], fmt_ns(pr["bubble_ns"]))
                   + _td(pr["bubble_fraction"], fmt_pct(pr["bubble_fraction"]) if pr["bubble_fraction"] is not None else None)
                   + "".join(_td(pr[k], fmt_ns(pr[k])) for k in ("warmup_ns", "steady_ns", "cooldown_ns", "exposed_p2p_ns")) + "</tr>")
    out.append(_table([("rank", True), ("stage", True), ("bubble", True), ("share", True), ("warm-up", True), ("steady", True),
                       ("cool-down", True), ("exposed P2P", True)], trs, empty="no rank with pipeline blocks"))
    return "<section id='pipeline-section'>" + "".join(out) + "</section>"


def _roofline(d: dict[str, Any]) -> str:
    """The 200 longest op shapes (over all ranks) against the roof of the dtype each ran at:
    one roof per dtype (its own peak, its ridge at peak / bandwidth), so that a point's % of
    peak and its memory/compute "bound" agree with the roof drawn for it."""
    rl = views.roofline(d)
    if not rl:
        return ""
    try:
        return _roofline_svg(rl["points"], rl["roofs"])
    except (OverflowError, ValueError, ZeroDivisionError):  # numbers no GPU has (a hand-edited saved report)
        return '<p class="muted">roofline left out: its numbers do not fit log axes</p>'


def _roofline_svg(rows: list[dict[str, Any]], roofs: list[dict[str, Any]]) -> str:
    W, H, pad = 700, 300, 46
    xs = [m["arithmetic_intensity"] for m in rows] + [r["ridge"] for r in roofs if r["ridge"]]
    x0, x1 = 10 ** math.floor(math.log10(min(xs + [1.0]))), 10 ** math.ceil(math.log10(max(xs + [1e3])) + 0.3)
    ys = [m["achieved_tflops"] for m in rows]
    y1 = max(max(r["peak_flops"] for r in roofs) / 1e12, max(ys)) * 2
    y0 = 10 ** math.floor(math.log10(max(min(ys + [r["peak_flops"] / 1e12 for r in roofs]) / 10, 1e-3)))

    def px(x: float) -> float:
        return pad + (W - pad - 10) * (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))

    def py(y: float) -> float:
        return H - (H - 10) * (math.log10(max(y, y0)) - math.log10(y0)) / (math.log10(y1) - math.log10(y0))

    out = ['<h3>Roofline of the matmul ops</h3><p class="muted">one roof per dtype (its dense peak and its ridge at peak / memory '
           'bandwidth); each point, in the colour of its roof, is held to the roof of the dtype it ran at; a hollow point is above '
           '100% of it (its FLOPs or dtype are wrong)</p><svg id="roofline" viewBox="0 0 {W} {H2}" width="100%" '
           'style="max-width:{W}px" role="img" aria-label="roofline">'.format(W=W, H2=H + 30)]
    out.append(f'<line x1="{pad}" y1="{H}" x2="{W}" y2="{H}" stroke="#ccc"/><line x1="{pad}" y1="0" x2="{pad}" y2="{H}" stroke="#ccc"/>')
    out.append(f'<text x="{pad + 60}" y="{H + 26}">arithmetic intensity, FLOP/byte (log)</text><text x="2" y="10">TFLOP/s</text>')
    for e in range(round(math.log10(x0)), round(math.log10(x1)) + 1):  # decade ticks
        out.append(f'<text x="{px(10 ** e):.1f}" y="{H + 13}" text-anchor="middle">{10 ** e:g}</text>')
    for e in range(math.ceil(math.log10(y0)), math.floor(math.log10(y1)) + 1):
        out.append(f'<text x="{pad - 4}" y="{py(10 ** e) + 4:.1f}" text-anchor="end">{10 ** e:g}</text>'
                   f'<line x1="{pad}" y1="{py(10 ** e):.1f}" x2="{W}" y2="{py(10 ** e):.1f}" stroke="#eee"/>')
    colours = ("#c01c28", "#e66100", "#813d9c", "#1c71d8", "#26a269")
    roof_colour = {}
    for i, rf in enumerate(roofs):
        pk, bw, ridge = rf["peak_flops"] / 1e12, rf["bandwidth"], rf["ridge"]
        dt = escape(str(rf["dtype"] or "reference").upper())
        colour = roof_colour[(rf["dtype"], rf["peak_flops"], bw)] = colours[i % len(colours)]
        if ridge:
            pts = [(x0, min(pk, bw * x0 / 1e12)), (ridge, pk), (x1, pk)] if ridge > x0 else [(x0, pk), (x1, pk)]
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            out.append(f'<polyline class="roof" data-dtype="{dt}" data-peak="{rf["peak_flops"]!r}" data-ridge="{ridge!r}" points="{path}" '
                       f'fill="none" stroke="{colour}" stroke-width="2"><title>{dt} roof: min({pk:,.1f} TFLOP/s, {bw / 1e12:.2f} TB/s x '
                       f'intensity); ridge at {ridge:,.0f} FLOP/B</title></polyline>')
        else:
            out.append(f'<line class="roof" data-dtype="{dt}" data-peak="{rf["peak_flops"]!r}" x1="{pad}" y1="{py(pk):.1f}" x2="{W}" '
                       f'y2="{py(pk):.1f}" stroke="{colour}" stroke-width="2"><title>{dt} peak {pk:,.1f} TFLOP/s</title></line>')
        out.append(f'<text x="{W - 4}" y="{py(pk) - 3:.1f}" text-anchor="end" fill="{colour}">{dt} {pk:,.0f}</text>' if pk >= 100 else
                   f'<text x="{W - 4}" y="{py(pk) - 3:.1f}" text-anchor="end" fill="{colour}">{dt} {pk:.1f}</text>')
    top_t = max(m["kernel_ns"] for m in rows) or 1
    for m in rows:
        r = 3 + 9 * math.sqrt(max(m["kernel_ns"], 0) / top_t)
        flag = m.get("above_peak")
        dt = str(m.get("dtype") or "reference").upper()
        share = views.PEAK_FLAG if flag else f"{fmt_pct(m.get('of_peak'))} of the {dt} peak"
        tip = (f"rank {m['rank']} {m['op']} {m['shapes']} {m['dtype']}: {m['achieved_tflops']:.1f} TFLOP/s ({share}), "
               f"{m['arithmetic_intensity']:.0f} FLOP/B, {m.get('bound') or '?'}-bound at the {dt} ridge, {fmt_ns(m['kernel_ns'])}")
        colour = roof_colour.get((m.get("dtype"), m["peak_flops"], m["bandwidth"]), "#3584e4")  # its roof's colour
        style = f'fill="none" stroke="{colour}" stroke-width="1.5"' if flag else f'fill="{colour}" fill-opacity=".55"'
        out.append(f'<circle cx="{px(m["arithmetic_intensity"]):.1f}" cy="{py(m["achieved_tflops"]):.1f}" r="{r:.1f}" '
                   f'data-dtype="{escape(dt)}" data-bound="{escape(str(m.get("bound")))}" data-ai="{m["arithmetic_intensity"]!r}" '
                   f'{style}><title>{escape(tip)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def _kernels(d: dict[str, Any]) -> str:
    out = ["<h2>Kernels</h2>"]
    ks = views.kernel_rows(d)
    classes = views.class_rows(d, ks)
    out.append(_table([("class", False), ("kernels", True), ("launches", True), ("time", True), ("share", True)], [
        "<tr>" + _td(None, c["kclass"], cls="") + _td(c["kernels"]) + _td(c["count"]) + _td(c["total_ns"], fmt_ns(c["total_ns"]))
        + _td(c["share"], fmt_pct(c["share"])) + "</tr>" for c in classes], empty="no GPU kernels"))
    trs = ["<tr>" + f'<td class="name" title="{escape(k["name"])}">{escape(k["name"][:160])}{"…" if len(k["name"]) > 160 else ""}</td>' + _td(None, k["kclass"], cls="") + _td(k["count"])
           + _td(k["total_ns"], fmt_ns(k["total_ns"])) + _td(k["mean_ns"], fmt_ns(int(k["mean_ns"] or 0)))
           + _td(k["tflops"], fmt_num(k["tflops"])) + _peak_td(k) + _td(None, k.get("dtype") or "–", cls="") + "</tr>" for k in ks[:200]]
    out.append(f"<details open><summary>{escape(views.kernel_table_title(d, ks))}{'; the 200 longest shown' if len(ks) > 200 else ''}"
               "; click a header to sort</summary>")
    out.append(_table([("kernel", False), ("class", False), ("count", True), ("total", True), ("mean", True), ("TFLOP/s", True),
                       ("% of dtype peak", True), ("dtype", False)], trs, empty="no GPU kernels"))
    out.append("</details>")
    mm_all = views.matmul_rows(d)
    mm = mm_all[:100]
    if mm:
        trs = ["<tr>" + _td(m["rank"]) + _td(None, m["op"], cls="") + _td(None, m["shapes"], cls="name") + _td(None, m["dtype"], cls="")
               + _td(m["calls"]) + _td(m["kernel_ns"], fmt_ns(m["kernel_ns"])) + _td(m.get("achieved_tflops"), fmt_num(m.get("achieved_tflops")))
               + _peak_td(m) + _td(m.get("arithmetic_intensity"), fmt_num(m.get("arithmetic_intensity"), 0))
               + _td(None, m.get("bound") or "–", cls="") + "</tr>" for m in mm]
        out.append(f"<details open><summary>{escape(views.matmul_table_title(d))}"
                   f"{'; the 100 longest shown' if len(mm_all) > 100 else ''}</summary>")
        out.append(_table([("rank", True), ("op", False), ("shapes", False), ("dtype", False), ("calls", True), ("time", True),
                           ("TFLOP/s", True), ("% of dtype peak", True), ("FLOP/B", True), ("bound", False)], trs))
        out.append("</details>")
        out.append(_roofline(d))
    return "".join(out)


def _comm(d: dict[str, Any]) -> str:
    out = ["<h2>Communication</h2>"]
    trs = ["<tr>" + _td(None, g["group"] or "–", cls="") + _td(None, g["group_desc"] or "", cls="") + _td(None, g["collective"], cls="")
           + _td(g["count"]) + _td(g["bytes"], fmt_bytes(g["bytes"])) + _td(g["time_ns"], fmt_ns(g["time_ns"]))
           + _td(g["exposed_ns"], fmt_ns(g["exposed_ns"])) + _td(g["wait_ns"], fmt_ns(g["wait_ns"]))
           + _td(g["busbw_gbps_median"], fmt_num(g["busbw_gbps_median"])) + "</tr>" for g in views.comm_rows(d)]
    out.append(_table([("group", False), ("desc", False), ("collective", False), ("count", True), ("bytes", True), ("time", True),
                       ("exposed", True), ("wait", True), ("busbw GB/s", True)], trs, empty="no collectives in these traces"))
    out += [f'<p class="muted">{escape(note)}</p>' for note in views.comm_notes(d)]
    out += [f'<p class="muted">{escape(g["group"] or "?")} {escape(g["collective"] or "?")}: {escape("; ".join(views.nccl_join(g)))}</p>'
            for g in views.comm_rows(d) if views.nccl_join(g)]  # --nccl: what NCCL's own records say of each
    slow = views.slow_collective_rows(d)
    if slow:
        trs = ["<tr>" + _td(None, c["group"] or "–", cls="") + _td(c["seq"]) + _td(None, c["collective"], cls="")
               + _td(c["bytes"], fmt_bytes(c["bytes"])) + _td(c["ranks"]) + _td(c["max_ns"], fmt_ns(c["max_ns"]))
               + _td(c["exposed_ns"], fmt_ns(c["exposed_ns"])) + _td(c["wait_ns"], fmt_ns(c["wait_ns"]))
               + _td(c["busbw_gbps"], fmt_num(c["busbw_gbps"])) + _td(c["slowest_rank"]) + "</tr>" for c in slow]
        out.append("<details><summary>the slowest collectives</summary>")
        out.append(_table([("group", False), ("seq", True), ("collective", False), ("bytes", True), ("ranks", True), ("slowest", True),
                           ("exposed", True), ("wait", True), ("busbw GB/s", True), ("slowest rank", True)], trs))
        out.append("</details>")
    return "".join(out)


TIMELINE_RANKS = 16  # ranks drawn in the HTML's step timeline (stragglers always among them)


def _timeline(d: dict[str, Any]) -> str:
    tl = d.get("timeline")
    if not tl or not tl["ranks"]:
        return ""
    bins, classes = tl["bins"], tl["classes"]
    W, label_w, row_h = 900, 90, 12
    cw = (W - label_w) / bins
    strag = {s["rank"] for s in d["job"]["stragglers"] or []}
    ranks = [r for r in tl["ranks"] if r["rank"] in strag]
    ranks += [r for r in tl["ranks"] if r["rank"] not in strag][: max(0, TIMELINE_RANKS - len(ranks))]
    ranks.sort(key=lambda r: r["rank"])
    H = len(ranks) * (2 * row_h + 6)
    first = ranks[0]
    shown = len(ranks)
    total = tl.get("ranks_total") or len(tl["ranks"])
    out = [f"<h2>Timeline of one step per rank</h2><p class='muted'>{escape(first['name'])} (the step whose slowest rank is slowest), "
           f"each rank's own GPU window; top row compute, bottom row communication; darker = busier"
           + (f"; {shown} of {escape(str(total))} ranks shown (stragglers first)" if shown < total else "") + "</p>"]
    # one CSS class per kernel class and per busy level keeps each cell's markup short
    style = "".join(f".k{i}{{fill:{KCLASS_COLOURS.get(c, '#999')}}}" for i, c in enumerate(classes))
    style += "".join(f".o{lv}{{fill-opacity:{0.25 + 0.75 * lv / 4:.2f}}}" for lv in range(5))
    out.append(f"<style>{style}</style>")
    out.append('<div class="legend">' + "".join(f'<span><i style="background:{KCLASS_COLOURS.get(c, "#999")}"></i>{escape(c)}</span>'
                                                 for c in classes) + "</div>")
    out.append(f'<svg id="step-timeline" viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="step timeline">')
    y = 0
    for r in ranks:
        out.append(f'<g><title>rank {escape(str(r["rank"]))}, {escape(r["name"])}: {escape(fmt_ns(r["dur_ns"]))}; a cell is '
                   f'{escape(fmt_ns(r["dur_ns"] // bins))}</title><text x="0" y="{y + row_h + 4}">rank {escape(str(r["rank"]))}</text>')
        for j, row in enumerate(r["rows"]):
            ry = y + j * (row_h + 1)
            out.append(f'<rect x="{label_w}" y="{ry}" width="{W - label_w}" height="{row_h}" fill="#f5f5f7"/>')
            i = 0
            busy, cls = row["busy"], row["kclass"]
            cells = min(bins, len(busy), len(cls))  # a saved report's rows may be shorter than its bins
            while i < cells:
                if cls[i] < 0:
                    i += 1
                    continue
                k = i
                level = round(busy[i] / 25)
                while k + 1 < cells and cls[k + 1] == cls[i] and round(busy[k + 1] / 25) == level:
                    k += 1
                out.append(f'<rect x="{label_w + i * cw:.1f}" y="{ry}" width="{(k - i + 1) * cw:.1f}" height="{row_h}" '
                           f'class="k{cls[i]} o{level}"/>')
                i = k + 1
        out.append("</g>")
        y += 2 * row_h + 6
    out.append("</svg>")
    return "".join(out)


WARNINGS_SHOWN = 500  # warnings listed in the page (all of them are in the embedded report)


def _warnings(d: dict[str, Any]) -> str:
    w = d["warnings"]
    if not w:
        return ""
    items = "".join(f"<li>{escape(str(x))}</li>" for x in w[:WARNINGS_SHOWN])
    more = f"; the first {WARNINGS_SHOWN} listed, all in the embedded JSON" if len(w) > WARNINGS_SHOWN else ""
    return (f"<h2 id='warnings'>Warnings</h2><details open><summary>{len(w)} warning(s): what is unknown, left out or "
            f"flagged{escape(more)}</summary><ul>{items}</ul></details>")


EMBED_PLAIN_MAX = 512 * 1024  # above this the embedded JSON is gzip + base64 (a 64-rank report: 2.8 MB -> 0.4 MB)


def embed_report(d: dict[str, Any]) -> str:
    """The report as a script element: plain JSON (``id="tracelens-report"``), or when large,
    gzip + base64 (``id="tracelens-report-gz"``); ``extract_report`` reads either back.  Keys
    sorted: the page is the same whatever the order of the keys in a saved report it re-renders."""
    raw = orjson.dumps(d, option=orjson.OPT_SORT_KEYS)
    if len(raw) <= EMBED_PLAIN_MAX:
        # "<", ">" and "&" only occur inside JSON strings: as \u003c ... nothing in the payload can end the script
        # or open a comment; U+2028/2029 (line breaks to a JavaScript parser) are escaped too
        payload = (raw.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
                   .replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029").decode())
        return f"<script type='application/json' id='tracelens-report'>{payload}</script>"
    packed = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode()
    return f"<script type='application/gzip+base64' id='tracelens-report-gz'>{packed}</script>"


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def content_security_policy(body: str) -> str:
    """The page's policy: nothing loads from anywhere (default-src 'none'), and the only script
    and style elements that run are the page's own, by the hash of their text; style attributes
    (the bars' widths) are allowed, scripts in attributes or injected elements never are."""
    styles = " ".join(dict.fromkeys(_sha256(css) for css in [asset("page.css"), *re.findall(r"<style>(.*?)</style>", body, re.S)]))
    return (f"default-src 'none'; script-src {_sha256(asset('page.js'))}; style-src {styles}; style-src-elem {styles}; "
            "style-src-attr 'unsafe-inline'; base-uri 'none'; form-action 'none'")


def extract_report(html: str | bytes) -> dict[str, Any] | None:
    """The report embedded in a tracelens HTML page, or None when there is none (bounded by
    tracelens.model.saved.max_report_bytes; a damaged one raises TraceInputError)."""
    from tracelens.model.saved import embedded_json, max_report_bytes

    data = embedded_json("the HTML page", html.encode() if isinstance(html, str) else html, max_report_bytes())
    return None if data is None else orjson.loads(data)


def render_html(d: dict[str, Any], comparison: dict[str, Any] | None = None) -> bytes:
    """The whole page.  ``comparison`` (tracelens.render.compare.compare) adds a 'what changed' section."""
    from tracelens.render.compare import html_section
    from tracelens.render.html.nccl import section as nccl_section

    embedded = embed_report(d)  # the report as it is; what the page shows has no control characters
    d = views.printable_report(d)
    comparison = views.printable_report(comparison) if comparison else comparison
    h = views.headline(d)
    title = f"tracelens report: {h['ranks']} rank(s), {h['device'] or 'unknown GPU'}"
    inputs = ", ".join(i["path"] for i in d["inputs"][:4]) + (f" and {len(d['inputs']) - 4} more" if len(d["inputs"]) > 4 else "")
    body = [
        f"<h1>{escape(title)}</h1>",
        f"<div class='muted'>{escape(inputs)} · tracelens {escape(d['tool']['version'])} · report schema {escape(str(d['schema_version']))}</div>",
        nccl_section(d) if nccl_views.nccl_only(d) else "",
        _summary(d),
        html_section(comparison) if comparison else "",
        _waterfall(d),
        _suggestions(d),
        _ranks(d),
        _steps_chart(d),
        _kernels(d),
        _comm(d),
        _critical_path(d),
        _pipeline(d),
        "" if nccl_views.nccl_only(d) else nccl_section(d),
        _timeline(d),
        _warnings(d),
    ]
    content = "".join(body)
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{content_security_policy(content)}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{asset('page.css')}</style></head><body>"
        + content
        + embedded + f"<script>{asset('page.js')}</script></body></html>\n"
    )
    return page.encode()


class HtmlRenderer:
    """The self-contained HTML page (``render_html``); a ``comparison`` key in the report
    (``tracelens report --compare``) adds the 'what changed' section."""

    name = "html"
    suffixes = (".html", ".htm")

    def render(self, report: dict[str, Any]) -> bytes:
        return render_html(report, report.get("comparison"))


RENDERER = HtmlRenderer()
