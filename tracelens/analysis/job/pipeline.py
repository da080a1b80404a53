"""The pipeline reduce (MFU.md 4): from the ranks' pipeline facts (``analysis.rank.pipeline``; no
events) each rank's stage, the number of stages p, micro-batches m and virtual stages v, the
schedule, how sure that is and why, and the bubble next to the schedule's theory.

* **Stages**: the ``PP:<stage>...`` ranges name them (a rank's stages r, r+p, ...: v = how many,
  p = their spacing); else the P2P peers chain the ranks (a first stage sends downstream and
  receives nothing from upstream; the chain from it through each rank's downstream peer; with data
  parallel, one chain per first stage, all of one length: p pipelines' stages; a ring, every rank
  sending both ways: round it from the rank whose forwards start unfed);
  else, without peers, the roles (first, middle, last) and the ranks' order.  A rank off the
  chain, or a job with ranks missing, keeps what can be said (a first stage is stage 0; p is at
  least the ranks seen) and the rest null.
* **m**: the forward micro-batch indices of the action ranges, else the forward blocks per step
  over v, the same on every rank.
* **Placement** (v > 1, from the ``PP:`` stage numbers): ``looped`` (rank r holds r, r+p, ...) or
  ``v_shape`` (r and 2p-1-r: ZB-V, DualPipeV).
* **Schedule**: backward split in I/W actions or overlapped F/B actions: ``zero_bubble``, its
  ``variant`` ``zb_h1`` (one stage per rank), ``interleaved_zb`` (looped), ``zb_v`` (V-shaped),
  ``dualpipe_v`` / ``dualpipe`` (overlapped F/B pairs, on a V or not); v > 1:
  ``interleaved``; a rank whose forward and backward blocks alternate after its warm-up:
  ``1f1b``; every rank all forwards then all backwards: ``gpipe`` (sure only when the last stage
  is among them: under 1F1B a stage s with m <= p-1-s runs that way too).
* **Theory**: (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1), zero-bubble ZB-H1's (p-1)/(3m+p-1) (F, B
  and W of one time; m >= p); the other zero-bubble variants: the ranks' own ``PP:`` action order
  replayed with F = I = W and B = I + W (``replay_order``: torch's ZB-V, DualPipeV and interleaved
  ZB orders give (p-1)/(3vm+p-1) from m = 2p on, ZB-V more below it), that closed form (m >= 2p)
  without every order;
  the measured fraction is the ranks' bubble over their windows (the
  steps kept, with blocks).
* **Critical stage** (``with_critical_path``, with ``--critical-path``): the job's stitched path
  (``analysis.rank.critical.combine``: its P2P pairs are hops, a recv waits for its send) per kept
  step on each stage, and the stage that holds most of it, per step and over them.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from tracelens.analysis.rank import pipeline as rp

_GPIPE_ORDER = re.compile(r"^F\d+ B\d+$")
# a step that may be several iterations (no ProfilerStep spans): GPipe's all-F-then-all-B, repeated
_GPIPE_REPEATED = re.compile(r"^F(\d+) B\1( F\1 B\1)*$")


def theory(schedule: str | None, p: int | None, m: int | None, v: int | None) -> float | None:
    if not schedule or not p or not m:
        return None
    if schedule == "zero_bubble":  # ZB-H1 (Qi et al. 2023), F, B and W of one time, m >= p: (p-1)/(3m+p-1); with v stages per
        # rank (interleaved ZB, ZB-V, DualPipeV) each chunk's F, I and W of one time: (p-1)/(3vm+p-1), what torch 2.13's own
        # orders replay to (``replay_order``) at m >= 2p (p = 2, 4; interleaved ZB from m = p), not below it (ZB-V at
        # m = p = 4: 0.200, not 0.111): None there
        if v and v > 1:
            return (p - 1) / (3 * v * m + p - 1) if m >= 2 * p else None
        return (p - 1) / (3 * m + p - 1) if m >= p else None
    vv = v if (schedule == "interleaved" and v) else 1
    return (p - 1) / (vv * m + p - 1)


def _mode(values: list) -> tuple[Any, bool]:
    """The most common value and whether all agree."""
    c = Counter(v for v in values if v is not None)
    if not c:
        return None, False
    v, n = c.most_common(1)[0]
    return v, n == sum(c.values())


def reduce(ranks) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
    """(the job's ``pipeline`` dict, each file's rank ``pipeline`` dict) from the RankResults, or
    (None, {}) when no rank has P2P traffic, schedule ranges or SendRecv kernels."""
    facts = {r.file: r.pipeline for r in ranks if r.pipeline}
    if not facts:
        return None, {}
    rank_of = {r.file: r.rank for r in ranks}
    evidence: list[str] = []
    world = max((f.get("world_size") or 0 for f in facts.values()), default=0) or None
    n = len(ranks)
    p2p = {fi: f for fi, f in facts.items() if f["p2p_records"] or f["annotations"]}
    measured = {fi: f for fi, f in p2p.items() if f.get("steps")}
    seen = f"{n} of {world} ranks traced" if world else f"{n} ranks traced (world size unknown)"
    other = Counter()
    for f in facts.values():
        other.update(f.get("sendrecv_not_p2p") or {})
    if other:
        evidence.append("SendRecv kernels resolve to " + ", ".join(f"{k} x{v}" for k, v in sorted(other.items()))
                        + ": collectives, not pipeline P2P")
    side = [(rank_of[fi], note) for fi, f in facts.items() for note in f.get("side_p2p") or []]
    if side:
        rk, note = side[0]
        evidence.append(f"P2P set aside as no pipeline hand-off on {len({r for r, _ in side})} rank(s), e.g. rank {rk}: {note}"
                        + (f" (and {len(side) - 1} more group(s))" if len(side) > 1 else ""))
    ambiguous = sorted({(rank_of[fi], g) for fi, f in facts.items() for g in f.get("ambiguous_p2p_groups") or []}, key=str)
    if not measured:
        evidence.append("no pipeline send/recv records and no schedule action ranges" if not p2p
                        else "P2P records but no forward/backward blocks between them")
        evidence.append(f"{seen}: stages, micro-batches and the schedule cannot be told")
        return ({"stages": None, "microbatches": None, "virtual_stages": None, "schedule": None, "confidence": None,
                 "evidence": evidence, "bubble_fraction": None, "theory_fraction": None, "ranks_traced": n, "world_size": world}, {})
    # stages
    stage: dict[int, int | None] = dict.fromkeys(measured)
    p = v = None
    how = placement = None
    pp_stages = {fi: sorted({s for st in f["steps"] for s in st["stages"]}) for fi, f in measured.items()}
    if any(pp_stages.values()):
        vs = {len(s) for s in pp_stages.values() if s}
        v = max(vs)
        gaps = {b - a for s in pp_stages.values() for a, b in zip(s, s[1:])}
        total = max(max(s) for s in pp_stages.values() if s) + 1
        held = sorted({x for s in pp_stages.values() for x in s})
        vshape = (v == 2 and held == list(range(total)) and total % 2 == 0
                  and all(len(s) == 2 and s[0] + s[1] == total - 1 for s in pp_stages.values() if s))
        if len(gaps) == 1:
            p = gaps.pop()
            placement = "looped" if v > 1 else None
        elif vshape:  # rank r holds stages r and 2p-1-r: the V of ZB-V (ScheduleZBVZeroBubble) and DualPipeV
            p, placement = total // 2, "v_shape"
            evidence.append(f"each rank holds stages r and {total - 1}-r: a V-shaped placement (ZB-V, DualPipeV), p = {p}")
        elif v == 1 and total == len(measured):
            p = total
        for fi, s in pp_stages.items():
            stage[fi] = s[0] if s else None
        how = "PP:<stage> action ranges"
        evidence.append(f"PP: action ranges name stages {', '.join(str(s) for s in sorted({x for s in pp_stages.values() for x in s}))}"
                        f" ({v} per rank)")
    up = {fi: f["upstream_p2p"] for fi, f in measured.items()}
    down = {fi: f["downstream_p2p"] for fi, f in measured.items()}
    firsts = [fi for fi in measured if down[fi] and not up[fi]]
    lasts = [fi for fi in measured if up[fi] and not down[fi]]
    file_of = {rank_of[fi]: fi for fi in measured}
    def follow(fi: int) -> list[int]:  # the traced ranks from fi down through each one's single downstream peer
        out = [fi]
        while len(measured[out[-1]]["downstream"]) == 1 and file_of.get(measured[out[-1]]["downstream"][0]) not in (None, *out):
            out.append(file_of[measured[out[-1]]["downstream"][0]])
        return out

    chains = [follow(fi) for fi in firsts]
    pipelines = 0
    if how is None:
        # data and pipeline parallel: several pipelines, each a chain from its first stage to its last, all of one length
        whole = (len(chains) >= 1 and all(c[-1] in lasts for c in chains) and len({len(c) for c in chains}) == 1
                 and sum(len(c) for c in chains) == len(measured) == len({fi for c in chains for fi in c}))
        if whole:
            for c in chains:
                for i, fi in enumerate(c):
                    stage[fi] = i
            p, how, pipelines = len(chains[0]), "P2P peers", len(chains)
            evidence.append("P2P peers chain the ranks: " + "; ".join(" -> ".join(str(rank_of[fi]) for fi in c) for c in chains)
                            + (f" ({len(chains)} pipelines of {p} stages: data parallel)" if len(chains) > 1 else ""))
        elif len(firsts) == 1 and len(lasts) == 1 and not any(measured[fi]["downstream"] for fi in measured):
            # no peers recorded: the roles, and the ranks' order between the first and the last
            mids = sorted((fi for fi in measured if fi not in firsts + lasts), key=lambda fi: rank_of[fi] or 0)
            order = [firsts[0], *mids, lasts[0]]
            for i, fi in enumerate(order):
                stage[fi] = i
            p, how = len(order), "P2P roles" if len(order) <= 2 else "P2P roles and rank order"
            evidence.append(f"no P2P peers recorded: rank {rank_of[firsts[0]]} only sends downstream (first stage), rank "
                            f"{rank_of[lasts[0]]} only receives from upstream (last stage)"
                            + ("; the middle stages are put in rank order" if mids else ""))
        elif not firsts and not lasts and len(measured) > 1:
            heads = [fi for fi, f in measured.items() if any(st["forward_blocks_first"] for st in f["steps"])]
            if len(heads) == 1:
                h = heads[0]
                # round the ring from stage 0 through each rank's one downstream peer; without peers, the ranks'
                # order from it (global ranks need not be consecutive: a data-parallel job's pipeline is 0, 8, 16 ...)
                ring = [h]
                while len(measured[ring[-1]]["downstream"]) == 1 and file_of.get(measured[ring[-1]]["downstream"][0]) not in (None, *ring):
                    ring.append(file_of[measured[ring[-1]]["downstream"][0]])
                by_rank = sorted(measured, key=lambda fi: rank_of[fi] or 0)
                ordered = ring if len(ring) == len(measured) else by_rank[by_rank.index(h):] + by_rank[:by_rank.index(h)]
                for i, fi in enumerate(ordered):
                    stage[fi] = i
                p, how = len(ordered), "a P2P ring"
                first = [st for st in measured[h]["steps"]]
                m_head = _mode([st["forward_blocks_first"] for st in first])[0]
                nf = _mode([st["forward_blocks"] for st in first])[0]
                if m_head and nf and nf % m_head == 0:
                    v = nf // m_head
                evidence.append(f"every rank sends and receives both ways (a ring: virtual stages); rank {rank_of[h]} runs forward "
                                "blocks with nothing received before them (stage 0); "
                                + ("the P2P peers go round " if ordered is ring else "no P2P peers recorded: the stages in rank order ")
                                + " -> ".join(str(rank_of[fi]) for fi in ordered))
        else:
            for fi in firsts:
                stage[fi] = 0
            roles = ([f"first stage: rank {', '.join(str(rank_of[fi]) for fi in firsts)}"] if firsts else []) + (
                [f"last stage: rank {', '.join(str(rank_of[fi]) for fi in lasts)} (its stage number needs p)"] if lasts else [])
            evidence.append(("the traced ranks do not chain into one pipeline" if len(measured) > 1 else
                             f"one rank traced (rank {rank_of[next(iter(measured))]})")
                            + (f" ({'; '.join(roles)})" if roles else ""))
    v = v or 1
    complete = (p is not None and p * max(pipelines, 1) == len(measured)
                and (world is None or world == n or how == "PP:<stage> action ranges"))
    if p is None and measured:  # at least the longest run of traced ranks one pipeline passes, and its untraced peers at the ends
        def run_length(fi: int) -> int:
            c = follow(fi)
            return (len(c) + (1 if measured[c[-1]]["downstream"] and measured[c[-1]]["downstream"][0] not in file_of else 0)
                    + (1 if any(u not in file_of for u in measured[fi]["upstream"]) else 0))
        heads = [fi for fi in measured if not any(u in file_of for u in measured[fi]["upstream"])] or list(measured)
        evidence.append(f"{seen}: p is at least {max(run_length(fi) for fi in heads)}" + (f" and at most {world}" if world else ""))
    elif world and n < world and p and p < world:
        evidence.append(f"{seen}: p = {p} from the traced ranks; ranks outside the trace may hold other pipelines")
    # micro-batches
    per_rank_m = []
    unmarked = [fi for fi, f in measured.items() if not f.get("steps_marked", True)]
    for fi, f in measured.items():
        for st in f["steps"]:
            if st["forward_microbatches"] is not None:
                per_rank_m.append(st["forward_microbatches"])
            elif st["forward_blocks"] % v == 0 and fi not in unmarked:  # blocks per step: not where a step may be several
                per_rank_m.append(st["forward_blocks"] // v)
            elif fi in unmarked and st.get("iterations") and st["forward_blocks"] % (v * st["iterations"]) == 0:
                per_rank_m.append(st["forward_blocks"] // (v * st["iterations"]))  # the iterations told from the repeated order
    m, agree = _mode(per_rank_m)
    told = {fi: st.get("iterations") for fi in unmarked for st in measured[fi]["steps"]}
    if unmarked and any(told.values()):
        n_it = _mode([x for x in told.values() if x])[0]
        unknown = [rank_of[fi] for fi, x in told.items() if x is None]
        evidence.append(f"no ProfilerStep spans: the trace's one step holds {n_it} iteration(s), told from the repeated forward/"
                        "backward order (or the micro-batch indices restarting); the idle between them is no steady bubble"
                        + (f" (rank {', '.join(map(str, unknown))}: a strict F/B alternation, its iterations and steady bubble "
                           "cannot be told)" if unknown else ""))
    if m is None and unmarked:
        fi = unmarked[0]
        evidence.append(f"no ProfilerStep spans (rank {rank_of[fi]}): its one step, the whole trace, may hold several iterations "
                        f"({sum(st['forward_blocks'] for st in measured[fi]['steps'])} forward blocks): m, and the theory with it, "
                        "cannot be told without micro-batch indices")
    indexed = any(f["annotations"] in ("pp", "torch") for f in measured.values())
    src = "the action ranges' micro-batch indices" if indexed else "forward blocks per step"
    if any(f["annotations"] == "markers" for f in measured.values()):
        evidence.append("forward/backward marker ranges (Megatron-style, no micro-batch index) label the blocks")
    if m is not None:
        evidence.append(f"m = {m} from {src}" + ("" if agree else " (not the same on every rank and step: the most common)"))
    # schedule
    orders = {fi: rp.summary(f)["order"] for fi, f in measured.items()}

    def gpipe_like(fi: int) -> bool:
        return bool(_GPIPE_ORDER.match(orders[fi]) or (fi in unmarked and _GPIPE_REPEATED.match(orders[fi])))
    if any(st["split_backward"] for f in measured.values() for st in f["steps"]) or any(f["overlap_actions"] for f in measured.values()):
        schedule = "zero_bubble"
        evidence.append("backward split into input-grad (I) and weight-grad (W) actions, or overlapped F/B actions")
    elif v > 1:
        schedule = "interleaved"
        evidence.append(f"{v} stages per rank: interleaved 1F1B")
    elif not all(gpipe_like(fi) for fi in orders):
        schedule = "1f1b"
        fi = next(fi for fi in orders if not gpipe_like(fi))
        evidence.append(f"forward and backward blocks alternate after the warm-up (rank {rank_of[fi]}: {orders[fi]})")
    else:
        schedule = "gpipe"
        evidence.append("every rank runs all its forward blocks, then all its backward blocks")
        if not (p is not None and any(stage.get(fi) == p - 1 for fi in measured)):
            evidence.append("the last stage is not among the traced ranks: 1F1B with few micro-batches looks the same there")
            complete = False
    if how == "a P2P ring" or how == "P2P roles and rank order":
        confidence = "medium" if complete else "low"
    elif complete and agree:
        confidence = "high"
    else:
        confidence = "low" if not complete else "medium"
    if ambiguous and how != "PP:<stage> action ranges":  # (the action ranges name the stages: the P2P is theirs)
        evidence.append(f"P2P with one peer both ways in forward and backward on group {ambiguous[0][1]!r} (rank {ambiguous[0][0]}): "
                        "a 2-rank context-parallel ring or exchange looks like a 2-stage interleaved pipeline there; "
                        "taken for the pipeline, not sure")
        confidence = "low"
    th = theory(schedule, p, m, v)
    per: dict[int, dict[str, Any]] = {}
    tot_b = tot_w = 0
    for fi, f in measured.items():
        s = rp.summary(f)
        tot_b, tot_w = tot_b + s["bubble_ns"], tot_w + s["window_ns"]
        per[fi] = {"stage": stage.get(fi), "stages_held": pp_stages.get(fi) or None, "action_ns": f.get("action_ns") or None,
                   "bubble_ns": s["bubble_ns"],
                   "bubble_fraction": s["bubble_ns"] / s["window_ns"] if s["window_ns"] else None,
                   "warmup_ns": s["warmup_ns"], "cooldown_ns": s["cooldown_ns"], "steady_ns": s["steady_ns"],
                   "between_iterations_ns": s["between_iterations_ns"],
                   "exposed_p2p_ns": s["exposed_p2p_ns"], "busy_ns": s["busy_ns"], "window_ns": s["window_ns"],
                   "order": s["order"], "view": f.get("view"),
                   "steps": [{k: st[k] for k in ("step", "window_ns", "busy_ns", "bubble_ns", "warmup_ns", "cooldown_ns", "steady_ns",
                                                   "exposed_p2p_ns", "forward_blocks", "backward_blocks")} for st in f["steps"]]}
    variant = order_rep = orders_ok = None
    if schedule == "zero_bubble":
        overlap = any(f["overlap_actions"] for f in measured.values())
        variant = (("dualpipe_v" if placement == "v_shape" else "dualpipe") if overlap else "zb_v" if placement == "v_shape"
                   else "interleaved_zb" if v > 1 else "zb_h1")
        evidence.append({"dualpipe_v": "overlapped F/B pairs (PP:(F;B)OVERLAP_F_B) on a V-shaped placement: DualPipeV",
                         "dualpipe": "overlapped F/B pairs (PP:(F;B)OVERLAP_F_B): DualPipe-style",
                         "zb_v": "split backward on a V-shaped placement: ZB-V (ScheduleZBVZeroBubble)",
                         "interleaved_zb": f"split backward with {v} looped stages per rank: interleaved zero bubble",
                         "zb_h1": "split backward, one stage per rank: ZB-H1-style"}[variant])
        orders_ok = {fi: f.get("action_order") for fi, f in measured.items()}
        own = replay_order(orders_ok, p * v) if complete and all(orders_ok.values()) else None
        if variant == "zb_h1":  # the closed form
            evidence.append("theory: ZB-H1's (p-1)/(3m+p-1), the weight-grad (W) blocks filling 1F1B's cool-down with F, B and W "
                            "of one time" + ("" if th is not None else "; none for m < p") + "; ZB-H2, ZB-V and DualPipe reach less")
        elif own is not None:
            th = own["bubble_fraction"]
            evidence.append(f"theory {th:.3f}: the ranks' own action order (one step of PP: ranges) replayed with F = I = W and "
                            f"B = I + W, P2P instant ({own['step']:g} units a step; (p-1)/(3vm+p-1) = "
                            + (f"{theory(schedule, p, m, v):.3f}" if theory(schedule, p, m, v) is not None else "none, m < 2p") + ")")
        else:
            evidence.append("theory: (p-1)/(3vm+p-1), each chunk's F, I and W of one time" + ("" if th is not None else "; none for m < 2p")
                            + " (the ranks' action orders do not replay: ranks or PP: ranges missing)")
        if own is not None:  # the same orders at the stages' measured block times: the compute's own bubble, P2P instant
            order_rep = _order_replay(orders_ok, p * v, measured)
            if order_rep:
                evidence.append(f"the orders replayed at the stages' measured block times (P2P instant): a {order_rep['step_ns'] / 1e6:.2f} ms "
                                f"step, bubble {100 * (order_rep['bubble_fraction'] or 0):.1f}%, against {order_rep['measured_step_ns'] / 1e6:.2f} "
                                "ms measured: the rest is P2P and host time between the blocks")
    job_gap = (gap(schedule, p, m, v, {fi: (stage.get(fi), f["steps"]) for fi, f in measured.items()})
               if th is not None and schedule != "zero_bubble" else
               gap_orders(p, p * v, th, {fi: (stage.get(fi), f["steps"]) for fi, f in measured.items()}, orders_ok, measured)
               if th is not None and order_rep else None)
    job = {"stages": p, "microbatches": m, "virtual_stages": v if p is not None else (v if v > 1 else None), "schedule": schedule,
           "placement": placement, "variant": variant,
           "confidence": confidence, "evidence": evidence, "bubble_fraction": tot_b / tot_w if tot_w else None,
           "theory_fraction": th, "bubble_ns": tot_b, "ranks_traced": n, "world_size": world, "gap": job_gap,
           "replay": replay_measured(schedule, p, m, v, {fi: (stage.get(fi), f["steps"]) for fi, f in measured.items()}),
           "order_replay": order_rep}
    return job, per


def gap(schedule: str, p: int, m: int, v: int, ranks: dict[int, tuple[int | None, list[dict]]]) -> dict[str, Any] | None:
    """The measured bubble less the theory's, attributed (all ns, summed over the ranks' measured
    steps).  With tau_s a stage's compute per micro-batch (its busy time per step over m), the
    theory's step at the stages' mean compute is W_th = m*tau + (p-1)*tau/v (GPipe/1F1B: (m+p-1)*tau),
    and with the slowest stage setting the pace W_slow = m*tau_max + (sum tau_s - tau_max)/v (the
    closed form; where the schedule can be replayed, ``replay``, W_slow = W_th + the replayed step
    at the stages' measured block times less the one at their mean, both with instant P2P: the
    closed form overstates it, 47.4 ms where the 1F1B p=4 m=8 run with stage 2 at 1.6x takes
    45.8 ms, and left the P2P share negative, the slow stage's capped at the gap, under latency).
    The order is fixed: the imbalance first at zero latency, the P2P the rest (their interaction
    goes to the P2P).  The
    gap (sum over ranks of window - W_th: bubble_ns - theory_bubble_ns) is split into
    ``slow_stage_ns`` (the imbalance: W_slow - W_th per rank and step, at most the gap), ``host_ns``
    (the bubble inside the micro-batch blocks: the host between one micro-batch's own ops, at most
    what is left) and ``p2p_ns`` (the rest: the transfers and waits on them beyond the schedule's).
    ``slowest_stage`` and ``stage_compute_ns`` (per stage, its busy ns per step) say which stage
    and by how much; None without every stage's measurement.  Several pipelines (data parallel): a
    stage's tau is the mean over its ranks, the sums run over every rank."""
    per_rank: list[tuple[int, float, float, int, int]] = []  # (stage, busy per step, window per step, steps, in-block ns)
    for st, steps in ranks.values():
        if st is None or not steps:
            return None
        k = len(steps)
        per_rank.append((st, sum(x["busy_ns"] for x in steps) / k, sum(x["window_ns"] for x in steps) / k, k,
                         sum(x.get("inblock_ns", 0) for x in steps)))
    stages = sorted({r[0] for r in per_rank})
    if stages != list(range(p)):
        return None
    busy_of = {s: [r[1] for r in per_rank if r[0] == s] for s in stages}
    per_stage = {s: (sum(b) / len(b),) for s, b in busy_of.items()}
    tau = {st: b / m for st, (b,) in per_stage.items()}
    mean, top = sum(tau.values()) / p, max(tau.values())
    w_th = m * mean + (p - 1) * mean / v
    w_slow = m * top + (sum(tau.values()) - top) / v
    measured = sum(k * (w - b) for _, b, w, k, _ in per_rank)
    theory_bubble = sum(k * (w_th - b) for _, b, _, k, _ in per_rank)
    total = round(measured - theory_bubble)
    slowest = max(tau, key=tau.get)
    slow = host = 0
    blocks = _stage_block_ns(p, ranks)
    rep = replay(schedule, p, m, v, {g: blocks[g % p] for g in range(p * v)}) if blocks else None
    if rep is not None:  # the imbalance's cost with instant P2P: the schedule replayed at the stages' block times, less at their mean
        fm = sum(blocks[st][0] for st in range(p)) / p
        bm = sum(blocks[st][1] for st in range(p)) / p
        even = replay(schedule, p, m, v, dict.fromkeys(range(p * v), (fm, bm)))
        w_slow = w_th + max(rep["step_ns"] - even["step_ns"], 0.0) if even else w_slow
    if total > 0:
        slow = min(round(sum(k * (w_slow - w_th) for _, _, _, k, _ in per_rank)), total)
        host = min(sum(x for *_, x in per_rank), total - slow)
    return {"gap_ns": total, "theory_bubble_ns": round(theory_bubble), "slow_stage_ns": slow, "p2p_ns": total - slow - host,
            "host_ns": host, "slowest_stage": slowest, "slowest_stage_excess": top / mean - 1 if mean else None,
            "stage_compute_ns": [round(per_stage[s][0]) for s in range(p)]}


def gap_orders(p: int, n_stages: int, th: float, ranks: dict[int, tuple[int | None, list[dict]]], orders: dict[int, list[list]],
               measured: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """``gap`` for schedules timed by their own action orders (zero bubble): the theory's step at
    the ranks' mean compute is W_th = busy / (1 - th) (what (m+p-1)*tau is for 1F1B), the
    imbalance's cost the orders replayed at the stages' measured block times less at each kind's
    mean over the stages (``replay_order``, P2P instant), host the bubble inside the blocks, P2P
    the rest; the same keys as ``gap``.  None without every stage's measurement."""
    per_rank = []
    for st, steps in ranks.values():
        if st is None or not steps:
            return None
        k = len(steps)
        per_rank.append((st, sum(x["busy_ns"] for x in steps) / k, sum(x["window_ns"] for x in steps) / k, k,
                         sum(x.get("inblock_ns", 0) for x in steps)))
    if sorted({r[0] for r in per_rank}) != list(range(p)) or th >= 1:
        return None
    busy_of: dict[int, list[float]] = {}
    for st, b, *_ in per_rank:
        busy_of.setdefault(st, []).append(b)
    comp = {st: sum(b) / len(b) for st, b in busy_of.items()}
    mean = sum(comp.values()) / p
    w_th = mean / (1 - th)
    theory_bubble = sum(k * (w_th - b) for _, b, _, k, _ in per_rank)
    total = round(sum(k * (w - b) for _, b, w, k, _ in per_rank) - theory_bubble)
    unit = (_order_replay(orders, n_stages, measured) or {}).get("action_ns") or {}
    kinds: dict[str, list[float]] = {}
    for key, ns in unit.items():
        kinds.setdefault(key[0], []).append(ns)
    # each stage's actions at their kind's mean over the stages (an action without blocks, a first stage's I, stays 0)
    flat = {key: sum(kinds[key[0]]) / len(kinds[key[0]]) for key in unit}
    rep = replay_order(orders, n_stages, unit) if unit else None
    even = replay_order(orders, n_stages, flat) if unit else None
    w_slow = w_th + max(rep["step"] - even["step"], 0.0) if rep and even else w_th
    slow = host = 0
    if total > 0:
        slow = min(round(sum(k * (w_slow - w_th) for _, _, _, k, _ in per_rank)), total)
        host = min(sum(x for *_, x in per_rank), total - slow)
    top = max(comp, key=comp.get)
    return {"gap_ns": total, "theory_bubble_ns": round(theory_bubble), "slow_stage_ns": slow, "p2p_ns": total - slow - host,
            "host_ns": host, "slowest_stage": top, "slowest_stage_excess": comp[top] / mean - 1 if mean else None,
            "stage_compute_ns": [round(comp[st]) for st in range(p)]}


def _stage_block_ns(p: int, ranks: dict[int, tuple[int | None, list[dict]]]) -> dict[int, tuple[float, float]] | None:
    """Per stage (mod p) one micro-batch's mean forward and backward block ns over its ranks' steps;
    None without every stage's blocks."""
    sums: dict[int, list[float]] = {}
    for st, steps in ranks.values():
        nf, nb = sum(x["forward_blocks"] for x in steps), sum(x["backward_blocks"] for x in steps)
        if st is None or not steps or not nf or not nb or "f_ns" not in steps[0]:
            return None
        acc = sums.setdefault(st % p, [0.0, 0, 0.0, 0])
        acc[0] += sum(x["f_ns"] for x in steps)
        acc[1] += nf
        acc[2] += sum(x["b_ns"] for x in steps)
        acc[3] += nb
    if sorted(sums) != list(range(p)):
        return None
    return {s: (a[0] / a[1], a[2] / a[3]) for s, a in sums.items()}


def replay_measured(schedule: str | None, p: int | None, m: int | None, v: int,
                    ranks: dict[int, tuple[int | None, list[dict]]]) -> dict[str, Any] | None:
    """The schedule replayed at the measured m from each stage's measured block times (its forward
    and backward block ns per step over its blocks: one micro-batch on one of its v stages; P2P
    latency 0: what the replay leaves out is the P2P and host time between the blocks):
    {stage_ns: [[forward, backward] per rank-stage], step_ns (replayed), measured_step_ns (the
    ranks' mean window)}; None without every stage measured or an order for the schedule."""
    if not schedule or not p or not m or schedule == "zero_bubble":
        return None
    per = _stage_block_ns(p, ranks)
    if per is None:
        return None
    wins = [x["window_ns"] for _, steps in ranks.values() for x in steps]
    got = replay(schedule, p, m, v, {g: per[g % p] for g in range(p * v)})
    if got is None:
        return None
    return {"stage_ns": [[round(a), round(b)] for a, b in (per[s] for s in range(p))], "step_ns": round(got["step_ns"]),
            "bubble_fraction": got["bubble_fraction"], "measured_step_ns": round(sum(wins) / len(wins))}


def predict(pipe: dict[str, Any], m2: int, v2: int | None = None) -> dict[str, Any] | None:
    """The step at m2 micro-batches (the same global batch: each micro-batch m/m2 the size, so its
    block times scale by m/m2) and v2 virtual stages (the rank's blocks split over them), replayed
    for the detected schedule (interleaved when v2 > 1): {step_ns (the replay plus the measured
    step's excess over the replay at m: the P2P and host time the replay leaves out), bubble_fraction
    (the replay's)}; None without ``pipe["replay"]``."""
    rp_ = pipe.get("replay")
    if not rp_:
        return None
    p, m, v = pipe["stages"], pipe["microbatches"], pipe.get("virtual_stages") or 1
    v2 = v2 or v
    sched = "interleaved" if v2 > 1 else pipe["schedule"]
    k = (m / m2) * (v / v2)
    got = replay(sched, p, m2, v2, {g: (rp_["stage_ns"][g % p][0] * k, rp_["stage_ns"][g % p][1] * k) for g in range(p * v2)})
    if got is None:
        return None
    extra = max(rp_["measured_step_ns"] - rp_["step_ns"], 0)
    return {"step_ns": round(got["step_ns"] + extra), "bubble_fraction": got["bubble_fraction"]}


def schedule_orders(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[tuple[str, int, int]]] | None:
    """Each rank's actions (kind "F"/"B", global stage, micro-batch) in the order ``schedule`` runs
    them: GPipe all F then all B; 1F1B p-1-r warm-up F, F/B pairs, the cool-down B; interleaved
    (Megatron's, rank r holds stages r, r+p, ...; m a multiple of p) (p-1-r)*2+(v-1)*p warm-up F
    over the chunks, then pairs.  None for a schedule it cannot order."""
    out: dict[int, list[tuple[str, int, int]]] = {}
    if schedule == "interleaved" and (v < 2 or m % p):
        return None
    for r in range(p):
        if schedule == "gpipe":
            out[r] = [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)]
        elif schedule == "1f1b":
            warm = min(p - r - 1, m)
            acts = [("F", r, i) for i in range(warm)]
            for k in range(m - warm):
                acts += [("F", r, warm + k), ("B", r, k)]
            out[r] = acts + [("B", r, i) for i in range(m - warm, m)]
        elif schedule == "interleaved":
            total = v * m

            def act(k: int, kind: str, r: int = r) -> tuple[str, int, int]:
                c = (k // p) % v
                return kind, (c if kind == "F" else v - 1 - c) * p + r, (k // (p * v)) * p + k % p
            warm = min((p - r - 1) * 2 + (v - 1) * p, total)
            acts = [act(k, "F") for k in range(warm)]
            for k in range(total - warm):
                acts += [act(warm + k, "F"), act(k, "B")]
            out[r] = acts + [act(k, "B") for k in range(total - warm, total)]
        else:
            return None
    return out


def replay(schedule: str, p: int, m: int, v: int, stage_ns: dict[int, tuple[float, float]], latency_ns: float = 0.0) -> dict[str, Any] | None:
    """The step rebuilt for ``schedule`` at p stages, m micro-batches, v virtual stages: each rank
    runs its actions in the schedule's order (``schedule_orders``), a stage's F of micro-batch i
    after the upstream stage's F of i has ended (plus ``latency_ns`` when that stage is on another
    rank), its B after the downstream stage's B of i (the last stage's after its own F); ``stage_ns``:
    per global stage (0 .. p*v-1) one micro-batch's (forward, backward) ns.  Returns {step_ns (the
    makespan), bubble_fraction (idle over p x step), rank_busy_ns} or None (no order, a stage's
    times missing).  A list scheduler: one pass per action (p*v*2m of them), not per event."""
    orders = schedule_orders(schedule, p, m, v)
    n = p * v
    if orders is None or any(g not in stage_ns for g in range(n)):
        return None
    end: dict[tuple[str, int, int], float] = {}
    free, pos = [0.0] * p, [0] * p
    left = sum(len(a) for a in orders.values())
    while left:
        moved = False
        for r in range(p):
            acts = orders[r]
            while pos[r] < len(acts):
                kind, g, i = acts[pos[r]]
                dep = (("F", g - 1, i) if g > 0 else None) if kind == "F" else (("B", g + 1, i) if g < n - 1 else ("F", g, i))
                if dep is not None and dep not in end:
                    break
                ready = 0.0 if dep is None else end[dep] + (latency_ns if dep[1] % p != r else 0.0)
                start = max(free[r], ready)
                free[r] = end[(kind, g, i)] = start + stage_ns[g][0 if kind == "F" else 1]
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            return None
    step = max(free)
    busy = [sum(stage_ns[g][0 if k == "F" else 1] for k, g, _ in orders[r]) for r in range(p)]
    return {"step_ns": step, "bubble_fraction": 1 - sum(busy) / (p * step) if step else None, "rank_busy_ns": busy}


def _order_replay(orders: dict[int, list[list]], n_stages: int, measured: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks' action orders replayed at the stages' measured block times (``action_ns``: one
    action's mean block ns per kind and stage; the mean over the ranks that hold the stage), P2P
    instant: {step_ns, bubble_fraction, measured_step_ns (the ranks' mean window), action_ns}; None
    without block times or where the orders do not replay."""
    times: dict[str, list[int]] = {}
    for f in measured.values():
        for k, ns in (f.get("action_ns") or {}).items():
            times.setdefault(k, []).append(ns)
    unit = {k: sum(x) / len(x) for k, x in times.items()}
    got = replay_order(orders, n_stages, unit) if unit else None
    wins = [st["window_ns"] for f in measured.values() for st in f["steps"]]
    if not got or not wins:
        return None
    return {"step_ns": round(got["step"]), "bubble_fraction": got["bubble_fraction"], "measured_step_ns": round(sum(wins) / len(wins)),
            "action_ns": {k: round(x) for k, x in sorted(unit.items())}}


UNIT_NS = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}  # the zero-bubble papers' F = B(input) = W, a full backward B = I + W


def replay_order(orders: dict[int, list[list]], n_stages: int, unit: dict[str, float] | None = None) -> dict[str, Any] | None:
    """The step rebuilt from each rank's own action order (``analysis.rank.pipeline._action_order``:
    [kind, global stage, micro-batch]), every action of its kind's ``unit`` time (``UNIT_NS``; a key
    "<kind><stage>", "F3", gives one stage's own time, ``order_replay``'s measured block times),
    P2P instant: a stage's F of micro-batch i after the stage before's F of i, its B or I after the
    next stage's B or I of i (the last stage's after its own F), its W after its own I of i.
    {step (the makespan), bubble_fraction (idle over ranks x step)}; None where the orders do not
    replay: a stage of the ``n_stages`` (p*v) that no order holds (ranks missing), a dependency
    no rank runs.  A list scheduler like
    ``replay``: one pass per action."""
    unit = unit or UNIT_NS
    acts = {r: [(str(k), int(g), int(i)) for k, g, i in o] for r, o in orders.items() if o}
    if not acts or any(k not in UNIT_NS for o in acts.values() for k, _, _ in o):
        return None

    def dur(k: str, g: int) -> float:  # a kind-and-stage time ("F3": measured), else the kind's, else 0 (an action without blocks)
        return float(unit.get(f"{k}{g}", unit.get(k, 0.0)))
    n = n_stages
    if {g for o in acts.values() for _, g, _ in o} != set(range(n)):
        return None
    have = {(("b" if k in "BI" else k), g, i) for o in acts.values() for k, g, i in o}
    end: dict[tuple[str, int, int], float] = {}
    ranks = sorted(acts)
    free, pos = dict.fromkeys(ranks, 0.0), dict.fromkeys(ranks, 0)
    left = sum(len(o) for o in acts.values())
    while left:
        moved = False
        for r in ranks:
            while pos[r] < len(acts[r]):
                k, g, i = acts[r][pos[r]]
                if k == "F":
                    dep = ("F", g - 1, i) if g > 0 else None
                elif k == "W":
                    dep = ("b", g, i) if ("b", g, i) in have else None
                else:
                    dep = ("b", g + 1, i) if g < n - 1 else ("F", g, i)
                if dep is not None and dep not in end:
                    break
                start = max(free[r], end[dep] if dep is not None else 0.0)
                free[r] = end[("b" if k in "BI" else k, g, i)] = start + dur(k, g)
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            return None
    step = max(free.values())
    busy = sum(dur(k, g) for o in acts.values() for k, g, _ in o)
    return {"step": step, "bubble_fraction": 1 - busy / (len(ranks) * step) if step else None}


def with_critical_path(pipe: dict[str, Any] | None, stage_of: dict[int, int | None], cp: dict[str, Any] | None) -> dict[str, Any] | None:
    """``pipe`` (job.pipeline) with ``critical_stage`` (the stage holding most of the job's critical
    path over its kept steps; ties: the lowest) and ``critical_steps`` (per kept step: ``step``,
    ``stage`` the one holding most of its path, ``path_ns_by_stage`` stage -> ns, and
    ``off_pipeline_ns`` the path's ns on ranks without a stage), where the job's path is stitched
    across ranks (``cp``: job.critical_path, its steps' ``ns_by_rank``); ``pipe`` unchanged
    otherwise.  ``stage_of``: global rank -> its stage."""
    if not pipe or not cp or not cp.get("steps") or not any("ns_by_rank" in st for st in cp["steps"]):
        return pipe
    steps, total = [], Counter()
    for st in cp["steps"]:  # one entry per step of the summary
        if not st.get("kept"):
            continue
        by, off = Counter(), 0
        for rk, ns in st.get("ns_by_rank", {}).items():
            sg = stage_of.get(int(rk)) if rk.lstrip("-").isdigit() else None
            if sg is None:
                off += ns
            else:
                by[sg] += ns
        total.update(by)
        top = min(by, key=lambda g: (-by[g], g)) if by else None
        steps.append({"step": st["step"], "stage": top, "path_ns_by_stage": {str(g): by[g] for g in sorted(by)}, "off_pipeline_ns": off})
    return {**pipe, "critical_stage": min(total, key=lambda g: (-total[g], g)) if total else None, "critical_steps": steps}
