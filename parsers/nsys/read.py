"""SQL pushed down to SQLite: one query per event table, only the columns the event table needs
and the process filter in the database, each table read as Arrow columns through ADBC's SQLite
driver (``adbc-driver-sqlite``: no Python object per value), else through ``sqlite3`` in batches.

Names are not read per row: the event tables give ``StringIds`` ids (integers), and ``strings``
reads the text of the ids they use once, a small id -> name frame that ``normalise`` maps
through (the names then held as Categorical codes).  Only NVTX's ``text`` is text per row.

Every value is type-checked in SQL (``typeof``): SQLite stores whatever a column is given, so an
integer column may hold text or a blob in a damaged export; such a value reads as NULL, and the
row it leaves without a start, an end or a device is dropped (and counted) by ``normalise``.

Both readers give the same frame.  ADBC infers a column's Arrow type from its first batch of
rows and passes text through unchecked: a table it refuses (a text column whose first batch is
all NULL, ...) or whose text is not valid UTF-8 is read again through ``sqlite3``, which then
reads the invalid text the way ``parse`` handles it (the lenient retry, ``sqlite3`` only).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from importlib.util import find_spec

import polars as pl

from .schema import Probe, _quote

# optional at run time (without it every table is read through sqlite3), imported when a big
# export is first read through it (``Db._adbc``): ~25 ms that a small export does not pay
_HAVE_ADBC = find_spec("adbc_driver_sqlite") is not None and find_spec("adbc_driver_manager") is not None

BATCH = 1 << 16  # rows per fetchmany: bounded Python objects at a time
ADBC = _HAVE_ADBC  # tests set this False to read through sqlite3 only
# ADBC's reads win from about this size up; below it, its fixed cost (~25 ms to import, the
# driver's load, ~10 ms a query) is more than what it saves (0.58 MB export: 0.23 s vs 0.08 s)
ADBC_MIN_BYTES = 16 << 20

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


class Db:
    """The export open for reading: ``con`` (sqlite3: the small queries, and every table when ADBC
    is not installed, refuses a table, or text must be read leniently) and, opened on first use,
    an ADBC connection to the same read-only immutable URI."""

    def __init__(self, con: sqlite3.Connection, uri: str | None = None):
        self.con = con
        self.uri = uri
        self.lenient = False
        self._db = self._conn = None
        self.fallbacks = 0  # tables ADBC refused (read through sqlite3 instead)
        self._bytes: int | None = None

    def _adbc(self):
        if self._conn is None:
            import adbc_driver_manager
            import adbc_driver_sqlite

            self._db = adbc_driver_sqlite.connect(self.uri)
            self._conn = adbc_driver_manager.AdbcConnection(self._db)
        return self._conn

    def _size(self) -> int:
        """The database's size in bytes (its pages: no stat of a path)."""
        if self._bytes is None:
            try:
                pages = self.con.execute("PRAGMA page_count").fetchone()[0]
                self._bytes = int(pages) * int(self.con.execute("PRAGMA page_size").fetchone()[0])
            except (sqlite3.Error, TypeError, ValueError):
                self._bytes = 0
        return self._bytes

    def close(self) -> None:
        for h in (self._conn, self._db):
            if h is not None:
                h.close()
        self._conn = self._db = None

    def execute(self, sql: str, params: tuple = ()):
        return self.con.execute(sql, params)

    def frame(self, sql: str, schema: dict[str, pl.DataType], progress: Callable[[int], None] | None = None) -> pl.DataFrame:
        """The rows of ``sql`` (no parameters) as a frame of ``schema`` (its column order)."""
        if ADBC and self.uri is not None and not self.lenient and self._size() >= ADBC_MIN_BYTES:
            try:
                df = self._arrow(sql, schema)
            except (MemoryError, KeyboardInterrupt):
                raise
            except Exception:  # a type ADBC did not infer, text that is not UTF-8: the sqlite3 path decides
                self.fallbacks += 1
            else:
                if progress is not None:
                    progress(df.height)
                return df
        return _fetch(self.con, sql, schema, (), progress)

    def _arrow(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        # text as BLOB: ADBC hands text over unchecked, polars' Binary -> String cast checks the UTF-8
        cols = ", ".join(f"CAST({_quote(n)} AS BLOB) AS {_quote(n)}" if dt == pl.String else _quote(n) for n, dt in schema.items())
        import adbc_driver_manager

        st = adbc_driver_manager.AdbcStatement(self._adbc())
        try:
            # batches of BATCH rows (the driver's default, 1024, leaves a thousand chunks per million rows); a
            # column's type is inferred from the first batch
            st.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH)})
            st.set_sql_query(f"SELECT {cols} FROM ({sql})")
            stream, _ = st.execute_query()
            df = pl.DataFrame(stream)
        finally:
            st.close()
        return df.select(pl.col(n).cast(dt) for n, dt in zip(df.columns, schema.values())).rename(dict(zip(df.columns, schema)))


def fetch(con: sqlite3.Connection, sql: str, schema: dict[str, pl.DataType], params: tuple = (),
          progress: Callable[[int], None] | None = None) -> pl.DataFrame:
    """The rows of ``sql`` as a frame of ``schema`` (its column order), fetched in batches through sqlite3."""
    return _fetch(con, sql, schema, params, progress)


def lenient_text(db: Db) -> None:
    """Read text that is not valid UTF-8 with replacement characters (what ``parse`` falls back to
    when the fast decoder refuses a string: a Python call per text value, sqlite3 only, from then on)."""
    db.lenient = True
    db.con.text_factory = lambda b: b.decode("utf-8", "replace")


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
        del rows
        parts.append(pl.DataFrame([pl.Series(n, c, dtype=schema[n], strict=False) for n, c in zip(names, cols)]))
        del cols
        if progress is not None:
            progress(parts[-1].height)
    if not parts:
        return pl.DataFrame(schema=schema)
    return pl.concat(parts, how="vertical", rechunk=True) if len(parts) > 1 else parts[0]


def strings(db: Db, ids: pl.Series) -> pl.DataFrame:
    """``StringIds``: (id, value) of the ``ids`` whose value is text, the names the event tables
    refer to, read once (of an id given twice, its first row, as a lookup by id would find)."""
    schema = {"id": pl.Int64, "value": pl.String}
    ids = ids.drop_nulls().unique().sort()
    parts = []
    for i in range(0, ids.len(), 1 << 20):  # the ids as a JSON array literal (integers only), a million at a time
        arr = "[" + ",".join(map(str, ids.slice(i, 1 << 20).to_list())) + "]"
        sql = (f"SELECT s.id AS id, {_text('s.value')} AS value FROM StringIds s WHERE typeof(s.id) = 'integer' "
               f"AND s.id IN (SELECT value FROM json_each('{arr}')) ORDER BY s.rowid")
        parts.append(db.frame(sql, schema))
    if not parts:
        return pl.DataFrame(schema=schema)
    out = pl.concat(parts) if len(parts) > 1 else parts[0]
    return out.unique(subset="id", keep="first", maintain_order=True).drop_nulls("value")


# ---- the tables ------------------------------------------------------------------------------
# Each returns its rows with the dtypes the event table holds them in; a name is a StringIds id
# (``name_id``, kernels: ``name_id0..2``, demangled, short and mangled; NVTX: ``text`` and ``text_id``).

_DEVICE_SCHEMA = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64}
KERNEL_NAME_IDS = ("demangledName", "shortName", "mangledName")  # the first that names a text string is the name


_ALL = {"proc": pl.Int64, "pid": pl.Int64}  # the process columns of the tables read for every process


def _device_cols(p: Probe, table: str) -> list[str]:
    return [_int("t.start", "ts_ns"), _int("t.end", "end_ns"), _int("t.deviceId", "device"), _int("t.streamId", "stream"),
            _int("t.correlationId", "correlation")]


def _proc_cols() -> list[str]:
    return [PROC.format(c="t.globalPid") + " AS proc", PID.format(c="t.globalPid") + " AS pid"]


def _opt_int(p: Probe, table: str, col: str, alias: str) -> str:
    return _int(f"t.{col}", alias) if p.col(table, col) else f"NULL AS {alias}"


def _proc_filter(p: Probe, table: str, column: str, proc: int | None) -> str:
    """The WHERE clause keeping one process's rows (``proc``: its ``id >> 24``, an integer from the export)."""
    return f"WHERE {PROC.format(c='t.' + column)} IS {'NULL' if proc is None else int(proc)}"


def _gpu_where(p: Probe, table: str, proc) -> str:
    """Every process's rows (``proc`` is ``...``), else one process's (the process known: a part)."""
    return "" if proc is ... else _proc_filter(p, table, "globalPid", proc)


def kernels(db: Db, p: Probe, progress=None, proc=...) -> pl.DataFrame:
    """Every process's kernels (``proc``, ``pid``: ``gpu_processes`` picks the rank, ``of_process`` keeps its rows);
    with ``proc``, that process's alone (a part of an export of several ranks: its process is known)."""
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    schema = {**_DEVICE_SCHEMA, **{f"name_id{i}": pl.Int64 for i in range(len(KERNEL_NAME_IDS))}, **_ALL}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    ids = [_opt_int(p, t, c, f"name_id{i}") for i, c in enumerate(KERNEL_NAME_IDS)]
    return db.frame(f"SELECT {', '.join(_device_cols(p, t) + ids + _proc_cols())} FROM {t} t {_gpu_where(p, t, proc)}", schema,
                    progress)


def memcpys(db: Db, p: Probe, progress=None, proc=...) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    schema = {**_DEVICE_SCHEMA, "bytes": pl.Int64, "copy_kind": pl.Int64, "src_kind": pl.Int64, "dst_kind": pl.Int64, **_ALL}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _device_cols(p, t) + [_opt_int(p, t, "bytes", "bytes"), _opt_int(p, t, "copyKind", "copy_kind"),
                                 _opt_int(p, t, "srcKind", "src_kind"), _opt_int(p, t, "dstKind", "dst_kind")] + _proc_cols()
    return db.frame(f"SELECT {', '.join(cols)} FROM {t} t {_gpu_where(p, t, proc)}", schema, progress)


def memsets(db: Db, p: Probe, progress=None, proc=...) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    schema = {**_DEVICE_SCHEMA, "bytes": pl.Int64, "mem_kind": pl.Int64, **_ALL}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _device_cols(p, t) + [_opt_int(p, t, "bytes", "bytes"), _opt_int(p, t, "memKind", "mem_kind")] + _proc_cols()
    return db.frame(f"SELECT {', '.join(cols)} FROM {t} t {_gpu_where(p, t, proc)}", schema, progress)


def of_process(df: pl.DataFrame, proc: int | None) -> pl.DataFrame:
    """The rows of one process (``proc IS ?``, a NULL process matching NULL) of a table read for every process."""
    return df.filter(pl.col("proc").eq_missing(proc)).drop(*_ALL)


def syncs(db: Db, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    schema = {**_DEVICE_SCHEMA, "sync_type": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _device_cols(p, t) + [_opt_int(p, t, "syncType", "sync_type")]
    return db.frame(f"SELECT {', '.join(cols)} FROM {t} t {_proc_filter(p, t, 'globalPid', proc)}", schema, progress)


_HOST_SCHEMA = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "name_id": pl.Int64}
# event classes that are not calls: CUDA backtrace records (a copy of each call when backtraces are
# collected, same correlation id), the OSRT start/finish markers (ENUM_NSYS_EVENT_CLASS)
RUNTIME_NOT_CALLS = (67, 68, 69)
OSRT_NOT_CALLS = (31, 32)


def _host_cols() -> list[str]:
    return [_int("t.start", "ts_ns"), _int("t.end", "end_ns"), PID.format(c="t.globalTid") + " AS pid",
            TID.format(c="t.globalTid") + " AS tid"]


def runtime(db: Db, p: Probe, proc: int | None, progress=None) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    schema = {**_HOST_SCHEMA, "correlation": pl.Int64, "event_class": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema)
    cols = _host_cols() + [_int("t.nameId", "name_id"), _int("t.correlationId", "correlation"),
                           _opt_int(p, t, "eventClass", "event_class")]
    where = _proc_filter(p, t, "globalTid", proc)
    if p.col(t, "eventClass"):
        where += f" AND t.eventClass NOT IN ({', '.join(map(str, RUNTIME_NOT_CALLS))})"
    return db.frame(f"SELECT {', '.join(cols)} FROM {t} t {where}", schema, progress)


def host_calls(db: Db, p: Probe, table: str, proc: int | None, progress=None) -> pl.DataFrame:
    """OSRT_API, CUBLAS_EVENTS, CUDNN_EVENTS: (start, end, thread, name id)."""
    if not p.has(table):
        return pl.DataFrame(schema=_HOST_SCHEMA)
    where = _proc_filter(p, table, "globalTid", proc)
    if table == "OSRT_API" and p.col(table, "eventClass"):
        where += f" AND t.eventClass NOT IN ({', '.join(map(str, OSRT_NOT_CALLS))})"
    cols = _host_cols() + [_int("t.nameId", "name_id")]
    return db.frame(f"SELECT {', '.join(cols)} FROM {table} t {where}", _HOST_SCHEMA, progress)


NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE, NVTX_MARK = 59, 60, 75, 34


def nvtx(db: Db, p: Probe, proc: int | None, progress=None) -> tuple[pl.DataFrame, dict[int, str], int]:
    """The NVTX ranges of the process (push/pop and start/end; ``text``, else the registered string
    of ``text_id``), the names of its domains (domain id -> name), and its number of marks."""
    t = "NVTX_EVENTS"
    schema = {"ts_ns": pl.Int64, "end_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "text": pl.String, "text_id": pl.Int64,
              "event_type": pl.Int64, "domain": pl.Int64}
    if not p.has(t):
        return pl.DataFrame(schema=schema), {}, 0
    text = f"{_text('t.text')} AS text" if p.col(t, "text") else "NULL AS text"
    dom = _int("t.domainId", "domain") if p.col(t, "domainId") else "0 AS domain"
    where = _proc_filter(p, t, "globalTid", proc)
    sql = (f"SELECT {', '.join(_host_cols())}, {text}, {_opt_int(p, t, 'textId', 'text_id')}, t.eventType AS event_type, {dom} "
           f"FROM {t} t {where} AND t.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END})")
    ranges = db.frame(sql, schema, progress)
    domains: dict[int, str] = {}
    if p.col(t, "domainId") and p.col(t, "text"):
        for d, n in db.execute(f"SELECT t.domainId, {_text('t.text')} FROM {t} t {where} AND t.eventType = {NVTX_DOMAIN_CREATE} "
                               "AND typeof(t.domainId) = 'integer'"):
            if isinstance(n, str):
                domains[d] = n
    marks = db.execute(f"SELECT count(*) FROM {t} t {where} AND t.eventType = {NVTX_MARK}").fetchone()[0]
    return ranges, domains, marks


# ---- processes, threads, environment ---------------------------------------------------------

def gpu_processes(kernels: pl.DataFrame, memcpys: pl.DataFrame, memsets: pl.DataFrame) -> list[tuple[int | None, int, int]]:
    """(process, pid, GPU busy ns summed over its kernels) per process with GPU work (kernels, copies
    or fills), the busiest first (by kernel time, then by kernel, copy and fill time, then process)."""
    busy = pl.when(pl.col("end_ns") > pl.col("ts_ns")).then(pl.col("end_ns").cast(pl.Float64) - pl.col("ts_ns").cast(pl.Float64))
    parts = [f.select("proc", "pid", busy.fill_null(0.0).alias("d"), pl.lit(k).alias("k"))
             for f, k in ((kernels, True), (memcpys, False), (memsets, False)) if f.height]
    if not parts:
        return []
    g = (pl.concat(parts).group_by("proc")
         .agg(pl.col("pid").max(), pl.col("d").filter(pl.col("k")).sum().alias("kt"), pl.col("d").sum().alias("all"))
         .sort(["kt", "all", "proc"], descending=[True, True, False], nulls_last=False))
    return [(r[0], r[1], int(r[2])) for r in g.select("proc", "pid", "kt").iter_rows()]


def gpu_processes_sql(con: sqlite3.Connection, p: Probe) -> list[tuple[int | None, int, int]]:
    """``gpu_processes`` computed in SQLite, without reading the tables (``tracelens info``): the
    sums are ``total()`` (a float: a damaged export's huge times cannot overflow them)."""
    parts = []
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if p.has(t):
            parts.append(f"SELECT {PROC.format(c='globalPid')} AS proc, {PID.format(c='globalPid')} AS pid, "
                         f"CASE WHEN typeof(start) = 'integer' AND typeof(end) = 'integer' AND end > start "
                         f"THEN end - start ELSE 0 END AS d, {int(t.endswith('KERNEL'))} AS k FROM {t}")
    if not parts:
        return []
    sql = (f"SELECT proc, max(pid), total(CASE WHEN k = 1 THEN d ELSE 0 END) AS kt, total(d) FROM ({' UNION ALL '.join(parts)}) "
           "GROUP BY proc ORDER BY kt DESC, 4 DESC, proc")
    return [(r[0], r[1], int(r[2])) for r in con.execute(sql)]


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
