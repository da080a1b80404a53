"""Stream the ``traceEvents`` array of a Chrome-trace JSON file in chunks of whole events.

The file (plain or gzip) is decompressed block by block; the parser never holds the whole
content.  A chunk boundary is a ``}`` ``,`` ``{`` between two events; a boundary found by the
fast byte search is *proved* by decoding the chunk: a cut inside a string or a nested value
always leaves the chunk unbalanced, which the decoder rejects, and the next boundary is tried.
Keys around the array (``deviceProperties``, ``distributedInfo``, Kineto's ``INFO`` lines)
are parsed from the bytes before the array and the bytes after its end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tracelens.errors import ParseError

try:  # ISA-L's inflate (python-isal): zlib's API, about 3x faster (0.036 -> 0.011 s on a 35 MB trace)
    from isal import isal_zlib as zlib
except ImportError:  # a platform without its wheel
    import zlib

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
READ_BYTES = 1 << 20
MAX_HEADER = 256 << 20

# decode(chunk) -> True when the chunk (a JSON array) was valid JSON and has been consumed.
Decoder = Callable[[bytes], bool]


class ContentReader:
    """The file's content, decompressed on demand when gzip; records a cut or corrupt stream."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "rb")
        self.gz = self.fh.read(2) == b"\x1f\x8b"
        self.fh.seek(0)
        self.dec = zlib.decompressobj(wbits=31) if self.gz else None
        self.done = False
        self.problem: str | None = None  # set when a gzip stream is cut short or corrupt
        self.total = 0

    def close(self) -> None:
        self.fh.close()

    def read(self, n: int) -> bytes:
        if self.done:
            return b""
        if not self.gz:
            data = self.fh.read(n)
            if not data:
                self.done = True
            self.total += len(data)
            return data
        out: list[bytes] = []
        size = 0
        while size < n:
            if self.dec.eof:
                rest = self.dec.unused_data or self.fh.read(READ_BYTES)
                if rest[:2] != b"\x1f\x8b":  # the end (trailing bytes that are not a member are ignored)
                    self.done = True
                    break
                self.dec = zlib.decompressobj(wbits=31)  # another gzip member follows
                data = rest
            elif self.dec.unconsumed_tail:
                data = self.dec.unconsumed_tail
            else:
                data = self.fh.read(READ_BYTES)
                if not data:
                    self.problem = (
                        "truncated gzip (the stream ends before its end marker)"
                        if self.total + size
                        else "truncated gzip: nothing could be decompressed"
                    )
                    self.done = True
                    break
            try:
                piece = self.dec.decompress(data, n - size)
            except zlib.error as e:
                self.problem = f"corrupt gzip data ({e})"
                self.done = True
                break
            out.append(piece)
            size += len(piece)
        data = b"".join(out)
        if not data:
            self.done = True
        self.total += len(data)
        return data


@dataclass
class StreamResult:
    top: dict[str, Any]  # the top-level keys other than traceEvents
    truncated: bool  # the array (or the gzip stream) was cut; whole events before it were kept
    problem: str | None  # what was wrong, when truncated
    content_bytes: int  # uncompressed bytes read


def stream_events(path: Path, decode: Decoder, chunk_bytes: int, progress: Callable[[int], None] | None = None) -> StreamResult:
    """Decode the traceEvents array of ``path`` chunk by chunk; ``progress(bytes)`` is told how
    far into the file (on disk) the reader is after each chunk."""
    spath = str(path)
    r = ContentReader(path)
    if progress is not None:
        inner = decode

        def decode(chunk: bytes) -> bool:  # noqa: F811 - the same decoder, reporting as it goes
            ok = inner(chunk)
            progress(r.fh.tell())
            return ok
    try:
        return _stream(r, spath, decode, chunk_bytes)
    finally:
        r.close()


def _first_char(buf: bytearray) -> int:
    i = 0
    if buf.startswith(b"\xef\xbb\xbf"):
        i = 3
    while i < len(buf) and buf[i] in _WS:
        i += 1
    return i


def _stream(r: ContentReader, path: str, decode: Decoder, chunk: int) -> StreamResult:
    buf = bytearray()
    header: bytes | None = None
    # 1. Find the start of the events array.
    while True:
        data = r.read(READ_BYTES)
        buf += data
        i = _first_char(buf)
        if i < len(buf):
            first = buf[i : i + 1]
            if first == b"[":
                body = i + 1
                break
            if first != b"{":
                raise ParseError(path, "not a trace: the content is not a JSON object or array")
            key = buf.find(b'"traceEvents"')
            if key >= 0:
                j = key + len(b'"traceEvents"')
                while j < len(buf) and buf[j] in b" \t\r\n:":
                    j += 1
                if j < len(buf):
                    if buf[j : j + 1] != b"[":
                        raise ParseError(path, "traceEvents is not an array")
                    header = bytes(buf[:key])
                    body = j + 1
                    break
        if not data or len(buf) > MAX_HEADER:
            if not data and i >= len(buf):
                if r.problem:
                    raise ParseError(path, r.problem)
                raise ParseError(path, "empty file" if not buf else "file holds only whitespace")
            while data:  # say what this JSON is, when it parses
                data = r.read(READ_BYTES)
                buf += data
            if r.problem:
                raise ParseError(path, f"{r.problem} before any trace events")
            try:
                obj = orjson.loads(buf)
            except orjson.JSONDecodeError as e:
                raise ParseError(path, f"invalid or truncated JSON and no traceEvents array ({e})") from None
            raise ParseError(path, f"not a trace: JSON without a traceEvents array ({describe(obj)})")

    # 2. Whole chunks of events, as long as more content follows.
    pos = body
    search = pos + chunk
    eof = False
    while True:
        while not eof and len(buf) - pos < 2 * chunk:
            data = r.read(chunk)
            if data:
                buf += data
            else:
                eof = True
        progressed = False
        while search < len(buf):
            m = _BOUNDARY.search(buf, search)
            if m is None:
                search = max(len(buf) - 8, search)
                break
            if decode(_array(buf, pos, m.start() + 1)):
                pos = m.end() - 1
                progressed = True
                break
            search = m.end()  # the cut fell inside a value: try the next boundary
        if progressed:
            if pos >= 2 * chunk:  # drop what was decoded now and then (each drop moves the rest)
                del buf[:pos]
                pos = 0
            search = pos + chunk
            continue
        if eof:
            break
        data = r.read(max(chunk, len(buf)))
        if data:
            buf += data
        else:
            eof = True

    # 3. The last piece: up to the array's end, or up to the cut.
    closes = _closes(buf, pos, header)
    for close, top in closes:
        piece = buf[pos:close]
        if not piece.strip(_WS) or decode(b"[" + piece + b"]"):
            return StreamResult(top, r.problem is not None, r.problem, r.total)
    top = _head_only(header, path)
    _decode_until_cut(buf, pos, decode)
    problem = r.problem or "truncated or damaged JSON (the traceEvents array does not end cleanly)"
    return StreamResult(top, True, problem, r.total)


def _array(buf: bytearray, start: int, end: int) -> bytes:
    """``buf[start:end]`` in array brackets, copied once."""
    with memoryview(buf) as v:
        return b"".join((b"[", v[start:end], b"]"))


def _closes(buf: bytearray, pos: int, header: bytes | None) -> list[tuple[int, dict]]:
    """Candidate ends of the array, latest first: each ']' after which the rest of the
    top-level object parses.  A later array (Kineto's "INFO" lines) can pass this test too;
    the caller settles it, since a body that runs past the true end never decodes."""
    out: list[tuple[int, dict]] = []
    p = len(buf)
    for _ in range(256):
        p = buf.rfind(b"]", max(pos - 1, 0), p)
        if p < 0:
            break
        tail = bytes(buf[p + 1 :])
        if header is None:
            if not tail.strip(_WS):
                out.append((p, {}))
            continue
        try:
            top = orjson.loads(header + b'"traceEvents":[]' + tail)
        except orjson.JSONDecodeError:
            continue
        if isinstance(top, dict):
            top.pop("traceEvents", None)
            out.append((p, top))
            if len(out) >= 8:
                break
    return out


def _head_only(header: bytes | None, path: str) -> dict:
    """The top-level keys before traceEvents, for a file with no readable end."""
    if not header:
        return {}
    text = header.rstrip()
    if text.endswith(b","):
        text = text[:-1]
    try:
        top = orjson.loads(text + b"}")
    except orjson.JSONDecodeError:
        raise ParseError(path, "truncated JSON: the keys before traceEvents are incomplete") from None
    return top if isinstance(top, dict) else {}


def _decode_until_cut(buf: bytearray, pos: int, decode: Decoder) -> int:
    """The content was cut inside ``buf[pos:]``: keep the whole events before the cut."""
    tail = bytes(buf[pos:]).rstrip(_WS).rstrip(b",")
    candidates = [pos + len(tail)] + [m.start() + 1 for m in _BOUNDARY.finditer(buf, pos)][::-1]
    for b in candidates[:256]:
        if b > pos and decode(b"[" + buf[pos:b] + b"]"):
            return b
    return pos


def describe(obj: Any) -> str:
    """A few words on what a JSON document that is not a trace looks like."""
    if isinstance(obj, dict):
        keys = set(obj)
        if {"nodes", "schema"} <= keys:
            return "looks like a PyTorch Execution Trace (Chakra); give its Kineto twin"
        if "entries" in keys and "pg_config" in keys:
            return ("looks like a PyTorch Flight Recorder dump, which tracelens does not analyse: torch's `torchfrtrace DIR` "
                    "analyses a job's dumps; record the job with the PyTorch profiler (torch.profiler) for a report")
        if {"header", "coll_perf"} <= keys:
            return "looks like NCCL Inspector output, which tracelens does not analyse"
        if "schema_version" in keys and "ranks" in keys:
            return "looks like a tracelens report"
        shown = ", ".join(sorted(map(str, keys))[:5])
        return f"top-level keys: {shown}" if shown else "empty object"
    return f"top level is a {type(obj).__name__}"
