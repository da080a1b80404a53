"""The public Python API (``tracelens.open_job / analyze / render``, ``Analysis.to_dict``,
``Job.events``): the same report as the command line; ``import tracelens`` and the headless
paths stay light (no polars, no Textual where they are not needed), tested in fresh processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import orjson
import pytest

from tests.conftest import ROOT, real_traces

SAMPLE = ROOT / "sample_traces" / "job_2ranks"


def fresh(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_import_tracelens_imports_neither_polars_nor_textual():
    r = fresh("import sys, tracelens; tracelens.open_job; tracelens.render; tracelens.Options; "
              "print(sorted(m for m in ('polars', 'textual', 'tracelens.analysis', 'tracelens.parsers.kineto') if m in sys.modules))")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_help_imports_neither_polars_nor_textual():
    r = fresh("import sys; from tracelens.cli import main; main(['--help']); main(['report', '--help']); "
              "print('\\nLOADED', 'polars' in sys.modules, 'textual' in sys.modules)")
    assert r.stdout.strip().endswith("LOADED False False"), r.stderr


def test_the_headless_report_never_imports_textual(tmp_path):
    r = fresh("import sys; from tracelens.cli import main; rc = main(['report', sys.argv[1], '--no-cache', '-o', sys.argv[2]]); "
              "print('\\nLOADED', rc, 'textual' in sys.modules)", str(SAMPLE), str(tmp_path / "r.html"))
    assert r.stdout.strip().endswith("LOADED 0 False"), r.stderr


def test_the_api_gives_the_command_lines_report(tmp_path, capsys):
    import tracelens
    from tracelens.cli import main

    # the GPU as the command line gives it (the report says where it came from: "--gpu")
    job = tracelens.open_job(str(SAMPLE), {"gpu": "A100", "given": (("gpu", "--gpu"),)})
    a = tracelens.analyze(job)  # the options given to open_job
    d = a.to_dict()
    out = tmp_path / "cli.json"
    assert main(["report", str(SAMPLE), "--config", "none", "--gpu", "A100", "-o", str(out)]) == 0
    assert d == orjson.loads(out.read_bytes())
    assert tracelens.render(a, "json") == tracelens.render(d, "json") == out.read_bytes()
    text = tracelens.render(a, "text")
    assert isinstance(text, bytes) and f"MFU: {100 * d['job']['mfu']:.2f}%".encode() in text
    html = tracelens.render(d, "html")
    assert html.startswith(b"<!doctype html") or html.lower().startswith(b"<!doctype html")
    # options given to analyze win over open_job's; a dict or an Options
    assert tracelens.analyze(job, tracelens.Options(gpu="H100 SXM")).to_dict()["job"]["mfu"] < d["job"]["mfu"]
    with pytest.raises(TypeError):
        tracelens.render(42, "text")
    with pytest.raises(ValueError):
        tracelens.render(d, "pdf")


def test_open_job_names_the_bad_input(tmp_path):
    import tracelens
    from tracelens.model.errors import TraceInputError

    bad = tmp_path / "empty.json"
    bad.write_bytes(b"")
    with pytest.raises(TraceInputError, match="empty.json"):
        tracelens.open_job(bad)
    with pytest.raises(TraceInputError):
        tracelens.open_job([tmp_path / "missing.json"])


def test_readme_example_runs(tmp_path):
    """The README's "Python API" example, run as written (from the repository root)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    # the example names the sample job relative to the repository root, and writes job.html: run it in a copy's place
    import shutil

    shutil.copytree(SAMPLE, tmp_path / "sample_traces" / "job_2ranks")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert re.search(r"2 ranks, MFU \d+\.\d%", r.stdout) and "tracelens 0" in r.stdout
    assert (tmp_path / "job.html").read_bytes()[:15].lower() == b"<!doctype html>"


def test_job_events_is_a_lazy_frame_of_one_rank():
    """``Job.events(rank=..., window=...)``: a lazy scan of one rank's events, cut to a window."""
    import polars as pl

    import tracelens

    job = tracelens.open_job(real_traces() / "hta/trace_filter")
    whole = job.events(rank=1)
    assert isinstance(whole, pl.LazyFrame)
    df = whole.collect()
    assert df.height and set(df["rank"].unique()) == {1}
    t0, t1 = df["ts_ns"].min(), df["ts_ns"].max()
    mid = (t0 + t1) // 2
    part = job.events(rank=1, window=(t0, mid)).collect()
    assert 0 < part.height < df.height  # the events that overlap [t0, mid]
    assert part["ts_ns"].max() <= mid and (part["ts_ns"] + part["dur_ns"]).min() >= t0
