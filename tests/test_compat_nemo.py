"""instrument.compat.nemo: NeMo Automodel's timers (Megatron's, printing), including NeMo's own
unit tests, which replace ``torch.distributed`` with a stub module."""

from __future__ import annotations

import logging
import types

import pytest
from compat_helpers import printed, stub_torch_distributed

from instrument.compat import megatron, nemo
from instrument.compat.nemo import DummyTimer, Timer, Timers
from instrument.testing import FakeClock


def label(name: str) -> str:
    return name + " " + "." * (47 - len(name))


def test_nemo_timers_print_by_default_and_can_log(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # NeMo Automodel nemo_automodel/components/training/timers.py (rkalaniNV/Automodel commit
    # 1a5b183), Timers.log: ``print(output_string, flush=True)`` on the last rank.
    timers = Timers(2, "max")
    assert isinstance(timers, megatron.Timers)
    with timers("forward"):
        clock.advance(0.5)
    with caplog.at_level(logging.INFO, logger="megatron.core.timers"):
        out = printed(timers.log, ["forward"], reset=False)
    assert out == f"max time across ranks (ms):\n    {label('forward')}: 500.00\n"
    assert caplog.records == []
    logging_timers = Timers(2, "max", log_to="logger")
    with logging_timers("forward"):
        clock.advance(0.25)
    with caplog.at_level(logging.INFO, logger="megatron.core.timers"):
        assert printed(logging_timers.log, ["forward"]) == ""
    assert caplog.messages == [f"max time across ranks (ms):\n    {label('forward')}: 250.00"]
    assert nemo.DummyTimer is megatron.DummyTimer


# -- NeMo's own unit tests, run unchanged against the drop-in -------------------------------
# NVIDIA-NeMo/Automodel tests/unit_tests/training/test_timers.py (commit 541dd42): an autouse
# fixture sets ``torch.distributed`` to a stub module (compat_helpers.stub_torch_distributed).


@pytest.fixture
def stub_distributed(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    return stub_torch_distributed(monkeypatch)


def test_nemo_unit_test_collection_and_logging(
    stub_distributed: types.SimpleNamespace, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """NeMo's test_timers_collection_and_logging, with the stub in place."""
    timers = Timers(log_level=1, log_option="max")
    dummy = timers("foo", log_level=2)
    assert isinstance(dummy, DummyTimer)
    real_timer = timers("bar", log_level=1)
    real_timer.start()
    clock.advance(0.015)
    real_timer.stop()
    timers.log(names=["bar"], normalizer=1.0, reset=True)
    captured = capsys.readouterr().out
    assert captured == f"max time across ranks (ms):\n    {label('bar')}: 15.00\n"


def test_nemo_unit_test_timer_basics_with_the_stub(
    stub_distributed: types.SimpleNamespace, clock: FakeClock
) -> None:
    """NeMo's Timer tests (start/stop/elapsed, double start, reset) under the stub."""
    with pytest.raises(Exception, match="dummy timer should not be used"):
        DummyTimer().elapsed()
    t = Timer("unit-test")
    t.start(barrier=True)
    clock.advance(0.02)
    t.stop(barrier=True)
    assert t.elapsed(reset=False) == 0.02
    t.start()
    with pytest.raises(AssertionError, match="timer has already been started"):
        t.start()
    clock.advance(0.02)
    t.stop()
    assert t.elapsed(reset=True) == pytest.approx(0.04)
    assert t.elapsed(reset=False) == 0.0
    assert t.active_time() == pytest.approx(0.04)


def test_the_stub_decides_the_rank_that_logs(
    stub_distributed: types.SimpleNamespace, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upstream asks the stub (get_world_size() - 1 is the last rank; get_rank() is this one):
    a stub saying "rank 0 of 2" prints nothing by default and prints with rank=0."""
    stub_distributed.get_world_size = lambda: 2
    timers = Timers(2, "minmax")
    with timers("bar"):
        clock.advance(0.5)
    timers.log(["bar"], reset=False)
    assert capsys.readouterr().out == ""
    timers.log(["bar"], rank=0)
    assert capsys.readouterr().out == (
        f"(min, max) time across ranks (ms):\n    {label('bar')}: (500.00, 500.00)\n"
    )
