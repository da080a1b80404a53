"""Job -> Analysis: the per-rank map (tracelens.analysis.rank) and the job reduce.

``analyze(job, options) -> Analysis`` reads each rank's events from the job's handles, one rank
at a time, into a RankSummary (``rank_summary``), drops them, and reduces the summaries (clock
alignment, collectives, stragglers, the timeline picture, warnings).  No files but the job's,
no Textual; plain frozen dataclasses that renderers turn into JSON or text."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.analysis.options import Options, parse_steps  # noqa: F401 (re-exported)
from tracelens.analysis.rank import _analyze_rank
from tracelens.analysis.report import Analysis
from tracelens.analysis.suggest import input_bound_class  # noqa: F401 (re-exported)
from tracelens.analysis.timeline import STRIP_COLUMNS, step_strips
from tracelens.model.summary import IDLE_KEYS, ZERO, DataLoading, GpuTime, IdleSplit, RankResult, RankSummary, Step  # noqa: F401 (re-exported)
from tracelens.store.job import Job, RankHandle

_STEP_COLUMNS = {"file": pl.Int32, "kind": pl.String, "name": pl.String, "ts_ns": pl.Int64}


def rank_summary(events: pl.DataFrame, fi: int, meta, options: Options) -> RankSummary:
    """The per-rank map: one rank's events -> its RankSummary (all the reduce needs of it)."""
    from tracelens.analysis.job import comm

    result, compute = _analyze_rank(events, fi, meta, options)
    # COLLECTIVE ROWS: tracelens.analysis.rank.collectives.collective_rows(events, compute, fi, meta.rank) goes here
    # (this rank's rows of COLLECTIVE_SCHEMA, reduced across ranks by a polars job reduce); until then the reduce
    # matches collectives from each rank's comm kernel spans below
    rows = None
    spans = comm.comm_kernels(events)
    near = _compute_near(compute, spans)
    steps = (
        events.lazy().filter(pl.col("kind") == "step")
        .select(pl.col("file"), pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String), "ts_ns").collect()
    )
    lo, hi = events.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
    pids = tuple(events.get_column("pid").drop_nulls().unique().sort().to_list())
    return RankSummary(result, near, spans, steps, lo, hi, pids, rows, events.height)


def _compute_near(compute: iv.Intervals, spans: pl.DataFrame) -> tuple[tuple[int, int], ...]:
    """The intervals of the compute union that overlap the rank's collective spans: all that
    their exposed time (spans minus compute) needs, and far fewer than the whole union."""
    comm_union = iv.union_of(spans)
    if not compute or not comm_union:
        return ()
    c = pl.DataFrame(compute, schema={"s": pl.Int64, "e": pl.Int64}, orient="row")
    m = pl.DataFrame(comm_union, schema={"ms": pl.Int64, "me": pl.Int64}, orient="row")
    # the last collective span that starts before a compute interval ends overlaps it, or none
    # does (the spans are disjoint and sorted: the earlier ones end earlier still)
    hit = (
        c.with_columns((pl.col("e") - 1).alias("_e"))
        .join_asof(m, left_on="_e", right_on="ms", strategy="backward")
        .filter(pl.col("me").is_not_null() & (pl.col("me") > pl.col("s")))
    )
    return tuple(hit.select("s", "e").iter_rows())


def _summarize(args: tuple[RankHandle, Options]) -> RankSummary:
    """One task of the map: read a rank's events (from the cache or memory), summarise, drop them."""
    handle, options = args
    return rank_summary(handle.read(), handle.file, handle.meta, options)


def analyze(job: Job, options: Options | None = None, engine=None) -> Analysis:
    """The analysis of a loaded job.  ``engine`` (``tracelens.engine``): where the per-rank map
    runs; by default in this process, one rank at a time."""
    from tracelens.analysis.job import comm
    from tracelens.engine import LocalEngine

    options = options or Options()
    metas = job.metas
    summaries: dict[int, RankSummary] = {}
    for i, got in (engine or LocalEngine()).map(_summarize, [(h, options) for h in job.handles]):
        if isinstance(got, BaseException):
            raise got
        summaries[i] = got
    ordered = [summaries[i] for i in range(len(metas))]
    ranks = [s.result for s in ordered]
    computes: dict[int, iv.Intervals] = {s.file: list(s.compute) for s in ordered}
    warnings: list[str] = []
    spans = pl.concat([s.comm_spans for s in ordered], how="vertical")
    steps = pl.concat([s.step_starts.cast(_STEP_COLUMNS) for s in ordered], how="vertical")
    ev = steps  # comm.align_clocks reads only the steps' starts of the events it is given
    # files whose collectives were numbered by per-rank order, not by the trace's sequence numbers
    derived = frozenset(i for i, m in enumerate(metas) if m.attributes.get("seq_source", "trace") != "trace")
    if job.separate_runs:  # separate runs share no clock: nothing to align (the load warning says why)
        zero = dict.fromkeys(range(len(metas)), 0)
        align = comm.ClockAlignment(zero, "none", dict(zero))
    else:
        align = comm.align_clocks(ev, spans, len(metas), derived)
    if len(metas) > 1:
        if align.method == "none" and not job.separate_runs:
            warnings.append("ranks' clocks could not be aligned (no shared collectives or steps): cross-rank times are as recorded")
        for f, off in align.offsets.items():
            if f and abs(off) > 1_000_000:
                warnings.append(
                    f"{metas[f].path}: clock differs from {metas[0].path} by {off / 1e6:.3f} ms "
                    f"(aligned by {align.method}; spread {align.spread_ns.get(f, 0) / 1e3:.1f} µs)"
                )
        ranks = [replace(r, clock_offset_ns=align.offsets.get(r.file, 0)) for r in ranks]
    file_rank = {i: m.rank for i, m in enumerate(metas)}
    world = comm.world_size(metas)
    whole = world if world and sorted(r for r in file_rank.values() if isinstance(r, int)) == list(range(world)) else None
    table = comm.collective_table(spans, align, computes, file_rank, derived, whole)  # whole: every rank of the job is here
    warnings += comm.matching_warnings(table, align, metas)
    total = sum(r.gpu.window for r in ranks if r.gpu is not None)
    slow = comm.stragglers(table, len(metas), total_ns=total // max(len(ranks), 1), align=align)
    check = comm.straggler_check(table, len(metas), world)
    inputs = tuple(
        {"path": m.path, "format": m.format, "rank": m.rank, "size_bytes": m.size_bytes} for m in metas
    )
    return Analysis(
        inputs=inputs,
        ranks=tuple(ranks),
        warnings=tuple(job.all_warnings + warnings),  # the files' own too (a truncated file, skipped events, odd metadata)
        collectives=tuple(table),
        stragglers=tuple(slow),
        straggler_check=check,
        comm_notes=comm.report_notes(table, metas),
        clock_method=align.method,
        timeline=step_strips(ranks, lambda f, t0, t1: job.events(file=f, window=(t0, t1), columns=STRIP_COLUMNS).collect()),
        separate_runs=job.separate_runs is not None,
    )
