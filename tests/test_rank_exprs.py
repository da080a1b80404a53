"""The shared expressions of the per-rank analysis against plain-Python definitions: the one
interval union (per group) and its coverage lookups, the recomputed ops, the event end and the
kept-steps rule."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import recomputed
from tracelens.analysis import intervals as iv
from tracelens.analysis.rank import recompute
from tracelens.model.schema import END, EVENT_SCHEMA
from tracelens.model.summary import kept_indices, kept_steps

spans = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.integers(0, 200), st.integers(0, 40)), max_size=40)


def points(pairs) -> set[int]:
    return {t for s, e in pairs for t in range(s, e)}


@settings(max_examples=300, deadline=None)
@given(spans, st.lists(st.tuples(st.sampled_from([1, 2, 3, 4]), st.integers(-10, 260), st.integers(-10, 260)), max_size=20))
def test_merged_and_covered_per_group(rows, queries):
    """Per group, ``merged`` is the union of the group's intervals as a sorted list of disjoint,
    non-touching runs, and ``covered`` at y minus at x is |union ∩ [x, y)|, point by point."""
    f = pl.DataFrame(rows, schema={"g": pl.Int64, "s": pl.Int64, "d": pl.Int64}, orient="row").with_columns(
        (pl.col("s") + pl.col("d")).alias("e"))
    m = iv.merged(f, by=["g"])
    for g in (1, 2, 3):
        runs = [(s, e) for gg, s, e in m.iter_rows() if gg == g]
        want = {t for gg, s, d in rows if gg == g for t in range(s, s + d)}
        assert points(runs) == want
        assert runs == iv.normalize(runs)  # sorted, disjoint, non-touching, non-empty
    q = pl.DataFrame([(i, g, min(x, y), max(x, y)) for i, (g, x, y) in enumerate(queries)],
                     schema={"i": pl.Int64, "g": pl.Int64, "x": pl.Int64, "y": pl.Int64}, orient="row")
    runs = iv.with_before(m, by=["g"])
    got = iv.covered(iv.covered(q, "x", runs, "cx", by=["g"]), "y", runs, "cy", by=["g"]).sort("i")
    for i, g, x, y, cx, cy in got.select("i", "g", "x", "y", "cx", "cy").iter_rows():
        want = {t for gg, s, d in rows if gg == g for t in range(s, s + d)}
        assert cy - cx == len({t for t in want if x <= t < y}), (g, x, y)


def test_merged_keep_empty_and_touching():
    # [0,5) and [5,8) touch: one run; [10,10) is empty: dropped, or kept as its own run
    f = pl.DataFrame({"s": [0, 5, 10], "e": [5, 8, 10]})
    assert iv.merged(f).rows() == [(0, 8)]
    assert iv.merged(f, keep_empty=True).rows() == [(0, 8), (10, 10)]


names = st.sampled_from(["autograd::engine::evaluate_function: MmBackward0", "aten::linear", "aten::addmm", "aten::relu",
                         "aten::mm", "aten::scaled_dot_product_attention"])


@st.composite
def nested_thread(draw, lo=0, hi=120, depth=0):
    """Ops of one thread that nest (each inside its parent, siblings one after another)."""
    out, t = [], lo
    while t < hi and draw(st.booleans()):
        s = draw(st.integers(t, hi))
        e = draw(st.integers(s, hi))
        out.append((s, e, draw(names)))
        if depth < 3 and e > s:
            out += draw(nested_thread(s, e, depth + 1))
        t = e
    return out


@settings(max_examples=300, deadline=None)
@given(nested_thread(), nested_thread())
def test_recompute_matches_the_stack_walk(t1, t2):
    rows = [(tid, s, e - s, n) for tid, ops in ((1, t1), (2, t2)) for s, e, n in ops]
    df = pl.DataFrame(rows, schema={"tid": pl.Int64, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "name": pl.String}, orient="row")
    df = df.with_columns(pl.lit("cpu_op").alias("kind"), pl.lit(7, pl.Int64).alias("pid"))
    df = df.select(*(pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c) for c, t in EVENT_SCHEMA.items()))
    got = recompute.find(df)
    want = []
    offset = 0
    for ops in (t1, t2):
        want += [offset + i for i in recomputed(ops)]
        offset += len(ops)
    assert sorted(got.get_column("_row").to_list()) == want
    assert (got.get_column("end") - got.get_column("ts_ns")).to_list() == [
        rows[i][2] for i in got.get_column("_row").to_list()]


def test_end_and_kept_steps():
    df = pl.DataFrame({"ts_ns": [5, 7], "dur_ns": [3, None]})
    assert df.select(END).to_series().to_list() == [8, None]  # no duration: no end
    steps = [{"warmup": True}, {"warmup": False}, {"warmup": False}]
    assert kept_indices(steps) == [1, 2] and kept_steps(steps) == steps[1:]
    assert kept_steps([{"warmup": True}]) == [{"warmup": True}]  # nothing left: all of them
    assert kept_indices([]) == []
