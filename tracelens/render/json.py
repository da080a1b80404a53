"""The versioned JSON report (DESIGN.md 5) as bytes: indented, keys in the report's order,
every string printable (``views.printable_json``: no control character reaches a terminal that
shows the file)."""

from __future__ import annotations

from typing import Any

from tracelens.render import tables as views


def render_json(d: dict[str, Any]) -> bytes:
    import orjson

    # the newline by orjson: adding it after would copy the whole report once more (23 MB at 256 ranks)
    return views.printable_json(orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))


class JsonRenderer:
    """The report dict as the JSON report (``render_json``)."""

    name = "json"
    suffixes = (".json",)

    def render(self, report: dict[str, Any]) -> bytes:
        return render_json(report)


RENDERER = JsonRenderer()
