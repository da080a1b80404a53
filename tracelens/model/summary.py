"""What the per-rank map returns (the seam between a rank and the job): a rank's steps, its
GPU-time partition, idle split and data loading, and the RankResult that holds them."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuTime:
    """A window's GPU time: idle + compute + exposed_comm + exposed_memcpy == window."""

    window: int
    idle: int
    compute: int
    exposed_comm: int
    exposed_memcpy: int
    comm: int  # all communication time, overlapped or not
    memcpy: int  # all copy/fill time

    def __add__(self, o: GpuTime) -> GpuTime:
        return GpuTime(*(a + b for a, b in zip(astuple(self), astuple(o))))


ZERO = GpuTime(0, 0, 0, 0, 0, 0, 0)


IDLE_KEYS = ("data_loading", "host_launch", "sync", "launch_latency", "pipeline_bubble", "other")


@dataclass(frozen=True)
class IdleSplit:
    """What the host was doing while the GPU idled (DESIGN.md 4.3); sums to GpuTime.idle."""

    data_loading: int = 0  # the launching thread was inside a DataLoader __next__ / data range
    host_launch: int = 0  # the host was busy elsewhere and launched the next kernel late
    sync: int = 0  # the host had just been blocked in a synchronize and was refilling the queue
    launch_latency: int = 0  # the next kernel was already launched: latency or a dependency
    pipeline_bubble: int = 0  # the next kernel is a pipeline send/recv
    other: int = 0  # no launch information (e.g. the tail after the last kernel)

    def __add__(self, o: IdleSplit) -> IdleSplit:
        return IdleSplit(*(getattr(self, k) + getattr(o, k) for k in IDLE_KEYS))

    def total(self) -> int:
        return sum(getattr(self, k) for k in IDLE_KEYS)


@dataclass(frozen=True)
class DataLoading:
    """The data wait of one step's GPU window: the same ns as the window's data-loading idle
    (its waterfall bar), so the step table, the waterfall and the suggestion read one number.
    The wait for a step's batch (fetched before its first kernel) ends the previous window."""

    host_ns: int  # host time inside DataLoader __next__ (or data ranges) during the step's GPU window
    gpu_idle_ns: int  # GPU idle in the window while the host loaded data (== idle.data_loading)
    fraction: float  # gpu_idle_ns / window
    input_bound: str  # "highly" (>= 20%), "moderately" (>= 5%), "no" (XProf's bands)


WHOLE_TRACE = "whole trace"  # the one step's name where the trace marks none (no ProfilerStep spans): it may hold several iterations


@dataclass(frozen=True)
class Step:
    step: int | None  # ProfilerStep number (None for a user range or the whole trace)
    name: str
    cpu_start_ns: int
    cpu_end_ns: int
    start_ns: int  # GPU window
    end_ns: int
    warmup: bool
    kernels: int
    gpu: GpuTime
    idle: IdleSplit = IdleSplit()
    data: DataLoading | None = None
    flops: float | None = None  # model FLOPs of the step (shapes or the user's number)
    mfu: float | None = None
    waterfall: Any = None  # tracelens.analysis.waterfall.Waterfall, when the MFU is known
    untraced_tail_ns: int = 0  # the last ProfilerStep's CPU span past all traced work (outside the window)
    time_waterfall: Any = None  # the GPU-time waterfall (waterfall.build_time), shown when the MFU is unknown

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def kept_indices(steps) -> list[int]:
    """Which steps count in a rank's totals (their indices): all but the warm-up step, or all of
    them when that leaves none.  ``steps``: Step objects or the report's step dicts."""
    idx = [i for i, s in enumerate(steps) if not (s["warmup"] if isinstance(s, dict) else s.warmup)]
    return idx or list(range(len(steps)))


def kept_steps(steps) -> list:
    """The steps that count in a rank's totals (``kept_indices``), in order."""
    return [steps[i] for i in kept_indices(steps)]


@dataclass(frozen=True)
class RankResult:
    rank: int
    file: int
    path: str
    device: dict[str, Any]
    window_start_ns: int
    window_end_ns: int
    clock_offset_ns: int
    steps: tuple[Step, ...]
    gpu: GpuTime | None  # over the steps kept (warm-up excluded); None without GPU events
    idle: IdleSplit | None = None
    warnings: tuple[str, ...] = ()
    peak_flops: float | None = None  # reference dense peak (FLOP/s) of this rank's GPU
    peaks: dict[str, float] = field(default_factory=dict)  # dtype -> FLOP/s
    gpu_model: str | None = None  # the peak table's entry
    gpu_source: str | None = None  # "trace", or where the GPU / peak was given ("--gpu", a tracelens.toml)
    flops: float | None = None  # model FLOPs over the steps kept
    flops_source: str | None = None  # "shapes" | "user"
    mfu: float | None = None
    waterfall: Any = None  # over the steps kept
    recompute_flops: float | None = None  # FLOPs of recomputed forward ops (activation checkpointing)
    hfu: float | None = None  # (model + recompute FLOPs) / (peak x window)
    peak_bandwidth: float | None = None  # memory bandwidth of the GPU, bytes/s (the roofline's slope)
    facts: dict[str, Any] = field(default_factory=dict)  # for the suggestion rules
    kernels: tuple[dict[str, Any], ...] = ()  # the longest kernel names (the report's rows): class, count, time, FLOPs
    kernel_table: Any = field(default=None, compare=False)  # every kernel name, a polars DataFrame (analysis.rank.kernels.KERNEL_TABLE_SCHEMA); None without GPU
    matmuls: tuple[dict[str, Any], ...] = ()  # per op shape: TFLOP/s, % of peak, roofline bound
    window_basis: str = "steps"  # "steps" | "ranges" (--step-range) | "gpu_activity" (no steps) | "host" (no GPU activity)
    untraced_tail_ns: int = 0  # over the steps kept: CPU time after all traced work, left out of the window
    time_waterfall: Any = None  # the GPU-time waterfall over the steps kept, shown when the MFU is unknown
    kernels_total: dict[str, int] | None = None  # the whole kernel table's size: names, launches, total_ns
    matmuls_total: int = 0  # op shapes before the cut at kernels.MATMULS_TOP
    gpu_notes: tuple[str, ...] = ()  # how the peaks were had (a sibling's row, a MIG slice)
    matmul_ns: int | None = None  # matmul-class kernel time of the kept steps (recompute excluded)
    matmul_without_flops_ns: int | None = None  # the part of it launched by no op with counted FLOPs
    flops_coverage: float | None = None  # 1 - without / matmul_ns, when the FLOPs come from shapes
    lower_bound: bool = False  # the MFU leaves out matmul kernels whose FLOPs are unknown
    above_peak: bool = False  # some counted FLOPs exceed what their kernels could do at peak (warned)
    mfu_error: str | None = None  # the user's FLOPs or peak give an MFU above 100%: the MFU is null
    pipeline: dict[str, Any] | None = None  # analysis.rank.pipeline.rank_pipeline: this rank's blocks, P2P roles and peers, per-step bubble (None: no P2P)
    critical_path: dict[str, Any] | None = None  # analysis.rank.critical.summarize: the kept steps' path, each step's
    what_if: dict[str, list[int]] | None = None  # analysis.rank.replay.for_rank: per change, each step's predicted time (ns)


@dataclass(frozen=True)
class RankSummary:
    """What analysing one rank yields (the per-rank map's result, DESIGN.md 8): the RankResult
    the report shows, and the small facts the job reduce needs, so that the reduce never reads
    events.  Picklable (worker processes, Ray).

    * ``collectives``: this rank's rows of ``COLLECTIVE_SCHEMA`` (tracelens.model.schema), exposed
      time included (``tracelens.analysis.rank.collectives.collective_rows``): the only per-event
      data that crosses ranks.
    * ``step_starts``: (file, name, ts_ns) of its ProfilerStep spans, for the clock alignment's
      fallback to step starts (``rank.collectives.step_starts``; empty in a one-rank job).
    * ``first_ns``/``last_ns``: the first event start and last event end; ``pids``: host pids.
    * ``events``: how many events the rank has.

    * ``strips``: the report's timeline picture of each of its kept steps, binned
      (``analysis.timeline.rank_strips``); the reduce picks one position for every rank.
    """

    result: RankResult
    collectives: Any  # polars.DataFrame of COLLECTIVE_SCHEMA
    step_starts: Any  # polars.DataFrame (rank.collectives.STEP_STARTS_SCHEMA)
    first_ns: int | None = None
    last_ns: int | None = None
    pids: tuple[int, ...] = ()
    events: int = 0
    strips: Any = None  # polars.DataFrame (analysis.timeline.STRIP_SCHEMA): its kept steps' cells for the report's picture

    @property
    def file(self) -> int:
        return self.result.file
