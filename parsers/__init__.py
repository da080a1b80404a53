"""One module per input format.  Each parser is a pure function ``path -> (frame, TraceMeta)``.

``sniff`` looks at a file's first bytes and says which parser applies.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from tracelens.errors import ParseError, UnreadableError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"


def head_bytes(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of the file's content (decompressed when gzip)."""
    with open(path, "rb") as fh:
        start = fh.read(n)
    if start[:2] == GZIP_MAGIC:
        try:
            d = zlib.decompressobj(wbits=31)
            return d.decompress(start, n)
        except zlib.error as e:
            raise ParseError(str(path), f"corrupt gzip header ({e})") from None
    return start


def _after_whitespace(path: Path) -> bytes:
    """The content's first bytes after its leading whitespace (empty when there are none),
    reading no further than ``limits.max_event_bytes``."""
    from tracelens import limits
    from tracelens.parsers.jsonstream import ContentReader

    r = ContentReader(path)
    try:
        seen = 0
        while seen <= limits.max_event_bytes():
            block = r.read(1 << 20)
            if not block:
                return b""
            seen += len(block)
            rest = block.lstrip(b"\xef\xbb\xbf \t\r\n")
            if rest:
                return rest[:16]
        return b""
    finally:
        r.close()


def sniff(path: Path) -> str:
    """Return the format name of ``path`` or raise ParseError saying why it is not a trace."""
    try:
        head = head_bytes(path)
    except OSError as e:
        raise UnreadableError(str(path), f"cannot read file ({e.strerror or e})") from None
    if not head:
        with open(path, "rb") as fh:
            raw = fh.read(2)
        raise ParseError(str(path), "empty gzip stream" if raw[:2] == GZIP_MAGIC else "empty file")
    if head.startswith(SQLITE_MAGIC):
        return "nsys"
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped:  # more than the head's worth of leading whitespace: look past it
        stripped = _after_whitespace(path)
    if stripped[:1] in (b"{", b"["):
        return "kineto"
    if not stripped:
        raise ParseError(str(path), "file holds only whitespace")
    raise ParseError(str(path), "not a trace: neither JSON nor gzip-compressed JSON nor an Nsight SQLite export")
