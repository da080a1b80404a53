"""Record real PyTorch Flight Recorder dumps on the CPU (gloo) for the tests.

``record_fr(out_dir, scenario, world)`` runs ``world`` processes with ``TORCH_FR_BUFFER_SIZE`` set,
as users enable the recorder, that run a few collectives on the default group and on a subgroup,
then take the dump the way users take it on demand (``torch._C._distributed_c10d._dump_fr_trace``,
pickle, with stack frames; ``_dump_fr_trace_json`` too with ``json=True``) into
``out_dir/rank_<r>`` (torchtitan's ``comm_traces/rank_<N>`` naming).

Scenarios: ``ok``; ``mismatch`` (the last rank all-gathers where the others all-reduce, at the same
sequence number); ``size`` (the last rank all-reduces 2 elements where the others reduce 4);
``hang`` (the last rank never enters the last all-reduce: the others wait for it with a timeout,
then dump).  The divergent collective is left pending: each rank dumps and exits at once.
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


def _worker(rank: int, world: int, port: int, out_dir: str, scenario: str, as_json: bool) -> None:
    import datetime
    import pickle

    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    sub = dist.new_group(list(range(0, world, 2)) if world > 2 else [0, 1], group_desc="dp_subgroup")
    x = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(x)
    dist.broadcast(x, src=0)
    if rank in dist.get_process_group_ranks(sub):
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16), group=sub)
    dist.barrier()
    last = rank == world - 1
    work = None
    if scenario == "mismatch" and last:
        work = dist.all_gather([torch.zeros(4) for _ in range(world)], x, async_op=True)
    elif scenario == "size" and last:
        work = dist.all_reduce(torch.ones(2), async_op=True)
    elif scenario == "hang" and last:
        pass  # never enters
    else:
        work = dist.all_reduce(x, async_op=True)
    if work is not None and scenario != "ok":
        try:
            work.wait(datetime.timedelta(seconds=2))
        except Exception:  # the watchdog's timeout: the collective never completed
            pass
    elif work is not None:
        import time
        work.wait()
        # the recorder marks a collective completed when its watchdog next looks (about a second,
        # longer on a loaded machine): wait until every group's status says its last enqueued
        # collective completed (our own dump of this process, read with pickle), 15 s at most
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            status = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(False, False, False)).get("pg_status") or {}
            if status and all(str(st.get("last_completed_collective")) == str(st.get("last_enqueued_collective"))
                              for st in status.values() if isinstance(st, dict)):
                break
            time.sleep(0.2)
    elif scenario == "hang":
        import time
        time.sleep(2.5)  # the others are waiting for this rank meanwhile
    c10d = torch._C._distributed_c10d
    blob = c10d._dump_fr_trace_json(True, False) if as_json else c10d._dump_fr_trace(True, True, False)
    path = Path(out_dir) / f"rank_{rank}"
    path.write_bytes(blob.encode() if isinstance(blob, str) else blob)
    del pickle
    if scenario == "ok":
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # a pending collective would block a clean shutdown


def record_fr(out_dir: str | Path, scenario: str = "ok", world: int = 2, *, as_json: bool = False) -> Path:
    import multiprocessing as mp

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_FR_BUFFER_SIZE"] = "200"
    port = _free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, port, str(out), scenario, as_json)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    missing = [r for r in range(world) if not (out / f"rank_{r}").exists()]
    if missing:
        raise RuntimeError(f"flight recorder ranks {missing} wrote no dump")
    return out


if __name__ == "__main__":
    record_fr(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "ok", int(sys.argv[3]) if len(sys.argv) > 3 else 2,
              as_json=len(sys.argv) > 4)
