"""Reading report files (JSONL, one :meth:`Report.to_dict` per line) back into reports.

Every problem raises :class:`ReportFileError` naming the file, and the line when one is
at fault: a missing file, an empty one, a line that is not JSON or not a report.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from instrument.report import Report


class ReportFileError(ValueError):
    """A report file that cannot be read; the message names the file (and line)."""


@dataclass(frozen=True)
class ReportFile:
    """The reports of one file, in the order they were written.

    ``incomplete_line`` is the number of a last line that was cut off mid-write (the
    writer was killed) and skipped, or ``None``.
    """

    path: Path
    reports: tuple[Report, ...]
    incomplete_line: int | None = None


def rank_files(path: str | os.PathLike[str]) -> dict[int, Path]:
    """The per-rank files written for ``path`` (``run.rank<R>.jsonl`` next to ``run.jsonl``),
    by rank."""
    plain = Path(path)
    pattern = re.compile(rf"{re.escape(plain.stem)}\.rank(\d+){re.escape(plain.suffix)}")
    found: dict[int, Path] = {}
    if plain.parent.is_dir():
        for sibling in plain.parent.iterdir():
            match = pattern.fullmatch(sibling.name)
            if match and sibling.is_file():
                found[int(match.group(1))] = sibling
    return dict(sorted(found.items()))


def locate(path: str | os.PathLike[str], rank: int | None = None) -> Path:
    """The file to read for ``path``: the path itself when it exists; else the file of
    ``rank`` (default: the lowest) among its per-rank siblings (see :func:`rank_files`).
    A ``{rank}`` placeholder is filled with ``rank`` (default 0)."""
    text = os.fspath(path)
    if "{rank}" in text:
        text = text.replace("{rank}", str(rank or 0))
    plain = Path(text)
    if plain.exists():
        return plain
    per_rank = rank_files(plain)
    if not per_rank:
        raise ReportFileError(f"{text}: no such file")
    if rank is None:
        return next(iter(per_rank.values()))
    if rank not in per_rank:
        names = ", ".join(p.name for p in per_rank.values())
        raise ReportFileError(f"{text}: no file for rank {rank}; found {names}")
    return per_rank[rank]


def read_file(path: str | os.PathLike[str]) -> ReportFile:
    """Every report in a JSONL file; blank lines are skipped.

    Raises :class:`ReportFileError` for a missing or unreadable file, a file without any
    report, or a line that is not a report — except a last line cut off mid-write, which
    is skipped and noted in ``incomplete_line``.
    """
    name = os.fspath(path)
    reports: list[Report] = []
    incomplete: int | None = None
    try:
        with open(path, "rb") as file:
            for number, raw in enumerate(file, start=1):
                if not raw.strip():
                    continue
                try:
                    reports.append(parse_line(raw, f"{name}:{number}"))
                except ReportFileError:
                    if raw.endswith(b"\n"):
                        raise
                    incomplete = number  # the writer died mid-line: keep what came before
    except FileNotFoundError:
        raise ReportFileError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ReportFileError(f"{name}: is a directory, not a report file") from None
    except OSError as exc:
        raise ReportFileError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    if not reports:
        what = "only a cut-off line" if incomplete else "empty"
        raise ReportFileError(f"{name}: {what}, no report in it")
    return ReportFile(Path(path), tuple(reports), incomplete)


def parse_line(raw: bytes | str, where: str) -> Report:
    """One line of a report file as a :class:`Report`; ``where`` ("file:line") starts the
    error message."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ReportFileError(f"{where}: not UTF-8 text; is this a report file?") from None
    try:
        data = json.loads(text.strip())
    except json.JSONDecodeError as exc:
        raise ReportFileError(
            f"{where}: not JSON ({exc.msg} at column {exc.colno}); expected one report per line"
        ) from None
    if not isinstance(data, dict) or "nodes" not in data:
        kind = "object without 'nodes'" if isinstance(data, dict) else _json_type(data)
        raise ReportFileError(
            f"{where}: not an instrument report (a JSON {kind}; expected an object with a "
            "'nodes' list, as instrument.sinks.JSONL writes)"
        )
    try:
        return Report.from_dict(data)
    except KeyError as exc:
        detail = f"missing key {exc.args[0]!r}"
    except (ValueError, TypeError, AttributeError) as exc:
        detail = str(exc)
    raise ReportFileError(f"{where}: not an instrument report ({detail})")


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type ("array", "string", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names = {list: "array", str: "string", int: "number", float: "number", dict: "object"}
    return names.get(type(value), type(value).__name__)
