"""The parse cache never lies (issue 14, item 5): a damaged entry is found by its checksums,
removed and re-parsed with a warning; a rewrite that restores the mtime is a miss; a cache
that cannot be written is one warning and the run goes on without it; a killed run's
temporary files are removed by the next run.  Every hostile case compares the report with
the one parsed without the cache."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracelens.parsers import kineto as kineto_parser

from tests.conftest import ROOT, modes_bind, real_traces
from tracelens.analysis import Options, analyze
from tracelens.cli import main
from tracelens.store import cache
from tracelens.store.atomic import temp_owner, write_with
from tracelens.store.job import load

TRACE = "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"  # small: the property test parses it often
OTHER = "hta/trace_file_list/inference_rank_1.json.gz"


def report(paths, **kw) -> dict:
    return analyze(load(paths, **kw), Options()).to_dict()


def kinds(warnings) -> list[str]:
    """Which of the cache's warnings a run gave."""
    out = []
    for w in warnings:
        if "cache entry for this file was corrupt" in w:
            out.append("corrupt")
        elif "stat index entry for this file was damaged" in w:
            out.append("stat")
        elif "parse cache in" in w:
            out.append("off")
    return out


def cache_free(d: dict) -> dict:
    return {**d, "warnings": [w for w in d["warnings"] if not kinds([w])]}


def entry(root: Path, f: Path) -> tuple[Path, Path]:
    """The cache entry (Parquet, metadata) of trace ``f`` in ``root``."""
    key = f"{cache.content_hash(f)}-kineto-{kineto_parser.PARSER_VERSION}.v{cache.LAYOUT}"
    return root / f"{key}.parquet", root / f"{key}.meta.json"


@pytest.fixture
def job(tmp_path, _isolated_cache):
    """A copy of TRACE and of OTHER, both cached; the clean report of TRACE (no cache)."""
    f = tmp_path / "trace.json.gz"
    g = tmp_path / "other.json.gz"
    shutil.copy(real_traces() / TRACE, f)
    shutil.copy(real_traces() / OTHER, g)
    clean = report([f], use_cache=False)
    assert report([f]) == clean and report([g])
    assert all(p.is_file() for p in entry(_isolated_cache, f) + entry(_isolated_cache, g))
    return f, g, clean, _isolated_cache


def _flip(p: Path, at: int, xor: int = 0x20) -> None:
    b = bytearray(p.read_bytes())
    b[at % len(b)] ^= xor
    p.write_bytes(bytes(b))


def _bump_number(p: Path, field: bytes) -> None:
    raw = p.read_bytes()
    i = raw.index(field) + len(field)
    p.write_bytes(raw[:i] + str(int(raw[i:i + 1]) ^ 1).encode() + raw[i + 1:])


def _stat_entries(root: Path) -> list[Path]:
    return sorted((root / "stat").iterdir())


def _stat_points_elsewhere(root, f, g):
    """The stat index entry of f names g's content hash (a checksum that no longer fits)."""
    for s in _stat_entries(root):
        h, check = s.read_text().split()
        if h == cache.content_hash(f):
            s.write_text(f"{cache.content_hash(g)} {check}")


def _dir_instead_of_parquet(root, f, g):
    pq, _ = entry(root, f)
    pq.unlink()
    pq.mkdir()
    (pq / "x").write_text("x")


def _replace(p: Path, make) -> None:
    """``p`` replaced by what ``make(p)`` puts there (a FIFO, a directory, a link)."""
    p.unlink()
    make(p)


def _stat_entry(root: Path, f: Path) -> Path:
    import hashlib

    return root / "stat" / hashlib.blake2b(cache._stat_ident(f), digest_size=16).hexdigest()


def _each_stat_entry(root: Path, make) -> None:
    for s in _stat_entries(root):
        _replace(s, make)


def _link_to_dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


# name: (what is done to the cache, the cache warnings the next run gives)
HOSTILE = {
    "parquet_byte_flipped": (lambda root, f, g: _flip(entry(root, f)[0], entry(root, f)[0].stat().st_size // 2), ["corrupt"]),
    "parquet_magic_flipped": (lambda root, f, g: _flip(entry(root, f)[0], 0), ["corrupt"]),
    "parquet_truncated": (lambda root, f, g: entry(root, f)[0].write_bytes(entry(root, f)[0].read_bytes()[:-100]), ["corrupt"]),
    "parquet_emptied": (lambda root, f, g: entry(root, f)[0].write_bytes(b""), ["corrupt"]),
    "parquet_random_bytes_same_size": (
        lambda root, f, g: entry(root, f)[0].write_bytes(os.urandom(entry(root, f)[0].stat().st_size)), ["corrupt"]),
    "parquet_of_another_trace": (lambda root, f, g: shutil.copy(entry(root, g)[0], entry(root, f)[0]), ["corrupt"]),
    "meta_number_changed": (lambda root, f, g: _bump_number(entry(root, f)[1], b'"size_bytes":'), ["corrupt"]),
    "meta_checksum_changed": (lambda root, f, g: _bump_number(entry(root, f)[1], b'"parquet_bytes":'), ["corrupt"]),
    "meta_not_json": (lambda root, f, g: entry(root, f)[1].write_bytes(b'{"layout": 2, "meta": {'), ["corrupt"]),
    "meta_deeply_nested": (lambda root, f, g: entry(root, f)[1].write_bytes(b"[" * 200_000), ["corrupt"]),
    "meta_a_list": (lambda root, f, g: entry(root, f)[1].write_bytes(b"[1, 2]"), ["corrupt"]),
    "meta_of_another_trace": (lambda root, f, g: shutil.copy(entry(root, g)[1], entry(root, f)[1]), ["corrupt"]),
    "meta_and_parquet_of_another_trace": (
        lambda root, f, g: [shutil.copy(a, b) for a, b in zip(entry(root, g), entry(root, f))], ["corrupt"]),
    "meta_missing": (lambda root, f, g: entry(root, f)[1].unlink(), []),  # half an entry (a killed run): a plain miss
    "parquet_missing": (lambda root, f, g: entry(root, f)[0].unlink(), []),
    "stat_index_points_at_another_hash": (_stat_points_elsewhere, []),
    "stat_index_garbage": (lambda root, f, g: [s.write_bytes(b"\xff\x00 garbage\n" * 3) for s in _stat_entries(root)], []),
    "stat_index_deleted": (lambda root, f, g: shutil.rmtree(root / "stat"), []),
    "parquet_path_is_a_directory": (_dir_instead_of_parquet, ["corrupt", "off"]),
    # not a regular file (the FIFOs, which would hang a run that opened them, are in test_a_fifo_in_the_cache_...)
    "parquet_path_is_an_empty_directory": (lambda root, f, g: _replace(entry(root, f)[0], Path.mkdir), ["corrupt"]),
    "meta_path_is_an_empty_directory": (lambda root, f, g: _replace(entry(root, f)[1], Path.mkdir), ["corrupt"]),
    "meta_is_a_link_to_dev_zero": (lambda root, f, g: _replace(entry(root, f)[1], _link_to_dev_zero), ["corrupt"]),
    "parquet_is_a_link_to_dev_zero": (lambda root, f, g: _replace(entry(root, f)[0], _link_to_dev_zero), ["corrupt"]),
    "stat_index_is_an_empty_directory": (lambda root, f, g: _each_stat_entry(root, Path.mkdir), ["stat"]),
    "stat_index_is_a_link_to_dev_zero": (lambda root, f, g: _each_stat_entry(root, _link_to_dev_zero), ["stat"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_cache_entry(job, case, monkeypatch):
    f, g, clean, root = job
    damage, expected = HOSTILE[case]
    damage(root, f, g)
    got = report([f])
    assert kinds(got["warnings"]) == expected, got["warnings"]
    assert cache_free(got) == clean
    if "off" in expected:
        return
    # the entry was written again, whole: the next run reads it, with no warning
    monkeypatch.setattr(kineto_parser, "parse", lambda *a, **k: pytest.fail("parsed again instead of using the cache"))
    assert report([f]) == clean


FIFOS = {  # where a FIFO replaces a cache file: the name of the file, the warning the run gives
    "stat_index": (lambda root, f: [_stat_entry(root, f)], "stat index entry for this file was damaged"),
    "meta": (lambda root, f: [entry(root, f)[1]], "cache entry for this file was corrupt"),
    "parquet": (lambda root, f: [entry(root, f)[0]], "cache entry for this file was corrupt"),
}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("where", sorted(FIFOS))
def test_a_fifo_in_the_cache_does_not_hang_the_run(job, where, tmp_path):
    """A FIFO in place of a cache file, with no writer: a run that opened it for reading would
    block forever.  The run (a subprocess, with a timeout) finishes, warns once, gives the report
    of a run without the cache, and leaves a regular file where the FIFO was."""
    f, g, clean, root = job
    env = {**os.environ, "TRACELENS_CACHE_DIR": str(root), "PYTHONPATH": str(ROOT)}

    def run(*extra: str) -> tuple[dict, str]:
        out = tmp_path / "out.json"
        p = subprocess.run([sys.executable, "-m", "tracelens", "report", str(f), "-o", str(out), *extra], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(out.read_text()), p.stderr

    want, _ = run("--no-cache")
    pick, warning = FIFOS[where]
    fifos = pick(root, f)
    assert all(p.is_file() for p in fifos)
    for p in fifos:
        _replace(p, os.mkfifo)
    got, err = run()  # subprocess.TimeoutExpired here: the run hung on the FIFO
    assert sum(warning in line for line in err.splitlines()) == 1 and "is a FIFO" in err, err
    assert cache_free(got) == cache_free(want)
    assert all(p.is_file() for p in fifos)
    again, err = run()  # and the next run reads the entry written again, with no warning
    assert kinds(err.splitlines()) == [], err
    assert again == want


def test_a_cache_file_is_read_no_further_than_its_size(tmp_path):
    """``_read_file`` refuses what is not a regular file before reading, and reads at most the
    bound + 1 bytes of one that is (the caller tells a longer file by its length)."""
    p = tmp_path / "f"
    p.write_bytes(b"x" * 1000)
    assert cache._read_file(p, 10) == b"x" * 11 and cache._read_file(p, 5000) == b"x" * 1000
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(cache.NotAFile, match="d is a directory"):
        cache._read_file(d, 10)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(cache.NotAFile, match="fifo is a FIFO"):
            cache._read_file(tmp_path / "fifo", 10)
    with pytest.raises(FileNotFoundError):
        cache._read_file(tmp_path / "missing", 10)


def test_metadata_beyond_the_size_limit_is_not_read(job, monkeypatch):
    f, g, clean, root = job
    monkeypatch.setattr(cache, "MAX_META_BYTES", entry(root, f)[1].stat().st_size - 1)
    got = report([f])
    assert kinds(got["warnings"]) == ["corrupt"] and any("its metadata is not an entry's" in w for w in got["warnings"])
    assert cache_free(got) == clean


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.sampled_from(["parquet", "meta"]), at=st.integers(min_value=0, max_value=10**9), xor=st.integers(1, 255))
def test_a_flipped_cache_byte_never_changes_the_report(job, which, at, xor):
    f, g, clean, root = job
    pq, mj = entry(root, f)  # each example's re-parse wrote it again
    _flip(pq if which == "parquet" else mj, at, xor)
    got = report([f])
    assert kinds(got["warnings"]) == ["corrupt"], (which, at, xor)
    assert cache_free(got) == clean
    assert report([f]) == clean  # re-written whole


def test_in_place_rewrite_that_restores_the_mtime_is_caught(tmp_path):
    """Same path, same size, same mtime (os.utime), other events: the report is the new one."""
    f = tmp_path / "trace.json"
    doc = json.loads(_gunzip(real_traces() / TRACE))
    f.write_text(json.dumps(doc))
    before = os.stat(f)
    first = report([f])
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels
    for e in kernels:  # other durations, written with the same number of digits: the same size
        e["dur"] = _same_width(e["dur"])
    data = json.dumps(doc).encode()
    assert len(data) == before.st_size
    with open(f, "r+b") as fh:  # in place: the same inode
        fh.write(data)
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    while os.stat(f).st_ctime_ns == before.st_ctime_ns:  # the ctime clock ticks coarsely on some file systems
        os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    now = os.stat(f)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    second = report([f])
    assert second == report([f], use_cache=False) and second != first


def _gunzip(p: Path) -> bytes:
    import gzip

    return gzip.decompress(p.read_bytes())


def _same_width(x):
    s = str(x)
    d = next(i for i, c in enumerate(s) if c.isdigit() and c != "0")
    out = s[:d] + str(int(s[d]) % 9 + 1 if int(s[d]) < 9 else 1) + s[d + 1:]
    return type(x)(out)


# -- a cache that cannot be written -------------------------------------------------------

def _no_writes(monkeypatch, err: OSError) -> None:
    def refuse(*a, **k):
        raise err

    monkeypatch.setattr(cache, "write_with", refuse)
    monkeypatch.setattr(cache, "write_bytes", refuse)


def _read_only(monkeypatch, d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o555)
    if not modes_bind():  # root writes through the mode bits: refuse as the kernel would
        _no_writes(monkeypatch, PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(d)))


def _as_a_file(monkeypatch, d: Path) -> None:
    d.parent.mkdir(parents=True, exist_ok=True)
    d.write_text("not a directory")


def _under_a_file(monkeypatch, d: Path) -> None:
    d.parent.parent.mkdir(parents=True, exist_ok=True)
    d.parent.write_text("not a directory")


# name: (how the cache directory is made unusable, the word of the reason)
UNWRITABLE = {
    "read_only_dir": (_read_only, "Permission denied"),
    "disk_full": (lambda mp, d: _no_writes(mp, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))), "No space left on device"),
    "permission_error_on_write": (lambda mp, d: _no_writes(mp, PermissionError(errno.EACCES, os.strerror(errno.EACCES))),
                                  "Permission denied"),
    "cache_dir_is_a_file": (_as_a_file, "Not a directory"),
    "cache_dir_under_a_file": (_under_a_file, "Not a directory"),
}


@pytest.mark.parametrize("case", sorted(UNWRITABLE))
def test_cache_that_cannot_be_written_is_one_warning(tmp_path, monkeypatch, capsys, case):
    make, words = UNWRITABLE[case]
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    for name, src in (("rank-0.json.gz", TRACE), ("rank-1.json.gz", OTHER)):
        shutil.copy(real_traces() / src, jobdir / name)
    assert main(["report", str(jobdir), "--no-cache", "-o", str(tmp_path / "clean.json")]) == 0
    capsys.readouterr()
    d = tmp_path / "c" / "cache"
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(d))
    make(monkeypatch, d)
    try:
        rc = main(["report", str(jobdir), "-o", str(tmp_path / "r.json")])
    finally:
        if d.is_dir():
            d.chmod(0o755)
    err = capsys.readouterr().err
    assert rc == 0, err
    off = [line for line in err.splitlines() if "parse cache" in line]
    assert len(off) == 1 and words in off[0] and str(d) in off[0], err
    assert "internal error" not in err and "Traceback" not in err
    got, clean = (json.loads((tmp_path / n).read_text()) for n in ("r.json", "clean.json"))
    assert cache_free(got) == clean


def test_a_read_only_cache_still_serves_its_entries(tmp_path, monkeypatch, _isolated_cache):
    f = tmp_path / "t.json.gz"
    shutil.copy(real_traces() / TRACE, f)
    clean = report([f])
    _read_only(monkeypatch, _isolated_cache)
    monkeypatch.setattr(kineto_parser, "parse", lambda *a, **k: pytest.fail("parsed again instead of using the cache"))
    try:
        assert report([f]) == clean  # no warning either: nothing needed writing
    finally:
        _isolated_cache.chmod(0o755)


# -- temporary files of killed runs --------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_removes_only_the_caches_own_stale_temp_files(tmp_path):
    root = tmp_path / "cache"
    (root / "stat").mkdir(parents=True)
    key = "ab" * 20 + "-kineto-1.7"
    dead, live = _dead_pid(), os.getpid()
    now = time.time()
    files = {  # name: (age in seconds, removed?)
        f".{key}.v2.parquet.{dead}.k3j_x9a1.tmp": (cache.DEAD_TEMP_S + 5, True),  # its run is gone
        f".{key}.v2.meta.json.{dead}.abcdefgh.tmp": (cache.DEAD_TEMP_S + 5, True),
        f"stat/.{'cd' * 16}.{dead}.zz11zz11.tmp": (cache.DEAD_TEMP_S + 5, True),
        f".{key}.v2.parquet.{dead}.fresh000.tmp": (1, False),  # too fresh: maybe another machine's live write
        f".{key}.v2.parquet.{live}.writing0.tmp": (cache.DEAD_TEMP_S + 5, False),  # a live write
        f".{key}.v2.parquet.{live}.old00000.tmp": (cache.STALE_TEMP_S + 5, True),  # live pid, untouched for long
        f".{key}.parquet.oldstyle.tmp": (cache.STALE_TEMP_S + 5, True),  # named before the pid was in it
        f".{key}.parquet.oldfresh.tmp": (cache.DEAD_TEMP_S + 5, False),
        f".notes.txt.{dead}.abcdefgh.tmp": (cache.STALE_TEMP_S + 5, False),  # not a cache file's: the user's
        "my.json.tmp": (cache.STALE_TEMP_S + 5, False),
        f"{key}.v2.parquet": (cache.STALE_TEMP_S + 5, False),  # an entry, not a temporary file
    }
    for name, (age, _) in files.items():
        p = root / name
        p.write_bytes(b"x")
        os.utime(p, (now - age, now - age))
    link = root / f".{key}.v2.parquet.{dead}.linklink.tmp"  # not a regular file: left alone
    link.symlink_to(root / f"{key}.v2.parquet")
    os.utime(link, (now - 10**5, now - 10**5), follow_symlinks=False)
    removed = {p.relative_to(root).as_posix() for p in cache.sweep(root, now=now)}
    assert removed == {n for n, (_, gone) in files.items() if gone}
    assert link.is_symlink()
    assert cache.sweep(tmp_path / "no such dir") == [] and cache.sweep(root / f"{key}.v2.parquet") == []


def test_a_killed_runs_temp_file_is_removed_by_the_next_run(tmp_path, _isolated_cache):
    """A real kill: a process dies (SIGKILL) while writing an entry; the next load removes
    what it left (once it is past the grace for another machine's writes)."""
    dest = _isolated_cache / ("ef" * 20 + "-kineto-1.7.v2.parquet")
    code = (
        "import sys, time\n"
        "from tracelens.store.atomic import write_with\n"
        "def slow(tmp):\n"
        "    open(tmp, 'wb').write(b'PAR1 half')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(600)\n"
        f"write_with({str(dest)!r}, slow)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    (left,) = [q for q in _isolated_cache.iterdir() if q.name.endswith(".tmp")]
    assert temp_owner(left.name) == (dest.name, p.pid) and not dest.exists()
    old = time.time() - cache.DEAD_TEMP_S - 5
    os.utime(left, (old, old))
    f = tmp_path / "t.json.gz"
    shutil.copy(real_traces() / TRACE, f)
    load([f])
    assert not left.exists() and not dest.exists()
    assert not list(_isolated_cache.rglob("*.tmp"))


def test_temp_names_carry_the_writers_pid(tmp_path):
    seen = []
    write_with(tmp_path / "x.bin", lambda tmp: (seen.append(Path(tmp).name), Path(tmp).write_bytes(b"1")))
    assert temp_owner(seen[0]) == ("x.bin", os.getpid())
    assert (tmp_path / "x.bin").read_bytes() == b"1" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_parallel_workers_say_it_once_too(tmp_path, monkeypatch, capsys, _isolated_cache):
    """--jobs 2: each worker meets the unusable cache (a file), the job's warnings say it once;
    a corrupt entry found by a worker is a warning naming its file."""
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    for name, src in (("rank-0.json.gz", TRACE), ("rank-1.json.gz", OTHER)):
        shutil.copy(real_traces() / src, jobdir / name)
    clean = report([jobdir], use_cache=False)
    assert cache_free(report([jobdir], jobs=2)) == clean  # cached by the workers
    _flip(entry(_isolated_cache, jobdir / "rank-1.json.gz")[0], 100)
    got = report([jobdir], jobs=2)
    assert kinds(got["warnings"]) == ["corrupt"] and any(str(jobdir / "rank-1.json.gz") in w for w in got["warnings"])
    assert cache_free(got) == clean
    d = tmp_path / "file"
    d.write_text("not a directory")
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(d))
    got = report([jobdir], jobs=2)
    assert kinds(got["warnings"]) == ["off"] and cache_free(got) == clean
