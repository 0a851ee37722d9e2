"""Bounded memory: capped path depth and count, idle paths released, a bounded CUDA queue,
and every tree walk iterative (any depth renders and round-trips)."""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator

import pytest
from fake_cuda import fake_cuda

import instrument
from instrument import registry
from instrument.report import Node, Report
from instrument.stats import Stats
from instrument.testing import FakeClock, capture_reports, use_clock


@instrument.timed("gen")
def _items(n: int) -> Iterator[int]:
    """A decorated generator whose body keeps a region open across ``yield``: without a
    cap its path grows by two levels per item."""
    for i in range(n):
        with instrument.timed("item"):
            yield i


def test_a_region_open_across_yield_stops_growing_at_max_depth() -> None:
    instrument.configure(max_depth=10)
    with (
        pytest.warns(RuntimeWarning, match=r"configure\(max_depth=\.\.\.\)"),
        capture_reports() as reports,
    ):
        list(_items(500))
    depth = max(path.count("/") + 1 for path in reports[-1].paths())
    assert depth <= 10
    assert "(overflow)" in reports[-1]
    assert len(list(registry.walk(registry.ROOT.children["gen"]))) == 9  # not 999 levels


def test_paths_beyond_max_paths_fold_into_one_overflow_path_warned_once() -> None:
    base = registry.live_paths()  # earlier tests' paths (and maybe their overflow) count
    instrument.configure(max_paths=base + 50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture_reports() as reports:
            for i in range(200):
                with instrument.timed(f"name{i}"):
                    pass
    said = [w for w in caught if "max_paths" in str(w.message)]
    assert len(said) == 1
    assert f"beyond {base + 50} distinct paths" in str(said[0].message)
    report = reports[-1]
    assert len(report) == 51
    assert report["(overflow)"].count == 150
    assert registry.live_paths() <= base + 51


@pytest.mark.parametrize("cap", ["max_depth", "max_paths"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "64"])
def test_caps_are_checked_at_the_door(cap: str, bad: object) -> None:
    with pytest.raises(ValueError, match=rf"{cap} must be an int >= 1, got {bad!r}"):
        instrument.configure(**{cap: bad})


def _chain(depth: int) -> Report:
    stats = Stats(1, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0)
    paths = ["/".join(f"r{i}" for i in range(k + 1)) for k in range(depth)]
    return Report(nodes=tuple(Node(path=p, host=stats, self_time=0.0) for p in paths))


def test_a_tree_far_deeper_than_the_recursion_limit_renders_and_round_trips() -> None:
    report = _chain(3000)
    text = report.render()
    assert text.count("\n") >= 3000
    assert Report.from_dict(report.to_dict()) == report
    from instrument.sinks.scalars import scalars

    assert len([tag for tag in scalars(report) if tag.endswith("/total_ms")]) == 3000


def test_deep_recursion_with_a_raised_cap_is_recorded_and_rendered() -> None:
    instrument.configure(max_depth=2000)
    region = instrument.timed("deeper")
    with capture_reports() as reports, contextlib.ExitStack() as stack:
        for _ in range(1500):
            stack.enter_context(region)
    assert len(reports[-1]) == 1500
    assert reports[-1].render(fold=False).count("deeper") == 1500


def test_idle_paths_are_released_and_come_back_when_entered_again() -> None:
    clock = FakeClock()
    with use_clock(clock), capture_reports() as reports:
        reporter = instrument.reporter.live_reporters()[-1]
        for i in range(1000):
            with instrument.timed(f"once{i}"):
                clock.advance(0.001)
        reporter.flush()
        before = registry.live_paths()
        for _ in range(registry.idle_flushes):
            with instrument.timed("steady"):
                clock.advance(0.001)
            reporter.flush()
        assert registry.live_paths() <= before - 1000 + 1
        assert "steady" in registry.ROOT.children
        assert not [name for name in registry.ROOT.children if name.startswith("once")]
        with instrument.timed("once7"):
            clock.advance(0.25)
    assert reports[-1]["once7"].total == 0.25


def test_a_path_held_by_an_open_region_or_a_reference_is_never_released() -> None:
    with capture_reports() as reports:
        reporter = instrument.reporter.live_reporters()[-1]
        held = registry.ROOT.child("cached", 0, "cpu")  # a hook's cached anchor
        with instrument.timed("epoch"):
            for _ in range(registry.idle_flushes + 2):
                reporter.flush()
            assert {"cached", "epoch"} <= set(registry.ROOT.children)
        assert "epoch" in reports[-1]
        del held
        gc.collect()
        for _ in range(registry.idle_flushes + 1):
            reporter.flush()
        assert not {"cached", "epoch"} & set(registry.ROOT.children)


def test_the_cuda_event_queue_stays_bounded_without_a_flush() -> None:
    with fake_cuda() as fake, use_clock("cuda"):
        region = instrument.timed("kernel")
        for _ in range(3 * registry.PENDING_BOUND):
            with region:
                fake.gpu.advance(0.001)
            assert len(registry.pending) < registry.PENDING_BOUND
        assert fake.event_waits == 0 or fake.queries > 0  # folded through query(), no sync
        with capture_reports(memory=False) as reports:
            pass
    assert reports[-1]["kernel"].count == 3 * registry.PENDING_BOUND
    assert reports[-1]["kernel"].device is not None
    assert reports[-1]["kernel"].device.total == pytest.approx(3 * registry.PENDING_BOUND * 1e-3)


def test_events_the_device_has_not_reached_stay_pending_and_are_looked_at_less_often() -> None:
    with fake_cuda() as fake, use_clock("cuda"):
        fake.completed = False
        region = instrument.timed("kernel")
        for _ in range(3 * registry.PENDING_BOUND):
            with region:
                pass
        queries = fake.queries
        assert len(registry.pending) == 3 * registry.PENDING_BOUND  # nothing lost
        assert queries < 3 * 3 * registry.PENDING_BOUND  # not every pair at every append
        fake.completed = True
        with capture_reports(memory=False) as reports:
            pass
    assert reports[-1]["kernel"].count == 3 * registry.PENDING_BOUND


@pytest.mark.cuda
def test_the_cuda_event_queue_stays_bounded_on_a_real_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = torch.ones(256, device="cuda")
    torch.cuda.synchronize()
    with use_clock("cuda"):
        region = instrument.timed("kernel")
        longest = 0
        for _ in range(4 * registry.PENDING_BOUND):
            with region:
                x.add_(1)
            longest = max(longest, len(registry.pending))
        torch.cuda.synchronize()
        with capture_reports() as reports:
            pass
    assert longest <= 2 * registry.PENDING_BOUND  # the device keeps up: folded, not grown
    assert reports[-1]["kernel"].count == 4 * registry.PENDING_BOUND
    assert reports[-1]["kernel"].device is not None
