"""The GPU-time arithmetic on interval lists, one window at a time: the definitions that
``tracelens.analysis.rank.segments`` (every window at once, in polars) is held to by the property tests.

``partition`` is DESIGN 4.2's partition of a window; ``exclusive`` splits the part of a set of
intervals under some labelled spans among the labels (each elementary segment shared equally
by the spans active in it, in integers, the remainder to the label with most spans, then the
greatest label), as the waterfall's exposed-communication and non-matmul bars are split.
"""

from __future__ import annotations

from bisect import bisect_right

from tracelens.analysis import GpuTime
from tracelens.analysis import intervals as iv


def partition(C: iv.Intervals, M: iv.Intervals, Y: iv.Intervals, start: int, end: int) -> GpuTime:
    """The exact GPU-time partition of the window [start, end)."""
    c = iv.clip(C, start, end)
    m = iv.clip(M, start, end)
    y = iv.clip(Y, start, end)
    window = max(end - start, 0)
    x = iv.subtract(m, c)  # exposed communication
    z = iv.subtract(iv.subtract(y, c), m)  # exposed copies: Y \ (C ∪ M)
    # C, X and Z are disjoint and their union is the busy time, so idle is what is left
    compute, exposed_comm, exposed_memcpy = iv.length(c), iv.length(x), iv.length(z)
    return GpuTime(
        window=window,
        idle=window - compute - exposed_comm - exposed_memcpy,
        compute=compute,
        exposed_comm=exposed_comm,
        exposed_memcpy=exposed_memcpy,
        comm=iv.length(m),
        memcpy=iv.length(y),
    )


def exclusive(spans: list[tuple[int, int, str]], within: iv.Intervals) -> dict[str, int]:
    """Split the length of ``within`` under the spans among their labels: each elementary segment
    (between consecutive span ends) is shared equally by the spans active in it, in exact
    integers (a remainder goes to the label with most spans, then the greatest label).  Labels
    whose share is 0 are left out.  One sort and one sweep; the length of ``within`` inside a
    segment comes from its running total (two bisections), however many pieces it has."""
    if not within or not spans:
        return {}
    lo, hi = within[0][0], within[-1][1]
    pts = []
    add = pts.append
    for s, e, label in spans:
        if s < lo:
            s = lo
        if e > hi:
            e = hi
        if s < e:
            add((s, 1, label))
            add((e, -1, label))
    if not pts:
        return {}
    pts.sort()
    starts = [a for a, _ in within]
    before = [0]  # before[i]: the length of within[:i]
    for a, b in within:
        before.append(before[-1] + b - a)

    def measure(t: int) -> int:  # the length of within before t
        i = bisect_right(starts, t) - 1
        if i < 0:
            return 0
        a, b = within[i]
        return before[i] + (t - a if t < b else b - a)

    out: dict[str, int] = {}
    active: dict[str, int] = {}
    n = 0
    prev_t, prev_m = None, 0
    for t, d, label in pts:
        if t != prev_t:
            m = measure(t)
            if n and m > prev_m:
                length = m - prev_m
                if len(active) == 1:
                    for lb in active:
                        out[lb] = out.get(lb, 0) + length
                else:
                    rest = length
                    for lb, c in active.items():
                        share = length * c // n
                        out[lb] = out.get(lb, 0) + share
                        rest -= share
                    if rest:
                        top = max(active, key=lambda lb: (active[lb], lb))
                        out[top] += rest
            prev_t, prev_m = t, m
        c = active.get(label, 0) + d
        if c:
            active[label] = c
        else:
            del active[label]
        n += d
    return {k: v for k, v in out.items() if v}


def recomputed(ops: list[tuple[int, int, str]]) -> list[int]:
    """The outermost recomputed forward ops of one thread (indices into ``ops``: (start, end,
    name)), by a stack walk: ops sorted by start (longer first) nest; a forward op under an
    evaluate_function with no recomputed op above it is one."""
    from tracelens.analysis.rank.recompute import _EVAL, FORWARD

    order = sorted(range(len(ops)), key=lambda i: (ops[i][0], -ops[i][1]))
    out, stack = [], []  # (end, under evaluate_function, under a recomputed op)
    for i in order:
        s, e, name = ops[i]
        while stack and stack[-1][0] <= s:
            stack.pop()
        in_eval, in_rec = (stack[-1][1], stack[-1][2]) if stack else (False, False)
        mine = in_eval and not in_rec and name in FORWARD
        if mine:
            out.append(i)
        stack.append((e, in_eval or name.startswith(_EVAL), in_rec or mine))
    return sorted(out)
