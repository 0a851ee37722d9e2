"""Before a cross-rank flush: agree, with a deadline, that every rank is at the same interval.

The check runs on the key-value store every rank already talks to (the ``TCPStore`` of
``init_process_group``), never on the process group, so it can time out without breaking
anything: a rank that is missing, late or at another interval is *named*, every rank that
took part settles on the same verdict, and the flush falls back to this rank's own numbers.

Ranks meet under a key made of the interval's last step (and how many flushes this process
already made at that step): ranks that run in lockstep meet there even after one of them
flushed an extra time, so a later flush recovers by itself. What travels with the check is
the interval number, its first and last step and a hash of the path list; the ranks agree
when the steps match (interval numbers may differ after an extra flush: they are only
reported). Per rank and flush: five or six small store operations in the common case (the
sixth, on the ranks that wait, asks whether a rank closed its reporter), whatever the
world size (the store's server handles ``W`` of them: see ``docs/distributed.md``).

Example:
    >>> verdict = agree(Arrival(index=3, first_step=100, last_step=150, paths=h), 30.0)
    >>> if verdict.ok: ...  # every rank is here, at steps 100..150: collectives are safe
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch.distributed as dist

from instrument.distributed.barrier import NetworkError, Place, place_of, store_append, store_text
from instrument.hooks.collectives import suppressed
from instrument.rank import WorldWatch

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store
    from torch.distributed import ProcessGroup

#: Added to the arrival count by the rank that gave up, so later arrivals stop at once.
_GAVE_UP = 1 << 40


@dataclass(frozen=True)
class Arrival:
    """What one rank brings to the check: its interval and a hash of its path list."""

    index: int  # the reporter's interval number
    first_step: int  # steps seen before the interval began
    last_step: int  # steps seen at its end
    paths: int  # a hash of the paths (and their order)

    def window(self) -> str:
        return f"{self.first_step}..{self.last_step}"

    def text(self, rank: int) -> str:
        return f"{rank}:{self.index}:{self.first_step}:{self.last_step}:{self.paths}"


@dataclass(frozen=True)
class Verdict:
    """The outcome every rank of the check settles on."""

    ok: bool  # every rank arrived, at the same steps: the collectives may run
    paths_differ: bool = False  # ... and their path lists differ (names must travel)
    missing: tuple[int, ...] = ()  # global ranks that did not arrive in time
    closed: dict[int, int] = field(default_factory=dict)  # missing rank -> the step at which
    # it closed its reporter (it will not come)
    presumed: tuple[int, ...] = ()  # missing ranks that missed the flush before too: waited
    # for only CLOSED_GRACE seconds
    mismatched: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rank ->
    # (interval, first step, last step) of the ranks at another interval than the majority
    expected: tuple[int, int] | None = None  # the majority's (first step, last step)
    late: bool = False  # this rank arrived after the others had given up
    error: str = ""  # the store failed
    prefix: str = ""  # where this flush's keys live (a side channel for stragglers)

    def reason(self, seconds: float) -> str:
        """Why the flush stays local, naming ranks (empty when ``ok``)."""
        if self.ok:
            return ""
        if self.error:
            return f"the rendezvous store failed ({self.error})"
        parts = []
        waited = [r for r in self.missing if r not in self.closed and r not in self.presumed]
        if waited:
            parts.append(f"ranks {waited} did not reach this flush within {seconds:g} s")
        if self.presumed:
            parts.append(
                f"ranks {list(self.presumed)} missed the flush before too and did not come "
                f"within {min(seconds, CLOSED_GRACE):g} s (presumed gone until they arrive)"
            )
        if self.closed:
            them = ", ".join(f"rank {r} at step {step}" for r, step in sorted(self.closed.items()))
            parts.append(f"ranks {sorted(self.closed)} closed their reporter before it ({them})")
        if self.mismatched:
            them = ", ".join(
                f"rank {r}: interval #{i}, steps {a}..{b}"
                for r, (i, a, b) in sorted(self.mismatched.items())
            )
            want = "" if self.expected is None else f" (the others: steps {self.expected[0]}.."
            want += "" if self.expected is None else f"{self.expected[1]})"
            parts.append(f"ranks {sorted(self.mismatched)} are at another interval ({them}){want}")
        if self.late:
            parts.append("this rank arrived after the others had given up")
        return "; ".join(parts) or "the other ranks gave up on this flush"

    def ranks(self) -> tuple[int, ...]:
        """Every rank named by the verdict."""
        return tuple(sorted({*self.missing, *self.mismatched}))

    def to_json(self) -> str:
        return json.dumps(
            {
                "ok": self.ok,
                "paths_differ": self.paths_differ,
                "missing": list(self.missing),
                "closed": {str(r): step for r, step in self.closed.items()},
                "presumed": list(self.presumed),
                "mismatched": {str(r): list(v) for r, v in self.mismatched.items()},
                "expected": None if self.expected is None else list(self.expected),
            }
        )

    @classmethod
    def from_json(cls, text: str, *, late: bool = False) -> Verdict:
        data = json.loads(text)
        expected = data.get("expected")
        return cls(
            ok=bool(data["ok"]),
            paths_differ=bool(data.get("paths_differ", False)),
            missing=tuple(int(r) for r in data.get("missing", ())),
            closed={int(r): int(step) for r, step in data.get("closed", {}).items()},
            presumed=tuple(int(r) for r in data.get("presumed", ())),
            mismatched={int(r): (v[0], v[1], v[2]) for r, v in data.get("mismatched", {}).items()},
            expected=None if expected is None else (int(expected[0]), int(expected[1])),
            late=late,
        )


_OK = Verdict(ok=True).to_json()

_keys_lock = threading.Lock()
_keys: dict[tuple[str, int], int] = {}  # (group, last step) -> flushes made at that step
_keys_world = WorldWatch()
_done: dict[str, list[str]] = {}  # per group: prefixes whose keys may be deleted
#: per group: the store prefix of this process's last check and the ranks that missed it
#: (not closed): the next check waits for them only ``CLOSED_GRACE`` seconds, not the whole
#: timeout again, unless they arrived at it late (then they are expected in full again)
_absent: dict[str, tuple[str, frozenset[int]]] = {}


def _follow_world() -> None:
    """A new default group has a new store: start the per-process counts again (the
    caller holds ``_keys_lock``)."""
    if _keys_world.changed(dist.group.WORLD):
        _keys.clear()
        _done.clear()
        _absent.clear()
        _reporters_closed.clear()


def _meeting(where: Place, last_step: int) -> str:
    """The store prefix of this flush: the group, the interval's last step, and how many
    flushes this process made at that step before (0 for the first)."""
    with _keys_lock:
        _follow_world()
        for key in [k for k in _keys if k[0] == where.name and k[1] != last_step]:
            del _keys[key]  # keep one step per group: memory stays flat
        nth = _keys.get((where.name, last_step), 0)
        _keys[(where.name, last_step)] = nth + 1
    return f"instrument/flush/{where.name}/{last_step}.{nth}/"


def _arrivals(store: Store, prefix: str) -> dict[int, list[int]]:
    """rank -> [interval, first step, last step, paths hash], from the arrival list."""
    out: dict[int, list[int]] = {}
    for item in store_text(store.get(prefix + "arrived")).split(","):
        if item:
            rank, *values = (int(x) for x in item.split(":"))
            out[rank] = values
    return out


def _judge(
    where: Place, prefix: str, differ: bool, *, all_arrived: bool, absent: frozenset[int]
) -> Verdict:
    """The verdict from what the store holds. Cheap when nothing differs: the arrival list
    (O(world) bytes) is read only when a signature differed or a rank is missing."""
    if all_arrived and not differ:
        return Verdict(ok=True)
    arrivals = _arrivals(where.store, prefix)
    missing = tuple(r for r in where.ranks if r not in arrivals)
    windows: dict[tuple[int, int], list[int]] = {}
    for rank, (_, first, last, _) in arrivals.items():
        windows.setdefault((first, last), []).append(rank)
    expected = max(windows, key=lambda w: (len(windows[w]), -min(windows[w]))) if windows else None
    mismatched = {
        rank: (values[0], values[1], values[2])
        for rank, values in arrivals.items()
        if (values[1], values[2]) != expected
    }
    hashes = {values[3] for values in arrivals.values()}
    ok = not missing and not mismatched
    gone = _closed(where) if missing else {}
    return Verdict(
        ok=ok,
        paths_differ=ok and len(hashes) > 1,
        missing=missing,
        closed={rank: step for rank, step in gone.items() if rank in missing},
        presumed=tuple(r for r in missing if r in absent and r not in gone),
        mismatched=mismatched,
        expected=expected if mismatched else None,
    )


def _settle(store: Store, prefix: str, verdict: Verdict) -> Verdict:
    """Store ``verdict`` unless one was stored first; return the one that holds."""
    text = verdict.to_json()
    held = store_text(store.compare_set(prefix + "status", "", text))
    return verdict if held == text else Verdict.from_json(held)


def _check(
    where: Place, prefix: str, mine: Arrival, seconds: float, absent: Callable[[], frozenset[int]]
) -> Verdict:
    store, world = where.store, len(where.ranks)
    store_append(store, prefix + "arrived", mine.text(where.rank) + ",")
    signature = f"{mine.window()}|{mine.paths}"
    if store_text(store.compare_set(prefix + "signature", "", signature)) != signature:
        store.set(prefix + "differ", "1")  # before counting: the last arrival sees it
    count = int(store.add(prefix + "count", 1))
    if count > world:  # the others gave up already
        return Verdict.from_json(store_text(store.get(prefix + "status")), late=True)
    if count == world:  # the last to arrive decides
        differ = store.check([prefix + "differ"])
        judged = _judge(where, prefix, differ, all_arrived=True, absent=frozenset())
        return _settle(store, prefix, judged)
    # wait in two parts, looking before each whether the ranks missing have closed their
    # reporters or missed the last check too (then none is expected): one may close just
    # after this rank arrived, and one presumed gone gets the first part to come back
    first = min(seconds, CLOSED_GRACE)
    for part, presumed in ((first, frozenset[int]), (seconds - first, absent)):
        if part <= 0 or _only_gone_missing(where, prefix, presumed()):
            break
        try:
            store.wait([prefix + "status"], datetime.timedelta(seconds=part))
            return Verdict.from_json(store_text(store.get(prefix + "status")))
        except NetworkError:
            raise
        except RuntimeError:  # timed out
            pass
    if int(store.add(prefix + "gave_up", 1)) > 1:  # another rank is judging: wait for it
        try:
            store.wait([prefix + "status"], datetime.timedelta(seconds=seconds))
            return Verdict.from_json(store_text(store.get(prefix + "status")))
        except NetworkError:
            raise
        except RuntimeError:
            pass
    differ = store.check([prefix + "differ"])
    judged = _judge(where, prefix, differ, all_arrived=False, absent=absent())
    verdict = _settle(store, prefix, judged)
    if not verdict.ok:
        store.add(prefix + "count", _GAVE_UP)
    return verdict


#: The first part of a wait for the other ranks, after which this rank looks again whether
#: the ranks still missing have closed their reporters.
CLOSED_GRACE = 2.0


def _closed_key(where: Place) -> str:
    return f"instrument/closed/{where.name}"


def _closed(where: Place) -> dict[int, int]:
    """rank -> the step at which it closed its reporter, for the ranks of ``where`` that
    closed the one this rank's reporter flushes with: the reporters each process made in
    this group are counted (a second ``fit()`` makes a second), and an entry for another
    one than this rank's is passed over."""
    key = _closed_key(where)
    if not where.store.check([key]):
        return {}
    mine = _reporters_closed.get(where.name, 0)
    out: dict[int, int] = {}
    for item in store_text(where.store.get(key)).split(","):
        if item:
            rank, step, nth = (int(x) for x in item.split(":"))
            if nth == mine:
                out[rank] = step
    return out


def _only_gone_missing(where: Place, prefix: str, absent: frozenset[int]) -> bool:
    """Every rank that has not arrived at this flush closed its reporter or missed the last
    check too: none is expected. (One store operation while no rank of the group has
    closed or is absent.)"""
    gone = _closed(where).keys() | absent
    if not gone:
        return False
    arrived = _arrivals(where.store, prefix)
    return all(rank in gone for rank in where.ranks if rank not in arrived)


#: group -> how many reporters this process closed in it (which one it flushes with now).
_reporters_closed: dict[str, int] = {}


def _channel_place(group: ProcessGroup | None, channel: str) -> Place | None:
    """The group's place, its name followed by ``channel``: the keys of each reporter of a
    process meet those of the same reporter on the other ranks only."""
    where = place_of(group)
    if where is None or not channel:
        return where
    return where._replace(name=f"{where.name}/{channel}")


def closed(last_step: int, group: ProcessGroup | None = None, channel: str = "") -> None:
    """Say on the store that this rank's reporter (of ``channel``) is closed after
    ``last_step`` steps: the other ranks' later flushes with it stop waiting for this rank.
    Never raises."""
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return
        where = _channel_place(group, channel)
        if where is None or len(where.ranks) == 1:
            return
        with _keys_lock:
            _follow_world()
            nth = _reporters_closed.get(where.name, 0)
            _reporters_closed[where.name] = nth + 1
        with suppressed():
            store_append(where.store, _closed_key(where), f"{where.rank}:{last_step}:{nth},")
    except Exception:  # the store is gone (a rank exited): nothing to tell
        return


def _clean(where: Place, prefix: str) -> None:
    """After a check every rank passed, delete the keys of this group's earlier checks
    (every rank has left them). Only the group's first rank does it."""
    earlier = _done.setdefault(where.name, [])
    for old in earlier:
        for key in ("arrived", "signature", "differ", "count", "status", "gave_up", "slow"):
            try:
                where.store.delete_key(old + key)
            except Exception:  # a store without delete_key: the keys stay, harmless
                break
    earlier[:] = [prefix]


def _still_absent(where: Place) -> frozenset[int]:
    """The ranks that missed this process's last check and have not arrived at it late
    since (one store read, only while some rank is absent): read when the grace is over."""
    prefix, missed = _absent.get(where.name, ("", frozenset[int]()))
    if not missed:
        return missed
    return missed - _arrivals(where.store, prefix).keys()


def agree(
    mine: Arrival, timeout: float, group: ProcessGroup | None = None, channel: str = ""
) -> Verdict:
    """Check, waiting at most ``timeout`` seconds, that every rank of ``group`` (default:
    the world) reached the same interval of the reporter ``channel`` names (the n-th one
    of each process that combines ranks); never raises. A group of one (or no process
    group) agrees at once."""
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return Verdict(ok=True)
        where = _channel_place(group, channel)
        if where is None or len(where.ranks) == 1:
            return Verdict(ok=True)
        prefix = _meeting(where, mine.last_step)
        with suppressed():
            verdict = _check(where, prefix, mine, timeout, lambda: _still_absent(where))
        gone = frozenset(r for r in verdict.missing if r not in verdict.closed)
        _absent[where.name] = (prefix, gone)
        if verdict.ok and where.rank == where.ranks[0]:
            _clean(where, prefix)
        return dataclasses.replace(verdict, prefix=prefix)
    except Exception as exc:  # the store is gone or refused: a failed check, not a crash
        return Verdict(ok=False, error=f"{type(exc).__name__}: {exc}")


def append(key: str, value: str) -> None:
    """Append to ``key`` on the default store (a side channel of a flush's check)."""
    store_append(dist.distributed_c10d._get_default_store(), key, value)


def read(key: str) -> str:
    """The value of ``key`` on the default store (waits until it exists)."""
    return store_text(dist.distributed_c10d._get_default_store().get(key))
