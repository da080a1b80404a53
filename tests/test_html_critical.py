"""The HTML report's critical-path section: per rank its kept steps' stacked bars and top events,
the same numbers as the JSON, names escaped; no section (and no change) without --critical-path."""

from __future__ import annotations

import copy
import json
import re
from html import unescape
from pathlib import Path

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
    # first the job's path (stitched across ranks): its kept steps' sum, then each kept step
    job = d["job"]["critical_path"]
    pos = lambda by: {c: ns for c, ns in by.items() if ns > 0}  # noqa: E731 (a bar draws its non-zero parts)
    want = [pos(job["by_category_ns"])] + [pos(st["by_category_ns"]) for st in job["steps"] if st["kept"]]
    for r in d["ranks"]:
        cp = r["critical_path"]
        want.append(pos(cp["by_category_ns"]))
        want += [pos(cp["steps"][i]["by_category_ns"]) for i in kept_indices(r["steps"])]
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


GOLDEN = Path(__file__).resolve().parent / "golden" / "resnet50_v100_2021_critical_path.json"


def _what_if_section(page: str) -> str:
    section = page[page.index("<section id='critical'>"):]
    section = section[:section.index("</section>")]
    if "id='what-if'" not in section:
        return ""
    part = section[section.index("id='what-if'"):]
    return part[:part.index("</table>")]


def test_what_if_next_to_the_upper_bound_and_escaped():
    # The ResNet-50 golden report (num_workers_0, --critical-path): only its input-bound suggestion
    # carries a what_if (data_loading=0 replayed: 118.479 ms per step, 1.385x; its bound 1.382x)
    d = json.loads(GOLDEN.read_text())
    with_wi = [s for s in d["suggestions"] if s.get("what_if")]
    assert [s["id"] for s in with_wi] == ["input_bound_high"]
    wi = with_wi[0]["what_if"]
    part = _what_if_section(render_html(d).decode())
    rows = re.findall(r"<tbody>(.*)", part, re.S)[0].split("</tr>")[:-1]
    assert len(rows) == 1
    cells = re.findall(r'<td class="[^"]*"(?: data-v="([^"]*)")?>(.*?)</td>', rows[0])
    assert [unescape(t) for _, t in cells[:2]] == [with_wi[0]["title"], "data_loading=0"]
    assert [float(v) for v, _ in cells[2:4]] == [with_wi[0]["est_speedup"], wi["predicted_speedup"]]  # the bound, then the replay
    assert cells[4] == (str(wi["predicted_step_ns"]), fmt_ns(118_479_000)) and float(cells[5][0]) == wi["predicted_mfu"]
    # a saved report's strings are escaped; a what_if without a change is left out
    bad = copy.deepcopy(d)
    s0 = next(s for s in bad["suggestions"] if s.get("what_if"))
    s0["title"], s0["what_if"]["change"] = "<script>t</script>", '<img src=x onerror="y">'
    bad["suggestions"].append({**copy.deepcopy(s0), "title": "no change", "what_if": {"predicted_speedup": 2.0}})
    part = _what_if_section(render_html(bad).decode())
    assert "<script>" not in part and "<img" not in part
    assert "&lt;script&gt;t&lt;/script&gt;" in part and "&lt;img src=x onerror=&quot;y&quot;&gt;" in part
    assert "no change" not in part
    # no what-if table where no suggestion has one
    for s in bad["suggestions"]:
        s.pop("what_if", None)
    assert _what_if_section(render_html(bad).decode()) == ""
