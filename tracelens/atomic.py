"""Write files so that a reader never sees half of one: a temporary name beside the
destination, then a rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_with(dest: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` and rename the result onto ``dest``; on failure remove it."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
