"""The MFU loss waterfall (MFU.md 9.7): from 100% of the GPU's dense peak down to the MFU,
one bar per cause, as disjoint intervals of GPU time plus the ideal-vs-actual matmul split.

With T the window, the bars are the idle split (data loading, host launch, sync drain, launch
latency, other), the pipeline bubble, exposed communication (by process group), exposed memcpy,
recompute (compute time of recomputed forward ops), non-matmul compute (by kernel class), matmul below peak (matmul time minus the time its FLOPs
would take at peak), the signed FLOP-convention bar (ideal matmul time / T minus MFU: precision
and counting conventions) and the MFU.  Everything but the last two is a length of GPU time,
and those lengths partition T; so the fractions sum to exactly 1 (up to float rounding).

When the MFU is unknown (no model FLOPs, or no peak), ``build_time`` gives the GPU-time
waterfall instead: the same bars up to exposed memcpy, then one ``compute`` bar (its FLOP
efficiency unknown, its parts matmul / recompute / the non-matmul classes); it sums to 1 too.

Matmul time splits into the kernels whose FLOPs are known (launched inside an op with counted
FLOPs) and those without (compiled code, custom attention, library kernels with no counted op):
the latter is its own part of "matmul below peak" ("matmul kernels without FLOPs"), never spread
over the known shapes.  The ideal time is the time the FLOPs take at the peak of each op's own
dtype, at most the time of the op's matmul kernels (and of all known-FLOP matmul time); what does
not fit (FLOPs beyond what their kernels could do at peak: over-counted, or a wrong dtype) moves
into the convention bar, as a negative part, and is warned about.  The convention bar is named
for what it holds (e.g. "FP32 math instead of tensor cores") and carries a one-line ``note``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

MATMUL_CLASSES = ("gemm", "conv", "attention")


@dataclass(frozen=True)
class Bar:
    key: str
    label: str
    ns: int
    fraction: float
    parts: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    note: str | None = None  # one line saying what the bar measures, where its name alone does not

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["parts"] = list(self.parts)
        if d["note"] is None:
            del d["note"]
        return d


NO_FLOPS, WITH_FLOPS, BEYOND_PEAK = "matmul_without_flops", "matmul_with_flops", "flops_beyond_peak"
NO_WINDOW = "flops_without_window"  # the FLOPs of steps whose GPU window is empty (``ending_at``)
# labels of the parts whose key is not already what to show (the others: group, kernel class, op shape)
PART_LABELS = {
    NO_FLOPS: "matmul kernels without FLOPs",
    WITH_FLOPS: "matmul kernels with FLOPs",
    BEYOND_PEAK: "FLOPs beyond their kernels' time",
    NO_WINDOW: "FLOPs of steps with an empty GPU window",
    "fp32": "FP32 matmuls (FP32 peak)",
    "fp64": "FP64 matmuls (FP32 peak)",
    "tf32": "TF32 matmuls (TF32 peak)",
    "fp8": "FP8 matmuls (FP8 peak)",
}


def _parts(values: dict[str, int], T: int) -> tuple[dict[str, Any], ...]:
    items = sorted(((k, v) for k, v in values.items() if v), key=lambda kv: (-kv[1], kv[0]))
    return tuple({"key": k, "label": PART_LABELS.get(k, k), "ns": v, "fraction": v / T} for k, v in items)


def _int_parts(values: dict[str, float], total: int) -> dict[str, int]:
    """Float part sizes as integers that sum exactly to ``total`` (the rounding to the largest)."""
    out = {k: round(v) for k, v in values.items() if v}
    if not out:
        return {}
    big = max(out, key=lambda k: (abs(values[k]), k))
    out[big] += total - sum(out.values())
    return {k: v for k, v in out.items() if v}


_LOW_PRECISION = {"fp32", "fp64", "tf32"}


def convention_text(parts: dict[str, int]) -> tuple[str, str | None]:
    """The convention bar's name and one-line note, from what its parts hold."""
    keys = {k for k, v in parts.items() if v}
    if not keys:
        return "FLOP convention / precision (signed)", None
    if keys <= {"fp32", "fp64"}:
        label = "FP32 math instead of tensor cores"
    elif keys == {"tf32"}:
        label = "TF32 math, below the 16-bit peak"
    elif keys <= _LOW_PRECISION:
        label = "FP32/TF32 math, below the 16-bit peak"
    elif keys == {"fp8"}:
        label = "FP8 math beyond the 16-bit peak (neg.)"
    elif keys == {BEYOND_PEAK}:
        label = "FLOPs beyond peak: over-counted (neg.)"
    else:
        label = "precision and FLOP convention (signed)"
    why = []
    if keys & _LOW_PRECISION:
        why.append("FP32/TF32 matmuls cannot reach the 16-bit peak (+)")
    if "fp8" in keys:
        why.append("FP8 matmuls can beat it (-)")
    if keys - _LOW_PRECISION - {"fp8", BEYOND_PEAK, NO_WINDOW}:
        why.append("other dtypes at their own peak")
    if BEYOND_PEAK in keys:
        why.append("some counted FLOPs exceed their kernels' time at peak: over-counted or a wrong dtype (-, see the warnings)")
    if NO_WINDOW in keys:
        why.append("the FLOPs of steps with an empty GPU window are in the MFU but in no window's bars (-, see the warnings)")
    note = "MFU is at the dense BF16/FP16 peak, the bars above at each matmul's own dtype peak: " + "; ".join(why)
    return label, note


IDLE_BARS = (
    ("data_loading", "idle: data loading"),
    ("host_launch", "idle: host launch overhead"),
    ("sync", "idle: host sync drain"),
    ("launch_latency", "idle: launch latency / dependencies"),
    ("other", "idle: other"),
)


@dataclass(frozen=True)
class Waterfall:
    window_ns: int
    bars: tuple[Bar, ...]

    def to_list(self) -> list[dict[str, Any]]:
        return [b.to_dict() for b in self.bars]


def build(
    T: int,
    idle: dict[str, int],
    exposed_comm: dict[str, int],
    exposed_memcpy: int,
    recompute: int,
    non_matmul: dict[str, int],
    matmul_ns: int,
    ideal_ns: float,
    mfu: float,
    matmul_known_ns: int | None = None,
    fit_ns: float | None = None,
    precision: dict[str, float] | None = None,
) -> Waterfall | None:
    """The bars of one window.  ``ideal_ns`` is the time the matmul FLOPs would take at each
    op's own dtype peak; ``mfu`` uses the reference peak.  ``matmul_known_ns``: the part of
    ``matmul_ns`` whose kernels have known FLOPs (None: all of it); ``fit_ns``: ``ideal_ns`` with
    each op held to its matmul kernels' time (None: ``ideal_ns``); ``precision``: per dtype, the
    time its FLOPs take at its own peak minus at the reference peak (the convention bar's parts)."""
    if T <= 0:
        return None
    bars = _not_compute(T, idle, exposed_comm, exposed_memcpy)
    bars.append(Bar("recompute", "recompute (activation checkpointing)", recompute, recompute / T))
    nm = sum(non_matmul.values())
    bars.append(Bar("non_matmul", "non-matmul kernels", nm, nm / T, _parts(non_matmul, T)))
    known = matmul_ns if matmul_known_ns is None else max(min(matmul_known_ns, matmul_ns), 0)
    unknown = matmul_ns - known
    # FLOPs beyond the time of their kernels (per op, then of all known-FLOP matmul time): convention bar
    ideal = min(float(ideal_ns if fit_ns is None else fit_ns), float(known))
    below = matmul_ns - ideal
    below_ns = round(below)
    mm_parts = {NO_FLOPS: unknown, WITH_FLOPS: below_ns - unknown} if unknown else {}
    bars.append(Bar("matmul_below_peak", "matmul below peak", below_ns, below / T, _parts(mm_parts, T)))
    conv_ns = round(ideal - mfu * T)
    conv = _int_parts({**(precision or {}), BEYOND_PEAK: ideal - float(ideal_ns)}, conv_ns)
    label, note = convention_text(conv)
    bars.append(Bar("flop_convention", label, conv_ns, ideal / T - mfu, _parts(conv, T), note))
    bars.append(Bar("mfu", "MFU", round(mfu * T), mfu))
    return Waterfall(T, tuple(bars))


def _not_compute(T: int, idle: dict[str, int], exposed_comm: dict[str, int], exposed_memcpy: int) -> list[Bar]:
    """The bars both waterfalls start with: the idle split, the pipeline bubble, exposed
    communication (by group) and exposed memcpy."""
    bars: list[Bar] = []
    for key, label in IDLE_BARS:
        bars.append(Bar(f"idle_{key}", label, idle.get(key, 0), idle.get(key, 0) / T))
    # the pipeline bubble: the idle outside the micro-batch blocks and, on a pipeline rank, the
    # exposed P2P (``pipeline_bubble_p2p``: the transfers the stage waits on), as rank.pipeline measures it
    gap, p2p = idle.get("pipeline_bubble", 0), idle.get("pipeline_bubble_p2p", 0)
    pp = gap + p2p
    bars.append(Bar("pipeline_bubble", "pipeline bubble", pp, pp / T, _parts({"idle": gap, "exposed P2P": p2p}, T) if p2p else ()))
    xc = sum(exposed_comm.values())
    bars.append(Bar("exposed_comm", "exposed communication", xc, xc / T, _parts(exposed_comm, T)))
    bars.append(Bar("exposed_memcpy", "exposed memcpy / memset", exposed_memcpy, exposed_memcpy / T))
    return bars


def build_time(T: int, idle: dict[str, int], exposed_comm: dict[str, int], exposed_memcpy: int, compute: dict[str, int]) -> Waterfall | None:
    """The waterfall of GPU time when the MFU is unknown (no FLOPs, or no peak): the same idle,
    bubble, exposed-communication (by group) and exposed-memcpy bars as ``build``, then one last
    ``compute`` bar whose FLOP efficiency is unknown, split into parts (``compute``: its ns by
    part: matmul, recompute, each non-matmul class).  The bars partition T, so they sum to 1."""
    if T <= 0:
        return None
    bars = _not_compute(T, idle, exposed_comm, exposed_memcpy)
    c = sum(compute.values())
    bars.append(Bar("compute", "compute (FLOP efficiency unknown)", c, c / T, _parts(compute, T)))
    return Waterfall(T, tuple(bars))


def combine(falls: list[Waterfall | None]) -> Waterfall | None:
    """Several windows (a rank's steps, a job's ranks) as one: each bar's time summed, its
    fraction the time-weighted mean."""
    falls = [w for w in falls if w is not None]
    if not falls:
        return None
    T = sum(w.window_ns for w in falls)
    out = []
    for i, b in enumerate(falls[0].bars):
        weighted = sum(w.bars[i].fraction * w.window_ns for w in falls)
        ns = sum(w.bars[i].ns for w in falls)
        parts: Counter[str] = Counter()
        for w in falls:
            parts.update({p["key"]: p["ns"] for p in w.bars[i].parts})
        if parts and sum(parts.values()) != ns:
            # a window whose bar had no parts (all its matmul time with FLOPs; a convention bar of rounding only)
            fill = WITH_FLOPS if b.key == "matmul_below_peak" else max(parts, key=lambda k: (abs(parts[k]), k))
            parts[fill] += ns - sum(parts.values())
        label, note = convention_text(dict(parts)) if b.key == "flop_convention" else (b.label, b.note)
        out.append(Bar(b.key, label, ns, weighted / T, _parts(dict(parts), T), note))
    return Waterfall(T, tuple(out))


def ending_at(fall: Waterfall, mfu: float) -> Waterfall:
    """``fall`` (a rank's steps combined) ending at ``mfu``, the MFU over the same window that
    also counts the FLOPs of steps whose GPU window is empty (their kernels ran in other steps'
    windows): those FLOPs are in no step's bars, so the convention bar takes them as a negative
    part (``NO_WINDOW``) and the fractions still sum to 1."""
    bars = list(fall.bars)
    T, last = fall.window_ns, bars[-1]
    i = next(j for j, b in enumerate(bars) if b.key == "flop_convention")
    conv, ns = bars[i], round(mfu * T)
    parts = {p["key"]: p["ns"] for p in conv.parts}
    parts[NO_WINDOW] = parts.get(NO_WINDOW, 0) - (ns - last.ns)
    parts[NO_WINDOW] += conv.ns - (ns - last.ns) - sum(parts.values())  # parts sum to the bar (one without parts: its rounding)
    label, note = convention_text(parts)
    bars[i] = Bar(conv.key, label, conv.ns - (ns - last.ns), conv.fraction - (mfu - last.fraction), _parts(parts, T), note)
    bars[-1] = Bar(last.key, last.label, ns, mfu)
    return Waterfall(T, tuple(bars))


def with_parts(fall: Waterfall, key: str, weights: dict[str, float], top: int = 12, keep: tuple[str, ...] = (NO_FLOPS,)) -> Waterfall:
    """Split bar ``key`` into parts in proportion to ``weights`` (the largest ``top``, the rest
    as "other"); integer ns that sum exactly to the bar.  Parts named in ``keep`` (the matmul
    time without FLOPs) stay as they are: only the rest of the bar is split."""
    bars = list(fall.bars)
    i = next((j for j, b in enumerate(bars) if b.key == key), None)
    total_w = sum(w for w in weights.values() if w > 0)
    if i is None or total_w <= 0 or bars[i].ns <= 0:
        return fall
    b = bars[i]
    kept = {p["key"]: p["ns"] for p in b.parts if p["key"] in keep}
    rest = b.ns - sum(kept.values())
    if rest <= 0:
        return fall
    ranked = sorted(((k, w) for k, w in weights.items() if w > 0), key=lambda kv: (-kv[1], kv[0]))
    head, tail = ranked[:top], ranked[top:]
    if tail:
        head.append(("other shapes", sum(w for _, w in tail)))
    ns = {k: int(rest * w // total_w) for k, w in head}
    ns[head[0][0]] += rest - sum(ns.values())
    bars[i] = Bar(b.key, b.label, b.ns, b.fraction, _parts({**kept, **ns}, fall.window_ns), b.note)
    return Waterfall(fall.window_ns, tuple(bars))
