"""Make the README's screenshots (Textual's own SVG export) from the bundled samples.

    python docs/screenshots/make.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).resolve().parent


async def shoot(job: str, keys: list[tuple[str, str]]) -> None:
    import os

    from tracelens import demo
    from tracelens.tui import make_app

    os.chdir(ROOT)
    app = make_app([job], options=demo.options(job))  # the job's tracelens.toml, as `tracelens JOB` reads it
    app.animation_level = "none"
    async with app.run_test(size=(130, 42)) as pilot:
        await app.workers.wait_for_complete()
        for key, name in keys:
            if key:
                await pilot.press(*key.split())
            for _ in range(3):
                await pilot.pause()
            if name:
                app.save_screenshot(f"{name}.svg", str(OUT))


def main() -> None:
    asyncio.run(shoot("sample_traces/h100_bert_small", [("", "overview_h100")]))
    asyncio.run(shoot("sample_traces/job_2ranks", [("", "overview_2ranks"), ("2", None), ("enter enter", "timeline_2ranks"),
                                                   ("6", "suggestions_2ranks")]))


if __name__ == "__main__":
    main()
