"""Run-to-run comparison of two reports (a baseline and a new run): MFU, step time, each
waterfall bar, and the kernels, matmul shapes and collectives that changed most.

Runs may differ in rank and step counts, so times are compared per rank-step (a kernel's
total time over the kept steps of every rank, divided by their number).  Signs: a positive
time delta is slower (worse); a positive MFU delta is better.  Reads two report dicts only.
"""

from __future__ import annotations

from html import escape
from typing import Any

from tracelens.model.summary import kept_steps
from tracelens.model.units import fmt_ns, fmt_pct, fmt_points
from tracelens.render import tables as views


def _rank_steps(d: dict[str, Any]) -> int:
    return sum(len(kept_steps(r["steps"])) for r in d["ranks"]) or 1


def _bars(d: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """The job's bars of ``kind``: its MFU waterfall, or its GPU-time waterfall (from the GPU-time
    partition when the report carries the MFU waterfall instead)."""
    bars, has = views.waterfall(d)
    if has != kind:
        bars = views.time_bars(d["job"]["gpu_time_ns"], views.sum_idle(d["ranks"]))
    return {b["key"]: b for b in bars}


def _gpus(d: dict[str, Any]) -> list[str]:
    """The GPUs a run's ranks ran on: the peak table's model (from the MFU, else looked up from
    the device name, else the name itself) with the dense peak the MFU used; "unknown GPU"."""
    from tracelens.model import gpus

    out = []
    for r in d["ranks"]:
        name = r["device"].get("name")
        spec = gpus.lookup(name) if (name and not r["mfu"].get("gpu_model")) else None
        model = r["mfu"].get("gpu_model") or (spec.name if spec else name)
        model = model if model and model != gpus.USER_PEAK else "unknown GPU"
        peak = r["mfu"].get("peak_flops")
        label = model + (f" ({peak / 1e12:,.0f} TFLOP/s)" if peak else "")
        if label not in out:
            out.append(label)
    return out


def _warnings(base: dict[str, Any], new: dict[str, Any], bars: tuple[dict, dict]) -> list[str]:
    """What makes the two runs not like for like; ``bars``: the two runs' waterfall bars."""
    out = []
    for run, got in (("baseline", bars[0]), ("new run", bars[1])):
        if not got:
            out.append(f"the {run} has no GPU-time waterfall (no GPU activity in its window): the waterfall bars are not compared")
    bg, ng = _gpus(base), _gpus(new)
    models = lambda g: {x.split(" (")[0] for x in g}  # noqa: E731
    known_b, known_n = models(bg) - {"unknown GPU"}, models(ng) - {"unknown GPU"}
    if known_b and known_n and known_b != known_n:
        out.append(f"the runs are on different GPUs (baseline: {', '.join(bg[:4])}; now: {', '.join(ng[:4])}): "
                   "step times and MFU compare different hardware")
    elif known_b and known_b == known_n and bg != ng:
        out.append(f"the runs' MFUs use different peaks (baseline: {', '.join(bg[:4])}; now: {', '.join(ng[:4])}): "
                   "MFU points are not comparable")
    if "unknown GPU" in models(bg) | models(ng):
        out.append("the GPU of " + ("both runs" if "unknown GPU" in models(bg) & models(ng) else
                                    "the baseline" if "unknown GPU" in models(bg) else "this run")
                   + " is unknown: they may not be on the same hardware")
    return out


def _changes(base: dict[str, float], new: dict[str, float], labels: dict[str, str], top: int,
             truncated: tuple[bool, bool] = (False, False)) -> list[dict[str, Any]]:
    """Per key: baseline and new time, the delta, and whether it is new, gone or changed.  A key
    missing from a side whose table was cut at its top N may just be below that side's cut: its
    delta is then unknown (null, "outside_top" status) rather than counted from zero."""
    out = []
    for k in set(base) | set(new):
        b, n = base.get(k), new.get(k)
        if (b is None and truncated[0]) or (n is None and truncated[1]):
            out.append({"key": k, "label": labels.get(k, k), "base_ns": b, "new_ns": n, "delta_ns": None, "status": "outside_top"})
            continue
        delta = (n or 0.0) - (b or 0.0)
        out.append({"key": k, "label": labels.get(k, k), "base_ns": b, "new_ns": n, "delta_ns": delta,
                    "status": "new" if b is None else "gone" if n is None else "changed"})
    out.sort(key=lambda c: (c["delta_ns"] is None, -abs(c["delta_ns"] or 0.0), c["key"]))
    return out[:top]


LEGACY_CAPS = {"kernels": 30, "matmul_efficiency": 20}  # per-rank table sizes of reports saved before the totals were recorded


def _cut(d: dict[str, Any], key: str) -> bool:
    """Whether the table ``key`` the comparison reads was cut: never for kernels when the report
    has ``job.kernels`` (every name); else whether a rank's table has fewer rows than its total
    says (a report without the total: as many rows as the cut of the time)."""
    if key == "kernels" and d["job"].get("kernels") is not None:
        return False
    for r in d["ranks"]:
        total = r.get(f"{key}_total")
        if isinstance(total, dict):
            total = total.get("names")
        if (len(r[key]) < total) if total is not None else (len(r[key]) >= LEGACY_CAPS[key]):
            return True
    return False


def compare(base: dict[str, Any], new: dict[str, Any], top: int = 15) -> dict[str, Any]:
    kind = "mfu" if views.waterfall(base)[1] == views.waterfall(new)[1] == "mfu" else "time"
    bb, nb = _bars(base, kind), _bars(new, kind)
    # a bar one waterfall lacks is 0 of that window; a run with no waterfall at all (no GPU
    # activity: a CPU-only trace) has no shares, so no bar is compared (it once read 19% -> -,
    # "-19 points, worse" for every bar)
    bars = [{"key": k, "label": (nb.get(k) or bb.get(k))["label"], "base": bb[k]["fraction"] if k in bb else None,
             "new": nb[k]["fraction"] if k in nb else None,
             "delta": (nb[k]["fraction"] if k in nb else 0.0) - (bb[k]["fraction"] if k in bb else 0.0)}
            for k in list(dict.fromkeys([*bb, *nb]))] if bb and nb else []
    bs, ns = views.step_stats(base), views.step_stats(new)
    brs, nrs = _rank_steps(base), _rank_steps(new)

    def per(d: dict[str, Any], rows: list[dict[str, Any]], key, value: str, n: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in rows:
            k = key(r)
            out[k] = out.get(k, 0.0) + (r[value] or 0) / n
        return out

    kernels = _changes(per(base, views.kernel_rows(base), lambda r: r["name"], "total_ns", brs),
                       per(new, views.kernel_rows(new), lambda r: r["name"], "total_ns", nrs), {}, top,
                       (_cut(base, "kernels"), _cut(new, "kernels")))
    classes = _changes(per(base, views.class_rows(base), lambda r: r["kclass"], "total_ns", brs),
                       per(new, views.class_rows(new), lambda r: r["kclass"], "total_ns", nrs), {}, top)
    mm_key = lambda m: f"{m['op']} {m['shapes']} {m['dtype']}"  # noqa: E731
    matmuls = _changes(per(base, views.matmul_rows(base), mm_key, "kernel_ns", brs),
                       per(new, views.matmul_rows(new), mm_key, "kernel_ns", nrs), {}, top,
                       (_cut(base, "matmul_efficiency"), _cut(new, "matmul_efficiency")))
    coll_key = lambda g: f"{g['group_desc'] or g['group'] or '?'} {g['collective']}"  # noqa: E731
    colls = _changes(per(base, views.comm_rows(base), coll_key, "time_ns", brs),
                     per(new, views.comm_rows(new), coll_key, "time_ns", nrs), {}, top)
    bm, nm = base["job"]["mfu"], new["job"]["mfu"]
    return {
        "base": {"inputs": [i["path"] for i in base["inputs"]], "ranks": len(base["ranks"]), "rank_steps": brs},
        "new": {"inputs": [i["path"] for i in new["inputs"]], "ranks": len(new["ranks"]), "rank_steps": nrs},
        "mfu": {"base": bm, "new": nm, "delta": (nm - bm) if (bm is not None and nm is not None) else None},
        "step_time_ns": {k: {"base": bs[k], "new": ns[k], "delta": (ns[k] - bs[k]) if (bs[k] is not None and ns[k] is not None) else None,
                             "ratio": (ns[k] / bs[k]) if (bs[k] and ns[k] is not None) else None} for k in ("mean", "p50", "max")},
        "warnings": _warnings(base, new, (bb, nb)),
        "gpus": {"base": _gpus(base), "new": _gpus(new)},
        "waterfall_kind": kind,
        "waterfall": bars,
        "kernel_classes": classes,
        "kernels": kernels,
        "matmuls": matmuls,
        "collectives": colls,
    }


def _dir(delta: float | None, better_when_up: bool, shown: str | None = None) -> str:
    """better / worse / same; "same" too when the change as ``shown`` rounds to zero (0.00 points
    is not a change, whatever the last bits say)."""
    if delta is None or delta == 0 or (shown is not None and not shown.strip("+-0.%")):
        return "same"
    return "better" if (delta > 0) == better_when_up else "worse"


def _share(v: float | None) -> str:
    """A bar's share on one side; "-" where that run has no such bar."""
    return "-" if v is None else fmt_pct(v, 2)


def text_section(c: dict[str, Any]) -> str:
    lines = [f"compared with the baseline ({c['base']['ranks']} rank(s), {c['base']['rank_steps']} rank-steps; "
             f"now {c['new']['ranks']} rank(s), {c['new']['rank_steps']} rank-steps):"]
    for w in c.get("warnings", []):
        lines.append(f"  warning: {w}")
    m = c["mfu"]
    if m["delta"] is not None:
        pts = fmt_points(m["delta"])
        lines.append(f"  MFU {fmt_pct(m['base'], 2)} -> {fmt_pct(m['new'], 2)} ({pts} points, {_dir(m['delta'], True, pts)})")
    st = c["step_time_ns"]["mean"]
    if st["delta"] is not None:
        pct = fmt_points(st["ratio"] - 1, 1) + "%" if st["ratio"] is not None else "-"
        lines.append(f"  step time (mean) {fmt_ns(st['base'])} -> {fmt_ns(st['new'])} ({pct}, {_dir(-st['delta'], True, pct)})")
    moved = [b for b in c["waterfall"] if abs(b["delta"]) >= 0.001]
    if moved:
        lines.append("  waterfall bars (share of the window, points):")
        for b in sorted(moved, key=lambda b: -abs(b["delta"])):
            good = b["key"] in views.FINAL_KEYS
            pts = fmt_points(b["delta"])
            lines.append(f"    {b['label'][:40]:<40} {_share(b['base']):>7} -> {_share(b['new']):>7}  {pts:>6}  {_dir(b['delta'], good, pts)}")
    for key, title in (("kernels", "kernels"), ("matmuls", "matmul shapes"), ("collectives", "collectives")):
        rows = [r for r in c[key] if r["delta_ns"]][:8]  # outside_top rows (delta unknown) are left out
        if rows:
            lines.append(f"  {title} that changed most (time per rank-step):")
            for r in rows:
                lines.append(f"    {fmt_ns(int(r['base_ns'] or 0)):>10} -> {fmt_ns(int(r['new_ns'] or 0)):>10}  "
                             f"{'+' if r['delta_ns'] > 0 else '-'}{fmt_ns(int(abs(r['delta_ns'])))}  [{r['status']}] {r['label'][:90]}")
    return "\n".join(lines) + "\n"


def html_section(c: dict[str, Any]) -> str:
    def cls(d: float | None, up_good: bool, shown: str | None = None) -> str:
        return {"better": "delta-up", "worse": "delta-down"}.get(_dir(d, up_good, shown), "muted")

    out = ["<h2 id='comparison'>What changed against the baseline</h2>",
           f"<p class='muted'>baseline: {escape(', '.join(map(str, c['base']['inputs'][:3])))} ({escape(str(c['base']['ranks']))} ranks); "
           f"times per rank-step, so runs with different rank counts compare</p><ul>"]
    for w in c.get("warnings", []):
        out.append(f"<li class='bad'>{escape(str(w))}</li>")
    m = c["mfu"]
    if m["delta"] is not None:
        pts = fmt_points(m["delta"])
        out.append(f"<li>MFU {escape(fmt_pct(m['base'], 2))} → <b>{escape(fmt_pct(m['new'], 2))}</b> "
                   f"<span class='{cls(m['delta'], True, pts)}'>({escape(pts)} points)</span></li>")
    st = c["step_time_ns"]["mean"]
    if st["delta"] is not None:
        pct = fmt_points(st["ratio"] - 1, 1) + "%" if st["ratio"] is not None else "-"
        out.append(f"<li>step time {escape(fmt_ns(st['base']))} → <b>{escape(fmt_ns(st['new']))}</b> "
                   f"<span class='{cls(-st['delta'], True, pct)}'>({escape(pct)})</span></li>")
    out.append("</ul><table id='compare-waterfall'><thead><tr><th>bar</th><th class='n'>baseline</th><th class='n'>now</th>"
               "<th class='n'>change</th></tr></thead><tbody>")
    for b in c["waterfall"]:
        good = b["key"] in views.FINAL_KEYS
        pts = fmt_points(b["delta"])
        arrow = {"same": ""}.get(_dir(b["delta"], True, pts), "▲" if b["delta"] > 0 else "▼")
        out.append(f"<tr><td>{escape(b['label'])}</td><td class='n'>{escape(_share(b['base']))}</td><td class='n'>{escape(_share(b['new']))}</td>"
                   f"<td class='n {cls(b['delta'], good, pts)}'>{escape(pts)} pts {arrow}</td></tr>")
    out.append("</tbody></table>")
    for key, title in (("kernel_classes", "kernel classes"), ("kernels", "kernels"), ("matmuls", "matmul shapes"), ("collectives", "collectives")):
        rows = [r for r in c[key] if r["delta_ns"]]  # outside_top rows (delta unknown) are left out
        if not rows:
            continue
        out.append(f"<details open><summary>{escape(title)} that changed most (time per rank-step)</summary><table><thead><tr><th>{escape(title)}</th>"
                   "<th class='n'>baseline</th><th class='n'>now</th><th class='n'>change</th><th></th></tr></thead><tbody>")
        for r in rows:
            out.append(f"<tr><td class='name'>{escape(r['label'][:200])}</td><td class='n'>{escape(fmt_ns(int(r['base_ns'] or 0)))}</td>"
                       f"<td class='n'>{escape(fmt_ns(int(r['new_ns'] or 0)))}</td><td class='n {cls(-r['delta_ns'], True)}'>"
                       f"{'+' if r['delta_ns'] > 0 else '−'}{escape(fmt_ns(int(abs(r['delta_ns']))))}</td><td>{escape(str(r['status']))}</td></tr>")
        out.append("</tbody></table></details>")
    return "".join(out)
