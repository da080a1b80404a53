"""Record real PyTorch profiler traces on the CPU for the tests.

``record_ddp(out_dir)`` runs two processes that train a small MLP with DistributedDataParallel
over gloo, reading batches from a DataLoader with one worker process, under
``torch.profiler.profile(record_shapes=True)``; each rank writes ``rank-<r>.json``.
``slow_rank``/``sleep_s``: that rank sleeps ``sleep_s`` (inside a ``slow`` annotation) before its
backward pass each step, so it arrives last at DDP's gradient all-reduce and the others wait for it.
``width``/``batch``: the MLP's hidden width and the batch size (a longer step: more work per step).
``fr_dir``: PyTorch's Flight Recorder runs alongside (``TORCH_FR_BUFFER_SIZE``, as users enable it) and
each rank dumps it as JSON (``_dump_fr_trace_json``) into ``fr_dir/rank_<r>`` after the last step: the
same collectives in both records (the profiler's ``Seq`` is the recorder's ``collective_seq_id``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str, steps: int, slow_rank: int = -1, sleep_s: float = 0.0,
            width: int = 128, batch: int = 32, fr_dir: str | None = None) -> None:
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(batch * (steps + 2), 64), torch.randint(0, 10, (batch * (steps + 2),)))
    loader = DataLoader(data, batch_size=batch, num_workers=1)
    it = iter(loader)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=steps)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, schedule=sched,
        on_trace_ready=lambda p: p.export_chrome_trace(str(Path(out_dir) / f"rank-{rank}.json")),
    ) as prof:
        for _ in range(steps + 1):
            x, y = next(it)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            if rank == slow_rank:
                with torch.profiler.record_function("slow"):
                    time.sleep(sleep_s)
            loss.backward()
            opt.step()
            prof.step()
    dist.barrier()
    if fr_dir:
        _dump_fr(dist, rank, fr_dir)
    dist.destroy_process_group()


def _dump_fr(dist, rank: int, fr_dir: str) -> None:
    """This rank's Flight Recorder as JSON, once the watchdog has marked every group's last
    enqueued collective completed (it looks about once a second; gloo leaves the entries'
    state "scheduled" and says it in ``pg_status``), 15 s at most."""
    import time

    import orjson
    import torch

    c10d = torch._C._distributed_c10d
    deadline = time.monotonic() + 15.0
    while True:
        blob = c10d._dump_fr_trace_json(True, False)
        status = orjson.loads(blob).get("pg_status") or {}
        if time.monotonic() > deadline or all(str(st.get("last_completed_collective")) == str(st.get("last_enqueued_collective"))
                                              for st in status.values() if isinstance(st, dict)):
            break
        time.sleep(0.2)
    Path(fr_dir).mkdir(parents=True, exist_ok=True)
    (Path(fr_dir) / f"rank_{rank}").write_bytes(blob.encode() if isinstance(blob, str) else blob)


def record_ddp(out_dir: str | Path, world: int = 2, steps: int = 3, slow_rank: int = -1, sleep_s: float = 0.0,
               width: int = 128, batch: int = 32, fr_dir: str | Path | None = None) -> list[Path]:
    import torch.multiprocessing as mp

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if fr_dir:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"  # the spawned ranks inherit it
    mp.spawn(_worker, args=(world, _free_port(), str(out), steps, slow_rank, sleep_s, width, batch,
                            str(fr_dir) if fr_dir else None), nprocs=world, join=True)
    return [out / f"rank-{r}.json" for r in range(world)]


if __name__ == "__main__":
    print(record_ddp(sys.argv[1]))
