"""The package's shape: no import circle, the layering rule of docs/architecture.md kept
(tools/check_imports.py, also run by ``tox -e lint``), and the check itself catching what it
is there to catch, on small packages planted in a temporary directory."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import instrument
from instrument import _warn, clocks
from instrument.testing import reset

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_imports.py"
if not SCRIPT.exists() or not (ROOT / "instrument").is_dir():  # a copy of the tests alone
    pytest.skip(
        "checks the checkout's source tree (tools/, instrument/): not beside these tests",
        allow_module_level=True,
    )


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


check = _load_checker()

RULE = """\
# arch

<!-- layering rule -->
```text
core = pkg.core
core never imports pkg.outer
```
"""


def _plant(tmp_path: Path, files: dict[str, str], rule: str = RULE) -> Path:
    """A package ``pkg`` under ``tmp_path`` with ``files`` (path -> source) and a rule file."""
    for name, source in {"__init__.py": "", "core.py": "", "outer.py": "", **files}.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    (tmp_path / "rule.md").write_text(rule, encoding="utf-8")
    return tmp_path


def _problems(root: Path) -> list[str]:
    return list(check.problems(root, root / "rule.md", package="pkg"))


def test_the_package_has_no_import_circle_and_keeps_its_layering() -> None:
    found = check.problems()
    assert not found, "\n".join(found)


def test_observe_never_imports_the_regions() -> None:
    """Regions import observe; observe learns how to re-apply them from config."""
    edges = check.all_imports()
    found = [e for e in edges if e.source == "instrument.observe" and "region" in e.target]
    assert not found


@pytest.mark.slow  # a subprocess; the default tier runs the same check in process
def test_the_script_runs_on_its_own_and_says_what_it_found() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60
    )
    assert "# module-level imports" in result.stdout
    assert "# function-level imports" in result.stdout
    assert "instrument.registry -> instrument.stats" in result.stdout
    assert result.returncode == (1 if check.problems() else 0), result.stdout


def test_a_planted_module_level_circle_is_named_with_files_and_lines(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "a.py": "from pkg import b\n",
            "b.py": "import os\n\nimport pkg.c\n",
            "c.py": "from pkg.a import x\n",
        },
    )
    (problem,) = _problems(root)
    assert problem.splitlines()[0] == (
        "import circle through module-level imports: pkg.a -> pkg.b -> pkg.c -> pkg.a"
    )
    assert "pkg/b.py:3: pkg.b -> pkg.c (module-level)" in problem


def test_a_circle_closed_inside_a_function_is_a_circle_too(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {"a.py": "from pkg import b\n", "b.py": "def f():\n    from pkg import a\n"},
    )
    (problem,) = _problems(root)
    assert "through function-level imports: pkg.a -> pkg.b -> pkg.a" in problem
    assert "pkg/b.py:2: pkg.b -> pkg.a (function-level)" in problem


def test_type_checking_imports_and_relative_imports(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
            "b.py": "from . import a\n",
            "sub/__init__.py": "from .. import core\n",
            "sub/d.py": "from ..a import thing\nfrom .e import y\n",
            "sub/e.py": "",
        },
    )
    assert _problems(root) == []  # a -> b never runs: no circle
    edges = {(e.source, e.target, e.kind) for e in check.all_imports(root, "pkg")}
    assert ("pkg.a", "pkg.b", "typing") in edges
    assert ("pkg.b", "pkg.a", "module") in edges
    assert ("pkg.sub", "pkg.core", "module") in edges
    assert {("pkg.sub.d", "pkg.a", "module"), ("pkg.sub.d", "pkg.sub.e", "module")} <= edges


def test_a_layering_break_is_caught_at_any_level(tmp_path: Path) -> None:
    root = _plant(
        tmp_path, {"core.py": "def f():\n    import pkg.outer.deep\n", "outer/deep.py": ""}
    )
    (problem,) = _problems(root)
    assert problem == (
        "layering rule 'core' broken: pkg/core.py:2: pkg.core -> pkg.outer.deep (function-level)"
    )


def test_a_private_name_of_another_module_is_caught(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "core.py": "_hidden = 1\nshown = 2\n\n\ndef _helper():\n    return _hidden\n",
            "_private.py": "value = 3\n",
            "a.py": "from pkg.core import _helper, shown\n",
            "b.py": "from pkg import core\n\n\ndef f():\n    return core._hidden\n",
            "c.py": "import pkg.core\n\nx = pkg.core._hidden\n",
            "d.py": "from pkg import _private, core\n\ny = _private.value, core.__name__\n",
            "e.py": "from pkg import core\n\n\ndef f(core):\n    return core._own\n",
        },
    )
    assert sorted(_problems(root)) == [
        "private name across modules: pkg/a.py:1: imports pkg.core's private _helper",
        "private name across modules: pkg/b.py:5: uses pkg.core's private _hidden",
        "private name across modules: pkg/c.py:3: uses pkg.core's private _hidden",
    ]


def test_a_rule_naming_no_module_is_reported(tmp_path: Path) -> None:
    root = _plant(tmp_path, {}, RULE.replace("pkg.outer\n", "pkg.outer pkg.gone\n"))
    (problem,) = _problems(root)
    assert "names pkg.gone, which is no module" in problem


def test_the_rule_is_read_from_docs_architecture() -> None:
    rule, *others = check.read_rules((ROOT / "docs" / "architecture.md").read_text("utf-8"))
    assert rule.text == "core never imports above"
    assert "instrument.hooks" in {other.sources[0] for other in others}
    assert "instrument.registry" in rule.sources
    assert set(rule.targets) >= {
        "instrument.distributed",
        "instrument.hooks",
        "instrument.integrations",
        "instrument.compat",
    }
    with pytest.raises(ValueError, match="not a layering rule"):
        check.read_rules(RULE.replace("never imports", "imports"))


# -- one warn-once -------------------------------------------------------------------------


def test_warn_once_warns_once_per_key_until_reset() -> None:
    def caller(key: str = "test:key", message: str = "instrument: once") -> None:
        _warn.warn_once(key, message)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        caller()
        caller()
        caller("test:other", "instrument: other")
        reset()
        caller()
    assert [str(w.message) for w in seen] == [
        "instrument: once",
        "instrument: other",
        "instrument: once",
    ]
    assert {w.filename for w in seen} == {__file__}  # stacklevel 3 names the caller's caller


def test_the_clock_and_nvtx_warnings_share_the_one_warn_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(clocks.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            clocks.resolve("cuda")
            instrument.configure(nvtx=True)
        instrument.configure(nvtx=False)
    messages = [str(w.message) for w in seen]
    assert sum("clock='cuda'" in m for m in messages) == 1
    assert sum("NVTX" in m for m in messages) == (0 if instrument.observe.nvtx_available() else 1)
    assert "clock:cuda" in _warn._warned
    reset()
    assert not _warn._warned
