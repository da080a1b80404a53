"""``tracelens demo``: the bundled sample job, the way a user first meets the tool.

The sample is two ranks of a real 128-rank recommender training job on A100s (HTA's test
data, see ``sample_traces/job_2ranks/SOURCES.md``), with the GPU named in the job's
``tracelens.toml``.  With a terminal it opens the UI; without one it prints the text report
and writes the HTML page of the same analysis, saying where.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tracelens.model.errors import EXIT_OK, TraceInputError
from tracelens.model.printable import printable

JOB = "job_2ranks"


def sample_job() -> Path:
    """The bundled job: inside the installed package, or in the checkout's sample_traces/."""
    here = Path(__file__).resolve().parent
    for base in (here / "sample_traces", here.parent / "sample_traces"):
        if (base / JOB).is_dir():
            return base / JOB
    raise TraceInputError(str(here / "sample_traces" / JOB), "the bundled sample job is missing from this installation")


def _shown(p: Path) -> str:
    """A path as the user would type it: relative to the working directory when below it."""
    try:
        rel = os.path.relpath(p)
    except ValueError:  # another drive
        return str(p)
    return str(p) if rel.startswith("..") else rel


def option_values(job: str) -> dict:
    """The analysis options of the sample job as plain values: its tracelens.toml (the GPU), marked as given there."""
    from tracelens.store import jobconfig

    values, given = jobconfig.resolve([job], {})
    return {**values, "given": given}


def options(job: str):
    """The analysis options of the sample job (``tracelens.analysis.Options``)."""
    from tracelens.model.options import Options

    return Options(**option_values(job))


def run(html_out: str, tui: bool) -> int:
    job = _shown(sample_job())
    if tui:
        from tracelens.model.errors import EXIT_BAD_INPUT
        from tracelens.tui import make_app

        app = make_app([job], options=options(job))
        app.run()
        if app.error:
            print(f"tracelens: error: {printable(app.error)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return EXIT_OK
    from tracelens.model.errors import UsageError
    from tracelens.render import render
    from tracelens.store.atomic import check_output, overwritten_input, write_output
    from tracelens.store.reports import cached_report

    same = overwritten_input(html_out, ((f"the bundled sample file {_shown(f)}", f) for f in sample_job().rglob("*")))
    if same:
        raise UsageError(f"-o {html_out} is one of the inputs ({same}): write the page to another file")
    check_output(html_out)  # before the analysis and the text report: nothing printed for a page that cannot be saved
    values = option_values(job)

    def analyse() -> tuple[dict, bool]:
        from tracelens.analysis import analyze
        from tracelens.model.options import Options
        from tracelens.store.job import load

        trace = load([job])
        return analyze(trace, Options(**values)).to_dict(), not trace.cache_warnings

    d, _ = cached_report([job], analyse, options=values)  # a second demo is one file read
    sys.stdout.buffer.write(render(d, "text"))
    write_output(html_out, render(d, "html"))
    for w in d["warnings"]:
        print(f"tracelens: warning: {printable(w)}", file=sys.stderr)
    print(f"\nThe same report as one HTML page: {os.path.abspath(html_out)} (open it in a browser; it works offline)")
    print(f"This was `tracelens report {job}`; with a terminal, `tracelens {job}` opens the terminal UI.")
    return EXIT_OK
