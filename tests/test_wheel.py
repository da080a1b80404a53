"""The distribution as a new user gets it: build the wheel, install it into a fresh virtual
environment with no repository on the path, and run the commands the README gives.

The fresh environment sees the runtime dependencies (polars, orjson, textual, ...) of the test
environment through a ``.pth`` line, which adds that folder to ``sys.path`` without running
the ``.pth`` files inside it, so the checkout's editable install stays out of sight."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
                   check=True, capture_output=True)
    (whl,) = out.glob("*.whl")
    return whl


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, wheel) -> Path:
    """A new venv with only the wheel installed (and the test env's dependencies visible)."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_deps_of_the_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True)
    return env_dir


def _run(env_dir: Path, *cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_claims_one_top_level_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"tracelens", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, top
    assert wheel.name.startswith("tracelens_mfu-")  # "tracelens" on PyPI is another project
    for needed in ("tracelens/parsers/__init__.py", "tracelens/parsers/kineto/__init__.py", "tracelens/model/report.schema.json",
                   "tracelens/tui/app.tcss", "tracelens/render/html/page.css", "tracelens/render/html/page.js",
                   "tracelens/sample_traces/job_2ranks/rank-0.json.gz",
                   "tracelens/sample_traces/job_2ranks/tracelens.toml", "tracelens/sample_traces/job_2ranks/SOURCES.md"):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "Name: tracelens-mfu" in meta.splitlines()


def test_the_installed_package_runs_without_the_repository(fresh, tmp_path):
    py, exe = str(fresh / "bin" / "python"), str(fresh / "bin" / "tracelens")
    r = _run(fresh, py, "-c", "import tracelens, tracelens.parsers.kineto as k, importlib.util as u; "
             "print(tracelens.__file__); print(k.__file__); print(u.find_spec('parsers'))", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    pkg, parser, top = r.stdout.split()
    assert pkg.startswith(str(fresh)) and parser.startswith(str(fresh)), r.stdout  # not the checkout
    assert top == "None"  # no top-level `parsers` was installed
    r = _run(fresh, exe, "--help", cwd=tmp_path)
    assert r.returncode == 0 and "demo" in r.stdout and "report" in r.stdout
    sample = Path(_run(fresh, py, "-c", "from tracelens.demo import sample_job; print(sample_job())", cwd=tmp_path).stdout.strip())
    assert sample.is_relative_to(fresh), sample
    r = _run(fresh, exe, "report", str(sample), "-o", str(tmp_path / "r.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import orjson

    d = orjson.loads((tmp_path / "r.json").read_bytes())
    assert d["job"]["ranks"] == 2 and d["job"]["mfu"] is not None
    assert d["ranks"][0]["mfu"]["gpu_source"].endswith("tracelens.toml")
    # the demo without a terminal: the text report, and the HTML page beside it, saying where
    r = _run(fresh, exe, "demo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tracelens ") and "MFU loss waterfall" in r.stdout
    html = tmp_path / "tracelens-demo.html"
    assert html.is_file() and str(html) in r.stdout
    page = html.read_text()  # its style sheet and script: the package data files of tracelens.render.html, inlined
    assert "<style>\n:root {" in page and "<script>\n(function () {" in page
