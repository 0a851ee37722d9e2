"""A flush reaches every sink whatever one sink does (fails in ``wants``, is interrupted by
Ctrl-C while writing), and a reporter dropped without ``close()`` stops taking records at
once, not when the garbage collector runs."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
import weakref
from collections.abc import Iterator

import pytest

import instrument
from instrument.report import Report
from instrument.sinks.base import Sink
from instrument.testing import FakeClock, use_clock


@pytest.fixture(autouse=True)
def clock() -> Iterator[FakeClock]:
    with use_clock(FakeClock()) as fake:
        yield fake


class CtrlC(Sink):
    """Gets a real SIGINT while it writes its first report."""

    interrupted = False

    def write(self, report: Report) -> None:
        if not self.interrupted:
            self.interrupted = True
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the signal's KeyboardInterrupt arrives here


def _record(calls: int = 2) -> None:
    for _ in range(calls):
        with instrument.timed("work"):
            pass


def test_ctrl_c_in_the_first_sink_still_reaches_the_others() -> None:
    reports: list[Report] = []
    reporter = instrument.Reporter(every=None, sinks=[CtrlC(), reports.append], memory=False)
    _record()
    with pytest.raises(KeyboardInterrupt):
        reporter.flush()
    assert [r["work"].count for r in reports] == [2]  # the interval is not lost
    _record(1)
    assert reporter.flush()["work"].count == 1  # nothing half done is left behind
    reporter.close(flush=False)


class NoRanks(Sink):
    ranks = None  # type: ignore[assignment]

    def write(self, report: Report) -> None:  # pragma: no cover - never wanted
        raise AssertionError("not reached")


class FailingWants(Sink):
    def wants(self, rank: int) -> bool:
        raise RuntimeError("wants failed")

    def write(self, report: Report) -> None:  # pragma: no cover - never wanted
        raise AssertionError("not reached")


def test_a_sink_whose_rank_filter_fails_is_reported_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reports: list[Report] = []
    sinks = [NoRanks(), FailingWants(), reports.append]
    reporter = instrument.Reporter(every=None, sinks=sinks, memory=False)
    _record()
    with caplog.at_level(logging.ERROR, logger="instrument"):
        assert reporter.flush()["work"].count == 2
        reporter.close()
    assert len(reports) == 1
    failed = [r.getMessage() for r in caplog.records if "failed and was skipped" in r.getMessage()]
    assert len(failed) == 2


def test_a_dropped_reporter_stops_taking_records_at_once() -> None:
    gc.disable()
    try:
        dropped = instrument.Reporter(every=1, sinks=[], memory=False)
        gone = weakref.ref(dropped)
        del dropped
        assert gone() is None  # no reference cycle holds it
        reports: list[Report] = []
        reporter = instrument.Reporter(every=None, sinks=[reports.append], memory=False)
        for _ in range(3):
            _record(1)
            instrument.step()
        assert reporter.flush()["work"].count == 3
        reporter.close(flush=False)
    finally:
        gc.enable()
