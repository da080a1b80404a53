"""PyTorch profiler (Kineto) Chrome-trace JSON, ``.json`` or ``.json.gz``.

Both schemas are read: the current one (``cpu_op``, ``kernel``, ``cuda_runtime``, ``External
id``) and the 2021 one (``Operator``, ``Kernel``, ``Runtime``, ``external id``), CUDA and ROCm,
GPU-only and CPU-only, µs-float and ns-resolution timestamps, ids above int64.

How it stays fast and small: ``tracelens.parsers.jsonstream`` hands over the ``traceEvents`` array in
chunks of whole events, decompressing as it goes.  Each chunk is decoded by msgspec into small
typed structs holding only the fields the analysis needs (unknown keys are skipped by the
decoder, in C; the raw ``args`` text is kept as a string column), picked and turned into columns
in a few passes that stay in C (list building, ``compress``, ``attrgetter``; no polars call per
chunk) and dropped before the next chunk.  Batches of chunks are normalised (kinds, kernel
classes, collectives, ns times, the args text) on a second thread in two rounds of polars
queries, while the next chunks decode.  Only the steps that need the whole file (flows,
collective records onto kernels, sequence numbers) run at the end.
"""

from __future__ import annotations

import gc
import re
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import orjson
import polars as pl

from tracelens.model.collectives import P2P, dtype_bytes, normalize_collective
from tracelens.model.errors import ParseError, UsageError
from tracelens.model.kclass import classify, collective_from_kernel
from tracelens.model.schema import TraceMeta, conform, conform_exprs, empty_frame

from ..jsonstream import StreamResult, byte_offset, deep_offset, stream_events

PARSER_VERSION = "1.8"  # bump when the table a parse caches changes (kernel classes included; 1.8: damaged events mended, far events dropped, long names cut)
CHUNK_BYTES = 1 << 20
ROWS_PER_BATCH = 8192
MAX_NAME_BYTES = 64 << 10  # a longer event name is cut (the longest real kernel names: a few KB)
MAX_ARGS_BYTES = 1 << 20  # longer args are dropped (a collective's or a cat of 1000 tensors': tens of KB)
FAR_NS = 86_400 * 10**9  # an event further than a day from the file's median start is not of this trace
BACKLOG = 1  # batches queued for the second thread before the decoding thread waits

Num = int | float | str | None


class _Args(msgspec.Struct, gc=False, rename={
    "ext_id": "External id",
    "ext_id_old": "external id",
    "coll_name": "Collective name",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "group_size": "Group size",
    "seq": "Seq",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "label": "name",
}):
    ext_id: Num = None
    ext_id_old: Num = None
    correlation: Num = None
    device: Num = None
    stream: Num = None
    coll_name: str | None = None
    pg_name: str | int | None = None
    pg_desc: str | None = None
    group_size: Num = None
    seq: Num = None
    in_nelems: Num = None
    out_nelems: Num = None
    dtype: str | None = None
    bytes: Num = None
    label: str | int | None = None


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str | int | float | None = None
    pid: int | float | str | None = None
    tid: int | float | str | None = None
    ts: int | float | None = None
    dur: float | None = None
    id: Num = None
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _EventExact(_Event, gc=False):
    """_Event with the timestamp kept as its JSON text (see _Builder.timestamps)."""

    ts: msgspec.Raw = msgspec.Raw(b"null")


class _RawTs(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw(b"null")


_DEC_EVENTS = msgspec.json.Decoder(list[_Event])
_DEC_EVENTS_EXACT = msgspec.json.Decoder(list[_EventExact])
_DEC_ARGS = msgspec.json.Decoder(list[_Args])
_DEC_ONE_ARGS = msgspec.json.Decoder(_Args)
_NO_ARGS = _Args()
_GET_EVENT = attrgetter("cat", "name", "pid", "tid", "dur", "args")
_GET_ARGS = attrgetter(
    "ext_id", "ext_id_old", "correlation", "device", "stream", "coll_name", "pg_name", "pg_desc",
    "group_size", "seq", "in_nelems", "out_nelems", "dtype", "bytes",
)
_DEC_TS = msgspec.json.Decoder(list[_RawTs])
# Above this many µs a float64 no longer holds every ns: such timestamps are read from the text.
_EXACT_FLOAT_US = float(1 << 53) / 1000.0
_MAX_US = 9_200_000_000_000_000  # int64 ns reach about 9.22e18
_FLOW_CATS = frozenset({"ac2g", "async", "async_cpu_to_gpu", "async_gpu"})
_FLOW_PHS = frozenset({"s", "f", "t"})
_DROP_CATS = frozenset({"Trace", "python_function"})  # complete events not kept (python ones unless asked)
_DROP_CATS_PY = frozenset({"Trace"})
_STEP_RE = r"^ProfilerStep#\d+$"
_DATALOADER_RE = r"(?i)enumerate\(DataLoader\)|DataLoaderIter\.__next__|^## data_load"
_SYNC_RE = r"^(cuda|hip|cu)(Device|Stream|Event|Ctx)Synchronize"
_INT64_MAX = (1 << 63) - 1
# an event's end (ts + dur, in ns) must fit an int64; ``ts`` is already in ns here
_BAD_DUR = (pl.col("dur") * 1000.0 + pl.col("ts").cast(pl.Float64)).abs() >= 9.2e18
_NUM_TAIL = re.compile(r"(-?\d+)\s*$")

def _as_int(v: Any) -> int | None:
    """An id-like value as a signed 64-bit int (ids above int64 wrap; "stream 7" -> 7)."""
    t = type(v)
    if t is int:
        if -_INT64_MAX - 1 <= v <= _INT64_MAX:
            return v
        v &= (1 << 64) - 1
        return v - (1 << 64) if v > _INT64_MAX else v
    if v is None:
        return None
    if t is float:
        return int(v) if v == v and abs(v) < 9.2e18 else None
    if t is str:
        m = _NUM_TAIL.search(v)
        return _as_int(int(m.group(1))) if m else None
    return None


def _int_col(values: list) -> pl.Series:
    if not (values and str in (type(values[0]), type(values[-1]))):  # ids as text fail a whole pass
        try:
            return pl.Series(values, dtype=pl.Int64)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            pass
    if float in set(map(type, values)):  # equal dict keys that convert differently: 1e19 == 10**19
        return pl.Series([_as_int(v) for v in values], dtype=pl.Int64)
    # ids as text repeat ("25738", "stream 7" in the 2021 schema): convert each distinct value once
    memo = {v: _as_int(v) for v in set(values)}
    return pl.Series(list(map(memo.__getitem__, values)), dtype=pl.Int64)


def _str_col(values: list) -> pl.Series:
    try:
        return pl.Series(values, dtype=pl.String)
    except (TypeError, pl.exceptions.PolarsError):
        return pl.Series([None if v is None else str(v) for v in values], dtype=pl.String)


def _float_col(values: list) -> pl.Series:
    try:
        return pl.Series(values, dtype=pl.Float64)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series([_as_float(v) for v in values], dtype=pl.Float64)


def _as_float(v: Any) -> float | None:
    """A number as a float (an integer past a double's range: +-inf, which no check lets through)."""
    if type(v) is float:
        return v
    if type(v) is int:
        try:
            return float(v)
        except OverflowError:
            return float("inf") if v > 0 else float("-inf")
    return None


def decimal_us_to_ns(text: pl.Series) -> pl.Series:
    """Decimal µs strings ("1712195495519689.047") to int ns, exactly, rounding past the 3rd
    decimal; exponent notation goes through a float; null where the text is not a number."""
    t = pl.col("t")
    parts = t.str.strip_prefix("-").str.split_exact(".", 1)
    whole = parts.struct.field("field_0").cast(pl.Int64, strict=False)
    frac4 = parts.struct.field("field_1").fill_null("").str.slice(0, 4).str.pad_end(4, "0").cast(pl.Int64, strict=False)
    mag = pl.when(whole.abs() < _MAX_US).then(whole * 1000 + (frac4 + 5) // 10)
    f = t.cast(pl.Float64, strict=False)
    as_float = pl.when(f.abs() < _MAX_US).then((f * 1000.0).round().cast(pl.Int64, strict=False))
    exact = pl.when(t.str.starts_with("-")).then(-mag).otherwise(mag)
    out = pl.when(t.str.contains(r"^-?\d+(\.\d*)?$")).then(exact).otherwise(as_float)
    return pl.DataFrame({"t": text}).select(out.alias(text.name)).to_series()


class _Builder:
    """Collects column chunks and the odd events (metadata, flows) of one file."""

    def __init__(self, keep_python: bool, keep_args: bool = True):
        self.keep_python = keep_python
        self.keep_args = keep_args
        self.frames: list[Future] = []  # normalised batches, (frame, counts) when done
        self.pool: ThreadPoolExecutor | None = None
        self.flows: list[pl.DataFrame] = []  # ac2g flow ends: _ph, _flow_id, _pid, _tid, ts_ns
        self.meta_events: list[tuple] = []  # (name, pid, tid, raw args) of "M" events
        self.counts: Counter[str] = Counter()
        self.exact_ts = False
        self.pending: list[pl.DataFrame] = []
        self.pending_args: list[bytes] = []  # per pending frame: its args texts joined by NUL
        self.pending_us: list[bool] = []  # per pending frame: its ts are µs (ns otherwise)
        self.pending_rows = 0
        self.events = 0
        self.with_ph = 0
        self.first_bad: tuple[str | None, str] | None = None  # (field, what was wrong) of the first event skipped as invalid

    def timestamps(self, ts: list, chunk: bytes | None, raw_ts: bool, which: list[bool] | None = None) -> pl.Series:
        """ns timestamps of a chunk's events (null where missing), exact.  Integers multiply
        exactly.  µs floats too large for a float64 to hold every ns (absolute epoch times with
        ns decimals) are read from their text: from then on the file is decoded with the
        timestamp kept as text (_EventExact).  ``raw_ts``: the chunk was decoded that way
        (``ts`` holds texts).  ``which`` marks the chunk's events that ``ts`` holds (None: all)."""
        if raw_ts:
            return decimal_us_to_ns(_args_text(ts))
        try:
            whole = pl.Series("w", ts, dtype=pl.Int64)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            whole = None
        if whole is not None:
            lo, hi = whole.min(), whole.max()
            if lo is None or (-_MAX_US < lo and hi < _MAX_US):  # the common case: µs, scaled later (_batch)
                return whole.alias("ts_us")
            return whole.to_frame().select(pl.when(pl.col("w").abs() < _MAX_US).then(pl.col("w") * 1000)).to_series()
        f = pl.col("f")
        frame = _float_col(ts).alias("f").to_frame()
        needs_text = frame.select(((f.abs() >= _EXACT_FLOAT_US) & (f != f.round())).any()).item()
        if chunk is not None and needs_text:
            self.exact_ts = True
            raw = _DEC_TS.decode(chunk)
            picked = raw if which is None else compress(raw, which)
            return decimal_us_to_ns(_args_text([r.ts for r in picked]))
        # whole µs (ints mixed with floats) multiply exactly as integers
        return frame.select(
            pl.when(f.abs() >= _MAX_US)  # past the year 2262 in epoch µs: not a time int64 ns can hold
            .then(None)
            .when(f == f.round())
            .then(f.cast(pl.Int64, strict=False) * 1000)
            .otherwise((f * 1000.0).round().cast(pl.Int64, strict=False))
        ).to_series()

    def add(self, evs: list[_Event], chunk: bytes | None) -> None:
        """Turn one chunk of decoded events into raw columns.  Only what needs the GIL happens
        here (picking the events, pulling their fields into columns); everything polars can do
        on its own threads waits for the batch normalisation (``_batch``) on the second thread."""
        if not evs:
            return
        n_all = len(evs)
        self.events += n_all
        phs = [e.ph for e in evs]
        cats = [e.cat for e in evs]
        self.with_ph += n_all - phs.count("")
        if "M" in phs:
            for e in evs:
                if e.ph == "M":
                    self.meta_events.append((e.name, e.pid, e.tid, bytes(e.args)))  # a copy: a Raw pins its chunk
        raw_ts = self.exact_ts  # how this chunk was decoded
        drop = _DROP_CATS if not self.keep_python else _DROP_CATS_PY
        keep = [p == "X" and c not in drop for p, c in zip(phs, cats)]
        if "f" in phs or "s" in phs or "t" in phs:
            is_flow = [p in _FLOW_PHS and c in _FLOW_CATS for p, c in zip(phs, cats)]
            fl = list(compress(evs, is_flow))
            if fl:
                self.flows.append(  # kept as compact columns: a trace can hold as many flows as events
                    pl.DataFrame(
                        {
                            "_ph": pl.Series([e.ph for e in fl], dtype=pl.String),
                            "_flow_id": _int_col([e.id for e in fl]),
                            "_pid": _int_col([e.pid for e in fl]),
                            "_tid": _int_col([e.tid for e in fl]),
                            "ts_ns": _as_ns(self.timestamps([e.ts for e in fl], chunk, raw_ts, is_flow)),
                        }
                    )
                )
        del phs, cats
        kept = list(compress(evs, keep))
        n = len(kept)
        if n == 0:
            return
        ts_ns = self.timestamps([e.ts for e in kept], chunk, raw_ts, keep if n < n_all else None)
        del evs
        cat, name, pid, tid, dur, rargs = zip(*map(_GET_EVENT, kept))
        del kept
        cols = {
            "cat": _str_col(cat),
            "name": _str_col(name),
            "_pid": _int_col(pid),
            "_tid": _int_col(tid),
            "ts": ts_ns.alias("ts"),
            "dur": _float_col(dur),
            **_args_columns(rargs),
        }
        if self.keep_args:  # the args text: joined here, split into a column on the second thread (_batch)
            self.pending_args.append(b"\x00".join(rargs))  # no Raw kept: each would pin its whole chunk
        self.pending_us.append(ts_ns.name == "ts_us")
        self.pending.append(pl.DataFrame(cols))
        self.pending_rows += n
        if self.pending_rows >= ROWS_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        """Normalise the raw chunks gathered so far in one batch (fewer, larger polars calls),
        on a second thread: polars releases the GIL while it works, so the batch overlaps with
        the decoding of the next chunks (msgspec and the column building hold the GIL)."""
        if self.pending:
            pending, args, us = self.pending, self.pending_args, self.pending_us
            self.pending, self.pending_args, self.pending_us = [], [], []
            self.pending_rows = 0
            if self.pool is None:
                self.pool = ThreadPoolExecutor(1, thread_name_prefix="tracelens-rows")
            self.frames.append(self.pool.submit(_batch, pending, args, us, self.keep_args))
            # back-pressure: at most BACKLOG batches wait for the second thread (each holds its raw columns)
            waiting = [f for f in self.frames if not f.done()]
            for f in waiting[: max(len(waiting) - BACKLOG, 0)]:
                f.result()

    def finish_rows(self) -> list[pl.DataFrame]:
        """The normalised batches in file order, with their counts added to ``counts``."""
        self.flush()
        out = []
        try:
            for fut in self.frames:
                df, counts = fut.result()
                self.counts.update(counts)
                out.append(df)
        finally:
            self.frames.clear()
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = None
        return out


# args keys -> (column, integer?) of the event table's raw columns, in _GET_ARGS order
_ARG_FIELDS = {
    "External id": ("ext_id", True), "external id": ("ext_id_old", True), "correlation": ("correlation", True),
    "device": ("_device", True), "stream": ("_stream", True), "Collective name": ("coll_name", False),
    "Process Group Name": ("pg_name", False), "Process Group Description": ("pg_desc", False),
    "Group size": ("group_size", True), "Seq": ("seq", True), "In msg nelems": ("in_nelems", True),
    "Out msg nelems": ("out_nelems", True), "dtype": ("dtype", False), "bytes": ("_bytes", True),
}


def _args_columns(rargs: tuple) -> dict[str, pl.Series]:
    """The args fields the analysis uses, as columns (decoded in one call over all the objects;
    an object that does not fit gives no fields)."""
    values = zip(*map(_GET_ARGS, _decode_args(rargs)))
    n = len(rargs)
    out = {}
    for (col, is_int), v in zip(_ARG_FIELDS.values(), values):
        if v.count(None) == n:  # a field no event of the chunk has (most of them, most of the time)
            out[col] = _null_col(pl.Int64 if is_int else pl.String, n)
        else:
            out[col] = _int_col(v) if is_int else _str_col(v)
    ext, old = out.pop("ext_id"), out.pop("ext_id_old")
    out = {"ext_id": ext.fill_null(old) if old.null_count() < n else ext, **out}
    return out


_NULLS: dict[pl.DataType, pl.Series] = {}


def _null_col(dtype: pl.DataType, n: int) -> pl.Series:
    """``n`` nulls: a slice (no copy) of a long all-null column made once per dtype."""
    col = _NULLS.get(dtype)
    if col is None or col.len() < n:
        col = _NULLS[dtype] = pl.repeat(None, max(n, 1 << 16), dtype=dtype, eager=True)
    return col.slice(0, n)


def _split_args(parts: list[bytes], n: int) -> pl.Series | None:
    """The args texts of a batch (each part: one chunk's, joined by NUL) as one column of ``n``
    strings; UTF-8 checked and split by polars (off the GIL).  None when the count is off."""
    try:
        text = pl.Series("args", parts, dtype=pl.Binary).cast(pl.String)
    except pl.exceptions.PolarsError:  # invalid UTF-8 somewhere: replaced, as Python's decoder does it
        text = pl.Series("args", [p.decode("utf-8", "replace") for p in parts], dtype=pl.String)
    col = text.str.split("\x00").explode()
    return col if col.len() == n else None


def _as_ns(ts: pl.Series) -> pl.Series:
    return ts * 1000 if ts.name == "ts_us" else ts


def _args_text(rargs: list) -> pl.Series:
    """Raw JSON values (msgspec.Raw) as one String column, split in Rust from one joined buffer
    (a NUL byte never appears unescaped inside JSON)."""
    out = _split_args([b"\x00".join(rargs)], len(rargs))
    if out is None:  # a raw NUL inside a string (invalid JSON the decoder let through)
        out = pl.Series("args", [bytes(r).decode("utf-8", "replace") for r in rargs], dtype=pl.String)
    return out


def _decode_args(rargs: tuple[msgspec.Raw, ...]) -> list[_Args]:
    """The fields we use from each event's args, decoded in one call over all of them."""
    try:
        return _DEC_ARGS.decode(b"[" + b",".join(rargs) + b"]")
    except (msgspec.ValidationError, msgspec.DecodeError):
        out = []
        for r in rargs:
            try:
                out.append(_DEC_ONE_ARGS.decode(r))
            except (msgspec.ValidationError, msgspec.DecodeError):
                out.append(_NO_ARGS)
        return out


_BYTE_AT = re.compile(r"\(byte (\d+)\)")
_DEEP = 256  # nesting this deep in a chunk the decoder gave up on is taken for the culprit


def _decode_chunk(chunk: bytes, builder: _Builder) -> int | None:
    """Decode a JSON array of events into the builder: None when done, else the offset of the
    chunk's first error (``len(chunk)`` when it ends early), for jsonstream to recover from."""
    try:
        evs = (_DEC_EVENTS_EXACT if builder.exact_ts else _DEC_EVENTS).decode(chunk)
    except msgspec.ValidationError:
        return _decode_lenient(chunk, builder)
    except msgspec.DecodeError as e:
        return _error_offset(str(e), chunk)
    except RecursionError:
        return deep_offset(chunk, _DEEP)
    builder.add(evs, chunk)
    return None


def _error_offset(msg: str, chunk: bytes) -> int:
    """Where msgspec's error lies in ``chunk``, from its message (or found again)."""
    m = _BYTE_AT.search(msg)
    if m:
        return min(int(m.group(1)), len(chunk))
    if "truncated" in msg:
        return len(chunk)
    if "UTF-8" in msg:
        try:
            chunk.decode()
        except UnicodeDecodeError as u:
            return u.start
    return _orjson_offset(chunk)


def _orjson_offset(chunk: bytes) -> int:
    """The byte offset of orjson's first error in ``chunk`` (it counts characters)."""
    try:
        orjson.loads(chunk)
    except orjson.JSONDecodeError as e:
        return byte_offset(chunk, e)
    return 1  # valid JSON the decoder refused anyway: the first event takes the blame


def _decode_lenient(chunk: bytes, builder: _Builder) -> int | None:
    """Slow path for a chunk with oddly typed fields: keep every event that converts."""
    try:
        items = orjson.loads(chunk)
    except orjson.JSONDecodeError:
        return _orjson_offset(chunk)
    evs: list[_Event] = []
    for item in items:
        if not isinstance(item, dict):
            builder.counts["invalid"] += 1
            if builder.first_bad is None:
                builder.first_bad = (None, f"an item of traceEvents is {_kind(item)}, not an object")
            continue
        a = item.pop("args", None)
        ts = item.pop("ts", None) if builder.exact_ts else None
        try:
            ev = msgspec.convert(item, _EventExact if builder.exact_ts else _Event, strict=False)
        except msgspec.ValidationError as e:
            builder.counts["invalid"] += 1
            if builder.first_bad is None:
                builder.first_bad = _why_invalid(item, e)
            continue
        if builder.exact_ts:
            ev.ts = msgspec.Raw(orjson.dumps(ts if isinstance(ts, (int, float)) else None))
        ev.args = msgspec.Raw(orjson.dumps(a)) if isinstance(a, dict) else msgspec.Raw(b"{}")
        evs.append(ev)
    builder.add(evs, None)
    return None


_WANTED = {"ph": "a string", "ts": "a number", "dur": "a number", "cat": "a string", "name": "a string",
           "pid": "a number or a string", "tid": "a number or a string", "id": "a number or a string"}


def _why_invalid(item: dict, e: msgspec.ValidationError) -> tuple[str | None, str]:
    """(the field, what was wrong with it) of an event msgspec refused, from its error (which ends
    "- at `$.ts`"): the field's value as the file holds it and what it should be."""
    m = re.search(r"at `\$\.(\w+)`", str(e))
    if not m:
        return None, str(e)
    key = m.group(1)
    value = item.get(key) if key != "ts" or "ts" in item else None
    return key, f"its {key!r} is {_shown(value)}, not {_WANTED.get(key, 'of the expected type')}"


def parse(path: str | Path, *, keep_python: bool = False, keep_args: bool = True,
          progress: Callable[[int], None] | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Parse one Kineto trace file into (event frame, TraceMeta).  ``rank`` is left to the loader
    when the file does not say it (``meta.rank`` None); the frame's ``rank`` column is filled
    with ``meta.rank`` or -1 and rewritten by the loader."""
    path = Path(path)
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of short-lived tuples: the cycle collector would rescan them all
    switch = sys.getswitchinterval()
    # three threads share the GIL (decoding, gunzip, batch normalisation): hand it over sooner
    sys.setswitchinterval(min(switch, 0.001))
    try:
        return _parse(path, keep_python, keep_args, progress)
    except (ParseError, UsageError, MemoryError, KeyboardInterrupt):  # UsageError: a bad TRACELENS_MAX_* value
        raise
    except Exception as e:  # never let a malformed file surface as a traceback
        first = (str(e).strip().splitlines() or [""])[0][:300]  # one line, whatever the library said
        raise ParseError(str(path), f"unreadable trace ({type(e).__name__}: {first})") from e
    finally:
        sys.setswitchinterval(switch)
        if gc_was_on:
            gc.enable()


def _parse(path: Path, keep_python: bool, keep_args: bool, progress: Callable[[int], None] | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    spath = str(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ParseError(spath, f"cannot read file ({e.strerror or e})") from None
    builder = _Builder(keep_python, keep_args)
    res = stream_events(path, lambda chunk: _decode_chunk(chunk, builder), CHUNK_BYTES, progress)
    if builder.with_ph == 0:
        if res.truncated:
            what = res.problem if res.problem.startswith("truncated") else f"truncated trace: {res.problem}"
            raise ParseError(spath, f"{what} before the first whole event")
        if builder.events == 0 and builder.counts["invalid"] == 0:
            raise ParseError(spath, "no trace events: the traceEvents array is empty")
        bad = builder.counts["invalid"]
        if builder.first_bad is not None and builder.events == 0:  # every item was refused: say why, not "no 'ph'"
            key, why = builder.first_bad
            skipped = f"all {bad} events skipped" if bad > 1 else "its one event skipped"
            if key is None:  # not objects at all: not a trace
                raise ParseError(spath, f"not a trace: the array holds no trace events (objects with a 'ph' field): {why}")
            if key == "ts":
                raise ParseError(spath, f"no event has a usable timestamp (ts): the first bad one: {why} ({skipped})")
            raise ParseError(spath, f"no usable trace events: the first bad one: {why} ({skipped})")
        raise ParseError(spath, "not a trace: the array holds no trace events (objects with a 'ph' field)")
    meta = TraceMeta(
        path=spath,
        format="kineto",
        source="kineto",
        parser="tracelens.parsers.kineto",
        parser_version=PARSER_VERSION,
        size_bytes=size,
        uncompressed_bytes=res.content_bytes,
    )
    _damage_warnings(meta, res)
    if res.truncated:
        meta.truncated = True
        meta.warnings.append(f"{res.problem}; loaded the {builder.events} whole events before the cut")
    df = _finish(builder, meta, res.top)
    return df, meta


def _damage_warnings(meta: TraceMeta, res: StreamResult) -> None:
    """Say what the recovery from damaged events did, and where (content byte offsets)."""
    where = ", ".join(map(str, res.where))
    more = ", ..." if res.repaired_events + res.skipped_events > len(res.where) else ""
    at = f" (at byte {where}{more} of the content)" if where else ""
    if res.repaired_events:
        what = ", ".join(f"{k}: {v}" for k, v in sorted(res.repaired.items()))
        meta.warnings.append(f"{res.repaired_events} events with invalid JSON were read after mending it ({what}){at}")
        at = ""
    if res.skipped_events:
        meta.warnings.append(f"{res.skipped_events} events with invalid JSON could not be read and were skipped{at}")
    meta.warnings.extend(res.notes)


def _fill_meta(meta: TraceMeta, top: dict, builder: _Builder) -> None:
    dist = top.get("distributedInfo")
    if isinstance(dist, dict):
        meta.distributed = dist
        r = _count(dist.get("rank"), 0, "distributedInfo rank", meta)
        if r is not None:
            meta.rank = r
            meta.rank_source = "distributedInfo"
        ws = _count(dist.get("world_size"), 1, "distributedInfo world_size", meta)
        if ws is not None and meta.rank is not None and meta.rank >= ws:
            meta.warnings.append(f"distributedInfo rank {meta.rank} is not below its world_size {ws}: the world size is ignored")
            ws = None
        meta.world_size = ws
        be = dist.get("backend")
        meta.backend = be if isinstance(be, str) else None
        if be is not None and meta.backend is None:
            meta.warnings.append(f"distributedInfo backend {_shown(be)} is not text: ignored")
    elif dist is not None:
        meta.warnings.append(f"distributedInfo is {_kind(dist)}, not an object: ignored (no rank or world size from it)")
    devs = top.get("deviceProperties")
    if isinstance(devs, list):
        meta.devices = [d for d in devs if isinstance(d, dict)]
        if len(meta.devices) < len(devs):
            meta.warnings.append(f"{len(devs) - len(meta.devices)} deviceProperties entries are not objects: ignored")
    elif devs is not None:
        meta.warnings.append(f"deviceProperties is {_kind(devs)}, not a list: ignored (the GPU is unnamed)")
    btn = top.get("baseTimeNanoseconds")
    if isinstance(btn, int):
        meta.base_time_ns = btn
    for k, v in top.items():
        if k not in ("traceEvents", "deviceProperties", "distributedInfo") and isinstance(v, (str, int, float, bool)):
            meta.attributes[k] = v
    if any(k in top for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version")):
        meta.platform = "rocm"
    elif any(k in top for k in ("cupti_version", "cuda_runtime_version", "cuda_driver_version")):
        meta.platform = "cuda"
    for name, pid, tid, rargs in builder.meta_events:
        if name == "thread_name":
            label = _decode_args((rargs,))[0].label
            if label is not None:
                meta.threads[f"{_as_int(pid)}:{_as_int(tid)}"] = str(label)


def _kind(v: object) -> str:
    """What a JSON value is, for a message: "a string", "an object", "null"."""
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object",
            type(None): "null"}.get(type(v), type(v).__name__)


def _shown(v: object) -> str:
    """A JSON value from a file, short, as JSON writes it (a message shows what the file holds)."""
    text = orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS).decode() if isinstance(v, (dict, list, str, int, float, bool, type(None))) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


_MAX_COUNT = 2**31 - 1  # ranks are Int32 in the event table (COLLECTIVE_SCHEMA too): no job has more


def _count(v: object, least: int, what: str, meta: TraceMeta) -> int | None:
    """An integer field of the metadata (a rank, a world size): ``v`` when it is an integer of at
    least ``least``, a string of digits read as one (with a warning), else None with a warning
    saying what was there; None without a word when the field is absent."""
    if v is None:
        return None
    if isinstance(v, str) and v.strip().isdigit() and v.isascii() and least <= int(v) <= _MAX_COUNT:
        meta.warnings.append(f"{what} {_shown(v)} is text: read as {int(v)}")
        return int(v)
    if isinstance(v, int) and not isinstance(v, bool) and least <= v <= _MAX_COUNT:
        return v
    want = ("a non-negative integer" if least == 0 else f"an integer of at least {least}") + f" up to {_MAX_COUNT}"
    meta.warnings.append(f"{what} {_shown(v)} is not {want}: ignored")
    return None


def _finish(builder: _Builder, meta: TraceMeta, top: dict) -> pl.DataFrame:
    """The steps that need the whole file: flows, collective records onto kernels, sequence
    numbers, the device this rank ran on.  Row-local work was done chunk by chunk."""
    frames = builder.finish_rows()
    _release_freed_memory()
    _fill_meta(meta, top, builder)
    c = builder.counts
    for key, msg in (
        ("invalid", "events that are not well-formed trace events were skipped"),
        ("neg_dur", "events with negative durations were clamped to 0"),
        ("no_dur", "complete events without a duration were given 0"),
        ("no_tid", "host events without a usable thread id were dropped"),
        ("no_dev", "GPU events without a usable device id were dropped"),
        ("no_ts", "complete events without a usable timestamp were dropped"),
        ("bad_dur", "complete events whose end lies past what int64 ns can hold (a duration of 292 years or more, or infinite) were dropped"),
        ("args_unsplit", "events whose args text could not be told apart were given no args text"),
        ("long_name", f"event names longer than {MAX_NAME_BYTES // 1024} KB were cut to that length"),
        ("long_args", f"events whose args are longer than {MAX_ARGS_BYTES >> 20} MB were given no args"),
    ):
        if c[key]:
            meta.warnings.append(f"{c[key]} {msg}")
    meta.trace_schema = "2021" if c["old_schema"] else "current"
    if not frames:
        meta.warnings.append("the trace holds no timed events")
        return empty_frame()
    df = pl.concat(frames, how="vertical", rechunk=True)
    del frames
    df = _drop_far(df, meta)
    df = _name_collectives(df)
    df = _group_from_pg_config(df, meta)
    df = _single_group(df, meta)
    df = _fill_from_flows(df, builder)
    df = _attach_comm_records(df, meta)
    meta.device_id = _mode(df.select("kind", "device").filter(pl.col("kind") == "kernel").get_column("device"))
    if meta.device_id is None:
        meta.device_id = _mode(df.get_column("device"))
    if meta.device_id is not None:
        for d in meta.devices:
            if d.get("id") == meta.device_id:
                meta.device_properties = d
                meta.device_name = d.get("name")
                break
        if meta.device_name is None and len(meta.devices) == 1:
            meta.device_properties = meta.devices[0]
            meta.device_name = meta.devices[0].get("name")
        if meta.device_properties and not isinstance(meta.device_name, str):  # a hostile file: no name, not a crash
            got = "no name" if "name" not in meta.device_properties else f"name {_shown(meta.device_name)} is not text"
            meta.warnings.append(f"the deviceProperties entry of device {meta.device_id}: {got}, so the GPU is unnamed")
            meta.device_name = None
    else:
        meta.warnings.append("no GPU events (a CPU-only trace)")
    if meta.platform is None and meta.device_name:
        low = meta.device_name.lower()
        meta.platform = "rocm" if ("amd" in low or "instinct" in low or "radeon" in low) else "cuda"
    return conform(df.with_columns(pl.lit(-1 if meta.rank is None else meta.rank, dtype=pl.Int32).alias("rank")))


def _drop_far(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """Events more than ``FAR_NS`` from the median start of the file's events: one garbage
    ``ts`` (0 in an epoch-time trace) or a runaway ``dur`` would stretch every window and share
    over years.  A real trace spans minutes."""
    med = df.get_column("ts_ns").median()
    if med is None:
        return df
    end = pl.col("ts_ns") + pl.col("dur_ns")
    far = ((pl.col("ts_ns") - med).abs() > FAR_NS) | ((end - med).abs() > FAR_NS)
    n = df.select(far.sum()).item()
    if not n:
        return df
    first = df.filter(far).row(0, named=True)
    meta.warnings.append(
        f"{n} events more than a day away from the trace's other events were dropped (a garbage ts or dur; the first: "
        f"{str(first['name'])[:60]!r} at ts {first['ts_ns'] / 1e3:.0f} µs, dur {first['dur_ns'] / 1e3:.0f} µs)"
    )
    return df.filter(~far)


def _release_freed_memory() -> None:
    """Hand the memory of the decoded chunks (freed Python objects) back to the system before the
    whole-file steps, so that they do not stack on it (glibc only; elsewhere a no-op)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None
_DEVICE_CATS = ["kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"]
_KEEP_TEMP = ("_pid", "_tid", "_is_dev")  # needed by the whole-file steps, dropped by conform


def _batch(frames: list[pl.DataFrame], args: list[bytes], us: list[bool], keep_args: bool) -> tuple[pl.DataFrame, Counter[str]]:
    """One batch of raw chunk frames normalised into the event schema (plus _KEEP_TEMP), with the
    counts of what was clamped or dropped; runs on the second thread.  µs timestamps become ns,
    the args texts (joined by NUL per frame) a column, and every event gets its kind, class and
    collective.  Two rounds of polars queries (each ``collect_all`` releases the GIL once: the
    decoding thread holds it most of the time, so every round trip waits)."""
    # one in-memory frame that every query below scans (a lazy concat would be redone per query)
    if any(us) and not all(us):
        frames = [f.with_columns(pl.col("ts") * 1000) if u else f for f, u in zip(frames, us)]
    df = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical", rechunk=False)
    del frames
    if all(us):
        df = df.with_columns(pl.col("ts") * 1000)
    n = df.height
    raw = df.lazy()
    queries = [
        raw.select(
            ((pl.col("dur") < 0) & ~_BAD_DUR).sum().alias("neg_dur"),
            pl.col("dur").is_null().sum().alias("no_dur"),
            pl.col("cat").is_in(["Operator", "Kernel", "Runtime"]).sum().alias("old_schema"),
            pl.col("ts").null_count().alias("no_ts"),
            _BAD_DUR.sum().alias("bad_dur"),
        ),
        # what an event is (kind, class, collective) depends on its category, name and
        # collective name only: worked out once per distinct combination, then joined back
        raw.select(_COMBO).unique(),
        raw.select(pl.col("dtype").drop_nulls().unique()),
    ]
    if keep_args:
        parts = pl.Series("args", args, dtype=pl.Binary)
        queries.append(pl.LazyFrame([parts]).select(pl.col("args").cast(pl.String).str.split("\x00")).explode("args"))
    try:
        stats, combos, dtypes, *text = pl.collect_all(queries, engine="in-memory")
    except pl.exceptions.PolarsError:  # invalid UTF-8 in the args: split below, after Python's decoder
        if not keep_args:
            raise
        stats, combos, dtypes = pl.collect_all(queries[:3], engine="in-memory")
        text = [pl.DataFrame({"args": pl.Series([], dtype=pl.String)})]
    c: Counter[str] = Counter(stats.row(0, named=True))
    if keep_args:
        col = text[0].get_column("args")
        if col.len() != n or col.null_count():  # invalid UTF-8 (replaced), or a raw NUL in a string
            col = _split_args(args, n)
        if col is None:  # the decoder rejects raw control characters in strings: not seen, but never guessed
            c["args_unsplit"] += n
            col = _null_col(pl.String, n).alias("args")
    else:
        col = _null_col(pl.String, n).alias("args")
    if col.null_count() < n and col.str.len_bytes().max() > MAX_ARGS_BYTES:  # no analysis reads such args
        long = col.str.len_bytes() > MAX_ARGS_BYTES
        c["long_args"] += long.sum()
        col = pl.select(pl.when(long).then(None).otherwise(col).alias("args")).to_series()
    long_names = combos.get_column("name").drop_nulls().str.len_bytes().max() or 0
    if long_names > MAX_NAME_BYTES:
        c["long_name"] += raw.select((pl.col("name").str.len_bytes() > MAX_NAME_BYTES).sum()).collect().item()
    colls = combos.get_column("coll_name").drop_nulls().unique().to_list()
    combos = combos.with_columns(
        _CAT_L.is_in(_DEVICE_CATS).alias("_is_dev"),
        _CAT_L.alias("_cat_l"),
        pl.col("name").fill_null("").alias("_name"),
        (
            pl.col("coll_name").replace_strict({x: normalize_collective(x) for x in colls}, default=None, return_dtype=pl.String)
            if colls
            else pl.lit(None, pl.String)
        ).alias("collective"),
    ).with_columns(_KIND.alias("kind"))
    # Kernel classes, once per distinct kernel name (copies and fills by their category).
    kernel_names = combos.filter(pl.col("kind") == "kernel").get_column("_name").unique().to_list()
    classes = {n: classify(n) for n in kernel_names}
    comm_no_coll = [n for n in kernel_names if classes[n] == "comm"]
    from_kernel = {n: collective_from_kernel(n) for n in comm_no_coll}
    combos = combos.lazy().with_columns(
        pl.when(pl.col("kind") == "kernel")
        .then(pl.col("_name").replace_strict(classes, default="other", return_dtype=pl.String) if classes else pl.lit("other"))
        .when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy"))
        .when(pl.col("kind") == "memset")
        .then(pl.lit("memset"))
        .otherwise(None)
        .alias("kclass"),
        # the collective from the kernel name when the kernel carries no args (older PyTorch)
        (
            pl.when(pl.col("collective").is_null() & (pl.col("kind") == "kernel"))
            .then(pl.col("_name").replace_strict(from_kernel, default=None, return_dtype=pl.String))
            .otherwise(pl.col("collective"))
            if from_kernel
            else pl.col("collective")
        ).alias("collective"),
    ).select(*_COMBO, "_is_dev", "kind", "kclass", "collective")
    dsize = {d: dtype_bytes(d) for d in dtypes.get_column("dtype").to_list()}
    elem = pl.col("dtype").replace_strict(dsize, default=None, return_dtype=pl.Int64) if dsize else pl.lit(None, pl.Int64)
    lf = pl.concat([raw, col.to_frame().lazy()], how="horizontal")
    if c["no_ts"] or c["bad_dur"]:
        lf = lf.filter(pl.col("ts").is_not_null() & ~_BAD_DUR.fill_null(False))
    lf = (
        lf.join(combos, on=_COMBO, how="left", nulls_equal=True, maintain_order="left")
        .with_columns(
            (pl.col("name").fill_null("").str.slice(0, MAX_NAME_BYTES) if long_names > MAX_NAME_BYTES else pl.col("name").fill_null("")),
            ((pl.col("dur").fill_null(0.0).clip(lower_bound=0.0) * 1000.0).round()).cast(pl.Int64).alias("dur_ns"),
            # bytes: explicit, else the larger message (nccl-tests' "size") x element size
            pl.coalesce(pl.col("_bytes"), pl.max_horizontal(pl.col("in_nelems"), pl.col("out_nelems")) * elem).alias("bytes"),
            pl.when(pl.col("_is_dev")).then(pl.coalesce(pl.col("_device"), pl.col("_pid"))).otherwise(None).cast(pl.Int32).alias("device"),
            pl.when(pl.col("_is_dev")).then(pl.coalesce(pl.col("_stream"), pl.col("_tid"))).otherwise(None).alias("stream"),
            pl.when(pl.col("_is_dev")).then(None).otherwise(pl.col("_pid")).alias("pid"),
            pl.when(pl.col("_is_dev")).then(None).otherwise(pl.col("_tid")).alias("tid"),
            pl.col("ts").alias("ts_ns"),
            pl.col("ext_id").alias("external_id"),
            pl.col("pg_name").alias("group"),
            pl.col("pg_desc").alias("group_desc"),
            pl.lit("kineto").alias("source"),
            pl.lit(0, dtype=pl.Int32).alias("file"),
            pl.lit(-1, dtype=pl.Int32).alias("rank"),
        )
        # a runtime call's args (External id, correlation, cbid) are all columns already
        .with_columns(pl.when(pl.col("kind") == "runtime").then(None).otherwise(pl.col("args")).alias("args"))
        .with_columns(
            (pl.col("kind").is_in(["cpu_op", "runtime", "python"]) & pl.col("tid").is_null()).alias("_no_tid"),
            (pl.col("kind").is_in(["kernel", "memcpy", "memset"]) & pl.col("device").is_null()).alias("_no_dev"),
        )
    )
    columns = lf.collect_schema().names()
    out = lf.select(conform_exprs(columns) + list(_KEEP_TEMP) + ["_no_tid", "_no_dev"]).collect(engine="in-memory")
    no_tid, no_dev = out.get_column("_no_tid").sum(), out.get_column("_no_dev").sum()
    c["no_tid"] += no_tid
    c["no_dev"] += no_dev
    if no_tid or no_dev:
        out = out.filter(~(pl.col("_no_tid") | pl.col("_no_dev")))
    return out.drop("_no_tid", "_no_dev"), c


_COMBO = ["cat", "name", "coll_name"]
_CAT_L = pl.col("cat").str.to_lowercase()
_CPU_OP_CATS = ["cpu_op", "operator"]
_RUNTIME_CATS = ["cuda_runtime", "cuda_driver", "runtime"]
# the kind of an event, on a frame with _cat_l, _name, _is_dev and collective
_KIND = (
    pl.when(pl.col("_name").str.contains(_STEP_RE) & ~pl.col("_is_dev"))
    .then(pl.lit("step"))
    .when(pl.col("_name").str.contains(_DATALOADER_RE) & ~pl.col("_is_dev"))
    .then(pl.lit("dataloader"))
    .when(
        pl.col("_cat_l").is_in(_CPU_OP_CATS)
        & (pl.col("_name") == "record_param_comms")
        & (pl.col("collective").fill_null("") != "wait")  # c10d::wait's record moves no data
    )
    .then(pl.when(pl.col("collective").is_in(list(P2P))).then(pl.lit("p2p")).otherwise(pl.lit("collective")))
    .when(pl.col("_cat_l").is_in(_CPU_OP_CATS))
    .then(pl.lit("cpu_op"))
    .when(pl.col("_cat_l").is_in(["user_annotation", "gpu_user_annotation"]))
    .then(pl.lit("annotation"))
    .when(pl.col("_cat_l") == "python_function")
    .then(pl.lit("python"))
    .when(pl.col("_cat_l").is_in(_RUNTIME_CATS) & pl.col("_name").str.contains(_SYNC_RE))
    .then(pl.lit("sync"))
    .when(pl.col("_cat_l").is_in(_RUNTIME_CATS))
    .then(pl.lit("runtime"))
    .when(pl.col("_cat_l") == "cuda_sync")
    .then(pl.lit("sync"))
    .when(pl.col("_cat_l") == "kernel")
    .then(pl.lit("kernel"))
    .when(pl.col("_cat_l").is_in(["gpu_memcpy", "memcpy"]))
    .then(pl.lit("memcpy"))
    .when(pl.col("_cat_l").is_in(["gpu_memset", "memset"]))
    .then(pl.lit("memset"))
    .otherwise(pl.lit("other"))
)
_BACKEND_ANN = r"^(gloo|nccl|rccl|mpi|ucc|xccl):"


# The size of each collective's message by what the record names it (nccl-tests' "size"): the input
# for most, the output for an all-gather or gather (the input times the group size)
_OUTPUT_SIZED = ("allgather", "gather")
_PLAIN_DIMS = r"^\[\s*(\d+\s*(,\s*\d+\s*)*)?\]$"  # one tensor's shape: [], [384], [8,1024] (not a list of tensors)


def _with_tensor_bytes(rows: pl.DataFrame, n: int = 2) -> pl.DataFrame:
    """``_b0`` .. ``_b{n-1}``: bytes of each op's first ``n`` recorded inputs (``Input Dims`` x the
    size of ``Input type``), and ``_t0``, ``_t1``.. their types; null where the input is not one
    plain tensor (a TensorList, a scalar) or its type has no known size.  ``rows`` holds few rows
    (the collective records and the ops around them): the JSON of their args is read by polars."""
    rows = rows.with_columns(
        *[pl.col("args").str.json_path_match(f"$['Input Dims'][{i}]").alias(f"_d{i}") for i in range(n)],
        *[pl.col("args").str.json_path_match(f"$['Input type'][{i}]").alias(f"_t{i}") for i in range(n)],
    )
    types = {t for i in range(n) for t in rows.get_column(f"_t{i}").drop_nulls().unique().to_list()}
    size = {t: dtype_bytes(t) for t in types}
    out = []
    for i in range(n):
        d = pl.col(f"_d{i}")
        numel = pl.when(d.str.contains(_PLAIN_DIMS)).then(
            d.str.extract_all(r"\d+").cast(pl.List(pl.Int64)).list.eval(pl.element().product()).list.first())
        elem = pl.col(f"_t{i}").replace_strict(size, default=None, return_dtype=pl.Int64) if size else pl.lit(None, pl.Int64)
        out.append((numel * elem).alias(f"_b{i}"))
    return rows.with_columns(out).drop([f"_d{i}" for i in range(n)])


def _name_collectives(df: pl.DataFrame) -> pl.DataFrame:
    """What each collective record is and how many bytes it moves, when its ``record_param_comms``
    does not say (older PyTorch records no ``Collective name`` or message sizes), from the host ops
    around it on its thread: the ``c10d::allreduce_`` (etc.) op that encloses it, the backend's
    annotation (``nccl:all_to_all``) inside it, the record's own recorded input tensor.  A backend
    annotation that no record covers (gloo on the CPU, ``nccl:_all_gather_base`` launched without a
    record, a trace without any) is the collective's record itself.  Bytes: the record's input
    tensor, else its annotation's, else the largest tensor of its c10d op; for an all-gather the
    c10d op's output (the largest), else the input times the group size."""
    # match on the distinct names, not on a String copy of the whole column
    names = pl.Series(df.get_column("name").unique().cast(pl.String).drop_nulls())
    backend = names.filter(names.str.contains(_BACKEND_ANN)).to_list()
    c10d = names.filter(names.str.starts_with("c10d::")).to_list()
    cand = (
        (pl.col("kind").is_in(["collective", "p2p"]))
        | ((pl.col("kind") == "annotation") & ~pl.col("_is_dev") & pl.col("name").is_in(backend))
        | ((pl.col("kind") == "cpu_op") & pl.col("name").is_in(c10d))
    )
    sub = (
        df.select("kind", "_is_dev", "name", "args", "pid", "tid", "ts_ns", "dur_ns", "collective", "bytes", "dtype", "group_size")
        .with_row_index("_row")
        .filter(cand & pl.col("tid").is_not_null())
        .with_columns(pl.col("name").cast(pl.String), pl.col("collective").cast(pl.String), pl.col("dtype").cast(pl.String),
                      (pl.col("ts_ns") + pl.col("dur_ns")).alias("_end"))
    )
    if sub.height == 0 or not sub.select(pl.col("kind").is_in(["collective", "p2p", "annotation"]).any()).item():
        return df
    sub = _with_tensor_bytes(sub)
    names = sub.filter(pl.col("kind") != "collective").get_column("name").unique().to_list()
    norm = {}
    for n in names:
        if n.startswith("c10d::"):
            norm[n] = normalize_collective(n.removeprefix("c10d::").rstrip("_"))
        elif ":" in n:
            norm[n] = normalize_collective(n.split(":", 1)[1])
    sub = sub.with_columns(
        pl.when(pl.col("kind").is_in(["collective", "p2p"])).then(pl.col("collective"))
        .otherwise(pl.col("name").replace_strict(norm, default=None, return_dtype=pl.String) if norm else pl.lit(None, pl.String))
        .alias("_c"))
    recs = sub.filter(pl.col("kind").is_in(["collective", "p2p"]))
    anns = sub.filter((pl.col("kind") == "annotation") & pl.col("_c").is_not_null() & (pl.col("_c") != "wait"))
    ops = sub.filter(pl.col("kind") == "cpu_op").select(
        "pid", "tid", pl.col("ts_ns").alias("_ots"), pl.col("_end").alias("_oend"), pl.col("_c").alias("_oc"),
        pl.max_horizontal("_b0", "_b1").alias("_ob")).sort("_ots")
    # the record each annotation is inside (or encloses): the last record on its thread that starts
    # before the annotation ends, if it has not ended before the annotation starts
    covered = (
        anns.select("_row", "pid", "tid", "ts_ns", "_end", "_c", "_b0", "_t0").sort("_end")
        .join_asof(recs.select("pid", "tid", pl.col("ts_ns").alias("_rts"), pl.col("_end").alias("_rend"),
                               pl.col("_row").alias("_rrow")).sort("_rts"),
                   left_on="_end", right_on="_rts", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .with_columns((pl.col("_rts").is_not_null() & (pl.col("_rend") >= pl.col("ts_ns"))).alias("_covered"))
    )
    lent = (
        covered.filter("_covered").sort("ts_ns")
        .group_by("_rrow").agg(pl.col("_c").first().alias("_ac"), pl.col("_b0").first().alias("_ab"), pl.col("_t0").first().alias("_at"))
        .rename({"_rrow": "_row"})
    )
    promoted = covered.filter(~pl.col("_covered")).get_column("_row")
    rows = (
        pl.concat([recs, anns.filter(pl.col("_row").is_in(promoted.implode()))])
        .join(lent, on="_row", how="left")
        .sort("ts_ns")
        .join_asof(ops, left_on="ts_ns", right_on="_ots", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .with_columns(pl.when(pl.col("_oend") >= pl.col("ts_ns")).then(pl.col("_oc")).alias("_oc"),
                      pl.when(pl.col("_oend") >= pl.col("ts_ns")).then(pl.col("_ob")).alias("_ob"))
        .with_columns(pl.coalesce("_c", "_oc", "_ac").alias("_coll"))
    )
    own = pl.when(pl.col("_t0").is_not_null() & pl.col("_b0").is_not_null()).then(pl.col("_b0"))
    from_input = pl.coalesce(own, pl.col("_ab"))
    rows = rows.with_columns(
        pl.coalesce(
            "bytes",
            pl.when(pl.col("_coll").is_in(list(_OUTPUT_SIZED)))
            .then(pl.coalesce(pl.col("_ob"), from_input * pl.col("group_size").cast(pl.Int64)))
            .otherwise(pl.coalesce(from_input, pl.col("_ob"))),
        ).alias("_nb"),
        pl.coalesce("dtype", pl.when(pl.col("_b0").is_not_null()).then(pl.col("_t0")),
                    pl.when(pl.col("_ab").is_not_null()).then(pl.col("_at"))).alias("_dt"),
        pl.when(pl.col("_coll").is_in(list(P2P))).then(pl.lit("p2p")).otherwise(pl.lit("collective")).alias("_k"),
    ).select("_row", "_coll", "_nb", "_dt", "_k")
    return _scatter_fill(df, rows, {"collective": ("_coll", True), "bytes": ("_nb", True), "dtype": ("_dt", True),
                                    "kind": ("_k", True)})


def _group_from_pg_config(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """A collective record that names no group but its ``Process Group ID`` (PyTorch 2.0/2.1: the
    group's uid) or its ``Process Group Ranks`` is in the one ``distributedInfo.pg_config`` group
    with that uid, or the only one with those ranks (several groups over the same ranks: unknown)."""
    pgs = meta.distributed.get("pg_config")
    if not (isinstance(pgs, list) and len(pgs) > 1):
        return df  # none, or one (_single_group)
    need = pl.col("kind").is_in(["collective", "p2p"]) & pl.col("group").is_null() & pl.col("args").is_not_null()
    rows = df.select("kind", "group", "args").with_row_index("_row").filter(need)
    if rows.height == 0:
        return df
    by_uid, by_ranks = {}, {}
    for pg in pgs:
        if not isinstance(pg, dict) or pg.get("pg_name") is None:
            continue
        if isinstance(pg.get("uid"), int):
            by_uid[str(pg["uid"])] = pg
        if isinstance(pg.get("ranks"), list):
            by_ranks.setdefault(str(pg["ranks"]).replace(" ", ""), []).append(pg)
    by_ranks = {k: v[0] for k, v in by_ranks.items() if len(v) == 1}
    if not by_uid and not by_ranks:
        return df
    rows = rows.select(
        "_row",
        pl.col("args").str.json_path_match("$['Process Group ID']").alias("_id"),
        pl.col("args").str.json_path_match("$['Process Group Ranks']").str.replace_all(r"[\s\"]", "").alias("_rk"),
    )
    pick = {}
    for key, src, table in (("_id", "uid", by_uid), ("_rk", "ranks", by_ranks)):
        for v in rows.get_column(key).drop_nulls().unique().to_list():
            if v in table:
                pick.setdefault(key, {})[v] = table[v]
    if not pick:
        return df

    def look(field: str, cast) -> pl.Expr:
        exprs = [pl.col(key).replace_strict({v: cast(pg.get(field)) for v, pg in m.items()}, default=None, return_dtype=pl.String)
                 for key, m in pick.items()]
        return pl.coalesce(exprs)

    rows = rows.with_columns(look("pg_name", str).alias("_g"), look("pg_desc", lambda x: x if isinstance(x, str) else None).alias("_gd"),
                             look("pg_size", lambda x: str(x) if isinstance(x, int) else None).cast(pl.Int64).alias("_gs"))
    rows = rows.filter(pl.col("_g").is_not_null())
    return _scatter_fill(df, rows, {"group": ("_g", False), "group_desc": ("_gd", False), "group_size": ("_gs", False)})


def _single_group(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """With exactly one process group in ``distributedInfo.pg_config``, a collective that does
    not name its group can only be in that one."""
    pgs = meta.distributed.get("pg_config")
    if not (isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0], dict)):
        return df
    pg = pgs[0]
    name, size, desc = pg.get("pg_name"), pg.get("pg_size"), pg.get("pg_desc")
    coll = (pl.col("kind").is_in(["collective", "p2p"]) | (pl.col("kclass") == "comm")) & pl.col("group").is_null()
    if name is None or not df.select(coll.any()).item():
        return df
    return df.with_columns(
        pl.when(coll).then(pl.lit(str(name))).otherwise(pl.col("group").cast(pl.String)).cast(pl.Categorical).alias("group"),
        pl.when(coll & pl.col("group_size").is_null()).then(pl.lit(size if isinstance(size, int) else None, pl.Int32))
        .otherwise(pl.col("group_size")).alias("group_size"),
        pl.when(coll & pl.col("group_desc").is_null()).then(pl.lit(desc if isinstance(desc, str) else None))
        .otherwise(pl.col("group_desc").cast(pl.String)).cast(pl.Categorical).alias("group_desc"),
    )


def _fill_from_flows(df: pl.DataFrame, builder: _Builder) -> pl.DataFrame:
    """GPU activities and launches without a ``correlation`` arg take it from the ac2g flow
    event at the same place and time (``s`` at the launch, ``f`` at the GPU activity)."""
    need = (pl.col("_is_dev") | pl.col("kind").is_in(["runtime", "sync"])) & pl.col("correlation").is_null()
    if not builder.flows or not df.select(need.any()).item():
        builder.flows.clear()
        return df
    flows = pl.concat(builder.flows).unique(subset=["_pid", "_tid", "ts_ns", "_ph"], keep="first")
    builder.flows.clear()
    rows = (
        df.select("_is_dev", "kind", "correlation", "_pid", "_tid", "ts_ns")
        .with_row_index("_row")
        .filter(need)
        .with_columns(pl.when(pl.col("_is_dev")).then(pl.lit("f")).otherwise(pl.lit("s")).alias("_ph"))
        .join(flows, on=["_pid", "_tid", "ts_ns", "_ph"], how="inner")
        .select("_row", "_flow_id")
    )
    if rows.height == 0:
        return df
    return _scatter_fill(df, rows, {"correlation": ("_flow_id", False)})


_SEQ_DERIVED = "derived: order within the process group and collective type on this rank"


def _attach_comm_records(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """Carry the host record of each collective (``record_param_comms``) onto its GPU kernel,
    and give every collective a sequence number: the trace's (``Seq``), else its order among the
    collectives of its process group and type on this rank (``meta.attributes["seq_source"]``
    says which: "trace", "derived: ..." or "mixed: ...")."""
    host = pl.col("kind").is_in(["collective", "p2p"])
    comm = (pl.col("kclass") == "comm") | host
    n_trace, n_host_derived, n_comm = df.select(
        (comm & pl.col("seq").is_not_null()).sum().alias("t"), (host & pl.col("seq").is_null()).sum().alias("d"),
        comm.sum().alias("n")).row(0)
    if not n_comm:
        return df
    key = [pl.col("group").cast(pl.String).fill_null(""), pl.col("collective").cast(pl.String).fill_null("")]
    if df.select(host.any()).item():
        if df.select((host & pl.col("seq").is_null()).any()).item():
            df = _derive_seq(df, host & pl.col("seq").is_null(), key)
        # kernels that miss any of the record's facts (the group may come from pg_config or the
        # kernel's own args while the sequence number is only on the record)
        need = (pl.col("kclass") == "comm") & pl.any_horizontal(
            pl.col(c).is_null() for c in ("group", "seq", "collective", "bytes"))
        kernels = df.select("kclass", "group", "seq", "collective", "bytes", "correlation").with_row_index("_row").filter(need).select(
            "_row", "correlation", pl.col("collective").cast(pl.String).alias("_kc"))
        if kernels.height:
            launches = (
                df.select("kind", "correlation", "pid", "tid", "ts_ns")
                .filter(pl.col("kind").is_in(["runtime"]) & pl.col("correlation").is_not_null())
                .select("correlation", pl.col("pid").alias("_lpid"), pl.col("tid").alias("_ltid"), pl.col("ts_ns").alias("_lts"))
                .unique(subset=["correlation"], keep="first")
            )
            records = (
                df.drop("args")
                .filter(host)
                .select(
                    pl.col("pid").alias("_lpid"),
                    pl.col("tid").alias("_ltid"),
                    pl.col("ts_ns").alias("_rts"),
                    (pl.col("ts_ns") + pl.col("dur_ns")).alias("_rend"),
                    pl.col("collective").alias("_c"),
                    pl.col("group").alias("_g"),
                    pl.col("group_desc").alias("_gd"),
                    pl.col("group_size").alias("_gs"),
                    pl.col("seq").alias("_s"),
                    pl.col("dtype").alias("_dt"),
                    pl.col("bytes").alias("_b"),
                )
                .drop_nulls(["_lpid", "_ltid"])
                .sort("_rts")
            )
            linked = (
                kernels.join(launches, on="correlation", how="inner")
                .drop_nulls(["_lpid", "_ltid"])
                .sort("_lts")
                .join_asof(records, left_on="_lts", right_on="_rts", by=["_lpid", "_ltid"], strategy="backward", tolerance=10_000_000, check_sortedness=False)
                # launched inside its record; or up to 10 ms after it (the launch of coalesced ops at
                # the group's end) when the kernel's own name does not say it is another collective
                .filter(pl.col("_rts").is_not_null() & ((pl.col("_lts") <= pl.col("_rend")) | pl.col("_kc").is_null()
                                                        | (pl.col("_kc") == pl.col("_c").cast(pl.String))))
                .select("_row", "_c", "_g", "_gd", "_gs", "_s", "_dt", "_b")
            )
            if linked.height:
                df = _scatter_fill(
                    df,
                    linked,
                    # the record's collective wins over one guessed from the kernel name
                    {"collective": ("_c", True), "group": ("_g", False), "group_desc": ("_gd", False),
                     "group_size": ("_gs", False), "seq": ("_s", False), "dtype": ("_dt", False), "bytes": ("_b", False)},
                )
    # Comm kernels still without a sequence number: their order within the group and type, after
    # the numbers already there (a kernel launched before the trace began must not take one)
    orphan = (pl.col("kclass") == "comm") & pl.col("seq").is_null()
    n_orphans = df.select(orphan.sum()).item()
    if n_orphans:
        df = _derive_seq(df, orphan, key, after=(pl.col("kclass") == "comm") & pl.col("seq").is_not_null())
    if not (n_host_derived or n_orphans):
        meta.attributes["seq_source"] = "trace"
    elif not n_trace:
        meta.attributes["seq_source"] = _SEQ_DERIVED
    else:
        meta.attributes["seq_source"] = "mixed: from the trace where it has them, else " + _SEQ_DERIVED.removeprefix("derived: ")
    return df


def _derive_seq(df: pl.DataFrame, rows: pl.Expr, key: list[pl.Expr], after: pl.Expr | None = None) -> pl.DataFrame:
    """Number the selected rows 0, 1, ... in time order within each ``key``; with ``after``, from
    one past the largest number the ``after`` rows of that key have."""
    cols = ["kind", "kclass", "group", "collective", "seq", "ts_ns", "dur_ns", "stream", "tid", "correlation"]
    base = df.select(cols).with_row_index("_row")

    def keyed(part: pl.DataFrame) -> pl.DataFrame:  # the key on the few rows selected, not on every event
        return part.with_columns(pl.concat_str(key, separator="\x1f").alias("_key"))

    sub = (
        keyed(base.filter(rows))
        # ties in time are broken by fields of the event, never by its place in the file
        .with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64)
            .over("_key", order_by=["ts_ns", "dur_ns", "stream", "tid", "correlation"])
            .alias("_s")
        )
    )
    if after is not None:
        top = keyed(base.filter(after)).group_by("_key").agg((pl.col("seq").max() + 1).alias("_first"))
        sub = sub.join(top, on="_key", how="left").with_columns(pl.col("_s") + pl.col("_first").fill_null(0))
    return _scatter_fill(df, sub.select("_row", "_s"), {"seq": ("_s", False)})


def _scatter_fill(df: pl.DataFrame, linked: pl.DataFrame, columns: dict[str, tuple[str, bool]]) -> pl.DataFrame:
    """Write ``linked``'s values into the rows ``linked["_row"]`` of ``df`` without copying the
    frame: for each column, the linked value where the row has none (or always, when the flag says
    the linked value wins)."""
    rows = linked.get_column("_row")
    out = {}
    for col, (src, wins) in columns.items():
        s = df.get_column(col)
        new = linked.get_column(src).cast(s.dtype)
        old = s.gather(rows)
        merged = new.fill_null(old) if wins else old.fill_null(new)
        out[col] = s.clone().scatter(rows, merged)
    return df.with_columns(**out)


def _mode(s: pl.Series) -> int | None:
    s = s.drop_nulls()
    if s.len() == 0:
        return None
    return int(s.mode().sort()[0])
