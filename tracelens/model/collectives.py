"""Collective names, element sizes and the nccl-tests bandwidth formulas (FORMATS.md 4.2)."""

from __future__ import annotations

import re

# PyTorch ``Collective name`` values, NCCL names, kernel tokens -> one vocabulary.
_ALIASES = {
    "allreduce": "allreduce",
    "all_reduce": "allreduce",
    "allreduce_coalesced": "allreduce",
    "allgather": "allgather",
    "all_gather": "allgather",
    "_allgather_base": "allgather",
    "_all_gather_base": "allgather",  # ProcessGroupNCCL's profiling title (nccl:_all_gather_base)
    "allgather_into_tensor": "allgather",
    "all_gather_into_tensor": "allgather",
    "allgather_into_tensor_coalesced": "allgather",
    "allgather_coalesced": "allgather",
    "reducescatter": "reducescatter",
    "reduce_scatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_base": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "reduce_scatter_tensor_coalesced": "reducescatter",
    "alltoall": "alltoall",
    "all_to_all": "alltoall",
    "all_to_allv": "alltoall",
    "alltoall_base": "alltoall",
    "all_to_all_single": "alltoall",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "sendrecv": "sendrecv",
    "barrier": "barrier",
    "coalesced": "coalesced",
    "wait": "wait",
}

COLLECTIVE_ALIASES = _ALIASES  # (read-only) every spelling -> the normalised name

P2P = frozenset({"send", "recv", "sendrecv"})

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "i32": 4, "uint32": 4,
    "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "i64": 8, "uint64": 8,
    "half": 2, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1, "i8": 1, "u8": 1, "fp16": 2, "fp32": 4, "tf32": 4, "fp64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "fp8": 1,
    "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    # C type names, as older profilers record a tensor's ``Input type`` (``unsigned char``, ``long int``)
    "unsigned char": 1, "signed char": 1, "short int": 2, "unsigned short": 2, "unsigned int": 4,
    "long int": 8, "long long": 8, "long long int": 8, "unsigned long": 8, "unsigned long long": 8,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::half>": 4,
}


def normalize_collective(name: str | None) -> str | None:
    if not name:
        return None
    key = name.strip().lower()
    if key.startswith("nccl:"):
        key = key[5:]
    key = re.sub(r"\s.*$", "", key)  # "send 0->1"
    return _ALIASES.get(key, _ALIASES.get(key.replace("_", ""), key))


def dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    low = dtype.strip().lower()
    key = low.removeprefix("c10::").removeprefix("torch.").removeprefix("nccl")
    return _DTYPE_BYTES.get(key, _DTYPE_BYTES.get(low))


def bus_factor(collective: str | None, nranks: int | None) -> float | None:
    """busbw = algbw x factor (nccl-tests ``*GetBw``)."""
    if collective is None or not nranks or nranks < 1:
        return None
    n = nranks
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send", "recv", "sendrecv", "gather", "scatter"):
        return 1.0
    return None
