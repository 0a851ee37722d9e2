"""When a rank dies mid-run, the others' errors leave at once, and their later flushes do
not wait the whole ``rank_timeout`` again (2 real gloo ranks)."""

from __future__ import annotations

import os
import time
import traceback

import pytest
import torch
from distributed_helpers import run_ranks
from torch import nn

import instrument

#: ``auto``'s reporter's ``rank_timeout`` (its default).
RANK_TIMEOUT = 60.0


def _ddp_until_the_peer_dies(rank: int, world_size: int) -> dict[str, object] | None:
    """DDP under ``with instrument.auto(...)``; rank 1 dies at the fourth step: rank 0's
    all-reduce fails. Returns how long the error took to leave the block, and its text."""
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    failed_at = 0.0
    try:
        with instrument.auto(model, optimizer, every=2, ranks="minmax", sinks=[]):
            for step in range(20):
                if rank == 1 and step == 3:
                    os._exit(0)  # killed: no atexit, no reporter closed
                loss = model(torch.randn(16, 32)).pow(2).mean()
                try:
                    loss.backward()
                except RuntimeError:
                    failed_at = time.perf_counter()
                    raise
                optimizer.step()
                optimizer.zero_grad()
    except RuntimeError as error:
        return {
            "held_s": time.perf_counter() - failed_at,
            "message": str(error),
            "traceback": traceback.format_exc(),
        }
    return None


@pytest.mark.timeout(150)
def test_a_dying_peer_s_error_leaves_at_once() -> None:
    """The closing flush on the way out is this rank's own: no wait for the dead rank."""
    result = run_ranks(_ddp_until_the_peer_dies, 2, timeout=130, dead=[1])[0]
    assert result is not None
    assert result["held_s"] < RANK_TIMEOUT / 3, result["held_s"]
    message, trace = str(result["message"]), str(result["traceback"])
    assert "gloo" in message  # gloo's own error, as it reaches a job without instrument:
    assert "Got the following error" not in trace  # not as a future callback passed it on
    assert "hooks/collectives.py" not in trace


def _flushes_after_the_peer_dies(rank: int, world_size: int, timeout: float) -> list[float]:
    """Steps with a reporter gathering across ranks; rank 1 dies after step 3 without
    closing it. Returns rank 0's flush times after that."""
    reporter = instrument.Reporter(every=None, ranks="minmax", rank_timeout=timeout, sinks=[])
    seconds = []
    for step in range(9):
        if rank == 1 and step == 3:
            os._exit(0)
        with instrument.timed("work"):
            time.sleep(0.001)
        reporter.step()
        if step % 2 == 1:
            began = time.perf_counter()
            reporter.flush()
            if step >= 3:
                seconds.append(time.perf_counter() - began)
    reporter.close(local=True)
    return seconds


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_gone_is_waited_for_once_then_given_only_a_grace() -> None:
    timeout = 8.0
    first, *later = run_ranks(_flushes_after_the_peer_dies, 2, timeout, timeout=100, dead=[1])[0]
    assert first >= timeout * 0.9  # the first flush waits: the rank may only be late
    assert later
    assert all(s < timeout / 2 for s in later), later


def _late_once_then_slow(rank: int, world_size: int, timeout: float) -> list[str]:
    """Rank 1 comes to the second flush after the others gave up, then to each later one
    later than the 2 s grace but within ``timeout``: rank 0's notes, flush by flush."""
    reporter = instrument.Reporter(every=None, ranks="minmax", rank_timeout=timeout, sinks=[])
    notes = []
    for flush in range(4):
        with instrument.timed("work"):
            time.sleep(0.001)
        reporter.step()
        if rank == 1 and flush == 1:
            time.sleep(timeout + 1)  # arrives late, before the grace of the next one ends
        elif rank == 1 and flush > 1:
            time.sleep(3.0)
        notes.append(reporter.flush().across_note)
    reporter.close(local=True)
    return notes


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_came_late_is_waited_for_in_full_again() -> None:
    notes = run_ranks(_late_once_then_slow, 2, 6.0, timeout=100)[0]
    assert notes[0] == ""
    assert "ranks [1] did not reach this flush" in notes[1]
    assert notes[2:] == ["", ""]  # it arrived late: not presumed gone, combined again
