"""Which rank each file of a job is: distributedInfo (an nsys export: its process's recorded
environment), else an explicit file-name pattern, else the file order (with a warning).  A file
that holds several ranks (an nsys export of several GPU processes or devices) is one item per
rank, in the file's order; its name gives none of their ranks."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from tracelens.model.schema import TraceMeta

# A rank is read from a file name only from an explicit pattern: "rank-3", "rank3", "rank_3"
# (not "local_rank_3", "ranks_8", "frank2"), or "<name>_3" where <name> is what profilers and
# their users call a trace file ("trace_3.json", "kineto_trace_3.json", "worker_3.<ms>.pt.trace.json");
# "resnet50_num_workers_4.json" is not rank 4, and torch's "<host>_<pid>.<ms>.pt.trace.json" and
# Kineto's "libkineto_activities_<pid>.json" hold a process id.
_RANK_IN_NAME = re.compile(r"(?<![a-z])(?<!local_)(?<!local-)rank[-_]?(\d+)(?!\d)", re.IGNORECASE)
_PROFILER_STEM_N = re.compile(
    r"(?:(?:pytorch|torch|kineto|chrome|gpu|pt|profiler)[-_])?(?:trace|traces|profile|profiler|prof|kineto|worker)[-_](\d{1,5})",
    re.IGNORECASE,
)
# torch's ".<ms>.pt.trace.json"; an nsys export's ".sqlite"
_STEM_SUFFIXES = re.compile(r"(?:(?:\.\d+)?(?:\.pt\.trace)?\.json(?:\.gz)?|\.sqlite)$", re.IGNORECASE)
# where a file's own rank would have been: a Kineto trace's distributedInfo, an nsys export's recorded environment
_NSYS_NO_RANK = "the export records no RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or LOCAL_RANK in its process's environment"


def _nowhere(m: TraceMeta) -> str:
    return _NSYS_NO_RANK if m.format == "nsys" else "no rank in distributedInfo"


def _part(m: TraceMeta) -> dict | None:
    """Which rank of its file a meta is, when the file holds several (an nsys export of several
    GPU processes or devices: ``attributes["nsys_part"]``); None for a file that is one rank."""
    part = m.attributes.get("nsys_part")
    return part if isinstance(part, dict) and (part.get("of") or 0) > 1 else None


def _name_rank(path: Path) -> tuple[int, bool] | None:
    """(rank, whether an explicit "rank" pattern said it) from the file name, or None."""
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), True
    m = _PROFILER_STEM_N.fullmatch(_STEM_SUFFIXES.sub("", path.name))
    return (int(m.group(1)), False) if m else None


def rank_from_name(path: Path, pids: Iterable[int] = ()) -> int | None:
    """The rank a file name states, or None.  ``pids``: the host process ids of the file's events;
    a "<name>_N" number that is one of them is the process id (dynolog and on-demand Kineto
    traces append it), not a rank."""
    got = _name_rank(path)
    if got is None or (not got[1] and got[0] in set(pids)):
        return None
    return got[0]


def _assign_ranks(files: list[Path], metas: list[TraceMeta], warnings: list[str],
                  pids: Callable[[int], Iterable[int]] | None = None) -> None:
    """distributedInfo.rank, else the file name, else the file order; duplicates are kept.
    ``pids(i)``: the host process ids of file i's events (read only where a name's number may be one)."""
    pid_named: dict[int, int] = {}  # file -> the number in its name that is its process id
    for i, (f, m) in enumerate(zip(files, metas)):
        if m.rank is None and _part(m) is None:  # a file of several ranks: its name says none of theirs
            got = _name_rank(f)
            if got is not None and not got[1] and pids is not None:
                if got[0] in set(pids(i)):
                    pid_named[i] = got[0]
                    got = None
            if got is not None:
                m.rank, m.rank_source = got[0], "filename"
                if m.format != "nsys" or len(metas) > 1:  # one export alone: its rank matters to nothing
                    m.warnings.append(f"{_nowhere(m)}; rank {got[0]} taken from the file name")
    taken = {m.rank for m in metas if m.rank is not None}
    nxt = 0
    for i, m in enumerate(metas):
        if m.rank is None:
            while nxt in taken:
                nxt += 1
            m.rank, m.rank_source = nxt, "order"
            taken.add(nxt)
            why = f" ({pid_named[i]} in the name is the process id of its events, not a rank)" if i in pid_named else ""
            part = _part(m)
            if part is not None:
                m.warnings.append(
                    f"the export records no RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or LOCAL_RANK of process "
                    f"pid {part.get('pid')} (one of its {part.get('of')} GPU processes and devices, ordered by pid then "
                    f"device); rank {nxt} given by that order")
            elif len(metas) > 1 or (m.world_size or 1) > 1:  # one file of a one-rank job is rank 0: nothing to warn about
                m.warnings.append(f"{_nowhere(m)} or the file name{why}; rank {nxt} given by file order")

def _shared_ranks(metas: list[TraceMeta], warnings: list[str]) -> None:
    """A warning for each rank that more than one file claims."""
    by_rank: dict[int, list[str]] = {}
    for m in metas:
        by_rank.setdefault(m.rank, []).append(m.path)
    for r, paths in sorted(by_rank.items()):
        if len(paths) > 1:
            warnings.append(
                f"rank {r} is claimed by {len(paths)} files ({', '.join(paths)}); all are kept and told apart by their file index"
            )
