"""The C accelerator runs in the main interpreter only.

Its state is process-wide (the bound frame variable, the region classes, the thread-local
stack), so a sub-interpreter that loaded and bound it took the main interpreter's regions
away ("malformed region frame"). Now its import fails in a sub-interpreter with an
``ImportError``, ``instrument._native`` falls back to pure Python there, and the main
interpreter keeps recording. (``import instrument`` itself needs torch, which does not load
in a sub-interpreter, so the sub-interpreter side loads the extension and ``_native`` by
path.) Each check runs in a subprocess, so a crash fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import instrument
from instrument._native import speedups

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled"),
    pytest.mark.timeout(120),
]

# Runs inside the sub-interpreter: load the extension from its file and bind it.
LOAD_AND_BIND = """
import contextvars, importlib.machinery, importlib.util, os, time
loader = importlib.machinery.ExtensionFileLoader("instrument._speedups", {path!r})
spec = importlib.util.spec_from_file_location("instrument._speedups", {path!r}, loader=loader)
try:
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    class R(m.RegionBase):
        pass
    m.bind_stack(contextvars.ContextVar("f"), (m.NodeBase(), 0, None, None, None))
    m.bind(time.perf_counter_ns, R, R)
    os.write(1, b"sub: bound\\n")
except ImportError as exc:
    os.write(1, f"sub: ImportError: {{exc}}\\n".encode())
"""

# Runs inside the sub-interpreter: instrument._native with a bare `instrument` package
# (no torch), as `import instrument` would run it.
NATIVE_FALLS_BACK = """
import importlib, os, sys, types
package = types.ModuleType("instrument")
package.__path__ = [{package!r}]
sys.modules["instrument"] = package
native = importlib.import_module("instrument._native")
os.write(1, f"sub: speedups={{native.speedups}}\\n".encode())
"""

MAIN = """
import _testcapi, contextvars, gc, instrument
from instrument import registry
print("sub rc", _testcapi.run_in_subinterp({sub!r}), flush=True)

def task():
    with instrument.timed("in a task"):
        pass

with instrument.timed("after"):
    with instrument.timed("inner"):
        pass
    contextvars.copy_context().run(task)
gc.collect()
print("main:", sorted(registry.ROOT.children), list(registry.ROOT.children["after"].children))
"""


def _run(sub: str) -> str:
    pytest.importorskip("_testcapi")
    code = MAIN.format(sub=textwrap.dedent(sub))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("INSTRUMENT_NO_EXTENSIONS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, f"died ({out.returncode}):\n{out.stdout}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.slow
def test_the_extension_refuses_a_sub_interpreter_and_main_keeps_recording() -> None:
    assert speedups is not None
    out = _run(LOAD_AND_BIND.format(path=speedups.__file__))
    assert "sub: ImportError: instrument._speedups: the C accelerator runs in the main " in out
    assert "sub: bound" not in out
    assert "main: ['after'] ['inner', 'in a task']" in out


@pytest.mark.slow
def test_instrument_native_falls_back_to_pure_python_in_a_sub_interpreter() -> None:
    out = _run(NATIVE_FALLS_BACK.format(package=str(Path(instrument.__file__).parent)))
    assert "sub: speedups=None" in out
    assert "main: ['after'] ['inner', 'in a task']" in out
