"""One rank at a time: the Job's per-rank handles and their lazy window scans, the engines, the
RankSummary seam (picklable), cache hits served without workers, and the timeline read per rank
giving the same picture as one built over every rank's events."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLE_TRACES, real_traces
from tracelens.analysis import Options, analyze, rank_summary
from tracelens.analysis.timeline import JobTimeline, Timeline
from tracelens.engine import LocalEngine, ProcessEngine, choose
from tracelens.model.schema import TraceMeta, conform
from tracelens.store import job as jobmod
from tracelens.store.job import Job, RankHandle, load

JOB = SAMPLE_TRACES / "job_2ranks"


def _twice(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return 2 * x


def test_local_engine_yields_results_and_exceptions_by_index():
    got = dict(LocalEngine().map(_twice, [1, 2, 3, 4]))
    assert {k: v for k, v in got.items() if k != 2} == {0: 2, 1: 4, 3: 8}
    assert isinstance(got[2], ValueError) and str(got[2]) == "three"


def test_process_engine_same_answers_as_local():
    got = dict(ProcessEngine(2).map(_twice, [1, 2, 3, 4]))
    assert {k: v for k, v in got.items() if k != 2} == {0: 2, 1: 4, 3: 8}
    assert isinstance(got[2], ValueError)


def test_choose_starts_workers_only_for_real_work():
    assert isinstance(choose(None, jobmod.PARALLEL_MIN_BYTES, 8), LocalEngine)  # not above the bar
    assert isinstance(choose(None, jobmod.PARALLEL_MIN_BYTES + 1, 1), LocalEngine)  # one task: no pool
    assert isinstance(choose(1, 10**12, 8), LocalEngine)
    e = choose(4, 0, 3)  # the user asked for jobs: a pool, at most one worker per task
    assert isinstance(e, ProcessEngine) and e.workers == 3


def _kernels(rows: list[tuple[int, int]]) -> pl.DataFrame:
    return conform(pl.DataFrame({
        "kind": ["kernel"] * len(rows), "name": [f"k{i}" for i in range(len(rows))], "device": [0] * len(rows),
        "stream": [7] * len(rows), "ts_ns": [t for t, _ in rows], "dur_ns": [d for _, d in rows], "kclass": ["gemm"] * len(rows),
    }))


def _job(frames: list[pl.DataFrame], ranks: list[int]) -> Job:
    return Job([RankHandle(i, TraceMeta(path=f"f{i}", format="kineto", source="kineto", parser="test", parser_version="0", size_bytes=0, rank=r), frame=df) for i, (df, r) in enumerate(zip(frames, ranks))])


def test_events_window_rank_and_file():
    # kernels [0,10) [10,20) [30,40); window [15, 30): only [10,20) overlaps ([30,40) starts at its end)
    j = _job([_kernels([(0, 10), (10, 10), (30, 10)]), _kernels([(5, 100)])], [3, 3])
    got = j.events(file=0, window=(15, 30)).collect()
    assert got.get_column("ts_ns").to_list() == [10]
    assert got.get_column("file").to_list() == [0] and got.get_column("rank").to_list() == [3]
    # rank 3 is claimed by both files: both are scanned, each with its own file index
    both = j.events(rank=3, window=(15, 30), columns=["file", "ts_ns"]).collect()
    assert both.rows() == [(0, 10), (1, 5)]
    assert j.events().collect().height == 4 and j.events(rank=9).collect().height == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), max_size=30), st.integers(0, 1200), st.integers(0, 300))
def test_window_scan_is_the_overlap(rows, t0, width):
    j = _job([_kernels(rows)], [0])
    t1 = t0 + width
    got = sorted(j.events(file=0, window=(t0, t1), columns=["ts_ns", "dur_ns"]).collect().rows())
    want = sorted((t, d) for t, d in rows if t < t1 and (t + d > t0 or t == t0))
    assert got == want


def test_a_rank_summary_pickles_and_round_trips():
    j = load([JOB], use_cache=False)
    s = rank_summary(j.frame(1), 1, j.metas[1], Options())
    back = pickle.loads(pickle.dumps(s))
    assert back.result == s.result and back.pids == s.pids
    assert back.result.kernel_table.equals(s.result.kernel_table) and s.result.kernel_table.height > len(s.result.kernels)
    assert back.strips.equals(s.strips) and s.strips.height > 0
    assert back.collectives.equals(s.collectives) and back.step_starts.equals(s.step_starts)
    assert (back.first_ns, back.last_ns, back.events) == (s.first_ns, s.last_ns, s.events) and s.events == j.frame(1).height
    # what it holds is this rank's: one collective row per (group, seq, collective) of its comm kernels, and its steps' starts
    ev = j.frame(1)
    kernels = ev.filter((pl.col("kclass") == "comm") & pl.col("seq").is_not_null())
    assert s.collectives.height == kernels.select("group", "group_desc", "seq", "collective").unique().height > 0
    assert s.collectives.get_column("n_parts").sum() == kernels.height
    assert set(s.collectives.get_column("file")) == {1} and set(s.step_starts.get_column("file")) == {1}
    assert s.step_starts.height == ev.filter(pl.col("kind") == "step").height


def _job_dir(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for p in sorted(JOB.glob("*.json.gz")):
        shutil.copy(p, d / p.name)
    return d


def test_cache_hits_are_read_here_never_by_workers(tmp_path, monkeypatch):
    d = _job_dir(tmp_path)
    cold = load([d], jobs=2)  # parsed by two workers, which write the cache
    assert all(h.parquet is not None and h.frame is None for h in cold.handles)

    def no_pool(*a, **k):
        raise AssertionError("workers started for files in the cache")

    monkeypatch.setattr(ProcessEngine, "map", no_pool)
    warm = load([d], jobs=2)
    assert [h.parquet for h in warm.handles] == [h.parquet for h in cold.handles]
    for f in range(2):
        assert warm.frame(f).equals(load([d / f"rank-{f}.json.gz"], use_cache=False).frame(0).with_columns(
            pl.lit(f, pl.Int32).alias("file")))


def test_only_the_files_not_cached_are_parsed(tmp_path, monkeypatch):
    d = _job_dir(tmp_path)
    load([d / "rank-0.json.gz"])
    parsed = []
    real = jobmod._parse_task
    monkeypatch.setattr(jobmod, "_parse_task", lambda args: (parsed.append(os.path.basename(args[0])), real(args))[1])
    load([d])
    assert parsed == ["rank-1.json.gz"]


def test_cached_and_uncached_reports_are_identical(tmp_path):
    d = real_traces() / "hta/trace_filter"
    cold = analyze(load([d], use_cache=False)).to_dict()
    load([d])
    warm = analyze(load([d])).to_dict()
    assert json.dumps(warm, sort_keys=True) == json.dumps(cold, sort_keys=True)


def test_a_cache_entry_removed_after_the_load_is_parsed_again(tmp_path):
    d = _job_dir(tmp_path)
    load([d])
    j = load([d])
    want = load([d], use_cache=False).frame(1)
    j.handles[1].parquet.unlink()  # another run dropped it
    assert j.frame(1).equals(want)


@pytest.mark.parametrize("keep", [1, 16])
def test_job_timeline_is_the_timeline_of_all_events(keep):
    j = load([real_traces() / "hta/trace_filter"], use_cache=False)
    everything = Timeline(j.events().collect())
    tl = JobTimeline(j, keep=keep)
    assert tl.tracks == everything.tracks and (tl.start, tl.end) == (everything.start, everything.end)
    ids = [t.id for t in tl.tracks]
    mid = (tl.start + tl.end) // 2
    for a, b, w in ((tl.start, tl.end, 190), (mid, mid + (tl.end - tl.start) // 50, 80)):
        assert tl.cells(ids, a, b, w) == everything.cells(ids, a, b, w)
    for t in ids:
        assert tl.busy_ns(t, tl.start, mid) == everything.busy_ns(t, tl.start, mid)
        assert tl.event_at(t, mid, slack=10_000) == everything.event_at(t, mid, slack=10_000)
    name = everything.events.filter(pl.col("kclass") == "comm").get_column("name")[0]
    assert tl.longest(name)["dur_ns"] == everything.longest(name)["dur_ns"]
    assert len(tl._parts) <= keep


def test_the_reduce_reads_no_events(monkeypatch):
    """The job reduce (clocks, matching, stragglers, the timeline picture) reads summaries only:
    with Job.events refused, the analysis still gives the whole report, timeline included."""
    from tracelens.analysis import analyze
    from tracelens.store.job import Job

    j = load([JOB], use_cache=False)

    def refused(*a, **k):
        raise AssertionError("the reduce read events")

    monkeypatch.setattr(Job, "events", refused)
    d = analyze(j, Options()).to_dict()
    assert d["timeline"]["ranks"] and len(d["ranks"]) == len(j.handles) > 1


def _counting_summaries(monkeypatch) -> list[int]:
    """The files ``analyze`` summarised itself (from their handles), not at their parse."""
    import tracelens.analysis as an

    made: list[int] = []
    real = an._summarize
    monkeypatch.setattr(an, "_summarize", lambda args: (made.append(args[0].file), real(args))[1])
    return made


@pytest.mark.parametrize("jobs", [1, 2])
def test_ranks_are_analysed_as_their_files_are_parsed(tmp_path, monkeypatch, jobs):
    """load(after_parse=summarize_on_parse(options)) summarises each rank where it was parsed (a
    worker with jobs=2): analyze only reduces, reads no events back, and gives the same report as
    the load-then-map path; keep_events=False keeps no frame the cache does not hold."""
    from tracelens.analysis import summarize_on_parse

    d = _job_dir(tmp_path)
    want = analyze(load([d], use_cache=False), Options()).to_dict()
    made = _counting_summaries(monkeypatch)
    j = load([d], use_cache=False, jobs=jobs, after_parse=summarize_on_parse(Options()), keep_events=False)
    assert all(h.frame is None and h.parquet is None and h.summary is not None for h in j.handles)
    monkeypatch.setattr(RankHandle, "scan", lambda self: (_ for _ in ()).throw(AssertionError("events read back")))
    assert analyze(j, Options()).to_dict() == want and made == []


def test_a_summary_made_with_another_rank_or_options_is_made_again(tmp_path, monkeypatch):
    """Files without distributedInfo or a rank in their names get their ranks from the job's file
    order, known only after the load: their summaries (made with rank None) are made again, as
    are those of a job analysed with other options than its files were summarised with."""
    from tracelens.analysis import summarize_on_parse

    src = real_traces() / "hta/distributed_info_unavailable/distributed_info_not_found.json.gz"
    d = tmp_path / "job"
    d.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(src, d / name)
    want = analyze(load([d], use_cache=False), Options()).to_dict()
    made = _counting_summaries(monkeypatch)
    j = load([d], use_cache=False, after_parse=summarize_on_parse(Options()))
    assert analyze(j, Options()).to_dict() == want and sorted(made) == [0, 1]
    made.clear()
    one = load([d / "a.json.gz"], use_cache=False, after_parse=summarize_on_parse(Options()))
    analyze(one, Options(include_warmup=True))  # other options than at the parse
    assert made == [0]
