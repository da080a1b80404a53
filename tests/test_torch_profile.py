"""tracelens.torch: recording a trace from PyTorch, for real on the CPU (torch's profiler, no
mocks of it): the files it writes, the schedule, distributedInfo, the one-line summary, and a
summary that fails without stopping the job."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import socket
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

import tracelens.torch as tt
from tracelens.analysis.rank import flops as fl
from tracelens.store.job import load

# a 64 -> 128 -> 10 MLP on a batch of 32.  FLOPs one training step counts from the shapes:
# forward addmm 2*32*64*128 + 2*32*128*10; backward: grad input of layer 2 (2*32*10*128), grad
# weights of both layers (2*10*32*128, 2*128*32*64); no grad input for layer 1 (x needs none)
FWD_ADDMM = {2 * 32 * 64 * 128, 2 * 32 * 128 * 10}
STEP_FLOPS = 2 * 32 * 64 * 128 + 2 * 32 * 128 * 10 + 2 * 32 * 10 * 128 + 2 * 10 * 32 * 128 + 2 * 128 * 32 * 64
CPU_LINE = re.compile(r"tracelens: rank (\d+) cycle (\d+): MFU unknown: no GPU events \(a CPU-only trace\)  -> (\S+)")


def _train(prof, steps: int, wrap=lambda m: m) -> None:
    """``steps`` training steps of the MLP, each ended by ``prof.step()``."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()


def _step_names(events: pl.DataFrame, rank: int | None = None) -> list[str]:
    ev = events if rank is None else events.filter(pl.col("rank") == rank)
    names = ev.filter(pl.col("kind") == "step").get_column("name").cast(pl.String).to_list()
    return sorted(names, key=lambda n: int(n.split("#")[1]))


def _counted_flops(events: pl.DataFrame) -> pl.DataFrame:
    """(name, flops) of every op tracelens counts FLOPs for, from the recorded shapes."""
    return (
        events.with_row_index("_row").join(fl.count(events), on="_row")
        .select(pl.col("name").cast(pl.String), pl.col("flops_right").alias("flops"))
    )


def _files(folder: Path) -> list[str]:
    """Every file under folder (hidden ones too: no temporary file may be left behind)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one process, no torch.distributed --------------------------------------------------------


def test_single_process_file_schedule_shapes_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "out"
    with tt.profile(out, steps=3, wait=2, warmup=1) as prof:
        assert isinstance(prof, torch.profiler.profile)  # the user's own profiler object, for prof.step()
        assert prof.record_shapes and not prof.with_stack
        assert prof.activities == {torch.profiler.ProfilerActivity.CPU}  # no GPU here: CPU only
        _train(prof, 8)  # 2 waited, 1 warm-up, 3 recorded, then 2 after the single cycle
    assert _files(out) == ["rank-0.json.gz"]
    path = out / "rank-0.json.gz"
    assert path.read_bytes()[:2] == b"\x1f\x8b" and b'"traceEvents"' in gzip.decompress(path.read_bytes())

    trace = load([out], use_cache=False)
    (meta,) = trace.metas
    assert (meta.rank, meta.rank_source, meta.world_size) == (0, "filename", None)  # no distributedInfo without a group
    # steps 0-1 waited, step 2 warmed up (not recorded), steps 3-5 recorded, 6-7 after the cycle
    assert _step_names(trace.events().collect()) == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    counted = _counted_flops(trace.events().collect())
    assert set(counted.filter(pl.col("name") == "aten::addmm").get_column("flops").to_list()) == FWD_ADDMM
    assert counted.get_column("flops").sum() == 3 * STEP_FLOPS

    cap = capsys.readouterr()
    assert cap.err == ""
    lines = cap.out.splitlines()
    assert len(lines) == 1
    m = CPU_LINE.fullmatch(lines[0])
    assert m and m.groups() == ("0", "1", str(path)), lines[0]
    assert lines[0] == tt.summarize(path, rank=0, cycle=1)


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events at the end of each cycle")  # one file per cycle is the point
def test_rank_from_env_and_repeated_cycles(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    out = tmp_path / "out"
    with tt.profile(out, steps=2, wait=1, warmup=1, repeat=2) as prof:
        _train(prof, 9)  # two cycles of 4 steps, then one more
    assert _files(out) == ["cycle-1/rank-3.json.gz", "cycle-2/rank-3.json.gz"]  # each folder one job
    cycles = {}
    for k in (1, 2):
        trace = load([out / f"cycle-{k}"], use_cache=False)
        assert trace.ranks == [3] and trace.metas[0].rank_source == "filename"
        cycles[k] = _step_names(trace.events().collect())
    assert cycles == {1: ["ProfilerStep#2", "ProfilerStep#3"], 2: ["ProfilerStep#6", "ProfilerStep#7"]}
    cap = capsys.readouterr()
    assert cap.err == ""
    got = [CPU_LINE.fullmatch(line).groups() for line in cap.out.splitlines()]
    assert got == [("3", "1", str(out / "cycle-1" / "rank-3.json.gz")), ("3", "2", str(out / "cycle-2" / "rank-3.json.gz"))]


def test_analysis_failure_still_writes_the_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)

    def broken(*a, **k):
        raise RuntimeError("analysis broke\non two lines")

    monkeypatch.setattr("tracelens.analysis.analyze", broken)
    out = tmp_path / "out"
    with tt.profile(out, steps=2) as prof:
        _train(prof, 4)  # the job goes on past the failed summary
        torch.ones(1).add_(1)
    path = out / "rank-0.json.gz"
    assert _files(out) == ["rank-0.json.gz"]
    assert _step_names(load([path], use_cache=False).events().collect()) == ["ProfilerStep#2", "ProfilerStep#3"]
    cap = capsys.readouterr()
    assert cap.out == ""
    (line,) = cap.err.splitlines()
    assert line.startswith("tracelens: warning: rank 0 cycle 1: no summary (RuntimeError: analysis broke on two lines)")
    assert line.endswith(str(path))


def test_distributed_info_added_when_the_group_starts_after_recording(tmp_path, capsys):
    """torch writes distributedInfo only when the group is up as recording starts; a group
    initialised later still ends up in the file, so the loader takes the rank from it."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    out = tmp_path / "out"
    try:
        with tt.profile(out, steps=2, wait=0, warmup=1) as prof:
            _train(prof, 2)  # warm-up step, then the first recorded step has begun
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
            _train(prof, 1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    trace = load([out], use_cache=False)
    (meta,) = trace.metas
    assert (meta.rank, meta.rank_source, meta.world_size, meta.backend) == (0, "distributedInfo", 1, "gloo")
    assert _step_names(trace.events().collect()) == ["ProfilerStep#1", "ProfilerStep#2"]
    (line,) = capsys.readouterr().out.splitlines()
    assert CPU_LINE.fullmatch(line).groups() == ("0", "1", str(out / "rank-0.json.gz"))


def test_own_profiler_with_the_handler(tmp_path, capsys):
    """trace_handler on a torch.profiler.profile the user built; rank= fixes the file name and
    summary=False prints nothing."""
    out = tmp_path / "out"
    handler = tt.trace_handler(out, rank=5, summary=False)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=1), on_trace_ready=handler,
    ) as prof:
        _train(prof, 2)
    assert _files(out) == ["rank-5.json.gz"]
    assert _step_names(load([out], use_cache=False).events().collect()) == ["ProfilerStep#1"]
    assert capsys.readouterr() == ("", "")


def test_summary_with_known_mfu():
    """The line on a real H100 trace: MFU, GPU, FLOP source and the three biggest bars."""
    from tracelens.analysis import Options, analyze

    path = Path(__file__).resolve().parents[1] / "sample_traces" / "h100_bert_small" / "rank-0.json.gz"
    line = tt.summarize(path, cycle=1)
    d = analyze(load([path], use_cache=False), Options()).to_dict()
    top = sorted((b for b in d["job"]["waterfall"] if b["key"] != "mfu"), key=lambda b: -b["fraction"])[:3]
    losses = ", ".join(f"{b['label']} {100 * b['fraction']:.1f}%" for b in top)
    mfu = d["job"]["mfu"]
    assert 0 < mfu < 1
    assert line == (f"tracelens: rank 0 cycle 1: MFU {100 * mfu:.2f}% of NVIDIA H100 SXM (model FLOPs from shapes); "
                    f"biggest losses: {losses}  -> {path}")
    assert top[0]["label"] == "idle: host launch overhead"
    # the analysis options reach the analysis: the user's FLOPs per step
    given = tt.summarize(path, model_flops_per_step=1e12)
    assert "(model FLOPs from user)" in given and f"MFU {100 * mfu:.2f}%" not in given


def test_bad_arguments_fail_at_once(tmp_path):
    with pytest.raises(TypeError, match="gpux"):
        tt.trace_handler(tmp_path, gpux="H100")
    with pytest.raises(TypeError, match=r"unknown analysis option\(s\) steps;"):  # the step filter is not one here
        tt.trace_handler(tmp_path, steps=(1, 2))
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        tt.profile(tmp_path, steps=0)
    with pytest.raises(ValueError, match="repeat"):
        tt.profile(tmp_path, repeat=-1)
    assert not any(tmp_path.iterdir())


def test_without_torch_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ImportError, match=re.escape("pip install 'tracelens-mfu[torch]'")):
        tt.profile(tmp_path)
    with pytest.raises(ImportError, match=re.escape("pip install 'tracelens-mfu[torch]'")):
        tt.trace_handler(tmp_path)


def test_the_cli_does_not_import_it():
    import subprocess

    code = "import sys, tracelens.cli; assert 'tracelens.torch' not in sys.modules and 'torch' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr


# --- two ranks, gloo DDP, spawned processes ---------------------------------------------------


def _worker(rank: int, world: int, port: int, out_dir: str, log_dir: str, steps: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    with open(Path(log_dir) / f"stdout-{rank}.txt", "w") as so, open(Path(log_dir) / f"stderr-{rank}.txt", "w") as se:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            dist.init_process_group("gloo", rank=rank, world_size=world)
            with tt.profile(out_dir, steps=steps) as prof:
                _train(prof, 1 + 1 + steps, wrap=DDP)
            dist.barrier()
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    import torch.multiprocessing as mp

    out, logs = tmp_path_factory.mktemp("ddp_out"), tmp_path_factory.mktemp("ddp_logs")
    mp.spawn(_worker, args=(2, _free_port(), str(out), str(logs), 3), nprocs=2, join=True)
    return out, logs


@pytest.mark.slow
def test_two_ranks_record_one_job(ddp_job):
    out, _ = ddp_job
    assert _files(out) == ["rank-0.json.gz", "rank-1.json.gz"]
    trace = load([out], use_cache=False)
    assert trace.ranks == [0, 1]
    assert [(m.rank, m.rank_source, m.world_size, m.backend) for m in trace.metas] == [
        (0, "distributedInfo", 2, "gloo"),
        (1, "distributedInfo", 2, "gloo"),
    ]
    assert not [w for w in trace.all_warnings if "rank " in w or "claimed" in w]  # no rank from a file name, none claimed twice
    for rank in (0, 1):  # torch wrote it (the group was up as recording started); the handler added no second one
        assert gzip.decompress((out / f"rank-{rank}.json.gz").read_bytes()).count(b'"distributedInfo"') == 1
    for rank in (0, 1):
        mine = trace.events().collect().filter(pl.col("rank") == rank)
        assert _step_names(mine) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]  # wait 1, warm-up 1, 3 active
        counted = _counted_flops(mine)
        assert set(counted.filter(pl.col("name") == "aten::addmm").get_column("flops").to_list()) == FWD_ADDMM
        assert counted.get_column("flops").sum() == 3 * STEP_FLOPS
        # DDP's gradient all-reduce, one per recorded step
        ar = mine.filter((pl.col("kind") == "collective") & (pl.col("collective") == "allreduce"))
        assert ar.height == 3


@pytest.mark.slow
def test_two_ranks_print_one_line_each(ddp_job):
    out, logs = ddp_job
    for rank in (0, 1):
        assert (logs / f"stderr-{rank}.txt").read_text() == ""
        lines = (logs / f"stdout-{rank}.txt").read_text().splitlines()
        assert len(lines) == 1
        assert CPU_LINE.fullmatch(lines[0]).groups() == (str(rank), "1", str(out / f"rank-{rank}.json.gz"))
