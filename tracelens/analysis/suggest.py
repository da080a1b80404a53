"""Suggestions: a rule table over the Analysis (the waterfall and a few measured facts).

Each rule has a trigger (a threshold on a measured number), its evidence (the numbers), the
fix in the user's terms, the ranks it applies to and an estimated speed-up.  The estimate is
the first-order upper bound of removing the bar's time: 1 / (1 - bar); with --critical-path
a rule that maps to a change (``WHAT_IF``) also carries ``what_if``, the change replayed on each
step's dependency graph (tracelens.analysis.rank.replay): what it buys given what else the step
waits for.  Rules cover the
TensorBoard plugin's advice (DataLoader, GPU utilization, memcpy, Tensor Cores, small kernels,
synchronization), Nsight Systems' expert rules (GPU starvation, pageable memcpy, synchronous
memcpy, low utilization), XProf's input-bound bands and PyTorch's performance anti-patterns,
plus rules only a waterfall allows (exposed communication per group, non-matmul share,
matmul below peak, precision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from tracelens.analysis.rank.replay import NON_MATMUL_0
from tracelens.model.summary import kept_indices, kept_steps


@dataclass(frozen=True)
class Suggestion:
    id: str
    title: str
    detail: str  # the fix, in the user's terms
    evidence: dict[str, Any]
    ranks: tuple[int, ...]
    est_speedup: float | None  # upper bound, e.g. 1.25 = up to 25% faster
    # with --critical-path: the fix replayed on the dependency graph (tracelens.analysis.rank.replay):
    # {change, predicted_step_ns, predicted_speedup, predicted_mfu, and beyond_bound where the replay passes
    # est_speedup}; absent without it
    what_if: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        if d["what_if"] is None:  # reports without --critical-path are as before
            del d["what_if"]
        return d


# the change each suggestion's fix stands for on the graph (replay.Change strings; replay.for_rank
# replays them).  A straggler's lateness removed (``rank_late[<rank>]=0``) is the job reduce's
# (tracelens.analysis.rank.critical.rank_late, on the stitched path): ``suggest``'s ``late``.
WHAT_IF = {
    "input_bound_high": "data_loading=0",
    "input_bound_moderate": "data_loading=0",
    "host_launch_bound": "launch=0",
    "launch_latency": "launch=0",
    "exposed_communication": "comm=0",
    "exposed_memcpy": "memcpy=0",
    "non_matmul_heavy": str(NON_MATMUL_0),
}


def changes_for(rank) -> list[str]:
    """The changes (WHAT_IF) of the rules this rank triggers on its own: what its replay computes."""
    out = []
    for rule in RULES:
        c = WHAT_IF.get(rule.id)
        if c is None or c in out or rank.gpu is None or (rule.applies is not None and not rule.applies(rank)):
            continue
        v = rule.measure(rank)
        if v is not None and v >= rule.threshold:
            out.append(c)
    return out


def what_if(rule_id: str, ranks, job_path: dict[str, Any] | None = None, every_rank=None, waits=None) -> dict[str, Any] | None:
    """The replayed prediction of a rule's change over the ranks it hit, their kept steps: the
    mean predicted step, the speed-up (measured time / predicted) and the MFU at that time.

    With the job's stitched critical path (``job_path``: ``critical.combine``'s, with ``steps``;
    ``every_rank``: the job's ranks) the ranks are coupled by their collectives: a rank's own
    replay is no prediction of the job's step (a rank that waited for a later one at an
    all-reduce has that wait inside its NCCL kernels, which ``comm=0`` removes as if it were
    communication; its faster kernels do not make the later rank arrive sooner).  Each kept step
    of the job is then predicted from the job's path and the ranks' replays less their waits
    (``job_step_predictions``; ``waits``: ``critical.step_waits``).  Where ranks are coupled but their paths are not stitched
    (``withheld``) no rank's wait can be told from its work: no prediction (None; the job reduce
    warns, ``UNSTITCHED_WHAT_IF``)."""
    change = WHAT_IF.get(rule_id)
    if change and job_path and every_rank and not withheld(job_path, every_rank):
        if job_path.get("steps"):
            return _job_what_if(change, job_path, every_rank, waits)
    elif change and job_path and every_rank:
        return None
    if change and lone_comm(change, job_path, every_rank or ranks):
        return None
    got = [r for r in ranks if change and getattr(r, "what_if", None) and change in r.what_if]
    if not got:
        return None
    meas = pred = n = 0
    mfus = []
    for r in got:
        kept = kept_indices(list(r.steps))
        m = sum(r.steps[i].dur_ns for i in kept)
        p = sum(r.what_if[change][i] for i in kept)
        meas, pred, n = meas + m, pred + p, n + len(kept)
        mfus.append(r.mfu * m / p if (r.mfu is not None and p > 0) else None)
    if not n or pred <= 0:
        return None
    return {"change": change, "predicted_step_ns": round(pred / n), "predicted_speedup": round(meas / pred, 3),
            "predicted_mfu": round(sum(mfus) / len(mfus), 4) if all(x is not None for x in mfus) else None}


UNSTITCHED_WHAT_IF = ("what-if predictions withheld: collectives on the ranks' critical paths could not be matched across "
                      "ranks (members not loaded or match refused), so a rank's wait for another inside them cannot be told "
                      "from its own work")


LONE_COMM_WHAT_IF = ("what-if of removing communication withheld: the one rank's collectives on its critical path have "
                     "members that are not loaded (or a group size the trace does not say), so its wait for them inside "
                     "its collectives cannot be told from the transfer; load every rank of the job")


def _with_collectives(ranks) -> int:
    """How many ranks' critical paths carry collective rows (what the job reduce stitches)."""
    return len([r for r in ranks if (getattr(r, "critical_path", None) or {}).get("collectives")])


def lone_comm(change: str, job_path: dict[str, Any] | None, ranks) -> bool:
    """Whether ``change`` takes time off the collectives (``comm=0``, ``comm/K``) of a lone rank's
    path whose collectives have members not loaded (``critical.combine``'s ``unstitched`` for one
    rank): its own replay would remove its wait for the absent ranks as if it were transfer."""
    from tracelens.analysis.rank.replay import parse

    if not job_path or not (job_path.get("unstitched") or {}).get("rows_on_path"):
        return False
    if _with_collectives(ranks) != 1:
        return False
    return any(c.what == "comm" and not c.target for c in parse(change))


def withheld(job_path: dict[str, Any] | None, ranks) -> bool:
    """Whether several ranks' paths pass through collectives that the job's path could not stitch:
    collectives on a rank's path unmatched (``unstitched.rows_on_path``), or no stitched path at
    all (the ranks' steps differ): a rank's wait for another inside them is then unknown."""
    if not job_path or _with_collectives(ranks) < 2:
        return False
    return not job_path.get("steps") or bool((job_path.get("unstitched") or {}).get("rows_on_path"))


def path_saving(change: str, by_category_ns: dict[str, int]) -> int | None:
    """The ns a change takes off a path with these categories, to first order (its categories'
    time removed or divided; None: a change with no category of its own, e.g. kernel[REGEX])."""
    from tracelens.analysis.rank.replay import parse

    total = 0.0
    for c in parse(change):
        cats = {"data_loading": ["data_loading"], "launch": ["launch_overhead"], "memcpy": ["memcpy"],
                "comm": ["exposed_comm"] if not c.target else None,
                "kclass": [f"compute_{k}" for k in (c.target or ())]}.get(c.what)
        if cats is None:
            return None
        ns = sum(by_category_ns.get(x, 0) for x in cats)
        total += ns if c.factor == float("inf") else ns * (1 - 1 / c.factor)
    return round(total)


def _wait_left(change: str) -> float:
    """The share of a rank's wait at collectives (inside its NCCL kernels) that its replay of
    ``change`` keeps: none with ``comm=0``, 1/K with ``comm/K``, all otherwise (a targeted comm
    change: all, the safe side for a lower bound)."""
    from tracelens.analysis.rank.replay import parse

    left = 1.0
    for c in parse(change):
        if c.what == "comm" and not c.target:
            left = left / c.factor
    return left


def job_step_predictions(change: str, job_path: dict[str, Any], ranks, waits: dict[int, list[int]] | None = None) -> list[int | None] | None:
    """Each step of the job's stitched path predicted with ``change`` (``what_if``): the larger of
    two lower bounds on the job's step, at most its measured length: the path's length less the
    change's time on it (``path_saving``; another chain may become the longest), and every rank
    that replayed the change, its replayed step less the part of its wait for other ranks
    (``waits``: ``critical.step_waits``, per file and step) that its replay keeps (that wait
    shrinks or grows with the others).  None overall: a change with no category of its own and
    no replay to tell."""
    left = _wait_left(change)
    out: list[int | None] = []
    for k, st in enumerate(job_path.get("steps") or []):
        length = st["length_ns"]
        saving = path_saving(change, st.get("by_category_ns") or {})
        bounds = [] if saving is None else [length - saving]
        for r in ranks:
            wi = (getattr(r, "what_if", None) or {}).get(change)
            if wi is None or k >= len(wi) or wi[k] is None:
                continue
            wait = ((waits or {}).get(r.file) or [])
            bounds.append(wi[k] - round(left * (wait[k] if k < len(wait) else 0)))
        if not bounds:
            return None
        out.append(min(max(max(bounds), 0), length))
    return out


def _job_what_if(change: str, job_path: dict[str, Any], ranks, waits=None) -> dict[str, Any] | None:
    """``what_if`` on the job's stitched path (see there): the kept steps' ``job_step_predictions``."""
    per_step = job_step_predictions(change, job_path, ranks, waits)
    if per_step is None:
        return None
    kept = [(st["length_ns"], p) for st, p in zip(job_path["steps"], per_step) if st.get("kept") and p is not None]
    meas, pred, n = sum(m for m, _ in kept), sum(p for _, p in kept), len(kept)
    if not n or pred <= 0:
        return None
    mfus = [r.mfu for r in ranks]
    mfu = sum(mfus) / len(mfus) * meas / pred if mfus and all(x is not None for x in mfus) else None
    return {"change": change, "predicted_step_ns": round(pred / n), "predicted_speedup": round(meas / pred, 3),
            "predicted_mfu": round(mfu, 4) if mfu is not None else None}


# XProf's input-bound bands (DESIGN 4.5): one definition for the steps' verdicts and the rules
INPUT_HIGH, INPUT_MODERATE = 0.20, 0.05


def input_bound_class(fraction: float) -> str:
    return "highly" if fraction >= INPUT_HIGH else "moderately" if fraction >= INPUT_MODERATE else "no"


def _bar(rank, key: str) -> float:
    if not rank.waterfall:
        return 0.0
    for b in rank.waterfall.bars:
        if b.key == key:
            return b.fraction
    return 0.0


def _bar_with_flops(rank, key: str) -> float:
    """A bar's share without its part of matmul kernels whose FLOPs are unknown: the time whose
    efficiency is measured (the rest is not known to be below peak)."""
    bar = next((b for b in rank.waterfall.bars if b.key == key), None) if rank.waterfall else None
    if bar is None:
        return 0.0
    return bar.fraction - sum(p["fraction"] for p in bar.parts if p["key"] == "matmul_without_flops")


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
    # the advice as it applies to the ranks that hit: (ranks) -> text, from their facts (training or
    # inference, the GPU's precisions, kernels replayed from CUDA graphs, the dominant kernel class)
    adapt_title: Callable[[list], str] | None = None
    adapt_fix: Callable[[list], str] | None = None
    applies: Callable[[Any], bool] | None = None  # per rank: the rule makes sense there (e.g. training only)
    extra: Callable[[list], dict[str, Any]] | None = None  # more evidence, from the ranks that hit
    adapt_show: Callable[[list], tuple[str, ...]] | None = None


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


def _workload(ranks) -> str | None:
    """"training" if any rank that hit trains, "inference" if all of them infer, else None."""
    ws = {r.facts.get("workload") for r in ranks}
    return "training" if "training" in ws else "inference" if ws == {"inference"} else None


def _not_inference(rank) -> bool:
    return rank.facts.get("workload") != "inference"


def _sum(ranks, key: str) -> float:
    return sum(r.facts.get(key) or 0 for r in ranks)


def _graph_share(ranks, fact: str, idle_key: str) -> float:
    """The share of the ranks' ``idle_key`` idle that ends at kernels replayed from CUDA graphs."""
    total = sum(getattr(r.idle, idle_key, 0) for r in ranks if r.idle is not None)
    return _sum(ranks, fact) / total if total else 0.0


_GRAPHED = "already replayed from CUDA graphs"


def _host_launch_fix(ranks) -> str:
    share = _graph_share(ranks, "graph_host_launch_ns", "host_launch")
    work = _workload(ranks)
    more = {"training": ", a larger micro-batch, fused/foreach optimizers",
            "inference": ", larger batches (more requests or tokens per forward)"}.get(work, ", larger batches")
    if share >= 0.5:
        return (f"{share:.0%} of this idle ends at kernels {_GRAPHED} (the host launched the replay late): shorten the host "
                "work between replays (scheduling, sampling, input preparation), overlap it with the GPU (prepare the next "
                f"step while this one runs), capture more of the step in the graph{more}.")
    tail = f" ({share:.0%} of it ends at kernels {_GRAPHED})" if share else ""
    return (f"Cut per-kernel host cost: torch.compile(model) (fewer, fused kernels), CUDA graphs "
            f"(torch.compile(mode='reduce-overhead')){more}{tail}.")


def _launch_latency_fix(ranks) -> str:
    share = _graph_share(ranks, "graph_launch_latency_ns", "launch_latency")
    if share >= 0.5:
        return (f"{share:.0%} of this idle ends at kernels {_GRAPHED} (the GPU waits with the work queued): look for "
                "cross-stream event waits and dependencies in the graph and for work between replays; fuse the small "
                "dependent kernels inside the graph (torch.compile) so fewer of them wait on each other.")
    tail = f" ({share:.0%} of it ends at kernels {_GRAPHED})" if share else ""
    return f"Capture the step with CUDA graphs; reduce cross-stream waits (cudaStreamWaitEvent) and tiny dependent kernels{tail}."


def _tiny_kernels_fix(ranks) -> str:
    kernels = _sum(ranks, "kernels")
    share = _sum(ranks, "graph_kernels") / kernels if kernels else 0.0
    if share >= 0.5:
        return (f"Fuse them with torch.compile; batch small operations (foreach ops). {share:.0%} of them are {_GRAPHED}, "
                "so their launch cost is paid once per replay; each still costs its own start-up on the GPU.")
    return "Fuse them with torch.compile or replay the step with CUDA graphs; batch small operations (foreach ops)."


_BLOCKING_COPIES = ("Memcpy", "aten::to", "aten::_to_copy", "aten::copy_")


def _sync_by_call(ranks) -> dict[str, int]:
    """The blocking calls the ranks' sync-drain idle was spent in or had just returned from, ns."""
    calls: dict[str, int] = {}
    for r in ranks:
        for k, v in (r.facts.get("sync_by_call_ns") or {}).items():
            calls[k] = calls.get(k, 0) + v
    return dict(sorted(calls.items(), key=lambda kv: (-kv[1], kv[0])))


def _sync_fix(ranks) -> str:
    calls = _sync_by_call(ranks)
    total = sum(calls.values())
    top = next(iter(calls), None)
    lead = ""
    if top and total:
        lead = f"{calls[top] / total:.0%} of it is spent in or just after {top}"
        if any(c in top for c in _BLOCKING_COPIES):
            lead += (" (a blocking copy: make it non_blocking=True into pinned memory and read the result later, after an "
                     "event, instead of waiting for the queue to drain)")
        lead += ". "
    later = ("log metrics every N steps or asynchronously" if _workload(ranks) != "inference"
             else "keep sampling and stop checks on the GPU and read results a step later")
    return (f"{lead}Remove .item(), .cpu(), .tolist(), print(tensor), torch.cuda.synchronize() and data-dependent shapes "
            f"(nonzero, boolean masks) from the step; {later}.")


def _sync_calls(ranks) -> dict[str, Any]:
    return {"calls": dict(list(_sync_by_call(ranks).items())[:8])}


def _precision_fix(ranks) -> str:
    """Mixed precision in the dtypes the GPU has (V100: FP16 only, no BF16, no TF32)."""
    bf16 = all(r.facts.get("has_bf16", True) for r in ranks)
    tf32 = all(r.facts.get("has_tf32") for r in ranks)
    work = _workload(ranks)
    if work == "inference":
        text = ("Run the model in reduced precision: model.to(torch.bfloat16) or torch.autocast('cuda', dtype=torch.bfloat16)"
                if bf16 else "Run the model in float16: model.half() or torch.autocast('cuda', dtype=torch.float16) (this GPU has no BF16)")
    elif bf16:
        text = "Train in mixed precision: with torch.autocast('cuda', dtype=torch.bfloat16): ..."
    else:
        text = ("Train in mixed precision with float16: with torch.autocast('cuda', dtype=torch.float16): ... and a "
                "torch.amp.GradScaler (this GPU has no BF16)")
    if work is None:  # training or inference unknown
        text = text.replace("Train in", "Use").replace("and a torch.amp.GradScaler", "(with a torch.amp.GradScaler when training)")
    if tf32:
        text += "; or at least allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True)"
    return text + "."


# what fuses or removes each class of non-matmul kernel (kclass.py's classes)
_CLASS_FIX = {
    "embedding": "embedding lookups: batch the tables into one fused lookup (FBGEMM TBE / torchrec EmbeddingBagCollection), "
                 "EmbeddingBag pooling instead of Embedding + sum, cache or shard the hot rows",
    "elementwise": "elementwise chains: fuse them (torch.compile(model), fused bias/activation epilogues)",
    "norm": "normalization: fused LayerNorm/RMSNorm kernels with the residual add folded in (torch.compile, Apex/TE fused norms)",
    "softmax_reduce": "softmax and reductions: FlashAttention/SDPA instead of separate softmax kernels, fused cross-entropy",
    "optimizer": "optimizer: a fused or foreach optimizer (torch.optim.AdamW(params, fused=True))",
    "cast_quant": "casts and quantization: keep weights in the compute dtype (autocast caches casts), fuse quantization "
                  "into the GEMM epilogue",
    "copy": "copies and transposes: avoid .contiguous()/permute copies between layers (channels_last for CNNs, GEMM-friendly layouts)",
    "moe_routing": "MoE routing and token permutation: fused routing/permute kernels around a grouped GEMM",
    "other": "unclassified kernels: see the kernel table for the largest",
}


def _non_matmul_parts(ranks) -> dict[str, int]:
    parts: dict[str, int] = {}
    for r in ranks:
        for b in (r.waterfall.bars if r.waterfall else ()):
            if b.key == "non_matmul":
                for pt in b.parts:
                    parts[pt["key"]] = parts.get(pt["key"], 0) + pt["ns"]
    return dict(sorted(parts.items(), key=lambda kv: (-kv[1], kv[0])))


def _leading_classes(ranks) -> list[str]:
    """The classes that make up most of the non-matmul time: the largest, and the next ones
    while they are at least half of it (three at most)."""
    parts = _non_matmul_parts(ranks)
    if not parts:
        return []
    first = next(iter(parts.values()))
    return [k for k, v in parts.items() if v * 2 >= first][:3]


def _non_matmul_title(ranks) -> str:
    lead = _leading_classes(ranks)
    return "Non-matmul kernels take a large share of the step" + (f", {' and '.join(lead)} first" if lead else "")


def _non_matmul_fix(ranks) -> str:
    lead = _leading_classes(ranks) or ["elementwise", "norm", "softmax_reduce"]
    if _workload(ranks) == "inference":
        lead = [c for c in lead if c != "optimizer"] or ["elementwise"]
    return "Fuse or remove the largest: " + "; ".join(_CLASS_FIX.get(c, _CLASS_FIX["other"]) for c in lead) + "."


def _non_matmul_evidence(ranks) -> dict[str, Any]:
    T = sum(r.waterfall.window_ns for r in ranks if r.waterfall)
    return {"classes": {k: round(v / T, 4) for k, v in _non_matmul_parts(ranks).items()} if T else {}}


def _non_matmul_show(ranks) -> tuple[str, ...]:
    return tuple(_non_matmul_parts(ranks)) or ("norm", "elementwise", "softmax_reduce", "optimizer", "cast_quant", "copy",
                                               "moe_routing", "embedding", "other")


def _step_verdicts(ranks) -> dict[str, Any]:
    """How many of the kept steps of the ranks that hit are highly / moderately / not input-bound."""
    out = {"highly": 0, "moderately": 0, "no": 0}
    for r in ranks:
        steps = getattr(r, "steps", ())
        for s in kept_steps(steps):
            out[input_bound_class(_idle(s, "data_loading"))] += 1
    return {"steps": out}


def _input_title(level: str) -> Callable[[list], str]:
    def title(ranks) -> str:
        t = f"{level.capitalize()} input-bound: the GPU waits for the DataLoader"
        v = _step_verdicts(ranks)["steps"]
        n = sum(v.values())
        other = [f"{v[c]} of {n} steps {c}" for c in ("highly", "moderately") if c != level and v[c]]
        return t + (f" ({', '.join(other)})" if other else "")
    return title


def _exposed_comm_fix(ranks) -> str:
    if _workload(ranks) == "inference":
        return ("Overlap communication with compute: async tensor parallelism or fused all-reduce + norm kernels, a custom "
                "all-reduce for small messages, fewer tensor-parallel ranks per replica when messages are small; check the "
                "slowest collectives and their bandwidth.")
    return ("Overlap communication with compute: DDP(bucket_cap_mb=25..100, gradient_as_bucket_view=True), FSDP "
            "forward/backward prefetch, async tensor parallel; check the slowest collectives and their bandwidth.")


def _matmul_fix(ranks) -> str:
    batch = {"training": "larger micro-batches", "inference": "more requests or tokens per batch"}.get(_workload(ranks), "larger batches")
    return (f"Make GEMM shapes multiples of 64/128 (pad vocab, hidden and batch*seq), use {batch}, FlashAttention, "
            "FP8 where the model allows; check per-kernel TFLOP/s for the worst shapes.")


def _pipeline_fix(ranks) -> str:
    if _workload(ranks) == "inference":
        return "Keep more requests (micro-batches) in flight across the pipeline stages; rebalance the layers per stage."
    return "Raise the number of micro-batches m, use interleaved 1F1B (virtual stages) or a zero-bubble schedule; rebalance stages."


def _item_fix(ranks) -> str:
    if _workload(ranks) == "inference":
        return ("Each .item() waits for the GPU to finish: keep sampling and stop checks on the GPU and read the results a "
                "step later (overlap the scheduler with the GPU).")
    return "Each .item() waits for the GPU to finish: keep losses and metrics on the GPU and read them every N steps."


def _data_fix(ranks) -> str:
    where = "training process" if _workload(ranks) != "inference" else "main process"
    return ("Load data in parallel and ahead of time: DataLoader(num_workers=8, pin_memory=True, persistent_workers=True, "
            f"prefetch_factor=4); move decoding/augmentation off the {where} (DALI, pre-processed shards).")


RULES: tuple[Rule, ...] = (
    Rule("input_bound_high", "Highly input-bound: the GPU waits for the DataLoader",
         "Load data in parallel and ahead of time: DataLoader(num_workers=8, pin_memory=True, persistent_workers=True, "
         "prefetch_factor=4); move decoding/augmentation off the training process (DALI, pre-processed shards).",
         lambda r: _idle(r, "data_loading"), INPUT_HIGH, "GPU idle waiting for data, share of the step",
         focus=("idle", "data_loading"), show=("idle",),
         adapt_title=_input_title("highly"), adapt_fix=_data_fix, extra=_step_verdicts),
    Rule("input_bound_moderate", "Moderately input-bound: the GPU waits for the DataLoader",
         "Raise DataLoader num_workers and prefetch_factor, set pin_memory=True; check the data pipeline with a profiler of its own.",
         lambda r: v if (v := _idle(r, "data_loading")) < INPUT_HIGH else 0.0, INPUT_MODERATE, "GPU idle waiting for data, share of the step",
         focus=("idle", "data_loading"), show=("idle",),
         adapt_title=_input_title("moderately"), extra=_step_verdicts),
    Rule("host_launch_bound", "The GPU starves: the host launches kernels too slowly",
         "Cut per-kernel host cost: torch.compile(model) (fewer, fused kernels), CUDA graphs (torch.compile(mode='reduce-overhead')), "
         "a larger micro-batch, fused/foreach optimizers.",
         lambda r: _idle(r, "host_launch"), 0.10, "GPU idle while the host was busy launching, share of the step",
         focus=("idle", "host_launch"), show=("idle",), adapt_fix=_host_launch_fix,
         extra=lambda rs: {"graph_replayed": round(_graph_share(rs, "graph_host_launch_ns", "host_launch"), 4)}),
    Rule("sync_drain", "Host synchronizations and blocking copies drain the GPU queue",
         "Remove .item(), .cpu(), .tolist(), print(tensor), torch.cuda.synchronize() and data-dependent shapes (nonzero, "
         "boolean masks) from the step; log metrics every N steps or asynchronously.",
         lambda r: _idle(r, "sync"), 0.02, "GPU idle in or just after a blocking synchronize or copy, share of the step",
         focus=("idle", "sync"), show=("idle",), adapt_fix=_sync_fix, extra=_sync_calls),
    Rule("launch_latency", "Kernels wait on launch latency and stream dependencies",
         "Capture the step with CUDA graphs; reduce cross-stream waits (cudaStreamWaitEvent) and tiny dependent kernels.",
         lambda r: _idle(r, "launch_latency"), 0.10, "GPU idle with the next kernel already queued, share of the step",
         focus=("idle", "launch_latency"), show=("idle",), adapt_fix=_launch_latency_fix,
         extra=lambda rs: {"graph_replayed": round(_graph_share(rs, "graph_launch_latency_ns", "launch_latency"), 4)}),
    Rule("low_gpu_utilization", "Low GPU utilization: the GPU is idle much of the step",
         "Find where the host spends the step (the idle bars say which part: data, launch, sync); overlap host work with GPU work.",
         lambda r: _gpu(r, "idle"), 0.40, "GPU idle share of the step", removable=False,
         focus=("gpu", "idle"), show=("idle",)),  # the idle bars carry the estimates
    Rule("exposed_communication", "Communication is exposed (not overlapped with compute)",
         "Overlap communication with compute: DDP(bucket_cap_mb=25..100, gradient_as_bucket_view=True), FSDP "
         "forward/backward prefetch, async tensor parallel; check the slowest collectives and their bandwidth.",
         lambda r: _gpu(r, "exposed_comm"), 0.05, "exposed communication, share of the step",
         focus=("gpu", "exposed_comm"), show=("comm",), adapt_fix=_exposed_comm_fix),
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
         focus=None, show=("gemm", "conv", "attention"), adapt_fix=_precision_fix),
    Rule("non_matmul_heavy", "Non-matmul kernels take a large share of the step",
         "Fuse elementwise, normalization and softmax kernels: torch.compile(model), fused norm/RoPE/cross-entropy kernels.",
         lambda r: _bar(r, "non_matmul"), 0.30, "non-matmul kernels, share of the step",
         focus=("bar", "non_matmul"), show=("norm", "elementwise", "softmax_reduce", "optimizer", "cast_quant", "copy", "moe_routing", "other"),
         adapt_title=_non_matmul_title, adapt_fix=_non_matmul_fix, extra=_non_matmul_evidence, adapt_show=_non_matmul_show),
    Rule("optimizer_kernels", "The optimizer step runs many separate kernels",
         "Use a fused or foreach optimizer: torch.optim.AdamW(params, fused=True) (or foreach=True).",
         _fact_share("optimizer_kernel_ns"), 0.05, "optimizer kernels, share of the step",
         focus=None, show=("optimizer",), applies=_not_inference),
    Rule("matmul_below_peak", "Matmuls run well below the GPU's peak",
         "Make GEMM shapes multiples of 64/128 (pad vocab, hidden and batch*seq), use larger micro-batches, FlashAttention, "
         "FP8 where the model allows; check per-kernel TFLOP/s for the worst shapes.",
         lambda r: _bar_with_flops(r, "matmul_below_peak"), 0.20, "matmul time beyond its FLOPs at peak, share of the step",
         focus=("bar", "matmul_below_peak"), show=("gemm", "conv", "attention"), adapt_fix=_matmul_fix),
    Rule("many_tiny_kernels", "Many tiny kernels (under 10 µs)",
         "Fuse them with torch.compile or replay the step with CUDA graphs; batch small operations (foreach ops).",
         _tiny_kernels, 0.6, "share of kernels shorter than 10 µs", removable=False,
         focus=None, show=(), adapt_fix=_tiny_kernels_fix),
    Rule("item_in_step", "Scalar reads from the GPU in every step (.item())",
         "Each .item() waits for the GPU to finish: keep losses and metrics on the GPU and read them every N steps.",
         _item_calls, 3.0, ".item() calls per kept step", removable=False,
         unit="count", focus=("count", "item_calls_by_step"), show=("idle",), adapt_fix=_item_fix),
    Rule("recompute_heavy", "Activation recomputation costs a large share of the step",
         "Checkpoint selectively (only attention or only every other layer: torch.utils.checkpoint on chosen blocks, "
         "or a selective activation-checkpointing policy) when memory allows; offload activations instead.",
         lambda r: _bar(r, "recompute"), 0.10, "recomputed forward ops, share of the step",
         focus=("bar", "recompute"), show=(), applies=_not_inference),
    Rule("pipeline_bubble", "Pipeline bubbles: stages wait for each other",
         "Raise the number of micro-batches m, use interleaved 1F1B (virtual stages) or a zero-bubble schedule; rebalance stages.",
         lambda r: _idle(r, "pipeline_bubble"), 0.05, "GPU idle before pipeline send/recv, share of the step",
         focus=("idle", "pipeline_bubble"), show=("idle", "comm"), adapt_fix=_pipeline_fix),
)


def _step_value(step, focus: tuple[str, str] | None, per_step: dict | None = None, i: int | None = None) -> float:
    """The rule's number in one step (a share of the step's window; a count for "count")."""
    if focus is None:
        return 0.0
    src, key = focus  # a Step has the idle / gpu / waterfall a rank has: the same readers serve
    if src == "count":  # a per-step count among the rank's facts, by step index
        return (per_step or {}).get(i, 0)
    return {"idle": _idle, "gpu": _gpu, "bar": _bar}[src](step, key)


def where(rule_focus: tuple[str, str] | None, show: tuple[str, ...], rank) -> dict[str, Any]:
    """Where to look: the step of ``rank`` in which the rule's number is largest (the longest
    kept step when the rule has no per-step number), and what to highlight there."""
    steps = list(getattr(rank, "steps", ()))
    kept = kept_indices(steps)
    if not kept:
        return {"rank": rank.rank, "step": None, "start_ns": None, "end_ns": None, "show": list(show)}
    per = (getattr(rank, "facts", None) or {}).get(rule_focus[1]) if rule_focus and rule_focus[0] == "count" else None
    value = lambda i: _step_value(steps[i], rule_focus, per, i)  # noqa: E731
    i = max(kept, key=lambda i: (value(i), steps[i].dur_ns))
    best = steps[i]
    return {"rank": rank.rank, "step": best.step, "step_name": best.name, "start_ns": best.start_ns, "end_ns": best.end_ns,
            "value": round(value(i), 4) if rule_focus else None, "show": list(show)}


PIPELINE_MIN_BUBBLE = 0.05  # the measured bubble share at which the schedule-specific fix is worth a suggestion
BALANCE_MIN_EXCESS = 0.05  # the slowest stage's compute over the mean at which balancing is suggested


def _stages_held(pipe: dict[str, Any], pos: int, p: int) -> list[int] | None:
    """The model stages the rank at pipeline position ``pos`` holds where it holds more than one:
    ``pos`` and ``2p-1-pos`` on a V-shaped placement (ZB-V, DualPipeV), ``pos + k*p`` on a looped one
    (interleaved, v stages); None with one stage per rank."""
    v = pipe.get("virtual_stages") or 1
    if v <= 1:
        return None
    if pipe.get("placement") == "v_shape":
        return [pos, 2 * p - 1 - pos]
    return [pos + k * p for k in range(v)]


def pipeline_suggestion(pipe: dict[str, Any] | None, per_rank: dict[int, float] | None = None) -> Suggestion | None:
    """The schedule-specific fix where a pipeline was detected (``job.pipeline``: stages, m, v, a
    schedule with a theory) and its bubble is worth it: more micro-batches (the theory's bubble at
    m' = 2m and at m' = 4p), interleaving (the theory at v = 2, or 2v when interleaved already),
    and balancing the slowest stage (by how much, from ``gap``), each with its numbers.
    ``per_rank``: rank -> its measured bubble fraction."""
    from tracelens.analysis.job.pipeline import predict, theory

    if not pipe or pipe.get("theory_fraction") is None or (pipe.get("bubble_fraction") or 0) < PIPELINE_MIN_BUBBLE:
        return None
    sched, p, m, v = pipe["schedule"], pipe["stages"], pipe["microbatches"], pipe.get("virtual_stages") or 1
    now = pipe["theory_fraction"]
    options: list[dict[str, Any]] = []
    for mm in sorted({2 * m, 4 * p}):
        if mm > m:
            rep = predict(pipe, mm)
            options.append({"change": "microbatches", "microbatches": mm, "theory_fraction": round(theory(sched, p, mm, v), 4),
                            **({"replay_fraction": round(rep["bubble_fraction"], 4), "replay_step_ns": rep["step_ns"]} if rep else {})})
    vv = 2 * v if sched == "interleaved" else 2
    if sched in ("1f1b", "interleaved", "gpipe"):
        options.append({"change": "interleave", "virtual_stages": vv, "theory_fraction": round(theory("interleaved", p, m, vv), 4),
                        **({"note": "needs m a multiple of p (Megatron)"} if m % p else {})})
    parts = [f"The {sched} schedule over p={p} stages with m={m} micro-batches" + (f" and v={v} virtual stages" if v > 1 else "")
             + f" leaves a bubble of {100 * now:.1f}% in theory; measured {100 * pipe['bubble_fraction']:.1f}%."]
    mb = [o for o in options if o["change"] == "microbatches"]
    if mb:
        parts.append("More micro-batches (same global batch, smaller micro-batches): "
                     + ", ".join(f"m={o['microbatches']} -> {100 * o['theory_fraction']:.1f}%"
                                 + (f" (replayed: {100 * o['replay_fraction']:.1f}%)" if "replay_fraction" in o else "") for o in mb) + ".")
    il = [o for o in options if o["change"] == "interleave"]
    if il:
        parts.append(f"Interleaved 1F1B with v={il[0]['virtual_stages']} virtual stages per rank -> {100 * il[0]['theory_fraction']:.1f}%"
                     + (" (needs m a multiple of p)" if m % p else "") + ".")
    g = pipe.get("gap") or {}
    if g.get("slow_stage_ns") and (g.get("slowest_stage_excess") or 0) >= BALANCE_MIN_EXCESS:
        comp = g.get("stage_compute_ns") or []
        mean = sum(comp) / len(comp) if comp else 0
        move = (comp[g["slowest_stage"]] - mean) if comp else 0
        held = _stages_held(pipe, g["slowest_stage"], p)
        options.append({"change": "balance", "stage": g["slowest_stage"], "excess": round(g["slowest_stage_excess"], 4),
                        "move_ns_per_step": round(move), "saves_ns": g["slow_stage_ns"], **({"stages_held": held} if held else {})})
        who = (f"the rank at position {g['slowest_stage']} (it holds stages {' and '.join(map(str, held))})" if held
               else f"stage {g['slowest_stage']}")
        parts.append(f"Balance the stages: {who} computes {100 * g['slowest_stage_excess']:.0f}% more than the mean"
                     f" (move about {move / 1e6:.2f} ms of its work per step, i.e. layers, to the other "
                     f"{'ranks' if held else 'stages'}); the imbalance costs {g['slow_stage_ns'] / 1e6:.2f} ms of bubble over the measured steps.")
    if g.get("p2p_ns") and g.get("gap_ns") and g["p2p_ns"] > 0.5 * g["gap_ns"]:
        parts.append(f"Most of the gap to the theory ({g['p2p_ns'] / 1e6:.2f} ms) is P2P: overlap the sends/recvs with compute "
                     "(batched isend/irecv, the runtime's overlapped schedules), check the P2P links.")
    best = min([o["theory_fraction"] for o in options if "theory_fraction" in o], default=now)
    return Suggestion(
        id="pipeline_schedule", title=f"Pipeline bubble: {100 * pipe['bubble_fraction']:.0f}% of the stages' time ({sched}, p={p}, m={m})",
        detail=" ".join(parts),
        evidence={"measure": "pipeline bubble, share of the stages' windows (job.pipeline)", "unit": "share",
                  "worst": round(max((per_rank or {}).values(), default=pipe["bubble_fraction"]), 4),
                  "mean": round(pipe["bubble_fraction"], 4), "threshold": PIPELINE_MIN_BUBBLE,
                  "per_rank": {str(rk): round(v, 4) for rk, v in sorted((per_rank or {}).items())},
                  "schedule": sched, "stages": p, "microbatches": m, "virtual_stages": v, "confidence": pipe.get("confidence"),
                  "bubble_fraction": round(pipe["bubble_fraction"], 4), "theory_fraction": round(now, 4), "options": options,
                  "gap": g or None},
        ranks=tuple(sorted(per_rank or {})), est_speedup=_speedup(now - best) if best < now else None,
        what_if=_pipeline_what_if(pipe, mb),
    )


def _pipeline_what_if(pipe: dict[str, Any], mb: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The largest m' replayed (``job.pipeline.predict``) against the measured step: {change,
    predicted_step_ns, predicted_speedup, predicted_mfu (null: the job's MFU is not at hand here)}."""
    rep = [o for o in mb if "replay_step_ns" in o]
    meas = (pipe.get("replay") or {}).get("measured_step_ns")
    if not rep or not meas or rep[-1]["replay_step_ns"] <= 0:
        return None
    o = rep[-1]
    return {"change": f"microbatches={o['microbatches']}", "predicted_step_ns": o["replay_step_ns"],
            "predicted_speedup": round(meas / o["replay_step_ns"], 3), "predicted_mfu": None}


def suggest(analysis, pipeline: dict[str, Any] | None = None, pipeline_ranks: dict[int, dict[str, Any]] | None = None,
            late: dict[int, dict[str, Any] | None] | None = None, job_path: dict[str, Any] | None = None,
            waits: dict[int, list[int]] | None = None) -> list[Suggestion]:
    """The rules' suggestions, the stragglers', and with ``pipeline`` (``job.pipeline``; its ranks'
    dicts by file in ``pipeline_ranks``) the schedule-specific fix (``pipeline_suggestion``);
    ``late``: straggler rank -> its ``what_if`` (rank_late replayed on the job's path); ``job_path``:
    the job's critical path (``critical.combine``), stitched across ranks where it has ``steps``;
    ``waits``: per file and step, its wait at collectives (``critical.step_waits``)."""
    out: list[Suggestion] = []
    ranks = [r for r in analysis.ranks if r.gpu is not None]
    for rule in RULES:
        hits = []
        for r in ranks:
            if rule.applies is not None and not rule.applies(r):
                continue
            v = rule.measure(r)
            if v is not None and v >= rule.threshold:
                hits.append((r.rank, v))
        if not hits:
            continue
        worst_rank, worst = max(hits, key=lambda h: (h[1], -h[0]))
        mean = sum(v for _, v in hits) / len(hits)
        hit = [r for r in ranks if r.rank in {rk for rk, _ in hits}]
        show = rule.adapt_show(hit) if rule.adapt_show else rule.show
        at = where(rule.focus, show, next(r for r in ranks if r.rank == worst_rank))
        out.append(
            Suggestion(
                id=rule.id,
                title=rule.adapt_title(hit) if rule.adapt_title else rule.title,
                detail=rule.adapt_fix(hit) if rule.adapt_fix else rule.fix,
                evidence={"measure": rule.what, "unit": rule.unit, "worst": round(worst, 4), "mean": round(mean, 4), "threshold": rule.threshold,
                          "per_rank": {str(rk): round(v, 4) for rk, v in hits}, "where": at,
                          **(rule.extra(hit) if rule.extra else {})},
                ranks=tuple(rk for rk, _ in hits),
                est_speedup=_speedup(mean) if rule.removable else None,
                what_if=what_if(rule.id, hit, job_path, ranks, waits),
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
                ranks=(st.rank,), est_speedup=None, what_if=(late or {}).get(st.rank),
            )
        )
    rank_of = {r.file: r.rank for r in analysis.ranks} if pipeline_ranks else {}
    fractions = {rank_of[f]: d["bubble_fraction"] for f, d in (pipeline_ranks or {}).items()
                 if isinstance(rank_of.get(f), int) and d.get("bubble_fraction") is not None}
    sg = pipeline_suggestion(pipeline, fractions)
    if sg is not None:
        # the schedule's fix measures the whole bubble (idle and exposed P2P outside the blocks): the rule's
        # share of it (the idle part only, on the same ranks) would count it twice, with a smaller number
        covered = set(sg.ranks)
        out = [s for s in out if not (s.id == "pipeline_bubble" and set(s.ranks) <= covered)]
        out.append(sg)
    return sorted((_bounded(s) for s in out), key=lambda s: -(s.est_speedup or 1.0))


# a replay up to 2% past its bar's bound is the same number on screen (38% and 39% faster): the
# bar's time measured on the GPU, the replay's on the path (data_loading=0 also removes the host
# time inside DataLoader spans)
BOUND_SLACK = 1.02


def _bounded(s: Suggestion) -> Suggestion:
    """A suggestion whose replayed speed-up passes its upper bound 1 / (1 - bar): the bound is of
    the bar, the replayed change of everything it removes (``launch=0`` closes the launch latency
    and the host launch time, two rules' bars): said in ``what_if.beyond_bound``, never shown as if
    the bar bounded it."""
    wi = s.what_if
    if not wi or not s.est_speedup or not wi.get("predicted_speedup") or wi["predicted_speedup"] <= s.est_speedup * BOUND_SLACK:
        return s
    note = (f"the change {wi['change']} removes more than this bar: its replayed {wi['predicted_speedup']:.3g}x is not bounded "
            f"by this bar's 1/(1-bar) = {s.est_speedup:.3g}x (the time other bars hold goes with it)")
    return replace(s, what_if={**wi, "beyond_bound": note})
