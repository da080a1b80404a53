"""The ranks inside one export: one per (process, device) that ran kernels (FORMATS.md 1.3, 1.5).

``nsys profile torchrun --nproc-per-node 8 ...`` writes ONE export holding eight ranks (eight
processes, one GPU each), and one process may drive several GPUs.  ``listing`` finds those
pairs with one aggregate query over the GPU activity tables (their ``globalPid`` and
``deviceId``, grouped in SQLite), in a fixed order: by pid, then device.  A process's copies and
fills on a device where it ran no kernel make no rank of their own (when no process ran any
kernel, copies and fills are what makes the pairs).

What a part holds (``parsers.nsys.parse(path, part=...)``, ``parts(path)`` lists them): the kernels, copies, fills and
synchronisation records of its process on its device; the host rows of its process (CUDA calls,
NVTX ranges, OS runtime, cuBLAS/cuDNN calls), except the CUDA calls that launched work on the
process's other devices (those belong to the part of that device).  A process driving two GPUs
is two parts that share its NVTX ranges, OS calls and other host calls.

The rank of a part: its process's ``RANK`` (or ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``,
``SLURM_PROCID``, ``LOCAL_RANK``) where the export records that process's environment in a table
with a process column (``PROCESS_ENVIRONMENT``/``ENV`` with ``globalPid`` or ``pid``); nsys'
``META_DATA_CAPTURE`` holds only the launched process's environment (``torchrun``'s, not its
workers'), so it names no part's rank.  Without one the job's order gives it (with a warning).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .schema import ENVIRONMENT_TABLES, Probe, _quote

GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")  # kernels first
_PROC = "(globalPid >> 24)"


def listing(con: sqlite3.Connection, p: Probe) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(parts, left out): one dict per (process, device) with GPU work (``proc``: the globalPid's
    process bits, ``pid``, ``device``), the parts by pid then device; left out: the pairs with
    copies or fills but no kernel, when other pairs ran kernels.  One ``SELECT DISTINCT`` per
    table (SQLite's hash of the distinct pairs: a 2M-kernel table in 0.3 s, several times
    faster than a GROUP BY, which sorts)."""
    found: dict[str, set[tuple[int | None, int]]] = {}
    for t in GPU_TABLES:
        if p.has(t, "globalPid", "deviceId"):
            rows = con.execute(f"SELECT DISTINCT {_PROC}, deviceId FROM {t}")
            found[t] = {(q, d) for q, d in rows if type(d) is int and (q is None or type(q) is int)}
    kernels = found.get(GPU_TABLES[0], set())
    others = set().union(*(v for t, v in found.items() if t != GPU_TABLES[0]))
    use, left = (kernels, others - kernels) if kernels else (others, set())

    def rows(pairs: set[tuple[int | None, int]]) -> list[dict[str, Any]]:
        out = [{"proc": q, "pid": None if q is None else q & 0xFFFFFF, "device": d} for q, d in pairs]
        return sorted(out, key=lambda r: (r["pid"] is not None, r["pid"] or 0, r["proc"] or 0, r["device"]))

    return rows(use), rows(left)


def process_environment(con: sqlite3.Connection, p: Probe, proc: int | None, pid: int | None,
                        want: tuple[str, ...]) -> dict[str, str]:
    """The ``want`` variables of one process's environment, where a table records it per process
    (a ``PROCESS_ENVIRONMENT`` or ``ENV`` table of (name, value) with a ``globalPid`` or ``pid``
    column); empty when the export has none."""
    out: dict[str, str] = {}
    q = ", ".join("?" for _ in want)
    for t in ENVIRONMENT_TABLES:
        if not p.has(t, "name", "value"):
            continue
        if p.col(t, "globalPid"):
            where, arg = f"{_PROC} IS ?", proc
        elif p.col(t, "pid"):
            where, arg = "pid IS ?", pid
        else:
            continue
        for k, v in con.execute(f"SELECT name, value FROM {_quote(t)} WHERE {where} AND name IN ({q})", (arg, *want)):
            if isinstance(k, str) and v is not None:
                out.setdefault(k, unquote(str(v)))
    return out


def unquote(v: str) -> str:
    """An environment value as nsys writes it (``RANK="3"`` in META_DATA_CAPTURE), unquoted."""
    v = v.strip()
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v


def label(part: dict[str, Any]) -> str:
    return f"pid {part['pid']}, device {part['device']}"
