"""Console: the text tree to a stream (stdout by default)."""

from __future__ import annotations

import sys
from typing import TextIO

from instrument.report import Report
from instrument.sinks.base import Sink


def supports_unicode(stream: TextIO) -> bool:
    """True when the stream's encoding can print the box-drawing tree lines."""
    encoding = getattr(stream, "encoding", None)
    if encoding is None:  # an in-memory text stream (StringIO) holds any str
        return True
    try:
        "├└│─·".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class Console(Sink):
    """Print each report's tree.

    Args:
        stream: Where to write; ``None`` means ``sys.stdout`` at write time.
        unicode: Box-drawing lines; ``None`` decides from the stream's encoding.

    Distributed: construct it on every rank; it prints what its rank's reporter produces.
    """

    def __init__(self, stream: TextIO | None = None, *, unicode: bool | None = None) -> None:
        self.stream = stream
        self.unicode = unicode

    def write(self, report: Report) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        unicode = supports_unicode(stream) if self.unicode is None else self.unicode
        text = report.render(unicode=unicode)
        if not unicode:
            text = text.replace("·", "-")
        stream.write(text + "\n")
        stream.flush()

    def __repr__(self) -> str:
        return f"Console(stream={self.stream!r})"
