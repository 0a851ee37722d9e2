"""The peak FLOP/s table: lookups by device name, specificity, unknowns, the docs page."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from instrument import peak_flops as peaks
from instrument.peak_flops import DTYPES, device_peak_flops, markdown_table, peak_flops

H100_SXM = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("name", "dtype", "tflops"),
    [
        (H100_SXM, "fp32", 67),
        (H100_SXM, "tf32", 494.7),
        (H100_SXM, "bf16", 989.4),
        (H100_SXM, "fp16", 989.4),
        (H100_SXM, "fp8", 1978.9),
        ("NVIDIA H100 PCIe", "fp32", 51),
        ("NVIDIA H100 PCIe", "tf32", 378),
        ("NVIDIA H100 PCIe", "bf16", 756),
        ("NVIDIA H100 PCIe", "fp8", 1513),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312),
        ("NVIDIA A100-PCIE-40GB", "fp16", 312),
        ("NVIDIA A100 80GB PCIe", "bf16", 312),
        ("NVIDIA A10", "fp32", 31.2),
        ("NVIDIA A10", "tf32", 62.5),
        ("NVIDIA A10", "bf16", 125),
        ("NVIDIA L4", "fp32", 30.3),
        ("NVIDIA L4", "tf32", 60),
        ("NVIDIA L4", "bf16", 121),
        ("NVIDIA L4", "fp8", 242.5),
        ("NVIDIA L40S", "fp32", 91.6),
        ("NVIDIA L40S", "tf32", 183),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L40S", "fp8", 733),
        ("Tesla V100-SXM2-16GB", "fp32", 15.7),
        ("Tesla V100-SXM2-16GB", "fp16", 125),
        ("Tesla V100-PCIE-32GB", "fp16", 112),
        ("Tesla V100S-PCIE-32GB", "fp16", 130),
        ("NVIDIA GeForce RTX 4090", "fp32", 82.6),
        ("NVIDIA GeForce RTX 4090", "tf32", 82.6),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("NVIDIA GeForce RTX 4090", "fp8", 330.3),
        ("NVIDIA B200", "bf16", 2250),
        ("NVIDIA B200", "fp8", 4500),
    ],
)
def test_known_devices(name: str, dtype: str, tflops: float) -> None:
    assert peak_flops(name, dtype) == pytest.approx(tflops * 1e12, rel=1e-12)


def test_default_dtype_is_bf16() -> None:
    assert peak_flops(H100_SXM) == peak_flops(H100_SXM, "bf16")


def test_more_specific_names_win() -> None:
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12  # not the A10's 125
    assert peak_flops("NVIDIA A10") == 125e12  # not the A100's 312
    assert peak_flops("NVIDIA H100 PCIe") == 756e12  # not the SXM's 989.4
    assert peak_flops("NVIDIA H100 NVL") == 835.5e12
    assert peak_flops("NVIDIA L4") == 121e12  # not the L40S's
    assert peak_flops("NVIDIA L40S") == 362.05e12


def test_case_does_not_matter() -> None:
    assert peak_flops("nvidia h100 pcie") == 756e12


@pytest.mark.parametrize(
    "name",
    [
        "",
        "cpu",
        "NVIDIA GeForce RTX 3090",
        "NVIDIA A10G",  # AWS part, not an A10
        "NVIDIA RTX A1000",  # not an A100
        "NVIDIA GB200",  # not a B200
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "AMD Instinct MI300X",
    ],
)
def test_unknown_devices_give_none(name: str) -> None:
    assert all(peak_flops(name, dtype) is None for dtype in DTYPES)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("Tesla V100-SXM2-16GB", "bf16"),
        ("Tesla V100-SXM2-16GB", "tf32"),
        ("Tesla V100-SXM2-16GB", "fp8"),
        ("NVIDIA A100-SXM4-80GB", "fp8"),
        ("NVIDIA A10", "fp8"),
        ("NVIDIA B200", "fp32"),
    ],
)
def test_dtype_not_listed_for_device_gives_none(name: str, dtype: str) -> None:
    assert peak_flops(name, dtype) is None


@pytest.mark.parametrize("dtype", ["float32", "BF16", "int8", ""])
def test_bad_dtype_raises(dtype: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown dtype '{dtype}'; expected one of 'fp32'"):
        peak_flops(H100_SXM, dtype)
    with pytest.raises(ValueError, match="unknown dtype"):
        device_peak_flops(dtype)


def test_device_peak_flops_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_peak_flops() is None


def test_device_peak_flops_looks_up_the_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(peaks, "in_bad_fork", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert device_peak_flops("fp8") == 1513e12
    monkeypatch.setattr(peaks, "in_bad_fork", lambda: True)  # a DataLoader worker
    assert device_peak_flops("fp8") is None


def test_table_rows_are_complete() -> None:
    assert all(len(row) == len(DTYPES) for _, _, row in peaks.TABLE)


def test_docs_page_shows_the_table() -> None:
    page = Path(__file__).parents[1] / "docs" / "peak_flops.md"
    assert markdown_table() in page.read_text(encoding="utf-8")
