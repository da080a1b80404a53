"""Exit codes mean one thing, and every message names the real problem (issue 14, item 7).

Hostile cases as tables, each run through the CLI (``tracelens report X -o r.json``) on tiny
hand-built traces or the real files of ``tests/data/traces``:

* output errors: exit 5, one line naming the output file, no file and no temporary file left;
* usage errors (flags and the job's ``tracelens.toml``): exit 2, one line naming the option or
  the file and key, nothing written;
* odd metadata (no complete events, a ``deviceProperties`` name that is not text, ``distributedInfo``
  of the wrong types): exit 0, the report written, a warning naming the file and the field;
* event lists none of whose events is usable: exit 3 naming the field and its first bad value;
* files of formats tracelens recognises but does not analyse: exit 3, the format named.

Most cases call ``cli.main`` in this process (the same code path as the console script, without
a Python start per case); ``test_real_process_*`` run a subprocess to see no traceback escapes.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, SAMPLE_TRACES, real_trace_files, real_traces
from tracelens import cli
from tracelens.model.errors import EXIT_BAD_INPUT, EXIT_CODES, EXIT_OK, EXIT_OUTPUT, EXIT_USAGE

KERNEL = {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 10.0, "dur": 5.0,
          "args": {"device": 0, "stream": 7, "correlation": 1}}
CPU_OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 9.0, "dur": 7.0, "args": {"External id": 1}}
PROC = {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}
A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}]


def trace(tmp_path: Path, name: str = "t.json", events=None, **top) -> Path:
    """A tiny trace: one CPU op launching one kernel, unless ``events`` says otherwise."""
    doc = {**top, "traceEvents": [CPU_OP, KERNEL] if events is None else events}
    f = tmp_path / name
    f.write_text(json.dumps(doc))
    return f


def run(capsys, *args) -> tuple[int, list[str], str]:
    """``tracelens ARGS`` in this process: (exit code, stderr lines, stdout)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, err.strip().splitlines(), out


def error_line(lines: list[str]) -> str:
    """The one error line (warnings may precede it only for gates; errors are one line)."""
    errors = [ln for ln in lines if ln.startswith("tracelens: error: ")]
    assert len(errors) == 1 and len(lines) == 1, lines
    assert "Traceback" not in lines[0] and "internal error" not in lines[0]
    return errors[0]


def leftovers(folder: Path) -> list[str]:
    """Temporary files of an atomic write (``.NAME.xxxx.tmp``) left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp")) if folder.is_dir() else []


# ---------------------------------------------------------------------------------------------
# output errors: exit 5


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def test_output_into_a_read_only_directory(tmp_path, capsys, monkeypatch):
    src = trace(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    out = ro / "r.json"
    if _as_root():  # chmod does not stop root: the write itself fails as it would for a user
        import tempfile

        def refuse(*a, **k):
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    else:
        ro.chmod(0o555)
    try:
        code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", out)
    finally:
        ro.chmod(0o755)
    line = error_line(lines)
    assert code == EXIT_OUTPUT and str(out) in line and ("not writable" in line or "permission denied" in line), line
    assert not out.exists() and leftovers(ro) == []


OUTPUT_CASES = {
    # name: (how to make the place, words of the message)
    "onto_a_directory": (lambda d: (d / "r.json").mkdir() or d / "r.json", "is a directory"),
    "missing_parent": (lambda d: d / "nope" / "r.json", "does not exist"),
    "parent_is_a_file": (lambda d: (d / "f").write_text("x") and d / "f" / "r.json", "is not a directory"),
    "missing_grandparent": (lambda d: d / "a" / "b" / "r.html", "does not exist"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
def test_output_place_errors(tmp_path, capsys, case):
    make, words = OUTPUT_CASES[case]
    src = trace(tmp_path)
    out = make(tmp_path)
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", out)
    line = error_line(lines)
    assert code == EXIT_OUTPUT and str(out) in line and words in line, line
    assert not (out.exists() and out.is_file()) and leftovers(tmp_path) == []
    assert not (tmp_path / "nope").exists() and not (tmp_path / "a").exists()  # no directory made either


@pytest.mark.parametrize("err, words", [
    (errno.ENOSPC, "no space left"), (errno.EDQUOT, "quota"), (errno.EROFS, "read-only file system"), (errno.EIO, "error"),
])
@pytest.mark.parametrize("fmt", ["json", "html", "txt"])
def test_output_write_failure_leaves_nothing(tmp_path, capsys, monkeypatch, err, words, fmt):
    """The disk fills half-way through the write: exit 5, and neither a partial report nor a
    temporary file remains; a report already there is left as it was."""
    src = trace(tmp_path)
    out = tmp_path / f"r.{fmt}"
    out.write_bytes(b"the previous report")
    real = Path.write_bytes

    def half_then_fail(self, data):
        real(self, data[: len(data) // 2])
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(Path, "write_bytes", half_then_fail)
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", out)
    monkeypatch.undo()
    line = error_line(lines)
    assert code == EXIT_OUTPUT and str(out) in line and words in line.lower(), line
    assert out.read_bytes() == b"the previous report" and leftovers(tmp_path) == []


def test_output_is_checked_before_the_analysis(tmp_path, capsys, monkeypatch):
    """A report that cannot be saved fails at once, not after parsing the traces."""
    import tracelens.store.job

    def no_load(*a, **k):
        raise AssertionError("the traces were loaded before the output was checked")

    monkeypatch.setattr(tracelens.store.job, "load", no_load)
    code, lines, _ = run(capsys, "report", trace(tmp_path), "-o", tmp_path / "missing" / "r.json")
    assert code == EXIT_OUTPUT and "does not exist" in error_line(lines)


def test_demo_html_output_errors(tmp_path, capsys, monkeypatch):
    out = tmp_path / "nope" / "demo.html"
    code, lines, stdout = run(capsys, "demo", "--no-tui", "-o", out)
    assert code == EXIT_OUTPUT and str(out) in error_line(lines) and stdout == ""  # nothing printed for a page that cannot be saved
    (tmp_path / "d.html").mkdir()
    code, lines, _ = run(capsys, "demo", "--no-tui", "-o", tmp_path / "d.html")
    assert code == EXIT_OUTPUT and "is a directory" in error_line(lines)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    code, lines, _ = run(capsys, "demo", "--no-tui", "-o", tmp_path / "demo.html")
    monkeypatch.undo()
    assert code == EXIT_OUTPUT and "no space left" in error_line([ln for ln in lines if "warning" not in ln])
    assert not (tmp_path / "demo.html").exists() and leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# the output is one of the inputs: exit 2 before any analysis, the input untouched

REAL = "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"


def _job(tmp_path: Path, capsys) -> Path:
    """A job directory: a real trace as two ranks (plain JSON, so that ``-o`` may name one), the
    job's settings, a saved report of it, and a copy elsewhere as a baseline directory."""
    import gzip

    d = tmp_path / "job"
    d.mkdir()
    raw = gzip.decompress((real_traces() / REAL).read_bytes())
    for name in ("rank0.json", "rank1.json"):
        (d / name).write_bytes(raw)
    (d / "tracelens.toml").write_text('gpu = "A100 SXM"\n')
    (d / "settings.json").write_text('gpu = "A100 SXM"\n')  # a TOML file named for -o
    base = tmp_path / "base"
    base.mkdir()
    (base / "rank0.json").write_bytes(raw)
    assert cli.main(["report", "--no-cache", str(d / "rank0.json"), "-o", str(d / "saved.json")]) == 0
    (tmp_path / "link.json").symlink_to(d / "rank0.json")
    os.link(d / "rank1.json", tmp_path / "hard.json")
    capsys.readouterr()
    return d


# (argv with {d} the job and {t} tmp_path, -o's path, what the message says it is)
SAME_AS_INPUT = [
    (["{d}/rank0.json"], "{d}/rank0.json", "the trace {d}/rank0.json"),
    (["{d}/rank0.json", "{d}/rank1.json"], "{d}/rank1.json", "the trace {d}/rank1.json"),
    (["{d}/rank0.json"], "{d}/../job/./rank0.json", "the trace {d}/rank0.json"),  # another spelling
    (["{d}/rank0.json"], "{t}/link.json", "the trace {d}/rank0.json"),  # a link to it
    (["{d}/rank1.json"], "{t}/hard.json", "the trace {d}/rank1.json"),  # a hard link
    (["{d}"], "{d}/rank1.json", "the trace {d}/rank1.json"),  # found in an input directory
    (["{t}/link.json"], "{d}/rank0.json", "the trace {t}/link.json"),
    (["--load", "{d}/saved.json"], "{d}/saved.json", "the saved report {d}/saved.json"),
    (["--load", "{d}/saved.json", "--compare", "{d}/rank1.json"], "{d}/rank1.json", "the baseline {d}/rank1.json"),
    (["{d}/rank0.json", "--compare", "{d}/saved.json"], "{d}/saved.json", "the baseline {d}/saved.json"),
    (["{d}/rank0.json", "--compare", "{t}/base"], "{t}/base/rank0.json", "the baseline {t}/base/rank0.json"),
    (["{d}/rank0.json", "--config", "{d}/settings.json"], "{d}/settings.json", "the job settings {d}/settings.json"),
]


@pytest.mark.parametrize("argv, out, what", SAME_AS_INPUT, ids=[f"{' '.join(a)} -o {o}" for a, o, _ in SAME_AS_INPUT])
def test_output_that_is_an_input_is_refused_before_the_analysis(tmp_path, capsys, monkeypatch, argv, out, what):
    import tracelens.store.job

    d = _job(tmp_path, capsys)
    fill = lambda s: s.format(d=d, t=tmp_path)  # noqa: E731
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    monkeypatch.setattr(tracelens.store.job, "load", lambda *a, **k: pytest.fail("the traces were loaded"))
    code, lines, stdout = run(capsys, "report", "--no-cache", *map(fill, argv), "-o", fill(out))
    assert code == EXIT_USAGE and stdout == ""
    assert error_line(lines) == f"tracelens: error: -o {fill(out)} is one of the inputs ({fill(what)}): write the report to another file"
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before and leftovers(d) == []
    assert (tmp_path / "link.json").is_symlink()


def test_a_report_in_the_job_directory_is_written_over(tmp_path, capsys):
    """The last run's report inside the job's directory is not an input (the job skips it):
    writing the report there again, or a new one, is fine."""
    d = _job(tmp_path, capsys)
    for _ in range(2):
        code, lines, _ = run(capsys, "report", "--no-cache", d, "-o", d / "saved.json")
        assert code == EXIT_OK, lines
    assert json.loads((d / "saved.json").read_text())["job"]["ranks"] == 2
    assert run(capsys, "report", "--no-cache", d, "-o", d / "new.html")[0] == EXIT_OK


def test_demo_output_onto_a_bundled_sample_file_is_refused(tmp_path, capsys, monkeypatch):
    """``tracelens demo -o`` through a link to one of the sample job's files (a link, so that a
    failure of this test replaces the link, not the sample)."""
    import tracelens.store.job
    from tracelens.demo import sample_job

    monkeypatch.setattr(tracelens.store.job, "load", lambda *a, **k: pytest.fail("the sample was loaded"))
    for f in sorted(p for p in sample_job().iterdir() if p.is_file()):
        link = tmp_path / f"to-{f.name}.html"
        link.symlink_to(f)
        code, lines, stdout = run(capsys, "demo", "--no-tui", "-o", link)
        assert code == EXIT_USAGE and stdout == "" and link.is_symlink()
        assert error_line(lines).startswith(f"tracelens: error: -o {link} is one of the inputs (the bundled sample file ")
        assert error_line(lines).endswith(f"{f.name}): write the page to another file")


# ---------------------------------------------------------------------------------------------
# usage errors: exit 2, one line naming the option (or the settings file and its key)

USAGE_FLAGS = [
    (["--fail-over-step-ms", "nan"], "--fail-over-step-ms nan"),
    (["--fail-over-step-ms", "inf"], "--fail-over-step-ms inf"),
    (["--fail-over-step-ms", "-1"], "--fail-over-step-ms -1"),
    (["--fail-over-step-ms", "0"], "--fail-over-step-ms 0"),
    (["--fail-under-mfu", "nan"], "--fail-under-mfu nan"),
    (["--fail-under-mfu", "1.5"], "--fail-under-mfu 1.5"),
    (["--fail-under-mfu", "-0.1"], "--fail-under-mfu -0.1"),
    (["--peak-tflops", "0"], "--peak-tflops 0"),
    (["--peak-tflops", "-100"], "--peak-tflops -100"),
    (["--peak-tflops", "nan"], "--peak-tflops nan"),
    (["--peak-tflops", "inf"], "--peak-tflops inf"),
    (["--model-flops-per-step", "nan"], "--model-flops-per-step nan"),
    (["--model-flops-per-step", "inf"], "--model-flops-per-step inf"),
    (["--model-flops-per-step=-1e12"], "--model-flops-per-step -1e+12"),
    (["--model-flops-per-step", "0"], "--model-flops-per-step 0"),
    (["--params", "nan", "--tokens-per-step", "4096"], "--params nan"),
    (["--params=-7e9", "--tokens-per-step", "4096"], "--params -7e+09"),
    (["--params", "7e9", "--tokens-per-step", "nan"], "--tokens-per-step nan"),
    (["--params", "7e9", "--tokens-per-step", "-1"], "--tokens-per-step -1"),
    (["--params", "7e9", "--tokens-per-step", "inf"], "--tokens-per-step inf"),
    (["--params", "7e9", "--tokens-per-step", "4096", "--seq-len", "0", "--layers", "2", "--hidden", "8"], "--seq-len 0"),
    (["--params", "7e9", "--tokens-per-step", "4096", "--seq-len", "8", "--layers", "-2", "--hidden", "8"], "--layers -2"),
    (["--jobs", "0"], "--jobs 0"),
    (["--jobs", "-3"], "--jobs -3"),
    (["--steps", "5:2"], "'5:2'"),
    # FLOPs no GPU can do: with the GPU the trace names, and with no GPU known at all
    (["--model-flops-per-step", "1e30"], "--model-flops-per-step 1e+30"),
    (["--params", "1e20", "--tokens-per-step", "1e10"], "--params 1e+20 --tokens-per-step 1e+10"),
    (["--peak-tflops", "1e-9", "--model-flops-per-step", "1e12"], "--peak-tflops 1e-09"),
]


# each flag set with the GPU named in the trace and with none known (a peak given is a GPU known)
USAGE_CASES = [(f, w, g) for f, w in USAGE_FLAGS for g in ("named", "unknown") if not (g == "unknown" and "1e-9" in f)]


@pytest.mark.parametrize("flags, words, gpu", USAGE_CASES, ids=[" ".join(f) + f" [{g}]" for f, _, g in USAGE_CASES])
def test_usage_errors_name_the_option(tmp_path, capsys, flags, words, gpu):
    src = trace(tmp_path, deviceProperties=A100) if gpu == "named" else trace(tmp_path)
    out = tmp_path / "r.json"
    code, lines, _ = run(capsys, "report", "--no-cache", src, *flags, "-o", out)
    line = error_line([ln for ln in lines if not ln.startswith("tracelens: warning: ")])
    assert code == EXIT_USAGE and words in line, line
    assert not out.exists() and leftovers(tmp_path) == []


def test_flops_above_any_gpu_are_refused_without_a_gpu(tmp_path, capsys):
    """1e30 FLOPs per step is an MFU far above 100% on any GPU: with no GPU named in the trace
    it is still a usage error, measured against the fastest GPU tracelens knows."""
    code, lines, _ = run(capsys, "report", "--no-cache", trace(tmp_path), "--model-flops-per-step", "1e30", "-o", tmp_path / "r.json")
    line = error_line([ln for ln in lines if "warning" not in ln])
    assert code == EXIT_USAGE and "fastest GPU in tracelens' peak table" in line and "--model-flops-per-step 1e+30" in line
    # a plausible number on an unknown GPU is no error: the MFU is unknown, with a warning
    code, lines, _ = run(capsys, "report", "--no-cache", trace(tmp_path), "--model-flops-per-step", "1e6", "-o", tmp_path / "r.json")
    assert code == EXIT_OK and any("MFU unknown" in ln for ln in lines)


SETTINGS_CASES = [
    ("peak_tflops = nan\n", "'peak_tflops'"),
    ("peak_tflops = -100\n", "'peak_tflops'"),
    ("peak_tflops = 0\n", "'peak_tflops'"),
    ("peak_tflops = inf\n", "'peak_tflops'"),
    ("model_flops_per_step = nan\n", "'model_flops_per_step'"),
    ("model_flops_per_step = -inf\n", "'model_flops_per_step'"),
    ("params = -1.0\ntokens_per_step = 8\n", "'params'"),
    ("params = 1e9\ntokens_per_step = nan\n", "'tokens_per_step'"),
    ("layers = 0\n", "'layers'"),
    ('gpu = "A100"\nmodel_flops_per_step = 1e30\n', "model_flops_per_step = 1e+30 in "),
    ("model_flops_per_step = 1e30\n", "model_flops_per_step = 1e+30 in "),  # no GPU known: the fastest one's peak
]


@pytest.mark.parametrize("content, words", SETTINGS_CASES)
def test_usage_errors_in_the_settings_file_name_file_and_key(tmp_path, capsys, content, words):
    src = trace(tmp_path)
    cfg = tmp_path / "tracelens.toml"
    cfg.write_text(content)
    out = tmp_path / "r.json"
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", out)
    line = error_line([ln for ln in lines if not ln.startswith("tracelens: warning: ")])
    assert code == EXIT_USAGE and str(cfg) in line and words in line, line
    assert not out.exists()


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["peak_tflops", "model_flops_per_step", "params", "tokens_per_step"]),
       value=st.floats(allow_nan=True, allow_infinity=True))
def test_option_numbers_are_usage_errors_exactly_when_not_positive(key, value):
    """For every float: the option check refuses it (a ValueError the CLI turns into exit 2)
    exactly when it is not finite and positive, and the message names the option."""
    args = cli.build_parser().parse_args(["report", "x.json"])
    setattr(args, key, value)
    if key in ("params", "tokens_per_step"):  # they go together
        args.params = value if key == "params" else 1e9
        args.tokens_per_step = value if key == "tokens_per_step" else 4096.0
    ok = math.isfinite(value) and value > 0
    try:
        cli._check_options(args)
    except ValueError as e:
        assert not ok and "--" + key.replace("_", "-") in str(e) and "\n" not in str(e)
    else:
        assert ok


# ---------------------------------------------------------------------------------------------
# odd metadata: the report goes on with less, with a warning (exit 0)

METADATA_CASES = {
    # name: (top-level fields and events, words of the warning)
    "no_complete_events": ({"events": [dict(CPU_OP, ph="i"), dict(CPU_OP, ph="B"), dict(CPU_OP, ph="E")]}, "no complete ('X') events"),
    "only_metadata": ({"events": [PROC, dict(PROC, name="thread_name")]}, "no complete ('X') events"),
    "complete_events_without_ts": ({"events": [{k: v for k, v in CPU_OP.items() if k != "ts"}]}, "no complete ('X') events"),
    "device_name_number": ({"deviceProperties": [{"id": 0, "name": 42}]}, "name 42 is not text"),
    "device_name_list": ({"deviceProperties": [{"id": 0, "name": ["A100"]}]}, 'name ["A100"] is not text'),
    "device_name_null": ({"deviceProperties": [{"id": 0, "name": None}]}, "name null is not text"),
    "device_name_object": ({"deviceProperties": [{"id": 0, "name": {"a": 1}}]}, "is not text"),
    "device_without_name": ({"deviceProperties": [{"id": 0, "numSms": 108}]}, "no name"),
    "device_properties_object": ({"deviceProperties": {"id": 0, "name": "A100"}}, "deviceProperties is an object, not a list"),
    "device_properties_string": ({"deviceProperties": "A100"}, "deviceProperties is a string, not a list"),
    "device_properties_of_numbers": ({"deviceProperties": [1, 2]}, "2 deviceProperties entries are not objects"),
    "rank_text": ({"distributedInfo": {"rank": "3", "world_size": 8}}, 'rank "3" is text: read as 3'),
    "rank_negative": ({"distributedInfo": {"rank": -1, "world_size": 8}}, "rank -1 is not a non-negative integer"),
    "rank_bool": ({"distributedInfo": {"rank": True, "world_size": 8}}, "rank true is not a non-negative integer"),
    "rank_float": ({"distributedInfo": {"rank": 1.5, "world_size": 8}}, "rank 1.5 is not a non-negative integer"),
    "rank_null": ({"distributedInfo": {"rank": None, "world_size": 8}}, "no rank in distributedInfo"),
    "world_size_zero": ({"distributedInfo": {"rank": 0, "world_size": 0}}, "world_size 0 is not an integer of at least 1"),
    "world_size_text": ({"distributedInfo": {"rank": 0, "world_size": "8"}}, 'world_size "8" is text: read as 8'),
    "world_size_negative": ({"distributedInfo": {"rank": 0, "world_size": -2}}, "world_size -2 is not"),
    "rank_beyond_world_size": ({"distributedInfo": {"rank": 9, "world_size": 2}}, "rank 9 is not below its world_size 2"),
    "backend_number": ({"distributedInfo": {"rank": 0, "world_size": 2, "backend": 5}}, "backend 5 is not text"),
    "distributed_info_list": ({"distributedInfo": [0, 2]}, "distributedInfo is a list, not an object"),
    "distributed_info_string": ({"distributedInfo": "rank 0"}, "distributedInfo is a string, not an object"),
}


@pytest.mark.parametrize("case", sorted(METADATA_CASES))
def test_odd_metadata_is_a_warning_and_the_report_goes_on(tmp_path, capsys, case):
    fields, words = METADATA_CASES[case]
    fields = dict(fields)
    src = trace(tmp_path, events=fields.pop("events", None), **fields)
    out = tmp_path / "r.json"
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", out)
    assert code == EXIT_OK, lines
    assert all(ln.startswith("tracelens: warning: ") for ln in lines), lines
    hits = [ln for ln in lines if words in ln]
    assert hits and all(str(src) in ln for ln in hits), (words, lines)
    report = json.loads(out.read_bytes())
    assert any(words in w for w in report["warnings"])  # in the report too, not only on stderr


def test_odd_device_name_is_not_called_missing(tmp_path, capsys):
    """A deviceProperties entry whose name is not text is not "no deviceProperties"."""
    src = trace(tmp_path, deviceProperties=[{"id": 0, "name": 42}])
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", tmp_path / "r.json")
    assert code == EXIT_OK and not any("no deviceProperties" in ln for ln in lines)
    assert any("deviceProperties give no usable GPU name" in ln for ln in lines)


@pytest.mark.parametrize("fmt", ["txt", "html"])
def test_no_complete_events_renders_every_format(tmp_path, capsys, fmt):
    src = trace(tmp_path, events=[PROC])
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", tmp_path / f"r.{fmt}")
    assert code == EXIT_OK and (tmp_path / f"r.{fmt}").stat().st_size > 0


@settings(max_examples=40, deadline=None)
@given(rank=st.recursive(st.none() | st.booleans() | st.integers(-5, 10**20) | st.floats() | st.text(max_size=5),
                         lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=2), c, max_size=2), max_leaves=4),
       world=st.none() | st.booleans() | st.integers(-3, 10) | st.text("0123456789 x", max_size=3))
def test_any_distributed_info_gives_a_usable_rank_or_none(tmp_path_factory, rank, world):
    """Whatever distributedInfo holds, parsing does not fail and the rank and world size it keeps
    are non-negative (positive) integers, or None."""
    from tracelens.parsers import kineto

    d = tmp_path_factory.mktemp("dist")
    src = d / "t.json"
    src.write_bytes(json.dumps({"distributedInfo": {"rank": rank, "world_size": world}, "traceEvents": [CPU_OP, KERNEL]},
                               allow_nan=True).encode())
    _, meta = kineto.parse(src)
    assert meta.rank is None or (type(meta.rank) is int and meta.rank >= 0)
    assert meta.world_size is None or (type(meta.world_size) is int and meta.world_size >= 1)
    assert meta.world_size is None or meta.rank is None or meta.rank < meta.world_size


# ---------------------------------------------------------------------------------------------
# event lists with no usable event: exit 3, the message names the field and its first bad value

UNUSABLE_CASES = {
    "ts_text": ([dict(CPU_OP, ts="abc"), dict(KERNEL, ts="abc")], "no event has a usable timestamp (ts)", "'ts' is \"abc\""),
    "ts_object": ([dict(CPU_OP, ts={"a": 1})], "no event has a usable timestamp (ts)", "'ts' is {\"a\":1}"),
    "ts_list": ([dict(CPU_OP, ts=[1]), dict(KERNEL, ts=[2])], "no event has a usable timestamp (ts)", "'ts' is [1]"),
    "ts_bool_and_text": ([dict(CPU_OP, ts="x"), dict(KERNEL, ts="y")], "usable timestamp (ts)", "all 2 events skipped"),
    "ph_number": ([dict(CPU_OP, ph=5)], "no usable trace events", "'ph' is 5, not a string"),
    "dur_text": ([dict(CPU_OP, dur="long")], "no usable trace events", "'dur' is \"long\", not a number"),
    "cat_list": ([dict(CPU_OP, cat=["cpu_op"])], "no usable trace events", "'cat' is [\"cpu_op\"]"),
    "items_numbers": ([1, 2, 3], "not a trace: the array holds no trace events", "an item of traceEvents is a number"),
    "items_strings": (["X", "Y"], "not a trace: the array holds no trace events", "is a string, not an object"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE_CASES))
def test_unusable_events_name_the_real_problem(tmp_path, capsys, case):
    events, words, detail = UNUSABLE_CASES[case]
    src = trace(tmp_path, events=events)
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", tmp_path / "r.json")
    line = error_line(lines)
    assert code == EXIT_BAD_INPUT and str(src) in line and words in line and detail in line, line
    if "'ts'" in detail or "'dur'" in detail:
        assert "'ph' field" not in line  # the events have a ph: their timestamp is what is wrong


# ---------------------------------------------------------------------------------------------
# recognised formats tracelens does not analyse: exit 3, the format named (README's table)

NCCL = real_traces() / "nccl"


def _formats() -> list[Path]:
    # (NCCL logs, Flight Recorder dumps, nccl-tests and Inspector outputs are analysed on their own:
    # tests/test_nccl_report.py, tests/test_nccl_profilers.py)
    cases = sorted((NCCL / "nccl-tests").glob("*.txt")) + sorted((NCCL / "inspector").glob("*.jsonl"))
    assert len(cases) >= 4, cases
    return cases


@pytest.mark.parametrize("path", _formats(), ids=lambda v: v.name)
def test_nccl_tools_outputs_get_their_report(capsys, tmp_path, path):
    out = tmp_path / "r.json"
    code, lines, _ = run(capsys, "report", "--no-cache", path, "-o", out)
    assert code == 0, lines
    assert json.loads(out.read_text())["job"]["nccl"]["bandwidth"]


def test_flight_recorder_pickle_is_read_without_pickle_load(tmp_path, capsys, monkeypatch):
    """torch's Flight Recorder writes a pickle of the same dict as its JSON dump: read by the
    restricted unpickler (parsers/nccl/flight_recorder.py), never by pickle.load; another pickle is refused."""
    dump = json.loads((NCCL / "flight_recorder" / "fr_gloo_rank_0.json").read_bytes())
    fr = tmp_path / "nccl_trace_rank_0"
    fr.write_bytes(pickle.dumps(dump, protocol=4))
    other = tmp_path / "model.pkl"
    other.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))

    def never(*a, **k):
        raise AssertionError("a file was unpickled")

    monkeypatch.setattr(pickle, "loads", never)
    monkeypatch.setattr(pickle, "load", never)
    code, lines, _ = run(capsys, "report", "--no-cache", fr, "-o", tmp_path / "r.json")
    assert code == EXIT_OK, lines
    assert json.loads((tmp_path / "r.json").read_text())["job"]["nccl_diagnosis"]["verdict"] == "ok"
    code, lines, _ = run(capsys, "report", "--no-cache", other, "-o", tmp_path / "r.json")
    assert code == EXIT_BAD_INPUT and "a Python pickle, not a trace" in error_line(lines)


@pytest.mark.parametrize("suffix", [".nsys-rep", ".qdrep"])
def test_nsys_report_says_how_to_export_it(tmp_path, capsys, suffix):
    rep = tmp_path / f"profile{suffix}"
    rep.write_bytes(b"\x00\x01NSYS-REPORT-LIKE\x00" + bytes(range(256)))  # its bytes are undocumented: named by suffix
    code, lines, _ = run(capsys, "report", "--no-cache", rep, "-o", tmp_path / "r.json")
    line = error_line(lines)
    assert code == EXIT_BAD_INPUT and "Nsight Systems report (.nsys-rep)" in line and "nsys export --type sqlite" in line, line


def test_nsys_sqlite_is_still_read_by_info(capsys):
    sqlite = sorted((real_traces() / "nsys").glob("*.sqlite"))[0]
    code, _, out = run(capsys, "info", sqlite)
    assert code == EXIT_OK and out


def test_recognised_json_dumps_in_a_job_directory_are_skipped(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    trace(job, "rank-0.json", distributedInfo={"rank": 0, "world_size": 1})
    (job / "fr_rank_0.json").write_bytes((NCCL / "flight_recorder" / "fr_gloo_rank_0.json").read_bytes())
    code, lines, _ = run(capsys, "report", "--no-cache", job, "-o", tmp_path / "r.json")
    assert code == EXIT_OK and any("fr_rank_0.json: skipped" in ln and "Flight Recorder" in ln for ln in lines), lines


def test_real_traces_still_load(capsys, tmp_path):
    """The detection of NCCL logs does not catch a Kineto trace whose names mention NCCL."""
    src = real_trace_files("hta/nccl_parser_config")[0]
    code, lines, _ = run(capsys, "report", "--no-cache", src, "-o", tmp_path / "r.json")
    assert code == EXIT_OK, lines


# ---------------------------------------------------------------------------------------------
# the codes are documented, and a real process prints no traceback


def test_every_exit_code_is_documented():
    helptext = cli.build_parser().format_help()
    readme = (ROOT / "README.md").read_text()
    codes = [c for c, _ in EXIT_CODES]
    assert codes == sorted(set(codes)) and {0, 1, 2, 3, 4, 5, 130} <= set(codes)
    for code, meaning in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s+{re.escape(meaning)}$", helptext, re.M), (code, helptext)
        assert f"| `{code}` |" in readme, code


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRACELENS_DEBUG"}
    return subprocess.run([sys.executable, "-m", "tracelens", *map(str, args)], capture_output=True, text=True, cwd=ROOT, env=env)


def test_real_process_output_error(tmp_path):
    (tmp_path / "r.html").mkdir()
    r = _cli("report", SAMPLE_TRACES / "job_2ranks", "-o", tmp_path / "r.html")
    assert r.returncode == EXIT_OUTPUT and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"tracelens: error: {tmp_path / 'r.html'}: is a directory (give a file name, e.g. report.html)"]


def test_real_process_format_and_usage_errors(tmp_path):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not sqlite")
    r = _cli("report", rep)
    assert r.returncode == EXIT_BAD_INPUT and len(r.stderr.strip().splitlines()) == 1 and "nsys export" in r.stderr
    r = _cli("report", SAMPLE_TRACES / "job_2ranks", "--fail-over-step-ms", "nan")
    assert r.returncode == EXIT_USAGE and r.stderr.strip().splitlines() == [
        "tracelens: error: --fail-over-step-ms nan: give the step time in milliseconds, a positive number"]


@pytest.mark.parametrize("argv", [
    ["report", "x.json", "--model-flops-per-step", "-1e12"],  # argparse takes "-1e12" for an option
    ["report", "x.json", "--jobs", "many"],
    ["report", "x.json", "--peak-tflops", "fast"],
    ["report", "x.json", "--no-such-flag"],
    ["info"],
])
def test_argparse_errors_are_one_line(capsys, argv):
    code, lines, out = run(capsys, *argv)
    assert code == EXIT_USAGE and len(lines) == 1 and " error: " in lines[0] and "--help" in lines[0] and out == "", lines


def test_a_command_that_does_not_exist_is_a_usage_error(capsys, tmp_path, monkeypatch):
    """``tracelens compare a b`` once said 'compare: no such file or directory' (exit 3): the
    word was taken for a trace path; a missing trace path (it has a dot) keeps its exit 3."""
    monkeypatch.chdir(tmp_path)
    code, lines, out = run(capsys, "compare", "a.json", "b.json")
    assert code == EXIT_USAGE and len(lines) == 1 and "'compare' is neither a command" in lines[0]
    assert "--compare BASELINE" in lines[0] and out == ""
    code, lines, _ = run(capsys, "a.json")
    assert code == EXIT_BAD_INPUT and "no such file" in error_line(lines)


def test_open_without_a_terminal_refuses_instead_of_waiting(tmp_path):
    """``tracelens open`` with stdin from /dev/null and stdout a pipe once started the UI and
    waited for keys forever (found by running every command unattended); now exit 2, one line,
    before anything is loaded."""
    r = subprocess.run([sys.executable, "-m", "tracelens", "open", str(SAMPLE_TRACES / "job_2ranks")], capture_output=True,
                       text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == EXIT_USAGE and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["tracelens: error: open needs a terminal (stdin and stdout); without one: "
                                             "tracelens report PATH [-o report.html]"]


def test_options_that_a_saved_report_cannot_use_are_refused_with_load(tmp_path, capsys):
    """``report --load r.json --gpu H100`` (or --critical-path, --nccl, --steps) once re-rendered the
    saved report without a word, as if the option had been applied; now a usage error naming them."""
    saved = tmp_path / "r.json"
    assert run(capsys, "report", trace(tmp_path), "-o", saved)[0] == EXIT_OK
    code, lines, out = run(capsys, "report", "--load", saved, "--gpu", "H100", "--critical-path")
    assert code == EXIT_USAGE and out == ""
    assert error_line(lines) == ("tracelens: error: --critical-path, --gpu do not apply to --load: a saved report is shown "
                                 "as it was analysed (analyse its traces again to change that)")
    code, lines, _ = run(capsys, "report", "--load", saved, "--nccl", tmp_path, "--compare", saved)
    assert code == EXIT_USAGE and "--nccl does not apply to --load" in error_line(lines)
    assert run(capsys, "report", "--load", saved, "--compare", saved, "-o", tmp_path / "c.html")[0] == EXIT_OK


@pytest.mark.parametrize("argv", [["report", "--gpu", ""], ["report", "--step-range", " "], ["open", "--data-range", ""],
                                  ["export-trace", "--step-range", "", "-o", "{t}/x.json"]])
def test_an_empty_option_value_is_a_usage_error(tmp_path, capsys, argv):
    """``--gpu "$GPU"`` with GPU unset once ran as if no --gpu were given (the MFU silently unknown);
    now exit 2 naming the option, before anything is read."""
    cmd, flag, *rest = argv
    code, lines, out = run(capsys, cmd, trace(tmp_path), flag, *(a.format(t=tmp_path) for a in rest))
    assert code == EXIT_USAGE and out == "" and not (tmp_path / "x.json").exists()
    assert error_line(lines) == f"tracelens: error: {flag.split()[0]} is empty: give a value, or leave the option out"
