"""A pipeline-parallel trace simulator: Kineto-format traces of p ranks running a pipeline schedule,
with the bubble each rank should show (the known answer the analysis is checked against).

``simulate(schedule, p, m, ...)`` computes the schedule's event times with a small list scheduler:
each rank runs its actions (F or B of a micro-batch on one of its stages) in the order the
schedule gives; stage g's F of micro-batch i starts after stage g-1's F of i has ended plus the
P2P latency, stage g's B of i after stage g+1's B of i (the last stage's B after its own F).  One
step is repeated ``steps`` times back to back (every rank starts step k at the same time: the
previous step's makespan), followed by a short closing step, so that every rank's step window
(tracelens: a step's first kernel to the next step's first kernel) is the pipeline's makespan.

``write(sim, out_dir)`` writes one JSON per rank as torch's profiler does: ``ProfilerStep#N``
annotations on the main thread; per action an annotation (``Forward i`` / ``Backward i`` as
ScheduleGPipe records them, ``PP:<stage><F|B><mb>`` as the runtime schedules do, or none);
forward ops (``aten::linear`` / ``aten::mm``) on the main thread and backward ops
(``autograd::engine::evaluate_function: MmBackward0``) on the autograd thread, each with a
``cudaLaunchKernel`` whose kernel runs on stream 7 (correlation ids, ``ac2g`` flows); per P2P a
``nccl:send a->b`` / ``nccl:recv a<-b`` annotation around a ``record_param_comms`` op (send/recv,
process group "0", the group's ranks) that launches an ``ncclDevKernel_SendRecv`` kernel on
stream 20 (a recv kernel spans from when the rank posts it to when the data arrives); and
``distributedInfo`` with rank, world_size and pg_config.

Schedules (per-rank orders): ``gpipe`` (all F then all B), ``1f1b`` (p-s-1 warm-up F, then F/B
pairs, then the cool-down B: PipeDream-Flush / Megatron / torch's Schedule1F1B), ``interleaved``
(Megatron's interleaved 1F1B: rank r holds stages r, r+p, ... r+(v-1)p; m a multiple of p).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SCHEDULES = ("gpipe", "1f1b", "interleaved")
LEAD_NS = 40_000  # how far the host runs ahead of the GPU
STEP_GAP_NS = 0
ALLREDUCE_NS = 10_000  # write(stream_waits=True): the step-closing all-reduce's time after its last member joins


@dataclass(frozen=True)
class Action:
    kind: str  # "F" | "B" (zero_bubble: "B" the input-grad half, "W" the weight-grad half)
    stage: int  # global stage index (0 .. p*v-1)
    mb: int


@dataclass
class Sim:
    schedule: str
    p: int
    m: int
    v: int
    steps: int
    annotations: str  # "torch" (Forward i / Backward i), "pp" (PP:<stage><F|B><mb>), "none"
    orders: dict[int, list[Action]]
    times: dict[tuple[int, Action], tuple[int, int]]  # (rank, action) -> (start, end) in the first step, from 0
    recvs: dict[tuple[int, Action], tuple[int, int, int]]  # (rank, action) -> (start, end, peer)
    sends: dict[tuple[int, Action], tuple[int, int, int]]
    makespan: int
    answer: dict = field(default_factory=dict)


def rank_of(stage: int, p: int) -> int:
    return stage % p


def orders(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    """Each rank's actions, in the order the schedule runs them."""
    out: dict[int, list[Action]] = {}
    for r in range(p):
        if schedule == "gpipe":
            out[r] = [Action("F", r, i) for i in range(m)] + [Action("B", r, i) for i in range(m)]
        elif schedule == "1f1b":
            warm = min(p - r - 1, m)
            acts = [Action("F", r, i) for i in range(warm)]
            f, b = warm, 0
            while f < m:
                acts += [Action("F", r, f), Action("B", r, b)]
                f, b = f + 1, b + 1
            acts += [Action("B", r, i) for i in range(b, m)]
            out[r] = acts
        elif schedule == "zero_bubble":  # ZB-H1 (Qi et al. 2023): 1F1B's order of F and B (input grad); the W (weight
            # grad) deferred: one in each wait of the cool-down (before each B after the last F), the rest at the end
            warm = min(p - r - 1, m)
            acts = [Action("F", r, i) for i in range(warm)]
            f, b, w = warm, 0, 0
            while f < m:
                acts += [Action("F", r, f), Action("B", r, b)]
                f, b = f + 1, b + 1
            while b < m:
                if w < b:
                    acts.append(Action("W", r, w))
                    w += 1
                acts.append(Action("B", r, b))
                b += 1
            acts += [Action("W", r, i) for i in range(w, m)]
            out[r] = acts
        elif schedule == "interleaved":
            if m % p:
                raise ValueError(f"interleaved 1F1B needs m a multiple of p (m={m}, p={p})")
            total = v * m

            def chunk_mb(k: int, forward: bool) -> tuple[int, int]:
                c = (k // p) % v
                return (c if forward else v - 1 - c), (k // (p * v)) * p + k % p

            warm = min((p - r - 1) * 2 + (v - 1) * p, total)
            acts, f, b = [], 0, 0
            for _ in range(warm):
                c, i = chunk_mb(f, True)
                acts.append(Action("F", c * p + r, i))
                f += 1
            while f < total:
                c, i = chunk_mb(f, True)
                acts.append(Action("F", c * p + r, i))
                f += 1
                c, i = chunk_mb(b, False)
                acts.append(Action("B", c * p + r, i))
                b += 1
            while b < total:
                c, i = chunk_mb(b, False)
                acts.append(Action("B", c * p + r, i))
                b += 1
            out[r] = acts
        else:
            raise ValueError(f"unknown schedule {schedule!r}")
    return out


def simulate(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2, tf_ns: int = 1_000_000, tb_ns: int = 2_000_000,
             latency_ns: int = 0, slow_stage: int | None = None, slow_factor: float = 1.5, steps: int = 3,
             annotations: str = "torch", stage_times: dict[int, tuple[int, int]] | None = None) -> Sim:
    """The schedule's event times and the known answer.  ``tf_ns``/``tb_ns``: one micro-batch's
    forward/backward time on one device (split over its v stages in the interleaved schedule);
    ``stage_times``: per global stage (tf, tb), overriding them."""
    v = v if schedule == "interleaved" else 1
    n_stages = p * v
    tt: dict[int, tuple[int, int]] = {}
    for g in range(n_stages):
        f, b = (stage_times or {}).get(g, (tf_ns // v, tb_ns // v))
        if slow_stage is not None and rank_of(g, p) == slow_stage:
            f, b = int(f * slow_factor), int(b * slow_factor)
        tt[g] = (f, b)
    ords = orders(schedule, p, m, v)
    end: dict[Action, int] = {}
    times, recvs, sends = {}, {}, {}
    free = dict.fromkeys(range(p), 0)
    pos = dict.fromkeys(range(p), 0)
    left = sum(len(a) for a in ords.values())
    while left:
        progressed = False
        for r in range(p):
            while pos[r] < len(ords[r]):
                a = ords[r][pos[r]]
                if a.kind == "F":
                    dep = Action("F", a.stage - 1, a.mb) if a.stage > 0 else None
                elif a.kind == "W":  # the weight grad after the input grad, on its own stage
                    dep = Action("B", a.stage, a.mb)
                else:
                    dep = Action("B", a.stage + 1, a.mb) if a.stage < n_stages - 1 else Action("F", a.stage, a.mb)
                if dep is not None and dep not in end:
                    break
                cross = dep is not None and rank_of(dep.stage, p) != r
                arrival = (end[dep] + latency_ns) if cross else (end[dep] if dep is not None else 0)
                start = max(free[r], arrival)
                if cross:
                    recvs[(r, a)] = (free[r], start, rank_of(dep.stage, p))
                dur = tt[a.stage][0] if a.kind == "F" else tt[a.stage][1] // (2 if schedule == "zero_bubble" else 1)
                end[a] = start + dur
                times[(r, a)] = (start, start + dur)
                free[r] = start + dur
                sends_to = None
                if a.kind == "F" and a.stage < n_stages - 1 and rank_of(a.stage + 1, p) != r:
                    sends_to = rank_of(a.stage + 1, p)
                if a.kind == "B" and a.stage > 0 and rank_of(a.stage - 1, p) != r:
                    sends_to = rank_of(a.stage - 1, p)
                if sends_to is not None:
                    sends[(r, a)] = (start + dur, start + dur + max(latency_ns, 1_000), sends_to)
                pos[r] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks")
    makespan = max(e for (_, e) in times.values())
    makespan = max(makespan, max((e for (_, e, _) in sends.values()), default=0))
    sim = Sim(schedule, p, m, v, steps, annotations, ords, times, recvs, sends, makespan)
    sim.answer = known_answer(sim)
    return sim


def theory(schedule: str, p: int, m: int, v: int = 1) -> float:
    """The schedule's bubble as a fraction of the step (equal stages, no latency; zero_bubble:
    ZB-H1 with F, B and W of one time, (p-1)/(3m+p-1))."""
    if schedule == "zero_bubble":
        return (p - 1) / (3 * m + p - 1)
    vv = v if schedule == "interleaved" else 1
    return (p - 1) / (vv * m + p - 1)


def known_answer(sim: Sim) -> dict:
    """Per rank the bubble of one step (its window is the makespan): time and fraction, split into
    warm-up (before its first compute), cool-down (after its last) and steady (the gaps between)."""
    T = sim.makespan
    ranks = {}
    for r in range(sim.p):
        spans = sorted(sim.times[(r, a)] for a in sim.orders[r])
        busy = sum(e - s for s, e in spans)
        warm, cool = spans[0][0], T - spans[-1][1]
        ranks[r] = {"stage": r, "bubble_ns": T - busy, "bubble_fraction": (T - busy) / T, "warmup_ns": warm,
                    "cooldown_ns": cool, "steady_ns": T - busy - warm - cool, "compute_ns": busy, "step_ns": T}
    frac = sum(x["bubble_ns"] for x in ranks.values()) / (T * sim.p)
    return {"schedule": sim.schedule, "stages": sim.p, "microbatches": sim.m, "virtual_stages": sim.v,
            "bubble_fraction": frac, "theory_fraction": theory(sim.schedule, sim.p, sim.m, sim.v), "ranks": ranks}


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


@dataclass(frozen=True)
class Layout:
    """How a large run lays its ranks out and talks (``write(layout=...)``), Megatron's order (tensor
    parallel fastest, then data parallel, then the pipeline): stage s of data-parallel replica 0 is
    global rank ``s * dp * tp``, only replica 0's tp-rank 0 of each stage is written (``p`` of
    ``p * dp * tp`` ranks traced; ``replica``: another replica's pipeline, its ranks one tp further).  ``batched``: P2P as ``batch_isend_irecv`` issues it (Megatron's
    default): the sends and recvs a rank posts with no compute between them are each a
    ``nccl:send``/``nccl:recv`` annotation and record with no launch, then one ``nccl:coalesced``
    range launching one ``ncclDevKernel_SendRecv`` that spans them all (``coalesced_record``: with a
    ``record_param_comms`` "coalesced" inside it).  ``tp``: a tensor-parallel all-reduce kernel
    (stream 24, group "tp") at the end of each block's first kernel, inside its compute span;
    ``dp``: a data-parallel gradient all-reduce (stream 21, group "dp") inside each rank's last
    backward block.  Neither changes the busy time, so the known answer stands.  ``megatron_ranges``:
    ``forward-compute``/``backward-compute`` around the blocks, ``forward-recv``,
    ``backward-send-forward-recv`` ... around the P2P, ``forward-backward`` around the step's
    schedule.  ``profiler_steps=False``: no ``ProfilerStep#N`` annotations.  ``glue``: a grad-norm
    kernel launched after the step's last action range, outside every range, running on stream 8
    inside the rank's last compute (busy time unchanged).  ``cp``: context parallel (Megatron's order
    tp, cp, dp, pp: a stage's global rank ``s * dp * cp * tp``; cp-rank 0 written), ring attention inside
    every block: cp-1 rounds of a send to the next and a recv from the previous CP rank (group
    "cp<g>", peers named by their CP-group rank) between the block's two kernels, their SendRecv
    kernel (stream 25) inside the second one; the ring goes the same way in the backward.
    ``moe_ep``: an MoE token exchange inside every block, ``batch_isend_irecv`` to and from each
    of the other moe_ep-1 expert-parallel ranks (the stage's data-parallel ranks: moe_ep <= dp;
    group "ep<s>") as one ``nccl:coalesced`` SendRecv kernel (stream 26) inside the second kernel.
    Neither changes the busy time: the known answer stands.  ``record_shapes``: each P2P's
    ``c10d::send``/``c10d::recv_`` op with its tensor's ``Input Dims`` (bf16 4096 x 1024) around it."""
    dp: int = 1
    tp: int = 1
    batched: bool = False
    coalesced_record: bool = False
    tp_allreduce: bool = False
    dp_allreduce: bool = False
    megatron_ranges: bool = False
    profiler_steps: bool = True
    glue: bool = False
    replica: int = 0  # the data-parallel replica written (0 .. dp-1): its pipeline's ranks
    cp: int = 1
    moe_ep: int = 1
    record_shapes: bool = False
    group_desc: bool = True  # False: every group's description torch's default "undefined" (the group's name only)

    def rank(self, stage_rank: int) -> int:
        return stage_rank * self.dp * self.cp * self.tp + self.replica * self.cp * self.tp

    def world(self, p: int) -> int:
        return p * self.dp * self.cp * self.tp

    @property
    def pp_group(self) -> str:
        return "pp" if self.replica == 0 else f"pp{self.replica}"


class _Writer:
    def __init__(self, rank: int, p: int, layout: Layout | None = None):
        self.rank, self.p = rank, p
        self.layout = layout or Layout()
        self.pid, self.main, self.bwd = 1000 + rank, 1000 + rank, 2000 + rank
        self.pending: list[tuple[str, int, int, int, int]] = []  # batched P2P posted, not yet launched
        self.ev: list[dict] = []
        self.corr = 1 + rank * 1_000_000
        self.cursor = 0

    def host(self, want: int) -> int:
        """The host time for the next event: in program order, at most LEAD_NS before ``want``."""
        t = max(self.cursor + 1_000, want - LEAD_NS)
        self.cursor = t
        return t

    def span(self, cat: str, name: str, tid: int, s: int, e: int, **args) -> None:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid, "ts": _us(s), "dur": _us(max(e - s, 0))}
        if args:
            ev["args"] = args
        self.ev.append(ev)

    def kernel(self, name: str, stream: int, tid: int, launch: int, s: int, e: int, op: str | None = None, op_args=None) -> None:
        c = self.corr
        self.corr += 1
        if op is not None:
            self.span("cpu_op", op, tid, launch - 500, launch + 3_000, **{"External id": c, **(op_args or {})})
        self.span("cuda_runtime", "cudaLaunchKernel", tid, launch, launch + 2_000, correlation=c, **{"External id": c})
        self.ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": _us(s), "dur": _us(e - s),
                        "args": {"External id": c, "device": 0, "stream": stream, "correlation": c, "context": 1}})
        self.ev.append({"ph": "s", "id": c, "pid": self.pid, "tid": tid, "ts": _us(launch), "cat": "ac2g", "name": "ac2g"})
        self.ev.append({"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": _us(s), "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def _record(self, what: str, peer: int, seq: int, at: int, group: str, ranks: list[int], **extra) -> int:
        c = self.corr
        self.corr += 1
        self.span("cpu_op", "record_param_comms", self.main, at - 500, at + 4_000, **{
            "External id": c, "Collective name": what, "Process Group Name": group,
            "Process Group Description": group if self.layout.group_desc else "undefined",
            "Group size": len(ranks), "Process Group Ranks": str(ranks), **({"Rank": peer} if peer is not None else {}),
            "dtype": "BFloat16", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "Seq": seq, **extra})
        return c

    def _launch(self, name: str, stream: int, c: int, launch: int, s: int, e: int) -> None:
        self.span("cuda_runtime", "cudaLaunchKernel", self.main, launch, launch + 2_000, correlation=c, **{"External id": c})
        self.ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": _us(s), "dur": _us(max(e - s, 1_000)),
                        "args": {"External id": c, "device": 0, "stream": stream, "correlation": c, "context": 1}})
        self.ev.append({"ph": "s", "id": c, "pid": self.pid, "tid": self.main, "ts": _us(launch), "cat": "ac2g", "name": "ac2g"})
        self.ev.append({"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": _us(s), "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def pp_p2p(self, what: str, peer: int, s: int, e: int, seq: int, launch_at: int) -> None:
        """One P2P of a Layout run: on the pipeline group (``Layout.pp_group``; its ranks the stages' global ranks;
        annotation and record name the peer by its group rank, as ProcessGroupNCCL does); batched:
        posted now, launched by ``flush``."""
        lay = self.layout
        ranks = [lay.rank(i) for i in range(self.p)]
        if not lay.batched:
            launch = self.host(launch_at)
            arrow = "->" if what == "send" else "<-"
            self.span("user_annotation", f"nccl:{what} {self.rank}{arrow}{peer}", self.main, launch - 1_000, launch + 5_000)
            c = self._record(what, peer, seq, launch, lay.pp_group, ranks)
            self._launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 20, c, launch, s, e)
            self.cursor = max(self.cursor, launch + 5_000)
            return
        t = self.host(launch_at)
        arrow = "->" if what == "send" else "<-"
        self.span("user_annotation", f"nccl:{what} {self.rank}{arrow}{peer}", self.main, t - 1_000, t + 5_000)
        self._record(what, peer, seq, t, lay.pp_group, ranks)
        self.cursor = max(self.cursor, t + 5_000)
        self.pending.append((what, peer, s, e, seq))

    def flush(self) -> None:
        """The batched P2P posted since the last compute: one ``nccl:coalesced`` range, one SendRecv kernel."""
        if not self.pending:
            return
        s, e = min(x[2] for x in self.pending), max(x[3] for x in self.pending)
        t = self.host(s)
        self.span("user_annotation", "nccl:coalesced", self.main, t - 1_000, t + 5_000)
        if self.layout.coalesced_record:
            c = self._record("coalesced", None, self.pending[-1][4], t, self.layout.pp_group, [self.layout.rank(i) for i in range(self.p)])
        else:
            c = self.corr
            self.corr += 1
        self._launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 20, c, t, s, e)
        self.cursor = max(self.cursor, t + 5_000)
        self.pending = []

    def side_exchange(self, lay: Layout, ks: int, ke: int, cp_name: str, cp_ranks: list[int], ep_name: str, ep_ranks: list[int],
                      seq: dict) -> None:
        """The P2P a block does inside its compute (``Layout.cp``, ``Layout.moe_ep``), launched before the
        block's second kernel (starting at ``ks``, ending at ``ke``), their kernels inside it."""
        span = max((ke - ks) // 4, 2_000)
        for k in range(lay.cp - 1):  # ring attention: send the K/V block to the next CP rank, receive the previous one's
            for what, peer in (("send", 1 % lay.cp), ("recv", (lay.cp - 1) % lay.cp)):
                t = self.host(ks)
                arrow = "->" if what == "send" else "<-"
                self.span("user_annotation", f"nccl:{what} 0{arrow}{peer}", self.main, t - 1_000, t + 5_000)
                c = self._record(what, peer, seq[f"cp_{what}"], t, cp_name, cp_ranks)
                seq[f"cp_{what}"] += 1
                s0 = ks + 1_000 + k * span // max(lay.cp - 1, 1)
                self._launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 25, c, t, s0, min(s0 + span // 2, ke - 1_000))
                self.cursor = max(self.cursor, t + 5_000)
        if lay.moe_ep > 1:  # the MoE token exchange: batch_isend_irecv to and from every other EP rank, one kernel
            t = self.host(ks)
            for j in range(1, lay.moe_ep):
                for what in ("send", "recv"):
                    arrow = "->" if what == "send" else "<-"
                    self.span("user_annotation", f"nccl:{what} 0{arrow}{j}", self.main, t - 1_000, t + 5_000)
                    self._record(what, j, seq["ep"], t, ep_name, ep_ranks)
                    t = self.host(t + 6_000)
            self.span("user_annotation", "nccl:coalesced", self.main, t - 1_000, t + 5_000)
            c = self.corr
            self.corr += 1
            s0 = ks + 1_000
            self._launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 26, c, t, s0, min(s0 + span, ke - 1_000))
            seq["ep"] += 1
            self.cursor = max(self.cursor, t + 5_000)

    def collective(self, what: str, kernel: str, stream: int, group: str, ranks: list[int], s: int, e: int, seq: int) -> None:
        """A collective (a TP or DP all-reduce) launched now, running on ``stream`` over [s, e)."""
        launch = self.host(s)
        c = self._record(what, None, seq, launch, group, ranks)
        self._launch(kernel, stream, c, launch, s, e)
        self.cursor = max(self.cursor, launch + 5_000)

    def p2p(self, what: str, peer: int, s: int, e: int, seq: int, launch_at: int, stream: int = 20) -> None:
        launch = self.host(launch_at)
        arrow = "->" if what == "send" else "<-"
        self.span("user_annotation", f"nccl:{what} {self.rank}{arrow}{peer}", self.main, launch - 1_000, launch + 5_000)
        c = self.corr
        self.corr += 1
        self.span("cpu_op", "record_param_comms", self.main, launch - 500, launch + 4_000, **{
            "External id": c, "Collective name": what, "Process Group Name": "0", "Process Group Description": "default_pg",
            "Group size": self.p, "Process Group Ranks": str(list(range(self.p))), "Rank": peer, "dtype": "BFloat16",
            "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "Seq": seq})
        self.span("cuda_runtime", "cudaLaunchKernel", self.main, launch, launch + 2_000, correlation=c, **{"External id": c})
        self.ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "pid": 0,
                        "tid": stream, "ts": _us(s), "dur": _us(max(e - s, 1_000)),
                        "args": {"External id": c, "device": 0, "stream": stream, "correlation": c, "context": 1}})
        self.ev.append({"ph": "s", "id": c, "pid": self.pid, "tid": self.main, "ts": _us(launch), "cat": "ac2g", "name": "ac2g"})
        self.ev.append({"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": _us(s), "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.cursor = max(self.cursor, launch + 5_000)

    def allreduce(self, s: int, e: int, seq: int) -> None:
        """A step-closing all-reduce over every rank (a loss or grad-norm all-reduce) on stream 21,
        after the compute (an event wait on stream 7)."""
        self.stream_wait(21, 7)
        launch = self.host(s)
        c = self.corr
        self.corr += 1
        self.span("cpu_op", "record_param_comms", self.main, launch - 500, launch + 4_000, **{
            "External id": c, "Collective name": "allreduce", "Process Group Name": "0", "Process Group Description": "default_pg",
            "Group size": self.p, "Process Group Ranks": str(list(range(self.p))), "dtype": "Float", "In msg nelems": 1,
            "Out msg nelems": 1, "Seq": seq})
        self.span("cuda_runtime", "cudaLaunchKernel", self.main, launch, launch + 2_000, correlation=c, **{"External id": c})
        self.ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                        "pid": 0, "tid": 21, "ts": _us(s), "dur": _us(e - s),
                        "args": {"External id": c, "device": 0, "stream": 21, "correlation": c, "context": 1}})
        self.ev.append({"ph": "s", "id": c, "pid": self.pid, "tid": self.main, "ts": _us(launch), "cat": "ac2g", "name": "ac2g"})
        self.ev.append({"ph": "f", "id": c, "pid": 0, "tid": 21, "ts": _us(s), "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.cursor = max(self.cursor, launch + 5_000)

    def stream_wait(self, stream: int, on: int) -> None:
        """The event wait NCCL leaves between the compute and the P2P streams: ``cudaEventRecord`` on
        stream ``on`` (after the last kernel launched there) and ``cudaStreamWaitEvent`` on
        ``stream``, with Kineto's ``Stream Wait Event`` row naming both: the next kernel launched on
        ``stream`` starts after that one ends (after a recv: the compute waits for it; before a
        send: the send waits for the compute)."""
        rec, wait = self.corr, self.corr + 1
        self.corr += 2
        t = self.host(self.cursor)
        self.span("cuda_runtime", "cudaEventRecord", self.main, t, t + 500, correlation=rec)
        self.span("cuda_runtime", "cudaStreamWaitEvent", self.main, t + 600, t + 1_000, correlation=wait)
        self.ev.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": stream, "ts": _us(t + 600), "dur": 0,
                        "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": on, "wait_on_cuda_event_record_corr_id": rec,
                                 "stream": stream, "correlation": wait, "device": 0}})
        self.cursor = max(self.cursor, t + 1_000)


def write(sim: Sim, out_dir: str | Path, stream_waits: bool = False, layout: Layout | None = None) -> list[Path]:
    """One Kineto JSON per rank (``rank-<r>.json``); returns their paths in rank order.
    ``stream_waits``: the recvs run on a stream of their own (22), each between the event waits
    (``_Writer.stream_wait``) that make it wait for the compute before it and the compute after it
    wait for it, each send after the one that makes it wait for the compute, and each step ends in a ``cudaDeviceSynchronize`` that
    returns after the rank's last activity: a rank's critical path then runs on its GPU (not
    through the host's launches, which run just ahead of it) and crosses its recvs.  ``layout``: a
    large run's ranks, groups and comm kernels (``Layout``; not with ``stream_waits``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    T = sim.makespan + (STEP_GAP_NS if not stream_waits else ALLREDUCE_NS + 50_000)
    base = 1_000_000_000
    paths = []
    for r in range(sim.p):
        lay = layout
        w = _Writer(r, sim.p, lay)
        seq = {"send": 0, "recv": 0, "tp": 0, "dp": 0, "cp_send": 0, "cp_recv": 0, "ep": 0}
        g = lay.rank(r) if lay else r
        tp_ranks = list(range(g, g + lay.tp)) if lay else []
        dp_ranks = [r * lay.dp * lay.cp * lay.tp + i * lay.cp * lay.tp for i in range(lay.dp)] if lay else []
        cp_ranks = [g + i * lay.tp for i in range(lay.cp)] if lay else []
        ep_ranks = dp_ranks[:lay.moe_ep] if lay else []
        assert lay is None or lay.moe_ep <= lay.dp, "moe_ep <= dp"
        cp_name, ep_name = f"cp{g}", f"ep{r}"
        # each group its own name (torch numbers the groups it creates, the same on every rank): stage r's
        # TP and DP groups are other groups than stage r+1's
        tp_name, dp_name = f"tp{g}", f"dp{r}"  # (a stage's DP group holds every replica's rank of that stage)

        def p2p(what: str, peer: int, s: int, e: int, at: int, fwd: bool, w=w, seq=seq, lay=lay) -> None:
            t = w.cursor
            w.pp_p2p(what, peer, s, e, seq[what], at)
            if lay.megatron_ranges and not lay.batched:
                w.span("user_annotation", f"{'forward' if fwd else 'backward'}-{what}", w.main, t + 200, w.cursor + 300)
            elif lay.batched:
                w.pending[-1] = (*w.pending[-1], "forward" if fwd else "backward", t)
            seq[what] += 1

        def flush(w=w, lay=lay) -> None:
            if lay is None or not w.pending:
                return
            name = "-".join(f"{x[5]}-{x[0]}" for x in w.pending)
            t0_ = w.pending[0][6]
            w.flush()
            if lay.megatron_ranges:
                w.span("user_annotation", name, w.main, t0_ + 200, w.cursor + 300)
        for k in range(sim.steps + 1):
            t0 = base + k * T
            w.cursor = max(w.cursor, t0 - LEAD_NS - 10_000)
            step_start = w.cursor
            if k == sim.steps:  # the closing step: one short kernel at the start of the next step
                flush()
                launch = w.host(t0)
                w.kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 7, w.main, launch,
                         t0, t0 + 2_000, op="aten::fill_")
                if lay is None or lay.profiler_steps:
                    w.span("user_annotation", f"ProfilerStep#{k + 1}", w.main, step_start, w.cursor + 10_000)
                break
            last_b = max((i for i, a in enumerate(sim.orders[r]) if a.kind != "F"), default=-1)
            for a in sim.orders[r]:
                s, e = sim.times[(r, a)]
                s, e = s + t0, e + t0
                ann_start = w.cursor + 500
                if (r, a) in sim.recvs:
                    rs, re_, peer = sim.recvs[(r, a)]
                    if stream_waits:  # the recv (on its own stream) after the compute before it, the compute after it
                        w.stream_wait(22, 7)
                    if lay is None:
                        w.p2p("recv", peer, rs + t0, re_ + t0, seq["recv"], rs + t0, stream=22 if stream_waits else 20)
                        seq["recv"] += 1
                    else:
                        p2p("recv", peer, rs + t0, re_ + t0, rs + t0, a.kind == "F")
                    if stream_waits:
                        w.stream_wait(7, 22)
                flush()
                n_k = 2
                piece = (e - s) // n_k
                for j in range(n_k):
                    ks = s + j * piece
                    ke = e if j == n_k - 1 else ks + piece
                    if lay is not None and j == 1 and (lay.cp > 1 or lay.moe_ep > 1):
                        w.side_exchange(lay, ks, ke, cp_name, cp_ranks, ep_name, ep_ranks, seq)
                    launch = w.host(ks)
                    tp_end = None
                    if lay is not None and lay.tp_allreduce and j == 0:  # the TP all-reduce ends the first kernel's span
                        tp_end, ke = ke, ke - max(piece // 5, 1_000)
                    if a.kind == "F":
                        w.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", 7, w.main, launch,
                                 ks, ke, op="aten::mm", op_args={"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"]})
                    else:
                        w.span("cpu_op", "autograd::engine::evaluate_function: MmBackward0", w.bwd, launch - 1_000, launch + 4_000)
                        w.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1", 7, w.bwd, launch,
                                 ks, ke, op="aten::mm", op_args={"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"]})
                    if tp_end is not None:
                        w.collective("allreduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 24, tp_name,
                                     tp_ranks, ke, tp_end, seq["tp"])
                        seq["tp"] += 1
                    if lay is not None and lay.dp_allreduce and j == n_k - 1 and sim.orders[r].index(a) == last_b:
                        # the gradient all-reduce of the last backward, overlapping its last kernel
                        w.collective("allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 21, dp_name,
                                     dp_ranks, ks, ke, seq["dp"])
                        seq["dp"] += 1
                if (r, a) in sim.sends:
                    ss, se, peer = sim.sends[(r, a)]
                    if stream_waits:  # the send waits for the compute before it (NCCL's stream waits on the compute stream)
                        w.stream_wait(20, 7)
                    if lay is None:
                        w.p2p("send", peer, ss + t0, se + t0, seq["send"], ss + t0)
                        seq["send"] += 1
                    else:
                        p2p("send", peer, ss + t0, se + t0, ss + t0, a.kind == "F")
                ann_end = w.cursor + 500
                w.cursor = ann_end
                if lay is not None and lay.megatron_ranges:
                    w.span("user_annotation", "forward-compute" if a.kind == "F" else "backward-compute", w.main, ann_start, ann_end)
                elif sim.annotations == "torch":
                    w.span("user_annotation", f"{'Forward' if a.kind == 'F' else 'Backward'} {a.mb}", w.main, ann_start, ann_end)
                elif sim.annotations == "pp":
                    kind = {"B": "I"}.get(a.kind, a.kind) if sim.schedule == "zero_bubble" else a.kind  # torch's runtime: I and W
                    w.span("user_annotation", f"PP:{a.stage}{kind}{a.mb}", w.main, ann_start, ann_end)
            if stream_waits:  # the step ends in an all-reduce (done when the last rank joins) and a device synchronize
                last = max([e for (rr, _), (_, e) in sim.times.items() if rr == r] + [e for (rr, _), (_, e, _) in sim.sends.items() if rr == r])
                w.allreduce(t0 + last, t0 + sim.makespan + ALLREDUCE_NS, k)
                t = w.host(w.cursor)
                w.span("cuda_runtime", "cudaDeviceSynchronize", w.main, t, max(t + 1_000, t0 + sim.makespan + ALLREDUCE_NS + 2_000),
                       correlation=w.corr)
                w.corr += 1
                w.cursor = max(t + 1_000, t0 + sim.makespan + ALLREDUCE_NS + 2_000)
            flush()
            if lay is not None and lay.glue:  # a grad-norm (clip_grad_norm_) kernel, outside every action range
                last = max(e for (rr, _), (_, e) in sim.times.items() if rr == r) + t0
                w.cursor += 2_000
                w.kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
                         "TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, 2>, float*, int>",
                         8, w.main, w.host(last), last - 3_000, last - 1_000, op="aten::_foreach_norm")
            if lay is not None and lay.megatron_ranges:
                w.span("user_annotation", "forward-backward", w.main, step_start + 100, w.cursor + 500)
            if lay is None or lay.profiler_steps:
                w.span("user_annotation", f"ProfilerStep#{k + 1}", w.main, step_start, max(w.cursor + 1_000, t0 + T - LEAD_NS - 10_000))
            w.cursor = max(w.cursor, t0 + T - LEAD_NS - 10_000)
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000, "computeMajor": 9,
                                  "computeMinor": 0, "numSms": 132}],
            "distributedInfo": ({"backend": "nccl", "rank": r, "world_size": sim.p, "pg_count": 1,
                                 "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                                "pg_size": sim.p, "ranks": list(range(sim.p))}]} if lay is None else
                                {"backend": "nccl", "rank": g, "world_size": lay.world(sim.p), "pg_count": 4, "pg_config": [
                                    {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": lay.world(sim.p),
                                     "ranks": list(range(lay.world(sim.p)))},
                                    {"pg_name": lay.pp_group, "pg_desc": "pp", "backend_config": "cuda:nccl", "pg_size": sim.p,
                                     "ranks": [lay.rank(i) for i in range(sim.p)]},
                                    {"pg_name": dp_name, "pg_desc": "dp", "backend_config": "cuda:nccl", "pg_size": lay.dp, "ranks": dp_ranks},
                                    {"pg_name": tp_name, "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": lay.tp, "ranks": tp_ranks},
                                    *([{"pg_name": cp_name, "pg_desc": "cp", "backend_config": "cuda:nccl", "pg_size": lay.cp,
                                        "ranks": cp_ranks}] if lay.cp > 1 else []),
                                    *([{"pg_name": ep_name, "pg_desc": "ep", "backend_config": "cuda:nccl", "pg_size": lay.moe_ep,
                                        "ranks": ep_ranks}] if lay.moe_ep > 1 else [])]}),
            "traceEvents": sorted(w.ev, key=lambda e: (e["ts"], e.get("ph") != "X")),
            "traceName": f"rank-{r}.json",
        }
        path = out / f"rank-{r}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths
