from __future__ import annotations

import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the real traces the suite runs on live in the repository (tests/data/traces/SOURCES.md)
TRACES = ROOT / "tests" / "data" / "traces"
SAMPLE_TRACES = ROOT / "sample_traces"


def real_traces() -> Path:
    """The folder of real traces; a checkout without it is broken, not a reason to skip."""
    assert (TRACES / "SOURCES.md").is_file(), f"{TRACES} is missing: the real test traces belong to the repository"
    return TRACES


def real_trace_files(*folders: str) -> list[Path]:
    """Every .json / .json.gz file under the given folders of the real traces; each folder must hold some."""
    out = []
    for folder in folders:
        found = sorted(p for p in (real_traces() / folder).rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
        assert found, f"no real traces under {TRACES / folder}"
        out.extend(found)
    return out


@functools.lru_cache(maxsize=None)
def modes_bind() -> bool:
    """Whether the mode bits stop this process (not for root, unless it runs without
    CAP_DAC_OVERRIDE): the tests of unreadable files chmod where they do, and where they do
    not, refuse the same calls (open, scandir, stat) with PermissionError themselves."""
    import os
    import tempfile

    if os.geteuid() != 0:
        return True
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "probe"
        f.write_bytes(b"x")
        f.chmod(0)
        try:
            open(f, "rb").close()
        except PermissionError:
            return True
        return False


def holds_trace_events(path: Path) -> bool:
    """Independently of the parser: does the file's JSON carry trace events (objects with "ph")?"""
    import gzip

    import orjson

    raw = path.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return isinstance(events, list) and any(isinstance(e, dict) and "ph" in e for e in events)


# Fixtures that record a real multi-process run (gloo ranks, a hang's timeout) on this machine, and
# the modules that record timed runs inline: their tests compare recorded times (a late rank, a
# predicted step time, a bubble), so `make test` runs them alone, before the rest of the suite runs
# on both cores (pytest-xdist); no other test's load reaches their clocks.
RECORDING_FIXTURES = {"ddp_traces", "ddp_fr", "pipeline_traces", "zb_pipeline_traces", "zb_orders", "dumps", "slowed_job", "ddp_job"}
RECORDING_MODULES = {"test_replay", "test_torch_recorded"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if RECORDING_FIXTURES & set(getattr(item, "fixturenames", ())) or item.module.__name__.rsplit(".", 1)[-1] in RECORDING_MODULES:
            item.add_marker(pytest.mark.recording)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own parse cache, so no test sees another's entries."""
    d = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def ddp_traces(tmp_path_factory) -> list[Path]:
    """Two real rank traces recorded here with torch's profiler (gloo DDP on the CPU); the Flight
    Recorder of the same run beside them (``ddp_fr``: under half a second more)."""
    from tests.torch_recorder import record_ddp

    root = tmp_path_factory.mktemp("ddp")
    return record_ddp(root / "traces", world=2, steps=3, fr_dir=root / "fr")


@pytest.fixture(scope="session")
def ddp_fr(ddp_traces) -> Path:
    """The folder of the ``ddp_traces`` run's Flight Recorder dumps (rank_0, rank_1: JSON)."""
    out = ddp_traces[0].parent.parent / "fr"
    assert sorted(p.name for p in out.iterdir()) == ["rank_0", "rank_1"]
    return out


@pytest.fixture(scope="session")
def pipeline_traces(tmp_path_factory) -> dict[str, list[Path]]:
    """Real pipeline-parallel runs recorded here on the CPU (torch.distributed.pipelining over gloo,
    2 ranks, 4 micro-batches): schedule name -> the rank traces.  About 10 s each."""
    from tests.pipe_recorder import SCHEDULES, record_pipeline

    root = tmp_path_factory.mktemp("pipeline")
    return {s: record_pipeline(root / s, s, world=2, microbatches=4) for s in SCHEDULES}


@pytest.fixture(scope="session")
def zb_pipeline_traces(tmp_path_factory) -> dict[str, list[Path]]:
    """Real zero-bubble pipeline runs recorded here on the CPU (tests/pipe_recorder.py ZB_SCHEDULES:
    ScheduleInterleavedZeroBubble looped, ScheduleZBVZeroBubble and ScheduleDualPipeV V-shaped; 2
    ranks, 2 stages each, 4 micro-batches): schedule name -> the rank traces.  About 7 s each."""
    from tests.pipe_recorder import ZB_SCHEDULES, record_pipeline

    root = tmp_path_factory.mktemp("zb_pipeline")
    return {s: record_pipeline(root / s, s, world=2, microbatches=4) for s in ZB_SCHEDULES}


@pytest.fixture(scope="session")
def zb_orders(tmp_path_factory) -> dict[str, dict]:
    """torch's own action orders of the zero-bubble schedules at 2 ranks (2 stages each), m = 2 to
    8, built in gloo processes but not run (tests/pipe_recorder.py ``schedule_orders``)."""
    from tests.pipe_recorder import ZB_SCHEDULES, schedule_orders

    return schedule_orders(tmp_path_factory.mktemp("zb_orders") / "orders.json", list(ZB_SCHEDULES), 2, [2, 3, 4, 6, 8])


@pytest.fixture(scope="session")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """Real Flight Recorder dumps recorded here (torch on gloo, tests/fr_recorder.py): scenario ->
    the folder of its rank_N dumps (ok, hang, mismatch, size; json: the hang dumped as JSON).
    Recorded once per session: test_flight_recorder and the NCCL views read the same."""
    from tests.fr_recorder import record_fr

    root = tmp_path_factory.mktemp("fr")
    out = {name: record_fr(root / name, scenario, world)
           for name, scenario, world in [("ok", "ok", 2), ("hang", "hang", 2), ("mismatch", "mismatch", 3), ("size", "size", 3)]}
    out["json"] = record_fr(root / "json", "hang", 2, as_json=True)
    return out
