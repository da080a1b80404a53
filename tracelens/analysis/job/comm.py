"""What the report says about the communication: the job's size, where sequence numbers came
from, how collectives were matched (communication.matching, the notes) and the warnings about it,
read from the collective table (``tracelens.analysis.job.collectives``) and the files' metadata."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracelens.analysis.job.clocks import ClockAlignment


def world_size(metas) -> int | None:
    """The job's size, when the traces that state one agree."""
    sizes = {m.world_size for m in metas if isinstance(m.world_size, int) and m.world_size > 0}
    return sizes.pop() if len(sizes) == 1 else None


def seq_source(metas) -> str:
    """Where the collectives' sequence numbers (the key that matches them across ranks) came from:
    "trace", "derived" (each rank's order), "mixed", or "none" (no collectives)."""
    src = {str(m.attributes["seq_source"]).split(":", 1)[0] for m in metas if m.attributes.get("seq_source")}
    if not src:
        return "none"
    return src.pop() if len(src) == 1 else "mixed"


def report_notes(table: pl.DataFrame, metas) -> dict[str, Any]:
    """communication.matching (how collectives were matched: seq_source, matched on several ranks,
    refused, complete) and why a collective's group or type is unknown (null when none is)."""
    first = pl.col("cid").is_first_distinct()
    shared = first & (pl.col("n_ranks") > 1)
    matched, refused, complete, group_unknown, coll_unknown = table.select(
        shared.sum().alias("matched"), (shared & pl.col("consistent").eq_missing(False)).sum().alias("refused"),
        (shared & pl.col("complete")).sum().alias("complete"), pl.col("group").is_null().any(), pl.col("collective").is_null().any(),
    ).row(0) if table.height else (0, 0, 0, False, False)
    src = seq_source(metas) if metas else ("trace" if table.height else "none")
    notes: dict[str, Any] = {
        "matching": {"seq_source": src, "matched": matched, "refused": refused, "complete": complete},
        "group_unknown": None,
        "collective_unknown": None,
    }
    if group_unknown:
        if not any(isinstance(m.distributed.get("pg_config"), list) for m in metas):
            notes["group_unknown"] = ("the traces name no process group: their collective records carry no 'Process Group Name' "
                                      "and distributedInfo has no pg_config")
        else:
            notes["group_unknown"] = ("no collective record names the group of these collectives (kernels launched without "
                                      "record_param_comms), and distributedInfo.pg_config lists several groups")
    if coll_unknown:
        notes["collective_unknown"] = ("no record names these collectives: their record_param_comms carry no 'Collective name' "
                                       "and enclose no c10d op or backend annotation, or their kernel (e.g. ncclDevKernel_Generic, "
                                       "launched before the trace began) does not say")
    return notes


def matching_warnings(table: pl.DataFrame, align: ClockAlignment, metas) -> list[str]:
    """Say when matches by derived sequence numbers were refused, and when a file's clock offset
    rests on only some of the collectives it shares with the reference."""
    out = []
    if table.height:
        gaps = (table.filter(pl.col("n_ranks") > 1).group_by("cid")
                .agg(pl.col("consistent").first(), (pl.col("aligned_end_ns").max() - pl.col("aligned_end_ns").min()).alias("gap")))
        no = pl.col("consistent").eq_missing(False)
        n_shared, refused, lo, hi = gaps.select(pl.len(), no.sum(), pl.col("gap").filter(no).min().alias("lo"), pl.col("gap").filter(no).max().alias("hi")).row(0)
        if refused:
            out.append(
                f"collectives matched across ranks by sequence numbers derived from each rank's order (the traces carry none for "
                f"them): {refused} of {n_shared} matches do not overlap in aligned time (their ends {lo / 1e6:.1f}-"
                f"{hi / 1e6:.1f} ms apart), so they pair different collectives: refused, their wait and the straggler "
                f"test left unknown"
            )
    for f, (agree, of) in sorted(align.support.items()):
        if of > 1 and agree < of:
            out.append(
                f"{metas[f].path}: clock offset "
                + (f"from {agree} of {of} collectives shared with {metas[0].path} that agree on it"
                   if agree > 1 else f"not from collectives: none of the {of} shared with {metas[0].path} agree on one")
            )
    return out
