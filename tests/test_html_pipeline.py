"""The HTML report's pipeline section: stages x time of one step per rank as static SVG whose
numbers are the JSON's (each lane's window and bubble, each block's and bubble's ns), the ranks'
bubble table, every string escaped; the text report's pipeline lines."""

from __future__ import annotations

import json
import re
from html import unescape

from tests import pipesim as ps
from tests.conftest import real_traces
from tracelens.analysis import analyze
from tracelens.render import tables as views
from tracelens.render.html import render_html
from tracelens.render.text import render_text
from tracelens.store.job import load


def _section(page: str) -> str:
    s = page[page.index("<section id='pipeline-section'>"):]
    return s[:s.index("</section>")]


def test_section_has_the_json_numbers(tmp_path):
    sim = ps.simulate("interleaved", 2, 4, v=2, latency_ns=20_000, annotations="pp")
    d = analyze(load(ps.write(sim, tmp_path), use_cache=False)).to_dict()
    sec = _section(render_html(d).decode())
    lanes = re.findall(r'<g class="pp-lane" data-rank="(\d+)" data-stage="([^"]*)" data-window-ns="(\d+)" data-bubble-ns="(\d+)">(.*?)</g>',
                       sec, re.S)
    assert len(lanes) == 2
    for (rank, stage, window, bubble, body), r in zip(lanes, d["ranks"]):
        pr, view = r["pipeline"], r["pipeline"]["view"]
        st = next(s for s in pr["steps"] if s["step"] == view["step"])
        assert (int(rank), int(stage), int(window), int(bubble)) == (r["rank"], pr["stage"], st["window_ns"], st["bubble_ns"])
        blocks = [int(x) for x in re.findall(r'class="pp-block" data-ns="(\d+)"', body)]
        assert blocks == [b["e"] - b["s"] for b in sorted(view["blocks"], key=lambda b: (b["s"], b["e"]))]
        assert sum(int(x) for x in re.findall(r'class="pp-bubble" data-ns="(\d+)"', body)) == st["bubble_ns"]
    pipe = d["job"]["pipeline"]
    text = unescape(sec)
    assert "interleaved, p=2 stages, m=4 micro-batches, v=2" in text and f"theory {100 * pipe['theory_fraction']:.1f}%" in text
    for r in d["ranks"]:
        assert f'data-v="{r["pipeline"]["bubble_ns"]}"' in sec and f'data-v="{r["pipeline"]["warmup_ns"]}"' in sec


def test_strings_are_escaped_and_no_pipeline_keeps_its_evidence(tmp_path):
    d = analyze(load(sorted((real_traces() / "hta" / "trace_filter").glob("*.json.gz")))).to_dict()
    d = json.loads(json.dumps(d))
    d["job"]["pipeline"]["evidence"].append("<script>alert(1)</script>")
    sec = _section(render_html(d).decode())
    assert "<script>alert" not in sec and "&lt;script&gt;" in sec
    assert "2 of 128 ranks" in unescape(sec) and "pp-lane" not in sec


def test_text_report_lines(tmp_path):
    sim = ps.simulate("1f1b", 4, 8, slow_stage=2, slow_factor=1.6)
    d = analyze(load(ps.write(sim, tmp_path), use_cache=False)).to_dict()
    text = render_text(d)
    assert "pipeline: 1f1b, p=4 stages, m=8 micro-batches (confidence high)" in text
    assert "slow stage" in text and "(stage 2, +39% compute)" in text
    assert all(f"rank {r} stage {r}: bubble" in text for r in range(4))
    assert views.pipeline_summary_lines({"job": {}, "ranks": []}) == []
