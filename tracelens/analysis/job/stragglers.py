"""Straggler ranks: who arrives last at collectives far more often than chance, read from the
collective table (``tracelens.analysis.job.collectives``), and whether the test could run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl


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


def _measured() -> pl.Expr:
    """The rows of collectives with several ranks whose waits were all measured."""
    return (pl.col("n_ranks") > 1) & pl.col("wait_ns").is_not_null().all().over("cid")


def stragglers(table: pl.DataFrame, n_ranks: int, alpha: float = 0.01, min_excess_fraction: float = 0.01,
               total_ns: int = 0) -> list[Straggler]:
    """Ranks that arrive last (latest aligned start; of two at once, the higher rank) at collectives
    far more often than chance (one-sided binomial test, p < alpha, Bonferroni over ranks) and whose
    lateness costs the others at least ``min_excess_fraction`` of the job's GPU time.  When all
    ranks behave alike, nobody is named."""
    if n_ranks < 2 or table.height == 0:
        return []
    arrivals = (
        table.filter(_measured())
        .sort("cid", "aligned_start_ns", "rank", descending=[False, True, True], nulls_last=True, maintain_order=True)
        .group_by("cid", maintain_order=True)
        .agg(pl.col("rank").first(), (pl.col("aligned_start_ns").first() - pl.col("aligned_start_ns").get(1)).alias("excess"))
    )
    trials = arrivals.height
    if trials == 0:
        return []
    last = arrivals.group_by("rank").agg(pl.len().alias("k"), pl.col("excess").sum()).sort("rank", nulls_last=True)
    p0 = 1.0 / n_ranks
    out = []
    for rank, k, excess in last.iter_rows():  # one row per rank that arrived last somewhere
        if excess < min_excess_fraction * max(total_ns, 1):
            continue  # (the cheaper test first: the tail sum runs over the trials)
        p = _binom_sf(k, trials, p0)
        if p * n_ranks < alpha:
            out.append(
                Straggler(
                    rank, excess, k, trials, p,
                    f"arrived last at {k} of {trials} collectives (chance alone: {p0:.0%} of them, p={p:.1e}); "
                    f"the others waited {excess / 1e6:.2f} ms for it beyond the next-latest rank",
                )
            )
    return sorted(out, key=lambda s: -s.excess_ns)


def straggler_check(table: pl.DataFrame, n_ranks: int, world: int | None = None) -> StragglerCheck:
    """Could the straggler test see anything?  ``world``: the job's size as the traces state it."""
    if n_ranks < 2:
        return StragglerCheck(False, 0, "a single rank: nobody to compare it with")
    if table.height == 0:
        return StragglerCheck(False, 0, "no collectives in these traces")
    first = pl.col("cid").is_first_distinct()
    shared = first & (pl.col("n_ranks") > 1)
    measured, n_shared, complete, refused = table.select(
        (_measured() & first).sum().alias("measured"), shared.sum().alias("shared"), (shared & pl.col("complete")).sum().alias("complete"),
        (shared & pl.col("consistent").eq_missing(False)).sum().alias("refused"),
    ).row(0)
    if measured:
        return StragglerCheck(True, measured, None)
    if not n_shared:
        return StragglerCheck(False, 0, "no collective was matched across ranks")
    why = []
    if not complete:
        if world and world > n_ranks:
            why.append(f"the traces hold {n_ranks} of the job's {world} ranks: no collective has every member of its group, "
                       "so nobody can tell who waited")
        else:
            why.append("no collective is known to have every member of its group here (group sizes unknown)")
    if refused:
        why.append(f"{refused} of {n_shared} matches by per-rank order do not overlap in aligned time")
    return StragglerCheck(False, 0, "; ".join(why) or "no collective with measured waits")


def check_dict(check: StragglerCheck) -> dict[str, Any]:
    return {"known": check.known, "collectives": check.collectives, "reason": check.reason}


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)
