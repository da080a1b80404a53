"""Stream the ``traceEvents`` array of a Chrome-trace JSON file in chunks of whole events,
recovering past damaged events.

The file (plain or gzip) is decompressed block by block; the parser never holds the whole
content, and never more than a bounded piece of it (``tracelens.model.limits``).  A chunk boundary is
a ``}`` ``,`` ``{`` between two events; a boundary found by the fast byte search is *proved* by
decoding the chunk.  The decoder says where the first error lies: at the very end of the chunk
means the cut fell inside a value (a cut inside a string or a nested value always leaves the
chunk unbalanced), and a later boundary is tried, further each time; anywhere else means a bad
token in one event (``NaN``, invalid UTF-8, a raw control character, a lone surrogate, nesting
thousands deep, ...).  Then the whole events before it are decoded, the damaged event is
repaired (``repair``: the bad tokens made valid, with what was done counted) or skipped, and
decoding goes on after it: a bad byte costs one event and about one extra pass over its chunk.
Keys around the array (``deviceProperties``, ``distributedInfo``, Kineto's ``INFO`` lines)
are parsed from the bytes before the array and the bytes after its end.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracelens.model import limits
from tracelens.model.errors import ParseError

try:  # ISA-L's inflate (python-isal): zlib's API, about 3x faster (0.036 -> 0.011 s on a 35 MB trace)
    from isal import isal_zlib as zlib
except ImportError:  # a platform without its wheel
    import zlib

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
READ_BYTES = 1 << 20
MAX_DEPTH = 64  # deeper values inside a damaged event are replaced by null
WHERE_SHOWN = 5  # byte offsets named in a warning
_FAILED = object()
_WINDOW = 16 << 10  # the first window decoded after a damaged event

# decode(chunk) -> None when the chunk (a JSON array of events) was decoded and consumed, else
# the offset in ``chunk`` of its first error (``len(chunk)`` when the content ended early).
Decoder = Callable[[bytes], "int | None"]


class ContentReader:
    """The file's content, decompressed on demand when gzip; records a cut or corrupt stream
    and refuses a decompression bomb (``limits.max_inflate``)."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "rb")
        self.gz = self.fh.read(2) == b"\x1f\x8b"
        self.fh.seek(0)
        self.dec = zlib.decompressobj(wbits=31) if self.gz else None
        self.done = False
        self.problem: str | None = None  # set when a gzip stream is cut short or corrupt
        self.total = 0
        self.inflate = limits.max_inflate()

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
                if 0 < len(rest) < 2:  # a member ends a byte before a read boundary: the next magic spans it
                    rest += self.fh.read(READ_BYTES)
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
        if self.total > limits.INFLATE_FREE_BYTES and self.total > self.inflate * max(self.fh.tell(), 1):
            raise ParseError(
                str(self.path),
                f"gzip content expands more than {self.inflate:g}x its size on disk (a decompression bomb?); "
                "set TRACELENS_MAX_INFLATE to read it anyway",
            )
        return data


@dataclass
class StreamResult:
    top: dict[str, Any]  # the top-level keys other than traceEvents
    truncated: bool  # the array (or the gzip stream) was cut; whole events before it were kept
    problem: str | None  # what was wrong, when truncated
    content_bytes: int  # uncompressed bytes read
    repaired: Counter[str] = field(default_factory=Counter)  # what was mended in damaged events
    repaired_events: int = 0
    skipped_events: int = 0  # damaged events that could not be read even mended
    where: list[int] = field(default_factory=list)  # content offsets of the first damaged events
    notes: list[str] = field(default_factory=list)  # oddities of the file's shape (a second traceEvents key)


def stream_events(path: Path, decode: Decoder, chunk_bytes: int, progress: Callable[[int], None] | None = None) -> StreamResult:
    """Decode the traceEvents array of ``path`` chunk by chunk; ``progress(bytes)`` is told how
    far into the file (on disk) the reader is after each chunk."""
    spath = str(path)
    r = ContentReader(path)
    if progress is not None:
        inner = decode

        def decode(chunk: bytes) -> int | None:  # noqa: F811 - the same decoder, reporting as it goes
            err = inner(chunk)
            progress(r.fh.tell())
            return err
    try:
        return _Stream(r, spath, decode, chunk_bytes).run()
    finally:
        r.close()


# The tokens that matter for structure: strings (escapes included, possibly unterminated),
# brackets, and the bare words and numbers JSON does not allow.
# (strings in the unrolled form: a single character class per loop, so that the regex engine
# keeps no backtracking state per character - the alternation form costs ~100 bytes a byte)
_TOKEN = re.compile(
    rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|-?(?:NaN|Infinity|inf|nan)(?![A-Za-z0-9_])'
    rb"|-?\d{309,}(?:\.\d+)?(?:[eE][+-]?\d+)?|-?\d+(?:\.\d+)?[eE][+-]?\d{3,}",
    re.S,
)
_SUSPECT = re.compile(rb"[\\\x00-\x1f]")  # a string with none of these is valid JSON as it is
_BAD_ESCAPE = re.compile(r'\\(?![\\"/bfnrt]|u[0-9a-fA-F]{4})')


# strings (q: None when one runs past the end of what was read) and brackets: JSON's structure
_STRUCT = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?P<q>")?|[\[\]{}]', re.S)
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*(?P<q>")?', re.S)
_NOT_WS = re.compile(rb"[^ \t\r\n]")
_KEY = b'"traceEvents"'
_LOST_SCAN = 4 << 20  # a scan this far past the key's text without finding it at the top level is lost
_RAW_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class _KeyScan:
    """Finds the top-level ``"traceEvents"`` key of an object as its bytes arrive, skipping
    strings and nested values; each byte is scanned once (a string cut by the end of what has
    been read is resumed where it was left)."""

    def __init__(self, start: int):
        self.at = start  # where the next scan starts
        self.depth = 0
        self.in_string: int | None = None  # the start of a string that runs past what has been read
        self.ended = False  # the object closed without the key

    def find(self, buf: bytearray) -> tuple[int, int] | None:
        """(offset of the key, offset just after its ``:``), or None: not in ``buf`` yet."""
        if self.in_string is not None:
            m = _STRING_REST.match(buf, self.at)
            if m.group("q") is None:
                self.at = m.end()
                return None
            start, self.in_string = self.in_string, None
            self.at = m.end()
            found = self._key(buf, start, m.end())
            if found is not None:
                return found
        for m in _STRUCT.finditer(buf, self.at):
            c = buf[m.start()]
            if c == 0x22:  # '"'
                if m.group("q") is None:  # runs past what has been read
                    self.in_string = m.start()
                    self.at = m.end()
                    return None
                found = self._key(buf, m.start(), m.end())
                if found is not None:
                    return found
            elif c in b"[{":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    self.ended = True
                    return None
            self.at = m.end()
        self.at = max(self.at, len(buf))
        return None

    def _key(self, buf: bytearray, start: int, end: int) -> tuple[int, int] | None:
        if self.depth != 1 or end - start != len(_KEY) or buf[start:end] != _KEY:
            return None
        k = _NOT_WS.search(buf, end)
        if k is None:  # what follows has not arrived yet: look at the key again next time
            self.at = start
            return None
        return (start, k.start() + 1) if buf[k.start()] == 0x3A else None  # ":"


def deep_offset(chunk: bytes, limit: int) -> int:
    """Where the nesting in ``chunk`` first gets deeper than ``limit`` (1 when it never does)."""
    depth = 0
    for m in _STRUCT.finditer(chunk):
        c = chunk[m.start()]
        if c in b"[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c in b"]}":
            depth -= 1
    return 1


def repair(event: bytes) -> tuple[bytes, set[str]]:
    """The event's JSON with its bad tokens made valid, and what was mended: invalid UTF-8 and
    lone surrogates become U+FFFD, raw control characters in strings are escaped, invalid
    escapes are kept as text, ``NaN``/``Infinity``/``inf`` and numbers out of a double's range
    become null, and values nested deeper than ``MAX_DEPTH`` become null."""
    fixed, kinds, _ = _repair(event)
    return fixed, set(kinds)


def _repair(text: bytes) -> tuple[bytes, Counter[str], list[int]]:
    """``repair`` over any piece of JSON: (the mended bytes, how many tokens of each kind were
    mended, their offsets in the mended bytes).  Only what changes is copied."""
    kinds: Counter[str] = Counter()
    spots: list[int] = []
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        spots.append(e.start)
        text = text.decode("utf-8", "replace").encode()
        kinds["invalid UTF-8"] += 1
    out: list[bytes] = []
    size = 0  # bytes in out
    last = 0
    depth = 0
    skip_at = 0  # the depth of a value being replaced by null (0: none)
    skip_from = 0

    def put(start: int, end: int, new: bytes, kind: str) -> None:
        nonlocal last, size
        out.append(text[last:start])
        size += start - last
        spots.append(size)
        out.append(new)
        size += len(new)
        last = end
        kinds[kind] += 1

    for m in _TOKEN.finditer(text):
        c = text[m.start()]
        if skip_at:
            if c in b"[{":
                depth += 1
            elif c in b"]}":
                depth -= 1
                if depth < skip_at:
                    put(skip_from, m.end(), b"null", f"values nested deeper than {MAX_DEPTH}")
                    skip_at = 0
            continue
        if c == 0x22:  # '"'
            if _SUSPECT.search(text, m.start() + 1, m.end() - 1) is not None:
                tok = m.group()
                why: set[str] = set()
                new = _mend_string(tok, why)
                if new != tok:
                    put(m.start(), m.end(), new, min(why) if why else "strings")
        elif c in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                skip_at = depth
                skip_from = m.start()
        elif c in b"]}":
            depth -= 1
        elif c in b"-0123456789" and text[m.start() + 1 : m.start() + 2] not in (b"N", b"I", b"i", b"n"):
            if abs(float(m.group())) == float("inf"):
                put(m.start(), m.end(), b"null", "numbers out of range")
        else:
            put(m.start(), m.end(), b"null", "NaN or Infinity")
    if skip_at:  # the text ends inside the deep value
        put(skip_from, len(text), b"null", f"values nested deeper than {MAX_DEPTH}")
    if not out:
        return text, kinds, spots
    out.append(text[last:])
    return b"".join(out), kinds, spots


def _mend_string(tok: bytes, fixed: set[str]) -> bytes:
    try:
        orjson.loads(tok)
        return tok
    except orjson.JSONDecodeError:
        pass
    text = tok.decode()
    try:
        s = json.loads(text, strict=False)  # raw control characters and lone surrogates accepted
    except json.JSONDecodeError:
        try:
            s = json.loads(_BAD_ESCAPE.sub(r"\\\\", text), strict=False)
        except json.JSONDecodeError:
            return tok
        fixed.add("invalid escapes")
    if any(ord(ch) < 0x20 for ch in s):
        fixed.add("control characters")
    clean = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if clean != s:
        fixed.add("lone surrogates")
    return orjson.dumps(clean)


class _Stream:
    """One pass over the content: find the array, decode it chunk by chunk, read its end."""

    def __init__(self, r: ContentReader, path: str, decode: Decoder, chunk: int):
        self.r = r
        self.path = path
        self.decode = decode
        self.chunk = chunk
        self.buf = bytearray()
        self.base = 0  # content offset of buf[0]
        self.max_piece = limits.max_event_bytes()
        self.res = StreamResult({}, False, None, 0)
        self.closed_at: int | None = None  # the array's closing bracket, once a chunk ran into it

    # -- reading ---------------------------------------------------------------------------
    def _more(self, n: int) -> bool:
        data = self.r.read(n)
        self.buf += data
        return bool(data)

    def _too_big(self, what: str) -> ParseError:
        mb = self.max_piece // limits.MB
        return ParseError(self.path, f"{what} is larger than {mb} MB (set TRACELENS_MAX_EVENT_MB to read it anyway)")

    # -- the parts of the file -------------------------------------------------------------
    def run(self) -> StreamResult:
        header, body = self._find_array()
        if header is not None:
            header = self._sound_header(header)
        pos = self._chunks(body)
        self._end(pos, header)
        self.res.content_bytes = self.r.total
        return self.res

    def _sound_header(self, header: bytes) -> bytes:
        """The keys before the array as valid JSON: mended when damaged, else dropped (with a note)."""
        if _head_ok(header):
            return header
        fixed, what = repair(header)
        if what and _head_ok(fixed):
            self.res.notes.append(f"the keys before the traceEvents array held invalid JSON, read after mending it ({', '.join(sorted(what))})")
            return fixed
        self.res.notes.append("the keys before the traceEvents array are not valid JSON: they were ignored (GPU and rank unknown)")
        return b"{"

    def _find_array(self) -> tuple[bytes | None, int]:
        """(the bytes before the array's key, or None for a bare array; offset of the array's
        first element)."""
        buf = self.buf
        scan: _KeyScan | None = None
        seen = False  # the key's bytes have been read
        checked = 0  # how far they have been looked for
        i = 0  # the first byte that is not whitespace (len(buf) while there is none)
        while True:
            before = len(buf)
            data = self._more(READ_BYTES)
            if i >= before:  # still in the leading whitespace: look at the new bytes only
                if i == 0 and buf.startswith(b"\xef\xbb\xbf"):
                    i = 3
                first_m = _NOT_WS.search(buf, i)
                i = first_m.start() if first_m else len(buf)
            if i < len(buf):
                first = buf[i : i + 1]
                if first == b"[":
                    return None, i + 1
                if first != b"{":
                    raise ParseError(self.path, "not a trace: the content is not a JSON object or array")
                if scan is None:
                    scan = _KeyScan(i)
                # the scan runs once the key's bytes have arrived (a string may hold them too)
                seen = seen or buf.find(_KEY, max(checked - len(_KEY), 0)) >= 0
                checked = len(buf)
                found = scan.find(buf) if seen and not scan.ended else None
                if found is not None:
                    key, j = found
                    k = _NOT_WS.search(buf, j)
                    if k is not None:
                        if buf[k.start()] != 0x5B:  # "["
                            raise ParseError(self.path, "traceEvents is not an array")
                        return bytes(buf[i:key]), k.start() + 1  # from the "{" (no BOM, no leading whitespace)
                    scan.at = key  # the value has not arrived yet
                if seen and found is None:  # damaged keys may hide it: then the first "traceEvents": [ is taken
                    raw = _RAW_KEY.search(buf, i)
                    if raw is not None and (scan.ended or not data or scan.at - raw.end() > _LOST_SCAN):
                        self.res.notes.append("the JSON before the traceEvents array is damaged (its brackets or quotes do not pair up)")
                        return bytes(buf[i : raw.start()]), raw.end()
            if not data:
                if i >= len(buf):
                    if self.r.problem:
                        raise ParseError(self.path, self.r.problem)
                    raise ParseError(self.path, "empty file" if not buf else "file holds only whitespace")
                if self.r.problem:
                    raise ParseError(self.path, f"{self.r.problem} before any trace events")
                try:
                    obj = orjson.loads(buf)
                except orjson.JSONDecodeError as e:
                    raise ParseError(self.path, f"invalid or truncated JSON and no traceEvents array ({e})") from None
                raise ParseError(self.path, f"not a trace: JSON without a traceEvents array ({describe(obj)})")
            if len(buf) > self.max_piece:
                raise self._too_big("the JSON before the traceEvents array")

    def _chunks(self, pos: int) -> int:
        """Decode whole chunks of events while more content follows; the offset of the first
        event not decoded."""
        buf = self.buf
        chunk = self.chunk
        step = chunk
        search = pos + chunk
        eof = False
        while True:
            while not eof and len(buf) - pos < 2 * chunk:
                eof = not self._more(chunk)
            m = _BOUNDARY.search(buf, search) if search < len(buf) else None
            if m is not None:
                left = self._decode(pos, m.start() + 1, final=False)
                if self.closed_at is not None:  # the chunk ran past the array's end (keys after it hold objects)
                    return self.closed_at
                if left is None:  # all of it
                    pos = m.end() - 1
                    step = chunk
                    if pos >= 2 * chunk:  # drop what was decoded now and then (each drop moves the rest)
                        del buf[:pos]
                        self.base += pos
                        pos = 0
                    search = pos + chunk
                else:  # the cut fell inside a value: a later boundary, further each time
                    pos = left
                    search = max(m.end(), pos + step)
                    step *= 2
                continue
            if eof:
                return pos
            search = max(len(buf) - 8, search)
            if len(buf) - pos > self.max_piece:
                raise self._too_big(f"the JSON value at byte {self.base + pos} (an event, or what follows the events)")
            eof = not self._more(min(max(chunk, len(buf) - pos), self.max_piece + chunk - (len(buf) - pos)))

    def _end(self, pos: int, header: bytes | None) -> None:
        """The last piece: up to the array's end, or up to the cut."""
        buf = self.buf
        if self.closed_at is not None:
            self._after_close(pos, header)
            return
        closes = _closes(buf, pos, header)
        for close, top in closes:  # the clean case: the piece decodes as it is
            if _NOT_WS.search(buf, pos, close) is None or self.decode(_array(buf, pos, close)) is None:
                self._finish(top)
                return
        if closes:  # damaged events in the last piece: the first end that fits
            close, top = min(closes)
            left = self._decode(pos, close, final=True)
            if self.closed_at is not None:  # the array ends earlier than the last "]" that fits
                self._after_close(self.closed_at, header)
                return
            if left is None:
                self._finish(top)
                return
            pos = left
        self.res.top = _head_only(header, self.path)
        self._decode_until_cut(pos)
        self.res.truncated = True
        self.res.problem = self.r.problem or "truncated or damaged JSON (the traceEvents array does not end cleanly)"

    def _after_close(self, close: int, header: bytes | None) -> None:
        """The keys after the array, whose end a chunk ran into (``close``: its ``]``)."""
        buf = self.buf
        while self._more(READ_BYTES):
            if len(buf) - close > self.max_piece:
                raise self._too_big("the JSON after the traceEvents array")
        tail = bytes(buf[close + 1 :])
        doc = (header + b'"traceEvents":[]' if header is not None else b"[]") + tail
        try:
            top = orjson.loads(doc)
        except orjson.JSONDecodeError as e:
            top = None
            if "after document" in str(e):  # a second JSON document (files concatenated): the first is read
                end = byte_offset(doc, e)
                try:
                    top = orjson.loads(doc[:end])
                except orjson.JSONDecodeError:
                    pass
                else:
                    self.res.notes.append(f"{len(doc) - end} bytes after the end of the JSON document (another document?) were ignored")
            if top is None:
                self.res.notes.append("the JSON after the traceEvents array is damaged: its keys were ignored")
                top = _head_only(header, self.path)
        self._finish(top if isinstance(top, dict) else {})

    def _finish(self, top: dict) -> None:
        more = top.pop("traceEvents", None)
        if isinstance(more, list) and more:  # a second traceEvents key: its events are events too
            n = len(more)
            if self.decode(orjson.dumps(more)) is None:
                self.res.notes.append(f"a second traceEvents array: its {n} events were read too")
            else:
                self.res.notes.append(f"a second traceEvents array could not be read: its {n} events were skipped")
        self.res.top = top
        if self.r.problem is not None:
            self.res.truncated = True
            self.res.problem = self.r.problem

    def _decode_until_cut(self, pos: int) -> None:
        """The content was cut inside ``buf[pos:]``: keep the whole events before the cut."""
        buf = self.buf
        tail = bytes(buf[pos:]).rstrip(_WS).rstrip(b",")
        if tail.endswith(b"}"):
            ends = [pos + len(tail)]
        else:
            ends = []
        ends += [m.start() + 1 for m in _BOUNDARY.finditer(buf, pos)][::-1]
        for b in ends[:64]:
            if b <= pos:
                break
            left = self._decode(pos, b, final=False)
            if left is None:
                return
            pos = left

    # -- decoding with recovery ------------------------------------------------------------
    def _decode(self, pos: int, end: int, final: bool) -> int | None:
        """Decode the events in ``buf[pos:end]`` (``end`` just after an event's ``}``), past
        damaged ones.  None when all were consumed; else the offset of the first event of a
        remainder that runs past ``end`` (its error lies at its very end) - or, when not
        ``final``, of a damaged event whose end lies past ``end``.  After a damaged event the
        next ones are decoded in windows that start small and double, so that many damaged
        events in one chunk do not each cost a copy of the rest of it."""
        buf = self.buf
        bad_seen = 0  # damaged events met in this span
        window = 0  # 0: to ``end``
        while pos < end:
            stop, nxt = end, None
            if window and pos + window < end:
                nxt = _BOUNDARY.search(buf, pos + window, end)
                if nxt is not None:
                    stop = nxt.start() + 1
            chunk = _array(buf, pos, stop)
            err = self.decode(chunk)
            if err is None:
                if nxt is None:
                    return None
                pos = nxt.end() - 1
                window *= 2
                continue
            if err >= len(chunk) - 1:
                if nxt is None:
                    return pos
                window *= 2  # the window's end fell inside a value: a wider one
                continue
            at = pos + err - 1  # the offending byte in buf
            close = self._bracket(at)
            if close is not None and self.decode(_array(buf, pos, close[0])) is None:  # the events before a "]"
                if close[1] is None:  # the array's end
                    self.closed_at = close[0]
                    return None
                self._note_mended(close[0], Counter({"stray brackets": 1}), 1)  # a "]" between two events
                pos = close[1]
                window = _WINDOW
                continue
            bad_seen += 1
            if bad_seen == 2:  # a second one in this span: the damage is dense, mend the rest in one pass
                left = self._mend_span(pos, end)  # (tried once: when an event cannot be mended, event by event)
                if left is not _FAILED:
                    return left
            start = self._before(pos, at)
            m = _BOUNDARY.search(buf, at, end)
            if m is None and not final:
                return start
            stop = m.start() + 1 if m else end
            self._mend(start, stop)
            if m is None:
                return None
            pos = m.end() - 1
            window = _WINDOW
        return None

    def _mend_span(self, pos: int, end: int) -> int | None | object:
        """Mend all of ``buf[pos:end]`` at once (dense damage: one pass instead of one per event):
        None when it then decodes, ``pos`` when it runs past ``end``, else _FAILED (an event in it
        that cannot be mended: the caller goes on event by event)."""
        fixed, kinds, spots = _repair(bytes(self.buf[pos:end]))
        if not kinds:
            return _FAILED
        chunk = b"".join((b"[", fixed, b"]"))
        err = self.decode(chunk)
        if err is None:
            starts = [m.start() for m in _BOUNDARY.finditer(fixed)]
            events = len({bisect.bisect_right(starts, s) for s in spots})
            self._note_mended(pos, kinds, events)
            return None
        return pos if err >= len(chunk) - 1 else _FAILED

    def _note_mended(self, at: int, kinds: Counter[str], events: int) -> None:
        self._note_where(at)
        self.res.repaired_events += events
        self.res.repaired.update(kinds)

    def _note_where(self, at: int) -> None:
        if len(self.res.where) < WHERE_SHOWN:
            self.res.where.append(self.base + at)

    def _bracket(self, at: int) -> tuple[int, int | None] | None:
        """When the error at ``buf[at]`` is content after a ``]``: (that ``]``'s offset, None)
        when it reads as the end of the events array (followed by ``}`` or by ``,`` and a key),
        (its offset, the next event's) when it is a stray ``]`` between two events, else None."""
        buf = self.buf
        if buf[at - 1 : at] == b",":  # msgspec points one past the first trailing character
            at -= 1
        j = at - 1
        while j >= 0 and buf[j] in _WS:
            j -= 1
        if j < 0 or buf[j] != 0x5D:  # "]"
            return None
        k = at
        while k < len(buf) and buf[k] in _WS:
            k += 1
        nxt = buf[k : k + 1]
        if nxt == b"}":
            return j, None
        if nxt != b",":
            return None
        k += 1
        while k < len(buf) and buf[k] in _WS:
            k += 1
        after = buf[k : k + 1]
        if after == b'"':
            return j, None
        return (j, k) if after == b"{" else None

    def _before(self, pos: int, bad: int) -> int:
        """Decode the whole events of ``buf[pos:bad]``; the offset of the event that holds
        ``bad``.  The nearest boundary before ``bad`` is tried first: one inside the damaged
        event (a list of objects in its args) fails at its end and the one before is tried."""
        buf = self.buf
        window = max(pos, bad - (1 << 16))
        tried = 0
        for lo, hi in ((window, bad), (pos, window)):
            for m in reversed(list(_BOUNDARY.finditer(buf, lo, hi))):
                if tried >= 16:
                    return pos
                tried += 1
                if self.decode(_array(buf, pos, m.start() + 1)) is None:
                    return m.end() - 1
        return pos

    def _mend(self, start: int, stop: int) -> None:
        """One damaged event, ``buf[start:stop]``: decoded repaired, or skipped."""
        fixed_bytes, kinds, _ = _repair(bytes(self.buf[start:stop]))
        if kinds and self.decode(b"[" + fixed_bytes + b"]") is None:
            self._note_mended(start, Counter(dict.fromkeys(kinds, 1)), 1)
        else:
            self._note_where(start)
            self.res.skipped_events += 1


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
            out.append((p, top))
            if len(out) >= 8:
                break
    return out


def _head_keys(header: bytes) -> Any:
    """The keys before traceEvents (``{`` up to the key) closed as an object and parsed;
    orjson.JSONDecodeError when they are not valid JSON."""
    text = header.rstrip()
    return orjson.loads((text[:-1] if text.endswith(b",") else text) + b"}")


def _head_ok(header: bytes) -> bool:
    try:
        _head_keys(header)
    except orjson.JSONDecodeError:
        return False
    return True


def _head_only(header: bytes | None, path: str) -> dict:
    """The top-level keys before traceEvents, for a file with no readable end."""
    if not header:
        return {}
    try:
        top = _head_keys(header)
    except orjson.JSONDecodeError:
        raise ParseError(path, "truncated JSON: the keys before traceEvents are incomplete") from None
    return top if isinstance(top, dict) else {}


def byte_offset(doc: bytes, e: orjson.JSONDecodeError) -> int:
    """Where orjson's error lies in ``doc`` in bytes (it counts characters)."""
    return e.pos if doc.isascii() else len(doc.decode("utf-8", "replace")[: e.pos].encode())


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
