"""WandB: real offline runs, read back from the run's own ``.wandb`` file."""

from __future__ import annotations

import json
import logging
import re
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import timed_step

import instrument
from instrument.report import Node, Report
from instrument.sinks.memory import InMemory
from instrument.sinks.scalars import scalars
from instrument.sinks.wandb import WandB
from instrument.stats import Stats
from instrument.testing import FakeClock

try:
    import wandb
    from wandb.proto import wandb_internal_pb2
except ImportError:  # the sink's install hint is still tested below
    wandb = None

needs_wandb = pytest.mark.skipif(
    wandb is None, reason='needs wandb: pip install "torch-instrument[wandb]"'
)
HINT = re.escape('WandB sink needs wandb: pip install "torch-instrument[wandb]"')
QUIET: dict[str, Any] = {
    "console": "off",
    "x_disable_stats": True,
    "x_disable_meta": True,
    "x_disable_machine_info": True,
    "disable_git": True,
    "save_code": False,
}
Row = dict[str, Any]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield
    if wandb is not None and wandb.run is not None:  # never leave a run active
        wandb.run.finish()


def init_kwargs(tmp_path: Path) -> dict[str, Any]:
    return {
        "mode": "offline",
        "dir": str(tmp_path),
        "project": "instrument-tests",
        "settings": wandb.Settings(**QUIET),
    }


def start(tmp_path: Path) -> Any:
    return wandb.init(**init_kwargs(tmp_path))


def records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file written so far (a LevelDB-style log: a 7-byte
    header, then 32 KiB blocks of checksummed records); a torn last record is left out."""
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    block, pos, parts, found = 32768, 7, [], []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # too little room left in the block for a record header
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if pos + 7 + length > len(raw):
            break
        parts.append(raw[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            found.append(record)
            parts = []
    return found


def history(run: Any) -> dict[int, Row]:
    """The committed rows of a finished run, by step, from its ``.wandb`` file. wandb's
    service may still be writing the file when ``finish()`` returns: wait for the exit
    record, which comes last."""
    deadline = time.monotonic() + 10.0
    found = records(Path(run.settings.sync_file))
    while not any(r.WhichOneof("record_type") == "exit" for r in found):
        assert time.monotonic() < deadline, "the run's .wandb file has no exit record"
        time.sleep(0.02)
        found = records(Path(run.settings.sync_file))
    rows = {}
    for record in found:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
            rows[record.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}
    return rows


def work(clock: FakeClock, seconds: float) -> None:
    """One step whose inner region's name needs sanitizing for wandb."""
    timed_step(clock, "all_reduce (async)", seconds)


def logged(report: Report, prefix: str = "") -> Row:
    """What the sink logs for ``report``."""
    row: Row = {prefix + tag: pytest.approx(value) for tag, value in scalars(report).items()}
    row[prefix + "instrument/step"] = report.step or report.index
    return row


@needs_wandb
def test_each_report_is_one_row_at_its_step(tmp_path: Path, clock: FakeClock) -> None:
    run = start(tmp_path)
    sink = InMemory()
    reporter = instrument.Reporter(every=2, sinks=[WandB(), sink], warmup=0, memory=False)
    for forward in (0.010, 0.010, 0.020, 0.020):
        work(clock, forward)
    reporter.close()
    run.finish()
    rows = history(run)
    assert sorted(rows) == [2, 4]
    assert rows[2] == logged(sink.reports[0])
    assert rows[4] == logged(sink.reports[1])
    assert rows[4]["time/step/all_reduce_async/mean_ms"] == pytest.approx(20.0)
    assert rows[2]["throughput/tokens_per_sec"] == pytest.approx(128 / 0.022)


@needs_wandb
def test_the_users_own_metrics_keep_their_steps(tmp_path: Path, clock: FakeClock) -> None:
    run = start(tmp_path)
    reporter = instrument.Reporter(every=2, sinks=[WandB()], memory=False)
    for i in range(6):
        run.log({"loss": float(i)})  # the user's loop: one row per step, no step= given
        work(clock, 0.010)
    reporter.close()
    run.finish()
    rows = history(run)
    assert {step: row["loss"] for step, row in rows.items() if "loss" in row} == {
        i: float(i) for i in range(6)
    }  # nothing shifted or dropped by the reports in between
    assert {s: r["instrument/step"] for s, r in rows.items() if "instrument/step" in r} == {
        2: 2,
        4: 4,
        6: 6,
    }
    assert rows[4]["time/step/all_reduce_async/count"] == 2  # joined the user's row 4


@needs_wandb
def test_a_run_past_the_report_step_gets_the_report_in_its_current_row(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = start(tmp_path)
    reporter = instrument.Reporter(every=2, sinks=[WandB()], memory=False)
    with caplog.at_level(logging.INFO, logger="instrument"):
        run.log({"loss": 1.0}, step=100)  # the user counts in samples: far ahead
        work(clock, 0.010)
        work(clock, 0.010)  # report at step 2 < 100: wandb would drop it at step=2
        run.log({"loss": 2.0}, step=101)
        work(clock, 0.020)
        work(clock, 0.020)  # report at step 4
    reporter.close()
    run.finish()
    rows = history(run)
    assert sorted(rows) == [100, 101]
    assert rows[100]["loss"] == 1.0
    assert rows[100]["instrument/step"] == 2
    assert rows[101]["instrument/step"] == 4
    assert rows[101]["time/step/all_reduce_async/mean_ms"] == pytest.approx(20.0)
    (message,) = [r.getMessage() for r in caplog.records if "wandb run is at step" in r.message]
    assert "past this report's step 2" in message


@needs_wandb
def test_step_run_leaves_the_run_step_to_the_user(tmp_path: Path, clock: FakeClock) -> None:
    run = start(tmp_path)
    reporter = instrument.Reporter(every=1, sinks=[WandB(step="run")], memory=False)
    for i in range(3):
        work(clock, 0.010)  # a report per step, waiting in the open row...
        run.log({"loss": float(i)})  # ...committed with the user's metrics
    assert run.step == 3
    reporter.close()
    run.finish()
    rows = history(run)
    assert {s: (r["loss"], r["instrument/step"]) for s, r in rows.items()} == {
        0: (0.0, 1),
        1: (1.0, 2),
        2: (2.0, 3),
    }


@needs_wandb
def test_a_prefix_goes_before_every_key(tmp_path: Path, clock: FakeClock) -> None:
    run = start(tmp_path)
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[WandB(prefix="perf"), sink], memory=False)
    work(clock, 0.010)
    reporter.close()
    run.finish()
    assert history(run) == {1: logged(sink.last, prefix="perf/")}


@needs_wandb
def test_the_sink_starts_and_finishes_its_own_run_with_init_kwargs(
    tmp_path: Path, clock: FakeClock
) -> None:
    sink = WandB(**init_kwargs(tmp_path))
    assert wandb.run is None  # nothing started before the first report
    reporter = instrument.Reporter(every=None, sinks=[sink], memory=False)
    work(clock, 0.010)
    report = reporter.flush()
    run = wandb.run
    assert run is not None
    reporter.close()
    assert wandb.run is None  # finished by close()
    assert history(run) == {1: logged(report)}


@needs_wandb
def test_an_active_run_wins_over_init_kwargs_and_is_never_finished(
    tmp_path: Path, clock: FakeClock
) -> None:
    run = start(tmp_path)
    reporter = instrument.Reporter(every=None, sinks=[WandB(**init_kwargs(tmp_path))])
    work(clock, 0.010)
    reporter.close()
    assert wandb.run is run  # the user's run: used, not finished
    run.log({"loss": 0.5}, step=1)
    run.finish()
    assert history(run)[1]["loss"] == 0.5
    assert "time/step/count" in history(run)[1]


@needs_wandb
def test_an_explicit_run_is_used_and_never_finished(tmp_path: Path, clock: FakeClock) -> None:
    run = start(tmp_path)
    reporter = instrument.Reporter(every=None, sinks=[WandB(run)], memory=False)
    work(clock, 0.010)
    reporter.close()
    assert wandb.run is run
    run.finish()
    assert history(run)[1]["time/step/total_ms"] == pytest.approx(11.0)


@needs_wandb
def test_without_a_run_the_error_is_logged_once_and_other_sinks_go_on(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    memory = InMemory()
    with caplog.at_level(logging.ERROR, logger="instrument"):
        reporter = instrument.Reporter(every=1, sinks=[WandB(), memory], memory=False)
        for _ in range(3):
            work(clock, 0.010)
        reporter.close()
    assert len(memory.reports) == 3
    (record,) = caplog.records
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert "call wandb.init() before the first report" in str(record.exc_info[1])


@needs_wandb
@pytest.mark.timeout(20)
def test_a_finished_run_fails_at_once_instead_of_hanging(tmp_path: Path) -> None:
    run = start(tmp_path)
    run.finish()  # asking a finished run for its step would block for 30 s
    with pytest.raises(wandb.errors.UsageError, match="is finished"):
        WandB(run).write(Report(index=1))


class Run:
    """A stand-in with a run's ``log``, for the checks that need no wandb installed."""

    def __init__(self) -> None:
        self.calls: list[tuple[Row, dict[str, Any]]] = []

    def log(self, data: Row, **kwargs: Any) -> None:
        self.calls.append((data, kwargs))


def test_rank_zero_logs_by_default() -> None:
    sink = WandB(Run())
    assert sink.wants(0)
    assert not sink.wants(1)
    assert WandB(Run(), only_ranks="all").wants(3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"run": object()}, TypeError, "WandB run must be a wandb run"),
        ({"prefix": 3}, TypeError, "prefix must be a str, got 3"),
        ({"step": "global"}, ValueError, "unknown step 'global'; expected one of 'report'"),
        ({"commit": "yes"}, TypeError, "commit must be True, False or None, got 'yes'"),
        ({"ranks": -1}, ValueError, "unknown ranks -1"),
    ],
)
def test_bad_arguments_are_refused(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        WandB(**kwargs)


def test_missing_wandb_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=HINT) as caught:
        WandB()
    assert caught.value.name == "wandb"
    with pytest.raises(ModuleNotFoundError, match=HINT):
        WandB(project="my-project")


@needs_wandb
def test_wandb_is_imported_when_the_sink_is_made_never_at_a_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = WandB()
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(RuntimeError, match="has no wandb run"):  # not an import error
        sink.write(Report(index=1))


def test_a_run_passed_in_needs_no_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    run = Run()
    node = Node(path="x", host=Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5))
    WandB(run, commit=True).write(Report(nodes=(node,), index=3))
    ((data, kwargs),) = run.calls
    assert data["time/x/mean_ms"] == 500.0
    assert kwargs == {"step": 3, "commit": True}


@needs_wandb
def test_repr() -> None:
    assert repr(WandB(prefix="perf")) == "WandB(wandb.run, prefix='perf/', step='report')"


def test_top_limits_the_regions_logged() -> None:
    host = Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    paths = ("a", *(f"a/{i}" for i in range(12)))
    report = Report(nodes=tuple(Node(path=p, host=host) for p in paths), index=1)
    default, every = Run(), Run()
    WandB(default).write(report)
    WandB(every, top=None).write(report)
    ((limited, _),) = default.calls
    ((full, _),) = every.calls
    assert sum(key.endswith("/mean_ms") for key in limited) == 1 + 10
    assert sum(key.endswith("/mean_ms") for key in full) == 1 + 12
    with pytest.raises(ValueError, match="top must be an int >= 0, or None for every region"):
        WandB(Run(), top=-1)
