"""Job -> Analysis: the per-rank map (tracelens.analysis.rank) and the job reduce
(tracelens.analysis.job).

``analyze(job, options) -> Analysis`` reads each rank's events from the job's handles, one rank
at a time, into a RankSummary (``rank_summary``: the rank's results, its collective rows in
COLLECTIVE_SCHEMA, its step starts), drops them, and reduces the summaries (clock alignment,
collective matching, wait, stragglers, the timeline picture from the ranks' binned strips,
warnings, then ``finish_job``).  The reduce reads summaries and collective rows only, never events.  No files but the job's,
no Textual; plain frozen dataclasses that renderers turn into JSON or text."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import polars as pl

from tracelens.analysis.job.rollup import finish_job
from tracelens.analysis.rank import _analyze_rank
from tracelens.analysis.report import Analysis
from tracelens.analysis.suggest import input_bound_class  # noqa: F401 (re-exported)
from tracelens.analysis.timeline import rank_strips, step_strips
from tracelens.model.options import Options, parse_steps  # noqa: F401 (re-exported)
from tracelens.model.summary import IDLE_KEYS, ZERO, DataLoading, GpuTime, IdleSplit, RankResult, RankSummary, Step  # noqa: F401 (re-exported)
from tracelens.store.job import Job, RankHandle, span_and_pids


def rank_summary(events: pl.DataFrame, fi: int, meta, options: Options, several: bool = True) -> RankSummary:
    """The per-rank map: one rank's events -> its RankSummary (all the reduce needs of it).
    ``several``: the job has other ranks (a lone rank's clock needs no step starts)."""
    from tracelens.analysis.rank.collectives import STEP_STARTS_SCHEMA, collective_rows, step_starts

    result, compute = _analyze_rank(events, fi, meta, options)
    rows = collective_rows(events, compute, fi, meta.rank)
    starts = step_starts(events, fi) if several else pl.DataFrame(schema=STEP_STARTS_SCHEMA)
    lo, hi, pids = span_and_pids(events)
    strips = rank_strips(events, result.steps) if result.gpu is not None else None
    return RankSummary(result, rows, starts, lo, hi, pids, events.height, strips)


def _summarize(args: tuple[RankHandle, Options, bool]) -> RankSummary:
    """One task of the map: read a rank's events (from the cache or memory), summarise, drop them."""
    handle, options, several = args
    return rank_summary(handle.read(), handle.file, handle.meta, options, several)


def summarize_on_parse(options: Options):
    """The per-rank map as ``store.job.load``'s ``after_parse``: each rank summarised right after
    its parse, in the process that parsed it (its events never travel or are read back), so that
    ``analyze`` of the loaded job with these ``options`` only reduces.  A summary made with
    another file index, rank or options (a rank given by the job's file order, files skipped) is
    made again by ``analyze``."""
    return partial(_summary_on_parse, options)


def _summary_on_parse(options: Options, events: pl.DataFrame, fi: int, meta, several: bool) -> tuple[tuple, RankSummary]:
    return (fi, meta.rank, options, several), rank_summary(events, fi, meta, options, several)


def analyze(job: Job, options: Options | None = None, engine=None) -> Analysis:
    """The analysis of a loaded job.  ``engine`` (``tracelens.engine``): where the per-rank map
    runs; by default in this process, one rank at a time."""
    from tracelens.analysis.job import clocks, comm
    from tracelens.analysis.job import collectives as coll
    from tracelens.analysis.job import stragglers as strag
    from tracelens.analysis.rank.collectives import STEP_STARTS_SCHEMA
    from tracelens.engine import LocalEngine
    from tracelens.model.schema import COLLECTIVE_SCHEMA

    options = options or Options()
    metas = job.metas
    several = len(metas) > 1
    summaries: dict[int, RankSummary] = {}
    for h in job.handles:  # summarised as their files were parsed (load's after_parse), with what this job says
        made = h.summary
        if made is not None and made[0] == (h.file, h.meta.rank, options, several):
            summaries[h.file] = made[1]
        h.summary = None  # used once: the Analysis holds it now
    todo = [h for h in job.handles if h.file not in summaries]
    for i, got in (engine or LocalEngine()).map(_summarize, [(h, options, several) for h in todo]):
        if isinstance(got, BaseException):
            raise got
        summaries[todo[i].file] = got
    ordered = [summaries[i] for i in range(len(metas))]
    ranks = [s.result for s in ordered]
    warnings: list[str] = []
    rows = pl.concat([s.collectives for s in ordered]) if ordered else pl.DataFrame(schema=COLLECTIVE_SCHEMA)
    starts = [s.step_starts for s in ordered if s.step_starts.height]
    # files whose collectives were numbered by per-rank order, not by the trace's sequence numbers
    derived = frozenset(i for i, m in enumerate(metas) if m.attributes.get("seq_source", "trace") != "trace")
    if job.separate_runs:  # separate runs share no clock: nothing to align (the load warning says why)
        zero = dict.fromkeys(range(len(metas)), 0)
        align = clocks.ClockAlignment(zero, "none", dict(zero))
    else:
        file_of = {m.rank: i for i, m in enumerate(metas) if isinstance(m.rank, int)}
        bounds = clocks.p2p_bounds({r.file: (r.pipeline or {}).get("p2p_pairs") or {} for r in ranks}, file_of) if several else {}
        align = clocks.align_clocks(rows, pl.concat(starts) if starts else pl.DataFrame(schema=STEP_STARTS_SCHEMA), len(metas), derived,
                                    bounds)
    if several:
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
    table = coll.collective_table(rows, align, derived, whole)  # whole: every rank of the job is here
    warnings += comm.matching_warnings(table, align, metas)
    total = sum(r.gpu.window for r in ranks if r.gpu is not None)
    slow = strag.stragglers(table, len(metas), total_ns=total // max(len(ranks), 1))
    check = strag.straggler_check(table, len(metas), world)
    inputs = tuple(  # a rank from a file of several (an nsys export of several GPU processes): which part
        {"path": m.path, "format": m.format, "rank": m.rank, "size_bytes": m.size_bytes,
         **({"part": m.attributes["nsys_part"]} if isinstance(m.attributes.get("nsys_part"), dict) else {})} for m in metas
    )
    return finish_job(Analysis(  # the job's derived values last: to_dict only serialises
        inputs=inputs,
        ranks=tuple(ranks),
        warnings=tuple(job.all_warnings + warnings),  # the files' own too (a truncated file, skipped events, odd metadata)
        collectives=table,
        stragglers=tuple(slow),
        straggler_check=check,
        comm_notes=comm.report_notes(table, metas),
        clock_method=align.method,
        timeline=step_strips(ranks, {s.file: s.strips for s in ordered if s.strips is not None}),
        separate_runs=job.separate_runs is not None,
        nccl=tuple(str(p) for p in options.nccl),
    ))
