"""The docs run: every Python block and shell command of README.md and docs/*.md.

Each markdown file is one run: its Python blocks run in order in one namespace (in a
fresh interpreter, in a temporary directory), and its shell commands run in the same
directory, so a command can read the files that earlier blocks wrote. The output block
shown after a block (a plain or ``text`` fence, right after it or after one short line
such as "prints", or one prose line ending in "prints") is compared with what the block
printed, numbers normalised: every number becomes ``N`` and runs of spaces become one, so
names, order and tree structure must match while timings may differ. A line ``...`` in a
shown output stands for any number of lines.

A block that cannot run here is marked in the markdown, right before its fence, with a
reason the reviewer can see::

    <!-- not run: needs a GPU -->
    <!-- not run: needs several processes (torchrun) -->
    <!-- not run: needs a network -->
    <!-- not run: a signature -->
    <!-- not run: a fragment (model, loader and batch are yours) -->

Fragments are still compiled, so their syntax is checked. A file that says
``<!-- docs-test: every Python block is a complete script -->`` gets each of its Python
blocks run on its own (a forked interpreter: fresh namespace, registry and loggers), and
one that says ``<!-- docs-test: numbers are exact -->`` has its numbers compared as they
are (except memory lines, the self-cost line, the ``s wall`` of report titles and object
addresses), and one
that says ``<!-- docs-test: lines in any order -->`` (trees of real timings, whose small
rows fold or not by their time) has its output lines compared as a multiset.
``INSTRUMENT_DOCS_UPDATE=1 python -m pytest tests/test_docs.py`` rewrites every shown
output that no longer matches with what the block printed (matching ones are left as they
are).
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console"}
OUTPUT = {"", "text"}
REASONS = (
    "needs a GPU",
    "needs several processes",
    "needs several machines",
    "needs a network",
    "a signature",
    "a fragment",
    "runs this test suite",
)
# A file whose Python blocks are each a complete script says so; each then runs on its own.
ISOLATED = "<!-- docs-test: every Python block is a complete script -->"
# A file whose outputs come from a fake clock says so; its numbers are then compared exactly.
EXACT = "<!-- docs-test: numbers are exact -->"
# A file whose outputs are trees of real timings says so; their lines may come in any order.
UNORDERED = "<!-- docs-test: lines in any order -->"
MARKER = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->$")
# Pages known to differ from what they print: each one's test is an expected failure
# (the value is the reason).
KNOWN_DRIFT: dict[str, str] = {}
# Pages whose run takes more than a few seconds (an offline wandb run, Lightning fits, many
# blocks each in its own interpreter): the slow tier runs them, the default tier the rest.
SLOW_DOCS = {
    "api.md",
    "distributed_helpers.md",
    "lightning.md",
    "migration.md",
    "sinks.md",
    "testing.md",
    "watch.md",
}


@dataclass
class Block:
    """One fenced block: where it is, its language, its text and what follows it."""

    lang: str
    start: int  # index of the opening fence line
    end: int  # index of the closing fence line
    body: str
    skip: str | None  # the reason from a "not run" marker
    output: Block | None = None  # the shown output, for a runnable block


def parse(text: str) -> list[Block]:
    """Fenced blocks of a markdown text, each runnable one linked to its shown output."""
    lines = text.split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        lang = line[3:].strip().split(" ")[0].lower()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        before = [x.strip() for x in lines[:i] if x.strip()][-1:]
        match = MARKER.match(before[0]) if before else None
        body = "\n".join(lines[i + 1 : j])
        blocks.append(Block(lang, i, j, body, match.group(1) if match else None))
        i = j + 1
    for block, after in itertools.pairwise(blocks):
        between = [x.strip() for x in lines[block.end + 1 : after.start] if x.strip()]
        short = not between or (
            len(between) == 1
            and (len(between[0]) <= 20 or between[0].rstrip(":").endswith("prints"))
            and not between[0].startswith(("#", "<"))
        )
        if (
            block.lang in PYTHON | {"bash", "sh", "shell"}
            and after.lang in OUTPUT
            and short
            and after.skip is None
        ):
            block.output = after
    return blocks


def check_markers(blocks: list[Block]) -> list[str]:
    """Problems with "not run" markers: only the listed reasons are accepted."""
    return [
        f"line {b.start + 1}: 'not run: {b.skip}' — a block may be left out only when it "
        f"{' / '.join(REASONS)}"
        for b in blocks
        if b.skip is not None and not b.skip.startswith(REASONS)
    ]


# ---------------------------------------------------------------- the page's run (child)


def _console_script(body: str) -> tuple[str, list[str]]:
    """A bash script for a console block's ``$ `` commands, and the expected outputs."""
    commands: list[str] = []
    expected: list[str] = []
    for line in body.split("\n"):
        if line.startswith("$ "):
            commands.append(line[2:])
            expected.append("")
        elif commands:
            expected[-1] += line + "\n"
    return "\n".join(commands), expected


def _shell(script: str, cwd: str) -> tuple[str, int]:
    out = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    return out.stdout, out.returncode


def _run_console(body: str, cwd: str) -> list[str]:
    """Each ``$ `` command's output (stdout and stderr), in one bash session."""
    commands = [line[2:] for line in body.split("\n") if line.startswith("$ ")]
    script = ["__rc=0"]
    for n, command in enumerate(commands):
        script.append(f"(exit $__rc); {command} 2>&1; __rc=$?; echo '@@docs-command {n}@@'")
    out, _ = _shell("\n".join(script), cwd)
    parts = re.split(r"@@docs-command \d+@@\n?", out)
    return parts[: len(commands)]


@contextlib.contextmanager
def _captured(into: dict[str, str]):  # type: ignore[no-untyped-def]
    """Send fds 1 and 2 (so print, logging handlers and subprocesses) to temporary files."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            for name, file in (("stdout", out), ("stderr", err)):
                file.seek(0)
                into[name] = file.read().decode("utf-8", "replace")


def _run_python(block: Block, name: str, namespace: dict[str, object]) -> dict[str, object]:
    result: dict[str, object] = {"start": block.start}
    with _captured(result):  # type: ignore[arg-type]
        try:
            code = compile(block.body, f"{name}:{block.start + 2}", "exec", dont_inherit=True)
            exec(code, namespace)
        except BaseException:  # reported to the parent test
            result["error"] = traceback.format_exc()
    return result


def _run_forked(block: Block, name: str) -> dict[str, object]:
    """Run a block in a forked copy of this process: a fresh namespace and registry."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", encoding="utf-8") as file:
        pid = os.fork()
        if pid == 0:
            result = _run_python(block, name, {"__name__": "__main__"})
            with open(file.name, "w", encoding="utf-8") as out:
                json.dump(result, out)
            os._exit(0)
        os.waitpid(pid, 0)
        text = file.read()
    if not text:
        return {"start": block.start, "error": "the forked block died without a result"}
    result: dict[str, object] = json.loads(text)
    return result


def run_session(doc: Path, result_path: Path) -> None:
    """Run the blocks of one markdown file in order, in the current directory."""
    text = doc.read_text(encoding="utf-8")
    blocks = parse(text)
    isolated = ISOLATED in text
    if isolated:
        import instrument  # noqa: F401 - imported once, before the blocks are forked

    namespace: dict[str, object] = {"__name__": "__main__"}
    results: list[dict[str, object]] = []
    for block in blocks:
        if block.skip is not None or block.lang not in PYTHON | SHELL:
            continue
        began = time.perf_counter()
        result: dict[str, object] = {"start": block.start}
        if block.lang in PYTHON:
            if isolated:
                result = _run_forked(block, doc.name)
            else:
                result = _run_python(block, doc.name, namespace)
        elif block.lang == "console":
            result["commands"] = _run_console(block.body, os.getcwd())
        else:
            script = "set -e\n" + block.body
            result["stdout"], rc = _shell(script, os.getcwd())
            if rc:
                result["error"] = f"exit status {rc}"
        result["seconds"] = time.perf_counter() - began
        results.append(result)
    result_path.write_text(json.dumps(results), encoding="utf-8")
    sys.stdout.flush()
    os._exit(0)  # what happens at exit is not part of any block's output


# ---------------------------------------------------------------- comparing (parent)

_NUMBER = re.compile(r"0x[0-9a-fA-F]+|[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?[kMGT]?")
_WALL = re.compile(r"\d+(?:\.\d+)? s wall")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_SIZE = re.compile(r"\bN ?(?:B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\b")
_SELF_COST = re.compile(r"instrument's own cost: .+ % of the time")  # a cost measured here


def normalise(text: str, exact: bool = False) -> list[str]:
    """Lines with every number as ``N``, byte sizes as ``N B`` and spaces collapsed.

    ``exact``: numbers are kept, except what no fake clock makes exact: memory lines, the
    line of what instrument cost (a region's cost is measured on this machine), the
    ``· X.XX s wall`` of a report title and object addresses.
    """
    lines = []
    for line in text.strip("\n").split("\n"):
        if not exact or line.startswith("memory:") or _SELF_COST.match(line):
            line = _SIZE.sub("N B", _NUMBER.sub("N", line))
            line = line.replace("cost: under N %", "cost: N %")  # a share too small to show
        else:
            line = _ADDRESS.sub("0xN", _WALL.sub("N s wall", line))
        lines.append(" ".join(line.split()))
    return lines


def matches(expected: str, actual: str, exact: bool = False, unordered: bool = False) -> bool:
    """Whether the actual output fits the shown one (``...`` lines match any lines).

    ``unordered``: the lines may come in any order (a tree of real timings folds rows by
    their time): every shown line must be printed, and with no ``...`` nothing else may be.
    """
    if unordered:

        def glyphless(text: str) -> list[str]:  # which sibling is last changes with the order
            flat = text.replace("└──", "├──").replace("│", " ").replace("`--", "|--")
            return normalise(flat, exact)

        shown = [line for line in glyphless(expected) if line != "..."]
        printed = glyphless(actual)
        missing = Counter(shown) - Counter(printed)
        extra = Counter(printed) - Counter(shown)
        return not missing and ("..." in normalise(expected, exact) or not extra)
    pattern = [
        ".*?" if line == "..." else re.escape(line) + "\n" for line in normalise(expected, exact)
    ]
    text = "\n".join(normalise(actual, exact)) + "\n"
    return re.fullmatch("".join(pattern), text, re.S) is not None


def _session(doc: Path, workdir: Path) -> list[dict[str, object]]:
    result_path = workdir / ".docs-results.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(WANDB_SILENT="true", WANDB_MODE="offline", NO_COLOR="1", COLUMNS="100")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the shown outputs are a CPU's; GPU blocks are marked
    env.pop("FORCE_COLOR", None)
    code = (
        "import sys; sys.path.insert(0, sys.argv[3]); import test_docs; "
        "from pathlib import Path; test_docs.run_session(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(doc), str(result_path), str(ROOT / "tests")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    if not result_path.exists():
        raise AssertionError(f"the docs run of {doc.name} died:\n{out.stdout}\n{out.stderr}")
    results: list[dict[str, object]] = json.loads(result_path.read_text(encoding="utf-8"))
    return results


def check_doc(doc: Path) -> list[str]:
    """Run one file's blocks; return what went wrong (and rewrite outputs when asked)."""
    text = doc.read_text(encoding="utf-8")
    blocks = parse(text)
    problems = check_markers(blocks)
    exact = EXACT in text
    unordered = UNORDERED in text
    for block in blocks:
        if block.skip and block.skip.startswith("a fragment") and block.lang in PYTHON:
            try:
                compile(block.body, f"{doc.name}:{block.start + 2}", "exec", dont_inherit=True)
            except SyntaxError as e:
                problems.append(f"line {block.start + 1}: the fragment does not compile: {e}")
    with tempfile.TemporaryDirectory(prefix="instrument-docs-") as tmp:
        results = {r["start"]: r for r in _session(doc, Path(tmp))}
    lines = text.split("\n")
    replace: list[tuple[int, int, list[str]]] = []  # (first, end) line ranges, new lines
    for block in blocks:
        result = results.get(block.start)
        if result is None:
            continue
        where = f"{doc.name}:{block.start + 1}"
        if "error" in result:
            problems.append(f"{where}: the {block.lang} block failed:\n{result['error']}")
            continue
        if block.lang == "console":
            commands = [ln for ln in block.body.split("\n") if ln.startswith("$ ")]
            shown = _console_script(block.body)[1]
            got = result["commands"]
            assert isinstance(got, list)
            new_body: list[str] = []
            for command, expected, actual in zip(commands, shown, got, strict=False):
                new_body.append(command)
                if matches(expected, actual, exact, unordered):
                    new_body += expected.rstrip("\n").split("\n") if expected.strip() else []
                else:
                    problems.append(_mismatch(where, command, expected, actual))
                    new_body += actual.rstrip("\n").split("\n") if actual.strip() else []
            if new_body != block.body.split("\n"):
                replace.append((block.start + 1, block.end, new_body))
            continue
        actual = str(result.get("stdout", ""))
        if block.output is None:
            if actual.strip():
                problems.append(
                    f"{where}: the block printed output but no output block follows it:\n"
                    + actual[:2000]
                )
            continue
        if not matches(block.output.body, actual, exact, unordered):
            problems.append(_mismatch(where, "", block.output.body, actual))
            new = actual.rstrip("\n").split("\n")
            replace.append((block.output.start + 1, block.output.end, new))
    if replace and os.environ.get("INSTRUMENT_DOCS_UPDATE") == "1":
        for first, end, new in sorted(replace, reverse=True):
            lines[first:end] = new
        doc.write_text("\n".join(lines), encoding="utf-8")
    return problems


def _mismatch(where: str, command: str, expected: str, actual: str) -> str:
    diff = difflib.unified_diff(
        expected.strip("\n").split("\n"),
        actual.strip("\n").split("\n"),
        "shown",
        "printed",
        lineterm="",
    )
    label = f" `{command}`" if command else ""
    return f"{where}{label}: the output differs from the one shown:\n" + "\n".join(diff)


# ---------------------------------------------------------------- the tests


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(doc, id=doc.name, marks=[pytest.mark.slow] if doc.name in SLOW_DOCS else [])
        for doc in DOCS
    ],
)
def test_doc_runs_and_prints_what_it_shows(doc: Path) -> None:
    if doc.name in KNOWN_DRIFT:
        pytest.xfail(KNOWN_DRIFT[doc.name])
    problems = check_doc(doc)
    assert not problems, "\n\n".join(problems)


def test_normalise_keeps_names_and_tree_and_drops_numbers() -> None:
    shown = "step (10 steps)   147.617  100.0\n├── forward  52.9 35.9\n...\n└── (other) 1.7"
    printed = (
        "step (10 steps) 150.1 100.0\n├── forward 50.0 33.3\n│   └── x 1.0 2.0\n└── (other) 2.0"
    )
    assert matches(shown, printed)
    assert not matches(shown, printed.replace("forward", "backward"))
    assert not matches(shown, printed.replace("├──", "└──"))
    assert matches("host rss 2.1 GB at 0x7f0e", "host rss 412 MB at 0x55aa")
    assert not matches("4 0.03", "5 0.03", exact=True)
    assert matches("#1 · 0.00 s wall at 0x7f", "#1 · 0.02 s wall at 0x55", exact=True)
    assert matches("memory: host rss 2.1 GB", "memory: host rss 412 MB", exact=True)
    tree = "├── data 6.1\n├── backward 3.4\n└── zero_grad 0.9"
    swapped = "├── backward 3.1\n├── zero_grad 1.2\n└── data 0.4"
    assert matches(tree, swapped, unordered=True)
    assert not matches(tree, swapped, unordered=False)
    assert not matches(tree, swapped.replace("data", "clip"), unordered=True)
    assert not matches(tree, swapped + "\n└── clip 0.1", unordered=True)


def test_markers_accept_only_the_listed_reasons() -> None:
    text = "<!-- not run: too slow -->\n```python\npass\n```\n"
    assert check_markers(parse(text))
    text = "<!-- not run: needs a GPU -->\n```python\npass\n```\n"
    assert not check_markers(parse(text))


def test_a_broken_doc_goes_red(tmp_path: Path) -> None:
    doc = tmp_path / "broken.md"
    doc.write_text(
        "```python\nprint('forward', 1 + 1)\n```\n\n```text\nbackward 2\n```\n"
        "\n```console\n$ echo hello\nhello\n$ ls missing.txt\nmissing.txt\n```\n",
        encoding="utf-8",
    )
    problems = check_doc(doc)
    assert len(problems) == 2, problems
    assert "backward 2" in problems[0]
    assert "forward 2" in problems[0]
    assert "No such file" in problems[1]


def test_every_public_name_is_in_the_api_reference() -> None:
    """What is public is documented, and what is not documented is private."""
    import instrument
    import instrument.compat
    import instrument.sinks
    import instrument.testing

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    modules = (instrument, instrument.sinks, instrument.testing, instrument.compat)
    missing = [
        f"{module.__name__}.{name}"
        for module in modules
        for name in module.__all__
        if f"`{name}" not in api and f".{name}`" not in api and f".{name}(" not in api
    ]
    assert not missing, f"public but not in docs/api.md: {missing}"
    assert set(instrument.testing.__all__) == {"FakeClock", "capture_reports", "reset", "use_clock"}


def test_regions_and_sinks_expose_only_their_documented_members() -> None:
    import instrument
    from instrument.regions.region import CpuRegion, SkippedRegion

    documented = {"name", "clock", "level", "mode"}
    for region in (instrument.timed("x"), CpuRegion("x"), SkippedRegion("x")):
        public = {n for n in dir(region) if not n.startswith("_")}
        assert public == documented, public - documented
    sink = {n for n in dir(instrument.sinks.Sink) if not n.startswith("_")}
    # (``ranks``: the deprecated alias of ``only_ranks``)
    assert sink == {"write", "write_summary", "flush", "close", "only_ranks", "ranks", "wants"}


def test_testing_md_names_only_tests_that_exist() -> None:
    """docs/testing.md maps each promise to a test; every test it names must be real."""
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    named = re.findall(r"(test_\w+\.py)::(test_\w+)", text)
    assert len(named) > 100
    missing = [
        f"{file}::{name}"
        for file, name in named
        if not (ROOT / "tests" / file).exists()
        or f"def {name}(" not in (ROOT / "tests" / file).read_text(encoding="utf-8")
    ]
    assert not missing, f"docs/testing.md names tests that do not exist: {missing}"
