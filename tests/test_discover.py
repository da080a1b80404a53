"""Files and directories (issue 14, item 6): symlinked subdirectories are followed once (no
loop, no file twice); what cannot be read inside a job directory is a warning naming it, or
with --strict an error; a path that cannot be reached is a one-line error, exit 3; the nsys
export is opened read-only through an escaped SQLite URI and never creates a file.

Run as root the mode bits stop nothing, so there the tests refuse the same calls the kernel
would (open, scandir, stat raising PermissionError) and still assert."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import modes_bind, real_traces
from tracelens.cli import main
from tracelens.model.errors import TraceInputError, UnreadableError
from tracelens.store.discover import discover
from tracelens.store.job import load

TRACES = ("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz", "hta/trace_file_list/inference_rank_1.json.gz")

SIMULATE = not modes_bind()  # chmod stops nothing here: refuse the calls instead


def _trace(path: Path, which: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(real_traces() / TRACES[which], path)
    return path


def _denied(p: object) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))


def _under(p: object, top: Path, strictly: bool = False) -> bool:
    try:
        a = Path(os.path.abspath(os.fsdecode(p)))
    except TypeError:  # a file descriptor
        return False
    return (a != top or not strictly) and (a == top or top in a.parents)


def deny_read(monkeypatch, target: Path) -> None:
    """``target`` (a file or a directory) cannot be read."""
    if not SIMULATE:
        target.chmod(0)
        return
    real_open, real_scandir = builtins.open, os.scandir

    def fake_open(file, *a, **k):
        if not isinstance(file, int) and _under(file, target) and target.is_file():
            raise _denied(file)
        return real_open(file, *a, **k)

    def fake_scandir(path="."):
        if _under(path, target) and not target.is_file():
            raise _denied(path)
        return real_scandir(path)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "scandir", fake_scandir)


def deny_search(monkeypatch, target: Path) -> None:
    """Nothing inside the directory ``target`` can be reached (its x bit is off)."""
    if not SIMULATE:
        target.chmod(0o600)
        return
    real_stat, real_open = os.stat, builtins.open

    def fake_stat(path, *a, **k):
        if _under(path, target, strictly=True):
            raise _denied(path)
        return real_stat(path, *a, **k)

    def fake_open(file, *a, **k):
        if not isinstance(file, int) and _under(file, target, strictly=True):
            raise _denied(file)
        return real_open(file, *a, **k)

    monkeypatch.setattr(os, "stat", fake_stat)
    monkeypatch.setattr(builtins, "open", fake_open)


_scandir, _chmod = os.scandir, os.chmod  # the real ones, whatever a test patched


@pytest.fixture
def restore_modes(tmp_path):
    """Give back the modes a test took away (top down, so that every directory can be entered)."""
    yield
    stack = [tmp_path]
    while stack:
        d = stack.pop()
        _chmod(d, 0o755)
        with _scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif not e.is_symlink():
                    _chmod(e.path, 0o644)


def names(files, top: Path) -> list[str]:
    return [os.path.relpath(f, top) for f in files]


# -- symlinks --------------------------------------------------------------------------------

def _linked_subdir(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    _trace(tmp / "elsewhere/rank-1.json.gz", 1)
    (tmp / "job/more").symlink_to(tmp / "elsewhere", target_is_directory=True)
    return ["more/rank-1.json.gz", "rank-0.json.gz"], []


def _link_to_itself_parent(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    _trace(tmp / "job/sub/rank-1.json.gz", 1)
    (tmp / "job/sub/up").symlink_to(tmp / "job", target_is_directory=True)
    (tmp / "job/loop").symlink_to(tmp / "job", target_is_directory=True)
    return ["rank-0.json.gz", "sub/rank-1.json.gz"], ["sub/up", "loop"]


def _link_above_the_job(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    _trace(tmp / "another_job/rank-0.json.gz", 1)  # must not be pulled in
    (tmp / "job/parent").symlink_to(tmp, target_is_directory=True)
    return ["rank-0.json.gz"], ["parent"]


def _two_links_one_dir(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    _trace(tmp / "shared/rank-1.json.gz", 1)
    (tmp / "job/a").symlink_to(tmp / "shared", target_is_directory=True)
    (tmp / "job/b").symlink_to(tmp / "shared", target_is_directory=True)
    return ["a/rank-1.json.gz", "rank-0.json.gz"], []


def _link_to_a_sibling(tmp):
    _trace(tmp / "job/r0/rank-0.json.gz")
    _trace(tmp / "job/r1/rank-1.json.gz", 1)
    (tmp / "job/alias").symlink_to(tmp / "job/r1", target_is_directory=True)
    return ["r0/rank-0.json.gz", "r1/rank-1.json.gz"], []  # by the real path


def _file_links_and_hard_links(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    (tmp / "job/copy.json.gz").symlink_to(tmp / "job/rank-0.json.gz")
    os.link(tmp / "job/rank-0.json.gz", tmp / "job/hard.json.gz")
    return ["hard.json.gz"], []  # once, by a path without links


def _cross_links(tmp):
    _trace(tmp / "x/rank-0.json.gz")
    _trace(tmp / "y/rank-1.json.gz", 1)
    (tmp / "x/to_y").symlink_to(tmp / "y", target_is_directory=True)
    (tmp / "y/to_x").symlink_to(tmp / "x", target_is_directory=True)
    (tmp / "job").symlink_to(tmp / "x", target_is_directory=True)
    return ["rank-0.json.gz", "to_y/rank-1.json.gz"], []  # to_y/to_x: x again, not above it: skipped quietly


def _broken_and_looping_links(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    (tmp / "job/gone.json").symlink_to(tmp / "job/missing.json")
    (tmp / "job/self.json").symlink_to(tmp / "job/self.json")
    return ["rank-0.json.gz"], ["gone.json", "self.json"]


# name: (builds tmp/job, returning (the files loaded, relative to job; the paths the warnings name))
LINKS = {
    "symlinked_subdir_is_followed": _linked_subdir,
    "link_to_the_job_dir_itself": _link_to_itself_parent,
    "link_to_a_dir_above_the_job": _link_above_the_job,
    "two_links_to_one_dir": _two_links_one_dir,
    "link_to_a_sibling_dir": _link_to_a_sibling,
    "file_symlink_and_hard_link": _file_links_and_hard_links,
    "links_between_two_dirs": _cross_links,
    "broken_and_self_looping_links": _broken_and_looping_links,
}


@pytest.mark.parametrize("case", sorted(LINKS))
def test_links_in_a_job_directory(tmp_path, case):
    want, warned = LINKS[case](tmp_path)
    job = tmp_path / "job"
    files, _, warnings = discover([job])
    assert names(files, job) == want
    assert sorted(w.split(": ", 1)[0] for w in warnings) == sorted(str(job / w) for w in warned), warnings
    t = load([job], use_cache=False)
    assert len(t.metas) == len(want)


def test_a_file_given_twice_through_links_is_loaded_once(tmp_path):
    f = _trace(tmp_path / "a/rank-0.json.gz")
    (tmp_path / "b").symlink_to(tmp_path / "a", target_is_directory=True)
    files, _, _ = discover([f, tmp_path / "b" / "rank-0.json.gz", tmp_path / "a", tmp_path / "b"])
    assert files == [f]


# -- what cannot be read -----------------------------------------------------------------------

def _job(tmp):
    _trace(tmp / "job/rank-0.json.gz")
    _trace(tmp / "job/sub/rank-1.json.gz", 1)
    _trace(tmp / "job/rank-2.json.gz", 1)
    return tmp / "job"


# name: (what is made unreadable, how, the problem's words)
UNREADABLE = {
    "file_in_job_dir": ("rank-2.json.gz", deny_read, "cannot read file"),
    "subdir_in_job_dir": ("sub", deny_read, "cannot read this directory"),
}


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_unreadable_entry_of_a_job_directory(tmp_path, monkeypatch, capsys, restore_modes, case, strict):
    rel, deny, words = UNREADABLE[case]
    job = _job(tmp_path)
    bad = job / rel
    deny(monkeypatch, bad)
    rc = main(["info", "--json", str(job), *(["--strict"] if strict else [])])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    if strict:
        assert rc == 3 and out == "" and len(lines) == 1, err
        assert lines[0].startswith(f"tracelens: error: {bad}: {words}") and "Permission denied" in lines[0]
        return
    assert rc == 0, err
    everything = [job / "rank-0.json.gz", job / "rank-2.json.gz", job / "sub/rank-1.json.gz"]
    assert [f["path"] for f in json.loads(out)["files"]] == [str(p) for p in everything if p != bad and bad not in p.parents]
    skipped = [line for line in lines if "skipped" in line]
    assert len(skipped) == 1 and f"{bad}: skipped ({words} (Permission denied))" in skipped[0], err


@pytest.mark.parametrize("command", ["info", "report"])
def test_a_path_inside_an_untraversable_directory(tmp_path, monkeypatch, capsys, restore_modes, command):
    locked = tmp_path / "locked"
    f = _trace(locked / "rank-0.json.gz")
    inner_dir = _trace(locked / "job/rank-0.json.gz").parent
    deny_search(monkeypatch, locked)
    for p in (f, inner_dir):
        rc = main([command, str(p)])
        out, err = capsys.readouterr()
        assert rc == 3 and out == "", err
        (line,) = err.strip().splitlines()
        assert line == (f"tracelens: error: {p}: cannot reach it (Permission denied: a directory on its path cannot be searched)")


def test_an_unreadable_job_directory_given_is_an_error(tmp_path, monkeypatch, capsys, restore_modes):
    job = _job(tmp_path)
    deny_read(monkeypatch, job)
    assert main(["report", str(job)]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"tracelens: error: {job}: cannot read this directory (Permission denied)"


def test_an_unreadable_file_given_is_an_error(tmp_path, monkeypatch, capsys, restore_modes):
    f = _trace(tmp_path / "rank-0.json.gz")
    deny_read(monkeypatch, f)
    with pytest.raises(UnreadableError, match="cannot read file"):
        load([f])
    assert main(["info", str(f)]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"tracelens: error: {f}: cannot read file (Permission denied)"


def test_strict_is_an_option_of_report_info_and_open():
    from tracelens.cli import build_parser

    p = build_parser()
    for cmd in ("report", "info", "open"):
        assert p.parse_args([cmd, "x", "--strict"]).strict is True
        assert p.parse_args([cmd, "x"]).strict is False


# -- the nsys export -----------------------------------------------------------------------

NSYS = "nsys/nvfuser_test_matmul_h200_nsys2024.6.2.sqlite"
ODD_NAMES = ["a#b.sqlite", "q?mode=rwc.sqlite", "pct%41%2F.sqlite", "all #?% &=;.sqlite", "#.sqlite", "?.sqlite"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_nsys_export_with_uri_characters_in_its_name(tmp_path, monkeypatch, capsys, name):
    from tracelens.parsers.nsys import target_gpus

    want = target_gpus(real_traces() / NSYS)
    assert want and want[0]["name"] == "NVIDIA H200"
    d = tmp_path / "dir #?%"
    d.mkdir()
    f = d / name
    shutil.copy(real_traces() / NSYS, f)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert target_gpus(f) == want
    monkeypatch.chdir(d)  # a relative path too
    assert target_gpus(name) == want
    assert main(["info", "--json", name]) == 0
    assert json.loads(capsys.readouterr().out)["nsys"][0]["gpus"][0]["name"] == "NVIDIA H200"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no file made beside it


@pytest.mark.parametrize("case", ["missing", "empty", "directory", "missing_with_hash"])
def test_opening_an_nsys_path_never_creates_a_file(tmp_path, case):
    from tracelens.parsers.nsys import target_gpus

    f = tmp_path / ("a#b.sqlite" if case == "missing_with_hash" else "x.sqlite")
    if case == "empty":
        f.write_bytes(b"")
    elif case == "directory":
        f.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(TraceInputError) as ei:
        target_gpus(f)
    assert ei.value.path == str(f) and "\n" not in ei.value.problem
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "empty":
        assert f.stat().st_size == 0


def test_every_sqlite_connect_goes_through_the_uri():
    """The places that open SQLite are parsers/nsys's _connect and its ADBC reader, both with the
    escaped read-only URI (the reader is given sqlite_uri(path) by parse)."""
    from tests.conftest import ROOT

    hits = []
    for p in [*ROOT.glob("tracelens/**/*.py"), *ROOT.glob("parsers/**/*.py")]:
        for i, line in enumerate(p.read_text().splitlines()):
            if "sqlite3.connect(" in line or "sqlite.connect(" in line or "AdbcDatabase(" in line or "Db(" in line:
                hits.append((p.relative_to(ROOT).as_posix(), line.strip()))
    assert sorted(hits) == [("parsers/nsys/__init__.py", "db = read.Db(_connect(path), sqlite_uri(path))"),
                            ("parsers/nsys/__init__.py", "return sqlite3.connect(sqlite_uri(path), uri=True)"),
                            ("parsers/nsys/read.py", "self._db = adbc_driver_sqlite.connect(self.uri)")]
