"""The critical path of each step of one rank (issue 17, single rank): the chain of events that
set the step's time, and that time per category.

**Graph.**  Every host event on a thread (CPU ops, annotations, runtime calls, synchronize calls,
DataLoader spans, collective records; not the ProfilerStep spans) and every GPU activity of the
rank's device (kernels, copies, fills) gives two nodes, its start and its end.  All nodes are put
in one order: by time; at one time ends before starts (a zero-length event's start before its
end), a device end before a host end and a host start before a device start, a child's end before
its parent's and a parent's start before its child's.  Edges, always from an earlier node to a later
one in that order (an edge that would run backwards, e.g. through clock skew between host and
GPU, is dropped: the graph is a DAG by construction, never a cycle):

* per thread: each node after the previous node on its thread; the interval between them is
  the innermost event open there (nesting comes from the order: a parent's self time, then its
  child, then the parent again), or untraced host time (``cpu``) between top-level events;
* the forward/backward hand-off: a point on the step thread after the last end on a thread of its
  process that runs autograd work, and a point on such a thread after the last point on the step
  thread, where that point falls after the thread's own previous point (a dependency on another
  thread is one only where it is what the thread waited for; so for host collectives, below);
* an activity's end after its start;
* launch -> activity: the activity's start after its runtime call's start (same ``correlation``);
* per stream: an activity's start after the previous activity's end on its stream;
* ``cudaEventRecord`` -> ``cudaStreamWaitEvent``: the first activity launched on the waiting
  stream after the wait call starts after the last activity launched on the recorded stream
  before the record call (Kineto's ``Stream Wait Event`` rows name both; without the record's
  correlation, the last one launched before the wait call);
* synchronize -> host: a blocking call (``cudaStreamSynchronize``, ``cudaEventSynchronize``,
  ``cudaDeviceSynchronize``) ends after the last activity that ended before it on the stream it
  waits for (``Stream Sync``: its stream; ``Event Sync``: the last activity launched on the
  recorded stream before the record; otherwise the whole device: the last one on every stream);
* blocking copies: a runtime call that returns after its own copy (or kernel) ends, ends after it;
* host collectives on another thread (gloo's): the span starts after the step thread's last point
  before it (the call that queued it), and a step thread idle then (nothing open) resumes after
  the span's end (``sync``); a rank without communication kernels charges these spans
  ``exposed_comm``;
* autograd's fwdbwd flows where recorded: a backward op starts after the forward op it
  differentiates ends.

**Path.**  Every edge weighs the time between its nodes, so every path between two nodes has the
same length: the difference of their times.  The critical path of a step window [t0, t1] is the
longest path into its last node (the last GPU or step-thread node at or before t1) that follows,
at every node, the dependency that was satisfied last (its zero-slack in-edge: the one from the
latest node in the order): what the node actually waited for.  Walking those last-arriving edges
back to t0 (the edge that crosses t0 is cut there) gives a path whose length is t1 - t0, the
step's time, exactly; its segments are charged to categories, so the categories sum to the length
in integer ns.  The candidate edges come from one set of rules (``candidate_edges``: each with
its ``kind``, EDGE_KINDS): the thread edges as a chain (one per host point, by scatters into
arrays indexed by node) and the other edges as a frame, of which only those that can beat a
node's thread edge are sorted to find each node's last-arriving in-edge (``_last_arrivals``);
the path back from each step's end is read by pointer doubling over the chain's runs (log2 of
the path's length rounds of ``gather``, all steps at once): no Python loop per event, no graph
object.  ``graph()`` builds all of it once per rank; the critical path (``step_paths(g=)``) and
the what-if replay (tracelens.analysis.rank.replay, which reweighs every candidate edge by its
kind) share it.  (rustworkx 0.18 measured on control.json.gz, 35 MB, with only the 150 k chosen edges: 69 ms
to hand them over as Python tuples, 22 ms to build the graph, 59 ms in ``dag_longest_path``, whose
weights come from a Python callback per edge; the whole polars path here costs about that.)

**Categories** (``by_category_ns``): ``cpu`` (host ops and untraced host time), ``data_loading``
(host time inside a DataLoader span), ``launch_overhead`` (runtime launch calls, the latency
from a launch to its activity, the gap before an activity that waited on the one before it on its
stream), ``compute_<kclass>`` (compute kernels by class), ``exposed_comm`` (communication kernels:
on the path nothing hides them), ``memcpy`` (copies and fills), ``sync`` (synchronize calls and
the hand-off from the GPU to a blocked host, stream waits on events), ``idle`` (the step's time
before the first and after the last node the path reaches through a known dependency).

**Across ranks** (``combine``, the job's reduce over the summaries): each rank's summary carries,
per collective row in a step, the path's ns per category up to the row's start (``marks`` of
``step_paths``) and whether the path runs through the whole row as exposed communication; the
reduce stitches the ranks' paths through each matched collective to its last-arriving rank (see
``combine``): only collectives whose every member is loaded and whose match is believed (a sample
of a large job's ranks is never stitched: ``unstitched`` counts them).

Not in this slice: CUDA-graph replays' inner dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracelens.analysis.rank.names import Names
from tracelens.model.schema import END, EVENT_SCHEMA, KCLASSES

# the host kinds that are nodes (the ProfilerStep spans are not: they hold the whole step)
HOST_KINDS = ["cpu_op", "annotation", "python", "runtime", "sync", "dataloader", "collective", "p2p"]
DEVICE_KINDS = ["kernel", "memcpy", "memset"]
# runtime calls that put work on the GPU (their time is launch overhead); other runtime calls are host work
LAUNCH_RE = r"(?i)^(cuda|hip|cu)(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|Memcpy|Memset|LaunchKernelEx|ModuleLaunchKernel|ExtModuleLaunchKernel)|^cuLaunch|^hipExtLaunch"
AUTOGRAD_RE = r"^autograd::engine::evaluate_function|^torch::autograd::"  # a thread running these does backward work
CATEGORIES = ("cpu", "data_loading", "launch_overhead", "sync", "memcpy", "exposed_comm", "idle")  # + compute_<kclass>
TOP_EVENTS = 5

# edge categories
_CPU, _DL, _LAUNCH, _SYNC, _IDLE = "cpu", "data_loading", "launch_overhead", "sync", "idle"
# every category as an Enum: the edges and path segments carry a small integer, not a string
CAT = pl.Enum([*CATEGORIES, *(f"compute_{k}" for k in KCLASSES if k not in ("comm", "memcpy", "memset"))])


IDX = pl.get_index_type()  # polars' index type (UInt32; UInt64 in its 64-bit-index build)

_NO_MARKS = pl.DataFrame(schema={"m": pl.Int64, "cat": CAT, "ns": pl.Int64})


# the dependencies (``kind`` of candidate_edges): the previous point on a thread; the forward/backward
# hand-off; an activity's start -> end; launch call -> activity; activity -> the end of a call that
# returned after it (a launch call, a blocking copy); the previous activity on the stream; a
# synchronize call after what it waited for; an event wait's activity after the recorded one; a host
# collective on another thread after the step thread queued it, and the idle step thread after it
# (``coll_wait``); a backward op after the forward op it differentiates (autograd's fwdbwd flows)
EDGE_KINDS = ("thread", "handoff", "act", "launch", "return_launch", "return_sync", "stream", "sync", "wait",
              "queue", "coll_wait", "flow")
EDGE_KIND = pl.Enum(EDGE_KINDS)
EDGE_SCHEMA = {"v": pl.Int64, "u": pl.Int64, "cat": CAT, "owner": pl.UInt32, "kind": EDGE_KIND}


CAT_NAMES = frozenset(CAT.categories.to_list())
# (the Enum literals made once: a literal of an Enum dtype takes ~50 us to build, and the graph uses dozens)
_CATS = {c: pl.lit(c, dtype=CAT) for c in CAT_NAMES}
_KINDS = {k: pl.lit(k, dtype=EDGE_KIND).alias("kind") for k in EDGE_KINDS}


def _c(cat: str) -> pl.Expr:
    return _CATS[cat] if cat in _CATS else pl.lit(cat, dtype=CAT)


def _k(kind: str) -> pl.Expr:
    return _KINDS[kind] if kind in _KINDS else pl.lit(kind, dtype=EDGE_KIND).alias("kind")


# a dependency on another thread's point (the hand-off, a host collective's queue and wait) is one
# only where that point falls after the thread's previous point (``_pu``): what the thread waited for
_LATER = pl.col("_pu").is_null() | (pl.col("u") > pl.col("_pu"))


@dataclass(frozen=True)
class StepPath:
    """One step's critical path: its length (== the step window's), ns per category, the events
    that took the most of it."""

    length_ns: int
    by_category_ns: dict[str, int]
    top_events: list[dict[str, Any]]
    nodes: int  # events' start/end points on the path
    rows: tuple[int, ...] = ()  # the rows (in the rank's frame) of the events with a point on the path, in order
    # the path's ns per category from the window's start to each mark: (m, cat, ns), ns > 0 (a mark with none: no row)
    marks: pl.DataFrame = field(default_factory=lambda: _NO_MARKS, compare=False)
    # with_segments: the path's segments in time order, a frame of (start_ns, end_ns, category, row:
    # the event in the rank's frame it is charged to, null for none); they tile the step's window
    segments: Any = None

    def to_dict(self, step: int | None) -> dict[str, Any]:
        return {"step": step, "length_ns": self.length_ns, "by_category_ns": dict(self.by_category_ns),
                "top_events": [dict(e) for e in self.top_events]}


_COL_TYPES = {"pid": pl.Int64, "tid": pl.Int64, "kind": EVENT_SCHEMA["kind"], "cat": CAT, "copy": pl.Boolean, "autograd": pl.Boolean,
              "stream": pl.Int64, "correlation": pl.Int64}


def _gpu_category() -> pl.Expr:
    kc = pl.col("kclass").cast(pl.String)
    return (
        pl.when(pl.col("kind").is_in(["memcpy", "memset"]) | kc.is_in(["memcpy", "memset"])).then(_c("memcpy"))
        .when(kc == "comm").then(_c("exposed_comm"))
        .otherwise((pl.lit("compute_") + kc.fill_null("other")).cast(CAT, strict=False).fill_null(_c("compute_other")))
    )


def _events(df: pl.DataFrame, device: int | None, names: Names) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(host events, GPU activities, device sync rows) of the rank, with their row in ``df``."""
    lf = df.lazy().with_row_index("_row")
    comm_kernels = bool(df.select((pl.col("kclass") == "comm").any()).item())
    timed = pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()
    mine = pl.lit(True) if device is None else (pl.col("device") == device)
    # the threads that run autograd work: a few (pid, tid) pairs, tested per row (cheaper than a window function)
    on = pl.col("tid").is_not_null() & pl.col("kind").is_in(HOST_KINDS) & timed
    ag = df.lazy().filter(on & (pl.col("kind") == "cpu_op") & names.like(AUTOGRAD_RE)).select("pid", "tid").unique().collect()
    autograd = ((pl.col("kind") == "cpu_op") & names.like(AUTOGRAD_RE)).any().over("pid", "tid") if ag.height > 16 else \
        pl.any_horizontal(pl.lit(False), *[pl.col("pid").eq_missing(p) & pl.col("tid").eq_missing(t) for p, t in ag.iter_rows()])
    host = lf.filter(on).select(
        "_row", "pid", "tid", "kind", "ts_ns", "dur_ns", "correlation",
        pl.when(pl.col("kind") == "dataloader").then(_c(_DL))
        .when(pl.col("kind") == "sync").then(_c(_SYNC))
        .when((pl.col("kind") == "runtime") & names.like(LAUNCH_RE)).then(_c(_LAUNCH))
        # a rank without communication kernels (gloo on the CPU) communicates in its host collective spans
        .when(pl.col("kind").is_in(["collective", "p2p"]) & pl.lit(not comm_kernels)).then(_c("exposed_comm"))
        .otherwise(_c(_CPU)).alias("cat"),
        ((pl.col("kind") == "runtime") & names.like(r"(?i)memcpy")).alias("copy"),
        autograd.alias("autograd"),
        *[pl.when(pl.col("args").str.contains(f'"fwdbwd_{e}":', literal=True))
          .then(pl.col("args").str.extract(f'"fwdbwd_{e}":(-?\\d+)').cast(pl.Int64)).alias(f"fwd_{e}") for e in "sf"],
    )
    gpu = lf.filter(pl.col("kind").is_in(DEVICE_KINDS) & mine & timed).select(
        "_row", "stream", "ts_ns", "dur_ns", "correlation", _gpu_category().alias("cat"))
    dsync = lf.filter((pl.col("kind") == "sync") & pl.col("tid").is_null() & mine).select(
        "name", "stream", "correlation",
        pl.col("args").str.extract(r'"wait_on_stream":(-?\d+)').cast(pl.Int64).alias("wait_stream"),
        pl.col("args").str.extract(r'"wait_on_cuda_event_record_corr_id":(-?\d+)').cast(pl.Int64).alias("wait_corr"),
    )
    return tuple(pl.collect_all([host, gpu, dsync], engine="in-memory"))  # type: ignore[return-value]


def _nodes(host: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """One row per event start and end, in the graph's order (``o``)."""
    cols = ["pid", "tid", "kind", "cat", "copy", "autograd", "stream", "correlation"]

    def points(frame: pl.DataFrame, dev: bool) -> pl.LazyFrame:
        have = frame.columns
        f = frame.lazy().select("_row", "ts_ns", "dur_ns", pl.lit(dev).alias("dev"),
                                *[pl.col(c) if c in have else pl.lit(None, _COL_TYPES[c]).alias(c) for c in cols])
        return pl.concat([
            f.with_columns(pl.col("ts_ns").alias("t"), pl.lit(False).alias("end")),
            f.with_columns(END.alias("t"), pl.lit(True).alias("end")),
        ])
    pts = pl.concat([points(host, False), points(gpu, True)])
    # at one time: ends (1) before starts (2), a zero-length event's end after its start (3);
    # device ends before host ends, host starts before device starts; a child's end before its
    # parent's (shorter first), a parent's start before its child's (longer first)
    phase = pl.when(~pl.col("end")).then(2).when(pl.col("dur_ns") > 0).then(1).otherwise(3)
    lane = pl.when(pl.col("end")).then(pl.col("dev").not_()).otherwise(pl.col("dev")).cast(pl.Int8)
    durkey = pl.when(pl.col("end")).then(pl.col("dur_ns")).otherwise(-pl.col("dur_ns"))
    pts = pts.with_columns(phase.alias("_ph"), lane.alias("_ln"), durkey.alias("_dk")).collect(engine="in-memory").rechunk()
    # then what the events are, not where the file put them (identical kernels launched at one
    # time: the launch's correlation id tells them apart, whatever the file's order), the row last
    keys = ["t", "_ph", "_ln", "_dk", "dev", "correlation", "stream", "pid", "tid", "_row"]
    out = ["t", "_row", "dev", "end", "ts_ns", "dur_ns", *cols]
    span, dmax = pts.select((pl.col("t").max() - pl.col("t").min()).alias("s"), pl.col("_dk").abs().max().alias("d")).row(0)
    if span is None or ((span * 8 + 7) * (2 * dmax + 1) + 2 * dmax) >= (1 << 63):  # no room to pack the keys: sort by all of them
        return pts.sort(keys, nulls_last=True, maintain_order=True).select(out).with_row_index("o").with_columns(pl.col("o").cast(pl.Int64))
    # the same order, cheaper: (t, _ph, _ln, _dk) packed into one integer (dev follows from _ph and
    # _ln: a start's lane is its dev, an end's the other), sorted; only the points that tie on it
    # (events at one time, phase, lane and duration: a few percent) sorted again by the other keys.
    # The keys are unique (an event's start and end differ in t or _ph), so no order is left to stability
    packed = (((pl.col("t") - pl.col("t").min()) * 8 + pl.col("_ph") * 2 + pl.col("_ln").cast(pl.Int64)) * (2 * dmax + 1)
              + pl.col("_dk") + dmax)
    k = pts.select(packed).to_series()
    perm = k.arg_sort()
    kp = k.gather(perm)
    tie = (kp == kp.shift(1)).fill_null(False) | (kp == kp.shift(-1)).fill_null(False)
    if tie.any():
        at = perm.filter(tie)
        rest = pts.select(keys[5:])[at].with_columns(kp.filter(tie).alias("_k"))
        perm = perm.scatter(pl.int_range(0, k.len(), dtype=pl.UInt32, eager=True).filter(tie),
                            at.gather(rest.select(pl.arg_sort_by(["_k", *keys[5:]], nulls_last=True)).to_series()))
    return pts.select(out)[perm].with_row_index("o").with_columns(pl.col("o").cast(pl.Int64))


def candidate_edges(host: pl.DataFrame, gpu: pl.DataFrame, dsync: pl.DataFrame, nodes: pl.DataFrame,
                    main_tid: int | None) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series]:
    """Every candidate in-edge of every node, the graph's one set of edge rules (the module
    docstring): (``thread``, ``others``, ``chain``).  ``thread``: the previous point on each host
    point's thread (one edge per host point but its thread's first), by thread and order;
    ``others``: every other dependency; both (v, u, cat, owner, kind) with u before v in the order,
    ``owner`` the row in ``df`` of the event the segment is charged to (null: none), ``kind`` which
    dependency (EDGE_KINDS; the what-if replay reweighs by it).  ``chain``: every node once, each
    thread's points in order, then each stream's activities' points in order (most nodes'
    last-arriving dependency is the node before them in it)."""
    hn = nodes.filter(~pl.col("dev"))  # host points, with their event's columns
    gn = nodes.filter(pl.col("dev"))
    schema = EDGE_SCHEMA
    out: list[pl.LazyFrame] = []

    # per thread: the previous point.  The interval after a start is its event's; after an end, the
    # event that ends next when the next point is an end (the innermost one open), else its parent's
    # self time or untraced host time between top-level events (cpu); inside a DataLoader span, data loading
    # hn is in node order: a stable sort by thread is by (thread, o), 4x cheaper (of the columns read here)
    th = hn.select("o", "pid", "tid", "end", "cat", "_row", "kind", "autograd").sort("pid", "tid", maintain_order=True)
    same_prev = (pl.col("tid") == pl.col("tid").shift(1)) & (pl.col("pid") == pl.col("pid").shift(1))
    same_next = (pl.col("tid") == pl.col("tid").shift(-1)) & (pl.col("pid") == pl.col("pid").shift(-1))
    after_cat = (pl.when(~pl.col("end")).then(pl.col("cat"))
                 .when(same_next & pl.col("end").shift(-1)).then(pl.col("cat").shift(-1)).otherwise(_c(_CPU)))
    after_owner = (pl.when(~pl.col("end")).then(pl.col("_row"))
                   .when(same_next & pl.col("end").shift(-1)).then(pl.col("_row").shift(-1)).otherwise(None))
    if bool((host.get_column("cat") == _DL).any()):  # the running count of DataLoader spans open (balanced per thread)
        in_dl = (pl.when(pl.col("cat") == _DL).then(pl.when(pl.col("end")).then(-1).otherwise(1)).otherwise(0).cum_sum() > 0)
        after_cat = pl.when(in_dl).then(_c(_DL)).otherwise(after_cat)
    th = th.with_columns(after_cat.alias("_icat"), after_owner.alias("_iown"),
                         pl.when(same_prev).then(pl.col("o").shift(1)).alias("_pu"))
    # (the thread edges: one per host point but a thread's first; of the others, only those that
    # arrive no earlier than the thread's previous point can be a host point's last-arriving one)
    thread = th.select(pl.col("o").alias("v"), pl.col("_pu").alias("u"), pl.col("_icat").shift(1).cast(CAT).alias("cat"),
                       pl.col("_iown").shift(1).cast(pl.UInt32).alias("owner"), _k("thread")).filter(pl.col("u").is_not_null())
    # the forward/backward hand-off: a point on the step thread after the last end on a thread of
    # its process that runs autograd work, and a point on such a thread after the last point on the step thread
    if main_tid is not None:
        on_part = th.filter(pl.col("autograd") & (pl.col("tid") != main_tid)).select("o", "pid", "end", "_pu").sort("o")
        if on_part.height:
            on_main = th.filter(pl.col("tid") == main_tid).select("o", "pid", "_pu")
            by = {"by": "pid"} if host.get_column("pid").n_unique() > 1 else {}  # one process (the usual case): no groups, 4x cheaper
            out.append(on_main.join_asof(on_part.filter(pl.col("end")).select(pl.col("o").alias("u"), "pid"), left_on="o",
                                         right_on="u", strategy="backward", allow_exact_matches=False,
                                         check_sortedness=False, **by)
                       .lazy().filter(_LATER).select(pl.col("o").alias("v"), "u", _c(_CPU).alias("cat"), pl.lit(None).alias("owner"),
                                                     _k("handoff")))
            out.append(on_part.join_asof(on_main.select(pl.col("o").alias("u"), "pid"), left_on="o", right_on="u",
                                         strategy="backward", allow_exact_matches=False, check_sortedness=False, **by)
                       .lazy().filter(_LATER).select(pl.col("o").alias("v"), "u", _c(_CPU).alias("cat"), pl.lit(None).alias("owner"),
                                                     _k("handoff")))
    # a host collective span on another thread of the step thread's process (gloo runs them on its
    # own threads): it starts after the step thread's last point before it (the call that queued
    # it), and a step thread idle while it runs (untraced time, nothing open) resumes after its end
    if main_tid is not None:
        coll = (th.filter(pl.col("kind").is_in(["collective", "p2p"]) & (pl.col("tid") != main_tid))
                .select("o", "pid", "end", "_pu").sort("o"))
        if coll.height:
            on_main = th.filter(pl.col("tid") == main_tid).select("o", "pid", "_pu", pl.col("_iown").shift(1).alias("_gap_own"))
            by = {"by": "pid"} if host.get_column("pid").n_unique() > 1 else {}
            out.append(coll.filter(~pl.col("end")).join_asof(
                on_main.select(pl.col("o").alias("u"), "pid"), left_on="o", right_on="u", strategy="backward",
                allow_exact_matches=False, check_sortedness=False, **by)
                .lazy().filter(_LATER).select(pl.col("o").alias("v"), "u", _c(_CPU).alias("cat"), pl.lit(None).alias("owner"), _k("queue")))
            waiting = on_main.filter(pl.col("_gap_own").is_null() & pl.col("_pu").is_not_null()).join_asof(
                coll.filter(pl.col("end")).select(pl.col("o").alias("u"), "pid"), left_on="o", right_on="u",
                strategy="backward", allow_exact_matches=False, check_sortedness=False, **by)
            out.append(waiting.lazy().filter(_LATER).select(pl.col("o").alias("v"), "u", _c(_SYNC).alias("cat"), pl.lit(None).alias("owner"),
                                             _k("coll_wait")))
    # autograd's fwdbwd flows (the parser's ``fwdbwd_s``/``fwdbwd_f`` args): a backward node starts
    # after the forward op it differentiates ends
    if bool(host.get_column("fwd_f").is_not_null().any()):
        src = host.filter(pl.col("fwd_s").is_not_null()).select("_row", pl.col("fwd_s").alias("_fid")).join(
            hn.filter(pl.col("end")).select("_row", pl.col("o").alias("u")), on="_row").unique("_fid", keep="first")
        dst = host.filter(pl.col("fwd_f").is_not_null()).select("_row", pl.col("fwd_f").alias("_fid")).join(
            hn.filter(~pl.col("end")).select("_row", pl.col("o").alias("v")), on="_row")
        out.append(dst.join(src.select("_fid", "u"), on="_fid").lazy().select("v", "u", _c(_CPU).alias("cat"), pl.lit(None).alias("owner"),
                                                                            _k("flow")))
    # an activity's end after its start
    gs = gn.filter(~pl.col("end")).select(pl.col("o").alias("_s"), "_row", "stream", "ts_ns", "dur_ns", "correlation", "cat")
    ge = gn.filter(pl.col("end")).select(pl.col("o").alias("_e"), "_row")
    # one row per activity: its start and end nodes (its end by its row: a scatter and a gather, no join)
    e_of = pl.repeat(None, int(ge.get_column("_row").max() or 0) + 1, dtype=pl.Int64, eager=True).scatter(
        ge.get_column("_row"), ge.get_column("_e")) if ge.height else pl.Series([None], dtype=pl.Int64)
    acts = gs.with_columns(e_of.gather(gs.get_column("_row")).alias("_e"))
    out.append(acts.lazy().select(pl.col("_e").alias("v"), pl.col("_s").alias("u"), "cat", pl.col("_row").alias("owner"), _k("act")))
    # launch -> activity (the call's start), and a call that returns after its activity ends: after that end
    calls = hn.filter(pl.col("correlation").is_not_null() & pl.col("kind").is_in(["runtime", "sync"]))
    cs = calls.filter(~pl.col("end")).select("correlation", pl.col("o").alias("_cs"), pl.col("ts_ns").alias("_cts"),
                                             pl.col("_row").alias("_crow")).unique("correlation", keep="first")
    ce = calls.filter(pl.col("end")).select(
        "correlation", pl.col("o").alias("_ce"), pl.col("_row").alias("_crow2"),
        pl.when((pl.col("kind") == "sync") | pl.col("copy")).then(_c(_SYNC))
        .otherwise(pl.col("cat")).alias("_ccat"))
    ce = ce.unique("correlation", keep="first")
    acts = acts.join(cs, on="correlation", how="left")
    out.append(acts.lazy().filter(pl.col("_cs").is_not_null()).select(
        pl.col("_s").alias("v"), pl.col("_cs").alias("u"), _c(_LAUNCH).alias("cat"), pl.col("_crow").alias("owner"), _k("launch")))
    # (a launch call that outlasts its kernel is launch overhead; a copy the host waits for, sync)
    out.append(acts.lazy().join(ce.lazy(), on="correlation").select(
        pl.col("_ce").alias("v"), pl.col("_e").alias("u"),
        pl.when(pl.col("_ccat") == _LAUNCH).then(_c(_LAUNCH)).otherwise(_c(_SYNC)).alias("cat"),
        pl.col("_crow2").alias("owner"),
        pl.when(pl.col("_ccat") == _LAUNCH).then(_k("return_launch")).otherwise(_k("return_sync")).alias("kind")))
    # per stream: the previous activity's end
    acts = acts.with_columns(pl.col("_cts").fill_null(pl.col("ts_ns")).alias("_lts"))  # when it was launched
    prev = acts.lazy().sort("_s").select(
        pl.col("_s").alias("v"), pl.col("_e").shift(1).over("stream").alias("u"), _c(_LAUNCH).alias("cat"),
        pl.col("_row").alias("owner"), _k("stream"))
    out.append(prev.filter(pl.col("u").is_not_null()))
    by_launch = acts.select("stream", "_lts", "_s", "_e").sort("_lts")

    def last_launched(keys: pl.DataFrame, stream: str, at: str) -> pl.DataFrame:
        """For each key row: the end node (``_e``) of the last activity launched on ``stream`` at or before ``at``."""
        k = keys.filter(pl.col(stream).is_not_null() & pl.col(at).is_not_null()).sort(at)
        return k.join_asof(by_launch.select(pl.col("stream").alias(stream), "_lts", "_e"), left_on=at, right_on="_lts",
                           by=stream, strategy="backward", check_sortedness=False)

    # host synchronize calls: after the last activity that ended before them, on their stream or the device
    syncs = hn.filter((pl.col("kind") == "sync") & pl.col("end")).select(pl.col("o").alias("v"), "correlation",
                                                                          pl.col("_row").alias("owner"))
    if syncs.height:
        ds = dsync.unique("correlation", keep="first") if dsync.height else dsync
        syncs = syncs.join(ds, on="correlation", how="left")
        records = cs.select(pl.col("correlation").alias("wait_corr"), pl.col("_cts").alias("_rts"))
        ends = gn.filter(pl.col("end")).select(pl.col("o").alias("u"), "stream").sort("u")
        is_stream = (pl.col("name").cast(pl.String) == "Stream Sync") & (pl.col("stream") >= 0)
        is_event = (pl.col("name").cast(pl.String) == "Event Sync") & (pl.col("wait_corr") >= 0) & (pl.col("wait_stream") >= 0)
        stream_s = syncs.filter(is_stream.fill_null(False)).sort("v").join_asof(
            ends, left_on="v", right_on="u", by="stream", strategy="backward", allow_exact_matches=False, check_sortedness=False)
        event_s = last_launched(syncs.filter(is_event.fill_null(False)).join(records, on="wait_corr", how="inner"),
                                "wait_stream", "_rts").rename({"_e": "u"})
        # a device-wide wait: after the last activity that ended before it on every stream (the
        # latest one is what it waited for; the others are what it waits for when that one is
        # shorter, as the what-if replay makes it)
        dev_s = syncs.filter(~(is_stream | is_event).fill_null(False)).drop("stream", strict=False).join(
            ends.select("stream").unique(), how="cross").sort("v").join_asof(
            ends, left_on="v", right_on="u", by="stream", strategy="backward", allow_exact_matches=False, check_sortedness=False)
        for f in (stream_s, event_s, dev_s):
            out.append(f.lazy().select("v", "u", _c(_SYNC).alias("cat"), "owner", _k("sync")))
    # cudaEventRecord -> cudaStreamWaitEvent: the first activity launched on the waiting stream
    # after the wait call starts after the last one launched on the recorded stream before the record
    waits = dsync.filter((pl.col("name").cast(pl.String) == "Stream Wait Event") & (pl.col("wait_stream") >= 0)).join(
        cs.select("correlation", "_cts", "_crow"), on="correlation", how="inner") if dsync.height else dsync
    if waits.height:
        rec = cs.select(pl.col("correlation").alias("wait_corr"), pl.col("_cts").alias("_rts"))
        waits = waits.join(rec, on="wait_corr", how="left").with_columns(pl.col("_rts").fill_null(pl.col("_cts")))
        src = last_launched(waits, "wait_stream", "_rts").rename({"_e": "u"})
        dst = src.filter(pl.col("u").is_not_null()).sort("_cts").join_asof(
            by_launch.select("stream", "_lts", "_s"), left_on="_cts", right_on="_lts", by="stream", strategy="forward",
            check_sortedness=False)
        out.append(dst.lazy().select(pl.col("_s").alias("v"), "u", _c(_SYNC).alias("cat"), pl.col("_crow").alias("owner"), _k("wait")))
    others = (
        pl.concat([e.select([pl.col(k).cast(t) for k, t in schema.items()]) for e in out])
        .filter(pl.col("u").is_not_null() & pl.col("v").is_not_null() & (pl.col("u") < pl.col("v")))
        .collect(engine="in-memory")
    )
    chain = pl.concat([th.get_column("o"), gn.sort("stream", "o", maintain_order=True).get_column("o")])
    return thread, others, chain


def _last_arrivals(thread: pl.DataFrame, others: pl.DataFrame, n: int) -> dict[str, pl.Series]:
    """Each node's last-arriving in-edge (of ``candidate_edges``) as arrays indexed by node: ``u``
    (null: none), ``cat``, ``owner``, ``kind``, ``ei`` (the edge's row in ``thread`` then ``others``).
    A host point's is its thread's previous point unless another arrives no earlier (a tie goes to
    the other, as a stable sort of all of them would put it last); by scatters into the arrays, only
    the other edges that can win sorted (by node, then dependency), never the thread edges."""
    tv = thread.get_column("v")
    # (one scatter of each node's thread edge row, then one gather of the frame: a null row where none)
    at = pl.repeat(None, n, dtype=IDX, eager=True).scatter(tv, pl.int_range(0, thread.height, dtype=IDX, eager=True))
    got = thread.select([k for k in EDGE_SCHEMA if k != "v"]).with_columns(pl.int_range(0, thread.height, dtype=pl.Int64).alias("ei"))[at]
    cols = {k: got.get_column(k) for k in got.columns}
    ov = others.get_column("v")
    cur = cols["u"][ov.cast(IDX)]
    wins = (
        others.with_columns(pl.int_range(thread.height, thread.height + others.height, dtype=pl.Int64).alias("ei"))
        .filter(cur.is_null() | (others.get_column("u") >= cur))  # (most edges into host points lose to the thread's)
        .sort((pl.col("v") * (1 << 31) + pl.col("u")), maintain_order=True)  # by node, then dependency (stable: cheaper)
        .filter(pl.col("v") != pl.col("v").shift(-1).fill_null(-1))  # each node's last-arriving one
    )
    wv = wins.get_column("v")
    return {k: c.scatter(wv, wins.get_column(k)) for k, c in cols.items()}


@dataclass(frozen=True)
class Graph:
    """One rank's dependency graph (``graph()``): its host events and GPU activities (with their
    rows in the rank's frame), its nodes (``_nodes``: every event's start and end, in the graph's
    order ``o``), every candidate edge (``candidate_edges``: ``thread``, ``others``, ``chain``) and
    each node's last-arriving one (``last``: ``_last_arrivals``).  The critical path walks
    ``last``; the what-if replay (tracelens.analysis.rank.replay) reweighs every edge (``edges``)."""

    host: pl.DataFrame
    gpu: pl.DataFrame
    nodes: pl.DataFrame
    thread: pl.DataFrame
    others: pl.DataFrame
    chain: pl.Series
    last: dict[str, pl.Series]

    def edges(self) -> pl.DataFrame:
        """Every candidate edge (v, u, cat, owner, kind), the thread edges then the others: row i is ``last``'s ``ei`` i."""
        return pl.concat([self.thread, self.others])


def graph(df: pl.DataFrame, device: int | None, main_tid: int | None, names: Names) -> Graph | None:
    """The rank's dependency graph (None: no host event or GPU activity), built once and shared by
    the critical path (``step_paths(g=)``) and the what-if replay."""
    host, gpu, dsync = _events(df, device, names)
    if host.height + gpu.height == 0:
        return None
    nodes = _nodes(host, gpu)
    thread, others, chain = candidate_edges(host, gpu, dsync, nodes, main_tid)
    return Graph(host, gpu, nodes, thread, others, chain, _last_arrivals(thread, others, nodes.height))


def step_paths(df: pl.DataFrame, device: int | None, windows: list[tuple[int, int]], main_tid: int | None,
               names: Names, with_rows: bool = False, marks: pl.DataFrame | None = None,
               with_segments: bool = False, g: Graph | None | bool = False) -> list[StepPath]:
    """The critical path of each window (a step's GPU window, in order); ``with_rows``: with the
    rows of the events on it (``StepPath.rows``, for tests); ``marks`` (``k``: window, ``m``: id,
    ``t``: a time in it): the path's ns per category up to each (``StepPath.marks``);
    ``with_segments``: with its segments (``StepPath.segments``, for the views and the trace export);
    ``g``: the rank's ``graph()`` when already built (the what-if replay shares it)."""
    if g is False:
        g = graph(df, device, main_tid, names)
    n_win = len(windows)
    if g is None:
        return [StepPath(max(e - s, 0), {_IDLE: max(e - s, 0)} if e > s else {}, [], 0, (), _NO_MARKS,
                         pl.DataFrame({"start_ns": [s], "end_ns": [e], "category": [_IDLE], "row": [None]},
                                      schema=_NO_SEGMENTS.schema).filter(pl.col("end_ns") > pl.col("start_ns"))
                         if with_segments else None) for s, e in windows]
    nodes = g.nodes
    # each node's last-arriving dependency (null for none) and that edge's category and event
    p0, cat, owner = g.last["u"], g.last["cat"], g.last["owner"]
    n = nodes.height
    t = nodes.get_column("t")
    # runs: stretches of the chain order where each node's dependency is the node before it (a
    # thread's ops between two cross-thread edges, back-to-back activities on a stream); a path that
    # reaches a node of a run walks back to the run's head, then jumps to the head's dependency
    chain = g.chain
    # (index arrays in polars' index type: ``a[i]`` gathers with no cast and no query, ``gather`` plans one)
    cpos = pl.int_range(0, n, dtype=IDX, eager=True)
    pc = p0[chain.cast(IDX)]  # the dependency of the node at each chain position
    head = pl.select(pl.when(pc.is_null() | (pc != chain.shift(1))).then(cpos).forward_fill()).to_series()
    pos = pl.repeat(0, n, dtype=IDX, eager=True).scatter(chain, cpos)  # each node's chain position
    hop = pc[head][pos]  # each node's jump: its run head's dependency (null: none)
    # the jump table over the nodes a path can land on (the heads' dependencies and the windows' last
    # nodes), compacted; one without a dependency points at a sentinel that is before every window
    ends_ok = nodes.select("o", "t") if main_tid is None else \
        nodes.select("o", "t", "dev", "tid").filter(pl.col("dev") | (pl.col("tid") == main_tid)).select("o", "t")
    win = pl.DataFrame({"k": list(range(n_win)), "t0": [s for s, _ in windows], "t1": [e for _, e in windows]},
                       schema={"k": pl.Int64, "t0": pl.Int64, "t1": pl.Int64})
    z = win.sort("t1").join_asof(ends_ok.rename({"t": "_zt"}), left_on="t1", right_on="_zt", strategy="backward") \
        .filter(pl.col("o").is_not_null() & (pl.col("_zt") >= pl.col("t0"))).select("k", pl.col("o").alias("node"))
    # (in node order: a mask scattered, cheaper than a hash unique)
    land = cpos.filter(pl.repeat(False, n, eager=True).scatter(hop.drop_nulls(), True).scatter(z.get_column("node"), True))
    m = land.len()
    idx = pl.repeat(m, n, dtype=IDX, eager=True).scatter(land, cpos.head(m))
    hl = hop[land]
    jump = idx[hl.fill_null(0).cast(IDX)].zip_with(hl.is_not_null(), pl.Series([m], dtype=IDX)).append(pl.Series([m], dtype=IDX))
    tj = t[land].append(pl.Series([-(1 << 62)], dtype=pl.Int64))
    # the landings of each window's path back to its start, by pointer doubling: after round j
    # ``members`` holds the first 2^j landings of each path (those before t0 dropped); a round's jumps
    # land on nodes no earlier round held (the path's nodes strictly decrease in the order)
    # (on Series: a round is four gathers and a filter, no query plan)
    members = z.join(win.select("k", "t0"), on="k")
    mk, mt0, mnode = members.get_column("k"), members.get_column("t0"), idx[members.get_column("node").cast(IDX)]
    while True:
        nxt = jump[mnode]
        keep = tj[nxt] >= mt0
        if not keep.any():
            break
        mk, mt0, mnode = (pl.concat([a, b], rechunk=True) for a, b in ((mk, mk.filter(keep)), (mt0, mt0.filter(keep)), (mnode, nxt.filter(keep))))
        jump = jump[jump]
    # each landing's stretch of its run, from the head to it: the path's nodes (those before t0 dropped)
    at = pos[land[mnode]]
    seg_nodes = pl.DataFrame({"k": mk, "t0": mt0, "_p": pl.int_ranges(head[at], at + 1, dtype=IDX, eager=True)}).explode("_p")
    mnode = chain[seg_nodes.get_column("_p")]
    keep = t[mnode.cast(IDX)] >= seg_nodes.get_column("t0")
    mk, mt0, mnode = seg_nodes.get_column("k").filter(keep), seg_nodes.get_column("t0").filter(keep), mnode.filter(keep)
    members = pl.DataFrame({"k": mk, "node": mnode})
    # the segments: each path node from its dependency (cut at t0), the lead-in and the tail idle
    # (columns by gathers on the node arrays; the summaries in one collect_all)
    mi = mnode.cast(IDX)
    su = p0[mi]
    ut = t[su.fill_null(0).cast(IDX)]
    seg = pl.DataFrame({"k": mk, "t0": mt0, "_t": t[mi], "_u": su, "_ut": ut, "cat": cat[mi],
                        "owner": owner[mi], "node": mnode}).lazy().select(
        "k", "owner", "node", "_t", pl.col("_t").alias("_e"),
        (pl.col("_t") - pl.max_horizontal(pl.when(pl.col("_u").is_not_null()).then(pl.col("_ut")).otherwise(pl.col("t0")),
                                          pl.col("t0"))).alias("ns"),
        pl.when(pl.col("_u").is_null()).then(_c(_IDLE)).otherwise(pl.col("cat")).alias("cat"),
    )
    ztime = z.with_columns(t.gather(z.get_column("node")).alias("_zt"))
    tails = win.lazy().join(ztime.lazy(), on="k", how="left").select(
        "k", _c(_IDLE).alias("cat"), (pl.col("t1") - pl.col("_zt").fill_null(pl.col("t0"))).alias("ns"), pl.col("t1").alias("_t"))
    parts = pl.concat([seg.select("k", "cat", "ns"), tails.select("k", "cat", "ns")]).filter(pl.col("ns") > 0)
    top = seg.filter(pl.col("owner").is_not_null() & (pl.col("ns") > 0)).group_by("k", "owner").agg(
        pl.col("ns").sum(), pl.col("cat").sort_by("node", descending=True).first())  # its category: its last segment's
    # only the events that can be among a window's first TOP_EVENTS (ties included) get their names
    top = top.filter(pl.col("ns") >= pl.col("ns").top_k(TOP_EVENTS).min().over("k"))
    by_cat, counts, top = pl.collect_all([parts.group_by("k", "cat").agg(pl.col("ns").sum()).sort("k", "cat"),
                                          members.lazy().group_by("k").len(), top], engine="in-memory")
    if top.height:  # ties by time and name, not by row: the file's event order changes nothing
        rows = top.get_column("owner")
        top = top.with_columns(
            df.get_column("name").gather(rows).cast(pl.String).alias("name"),
            df.get_column("kind").gather(rows).cast(pl.String).alias("kind"),
            df.get_column("ts_ns").gather(rows).alias("ts_ns"),
            pl.col("cat").cast(pl.String),
        ).sort(["k", "ns", "ts_ns", "name", "cat"], descending=[False, True, False, False, False], nulls_last=True) \
            .group_by("k", maintain_order=True).head(TOP_EVENTS)
    cats: list[dict[str, int]] = [{} for _ in range(n_win)]
    for k, c, ns in by_cat.iter_rows():  # one row per (window, category): a few dozen
        cats[k][c] = int(ns)
    tops: list[list[dict[str, Any]]] = [[] for _ in range(n_win)]
    for r in (top.select("k", "name", "kind", "cat", "ns", "ts_ns").iter_rows(named=True) if top.height else ()):  # TOP_EVENTS per window
        tops[r["k"]].append({"name": r["name"], "kind": r["kind"], "category": r["cat"], "ns": int(r["ns"]), "ts_ns": r["ts_ns"]})
    nodes_on = dict(counts.iter_rows())
    segs_of: dict[int, pl.DataFrame] = {}
    if with_segments:  # each segment ends at its node (the tail at t1) and lasts its ns
        allseg = pl.concat([seg.select("k", "_t", "ns", "cat", "owner"), tails.with_columns(pl.lit(None, pl.UInt32).alias("owner"))
                            .select("k", "_t", "ns", "cat", "owner")]).filter(pl.col("ns") > 0).select(
            "k", (pl.col("_t") - pl.col("ns")).alias("start_ns"), pl.col("_t").alias("end_ns"),
            pl.col("cat").cast(pl.String).alias("category"), pl.col("owner").alias("row")).sort("k", "end_ns").collect()
        segs_of = {k[0]: g.drop("k") for k, g in allseg.group_by("k", maintain_order=True)}  # one frame per window
    rows_of = {}
    if with_rows:
        on_path = (members.join(nodes.select(pl.col("o").alias("node"), "_row"), on="node")
                   .group_by("k").agg(pl.col("_row").unique().sort()))
        rows_of = {k: tuple(r) for k, r in on_path.iter_rows()}  # one list per window
    marks_of: dict[int, pl.DataFrame] = {}
    if marks is not None and marks.height:
        # the segments partition [t0, last node]; the tail after it is idle.  A mark's prefix: the
        # segments that end by it, whole, and the one it falls in, cut at it.  Each segment is
        # summed into the first mark (in time order) at or after its end (a join_asof): per
        # window and category, running sums over the marks of those few sums (one row per mark x
        # category at most), and the cut one found by a search of the marks in the segments
        spans = pl.concat([seg.select("k", "cat", (pl.col("_e") - pl.col("ns")).alias("_s"), "_e"),
                           tails.join(win.lazy().select("k", "t1"), on="k").select(
                               "k", "cat", (pl.col("t1") - pl.col("ns")).alias("_s"), pl.col("t1").alias("_e"))])
        pre = _mark_prefixes(spans.filter(pl.col("_e") > pl.col("_s")).collect(engine="in-memory"), marks)
        marks_of = {k: f.drop("k") for (k,), f in pre.partition_by("k", as_dict=True).items()}
    out = []
    for k, (s, e) in enumerate(windows):
        by = dict(sorted(cats[k].items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(StepPath(sum(by.values()), by, tops[k], int(nodes_on.get(k, 0)), rows_of.get(k, ()), marks_of.get(k, _NO_MARKS),
                            segs_of.get(k, _NO_SEGMENTS) if with_segments else None))
    return out


_MARK_KEY_LIMIT = 1 << 62  # (window, time) packed into one int64 key of the marks while windows x time span stay below this


def _mark_prefixes(spans: pl.DataFrame, marks: pl.DataFrame) -> pl.DataFrame:
    """``step_paths``' marks: per mark (``marks``: k, m, t) the path's ns per category from its
    window's start to it (k, m, cat, ns; ns > 0), from the path's segments (``spans``: k, cat, _s,
    _e, which tile each window).  Each span is summed into the first mark of its window at or after
    its end (``whole``: running sums over the window's marks per category), and the span a mark
    falls in is cut at it (``cut``).  By searches of one sorted key (window, time) of the marks: no
    sort or join of the spans (joins where the key would not fit in int64)."""
    mk = marks.sort("k", "t").with_row_index("_j").with_columns(pl.col("_j").cast(pl.Int64))
    whole, cut = _mark_parts(spans, mk)
    pairs = whole.select("k", "cat").unique().join(mk.select("k", "m", "_j"), on="k").sort("_j")
    full = pairs.join_asof(whole.rename({"_j": "_jw"}), left_on="_j", right_on="_jw", by=["k", "cat"], strategy="backward",
                           check_sortedness=False).select("k", "m", "cat", pl.col("ns").fill_null(0))
    return (pl.concat([full, cut]).group_by("k", "m", "cat").agg(pl.col("ns").sum())
            .filter(pl.col("ns") > 0).sort("k", "m", "cat"))


def _mark_parts(spans: pl.DataFrame, mk: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``_mark_prefixes``' two parts (``whole``: k, _j, cat, ns, running sums; ``cut``: k, m, cat,
    ns); ``mk``: the marks in (k, t) order, ``_j`` their row."""
    lo_t = min(int(spans.get_column("_s").min()), int(mk.get_column("t").min())) if spans.height else int(mk.get_column("t").min())
    hi_t = max(int(spans.get_column("_e").max()), int(mk.get_column("t").max())) if spans.height else int(mk.get_column("t").max())
    r = hi_t - lo_t + 1
    kmax = max(int(mk.get_column("k").max()), int(spans.get_column("k").max()) if spans.height else 0) + 1
    if kmax * r >= _MARK_KEY_LIMIT:  # no room for one key: by joins (the windows' spans sorted)
        spans = spans.sort("_e")
        whole = (spans.join_asof(mk.select("k", "_j", "t").sort("t"), left_on="_e", right_on="t", by="k", strategy="forward",
                                 check_sortedness=False)
                 .filter(pl.col("_j").is_not_null()).group_by("k", "_j", "cat").agg((pl.col("_e") - pl.col("_s")).sum().alias("ns")))
        cut = (mk.sort("t").join_asof(spans.sort("_s"), left_on="t", right_on="_s", by="k", strategy="backward",
                                      allow_exact_matches=False, check_sortedness=False)
               .filter(pl.col("_e") > pl.col("t")).select("k", "m", "cat", (pl.col("t") - pl.col("_s")).alias("ns")))
    else:
        mkey = mk.select(pl.col("k") * r + (pl.col("t") - lo_t)).to_series()
        mkk, nm = mk.get_column("k"), mk.height
        sk = spans.select((pl.col("k") * r + (pl.col("_s") - lo_t)).alias("s"), (pl.col("k") * r + (pl.col("_e") - lo_t)).alias("e"))
        j = mkey.search_sorted(sk.get_column("e"), side="left").cast(pl.Int64)  # the first mark at or after the span's end
        ok = (j < nm) & (mkk.gather(j.clip(upper_bound=nm - 1)) == spans.get_column("k"))
        whole = (spans.select("k", "cat", (pl.col("_e") - pl.col("_s")).alias("ns")).with_columns(j.alias("_j")).filter(ok)
                 .group_by("k", "_j", "cat").agg(pl.col("ns").sum()))
        # the marks strictly inside a span (_s < t < _e): those from the first after its start to the last before its end
        a = mkey.search_sorted(sk.get_column("s"), side="right").cast(pl.Int64)
        inside = (spans.select("cat", "_s").with_columns(a.alias("_a"), j.alias("_b")).filter(pl.col("_b") > pl.col("_a"))
                  .select("cat", "_s", pl.int_ranges("_a", "_b").alias("_j")).explode("_j"))
        cut = inside.join(mk.select("_j", "k", "m", "t"), on="_j").select("k", "m", "cat", (pl.col("t") - pl.col("_s")).alias("ns"))
    whole = whole.sort("_j").with_columns(pl.col("ns").cum_sum().over("k", "cat"))
    return whole, cut


_NO_SEGMENTS = pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "category": pl.String, "row": pl.UInt32})


def collective_marks(rows: pl.DataFrame, windows: list[tuple[int, int]]) -> pl.DataFrame:
    """The marks (``step_paths``) of the rank's collective rows (``COLLECTIVE_SCHEMA``) that lie in a
    window: ``m`` 2i at row i's start, 2i+1 at its end (capped at the window's end), ``k`` its window."""
    if rows.height == 0 or not windows:
        return pl.DataFrame(schema={"k": pl.Int64, "m": pl.Int64, "t": pl.Int64})
    win = pl.DataFrame({"k": list(range(len(windows))), "t0": [a for a, _ in windows], "t1": [b for _, b in windows]},
                       schema={"k": pl.Int64, "t0": pl.Int64, "t1": pl.Int64}).sort("t0")
    r = rows.with_row_index("i").with_columns(pl.col("i").cast(pl.Int64)).sort("start_ns").join_asof(
        win, left_on="start_ns", right_on="t0", strategy="backward").filter(pl.col("start_ns") < pl.col("t1"))
    return pl.concat([r.select("k", (2 * pl.col("i")).alias("m"), pl.col("start_ns").alias("t")),
                      r.select("k", (2 * pl.col("i") + 1).alias("m"), pl.min_horizontal("end_ns", "t1").alias("t"))])


def summarize(paths: list[StepPath], steps, kept_idx: list[int], rows: pl.DataFrame | None = None,
              windows: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """The rank's ``critical_path``: over the kept steps, and each step's; with the collective rows
    (``rows``, marked in ``step_paths``) and ``windows``, what the job's reduce stitches the ranks'
    paths with (``collectives``, ``windows``: see ``combine``)."""
    total: dict[str, int] = {}
    for i in kept_idx:
        for c, ns in paths[i].by_category_ns.items():
            total[c] = total.get(c, 0) + ns
    out = {
        "length_ns": sum(paths[i].length_ns for i in kept_idx),
        "by_category_ns": dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))),
        "steps": [p.to_dict(s.step) for p, s in zip(paths, steps)],
    }
    if rows is not None and windows and any(p.marks.height for p in paths):
        out["windows"] = [[a, b] for a, b in windows]
        out["kept"] = list(kept_idx)
        out["collectives"] = _collective_marks(paths, rows, windows)
    return out


def _collective_marks(paths: list[StepPath], rows: pl.DataFrame, windows: list[tuple[int, int]]) -> dict[str, Any]:
    """``summarize``'s ``collectives``, as columns (one entry per collective row in a window): its
    key, ``step_index``, ``start_ns``, ``end_ns``, ``on_path`` (the path runs through the whole
    row, to its end capped at the window's, as exposed communication) and ``prefix_ns`` (category
    -> the path's ns from the window's start to the row's start, one number per row)."""
    pre = pl.concat([p.marks.with_columns(pl.lit(k, pl.Int64).alias("k")) for k, p in enumerate(paths) if p.marks.height])
    keyed = rows.with_row_index("i").select(pl.col("i").cast(pl.Int64), "group", "group_desc", "seq", "collective", "start_ns", "end_ns")
    win = pl.DataFrame({"k": list(range(len(windows))), "_t1": [b for _, b in windows]}, schema={"k": pl.Int64, "_t1": pl.Int64})
    marked = collective_marks(rows, windows).with_columns((pl.col("m") // 2).alias("i"))
    mine = marked.filter(pl.col("m") % 2 == 0).select("i", pl.col("k").alias("step_index"))
    mine = mine.join(marked.filter(pl.col("m") % 2 == 1).select("i"), on="i")  # both ends marked
    comm = pre.filter(pl.col("cat") == "exposed_comm").select(pl.col("m"), "ns")
    start_cat = pre.filter(pl.col("m") % 2 == 0).select((pl.col("m") // 2).alias("i"), pl.col("cat").cast(pl.String), "ns")
    cols = sorted(start_cat.get_column("cat").unique().to_list())
    wide = (start_cat.pivot(on="cat", index="i", values="ns") if start_cat.height else pl.DataFrame({"i": []}, schema={"i": pl.Int64}))
    t = (mine.join(keyed, on="i").join(win, left_on="step_index", right_on="k")
         .join(comm.filter(pl.col("m") % 2 == 0).select((pl.col("m") // 2).alias("i"), pl.col("ns").alias("_c0")), on="i", how="left")
         .join(comm.filter(pl.col("m") % 2 == 1).select((pl.col("m") // 2).alias("i"), pl.col("ns").alias("_c1")), on="i", how="left")
         .join(wide, on="i", how="left").sort("i"))
    t = t.with_columns(pl.min_horizontal("end_ns", "_t1").alias("_cap"))
    on_path = ((pl.col("_c1").fill_null(0) - pl.col("_c0").fill_null(0)) == (pl.col("_cap") - pl.col("start_ns"))) & (pl.col("_cap") > pl.col("start_ns"))
    t = t.with_columns(on_path.alias("on_path"), *[pl.col(c).fill_null(0) for c in cols])
    out = t.select("group", "group_desc", "seq", "collective", "step_index", "start_ns", "end_ns", "on_path").to_dict(as_series=False)
    out["prefix_ns"] = t.select(cols).to_dict(as_series=False)
    return out


def combine(parts: list[dict[str, Any] | None], table: pl.DataFrame | None = None,
            ranks: list[tuple[int, int | None]] | None = None, pairs: list[dict[str, list] | None] | None = None) -> dict[str, Any] | None:
    """The job's ``critical_path``: the ranks' kept-step totals summed, and with several ranks
    whose paths pass through matched collectives (``table``: the job's collective table;
    ``ranks``: (file, rank) of each part), the job's path of each step stitched across ranks
    (``steps``, ``ranks_on_path``, ``wait_rank_ns``).

    **Stitching** (a reduce over the summaries: each rank's ``collectives`` carry, per collective
    row in a step, the path's ns per category from the step's start to the row's start and whether
    the path runs through the whole row as exposed communication).  For step k the job's path
    starts on the rank whose window ends last (aligned clocks), at its end T.  Walking back, the
    latest collective on that rank's path that ends by T and whose last member arrived (aligned)
    after this rank started it moves the path: this rank's path from that arrival A to T is the
    job's (its prefix at T less its prefix at A, the time in the collective after A being
    ``exposed_comm``), this rank is charged ``wait_rank`` for [its start, A] (``wait_rank_ns``:
    waiting rank -> last-arriving rank -> ns), and the walk goes on on the last-arriving rank R
    from its own start of that collective (its prefix there).  With no such collective the rest
    is the rank's prefix from its window's start.  The stitched segments telescope: the step's
    length is the last rank's window end less the first rank's window start on the job's clock,
    and its categories sum to it exactly.  The job's ``length_ns`` and ``by_category_ns`` are over
    the steps every rank keeps (``kept`` on each step), as a rank's are; ``wait_rank_ns`` too:
    waiting rank -> rank it waited for -> ns, at the collectives whose last member is on a kept
    step's chain.

    **P2P** (``pairs``: per part, its rank's P2P records keyed for pairing,
    ``analysis.rank.pipeline._pair_keys``): a send or recv is no collective (one member, never
    complete); the k-th recv of step N on b from a is the k-th send of step N on a to b, a
    two-member rendezvous: a recv on b's path that b started before a started the send (aligned)
    and that ended after is a hop as a collective is, its arrival the send's aligned start and its
    landing a's start of the send (a's prefix there); so is a send on a's path that a started
    before b started the recv (a rendezvous send, gloo's, waits for the recv to be posted).  Each step's ``ns_by_rank``: rank -> the ns of the step's path
    on it (the chain's segments, from one hop's arrival to the previous one's; they sum to its
    length)."""
    got = [p for p in parts if p]
    if not got:
        return None
    total: dict[str, int] = {}
    for p in got:
        for c, ns in p["by_category_ns"].items():
            total[c] = total.get(c, 0) + ns
    out: dict[str, Any] = {"length_ns": sum(p["length_ns"] for p in got),
                           "by_category_ns": dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))}
    if table is None or ranks is None or table.height == 0:
        return out
    if len(got) < 2:
        lone = _lone_unstitched(parts, table, ranks)
        return {**out, "unstitched": lone} if lone else out
    stitched = _stitch(parts, table, ranks, pairs)
    if stitched is not None:  # the job's own path (every step's); the ranks' sums kept beside it
        out = {"ranks_length_ns": out["length_ns"], "ranks_by_category_ns": out["by_category_ns"], **stitched}
    return out


def _lone_unstitched(parts: list[dict[str, Any] | None], table: pl.DataFrame, ranks: list[tuple[int, int | None]]) -> dict[str, int] | None:
    """With one rank's path alone: its collectives whose other members are not loaded (the table's
    ``complete`` not true: absent, or the group's size unknown) and how many of their rows lie on
    its path (``combine``'s ``unstitched``, ``members_absent`` / ``rows_on_path``): the time the
    rank waited in them for ranks not loaded cannot be told from the transfer.  None without any."""
    have = [(f, p) for (f, _), p in zip(ranks, parts) if p and p.get("collectives")]
    if len(have) != 1:
        return None
    f, p = have[0]
    c = p["collectives"]
    key = [pl.col("group").cast(pl.String).fill_null(""), pl.col("seq").cast(pl.Int64), pl.col("collective").cast(pl.String).fill_null("")]
    mine = pl.DataFrame({k: c[k] for k in ("group", "seq", "collective", "on_path")},
                        schema_overrides={"seq": pl.Int64, "on_path": pl.Boolean}).select(*key, "on_path")
    # a group of one (its size said) has nobody to wait for: never absent
    t = (table.filter((pl.col("file") == f) & ~pl.col("complete").fill_null(False) & (pl.col("group_size").fill_null(0) != 1))
         .select(*key).unique())
    if not t.height:
        return None
    rows = mine.join(t, on=["group", "seq", "collective"], nulls_equal=True).filter(pl.col("on_path"))
    return {"members_absent": t.height, "match_refused": 0, "rows_on_path": rows.height}


def _stitch(parts: list[dict[str, Any] | None], table: pl.DataFrame, ranks: list[tuple[int, int | None]],
            pairs: list[dict[str, list] | None] | None = None) -> dict[str, Any] | None:
    """``combine``'s cross-rank path (see there); None when the ranks carry no collectives.

    In frames, no loop per collective: a *hop* is an on-path collective row of rank f whose last
    member (aligned) is another loaded rank R, arriving after f started it and before f's row
    ends; from a position (rank, step, time T on its clock) the walk takes the latest hop of that
    rank and step ending by T (a ``join_asof``), and moves to R's start of that collective, so
    each hop has one next hop (the same ``join_asof`` from its landing).  Each step's chain is read
    by pointer doubling over those next-hop pointers (log2 of the chain's length rounds); aligned
    time strictly decreases along a chain (a hop's arrival is before its row's end, its next hop
    ends by that arrival), so a chain ends.  A collective some of whose members are not loaded (a
    sample of a job's ranks) or whose match across ranks was refused is never a hop: its last
    member is unknown (``unstitched``: how many collectives, and how many of their rows lie on
    a rank's path).  Python loops remain only
    over the ranks x steps x categories of the summaries (to read them), never over collectives."""
    pr = _prepare(parts, table, ranks)
    if pr is None:
        return None
    have, key, n_steps, cats, rows, win, step_cats, rank_of, tk, sure, last = (
        pr[k] for k in ("have", "key", "n_steps", "cats", "rows", "win", "step_cats", "rank_of", "tk", "sure", "last"))
    why = tk.group_by(key).agg(pl.col("complete").fill_null(False).all().alias("_complete"),
                               pl.col("consistent").fill_null(True).all().alias("_consistent"))
    # the collectives that cannot be hops, and how many of their rows lie on a rank's path
    why = why.filter((~pl.col("_complete") | ~pl.col("_consistent")) & ~pl.col("collective").is_in(list(_P2P)))  # P2P: pairs
    on_rows = rows.filter(pl.col("on_path")).join(why, on=key)
    unstitched = {"members_absent": int((~why.get_column("_complete")).sum()),
                  "match_refused": int((why.get_column("_complete") & ~why.get_column("_consistent")).sum()),
                  "rows_on_path": on_rows.height}
    theirs = rows.select(*key, pl.col("file").alias("R"), pl.col("start_ns").alias("s_r"), pl.col("step_index").alias("k_r"),
                         *[pl.col(f"p_{x}").alias(f"r_{x}") for x in cats])
    hops = (rows.filter(pl.col("on_path")).join(last, on=key).join(theirs, on=[*key, "R"])
            .filter((pl.col("R") != pl.col("file")) & (pl.col("A") - pl.col("off") > pl.col("start_ns"))
                    & (pl.col("A") < pl.col("end_ns") + pl.col("off")))
            .with_columns((pl.col("A") - pl.col("off") - pl.col("start_ns")).alias("wait")))
    p2p = _p2p_hops(rows, win, cats, pairs or [], ranks, set(have))
    if p2p is not None:
        cols = [*key, "file", "step_index", "start_ns", "end_ns", "off", "A", "R", "k_r", "s_r", "wait",
                *[f"p_{x}" for x in cats], *[f"r_{x}" for x in cats]]
        hops = pl.concat([hops.select(cols), p2p.select(cols)], how="vertical_relaxed")
    hops = hops.sort("file", "step_index", "end_ns", "A").with_row_index("h").with_columns(pl.col("h").cast(pl.Int64))
    start = _step_starts(win)
    mk, mh = _walk(hops, start, land=("R", "k_r", "s_r"))
    members = pl.DataFrame({"k": mk, "h": mh}).join(hops, on="h")
    # each hop: the path's share from R's start of it back is R's; this rank's from the arrival on
    # is its own (its prefix at its start plus the wait, in the collective, as exposed comm): the
    # step's categories are the first rank's whole step plus, per hop, R's prefix less that
    at_a = {x: pl.col(f"p_{x}") + (pl.col("wait") if x == "exposed_comm" else 0) for x in cats}
    delta = members.select("k", *[(pl.col(f"r_{x}") - at_a[x]).alias(x) for x in cats]).unpivot(index="k", variable_name="cat", value_name="ns")
    first = start.join(step_cats, on=["file", "k"]).select("k", "cat", "ns")
    by_cat = (pl.concat([first, delta]).group_by("k", "cat").agg(pl.col("ns").sum()).filter(pl.col("ns") != 0)
              .sort(["k", "ns", "cat"], descending=[False, True, False]))
    # the chain's last hop (the earliest arrival) says where the step's path starts
    tail = (members.sort("A").group_by("k", maintain_order=True).agg(pl.col("R").first().alias("file"), pl.col("k_r").first().alias("_kr"))
            .join(win.select("file", pl.col("k").alias("_kr"), (pl.col("w0") + pl.col("off")).alias("_s")), on=["file", "_kr"]))
    first_s = start.join(win.select("file", "k", (pl.col("w0") + pl.col("off")).alias("_s0")), on=["file", "k"])
    base = first_s.join(tail.select("k", "_s"), on="k", how="left").select("k", "end", pl.col("_s").fill_null(pl.col("_s0")).alias("_b"))
    steps_f = base.select("k", (pl.col("end") - pl.col("_b")).alias("length_ns"))
    # the step's path per rank: the chain's segments (each rank's from the arrival that left it to
    # the one that reached it; the first rank's from the step's start)
    segs = (pl.concat([members.select("k", "A", pl.col("R").alias("file")), start.select("k", pl.col("end").alias("A"), "file")])
            .join(base.select("k", "_b"), on="k").sort("k", "A")
            .with_columns((pl.col("A") - pl.col("A").shift(1).over("k").fill_null(pl.col("_b"))).alias("ns"))
            .join(rank_of, on="file").group_by("k", "rank").agg(pl.col("ns").sum()).sort("k", "rank"))
    chain = (pl.concat([members.select("k", "A", pl.col("R").alias("file")),
                        start.select("k", pl.col("end").alias("A"), "file")]).join(rank_of, on="file")
             .sort("k", "A").group_by("k", maintain_order=True).agg(pl.col("rank")))
    kept = set(range(n_steps))
    for _, p in have.values():
        kept &= set(p.get("kept", range(n_steps)))
    # the waits for the ranks that set each kept step: at every collective of the step (by the
    # last-arriving rank's row) whose last member is on the step's chain, every other member's
    # wait (the table's wait_ns: until the last member arrived), on the path or not
    on_chain = pl.concat([members.select("k", "R"), start.select("k", pl.col("file").alias("R"))]).unique()
    through = (theirs.select(*key, "R", pl.col("k_r").alias("k")).join(last, on=[*key, "R"])
               .join(on_chain, on=["k", "R"]).filter(pl.col("k").is_in(sorted(kept))).select(*key, "R"))
    waits = (tk.filter(sure & (pl.col("wait_ns") > 0)).select(*key, pl.col("file").cast(pl.Int64), "wait_ns")
             .join(through, on=key).filter(pl.col("file") != pl.col("R"))
             .join(rank_of, on="file").join(rank_of.rename({"file": "R", "rank": "late"}), on="R")
             .group_by("rank", "late").agg(pl.col("wait_ns").sum()).sort("rank", "late"))
    # read back: one entry per step (a loop over steps), per (step, category), per waiting pair of ranks
    lengths = dict(steps_f.iter_rows())
    cat_of: dict[int, dict[str, int]] = {}
    for k, c, ns in by_cat.iter_rows():
        cat_of.setdefault(k, {})[c] = int(ns)
    ranks_of = dict(chain.iter_rows())
    ns_rank: dict[int, dict[str, int]] = {}
    for k, rk, ns in segs.iter_rows():
        ns_rank.setdefault(k, {})[rk] = int(ns)
    wait_rank: dict[str, dict[str, int]] = {}
    for w, late, ns in waits.iter_rows():
        wait_rank.setdefault(w, {})[late] = int(ns)
    hops_of = _chain_hops(members, rank_of)
    ref = have[min(have)][1]["steps"]
    steps = [{"step": ref[k]["step"], "length_ns": int(lengths[k]), "by_category_ns": cat_of.get(k, {}),
              "ranks": [None if r == "None" else int(r) for r in ranks_of.get(k, [])], "ns_by_rank": ns_rank.get(k, {}),
              "hops": hops_of.get(k, []), "kept": k in kept} for k in range(n_steps)]
    total: dict[str, int] = {}
    for st in steps:
        if st["kept"]:
            for c, ns in st["by_category_ns"].items():
                total[c] = total.get(c, 0) + ns
    on_path = sorted({r for st in steps for r in st["ranks"] if r is not None})
    return {"length_ns": sum(st["length_ns"] for st in steps if st["kept"]),
            "by_category_ns": dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))),
            "steps": steps, "ranks_on_path": on_path, "wait_rank_ns": wait_rank, "unstitched": unstitched}


_P2P = ("send", "recv", "sendrecv")


def _chain_hops(members: pl.DataFrame, rank_of: pl.DataFrame) -> dict[int, list[dict[str, Any]]]:
    """Per job step, the hops of its chain in time order: where the path left the late rank for a
    rank that had waited for it (``_stitch``'s chain members).  Each: the waiting ``rank``, the
    rank it ``waited_for``, the collective (``collective``/``group``/``seq``; a P2P pair's recv or
    send), ``wait_ns`` (the waiting rank's time in it before the arrival), ``arrival_ns`` (the late
    rank's arrival on the waiting rank's clock) and ``late_start_ns`` (where the late rank's part of
    the path ends, on its own clock): the export's arrows between ranks."""
    if not members.height:
        return {}
    as_int = {c: pl.when(pl.col(c) == "None").then(None).otherwise(pl.col(c)).cast(pl.Int64) for c in ("rank", "waited_for")}
    got = (members.join(rank_of, on="file").join(rank_of.rename({"file": "R", "rank": "waited_for"}), on="R")
           .sort("k", "A", "file")
           .group_by("k", maintain_order=True)
           .agg(pl.struct(as_int["rank"].alias("rank"), as_int["waited_for"].alias("waited_for"), "collective",
                          pl.when(pl.col("group") == "").then(None).otherwise(pl.col("group")).alias("group"), "seq",
                          pl.col("wait").alias("wait_ns"), (pl.col("A") - pl.col("off")).alias("arrival_ns"),
                          pl.col("s_r").alias("late_start_ns")).alias("hops")))
    return dict(zip(got.get_column("k").to_list(), got.get_column("hops").to_list()))


def _p2p_hops(rows: pl.DataFrame, win: pl.DataFrame, cats: list[str], pairs: list[dict[str, list] | None],
              ranks: list[tuple[int, int | None]], loaded: set[int]) -> pl.DataFrame | None:
    """``_stitch``'s P2P hops (see ``combine``): the on-path send and recv rows of ``rows`` whose
    other end (the pairing of ``_pair_keys``: k-th send of step N from a to b, k-th recv of step N
    on b from a) is a row of another loaded rank posted (aligned, ``A``) after this one was and by
    its end (a recv waited for its send; a rendezvous send, gloo's, for its recv); landing where
    the other rank posted it (``s_r`` one ns before, so that the walk's aligned time strictly
    decreases), its prefix there (``r_<cat>``; before its row's start: ``less``).  A row is posted
    at its start, a host row (gloo's) at the start of the op that holds its record.  None without any."""
    file_of = {rk: f for f, rk in ranks if rk is not None and f in loaded}
    frames = [pl.DataFrame(d).with_columns(pl.lit(f, pl.Int64).alias("file")) for (f, _), d in zip(ranks, pairs)
              if f in loaded and d and d.get("what") and "seq" in d]
    if not frames or len(file_of) < 2:
        return None
    recs = (pl.concat(frames, how="vertical_relaxed").filter(pl.col("seq").is_not_null())
            .with_columns(pl.col("group").cast(pl.String).fill_null(""), pl.col("seq").cast(pl.Int64),
                          pl.col("peer").replace_strict(list(file_of), list(file_of.values()), default=None, return_dtype=pl.Int64)
                          .alias("_pf")).filter(pl.col("_pf").is_not_null()))
    sends = recs.filter(pl.col("what") == "send").select(pl.col("file").alias("R"), pl.col("_pf").alias("file"), "step", "k",
                                                         pl.col("group").alias("_gs"), pl.col("seq").alias("_ss"))
    recvs = recs.filter(pl.col("what") == "recv").select("file", pl.col("_pf").alias("R"), "step", "k", "group", "seq")
    pair = recvs.join(sends, on=["file", "R", "step", "k"]).filter(pl.col("file") != pl.col("R")).unique(["file", "group", "seq"])
    if pair.height == 0:
        return None
    # both ends of a pair: a recv waits for its send, and a send that waits for its recv to be
    # posted (gloo's, a rendezvous) for the recv: either end, on its rank's path, is a hop to the other
    ends = pl.concat([
        pair.select("file", "group", "seq", pl.lit("recv").alias("collective"), "R", "_gs", "_ss", pl.lit("send").alias("_cs")),
        pair.select(pl.col("R").alias("file"), pl.col("_gs").alias("group"), pl.col("_ss").alias("seq"), pl.lit("send").alias("collective"),
                    pl.col("file").alias("R"), pl.col("group").alias("_gs"), pl.col("seq").alias("_ss"), pl.lit("recv").alias("_cs"))])
    # when each end was posted: a host row (its record's end is the row's: gloo's) from the op that
    # holds its record (``_pair_keys``' s; gloo's record may start long after the transfer, an
    # isend's when its work is waited on), within its window; a GPU row at its kernels' start
    posted = (rows.filter(pl.col("collective").is_in(["send", "recv"]))
              .join(recs.select("file", "group", "seq", pl.col("what").alias("collective"), pl.col("s").alias("_s"), pl.col("e").alias("_e"))
                    .unique(["file", "group", "seq", "collective"]), on=["file", "group", "seq", "collective"], how="left")
              .join(win.select("file", pl.col("k").alias("step_index"), "w0"), on=["file", "step_index"], how="left")
              .with_columns(pl.when(pl.col("_e") == pl.col("end_ns")).then(pl.max_horizontal(pl.min_horizontal("_s", "start_ns"), "w0"))
                            .otherwise(pl.col("start_ns")).alias("_post")))
    order = [c for c in ("cpu", "exposed_comm", "idle") if c in cats] + [c for c in cats if c not in ("cpu", "exposed_comm", "idle")]

    def less(prefix: str, delta: pl.Expr) -> list[pl.Expr]:
        """The path's prefix ``delta`` ns before the row's start: ``delta`` taken off its
        categories in ``order`` (host time first: the op that holds the record), none below 0."""
        out, before = [], pl.lit(0, pl.Int64)
        for c in order:
            col = pl.col(f"{prefix}{c}")
            out.append((col - pl.min_horizontal(col, (delta - before).clip(0))).alias(f"{prefix}{c}"))
            before = before + col
        return out

    theirs = posted.select(
        pl.col("file").alias("R"), pl.col("group").alias("_gs"), pl.col("seq").alias("_ss"), pl.col("collective").alias("_cs"),
        pl.col("step_index").alias("k_r"), (pl.col("_post") + pl.col("off")).alias("A"), (pl.col("_post") - 1).alias("s_r"),
        pl.col("start_ns").alias("_rs"), *[pl.col(f"p_{x}").alias(f"r_{x}") for x in cats])
    theirs = theirs.with_columns(less("r_", pl.col("_rs") - pl.col("s_r") - 1))
    got = (posted.filter(pl.col("on_path")).join(ends, on=["file", "group", "seq", "collective"])
           .join(theirs, on=["R", "_gs", "_ss", "_cs"])
           .filter((pl.col("A") - pl.col("off") > pl.col("_post")) & (pl.col("A") <= pl.col("end_ns") + pl.col("off")))
           .with_columns((pl.col("A") - pl.col("off") - pl.col("start_ns")).alias("_d")))
    # the arrival before the row's start (the op that holds it waited already): its prefix there
    got = got.with_columns(less("p_", (-pl.col("_d")).clip(0))).with_columns(pl.col("_d").clip(0).alias("wait"))
    return got if got.height else None


def rank_late(parts: list[dict[str, Any] | None], table: pl.DataFrame | None, ranks: list[tuple[int, int | None]] | None,
              late: set[int]) -> dict[str, Any] | None:
    """The what-if ``rank_late=0`` on the job's stitched path (a reduce over the summaries and the
    collective rows, as ``combine``): each step's predicted length had the ranks ``late`` arrived
    at every collective when the others did, or None where the job's path is not stitched.

    The walk is ``combine``'s with each collective's last member taken among the ranks not late
    (``A2``: the next-latest arrival when a late rank was last; the collective then starts its work
    at A2 instead of at A, the real last arrival, and everything after it on the path ``A - A2``
    earlier: the late rank's wait removed from the chain).  From a position (rank f, step, time T)
    the walk takes the latest on-path row of f ending by T that either moves the path (its setter
    R2, the latest member not late, is another rank that arrived after f started it, or f is late
    itself: a late rank arrives at A2 too) or saves time (A > A2); it moves to R2's start of that
    collective (or f's own, when f set it).  The step's predicted length is the last rank's window
    end less the savings on the chain less the window start of the rank the chain ends on (aligned).
    With ``late`` empty it is ``combine``'s ``length_ns`` of every step, exactly.

    Returns ``{steps: [predicted ns per step, in combine's steps' order], kept: [step indices],
    saved_ns: [per step]}``."""
    if table is None or ranks is None or table.height == 0:
        return None
    pr = _prepare(parts, table, ranks)
    if pr is None:
        return None
    have, key, n_steps, rows, win, tk, sure, last = (pr[k] for k in ("have", "key", "n_steps", "rows", "win", "tk", "sure", "last"))
    late_files = [f for f, (rk, _) in have.items() if rk is not None and rk in late]
    rest = (tk.filter(sure & ~pl.col("file").cast(pl.Int64).is_in(late_files))
            .sort(["aligned_start_ns", "file"], descending=[True, False]).group_by(key, maintain_order=True)
            .agg(pl.col("aligned_start_ns").first().alias("A2"), pl.col("file").first().cast(pl.Int64).alias("R2")))
    theirs = rows.select(*key, pl.col("file").alias("R2"), pl.col("start_ns").alias("s_r"), pl.col("step_index").alias("k_r"))
    is_late = pl.col("file").is_in(late_files)
    moves = (pl.col("R2") != pl.col("file")) & (is_late | (pl.col("A2") - pl.col("off") > pl.col("start_ns"))) \
        & (pl.col("A2") < pl.col("end_ns") + pl.col("off"))
    cand = (rows.filter(pl.col("on_path") & (pl.col("end_ns") > pl.col("start_ns"))).join(last, on=key).join(rest, on=key)
            .join(theirs, on=[*key, "R2"], how="left")
            .with_columns(moves.fill_null(False).alias("_moves"), (pl.col("A") - pl.col("A2")).clip(0).alias("saved")))
    nodes = (cand.filter(pl.col("_moves") | (pl.col("saved") > 0))
             .with_columns(pl.when(pl.col("_moves")).then(pl.col("R2")).otherwise(pl.col("file")).alias("_lf"),
                           pl.when(pl.col("_moves")).then(pl.col("k_r")).otherwise(pl.col("step_index")).alias("_lk"),
                           pl.when(pl.col("_moves")).then(pl.col("s_r")).otherwise(pl.col("start_ns")).alias("_lt"),
                           pl.when(pl.col("_moves")).then(pl.col("A2")).otherwise(pl.col("start_ns") + pl.col("off")).alias("_la"))
             .filter(pl.col("_lt").is_not_null())
             .sort("file", "step_index", "end_ns", "A").with_row_index("h").with_columns(pl.col("h").cast(pl.Int64)))
    start = _step_starts(win)
    mk, mh = _walk(nodes, start, land=("_lf", "_lk", "_lt"))
    members = pl.DataFrame({"k": mk, "h": mh}).join(nodes, on="h")
    # the chain's last member (its earliest landing, aligned) says where the step's path starts
    tail = (members.sort("_la").group_by("k", maintain_order=True).agg(pl.col("_lf").first().alias("file"), pl.col("_lk").first().alias("_kr"))
            .join(win.select("file", pl.col("k").alias("_kr"), (pl.col("w0") + pl.col("off")).alias("_s")), on=["file", "_kr"]))
    saved = members.group_by("k").agg(pl.col("saved").sum().alias("_saved"))
    first_s = start.join(win.select("file", "k", (pl.col("w0") + pl.col("off")).alias("_s0")), on=["file", "k"])
    got = (first_s.join(tail.select("k", "_s"), on="k", how="left").join(saved, on="k", how="left")
           .select("k", pl.col("_saved").fill_null(0), (pl.col("end") - pl.col("_saved").fill_null(0)
                                                        - pl.col("_s").fill_null(pl.col("_s0"))).alias("_pred")).sort("k"))
    # never above the step's measured length: a chain moved off a late rank may end on a rank whose
    # window started earlier (the lead a rank takes into a step, see test_critical_ranks), time the
    # late rank's wait did not add and its removal cannot cost
    measured = _stitch(parts, table, ranks)
    cap = [s["length_ns"] for s in measured["steps"]] if measured else None
    pred, sav = dict(got.select("k", "_pred").iter_rows()), dict(got.select("k", "_saved").iter_rows())
    if cap:
        pred = {k: min(v, cap[k]) for k, v in pred.items()}
    kept = set(range(n_steps))
    for _, p in have.values():
        kept &= set(p.get("kept", range(n_steps)))
    return {"steps": [int(pred[k]) for k in range(n_steps)], "saved_ns": [int(sav[k]) for k in range(n_steps)], "kept": sorted(kept)}


def step_waits(parts: list[dict[str, Any] | None], table: pl.DataFrame | None,
               ranks: list[tuple[int, int | None]] | None) -> dict[int, list[int]] | None:
    """Per file, per step: the ns it waited at collectives for their last member (the job table's
    ``wait_ns`` of its rows whose match is believed, by the step its row falls in); None where the
    job's path cannot be stitched (``_prepare``)."""
    if table is None or ranks is None or table.height == 0:
        return None
    pr = _prepare(parts, table, ranks)
    if pr is None:
        return None
    key, rows, tk, sure, n = pr["key"], pr["rows"], pr["tk"], pr["sure"], pr["n_steps"]
    w = (rows.select("file", *key, "step_index")
         .join(tk.filter(sure).select(pl.col("file").cast(pl.Int64), *key, pl.col("wait_ns").fill_null(0)), on=["file", *key])
         .group_by("file", "step_index").agg(pl.col("wait_ns").sum()))
    out = {f: [0] * n for f in pr["have"]}
    for f, k, ns in w.iter_rows():  # one per rank x step
        if k is not None and 0 <= k < n:
            out[f][k] = int(ns)
    return out


def steps_differ(parts: list[dict[str, Any] | None]) -> str | None:
    """Why the ranks' steps cannot be matched by index (None: they can): the job's path joins each
    rank's k-th step window, so every rank with a path must have as many windows (a rank without
    ProfilerStep spans is one window, the whole trace: its "step 1" is no other rank's step 1)."""
    counts = sorted({len(p["windows"]) for p in parts if p and p.get("windows")})
    if len(counts) < 2:
        return None
    return (f"the ranks' step counts differ ({', '.join(map(str, counts))} steps): the job's critical path is not stitched "
            "across ranks (a rank without ProfilerStep spans is one step); each rank's own path is kept")


def _prepare(parts: list[dict[str, Any] | None], table: pl.DataFrame, ranks: list[tuple[int, int | None]]) -> dict[str, Any] | None:
    """The frames ``_stitch`` and ``rank_late`` walk: the ranks' collective rows with their path
    prefixes (``rows``: p_<cat> columns, ``off`` the file's clock offset), their windows (``win``),
    steps' categories, file -> rank, the job's collective table (``tk``; ``sure``: the rows whose
    match is believed) and per collective key its last member's aligned arrival ``A`` and file ``R``."""
    have = {f: (rk, p) for (f, rk), p in zip(ranks, parts) if p and p.get("windows") and p.get("collectives")}
    if len(have) < 2 or steps_differ([p for _, p in have.values()]):
        return None
    t = table.filter(pl.col("aligned_start_ns").is_not_null())
    off = t.group_by("file").agg((pl.col("aligned_start_ns") - pl.col("start_ns")).first().alias("off"))
    off = off.with_columns(pl.col("file").cast(pl.Int64))
    if off.filter(pl.col("file").is_in(list(have))).height < len(have):
        return None
    key = ["group", "seq", "collective"]
    n_steps = min(len(p["windows"]) for _, p in have.values())
    cats = sorted({c for _, p in have.values() for c in p["collectives"]["prefix_ns"]} | {"exposed_comm"})
    # the ranks' collective rows (prefix columns: p_<cat>) and windows, on their own clocks
    frames = []
    for f, (_, p) in have.items():
        c = p["collectives"]
        cols = {k: c[k] for k in ("group", "seq", "collective", "step_index", "start_ns", "end_ns", "on_path")}
        n = len(cols["seq"])
        frames.append(pl.DataFrame({"file": [f] * n, **cols, **{f"p_{x}": c["prefix_ns"].get(x, [0] * n) for x in cats}},
                                   schema_overrides={"file": pl.Int64, "seq": pl.Int64, "step_index": pl.Int64,
                                                     "start_ns": pl.Int64, "end_ns": pl.Int64, **{f"p_{x}": pl.Int64 for x in cats}}))
    rows = (pl.concat(frames, how="diagonal_relaxed").with_columns(pl.col("group").fill_null(""), pl.col("collective").fill_null(""))
            .join(off, on="file"))
    win = pl.DataFrame([(f, k, w0, w1) for f, (_, p) in have.items() for k, (w0, w1) in enumerate(p["windows"][:n_steps])],
                       schema={"file": pl.Int64, "k": pl.Int64, "w0": pl.Int64, "w1": pl.Int64}, orient="row").join(off, on="file")
    step_cats = pl.DataFrame([(f, k, c, ns) for f, (_, p) in have.items() for k, st in enumerate(p["steps"][:n_steps])
                              for c, ns in st["by_category_ns"].items()],
                             schema={"file": pl.Int64, "k": pl.Int64, "cat": pl.String, "ns": pl.Int64}, orient="row")
    rank_of = pl.DataFrame({"file": list(have), "rank": [str(rk) for rk, _ in have.values()]}, schema={"file": pl.Int64, "rank": pl.String})
    # per collective key: the last member's aligned arrival and its file (ties: the lowest file),
    # only where every member is loaded and the match is believed
    tk = t.with_columns(pl.col("group").fill_null(""), pl.col("collective").fill_null(""))
    sure = pl.col("complete").fill_null(False) & pl.col("consistent").fill_null(True)
    last = (tk.filter(sure).sort(["aligned_start_ns", "file"], descending=[True, False]).group_by(key, maintain_order=True)
            .agg(pl.col("aligned_start_ns").first().alias("A"), pl.col("file").first().cast(pl.Int64).alias("R")))
    return {"have": have, "key": key, "n_steps": n_steps, "cats": cats, "rows": rows, "win": win, "step_cats": step_cats,
            "rank_of": rank_of, "tk": tk, "sure": sure, "last": last}


def _step_starts(win: pl.DataFrame) -> pl.DataFrame:
    """Each step's start of the job's walk: the rank whose window ends last (aligned; ties: the
    lowest file), at its window's end (``T`` its clock, ``end`` aligned)."""
    ends = win.with_columns((pl.col("w1") + pl.col("off")).alias("_e"))
    return (ends.sort(["_e", "file"], descending=[True, False]).group_by("k", maintain_order=True)
            .agg(pl.col("file").first(), pl.col("w1").first().alias("T"), pl.col("_e").first().alias("end")).sort("k"))


def _walk(hops: pl.DataFrame, start: pl.DataFrame, land: tuple[str, str, str]) -> tuple[pl.Series, pl.Series]:
    """The chains of the job's walk: from each step's start (``start``: k, file, T), the latest hop
    (``hops``: row h, of file/step_index ending by T, ``end_ns``) of that rank and step ending by T,
    then from that hop's landing (its columns ``land``: file, step index, time on that file's clock)
    the same, until none: (step k, hop h) of every chain member, by pointer doubling over the
    next-hop pointers (log2 of the chain's length rounds of ``gather``)."""
    nh = hops.height
    by_end = hops.select("file", "step_index", "end_ns", "h").sort("end_ns")

    def first_hop(pos: pl.DataFrame) -> pl.Series:
        """For each position (file, step_index, T): the latest hop of that rank and step ending by T (nh: none)."""
        got = pos.with_row_index("_i").sort("T").join_asof(by_end, left_on="T", right_on="end_ns", by=["file", "step_index"],
                                                           strategy="backward", check_sortedness=False).sort("_i")
        return got.get_column("h").fill_null(nh)

    f, k, t = land
    nxt = first_hop(hops.select(pl.col(f).alias("file"), pl.col(k).alias("step_index"), pl.col(t).alias("T")))
    jump = nxt.append(pl.Series([nh], dtype=nxt.dtype))  # the sentinel points at itself
    mk = start.get_column("k")
    mh = first_hop(start.select("file", pl.col("k").alias("step_index"), "T"))
    keep = mh < nh
    mk, mh = mk.filter(keep), mh.filter(keep)
    # pointer doubling: before round j the chains' first 2^j hops are known and ``jump`` takes a
    # hop 2^j hops on, so each known hop's jump is the next 2^j of its chain (the known hops'
    # jumps, not only the last one's: that would keep the 1st, 2nd, 4th, 8th ... hop alone)
    while True:
        nk, nxt_h = mk, jump.gather(mh)
        keep = nxt_h < nh
        nk, nxt_h = nk.filter(keep), nxt_h.filter(keep)
        if not nxt_h.len():
            break
        mk, mh = pl.concat([mk, nk]), pl.concat([mh, nxt_h])
        jump = jump.gather(jump)
    return mk, mh
