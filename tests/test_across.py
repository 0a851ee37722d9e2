"""The cross-rank flush as a protocol with a deadline, on real gloo groups: ranks that
skip a flush, flush twice or crash are named and the flush stays local (never a hang, never
an exception), later flushes recover; different path sets; stragglers named and cleared
with exact scores; bytes per rank flat in the world size."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from distributed_helpers import run_ranks, torchrun
from net_bytes import moved, tcp_counters

import instrument
from instrument.sinks.scalars import scalars
from instrument.testing import FakeClock, use_clock

TIMEOUT = 2.0  # the agreement's deadline in these tests (seconds)


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


def _listen() -> _Log:
    handler = _Log()
    logger = logging.getLogger("instrument")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return handler


def _steps(clock: FakeClock, rank: int, n: int, forward: float | None = None) -> None:
    for _ in range(n):
        with instrument.timed("train"), instrument.timed("forward"):
            clock.advance(forward if forward is not None else 0.1 * (rank + 1))
        instrument.step()


def _timed_flush(reporter: instrument.Reporter) -> dict[str, Any]:
    start = time.monotonic()
    report = reporter.flush()
    return {"report": report.to_dict(), "seconds": time.monotonic() - start}


def _store() -> Any:
    return dist.distributed_c10d._get_default_store()


def out_of_step_worker(rank: int, world_size: int) -> dict[str, Any]:
    log = _listen()
    clock = FakeClock()
    out: dict[str, Any] = {}
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=None, ranks="minmax", rank_timeout=TIMEOUT, memory=False, warmup=0
        )
        _steps(clock, rank, 2)
        if rank == 0:  # A: rank 1 never flushes this interval
            out["A"] = _timed_flush(reporter)
            _store().set("test/A", "1")
        else:
            _store().wait(["test/A"])
        _steps(clock, rank, 2)
        out["B"] = _timed_flush(reporter)  # rank 0: steps 2..4, rank 1: steps 0..4
        _steps(clock, rank, 2)
        out["C"] = _timed_flush(reporter)  # both 4..6: recovered
        _steps(clock, rank, 1)
        if rank == 1:  # an extra flush at step 7 on rank 1 only
            out["extra"] = _timed_flush(reporter)
            _store().set("test/extra", "1")
        else:
            _store().wait(["test/extra"])
        _steps(clock, rank, 1)
        out["D"] = _timed_flush(reporter)  # rank 0: 6..8, rank 1: 7..8
        _steps(clock, rank, 2)
        out["E"] = _timed_flush(reporter)  # both 8..10: recovered
    out["log"] = [(level, text) for level, text in log.records if "reports this rank" in text]
    return out


def _report(result: dict[str, Any], key: str) -> instrument.Report:
    return instrument.Report.from_dict(result[key]["report"])


def _alone(report: instrument.Report, own_forward: float) -> None:
    """Nothing of another rank leaked in: this rank's own interval only."""
    assert all(node.ranks is None for node in report.nodes)
    assert report.across == {}
    assert report["train/forward"].total == pytest.approx(own_forward)


@pytest.mark.slow  # two ranks; a missing rank is named in tests/test_dying_rank.py too
@pytest.mark.timeout(150)
def test_missing_and_extra_flushes_are_named_never_mixed_and_recover() -> None:
    first, second = run_ranks(out_of_step_worker, 2, timeout=130)

    a = _report(first, "A")  # rank 1 never came: rank 0 waited the deadline, no longer
    assert "ranks [1] did not reach this flush within 2 s" in a.across_note
    assert TIMEOUT <= first["A"]["seconds"] < TIMEOUT + 8
    _alone(a, 0.2)
    assert "across ranks: not combined, this rank only: ranks [1]" in a.render()

    for result, own in ((first, 0.2), (second, 0.8)):  # B: steps 2..4 against 0..4
        b = _report(result, "B")
        assert "ranks [1] are at another interval (rank 1: interval #1, steps 0..4)" in (
            b.across_note
        )
        assert "the others: steps 2..4" in b.across_note
        _alone(b, own)

    for result in (first, second):  # C and E: both at the same interval again
        for key in ("C", "E"):
            report = _report(result, key)
            assert report.across_note == ""
            forward = report["train/forward"]  # a nested path, keys intact
            assert (forward.rank_min, forward.rank_max) == (pytest.approx(0.2), pytest.approx(0.4))
            assert forward.slowest_rank == 1
            assert report["train"].rank_argmax == 1
            noise = {k for k in report.across if k.startswith("noise.")}
            assert set(report.across) - noise == {"throughput.steps_per_sec"}  # no "rain.forward"
            assert {k.removeprefix("noise.") for k in noise} <= set(report.paths())
            assert "across 2 ranks" in report.render()

    extra = _report(second, "extra")  # rank 1's extra flush: rank 0 was not there
    assert "ranks [0] did not reach this flush" in extra.across_note
    _alone(extra, 0.2)
    for result, own in ((first, 0.2), (second, 0.2)):  # D: 6..8 against 7..8
        d = _report(result, "D")
        assert "ranks [1] are at another interval" in d.across_note
        assert "steps 7..8" in d.across_note
        _alone(d, own)

    warnings = [text for level, text in first["log"] if level == logging.WARNING]
    assert len(warnings) == 2  # missing rank 1, then rank 1 out of step: once each
    assert "ranks [1] did not reach" in warnings[0]
    assert "training goes on" in warnings[0]
    assert [level for level, _ in first["log"]] == [logging.WARNING] * 2 + [logging.DEBUG]


def crash_worker(rank: int, world_size: int) -> dict[str, Any]:
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=None, ranks="all", rank_timeout=TIMEOUT, memory=False, warmup=0
        )
        _steps(clock, rank, 1)
        if rank == 2:  # a path (and its parent) only rank 2 has
            with instrument.timed("train"), instrument.timed("eval"), instrument.timed("extra"):
                clock.advance(0.5)
        out = {"first": reporter.flush().to_dict()}
        if rank == 2:
            os._exit(3)  # crash: no goodbye, no destroy_process_group
        _steps(clock, rank, 1)
        out["second"] = _timed_flush(reporter)
        _steps(clock, rank, 1)
        out["third"] = _timed_flush(reporter)
    return out


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_different_path_sets_then_a_crashed_rank() -> None:
    results = run_ranks(crash_worker, 3, timeout=130, dead=[2])
    assert results[2] is None
    first = instrument.Report.from_dict(results[0]["first"])
    assert first.paths().index("train/eval") < first.paths().index("train/eval/extra")
    extra = first["train/eval/extra"]
    assert extra.count == 0  # rank 0 never ran it ...
    assert extra.ranks_present == 1
    assert extra.rank_max == pytest.approx(0.5)
    assert extra.per_rank == (None, None, pytest.approx(0.5))  # ... gathered to rank 0
    assert first["train/forward"].per_rank == pytest.approx((0.1, 0.2, 0.3))
    on_1 = instrument.Report.from_dict(results[1]["first"])
    assert on_1["train/eval/extra"].rank_max == pytest.approx(0.5)
    assert on_1["train/forward"].per_rank is None  # only the first rank gathers
    for result in results[:2]:
        for key in ("second", "third"):  # rank 2 is gone: named, each flush bounded
            report = instrument.Report.from_dict(result[key]["report"])
            missed = "did not reach this flush" if key == "second" else "missed the flush before"
            assert f"ranks [2] {missed}" in report.across_note  # then presumed gone
            assert result[key]["seconds"] < TIMEOUT + 8
            assert all(node.ranks is None for node in report.nodes)


def extra_flush_worker(rank: int, world_size: int) -> list[tuple[int, int, str, bool]]:
    """Rank 0 flushes once of its own after step 3; both report every 4 steps."""
    clock = FakeClock()
    reports: list[instrument.Report] = []
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=4, ranks="minmax", rank_timeout=1, memory=False, sinks=[reports.append]
        )
        for step in range(1, 13):
            with instrument.timed("work"):
                clock.advance(0.01 * (1 + rank))
            instrument.step()
            if rank == 0 and step == 3:
                reporter.flush()
    return [(r.step - r.steps, r.step, r.across_note, r["work"].ranks is not None) for r in reports]


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(120)
def test_ranks_out_of_step_after_an_extra_flush_meet_again_at_the_next_multiple() -> None:
    """An extra flush on one rank does not shift its reports for good: both report at
    steps 4, 8 and 12, and combine again from step 8 (no later flush waits out
    ``rank_timeout``)."""
    start = time.perf_counter()
    first, second = run_ranks(extra_flush_worker, 2, timeout=100)
    assert [(a, b) for a, b, _, _ in first] == [(0, 3), (3, 4), (4, 8), (8, 12)]
    assert [(a, b) for a, b, _, _ in second] == [(0, 4), (4, 8), (8, 12)]
    for rank_reports in (first, second):
        assert all(combined and not note for _, _, note, combined in rank_reports[-2:])
    assert time.perf_counter() - start < 60


def uneven_close_worker(rank: int, world_size: int, delay: float) -> dict[str, Any]:
    """Rank 0 runs 10 steps, rank 1 8, reporting every 4; both close (rank 1 ``delay``
    seconds later); then both run a second reporter in step."""
    clock = FakeClock()
    with use_clock(clock):
        first = instrument.Reporter(every=4, ranks="minmax", rank_timeout=30, memory=False)
        for _ in range(10 if rank == 0 else 8):
            with instrument.timed("work"):
                clock.advance(0.01)
            instrument.step()
        if rank == 1:
            time.sleep(delay)
        start = time.perf_counter()
        last = first.close()
        closing = time.perf_counter() - start
        dist.barrier()  # rank 0's last flush is over before rank 1 opens another reporter
        reports: list[instrument.Report] = []
        second = instrument.Reporter(
            every=2, ranks="minmax", rank_timeout=30, memory=False, sinks=[reports.append]
        )
        for _ in range(2):
            with instrument.timed("work"):
                clock.advance(0.01)
            instrument.step()
        second.close()
    again = reports[-1]
    return {
        "closing": closing,
        "note": None if last is None else last.across_note,
        "again": (again.across_note, again["work"].ranks is not None),
    }


@pytest.mark.slow  # two ranks, twice
@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_a_rank_that_closed_is_not_waited_for(delay: float) -> None:
    """Uneven steps: rank 0's last flush (steps 8..10) need not wait ``rank_timeout`` for
    rank 1, which closed its reporter at step 8 (it waited the full 60 s by default) —
    also when rank 1 closes after rank 0 began waiting; a later reporter of rank 1 takes
    part again."""
    first, second = run_ranks(uneven_close_worker, 2, delay, timeout=100)
    assert first["closing"] < 10
    assert first["note"] == "ranks [1] closed their reporter before it (rank 1 at step 8)"
    assert second["note"] is None  # (nothing left to report at its close)
    assert first["again"] == ("", True)
    assert second["again"] == ("", True)


EXITING_RANK = """
import sys, time, torch.distributed as dist, instrument
dist.init_process_group("gloo")
rank = dist.get_rank()
reporter = instrument.Reporter(every=2, ranks="minmax", rank_timeout=60, memory=False, warmup=0)
for _ in range(4 if rank == 0 else 6):
    with instrument.timed("work"):
        time.sleep(0.01)
    start = time.perf_counter()
    instrument.step()
    # one write per line (print writes the newline apart): the ranks share one stdout
    sys.stdout.write(f"rank {rank} stepped in {time.perf_counter() - start:.1f} s\\n")
    sys.stdout.flush()
# rank 0 ends here: no close(), no destroy_process_group(): only the flush at exit
"""


@pytest.mark.slow  # two ranks under torchrun
@pytest.mark.timeout(120)
def test_a_rank_that_ended_at_interpreter_exit_is_not_waited_for(tmp_path: Path) -> None:
    """Under torchrun (the agent holds the store), rank 0 runs 4 steps and just ends; rank
    1's flush at step 6 waited the whole ``rank_timeout`` (60 s) for it: the flush at exit
    said nothing to the others."""
    script = tmp_path / "exiting_rank.py"
    script.write_text(EXITING_RANK)
    start = time.perf_counter()
    done = torchrun(script, 2, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "ranks [0] closed their reporter before it (rank 0 at step 4)" in said
    stepped = re.findall(r"stepped in (\d+\.\d) s", done.stdout)
    assert len(stepped) == 4 + 6, done.stdout
    slowest = max(map(float, stepped))
    assert slowest < 20
    assert time.perf_counter() - start < 60


def straggler_worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    clock = FakeClock()
    slow = {1: 0.2, 2: 0.2, 3: 0.4, 4: 0.1}  # rank 2's forward, interval by interval
    reports = []
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=None,
            ranks="minmax",
            rank_timeout=30,
            memory=False,
            warmup=0,
            straggler_threshold=0.8,
            straggler_intervals=2,
        )
        for interval in (1, 2, 3, 4):
            forward = slow[interval] if rank == 2 else 0.1
            with instrument.timed("train"):
                with instrument.timed("forward"):
                    clock.advance(forward)
                with instrument.timed("all_reduce"):  # the fast ranks wait for rank 2
                    clock.advance(0.01 + slow[interval] - forward)
            instrument.step()
            report = reporter.flush()
            reports.append({"report": report.to_dict(), "scalars": scalars(report)})
    return reports


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_slow_rank_is_named_after_k_intervals_and_cleared_when_it_recovers() -> None:
    results = run_ranks(straggler_worker, 3, timeout=130)
    first = [instrument.Report.from_dict(r["report"]) for r in results[0]]
    assert [r.to_dict() for r in first] == [r["report"] for r in results[0]]  # JSONL trip
    host = os.uname().nodename
    assert first[0].stragglers == ()  # one slow interval is not enough (K = 2)
    named = first[1].stragglers
    # "train" holds the all-reduce the fast ranks wait in: compared by its own time (its
    # time less the all-reduce's), rank 2 is slow there too
    assert [(s.rank, s.host, s.regions, s.intervals) for s in named] == [
        (2, host, ("train", "train/forward"), 2)
    ]
    assert named[0].scores == pytest.approx((0.5, 0.5))
    assert first[2].stragglers[0].scores == pytest.approx((0.25, 0.25))
    assert first[2].stragglers[0].intervals == 3
    assert first[3].stragglers == ()  # recovered: cleared at once
    assert first[2]["train"].ranks is not None
    assert first[2]["train"].ranks.slowest == 2  # (its totals are the same on every rank)
    text = first[2].render()
    assert f"stragglers: rank 2 ({host}): train 0.25, train/forward 0.25 for 3 intervals" in text
    assert "across 3 ranks" in text
    tags = results[0][2]["scalars"]
    assert tags["stragglers/count"] == 1.0
    assert tags["stragglers/rank_2/min_score"] == pytest.approx(0.25)
    assert results[0][3]["scalars"]["stragglers/count"] == 0.0
    for report in first[:3]:  # a collective: the rank that arrived last, not one that waited
        assert report["train/all_reduce"].slowest_rank == 2
        assert report["train/all_reduce"].relative_score is None  # never scored
        assert report["train"].rank_max == pytest.approx(report["train"].rank_min)

    mine = [instrument.Report.from_dict(r["report"]) for r in results[2]]
    assert [r["train/forward"].relative_score for r in mine] == [0.5, 0.5, 0.25, 1.0]
    assert [r["train/forward"].individual_score for r in mine] == [1.0, 1.0, 0.5, 1.0]
    assert all(r.stragglers == () for r in mine)  # only the first rank collects them
    assert results[2][2]["scalars"]["time/train/forward/relative_score"] == 0.25
    assert results[2][2]["scalars"]["time/train/forward/individual_score"] == 0.5
    assert results[0][0]["scalars"]["time/train/all_reduce/slowest_rank"] == 2.0
    fast = instrument.Report.from_dict(results[1][2]["report"])
    assert fast["train/forward"].relative_score == 1.0


PATHS = 200


def bytes_worker(rank: int, world_size: int) -> tuple[int, int]:
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=None, ranks="minmax", rank_timeout=30, memory=False, warmup=0
        )
        for _interval in range(2):
            for i in range(PATHS):
                with instrument.timed(f"region_{i:03d}"):
                    clock.advance(0.001 * (rank + 1))
            instrument.step()
            before = tcp_counters()
            reporter.flush()
            sent, received = moved(before)
    return sent, received


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_bytes_per_rank_do_not_grow_with_the_world() -> None:
    # the values: one MAX reduction of 4 int64 and one SUM of 2 float64 per key (P paths +
    # 1 rate), over a binary tree on gloo: a rank receives from at most two children and
    # its parent, so at most 3 buffers whatever W. An all-gather of the same buffer would
    # receive W-1 of them: 3x more per rank at W=4 than at W=2.
    buffer = (4 * 8 + 2 * 8) * (PATHS + 1)
    mean = {}
    for world in (2, 4):
        moved_bytes = run_ranks(bytes_worker, world, timeout=150)
        for sent, received in moved_bytes[1:]:  # rank 0 also serves the store to all
            assert sent < 3 * buffer + 4096
            assert received < 3 * buffer + 4096
        mean[world] = sum(received for _, received in moved_bytes[1:]) / (world - 1)
    assert mean[2] > buffer * 0.9  # the values really travelled
    assert mean[4] < 1.5 * mean[2]  # the tree: 4/3; a ring 1.5, an all-gather 3


def noisy_worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    """Forward 4 or 6 ms a step, in turn (1 ms of spread), on both ranks; ``loud`` adds
    3 ms a step on rank 1, ``close`` 0.5 ms."""
    clock = FakeClock()
    out = []
    with use_clock(clock):
        for extra in (0.0005, 0.003):
            reports: list[instrument.Report] = []
            reporter = instrument.Reporter(
                every=10, ranks="minmax", rank_timeout=30, memory=False, sinks=[reports.append]
            )
            for i in range(30):
                with instrument.timed("forward"):
                    clock.advance((0.004 if (i + rank) % 2 else 0.006) + extra * rank)
                instrument.step()
            reporter.close()
            out += [r.to_dict() for r in reports]
    return out


@pytest.mark.timeout(120)
def test_ranks_within_their_step_to_step_spread_have_no_slowest_rank() -> None:
    """Rank 1 0.5 ms a step slower in a forward that moves 1 ms from step to step: chance,
    no slowest rank, no straggler score; 3 ms slower: rank 1, scored."""
    reports = [instrument.Report.from_dict(r) for r in run_ranks(noisy_worker, 2)[0]]
    close, loud = reports[:3], reports[3:]
    for report in close:
        forward = report["forward"].ranks
        assert forward is not None
        assert forward.slowest is None
        assert forward.relative_score is None
        assert report.across["noise.forward"].rank_max == pytest.approx(0.001, rel=0.05)
    for report in loud:
        forward = report["forward"].ranks
        assert forward is not None
        assert forward.slowest == 1
        assert forward.relative_score is not None
