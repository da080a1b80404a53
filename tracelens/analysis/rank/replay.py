"""What-if replay on the critical-path graph (issue 17, Must 4; MFU.md 7.2, Daydream-style).

The graph is critical.py's (``critical.graph``: every event's start and end, every candidate
dependency with its ``kind``).  The replay gives each node a new time ``T``: the latest over its
in-edges of ``T(u) + w``, where ``w`` is the edge's weight after the change.  The weights:

* an event keeps its intrinsic duration: a thread's interval between two of its points (host
  work, untraced host time), an activity's duration, each scaled or removed by the change;
* a dependency keeps its observed delay when it is the one the node waited for (its
  last-arriving in-edge, the one the critical path follows): a launch's latency to a kernel
  that started when launched, the gap between back-to-back kernels on a stream, a blocking
  call's return after what it waited for;
* a dependency that was *not* waited for keeps only the typical delay of its kind (the rank's
  median over the edges of that kind that were waited for) or its observed gap if shorter: a
  queued kernel starts that long after its launch or the previous kernel, whichever is later;
* waits shrink: a blocking call (a synchronize, a blocking copy) that waited for the GPU keeps,
  on its thread, only its return lag after what it waited for, so it ends when that ends plus
  the lag (so does a thread point that waited for another thread: the autograd hand-off, a
  fwdbwd flow, a host collective the idle step thread waited for).  So a kernel starts at max(launch + latency, previous kernel on its stream's end,
  recorded event), and a sync ends when what it waits for ends.

With no change every node's ``T`` is its observed time exactly (the waited-for edge of every node
carries the observed gap, every other edge no more): the identity replay reproduces each step's
time.  Every edge's weight only shrinks under a change, so ``T <= t``.

**Steps.**  Each step window [t0, t1] is replayed on its own, from the observed state at t0: the
nodes before t0 keep their times; the window's nodes are replayed.  The predicted step time is
the window's makespan: its measured time, less how much earlier its last node (the one the
critical path ends at) is, plus how much earlier its first node is.  A step's lead-in (data
loading of the next step, the host's launches) is inside the window before the next step's first
kernel, so a change there shows in this step.

**Longest path.**  Every node is on one chain (a host thread, or a stream: start, end, start,
...).  Along a chain ``T(v) = max(X(v), T(prev) + w)`` is a running maximum: with ``W`` the
chain's prefix sum of weights, ``T = W + cum_max(X - W)`` per chain segment, one running maximum
for all chains of all steps at once (each segment lifted above the ones before it).  ``X`` (the
cross-chain edges: launches, syncs, event waits, returns, the autograd hand-off and flows, host
collectives) takes the previous round's ``T``; rounds repeat until nothing changes (as many as
there are host/GPU hand-offs on a step's longest dependency chain: 1 to 33 on the shared traces).  No Python loop
per event: a round is a few gathers, a scatter per layer of cross edges (a node's j-th edge: one
layer for nearly every node) and the scan, on the *key rows* only: those a cross edge enters or
leaves, those with their own time or a chain edge from before the window, the windows' ends (19 k
of control.json.gz's 150 k window rows).  A row between two key rows of its chain segment adds
nothing to the running maximum (no ``X``) and nothing reads it, so ``T`` at a key row is ``W`` plus
the running maximum of ``X - W`` over the segment's key rows before it: the same numbers.  ``W``
itself is one running sum of the chain edges' weights in chain order (a segment is a run of it),
read at the key rows.  The key rows are found by node and only they are placed in their windows
(the graph contracted to them: no frame of every window row is built).  Cost on control.json.gz
(35 MB, 160 k edges, 6 steps; CPU time, median of 11, 2 loaded cores): ~27 ms to prepare the rank
once (``Replay``; ~40 when every window row was built, sorted and filtered), 4 to 15 ms per change
(the weights ~1 ms; 2 to 32 rounds of ~0.4 ms); before the key rows, 78 ms and 22 to 81 ms.  rustworkx 0.18 on the same graph: 138 ms to build
it from Python tuples (per change: the weights are the edges' payloads) and 34 ms for one
``dag_longest_path_length``, one number for the whole trace, where the replay needs each step's
window replayed from its observed start (every node's time): not faster, so not a dependency.

**Suggestions.**  ``suggest.WHAT_IF`` maps rules to changes (input-bound: ``data_loading=0``;
host launch / launch latency: ``launch=0``; exposed communication: ``comm=0``; exposed memcpy:
``memcpy=0``; non-matmul: ``kclass[<the non-matmul classes>]=0``); a rank replays those of the
rules it triggers (``suggest.changes_for``) and the suggestion carries ``what_if``, next to its
upper bound ``1 / (1 - bar)``: the bound counts the bar's time as removable, the replay only
the part of it on the path (control.json.gz: non-matmul kernels up to 1.75x, replayed 1.01x: the
steps are host-bound).  A rank's replay is of that rank alone: in a job whose ranks wait for each
other at collectives, a rank that waited for a later one has the wait inside its NCCL kernels
(``comm=0`` would remove it), and its faster kernels do not make the later rank arrive sooner; so
there the suggestion's ``what_if`` is the job's, on its stitched path (``suggest.what_if``), or
none where the path cannot be stitched.

**Validation** (tests/test_replay.py).  The identity replay reproduces every step of every
shared trace with kernels exactly.  ResNet-50 ``num_workers_0`` (164.05 ms) with data loading
removed predicts 118.5 ms where ``num_workers_4`` measures 132.38 ms (-10.5%): in that run the
same host ops take 21.7% longer (its 4 worker processes share the CPU), which one trace cannot
show; with the host slowed by that measured factor (``host/0.822``) the replay is within 5%.
A recorded CPU DataLoader pair (a sleep per sample vs none) is predicted within 5%.

**Changes** (``Change.parse``; the ``change`` strings of the report's ``what_if``; ``parse``
takes several joined by ``+``, applied in turn):

* ``data_loading=0`` host time inside DataLoader spans takes no time;
* ``comm=0`` communication kernels take no time (exposed communication fully overlapped);
  ``comm/K`` K x faster; ``comm[REGEX]/K`` only the collectives whose kernel name matches
  (e.g. ``comm[AllReduce]/2``);
* ``launch=0`` launch gaps closed (CUDA graphs): kernel launch calls take no host time and
  their kernels start with no launch latency;
* ``kclass[gemm,conv]/K`` compute kernels of those classes K x faster (``=0``: removed);
  ``kernel[REGEX]/K`` the kernels whose name matches;
* ``memcpy=0`` copies and fills take no time;
* ``host/K`` host work (CPU ops, untraced host time, launch calls; not data loading, not waits)
  K x faster (K < 1: slower, e.g. a CPU shared with DataLoader workers);
* ``rank_late[R,..]=0`` (those ranks' lateness at collectives removed) needs the cross-rank
  edges: the job reduce computes it on the stitched path (``critical.rank_late``; the straggler
  suggestion's ``what_if``); ``Change.parse`` accepts it, ``Replay.run`` leaves a rank's steps unchanged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import polars as pl

from tracelens.analysis.rank import critical
from tracelens.model.schema import KCLASSES

IDX = critical.IDX

WHATS = ("data_loading", "comm", "launch", "kclass", "kernel", "memcpy", "host", "rank_late")
NEG = -(1 << 60)  # no dependency (kept far from int64's limits: times are relative to the trace's first node)
MAX_ROUNDS = 100_000  # a safety cap: the rounds needed are the host/GPU hand-offs on one step's chain
LIFT_MAX_SEGMENTS = 1 << 18  # the one running maximum lifts each chain segment above the ones before it up to this many segments


@dataclass(frozen=True)
class Change:
    """What the replay changes: ``what`` one of data_loading, comm, launch, kclass, kernel, memcpy,
    rank_late; ``target`` the classes (kclass) or a name regex (comm, kernel); ``factor`` how
    many times faster (``math.inf``: takes no time)."""

    what: str
    target: tuple[str, ...] | str | None = None
    factor: float = math.inf

    _RE = re.compile(r"^(?P<what>[a-z_]+)(\[(?P<target>[^\]]*)\])?(?P<op>=0|/(?P<k>[0-9.]+))$")

    @classmethod
    def parse(cls, text: str) -> Change:
        m = cls._RE.match(text.strip())
        if not m or m["what"] not in WHATS:
            raise ValueError(f"not a change: {text!r} (e.g. data_loading=0, comm=0, comm[AllReduce]/2, launch=0, kclass[gemm]/2, kernel[REGEX]/2)")
        factor = math.inf if m["op"] == "=0" else float(m["k"])
        if not factor > 0:
            raise ValueError(f"{text!r}: the factor must be positive")
        what, target = m["what"], m["target"]
        if what in ("kclass",) and not target:
            raise ValueError(f"{text!r}: kclass needs classes, e.g. kclass[gemm,conv]/2")
        if what == "kernel" and not target:
            raise ValueError(f"{text!r}: kernel needs a name regex, e.g. kernel[gemm]/2")
        if what == "host" and (target or factor == math.inf):
            raise ValueError(f"{text!r}: host takes a factor only, e.g. host/2 (twice as fast), host/0.8 (slower)")
        if what in ("data_loading", "launch", "memcpy") and (target or factor != math.inf):
            raise ValueError(f"{text!r}: {what} takes no target and only =0")
        if what == "rank_late" and (factor != math.inf or (target and not re.fullmatch(r"\d+(,\d+)*", target.replace(" ", "")))):
            raise ValueError(f"{text!r}: rank_late takes only =0 and optionally ranks, e.g. rank_late[1]=0")
        tgt = tuple(c.strip() for c in target.split(",")) if what in ("kclass", "rank_late") and target else target
        return cls(what, tgt, factor)

    def __str__(self) -> str:
        t = f"[{','.join(self.target)}]" if isinstance(self.target, tuple) else f"[{self.target}]" if self.target else ""
        k = "=0" if self.factor == math.inf else f"/{self.factor:g}"
        return f"{self.what}{t}{k}"


def _scale(dur: pl.Expr, factor: float) -> pl.Expr:
    return pl.lit(0, pl.Int64) if factor == math.inf else (dur.cast(pl.Float64) / factor).round(0).cast(pl.Int64)


class Replay:
    """One rank's graph made ready for replays (the parts that no change alters: which edge each
    node waited for, the window's nodes, the chains' segments, the cross edges' rows); ``run``
    replays one set of changes."""

    def __init__(self, df: pl.DataFrame, g, windows: list[tuple[int, int]], main_tid: int | None):
        self.df, self.windows = df, windows
        self.measured = [max(e - s, 0) for s, e in windows]
        self.Q = None
        if g is None or not windows:
            return
        nodes, last = g.nodes, g.last
        n = nodes.height
        t_abs = nodes.get_column("t")
        base = int(t_abs.min())
        t = t_abs - base  # relative: no overflow near NEG
        kind = pl.col("kind")  # (an Enum: compared with strings as they are)
        # every candidate edge (row ``ei``); the one each node waited for is its last-arriving one,
        # which the critical path computed (``bind``; its kind and source time gathered onto the
        # node's other edges): no sort of the edges here
        e = g.edges()
        v, u = e.get_column("v"), e.get_column("u")
        # (gathers by index-typed Series, ``a[i]``: no cast or query per gather)
        vx, ux = v.cast(critical.IDX), u.cast(critical.IDX)
        e = e.with_columns(t[vx].alias("tv"), t[ux].alias("tu"),
                           (last["ei"][vx] == pl.int_range(0, e.height, dtype=pl.Int64, eager=True)).alias("bind"),
                           last["kind"][vx].alias("bkind"), t[last["u"][vx].cast(critical.IDX)].alias("btu")).with_row_index("ei")
        e = e.with_columns((pl.col("tv") - pl.col("tu")).alias("gap"))
        # (only the kinds that take it: not the thread and act edges, most of the bound ones)
        typical = dict(e.filter(pl.col("bind") & ~kind.is_in(["thread", "act"])).group_by("kind").agg(pl.col("gap").median()).select(pl.col("kind").cast(pl.String), "gap").iter_rows())

        # per kind (by its Enum code): its typical delay (thread and act edges never take it)
        typ = pl.Series([int(typical.get(k) or 0) for k in critical.EDGE_KINDS], dtype=pl.Int64)
        blocked = pl.col("bkind").is_in(["sync", "return_sync", "handoff", "coll_wait", "flow"]) & ~pl.col("bind")
        w = (pl.when(kind == "thread").then(pl.when(blocked).then(pl.col("tv") - pl.col("btu")).otherwise(pl.col("gap")))
             .when((kind == "act") | pl.col("bind")).then(pl.col("gap"))
             .otherwise(pl.min_horizontal(pl.col("gap"), pl.lit(typ).gather(kind.to_physical()))))
        self.e = e.with_columns(w.alias("w")).select("ei", "v", "u", "kind", "cat", "owner", "gap", "w")
        chain_kinds = ["thread", "act", "stream"]
        ch = self.e.filter(kind.is_in(chain_kinds)).select("v", pl.col("u").alias("cu"), pl.col("ei").alias("ci"))
        cross = self.e.filter(~kind.is_in(chain_kinds)).select("v", "u", "ei")
        # each node's chain: its thread, or its stream (a stream's points in activity order: start, end, ...);
        # its chain edge (``cu``, ``ci``: a node has at most one, thread, act or stream) scattered by node
        chv = ch.get_column("v")
        cu_n = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(chv, ch.get_column("cu"))
        ci_n = pl.repeat(None, n, dtype=pl.UInt32, eager=True).scatter(chv, ch.get_column("ci"))
        # the nodes in chain order (a chain segment of a window, the window's points of one chain each
        # after the one before it on its chain, is a run of it)
        act = self.e.filter(kind == "act")
        cpord = _chain_order(nodes, g.chain, act.get_column("u"), act.get_column("v"), cu_n)
        cprank = pl.repeat(0, n, dtype=pl.UInt32, eager=True).scatter(cpord, pl.int_range(0, n, dtype=pl.UInt32, eager=True))
        has_in = last["u"].is_not_null()  # a node with any candidate in-edge has a last-arriving one
        tcu_n = t[cu_n.fill_null(0).cast(critical.IDX)]
        # the window's nodes: the points at t0..t1 (t is non-decreasing in the node order); a node at
        # a boundary is in both windows, replayed in each
        win = pl.DataFrame({"k": range(len(windows)), "t0": [s - base for s, _ in windows], "t1": [x - base for _, x in windows]},
                           schema={"k": pl.Int64, "t0": pl.Int64, "t1": pl.Int64})
        win = win.with_columns(t.search_sorted(win.get_column("t0"), side="left").cast(pl.Int64).alias("lo"),
                               t.search_sorted(win.get_column("t1"), side="right").cast(pl.Int64).alias("hi"))
        lo, hi, t0s = win.get_column("lo"), win.get_column("hi"), win.get_column("t0")
        if int((hi - lo).clip(lower_bound=0).sum()) == 0:
            return
        # each window's first and last node the makespan is read at (a device point or one on the step thread)
        ok_o = pl.int_range(0, n, dtype=pl.Int64, eager=True)
        if main_tid is not None:
            ok_o = ok_o.filter(nodes.select(pl.col("dev") | (pl.col("tid") == main_tid).fill_null(False)).to_series())
        ia, iz = ok_o.search_sorted(lo, side="left"), ok_o.search_sorted(hi, side="left").cast(pl.Int64) - 1
        ends = pl.DataFrame({"k": win.get_column("k"), "a": ok_o.gather(ia.clip(upper_bound=max(ok_o.len() - 1, 0))) if ok_o.len() else ia,
                             "z": ok_o.gather(iz.clip(0, max(ok_o.len() - 1, 0))) if ok_o.len() else iz,
                             "_ok": (ia.cast(pl.Int64) <= iz) & (hi > lo)}).filter(pl.col("_ok")).drop("_ok")
        # the rounds run on the key rows only: those a cross edge enters or leaves, those with their own
        # time or a chain edge from before the window, the windows' ends.  Along a chain segment the other
        # rows add nothing to the running maximum (no X), and no round reads them: T at a key row is
        # W + cum_max(X - W) over the segment's key rows up to it, the same number (exact).  The key
        # nodes are found by node (a window's start between a node and its chain edge's source: a chain
        # edge from before some window), then placed in the windows that hold them (a node that is key
        # in one window and not in another is a key row there too: it adds a row, not a number)
        # (how many windows start at or before each node, t being non-decreasing in the node order: a running count)
        starts_at = pl.DataFrame({"lo": lo}).filter(pl.col("lo") < n).group_by("lo").len()
        before = pl.repeat(0, n, dtype=pl.UInt32, eager=True).scatter(starts_at.get_column("lo"), starts_at.get_column("len")).cum_sum()
        crosses = cu_n.is_not_null() & (before > before.gather(cu_n.fill_null(0)))
        key = (~has_in) | crosses
        for c in (cross.get_column("v"), cross.get_column("u"), ends.get_column("a"), ends.get_column("z")):
            key = key.scatter(c, True)
        kn = cpord.filter(key.gather(cpord))  # the key nodes in chain order
        # the windows that hold each (a run of k: from the first whose last node is at or after it to
        # the last whose first is at or before it), window by window, each in chain order
        Q = pl.DataFrame({"o": kn.cast(pl.Int64)}).with_columns(
            pl.int_ranges(pl.Series(hi.search_sorted(kn.cast(pl.Int64), side="right")).cast(pl.Int64),
                          pl.Series(lo.search_sorted(kn.cast(pl.Int64), side="right")).cast(pl.Int64)).alias("k")).explode("k") \
            .filter(pl.col("k").is_not_null()).sort("k", maintain_order=True)
        if Q.height == 0:
            return
        qo = Q.get_column("o").cast(critical.IDX)
        qk = Q.get_column("k")
        Q = Q.with_columns(pl.Series("t", t[qo]), pl.Series("tcu", tcu_n[qo]), pl.Series("ci", ci_n[qo]),
                           pl.Series("hin", has_in[qo]), pl.Series("_cu", cu_n[qo].is_not_null()), pl.Series("t0", t0s.gather(qk)),
                           pl.Series("_cp", cprank[qo]))
        Q = Q.with_columns((pl.col("_cu") & (pl.col("tcu") >= pl.col("t0"))).alias("_ln"),
                           (pl.col("_cu") & (pl.col("tcu") < pl.col("t0"))).alias("_out"))
        Q = Q.with_columns((~pl.col("_ln")).cum_sum().alias("seg"),
                           pl.when(~pl.col("_ln")).then(pl.col("_cp")).forward_fill().alias("_cs0"))
        # (k, chain rank) of each key row, ascending: a (window, node) pair's row by search_sorted
        rowkey = Q.select(pl.col("k") * n + pl.col("_cp").cast(pl.Int64)).to_series()

        def row_of(k: pl.Series, o: pl.Series) -> pl.Series:
            return rowkey.search_sorted(k * n + cprank.gather(o).cast(pl.Int64), side="left").cast(pl.UInt32)

        # cross edges into the window's nodes: from a node in the window (by its row) or from before it (fixed)
        vs = cross.get_column("v")
        ce = cross.with_columns(pl.int_ranges(pl.Series(hi.search_sorted(vs, side="right")).cast(pl.Int64),
                                              pl.Series(lo.search_sorted(vs, side="right")).cast(pl.Int64)).alias("k")).explode("k") \
            .filter(pl.col("k").is_not_null())
        k = ce.get_column("k")
        u = ce.get_column("u")
        inside_u = u >= lo.gather(k)
        ce = ce.with_columns(row_of(k, ce.get_column("v")).alias("vi"),
                             row_of(k, u).zip_with(inside_u, pl.Series([None], dtype=pl.UInt32)).alias("ui"),
                             pl.Series("tu", t.gather(u)))
        self.fixed = ce.filter(pl.col("ui").is_null()).select("vi", "tu", "ei")
        self.live = ce.filter(pl.col("ui").is_not_null()).select("vi", "ui", "ei")
        ek = ends.get_column("k")
        self.ends = ends.with_columns(row_of(ek, ends.get_column("a")).alias("a"), row_of(ek, ends.get_column("z")).alias("z")).sort("k")
        self.Q = Q.select("t", "tcu", "ci", "hin", "_out", "seg")
        # W (the chain's prefix sum of weights within the segment) at a key row: the chain edges' weights
        # summed in chain order, from the segment's first row (excluded) to it
        self.cq, self.cs0 = Q.get_column("_cp"), Q.get_column("_cs0")
        self.chain_ci = ci_n.gather(cpord)  # by chain rank: the node's chain edge (null: none)
        # the cross edges in layers, each a node's j-th edge: a layer takes its edges by one scatter (nearly all nodes have one)
        self.layers = _layers(self.live, "ui")
        self.flayers = _layers(self.fixed, "tu")

    def _names(self, pattern: str) -> pl.Series:
        """Per edge: whether its event's name matches ``pattern`` (tested once per distinct name; no event: False)."""
        if not hasattr(self, "_nm"):
            from tracelens.analysis.rank.names import Names

            self._nm = Names(self.df)
        hit = self.df.select(self._nm.like(pattern).fill_null(False)).to_series()
        rows = self.e.get_column("owner")
        return hit[rows.fill_null(0)] & rows.is_not_null()

    def _kernel(self) -> pl.Series:
        """Per edge: whether its event is a kernel."""
        if not hasattr(self, "_kn"):
            rows = self.e.get_column("owner")
            self._kn = (self.df.get_column("kind") == "kernel")[rows.fill_null(0)] & rows.is_not_null()
        return self._kn

    def weights(self, changes: tuple[Change, ...]) -> pl.Series:
        """Each edge's weight (by ``ei``) under ``changes``, applied in turn (module docstring)."""
        e = self.e
        kind = pl.col("kind")
        cat = pl.col("cat")  # (an Enum: compared with strings as they are, no string per edge)
        act = kind == "act"
        for change in changes:
            if change.what == "data_loading":
                rule = pl.when((kind == "thread") & (cat == "data_loading")).then(0)
            elif change.what == "launch":
                kernel_call = pl.lit(self._names(r"(?i)launch"))  # kernel (and graph) launches, not copies
                rule = (pl.when((kind.is_in(["thread", "launch"])) & (cat == "launch_overhead") & kernel_call).then(0)
                        .when(kind == "return_launch").then(NEG))  # the call no longer waits for its kernel
            elif change.what == "host":  # host work (ops, untraced host time, launch calls) K x faster; not waits, not data loading
                rule = pl.when((kind == "thread") & cat.is_in(["cpu", "launch_overhead"])).then(_scale(pl.col("w"), change.factor))
            else:
                if change.what == "comm":
                    sel = cat == "exposed_comm"
                    if change.target:
                        sel = sel & pl.lit(self._names(change.target))
                elif change.what == "kclass":
                    known = [c for c in (f"compute_{k}" for k in change.target) if c in critical.CAT_NAMES]
                    sel = cat.is_in(known) & pl.lit(self._kernel())
                elif change.what == "kernel":
                    sel = pl.lit(self._kernel()) & pl.lit(self._names(change.target))
                else:
                    sel = cat == "memcpy"
                rule = pl.when(act & sel).then(_scale(pl.col("gap"), change.factor))
            e = e.with_columns(rule.otherwise(pl.col("w")).alias("w"))
        return e.get_column("w")

    def run(self, change: Change | tuple[Change, ...] | None) -> tuple[list[int], int]:
        """Each window's predicted time with ``change`` applied (None or (): the identity replay),
        and the rounds the longest-path relaxation took."""
        changes = () if change is None else (change,) if isinstance(change, Change) else tuple(change)
        # rank_late (a rank's lateness at collectives removed) needs the cross-rank edges: the hook is here, the edges are not
        changes = tuple(c for c in changes if c.what != "rank_late")
        if self.Q is None:
            return list(self.measured), 0
        w = self.weights(changes)
        Q = self.Q  # the key rows (see __init__): the rounds run on them
        # W: the chain's prefix sum of weights within its segment (a running sum over all rows, less its value at the segment's start)
        cs = w[self.chain_ci].fill_null(0).cum_sum()
        W = cs[self.cq] - cs[self.cs0]
        # what reaches the node from before the window (fixed at its observed time) or, for a node with no dependency, its own time
        X0 = Q.with_columns(w[Q.get_column("ci").fill_null(0)].alias("cw")).select(
            pl.when(pl.col("_out")).then(pl.col("tcu") + pl.col("cw")).when(~pl.col("hin")).then(pl.col("t")).otherwise(NEG)).to_series()
        # (an edge the change removed weighs NEG: it never wins a maximum)
        for vi, tu, ei in self.flayers:
            a, b = X0[vi], tu + w[ei]
            X0 = X0.scatter(vi, a.zip_with(a >= b, b))
        layers = [(vi, ui, w[ei]) for vi, ui, ei in self.layers]
        seg, t = Q.get_column("seg"), Q.get_column("t")
        # the running maximum per chain segment as one running maximum: each segment's values lifted
        # above the ones before it (when the trace's span and its segments leave room in int64)
        lift = int(seg.max() or 0) < LIFT_MAX_SEGMENTS and int(t.max() or 0) < (1 << 41) and int(W.max() or 0) < (1 << 41)
        off = seg.cast(pl.Int64) * (1 << 44) + (1 << 42)
        floor = pl.Series([-(1 << 42)], dtype=pl.Int64)
        T = t  # from above: with weights that only shrink, the observed times are an upper bound
        rounds = 0
        # (Series[...] gathers, zip_with for max and clip: the eager calls, cheaper than their expression forms)
        if lift:
            # in lifted terms: D = max(X - W, floor) + off = max(X + offW, floor + off) with offW = off - W, so a
            # round is T = cum_max(D) - offW, an edge's term T(u) + w + offW(v); D0 from X0 and the first
            # layer's D0 at its nodes computed once
            offW, floor_off = off - W, off + floor[0]
            D0 = X0 + offW
            D0 = D0.zip_with(D0 >= floor_off, floor_off)
            lay = [(vi, ui, wi + offW[vi]) for vi, ui, wi in layers]
            a0 = D0[lay[0][0]] if lay else None
            # a dense first layer (a quarter of the key rows or more) as whole columns: every row's term
            # gathered (a row without an edge: from row 0, far below any D0, which is >= 0), no scatter
            dense = bool(lay) and 4 * lay[0][0].len() >= D0.len()
            if dense:
                vi0, ui0, wo0 = lay[0]
                uf = pl.repeat(0, D0.len(), dtype=ui0.dtype, eager=True).scatter(vi0, ui0)
                wf = pl.repeat(-(1 << 61), D0.len(), dtype=pl.Int64, eager=True).scatter(vi0, wo0)
            while rounds < MAX_ROUNDS:
                rounds += 1
                if dense:
                    b = T[uf] + wf
                    D = D0.zip_with(D0 >= b, b)
                else:
                    D = D0.clone()  # (scatter writes in place)
                for j, (vi, ui, wo) in enumerate(lay):
                    if j == 0 and dense:
                        continue
                    a, b = a0 if j == 0 else D[vi], T[ui] + wo
                    D = D.scatter(vi, a.zip_with(a >= b, b))
                Tn = D.cum_max() - offW
                if Tn.equals(T):
                    break
                T = Tn
        while not lift and rounds < MAX_ROUNDS:
            rounds += 1
            X = X0.clone()
            for vi, ui, wi in layers:
                a, b = X[vi], T[ui] + wi
                X = X.scatter(vi, a.zip_with(a >= b, b))
            Tn = pl.DataFrame({"d": X - W, "seg": seg}).select(pl.col("d").cum_max().over("seg")).to_series() + W
            if Tn.equals(T):
                break
            T = Tn
        T = pl.select(pl.when(T < -(1 << 40)).then(t).otherwise(T)).to_series()  # a node nothing reaches any more stays where it was
        shift = {k: int(T[z] - t[z]) - int(T[a] - t[a]) for k, a, z in self.ends.iter_rows()}  # one row per window
        return [max(m + shift.get(k, 0), 0) for k, m in enumerate(self.measured)], rounds


def _chain_order(nodes: pl.DataFrame, chain: pl.Series, act_u: pl.Series, act_v: pl.Series, cu: pl.Series) -> pl.Series:
    """The nodes by chain, then position on it (a thread's points in node order; a stream's
    activities in start order, each start followed by its end; ``cu`` each node's chain edge's
    source), as node ids: ``chain`` (the graph's) has the threads in that order already and each
    stream's points in node order (which differs where a stream's activities overlap), so each
    stream's starts are taken in its order and followed by their ends (``act_u`` -> ``act_v``, the
    activities' start -> end edges): no sort.  An activity without its start -> end edge (none in
    a graph ``critical.graph`` builds: a start sorts before its end, and the parser clamps a
    negative duration to 0) leaves the order to a sort of (chain, position)."""
    n = nodes.height
    hn = int((~nodes.get_column("dev")).sum())  # the host nodes come first in ``chain``
    dchain = chain.slice(hn)
    starts = dchain.filter(~nodes.get_column("end").gather(dchain))
    end_of = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(act_u, act_v)
    two = pl.int_range(0, starts.len(), dtype=IDX, eager=True) * 2
    dord = pl.repeat(None, 2 * starts.len(), dtype=pl.Int64, eager=True).scatter(two, starts).scatter(two + 1, end_of.gather(starts))
    order = pl.concat([chain.head(hn), dord.cast(chain.dtype)]).cast(IDX)
    if order.len() == n and not order.null_count():
        return order
    pos = nodes.select(pl.when(pl.col("dev") & pl.col("end")).then(cu * 2 + 1).otherwise(pl.col("o") * 2)).to_series()
    return (_chain_ids(nodes, chain).cast(pl.Int64) * (2 * n + 2) + pos).arg_sort(nulls_last=False).cast(IDX)


def _chain_ids(nodes: pl.DataFrame, chain: pl.Series) -> pl.Series:
    """Each node's chain (its thread, or its stream) as a number: ``chain`` (the graph's) lists the
    nodes thread by thread, then stream by stream; a new number where the thread or stream changes."""
    hn = int((~nodes.get_column("dev")).sum())  # the host nodes come first in ``chain``
    hc, dc = chain.head(hn), chain.slice(hn)
    ph = nodes.select("pid", "tid")[hc.cast(critical.IDX)]
    p, h, s = ph.get_column("pid"), ph.get_column("tid"), nodes.get_column("stream")[dc.cast(critical.IDX)]
    new = pl.concat([(p.ne_missing(p.shift(1)) | h.ne_missing(h.shift(1))).fill_null(True),
                     s.ne_missing(s.shift(1)).fill_null(True).scatter(0, True) if dc.len() else pl.Series([], dtype=pl.Boolean)])
    return pl.repeat(0, nodes.height, dtype=pl.UInt32, eager=True).scatter(chain, new.cast(pl.UInt32).cum_sum())


def _layers(edges: pl.DataFrame, src: str) -> list[tuple[pl.Series, pl.Series, pl.Series]]:
    """``edges`` (vi, src, ei) as layers (vi, src, ei), each holding at most one edge per node (vi)."""
    if not edges.get_column("vi").is_duplicated().any():
        return [(edges.get_column("vi"), edges.get_column(src), edges.get_column("ei"))] if edges.height else []
    out, rest = [], edges
    while rest.height:  # one round per edge of the node with the most (a handful)
        first = rest.get_column("vi").is_first_distinct()
        f = rest.filter(first)
        out.append((f.get_column("vi"), f.get_column(src), f.get_column("ei")))
        rest = rest.filter(~first)
    return out


def parse(text: str) -> tuple[Change, ...]:
    """A change string: one change, or several joined by ``+`` (``data_loading=0+host/0.9``)."""
    return tuple(Change.parse(p) for p in text.split("+"))


NON_MATMUL = tuple(k for k in KCLASSES if k not in ("attention", "conv", "gemm", "comm", "memcpy", "memset"))
NON_MATMUL_0 = Change("kclass", NON_MATMUL)  # the non-matmul bar's kernels removed


def for_rank(df: pl.DataFrame, g, windows: list[tuple[int, int]], main_tid: int | None, changes: list[str]) -> dict[str, list[int]] | None:
    """The rank's ``what_if``: per change string, each window's predicted time (None: no graph)."""
    if g is None:
        return None
    r = Replay(df, g, windows, main_tid)
    return {c: r.run(parse(c))[0] for c in changes}


def export_tracks(r, df: pl.DataFrame, job: dict[str, list[int | None] | None] | None = None) -> list[tuple[str, pl.DataFrame]]:
    """The rank's what-if tracks for the trace export (tracelens.export.perfetto): per change
    replayed (``RankResult.what_if``, only with --critical-path and a suggestion that maps to a
    change), one slice per step from the step's start lasting its predicted time (start_ns,
    end_ns on the rank's clock; name: the step, the predicted and the measured time).  ``job``:
    in a job whose ranks wait for each other at collectives, per change the job's predicted
    steps (``suggest.job_step_predictions``; None: withheld, no track), which every rank's track
    shows instead of its own replay (that counts a wait for a later rank as removable)."""
    from tracelens.model.units import fmt_ns

    out = []
    for change, pred in sorted((getattr(r, "what_if", None) or {}).items()):
        if job is not None:
            if job.get(change) is None:
                continue
            pred = job[change]
        rows = [(s.start_ns, s.start_ns + p, f"{s.name}: {fmt_ns(p)} (measured {fmt_ns(s.dur_ns)})")
                for s, p in zip(r.steps, pred) if s.start_ns is not None and p is not None]  # one per step: a handful
        out.append((change, pl.DataFrame(rows, schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "name": pl.String}, orient="row")))
    return out
