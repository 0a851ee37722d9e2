"""The ``data`` region: the time the training loop waited for each batch.

``instrument.data(loader)`` wraps any iterable. ``auto(..., dataloader=loader)`` times the
loader *in place*, so an unchanged ``for batch in loader:`` is timed: the loader's class is
swapped for a subclass whose ``__iter__`` hands out a timing iterator (and swapped back by
``remove()``); ``isinstance`` checks still see a ``DataLoader``. Accelerate's prepared
loaders (``DataLoaderShard``, ``DataLoaderDispatcher``) are timed the same way.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from instrument._warn import warn_once
from instrument.regions.frames import abandon
from instrument.regions.region import Region, region_for

T = TypeVar("T")
#: Called with each batch handed out (after its ``data`` region closed).
OnBatch = Callable[[Any], object]

_subclasses: dict[type, type] = {}
# loader -> its region and batch callback, for the swapped classes' __iter__
_regions: weakref.WeakKeyDictionary[Any, tuple[Region, OnBatch | None]] = (
    weakref.WeakKeyDictionary()
)


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


class CountingTimedIterator(TimedIterator[T]):
    """A :class:`TimedIterator` that also hands each batch to ``on_batch`` (counting)."""

    __slots__ = ("_on_batch",)

    def __init__(self, iterator: Iterator[T], region: Region, on_batch: OnBatch) -> None:
        super().__init__(iterator, region)
        self._on_batch = on_batch

    def __next__(self) -> T:
        item = super().__next__()
        self._on_batch(item)
        return item


def _timed(iterator: Iterator[T], region: Region, on_batch: OnBatch | None) -> TimedIterator[T]:
    if on_batch is None:
        return TimedIterator(iterator, region)
    return CountingTimedIterator(iterator, region, on_batch)


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
    if not isinstance(iterable, Iterable):
        raise TypeError(
            f"instrument.data needs an iterable (a DataLoader, a list, a generator), got "
            f"{iterable!r}"
        )
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
        found = _regions.get(self)
        if found is None or iterator is self:
            return iterator  # type: ignore[no-any-return]
        return _timed(iterator, *found)

    namespace: dict[str, Any] = {
        "__slots__": (),
        "__iter__": __iter__,
        "__module__": cls.__module__,
    }
    if hasattr(cls, "__next__"):  # an iterator itself: time its __next__ too

        def __next__(self: Any) -> Any:
            found = _regions.get(self)
            if found is None:
                return cls.__next__(self)
            with found[0]:
                item = cls.__next__(self)
            if found[1] is not None:
                found[1](item)
            return item

        namespace["__next__"] = __next__
    found = _subclasses[cls] = type(cls.__name__, (cls,), namespace)
    return found


_class_slot = object.__dict__["__class__"]


def _set_class(obj: object, cls: type) -> None:
    """``obj.__class__ = cls``, also for classes that hide ``__class__`` behind a property
    (Accelerate's ``DataLoaderShard`` reports the class of the loader it wraps)."""
    _class_slot.__set__(obj, cls)


def time_in_place(
    loader: object,
    name: str = "data",
    *,
    clock: object = None,
    on_batch: OnBatch | None = None,
) -> Callable[[], None]:
    """Time ``for batch in loader`` without changing the loop; returns the undo.
    ``on_batch`` is called with every batch handed out (to count samples and tokens).

    Raises ``TypeError`` for objects whose class cannot be swapped (builtins, generators):
    wrap those with ``instrument.data(...)`` instead. Warns once when the loader is already
    being iterated (an iterator made before cannot be timed).
    """
    if on_batch is not None and not callable(on_batch):
        raise TypeError(f"on_batch must be a function taking a batch or None, got {on_batch!r}")
    return _time_as(loader, region_for(name, clock), on_batch)


def time_like(loader: object, timed: object) -> Callable[[], None] | None:
    """Time ``loader`` in place as the loader ``timed`` is timed (the same region and batch
    counter: a loader made from it, such as one that skips the batches a resumed run has
    seen); returns the undo, or None where ``timed`` is not timed or ``loader`` cannot be."""
    found = _regions.get(timed)
    if found is None or loader is timed or type(loader) in _subclasses.values():
        return None
    try:
        return _time_as(loader, *found)
    except (TypeError, RuntimeError):
        return None


def _time_as(loader: object, region: Region, on_batch: OnBatch | None) -> Callable[[], None]:
    cls = type(loader)
    if cls in _subclasses.values():
        raise RuntimeError(f"this {cls.__name__} is already timed; remove() the first handle")
    if not hasattr(cls, "__iter__"):
        raise TypeError(f"dataloader must be iterable, got {cls.__name__}")
    try:
        _set_class(loader, _timed_subclass(cls))
        _regions[loader] = (region, on_batch)
    except TypeError:
        if type(loader) is not cls:
            _set_class(loader, cls)
        raise TypeError(
            f"cannot time a {cls.__name__} in place; iterate over instrument.data(it) "
            "instead (for batch in instrument.data(it): ...)"
        ) from None

    if getattr(loader, "_iterator", None) is not None and not getattr(
        loader, "persistent_workers", False
    ):
        warn_once(
            f"data:iterated:{cls.__name__}",
            f"instrument: this {cls.__name__} is already being iterated (it holds an "
            "iterator made before auto()); the batches of that iterator are not timed, so "
            "'data' starts with the next pass over the loader. Pass the loader before the "
            "loop starts, or loop over instrument.data(iterator) to time the running one",
            stacklevel=5,
        )

    def undo() -> None:
        _regions.pop(loader, None)
        if type(loader) is _subclasses.get(cls):
            _set_class(loader, cls)

    return undo
