"""The examples run as a user would run them, and print what the README shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
    text = out.stdout
    assert text.count("step (10 steps)") == 2
    for name in ("forward", "encoder", "head", "backward", "optimizer", "data", "(other)"):
        assert name in text
    assert "final loss" in text


@pytest.mark.timeout(180)
def test_train_lm_prints_the_auto_tree() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_lm.py"), "--steps", "6", "--every", "3"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.count("step (3 steps)") == 2
    for name in ("forward", "encoder", "layers.0", "self_attn", "backward", "optimizer"):
        assert name in text
    for name in ("zero_grad", "data", "(other)", "final loss", "tokens/s", "TFLOP/s"):
        assert name in text
