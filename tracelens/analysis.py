"""Where the GPU time went: steps and the exact GPU-time partition, per rank and per step.

``analyze(trace, options) -> Analysis`` reads only the loaded event table (no files, no
Textual) and returns plain frozen dataclasses that renderers turn into JSON or text.

Definitions (DESIGN.md 4.1-4.2, MFU.md 9.2-9.3):

* Steps are ``ProfilerStep#N`` spans on the thread that records them (else ranges whose name
  matches ``options.step_range``, else the whole trace is one step).  A kernel belongs to the
  step in which it was *launched* (its runtime call's time; its own start when the launch is
  not in the trace).  A step's GPU window runs from its first kernel's start to the next step's
  first kernel's start; the last step ends at the later of its CPU span's end and its last
  kernel's end.  The first step is flagged as warm-up and left out of the rank's totals when
  there are other steps.
* In a window W, with C the union of compute kernels, M of communication kernels and Y of
  copies and fills: idle I = W \\ (C ∪ M ∪ Y), exposed communication X = M \\ C, exposed memcpy
  Z = Y \\ (C ∪ M).  |I| + |C| + |X| + |Z| = |W| exactly.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from tracelens import intervals as iv
from tracelens.load import Trace
from tracelens.schema import NON_COMPUTE_KCLASSES, SCHEMA_VERSION

_STEP_NUM = re.compile(r"#(\d+)$")


@dataclass(frozen=True)
class Options:
    steps: tuple[int, int] | None = None  # keep steps whose number is in [a, b] ("3:7")
    step_range: str | None = None  # regex naming user ranges to use as steps
    include_warmup: bool = False


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
        return GpuTime(*(a + b for a, b in zip(astuple_(self), astuple_(o))))


def astuple_(g: GpuTime) -> tuple[int, ...]:
    return (g.window, g.idle, g.compute, g.exposed_comm, g.exposed_memcpy, g.comm, g.memcpy)


ZERO = GpuTime(0, 0, 0, 0, 0, 0, 0)


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

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


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
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Analysis:
    inputs: tuple[dict[str, Any], ...]
    ranks: tuple[RankResult, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def step_times(self) -> list[int]:
        return [s.dur_ns for r in self.ranks for s in r.steps if not s.warmup or len(r.steps) == 1]

    def to_dict(self) -> dict[str, Any]:
        from tracelens import __version__

        times = sorted(self.step_times())
        job_gpu = sum((r.gpu for r in self.ranks if r.gpu is not None), ZERO)
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "tracelens", "version": __version__},
            "inputs": list(self.inputs),
            "warnings": list(self.warnings) + [w for r in self.ranks for w in r.warnings],
            "job": {
                "ranks": len(self.ranks),
                "mfu": None,
                "step_time_ns": {
                    "mean": round(sum(times) / len(times)) if times else None,
                    "p50": times[(len(times) - 1) // 2] if times else None,
                    "max": times[-1] if times else None,
                },
                "gpu_time_ns": _gpu_dict(job_gpu) if any(r.gpu for r in self.ranks) else None,
                "waterfall": [],
                "stragglers": [],
            },
            "ranks": [_rank_dict(r) for r in self.ranks],
            "suggestions": [],
        }


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
        "device": r.device,
        "window": {"start_ns": r.window_start_ns, "end_ns": r.window_end_ns},
        "window_ns": r.gpu.window if r.gpu else r.window_end_ns - r.window_start_ns,
        "clock_offset_ns": r.clock_offset_ns,
        "steps": [
            {
                "step": s.step,
                "name": s.name,
                "start_ns": s.start_ns,
                "dur_ns": s.dur_ns,
                "cpu_start_ns": s.cpu_start_ns,
                "cpu_dur_ns": s.cpu_end_ns - s.cpu_start_ns,
                "warmup": s.warmup,
                "kernels": s.kernels,
                "gpu_time_ns": _gpu_dict(s.gpu) if r.gpu is not None else None,
            }
            for s in r.steps
        ],
        "gpu_time_ns": _gpu_dict(r.gpu),
        "mfu": {"value": None, "model_flops": None, "flops_source": None},
        "waterfall": [],
    }


def analyze(trace: Trace, options: Options | None = None) -> Analysis:
    options = options or Options()
    ev = trace.events
    ranks = []
    warnings: list[str] = []
    for fi, meta in enumerate(trace.metas):
        mine = ev.filter(pl.col("file") == fi)
        ranks.append(_analyze_rank(mine, fi, meta, options))
    inputs = tuple(
        {"path": m.path, "format": m.format, "rank": m.rank, "size_bytes": m.size_bytes} for m in trace.metas
    )
    return Analysis(inputs=inputs, ranks=tuple(ranks), warnings=tuple(trace.warnings + warnings))


def _step_spans(df: pl.DataFrame, options: Options) -> pl.DataFrame:
    """(name, step, start, end) of the steps, on the thread that records them."""
    if options.step_range:
        spans = df.filter(
            pl.col("kind").is_in(["annotation", "cpu_op", "step", "dataloader"])
            & pl.col("tid").is_not_null()
            & pl.col("name").cast(pl.String).str.contains(options.step_range)
        )
    else:
        spans = df.filter((pl.col("kind") == "step") & pl.col("tid").is_not_null())
    if spans.height == 0:
        return pl.DataFrame(schema={"name": pl.String, "step": pl.Int64, "start": pl.Int64, "end": pl.Int64})
    main = spans.group_by("pid", "tid").len().sort("len", "tid", descending=[True, False]).row(0, named=True)
    spans = spans.filter((pl.col("pid") == main["pid"]) & (pl.col("tid") == main["tid"]))
    out = spans.select(
        pl.col("name").cast(pl.String),
        pl.col("name").cast(pl.String).str.extract(r"#(\d+)$").cast(pl.Int64).alias("step"),
        pl.col("ts_ns").alias("start"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
    ).sort("start")
    if options.steps is not None:
        a, b = options.steps
        out = out.filter(pl.col("step").is_between(a, b))
    return out


def _analyze_rank(df: pl.DataFrame, fi: int, meta, options: Options) -> RankResult:
    warnings: list[str] = []
    gpu_rows = df.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
    if meta.device_id is not None:
        other = gpu_rows.filter(pl.col("device") != meta.device_id).height
        if other:
            warnings.append(f"{meta.path}: {other} GPU events on devices other than {meta.device_id} are left out")
        gpu_rows = gpu_rows.filter(pl.col("device") == meta.device_id)
    # launch time of each GPU activity: its runtime call (same correlation), else its own start
    launches = (
        df.filter(pl.col("kind").is_in(["runtime", "sync"]) & pl.col("correlation").is_not_null())
        .group_by("correlation")
        .agg(pl.col("ts_ns").min().alias("launch_ns"))
    )
    gpu_rows = gpu_rows.join(launches, on="correlation", how="left").with_columns(
        pl.col("launch_ns").fill_null(pl.col("ts_ns"))
    )
    spans = _step_spans(df, options)
    host_end = df.select((pl.col("ts_ns") + pl.col("dur_ns")).max()).item()
    host_start = df.select(pl.col("ts_ns").min()).item()
    if spans.height == 0:
        if options.step_range or options.steps:
            warnings.append(f"{meta.path}: no steps match the selection; the whole trace is one step")
        k0 = gpu_rows.select(pl.col("ts_ns").min()).item()
        k1 = gpu_rows.select((pl.col("ts_ns") + pl.col("dur_ns")).max()).item()
        spans = pl.DataFrame(
            {"name": ["whole trace"], "step": [None], "start": [host_start], "end": [host_end]},
            schema={"name": pl.String, "step": pl.Int64, "start": pl.Int64, "end": pl.Int64},
        )
        gpu_rows = gpu_rows.with_columns(pl.lit(0, pl.Int64).alias("_step"))
        windows = [(min(x for x in (k0, host_start) if x is not None), max(x for x in (k1, host_end) if x is not None))]
    else:
        # each activity to the last step that started at or before its launch
        starts = spans.get_column("start").to_list()
        gpu_rows = (
            gpu_rows.sort("launch_ns")
            .join_asof(
                spans.with_row_index("_step").select(pl.col("_step").cast(pl.Int64), "start"),
                left_on="launch_ns",
                right_on="start",
                strategy="backward",
            )
            .filter(pl.col("_step").is_not_null())
        )
        # a launch after the last step's CPU span belongs to no step
        last_end = spans.get_column("end")[-1]
        gpu_rows = gpu_rows.filter(~((pl.col("_step") == spans.height - 1) & (pl.col("launch_ns") > last_end)))
        first_k = dict(
            gpu_rows.group_by("_step").agg(pl.col("ts_ns").min()).iter_rows()
        )
        last_k = dict(gpu_rows.group_by("_step").agg((pl.col("ts_ns") + pl.col("dur_ns")).max()).iter_rows())
        n = spans.height
        windows = []
        for i in range(n):
            s = first_k.get(i, starts[i])
            if i + 1 < n:
                e = first_k.get(i + 1, starts[i + 1])
            else:
                e = max(spans.get_column("end")[i], last_k.get(i, spans.get_column("end")[i]))
            windows.append((s, max(e, s)))
    has_gpu = gpu_rows.height > 0
    comp = gpu_rows.filter(~pl.col("kclass").is_in(list(NON_COMPUTE_KCLASSES)))
    comm = gpu_rows.filter(pl.col("kclass") == "comm")
    copy = gpu_rows.filter(pl.col("kclass").is_in(["memcpy", "memset"]))
    C, M, Y = iv.union_of(comp), iv.union_of(comm), iv.union_of(copy)
    counts = dict(gpu_rows.group_by("_step").len().iter_rows()) if has_gpu else {}
    steps = []
    rows = spans.iter_rows(named=True)
    for i, (row, (ws, we)) in enumerate(zip(rows, windows)):
        steps.append(
            Step(
                step=row["step"],
                name=row["name"],
                cpu_start_ns=row["start"],
                cpu_end_ns=row["end"],
                start_ns=ws,
                end_ns=we,
                warmup=(i == 0 and len(windows) > 1 and not options.include_warmup),
                kernels=counts.get(i, 0),
                gpu=partition(C, M, Y, ws, we),
            )
        )
    kept = [s for s in steps if not s.warmup] or steps
    total = sum((s.gpu for s in kept), ZERO)
    if not has_gpu:
        warnings.append(f"{meta.path}: no GPU activity in the selected steps; GPU time is unknown")
    return RankResult(
        rank=meta.rank,
        file=fi,
        path=meta.path,
        device={"id": meta.device_id, "name": meta.device_name, "platform": meta.platform},
        window_start_ns=min(s.start_ns for s in kept),
        window_end_ns=max(s.end_ns for s in kept),
        clock_offset_ns=meta.clock_offset_ns,
        steps=tuple(steps),
        gpu=total if has_gpu else None,
        warnings=tuple(warnings),
    )


def partition(C: iv.Intervals, M: iv.Intervals, Y: iv.Intervals, start: int, end: int) -> GpuTime:
    """The exact GPU-time partition of the window [start, end)."""
    c = iv.clip(C, start, end)
    m = iv.clip(M, start, end)
    y = iv.clip(Y, start, end)
    busy = iv.union(iv.union(c, m), y)
    window = max(end - start, 0)
    idle = window - iv.length(busy)
    x = iv.subtract(m, c)
    z = iv.subtract(y, iv.union(c, m))
    return GpuTime(
        window=window,
        idle=idle,
        compute=iv.length(c),
        exposed_comm=iv.length(x),
        exposed_memcpy=iv.length(z),
        comm=iv.length(m),
        memcpy=iv.length(y),
    )


def parse_steps(text: str) -> tuple[int, int]:
    """'3:7' -> (3, 7); '5' -> (5, 5); ':7' and '3:' are open-ended."""
    m = re.fullmatch(r"\s*(\d*)\s*(?::\s*(\d*))?\s*", text)
    if not m or (not m.group(1) and not m.group(2) and ":" not in text):
        raise ValueError(f"bad step selection {text!r} (use N, A:B, :B or A:)")
    a = int(m.group(1)) if m.group(1) else 0
    if ":" in text:
        b = int(m.group(2)) if m.group(2) else 2**62
    else:
        b = a
    return a, b
