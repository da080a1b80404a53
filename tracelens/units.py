"""Times and sizes as people read them."""

from __future__ import annotations


def fmt_ns(ns: int | None) -> str:
    if ns is None:
        return "-"
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1_000_000:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1_000:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns} ns"


def fmt_offset(ns: int) -> str:
    """A signed time offset: +12.5 ms, -3.0 µs."""
    return ("-" if ns < 0 else "+") + fmt_ns(abs(ns))


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def fmt_pct(v: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.1234 -> 12.3%; unknown -> "-"."""
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def fmt_pct2(v: float | None) -> str:
    return fmt_pct(v, 2)


def fmt_num(v: float | None, digits: int = 1) -> str:
    """A number with thousands separators; unknown -> "-"."""
    return "-" if v is None else f"{v:,.{digits}f}"
