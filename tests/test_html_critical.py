"""The HTML report's critical-path section: per rank its kept steps' stacked bars and top events,
the same numbers as the JSON, names escaped; no section (and no change) without --critical-path."""

from __future__ import annotations

import copy
import re
from html import unescape

from tests.conftest import real_traces
from tests.test_critical import ON, K, L, X, write
from tracelens.analysis import analyze
from tracelens.model.summary import kept_indices
from tracelens.model.units import fmt_ns
from tracelens.render.html import render_html
from tracelens.store.job import load


def bars(section: str) -> list[dict[str, int]]:
    """Each stacked bar's parts (category -> ns), in the page's order."""
    out = []
    for svg in re.findall(r'<svg class="cp-bar".*?</svg>', section, re.S):
        out.append({unescape(c): int(ns) for c, ns in re.findall(r'data-cat="([^"]*)" data-ns="(\d+)"', svg)})
    return out


def test_section_has_the_json_numbers():
    d = analyze(load([real_traces() / "hta/trace_filter"]), ON).to_dict()
    page = render_html(d).decode()
    section = page[page.index("<section id='critical'>"):]
    section = section[:section.index("</section>")]
    want = []
    for r in d["ranks"]:
        cp = r["critical_path"]
        want.append(cp["by_category_ns"])
        want += [cp["steps"][i]["by_category_ns"] for i in kept_indices(r["steps"])]
    assert bars(section) == want
    for r in d["ranks"]:
        for i in kept_indices(r["steps"]):
            for e in r["critical_path"]["steps"][i]["top_events"]:
                assert f'data-v="{e["ns"]}">{fmt_ns(e["ns"])}</td>' in section


def test_names_escaped_and_no_section_without_the_path(tmp_path):
    bad = '<script>alert(1)</script>"&'
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), X("cpu_op", bad, 0, 90), L(30, 5, 1), K("k", 38, 2, corr=1)]
    p = write(tmp_path, ev)
    d = analyze(load([p], use_cache=False), ON).to_dict()
    assert any(e["name"] == bad for e in d["ranks"][0]["critical_path"]["steps"][0]["top_events"])
    page = render_html(d).decode()
    section = page[page.index("<section id='critical'>"):page.index("</section>", page.index("<section id='critical'>"))]
    assert "<script>alert" not in section and "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&amp;" in section
    plain = copy.deepcopy(d)
    for r in plain["ranks"]:
        r["critical_path"] = None
    plain["job"]["critical_path"] = None
    assert "<section id='critical'>" not in render_html(plain).decode()
    off = analyze(load([p], use_cache=False)).to_dict()
    assert "id='critical-path'" not in render_html(off).decode()
