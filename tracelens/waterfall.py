"""The MFU loss waterfall (MFU.md 9.7): from 100% of the GPU's dense peak down to the MFU,
one bar per cause, as disjoint intervals of GPU time plus the ideal-vs-actual matmul split.

With T the window, the bars are the idle split (data loading, host launch, sync drain, launch
latency, other), the pipeline bubble, exposed communication (by process group), exposed memcpy,
recompute (compute time of recomputed forward ops), non-matmul compute (by kernel class), matmul below peak (matmul time minus the time its FLOPs
would take at peak), the signed FLOP-convention bar (ideal matmul time / T minus MFU: precision
and counting conventions) and the MFU.  Everything but the last two is a length of GPU time,
and those lengths partition T; so the fractions sum to exactly 1 (up to float rounding).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from tracelens import intervals as iv

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


def exclusive(spans: list[tuple[int, int, str]], within: iv.Intervals) -> dict[str, int]:
    """Split the length of ``within`` among labels: each elementary segment is shared equally by
    the spans active in it (exact integers; a remainder goes to the label with most spans)."""
    if not within or not spans:
        return {}
    lo, hi = within[0][0], within[-1][1]
    fast = _exclusive_disjoint(spans, within, lo, hi)
    return fast if fast is not None else _exclusive_sweep(spans, within, lo, hi)


def _exclusive_sweep(spans: list[tuple[int, int, str]], within: iv.Intervals, lo: int, hi: int) -> dict[str, int]:
    """The general case: a sweep over the span ends, sharing each segment among its active spans."""
    points: list[tuple[int, int, str]] = []
    for s, e, label in spans:
        s, e = max(s, lo), min(e, hi)
        if s < e:
            points.append((s, 1, label))
            points.append((e, -1, label))
    points.sort(key=lambda p: (p[0], p[1]))
    out: Counter[str] = Counter()
    active: Counter[str] = Counter()
    j = 0
    prev = None
    for t, delta, label in points:
        if prev is not None and t > prev and active:
            # the part of [prev, t) inside `within`
            length = 0
            while j < len(within) and within[j][1] <= prev:
                j += 1
            k = j
            while k < len(within) and within[k][0] < t:
                length += min(within[k][1], t) - max(within[k][0], prev)
                k += 1
            if length:
                n = sum(active.values())
                shares = {lb: length * c // n for lb, c in active.items()}
                rest = length - sum(shares.values())
                if rest:
                    top = max(active, key=lambda lb: (active[lb], lb))
                    shares[top] += rest
                out.update(shares)
        active[label] += delta
        if active[label] == 0:
            del active[label]
        prev = t
    return dict(out)


def _exclusive_disjoint(spans: list[tuple[int, int, str]], within: iv.Intervals, lo: int, hi: int) -> dict[str, int] | None:
    """The common case: no two spans overlap (one stream of work), so each span keeps its own
    overlap with ``within``; one merge pass.  None when some spans overlap (shared segments)."""
    ordered = sorted((max(s, lo), min(e, hi), label) for s, e, label in spans if s < hi and e > lo)
    out: dict[str, int] = {}
    reach = lo
    j, n = 0, len(within)
    for s, e, label in ordered:
        if s >= e:
            continue
        if s < reach:
            return None
        reach = e
        while j < n and within[j][1] <= s:
            j += 1
        k, got = j, 0
        while k < n and within[k][0] < e:
            got += min(within[k][1], e) - max(within[k][0], s)
            k += 1
        if got:
            out[label] = out.get(label, 0) + got
    return out


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
    bars: list[Bar] = []
    for key, label in IDLE_BARS:
        bars.append(Bar(f"idle_{key}", label, idle.get(key, 0), idle.get(key, 0) / T))
    pp = idle.get("pipeline_bubble", 0)
    bars.append(Bar("pipeline_bubble", "pipeline bubble", pp, pp / T))
    xc = sum(exposed_comm.values())
    bars.append(Bar("exposed_comm", "exposed communication", xc, xc / T, _parts(exposed_comm, T)))
    bars.append(Bar("exposed_memcpy", "exposed memcpy / memset", exposed_memcpy, exposed_memcpy / T))
    bars.append(Bar("recompute", "recompute (activation checkpointing)", recompute, recompute / T))
    nm = sum(non_matmul.values())
    bars.append(Bar("non_matmul", "non-matmul kernels", nm, nm / T, _parts(non_matmul, T)))
    ideal = min(float(ideal_ns), float(matmul_ns))  # FLOPs beyond the kernel time: convention bar
    below = matmul_ns - ideal
    bars.append(Bar("matmul_below_peak", "matmul below peak", round(below), below / T))
    bars.append(Bar("flop_convention", "FLOP convention / precision (signed)", round(ideal - mfu * T), ideal / T - mfu))
    bars.append(Bar("mfu", "MFU", round(mfu * T), mfu))
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
