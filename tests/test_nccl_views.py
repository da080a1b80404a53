"""The NCCL verdict in the HTML report (tracelens/render/html/nccl.py) and in the TUI
(tracelens.tui.panes.NcclPane): the verdict, per group the members x seq timeline (states, the
first divergence), the divergent calls' frames, the communicators and the bandwidth table; the
page's numbers are the JSON's; hostile strings from a dump are escaped."""

from __future__ import annotations

import asyncio
import copy
import html
import json
import re
from pathlib import Path

import polars as pl

from tests.test_nccl_report import _rows
from tracelens.analysis.job.hang import diagnose
from tracelens.analysis.nccl import analyze_nccl
from tracelens.render.html import render_html
from tracelens.store.nccl import nccl_only

ROOT = Path(__file__).resolve().parent
HOSTILE = "<script>alert(1)</script>"


def _grids(page: str) -> dict[str, dict[str, str]]:
    """group -> member -> the states string the page's SVG carries."""
    out: dict[str, dict[str, str]] = {}
    for svg in re.findall(r"<svg class='nccl-grid'.*?</svg>", page, re.S):
        group = html.unescape(re.search(r"data-group='([^']*)'", svg).group(1))
        out[group] = {html.unescape(m): html.unescape(s) for m, s in re.findall(r"data-member='([^']*)' data-states='([^']*)'", svg)}
    return out


def _mismatch_rows():
    # 3 members, seqs 1-3 all-reduce count 4 completed; at seq 4 member 1 all-gathers (started), 0 and 2 all-reduce
    done = [(m, "0", s, "allreduce", 4, "completed", 3) for m in "012" for s in (1, 2, 3)]
    rows = _rows(done + [("0", "0", 4, "allreduce", 4, "started", 3), ("1", "0", 4, "allgather", 4, "started", 3),
                         ("2", "0", 4, "allreduce", 4, "scheduled", 3)])
    frames = json.dumps([{"name": HOSTILE, "filename": "/job/train<b>.py", "line": 7}])
    return rows.with_columns(pl.lit(frames).alias("frames"), pl.lit(HOSTILE).alias("group_desc"))


def _report_of(diag: dict) -> dict:
    d = json.loads((ROOT / "golden" / "sample_job_2ranks.json").read_text())  # a profiled job's report
    d["job"]["nccl_diagnosis"] = diag
    return d


def test_timeline_grid_by_hand():
    v = diagnose(_mismatch_rows())
    # seq 1..4: C C C, then member 0 started (S), 1 started (S, the odd one), 2 scheduled (Q)
    assert v["timeline"] == [{"group": "0", "group_desc": HOSTILE, "size": 3, "members_total": 3, "members": [0, 1, 2],
                              "states": ["CCCS", "CCCS", "CCCQ"], "seq_from": 1, "seq_to": 4, "seq_first": 1, "seq_last": 4,
                              "divergence": {"kind": "mismatch", "seq": 4}, "odd_members": [1]}]
    # member 1 never enters seq 4: "." there, the divergence is seq 4 not entered
    done = [(m, "0", s, "allreduce", 4, "completed", 2) for m in "01" for s in (1, 2)]
    g = diagnose(_rows(done + [("0", "0", 3, "allreduce", 4, "started", 2)]))["timeline"][0]
    assert g["states"] == ["CCS", "CC."] and g["divergence"] == {"kind": "not_entered", "seq": 3} and g["odd_members"] == [1]


def test_html_section_escapes_and_equals_the_json():
    d = _report_of(diagnose(_mismatch_rows()))
    page = render_html(d).decode()
    assert "<script>alert" not in page and "train<b>" not in page
    assert html.escape(HOSTILE) in page or "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    sec = page[page.index("<section id='nccl-section'>"):]
    assert page.index("id='pipeline-section'") < page.index("id='nccl-section'") if "pipeline-section" in page else True
    v = d["job"]["nccl_diagnosis"]
    assert _grids(sec) == {"0": {"0": "CCCS", "1": "CCCS", "2": "CCCQ"}}
    assert re.search(r"class='nccl-divergence' data-seq='4' data-kind='mismatch'", sec)
    assert "data-verdict='mismatch'" in sec and "<b class='nccl-culprits'>rank 1</b>" in sec
    # each cell: seq and state as in the JSON (4 seqs x 3 members)
    cells = re.findall(r"data-seq='(\d+)' data-state='(\w+)'", sec)
    want = [(str(1 + i), {"C": "completed", "S": "started", "Q": "scheduled"}[c]) for s in v["timeline"][0]["states"] for i, c in enumerate(s)]
    assert cells == want
    assert html.escape(v["summary"], quote=True) in sec


def test_bandwidth_table_when_the_report_has_one(tmp_path):
    rows = [{"path": "x<i>.txt", "test": "all_reduce_perf", "collective": "allreduce", "nranks": 8, "bytes": 1048576, "count": 262144,
             "dtype": "float", "redop": "sum", "root": -1, "in_place": False, "time_us": 25.3, "algbw_gbps": 41.44, "busbw_gbps": 72.52,
             "wrong": 0}]
    d = _report_of(diagnose(_mismatch_rows()))
    assert "nccl-bw" not in render_html(d).decode()
    d["job"]["nccl"] = {"bandwidth": rows}
    page = render_html(d).decode()
    table = re.search(r"<table class='sortable nccl-bw'>(.*?)</table>", page, re.S).group(1)
    head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", table)]
    assert dict(zip(head, cells, strict=True)) == {k: str(v) for k, v in rows[0].items()}


def test_standalone_report_of_real_mismatch_dumps(dumps):
    found, warnings = nccl_only([dumps["mismatch"]])
    d = analyze_nccl(found, warnings)
    page = render_html(d).decode()
    v = d["job"]["nccl_diagnosis"]
    assert v["verdict"] == "mismatch" and page.index("id='nccl-section'") < page.index("id='warnings'" if d["warnings"] else "</body>")
    assert _grids(page) == {g["group"]: {str(m): s for m, s in zip(g["members"], g["states"], strict=True)} for g in v["timeline"]}
    g0 = next(g for g in v["timeline"] if g["divergence"])
    assert g0["divergence"]["kind"] == "mismatch" and g0["odd_members"] == v["culprits"]
    assert "fr_recorder.py" in page  # the divergent calls' frames


# ---------------------------------------------------------------------------------------------
# the TUI


def _grid_rows(app, i: int) -> list[str]:
    from textual.widgets import Static

    return str(app.query_one(f"#nccl-grid-{i}", Static).render()).splitlines()


def test_tui_opens_a_folder_of_real_dumps_at_the_nccl_view(dumps):
    from tests.tui_pilot import settle
    from tracelens.tui import make_app
    from tracelens.tui.nccl import LABEL_W

    async def go(which):
        app = make_app([str(dumps[which])], use_cache=False)
        async with app.run_test(size=(140, 45)) as pilot:
            await settle(app, pilot)
            assert app.error is None, app.error
            assert app.query_one("#tabs").active == "nccl"
            v = app.report["job"]["nccl_diagnosis"]
            verdict = str(app.query_one("#nccl-verdict").render())
            assert verdict.splitlines()[0] == f"NCCL verdict: {v['summary']}"
            for i, g in enumerate(v["timeline"]):
                rows = _grid_rows(app, i)[2 if g["divergence"] else 1:]
                # one row per member: its label, then a cell per seq (█, ▌ at the divergence)
                assert [r[:LABEL_W].strip() for r in rows] == [f"rank {m}" for m in g["members"]]
                assert all(len(r[LABEL_W:]) == g["seq_to"] - g["seq_from"] + 1 for r in rows)
                if g["divergence"]:
                    assert _grid_rows(app, i)[1].index("▼") == LABEL_W + g["divergence"]["seq"] - g["seq_from"]
            await pilot.press("1")  # no Overview in a report of NCCL records alone: nothing happens, no traceback
            await settle(app, pilot)
            assert app.query_one("#tabs").active == "nccl"
            return v

    v = asyncio.run(go("hang"))
    assert v["verdict"] == "hang" and v["culprits"] == [1] and "fr_recorder.py" in json.dumps(v["frames"])
    assert asyncio.run(go("mismatch"))["verdict"] == "mismatch"


def test_tui_profiled_job_with_a_diagnosis_has_the_nccl_tab():
    from tests.tui_pilot import open_view, settle
    from tracelens.tui import make_app

    async def go(d):
        app = make_app(report=d)
        async with app.run_test(size=(140, 45)) as pilot:
            await settle(app, pilot)
            tabs = app.query_one("#tabs")
            await open_view(app, pilot, "n")
            return tabs.active, (_grid_rows(app, 0) if app.query("#nccl-grid-0") else None)

    plain = json.loads((ROOT / "golden" / "sample_job_2ranks.json").read_text())
    assert asyncio.run(go(copy.deepcopy(plain)))[0] == "overview"  # no diagnosis: no NCCL view, "n" does nothing
    active, rows = asyncio.run(go(_report_of(diagnose(_mismatch_rows()))))
    assert active == "nccl" and [r[12:] for r in rows[2:]] == ["███▌", "███▌", "███▌"] and rows[2].startswith("rank 1") is False
    assert rows[3].startswith("rank 1")


def test_tui_shows_a_group_name_that_looks_like_markup():
    """A process group named '[/]<b>pg' (Flight Recorder dumps carry any name) in a saved report
    once crashed the NCCL view (Textual MarkupError: the group's title was parsed as markup)."""
    from tests.tui_pilot import open_view, settle
    from tracelens.tui import make_app

    d = _report_of(diagnose(_mismatch_rows()))
    for g in d["job"]["nccl_diagnosis"]["timeline"]:
        g["group"], g["group_desc"] = "[/]<b>pg", "[bold]x[/bold]"

    async def go():
        app = make_app(report=d)
        async with app.run_test(size=(140, 45)) as pilot:
            await settle(app, pilot)
            await open_view(app, pilot, "n")
            return [str(lb.render()) for lb in app.query(".section")]

    labels = asyncio.run(go())
    assert any(t.startswith("group [/]<b>pg ([bold]x[/bold]):") for t in labels), labels
