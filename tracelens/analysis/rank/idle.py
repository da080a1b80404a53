"""Why the GPU idled (DESIGN.md 4.3): what the launching host thread was doing in each gap."""

from __future__ import annotations

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.analysis.rank.names import Names
from tracelens.analysis.rank.names import of as of_names
from tracelens.model.options import Options
from tracelens.model.schema import END
from tracelens.model.summary import IDLE_KEYS, IdleSplit

# Host calls that block until the GPU catches up: synchronizes, copies that return only when
# done (cudaMemcpy, hipMemcpyWithStream: what PyTorch's non_blocking=False copies use on ROCm,
# cuMemcpyDtoH), and the ops known to synchronize.  A cudaMemcpyAsync of pageable memory
# blocks too; so does an aten::to / _to_copy / copy_ that holds one of these calls.
_SYNC_CALL = r"(cuda|hip|cu)(Device|Stream|Event|Ctx)Synchronize"


_BLOCKING_COPY = r"(cuda|hip)Memcpy(2D|3D|Peer|ToSymbol|FromSymbol)?|hipMemcpyWithStream|hipMemcpy(DtoH|HtoD|DtoD)|cuMemcpy(DtoH|HtoD|DtoD)?"


_SYNC_OPS = r"aten::item|aten::_local_scalar_dense|aten::nonzero"


_BLOCKING = rf"^({_SYNC_CALL}|{_BLOCKING_COPY}|{_SYNC_OPS})(_v2|_ptds|_ptsz)?$"


_ASYNC_COPY = r"^(cuda|hip|cu)Memcpy\w*Async\w*$"


_COPY_OPS = ["aten::to", "aten::_to_copy", "aten::copy_"]


_GRAPH_LAUNCH = r"^(cuda|hip|cu)GraphLaunch"


_SYNC_SLACK_NS = 1_000  # a blocking call that returned this close before the gap still drained it


# A queued kernel starts within a few µs of the previous one (MFU.md 9.4); one that waits this long
# while its launching thread sits in a blocking call is held up with the host (sync drain).  The
# short kernel-to-kernel waits of a queue draining under a synchronize stay launch latency.
_QUEUED_WAIT_NS = 50_000

_DL_KEY = ["_any", "tid"]  # which DataLoader union: every thread's (_any) or one thread's


def _blocking_spans(df: pl.DataFrame, gpu_rows: pl.DataFrame, names: Names | None = None) -> pl.DataFrame:
    """(tid, s, e, name, leaf) of the host spans that block on the GPU: the blocking calls
    (``leaf``) and the sync ops, and the copy ops (aten::to, _to_copy, copy_) that hold a
    blocking call on their thread (a non_blocking=False copy), up to three levels out."""
    names = of_names(df, names)
    pageable = gpu_rows.filter((pl.col("kind") == "memcpy") & names.like("(?i)pageable"))
    pageable = pageable.get_column("correlation").drop_nulls()
    host = (  # the host kinds the spans below come from, without the other columns
        df.lazy().filter(pl.col("tid").is_not_null() & pl.col("kind").is_in(["runtime", "sync", "cpu_op"]))
        .select("tid", "kind", "name", pl.col("ts_ns").alias("s"), END.alias("e"),
                pl.col("kind").is_in(["runtime", "sync"]).alias("leaf"), "correlation")
    )
    # the regexes run over the distinct names, not over a String copy of every host row's name
    blocking_names = names.matching(_BLOCKING).implode()
    async_copy_names = names.matching(_ASYNC_COPY).implode()
    name = pl.col("name")  # Categorical: is_in compares the categories, the String cast is of the few rows kept
    blocking = host.filter(
        (pl.col("kind") == "sync")
        | (pl.col("kind").is_in(["runtime", "cpu_op"]) & name.is_in(blocking_names))
        | ((pl.col("kind") == "runtime") & name.is_in(async_copy_names) & pl.col("correlation").is_in(pageable.implode()))
    ).select("tid", "s", "e", name.cast(pl.String), "leaf")
    copies = host.filter((pl.col("kind") == "cpu_op") & name.is_in(list(_COPY_OPS))).select(
        "tid", pl.col("s").alias("_cs"), pl.col("e").alias("_ce"), name.cast(pl.String).alias("_cn")).sort("_cs")
    # one batch (the host rows read once), lazy chains below: each eager step would be a query of its own
    blocking, copies = pl.collect_all([blocking, copies], engine="in-memory")
    found, inner = [], blocking.lazy().filter(pl.col("leaf")).select("tid", "s", "e").collect(engine="in-memory")
    for level in range(3):  # each copy op that holds a blocking call (or a copy op found before)
        if not inner.height or not copies.height:
            break
        held = (
            inner.lazy().sort("s")
            .join_asof(copies.lazy(), left_on="s", right_on="_cs", by="tid", strategy="backward",
                       allow_exact_matches=level == 0, check_sortedness=False)
            .filter(pl.col("_cs").is_not_null() & (pl.col("_ce") >= pl.col("e")))
            .select("tid", pl.col("_cs").alias("s"), pl.col("_ce").alias("e"), pl.col("_cn").alias("name"))
            .unique()
            .collect(engine="in-memory")
        )
        found.append(held.lazy().with_columns(pl.lit(False).alias("leaf")))
        inner = held.select("tid", "s", "e")
    return (pl.concat([blocking.lazy(), *found]).unique().filter(pl.col("e") > pl.col("s")).sort("tid", "s", "e", "name", "leaf")
            .collect(engine="in-memory"))


class _IdleAttribution:
    """Splits idle gaps by what the launching thread was doing (DESIGN.md 4.3, MFU.md 9.4).

    For a gap [a, b), k* is the GPU activity that starts at b, launched at l by thread t;
    h = min(max(l, a), b).  [h, b): k* was already queued; if it waited 50 µs or more, the part
    of the wait while t sits in a blocking call (a synchronize, a blocking copy, a
    non_blocking=False aten::to) is sync drain, the rest launch latency.  [a, h) is host
    starvation: the part under a DataLoader span of t is data loading; the rest is sync drain
    if t had just returned from a blocking call, else host launch overhead.  A gap ended by a
    pipeline send/recv is pipeline bubble; a gap with no k* (the tail of the last step) is data
    loading where the main thread waited for data, else other.  Per step, it also keeps which
    blocking calls the sync drain was spent in and how much launch latency / host launch idle
    ends at kernels replayed from CUDA graphs."""

    def __init__(self, df: pl.DataFrame, gpu_rows: pl.DataFrame, options: Options, main_tid: int | None,
                 names: Names | None = None):
        self.main_tid = main_tid
        self.gpu_rows = gpu_rows
        self.sync_by: dict[int, dict[str, int]] = {}  # step -> blocking call -> sync idle (ns)
        self.graph_latency: dict[int, int] = {}  # step -> launch latency ending at graph-replayed kernels
        self.graph_host: dict[int, int] = {}  # step -> host launch idle ending at graph-replayed kernels
        self.splits: dict[int, IdleSplit] = {}  # step -> its idle split, filled by ``run``
        host = df.lazy().select("tid", "kind", "name", "ts_ns", "dur_ns").filter(pl.col("tid").is_not_null())
        data = host.filter(pl.col("kind") == "dataloader")
        if options.data_range:
            data = pl.concat([data, host.filter(of_names(df, names).like(options.data_range))])
        data = data.select("tid", pl.col("ts_ns").alias("s"), END.alias("e"))
        # the DataLoader spans of each thread (_any false) and of all threads at once (_any true, tid 0)
        per_thread = iv.merged(data.with_columns(pl.lit(False).alias("_any")), by=_DL_KEY)
        every = iv.merged(data.select(pl.lit(True).alias("_any"), pl.lit(0, pl.Int64).alias("tid"), "s", "e"), by=_DL_KEY)
        blocking = _blocking_spans(df, gpu_rows, names)  # (tid, s, e, name, leaf), sorted
        self.blocking = blocking.with_row_index("_i").with_columns(pl.col("_i").cast(pl.Int64))
        self.dl, self.block = pl.collect_all([
            iv.with_before(pl.concat([per_thread, every]), by=_DL_KEY),
            iv.with_before(iv.merged(blocking.lazy().select("tid", "s", "e"), by=["tid"]), by=["tid"]),
        ], engine="in-memory")

    def _dl_key(self, tid: pl.Expr) -> list[pl.Expr]:
        """The DataLoader union to look in: the thread's own, or every thread's when it is unknown."""
        return [tid.is_null().alias("_any"), tid.fill_null(0).alias("tid")]

    def dl_host(self, windows: list[tuple[int, int]]) -> list[int]:
        """Per window, the main thread's time inside DataLoader spans (every thread's without one)."""
        if not windows:
            return []
        q = pl.LazyFrame({"_w": range(len(windows)), "x": [w[0] for w in windows], "y": [max(w) for w in windows]},
                         schema={"_w": pl.Int64, "x": pl.Int64, "y": pl.Int64})
        q = q.with_columns(*self._dl_key(pl.lit(self.main_tid, pl.Int64)))
        q = iv.covered(iv.covered(q, "x", self.dl.lazy(), "_cx", by=_DL_KEY), "y", self.dl.lazy(), "_cy", by=_DL_KEY)
        return q.sort("_w").select(pl.col("_cy") - pl.col("_cx")).collect(engine="in-memory").to_series().to_list()

    def run(self, gaps: pl.DataFrame, blocks: pl.DataFrame | None = None, side_groups: list[str] | None = None) -> None:
        """Split every idle gap (``gaps``: step, a, b, from segments.cut_frames) at once: fills
        ``splits``, ``sync_by``, ``graph_latency`` and ``graph_host``.  ``blocks`` (_step, s, e:
        the pipeline analysis's micro-batch blocks, ``rank.pipeline.rank_pipeline``): in a step
        with blocks a gap outside every block is pipeline bubble, one inside a block is split as
        any other (no name rule); steps without blocks keep the rule (a gap ended by a P2P
        kernel is bubble, unless its process group is one of ``side_groups``: P2P that is no
        pipeline hand-off, a context-parallel ring or an MoE exchange, ``rank.pipeline.side_groups``)."""
        if gaps.height == 0:
            return
        if blocks is not None and blocks.height:
            runs = iv.merged(blocks.lazy().select(pl.col("_step").alias("step"), "s", "e"), by=["step"]).collect(engine="in-memory")
            piped = runs.select(pl.col("step").unique())
            inside = (gaps.select("step", "a").with_row_index("_gi").sort("a")
                      .join_asof(runs.sort("s"), left_on="a", right_on="s", by="step", strategy="backward", check_sortedness=False)
                      .select("_gi", (pl.col("e").is_not_null() & (pl.col("a") < pl.col("e"))).alias("_inblock")).sort("_gi"))
            gaps = gaps.with_columns(pl.col("step").is_in(piped.get_column("step").implode()).alias("_piped"),
                                     inside.get_column("_inblock").alias("_inblock"))
        else:
            gaps = gaps.with_columns(pl.lit(False).alias("_piped"), pl.lit(False).alias("_inblock"))
        # the activity that ends each gap: the first to start at its end (the first launched among them)
        firsts = (
            self.gpu_rows.lazy().filter(pl.col("ts_ns").is_in(gaps.get_column("b").unique().implode()))
            .with_columns(
                ((pl.col("kclass") == "comm") & pl.col("collective").cast(pl.String).is_in(["send", "recv"])
                 & ~pl.col("group").cast(pl.String).fill_null("").is_in(list(side_groups or []))).alias("_p2p")
            )
            .sort("ts_ns", "launch_ns")
            .group_by("ts_ns", maintain_order=True)
            .first()
            .select(pl.col("ts_ns").alias("b"), "launch_ns", pl.col("launch_tid").alias("tid"), "launch_known", "_p2p", "launch_graph")
        )
        a, b, tid = pl.col("a"), pl.col("b"), pl.col("tid")
        found = pl.col("launch_ns").is_not_null()
        # the bubble: outside the blocks of a pipeline step, else (no blocks) a gap ended by a P2P kernel
        p2p = (pl.col("_piped") & ~pl.col("_inblock")) | (~pl.col("_piped") & found & pl.col("_p2p").fill_null(False))
        normal = found & ~p2p & pl.col("launch_known")
        h = pl.min_horizontal(pl.max_horizontal(pl.col("launch_ns"), a), b)
        g = (
            gaps.lazy().with_row_index("_g").join(firsts, on="b", how="left")
            .with_columns(found.alias("_found"), p2p.alias("_bubble"), normal.alias("_normal"), h.alias("h"),
                          pl.col("launch_graph").fill_null(False).alias("_graph"))
            .with_columns(
                # [h, b): k* was queued; a long wait with the thread in a blocking call is sync drain
                pl.when(pl.col("_normal") & (b - pl.col("h") >= _QUEUED_WAIT_NS) & tid.is_not_null())
                .then(pl.col("h")).otherwise(b).alias("_bx"),
                # the DataLoader time looked up: [a, b) of the main thread after the last activity, [a, h) of tid before k*
                pl.when(~pl.col("_found")).then(b).when(pl.col("_normal")).then(pl.col("h")).otherwise(a).alias("_dy"),
                *(e.alias(n) for e, n in zip(self._dl_key(pl.when(pl.col("_found")).then(tid).otherwise(pl.lit(self.main_tid, pl.Int64))),
                                              ("_dany", "_dtid"))),
            )
        )
        def covered(q: pl.LazyFrame, at: str, runs: pl.DataFrame, alias: str, rename: dict[str, str]) -> pl.LazyFrame:
            if runs.height == 0:  # no blocking call or no DataLoader span in the trace: nothing covered (no as-of join to plan)
                return q.with_columns(pl.lit(0, pl.Int64).alias(alias))
            return iv.covered(q, at, runs.lazy().rename(rename), alias, by=list(rename.values()))

        g = g.with_columns(tid.fill_null(0).alias("_btid"))
        g = covered(covered(g, "_bx", self.block, "_c0", {"tid": "_btid"}), "b", self.block, "_c1", {"tid": "_btid"})
        dl_key = {"_any": "_dany", "tid": "_dtid"}
        g = covered(covered(g, "a", self.dl, "_d0", dl_key), "_dy", self.dl, "_d1", dl_key)
        blocked = pl.col("_c1") - pl.col("_c0")
        dl_ns = pl.col("_d1") - pl.col("_d0")
        g = g.with_columns(
            blocked.alias("_blocked"), dl_ns.alias("_dl"),
            pl.when(pl.col("_normal")).then(pl.col("h") - a - dl_ns).otherwise(0).alias("_rest"),
        )
        # host starvation [a, h) outside data loading: sync drain if tid had just returned from a blocking call
        # of the calls that end at one ns (nested copy ops around their memcpy), the runtime call, else
        # the first to start (the outermost; the per-thread sort this replaces meant that order but
        # was not stable, so ties could fall either way)
        ends = (
            self.blocking.lazy().sort("tid", "e", pl.col("leaf").not_(), "s", "name")
            .unique(["tid", "e"], keep="first", maintain_order=True)
            .select("tid", pl.col("e").alias("_se"), pl.col("name").alias("_sn"))
        )
        g = (
            g.with_columns((a - _SYNC_SLACK_NS).alias("_from"))
            .sort("_from")
            .join_asof(ends.sort("_se"), left_on="_from", right_on="_se", by="tid", strategy="forward", check_sortedness=False)
            .with_columns(((pl.col("_rest") > 0) & pl.col("_se").is_not_null() & (pl.col("_se") < pl.col("h"))).alias("_after_sync"))
        )
        split = g.with_columns(
            pl.when(pl.col("_bubble")).then(0).otherwise(pl.col("_dl")).alias("data_loading"),
            pl.when(pl.col("_after_sync")).then(0).otherwise(pl.col("_rest")).alias("host_launch"),
            (pl.col("_blocked") + pl.when(pl.col("_after_sync")).then(pl.col("_rest")).otherwise(0)).alias("sync"),
            pl.when(pl.col("_normal")).then(b - pl.col("h") - pl.col("_blocked")).otherwise(0).alias("launch_latency"),
            pl.when(pl.col("_bubble")).then(b - a).otherwise(0).alias("pipeline_bubble"),
            pl.when(pl.col("_bubble")).then(0).when(~pl.col("_found")).then(b - a - pl.col("_dl")).when(~pl.col("_normal")).then(b - a)
            .otherwise(0).alias("other"),
        ).with_columns(
            pl.when(pl.col("_graph")).then(pl.col("launch_latency")).otherwise(0).alias("_glat"),
            pl.when(pl.col("_graph")).then(pl.col("host_launch")).otherwise(0).alias("_ghost"),
        )
        g = split.collect(engine="in-memory")
        per_step, blockers = pl.collect_all([
            g.lazy().group_by("step").agg(pl.col(*IDLE_KEYS, "_glat", "_ghost").sum()),
            self._blockers(g.lazy().filter(pl.col("_blocked") > 0).select("_g", "tid", "h", "b")),
        ], engine="in-memory")
        for row in per_step.iter_rows(named=True):  # one per step
            step = row.pop("step")
            self.graph_latency[step], self.graph_host[step] = row.pop("_glat"), row.pop("_ghost")
            self.splits[step] = IdleSplit(**row)
        where = pl.concat([  # one lazy query
            g.lazy().join(blockers.lazy(), on="_g", how="left").filter(pl.col("_blocked") > 0)
            .select("step", pl.col("_bn").fill_null("synchronize").alias("name"), pl.col("_blocked").alias("ns")),
            g.lazy().filter(pl.col("_after_sync")).select("step", pl.col("_sn").alias("name"), pl.col("_rest").alias("ns")),
        ]).group_by("step", "name").agg(pl.col("ns").sum()).collect(engine="in-memory")
        for step, name, ns in where.iter_rows():  # one per step and blocking call
            self.sync_by.setdefault(step, {})[name] = ns

    def _blockers(self, q: pl.LazyFrame) -> pl.LazyFrame:
        """(_g, _bn): for each query (_g, tid, h, b), the blocking call of ``tid`` that covers most of
        [h, b), among the 64 that start last before b (spans on one thread nest), a runtime call
        before the op that holds it."""
        spans = self.blocking.lazy()
        last = (  # the last span of each thread to start at each start
            spans.group_by("tid", "s").agg(pl.col("_i").max().alias("_last"))
            .join(spans.group_by("tid").agg(pl.col("_i").min().alias("_first")), on="tid")
            .sort("s")
        )
        cand = (
            q.sort("b")
            .join_asof(last, left_on="b", right_on="s", by="tid", strategy="backward", allow_exact_matches=False,
                       check_sortedness=False)
            .filter(pl.col("_last").is_not_null())
            .select("_g", "h", "b", pl.int_ranges(pl.max_horizontal(pl.col("_last") - 63, pl.col("_first")), pl.col("_last") + 1)
                    .alias("_i"))
            .explode("_i")
            .join(spans.select("_i", "s", "e", "name", "leaf"), on="_i")
            .with_columns((pl.min_horizontal("e", "b") - pl.max_horizontal("s", "h")).alias("_ov"))
            .filter(pl.col("_ov") > 0)
        )
        return (
            cand.sort("_g", "leaf", "_ov", "_i", descending=[False, True, True, True])
            .group_by("_g", maintain_order=True).first()
            .select("_g", pl.col("name").alias("_bn"))
        )

    def split(self, step: int) -> IdleSplit:
        """The idle split of step ``step``'s window (after ``run``)."""
        return self.splits.get(step, IdleSplit())
