"""Dense peak throughput of common NVIDIA GPUs, per dtype, in FLOP/s: the denominator of MFU.

Figures are NVIDIA datasheet (or architecture whitepaper) numbers **without sparsity** -
datasheets mark the 2:4-sparse figures with an asterisk; those are twice these. ``fp32`` is
the CUDA-core rate (plain float32 math with TF32 off); ``tf32``, ``bf16``, ``fp16`` and
``fp8`` are tensor-core rates with FP32 accumulation. ``None`` means the GPU lacks the
format (V100 has no TF32/BF16, Ampere no FP8) or that no figure is known well enough to
list: an unknown device, or a dtype not listed for it, gives ``None``, never a guess.

A device matches the first row whose pattern is found in ``torch.cuda.get_device_name()``
(case-insensitive, whole words: "A10" does not match "A100" or "A10G"); more specific rows
come first. :data:`TABLE` holds the figures in TFLOP/s; :func:`markdown_table` renders it
for ``docs/peak_flops.md``.

A MIG slice has a fraction of its GPU's compute: a name with "MIG" in it gives ``None``.
There, and for any GPU not listed, pass ``Reporter(peak_flops=...)``.
"""

from __future__ import annotations

import re

import torch

from instrument.clocks import in_bad_fork

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""The dtypes :func:`peak_flops` knows, in table column order."""

_Row = tuple[str, str, tuple[float | None, ...]]  # (pattern, label, TFLOP/s per DTYPES)

_H100_SXM = (67.0, 494.7, 989.4, 989.4, 1978.9)  # whitepaper dense values (datasheet x2 sparse)
# H100 NVL / H200 NVL datasheets (per GPU): 60 FP32, 835* TF32, 1671* BF16/FP16, 3341* FP8;
# the dense values are those sparse figures halved (no dense figure is published).
_NVL = (60.0, 417.5, 835.5, 835.5, 1670.5)
_NONE = (None, None, None, None, None)

TABLE: tuple[_Row, ...] = (
    (r"\bMIG\b", "any MIG slice", _NONE),  # e.g. "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    (r"\bGH200\b", "GH200", _H100_SXM),  # GH200 datasheet: same Hopper figures as H100 SXM
    (r"\bH200 NVL\b", "H200 NVL", _NVL),
    (r"\bH200\b", "H200 (SXM)", _H100_SXM),
    (r"\bH100 NVL\b", "H100 NVL", _NVL),
    (r"\bH100 PCIe\b", "H100 PCIe", (51.0, 378.0, 756.0, 756.0, 1513.0)),
    (r"\bH100\b", "H100 SXM", _H100_SXM),  # "NVIDIA H100 80GB HBM3"
    # B200 (HGX B200 datasheet, 4.5 PFLOP/s FP16/BF16 and 9 FP8 with sparsity). FP32 and TF32
    # left out: the published per-GPU figures changed between datasheet revisions.
    (r"\bB200\b", "B200", (None, None, 2250.0, 2250.0, 4500.0)),
    (r"\bA100\b", "A100 (SXM and PCIe)", (19.5, 156.0, 312.0, 312.0, None)),
    # A10G (AWS) is a different part from the A10; no NVIDIA datasheet figures to list.
    (r"\bA10G\b", "A10G", _NONE),
    (r"\bA10\b", "A10", (31.2, 62.5, 125.0, 125.0, None)),
    (r"\bL40S\b", "L40S", (91.6, 183.0, 362.05, 362.05, 733.0)),
    (r"\bL4\b", "L4", (30.3, 60.0, 121.0, 121.0, 242.5)),
    (r"\bV100S\b", "V100S PCIe", (16.4, None, None, 130.0, None)),
    (r"\bV100[- ]PCIe\b", "V100 PCIe", (14.0, None, None, 112.0, None)),
    (r"\bV100\b", "V100 (SXM2)", (15.7, None, None, 125.0, None)),
    # Cut-down and mobile parts with their own (lower) figures, not listed here.
    (r"\bRTX 4090 (D|Laptop)\b", "RTX 4090 D / Laptop", _NONE),
    # Ada whitepaper, FP32 accumulate (FP16 accumulate is twice as fast on GeForce).
    (r"\bRTX 4090\b", "RTX 4090", (82.6, 82.6, 165.2, 165.2, 330.3)),
)
"""``(pattern, label, TFLOP/s per dtype in DTYPES order)``, most specific first."""

_COMPILED = tuple((re.compile(pattern, re.IGNORECASE), peaks) for pattern, _, peaks in TABLE)


def _column(dtype: str) -> int:
    if dtype not in DTYPES:
        raise ValueError(
            f"unknown dtype {dtype!r}; expected one of 'fp32', 'tf32', 'bf16', 'fp16', 'fp8'"
        )
    return DTYPES.index(dtype)


def peak_flops(device_name: str, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of the GPU named ``device_name`` for ``dtype``, or ``None`` if unknown.

    Args:
        device_name: As ``torch.cuda.get_device_name()`` returns it, e.g. "NVIDIA H100 PCIe".
        dtype: One of "fp32", "tf32", "bf16", "fp16", "fp8".

    Example:
        >>> peak_flops("NVIDIA A100-SXM4-80GB")
        312000000000000.0
        >>> peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # V100 has no BF16 tensor cores
        True
    """
    column = _column(dtype)
    for pattern, peaks in _COMPILED:
        if pattern.search(device_name):
            tflops = peaks[column]
            return None if tflops is None else tflops * 1e12
    return None


def device_peak_flops(dtype: str = "bf16") -> float | None:
    """:func:`peak_flops` for the current CUDA device; ``None`` without CUDA.

    In a process forked from a CUDA parent (a DataLoader worker) CUDA cannot be used, and this
    returns ``None`` too. It may initialise CUDA, so call it at flush, not at import.
    """
    _column(dtype)
    if not torch.cuda.is_available() or in_bad_fork():
        return None
    return peak_flops(torch.cuda.get_device_name(), dtype)


def markdown_table() -> str:
    """The table as GitHub markdown, in TFLOP/s ("-": not supported or not known)."""
    lines = [
        "| GPU | " + " | ".join(DTYPES) + " |",
        "| --- | " + " | ".join("---:" for _ in DTYPES) + " |",
    ]
    for _, label, peaks in TABLE:
        cells = ("-" if tflops is None else f"{tflops:g}" for tflops in peaks)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
