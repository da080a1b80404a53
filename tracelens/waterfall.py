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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["parts"] = list(self.parts)
        return d


def _parts(values: dict[str, int], T: int) -> tuple[dict[str, Any], ...]:
    items = sorted(((k, v) for k, v in values.items() if v), key=lambda kv: (-kv[1], kv[0]))
    return tuple({"key": k, "label": k, "ns": v, "fraction": v / T} for k, v in items)


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
) -> Waterfall | None:
    """The bars of one window.  ``ideal_ns`` is the time the matmul FLOPs would take at each
    op's own dtype peak; ``mfu`` uses the reference peak."""
    if T <= 0:
        return None
    bars = _not_compute(T, idle, exposed_comm, exposed_memcpy)
    bars.append(Bar("recompute", "recompute (activation checkpointing)", recompute, recompute / T))
    nm = sum(non_matmul.values())
    bars.append(Bar("non_matmul", "non-matmul kernels", nm, nm / T, _parts(non_matmul, T)))
    ideal = min(float(ideal_ns), float(matmul_ns))  # FLOPs beyond the kernel time: convention bar
    below = matmul_ns - ideal
    bars.append(Bar("matmul_below_peak", "matmul below peak", round(below), below / T))
    bars.append(Bar("flop_convention", "FLOP convention / precision (signed)", round(ideal - mfu * T), ideal / T - mfu))
    bars.append(Bar("mfu", "MFU", round(mfu * T), mfu))
    return Waterfall(T, tuple(bars))


def _not_compute(T: int, idle: dict[str, int], exposed_comm: dict[str, int], exposed_memcpy: int) -> list[Bar]:
    """The bars both waterfalls start with: the idle split, the pipeline bubble, exposed
    communication (by group) and exposed memcpy."""
    bars: list[Bar] = []
    for key, label in IDLE_BARS:
        bars.append(Bar(f"idle_{key}", label, idle.get(key, 0), idle.get(key, 0) / T))
    pp = idle.get("pipeline_bubble", 0)
    bars.append(Bar("pipeline_bubble", "pipeline bubble", pp, pp / T))
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
        out.append(Bar(b.key, b.label, ns, weighted / T, _parts(dict(parts), T)))
    return Waterfall(T, tuple(out))


def with_parts(fall: Waterfall, key: str, weights: dict[str, float], top: int = 12) -> Waterfall:
    """Split bar ``key`` into parts in proportion to ``weights`` (the largest ``top``, the rest
    as "other"); integer ns that sum exactly to the bar."""
    bars = list(fall.bars)
    i = next((j for j, b in enumerate(bars) if b.key == key), None)
    total_w = sum(w for w in weights.values() if w > 0)
    if i is None or total_w <= 0 or bars[i].ns <= 0:
        return fall
    b = bars[i]
    ranked = sorted(((k, w) for k, w in weights.items() if w > 0), key=lambda kv: (-kv[1], kv[0]))
    head, tail = ranked[:top], ranked[top:]
    if tail:
        head.append(("other shapes", sum(w for _, w in tail)))
    ns = {k: int(b.ns * w // total_w) for k, w in head}
    ns[head[0][0]] += b.ns - sum(ns.values())
    bars[i] = Bar(b.key, b.label, b.ns, b.fraction, _parts(ns, fall.window_ns))
    return Waterfall(fall.window_ns, tuple(bars))
