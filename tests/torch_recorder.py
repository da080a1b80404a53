"""Record real PyTorch profiler traces on the CPU for the tests.

``record_ddp(out_dir)`` runs two processes that train a small MLP with DistributedDataParallel
over gloo, reading batches from a DataLoader with one worker process, under
``torch.profiler.profile(record_shapes=True)``; each rank writes ``rank-<r>.json``.
``slow_rank``/``sleep_s``: that rank sleeps ``sleep_s`` (inside a ``slow`` annotation) before its
backward pass each step, so it arrives last at DDP's gradient all-reduce and the others wait for it.
``width``/``batch``: the MLP's hidden width and the batch size (a longer step: more work per step).
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
            width: int = 128, batch: int = 32) -> None:
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
    dist.destroy_process_group()


def record_ddp(out_dir: str | Path, world: int = 2, steps: int = 3, slow_rank: int = -1, sleep_s: float = 0.0,
               width: int = 128, batch: int = 32) -> list[Path]:
    import torch.multiprocessing as mp

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world, _free_port(), str(out), steps, slow_rank, sleep_s, width, batch), nprocs=world, join=True)
    return [out / f"rank-{r}.json" for r in range(world)]


if __name__ == "__main__":
    print(record_ddp(sys.argv[1]))
