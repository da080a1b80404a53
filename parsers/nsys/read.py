"""SQL pushed down to SQLite: one query per event table, only the columns the event table needs,
the ``StringIds`` lookups and the process filter in the database, the rows fetched in batches
straight into polars columns (no Python work per row beyond what ``sqlite3`` does to hand them
over).

Every value is type-checked in SQL (``typeof``): SQLite stores whatever a column is given, so an
integer column may hold text or a blob in a damaged export; such a value reads as NULL, and the
row it leaves without a start, an end or a device is dropped (and counted) by ``normalise``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import polars as pl

from .schema import Probe, _quote

BATCH = 1 << 16  # rows per fetchmany: bounded Python objects at a time

# globalTid / globalPid are packed: pid = (id >> 24) & 0xFFFFFF, tid = id & 0xFFFFFF (FORMATS.md 1.3).
# A process is (id >> 24): the pid with the hardware/VM bits above it, the same for every thread of it.
PID = "(({c} >> 24) & 16777215)"
TID = "({c} & 16777215)"
PROC = "({c} >> 24)"


def _int(expr: str, alias: str) -> str:
    return f"CASE WHEN typeof({expr}) = 'integer' THEN {expr} END AS {alias}"


def _string(id_expr: str) -> str:
    """The StringIds value of an id column, NULL when the id is not an integer or not there."""
    return (f"(SELECT CASE WHEN typeof(value) = 'text' THEN value END FROM StringIds "
            f"WHERE id = CASE WHEN typeof({id_expr}) = 'integer' THEN {id_expr} END)")


def _text(expr: str) -> str:
    return f"CASE WHEN typeof({expr}) = 'text' THEN {expr} END"


def fetch(con: sqlite3.Connection, sql: str, schema: dict[str, pl.DataType], params: tuple = (),
          progress: Callable[[int], None] | None = None) -> pl.DataFrame:
    """The rows of ``sql`` as a frame of ``schema`` (its column order), fetched in batches."""
    return _fetch(con, sql, schema, params, progress)


def lenient_text(con: sqlite3.Connection) -> None:
    """Read text that is not valid UTF-8 with replacement characters (what ``parse`` falls back to
    when the fast decoder refuses a string: a Python call per text value from then on)."""
    con.text_factory = lambda b: b.decode("utf-8", "replace")


def _fetch(con: sqlite3.Connection, sql: str, schema: dict[str, pl.DataType], params: tuple,
           progress: Callable[[int], None] | None) -> pl.DataFrame:
    cur = con.execute(sql, params)
    names = list(schema)
    parts = []
    while True:
        rows = cur.fetchmany(BATCH)
        if not rows:
            break
        cols = list(zip(*rows))
        parts.append(pl.DataFrame([pl.Series(n, c, dtype=schema[n], strict=False) for n, c in zip(names, cols)]))
        if progress is not None:
            progress(len(rows))
    if not parts:
        return pl.DataFrame(schema=schema)
    return pl.concat(parts, how="vertical", rechunk=True) if len(parts) > 1 else parts[0]


# ---- the tables ------------------------------------------------------------------------------

_DEVICE_SCHEMA = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64}


def _device_cols(p: Probe, table: str) -> list[str]:
    return [_int("t.start", "ts_ns"), _int("t.end", "end_ns"), _int("t.deviceId", "device"), _int("t.streamId", "stream"),
            _int("t.correlationId", "correlation")]


def _opt_int(p: Probe, table: str, col: str, alias: str) -> str:
    return _int(f"t.{col}", alias) if p.col(table, col) else f"NULL AS {alias}"


def _proc_filter(p: Probe, table: str, column: str) -> str:
    """The WHERE clause keeping one process's rows (``?`` is its ``id >> 24``)."""
    return f"WHERE {PROC.format(c='t.' + column)} IS ?"


def kernels(con: sqlite3.Connection, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not p.has(t):
        return pl.DataFrame(schema={**_DEVICE_SCHEMA, "name": pl.String})
    ids = [f"t.{c}" for c in ("demangledName", "shortName", "mangledName") if p.col(t, c)]
    name = "coalesce(" + ", ".join(_string(i) for i in ids) + ")" if ids else "NULL"
    sql = f"SELECT {', '.join(_device_cols(p, t))}, {name} AS name FROM {t} t {_proc_filter(p, t, 'globalPid')}"
    return fetch(con, sql, {**_DEVICE_SCHEMA, "name": pl.String}, (proc,), progress)


def memcpys(con: sqlite3.Connection, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    schema = {**_DEVICE_SCHEMA, "bytes": pl.Int64, "copy_kind": pl.Int64, "src_kind": pl.Int64, "dst_kind": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _device_cols(p, t) + [_opt_int(p, t, "bytes", "bytes"), _opt_int(p, t, "copyKind", "copy_kind"),
                                 _opt_int(p, t, "srcKind", "src_kind"), _opt_int(p, t, "dstKind", "dst_kind")]
    return fetch(con, f"SELECT {', '.join(cols)} FROM {t} t {_proc_filter(p, t, 'globalPid')}", schema, (proc,), progress)


def memsets(con: sqlite3.Connection, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    schema = {**_DEVICE_SCHEMA, "bytes": pl.Int64, "mem_kind": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _device_cols(p, t) + [_opt_int(p, t, "bytes", "bytes"), _opt_int(p, t, "memKind", "mem_kind")]
    return fetch(con, f"SELECT {', '.join(cols)} FROM {t} t {_proc_filter(p, t, 'globalPid')}", schema, (proc,), progress)


def syncs(con: sqlite3.Connection, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    schema = {**_DEVICE_SCHEMA, "sync_type": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _device_cols(p, t) + [_opt_int(p, t, "syncType", "sync_type")]
    return fetch(con, f"SELECT {', '.join(cols)} FROM {t} t {_proc_filter(p, t, 'globalPid')}", schema, (proc,), progress)


_HOST_SCHEMA = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "name": pl.String}
# event classes that are not calls: CUDA backtrace records (a copy of each call when backtraces are
# collected, same correlation id), the OSRT start/finish markers (ENUM_NSYS_EVENT_CLASS)
RUNTIME_NOT_CALLS = (67, 68, 69)
OSRT_NOT_CALLS = (31, 32)


def _host_cols(name: str) -> list[str]:
    return [_int("t.start", "ts_ns"), _int("t.end", "end_ns"), PID.format(c="t.globalTid") + " AS pid",
            TID.format(c="t.globalTid") + " AS tid", f"{name} AS name"]


def runtime(con: sqlite3.Connection, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    schema = {**_HOST_SCHEMA, "correlation": pl.Int64, "event_class": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _host_cols(_string("t.nameId")) + [_int("t.correlationId", "correlation"), _opt_int(p, t, "eventClass", "event_class")]
    where = _proc_filter(p, t, "globalTid")
    if p.col(t, "eventClass"):
        where += f" AND t.eventClass NOT IN ({', '.join(map(str, RUNTIME_NOT_CALLS))})"
    return fetch(con, f"SELECT {', '.join(cols)} FROM {t} t {where}", schema, (proc,), progress)


def host_calls(con: sqlite3.Connection, p: Probe, table: str, proc: int | None, progress=None) -> pl.DataFrame:
    """OSRT_API, CUBLAS_EVENTS, CUDNN_EVENTS: (start, end, thread, name)."""
    if not p.has(table):
        return pl.DataFrame(schema=_HOST_SCHEMA)
    where = _proc_filter(p, table, "globalTid")
    if table == "OSRT_API" and p.col(table, "eventClass"):
        where += f" AND t.eventClass NOT IN ({', '.join(map(str, OSRT_NOT_CALLS))})"
    return fetch(con, f"SELECT {', '.join(_host_cols(_string('t.nameId')))} FROM {table} t {where}", _HOST_SCHEMA, (proc,), progress)


NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE, NVTX_MARK = 59, 60, 75, 34


def nvtx(con: sqlite3.Connection, p: Probe, proc: int | None, progress=None) -> tuple[pl.DataFrame, dict[int, str], int]:
    """The NVTX ranges of the process (push/pop and start/end; ``text``, else the registered string
    of ``textId``), the names of its domains (domain id -> name), and its number of marks."""
    t = "NVTX_EVENTS"
    schema = {**_HOST_SCHEMA, "event_type": pl.Int64, "domain": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema), {}, 0
    parts = [_text("t.text")] if p.col(t, "text") else []
    if p.col(t, "textId"):
        parts.append(_string("t.textId"))
    name = "coalesce(" + ", ".join(parts) + ")" if parts else "NULL"
    dom = _int("t.domainId", "domain") if p.col(t, "domainId") else "0 AS domain"
    where = _proc_filter(p, t, "globalTid")
    sql = (f"SELECT {', '.join(_host_cols(name))}, t.eventType AS event_type, {dom} FROM {t} t "
           f"{where} AND t.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END})")
    ranges = fetch(con, sql, schema, (proc,), progress)
    domains: dict[int, str] = {}
    if p.col(t, "domainId") and p.col(t, "text"):
        for d, n in con.execute(f"SELECT t.domainId, {_text('t.text')} FROM {t} t {where} AND t.eventType = {NVTX_DOMAIN_CREATE} "
                                "AND typeof(t.domainId) = 'integer'", (proc,)):
            if isinstance(n, str):
                domains[d] = n
    marks = con.execute(f"SELECT count(*) FROM {t} t {where} AND t.eventType = {NVTX_MARK}", (proc,)).fetchone()[0]
    return ranges, domains, marks


# ---- processes, threads, environment ---------------------------------------------------------

def gpu_processes(con: sqlite3.Connection, p: Probe) -> list[tuple[int | None, int, int]]:
    """(process, pid, GPU busy ns summed over its kernels, copies and fills) per process with GPU work,
    the busiest first."""
    parts = []
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if p.has(t):
            parts.append(f"SELECT {PROC.format(c='globalPid')} AS proc, {PID.format(c='globalPid')} AS pid, "
                         f"CASE WHEN typeof(start) = 'integer' AND typeof(end) = 'integer' AND end > start "
                         f"THEN end - start ELSE 0 END AS d, {int(t.endswith('KERNEL'))} AS k FROM {t}")
    if not parts:
        return []
    sql = (f"SELECT proc, max(pid), sum(CASE WHEN k = 1 THEN d ELSE 0 END) AS kt, sum(d) FROM ({' UNION ALL '.join(parts)}) "
           "GROUP BY proc ORDER BY kt DESC, 4 DESC, proc")
    return [(r[0], r[1], r[2]) for r in con.execute(sql)]


def busiest_host_process(con: sqlite3.Connection, p: Probe) -> int | None:
    """The process with the most NVTX ranges, runtime and OS calls (an export without GPU work)."""
    parts = [f"SELECT {PROC.format(c='globalTid')} AS proc FROM {t}" for t in
             ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API", "CUBLAS_EVENTS", "CUDNN_EVENTS") if p.has(t)]
    if not parts:
        return None
    row = con.execute(f"SELECT proc, count(*) AS n FROM ({' UNION ALL '.join(parts)}) WHERE proc IS NOT NULL "
                      "GROUP BY proc ORDER BY n DESC, proc LIMIT 1").fetchone()
    return row[0] if row else None


def threads(con: sqlite3.Connection, p: Probe, proc: int | None) -> dict[str, str]:
    if not p.has("ThreadNames") or proc is None:
        return {}
    sql = (f"SELECT {PID.format(c='t.globalTid')}, {TID.format(c='t.globalTid')}, {_string('t.nameId')} FROM ThreadNames t "
           f"WHERE {PROC.format(c='t.globalTid')} IS ?")
    return {f"{a}:{b}": n for a, b, n in con.execute(sql, (proc,)) if isinstance(n, str)}


def process_name(con: sqlite3.Connection, p: Probe, proc: int | None) -> str | None:
    if not p.has("PROCESSES", "name") or proc is None:
        return None
    row = con.execute(f"SELECT {_text('name')} FROM PROCESSES WHERE {PROC.format(c='globalPid')} IS ? LIMIT 1", (proc,)).fetchone()
    return row[0] if row else None


RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def environment(con: sqlite3.Connection, p: Probe) -> dict[str, str]:
    """The rank and world-size variables of the profiled process's environment, as far as the
    export records it: ``META_DATA_CAPTURE`` (``PROCESS_n:ENVIRONMENT_VARIABLE`` rows, "KEY=VALUE"),
    or a ``PROCESS_ENVIRONMENT`` / ``ENV`` table of (name, value).  Only those variables are read
    (an environment holds much else)."""
    want = RANK_VARS + WORLD_VARS
    out: dict[str, str] = {}
    if p.has("META_DATA_CAPTURE", "name", "value"):
        like = " OR ".join("value LIKE ?" for _ in want)
        rows = con.execute(f"SELECT name, value FROM META_DATA_CAPTURE WHERE typeof(value) = 'text' AND typeof(name) = 'text' "
                           f"AND name LIKE '%ENVIRONMENT%' AND ({like}) ORDER BY name", tuple(f"{v}=%" for v in want))
        for _, v in rows:
            k, _, val = v.partition("=")
            if k in want:
                out.setdefault(k, val.strip())
    for t in ("PROCESS_ENVIRONMENT", "ENV"):
        if p.has(t, "name", "value"):
            q = ", ".join("?" for _ in want)
            for k, v in con.execute(f"SELECT name, value FROM {_quote(t)} WHERE name IN ({q})", want):
                if isinstance(k, str) and v is not None:
                    out.setdefault(k, str(v).strip())
    return out


def session_start(con: sqlite3.Connection, p: Probe) -> int | None:
    if not p.has("TARGET_INFO_SESSION_START_TIME"):
        return None
    row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME WHERE typeof(utcEpochNs) = 'integer' LIMIT 1").fetchone()
    return row[0] if row else None


def cuda_device_map(con: sqlite3.Connection, p: Probe, pid: int | None) -> dict[int, int]:
    """TARGET_INFO_CUDA_DEVICE (nsys 2025.1+): the process's CUDA ordinal -> the GPU id of TARGET_INFO_GPU."""
    if not p.has("TARGET_INFO_CUDA_DEVICE") or pid is None:
        return {}
    rows = con.execute("SELECT cudaId, gpuId FROM TARGET_INFO_CUDA_DEVICE WHERE pid IS ? AND typeof(cudaId) = 'integer' "
                       "AND typeof(gpuId) = 'integer'", (pid,))
    return dict(rows.fetchall())
