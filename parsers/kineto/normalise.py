"""Stage 2 of the Kineto parser: raw columns -> the event schema.

Batches of raw chunk frames are normalised on a second thread (``_batch``), in two rounds of
polars queries while the next chunks decode: kinds, kernel classes and collectives (once per
distinct category, name and collective name), ns times and durations, names and args cut to
size, device and stream of GPU rows, dtypes, conformed to ``EVENT_SCHEMA``.  ``_drop_far``
drops the events a garbage timestamp puts days away from the rest of the file.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from tracelens.model.collectives import P2P, dtype_bytes, normalize_collective
from tracelens.model.kclass import classify, collective_from_kernel
from tracelens.model.schema import END, TraceMeta, conform_exprs

from .decode import _null_col, _split_args

MAX_NAME_BYTES = 64 << 10  # a longer event name is cut (the longest real kernel names: a few KB)
MAX_ARGS_BYTES = 1 << 20  # longer args are dropped (a collective's or a cat of 1000 tensors': tens of KB)
FAR_NS = 86_400 * 10**9  # an event further than a day from the file's median start is not of this trace
_STEP_RE = r"^ProfilerStep#\d+$"
_DATALOADER_RE = r"(?i)enumerate\(DataLoader\)|DataLoaderIter\.__next__|^## data_load"
_SYNC_RE = r"^(cuda|hip|cu)(Device|Stream|Event|Ctx)Synchronize"
_BAD_DUR = (pl.col("dur") * 1000.0 + pl.col("ts").cast(pl.Float64)).abs() >= 9.2e18


def _drop_far(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """Events more than ``FAR_NS`` from the median start of the file's events: one garbage
    ``ts`` (0 in an epoch-time trace) or a runaway ``dur`` would stretch every window and share
    over years.  A real trace spans minutes."""
    med = df.get_column("ts_ns").median()
    if med is None:
        return df
    end = END
    far = ((pl.col("ts_ns") - med).abs() > FAR_NS) | ((end - med).abs() > FAR_NS)
    n = df.select(far.sum()).item()
    if not n:
        return df
    first = df.filter(far).row(0, named=True)
    meta.warnings.append(
        f"{n} events more than a day away from the trace's other events were dropped (a garbage ts or dur; the first: "
        f"{str(first['name'])[:60]!r} at ts {first['ts_ns'] / 1e3:.0f} µs, dur {first['dur_ns'] / 1e3:.0f} µs)"
    )
    return df.filter(~far)



_DEVICE_CATS = ["kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"]
_KEEP_TEMP = ("_pid", "_tid", "_is_dev")  # needed by the whole-file steps, dropped by conform


def _batch(frames: list[pl.DataFrame], args: list[bytes], us: list[bool], keep_args: bool) -> tuple[pl.DataFrame, Counter[str]]:
    """One batch of raw chunk frames normalised into the event schema (plus _KEEP_TEMP), with the
    counts of what was clamped or dropped; runs on the second thread.  µs timestamps become ns,
    the args texts (joined by NUL per frame) a column, and every event gets its kind, class and
    collective.  Two rounds of polars queries (each ``collect_all`` releases the GIL once: the
    decoding thread holds it most of the time, so every round trip waits)."""
    # one in-memory frame that every query below scans (a lazy concat would be redone per query)
    if any(us) and not all(us):
        frames = [f.with_columns(pl.col("ts") * 1000) if u else f for f, u in zip(frames, us)]
    df = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical", rechunk=False)
    del frames
    if all(us):
        df = df.with_columns(pl.col("ts") * 1000)
    n = df.height
    raw = df.lazy()
    queries = [
        raw.select(
            ((pl.col("dur") < 0) & ~_BAD_DUR).sum().alias("neg_dur"),
            pl.col("dur").is_null().sum().alias("no_dur"),
            pl.col("cat").is_in(["Operator", "Kernel", "Runtime"]).sum().alias("old_schema"),
            pl.col("ts").null_count().alias("no_ts"),
            _BAD_DUR.sum().alias("bad_dur"),
        ),
        # what an event is (kind, class, collective) depends on its category, name and
        # collective name only: worked out once per distinct combination, then joined back
        raw.select(_COMBO).unique(),
        raw.select(pl.col("dtype").drop_nulls().unique()),
    ]
    if keep_args:  # the args texts of the host events (_hargs), joined by NUL per frame
        m = df.get_column("_hargs").sum()
        parts = pl.Series("args", args, dtype=pl.Binary)
        queries.append(pl.LazyFrame([parts]).select(pl.col("args").cast(pl.String).str.split("\x00")).explode("args"))
    try:
        stats, combos, dtypes, *text = pl.collect_all(queries, engine="in-memory")
    except pl.exceptions.PolarsError:  # invalid UTF-8 in the args: split below, after Python's decoder
        if not keep_args:
            raise
        stats, combos, dtypes = pl.collect_all(queries[:3], engine="in-memory")
        text = [pl.DataFrame({"args": pl.Series([], dtype=pl.String)})]
    c: Counter[str] = Counter(stats.row(0, named=True))
    if keep_args:
        col = text[0].get_column("args")
        if col.len() != m or col.null_count():  # invalid UTF-8 (replaced), or a raw NUL in a string
            col = _split_args(args, m) if m else col
        if col is None:  # the decoder rejects raw control characters in strings: not seen, but never guessed
            c["args_unsplit"] += m
            col = _null_col(pl.String, n).alias("args")
        elif m < n:  # null on the events whose args no analysis reads (kernels, runtime calls, ...)
            col = _null_col(pl.String, n).alias("args").clone().scatter(df.get_column("_hargs").arg_true(), col)
    else:
        col = _null_col(pl.String, n).alias("args")
    if col.null_count() < n and col.str.len_bytes().max() > MAX_ARGS_BYTES:  # no analysis reads such args
        long = col.str.len_bytes() > MAX_ARGS_BYTES
        c["long_args"] += long.sum()
        col = pl.select(pl.when(long).then(None).otherwise(col).alias("args")).to_series()
    long_names = combos.get_column("name").drop_nulls().str.len_bytes().max() or 0
    if long_names > MAX_NAME_BYTES:
        c["long_name"] += raw.select((pl.col("name").str.len_bytes() > MAX_NAME_BYTES).sum()).collect().item()
    colls = combos.get_column("coll_name").drop_nulls().unique().to_list()
    combos = combos.with_columns(
        _CAT_L.is_in(_DEVICE_CATS).alias("_is_dev"),
        _CAT_L.alias("_cat_l"),
        pl.col("name").fill_null("").alias("_name"),
        (
            pl.col("coll_name").replace_strict({x: normalize_collective(x) for x in colls}, default=None, return_dtype=pl.String)
            if colls
            else pl.lit(None, pl.String)
        ).alias("collective"),
    ).with_columns(_KIND.alias("kind"))
    # Kernel classes, once per distinct kernel name (copies and fills by their category).
    kernel_names = combos.filter(pl.col("kind") == "kernel").get_column("_name").unique().to_list()
    classes = {n: classify(n) for n in kernel_names}
    comm_no_coll = [n for n in kernel_names if classes[n] == "comm"]
    from_kernel = {n: collective_from_kernel(n) for n in comm_no_coll}
    combos = combos.lazy().with_columns(
        pl.when(pl.col("kind") == "kernel")
        .then(pl.col("_name").replace_strict(classes, default="other", return_dtype=pl.String) if classes else pl.lit("other"))
        .when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy"))
        .when(pl.col("kind") == "memset")
        .then(pl.lit("memset"))
        .otherwise(None)
        .alias("kclass"),
        # the collective from the kernel name when the kernel carries no args (older PyTorch)
        (
            pl.when(pl.col("collective").is_null() & (pl.col("kind") == "kernel"))
            .then(pl.col("_name").replace_strict(from_kernel, default=None, return_dtype=pl.String))
            .otherwise(pl.col("collective"))
            if from_kernel
            else pl.col("collective")
        ).alias("collective"),
    ).select(*_COMBO, "_is_dev", "kind", "kclass", "collective")
    dsize = {d: dtype_bytes(d) for d in dtypes.get_column("dtype").to_list()}
    elem = pl.col("dtype").replace_strict(dsize, default=None, return_dtype=pl.Int64) if dsize else pl.lit(None, pl.Int64)
    lf = pl.concat([raw, col.to_frame().lazy()], how="horizontal")
    if c["no_ts"] or c["bad_dur"]:
        lf = lf.filter(pl.col("ts").is_not_null() & ~_BAD_DUR.fill_null(False))
    lf = (
        lf.join(combos, on=_COMBO, how="left", nulls_equal=True, maintain_order="left")
        .with_columns(
            (pl.col("name").fill_null("").str.slice(0, MAX_NAME_BYTES) if long_names > MAX_NAME_BYTES else pl.col("name").fill_null("")),
            ((pl.col("dur").fill_null(0.0).clip(lower_bound=0.0) * 1000.0).round()).cast(pl.Int64).alias("dur_ns"),
            # bytes: explicit, else the larger message (nccl-tests' "size") x element size
            pl.coalesce(pl.col("_bytes"), pl.max_horizontal(pl.col("in_nelems"), pl.col("out_nelems")) * elem).alias("bytes"),
            pl.when(pl.col("_is_dev")).then(pl.coalesce(pl.col("_device"), pl.col("_pid"))).otherwise(None).cast(pl.Int32).alias("device"),
            pl.when(pl.col("_is_dev")).then(pl.coalesce(pl.col("_stream"), pl.col("_tid"))).otherwise(None).alias("stream"),
            pl.when(pl.col("_is_dev")).then(None).otherwise(pl.col("_pid")).alias("pid"),
            pl.when(pl.col("_is_dev")).then(None).otherwise(pl.col("_tid")).alias("tid"),
            pl.col("ts").alias("ts_ns"),
            pl.col("ext_id").alias("external_id"),
            pl.col("pg_name").alias("group"),
            pl.col("pg_desc").alias("group_desc"),
            pl.lit("kineto").alias("source"),
            pl.lit(0, dtype=pl.Int32).alias("file"),
            pl.lit(-1, dtype=pl.Int32).alias("rank"),
        )
        # a runtime call's args (External id, correlation, cbid) are all columns already; a cuda_sync
        # event's are what it waits on (the critical path's event edges: tracelens.analysis.rank.critical)
        .with_columns(
            pl.when(pl.col("kind") == "runtime").then(None)
            .when((pl.col("kind") == "sync") & pl.col("_is_dev") & (pl.col("_wait_stream").is_not_null() | pl.col("_wait_corr").is_not_null()))
            .then(pl.concat_str(pl.lit('{"wait_on_stream":'), pl.col("_wait_stream").fill_null(-1),
                                pl.lit(',"wait_on_cuda_event_record_corr_id":'), pl.col("_wait_corr").fill_null(-1), pl.lit("}")))
            .otherwise(pl.col("args")).alias("args"))
        .with_columns(
            (pl.col("kind").is_in(["cpu_op", "runtime", "python"]) & pl.col("tid").is_null()).alias("_no_tid"),
            (pl.col("kind").is_in(["kernel", "memcpy", "memset"]) & pl.col("device").is_null()).alias("_no_dev"),
        )
    )
    columns = lf.collect_schema().names()
    out = lf.select(conform_exprs(columns) + list(_KEEP_TEMP) + ["_no_tid", "_no_dev"]).collect(engine="in-memory")
    no_tid, no_dev = out.get_column("_no_tid").sum(), out.get_column("_no_dev").sum()
    c["no_tid"] += no_tid
    c["no_dev"] += no_dev
    if no_tid or no_dev:
        out = out.filter(~(pl.col("_no_tid") | pl.col("_no_dev")))
    return out.drop("_no_tid", "_no_dev"), c


_COMBO = ["cat", "name", "coll_name"]
_CAT_L = pl.col("cat").str.to_lowercase()
_CPU_OP_CATS = ["cpu_op", "operator"]
_RUNTIME_CATS = ["cuda_runtime", "cuda_driver", "runtime"]
# the kind of an event, on a frame with _cat_l, _name, _is_dev and collective
_KIND = (
    pl.when(pl.col("_name").str.contains(_STEP_RE) & ~pl.col("_is_dev"))
    .then(pl.lit("step"))
    .when(pl.col("_name").str.contains(_DATALOADER_RE) & ~pl.col("_is_dev"))
    .then(pl.lit("dataloader"))
    .when(
        pl.col("_cat_l").is_in(_CPU_OP_CATS)
        & (pl.col("_name") == "record_param_comms")
        & (pl.col("collective").fill_null("") != "wait")  # c10d::wait's record moves no data
    )
    .then(pl.when(pl.col("collective").is_in(list(P2P))).then(pl.lit("p2p")).otherwise(pl.lit("collective")))
    .when(pl.col("_cat_l").is_in(_CPU_OP_CATS))
    .then(pl.lit("cpu_op"))
    .when(pl.col("_cat_l").is_in(["user_annotation", "gpu_user_annotation"]))
    .then(pl.lit("annotation"))
    .when(pl.col("_cat_l") == "python_function")
    .then(pl.lit("python"))
    .when(pl.col("_cat_l").is_in(_RUNTIME_CATS) & pl.col("_name").str.contains(_SYNC_RE))
    .then(pl.lit("sync"))
    .when(pl.col("_cat_l").is_in(_RUNTIME_CATS))
    .then(pl.lit("runtime"))
    .when(pl.col("_cat_l") == "cuda_sync")
    .then(pl.lit("sync"))
    .when(pl.col("_cat_l") == "kernel")
    .then(pl.lit("kernel"))
    .when(pl.col("_cat_l").is_in(["gpu_memcpy", "memcpy"]))
    .then(pl.lit("memcpy"))
    .when(pl.col("_cat_l").is_in(["gpu_memset", "memset"]))
    .then(pl.lit("memset"))
    .otherwise(pl.lit("other"))
)
