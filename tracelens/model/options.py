"""What the user asked of an analysis: steps, ranges, the GPU, FLOPs (the CLI's options and
a tracelens.toml).  In the model layer, with no polars: the command line checks them and the
report cache (``tracelens.store.reports``) keys on them before any analysis is imported."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    steps: tuple[int, int] | None = None  # keep steps whose number is in [a, b] ("3:7")
    step_range: str | None = None  # regex naming user ranges to use as steps
    data_range: str | None = None  # regex naming user ranges that load data
    include_warmup: bool = False
    gpu: str | None = None  # --gpu NAME: use this GPU's peaks
    peak_tflops: float | None = None  # --peak-tflops X: the reference dense peak
    model_flops_per_step: float | None = None  # --model-flops-per-step F
    params: float | None = None  # --params N (non-embedding parameters)
    tokens_per_step: float | None = None  # --tokens-per-step T (tokens this GPU processes per step)
    seq_len: int | None = None  # --seq-len, --layers, --hidden: add PaLM's attention term 12·L·h·S per token
    layers: int | None = None
    hidden: int | None = None
    critical_path: bool = False  # --critical-path: each step's critical path (tracelens.analysis.rank.critical; costs ~+100% of a rank's analysis) and the suggestions' what-if replays (rank.replay)
    nccl: tuple[str, ...] = ()  # --nccl PATH ...: NCCL records joined to the job's report (tracelens.analysis.nccl_merge)
    prefer: str | None = None  # --prefer kineto|nsys: the source of a rank recorded by both (tracelens.store.job.load)
    # where each option given came from: ("gpu", "--gpu") or ("gpu", "runs/job42/tracelens.toml")
    given: tuple[tuple[str, str], ...] = ()


def parse_steps(text: str) -> tuple[int, int]:
    """'3:7' -> (3, 7); '5' -> (5, 5); ':7' and '3:' are open-ended."""
    m = re.fullmatch(r"\s*(\d*)\s*(?::\s*(\d*))?\s*", text)
    if not m or (not m.group(1) and not m.group(2) and ":" not in text):
        raise ValueError(f"bad step selection {text!r} (use N, A:B, :B or A:)")
    a = int(m.group(1)) if m.group(1) else 0
    if ":" in text:
        b = int(m.group(2)) if m.group(2) else 2**62
    else:
        b = a
    if a > b:
        raise ValueError(f"bad step selection {text!r}: the first step {a} is after the last {b}")
    return a, b
