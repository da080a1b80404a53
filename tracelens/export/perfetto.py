"""A job as one Chrome / Perfetto trace, with its critical path overlaid (issue 17, Must 5).

``export_trace(paths, out)`` writes a JSON trace (Chrome Trace Event Format; gzip when ``out``
ends in ``.gz``) that opens in ui.perfetto.dev and in ``chrome://tracing``:

* one process per input file (rank), named by ``process_name`` / ``process_sort_index``
  metadata (``ph:"M"``); in it one thread per host thread of the trace and one per GPU stream,
  named by ``thread_name`` metadata (the trace's own thread names where it recorded them);
* every timed event as a complete event (``ph:"X"``, ``ts``/``dur`` in µs with ns kept as three
  decimals; an event without a duration as a thread instant, ``ph:"i"``), ``args`` holding its
  kind, source category, correlation and external id.  Times are relative to the job's first
  event (``otherData.origin_ns`` says where that is on the first file's clock), so that floats
  keep every nanosecond;
* the critical path (``tracelens.analysis.rank.critical``, each step of each rank): a thread
  "critical path" per rank with one slice per path segment, named by its category (so a step's
  slices sum to its path's length, which is the step's time), and flow arrows between the
  consecutive events the path passes through.  The arrows are Perfetto's v1 flows: a ``ph:"s"``
  on the source event's thread at a time inside it and a ``ph:"f"`` with ``bp:"e"`` (bind to the
  enclosing slice) inside the destination, both with the same ``id``, ``cat`` and ``name`` (the
  importer keys a v1 flow by all three);
* where a multi-rank job's path is stitched across ranks (``job.critical_path.steps[].hops``), an
  arrow per hop between the ranks' path tracks: from the late rank just before its start of the
  call to the rank that waited for it, at the arrival ("critical path across ranks", ids from
  ``CROSS_ID``);
* a what-if track per rank ("what-if: <change>") when ``tracelens.analysis.rank.replay`` is
  importable and offers ``export_tracks`` (see ``_what_if``); omitted otherwise.  In a job whose
  ranks wait for each other at collectives the tracks show the job's predicted steps
  (``suggest.job_step_predictions``, on the stitched path), not a rank's own replay (which counts
  its wait for a later rank as removable), and none where the paths cannot be stitched.

``align_clocks``: shift every rank by the job's clock alignment (``RankResult.clock_offset_ns``,
the offset that makes shared collectives end together: ``tracelens.analysis.job.clocks``), so
that ranks line up in the timeline; without it each file's times are as recorded.

Rank by rank: one rank's events in memory at a time, written in chunks of ``CHUNK`` events, each
chunk's JSON built by polars (``struct.json_encode``), never a Python loop per event.  The file is
written to a temporary name and renamed (``store.atomic``): on any failure no partial file is
left.  Names from the trace lose their control codes (``model.printable``'s characters become
U+FFFD, a tab a space); JSON escaping does the rest."""

from __future__ import annotations

import gzip
import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import orjson
import polars as pl

from tracelens.model.printable import _UNPRINTABLE, REPLACEMENT

CHUNK = 200_000  # events per encoded chunk: bounds the memory of the JSON text
FLOW_CAT = "critical_path"
FLOW_NAME = "critical path"
PATH_THREAD = "critical path"


@dataclass
class Written:
    """What an export wrote."""

    out: str
    ranks: int = 0
    events: int = 0  # complete and instant events of the traces
    segments: int = 0  # critical-path slices
    flows: int = 0  # flow arrows (each one "s" and one "f")
    cross_flows: int = 0  # of them, the arrows between ranks (the job's path from a late rank to one that waited)
    warnings: list[str] = field(default_factory=list)


def clean(e: pl.Expr) -> pl.Expr:
    """A name from a trace without control codes (as ``model.printable``), never null."""
    return e.cast(pl.String).fill_null("").str.replace_all(_UNPRINTABLE.pattern, REPLACEMENT).str.replace_all("\t", " ", literal=True)


def _clean_str(s: str) -> str:
    return _UNPRINTABLE.sub(REPLACEMENT, s).replace("\t", " ")


def export_trace(paths: Iterable[str | Path], out: str | Path, *, align_clocks: bool = False, options: Any = None,
                 use_cache: bool = True, keep_python: bool = False, strict: bool = False, prefer: str | None = None,
                 jobs: int | None = None) -> Written:
    """Write the job in ``paths`` as a Perfetto/Chrome trace at ``out`` (see the module's text).
    ``options``: the analysis options (``model.options.Options``: steps, step ranges); the
    critical path is always computed.  Raises TraceInputError for an input that cannot be used and
    OutputError when ``out`` cannot be written (checked before any parse; nothing left behind)."""
    from tracelens.analysis import analyze
    from tracelens.model.errors import OutputError
    from tracelens.model.options import Options
    from tracelens.store.atomic import check_output, output_problem, write_with
    from tracelens.store.job import load

    out = Path(out)
    check_output(out)
    options = replace(options or Options(), critical_path=True)
    job = load([str(p) for p in paths], use_cache=use_cache, keep_python=keep_python, strict=strict, prefer=prefer, jobs=jobs)
    a = analyze(job, options)
    result = Written(out=str(out), warnings=[*a.warnings, *(w for r in a.ranks for w in r.warnings)])
    offsets = {r.file: (r.clock_offset_ns if align_clocks else 0) for r in a.ranks}
    starts = [lo + offsets.get(h.file, 0) for h in job.handles for lo in [h.span()[0]] if lo is not None]
    origin = min(starts) if starts else 0

    def write(tmp: str) -> None:
        raw = open(tmp, "wb")  # noqa: SIM115 (closed below, after gzip's own close)
        try:
            f: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) if out.name.lower().endswith(".gz") else raw
            try:
                other = {"tool": "tracelens", "origin_ns": origin, "clocks": "aligned" if align_clocks else "as recorded",
                         "clock_method": a.clock_method}
                f.write(b'{"displayTimeUnit":"ns","otherData":' + orjson.dumps(other) + b',"traceEvents":[\n')
                first = True
                coupled = _job_predictions(a)
                tracks: dict[int, tuple[int, int, int, pl.DataFrame]] = {}
                for r in a.ranks:
                    for part in _rank_events(job, r, options, origin, offsets.get(r.file, 0), result, coupled, tracks):
                        if part:
                            f.write(part if first else b",\n" + part)
                            first = False
                    result.ranks += 1
                part = _cross_rank_arrows(a, tracks, result)
                if part:
                    f.write(part if first else b",\n" + part)
                f.write(b"\n]}\n")
            finally:
                if f is not raw:
                    f.close()
        finally:
            raw.close()

    try:
        write_with(out, write)
    except OSError as e:
        raise OutputError(str(out), f"cannot write: {output_problem(e)}; nothing was written") from None
    return result


def _us(ns: pl.Expr) -> pl.Expr:
    return ns.cast(pl.Float64) / 1000.0


def _job_predictions(a) -> dict[str, list[int | None] | None] | None:
    """In a job whose ranks wait for each other at collectives: per change any rank replayed, the
    job's predicted steps (None: withheld, the paths not stitched); None for independent ranks."""
    from tracelens.analysis import suggest

    cp = a.job.critical_path if a.job is not None else None
    ranks = list(a.ranks)
    changes = sorted({c for r in ranks for c in (r.what_if or {})})
    if not changes or not cp:
        return None
    if suggest.withheld(cp, ranks):
        return dict.fromkeys(changes)
    if not cp.get("steps"):
        return None
    from tracelens.analysis.rank import critical

    waits = critical.step_waits([r.critical_path for r in ranks], a.table(), [(r.file, r.rank) for r in ranks])
    return {c: suggest.job_step_predictions(c, cp, ranks, waits) for c in changes}


def _rank_events(job, r, options, origin: int, offset: int, result: Written, coupled=None,
                 tracks: dict[int, tuple[int, int, int, pl.DataFrame]] | None = None) -> Iterable[bytes]:
    """The JSON text of one rank's events, in chunks: metadata, the trace's events, the path's
    slices and flows, the what-if tracks."""
    from tracelens.analysis.rank import critical_paths

    meta = job.metas[r.file]
    pid = r.file + 1  # one process per file (pid 0 is no process in Perfetto)
    df = job.frame(r.file)
    shift = offset - origin  # add to a time of this file to get the output's (ns)
    # lanes: host threads (by pid, tid), then GPU streams, then rows on neither
    lane = (pl.when(pl.col("tid").is_not_null()).then(0).when(pl.col("stream").is_not_null()).then(1).otherwise(2)).alias("_lk")
    # a host lane is a (pid, tid); a GPU lane a (device, stream): a file with several GPUs' events
    # (one process driving two) gives each device's streams their own tracks, not one mixed track
    # of overlapping slices (the importer nests slices on a thread; overlaps that do not nest break it)
    keyed = df.lazy().with_row_index("_row").with_columns(lane).with_columns(
        pl.when(pl.col("_lk") == 1).then(pl.col("device").cast(pl.Int64)).otherwise(pl.col("pid")).fill_null(-1).alias("_a"),
        pl.coalesce("tid", "stream").fill_null(-1).alias("_b"))
    lanes = keyed.select("_lk", "_a", "_b").unique().sort("_lk", "_a", "_b").with_row_index("_tid", offset=1).collect()
    lanes = lanes.with_columns(pl.col("_tid").cast(pl.Int64))
    n_host_pids = lanes.filter(pl.col("_lk") == 0).get_column("_a").n_unique()
    path_tid = lanes.height + 1
    # metadata: the process and each thread named; the path track first
    label = f"rank {r.rank}" if r.rank is not None else f"file {r.file}"
    md: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": _clean_str(f"{label} ({Path(meta.path).name})")}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0, "args": {"sort_index": r.file}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": path_tid, "ts": 0, "args": {"name": PATH_THREAD}},
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": path_tid, "ts": 0, "args": {"sort_index": -2}},
    ]
    for lk, a, b, tid in lanes.select("_lk", "_a", "_b", "_tid").iter_rows():  # one per thread or stream: a few dozen
        if lk == 0:
            name = meta.threads.get(f"{a}:{b}") or f"thread {b}"
            name = f"{name} (pid {a})" if n_host_pids > 1 else name
        elif lk == 1:
            dev = a if a >= 0 else meta.device_id
            name = f"GPU {dev if dev is not None else '?'} stream {b}"
        else:
            name = "other events"
        md.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": _clean_str(str(name))}})
        md.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0, "args": {"sort_index": tid}})
    yield b",\n".join(orjson.dumps(m) for m in md)
    # the trace's events, CHUNK at a time
    # (in the events' order: a join keeps no order unless asked, and the export must be the same run after run)
    ev = keyed.filter(pl.col("ts_ns").is_not_null()).join(lanes.lazy(), on=["_lk", "_a", "_b"], how="left", maintain_order="left")
    timed = pl.col("dur_ns").is_not_null()
    ev = ev.select("_row", "_tid", "ts_ns", "dur_ns", "name", "cat", "kind", "correlation", "external_id", "stream").collect()
    encode = pl.struct(
            clean(pl.col("name")).alias("name"),
            clean(pl.col("cat")).alias("cat"),
            pl.when(timed).then(pl.lit("X")).otherwise(pl.lit("i")).alias("ph"),
            pl.lit(pid).alias("pid"),
            pl.col("_tid").alias("tid"),
            _us(pl.col("ts_ns") + shift).alias("ts"),
            _us(pl.col("dur_ns").clip(lower_bound=0)).alias("dur"),
            pl.struct(pl.col("kind").cast(pl.String), "correlation", "external_id", "stream").alias("args"),
        ).struct.json_encode().str.join(",\n")
    for i in range(0, ev.height, CHUNK):
        yield ev.slice(i, CHUNK).select(encode).item().encode()
    result.events += ev.height
    # the critical path of every step: its slices and the arrows between its events
    paths = critical_paths(df, meta, options, r.steps)
    segs = [p.segments.with_columns(pl.lit(k, pl.Int64).alias("step_index")) for k, p in enumerate(paths) if p.segments is not None]
    if segs:
        seg = pl.concat(segs)
        if tracks is not None:  # the path track's slices of this rank: where arrows from other ranks land
            tracks[r.file] = (pid, path_tid, shift, seg.select("start_ns", "end_ns").sort("start_ns"))
        yield from _path_events(seg, r, df, ev.select("_row", "_tid", "ts_ns", "dur_ns"), pid, path_tid, shift, result)
    yield from _what_if(r, df, pid, path_tid, shift, result, coupled)


def _path_events(seg: pl.DataFrame, r, df: pl.DataFrame, where: pl.DataFrame, pid: int, path_tid: int, shift: int,
                 result: Written) -> Iterable[bytes]:
    steps = pl.DataFrame({"step_index": list(range(len(r.steps))), "step": [s.step for s in r.steps]},
                         schema={"step_index": pl.Int64, "step": pl.Int64})
    # adjacent segments of one step with the same category and event are one slice
    runs = (seg.sort("step_index", "start_ns")
            .with_columns(pl.struct("step_index", "category", "row").rle_id().alias("_run"))
            .group_by("_run", maintain_order=True)
            .agg(pl.col("step_index").first(), pl.col("category").first(), pl.col("row").first(),
                 pl.col("start_ns").min(), pl.col("end_ns").max())
            .join(steps, on="step_index", how="left", maintain_order="left"))
    owner = runs.get_column("row")
    named = pl.Series("event", df.get_column("name").gather(owner.fill_null(0)).cast(pl.String)) if df.height else pl.repeat(None, runs.height, dtype=pl.String, eager=True)
    runs = runs.with_columns(pl.when(pl.col("row").is_not_null()).then(clean(pl.lit(named.alias("event")))).alias("event"))
    marks = runs.select(pl.struct(
        pl.col("category").alias("name"), pl.lit(FLOW_CAT).alias("cat"), pl.lit("X").alias("ph"), pl.lit(pid).alias("pid"),
        pl.lit(path_tid).alias("tid"), _us(pl.col("start_ns") + shift).alias("ts"), _us(pl.col("end_ns") - pl.col("start_ns")).alias("dur"),
        pl.struct("step", "event").alias("args"),
    ).struct.json_encode().alias("j")).get_column("j")
    if marks.len():
        yield marks.str.join(",\n").item().encode()
    result.segments += marks.len()
    # the events the path passes through, in order (one entry per run of one event), and a point
    # inside each: the middle of its segment, clamped into the event (a launch's latency runs past its call)
    on = (runs.filter(pl.col("row").is_not_null())
          .with_columns(pl.col("row").cast(pl.UInt32))
          .join(where.rename({"_row": "row"}), on="row", how="inner")
          .sort("step_index", "start_ns")
          .filter((pl.col("row") != pl.col("row").shift(1)) | (pl.col("step_index") != pl.col("step_index").shift(1)) | pl.col("row").shift(1).is_null())
          .with_columns(((pl.col("start_ns") + pl.col("end_ns")) // 2).clip(
              pl.col("ts_ns"), pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(lower_bound=0)).alias("_at")))
    pairs = on.select(
        pl.col("_tid").alias("_stid"), pl.col("_at").alias("_sat"),
        pl.col("_tid").shift(-1).alias("_ftid"), pl.col("_at").shift(-1).alias("_fat"),
        (pl.col("step_index") == pl.col("step_index").shift(-1)).alias("_same"),
    ).filter(pl.col("_same").fill_null(False)).with_row_index("_k")
    if not pairs.height:
        return
    fid = pl.col("_k").cast(pl.Int64) + pid * (1 << 32)  # unique in the job

    def flow(ph: str, tid: str, at: str, extra: dict[str, str]) -> pl.Expr:
        return pl.struct(pl.lit(FLOW_NAME).alias("name"), pl.lit(FLOW_CAT).alias("cat"), pl.lit(ph).alias("ph"),
                         fid.alias("id"), pl.lit(pid).alias("pid"), pl.col(tid).alias("tid"), _us(pl.col(at) + shift).alias("ts"),
                         *(pl.lit(v).alias(k) for k, v in extra.items())).struct.json_encode()
    j = pairs.select(pl.concat_str(flow("s", "_stid", "_sat", {}), pl.lit(",\n"), flow("f", "_ftid", "_fat", {"bp": "e"})).alias("j"))
    yield j.get_column("j").str.join(",\n").item().encode()
    result.flows += pairs.height


CROSS_FLOW_NAME = "critical path across ranks"
CROSS_ID = 1 << 50  # above every rank's own flow ids (pid << 32 + k), below 2^53 (a JSON number a browser reads exactly)


def _cross_rank_arrows(a, tracks: dict[int, tuple[int, int, int, pl.DataFrame]], result: Written) -> bytes | None:
    """The job's path where it crosses ranks (``job.critical_path.steps[].hops``): one arrow per hop,
    from the late rank's path track just before its start of the call (where its part of the path
    ends) to the waiting rank's path track at the arrival (where its part resumes), each end inside
    a path slice of its track (an end that falls outside every slice, a window's edge, is dropped
    with its arrow).  None without a stitched path."""
    cp = a.job.critical_path if a.job is not None else None
    hops = [h for st in (cp or {}).get("steps") or () for h in st.get("hops") or ()]
    if not hops or not tracks:
        return None
    seen: dict[int, list[int]] = {}
    for r in a.ranks:
        if r.rank is not None:
            seen.setdefault(r.rank, []).append(r.file)
    file_of = {rk: fs[0] for rk, fs in seen.items() if len(fs) == 1 and fs[0] in tracks}  # a rank in two files: no arrow
    if not file_of:
        return None
    h = pl.DataFrame(hops, schema_overrides={"rank": pl.Int64, "waited_for": pl.Int64, "arrival_ns": pl.Int64,
                                             "late_start_ns": pl.Int64}).with_row_index("_k")

    def end(rank: str, at: pl.Expr, side: str) -> pl.DataFrame:
        """Each hop's end on ``rank``'s path track at ``at`` (its file's clock): pid, tid and the
        output's time, where a path slice of that track holds it."""
        pts = (h.select("_k", pl.col(rank).replace_strict(list(file_of), list(file_of.values()), default=None,
                                                             return_dtype=pl.Int64).alias("_f"), at.alias("_t"))
               .filter(pl.col("_f").is_not_null()))
        got = []
        for f, (pid, tid, shift, slices) in tracks.items():  # one per rank
            mine = pts.filter(pl.col("_f") == f).sort("_t")
            if not mine.height:
                continue
            held = (mine.join_asof(slices, left_on="_t", right_on="start_ns", strategy="backward")
                    .filter(pl.col("end_ns").is_not_null() & (pl.col("_t") < pl.col("end_ns"))))
            got.append(held.select("_k", pl.lit(pid, pl.Int64).alias(f"{side}pid"), pl.lit(tid, pl.Int64).alias(f"{side}tid"),
                                   _us(pl.col("_t") + shift).alias(f"{side}ts")))
        return pl.concat(got) if got else pl.DataFrame(schema={"_k": pl.UInt32, f"{side}pid": pl.Int64, f"{side}tid": pl.Int64,
                                                               f"{side}ts": pl.Float64})
    src = end("waited_for", pl.col("late_start_ns") - 1, "s")
    dst = end("rank", pl.col("arrival_ns"), "f")
    pairs = src.join(dst, on="_k").sort("_k").with_row_index("_n")
    if not pairs.height:
        return None
    fid = pl.col("_n").cast(pl.Int64) + CROSS_ID

    def flow(ph: str, extra: dict[str, str]) -> pl.Expr:
        return pl.struct(pl.lit(CROSS_FLOW_NAME).alias("name"), pl.lit(FLOW_CAT).alias("cat"), pl.lit(ph).alias("ph"), fid.alias("id"),
                         pl.col(f"{ph}pid").alias("pid"), pl.col(f"{ph}tid").alias("tid"), pl.col(f"{ph}ts").alias("ts"),
                         *(pl.lit(v).alias(k) for k, v in extra.items())).struct.json_encode()
    j = pairs.select(pl.concat_str(flow("s", {}), pl.lit(",\n"), flow("f", {"bp": "e"})).alias("j"))
    result.flows += pairs.height
    result.cross_flows += pairs.height
    return j.get_column("j").str.join(",\n").item().encode()


def _what_if(r, df: pl.DataFrame, pid: int, path_tid: int, shift: int, result: Written, coupled=None) -> Iterable[bytes]:
    """The what-if tracks: when ``tracelens.analysis.rank.replay`` exists and offers
    ``export_tracks(rank_result, frame) -> [(change, frame of start_ns, end_ns, name)]`` (the
    replayed step times of each change, on the rank's clock), one thread "what-if: <change>"
    each; else none."""
    try:
        replay = importlib.import_module("tracelens.analysis.rank.replay")
    except ImportError:
        return
    tracks = getattr(replay, "export_tracks", None)
    if tracks is None:
        return
    for k, (change, frame) in enumerate((tracks(r, df, coupled) if coupled is not None else tracks(r, df)) or ()):
        tid = path_tid + 1 + k
        yield orjson.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": _clean_str(f"what-if: {change}")}})
        if frame is None or not frame.height:
            continue
        j = frame.select(pl.struct(clean(pl.col("name")).alias("name"), pl.lit("what_if").alias("cat"), pl.lit("X").alias("ph"),
                                   pl.lit(pid).alias("pid"), pl.lit(tid).alias("tid"), _us(pl.col("start_ns") + shift).alias("ts"),
                                   _us((pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=0)).alias("dur")).struct.json_encode())
        yield j.to_series().str.join(",\n").item().encode()
