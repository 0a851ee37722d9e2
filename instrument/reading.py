"""Reading report files (JSONL, one :meth:`Report.to_dict` per line) back into reports.

Every problem raises :class:`ReportFileError` naming the file, and the line when one is
at fault: a missing file, an empty one, a line that is not JSON or not a report, and a
report holding a value no report can hold (NaN or infinity, a number too large to be one,
a negative count, nesting deeper than a report's).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from instrument.report import Node, Report
from instrument.stats import Stats

#: Digits of the largest integer a report field may hold (2**63 has 19).
MAX_INT_DIGITS = 20
#: Fields that count something: an int >= 0.
COUNTS = frozenset({"steps", "step", "index", "rank", "world_size", "group_size", "count",
                    "bytes", "stragglers_count", "ranks_present", "level"})  # fmt: skip
#: Report-level times that cannot be negative.
TIMES = frozenset({"flush_time"})


class ReportFileError(ValueError):
    """A report file that cannot be read; the message names the file (and line)."""


class _BadValue(ValueError):
    """A decoded value no report holds (raised from the JSON decoder's hooks)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _BadValue(f"an integer of {len(text.lstrip('-'))} digits; too large for a report")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadValue(f"the number {text[:30]} is out of range; expected a finite number")
    return value


def _parse_constant(name: str) -> float:
    raise _BadValue(f"{name} is not a finite number; reports hold finite numbers only")


@dataclass(frozen=True)
class ReportFile:
    """The reports of one file, in the order they were written.

    ``incomplete_line`` is the number of a last line that was cut off mid-write (the
    writer was killed) and skipped, or ``None``; ``lines`` holds the line number of each
    report.
    """

    path: Path
    reports: tuple[Report, ...]
    incomplete_line: int | None = None
    lines: tuple[int, ...] = ()


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


#: The longest line read as a report (a report of 10,000 paths across 64 ranks is ~20 MB).
MAX_LINE_BYTES = 256 * 2**20


def open_report_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for reading bytes: a regular file only (a FIFO nobody writes would
    block the read forever, ``/dev/zero`` would never end a line)."""
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "Is a directory", os.fspath(path))
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ReportFileError(f"{os.fspath(path)}: {kind}, not a regular report file")
    return open(path, "rb")


def report_lines(file: IO[bytes], where: str, first: int = 1) -> Iterator[tuple[int, bytes]]:
    """The lines of ``file`` with their numbers (from ``first``); a line longer than
    :data:`MAX_LINE_BYTES` is a :class:`ReportFileError`, not a read until memory runs out."""
    number = first
    while raw := file.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES:
            raise ReportFileError(
                f"{where}:{number}: a line over {MAX_LINE_BYTES // 2**20} MiB; not a report file"
            )
        yield number, raw
        number += 1


def read_file(path: str | os.PathLike[str]) -> ReportFile:
    """Every report in a JSONL file; blank lines are skipped.

    Raises :class:`ReportFileError` for a missing or unreadable file, a file without any
    report, or a line that is not a report — except a last line cut off mid-write, which
    is skipped and noted in ``incomplete_line``.
    """
    name = os.fspath(path)
    reports: list[Report] = []
    lines: list[int] = []
    incomplete: int | None = None
    try:
        with open_report_file(path) as file:
            for number, raw in report_lines(file, name):
                if not raw.strip():
                    continue
                try:
                    reports.append(parse_line(raw, f"{name}:{number}"))
                    lines.append(number)
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
    return ReportFile(Path(path), tuple(reports), incomplete, tuple(lines))


def parse_line(raw: bytes | str, where: str) -> Report:
    """One line of a report file as a :class:`Report`; ``where`` ("file:line") starts the
    error message."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ReportFileError(f"{where}: not UTF-8 text; is this a report file?") from None
    try:
        data = json.loads(
            text.strip(),
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as exc:
        raise ReportFileError(
            f"{where}: not JSON ({exc.msg} at column {exc.colno}); expected one report per line"
        ) from None
    except _BadValue as exc:
        raise ReportFileError(f"{where}: not an instrument report ({exc})") from None
    except RecursionError:
        raise ReportFileError(
            f"{where}: not an instrument report (JSON nested too deeply for one)"
        ) from None
    if not isinstance(data, dict) or "nodes" not in data:
        kind = "object without 'nodes'" if isinstance(data, dict) else _json_type(data)
        raise ReportFileError(
            f"{where}: not an instrument report (a JSON {kind}; expected an object with a "
            "'nodes' list, as instrument.sinks.JSONL writes)"
        )
    try:
        report = Report.from_dict(data)
    except KeyError as exc:
        detail = f"missing key {exc.args[0]!r}"
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        detail = str(exc) or type(exc).__name__
    else:
        bad = _first_bad_value(report)
        if bad is None:
            return report
        detail = bad
    raise ReportFileError(f"{where}: not an instrument report ({detail})")


def _first_bad_value(report: Report) -> str | None:
    """What is wrong with a decoded report's values, or ``None``: a number that is not
    finite (from a string such as ``"nan"``), a negative count or normalizer, an empty
    region name. Nodes are checked quickly and walked in full only when one is wrong."""
    found = next(_bad_values(dataclasses.replace(report, nodes=()).to_dict(), ""), None)
    for i, node in enumerate(report.nodes):
        if found is not None:
            break
        if not _plain(node):
            found = next(_bad_values(node.to_dict(), f"nodes[{i}]."), None)
    return found


def _plain(node: Node) -> bool:
    """Every number of ``node`` finite, every count in [0, 2**63), its path well formed."""
    floats = [node.self_time, *_stats_floats(node.host)]
    counts = [node.level, node.bytes, node.host.count]
    if node.device is not None:
        floats += _stats_floats(node.device)
        counts.append(node.device.count)
    ranks = node.ranks
    if ranks is not None:
        floats += [ranks.rank_min, ranks.rank_max, ranks.rank_mean]
        optional = (ranks.relative_score, ranks.individual_score, *(ranks.per_rank or ()))
        floats += [v for v in optional if v is not None]
        counts += [ranks.rank_argmin, ranks.rank_argmax, ranks.ranks_present]
    return (
        all(map(math.isfinite, floats))
        and all(0 <= n < 2**63 for n in counts)
        and "" not in node.path.split("/")
    )


def _stats_floats(stats: Stats) -> list[float]:
    return [stats.total, stats.mean, stats.min, stats.max, stats.std, stats.p50, stats.p90,
            stats.p99]  # fmt: skip


def _bad_values(data: dict[str, Any], prefix: str) -> Iterator[str]:
    """The problems of one decoded part of a report (``to_dict()`` form), keys named from
    ``prefix``."""
    todo: list[tuple[str, Any]] = [(prefix.rstrip("."), data)]
    while todo:
        key, value = todo.pop()
        name = key.rpartition(".")[2].partition("[")[0]
        if isinstance(value, dict):
            todo.extend((f"{key}.{k}".lstrip("."), v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            todo.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            yield f"{key} is {value}; expected a finite number"
        elif isinstance(value, int) and abs(value) >= 2**63:
            yield f"{key} is {value:.3e}; too large for a report"
        elif name in COUNTS and isinstance(value, int | float) and value < 0:
            yield f"{key} is {value}; expected a count >= 0"
        elif name in TIMES and isinstance(value, int | float) and value < 0:
            yield f"{key} is {value}; expected a time >= 0"
    normalizer = data.get("normalizer", 1.0)
    if not isinstance(normalizer, str) and not normalizer > 0.0:
        yield f"normalizer is {normalizer}; expected a number > 0 or 'steps'"
    path = data.get("path", "x")
    if "" in path.split("/"):
        yield f"{prefix}path is {path!r}; expected region names joined by '/'"


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type ("array", "string", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names = {list: "array", str: "string", int: "number", float: "number", dict: "object"}
    return names.get(type(value), type(value).__name__)
