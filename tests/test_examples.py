"""The examples run as a user would run them, and print what the README shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from distributed_helpers import free_port

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.timeout(180)
def test_quickstart_prints_a_timing_tree_every_interval() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--steps", "20", "--every", "10"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    text = out.stdout
    assert text.count("step (10 steps)") == 2
    for name in ("forward", "encoder", "head", "backward", "optimizer", "data", "(other)"):
        assert name in text
    assert "final loss" in text


@pytest.mark.slow  # trains a small language model: about 20 s
@pytest.mark.timeout(180)
def test_train_lm_prints_the_auto_tree_without_warnings_and_saves_the_run(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_lm.py"), "--steps", "6", "--every", "3"],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning on a CPU (no MFU there, quietly)
    saved = tmp_path / "runs" / "train_lm.jsonl"
    assert len(saved.read_text(encoding="utf-8").splitlines()) == 2
    assert out.stdout.endswith("  python -m instrument html runs/train_lm.jsonl\n")
    text = out.stdout
    assert text.count("step (3 steps)") == 2
    for name in ("forward", "encoder", "layers.0", "self_attn", "backward", "optimizer"):
        assert name in text
    for name in ("zero_grad", "data", "(other)", "final loss", "tokens/s", "TFLOP/s"):
        assert name in text


@pytest.mark.slow  # two ranks under torchrun
@pytest.mark.timeout(240)
def test_ddp_torchrun_names_the_straggler() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += [f"--master_port={free_port()}", str(EXAMPLES / "ddp_torchrun.py")]
    command += ["--steps", "10", "--every", "5", "--straggler-ms", "40"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert text.count("step (5 steps)") == 2  # rank 0 prints; rank 1 does not
    assert "ranks: minmax" in text
    assert "slowest" in text
    data_rows = [
        line.split() for line in text.splitlines() if line.lstrip("├└─│ ").startswith("data")
    ]
    assert data_rows
    assert all(row[-1] == "1" for row in data_rows)
