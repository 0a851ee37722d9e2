"""The process's life: forks at any moment, SIGTERM / SIGHUP, nothing imported in a flush.

Every test runs a real child interpreter with a hard time limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and POSIX signals")

EXITS = """
import os, signal, sys, time
# Ctrl-C raises KeyboardInterrupt, also when the tests run as a background job (which
# inherits SIGINT ignored, and Python then leaves it so)
signal.signal(signal.SIGINT, signal.default_int_handler)
import instrument
reporter = instrument.Reporter(every=1000, sinks=[instrument.sinks.Console()])
for _ in range(3):
    with instrument.timed("left_over"):
        pass
    instrument.step()
how = sys.argv[1]
if how == "sys.exit":
    sys.exit(3)
if how == "exception":
    raise RuntimeError("boom")
if how == "SIGINT":
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "status"),
    [
        pytest.param("normal", 0, marks=pytest.mark.slow),
        pytest.param("sys.exit", 3, marks=pytest.mark.slow),
        ("exception", 1),
        pytest.param("SIGINT", -2, marks=pytest.mark.slow),
    ],
)
def test_every_exit_delivers_the_last_interval(how: str, status: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXITS, how], capture_output=True, text=True, timeout=100
    )
    assert done.returncode in (status, 128 - status if status < 0 else status)
    assert "left_over" in done.stdout
    assert "3 steps" in done.stdout


@pytest.mark.slow
def test_importing_instrument_leaves_dynamo_unimported() -> None:
    """Importing Dynamo costs ~0.8 s and changes how an uncaught KeyboardInterrupt ends
    the process (status 1, not SIGINT; the SIGINT case above): only auto() may do it."""
    code = "import sys, instrument; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


FORK_STRESS = """
import os, sys, threading, time
import instrument
from instrument.sinks import JSONL, InMemory

reporter = instrument.Reporter(
    every=None, sinks=[JSONL(sys.argv[1]), InMemory()], ranks="minmax", barrier=True, memory=True
)
stop = threading.Event()

def flushing():
    while not stop.is_set():
        with instrument.timed("thread"):
            pass
        reporter.flush()

threading.Thread(target=flushing, daemon=True).start()
children = []
for _ in range(30):
    pid = os.fork()
    if pid == 0:
        import faulthandler
        faulthandler.dump_traceback_later(10, exit=True)  # a hung child says where, exits 1
        try:
            with instrument.timed("child"):
                pass
            code = 0 if "child" in reporter.flush().paths() else 3
        except BaseException as exc:
            print("child failed:", repr(exc), flush=True)
            code = 4
        os._exit(code)
    children.append(pid)
    time.sleep(0.002)
stop.set()
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
print("codes", codes)
sys.exit(0 if codes == [0] * 30 else 1)
"""


@pytest.mark.slow  # 30 forks
@pytest.mark.timeout(180)
def test_children_forked_while_another_thread_flushes_record_and_flush(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_STRESS, str(tmp_path / "run.jsonl")],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "codes [0, 0," in done.stdout


NO_IMPORTS = """
import builtins, io, logging, sys
import instrument
from instrument import lifecycle
from instrument.sinks import JSONL, ChromeTrace, Console, InMemory, Logging

out = sys.argv[1]
reporter = instrument.Reporter(
    every=2,
    sinks=[Console(io.StringIO()), Logging(), JSONL(out + "/run.jsonl"), InMemory(),
           ChromeTrace(out + "/trace.json")],
    ranks="minmax",
    barrier=True,
    memory=True,
)
imported = []
real_import = builtins.__import__

def recording(name, *args, **kwargs):
    if name not in sys.modules:  # a module loaded here (a lookup of a loaded one is safe)
        imported.append(name)
    return real_import(name, *args, **kwargs)

builtins.__import__ = recording
for _ in range(5):
    with instrument.timed("step"), instrument.timed("inner"):
        pass
    instrument.step()  # flushes at steps 2 and 4
reporter.flush()
lifecycle._flush_at_exit()
builtins.__import__ = real_import
print("imported", sorted(set(imported)))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nothing_is_imported_in_a_flush_or_the_exit_flush(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_IMPORTS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    # Import statements of modules already loaded are lookups, safe at exit (closing the
    # last ChromeTrace runs observe's `from instrument.regions import region`; Python 3.12's
    # pathlib and typing run `import ntpath` / `from inspect import ...` inside functions).
    assert done.stdout.startswith("imported ")
    assert eval(done.stdout.removeprefix("imported ")) == [], done.stderr


SIGNALLED = """
import os, signal, sys, time

mode = sys.argv[1]
signum = getattr(signal, sys.argv[2])
# from the default action, also when the tests run under nohup (SIGHUP inherited ignored)
signal.signal(signum, signal.SIG_DFL)
import instrument

def user_handler(received, frame):
    print("user handler ran", flush=True)
    if mode.endswith("exit"):
        sys.exit(7)
    if mode == "after-chain":
        previous(received, frame)  # instrument's handler: a no-op when called by another
        print("still alive after chaining", flush=True)
    global stop
    stop = True

stop = False
if mode.startswith("before"):
    signal.signal(signum, user_handler)
if mode == "ignored":
    signal.signal(signum, signal.SIG_IGN)
reporter = instrument.Reporter(every=1000, sinks=[instrument.sinks.Console()])
if mode.startswith("after"):
    previous = signal.getsignal(signum)
    signal.signal(signum, user_handler)
for _ in range(3):
    with instrument.timed("left_over"):
        pass
    instrument.step()
print("ready", flush=True)
deadline = time.monotonic() + 30
while not stop and time.monotonic() < deadline:
    time.sleep(0.01)
print("loop ended", flush=True)
"""


def _signalled(mode: str, signame: str, shell: bool = False) -> tuple[int, str]:
    """Run the script, send ``signame`` once it is ready; (exit status, stdout)."""
    argv = [sys.executable, "-c", SIGNALLED, mode, signame]
    if shell:  # the exit status as a shell (and so Slurm or a job script) sees it
        argv = ["sh", "-c", '"$@"; echo "status $?"', "sh", *argv]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        target = child.pid
        if shell:  # the interpreter is the shell's child
            found = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True)
            target = int(found.stdout.split()[0])
        os.kill(target, getattr(signal, signame))
        out, _ = child.communicate(timeout=60)
        return child.returncode, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signame", ["SIGTERM", pytest.param("SIGHUP", marks=pytest.mark.slow)])
def test_the_signal_delivers_the_last_interval_and_still_ends_the_process(
    signame: str,
) -> None:
    status, out = _signalled("none", signame)
    assert status == -getattr(signal, signame)  # died of the signal, as by default
    assert "left_over" in out
    assert "3 steps" in out
    assert "loop ended" not in out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_shell_sees_128_plus_the_signal() -> None:
    _status, out = _signalled("none", "SIGTERM", shell=True)
    assert out.rstrip().endswith("status 143")
    assert "left_over" in out
    assert "3 steps" in out


@pytest.mark.timeout(120)
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["before-exit", "after-exit"])
def test_a_user_handler_runs_and_its_exit_delivers_the_last_interval(mode: str) -> None:
    status, out = _signalled(mode, "SIGTERM")
    assert status == 7
    assert "user handler ran" in out
    assert "left_over" in out
    assert "3 steps" in out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["before-continue", "after-continue", "after-chain"])
def test_a_user_handler_that_goes_on_keeps_the_job_alive(mode: str) -> None:
    status, out = _signalled(mode, "SIGTERM")
    assert status == 0
    assert "user handler ran" in out
    assert "loop ended" in out
    if mode == "after-chain":
        assert "still alive after chaining" in out
    assert out.count("instrument report #") == 1  # one report, at the exit after the loop
    assert out.index("loop ended") < out.index("instrument report #")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_ignored_signal_stays_ignored() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SIGNALLED.replace("deadline = time.monotonic() + 30",
                                                 "deadline = time.monotonic() + 1"),
         "ignored", "SIGTERM"],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:  # fmt: skip
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    assert "loop ended" in out
    assert "3 steps" in out


@pytest.mark.slow
def test_handlers_are_installed_only_over_the_default_disposition() -> None:
    script = textwrap.dedent(
        """
        import signal, threading
        import instrument
        from instrument import lifecycle

        def mine(signum, frame):
            pass

        signal.signal(signal.SIGHUP, mine)
        instrument.Reporter(every=None, sinks=[])
        assert signal.getsignal(signal.SIGTERM) is lifecycle._on_signal
        assert signal.getsignal(signal.SIGHUP) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # someone put the default back
        instrument.Reporter(every=None, sinks=[]).flush()  # the flush installs it again
        assert signal.getsignal(signal.SIGTERM) is lifecycle._on_signal
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        flushed = []
        thread = threading.Thread(target=lambda: flushed.append(
            instrument.Reporter(every=None, sinks=[]).flush()))
        thread.start(); thread.join()
        assert flushed and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "ok\n", done.stderr
