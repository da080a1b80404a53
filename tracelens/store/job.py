"""Load a job: find its trace files, parse them (in parallel, through the cache), give every
file a rank, and join them into one event table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from tracelens.model.errors import TraceInputError, UnreadableError, UnsupportedFormat
from tracelens.model.schema import END, EVENT_SCHEMA, TraceMeta, empty_frame
from tracelens.store.discover import discover
from tracelens.store.ranks import _assign_ranks

PARALLEL_MIN_BYTES = 8 << 20  # on disk (gzip): about 100 MB of JSON
_SAME_RUN_GAP_NS = 60 * 10**9  # ranks of one job are traced together: spans further apart than this are separate runs




@dataclass
class Trace:
    """A loaded job: one event table (all files) and one TraceMeta per file, in file order."""

    events: pl.DataFrame
    metas: list[TraceMeta]
    warnings: list[str] = field(default_factory=list)
    separate_runs: str | None = None  # why the files look like separate runs rather than one job (also a warning)
    # the warnings about the parse cache (a corrupt entry, a cache that cannot be used): true of this run, not of the job
    cache_warnings: list[str] = field(default_factory=list)

    @property
    def all_warnings(self) -> list[str]:
        """Job-level warnings, then every file's own, each naming its file."""
        return self.warnings + [f"{m.path}: {w}" for m in self.metas for w in m.warnings]

    @property
    def ranks(self) -> list[int]:
        return sorted({m.rank for m in self.metas if m.rank is not None})


def parse_file(path: str | Path, *, use_cache: bool = True, keep_python: bool = False,
               progress: Callable[[int], None] | None = None,
               notes: list[tuple[str, str]] | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Parse one file through the cache (sniffing its format); ``progress(bytes)``: how far into
    the file (on disk) the parser is.  What the job's warnings should say about the cache is
    appended to ``notes`` as (kind, text): "cache" when the cache cannot be used (the parse
    goes on without it), "corrupt" when this file's entry failed its checks and was re-parsed."""
    from tracelens.parsers import parser_for, sniff

    path = Path(path)
    fmt = sniff(path)
    parser = parser_for(fmt, path)  # an nsys SQLite export: recognised (tracelens info reads its GPUs), not analysed
    from tracelens.store import cache

    notes = [] if notes is None else notes
    key = None
    if use_cache:
        damaged: list[str] = []
        try:
            h = cache.file_hash(path, damaged=damaged)
        except OSError:  # the trace itself could not be read: its parse says why
            h = None
        for why in damaged:
            notes.append(("corrupt", f"{path}: the cache's stat index entry for this file was damaged ({why}); "
                                     "it was removed and the file hashed again"))
        if h is not None:
            key = f"{h}-{fmt}-{parser.PARSER_VERSION}{'-py' if keep_python else ''}"
            try:
                hit = cache.get(key)
            except cache.CorruptEntry as e:
                notes.append(("corrupt", f"{path}: the cache entry for this file was corrupt ({e}); "
                                         "it was removed and the file re-parsed"))
                hit = None
            except OSError as e:
                notes.append(("cache", _cache_off(e)))
                hit, key = None, None
            if hit is not None:
                df, meta = hit
                meta.path = str(path)
                return df, meta
    df, meta = parser.parse(path, keep_python=keep_python, progress=progress)
    if key is not None:
        meta.content_hash = key.split("-", 1)[0]
        if not meta.truncated:  # a partial parse is never cached
            try:
                cache.put(key, df, meta)
            except OSError as e:
                notes.append(("cache", _cache_off(e)))
    return df, meta


def _cache_off(e: OSError) -> str:
    from tracelens.store.cache import cache_dir

    return f"the parse cache in {cache_dir()} cannot be used ({e.strerror or e}); running without it"


def _parse_job(args: tuple[str, bool, bool]) -> tuple[pl.DataFrame, TraceMeta, list[tuple[str, str]]]:
    path, use_cache, keep_python = args
    notes: list[tuple[str, str]] = []
    df, meta = parse_file(path, use_cache=use_cache, keep_python=keep_python, notes=notes)
    return df, meta, notes


def load(
    paths: Iterable[str | Path],
    *,
    use_cache: bool = True,
    keep_python: bool = False,
    jobs: int | None = None,
    progress: Callable[[int, int, TraceMeta], None] | None = None,
    bytes_progress: Callable[[int, int], None] | None = None,
    strict: bool = False,
) -> Trace:
    """Load trace files and directories of them into one Trace.  ``progress(done, total, meta)``
    after each file; ``bytes_progress(done, total)`` in bytes on disk as the files are read (within
    a file too, when parsing in this process).

    Raises TraceInputError (naming the file) when an input cannot be used.  Files found by
    walking a directory that are JSON but not traces, or (unless ``strict``) cannot be read,
    are skipped with a warning.  A cache that cannot be used is one warning; the job loads
    without it.
    """
    files, from_dirs, warnings = discover(paths, strict=strict)
    if not files:
        raise TraceInputError(".", "no input files")
    results: dict[int, tuple[pl.DataFrame, TraceMeta]] = {}
    notes: dict[int, list[tuple[str, str]]] = {}  # file -> what its parse said about the cache
    if use_cache:
        from tracelens.store import cache

        cache.sweep()
    sizes = [_size(f) for f in files]
    total = sum(sizes)
    if jobs is None:
        # worker processes cost ~0.3 s to start (imports): worth it only for real work
        jobs = min(len(files), os.cpu_count() or 1) if total > PARALLEL_MIN_BYTES else 1
    work = [(str(f), use_cache, keep_python) for f in files]

    def record(i: int, res: tuple[pl.DataFrame, TraceMeta] | None, err: TraceInputError | None) -> None:
        if err is not None:
            skip = (
                isinstance(err, UnsupportedFormat)
                or err.problem.startswith("not a trace")
                or (isinstance(err, UnreadableError) and not strict)
            )
            if files[i] in from_dirs and skip:
                warnings.append(f"{err.path}: skipped ({err.problem})")
                return
            raise err
        assert res is not None
        results[i] = res
        if progress is not None:
            progress(len(results), len(files), res[1])
        if bytes_progress is not None:
            bytes_progress(sum(sizes[j] for j in results), total)

    if jobs <= 1 or len(files) == 1:
        before = 0
        for i, (path, cache_ok, keep_py) in enumerate(work):
            inner = None
            if bytes_progress is not None:
                inner = (lambda base: lambda n: bytes_progress(base + n, total))(before)
            got = notes[i] = []
            cache_off = any(k == "cache" for n in notes.values() for k, _ in n)  # once it failed, the rest go without
            try:
                res = parse_file(path, use_cache=cache_ok and not cache_off, keep_python=keep_py, progress=inner, notes=got)
            except TraceInputError as e:
                record(i, None, e)
            else:
                record(i, res, None)
            before += sizes[i]
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed  # only here: ~3 ms to import
        from multiprocessing import get_context

        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            futs = {pool.submit(_parse_job, w): i for i, w in enumerate(work)}
            try:
                for fut in as_completed(futs):
                    i = futs[fut]
                    try:
                        df, meta, got = fut.result()
                    except TraceInputError as e:
                        record(i, None, e)
                    else:
                        notes[i] = got
                        record(i, (df, meta), None)
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
    said = [n for i in sorted(notes) for n in notes[i]]
    cache_warnings = [text for kind, text in said if kind == "corrupt"]
    cache_warnings += next(([text] for kind, text in said if kind == "cache"), [])  # one, however many files met it
    warnings.extend(cache_warnings)
    if not results:
        raise TraceInputError(str(files[0].parent if len(files) > 1 else files[0]), "no traces among the inputs")
    order = sorted(results)
    metas = [results[i][1] for i in order]
    frames = [results[i][0] for i in order]
    _assign_ranks([files[i] for i in order], metas, warnings, frames)
    separate = _separate_runs(metas, frames)
    if separate:
        warnings.append(separate)
    out = []
    for fi, (df, meta) in enumerate(zip(frames, metas)):
        out.append(df.with_columns(pl.lit(fi, dtype=pl.Int32).alias("file"), pl.lit(meta.rank, dtype=pl.Int32).alias("rank")))
    events = pl.concat(out, how="vertical") if out else empty_frame()
    assert list(events.schema) == list(EVENT_SCHEMA)
    return Trace(events=events, metas=metas, warnings=warnings, separate_runs=separate, cache_warnings=cache_warnings)


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


def _separate_runs(metas: list[TraceMeta], frames: list[pl.DataFrame]) -> str | None:
    """Why the files look like separate runs rather than the ranks of one job, or None.  Only
    without distributedInfo in any file (a job's ranks that say so are believed), and only on
    evidence: different GPU models, or traced spans that do not overlap and lie more than a
    minute apart (a job's ranks are traced together; clocks of one cluster agree far better)."""
    import datetime as dt

    if len(metas) < 2 or any(m.distributed for m in metas):
        return None
    evidence = []
    gpus = list(dict.fromkeys(str(m.device_name) for m in metas if m.device_name))
    if len(gpus) > 1:
        evidence.append(f"they ran on different GPUs ({', '.join(gpus)})")
    spans = []
    for m, df in zip(metas, frames):
        lo, hi = df.select(pl.col("ts_ns").min().alias("lo"), END.max().alias("hi")).row(0)
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
        f"the {len(metas)} files look like separate runs, not one {len(metas)}-rank job: no file has distributedInfo, and "
        + "; and ".join(evidence)
        + f". They are analysed side by side as ranks {ranks}, but the job's numbers across them (job MFU, step times,"
        " clock alignment, stragglers) mix separate runs: load each run on its own"
    )
