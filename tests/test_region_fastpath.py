"""The shortcuts of the C ``with`` path change nothing a caller can see.

With the C accelerator a region's ``__enter__``/``__exit__`` are bound once per region,
the child node and ``timed(name)`` are remembered while the dicts they come from are
unchanged, and closed frames nobody references are refilled by the next enter. Each test
runs on the C and the pure-Python path (``INSTRUMENT_NO_EXTENSIONS=1``) and pins a case
where a shortcut would differ: a frame or start time held by Python code, a children dict
or ``by_name`` changed behind the cache, a renamed region, threads.
"""

from __future__ import annotations

import gc
import threading

import pytest

import instrument
from instrument import registry
from instrument._native import speedups
from instrument.regions import frames, region
from instrument.regions.frames import Frame

needs_c = pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")


def _counts(reporter: instrument.Reporter) -> dict[str, int]:
    report = reporter.flush()
    return {path: report[path].count for path in report.paths()}


@needs_c
def test_enter_and_exit_are_bound_once_per_region() -> None:
    r = instrument.timed("fp-bound")
    assert r.__enter__ is r.__enter__
    assert r.__exit__ is r.__exit__
    assert r.__exit__.__self__ is r
    assert instrument.timed("fp-other").__enter__ is not r.__enter__


def test_the_methods_called_unbound_and_bound_record_once_each(
    reporter: instrument.Reporter,
) -> None:
    r = instrument.timed("fp-call")
    cls = type(r)
    assert cls.__enter__(r) is r
    cls.__exit__(r, None, None, None)
    assert r.__enter__() is r
    r.__exit__(None, None, None)
    with pytest.raises((TypeError, AttributeError)):  # C: TypeError; Python: no .name
        cls.__enter__(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        r.__exit__(None)  # type: ignore[call-arg]
    assert _counts(reporter) == {"fp-call": 2}


def test_exit_looked_up_before_disable_still_closes(reporter: instrument.Reporter) -> None:
    with instrument.timed("fp-swap"):
        instrument.disable()
    instrument.enable()
    assert frames.get_top() is frames.ROOT_FRAME or frames.get_top().node is registry.ROOT
    assert _counts(reporter) == {"fp-swap": 1}


def test_a_frame_held_by_python_code_is_never_reused(reporter: instrument.Reporter) -> None:
    r = instrument.timed("fp-held")
    with r:
        held = frames.get_top()  # the frame only: no other reference to its start time
        node, parent = held[0], held[2]
        t0 = int(str(held[1]))
    for _ in range(100):  # closed frames are refilled by these enters
        with instrument.timed("fp-churn"), instrument.timed("fp-inner"):
            pass
    assert held[0] is node
    assert held[1] == t0
    assert held[2] is parent
    assert held[3] is r
    assert held[4] is None
    assert _counts(reporter) == {"fp-held": 1, "fp-churn": 100, "fp-churn/fp-inner": 100}


def test_a_start_time_held_by_python_code_keeps_its_value() -> None:
    with instrument.timed("fp-t0"):
        t0 = frames.get_top().t0
    value = int(str(t0))
    for _ in range(100):
        with instrument.timed("fp-churn"):
            pass
    assert t0 == value


def test_spare_frames_are_harmless_to_the_garbage_collector() -> None:
    for _ in range(50):
        with instrument.timed("fp-gc"), instrument.timed("fp-gc2"):
            pass
    gc.collect()
    for obj in gc.get_objects():
        if type(obj) is Frame:
            repr(obj)
            list(obj)


def test_a_spare_frame_reached_through_the_garbage_collector_is_never_refilled() -> None:
    for _ in range(50):
        with instrument.timed("fp-gc"), instrument.timed("fp-gc2"):
            pass
    held = [
        (obj, obj.t0, int(obj.t0))  # the frame, its start-time int, and that int's value
        for obj in gc.get_objects()
        if type(obj) is Frame and obj.node is None and type(obj.owner) is list
    ]
    if not held:
        pytest.skip("no spare frames on this path (pure Python, or Python 3.14+)")
    for _ in range(50):
        with instrument.timed("fp-gc"), instrument.timed("fp-gc2"):
            pass
    for frame, start, value in held:
        assert frame.node is None
        assert frame.t0 is start
        assert int(start) == value


def test_the_child_cache_follows_changes_to_the_children_dict(
    reporter: instrument.Reporter,
) -> None:
    with instrument.timed("fp-child"):
        pass
    first = registry.ROOT.children.pop("fp-child")
    with instrument.timed("fp-child"):
        pass
    second = registry.ROOT.children["fp-child"]
    assert second is not first
    assert _counts(reporter) == {"fp-child": 1}


def test_one_region_under_several_parents(reporter: instrument.Reporter) -> None:
    x = instrument.timed("fp-x")
    for _ in range(3):
        with instrument.timed("fp-a"), x:
            pass
        with instrument.timed("fp-b"), x:
            pass
        with x:
            pass
    assert _counts(reporter) == {"fp-a": 3, "fp-a/fp-x": 3, "fp-b": 3, "fp-b/fp-x": 3, "fp-x": 3}


def test_a_renamed_region_records_under_its_new_name(reporter: instrument.Reporter) -> None:
    r = region.Region("fp-before")
    region.apply(r)
    for _ in range(2):  # the second finds the child (and remembers it)
        with r:
            pass
    r.name = "fp-after"
    with r:
        pass
    assert _counts(reporter) == {"fp-before": 2, "fp-after": 1}


def test_timed_follows_changes_to_the_region_cache() -> None:
    r = instrument.timed("fp-dispatch")
    assert instrument.timed("fp-dispatch") is r
    replacement = region.Region("fp-dispatch")
    region.by_name["fp-dispatch"] = replacement
    try:
        assert instrument.timed("fp-dispatch") is replacement
    finally:
        region.by_name["fp-dispatch"] = r
    assert instrument.timed("fp-dispatch") is r


def test_threads_nest_on_their_own_stacks(reporter: instrument.Reporter) -> None:
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            with instrument.timed(f"fp-t{i}"), instrument.timed("fp-in"):
                pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = {f"fp-t{i}": 200 for i in range(4)}
    expected.update({f"fp-t{i}/fp-in": 200 for i in range(4)})
    assert _counts(reporter) == expected


def test_an_exception_passes_through_unchanged(reporter: instrument.Reporter) -> None:
    error = KeyError("fp")
    with pytest.raises(KeyError) as caught, instrument.timed("fp-raise"):
        raise error
    assert caught.value is error
    assert frames.get_top().node is registry.ROOT
    assert _counts(reporter) == {"fp-raise": 1}


@needs_c
def test_the_bucket_from_the_bit_length_is_the_bucket_of_the_double() -> None:
    from instrument.stats import bucket_counts

    assert speedups is not None
    values = [2**k + d for k in range(64) for d in (-1, 0, 1) if 0 <= 2**k + d < 2**63]
    values += [(2**k) * 15 // 8 + d for k in range(3, 60) for d in (-1, 0, 1)]
    for v in values:
        assert bucket_counts([v]) == {speedups.bucket(v): 1}, v


def test_frames_are_frame_named_tuples_on_every_path() -> None:
    @instrument.timed("fp-frame-call")
    def inner() -> Frame:
        return frames.get_top()

    with instrument.timed("fp-frame") as region:
        top = frames.get_top()
        called = inner()
    assert type(top) is Frame
    assert (top.node.path, top.owner, top.parent) == ("fp-frame", region, frames.ROOT_FRAME)
    assert type(called) is Frame
    assert called.parent is top
    assert called.node.path == "fp-frame/fp-frame-call"
    assert frames.get_top() is frames.ROOT_FRAME


@pytest.mark.skipif(speedups is None, reason="the C accelerator is not built")
def test_the_c_stack_takes_only_frames() -> None:
    node = frames.ROOT_FRAME.node
    with pytest.raises(TypeError, match="needs a region frame"):
        speedups.set_top((node, 0, None, None, None))  # a plain tuple is not a Frame
