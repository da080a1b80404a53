"""Dense peak FLOP/s and memory bandwidth per GPU (MFU.md 3), and telling which GPU a trace
ran on (MFU.md 3.1).  Peaks are datasheet dense numbers (no sparsity), TFLOP/s; bandwidth TB/s.
An unknown GPU gives None: MFU is then null with a warning, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_tflops: dict[str, float]  # dtype -> dense TFLOP/s (bf16, fp16, tf32, fp32, fp8)
    mem_tbps: float | None
    sms: int | None  # full-part SM (CU) count, for MIG / partition scaling
    scale: float = 1.0  # numSms / full count when the trace shows a partition
    notes: tuple[str, ...] = field(default_factory=tuple)

    def peak(self, dtype: str = "bf16") -> float | None:
        """Dense FLOP/s for a dtype (bf16 falls back to fp16 on parts without bf16)."""
        p = self.peak_tflops.get(dtype)
        if p is None and dtype == "bf16":
            p = self.peak_tflops.get("fp16")
        return None if p is None else p * 1e12 * self.scale

    @property
    def reference_dtype(self) -> str:
        return "bf16" if "bf16" in self.peak_tflops else "fp16"

    def op_peak(self, dtype: str | None) -> float | None:
        """FLOP/s an op of this dtype (tracelens.analysis.rank.flops.DTYPES) can reach: its own dense peak
        (fp64 counted at fp32), else the reference peak."""
        own = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp32": "fp32", "fp8": "fp8", "fp64": "fp32"}.get(dtype or "")
        return (self.peak(own) if own else None) or self.peak(self.reference_dtype)

    def op_peaks(self, dtypes) -> dict:
        """op_peak for each dtype, as a replace_strict mapping."""
        return {d: self.op_peak(d) for d in dtypes}


def _g(name, bf16, fp16, tf32, fp32, fp8, bw, sms):
    peaks = {k: v for k, v in (("bf16", bf16), ("fp16", fp16), ("tf32", tf32), ("fp32", fp32), ("fp8", fp8)) if v}
    return GpuSpec(name, peaks, bw, sms)


# Ordered: the first pattern that matches the lower-cased device name wins (MFU.md 3.1).
TABLE: tuple[tuple[str, GpuSpec], ...] = (
    (r"gb200", _g("NVIDIA GB200", 2500, 2500, 1250, 90, 5000, 8.0, 148)),
    (r"\bb200", _g("NVIDIA B200", 2250, 2250, 1100, 80, 4500, 8.0, 148)),
    (r"\bb100", _g("NVIDIA B100", 1750, 1750, 900, 60, 3500, 8.0, None)),
    (r"gh200", _g("NVIDIA GH200", 989, 989, 494, 67, 1979, 4.0, 132)),
    (r"h200.*nvl", _g("NVIDIA H200 NVL", 835, 835, 418, 60, 1671, 4.8, 132)),
    (r"h200", _g("NVIDIA H200 SXM", 989.4, 989.4, 494.7, 66.9, 1978.9, 4.8, 132)),
    (r"h100.*nvl", _g("NVIDIA H100 NVL", 835, 835, 418, 60, 1671, 3.9, 132)),
    (r"h100.*pcie", _g("NVIDIA H100 PCIe", 756, 756, 378, 51.2, 1513, 2.0, 114)),
    (r"h100", _g("NVIDIA H100 SXM", 989.4, 989.4, 494.7, 66.9, 1978.9, 3.35, 132)),
    (r"\bh20\b", _g("NVIDIA H20", 148, 148, 74, 44, 296, 4.0, 78)),
    (r"a100.*40gb", _g("NVIDIA A100 40GB", 312, 312, 156, 19.5, None, 1.555, 108)),
    (r"a100", _g("NVIDIA A100", 312, 312, 156, 19.5, None, 2.039, 108)),
    (r"a10g", _g("NVIDIA A10G", 70, 70, 35, 35, None, 0.60, 80)),
    (r"\ba10\b", _g("NVIDIA A10", 125, 125, 62.5, 31.2, None, 0.60, 72)),
    (r"l40s", _g("NVIDIA L40S", 362, 362, 183, 91.6, 733, 0.864, 142)),
    (r"\bl4\b", _g("NVIDIA L4", 121, 121, 60, 30.3, 242, 0.30, 58)),
    (r"rtx 4090", _g("NVIDIA RTX 4090", 165.2, 165.2, 82.6, 82.6, 330.3, 1.008, 128)),
    (r"rtx 3090", _g("NVIDIA RTX 3090", 71, 71, 35.6, 35.6, None, 0.936, 82)),
    (r"v100s", _g("NVIDIA V100S PCIe", None, 130, None, 16.4, None, 1.134, 80)),
    (r"v100.*pcie", _g("NVIDIA V100 PCIe", None, 112, None, 14.0, None, 0.90, 80)),
    (r"v100", _g("NVIDIA V100 SXM2", None, 125, None, 15.7, None, 0.90, 80)),
    (r"mi355x", _g("AMD Instinct MI355X", 2516.6, 2516.6, None, 157.3, 5033, 8.0, 256)),
    (r"mi325x", _g("AMD Instinct MI325X", 1307.4, 1307.4, 653.7, 163.4, 2614.9, 6.0, 304)),
    (r"mi300x", _g("AMD Instinct MI300X", 1307.4, 1307.4, 653.7, 163.4, 2614.9, 5.3, 304)),
    (r"mi250x", _g("AMD Instinct MI250X (one GCD)", 191.5, 191.5, None, 47.9, None, 1.64, 110)),
)


# Parts sold under their own name whose dense peaks are a sibling's (the China export parts: the
# same chip and clocks, less NVLink bandwidth): the spec is named for the part itself, its peaks
# are the sibling row's, and a note says so.  Matched before TABLE, first match wins.
SIBLINGS: tuple[tuple[str, str, str], ...] = (
    (r"h800.*pcie", "NVIDIA H800 PCIe", "NVIDIA H100 PCIe"),
    (r"h800", "NVIDIA H800", "NVIDIA H100 SXM"),
    (r"a800.*40gb", "NVIDIA A800 40GB", "NVIDIA A100 40GB"),
    (r"a800", "NVIDIA A800", "NVIDIA A100"),
)


def lookup(name: str) -> GpuSpec | None:
    low = name.lower()
    for pattern, own, sibling in SIBLINGS:
        if re.search(pattern, low):
            base = next(spec for _, spec in TABLE if spec.name == sibling)
            return replace(base, name=own, notes=base.notes + (f"peaks of the {sibling}, the same chip",))
    for pattern, spec in TABLE:
        if re.search(pattern, low):
            return spec
    return None


def identify(properties: dict, name: str | None) -> tuple[GpuSpec | None, str | None]:
    """The spec of a trace's device, scaled for MIG / partitions; (None, why) when unknown."""
    if not name:
        if isinstance(properties, dict) and properties:  # an entry whose name is missing or not text (the parser warns)
            return None, "the trace's deviceProperties give no usable GPU name (give --gpu NAME or --peak-tflops X)"
        return None, "the trace names no GPU (no deviceProperties)"
    spec = lookup(name)
    if spec is None:
        return None, f"GPU {name!r} is not in tracelens' peak table (give --gpu NAME or --peak-tflops X)"
    sms = properties.get("numSms") if isinstance(properties, dict) else None
    if isinstance(sms, int) and spec.sms and 0 < sms < spec.sms:
        spec = replace(spec, scale=sms / spec.sms, notes=spec.notes + (f"{sms} of {spec.sms} SMs: a MIG slice or partition; peaks scaled",))
    return spec, None


def fastest() -> tuple[str, float]:
    """The GPU of the peak table with the highest dense peak at any dtype, and that peak in
    FLOP/s: a bound no step of any GPU can pass, for checking numbers when the GPU is unknown."""
    spec = max((spec for _, spec in TABLE), key=lambda g: max(g.peak_tflops.values()))
    return spec.name, max(spec.peak_tflops.values()) * 1e12


USER_PEAK = "user-given peak"  # the name of a spec that is only a peak the user gave (no GPU named)


def override(spec: GpuSpec | None, gpu: str | None, peak_tflops: float | None,
             given_by: str = "--gpu") -> tuple[GpuSpec | None, str | None]:
    """Apply --gpu NAME and --peak-tflops X (``given_by``: where the name came from, for the message)."""
    why = None
    if gpu:
        spec = lookup(gpu)
        if spec is None:
            where = "--gpu" if given_by == "--gpu" else f"gpu in {given_by}"
            return None, f"{where} {gpu!r} is not in tracelens' peak table (give peak_tflops instead)"
    if peak_tflops:
        base = spec or GpuSpec(USER_PEAK, {}, None, None)
        spec = replace(base, peak_tflops={**base.peak_tflops, "bf16": peak_tflops}, scale=1.0, notes=(f"peak {peak_tflops} TFLOP/s given by the user",))
    return spec, why
