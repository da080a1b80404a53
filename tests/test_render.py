"""The renderer registry (tracelens.render): one protocol, formats chosen by name or file suffix,
the HTML page's assets as package data, and rendering without polars (a saved or cached report
must re-render in a process that never imports it)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import subprocess
import sys
from importlib import resources

import orjson
import pytest

from tests.conftest import ROOT
from tracelens import render as registry
from tracelens.render import Renderer, format_for, render, renderer_for

GOLDEN = ROOT / "tests" / "golden"


@pytest.fixture
def clean_registry():
    saved = (dict(registry._modules), dict(registry._loaded), dict(registry._by_suffix))
    yield
    for now, before in zip((registry._modules, registry._loaded, registry._by_suffix), saved):
        now.clear()
        now.update(before)


@pytest.mark.parametrize("fmt", ["json", "text", "html"])
def test_each_builtin_renderer_is_the_one_the_registry_names(fmt):
    r = renderer_for(fmt)
    assert isinstance(r, Renderer) and r.name == fmt
    assert r.suffixes == registry._BUILTIN[fmt][1]  # the registry knows the suffixes without importing the module
    for s in r.suffixes:
        assert format_for(f"out/report{s}") == fmt and format_for(f"REPORT{s.upper()}") == fmt


def test_format_for_and_unknown_formats():
    assert format_for(None) == "text"  # stdout
    assert format_for("report.pdf") == "" and format_for("report") == ""
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        renderer_for("pdf")
    with pytest.raises(ValueError, match="unknown report format"):
        render({}, "")
    with pytest.raises(TypeError, match="report dict or an Analysis"):
        render([1, 2], "json")


def test_a_registered_renderer_is_chosen_by_name_and_suffix(clean_registry):
    class Keys:
        name = "keys"
        suffixes = (".keys",)

        def render(self, report):
            return " ".join(report).encode()

    registry.register(Keys())
    assert format_for("x.KEYS") == "keys" and "keys" in registry.formats()
    assert render({"a": 1, "b": 2}, "keys") == b"a b"
    with pytest.raises(ValueError, match="already taken"):
        registry.register(type("Clash", (), {"name": "clash", "suffixes": (".json",), "render": lambda self, d: b""})())
    with pytest.raises(ValueError, match="lower-case"):
        registry.register(type("Upper", (), {"name": "upper", "suffixes": (".UP",), "render": lambda self, d: b""})())
    with pytest.raises(TypeError, match="not a Renderer"):
        registry.register(object())
    assert format_for("x.json") == "json"  # a refused registration changed nothing


def test_render_takes_an_analysis_or_its_dict():
    from tracelens.analysis import analyze
    from tracelens.store.job import load

    a = analyze(load([str(ROOT / "sample_traces" / "job_2ranks")]))
    d = a.to_dict()
    for fmt in ("json", "text", "html"):
        assert render(a, fmt) == render(d, fmt)


def test_the_page_inlines_its_asset_files_and_its_policy_hashes_them():
    page = (GOLDEN / "sample_job_2ranks.json").read_bytes()
    html = render(orjson.loads(page), "html").decode()
    files = resources.files("tracelens.render.html")
    css, js = files.joinpath("page.css").read_text(), files.joinpath("page.js").read_text()
    assert f"<style>\n{css}</style>" in html and f"<script>\n{js}</script>" in html
    csp = re.search(r"Content-Security-Policy' content=\"([^\"]+)\"", html).group(1)

    def sha(text):  # computed here, from the page's own elements
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    script = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(script) == 1 and f"script-src {sha(script[0])};" in csp
    for style in re.findall(r"<style>(.*?)</style>", html, re.S):
        assert sha(style) in csp.split("style-src ")[1].split(";")[0]


def test_a_saved_report_renders_without_polars(tmp_path):
    """--load and a cached report: load the saved JSON (validated), render every format and a
    comparison, in a fresh process; polars (and Textual) are never imported.  The text of the
    saved golden report is the golden text, byte for byte."""
    code = f"""
import sys
from tracelens.model.saved import load_saved
from tracelens.render import render
from tracelens.render.compare import compare
d = load_saved({str(GOLDEN / "sample_job_2ranks.json")!r}, required=True)
out = {{fmt: render(d, fmt) for fmt in ("json", "text", "html")}}
base = load_saved({str(GOLDEN / "b200_eager.json")!r}, required=True)
for fmt in ("json", "text", "html"):
    render({{**d, "comparison": compare(base, d)}}, fmt)
open({str(tmp_path / "out.txt")!r}, "wb").write(out["text"])
open({str(tmp_path / "out.json")!r}, "wb").write(out["json"])
print(sorted(m for m in ("polars", "textual", "pyarrow", "numpy") if m in sys.modules))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
    assert (tmp_path / "out.txt").read_bytes() == (GOLDEN / "sample_job_2ranks.txt").read_bytes()
    assert (tmp_path / "out.json").read_bytes() == (GOLDEN / "sample_job_2ranks.json").read_bytes()


def test_text_html_and_tui_draw_the_one_waterfall_layout(monkeypatch):
    """Each front end draws the rows of ``views.waterfall_layout``, not its own: a layout whose
    labels and notes are marked shows the marks in the text report, the HTML page and the TUI's
    waterfall widget, each row once."""
    from rich.console import Console

    from tracelens.render import tables as views
    from tracelens.tui.widgets.waterfall import WaterfallChart

    d = orjson.loads((GOLDEN / "sample_job_2ranks.json").read_bytes())
    bars = d["job"]["waterfall"]
    real = views.waterfall_layout
    calls = []

    def marked(bars, *a, **k):
        rows = real(bars, *a, **k)
        calls.append(len(rows))
        return [{**r, "label": f"L{i}@{r['label'][:8]}", "note": f"N{i}"} for i, r in enumerate(rows)]

    monkeypatch.setattr(views, "waterfall_layout", marked)
    text = render(d, "text").decode()
    html = render(d, "html").decode()
    chart = WaterfallChart(bars, "mfu")
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(chart.render())
    tui = console.export_text()
    assert calls == [len(bars)] * 3
    for i, b in enumerate(bars):
        mark = f"L{i}@{b['label'][:8]}"
        assert text.count(mark) == 1 and html.count(f">{mark}<") == 1 and tui.count(mark) == 2  # the TUI: the row and its note
        assert f"(N{i})" in text and f">N{i}<" in html and f"{mark}: N{i}" in tui
