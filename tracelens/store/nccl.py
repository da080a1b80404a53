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


def read_all(found: list[tuple[Path, str]], strict: bool = False, need_one: bool = False) -> tuple[list, list[str]]:
    """Each file read (``NcclParse``), and a warning for each that could not be; raised instead
    (the first one's ``TraceInputError``) with ``strict``, and with ``need_one`` when none could be
    read (a report of nothing is no report: one line and its exit code, no output file)."""
    from tracelens.model.errors import ParseError
    from tracelens.parsers import collective_parser_for

    out = []
    warnings: list[str] = []
    first: TraceInputError | None = None
    for i, (f, fmt) in enumerate(found):
        try:
            out.append(collective_parser_for(fmt).read(f, file=i))
        except TraceInputError as e:
            if strict:
                raise
            first = first or e
            warnings.append(f"{f}: skipped ({e.problem})")
        except OSError as e:
            err = ParseError(str(f), f"cannot read it: {e.strerror or e}")
            if strict:
                raise err from None
            first = first or err
            warnings.append(f"{f}: skipped ({err.problem})")
    if need_one and not out and first is not None:
        raise first
    return out, warnings
