"""PyTorch profiler (Kineto) Chrome-trace JSON, ``.json`` or ``.json.gz``.

Both schemas are read: the current one (``cpu_op``, ``kernel``, ``cuda_runtime``, ``External
id``) and the 2021 one (``Operator``, ``Kernel``, ``Runtime``, ``external id``), CUDA and ROCm,
GPU-only and CPU-only, µs-float and ns-resolution timestamps, ids above int64.

The parse runs in three stages, one module each:

``decode``     bytes -> raw columns.  ``tracelens.parsers.jsonstream`` hands over the
               ``traceEvents`` array in chunks of whole events, decompressing as it goes; msgspec
               decodes each chunk into small typed structs (in C; unknown keys skipped), turned
               into columns and dropped before the next chunk; damaged chunks go back to
               jsonstream's recovery.
``normalise``  batches of raw columns -> the event schema (kinds, kernel classes, collectives,
               ns times, names and args cut to size), on a second thread while the next chunks
               decode.
``link``       the steps that need the whole file: flows, collective records onto kernels,
               process groups, sequence numbers, the device.

This module runs them (``parse``) and fills the ``TraceMeta`` from the file's top-level keys.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl

from tracelens.model.errors import ParseError, UsageError
from tracelens.model.schema import TraceMeta, conform, empty_frame

from ..jsonstream import StreamResult, stream_events
from .decode import (
    _as_int,
    _Builder,
    _decode_args,
    _decode_chunk,
    _int_col,
    _kind,
    _release_freed_memory,
    _shown,
    decimal_us_to_ns,
)
from .link import (
    _attach_comm_records,
    _bind_fwdbwd,
    _device,
    _fill_from_flows,
    _group_from_pg_config,
    _name_collectives,
    _single_group,
)
from .normalise import MAX_ARGS_BYTES, MAX_NAME_BYTES, _batch, _drop_far

__all__ = ["CHUNK_BYTES", "MAX_ARGS_BYTES", "MAX_NAME_BYTES", "NAME", "PARSER_VERSION", "_as_int", "_decode_chunk", "_int_col",
           "decimal_us_to_ns", "parse"]

NAME = "kineto"  # the format name sniff() gives these files
PARSER_VERSION = "1.12"  # bump when the table a parse caches changes (kernel classes included; 1.8: damaged events mended, far events dropped, long names cut; 1.9: args kept only on host ops, trimmed to the keys an analysis reads; 1.10: cuda_sync events keep what they wait on; 1.11: fwdbwd flows in their ops' args; 1.12: a batch of sends/recvs (nccl:coalesced) and its SendRecv kernel are sendrecv in its members' group)
CHUNK_BYTES = 1 << 20


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
    builder = _Builder(keep_python, keep_args, _batch)
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
    df = _bind_fwdbwd(df, builder)
    df = _attach_comm_records(df, meta)
    _device(df, meta)
    return conform(df.with_columns(pl.lit(-1 if meta.rank is None else meta.rank, dtype=pl.Int32).alias("rank")))

