"""What the diagnosis adds to a flush: the same interval flushed by a reporter with and
without it, interleaved in the same rounds (the findings are computed at the flush only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from paired import Contender

import instrument
from instrument.report import Report

PATHS = 100
CALLS = 10
STEPS = 10


def _recorder() -> Callable[[], None]:
    """Record one interval: ``STEPS`` steps over ``PATHS`` regions, ``CALLS`` calls each."""
    regions = [instrument.timed(f"p{i}") for i in range(PATHS)]
    per_step = max(CALLS // STEPS, 1)

    def record() -> None:
        for _ in range(STEPS):
            for region in regions:
                for _ in range(per_step):
                    with region:
                        pass
            instrument.step()

    return record


def _nodes(report: Report) -> None:
    """A sink that reads every node (as the console, JSONL and HTML sinks do)."""
    for node in report.nodes:
        _ = node.total


@pytest.mark.benchmark(group="diagnosis")
def test_flush_with_and_without_diagnosis(paired: Any) -> None:
    """``Reporter.flush()`` of 100 paths x 10 steps, diagnosed or not, without sinks and with
    a sink that reads every node (then the nodes are built either way)."""
    instrument.configure(clock="cpu")
    record = _recorder()
    reporters = {
        (diagnose, sink): instrument.Reporter(
            every=None, sinks=[_nodes] if sink else [], diagnose=diagnose, memory=False
        )
        for diagnose in (False, True)
        for sink in (False, True)
    }

    def flush_of(key: tuple[bool, bool]) -> Callable[[], object]:
        return reporters[key].flush

    def setup() -> None:
        for reporter in reporters.values():
            reporter.flush()  # each starts the round's interval empty
        record()

    paired(
        [
            Contender("flush, no sink", flush_of((False, False)), setup, inner=1, baseline=True),
            Contender("flush + diagnosis, no sink", flush_of((True, False)), setup, inner=1),
            Contender("flush, a sink reading the nodes", flush_of((False, True)), setup, inner=1),
            Contender(
                "flush + diagnosis, a sink reading the nodes",
                flush_of((True, True)),
                setup,
                inner=1,
            ),
        ],
        rounds=60,
        warmup_rounds=5,
    )
    for reporter in reporters.values():
        reporter.close(flush=False)
