"""The rank_late what-if on a real pair (issue 17 Must 4): a gloo DDP job recorded on the CPU with
rank 1 slowed by a sleep before its backward pass, and the same job not slowed; the job's stitched
critical path of the slowed run replayed with rank 1's lateness removed (``critical.rank_late``)
against the unslowed run's measured job step.

    python benchmarks/rank_late_pair.py [--tries 3] [--steps 8]

Prints per try the statistic (median of each run's 3 fastest kept steps), the prediction, the
measurement, and each run's own host work on rank 0 (what the two runs should share)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLEEP_S = 0.1
FASTEST = 3


def _fastest(xs: list[int]) -> float:
    return sorted(xs)[:FASTEST][FASTEST // 2] if len(xs) >= FASTEST else float("nan")


def _run(files):
    from tracelens.analysis import Options, analyze
    from tracelens.store.job import load

    a = analyze(load(files, use_cache=False, jobs=1), Options(critical_path=True))
    d = a.to_dict()
    cp = d["job"]["critical_path"]
    kept = {k for k, st in enumerate(cp["steps"]) if st["kept"]}
    r0 = next(r for r in d["ranks"] if r["rank"] == 0)["critical_path"]
    work = _fastest([s["by_category_ns"].get("cpu", 0) for i, s in enumerate(r0["steps"]) if i in kept])
    return a, cp, work


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    from tests.torch_recorder import record_ddp
    from tracelens.analysis.rank import critical

    with tempfile.TemporaryDirectory() as tmp:
        for t in range(args.tries):
            slow = record_ddp(Path(tmp) / f"slow{t}", world=2, steps=args.steps, slow_rank=1, sleep_s=SLEEP_S, width=1024, batch=256)
            fast = record_ddp(Path(tmp) / f"fast{t}", world=2, steps=args.steps, width=1024, batch=256)
            a, _, w_slow = _run(slow)
            _, cq, w_fast = _run(fast)
            ranks = list(a.ranks)
            got = critical.rank_late([r.critical_path for r in ranks], a.table(), [(r.file, r.rank) for r in ranks], {1})
            pred = _fastest([got["steps"][k] for k in got["kept"]])
            meas = _fastest([s["length_ns"] for s in cq["steps"] if s["kept"]])
            print(f"try {t}: predicted {pred / 1e6:.2f} ms, measured {meas / 1e6:.2f} ms ({100 * (pred - meas) / meas:+.1f}%); "
                  f"rank 0's own host work {w_slow / 1e6:.2f} ms slowed vs {w_fast / 1e6:.2f} ms unslowed", flush=True)


if __name__ == "__main__":
    main()
