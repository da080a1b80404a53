"""The per-rank map. Where the GPU time went: steps and the exact GPU-time partition, per rank and per step.

``analyze(trace, options) -> Analysis`` reads only the loaded event table (no files, no
Textual) and returns plain frozen dataclasses that renderers turn into JSON or text.

Definitions (DESIGN.md 4.1-4.2, MFU.md 9.2-9.3):

* Steps are ``ProfilerStep#N`` spans on the thread that records them (else ranges whose name
  matches ``options.step_range``, else the whole trace is one step).  A kernel belongs to the
  step in which it was *launched* (its runtime call's time; its own start when the launch is
  not in the trace).  A step's GPU window runs from its first kernel's start to the next step's
  first kernel's start (a step without kernels: from its CPU start, or from where the GPU work
  launched before it ends if later; never before the window before it, so windows do not overlap); the last step ends at the later of its CPU span's end and its last
  kernel's end, but the trace's last ProfilerStep (closed by the profiler's stop) ends where its
  traced GPU and host work ends: the rest of its CPU span is its untraced tail, reported apart
  and outside the window.  Without steps the window is the first to the last GPU activity.
  The first step is flagged as warm-up and left out of the rank's totals when there are other
  steps.
* In a window W, with C the union of compute kernels, M of communication kernels and Y of
  copies and fills: idle I = W \\ (C ∪ M ∪ Y), exposed communication X = M \\ C, exposed memcpy
  Z = Y \\ (C ∪ M).  |I| + |C| + |X| + |Z| = |W| exactly.
"""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from math import fsum
from typing import Any, NamedTuple

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.analysis import waterfall
from tracelens.analysis.rank import segments
from tracelens.analysis.rank.idle import _GRAPH_LAUNCH, _IdleAttribution
from tracelens.analysis.rank.names import Names
from tracelens.analysis.rank.names import of as of_names
from tracelens.analysis.suggest import input_bound_class
from tracelens.model import gpus
from tracelens.model.options import Options
from tracelens.model.schema import END, NON_COMPUTE_KCLASSES
from tracelens.model.summary import WHOLE_TRACE, ZERO, DataLoading, GpuTime, IdleSplit, RankResult, Step, kept_indices, kept_steps
from tracelens.model.units import fmt_ns

_STEP_NUM = re.compile(r"#(\d+)$")


# what the Kineto wording ("no ProfilerStep spans", "record_shapes=False") would misstate for an nsys export
NSYS_NO_STEPS = ("no step ranges (NVTX ranges named ProfilerStep#N, step, train_step, iteration ...; or give "
                 "--step-range REGEX naming the NVTX ranges that are steps)")
NSYS_NO_SHAPES = ("an nsys export records no op shapes: model FLOPs and MFU unknown (give --model-flops-per-step, or "
                  "--params with --tokens-per-step)")


def _step_spans(df: pl.DataFrame, options: Options) -> tuple[pl.DataFrame, int | None]:
    """(name, step, start, end) of the steps, on the thread that records them."""
    if options.step_range:
        spans = df.lazy().filter(
            pl.col("kind").is_in(["annotation", "cpu_op", "step", "dataloader"])
            & pl.col("tid").is_not_null()
            & pl.col("name").cast(pl.String).str.contains(options.step_range)
        )
    else:
        spans = df.lazy().filter((pl.col("kind") == "step") & pl.col("tid").is_not_null())
    # the span columns only (lazy chains: each eager step would be a query of its own)
    spans = spans.select("pid", "tid", "name", "ts_ns", "dur_ns").collect(engine="in-memory")
    if spans.height == 0:
        return pl.DataFrame(schema={"name": pl.String, "step": pl.Int64, "start": pl.Int64, "end": pl.Int64}), None
    main = spans.lazy().group_by("pid", "tid").len().sort("len", "tid", descending=[True, False]).collect(engine="in-memory").row(0, named=True)
    out = spans.lazy().filter((pl.col("pid") == main["pid"]) & (pl.col("tid") == main["tid"])).select(
        pl.col("name").cast(pl.String),
        pl.col("name").cast(pl.String).str.extract(r"#(\d+)$").cast(pl.Int64).alias("step"),
        pl.col("ts_ns").alias("start"),
        END.alias("end"),
    ).sort("start")
    out = out.with_columns((pl.col("start") == pl.col("start").max()).alias("last"))  # the trace's last step
    if options.steps is not None:
        a, b = options.steps
        out = out.filter(pl.col("step").is_between(a, b))
    return out.collect(engine="in-memory"), main["tid"]


# the columns of the GPU rows the stages read (segments, idle, kernels, facts): the rank's
# frame has 24, and every sort and join of the GPU rows would carry them all
_GPU_COLUMNS = ("kind", "name", "ts_ns", "dur_ns", "kclass", "correlation", "collective", "group", "group_desc")


class _Frames(NamedTuple):
    """What the rank's stages read of its whole frame, split off it once (``_split``)."""

    gpu: pl.DataFrame  # the GPU rows on the rank's device, ``_GPU_COLUMNS`` and the launch columns, in table order
    other_devices: int  # GPU rows on other devices (left out)
    start: int | None  # the first start and the last end of any event
    end: int | None
    host_start: int | None  # the same over the events on a thread
    host_end: int | None


def _split(df: pl.DataFrame, device: int | None, names: Names) -> _Frames:
    """The rank's narrow frames and bounds, in one batch of queries: its GPU rows (only the columns
    the stages read) with each one's launch (its runtime call, same correlation: time, thread,
    whether it is a graph launch; else its own start), and the time bounds."""
    lf = df.lazy()
    is_gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
    mine = pl.lit(True) if device is None else pl.col("device") == device
    launches = (
        lf.select("kind", "correlation", "ts_ns", "tid", "name")
        .filter(pl.col("kind").is_in(["runtime", "sync"]) & pl.col("correlation").is_not_null())
        .sort("ts_ns")
        .group_by("correlation")
        .agg(pl.col("ts_ns").first().alias("launch_ns"), pl.col("tid").first().alias("launch_tid"),
             names.like(_GRAPH_LAUNCH).first().alias("launch_graph"))
    )
    gpu = (
        lf.filter(is_gpu & mine).select(*_GPU_COLUMNS)
        .join(launches, on="correlation", how="left", maintain_order="left")
        .with_columns(
            pl.col("launch_ns").is_not_null().alias("launch_known"),
            pl.col("launch_ns").fill_null(pl.col("ts_ns")),
            pl.col("launch_graph").fill_null(False),  # replayed from a CUDA/HIP graph
        )
    )
    on_thread = pl.col("tid").is_not_null()
    bounds = lf.select(
        (is_gpu & ~mine).sum().alias("other"),
        pl.col("ts_ns").min().alias("s"), END.max().alias("e"),
        pl.col("ts_ns").filter(on_thread).min().alias("hs"), END.filter(on_thread).max().alias("he"),
    )
    gpu, bounds = pl.collect_all([gpu, bounds], engine="in-memory")
    other, s, e, hs, he = bounds.row(0)
    return _Frames(gpu, other or 0, s, e, hs, he)


def _name_patterns() -> tuple[str, ...]:
    """The name regexes the stages of ``_analyze_rank`` test (each through ``Names``), whatever
    the trace holds: matched together up front (``Names.prefetch``), the same names as one by one."""
    from tracelens.analysis.rank import flops as fl
    from tracelens.analysis.rank import idle
    from tracelens.analysis.rank import kernels as kt
    from tracelens.analysis.rank import pipeline as pp

    return (idle._BLOCKING, idle._ASYNC_COPY, _GRAPH_LAUNCH, "(?i)pageable", "DtoH", _BACKWARD_KERNELS, _BACKWARD_OPS,
            fl.MOE_NO_WEIGHTS, fl.SAGE_ATTN, fl._BWD_NODE, fl._TRANSPOSE_OP, kt.TF32_KERNEL, pp._SENDRECV_KERNEL,
            pp._ACTION_TORCH, pp._ACTION_PP, pp._OVERLAP_PP, pp._ACTION_MARKER, pp._ACTION_PY)


def _analyze_rank(df: pl.DataFrame, fi: int, meta, options: Options) -> RankResult:
    warnings: list[str] = []
    names = Names(df)  # the rank's distinct names: every name test runs on them
    names.prefetch(_name_patterns())  # the patterns the stages below ask for, in one query
    frames = _split(df, meta.device_id, names)
    gpu_rows = frames.gpu
    if frames.other_devices:
        warnings.append(f"{meta.path}: {frames.other_devices} GPU events on devices other than {meta.device_id} are left out")
    spans, main_tid = _step_spans(df, options)
    host_start, host_end = frames.start, frames.end
    tails = [0] * max(spans.height, 1)  # per step: its CPU span after all traced work (the last ProfilerStep's only)
    basis = "ranges" if options.step_range else "steps"
    spans_were_empty = spans.height == 0
    if spans_were_empty:
        k0, k1 = gpu_rows.select(pl.col("ts_ns").min().alias("s"), END.max().alias("e")).row(0)
        spans = pl.DataFrame(
            {"name": [WHOLE_TRACE], "step": [None], "start": [host_start], "end": [host_end]},
            schema={"name": pl.String, "step": pl.Int64, "start": pl.Int64, "end": pl.Int64},
        )
        gpu_rows = gpu_rows.with_columns(pl.lit(0, pl.Int64).alias("_step"))
        lead = ("no steps match the selection" if (options.step_range or options.steps)
                else NSYS_NO_STEPS if meta.format == "nsys" else "no ProfilerStep spans")
        if k0 is not None:
            # no steps: the window is the GPU's activity, from its first start to its last end (the
            # host's lead-in before the first kernel and its tail after the last are not GPU idle)
            windows, basis = [(k0, k1)], "gpu_activity"
            hs, he = frames.host_start, frames.host_end
            out = [f"{fmt_ns(k0 - hs)} of host events before the first GPU activity"] if hs is not None and hs < k0 else []
            out += [f"{fmt_ns(he - k1)} after the last"] if he is not None and he > k1 else []
            warnings.append(f"{meta.path}: {lead}: the whole trace is one step, windowed from its first to its last GPU "
                            f"activity ({fmt_ns(k1 - k0)})" + (f"; {' and '.join(out)} are outside the window" if out else ""))
        elif host_start is None:  # no timed event at all (only metadata or instants): one empty step
            windows, basis = [(0, 0)], "host"
            spans = spans.with_columns(pl.lit(0, pl.Int64).alias("start"), pl.lit(0, pl.Int64).alias("end"))
            warnings.append(f"{meta.path}: no complete ('X') events with a timestamp: nothing to measure in this file")
        else:
            windows, basis = [(host_start, host_end)], "host"
            if options.step_range or options.steps:
                warnings.append(f"{meta.path}: {lead}; the whole trace is one step")
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
        per_step = gpu_rows.group_by("_step").agg(pl.col("ts_ns").min().alias("first"), END.max().alias("last"), pl.len())
        steps_seen = per_step.get_column("_step").to_list()  # one per step: its first and last GPU activity, how many
        first_k = dict(zip(steps_seen, per_step.get_column("first").to_list()))
        last_k = dict(zip(steps_seen, per_step.get_column("last").to_list()))
        counts = dict(zip(steps_seen, per_step.get_column("len").to_list()))
        n = spans.height
        # the trace's last ProfilerStep is closed by the profiler's stop: its CPU span after all
        # traced GPU and host work is its untraced tail, kept out of the window (not for --step-range
        # ranges, which the user's code closes, nor for CPU-only traces, which have no GPU window)
        cut = bool(spans.get_column("last")[-1]) and not options.step_range and gpu_rows.height > 0
        tail_end = spans.get_column("end")[-1]
        traced_host: list[int | None] = []  # _traced_host_end(df, tail_end), computed once when needed

        def host_end() -> int | None:
            if not traced_host:
                traced_host.append(_traced_host_end(df, tail_end))
            return traced_host[0]

        if cut and n > 1 and (n - 1) not in first_k and (host_end() or 0) <= starts[-1]:
            # a last step with nothing traced in it at all (opened just before the stop) is no step:
            # it is dropped and its span joins the untraced tail of the step before it
            warnings.append(f"{meta.path}: the last step ({spans.get_column('name')[-1]}, "
                            f"{fmt_ns(tail_end - starts[-1])}) holds no traced work (the profiler's stop): not counted as a step")
            spans, n, tails = spans.head(n - 1), n - 1, tails[:-1]
        # where each window starts: its step's first kernel's start; for a step without kernels its CPU
        # start, but not before the GPU work launched earlier ends (up to a later step's first kernel): the
        # GPU runs behind the host, and that work is the earlier step's.  No window starts before the one
        # before it: the windows tile, never overlap
        later, m = [None] * n, None  # per step, the earliest first kernel of the steps after it
        for i in range(n - 1, -1, -1):
            later[i] = m
            if i in first_k:
                m = first_k[i] if m is None else min(m, first_k[i])
        bounds, done = [], None  # done: where the GPU work of the steps so far ends
        for i in range(n):
            b = first_k.get(i, starts[i])
            if i not in first_k and done is not None:
                b = max(b, done if later[i] is None else min(done, later[i]))
            bounds.append(max(b, bounds[-1]) if bounds else b)
            if i in last_k:
                done = last_k[i] if done is None else max(done, last_k[i])
        windows = []
        for i in range(n):
            s = bounds[i]
            if i + 1 < n:
                e = bounds[i + 1]
            else:
                cpu_end = spans.get_column("end")[i]
                e = max(cpu_end, last_k.get(i, cpu_end))
                if cut:
                    gpu_end = gpu_rows.select(END.max()).item()
                    traced = max(x for x in (gpu_end, host_end()) if x is not None)
                    if traced < cpu_end:
                        e = max(traced, s)
                    tails[i] = max(tail_end - e, 0)
                    if 20 * tails[i] >= tail_end - s:  # 5% of the step or more: say so
                        warnings.append(
                            f"{meta.path}: the last step ({spans.get_column('name')[i]}) runs {fmt_ns(tails[i])} past its "
                            "last GPU activity and its last traced host event with nothing recorded (the profiler's stop): "
                            "that untraced tail is left out of the step's window, its idle time and the waterfall")
            windows.append((s, max(e, s)))
    has_gpu = gpu_rows.height > 0
    comp = gpu_rows.filter(~pl.col("kclass").is_in(list(NON_COMPUTE_KCLASSES)))
    C = iv.union_frame(comp)  # the compute time, for each collective's exposed time (rank.collectives)
    if spans_were_empty:
        counts = {0: gpu_rows.height} if has_gpu else {}
    if main_tid is None:  # no steps: the thread that launched most GPU work
        top = gpu_rows.filter(pl.col("launch_known")).group_by("launch_tid").len().sort("len", descending=True)
        main_tid = top.get_column("launch_tid")[0] if top.height else None
    attr = _IdleAttribution(df, gpu_rows, options, main_tid, names)
    from tracelens.analysis.rank import recompute

    recomp = recompute.find(df, names)
    launched = None
    if recomp.height and has_gpu:  # GPU work launched from inside a recomputed forward op
        launched = (
            gpu_rows.select("ts_ns", "launch_ns", "launch_tid", "dur_ns").with_row_index("_g")
            .filter(pl.col("launch_tid").is_not_null()).sort("launch_ns")
            .join_asof(recomp.select(pl.col("tid").alias("launch_tid"), pl.col("ts_ns").alias("_rs"), "end").sort("_rs"),
                       left_on="launch_ns", right_on="_rs", by="launch_tid", strategy="backward", check_sortedness=False)
            .filter(pl.col("_rs").is_not_null() & (pl.col("launch_ns") < pl.col("end")))
        )
    # MFU: model FLOPs (from shapes, or the user's per-step number) over peak x window
    spec, why = gpus.identify(meta.device_properties, meta.device_name) if has_gpu else (None, None)
    gpu_source = "trace" if spec else None
    if options.gpu or options.peak_tflops:
        given = dict(options.given)
        spec, why2 = gpus.override(spec, options.gpu, options.peak_tflops, given.get("gpu", "--gpu"))
        why = why2 or (None if spec else why)
        gpu_source = (given.get("peak_tflops") if options.peak_tflops else given.get("gpu")) or "options"
        gpu_source = gpu_source if spec else None
    from tracelens.analysis.rank import flops as fl

    counted = fl.count(df, names)  # once per rank: FLOPs, MFU, facts and the matmul table all read it
    linked, known = None, None  # kernels tied to their counted ops; the matmul kernels among them (positions in gpu_rows)
    if has_gpu:
        from tracelens.analysis.rank import kernels as kt

        counted = kt.tf32_ops(df, counted, gpu_rows, names)
        kernels = gpu_rows.filter(pl.col("kind") == "kernel")
        linked = kt.kernel_ops(df, counted, kernels, spec)
        known = _known_matmul(gpu_rows, kernels, linked)
    # the pipeline's blocks first: where a step has them, its idle outside them is the pipeline bubble
    from types import SimpleNamespace

    from tracelens.analysis.rank import pipeline as pp

    pre = [SimpleNamespace(step=row["step"], name=row["name"], cpu_start_ns=row["start"], cpu_end_ns=row["end"], start_ns=ws, end_ns=we,
                           warmup=(i == 0 and len(windows) > 1 and not options.include_warmup))
           for i, (row, (ws, we)) in enumerate(zip(spans.iter_rows(named=True), windows))]
    pipe, pipe_blocks = pp.rank_pipeline(df, gpu_rows, pre, meta, names)
    piped = set(pipe_blocks.get_column("_step").unique().to_list()) if has_gpu else set()
    # one sweep: the partition, the gaps, and the matmul time whose FLOPs are known (segments.cut's known_matmul);
    # on a pipeline rank the P2P kernels' exposed time apart (the waterfall's bubble, not its exposed communication)
    side = (pipe or {}).get("side_groups")  # P2P that is no pipeline hand-off (a CP ring, an MoE exchange): communication
    cuts, gaps = segments.cut_frames(gpu_rows, launched, windows, known, p2p_apart=bool(piped), side_groups=side)
    known_mm = [c.known_matmul for c in cuts] if known is not None else None  # per window
    attr.run(gaps, pipe_blocks if has_gpu else None, side_groups=side)
    parts = []
    for i, k in enumerate(cuts):
        gpu = GpuTime(k.window, k.idle, k.compute, k.exposed_comm, k.exposed_memcpy, k.comm, k.memcpy)
        parts.append((gpu, attr.split(i)))
    steps = []
    rows = spans.iter_rows(named=True)
    # the data wait is the window's data-loading idle (the waterfall's bar), and the host's
    # DataLoader time is counted over the same window
    dl_hosts = attr.dl_host(windows)
    for i, (row, (ws, we), (gpu, idle), dl_host) in enumerate(zip(rows, windows, parts, dl_hosts)):
        waited = idle.data_loading
        frac = waited / gpu.window if gpu.window else 0.0
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
                gpu=gpu,
                idle=idle,
                data=DataLoading(dl_host, waited, frac, input_bound_class(frac)),
                untraced_tail_ns=tails[i],
            )
        )
    step_flops, step_ideal, recompute_flops, source, fwarn = _step_flops(df, counted, spans, options, spec, recomp,
                                                                         linked if known_mm is not None else None, names)
    if fwarn:
        if meta.format == "nsys" and fwarn.startswith("shapes were not recorded"):
            fwarn = NSYS_NO_SHAPES  # no record_shapes in nsys: what is true of an export
        warnings.append(f"{meta.path}: {fwarn}")
    if has_gpu and spec is None and why:
        if meta.format == "nsys" and "deviceProperties" in why:
            why = "the export describes no GPU (no TARGET_INFO_GPU table): give --gpu NAME"
        warnings.append(f"{meta.path}: MFU unknown: {why}")
    peak = spec.peak(spec.reference_dtype) if spec else None
    steps = [
        replace(
            st,
            flops=step_flops.get(i) if step_flops is not None else None,
            mfu=(step_flops.get(i, 0.0) / (peak * st.gpu.window / 1e9))
            if (step_flops is not None and peak and has_gpu and st.gpu.window)
            else None,
        )
        for i, st in enumerate(steps)
    ]
    if has_gpu:
        steps = _waterfalls(steps, cuts, step_ideal, known_mm if source == "shapes" else None, piped)
    kept = kept_steps(steps)
    total = sum((s.gpu for s in kept), ZERO)
    idle_total = sum((s.idle for s in kept), IdleSplit())
    flops = sum(s.flops or 0.0 for s in kept) if step_flops is not None else None
    mfu = flops / (peak * total.window / 1e9) if (flops is not None and peak and has_gpu and total.window) else None
    mfu_error = _given_mfu_error(mfu, options, source, gpu_source, meta, peak, total, flops)
    if mfu_error:  # the user's FLOPs or peak say more than the GPU can do: never shown as an MFU
        warnings.append(f"{meta.path}: MFU unknown: {mfu_error}")
        mfu = None
        steps = [replace(s, mfu=None, waterfall=None) for s in steps]
        kept = kept_steps(steps)
    rflops = sum(recompute_flops.get(i, 0.0) for i, s in enumerate(steps) if s in kept)
    hfu = (flops + rflops) / (peak * total.window / 1e9) if mfu is not None else None
    live = [s for s in kept if s.gpu.window > 0]  # a step whose window is empty adds no time, and has no waterfall
    fall = waterfall.combine([s.waterfall for s in live]) if live and all(s.waterfall for s in live) else None
    unplaced = [s for s in kept if s.gpu.window <= 0 and s.flops]
    if fall is not None and unplaced and mfu is not None:  # their FLOPs are in the rank's MFU, in no step's bars
        fall = waterfall.ending_at(fall, mfu)
        warnings.append(f"{meta.path}: {len(unplaced)} step(s) ({', '.join(s.name for s in unplaced[:3])}) have an empty GPU window "
                        f"(the next step's first kernel starts no later than theirs would) while their ops count {sum(s.flops for s in unplaced):.3g} "
                        "FLOPs: those FLOPs are in the rank's MFU but in no step's bars (a negative part of the convention bar)")
    time_fall = waterfall.combine([s.time_waterfall for s in kept])
    facts = _facts(df, counted, gpu_rows, kept, spec, steps, attr, names) if has_gpu else {}
    from tracelens.analysis.rank import kernels as kt

    kernel_table, matmuls, kernels_total = None, [], None
    if has_gpu:
        kernel_table = kt.by_name(kernels, linked)  # every name, a frame; the report keeps each rank's longest
        kernels_total = dict(zip(("names", "launches", "total_ns"), kernels.select(
            pl.col("name").n_unique(), pl.len(), pl.col("dur_ns").sum()).row(0)))
        matmuls = kt.matmul_efficiency(df, counted, linked, spec, top=None)
    if fall is not None and matmuls:
        fall = waterfall.with_parts(fall, "matmul_below_peak", kt.below_peak_by_shape(matmuls))
    quality = _flops_quality(meta, kept, cuts, steps, known_mm, source, mfu, fall, matmuls, kernel_table,
                             kernels if has_gpu else None, linked, fwarn, warnings)
    matmuls_total = len(matmuls)
    matmuls = kt.keep_top(matmuls)
    if not has_gpu:
        warnings.append(f"{meta.path}: no GPU activity in the selected steps; GPU time is unknown")
    crit, what_if = None, None
    if options.critical_path:  # asked for (--critical-path): it costs about as much as the rest of this analysis
        from tracelens.analysis.rank import critical, replay
        from tracelens.analysis.rank.collectives import collective_rows

        crows = collective_rows(df, C, fi, meta.rank)  # where the job's path may cross to another rank (a CPU job's: its host spans)
        marks = critical.collective_marks(crows, windows) if crows is not None else None
        g = critical.graph(df, meta.device_id, main_tid, names)  # built once: the path and the what-if replay share it
        crit = critical.summarize(critical.step_paths(df, meta.device_id, windows, main_tid, names, marks=marks, g=g), steps,
                                  kept_indices(steps), crows, windows)
    result = RankResult(
        rank=meta.rank,
        file=fi,
        path=meta.path,
        device={"id": meta.device_id, "name": meta.device_name, "platform": meta.platform},
        window_start_ns=min(s.start_ns for s in kept),
        window_end_ns=max(s.end_ns for s in kept),
        clock_offset_ns=meta.clock_offset_ns,
        steps=tuple(steps),
        gpu=total if has_gpu else None,
        idle=idle_total if has_gpu else None,
        warnings=tuple(warnings),
        peak_flops=peak,
        peaks={k: spec.peak(k) for k in spec.peak_tflops} if spec else {},
        gpu_model=spec.name if spec else None,
        gpu_source=gpu_source,
        peak_bandwidth=spec.mem_tbps * 1e12 * spec.scale if (spec and spec.mem_tbps) else None,
        flops=flops,
        flops_source=source if step_flops is not None else None,
        mfu=mfu,
        waterfall=fall,
        recompute_flops=rflops if step_flops is not None else None,
        hfu=hfu,
        facts=facts,
        kernels=tuple(kt.table_rows(kernel_table)) if kernel_table is not None else (),
        kernel_table=kernel_table,
        matmuls=tuple(matmuls),
        window_basis=basis,
        untraced_tail_ns=sum(s.untraced_tail_ns for s in kept),
        time_waterfall=time_fall,
        kernels_total=kernels_total,
        matmuls_total=matmuls_total,
        gpu_notes=spec.notes if spec else (),
        mfu_error=mfu_error,
        critical_path=crit,
        pipeline=pipe,
        what_if=what_if,
        **quality,
    )
    if options.critical_path:  # the changes of the suggestions this rank triggers, replayed on its graph (suggest.what_if)
        from tracelens.analysis import suggest

        wanted = suggest.changes_for(result)
        if wanted:
            result = replace(result, what_if=replay.for_rank(df, g, windows, main_tid, wanted))
    return result, C


def _traced_host_end(df: pl.DataFrame, before: int) -> int | None:
    """Where the last traced host work before ``before`` ends (capped there): any host event but
    the ProfilerStep spans, on a thread that runs framework code (ops, annotations, steps,
    DataLoader spans, Python functions); a thread that only calls the runtime (a watchdog polling
    cudaEventQuery) does no host work of the job's."""
    framework = pl.col("kind").is_in(["cpu_op", "annotation", "python", "dataloader", "step"])
    work = (pl.col("kind") != "step") & (pl.col("ts_ns") < before)
    return (  # per thread: does it run framework code, and where its host work before ``before`` ends
        df.lazy().filter(pl.col("tid").is_not_null())
        .group_by("pid", "tid")
        .agg(framework.any().alias("_fw"), pl.min_horizontal(END, pl.lit(before)).filter(work).max().alias("_end"))
        .filter(pl.col("_fw"))
        .select(pl.col("_end").max())
        .collect(engine="in-memory")
        .item()
    )


def _facts(df: pl.DataFrame, counted: pl.DataFrame, gpu_rows: pl.DataFrame, kept: list[Step], spec,
           steps: list[Step] | None = None, attr: _IdleAttribution | None = None, names: Names | None = None) -> dict[str, Any]:
    """Measurements the suggestion rules need beyond the waterfall, over the steps kept."""
    names = of_names(df, names)
    lo, hi = min(s.start_ns for s in kept), max(s.end_ns for s in kept)
    inside = (pl.col("ts_ns") >= lo) & (pl.col("ts_ns") < hi)
    kernel, memcpy, dur = inside & (pl.col("kind") == "kernel"), inside & (pl.col("kind") == "memcpy"), pl.col("dur_ns")
    graph = kernel & pl.col("launch_graph") if "launch_graph" in gpu_rows.columns else pl.lit(False)
    g = gpu_rows.select(  # the kept window's GPU rows, in one query
        kernel.sum().alias("kernels"),
        dur.filter(kernel).mean().alias("kernel_mean_ns"),
        (kernel & (dur < 10_000)).sum().alias("kernels_under_10us"),
        dur.filter(memcpy & names.like("(?i)pageable")).sum().alias("pageable_memcpy_ns"),
        (memcpy & names.like("DtoH")).sum().alias("memcpy_dtoh_count"),
        dur.filter(kernel & (pl.col("kclass") == "optimizer")).sum().alias("optimizer_kernel_ns"),
        graph.sum().alias("graph_kernels"),
        (kernel & names.like(_BACKWARD_KERNELS)).sum().alias("backward_kernels"),
    ).row(0, named=True)
    counted = counted.drop_nulls("flops")
    by_dtype = dict(counted.group_by("dtype").agg(pl.col("flops").sum()).iter_rows()) if counted.height else {}
    total_flops = sum(by_dtype.values()) or 0.0
    steps = steps if steps is not None else kept
    kept_ids = {id(s) for s in kept}
    kept_idx = [i for i, s in enumerate(steps) if id(s) in kept_ids]
    items = _item_calls(df, steps, kept_idx, names)
    sync_by: dict[str, int] = {}
    for i in kept_idx:
        for name, v in (attr.sync_by.get(i, {}) if attr else {}).items():
            sync_by[name] = sync_by.get(name, 0) + v
    host = _host_counts(df, names)
    return {
        "steps": len(kept),
        "kernels": int(g["kernels"]),
        "kernel_mean_ns": float(g["kernel_mean_ns"]) if g["kernels"] else None,
        "kernels_under_10us": int(g["kernels_under_10us"]),
        "pageable_memcpy_ns": int(g["pageable_memcpy_ns"] or 0),
        "memcpy_dtoh_count": int(g["memcpy_dtoh_count"]),
        "fp32_matmul_flops_share": (by_dtype.get("fp32", 0.0) / total_flops) if total_flops else None,
        "has_tensor_cores": bool(spec and max(spec.peak_tflops.get("bf16", 0), spec.peak_tflops.get("fp16", 0)) > 2 * spec.peak_tflops.get("fp32", 0)),
        # what the precision advice may offer: TF32 exists from Ampere / CDNA3 on, BF16 from Ampere / CDNA2
        "has_tf32": bool(spec and "tf32" in spec.peak_tflops),
        "has_bf16": bool(spec and "bf16" in spec.peak_tflops),
        "optimizer_kernel_ns": int(g["optimizer_kernel_ns"] or 0),
        "sync_calls": host["sync_calls"],
        # .item() calls in the kept steps, each once (aten::item, or a _local_scalar_dense outside one)
        "item_calls": sum(items.values()),
        "item_calls_by_step": items,
        # the blocking calls the sync-drain idle was spent in (or had just returned from), ns
        "sync_by_call_ns": dict(sorted(sync_by.items(), key=lambda kv: (-kv[1], kv[0]))),
        # kernels replayed from CUDA/HIP graphs, and the idle that ends at them
        "graph_kernels": int(g["graph_kernels"]),
        "graph_launch_latency_ns": sum(attr.graph_latency.get(i, 0) for i in kept_idx) if attr else 0,
        "graph_host_launch_ns": sum(attr.graph_host.get(i, 0) for i in kept_idx) if attr else 0,
        **_workload(df, host, g["backward_kernels"], names),
    }


_ITEM = ("aten::item", "aten::_local_scalar_dense")


def _item_calls(df: pl.DataFrame, steps: list[Step], kept_idx: list[int], names: Names | None = None) -> dict[int, int]:
    """.item() calls per kept step (index in ``steps``): each call once, so an aten::item and
    the _local_scalar_dense inside it count one, and a _local_scalar_dense on its own (tolist,
    bool(tensor)) one; a call belongs to the step whose CPU span holds its start."""
    out = dict.fromkeys(kept_idx, 0)
    if not kept_idx or not of_names(df, names).distinct.is_in(list(_ITEM)).any():  # no such op in the trace
        return out
    ops = df.lazy().filter((pl.col("kind") == "cpu_op") & pl.col("name").is_in(list(_ITEM))).select(
        "tid", "ts_ns", END.alias("end"), (pl.col("name") == _ITEM[0]).alias("item")
    ).collect(engine="in-memory")
    if not ops.height:
        return out
    items = ops.filter(pl.col("item")).select("tid", pl.col("ts_ns").alias("_is"), pl.col("end").alias("_ie")).sort("_is")
    inner = ops.filter(~pl.col("item")).sort("ts_ns")
    if items.height and inner.height:
        inner = (
            inner.join_asof(items, left_on="ts_ns", right_on="_is", by="tid", strategy="backward", check_sortedness=False)
            .filter(pl.col("_is").is_null() | (pl.col("end") > pl.col("_ie")))
            .select(ops.columns)
        )
    calls = pl.concat([ops.filter(pl.col("item")), inner]).sort("ts_ns")
    spans = pl.DataFrame(
        {"_k": kept_idx, "_s": [steps[i].cpu_start_ns for i in kept_idx], "_e": [steps[i].cpu_end_ns for i in kept_idx]},
        schema={"_k": pl.Int64, "_s": pl.Int64, "_e": pl.Int64},
    ).sort("_s")
    per = (
        calls.join_asof(spans, left_on="ts_ns", right_on="_s", strategy="backward")
        .filter(pl.col("_k").is_not_null() & (pl.col("ts_ns") < pl.col("_e")))
        .group_by("_k").len()
    )
    out.update({int(i): int(n) for i, n in per.iter_rows()})
    return out


_BACKWARD_OPS = r"(?i)backward|^autograd::engine|^Optimizer\.(step|zero_grad)#|^aten::_fused_(adam|adamw|sgd|adagrad)"


_BACKWARD_KERNELS = r"(?i)backward|_bwd|bwd_|wgrad|dgrad"


_HOST_OPS = ["cpu_op", "annotation", "python", "step"]  # the host rows _workload looks at (on a thread)


def _host_counts(df: pl.DataFrame, names: Names) -> dict[str, int]:
    """The host counts the facts need, in one query: blocking synchronize calls on a thread,
    and for ``_workload`` the CPU ops and the backward/optimizer ops among the host rows."""
    on_thread = pl.col("tid").is_not_null()
    host = pl.col("kind").is_in(_HOST_OPS) & on_thread
    return df.select(
        ((pl.col("kind") == "sync") & on_thread).sum().alias("sync_calls"),
        (host & (pl.col("kind") == "cpu_op")).sum().alias("cpu_ops"),
        (host & names.like(_BACKWARD_OPS)).sum().alias("backward_ops"),
    ).row(0, named=True)


def _workload(df: pl.DataFrame, host: dict[str, int], backward_kernels: int, names: Names) -> dict[str, Any]:
    """Training (backward or optimizer ops, or backward kernels), inference (CPU ops recorded
    and none of them), or None (kernels only, none of them backward): which advice applies.
    ``host``: ``_host_counts``; ``backward_kernels``: the kept window's kernels named as backward."""
    if host["backward_ops"]:
        bw = pl.col("kind").is_in(_HOST_OPS) & pl.col("tid").is_not_null() & names.like(_BACKWARD_OPS)
        top = (df.lazy().filter(bw).group_by(pl.col("name").cast(pl.String).alias("n")).len()
               .sort("len", "n", descending=[True, False]).collect(engine="in-memory").row(0))
        return {"workload": "training", "workload_evidence": f"{host['backward_ops']} backward/optimizer ops ({top[0]} x{top[1]})"}
    kb = backward_kernels
    if kb:
        return {"workload": "training", "workload_evidence": f"{kb} backward kernels"}
    ops = host["cpu_ops"]
    if ops:
        return {"workload": "inference", "workload_evidence": f"no backward or optimizer ops among {ops} CPU ops"}
    return {"workload": None, "workload_evidence": "no CPU ops recorded and no backward kernels: training or inference unknown"}


def _waterfalls(steps: list[Step], cuts: list[segments.StepCut], ideal: dict[int, tuple], known: list[int] | None,
                piped: set[int] = frozenset()) -> list[Step]:
    """Each step's MFU waterfall (when its MFU is known) and GPU-time waterfall, from its
    window's segment sums.  ``ideal``: per step, _Ideal (FLOPs at their dtypes' peaks, held to
    their kernels, by dtype); ``known``: per window, the matmul time whose FLOPs are known (None:
    all of it)."""
    out = []
    for i, st in enumerate(steps):
        k = cuts[i]
        idle, exposed = asdict(st.idle), k.comm_by_group
        if i in piped and segments.P2P_LABEL in exposed:  # a pipeline step: its exposed P2P is bubble (rank.pipeline)
            exposed = {g: ns for g, ns in exposed.items() if g != segments.P2P_LABEL}
            idle["pipeline_bubble_p2p"] = k.comm_by_group[segments.P2P_LABEL]
        st = replace(st, time_waterfall=waterfall.build_time(
            T=st.gpu.window, idle=idle, exposed_comm=exposed, exposed_memcpy=st.gpu.exposed_memcpy,
            compute={"matmul": k.matmul, "recompute": k.recompute, **k.non_matmul}))
        if st.mfu is None or st.gpu.window <= 0:
            out.append(st)
            continue
        fall = waterfall.build(
            T=st.gpu.window,
            idle=idle,
            exposed_comm=exposed,
            exposed_memcpy=st.gpu.exposed_memcpy,
            recompute=k.recompute,
            non_matmul=k.non_matmul,
            matmul_ns=k.matmul,
            ideal_ns=ideal[i].ns if i in ideal else 0.0,
            mfu=st.mfu,
            matmul_known_ns=known[i] if known is not None else None,
            fit_ns=ideal[i].fit_ns if i in ideal else None,
            precision=ideal[i].precision if i in ideal else None,
        )
        out.append(replace(st, waterfall=fall))
    return out


def _known_matmul(gpu_rows: pl.DataFrame, kernels: pl.DataFrame, linked: pl.DataFrame) -> pl.Series | None:
    """The positions in ``gpu_rows`` of the matmul-class kernels launched inside ops with counted
    FLOPs (``segments.cut``'s ``known``: their time outside recomputed work, per window, is the
    matmul time whose FLOPs are known), or None when no kernel can be tied to the op that
    launched it (``kernels``: the kernel rows of ``gpu_rows``, in order)."""
    if not bool(kernels.select(pl.col("launch_known").any()).item()):
        return None
    positions = gpu_rows.select(pl.arg_where(pl.col("kind") == "kernel").cast(pl.UInt32)).to_series()  # kernel _k's row
    return positions.gather(linked.filter(pl.col("_mm")).get_column("_k"))


def _given_mfu_error(mfu: float | None, options: Options, source: str | None, gpu_source: str | None, meta, peak: float | None,
                     total: GpuTime, flops: float | None) -> str | None:
    """Why an MFU above 100% built on a number the user gave (FLOPs, parameters, peak or GPU)
    cannot stand (None when it can): a usage error, not a result.  Without a peak (no GPU
    named), given FLOPs beyond what the fastest GPU in the peak table could do in the window are
    one too."""
    given = dict(options.given)

    def said(key: str, value: str) -> str:  # "--params 1e+12", or "params = 1e+12 in runs/job/tracelens.toml"
        src = given.get(key, "--" + key.replace("_", "-"))
        return f"{src} {value}" if src.startswith("--") else f"{key} = {value} in {src}" if src != "options" else f"{key} {value}"

    user_flops = None
    if source not in (None, "shapes"):
        keys = ["model_flops_per_step"] if options.model_flops_per_step is not None else ["params", "tokens_per_step"]
        user_flops = " ".join(said(k, f"{getattr(options, k):g}") for k in keys)
    if mfu is None and peak is None and user_flops and flops and total.window:
        name, fastest = gpus.fastest()
        over = flops / (fastest * total.window / 1e9)
        if over > 1.0:
            return (f"{user_flops} is {over:.3g} times what the fastest GPU in tracelens' peak table ({name}, "
                    f"{fastest / 1e12:,.0f} TFLOP/s) can do in rank {meta.rank}'s {total.window / 1e6:.3f} ms of GPU time "
                    f"({flops:.3g} FLOPs): give the model FLOPs of one step of one GPU")
    if mfu is None or mfu <= 1.0:
        return None
    causes = [user_flops] if user_flops else []
    if gpu_source not in (None, "trace"):
        causes.append(said("peak_tflops", f"{options.peak_tflops:g} TFLOP/s") if options.peak_tflops else said("gpu", str(options.gpu)))
    if not causes:
        return None  # FLOPs and peak both from the trace: flagged by _flops_quality instead
    pct = f"{100 * mfu:.0f}%" if mfu < 1e4 else f"{100 * mfu:.3g}%"  # 1e30 FLOPs: 5.21e+17%, not 18 digits
    return (f"{' with '.join(causes)} gives an MFU of {pct} on rank {meta.rank} ({flops:.3g} FLOPs per window of "
            f"{total.window / 1e6:.3f} ms at {peak / 1e12:,.1f} TFLOP/s): more than the GPU can do; give the model FLOPs of one "
            "step of one GPU, or its dense peak")


def _flops_quality(meta, kept: list[Step], cuts: list, steps: list[Step], known: list[int] | None, source: str | None,
                   mfu: float | None, fall, matmuls: list[dict[str, Any]], kernel_table: pl.DataFrame | None,
                   kernels: pl.DataFrame | None, linked: pl.DataFrame | None, fwarn: str | None, warnings: list[str]) -> dict[str, Any]:
    """How far the MFU can be trusted, with a warning for each doubt: the share of the kept steps'
    matmul kernel time whose FLOPs are known (below 1: the MFU is a lower bound), and whether some
    counted FLOPs exceed what their kernels could do at their dtype's peak (the MFU may be too high)."""
    from tracelens.model.units import fmt_ns

    idx = kept_indices(steps)  # the kept steps, as ``kept``
    mm = sum(cuts[i].matmul for i in idx) if cuts else 0
    out: dict[str, Any] = {"matmul_ns": mm if kernels is not None else None}
    if source == "shapes" and known is not None and mm:
        without = mm - sum(min(known[i], cuts[i].matmul) for i in idx)
        cov = 1.0 - without / mm
        out.update(matmul_without_flops_ns=without, flops_coverage=cov, lower_bound=without > 0)
        if without > 0:
            from tracelens.analysis.waterfall import MATMUL_CLASSES

            mine = linked.get_column("_k")
            lo, hi = min(s.start_ns for s in kept), max(s.end_ns for s in kept)
            top = (
                kernels.with_row_index("_k")
                .filter(pl.col("kclass").cast(pl.String).is_in(list(MATMUL_CLASSES)) & ~pl.col("_k").is_in(mine.implode())
                        & (pl.col("ts_ns") >= lo) & (pl.col("ts_ns") < hi))
                .group_by(pl.col("name").cast(pl.String)).agg(pl.col("dur_ns").sum()).sort("dur_ns", "name", descending=[True, False]).head(3)
            )
            names = ", ".join(f"{nm[:70]} ({fmt_ns(t)})" for nm, t in top.iter_rows())
            pct = f"{100 * cov:.1f}%" if cov < 0.9995 else ">99.9%"
            value = f" ({100 * mfu:.2f}%)" if mfu is not None else ""
            warnings.append(f"{meta.path}: FLOPs are known for {pct} of the matmul-class kernel time: {fmt_ns(without)} of "
                            f"{fmt_ns(mm)} ran in kernels no op with counted FLOPs launched ({names}); the MFU{value} is a lower bound")
    elif source == "shapes" and known is None and mm and mfu is not None:
        warnings.append(f"{meta.path}: no kernel can be tied to the op that launched it (the trace has no launch records): which "
                        "matmul kernels have counted FLOPs is unknown (flops_coverage null), so the MFU may be a lower bound")
    kt_warning = None
    if matmuls:
        from tracelens.analysis.rank import kernels as kt

        kt_warning = kt.above_peak_warning(matmuls)
        if kt_warning:
            warnings.append(f"{meta.path}: {kt_warning}")
    hot = kernel_table.filter(pl.col("above_peak")).get_column("name").to_list() if kernel_table is not None else []
    if hot and not kt_warning:
        warnings.append(f"{meta.path}: {len(hot)} kernel(s) run above 100% of the peak of their ops' dtype, which no GPU can: the "
                        f"FLOPs or the dtype of the ops that launched them are wrong ({', '.join(k[:70] for k in hot[:3])}); "
                        "their % of peak is shown as unknown")
    beyond = 0
    if fall is not None:
        conv = next(b for b in fall.bars if b.key == "flop_convention")
        beyond = -sum(p["ns"] for p in conv.parts if p["key"] == waterfall.BEYOND_PEAK)
    idle_ops = bool(fwarn and "launched no matmul kernel" in fwarn)
    if beyond > 0 and not kt_warning and not idle_ops and not hot:
        what = "the given model FLOPs" if source not in (None, "shapes") else "the counted FLOPs"
        warnings.append(f"{meta.path}: {what} need {fmt_ns(beyond)} more time at their dtypes' peak than their matmul kernels ran: "
                        "over-counted FLOPs or a wrong dtype; that time is a negative part of the convention bar, and the MFU "
                        "may be overstated")
    out["above_peak"] = bool(kt_warning or hot or idle_ops or beyond > 0)
    return out


class _Ideal(NamedTuple):
    """A step's model FLOPs as time at peak (ns): at each op's own dtype peak (``ns``), each op held
    to the time of the matmul kernels it launched (``fit_ns``), and per dtype the time at its own
    peak minus at the reference peak (``precision``: the convention bar's parts)."""

    ns: float
    fit_ns: float
    precision: dict[str, float]


def _step_flops(
    df: pl.DataFrame, counted: pl.DataFrame, spans: pl.DataFrame, options: Options, spec: gpus.GpuSpec | None,
    recomp: pl.DataFrame, linked: pl.DataFrame | None = None, names: Names | None = None,
) -> tuple[dict[int, float] | None, dict[int, _Ideal], dict[int, float], str | None, str | None]:
    """Model FLOPs per step index (the user's number, else the ops' recorded shapes; an op
    belongs to the step whose CPU span holds its start, on any thread), and the ns those FLOPs
    would take at the peak of each op's own dtype (``_Ideal``); and the recomputed FLOPs per step
    (for HFU).  ``linked`` (kernels.kernel_ops) ties each op to its kernels: an op is held to the
    time of its matmul kernels, and ops with FLOPs that launched none are warned about."""

    from tracelens.analysis.rank import flops as fl

    names = of_names(df, names)
    n = spans.height
    ref = spec.peak(spec.reference_dtype) if spec else None
    user = options.model_flops_per_step
    source = "user"
    if user is None and options.params and options.tokens_per_step:
        # PaLM: 6·N per token, plus 12·L·h·S per token for attention when the shape is given
        per_token = 6.0 * options.params
        if options.seq_len and options.layers and options.hidden:
            per_token += 12.0 * options.layers * options.hidden * options.seq_len
            source = "params: 6·N·T + 12·L·h·S·T (PaLM)"
        else:
            source = "params: 6·N·T"
        user = per_token * options.tokens_per_step
    if user is not None:
        f = float(user)
        return {i: f for i in range(max(n, 1))}, {i: _Ideal(f / ref * 1e9, f / ref * 1e9, {}) for i in range(max(n, 1))} if ref else {}, {}, source, None
    unknown = counted.get_column("flops").null_count()
    if counted.height == unknown:  # nothing countable
        if not df.select(pl.col("args").str.contains('"Input Dims"', literal=True).any()).item():
            return None, {}, {}, None, "shapes were not recorded (record_shapes=False): model FLOPs and MFU unknown (give --model-flops-per-step)"
        if counted.height == 0:
            return None, {}, {}, None, "no matmul, convolution or attention ops with shapes: model FLOPs unknown (give --model-flops-per-step)"
        if counted.get_column("why").null_count() < counted.height:  # convolutions the trace does not say enough about
            return None, {}, {}, None, "model FLOPs and MFU unknown (give --model-flops-per-step): " + "; ".join(
                fl.unknown_notes(counted, lower_bound=False))
        return None, {}, {}, None, f"the shapes of all {unknown} matmul/conv/attention ops are unreadable: model FLOPs unknown"
    # one lazy query up to the ops' steps (each eager step would be a query of its own)
    with_flops = counted.drop_nulls("flops")
    ops = df.lazy().select("pid", "tid", "ts_ns").with_row_index("_row").join(with_flops.lazy(), on="_row")
    if recomp.height:  # ops inside a recomputed forward op are not model FLOPs (PaLM's MFU)
        inside = (
            ops.select("_row", "pid", "tid", "ts_ns").sort("ts_ns")
            .join_asof(recomp.lazy().select("pid", "tid", pl.col("ts_ns").alias("_rs"), "end").sort("_rs"),
                       left_on="ts_ns", right_on="_rs", by=["pid", "tid"], strategy="backward", check_sortedness=False)
            .filter(pl.col("_rs").is_not_null() & (pl.col("ts_ns") < pl.col("end")))
            .collect(engine="in-memory")
            .get_column("_row")
        )
        ops = ops.with_columns(pl.col("_row").is_in(inside.implode()).alias("_recompute"))
    else:
        ops = ops.with_columns(pl.lit(False).alias("_recompute"))
    # the ops' dtypes: those of the counted rows with FLOPs (every one is a row of df)
    peaks = spec.op_peaks(with_flops.get_column("dtype").unique().to_list()) if spec else {}
    ops = ops.with_columns(
        (pl.col("flops") / pl.col("dtype").replace_strict(peaks, default=ref, return_dtype=pl.Float64) * 1e9).alias("ideal_ns")
        if spec
        else pl.lit(None, pl.Float64).alias("ideal_ns")
    )
    tied = linked is not None  # which kernels each op launched is known
    if tied:
        from tracelens.analysis.rank import kernels as kt

        ops = ops.join(kt.op_matmul_ns(linked).lazy(), on="_row", how="left")
    else:
        ops = ops.with_columns(pl.lit(None, pl.Int64).alias("_mmk"))
    ops = ops.with_columns(
        (pl.min_horizontal("ideal_ns", pl.col("_mmk").fill_null(0)) if tied else pl.col("ideal_ns")).alias("_fit_ns"),
        (pl.col("ideal_ns") - pl.col("flops") / ref * 1e9).alias("_prec_ns") if spec else pl.lit(None, pl.Float64).alias("_prec_ns"),
    )
    if n == 0:
        ops = ops.with_columns(pl.lit(0, pl.Int64).alias("_step"))
    else:
        ops = (
            ops.sort("ts_ns")
            .join_asof(spans.lazy().with_row_index("_step").select(pl.col("_step").cast(pl.Int64), "start", "end"),
                       left_on="ts_ns", right_on="start", strategy="backward")
            .filter(pl.col("_step").is_not_null() & (pl.col("ts_ns") <= pl.col("end")))
        )
    ops = ops.collect(engine="in-memory")
    model = ops.filter(~pl.col("_recompute"))
    # exact float sums (math.fsum, exactly rounded whatever the order), so that the same trace
    # always gives the same report to the last bit: one group per step, dtype and recompute flag
    lists: dict[tuple[int, bool], list[list]] = {}
    prec: dict[int, dict[str, float]] = {}
    for i, dt, r, f, t, ft, p in (
        ops.group_by("_step", "dtype", "_recompute").agg("flops", "ideal_ns", "_fit_ns", "_prec_ns").sort("_step", "dtype", "_recompute").iter_rows()
    ):
        acc = lists.setdefault((i, r), [[], [], []])
        for into, v in zip(acc, (f, t, ft)):
            into.extend(v)
        if spec and not r and dt is not None and (v := fsum(p)):
            prec.setdefault(i, {})[dt] = v
    per = {i: (fsum(f), fsum(t) if t[0] is not None else None, fsum(ft) if ft[0] is not None else None)
           for (i, r), (f, t, ft) in lists.items() if not r}
    rec = {i: fsum(f) for (i, r), (f, _, _) in lists.items() if r}
    noted = fl.unknown_notes(counted)  # convolutions whose output size or gradients the trace does not show
    unread = unknown - counted.filter(pl.col("flops").is_null() & pl.col("why").is_not_null()).height
    warns = [f"{unread} matmul/conv/attention ops have shapes tracelens cannot read: their FLOPs are left out"] if unread else []
    warns += noted
    moe = [nm for nm in names.matching(fl.MOE_NO_WEIGHTS).to_list() if nm not in fl.COUNTED]
    opaque = (  # only when the trace has such names at all
        df.lazy().filter((pl.col("kind") == "cpu_op") & pl.col("name").is_in(moe))
        .group_by(pl.col("name").cast(pl.String)).len().sort("len", descending=True).collect(engine="in-memory")
        if moe else None
    )
    if opaque is not None and opaque.height:
        listed = ", ".join(f"{nm} x{c}" for nm, c in opaque.head(3).iter_rows())
        warns.append(f"fused MoE ops without their expert weights among the recorded inputs ({listed}): their FLOPs are not "
                     "counted, so model FLOPs and MFU are lower bounds (give --model-flops-per-step)")
    idle_ops = model.filter(pl.col("_mmk").is_null() & (pl.col("flops") > 0)) if tied else model.clear()
    if idle_ops.height:  # FLOPs that fit in no kernel time: the MFU would count work the GPU did not do here
        op_names = df.get_column("name").gather(idle_ops.get_column("_row")).cast(pl.String)  # only these ops' names
        listed = ", ".join(f"{nm} x{c}" for nm, c in idle_ops.select(op_names.alias("name"))
                           .group_by("name").len().sort("len", "name", descending=[True, False]).head(3).iter_rows())
        share = idle_ops.get_column("flops").sum() / model.get_column("flops").sum()
        warns.append(f"{idle_ops.height} ops with counted FLOPs ({100 * share:.1f}% of the model FLOPs: {listed}) launched no matmul kernel "
                     "that the trace holds (kernels not recorded: CUDA-graph capture or replay, the trace's edge; ops on CPU tensors; "
                     "or kernels not recognised as matmuls): their FLOPs fit in no kernel time, so the MFU may be overstated")
    warn = "; ".join(warns) or None
    steps = range(max(n, 1))
    return (
        {i: float(per.get(i, (0.0, 0.0))[0]) for i in steps},
        {i: _Ideal(float(per.get(i, (0, 0, 0))[1] or 0.0), float(per.get(i, (0, 0, 0))[2] or 0.0), prec.get(i, {})) for i in steps}
        if spec else {},
        {i: float(rec.get(i, 0.0)) for i in steps},
        "shapes",
        warn,
    )


def critical_paths(df: pl.DataFrame, meta, options: Options, steps) -> list:
    """Each step's critical path with its segments (``critical.step_paths(..., with_segments=True)``),
    on the windows and step thread the analysis of this rank used: for the views and the trace
    export, which have the rank's result (``steps``: its Step objects) but not its frames."""
    from tracelens.analysis.rank import critical

    names = Names(df)
    _spans, main_tid = _step_spans(df, options)
    if main_tid is None:  # as _analyze_rank: the thread that launched most GPU work
        gpu = _split(df, meta.device_id, names).gpu
        top = gpu.filter(pl.col("launch_known")).group_by("launch_tid").len().sort("len", descending=True)
        main_tid = top.get_column("launch_tid")[0] if top.height else None
    windows = [(s.start_ns, s.end_ns) for s in steps]
    return critical.step_paths(df, meta.device_id, windows, main_tid, names, with_segments=True)


def step_path_segments(df: pl.DataFrame, meta, options: Options, start_ns: int, end_ns: int) -> pl.DataFrame:
    """One step's critical path as the timeline draws it: its segments in time order (they tile
    the window) with the event each is charged to — (start_ns, end_ns, category, device, stream,
    name): device and stream of a GPU activity, null for a host event or a stretch charged to none.
    For the TUI's timeline, on demand (the report holds only each step's top events)."""
    window = type("Window", (), {"start_ns": start_ns, "end_ns": end_ns})
    (path,) = critical_paths(df, meta, options, [window])
    seg = path.segments
    if seg is None or seg.height == 0:
        return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "category": pl.String, "device": pl.Int64,
                                    "stream": pl.Int64, "name": pl.String})
    ev = df.select(pl.col("device").cast(pl.Int64), pl.col("stream").cast(pl.Int64), pl.col("name").cast(pl.String),
                   pl.col("kind")).with_row_index("row")
    gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
    return (seg.select(pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64), pl.col("category").cast(pl.String),
                       pl.col("row").cast(pl.UInt32))
            .join(ev, on="row", how="left")
            .select("start_ns", "end_ns", "category", pl.when(gpu).then("device").alias("device"),
                    pl.when(gpu).then("stream").alias("stream"), "name")
            .sort("start_ns"))
