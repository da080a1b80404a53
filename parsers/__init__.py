"""One module per input format.  Each parser is a pure function ``path -> (frame, TraceMeta)``.

``sniff`` looks at a file's first bytes and says which format it is; ``parser_for`` gives the
parser of a format (a module that fits ``Parser``), or says why that format is recognised but
not analysed.  A new format is one module here and one entry in ``PARSERS``.
"""

from __future__ import annotations

import importlib
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tracelens.model.errors import ParseError, UnreadableError, UnsupportedFormat

if TYPE_CHECKING:
    import polars as pl

    from tracelens.model.schema import TraceMeta

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # Nsight Systems' own report format (not documented; not SQLite)
# NCCL_DEBUG=INFO output ("host:pid:tid [dev] NCCL INFO ..."), and PyTorch's NCCL watchdog messages
_NCCL_LOG = re.compile(rb"\bNCCL (?:INFO|WARN|TRACE|ERROR|ABORT)\b|\bNCCL version \d|\bWorkNCCL\(|ProcessGroupNCCL")
# nccl-tests (all_reduce_perf ...) tables: their header, or a row's "<type> <redop>"
_NCCL_TESTS = re.compile(rb"\bout-of-place\b|\balgbw\b|\bbusbw\b|#\s*nThread\b|"
                         rb"\b(?:float|half|bfloat16|double|int8|uint8|int32|uint32|int64|uint64)\s+(?:sum|prod|max|min|avg|none)\b")
# the NCCL example profiler plugin's Chrome-trace array: its own event categories
_NCCL_PLUGIN = re.compile(rb'"cat"\s*:\s*"(?:GROUP_API|COLL_API|P2P_API|KERNEL_LAUNCH|GROUP|COLL|P2P|PROXY|NET|NET_IB|NET_SOCK|GPU)"'
                          rb'\s*,\s*"ph"\s*:\s*"[be]"')
RECORD_TORCH = "record the job with the PyTorch profiler (torch.profiler) for a report"


def unsupported(path: Path, head: bytes) -> str | None:
    """What a file tracelens recognises but does not analyse is, and what to do instead (the
    README's table of inputs); None for anything else.  ``head``: its first bytes, decompressed."""
    if path.name.lower().endswith(NSYS_REPORT_SUFFIXES):
        return ("looks like an Nsight Systems report (.nsys-rep), which tracelens cannot read: export it with "
                "`nsys export --type sqlite FILE.nsys-rep` and give tracelens the .sqlite")
    if is_pickle(head):  # a pickle (protocol 2-5) that is not a Flight Recorder dump (``sniff`` knows those)
        return "a Python pickle, not a trace (tracelens unpickles only Flight Recorder dumps, and those safely)"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b"["):
        return None  # JSON: the Kineto parser says what it is (a Flight Recorder JSON dump among others)
    return None


def is_pickle(head: bytes) -> bool:
    return len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5


def nccl_format(head: bytes) -> str | None:
    """``flight_recorder`` (a dump: pickle or JSON), ``nccl_log`` (NCCL_DEBUG output, PyTorch's
    NCCL watchdog lines), ``nccl_tests`` (all_reduce_perf ... output), ``nccl_inspector`` (NCCL
    Inspector JSON Lines), ``nccl_profiler`` (the example profiler plugin's trace) or None, from a
    file's first bytes."""
    if is_pickle(head):
        return "flight_recorder" if (b"pg_config" in head or b"entries" in head or b"profiling_name" in head) else None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"{":
        if b'"header"' in head and (b'"coll_perf"' in head or b'"p2p_perf"' in head or b'inspector_output_format' in head):
            return "nccl_inspector"
        if b'"entries"' in head and (b'"collective_seq_id"' in head or b'"pg_config"' in head or b'"pg_status"' in head):
            return "flight_recorder"
        return None
    if re.match(rb"\[\s*(?:[{\]]|$)", text):  # a JSON array: the profiler plugin's, or another tool's (Kineto says)
        return "nccl_profiler" if _NCCL_PLUGIN.search(head) else None
    if _NCCL_TESTS.search(head):  # nccl-tests output (its NCCL lines too)
        return "nccl_tests"
    if _NCCL_LOG.search(head):
        return "nccl_log"
    return None


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
    from tracelens.model import limits

    from .jsonstream import ContentReader

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
    nccl = nccl_format(head)
    if nccl:
        return nccl
    what = unsupported(path, head)
    if what:
        raise UnsupportedFormat(str(path), what)
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped:  # more than the head's worth of leading whitespace: look past it
        stripped = _after_whitespace(path)
    # JSON: an object, or an array of them (a Chrome trace's); "[rank0]: ...", "[1,3]<stdout>: ..." are a log's lines
    if stripped[:1] == b"{" or re.match(rb"\[\s*(?:[{\]]|$)", stripped):
        return "kineto"
    if not stripped:
        raise ParseError(str(path), "file holds only whitespace")
    if b"\x00" not in head and (_gzip_mentions_nccl(path, _gzip_scan_limit(path)) if _is_gzip(path) else _NCCL_LOG.search(tail_bytes(path))):
        # a job's output (a Slurm .out, a torchrun rank's stderr) whose NCCL lines or PyTorch watchdog timeouts come
        # after megabytes of the program's own: the watchdog's message is at the end, where the job died
        return "nccl_log"
    raise ParseError(str(path), "not a trace: neither JSON nor gzip-compressed JSON nor an Nsight SQLite export")


TAIL_BYTES = 1 << 18
GZIP_SCAN_BYTES = 1 << 28  # content of a gzip file scanned for NCCL lines when its head is no format's (256 MB)
GZIP_SCAN_OTHER = 1 << 24  # the same for a file whose name does not say it is a log or a job's output (16 MB)
_LOG_NAME = re.compile(r"\.(?:log|out|err|txt)(?:\.\d+)?\.gz$|std(?:err|out)|slurm|nccl|rank", re.I)


def _gzip_scan_limit(path: Path) -> int:
    # a folder may hold other gzip files (checkpoints, datasets): only a log's name earns the long scan
    return GZIP_SCAN_BYTES if _LOG_NAME.search(path.name) else GZIP_SCAN_OTHER


def _is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _gzip_mentions_nccl(path: Path, limit: int = GZIP_SCAN_BYTES) -> bool:
    """Whether a gzip file's content holds an NCCL or watchdog line in its first ``limit`` bytes
    (its end cannot be read without inflating what comes before it: the scan streams, 1 MB at a
    time, each block searched with the previous one's last 4 KB, so that a line cut between two
    blocks is found).  Only a file whose head no format claims is scanned; a cut or corrupt
    stream ends the scan (what was read counts)."""
    from .jsonstream import ContentReader

    r = ContentReader(path)
    try:
        seen, carry = 0, b""
        while seen < limit:
            block = r.read(1 << 20)
            if not block:
                return False
            seen += len(block)
            if _NCCL_LOG.search(carry + block):
                return True
            carry = block[-4096:]
        return False
    except (ParseError, OSError, zlib.error):
        return False
    finally:
        r.close()


def tail_bytes(path: Path, n: int = TAIL_BYTES) -> bytes:
    """The last ``n`` bytes of the file (as stored: a plain file's)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read(n)
    except OSError:
        return b""


class Parser(Protocol):
    """What a parser module holds: its format ``NAME`` (what ``sniff`` says), ``PARSER_VERSION``
    (part of the cache key: bump it when the table a parse gives changes) and ``parse``, which
    reads one file into an ``EVENT_SCHEMA`` frame and its ``TraceMeta``, or raises ParseError.

    A format whose one file may hold several ranks (an nsys export of several GPU processes or
    devices) also has ``parts(path) -> list[dict]`` (each with its ``index``; a list of one or
    none: the file is one rank) and takes ``parse(path, part=...)`` for one of them; the store
    then gives each part its own handle, cache entry (its key ends in ``-p<index>``) and rank."""

    NAME: str
    PARSER_VERSION: str

    def parse(self, path: str | Path, *, keep_python: bool = False,
              progress: Callable[[int], None] | None = None) -> tuple[pl.DataFrame, TraceMeta]: ...


# format name -> the module (in this package) that parses it, imported when first asked for
PARSERS: dict[str, str] = {"kineto": ".kineto", "nsys": ".nsys"}
# formats of NCCL's own records: no event table (no timeline of kernels), read on their own into
# collective rows (``read(path, file) -> tracelens.model.nccl.NcclParse``)
COLLECTIVE_PARSERS: dict[str, str] = {"nccl_log": ".nccl.log", "flight_recorder": ".nccl.flight_recorder",
                                      "nccl_tests": ".nccl.tests_table", "nccl_inspector": ".nccl.inspector",
                                      "nccl_profiler": ".nccl.plugin"}
NCCL_ALONE = ("are read on their own: give tracelens only NCCL records (logs, dumps, nccl-tests, Inspector, profiler plugin) for their "
              "report, or join them to a profiled job with --nccl PATH")


def collective_parser_for(fmt: str):
    """The module that reads format ``fmt`` (one of ``COLLECTIVE_PARSERS``) into collective rows."""
    return importlib.import_module(COLLECTIVE_PARSERS[fmt], __name__)


def parser_for(fmt: str, path: Path | None = None) -> Parser:
    """The parser of format ``fmt`` (a name ``sniff`` gives); UnsupportedFormat for a format
    without one (``path`` names the file in that message)."""
    module = PARSERS.get(fmt)
    if fmt in COLLECTIVE_PARSERS:
        what = {"flight_recorder": "Flight Recorder dumps", "nccl_tests": "nccl-tests outputs",
                "nccl_inspector": "NCCL Inspector files", "nccl_profiler": "NCCL profiler plugin traces"}.get(fmt, "NCCL logs")
        raise UnsupportedFormat(str(path or fmt), f"looks like one of the {what}, which {NCCL_ALONE}")
    if module is None:
        raise UnsupportedFormat(str(path or fmt), f"{fmt} files are not supported yet "
                                                  "(PyTorch profiler JSON and Nsight Systems SQLite exports only)")
    return importlib.import_module(module, __name__)
