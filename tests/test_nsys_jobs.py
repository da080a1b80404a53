"""Jobs of nsys exports: a directory of per-rank ``*.sqlite`` exports is a job (an SQLite file
that is not an export is skipped with a warning); a directory holding a Kineto trace and an
nsys export of the same rank takes that rank's events from one of them (Kineto, or
``--prefer``) and says which file fed which rank; the warnings say what is true of an export."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from tests.conftest import SAMPLE_TRACES, real_traces
from tests.nsys_build import from_kineto
from tracelens import cli
from tracelens.model.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE, TraceInputError
from tracelens.store.discover import discover
from tracelens.store.job import load

NSYS = real_traces() / "nsys"
GPU_EXPORTS = ["pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite", "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite"]
JOB2 = SAMPLE_TRACES / "job_2ranks"


def _not_an_export(path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    return path


def _report(capsys, *argv):
    code = cli.main(["report", "--no-cache", *map(str, argv)])
    return code, capsys.readouterr().err


@pytest.fixture
def export_dir(tmp_path):
    """Copies of the shared GPU exports as rank0.sqlite and rank1.sqlite, and an app database."""
    d = tmp_path / "job"
    d.mkdir()
    for r, name in enumerate(GPU_EXPORTS):
        shutil.copyfile(NSYS / name, d / f"rank{r}.sqlite")
    _not_an_export(d / "app.sqlite")
    return d


def test_a_directory_of_exports_is_a_job(export_dir, tmp_path, capsys):
    files, _, _ = discover([export_dir])
    assert [f.name for f in files] == ["app.sqlite", "rank0.sqlite", "rank1.sqlite"]
    job = load([export_dir], use_cache=False)
    assert [(m.path.rsplit("/", 1)[1], m.format, m.rank, m.rank_source) for m in job.metas] == [
        ("rank0.sqlite", "nsys", 0, "filename"), ("rank1.sqlite", "nsys", 1, "filename")]
    skipped = [w for w in job.warnings if "app.sqlite" in w]
    assert len(skipped) == 1 and "skipped" in skipped[0] and "not an Nsight Systems export" in skipped[0]
    out = tmp_path / "r.json"
    code, err = _report(capsys, export_dir, "-o", out)
    assert code == EXIT_OK, err
    d = json.loads(out.read_bytes())
    assert [(i["path"].rsplit("/", 1)[1], i["format"], i["rank"]) for i in d["inputs"]] == [
        ("rank0.sqlite", "nsys", 0), ("rank1.sqlite", "nsys", 1)]
    # two exports without a recorded rank: the rank's source is worth a warning here
    assert sum("records no RANK" in w and "taken from the file name" in w for w in d["warnings"]) == 2


def test_an_export_named_trace_n_and_a_directory_of_no_exports(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    shutil.copyfile(NSYS / GPU_EXPORTS[0], d / "profile_3.sqlite")
    assert load([d], use_cache=False).metas[0].rank == 3
    lone = tmp_path / "lone"
    lone.mkdir()
    _not_an_export(lone / "app.sqlite")
    with pytest.raises(TraceInputError, match="no traces among the inputs"):
        load([lone], use_cache=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceInputError, match=r"\*\.sqlite"):
        load([empty], use_cache=False)


def test_an_sqlite_file_given_by_name_that_is_no_export_is_an_error(tmp_path, capsys):
    code, err = _report(capsys, _not_an_export(tmp_path / "app.sqlite"))
    assert code == EXIT_BAD_INPUT and "not an Nsight Systems export" in err


# ---- mixed jobs ------------------------------------------------------------------------------

def _with_env(path, **env):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
    con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
                    [("PROCESS_0:ENVIRONMENT_VARIABLE", f"{k}={v}") for k, v in env.items()])
    con.commit()
    con.close()
    return path


@pytest.fixture(params=["env", "filename"])
def mixed(request, tmp_path):
    """The sample job's two Kineto ranks, and rank 0 again as an nsys export (its kernels, copies,
    CUDA calls and steps) whose rank is in its recorded environment or in its file name."""
    from tracelens.parsers.kineto import parse as kineto

    d = tmp_path / "mixed"
    d.mkdir()
    for f in ("rank-0.json.gz", "rank-1.json.gz", "tracelens.toml"):
        shutil.copyfile(JOB2 / f, d / f)
    df, _ = kineto(JOB2 / "rank-0.json.gz")
    if request.param == "env":
        export = _with_env(from_kineto(df, d / "nsys_capture.sqlite"), RANK=0, WORLD_SIZE=2)
    else:
        export = from_kineto(df, d / "rank0.sqlite")
    return d, export


def _inputs(out):
    d = json.loads(out.read_bytes())
    return [(i["path"].rsplit("/", 1)[1], i["format"], i["rank"]) for i in d["inputs"]], d


def test_a_mixed_job_takes_the_kineto_trace_of_a_rank_by_default(mixed, tmp_path, capsys):
    mixed_dir, export = mixed
    out = tmp_path / "r.json"
    code, err = _report(capsys, mixed_dir, "-o", out)
    assert code == EXIT_OK, err
    inputs, d = _inputs(out)
    assert inputs == [("rank-0.json.gz", "kineto", 0), ("rank-1.json.gz", "kineto", 1)]
    left = [w for w in d["warnings"] if "left out: rank" in w]
    assert len(left) == 1 and export.name in left[0] and "rank-0.json.gz" in left[0] and "(nsys)" in left[0]
    assert not any("claimed by" in w for w in d["warnings"])  # one source per rank: not a rank claimed twice
    # the same report as the Kineto traces alone
    alone = tmp_path / "alone.json"
    assert _report(capsys, JOB2, "-o", alone)[0] == EXIT_OK
    assert json.loads(alone.read_bytes())["ranks"][0]["gpu_time_ns"] == d["ranks"][0]["gpu_time_ns"]


def test_prefer_nsys(mixed, tmp_path, capsys):
    mixed_dir, export = mixed
    out = tmp_path / "r.json"
    code, err = _report(capsys, mixed_dir, "--prefer", "nsys", "-o", out)
    assert code == EXIT_OK, err
    inputs, d = _inputs(out)
    assert inputs == [(export.name, "nsys", 0), ("rank-1.json.gz", "kineto", 1)]
    left = [w for w in d["warnings"] if "left out: rank" in w]
    assert len(left) == 1 and left[0].startswith(str(mixed_dir / "rank-0.json.gz")) and "--prefer nsys" in left[0]
    assert d["ranks"][0]["path"] == str(export) and d["ranks"][0]["gpu_time_ns"]["compute"] > 0
    # the same from the job's settings file, and through the API
    (mixed_dir / "tracelens.toml").write_text((JOB2 / "tracelens.toml").read_text() + '\nprefer = "nsys"\n')
    out2 = tmp_path / "r2.json"
    assert _report(capsys, mixed_dir, "-o", out2)[0] == EXIT_OK
    assert _inputs(out2)[0] == inputs
    import tracelens

    job = tracelens.open_job(mixed_dir, {"prefer": "nsys"}, use_cache=False)
    assert [m.format for m in job.metas] == ["nsys", "kineto"] and [h.file for h in job.handles] == [0, 1]


def test_prefer_is_checked(mixed, capsys):
    mixed_dir, export = mixed
    assert cli.main(["report", str(mixed_dir), "--prefer", "chrome"]) == EXIT_USAGE
    capsys.readouterr()
    (mixed_dir / "tracelens.toml").write_text('prefer = "chrome"\n')
    code, err = _report(capsys, mixed_dir)
    assert code == EXIT_USAGE and "tracelens.toml" in err and "'prefer'" in err


# ---- what the warnings say of an export -----------------------------------------------------

@pytest.mark.parametrize("name", GPU_EXPORTS)
def test_warnings_of_one_export_say_what_is_true_of_nsys(name, tmp_path, capsys):
    out = tmp_path / "r.json"
    code, err = _report(capsys, NSYS / name, "-o", out)
    assert code == EXIT_OK, err
    warnings = json.loads(out.read_bytes())["warnings"]
    text = "\n".join(warnings)
    assert "record_shapes" not in text and "ProfilerStep spans" not in text and "deviceProperties" not in text
    assert "records no RANK" not in text  # one file: its rank is noise
    assert any("nsys export records no op shapes" in w and "--model-flops-per-step" in w for w in warnings)
    assert any("no step ranges (NVTX ranges named ProfilerStep#N, step" in w and "--step-range REGEX" in w for w in warnings)


def test_kineto_wording_is_kept(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, err = _report(capsys, real_traces() / "amd-tracelens" / "b200" / "eager_trace.json.gz", "-o", out)
    assert code == EXIT_OK, err
    assert any("no ProfilerStep spans" in w for w in json.loads(out.read_bytes())["warnings"])
