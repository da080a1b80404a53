"""The event table for notebooks: a job's events as Parquet, one file per rank.

``export(paths, out)`` writes ``out/rank-<R>.parquet`` for every rank (``rank-<R>.file-<F>.parquet``
when two files claim one rank), each in the event schema (tracelens.model.schema.EVENT_SCHEMA,
``file`` and ``rank`` filled in as the analysis numbers them), and ``out/tracelens-export.json``:
what each file is (rank, source trace, rows, the trace's metadata) and the load's warnings.  In
a notebook, ``pl.scan_parquet("out/*.parquet")`` is the whole job as one lazy frame.  With
``ranks`` only those ranks are written; an ``out`` ending in ``.parquet`` is one rank's table.

Rank by rank: the job is loaded as every command loads it (``tracelens.store.job.load``: the
files parsed through the cache, ranks given) and each rank's file is streamed from its lazy scan
(``Job.events(file=...).sink_parquet``), so memory is at most one rank's table, never the job's.  Nothing is written half: the files are built in a temporary directory beside ``out``
and renamed onto it at the end; on any failure it is removed and ``out`` is as it was.  An
existing ``out`` must be empty or an earlier export (replaced whole)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from tracelens.model.errors import OutputError, UsageError
from tracelens.model.schema import EVENT_SCHEMA

MANIFEST = "tracelens-export.json"
_OURS = re.compile(r"rank-\d+(?:\.file-\d+)?\.parquet")  # the files an export writes (besides the manifest)


@dataclass
class Exported:
    """What an export wrote: one entry per Parquet file (name, rank, file index, source, rows)."""

    out: str
    files: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(f["rows"] for f in self.files)


def export(paths: Iterable[str | Path], out: str | Path, *, ranks: Iterable[int] | None = None, use_cache: bool = True,
           keep_python: bool = False, strict: bool = False, progress: Callable[[int, int], None] | None = None,
           prefer: str | None = None) -> Exported:
    """Write the event tables of the traces in ``paths`` under ``out`` (a directory, or one
    ``.parquet`` file for one rank).  ``progress(done, total)`` after each input file.

    Raises TraceInputError when an input cannot be used (as ``tracelens report`` would),
    UsageError when ``ranks`` selects no file (or several, for a ``.parquet`` ``out``), and
    OutputError when ``out`` cannot be written; in every case nothing is left behind."""
    from tracelens.store.job import load

    out = Path(out)
    single = out.suffix.lower() == ".parquet"
    wanted = None if ranks is None else set(ranks)
    _check_destination(out, single)
    # the job as every command loads it (discovery, skipped files, the cache, ranks): one rank's
    # table in memory at a time, and none when its file is in the parse cache
    job = load([str(p) for p in paths], use_cache=use_cache, keep_python=keep_python, strict=strict, prefer=prefer,
               progress=(lambda done, total, _meta: progress(done, total)) if progress is not None else None)
    stage = _stage_dir(out)
    try:
        result = _write_ranks(job, stage, out, single, wanted)
        if single:
            _write(out, os.replace, stage / result.files[0]["parquet"], out)
            shutil.rmtree(stage, ignore_errors=True)
        else:
            _write(out, _commit_dir, stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return result


def _check_destination(out: Path, single: bool) -> None:
    """OutputError unless ``out`` can be written: a new or empty directory, an earlier export, or
    (``single``) a file path that check_output accepts; checked before any parse."""
    from tracelens.store.atomic import check_output

    if single:
        check_output(out)
        return
    if out.exists() and not out.is_dir():
        raise OutputError(str(out), "is not a directory (give a new directory, or a .parquet file for one rank)")
    parent = out.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise OutputError(str(out), f"cannot write: the directory {parent} {why}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(str(out), f"cannot write: the directory {parent} is not writable")
    if out.is_dir() and not _is_export(out):
        raise OutputError(str(out), "is a directory that holds other files than a tracelens export: give a new or empty directory")


def _is_export(d: Path) -> bool:
    """An empty directory, or one holding exactly what an export writes (its manifest among it)."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return not names or (MANIFEST in names and all(n == MANIFEST or (_OURS.fullmatch(n) and (d / n).is_file()) for n in names))


def _stage_dir(out: Path) -> Path:
    try:
        return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp"))
    except OSError as e:
        from tracelens.store.atomic import output_problem

        raise OutputError(str(out), f"cannot write: {output_problem(e)}; nothing was written") from None


def _write(out: Path, do: Callable[..., Any], *args: Any) -> Any:
    """``do(*args)``, a write of the export; an I/O failure (polars says it in words) is an OutputError."""
    from tracelens.store.atomic import output_problem

    try:
        return do(*args)
    except OSError as e:
        raise OutputError(str(out), f"cannot write: {output_problem(e)}; nothing was written") from None
    except pl.exceptions.PolarsError as e:
        m = re.search(r"os error (\d+)", str(e))
        problem = output_problem(OSError(int(m.group(1)), os.strerror(int(m.group(1))))) if m else str(e).splitlines()[0]
        raise OutputError(str(out), f"cannot write: {problem}; nothing was written") from None


def _write_ranks(job, stage: Path, out: Path, single: bool, wanted: set[int] | None) -> Exported:
    """Stream each wanted file's events (``Job.events``: a lazy scan of its cached table) into its
    final file under ``stage``; write the manifest."""
    import orjson

    from tracelens import __version__

    metas = job.metas
    chosen = [i for i, m in enumerate(metas) if wanted is None or m.rank in wanted]
    have = sorted({m.rank for m in metas})
    if not chosen:
        raise UsageError(f"--rank {', '.join(map(str, sorted(wanted or ())))}: no such rank among the traces "
                         f"(ranks {', '.join(map(str, have))})")
    if single and len(chosen) > 1:
        raise UsageError(f"-o {out}: one .parquet file holds one rank, and {len(chosen)} files were chosen "
                         f"(ranks {', '.join(str(metas[i].rank) for i in chosen)}): pick one with --rank, or give a directory")
    claims: dict[int, int] = {}
    for m in metas:
        claims[m.rank] = claims.get(m.rank, 0) + 1
    result = Exported(out=str(out), warnings=list(job.all_warnings))
    for i in chosen:
        m = metas[i]
        name = f"rank-{m.rank}.parquet" if claims[m.rank] == 1 else f"rank-{m.rank}.file-{i}.parquet"
        _write(out, job.events(file=i).select(list(EVENT_SCHEMA)).sink_parquet, stage / name)
        rows = pl.scan_parquet(stage / name).select(pl.len()).collect().item()
        result.files.append({"parquet": name, "rank": m.rank, "file": i, "path": m.path, "rows": rows, "meta": m.to_dict()})
    if not single:
        manifest = {"tool": {"name": "tracelens", "version": __version__},
                    "schema": {k: str(v) for k, v in EVENT_SCHEMA.items()},
                    "files": result.files, "warnings": result.warnings}
        _write(out, (stage / MANIFEST).write_bytes, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    return result


def _commit_dir(stage: Path, out: Path) -> None:
    """Put the finished ``stage`` directory in ``out``'s place: a rename onto a missing or empty
    ``out``; an earlier export is moved aside first and removed after."""
    os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes it 0700: give it a normal directory's mode
    try:
        os.replace(stage, out)
        return
    except OSError:
        if not (out.is_dir() and _is_export(out)):
            raise
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".old.tmp"))
    os.replace(out, old / "x")
    try:
        os.replace(stage, out)
    except BaseException:
        os.replace(old / "x", out)  # put the earlier export back
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
