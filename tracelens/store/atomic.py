"""Write files so that a reader never sees half of one: a temporary name beside the
destination, then a rename.

The temporary name is ``.<destination name>.<pid>.<random>.tmp``: a run killed mid-write
leaves such a file behind, and ``temp_owner`` reads back whose it was (the cache sweeps its
own, tracelens.store.cache.sweep)."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

# ".<dest>.<pid>.<random>.tmp"; before the pid was in it, ".<dest>.<random>.tmp"
_TEMP_NAME = re.compile(r"\.(?P<dest>.+?)(?:\.(?P<pid>\d+))?\.[A-Za-z0-9_]+\.tmp")


def write_with(dest: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` and rename the result onto ``dest``; on failure remove it."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600: give it a normal file's mode
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_bytes(dest: str | Path, data: bytes) -> None:
    write_with(dest, lambda tmp: Path(tmp).write_bytes(data))


def temp_owner(name: str) -> tuple[str, int | None] | None:
    """(the destination's name, the writer's process id or None when the name predates it)
    when ``name`` is one of write_with's temporary files, else None."""
    m = _TEMP_NAME.fullmatch(name)
    if m is None:
        return None
    return m.group("dest"), int(m.group("pid")) if m.group("pid") else None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output(dest: str | Path) -> None:
    """OutputError unless ``dest`` can be written: not a directory, in an existing directory that
    this process may write.  Checked before the work that makes the output, so a report that
    cannot be saved fails at once, not after the analysis."""
    from tracelens.model.errors import OutputError

    dest = Path(dest)
    parent = dest.parent
    if dest.is_dir():
        raise OutputError(str(dest), "is a directory (give a file name, e.g. report.html)")
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise OutputError(str(dest), f"cannot write: the directory {parent} {why}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(str(dest), f"cannot write: the directory {parent} is not writable")
    if dest.exists() and not os.access(dest, os.W_OK):
        raise OutputError(str(dest), "cannot write: the file is read-only")


def overwritten_input(dest: str | Path, inputs: Iterable[tuple[str, str | Path]]) -> str | None:
    """Which of ``inputs`` ((what it is, its path)) the output file ``dest`` is, by device and
    inode (so through links and other spellings of the path); None when it is none of them (a
    ``dest`` that does not exist yet is none).  ``inputs`` is consumed only when ``dest``
    exists, and no further than the first match."""
    try:
        st = os.stat(dest)
    except OSError:
        return None
    for what, p in inputs:
        try:
            other = os.stat(p)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return what
    return None


def write_output(dest: str | Path, data: bytes) -> None:
    """Write a user's output file whole or not at all: OutputError (naming ``dest`` and the
    problem: a read-only place, a directory, a missing directory, a full disk) on failure, with
    neither a partial file nor a temporary one left behind."""
    from tracelens.model.errors import OutputError

    check_output(dest)
    try:
        write_bytes(dest, data)
    except OSError as e:
        raise OutputError(str(dest), f"cannot write: {output_problem(e)}; nothing was written") from None


def output_problem(e: OSError) -> str:
    """What a failed write of a user's output says: the problem in words (a full disk, a
    read-only place, ...), the system's text for the rest."""
    import errno

    problems = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "permission denied", errno.EISDIR: "is a directory",
                errno.ENOENT: "its directory does not exist", errno.ENOTDIR: "a part of its path is not a directory"}
    return problems.get(e.errno or 0) or e.strerror or str(e)
