"""Collectives across ranks: matching the ranks' collective rows, wait vs transfer, bus bandwidth,
and the report's summaries of them.

A collective instance is one (process group, sequence number, collective); on each rank it is one
collective row (``COLLECTIVE_SCHEMA``).  With every member of a group present, the time a rank
spent in a collective before the last rank arrived (in aligned time) is *wait*, the rest is
*transfer*.  Everything is one polars computation over the rows of all ranks: the table has one
row per rank x collective, the collective's own columns repeated on each of its rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from tracelens.model.collectives import bus_factor
from tracelens.model.schema import COLLECTIVE_KEY

if TYPE_CHECKING:
    from tracelens.analysis.job.clocks import ClockAlignment

# A match is believed when the ranks' spans, aligned, overlap by at least this share of the
# shortest: in a real collective every rank is inside it from the last arrival until it ends, so
# the last to arrive (the shortest span) lies almost wholly inside the others'
MIN_OVERLAP = 0.5
# ... but a rooted or point-to-point transfer's sender may finish as soon as its data is out (a small
# broadcast's root can be done before a receiver starts), and host-side spans (gloo's, on a CPU-only
# rank) end when their thread gets the CPU back: for those the spans need only meet
ROOTED = ("broadcast", "reduce", "gather", "scatter", "send", "recv", "sendrecv")
P2P = ("send", "recv", "sendrecv")  # matched across ranks as pairs, if at all (clocks.p2p_bounds), never as collectives


def min_overlap(collective: str | None, on_host: bool = False) -> float:
    return 0.0 if on_host or collective in ROOTED else MIN_OVERLAP


# The collective table: one row per rank x collective, in table order (the collectives by
# (group, seq, collective, group_desc), "" groups and types first, null descriptions last; the
# rows of one collective by file).  ``cid`` numbers the collectives in that order.
TABLE_SCHEMA: dict[str, pl.DataType] = {
    "cid": pl.Int64(),  # the collective's index in table order
    # the collective's own columns, the same on each of its rows
    "group": pl.String(),  # null when unknown
    "group_desc": pl.String(),
    "seq": pl.Int64(),
    "collective": pl.String(),  # null when unknown
    "bytes": pl.Int64(),  # the largest any rank states; null when none does
    "group_size": pl.Int32(),  # likewise
    "complete": pl.Boolean(),  # every member of the group is in the trace set
    # with several ranks: do their spans overlap in aligned time, as one collective's must?  A
    # match by derived sequence numbers that does not is refused (False): no wait, no straggler
    # evidence.  Null with one rank
    "consistent": pl.Boolean(),
    "derived": pl.Boolean(),  # matched by sequence numbers derived from per-rank order
    "n_ranks": pl.UInt32(),
    "slowest_rank": pl.Int32(),  # the rank of its longest row (the first in table order)
    # the rank's row
    "file": pl.Int32(),
    "rank": pl.Int32(),
    "start_ns": pl.Int64(),  # on the rank's own clock
    "dur_ns": pl.Int64(),
    "aligned_start_ns": pl.Int64(),  # on the reference clock (ClockAlignment.offsets)
    "aligned_end_ns": pl.Int64(),
    "exposed_ns": pl.Int64(),  # not under compute on that rank
    "wait_ns": pl.Int64(),  # before the last member arrived (null unless every member is present and the match believed)
    "busbw_gbps": pl.Float64(),
    "on_host": pl.Boolean(),
}

ORDER = [*COLLECTIVE_KEY, "file", "start_ns", "end_ns"]  # total: a rank has one row per collective key


def collective_table(rows: pl.DataFrame, align: ClockAlignment, derived: frozenset[int] = frozenset(),
                     world: int | None = None) -> pl.DataFrame:
    """The table (``TABLE_SCHEMA``) of ``rows`` (the collective rows of every rank).  ``derived``:
    the files whose sequence numbers were derived from per-rank order; their matches must overlap in
    aligned time (``MIN_OVERLAP``) to be believed.  ``world``: the job's size when every one of its
    ranks is loaded, so that a collective on all of them has every member of its group, whatever
    the group."""
    if rows.height == 0:
        return pl.DataFrame(schema=TABLE_SCHEMA)
    offsets = pl.DataFrame({"file": list(align.offsets), "_off": list(align.offsets.values())},
                           schema={"file": pl.Int32, "_off": pl.Int64})
    # the bus factor of each (collective, group size) there is: a few Python calls, not one per row
    # (a collective's group size is the largest of its rows', so it is among these)
    kinds = rows.select("collective", pl.col("group_size").replace(0, None)).unique().rows()
    factors = pl.DataFrame({"collective": [c for c, _ in kinds], "_gsize": [g for _, g in kinds],
                            "_factor": [bus_factor(c or None, g) for c, g in kinds]},
                           schema={"collective": pl.String, "_gsize": pl.Int32, "_factor": pl.Float64})
    # a send or recv is a pair between two ranks, not a rendezvous of a group: each rank's row is
    # a collective of its own (n_ranks 1, never complete: no wait, no straggler evidence)
    changed = pl.col("collective").is_in(list(P2P)) & pl.col("file").ne_missing(pl.col("file").shift(1))
    for c in COLLECTIVE_KEY:
        changed = changed | pl.col(c).ne_missing(pl.col(c).shift(1))
    t = (
        rows.lazy()
        .sort(ORDER, nulls_last=True, maintain_order=True)
        .with_columns((changed.cum_sum() - 1).cast(pl.Int64).alias("cid"))
        .join(offsets.lazy(), on="file", how="left", maintain_order="left")
        .with_columns(pl.col("_off").fill_null(0))
        .with_columns((pl.col("start_ns") + pl.col("_off")).alias("aligned_start_ns"),
                      (pl.col("end_ns") + pl.col("_off")).alias("aligned_end_ns"),
                      (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    )
    # each collective's own facts, from one aggregation joined back onto its rows
    gsize = pl.col("group_size").fill_null(0).max()
    nbytes = pl.col("bytes").fill_null(0).max()
    per = t.group_by("cid").agg(
        pl.len().alias("n_ranks"),
        pl.when(gsize != 0).then(gsize).cast(pl.Int32).alias("_gsize"),
        pl.when(nbytes != 0).then(nbytes).alias("_bytes"),
        pl.col("aligned_start_ns").max().alias("_last"),
        pl.col("aligned_end_ns").min().alias("_first_end"),
        pl.col("dur_ns").min().alias("_shortest"),
        pl.col("on_host").any().alias("_on_host"),
        pl.col("file").is_in(sorted(derived)).any().alias("derived"),
        pl.col("file").is_in(sorted(align.unordered)).any().alias("_unordered"),
        pl.col("rank").get(pl.col("dur_ns").arg_max()).alias("slowest_rank"),
    )
    need = pl.when(pl.col("collective").is_in(list(ROOTED)) | pl.col("_on_host")).then(0.0).otherwise(MIN_OVERLAP)
    believed = ~pl.col("derived") | (((pl.col("_first_end") - pl.col("_last")) >= need * pl.col("_shortest")) & ~pl.col("_unordered"))
    complete = (pl.col("n_ranks") > 1) & (
        (pl.col("_gsize").is_not_null() & (pl.col("n_ranks") >= pl.col("_gsize")))
        | (pl.lit(world is not None) & (pl.col("n_ranks") >= pl.lit(world or 0))))
    t = (t.join(per, on="cid", how="left", maintain_order="left")
         .with_columns(complete.alias("complete"), pl.when(pl.col("n_ranks") > 1).then(believed).alias("consistent")))
    measured = pl.col("complete") & pl.col("consistent").fill_null(True)
    wait = pl.when(measured).then(pl.min_horizontal(pl.max_horizontal(pl.col("_last") - pl.col("aligned_start_ns"), 0), pl.col("dur_ns")))
    t = t.with_columns(wait.alias("wait_ns")).join(factors.lazy(), on=["collective", "_gsize"], how="left", nulls_equal=True,
                                                  maintain_order="left")
    transfer = pl.col("dur_ns") - pl.col("wait_ns").fill_null(0)
    bw = (pl.when(pl.col("_bytes").is_not_null() & pl.col("_factor").is_not_null() & (transfer > 0))
          .then(pl.col("_bytes").cast(pl.Float64) * pl.col("_factor") / transfer.cast(pl.Float64)))
    return t.select(
        "cid",
        pl.when(pl.col("group") != "").then(pl.col("group")).alias("group"),
        "group_desc", "seq",
        pl.when(pl.col("collective") != "").then(pl.col("collective")).alias("collective"),
        pl.col("_bytes").alias("bytes"), pl.col("_gsize").alias("group_size"),
        "complete", "consistent", "derived", "n_ranks", "slowest_rank",
        "file", "rank", "start_ns", "dur_ns", "aligned_start_ns", "aligned_end_ns", "exposed_ns", "wait_ns",
        bw.alias("busbw_gbps"), "on_host",
    ).cast(TABLE_SCHEMA).collect(engine="in-memory")  # type: ignore[arg-type]


def per_collective(table: pl.DataFrame) -> pl.DataFrame:
    """One row per collective (its first rank's), in table order: for its own columns."""
    return table.filter(pl.col("cid").is_first_distinct())


def by_group(table: pl.DataFrame) -> list[dict[str, Any]]:
    """Per (group, collective): collectives, bytes (null when none states its size), time and
    exposed time summed over the ranks' rows, wait (null when any row's is unknown), the median
    bus bandwidth of the rows (the upper one of an even count); most time first, ties in table
    order."""
    if table.height == 0:
        return []
    first = pl.col("cid").is_first_distinct()
    bw = pl.col("busbw_gbps").drop_nulls().sort()
    g = (
        table.group_by("group", "collective", maintain_order=True)
        .agg(
            pl.col("group_desc").first(),
            pl.col("cid").n_unique().alias("count"),
            pl.col("bytes").filter(first).fill_null(0).sum().alias("bytes"),
            pl.col("bytes").filter(first).is_not_null().any().alias("_bytes_known"),
            pl.col("dur_ns").sum().alias("time_ns"),
            pl.col("exposed_ns").sum(),
            pl.col("wait_ns").sum(),
            pl.col("wait_ns").is_null().any().alias("_wait_unknown"),
            bw.alias("_bw"),
        )
        .sort("time_ns", descending=True, maintain_order=True)
        .select(
            "group", "group_desc", "collective", pl.col("count").cast(pl.Int64),
            pl.when(pl.col("_bytes_known")).then(pl.col("bytes")).alias("bytes"),
            "time_ns", "exposed_ns",
            pl.when(~pl.col("_wait_unknown")).then(pl.col("wait_ns")).alias("wait_ns"),
            pl.col("_bw").list.get(pl.col("_bw").list.len() // 2, null_on_oob=True).alias("busbw_gbps_median"),
        )
    )
    return g.to_dicts()


def slowest(table: pl.DataFrame, top: int = 20) -> list[dict[str, Any]]:
    """The ``top`` collectives whose longest row is longest (ties by group, seq, then table order),
    each with its ranks' rows."""
    if table.height == 0:
        return []
    cols = per_collective(table.with_columns(pl.col("dur_ns").max().over("cid").alias("_max")))
    picked = cols.sort(pl.col("_max"), pl.col("group").fill_null(""), pl.col("seq"), pl.col("cid"),
                       descending=[True, False, False, False]).head(top)
    ranks = (table.join(picked.select("cid"), on="cid", how="semi")
             .group_by("cid", maintain_order=True)
             .agg(pl.struct("rank", "start_ns", "dur_ns", "exposed_ns", "wait_ns", "busbw_gbps").alias("ranks")))
    rows = picked.join(ranks, on="cid", how="left", maintain_order="left")
    return [  # at most ``top``: a summary, not the table
        {"group": c["group"], "seq": c["seq"], "collective": c["collective"], "bytes": c["bytes"], "group_size": c["group_size"],
         "complete": c["complete"], "consistent": c["consistent"], "slowest_rank": c["slowest_rank"], "ranks": c["ranks"]}
        for c in rows.iter_rows(named=True)
    ]
