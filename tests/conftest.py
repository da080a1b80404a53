from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
SAMPLE_TRACES = ROOT / "sample_traces"


def shared_traces() -> Path:
    """The real traces beside the checkout (CI has them too: a missing folder fails in CI)."""
    if not SHARED_TRACES.is_dir():
        if os.environ.get("CI"):
            raise RuntimeError(f"{SHARED_TRACES} is missing")
        pytest.skip("../shared/traces is not beside this checkout")
    return SHARED_TRACES


def real_trace_files(*folders: str) -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    out = []
    for folder in folders:
        out.extend(sorted(p for p in (SHARED_TRACES / folder).rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))))
    return out


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own parse cache, so no test sees another's entries."""
    d = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def ddp_traces(tmp_path_factory) -> list[Path]:
    """Two real rank traces recorded here with torch's profiler (gloo DDP on the CPU)."""
    from tests.torch_recorder import record_ddp

    return record_ddp(tmp_path_factory.mktemp("ddp"), world=2, steps=3)
