"""``NCCL_DEBUG=INFO`` logs (FORMATS.md 2) -> collective rows, communicators and facts.

A line's NCCL core ``[ts ]host:pid:tid [dev] [file:line ][func ]NCCL LEVEL message`` is searched
anywhere in the line, after whatever a launcher put before it (Open MPI ``[1,3]<stdout>:``, Slurm
``3: ``, torchrun ``[default3]:``, pdsh ``host: ``, Ray ``(RayTrainWorker pid=..., ip=...) ``); an
interleaved line (a cut line with another rank's line run into it) is read by its last core.  The
file is read in bounded batches of whole lines, each batch one polars frame of lines and a few
regex passes over it (no Python per line): a 2 GB log takes the memory of one batch plus its rows.

Per call (subsystem COLL): ``Op: opCount <hex> ... count .. datatype .. op .. root .. comm <ptr>
[nranks=..] stream ..`` -> one row: ``seq`` is the opCount (per communicator), the group is the
communicator's ``commId`` where an init line names it (else ``nranks=N``, a guess, warned), the
member the rank of that process in that communicator.  Lines that are not NCCL's (and not
PyTorch's watchdog) are counted as unknown; NCCL lines whose message is not read are counted too.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracelens.model.nccl import COMM_SCHEMA, NCCL_DTYPES, NCCL_OPS, NCCL_REDOPS, NCCL_ROW_SCHEMA, NcclParse

NAME = "nccl_log"
PARSER_VERSION = "1"
BATCH_BYTES = 8 << 20  # bytes of whole lines per batch
ASSEMBLE_ROWS = 1 << 17  # collective lines turned into rows at a time
MAX_WATCHDOG = 256  # PyTorch watchdog timeouts kept in the facts (rank, seq)
MAX_NAMED = 65536  # ranks named by the log's lines kept in the facts

_CORE = (r"^(?P<pre>.*)(?:^|[\s:>\]])(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
         r"(?:\S+ ){0,3}?NCCL (?P<level>INFO|WARN|TRACE|CALL|ERROR|ABORT) ?(?P<msg>.*)$")
_CORE_FIRST = (r"^(?P<pre>.*?)(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
               r"(?:\S+ ){0,3}?NCCL (?P<level>INFO|WARN|TRACE|CALL|ERROR|ABORT) ?(?P<msg>.*)$")
# unanchored (its leftmost match is the lazy prefix's): the regex engine finds the match's span with
# its DFA and runs the capturing engine on that span only; the prefix is what comes before it
_LEFT = r"(?P<tail>(?P<host>[\w.\-]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\](?: \S+){0,3}$)"
# a level is followed by a non-word character or the end (``\b`` spelled so the DFA runs it)
_LEVEL = r"^(INFO|WARN|TRACE|CALL|ERROR|ABORT)(?:$|\W)"
_TS = r"\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\]?\s*$"
# a COLL line in two steps: its fixed head (a one-pass regex: fast captures), then the optional tail
# of what follows the comm (run on that short rest only); the groups the rows do not use do not capture
_COLL = (r"^(?P<op>[A-Za-z]+): opCount (?P<opc>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ "
         r"count (?P<count>\d+) datatype (?P<dt>\d+) op (?P<rop>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+)(?P<rest>(?: .*)?)")
_COLL_NR = _COLL.replace("(?P<rest>(?: .*)?)", r"(?: \[nranks=(?P<nr>\d+)\])?")
# _COLL_NR's common line with ASCII classes (its comm followed by a space or the end): where it matches, the same
# captures (a nranks of other digits is null either way, once cast); where not, _COLL_NR is run
_COLL_FAST = (r"^(?P<op>[A-Za-z]+): opCount (?P<opc>[0-9a-fA-F]+) sendbuff [!-~]+ recvbuff [!-~]+ count (?P<count>[0-9]+) "
              r"datatype (?P<dt>[0-9]+) op (?P<rop>[0-9]+) root (?P<root>-?[0-9]+) comm (?P<comm>[!-~]+)(?: (?:\[nranks=(?P<nr>[0-9]+)\])?|$)")
_COLL_TAIL = r"^(?: \[nranks=(?P<nr>\d+)\])?(?: stream \S+)?(?: task \d+)?(?: globalrank (?P<grank>\d+))?"
_COMM = (r"comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)"
         r"(?: cudaDev (?P<cd>\d+))?(?: nvmlDev (?P<nv>\d+))?(?: busId (?P<bus>[0-9a-fA-F]+))?"
         r"(?: commId (?P<cid>0x[0-9a-fA-F]+))?(?: nNodes (?P<nn>\d+))?(?: localRanks (?P<lr>\d+))?")
_VIA = r"^(?:Channel|Ring) \d+(?:/\d+)? : (?P<src>\d+)(?:\[\w+\])? -> (?P<dst>\d+)(?:\[\w+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>\S+)"
_RING = r"^Channel (?P<ch>\d+)/(?P<nch>\d+) :(?P<order>(?: \d+)+)\s*$"
_TUNE = r"^(?P<op>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
KNOWN_MINOR = (4, 30)  # NCCL 2.4 .. 2.30: the line shapes FORMATS.md 2 describes


def _known_version(v: str) -> bool:
    parts = v.split(".")
    return len(parts) >= 2 and parts[0] == "2" and parts[1].isdigit() and KNOWN_MINOR[0] <= int(parts[1]) <= KNOWN_MINOR[1]


_VERSION = r"NCCL version (\d+\.\d+\.\d+\S*)"
_LAUNCHER_RANK = (r"^\s*(?:\[\d+,(?P<ompi>\d+)\]<std(?:out|err)>:|\[(?:default|rank)(?P<trun>\d+)\]:|(?P<slurm>\d+): |"
                  r"\[(?P<bracket>\d+)\]\s|\[Rank (?P<rk>\d+)\])")
# PyTorch's ProcessGroupNCCL watchdog (not NCCL's own lines, but the hang's evidence)
_WATCHDOG = r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<optype>\w+)"
# the group's status: "last enqueued work: N, last completed work: M" (torch 2.2), "last enqueued NCCL work: N, last
# completed NCCL work: M" (2.3 on; -1 before any), after "at work sequence id: S" / "at work: S" / "Timeout at NCCL
# work: S" (the seq it timed out on); a rank that did not time out says it on the dump signal ("Received a dump
# signal ... Last enqueued NCCL work: N, last completed NCCL work: M.")
_PGSTATUS = r"[Ll]ast enqueued (?:NCCL )?work: (?P<enq>-?\d+), last completed (?:NCCL )?work: (?P<done>-?\d+)"
_AT_WORK = r"(?:detected by watchdog at work(?: sequence id)?|Timeout at NCCL work): (\d+)"
# the rank a line of PyTorch's is about: its prefix "[Rank 3]", "[PG 1 Rank 3]", "[PG ID 0 PG GUID 0(default_pg) Rank 3]",
# else the launcher's "[rank3]:"; the process group it names ("PG 1", "PG ID 1")
_TORCH_RANK = r"[\[\s]Rank (\d+)\]"
_TORCH_PG = r"\[PG (?:ID )?(\d+)\b"
_TORCH_WORDS = r"Watchdog|WorkNCCL|NumelIn|ran for \d+ milliseconds|PG status|ProcessGroupNCCL|work sequence id|Traceback|^\s"


def _batches(path: Path):
    """Whole lines of the file (decompressed when gzip), ``BATCH_BYTES`` at a time; the last
    batch's partial line (a file cut off) is returned as a line of its own."""
    from tracelens.parsers.jsonstream import ContentReader

    r = ContentReader(path)
    try:
        rest = b""
        while True:
            block = r.read(BATCH_BYTES)
            if not block:
                if rest:
                    yield rest, r.problem
                return
            data = rest + block
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1:]
            yield data[: cut + 1], None
    finally:
        r.close()


def _lines(chunk: bytes, offset: int) -> pl.DataFrame:
    # one column of lines: a separator and quote that never occur (NUL and \x1f made spaces first)
    chunk = chunk.replace(b"\x00", b" ").replace(b"\x1f", b" ").replace(b"\r", b"")
    df = pl.read_csv(chunk, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"],
                     schema={"line": pl.String}, encoding="utf8-lossy", truncate_ragged_lines=True)
    return df.with_row_index("ln", offset=offset).with_columns(pl.col("ln").cast(pl.Int64) + 1)


def _ts_ns(ts: pl.Expr) -> pl.Expr:
    # NCCL_DEBUG_TIMESTAMP_FORMAT's time ("2025-07-25 19:54:57.101122", "T" and "," accepted) -> epoch ns
    return (ts.str.replace("T", " ", literal=True).str.replace(",", ".", literal=True)
            .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False).dt.epoch("ns"))


def _from_prefix(pre: pl.Expr) -> list[pl.Expr]:
    # what comes before a line's core: its time and the launcher's rank
    lr = pre.str.extract_groups(_LAUNCHER_RANK)
    return [_ts_ns(pre.str.extract(_TS)).alias("ts"),
            pl.coalesce(lr.struct.field(f).cast(pl.Int32, strict=False) for f in ("ompi", "trun", "slurm", "bracket", "rk"))
            .alias("launcher_rank")]


def _left_fields(left: pl.LazyFrame) -> pl.LazyFrame:
    """A line's part before its first " NCCL " -> whether it ends in a core (_LEFT), the process,
    device (host Categorical), time and launcher's rank; a function of that part alone, so run on
    each distinct part once where the parts repeat (a log without timestamps: a handful per process)."""
    g = pl.col("g").struct
    return (left.with_columns(pl.col("left").str.extract_groups(_LEFT).alias("g"))
            .with_columns(g.field("tail").is_not_null().alias("left_ok"), g.field("host").cast(pl.Categorical).alias("host"),
                          g.field("pid").cast(pl.Int64, strict=False).alias("pid"), g.field("dev").cast(pl.Int32, strict=False).alias("dev"),
                          # the prefix: _LEFT's match is a suffix of the left part
                          *_from_prefix(pl.col("left").str.strip_suffix(g.field("tail"))))
            .drop("g"))


# the words whose lines are read beyond the collective lines (a COLL line holding one is read as the others are)
_RARE = r" rank | via | Bytes -> Algo |Using network|coll channels|Connected all|^(?:Channel|Trees) "
# a word of any kind a line is read for (each kind's flag below implies one)
_READ = r"comm 0x| via | Bytes -> Algo |Using network|coll channels|Connected all|NCCL version|^(?:Channel|Trees) "


def _parse_batch(lines: pl.DataFrame) -> dict[str, pl.DataFrame]:
    line = pl.col("line")
    # the first NCCL core of a line; a line holding two (another line run into a cut one) is read by
    # its last, with the greedy prefix, on those lines only.  The common line: split at its first " NCCL ", the process/thread/device read from the short
    # part before it (a regex over ~40 bytes, not the whole line, once per distinct part), the level and message after it
    halves = line.str.splitn(" NCCL ", 2)
    split = lines.with_columns(halves.struct.field("field_0").alias("left"), halves.struct.field("field_1").alias("right"))
    # two " NCCL INFO |WARN " need a second " NCCL " after the first (they cannot overlap it): counted
    # on the lines that have one only
    many = (line.str.count_matches(" NCCL INFO ", literal=True) + line.str.count_matches(" NCCL WARN ", literal=True)) > 1
    many_ln = split.filter(pl.col("right").str.contains(" NCCL ", literal=True)).filter(many)["ln"]
    # (an empty line, null, is left out as before: not counted in the lines)
    split = split.with_columns(pl.when(line.is_not_null()).then(pl.col("ln").is_in(many_ln.implode()) if many_ln.len() else False)
                               .alias("interleaved"))
    lines = split.select("ln", "line", "interleaved")
    right, left = pl.col("right"), pl.col("left")
    # (a line without " NCCL ": no left part, not the whole line)
    one = split.filter(~pl.col("interleaved")).select("ln", "line", pl.when(right.is_not_null()).then(left).alias("left"), "right")
    # the level: _LEVEL reads at most a line's first 6 characters after " NCCL ", so once per distinct 6
    head = one.select(right.str.slice(0, 6).alias("h"))
    levels = head.drop_nulls().unique().with_columns(pl.col("h").str.extract(_LEVEL).alias("level"))
    one = one.with_columns(head["h"].replace_strict(levels["h"], levels["level"], default=None).alias("level"))
    # the part before the core, read once per distinct part where they repeat (else line by line): a table
    # of the parts that end in a core, each line's row in it (null: no core); the fields are taken from it
    # (gathered) by the lines of the kinds that use them only
    parts = one.select(left.drop_nulls().unique())
    if parts.height * 4 <= one.height:
        table = _left_fields(parts.lazy()).filter(pl.col("left_ok")).drop("left_ok").collect()
        at = one["left"].replace_strict(table["left"], pl.arange(0, table.height, dtype=pl.UInt32, eager=True), default=None,
                                        return_dtype=pl.UInt32)
    else:
        table = _left_fields(one.lazy().select("left")).collect()
        at = table.select(pl.when(pl.col("left_ok")).then(pl.int_range(pl.len(), dtype=pl.UInt32))).to_series()
        table = table.drop("left_ok")
    table = table.drop("left")
    one = (one.with_columns(at.alias("at"))
           .with_columns(pl.when(pl.col("level").is_not_null() & pl.col("at").is_not_null())
                         .then(right.str.slice(pl.col("level").str.len_bytes() + 1)).alias("msg"))
           .select("ln", "line", "level", "msg", "at"))
    two = (lines.filter(pl.col("interleaved")).with_columns(line.str.extract_groups(_CORE).alias("g")).unnest("g")
           .drop("tid", "interleaved"))
    if two.height:  # their fields from _CORE: rows of their own in the table
        two = two.with_columns(pl.int_range(table.height, table.height + pl.len(), dtype=pl.UInt32).alias("at"))
        table = pl.concat([table, two.select(pl.col("host").cast(pl.Categorical), pl.col("pid").cast(pl.Int64, strict=False),
                                             pl.col("dev").cast(pl.Int32, strict=False), *_from_prefix(pl.col("pre")))])

    def fields(frame: pl.DataFrame) -> pl.DataFrame:
        return table.select(pl.all().gather(frame["at"]))

    # (the lines of one, then the interleaved lines: their order in the rows and the WARN messages as before)
    core = pl.concat([one, two.select(one.columns)]) if two.height else one
    is_core = pl.col("msg").is_not_null()
    msg = pl.col("msg")
    counts = core.select(
        pl.len().alias("lines"),
        is_core.sum().alias("nccl_lines"),
        (is_core & (pl.col("level") == "WARN")).sum().alias("warn_lines"),
        pl.lit(two.height, pl.UInt32).alias("interleaved_lines"),
    )
    # the lines that are not NCCL's: the cheap tests first, each costly regex on what is left of them
    rest = core.lazy().filter(~is_core).select("line").filter(line.str.contains(r"\S") & ~line.str.starts_with("#")).collect()
    rest = rest.filter(~line.str.contains(_VERSION))
    counts = counts.with_columns(rest.select((~line.str.contains(_TORCH_WORDS)).sum()).to_series().alias("unknown_lines"))
    nccl = core.lazy().filter(is_core).drop("line").with_columns(msg.str.contains(" opCount ", literal=True).alias("k_coll")).collect()
    k = pl.col
    # the lines of the other kinds, each classified once by cheap literal tests (every costly regex runs on its kind
    # only); a COLL line is of those only where it holds one of their words (tested on the COLL lines, a line at a time)
    rare = nccl.lazy().filter(k("k_coll")).filter(msg.str.contains(_RARE)).select("ln").collect()["ln"]
    others = nccl.filter(~k("k_coll") | (k("ln").is_in(rare.implode()) if rare.len() else False))
    # each kind's words in one pass (_READ): a line holding none is of no kind, the flags on the others only
    has = others.select(msg.str.contains(_READ)).to_series()
    unread = others.filter(~has & (pl.col("level") != "WARN") & ~k("k_coll")).height
    others = (others.lazy().filter(has)
              .with_columns(msg.str.contains("comm 0x", literal=True).alias("k_comm"),
                            msg.str.contains(" via ", literal=True).alias("k_via"),
                            msg.str.starts_with("Channel ").alias("k_channel"),
                            msg.str.starts_with("Trees ").alias("k_trees"),
                            msg.str.contains(" Bytes -> Algo ", literal=True).alias("k_tune"),
                            msg.str.contains("Using network", literal=True).alias("k_net"),
                            msg.str.contains("coll channels", literal=True).alias("k_cc"),
                            msg.str.contains("Connected all", literal=True).alias("k_conn"))
              .collect())
    # the tail's regex (not one-pass: slow) on its rest only in a batch with a globalrank; else the
    # nranks read by the head's regex (no rest copied: the same nranks as the tail's first group)
    calls = nccl.filter(k("k_coll")).select("at", "ln", "msg").with_row_index("i")
    if calls.select(msg.str.contains("globalrank", literal=True).any()).item():
        coll = (calls.lazy().with_columns(msg.str.extract_groups(_COLL).alias("c")).unnest("c")
                .filter(pl.col("op").is_not_null()).with_columns(pl.col("rest").str.extract_groups(_COLL_TAIL).alias("t"))
                .unnest("t").drop("rest").collect())
    else:
        # the common line by _COLL_FAST (ASCII, one-pass: ~25% cheaper); a line it does not read by _COLL_NR
        coll = calls.with_columns(msg.str.extract_groups(_COLL_FAST).alias("c")).unnest("c")
        slow = coll.filter(pl.col("op").is_null()).select("i", "at", "ln", "msg")
        coll = coll.filter(pl.col("op").is_not_null())
        if slow.height:  # (back in the lines' order, which is not the line numbers' where interleaved lines are last)
            slow = slow.with_columns(msg.str.extract_groups(_COLL_NR).alias("c")).unnest("c").filter(pl.col("op").is_not_null())
            coll = pl.concat([coll, slow]).sort("i")
        coll = coll.with_columns(pl.lit(None, pl.String).alias("grank"))
    coll = (pl.concat([coll.select("ln"), fields(coll)], how="horizontal").lazy()
            .with_columns(coll.lazy().select(
                pl.col("op").cast(pl.Categorical), pl.col("opc").str.to_integer(base=16, strict=False).alias("seq"),
                pl.col("count").cast(pl.Int64, strict=False), pl.col("dt").cast(pl.Int16, strict=False),
                pl.col("rop").cast(pl.Int16, strict=False), pl.col("root").cast(pl.Int32, strict=False),
                pl.col("comm").cast(pl.Categorical), pl.col("nr").cast(pl.Int32, strict=False),
                pl.col("grank").cast(pl.Int32, strict=False)).collect())
            .select("ln", "host", "pid", "dev", "launcher_rank", "ts", "op", "seq", "count", "dt", "rop", "root", "comm", "nr", "grank")
            .collect())
    host_s = pl.col("host").cast(pl.String)

    def with_fields(frame: pl.DataFrame) -> pl.DataFrame:
        return pl.concat([frame, fields(frame)], how="horizontal").with_columns(host_s)

    comm = with_fields(others.filter(k("k_comm")).filter(msg.str.contains(" rank ", literal=True)).select("ln", "at", "msg"))
    comm = (comm.lazy().select("ln", "host", "pid", "dev", "launcher_rank", msg.str.extract_groups(_COMM).alias("c")).unnest("c")
            .filter(pl.col("comm").is_not_null()).collect())
    # a line of _VIA's shape has no " via " before its own (its tokens are numbers, "->", "[send]"): the
    # transport read after the first, no captures of the shape
    via = (with_fields(others.filter(k("k_via")).filter(msg.str.contains(_VIA)).select("at", "msg")).lazy()
           .select("host", "pid", "dev", msg.str.extract(r" via ((?:NET|COLLNET)/[^/\s]+|[A-Za-z0-9]+)").alias("transport"))
           .group_by("host", "pid", "dev", "transport").agg(pl.len().alias("connections")).collect())
    ring = (with_fields(others.filter(k("k_channel")).filter(~msg.str.contains("->", literal=True)).select("at", "msg")).lazy()
            .select("host", "pid", "dev", msg.str.extract_groups(_RING).alias("c")).unnest("c").filter(pl.col("ch").is_not_null())
            .select("host", "pid", "dev", pl.col("ch").cast(pl.Int32, strict=False)).filter(pl.col("ch").is_not_null()).unique().collect())
    tune = (others.lazy().filter(k("k_tune"))
            .select(msg.str.extract_groups(_TUNE).alias("c")).unnest("c").filter(pl.col("algo").is_not_null())
            .group_by("op", "algo", "proto").agg(pl.len().alias("calls"), pl.col("bytes").cast(pl.Int64, strict=False).min().alias("min_bytes"),
                                                 pl.col("bytes").cast(pl.Int64, strict=False).max().alias("max_bytes")).collect())
    words = (others.lazy().select(
        # each extract on the lines holding its literal only
        msg.filter(k("k_net")).str.extract(r"Using network (\S+)").drop_nulls().unique().implode().alias("network"),
        msg.filter(k("k_cc")).str.extract(r"^(\d+) coll channels").cast(pl.Int32, strict=False).max().alias("coll_channels"),
        k("k_trees").sum().alias("trees"),
        msg.filter(k("k_conn")).str.contains("Connected all rings", literal=True).sum().alias("rings_connected"),
        msg.filter(k("k_conn")).str.contains("Connected all trees", literal=True).sum().alias("trees_connected"),
    ).collect()).with_columns(nccl.lazy().select(msg.filter(pl.col("level") == "WARN").unique(maintain_order=True).head(5).implode()
                                                 .alias("warn")).collect().to_series())
    version = lines.lazy().filter(line.str.contains("NCCL version", literal=True)).select(line.str.extract(_VERSION).alias("v")).filter(pl.col("v").is_not_null()).unique().collect()
    # PyTorch's watchdog message spans lines: a line naming no rank gets that of the last line that named one
    # (its rank is the line's own where it names one: interleaved ranks' messages are not given their neighbour's);
    # its seq the line's, else that of the last line of that rank which named one (the status line after "at work")
    watchdog = (lines.lazy().filter(line.str.contains(r"Rank \d+\]|WorkNCCL\(SeqNum=|[Ll]ast enqueued (?:NCCL )?work:|ran for \d+ milliseconds|Timeout\(ms\)="))
                .select("ln", line.str.extract_groups(_WATCHDOG).alias("w"), line.str.extract_groups(_PGSTATUS).alias("p"),
                        line.str.extract(_AT_WORK).alias("at"), line.str.extract(_TORCH_PG).alias("pg"),
                        line.str.extract(r"ran for (\d+) milliseconds").cast(pl.Int64, strict=False).alias("ran_ms"),
                        line.str.extract(r"Timeout\(ms\)=(\d+)").cast(pl.Int64, strict=False).alias("timeout_ms"),
                        pl.coalesce(line.str.extract(_TORCH_RANK), line.str.extract(r"^\s*\[rank(\d+)\]:"))
                        .cast(pl.Int32, strict=False).forward_fill().alias("rank"))
                .unnest("w", "p").collect())
    # the global ranks PyTorch's lines name ("Rank N]", "[rankN]:"; a rank that logged no timeout while the others
    # did is the watchdog's evidence of the culprit). Not the launchers' prefixes of NCCL's lines: torchrun's
    # "[defaultN]:" is a local rank
    named = watchdog.select(pl.col("rank").drop_nulls().unique())
    watchdog = (watchdog.lazy()
                .with_columns(pl.coalesce("seq", "at").cast(pl.Int64, strict=False).alias("seq"),
                              pl.col("enq", "done").cast(pl.Int64, strict=False))
                .drop("at")
                .filter(pl.any_horizontal(pl.col("seq", "enq", "done", "ran_ms", "timeout_ms").is_not_null()))
                # (a status line without its seq: the seq of the rank's last line of that group that named one)
                .with_columns(pl.col("seq").forward_fill().over("rank", "pg"))
                .collect())
    # (a COLL line is read: only the others can be lines whose message is not)
    read_msgs = (pl.any_horizontal("k_coll", "k_comm", "k_via", "k_channel", "k_trees", "k_tune", "k_net", "k_cc", "k_conn")
                 | msg.str.contains("NCCL version", literal=True) | (pl.col("level") == "WARN"))
    counts = counts.with_columns((others.select((~read_msgs).sum()).to_series() + unread).alias("other_nccl_lines"))
    return {"counts": counts, "coll": coll, "comm": comm, "via": via, "ring": ring, "tune": tune, "words": words,
            "version": version, "watchdog": watchdog, "named": named}


def read(path: str | Path, file: int = 0) -> NcclParse:
    """Read one log.  Never raises for its content: what cannot be read is counted in the facts
    and said in the warnings."""
    path = Path(path)
    parts: dict[str, list[pl.DataFrame]] = {}
    offset = 0
    cut: str | None = None
    for chunk, problem in _batches(path):
        lines = _lines(chunk, offset)
        offset += lines.height
        cut = problem or cut
        for k, v in _parse_batch(lines).items():
            parts.setdefault(k, []).append(v)
    if not parts:  # an empty file: the same tables, empty
        for k, v in _parse_batch(pl.DataFrame(schema={"ln": pl.Int64, "line": pl.String})).items():
            parts[k] = [v]
    # the collective lines stay one frame per batch: turned into rows a batch at a time, each freed once done
    got: dict = {k: (v if k == "coll" else pl.concat(v, how="vertical_relaxed")) for k, v in parts.items()}
    return _assemble(str(path), file, got, cut)


def _first(c: str) -> pl.Expr:
    return pl.col(c).drop_nulls().first()


def _assemble(path: str, file: int, got: dict, cut: str | None) -> NcclParse:
    warnings: list[str] = []
    c = got["counts"].sum().row(0, named=True)
    comms = (got["comm"].lazy()
             .group_by("host", "pid", "comm")
             .agg(_first("cid").alias("comm_id"), _first("rank").cast(pl.Int32, strict=False).alias("rank"),
                  _first("nranks").cast(pl.Int32, strict=False).alias("nranks"),
                  pl.coalesce(_first("cd").cast(pl.Int32, strict=False), _first("dev")).alias("cuda_dev"),
                  _first("nv").cast(pl.Int32, strict=False).alias("nvml_dev"), _first("bus").alias("bus_id"),
                  _first("nn").cast(pl.Int32, strict=False).alias("nnodes"), _first("lr").cast(pl.Int32, strict=False).alias("local_ranks"),
                  _first("launcher_rank").cast(pl.Int32).alias("launcher_rank"))
             .with_columns(pl.lit(file, pl.Int32).alias("file"))
             .select([pl.col(k).cast(t) for k, t in COMM_SCHEMA.items()])
             .sort("comm_id", "rank", "host", "pid", nulls_last=True)
             .collect())
    # a process's (and device's) global rank: its rank in its largest communicator
    world = (comms.lazy().sort("nranks", descending=True, nulls_last=True)
             .group_by("host", "pid", "cuda_dev").agg(pl.col("rank").first().alias("proc_rank")).collect())
    coll_parts: list[pl.DataFrame] = got.pop("coll")
    if isinstance(coll_parts, pl.DataFrame):
        coll_parts = [coll_parts]
    nranks = pl.coalesce(pl.col("nr"), pl.col("nranks"))
    dt = pl.col("dt").cast(pl.Int64)
    elsize = dt.replace_strict({0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}, default=None,
                               return_dtype=pl.Int64)
    guessed = pl.col("comm_id").is_null()
    # without a commId, a communicator is guessed by its size and the order in which the process's
    # device first used communicators of that size (ranks create them in the same order)
    # (grouped on the Categorical host and comm codes: their strings made once per group, not once per line)
    order = (pl.concat([p.lazy().select("host", "pid", "dev", "comm", "ln", "nr") for p in coll_parts], how="vertical_relaxed")
             .group_by("host", "pid", "dev", "comm").agg(pl.col("ln").min().alias("first_ln"), pl.col("nr").max().alias("nr"))
             .with_columns(pl.col("host", "comm").cast(pl.String))
             .with_columns(pl.col("first_ln").rank("dense").over("host", "pid", "dev", "nr").alias("nth"))
             .select("host", "pid", "dev", "comm", "nth").collect().lazy())

    def codes(part: pl.DataFrame, col: str, name) -> dict:
        # the names of the codes this part holds (a handful): a format per row only where it is needed
        return {c: name(c) for c in part[col].drop_nulls().unique().to_list()}

    # the distinct processes of each part (a unique over all rows at the end cost ~80 MB for 1.3 M rows)
    procs: list[pl.DataFrame] = []

    def build(part: pl.DataFrame) -> pl.DataFrame:
        ops = codes(part, "op", lambda o: NCCL_OPS.get(o, o.lower()))  # op is ASCII letters ([A-Za-z]+)
        dtypes = codes(part, "dt", lambda c: NCCL_DTYPES[c] if 0 <= c < len(NCCL_DTYPES) else f"datatype{c}")
        redops = codes(part, "rop", lambda c: NCCL_REDOPS[c] if 0 <= c < len(NCCL_REDOPS) else f"premulsum{c}")
        collective = pl.col("op").replace_strict(ops, default=None, return_dtype=pl.Categorical)
        mult = pl.when(pl.col("collective").is_in(["allgather", "reducescatter"])).then(nranks.cast(pl.Int64)).otherwise(1)
        # the communicator, the process's rank and the guess's order looked up once per (process, device,
        # communicator) of the part, then one join per row (null keys matching their own lookup row)
        key4 = ["host", "pid", "dev", "comm"]
        # (the join on the Categorical host and comm: their codes, no string per row)
        keys = part.select(key4).unique()
        procs.append(keys.select("host", "pid").unique())
        look = (keys.lazy()
                .with_columns(pl.col("host").cast(pl.String).alias("host_s"), pl.col("comm").cast(pl.String).alias("comm_s"))
                .join(comms.lazy().select(pl.col("host").alias("host_s"), "pid", pl.col("comm").alias("comm_s"), "comm_id", "rank",
                                          "nranks"), on=["host_s", "pid", "comm_s"], how="left")
                .join(world.lazy().rename({"cuda_dev": "dev", "host": "host_s"}), on=["host_s", "pid", "dev"], how="left")
                .join(order.rename({"host": "host_s", "comm": "comm_s"}), on=["host_s", "pid", "dev", "comm_s"], how="left")
                .drop("host_s", "comm_s").with_columns(pl.col("comm_id").cast(pl.Categorical)))
        j = (part.lazy()
                .join(look, on=key4, how="left", nulls_equal=True, maintain_order="left")
                # (op, host and comm stay Categorical: the rows' dtype, no string per row)
                .with_columns(collective.alias("collective"), nranks.alias("group_size"),
                              pl.coalesce(pl.col("rank"), "grank", "launcher_rank").cast(pl.String).alias("member"))
                .collect())
        # the formats only on a part that needs them
        group = (pl.when(guessed).then(pl.format("nranks={}#{}", pl.col("group_size").cast(pl.String).fill_null("?"), "nth"))
                 .otherwise(pl.col("comm_id").cast(pl.String)) if j["comm_id"].null_count() else pl.col("comm_id"))
        member = (pl.col("member").fill_null(pl.format("{}:{}[{}]", pl.col("host").cast(pl.String), "pid", "dev"))
                  if j["member"].null_count() else pl.col("member"))
        return (j.lazy()
                .select(
                    pl.lit(file, pl.Int32).alias("file"),
                    pl.coalesce("grank", "launcher_rank", "proc_rank", "rank").cast(pl.Int32).alias("rank"),
                    group.alias("group"),
                    pl.lit(None, pl.Categorical).alias("group_desc"),
                    "seq",
                    "collective",
                    pl.col("ts").alias("start_ns"),
                    pl.lit(None, pl.Int64).alias("end_ns"),
                    (pl.col("count") * elsize * mult).alias("bytes"),
                    "group_size",
                    pl.lit(True).alias("on_host"),
                    pl.lit(None, pl.Int64).alias("exposed_ns"),
                    pl.lit(1, pl.Int32).alias("n_parts"),
                    pl.lit(NAME, NCCL_ROW_SCHEMA["source"]).alias("source"),
                    # the rank in the communicator, else the global rank a launcher or NCCL printed, else the process
                    member.alias("member"),
                    pl.col("op").alias("op_name"),
                    "count",
                    pl.lit(None, pl.Int64).alias("out_count"),
                    pl.col("dt").replace_strict(dtypes, default=None, return_dtype=pl.Categorical).alias("dtype"),
                    "root",
                    pl.col("rop").replace_strict(redops, default=None, return_dtype=pl.Categorical).alias("redop"),
                    pl.lit("scheduled", pl.Categorical).alias("state"),
                    pl.lit(None, pl.Int64).alias("p2p_seq"),
                    "comm", "host", "pid",
                    pl.col("ln").alias("order"),
                    pl.lit(None, pl.String).alias("frames"),
                )
                .select([pl.col(k).cast(t) for k, t in NCCL_ROW_SCHEMA.items()])
                .collect())

    # built a batch's lines (at most ASSEMBLE_ROWS) at a time, each batch's lines freed once built: the
    # memory beyond the rows stays that of one batch (in line order: a sort would copy them once more)
    built = []
    while coll_parts:
        # (consecutive batches' lines together up to ASSEMBLE_ROWS: a build's cost is mostly per call, ~3x fewer calls)
        group = [coll_parts.pop(0)]
        while coll_parts and sum(p.height for p in group) + coll_parts[0].height <= ASSEMBLE_ROWS:
            group.append(coll_parts.pop(0))
        part = pl.concat(group) if len(group) > 1 else group[0]
        del group
        built.extend(build(part.slice(i, ASSEMBLE_ROWS)) for i in range(0, max(part.height, 1), ASSEMBLE_ROWS))
        del part
    rows = pl.concat(built, rechunk=False)
    del built
    if rows.height and rows["group"].cat.starts_with("nranks=").any():
        n = int(rows["group"].cat.starts_with("nranks=").sum())
        warnings.append(f"{n} collective line(s) name a communicator whose commId the log does not give (no INIT lines: "
                        "NCCL_DEBUG_SUBSYS without INIT, or an excerpt); grouped by size and order of first use (nranks=N#k), a guess")
    words = got["words"]
    versions = sorted(got["version"]["v"].unique().to_list())
    w = got["watchdog"]
    facts = {
        "nccl_version": versions[0] if len(versions) == 1 else (versions or None),
        "lines": c["lines"], "nccl_lines": c["nccl_lines"], "collective_lines": rows.height,
        "warn_lines": c["warn_lines"], "unknown_lines": c["unknown_lines"], "other_nccl_lines": c["other_nccl_lines"],
        "interleaved_lines": c["interleaved_lines"],
        "processes": (pl.concat([p.select(pl.col("host").cast(pl.String), "pid") for p in procs] + [got["comm"].select("host", "pid")])
                      .unique().height),
        "communicators": comms.height,
        "networks": sorted(words["network"].explode().drop_nulls().unique().to_list()),
        "coll_channels": words["coll_channels"].max(),
        "tree_lines": int(words["trees"].sum()), "rings_connected": int(words["rings_connected"].sum()),
        "trees_connected": int(words["trees_connected"].sum()),
        "transports": (got["via"].group_by("transport").agg(pl.col("connections").sum()).sort("transport")
                       .to_dicts()),
        "channels": (got["ring"].unique().group_by("host", "pid", "dev").agg(pl.col("ch").n_unique().alias("channels"))
                     .select(pl.col("channels").max()).item() if got["ring"].height else None),
        "tuning": got["tune"].group_by("op", "algo", "proto").agg(pl.col("calls").sum(), pl.col("min_bytes").min(),
                                                                 pl.col("max_bytes").max()).sort("op", "algo", "proto").to_dicts(),
        "warnings_logged": words["warn"].explode().drop_nulls().unique(maintain_order=True).head(5).to_list(),
        # per rank: the collective PyTorch's watchdog timed out on, and its group's last enqueued / completed work
        "ranks_named": sorted(got["named"]["rank"].unique().head(MAX_NAMED).to_list()),
        # (one item per rank and seq it timed out on: a rank's groups time out one by one, each its own seq)
        # (a timeout's line names no group, the status line of its seq does: that one's; a status without a seq, of a
        # rank that did not time out in that group, is an item of its own with seq null)
        "watchdog": (w.with_columns(pl.when(pl.col("seq").is_not_null())
                                    .then(pl.col("pg").fill_null(pl.col("pg").drop_nulls().first().over("rank", "seq")))
                                    .otherwise(pl.col("pg")).alias("pg"))
                     .group_by("rank", "pg", "seq").agg(_first("optype").alias("op"),
                                                   _first("timeout_ms").alias("timeout_ms"), _first("ran_ms").alias("ran_ms"),
                                                   _first("enq").alias("last_enqueued"), _first("done").alias("last_completed"))
                     .sort("rank", "pg", "seq", nulls_last=True).head(MAX_WATCHDOG)
                     .select("rank", "seq", "op", "pg", "timeout_ms", "ran_ms", "last_enqueued", "last_completed").to_dicts()
                     if w.height else []),
    }
    unknown = [v for v in versions if not _known_version(v)]
    if unknown:
        warnings.append(f"NCCL version {', '.join(unknown[:4])} is outside the versions this reader knows (2.{KNOWN_MINOR[0]} to "
                        f"2.{KNOWN_MINOR[1]}): lines of a shape it does not know are counted as unknown")
    if cut:
        warnings.append(f"the log is cut short ({cut}); its last line read as it stands")
    if c["unknown_lines"]:
        warnings.append(f"{c['unknown_lines']} line(s) are neither NCCL's nor PyTorch's watchdog (skipped)")
    if c["interleaved_lines"]:
        warnings.append(f"{c['interleaved_lines']} line(s) hold another line run into them (interleaved output): read by their last NCCL part")
    bad = int(rows.select(pl.col("seq").is_null().sum()).item()) if rows.height else 0
    if bad:
        warnings.append(f"{bad} collective line(s) with an opCount that is not a number (left out)")
        rows = rows.filter(pl.col("seq").is_not_null())
    if c["nccl_lines"] == 0 and not rows.height:
        warnings.append("no NCCL lines in this log")
    return NcclParse(path, NAME, rows, comms, facts, warnings)


def numbered_lines(path):
    """Each batch of ``path``'s lines as a frame (``_lines``: numbered across batches, nulls as
    ""), with the problem ``_batches`` met reading it (a cut file), or None."""
    offset = 0
    for chunk, problem in _batches(path):
        lines = _lines(chunk, offset).with_columns(pl.col("line").fill_null(""))
        offset += lines.height
        yield lines, problem
