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

Call by call (``table``, the job's collective rows): each of the job's calls of a process group on a
rank is paired with one NCCL record, at most.

- Flight Recorder rows (their process group is the job's: same name) pair by (rank, process group,
  sequence number) where the job's sequence numbers are the trace's (Kineto's ``Seq`` is the
  recorder's ``collective_seq_id``); where the job's are derived (its order per collective type, as
  CPU/gloo traces have no ``Seq``), by position, as below, in the recorder's order (``record_id``).
- log / profiler-plugin rows (``seq`` is NCCL's opCount / SeqNum in its communicator) pair by
  position: on each rank the job's calls of the group in start order are a run of the
  communicator's records in their sequence order, found at one offset k (the job's first call is
  the communicator's record k, from 0); the job's i-th call pairs with record k + i.  A run found at
  several offsets (a repeated pattern) pairs nothing, said; one found nowhere joins nothing (a
  warning, as before pairing).
- per ``communication.by_group`` item: ``nccl_paired_calls`` / ``fr_paired_calls``, the job's rank-calls
  (a call on 2 ranks is 2) of that collective paired with a communicator's / the recorder's record;
  ``nccl_pairing`` / ``fr_pairing`` how ("by process group and sequence number", "by position in the
  communicator's sequence at offset k") or why not; ``nccl_mismatched_calls`` / ``fr_mismatched_calls``
  the paired ones whose collective or byte size differs between the two sides (each a counted
  warning, never a silent join; sizes compare the NCCL side's input and output bytes, and an
  all-gather's or reduce-scatter's bytes x group size, with the job's).  With the plugin's per-call values, ``nccl_algo`` / ``nccl_proto`` /
  ``nccl_channels`` are the mode over the paired calls only.  Flight Recorder: ``fr_states`` (state ->
  paired calls) and ``fr_dur_ns_median``, the median over paired calls of enqueue to the watchdog's
  seeing it complete (the recorder's own two times; null where it never saw one complete, e.g. gloo).
- per ``communication.slowest[].ranks[]`` item: its paired record's ``nccl_seq`` (opCount / SeqNum),
  ``nccl_algo``, ``nccl_proto``, ``nccl_channels`` (the plugin's per call) and ``fr_seq``,
  ``fr_state``, where paired.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from tracelens.model.collectives import P2P

TOLERANCE = 1.1  # measured busbw above achievable x this is flagged


def merge(d: dict[str, Any], paths: list[str] | tuple[str, ...], table: pl.DataFrame | None = None) -> dict[str, Any]:
    """``d`` (a job's report dict) with the NCCL records under ``paths`` joined (a new dict).
    ``table``: the job's collective table (``collectives.TABLE_SCHEMA``), for the sequence check of
    a matched communicator and the call-by-call pairing (without it the join is by rank, size and
    collective only, said, and nothing is paired)."""
    from tracelens.analysis.job.hang import diagnose, expected_members, split_shared_names
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
        split = split_shared_names(parses)  # one name, several groups: told apart for the diagnosis only
        if split is not parses:
            hangs = pl.concat([p.rows for p in split], how="diagonal_relaxed").filter(pl.col("source").is_in(["nccl_log", "flight_recorder"]))
        diag = diagnose(hangs, [str(f) for f, _ in found[0]], expected_members(split))
        warnings.extend(diag.pop("warnings", []))
        d["job"]["nccl_diagnosis"] = diag
    ref = _reference(parses)
    groups = _sizes(d)
    fr_rows = _with_sizes(rows.filter(pl.col("source") == "flight_recorder")) if rows.height else rows
    rows = rows.filter(pl.col("source") != "flight_recorder") if rows.height else rows
    paired: dict[tuple, tuple[bool, pl.DataFrame | None, str]] = {}  # (kind, group, communicator) -> _pair's
    found_pairs: list[pl.DataFrame] = []
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
        pairing = table is not None and table.height > 0
        algo = _algo(rows, parses, g, size, job_ranks, warnings, per_call=not pairing) if rows.height else None
        if algo:
            ok, note = _aligned(table, rows, g["group"], algo["nccl_communicator"], job_ranks)
            algo["nccl_sequence"] = note
            if not ok:
                warnings.append(f"group {g['group']} {g['collective']}: NCCL communicator {algo['nccl_communicator']}: {note}; not joined")
                algo = None
        if algo and pairing:
            key = ("nccl", g["group"], algo["nccl_communicator"])
            if key not in paired:
                theirs = _with_sizes(rows.filter(pl.col("group") == algo["nccl_communicator"]))
                paired[key] = _pair(_job_calls(table, g["group"]), theirs, job_ranks, "seq", exact=False)
                if paired[key][1] is not None:  # once per communicator: its pairs hold all the group's collectives
                    found_pairs.append(paired[key][1].with_columns(pl.lit("nccl").alias("_src")))
            algo.update(_summary(paired[key], g, "nccl", warnings))
        if algo:
            g.update(algo)
        if fr_rows.height and table is not None and table.height and g["group"]:
            key = ("fr", g["group"], g["group"])
            if key not in paired:
                job = _job_calls(table, g["group"])
                theirs = fr_rows.filter(pl.col("group") == g["group"], pl.col("rank").is_in(list(job_ranks)))
                exact = job.height > 0 and not job["derived"].any()
                paired[key] = (_pair(job, theirs, job_ranks, "order", exact=exact, what="the process group's recorded sequence")
                               if theirs.height else None)
                if paired[key] is not None and paired[key][1] is not None:
                    found_pairs.append(paired[key][1].with_columns(pl.lit("fr").alias("_src")))
                if paired[key] is not None and not paired[key][0]:  # once per process group
                    warnings.append(f"group {g['group']}: Flight Recorder: {paired[key][2]}; not paired")
            if paired[key] is not None:
                g.update(_summary(paired[key], g, "fr", warnings))
        items.append(g)
    d["communication"]["by_group"] = items
    if found_pairs:
        d["communication"]["slowest"] = _on_slowest(d["communication"].get("slowest", []), pl.concat(found_pairs, how="diagonal_relaxed"))
    d["warnings"].extend(warnings)
    return d


_PAIR_COLS = {"n_seq": pl.Int64, "n_collective": pl.String, "n_bytes": pl.Int64, "n_out_bytes": pl.Int64, "n_state": pl.String,
              "n_algo": pl.String, "n_proto": pl.String, "n_channels": pl.Int32, "n_dur_ns": pl.Int64}


def _job_calls(table: pl.DataFrame, group: str | None) -> pl.DataFrame:
    """The job's calls of one process group, one row per rank x call."""
    job = table.filter(pl.col("group").is_null() if group is None else (pl.col("group") == group))
    if "derived" not in job.columns:
        job = job.with_columns(pl.lit(True).alias("derived"))
    return job.select("rank", "group", "seq", "collective", "bytes", "group_size", "start_ns", "derived")


def _with_sizes(rows: pl.DataFrame) -> pl.DataFrame:
    """NCCL records with what a paired call is compared on: ``n_bytes`` / ``n_out_bytes`` (a Flight
    Recorder entry's input / output elements x its element size; a log's or plugin's bytes, and for
    an all-gather or reduce-scatter those x its group size, as NCCL counts those per rank), and the
    per-call columns, null where the source has none."""
    from tracelens.model.collectives import dtype_bytes

    if not rows.height:
        return rows.with_columns([pl.lit(None, t).alias(c) for c, t in _PAIR_COLS.items()])
    dts = [x for x in rows["dtype"].unique().to_list() if x is not None]  # the distinct element types: a few
    elem = pl.col("dtype").replace_strict({x: dtype_bytes(x) for x in dts}, default=None, return_dtype=pl.Int64)
    fr = pl.col("source") == "flight_recorder"
    have = set(rows.columns)

    def col(name: str, t: pl.DataType) -> pl.Expr:
        return pl.col(name).cast(t) if name in have else pl.lit(None, t)

    return rows.with_columns(
        pl.col("seq").alias("n_seq"), pl.col("collective").alias("n_collective"),
        pl.when(fr).then(pl.col("count") * elem).otherwise(pl.col("bytes")).alias("n_bytes"),
        pl.when(fr).then(pl.col("out_count") * elem)
          .when(pl.col("collective").is_in(["allgather", "reducescatter"])).then(pl.col("bytes") * pl.col("group_size"))
          .alias("n_out_bytes"),
        pl.col("state").alias("n_state"), col("algo", pl.String).alias("n_algo"), col("proto", pl.String).alias("n_proto"),
        col("channels", pl.Int32).alias("n_channels"),
        pl.when(fr & (pl.col("end_ns") >= pl.col("start_ns"))).then(pl.col("end_ns") - pl.col("start_ns")).alias("n_dur_ns"))


def _occurrences(job: pl.DataFrame, theirs: pl.DataFrame, ranks: set, order: str) -> list[tuple]:
    """Per rank with calls on both sides (in rank order; up to the first rank where it fails): where
    the job's calls of the group, in start order, occur as a run of the records' collectives in
    their ``order`` (``seq``: one record per (seq, collective)): (rank, the job's calls, the
    records, the first offset or -1, the next offset or -1, how many calls, how many records).
    One character per collective, the runs found by a string search (no per-row Python)."""
    codes: dict[str, str] = {}

    def word(names: pl.Series) -> str:  # polars' replace and join
        names = names.fill_null("?")
        for n in names.unique().to_list():  # the distinct collectives: a few
            codes.setdefault(n, chr(0x4E00 + len(codes)))
        return names.replace_strict(codes, return_dtype=pl.String).str.join("").item()

    out = []
    for r in sorted(ranks):  # the job's ranks: a bounded loop
        a = job.filter(pl.col("rank") == r).sort("start_ns")
        b = theirs.filter(pl.col("rank") == r)
        b = (b.sort(order).unique([order, "collective"], keep="first", maintain_order=True) if order == "seq" else b.sort(order))
        if not a.height or not b.height:
            continue
        wa, wb = word(a["collective"]), word(b["collective"])
        at = wb.find(wa)
        out.append((r, a, b, at, wb.find(wa, at + 1) if at >= 0 else -1, len(wa), len(wb)))
        if at < 0:
            break
    return out


def _pair(job: pl.DataFrame, theirs: pl.DataFrame, ranks: set, order: str, exact: bool,
          what: str = "the communicator's sequence") -> tuple[bool, pl.DataFrame | None, str]:
    """Pair the job's calls of one process group (``_job_calls``) with one communicator's (or
    process group's) NCCL records (``_with_sizes``): by (rank, seq) with ``exact``, else by position
    in the records' ``order`` (see the module docstring).  (ok, the pairs or None, how / why not);
    not ok: the job's calls do not occur in the records' order on some rank."""
    keep = ["rank", *_PAIR_COLS]
    if exact:
        # a point-to-point call's number counts its own kind (Flight Recorder's p2p_seq_id): p2p-ness is in the key
        mine = job.with_columns(pl.col("collective").is_in(list(P2P)).fill_null(False).alias("_p2p"))
        rec = (theirs.select(keep).rename({"n_seq": "seq"})
               .with_columns(pl.col("n_collective").is_in(list(P2P)).fill_null(False).alias("_p2p"))
               .unique(["rank", "_p2p", "seq"], keep="first"))
        pairs = (mine.join(rec, on=["rank", "_p2p", "seq"], how="inner")
                 .with_columns(pl.col("seq").alias("n_seq")).drop("_p2p"))
        if not pairs.height:
            return True, None, "not paired: no record with the job's (rank, sequence number)"
        return True, pairs, "by process group and sequence number"
    parts, offsets = [], {}
    for r, a, b, at, again, na, nb in _occurrences(job, theirs, ranks, order):
        if at < 0:
            return False, None, f"rank {r}'s {na} collective(s) do not occur in that order among its {nb} records"
        if again >= 0:
            return True, None, (f"not paired: rank {r}'s {na} collective(s) occur at several offsets among its {nb} "
                                f"records ({at}, {again}, ...: a repeated pattern, the offset is not known)")
        offsets[r] = at
        parts.append(a.with_row_index("_k").with_columns(pl.col("_k").cast(pl.Int64) + at)
                     .join(b.select(keep).with_row_index("_k").with_columns(pl.col("_k").cast(pl.Int64)).drop("rank"), on="_k")
                     .drop("_k"))
    if not parts:
        return True, None, "not paired: no rank with calls on both sides"
    ks = sorted(set(offsets.values()))
    at = (f"offset {ks[0]}" if len(ks) == 1 else "offsets " + ", ".join(f"{k} (rank {r})" for r, k in list(offsets.items())[:8]))
    return True, pl.concat(parts), f"by position in {what} at {at}"


def _summary(got: tuple[bool, pl.DataFrame | None, str], g: dict, kind: str, warnings: list[str]) -> dict[str, Any]:
    """A by_group item's pairing keys (``nccl_*`` or ``fr_*``) from ``_pair``'s answer, its collective's pairs only."""
    ok, pairs, note = got
    who = "Flight Recorder" if kind == "fr" else "NCCL communicator"
    out: dict[str, Any] = {f"{kind}_pairing": note, f"{kind}_paired_calls": 0}
    if pairs is None or not ok:
        return out
    mine = pairs.filter(pl.col("collective") == g["collective"])
    out[f"{kind}_paired_calls"] = mine.height
    if not mine.height:
        return out
    size_ok = (pl.col("bytes").is_null() | (pl.col("n_bytes").is_null() & pl.col("n_out_bytes").is_null())
               | (pl.col("bytes") == pl.col("n_bytes")).fill_null(False) | (pl.col("bytes") == pl.col("n_out_bytes")).fill_null(False))
    bad = mine.filter((pl.col("n_collective") != pl.col("collective")).fill_null(False) | ~size_ok)
    out[f"{kind}_mismatched_calls"] = bad.height
    if bad.height:
        e = bad.row(0, named=True)
        warnings.append(f"group {g['group']} {g['collective']}: {bad.height} of {mine.height} call(s) paired with the {who}'s "
                        f"records differ in collective or size (e.g. rank {e['rank']} seq {e['seq']}: the job's {e['collective']} "
                        f"{e['bytes']} B, NCCL's record {e['n_seq']} {e['n_collective']} {e['n_bytes']} B)")
    if kind == "nccl":
        for col, key in (("n_algo", "nccl_algo"), ("n_proto", "nccl_proto"), ("n_channels", "nccl_channels")):
            if mine[col].drop_nulls().len():
                out[key] = mine[col].drop_nulls().mode().sort()[0]
    else:
        out["fr_states"] = dict(mine.group_by("n_state").len().drop_nulls("n_state").sort("n_state").iter_rows())
        dur = mine["n_dur_ns"].drop_nulls()
        out["fr_dur_ns_median"] = int(dur.median()) if dur.len() else None
    return out


def _on_slowest(slowest: list[dict], pairs: pl.DataFrame) -> list[dict]:
    """The slowest collectives' rank items with their paired records (a join over the listed items: a few)."""
    keys = pl.DataFrame([{"group": s.get("group"), "seq": s.get("seq"), "collective": s.get("collective"), "rank": r.get("rank")}
                         for s in slowest for r in s.get("ranks", [])],
                        schema={"group": pl.String, "seq": pl.Int64, "collective": pl.String, "rank": pl.Int32})
    hit = keys.join(pairs.with_columns(pl.col("rank").cast(pl.Int32), pl.col("group").cast(pl.String)),
                    on=["group", "seq", "collective", "rank"], how="inner")
    found: dict[tuple, dict] = {}
    for h in hit.iter_rows(named=True):  # the listed items' pairs: bounded by the slowest list
        extra = found.setdefault((h["group"], h["seq"], h["collective"], h["rank"]), {})
        if h["_src"] == "fr":
            extra.update({"fr_seq": h["n_seq"], "fr_state": h["n_state"]})
        else:
            extra["nccl_seq"] = h["n_seq"]
            extra.update({k: h[c] for c, k in (("n_algo", "nccl_algo"), ("n_proto", "nccl_proto"), ("n_channels", "nccl_channels"))
                          if h[c] is not None})
    return [{**s, "ranks": [{**r, **found.get((s.get("group"), s.get("seq"), s.get("collective"), r.get("rank")), {})}
                            for r in s.get("ranks", [])]} for s in slowest]


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


def _algo(rows: pl.DataFrame, parses: list, g: dict, size: int | None, job_ranks: set, warnings: list[str],
          per_call: bool = True) -> dict | None:
    """Algorithm, protocol and channels of the group's collective from the one NCCL communicator
    that matches it (on the job's ranks, of its size, running that collective): a log's tuning and
    channel lines; with ``per_call`` the mode of its records' own values too (the plugin's; without,
    the paired calls' mode is taken later, ``_summary``)."""
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
        if per_call and col in mine.columns and mine[col].drop_nulls().len():
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
    found = []
    # the job's in start order on the rank's own clock (its seq may be derived per collective type), NCCL's by its own sequence number
    for r, _, _, at, again, na, nb in _occurrences(job, rows.filter(pl.col("group") == comm), ranks, "seq"):
        if at < 0:
            return False, f"rank {r}'s {na} collective(s) do not occur in that order among its {nb} NCCL records"
        found.append((r, at, 2 if again >= 0 else 1))  # overlapping occurrences count (str.count does not)
    if not found:
        return True, "no rank with records on both sides: joined by rank, group size and collective"
    unique = all(n == 1 for _, _, n in found)
    return True, (f"the job's sequence found in the NCCL records on {len(found)} rank(s)"
                  + ("" if unique else " (at several places: a repeated pattern, the offset is not known)"))


def paths_of(values: Any) -> tuple[str, ...]:
    return tuple(str(Path(v)) for v in values or ())
