"""Text from a file, made safe to print: what could drive a terminal is shown escaped.

A report file is data from elsewhere (a colleague's run, a CI artifact): a region name, a
note or a finding in it may hold an escape sequence. Everything the command line prints
passes through :func:`printable`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, TextIO

#: Control characters, format characters (bidirectional overrides) and lone surrogates.
UNSAFE = frozenset({"Cc", "Cf", "Cs"})
_CANDIDATE = re.compile(r"[^\n\x20-\x7e]")  # ASCII text and newlines are safe as they are


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if unicodedata.category(char) not in UNSAFE:
        return char
    return repr(char)[1:-1] if char != "\\" else char  # "\x1b", "\u202e", "\udcff"


def printable(text: str) -> str:
    """``text`` with every control character but the newline, every format character and
    every lone surrogate written as its Python escape (``\\x1b``)."""
    return _CANDIDATE.sub(_escaped, text)


class PrintableStream:
    """A text stream that writes :func:`printable` text to ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text))

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, isatty...
        return getattr(self.stream, name)
