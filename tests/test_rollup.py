"""The job rollup (tracelens.analysis.job.rollup.finish_job): the derived job values are computed
once, at the end of analyze(), and ``Analysis.to_dict()`` only assembles dicts from them."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from tests.conftest import SAMPLE_TRACES
from tracelens.analysis import analyze
from tracelens.analysis.job import collectives, comm, rollup, stragglers
from tracelens.store.job import load


@pytest.fixture(scope="module")
def analysis():
    from tracelens.demo import options  # the sample job's tracelens.toml: its GPU, so the MFU is known

    job = SAMPLE_TRACES / "job_2ranks"
    return analyze(load([str(job)]), options(job))


def test_to_dict_computes_nothing(analysis, monkeypatch):
    """Every function that derives a job value refuses to run: to_dict still gives the report."""
    want = analysis.to_dict()

    def refuse(*a, **k):
        raise AssertionError("to_dict computed a job value")

    for mod, names in ((rollup, ("finish_job", "job_kernels", "job_waterfall", "job_mfu", "flops_quality", "step_times",
                                 "waterfall_kind", "suggest")),
                       (collectives, ("by_group", "slowest", "collective_table")),
                       (comm, ("report_notes", "matching_warnings")),
                       (stragglers, ("straggler_check", "check_dict", "stragglers"))):
        for name in names:
            monkeypatch.setattr(mod, name, refuse)
    monkeypatch.setattr("tracelens.analysis.suggest.suggest", refuse)
    monkeypatch.setattr("tracelens.analysis.waterfall.combine", refuse)
    assert analysis.to_dict() == want
    import tracelens.analysis.report as report  # nor can it reach them: the report module holds none of them

    assert not {"suggest", "waterfall", "comm", "rollup", "pl", "polars", "finish_job"} & set(vars(report))


def test_the_job_values_are_the_ranks_combined(analysis):
    """Independently, from the rank results: MFU = Σ FLOPs / Σ (peak x window); step stats over
    the non-warm-up steps; the GPU-time partition summed; kernel launches summed per name."""
    job, ranks = analysis.job, analysis.ranks
    assert job.mfu == pytest.approx(sum(r.flops for r in ranks) / sum(r.peak_flops * r.gpu.window / 1e9 for r in ranks), rel=1e-12)
    times = sorted(s.dur_ns for r in ranks for s in r.steps if not s.warmup)
    assert job.step_time_ns == {"mean": round(sum(times) / len(times)), "p50": times[(len(times) - 1) // 2], "max": times[-1]}
    assert job.gpu_time_ns["compute"] == sum(r.gpu.compute for r in ranks)
    assert job.gpu_time_ns["idle"] == sum(r.gpu.idle for r in ranks)
    launches = {}
    for r in ranks:  # each rank's whole table (its report rows are only the longest)
        for name, count in r.kernel_table.select("name", "count").iter_rows():
            launches[name] = launches.get(name, 0) + count
    assert {k["name"]: k["count"] for k in job.kernels} == launches
    assert job.waterfall_kind == "mfu" and job.waterfall[-1]["key"] == "mfu"
    assert sum(b["fraction"] for b in job.waterfall) == pytest.approx(1.0, abs=1e-9)
    assert [s["id"] for s in job.suggestions] == [s["id"] for s in analysis.to_dict()["suggestions"]]


def test_each_report_is_a_new_dict(analysis):
    a = analysis.to_dict()
    a["job"]["kernels"][0]["name"] = "changed"
    a["job"]["waterfall"].pop()
    a["communication"]["by_group"].clear()
    a["suggestions"][0]["title"] = "changed"
    b = analysis.to_dict()
    assert b["job"]["kernels"][0]["name"] != "changed" and b["job"]["waterfall"][-1]["key"] == "mfu"
    assert b["suggestions"][0]["title"] != "changed"
    assert b["communication"]["by_group"] == analysis.job.communication["by_group"]


def test_an_unfinished_analysis_says_so_and_finishing_it_twice_changes_nothing(analysis):
    bare = replace(analysis, job=None)
    with pytest.raises(ValueError, match="finish_job"):
        bare.to_dict()
    assert rollup.finish_job(bare).to_dict() == analysis.to_dict() == rollup.finish_job(analysis).to_dict()


def test_the_analysis_pickles_with_its_job_results(analysis):
    again = pickle.loads(pickle.dumps(analysis))
    assert again.job == analysis.job and again.to_dict() == analysis.to_dict()
