"""The terminal UI (Textual).  Only ``tracelens open`` imports this package; the headless
modules never do (tested)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def make_app(paths: Sequence[str] | None = None, *, options: Any = None, use_cache: bool = True, jobs: int | None = None,
             report: dict[str, Any] | None = None, trace: Any = None, strict: bool = False, error: str | None = None,
             job_load: Any = None):
    """The app, either loading ``paths`` itself (in a worker, with progress) or showing a ready
    ``report`` (``Analysis.to_dict()`` or a saved JSON report) and, for the timeline, the
    ``trace`` it came from, or only ``error`` (a saved report that cannot be shown: the app says
    why); ``strict``: load() errs on unreadable files in a job directory.  The CLI and the
    tests both build the app here.  ``job_load``: a ``tracelens.tui.loading.JobLoad`` of ``paths``
    already running (``tracelens open`` starts it before Textual is imported)."""
    from tracelens.tui.app import TracelensApp

    return TracelensApp(paths=list(paths or []), options=options, use_cache=use_cache, jobs=jobs, report=report, trace=trace,
                        strict=strict, error=error, job_load=job_load)
