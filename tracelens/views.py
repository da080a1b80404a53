"""What the front ends show, computed once from the JSON report (DESIGN.md 5).

The terminal UI and the HTML report both call these functions on ``Analysis.to_dict()`` (or
on a saved report), so the two can never disagree: a number on screen is a number in the
report.  Everything here is plain data (dicts and lists); no Textual, no polars.
"""

from __future__ import annotations

from typing import Any

from tracelens.units import fmt_pct

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
KCLASS_COLOURS: dict[str, str] = {
    "gemm": "#3584e4",
    "conv": "#1c71d8",
    "attention": "#9141ac",
    "comm": "#e01b24",
    "memcpy": "#f6d32d",
    "memset": "#e5a50a",
    "moe_routing": "#c061cb",
    "embedding": "#dc8add",
    "norm": "#2ec27e",
    "softmax_reduce": "#26a269",
    "elementwise": "#57e389",
    "optimizer": "#ff7800",
    "cast_quant": "#99c1f1",
    "copy": "#cdab8f",
    "other": "#9a9996",
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


def waterfall(report: dict[str, Any], rank: int | None = None, step: int | None = None) -> tuple[list[dict[str, Any]], str]:
    """The bars to draw and what they are: ("mfu", the MFU waterfall) or ("time", the GPU-time
    partition when the MFU is unknown).  ``rank``/``step`` narrow it to one rank or step."""
    if rank is None:
        bars = report["job"]["waterfall"]
        if bars:
            return bars, "mfu"
        return time_bars(report["job"]["gpu_time_ns"], sum_idle(report["ranks"])), "time"
    r = rank_by_id(report, rank)
    if r is None:
        return [], "time"
    if step is None:
        return (r["waterfall"], "mfu") if r["waterfall"] else (time_bars(r["gpu_time_ns"], r["idle_ns"]), "time")
    s = next((s for s in r["steps"] if s["step"] == step), None)
    if s is None:
        return [], "time"
    return (s["waterfall"], "mfu") if s["waterfall"] else (time_bars(s["gpu_time_ns"], s["idle_ns"]), "time")


def rank_by_id(report: dict[str, Any], rank: int) -> dict[str, Any] | None:
    return next((r for r in report["ranks"] if r["rank"] == rank), None)


def _kept(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if not s["warmup"]] or steps


def _share(part: int | None, whole: int | None) -> float | None:
    return part / whole if (part is not None and whole) else None


def rank_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank: device, steps, mean step time, MFU, idle / exposed comm / bubble
    shares of the window, and whether the rank is a straggler."""
    stragglers = {s["rank"] for s in report["job"]["stragglers"] or []}
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


def kernel_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Kernels by name over all ranks: class, count, total and mean time, TFLOP/s and % of
    peak where their FLOPs are known."""
    merged: dict[str, dict[str, Any]] = {}
    for r in report["ranks"]:
        peak = r["mfu"]["peak_flops"]
        for k in r["kernels"]:
            m = merged.setdefault(k["name"], {"name": k["name"], "kclass": k["kclass"], "count": 0, "total_ns": 0,
                                              "flops": None, "_peak_ns": 0.0})
            m["count"] += k["count"]
            m["total_ns"] += k["total_ns"]
            if k.get("flops"):
                m["flops"] = (m["flops"] or 0.0) + k["flops"]
                if peak:
                    m["_peak_ns"] += k["flops"] / peak * 1e9
    rows = []
    for m in merged.values():
        peak_ns = m.pop("_peak_ns")
        m["mean_ns"] = m["total_ns"] / m["count"] if m["count"] else None
        m["tflops"] = m["flops"] / m["total_ns"] * 1e-3 if (m["flops"] and m["total_ns"]) else None
        m["of_peak"] = peak_ns / m["total_ns"] if (peak_ns and m["total_ns"]) else None
        rows.append(m)
    rows.sort(key=lambda m: -m["total_ns"])
    return rows


def class_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Kernel time by class over all ranks, largest first."""
    by: dict[str, dict[str, Any]] = {}
    for k in kernel_rows(report):
        c = by.setdefault(k["kclass"], {"kclass": k["kclass"], "kernels": 0, "count": 0, "total_ns": 0})
        c["kernels"] += 1
        c["count"] += k["count"]
        c["total_ns"] += k["total_ns"]
    total = sum(c["total_ns"] for c in by.values())
    for c in by.values():
        c["share"] = c["total_ns"] / total if total else None
    return sorted(by.values(), key=lambda c: -c["total_ns"])


def matmul_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Matmul ops by shape over all ranks (with the rank each row is from): TFLOP/s, % of
    peak, arithmetic intensity and roofline bound."""
    rows = [{"rank": r["rank"], **m} for r in report["ranks"] for m in r["matmul_efficiency"]]
    rows.sort(key=lambda m: -(m.get("kernel_ns") or 0))
    return rows


def comm_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Collectives by (group, type): count, bytes, time, exposed, wait, median busbw."""
    return list(report["communication"]["by_group"])


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
    """Step-time statistics over the kept steps of every rank."""
    times = sorted(s["dur_ns"] for r in report["ranks"] for s in _kept(r["steps"]))
    if not times:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "min": None, "max": None}
    n = len(times)
    return {"count": n, "mean": sum(times) // n, "p50": times[(n - 1) // 2], "p90": times[min(n - 1, (9 * n) // 10)],
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


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The one-line answer: job MFU (or why it is unknown), the GPU model, the number of ranks."""
    ranks = report["ranks"]
    r0 = ranks[0] if ranks else None
    mfu = report["job"]["mfu"]
    why = None
    if mfu is None:
        w = next((w for w in report["warnings"] if "MFU unknown" in w), "MFU unknown (see the warnings)")
        why = w[w.index("MFU unknown"):]  # without the file name in front
    return {
        "mfu": mfu,
        "why_unknown": why,
        "gpu_model": r0["mfu"]["gpu_model"] if r0 else None,
        "gpu_note": gpu_given_note(r0["mfu"].get("gpu_source")) if r0 else "",
        "device": device_label(r0) if r0 else None,
        "peak_flops": r0["mfu"]["peak_flops"] if r0 else None,
        "flops_source": r0["mfu"]["flops_source"] if r0 else None,
        "hfu": r0["mfu"]["hfu"] if r0 and r0["mfu"]["recompute_flops"] else None,
        "ranks": len(ranks),
    }


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
