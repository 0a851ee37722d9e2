"""Drawing frames: in place with rich (when installed), in place with plain ANSI codes on
another terminal, or one frame after the other when the output is not a terminal."""

from __future__ import annotations

import os
import shutil
from typing import Any, Protocol, TextIO

from instrument.terminal import printable
from instrument.watch.frame import Line

RICH_STYLES = {"title": "bold", "heading": "bold", "dim": "dim", "info": "green",
               "warning": "bold yellow", "critical": "bold red"}  # fmt: skip
ANSI_STYLES = {"title": "1", "heading": "1", "dim": "2", "info": "32", "warning": "1;33",
               "critical": "1;31"}  # fmt: skip
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


class Screen(Protocol):
    """Where frames go. ``live``: a frame replaces the previous one (so it is worth
    redrawing even when nothing new came, to keep the status current)."""

    live: bool

    def draw(self, lines: list[Line]) -> None:
        """Show one frame."""

    def close(self) -> None:
        """Leave the terminal as it was (cursor shown, below the last frame)."""


class PlainScreen:
    """Without rich. On a terminal (``live``): the cursor hidden, each frame drawn from the
    top-left corner over the previous one, cropped to the window, colours unless
    ``NO_COLOR`` is set. Elsewhere: each frame appended, a blank line between frames."""

    def __init__(self, stream: TextIO, *, live: bool) -> None:
        self.stream = stream
        self.live = live
        self.color = live and not os.environ.get("NO_COLOR")
        self._drawn = 0
        if live:
            stream.write(HIDE_CURSOR)

    def draw(self, lines: list[Line]) -> None:
        if not self.live:
            prefix = "\n" if self._drawn else ""
            self.stream.write(prefix + "".join(printable(t) + "\n" for t, _ in lines))
        else:
            size = shutil.get_terminal_size()
            kept = lines[: max(size.lines - 1, 1)]
            out = [HOME]
            for text, style in kept:
                text = printable(text)[: size.columns]
                code = ANSI_STYLES.get(style) if self.color else None
                out.append(f"\x1b[{code}m{text}\x1b[0m" if code else text)
                out.append(CLEAR_LINE + "\n")
            out.append(CLEAR_BELOW)
            self.stream.write("".join(out))
        self._drawn += 1
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write(SHOW_CURSOR)
            self.stream.flush()


class RichScreen:
    """With rich: a ``rich.live.Live`` display redrawn in place, styled, each line cropped
    to the window's width; rich restores the cursor when it stops."""

    live = True

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        self._live: Any = Live(
            console=self._console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="ellipsis",
        )
        self._live.start()

    def draw(self, lines: list[Line]) -> None:
        from rich.console import Group
        from rich.text import Text

        texts = [
            Text(printable(text), style=RICH_STYLES.get(style, ""), no_wrap=True,
                 overflow="ellipsis")
            for text, style in lines
        ]  # fmt: skip
        self._live.update(Group(*texts), refresh=True)

    def close(self) -> None:
        self._live.stop()


def open_screen(stream: TextIO, *, plain: bool = False) -> Screen:
    """The screen for ``stream``: rich on a terminal when installed (and not ``plain``),
    else :class:`PlainScreen`."""
    terminal = stream.isatty()
    if terminal and not plain:
        try:
            return RichScreen(stream)
        except ImportError:
            pass
    return PlainScreen(stream, live=terminal)
