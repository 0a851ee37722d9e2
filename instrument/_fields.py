"""The fields of regions and path nodes: typed, set at construction, never deleted.

The hot path reads them on every enter and exit; the C accelerator's descriptors refuse a
deletion or a value of the wrong type (a NULL or a foreign object read in C would crash the
process). The pure-Python classes apply the same rules, with the same messages, through
:func:`check` and :func:`check_delete`, so both paths fail alike, at the assignment.
"""

from __future__ import annotations

import sys
from typing import Any

ANY, STR, CALLABLE, DICT, NODE_OR_NONE, LEVEL = range(6)
_ACCEPTS = ("any object", "a str", "a callable", "a dict", "a path node or None", "an int >= 0")

REGION = {"name": STR, "clock": ANY, "_now": CALLABLE, "level": LEVEL}
NODE = {
    "name": STR,
    "path": STR,
    "parent": NODE_OR_NONE,
    "children": DICT,
    "mode": STR,
    "level": LEVEL,
    "idle": LEVEL,
}


def _accepted(kind: int, value: Any, node_type: type) -> bool:
    if kind == STR:
        return isinstance(value, str)
    if kind == CALLABLE:
        return callable(value)
    if kind == DICT:
        return isinstance(value, dict)
    if kind == NODE_OR_NONE:
        return value is None or isinstance(value, node_type)
    return True


def check(owner: str, fields: dict[str, int], name: str, value: Any, node_type: type) -> None:
    """Raise if ``value`` may not be stored in the field ``name`` of a ``owner`` ("region" or
    "path node"); fields not listed in ``fields`` are not checked."""
    kind = fields.get(name)
    if kind is None:
        return
    wrong = f"instrument: the {owner} field {name!r} must be {_ACCEPTS[kind]}, got {value!r}"
    if kind == LEVEL:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(wrong)
        if value > sys.maxsize:
            raise OverflowError("Python int too large to convert to C ssize_t")
        if value < 0:
            raise ValueError(wrong)
    elif not _accepted(kind, value, node_type):
        raise TypeError(wrong)


def check_delete(owner: str, fields: dict[str, int], name: str) -> None:
    """Raise ``AttributeError`` if ``name`` is one of the checked ``fields``: those of a region
    or a path node are never deleted."""
    if name in fields:
        raise AttributeError(
            f"instrument: the {owner} field {name!r} cannot be deleted (it is set once, at "
            "construction)"
        )
