"""Job -> Analysis: the per-rank map (tracelens.analysis.rank) and the job reduce.

``analyze(trace, options) -> Analysis`` reads only the loaded event table (no files, no
Textual) and returns plain frozen dataclasses that renderers turn into JSON or text."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracelens.analysis.job.rollup import finish_job
from tracelens.analysis.options import Options, parse_steps  # noqa: F401 (re-exported)
from tracelens.analysis.rank import _analyze_rank
from tracelens.analysis.report import Analysis
from tracelens.analysis.suggest import input_bound_class  # noqa: F401 (re-exported)
from tracelens.analysis.timeline import step_strips
from tracelens.model.summary import IDLE_KEYS, ZERO, DataLoading, GpuTime, IdleSplit, RankResult, Step  # noqa: F401 (re-exported)
from tracelens.store.job import Trace


def analyze(trace: Trace, options: Options | None = None) -> Analysis:

    from tracelens.analysis.job import clocks, comm
    from tracelens.analysis.job import collectives as coll
    from tracelens.analysis.job import stragglers as strag
    from tracelens.analysis.rank.collectives import STEP_STARTS_SCHEMA, collective_rows, step_starts
    from tracelens.model.schema import COLLECTIVE_SCHEMA

    options = options or Options()
    ev = trace.events
    ranks = []
    rows, starts = [], []  # what the job reduce reads of each rank: its collective rows and step starts
    warnings: list[str] = []
    for fi, meta in enumerate(trace.metas):
        mine = ev if len(trace.metas) == 1 else ev.filter(pl.col("file") == fi)  # (a filter copies every column)
        result, compute = _analyze_rank(mine, fi, meta, options)
        ranks.append(result)
        rows.append(collective_rows(mine, compute, fi, meta.rank))
        if len(trace.metas) > 1:  # (the clocks of one rank need no aligning)
            starts.append(step_starts(mine, fi))
    rows = pl.concat(rows) if rows else pl.DataFrame(schema=COLLECTIVE_SCHEMA)
    # files whose collectives were numbered by per-rank order, not by the trace's sequence numbers
    derived = frozenset(i for i, m in enumerate(trace.metas) if m.attributes.get("seq_source", "trace") != "trace")
    if trace.separate_runs:  # separate runs share no clock: nothing to align (the load warning says why)
        zero = dict.fromkeys(range(len(trace.metas)), 0)
        align = clocks.ClockAlignment(zero, "none", dict(zero))
    else:
        align = clocks.align_clocks(rows, pl.concat(starts) if starts else pl.DataFrame(schema=STEP_STARTS_SCHEMA), len(trace.metas), derived)
    if len(trace.metas) > 1:
        if align.method == "none" and not trace.separate_runs:
            warnings.append("ranks' clocks could not be aligned (no shared collectives or steps): cross-rank times are as recorded")
        for f, off in align.offsets.items():
            if f and abs(off) > 1_000_000:
                warnings.append(
                    f"{trace.metas[f].path}: clock differs from {trace.metas[0].path} by {off / 1e6:.3f} ms "
                    f"(aligned by {align.method}; spread {align.spread_ns.get(f, 0) / 1e3:.1f} µs)"
                )
        ranks = [replace(r, clock_offset_ns=align.offsets.get(r.file, 0)) for r in ranks]
    file_rank = {i: m.rank for i, m in enumerate(trace.metas)}
    world = comm.world_size(trace.metas)
    whole = world if world and sorted(r for r in file_rank.values() if isinstance(r, int)) == list(range(world)) else None
    table = coll.collective_table(rows, align, derived, whole)  # whole: every rank of the job is here
    warnings += comm.matching_warnings(table, align, trace.metas)
    total = sum(r.gpu.window for r in ranks if r.gpu is not None)
    slow = strag.stragglers(table, len(trace.metas), total_ns=total // max(len(ranks), 1))
    check = strag.straggler_check(table, len(trace.metas), world)
    inputs = tuple(
        {"path": m.path, "format": m.format, "rank": m.rank, "size_bytes": m.size_bytes} for m in trace.metas
    )
    return finish_job(Analysis(  # the job's derived values last: to_dict only serialises
        inputs=inputs,
        ranks=tuple(ranks),
        warnings=tuple(trace.all_warnings + warnings),  # the files' own too (a truncated file, skipped events, odd metadata)
        collectives=table,
        stragglers=tuple(slow),
        straggler_check=check,
        comm_notes=comm.report_notes(table, trace.metas),
        clock_method=align.method,
        timeline=step_strips(ev, ranks),
        separate_runs=trace.separate_runs is not None,
    ))
