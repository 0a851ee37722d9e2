"""The tree at exit of a script that only uses ``timed``, and ``Reporter()``'s console.

The switches are checked in this process; the exit itself in child interpreters with a hard
time limit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import instrument
from instrument import _state, exit_summary, lifecycle

TIMED_ONLY = """
import sys, time, instrument
if "configure-off" in sys.argv:
    instrument.configure(exit_summary=False)

@instrument.timed("work")
def work():
    with instrument.timed("inner"):
        time.sleep(0.005)  # most of work's time: a row never folded away

for _ in range(3):
    work()
print("done")
if "raise" in sys.argv:
    raise SystemExit(4)
"""

WITH_REPORTER = """
import instrument
reporter = instrument.Reporter(every=None)   # no sinks given: the console
with instrument.timed("work"):
    pass
print("done")
"""


def launch(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if k != "INSTRUMENT_EXIT_SUMMARY"}
    environment.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def finish(child: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = child.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    return child.returncode, out, err


@pytest.mark.timeout(120)
def test_a_timed_only_script_prints_one_tree_at_exit() -> None:
    code, out, err = finish(launch(TIMED_ONLY))
    assert (code, out) == (0, "done\n"), err
    assert err.count("instrument report #1") == 1
    assert "work" in err
    assert "inner" in err


@pytest.mark.slow  # four more interpreters
@pytest.mark.timeout(180)
def test_the_exit_tree_is_left_to_a_reporter_switched_off_and_survives_sys_exit() -> None:
    with_reporter = launch(WITH_REPORTER)
    by_env = launch(TIMED_ONLY, env={"INSTRUMENT_EXIT_SUMMARY": "0"})
    by_configure = launch(TIMED_ONLY, "configure-off")
    by_exit = launch(TIMED_ONLY, "raise")
    code, out, err = finish(with_reporter)
    assert code == 0, err
    assert out.startswith("done\n")
    assert out.count("instrument report #1") == 1  # the reporter's own, at exit
    assert "instrument report" not in err
    assert finish(by_env) == (0, "done\n", "")
    assert finish(by_configure) == (0, "done\n", "")
    code, out, err = finish(by_exit)
    assert (code, out, err.count("instrument report #1")) == (4, "done\n", 1)


@pytest.fixture
def no_reporter_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if no reporter had been made, with the switch on."""
    monkeypatch.setattr(lifecycle, "_reporter_made", False)
    monkeypatch.setattr(_state, "exit_summary", True)


@pytest.mark.usefixtures("no_reporter_yet")
def test_the_exit_tree_is_wanted_only_for_records_without_a_reporter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert not exit_summary.wanted()  # nothing recorded
    with instrument.timed("work"):
        pass
    assert exit_summary.wanted()
    instrument.configure(exit_summary=False)
    assert not exit_summary.wanted()
    instrument.configure(exit_summary=True)
    instrument.disable()
    assert not exit_summary.wanted()
    instrument.enable()
    exit_summary.report_at_exit()
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("instrument report #1")
    assert "work" in err
    assert not exit_summary.wanted()  # a reporter made (and its records taken)
    with instrument.timed("after"):
        pass
    assert not exit_summary.wanted()
    with pytest.raises(ValueError, match="exit_summary must be True or False, got 'no'"):
        instrument.configure(exit_summary="no")  # type: ignore[arg-type]


def test_reporter_without_sinks_prints_and_an_empty_list_means_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with instrument.Reporter(every=None, memory=False) as reporter:
        with instrument.timed("shown"):
            pass
        reporter.flush()
    assert "shown" in capsys.readouterr().out
    with instrument.Reporter(every=None, sinks=[]) as reporter:
        with instrument.timed("hidden"):
            pass
        assert reporter.sinks == ()
        reporter.flush()
    assert capsys.readouterr() == ("", "")


@pytest.mark.usefixtures("no_reporter_yet")
def test_a_worker_process_leaves_the_exit_tree_to_the_main_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with instrument.timed("in a worker"):
        pass
    assert exit_summary.wanted()
    monkeypatch.setattr(exit_summary.multiprocessing, "parent_process", lambda: object())
    assert not exit_summary.wanted()
