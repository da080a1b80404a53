"""The layer contract (.importlinter, DESIGN.md 8) holds on this tree, and it fails the build
when a layer imports one above it, also through the ``tracelens.parsers`` alias."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is a test dependency (pip install -e '.[test]')")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    for d in ("tracelens", "parsers", "tests"):
        shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("__pycache__", "snapshots", "golden", "data"))
    shutil.copy(ROOT / ".importlinter", dst / ".importlinter")
    return dst


def test_the_tree_keeps_the_contract():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 kept, 0 broken" in r.stdout


@pytest.mark.parametrize(("module", "line", "named"), [
    # the model may import nothing above it: a renderer is two layers up
    ("tracelens/model/units.py", "from tracelens.render import tables", "tracelens.model is not allowed to import tracelens.render"),
    # the import of a parser under its package name is seen (grimp alone drops it: tests/layers.py)
    ("tracelens/model/gpus.py", "from tracelens.parsers import kineto", "tracelens.model is not allowed to import parsers"),
    # a parser may import only the model
    ("parsers/jsonstream.py", "from tracelens.store import cache", "parsers is not allowed to import tracelens.store"),
    # an import inside a function counts as well
    ("tracelens/store/cache.py", "def _late():\n    from tracelens.analysis import report", "tracelens.store is not allowed to import tracelens.analysis"),
])
def test_an_upward_import_breaks_the_contract(tmp_path, module, line, named):
    repo = _copy(tmp_path)
    f = repo / module
    f.write_text(f.read_text() + "\n\n" + line + "\n")
    r = _lint(repo)
    assert r.returncode != 0
    assert "1 broken" in r.stdout
    assert named in r.stdout, r.stdout


def test_code_imports_the_parsers_as_the_wheel_installs_them():
    """The wheel installs parsers/ as ``tracelens.parsers`` (pyproject's sources map; a checkout maps
    the name onto the folder): an ``import parsers`` works in a checkout and fails once installed
    (test_wheel found one), so no module of the package may use the top-level name."""
    import re

    root = Path(__file__).resolve().parent.parent
    bad = [f"{p.relative_to(root)}:{i}" for folder in ("tracelens", "parsers") for p in sorted((root / folder).rglob("*.py"))
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if re.match(r"\s*(from\s+parsers(\.|\s)|import\s+parsers\b)", line)]
    assert bad == [], bad
