"""Which regions ``auto``'s hooks enter, and what one costs on this machine, measured once.

:func:`count` registers the names of the regions the hooks just installed enter with
:mod:`instrument.selfcost`, which states their calls at :func:`hook_ns`'s cost.

The hook measured is the most frequent one, a module's timed ``forward`` (the method
:class:`~instrument.hooks.modules.ModuleHooks` puts on the instance): an ``nn.Identity``
called with it, minus one called without, is the whole cost of one hooked module region —
the region's own enter and exit included. The other hooked regions (``backward``,
``optimizer``, ``zero_grad``, collectives...), a few per step, are counted at this cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from instrument import selfcost
from instrument.hooks.modules import ModuleHooks, Target
from instrument.regions import frames
from instrument.regions.region import CpuRegion
from instrument.registry import PathNode

#: Calls timed per calibration round (a round takes under a millisecond; 4 ms in all).
CALLS = 400
ROUNDS = 5


def count(
    targets: list[Target],
    backward: bool | str,
    optimizers: list[torch.optim.Optimizer],
    lr_scheduler: object,
    dataloader: object,
    collectives: bool,
) -> Callable[[], None]:
    """Count the calls of the regions ``auto``'s hooks enter (its arguments say which hooks
    it installed) at a hooked region's cost, until the returned undo runs."""
    names = {target.name for target in targets} | {"zero_grad"}
    if backward:
        names |= {"backward", "recompute"}
    if optimizers:
        names |= {"optimizer", "clip_grad_norm"}
    if lr_scheduler is not None:
        names.add("lr_scheduler")
    if dataloader is not None:
        names.add("data")
    if collectives:
        from instrument.hooks import collectives as collective_hooks  # as auto: when asked

        names.update(collective_hooks.BUFFERS)
    return selfcost.count_hooked(names, hook_ns)


def hook_ns() -> float:
    """One hooked module region in ns: the fastest of a few rounds of ``nn.Identity``
    calls with the hook, less the fastest without (rounds interleaved; each minimum is
    robust to a busy machine, a difference per round is not). Recorded under a private
    root: the tree and the open regions stay as they were."""
    scratch = PathNode("", None)
    name = "(calibration)"
    scratch.children[name] = PathNode(name, scratch)
    plain, hooked = nn.Identity(), nn.Identity()
    hooks = ModuleHooks(())
    hooks._time_forward(hooked, CpuRegion(name))  # the plain host-clock region
    x = torch.zeros(1)
    saved = frames.get_top()
    frames.set_top(frames.Frame(scratch, 0, None, None, None))
    spent_plain, spent_hooked = [], []
    try:
        with torch.no_grad():
            for _ in range(ROUNDS):
                spent_plain.append(_time(plain, x))
                spent_hooked.append(_time(hooked, x))
    finally:
        frames.set_top(saved)
        hooks.remove()
    return max(min(spent_hooked) - min(spent_plain), 0) / CALLS


def _time(module: Callable[[torch.Tensor], object], x: torch.Tensor) -> int:
    """ns for :data:`CALLS` calls of ``module(x)``."""
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        module(x)
    return time.perf_counter_ns() - t0
