"""The Analysis of a job and its report dict (DESIGN.md 5)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from math import fsum
from typing import Any

import polars as pl

from tracelens.analysis import waterfall
from tracelens.analysis.rank.kernels import KERNELS_TOP
from tracelens.analysis.suggest import suggest
from tracelens.model.schema import SCHEMA_VERSION
from tracelens.model.summary import ZERO, GpuTime, RankResult


@dataclass(frozen=True)
class Analysis:
    inputs: tuple[dict[str, Any], ...]
    ranks: tuple[RankResult, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # tracelens.analysis.job.collectives.collective_table: one row per rank x collective (None: none)
    collectives: pl.DataFrame | None = None
    stragglers: tuple = ()  # tracelens.analysis.job.stragglers.Straggler
    straggler_check: Any = None  # tracelens.analysis.job.stragglers.StragglerCheck: could the test see anything, and if not why
    comm_notes: dict[str, Any] = field(default_factory=dict)  # why groups or collective types are unknown
    clock_method: str = "none"
    timeline: dict[str, Any] | None = None  # tracelens.analysis.timeline.step_strips: one step per rank, binned
    separate_runs: bool = False  # the files look like separate runs, not one job (tracelens.store.job; a warning says why)

    def table(self) -> pl.DataFrame:
        """The collective table (empty when there is none)."""
        if self.collectives is not None:
            return self.collectives
        from tracelens.analysis.job.collectives import TABLE_SCHEMA

        return pl.DataFrame(schema=TABLE_SCHEMA)

    @property
    def waterfall_kind(self) -> str:
        """"mfu" when every rank has an MFU waterfall, else "gpu_time" (the report's job.waterfall_kind)."""
        return "mfu" if self.ranks and all(r.waterfall is not None for r in self.ranks) else "gpu_time"

    def job_waterfall(self) -> list[dict[str, Any]]:
        """The MFU waterfall when every rank has one, else the GPU-time waterfall (last bar
        ``compute``) of the ranks with GPU time."""
        if not self.ranks:
            return []
        if self.waterfall_kind == "mfu":
            w = waterfall.combine([r.waterfall for r in self.ranks])
        else:
            w = waterfall.combine([r.time_waterfall for r in self.ranks])
        return w.to_list() if w else []

    def job_kernels(self) -> list[dict[str, Any]]:
        """Every kernel name over all ranks (each rank's whole table, merged): class, launches,
        total and mean time, FLOPs, and over the launches whose FLOPs are known (``flops_ns``)
        the TFLOP/s and the share of the peak of their ops' dtype (the ranks' ideal time over that
        time, as each rank's table has it; above 1 it is null and ``above_peak``); longest first."""
        rows = [k for r in self.ranks for k in r.kernels]
        if not rows:
            return []
        df = pl.DataFrame(
            {"name": [k["name"] for k in rows], "kclass": [k["kclass"] for k in rows], "count": [k["count"] for k in rows],
             "total_ns": [k["total_ns"] for k in rows], "flops": [k["flops"] for k in rows],
             "flops_ns": [k.get("flops_ns") for k in rows], "ideal_ns": [k.get("ideal_ns") for k in rows],
             "dtype": [k.get("dtype") for k in rows]},
            schema={"name": pl.String, "kclass": pl.String, "count": pl.Int64, "total_ns": pl.Int64, "flops": pl.Float64,
                    "flops_ns": pl.Int64, "ideal_ns": pl.Float64, "dtype": pl.String},
        )
        g = (df.group_by("name", "kclass").agg(pl.col("count").sum(), pl.col("total_ns").sum(), pl.col("flops").drop_nulls(),
                                              pl.col("flops_ns").drop_nulls(), pl.col("ideal_ns").drop_nulls(),
                                              pl.col("dtype").drop_nulls().unique().sort())
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

    def job_mfu(self) -> float | None:
        """Σ model FLOPs / Σ (peak × window) over the ranks; null if any rank's is unknown."""
        if not self.ranks or any(r.mfu is None for r in self.ranks):
            return None
        den = sum(r.peak_flops * r.gpu.window / 1e9 for r in self.ranks)
        return sum(r.flops for r in self.ranks) / den if den else None

    def job_flops_quality(self) -> dict[str, Any]:
        """Over the ranks: the share of matmul kernel time whose FLOPs are known, and whether the
        job's MFU is a lower bound (some rank's is) or holds FLOPs beyond peak (some rank's does)."""
        cov = [r for r in self.ranks if r.flops_coverage is not None and r.matmul_ns]
        mm = sum(r.matmul_ns for r in cov)
        return {
            "flops_coverage": (1.0 - sum(r.matmul_without_flops_ns for r in cov) / mm) if mm else None,
            "mfu_lower_bound": any(r.lower_bound for r in self.ranks),
            "mfu_above_peak": any(r.above_peak for r in self.ranks),
        }

    def step_times(self) -> list[int]:
        return [s.dur_ns for r in self.ranks for s in r.steps if not s.warmup or len(r.steps) == 1]

    def to_dict(self) -> dict[str, Any]:
        from tracelens import __version__
        from tracelens.analysis.job import comm
        from tracelens.analysis.job import stragglers as strag

        times = sorted(self.step_times())
        job_gpu = sum((r.gpu for r in self.ranks if r.gpu is not None), ZERO)
        table = self.table()
        check = strag.check_dict(self.straggler_check or strag.straggler_check(table, len(self.ranks)))
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "tracelens", "version": __version__},
            "inputs": list(self.inputs),
            "warnings": list(self.warnings) + [w for r in self.ranks for w in r.warnings],
            "job": {
                "ranks": len(self.ranks),
                "mfu": self.job_mfu(),
                "step_time_ns": {
                    "mean": round(sum(times) / len(times)) if times else None,
                    "p50": times[(len(times) - 1) // 2] if times else None,
                    "max": times[-1] if times else None,
                },
                "gpu_time_ns": _gpu_dict(job_gpu) if any(r.gpu for r in self.ranks) else None,
                "waterfall": self.job_waterfall(),
                "kernels": self.job_kernels(),
                "waterfall_kind": self.waterfall_kind,
                **self.job_flops_quality(),
                # null, not [], when no wait was measured: nobody can be named or cleared (straggler_check says why)
                "stragglers": [
                    {"rank": st.rank, "excess_ns": st.excess_ns, "evidence": st.evidence, "last_in": st.last_in,
                     "of": st.of, "p_value": st.p_value}
                    for st in self.stragglers
                ] if self.stragglers or len(self.ranks) < 2 or check["known"] else None,
                "clock_alignment": self.clock_method,
                "separate_runs": self.separate_runs,
                "straggler_check": check,
            },
            "ranks": [_rank_dict(r) for r in self.ranks],
            "communication": {**_comm_dict(table), **(self.comm_notes or comm.report_notes(table, ()))},
            "suggestions": [sg.to_dict() for sg in suggest(self)],
            "timeline": self.timeline,
        }


def _comm_dict(table: pl.DataFrame, top: int = 20) -> dict[str, Any]:
    """Per (group, collective) totals, and the slowest collective instances."""
    from tracelens.analysis.job import collectives as coll

    return {"by_group": coll.by_group(table), "slowest": coll.slowest(table, top)}


def _gpu_dict(g: GpuTime | None) -> dict[str, int] | None:
    if g is None:
        return None
    d = asdict(g)
    d.pop("window")
    return d


def _rank_dict(r: RankResult) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "file": r.file,
        "path": r.path,
        "device": {**r.device, "peak_flops": r.peaks or None, "peak_bandwidth": r.peak_bandwidth},
        "window": {"start_ns": r.window_start_ns, "end_ns": r.window_end_ns},
        "window_ns": r.gpu.window if r.gpu else r.window_end_ns - r.window_start_ns,
        "window_basis": r.window_basis,
        "untraced_tail_ns": r.untraced_tail_ns,
        "clock_offset_ns": r.clock_offset_ns,
        "steps": [
            {
                "step": s.step,
                "name": s.name,
                "start_ns": s.start_ns,
                "dur_ns": s.dur_ns,
                "cpu_start_ns": s.cpu_start_ns,
                "cpu_dur_ns": s.cpu_end_ns - s.cpu_start_ns,
                "untraced_tail_ns": s.untraced_tail_ns,
                "warmup": s.warmup,
                "kernels": s.kernels,
                "gpu_time_ns": _gpu_dict(s.gpu) if r.gpu is not None else None,
                "idle_ns": asdict(s.idle) if r.gpu is not None else None,
                "data_loading": asdict(s.data) if s.data is not None else None,
                "model_flops": s.flops,
                "mfu": s.mfu,
                "waterfall": (s.waterfall or s.time_waterfall).to_list() if (s.waterfall or s.time_waterfall) else [],
            }
            for s in r.steps
        ],
        "gpu_time_ns": _gpu_dict(r.gpu),
        "idle_ns": asdict(r.idle) if r.idle is not None else None,
        "mfu": {"value": r.mfu, "model_flops": r.flops, "flops_source": r.flops_source, "peak_flops": r.peak_flops,
                "gpu_model": r.gpu_model, "gpu_source": r.gpu_source, "hfu": r.hfu, "recompute_flops": r.recompute_flops,
                "gpu_notes": list(r.gpu_notes),
                "flops_coverage": r.flops_coverage, "lower_bound": r.lower_bound, "above_peak": r.above_peak,
                "matmul_ns": r.matmul_ns, "matmul_without_flops_ns": r.matmul_without_flops_ns},
        "waterfall": (r.waterfall or r.time_waterfall).to_list() if (r.waterfall or r.time_waterfall) else [],
        "kernels": list(r.kernels[:KERNELS_TOP]),
        "kernels_total": r.kernels_total,
        "matmul_efficiency": list(r.matmuls),
        "matmul_efficiency_total": r.matmuls_total,
        # the pipeline and critical-path analyses are later issues: what is known now
        "pipeline": {
            "stage": None,
            "bubble_ns": r.idle.pipeline_bubble if r.idle else None,
            "bubble_fraction": (r.idle.pipeline_bubble / r.gpu.window) if (r.idle and r.gpu and r.gpu.window) else None,
        },
        "critical_path": None,
    }
