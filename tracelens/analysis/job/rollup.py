"""The job rollup: the last step of ``analyze()``.  From the per-rank results and the job
reduce's collectives and stragglers it computes, once, every derived job value the report shows
(the job MFU and its quality flags, step-time stats, the GPU-time total, the job waterfall, the
job's kernel table, the straggler list and check, the communication summary, the suggestions)
and stores them on the Analysis as plain JSON-able data (``Analysis.job``, a ``JobResult``), so
that ``Analysis.to_dict()`` only assembles dicts."""

from __future__ import annotations

from dataclasses import replace
from math import fsum
from typing import Any

import polars as pl

from tracelens.analysis import waterfall
from tracelens.analysis.job import collectives as coll
from tracelens.analysis.job import comm, pipeline
from tracelens.analysis.job import stragglers as strag
from tracelens.analysis.rank import critical
from tracelens.analysis.report import Analysis, JobResult, gpu_dict
from tracelens.analysis.suggest import LONE_COMM_WHAT_IF, UNSTITCHED_WHAT_IF, WHAT_IF, lone_comm, suggest, withheld
from tracelens.model.summary import ZERO, RankResult, kept_steps


def finish_job(a: Analysis) -> Analysis:
    """``a`` with its ``job`` computed (any earlier one replaced)."""
    ranks = list(a.ranks)
    times = sorted(step_times(ranks))
    kind = waterfall_kind(ranks)
    table = a.table()
    check = strag.check_dict(a.straggler_check or strag.straggler_check(table, len(ranks)))
    pipe, pipe_ranks = pipeline.reduce(ranks)
    parts, files = [r.critical_path for r in ranks], [(r.file, r.rank) for r in ranks]
    cp = critical.combine(parts, table, files, [(r.pipeline or {}).get("p2p_pairs") for r in ranks])
    pipe = pipeline.with_critical_path(pipe, {r.rank: pipe_ranks[r.file]["stage"] for r in ranks
                                              if r.rank is not None and r.file in pipe_ranks}, cp)
    late = {st.rank: rank_late_what_if(parts, table, files, cp, st.rank, job_mfu(ranks)) for st in a.stragglers}
    differ = critical.steps_differ(parts) if len([p for p in parts if p]) > 1 else None
    if differ and differ not in a.warnings:
        a = replace(a, warnings=(*a.warnings, differ))
    sgs = suggest(a, pipe, pipe_ranks, late, cp, critical.step_waits(parts, table, files) if cp and cp.get("steps") else None)
    if withheld(cp, ranks) and any(sg.id in WHAT_IF for sg in sgs):
        a = replace(a, warnings=(*a.warnings, UNSTITCHED_WHAT_IF))
    if any(sg.id in WHAT_IF and lone_comm(WHAT_IF[sg.id], cp, ranks) and any(WHAT_IF[sg.id] in (r.what_if or {}) for r in ranks)
           for sg in sgs):  # a prediction the rank's replay made, not shown
        a = replace(a, warnings=(*a.warnings, LONE_COMM_WHAT_IF))
    return replace(a, job=JobResult(
        mfu=job_mfu(ranks),
        step_time_ns={
            "mean": round(sum(times) / len(times)) if times else None,
            "p50": times[(len(times) - 1) // 2] if times else None,
            "max": times[-1] if times else None,
        },
        gpu_time_ns=gpu_dict(sum((r.gpu for r in ranks if r.gpu is not None), ZERO)) if any(r.gpu for r in ranks) else None,
        waterfall=job_waterfall(ranks, kind),
        kernels=job_kernels(ranks),
        waterfall_kind=kind,
        **flops_quality(ranks),
        # null, not [], when no wait was measured: nobody can be named or cleared (straggler_check says why)
        stragglers=[
            {"rank": st.rank, "excess_ns": st.excess_ns, "evidence": st.evidence, "last_in": st.last_in,
             "of": st.of, "p_value": st.p_value}
            for st in a.stragglers
        ] if a.stragglers or len(ranks) < 2 or check["known"] else None,
        straggler_check=check,
        communication={"by_group": coll.by_group(table), "slowest": coll.slowest(table, 20),
                       **(a.comm_notes or comm.report_notes(table, ()))},
        suggestions=[sg.to_dict() for sg in sgs],
        critical_path=cp,
        pipeline=pipe,
        pipeline_ranks=pipe_ranks,
    ))


def rank_late_what_if(parts, table: pl.DataFrame, files, cp: dict[str, Any] | None, rank: int, mfu: float | None) -> dict[str, Any] | None:
    """The straggler suggestion's ``what_if``: ``rank_late[<rank>]=0`` replayed on the job's stitched
    path (critical.rank_late) over the steps every rank keeps: the mean predicted step, the speed-up
    (the job path's measured kept steps over the predicted) and the job's MFU at that time; None
    without a stitched path (no --critical-path, one rank, nothing matched)."""
    if not cp or not cp.get("steps"):
        return None
    got = critical.rank_late(parts, table, files, {rank})
    if got is None or not got["kept"]:
        return None
    meas = sum(cp["steps"][k]["length_ns"] for k in got["kept"])
    pred = sum(got["steps"][k] for k in got["kept"])
    if pred <= 0:
        return None
    return {"change": f"rank_late[{rank}]=0", "predicted_step_ns": round(pred / len(got["kept"])),
            "predicted_speedup": round(meas / pred, 3), "predicted_mfu": round(mfu * meas / pred, 4) if mfu is not None else None}


def waterfall_kind(ranks: list[RankResult]) -> str:
    """"mfu" when every rank has an MFU waterfall, else "gpu_time" (the report's job.waterfall_kind)."""
    return "mfu" if ranks and all(r.waterfall is not None for r in ranks) else "gpu_time"


def job_waterfall(ranks: list[RankResult], kind: str) -> list[dict[str, Any]]:
    """The MFU waterfall when every rank has one (``kind`` "mfu"), else the GPU-time waterfall
    (last bar ``compute``) of the ranks with GPU time."""
    if not ranks:
        return []
    if kind == "mfu":
        w = waterfall.combine([r.waterfall for r in ranks])
    else:
        w = waterfall.combine([r.time_waterfall for r in ranks])
    return w.to_list() if w else []


def job_kernels(ranks: list[RankResult]) -> list[dict[str, Any]]:
    """Every kernel name over all ranks (each rank's whole table, merged): class, launches,
    total and mean time, FLOPs, and over the launches whose FLOPs are known (``flops_ns``)
    the TFLOP/s and the share of the peak of their ops' dtype (the ranks' ideal time over that
    time, as each rank's table has it; above 1 it is null and ``above_peak``); longest first."""
    tables = [r.kernel_table for r in ranks if r.kernel_table is not None and r.kernel_table.height]
    if not tables:
        return []
    df = pl.concat([t.select("name", "kclass", pl.col("count").cast(pl.Int64), "total_ns", "flops", "flops_ns", "ideal_ns", "dtype")
                    for t in tables])
    g = (df.group_by("name", "kclass").agg(pl.col("count").sum(), pl.col("total_ns").sum(), pl.col("flops").drop_nulls(),
                                          pl.col("flops_ns").drop_nulls(), pl.col("ideal_ns").drop_nulls(),
                                          pl.col("dtype").drop_nulls().unique().sort())
         .with_columns(pl.col("name").cast(pl.String))  # grouped on the Categorical; the job's names cast once
         .sort("total_ns", "name", "kclass", descending=[True, False, False]))
    out = []
    for name, kclass, count, t, f, fns, ideal, dts in g.iter_rows():  # one row per kernel name: a summary, not the events
        flops = fsum(f) if f else None  # exact sums: the same report to the last bit, whatever the threads
        fns = sum(fns) if fns else None
        share = fsum(ideal) / fns if (ideal and fns) else None
        out.append({"name": name, "kclass": kclass, "count": count, "total_ns": t, "mean_ns": t / count,
                    "flops": flops, "achieved_tflops": flops / (fns / 1e9) / 1e12 if (flops is not None and fns) else None,
                    "of_peak": share if (share is None or share <= 1.0) else None, "flops_ns": fns,
                    "ideal_ns": fsum(ideal) if ideal else None,
                    "dtype": (dts[0] if len(dts) == 1 else "mixed") if dts else None,
                    "above_peak": bool(share is not None and share > 1.0)})
    return out


def job_mfu(ranks: list[RankResult]) -> float | None:
    """Σ model FLOPs / Σ (peak × window) over the ranks; null if any rank's is unknown."""
    if not ranks or any(r.mfu is None for r in ranks):
        return None
    den = sum(r.peak_flops * r.gpu.window / 1e9 for r in ranks)
    return sum(r.flops for r in ranks) / den if den else None


def flops_quality(ranks: list[RankResult]) -> dict[str, Any]:
    """Over the ranks: the share of matmul kernel time whose FLOPs are known, and whether the
    job's MFU is a lower bound (some rank's is) or holds FLOPs beyond peak (some rank's does)."""
    cov = [r for r in ranks if r.flops_coverage is not None and r.matmul_ns]
    mm = sum(r.matmul_ns for r in cov)
    return {
        "flops_coverage": (1.0 - sum(r.matmul_without_flops_ns for r in cov) / mm) if mm else None,
        "mfu_lower_bound": any(r.lower_bound for r in ranks),
        "mfu_above_peak": any(r.above_peak for r in ranks),
    }


def step_times(ranks: list[RankResult]) -> list[int]:
    """The step times the job's stats count: every rank's steps but the warm-up (a lone step counts)."""
    return [s.dur_ns for r in ranks for s in kept_steps(r.steps)]
