"""``tracelens info``: what each input file holds (format, rank, device, counts, span, steps)."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracelens.model.schema import KINDS
from tracelens.model.units import fmt_bytes, fmt_ns
from tracelens.store.job import Job


def _file_facts(job: Job, fi: int) -> tuple[dict[str, int], dict[str, int] | None, list[int]]:
    """(events by kind, span, ProfilerStep numbers) of one file, from a scan of the columns they need."""
    ev = job.frame(fi, ["kind", "name", "ts_ns", "dur_ns"])
    if not ev.height:
        return {}, None, []
    counts = dict(ev.group_by("kind").len().select(pl.col("kind").cast(pl.String), "len").iter_rows())
    lo, hi = ev.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("hi")).row(0)
    steps = (
        ev.filter(pl.col("kind") == "step")
        .select(pl.col("name").cast(pl.String).str.extract(r"#(\d+)$").cast(pl.Int64).alias("step"))
        .drop_nulls().unique().sort("step").get_column("step").to_list()
    )
    return counts, {"start_ns": lo, "end_ns": hi}, steps


def summarize(job: Job) -> dict[str, Any]:
    """Per-file summary as plain data (the ``--json`` output), one file at a time."""
    files = []
    for fi, m in enumerate(job.metas):
        c, span, steps = _file_facts(job, fi)
        files.append(
            {
                "path": m.path,
                "format": m.format,
                "trace_schema": m.trace_schema,
                "rank": m.rank,
                "rank_source": m.rank_source,
                "world_size": m.world_size,
                "backend": m.backend,
                "device": {"id": m.device_id, "name": m.device_name, "platform": m.platform}
                if (m.device_name or m.device_id is not None)
                else None,
                "size_bytes": m.size_bytes,
                "uncompressed_bytes": m.uncompressed_bytes,
                "events": sum(c.values()),
                "counts": {k: c.get(k, 0) for k in KINDS},
                "span": {
                    "start_ns": span["start_ns"],
                    "end_ns": span["end_ns"],
                    "dur_ns": span["end_ns"] - span["start_ns"],
                }
                if span
                else None,
                "steps": steps,
                "truncated": m.truncated,
                "warnings": list(m.warnings),
            }
        )
    return {"files": files, "warnings": list(job.warnings)}


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "none (the whole trace is one step)"
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{len(steps)} (ProfilerStep#{steps[0]}..#{steps[-1]})"
    return f"{len(steps)} (" + ", ".join(f"#{s}" for s in steps) + ")"


def render_text(summary: dict[str, Any]) -> str:
    lines: list[str] = []
    exports = {n["path"]: n for n in summary.get("nsys", ())}
    for f in summary["files"]:
        ws = f"/{f['world_size']}" if f["world_size"] else ""
        dev = f["device"]
        if dev is None:
            dev_txt = "no GPU events"
        else:
            detail = ", ".join(x for x in (f"device {dev['id']}" if dev["id"] is not None else "", dev["platform"] or "") if x)
            dev_txt = (dev["name"] or "unknown GPU") + (f" ({detail})" if detail else "")
            if not dev["name"]:
                dev_txt += ", the export has no TARGET_INFO_GPU" if f["format"] == "nsys" else ", the trace has no deviceProperties"
        lines.append(f"{f['path']}")
        lines.append(
            f"  format      {f['format']} ({f['trace_schema']} schema), {fmt_bytes(f['size_bytes'])} on disk"
            + (f", {fmt_bytes(f['uncompressed_bytes'])} of JSON" if f["format"] == "kineto" else "")
        )
        lines.append(f"  rank        {f['rank']}{ws} (from {f['rank_source']})" + (f", backend {f['backend']}" if f["backend"] else ""))
        lines.append(f"  device      {dev_txt}")
        nz = [(k, v) for k, v in f["counts"].items() if v]
        lines.append(f"  events      {f['events']:,}: " + ", ".join(f"{k} {v:,}" for k, v in nz))
        sp = f["span"]
        lines.append(f"  span        {fmt_ns(sp['dur_ns']) if sp else '-'}")
        lines.append(f"  steps       {_steps_text(f['steps'])}")
        if f["path"] in exports:  # what the nsys export holds besides its events
            lines.extend(render_nsys_text(exports[f["path"]], header=False).rstrip("\n").split("\n"))
        for w in f["warnings"]:
            lines.append(f"  warning     {w}")
        lines.append("")
    for w in summary["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines).rstrip() + "\n"


def nsys_summary(path: str) -> dict[str, Any]:
    """What an Nsight Systems export holds (``parsers.nsys.describe``: its tables and their row
    counts, the nsys version, the capture range, the processes that ran GPU work) and the GPUs it
    describes (TARGET_INFO_GPU: every GPU of the host, used or not), each matched to the peak
    table (MFU.md 3.1); its events are summarised like any trace's."""
    from tracelens.model import gpus
    from tracelens.parsers.nsys import describe, target_gpus

    out = []
    for g in target_gpus(path):
        spec, why = gpus.identify(g, g.get("name"))
        out.append({**g, "gpu_model": spec.name if spec else None,
                    "peak_flops": {k: spec.peak(k) for k in spec.peak_tflops} if spec else None, "unknown_because": why})
    return {**describe(path), "gpus": out}


def _utc(ns: int | None) -> str:
    import datetime as dt

    if ns is None or not 10**18 <= ns < 4_102_444_800 * 10**9:
        return "-"
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_nsys_text(summary: dict[str, Any], header: bool = True) -> str:
    lines = [summary["path"]] if header else []
    schema = f" (export schema {summary['export_schema']})" if summary.get("export_schema") else ""
    lines.append(f"  nsys        {summary.get('nsys_version') or 'version not recorded'}{schema}")
    cap = summary.get("capture") or {}
    if cap.get("start_ns") is not None:
        where = "ANALYSIS_DETAILS" if cap["source"] == "ANALYSIS_DETAILS" else "the first to the last event"
        lines.append(f"  capture     {fmt_ns(cap['end_ns'] - cap['start_ns'])}, {cap['start_ns']:,} to {cap['end_ns']:,} ns "
                     f"(from {where}), session started {_utc(cap.get('session_start_utc_ns'))}")
    else:
        lines.append("  capture     unknown (no ANALYSIS_DETAILS and no timed events)")
    procs = summary.get("gpu_processes") or []
    if not procs:
        lines.append("  GPU work    none (no kernels, copies or fills)")
    for q in procs:
        devs = ", ".join(str(d) for d in q["devices"]) or "-"
        lines.append(f"  process     pid {q['pid']} {q['name'] or '(unnamed)'}: {fmt_ns(q['kernel_ns'])} of kernels on "
                     f"device{'s' if len(q['devices']) != 1 else ''} {devs}")
    lines.append("  GPUs of the host (TARGET_INFO_GPU)")
    if not summary["gpus"]:
        lines.append("  GPUs        none described (no TARGET_INFO_GPU table)")
    for g in summary["gpus"]:
        mem = f", {fmt_bytes(g['totalGlobalMem'])}" if g.get("totalGlobalMem") else ""
        bw = f", {g['memoryBandwidth'] / 1e12:.2f} TB/s" if g.get("memoryBandwidth") else ""
        peak = (f"-> {g['gpu_model']}: {g['peak_flops'].get('bf16', g['peak_flops'].get('fp16', 0)) / 1e12:,.0f} TFLOP/s dense"
                if g["gpu_model"] else f"-> unknown: {g['unknown_because']}")
        lines.append(f"  GPU {g['id']}       {g['name']}, {g['numSms']} SMs{mem}{bw} {peak}")
    tables = summary.get("tables") or {}
    filled = [(t, n) for t, n in tables.items() if n]
    lines.append(f"  tables      {len(tables)} ({len(filled)} with rows; ENUM_* lookups not listed)")
    width = max((len(t) for t, _ in filled), default=0)
    for t, n in sorted(filled, key=lambda x: (-x[1], x[0])):
        lines.append(f"    {t:<{width}}  {n:>12,}")
    return "\n".join(lines) + "\n"
