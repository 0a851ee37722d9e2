"""The ``data`` region: the time the training loop waited for each batch.

``instrument.data(loader)`` wraps any iterable. ``auto(..., dataloader=loader)`` times the
loader *in place*, so an unchanged ``for batch in loader:`` is timed: the loader's class is
swapped for a subclass whose ``__iter__`` hands out a timing iterator (and swapped back by
``remove()``); ``isinstance`` checks still see a ``DataLoader``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from instrument.region import Region, abandon, region_for

T = TypeVar("T")

_subclasses: dict[type, type] = {}
# loader -> its region, for the swapped classes' __iter__
_regions: weakref.WeakKeyDictionary[Any, Region] = weakref.WeakKeyDictionary()


class TimedIterator(Iterator[T]):
    """An iterator whose every ``next()`` is timed as a region (``StopIteration`` passes
    through); other attributes are the wrapped iterator's."""

    __slots__ = ("_it", "_next", "_region")

    def __init__(self, iterator: Iterator[T], region: Region) -> None:
        self._it = iterator
        self._next = iterator.__next__
        self._region = region

    def __iter__(self) -> TimedIterator[T]:
        return self

    def __next__(self) -> T:
        region = self._region
        region.__enter__()
        try:
            item = self._next()
        except StopIteration:
            abandon(region)  # the end of the data is not a batch
            raise
        except BaseException:
            region.__exit__(None, None, None)
            raise
        region.__exit__(None, None, None)
        return item

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class TimedIterable(Iterable[T]):
    """``iter()`` of it is a :class:`TimedIterator` over the wrapped iterable; ``len()`` and
    other attributes are the wrapped iterable's."""

    __slots__ = ("_iterable", "_region")

    def __init__(self, iterable: Iterable[T], region: Region) -> None:
        self._iterable = iterable
        self._region = region

    def __iter__(self) -> TimedIterator[T]:
        return TimedIterator(iter(self._iterable), self._region)

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)


def data(iterable: Iterable[T], name: str = "data", *, clock: object = None) -> Iterable[T]:
    """Time each ``next()`` of ``iterable`` as region ``name``.

    Example:
        >>> for batch in instrument.data(loader):     # "data" = time spent waiting for batches
        ...     train_step(batch)
    """
    region = region_for(name, clock)
    if isinstance(iterable, Iterator):
        return TimedIterator(iterable, region)
    return TimedIterable(iterable, region)


def _timed_subclass(cls: type) -> type:
    """A subclass of ``cls`` with the same layout whose ``__iter__`` times ``next()``."""
    found = _subclasses.get(cls)
    if found is not None:
        return found

    def __iter__(self: Any) -> Iterator[Any]:
        iterator = cls.__iter__(self)  # type: ignore[attr-defined]
        region = _regions.get(self)
        if region is None or iterator is self:
            return iterator  # type: ignore[no-any-return]
        return TimedIterator(iterator, region)

    namespace: dict[str, Any] = {
        "__slots__": (),
        "__iter__": __iter__,
        "__module__": cls.__module__,
    }
    if hasattr(cls, "__next__"):  # an iterator itself: time its __next__ too

        def __next__(self: Any) -> Any:
            region = _regions.get(self)
            if region is None:
                return cls.__next__(self)
            with region:
                return cls.__next__(self)

        namespace["__next__"] = __next__
    found = _subclasses[cls] = type(cls.__name__, (cls,), namespace)
    return found


def time_in_place(
    loader: object, name: str = "data", *, clock: object = None
) -> Callable[[], None]:
    """Time ``for batch in loader`` without changing the loop; returns the undo.

    Raises ``TypeError`` for objects whose class cannot be swapped (builtins, generators):
    wrap those with ``instrument.data(...)`` instead.
    """
    cls = type(loader)
    if cls in _subclasses.values():
        raise RuntimeError(f"this {cls.__name__} is already timed; remove() the first handle")
    if not hasattr(cls, "__iter__"):
        raise TypeError(f"dataloader must be iterable, got {cls.__name__}")
    try:
        loader.__class__ = _timed_subclass(cls)
        _regions[loader] = region_for(name, clock)
    except TypeError:
        if type(loader) is not cls:
            loader.__class__ = cls
        raise TypeError(
            f"cannot time a {cls.__name__} in place; iterate over instrument.data(it) "
            "instead (for batch in instrument.data(it): ...)"
        ) from None

    def undo() -> None:
        _regions.pop(loader, None)
        if type(loader) is _subclasses.get(cls):
            loader.__class__ = cls

    return undo
