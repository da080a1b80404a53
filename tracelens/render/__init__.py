"""Renderers: report dict (``Analysis.to_dict()``, or a saved JSON report) -> bytes.

One protocol (``Renderer``: a ``name``, the file ``suffixes`` it is chosen for, and
``render(report_dict) -> bytes``) and one registry: ``renderer_for(fmt)``, ``format_for(path)``,
``render(report_or_analysis, fmt)``.  The built-in renderers are ``json`` (tracelens.render.json,
the versioned report of DESIGN.md 5), ``text`` (tracelens.render.text, the terminal summary) and
``html`` (tracelens.render.html, the self-contained page); each is imported when first asked for.

Renderers read only the report dict: they never read traces and never import polars, so a saved
or cached report re-renders without either (``--load``).  What every front end shows (rows,
bars, the one waterfall layout) is in ``tracelens.render.tables``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tracelens.render.json import render_json  # noqa: F401 (re-exported)
from tracelens.render.text import render_text, waterfall_text  # noqa: F401 (re-exported)


@runtime_checkable
class Renderer(Protocol):
    """Turns a report dict into the bytes of one output format."""

    name: str  # the format's name: render(report, name)
    suffixes: tuple[str, ...]  # lower-case file suffixes (".html") for which format_for picks this format

    def render(self, report: dict[str, Any]) -> bytes: ...


# the built-in formats: name -> (module defining RENDERER, its suffixes); modules load on first use
_BUILTIN: dict[str, tuple[str, tuple[str, ...]]] = {
    "json": ("tracelens.render.json", (".json",)),
    "text": ("tracelens.render.text", (".txt", ".text")),
    "html": ("tracelens.render.html", (".html", ".htm")),
}
_modules: dict[str, str] = {name: module for name, (module, _) in _BUILTIN.items()}
_loaded: dict[str, Renderer] = {}
_by_suffix: dict[str, str] = {s: name for name, (_, suffixes) in _BUILTIN.items() for s in suffixes}


def formats() -> tuple[str, ...]:
    """The names of the registered formats, in registration order."""
    return tuple(_modules)


def register(renderer: Renderer) -> None:
    """Add (or replace) a format.  Its suffixes must not belong to another format."""
    if not isinstance(renderer, Renderer) or not isinstance(renderer.name, str) or not renderer.name:
        raise TypeError(f"{renderer!r} is not a Renderer (name, suffixes, render(report) -> bytes)")
    bad = [s for s in renderer.suffixes if not (isinstance(s, str) and s.startswith(".") and s == s.lower())]
    if bad:
        raise ValueError(f"renderer {renderer.name!r}: suffixes must be lower-case and start with '.': {bad}")
    taken = {s: _by_suffix[s] for s in renderer.suffixes if _by_suffix.get(s, renderer.name) != renderer.name}
    if taken:
        raise ValueError(f"renderer {renderer.name!r}: suffixes already taken: {taken}")
    for s in [s for s, n in _by_suffix.items() if n == renderer.name]:
        del _by_suffix[s]
    _by_suffix.update(dict.fromkeys(renderer.suffixes, renderer.name))
    _modules.setdefault(renderer.name, "")
    _loaded[renderer.name] = renderer


def renderer_for(fmt: str) -> Renderer:
    """The renderer of format ``fmt`` ("json", "text", "html", or one registered); ValueError
    for a format nobody registered."""
    r = _loaded.get(fmt)
    if r is not None:
        return r
    module = _modules.get(fmt) if isinstance(fmt, str) else None
    if not module:
        raise ValueError(f"unknown report format {fmt!r}")
    r = importlib.import_module(module).RENDERER
    _loaded[fmt] = r
    return r


def format_for(path: str | None) -> str:
    """The format a path's suffix asks for: "text" for no path (stdout), "" for a suffix no
    renderer claims."""
    if path is None:
        return "text"
    return _by_suffix.get(Path(path).suffix.lower(), "")


def render(report: Any, fmt: str) -> bytes:
    """The report in ``fmt``.  ``report``: a report dict, or an ``Analysis`` (its ``to_dict()``).
    A ``comparison`` key (``--compare``) is rendered by each format."""
    if not isinstance(report, dict):
        to_dict = getattr(report, "to_dict", None)
        if to_dict is None:
            raise TypeError(f"render() takes a report dict or an Analysis, not {type(report).__name__}")
        report = to_dict()
    return renderer_for(fmt).render(report)


class _RenderModule(sys.modules[__name__].__class__):
    """``tracelens.render`` is this package once it is imported (Python binds a subpackage to its
    parent's attribute), so the package is callable as the public API's ``tracelens.render(analysis
    or report dict, fmt) -> bytes`` (tracelens/__init__.py), and its modules stay reachable."""

    def __call__(self, report: Any, fmt: str = "text") -> bytes:
        d = report.to_dict() if hasattr(report, "to_dict") else report
        if not isinstance(d, dict):
            raise TypeError(f"render() takes an Analysis or a report dict, not {type(report).__name__}")
        return render(d, fmt)


sys.modules[__name__].__class__ = _RenderModule
