"""Record real pipeline-parallel runs on the CPU for the tests (torch.distributed.pipelining over gloo).

``record_pipeline(out_dir, schedule, world, microbatches)`` spawns ``world`` processes; each holds
one stage (``v`` stages for the interleaved schedules: stage ``rank + k * world``; two for the
V-shaped ones: stages ``rank`` and ``2 * world - 1 - rank``) of a small MLP,
runs ``steps + 1`` schedule steps under ``torch.profiler.profile`` (CPU activities, one warm-up
step) and writes ``rank-<r>.json``.  The last stage carries the loss, which makes it the slowest.

What the traces hold (torch 2.13, CPU, gloo, ``record_shapes=True``), as read from the recordings:

* ``distributedInfo``: ``backend`` gloo, ``rank``, ``world_size``, ``pg_count`` 1 and ``pg_config``
  with only the default group (``pg_name`` "0", ``pg_desc`` ``default_pg``, all ranks): a pure-PP
  job has no separate PP group, every P2P runs on the default one.
* ``ProfilerStep#N`` spans on the main thread, one per ``schedule.step``; everything (forward,
  backward through ``torch.autograd.backward``, P2P) on that one thread.
* Stage ops: ``ScheduleGPipe`` wraps each micro-batch in ``record_function`` ranges (user_annotation)
  ``Forward i`` / ``Backward i``.  ``Schedule1F1B`` records no per-micro-batch range at all: its
  micro-batches show only as runs of ``aten::linear``/``aten::addmm`` (forward) and
  ``autograd::engine::evaluate_function: AddmmBackward0`` ... (backward) between the P2P records.
  ``ScheduleInterleaved1F1B`` (a runtime schedule) wraps every action in ``PP:<action>``:
  ``PP:1F0``, ``PP:3B1``, also ``PP:1UNSHARD``, ``PP:1RECV_F0``, ``PP:1SEND_F0``, ``PP:3SEND_B0``
  (rank r holds stages r and r + world).  The stage module itself is no range.
* Zero-bubble schedules (``ZB_SCHEDULES``; all run on CPU/gloo in torch 2.13, ~7 s a 2-rank
  recording, 9-13 s at 4 ranks and 8 micro-batches), runtime schedules like the interleaved one:

  - ``interleaved_zb`` (``ScheduleInterleavedZeroBubble``, looped: rank r holds r and r + world):
    ``PP:<s>F<i>``, the backward split into ``PP:<s>I<i>`` (input grad) and ``PP:<s>W<i>``
    (weight grad), 8 of each per rank and step at 2 x 4; P2P actions ``PP:<s>SEND_F<i>``,
    ``RECV_F``, ``SEND_B``, ``RECV_B`` for every stage hand-off (24 sends, 24 recvs a step, both ranks),
    ``PP:<s>UNSHARD`` / ``RESHARD`` / ``REDUCE_GRAD`` once per stage.
  - ``zbv`` (``ScheduleZBVZeroBubble``): the same F / I / W actions on the V (rank 0: stages 0 and
    3, rank 1: 1 and 2 at world 2).  The hand-off at the V's bottom (stage p-1 to p, both on rank
    p-1) is local: no SEND/RECV action, no P2P (16 sends a step at 2 x 4, both ranks, not 24).  Rank 0
    holds the first stage and the last (the loss): the input and the target are both its.
  - ``dualpipev`` (``ScheduleDualPipeV``, the V too): F, I, W and full backwards ``PP:<s>B<i>``,
    and overlapped pairs ``PP:(<s>F<i>;<t>B<j>)OVERLAP_F_B`` (``(0F3;3B1)``, ``(3F2;0B0)``): one
    range in which torch runs the forward then the backward, one after the other on the CPU;
    the ops of the backward half lie inside ``autograd::engine::evaluate_function`` ops.
  - A first stage's ``I`` action computes nothing (its input needs no grad): an empty range.
  - ``gloo:send`` records of these schedules last until the runtime waits on them (the end of the
    step: up to 150 ms at 2 x 4), the recvs until their data came.
* P2P: no ``record_param_comms`` on gloo.  A ``c10d::send`` / ``c10d::recv_`` cpu_op (Concrete
  Inputs ``["", "", "<peer group rank>", "<tag>"]``, the peer only with ``record_shapes``) holds a
  ``gloo:send`` / ``gloo:recv`` annotation, which the parser makes the P2P record (kind ``p2p``,
  group "0", ``default_pg``, group size = world, sequence numbers per rank and direction).  The
  batched P2P of 1F1B's steady state (``fwd_send_bwd_recv``) is a send then a recv, one by one.
* Timing: each gloo op runs on the host and blocks; with 2 cores shared the transfers take ms, so
  the measured bubble is far above the schedule's theory (most of it exposed P2P).
* torch needs numpy to exchange stage shapes (``recv_object_list``): the stages are built with
  their micro-batch shapes given (``input_args`` / ``output_args``), which skips that exchange.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

SCHEDULES = ("gpipe", "1f1b", "interleaved")
# zero-bubble schedules (split backward: I and W actions), two stages per rank: looped (stage r + k*world) or V-shaped
# (stages r and 2*world-1-r)
ZB_SCHEDULES = ("interleaved_zb", "zbv", "dualpipev")
MULTI = {"interleaved": "ScheduleInterleaved1F1B", "interleaved_zb": "ScheduleInterleavedZeroBubble",
         "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
V_SHAPED = ("zbv", "dualpipev")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str, schedule: str, microbatches: int, steps: int, v: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining as pp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    width, batch = 1024, 16 * microbatches
    if schedule in V_SHAPED:
        v = 2
    n_stages = world * (v if schedule in MULTI else 1)
    mine = [rank, n_stages - 1 - rank] if schedule in V_SHAPED else [rank + k * world for k in range(n_stages // world)]
    stages, mods = [], []
    for s in mine:
        layers = [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()]
        mod = torch.nn.Sequential(*layers)
        mods.append(mod)
        # the shapes given (an input that needs its gradient): no metadata exchange, which needs numpy
        inp = torch.empty(batch // microbatches, width, requires_grad=s > 0)
        out = torch.empty(batch // microbatches, width, requires_grad=True)
        stages.append(pp.PipelineStage(mod, s, n_stages, torch.device("cpu"), input_args=(inp,), output_args=(out,)))

    def loss_fn(out, target):
        return torch.nn.functional.mse_loss(out, target)

    if schedule == "gpipe":
        sched = pp.ScheduleGPipe(stages[0], microbatches, loss_fn=loss_fn)
    elif schedule == "1f1b":
        sched = pp.Schedule1F1B(stages[0], microbatches, loss_fn=loss_fn)
    else:
        sched = getattr(pp.schedules, MULTI[schedule])(stages, microbatches, loss_fn=loss_fn)
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)
    first, last = 0 in mine, (n_stages - 1) in mine
    prof_sched = torch.profiler.schedule(wait=0, warmup=1, active=steps)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=prof_sched, record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(Path(out_dir) / f"rank-{rank}.json")),
    ) as prof:
        for _ in range(steps + 1):
            opt.zero_grad()
            kwargs = {}
            if last:
                kwargs["target"] = y
            if first:
                sched.step(x, **kwargs)
            else:
                sched.step(**kwargs)
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def _order_worker(rank: int, world: int, port: int, out: str, schedules: list[str], ms: list[int]) -> None:
    import json

    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining as pp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n = 2 * world
    got: dict[str, dict] = {}
    for schedule in schedules:
        mine = [rank, n - 1 - rank] if schedule in V_SHAPED else [rank, rank + world]
        for m in ms:
            stages = [pp.PipelineStage(torch.nn.Linear(4, 4), s, n, torch.device("cpu"),
                                       input_args=(torch.empty(1, 4, requires_grad=s > 0),),
                                       output_args=(torch.empty(1, 4, requires_grad=True),)) for s in mine]
            try:
                sched = getattr(pp.schedules, MULTI[schedule])(stages, m, loss_fn=lambda out, target: out.sum())
            except ValueError as e:  # (DualPipeV needs m >= 2 * world)
                got.setdefault(schedule, {})[m] = str(e)
                continue
            got.setdefault(schedule, {})[m] = {
                r: [[x.computation_type.value, x.stage_index, x.microbatch_index]
                    for a in acts if a is not None for x in (a.sub_actions or [a]) if x.computation_type.value in "FBIW"]
                for r, acts in sched.pipeline_order.items()}
    if rank == 0:
        Path(out).write_text(json.dumps(got))
    dist.destroy_process_group()


def schedule_orders(out_file: str | Path, schedules: list[str], world: int, ms: list[int]) -> dict[str, dict]:
    """The compute actions torch's ``schedules`` (two stages per rank: ``ZB_SCHEDULES``,
    ``interleaved``) order for each rank at each m in ``ms``, built but not run: {schedule: {m:
    {rank: [[kind, stage, mb], ...]}}} (an overlapped pair as its two sub-actions), or {m: the
    error} where torch refuses the m.  ``world`` gloo processes (a schedule is built only inside
    a process group), about 5 s."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_order_worker, args=(world, _free_port(), str(out_file), list(schedules), list(ms)), nprocs=world, join=True)
    raw = json.loads(Path(out_file).read_text())
    return {s: {int(m): ({int(r): o for r, o in v.items()} if isinstance(v, dict) else v) for m, v in by_m.items()} for s, by_m in raw.items()}


def record_pipeline(out_dir: str | Path, schedule: str = "gpipe", world: int = 2, microbatches: int = 4,
                    steps: int = 2, v: int = 2) -> list[Path]:
    """Record one run; the trace paths in rank order."""
    import torch.multiprocessing as mp

    if schedule not in SCHEDULES + ZB_SCHEDULES:
        raise ValueError(f"schedule {schedule!r} not in {SCHEDULES + ZB_SCHEDULES}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world, _free_port(), str(out), schedule, microbatches, steps, v), nprocs=world, join=True)
    return [out / f"rank-{r}.json" for r in range(world)]


if __name__ == "__main__":  # python tests/pipe_recorder.py OUT SCHEDULE WORLD M
    import sys

    print(record_pipeline(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
