"""The docs are reference, not history: README.md, CONTRIBUTING.md and docs/*.md describe
current behaviour, so their prose names no work period, branch, issue number, commit hash
or date of a run, and does not say what the code "previously" did.

Only prose is checked: fenced code blocks, inline code, links' targets, URLs and HTML
comments are left out, so an API name (a `Session` class), an upstream reference
(``pytorch/pytorch#123``) or a hash in an example output is not a finding.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|next)"
#: (what the rule catches, the pattern), matched case-insensitively against prose only
RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "a work period",
        re.compile(rf"\bsessions?\b|\bthis (?:round|pass)\b|\b{ORDINAL} (?:round|pass) of\b", re.I),
    ),
    ("a work stop", re.compile(r"\bstop \d+\b", re.I)),
    ("a branch", re.compile(r"\bbranch(?:es)?\b", re.I)),
    ("an issue number", re.compile(r"\bissues? #?\d+|(?<![\w/])#\d{2,}\b", re.I)),
    ("the code's history", re.compile(r"\bpreviously\b|\bnow fixed\b|\bfixed since\b", re.I)),
    ("the code's history", re.compile(r"(?<!\bis )(?<!\bare )(?<!\bbe )\bused to\b", re.I)),
    # 7 to 40 hex digits with at least one digit and one letter: a commit, not a word or a number
    (
        "a commit hash",
        re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.I),
    ),
    ("the date of a run", re.compile(r"\b20\d\d-\d\d-\d\d\b")),
]

FENCE = re.compile(r"^\s*(```|~~~)")
LEFT_OUT = [
    re.compile(r"<!--.*?-->"),  # HTML comments (the docs test's markers)
    re.compile(r"`[^`]*`"),  # inline code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"https?://\S+"),  # bare URLs
]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, text)`` of each line outside fenced code, with inline code, link
    targets, URLs and HTML comments blanked out."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for pattern in LEFT_OUT:
            line = pattern.sub(" ", line)
        lines.append((number, line))
    return lines


#: The page whose table rows say when each version was run (its support matrix): dates
#: are its "when", not history.
DATED_ROWS = ROOT / "docs" / "compatibility.md"


def findings(text: str, dated_rows: bool = False) -> list[tuple[int, str, str]]:
    """``(line, rule, matched text)`` for each history word in the prose of ``text``
    (with ``dated_rows``, a date in a table row is no finding)."""
    return [
        (number, rule, match.group(0))
        for number, line in prose_lines(text)
        for rule, pattern in RULES
        if not (dated_rows and rule == "the date of a run" and line.lstrip().startswith("|"))
        for match in pattern.finditer(line)
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_describes_current_behaviour_not_history(page: Path) -> None:
    found = findings(page.read_text(encoding="utf-8"), dated_rows=page == DATED_ROWS)
    where = page.relative_to(ROOT)
    assert not found, "history in the docs (write what the code does now):\n" + "\n".join(
        f"{where}:{line}: {word!r} ({rule})" for line, rule, word in found
    )


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("This session made the flush faster.", "a work period"),
        ("Measured in the seventh session.", "a work period"),
        ("What this round changed.", "a work period"),
        ("Done before stop 3.", "a work stop"),
        ("Merged from branch autostep.", "a branch"),
        ("See issue 21 for the target.", "an issue number"),
        ("Fixed in #36.", "an issue number"),
        ("It previously read the status file.", "the code's history"),
        ("The flush used to be slower.", "the code's history"),
        ("Measured at commit 7ea2196 on the VM.", "a commit hash"),
        ("One run on 2026-11-26.", "the date of a run"),
    ],
)
def test_each_rule_catches_its_words(line: str, rule: str) -> None:
    text = f"# Page\n\nA line of reference.\n{line}\n"
    assert [(n, r) for n, r, _ in findings(text)] == [(4, rule)]


@pytest.mark.parametrize(
    "line",
    [
        "The Lightning callback keeps a `Session` of its own.",
        "A bug of PyTorch's (pytorch/pytorch#190489) is worked around.",
        "See [the tracker](https://github.com/o/r/issues/12) for more.",
        "The value is used to compute the share; the ids are 1024 and 33554432.",
        "A region ends; a deadbeef-free line with `7ea2196` in code.",
        "Each round runs every row; 300 rounds in all.",
    ],
)
def test_api_names_upstream_references_and_code_are_not_history(line: str) -> None:
    text = f"{line}\n```text\nsession 7ea2196 issue 21 2026-11-26\n```\n"
    assert findings(text) == []
