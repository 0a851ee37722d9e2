"""instrument.compat.megatron against the real ``megatron.core.timers``, call for call, on
two gloo ranks.

Random sequences of timer calls — ``timers(name, log_level)`` then ``start``, ``stop``,
``elapsed``, ``active_time``, ``reset``; clock advances (longer on rank 1, so minimum and
maximum differ); the group's ``log`` and ``get_all_timers_string`` (collective) — run on
Megatron's ``Timers`` and on instrument's port, each on a fake clock, with every
``log_option``. Every returned number, every raised error and every logged line must be
the same on each rank. Megatron's timers call ``torch.cuda.synchronize()`` and put their
gather on ``torch.cuda.current_device()``: on this CPU-only torch both are pointed at the
CPU for Megatron's calls only.
"""

from __future__ import annotations

import logging
import random
import types
from typing import Any

import pytest
import torch
from distributed_helpers import run_ranks

NAMES = ("fwd", "bwd", "optim")
OPTIONS = ("max", "minmax", "all")
KINDS = ("start", "stop", "stop", "elapsed", "active_time", "reset", "advance", "advance", "log")
KINDS += ("string",)


def sequence(seed: int) -> list[tuple[Any, ...]]:
    """A random sequence of timer calls (the same on every rank)."""
    rng = random.Random(seed)
    levels = {name: rng.choice((0, 1, 2)) for name in NAMES}  # 2: above the group's level
    ops: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(1, 25)):
        name = rng.choice(NAMES)
        kind = rng.choice(KINDS)
        if kind == "advance":
            ops.append(("advance", rng.randint(0, 300)))
        elif kind in ("log", "string"):
            names = rng.sample((*NAMES, "missing"), rng.randint(0, 3))
            ops.append((kind, names, rng.choice((1.0, 2.0, 5.0)), rng.random() < 0.7))
        elif kind == "elapsed":
            ops.append((kind, name, levels[name], rng.random() < 0.5))
        else:
            ops.append((kind, name, levels[name]))
    return ops


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _run(make: Any, ops: list[tuple[Any, ...]], clock: Any, rank: int) -> list[Any]:
    """Apply ``ops`` to the group ``make()`` builds; what each returned, raised or logged."""
    lines = _Lines()
    log = logging.getLogger("megatron.core.timers")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    log.propagate = False
    out: list[Any] = []
    try:
        timers = make()
        for op in ops:
            kind = op[0]
            if kind == "advance":
                clock.advance(op[1] * (1 + rank) / 1000)
                continue
            try:
                if kind == "log":
                    result: Any = timers.log(op[1], normalizer=op[2], reset=op[3])
                elif kind == "string":
                    result = timers.get_all_timers_string(op[1], normalizer=op[2], reset=op[3])
                else:
                    timer = timers(op[1], log_level=op[2])
                    result = (
                        timer.elapsed(reset=op[3]) if kind == "elapsed" else getattr(timer, kind)()
                    )
            except Exception as error:  # compared, not handled
                kind_of = "AssertionError" if isinstance(error, AssertionError) else "Exception"
                result = f"raised {kind_of}"
            if isinstance(result, float):
                result = float(f"{result:.9g}")  # Megatron subtracts float epoch seconds
            out.append((op, result, list(lines.lines)))
            lines.lines.clear()
    finally:
        log.removeHandler(lines)
    return out


def differential_worker(rank: int, world_size: int, seeds: list[int]) -> list[Any]:
    import megatron.core.timers as megatron_timers

    from instrument.compat import megatron
    from instrument.testing import FakeClock, use_clock

    results = []
    real_synchronize, real_device = torch.cuda.synchronize, torch.cuda.current_device
    for seed in seeds:
        ops = sequence(seed)
        for option in OPTIONS:
            theirs_clock = FakeClock(1000.0)
            megatron_timers.time = types.SimpleNamespace(time=lambda c=theirs_clock: c.seconds)
            torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
            torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
            try:
                theirs = _run(
                    lambda o=option: megatron_timers.Timers(1, o), ops, theirs_clock, rank
                )
            finally:
                torch.cuda.synchronize, torch.cuda.current_device = real_synchronize, real_device
            ours_clock = FakeClock(1000.0)
            with use_clock(ours_clock):
                mine = _run(
                    lambda o=option: megatron.Timers(1, o, to_registry=False), ops, ours_clock, rank
                )
            results.append((seed, option, theirs, mine))
    return results


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(180)
def test_timers_behave_like_megatrons_on_two_ranks() -> None:
    pytest.importorskip("megatron.core.timers")  # here, not at collection: it takes seconds
    for rank_results in run_ranks(differential_worker, 2, list(range(40)), timeout=150):
        for seed, option, theirs, mine in rank_results:
            assert mine == theirs, f"seed {seed}, log_option {option!r}"
