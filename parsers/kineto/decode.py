"""Stage 1 of the Kineto parser: bytes -> raw columns.

``tracelens.parsers.jsonstream`` hands over the ``traceEvents`` array in chunks of whole events,
decompressing as it goes.  Each chunk is decoded here by msgspec into small typed structs holding
only the fields the analysis needs (unknown keys are skipped by the decoder, in C), picked and
turned into columns in a few passes that stay in C (list building, ``compress``, ``attrgetter``;
no polars call per chunk) and dropped before the next chunk.  A chunk the decoder refuses is
read leniently event by event, or its first error's offset goes back to jsonstream, which
recovers past it (the damage recovery hooks).  The ``_Builder`` gathers the raw chunk frames
and hands batches of them to the normalising stage on a second thread.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import orjson
import polars as pl

from ..jsonstream import byte_offset, deep_offset

ROWS_PER_BATCH = 8192
BACKLOG = 1  # batches queued for the second thread before the decoding thread waits

Num = int | float | str | None


_UNSET = msgspec.Raw(b"")  # a field the args object does not have (omitted when encoded)


_OP_KEYS = {"dims": "Input Dims", "types": "Input type", "concrete": "Concrete Inputs", "seq_nr": "Sequence number",
            "pg_id": "Process Group ID", "pg_ranks": "Process Group Ranks"}


class _OpArgs(msgspec.Struct, gc=False, omit_defaults=True, rename=_OP_KEYS):
    """The args of a host op that an analysis reads, as the file has them (op shapes, input
    types and concrete inputs for FLOPs; the autograd sequence number that links a forward op to
    its backward; the process group of a collective record).  The args text the event table
    keeps for a host op is this, encoded: every other key (call stacks, strides, ids already in
    columns) is dropped."""

    dims: msgspec.Raw = _UNSET
    types: msgspec.Raw = _UNSET
    concrete: msgspec.Raw = _UNSET
    seq_nr: msgspec.Raw = _UNSET
    pg_id: msgspec.Raw = _UNSET
    pg_ranks: msgspec.Raw = _UNSET


class _Args(_OpArgs, gc=False, omit_defaults=False, rename={
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
    "wait_stream": "wait_on_stream",
    "wait_corr": "wait_on_cuda_event_record_corr_id",
    **_OP_KEYS,  # the kept args' fields (inherited from _OpArgs), decoded in the same pass
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
    wait_stream: Num = None  # a cuda_sync event's: the stream it waits on, the cudaEventRecord it waits for
    wait_corr: Num = None


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
    "group_size", "seq", "in_nelems", "out_nelems", "dtype", "bytes", "wait_stream", "wait_corr",
)
_DEC_TS = msgspec.json.Decoder(list[_RawTs])


_ENCODE_OP_ARGS = msgspec.json.Encoder().encode
_DEC_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
# categories of the host events whose args an analysis or the linking stage reads (lower case):
# ops (shapes: FLOPs; c10d ops and collective records) and user annotations (backend annotations)
_HOST_ARGS_CATS = frozenset({"cpu_op", "operator", "user_annotation"})
_RECORD = "record_param_comms"  # a collective's host record keeps all its args (few per step; drill-down)
# Above this many µs a float64 no longer holds every ns: such timestamps are read from the text.
_EXACT_FLOAT_US = float(1 << 53) / 1000.0
_MAX_US = 9_200_000_000_000_000  # int64 ns reach about 9.22e18
_FLOW_CATS = frozenset({"ac2g", "async", "async_cpu_to_gpu", "async_gpu"})
_FLOW_PHS = frozenset({"s", "f", "t"})
_FWDBWD = frozenset({"fwdbwd"})  # autograd's forward op -> its backward node (s at the op, f at the node)
_DROP_CATS = frozenset({"Trace", "python_function"})  # complete events not kept (python ones unless asked)
_DROP_CATS_PY = frozenset({"Trace"})
_INT64_MAX = (1 << 63) - 1
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
    decimal; exponent notation goes through a float; null where the text is not a number.

    The common text, digits with exactly three decimals, is its ns with the dot taken out (one
    cast, ~10x cheaper than the general arithmetic); the others (and any whose ns would not fit)
    take ``_decimal_us_to_ns`` on those rows only."""
    t, v = pl.col("t"), pl.col("v")
    # (three decimals: the dot 4 bytes before the end; the strict integer cast refuses any other
    # character, a sign aside: "-1.234" is -1234 ns, as the general arithmetic gives)
    fast = (pl.DataFrame({"t": text}).lazy()
            .select(pl.when(t.str.len_bytes() - t.str.find(".", literal=True) == 4)
                    .then(t.str.replace(".", "", literal=True, n=1).cast(pl.Int64, strict=False)).alias("v"))
            .select(pl.when(v.abs() < _MAX_US * 1000).then(v).alias(text.name))
            .collect(engine="in-memory").to_series())
    miss = fast.is_null()
    if not miss.any():
        return fast
    return fast.scatter(miss.arg_true(), _decimal_us_to_ns(text.filter(miss)))


def _decimal_us_to_ns(text: pl.Series) -> pl.Series:
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

    def __init__(self, keep_python: bool, keep_args: bool, batch: Callable[..., tuple[pl.DataFrame, Counter[str]]]):
        self.keep_python = keep_python
        self.keep_args = keep_args
        self.batch = batch  # the normalising stage: (frames, args, us, keep_args) -> (frame, counts)
        self.frames: list[Future] = []  # normalised batches, (frame, counts) when done
        self.pool: ThreadPoolExecutor | None = None
        self.flows: list[pl.DataFrame] = []  # ac2g flow ends: _ph, _flow_id, _pid, _tid, ts_ns
        self.fwdbwd: list[pl.DataFrame] = []  # fwdbwd flow ends, the same columns
        self.meta_events: list[tuple] = []  # (name, pid, tid, raw args) of "M" events
        self.counts: Counter[str] = Counter()
        self.exact_ts = False
        self.pending: list[pl.DataFrame] = []
        self.pending_args: list[bytes] = []  # per pending frame with host ops: their args texts joined by NUL
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
            for into, want in ((self.flows, _FLOW_CATS), (self.fwdbwd, _FWDBWD)):
                is_flow = [p in _FLOW_PHS and c in want for p, c in zip(phs, cats)]
                fl = list(compress(evs, is_flow))
                if fl:
                    into.append(  # kept as compact columns: a trace can hold as many flows as events
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
        decoded = _decode_args(rargs)
        cols = {
            "cat": _str_col(cat),
            "name": _str_col(name),
            "_pid": _int_col(pid),
            "_tid": _int_col(tid),
            "ts": ts_ns.alias("ts"),
            "dur": _float_col(dur),
            **_args_columns(decoded),
        }
        if self.keep_args:  # the args texts of host ops: joined here, split into a column on the second thread (_batch)
            host = _host_mask(cat)
            cols["_hargs"] = pl.Series(host, dtype=pl.Boolean)
            texts = _kept_args(name, rargs, decoded, host)
            if texts:  # no Raw kept: each would pin its whole chunk
                self.pending_args.append(b"\x00".join(texts))
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
            self.frames.append(self.pool.submit(self.batch, pending, args, us, self.keep_args))
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



_ARG_FIELDS = {
    "External id": ("ext_id", True), "external id": ("ext_id_old", True), "correlation": ("correlation", True),
    "device": ("_device", True), "stream": ("_stream", True), "Collective name": ("coll_name", False),
    "Process Group Name": ("pg_name", False), "Process Group Description": ("pg_desc", False),
    "Group size": ("group_size", True), "Seq": ("seq", True), "In msg nelems": ("in_nelems", True),
    "Out msg nelems": ("out_nelems", True), "dtype": ("dtype", False), "bytes": ("_bytes", True),
    "wait_on_stream": ("_wait_stream", True), "wait_on_cuda_event_record_corr_id": ("_wait_corr", True),
}


def _args_columns(decoded: list[_Args]) -> dict[str, pl.Series]:
    """The args fields the analysis uses, as columns (``decoded`` by ``_decode_args``)."""
    values = zip(*map(_GET_ARGS, decoded))
    n = len(decoded)
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


_HOST_CAT: dict[str | None, bool] = {}  # category -> in _HOST_ARGS_CATS (a few distinct ones per trace)


def _host_mask(cats: tuple) -> list[bool]:
    """Which events keep an args text: those of the categories in ``_HOST_ARGS_CATS``."""
    try:
        return list(map(_HOST_CAT.__getitem__, cats))
    except KeyError:
        memo = _HOST_CAT if len(_HOST_CAT) < 1024 else {}  # a hostile file's thousands of categories are not kept
        memo.update({c: isinstance(c, str) and c.lower() in _HOST_ARGS_CATS for c in set(cats)})
        return list(map(memo.__getitem__, cats))


def _compact(text: bytes) -> bytes:
    """JSON text without the whitespace between its tokens (strings and numbers as they are)."""
    return msgspec.json.format(text, indent=-1)


def _kept_args(names: tuple, rargs: tuple[msgspec.Raw, ...], decoded: list[_Args], host: list[bool]) -> list[msgspec.Raw | bytes]:
    """The args texts the event table keeps, one per host event (``host``): the ``_OpArgs``
    fields of an op (from its ``decoded`` args), all of a collective record, as JSON without
    line breaks.
    A few C calls over all of them (convert, encode, split; compacted when pretty-printed)."""
    ops = msgspec.convert(list(compress(decoded, host)), list[_OpArgs], from_attributes=True)
    if not ops:
        return []
    text = _ENCODE_OP_ARGS(ops)
    if b"\n" in text:  # pretty-printed args (a newline is never raw inside a JSON string): compacted
        text = _compact(text)
    texts: list[msgspec.Raw | bytes] = _DEC_RAWS.decode(text)
    if _RECORD in names:  # found by list.index (in C): a few records among thousands of ops
        picked, host_names, i = list(compress(rargs, host)), list(compress(names, host)), -1
        while True:
            try:
                i = host_names.index(_RECORD, i + 1)
            except ValueError:
                break
            texts[i] = _compact(bytes(picked[i]))
    return texts


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



def _kind(v: object) -> str:
    """What a JSON value is, for a message: "a string", "an object", "null"."""
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object",
            type(None): "null"}.get(type(v), type(v).__name__)


def _shown(v: object) -> str:
    """A JSON value from a file, short, as JSON writes it (a message shows what the file holds)."""
    text = orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS).decode() if isinstance(v, (dict, list, str, int, float, bool, type(None))) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."



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
