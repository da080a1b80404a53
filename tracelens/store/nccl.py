"""A job of NCCL's own records only (NCCL_DEBUG logs, Flight Recorder dumps, nccl-tests outputs,
NCCL Inspector files, profiler plugin traces): finding its files
(any name: dumps are ``rank_3``, logs ``*.log``/``*.txt``/``nccl.%h.%p``), and reading each into
collective rows (``parsers.collective_parser_for``).  A path list holding any Kineto or Nsight
trace is not such a job (None): the normal job takes it, NCCL files there are skipped with a word."""

from __future__ import annotations

import os
from pathlib import Path

from tracelens.model.errors import TraceInputError

MAX_FILES = 100_000
NCCL_FORMATS = ("nccl_log", "flight_recorder", "nccl_tests", "nccl_inspector", "nccl_profiler")


def _walk(p: Path) -> list[Path]:
    out: list[Path] = []
    for root, dirs, files in os.walk(p, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        # regular files only: a FIFO (the dump trigger pipe, ``<prefix><rank>.pipe``) would block the first read forever
        out.extend(q for q in (Path(root) / f for f in sorted(files) if not f.startswith(".")) if q.is_file())
        if len(out) > MAX_FILES:
            break
    return out


def nccl_only(paths: list[str | Path]) -> tuple[list[tuple[Path, str]], list[str]] | None:
    """(NCCL files with their formats, warnings) when the paths hold NCCL records and no trace of
    another format; else None (a path that cannot be reached too: the normal job says why).
    Only the files' first bytes are read."""
    try:
        return _nccl_only(paths)
    except OSError:
        return None


def _nccl_only(paths: list[str | Path]) -> tuple[list[tuple[Path, str]], list[str]] | None:
    from tracelens.model.errors import UnsupportedFormat
    from tracelens.parsers import sniff
    from tracelens.store.discover import _natural_key

    found: list[tuple[Path, str]] = []
    skipped: list[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            return None  # the normal job says what is wrong
        if not p.is_dir() and not p.is_file():
            return None  # a FIFO, a device: the normal job says what it is
        files = _walk(p) if p.is_dir() else [p]
        for f in sorted(files, key=_natural_key):
            try:
                fmt = sniff(f)
            except UnsupportedFormat as e:
                skipped.append(f"{f}: skipped ({e.problem})")
                continue
            except (TraceInputError, OSError):
                if not p.is_dir():
                    return None
                skipped.append(str(f))
                continue
            if fmt not in NCCL_FORMATS:
                return None
            found.append((f, fmt))
    if not found:
        return None
    warnings = []
    named = [s for s in skipped if ": skipped (" in s]
    warnings.extend(named[:10])
    other = len(skipped) - len(named)
    if other:
        warnings.append(f"{other} file(s) beside the NCCL records are not traces (skipped)")
    return found, warnings


def _read_one(task: tuple[int, str, str]):
    """Read file ``task`` = (its index, path, format) into its ``NcclParse``; raises
    ``TraceInputError`` (an unreadable file too) for a file that cannot be read: a task a worker
    process can run."""
    from tracelens.model.errors import ParseError
    from tracelens.parsers import collective_parser_for

    i, f, fmt = task
    try:
        return collective_parser_for(fmt).read(Path(f), file=i)
    except OSError as e:
        raise ParseError(f, f"cannot read it: {e.strerror or e}") from None


def read_all(found: list[tuple[Path, str]], strict: bool = False, need_one: bool = False,
             jobs: int | None = None) -> tuple[list, list[str]]:
    """Each file read (``NcclParse``), and a warning for each that could not be; raised instead
    (the first one's ``TraceInputError``) with ``strict``, and with ``need_one`` when none could be
    read (a report of nothing is no report: one line and its exit code, no output file).  Many
    files are read by worker processes, one per file, where their bytes are worth it
    (``engine.choose``: 6 logs of 52 MB in 3.7-4.0 s instead of 4.6-5.0 s on 2 cores).  One big log
    is read here: its batches parsed by 2 worker processes took 15-30% longer on 2 cores than here
    (the parent's reading, pickling and assembly, and polars' own threads, already 1.1 cores here)."""
    from tracelens.engine import choose

    tasks = [(i, str(f), fmt) for i, (f, fmt) in enumerate(found)]
    size = 0
    for f, _ in found:
        try:
            size += f.stat().st_size
        except OSError:
            pass
    got: list = [None] * len(tasks)
    for i, res in choose(jobs, size, len(tasks)).map(_read_one, tasks):
        if isinstance(res, Exception) and not isinstance(res, TraceInputError):  # a lost worker: read it here
            try:
                res = _read_one(tasks[i])
            except TraceInputError as e:
                res = e
        got[i] = res
    out = []
    warnings: list[str] = []
    first: TraceInputError | None = None
    for (f, _), res in zip(found, got):  # in the files' order: the first bad one is the one raised
        if isinstance(res, TraceInputError):
            if strict:
                raise res
            first = first or res
            warnings.append(f"{f}: skipped ({res.problem})")
        else:
            out.append(res)
    if need_one and not out and first is not None:
        raise first
    return out, warnings
