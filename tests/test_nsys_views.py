"""The views of nsys ranks: ``tracelens info`` on an export (its tables and row counts against
sqlite3, version, capture range, GPU processes), each rank's source in the TUI's and the HTML's
ranks tables (only when the job has nsys exports), and the TUI timeline's NVTX host row."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3

import polars as pl
import pytest

from tests.conftest import SAMPLE_TRACES, real_traces
from tests.nsys_build import from_kineto
from tracelens import cli
from tracelens.analysis import analyze
from tracelens.analysis.timeline import HOST_STREAM, JobTimeline, Timeline
from tracelens.model.errors import EXIT_OK
from tracelens.render.tables import rank_rows, shows_sources
from tracelens.store.job import load

NSYS = real_traces() / "nsys"
EXPORTS = sorted(NSYS.glob("*.sqlite"))
H200 = NSYS / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite"
CPU = NSYS / "generated_nsys2022.4.2.1_cpu_nvtx_osrt_demo.sqlite"
JOB2 = SAMPLE_TRACES / "job_2ranks"


def _sql(path, q):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(q).fetchall()
    finally:
        con.close()


# ---- tracelens info --------------------------------------------------------------------------

@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.name[:24])
def test_info_says_what_the_export_holds(path, capsys):
    assert cli.main(["info", "--no-cache", "--json", str(path)]) == EXIT_OK
    n = json.loads(capsys.readouterr().out)["nsys"][0]
    tables = [t for (t,) in _sql(path, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'ENUM_%'")]
    assert sorted(n["tables"]) == sorted(tables)
    for t in tables:
        assert n["tables"][t] == _sql(path, f'SELECT count(*) FROM "{t}"')[0][0]
    meta = dict(_sql(path, "SELECT name, value FROM " + ("META_DATA_EXPORT" if "META_DATA_EXPORT" in tables else "EXPORT_META_DATA")))
    assert n["nsys_version"] == meta["EXPORT_PRODUCT_VERSION"] and n["export_schema"] == meta["EXPORT_SCHEMA_VERSION"]
    start, stop = _sql(path, "SELECT startTime, stopTime FROM ANALYSIS_DETAILS")[0]
    assert (n["capture"]["start_ns"], n["capture"]["end_ns"], n["capture"]["source"]) == (start, stop, "ANALYSIS_DETAILS")
    assert n["capture"]["session_start_utc_ns"] == _sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        ((pid, ns),) = _sql(path, "SELECT (globalPid >> 24) & 16777215, sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1")
        (proc,) = n["gpu_processes"]
        assert (proc["pid"], proc["kernel_ns"], proc["devices"]) == (pid, ns, [0]) and proc["name"].startswith("./")
    else:
        assert n["gpu_processes"] == []
    assert cli.main(["info", "--no-cache", str(path)]) == EXIT_OK
    text = capsys.readouterr().out
    assert f"nsys        {meta['EXPORT_PRODUCT_VERSION']}" in text and "(from ANALYSIS_DETAILS)" in text
    assert "  tables      " in text and "    StringIds " in text
    assert text.count(str(path)) == 1  # one block per file: its events, then what the export holds


def test_info_capture_range_from_the_events_without_analysis_details(tmp_path, capsys):
    from tests.nsys_build import Export

    ex = Export(tmp_path / "bare.sqlite", ("NVTX_EVENTS",))
    for a, b in ((100, 400), (250, 900)):
        ex.insert("NVTX_EVENTS", start=a, end=b, eventType=59, text="r", globalTid=(1 << 48) | (5 << 24) | 5)
    assert cli.main(["info", "--no-cache", "--json", str(ex.close())]) == EXIT_OK
    cap = json.loads(capsys.readouterr().out)["nsys"][0]["capture"]
    assert (cap["start_ns"], cap["end_ns"], cap["source"]) == (100, 900, "events")


def test_info_of_a_directory_of_exports(tmp_path, capsys):
    d = tmp_path / "job"
    d.mkdir()
    for r, p in enumerate((H200, CPU)):
        shutil.copyfile(p, d / f"rank{r}.sqlite")
    assert cli.main(["info", "--no-cache", "--json", str(d)]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert [n["path"].rsplit("/", 1)[1] for n in out["nsys"]] == ["rank0.sqlite", "rank1.sqlite"]


# ---- the source of each rank -----------------------------------------------------------------

@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Rank 0 as an nsys export (its Kineto trace's GPU work), rank 1 as its Kineto trace."""
    from tracelens.parsers.kineto import parse as kineto

    d = tmp_path_factory.mktemp("mixed")
    shutil.copyfile(JOB2 / "rank-1.json.gz", d / "rank-1.json.gz")
    shutil.copyfile(JOB2 / "tracelens.toml", d / "tracelens.toml")
    from_kineto(kineto(JOB2 / "rank-0.json.gz")[0], d / "rank0.sqlite")
    return d


def test_ranks_tables_name_the_source(mixed, tmp_path, capsys):
    d = analyze(load([mixed], use_cache=False)).to_dict()
    assert shows_sources(d) and [(r["rank"], r["source"]) for r in rank_rows(d)] == [(0, "nsys"), (1, "kineto")]
    out = tmp_path / "r.html"
    assert cli.main(["report", "--no-cache", str(mixed), "-o", str(out)]) == EXIT_OK
    html = out.read_text()
    ranks = html[html.index("<h2>Ranks</h2>"):]
    assert "<th" in ranks and ">source<" in ranks[:ranks.index("</table>")]
    assert ">nsys<" in ranks[:ranks.index("</table>")] and ">kineto<" in ranks[:ranks.index("</table>")]
    kineto = analyze(load([JOB2], use_cache=False)).to_dict()
    assert not shows_sources(kineto)  # a Kineto job's tables are as they were


# ---- the timeline's NVTX host row ------------------------------------------------------------

def test_an_nsys_rank_has_an_nvtx_host_row(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    shutil.copyfile(H200, d / "rank0.sqlite")
    shutil.copyfile(H200, d / "rank1.sqlite")
    job = load([d], use_cache=False)
    whole = JobTimeline(job)
    lazy = JobTimeline(job, keep=1)  # the second file's tracks from a scan, its rows read when drawn
    assert [t.label for t in whole.tracks] == [t.label for t in lazy.tracks] == [
        "r0 NVTX", "r0 GPU", "r0 s7", "r1 NVTX", "r1 GPU", "r1 s7"]
    assert (whole.start, whole.end, whole.n_events) == (lazy.start, lazy.end, lazy.n_events)
    host = [t for t in whole.tracks if t.is_host]
    assert all(t.stream == HOST_STREAM and not t.is_union for t in host)
    # the window and the event count are the GPU's, as without the host rows
    gpu = _sql(H200, "SELECT min(start), max(end) FROM (SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                     "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET)")[0]
    assert whole.end - whole.start == gpu[1] - gpu[0]
    kernels = _sql(H200, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert whole.n_events == 2 * (kernels + 2)  # kernels, the copy and the fill of each rank
    # every NVTX range of the rank is on its host row; at a time inside nested ranges, the innermost
    n_ranges = _sql(H200, "SELECT count(*) FROM NVTX_EVENTS WHERE end IS NOT NULL AND end > start")[0][0]
    cells = whole.cells([host[0].id], whole.start, whole.end, 200)[host[0].id]
    assert cells and all(0 < c.busy <= 1 and c.kclass == "nvtx" for c in cells.values())
    rows = job.events(file=1).filter(pl.col("cat").cast(pl.String).str.starts_with("nvtx")).collect()
    assert 0 < rows.height <= n_ranges
    # a time inside the most deeply nested ranges: the start of the shortest range that lies inside another
    nested = rows.join(rows, how="cross").filter((pl.col("ts_ns_right") < pl.col("ts_ns"))
                                                 & (pl.col("ts_ns_right") + pl.col("dur_ns_right") > pl.col("ts_ns") + 1))
    t = int(nested.sort("dur_ns").row(0, named=True)["ts_ns"]) + 1
    ev = lazy.event_at(host[1].id, t)
    inside = rows.filter((pl.col("ts_ns") <= t) & (pl.col("ts_ns") + pl.col("dur_ns") >= t))
    assert inside.height >= 2 and ev["track"] == host[1].id and ev["kclass"] == "nvtx"
    assert ev["dur_ns"] == inside["dur_ns"].min()
    assert whole.longest(ev["name"]) is None  # a range is not a kernel


def test_kineto_ranks_have_no_host_row():
    job = load([JOB2], use_cache=False)
    assert not any(t.is_host for t in JobTimeline(job).tracks)
    # the same tracks as the GPU rows alone (what the widget and the snapshots were made with)
    assert [t.label for t in JobTimeline(job).tracks] == [t.label for t in Timeline(job.events().collect()).tracks]


def test_a_cpu_only_capture_has_its_host_row():
    tl = JobTimeline(load([CPU], use_cache=False))
    assert [t.label for t in tl.tracks] == ["r0 NVTX"] and tl.end > tl.start and tl.n_events == 0


def test_tui_shows_the_source_and_the_nvtx_row(mixed):
    from tracelens.tui import make_app
    from tracelens.tui.panes import VIEWS
    from tracelens.tui.widgets.table import FilterTable
    from tracelens.tui.widgets.timeline import TimelineView

    job = load([mixed], use_cache=False)
    report = analyze(job).to_dict()
    timeline_key = str(1 + next(i for i, (pid, _, _) in enumerate(VIEWS) if pid == "timeline-tab"))

    async def go():
        app = make_app(report=report, trace=job)
        app.animation_level = "none"
        async with app.run_test(size=(140, 40)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.press("2")
            await pilot.pause()
            ranks = app.query_one("#ranks-table", FilterTable)
            assert [c.key for c in ranks.columns][:3] == ["rank", "source", "device"]
            assert [(r["rank"], r["source"]) for r in ranks.shown] == [(0, "nsys"), (1, "kineto")]
            await pilot.press(timeline_key)
            await app.workers.wait_for_complete()
            for _ in range(3):
                await pilot.pause()
            view = app.query_one(TimelineView)
            assert [t.label for t in view.tracks][:2] == ["r0 NVTX", "r0 GPU"]
            assert not any(t.is_host for t in view.tracks if t.rank == 1)
            status = str(app.query_one("#timeline-status").render())
            assert status.startswith("r0 NVTX (host, NVTX ranges)")
            assert "NVTX ranges (host)" in str(app.query_one("#legend").render())
            await pilot.press("g")  # the GPU rows only: no host row
            await pilot.pause()
            assert all(t.is_union for t in view.tracks)

    asyncio.run(go())
