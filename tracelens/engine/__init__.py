"""Where per-rank tasks run (DESIGN.md 8): in this process, or in a pool of worker processes;
Ray later, behind the same protocol.

An engine maps a picklable function over items and yields ``(index, result)`` as each task
completes, in completion order; a task that raised yields ``(index, exception)`` instead, so
that the caller decides what one bad rank costs (the others go on).  Closing the iterator early
(or an exception in the caller's loop) cancels the tasks not yet started.

``choose(jobs, work_bytes, tasks)`` picks one as the loader always has: worker processes cost
about 0.3 s each to start (they import polars), so a pool runs only when the user asked for
several jobs, or, by default, when the bytes of work exceed ``PARALLEL_MIN_BYTES``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

PARALLEL_MIN_BYTES = 8 << 20  # on disk (gzip): about 100 MB of JSON


class Engine(Protocol):
    """Runs ``fn`` over ``items``; yields (index, result or the exception it raised) as they complete."""

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R | Exception]]: ...


class LocalEngine:
    """In this process, one task after the other, in order."""

    workers = 1

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R | Exception]]:
        for i, item in enumerate(items):
            try:
                res: Any = fn(item)
            except Exception as e:  # noqa: BLE001 - handed to the caller, which knows what it costs
                res = e
            yield i, res


class ProcessEngine:
    """A pool of ``workers`` processes (spawn: no fork of a process that runs polars' threads).
    ``fn`` and the items must be picklable; so are the results, which come back by pickle (keep
    them small: metadata and summaries, not event tables)."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R | Exception]]:
        from concurrent.futures import ProcessPoolExecutor, as_completed  # only here: ~3 ms to import
        from multiprocessing import get_context

        work = list(items)
        if not work:
            return
        with ProcessPoolExecutor(max_workers=min(self.workers, len(work)), mp_context=get_context("spawn")) as pool:
            futs = {pool.submit(fn, w): i for i, w in enumerate(work)}
            try:
                for fut in as_completed(futs):
                    try:
                        res: Any = fut.result()
                    except Exception as e:  # noqa: BLE001 - handed to the caller
                        res = e
                    yield futs[fut], res
            finally:  # the caller stopped early or failed: tasks not started never run
                for f in futs:
                    f.cancel()


def choose(jobs: int | None, work_bytes: int, tasks: int) -> LocalEngine | ProcessEngine:
    """The engine for ``tasks`` tasks over ``work_bytes`` bytes: ``jobs`` processes when given
    (1: this process), else one per core when the work is worth the start-up of the workers."""
    if tasks <= 1:
        return LocalEngine()
    if jobs is None:
        jobs = min(tasks, os.cpu_count() or 1) if work_bytes > PARALLEL_MIN_BYTES else 1
    return LocalEngine() if jobs <= 1 else ProcessEngine(min(jobs, tasks))
