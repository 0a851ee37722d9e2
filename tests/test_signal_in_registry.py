"""A signal that lands while the main thread is inside the registry (making a new path,
folding a full buffer: the registry lock held) still gets its flush: the exit flush of
SIGTERM, a user's handler that calls ``flush()`` (real processes, real signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import instrument
    from instrument import registry
    from instrument.sinks import JSONL

    reporter = instrument.Reporter(every=None, sinks=[JSONL(sys.argv[1])], memory=False)
    if sys.argv[2] == "user":
        signal.signal(signal.SIGUSR1, lambda *_: print(len(reporter.flush()), flush=True))
    for _ in range(3):
        with instrument.timed("work"):
            pass
        instrument.step()
    with registry._lock:  # where a new path is made or a full buffer folded
        os.kill(os.getpid(), signal.SIGTERM if sys.argv[2] == "term" else signal.SIGUSR1)
        time.sleep(0.5)
    print("went on", flush=True)
    """
)


def _run(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    out = tmp_path / "run.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), how],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, lines


@pytest.mark.timeout(90)
def test_sigterm_inside_the_registry_still_delivers_the_last_interval(tmp_path: Path) -> None:
    done, lines = _run(tmp_path, "term")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "did not finish" not in done.stderr
    assert [line["steps"] for line in lines] == [3]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_user_handler_that_flushes_inside_the_registry_does_not_hang(tmp_path: Path) -> None:
    done, lines = _run(tmp_path, "user")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "went", "on"]  # one path flushed, then the program
    assert [line["steps"] for line in lines][:1] == [3]
