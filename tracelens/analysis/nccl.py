"""The report of a job of NCCL's own records only (NCCL logs, Flight Recorder dumps): the report
dict v1 of a job without profiled ranks, its ``job.nccl_diagnosis`` (``job.hang.diagnose``) and
``job.nccl`` (per input its format and facts; the communicators; the collectives per group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from tracelens.model.nccl import NCCL_ROW_SCHEMA, watchdog_text

MAX_COMMS = 200
MAX_BANDWIDTH = 2000


def bandwidth_items(parses: list) -> list[dict[str, Any]]:
    """``job.nccl.bandwidth``: every input's measured bandwidths (``BANDWIDTH_SCHEMA`` keys), the
    first ``MAX_BANDWIDTH``."""
    from tracelens.model.nccl import BANDWIDTH_SCHEMA

    frames = [p.bandwidth for p in parses if p.bandwidth.height]
    if not frames:
        return []
    return pl.concat(frames).head(MAX_BANDWIDTH).select(list(BANDWIDTH_SCHEMA)).to_dicts()


def analyze_nccl(found: list[tuple[Path, str]], warnings: list[str], strict: bool = False) -> dict[str, Any]:
    """The report of NCCL files alone; a file that cannot be read is a warning (raised with
    ``strict``), and raised when no file can be (``store.nccl.read_all``)."""
    from tracelens.analysis.job.hang import diagnose, diagnose_watchdog, expected_members, split_shared_names
    from tracelens.analysis.job.rollup import finish_job
    from tracelens.analysis.report import Analysis
    from tracelens.store.nccl import read_all

    parses, bad = read_all(found, strict=strict, need_one=True)
    parses = split_shared_names(parses)
    warnings = list(warnings) + bad
    inputs = []
    for p in parses:
        ranks = p.rows["rank"].drop_nulls().unique()
        size = Path(p.path).stat().st_size if Path(p.path).exists() else None
        inputs.append({"path": p.path, "format": p.format, "rank": int(ranks[0]) if ranks.len() == 1 else None, "size_bytes": size})
        warnings.extend(f"{p.path}: {w}" for w in p.warnings)
    rows = pl.concat([p.rows for p in parses], how="diagonal_relaxed") if parses else pl.DataFrame(schema=NCCL_ROW_SCHEMA)
    diag = diagnose(rows, [str(f) for f, _ in found], expected_members(parses))
    warnings.extend(diag.pop("warnings", []))
    # PyTorch's watchdog, where the logs hold its timeout messages: which collective each rank timed out on
    diag["watchdog"] = [{"path": p.path, **w} for p in parses for w in p.facts.get("watchdog") or []][:64]
    if diag["watchdog"] and diag["verdict"] in ("no_collectives", "ok"):
        # (collective lines that agree are enqueues only: a timeout says the job hung all the same)
        agreed = diag["summary"] if diag["verdict"] == "ok" else None
        if diag["verdict"] == "no_collectives":
            diag["summary"] = "no collective records; " + "; ".join(watchdog_text(w) for w in diag["watchdog"][:4])
        sizes = [p.comms["nranks"].max() for p in parses if p.comms["nranks"].drop_nulls().len()]
        said = diagnose_watchdog([w for p in parses for w in p.facts.get("watchdog") or []],
                                 sorted({r for p in parses for r in p.facts.get("ranks_named") or []}), max(sizes) if sizes else None)
        if said:
            diag.update(said)
            if agreed:
                diag["reason"] = said["reason"] = said["reason"] + f" (the logs' collective lines are {agreed})"
            diag["summary"] = {"hang": "HANG", "incomplete": "STUCK"}[said["verdict"]] + ": " + said["reason"]
    measured = sum(p.bandwidth.height for p in parses)
    if diag["verdict"] == "no_collectives" and not diag["watchdog"] and measured:
        # nccl-tests tables / Inspector records alone: bandwidths, no per-call sequence to align
        diag["summary"] = (f"nothing to align: these inputs hold {measured} bandwidth measurement(s) (nccl-tests, Inspector), "
                           "no per-call records of a job (logs with COLL lines, Flight Recorder dumps)")
    a = finish_job(Analysis(inputs=tuple(inputs), ranks=(), warnings=tuple(warnings)))
    d = a.to_dict()
    d["job"]["nccl_diagnosis"] = diag
    d["job"]["nccl"] = nccl_section(parses, rows)
    return d


def nccl_section(parses: list, rows: pl.DataFrame | None = None) -> dict[str, Any]:
    """``job.nccl``: per input its format and facts; the communicators; the collectives per group;
    the measured bandwidths (nccl-tests, Inspector)."""
    if rows is None:
        rows = pl.concat([p.rows for p in parses], how="diagonal_relaxed") if parses else pl.DataFrame(schema=NCCL_ROW_SCHEMA)
    comms = pl.concat([p.comms for p in parses]) if parses else None
    by_group = (rows.group_by("group", "collective").agg(
        pl.col("group_desc").drop_nulls().first(), pl.len().alias("records"), pl.col("member").n_unique().alias("members"),
        pl.col("seq").min().alias("first_seq"), pl.col("seq").max().alias("last_seq"), pl.col("bytes").sum().alias("bytes"))
        .sort("group", "collective").to_dicts())
    return {
        "inputs": [{"path": p.path, "format": p.format, "records": p.rows.height, "facts": p.facts} for p in parses],
        "communicators": comms.head(MAX_COMMS).to_dicts() if comms is not None else [],
        "communicators_total": comms.height if comms is not None else 0,
        "collectives": by_group,
        "bandwidth": bandwidth_items(parses),
        "bandwidth_total": sum(p.bandwidth.height for p in parses),
    }
