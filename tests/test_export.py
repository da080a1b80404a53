"""``tracelens export``: a job's event table as Parquet, one file per rank, equal to what the
analysis loads; its errors follow the exit-code table and never leave a partial output."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import polars as pl
import pytest

from tests.conftest import ROOT, SAMPLE_TRACES, TRACES
from tracelens.export import parquet
from tracelens.model.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_OUTPUT, EXIT_USAGE, OutputError
from tracelens.store.job import load

JOB = SAMPLE_TRACES / "job_2ranks"
TWO_RANKS = [TRACES / "hta" / "trace_filter" / "sampled_rank-0.json.gz", TRACES / "hta" / "trace_filter" / "sampled_rank-1.json.gz"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tracelens", "export", *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def leftovers(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.endswith(".tmp"))


@pytest.mark.parametrize("paths", [[JOB], TWO_RANKS], ids=["sample_job", "hta_two_ranks"])
def test_each_rank_file_is_the_loaded_table_of_that_file(paths, tmp_path):
    out = tmp_path / "events"
    r = cli(*paths, "-o", out)
    assert r.returncode == EXIT_OK, r.stderr
    trace = load([str(p) for p in paths])
    manifest = orjson.loads((out / parquet.MANIFEST).read_bytes())
    assert sorted(os.listdir(out)) == sorted([parquet.MANIFEST] + [f"rank-{m.rank}.parquet" for m in trace.metas])
    for fi, meta in enumerate(trace.metas):
        want = trace.events().collect().filter(pl.col("file") == fi)
        got = pl.read_parquet(out / f"rank-{meta.rank}.parquet")
        assert got.schema == want.schema  # Enum and Categorical columns too
        assert got.equals(want)  # every row and column, in order
        entry = next(f for f in manifest["files"] if f["file"] == fi)
        assert entry["rows"] == want.height and entry["rank"] == meta.rank and entry["path"] == meta.path
    assert f"{trace.events().collect().height:,} events" in r.stdout
    whole = pl.scan_parquet(out / "*.parquet").collect().sort("file", maintain_order=True)
    assert whole.equals(trace.events().collect())  # the notebook's one-liner is the job
    assert leftovers(tmp_path) == []


def test_one_rank_and_a_single_file(tmp_path):
    out = tmp_path / "r1"
    assert cli(JOB, "-o", out, "--rank", "1").returncode == EXIT_OK
    assert sorted(os.listdir(out)) == sorted([parquet.MANIFEST, "rank-1.parquet"])
    trace = load([str(JOB)])
    want = trace.events().collect().filter(pl.col("rank") == 1)
    assert pl.read_parquet(out / "rank-1.parquet").equals(want)
    single = tmp_path / "one.parquet"
    r = cli(JOB, "-o", single, "--rank", "1")
    assert r.returncode == EXIT_OK, r.stderr
    assert pl.read_parquet(single).equals(want)
    both = tmp_path / "both.parquet"
    r = cli(JOB, "-o", both)  # two ranks do not fit one file
    assert r.returncode == EXIT_USAGE and "--rank" in r.stderr and not both.exists()
    r = cli(JOB, "-o", tmp_path / "none", "--rank", "7")
    assert r.returncode == EXIT_USAGE and "ranks 0, 1" in r.stderr and not (tmp_path / "none").exists()
    assert leftovers(tmp_path) == []


def test_two_files_of_one_rank_are_told_apart(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    for i in range(2):
        shutil.copy(JOB / "rank-0.json.gz", job / f"copy{i}.json.gz")
    (job / "notes.json").write_text('{"not": "a trace"}')  # skipped with a warning, as the load does
    out = tmp_path / "out"
    r = cli(job, "-o", out)
    assert r.returncode == EXIT_OK, r.stderr
    assert sorted(os.listdir(out)) == sorted([parquet.MANIFEST, "rank-0.file-0.parquet", "rank-0.file-1.parquet"])
    assert "claimed by 2 files" in r.stderr and "notes.json: skipped" in r.stderr
    a, b = (pl.read_parquet(out / f"rank-0.file-{i}.parquet") for i in range(2))
    assert a.drop("file").equals(b.drop("file")) and a["file"].unique().to_list() == [0] and b["file"].unique().to_list() == [1]


def test_bad_input_writes_nothing(tmp_path):
    bad = tmp_path / "rank-1.json"
    bad.write_bytes((JOB / "rank-0.json.gz").read_bytes()[:100])  # a gzip cut short, given by name: an error
    out = tmp_path / "out"
    r = cli(JOB / "rank-0.json.gz", bad, "-o", out)
    assert r.returncode == EXIT_BAD_INPUT and str(bad) in r.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_output_problems_exit_5_before_any_parse(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, says in ((busy, "other files"), (afile, "not a directory"), (tmp_path / "missing" / "out", "does not exist")):
        r = cli(tmp_path / "no-such-trace.json", "-o", out)  # the output is checked first: the missing input is not reached
        assert r.returncode == EXIT_OUTPUT and says in r.stderr, r.stderr
    assert (busy / "mine.txt").read_text() == "keep me" and afile.read_text() == "x"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(JOB, "-o", empty, "--rank", "0").returncode == EXIT_OK and (empty / "rank-0.parquet").is_file()
    assert leftovers(tmp_path) == []


def test_an_earlier_export_is_replaced_whole_or_kept(tmp_path, monkeypatch):
    out = tmp_path / "out"
    parquet.export([JOB], out)
    parquet.export([JOB], out, ranks=[1])  # replaced: rank 0's file goes
    assert sorted(os.listdir(out)) == sorted([parquet.MANIFEST, "rank-1.parquet"])
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}

    def full(self, path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", full)
    with pytest.raises(OutputError, match="no space left on the device; nothing was written"):
        parquet.export([JOB], out)
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # the earlier export, untouched
    assert leftovers(tmp_path) == []


def test_a_polars_write_error_is_an_output_error(tmp_path, monkeypatch):
    def full(self, path, *a, **k):
        raise pl.exceptions.ComputeError("parquet: File out of specification: underlying IO error: No space left on device (os error 28)")

    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", full)  # the export streams each rank's scan
    with pytest.raises(OutputError, match="no space left on the device"):
        parquet.export([JOB], tmp_path / "out", use_cache=False)
    assert os.listdir(tmp_path) == []


def test_ranks_are_written_one_at_a_time(tmp_path, monkeypatch):
    """The job's events are never joined: with the parse cache on, the loaded job holds no rank's
    table in memory (each handle names its cached Parquet file) and each rank file is streamed
    from that file's lazy scan."""
    from tracelens.store import job

    loaded = []
    real = job.load

    def load(*a, **k):
        loaded.append(real(*a, **k))
        return loaded[-1]

    monkeypatch.setattr(job, "load", load)
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(tmp_path / "cache"))
    done = parquet.export([*TWO_RANKS, JOB], tmp_path / "out")
    assert len(done.files) == 4 and len(loaded) == 1
    assert all(h.frame is None and h.parquet is not None for h in loaded[0].handles)
