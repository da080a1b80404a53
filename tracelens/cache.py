"""Parse cache: each parsed file is kept as Parquet (events) + JSON (TraceMeta), keyed by a
hash of the file's bytes and the parser's version, so a second open is near-instant.

A small stat index (path, size, mtime) -> content hash spares re-hashing unchanged files.
Everything is written to a temporary name and renamed, so a killed run never leaves a
half-written entry; the Parquet file is renamed last and is what marks an entry complete.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import polars as pl

from tracelens.atomic import write_bytes, write_with
from tracelens.schema import TraceMeta

HASH_BLOCK = 1 << 22


def cache_dir() -> Path:
    env = os.environ.get("TRACELENS_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "tracelens"


def content_hash(path: Path) -> str:
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _stat_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()
    return hashlib.blake2b(ident, digest_size=16).hexdigest()


def file_hash(path: Path, root: Path | None = None) -> str:
    """Content hash of ``path``, taken from the stat index when the file has not changed."""
    root = root or cache_dir()
    idx = root / "stat" / _stat_key(path)
    try:
        h = idx.read_text().strip()
        if len(h) == 40:
            return h
    except OSError:
        pass
    h = content_hash(path)
    try:
        write_bytes(idx, h.encode())
    except OSError:
        pass
    return h


def _entry(root: Path, key: str) -> tuple[Path, Path]:
    return root / f"{key}.parquet", root / f"{key}.meta.json"


def get(key: str, root: Path | None = None) -> tuple[pl.DataFrame, TraceMeta] | None:
    pq, mj = _entry(root or cache_dir(), key)
    if not pq.exists() or not mj.exists():
        return None
    try:
        meta = TraceMeta.from_dict(orjson.loads(mj.read_bytes()))
        df = pl.read_parquet(pq)
    except Exception:  # a damaged cache entry is a cache miss, never an error
        return None
    return df, meta


def put(key: str, df: pl.DataFrame, meta: TraceMeta, root: Path | None = None) -> None:
    """Store an entry: the metadata first, the Parquet file (which marks it complete) last."""
    pq, mj = _entry(root or cache_dir(), key)
    write_bytes(mj, orjson.dumps(meta.to_dict()))
    write_with(pq, lambda tmp: df.write_parquet(tmp, compression="zstd", compression_level=1, statistics=False))
