"""Bad input: one line naming the file and the problem, exit code 3, no traceback, nothing
half-written.  Truncated traces keep the whole events before the cut, with a warning."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, real_traces

EV = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0, "args": {"External id": 1}}


def run_cli(*args, cache=None):
    env = dict(os.environ)
    if cache is not None:
        env["TRACELENS_CACHE_DIR"] = str(cache)
    env.pop("TRACELENS_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "tracelens", *map(str, args)], capture_output=True, text=True, cwd=ROOT, env=env)


def trace_bytes(n=50):
    return json.dumps({"schemaVersion": 1, "traceEvents": [dict(EV, ts=float(i)) for i in range(n)]}, indent=2).encode()


def cache_files(cache):
    return sorted(p.name for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


CASES = {
    "empty": (b"", "empty file"),
    "whitespace": (b"  \n", "only whitespace"),
    "garbage": (bytes(range(256)) * 4, "not a trace"),
    "not_a_trace_json": (b'{"nodes": [], "schema": "1.0.1"}', "not a trace"),
    "json_list_of_numbers": (b"[1, 2, 3]", "not a trace"),
    "cut_before_events": (trace_bytes()[:20], "truncated"),
    "gzip_cut_in_header": (gzip.compress(trace_bytes())[:8], "gzip"),
    "gzip_of_garbage": (gzip.compress(b"\x00\x01\x02garbage"), "not a trace"),
    "empty_events": (b'{"traceEvents": []}', "no trace events"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file(tmp_path, case):
    data, words = CASES[case]
    f = tmp_path / f"{case}.json"
    f.write_bytes(data)
    cache = tmp_path / "cache"
    r = run_cli("info", f, cache=cache)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(f) in lines[0] and words in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert cache_files(cache) == [] or all(not n.endswith(".parquet") for n in cache_files(cache))


def test_directory_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    r = run_cli("info", tmp_path)
    assert r.returncode == 3 and "no trace files" in r.stderr and str(tmp_path) in r.stderr


def test_a_job_of_only_skipped_files_names_the_input_and_why(tmp_path):
    """``info DIR`` whose only files (in a subfolder) are Flight Recorder dumps: the error once
    named the subfolder ('DIR/sub: no traces among the inputs'), not the input, and not why."""
    import shutil

    sub = tmp_path / "job" / "sub"
    sub.mkdir(parents=True)
    for r in (0, 1):
        shutil.copyfile(real_traces() / f"nccl/flight_recorder/fr_gloo_rank_{r}.json", sub / f"fr_{r}.json")
    r = run_cli("info", tmp_path / "job", cache=tmp_path / "cache")
    (line,) = r.stderr.strip().splitlines()
    assert r.returncode == 3 and line.startswith(f"tracelens: error: {tmp_path / 'job'}: no traces among the inputs: "
                                                 "2 file(s) found, each skipped (the first: "), line
    assert "Flight Recorder" in line and "--nccl" in line


def test_missing_path(tmp_path):
    r = run_cli("info", tmp_path / "nope")
    assert r.returncode == 3 and "no such file" in r.stderr


def test_truncated_json_keeps_whole_events(tmp_path):
    data = trace_bytes(50)
    cut = data.index(b'"ts": 30.0')  # inside the 31st event
    f = tmp_path / "cut.json"
    f.write_bytes(data[:cut])
    cache = tmp_path / "cache"
    r = run_cli("info", "--json", f, cache=cache)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["files"][0]
    assert info["events"] == 30 and info["truncated"] is True
    assert "truncated" in r.stderr and str(f) in r.stderr
    assert not any(n.endswith(".parquet") for n in cache_files(cache))  # a partial parse is never cached


def test_truncated_gzip_keeps_whole_events(tmp_path):
    path = real_traces() / "hta/trace_filter/sampled_rank-0.json.gz"
    raw = path.read_bytes()
    f = tmp_path / "cut.json.gz"
    f.write_bytes(raw[: len(raw) // 2])
    r = run_cli("info", "--json", f)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["files"][0]
    full = json.loads(run_cli("info", "--json", path).stdout)["files"][0]
    assert 0 < info["events"] < full["events"]
    assert "truncated gzip" in r.stderr


def test_non_trace_json_in_a_directory_is_skipped(tmp_path):
    (tmp_path / "rank-0.json").write_bytes(trace_bytes(3))
    (tmp_path / "execution_details.json").write_text('[{"name": "x"}]')
    r = run_cli("info", "--json", tmp_path)
    assert r.returncode == 0, r.stderr
    assert [f["events"] for f in json.loads(r.stdout)["files"]] == [3]
    assert "skipped" in r.stderr and "execution_details.json" in r.stderr


def test_usage_error_exit_code():
    r = run_cli("info")
    assert r.returncode == 2
