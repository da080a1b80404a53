"""A data-parallel GPU job simulator: Kineto-format traces of n ranks, each step a DataLoader
span, a few compute kernels launched from the main thread, then a gradient all-reduce on a comm
stream and a ``cudaStreamSynchronize`` on it, with the step's time known from the simulation (the
answer the critical path, the replay and the export are checked against).

``simulate(ranks, steps)`` lays out every rank's events on one true clock; ``write(sim, dir)``
writes one JSON per rank, shifted by the rank's clock ``skew_ns``.  Per step of rank r (host
times from the step's start h):

* ``ProfilerStep#N`` [h, the step's host end] on the main thread (omitted with ``no_steps``);
* ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` [h, h + dl_ns];
* per kernel (name, dur_ns): ``aten::mm`` for ``op_ns`` holding a ``cudaLaunchKernel`` (LAUNCH_NS,
  from 1 µs into the op) with its correlation id and ``ac2g`` flow; the kernel on stream 7 starts
  at max(launch + LATENCY_NS, the previous kernel's end); with ``graph`` the step's kernels come
  from one ``cudaGraphLaunch`` instead (each kernel with the graph launch's correlation);
* ``cudaEventRecord`` (stream 7) then ``record_param_comms`` (allreduce, group "0", Seq k) holding
  a ``cudaStreamWaitEvent`` (Kineto's ``Stream Wait Event`` row on stream 20 names the record) and
  the launch of ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` on stream 20: it starts on rank r at
  its arrival (max(launch + LATENCY_NS, stream 7's last kernel's end)) and ends, on every rank,
  at the last arrival + ``comm_ns`` (``solo``: that rank's collective has another Seq, so it
  matches no other rank's; it ends at its own arrival + comm_ns);
* ``cudaStreamSynchronize`` (a ``Stream Sync`` row) from the host's next point to the all-reduce's
  end + SYNC_LAG_NS, then TAIL_NS of host time before the next step.  With ``overlap`` = j the
  all-reduce is issued after the first j kernels and the others are launched after it (running
  beside it on stream 7), and the step ends with a ``cudaDeviceSynchronize`` until both streams
  are done + SYNC_LAG_NS.

A closing step (one kernel) follows the last, so that each step's window (tracelens: its first
kernel to the next step's first kernel) is known: ``Sim.step_ns[r]``, per rank, per step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

LATENCY_NS = 4_000  # launch call start -> kernel start, when the stream is free
LAUNCH_NS = 3_000  # a cudaLaunchKernel call
SYNC_LAG_NS = 3_000  # the all-reduce's end -> cudaStreamSynchronize's return
TAIL_NS = 5_000  # host time after the sync, before the next step
COMPUTE, COMM = 7, 20
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"


@dataclass
class RankSpec:
    kernels: list[tuple[str, int]] = field(default_factory=lambda: [(GEMM, 200_000), (SOFTMAX, 50_000), (GEMM, 200_000)])
    dl_ns: int = 20_000  # DataLoader time per step
    op_ns: int = 10_000  # host time of each op that launches a kernel
    comm_ns: int = 60_000  # the all-reduce's work after its last member arrives
    skew_ns: int = 0  # this rank's clock minus the true clock
    no_steps: bool = False  # no ProfilerStep spans
    graph: bool = False  # the step's kernels from one cudaGraphLaunch
    solo: bool = False  # its collectives match no other rank's (another Seq)
    device: int = 0
    overlap: int | None = None  # the all-reduce issued after this many kernels (DDP's bucket), the rest overlapping it


@dataclass
class Sim:
    specs: list[RankSpec]
    steps: int
    events: list[list[dict]]
    step_ns: list[list[int]]  # per rank, per step: first kernel to the next step's first kernel
    first_kernel: list[list[int]]  # per rank, per step (and the closing step), on the true clock
    arrivals: list[list[int]]  # per rank, per step: when its all-reduce kernel started


def _us(ns: int) -> float:
    return ns / 1000


class _Rank:
    def __init__(self, r: int, spec: RankSpec):
        self.r, self.s = r, spec
        self.pid = self.tid = 1000 + r
        self.corr = 1 + r * 1_000_000
        self.ev: list[dict] = []
        self.free = {COMPUTE: 0, COMM: 0}
        self.last_compute_end = 0

    def span(self, cat: str, name: str, s: int, e: int, **args) -> None:
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid, "ts": s, "dur": e - s, "args": args})

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def kernel(self, name: str, stream: int, corr: int, launch: int, s: int, e: int) -> None:
        d = self.s.device
        self.ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": d, "tid": stream, "ts": s, "dur": e - s,
                        "args": {"External id": corr, "queued": 0, "device": d, "context": 1, "stream": stream, "correlation": corr}})
        self.ev.append({"ph": "s", "id": corr, "pid": self.pid, "tid": self.tid, "ts": launch, "cat": "ac2g", "name": "ac2g"})
        self.ev.append({"ph": "f", "id": corr, "pid": d, "tid": stream, "ts": s, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.free[stream] = e

    def compute(self, h: int, kernels: list[tuple[str, int]]) -> tuple[int, int]:
        """The step's compute launches from host time h: (host time after them, first kernel's start)."""
        first = None
        if self.s.graph:
            c = self.next_corr()
            self.span("cpu_op", "aten::cuda_graph_replay", h, h + self.s.op_ns)
            self.span("cuda_runtime", "cudaGraphLaunch", h + 1_000, h + 1_000 + LAUNCH_NS, correlation=c, **{"External id": c})
            t = max(h + 1_000 + LATENCY_NS, self.free[COMPUTE])
            for name, dur in kernels:  # a graph's kernels back to back, each with the graph launch's correlation
                first = t if first is None else first
                self.kernel(name, COMPUTE, c, h + 1_000, t, t + dur)
                t += dur
            return h + self.s.op_ns, first
        for name, dur in kernels:
            c = self.next_corr()
            self.span("cpu_op", "aten::mm", h, h + self.s.op_ns, **{"External id": c})
            launch = h + 1_000
            self.span("cuda_runtime", "cudaLaunchKernel", launch, launch + LAUNCH_NS, correlation=c, cbid=211, **{"External id": c})
            s = max(launch + LATENCY_NS, self.free[COMPUTE])
            first = s if first is None else first
            self.kernel(name, COMPUTE, c, launch, s, s + dur)
            h += self.s.op_ns
        return h, first


def simulate(specs: list[RankSpec], steps: int = 4) -> Sim:
    n = len(specs)
    ranks = [_Rank(r, sp) for r, sp in enumerate(specs)]
    h = [0] * n
    first_k: list[list[int]] = [[] for _ in range(n)]
    arrivals: list[list[int]] = [[] for _ in range(n)]
    for k in range(steps + 1):
        closing = k == steps
        starts = list(h)
        pending = []
        for r, R in enumerate(ranks):
            t = h[r]
            R.span("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, t + R.s.dl_ns)
            t += R.s.dl_ns
            split = len(R.s.kernels) if R.s.overlap is None else R.s.overlap
            t, fk = R.compute(t, R.s.kernels[:1] if closing else R.s.kernels[:split])
            first_k[r].append(fk)
            if closing:
                h[r] = t
                if not R.s.no_steps:
                    R.span("user_annotation", f"ProfilerStep#{k + 1}", starts[r], t)
                continue
            rec, wait, cn = R.next_corr(), R.next_corr(), R.next_corr()
            R.span("cuda_runtime", "cudaEventRecord", t, t + 2_000, correlation=rec, cbid=135)
            t += 2_000
            seq = k + 1 + (1000 if R.s.solo else 0)
            R.span("cpu_op", "record_param_comms", t, t + 10_000, **{
                "External id": cn, "Collective name": "allreduce", "Process Group Name": "0", "Process Group Description": "default_pg",
                "Group size": n, "Process Group Ranks": str(list(range(n))), "dtype": "Float", "In msg nelems": 1 << 20,
                "Out msg nelems": 1 << 20, "Seq": seq})
            R.span("cuda_runtime", "cudaStreamWaitEvent", t + 1_000, t + 3_000, correlation=wait, cbid=147)
            R.ev.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": R.s.device, "tid": COMM, "ts": t + 1_000,
                         "dur": 0, "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": COMPUTE,
                                            "wait_on_cuda_event_record_corr_id": rec, "stream": COMM, "correlation": wait,
                                            "device": R.s.device}})
            launch = t + 4_000
            R.span("cuda_runtime", "cudaLaunchKernel", launch, launch + LAUNCH_NS, correlation=cn, cbid=211, **{"External id": cn})
            arrive = max(launch + LATENCY_NS, R.free[COMPUTE], R.free[COMM])
            arrivals[r].append(arrive)
            t += 10_000
            if split < len(R.s.kernels):  # the rest of the step's kernels, overlapping the all-reduce
                t, _ = R.compute(t, R.s.kernels[split:])
            pending.append((r, cn, launch, arrive, t))
        if closing:
            break
        last = max(a for _, _, _, a, _ in pending)
        for r, cn, launch, arrive, t in pending:
            R = ranks[r]
            end = (arrive if R.s.solo else last) + R.s.comm_ns
            R.kernel(NCCL, COMM, cn, launch, arrive, end)
            sc = R.next_corr()
            if R.s.overlap is None:
                ret = max(t + 2_000, end + SYNC_LAG_NS)
                R.span("cuda_runtime", "cudaStreamSynchronize", t, ret, correlation=sc, cbid=131)
                R.ev.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": R.s.device, "tid": COMM, "ts": end,
                             "dur": ret - end, "args": {"cuda_sync_kind": "Stream Sync", "wait_on_stream": COMM, "stream": COMM,
                                                        "correlation": sc, "device": R.s.device}})
            else:  # both streams: a device synchronize
                ret = max(t + 2_000, end + SYNC_LAG_NS, R.free[COMPUTE] + SYNC_LAG_NS)
                R.span("cuda_runtime", "cudaDeviceSynchronize", t, ret, correlation=sc, cbid=165)
            h[r] = ret + TAIL_NS
            if not R.s.no_steps:
                R.span("user_annotation", f"ProfilerStep#{k + 1}", starts[r], h[r])
    step_ns = [[first_k[r][k + 1] - first_k[r][k] for k in range(steps)] for r in range(n)]
    return Sim(specs, steps, [R.ev for R in ranks], step_ns, first_k, arrivals)


def write(sim: Sim, out_dir: str | Path, one_file: bool = False) -> list[Path]:
    """One Kineto JSON per rank (``rank-<r>.json``), times in µs on the rank's clock (true + skew);
    ``one_file``: every rank's events in one file (several GPUs of one process, as a single-process
    multi-GPU run records them), the ranks' devices told apart by ``device``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = len(sim.specs)

    def shifted(r: int) -> list[dict]:
        sk = sim.specs[r].skew_ns
        evs = []
        for e in sim.events[r]:
            e = dict(e)
            e["ts"] = _us(e["ts"] + sk)
            if "dur" in e:
                e["dur"] = _us(e["dur"])
            evs.append(e)
        meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 1000 + r, "tid": 0, "args": {"name": "python3"}},
                {"name": "thread_name", "ph": "M", "ts": 0, "pid": 1000 + r, "tid": 1000 + r, "args": {"name": f"thread {1000 + r} (python3)"}}]
        return meta + evs

    props = [{"id": sp.device, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045035008, "computeMajor": 9, "computeMinor": 0,
              "numSms": 132} for sp in sim.specs]
    if one_file:
        p = out / "rank-0.json"
        evs = [e for r in range(n) for e in shifted(r)]
        p.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
                                 "deviceProperties": props, "traceEvents": evs}))
        return [p]
    paths = []
    for r in range(n):
        p = out / f"rank-{r}.json"
        p.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": n},
                                 "deviceProperties": [props[r]], "traceEvents": shifted(r)}))
        paths.append(p)
    return paths
