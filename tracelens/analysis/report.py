"""The Analysis of a job and its report dict (DESIGN.md 5).  ``Analysis.to_dict()`` only
serialises: every derived job value is computed once, by ``tracelens.analysis.job.rollup.finish_job``
(the last step of ``analyze()``), and held on the Analysis as plain data (``JobResult``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tracelens.model.saved import SCHEMA_VERSION
from tracelens.model.summary import GpuTime, RankResult


@dataclass(frozen=True)
class JobResult:
    """The job's derived values as the report carries them (plain, JSON-able data): the ``job``
    section's computed keys, the ``communication`` section and the ``suggestions``."""

    mfu: float | None
    step_time_ns: dict[str, int | None]  # mean, p50, max over the kept steps of every rank
    gpu_time_ns: dict[str, int] | None  # the ranks' GPU-time partitions summed
    waterfall: list[dict[str, Any]]  # the job's MFU waterfall, or its GPU-time waterfall (waterfall_kind)
    kernels: list[dict[str, Any]]  # every kernel name over all ranks, longest first
    waterfall_kind: str  # "mfu" or "gpu_time"
    flops_coverage: float | None
    mfu_lower_bound: bool
    mfu_above_peak: bool
    stragglers: list[dict[str, Any]] | None  # null when no wait was measured (straggler_check says why)
    straggler_check: dict[str, Any]
    communication: dict[str, Any]  # by_group, slowest, matching and the notes on unknown groups/types
    suggestions: list[dict[str, Any]]  # largest possible win first
    critical_path: dict[str, Any] | None = None  # the ranks' kept-step critical paths summed (rank.critical.combine)
    pipeline: dict[str, Any] | None = None  # job.pipeline.reduce: stages, m, v, schedule, bubble vs theory (None: no P2P)
    pipeline_ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # file -> that rank's pipeline dict (job.pipeline.reduce)


@dataclass(frozen=True)
class Analysis:
    inputs: tuple[dict[str, Any], ...]
    ranks: tuple[RankResult, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # tracelens.analysis.job.collectives.collective_table: one row per rank x collective (None: none)
    collectives: Any = None  # a polars DataFrame (TABLE_SCHEMA), or None
    stragglers: tuple = ()  # tracelens.analysis.job.stragglers.Straggler
    straggler_check: Any = None  # tracelens.analysis.job.stragglers.StragglerCheck: could the test see anything, and if not why
    comm_notes: dict[str, Any] = field(default_factory=dict)  # why groups or collective types are unknown
    clock_method: str = "none"
    timeline: dict[str, Any] | None = None  # tracelens.analysis.timeline.step_strips: one step per rank, binned
    separate_runs: bool = False  # the files look like separate runs, not one job (tracelens.store.job; a warning says why)
    job: JobResult | None = None  # the derived job values (tracelens.analysis.job.rollup.finish_job)
    nccl: tuple[str, ...] = ()  # Options.nccl: NCCL records joined into to_dict's report (analysis.nccl_merge)

    def table(self):
        """The collective table (empty when there is none)."""
        if self.collectives is not None:
            return self.collectives
        import polars as pl

        from tracelens.analysis.job.collectives import TABLE_SCHEMA

        return pl.DataFrame(schema=TABLE_SCHEMA)

    def to_dict(self) -> dict[str, Any]:
        """The report dict (DESIGN.md 5), assembled from the results; a new dict each call (the
        job's data copied, so that changing one report leaves the Analysis as it was)."""
        from tracelens import __version__

        job = self.job
        if job is None:
            raise ValueError("this Analysis has no job results: tracelens.analysis.job.rollup.finish_job(analysis) computes them")
        d = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "tracelens", "version": __version__},
            "inputs": list(self.inputs),
            "warnings": list(self.warnings) + [w for r in self.ranks for w in r.warnings],
            "job": {
                "ranks": len(self.ranks),
                "mfu": job.mfu,
                "step_time_ns": dict(job.step_time_ns),
                "gpu_time_ns": _fresh(job.gpu_time_ns),
                "waterfall": _fresh(job.waterfall),
                "kernels": _fresh(job.kernels),
                "waterfall_kind": job.waterfall_kind,
                "flops_coverage": job.flops_coverage,
                "mfu_lower_bound": job.mfu_lower_bound,
                "mfu_above_peak": job.mfu_above_peak,
                "stragglers": _fresh(job.stragglers),
                "clock_alignment": self.clock_method,
                "separate_runs": self.separate_runs,
                "straggler_check": dict(job.straggler_check),
                # only with --critical-path (Options.critical_path): absent, as before it, otherwise
                **({"critical_path": _fresh(job.critical_path)} if job.critical_path is not None else {}),
                # only where a rank has P2P traffic, schedule ranges or SendRecv kernels: absent, as before it, otherwise
                **({"pipeline": _fresh(job.pipeline)} if job.pipeline is not None else {}),
            },
            "ranks": [_rank_dict(r, job.pipeline_ranks.get(r.file)) for r in self.ranks],
            "communication": _fresh(job.communication),
            "suggestions": _fresh(job.suggestions),
            "timeline": self.timeline,
        }
        if self.nccl:
            from tracelens.analysis.nccl_merge import merge

            d = merge(d, self.nccl, self.collectives)
        return d


def _fresh(x: Any) -> Any:
    """A copy of nested dicts and lists (their leaves shared: numbers, strings, tuples)."""
    if isinstance(x, dict):
        return {k: _fresh(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_fresh(v) for v in x]
    return x


def gpu_dict(g: GpuTime | None) -> dict[str, int] | None:
    if g is None:
        return None
    d = asdict(g)
    d.pop("window")
    return d


def _rank_dict(r: RankResult, pipeline: dict[str, Any] | None = None) -> dict[str, Any]:
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
                "gpu_time_ns": gpu_dict(s.gpu) if r.gpu is not None else None,
                "idle_ns": asdict(s.idle) if r.gpu is not None else None,
                "data_loading": asdict(s.data) if s.data is not None else None,
                "model_flops": s.flops,
                "mfu": s.mfu,
                "waterfall": (s.waterfall or s.time_waterfall).to_list() if (s.waterfall or s.time_waterfall) else [],
            }
            for s in r.steps
        ],
        "gpu_time_ns": gpu_dict(r.gpu),
        "idle_ns": asdict(r.idle) if r.idle is not None else None,
        "mfu": {"value": r.mfu, "model_flops": r.flops, "flops_source": r.flops_source, "peak_flops": r.peak_flops,
                "gpu_model": r.gpu_model, "gpu_source": r.gpu_source, "hfu": r.hfu, "recompute_flops": r.recompute_flops,
                "gpu_notes": list(r.gpu_notes),
                "flops_coverage": r.flops_coverage, "lower_bound": r.lower_bound, "above_peak": r.above_peak,
                "matmul_ns": r.matmul_ns, "matmul_without_flops_ns": r.matmul_without_flops_ns},
        "waterfall": (r.waterfall or r.time_waterfall).to_list() if (r.waterfall or r.time_waterfall) else [],
        "kernels": list(r.kernels),
        "kernels_total": r.kernels_total,
        "matmul_efficiency": list(r.matmuls),
        "matmul_efficiency_total": r.matmuls_total,
        # the pipeline analysis (job.pipeline.reduce) where the rank has pipeline blocks; else the idle before P2P kernels
        "pipeline": _fresh(pipeline) if pipeline is not None else {
            "stage": None,
            "bubble_ns": r.idle.pipeline_bubble if r.idle else None,
            "bubble_fraction": (r.idle.pipeline_bubble / r.gpu.window) if (r.idle and r.gpu and r.gpu.window) else None,
        },
        "critical_path": _fresh(r.critical_path),
    }
