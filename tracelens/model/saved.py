"""A saved report (``report --load X``, ``--compare BASELINE``, ``tracelens open X.json``): a
tracelens JSON report, or the one embedded in a tracelens HTML page.  It is untrusted input: read
with a bounded size (the file, and the gzip payload an HTML page may carry, never past
``max_report_bytes()``), parsed, and checked against ``report.schema.json`` before anything
renders it.  Every failure is a ``TraceInputError`` naming the file and the first problem.

A report nested deeper than ``MAX_DEPTH`` levels is refused before the schema is checked (the
depth is measured without recursion): the deepest place a report of this schema has is 9 levels
(``$.ranks[0].steps[0].waterfall[0].parts[0]``, in the golden reports), and the free-form
objects the schema allows (a suggestion's ``evidence``) would otherwise let a list nested
hundreds deep reach the renderers and the JSON writer, which recurse."""

from __future__ import annotations

import functools
import json
import re
import zlib
from importlib import resources
from typing import Any

from tracelens.model.errors import TraceInputError
from tracelens.model.limits import max_report_bytes

SCHEMA_VERSION = 1  # the report contract's version (DESIGN.md 5): what this tracelens writes and reads
HTML_SUFFIXES = (".html", ".htm")
_HEAD = 64 * 1024  # where a JSON report's first key is looked for (to tell it from a trace without parsing either)
REPORT_KEYS = ("schema_version", "tool", "inputs", "warnings", "job", "ranks", "communication", "suggestions", "timeline",
               "comparison")  # the report's top-level keys: a trace (Kineto, Chrome JSON) starts with none of them
MAX_DEPTH = 32  # levels of objects and arrays, the top-level object being 1; real reports have 9
_FIRST_KEY = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*\{\s*"([a-z_]{1,32})"\s*:')


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


@functools.lru_cache(maxsize=1)
def validator():
    from tracelens.model.validator import Validator

    return Validator(json.loads(resources.files("tracelens.model").joinpath("report.schema.json").read_text(encoding="utf-8")))


def check(path: str, data: Any) -> dict[str, Any]:
    """``data`` when it is a valid report of this tracelens's schema version; else the one-line error."""
    if not isinstance(data, dict):
        raise TraceInputError(path, f"not a tracelens report (its top level is {_kind(data)}, not an object)")
    deep = too_deep(data, MAX_DEPTH)
    if deep is not None:
        raise TraceInputError(path, f"not a valid tracelens report: nested deeper than {MAX_DEPTH} levels (at {deep})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise TraceInputError(path, f"report schema_version {data.get('schema_version')!r}; this tracelens reads {SCHEMA_VERSION}")
    err = validator().first_error(data)
    if err:
        raise TraceInputError(path, f"not a valid tracelens report: {err[0]}: {err[1]}")
    return data


def too_deep(data: Any, limit: int) -> str | None:
    """None when ``data`` has at most ``limit`` levels of objects and arrays; else where the
    first container past the limit is, as ``$.a[0].b…`` (its first few steps).  Iterative: a
    value nested any depth costs a loop, never the stack."""
    stack: list[tuple[Any, int, tuple]] = [(data, 1, ())] if isinstance(data, (dict, list)) else []
    while stack:
        x, depth, at = stack.pop()
        if depth > limit:
            return _short_path(at)
        children = x.items() if isinstance(x, dict) else enumerate(x)
        for key, v in children:
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1, at + (key,) if len(at) < 6 else at))
    return None


def _short_path(at: tuple) -> str:
    from tracelens.model.validator import path_text

    return path_text(at[:5]) + ("…" if len(at) > 5 else "")


def _kind(x: Any) -> str:
    from tracelens.model.validator import describe

    return describe(x)


def looks_like_report(head: bytes) -> bool:
    """Whether a JSON file's first bytes are a tracelens report's: its first key is a report's top-level
    key (in the order tracelens writes them, or sorted as by ``jq -S``)."""
    m = _FIRST_KEY.match(head)
    return bool(m) and m.group(1).decode() in REPORT_KEYS


def _is_report(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("tool"), dict) and data["tool"].get("name") == "tracelens"


def _read(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the file; a larger file is an error (nothing past the limit is read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise TraceInputError(path, f"cannot read file ({e.strerror or e})") from None
    if len(data) > limit:
        raise TraceInputError(path, f"larger than {_mb(limit)}, the limit for a saved report (TRACELENS_MAX_REPORT_BYTES)")
    return data


def load_saved(path: str, required: bool = False) -> dict[str, Any] | None:
    """The validated report in ``path``; None when the file is not a tracelens report (a trace,
    for ``--compare`` and ``open``), unless ``required`` (``--load``): then that is an error too."""
    import orjson

    limit = max_report_bytes()
    if path.lower().endswith(HTML_SUFFIXES):
        raw = embedded_json(path, _read(path, limit), limit)
        if raw is None:
            if required:
                raise TraceInputError(path, "no tracelens report embedded in this HTML page")
            return None
        damaged = "the report embedded in this page is damaged"
    else:
        try:
            with open(path, "rb") as f:
                head = f.read(_HEAD)
        except OSError as e:
            raise TraceInputError(path, f"cannot read file ({e.strerror or e})") from None
        if not looks_like_report(head):
            if required:
                raise TraceInputError(path, "not a tracelens JSON report (it does not start like one)")
            return None
        raw = _read(path, limit)
        damaged = "not a valid JSON report"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TraceInputError(path, f"{damaged} ({e})") from None
    if not _is_report(data):
        if required or not isinstance(data, dict):
            raise TraceInputError(path, "not a tracelens report" + (f" (its top level is {_kind(data)})" if not isinstance(data, dict) else ""))
        return None
    return check(path, data)


_START = re.compile(rb"<script type='application/(json|gzip\+base64)' id='tracelens-report(?:-gz)?'>")


def embedded_json(path: str, html: bytes, limit: int) -> bytes | None:
    """The JSON bytes of the report a tracelens HTML page embeds (``tracelens.render.html.embed_report``),
    None when it has none.  A gzip payload is inflated in bounded steps: past ``limit`` it is an
    error before the memory is spent."""
    import base64
    import binascii

    m = _START.search(html)
    if not m:
        return None
    end = html.find(b"</script>", m.end())
    if end < 0:
        raise TraceInputError(path, "the report embedded in this page is damaged (its script element is not closed)")
    payload = html[m.end():end]
    if m.group(1) == b"json":
        return payload
    try:
        packed = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError) as e:
        raise TraceInputError(path, f"the report embedded in this page is damaged (bad base64: {e})") from None
    inflate = zlib.decompressobj(wbits=31)  # gzip
    out, size, rest = [], 0, packed
    try:
        while not inflate.eof:
            chunk = inflate.decompress(rest, 1 << 20)  # at most 1 MiB of output per step
            rest = inflate.unconsumed_tail
            if not chunk and not rest:
                break
            size += len(chunk)
            if size > limit:
                raise TraceInputError(path, f"the report embedded in this page expands past {_mb(limit)}, the limit for a "
                                            "saved report (TRACELENS_MAX_REPORT_BYTES)")
            out.append(chunk)
    except zlib.error as e:
        raise TraceInputError(path, f"the report embedded in this page is damaged (bad gzip: {e})") from None
    if not inflate.eof:
        raise TraceInputError(path, "the report embedded in this page is damaged (its gzip data ends early)")
    return b"".join(out)
