"""One rank's GPU timeline cut into elementary segments, every step's window at once, in polars.

Every start and end of a GPU activity (and of the recomputed work, and every window edge) is a
cut; between two cuts the set of running activities does not change, so each segment carries
how many compute, communication, copy, matmul and recompute activities run in it, and how many
of each non-matmul kernel class and each communication group.  Everything the report needs per
step is then a sum of segment lengths under a condition:

- the GPU-time partition (DESIGN 4.2): compute = C, exposed communication = M without C,
  exposed copies = Y without C or M, idle = none of them; the idle gaps are the maximal runs of
  idle segments;
- the waterfall's interval bars (MFU.md 9.7): recompute = R and C, matmul = MM without that,
  non-matmul = C without MM or R;
- the matmul time of a chosen subset of the activities (the kernels whose FLOPs are known),
  recompute excluded as for the matmul bar: ``known_matmul`` = K without R;
- the exclusive splits of exposed communication by group and of non-matmul time by class:
  the time between two consecutive ends of the split's activities is shared equally by the
  activities running in it, in integers (the remainder to the label with most activities,
  then the greatest label).

The property tests hold this to the same arithmetic on interval lists, one window at a time
(``tests/reference.py``): this is that, done once for the whole rank instead of per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracelens.analysis.waterfall import MATMUL_CLASSES
from tracelens.model.schema import END, NON_COMPUTE_KCLASSES

_SPLITS = (("nm", "_nm_pt"), ("cg", "_cg_pt"))  # (label column prefix, "a cut of this split" column)


@dataclass
class StepCut:
    """One window's sums (ns)."""

    window: int = 0
    compute: int = 0
    comm: int = 0
    memcpy: int = 0
    exposed_comm: int = 0
    exposed_memcpy: int = 0
    recompute: int = 0
    matmul: int = 0
    known_matmul: int = 0  # the ``known`` activities' time outside recomputed work (0 without ``known``)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # idle, sorted, maximal
    comm_by_group: dict[str, int] = field(default_factory=dict)  # exposed communication, split
    non_matmul: dict[str, int] = field(default_factory=dict)  # non-matmul compute, split by class

    @property
    def idle(self) -> int:
        return self.window - self.compute - self.exposed_comm - self.exposed_memcpy


def comm_label() -> pl.Expr:
    """What exposed communication is split by: the process group's description, else its name,
    else the collective."""
    return pl.coalesce(
        pl.col("group_desc").cast(pl.String),
        pl.lit("pg ") + pl.col("group").cast(pl.String),
        pl.col("collective").cast(pl.String),
        pl.lit("communication"),
    )


_NO_GAPS = {"step": pl.Int64, "a": pl.Int64, "b": pl.Int64}


def cut(gpu_rows: pl.DataFrame, recomputed: pl.DataFrame | None, windows: list[tuple[int, int]],
        known: pl.Series | None = None) -> list[StepCut]:
    """The sums of each window ``[start, end)`` of ``windows`` (in order), with each one's idle
    gaps listed.  ``gpu_rows``: the rank's GPU activities (ts_ns, dur_ns, kclass, group,
    group_desc, collective); ``recomputed``: (ts_ns, dur_ns) of the GPU work of recomputed
    forward ops, or None; ``known``: positions in ``gpu_rows`` of the activities whose time
    outside recomputed work is summed as ``known_matmul`` (the matmul kernels with known FLOPs)."""
    out, gaps = cut_frames(gpu_rows, recomputed, windows, known)
    for step, a, b in gaps.iter_rows():
        out[step].gaps.append((a, b))
    return out


P2P_LABEL = "pipeline P2P"  # the exposed-communication label of the P2P kernels on a pipeline rank (``cut_frames(p2p_apart=True)``)


def cut_frames(gpu_rows: pl.DataFrame, recomputed: pl.DataFrame | None,
               windows: list[tuple[int, int]], known: pl.Series | None = None, p2p_apart: bool = False,
               side_groups: list[str] | None = None) -> tuple[list[StepCut], pl.DataFrame]:
    """``cut``'s sums (their ``gaps`` left empty) and the idle gaps as one frame: (step, a, b),
    sorted by step and start.  ``p2p_apart``: the P2P kernels' exposed time under ``P2P_LABEL``
    in ``comm_by_group``, not their group's (a pipeline rank's waterfall counts it as bubble); not those of
    ``side_groups`` (P2P that is no pipeline hand-off: ``rank.pipeline.side_groups``)."""
    out = [StepCut(window=max(we - ws, 0)) for ws, we in windows]
    live = [(i, ws, we) for i, (ws, we) in enumerate(windows) if we > ws]
    if not live:
        return out, pl.DataFrame(schema=_NO_GAPS)
    kc = pl.col("kclass").cast(pl.String)
    is_c = ~kc.is_in(list(NON_COMPUTE_KCLASSES))
    is_mm = kc.is_in(list(MATMUL_CLASSES))
    rows = gpu_rows.lazy().select(
        pl.col("ts_ns").alias("s"),
        END.alias("e"),
        is_c.cast(pl.Int32).alias("c"),
        (kc == "comm").cast(pl.Int32).alias("m"),
        kc.is_in(["memcpy", "memset"]).cast(pl.Int32).alias("y"),
        is_mm.cast(pl.Int32).alias("mm"),
        pl.lit(0, pl.Int32).alias("r"),
        pl.when(is_c & ~is_mm).then(kc).alias("nm"),
        pl.when(kc == "comm").then(pl.when(pl.lit(p2p_apart) & pl.col("collective").cast(pl.String).is_in(["send", "recv", "sendrecv"])
                                           & ~pl.col("group").cast(pl.String).fill_null("").is_in(list(side_groups or [])))
                                   .then(pl.lit(P2P_LABEL)).otherwise(comm_label())).alias("cg"),
        (pl.int_range(pl.len(), dtype=pl.UInt32).is_in(known.cast(pl.UInt32).implode()) if known is not None
         else pl.lit(False)).cast(pl.Int32).alias("k"),
    )
    if recomputed is not None and recomputed.height:
        rows = pl.concat(
            [
                rows,
                recomputed.lazy().select(
                    pl.col("ts_ns").alias("s"),
                    END.alias("e"),
                    *(pl.lit(0, pl.Int32).alias(k) for k in ("c", "m", "y", "mm")),
                    pl.lit(1, pl.Int32).alias("r"),
                    pl.lit(None, pl.String).alias("nm"),
                    pl.lit(None, pl.String).alias("cg"),
                    pl.lit(0, pl.Int32).alias("k"),
                ),
            ]
        )
    rows = rows.filter(pl.col("e") > pl.col("s")).collect(engine="in-memory")
    found = rows.select(*(pl.col(p).drop_nulls().unique().implode() for p, _ in _SPLITS)).row(0)
    labels = {p: sorted(v) for (p, _), v in zip(_SPLITS, found)}
    counts = ("c", "m", "y", "mm", "r", "k")
    sign = pl.col("sign")
    deltas = [(pl.col(k) * sign).alias(k) for k in counts] + [
        pl.when(pl.col(p) == lb).then(sign).otherwise(0).alias(f"{p}:{j}")
        for p, _ in _SPLITS for j, lb in enumerate(labels[p])
    ]
    # from here on one lazy query: the cuts, the running counts, the segments of each window
    ends = [
        rows.lazy().select(pl.col("s").alias("t"), pl.lit(1, pl.Int32).alias("sign"), *counts, "nm", "cg"),
        rows.lazy().select(pl.col("e").alias("t"), pl.lit(-1, pl.Int32).alias("sign"), *counts, "nm", "cg"),
    ]
    edges = pl.LazyFrame({"t": [t for _, ws, we in live for t in (ws, we)]}, schema={"t": pl.Int64})
    pts = pl.concat(
        [f.select("t", *deltas, *(pl.col(p).is_not_null().alias(pt) for p, pt in _SPLITS)) for f in ends]
        + [edges],
        how="diagonal",
    )
    sums_of = [*counts, *(f"{p}:{j}" for p, _ in _SPLITS for j in range(len(labels[p])))]
    cuts_of = [pt for _, pt in _SPLITS]
    # the running counts after each cut: a running sum over the points in time order, read at the
    # last point of each time (the points of one time in any order: the sum after all of them is
    # the same); whether a cut of a split is at a time: its running count of them grew there
    # (one sort and running sums, no hash grouping of the ~2 points per activity)
    seg = (
        pts.with_columns(*(pl.col(c).fill_null(0) for c in sums_of), *(pl.col(c).fill_null(False).cast(pl.Int64) for c in cuts_of))
        .sort("t")
        .with_columns(pl.col(*sums_of, *cuts_of).cum_sum())
        .filter((pl.col("t") != pl.col("t").shift(-1)).fill_null(True))
        .with_columns((pl.col(c) > pl.col(c).shift(1, fill_value=0)).alias(c) for c in cuts_of)
        .with_columns((pl.col("t").shift(-1) - pl.col("t")).alias("len"))
        .drop_nulls("len")
    )
    win = pl.LazyFrame(
        {"step": [i for i, _, _ in live], "ws": [ws for _, ws, _ in live], "we": [we for _, _, we in live]},
        schema={"step": pl.Int64, "ws": pl.Int64, "we": pl.Int64},
    )
    bounds = sorted((ws, we) for _, ws, we in live)
    if all(a[1] <= b[0] for a, b in zip(bounds, bounds[1:])):  # the usual case: windows one after another
        seg = (
            seg.join_asof(win.sort("ws"), left_on="t", right_on="ws", strategy="backward")
            .filter(pl.col("step").is_not_null() & (pl.col("t") < pl.col("we")))
            .sort("step", "t")
        )
    else:
        # windows may overlap (a step whose first kernel comes after the next step's): a segment
        # then counts in each window that holds it, as the per-window arithmetic would count it
        seg = seg.join_where(win, pl.col("t") >= pl.col("ws"), pl.col("t") < pl.col("we")).sort("step", "t")
    C, M, Y, MM, R, K = (pl.col(k) > 0 for k in counts)
    r = R & C
    L = pl.col("len")
    seg = seg.with_columns(
        (~C & ~M & ~Y).alias("_idle"),
        pl.when(M & ~C).then(L).otherwise(0).alias("_x"),
        pl.when(C & ~MM & ~r).then(L).otherwise(0).alias("_nm_in"),
    ).collect(engine="in-memory").lazy()
    sums = seg.group_by("step").agg(
        pl.when(C).then(L).otherwise(0).sum().alias("compute"),
        pl.when(M).then(L).otherwise(0).sum().alias("comm"),
        pl.when(Y).then(L).otherwise(0).sum().alias("memcpy"),
        pl.col("_x").sum().alias("exposed_comm"),
        pl.when(Y & ~C & ~M).then(L).otherwise(0).sum().alias("exposed_memcpy"),
        pl.when(r).then(L).otherwise(0).sum().alias("recompute"),
        pl.when(MM & ~r).then(L).otherwise(0).sum().alias("matmul"),
        pl.when(K & ~R).then(L).otherwise(0).sum().alias("known_matmul"),
    )
    gaps = (
        seg.select("step", "t", "len", "_idle")
        .with_columns((pl.col("_idle") != pl.col("_idle").shift(1).over("step")).fill_null(True).cum_sum().alias("_run"))
        .filter(pl.col("_idle"))
        .group_by("step", "_run")
        .agg(pl.col("t").min().alias("a"), (pl.col("t") + pl.col("len")).max().alias("b"))
        .sort("step", "a")
        .select(pl.col("step").cast(pl.Int64), "a", "b")
    )
    splits = [(p, pt, inside, attr) for (p, pt), inside, attr in ((_SPLITS[0], "_nm_in", "non_matmul"), (_SPLITS[1], "_x", "comm_by_group"))
              if labels[p]]
    share_queries = [q for p, pt, inside, _ in splits for q in _share_queries(seg, p, pt, inside, len(labels[p]))]
    sums, gaps, *shared = pl.collect_all([sums, gaps, *share_queries], engine="in-memory")  # one batch
    for row in sums.iter_rows(named=True):
        o = out[row.pop("step")]
        for k, v in row.items():
            setattr(o, k, int(v))
    for j, (p, _, _, attr) in enumerate(splits):
        for step, shares in _shares(shared[2 * j], shared[2 * j + 1], labels[p]).items():
            setattr(out[step], attr, shares)
    return out, gaps


def _share_queries(seg: pl.LazyFrame, p: str, pt: str, inside: str, n_labels: int) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Per step, the ``inside`` time split among the labels of split ``p``: segments are
    grouped between consecutive cuts of the split (its label counts are constant there).  Two
    queries: each step's integer shares per label, and the remainders (step, _rest, counts) of
    the groups whose length does not divide evenly (``_shares`` puts them together)."""
    cnt = [f"{p}:{j}" for j in range(n_labels)]
    groups = (
        seg.select("step", pt, inside, *cnt)
        .with_columns(pl.col(pt).cum_sum().over("step").alias("_g"))
        .group_by("step", "_g")
        .agg(pl.col(inside).sum().alias("_len"), *(pl.col(c).first() for c in cnt))
        .filter(pl.col("_len") > 0)
    )
    n = pl.sum_horizontal(*cnt)
    groups = groups.with_columns(n.alias("_n")).filter(pl.col("_n") > 0)
    share = [(pl.col("_len") * pl.col(c) // pl.col("_n")).alias(c) for c in cnt]
    groups = groups.select("step", "_len", "_n", *cnt, *(s.alias(f"_s{j}") for j, s in enumerate(share)))
    groups = groups.with_columns((pl.col("_len") - pl.sum_horizontal(*(f"_s{j}" for j in range(len(cnt))))).alias("_rest"))
    per = groups.group_by("step").agg(*(pl.col(f"_s{j}").sum() for j in range(len(cnt))))
    return per, groups.filter(pl.col("_rest") > 0).select("step", "_rest", *cnt)


def _shares(per: pl.DataFrame, rest: pl.DataFrame, labels: list[str]) -> dict[int, dict[str, int]]:
    """``_share_queries``' two results as {step: {label: ns}}: the remainders go to the label
    with most activities in their group, then the greatest label."""
    out: dict[int, dict[str, int]] = {}
    for row in per.iter_rows():
        out[row[0]] = {lb: int(v) for lb, v in zip(labels, row[1:])}
    # the remainders (a segment shared by several activities whose length does not divide evenly)
    for row in rest.iter_rows():
        step, r, cs = row[0], row[1], row[2:]
        top = max((c, lb) for c, lb in zip(cs, labels) if c > 0)[1]
        out[step][top] += r
    return {s: {k: v for k, v in d.items() if v} for s, d in out.items()}
