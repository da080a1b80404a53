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
  recorded stream before the record; otherwise the whole device);
* blocking copies: a runtime call that returns after its own copy (or kernel) ends, ends after it.

**Path.**  Every edge weighs the time between its nodes, so every path between two nodes has the
same length: the difference of their times.  The critical path of a step window [t0, t1] is the
longest path into its last node (the last GPU or step-thread node at or before t1) that follows,
at every node, the dependency that was satisfied last (its zero-slack in-edge: the one from the
latest node in the order): what the node actually waited for.  Walking those last-arriving edges
back to t0 (the edge that crosses t0 is cut there) gives a path whose length is t1 - t0, the
step's time, exactly; its segments are charged to categories, so the categories sum to the length
in integer ns.  Each node's last-arriving in-edge is one polars ``group_by`` over all candidate
edges of the rank, and the path back from each step's end is read by pointer doubling (log2 of
the path's length rounds of ``gather``, all steps at once): no Python loop per event, no graph
object.  (rustworkx 0.18 measured on control.json.gz, 35 MB, with only the 150 k chosen edges: 69 ms
to hand them over as Python tuples, 22 ms to build the graph, 59 ms in ``dag_longest_path``, whose
weights come from a Python callback per edge; the whole polars path here costs about that.)

**Categories** (``by_category_ns``): ``cpu`` (host ops and untraced host time), ``data_loading``
(host time inside a DataLoader span), ``launch_overhead`` (runtime launch calls, the latency
from a launch to its activity, the gap before an activity that waited on the one before it on its
stream), ``compute_<kclass>`` (compute kernels by class), ``exposed_comm`` (communication kernels:
on the path nothing hides them), ``memcpy`` (copies and fills), ``sync`` (synchronize calls and
the hand-off from the GPU to a blocked host, stream waits on events), ``idle`` (the step's time
before the first and after the last node the path reaches through a known dependency).

Not in this slice: cross-rank edges (a collective waits for its last rank), the autograd
thread hand-off, CUDA-graph replays' inner dependencies.  The what-if replay (replay.py) reweighs this graph (``graph()``).
"""

from __future__ import annotations

from dataclasses import dataclass
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


# the dependencies (candidate_edges' ``kind``): the previous point on a thread; the forward/backward
# hand-off; an activity's start -> end; launch call -> activity; activity -> the end of a call that
# returned after it (a launch call, a blocking copy); the previous activity on the stream; a
# synchronize call after what it waited for; an event wait's activity after the recorded one
EDGE_KINDS = ("thread", "handoff", "act", "launch", "return_launch", "return_sync", "stream", "sync", "wait")
EDGE_KIND = pl.Enum(EDGE_KINDS)


def _c(cat: str) -> pl.Expr:
    return pl.lit(cat, dtype=CAT)


@dataclass(frozen=True)
class StepPath:
    """One step's critical path: its length (== the step window's), ns per category, the events
    that took the most of it."""

    length_ns: int
    by_category_ns: dict[str, int]
    top_events: list[dict[str, Any]]
    nodes: int  # events' start/end points on the path
    rows: tuple[int, ...] = ()  # the rows (in the rank's frame) of the events with a point on the path, in order

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
    timed = pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()
    mine = pl.lit(True) if device is None else (pl.col("device") == device)
    host = lf.filter(pl.col("tid").is_not_null() & pl.col("kind").is_in(HOST_KINDS) & timed).select(
        "_row", "pid", "tid", "kind", "ts_ns", "dur_ns", "correlation",
        pl.when(pl.col("kind") == "dataloader").then(_c(_DL))
        .when(pl.col("kind") == "sync").then(_c(_SYNC))
        .when((pl.col("kind") == "runtime") & names.like(LAUNCH_RE)).then(_c(_LAUNCH))
        .otherwise(_c(_CPU)).alias("cat"),
        ((pl.col("kind") == "runtime") & names.like(r"(?i)memcpy")).alias("copy"),
        ((pl.col("kind") == "cpu_op") & names.like(AUTOGRAD_RE)).any().over("pid", "tid").alias("autograd"),
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
    return (
        pts.with_columns(phase.alias("_ph"), lane.alias("_ln"), durkey.alias("_dk"))
        .sort("t", "_ph", "_ln", "_dk", "dev", "_row", maintain_order=True)  # the keys are unique: the same order, the stable sort is cheaper
        .with_row_index("o")
        .select(pl.col("o").cast(pl.Int64), "t", "_row", "dev", "end", "ts_ns", "dur_ns", *cols)
        .collect(engine="in-memory")
    )


def candidate_edges(host: pl.DataFrame, gpu: pl.DataFrame, dsync: pl.DataFrame, nodes: pl.DataFrame,
                    main_tid: int | None) -> pl.LazyFrame:
    """The candidate in-edges of every node: (v, u, cat, owner, kind) with u before v in the order;
    ``owner``: the row in ``df`` of the event the segment is charged to (null: none); ``kind``:
    which dependency (EDGE_KINDS; tracelens.analysis.rank.replay reweighs them)."""
    hn = nodes.filter(~pl.col("dev"))  # host points, with their event's columns
    gn = nodes.filter(pl.col("dev"))
    schema = {"v": pl.Int64, "u": pl.Int64, "cat": CAT, "owner": pl.UInt32, "kind": EDGE_KIND}
    out: list[pl.LazyFrame] = []

    # per thread: the previous point.  The interval after a start is its event's; after an end, the
    # event that ends next when the next point is an end (the innermost one open), else its parent's
    # self time or untraced host time between top-level events (cpu); inside a DataLoader span, data loading
    th = hn.sort("pid", "tid", maintain_order=True)  # hn is in node order: a stable sort by thread is by (thread, o), 4x cheaper
    same_prev = (pl.col("tid") == pl.col("tid").shift(1)) & (pl.col("pid") == pl.col("pid").shift(1))
    same_next = (pl.col("tid") == pl.col("tid").shift(-1)) & (pl.col("pid") == pl.col("pid").shift(-1))
    after_cat = (pl.when(~pl.col("end")).then(pl.col("cat"))
                 .when(same_next & pl.col("end").shift(-1)).then(pl.col("cat").shift(-1)).otherwise(_c(_CPU)))
    after_owner = (pl.when(~pl.col("end")).then(pl.col("_row"))
                   .when(same_next & pl.col("end").shift(-1)).then(pl.col("_row").shift(-1)).otherwise(None))
    if bool((host.get_column("cat") == _DL).any()):  # the running count of DataLoader spans open (balanced per thread)
        in_dl = (pl.when(pl.col("cat") == _DL).then(pl.when(pl.col("end")).then(-1).otherwise(1)).otherwise(0).cum_sum() > 0)
        after_cat = pl.when(in_dl).then(_c(_DL)).otherwise(after_cat)
    th = th.with_columns(after_cat.alias("_icat"), after_owner.alias("_iown"))
    out.append(
        th.lazy().select(
            pl.col("o").alias("v"),
            pl.when(same_prev).then(pl.col("o").shift(1)).alias("u"),
            pl.col("_icat").shift(1).alias("cat"),
            pl.col("_iown").shift(1).alias("owner"),
            pl.lit("thread").alias("kind"),
        )
    )
    # the forward/backward hand-off: a point on the step thread after the last end on a thread of
    # its process that runs autograd work, and a point on such a thread after the last point on the step thread
    if main_tid is not None:
        on_part = th.filter(pl.col("autograd") & (pl.col("tid") != main_tid)).select("o", "pid", "end").sort("o")
        if on_part.height:
            on_main = th.filter(pl.col("tid") == main_tid).select("o", "pid")
            by = {"by": "pid"} if host.get_column("pid").n_unique() > 1 else {}  # one process (the usual case): no groups, 4x cheaper
            out.append(on_main.join_asof(on_part.filter(pl.col("end")).select(pl.col("o").alias("u"), "pid"), left_on="o",
                                         right_on="u", strategy="backward", allow_exact_matches=False,
                                         check_sortedness=False, **by)
                       .lazy().select(pl.col("o").alias("v"), "u", _c(_CPU).alias("cat"), pl.lit(None).alias("owner"),
                                      pl.lit("handoff").alias("kind")))
            out.append(on_part.join_asof(on_main.select(pl.col("o").alias("u"), "pid"), left_on="o", right_on="u",
                                         strategy="backward", allow_exact_matches=False, check_sortedness=False, **by)
                       .lazy().select(pl.col("o").alias("v"), "u", _c(_CPU).alias("cat"), pl.lit(None).alias("owner"),
                                      pl.lit("handoff").alias("kind")))
    # an activity's end after its start
    gs = gn.filter(~pl.col("end")).select(pl.col("o").alias("_s"), "_row", "stream", "ts_ns", "dur_ns", "correlation", "cat")
    ge = gn.filter(pl.col("end")).select(pl.col("o").alias("_e"), "_row")
    acts = gs.join(ge, on="_row")  # one row per activity: its start and end nodes
    out.append(acts.lazy().select(pl.col("_e").alias("v"), pl.col("_s").alias("u"), "cat", pl.col("_row").alias("owner"),
                                     pl.lit("act").alias("kind")))
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
        pl.col("_s").alias("v"), pl.col("_cs").alias("u"), _c(_LAUNCH).alias("cat"), pl.col("_crow").alias("owner"),
        pl.lit("launch").alias("kind")))
    # (a launch call that outlasts its kernel is launch overhead; a copy the host waits for, sync)
    out.append(acts.lazy().join(ce.lazy(), on="correlation").select(
        pl.col("_ce").alias("v"), pl.col("_e").alias("u"),
        pl.when(pl.col("_ccat") == _LAUNCH).then(_c(_LAUNCH)).otherwise(_c(_SYNC)).alias("cat"),
        pl.col("_crow2").alias("owner"),
        pl.when(pl.col("_ccat") == _LAUNCH).then(pl.lit("return_launch")).otherwise(pl.lit("return_sync")).alias("kind")))
    # per stream: the previous activity's end
    acts = acts.with_columns(pl.col("_cts").fill_null(pl.col("ts_ns")).alias("_lts"))  # when it was launched
    prev = acts.lazy().sort("_s").select(
        pl.col("_s").alias("v"), pl.col("_e").shift(1).over("stream").alias("u"), _c(_LAUNCH).alias("cat"),
        pl.col("_row").alias("owner"), pl.lit("stream").alias("kind"))
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
        dev_s = syncs.filter(~(is_stream | is_event).fill_null(False)).sort("v").join_asof(
            ends.select("u"), left_on="v", right_on="u", strategy="backward", allow_exact_matches=False)
        for f in (stream_s, event_s, dev_s):
            out.append(f.lazy().select("v", "u", _c(_SYNC).alias("cat"), "owner", pl.lit("sync").alias("kind")))
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
        out.append(dst.lazy().select(pl.col("_s").alias("v"), "u", _c(_SYNC).alias("cat"), pl.col("_crow").alias("owner"),
                                  pl.lit("wait").alias("kind")))
    edges = pl.concat([e.select([pl.col(k).cast(t) for k, t in schema.items()]) for e in out])
    return edges.filter(pl.col("u").is_not_null() & pl.col("v").is_not_null() & (pl.col("u") < pl.col("v")))


def _edges(host: pl.DataFrame, gpu: pl.DataFrame, dsync: pl.DataFrame, nodes: pl.DataFrame, main_tid: int | None) -> pl.DataFrame:
    """Each node's last-arriving in-edge (v, u, cat, owner, kind): of its candidate edges, the one from the latest node."""
    return _last_arriving(candidate_edges(host, gpu, dsync, nodes, main_tid))


def _last_arriving(edges: pl.LazyFrame) -> pl.DataFrame:
    return (
        edges
        .sort((pl.col("v") * (1 << 31) + pl.col("u")), maintain_order=True)  # by node, then dependency (stable: cheaper)
        .filter(pl.col("v") != pl.col("v").shift(-1).fill_null(-1))  # each node's last-arriving dependency
        .collect(engine="in-memory")
    )


def graph(df: pl.DataFrame, device: int | None, main_tid: int | None, names: Names) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """(host events, GPU activities, nodes, candidate edges) of the rank's graph (None: no event);
    the what-if replay's input (tracelens.analysis.rank.replay)."""
    host, gpu, dsync = _events(df, device, names)
    if host.height + gpu.height == 0:
        return None
    nodes = _nodes(host, gpu)
    return host, gpu, nodes, candidate_edges(host, gpu, dsync, nodes, main_tid).collect(engine="in-memory")


def step_paths(df: pl.DataFrame, device: int | None, windows: list[tuple[int, int]], main_tid: int | None,
               names: Names, with_rows: bool = False, g: Any = False) -> list[StepPath]:
    """The critical path of each window (a step's GPU window, in order); ``with_rows``: with the
    rows of the events on it (``StepPath.rows``, for tests); ``g``: the rank's ``graph()`` when
    already built (the what-if replay shares it)."""
    n_win = len(windows)
    if g is False:
        host, gpu, dsync = _events(df, device, names)
        if host.height + gpu.height == 0:
            g = None
        else:
            nodes = _nodes(host, gpu)
            edges = _edges(host, gpu, dsync, nodes, main_tid)
    elif g is not None:
        host, gpu, nodes, cand = g
        edges = _last_arriving(cand.lazy())
    if g is None:
        return [StepPath(max(e - s, 0), {_IDLE: max(e - s, 0)} if e > s else {}, [], 0) for s, e in windows]
    n = nodes.height
    t = nodes.get_column("t")
    # each node's last-arriving dependency (null for none) and that edge's category and event
    # (scattered into arrays indexed by node: each node has at most one such edge)
    at = edges.get_column("v")
    p0 = pl.repeat(None, n, dtype=pl.Int64, eager=True).scatter(at, edges.get_column("u"))
    cat = pl.repeat(None, n, dtype=CAT, eager=True).scatter(at, edges.get_column("cat"))
    owner = pl.repeat(None, n, dtype=pl.UInt32, eager=True).scatter(at, edges.get_column("owner"))
    # the jump table: a node with no dependency points at a sentinel (n) that is before every window
    jump = p0.fill_null(n).append(pl.Series([n], dtype=pl.Int64))
    tj = t.append(pl.Series([-(1 << 62)], dtype=pl.Int64))
    # each window's last node: the last device point or point on the step thread at or before its end
    ends_ok = (nodes if main_tid is None else nodes.filter(pl.col("dev") | (pl.col("tid") == main_tid))).select("o", "t")
    win = pl.DataFrame({"k": list(range(n_win)), "t0": [s for s, _ in windows], "t1": [e for _, e in windows]},
                       schema={"k": pl.Int64, "t0": pl.Int64, "t1": pl.Int64})
    z = win.sort("t1").join_asof(ends_ok.rename({"t": "_zt"}), left_on="t1", right_on="_zt", strategy="backward") \
        .filter(pl.col("o").is_not_null() & (pl.col("_zt") >= pl.col("t0"))).select("k", pl.col("o").alias("node"))
    # the path back from each window's last node to its start, by pointer doubling: after round j
    # ``members`` holds the first 2^j nodes of each path (its nodes before t0 dropped)
    # the path back from each window's last node to its start, by pointer doubling: after round j
    # ``members`` holds the first 2^j nodes of each path (those before t0 dropped); a round's jumps
    # land on nodes no earlier round held (the path's nodes strictly decrease in the order)
    # (on Series: a round is four gathers and a filter, no query plan)
    members = z.join(win.select("k", "t0"), on="k")
    mk, mt0, mnode = members.get_column("k"), members.get_column("t0"), members.get_column("node")
    while True:
        nxt = jump.gather(mnode)
        keep = tj.gather(nxt) >= mt0
        if not keep.any():
            break
        mk, mt0, mnode = (pl.concat([a, b], rechunk=True) for a, b in ((mk, mk.filter(keep)), (mt0, mt0.filter(keep)), (mnode, nxt.filter(keep))))
        jump = jump.gather(jump)
    members = pl.DataFrame({"k": mk, "node": mnode})
    # the segments: each path node from its dependency (cut at t0), the lead-in and the tail idle
    # (columns by gathers on the node arrays; the summaries in one collect_all)
    su = p0.gather(mnode)
    ut = t.gather(su.fill_null(0))
    seg = pl.DataFrame({"k": mk, "t0": mt0, "_t": t.gather(mnode), "_u": su, "_ut": ut, "cat": cat.gather(mnode),
                        "owner": owner.gather(mnode)}).lazy().select(
        "k", "owner",
        (pl.col("_t") - pl.max_horizontal(pl.when(pl.col("_u").is_not_null()).then(pl.col("_ut")).otherwise(pl.col("t0")),
                                          pl.col("t0"))).alias("ns"),
        pl.when(pl.col("_u").is_null()).then(_c(_IDLE)).otherwise(pl.col("cat")).alias("cat"),
    )
    ztime = z.with_columns(t.gather(z.get_column("node")).alias("_zt"))
    tails = win.lazy().join(ztime.lazy(), on="k", how="left").select(
        "k", _c(_IDLE).alias("cat"), (pl.col("t1") - pl.col("_zt").fill_null(pl.col("t0"))).alias("ns"))
    parts = pl.concat([seg.select("k", "cat", "ns"), tails]).filter(pl.col("ns") > 0)
    top = seg.filter(pl.col("owner").is_not_null() & (pl.col("ns") > 0)).group_by("k", "owner").agg(
        pl.col("ns").sum(), pl.col("cat").first())
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
    rows_of = {}
    if with_rows:
        on_path = (members.join(nodes.select(pl.col("o").alias("node"), "_row"), on="node")
                   .group_by("k").agg(pl.col("_row").unique().sort()))
        rows_of = {k: tuple(r) for k, r in on_path.iter_rows()}  # one list per window
    out = []
    for k, (s, e) in enumerate(windows):
        by = dict(sorted(cats[k].items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(StepPath(sum(by.values()), by, tops[k], int(nodes_on.get(k, 0)), rows_of.get(k, ())))
    return out


def summarize(paths: list[StepPath], steps, kept_idx: list[int]) -> dict[str, Any]:
    """The rank's ``critical_path``: over the kept steps, and each step's."""
    total: dict[str, int] = {}
    for i in kept_idx:
        for c, ns in paths[i].by_category_ns.items():
            total[c] = total.get(c, 0) + ns
    return {
        "length_ns": sum(paths[i].length_ns for i in kept_idx),
        "by_category_ns": dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))),
        "steps": [p.to_dict(s.step) for p, s in zip(paths, steps)],
    }


def combine(parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The job's ``critical_path``: the ranks' kept-step totals summed (no cross-rank edges yet)."""
    got = [p for p in parts if p]
    if not got:
        return None
    total: dict[str, int] = {}
    for p in got:
        for c, ns in p["by_category_ns"].items():
            total[c] = total.get(c, 0) + ns
    return {"length_ns": sum(p["length_ns"] for p in got),
            "by_category_ns": dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))}
