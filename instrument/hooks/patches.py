"""Reference-counted patches of shared functions (``torch.autograd.backward``, collectives),
and attributes put on one instance (:func:`put_on_instance`).

Several ``auto()`` handles may be live at once; the first ``patch`` of an attribute installs
the wrapper, later ones only count, and the last undo puts the original back — exactly the
object that was there before.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_INHERITED = object()  # the original of a patch: the owner inherited the attribute
# (id(owner), attr) -> [owner, attr, original, wrapper, count]
_active: dict[tuple[int, str], list[Any]] = {}


def patch(
    owner: object,
    attr: str,
    make: Callable[[Any], Any],
    *,
    inert_when_left: bool = False,
    inherited: bool = False,
) -> Callable[[], None]:
    """Replace ``owner.attr`` by ``make(original)`` (once, however many callers ask) and
    return the undo for this caller.

    If something replaced the wrapper meanwhile, the last undo leaves the newer object in
    place and warns — unless ``inert_when_left``: the wrapper does nothing once its hooks
    are gone, so being left inside someone else's wrapper is harmless and not worth a
    warning (Dynamo wraps ``nn.Module.__setstate__`` at the first compilation).

    ``inherited``: ``owner`` (a class) may inherit ``attr`` rather than define it (a method
    that some torch releases define on the subclass only); the wrapper of the inherited one
    is then put on ``owner``, and the last undo deletes it again."""
    key = (id(owner), attr)
    with _lock:
        entry = _active.get(key)
        if entry is None:
            had = not inherited or attr in vars(owner)
            original = _own(owner, attr) if had else getattr(owner, attr)
            wrapper = make(original)
            setattr(owner, attr, wrapper)
            entry = _active[key] = [owner, attr, original if had else _INHERITED, wrapper, 0]
        entry[4] += 1
    done = False

    def undo() -> None:
        nonlocal done
        if done:
            return
        done = True
        with _lock:
            entry[4] -= 1
            if entry[4]:
                return
            del _active[key]
            if vars(owner).get(attr) is entry[3]:
                if entry[2] is _INHERITED:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, entry[2])
            elif not inert_when_left:
                warnings.warn(
                    f"instrument: {attr!r} was replaced by someone else after instrument "
                    "patched it; leaving the newer one in place",
                    RuntimeWarning,
                    stacklevel=3,
                )

    return undo


def _own(owner: object, attr: str) -> Any:
    """``owner.attr`` as stored (a class's own function, not a bound or wrapped view of it)."""
    try:
        return vars(owner)[attr]
    except (TypeError, KeyError):
        raise AttributeError(f"{owner!r} has no attribute {attr!r} of its own to patch") from None


def put_on_instance(obj: object, name: str, value: object) -> Callable[[], None]:
    """Put ``value`` in ``obj.__dict__`` as ``name`` (in front of the class's attribute);
    the undo puts back what the instance had there, unless something replaced ``value``
    since (then it leaves that alone)."""
    own = vars(obj)
    had = name in own
    before = own.get(name)
    own[name] = value

    def undo() -> None:
        if own.get(name) is not value:
            return
        if had:
            own[name] = before
        else:
            del own[name]

    return undo
