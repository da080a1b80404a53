"""Stage 3 of the Kineto parser: the steps that need the whole file.

Collective records named from the host ops around them (``_name_collectives``), process groups
from ``distributedInfo.pg_config``, launch <-> GPU activity correlation from ac2g flows, the host
record of each collective carried onto its kernel with a sequence number for every collective
(``_attach_comm_records``), and the device the rank ran on (``_device``).
"""

from __future__ import annotations

import polars as pl

from tracelens.model.collectives import P2P, dtype_bytes, normalize_collective
from tracelens.model.schema import END, TraceMeta

from .decode import _Builder, _shown

_BACKEND_ANN = r"^(gloo|nccl|rccl|mpi|ucc|xccl):"


# The size of each collective's message by what the record names it (nccl-tests' "size"): the input
# for most, the output for an all-gather or gather (the input times the group size)
_OUTPUT_SIZED = ("allgather", "gather")
_PLAIN_DIMS = r"^\[\s*(\d+\s*(,\s*\d+\s*)*)?\]$"  # one tensor's shape: [], [384], [8,1024] (not a list of tensors)


def _with_tensor_bytes(rows: pl.DataFrame, n: int = 2) -> pl.DataFrame:
    """``_b0`` .. ``_b{n-1}``: bytes of each op's first ``n`` recorded inputs (``Input Dims`` x the
    size of ``Input type``), and ``_t0``, ``_t1``.. their types; null where the input is not one
    plain tensor (a TensorList, a scalar) or its type has no known size.  ``rows`` holds few rows
    (the collective records and the ops around them): the JSON of their args is read by polars."""
    rows = rows.with_columns(
        *[pl.col("args").str.json_path_match(f"$['Input Dims'][{i}]").alias(f"_d{i}") for i in range(n)],
        *[pl.col("args").str.json_path_match(f"$['Input type'][{i}]").alias(f"_t{i}") for i in range(n)],
    )
    types = {t for i in range(n) for t in rows.get_column(f"_t{i}").drop_nulls().unique().to_list()}
    size = {t: dtype_bytes(t) for t in types}
    out = []
    for i in range(n):
        d = pl.col(f"_d{i}")
        numel = pl.when(d.str.contains(_PLAIN_DIMS)).then(
            d.str.extract_all(r"\d+").cast(pl.List(pl.Int64)).list.eval(pl.element().product()).list.first())
        elem = pl.col(f"_t{i}").replace_strict(size, default=None, return_dtype=pl.Int64) if size else pl.lit(None, pl.Int64)
        out.append((numel * elem).alias(f"_b{i}"))
    return rows.with_columns(out).drop([f"_d{i}" for i in range(n)])


def _name_collectives(df: pl.DataFrame) -> pl.DataFrame:
    """What each collective record is and how many bytes it moves, when its ``record_param_comms``
    does not say (older PyTorch records no ``Collective name`` or message sizes), from the host ops
    around it on its thread: the ``c10d::allreduce_`` (etc.) op that encloses it, the backend's
    annotation (``nccl:all_to_all``) inside it, the record's own recorded input tensor.  A backend
    annotation that no record covers (gloo on the CPU, ``nccl:_all_gather_base`` launched without a
    record, a trace without any) is the collective's record itself.  Bytes: the record's input
    tensor, else its annotation's, else the largest tensor of its c10d op; for an all-gather the
    c10d op's output (the largest), else the input times the group size."""
    # match on the distinct names, not on a String copy of the whole column
    names = pl.Series(df.get_column("name").unique().cast(pl.String).drop_nulls())
    backend = names.filter(names.str.contains(_BACKEND_ANN)).to_list()
    c10d = names.filter(names.str.starts_with("c10d::")).to_list()
    cand = (
        (pl.col("kind").is_in(["collective", "p2p"]))
        | ((pl.col("kind") == "annotation") & ~pl.col("_is_dev") & pl.col("name").is_in(backend))
        | ((pl.col("kind") == "cpu_op") & pl.col("name").is_in(c10d))
    )
    sub = (
        df.select("kind", "_is_dev", "name", "args", "pid", "tid", "ts_ns", "dur_ns", "collective", "bytes", "dtype", "group_size",
                  pl.col("group").cast(pl.String))
        .with_row_index("_row")
        .filter(cand & pl.col("tid").is_not_null())
        .with_columns(pl.col("name").cast(pl.String), pl.col("collective").cast(pl.String), pl.col("dtype").cast(pl.String),
                      END.alias("_end"))
    )
    if sub.height == 0 or not sub.select(pl.col("kind").is_in(["collective", "p2p", "annotation"]).any()).item():
        return df
    sub = _with_tensor_bytes(sub)
    names = sub.filter(pl.col("kind") != "collective").get_column("name").unique().to_list()
    norm = {}
    for n in names:
        if n.startswith("c10d::"):
            norm[n] = normalize_collective(n.removeprefix("c10d::").rstrip("_"))
        elif ":" in n:
            norm[n] = normalize_collective(n.split(":", 1)[1])
    sub = sub.with_columns(
        pl.when(pl.col("kind").is_in(["collective", "p2p"])).then(pl.col("collective"))
        .otherwise(pl.col("name").replace_strict(norm, default=None, return_dtype=pl.String) if norm else pl.lit(None, pl.String))
        .alias("_c"))
    recs = sub.filter(pl.col("kind").is_in(["collective", "p2p"]))
    anns = sub.filter((pl.col("kind") == "annotation") & pl.col("_c").is_not_null() & (pl.col("_c") != "wait"))
    ops = sub.filter(pl.col("kind") == "cpu_op").select(
        "pid", "tid", pl.col("ts_ns").alias("_ots"), pl.col("_end").alias("_oend"), pl.col("_c").alias("_oc"),
        pl.max_horizontal("_b0", "_b1").alias("_ob")).sort("_ots")
    # the record each annotation is inside (or encloses): the last record on its thread that starts
    # before the annotation ends, if it has not ended before the annotation starts
    covered = (
        anns.select("_row", "pid", "tid", "ts_ns", "_end", "_c", "_b0", "_t0").sort("_end")
        .join_asof(recs.select("pid", "tid", pl.col("ts_ns").alias("_rts"), pl.col("_end").alias("_rend"),
                               pl.col("_row").alias("_rrow")).sort("_rts"),
                   left_on="_end", right_on="_rts", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .with_columns((pl.col("_rts").is_not_null() & (pl.col("_rend") >= pl.col("ts_ns"))).alias("_covered"))
    )
    lent = (
        covered.filter("_covered").sort("ts_ns")
        .group_by("_rrow").agg(pl.col("_c").first().alias("_ac"), pl.col("_b0").first().alias("_ab"), pl.col("_t0").first().alias("_at"))
        .rename({"_rrow": "_row"})
    )
    promoted = covered.filter(~pl.col("_covered")).get_column("_row")
    rows = (
        pl.concat([recs, anns.filter(pl.col("_row").is_in(promoted.implode()))])
        .join(lent, on="_row", how="left")
        .sort("ts_ns")
        .join_asof(ops, left_on="ts_ns", right_on="_ots", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .with_columns(pl.when(pl.col("_oend") >= pl.col("ts_ns")).then(pl.col("_oc")).alias("_oc"),
                      pl.when(pl.col("_oend") >= pl.col("ts_ns")).then(pl.col("_ob")).alias("_ob"))
        .with_columns(pl.coalesce("_c", "_oc", "_ac").alias("_coll"))
    )
    # a coalesced group (``nccl:coalesced``, its record) ends the ops posted into it on its thread: one
    # of sends and recvs (``batch_isend_irecv``) is P2P, its SendRecv kernel a transfer, no collective;
    # where it names no process group, its members' is its own
    members = rows.filter(pl.col("_coll").fill_null("") != "coalesced").select(
        "pid", "tid", pl.col("ts_ns").alias("_mts"), pl.col("_coll").alias("_mc"), pl.col("group").alias("_mg")).sort("_mts")
    rows = (rows.sort("ts_ns")
            .join_asof(members, left_on="ts_ns", right_on="_mts", by=["pid", "tid"], strategy="backward", allow_exact_matches=False,
                       check_sortedness=False)
            .with_columns((pl.col("_coll") == "coalesced").fill_null(False).alias("_co"))
            .with_columns(pl.when(pl.col("_co") & pl.col("_mc").is_in(list(P2P))).then(pl.lit("sendrecv"))
                          .otherwise(pl.col("_coll")).alias("_coll"),
                          pl.when(pl.col("_co")).then(pl.col("_mg")).alias("_mg")))
    own = pl.when(pl.col("_t0").is_not_null() & pl.col("_b0").is_not_null()).then(pl.col("_b0"))
    from_input = pl.coalesce(own, pl.col("_ab"))
    rows = rows.with_columns(
        pl.coalesce(
            "bytes",
            pl.when(pl.col("_coll").is_in(list(_OUTPUT_SIZED)))
            .then(pl.coalesce(pl.col("_ob"), from_input * pl.col("group_size").cast(pl.Int64)))
            .otherwise(pl.coalesce(from_input, pl.col("_ob"))),
        ).alias("_nb"),
        pl.coalesce("dtype", pl.when(pl.col("_b0").is_not_null()).then(pl.col("_t0")),
                    pl.when(pl.col("_ab").is_not_null()).then(pl.col("_at"))).alias("_dt"),
        pl.when(pl.col("_coll").is_in(list(P2P))).then(pl.lit("p2p")).otherwise(pl.lit("collective")).alias("_k"),
    )
    # a batch's bytes: its members' (the sends and recvs of its group posted on its thread since the last batch),
    # null when one of them has none
    batch = rows.filter("_co").select("pid", "tid", pl.col("ts_ns").alias("_cts"), pl.col("_row").alias("_crow"), pl.col("_mg").alias("_cg"))
    if batch.height:
        sums = (rows.filter(~pl.col("_co") & pl.col("_coll").is_in(list(P2P))).select("pid", "tid", "ts_ns", "_nb", "group").sort("ts_ns")
                .join_asof(batch.sort("_cts"), left_on="ts_ns", right_on="_cts", by=["pid", "tid"], strategy="forward", check_sortedness=False)
                .filter(pl.col("_crow").is_not_null() & (pl.col("group").cast(pl.String) == pl.col("_cg").cast(pl.String)))
                .group_by("_crow").agg(pl.when(pl.col("_nb").null_count() == 0).then(pl.col("_nb").sum()).alias("_bsum")))
        rows = (rows.join(sums.rename({"_crow": "_row"}), on="_row", how="left")
                .with_columns(pl.when(pl.col("_co")).then(pl.coalesce("_nb", "_bsum")).otherwise("_nb").alias("_nb")))
    rows = rows.select("_row", "_coll", "_nb", "_dt", "_k", "_mg")
    return _scatter_fill(df, rows, {"collective": ("_coll", True), "bytes": ("_nb", True), "dtype": ("_dt", True),
                                    "kind": ("_k", True), "group": ("_mg", False)})


def _group_from_pg_config(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """A collective record that names no group but its ``Process Group ID`` (PyTorch 2.0/2.1: the
    group's uid) or its ``Process Group Ranks`` is in the one ``distributedInfo.pg_config`` group
    with that uid, or the only one with those ranks (several groups over the same ranks: unknown)."""
    pgs = meta.distributed.get("pg_config")
    if not (isinstance(pgs, list) and len(pgs) > 1):
        return df  # none, or one (_single_group)
    need = pl.col("kind").is_in(["collective", "p2p"]) & pl.col("group").is_null() & pl.col("args").is_not_null()
    rows = df.select("kind", "group", "args").with_row_index("_row").filter(need)
    if rows.height == 0:
        return df
    by_uid, by_ranks = {}, {}
    for pg in pgs:
        if not isinstance(pg, dict) or pg.get("pg_name") is None:
            continue
        if isinstance(pg.get("uid"), int):
            by_uid[str(pg["uid"])] = pg
        if isinstance(pg.get("ranks"), list):
            by_ranks.setdefault(str(pg["ranks"]).replace(" ", ""), []).append(pg)
    by_ranks = {k: v[0] for k, v in by_ranks.items() if len(v) == 1}
    if not by_uid and not by_ranks:
        return df
    rows = rows.select(
        "_row",
        pl.col("args").str.json_path_match("$['Process Group ID']").alias("_id"),
        pl.col("args").str.json_path_match("$['Process Group Ranks']").str.replace_all(r"[\s\"]", "").alias("_rk"),
    )
    pick = {}
    for key, src, table in (("_id", "uid", by_uid), ("_rk", "ranks", by_ranks)):
        for v in rows.get_column(key).drop_nulls().unique().to_list():
            if v in table:
                pick.setdefault(key, {})[v] = table[v]
    if not pick:
        return df

    def look(field: str, cast) -> pl.Expr:
        exprs = [pl.col(key).replace_strict({v: cast(pg.get(field)) for v, pg in m.items()}, default=None, return_dtype=pl.String)
                 for key, m in pick.items()]
        return pl.coalesce(exprs)

    rows = rows.with_columns(look("pg_name", str).alias("_g"), look("pg_desc", lambda x: x if isinstance(x, str) else None).alias("_gd"),
                             look("pg_size", lambda x: str(x) if isinstance(x, int) else None).cast(pl.Int64).alias("_gs"))
    rows = rows.filter(pl.col("_g").is_not_null())
    return _scatter_fill(df, rows, {"group": ("_g", False), "group_desc": ("_gd", False), "group_size": ("_gs", False)})


def _single_group(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """With exactly one process group in ``distributedInfo.pg_config``, a collective that does
    not name its group can only be in that one."""
    pgs = meta.distributed.get("pg_config")
    if not (isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0], dict)):
        return df
    pg = pgs[0]
    name, size, desc = pg.get("pg_name"), pg.get("pg_size"), pg.get("pg_desc")
    coll = (pl.col("kind").is_in(["collective", "p2p"]) | (pl.col("kclass") == "comm")) & pl.col("group").is_null()
    if name is None or not df.select(coll.any()).item():
        return df
    return df.with_columns(
        pl.when(coll).then(pl.lit(str(name))).otherwise(pl.col("group").cast(pl.String)).cast(pl.Categorical).alias("group"),
        pl.when(coll & pl.col("group_size").is_null()).then(pl.lit(size if isinstance(size, int) else None, pl.Int32))
        .otherwise(pl.col("group_size")).alias("group_size"),
        pl.when(coll & pl.col("group_desc").is_null()).then(pl.lit(desc if isinstance(desc, str) else None))
        .otherwise(pl.col("group_desc").cast(pl.String)).cast(pl.Categorical).alias("group_desc"),
    )


def _fill_from_flows(df: pl.DataFrame, builder: _Builder) -> pl.DataFrame:
    """GPU activities and launches without a ``correlation`` arg take it from the ac2g flow
    event at the same place and time (``s`` at the launch, ``f`` at the GPU activity)."""
    need = (pl.col("_is_dev") | pl.col("kind").is_in(["runtime", "sync"])) & pl.col("correlation").is_null()
    if not builder.flows or not df.select(need.any()).item():
        builder.flows.clear()
        return df
    flows = pl.concat(builder.flows).unique(subset=["_pid", "_tid", "ts_ns", "_ph"], keep="first")
    builder.flows.clear()
    rows = (
        df.select("_is_dev", "kind", "correlation", "_pid", "_tid", "ts_ns")
        .with_row_index("_row")
        .filter(need)
        .with_columns(pl.when(pl.col("_is_dev")).then(pl.lit("f")).otherwise(pl.lit("s")).alias("_ph"))
        .join(flows, on=["_pid", "_tid", "ts_ns", "_ph"], how="inner")
        .select("_row", "_flow_id")
    )
    if rows.height == 0:
        return df
    return _scatter_fill(df, rows, {"correlation": ("_flow_id", False)})


def _bind_fwdbwd(df: pl.DataFrame, builder: _Builder) -> pl.DataFrame:
    """The autograd ``fwdbwd`` flows, on the host ops they bind to (the outermost op starting at
    the flow end's time on its thread): ``"fwdbwd_s": id`` in the args of the forward op,
    ``"fwdbwd_f": id`` in those of its backward node (the critical path's edge from one to the
    other).  Nothing else changes; a flow end that binds to no op is dropped."""
    if not builder.fwdbwd or "args" not in df.columns:
        builder.fwdbwd.clear()
        return df
    flows = pl.concat(builder.fwdbwd).filter(pl.col("_ph").is_in(["s", "f"]) & pl.col("_flow_id").is_not_null()) \
        .unique(subset=["_pid", "_tid", "ts_ns", "_ph"], keep="first")
    builder.fwdbwd.clear()
    ops = (df.select("kind", "_pid", "_tid", "ts_ns", "dur_ns").with_row_index("_row")
           .filter((pl.col("kind") == "cpu_op") & pl.col("_tid").is_not_null())
           .sort("dur_ns", descending=True, nulls_last=True).unique(subset=["_pid", "_tid", "ts_ns"], keep="first"))
    bound = ops.join(flows, on=["_pid", "_tid", "ts_ns"]).group_by("_row").agg(
        pl.col("_flow_id").filter(pl.col("_ph") == "s").first().alias("_s"),
        pl.col("_flow_id").filter(pl.col("_ph") == "f").first().alias("_f"))
    if bound.height == 0:
        return df
    kv = pl.concat_str([pl.when(pl.col("_s").is_not_null()).then(pl.format('"fwdbwd_s":{}', pl.col("_s"))),
                        pl.when(pl.col("_f").is_not_null()).then(pl.format('"fwdbwd_f":{}', pl.col("_f")))],
                       separator=",", ignore_nulls=True)
    args = pl.col("args").cast(pl.String)
    new = (pl.when(args.is_null() | (args.str.strip_chars() == "{}")).then(pl.concat_str([pl.lit("{"), kv, pl.lit("}")]))
           .otherwise(pl.concat_str([pl.lit("{"), kv, pl.lit(","), args.str.strip_chars_start().str.slice(1)])))
    upd = bound.join(df.select("args").with_row_index("_row"), on="_row").select("_row", new.cast(df.schema["args"]).alias("_a"))
    return (df.with_row_index("_row").join(upd, on="_row", how="left", maintain_order="left")
            .with_columns(pl.coalesce("_a", "args").alias("args")).drop("_row", "_a"))


_SEQ_DERIVED = "derived: order within the process group and collective type on this rank"


def _attach_comm_records(df: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """Carry the host record of each collective (``record_param_comms``) onto its GPU kernel,
    and give every collective a sequence number: the trace's (``Seq``), else its order among the
    collectives of its process group and type on this rank (``meta.attributes["seq_source"]``
    says which: "trace", "derived: ..." or "mixed: ...")."""
    host = pl.col("kind").is_in(["collective", "p2p"])
    comm = (pl.col("kclass") == "comm") | host
    n_trace, n_host_derived, n_comm = df.select(
        (comm & pl.col("seq").is_not_null()).sum().alias("t"), (host & pl.col("seq").is_null()).sum().alias("d"),
        comm.sum().alias("n")).row(0)
    if not n_comm:
        return df
    key = [pl.col("group").cast(pl.String).fill_null(""), pl.col("collective").cast(pl.String).fill_null("")]
    if df.select(host.any()).item():
        if df.select((host & pl.col("seq").is_null()).any()).item():
            df = _derive_seq(df, host & pl.col("seq").is_null(), key)
        # kernels that miss any of the record's facts (the group may come from pg_config or the
        # kernel's own args while the sequence number is only on the record)
        need = (pl.col("kclass") == "comm") & pl.any_horizontal(
            pl.col(c).is_null() for c in ("group", "seq", "collective", "bytes"))
        kernels = df.select("kclass", "group", "seq", "collective", "bytes", "correlation").with_row_index("_row").filter(need).select(
            "_row", "correlation", pl.col("collective").cast(pl.String).alias("_kc"))
        if kernels.height:
            launches = (
                df.select("kind", "correlation", "pid", "tid", "ts_ns")
                .filter(pl.col("kind").is_in(["runtime"]) & pl.col("correlation").is_not_null())
                .select("correlation", pl.col("pid").alias("_lpid"), pl.col("tid").alias("_ltid"), pl.col("ts_ns").alias("_lts"))
                .unique(subset=["correlation"], keep="first")
            )
            records = (
                df.drop("args")
                .filter(host)
                .select(
                    pl.col("pid").alias("_lpid"),
                    pl.col("tid").alias("_ltid"),
                    pl.col("ts_ns").alias("_rts"),
                    END.alias("_rend"),
                    pl.col("collective").alias("_c"),
                    pl.col("group").alias("_g"),
                    pl.col("group_desc").alias("_gd"),
                    pl.col("group_size").alias("_gs"),
                    pl.col("seq").alias("_s"),
                    pl.col("dtype").alias("_dt"),
                    pl.col("bytes").alias("_b"),
                )
                .drop_nulls(["_lpid", "_ltid"])
                .sort("_rts")
            )
            linked = (
                kernels.join(launches, on="correlation", how="inner")
                .drop_nulls(["_lpid", "_ltid"])
                .sort("_lts")
                .join_asof(records, left_on="_lts", right_on="_rts", by=["_lpid", "_ltid"], strategy="backward", tolerance=10_000_000, check_sortedness=False)
                # launched inside its record; or up to 10 ms after it (the launch of coalesced ops at
                # the group's end) when the kernel's own name does not say it is another collective
                .filter(pl.col("_rts").is_not_null() & ((pl.col("_lts") <= pl.col("_rend")) | pl.col("_kc").is_null()
                                                        | (pl.col("_kc") == pl.col("_c").cast(pl.String))))
                .select("_row", "_c", "_g", "_gd", "_gs", "_s", "_dt", "_b")
            )
            if linked.height:
                df = _scatter_fill(
                    df,
                    linked,
                    # the record's collective wins over one guessed from the kernel name
                    {"collective": ("_c", True), "group": ("_g", False), "group_desc": ("_gd", False),
                     "group_size": ("_gs", False), "seq": ("_s", False), "dtype": ("_dt", False), "bytes": ("_b", False)},
                )
    # Comm kernels still without a sequence number: their order within the group and type, after
    # the numbers already there (a kernel launched before the trace began must not take one)
    orphan = (pl.col("kclass") == "comm") & pl.col("seq").is_null()
    n_orphans = df.select(orphan.sum()).item()
    if n_orphans:
        df = _derive_seq(df, orphan, key, after=(pl.col("kclass") == "comm") & pl.col("seq").is_not_null())
    if not (n_host_derived or n_orphans):
        meta.attributes["seq_source"] = "trace"
    elif not n_trace:
        meta.attributes["seq_source"] = _SEQ_DERIVED
    else:
        meta.attributes["seq_source"] = "mixed: from the trace where it has them, else " + _SEQ_DERIVED.removeprefix("derived: ")
    return df


def _derive_seq(df: pl.DataFrame, rows: pl.Expr, key: list[pl.Expr], after: pl.Expr | None = None) -> pl.DataFrame:
    """Number the selected rows 0, 1, ... in time order within each ``key``; with ``after``, from
    one past the largest number the ``after`` rows of that key have."""
    cols = ["kind", "kclass", "group", "collective", "seq", "ts_ns", "dur_ns", "stream", "tid", "correlation"]
    base = df.select(cols).with_row_index("_row")

    def keyed(part: pl.DataFrame) -> pl.DataFrame:  # the key on the few rows selected, not on every event
        return part.with_columns(pl.concat_str(key, separator="\x1f").alias("_key"))

    sub = (
        keyed(base.filter(rows))
        # ties in time are broken by fields of the event, never by its place in the file
        .with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64)
            .over("_key", order_by=["ts_ns", "dur_ns", "stream", "tid", "correlation"])
            .alias("_s")
        )
    )
    if after is not None:
        top = keyed(base.filter(after)).group_by("_key").agg((pl.col("seq").max() + 1).alias("_first"))
        sub = sub.join(top, on="_key", how="left").with_columns(pl.col("_s") + pl.col("_first").fill_null(0))
    return _scatter_fill(df, sub.select("_row", "_s"), {"seq": ("_s", False)})


def _scatter_fill(df: pl.DataFrame, linked: pl.DataFrame, columns: dict[str, tuple[str, bool]]) -> pl.DataFrame:
    """Write ``linked``'s values into the rows ``linked["_row"]`` of ``df`` without copying the
    frame: for each column, the linked value where the row has none (or always, when the flag says
    the linked value wins)."""
    rows = linked.get_column("_row")
    out = {}
    for col, (src, wins) in columns.items():
        s = df.get_column(col)
        new = linked.get_column(src).cast(s.dtype)
        old = s.gather(rows)
        merged = new.fill_null(old) if wins else old.fill_null(new)
        out[col] = s.clone().scatter(rows, merged)
    return df.with_columns(**out)


def _mode(s: pl.Series) -> int | None:
    s = s.drop_nulls()
    if s.len() == 0:
        return None
    return int(s.mode().sort()[0])


def _device(df: pl.DataFrame, meta: TraceMeta) -> None:
    """The GPU this rank ran on (the most common device of its kernels, else of any GPU row) and
    its ``deviceProperties`` entry and platform, into ``meta``."""
    meta.device_id = _mode(df.select("kind", "device").filter(pl.col("kind") == "kernel").get_column("device"))
    if meta.device_id is None:
        meta.device_id = _mode(df.get_column("device"))
    if meta.device_id is not None:
        for d in meta.devices:
            if d.get("id") == meta.device_id:
                meta.device_properties = d
                meta.device_name = d.get("name")
                break
        if meta.device_name is None and len(meta.devices) == 1:
            meta.device_properties = meta.devices[0]
            meta.device_name = meta.devices[0].get("name")
        if meta.device_properties and not isinstance(meta.device_name, str):  # a hostile file: no name, not a crash
            got = "no name" if "name" not in meta.device_properties else f"name {_shown(meta.device_name)} is not text"
            meta.warnings.append(f"the deviceProperties entry of device {meta.device_id}: {got}, so the GPU is unnamed")
            meta.device_name = None
    else:
        meta.warnings.append("no GPU events (a CPU-only trace)")
    if meta.platform is None and meta.device_name:
        low = meta.device_name.lower()
        meta.platform = "rocm" if ("amd" in low or "instinct" in low or "radeon" in low) else "cuda"
