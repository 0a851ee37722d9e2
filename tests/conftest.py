from __future__ import annotations

from collections.abc import Iterator

import pytest

import instrument
from instrument.testing import FakeClock, reset, use_clock


@pytest.fixture(autouse=True)
def _reset_instrument() -> Iterator[None]:
    reset()
    yield
    reset()


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    with use_clock(fake):
        yield fake


@pytest.fixture
def reporter() -> Iterator[instrument.Reporter]:
    rep = instrument.Reporter(every=None)
    yield rep
    rep.close()
