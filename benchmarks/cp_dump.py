"""Dump what the critical path and the what-if replay put in the report, for every real trace and
the sample jobs, to compare two versions of the code byte for byte.

    python benchmarks/cp_dump.py OUT.json [EXTRA_INPUT ...]

Per input (each real trace file under tests/data/traces on its own, the folders of several ranks
as jobs, the sample_traces jobs, and any EXTRA_INPUT given: a file or a folder), it runs
``tracelens report INPUT -o r.json --critical-path --no-cache`` in this process and keeps
``ranks[].critical_path``, ``job.critical_path`` and every suggestion's ``what_if`` (with the
suggestion's rule), the sha256 of ``tracelens export-trace INPUT``'s events, sorted (the path's
segments overlaid), or the exit code where the report fails.  Compare two dumps with ``cmp``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACES = ROOT / "tests" / "data" / "traces"
JOBS = ["sample_traces/job_2ranks", "sample_traces/h100_bert_small", "sample_traces/nsys_pair",
        "tests/data/traces/hta/trace_filter", "tests/data/traces/kineto-tbplugin/samples/resnet50_num_workers_0",
        "tests/data/traces/amd-tracelens/inference/sglang_decode/capture_traces", "tests/data/traces/nccl/flight_recorder"]


def inputs(extra: list[str]) -> list[str]:
    files = sorted(str(p.relative_to(ROOT)) for p in TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
    return files + JOBS + extra


def dump(inp: str) -> dict:
    from tracelens import cli

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                rc = cli.main(["report", "--no-cache", "--critical-path", str(ROOT / inp if not Path(inp).is_absolute() else inp),
                               "-o", str(out)])
            except SystemExit as e:
                rc = e.code
        if not out.exists():
            return {"rc": rc}
        r = json.loads(out.read_text())
        # the Perfetto export overlays the path's segments (step_paths with_segments) and the what-if tracks
        tr = Path(d) / "t.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                trc = cli.main(["export-trace", "--no-cache", str(ROOT / inp if not Path(inp).is_absolute() else inp), "-o", str(tr)])
            except SystemExit as e:
                trc = e.code
        # (its events in sorted order: the export's event order varies from run to run on main)
        trace = hashlib.sha256("\n".join(sorted(json.dumps(e, sort_keys=True) for e in json.loads(tr.read_text())["traceEvents"]))
                               .encode()).hexdigest() if tr.exists() else None
    return {"rc": rc, "export": [trc, trace],
            "ranks": [x.get("critical_path") for x in r.get("ranks", [])],
            "job": (r.get("job") or {}).get("critical_path"),
            "what_if": [[s.get("rule"), s.get("what_if")] for s in r.get("suggestions", [])]}


def main() -> None:
    out, extra = sys.argv[1], sys.argv[2:]
    got = {}
    for inp in inputs(extra):
        got[inp] = dump(inp)
        g = got[inp]
        print(f"{inp}: rc {g['rc']}, ranks with a path {sum(1 for x in g.get('ranks', []) if x)}, "
              f"what_if {sum(1 for _, w in g.get('what_if', []) if w)}", file=sys.stderr)
    Path(out).write_text(json.dumps(got, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
