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
    s = (
        df.select(pl.col(start).alias("s"), (pl.col(start) + pl.col(dur)).alias("e"))
        .filter(pl.col("e") > pl.col("s"))
        .sort("s", "e")
    )
    if s.height == 0:
        return s
    return (
        s.with_columns(pl.col("e").cum_max().shift(1).alias("reach"))
        .with_columns((pl.col("reach").is_null() | (pl.col("s") > pl.col("reach"))).cum_sum().alias("g"))
        .group_by("g")
        .agg(pl.col("s").min(), pl.col("e").max())
        .sort("s")
        .drop("g")
    )


def outside_by(df: pl.LazyFrame, by: list[str], within: pl.DataFrame) -> pl.LazyFrame:
    """Per group of the ``by`` columns of ``df`` (intervals [s, e), any order, overlapping or not),
    the length of their union that lies outside the interval set ``within`` (columns s, e: sorted,
    disjoint; ``union_frame``): rows (by..., outside).  A sweep over all groups at once, no loop per
    group: each interval is +1 at its start and -1 at its end; sorted by group and time, the
    running sum is the group's own count (every group's deltas sum to zero) and the group's union
    is where it is positive, from one edge to the next.  Of each such stretch [t, u), the part in
    ``within`` is L(u) - L(t), with L(x) the length of ``within`` below x: the running length of its
    intervals up to the last one starting at or before x, less what of that one lies past x.
    Null keys group together."""
    w = within.lazy().select(pl.col("s").alias("_ws"), pl.col("e").alias("_we"), (pl.col("e") - pl.col("s")).cum_sum().alias("_cum"))
    iv_ = df.select(*by, "s", "e").filter(pl.col("e") > pl.col("s"))
    edges = pl.concat([iv_.select(*by, pl.col("s").alias("t"), pl.lit(1, pl.Int64).alias("d")),
                       iv_.select(*by, pl.col("e").alias("t"), pl.lit(-1, pl.Int64).alias("d"))])
    below = pl.when(pl.col("_ws").is_not_null()).then(pl.col("_cum") - (pl.col("_we") - pl.col("t")).clip(0)).otherwise(0)
    return (
        edges.sort("t").join_asof(w, left_on="t", right_on="_ws", strategy="backward")
        .select(*by, "t", "d", below.alias("L"))
        .sort(*by, "t", "d", descending=[False] * len(by) + [False, True], nulls_last=True)
        .with_columns(pl.col("d").cum_sum().alias("n"), pl.col("t").shift(-1).alias("u"), pl.col("L").shift(-1).alias("Lu"))
        .filter(pl.col("n") > 0)  # inside the group's union until the next edge (never past the group's last)
        .group_by(by)
        .agg(((pl.col("u") - pl.col("t")) - (pl.col("Lu") - pl.col("L"))).sum().alias("outside"))
    )


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
