"""Nsight Systems SQLite exports (``nsys export --type sqlite``; FORMATS.md 1): the whole event
table, as from a Kineto trace, so that nothing downstream knows which source a rank came from.

``schema``     probes the tables and columns (nsys 2021.x to 2025.x differ), one warning naming
               what was missing
``split``      the ranks inside one export: one per (process, device) with kernels
``read``       one SQL query per table, pushed down to SQLite (columns, process filter), read as
               Arrow through ADBC (sqlite3 where ADBC refuses); names as ``StringIds`` ids, read once
``payload``    NCCL's typed NVTX payloads (communicator, size, ranks), decoded in polars
``normalise``  those frames -> ``EVENT_SCHEMA`` (kinds, names and kernel classes as Kineto's)

Ranks: one per (process, device) that ran kernels (``split``).  An export of one such pair is
one rank (``parse(path)``); one of several (``nsys profile torchrun ...``: one process per GPU,
or a process driving several GPUs) is several ranks: ``parts(path)`` lists them and
``parse(path, part=...)`` reads one, so that the store gives each its own handle, cache entry and
rank.  ``parse(path)`` of such an export still reads one rank, the process with the most kernel
time, and a warning names the others.  The rank number comes from the process's environment
where the export records it (``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``,
``LOCAL_RANK``), else from the file name (an export of one rank) or the order
(tracelens.store.ranks).  Collectives: NCCL kernels are ``comm`` by name;
NCCL's NVTX ranges (domain ``NCCL``) are the collective records carried onto them; their typed
payloads (NCCL >= 2.16 in recent nsys, ``payload``) give each its communicator, size and ranks,
and the sequence numbers are each collective's order within its communicator and type on the
rank (within its type alone without payloads, said in a warning; ``attributes["seq_source"]``).

The export is opened read-only through an escaped ``immutable`` URI: no journal, WAL or lock
file is ever created beside it.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from stat import S_ISREG
from typing import TYPE_CHECKING, Any

import polars as pl

from tracelens.model.errors import NotATrace, ParseError, TraceInputError, UnreadableError

if TYPE_CHECKING:
    from tracelens.model.schema import TraceMeta

__all__ = ["NAME", "PARSER_VERSION", "describe", "parse", "parts", "sqlite_uri", "target_gpus"]


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
        return _gpu_dicts(con)
    except sqlite3.DatabaseError as e:
        raise ParseError(str(path), f"not a readable SQLite export ({e})") from None
    finally:
        con.close()


def describe(path: str | Path) -> dict[str, Any]:
    """What an export holds, for ``tracelens info``: its tables with their row counts (the
    ``ENUM_*`` lookup tables left out), the nsys version and export schema, the capture range
    (``ANALYSIS_DETAILS``' start and stop, else the first start and last end of its event
    tables; ns on the export's clock, and the session's UTC start), and the processes that ran
    GPU work (kernels, copies, fills) with their devices.  ParseError on a file that is not a
    readable nsys export.  Only counts and aggregates are read, in SQL."""
    from . import read
    from .schema import EVENT_TABLES, _quote

    path = Path(path)
    con = _connect(path)
    try:
        p = _probed(con, path)
        names = sorted(t for t in p.all_tables if not t.startswith("ENUM_"))
        kinds = dict(con.execute("SELECT name, type FROM sqlite_master"))
        tables = {}
        for t in names:
            if kinds.get(t) == "table":
                tables[t] = con.execute(f"SELECT count(*) FROM {_quote(t)}").fetchone()[0]
        capture = {"start_ns": None, "end_ns": None, "source": None, "session_start_utc_ns": read.session_start(con, p)}
        if "ANALYSIS_DETAILS" in p.all_tables:
            cols = {r[1] for r in con.execute("PRAGMA table_info(ANALYSIS_DETAILS)")}
            if {"startTime", "stopTime"} <= cols:
                row = con.execute("SELECT min(startTime), max(stopTime) FROM ANALYSIS_DETAILS WHERE typeof(startTime) = "
                                  "'integer' AND typeof(stopTime) = 'integer'").fetchone()
                if row and row[0] is not None:
                    capture.update(start_ns=row[0], end_ns=row[1], source="ANALYSIS_DETAILS")
        if capture["source"] is None:
            spans = [f"SELECT min(start) AS lo, max(end) AS hi FROM {t} WHERE typeof(start) = 'integer' AND "
                     "typeof(end) = 'integer'" for t in EVENT_TABLES if p.has(t)]
            if spans:
                row = con.execute(f"SELECT min(lo), max(hi) FROM ({' UNION ALL '.join(spans)})").fetchone()
                if row and row[0] is not None:
                    capture.update(start_ns=row[0], end_ns=row[1], source="events")
        procs = []
        for proc, pid, kernel_ns in read.gpu_processes_sql(con, p):
            procs.append({"pid": pid, "name": read.process_name(con, p, proc), "kernel_ns": kernel_ns,
                          "devices": _process_devices(con, p, proc)})
        return {"path": str(path), "format": NAME, "nsys_version": p.version, "export_schema": p.schema_version,
                "tables": tables, "capture": capture, "gpu_processes": procs}
    except sqlite3.DatabaseError as e:
        raise ParseError(str(path), f"not a readable SQLite export ({_one_line(e)})") from None
    finally:
        con.close()


def _process_devices(con: sqlite3.Connection, p, proc: int | None) -> list[int]:
    """The device ids a process's kernels, copies and fills ran on."""
    from .read import PROC

    parts = [f"SELECT deviceId FROM {t} WHERE {PROC.format(c='globalPid')} IS ?" for t in
             ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if p.has(t)]
    if not parts:
        return []
    sql = f"SELECT DISTINCT deviceId FROM ({' UNION ALL '.join(parts)}) WHERE typeof(deviceId) = 'integer' ORDER BY 1"
    return [r[0] for r in con.execute(sql, (proc,) * len(parts))]


def _gpu_dicts(con: sqlite3.Connection) -> list[dict[str, Any]]:
    cur = con.execute("SELECT * FROM TARGET_INFO_GPU")
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r)) for r in cur.fetchall()]  # one row per GPU of the host
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


def _probed(con: sqlite3.Connection, path: Path):
    """The export's tables and columns (``schema.probe``); NotATrace when the database is not an
    Nsight Systems export."""
    from .schema import is_nsys, probe

    p = probe(con)
    if not is_nsys(p):
        raise NotATrace(str(path), "an SQLite database, but not an Nsight Systems export (no StringIds and export "
                                   "metadata tables): export the report with `nsys export --type sqlite`")
    return p


# ---- the parser ------------------------------------------------------------------------------

NAME = "nsys"  # the format name sniff() gives these files
PARSER_VERSION = "1.2"  # bump when the table a parse caches changes


def parts(path: str | Path) -> list[dict[str, Any]]:
    """The ranks this export holds: one per (process, device) that ran kernels (``index``, ``of``,
    ``proc``, ``pid``, ``device``; the first also ``left_out``: the pairs with copies or fills
    but no kernel), by pid then device; one ``SELECT DISTINCT`` per GPU table (in SQLite: no
    rows read).  A listing of one (or none) means the export is one rank: ``parse(path)``.
    ParseError on a file that is not a readable nsys export."""
    from .split import listing

    path = Path(path)
    con = _connect(path)
    try:
        p = _probed(con, path)
        found, left = listing(con, p)
    except TraceInputError:
        raise
    except sqlite3.DatabaseError as e:
        raise ParseError(str(path), f"not a readable SQLite export ({_one_line(e)})") from None
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:  # never let a malformed export surface as a traceback
        raise ParseError(str(path), f"unreadable nsys export ({type(e).__name__}: {_one_line(e)})") from e
    finally:
        con.close()
    n = len(found)
    return [{"index": k, "of": n, **r, **({"left_out": left} if k == 0 and left else {})} for k, r in enumerate(found)]


def parse(path: str | Path, *, keep_python: bool = False, keep_args: bool = True,
          progress: Callable[[int], None] | None = None, part: int | dict[str, Any] | None = None,
          ) -> tuple[pl.DataFrame, TraceMeta]:
    """Parse one nsys SQLite export into (event frame, TraceMeta); ParseError (one line) on a
    file that is not a readable nsys export.  ``keep_python`` and ``keep_args`` are the Kineto
    parser's options: nsys records neither Python frames nor op arguments.

    ``part``: one rank of an export that holds several (an entry of ``parts(path)``, or its
    index): that process's events on that device (``parsers.nsys.split`` says which host rows
    go with it).  Without it, the export is one rank: the process with most kernel time."""
    path = Path(path)
    if isinstance(part, int) and not isinstance(part, bool):
        listed = parts(path)
        if not 0 <= part < len(listed):
            raise ParseError(str(path), f"no part {part} in this export (it holds {len(listed)})")
        part = listed[part]
    from . import read

    db = read.Db(_connect(path), sqlite_uri(path))
    try:
        try:
            return _parse(db, path, progress, part)
        except sqlite3.DatabaseError as e:
            if "decode" not in str(e).lower():
                raise
        read.lenient_text(db)  # a string that is not UTF-8: read them all again, leniently
        df, meta = _parse(db, path, progress, part)
        meta.warnings.append("the export holds text that is not valid UTF-8: read with replacement characters")
        return df, meta
    except TraceInputError:
        raise
    except (MemoryError, KeyboardInterrupt):
        raise
    except sqlite3.DatabaseError as e:
        raise ParseError(str(path), f"not a readable SQLite export ({_one_line(e)})") from None
    except Exception as e:  # never let a malformed export surface as a traceback
        raise ParseError(str(path), f"unreadable nsys export ({type(e).__name__}: {_one_line(e)})") from e
    finally:
        db.close()
        db.con.close()


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _parse(db, path: Path, progress: Callable[[int], None] | None,
           part: dict[str, Any] | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    from collections import Counter

    from tracelens.model.schema import TraceMeta

    from ..kineto.link import _attach_comm_records, _device
    from ..kineto.normalise import _drop_far
    from . import normalise as nz
    from . import read
    from .schema import EVENT_TABLES

    spath = str(path)
    con = db.con
    p = _probed(con, path)
    if not any(t in p.tables for t in EVENT_TABLES):
        raise ParseError(spath, "an Nsight Systems export with no events: none of its tables holds kernels, copies, CUDA "
                                "calls, NVTX ranges or OS runtime calls (profile with `-t cuda,nvtx,osrt`)")
    size = path.stat().st_size
    meta = TraceMeta(path=spath, format=NAME, source=NAME, parser="tracelens.parsers.nsys", parser_version=PARSER_VERSION,
                     size_bytes=size, trace_schema=p.schema_version and f"export {p.schema_version}")
    w = p.warning()
    if w and (part is None or part["index"] == 0):  # the file's: said once, by its first part
        meta.warnings.append(w)
    done = [0]

    def step(n: int) -> None:  # progress in bytes of the file, spread over the rows read
        done[0] += n
        if progress is not None:
            progress(min(size, done[0] * 64))

    counts: Counter[str] = Counter()
    # the rank: one (process, device) of several (its process's GPU rows, the process filtered in
    # SQL); or the process with most kernel time, picked from the GPU tables of every process
    if part is not None:
        proc, pid = part["proc"], part["pid"]
        kernels, memcpys, memsets = (f(db, p, step, proc=proc) for f in (read.kernels, read.memcpys, read.memsets))
        meta.attributes["nsys_part"] = {k: part[k] for k in ("index", "of", "pid", "device")}
        left = part.get("left_out") or []
        if left:
            from .split import label

            meta.warnings.append(
                f"{len(left)} process/device pair(s) with copies or fills but no kernel make no rank (their copies and "
                "fills are not in the event table): " + ", ".join(label(q) for q in left[:6])
                + (f" and {len(left) - 6} more" if len(left) > 6 else ""))
    else:
        kernels, memcpys, memsets = read.kernels(db, p, step), read.memcpys(db, p, step), read.memsets(db, p, step)
        gpu_procs = read.gpu_processes(kernels, memcpys, memsets)
        if gpu_procs:
            proc, pid = gpu_procs[0][0], gpu_procs[0][1]
            if len(gpu_procs) > 1:
                others = ", ".join(f"pid {q[1]} ({q[2] / 1e6:.1f} ms of kernels)" for q in gpu_procs[1:6])
                more = f" and {len(gpu_procs) - 6} more" if len(gpu_procs) > 6 else ""
                meta.warnings.append(
                    f"{len(gpu_procs)} processes ran GPU work in this export: this rank is pid {pid} ({gpu_procs[0][2] / 1e6:.1f} "
                    f"ms of kernels, the most); left out: {others}{more} (one export per rank: `nsys profile -o rank%q{{RANK}}`)")
        else:
            proc = read.busiest_host_process(con, p)
            pid = None if proc is None else proc & 0xFFFFFF
    kernels, memcpys, memsets = (read.of_process(f, proc) for f in (kernels, memcpys, memsets))
    ranges, domains, marks = read.nvtx(db, p, proc, step)
    ranges, decoded = _nccl_payloads(db, p, proc, ranges, domains, meta)
    syncs = read.syncs(db, p, proc, step)
    calls = read.runtime(db, p, proc, step)
    if part is not None:
        (kernels, memcpys, memsets, syncs), calls, ranges = _on_device([kernels, memcpys, memsets, syncs], calls, ranges,
                                                                       domains, part["device"])
    hosts = {t: read.host_calls(db, p, t, proc, step) for t in ("OSRT_API", "CUBLAS_EVENTS", "CUDNN_EVENTS")}
    names = _names(db, kernels, [calls.get_column("name_id"), ranges.get_column("text_id"),
                                 *(h.get_column("name_id") for h in hosts.values())])
    frames = [nz.kernels(kernels, names, counts)]
    del kernels
    frames += [nz.memcpys(memcpys, counts), nz.memsets(memsets, counts), nz.syncs(syncs, counts),
               nz.runtime(calls, names, counts)]
    del calls, memcpys, memsets, syncs
    frames.append(nz.nvtx(ranges, names, domains, counts))
    del ranges
    for t, cat in (("OSRT_API", "osrt"), ("CUBLAS_EVENTS", "cublas"), ("CUDNN_EVENTS", "cudnn")):
        frames.append(nz.host_calls(hosts.pop(t), names, cat, counts))
    for what, n in sorted(counts.items()):
        meta.warnings.append(f"{n} {what} were dropped" if "without" in what and "named" not in what else f"{n} {what}")
    df = nz.assemble(frames)
    _fill_meta(con, p, meta, proc, pid, marks, domains, part)
    if df.height == 0:
        meta.warnings.append("the export holds no timed events of its process")
    else:
        df = _drop_far(df, meta)
    df = _attach_comm_records(df, meta)
    if "seq_source" in meta.attributes and df.select((pl.col("kclass") == "comm").any()).item():
        has_nccl_ranges = df.select(pl.col("kind").is_in(["collective", "p2p"]).any()).item()
        if decoded:
            meta.attributes["seq_source"] = (
                "derived: order within the communicator and collective type on this rank (NCCL's NVTX ranges name each "
                "collective, their payloads its communicator, size and ranks)")
        elif has_nccl_ranges:
            meta.attributes["seq_source"] = (
                "derived: order within the collective type on this rank (NCCL's NVTX ranges name each collective; they "
                "carry no payload here)")
            meta.warnings.append(
                "NCCL's NVTX ranges carry no payloads in this export (NCCL before 2.16, or an nsys without "
                "NVTX_EVENTS.binaryData and its payload schemas): collectives are matched across ranks by their order "
                "within their type, whatever their communicator")
        else:
            meta.attributes["seq_source"] = (
                "derived: order within the collective type on this rank (from the kernel names: no NCCL NVTX ranges)")
    cmap = read.cuda_device_map(con, p, pid)
    _device(df, meta)
    if meta.device_id is not None and meta.device_name is None and meta.device_id in cmap:
        for d in meta.devices:
            if d.get("id") == cmap[meta.device_id]:
                meta.device_properties, meta.device_name = d, d.get("name")
    if meta.device_id is not None:
        meta.platform = "cuda"
    if progress is not None:
        progress(size)
    return df.with_columns(pl.lit(-1 if meta.rank is None else meta.rank, dtype=pl.Int32).alias("rank")), meta


def _nccl_payloads(db, p, proc: int | None, ranges: pl.DataFrame, domains: dict[int, str],
                   meta: TraceMeta) -> tuple[pl.DataFrame, int]:
    """The process's NVTX ranges with what NCCL's payloads say of each collective (``group``,
    ``bytes``, ``group_size``, ``args``; FORMATS.md 1.6, ``payload``), and how many were decoded."""
    from . import payload
    from .normalise import NCCL_DOMAIN

    ids = [d for d, n in domains.items() if n == NCCL_DOMAIN]
    if not ids or not payload.available(p) or not ranges.height:
        return ranges, 0
    got, n, bad = payload.nccl(db, p, proc, ids)
    if bad:
        meta.warnings.append(f"{bad} of the {n} NCCL NVTX payloads do not fit their schema (an undescribed schema, or a blob "
                             "too short for its fields): skipped, those collectives matched by order")
    if not got.height:
        return ranges, 0
    joined = ranges.join(got, on=payload.KEY, how="left", nulls_equal=False)
    return joined, got.height


def _on_device(gpu: list[pl.DataFrame], calls: pl.DataFrame, ranges: pl.DataFrame, domains: dict[int, str],
               device: int) -> tuple[list[pl.DataFrame], pl.DataFrame, pl.DataFrame]:
    """A part's GPU rows (its process's on ``device``), CUDA calls (all of its process's but those
    that launched work on its other devices: correlation ids are unique within a process) and
    NVTX ranges (all of its process's but NCCL's ranges around launches for its other devices
    only, so that a collective is counted on the device it ran on)."""
    from .normalise import NCCL_DOMAIN

    other = [g.filter(pl.col("device") != device).select("correlation") for g in gpu]
    other = pl.concat(other).drop_nulls().unique()
    kept = [g.filter(pl.col("device") == device) for g in gpu]
    if not other.height:
        return kept, calls, ranges
    theirs = calls.join(other, on="correlation", how="semi")
    calls = calls.join(other, on="correlation", how="anti", nulls_equal=False)
    nccl = [d for d, n in domains.items() if n == NCCL_DOMAIN]
    if nccl and ranges.height:
        ranges = ranges.with_row_index("_r")
        spans = (ranges.filter(pl.col("domain").is_in(nccl)).select("_r", "pid", "tid", pl.col("ts_ns").alias("_rs"),
                                                                    pl.col("end_ns").alias("_re"))
                 .drop_nulls(["pid", "tid", "_rs"]).sort("_rs"))

        def around(launches: pl.DataFrame) -> pl.DataFrame:  # the NCCL ranges each launch of ``launches`` is inside
            at = launches.select("pid", "tid", "ts_ns").drop_nulls().sort("ts_ns")
            hit = at.join_asof(spans, left_on="ts_ns", right_on="_rs", by=["pid", "tid"], strategy="backward",
                               check_sortedness=False)
            return hit.filter(pl.col("_re") >= pl.col("ts_ns")).select("_r").unique()

        drop = around(theirs).join(around(calls), on="_r", how="anti")
        ranges = ranges.join(drop, on="_r", how="anti").sort("_r").drop("_r") if drop.height else ranges.drop("_r")
    return kept, calls, ranges


def _names(db, kernels: pl.DataFrame, ids: list[pl.Series]) -> pl.DataFrame:
    """The StringIds strings the rows refer to, read once (a small id -> name frame): a kernel's
    short and mangled names only where the one before does not name a text string (as SQL's
    ``coalesce`` of the lookups would read them)."""
    from . import read

    names = read.strings(db, pl.concat([kernels.get_column("name_id0").unique(), *(i.unique() for i in ids)]))
    rest = kernels.select("name_id1", "name_id2").filter(~kernels.get_column("name_id0").is_in(names.get_column("id").implode()))
    for c in ("name_id1", "name_id2"):
        if rest.height == 0:
            break
        more = read.strings(db, rest.get_column(c))
        names = pl.concat([names, more]).unique(subset="id", keep="first", maintain_order=True)
        rest = rest.filter(~rest.get_column(c).is_in(names.get_column("id").implode()))
    return names


def _fill_meta(con: sqlite3.Connection, p, meta: TraceMeta, proc: int | None, pid: int | None, marks: int,
               domains: dict[int, str], part: dict[str, Any] | None = None) -> None:
    from . import read
    from .split import process_environment, unquote

    meta.base_time_ns = read.session_start(con, p)
    meta.threads = read.threads(con, p, proc)
    meta.devices = target_gpus_of(con, p)
    meta.attributes.update({k: v for k, v in (("nsys_version", p.version), ("nsys_export_schema", p.schema_version),
                                              ("pid", pid), ("process", read.process_name(con, p, proc))) if v is not None})
    if marks:
        meta.attributes["nvtx_marks"] = marks  # instants: not in the event table
    if domains:
        meta.attributes["nvtx_domains"] = ", ".join(sorted(set(domains.values())))
    # a part's rank from its own process's environment; the captured one (META_DATA_CAPTURE) is the
    # launched process's, which is every part's parent when there are several (torchrun)
    env = process_environment(con, p, proc, pid, read.RANK_VARS + read.WORLD_VARS)
    if part is None or part["of"] <= 1:
        env = {**{k: unquote(v) for k, v in read.environment(con, p).items()}, **env}
    for var in read.RANK_VARS:
        v = env.get(var)
        if v is None:
            continue
        if v.isdigit() and v.isascii() and int(v) < 2**31:
            meta.rank, meta.rank_source = int(v), f"environment {var}"
            break
        meta.warnings.append(f"the environment's {var}={v[:40]!r} is not a rank number: ignored")
    for var in read.WORLD_VARS:
        v = env.get(var)
        if v is not None and v.isdigit() and v.isascii() and 0 < int(v) < 2**31 and (meta.rank is None or meta.rank < int(v)):
            meta.world_size = int(v)
            break
    # no rank in the environment: the file name or the order gives it (tracelens.store.ranks, which
    # says so where the job has more than this file)


def target_gpus_of(con: sqlite3.Connection, p) -> list[dict[str, Any]]:
    if "TARGET_INFO_GPU" not in p.tables:
        return []
    return _gpu_dicts(con)
