"""Discovery: the paths a user gives -> the trace files of a job (directories walked, links
followed once, duplicates kept once)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from stat import S_ISDIR, S_ISREG

from tracelens.model.errors import TraceInputError, UnreadableError

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")  # PyTorch profiler traces, Nsight Systems SQLite exports


def is_trace_name(p: Path) -> bool:
    name = p.name.lower()
    return any(name.endswith(s) for s in TRACE_SUFFIXES) and not name.startswith(".")


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def discover(paths: Iterable[str | Path], *, strict: bool = False) -> tuple[list[Path], set[Path], list[str]]:
    """Expand directories into their trace files.  Returns (files, files found by walking a
    directory - they may be skipped when they turn out not to be traces or cannot be read -,
    warnings).  A file reached twice (given twice, or through links) is kept once.

    Symlinked subdirectories are followed, each directory once; a link to a directory above
    it (a loop) is not.  A subdirectory or file inside a directory that cannot be read is a
    warning naming it, or with ``strict`` an UnreadableError; a path given that cannot be
    reached (a directory on its way is not searchable) is always an error."""
    files: list[Path] = []
    from_dirs: set[Path] = set()
    warnings: list[str] = []
    for raw in paths:
        p = Path(raw)
        try:
            st = os.stat(p)
        except (FileNotFoundError, NotADirectoryError):
            raise TraceInputError(str(p), "no such file or directory") from None
        except PermissionError as e:
            raise UnreadableError(str(p), f"cannot reach it ({e.strerror}: a directory on its path cannot be searched)") from None
        except OSError as e:
            raise UnreadableError(str(p), f"cannot reach it ({e.strerror or e})") from None
        if S_ISDIR(st.st_mode):
            found = _walk(p, strict, warnings)
            if not found:
                raise TraceInputError(str(p), "no trace files (*.json, *.json.gz, *.sqlite) in this directory")
            found.sort(key=_natural_key)
            files.extend(found)
            from_dirs.update(found)
        elif S_ISREG(st.st_mode):
            files.append(p)
        else:
            raise TraceInputError(str(p), "not a regular file or directory")
    kept: dict[tuple[int, int], int] = {}  # (device, inode) -> its place in unique
    unique: list[Path] = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError as e:  # a file found in a directory whose entries cannot be looked at
            _unreadable(f, "cannot read file", e, strict, warnings)
            from_dirs.discard(f)
            continue
        at = kept.get((st.st_dev, st.st_ino))
        if at is None:
            kept[(st.st_dev, st.st_ino)] = len(unique)
            unique.append(f)
        elif _through_links(unique[at]) and not _through_links(f):  # the same file: name it by its real path
            unique[at] = f
    return unique, from_dirs, warnings


def _through_links(p: Path) -> bool:
    return os.path.realpath(p) != os.path.abspath(p)


def _unreadable(p: Path, what: str, e: OSError, strict: bool, warnings: list[str]) -> None:
    problem = f"{what} ({e.strerror or e})"
    if strict:
        raise UnreadableError(str(p), problem)
    warnings.append(f"{p}: skipped ({problem})")


def _is_link(e: os.DirEntry) -> bool:
    try:
        return e.is_symlink()
    except OSError:
        return False


def _walk(top: Path, strict: bool, warnings: list[str]) -> list[Path]:
    """The trace files under ``top``, following symlinked directories once each (by device and
    inode), never into a directory above the link (a loop)."""
    found: list[Path] = []
    st = os.stat(top)
    seen = {(st.st_dev, st.st_ino)}
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:  # real subdirectories before links to them: files keep their real paths
                entries = sorted(it, key=lambda e: (_is_link(e), e.name))
        except OSError as e:
            if d == top:
                raise UnreadableError(str(d), f"cannot read this directory ({e.strerror or e})") from None
            _unreadable(d, "cannot read this directory", e, strict, warnings)
            continue
        subdirs = []
        for e in entries:
            p = Path(e.path)
            try:
                is_dir = e.is_dir()
                is_link = e.is_symlink()
            except OSError as err:
                _unreadable(p, "cannot look at it", err, strict, warnings)
                continue
            if is_dir:
                try:
                    dst = os.stat(p)
                except OSError as err:
                    _unreadable(p, "cannot look at this directory", err, strict, warnings)
                    continue
                if is_link:
                    target = p.resolve()
                    here = d.resolve()
                    if target == here or target in here.parents:
                        warnings.append(f"{p}: a link to {target}, a directory above it; not followed (it would loop)")
                        continue
                if (dst.st_dev, dst.st_ino) not in seen:  # reached before, through a link or the real path
                    seen.add((dst.st_dev, dst.st_ino))
                    subdirs.append(p)
            elif is_trace_name(p):
                try:
                    is_file = e.is_file()
                except OSError as err:
                    _unreadable(p, "cannot look at it", err, strict, warnings)
                    continue
                if is_file:
                    found.append(p)
                elif is_link and not p.exists():
                    warnings.append(f"{p}: skipped (a broken link)")
        stack.extend(reversed(subdirs))
    return found
