"""One rank's collective rows (``COLLECTIVE_SCHEMA``) and the step starts its clock fallback needs:
all that the job reduce (``tracelens.analysis.job``) reads of a rank's events.

A collective's spans on a rank are its GPU communication kernels carrying a sequence number, or,
on a rank without any (CPU-only gloo training), its host-side collective records.  Its exposed
time (the union of its spans less the rank's compute union) needs the rank's compute kernels, so
it is computed here, for every collective at once: no loop per collective."""

from __future__ import annotations

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.model.schema import COLLECTIVE_KEY, COLLECTIVE_SCHEMA, END

KEY = list(COLLECTIVE_KEY)


def collective_rows(events: pl.DataFrame, compute: pl.DataFrame, file: int, rank: int | None) -> pl.DataFrame:
    """The rows of one rank (``events``: its event table; ``compute``: the union of its compute
    kernels, ``intervals.union_frame``), sorted by the collective key.  A span without a duration
    cannot be placed and is left out."""
    gpu = (pl.col("kclass") == "comm") & pl.col("seq").is_not_null()
    host = pl.col("kind").is_in(["collective", "p2p"]) & pl.col("seq").is_not_null()
    parts = (
        events.lazy()
        .filter(pl.col("dur_ns").is_not_null() & (gpu | host))
        .filter(pl.when(gpu.any()).then(gpu).otherwise(host))  # a rank with GPU communication kernels: those
        .select(
            pl.col("group").cast(pl.String).fill_null(""),
            pl.col("group_desc").cast(pl.String),
            "seq",
            pl.col("collective").cast(pl.String).fill_null(""),
            pl.col("ts_ns").alias("s"),
            END.alias("e"),
            "bytes",
            "group_size",
            pl.col("kind").is_in(["collective", "p2p"]).alias("on_host"),
        )
        .collect(engine="in-memory")
    )
    if parts.height == 0:  # (most single-GPU traces)
        return pl.DataFrame(schema=COLLECTIVE_SCHEMA)
    # several kernels of one collective (coalesced, multi-stream): one row, its span from the
    # first start to the last end, its exposed time from the union of the kernels
    rows = parts.lazy().group_by(KEY).agg(
        pl.col("s").min().alias("start_ns"),
        pl.col("e").max().alias("end_ns"),
        pl.col("bytes").max(),
        pl.col("group_size").max(),
        pl.col("on_host").any(),
        pl.len().cast(pl.Int32).alias("n_parts"),
    )
    exposed = iv.outside_by(parts.lazy(), KEY, compute).rename({"outside": "exposed_ns"})
    return (
        rows.join(exposed, on=KEY, how="left", nulls_equal=True)
        .with_columns(pl.col("exposed_ns").fill_null(0), pl.lit(file, pl.Int32).alias("file"), pl.lit(rank, pl.Int32).alias("rank"))
        .select([pl.col(c).cast(t) for c, t in COLLECTIVE_SCHEMA.items()])
        .sort(*KEY, "start_ns", "end_ns", nulls_last=True)
        .collect(engine="in-memory")
    )


STEP_STARTS_SCHEMA = {"file": pl.Int32, "name": pl.String, "start_ns": pl.Int64}


def step_starts(events: pl.DataFrame, file: int) -> pl.DataFrame:
    """The first start of each step name on the rank (``file``, ``name``, ``start_ns``): where the
    job's clock alignment falls back to when a rank shares no collective with the reference."""
    return (
        events.lazy().filter(pl.col("kind") == "step")
        .group_by(pl.col("name").cast(pl.String))
        .agg(pl.col("ts_ns").min().alias("start_ns"))
        .select(pl.lit(file, pl.Int32).alias("file"), "name", "start_ns")
        .sort("name")
        .collect(engine="in-memory")
    )
