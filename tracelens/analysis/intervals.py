"""Exact interval arithmetic on int64 ns: unions, intersections, differences, lengths.

An interval set is a list of ``(start, end)`` pairs, sorted, disjoint, non-touching and
non-empty (``start < end``).  Unions of many events are built in polars (sort + running max);
the set operations then walk the (much shorter) merged lists.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from heapq import merge
from typing import TypeVar

import polars as pl

Intervals = list[tuple[int, int]]
F = TypeVar("F", pl.DataFrame, pl.LazyFrame)


def merged(frame: F, start: str = "s", end: str = "e", by: Sequence[str] = (), keep_empty: bool = False) -> F:
    """The union of the rows' ``[start, end)`` intervals, per group of ``by``: one row per maximal
    run (overlapping or touching intervals joined), with the ``by`` columns, ``start`` and
    ``end``, sorted by (``by``, ``start``).  Empty intervals vanish unless ``keep_empty``.  The
    one interval union of tracelens (a sort and a running maximum of the ends): every other
    union is built on it.  Lazy in, lazy out."""
    by = list(by)
    s, e = pl.col(start), pl.col(end)
    if not keep_empty:
        frame = frame.filter(e > s)
    reach = e.cum_max().shift(1)
    reach = reach.over(by) if by else reach
    return (
        frame.select(*by, start, end)
        .sort(*by, start, end)
        .with_columns((reach.is_null() | (s > reach)).cum_sum().alias("_run"))
        .group_by(*by, "_run")
        .agg(s.min(), e.max())
        .sort(*by, start)
        .drop("_run")
    )


def with_before(runs: F, start: str = "s", end: str = "e", by: Sequence[str] = ()) -> F:
    """``merged``'s runs with ``_before``: the length of the union before each run (per group)."""
    before = (pl.col(end) - pl.col(start)).cum_sum().shift(1, fill_value=0)
    return runs.with_columns((before.over(list(by)) if by else before).alias("_before"))


def covered(queries: F, at: str, runs: F, alias: str, by: Sequence[str] = (), start: str = "s", end: str = "e") -> F:
    """``queries`` with ``alias``: how much of the union ``runs`` (``with_before`` of ``merged``;
    per group of ``by``, the same columns in both) lies before ``queries[at]``, 0 where that is
    null.  One as-of join: |U ∩ [x, y)| is then ``covered(y) - covered(x)`` for x <= y.  The
    queries come back sorted by ``at``."""
    by = list(by)
    r = runs.select(*by, pl.col(start).alias("_cs"), pl.col(end).alias("_ce"), "_before").sort("_cs")
    key = pl.col(at).fill_null(pl.lit(-(2**63), pl.Int64)).alias("_at")
    joined = queries.with_columns(key).sort("_at").join_asof(r, left_on="_at", right_on="_cs", by=by or None,
                                                              strategy="backward", check_sortedness=False)
    value = pl.when(pl.col("_cs").is_null() | pl.col(at).is_null()).then(pl.lit(0, pl.Int64)).otherwise(
        pl.col("_before") + pl.min_horizontal(pl.col(at), pl.col("_ce")) - pl.col("_cs"))
    return joined.with_columns(value.alias(alias)).drop("_at", "_cs", "_ce", "_before")


def union_of(df: pl.DataFrame, start: str = "ts_ns", dur: str = "dur_ns") -> Intervals:
    """The union of the events' [start, start + dur) intervals (zero-length ones vanish)."""
    merged = union_frame(df, start, dur)
    return list(zip(merged.get_column("s").to_list(), merged.get_column("e").to_list()))


def union_frame(df: pl.DataFrame, start: str = "ts_ns", dur: str = "dur_ns") -> pl.DataFrame:
    """``union_of`` as a frame: columns ``s``, ``e`` (Int64), sorted, disjoint, non-touching."""
    if df.height == 0:
        return pl.DataFrame(schema={"s": pl.Int64, "e": pl.Int64})
    # lazy: one query (on a DataFrame each of merged's steps would be a query of its own)
    return merged(df.lazy().select(pl.col(start).alias("s"), (pl.col(start) + pl.col(dur)).alias("e"))).collect(engine="in-memory")


def outside_by(df: pl.LazyFrame, by: list[str], within: pl.DataFrame) -> pl.LazyFrame:
    """Per group of the ``by`` columns of ``df`` (intervals [s, e), any order, overlapping or not),
    the length of their union that lies outside the interval set ``within`` (columns s, e: sorted,
    disjoint; ``union_frame``): rows (by..., outside).  All groups at once: each group's union
    (``merged`` by the keys), then of each of its runs [s, e) the part in ``within`` is
    C(e) - C(s), C(x) being the length of ``within`` before x (``covered``: one as-of join per
    edge).  Null keys group together."""
    runs = merged(df.select(*by, "s", "e"), by=by)
    w = with_before(within.lazy().select("s", "e"))
    edges = covered(covered(runs, "s", w, "_in_s"), "e", w, "_in_e")
    return edges.group_by(by).agg(((pl.col("e") - pl.col("s")) - (pl.col("_in_e") - pl.col("_in_s"))).sum().alias("outside"))


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
