"""HTA 0.5.0's own numbers on the shared traces, for the cross-check tests.

Run with HTA's interpreter (its pins clash with ours, so it lives in its own venv):

    python3 -m venv benchmarks/.hta-venv
    benchmarks/.hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0
    benchmarks/.hta-venv/bin/python benchmarks/hta_reference.py > tests/data/hta_reference.json

For every single-rank Kineto trace under tests/data/traces/{hta,amd-tracelens} it records
``TraceAnalysis.get_temporal_breakdown`` (idle, compute, non-compute and kernel time, µs) and
``get_comm_comp_overlap`` (the share of communication time under computation).  Files HTA
cannot load are recorded with the error it gave.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

logging.disable(logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "tests" / "data" / "traces"  # the real traces the tests use


def main() -> int:
    import hta
    from hta.trace_analysis import TraceAnalysis

    out = {"hta_version": getattr(hta, "__version__", "0.5.0"), "traces": {}}
    files = sorted(p for d in ("hta", "amd-tracelens") for p in (SHARED / d).rglob("*.json*"))
    for path in files:
        rel = str(path.relative_to(SHARED))
        d = tempfile.mkdtemp()
        os.symlink(path, os.path.join(d, path.name))
        try:
            ta = TraceAnalysis(trace_dir=d)
            tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
            ov = ta.get_comm_comp_overlap(visualize=False).iloc[0]
            out["traces"][rel] = {
                "idle_us": float(tb["idle_time(us)"]),
                "compute_us": float(tb["compute_time(us)"]),
                "non_compute_us": float(tb["non_compute_time(us)"]),
                "kernel_time_us": float(tb["kernel_time(us)"]),
                "comm_comp_overlap_pctg": None if ov["comp_comm_overlap_pctg"] != ov["comp_comm_overlap_pctg"] else float(ov["comp_comm_overlap_pctg"]),
            }
        except Exception as e:  # noqa: BLE001 - recorded, not hidden
            out["traces"][rel] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(rel, out["traces"][rel], file=sys.stderr)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
