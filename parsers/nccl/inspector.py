"""NCCL Inspector JSON Lines (``<host>-pid<pid>.log``; FORMATS.md 3.3) -> collective rows with their
measured times and bandwidths, and the same records as a bandwidth table (``BANDWIDTH_SCHEMA``,
test ``inspector``).

A record is ``header{id, rank, n_ranks, ...}``, ``metadata{..., dump_timestamp_us, hostname, pid}``
and ``coll_perf{coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us, coll_timing_source,
coll_algobw_gbs, coll_busbw_gbs}`` or ``p2p_perf{p2p, p2p_sn, p2p_peer, ...}``.  Fields are read by
key (regex passes over a batch of lines, no JSON decode per line), so unknown keys and newer format
versions pass; a line that is neither record (``dump_stats`` ...) is counted, one that is cut
(no closing brace) is counted and skipped.  The op's start is known only with
``NCCL_INSPECTOR_DUMP_VERBOSE`` (``event_trace_ts``); else ``start_ns`` is null and ``dur_ns``
is the execution time.  ``bytes`` is ``coll_msg_size_bytes`` (per rank), times n for the
full-buffer collectives (AllGather ...), as the logs' rows.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracelens.model.nccl import BANDWIDTH_SCHEMA, FULL_BUFFER, NCCL_DETAIL_SCHEMA, NCCL_OPS, NCCL_ROW_SCHEMA, NcclParse

NAME = "nccl_inspector"
PARSER_VERSION = "1"


def _key(k: str, value: str = r"-?[0-9.eE+-]+") -> str:
    return rf'"{k}"\s*:\s*"?({value})"?'


def f(k: str, value: str = r"-?[0-9.eE+-]+") -> pl.Expr:
    return pl.col("line").str.extract(_key(k, value), 1)


def either(k: str, value: str = r"-?[0-9.eE+-]+") -> pl.Expr:
    return pl.when(pl.col("kind") == "coll").then(f(f"coll_{k}", value)).otherwise(f(f"p2p_{k}", value))


def _measure(e: pl.Expr) -> pl.Expr:
    # a time or bandwidth as a number that can be true: finite and not negative (1e309, NaN, -1: null)
    v = e.cast(pl.Float64, strict=False)
    return pl.when(v.is_finite() & (v >= 0)).then(v)


MAX_US = float(2**62 // 1000)  # a time in us whose ns (and that time plus a duration) fits an Int64


def read(path: str | Path, file: int = 0) -> NcclParse:
    from .log import numbered_lines

    path = Path(path)
    parts: list[pl.DataFrame] = []
    counts = {"lines": 0, "records": 0, "other_records": 0, "bad_lines": 0}
    cut = None
    for lines, problem in numbered_lines(path):
        cut = problem or cut
        line = pl.col("line")
        whole = line.str.contains(r"^\s*\{.*\}\s*,?\s*$")
        kind = (pl.when(~whole).then(pl.lit("bad")).when(line.str.contains('"coll_perf"')).then(pl.lit("coll"))
                .when(line.str.contains('"p2p_perf"')).then(pl.lit("p2p"))
                .when(line.str.strip_chars() == "").then(pl.lit("blank")).otherwise(pl.lit("other")))
        lines = lines.with_columns(kind.alias("kind"))
        c = lines.select(pl.len().alias("lines"), (pl.col("kind").is_in(["coll", "p2p"])).sum().alias("records"),
                         (pl.col("kind") == "other").sum().alias("other_records"),
                         (pl.col("kind") == "bad").sum().alias("bad_lines")).row(0, named=True)
        for k in counts:
            counts[k] += int(c[k] or 0)
        rec = lines.filter(pl.col("kind").is_in(["coll", "p2p"]))
        p = pl.col("kind")

        parts.append(rec.select(
            "ln", "kind",
            f("id", r"[^\"]*").alias("comm_id"), f("comm_name", r"[^\"]*").alias("comm_name"),
            f("rank").cast(pl.Int32, strict=False).alias("rank"), f("n_ranks").cast(pl.Int32, strict=False).alias("n_ranks"),
            f("hostname", r"[^\"]*").alias("host"), f("pid").cast(pl.Int64, strict=False).alias("pid"),
            pl.when(p == "coll").then(f("coll", r"\w+")).otherwise(f("p2p", r"\w+")).alias("op"),
            either("sn").cast(pl.Int64, strict=False).alias("seq"),
            f("p2p_peer").cast(pl.Int32, strict=False).alias("peer"),
            either("msg_size_bytes").cast(pl.Float64, strict=False).cast(pl.Int64, strict=False).alias("msg"),
            _measure(either("exec_time_us")).alias("exec_us"),
            either("timing_source", r"\w+").alias("timing"),
            _measure(either("algobw_gbs")).alias("algbw"),
            _measure(either("busbw_gbs")).alias("busbw"),
            pl.sum_horizontal((either(k).cast(pl.Float64, strict=False).is_not_null() & _measure(either(k)).is_null()).cast(pl.Int64)
                              for k in ("exec_time_us", "algobw_gbs", "busbw_gbs")).alias("impossible"),
            # the verbose event trace's op start (epoch us): the first number after "event_trace_ts"
            line.str.extract(r'"event_trace_ts"\s*:\s*\{[^}]*?"start"\s*:\s*(\d+)', 1).cast(pl.Int64, strict=False)
            .pipe(lambda t: pl.when(t <= MAX_US).then(t)).alias("ts_us"),
        ))
    data = pl.concat(parts) if parts else pl.DataFrame()
    warnings: list[str] = []
    if not data.height:
        rows = pl.DataFrame(schema={**NCCL_ROW_SCHEMA, **NCCL_DETAIL_SCHEMA})
        bw = pl.DataFrame(schema=BANDWIDTH_SCHEMA)
    else:
        odd = int(data["impossible"].sum() or 0)
        if odd:
            warnings.append(f"{odd} time or bandwidth value(s) are not finite or are negative (inf, NaN, -1): left out (null)")
        bad = data.filter(pl.col("op").is_null() | pl.col("seq").is_null())
        if bad.height:
            warnings.append(f"{bad.height} record(s) without their collective or sequence number (left out)")
            data = data.filter(pl.col("op").is_not_null() & pl.col("seq").is_not_null())
        collective = pl.col("op").replace_strict(NCCL_OPS, default=pl.col("op").str.to_lowercase())
        data = data.with_columns(collective.alias("collective"))
        full = pl.col("collective").is_in(FULL_BUFFER)
        nbytes = pl.when(full).then(pl.col("msg") * pl.col("n_ranks").cast(pl.Int64)).otherwise(pl.col("msg"))
        # (an exec time past MAX_US: no duration, as for a time that is not a number)
        dur = pl.when(pl.col("exec_us") <= MAX_US).then((pl.col("exec_us") * 1000).round().cast(pl.Int64))
        start = pl.col("ts_us") * 1000
        rows = data.select(
            pl.lit(file, pl.Int32).alias("file"), "rank", pl.col("comm_id").fill_null("").alias("group"),
            pl.col("comm_name").alias("group_desc"), "seq", "collective", start.alias("start_ns"),
            (start + dur).alias("end_ns"), nbytes.alias("bytes"), pl.col("n_ranks").alias("group_size"),
            pl.lit(False).alias("on_host"), pl.lit(None, pl.Int64).alias("exposed_ns"), pl.lit(1, pl.Int32).alias("n_parts"),
            pl.lit(NAME).alias("source"), pl.col("rank").cast(pl.String).fill_null(pl.format("{}:{}", "host", "pid")).alias("member"),
            pl.col("op").alias("op_name"), pl.lit(None, pl.Int64).alias("count"), pl.lit(None, pl.Int64).alias("out_count"),
            pl.lit(None, pl.String).alias("dtype"), pl.col("peer").alias("root"), pl.lit(None, pl.String).alias("redop"),
            pl.lit("completed").alias("state"), pl.when(pl.col("kind") == "p2p").then(pl.col("seq")).alias("p2p_seq"),
            pl.col("comm_id").alias("comm"), "host", "pid", pl.col("ln").alias("order"), pl.lit(None, pl.String).alias("frames"),
            pl.lit(None, pl.String).alias("algo"), pl.lit(None, pl.String).alias("proto"), pl.lit(None, pl.Int32).alias("channels"),
            dur.alias("dur_ns"), pl.col("algbw").alias("algbw_gbps"), pl.col("busbw").alias("busbw_gbps"),
            pl.format("timing={}", pl.col("timing").fill_null("?")).alias("detail"),
        ).select([pl.col(k).cast(t) for k, t in {**NCCL_ROW_SCHEMA, **NCCL_DETAIL_SCHEMA}.items()])
        bw = data.select(
            pl.lit(str(path)).alias("path"), pl.lit("inspector").alias("test"), "collective", pl.col("n_ranks").alias("nranks"),
            nbytes.alias("bytes"), pl.lit(None, pl.Int64).alias("count"), pl.lit(None, pl.String).alias("dtype"),
            pl.lit(None, pl.String).alias("redop"), pl.col("peer").alias("root"), pl.lit(None, pl.Boolean).alias("in_place"),
            pl.col("exec_us").alias("time_us"), pl.col("algbw").alias("algbw_gbps"), pl.col("busbw").alias("busbw_gbps"),
            pl.lit(None, pl.Int64).alias("wrong"),
        ).select([pl.col(k).cast(t) for k, t in BANDWIDTH_SCHEMA.items()])
    if counts["other_records"]:
        warnings.append(f"{counts['other_records']} line(s) are Inspector records of another kind (dump_stats ...) or not "
                        "Inspector's (skipped)")
    if counts["bad_lines"]:
        warnings.append(f"{counts['bad_lines']} line(s) are not whole JSON objects (cut or interleaved; skipped)")
    if cut:
        warnings.append(f"the file is cut short ({cut})")
    facts = {**counts, "format_versions": sorted(set(_versions(path)))[:8]}
    return NcclParse(str(path), NAME, rows, facts=facts, warnings=warnings, bandwidth=bw)


def _versions(path: Path) -> list[str]:
    import re

    from tracelens.parsers import head_bytes
    return [m.decode("ascii", "replace") for m in re.findall(rb'"inspector_output_format_version"\s*:\s*"(v[\d.]+)"', head_bytes(path, 1 << 16))]
