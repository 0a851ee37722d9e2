"""Each deprecated spelling (docs/api.md, "Deprecated") warns, naming its replacement, and
does what the replacement does."""

from __future__ import annotations

import io

import pytest

import instrument
from instrument.report import Report
from instrument.sinks import Console, InMemory
from instrument.sinks.base import Sink
from instrument.testing import FakeClock


def test_ranks_max_is_minmax() -> None:
    with pytest.warns(DeprecationWarning, match='use ranks="minmax"'):
        reporter = instrument.Reporter(ranks="max", sinks=[])
    assert reporter.ranks == "minmax"
    reporter.close(flush=False)


def test_a_sinks_ranks_is_only_ranks() -> None:
    with pytest.warns(DeprecationWarning, match="use only_ranks="):
        console = Console(io.StringIO(), ranks=1)
    assert console.only_ranks == 1
    assert console.wants(1)
    assert not console.wants(0)
    with pytest.warns(DeprecationWarning, match="Sink.only_ranks"):
        assert console.ranks == 1


def test_a_sink_class_with_ranks_keeps_its_filter() -> None:
    with pytest.warns(DeprecationWarning, match="OldSink.ranks"):

        class OldSink(Sink):
            ranks = 2

            def write(self, report: Report) -> None:
                pass

    assert OldSink().only_ranks == 2
    assert not OldSink().wants(0)


def test_timer_is_timer(clock: FakeClock) -> None:
    with pytest.warns(DeprecationWarning, match=r"use instrument\.Timer"):
        t = instrument.timer("load")
    assert isinstance(t, instrument.Timer)
    assert t.name == "load"


def test_reporter_count_is_instrument_count() -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[sink], warmup=0, memory=False)
    with pytest.warns(DeprecationWarning, match=r"use instrument\.count"):
        reporter.count(samples=3)
    instrument.count(samples=4)
    instrument.step()
    report = reporter.flush()
    assert report.throughput is not None
    assert report.throughput.samples == 7
    reporter.close(flush=False)
