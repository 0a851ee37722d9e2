"""Random and mutated report files against every command: the exit code is 0, 2 (a bad
input, named as ``instrument: error: <file>[:<line>]: <what>``) or 1 only for a
``--fail-above`` regression, and never a traceback."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import A, B, write_run

from instrument import cli

ODD_NUMBERS = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "9" * 5000, "1e308", "-1",
               "5e-324", "0", "-0.0", "2.5", "18446744073709551616"]  # fmt: skip
ODD_STRINGS = ["nan", "inf", "-1", "", "(step)", "(other)", "a\nb", "a/", "/", "steps", "\x00"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(ODD_STRINGS)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@functools.cache
def good_lines(name: str) -> tuple[str, ...]:
    """The lines of a real run (A or B regions), written once per session."""
    folder = Path(tempfile.mkdtemp(prefix="instrument-fuzz-"))
    write_run(folder / "run.jsonl", A if name == "a" else B, reports=4)
    return tuple((folder / "run.jsonl").read_text().splitlines())


def leaves(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a decoded report (containers and leaves)."""
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += leaves(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += leaves(value, (*prefix, i))
    return found


@st.composite
def mutated_line(draw: st.DrawFn, line: str) -> str:
    """``line`` with one value replaced, deleted, or its raw text cut or spliced."""
    how = draw(st.sampled_from(["value", "odd_number", "delete", "cut", "splice"]))
    if how == "cut":
        return line[: draw(st.integers(0, len(line)))]
    if how == "splice":
        at = draw(st.integers(0, len(line)))
        return (
            line[:at]
            + draw(st.sampled_from(["[" * 5000, "}", '"', "\\", "\n", "\x00", ","]))
            + line[at:]
        )
    data = json.loads(line)
    target = draw(st.sampled_from(leaves(data)[1:]))
    parent = data
    for key in target[:-1]:
        parent = parent[key]
    if how == "delete":
        del parent[target[-1]]
        return json.dumps(data)
    marker = "@@ODD@@"
    parent[target[-1]] = marker if how == "odd_number" else draw(json_values)
    text = json.dumps(data)
    return text.replace(f'"{marker}"', draw(st.sampled_from(ODD_NUMBERS)))


@st.composite
def report_file(draw: st.DrawFn) -> str:
    """A run's lines with some of them mutated (or a random JSON value instead)."""
    lines = list(good_lines(draw(st.sampled_from(["a", "b"]))))
    for i in draw(st.sets(st.integers(0, len(lines) - 1), min_size=1, max_size=2)):
        lines[i] = draw(mutated_line(lines[i]))
    if draw(st.integers(0, 9)) == 0:
        lines.append(json.dumps(draw(json_values)))
    return "\n".join(lines) + "\n"


def check_exit(code: int, err: str, files: list[Path], fail_above: bool) -> None:
    assert "Traceback" not in err
    assert "internal error" not in err, err
    if code == 1:
        assert fail_above, err
        assert "slowed significantly" in err, err
        return
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err.startswith("instrument: error: "), err
        assert any(f"error: {f}" in err for f in files), err


COMMANDS = {
    "show": lambda bad, good, out: ["show", bad, "--all"],
    "diff_b": lambda bad, good, out: ["diff", good, bad, "--fail-above", "10"],
    "diff_a": lambda bad, good, out: ["diff", bad, good, "--fail-above", "10"],
    "diff_both": lambda bad, good, out: ["diff", bad, bad],
    "html": lambda bad, good, out: ["html", bad, "--base", good, "-o", out / "x.html"],
    "html_base": lambda bad, good, out: ["html", good, "--base", bad, "-o", out / "x.html"],
}


def check_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str
) -> None:
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_text(text)
    good.write_text("\n".join(good_lines("a")) + "\n")
    argv = COMMANDS[command](bad, good, tmp_path)
    code = cli.main([str(arg) for arg in argv])
    _, err = capsys.readouterr()
    check_exit(code, err, [bad, good], "--fail-above" in argv)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(text=report_file())
def test_every_command_exits_0_1_or_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str
) -> None:
    check_command(tmp_path, capsys, command, text)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(text=report_file())
def test_every_command_exits_0_1_or_2_without_a_traceback_on_many_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str
) -> None:
    check_command(tmp_path, capsys, command, text)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(text=report_file())
def test_plot_exits_0_or_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    pytest.importorskip("matplotlib")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    code = cli.main(["plot", str(bad), "-o", str(tmp_path / "x.png")])
    _, err = capsys.readouterr()
    check_exit(code, err, [bad], fail_above=False)
