"""The critical path against HTA's own on the same input: ``hta/critical_path/end_to_end/simple_add``
ships HTA's expected overlay (``output/overlaid_critical_path_trace.json.gz``: every event on HTA's
critical path has ``args.critical``).  Read here in plain Python, independently of tracelens.

What HTA puts on its path there, and what ours must agree with:
- all 16 device copies (39,080 µs) and 1 of the 3 memsets (2 µs): ours has 39,082 µs of ``memcpy``
  (copies and fills are one category) — the same events;
- 5 of the 79 kernels (506 µs): ours has 510 µs of ``compute_*`` (gemm 501, elementwise 5, conv 4;
  HTA's event durations are whole µs, ours the trace's ns, and the two paths may take a different
  one of two kernels that end together: within 1%);
- the rest is host work (602 of HTA's 624 events are CPU ops and runtime calls): ours is host-bound
  too, over 99% of the path in ``cpu``, ``launch_overhead`` and ``sync``.
HTA's event sums cannot be compared with the path's length itself: its CPU ops nest, so their
durations add up to far more than the step (137 s of cpu_op marked critical in a 16 s trace)."""

from __future__ import annotations

import gzip
import json

from tests.conftest import real_traces
from tracelens import cli
from tracelens.model.errors import EXIT_OK

CASE = real_traces() / "hta/critical_path/end_to_end/simple_add"


def _hta_critical_us() -> dict[str, int]:
    with gzip.open(CASE / "output/overlaid_critical_path_trace.json.gz") as fh:
        events = json.load(fh)["traceEvents"]
    out: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "X" and (e.get("args") or {}).get("critical"):
            out[e["cat"]] = out.get(e["cat"], 0) + e["dur"]
    return out


def test_the_critical_path_agrees_with_htas_on_simple_add(tmp_path):
    out = tmp_path / "r.json"
    rc = cli.main(["report", "--no-cache", "--critical-path", str(CASE / "input/trace.json.gz"), "-o", str(out)])
    assert rc == EXIT_OK
    (rank,) = json.loads(out.read_text())["ranks"]
    path = rank["critical_path"]
    cats = path["by_category_ns"]
    hta = _hta_critical_us()
    assert hta["gpu_memcpy"] == 39_080 and hta["gpu_memset"] == 2 and hta["kernel"] == 506  # the expected file
    assert abs(cats.get("memcpy", 0) - (hta["gpu_memcpy"] + hta["gpu_memset"]) * 1000) <= 17 * 1000  # 17 events, 1 µs each
    compute = sum(v for k, v in cats.items() if k.startswith("compute_"))
    assert abs(compute - hta["kernel"] * 1000) <= 0.01 * hta["kernel"] * 1000
    host = cats.get("cpu", 0) + cats.get("launch_overhead", 0) + cats.get("sync", 0)
    assert host >= 0.99 * path["length_ns"] and sum(cats.values()) == path["length_ns"]
