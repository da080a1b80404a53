"""Report cache: the report dict of a job, kept so that opening an unchanged job again with the
same options is one file read, with neither polars nor the analysis imported.

The key is a hash of everything the report is made from: the job's files as found (their paths
in order, whether a directory walk found them, and their content hashes, taken through the
parse cache's stat index), what discovery said about the directories, the analysis options
(with where each came from: a flag, or the job's ``tracelens.toml``), ``keep_python`` and
``strict``, every ``TRACELENS_*`` environment variable that can change a parse (the limits:
``TRACELENS_MAX_EVENT_MB`` and the rest), the tracelens version and a fingerprint of its code
(the size and mtime of every source file, parsers included: a parser's version is in its
source, and an edited analysis never serves a stale report).

What is true of one run only is never stored: a report whose load met a corrupt parse-cache
entry or a cache that could not be used (``Trace.cache_warnings``) is not cached, and the
warnings of the report cache itself (a corrupt entry) belong to the run that met them.

An entry is ``reports/<key>.v<LAYOUT>.json``: one header line (layout, key, the report's size
and blake2b checksum) and the report as JSON.  ``get`` checks all of it; an entry that fails
is removed (CorruptEntry) and the job is analysed again.  Entries are written to a temporary
name and renamed (``store.atomic``); a hit touches its entry, and ``put`` keeps the newest
entries within ``MAX_TOTAL_BYTES`` (and removes the temporary files of killed runs).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

from tracelens.store.atomic import temp_owner, write_bytes
from tracelens.store.cache import (
    DEAD_TEMP_S,
    STALE_TEMP_S,
    CorruptEntry,
    NotAFile,
    _alive,
    _digest,
    _read_file,
    _remove,
    cache_dir,
)

LAYOUT = 1
MAX_TOTAL_BYTES = 256 << 20  # all entries together; the oldest go first (a report is KB to a few MB)
MAX_ENTRY_BYTES = 256 << 20
SUFFIX = f".v{LAYOUT}.json"
# environment variables that change nothing in a report: where the cache is, tracebacks, the tests' switches
_NOT_INPUTS = frozenset({"TRACELENS_CACHE_DIR", "TRACELENS_DEBUG", "TRACELENS_UPDATE_GOLDEN", "TRACELENS_UPDATE_SNAPSHOTS"})
_SOURCE_SUFFIXES = (".py", ".json", ".css", ".js", ".tcss", ".toml")

__all__ = ["CorruptEntry", "job_key", "get", "put", "sweep", "cached_report"]


def reports_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "reports"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of (path, size, mtime) of every source file of tracelens and its parsers: any edit,
    install or upgrade changes it (about 1 ms: stat calls only)."""
    import tracelens

    pkg = Path(tracelens.__file__).resolve().parent
    roots = [pkg]
    if not (pkg / "parsers").is_dir() and (pkg.parent / "parsers").is_dir():  # a source checkout (tracelens.__init__)
        roots.append(pkg.parent / "parsers")
    h = hashlib.blake2b(digest_size=16)
    for top in roots:
        for d, dirs, names in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
            for name in sorted(names):
                if name.endswith(_SOURCE_SUFFIXES):
                    try:
                        st = os.stat(os.path.join(d, name))
                    except OSError:
                        continue
                    h.update(f"{os.path.relpath(os.path.join(d, name), top)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _canonical(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that are set (an option left at its default - None, False, () - is absent), so
    that two spellings of the same options are one key."""
    return {k: options[k] for k in sorted(options) if not (options[k] is None or options[k] is False or options[k] == ())}


def job_key(paths: Iterable[str | Path], *, options: Mapping[str, Any], keep_python: bool = False, strict: bool = False,
            root: Path | None = None) -> tuple[str | None, list[str]]:
    """(the report cache key of the job, what the run should warn about the stat index).  The key
    is None when the job's files cannot all be found and hashed: the analysis then runs and says
    why.  Imports neither polars nor the analysis."""
    from tracelens import __version__
    from tracelens.model.errors import TraceInputError
    from tracelens.store.cache import file_hash
    from tracelens.store.discover import discover

    paths = [str(p) for p in paths]
    notes: list[str] = []
    try:
        files, from_dirs, found_warnings = discover(paths, strict=strict)
        hashes = []
        for f in files:
            damaged: list[str] = []
            hashes.append([str(f), f in from_dirs, file_hash(f, root, damaged)])
            notes += [f"{f}: the cache's stat index entry for this file was damaged ({why}); it was removed and the file hashed again"
                      for why in damaged]
    except (TraceInputError, OSError):
        return None, notes
    if not files:
        return None, notes
    material = {
        "layout": LAYOUT, "tracelens": __version__, "code": code_fingerprint(),
        "paths": paths, "files": hashes, "discovery": found_warnings,
        "options": _canonical(options), "keep_python": bool(keep_python), "strict": bool(strict),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TRACELENS_") and k not in _NOT_INPUTS},
    }
    return hashlib.blake2b(orjson.dumps(material, option=orjson.OPT_NON_STR_KEYS), digest_size=20).hexdigest(), notes


def _entry(key: str, root: Path | None) -> Path:
    return reports_dir(root) / f"{key}{SUFFIX}"


def get(key: str, root: Path | None = None) -> dict[str, Any] | None:
    """The report stored under ``key``, or None.  CorruptEntry (the entry removed) when it fails
    a check; OSError when the cache cannot be read."""
    p = _entry(key, root)
    try:
        raw = _read_file(p, MAX_ENTRY_BYTES + 4096)
    except FileNotFoundError:
        return None
    except NotAFile as e:
        _remove(p)
        raise CorruptEntry(str(e)) from None
    why = _check(key, raw)
    if isinstance(why, str):
        _remove(p)
        raise CorruptEntry(why)
    try:
        os.utime(p)  # recently used: the size cap removes the oldest first
    except OSError:
        pass
    return why


def _check(key: str, raw: bytes) -> dict[str, Any] | str:
    """The report in an entry's bytes, or what is wrong with them."""
    line, sep, body = raw.partition(b"\n")
    try:
        head = orjson.loads(line)
    except orjson.JSONDecodeError:
        head = None
    if not sep or not isinstance(head, dict):
        return "its header is not an entry's"
    if head.get("key") != key or head.get("layout") != LAYOUT:
        return "it belongs to another entry"
    if head.get("bytes") != len(body):
        return f"its report has {len(body):,} bytes, not as many as it was written with"
    if head.get("blake2b") != _digest(body):
        return "its report fails its checksum"
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "its report is not JSON"
    if not isinstance(d, dict) or not isinstance(d.get("warnings"), list):
        return "it holds no report"
    return d


def put(key: str, report: Mapping[str, Any], root: Path | None = None) -> None:
    """Store ``report`` under ``key`` (atomically), then keep the cache within its size.  OSError
    when the cache cannot be written; TypeError when the report is not JSON (never stored)."""
    body = orjson.dumps(report)
    if len(body) > MAX_ENTRY_BYTES:
        return
    head = orjson.dumps({"layout": LAYOUT, "key": key, "bytes": len(body), "blake2b": _digest(body)})
    write_bytes(_entry(key, root), head + b"\n" + body)
    sweep(root)


def sweep(root: Path | None = None, now: float | None = None, max_total: int | None = None) -> list[Path]:
    """Remove the report cache's stale temporary files (as the parse cache's ``sweep`` does) and,
    while its entries hold more than ``max_total`` bytes, the least recently used.  Returns what
    it removed."""
    d = reports_dir(root)
    now = time.time() if now is None else now
    cap = MAX_TOTAL_BYTES if max_total is None else max_total
    removed: list[Path] = []
    entries = []
    try:
        with os.scandir(d) as it:
            listing = list(it)
    except OSError:
        return removed
    for e in listing:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if e.name.endswith(".tmp"):
            owner = temp_owner(e.name)
            age = now - st.st_mtime
            if owner and owner[0].endswith(SUFFIX) and (age > STALE_TEMP_S or (age > DEAD_TEMP_S and not _alive(owner[1]))):
                _remove(Path(e.path))
                removed.append(Path(e.path))
        elif e.name.endswith(SUFFIX):
            entries.append((st.st_mtime, e.name, st.st_size, Path(e.path)))
    total = sum(x[2] for x in entries)
    for _, _, size, p in sorted(entries):
        if total <= cap:
            break
        _remove(p)
        removed.append(p)
        total -= size
    return removed


def cached_report(paths: Iterable[str | Path], analyse: Callable[[], tuple[dict[str, Any], bool]], *, options: Mapping[str, Any],
                  keep_python: bool = False, strict: bool = False, use_cache: bool = True,
                  root: Path | None = None) -> tuple[dict[str, Any], bool]:
    """(the job's report, whether it came from the cache).  ``analyse()`` makes it on a miss and
    says whether it may be stored (False when its load said something true of that run only, e.g.
    a corrupt parse-cache entry).  The run's own notes about the caches are appended to the
    report's warnings, never stored."""
    if not use_cache:
        return analyse()[0], False
    paths = list(paths)
    key, notes = job_key(paths, options=options, keep_python=keep_python, strict=strict, root=root)
    d = None
    if key is not None:
        try:
            d = get(key, root)
        except CorruptEntry as e:
            notes.append(f"the report cache entry for this job was corrupt ({e}); it was removed and the job analysed again")
        except OSError:  # an unreadable cache: the parse cache's warning says so
            pass
    hit = d is not None
    if d is None:
        d, storable = analyse()
        if key is not None and storable:
            try:
                put(key, d, root)
            except (OSError, TypeError):  # a read-only cache, or a report that is not JSON: served fresh each time
                pass
    if notes:
        d["warnings"] = [*d["warnings"], *notes]
    return d, hit
