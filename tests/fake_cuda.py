"""A fake CUDA device for the clocks' seam (``instrument.clocks.cuda``): the event pool,
pending-event resolution and the ``auto`` clock run their real code on any machine.

Its events read a separate fake device clock (``FakeCuda.gpu``), so a test decides how
far device time runs ahead of, or behind, host time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from instrument import clocks
from instrument.testing import FakeClock


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)`` on the fake device."""

    def __init__(self, device: FakeCuda) -> None:
        self._device = device
        self.recorded_at: int | None = None
        self.synchronized = 0

    def record(self) -> None:
        self.recorded_at = self._device.gpu.now_ns()
        self._device.records += 1

    def synchronize(self) -> None:
        self.synchronized += 1
        self._device.event_waits += 1

    def query(self) -> bool:
        """Whether the device has reached the event (``FakeCuda.completed`` says)."""
        self._device.queries += 1
        return self._device.completed

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.recorded_at is None or end.recorded_at is None:
            raise RuntimeError("elapsed_time of an event that was never recorded")
        return (end.recorded_at - self.recorded_at) / 1e6  # milliseconds, as torch


class FakeCuda:
    """The few ``torch.cuda`` functions instrument's clocks call."""

    def __init__(self, *, initialized: bool = True) -> None:
        self.gpu = FakeClock()
        self.initialized = initialized
        self.device = 0
        self.created = 0  # events constructed (the pool should keep this small)
        self.records = 0
        self.event_waits = 0
        self.device_syncs = 0
        self.queries = 0
        self.completed = True  # what FakeEvent.query() answers

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def _is_in_bad_fork(self) -> bool:
        return False

    def current_device(self) -> int:
        return self.device

    def synchronize(self) -> None:
        self.device_syncs += 1

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        assert enable_timing
        self.created += 1
        return FakeEvent(self)


@contextmanager
def fake_cuda(*, initialized: bool = True) -> Iterator[FakeCuda]:
    """Route ``instrument.clocks.cuda`` to a fresh :class:`FakeCuda` inside the block."""
    fake = FakeCuda(initialized=initialized)
    real = clocks.cuda
    clocks.cuda = fake
    clocks.events.clear()
    try:
        yield fake
    finally:
        clocks.cuda = real
        clocks.events.clear()
