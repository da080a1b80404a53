"""``tracelens report TRACES --nccl PATH``: NCCL's own records joined to a profiled (Kineto / nsys)
job's report.

- nccl-tests tables and Inspector records -> the **achievable busbw** of each collective kind and
  size: per (collective, nranks) the best busbw measured at each size; a size between two measured
  sizes is interpolated linearly in log size, one outside them takes the nearest measured size
  (``achievable_note`` says which).  Each ``communication.by_group`` item gets
  ``achievable_busbw_gbps`` and ``busbw_efficiency`` (its median busbw over it), at the group's
  mean bytes per call; a measured busbw above 1.1 x the achievable is a counted warning (a clock,
  a size or a table from another machine is wrong: never a fact).
- logs / profiler plugin traces -> ``nccl_algo``, ``nccl_proto``, ``nccl_channels`` of a group's
  collective, from the NCCL communicator that matches it: on the job's ranks, of the group's size,
  the one communicator there that ran that collective (the plugin's rows give algorithm, protocol
  and channels per call; a log's tuning lines per op, its channel lines per process).  A
  communicator on ranks the job does not hold, or several candidates, joins nothing (a warning).
- logs / Flight Recorder dumps -> ``job.nccl_diagnosis``, the hang / mismatch verdict.
``job.nccl`` is the standalone report's NCCL section (inputs, communicators, bandwidth table).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

TOLERANCE = 1.1  # measured busbw above achievable x this is flagged


def merge(d: dict[str, Any], paths: list[str] | tuple[str, ...], table: pl.DataFrame | None = None) -> dict[str, Any]:
    """``d`` (a job's report dict) with the NCCL records under ``paths`` joined (a new dict).
    ``table``: the job's collective table (``collectives.TABLE_SCHEMA``), for the sequence check of
    a matched communicator (without it the join is by rank, size and collective only, said)."""
    from tracelens.analysis.job.hang import diagnose
    from tracelens.analysis.nccl import nccl_section
    from tracelens.model.nccl import NCCL_ROW_SCHEMA
    from tracelens.store.nccl import nccl_only, read_all

    d = {**d, "job": dict(d["job"]), "communication": dict(d["communication"]), "warnings": list(d["warnings"])}
    warnings: list[str] = []
    found = nccl_only(list(paths))
    if found is None:
        d["warnings"].append(f"--nccl {', '.join(map(str, paths))}: no NCCL records there (nothing joined)")
        return d
    parses, bad = read_all(found[0])
    warnings.extend(found[1] + bad)
    for p in parses:
        warnings.extend(f"{p.path}: {w}" for w in p.warnings)
    d["job"]["nccl"] = nccl_section(parses)
    job_ranks = {r.get("rank") for r in d.get("ranks", []) if r.get("rank") is not None}
    rows = pl.concat([p.rows for p in parses], how="diagonal_relaxed") if parses else pl.DataFrame(schema=NCCL_ROW_SCHEMA)
    outside = sorted(set(rows["rank"].drop_nulls().unique().to_list()) - job_ranks) if rows.height else []
    if outside:
        n = int(rows["rank"].is_in(outside).sum())
        warnings.append(f"{n} NCCL record(s) of rank(s) {outside[:8]} that the job does not hold (not joined)")
    hangs = rows.filter(pl.col("source").is_in(["nccl_log", "flight_recorder"]))
    if hangs.height:
        diag = diagnose(hangs)
        warnings.extend(diag.pop("warnings", []))
        d["job"]["nccl_diagnosis"] = diag
    ref = _reference(parses)
    groups = _sizes(d)
    items = []
    for g in d["communication"].get("by_group", []):
        g = dict(g)
        size = groups.get((g["group"], g["collective"]))
        per_call = g["bytes"] / g["count"] if g.get("bytes") and g.get("count") else None
        if ref.height and g["collective"] and per_call:
            got = achievable(ref, g["collective"], size, per_call)
            if got is not None:
                value, note = got
                g["achievable_busbw_gbps"] = value
                g["achievable_note"] = note
                m = g.get("busbw_gbps_median")
                g["busbw_efficiency"] = m / value if m is not None and value > 0 else None
                if m is not None and m > value * TOLERANCE:
                    warnings.append(f"group {g['group']} {g['collective']}: measured busbw {m:.4g} GB/s is above the achievable "
                                    f"{value:.4g} GB/s x {TOLERANCE} ({note}): a clock, a size or a reference from another "
                                    "machine is wrong; not a fact")
        algo = _algo(rows, parses, g, size, job_ranks, warnings) if rows.height else None
        if algo:
            ok, note = _aligned(table, rows, g["group"], algo["nccl_communicator"], job_ranks)
            algo["nccl_sequence"] = note
            if not ok:
                warnings.append(f"group {g['group']} {g['collective']}: NCCL communicator {algo['nccl_communicator']}: {note}; not joined")
                algo = None
        if algo:
            g.update(algo)
        items.append(g)
    d["communication"]["by_group"] = items
    d["warnings"].extend(warnings)
    return d


def _sizes(d: dict[str, Any]) -> dict[tuple, int | None]:
    """(group, collective) -> its group size, from the slowest collectives' ``group_size``."""
    out: dict[tuple, int | None] = {}
    for s in d["communication"].get("slowest", []):
        if s.get("group_size"):
            out.setdefault((s["group"], s["collective"]), s["group_size"])
    return out


def _reference(parses: list) -> pl.DataFrame:
    """Per (collective, nranks, bytes) the best busbw any nccl-tests / Inspector row measured."""
    frames = [p.bandwidth for p in parses if p.bandwidth.height]
    if not frames:
        return pl.DataFrame(schema={"collective": pl.String, "nranks": pl.Int32, "bytes": pl.Int64, "busbw_gbps": pl.Float64})
    return (pl.concat(frames).filter(pl.col("collective").is_not_null() & (pl.col("bytes") > 0) & pl.col("busbw_gbps").is_not_null())
            .group_by("collective", "nranks", "bytes").agg(pl.col("busbw_gbps").max()).sort("collective", "nranks", "bytes"))


def achievable(ref: pl.DataFrame, collective: str, nranks: int | None, size: float) -> tuple[float, str] | None:
    """The achievable busbw of ``collective`` over ``nranks`` ranks at ``size`` bytes, and how it was
    found; None without a measurement of that collective (and that rank count, where both are known)."""
    mine = ref.filter(pl.col("collective") == collective)
    if nranks is not None and mine.height:
        same = mine.filter(pl.col("nranks") == nranks)
        mine = same if same.height else mine.filter(pl.col("nranks").is_null())
    if not mine.height:
        return None
    sizes = mine["bytes"].to_list()
    bws = mine["busbw_gbps"].to_list()
    who = f"{collective}, {mine['nranks'][0]} ranks" if mine["nranks"][0] is not None else f"{collective}, ranks unknown"
    if size <= sizes[0] or size >= sizes[-1]:
        i = 0 if size <= sizes[0] else len(sizes) - 1
        exact = sizes[i] == size
        return bws[i], (f"measured at {sizes[i]} B ({who})" if exact else f"nearest measured size {sizes[i]} B ({who})")
    for i in range(1, len(sizes)):  # a bounded table: its sizes
        if sizes[i] >= size:
            if sizes[i] == size:
                return bws[i], f"measured at {sizes[i]} B ({who})"
            t = (math.log(size) - math.log(sizes[i - 1])) / (math.log(sizes[i]) - math.log(sizes[i - 1]))
            return bws[i - 1] + t * (bws[i] - bws[i - 1]), f"interpolated in log size between {sizes[i - 1]} and {sizes[i]} B ({who})"
    return None


def _algo(rows: pl.DataFrame, parses: list, g: dict, size: int | None, job_ranks: set, warnings: list[str]) -> dict | None:
    """Algorithm, protocol and channels of the group's collective from the one NCCL communicator
    that matches it (on the job's ranks, of its size, running that collective)."""
    mine = rows.filter(pl.col("collective") == g["collective"], pl.col("rank").is_in(list(job_ranks)))
    if size is not None:
        mine = mine.filter(pl.col("group_size").is_null() | (pl.col("group_size") == size))
    if not mine.height:
        return None
    comms = mine["group"].unique().to_list()
    if len(comms) > 1:
        warnings.append(f"group {g['group']} {g['collective']}: {len(comms)} NCCL communicators could be it "
                        f"({', '.join(map(str, comms[:4]))}); algorithm / protocol not joined")
        return None
    out: dict[str, Any] = {"nccl_communicator": comms[0]}
    for col, key in (("algo", "nccl_algo"), ("proto", "nccl_proto"), ("channels", "nccl_channels")):
        if col in mine.columns and mine[col].drop_nulls().len():
            out[key] = mine[col].drop_nulls().mode().sort()[0]
    files = set(mine["file"].unique().to_list())
    for p in parses:
        if p.format != "nccl_log" or not p.rows.height or p.rows["file"][0] not in files:
            continue
        op = g["collective"].lower()
        tune = [t for t in p.facts.get("tuning") or [] if str(t["op"]).lower() == op]
        if tune and "nccl_algo" not in out:
            out["nccl_algo"] = "/".join(sorted({t["algo"] for t in tune}))
            out["nccl_proto"] = "/".join(sorted({t["proto"] for t in tune}))
        ch = p.facts.get("coll_channels") or p.facts.get("channels")
        if ch and "nccl_channels" not in out:
            out["nccl_channels"] = int(ch)
    return out


def _aligned(table: pl.DataFrame | None, rows: pl.DataFrame, group: str | None, comm: str, ranks: set) -> tuple[bool, str]:
    """Does the job's sequence of collectives in ``group`` occur, on each rank both hold, in the
    communicator's own sequence (NCCL's opCount / SeqNum order)?  (ok, what was found)."""
    if table is None or not table.height:
        return True, "not checked (no collective table): joined by rank, group size and collective"
    job = table.filter(pl.col("group").is_null() if group is None else (pl.col("group") == group))
    theirs = rows.filter(pl.col("group") == comm)
    codes: dict[str, str] = {}

    def word(frame: pl.DataFrame, by: str) -> str:  # one character per collective, in order (a string op, no per-row Python)
        names = frame.sort(by)["collective"].fill_null("?").to_list()
        for n in set(names):
            codes.setdefault(n, chr(0x4E00 + len(codes)))
        return "".join(codes[n] for n in names)

    found = []
    for r in sorted(ranks):  # the job's ranks: a bounded loop
        # the job's in start order on the rank's own clock (its seq may be derived per collective type),
        # NCCL's by its own sequence number
        a = job.filter(pl.col("rank") == r)
        b = theirs.filter(pl.col("rank") == r).unique(["seq", "collective"])
        if not a.height or not b.height:
            continue
        wa, wb = word(a, "start_ns"), word(b, "seq")
        at = wb.find(wa)
        if at < 0:
            return False, f"rank {r}'s {len(wa)} collective(s) do not occur in that order among its {len(wb)} NCCL records"
        found.append((r, at, wb.count(wa)))
    if not found:
        return True, "no rank with records on both sides: joined by rank, group size and collective"
    unique = all(n == 1 for _, _, n in found)
    return True, (f"the job's sequence found in the NCCL records on {len(found)} rank(s)"
                  + ("" if unique else " (at several places: a repeated pattern, the offset is not known)"))


def paths_of(values: Any) -> tuple[str, ...]:
    return tuple(str(Path(v)) for v in values or ())
