"""The NCCL example profiler plugin's output (FORMATS.md 3.2) -> collective rows with times.

A Chrome-trace array, one event object a line, ``b``/``e`` pairs matched by (pid, cat, name, id)
and their order, ``ts`` in us from the plugin's init.  It is not strict JSON (``"datatype":
ncclFloat32``, ``"Stream": 0x4142e90`` unquoted; fixed on NCCL master): fields are read by key
with regex passes over a batch of lines, so the quirk costs nothing, and a cut tail (a line that
is not a whole object) is counted and skipped.  ``COLL`` events give the collective (``SeqNum,
CommHash, Rank, Count, Datatype, Algorithm, Protocol, nChannels``), ``P2P`` events a send/recv
(``Peer`` is the row's ``root``, ``seq`` its order among the rank's P2P calls of that kind in the
communicator).  The channel / proxy events after a collective's begin line (until the next
collective's) are summarised on its row: ``channels`` (distinct ``KernelCh`` channels, else
``nChannels``) and ``detail`` (kernel channels, proxy steps, net events).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracelens.model.nccl import (
    DTYPE_BYTES,
    FULL_BUFFER,
    NCCL_DETAIL_SCHEMA,
    NCCL_OPS,
    NCCL_ROW_SCHEMA,
    NCCL_TYPE_TOKENS,
    NcclParse,
)

NAME = "nccl_profiler"
PARSER_VERSION = "1"
OWNERS = ("COLL", "P2P")


def _f(k: str, value: str = r"-?[0-9.eE+-]+") -> pl.Expr:
    return pl.col("line").str.extract(rf'"{k}"\s*:\s*"?({value})"?', 1)


MAX_US = float(2**62 // 1000)  # a time in us whose ns fits an Int64 (with room for a duration)


def read(path: str | Path, file: int = 0) -> NcclParse:
    from .log import numbered_lines

    path = Path(path)
    parts: list[pl.DataFrame] = []
    counts = {"lines": 0, "events": 0, "bad_lines": 0}
    cut = None
    for lines, problem in numbered_lines(path):
        cut = problem or cut
        line = pl.col("line")
        whole = line.str.contains(r'^\s*\{\s*"name".*\}\s*,?\s*$')
        structural = line.str.contains(r"^\s*(?:\[|\]|\{\s*\}\s*\]?|,)?\s*$")
        c = lines.select(pl.len().alias("lines"), whole.sum().alias("events"),
                         (~whole & ~structural).sum().alias("bad_lines")).row(0, named=True)
        for k in counts:
            counts[k] += int(c[k] or 0)
        parts.append(lines.filter(whole).select(
            "ln", _f("name", r"[^\"]*").alias("name"), _f("cat", r"\w+").alias("cat"), _f("ph", r"\w").alias("ph"),
            _f("id").cast(pl.Int64, strict=False).alias("id"), _f("pid").cast(pl.Int64, strict=False).alias("pid"),
            # (a time that is not finite, negative or past an Int64's ns: null, as one that is not a number)
            _f("ts").cast(pl.Float64, strict=False).pipe(lambda t: pl.when(t.is_finite() & (t >= 0) & (t <= MAX_US)).then(t)).alias("ts"),
            _f("SeqNum").cast(pl.Int64, strict=False).alias("seqnum"), _f("CommHash", r"\w+").alias("commhash"),
            _f("Rank").cast(pl.Int32, strict=False).alias("rank"), _f("Peer").cast(pl.Int32, strict=False).alias("peer"),
            _f("Count").cast(pl.Int64, strict=False).alias("count"), _f("Datatype", r"\w+").alias("dt"),
            _f("Algorithm", r"\w+").alias("algo"), _f("Protocol", r"\w+").alias("proto"),
            _f("nChannels").cast(pl.Int32, strict=False).alias("nch"), _f("Channel").cast(pl.Int32, strict=False).alias("channel"),
            _f("Steps").cast(pl.Int64, strict=False).alias("steps"), _f("Root").cast(pl.Int32, strict=False).alias("root_arg"),
        ))
    ev = pl.concat(parts) if parts else pl.DataFrame()
    warnings: list[str] = []
    schema = {**NCCL_ROW_SCHEMA, **NCCL_DETAIL_SCHEMA}
    if not ev.height:
        rows = pl.DataFrame(schema=schema)
    else:
        rows = _rows(ev, file)
    unmatched = int(rows["end_ns"].is_null().sum()) if rows.height else 0
    if unmatched:
        warnings.append(f"{unmatched} collective(s) begin without an end event (still running, or the file is cut): state started")
    if counts["bad_lines"]:
        warnings.append(f"{counts['bad_lines']} line(s) are not whole event objects (a cut tail ...; skipped)")
    if cut:
        warnings.append(f"the file is cut short ({cut})")
    cats = ev.group_by("cat").len().sort("cat").to_dicts() if ev.height else []
    facts = {**counts, "categories": cats[:32], "collectives": rows.height,
             "communicators": rows["group"].n_unique() if rows.height else 0}
    return NcclParse(str(path), NAME, rows, facts=facts, warnings=warnings)


def _rows(ev: pl.DataFrame, file: int) -> pl.DataFrame:
    key = ["pid", "cat", "name", "id"]
    ev = ev.sort("ln").with_columns(pl.col("ln").cum_count().over([*key, "ph"]).alias("nth"))
    begins = ev.filter(pl.col("ph") == "b")
    ends = ev.filter(pl.col("ph") == "e").select(*key, "nth", pl.col("ts").alias("ts_end"))
    # the channel / proxy / net events under a collective: those after its begin line (same process)
    owner = pl.when(pl.col("cat").is_in(OWNERS) & (pl.col("ph") == "b")).then(pl.col("ln"))
    under = (begins.with_columns(owner.forward_fill().over("pid").alias("owner"))
             .filter(pl.col("owner").is_not_null() & ~pl.col("cat").is_in(OWNERS))
             .group_by("owner").agg(pl.col("channel").filter(pl.col("cat") == "GPU").n_unique().alias("kch"),
                                    pl.col("steps").filter(pl.col("cat") == "PROXY").sum().alias("proxy_steps"),
                                    (pl.col("cat").str.starts_with("NET")).sum().alias("net")))
    coll = (begins.filter(pl.col("cat").is_in(OWNERS))
            .join(ends, on=[*key, "nth"], how="left")
            .join(under, left_on="ln", right_on="owner", how="left")
            .with_columns(pl.col("name").replace_strict(NCCL_OPS, default=pl.col("name").str.to_lowercase()).alias("collective"),
                          pl.col("dt").replace_strict(NCCL_TYPE_TOKENS, default=pl.col("dt")).alias("dtype"))
            .with_columns(pl.coalesce("seqnum", pl.col("ln").cum_count().over("commhash", "rank", "cat", "name") - 1).alias("seq")))
    size = pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    start = (pl.col("ts") * 1000).round().cast(pl.Int64)
    end = pl.when(pl.col("ts_end") > 0).then((pl.col("ts_end") * 1000).round().cast(pl.Int64))
    kch = pl.col("kch").fill_null(0)
    return coll.select(
        pl.lit(file, pl.Int32).alias("file"), "rank", pl.col("commhash").fill_null("").alias("group"),
        pl.lit(None, pl.String).alias("group_desc"), "seq", "collective", start.alias("start_ns"), end.alias("end_ns"),
        # the per-rank buffer (the plugin does not give the communicator's size, so AllGather ... are per rank too)
        (pl.col("count") * size).alias("bytes"), pl.lit(None, pl.Int32).alias("group_size"), pl.lit(False).alias("on_host"),
        pl.lit(None, pl.Int64).alias("exposed_ns"), pl.lit(1, pl.Int32).alias("n_parts"), pl.lit(NAME).alias("source"),
        pl.col("rank").cast(pl.String).fill_null(pl.format("pid{}", "pid")).alias("member"), pl.col("name").alias("op_name"),
        "count", pl.lit(None, pl.Int64).alias("out_count"), "dtype",
        pl.coalesce(pl.when(pl.col("cat") == "P2P").then(pl.col("peer")), "root_arg").alias("root"),
        pl.lit(None, pl.String).alias("redop"),
        pl.when(end.is_not_null()).then(pl.lit("completed")).otherwise(pl.lit("started")).alias("state"),
        pl.when(pl.col("cat") == "P2P").then(pl.col("seq")).alias("p2p_seq"), pl.col("commhash").alias("comm"),
        pl.lit(None, pl.String).alias("host"), "pid", pl.col("ln").alias("order"), pl.lit(None, pl.String).alias("frames"),
        "algo", "proto", pl.when(kch > 0).then(kch).otherwise(pl.col("nch")).cast(pl.Int32).alias("channels"),
        (end - start).alias("dur_ns"), pl.lit(None, pl.Float64).alias("algbw_gbps"), pl.lit(None, pl.Float64).alias("busbw_gbps"),
        pl.format("kernel_channels={} proxy_steps={} net_events={}", kch, pl.col("proxy_steps").fill_null(0),
                  pl.col("net").fill_null(0)).alias("detail"),
    ).select([pl.col(k).cast(t) for k, t in {**NCCL_ROW_SCHEMA, **NCCL_DETAIL_SCHEMA}.items()])


__all__ = ["read", "NAME", "FULL_BUFFER"]
