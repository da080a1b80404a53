"""One rank's pipeline-parallel facts (MFU.md 4.2-4.3): its micro-batch blocks, P2P roles and peers,
and per step the bubble; the job reduce (``tracelens.analysis.job.pipeline``) places the ranks in
the pipeline and names the schedule from these facts alone.

* **P2P records**: the host-side send/recv records (``record_param_comms``, ``gloo:send``; kind
  ``p2p``/``collective`` with collective send/recv), else the P2P kernels' launches.  A peer is
  read from the ``nccl:send a->b`` / ``nccl:recv a<-b`` annotation or the ``c10d::send`` /
  ``c10d::recv_`` op (its third concrete input, the group rank) that holds the record.  A
  ``SendRecv`` kernel that the parser resolved to another collective (all-to-all, all-gather) is
  no P2P: it is counted apart, as evidence against a pipeline.
* **Anchors**: the stage's compute, ordered by host time: compute kernels (by their launch) on a
  GPU rank; matmul-family CPU ops on a CPU-only rank; none inside an ``Optimizer.*`` range.
  Each is forward or backward: from the action range that holds its launch (``Forward i`` /
  ``Backward i`` of ScheduleGPipe, ``PP:<stage><F|B|I|W><mb>`` of the runtime schedules; in
  DualPipeV's overlapped pair ``PP:(<s>F<i>;<t>B<j>)OVERLAP_F_B`` the forward sub-action, or the
  backward one for the ops inside an autograd backward op), else from an autograd backward op
  around it on its thread.
* **Action order**: the ``PP:`` compute actions of the first kept step in the order the rank ran
  them (empty ones too): the job replays them for the theory of schedules without a closed form
  taken here (``analysis.job.pipeline.replay_order``).
* **Blocks**: per step, the runs of anchors with one label, one action range and no P2P record
  between them: one block is one micro-batch's forward or backward on one stage.  Each send is
  the downstream (after a forward) or upstream (after a backward) hand-off, each recv the
  upstream (before a forward) or downstream (before a backward) one: the rank's peers upstream
  and downstream, and whether it is a first, middle or last stage.
* **Measurement** per kept step with blocks, in its window W (the step's GPU window; its host
  window on a CPU-only rank): busy B = the union of everything but P2P (compute, other
  communication, copies; on a CPU-only rank its CPU ops but the P2P ones); bubble = |W \\ B|,
  split into warm-up (before the first block), cool-down (after the last block) and steady (the
  gaps between blocks), and exposed P2P = |P2P ∩ W \\ B| (the part of the bubble with a transfer
  in flight).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import polars as pl

from tracelens.analysis import intervals as iv
from tracelens.analysis.rank.names import Names
from tracelens.model.schema import END, NON_COMPUTE_KCLASSES
from tracelens.model.summary import WHOLE_TRACE

P2P_NAMES = ("send", "recv", "sendrecv")
_ACTION_TORCH = r"^(Forward|Backward) (\d+)$"
_ACTION_PP = r"^PP:(\d+)(F|B|I|W)(\d+)$"
_OVERLAP_PP = r"^PP:\(.*\)OVERLAP_F_B$"
# DualPipeV's overlapped pair (torch's _Action repr): "PP:(<stage>F<mb>;<stage>B<mb>)OVERLAP_F_B", the forward first; torch
# runs the two sub-actions one after the other inside the one range
_OVERLAP_PAIR = r"^PP:\((\d+)F(\d+);(\d+)(B|I)(\d+)\)OVERLAP_F_B$"
# marker ranges around one micro-batch's forward or backward, without its index (Megatron-style
# "## forward ##", forward_step, backward-compute, DeepSpeed's _exec_forward_pass ...): labels only, no
# detection on their own; as Python functions (with_stack: "schedules.py(388): forward_step") only the
# per-micro-batch ones with a suffix (a module's plain "forward" nests in every layer)
_ACTION_MARKER = r"(?i)^#*\s*(?:_?exec_)?(forward|backward)(?:[ _-]?(?:step|pass|compute))?\s*#*$"
_ACTION_PY = r"^.*\.py\(\d+\): (?:_exec_)?(forward|backward)_(?:step|pass)$"
_OPTIMIZER = r"^Optimizer\."
_BACKWARD = r"^autograd::engine::evaluate_function|Backward\d*$"
_PEER_NCCL = r"^nccl:(send|recv) (\d+)(->|<-)(\d+)$"
_PEER_C10D = r"^c10d::(send|recv_|recv_any_source_)$"
_P2P_HOST_OPS = r"^(c10d::|record_param_comms$|nccl:|gloo:|mpi:|ucc:)"
_CPU_ANCHOR = (r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|conv\w*|_convolution|convolution\w*|_scaled_dot_product\w*|"
               r"scaled_dot_product_attention|_flash_attention\w*|_efficient_attention\w*|einsum)$")
_SENDRECV_KERNEL = r"(?i)SendRecv"
MIN_BLOCK_SHARE = 0.05  # an unannotated block shorter than this share of its step's median block is glue, not a micro-batch


def _spans(df: pl.LazyFrame, cond: pl.Expr, by_tid: bool = True) -> pl.DataFrame:
    cols = ["tid"] if by_tid else []
    runs = iv.merged(df.filter(cond & pl.col("dur_ns").is_not_null()).select(
        *(pl.col("tid").fill_null(0),) if by_tid else (), pl.col("ts_ns").alias("s"), END.alias("e")), by=cols)
    return iv.with_before(runs, by=cols).collect(engine="in-memory")


def _inside(q: pl.DataFrame, at: str, runs: pl.DataFrame, alias: str, by: list[str] | None = None) -> pl.DataFrame:
    """``q`` with ``alias``: whether ``q[at]`` lies inside the union ``runs`` (``with_before`` of ``merged``)."""
    by = by or []
    q = q.with_columns((pl.col(at) + 1).alias("_at1"))
    q = iv.covered(iv.covered(q.lazy(), at, runs.lazy(), "_c0", by=by), "_at1", runs.lazy(), "_c1", by=by)
    return q.with_columns((pl.col("_c1") > pl.col("_c0")).alias(alias)).drop("_c0", "_c1", "_at1").collect(engine="in-memory")


def _p2p_records(df: pl.DataFrame, gpu_rows: pl.DataFrame, names: Names, group_ranks: dict[str, list[int]]) -> pl.DataFrame:
    """(t, kind, peer, group, seq, s, e, hs) of the rank's P2P records on the host timeline, ``peer``
    its global rank where the trace says it, ``hs`` the start of the op that holds the record (else
    s), ``seq`` its sequence number (its collective row's: null when the trace has none)."""
    coll = pl.col("collective").cast(pl.String)
    host = (
        df.lazy().filter(pl.col("kind").is_in(["p2p", "collective"]) & coll.is_in(P2P_NAMES) & pl.col("tid").is_not_null())
        .select("tid", "ts_ns", pl.col("ts_ns").alias("s"), END.alias("e"), coll.alias("what"),
                pl.col("group").cast(pl.String).fill_null("").alias("group"), "seq",
                pl.col("group_desc").cast(pl.String).alias("desc"),
                # record_param_comms of a send/recv names the peer (its group rank) in "Rank"
                pl.when(pl.col("name").cast(pl.String) == "record_param_comms")
                .then(pl.col("args").str.extract(r'"Rank":\s*"?(-?\d+)', 1).cast(pl.Int64)).alias("_rank_arg"))
        .collect(engine="in-memory")
    )
    if host.height == 0:  # no host records (an nsys export): the P2P kernels, at their launches
        host = gpu_rows.filter((pl.col("kclass") == "comm") & coll.is_in(P2P_NAMES)).select(
            pl.col("launch_tid").fill_null(0).alias("tid"), pl.col("launch_ns").alias("ts_ns"), pl.col("ts_ns").alias("s"),
            END.alias("e"), coll.alias("what"), pl.col("group").cast(pl.String).fill_null("").alias("group"),
            pl.col("seq") if "seq" in gpu_rows.columns else pl.lit(None, pl.Int64).alias("seq"),
            (pl.col("group_desc").cast(pl.String) if "group_desc" in gpu_rows.columns else pl.lit(None, pl.String)).alias("desc"))
        return host.with_columns(pl.lit(None, pl.Int64).alias("peer"), pl.col("s").alias("hs")).sort("ts_ns")
    nccl = names.matching(_PEER_NCCL)
    c10d = names.matching(_PEER_C10D)
    holders = (
        df.lazy().filter(pl.col("tid").is_not_null() & (pl.col("name").is_in(nccl.implode()) | pl.col("name").is_in(c10d.implode())))
        .select("tid", pl.col("ts_ns").alias("_hs"), END.alias("_he"),
                pl.coalesce(pl.col("name").cast(pl.String).str.extract(_PEER_NCCL, 4),
                            pl.col("args").str.extract(r'"Concrete Inputs":\["[^"]*",\s*"[^"]*",\s*"(\d+)"', 1)).cast(pl.Int64).alias("_peer"))
        .sort("_hs").collect(engine="in-memory")
    )
    out = host.sort("ts_ns")
    if holders.height:  # the annotation or c10d op that holds the record names the peer, else the record's Rank
        out = (out.join_asof(holders, left_on="ts_ns", right_on="_hs", by="tid", strategy="backward", check_sortedness=False)
               .with_columns(pl.coalesce(pl.when(pl.col("_he") >= pl.col("ts_ns")).then(pl.col("_peer")), "_rank_arg").alias("peer"),
                             # the op that holds the record started the transfer (gloo's record starts when its worker runs it)
                             pl.when(pl.col("_he") >= pl.col("ts_ns")).then(pl.min_horizontal("_hs", "s")).otherwise("s").alias("hs"))
               .drop("_hs", "_he", "_peer"))
    else:
        out = out.with_columns(pl.col("_rank_arg").alias("peer"), pl.col("s").alias("hs"))
    out = out.drop("_rank_arg")
    if group_ranks:  # group rank -> global rank
        table = pl.DataFrame([{"group": g, "peer": i, "_global": r} for g, rs in group_ranks.items() for i, r in enumerate(rs)],
                             schema={"group": pl.String, "peer": pl.Int64, "_global": pl.Int64})
        out = out.join(table, on=["group", "peer"], how="left").with_columns(
            pl.coalesce("_global", "peer").alias("peer")).drop("_global")
    return out.sort("ts_ns")


MAX_PAIRS = 256  # P2P records per (step, direction, peer) kept for the clock bounds: a bound from fewer is weaker, still true


def _pair_keys(records: pl.DataFrame, spans: pl.DataFrame, steps) -> dict[str, list]:
    """The P2P records with a known peer, keyed for pairing across ranks (the k-th send of step
    N to rank b is the k-th recv of step N on b from this rank): columns what, peer, step, k, s (the
    start of the op that holds the record), e, group and seq (the record's collective row, the key
    of its ``critical_path`` collectives), as plain lists (at most ``MAX_PAIRS`` per key).  They
    bound the ranks' clock offsets (a recv cannot end before its send starts:
    ``analysis.job.clocks.p2p_bounds``) and make a recv a cross-rank hop of the job's critical path
    (a recv waits for its send: ``analysis.rank.critical.combine``)."""
    named = [s.step for s in steps]
    if records.height == 0 or any(n is None for n in named):
        return {}
    got = (records.filter(pl.col("peer").is_not_null()).sort("ts_ns")
           .join_asof(spans, left_on="ts_ns", right_on="_cs", strategy="backward", check_sortedness=False)
           .filter(pl.col("_step").is_not_null() & (pl.col("ts_ns") < pl.col("_ce")))
           .with_columns(pl.col("_step").replace_strict(list(range(len(named))), named, return_dtype=pl.Int64).alias("step"))
           .with_columns(pl.int_range(pl.len()).over("step", "what", "peer").alias("k"))
           .filter(pl.col("k") < MAX_PAIRS)
           .select("what", "peer", "step", "k", pl.col("hs").alias("s"), "e", "group", "seq"))
    return got.to_dict(as_series=False) if got.height else {}


MAX_ORDER = 4096  # actions of one step kept for the job's replay of the schedule's own order (p*v*m*3 of them)


def _action_order(actions: pl.DataFrame, steps, kept: list[int]) -> list[list] | None:
    """The compute actions of the first kept step that has them, in the order the rank ran them:
    [kind (F, B, I, W), stage, micro-batch] from the ``PP:`` ranges (an overlapped pair as its two
    sub-actions, forward first), empty ones too (a first stage's input-grad I computes nothing);
    None without ``PP:`` ranges or over ``MAX_ORDER``.  The runtime schedules run a fixed order
    whatever the timing: replayed at equal block times (``analysis.job.pipeline.replay_order``) it
    gives the schedule's own bubble."""
    act = actions.filter(pl.col("a_stage").is_not_null() & pl.col("a_mb").is_not_null() & pl.col("a_label").is_not_null())
    if act.height == 0 or not kept:
        return None
    spans = pl.DataFrame({"_step": kept, "_cs": [steps[i].cpu_start_ns for i in kept], "_ce": [steps[i].cpu_end_ns for i in kept]},
                         schema={"_step": pl.Int64, "_cs": pl.Int64, "_ce": pl.Int64}).sort("_cs")
    got = (act.sort("a_s").join_asof(spans, left_on="a_s", right_on="_cs", strategy="backward", check_sortedness=False)
           .filter(pl.col("_step").is_not_null() & (pl.col("a_s") < pl.col("_ce"))))
    if got.height == 0:
        return None
    got = got.filter(pl.col("_step") == pl.col("_step").min())
    if got.height > MAX_ORDER:
        return None
    first = got.select(pl.col("a_s"), pl.lit(0).alias("_k"), pl.col("a_label").alias("k"), pl.col("a_stage").alias("g"),
                       pl.col("a_mb").alias("i"))
    second = got.filter(pl.col("o_label").is_not_null()).select(pl.col("a_s"), pl.lit(1).alias("_k"), pl.col("o_label").alias("k"),
                                                                pl.col("o_stage").alias("g"), pl.col("o_mb").alias("i"))
    return [list(r) for r in pl.concat([first, second]).sort("a_s", "_k").select("k", "g", "i").iter_rows()]


def _actions(df: pl.DataFrame, names: Names) -> pl.DataFrame:
    """The schedule's action ranges: (a_s, a_e, a_label, a_mb, a_stage, a_marker, o_label, o_mb,
    o_stage), sorted by start; ``a_marker``: a marker range (``_ACTION_MARKER``: no index, no
    stage); an overlapped F/B pair (``_OVERLAP_PAIR``, DualPipeV) is one range whose forward
    sub-action is a_* and whose backward one o_* (null for the other ranges); a number past Int64
    (a hostile name) is null."""
    torch_names, pp_names = names.matching(_ACTION_TORCH), names.matching(_ACTION_PP)
    pair_names = names.matching(_OVERLAP_PAIR)
    markers = pl.concat([names.matching(_ACTION_MARKER), names.matching(_ACTION_PY)])
    if torch_names.len() == 0 and pp_names.len() == 0 and markers.len() == 0 and pair_names.len() == 0:
        return pl.DataFrame(schema={"a_s": pl.Int64, "a_e": pl.Int64, "a_label": pl.String, "a_mb": pl.Int64, "a_stage": pl.Int64,
                                    "a_marker": pl.Boolean, "o_label": pl.String, "o_mb": pl.Int64, "o_stage": pl.Int64})
    name = pl.col("name").cast(pl.String)
    marker = pl.coalesce(name.str.extract(_ACTION_MARKER, 1), name.str.extract(_ACTION_PY, 1)).str.to_lowercase()
    return (
        df.lazy().filter(pl.col("kind").is_in(["annotation", "cpu_op", "python"])
                         & (pl.col("name").is_in(torch_names.implode()) | pl.col("name").is_in(pp_names.implode())
                            | pl.col("name").is_in(markers.implode()) | pl.col("name").is_in(pair_names.implode())))
        .select(pl.col("ts_ns").alias("a_s"), END.alias("a_e"),
                pl.coalesce(name.str.extract(_ACTION_TORCH, 1).str.slice(0, 1), name.str.extract(_ACTION_PP, 2),
                            pl.when(marker == "forward").then(pl.lit("F")).when(marker == "backward").then(pl.lit("B")),
                            pl.when(name.str.contains(_OVERLAP_PAIR)).then(pl.lit("F"))).alias("a_label"),
                pl.coalesce(name.str.extract(_ACTION_TORCH, 2), name.str.extract(_ACTION_PP, 3),
                            name.str.extract(_OVERLAP_PAIR, 2)).cast(pl.Int64, strict=False).alias("a_mb"),
                pl.coalesce(name.str.extract(_ACTION_PP, 1), name.str.extract(_OVERLAP_PAIR, 1)).cast(pl.Int64, strict=False).alias("a_stage"),
                marker.is_not_null().alias("a_marker"),
                name.str.extract(_OVERLAP_PAIR, 4).alias("o_label"), name.str.extract(_OVERLAP_PAIR, 5).cast(pl.Int64, strict=False).alias("o_mb"),
                name.str.extract(_OVERLAP_PAIR, 3).cast(pl.Int64, strict=False).alias("o_stage"))
        .sort("a_s").collect(engine="in-memory")
    )


_DESC_PP = r"(?i)pipe|(^|[^a-z])pp([^a-z]|$)"
_DESC_NOT_PP = r"(?i)context|expert|moe|all_?to_?all|a2a|(^|[^a-z])(cp|ep)([^a-z]|$)"


def side_groups(records: pl.DataFrame, anchors: pl.DataFrame) -> tuple[dict[str, str], list[str]]:
    """The process groups whose P2P is no pipeline hand-off, each with the reason, and the groups
    that could be either (``ambiguous``).  A record's context is the compute around it: a send's
    the anchor before it, a recv's the one after it (forward or backward).  A pipeline stage talks
    to at most two peers (upstream and downstream), and its hand-off reverses in the backward (a
    forward sends downstream, a backward upstream).  So a group is not the pipeline's when a rank
    sends or receives to more than two peers on it (an all-to-all done as ``batch_isend_irecv``:
    an MoE token exchange), or when its sends go to one peer and its recvs come from another in
    forward and backward alike (a ring: context-parallel ring attention).  One peer both ways in
    forward and backward is a 2-rank ring or a 2-stage interleaved pipeline alike: ambiguous,
    unless another group is a clean pipeline candidate (then the ambiguous one is set aside) or
    the groups' descriptions name them (``pp``/``pipeline`` against ``cp``/``ep``/``context``/
    ``expert``)."""
    if records.height == 0 or anchors.height == 0:
        return {}, []
    a = anchors.select("t", pl.when(pl.col("label") == "F").then(pl.lit("F")).otherwise(pl.lit("B")).alias("_lab")).sort("t")
    r = (records.select("ts_ns", "what", "group", "peer", "desc").sort("ts_ns")
         .join_asof(a.rename({"_lab": "_prev"}), left_on="ts_ns", right_on="t", strategy="backward", check_sortedness=False).drop("t")
         .join_asof(a.rename({"_lab": "_next"}), left_on="ts_ns", right_on="t", strategy="forward", check_sortedness=False).drop("t")
         .with_columns(pl.when(pl.col("what") == "send").then("_prev").otherwise("_next").alias("ctx")))
    groups = r.get_column("group").unique().to_list()
    if len(groups) == 1 and r.get_column("peer").null_count() == r.height:
        return {}, []
    per = (r.filter(pl.col("peer").is_not_null() & pl.col("ctx").is_not_null())
           .group_by("group", "what", "ctx").agg(pl.col("peer").unique().sort()))
    sets = {(g, w, c): set(ps) for g, w, c, ps in per.iter_rows()}  # a handful of rows: groups x send/recv x F/B
    desc = dict(r.group_by("group").agg(pl.col("desc").drop_nulls().first()).iter_rows())
    side: dict[str, str] = {}
    amb: list[str] = []
    for g in sorted(groups):
        sf, sb = sets.get((g, "send", "F"), set()), sets.get((g, "send", "B"), set())
        rf, rb = sets.get((g, "recv", "F"), set()), sets.get((g, "recv", "B"), set())
        peers = sf | sb | rf | rb
        name = f"group {g!r}" + (f" ({desc[g]})" if desc.get(g) else "")
        if len(peers) > 2:
            side[g] = f"{name}: send/recv with {len(peers)} peers (a stage has at most 2): an exchange (MoE all-to-all), no stage hand-off"
        elif sf and sf == sb and rf and rf == rb and sf != rf:
            side[g] = (f"{name}: sends go to rank {min(sf)} and recvs come from rank {min(rf)} in forward and backward alike (a "
                       "ring: context-parallel attention); a pipeline's hand-off reverses in the backward")
        elif sf and sf == sb == rf == rb:
            amb.append(g)
    clean = [g for g in groups if g not in side and g not in amb and r.filter(pl.col("group") == g).height]
    named_pp = [g for g in groups if g not in side and desc.get(g) and re.search(_DESC_PP, desc[g])]
    for g in list(amb):
        why = None
        if desc.get(g) and re.search(_DESC_NOT_PP, desc[g]) and not re.search(_DESC_PP, desc[g]):
            why = f"its description {desc[g]!r} names no pipeline"
        elif clean or (named_pp and g not in named_pp):
            why = f"another group ({', '.join(repr(x) for x in (clean or named_pp))}) carries the pipeline's one-way hand-offs"
        if why:
            amb.remove(g)
            side[g] = (f"group {g!r}" + (f" ({desc[g]})" if desc.get(g) else "")
                       + f": one peer both ways in forward and backward (a 2-rank ring or exchange); {why}")
    if side:  # the others set aside, a group whose description names the pipeline is taken for it
        amb = [g for g in amb if not (desc.get(g) and re.search(_DESC_PP, desc[g]))]
    return side, amb


BLOCK_SCHEMA = {"_step": pl.Int64, "s": pl.Int64, "e": pl.Int64}
MAX_VIEW_BLOCKS = 400  # the blocks of one step a rank's summary keeps for the views (the slowest kept step's)


def rank_pipeline(df: pl.DataFrame, gpu_rows: pl.DataFrame, steps, meta, names: Names) -> tuple[dict[str, Any] | None, pl.DataFrame]:
    """This rank's pipeline facts (a plain dict: the reduce's input), or None when it has no P2P
    record, no schedule action range and no SendRecv kernel; and the micro-batch blocks of its
    pipeline steps (``BLOCK_SCHEMA``: step index, GPU or host span; the idle attribution's bubble
    is the idle outside them).  ``steps``: anything with the Step fields step, cpu_start_ns,
    cpu_end_ns, start_ns, end_ns, warmup and name (``WHOLE_TRACE`` where the trace marks no steps)."""
    none = pl.DataFrame(schema=BLOCK_SCHEMA)
    pg = (meta.distributed or {}).get("pg_config") or []
    group_ranks = {str(g.get("pg_name")): list(g["ranks"]) for g in pg if isinstance(g, dict) and isinstance(g.get("ranks"), list)}
    coll = pl.col("collective").cast(pl.String)
    has_gpu = gpu_rows.height > 0
    sendrecv = names.matching(_SENDRECV_KERNEL)
    other_sr = {}
    if has_gpu and sendrecv.len():
        other_sr = dict(gpu_rows.filter(pl.col("name").is_in(sendrecv.implode()) & ~coll.fill_null("").is_in(P2P_NAMES))
                        .group_by(coll.fill_null("unknown")).len().iter_rows())
    records = _p2p_records(df, gpu_rows, names, group_ranks)
    actions = _actions(df, names)
    if records.height == 0:  # marker ranges label a pipeline's blocks; alone they are no evidence of one
        actions = actions.filter(~pl.col("a_marker"))
    overlap = names.matching(_OVERLAP_PP).len() > 0
    if records.height == 0 and actions.height == 0 and not other_sr:
        return None, none
    base = {"rank": meta.rank, "world_size": meta.world_size, "p2p_records": records.height,
            "sendrecv_not_p2p": {k: int(v) for k, v in sorted(other_sr.items())}, "groups": sorted(set(records.get_column("group").to_list())),
            "annotations": ("pp" if actions.get_column("a_stage").drop_nulls().len() else "torch" if (~actions.get_column("a_marker")).any()
                            else "markers") if actions.height else None,
            "overlap_actions": overlap, "steps": [],
            # the trace marks no steps: its one step may hold several iterations (their blocks run together)
            "steps_marked": not (len(steps) == 1 and steps[0].step is None and getattr(steps[0], "name", None) == WHOLE_TRACE)}
    kept = [i for i, s in enumerate(steps) if not s.warmup] or list(range(len(steps)))
    if not steps or (records.height == 0 and actions.height == 0):  # SendRecv kernels of collectives only: nothing to measure
        return base, none
    spans = pl.DataFrame({"_step": list(range(len(steps))), "_cs": [s.cpu_start_ns for s in steps], "_ce": [s.cpu_end_ns for s in steps]},
                         schema={"_step": pl.Int64, "_cs": pl.Int64, "_ce": pl.Int64}).sort("_cs")
    base["p2p_pairs"] = _pair_keys(records, spans, steps)
    base["action_order"] = _action_order(actions, steps, kept)
    lf = df.lazy()
    # the anchors: (t host time, tid, s, e) of the stage's compute
    if has_gpu:
        anchors = gpu_rows.filter((pl.col("kind") == "kernel") & ~pl.col("kclass").cast(pl.String).is_in(list(NON_COMPUTE_KCLASSES))).select(
            pl.col("launch_ns").alias("t"), pl.col("launch_tid").fill_null(0).alias("tid"), pl.col("ts_ns").alias("s"), END.alias("e"))
    else:
        anchors = df.filter((pl.col("kind") == "cpu_op") & names.like(_CPU_ANCHOR) & pl.col("dur_ns").is_not_null()).select(
            pl.col("ts_ns").alias("t"), pl.col("tid").fill_null(0), pl.col("ts_ns").alias("s"), END.alias("e"))
    opt = _spans(lf, names.like(_OPTIMIZER) & pl.col("tid").is_not_null(), by_tid=False)
    bwd = _spans(lf, names.like(_BACKWARD) & pl.col("tid").is_not_null())
    anchors = _inside(anchors, "t", opt, "_opt")
    anchors = _inside(anchors, "t", bwd, "_bwd", by=["tid"]).filter(~pl.col("_opt"))
    if actions.height:
        anchors = (anchors.sort("t").join_asof(actions, left_on="t", right_on="a_s", strategy="backward", check_sortedness=False)
                   # in an overlapped F/B pair, the ops inside an autograd backward are its backward sub-action's
                   .with_columns(pl.when(pl.col("o_label").is_not_null() & pl.col("_bwd"))
                                 .then(pl.struct("a_s", pl.col("o_label").alias("a_label"), pl.col("o_mb").alias("a_mb"),
                                                 pl.col("o_stage").alias("a_stage")))
                                 .otherwise(pl.struct("a_s", "a_label", "a_mb", "a_stage")).alias("_a"))
                   .with_columns(pl.when(pl.col("a_e") > pl.col("t")).then(pl.col("_a")).alias("_a"))
                   .with_columns(pl.col("_a").struct.field("a_s").alias("a_s"), pl.col("_a").struct.field("a_label").alias("a_label"),
                                 pl.col("_a").struct.field("a_mb").alias("a_mb"), pl.col("_a").struct.field("a_stage").alias("a_stage"))
                   .drop("_a", "a_e", "a_marker", "o_label", "o_mb", "o_stage"))
    else:
        anchors = anchors.with_columns(pl.lit(None, pl.Int64).alias("a_s"), pl.lit(None, pl.String).alias("a_label"),
                                       pl.lit(None, pl.Int64).alias("a_mb"), pl.lit(None, pl.Int64).alias("a_stage"))
    label = pl.coalesce(pl.col("a_label"), pl.when(pl.col("_bwd")).then(pl.lit("B")).otherwise(pl.lit("F")))
    anchors = anchors.with_columns(label.alias("label"))
    side, amb = side_groups(records, anchors)
    if side:  # another P2P (a ring, an exchange) on its own group: no pipeline hand-off, no block boundary
        records = records.filter(~pl.col("group").is_in(list(side)))
    base.update(p2p_records=records.height, groups=sorted(set(records.get_column("group").to_list())),
                side_p2p=[side[g] for g in sorted(side)], side_groups=sorted(side), ambiguous_p2p_groups=amb)
    if records.height == 0 and actions.filter(~pl.col("a_marker")).height == 0:
        return base, none
    rec = records.select(pl.col("ts_ns").alias("_rt")).with_row_index("_nb", offset=1).with_columns(pl.col("_nb").cast(pl.Int64))
    anchors = (
        anchors.sort("t")
        .join_asof(spans, left_on="t", right_on="_cs", strategy="backward", check_sortedness=False)
        .filter(pl.col("_step").is_not_null() & (pl.col("t") < pl.col("_ce")))
        .join_asof(rec, left_on="t", right_on="_rt", strategy="backward", check_sortedness=False)
        .with_columns(pl.col("_nb").fill_null(0))
    )
    if anchors.height == 0:
        return base, none
    key_change = ((pl.col("label") != pl.col("label").shift(1)) | (pl.col("_nb") != pl.col("_nb").shift(1))
                  | (pl.col("a_s").fill_null(-1) != pl.col("a_s").fill_null(-1).shift(1))
                  | (pl.col("_step") != pl.col("_step").shift(1))).fill_null(True)
    blocks = (
        anchors.with_columns(key_change.cum_sum().alias("_blk"))
        .group_by("_blk").agg(pl.col("_step").first(), pl.col("label").first(), pl.col("a_mb").first().alias("mb"),
                              pl.col("a_stage").first().alias("stage"), pl.col("t").min().alias("t0"), pl.col("t").max().alias("t1"),
                              pl.col("s").min(), pl.col("e").max(), pl.len().alias("n"), pl.col("a_s").first().is_not_null().alias("_ann"))
        .sort("_blk")
    )
    if actions.height == 0:  # glue ops between the micro-batches (a loss, a copy) are no block of their own
        med = blocks.group_by("_step").agg((pl.col("e") - pl.col("s")).median().alias("_med"))
        blocks = blocks.join(med, on="_step").filter((pl.col("e") - pl.col("s")) >= MIN_BLOCK_SHARE * pl.col("_med")).drop("_med")
    else:  # in a step whose micro-batches run in action ranges, compute outside them (a grad-norm, a loss, a copy) is glue
        blocks = blocks.filter(pl.col("_ann") | ~pl.col("_ann").any().over("_step"))
    blocks = blocks.drop("_ann")
    # each P2P record's role: a send by the block before it, a recv by the block after it
    bt = blocks.select("_step", "label", "t0", "t1").sort("t0")
    recs = records.sort("ts_ns").join_asof(spans, left_on="ts_ns", right_on="_cs", strategy="backward", check_sortedness=False)
    recs = recs.filter(pl.col("_step").is_not_null())
    before = recs.join_asof(bt.select("_step", pl.col("t1").alias("_bt"), pl.col("label").alias("_prev")).sort("_bt"),
                            left_on="ts_ns", right_on="_bt", by="_step", strategy="backward", check_sortedness=False)
    both = before.sort("ts_ns").join_asof(bt.select("_step", pl.col("t0").alias("_at"), pl.col("label").alias("_next")).sort("_at"),
                                          left_on="ts_ns", right_on="_at", by="_step", strategy="forward", check_sortedness=False)
    role = (pl.when(pl.col("what") == "send").then(pl.when(pl.col("_prev") == "F").then(pl.lit("down")).when(pl.col("_prev").is_not_null())
                                                    .then(pl.lit("up")))
            .when(pl.col("what") == "recv").then(pl.when(pl.col("_next") == "F").then(pl.lit("up")).when(pl.col("_next").is_not_null())
                                                  .then(pl.lit("down"))))
    roles = both.with_columns(role.alias("role"))
    peers = roles.filter(pl.col("role").is_not_null()).group_by("role").agg(pl.col("peer").drop_nulls().unique().sort(), pl.len())
    got = {r: (p, n) for r, p, n in peers.iter_rows()}
    f_without_up = (  # forward blocks with no upstream recv since the block before them (a first stage's, or chunk 0's)
        blocks.sort("t0").with_columns(pl.col("t1").shift(1).over("_step").alias("_pt1"))
        .filter(pl.col("label") == "F").select("_step", "t0", "_pt1")
        .join_asof(roles.filter((pl.col("role") == "up") & (pl.col("what") == "recv")).select("_step", pl.col("ts_ns").alias("_u")).sort("_u"),
                   left_on="t0", right_on="_u", by="_step", strategy="backward", check_sortedness=False)
        .with_columns((pl.col("_u").is_not_null() & (pl.col("_pt1").is_null() | (pl.col("_u") > pl.col("_pt1")))).not_().alias("_unfed"))
    )
    # measurement per kept step with blocks: busy = everything but P2P
    if has_gpu:
        p2p_gpu = (pl.col("kclass") == "comm") & coll.is_in(P2P_NAMES) & ~pl.col("group").cast(pl.String).fill_null("").is_in(list(side))
        busy = iv.union_frame(gpu_rows.filter(~p2p_gpu))
        p2p = iv.union_frame(gpu_rows.filter(p2p_gpu))
    else:
        busy = iv.union_frame(df.filter((pl.col("kind") == "cpu_op") & pl.col("tid").is_not_null() & ~names.like(_P2P_HOST_OPS)
                                        & pl.col("dur_ns").is_not_null()))
        p2p = iv.union_frame(records.select(pl.col("s").alias("ts_ns"), (pl.col("e") - pl.col("s")).alias("dur_ns")))
    per = blocks.group_by("_step").agg(pl.col("s").min().alias("fb"), pl.col("e").max().alias("lb"),
                                       (pl.col("label") == "F").sum().alias("nF"), (pl.col("label") != "F").sum().alias("nB"),
                                       pl.col("label").sort_by("t0").str.join("").alias("order"),
                                       pl.col("mb").filter(pl.col("label") == "F").n_unique().alias("mbF"),
                                       pl.col("mb").filter(pl.col("label") == "F").null_count().alias("mbF_null"),
                                       pl.col("stage").drop_nulls().unique().sort().alias("stages"),
                                       pl.col("label").is_in(["I", "W"]).any().alias("split_backward"),
                                       (pl.col("e") - pl.col("s")).filter(pl.col("label") == "F").sum().alias("f_ns"),
                                       (pl.col("e") - pl.col("s")).filter(pl.col("label") != "F").sum().alias("b_ns"))
    fwu = f_without_up.filter(pl.col("_unfed")).group_by("_step").len().rename({"len": "f_first"})
    n_rec = recs.group_by("_step").len().rename({"len": "n_p2p"})
    per = (per.join(fwu, on="_step", how="left").join(n_rec, on="_step", how="left")
           .with_columns(pl.col("f_first").fill_null(0), pl.col("n_p2p").fill_null(0))
           # a step with neither P2P nor a schedule action range is no pipeline step (a closing step, an evaluation)
           .filter((pl.col("n_p2p") > 0) | (pl.col("mbF_null") < pl.col("nF")) | (pl.col("stages").list.len() > 0))
           .sort("_step"))
    q = []
    for row in per.iter_rows(named=True):  # one per step: a summary
        st = steps[row["_step"]]
        ws, we = st.start_ns, st.end_ns
        fb = min(max(row["fb"], ws), we)
        lb = min(max(row["lb"], fb), we)
        q.append((row["_step"], ws, fb, lb, we))
    qf = pl.DataFrame(q, schema={"_step": pl.Int64, "ws": pl.Int64, "fb": pl.Int64, "lb": pl.Int64, "we": pl.Int64}, orient="row")
    B = iv.with_before(busy.lazy())
    # the P2P time outside busy: |(P ∪ B) ∩ [a, b)| - |B ∩ [a, b)|
    U = iv.with_before(iv.merged(pl.concat([busy, p2p]).lazy()))
    m = qf.lazy()
    for col in ("ws", "fb", "lb", "we"):
        m = iv.covered(m, col, B, f"B_{col}")
        m = iv.covered(m, col, U, f"U_{col}")
    m = m.sort("_step").collect(engine="in-memory")
    # the bubble inside the blocks (gaps between one micro-batch's own ops: the host's, not the schedule's)
    pipe_blocks = blocks.join(per.select("_step"), on="_step", how="semi")
    runs = iv.merged(pipe_blocks.lazy().select("_step", "s", "e"), by=["_step"]).with_columns(pl.col("s").alias("_s"), pl.col("e").alias("_e"))
    inb = iv.covered(iv.covered(runs, "_s", B, "_b0"), "_e", B, "_b1")
    inblock = dict(inb.group_by("_step").agg(((pl.col("_e") - pl.col("_s")) - (pl.col("_b1") - pl.col("_b0"))).sum())
                   .collect(engine="in-memory").iter_rows())
    between, iters, it_starts = ({}, {}, {}) if base["steps_marked"] else _iterations(pipe_blocks, B)
    out_steps, out_idx = [], []  # (out_idx: each measured step's index in ``steps``)
    for row, meas in zip(per.iter_rows(named=True), m.iter_rows(named=True)):
        i = row["_step"]
        if i not in kept:
            continue
        ws, fb, lb, we = meas["ws"], meas["fb"], meas["lb"], meas["we"]
        window = we - ws
        busy_ns = meas["B_we"] - meas["B_ws"]
        warm = (fb - ws) - (meas["B_fb"] - meas["B_ws"])
        cool = (we - lb) - (meas["B_we"] - meas["B_lb"])
        bubble = window - busy_ns
        exposed = (meas["U_we"] - meas["U_ws"]) - busy_ns
        out_idx.append(i)
        out_steps.append({
            "step": steps[i].step, "window_ns": window, "busy_ns": busy_ns, "bubble_ns": bubble, "warmup_ns": warm, "cooldown_ns": cool,
            # without ProfilerStep spans the one step may hold several iterations: the idle between them (one's cool-down and
            # the next one's warm-up, not told apart) is no steady bubble; steady unknown where the iterations are
            "steady_ns": (None if i in iters and iters[i] is None else bubble - warm - cool - between.get(i, 0)),
            "between_iterations_ns": between.get(i, 0) if not (i in iters and iters[i] is None) else None,
            "iterations": iters.get(i, 1), "exposed_p2p_ns": exposed, "forward_blocks": row["nF"], "backward_blocks": row["nB"],
            "forward_microbatches": row["mbF"] if row["mbF_null"] == 0 else None, "forward_blocks_first": row["f_first"],
            "order": _rle(row["order"]), "stages": list(row["stages"]), "split_backward": bool(row["split_backward"]),
            "inblock_ns": int(inblock.get(i, 0)), "f_ns": int(row["f_ns"]), "b_ns": int(row["b_ns"]),
        })
    # per action kind and stage (PP: ranges) one action's mean block time over the kept steps, for the order replay
    act_ns = (pipe_blocks.filter(pl.col("_step").is_in(kept) & pl.col("stage").is_not_null() & pl.col("mb").is_not_null())
              .group_by("_step", "label", "stage", "mb").agg((pl.col("e") - pl.col("s")).sum().alias("_ns"))
              .group_by("label", "stage").agg(pl.col("_ns").mean()).sort("label", "stage"))
    base["action_ns"] = {f"{k}{g}": round(ns) for k, g, ns in act_ns.iter_rows()}
    up, down = got.get("up", ([], 0)), got.get("down", ([], 0))
    base.update(
        upstream=[int(x) for x in up[0]], downstream=[int(x) for x in down[0]], upstream_p2p=int(up[1]), downstream_p2p=int(down[1]),
        steps=out_steps, view=_view(blocks, out_steps, out_idx, steps, m, it_starts),
    )
    return base, pipe_blocks.select([pl.col(c).cast(t) for c, t in BLOCK_SCHEMA.items()])


def _iterations(blocks: pl.DataFrame, B: pl.LazyFrame) -> tuple[dict[int, int], dict[int, int | None], dict[int, list[int]]]:
    """For steps that may hold several iterations (no ProfilerStep spans): per step the idle
    between its iterations (ns; busy ``B`` ``with_before``), how many iterations it holds
    (None: cannot be told) and where each iteration after the first starts (its first block's
    start, ns on the rank's clock: the views label the gap before it "between iterations").  An iteration starts at a forward block: with micro-batch indices,
    the first forward of the lowest index after a backward (interleaved schedules run each
    chunk's forward of that index in the warm-up, before any backward); without them, where the
    F/B order repeats with a period of two forwards or more (GPipe's "F8 B8 F8 B8", a 1F1B
    stage's warm-up, pairs and cool-down twice).  A strict F/B alternation (a last stage's 1F1B)
    repeats at every pair: the iterations cannot be told there."""
    between: dict[int, int] = {}
    iters: dict[int, int | None] = {}
    starts_at: dict[int, list[int]] = {}
    for (st,), g in blocks.sort("t0").group_by("_step", maintain_order=True):  # the one step of a trace without steps
        g = g.with_row_index("_i").with_columns(pl.when(pl.col("label") == "F").then(pl.lit("F")).otherwise(pl.lit("B")).alias("_l"))
        lab = g.get_column("_l")
        f_mb = g.filter(pl.col("_l") == "F").get_column("mb")
        n, nf = g.height, int((lab == "F").sum())
        starts: list[int] | None
        if nf and f_mb.null_count() == 0:
            nb = (lab != "F").cast(pl.Int64).cum_sum().shift(1, fill_value=0)
            cand = g.with_columns(nb.alias("_nb")).filter((pl.col("_l") == "F") & (pl.col("mb") == f_mb.min()) & (pl.col("_nb") > 0))
            starts = cand.unique("_nb", keep="first", maintain_order=True).get_column("_i").to_list()
        elif n % 2 == 0 and (lab.gather_every(2) == "F").all() and (lab.gather_every(2, 1) == "B").all():
            starts = None  # F B F B ...: repeats at every pair, one iteration or many
        else:
            starts = []  # no repeat: one iteration
            ks = [k for k in range(nf // 2, 1, -1) if n % k == 0 and nf % k == 0]  # (the divisors: a handful)
            for k in ks:
                per = n // k
                if (lab.head(n - per) == lab.slice(per)).all():
                    starts = [j * per for j in range(1, k)]
                    break
        if starts is None:
            iters[st] = None
            continue
        iters[st] = len(starts) + 1
        if not starts:
            continue
        starts_at[st] = g.filter(pl.col("_i").is_in(starts)).get_column("s").to_list()
        gaps = (g.with_columns(pl.col("e").cum_max().shift(1).alias("_a")).filter(pl.col("_i").is_in(starts))
                .select(pl.col("_a"), pl.max_horizontal("_a", "s").alias("_b")))
        got = iv.covered(iv.covered(gaps.lazy(), "_a", B, "_c0"), "_b", B, "_c1").collect(engine="in-memory")
        between[st] = int(got.select(((pl.col("_b") - pl.col("_a")) - (pl.col("_c1") - pl.col("_c0"))).sum()).item())
    return between, iters, starts_at


def _view(blocks: pl.DataFrame, out_steps: list[dict], out_idx: list[int], steps, meas: pl.DataFrame,
          it_starts: dict[int, list[int]] | None = None) -> dict[str, Any] | None:
    """The blocks of the slowest kept step, for the views: {step, start_ns, end_ns, blocks: [{label,
    mb, stage, s, e}] (ns from the window's start), iteration_starts_ns (where the step holds
    several iterations, no ProfilerStep spans: each later iteration's first block's s)}, at most
    ``MAX_VIEW_BLOCKS``; None without one."""
    if not out_steps:
        return None
    j = max(range(len(out_steps)), key=lambda j: out_steps[j]["window_ns"])  # (a trace without steps: its one, numberless)
    slow, idx = out_steps[j], out_idx[j]
    ws = meas.filter(pl.col("_step") == idx).get_column("ws")
    ws = int(ws[0]) if ws.len() else steps[idx].start_ns
    b = (blocks.filter(pl.col("_step") == idx).sort("s").head(MAX_VIEW_BLOCKS)
         .select("label", "mb", "stage", (pl.col("s") - ws).alias("s"), (pl.col("e") - ws).alias("e")))
    return {"step": slow["step"], "start_ns": ws, "window_ns": slow["window_ns"], "blocks": b.to_dicts(),
            "iteration_starts_ns": [x - ws for x in (it_starts or {}).get(idx, [])],
            "truncated": blocks.filter(pl.col("_step") == idx).height > MAX_VIEW_BLOCKS}


def _rle(order: str) -> str:
    """"FFFBFB" -> "F3 B1 F1 B1"."""
    out: list[str] = []
    for c in order:
        if out and out[-1][0] == c:
            out[-1] = (c, out[-1][1] + 1)
        else:
            out.append((c, 1))
    return " ".join(f"{c}{n}" for c, n in out)


def summary(facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rank's totals over its measured steps (bubble, phases, exposed P2P), or None."""
    if not facts or not facts.get("steps"):
        return None
    st = facts["steps"]
    tot = {k: sum(s[k] for s in st) for k in ("window_ns", "busy_ns", "bubble_ns", "warmup_ns", "cooldown_ns", "exposed_p2p_ns")}
    for k in ("steady_ns", "between_iterations_ns"):  # unknown in a step whose iterations cannot be told
        vals = [s.get(k, 0) for s in st]
        tot[k] = None if any(x is None for x in vals) else sum(vals)
    orders = Counter(s["order"] for s in st)
    tot["order"] = orders.most_common(1)[0][0]
    return tot
