"""Exact interval arithmetic on int64 ns: unions, intersections, differences, lengths.

An interval set is a list of ``(start, end)`` pairs, sorted, disjoint, non-touching and
non-empty (``start < end``).  Unions of many events are built in polars (sort + running max);
the set operations then walk the (much shorter) merged lists.
"""

from __future__ import annotations

from bisect import bisect_right
from heapq import merge

import polars as pl

Intervals = list[tuple[int, int]]


def union_of(df: pl.DataFrame, start: str = "ts_ns", dur: str = "dur_ns") -> Intervals:
    """The union of the events' [start, start + dur) intervals (zero-length ones vanish)."""
    merged = union_frame(df, start, dur)
    return list(zip(merged.get_column("s").to_list(), merged.get_column("e").to_list()))


def union_frame(df: pl.DataFrame, start: str = "ts_ns", dur: str = "dur_ns") -> pl.DataFrame:
    """``union_of`` as a frame: columns ``s``, ``e`` (Int64), sorted, disjoint, non-touching."""
    if df.height == 0:
        return pl.DataFrame(schema={"s": pl.Int64, "e": pl.Int64})
    s = df.select(pl.col(start).alias("s"), (pl.col(start) + pl.col(dur)).alias("e"))
    return union_by(s, [])


def union_by(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The union of the [s, e) intervals of ``df`` within each group of the ``by`` columns (none:
    one group), as rows (by..., s, e): each group's set sorted, disjoint and non-touching,
    zero-length intervals gone.  A group key may hold nulls (they group together)."""
    s = df.select(*by, "s", "e").filter(pl.col("e") > pl.col("s")).sort(*by, "s", "e", nulls_last=True)
    if s.height == 0:
        return s
    start, end = pl.col("s"), pl.col("e")
    if by:
        s = s.with_columns(_group_id(by).alias("_k"))
        lo, hi, groups = s.select(start.min(), end.max(), pl.col("_k").max()).row(0)
        if (hi - lo + 1) * (groups + 1) < 2**62:
            # each group's times moved past the previous group's (a running max over the whole
            # column then never reaches from one group into the next: cheaper than one per group)
            shift = pl.col("_k").cast(pl.Int64) * pl.lit(hi - lo + 1, pl.Int64) - pl.lit(lo, pl.Int64)
            start, end = start + shift, end + shift
            reach = end.cum_max().shift(1)
        else:
            reach = end.cum_max().shift(1).over("_k")
    else:
        reach = end.cum_max().shift(1)  # how far the intervals before this one reach
    return (
        s.with_columns((reach.is_null() | (start > reach)).cum_sum().alias("_g"))
        .group_by("_g", maintain_order=True)
        .agg(*(pl.col(c).first() for c in by), pl.col("s").min(), pl.col("e").max())
        .drop("_g")
    )


def _group_id(by: list[str]) -> pl.Expr:
    """A running id of the groups of ``by`` in a frame sorted by them (nulls equal to nulls)."""
    changed = pl.lit(False)
    for c in by:
        changed = changed | pl.col(c).ne_missing(pl.col(c).shift(1))
    return changed.cum_sum()


def overlap_lengths(spans: pl.DataFrame, within: pl.DataFrame) -> pl.Series:
    """For each row [s, e) of ``spans`` (any order, may overlap each other), the length of it that
    lies in the interval set ``within`` (columns s, e: sorted, disjoint; ``union_frame``), Int64.
    Whole columns at once: with L(x) the length of ``within`` below x (the lengths of the
    intervals before x, from a running sum, less what of the last one lies past x), it is
    L(e) - L(s)."""
    if within.height == 0 or spans.height == 0:
        return pl.Series("overlap", [0] * spans.height, pl.Int64)
    ws, we = within.get_column("s"), within.get_column("e")
    cum = (we - ws).cum_sum()

    def below(x: pl.Series) -> pl.Series:
        i = ws.search_sorted(x, side="right").cast(pl.Int64) - 1  # the last interval starting at or before x
        j = i.clip(0)
        full = cum.gather(j)
        past = (we.gather(j) - x).clip(0)
        return pl.select(pl.when(i >= 0).then(full - past).otherwise(0)).to_series()

    return (below(spans.get_column("e")) - below(spans.get_column("s"))).alias("overlap")


def _merge_sorted(pairs) -> Intervals:
    """Merge pairs that come sorted by start into an interval set."""
    out: Intervals = []
    for s, e in pairs:
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def normalize(iv: list[tuple[int, int]]) -> Intervals:
    """Sort and merge arbitrary pairs into an interval set."""
    return _merge_sorted(sorted(p for p in iv if p[1] > p[0]))


def length(iv: Intervals) -> int:
    return sum(e - s for s, e in iv)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a \\ b."""
    out: Intervals = []
    if not a:
        return out
    # skip the part of b that ends before a begins (a is often short, b long)
    j = bisect_right(b, (a[0][0], a[0][0])) - 1 if b else 0
    j = max(j, 0)
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def union(a: Intervals, b: Intervals) -> Intervals:
    """a ∪ b by a linear merge of the two sorted sets."""
    if not a or not b:
        return list(a or b)
    return _merge_sorted(merge(a, b))


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    """a ∩ [lo, hi), found by bisection."""
    if hi <= lo or not a:
        return []
    i = max(bisect_right(a, (lo, lo)) - 1, 0)
    out: Intervals = []
    while i < len(a) and a[i][0] < hi:
        s, e = a[i]
        if e > lo:
            out.append((max(s, lo), min(e, hi)))
        i += 1
    return out
