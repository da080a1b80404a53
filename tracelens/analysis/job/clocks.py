"""The ranks' clocks: an offset per file that puts its times on the reference file's clock.

Ranks' clocks differ (other hosts, other clock bases), so each file gets an offset that makes the
*ends* of shared collectives coincide (a collective ends on all ranks at once); the offsets are
reported, never written into the events.  The alignment reads only the collective rows
(``COLLECTIVE_SCHEMA``) and each rank's step starts (``rank.collectives.step_starts``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl

from tracelens.analysis.job.collectives import MIN_OVERLAP, P2P, ROOTED


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


def align_clocks(rows: pl.DataFrame, steps: pl.DataFrame, n_files: int, derived: frozenset[int] = frozenset(),
                 bounds: dict[tuple[int, int], tuple[int | None, int | None]] | None = None) -> ClockAlignment:
    """Offsets that make shared collectives (``rows``: the collective rows of every file) end
    together, else same-named steps (``steps``: file, name, start_ns) start together; file 0 is
    the reference.  Where either file's sequence numbers are derived (``derived``: from per-rank
    order, which can pair different collectives), only the matches that agree set the offset
    (``_derived_offset``); when none agree beyond chance the file is ``unordered`` (its derived
    matches are all refused) and its offset comes from the steps.  P2P rows (send, recv) set no
    offset; ``bounds`` (``p2p_bounds``) keep the offsets of the files aligned by step starts, or not
    at all, within what their P2P pairs allow.  One join of the reference's
    collectives with every other file's, one aggregation over the files."""
    if n_files <= 1:
        return ClockAlignment({0: 0}, "none", {0: 0})
    key = ["group", "seq", "collective"]
    # a send and its recv are a pair between two ranks, not a rendezvous of a group: they set no
    # offset (at most they bound it: ``p2p_bounds``)
    rows = rows.filter(~pl.col("collective").is_in(list(P2P)))
    ends = rows.group_by(["file"] + key).agg(pl.col("end_ns").max().alias("end"),
                                             (pl.col("end_ns").max() - pl.col("start_ns").min()).alias("span"), pl.col("on_host").any())
    found: dict[int, tuple[int, int, tuple[int, int]]] = {}  # file -> (offset, spread, support)
    unordered: set[int] = set()
    ref_file = 0
    if not ends.filter(pl.col("file") == 0).height:
        ref_file = ends.get_column("file").min() if ends.height else None
    if ref_file is not None:
        ref = ends.filter(pl.col("file") == ref_file).drop("file")
        pairs = ref.join(ends.filter((pl.col("file") >= 1) & (pl.col("file") < n_files)).rename({"file": "f"}), on=key, suffix="_o")
        is_derived = pl.col("f").is_in(sorted(derived)) | pl.lit(ref_file in derived)
        d = pl.col("end") - pl.col("end_o")
        med = d.median().cast(pl.Int64)  # (int() of the median: towards zero)
        plain = (pairs.filter(~is_derived).group_by("f")
                 .agg(med.alias("off"), (d - med).abs().median().cast(pl.Int64).alias("spread"), pl.len().alias("n")))
        for f, off, spread, n in plain.iter_rows():  # one row per file
            found[f] = (off, spread, (n, n))
        for (f,), pair in pairs.filter(is_derived).partition_by("f", as_dict=True).items():  # each derived file on its own
            got = _derived_offset(pair)
            if got is None:  # the per-rank order pairs different collectives: no offset from them
                found[f] = (None, None, (0, pair.height))
                unordered.add(f)
            else:
                found[f] = (got[0], got[1], (got[2], pair.height))
    offsets, spread, support = {0: 0}, {0: 0}, {}
    for f in sorted(found):  # in file order, as the warnings name them
        off, sp, sup = found[f]
        support[f] = sup
        if off is not None:
            offsets[f], spread[f] = off, sp
    by_coll = set(offsets) - {0}
    by_step: set[int] = set()
    if len(offsets) < n_files:  # fall back to step starts for files without shared collectives
        r0 = steps.filter(pl.col("file") == 0).select("name", "start_ns")
        others = steps.filter((pl.col("file") >= 1) & (pl.col("file") < n_files) & ~pl.col("file").is_in(sorted(offsets)))
        d = pl.col("start_ns") - pl.col("start_ns_o")
        by_name = (r0.join(others.rename({"file": "f"}), on="name", suffix="_o").group_by("f")
                   .agg(d.median().cast(pl.Int64).alias("off"), (d - d.median()).abs().median().cast(pl.Int64).alias("spread"))
                   .sort("f"))
        for f, off, sp in by_name.iter_rows():  # one row per file
            offsets[f], spread[f] = off, sp
            by_step.add(f)
        for f in range(n_files):
            offsets.setdefault(f, 0)
            spread.setdefault(f, 0)
    bounded: set[int] = set()
    if bounds:
        bounded = _within_bounds(offsets, set(range(n_files)) - by_coll - {0}, bounds, soft=by_step)
    # how the other files were put on the reference's clock (a file neither way keeps its own)
    method = ("none" if not (by_coll or by_step or bounded) else "step starts" if not by_coll
              else "collective ends" if not by_step else "collective ends, step starts")
    if bounded:
        method = "P2P bounds" if method == "none" else f"{method}, P2P bounds"
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


def p2p_bounds(pairs: dict[int, dict[str, list]], file_of: dict[int, int]) -> dict[tuple[int, int], tuple[int | None, int | None]]:
    """Per pair of files (a, b), a < b, the range [lo, hi] of off_b - off_a (the offsets that put
    them on one clock) their P2P pairs allow: a recv cannot end before its send starts.  ``pairs``:
    file -> its P2P records keyed for pairing (``analysis.rank.pipeline._pair_keys``: what, peer
    (a global rank), step, k, s, e); ``file_of``: global rank -> file.  The k-th send of a step to
    a peer is paired with the peer's k-th recv of that step from the sender.  A pair of files
    whose bounds contradict each other (lo > hi: the records do not pair so) gets none."""
    frames = [pl.DataFrame(d).with_columns(pl.lit(f, pl.Int64).alias("file")) for f, d in pairs.items() if d and d.get("what")]
    if not frames:
        return {}
    recs = pl.concat(frames, how="vertical_relaxed").with_columns(
        pl.col("peer").replace_strict(list(file_of), list(file_of.values()), default=None, return_dtype=pl.Int64).alias("peer_file"))
    sends = recs.filter((pl.col("what") == "send") & pl.col("peer_file").is_not_null()).select(
        pl.col("file").alias("a"), pl.col("peer_file").alias("b"), "step", "k", pl.col("s").alias("send_s"))
    recvs = recs.filter(pl.col("what") == "recv").select(
        pl.col("peer_file").alias("a"), pl.col("file").alias("b"), "step", "k", pl.col("e").alias("recv_e"))
    # (a sends to b) off_b - off_a >= send_s - recv_e
    got = (sends.join(recvs, on=["a", "b", "step", "k"]).filter(pl.col("a") != pl.col("b"))
           .group_by("a", "b").agg((pl.col("send_s") - pl.col("recv_e")).max().alias("lo")))
    out: dict[tuple[int, int], list] = {}
    for a, b, lo in got.iter_rows():
        if a < b:
            out.setdefault((a, b), [None, None])[0] = lo
        else:  # off_a - off_b >= lo: off_b - off_a <= -lo
            out.setdefault((b, a), [None, None])[1] = -lo
    return {k: (lo, hi) for k, (lo, hi) in out.items() if lo is None or hi is None or lo <= hi}


def _within_bounds(offsets: dict[int, int], free: set[int], bounds: dict[tuple[int, int], tuple[int | None, int | None]],
                   soft: set[int] | frozenset[int] = frozenset()) -> set[int]:
    """Move the ``free`` files' offsets (in place) into the ranges their P2P pairs allow with the
    files already placed, outward from those fixed (the reference, the files aligned by
    collectives); a file with no estimate of its own (offset 0 from no source) keeps 0 where the
    range holds it.  A ``soft`` estimate (step starts) outside the range is dropped (the file
    goes back to its own clock, 0, then into the range): a pipeline's ranks start their steps
    apart by the schedule (a V-shaped one's first rank ends each step with the last stage's
    weight grads), which the pairs then contradict, and no clock differs for it.  The files it
    moved or placed."""
    placed = set(offsets) - free
    moved: set[int] = set()
    todo = set(free)
    while todo:
        step = None
        for f in sorted(todo):
            lo, hi = None, None
            for (a, b), (bl, bh) in bounds.items():
                if b == f and a in placed:  # off_f - off_a in [bl, bh]
                    nl, nh = (None if bl is None else offsets[a] + bl), (None if bh is None else offsets[a] + bh)
                elif a == f and b in placed:  # off_b - off_f in [bl, bh]: off_f in [off_b - bh, off_b - bl]
                    nl, nh = (None if bh is None else offsets[b] - bh), (None if bl is None else offsets[b] - bl)
                else:
                    continue
                lo = nl if lo is None else (lo if nl is None else max(lo, nl))
                hi = nh if hi is None else (hi if nh is None else min(hi, nh))
            if lo is None and hi is None:
                continue
            step = f
            was = cur = offsets.get(f, 0)
            if f in soft and ((lo is not None and cur < lo) or (hi is not None and cur > hi)):
                cur = 0  # the step starts contradict the pairs: no estimate
            new = min(max(cur, lo if lo is not None else cur), hi if hi is not None else cur)
            if lo is not None and hi is not None and lo > hi:
                new = was
            if new != was:
                offsets[f] = new
                moved.add(f)
            break
        if step is None:
            break
        todo.discard(step)
        placed.add(step)
    return moved
