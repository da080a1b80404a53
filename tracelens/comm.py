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

import math
from dataclasses import dataclass

import polars as pl

from tracelens import intervals as iv
from tracelens.collectives import bus_factor


@dataclass(frozen=True)
class ClockAlignment:
    offsets: dict[int, int]  # file -> ns to add to that file's times to put it on the reference clock
    method: str  # "collective ends" | "step starts" | "none"
    spread_ns: dict[int, int]  # file -> median absolute deviation of the estimate (skew, jitter)


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
        "bytes", "group_size",
    ).collect(engine="in-memory")


def align_clocks(events: pl.DataFrame, spans: pl.DataFrame, n_files: int) -> ClockAlignment:
    """Offsets that make shared collectives (``spans``: comm_kernels(events)) end together,
    else same-numbered steps start together; file 0 is the reference."""
    if n_files <= 1:
        return ClockAlignment({0: 0}, "none", {0: 0})
    k = spans.with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("end"))
    key = ["group", "seq", "collective"]
    ends = k.group_by(["file"] + key).agg(pl.col("end").max())
    offsets, spread, method = {0: 0}, {0: 0}, "collective ends"
    ref = ends.filter(pl.col("file") == 0)
    if ref.height == 0:
        ref_file = ends.get_column("file").min() if ends.height else None
        ref = ends.filter(pl.col("file") == ref_file) if ref_file is not None else ref
    for f in range(1, n_files):
        pair = ref.join(ends.filter(pl.col("file") == f), on=key, suffix="_o")
        if pair.height:
            d = pair.select((pl.col("end") - pl.col("end_o")).alias("d")).get_column("d")
            med = int(d.median())
            offsets[f] = med
            spread[f] = int((d - med).abs().median())
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
                method = "step starts" if method == "collective ends" and len(offsets) == 2 else method
        for f in range(n_files):
            offsets.setdefault(f, 0)
            spread.setdefault(f, 0)
        if all(v == 0 for k_, v in offsets.items() if k_):
            method = "none"
    return ClockAlignment(offsets, method, spread)


def collective_table(
    k: pl.DataFrame, align: ClockAlignment, compute: dict[int, iv.Intervals], file_rank: dict[int, int]
) -> list[Collective]:
    """One Collective per (group, seq, collective) of ``k`` (comm_kernels(events))."""
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
        )
        .sort("group", "seq", "file", nulls_last=True)
    )
    out: list[Collective] = []
    for (group, desc, seq, coll), g in per.group_by("group", "group_desc", "seq", "collective", maintain_order=True):
        rows = g.to_dicts()
        gsize = max((r["group_size"] or 0) for r in rows) or None
        complete = gsize is not None and len(rows) >= gsize and len(rows) > 1
        aligned_start = [r["start"] + align.offsets.get(r["file"], 0) for r in rows]
        last = max(aligned_start)
        nbytes = max((r["bytes"] or 0) for r in rows) or None
        factor = bus_factor(coll or None, gsize)
        shares = []
        for r, a_start in zip(rows, aligned_start):
            dur = r["end"] - r["start"]
            spans = iv.normalize([(p["ts_ns"], p["ts_ns"] + p["dur_ns"]) for p in r["parts"]])
            exposed = iv.length(iv.subtract(spans, compute.get(r["file"], [])))
            wait = min(max(last - a_start, 0), dur) if complete else None
            transfer = dur - (wait or 0)
            bw = (nbytes * factor / transfer) if (nbytes and factor is not None and transfer > 0) else None
            shares.append(RankShare(file_rank[r["file"]], r["file"], r["start"], dur, exposed, wait, bw))
        out.append(Collective(group or None, desc, seq, coll or None, nbytes, gsize, complete, tuple(shares)))
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
        if len(c.ranks) < 2:
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


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)
