"""Promises of the docs that no other test held (docs/testing.md lists which test guards what)."""

from __future__ import annotations

import inspect
import io
import re
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import instrument
import instrument.sinks
import instrument.testing
from instrument.testing import FakeClock, capture_reports, reset

API = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text(encoding="utf-8")


def _documented_signatures() -> list[tuple[str, list[str]]]:
    """(dotted name, parameter names) of each one-call signature block of api.md."""
    out = []
    for body in re.findall(r"```py\n(.*?)```", API, re.S):
        match = re.match(r"(instrument(?:\.\w+)+)\((.*?)\)(?: -> [^\n]*)?\n", body, re.S)
        if match is None or body.count("\ninstrument.") or "\n\n" in body.strip():
            continue
        params = []
        depth = 0
        current = ""
        for char in re.sub(r"#[^\n]*", "", match.group(2)) + ",":
            depth += char in "([{"
            depth -= char in ")]}"
            if char == "," and depth == 0:
                name = re.split(r"[:=]", current.strip())[0].strip().lstrip("*")
                if name and name not in ("/", ""):
                    params.append(name)
                current = ""
            else:
                current += char
        out.append((match.group(1), params))
    return out


def _resolve(dotted: str) -> Any:
    obj: Any = instrument
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


SIGNATURES = _documented_signatures()


@pytest.mark.parametrize(("dotted", "params"), SIGNATURES, ids=[d for d, _ in SIGNATURES])
def test_api_signatures_name_the_real_parameters(dotted: str, params: list[str]) -> None:
    """api.md's signature blocks list the parameters the code takes, in order (items 6, 14)."""
    if dotted == "instrument.timed":
        pytest.skip("timed has several forms; its first line is the named one")
    real = list(inspect.signature(_resolve(dotted)).parameters)
    assert params == real


def test_api_signature_blocks_are_found() -> None:
    names = {dotted for dotted, _ in _documented_signatures()}
    assert {"instrument.auto", "instrument.Reporter", "instrument.configure"} <= names
    assert {"instrument.sinks.JSONL", "instrument.testing.FakeClock"} <= names


def _backticked_row(title: str, member: str) -> set[str]:
    section = API.split(f"### `{title}`", 1)[1].split("\n### ", 1)[0]
    row = next(line for line in section.split("\n") if line.startswith(f"| `{member}"))
    keys = row.split("|")[2]
    return set(re.findall(r"`(\w+)`", keys))


def test_report_to_dict_keys_are_the_documented_ones() -> None:
    with capture_reports() as reports:
        instrument.step()
    assert set(reports[-1].to_dict()) == _backticked_row("Report", "to_dict()")


def test_node_to_dict_keys_are_the_documented_ones() -> None:
    section = API.split("### `Node`", 1)[1].split("\n### ", 1)[0]
    documented = re.search(r"`to_dict\(\)` gives `\{(.*?)\}`", section, re.S)
    assert documented is not None
    keys = set(re.findall(r'"(\w+)"', documented.group(1)))
    with capture_reports() as reports, instrument.timed("x"):
        pass
    assert set(reports[-1]["x"].to_dict()) == keys


def test_report_and_node_fields_are_all_in_the_tables() -> None:
    import dataclasses

    for cls, title in ((instrument.Report, "Report"), (instrument.Node, "Node")):
        section = API.split(f"### `{title}`", 1)[1].split("\n### ", 1)[0]
        for field in dataclasses.fields(cls):
            if not field.name.startswith("_"):
                assert f"`{field.name}`" in section, f"{title}.{field.name} is not in api.md"


def test_timed_returns_one_cached_object_per_name_and_options() -> None:
    assert instrument.timed("x") is instrument.timed("x")
    assert instrument.timed("x", level=1) is instrument.timed("x", level=1)
    assert instrument.timed("x", level=1) is not instrument.timed("x")


def test_a_bare_decorator_uses_the_qualname_with_slashes_made_dots() -> None:
    def load() -> None:
        pass

    load.__qualname__ = "a/b"
    decorated = instrument.timed(load)
    with capture_reports() as reports:
        decorated()
    assert reports[-1].paths() == ("a.b",)


def test_configure_validates_every_option_before_changing_any(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="nvtx must be True or False"):
        instrument.configure(clock="cpu", level=3, nvtx="yes")  # type: ignore[arg-type]
    with capture_reports() as reports, instrument.timed("deep", level=5):  # level 3: skipped
        clock.advance(1.0)
    assert reports[-1]["deep"].total == 1.0


def test_the_first_step_is_timed_from_the_reporters_construction(clock: FakeClock) -> None:
    clock.advance(5.0)
    reporter = instrument.Reporter(every=None, memory=False)
    clock.advance(0.25)
    reporter.step()
    clock.advance(0.5)
    reporter.step()
    report = reporter.flush()
    assert report.step_time is not None
    assert (report.step_time.min, report.step_time.max) == (0.25, 0.5)
    reporter.close()


def test_close_returns_none_when_nothing_is_pending_or_already_closed() -> None:
    reporter = instrument.Reporter(every=None)
    assert reporter.close() is None
    with instrument.timed("x"):
        pass
    assert reporter.close() is None  # already closed: the record waits for another reporter
    assert instrument.Reporter(every=None).flush().paths() == ("x",)


def test_a_sinks_ranks_choose_which_reports_it_gets() -> None:
    rank0, rank1 = io.StringIO(), io.StringIO()
    got: list[instrument.Report] = []
    sinks = [
        instrument.sinks.Console(rank0),
        instrument.sinks.Console(rank1, only_ranks=1),
        instrument.sinks.Console(io.StringIO(), only_ranks=[0, 2]),
        got.append,
    ]
    reporter = instrument.Reporter(every=None, sinks=sinks)
    with instrument.timed("x"):
        pass
    reporter.flush()
    assert "x" in rank0.getvalue()
    assert rank1.getvalue() == ""
    assert reporter.sinks[2].wants(0)
    assert not reporter.sinks[2].wants(1)
    assert reporter.sinks[3].wants(5)  # a callable gets every rank's report
    assert len(got) == 1


def test_a_timer_stopped_on_another_thread_still_records(clock: FakeClock) -> None:
    timer = instrument.Timer("load").start()
    clock.advance(0.125)
    worker = threading.Thread(target=timer.stop)
    worker.start()
    worker.join()
    report = instrument.Reporter(every=None).flush()
    assert report["load"].total == 0.125
    assert instrument.current_path() == "load"  # still on the starting thread's stack


def test_reset_forgets_which_warnings_were_issued() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: no fallback warning")

    def fallback_warnings(name: str) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                with instrument.timed(name, clock="cuda"):
                    pass
        return len(caught)

    assert fallback_warnings("m") == 1
    assert fallback_warnings("n") == 0  # once per clock name per process
    reset()
    assert fallback_warnings("o") == 1


def test_capture_reports_flushes_what_is_pending_when_the_block_ends(clock: FakeClock) -> None:
    with capture_reports(every=2) as reports:
        with instrument.timed("a"):
            clock.advance(1.0)
        instrument.step()
    assert len(reports) == 1
    assert reports[0]["a"].total == 1.0


def test_other_is_none_without_steps_and_never_negative(clock: FakeClock) -> None:
    with capture_reports() as reports, instrument.timed("a"):
        clock.advance(1.0)
    assert reports[-1].other is None
    with capture_reports(memory=False) as reports:
        with instrument.timed("a"):
            clock.advance(1.0)
        instrument.step()
    assert reports[-1].other == 0.0


def test_console_without_unicode_uses_ascii_in_title_and_tree(clock: FakeClock) -> None:
    stream = io.StringIO()
    sinks = [instrument.sinks.Console(stream, unicode=False)]
    with capture_reports(sinks=sinks), instrument.timed("a"), instrument.timed("b"):
        clock.advance(1.0)
    text = stream.getvalue()
    assert "·" not in text
    assert "`-- b" in text
    assert " - " in text.split("\n")[0]


def test_in_memory_last_without_a_report_names_the_problem() -> None:
    with pytest.raises(IndexError, match="no report has been written to this sink yet"):
        _ = instrument.sinks.InMemory().last


def test_an_object_with_write_and_close_is_a_sink_and_is_closed() -> None:
    class Collect:
        def __init__(self) -> None:
            self.written = 0
            self.closed = False

        def write(self, report: instrument.Report) -> None:
            self.written += 1

        def close(self) -> None:
            self.closed = True

    collect = Collect()
    reporter = instrument.Reporter(every=None, sinks=[collect])
    with instrument.timed("x"):
        pass
    reporter.close()
    assert (collect.written, collect.closed) == (1, True)
