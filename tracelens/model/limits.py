"""The bounds that keep memory and time finite on any input, each overridable by an
environment variable (DESIGN §7).  A file that passes one is refused with a one-line error
naming the limit and its variable, before the process holds more than a few times the limit.

``TRACELENS_MAX_EVENT_MB`` (default 64)
    The largest piece of JSON the trace reader buffers whole: one event, the keys before the
    ``traceEvents`` array, or the keys after it.  Kineto's largest events are a few KB (a
    collective's args); 64 MB is far beyond any real one.  A piece past it is refused having
    buffered at most about twice this; one just under it (a 60 MB name) is read at a peak RSS
    of about ten times it (the name is cut to 64 KB in the table).
``TRACELENS_MAX_INFLATE`` (default 200)
    How much a gzip-compressed trace may expand: past 256 MB of content, a file that has
    expanded more than this many times its size on disk is taken for a decompression bomb.
    Real traces expand 5-30x (the worst of the 58 real ones in the test data: 30x).
``TRACELENS_MAX_REPORT_BYTES`` (default 256 MiB)
    The largest saved report (``--load``, ``--compare``, ``tracelens open report.json``) read,
    and the most its HTML page's embedded report may expand to (``tracelens.model.saved``).

A value that is not a positive number is a usage error (exit 2) naming the variable.
"""

from __future__ import annotations

import math
import os

from tracelens.model.errors import UsageError

MB = 1 << 20
INFLATE_FREE_BYTES = 256 << 20  # below this much content, any expansion is allowed


def _number(var: str, default: float) -> float:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return default
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise UsageError(f"{var}={raw!r}: give a positive number")
    return v


def max_event_bytes() -> int:
    return int(_number("TRACELENS_MAX_EVENT_MB", 64) * MB)


def max_inflate() -> float:
    return _number("TRACELENS_MAX_INFLATE", 200)


def max_report_bytes() -> int:
    return int(_number("TRACELENS_MAX_REPORT_BYTES", 256 * MB))
