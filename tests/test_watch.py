"""``python -m instrument watch``: the live view, against files a real Reporter writes.

The terminal tests fork a child that runs the command on a pseudo-terminal while this
process writes the run (a Reporter with the JSONL sink, on a fake clock), one report at a
time; each has a hard time limit.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import instrument
from instrument import cli
from instrument.sinks.jsonl import JSONL
from instrument.testing import FakeClock, use_clock
from instrument.watch.follow import Tail, Track
from instrument.watch.frame import frame

DATA_HEAVY = {"data": 0.030, "forward": 0.010, "backward": 0.015}  # input-bound


class Run:
    """A run written report by report: each :meth:`report` runs ``steps`` steps of
    ``regions`` (seconds, on a fake clock) and flushes one line; :meth:`close` ends it
    (its summary written)."""

    def __init__(self, path: Path, regions: dict[str, float], steps: int = 4) -> None:
        self.clock = FakeClock()
        self.regions, self.steps = regions, steps
        with use_clock(self.clock):
            self.reporter = instrument.Reporter(every=None, sinks=[JSONL(path)], memory=False)

    def report(self) -> None:
        with use_clock(self.clock):
            for _ in range(self.steps):
                for name, seconds in self.regions.items():
                    with instrument.timed(name):
                        self.clock.advance(seconds)
                instrument.step()
            self.reporter.flush()

    def close(self) -> None:
        with use_clock(self.clock):
            self.reporter.close()


# -- the terminal -------------------------------------------------------------------------


class Terminal:
    """``instrument watch ARGS`` in a forked child on a pseudo-terminal of 120x40."""

    def __init__(self, *args: str) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the command on the terminal, then out at once
            code = 3
            try:
                sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                code = cli.main(["watch", "--interval", "0.05", *args])
                sys.stdout.flush()
            finally:
                os._exit(code)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.pid, self.fd = pid, fd
        self.output = b""

    @classmethod
    def attach(cls, pid: int, fd: int) -> Terminal:
        """The terminal ``fd`` (the main side) of a process started otherwise."""
        term = cls.__new__(cls)
        term.pid, term.fd, term.output = pid, fd, b""
        return term

    def read_until(self, done: Callable[[str], bool], timeout: float = 10.0) -> str:
        """Read the terminal until ``done(text so far)``; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.text):
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(min(left, 0.1)):
                raise AssertionError(f"timed out; the terminal showed:\n{self.text[-3000:]}")
        return self.text

    def pump(self, timeout: float) -> bool:
        """Read what the terminal shows within ``timeout`` seconds; False once it closed."""
        if select.select([self.fd], [], [], timeout)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                return False
            self.output += chunk
            return bool(chunk)
        return True

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", "replace")

    def wait(self, timeout: float = 10.0) -> int:
        """The child's exit code, reading the terminal meanwhile; kill it after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self.pump(0.05) and select.select([self.fd], [], [], 0)[0]:
                    pass
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            self.pump(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        raise AssertionError(f"watch did not exit; the terminal showed:\n{self.text[-3000:]}")


def frames_of(text: str) -> int:
    return text.count("instrument watch")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("plain", [False, True], ids=["rich", "plain"])
def test_live_view_follows_the_run_and_exits_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plain: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    path = Path("run.jsonl")
    term = Terminal(str(path), *(["--plain"] if plain else []))
    term.read_until(lambda text: "waiting for" in text)  # the file does not exist yet
    run = Run(path, DATA_HEAVY)
    run.report()
    term.read_until(lambda text: "report #1" in text)
    run.report()
    run.report()
    text = term.read_until(lambda text: "report #3" in text)
    assert "verdict: INPUT-BOUND" in text
    assert "data" in text
    assert "ms/step" in text
    run.close()  # the summary: the view ends by itself
    assert term.wait() == 0
    assert "ended (summary written)" in term.text
    assert "instrument run summary" in term.text
    assert "\x1b[?25h" in term.text  # the cursor shown again


@pytest.mark.timeout(30)
@pytest.mark.parametrize("plain", [False, True], ids=["rich", "plain"])
def test_ctrl_c_ends_the_view_cleanly(tmp_path: Path, plain: bool) -> None:
    path = tmp_path / "run.jsonl"
    run = Run(path, DATA_HEAVY)
    run.report()
    term = Terminal(str(path), *(["--plain"] if plain else []))
    term.read_until(lambda text: "verdict:" in text)
    os.kill(term.pid, signal.SIGINT)
    assert term.wait() == 0
    assert "Traceback" not in term.text
    assert term.text.rfind("\x1b[?25h") > term.text.rfind("\x1b[?25l")  # cursor shown again


# -- one frame, files, errors -------------------------------------------------------------


def test_once_draws_one_frame_of_a_finished_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    run = Run(path, DATA_HEAVY)
    for _ in range(4):
        run.report()
    run.close()
    assert cli.main(["watch", str(path), "--once"]) == 0
    out = capsys.readouterr().out
    assert frames_of(out) == 1
    assert out.startswith("instrument watch · ended (summary written) · ")
    assert "report #4 · step 16" in out
    assert "verdict: INPUT-BOUND (warning) on data" in out
    data = next(line for line in out.splitlines() if line.startswith("data "))
    assert data.split()[1:3] == ["30.000", "54.5%"]  # 30 of 55 ms per step


def test_a_log_gets_a_frame_per_new_report_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    run = Run(path, DATA_HEAVY)
    run.report()
    run.report()
    assert cli.main(["watch", str(path), "--idle", "0.2", "--interval", "0.05"]) == 0
    out = capsys.readouterr().out
    assert frames_of(out) == 2  # the reports, then the end
    assert "ended: no new report for" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b'{"a": 1}\n', "not an instrument report"),
    ],
)
def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None,
                message: str) -> None:  # fmt: skip
    path = tmp_path / "run.jsonl"
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["watch", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"instrument: error: {path}")
    assert message in err


def test_tail_reads_complete_lines_once_and_starts_over_when_truncated(tmp_path: Path) -> None:
    path = tmp_path / "f"
    tail = Tail(path)
    assert tail.read() == ([], False)  # not there yet
    path.write_bytes(b"one\ntw")
    assert tail.read() == ([(1, b"one\n")], False)
    assert tail.read() == ([], False)  # the half-written line waits for its newline
    with open(path, "ab") as file:
        file.write(b"o\nthree\n")
    assert tail.read() == ([(2, b"two\n"), (3, b"three\n")], False)
    path.write_bytes(b"new\n")  # truncated and written again
    assert tail.read() == ([(1, b"new\n")], True)
    other = tmp_path / "g"
    other.write_bytes(b"other file, longer than the first\n")
    os.replace(other, path)  # replaced
    assert tail.read() == ([(1, b"other file, longer than the first\n")], True)


def test_a_new_run_appended_to_the_file_starts_the_history_again(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    first = Run(path, DATA_HEAVY)
    for _ in range(3):
        first.report()
    first.close()
    track = Track(path)
    track.update()
    assert track.reports == 3
    assert track.summary() is not None
    instrument.testing.reset()
    second = Run(path, {"forward": 0.01})
    second.report()
    with open(path, "ab") as file:
        file.write(b"cut off mid-li")  # and then a line the next write completes
    second.report()
    track.update()
    assert track.reports == 1
    assert track.last is not None
    assert track.last.index == 1
    assert track.summary() is None  # the first run's summary is not this run's
    assert "not JSON" in track.skipped


def test_slowest_rank_of_several_files(tmp_path: Path) -> None:
    tracks = []
    for rank, backward in enumerate((0.010, 0.030, 0.012)):
        path = tmp_path / f"run.rank{rank}.jsonl"
        run = Run(path, {"forward": 0.010, "backward": backward})
        run.report()
        text = (
            path.read_text()
            .replace('"rank":0', f'"rank":{rank}')
            .replace('"world_size":1', '"world_size":3')
        )
        path.write_text(text)
        track = Track(path)
        track.update()
        tracks.append(track)
        instrument.testing.reset()
    text = "\n".join(line for line, _ in frame(tracks, "running"))
    assert "slowest rank: 1: 40.00 ms per step outside collectives vs 20.00 ms on rank 0" in text
    assert "by rank: 1 40.00 · 2 22.00 · 0 20.00" in text
    assert "3 ranks" in text.splitlines()[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plain", [False, True], ids=["rich", "plain"])
def test_watch_a_real_training_run(tmp_path: Path, plain: bool) -> None:
    """examples/train_lm.py writes its JSONL while ``watch`` (its own process, on a
    pseudo-terminal) follows it, and ends when the run does."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    main, child = os.openpty()
    fcntl.ioctl(main, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    command = [sys.executable, "-m", "instrument", "watch", "run.jsonl", "--interval", "0.2"]
    watcher = subprocess.Popen(command + (["--plain"] if plain else []), cwd=tmp_path,
                               env=env, stdin=child, stdout=child, stderr=child)  # fmt: skip
    os.close(child)
    term = Terminal.attach(watcher.pid, main)  # read it, not wait for it
    script = str(root / "examples" / "train_lm.py")
    train = [sys.executable, script, "--steps", "12", "--every", "3", "--layers", "1",
             "--device", "cpu", "--jsonl", "run.jsonl"]  # fmt: skip
    trainer = subprocess.Popen(train, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
    try:
        assert trainer.wait(timeout=240) == 0
        deadline = time.monotonic() + 30
        while watcher.poll() is None and time.monotonic() < deadline:
            term.pump(0.1)
        while term.pump(0.05) and select.select([main], [], [], 0)[0]:
            pass
    finally:
        trainer.kill()
        watcher.kill()
        trainer.wait()
        os.close(main)
    assert watcher.wait() == 0
    text = term.text
    assert "waiting for" in text  # started before the file existed
    assert "verdict:" in text
    assert "ms/step" in text
    assert "ended (summary written)" in text
    assert "Traceback" not in text
