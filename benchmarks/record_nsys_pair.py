"""Record one CPU training run as a Kineto trace and an nsys export at the same time.

A tiny MLP trains for a few steps on the CPU, reading its batches from a DataLoader whose
dataset sleeps a known time per batch.  Each profiled step is an NVTX range ``ProfilerStep#N``
(the name and number the PyTorch profiler gives the same step) and its ``next(loader)`` an NVTX
range ``data``, while ``torch.profiler`` (a schedule, ``prof.step()``) records the same steps.
Run under nsys, the one process writes both files of the pair:

    nsys profile -t nvtx,osrt --sample=none --cpuctxsw=none --osrt-threshold=100000 \\
        -o OUT/rank-0 python benchmarks/record_nsys_pair.py --train OUT
    nsys export --type sqlite -o OUT/rank-0.sqlite OUT/rank-0.nsys-rep

``python benchmarks/record_nsys_pair.py OUT`` does both (it needs the nsys CLI: $NSYS, else
``nsys`` on PATH, else Debian's ``nsight-systems-target`` path).  The NVTX ranges come from a
ten-line C shim over the NVTX v3 headers that nsys ships (``<nsys>/../nvtx/include``), built
with ``cc`` into OUT and called through ctypes: with nsys 2022.4 the ``nvtx`` PyPI package
(0.2.16, 0.2.17) records only its domain-create rows, no ranges.  ``--nvtx py`` uses the
package anyway (for a newer nsys).

The committed pair and how it was recorded: ``sample_traces/nsys_pair/README.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

STEPS = 4  # profiled steps, ProfilerStep#1..#4 (#0 is the profiler's warm-up: no NVTX ranges either)
WARMUP = 1
BATCH = 16
SLEEP_S = 0.005  # the dataset's sleep per batch: SLEEP_S / BATCH per item, on the main thread (num_workers=0)
NSYS_PROFILE = ["-t", "nvtx,osrt", "--sample=none", "--cpuctxsw=none", "--osrt-threshold=100000",
                "--force-overwrite=true"]
_SHIM = """#include <nvtx3/nvToolsExt.h>
int tl_push(const char *s) { return nvtxRangePushA(s); }
int tl_pop(void) { return nvtxRangePop(); }
void tl_init(void) { nvtxInitialize(0); nvtxMarkA("nvtx ready"); }
"""


def nsys_binary() -> str | None:
    """The nsys CLI: $NSYS, else on PATH, else where Debian's nsight-systems-target puts it."""
    for c in (os.environ.get("NSYS"), shutil.which("nsys"),
              "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def build_shim(nsys: str, out_dir: Path) -> Path:
    """The C shim (push/pop over the NVTX v3 headers nsys ships), built into ``out_dir``."""
    include = Path(nsys).resolve().parent / "nvtx" / "include"
    src, lib = out_dir / "tl_nvtx.c", out_dir / "libtl_nvtx.so"
    src.write_text(_SHIM)
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", f"-I{include}", str(src), "-o", str(lib), "-ldl"],
                   check=True)
    src.unlink()
    return lib


def _nvtx(shim: str | None):
    """(push, pop) of NVTX ranges: the C shim's, else the nvtx package's."""
    if shim:
        lib = ctypes.CDLL(shim)
        lib.tl_push.argtypes = [ctypes.c_char_p]
        lib.tl_init()  # load nsys' NVTX injection and meet this thread now, not in the first step's range
        return (lambda s: lib.tl_push(s.encode())), lib.tl_pop
    import nvtx

    nvtx.mark("nvtx init")  # the same for the package
    return nvtx.push_range, nvtx.pop_range


def train(out_dir: Path, shim: str | None) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    push, pop = _nvtx(shim)

    class Slow(Dataset):
        """Random samples that take SLEEP_S / BATCH each to load."""

        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, 64, generator=g)
            self.y = torch.randint(0, 10, (n,), generator=g)

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i: int):
            time.sleep(SLEEP_S / BATCH)
            return self.x[i], self.y[i]

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(DataLoader(Slow(BATCH * (STEPS + WARMUP + 1)), batch_size=BATCH, num_workers=0))
    json_path = out_dir / "rank-0.json"
    sched = torch.profiler.schedule(wait=0, warmup=WARMUP, active=STEPS, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(json_path))) as prof:
        for n in range(WARMUP + STEPS):
            # the profiler's ProfilerStep#n runs from the prof.step() before to the one after: the
            # NVTX range is pushed just after the first and popped just before the second
            nvtx_on = n >= WARMUP
            if nvtx_on:
                push(f"ProfilerStep#{n}")
                push("data")
            x, y = next(it)
            if nvtx_on:
                pop()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if nvtx_on:
                pop()
            prof.step()
    with open(json_path, "rb") as f, gzip.GzipFile(str(json_path) + ".gz", "wb", compresslevel=9, mtime=0) as g:
        shutil.copyfileobj(f, g)
    json_path.unlink()


def scrub(sqlite: Path, kineto: Path, prefixes: dict[str, str]) -> None:
    """Take this machine out of the pair: nsys stores every process's command line and environment
    block (of the whole machine, not only the profiled one) and absolute paths; Kineto its output
    path.  Environment blocks are emptied, the other processes' rows dropped, each path prefix in
    ``prefixes`` replaced by its placeholder (in SQL: no row loop), then VACUUM, so that no freed
    page keeps the old text.  Timestamps, ranges and OS calls are left as recorded."""
    con = sqlite3.connect(sqlite)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        pids = "SELECT DISTINCT (globalTid >> 24) & 16777215 FROM NVTX_EVENTS"  # the profiled process
        if "PROCESSES" in tables:
            con.execute(f"DELETE FROM PROCESSES WHERE pid NOT IN ({pids})")
        if "ThreadNames" in tables:
            con.execute(f"DELETE FROM ThreadNames WHERE ((globalTid >> 24) & 16777215) NOT IN ({pids})")
        con.execute("UPDATE StringIds SET value = '' WHERE instr(value, char(0)) > 0 AND instr(value, '=') > 0")
        if "TARGET_INFO_SYSTEM_ENV" in tables:
            con.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = '' WHERE name = 'DeviceEnvironment'")
        for table, col in (("StringIds", "value"), ("TARGET_INFO_SYSTEM_ENV", "value"), ("PROCESSES", "name"),
                           ("EXPORT_META_DATA", "value")):
            if table in tables:
                for old, new in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):  # the longest first
                    con.execute(f"UPDATE {table} SET {col} = replace({col}, ?, ?) WHERE instr({col}, ?) > 0", (old, new, old))
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    with gzip.open(kineto, "rb") as f:
        raw = f.read()
    for old, new in prefixes.items():
        raw = raw.replace(old.encode(), new.encode())
    with gzip.GzipFile(kineto, "wb", compresslevel=9, mtime=0) as g:
        g.write(raw)


def record(out_dir: str | Path, nsys: str | None = None, nvtx: str = "c") -> tuple[Path, Path]:
    """Run the training once under nsys: (the Kineto trace .json.gz, the nsys export .sqlite)."""
    nsys = nsys or nsys_binary()
    if nsys is None:
        raise FileNotFoundError("no nsys CLI (set NSYS)")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    shim = build_shim(nsys, out) if nvtx == "c" else None
    rep = out / "rank-0"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--train", str(out)] + (["--shim", str(shim)] if shim else [])
    subprocess.run([nsys, "profile", *NSYS_PROFILE, "-o", str(rep), *cmd], check=True, stdout=subprocess.DEVNULL)
    sqlite = out / "rank-0.sqlite"
    subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(sqlite), f"{rep}.nsys-rep"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # stderr: a progress bar
    Path(f"{rep}.nsys-rep").unlink()
    if shim:
        shim.unlink()
    kineto = out / "rank-0.json.gz"
    nsys_dir = str(Path(nsys).resolve().parent.parent)
    scrub(sqlite, kineto, {f"{out}/": "", str(out): ".", nsys_dir: "<nsys>", sys.prefix: "<python>",
                           sys.base_prefix: "<python>", str(Path(__file__).resolve().parent.parent): "<repo>",
                           str(Path.home()): "~", "/tmp/": "<tmp>/"})
    return kineto, sqlite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the folder to write rank-0.json.gz and rank-0.sqlite into")
    ap.add_argument("--train", action="store_true", help="(under nsys) run the training only")
    ap.add_argument("--shim", help="(with --train) the built C shim")
    ap.add_argument("--nvtx", choices=["c", "py"], default="c", help="NVTX from the C shim (default) or the nvtx package")
    a = ap.parse_args()
    if a.train:
        train(Path(a.out), a.shim)
    else:
        print(*record(a.out, nvtx=a.nvtx), sep="\n")


if __name__ == "__main__":
    main()
