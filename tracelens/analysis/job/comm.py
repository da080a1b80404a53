"""Collectives across ranks: clock alignment, the per-collective table, wait vs transfer, and
straggler ranks.

A collective instance is one (process group, sequence number); on each rank it is the GPU
communication kernel(s) carrying that key.  Ranks' clocks differ (other hosts, other clock
bases), so each file gets an offset that makes the *ends* of shared collectives coincide (a
collective ends on all ranks at once); the offsets are reported, never written into the
events.  With every member of a group present, the time a rank spent in a collective before
the last rank arrived is *wait*, the rest is *transfer*.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.model.collectives import bus_factor


@dataclass(frozen=True)
class ClockAlignment:
    offsets: dict[int, int]  # file -> ns to add to that file's times to put it on the reference clock
    method: str  # "collective ends" | "step starts" | "none"
    spread_ns: dict[int, int]  # file -> median absolute deviation of the estimate (skew, jitter)
    # file -> (collectives that agree on the offset, collectives shared with the reference); with
    # derived sequence numbers only the largest group of matches that agree sets the offset
    support: dict[int, tuple[int, int]] = field(default_factory=dict)
    # files whose derived sequence numbers do not pair the same collectives with the reference's
    # (their matches agree on no clock offset): every such match is refused
    unordered: frozenset[int] = frozenset()


@dataclass(frozen=True)
class RankShare:
    rank: int
    file: int
    start_ns: int  # on the rank's own clock
    dur_ns: int
    exposed_ns: int  # not under compute on that rank
    wait_ns: int | None  # before the last member arrived (None unless every member is present)
    busbw_gbps: float | None


@dataclass(frozen=True)
class Collective:
    group: str | None
    group_desc: str | None
    seq: int
    collective: str | None
    bytes: int | None
    group_size: int | None
    complete: bool  # every member of the group is in the trace set
    ranks: tuple[RankShare, ...]
    # with several ranks: do their spans overlap in aligned time, as one collective's must?  A
    # match by derived sequence numbers that does not is refused (False): no wait, no straggler
    # evidence.  None with one rank
    consistent: bool | None = None
    derived: bool = False  # matched by sequence numbers derived from per-rank order

    @property
    def slowest_rank(self) -> int | None:
        return max(self.ranks, key=lambda r: r.dur_ns).rank if self.ranks else None


@dataclass(frozen=True)
class Straggler:
    rank: int
    excess_ns: int  # wait it alone imposed on the others (its arrival minus the next-latest)
    last_in: int  # collectives in which it arrived last
    of: int  # collectives with several ranks present
    p_value: float  # chance of arriving last that often if all ranks behaved the same
    evidence: str


@dataclass(frozen=True)
class StragglerCheck:
    """Whether the straggler test could run: it needs collectives whose waits were measured (every
    member of the group present, and the match believed).  "No straggler" is only said when
    ``known``; otherwise ``reason`` says why nobody can tell."""

    known: bool
    collectives: int  # collectives with measured waits (the test's trials)
    reason: str | None


# A match is believed when the ranks' spans, aligned, overlap by at least this share of the
# shortest: in a real collective every rank is inside it from the last arrival until it ends, so
# the last to arrive (the shortest span) lies almost wholly inside the others'
MIN_OVERLAP = 0.5
# ... but a rooted or point-to-point transfer's sender may finish as soon as its data is out (a small
# broadcast's root can be done before a receiver starts), and host-side spans (gloo's, on a CPU-only
# rank) end when their thread gets the CPU back: for those the spans need only meet
ROOTED = ("broadcast", "reduce", "gather", "scatter", "send", "recv", "sendrecv")


def min_overlap(collective: str | None, on_host: bool = False) -> float:
    return 0.0 if on_host or collective in ROOTED else MIN_OVERLAP


def comm_kernels(events: pl.DataFrame) -> pl.DataFrame:
    """The spans of each collective on each file: its GPU communication kernels, or, in a file
    without any (CPU-only gloo training), its host-side collective records.  An unknown group
    or collective is "" so that keys with it still join."""
    gpu = (pl.col("kclass") == "comm") & pl.col("seq").is_not_null()
    host = pl.col("kind").is_in(["collective", "p2p"]) & pl.col("seq").is_not_null()
    with_gpu = events.select(pl.col("file").filter(gpu).unique()).get_column("file").implode()
    # lazily, so that only the selected columns are filtered (a DataFrame filter copies every one)
    return events.lazy().filter(gpu | (host & ~pl.col("file").is_in(with_gpu))).select(
        "file", "rank", "ts_ns", "dur_ns", pl.col("group").cast(pl.String).fill_null(""),
        pl.col("group_desc").cast(pl.String), "seq", pl.col("collective").cast(pl.String).fill_null(""),
        "bytes", "group_size", pl.col("kind").is_in(["collective", "p2p"]).alias("on_host"),
    ).collect(engine="in-memory")


def align_clocks(events: pl.DataFrame, spans: pl.DataFrame, n_files: int, derived: frozenset[int] = frozenset()) -> ClockAlignment:
    """Offsets that make shared collectives (``spans``: comm_kernels(events)) end together,
    else same-numbered steps start together; file 0 is the reference.  Where either file's sequence
    numbers are derived (``derived``: from per-rank order, which can pair different collectives),
    only the matches that agree set the offset (``_derived_offset``); when none agree beyond
    chance the file is ``unordered`` (its derived matches are all refused) and its offset comes
    from the steps."""
    if n_files <= 1:
        return ClockAlignment({0: 0}, "none", {0: 0})
    k = spans.with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("end"))
    key = ["group", "seq", "collective"]
    ends = k.group_by(["file"] + key).agg(pl.col("end").max(), (pl.col("end").max() - pl.col("ts_ns").min()).alias("span"),
                                          pl.col("on_host").any())
    offsets, spread, support = {0: 0}, {0: 0}, {}
    unordered: set[int] = set()
    ref = ends.filter(pl.col("file") == 0)
    ref_file = 0
    if ref.height == 0:
        ref_file = ends.get_column("file").min() if ends.height else None
        ref = ends.filter(pl.col("file") == ref_file) if ref_file is not None else ref
    for f in range(1, n_files):
        pair = ref.join(ends.filter(pl.col("file") == f), on=key, suffix="_o")
        if not pair.height:
            continue
        d = pair.select((pl.col("end") - pl.col("end_o")).alias("d")).get_column("d").sort()
        if f in derived or ref_file in derived:
            found = _derived_offset(pair)
            if found is None:  # the per-rank order pairs different collectives: no offset from them
                support[f] = (0, pair.height)
                unordered.add(f)
                continue
            offsets[f], spread[f], agree = found
            support[f] = (agree, pair.height)
            continue
        support[f] = (d.len(), pair.height)
        med = int(d.median())
        offsets[f] = med
        spread[f] = int((d - med).abs().median())
    by_coll = set(offsets) - {0}
    by_step: set[int] = set()
    if len(offsets) < n_files:  # fall back to step starts for files without shared collectives
        steps = (
            events.filter(pl.col("kind") == "step")
            .select("file", pl.col("name").cast(pl.String).alias("n"), "ts_ns")
            .group_by("file", "n")
            .agg(pl.col("ts_ns").min())
        )
        r0 = steps.filter(pl.col("file") == 0)
        for f in range(1, n_files):
            if f in offsets:
                continue
            pair = r0.join(steps.filter(pl.col("file") == f), on="n", suffix="_o")
            if pair.height:
                d = pair.select((pl.col("ts_ns") - pl.col("ts_ns_o")).alias("d")).get_column("d")
                offsets[f] = int(d.median())
                spread[f] = int((d - d.median()).abs().median())
                by_step.add(f)
        for f in range(n_files):
            offsets.setdefault(f, 0)
            spread.setdefault(f, 0)
    # how the other files were put on the reference's clock (a file neither way keeps its own)
    method = ("none" if not (by_coll or by_step) else "step starts" if not by_coll
              else "collective ends" if not by_step else "collective ends, step starts")
    return ClockAlignment(offsets, method, spread, support, frozenset(unordered))


def _derived_offset(pair: pl.DataFrame) -> tuple[int, int, int] | None:
    """(offset, spread, matches consistent at it) for a file whose collectives were paired with
    the reference's by derived sequence numbers (``pair``: end and span of each, the other file's
    with suffix _o), or None when the pairs agree on no offset beyond what chance gives.

    Two estimates, each believed when most matches agree on it or more agree than chance would
    put together (a scan statistic, p < 0.005): the ends (a collective ends on every rank at about
    once, so true pairs' end differences cluster tightly, GPU kernels within a fraction of their
    length: the largest cluster within 5% or 50% of the median collective's length), and the
    overlaps (host spans such as gloo's, whose ends are noisy: the offset at which most matches
    overlap by ``MIN_OVERLAP`` of the shorter).  Of the two, the one with more matches consistent
    at it wins; the ends on a tie."""
    m = pair.height
    need = (pl.when(pl.col("collective").is_in(list(ROOTED)) | pl.col("on_host") | pl.col("on_host_o")).then(0.0).otherwise(MIN_OVERLAP)
            * pl.min_horizontal("span", "span_o"))
    lo = pl.col("end") - pl.col("span") - pl.col("end_o") + need
    hi = pl.col("end") - pl.col("end_o") + pl.col("span_o") - need
    # the offsets o (added to the other file) at which each match overlaps enough: with A the
    # reference's span, B the other's and v the overlap it needs, o in [a1 - b2 + v, a2 - b1 - v]
    iv_ = pair.select(lo.alias("lo"), hi.alias("hi"))

    def consistent_at(o: float) -> int:
        return iv_.select(((pl.col("lo") <= o) & (o <= pl.col("hi"))).sum()).item()

    cands = []
    d = pair.select((pl.col("end") - pl.col("end_o")).alias("d")).get_column("d").sort()
    typical = pair.select(pl.min_horizontal("span", "span_o").median()).item()
    extent = int(d.max() - d.min())
    for share in (0.05, MIN_OVERLAP):
        width = max(int(typical * share), 1)
        count = d.search_sorted(d + width, side="right").cast(pl.Int64) - pl.int_range(m, eager=True)
        best = int(count.max())
        if 2 * best > m or (best > 1 and _by_chance(best, m, width, extent) < 0.005):
            c = d.slice(int(count.arg_max()), best)
            med = int(c.median())
            cands.append((consistent_at(med), 1, med, int((c - med).abs().median())))
            break
    sweep = (
        pl.concat([iv_.select(pl.col("lo").alias("x"), pl.lit(1).alias("e")), iv_.select(pl.col("hi").alias("x"), pl.lit(-1).alias("e"))])
        .sort("x", "e", descending=[False, True])  # an interval that starts where another ends still meets it
        .with_columns(pl.col("e").cum_sum().alias("n"), pl.col("x").shift(-1).alias("next"))
    )
    top = sweep.sort("n", descending=True, maintain_order=True).row(0, named=True)
    k = int(top["n"])
    length = iv_.select((pl.col("hi") - pl.col("lo")).mean()).item()
    span = iv_.select(pl.col("hi").max() - pl.col("lo").min()).item()
    if 2 * k > m or (k > 1 and _by_chance(k, m, max(int(length), 1), int(span)) < 0.005):
        cands.append((k, 0, int((top["x"] + top["next"]) / 2), int((top["next"] - top["x"]) / 2)))
    if not cands:
        return None
    n, _, off, spread = max(cands)
    return off, spread, n


def _by_chance(k: int, m: int, width: int, extent: int) -> float:
    """How likely ``k`` of ``m`` values spread over ``extent`` fall within some window of ``width``
    by chance (a scan statistic, bounded by the union over extent/width windows of a Poisson tail)."""
    if extent <= width:
        return 1.0 if k < m else 0.0
    lam = m * width / extent
    tail = 1.0 - sum(math.exp(-lam) * lam**i / math.factorial(i) for i in range(k))
    return min(1.0, max(tail, 0.0) * extent / width)


def collective_table(
    k: pl.DataFrame, align: ClockAlignment, compute: dict[int, iv.Intervals], file_rank: dict[int, int],
    derived: frozenset[int] = frozenset(), world: int | None = None,
) -> list[Collective]:
    """One Collective per (group, seq, collective) of ``k`` (comm_kernels(events)).  ``derived``:
    the files whose sequence numbers were derived from per-rank order; their matches must overlap in
    aligned time (``MIN_OVERLAP``) to be believed.  ``world``: the job's size when every one of its
    ranks is loaded, so that a collective on all of them has every member of its group, whatever
    the group."""
    if k.height == 0:
        return []
    # several kernels of one collective on one rank (coalesced, multi-stream): one span
    per = (
        k.group_by("group", "group_desc", "seq", "collective", "file")
        .agg(
            pl.col("ts_ns").min().alias("start"),
            (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("end"),
            pl.col("bytes").max(),
            pl.col("group_size").max(),
            pl.struct("ts_ns", "dur_ns").alias("parts"),
            pl.col("on_host").any(),
        )
        .sort("group", "seq", "collective", "group_desc", "file", nulls_last=True)
    )
    out: list[Collective] = []
    # one pass over the rows (a polars group iteration gathers a frame per collective)
    for (group, desc, seq, coll), grp in itertools.groupby(
            per.iter_rows(named=True), key=lambda r: (r["group"], r["group_desc"], r["seq"], r["collective"])):
        rows = list(grp)
        gsize = max((r["group_size"] or 0) for r in rows) or None
        complete = len(rows) > 1 and ((gsize is not None and len(rows) >= gsize) or (world is not None and len(rows) >= world))
        aligned_start = [r["start"] + align.offsets.get(r["file"], 0) for r in rows]
        aligned_end = [r["end"] + align.offsets.get(r["file"], 0) for r in rows]
        last = max(aligned_start)
        is_derived = any(r["file"] in derived for r in rows)
        consistent = None
        if len(rows) > 1:
            shortest = min(e - s_ for s_, e in zip(aligned_start, aligned_end))
            consistent = not is_derived or (
                (min(aligned_end) - last) >= min_overlap(coll or None, any(r["on_host"] for r in rows)) * shortest
                and not any(r["file"] in align.unordered for r in rows))
        measured = complete and consistent is not False
        nbytes = max((r["bytes"] or 0) for r in rows) or None
        factor = bus_factor(coll or None, gsize)
        shares = []
        for r, a_start in zip(rows, aligned_start):
            dur = r["end"] - r["start"]
            spans = iv.normalize([(p["ts_ns"], p["ts_ns"] + p["dur_ns"]) for p in r["parts"]])
            exposed = iv.length(iv.subtract(spans, compute.get(r["file"], [])))
            wait = min(max(last - a_start, 0), dur) if measured else None
            transfer = dur - (wait or 0)
            bw = (nbytes * factor / transfer) if (nbytes and factor is not None and transfer > 0) else None
            shares.append(RankShare(file_rank[r["file"]], r["file"], r["start"], dur, exposed, wait, bw))
        out.append(Collective(group or None, desc, seq, coll or None, nbytes, gsize, complete, tuple(shares), consistent, is_derived))
    return out


def stragglers(table: list[Collective], n_ranks: int, alpha: float = 0.01, min_excess_fraction: float = 0.01,
               total_ns: int = 0, align: ClockAlignment | None = None) -> list[Straggler]:
    """Ranks that arrive last at collectives far more often than chance (one-sided binomial
    test, p < alpha, Bonferroni over ranks) and whose lateness costs the others at least
    ``min_excess_fraction`` of the job's GPU time.  When all ranks behave alike, nobody is named."""
    if n_ranks < 2:
        return []
    last_count: dict[int, int] = {}
    excess: dict[int, int] = {}
    trials = 0
    for c in table:
        if len(c.ranks) < 2 or any(r.wait_ns is None for r in c.ranks):  # only where waits were measured
            continue
        offs = align.offsets if align else {}
        arr = sorted(((r.start_ns + offs.get(r.file, 0), r.rank) for r in c.ranks), reverse=True)
        trials += 1
        (t1, r1), (t2, _) = arr[0], arr[1]
        last_count[r1] = last_count.get(r1, 0) + 1
        excess[r1] = excess.get(r1, 0) + (t1 - t2)
    if trials == 0:
        return []
    p0 = 1.0 / n_ranks
    out = []
    for rank, k in sorted(last_count.items()):
        p = _binom_sf(k, trials, p0)
        if p * n_ranks < alpha and excess[rank] >= min_excess_fraction * max(total_ns, 1):
            out.append(
                Straggler(
                    rank, excess[rank], k, trials, p,
                    f"arrived last at {k} of {trials} collectives (chance alone: {p0:.0%} of them, p={p:.1e}); "
                    f"the others waited {excess[rank] / 1e6:.2f} ms for it beyond the next-latest rank",
                )
            )
    return sorted(out, key=lambda s: -s.excess_ns)


def straggler_check(table: list[Collective], n_ranks: int, world: int | None = None) -> StragglerCheck:
    """Could the straggler test see anything?  ``world``: the job's size as the traces state it."""
    if n_ranks < 2:
        return StragglerCheck(False, 0, "a single rank: nobody to compare it with")
    measured = sum(1 for c in table if len(c.ranks) > 1 and all(r.wait_ns is not None for r in c.ranks))
    if measured:
        return StragglerCheck(True, measured, None)
    shared = [c for c in table if len(c.ranks) > 1]
    if not table:
        return StragglerCheck(False, 0, "no collectives in these traces")
    if not shared:
        return StragglerCheck(False, 0, "no collective was matched across ranks")
    why = []
    if not any(c.complete for c in shared):
        if world and world > n_ranks:
            why.append(f"the traces hold {n_ranks} of the job's {world} ranks: no collective has every member of its group, "
                       "so nobody can tell who waited")
        else:
            why.append("no collective is known to have every member of its group here (group sizes unknown)")
    refused = [c for c in shared if c.consistent is False]
    if refused:
        why.append(f"{len(refused)} of {len(shared)} matches by per-rank order do not overlap in aligned time")
    return StragglerCheck(False, 0, "; ".join(why) or "no collective with measured waits")


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)


# -- what the report says about the matching (communication.matching, the notes, the warnings) --


def world_size(metas) -> int | None:
    """The job's size, when the traces that state one agree."""
    sizes = {m.world_size for m in metas if isinstance(m.world_size, int) and m.world_size > 0}
    return sizes.pop() if len(sizes) == 1 else None


def seq_source(metas) -> str:
    """Where the collectives' sequence numbers (the key that matches them across ranks) came from:
    "trace", "derived" (each rank's order), "mixed", or "none" (no collectives)."""
    src = {str(m.attributes["seq_source"]).split(":", 1)[0] for m in metas if m.attributes.get("seq_source")}
    if not src:
        return "none"
    return src.pop() if len(src) == 1 else "mixed"


def check_dict(check: StragglerCheck) -> dict[str, Any]:
    return {"known": check.known, "collectives": check.collectives, "reason": check.reason}


def report_notes(table, metas) -> dict[str, Any]:
    """communication.matching (how collectives were matched: seq_source, matched on several ranks,
    refused, complete) and why a collective's group or type is unknown (null when none is)."""
    shared = [c for c in table if len(c.ranks) > 1]
    src = seq_source(metas) if metas else ("trace" if table else "none")
    notes: dict[str, Any] = {
        "matching": {"seq_source": src, "matched": len(shared), "refused": sum(1 for c in shared if c.consistent is False),
                     "complete": sum(1 for c in shared if c.complete)},
        "group_unknown": None,
        "collective_unknown": None,
    }
    if any(c.group is None for c in table):
        if not any(isinstance(m.distributed.get("pg_config"), list) for m in metas):
            notes["group_unknown"] = ("the traces name no process group: their collective records carry no 'Process Group Name' "
                                      "and distributedInfo has no pg_config")
        else:
            notes["group_unknown"] = ("no collective record names the group of these collectives (kernels launched without "
                                      "record_param_comms), and distributedInfo.pg_config lists several groups")
    if any(c.collective is None for c in table):
        notes["collective_unknown"] = ("no record names these collectives: their record_param_comms carry no 'Collective name' "
                                       "and enclose no c10d op or backend annotation, or their kernel (e.g. ncclDevKernel_Generic, "
                                       "launched before the trace began) does not say")
    return notes


def matching_warnings(table, align: ClockAlignment, metas) -> list[str]:
    """Say when matches by derived sequence numbers were refused, and when a file's clock offset
    rests on only some of the collectives it shares with the reference."""
    out = []
    shared = [c for c in table if len(c.ranks) > 1]
    refused = [c for c in shared if c.consistent is False]
    if refused:
        gaps = []
        for c in refused:
            ends = [r.start_ns + r.dur_ns + align.offsets.get(r.file, 0) for r in c.ranks]
            gaps.append(max(ends) - min(ends))
        out.append(
            f"collectives matched across ranks by sequence numbers derived from each rank's order (the traces carry none for "
            f"them): {len(refused)} of {len(shared)} matches do not overlap in aligned time (their ends {min(gaps) / 1e6:.1f}-"
            f"{max(gaps) / 1e6:.1f} ms apart), so they pair different collectives: refused, their wait and the straggler "
            f"test left unknown"
        )
    for f, (agree, of) in sorted(align.support.items()):
        if of > 1 and agree < of:
            out.append(
                f"{metas[f].path}: clock offset "
                + (f"from {agree} of {of} collectives shared with {metas[0].path} that agree on it"
                   if agree > 1 else f"not from collectives: none of the {of} shared with {metas[0].path} agree on one")
            )
    return out
