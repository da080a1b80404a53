"""What the front ends show, computed once from the JSON report (DESIGN.md 5).

The terminal UI and the HTML report both call these functions on ``Analysis.to_dict()`` (or
on a saved report), so the two can never disagree: a number on screen is a number in the
report.  Everything here is plain data (dicts and lists); no Textual, no polars.
"""

from __future__ import annotations

import re
from typing import Any

from tracelens.model.printable import REPLACEMENT, printable, printable_json, printable_report  # noqa: F401 (re-exported for the front ends)
from tracelens.model.summary import kept_steps
from tracelens.model.units import fmt_ns, fmt_pct

# One colour per cause (waterfall bars) and per kernel class (timeline), shared by the TUI and
# the HTML report.  Idle causes are greys/oranges, communication red, compute blues/greens.
BAR_COLOURS: dict[str, str] = {
    "idle_data_loading": "#e5a50a",
    "idle_host_launch": "#f6d32d",
    "idle_sync": "#ff7800",
    "idle_launch_latency": "#c88800",
    "idle_other": "#9a9996",
    "pipeline_bubble": "#c061cb",
    "exposed_comm": "#e01b24",
    "exposed_memcpy": "#f66151",
    "recompute": "#986a44",
    "non_matmul": "#2ec27e",
    "matmul_below_peak": "#3584e4",
    "flop_convention": "#77767b",
    "mfu": "#33d17a",
    "compute": "#3584e4",
}
# one colour per kernel class, no two alike (CIE76 distance >= 25, distinct in 256 colours:
# tests/test_kclass.py): blue GEMM, cyan conv, purple attention, red comm, yellow/amber copies
# and fills, greens for norms, reductions and elementwise, orange optimizer
KCLASS_COLOURS: dict[str, str] = {
    "gemm": "#3584e4",
    "conv": "#17becf",
    "attention": "#9141ac",
    "comm": "#e01b24",
    "memcpy": "#f6d32d",
    "memset": "#a56a00",
    "moe_routing": "#ff5fa2",
    "embedding": "#8a8a00",
    "norm": "#2ec27e",
    "softmax_reduce": "#0f6b5a",
    "elementwise": "#a8e05f",
    "optimizer": "#ff7800",
    "cast_quant": "#99c1f1",
    "copy": "#cdab8f",
    "other": "#77767b",
    "busy": "#c0bfbc",  # the union of a rank's streams
}

_TIME_BARS = (
    ("idle_data_loading", "idle: data loading", "data_loading"),
    ("idle_host_launch", "idle: host launch overhead", "host_launch"),
    ("idle_sync", "idle: host sync drain", "sync"),
    ("idle_launch_latency", "idle: launch latency / dependencies", "launch_latency"),
    ("idle_other", "idle: other", "other"),
    ("pipeline_bubble", "pipeline bubble", "pipeline_bubble"),
)


def time_bars(gpu: dict[str, int] | None, idle: dict[str, int] | None) -> list[dict[str, Any]]:
    """Without an MFU (unknown GPU, no FLOPs): the GPU-time partition as bars that end at the
    compute share instead of the MFU.  Same keys as the waterfall's time bars."""
    if not gpu or idle is None:
        return []
    window = gpu["idle"] + gpu["compute"] + gpu["exposed_comm"] + gpu["exposed_memcpy"]
    if window <= 0:
        return []
    bars = [(key, label, idle.get(k, 0)) for key, label, k in _TIME_BARS]
    bars += [
        ("exposed_comm", "exposed communication", gpu["exposed_comm"]),
        ("exposed_memcpy", "exposed memcpy / memset", gpu["exposed_memcpy"]),
        ("compute", "compute (MFU unknown)", gpu["compute"]),
    ]
    return [{"key": k, "label": lb, "ns": ns, "fraction": ns / window, "parts": []} for k, lb, ns in bars]


def evidence_value(ev: dict[str, Any]):
    """How to show a suggestion's numbers: a share as a percentage, a count as it is."""
    if ev.get("unit", "share") == "share":
        return fmt_pct
    return lambda v: "-" if v is None else f"{v:g}"


def fmt_speedup(s: float | None) -> str:
    """An estimated speed-up as people say it: "12%" below 1.5x, "4.3x" above."""
    if s is None:
        return "-"
    return f"{s:.1f}x" if s >= 1.5 else f"{100 * (s - 1):.0f}%"


def sum_idle(ranks: list[dict[str, Any]]) -> dict[str, int] | None:
    idles = [r["idle_ns"] for r in ranks if r.get("idle_ns")]
    if not idles:
        return None
    return {k: sum(i.get(k, 0) for i in idles) for k in idles[0]}


def bars_kind(bars: list[dict[str, Any]]) -> str:
    """"mfu" for an MFU waterfall (its last bar is the MFU), "time" for the GPU-time waterfall
    (its last bar is the compute share, FLOP efficiency unknown)."""
    return "mfu" if bars and bars[-1]["key"] == "mfu" else "time"


def _bars_of(where: dict[str, Any], gpu: dict[str, int] | None, idle: dict[str, int] | None) -> tuple[list[dict[str, Any]], str]:
    bars = where["waterfall"]
    if bars:
        return bars, bars_kind(bars)
    return time_bars(gpu, idle), "time"  # a report saved before the GPU-time waterfall was in the JSON


def waterfall(report: dict[str, Any], rank: int | None = None, step: int | None = None) -> tuple[list[dict[str, Any]], str]:
    """The bars to draw and what they are: ("mfu", the MFU waterfall) or ("time", the GPU-time
    waterfall when the MFU is unknown).  ``rank``/``step`` narrow it to one rank or step."""
    if rank is None:
        return _bars_of(report["job"], report["job"]["gpu_time_ns"], sum_idle(report["ranks"]))
    r = rank_by_id(report, rank)
    if r is None:
        return [], "time"
    if step is None:
        return _bars_of(r, r["gpu_time_ns"], r["idle_ns"])
    s = next((s for s in r["steps"] if s["step"] == step), None)
    if s is None:
        return [], "time"
    return _bars_of(s, s["gpu_time_ns"], s["idle_ns"])


def waterfall_title(kind: str, what: str = "") -> str:
    """The chart's title, the same in every front end (``what``: " of rank 3", ...)."""
    if kind == "mfu":
        return f"MFU loss waterfall{what}: from 100% of the GPU's dense peak down to the MFU"
    return f"GPU-time waterfall{what} (MFU unknown): it ends at the compute share, FLOP efficiency unknown"


PARTS_SHOWN = 4  # sub-rows per bar in every front end; the rest are summed in one "… more" row
FINAL_KEYS = ("mfu", "compute")  # the bar a waterfall ends at


def waterfall_layout(bars: list[dict[str, Any]], parts: int = PARTS_SHOWN) -> list[dict[str, Any]]:
    """The rows every front end draws for a waterfall, in order: per bar its key, label, ns,
    fraction, ``start`` (where it begins on the 0..1 axis: loss bars walk from 0 rightwards, each
    from where the previous ended, a negative bar leftwards; the final bar ends at 1), whether
    it is the ``final`` bar, and its sub-rows: the first ``parts`` of its parts (as the report
    orders them) and, when two or more are left, one row summing those, each with its own start
    inside the bar.  Labels and keys come from the report, so a new bar or part shows
    everywhere without a change here."""
    rows = []
    level = 0.0
    for b in bars:
        f = b["fraction"]
        final = b["key"] in FINAL_KEYS and b is bars[-1]
        start = 1.0 - f if final else level
        subs = []
        ps = b.get("parts") or []
        shown = ps[:parts] if len(ps) > parts + 1 else ps  # one part more is shown, not summed
        if len(shown) < len(ps):
            rest = ps[parts:]
            shown = shown + [{"key": "", "label": f"… {len(rest)} more", "ns": sum(p["ns"] for p in rest),
                              "fraction": sum(p["fraction"] for p in rest)}]
        pstart = start
        for p in shown:
            subs.append({"key": p["key"], "label": p["label"], "ns": p["ns"], "fraction": p["fraction"], "start": pstart})
            pstart += p["fraction"]
        rows.append({"key": b["key"], "label": b["label"], "ns": b["ns"], "fraction": f, "start": start, "final": final,
                     "parts": subs, "note": b.get("note")})
        if not final:
            level += f
    return rows


EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar_cells(start: float, frac: float, width: int) -> tuple[int, str]:
    """A bar of a chart ``width`` cells wide, from ``start`` to ``start + frac`` (fractions of the
    width; leftwards when ``frac`` < 0), as (blank cells before it, its glyphs).  The length is
    the fraction in eighths of a cell (at least one eighth, so no non-zero bar vanishes), drawn
    from the cell its start falls in: a bar is never wider than a larger one, wherever it lies
    (a terminal cannot start a glyph mid-cell).  A negative bar is drawn in ░, whole cells."""
    if width <= 0 or frac == 0 or frac != frac:
        return 0, ""
    # what a saved report says may lie outside the chart: the same cells as at its edge
    frac, start = max(-1.0, min(1.0, frac)), (max(-1.0, min(2.0, start)) if start == start else 0.0)
    lo = start + min(frac, 0.0)
    eighths = max(1, round(abs(frac) * width * 8))
    lead = min(max(0, int(lo * width)), width - 1)
    eighths = min(eighths, (width - lead) * 8)
    if frac < 0:
        return lead, "░" * max(1, -(-eighths // 8))
    full, rem = divmod(eighths, 8)
    return lead, "█" * full + (EIGHTHS[rem] if rem else "")


def rank_by_id(report: dict[str, Any], rank: int) -> dict[str, Any] | None:
    return next((r for r in report["ranks"] if r["rank"] == rank), None)


def _kept(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return kept_steps(steps)


def _share(part: int | None, whole: int | None) -> float | None:
    return part / whole if (part is not None and whole) else None


def shows_sources(report: dict[str, Any]) -> bool:
    """Whether the per-rank tables name each rank's source (its input's format): when any rank
    is not a Kineto trace (an nsys export, a job of both); a Kineto job's tables are unchanged."""
    return any(i.get("format", "kineto") != "kineto" for i in report.get("inputs") or ())


def rank_source(report: dict[str, Any], path: str) -> str | None:
    """The format of the input that fed a rank (``inputs[].format``), by its path."""
    return next((i.get("format") for i in report.get("inputs") or () if i.get("path") == path), None)


def rank_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank: its source (the input's format), device, steps, mean step time, MFU,
    idle / exposed comm / bubble shares of the window, and whether the rank is a straggler."""
    stragglers = {s["rank"] for s in report["job"]["stragglers"] or []}
    fmt = {i.get("path"): i.get("format") for i in report.get("inputs") or ()}
    rows = []
    for r in report["ranks"]:
        kept = _kept(r["steps"])
        g, w = r["gpu_time_ns"], r["window_ns"]
        rows.append({
            "rank": r["rank"],
            "device": device_label(r),
            "steps": len(r["steps"]),
            "step_ns": sum(s["dur_ns"] for s in kept) // len(kept) if kept else None,
            "mfu": r["mfu"]["value"],
            "idle": _share(g["idle"], w) if g else None,
            "exposed_comm": _share(g["exposed_comm"], w) if g else None,
            "bubble": r["pipeline"]["bubble_fraction"],
            "straggler": r["rank"] in stragglers,
            "path": r["path"],
            "source": fmt.get(r["path"]),
        })
    return rows


def step_rows(report: dict[str, Any], rank: int | None = None) -> list[dict[str, Any]]:
    """One row per (rank, step)."""
    rows = []
    for r in report["ranks"]:
        if rank is not None and r["rank"] != rank:
            continue
        for s in r["steps"]:
            g = s["gpu_time_ns"]
            dl = s["data_loading"]
            rows.append({
                "rank": r["rank"],
                "step": s["step"],
                "name": s["name"],
                "dur_ns": s["dur_ns"],
                "start_ns": s["start_ns"],
                "kernels": s["kernels"],
                "idle": _share(g["idle"], s["dur_ns"]) if g else None,
                "exposed_comm": _share(g["exposed_comm"], s["dur_ns"]) if g else None,
                "data": dl["fraction"] if dl else None,
                "mfu": s["mfu"],
                "warmup": s["warmup"],
            })
    return rows


def kernel_table_title(report: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> str:
    """The kernel table's title with its true size: the kernel names and launches over all ranks
    (``rows``: ``kernel_rows(report)`` when already made), and, for a report without
    ``job.kernels`` whose ranks' tables were cut (``kernels_total`` says how many they had), how."""
    rows = kernel_rows(report) if rows is None else rows
    launches = sum(k["count"] for k in rows)
    cut = [] if report["job"].get("kernels") is not None else [
        r for r in report["ranks"] if (r.get("kernels_total") or {}).get("names", 0) > len(r["kernels"])]
    title = f"kernels by name, all ranks: {len(rows):,} names, {launches:,} launches"
    if cut:
        total = sum(r["kernels_total"]["names"] for r in cut)
        kept = sum(len(r["kernels"]) for r in cut)
        title += (f" (the longest {kept:,} of {total:,} names kept on {len(cut)} rank(s): "
                  "the totals of the rest are not in the report)")
    return title


def matmul_table_title(report: dict[str, Any]) -> str:
    """The matmul table's title with its true size (each rank keeps its longest op shapes)."""
    rows = matmul_rows(report)
    total = sum(r.get("matmul_efficiency_total") or len(r["matmul_efficiency"]) for r in report["ranks"])
    title = f"matmul ops by shape: {len(rows):,} rows over all ranks"
    if total > len(rows):
        title += f", the longest per rank of {total:,}"
    return title


def kernel_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Kernels by name over all ranks: class, count, total and mean time, and where their FLOPs
    are known, TFLOP/s and % of the peak of the dtype they ran at, both over the launches whose
    FLOPs are known (``flops_ns``); a share above 100% is shown as unknown and flagged
    (``above_peak``).  The report's ``job.kernels`` (every name, merged from each rank's whole
    table), else (a report saved before it) the ranks' cut tables merged here."""
    job = report["job"].get("kernels")
    if job is not None:
        return [{"name": k["name"], "kclass": k["kclass"], "count": k["count"], "total_ns": k["total_ns"], "flops": k.get("flops"),
                 "mean_ns": k["mean_ns"], "tflops": k.get("achieved_tflops"), "of_peak": k.get("of_peak"),
                 "above_peak": bool(k.get("above_peak")), "dtype": k.get("dtype")} for k in job]
    merged: dict[str, dict[str, Any]] = {}
    for r in report["ranks"]:
        for k in r["kernels"]:
            m = merged.setdefault(k["name"], {"name": k["name"], "kclass": k["kclass"], "count": 0, "total_ns": 0,
                                              "flops": None, "dtype": None, "_ideal_ns": 0.0, "_flops_ns": 0, "_dtypes": set()})
            m["count"] += k["count"]
            m["total_ns"] += k["total_ns"]
            if k.get("flops"):
                fns = k.get("flops_ns", k["total_ns"])  # reports before flops_ns: over all launches
                m["flops"] = (m["flops"] or 0.0) + k["flops"]
                m["_flops_ns"] += fns or 0
                ideal = k.get("ideal_ns")
                if ideal is None and k.get("of_peak") is not None:
                    ideal = k["of_peak"] * (fns or 0)
                m["_ideal_ns"] += ideal or 0.0
                m["_dtypes"].add(k.get("dtype"))
    rows = []
    for m in merged.values():
        ideal, fns, dtypes = m.pop("_ideal_ns"), m.pop("_flops_ns"), m.pop("_dtypes") - {None}
        share = ideal / fns if (ideal and fns) else None
        m["mean_ns"] = m["total_ns"] / m["count"] if m["count"] else None
        m["tflops"] = m["flops"] / fns * 1e-3 if (m["flops"] and fns) else None
        m["of_peak"] = share if (share is None or share <= 1.0) else None
        m["above_peak"] = share is not None and share > 1.0
        m["dtype"] = (next(iter(dtypes)) if len(dtypes) == 1 else "mixed") if dtypes else None
        rows.append(m)
    rows.sort(key=lambda m: -m["total_ns"])
    return rows


def peak_text(row: dict[str, Any]) -> str:
    """A row's % of peak as every front end shows it: a share, "-" when unknown, and a flag when
    the arithmetic says more than 100% (the FLOPs or the dtype are wrong)."""
    if row.get("above_peak"):
        return "⚠ >100%"
    return fmt_pct(row.get("of_peak"))


PEAK_FLAG = "above 100% of its dtype's peak, which no GPU can: its FLOPs or its dtype are wrong (see the warnings)"


def class_rows(report: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Kernel time by class over all ranks, largest first (``rows``: ``kernel_rows(report)``)."""
    by: dict[str, dict[str, Any]] = {}
    for k in kernel_rows(report) if rows is None else rows:
        c = by.setdefault(k["kclass"], {"kclass": k["kclass"], "kernels": 0, "count": 0, "total_ns": 0})
        c["kernels"] += 1
        c["count"] += k["count"]
        c["total_ns"] += k["total_ns"]
    total = sum(c["total_ns"] for c in by.values())
    for c in by.values():
        c["share"] = c["total_ns"] / total if total else None
    return sorted(by.values(), key=lambda c: -c["total_ns"])


def matmul_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Matmul ops by shape over all ranks (with the rank each row is from): TFLOP/s, % of the
    peak of its dtype, arithmetic intensity and roofline bound against that dtype's ridge.  Rows
    above 100% of their peak (flagged) come after the others: they are not ranked."""
    rows = [{"rank": r["rank"], **m} for r in report["ranks"] for m in r["matmul_efficiency"]]
    rows.sort(key=lambda m: (bool(m.get("above_peak")), -(m.get("kernel_ns") or 0)))
    return rows


_OWN_PEAK = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp32": "fp32", "fp8": "fp8", "fp64": "fp32"}


def dtype_peak(rank: dict[str, Any], dtype: str | None) -> float | None:
    """The peak (FLOP/s) an op of ``dtype`` is held to on this rank's GPU, as the analysis holds
    it (tracelens.model.gpus.GpuSpec.op_peak): its own dtype's dense peak, else the reference peak."""
    peaks = rank["device"].get("peak_flops") or {}
    own = peaks.get(_OWN_PEAK.get(dtype or "", ""))
    if own is None and dtype == "bf16":
        own = peaks.get("fp16")
    return own or rank["mfu"]["peak_flops"]


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def worst_ranks(per_rank: dict[str, float]) -> list[tuple[str, float]]:
    """A suggestion's per-rank values, worst first (ties by rank number): the same order whatever
    the order of the keys in the file (a report re-saved with sorted keys renders the same)."""
    def rank_key(k: str) -> tuple:
        return (0, int(k)) if re.fullmatch(r"-?[0-9]{1,18}", k) else (1, k)

    return sorted(per_rank.items(), key=lambda kv: (-kv[1], rank_key(kv[0])))


def roofline(report: dict[str, Any], top: int = 200) -> dict[str, Any] | None:
    """The roofline of the matmul op shapes: one roof per dtype present (its own peak, and its
    ridge at peak / memory bandwidth), the points (the ``top`` longest shapes with a known
    arithmetic intensity), each with the roof it is held to, so that its "bound" label and its
    % of peak agree with the roof drawn for it.  None without points or a peak."""
    by_rank = {r["rank"]: r for r in report["ranks"]}
    points = []
    for m in matmul_rows(report):
        if not (_positive(m.get("arithmetic_intensity")) and _positive(m.get("achieved_tflops"))):
            continue  # log axes: only positive numbers have a place
        r = by_rank[m["rank"]]
        peak = m.get("peak_flops") or dtype_peak(r, m.get("dtype"))
        if not _positive(peak):
            continue
        bw = r["device"].get("peak_bandwidth")
        points.append({**m, "peak_flops": peak, "bandwidth": bw if _positive(bw) else None})
        if len(points) >= top:
            break
    if not points:
        return None
    roofs: dict[tuple, dict[str, Any]] = {}
    for p in points:
        bw = p["bandwidth"]
        key = (p.get("dtype"), p["peak_flops"], bw)
        roofs.setdefault(key, {"dtype": p.get("dtype"), "peak_flops": p["peak_flops"], "bandwidth": bw,
                               "ridge": (p["peak_flops"] / bw) if bw else None})
    return {"points": points, "roofs": sorted(roofs.values(), key=lambda r: -r["peak_flops"])}


def comm_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Collectives by (group, type): count, bytes, time, exposed, wait, median busbw."""
    return list(report["communication"]["by_group"])


def nccl_join(g: dict[str, Any]) -> list[str]:
    """What ``--nccl`` joined to one ``communication.by_group`` item (tracelens.analysis.nccl_merge):
    NCCL's algorithm / protocol / channels, the achievable busbw, and how many of its calls were
    paired with NCCL's records and the recorder's entries, and how (empty without ``--nccl``)."""
    out = []
    if g.get("nccl_algo") or g.get("nccl_channels"):
        out.append(f"NCCL {g.get('nccl_algo') or '?'}/{g.get('nccl_proto') or '?'}, {g.get('nccl_channels') or '?'} channel(s)")
    if g.get("achievable_busbw_gbps") is not None:
        eff = f", {100 * g['busbw_efficiency']:.0f}% of it" if g.get("busbw_efficiency") is not None else ""
        out.append(f"achievable busbw {g['achievable_busbw_gbps']:.3g} GB/s{eff} ({g.get('achievable_note', '')})")
    for kind, who in (("nccl", "NCCL records"), ("fr", "Flight Recorder entries")):
        how = g.get(f"{kind}_pairing")
        if how is None:
            continue
        n = g.get(f"{kind}_paired_calls") or 0
        said = f"{n} rank-call(s) paired with {who} {how}" if n or not how.startswith("not paired") else f"{who}: {how}"
        if g.get(f"{kind}_mismatched_calls"):
            said += f", {g[f'{kind}_mismatched_calls']} differing in collective or size"
        if kind == "fr" and g.get("fr_states"):
            said += " (" + ", ".join(f"{v} {k}" for k, v in g["fr_states"].items()) + ")"
        if kind == "fr" and g.get("fr_dur_ns_median") is not None:
            said += f", enqueue to completion seen {fmt_ns(g['fr_dur_ns_median'])} median"
        out.append(said)
    return out


def straggler_verdict(report: dict[str, Any]) -> tuple[str, str] | None:
    """("found" | "none" | "unknown", the sentence after "straggler ranks: ") for a job of several
    ranks, None for one rank.  "none" only when waits were measured; otherwise "unknown" and why."""
    job = report["job"]
    if job["ranks"] < 2:
        return None
    if job["stragglers"]:
        return "found", ", ".join(f"rank {s['rank']}" for s in job["stragglers"])
    check = job.get("straggler_check") or {"known": True, "collectives": None, "reason": None}  # a report from before the check
    if check["known"]:
        n = check.get("collectives")
        over = f", over {n} collectives with measured waits" if n else ""
        return "none", f"none (no rank arrives last at collectives more often than chance{over})"
    return "unknown", f"unknown ({check['reason']})"


def comm_notes(report: dict[str, Any]) -> list[str]:
    """The lines under the communication table: how collectives were matched across ranks, and
    why a group or a collective type shows as unknown."""
    c = report["communication"]
    out = []
    m = c.get("matching")
    if m and m["matched"]:
        src = {"trace": "the traces' sequence numbers", "derived": "sequence numbers derived from each rank's order",
               "mixed": "the traces' sequence numbers where they have them, else each rank's order"}.get(m["seq_source"], m["seq_source"])
        line = f"matched across ranks by {src}: {m['matched']} collectives on several ranks, {m['complete']} with every member"
        if m["refused"]:
            line += f", {m['refused']} refused (their ranks do not overlap in aligned time: different collectives)"
        out.append(line)
    if c.get("group_unknown"):
        out.append(f"group ?: {c['group_unknown']}")
    if c.get("collective_unknown"):
        out.append(f"collective ?: {c['collective_unknown']}")
    return out


def slow_collective_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The slowest collective instances, one row each, with the slowest rank and its time."""
    rows = []
    for c in report["communication"]["slowest"]:
        durs = [r["dur_ns"] for r in c["ranks"]]
        waits = [r["wait_ns"] for r in c["ranks"] if r["wait_ns"] is not None]
        bws = [r["busbw_gbps"] for r in c["ranks"] if r["busbw_gbps"] is not None]
        first = min(c["ranks"], key=lambda r: r["start_ns"]) if c["ranks"] else None
        rows.append({
            "group": c["group"], "seq": c["seq"], "collective": c["collective"], "bytes": c["bytes"],
            "ranks": len(c["ranks"]), "max_ns": max(durs) if durs else None, "exposed_ns": max((r["exposed_ns"] for r in c["ranks"]), default=None),
            "wait_ns": max(waits) if waits else None, "busbw_gbps": min(bws) if bws else None,
            "slowest_rank": c["slowest_rank"], "start_ns": first["start_ns"] if first else None,
            "first_rank": first["rank"] if first else None,
        })
    return rows


def step_stats(report: dict[str, Any]) -> dict[str, Any]:
    """Step-time statistics over the kept steps of every rank (the mean rounded as job.step_time_ns.mean is)."""
    times = sorted(s["dur_ns"] for r in report["ranks"] for s in _kept(r["steps"]))
    if not times:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "min": None, "max": None}
    n = len(times)
    return {"count": n, "mean": round(sum(times) / n), "p50": times[(n - 1) // 2], "p90": times[min(n - 1, (9 * n) // 10)],
            "min": times[0], "max": times[-1]}


def gpu_given_note(source: str | None) -> str:
    """Where the GPU behind the MFU came from, when not from the trace ("" when it was): every
    front end shows it next to the MFU, so a peak the user supplied is never passed off as read."""
    if source in (None, "trace"):
        return ""
    if source.startswith("--"):
        return f"GPU given by {source}"
    if source == "options":
        return "GPU given by the caller"
    return f"GPU given in {source}"


def device_label(r: dict[str, Any]) -> str:
    """A rank's device: its name in the trace, else the GPU the user gave (marked so), else unknown."""
    name = r["device"].get("name")
    if name:
        return name
    m = r["mfu"]
    if m.get("gpu_model") and m.get("gpu_source") not in (None, "trace"):
        return f"{m['gpu_model']} (given)"
    return "unknown GPU"


def _about(w: str, paths: set[str]) -> str | None:
    """The path a warning is about (warnings about a file start with "PATH: "), else None; the
    longest such prefix, found in the few ": " of the warning (not by trying every path)."""
    found, i = None, w.find(": ")
    while i >= 0:
        if w[:i] in paths:
            found = w[:i]
        i = w.find(": ", i + 1)
    return found


def _reason(report: dict[str, Any], ranks: list[dict[str, Any]], words: tuple[str, ...]) -> str | None:
    """The first warning about one of ``ranks`` (it starts with the rank's path) that says one of
    ``words``, without the path in front."""
    paths = {r["path"] for r in ranks}
    # a warning about the MFU first (others may name the GPU in passing: "past its last GPU activity")
    for about_mfu in (True, False):
        for w in report["warnings"]:
            if ("MFU" in w) == about_mfu and any(x in w for x in words) and (p := _about(w, paths)) is not None:
                return w[len(p) + 2:].removeprefix("MFU unknown: ")
    return None


def mfu_missing(report: dict[str, Any]) -> dict[str, Any]:
    """Why the job's MFU is unknown, from the report's numbers (not its wording): which inputs
    are missing ("gpu": a rank's dense peak; "flops": a rank's model FLOPs; "gpu_time": no GPU
    activity at all; "other": none of these, e.g. an empty window) and the reason the warnings
    give for each.  Empty when the MFU is known."""
    if report["job"]["mfu"] is not None:
        return {"missing": [], "reasons": {}}
    ranks = report["ranks"]
    timed = [r for r in ranks if r["gpu_time_ns"]]
    if not timed:
        return {"missing": ["gpu_time"], "reasons": {"gpu_time": "no GPU activity in the traces (a CPU-only trace?)"}}
    no_peak = [r for r in timed if not r["mfu"]["peak_flops"]]
    no_flops = [r for r in timed if r["mfu"]["model_flops"] is None]
    missing, reasons = [], {}
    if no_flops:
        missing.append("flops")
        reasons["flops"] = "the model FLOPs are missing — " + (
            _reason(report, no_flops, ("FLOPs", "shapes")) or "no op the FLOPs can be counted from (give --model-flops-per-step)")
    if no_peak:
        missing.append("gpu")
        reasons["gpu"] = "the GPU's peak is missing — " + (
            _reason(report, no_peak, ("GPU", "peak")) or "the GPU is not known (give --gpu NAME or --peak-tflops X)")
    if not missing:  # e.g. the user's FLOPs or peak gave an MFU above 100%: the warning says so
        missing.append("other")
        reasons["other"] = _reason(report, timed, ("MFU unknown",)) or "see the warnings"
    return {"missing": missing, "reasons": reasons}


def why_unknown(report: dict[str, Any], m: dict[str, Any] | None = None) -> str | None:
    """One line: what the MFU lacks, e.g. "MFU unknown: the model FLOPs are missing — shapes were
    not recorded ...; the GPU is known (NVIDIA H800, 989 TFLOP/s)".  None when the MFU is known."""
    m = m or mfu_missing(report)
    if not m["missing"]:
        return None
    parts = [m["reasons"][k] for k in m["missing"]]
    r0 = next((r for r in report["ranks"] if r["mfu"]["peak_flops"]), None)
    if "gpu" not in m["missing"] and r0 is not None:
        parts.append(f"the GPU is known ({r0['mfu']['gpu_model']}, {r0['mfu']['peak_flops'] / 1e12:,.0f} TFLOP/s)")
    return "MFU unknown: " + "; ".join(parts)


def mfu_hint(report: dict[str, Any], m: dict[str, Any] | None = None) -> str:
    """What the user can give to get the MFU: the TUI's keys (and the options that do the same)."""
    m = m or mfu_missing(report)
    out = []
    if "flops" in m["missing"]:
        out.append("press F to enter the model FLOPs per step (or --model-flops-per-step F / --params N --tokens-per-step T)")
    if "gpu" in m["missing"]:
        out.append("press G to set the GPU (or --gpu NAME / --peak-tflops X)")
    return "; ".join(out)


def mfu_text(h: dict[str, Any]) -> str:
    """The MFU's line under the number, the same in every front end: "of NVIDIA A100 dense peak
    (312 TFLOP/s; GPU given in ...), model FLOPs from shapes"."""
    notes = "; ".join(x for x in [*h["gpu_notes"], h["gpu_note"]] if x)
    peak = f"{h['peak_flops'] / 1e12:,.0f} TFLOP/s" if isinstance(h["peak_flops"], (int, float)) else "peak unknown"
    return (f"of {h['gpu_model']} dense peak ({peak}{'; ' + notes if notes else ''}), "
            f"model FLOPs from {h['flops_source']}")


def mfu_note(job: dict[str, Any]) -> str:
    """What the MFU number cannot claim, said next to it in every front end as "MFU is <note>"
    ("" when nothing):
    a lower bound when some matmul kernel time has no known FLOPs, possibly overstated when some
    counted FLOPs exceed what their kernels could do at peak."""
    notes = []
    if job.get("mfu_lower_bound"):
        cov = job.get("flops_coverage")
        known = "" if cov is None else (f": FLOPs known for {100 * cov:.1f}% of the matmul kernel time" if cov < 0.9995
                                        else ": FLOPs known for >99.9% of the matmul kernel time")
        notes.append(f"a lower bound{known}")
    if job.get("mfu_above_peak"):
        notes.append("possibly overstated: some counted FLOPs exceed what their kernels could do at peak, see the warnings")
    return "; ".join(notes)


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The one-line answer: job MFU (or why it is unknown, and what would give it), what it
    cannot claim (``mfu_note``), the GPU model, the number of ranks and of warnings."""
    ranks = report["ranks"]
    r0 = ranks[0] if ranks else None
    mfu = report["job"]["mfu"]
    m = mfu_missing(report)
    return {
        "mfu_note": mfu_note(report["job"]) if mfu is not None else "",
        "lower_bound": bool(report["job"].get("mfu_lower_bound")),
        "flops_coverage": report["job"].get("flops_coverage"),
        "mfu": mfu,
        "why_unknown": why_unknown(report, m),
        "missing": m["missing"],
        "hint": mfu_hint(report, m),
        "gpu_model": r0["mfu"]["gpu_model"] if r0 else None,
        "gpu_note": gpu_given_note(r0["mfu"].get("gpu_source")) if r0 else "",
        "gpu_notes": list(r0["mfu"].get("gpu_notes") or []) if r0 else [],
        "device": device_label(r0) if r0 else None,
        "peak_flops": r0["mfu"]["peak_flops"] if r0 else None,
        "flops_source": r0["mfu"]["flops_source"] if r0 else None,
        "hfu": r0["mfu"]["hfu"] if r0 and r0["mfu"]["recompute_flops"] else None,
        "ranks": len(ranks),
        "warnings": len(report["warnings"]),
    }


def warning_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per warning, in the report's order: its number, the file it is about (the input
    whose path it starts with, else none: a job-wide warning) and the text."""
    paths = {i["path"] for i in report["inputs"]}
    rows = []
    for i, w in enumerate(report["warnings"]):
        about = _about(w, paths)
        rows.append({"n": i + 1, "file": about, "warning": w[len(about) + 2:] if about else w, "text": w})
    return rows


OUTLIER = 0.05  # a rank this much worse than the median rank is flagged


def outliers(ranks: list[int], values: list[float], higher_is_worse: bool) -> dict[int, float]:
    """Ranks more than OUTLIER worse than the median rank, with how much (0.06 = 6% worse):
    for step time higher is worse, for MFU lower."""
    if len(values) < 2:
        return {}
    med = sorted(values)[(len(values) - 1) // 2]
    if not med:
        return {}
    out = {}
    for r, v in zip(ranks, values):
        off = (v - med) / med if higher_is_worse else (med - v) / med
        if off > OUTLIER:
            out[r] = off
    return out


def per_rank_series(report: dict[str, Any]) -> tuple[str, list[float]]:
    """One number per rank for the overview's strip: MFU when known, else mean step time (ms)."""
    rows = rank_rows(report)
    if rows and all(r["mfu"] is not None for r in rows):
        return "MFU per rank", [r["mfu"] for r in rows]
    return "step time per rank (ms)", [(r["step_ns"] or 0) / 1e6 for r in rows]


# the critical path's categories (tracelens.analysis.rank.critical.CATEGORIES; compute_<kclass> by its kernel class's colour)
PATH_COLOURS = {"cpu": "#62a0ea", "data_loading": "#f6d32d", "launch_overhead": "#ff7800", "sync": "#c061cb", "memcpy": "#8ff0a4",
                "exposed_comm": "#e01b24", "idle": "#9a9996"}


def path_colour(category: str) -> str:
    """The colour of a critical-path category, in the TUI and the HTML page."""
    if category.startswith("compute_"):
        return KCLASS_COLOURS.get(category[len("compute_"):], "#26a269")
    return PATH_COLOURS.get(category, "#c0bfbc")


def what_if_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per suggestion that carries a ``what_if`` (only with --critical-path: its change
    replayed on the graph): its title, the change, the upper bound ``1 / (1 - bar)``
    (``est_speedup``, None when the rule has none) and the replay's predicted speed-up, step time
    and MFU.  A saved report may hold anything: a what_if without a change or a positive
    predicted speed-up is left out, other odd values become None."""
    rows = []
    for sg in report.get("suggestions") or ():
        wi = sg.get("what_if") if isinstance(sg, dict) else None
        if not isinstance(wi, dict):
            continue
        change, sp = wi.get("change"), wi.get("predicted_speedup")
        if not isinstance(change, str) or not isinstance(sp, (int, float)) or isinstance(sp, bool) or not sp > 0:
            continue

        def num(v: Any) -> float | None:
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        rows.append({"id": str(sg.get("id", "")), "title": str(sg.get("title", "")), "change": change,
                     "upper": num(sg.get("est_speedup")), "predicted_speedup": float(sp),
                     "predicted_step_ns": num(wi.get("predicted_step_ns")), "predicted_mfu": num(wi.get("predicted_mfu")),
                     # a replay past the bar's bound: said beside it (analysis.suggest._bounded)
                     "note": "beyond the bar's bound: the change removes more" if wi.get("beyond_bound") else ""})
    return rows


PIPELINE_COLOURS = {"F": "#3584e4", "B": "#33d17a", "I": "#2ec27e", "W": "#26a269", "bubble": "#e01b24"}
PIPELINE_PHASES = {"warmup": "warm-up", "steady": "between micro-batches", "between_iterations": "between iterations",
                   "cooldown": "cool-down"}


def pipeline_lanes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The Pipeline view's lanes (TUI and HTML): per rank with a pipeline view (``ranks[].pipeline.view``,
    the blocks of its slowest kept step), stages first: rank, stage, step, start_ns (the window's
    start on the rank's clock), window_ns, the blocks, the bubbles between them (kind warmup /
    steady / between_iterations / cooldown, s, e: ns from the window's start; between_iterations
    the gap before a block the analysis names an iteration's first, ``view.iteration_starts_ns``, in
    a trace without ProfilerStep spans) and bubble_ns (their sum)."""
    lanes = []
    for r in report.get("ranks") or []:
        pr = r.get("pipeline") or {}
        view = pr.get("view")
        if not isinstance(view, dict) or not isinstance(view.get("blocks"), list):
            continue
        blocks = sorted((b for b in view["blocks"] if isinstance(b, dict)), key=lambda b: (b["s"], b["e"]))
        bubbles, cur, w = [], 0, int(view.get("window_ns") or 0)
        it = {x for x in view.get("iteration_starts_ns") or [] if isinstance(x, int)}
        for i, b in enumerate(blocks):
            if b["s"] > cur:
                kind = "warmup" if i == 0 else "between_iterations" if b["s"] in it else "steady"
                bubbles.append({"kind": kind, "s": cur, "e": min(b["s"], w) if w else b["s"]})
            cur = max(cur, b["e"])
        if w > cur:
            bubbles.append({"kind": "cooldown", "s": cur, "e": w})
        bubbles = [x for x in bubbles if x["e"] > x["s"]]
        lanes.append({"rank": r.get("rank"), "stage": pr.get("stage"), "step": view.get("step"), "start_ns": view.get("start_ns"),
                      "window_ns": w, "blocks": blocks, "bubbles": bubbles, "bubble_ns": sum(x["e"] - x["s"] for x in bubbles),
                      "truncated": bool(view.get("truncated"))})
    return sorted(lanes, key=lambda ln: (ln["stage"] is None, ln["stage"] if ln["stage"] is not None else 0, ln["rank"] or 0))


def pipeline_summary_lines(report: dict[str, Any]) -> list[str]:
    """The pipeline's lines of the text report (and the views' headers): what was detected, the
    bubble against the theory and the gap's attribution; none without a schedule or stages."""
    pipe = (report.get("job") or {}).get("pipeline")
    if not pipe or (pipe.get("stages") is None and pipe.get("schedule") is None):
        return []
    def pct(v):
        return "?" if v is None else f"{100 * v:.1f}%"
    # a zero-bubble schedule's variant and placement (interleaved 1F1B is looped: nothing to add)
    kind = ", ".join(x for x in (pipe.get("variant"), {"v_shape": "V-shaped", "looped": "looped"}.get(pipe.get("placement") or "")) if x
                     ) if pipe.get("variant") else ""
    out = [f"pipeline: {pipe.get('schedule') or '?'}" + (f" ({kind})" if kind else "")
           + f", p={pipe.get('stages') or '?'} stages, m={pipe.get('microbatches') or '?'} micro-batches"
           + (f", v={pipe['virtual_stages']}" if (pipe.get("virtual_stages") or 1) > 1 else "")
           + f" (confidence {pipe.get('confidence') or '?'}); bubble {pct(pipe.get('bubble_fraction'))}, theory {pct(pipe.get('theory_fraction'))}"]
    g = pipe.get("gap")
    if g:
        out.append(f"  gap to the theory {fmt_ns(g['gap_ns'])}: slow stage {fmt_ns(g['slow_stage_ns'])} (stage {g['slowest_stage']}"
                   + (f", +{100 * g['slowest_stage_excess']:.0f}% compute" if g.get("slowest_stage_excess") is not None else "")
                   + f"), P2P {fmt_ns(g['p2p_ns'])}, host {fmt_ns(g['host_ns'])}")
    if pipe.get("critical_stage") is not None:  # with --critical-path: the stage that set the steps
        by: dict[str, int] = {}
        for st in pipe.get("critical_steps") or []:
            for g_, ns in st["path_ns_by_stage"].items():
                by[g_] = by.get(g_, 0) + ns
        total = sum(by.values())
        out.append(f"  critical path: stage {pipe['critical_stage']} set the steps ("
                   + ", ".join(f"stage {g_} {100 * ns / total:.0f}%" for g_, ns in sorted(by.items(), key=lambda kv: int(kv[0])))
                   + " of the job's path over the kept steps)" if total else f"  critical path: stage {pipe['critical_stage']} set the steps")
    for r in report.get("ranks") or []:
        pr = r.get("pipeline") or {}
        if "warmup_ns" in pr:
            out.append(f"  rank {r['rank']} stage {pr['stage'] if pr['stage'] is not None else '?'}: bubble {pct(pr['bubble_fraction'])}"
                       f" ({fmt_ns(pr['bubble_ns'])}: warm-up {fmt_ns(pr['warmup_ns'])}, steady {fmt_ns(pr['steady_ns'])},"
                       + (f" between iterations {fmt_ns(pr['between_iterations_ns'])}," if pr.get("between_iterations_ns") else "")
                       + f" cool-down {fmt_ns(pr['cooldown_ns'])}; exposed P2P {fmt_ns(pr['exposed_p2p_ns'])})")
    return out
