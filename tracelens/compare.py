"""Run-to-run comparison of two reports (a baseline and a new run): MFU, step time, each
waterfall bar, and the kernels, matmul shapes and collectives that changed most.

Runs may differ in rank and step counts, so times are compared per rank-step (a kernel's
total time over the kept steps of every rank, divided by their number).  Signs: a positive
time delta is slower (worse); a positive MFU delta is better.  Reads two report dicts only.
"""

from __future__ import annotations

from html import escape
from typing import Any

from tracelens import views
from tracelens.units import fmt_ns


def _rank_steps(d: dict[str, Any]) -> int:
    return sum(len([s for s in r["steps"] if not s["warmup"]] or r["steps"]) for r in d["ranks"]) or 1


def _bars(d: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    if kind == "mfu":
        bars = d["job"]["waterfall"]
    else:
        bars = views.time_bars(d["job"]["gpu_time_ns"], views.sum_idle(d["ranks"]))
    return {b["key"]: b for b in bars}


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


def _cut(d: dict[str, Any], key: str, cap: int) -> bool:
    """Whether any rank's table ``key`` was cut at ``cap`` rows."""
    return any(len(r[key]) >= cap for r in d["ranks"])


def compare(base: dict[str, Any], new: dict[str, Any], top: int = 15) -> dict[str, Any]:
    kind = "mfu" if (base["job"]["waterfall"] and new["job"]["waterfall"]) else "time"
    bb, nb = _bars(base, kind), _bars(new, kind)
    bars = [{"key": k, "label": (nb.get(k) or bb.get(k))["label"], "base": bb[k]["fraction"] if k in bb else None,
             "new": nb[k]["fraction"] if k in nb else None,
             "delta": (nb[k]["fraction"] if k in nb else 0.0) - (bb[k]["fraction"] if k in bb else 0.0)}
            for k in list(dict.fromkeys([*bb, *nb]))]
    bs, ns = views.step_stats(base), views.step_stats(new)
    brs, nrs = _rank_steps(base), _rank_steps(new)

    def per(d: dict[str, Any], rows: list[dict[str, Any]], key, value: str, n: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in rows:
            k = key(r)
            out[k] = out.get(k, 0.0) + (r[value] or 0) / n
        return out

    from tracelens.kernels import KERNELS_TOP, MATMULS_TOP

    kernels = _changes(per(base, views.kernel_rows(base), lambda r: r["name"], "total_ns", brs),
                       per(new, views.kernel_rows(new), lambda r: r["name"], "total_ns", nrs), {}, top,
                       (_cut(base, "kernels", KERNELS_TOP), _cut(new, "kernels", KERNELS_TOP)))
    classes = _changes(per(base, views.class_rows(base), lambda r: r["kclass"], "total_ns", brs),
                       per(new, views.class_rows(new), lambda r: r["kclass"], "total_ns", nrs), {}, top)
    mm_key = lambda m: f"{m['op']} {m['shapes']} {m['dtype']}"  # noqa: E731
    matmuls = _changes(per(base, views.matmul_rows(base), mm_key, "kernel_ns", brs),
                       per(new, views.matmul_rows(new), mm_key, "kernel_ns", nrs), {}, top,
                       (_cut(base, "matmul_efficiency", MATMULS_TOP), _cut(new, "matmul_efficiency", MATMULS_TOP)))
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
        "waterfall_kind": kind,
        "waterfall": bars,
        "kernel_classes": classes,
        "kernels": kernels,
        "matmuls": matmuls,
        "collectives": colls,
    }


def _dir(delta: float | None, better_when_up: bool) -> str:
    if delta is None or delta == 0:
        return "same"
    return "better" if (delta > 0) == better_when_up else "worse"


def text_section(c: dict[str, Any]) -> str:
    lines = [f"compared with the baseline ({c['base']['ranks']} rank(s), {c['base']['rank_steps']} rank-steps; "
             f"now {c['new']['ranks']} rank(s), {c['new']['rank_steps']} rank-steps):"]
    m = c["mfu"]
    if m["delta"] is not None:
        lines.append(f"  MFU {100 * m['base']:.2f}% -> {100 * m['new']:.2f}% ({100 * m['delta']:+.2f} points, {_dir(m['delta'], True)})")
    st = c["step_time_ns"]["mean"]
    if st["delta"] is not None:
        lines.append(f"  step time (mean) {fmt_ns(st['base'])} -> {fmt_ns(st['new'])} ({100 * (st['ratio'] - 1):+.1f}%, "
                     f"{_dir(-st['delta'], True)})")
    moved = [b for b in c["waterfall"] if abs(b["delta"]) >= 0.001]
    if moved:
        lines.append("  waterfall bars (share of the window, points):")
        for b in sorted(moved, key=lambda b: -abs(b["delta"])):
            good = b["key"] in ("mfu", "compute")
            lines.append(f"    {b['label']:<40} {100 * (b['base'] or 0):6.2f}% -> {100 * (b['new'] or 0):6.2f}%  "
                         f"{100 * b['delta']:+6.2f}  {_dir(b['delta'], good)}")
    for key, title in (("kernels", "kernels"), ("matmuls", "matmul shapes"), ("collectives", "collectives")):
        rows = [r for r in c[key] if r["delta_ns"]][:8]  # outside_top rows (delta unknown) are left out
        if rows:
            lines.append(f"  {title} that changed most (time per rank-step):")
            for r in rows:
                lines.append(f"    {fmt_ns(int(r['base_ns'] or 0)):>10} -> {fmt_ns(int(r['new_ns'] or 0)):>10}  "
                             f"{'+' if r['delta_ns'] > 0 else '-'}{fmt_ns(int(abs(r['delta_ns'])))}  [{r['status']}] {r['label'][:90]}")
    return "\n".join(lines) + "\n"


def html_section(c: dict[str, Any]) -> str:
    def cls(d: float | None, up_good: bool) -> str:
        return {"better": "delta-up", "worse": "delta-down"}.get(_dir(d, up_good), "muted")

    out = ["<h2 id='comparison'>What changed against the baseline</h2>",
           f"<p class='muted'>baseline: {escape(', '.join(c['base']['inputs'][:3]))} ({c['base']['ranks']} ranks); "
           f"times per rank-step, so runs with different rank counts compare</p><ul>"]
    m = c["mfu"]
    if m["delta"] is not None:
        out.append(f"<li>MFU {100 * m['base']:.2f}% → <b>{100 * m['new']:.2f}%</b> "
                   f"<span class='{cls(m['delta'], True)}'>({100 * m['delta']:+.2f} points)</span></li>")
    st = c["step_time_ns"]["mean"]
    if st["delta"] is not None:
        out.append(f"<li>step time {escape(fmt_ns(st['base']))} → <b>{escape(fmt_ns(st['new']))}</b> "
                   f"<span class='{cls(-st['delta'], True)}'>({100 * (st['ratio'] - 1):+.1f}%)</span></li>")
    out.append("</ul><table id='compare-waterfall'><thead><tr><th>bar</th><th class='n'>baseline</th><th class='n'>now</th>"
               "<th class='n'>change</th></tr></thead><tbody>")
    for b in c["waterfall"]:
        good = b["key"] in ("mfu", "compute")
        out.append(f"<tr><td>{escape(b['label'])}</td><td class='n'>{100 * (b['base'] or 0):.2f}%</td><td class='n'>{100 * (b['new'] or 0):.2f}%</td>"
                   f"<td class='n {cls(b['delta'], good)}'>{100 * b['delta']:+.2f} pts {'▲' if b['delta'] > 0 else '▼' if b['delta'] < 0 else ''}</td></tr>")
    out.append("</tbody></table>")
    for key, title in (("kernel_classes", "kernel classes"), ("kernels", "kernels"), ("matmuls", "matmul shapes"), ("collectives", "collectives")):
        rows = [r for r in c[key] if r["delta_ns"]]  # outside_top rows (delta unknown) are left out
        if not rows:
            continue
        out.append(f"<details open><summary>{title} that changed most (time per rank-step)</summary><table><thead><tr><th>{title}</th>"
                   "<th class='n'>baseline</th><th class='n'>now</th><th class='n'>change</th><th></th></tr></thead><tbody>")
        for r in rows:
            out.append(f"<tr><td class='name'>{escape(r['label'][:200])}</td><td class='n'>{escape(fmt_ns(int(r['base_ns'] or 0)))}</td>"
                       f"<td class='n'>{escape(fmt_ns(int(r['new_ns'] or 0)))}</td><td class='n {cls(-r['delta_ns'], True)}'>"
                       f"{'+' if r['delta_ns'] > 0 else '−'}{escape(fmt_ns(int(abs(r['delta_ns']))))}</td><td>{r['status']}</td></tr>")
        out.append("</tbody></table></details>")
    return "".join(out)
