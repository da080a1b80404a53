"""Times and sizes as people read them."""

from __future__ import annotations


def fmt_ns(ns: int | None) -> str:
    if ns is None:
        return "-"
    if ns < 0:  # a signed part (the FLOP-convention bar's)
        return "-" + fmt_ns(-ns)
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
    """A fraction as a percentage: 0.1234 -> 12.3%; unknown -> "-"; never "-0.0%" (a tiny
    negative share rounds to zero like a tiny positive one)."""
    if v is None:
        return "-"
    out = f"{100 * v:.{digits}f}%"
    return out[1:] if out[0] == "-" and not out.strip("-0.%") else out


def fmt_points(delta: float, digits: int = 2) -> str:
    """A change of a share in percentage points, signed: +1.25, -0.40; "0.00" when it rounds to zero."""
    out = f"{100 * delta:+.{digits}f}"
    return out[1:] if not out.strip("+-0.") else out


def fmt_pct2(v: float | None) -> str:
    return fmt_pct(v, 2)


def fmt_num(v: float | None, digits: int = 1) -> str:
    """A number with thousands separators; unknown -> "-"."""
    return "-" if v is None else f"{v:,.{digits}f}"


_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}


def parse_count(text: str, what: str = "the number") -> float:
    """A positive count as people type it: "4.2e15", "4.2P", "4.2 PFLOP", "980T", "1,200G" ->
    4.2e15, 4.2e15, 4.2e15, 9.8e14, 1.2e12.  ValueError (saying what was expected) otherwise."""
    import math
    import re

    m = re.fullmatch(r"\s*([0-9][0-9,_]*\.?[0-9]*(?:e[+-]?[0-9]+)?)\s*([kmgtpe]?)(?:flops?)?\s*", text.lower())
    value = float(m.group(1).replace(",", "").replace("_", "")) * _SI[m.group(2)] if m else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what}: {text.strip()!r} is not a positive number (e.g. 4.2e15 or 4.2P)")
    return value
