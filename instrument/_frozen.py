"""Frozen dataclasses made without their ``__init__``, which sets each field through
``object.__setattr__``: a flush makes a ``Stats`` per path read and one ``Report``,
``SelfCost`` and ``Throughput`` per interval, where that setup is most of the cost."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

_T = TypeVar("_T")

#: Per frozen dataclass: its fields' plain defaults and default factories.
_defaults: dict[type, tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]] = {}


def made(cls: type[_T], state: dict[str, Any]) -> _T:
    """An instance of ``cls`` whose fields are ``state`` (every field, nothing else, each
    of its type: the caller's promise), copied into the instance's own ``__dict__`` (a
    key-sharing dict: cheaper to make and to read than ``state`` set as ``__dict__``)."""
    obj = object.__new__(cls)
    obj.__dict__.update(state)
    return obj


def unchecked(cls: type[_T], **values: Any) -> _T:
    """``cls(**values)`` for a frozen dataclass, without its ``__init__``'s setattr per
    field: the fields not given take their defaults; a missing or unknown field is a
    ``TypeError``; the values are not checked. A class with ``__post_init__`` (checks to
    run) goes through its constructor."""
    known = _defaults.get(cls)
    if known is None:
        if hasattr(cls, "__post_init__"):
            return cls(**values)
        plain = {f.name: f.default for f in fields(cls) if f.default is not MISSING}  # type: ignore[arg-type]
        factories = tuple(
            (f.name, f.default_factory)
            for f in fields(cls)  # type: ignore[arg-type]
            if f.default_factory is not MISSING
        )
        known = _defaults[cls] = (plain, factories)
    plain, factories = known
    state = plain.copy()
    for name, factory in factories:
        if name not in values:
            state[name] = factory()
    state.update(values)
    if state.keys() != cls.__dataclass_fields__.keys():  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: missing or unknown fields in {sorted(values)}")
    return made(cls, state)


def replaced(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace(obj, **changes)`` for a frozen dataclass, without its
    ``__init__`` (nor ``__post_init__``: ``obj`` passed its checks, ``changes`` are the
    caller's promise): each field as stored (a lazily built field stays unbuilt); an
    unknown field is a ``TypeError``."""
    state = {name: obj.__dict__[name] for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]
    if not changes.keys() <= state.keys():
        raise TypeError(f"{type(obj).__name__}: unknown fields in {sorted(changes)}")
    state.update(changes)
    return made(type(obj), state)
