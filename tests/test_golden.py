"""Golden reports: the text and the JSON report of the bundled sample job and of two real
traces, byte for byte.  Any change of a number is a visible diff in ``tests/golden/`` that the
commit explains; ``TRACELENS_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` rewrites them.

The runs go through the CLI from the repository root with relative paths, so the reports name
the files the same way on every machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"
CASES = {
    # the demo job: two ranks, A100 given in its tracelens.toml, FLOPs from shapes
    "sample_job_2ranks": ["sample_traces/job_2ranks"],
    # 2021 schema (Operator/Kernel/Runtime), V100, ResNet-50 training, DataLoader-bound
    "resnet50_v100_2021": ["tests/data/traces/kineto-tbplugin/samples/resnet50_num_workers_0"],
    # B200, rank 0 of 8, AllGather with full collective args, FLOPs from shapes
    "b200_eager": ["tests/data/traces/amd-tracelens/b200/eager_trace.json.gz"],
    # the same ResNet-50 with --critical-path: the path's categories and top events pinned (off by default)
    "resnet50_v100_2021_critical_path": ["tests/data/traces/kineto-tbplugin/samples/resnet50_num_workers_0", "--critical-path"],
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_golden_report(name, fmt, tmp_path):
    out = tmp_path / f"{name}.{fmt}"
    r = subprocess.run([sys.executable, "-m", "tracelens", "report", *CASES[name], "--no-cache", "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = out.read_bytes()
    path = GOLDEN / f"{name}.{fmt}"
    if os.environ.get("TRACELENS_UPDATE_GOLDEN"):
        path.write_bytes(got)
    assert path.exists(), f"{path} is missing: run with TRACELENS_UPDATE_GOLDEN=1 and commit it"
    if got != path.read_bytes():
        import difflib

        diff = "".join(difflib.unified_diff(path.read_text().splitlines(True), got.decode().splitlines(True),
                                            f"golden/{path.name}", "now", n=1))
        pytest.fail(f"the {fmt} report of {name} changed (TRACELENS_UPDATE_GOLDEN=1 rewrites it):\n{diff[:6000]}")
