"""The front ends' data: timeline cells (exact arithmetic and a property), and the views the TUI
and the HTML report draw from the report dict."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLE_TRACES
from tracelens.analysis import analyze
from tracelens.analysis.timeline import Timeline
from tracelens.model.schema import conform
from tracelens.render import tables as views
from tracelens.store.job import load


def gpu_events(rows: list[tuple[int, int, int, int, str]]) -> pl.DataFrame:
    """(rank, stream, ts, dur, kclass) kernels as an event table."""
    return conform(pl.DataFrame({
        "file": [r for r, *_ in rows], "rank": [r for r, *_ in rows], "kind": ["kernel"] * len(rows),
        "name": [f"k{i}" for i in range(len(rows))], "device": [0] * len(rows), "stream": [s for _, s, *_ in rows],
        "ts_ns": [t for _, _, t, _, _ in rows], "dur_ns": [d for *_, d, _ in rows], "kclass": [k for *_, k in rows],
    }, schema_overrides={"file": pl.Int32, "rank": pl.Int32, "device": pl.Int32, "stream": pl.Int64, "ts_ns": pl.Int64, "dur_ns": pl.Int64}))


def test_cells_exact():
    # stream 7: gemm [0,100), comm [150,250); stream 8: norm [50,200).  Window [0,400) in 4 cells of 100 ns:
    #   s7: cell0 gemm busy 1.0; cell1 comm [150,200) 0.5; cell2 comm [200,250) 0.5; cell3 idle
    #   s8: cell0 norm [50,100) 0.5; cell1 norm [100,200) 1.0
    #   GPU (union [0,250)): cell0 1.0, cell1 1.0, cell2 0.5
    tl = Timeline(gpu_events([(0, 7, 0, 100, "gemm"), (0, 7, 150, 100, "comm"), (0, 8, 50, 150, "norm")]))
    assert [t.label for t in tl.tracks] == ["r0 GPU", "r0 s7", "r0 s8"]
    c = tl.cells([0, 1, 2], 0, 400, 4)
    as_tuples = {t: {i: (cell.busy, cell.kclass) for i, cell in cs.items()} for t, cs in c.items()}
    assert as_tuples[1] == {0: (1.0, "gemm"), 1: (0.5, "comm"), 2: (0.5, "comm")}
    assert as_tuples[2] == {0: (0.5, "norm"), 1: (1.0, "norm")}
    assert as_tuples[0] == {0: (1.0, "busy"), 1: (1.0, "busy"), 2: (0.5, "busy")}
    assert tl.busy_ns(0, 0, 400) == 250 and tl.busy_ns(1, 120, 400) == 100
    assert tl.event_at(1, 160)["kclass"] == "comm" and tl.event_at(1, 120) is None
    # nearest within the slack: the gemm ends 20 ns before, the comm starts 30 ns after
    assert tl.event_at(1, 120, slack=40)["kclass"] == "gemm" and tl.event_at(1, 135, slack=40)["kclass"] == "comm"
    # the dominant class of a shared cell is the one with the most time in it
    tl2 = Timeline(gpu_events([(0, 1, 0, 30, "gemm"), (0, 1, 30, 70, "norm")]))
    assert tl2.cells([1], 0, 100, 1)[1][0].kclass == "norm"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5000), st.integers(0, 800)), min_size=1, max_size=40),
    st.integers(1, 200),
    st.integers(0, 3000),
    st.integers(1, 4000),
)
def test_union_cells_sum_to_busy_time(kernels, width, t0, span):
    """For the union ("GPU") row, the busy shares of the cells times the cell length add up to the
    busy time inside the window: no time is lost or counted twice, whatever the overlaps."""
    tl = Timeline(gpu_events([(0, s, t, d, "gemm") for s, t, d in kernels]))
    union = tl.tracks[0]
    assert union.is_union
    t1 = t0 + span
    cells = tl.cells([union.id], t0, t1, width)[union.id]
    dt = span / width
    total = sum(c.busy * dt for c in cells.values())
    assert abs(total - tl.busy_ns(union.id, t0, t1)) < 1e-6 * max(1, span)
    # a zero-length kernel still marks its cell (busy 0: drawn as the lowest block)
    assert all(0 <= c.busy <= 1.0 + 1e-12 for c in cells.values())


def test_views_follow_the_report():
    report = analyze(load([SAMPLE_TRACES / "job_2ranks"])).to_dict()
    # no MFU here (the trace names no GPU): the time bars partition the GPU time exactly
    bars, kind = views.waterfall(report)
    assert kind == "time" and abs(sum(b["fraction"] for b in bars) - 1.0) < 1e-12
    g = report["job"]["gpu_time_ns"]
    assert sum(b["ns"] for b in bars) == g["idle"] + g["compute"] + g["exposed_comm"] + g["exposed_memcpy"]
    rows = views.rank_rows(report)
    assert [r["rank"] for r in rows] == [0, 1]
    for row, r in zip(rows, report["ranks"]):
        assert row["idle"] == r["gpu_time_ns"]["idle"] / r["window_ns"]
    steps = views.step_rows(report, rank=1)
    assert {s["rank"] for s in steps} == {1} and len(steps) == len(report["ranks"][1]["steps"])
    kernels = views.kernel_rows(report)
    assert sum(k["total_ns"] for k in kernels) == sum(r["kernels_total"]["total_ns"] for r in report["ranks"])  # every kernel
    classes = views.class_rows(report)
    assert abs(sum(c["share"] for c in classes) - 1.0) < 1e-12
    stats = views.step_stats(report)
    assert stats["count"] == 2 and stats["max"] == report["job"]["step_time_ns"]["max"]


def test_views_with_mfu_use_the_waterfall():
    report = analyze(load([SAMPLE_TRACES / "h100_bert_small"])).to_dict()
    bars, kind = views.waterfall(report)
    assert kind == "mfu" and bars == report["job"]["waterfall"]
    step = report["ranks"][0]["steps"][-1]
    assert views.waterfall(report, rank=0, step=step["step"])[0] == step["waterfall"]
    h = views.headline(report)
    assert h["mfu"] == report["job"]["mfu"] and h["gpu_model"] == "NVIDIA H100 SXM"
    assert views.fmt_speedup(1.118) == "12%" and views.fmt_speedup(4.255) == "4.3x" and views.fmt_speedup(None) == "-"


def test_outlier_ranks_against_the_median():
    """Step times 100, 101, 99, 100, 110 ms: the median is 100; rank 4 is 10% slower (flagged), rank 1
    1% (not, under 5%).  For MFU lower is worse: 0.40 vs a 0.50 median is 20% worse."""
    assert views.outliers([0, 1, 2, 3, 4], [100, 101, 99, 100, 110], higher_is_worse=True) == {4: 0.1}
    assert views.outliers([0, 1, 2], [0.5, 0.4, 0.5], higher_is_worse=False) == {1: pytest.approx(0.2)}
    assert views.outliers([0], [1.0], higher_is_worse=True) == {}
