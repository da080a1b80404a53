"""Suggestions: a rule table over the Analysis (the waterfall and a few measured facts).

Each rule has a trigger (a threshold on a measured number), its evidence (the numbers), the
fix in the user's terms, the ranks it applies to and an estimated speed-up.  The estimate is
the first-order upper bound of removing the bar's time: 1 / (1 - bar).  Rules cover the
TensorBoard plugin's advice (DataLoader, GPU utilization, memcpy, Tensor Cores, small kernels,
synchronization), Nsight Systems' expert rules (GPU starvation, pageable memcpy, synchronous
memcpy, low utilization), XProf's input-bound bands and PyTorch's performance anti-patterns,
plus rules only a waterfall allows (exposed communication per group, non-matmul share,
matmul below peak, precision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Suggestion:
    id: str
    title: str
    detail: str  # the fix, in the user's terms
    evidence: dict[str, Any]
    ranks: tuple[int, ...]
    est_speedup: float | None  # upper bound, e.g. 1.25 = up to 25% faster

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        return d


def _bar(rank, key: str) -> float:
    if not rank.waterfall:
        return 0.0
    for b in rank.waterfall.bars:
        if b.key == key:
            return b.fraction
    return 0.0


def _idle(rank, key: str) -> float:
    if rank.idle is None or not rank.gpu or not rank.gpu.window:
        return 0.0
    return getattr(rank.idle, key) / rank.gpu.window


def _gpu(rank, key: str) -> float:
    if not rank.gpu or not rank.gpu.window:
        return 0.0
    return getattr(rank.gpu, key) / rank.gpu.window


def _speedup(fraction: float) -> float | None:
    return round(1.0 / (1.0 - fraction), 3) if 0 < fraction < 1 else None


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    fix: str
    measure: Callable[[Any], float | None]  # per rank: the number the trigger looks at
    threshold: float
    what: str  # what the number is, for the evidence
    removable: bool = True  # the number is a share of time that the fix could remove
    focus: tuple[str, str] | None = None  # ("idle"|"gpu"|"bar", key): the per-step number that picks the step to show
    show: tuple[str, ...] = ()  # kernel classes (or "idle") the evidence is about, for the timeline
    unit: str = "share"  # "share": the number is a fraction (of the step, of the FLOPs); "count": a plain number


def _fp32_share(rank) -> float | None:
    f = rank.facts
    if not f.get("has_tensor_cores"):
        return None
    return f.get("fp32_matmul_flops_share")


def _tiny_kernels(rank) -> float | None:
    f = rank.facts
    return (f["kernels_under_10us"] / f["kernels"]) if f.get("kernels") else None


def _fact_share(key: str) -> Callable[[Any], float | None]:
    """A measured time (a fact, in ns) as a share of the rank's window."""
    return lambda r: r.facts.get(key, 0) / r.gpu.window if r.gpu and r.gpu.window else None


def _item_calls(rank) -> float | None:
    f = rank.facts
    return f.get("item_calls", 0) / max(f.get("steps", 1), 1) if f else None


RULES: tuple[Rule, ...] = (
    Rule("input_bound_high", "Highly input-bound: the GPU waits for the DataLoader",
         "Load data in parallel and ahead of time: DataLoader(num_workers=8, pin_memory=True, persistent_workers=True, "
         "prefetch_factor=4); move decoding/augmentation off the training process (DALI, pre-processed shards).",
         lambda r: _idle(r, "data_loading"), 0.20, "GPU idle waiting for data, share of the step",
         focus=("idle", "data_loading"), show=("idle",)),
    Rule("input_bound_moderate", "Moderately input-bound: the GPU waits for the DataLoader",
         "Raise DataLoader num_workers and prefetch_factor, set pin_memory=True; check the data pipeline with a profiler of its own.",
         lambda r: v if (v := _idle(r, "data_loading")) < 0.20 else 0.0, 0.05, "GPU idle waiting for data, share of the step",
         focus=("idle", "data_loading"), show=("idle",)),
    Rule("host_launch_bound", "The GPU starves: the host launches kernels too slowly",
         "Cut per-kernel host cost: torch.compile(model) (fewer, fused kernels), CUDA graphs (torch.compile(mode='reduce-overhead')), "
         "a larger micro-batch, fused/foreach optimizers.",
         lambda r: _idle(r, "host_launch"), 0.10, "GPU idle while the host was busy launching, share of the step",
         focus=("idle", "host_launch"), show=("idle",)),
    Rule("sync_drain", "Host synchronizations drain the GPU queue",
         "Remove .item(), .cpu(), .tolist(), print(tensor), torch.cuda.synchronize() and data-dependent shapes (nonzero, "
         "boolean masks) from the step; log metrics every N steps or asynchronously.",
         lambda r: _idle(r, "sync"), 0.02, "GPU idle after a blocking synchronize, share of the step",
         focus=("idle", "sync"), show=("idle",)),
    Rule("launch_latency", "Kernels wait on launch latency and stream dependencies",
         "Capture the step with CUDA graphs; reduce cross-stream waits (cudaStreamWaitEvent) and tiny dependent kernels.",
         lambda r: _idle(r, "launch_latency"), 0.10, "GPU idle with the next kernel already queued, share of the step",
         focus=("idle", "launch_latency"), show=("idle",)),
    Rule("low_gpu_utilization", "Low GPU utilization: the GPU is idle much of the step",
         "Find where the host spends the step (the idle bars say which part: data, launch, sync); overlap host work with GPU work.",
         lambda r: _gpu(r, "idle"), 0.40, "GPU idle share of the step", removable=False,
         focus=("gpu", "idle"), show=("idle",)),  # the idle bars carry the estimates
    Rule("exposed_communication", "Communication is exposed (not overlapped with compute)",
         "Overlap communication with compute: DDP(bucket_cap_mb=25..100, gradient_as_bucket_view=True), FSDP "
         "forward/backward prefetch, async tensor parallel; check the slowest collectives and their bandwidth.",
         lambda r: _gpu(r, "exposed_comm"), 0.05, "exposed communication, share of the step",
         focus=("gpu", "exposed_comm"), show=("comm",)),
    Rule("exposed_memcpy", "Memory copies are exposed",
         "Use pinned host memory and non_blocking=True for host-to-device copies; avoid device-to-host copies inside the step.",
         lambda r: _gpu(r, "exposed_memcpy"), 0.03, "exposed memcpy/memset, share of the step",
         focus=("gpu", "exposed_memcpy"), show=("memcpy", "memset")),
    Rule("pageable_memcpy", "Copies from pageable (unpinned) host memory",
         "Pin the source tensors: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True).",
         _fact_share("pageable_memcpy_ns"), 0.01, "time in pageable memcpy, share of the step",
         focus=("gpu", "memcpy"), show=("memcpy",)),
    Rule("fp32_matmul", "FP32 matmuls on a GPU with tensor cores",
         "Train in mixed precision: with torch.autocast('cuda', dtype=torch.bfloat16): ... (float16 with a GradScaler on "
         "GPUs without BF16, such as V100); or at least allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True).",
         _fp32_share, 0.5, "share of matmul FLOPs in FP32", removable=False,
         focus=None, show=("gemm", "conv", "attention")),
    Rule("non_matmul_heavy", "Non-matmul kernels take a large share of the step",
         "Fuse elementwise, normalization and softmax kernels: torch.compile(model), fused norm/RoPE/cross-entropy kernels.",
         lambda r: _bar(r, "non_matmul"), 0.30, "non-matmul kernels, share of the step",
         focus=("bar", "non_matmul"), show=("norm", "elementwise", "softmax_reduce", "optimizer", "cast_quant", "copy", "moe_routing", "other")),
    Rule("optimizer_kernels", "The optimizer step runs many separate kernels",
         "Use a fused or foreach optimizer: torch.optim.AdamW(params, fused=True) (or foreach=True).",
         _fact_share("optimizer_kernel_ns"), 0.05, "optimizer kernels, share of the step",
         focus=None, show=("optimizer",)),
    Rule("matmul_below_peak", "Matmuls run well below the GPU's peak",
         "Make GEMM shapes multiples of 64/128 (pad vocab, hidden and batch*seq), use larger micro-batches, FlashAttention, "
         "FP8 where the model allows; check per-kernel TFLOP/s for the worst shapes.",
         lambda r: _bar(r, "matmul_below_peak"), 0.20, "matmul time beyond its FLOPs at peak, share of the step",
         focus=("bar", "matmul_below_peak"), show=("gemm", "conv", "attention")),
    Rule("many_tiny_kernels", "Many tiny kernels (under 10 µs)",
         "Fuse them with torch.compile or replay the step with CUDA graphs; batch small operations (foreach ops).",
         _tiny_kernels, 0.6, "share of kernels shorter than 10 µs", removable=False,
         focus=None, show=()),
    Rule("item_in_step", "Scalar reads from the GPU in every step (.item())",
         "Each .item() waits for the GPU to finish: keep losses and metrics on the GPU and read them every N steps.",
         _item_calls, 3.0, ".item() / _local_scalar_dense calls per step", removable=False, unit="count",
         focus=("idle", "sync"), show=("idle",)),
    Rule("recompute_heavy", "Activation recomputation costs a large share of the step",
         "Checkpoint selectively (only attention or only every other layer: torch.utils.checkpoint on chosen blocks, "
         "or a selective activation-checkpointing policy) when memory allows; offload activations instead.",
         lambda r: _bar(r, "recompute"), 0.10, "recomputed forward ops, share of the step",
         focus=("bar", "recompute"), show=()),
    Rule("pipeline_bubble", "Pipeline bubbles: stages wait for each other",
         "Raise the number of micro-batches m, use interleaved 1F1B (virtual stages) or a zero-bubble schedule; rebalance stages.",
         lambda r: _idle(r, "pipeline_bubble"), 0.05, "GPU idle before pipeline send/recv, share of the step",
         focus=("idle", "pipeline_bubble"), show=("idle", "comm")),
)


def _step_value(step, focus: tuple[str, str] | None) -> float:
    """The rule's number in one step (a share of the step's window)."""
    if focus is None:
        return 0.0
    src, key = focus  # a Step has the idle / gpu / waterfall a rank has: the same readers serve
    return {"idle": _idle, "gpu": _gpu, "bar": _bar}[src](step, key)


def where(rule_focus: tuple[str, str] | None, show: tuple[str, ...], rank) -> dict[str, Any]:
    """Where to look: the step of ``rank`` in which the rule's number is largest (the longest
    kept step when the rule has no per-step number), and what to highlight there."""
    steps = getattr(rank, "steps", ())
    kept = [s for s in steps if not s.warmup] or list(steps)
    if not kept:
        return {"rank": rank.rank, "step": None, "start_ns": None, "end_ns": None, "show": list(show)}
    best = max(kept, key=lambda s: (_step_value(s, rule_focus), s.dur_ns))
    return {"rank": rank.rank, "step": best.step, "step_name": best.name, "start_ns": best.start_ns, "end_ns": best.end_ns,
            "value": round(_step_value(best, rule_focus), 4) if rule_focus else None, "show": list(show)}


def suggest(analysis) -> list[Suggestion]:
    out: list[Suggestion] = []
    ranks = [r for r in analysis.ranks if r.gpu is not None]
    for rule in RULES:
        hits = []
        for r in ranks:
            v = rule.measure(r)
            if v is not None and v >= rule.threshold:
                hits.append((r.rank, v))
        if not hits:
            continue
        worst_rank, worst = max(hits, key=lambda h: (h[1], -h[0]))
        mean = sum(v for _, v in hits) / len(hits)
        at = where(rule.focus, rule.show, next(r for r in ranks if r.rank == worst_rank))
        out.append(
            Suggestion(
                id=rule.id,
                title=rule.title,
                detail=rule.fix,
                evidence={"measure": rule.what, "unit": rule.unit, "worst": round(worst, 4), "mean": round(mean, 4), "threshold": rule.threshold,
                          "per_rank": {str(rk): round(v, 4) for rk, v in hits}, "where": at},
                ranks=tuple(rk for rk, _ in hits),
                est_speedup=_speedup(mean) if rule.removable else None,
            )
        )
    by_rank = {r.rank: r for r in ranks}
    for st in analysis.stragglers:
        out.append(
            Suggestion(
                id="straggler", title=f"Rank {st.rank} is a straggler", detail=(
                    f"Look at rank {st.rank}'s host and data loading, its GPU clocks and thermals, and its network path; "
                    "the others wait for it at every collective."),
                evidence={"excess_ns": st.excess_ns, "last_in": st.last_in, "of": st.of, "p_value": st.p_value, "detail": st.evidence,
                          "where": where(None, ("comm",), by_rank[st.rank]) if st.rank in by_rank else None},
                ranks=(st.rank,), est_speedup=None,
            )
        )
    return sorted(out, key=lambda s: -(s.est_speedup or 1.0))
