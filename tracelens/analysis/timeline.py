"""The timeline's data: GPU tracks (one per rank and stream) binned into screen cells.

A front end asks for the cells of the tracks it shows, for the time window and the width it
has; each cell says how busy the track was in that slice of time (0..1) and which kernel class
took most of it.  Only the visible tracks and window are computed (one polars query), so a job
of millions of events pans and zooms at the speed of its visible slice.  No Textual here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.model.schema import END, KCLASSES
from tracelens.model.summary import kept_steps

GPU_KINDS = ("kernel", "memcpy", "memset")
# an nsys rank's host row: its NVTX ranges (cat "nvtx" or "nvtx:DOMAIN"), on the track key (rank, file, -1, HOST_STREAM)
HOST_STREAM = -2
HOST_KCLASS = "nvtx"
NVTX_ROWS = pl.col("cat").cast(pl.String).str.starts_with("nvtx") & ~pl.col("kind").is_in(GPU_KINDS) & pl.col("dur_ns").is_not_null()


@dataclass(frozen=True)
class Track:
    id: int
    rank: int
    file: int
    device: int
    stream: int  # -1: the union of the rank's streams (the "GPU busy" row); HOST_STREAM: its NVTX ranges

    @property
    def label(self) -> str:
        if self.is_host:
            return f"r{self.rank} NVTX"
        return f"r{self.rank} GPU" if self.stream < 0 else f"r{self.rank} s{self.stream}"

    @property
    def is_union(self) -> bool:
        return self.stream == -1

    @property
    def is_host(self) -> bool:
        """The host row of an nsys rank: its NVTX ranges (every thread's), above its GPU rows."""
        return self.stream == HOST_STREAM


@dataclass(frozen=True)
class Cell:
    busy: float  # share of the cell's time the track was busy, 0..1
    kclass: str  # the class that took most of it


def _binned(events: pl.LazyFrame, t0: int, t1: int, width: int) -> pl.LazyFrame:
    """(track, cell, busy, kclass) of the cells of [t0, t1) split into ``width`` equal cells
    (``width`` > 0, t1 > t0) that any of ``events`` (track, ts, end, kclass) overlaps: the time
    covered in the cell (ns, summed over the events, overlaps counted twice) and the class that
    covered most of it (ties broken by name: the same picture every run)."""
    dt = (t1 - t0) / width
    s = pl.max_horizontal(pl.col("ts"), pl.lit(t0)).cast(pl.Float64)
    e = pl.min_horizontal(pl.col("end"), pl.lit(t1)).cast(pl.Float64)
    return (
        events.filter((pl.col("ts") < t1) & (pl.col("end") > t0))
        .select("track", "kclass", s.alias("s"), e.alias("e"))
        .with_columns(((pl.col("s") - t0) / dt).floor().cast(pl.Int64).clip(0, width - 1).alias("c0"))
        .with_columns((((pl.col("e") - t0) / dt).ceil().cast(pl.Int64) - 1).clip(pl.col("c0"), width - 1).alias("c1"))
        .with_columns(pl.int_ranges(pl.col("c0"), pl.col("c1") + 1).alias("cell"))
        .explode("cell")
        .with_columns((pl.col("cell") * dt + t0).alias("cs"))
        .with_columns(
            (pl.min_horizontal(pl.col("e"), pl.col("cs") + dt) - pl.max_horizontal(pl.col("s"), pl.col("cs"))).clip(0).alias("ov")
        )
        .group_by("track", "cell", "kclass")
        .agg(pl.col("ov").sum())
        .sort(["ov", "kclass"], descending=[True, False])
        .group_by("track", "cell")
        .agg(pl.col("ov").sum().alias("busy"), pl.col("kclass").first())
    )


class Timeline:
    """GPU events of a job, indexed for drawing."""

    def __init__(self, events: pl.DataFrame):
        gpu = events.filter(pl.col("kind").is_in(GPU_KINDS) & pl.col("device").is_not_null() & pl.col("stream").is_not_null())
        # an nsys rank's NVTX ranges (events with a "cat" column): one host row per rank and file, above its GPU rows
        host = events.filter(NVTX_ROWS) if "cat" in events.columns else events.clear()
        streams = gpu.select("rank", "file", "device", "stream").unique()
        # one "GPU" row per rank and device first (stream -1): the union of its streams
        unions = streams.select("rank", "file", "device").unique().with_columns(pl.lit(-1, pl.Int64).alias("stream"))
        hosts = host.select("rank", "file").unique().with_columns(pl.lit(-1, pl.Int64).alias("device"),
                                                                  pl.lit(HOST_STREAM, pl.Int64).alias("stream"))
        keys = (pl.concat([hosts, unions, streams], how="vertical_relaxed")
                .sort("rank", "file", "device", "stream").with_row_index("track"))
        self.tracks: list[Track] = [Track(int(t), int(r), int(f), int(d), int(s)) for t, r, f, d, s in keys.iter_rows()]
        per_stream = gpu.join(keys, on=["rank", "file", "device", "stream"], how="inner").select(
            pl.col("track").cast(pl.Int32),
            pl.col("ts_ns").alias("ts"),
            END.alias("end"),
            pl.col("kclass").cast(pl.String).fill_null("other"),
            pl.col("name").cast(pl.String),
            "dur_ns",
        )
        union_keys = keys.filter(pl.col("stream") == -1).select("track", "rank", "file", "device")
        busy = iv.merged(gpu.select("rank", "file", "device", pl.col("ts_ns").alias("ts"), END.alias("end")),
                         "ts", "end", by=("rank", "file", "device"), keep_empty=True)
        merged = (
            busy.join(union_keys, on=["rank", "file", "device"])
            .select(
                pl.col("track").cast(pl.Int32), "ts", "end", pl.lit("busy").alias("kclass"), pl.lit("GPU busy").alias("name"),
                (pl.col("end") - pl.col("ts")).alias("dur_ns"),
            )
        )
        parts = [merged, per_stream]
        if host.height:  # each range as it is (nested ones overlap: a cell's height is clipped at full)
            parts.append(host.join(keys.filter(pl.col("stream") == HOST_STREAM).select("rank", "file", "track"),
                                   on=["rank", "file"]).select(
                pl.col("track").cast(pl.Int32), pl.col("ts_ns").alias("ts"), END.alias("end"),
                pl.lit(HOST_KCLASS).alias("kclass"), pl.col("name").cast(pl.String), "dur_ns"))
        self.events = pl.concat(parts).sort("track", "ts")
        self.n_events = self.events.height
        # the whole-trace window: the GPU's activity (as without the host rows), else the ranges'
        span = self.events.filter(pl.col("kclass") != HOST_KCLASS) if host.height else self.events
        if not span.height:
            span = self.events
        if self.n_events:
            self.start = int(span.get_column("ts").min())
            self.end = int(span.get_column("end").max())
        else:
            self.start = self.end = 0

    def busy_ns(self, track: int, t0: int, t1: int) -> int:
        """Busy time of a track inside [t0, t1) (exact for the union rows)."""
        q = self.events.filter((pl.col("track") == track) & (pl.col("ts") < t1) & (pl.col("end") > t0))
        return int(q.select((pl.min_horizontal("end", pl.lit(t1)) - pl.max_horizontal("ts", pl.lit(t0))).sum()).item() or 0)

    def longest(self, name: str) -> dict[str, Any] | None:
        """The longest instance of the kernel ``name`` (on a stream track): track, ts, end, dur_ns."""
        q = self.events.filter((pl.col("name") == name) & (pl.col("kclass") != HOST_KCLASS))
        if q.height == 0:
            from tracelens.model.printable import REPLACEMENT, printable

            if REPLACEMENT not in name:
                return None
            # the TUI shows the report's names made printable (views.printable): match those
            raw = [n for n in self.events.get_column("name").unique().to_list() if n is not None and printable(n) == name]
            q = self.events.filter(pl.col("name").is_in(raw) & (pl.col("kclass") != HOST_KCLASS))
            if q.height == 0:
                return None
        return q.sort("dur_ns", descending=True).row(0, named=True)

    def cells(self, tracks: list[int], t0: int, t1: int, width: int) -> dict[int, dict[int, Cell]]:
        """For each track id: {cell index: Cell} for the cells with any activity in [t0, t1)
        split into ``width`` equal cells (cells without an entry are idle)."""
        if width <= 0 or t1 <= t0 or not tracks:
            return {}
        q = _binned(self.events.lazy().filter(pl.col("track").is_in(tracks)), t0, t1, width)
        out: dict[int, dict[int, Cell]] = {t: {} for t in tracks}
        dt = (t1 - t0) / width
        for track, cell, busy, kclass in q.collect(engine="in-memory").iter_rows():
            out[track][cell] = Cell(min(1.0, busy / dt), kclass)
        return out

    def event_at(self, track: int, t: int, slack: int = 0) -> dict[str, Any] | None:
        """The event on ``track`` running at time ``t`` (or the nearest within ``slack`` ns)."""
        q = self.events.filter((pl.col("track") == track) & (pl.col("ts") <= t + slack) & (pl.col("end") >= t - slack))
        if q.height == 0:
            return None
        q = q.with_columns(
            pl.when((pl.col("ts") <= t) & (pl.col("end") >= t)).then(0).otherwise(
                pl.min_horizontal((pl.col("ts") - t).abs(), (pl.col("end") - t).abs())
            ).alias("_d")
        )
        # on a host row the innermost of nested ranges (the shortest); a GPU row's events do not nest
        q = q.sort("_d", "dur_ns", "ts") if self._is_host(track) else q.sort("_d", "ts")
        return q.row(0, named=True)

    def _is_host(self, track: int) -> bool:
        return 0 <= track < len(self.tracks) and self.tracks[track].is_host


TRACK_COLUMNS = ("rank", "file", "kind", "device", "stream", "ts_ns", "dur_ns", "kclass", "name")


class JobTimeline:
    """The timeline of a loaded job (``tracelens.store.job.Job``), read one rank at a time: a
    file's GPU rows are read when one of its tracks is drawn or searched, and the last ``keep``
    files read are kept (the first ``keep`` are read at once: they are drawn first), so the
    memory held is that of the ranks on screen; the other files' tracks and time spans come from
    a scan of seven columns of their GPU rows.  Same answers as ``Timeline`` over every file's
    events (track ids are global, in the same order)."""

    def __init__(self, job, keep: int = 16):
        self.job = job
        self.keep = max(1, keep)
        self._parts: dict[int, Timeline] = {}  # file -> its timeline, least recently used first
        gpu = pl.col("kind").is_in(GPU_KINDS) & pl.col("device").is_not_null() & pl.col("stream").is_not_null()
        heads = []  # (file, its tracks' keys, lo, hi, GPU rows)
        for fi in range(len(job.handles)):
            if fi < self.keep:  # the first files are read whole (their GPU rows): likely the first drawn
                part = self._read(fi)
                keys = [(t.rank, t.file, t.device, t.stream) for t in part.tracks]
                n = part.events.filter(~pl.col("kclass").is_in(["busy", HOST_KCLASS])).height if part.n_events else 0
                heads.append((fi, keys, part.start, part.end, n))
                self._parts[fi] = part
                continue
            q = job.events(file=fi, columns=["rank", "file", "kind", "device", "stream", "ts_ns", "dur_ns"]).filter(gpu)
            streams, span = pl.collect_all([
                q.select("rank", "file", "device", "stream").unique(),
                q.select(pl.col("ts_ns").min().alias("lo"), END.max().alias("hi"), pl.len()),
            ])
            unions = streams.select("rank", "file", "device").unique().with_columns(pl.lit(-1, pl.Int64).alias("stream"))
            keys = list(pl.concat([unions, streams]).sort("rank", "file", "device", "stream").iter_rows()) if streams.height else []
            if self._has_host(fi) and job.events(file=fi, columns=["kind", "cat", "dur_ns"]).filter(NVTX_ROWS).head(1).collect().height:
                keys.insert(0, (job.handles[fi].meta.rank, fi, -1, HOST_STREAM))  # its host row, first (Timeline's order)
            heads.append((fi, keys, *span.row(0)))
        # tracks in Timeline's order: by rank, then file (a file's tracks are contiguous)
        self.tracks: list[Track] = []
        self._first: dict[int, int] = {}  # file -> its first track id
        for fi, keys, *_ in sorted(heads, key=lambda h: (job.handles[h[0]].meta.rank, h[0])):
            base = self._first[fi] = len(self.tracks)
            self.tracks += [Track(base + i, int(r), int(f), int(d), int(st)) for i, (r, f, d, st) in enumerate(keys)]
        spans = [(lo, hi) for _, _, lo, hi, n in heads if n]
        if not spans:  # no GPU rows at all (a CPU-only nsys capture): the host rows' span
            spans = [(p.start, p.end) for p in self._parts.values() if p.n_events]
        self.start = min((lo for lo, _ in spans), default=0)
        self.end = max((hi for _, hi in spans), default=0)
        self.n_events = sum(h[4] for h in heads)  # GPU rows

    def _has_host(self, fi: int) -> bool:
        """Whether file ``fi``'s NVTX ranges make a host row: an nsys export's (a Kineto trace's
        annotations are the framework's own, not drawn)."""
        return self.job.handles[fi].meta.format == "nsys"

    def _read(self, fi: int) -> Timeline:
        if self._has_host(fi):
            q = self.job.events(file=fi, columns=[*TRACK_COLUMNS, "cat"])
            return Timeline(q.filter(pl.col("kind").is_in(GPU_KINDS) | NVTX_ROWS).collect())
        return Timeline(self.job.events(file=fi, columns=TRACK_COLUMNS).filter(pl.col("kind").is_in(GPU_KINDS)).collect())

    def _part(self, fi: int) -> Timeline:
        part = self._parts.pop(fi, None)
        if part is None:
            part = self._read(fi)
            while len(self._parts) >= self.keep:
                self._parts.pop(next(iter(self._parts)))
        self._parts[fi] = part
        return part

    def _local(self, track: int) -> tuple[Timeline, int]:
        fi = self.tracks[track].file
        return self._part(fi), track - self._first[fi]

    def _global(self, fi: int, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is not None:
            row = {**row, "track": row["track"] + self._first[fi]}
        return row

    def busy_ns(self, track: int, t0: int, t1: int) -> int:
        part, local = self._local(track)
        return part.busy_ns(local, t0, t1)

    def event_at(self, track: int, t: int, slack: int = 0) -> dict[str, Any] | None:
        part, local = self._local(track)
        return self._global(self.tracks[track].file, part.event_at(local, t, slack))

    def cells(self, tracks: list[int], t0: int, t1: int, width: int) -> dict[int, dict[int, Cell]]:
        out: dict[int, dict[int, Cell]] = {}
        by_file: dict[int, list[int]] = {}
        for t in tracks:
            by_file.setdefault(self.tracks[t].file, []).append(t)
        for fi, ts in by_file.items():
            base = self._first[fi]
            got = self._part(fi).cells([t - base for t in ts], t0, t1, width)
            out.update({t + base: cells for t, cells in got.items()})
        return {t: out.get(t, {}) for t in tracks} if width > 0 and t1 > t0 and tracks else {}

    def longest(self, name: str) -> dict[str, Any] | None:
        """The longest instance of the kernel ``name`` over every file (the first file on a tie)."""
        best = None
        for fi in sorted(self._first, key=self._first.get):
            got = self._global(fi, self._part(fi).longest(name))
            if got is not None and (best is None or got["dur_ns"] > best["dur_ns"]):
                best = got
        return best


def pick_strip_step(ranks) -> tuple[int, list[int], dict[int, Any]] | None:
    """Which kept step the report's timeline shows (the same position on every rank: the one
    whose slowest rank is slowest) and of which files (by rank): (position, files, file -> its
    kept steps); None when no rank has GPU steps.  Reads only the ranks' results."""
    kept = {r.file: kept_steps(r.steps) for r in ranks if r.gpu is not None}
    kept = {f: v for f, v in kept.items() if v}
    if not kept:
        return None
    n = min(min(len(v) for v in kept.values()), STRIP_STEPS_MAX)  # the positions rank_strips binned
    idx = max(range(n), key=lambda i: max(v[i].dur_ns for v in kept.values()))
    rank_of = {r.file: r.rank for r in ranks}
    files = sorted(kept, key=lambda f: rank_of[f])
    return idx, files, kept


STRIP_BINS = 240  # cells across the step of the report's timeline picture
STRIP_STEPS_MAX = 64  # kept steps per rank binned for it (the picture shows one position among them)
# small types: a rank's strips of ten steps are ~30 KB, kept for every rank until the reduce
STRIP_SCHEMA = {"pos": pl.UInt16, "track": pl.UInt8, "cell": pl.UInt16, "pct": pl.UInt8, "kclass": pl.Enum(KCLASSES)}


def rank_strips(events: pl.DataFrame, steps, bins: int = STRIP_BINS) -> pl.DataFrame:
    """One rank's part of the report's timeline picture (``step_strips``), computed in the
    per-rank map so that the job reduce reads no events: for each of its first
    ``STRIP_STEPS_MAX`` kept steps (``pos``: the position among them), the cells of its GPU rows
    binned into ``bins`` over the step, two tracks (0: compute, everything but communication;
    1: communication), each cell's busy percent (1..100: max(1, round(100 x busy share))) and the
    class that took most of it.  Each step is ``Timeline.cells``' query over its window (one
    batch for all steps): the same floats to the bit."""
    assert bins <= 65535  # cells as UInt16
    kept = kept_steps(steps)[:STRIP_STEPS_MAX]
    lo = min((s.start_ns for s in kept), default=0)
    hi = max((s.end_ns for s in kept), default=0)
    gpu_all = (  # the rank's GPU rows in the kept steps, narrow, once (each step's query filters these)
        events.lazy().filter(pl.col("kind").is_in(GPU_KINDS) & (pl.col("ts_ns") < hi) & (END > lo))
        .select((pl.col("kclass") == "comm").fill_null(False).cast(pl.Int32).alias("track"), pl.col("ts_ns").alias("ts"),
                END.alias("end"), pl.col("kclass").cast(pl.String).fill_null("other"))
        .collect(engine="in-memory").lazy()
    )
    queries, dts = [], []
    for pos, step in enumerate(kept):
        if step.end_ns <= step.start_ns:
            continue
        gpu = gpu_all.filter((pl.col("ts") < step.end_ns) & (pl.col("end") > step.start_ns)).sort("track", "ts")  # Timeline's order
        queries.append(_binned(gpu, step.start_ns, step.end_ns, bins).with_columns(pl.lit(pos, pl.UInt16).alias("pos")))
        dts.append((pos, (step.end_ns - step.start_ns) / bins))
    if not queries:
        return pl.DataFrame(schema=STRIP_SCHEMA)
    cells = pl.concat(pl.collect_all(queries, engine="in-memory"))
    # busy / dt as a division of two columns: polars computes a division by a literal as a product
    # with its reciprocal, a different last bit from Python's (and so, at a half, another percent)
    dt = pl.col("pos").replace_strict(dict(dts), return_dtype=pl.Float64)
    share = pl.min_horizontal(pl.col("busy") / dt, pl.lit(1.0))
    return cells.select(
        "pos", "track", "cell", pl.max_horizontal(pl.lit(1.0), (100 * share).round(0)).alias("pct"),
        pl.col("kclass").cast(pl.Enum(KCLASSES), strict=False).fill_null("other"),
    ).cast(STRIP_SCHEMA).sort("pos", "track", "cell")


def step_strips(ranks, strips: dict[int, pl.DataFrame], bins: int = STRIP_BINS, max_ranks: int = 64) -> dict[str, Any] | None:
    """A compact picture of one step per rank for the reports: the kept step (same position on
    every rank) whose slowest rank is slowest, binned into ``bins`` cells of two rows per rank,
    compute (everything but communication) and communication.  Each cell: how busy the row was
    (0..100, percent) and the index of the class that took most of it (-1: idle).

    ``strips``: file -> its ``rank_strips`` (computed by the per-rank map); only those of the
    step shown, of at most ``max_ranks`` files, are read."""
    got = pick_strip_step(ranks)
    if got is None:
        return None
    idx, files, kept = got
    picked = []
    for f in files[:max_ranks]:
        step = kept[f][idx]
        rank = next(r.rank for r in ranks if r.file == f)
        cells = strips.get(f)
        mine = cells.filter(pl.col("pos") == idx) if cells is not None and step.end_ns > step.start_ns else None
        picked.append((f, rank, step, mine))
    classes = sorted({c for *_, mine in picked if mine is not None for c in mine.get_column("kclass").cast(pl.String).unique().to_list()})
    index = {c: i for i, c in enumerate(classes)}
    out_ranks = []
    for f, rank, step, mine in picked:
        rows = [([0] * bins, [-1] * bins), ([0] * bins, [-1] * bins)]
        if mine is not None:
            for track, cell, pct, kclass in mine.select("track", "cell", "pct", pl.col("kclass").cast(pl.String)).iter_rows():  # <= 2 x bins cells
                rows[track][0][cell] = pct
                rows[track][1][cell] = index[kclass]
        out_ranks.append({"rank": rank, "file": f, "step": step.step, "name": step.name, "start_ns": step.start_ns,
                          "dur_ns": step.dur_ns, "rows": [{"label": label, "busy": busy, "kclass": cls}
                                                          for label, (busy, cls) in zip(("compute", "communication"), rows)]})
    return {"bins": bins, "classes": classes, "ranks": out_ranks, "ranks_total": len(kept),
            "note": None if len(kept) <= max_ranks else f"the first {max_ranks} of {len(kept)} ranks"}
