from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import instrument
from instrument.testing import FakeClock, reset, use_clock


@pytest.fixture(autouse=True)
def _reset_instrument(request: pytest.FixtureRequest) -> Iterator[None]:
    reset()
    if torch.cuda.is_initialized() and request.node.get_closest_marker("cuda") is None:
        # an earlier CUDA test brought CUDA up, so "auto" now means the device clock (as it
        # does for a user); the CPU tests are written for the host clock they get without it
        instrument.configure(clock="cpu")
    yield
    reset()


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    with use_clock(fake):
        yield fake


@pytest.fixture
def reporter() -> Iterator[instrument.Reporter]:
    rep = instrument.Reporter(every=None, sinks=[])
    yield rep
    rep.close()
