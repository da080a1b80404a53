"""Nsight Systems SQLite exports (FORMATS.md): what this release reads of them is the GPU
description (``TARGET_INFO_GPU``), so that a job's GPU can be told from its nsys export
(MFU.md 3.1).  The event tables are the nsys parser's (a later issue).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tracelens.errors import ParseError


def _connect(path: Path) -> sqlite3.Connection:
    try:
        return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
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
