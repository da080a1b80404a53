"""The load of a job for the terminal UI, in a thread that starts before Textual is imported.

``tracelens open`` starts a ``JobLoad`` first and imports Textual while it runs: the report comes
from the report cache (``tracelens.store.reports``: one file read, no polars) or from the parse
cache and the analysis, whichever applies.  The app shows the report as soon as it is ready;
only then, once the first screen is drawn (``go_on``), does the thread read the event table
(polars) that the timeline and a re-analysis need, so that work never competes with the first
screen for the interpreter.  This module imports no Textual.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any


class JobLoad:
    """Loads ``paths`` in a thread: ``report_ready`` is set with ``report`` (or ``error``);
    ``done`` once ``trace`` and ``timeline`` are there too (or ``error``).  Progress goes to
    ``sink(text, done, total)`` once one is attached (``attach``); the latest is kept until then."""

    def __init__(self, paths: Sequence[str], *, options: Any = None, use_cache: bool = True, jobs: int | None = None,
                 strict: bool = False):
        self.paths, self.options, self.use_cache, self.jobs, self.strict = list(paths), options, use_cache, jobs, strict
        self.report: dict[str, Any] | None = None
        self.from_cache = False
        self.trace: Any = None
        self.timeline: Any = None
        self.error: BaseException | None = None
        self.report_ready = threading.Event()
        self.go_on = threading.Event()  # set by the app once its first screen is drawn
        self.done = threading.Event()
        self._sink: Callable[[str, int | None, int | None], None] | None = None
        self._last: tuple[str, int | None, int | None] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tracelens-load", daemon=True)

    def start(self) -> JobLoad:
        self._thread.start()
        return self

    def attach(self, sink: Callable[[str, int | None, int | None], None]) -> None:
        with self._lock:
            self._sink = sink
            last = self._last
        if last is not None:
            sink(*last)

    def _progress(self, text: str, done: int | None, total: int | None) -> None:
        with self._lock:
            self._last = (text, done, total)
            sink = self._sink
        if sink is not None:
            sink(text, done, total)

    def _load_trace(self, progress: Callable | None = None, bytes_progress: Callable | None = None, after_parse=None) -> Any:
        from tracelens.store.job import load

        return load(self.paths, use_cache=self.use_cache, jobs=self.jobs, progress=progress, bytes_progress=bytes_progress,
                    strict=self.strict, prefer=getattr(self.options, "prefer", None), after_parse=after_parse)

    def _run(self) -> None:
        try:
            self._run_load()
        except BaseException as e:  # noqa: BLE001 - the app shows it
            self.error = e
        finally:
            self.report_ready.set()
            self.done.set()

    def _run_load(self) -> None:
        from tracelens.model.options import Options
        from tracelens.store.reports import cached_report

        options = self.options or Options()
        t0 = time.perf_counter()
        nbytes = 0
        files = [0, 0]  # parsed, total
        last = [0.0]

        def progress(done: int, total: int, meta) -> None:
            nonlocal nbytes
            nbytes += meta.uncompressed_bytes or meta.size_bytes or 0
            files[:] = [done, total]

        def bytes_progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] < 0.1 and done < total:
                return  # ten updates a second are plenty
            last[0] = now
            dt = max(now - t0, 1e-6)
            parsed = f"{files[0]}/{files[1]} files parsed · {nbytes / 1e6:,.1f} MB of JSON · " if files[1] else ""
            self._progress(f"{parsed}{done / 1e6:,.1f} of {total / 1e6:,.1f} MB on disk read · {done / 1e6 / dt:,.1f} MB/s",
                           done, total)

        def analyse() -> tuple[dict[str, Any], bool]:
            from tracelens.analysis import analyze, summarize_on_parse

            # files parsed now are summarised as they are parsed (in the workers, for a job of several)
            trace = self._load_trace(progress, bytes_progress, summarize_on_parse(options))
            self._progress(f"analyzing {trace.n_events:,} events…", None, None)
            self.trace = trace
            return analyze(trace, options).to_dict(), not trace.cache_warnings

        from tracelens.store.nccl import nccl_only

        nccl = nccl_only(self.paths)
        if nccl is not None:  # NCCL logs / Flight Recorder dumps alone: their report, no events (no timeline)
            from tracelens.analysis.nccl import analyze_nccl

            self._progress("reading the NCCL records…", None, None)
            self.report = analyze_nccl(*nccl, strict=self.strict)
            return
        self._progress("reading…", None, None)
        self.report, self.from_cache = cached_report(self.paths, analyse, options=asdict(options), strict=self.strict,
                                                     use_cache=self.use_cache)
        self.report_ready.set()
        self.go_on.wait(timeout=5)  # the first screen first (a stuck app does not keep the timeline from loading)
        if self.trace is None:  # served from the report cache: the events are still to read (the parse cache's)
            self.trace = self._load_trace()
        from tracelens.analysis.timeline import JobTimeline

        self.timeline = JobTimeline(self.trace)
