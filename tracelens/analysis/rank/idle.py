"""Why the GPU idled (DESIGN.md 4.3): what the launching host thread was doing in each gap."""

from __future__ import annotations

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.analysis.options import Options
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


def _blocking_spans(df: pl.DataFrame, gpu_rows: pl.DataFrame) -> pl.DataFrame:
    """(tid, s, e, name, leaf) of the host spans that block on the GPU: the blocking calls
    (``leaf``) and the sync ops, and the copy ops (aten::to, _to_copy, copy_) that hold a
    blocking call on their thread (a non_blocking=False copy), up to three levels out."""
    pageable = gpu_rows.filter((pl.col("kind") == "memcpy") & pl.col("name").cast(pl.String).str.contains("(?i)pageable"))
    pageable = pageable.get_column("correlation").drop_nulls()
    host = (  # the host kinds the spans below come from, without the other columns
        df.lazy().filter(pl.col("tid").is_not_null() & pl.col("kind").is_in(["runtime", "sync", "cpu_op"]))
        .select("tid", "kind", "name", pl.col("ts_ns").alias("s"), END.alias("e"),
                pl.col("kind").is_in(["runtime", "sync"]).alias("leaf"), "correlation")
        .collect()
    )
    # the regexes run over the distinct names, not over a String copy of every host row's name
    distinct = host.get_column("name").unique().cast(pl.String).drop_nulls()
    blocking_names = distinct.filter(distinct.str.contains(_BLOCKING)).implode()
    async_copy_names = distinct.filter(distinct.str.contains(_ASYNC_COPY)).implode()
    name = pl.col("name")  # Categorical: is_in compares the categories, the String cast is of the few rows kept
    blocking = host.filter(
        (pl.col("kind") == "sync")
        | (pl.col("kind").is_in(["runtime", "cpu_op"]) & name.is_in(blocking_names))
        | ((pl.col("kind") == "runtime") & name.is_in(async_copy_names) & pl.col("correlation").is_in(pageable.implode()))
    ).select("tid", "s", "e", name.cast(pl.String), "leaf")
    copies = host.filter((pl.col("kind") == "cpu_op") & name.is_in(list(_COPY_OPS))).select(
        "tid", pl.col("s").alias("_cs"), pl.col("e").alias("_ce"), name.cast(pl.String).alias("_cn")).sort("_cs")
    found, inner = [], blocking.filter(pl.col("leaf")).select("tid", "s", "e")
    for level in range(3):  # each copy op that holds a blocking call (or a copy op found before)
        if not inner.height or not copies.height:
            break
        held = (
            inner.sort("s")
            .join_asof(copies, left_on="s", right_on="_cs", by="tid", strategy="backward",
                       allow_exact_matches=level == 0, check_sortedness=False)
            .filter(pl.col("_cs").is_not_null() & (pl.col("_ce") >= pl.col("e")))
            .select("tid", pl.col("_cs").alias("s"), pl.col("_ce").alias("e"), pl.col("_cn").alias("name"))
            .unique()
        )
        found.append(held.with_columns(pl.lit(False).alias("leaf")))
        inner = held.select("tid", "s", "e")
    return pl.concat([blocking, *found]).unique().filter(pl.col("e") > pl.col("s")).sort("tid", "s", "e", "name", "leaf")


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

    def __init__(self, df: pl.DataFrame, gpu_rows: pl.DataFrame, options: Options, main_tid: int | None):
        self.main_tid = main_tid
        self.gpu_rows = gpu_rows
        self.by_start: dict[int, tuple] = {}  # filled by ``ends`` for the gap ends only
        self.sync_by: dict[int, dict[str, int]] = {}  # step -> blocking call -> sync idle (ns)
        self.graph_latency: dict[int, int] = {}  # step -> launch latency ending at graph-replayed kernels
        self.graph_host: dict[int, int] = {}  # step -> host launch idle ending at graph-replayed kernels
        host = df.select("tid", "kind", "name", "ts_ns", "dur_ns").filter(pl.col("tid").is_not_null())
        data = host.filter(pl.col("kind") == "dataloader")
        if options.data_range:
            data = pl.concat([data, host.filter(pl.col("name").cast(pl.String).str.contains(options.data_range))])
        self.dl: dict[int, iv.Intervals] = {
            tid: iv.union_of(g) for (tid,), g in data.partition_by("tid", as_dict=True).items()
        }
        self.dl_any = iv.normalize([p for ivs in self.dl.values() for p in ivs])
        blocking = _blocking_spans(df, gpu_rows)
        self.block: dict[int, iv.Intervals] = {}
        self.block_spans: dict[int, tuple[list, list, list, list]] = {}
        self.sync_ends: dict[int, tuple[list[int], list[str]]] = {}
        for (tid,), g in blocking.partition_by("tid", as_dict=True).items():  # one per host thread
            self.block[tid] = iv.union_of(g.with_columns((pl.col("e") - pl.col("s")).alias("d")), "s", "d")
            self.block_spans[tid] = tuple(g.get_column(c).to_list() for c in ("s", "e", "name", "leaf"))
            by_end = g.sort("e", pl.col("leaf").not_())
            self.sync_ends[tid] = (by_end.get_column("e").to_list(), by_end.get_column("name").to_list())

    def ends(self, ends: list[int]) -> None:
        """Look up the activities that end the idle gaps (the first to start at each end)."""
        if not ends:
            return
        firsts = (
            self.gpu_rows.filter(pl.col("ts_ns").is_in(sorted(set(ends))))
            .with_columns(
                ((pl.col("kclass") == "comm") & pl.col("collective").cast(pl.String).is_in(["send", "recv"])).alias("_p2p")
            )
            .sort("ts_ns", "launch_ns")
            .group_by("ts_ns", maintain_order=True)
            .first()
            .select("ts_ns", "launch_ns", "launch_tid", "launch_known", "_p2p", "launch_graph")
        )
        cols = [firsts.get_column(c).to_list() for c in firsts.columns]
        self.by_start = dict(zip(cols[0], zip(*cols[1:])))

    def dl_spans(self, tid: int | None) -> iv.Intervals:
        return self.dl.get(tid, []) if tid is not None else self.dl_any

    def _blocker(self, tid, x: int, y: int) -> str:
        """The blocking call of ``tid`` that covers most of [x, y) (a runtime call before the op
        that holds it)."""
        from bisect import bisect_left

        starts, ends, names, leaf = self.block_spans[tid]
        j = bisect_left(starts, y)
        best = None
        for k in range(j - 1, max(j - 64, 0) - 1, -1):  # spans on one thread nest: the few before y
            ov = min(ends[k], y) - max(starts[k], x)
            if ov > 0 and (best is None or (leaf[k], ov) > best[0]):
                best = ((leaf[k], ov), names[k])
        return best[1] if best else "synchronize"

    def _sync(self, step: int, name: str, ns: int) -> None:
        d = self.sync_by.setdefault(step, {})
        d[name] = d.get(name, 0) + ns

    def split(self, gaps: iv.Intervals, step: int) -> IdleSplit:
        """Split the idle gaps of step ``step``'s window."""
        from bisect import bisect_left

        out = dict.fromkeys(IDLE_KEYS, 0)
        for a, b in gaps:
            k = self.by_start.get(b)
            if k is None:  # nothing starts at the gap's end: the tail of the window
                dl = iv.length(iv.clip(self.dl_spans(self.main_tid), a, b))
                out["data_loading"] += dl
                out["other"] += (b - a) - dl
                continue
            launch, tid, known, p2p, graph = k
            if p2p:
                out["pipeline_bubble"] += b - a
                continue
            if not known:
                out["other"] += b - a
                continue
            h = min(max(launch, a), b)
            if h < b:  # k* was queued: sync where it waited long with the host in a blocking call, else latency
                blocked = iv.length(iv.clip(self.block.get(tid, []), h, b)) if b - h >= _QUEUED_WAIT_NS else 0
                if blocked:
                    out["sync"] += blocked
                    self._sync(step, self._blocker(tid, h, b), blocked)
                out["launch_latency"] += (b - h) - blocked
                if graph:
                    self.graph_latency[step] = self.graph_latency.get(step, 0) + (b - h) - blocked
            if h == a:
                continue
            dl = iv.length(iv.clip(self.dl_spans(tid), a, h))
            out["data_loading"] += dl
            rest = (h - a) - dl
            if rest:
                ends, names = self.sync_ends.get(tid, ([], []))
                i = bisect_left(ends, a - _SYNC_SLACK_NS)
                if i < len(ends) and ends[i] < h:
                    out["sync"] += rest
                    self._sync(step, names[i], rest)
                else:
                    out["host_launch"] += rest
                    if graph:
                        self.graph_host[step] = self.graph_host.get(step, 0) + rest
        return IdleSplit(**out)
