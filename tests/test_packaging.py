"""The distribution: its name, one version, and the C accelerator's version gate."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import pytest

import instrument
from instrument._native import speedups

ROOT = Path(__file__).resolve().parent.parent
CHECKED_PYTHONS = {(3, 10), (3, 11), (3, 12), (3, 13)}


def _project() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("torch-instrument")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_distribution_name_is_ours_and_version_comes_from_the_package() -> None:
    project = _project()
    assert project["name"] == "torch-instrument"  # "instrument" on PyPI is another project
    assert "version" not in project
    assert project["dynamic"] == ["version"]


@pytest.mark.skipif(_installed_version() is None, reason="torch-instrument is not installed")
def test_installed_metadata_matches_instrument_version() -> None:
    assert instrument.__version__ == _installed_version()


def test_declared_pythons_are_the_checked_ones() -> None:
    project = _project()
    assert project["requires-python"] == ">=3.10"  # a lower bound only: docs/compatibility.md
    listed = {
        tuple(int(p) for p in c.rsplit(" ", 1)[1].split("."))
        for c in project["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    }
    assert listed == CHECKED_PYTHONS


def test_runtime_dependencies_have_lower_bounds_only() -> None:
    # an upper cap would make pip replace a user's torch (or refuse to install beside it)
    for requirement in _project()["dependencies"]:
        assert ">=" in requirement, requirement
        assert "<" not in requirement.replace(">=", ""), requirement
        assert "==" not in requirement, requirement


@pytest.mark.skipif(speedups is None, reason="the C accelerator is not built")
def test_c_accelerator_reads_the_context_layout_only_where_it_was_checked() -> None:
    assert speedups is not None
    known = sys.version_info[:2] in CHECKED_PYTHONS
    assert bool(speedups.CONTEXT_LAYOUT_KNOWN) is known
    # the stack holders are used exactly where the layout is known and confirmed at run time
    assert speedups.use_holders() is known


def test_install_hints_name_the_distribution() -> None:
    from instrument import cli
    from instrument.sinks import tensorboard, wandb

    for hint in (cli.PLOT_HINT, tensorboard.INSTALL_HINT, wandb.INSTALL_HINT):
        assert 'pip install "torch-instrument[' in hint
