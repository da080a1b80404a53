"""Load a job: find its trace files, give every file a rank, and keep one handle per file (its
cached Parquet events, or its frame in memory when the cache is off); never one table of all
ranks' events.

Cache hits are checked and read here, in the calling process; only the files that must be
parsed go to an engine (``tracelens.engine``: this process, or worker processes when the bytes
to parse are worth their start-up).  A worker parses, writes the cache entry and returns the
small TraceMeta, and the frame only when the cache could not take it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from tracelens.engine import PARALLEL_MIN_BYTES, LocalEngine, choose  # noqa: F401 (PARALLEL_MIN_BYTES re-exported)
from tracelens.model.errors import NotATrace, TraceInputError, UnreadableError, UnsupportedFormat
from tracelens.model.schema import END, TraceMeta, empty_frame
from tracelens.store.discover import discover
from tracelens.store.ranks import _assign_ranks, _shared_ranks, rank_from_name

_SAME_RUN_GAP_NS = 60 * 10**9  # ranks of one job are traced together: spans further apart than this are separate runs


@dataclass(eq=False)
class RankHandle:
    """One input file of a job: where its events are (the cache entry's Parquet file, or the
    frame in memory when the cache is off or could not take it) and its TraceMeta.  Its events
    are read when asked for (``scan``), with this job's file index and rank."""

    file: int
    meta: TraceMeta
    parquet: Path | None = None
    frame: pl.DataFrame | None = None
    keep_python: bool = False
    # one rank of a file that holds several (an nsys export of several processes or GPUs): its
    # parser's part (the entry of its listing, or its index there); None for a file that is one rank
    part: Any = None
    # what ``load``'s ``after_parse`` made of the events right after their parse (in the worker
    # that parsed them): the analysis's summary of this rank, keyed by what it was made with
    summary: Any = field(default=None, repr=False)
    _facts: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def path(self) -> str:
        return self.meta.path

    def scan(self) -> pl.LazyFrame:
        if self.frame is None and self.parquet is None:  # neither kept nor cached (load's keep_events=False)
            raise OSError(f"{self.path}: its events were not kept")
        src = self.frame.lazy() if self.frame is not None else pl.scan_parquet(self.parquet)
        return with_file(src, self.file, self.meta.rank)

    def read(self, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """This file's events (``columns`` of them), in memory.  A cache entry removed since the
        load (another run found it damaged) is parsed again from the trace."""
        try:
            q = self.scan()
            return (q.select(columns) if columns is not None else q).collect()
        except (OSError, pl.exceptions.PolarsError):
            if self.frame is not None:
                raise
        df, _ = parse_file(self.path, use_cache=False, keep_python=self.keep_python, part=self.part)
        df = with_file(df, self.file, self.meta.rank)
        return df.select(columns) if columns is not None else df

    def span(self) -> tuple[int | None, int | None]:
        """(first start, last end) of this file's events."""
        if "span" not in self._facts:
            lo, hi = self.read_lazy(pl.col("ts_ns").min().alias("lo"), END.max().alias("hi")).row(0)
            self._facts["span"] = (lo, hi)
        return self._facts["span"]

    def pids(self) -> list[int]:
        """The host process ids of this file's events."""
        if "pids" not in self._facts:
            self._facts["pids"] = self.read_lazy(pl.col("pid").drop_nulls().unique()).get_column("pid").to_list()
        return self._facts["pids"]

    def read_lazy(self, *exprs: pl.Expr) -> pl.DataFrame:
        """``exprs`` over this file's events, computed from a scan (only their columns are read)."""
        try:
            return self.scan().select(*exprs).collect()
        except (OSError, pl.exceptions.PolarsError):
            if self.frame is not None:
                raise
            return self.read().select(*exprs)


def with_file(events, file: int, rank: int | None):
    """A file's events (a DataFrame or LazyFrame) with this job's file index and rank."""
    return events.with_columns(pl.lit(file, pl.Int32).alias("file"), pl.lit(rank, pl.Int32).alias("rank"))


def span_and_pids(df: pl.DataFrame) -> tuple[int | None, int | None, tuple[int, ...]]:
    """(first start, last end, sorted host pids) of a file's events: what the load asks of every
    file (``RankHandle.span``/``pids``) and a rank's summary keeps."""
    lo, hi = df.select(pl.col("ts_ns").min().alias("lo"), END.max().alias("hi")).row(0)
    return lo, hi, tuple(df.get_column("pid").drop_nulls().unique().sort().to_list())


def _facts_of(df: pl.DataFrame) -> dict[str, Any]:
    """``RankHandle``'s facts of a file, from its parsed frame (no read of its cache entry later)."""
    lo, hi, pids = span_and_pids(df)
    return {"span": (lo, hi), "pids": list(pids)}


@dataclass
class Job:
    """A loaded job: one handle per input file, in file order, and what the load said.  The
    events stay where the handles keep them; ``events()`` scans them lazily."""

    handles: list[RankHandle]
    warnings: list[str] = field(default_factory=list)
    separate_runs: str | None = None  # why the files look like separate runs rather than one job (also a warning)
    # the warnings about the parse cache (a corrupt entry, a cache that cannot be used): true of this run, not of the job
    cache_warnings: list[str] = field(default_factory=list)
    options: Any = None  # the analysis options given to tracelens.open_job: analyze()'s default there

    @property
    def metas(self) -> list[TraceMeta]:
        return [h.meta for h in self.handles]

    @property
    def files(self) -> list[str]:
        return [h.path for h in self.handles]

    @property
    def all_warnings(self) -> list[str]:
        """Job-level warnings, then every file's own, each naming its file (and part)."""
        return self.warnings + [f"{input_label(m)}: {w}" for m in self.metas for w in m.warnings]

    @property
    def ranks(self) -> list[int]:
        return sorted({m.rank for m in self.metas if m.rank is not None})

    def events(self, rank: int | None = None, *, file: int | None = None, window: tuple[int, int] | None = None,
               columns: Sequence[str] | None = None) -> pl.LazyFrame:
        """A lazy scan of the events of one file (``file``: its index), or of every file of
        ``rank`` (two files may claim one), or, with neither, of every file (a lazy union: for a
        notebook's query; the analysis reads one file at a time).  ``window=(t0, t1)``: only the
        events that overlap [t0, t1) (instants at t0 included), on that file's own clock."""
        if file is not None:
            chosen = [self.handles[file]]
        elif rank is not None:
            chosen = [h for h in self.handles if h.meta.rank == rank]
        else:
            chosen = list(self.handles)
        frames = [h.scan() for h in chosen] or [empty_frame().lazy()]
        q = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")
        if window is not None:
            t0, t1 = window
            q = q.filter((pl.col("ts_ns") < t1) & ((pl.col("ts_ns") + pl.col("dur_ns").fill_null(0) > t0) | (pl.col("ts_ns") == t0)))
        return q.select(columns) if columns is not None else q

    @property
    def n_events(self) -> int:
        """Events in all files (from the Parquet files' metadata: no events are read)."""
        return sum(h.read_lazy(pl.len()).item() for h in self.handles)

    def frame(self, file: int, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The events of one file, in memory."""
        return self.handles[file].read(columns)


def input_label(meta: TraceMeta) -> str:
    """The file a rank came from, and which part of it when the file holds several ranks."""
    part = meta.attributes.get("nsys_part")
    if isinstance(part, dict) and (part.get("of") or 0) > 1:
        return f"{meta.path} [pid {part.get('pid')}, device {part.get('device')}]"
    return meta.path


def _part_index(part: Any) -> int | None:
    """The index of a parser's part (an entry of its listing, or the index itself)."""
    if part is None:
        return None
    return part if isinstance(part, int) else int(part["index"])


def _parser_for(path: Path):
    """(format, parser) of a trace file (the parsers' registry); UnsupportedFormat when tracelens
    cannot analyse it (an nsys SQLite export: recognised, ``tracelens info`` reads its GPUs)."""
    from tracelens.parsers import parser_for, sniff

    fmt = sniff(path)
    return fmt, parser_for(fmt, path)


def _lookup(path: Path, keep_python: bool, notes: list[tuple[str, str]], read: bool = False,
            part: Any = None) -> tuple[str | None, tuple[Any, TraceMeta] | None]:
    """(cache key, (Parquet path, meta) of its entry or None) for a trace file (with ``read``,
    (frame, meta)); the key is None when the cache cannot be used for it (said in ``notes``).
    ``part``: one rank of a file that holds several (its key ends in ``-p<index>``)."""
    from tracelens.store import cache

    fmt, parser = _parser_for(path)
    damaged: list[str] = []
    try:
        h = cache.file_hash(path, damaged=damaged)
    except OSError:  # the trace itself could not be read: its parse says why
        h = None
    for why in damaged:
        notes.append(("corrupt", f"{path}: the cache's stat index entry for this file was damaged ({why}); "
                                 "it was removed and the file hashed again"))
    if h is None:
        return None, None
    key = f"{h}-{fmt}-{parser.PARSER_VERSION}{'-py' if keep_python else ''}"
    if part is not None:
        key += f"-p{_part_index(part)}"
    return key, _get(key, path, notes, read)


def _get(key: str, path: Path, notes: list[tuple[str, str]], read: bool = False) -> tuple[Any, TraceMeta] | None:
    """The cache entry stored under ``key`` for ``path`` (None: none, or it was corrupt and removed,
    or the cache cannot be read: said in ``notes``)."""
    from tracelens.store import cache

    try:
        hit = cache.get(key) if read else cache.lookup(key)
    except cache.CorruptEntry as e:
        notes.append(("corrupt", f"{path}: the cache entry for this file was corrupt ({e}); "
                                 "it was removed and the file re-parsed"))
        hit = None
    except OSError as e:
        notes.append(("cache", _cache_off(e)))
        return None
    if hit is not None:
        hit[1].path = str(path)
    return hit


def _split(path: Path, parser: Any, key: str | None, notes: list[tuple[str, str]]) -> list[tuple[Any, str | None, Any]] | None:
    """The ranks of a file that holds several (a parser with ``parts``, an nsys export of several
    GPU processes or devices): (part, its cache key, its cache entry or None) each; None for a
    file that is one rank.  Parts all in the cache are known from their entries (no query of the
    file); otherwise the parser lists them (its error, if any, is its parse's to say)."""
    lister = getattr(parser, "parts", None)
    if lister is None:
        return None
    if key is not None:
        first = _get(f"{key}-p0", path, notes)
        of = (first[1].attributes.get("nsys_part") or {}).get("of") if first is not None else None
        if isinstance(of, int) and of > 1:
            hits = [first] + [_get(f"{key}-p{k}", path, notes) for k in range(1, of)]
            if all(h is not None for h in hits):
                return [(k, f"{key}-p{k}", h) for k, h in enumerate(hits)]
    try:
        listed = lister(path)
    except TraceInputError:
        return None
    if len(listed) <= 1:
        return None
    return [(part, None if key is None else f"{key}-p{k}",
             None if key is None else _get(f"{key}-p{k}", path, notes)) for k, part in enumerate(listed)]


def _parse(path: Path, key: str | None, keep_python: bool, progress: Callable[[int], None] | None,
           notes: list[tuple[str, str]], part: Any = None) -> tuple[pl.DataFrame, TraceMeta, bool]:
    """Parse a trace file (or one ``part`` of it) and, with a ``key``, store it in the cache:
    (frame, meta, stored)."""
    _, parser = _parser_for(path)
    more = {} if part is None else {"part": part}
    df, meta = parser.parse(path, keep_python=keep_python, progress=progress, **more)
    stored = False
    if key is not None:
        from tracelens.store import cache

        meta.content_hash = key.split("-", 1)[0]
        if not meta.truncated:  # a partial parse is never cached
            try:
                cache.put(key, df, meta)
                stored = True
            except OSError as e:
                notes.append(("cache", _cache_off(e)))
    return df, meta, stored


def parse_file(path: str | Path, *, use_cache: bool = True, keep_python: bool = False,
               progress: Callable[[int], None] | None = None,
               notes: list[tuple[str, str]] | None = None, part: Any = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Parse one file (``part``: one rank of a file that holds several, as its parser lists
    them) through the cache (sniffing its format); ``progress(bytes)``: how far into
    the file (on disk) the parser is.  What the job's warnings should say about the cache is
    appended to ``notes`` as (kind, text): "cache" when the cache cannot be used (the parse
    goes on without it), "corrupt" when this file's entry failed its checks and was re-parsed."""
    path = Path(path)
    notes = [] if notes is None else notes
    key = None
    if use_cache:
        key, hit = _lookup(path, keep_python, notes, read=True, part=part)
        if hit is not None:
            return hit
    df, meta, _ = _parse(path, key, keep_python, progress, notes, part)
    return df, meta


def _cache_off(e: OSError) -> str:
    from tracelens.store.cache import cache_dir

    return f"the parse cache in {cache_dir()} cannot be used ({e.strerror or e}); running without it"


def _parse_task(args: tuple) -> tuple[TraceMeta, pl.DataFrame | None, list[tuple[str, str]], bool, tuple[Any, dict[str, Any]]]:
    """One file to parse (in a worker or here): its meta, its frame when the cache did not take
    it or ``keep_frame`` (None: it is in the cache under its key, or not kept), what the parse
    said about the cache, whether the cache took it, and (``after_parse(frame, file, meta,
    several)`` when one is given: the rank's analysis, run where its events already are; the
    file's span and pids, for the load's own questions)."""
    path, key, keep_python, progress, keep_frame, after_parse, keep_events, i, several, part, guess = args
    notes: list[tuple[str, str]] = []
    df, meta, stored = _parse(Path(path), key, keep_python, progress, notes, part)
    facts = _facts_of(df)
    made = None
    if after_parse is not None:
        # the rank as far as this file says it (distributedInfo, else its name: ranks._assign_ranks'
        # first rule; a part of a file: its order there when the file is the job's only one); one
        # given by the order of several files is known only after the load
        if meta.rank is not None or part is not None:
            rank = meta.rank if meta.rank is not None else guess
        else:
            rank = rank_from_name(Path(path), facts["pids"])
        if rank is None and not several:  # a lone file is rank 0 by the order rule
            rank = 0
        made = after_parse(with_file(df, i, rank), i, replace(meta, rank=rank), several)
    # not in the cache: kept, unless the analysis is done with it and nobody asked for the events
    keep = keep_frame or (not stored and (after_parse is None or keep_events))
    return meta, (df if keep else None), notes, stored, (made, facts)


def load(
    paths: Iterable[str | Path],
    *,
    use_cache: bool = True,
    keep_python: bool = False,
    jobs: int | None = None,
    progress: Callable[[int, int, TraceMeta], None] | None = None,
    bytes_progress: Callable[[int, int], None] | None = None,
    strict: bool = False,
    after_parse: Callable[[pl.DataFrame, int, TraceMeta, bool], Any] | None = None,
    keep_events: bool = True,
    prefer: str | None = None,
) -> Job:
    """Load trace files and directories of them into a Job.  ``progress(done, total, meta)``
    after each file; ``bytes_progress(done, total)`` in bytes on disk as the files are read (within
    a file too, when parsing in this process).

    ``after_parse(frame, file, meta, several)`` (picklable; ``several``: the job has more than one
    file): run on each file parsed, right after its parse and where it ran (a worker: only its small result comes back), kept as its handle's
    ``summary``: the analysis's per-rank map, so that ranks are analysed as their files stream in
    instead of being read back from the cache.  With it and ``keep_events=False``, a frame the
    cache could not take is not kept either (a later ``read`` parses the file again).

    Raises TraceInputError (naming the file) when an input cannot be used.  Files found by
    walking a directory that are JSON but not traces, or (unless ``strict``) cannot be read,
    are skipped with a warning.  A cache that cannot be used is one warning; the job loads
    without it.

    A job may hold a Kineto trace and an nsys export of the same rank (one run recorded by
    both): a rank's events come from one source, the richer Kineto trace (op shapes, FLOPs)
    or the format ``prefer`` names ("kineto", "nsys"); the other file is left out with a
    warning naming both.
    """
    paths = list(paths)
    files, from_dirs, warnings = discover(paths, strict=strict)
    skipped: list[str] = []  # why each file found in a directory was left out
    if not files:
        raise TraceInputError(".", "no input files")
    handles: dict[int, RankHandle] = {}  # by item: a file, or one rank of a file that holds several
    notes: dict[int, list[tuple[str, str]]] = {}  # file -> what its lookup and parse said about the cache
    if use_cache:
        from tracelens.store import cache

        cache.sweep()
    sizes = [_size(f) for f in files]
    total = sum(sizes)
    done = [0]  # bytes of the files recorded

    def record(i: int, j: int | None, handle: RankHandle | None, err: BaseException | None, share: int = 1) -> None:
        """File ``i``'s item ``j`` (None: the whole file, before it is split) loaded, or what went wrong."""
        if err is not None:
            if not isinstance(err, TraceInputError):
                raise err
            skip = (
                isinstance(err, (UnsupportedFormat, NotATrace))
                or err.problem.startswith("not a trace")
                or (isinstance(err, UnreadableError) and not strict)
            )
            if files[i] in from_dirs and skip:
                said = f"{err.path}: skipped ({err.problem})"
                if said not in warnings:  # once for a file, however many of its parts met it
                    warnings.append(said)
                    skipped.append(said)
                return
            raise err
        assert handle is not None and j is not None
        handles[j] = handle
        done[0] += share
        if progress is not None:
            progress(len(handles), len(plan), handle.meta)
        if bytes_progress is not None:
            bytes_progress(done[0], total)

    # the job's items: each file, or each rank of a file that holds several (an nsys export of
    # several GPU processes or devices), with its cache key and entry; cache hits are read here,
    # what must be parsed goes to the engine
    plan: list[tuple[int, Any, str | None, Any]] = []  # (file, part or None, cache key, cache entry)
    for i, f in enumerate(files):
        got = notes[i] = []
        cache_off = any(k == "cache" for n in notes.values() for k, _ in n)  # once it failed, the rest go without
        try:
            _, parser = _parser_for(f)
            key, hit = (None, None) if not use_cache or cache_off else _lookup(f, keep_python, got)
        except TraceInputError as e:
            record(i, None, None, e)
            continue
        split = None if hit is not None else _split(f, parser, key, got)
        if split is None:
            plan.append((i, None, key, hit))
        else:
            plan.extend((i, part, k, h) for part, k, h in split)
    per_file = Counter(i for i, *_ in plan)  # items per file

    def share(j: int) -> int:  # the bytes of a file, spread over its parts
        i = plan[j][0]
        return sizes[i] // per_file[i] + (sizes[i] % per_file[i] if plan[j][1] is not None and
                                           _part_index(plan[j][1]) == per_file[i] - 1 else 0)

    todo: list[int] = []
    for j, (i, part, key, hit) in enumerate(plan):
        if hit is not None:
            record(i, j, RankHandle(j, hit[1], parquet=hit[0], keep_python=keep_python, part=part), None, share(j))
        else:
            todo.append(j)
    engine = choose(jobs, sum(share(j) for j in todo), len(todo))
    local = isinstance(engine, LocalEngine)  # in this process: the parse can say how far into its file it is

    def inner(j: int) -> Callable[[int], None] | None:
        if bytes_progress is None or not local:
            return None
        return lambda n: bytes_progress(done[0] + n * share(j) // max(sizes[plan[j][0]], 1), total)

    # one file parsed here: its frame stays with its handle (also cached), so that the analysis does
    # not read back what was just written; with more, each rank's events wait in the cache
    keep_frame = local and len(todo) == 1 and (after_parse is None or keep_events)
    several = len(plan) > 1
    lone = len(files) == 1  # a part's rank is its order in the file when the file is the job's only one
    work = [(str(files[plan[j][0]]), plan[j][2], keep_python, inner(j), keep_frame, after_parse, keep_events, j, several,
             plan[j][1], _part_index(plan[j][1]) if lone else None) for j in todo]
    for t, res in engine.map(_parse_task, work):
        j = todo[t]
        i, part, key, _ = plan[j]
        if isinstance(res, BaseException):
            record(i, j, None, res)
            continue
        meta, df, got, stored, (made, facts) = res
        notes[i].extend(got)
        from tracelens.store import cache

        cached = cache.parquet_path(key) if stored and key is not None else None
        # df None: in the cache (read from there when asked for), or not kept (parsed again if asked for)
        record(i, j, RankHandle(j, meta, parquet=cached, frame=df, keep_python=keep_python, part=part, summary=made,
                                _facts=facts), None, share(j))
    said = list(dict.fromkeys(n for i in sorted(notes) for n in notes[i]))
    cache_warnings = [text for kind, text in said if kind == "corrupt"]
    cache_warnings += next(([text] for kind, text in said if kind == "cache"), [])  # one, however many files met it
    warnings.extend(cache_warnings)
    if not handles:
        # the inputs as given (the first file's folder once named a subfolder of the input), and why
        # the files found were skipped (the error is the one line a command prints)
        where = ", ".join(map(str, paths[:3])) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
        why = f": {len(files)} file(s) found, each skipped (the first: {skipped[0]})" if skipped else ""
        raise TraceInputError(where, f"no traces among the inputs{why}")
    order = sorted(handles)
    kept = [handles[i] for i in order]
    for fi, h in enumerate(kept):
        h.file = fi
    metas = [h.meta for h in kept]
    _assign_ranks([files[plan[j][0]] for j in order], metas, warnings, lambda fi: kept[fi].pids())
    kept = _one_source_per_rank(kept, prefer, warnings)
    for fi, h in enumerate(kept):
        h.file = fi
    metas = [h.meta for h in kept]
    _shared_ranks(metas, warnings)
    separate = _separate_runs(metas, [h.span for h in kept])
    if separate:
        warnings.append(separate)
    return Job(handles=kept, warnings=warnings, separate_runs=separate, cache_warnings=cache_warnings)


SOURCES = ("kineto", "nsys")  # the formats one rank may be recorded in; the first is the richer (op shapes, FLOPs)


def _one_source_per_rank(handles: list[RankHandle], prefer: str | None, warnings: list[str]) -> list[RankHandle]:
    """The handles with one format per rank: where a rank has files of several formats (a
    Kineto trace and an nsys export of one run), those of ``prefer`` (else the richer Kineto)
    are kept and each other file is left out with a warning naming both."""
    if prefer is not None and prefer not in SOURCES:
        from tracelens.model.errors import UsageError

        raise UsageError(f"prefer {prefer!r}: give one of {', '.join(SOURCES)}")
    formats: dict[int, set[str]] = {}
    for h in handles:
        formats.setdefault(h.meta.rank, set()).add(h.meta.format)
    mixed = {r: f for r, f in formats.items() if len(f) > 1}
    if not mixed:
        return handles
    order = ([prefer] if prefer else []) + [f for f in SOURCES if f != prefer]

    def chosen(r: int) -> str:
        return next((f for f in order if f in mixed[r]), sorted(mixed[r])[0])

    why = (f"--prefer {prefer}" if prefer else "the richer source: Kineto records op shapes and FLOPs; --prefer nsys takes the export")
    out = []
    for h in handles:
        r = h.meta.rank
        if r in mixed and h.meta.format != chosen(r):
            by = [k.path for k in handles if k.meta.rank == r and k.meta.format == chosen(r)]
            warnings.append(f"{h.path} ({h.meta.format}) left out: rank {r} is also in {', '.join(by)} ({chosen(r)}), and "
                            f"a rank's events come from one source ({why})")
        else:
            out.append(h)
    return out


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:  # its parse says why it cannot be read
        return 0


def _wall_ns(meta: TraceMeta, t: int | None) -> int | None:
    """A trace time as ns since the epoch: Kineto's times count from ``baseTimeNanoseconds``
    when the file has it (the start of a 3-month interval), else they are epoch times already;
    None when the result is not a plausible date (2001 to 2100), e.g. a hand-made trace."""
    if t is None:
        return None
    w = t + (meta.base_time_ns or 0)
    return w if 10**18 <= w < 4_102_444_800 * 10**9 else None


def _fmt_gap(ns: int) -> str:
    s = ns / 1e9
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _separate_runs(metas: list[TraceMeta], span_of: list[Callable[[], tuple[int | None, int | None]]]) -> str | None:
    """Why the files look like separate runs rather than the ranks of one job, or None.  Only
    when some file lacks distributedInfo (a job's ranks that all say so are believed), and only on
    evidence: different GPU models, or traced spans that do not overlap and lie more than a
    minute apart (a job's ranks are traced together; clocks of one cluster agree far better)."""
    import datetime as dt

    said = sum(1 for m in metas if m.distributed)
    # every file saying it is a rank of a job is believed; some saying so is not enough (a rank's
    # Kineto trace with another run's nsys export beside it was once taken for one job)
    if len(metas) < 2 or said == len(metas):
        return None
    evidence = []
    gpus = list(dict.fromkeys(str(m.device_name) for m in metas if m.device_name))
    if len(gpus) > 1:
        evidence.append(f"they ran on different GPUs ({', '.join(gpus)})")
    spans = []
    for m, span in zip(metas, span_of):  # each file's (first start, last end), read only here
        lo, hi = span()
        a, b = _wall_ns(m, lo), _wall_ns(m, hi)
        if a is not None and b is not None:
            spans.append((a, b, m.path))
    groups: list[list] = []  # [start, end, paths], by start; spans within a minute of each other join
    for a, b, path in sorted(spans):
        if groups and a <= groups[-1][1] + _SAME_RUN_GAP_NS:
            groups[-1][1] = max(groups[-1][1], b)
            groups[-1][2].append(path)
        else:
            groups.append([a, b, [path]])
    if len(groups) > 1:
        def when(ns: int) -> str:
            return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

        at = "; ".join(f"{', '.join(g[2])} at {when(g[0])}" for g in groups)
        gaps = ", ".join(_fmt_gap(n[0] - p[1]) for p, n in zip(groups, groups[1:]))
        evidence.append(f"they were traced at different times with no overlap ({at}; {gaps} apart)")
    if not evidence:
        return None
    ranks = ", ".join(str(m.rank) for m in metas)
    return (
        f"the {len(metas)} files look like separate runs, not one {len(metas)}-rank job: "
        + (f"only {said} of them {'has' if said == 1 else 'have'} distributedInfo" if said else "no file has distributedInfo") + ", and "
        + "; and ".join(evidence)
        + f". They are analysed side by side as ranks {ranks}, but the job's numbers across them (job MFU, step times,"
        " clock alignment, stragglers) mix separate runs: load each run on its own"
    )
