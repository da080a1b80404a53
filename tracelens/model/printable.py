"""Text from a file made safe for a terminal: every string a trace or a saved report holds
passes through ``printable`` before the text report, the TUI or the CLI shows it."""

from __future__ import annotations

import re
from typing import Any

# What may not reach a terminal from a trace or a saved report: whole ESC sequences (CSI colours and
# cursor moves, OSC titles and hyperlinks, DCS/APC strings, two-byte escapes), the other C0 and C1
# control characters (newlines too: every field is one line), and the bidi controls that reorder text.
_ESCAPE_SEQ = r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~]?)|\x9b[0-?]*[ -/]*[@-~]?"
_UNPRINTABLE = re.compile(_ESCAPE_SEQ + r"|[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
REPLACEMENT = "\ufffd"


def printable(s: str) -> str:
    """``s`` safe to print on a terminal: each ESC sequence and every other control character
    becomes one U+FFFD (shown, not obeyed), a tab a space.  Used by the text report, the TUI and
    the CLI's messages on every string that came from a file (the HTML page shows the same text,
    escaped)."""
    if not _UNPRINTABLE.search(s) and "\t" not in s:
        return s
    return _UNPRINTABLE.sub(REPLACEMENT, s).replace("\t", " ")


# the same characters as UTF-8 in JSON text (valid UTF-8: these bytes are only ever these characters);
# orjson already writes every C0 control, ESC included, as \u00XX
_JSON_UNPRINTABLE = re.compile(rb"\xc2[\x80-\x9f]|\xd8\x9c|\xe2\x80[\x8e\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def printable_json(raw: bytes) -> bytes:
    """JSON text (orjson's) with the C1 controls and bidi controls inside its strings written as
    ``\\uXXXX`` escapes: the same data, and nothing a terminal obeys when the file is printed."""
    return _JSON_UNPRINTABLE.sub(lambda m: b"\\u%04x" % ord(m.group().decode()), raw)


def printable_report(d: Any) -> Any:
    """A copy of a report (or any part of one) with every string, dict keys included, made
    ``printable``; numbers and structure unchanged."""
    if isinstance(d, str):
        return printable(d)
    if isinstance(d, dict):
        return {printable(k) if isinstance(k, str) else k: printable_report(v) for k, v in d.items()}
    if isinstance(d, list):
        return [printable_report(v) for v in d]
    return d
