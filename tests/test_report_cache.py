"""The report cache (tracelens.store.reports): a re-run of an unchanged job with the same options
is served from it, byte for byte the report of a fresh analysis, without importing polars; any
change of what the report is made of misses; a damaged entry is one warning and a re-analysis;
what is true of one run only (a corrupt parse-cache entry) is never stored."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, real_traces
from tracelens.cli import main
from tracelens.store import reports

TRACE = "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"
JOB = "hta/trace_filter"  # two ranks in a directory


def run(args: list[str], out: Path, capsys) -> tuple[bytes, str]:
    capsys.readouterr()
    assert main(["report", *args, "-o", str(out)]) == 0
    return out.read_bytes(), capsys.readouterr().err


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "reports").glob(f"*{reports.SUFFIX}"))


@pytest.fixture
def trace(tmp_path):
    f = tmp_path / "t.json.gz"
    shutil.copy(real_traces() / TRACE, f)
    return f


@pytest.mark.parametrize("fmt", ["json", "txt", "html"])
@pytest.mark.parametrize("job", ["sample_traces/job_2ranks", f"tests/data/traces/{JOB}",
                                 "tests/data/traces/amd-tracelens/b200/eager_trace.json.gz"])
def test_a_hit_is_the_fresh_report_byte_for_byte(job, fmt, tmp_path, capsys, monkeypatch, _isolated_cache):
    monkeypatch.chdir(ROOT)
    fresh, err_fresh = run([job, "--no-cache"], tmp_path / f"a.{fmt}", capsys)
    assert not (_isolated_cache / "reports").exists()  # --no-cache neither reads nor writes it
    first, err_first = run([job], tmp_path / f"b.{fmt}", capsys)
    assert len(entries(_isolated_cache)) == 1
    import tracelens.analysis

    monkeypatch.setattr(tracelens.analysis, "analyze", lambda *a, **k: pytest.fail("analysed again"))
    second, err_second = run([job], tmp_path / f"c.{fmt}", capsys)
    assert fresh == first == second
    assert err_fresh == err_first == err_second  # the same warnings on stderr


def test_a_report_with_and_without_the_critical_path_are_cached_apart(trace, tmp_path, capsys, monkeypatch, _isolated_cache):
    import orjson

    plain, _ = run([str(trace)], tmp_path / "a.json", capsys)
    crit, _ = run([str(trace), "--critical-path"], tmp_path / "b.json", capsys)
    assert len(entries(_isolated_cache)) == 2
    assert orjson.loads(plain)["ranks"][0]["critical_path"] is None
    assert orjson.loads(crit)["ranks"][0]["critical_path"]["length_ns"] > 0
    import tracelens.analysis

    monkeypatch.setattr(tracelens.analysis, "analyze", lambda *a, **k: pytest.fail("analysed again"))
    assert run([str(trace)], tmp_path / "c.json", capsys)[0] == plain  # each one served from its own entry
    assert run([str(trace), "--critical-path"], tmp_path / "d.json", capsys)[0] == crit


def test_a_hit_imports_neither_polars_nor_the_analysis(trace, _isolated_cache):
    code = ("import sys; from tracelens.cli import main; rc = main(['report', sys.argv[1], '-o', sys.argv[2]]); "
            "print(rc, 'polars' in sys.modules, 'tracelens.analysis' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = trace.parent / "r.json"
    cold = subprocess.run([sys.executable, "-c", code, str(trace), str(out)], capture_output=True, text=True, env=env)
    assert cold.stdout.split() == ["0", "True", "True"], cold.stderr
    first = out.read_bytes()
    warm = subprocess.run([sys.executable, "-c", code, str(trace), str(out)], capture_output=True, text=True, env=env)
    assert warm.stdout.split() == ["0", "False", "False"], warm.stderr
    assert out.read_bytes() == first


def test_what_the_report_is_made_of_changes_the_key(trace, tmp_path, capsys, monkeypatch, _isolated_cache):
    out = tmp_path / "r.json"
    base, _ = run([str(trace)], out, capsys)
    key = lambda **kw: reports.job_key([trace], options=kw.pop("options", {}), **kw)[0]  # noqa: E731
    k0 = key()
    assert k0 is not None and key() == k0
    assert key(options={"gpu": "A100"}) != k0  # an option
    assert key(options={"gpu": None, "include_warmup": False, "given": ()}) == k0  # options left at their defaults
    assert key(options={"gpu": "A100", "given": (("gpu", "x/tracelens.toml"),)}) != key(options={"gpu": "A100"})  # where it came from
    assert key(keep_python=True) != k0 and key(strict=True) != k0
    assert key(options={"critical_path": True}) != k0 and key(options={"critical_path": False}) == k0
    monkeypatch.setenv("TRACELENS_MAX_INFLATE", "100")  # a limit changes what a parse keeps
    assert key() != k0
    monkeypatch.delenv("TRACELENS_MAX_INFLATE")
    monkeypatch.setenv("TRACELENS_DEBUG", "1")  # tracebacks do not
    assert key() == k0
    import tracelens

    monkeypatch.setattr(tracelens, "__version__", "9.9.9")  # another version of tracelens
    assert key() != k0
    monkeypatch.undo()
    monkeypatch.setattr(reports, "code_fingerprint", lambda: "edited")  # its code edited (a parser's version is in its code)
    assert key() != k0
    monkeypatch.undo()
    other = tmp_path / "copy.json.gz"
    shutil.copy(trace, other)
    assert reports.job_key([other], options={})[0] != k0  # the same bytes under another path (the report names it)
    # the file itself: a changed byte, with the mtime put back (the stat index still sees the ctime)
    st = trace.stat()
    data = bytearray(trace.read_bytes())
    data[-10] ^= 0xFF
    trace.write_bytes(bytes(data))
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert key() != k0
    capsys.readouterr()
    main(["report", str(trace), "-o", str(out)])  # a damaged gzip tail: analysed again, not served the old report
    assert len(entries(_isolated_cache)) >= 1


def test_a_new_file_in_the_job_directory_misses(tmp_path, capsys, _isolated_cache):
    d = tmp_path / "job"
    shutil.copytree(real_traces() / JOB, d)
    out = tmp_path / "r.json"
    run([str(d)], out, capsys)
    k0 = reports.job_key([d], options={})[0]
    extra = sorted(d.iterdir())[0]
    shutil.copy(extra, d / "zz_rank9.json.gz")
    assert reports.job_key([d], options={})[0] != k0


def test_a_settings_file_beside_the_traces_misses(trace, tmp_path, capsys, _isolated_cache):
    out = tmp_path / "r.json"
    plain, _ = run([str(trace)], out, capsys)
    (trace.parent / "tracelens.toml").write_text('gpu = "A100"\n')
    with_gpu, _ = run([str(trace)], out, capsys)
    assert b"tracelens.toml" in with_gpu and with_gpu != plain
    assert len(entries(_isolated_cache)) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "directory", "other_key"])
def test_a_damaged_entry_is_one_warning_and_a_reanalysis(damage, trace, tmp_path, capsys, _isolated_cache):
    out = tmp_path / "r.json"
    good, _ = run([str(trace)], out, capsys)
    (entry,) = entries(_isolated_cache)
    raw = entry.read_bytes()
    if damage == "flip":
        b = bytearray(raw)
        b[len(b) // 2] ^= 0x01
        entry.write_bytes(bytes(b))
    elif damage == "truncate":
        entry.write_bytes(raw[: len(raw) - 7])
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "directory":
        entry.unlink()
        entry.mkdir()
    else:  # another key's entry, whole and with good checksums, in this key's place
        reports.put("0" * 40, {"warnings": [], "job": {}}, _isolated_cache)
        shutil.copy(reports.reports_dir(_isolated_cache) / f"{'0' * 40}{reports.SUFFIX}", entry)
    again, err = run([str(trace)], out, capsys)
    assert err.count("report cache entry for this job was corrupt") == 1
    import orjson

    d = orjson.loads(again)
    assert [w for w in d["warnings"] if "report cache" in w] and {**d, "warnings": []} == {**orjson.loads(good), "warnings": []}
    # the entry was rewritten from the new analysis, without the warning of that run
    third, err3 = run([str(trace)], out, capsys)
    assert third == good and "was corrupt" not in err3


def test_a_corrupt_parse_cache_entry_is_not_frozen_into_the_report(trace, tmp_path, capsys, _isolated_cache):
    out = tmp_path / "r.json"
    assert main(["report", str(trace), "--no-cache", "-o", str(out)]) == 0
    clean = out.read_bytes()
    capsys.readouterr()
    assert main(["info", str(trace)]) == 0  # parse cache only: the report cache is still empty
    assert not entries(_isolated_cache)
    (pq,) = _isolated_cache.glob("*.parquet")
    b = bytearray(pq.read_bytes())
    b[len(b) // 2] ^= 0x01
    pq.write_bytes(bytes(b))
    first, err = run([str(trace)], out, capsys)
    assert "cache entry for this file was corrupt" in err
    assert not entries(_isolated_cache)  # this run's warning is not the job's: nothing stored
    second, err2 = run([str(trace)], out, capsys)
    assert second == clean and "was corrupt" not in err2 and len(entries(_isolated_cache)) == 1
    third, err3 = run([str(trace)], out, capsys)
    assert third == clean and "was corrupt" not in err3


def test_the_demo_is_served_from_the_cache_the_second_time(tmp_path, capsys, monkeypatch):
    page = tmp_path / "demo.html"
    assert main(["demo", "-o", str(page)]) == 0
    first = (capsys.readouterr().out, page.read_bytes())
    import tracelens.analysis

    monkeypatch.setattr(tracelens.analysis, "analyze", lambda *a, **k: pytest.fail("analysed again"))
    assert main(["demo", "-o", str(page)]) == 0
    assert (capsys.readouterr().out, page.read_bytes()) == first


def test_the_size_cap_removes_the_least_recently_used(tmp_path):
    root = tmp_path / "c"
    for i, key in enumerate(["a" * 40, "b" * 40, "c" * 40]):
        reports.put(key, {"warnings": [], "n": "x" * 1000}, root)
        os.utime(reports.reports_dir(root) / f"{key}{reports.SUFFIX}", (1000 + i, 1000 + i))
    assert reports.get("a" * 40, root) is not None  # a hit makes "a" the most recent
    size = (reports.reports_dir(root) / f"{'a' * 40}{reports.SUFFIX}").stat().st_size
    removed = reports.sweep(root, max_total=2 * size)
    assert [p.name[:1] for p in removed] == ["b"]
    assert reports.get("b" * 40, root) is None and reports.get("a" * 40, root) and reports.get("c" * 40, root)


def test_stale_temporary_files_are_swept(tmp_path):
    root = tmp_path / "c"
    d = reports.reports_dir(root)
    d.mkdir(parents=True)
    stale = d / f".{'d' * 40}{reports.SUFFIX}.999999999.abc.tmp"
    fresh = d / f".{'e' * 40}{reports.SUFFIX}.{os.getpid()}.abc.tmp"
    for p in (stale, fresh):
        p.write_bytes(b"half")
    os.utime(stale, (0, 0))
    assert reports.sweep(root) == [stale] and fresh.exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0), xor=st.integers(min_value=1, max_value=255))
def test_any_damaged_byte_is_caught(tmp_path, at, xor):
    """Property: an entry with any one byte changed is refused (CorruptEntry), never served."""
    root = tmp_path / "prop"
    key = "f" * 40
    report = {"schema_version": 1, "warnings": ["w"], "job": {"mfu": 0.25, "ranks": 2}, "x": list(range(30))}
    reports.put(key, report, root)
    p = reports.reports_dir(root) / f"{key}{reports.SUFFIX}"
    b = bytearray(p.read_bytes())
    b[at % len(b)] ^= xor
    p.write_bytes(bytes(b))
    with pytest.raises(reports.CorruptEntry):
        reports.get(key, root)
    assert not p.exists()
