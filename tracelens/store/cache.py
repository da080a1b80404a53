"""Parse cache: each parsed file is kept as Parquet (events) + JSON (TraceMeta), keyed by a
hash of the file's bytes and the parser's version, so a second open is near-instant.

The cache never lies.  An entry's JSON carries blake2b checksums of its Parquet file and of
its metadata, and the key it was stored under; ``get`` checks them all before use and removes
an entry that fails (CorruptEntry), so the caller parses again.  A small stat index (path,
size, mtime, ctime, inode, device) -> content hash spares re-hashing unchanged files; its
entries carry a checksum too, and a rewrite that restores the mtime still changes the ctime.

Every cache file is read through ``_read_file``: opened without blocking (a FIFO put in an
entry's place would otherwise hang the run), refused unless it is a regular file (a FIFO, a
directory, a device, a socket: a damaged entry, removed where it can be), and read no further
than the size it may have.

Everything is written to a temporary name and renamed, so a killed run never leaves a
half-written entry; the Parquet file is renamed last and is what marks an entry complete.
The temporary files of a killed run are removed by a later run (``sweep``).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from tracelens.store.atomic import temp_owner, write_bytes, write_with

if TYPE_CHECKING:  # polars only where an entry is read: hashing a file (the report cache's key) imports none of it
    import polars as pl

    from tracelens.model.schema import TraceMeta

HASH_BLOCK = 1 << 22
LAYOUT = 2  # in every entry's file name: entries written by an older layout are never read
MAX_META_BYTES = 64 << 20  # an entry's metadata is kilobytes: a bigger file is not one
STALE_TEMP_S = 600  # a temporary file untouched this long belongs to no live write
DEAD_TEMP_S = 60  # ... nor one this old whose writer's pid is gone (the grace: another machine sharing the directory)
_CACHE_NAME = re.compile(r"[0-9a-f]{32}|[0-9a-f]{40}-[\w.-]+\.(?:parquet|meta\.json)")  # stat index | entries


class CorruptEntry(Exception):
    """A cache entry failed its checks; it has been removed.  The message says what failed."""


class NotAFile(OSError):
    """A cache file's name holds something else: a FIFO, a directory, a device, a socket."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_NONBLOCK = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _read_file(path: Path, limit: int) -> bytes:
    """The bytes of the cache file ``path``, at most ``limit`` + 1 of them (a longer file is
    the caller's to refuse).  Opened with O_NONBLOCK and checked with fstat before any read:
    NotAFile (nothing read) when it is not a regular file; FileNotFoundError when it is missing."""
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    except IsADirectoryError:  # where a directory cannot be opened at all
        raise NotAFile(f"{path.name} is a directory") from None
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotAFile(f"{path.name} is {_kind(mode)}")
    with open(fd, "rb", closefd=True) as fh:
        return fh.read(min(limit, os.fstat(fd).st_size) + 1)


def cache_dir() -> Path:
    env = os.environ.get("TRACELENS_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "tracelens"


def content_hash(path: Path) -> str:
    return _file_digest(path, 20)


def _file_digest(path: Path | str, size: int = 32) -> str:
    h = hashlib.blake2b(digest_size=size)
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def _stat_ident(path: Path) -> bytes:
    st = os.stat(path)
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}|{st.st_dev}".encode()


def file_hash(path: Path, root: Path | None = None, damaged: list[str] | None = None) -> str:
    """Content hash of ``path``, taken from the stat index when the file has not changed.  An
    index entry is "<hash> <checksum of the stat and the hash>": a damaged one is not believed.
    An index entry that is not a regular file (a FIFO, a directory) is removed where it can be
    and said in ``damaged``."""
    root = root or cache_dir()
    ident = _stat_ident(path)
    idx = root / "stat" / hashlib.blake2b(ident, digest_size=16).hexdigest()
    try:
        h, check = _read_file(idx, 200).decode("ascii").split()
        if len(h) == 40 and check == _digest(ident + h.encode()):
            return h
    except NotAFile as e:
        _remove(idx)
        if damaged is not None:
            damaged.append(str(e))
    except (OSError, ValueError):  # missing, unreadable or damaged: hash the file again
        pass
    h = content_hash(path)
    try:
        write_bytes(idx, f"{h} {_digest(ident + h.encode())}".encode())
    except OSError:  # a read-only cache still serves its entries; put() reports a cache that cannot be written
        pass
    return h


def _entry(root: Path, key: str) -> tuple[Path, Path]:
    return root / f"{key}.v{LAYOUT}.parquet", root / f"{key}.v{LAYOUT}.meta.json"


def parquet_path(key: str, root: Path | None = None) -> Path:
    """Where the events of the entry stored under ``key`` are."""
    return _entry(root or cache_dir(), key)[0]


def get(key: str, root: Path | None = None) -> tuple[pl.DataFrame, TraceMeta] | None:
    """The entry stored under ``key``; None when there is none (or only half of one, from a
    killed run).  CorruptEntry (after removing it) when it fails a check; OSError when the
    cache directory cannot be read."""
    return _checked(key, root, read=True)


def lookup(key: str, root: Path | None = None) -> tuple[Path, TraceMeta] | None:
    """As ``get``, but the entry's Parquet file is only checked (its checksum, read in blocks),
    not loaded: (its path, the TraceMeta).  The job reads the events later, one rank at a time."""
    return _checked(key, root, read=False)


def _checked(key: str, root: Path | None, read: bool):
    pq, mj = _entry(root or cache_dir(), key)
    try:
        why = _check_entry(key, pq, mj, read)
        if not isinstance(why, str):
            return why
    except FileNotFoundError:  # half an entry (a killed run), or removed under us by another run: a miss
        return None
    except NotAFile as e:
        why = str(e)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a damaged entry raises, it is not used
        why = f"unreadable ({type(e).__name__})"
    drop(key, root)
    raise CorruptEntry(why)


def _check_entry(key: str, pq: Path, mj: Path, read: bool = True) -> tuple[pl.DataFrame | Path, TraceMeta] | str:
    """The entry (its frame when ``read``, else its Parquet file's path), or what is wrong with it."""
    from tracelens.model.schema import TraceMeta  # (and polars: reading an entry needs both)

    st = os.stat(pq)
    if not stat.S_ISREG(st.st_mode):
        return f"{pq.name} is {_kind(st.st_mode)}"
    raw = _read_file(mj, MAX_META_BYTES)
    head = orjson.loads(raw) if len(raw) <= MAX_META_BYTES else None
    if not isinstance(head, dict) or not isinstance(head.get("meta"), dict):
        return "its metadata is not an entry's"
    if head.get("key") != key or head.get("layout") != LAYOUT:
        return "its metadata belongs to another entry"
    if head.get("meta_blake2b") != _digest(orjson.dumps(head["meta"])):
        return "its metadata fails its checksum"
    size = head.get("parquet_bytes")
    if type(size) is not int or size != st.st_size:
        return f"its Parquet file has {st.st_size:,} bytes, not as many as it was written with"
    if not read:
        got, digest = _digest_file(pq, size)
        if got != size:
            return f"its Parquet file has {got:,} bytes, not as many as it was written with"
        if head.get("parquet_blake2b") != digest:
            return "its Parquet file fails its checksum"
        return pq, TraceMeta.from_dict(head["meta"])
    data = _read_file(pq, size)  # the bytes checked are the bytes read
    if len(data) != size:
        return f"its Parquet file has {len(data):,} bytes, not as many as it was written with"
    if head.get("parquet_blake2b") != _digest(data):
        return "its Parquet file fails its checksum"
    import polars as pl

    return pl.read_parquet(io.BytesIO(data)), TraceMeta.from_dict(head["meta"])


def _digest_file(path: Path, limit: int) -> tuple[int, str]:
    """(bytes read, their blake2b) of the cache file ``path``, read in blocks, at most ``limit``
    + 1 bytes; opened as ``_read_file`` opens (NotAFile when it is not a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    except IsADirectoryError:
        raise NotAFile(f"{path.name} is a directory") from None
    with open(fd, "rb", closefd=True) as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(f"{path.name} is {_kind(mode)}")
        h, n = hashlib.blake2b(digest_size=32), 0
        while n <= limit and (block := fh.read(min(HASH_BLOCK, limit + 1 - n))):
            h.update(block)
            n += len(block)
    return n, h.hexdigest()


def drop(key: str, root: Path | None = None) -> None:
    """Remove the entry stored under ``key`` (what can be removed)."""
    for p in _entry(root or cache_dir(), key):
        _remove(p)


def _remove(p: Path) -> None:
    """Remove a cache file, or an empty directory in its place; leave what cannot be removed."""
    try:
        p.unlink()
    except (IsADirectoryError, PermissionError):  # a directory (Linux says EISDIR, macOS EPERM)
        try:
            p.rmdir()
        except OSError:
            pass
    except OSError:
        pass


def put(key: str, df: pl.DataFrame, meta: TraceMeta, root: Path | None = None) -> None:
    """Store an entry: the Parquet file is written to its temporary name and hashed, the
    metadata (with the checksums) is written, and the Parquet file, which marks the entry
    complete, is renamed last.  OSError when the cache cannot be written."""
    pq, mj = _entry(root or cache_dir(), key)
    meta_dict = meta.to_dict()

    def write(tmp: str) -> None:
        df.write_parquet(tmp, compression="zstd", compression_level=1, statistics=False)
        head = {
            "layout": LAYOUT,
            "key": key,
            "parquet_bytes": os.stat(tmp).st_size,
            "parquet_blake2b": _file_digest(tmp),
            "meta_blake2b": _digest(orjson.dumps(meta_dict)),
            "meta": meta_dict,
        }
        write_bytes(mj, orjson.dumps(head))

    write_with(pq, write)


def sweep(root: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove the temporary files that killed runs left in the cache: only the cache's own
    (write_with's names for the cache's file names) and only stale ones - untouched for
    STALE_TEMP_S, or for DEAD_TEMP_S when the process that wrote it is gone.  Returns what it
    removed; a directory that cannot be read is left alone."""
    root = root or cache_dir()
    now = time.time() if now is None else now
    removed = []
    for d in (root, root / "stat"):
        try:
            with os.scandir(d) as it:
                names = [e for e in it if e.name.endswith(".tmp")]
        except OSError:
            continue
        for e in names:
            owner = temp_owner(e.name)
            if owner is None or not _CACHE_NAME.fullmatch(owner[0]):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            age = now - st.st_mtime
            if not stat.S_ISREG(st.st_mode) or not (age > STALE_TEMP_S or (age > DEAD_TEMP_S and not _alive(owner[1]))):
                continue
            try:
                os.unlink(e.path)
                removed.append(Path(e.path))
            except OSError:
                pass
    return removed


def _alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live process here (unknown counts as alive)."""
    if pid is None or os.name == "nt":  # Windows' os.kill would end the process
        return True
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's live process
        return True
    return True
