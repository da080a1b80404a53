"""Time to the terminal UI's first screen: ``tracelens open TRACE`` in fresh processes, caches warm.

    python benchmarks/tui_first.py [TRACE ...] [--runs 5] [--checkout DIR] [--size 200x50]

Each run is a new Python process that goes through the CLI as a user's ``tracelens open`` does
(``tracelens.cli.main(["open", TRACE])``), with two changes made from outside the code under
test: the app runs headless (Textual's ``App.run(headless=True)``: the screen is laid out and
every visible line rendered, only the bytes to a terminal are not written), and a hook on the
app's ``_display`` (which every update of the screen goes through, rendered, headless too) ends
the run at the first update rendered once the overview's headline is laid out: that is "the
first screen painted".  The child
prints the wall time from just before the parent spawned it, the process CPU time (every
thread, interpreter start included) and the main thread's, then exits.  ``--checkout`` runs another checkout of
tracelens (the "before" of a change) against the same files; each checkout has its own cache
folder, warmed by one run that is not counted (which also writes the checkout's bytecode, as an
install has it).  Medians of ``--runs`` runs, interleaved over
the traces.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = [ROOT / "tests/data/traces/hta/trace_diff/control/control.json.gz", ROOT / "tests/data/traces/hta/trace_filter"]


def child(trace: str, t_spawn: float, size: tuple[int, int]) -> None:
    import tracelens.tui  # no Textual: the package's __init__ only names make_app
    from tracelens import cli

    make_app = tracelens.tui.make_app
    marks = {"imported_s": time.time() - t_spawn}  # the interpreter and tracelens.cli

    def hooked(*a, **kw):
        app = make_app(*a, **kw)

        def finish() -> None:
            out = {"wall_s": time.time() - t_spawn, "cpu_s": time.process_time(), "main_thread_cpu_s": time.thread_time(), **marks,
                   "polars_at_first": "polars" in sys.modules}
            sys.__stdout__.write("FIRST " + json.dumps(out) + "\n")
            sys.__stdout__.flush()
            os._exit(0)  # the load thread still reading the events for the timeline is not part of the first screen

        display = app._display  # called with every update of the screen, headless too (it then writes nothing)

        def painted(screen, renderable) -> None:
            display(screen, renderable)
            marks.setdefault("first_paint_s", time.time() - t_spawn)  # whatever it shows (a loading screen)
            head = screen.query("#headline") if renderable is not None else None
            if head and head.first().size.width:  # laid out before this update was rendered: it is on this screen
                finish()

        app._display = painted
        run = app.run
        app.run = lambda *ra, **rk: run(headless=True, size=size)
        return app

    tracelens.tui.make_app = hooked
    cli.main(["open", trace])
    sys.__stdout__.write("FIRST none\n")  # the app ended without a first screen (an error)
    sys.exit(1)


def one(checkout: Path, cache: Path, trace: Path, size: str) -> dict:
    # bytecode written and read, as an installed package has it (the warm-up run writes it)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPATH": str(checkout),
           "TRACELENS_CACHE_DIR": str(cache)}
    t = time.time()
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(trace), "--t-spawn", repr(t), "--size", size],
                       cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("FIRST ")), "FIRST none")
    if line == "FIRST none":
        raise SystemExit(f"{checkout}: no first screen for {trace} (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(line.removeprefix("FIRST "))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path, default=DEFAULTS)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--checkout", type=Path, action="append", help="a tracelens checkout to time (repeatable; default: this one)")
    ap.add_argument("--size", default="200x50")
    ap.add_argument("--json", type=Path, help="write the medians and every run here")
    ap.add_argument("--child")
    ap.add_argument("--t-spawn", type=float)
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    if args.child:
        child(args.child, args.t_spawn, (w, h))
        return 1
    checkouts = [c.resolve() for c in args.checkout or [ROOT]]
    traces = [t.resolve() for t in args.traces]
    results: dict[tuple[Path, Path], list[dict]] = {(c, t): [] for c in checkouts for t in traces}
    with tempfile.TemporaryDirectory(prefix="tracelens-tui-first-") as tmp:
        caches = {c: Path(tmp) / f"cache{i}" for i, c in enumerate(checkouts)}
        for c in checkouts:
            for t in traces:
                one(c, caches[c], t, args.size)  # warms the parse cache (and the report cache where there is one)
        for _ in range(args.runs):
            for t in traces:
                for c in checkouts:
                    results[c, t].append(one(c, caches[c], t, args.size))
    rows = []
    for (c, t), rs in results.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        cpu = statistics.median(r["cpu_s"] for r in rs)
        main = statistics.median(r["main_thread_cpu_s"] for r in rs)
        print(f"{c.name:>10}  {t.name:<22} first screen: wall {wall:.2f} s, CPU {cpu:.2f} s (main thread {main:.2f} s) "
              f"(median of {len(rs)}; wall {min(r['wall_s'] for r in rs):.2f}-{max(r['wall_s'] for r in rs):.2f})")
        if args.json:
            rows.append({"checkout": str(c), "trace": str(t), "wall_s": wall, "cpu_s": cpu, "main_thread_cpu_s": main, "runs": rs})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
