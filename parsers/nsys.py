"""Nsight Systems SQLite exports (FORMATS.md): what this release reads of them is the GPU
description (``TARGET_INFO_GPU``), so that a job's GPU can be told from its nsys export
(MFU.md 3.1).  The event tables are the nsys parser's (a later issue).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path
from stat import S_ISREG
from typing import Any

from tracelens.model.errors import ParseError, TraceInputError, UnreadableError


def sqlite_uri(path: Path) -> str:
    """A read-only SQLite URI for ``path``: the path percent-escaped (a ``#``, ``?`` or ``%`` in a
    name would otherwise end it or escape what follows), ``mode=ro`` (never creates a file) and
    ``immutable=1`` (no lock, journal or WAL files beside the export)."""
    return "file://" + urllib.parse.quote(os.path.abspath(path), safe="/") + "?mode=ro&immutable=1"


def _connect(path: Path) -> sqlite3.Connection:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise TraceInputError(str(path), "no such file") from None
    except OSError as e:
        raise UnreadableError(str(path), f"cannot open the SQLite export ({e.strerror or e})") from None
    if not S_ISREG(st.st_mode):
        raise ParseError(str(path), "not a regular file, so not an SQLite export")
    if st.st_size == 0:  # SQLite would take it for an empty database
        raise ParseError(str(path), "empty file, not an SQLite export")
    try:
        return sqlite3.connect(sqlite_uri(path), uri=True)
    except sqlite3.Error as e:
        raise ParseError(str(path), f"cannot open the SQLite export ({e})") from None


def target_gpus(path: str | Path) -> list[dict[str, Any]]:
    """The GPUs of ``TARGET_INFO_GPU`` as Kineto-style ``deviceProperties`` dicts (``id``, ``name``,
    ``numSms``, ``totalGlobalMem``, ``computeMajor``/``computeMinor``) plus ``memoryBandwidth``
    (bytes/s) and ``chipName``; empty when the export has no such table (older nsys, no CUDA)."""
    path = Path(path)
    con = _connect(path)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "TARGET_INFO_GPU" not in tables:
            return []
        cur = con.execute("SELECT * FROM TARGET_INFO_GPU")
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    except sqlite3.DatabaseError as e:
        raise ParseError(str(path), f"not a readable SQLite export ({e})") from None
    finally:
        con.close()
    out = []
    for r in rows:
        out.append({
            "id": r.get("id", r.get("cuDevice")),
            "name": r.get("name"),
            "numSms": r.get("smCount"),
            "totalGlobalMem": r.get("totalMemory"),
            "computeMajor": r.get("computeMajor"),
            "computeMinor": r.get("computeMinor"),
            "memoryBandwidth": r.get("memoryBandwidth"),
            "chipName": r.get("chipName"),
        })
    return out
